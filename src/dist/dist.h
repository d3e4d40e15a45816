/*
 * dist.h — the collectives of a run over MPI ranks (mpi.c), for the
 * executors; the public calls (st_dist_init, _rank, _size, ...) are in
 * strata.h. In a world of one every call returns at once.
 */
#ifndef STRATA_DIST_H
#define STRATA_DIST_H

#include "strata.h"

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
/* rc and err: this rank's result. Every rank learns whether any failed:
 * returns 0 when none did, else the first failure's code (in rank order)
 * with its message (naming the rank) in err, on every rank. */
int st_dist_agree(int rc, st_error *err);
/* Floats of scratch st_dist_sum_ranks needs for n gradients. */
size_t st_dist_sum_scratch(size_t n);
/* grads[0 .. n) summed over the ranks in rank order, element by element:
 * ((g0 + g1) + g2) + ..., the same bits on every rank. */
int st_dist_sum_ranks(float *grads, size_t n, float *scratch, st_error *err);
/* The same by MPI_Allreduce: the MPI library's order and algorithm. */
int st_dist_allreduce(float *grads, size_t n, st_error *err);

#endif
