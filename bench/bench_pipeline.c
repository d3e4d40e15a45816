/*
 * bench_pipeline.c — the synchronous pipeline modes against the sequential
 * mode, measured in the same run (mode vs mode; STYLE.md 13). Every figure
 * is samples/s of st_trainer_step on synthetic 28x28 data, best of REPEATS
 * timed spans with the two sides alternating, so a burst of load elsewhere
 * lowers one sample, not the ratio.
 *
 *   overhead     a 1-stage pipeline against sequential on the same threads:
 *                the runtime's cost (stage thread, channels, step hand-off);
 *                target: within 5%.
 *   utilization  gpipe with S = 2 and M = 4S on a model of equal blocks:
 *                the runtime's measured utilization (stages' busy seconds
 *                over S x step time) against the bubble formula
 *                M / (M + S - 1); target: within 10%.
 *   stages       pipelines of 2, 4, 8 stages (at most one per core and
 *                per block) for the CNN (deepened to 8 blocks with residual
 *                blocks) and an 8-block MLP, against sequential on all the
 *                cores and on one core; the goal on 16 cores is 8 stages at
 *                5x one-core sequential for the CNN.
 *   schedules    gpipe, 1f1b, interleaved (V = 2) and zb1p on one balanced
 *                plan (an MLP of 16 equal blocks, M = 8 micro-batches),
 *                S = 2 stages of one core each, and 4 and 8 where the
 *                machine has the cores: each one's measured utilization
 *                against its own bubble formula (ops of equal cost,
 *                st_schedule_formula) and its rate against 1f1b's.
 *
 * Usage: bench_pipeline [SECONDS [REPEATS [schedules]]]   (defaults 1.5
 * and 3; `schedules`: that figure alone)
 * Prints one line per figure; targets are printed, never enforced.
 */
#include "span.h"
#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* samples/s over `seconds` after a warm-up, and the utilization of those
 * steps (busy seconds over stages-at-once x step seconds). */
static int measure(const run *r, double seconds, double *rate, double *util,
                   int *blocks) {
  static const char *const common[] = {
      "data.dataset=synthetic", "data.train_limit=4096",
      "data.test_limit=64",     "metrics.progress=off",
      "optimizer.lr=0.01",      "optimizer.momentum=0.9"};
  span s;
  if (measure_span("bench_pipeline", common, 6, r, seconds, &s)) return -1;
  if (blocks) *blocks = s.blocks;
  double busy = 0;
  for (int i = 0; i < s.tracks; i++) busy += s.busy[i];
  /* stages at once: all tracks but block_sequential's turn-takers */
  int at_once =
      s.tracks < s.stages * s.replicas ? s.tracks : s.stages * s.replicas;
  *rate = s.rate;
  *util = s.wall > 0 ? busy / (s.wall * at_once) : 0;
  return 0;
}

/* Best of `repeats` for each of two runs, alternating. */
static int pair(const run *a, const run *b, double seconds, int repeats,
                double *ra, double *rb, double *ua, double *ub) {
  *ra = *rb = 0;
  for (int i = 0; i < repeats; i++) {
    double r, u;
    if (measure(a, seconds, &r, &u, NULL)) return -1;
    if (r > *ra) *ra = r, *ua = u;
    if (measure(b, seconds, &r, &u, NULL)) return -1;
    if (r > *rb) *rb = r, *ub = u;
  }
  return 0;
}

static const char *verdict(int ok) {
  return ok ? "meets target" : "BELOW TARGET";
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.5;
  int repeats = argc > 2 ? atoi(argv[2]) : 3;
  int only_schedules = argc > 3 && !strcmp(argv[3], "schedules");
  if (argc > 4 || (argc > 3 && !only_schedules) || seconds <= 0 ||
      repeats < 1) {
    fprintf(stderr, "usage: bench_pipeline [SECONDS [REPEATS [schedules]]]\n");
    return 2;
  }
  st_blas_init();
  int cores = st_usable_cpus(NULL, 0);
  static char threads[32];
  snprintf(threads, sizeof threads, "train.threads=%d", cores);
  double ra, rb, ua, ub;
  if (only_schedules) goto schedules;

  /* 1. overhead: the same model, threads and batch; one stage. */
  run seq = {0}, one = {0};
  const char *mlp[] = {"model.hidden=[1024,1024,1024]", "train.batch=128"};
  for (int i = 0; i < 2; i++) add(&seq, mlp[i]), add(&one, mlp[i]);
  add(&seq, threads);
  add(&one, threads);
  add(&one, "execution.mode=pipeline");
  add(&one, "execution.stages=1");
  /* a 5% question on a shared 2-vCPU VM: twice the repeats */
  if (pair(&seq, &one, seconds, 2 * repeats, &ra, &rb, &ua, &ub)) return 1;
  printf("overhead: MLP 784-1024x3-10 batch 128, %d threads: sequential %.0f "
         "samples/s, 1-stage pipeline %.0f: ratio %.3f (target >= 0.95: %s)\n",
         cores, ra, rb, rb / ra, verdict(rb / ra >= 0.95));

  /* 2. utilization: equal blocks (784 -> 784 eight times, then a small
   * head), S = 2 stages of one core each, M = 4S = 8 micro-batches. */
  run gp = {0};
  add(&gp, "model.hidden=[784,784,784,784,784,784,784,784]");
  add(&gp, "train.batch=256");
  add(&gp, "execution.micro_batch=32");
  add(&gp, "execution.mode=pipeline");
  add(&gp, "execution.schedule=gpipe");
  add(&gp, "execution.stages=2");
  add(&gp, "train.threads=2");
  double best_util = 0;
  for (int i = 0; i < repeats; i++) {
    double r, u;
    if (measure(&gp, seconds, &r, &u, NULL)) return 1;
    if (u > best_util) best_util = u;
  }
  double M = 8, S = 2, bubble = M / (M + S - 1);
  printf("utilization: gpipe S=2 M=8, MLP of equal blocks: measured %.3f, "
         "bubble formula M/(M+S-1) = %.3f: ratio %.3f (target within 10%%: "
         "%s)\n",
         best_util, bubble, best_util / bubble,
         verdict(best_util >= 0.9 * bubble && best_util <= 1.1 * bubble));

  /* 3. stages: the CNN of configs/cnn_fmnist.yaml deepened to 8 blocks
   * (two residual blocks after each conv) and an 8-block MLP; S stages,
   * each on the cores the plan gives it, against sequential. */
  const char *models[2][6] = {
      {"model.kind=cnn", "model.channels=[32,64]", "model.norm=groupnorm",
       "model.residual_blocks=2", "model.dense=[256]", "train.batch=64"},
      {"model.hidden=[1024,1024,1024,1024,1024,1024,1024]", "train.batch=128",
       NULL, NULL, NULL, NULL}};
  /* the pipelines' M = 8; not the sequential peers', which would then run
   * the batch as 8 micro-batches (seq_step), not whole as a user would */
  const char *micro[2] = {"execution.micro_batch=8",
                          "execution.micro_batch=16"};
  const char *names[2] = {
      "CNN fmnist with 2 residual blocks a stage (8 blocks), batch 64, M=8",
      "MLP 784-1024x7-10 (8 blocks), batch 128, M=8"};
  for (int mi = 0; mi < 2; mi++) {
    run s_all = {0}, s_one = {0};
    for (int i = 0; i < 6 && models[mi][i]; i++)
      add(&s_all, models[mi][i]), add(&s_one, models[mi][i]);
    add(&s_all, threads);
    add(&s_one, "train.threads=1");
    int blocks = 0;
    if (measure(&s_one, 0.01, &ra, &ua, &blocks)) return 1;
    /* at most one stage per block and one per core: 2, 4, 8, 16 */
    static char st[4][32];
    run p[4];
    int n_p = 0;
    for (int k = 2; k <= 16 && k <= cores && k <= blocks; k *= 2, n_p++) {
      snprintf(st[n_p], sizeof st[n_p], "execution.stages=%d", k);
      p[n_p] = s_all;
      add(&p[n_p], "execution.mode=pipeline");
      add(&p[n_p], st[n_p]);
      add(&p[n_p], micro[mi]);
    }
    /* the pipelines alternate with their peers, as `pair` does */
    double best[4] = {0}, bu[4] = {0};
    ra = rb = 0;
    for (int i = 0; i < repeats; i++) {
      double r, u;
      if (measure(&s_all, seconds, &r, &u, NULL)) return 1;
      if (r > ra) ra = r;
      if (measure(&s_one, seconds, &r, &u, NULL)) return 1;
      if (r > rb) rb = r;
      for (int j = 0; j < n_p; j++) {
        if (measure(&p[j], seconds, &r, &u, NULL)) return 1;
        if (r > best[j]) best[j] = r, bu[j] = u;
      }
    }
    printf("%s: sequential %.0f samples/s on %d threads, %.0f on 1\n",
           names[mi], ra, cores, rb);
    for (int j = 0, k = 2; j < n_p; j++, k *= 2)
      printf("  %2d stages (1f1b): %.0f samples/s, %.2fx sequential on %d "
             "threads, %.2fx on 1; utilization %.2f%s\n",
             k, best[j], best[j] / ra, cores, best[j] / rb, bu[j],
             mi == 0 && k == 8 ? best[j] / rb >= 5
                                     ? " (goal 5x one core: met)"
                                     : " (goal 5x one core: NOT met)"
                               : "");
  }
schedules:
  /* 4. schedules on one balanced plan: 16 equal blocks and a small head,
   * S workers of one core each, M = 8. */
  const char *const scheds[] = {"gpipe", "1f1b", "interleaved", "zb1p"};
  for (int S = 2; S <= 8 && S <= cores; S *= 2) {
    double rate[4] = {0}, util[4] = {0};
    for (int i = 0; i < repeats; i++)
      for (int k = 0; k < 4; k++) {
        run p = {0};
        static char st[32], th[32], sc[48];
        add(&p, "model.hidden=[512,512,512,512,512,512,512,512,512,512,512,"
                "512,512,512,512,512]");
        add(&p, "train.batch=256");
        add(&p, "execution.micro_batch=32");
        add(&p, "execution.mode=pipeline");
        add(&p, "execution.virtual_stages=2");
        snprintf(sc, sizeof sc, "execution.schedule=%s", scheds[k]);
        add(&p, sc);
        snprintf(st, sizeof st, "execution.stages=%d", S);
        add(&p, st);
        snprintf(th, sizeof th, "train.threads=%d", S);
        add(&p, th);
        double r, u;
        if (measure(&p, seconds, &r, &u, NULL)) return 1;
        if (r > rate[k]) rate[k] = r, util[k] = u;
      }
    printf("schedules: MLP of 16 equal blocks 784-512x16-10, batch 256, M=8, "
           "S=%d stages of one core:\n",
           S);
    for (int k = 0; k < 4; k++) {
      double f = st_schedule_formula(scheds[k], S, 8, k == 2 ? 2 : 1);
      printf("  %-11s %7.0f samples/s, %.2fx 1f1b; utilization %.3f "
             "measured, %.3f by its bubble formula: ratio %.3f\n",
             k == 2 ? "interleaved" : scheds[k], rate[k], rate[k] / rate[1],
             util[k], f, f > 0 ? util[k] / f : 0);
    }
  }
  return 0;
}
