/*
 * mpi.c — the processes of one run (DESIGN.md: beyond one machine). Started
 * by mpirun, strata runs one rank per process over MPI (Open MPI from
 * Debian); otherwise, or when built without MPI (make MPI=0), it is a world
 * of one and every call here is a no-op. The collectives the data-parallel
 * mode needs live here, so nothing else includes mpi.h:
 *  - st_dist_allgather: every rank's slice of a buffer, in place;
 *  - st_dist_sum_ranks: the gradient summed over the ranks in rank order,
 *    ((g0 + g1) + g2) + ..., per element — the order the in-process
 *    replicas add their slabs in, so R ranks give R replicas' bits whatever
 *    the MPI library's reduction algorithm: each rank gathers its part of
 *    every rank's gradient (an all-to-all), adds the parts in rank order and
 *    sends the sum to all (an all-gather);
 *  - st_dist_check_same: a value every rank must share (the config's hash),
 *    checked at start so mismatched ranks stop with an error, not a hang.
 *  - groups (st_dist_group): the world split into pipelines and into the
 *    replicas of one stage (execution.placement: ranks), each with its
 *    collectives and two channels (forward, backward) of non-blocking
 *    point-to-point messages, which the stages' own threads send and wait
 *    for (MPI_THREAD_MULTIPLE).
 * Errors come back as codes (MPI_ERRORS_RETURN) and become st_error
 * messages; the CLI then aborts the job, so no rank waits forever on one
 * that has stopped.
 */
#include "dist.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef ST_MPI
#include <mpi.h>
#endif

static int world_rank = 0, world_size = 1, started = 0, threads_ok = 0;
/* the last error is every rank's (st_dist_agree). Atomic: a sweep's or
 * an experiment's jobs make their trainers on threads at once, each
 * clearing it (a race TSan saw; no value is read across jobs). */
static _Atomic int shared_error;

void st_dist_share_error(void) {
  atomic_store_explicit(&shared_error, 1, memory_order_relaxed);
}
void st_dist_unshare_error(void) {
  atomic_store_explicit(&shared_error, 0, memory_order_relaxed);
}
int st_dist_error_shared(void) {
  return atomic_load_explicit(&shared_error, memory_order_relaxed);
}

int st_dist_built(void) {
#ifdef ST_MPI
  return 1;
#else
  return 0;
#endif
}

/* The number of processes mpirun (or another PMIx launcher) started, or
 * 0 when this process was not started by one. */
static int launched_size(void) {
  const char *keys[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const char *v = getenv(keys[i]);
    if (v && atoi(v) > 0) return atoi(v);
  }
  return getenv("PMIX_RANK") ? 1 : 0;
}

int st_dist_init(int *argc, char ***argv, st_error *err) {
  int n = launched_size();
  if (n == 0 || started) return 0;
#ifndef ST_MPI
  (void)argc, (void)argv;
  if (n > 1)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "mpirun started %d processes, but this strata was "
                        "built without MPI: install libopenmpi-dev and "
                        "openmpi-bin and rebuild (make) to train across "
                        "processes",
                        n);
  return 0;
#else
  if (n > ST_DIST_MAX_RANKS)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "mpirun started %d processes; "
                        "strata runs at most %d ranks",
                        n, ST_DIST_MAX_RANKS);
  int provided = 0;
  /* the stages of a pipeline across ranks send and receive from their own
   * threads; data parallelism calls MPI from the stepping thread only */
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) !=
      MPI_SUCCESS)
    return st_error_set(err, ST_EIO, "MPI_Init failed");
  started = 1;
  threads_ok = provided >= MPI_THREAD_MULTIPLE;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  return 0;
#endif
}

void st_dist_finalize(void) {
#ifdef ST_MPI
  if (started) MPI_Finalize();
  started = 0;
#endif
}

void st_dist_abort(int code) {
#ifdef ST_MPI
  if (started && world_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

int st_dist_rank(void) { return world_rank; }
int st_dist_threads_ok(void) { return world_size == 1 || threads_ok; }

int st_dist_local_size(void) {
  const char *v = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  int n = v ? atoi(v) : 0;
  return started && n > 0 ? n : 1;
}
int st_dist_size(void) { return world_size; }

#ifdef ST_MPI
static int mpi_failed(int code, const char *what, st_error *err) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(code, text, &len);
  return st_error_set(err, ST_EIO, "rank %d: %s failed: %s", world_rank, what,
                      text);
}
#endif

static void traffic(size_t sent, size_t received);

int st_dist_allgather(void *buf, size_t bytes_per_rank, st_error *err) {
  if (world_size == 1) return 0;
  traffic(bytes_per_rank * (size_t)(world_size - 1),
          bytes_per_rank * (size_t)(world_size - 1));
#ifdef ST_MPI
  if (bytes_per_rank > (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG,
                        "rank %d: %zu bytes per rank exceed "
                        "one all-gather",
                        world_rank, bytes_per_rank);
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, buf, (int)bytes_per_rank,
                         MPI_BYTE, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "the all-gather", err);
#else
  (void)buf, (void)bytes_per_rank, (void)err;
  return 0;
#endif
}

int st_dist_agree(int rc, st_error *err) {
  if (world_size == 1) return rc;
#ifdef ST_MPI
  int all[ST_DIST_MAX_RANKS]; /* every step: nothing allocated */
  int e = MPI_Allgather(&rc, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
  int first = -1;
  for (int r = 0; e == MPI_SUCCESS && r < world_size && first < 0; r++)
    if (all[r]) first = r;
  if (e != MPI_SUCCESS) return mpi_failed(e, "the step's check", err);
  if (first < 0) return 0;
  /* the first failure's message, on every rank */
  st_error got = *err;
  e = MPI_Bcast(&got, (int)sizeof got, MPI_BYTE, first, MPI_COMM_WORLD);
  if (e != MPI_SUCCESS) return mpi_failed(e, "the error's broadcast", err);
  if (first == 0 || !strncmp(got.msg, "rank ", 5)) /* named already */
    *err = got;
  else
    st_error_set(err, got.code, "rank %d: %.*s", first,
                 (int)sizeof got.msg - 16, got.msg);
  shared_error = 1;
  return err->code ? err->code : ST_EIO;
#else
  (void)err;
  return rc;
#endif
}

int st_dist_check_same(uint64_t value, const char *what, st_error *err) {
  if (world_size == 1) return 0;
#ifdef ST_MPI
  uint64_t all[ST_DIST_MAX_RANKS];
  int rc = MPI_Allgather(&value, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T,
                         MPI_COMM_WORLD);
  int differs = -1;
  for (int r = 1; rc == MPI_SUCCESS && r < world_size && differs < 0; r++)
    if (all[r] != all[0]) differs = r;
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "the start-up check", err);
  shared_error = differs >= 0;
  if (differs >= 0)
    return st_error_set(err, ST_ECONFIG,
                        "rank %d's %s differs from rank 0's: every rank must "
                        "run the same config and data",
                        differs, what);
  return 0;
#else
  (void)value, (void)what, (void)err;
  return 0;
#endif
}

int st_dist_max(int *value, st_error *err) {
  if (world_size == 1) return 0;
#ifdef ST_MPI
  int rc =
      MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "the stop check", err);
#else
  (void)value, (void)err;
  return 0;
#endif
}

/* ------------------------------------------------------------ groups */

struct st_dist_group {
#ifdef ST_MPI
  MPI_Comm comm, chan[2];
#endif
  int rank, size;
  int *world; /* [size]: members' world ranks */
};

int st_dist_group_create(st_dist_group **out, int color, int key,
                         st_error *err) {
  *out = NULL;
  st_dist_group *g = calloc(1, sizeof *g);
  if (!g) return st_error_set(err, ST_ENOMEM, "out of memory");
  g->size = 1;
#ifdef ST_MPI
  g->comm = g->chan[0] = g->chan[1] = MPI_COMM_NULL;
  if (started) {
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(g->comm, &g->chan[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(g->comm, &g->chan[1]);
    if (rc != MPI_SUCCESS) {
      st_dist_group_destroy(g);
      return mpi_failed(rc, "making a group of ranks", err);
    }
    for (int c = 0; c < 3; c++)
      MPI_Comm_set_errhandler(c ? g->chan[c - 1] : g->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g->comm, &g->rank);
    MPI_Comm_size(g->comm, &g->size);
  }
#else
  (void)color, (void)key;
#endif
  g->world = malloc((size_t)g->size * sizeof *g->world);
  if (!g->world) {
    st_dist_group_destroy(g);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  g->world[0] = world_rank;
#ifdef ST_MPI
  if (started && MPI_Allgather(&world_rank, 1, MPI_INT, g->world, 1, MPI_INT,
                               g->comm) != MPI_SUCCESS) {
    st_dist_group_destroy(g);
    return st_error_set(err, ST_EIO,
                        "rank %d: making a group of ranks "
                        "failed",
                        world_rank);
  }
#endif
  *out = g;
  return 0;
}

void st_dist_group_destroy(st_dist_group *g) {
  if (!g) return;
#ifdef ST_MPI
  for (int c = 0; c < 2; c++)
    if (g->chan[c] != MPI_COMM_NULL) MPI_Comm_free(&g->chan[c]);
  if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
#endif
  free(g->world);
  free(g);
}

int st_dist_group_rank(const st_dist_group *g) { return g->rank; }
int st_dist_group_size(const st_dist_group *g) { return g->size; }
int st_dist_group_world(const st_dist_group *g, int member) {
  return member >= 0 && member < g->size ? g->world[member] : -1;
}

/* Payload bytes this rank gave to and took from others (st_dist_traffic):
 * each message's bytes; a collective's as if done by direct messages (a
 * broadcast's root gives each member a copy, an all-gather gives and takes
 * a part per member, the ordered sum sends every other member its part and
 * the sum). The library's own algorithms may move more. */
static _Atomic uint64_t bytes_sent, bytes_received;

void st_dist_traffic(uint64_t *sent, uint64_t *received) {
  *sent = atomic_load(&bytes_sent);
  *received = atomic_load(&bytes_received);
}

static void traffic(size_t sent, size_t received) {
  atomic_fetch_add(&bytes_sent, sent);
  atomic_fetch_add(&bytes_received, received);
}

int st_dist_bcast(st_dist_group *g, void *buf, size_t bytes, int root,
                  st_error *err) {
  if (g->size == 1) return 0;
  if (g->rank == root)
    traffic(bytes * (size_t)(g->size - 1), 0);
  else
    traffic(0, bytes);
#ifdef ST_MPI
  for (size_t at = 0; at < bytes; at += (size_t)INT32_MAX / 2) {
    size_t len =
        bytes - at < (size_t)INT32_MAX / 2 ? bytes - at : (size_t)INT32_MAX / 2;
    int rc = MPI_Bcast((char *)buf + at, (int)len, MPI_BYTE, root, g->comm);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "a broadcast", err);
  }
  return 0;
#else
  (void)buf, (void)bytes, (void)root, (void)err;
  return 0;
#endif
}

int st_dist_group_allgather(st_dist_group *g, void *buf,
                            size_t bytes_per_member, st_error *err) {
  if (g->size == 1) return 0;
#ifdef ST_MPI
  if (bytes_per_member > (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG,
                        "rank %d: %zu bytes per rank exceed "
                        "one all-gather",
                        world_rank, bytes_per_member);
  traffic(bytes_per_member * (size_t)(g->size - 1),
          bytes_per_member * (size_t)(g->size - 1));
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, buf, (int)bytes_per_member,
                         MPI_BYTE, g->comm);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "the all-gather", err);
#else
  (void)buf, (void)bytes_per_member, (void)err;
  return 0;
#endif
}

static size_t sum_scratch(size_t W, size_t n) {
  size_t part = (n + W - 1) / W;
  if (part > DIST_PART) part = DIST_PART;
  /* MPI's counts and displacements are ints: a round's W parts must fit */
  if (part > (size_t)INT32_MAX / W) part = (size_t)INT32_MAX / W;
  return W * part;
}

size_t st_dist_sum_scratch(size_t n) {
  return sum_scratch((size_t)world_size, n);
}
size_t st_dist_sum_scratch_in(const st_dist_group *g, size_t n) {
  return sum_scratch(g ? (size_t)g->size : (size_t)world_size, n);
}

int st_dist_allreduce(float *grads, size_t n, st_error *err) {
  return st_dist_allreduce_in(NULL, grads, n, err);
}

int st_dist_allreduce_in(st_dist_group *g, float *grads, size_t n,
                         st_error *err) {
  const int W = g ? g->size : world_size;
  if (W == 1) return 0;
  /* as a ring would: each rank gives and takes 2 (W - 1) / W of the data */
  size_t ring = 2 * (size_t)(W - 1) * (n / (size_t)W) * sizeof(float);
  traffic(ring, ring);
#ifdef ST_MPI
  MPI_Comm comm = g ? g->comm : MPI_COMM_WORLD;
  for (size_t s = 0; s < n; s += (size_t)INT32_MAX / 2) {
    size_t len = n - s < (size_t)INT32_MAX / 2 ? n - s : (size_t)INT32_MAX / 2;
    int rc = MPI_Allreduce(MPI_IN_PLACE, grads + s, (int)len, MPI_FLOAT,
                           MPI_SUM, comm);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the all-reduce", err);
  }
  return 0;
#else
  (void)grads, (void)n, (void)err;
  return 0;
#endif
}

int st_dist_reduce_in(st_dist_group *g, float *grads, size_t n, int root,
                      st_error *err) {
  if (g->size == 1) return 0;
  size_t bytes = n * sizeof(float);
  if (g->rank == root)
    traffic(0, bytes * (size_t)(g->size - 1));
  else
    traffic(bytes, 0);
#ifdef ST_MPI
  for (size_t s = 0; s < n; s += (size_t)INT32_MAX / 2) {
    size_t len = n - s < (size_t)INT32_MAX / 2 ? n - s : (size_t)INT32_MAX / 2;
    int rc = g->rank == root ? MPI_Reduce(MPI_IN_PLACE, grads + s, (int)len,
                                          MPI_FLOAT, MPI_SUM, root, g->comm)
                             : MPI_Reduce(grads + s, NULL, (int)len, MPI_FLOAT,
                                          MPI_SUM, root, g->comm);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the reduction", err);
  }
  return 0;
#else
  (void)grads, (void)root, (void)err;
  return 0;
#endif
}

int st_dist_sum_ranks(float *grads, size_t n, float *scratch, st_error *err) {
  return st_dist_sum_in(NULL, grads, n, scratch, err);
}

int st_dist_sum_in(st_dist_group *g, float *grads, size_t n, float *scratch,
                   st_error *err) {
  const int W = g ? g->size : world_size;
  if (W == 1) return 0;
#ifdef ST_MPI
  const int me = g ? g->rank : world_rank;
  MPI_Comm comm = g ? g->comm : MPI_COMM_WORLD;
  int cnt[ST_DIST_MAX_RANKS], off[ST_DIST_MAX_RANKS], rcnt[ST_DIST_MAX_RANKS],
      roff[ST_DIST_MAX_RANKS];
  size_t step = sum_scratch((size_t)W, n); /* floats of grads per round */
  for (size_t s = 0; s < n; s += step) {
    size_t len = n - s < step ? n - s : step;
    /* the round's W parts, as even as they come: part k is rank k's */
    for (int k = 0, at = 0; k < W; k++) {
      cnt[k] = (int)(len / W + ((size_t)k < len % W));
      off[k] = at;
      at += cnt[k];
    }
    for (int k = 0; k < W; k++) rcnt[k] = cnt[me], roff[k] = k * cnt[me];
    /* the others' parts out, this rank's part from each; then the sum of
     * this part to each, the others' sums from them */
    size_t mine = (size_t)cnt[me] * sizeof(float),
           rest = (len - (size_t)cnt[me]) * sizeof(float);
    traffic(rest + mine * (size_t)(W - 1), mine * (size_t)(W - 1) + rest);
    int rc = MPI_Alltoallv(grads + s, cnt, off, MPI_FLOAT, scratch, rcnt, roff,
                           MPI_FLOAT, comm);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the gradient exchange", err);
    /* rank order, as the in-process replicas: ((g0 + g1) + g2) + ... */
    float *restrict sum = grads + s + off[me];
    memcpy(sum, scratch, (size_t)cnt[me] * sizeof *sum);
    for (int k = 1; k < W; k++) {
      const float *restrict add = scratch + (size_t)k * cnt[me];
      for (int i = 0; i < cnt[me]; i++) sum[i] += add[i];
    }
    rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, grads + s, cnt, off,
                        MPI_FLOAT, comm);
    if (rc != MPI_SUCCESS)
      return mpi_failed(rc, "the gradient all-gather", err);
  }
  return 0;
#else
  (void)grads, (void)n, (void)scratch, (void)err;
  return 0;
#endif
}

/* ---------------------------------------------------- point to point */

#ifdef ST_MPI
_Static_assert(sizeof(MPI_Request) <= sizeof(((st_dist_req *)0)->h),
               "st_dist_req holds an MPI_Request");
static MPI_Request *req_of(st_dist_req *r) { return (MPI_Request *)r->h; }
#endif

/* A non-blocking send (send = 1) or receive on channel chan of g. */
static int post(int send, st_dist_group *g, int chan, void *buf, size_t bytes,
                int peer, int tag, st_dist_req *r, st_error *err) {
#ifdef ST_MPI
  const char *what = send ? "a send" : "a receive";
  if (bytes > (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG,
                        "rank %d: %s of %zu bytes is larger "
                        "than one MPI message",
                        world_rank, what, bytes);
  int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, g->chan[chan],
                            req_of(r))
                : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, g->chan[chan],
                            req_of(r));
  if (rc != MPI_SUCCESS) return mpi_failed(rc, what, err);
  r->live = 1;
  r->send = send;
  if (send) traffic(bytes, 0);
  return 0;
#else
  (void)send, (void)g, (void)chan, (void)buf, (void)bytes, (void)peer;
  (void)tag, (void)r;
  return st_error_set(err, ST_EUNSUPPORTED, "built without MPI");
#endif
}

int st_dist_isend(st_dist_group *g, int chan, const void *buf, size_t bytes,
                  int peer, int tag, st_dist_req *r, st_error *err) {
  return post(1, g, chan, (void *)buf, bytes, peer, tag, r, err);
}

int st_dist_irecv(st_dist_group *g, int chan, void *buf, size_t bytes, int peer,
                  int tag, st_dist_req *r, st_error *err) {
  return post(0, g, chan, buf, bytes, peer, tag, r, err);
}

int st_dist_wait(st_dist_req *r, size_t *got, const atomic_int *stop,
                 st_error *err) {
  if (got) *got = 0;
  if (!r->live) return 0;
#ifdef ST_MPI
  /* poll at first (a neighbour's message is usually close), then sleep
   * between polls so that ranks sharing cores leave them to the work */
  for (long i = 0;; i++) {
    int done = 0;
    MPI_Status status;
    int rc = MPI_Test(req_of(r), &done, &status);
    if (rc != MPI_SUCCESS) {
      r->live = 0;
      return mpi_failed(rc, r->send ? "a send" : "a receive", err);
    }
    if (done) {
      r->live = 0;
      if (!r->send) {
        int n = 0;
        MPI_Get_count(&status, MPI_BYTE, &n);
        traffic(0, (size_t)n);
        if (got) *got = (size_t)n;
      }
      return 0;
    }
    if (stop && atomic_load(stop)) return 1;
    if (i >= 2000) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
#else
  (void)stop;
  return st_error_set(err, ST_EUNSUPPORTED, "built without MPI");
#endif
}

void st_dist_drop(st_dist_req *r) {
  if (!r->live) return;
#ifdef ST_MPI
  if (r->send) {
    MPI_Request_free(req_of(r));
  } else {
    MPI_Cancel(req_of(r));
    MPI_Wait(req_of(r), MPI_STATUS_IGNORE);
  }
#endif
  r->live = 0;
}

int st_dist_forget(st_dist_req *r) {
  if (!r->live) return 0;
#ifdef ST_MPI
  if (!r->send) MPI_Cancel(req_of(r));
  MPI_Request_free(req_of(r));
#endif
  r->live = 0;
  return 1;
}

int st_dist_barrier(st_dist_group *g, st_error *err) {
  if (g->size == 1) return 0;
#ifdef ST_MPI
  int rc = MPI_Barrier(g->comm);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "a barrier", err);
#else
  (void)err;
  return 0;
#endif
}
