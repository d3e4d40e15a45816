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

#include <signal.h>
#include <stdatomic.h>
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
  TH_DONE();
}
