/*
 * dist.h — the collectives of a run over MPI ranks (mpi.c), for the
 * executors; the public calls (st_dist_init, _rank, _size, ...) are in
 * strata.h. In a world of one every call returns at once.
 */
#ifndef STRATA_DIST_H
#define STRATA_DIST_H

#include "strata.h"

#include <stdatomic.h>

enum {
  ST_DIST_MAX_RANKS = 1024,
  DIST_PART = 1 << 22 /* floats of one rank's part per exchange round */
};

/* The next error is this rank's own (st_dist_error_shared: 0). */
void st_dist_unshare_error(void);
/* Ranks on this machine (mpirun's count; 1 when unknown). */
int st_dist_local_size(void);
/* Every rank's bytes_per_rank bytes at buf + rank * bytes_per_rank, in
 * place. */
int st_dist_allgather(void *buf, size_t bytes_per_rank, st_error *err);
/* Floats of scratch st_dist_sum_ranks needs for n gradients. */
size_t st_dist_sum_scratch(size_t n);
/* grads[0 .. n) summed over the ranks in rank order, element by element:
 * ((g0 + g1) + g2) + ..., the same bits on every rank. */
int st_dist_sum_ranks(float *grads, size_t n, float *scratch, st_error *err);
/* The same by MPI_Allreduce: the MPI library's order and algorithm. */
int st_dist_allreduce(float *grads, size_t n, st_error *err);

/* The largest of every rank's *value, on every rank (a signal one rank
 * got stops them all at the same step). */
int st_dist_max(int *value, st_error *err);

/* A group of ranks: the world split by color, members ordered by key
 * (collective over the world). Pipelines across ranks and the replicas of
 * one stage are groups. A group has two channels for point-to-point
 * messages (0: forward, 1: backward), kept apart from each other and from
 * the group's collectives. */
typedef struct st_dist_group st_dist_group;
int st_dist_group_create(st_dist_group **out, int color, int key,
                         st_error *err);
void st_dist_group_destroy(st_dist_group *g);
int st_dist_group_rank(const st_dist_group *g);
int st_dist_group_size(const st_dist_group *g);
/* The world rank of the group's member `member`. */
int st_dist_group_world(const st_dist_group *g, int member);
/* 1 when threads other than the one that started MPI may call it (the
 * stages of a pipeline across ranks do). */
int st_dist_threads_ok(void);
/* bytes at buf from member root to every member of g. */
int st_dist_bcast(st_dist_group *g, void *buf, size_t bytes, int root,
                  st_error *err);
/* Every member's bytes_per_member bytes at buf + member * bytes, in place. */
int st_dist_group_allgather(st_dist_group *g, void *buf,
                            size_t bytes_per_member, st_error *err);
/* st_dist_sum_scratch and st_dist_sum_ranks over the members of g, in
 * member order (g NULL: the world). */
size_t st_dist_sum_scratch_in(const st_dist_group *g, size_t n);
int st_dist_sum_in(st_dist_group *g, float *grads, size_t n, float *scratch,
                   st_error *err);
int st_dist_allreduce_in(st_dist_group *g, float *grads, size_t n,
                         st_error *err);

/* grads[0 .. n) summed over the members of g into member root's (the
 * library's order and algorithm); the others' are left as they were. */
int st_dist_reduce_in(st_dist_group *g, float *grads, size_t n, int root,
                      st_error *err);

/* A message in flight (opaque). */
typedef struct st_dist_req {
  _Alignas(8) unsigned char h[16]; /* the MPI request */
  int live, send;
  int peer; /* its world rank */
} st_dist_req;
/* Non-blocking send and receive of up to `bytes` bytes on channel chan of
 * g, to or from member peer, with tag `tag` (messages between two members
 * on one channel and tag arrive in the order they were sent). buf must
 * stay untouched until the request is done. */
int st_dist_isend(st_dist_group *g, int chan, const void *buf, size_t bytes,
                  int peer, int tag, st_dist_req *r, st_error *err);
int st_dist_irecv(st_dist_group *g, int chan, void *buf, size_t bytes, int peer,
                  int tag, st_dist_req *r, st_error *err);
/* Waits for r (polling, then sleeping between polls); *got: the bytes
 * received. Returns 0 when done, 1 (r still live) when *stop became
 * nonzero first, or an error. A request that is not live is done. */
int st_dist_wait(st_dist_req *r, size_t *got, const atomic_int *stop,
                 st_error *err);
/* Gives r up: a receive is cancelled (or, already matched, completed), a
 * send left to finish on its own (nothing may write its buffer before the
 * matching receive is done or cancelled). */
void st_dist_drop(st_dist_req *r);
/* Gives r up without waiting at all: its buffer may be read or written by
 * MPI at any later time, so it must never be freed (an executor torn down
 * after an error keeps such buffers). Returns 1 if r was live. */
int st_dist_forget(st_dist_req *r);
/* Bytes this rank has sent and received since it started: the payload of
 * its messages and collectives (a collective counted as direct messages
 * would move it), not the few bytes of agreement between steps. */
void st_dist_traffic(uint64_t *sent, uint64_t *received);
/* Every member of g reaches this point. */
int st_dist_barrier(st_dist_group *g, st_error *err);

/* What a rank tells another's watch when asked (execution.rank_timeout):
 * its longest wait on the others now, or that it waits on no one. */
typedef struct st_dist_told {
  int32_t waiting; /* 1: in a wait */
  int32_t peer;    /* the world rank waited on; -1: a collective */
  int64_t ms;      /* how long it has waited; not waiting: since its last
                      wait ended */
  char what[40];   /* the wait, as watch lines name it */
} st_dist_told;
/* Who a wait of rank `me` in `what` on `peer` (-1: a collective) lasted
 * too long for, and why, from the answers the watch got (answered[r]:
 * rank r answered, with told[r]; size ranks): writes who (e.g. "rank 1",
 * "ranks 1 and 3", "a rank") and why (e.g. "it does not answer the watch
 * either: it is stopped or cut off"). A pure function, for the tests. */
void st_dist_watch_verdict(int me, int size, const char *what, int peer,
                           const st_dist_told *told,
                           const unsigned char *answered, char *who,
                           size_t who_size, char *why, size_t why_size);

#endif
