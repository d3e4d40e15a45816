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
 * Errors come back as codes (MPI_ERRORS_RETURN) and become st_error
 * messages; the CLI then aborts the job, so no rank waits forever on one
 * that has stopped.
 */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ST_MPI
#include <mpi.h>
#endif

static int world_rank = 0, world_size = 1, started = 0;
static int shared_error; /* the last error is every rank's (st_dist_agree) */

void st_dist_share_error(void) { shared_error = 1; }
void st_dist_unshare_error(void) { shared_error = 0; }
int st_dist_error_shared(void) { return shared_error; }

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
    return st_error_set(err, ST_EUNSUPPORTED, "mpirun started %d processes; "
                        "strata runs at most %d ranks", n, ST_DIST_MAX_RANKS);
  int provided = 0;
  /* MPI is called from the thread that runs the steps only */
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) !=
      MPI_SUCCESS)
    return st_error_set(err, ST_EIO, "MPI_Init failed");
  started = 1;
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

int st_dist_allgather(void *buf, size_t bytes_per_rank, st_error *err) {
  if (world_size == 1) return 0;
#ifdef ST_MPI
  if (bytes_per_rank > (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG, "rank %d: %zu bytes per rank exceed "
                        "one all-gather", world_rank, bytes_per_rank);
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
  if (first == 0)
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

int st_dist_allreduce(float *grads, size_t n, st_error *err) {
  if (world_size == 1) return 0;
#ifdef ST_MPI
  for (size_t s = 0; s < n; s += (size_t)INT32_MAX / 2) {
    size_t len = n - s < (size_t)INT32_MAX / 2 ? n - s : (size_t)INT32_MAX / 2;
    int rc = MPI_Allreduce(MPI_IN_PLACE, grads + s, (int)len, MPI_FLOAT,
                           MPI_SUM, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the all-reduce", err);
  }
  return 0;
#else
  (void)grads, (void)n, (void)err;
  return 0;
#endif
}

size_t st_dist_sum_scratch(size_t n) {
  size_t W = (size_t)world_size, part = (n + W - 1) / W;
  if (part > DIST_PART) part = DIST_PART;
  /* MPI's counts and displacements are ints: a round's W parts must fit */
  if (part > (size_t)INT32_MAX / W) part = (size_t)INT32_MAX / W;
  return W * part;
}

int st_dist_sum_ranks(float *grads, size_t n, float *scratch, st_error *err) {
  if (world_size == 1) return 0;
#ifdef ST_MPI
  const int W = world_size, me = world_rank;
  int cnt[ST_DIST_MAX_RANKS], off[ST_DIST_MAX_RANKS], rcnt[ST_DIST_MAX_RANKS],
      roff[ST_DIST_MAX_RANKS];
  size_t step = st_dist_sum_scratch(n); /* floats of grads per round */
  for (size_t s = 0; s < n; s += step) {
    size_t len = n - s < step ? n - s : step;
    /* the round's W parts, as even as they come: part k is rank k's */
    for (int k = 0, at = 0; k < W; k++) {
      cnt[k] = (int)(len / W + ((size_t)k < len % W));
      off[k] = at;
      at += cnt[k];
    }
    for (int k = 0; k < W; k++) rcnt[k] = cnt[me], roff[k] = k * cnt[me];
    int rc = MPI_Alltoallv(grads + s, cnt, off, MPI_FLOAT, scratch, rcnt, roff,
                           MPI_FLOAT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the gradient exchange", err);
    /* rank order, as the in-process replicas: ((g0 + g1) + g2) + ... */
    float *restrict sum = grads + s + off[me];
    memcpy(sum, scratch, (size_t)cnt[me] * sizeof *sum);
    for (int k = 1; k < W; k++) {
      const float *restrict g = scratch + (size_t)k * cnt[me];
      for (int i = 0; i < cnt[me]; i++) sum[i] += g[i];
    }
    rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, grads + s, cnt, off,
                        MPI_FLOAT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the gradient all-gather", err);
  }
  return 0;
#else
  (void)grads, (void)n, (void)scratch, (void)err;
  return 0;
#endif
}
