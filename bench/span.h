/*
 * span.h — one timed span of training, as the mode benchmarks measure it
 * (bench_pipeline, bench_pb): a config from key=value settings, three
 * warm-up steps, then steps for a number of seconds (each next one started
 * before the last returns, where the mode can), with each trace
 * track's busy seconds over the span from the runtime's counters.
 */
#ifndef STRATA_BENCH_SPAN_H
#define STRATA_BENCH_SPAN_H

#include "strata.h"

#include <stdio.h>
#include <stdlib.h>

enum { BENCH_MAX_SETS = 24, BENCH_MAX_TRACKS = 64 };

/* A run: key=value settings, applied after the benchmark's common ones. */
typedef struct run {
  const char *sets[BENCH_MAX_SETS];
  int n;
} run;

static void add(run *r, const char *set) {
  if (r->n < BENCH_MAX_SETS) r->sets[r->n++] = set;
}

/* What one span measured. */
typedef struct span {
  double rate;                   /* samples/s */
  double wall;                   /* seconds inside steps over the span */
  int tracks;                    /* trace tracks (stages x replicas) */
  double busy[BENCH_MAX_TRACKS]; /* each track's busy seconds */
  double bound;                  /* pipelined backprop: the span's wall
                                    with free hand-offs (st_track_stats
                                    bound_s); 0 in other modes */
  int stages, replicas, blocks;
  double plan_balance; /* the compiler's predicted stage balance
                          of the cut the run made (0: unknown) */
} span;

/* The compiler's predicted balance of the stages t runs: its plan on the
 * fabric the runtime cuts on (cpu:max(stages, train.threads)), used only
 * when that plan made the run's cut; else 0. */
static double plan_balance(const st_trainer *t, const st_config *cfg) {
  int S = st_trainer_stages(t);
  st_track_stats run[BENCH_MAX_TRACKS];
  double wall;
  if (S < 2 || S > BENCH_MAX_TRACKS ||
      st_trainer_stats(t, run, BENCH_MAX_TRACKS, &wall) != S)
    return 0;
  st_config c = *cfg;
  char spec[32];
  st_error err = {0};
  snprintf(spec, sizeof spec, "cpu:%d",
           S > cfg->train.threads ? S : cfg->train.threads);
  st_plan *plan = NULL;
  double balance = 0;
  if (!st_fabric_parse(&c, spec, &err) &&
      !st_plan_compile(&plan, &c, S, &err)) {
    balance = plan->balance;
    for (int s = 0; s < S; s++)
      if (plan->stages[s].first != run[s].first ||
          plan->stages[s].count != run[s].count)
        balance = 0;
  }
  st_plan_destroy(plan);
  return balance;
}

/* Trains the config of common[0 .. n_common) and r's settings for
 * `seconds` after 3 warm-up steps; 0, or -1 with the error on stderr
 * after `prog`. */
static int measure_span(const char *prog, const char *const *common,
                        int n_common, const run *r, double seconds, span *out) {
  st_config cfg;
  st_error err = {0};
  st_config_defaults(&cfg);
  for (int i = 0; i < n_common; i++)
    if (st_config_set(&cfg, common[i], &err)) goto fail;
  for (int i = 0; i < r->n; i++)
    if (st_config_set(&cfg, r->sets[i], &err)) goto fail;
  st_trainer *t;
  if (st_trainer_create(&t, &cfg, NULL, &err)) goto fail;
  out->plan_balance = plan_balance(t, &cfg);
  double loss, wall0 = 0, wall1 = 0;
  for (int i = 0; i < 3; i++)
    if (st_trainer_step(t, &loss, &err)) goto fail_t;
  st_track_stats a[BENCH_MAX_TRACKS], b[BENCH_MAX_TRACKS];
  int n = st_trainer_stats(t, a, BENCH_MAX_TRACKS, &wall0);
  if (n > BENCH_MAX_TRACKS) n = BENCH_MAX_TRACKS;
  int64_t steps = 0;
  double t0 = st_now(), elapsed = 0;
  /* each step lets the next start before it returns (a mode that can:
   * pipelined backprop), as `strata train` does; the last one does not,
   * so the counters are read with nothing running */
  for (int last = 0; !last;) {
    last = elapsed >= seconds;
    if (st_trainer_step_ahead(t, !last, &loss, &err)) goto fail_t;
    steps++;
    elapsed = st_now() - t0;
  }
  st_trainer_stats(t, b, BENCH_MAX_TRACKS, &wall1);
  out->rate = (double)steps * cfg.train.batch / elapsed;
  out->wall = wall1 - wall0;
  out->tracks = n;
  for (int i = 0; i < n; i++) out->busy[i] = b[i].busy_s - a[i].busy_s;
  out->bound = n > 0 ? b[0].bound_s - a[0].bound_s : 0;
  out->stages = st_trainer_stages(t);
  out->replicas = cfg.execution.replicas;
  out->blocks = st_trainer_model(t)->n_blocks;
  st_trainer_destroy(t);
  return 0;
fail_t:
  st_trainer_destroy(t);
fail:
  fprintf(stderr, "%s: %s\n", prog, err.msg);
  return -1;
}

#endif
