/*
 * test_pool.c — the thread pool under stress: thousands of jobs whose task
 * counts go below and above the number of workers (so different subsets of
 * workers take part from one job to the next), on pools of 1, 2, 3 and 8
 * threads. Every task of every job must run exactly once, and results must
 * be visible to the caller when st_pool_for returns. And jobs that come
 * after a pause longer than the workers spin (so they sleep, and a job must
 * wake them: a lost wake would leave the caller waiting for ever, which the
 * alarm turns into a failure). Run under ThreadSanitizer by
 * `make test-tsan`.
 */
#include "harness.h"
#include "strata.h"

#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { JOBS = 4000, MAX_TASKS = 24 };

typedef struct job {
  int hits[MAX_TASKS];
  _Atomic int total;
} job;

static void task(void *arg, int t) {
  job *j = arg;
  j->hits[t]++; /* each task index belongs to one task: no race */
  atomic_fetch_add_explicit(&j->total, 1, memory_order_relaxed);
}

static void stress(int threads, int brief) {
  st_pool *pool =
      brief ? st_pool_create_brief(threads) : st_pool_create(threads);
  CHECK(pool && st_pool_threads(pool) == threads, "pool of %d", threads);
  if (!pool) return;
  int bad = 0;
  for (int n = 0; n < JOBS && !bad; n++) {
    job j;
    memset(j.hits, 0, sizeof j.hits);
    atomic_store(&j.total, 0);
    int ntasks = 1 + (n * 7) % MAX_TASKS; /* 1..24, cycling */
    st_pool_for(pool, ntasks, task, &j);
    for (int t = 0; t < MAX_TASKS; t++)
      bad |= j.hits[t] != (t < ntasks ? 1 : 0);
    bad |= atomic_load(&j.total) != ntasks;
    if (bad)
      CHECK(0, "pool of %d, job %d with %d tasks: a task ran %s", threads, n,
            ntasks, "twice, never, or out of range");
  }
  CHECK(!bad, "pool of %d: %d jobs ran every task exactly once", threads, JOBS);
  st_pool_destroy(pool);
}

/* Jobs after pauses of 3 ms (longer than the pool's spin): the workers
 * have gone to sleep, and each such job must wake the ones it needs; the
 * jobs between them come at once, to workers still spinning or just
 * announcing their sleep. */
static void sleepy(int threads, int brief) {
  st_pool *pool =
      brief ? st_pool_create_brief(threads) : st_pool_create(threads);
  CHECK(pool != NULL, "pool of %d", threads);
  if (!pool) return;
  int bad = 0;
  for (int n = 0; n < 120 && !bad; n++) {
    if (n % 3 == 0) nanosleep(&(struct timespec){0, 3000000}, NULL);
    job j;
    memset(j.hits, 0, sizeof j.hits);
    atomic_store(&j.total, 0);
    int ntasks = 1 + (n * 5) % MAX_TASKS;
    st_pool_for(pool, ntasks, task, &j);
    for (int t = 0; t < MAX_TASKS; t++)
      bad |= j.hits[t] != (t < ntasks ? 1 : 0);
    bad |= atomic_load(&j.total) != ntasks;
  }
  CHECK(!bad,
        "pool of %d: jobs after the workers slept ran every task "
        "exactly once",
        threads);
  st_pool_destroy(pool);
}

/* st_pool_add, st_pool_copy and st_pool_sum_rows against the plain loops,
 * bit for bit, on pools of 1, 2 and 3 threads, at sizes below and above the
 * inline threshold and column counts that leave a short last piece. The
 * values span 2^-12 .. 2^12 with both signs, so that a column summed in any
 * other row order (or an element added twice, or missed) changes bits. */
static float value(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  uint32_t u = (uint32_t)(*s >> 40);
  float m = 1.0f + (float)(u & 0xFFFF) / 65536.0f;
  int e = (int)((u >> 16) % 25) - 12;
  return (u & 0x800000u ? -m : m) * ldexpf(1.0f, e);
}

static void elementwise(void) {
  const int rows[] = {1, 3, 64, 300}, cols[] = {1, 100, 129, 385};
  for (int threads = 1; threads <= 3; threads++) {
    st_pool *pool = st_pool_create(threads);
    for (int a = 0; a < 4; a++)
      for (int b = 0; b < 4; b++) {
        int R = rows[a], C = cols[b];
        size_t n = (size_t)R * C;
        float *x = malloc(n * sizeof *x), *d = malloc(n * sizeof *d);
        float *want = malloc(n * sizeof *want);
        uint64_t seed = (uint64_t)(R * 1000 + C);
        for (size_t i = 0; i < n; i++) x[i] = value(&seed);
        for (size_t i = 0; i < n; i++) d[i] = want[i] = value(&seed);
        for (size_t i = 0; i < n; i++) want[i] += x[i];
        st_pool_add(pool, d, x, n);
        CHECK(memcmp(d, want, n * sizeof *d) == 0,
              "st_pool_add, %zu elements, pool of %d: the plain loop's bits", n,
              threads);
        memset(d, 0, n * sizeof *d);
        st_pool_copy(pool, d, x, n);
        CHECK(memcmp(d, x, n * sizeof *d) == 0,
              "st_pool_copy, %zu elements, pool of %d", n, threads);
        float acc[385], ref[385];
        for (int c = 0; c < C; c++) acc[c] = ref[c] = value(&seed);
        for (int r = 0; r < R; r++)
          for (int c = 0; c < C; c++) ref[c] += x[(size_t)r * C + c];
        st_pool_sum_rows(pool, acc, x, R, C);
        CHECK(memcmp(acc, ref, (size_t)C * sizeof *acc) == 0,
              "st_pool_sum_rows, %d x %d, pool of %d: rows summed in order", R,
              C, threads);
        free(x), free(d), free(want);
      }
    st_pool_destroy(pool);
  }
}

int main(void) {
  /* generous: TSan runs the stress 10-20x slower */
  th_alarm(300, "FAIL tests/base/test_pool.c: the test ran 300 s: a job "
                "waiting for ever for its workers (a lost wake)\n");
  const int sizes[] = {1, 2, 3, 8};
  /* and pools whose workers spin only 20 us (st_pool_create_brief): they
   * sleep between most jobs, so nearly every job wakes them */
  for (int brief = 0; brief < 2; brief++) {
    for (int i = 0; i < 4; i++) stress(sizes[i], brief);
    for (int i = 1; i < 4; i++) sleepy(sizes[i], brief);
  }
  st_pool_for(NULL, 3, task, &(job){0}); /* a NULL pool runs inline */
  elementwise();
  TH_DONE();
}
