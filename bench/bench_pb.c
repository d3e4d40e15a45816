/*
 * bench_pb.c — pipelined backprop against the modes it competes with,
 * measured in the same run (mode vs mode; STYLE.md 13). Figures are
 * samples/s of st_trainer_step on synthetic 28x28 data, best of REPEATS
 * timed spans, the runs alternating so a burst of load elsewhere lowers
 * one sample, not a ratio.
 *
 *   utilization  the threaded runtime at micro-batch 1 on S = 2 stages of
 *                one core each: the least busy stage's busy seconds
 *                (forward, backward, update, from the runtime's counters)
 *                over the wall time of the steps; target: at least 0.95
 *                — no bubbles — on a balanced plan, with sc (the
 *                pipeline alone) and with sc+lwp (the default, whose
 *                weight prediction every stage but the last pays; the
 *                plan charges it there, docs/compiler.md). The stages
 *                are cut by the blocks timed on this machine
 *                (execution.block_costs: measured; the cost model misses
 *                a stage by up to 17% here). Blocks come in few sizes, so
 *                whether equal halves exist depends on the width: for
 *                each mitigation, of 20 widths of the MLP's first hidden
 *                layer and 32 channel pairs of the CNN, the 10 whose
 *                plans predict the best balance are probed for 0.5 s and
 *                the one whose stages the probe finds most nearly equal
 *                is run (the plan's prediction is a shortlist only: see
 *                below).
 *                It is judged on the runs whose two stages were busy for
 *                equal times in fact: least over most busy within 2% (one
 *                wall divides both, and each stage runs every sample, so
 *                that is equal time a sample: a balanced plan in fact),
 *                on the median of those runs by the least busy stage.
 *                What the plan predicted is printed, and does not decide:
 *                on this VM the same blocks on the same core ran at 113
 *                us a sample in one minute and 130 in another, as the
 *                hypervisor moved the vCPUs and their neighbours' load,
 *                and a cut balanced on the blocks' timings is balanced
 *                in some runs only. So sc runs SC_RUNS trainers a round
 *                and sc+lwp LWP_RUNS, between the others; each run's
 *                ratio is printed with how many were within 2%, and
 *                where none was there is no verdict. In the runs judged,
 *                what a stage idles is the runtime's (hand-offs, waits,
 *                bubbles) or the host's variation from sample to sample,
 *                which the replay tells apart: printed beside, what the
 *                stages' own busy times allow, the same seconds replayed
 *                through PB's dependencies with every hand-off free (the
 *                runtime's replay, st_track_stats.bound_s), in the run
 *                judged. Two stages have no slack between them: each slow
 *                sample of one idles the other. A measured figure at the
 *                allowed one means the runtime added no bubble of its
 *                own. Also printed: the busiest stage's fraction in every
 *                run, equal or not, which bubbles would lower.
 *                The MLP's other hidden layers are 384 wide. At 512 (its
 *                weights and momentum 18 MB, read and written by every
 *                sample's fused update) each trainer drew one of two
 *                speeds for a stage, about 10% apart (172 or 188 us a
 *                sample), and kept it for its life; under perf the slow
 *                draw spent 13% more in the update's kernel. Huge pages,
 *                4 KB alignment of every buffer, and fresh mappings for
 *                each trainer did not remove it; where its pages fall in
 *                this VM's caches is the likely cause, not proven. At 384
 *                wide (10.7 MB) one trainer and the next stayed within
 *                2-3% in this session's runs, as the CNN did.
 *   emulated     the emulator as the experiments run it (one thread,
 *                a stage per block, micro-batch 1) against sequential
 *                batch 1 on one thread, on the experiments' MLP and CNN:
 *                the same arithmetic, so the ratio shows the pipeline's
 *                own cost (and each mitigation's work on top).
 *   rates        the sc+lwp pipeline, on its width, against sequential
 *                training of the same model at batch 1 (on all the cores
 *                and on one) and against the fill-and-drain pipeline
 *                (gpipe) at batch 32, M = 8, on two stages (cut by its
 *                own micro-batch's timings).
 *
 * Usage: bench_pb [SECONDS [REPEATS [emulated]]]   (defaults 1.5 and 3;
 * REPEATS <= 20; `emulated`: that figure alone)
 * Prints one line per figure; targets are printed, never enforced.
 */
#include "roundtrip.h"
#include "span.h"
#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* samples/s over `seconds` after a warm-up; the least and the most busy
 * stage's busy fractions over those steps in *worst and *most (1 for one
 * track). */
static const char *const common[] = {
    "data.dataset=synthetic",  "data.train_limit=8192",
    "data.test_limit=64",      "metrics.progress=off",
    "optimizer.lr=0.001",      "optimizer.momentum=0.9",
    "optimizer.nesterov=false"};

static int measure(const run *r, double seconds, double *rate, double *worst,
                   double *most, double *balance, double *allowed) {
  span s;
  if (measure_span("bench_pb", common, 7, r, seconds, &s)) return -1;
  *worst = 1, *most = s.tracks > 1 ? 0 : 1, *allowed = 1;
  for (int i = 0; i < s.tracks && s.wall > 0; i++) {
    double f = s.busy[i] / s.wall;
    if (f < *worst) *worst = f;
    if (f > *most) *most = f;
    if (s.bound > 0 && s.busy[i] / s.bound < *allowed)
      *allowed = s.busy[i] / s.bound;
  }
  *rate = s.rate;
  *balance = s.plan_balance;
  return 0;
}

/* The balance the compiler predicts for r's cut into 2 stages on this
 * machine's 2 cores (execution.block_costs: measured: the blocks timed
 * here, kept by the process, so the runs below cut where this plan does);
 * -1 if no plan was made. */
static double predicted_balance(const run *r) {
  st_config c;
  st_error err = {0};
  st_config_defaults(&c);
  for (int i = 0; i < 7; i++)
    if (st_config_set(&c, common[i], &err)) return -1;
  for (int i = 0; i < r->n; i++)
    if (st_config_set(&c, r->sets[i], &err)) return -1;
  st_plan *plan = NULL;
  double b = -1;
  if (!st_fabric_parse(&c, "cpu:2", &err) &&
      !st_plan_compile(&plan, &c, 2, &err))
    b = plan->balance;
  else
    fprintf(stderr, "bench_pb: %s\n", err.msg);
  st_plan_destroy(plan);
  return b;
}

/* A width's PB run as the bench judges it: 2 stages, micro-batch 1,
 * `mitigation` (a setting), cut by the blocks timed here. */
static run candidate(const char *width, const char *const *fixed,
                     const char *mitigation) {
  run r = {0};
  add(&r, width);
  for (int i = 0; i < 3 && fixed[i]; i++) add(&r, fixed[i]);
  add(&r, "execution.mode=pipelined_backprop");
  add(&r, "execution.stages=2");
  add(&r, "train.batch=64"); /* 64 micro-batches of 1 a trainer step */
  add(&r, "train.threads=2");
  add(&r, mitigation);
  add(&r, "execution.block_costs=measured");
  return r;
}

enum { MLP_WIDTHS = 20, CNN_WIDTHS = 32, MAX_WIDTHS = 32, SHORTLIST = 10 };
#define PROBE_S 0.5

/* The width of w[0 .. n) to run `mitigation` at: the stages cut by the
 * blocks timed here (execution.block_costs: measured); of the widths, the
 * SHORTLIST whose plans predict the best balance, and of those the one
 * whose stages a short probe finds most nearly equal (the best of many
 * noisy predictions flatters itself). *best: the best predicted balance,
 * *probe: the pick's probe (least over most busy); -1 if no width has a
 * plan (reported) or no probe measured, -2 if a run failed (reported). */
static int pick_width(char w[][64], int n, const char *const *fixed,
                      const char *mitigation, double *best, double *probe) {
  double bal[MAX_WIDTHS];
  int order[MAX_WIDTHS];
  for (int k = 0; k < n; k++) {
    run r = candidate(w[k], fixed, mitigation);
    bal[k] = predicted_balance(&r);
    int at = k;
    while (at > 0 && bal[order[at - 1]] < bal[k])
      order[at] = order[at - 1], at--;
    order[at] = k;
  }
  *best = bal[order[0]], *probe = -1;
  int pick = -1;
  for (int j = 0; j < SHORTLIST && j < n; j++) {
    int k = order[j];
    if (bal[k] < 0) continue;
    run r = candidate(w[k], fixed, mitigation);
    double rate, u, t, b, a;
    if (measure(&r, PROBE_S, &rate, &u, &t, &b, &a)) return -2;
    if (t > 0 && u / t > *probe) *probe = u / t, pick = k;
  }
  return pick;
}

/* One PB run: its least and most busy stage's busy fractions, the least
 * busy one's under the replay of the stages' own busy times, and its
 * samples/s. */
typedef struct pb_run {
  double least, most, allowed, rate;
} pb_run;

/* Whether run r's two stages were busy for equal times, within 2% (least
 * over most busy: one wall divides both). Each stage runs every sample,
 * so that is equal time a sample: a plan balanced in fact. */
static int equal_busy(const pb_run *r) {
  return r->most > 0 && r->least / r->most >= 0.98;
}

/* The median run of r[0 .. n) by its least busy stage (the lower of two
 * middles): of those with equal busy times if `equal`, else of all that
 * measured anything; -1 if none qualifies. *count: how many did. */
static int median_run(const pb_run *r, int n, int equal, int *count) {
  int idx[256], m = 0;
  for (int i = 0; i < n && m < 256; i++)
    if (r[i].most > 0 && (!equal || equal_busy(&r[i]))) idx[m++] = i;
  for (int i = 1; i < m; i++) /* insertion sort by least busy */
    for (int j = i; j > 0 && r[idx[j]].least < r[idx[j - 1]].least; j--) {
      int t = idx[j];
      idx[j] = idx[j - 1], idx[j - 1] = t;
    }
  *count = m;
  return m ? idx[(m - 1) / 2] : -1;
}

/* Prints the verdict on one mitigation's runs r[0 .. n): the target is
 * for a balanced plan, so it is judged on the runs whose stages were busy
 * for equal times in fact, within 2%, whatever the plan predicted; on the
 * median of them, not the best. */
static void judge(const char *mit, const pb_run *r, int n) {
  int n_equal, n_all = 0;
  int j = median_run(r, n, 1, &n_equal);
  if (j < 0) j = median_run(r, n, 0, &n_all);
  printf("  %s: the stages' busy times (least over most busy) in its %d "
         "runs:",
         mit, n);
  double min_top = 1;
  for (int i = 0; i < n; i++) {
    printf(" %.3f", r[i].most > 0 ? r[i].least / r[i].most : 0);
    if (r[i].most > 0 && r[i].most < min_top) min_top = r[i].most;
  }
  printf(" (%d within 2%%)\n", n_equal);
  if (j < 0) {
    printf("  utilization with %s: no run measured a step\n", mit);
    return;
  }
  const pb_run *v = &r[j];
  const char *verdict =
      !n_equal ? "no verdict: in no run were the stages busy for equal "
                 "times"
      : v->least >= 0.95 ? "target >= 0.95: meets target"
                         : "target >= 0.95: BELOW TARGET";
  printf("  utilization with %s, 2 stages of one core, micro-batch 1: least "
         "busy stage %.3f (the median run of %s; %s; busiest %.3f; %.0f "
         "samples/s); what the stages' own busy times allow, replayed with "
         "free hand-offs, in that run: %.3f (short of 1: the stages' "
         "imbalance and the host's variation from sample to sample, not the "
         "runtime); the busiest stage in every run: at least %.3f\n",
         mit, v->least, n_equal ? "those with equal busy times" : "all",
         verdict, v->most, v->rate, v->allowed, min_top);
}

/* The emulator as `strata experiment pb` runs it (one thread, every block
 * its own stage, micro-batch 1) against sequential training of the same
 * model at batch 1 on one thread: the same arithmetic, so a ratio well
 * below 1 is the pipeline's own cost (per-sample allocation, copies,
 * locks), except the mitigations' work on top: sc+lwp predicts every
 * stage's weights (but the last's) a sample, stash copies them. Best of
 * `repeats` spans each, alternating. */
static int emulated_figure(const char *what, const char *const *model,
                           int n_model, double seconds, int repeats) {
  const char *const mits[] = {
      "execution.mitigation=none", "execution.mitigation=sc",
      "execution.mitigation=sc+lwp", "execution.mitigation=stash"};
  enum { N_MIT = 4 };
  run runs[1 + N_MIT] = {{{0}, 0}};
  for (int k = 0; k <= N_MIT; k++) {
    for (int i = 0; i < n_model; i++) add(&runs[k], model[i]);
    add(&runs[k], "train.threads=1");
    add(&runs[k], "execution.pin=false");
    if (k == 0) {
      add(&runs[k], "train.batch=1");
      continue;
    }
    add(&runs[k], "execution.mode=pipelined_backprop");
    add(&runs[k], "execution.stages=per_block");
    add(&runs[k], "execution.emulate=true");
    add(&runs[k], "train.batch=32"); /* 32 micro-batches of 1 a step */
    add(&runs[k], mits[k - 1]);
  }
  double best[1 + N_MIT] = {0};
  for (int rep = 0; rep < repeats; rep++)
    for (int k = 0; k <= N_MIT; k++) {
      double r, w, t, b, a;
      if (measure(&runs[k], seconds, &r, &w, &t, &b, &a)) return -1;
      if (r > best[k]) best[k] = r;
    }
  printf("%s, one thread: sequential batch 1 %.0f samples/s; emulated PB, "
         "every block a stage, micro-batch 1:",
         what, best[0]);
  for (int k = 1; k <= N_MIT; k++)
    printf(" %s %.0f (%.2fx)", mits[k - 1] + 21, best[k], best[k] / best[0]);
  printf("\n");
  return 0;
}

/* The emulated figure on the experiments' models (configs/pb_mlp_fmnist
 * .yaml, pb_cnn_fmnist). */
static int emulated_figures(double seconds, int repeats) {
  const char *const mlp[] = {"model.hidden=[128,128,128,128,128,128,128,128,"
                             "128]",
                             "model.norm=layernorm"};
  const char *const cnn[] = {"model.kind=cnn",          "model.channels=[8,16]",
                             "model.norm=groupnorm",    "model.groups=4",
                             "model.residual_blocks=3", "model.dense=[32]"};
  return emulated_figure("pb_mlp_fmnist's MLP (10 blocks)", mlp, 2, seconds,
                         repeats) ||
         emulated_figure("pb_cnn_fmnist's CNN (10 blocks)", cnn, 6, seconds,
                         repeats);
}

enum { MAX_REPEATS = 20, SC_RUNS = 4, LWP_RUNS = 2 };
_Static_assert(SC_RUNS *MAX_REPEATS <= 256, "median_run's index");
int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.5;
  int repeats = argc > 2 ? atoi(argv[2]) : 3;
  int emulated_only = argc > 3 && !strcmp(argv[3], "emulated");
  if (argc > 4 || (argc > 3 && !emulated_only) || seconds <= 0 || repeats < 1 ||
      repeats > MAX_REPEATS) {
    fprintf(stderr,
            "usage: bench_pb [SECONDS [REPEATS [emulated]]] (REPEATS "
            "1..%d)\n",
            MAX_REPEATS);
    return 2;
  }
  st_blas_init();
  if (emulated_only) return emulated_figures(seconds, repeats) ? 1 : 0;
  int cores = st_usable_cpus(NULL, 0);
  static char threads[32];
  snprintf(threads, sizeof threads, "train.threads=%d", cores);
  /* Two models of near-equal blocks, cut into 2 stages, each in several
   * widths (the MLP's first hidden layer, the CNN's channels): blocks come
   * in few sizes, so whether a cut into equal halves exists depends on
   * the width. */
  static char widths[2][MAX_WIDTHS][64];
  const int n_widths[2] = {MLP_WIDTHS, CNN_WIDTHS};
  const char *fixed[2][3] = {
      {NULL, NULL, NULL},
      {"model.kind=cnn", "model.norm=groupnorm", "model.residual_blocks=3"}};
  for (int k = 0; k < MLP_WIDTHS; k++)
    snprintf(widths[0][k], sizeof widths[0][k],
             "model.hidden=[%d,384,384,384,384,384,384,384]", 384 - 8 * k);
  /* CNN channels: multiples of the 8 groups, 8..32 then 16..72 */
  for (int k = 0; k < CNN_WIDTHS; k++)
    snprintf(widths[1][k], sizeof widths[1][k], "model.channels=[%d,%d]",
             8 * (1 + k / 8), 8 * (2 + k % 8));
  for (int mi = 0; mi < 2; mi++) {
    /* a width for each mitigation judged: sc, and sc+lwp, whose
     * prediction its stages other than the last pay (docs/compiler.md);
     * the rates are sc+lwp's, on its width */
    const char *const mits[2] = {"execution.mitigation=sc",
                                 "execution.mitigation=sc+lwp"};
    int pick[2];
    double bal_best[2], probe[2];
    for (int v = 0; v < 2; v++) {
      pick[v] = pick_width(widths[mi], n_widths[mi], fixed[mi], mits[v],
                           &bal_best[v], &probe[v]);
      if (pick[v] == -1)
        fprintf(stderr,
                "bench_pb: no width's probe measured both stages "
                "(%s)\n",
                mits[v]);
      if (pick[v] < 0) return 1; /* a failed run is reported */
    }
    run sc = candidate(widths[mi][pick[0]], fixed[mi], mits[0]);
    run pb = candidate(widths[mi][pick[1]], fixed[mi], mits[1]);
    const char *model[4] = {widths[mi][pick[1]], fixed[mi][0], fixed[mi][1],
                            fixed[mi][2]};
    run seq = {0}, seq1 = {0}, gp = {0};
    for (int i = 0; i < 4 && model[i]; i++)
      add(&seq, model[i]), add(&seq1, model[i]), add(&gp, model[i]);
    add(&seq, "train.batch=1");
    add(&seq, threads);
    add(&seq1, "train.batch=1");
    add(&seq1, "train.threads=1");
    add(&gp, "execution.mode=pipeline");
    add(&gp, "execution.schedule=gpipe");
    add(&gp, "execution.stages=2");
    add(&gp, "train.batch=32");
    add(&gp, "execution.micro_batch=4");
    add(&gp, "train.threads=2");
    add(&gp, "execution.block_costs=measured"); /* its own micro-batch's */
    /* Both mitigations' runs are judged, on those whose stages were busy
     * for equal times in fact, which the host decides run by run (see the
     * top): SC_RUNS trainers of sc and LWP_RUNS of sc+lwp a round, between
     * the others. */
    double best[5] = {0}, plan_bal[2] = {0, 0};
    pb_run pbr[2][SC_RUNS * MAX_REPEATS];
    int n_pb[2] = {0, 0};
    const run *runs[5] = {&pb, &seq, &seq1, &gp, &sc};
    /* a round: SC_RUNS of sc (4), LWP_RUNS of sc+lwp (0), one of each
     * other run; pbr holds SC_RUNS a round */
    const int round[] = {4, 0, 4, 1, 4, 0, 4, 2, 3};
    int in_round[5] = {0};
    for (size_t k = 0; k < sizeof round / sizeof *round; k++)
      in_round[round[k]]++;
    if (in_round[4] != SC_RUNS || in_round[0] != LWP_RUNS ||
        LWP_RUNS > SC_RUNS) {
      fprintf(stderr, "bench_pb: a round does not hold SC_RUNS and "
                      "LWP_RUNS\n");
      return 1;
    }
    double trip_before = core_round_trip_ns(2);
    for (int rep = 0; rep < repeats; rep++)
      for (size_t k = 0; k < sizeof round / sizeof *round; k++) {
        int c = round[k];
        double r, w, t, b, a;
        if (measure(runs[c], seconds, &r, &w, &t, &b, &a)) return 1;
        if (r > best[c]) best[c] = r;
        if (c == 0 || c == 4) {
          int i = c == 4 ? 0 : 1; /* sc, sc+lwp */
          pbr[i][n_pb[i]++] = (pb_run){w, t, a, r};
          plan_bal[i] = b;
        }
      }
    for (int v = 0; v < 2; v++) {
      const char *at = widths[mi][pick[v]];
      if (v == 0 && mi == 0)
        printf("MLP 784-W-384x7-10 (9 blocks; first width W of 384, 376, "
               "..., %d)",
               384 - 8 * (MLP_WIDTHS - 1));
      else if (v == 0)
        printf("CNN with 3 residual blocks a stage (10 blocks, group norm; "
               "channels of [8..32, 16..72])");
      printf("%s %s at %s: the plan of its 2 stages on measured block "
             "costs: balance %.3f%s (best of the %d: %.3f); least / most "
             "busy stage in a %.1f s probe %.3f",
             v ? ";" : ":", mits[v] + 21, at + 6, plan_bal[v],
             plan_bal[v] > 0 ? "" : " (unknown: no plan made the run's cut)",
             n_widths[mi], bal_best[v], PROBE_S, probe[v]);
    }
    printf("\n");
    for (int v = 0; v < 2; v++) judge(mits[v] + 21, pbr[v], n_pb[v]);
    printf("  a cache line's round trip between two threads before and "
           "after these runs: %.0f / %.0f ns\n",
           trip_before, core_round_trip_ns(2));
    printf(
        "  PB (sc+lwp) %.0f samples/s; sequential batch 1: %.0f on %d threads "
        "(PB %.2fx), %.0f on 1 (PB %.2fx); gpipe batch 32 M=8 on 2 "
        "stages: %.0f (PB %.2fx)\n",
        best[0], best[1], cores, best[0] / best[1], best[2], best[0] / best[2],
        best[3], best[0] / best[3]);
  }
  return emulated_figures(seconds, repeats) ? 1 : 0;
}
