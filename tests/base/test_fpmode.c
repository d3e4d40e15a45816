/*
 * test_fpmode.c — subnormal numbers flushed to zero on every thread that
 * computes, or kept (fpmode.c): a subnormal input (DAZ) and a product that
 * underflows (FTZ) become zero on the pool's worker threads as on the
 * caller once the mode is set — the pool made before, so no thread
 * inherits the mode at its start — and stay subnormal when kept; the
 * trainer sets the mode from train.flush_subnormals.
 */
#include "harness.h"
#include "strata.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

enum { TASKS = 8 };

typedef struct probe {
  float daz[TASKS], ftz[TASKS];
  int flushes[TASKS], caller[TASKS];
  pthread_t self;
  _Atomic int arrived;
} probe;

static volatile float tiny = 1e-40f, one = 1.0f, small = 1e-30f,
                      smaller = 1e-10f;

static void task(void *arg, int t) {
  probe *p = arg;
  p->daz[t] = tiny * one;      /* a subnormal input */
  p->ftz[t] = small * smaller; /* normal inputs, a subnormal product */
  p->flushes[t] = st_fp_thread_flushes();
  p->caller[t] = pthread_equal(pthread_self(), p->self);
  /* hold the task a moment so that the other tasks go to other threads */
  atomic_fetch_add(&p->arrived, 1);
  double t0 = st_now();
  while (atomic_load(&p->arrived) < TASKS && st_now() - t0 < 0.2) {
  }
}

/* Runs the probe on the pool; returns how many tasks ran off the caller. */
static int run(st_pool *pool, probe *p) {
  memset(p, 0, sizeof *p);
  p->self = pthread_self();
  st_pool_for(pool, TASKS, task, p);
  int off = 0;
  for (int t = 0; t < TASKS; t++) off += !p->caller[t];
  return off;
}

int main(void) {
  const char *how = st_fp_flush_support();
  int can = strncmp(how, "none", 4) != 0;
  printf("flush support: %s\n", how);
  CHECK(tiny != 0 && small * smaller != 0, "the process starts with IEEE "
                                           "subnormals kept");
  st_pool *pool = st_pool_create(4);
  CHECK(pool != NULL, "pool");
  if (!pool) TH_DONE();
  probe p;
  st_fp_set_flush(1);
  CHECK(st_fp_flush() == 1, "mode set");
  int off = run(pool, &p);
  CHECK(off > 0, "no task ran on a worker thread");
  for (int t = 0; can && t < TASKS; t++)
    CHECK(p.daz[t] == 0 && p.ftz[t] == 0 && p.flushes[t],
          "task %d (%s): not flushed: 1e-40 * 1 = %g, 1e-30 * 1e-10 = %g, "
          "mode register %d",
          t, p.caller[t] ? "caller" : "worker", (double)p.daz[t],
          (double)p.ftz[t], p.flushes[t]);
  st_fp_set_flush(0);
  off = run(pool, &p);
  CHECK(off > 0, "no task ran on a worker thread");
  for (int t = 0; t < TASKS; t++)
    CHECK(p.daz[t] == tiny && p.ftz[t] == small * smaller && !p.flushes[t],
          "task %d (%s): kept: %g, %g", t, p.caller[t] ? "caller" : "worker",
          (double)p.daz[t], (double)p.ftz[t]);
  st_pool_destroy(pool);

  /* the trainer takes the mode from its config */
  for (int flush = 0; flush < 2; flush++) {
    st_config cfg;
    st_error err = {0};
    st_config_defaults(&cfg);
    const char *sets[] = {"data.dataset=synthetic", "data.train_limit=64",
                          "data.test_limit=16",     "model.hidden=[8]",
                          "train.batch=8",          "train.threads=2"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
      st_config_set(&cfg, sets[i], &err);
    st_config_set(&cfg,
                  flush ? "train.flush_subnormals=true"
                        : "train.flush_subnormals=false",
                  &err);
    st_fp_set_flush(!flush);
    st_trainer *t = NULL;
    int rc = st_trainer_create(&t, &cfg, NULL, &err);
    CHECK(rc == 0, "trainer: %s", err.msg);
    CHECK(st_fp_flush() == flush && (!can || st_fp_thread_flushes() == flush),
          "train.flush_subnormals=%d: the process mode is %d", flush,
          st_fp_flush());
    double loss;
    st_fp_set_flush(!flush); /* another trainer's mode, set since */
    if (t) rc = st_trainer_step(t, &loss, &err);
    CHECK(rc == 0 && st_fp_flush() == flush,
          "a step takes its own trainer's mode back: %s", err.msg);
    st_trainer_destroy(t);
  }
  st_fp_set_flush(0);
  TH_DONE();
}
