/*
 * test_measure.c — stages cut by blocks timed on this machine
 * (execution.block_costs: measured; src/exec/measure.c, partition.c):
 *  - the partitioner takes measured seconds in place of every modelled
 *    term: hand-made costs whose FLOPs call for one cut and whose timings
 *    for another are cut by the timings, each stage's time their sum;
 *  - st_plan_measure gives every block of an MLP (fused one-sample SGD
 *    updates), a CNN and a GPT (AdamW) a finite positive forward and
 *    backward; block_costs model measures nothing; a second request for
 *    the same model and settings returns the same bits (the process keeps
 *    its measurements, so a run and the plan printed beside it agree);
 *  - a threaded pipelined-backprop run and a pipeline run cut their stages
 *    by the figures (seeded so that the cut is one the model never makes),
 *    as st_plan_compile's plan does, and the report and plan.json say the
 *    costs were measured;
 *  - the timing decides only the cut: gpipe on measured costs trains the
 *    sequential mode's bits, and pipelined backprop threaded the emulated
 *    run's, both cut by the same measurement;
 *  - linear weight prediction (lwp, sc+lwp) in pipelined
 *    backprop: its modelled bytes in closed form, its measured seconds
 *    finite and 0 without it, and the partitioner charging them to every
 *    stage but the last (hand-made costs, and seeded figures that move a
 *    threaded run's cut and the plan's);
 *  - the blocks are timed in the config's arithmetic (bf16 products,
 *    flushed subnormals), set as the trainer sets it;
 *  - a model too big to hold in memory (GPT-NeoX 20B) is refused, naming
 *    the key, before anything is allocated; so is a plan for a mesh;
 *  - execution.stage_blocks pins the cut over what model or measured costs
 *    would choose, in the run and the plan, with the same bits as the
 *    unpinned modes' equivalences; a pin of the wrong size is refused.
 * No timing is compared with a threshold: the figures' values are the
 * machine's; what is checked is where they go.
 */
#include "harness.h"
#include "models.h"
#include "strata.h"
#include "../../src/exec/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void set(st_config *c, const char *kv) {
  st_error err = {0};
  CHECK(st_config_set(c, kv, &err) == 0, "%s: %s", kv, err.msg);
}

/* The uncalibrated fabric of two cores, and n blocks of equal FLOPs (1 and
 * 2 MFLOP a sample) named blocks.0 .. for the partitioner's cases. */
static void two_cores(st_fabric *f) {
  st_config c;
  st_config_defaults(&c);
  st_error err = {0};
  CHECK(st_fabric_parse(&c, "cpu:2", &err) == 0, "%s", err.msg);
  CHECK(st_fabric_resolve(f, &c, &err) == 0, "%s", err.msg);
}

static void equal_blocks(st_block_cost *b, int n) {
  memset(b, 0, (size_t)n * sizeof *b);
  for (int i = 0; i < n; i++) {
    snprintf(b[i].name, sizeof b[i].name, "blocks.%d", i);
    b[i].flops_fwd = 1e6;
    b[i].flops_bwd = 2e6;
  }
}

/* Four blocks of equal FLOPs (the model's cut: two and two) timed at 1, 1,
 * 1 and 3 ms: the measured cut is three and one, 3 ms a stage. */
static void test_partition(void) {
  st_error err = {0};
  st_fabric f;
  two_cores(&f);
  st_block_cost b[4];
  equal_blocks(b, 4);
  for (int i = 0; i < 4; i++) {
    for (int k = 0; k < ST_GEMM_CLASSES; k++)
      b[i].gemm_fwd[k] = b[i].gemm_bwd[k] = k == 2 ? 1e6 : 0;
  }
  st_plan_options opt = {.stages = 2,
                         .samples_in_flight = 1,
                         .weight_versions = 1,
                         .algorithm = ST_PARTITION_AUTO};
  st_plan *p = NULL;
  CHECK(st_plan_build(&p, b, 4, &f, &opt, &err) == 0, "%s", err.msg);
  CHECK(p && p->stages[0].count == 2 && p->stages[1].count == 2,
        "modelled: equal blocks cut two and two, got %d+%d",
        p ? p->stages[0].count : -1, p ? p->stages[1].count : -1);
  st_plan_destroy(p);
  for (int i = 0; i < 3; i++)
    b[i].measured_fwd = 0.4e-3, b[i].measured_bwd = 0.6e-3;
  b[3].measured_fwd = 1e-3, b[3].measured_bwd = 2e-3;
  for (int a = 0; a < 2; a++) {
    opt.algorithm = a ? ST_PARTITION_BISECT : ST_PARTITION_DP;
    p = NULL;
    CHECK(st_plan_build(&p, b, 4, &f, &opt, &err) == 0, "%s", err.msg);
    if (!p) continue;
    CHECK(p->stages[0].first == 0 && p->stages[0].count == 3 &&
              p->stages[1].first == 3 && p->stages[1].count == 1,
          "measured (%s): cut 3+1, got %d+%d", a ? "bisect" : "dp",
          p->stages[0].count, p->stages[1].count);
    /* one core a stage: the timing itself (uncalibrated e(1) = 1; no
     * activations cross, so no copy time); 1e-12: the sums' last bits */
    double want[2] = {3e-3, 3e-3}, fwd[2] = {1.2e-3, 1e-3};
    for (int s = 0; s < 2 && s < p->n_stages; s++) {
      CHECK(fabs(p->stages[s].time - want[s]) <= 1e-12 * want[s] &&
                fabs(p->stages[s].time_fwd - fwd[s]) <= 1e-12 * fwd[s],
            "stage %d: %.9g s (fwd %.9g), want %.9g (fwd %.9g)", s,
            p->stages[s].time, p->stages[s].time_fwd, want[s], fwd[s]);
    }
    CHECK(fabs(p->balance - 1) <= 1e-12, "balance %.12g, want 1", p->balance);
    st_plan_destroy(p);
  }
}

/* Weight prediction's seconds (measured_lwp, or lwp_bytes over the
 * calibrated update bandwidth) go to every stage but the last: six blocks
 * of 3 ms, each with 1.5 ms of prediction, are cut two and four (stage
 * times 9 ms with the prediction, 12 without: the last stage pays none),
 * where without it they are cut three and three. */
static void test_partition_lwp(void) {
  st_error err = {0};
  st_fabric f;
  two_cores(&f);
  st_block_cost b[6];
  equal_blocks(b, 6);
  for (int i = 0; i < 6; i++) {
    b[i].measured_fwd = 1e-3;
    b[i].measured_bwd = 2e-3;
  }
  st_plan_options opt = {.stages = 2,
                         .samples_in_flight = 1,
                         .weight_versions = 1,
                         .algorithm = ST_PARTITION_AUTO};
  /* the second pass: modelled, on a calibrated fabric (made here) whose
   * op bandwidths turn the same seconds into bytes */
  for (int pass = 0; pass < 2; pass++) {
    if (pass) {
      f.calibrated = 1;
      for (int k = 0; k < ST_GEMM_CLASSES; k++) f.gemm_rate[k] = 1e11;
      for (int k = 0; k < ST_OP_CLASSES; k++) f.op_bandwidth[k] = 1e9;
      for (int i = 0; i < 6; i++) {
        b[i].measured_fwd = b[i].measured_bwd = 0;
        b[i].bytes_fwd[0] = 1e6, b[i].bytes_bwd[0] = 2e6; /* 1 and 2 ms */
      }
    }
    for (int lwp = 0; lwp < 2; lwp++)
      for (int a = 0; a < 2; a++) {
        for (int i = 0; i < 6; i++) {
          b[i].measured_lwp = lwp && !pass ? 1.5e-3 : 0;
          b[i].lwp_bytes = lwp && pass ? 1.5e6 : 0; /* 1.5 ms */
        }
        opt.algorithm = a ? ST_PARTITION_BISECT : ST_PARTITION_DP;
        st_plan *p = NULL;
        CHECK(st_plan_build(&p, b, 6, &f, &opt, &err) == 0, "%s", err.msg);
        if (!p) continue;
        int want = lwp ? 2 : 3;
        CHECK(p->n_stages == 2 && p->stages[0].count == want,
              "prediction %s (%s, %s): cut %d+%d, want %d+%d",
              lwp ? "on" : "off", a ? "bisect" : "dp",
              pass ? "modelled" : "measured", p->stages[0].count,
              p->n_stages > 1 ? p->stages[1].count : 0, want, 6 - want);
        /* one core a stage, no activations crossing: the sums themselves */
        double t[2] = {9e-3, lwp ? 12e-3 : 9e-3};
        double bw[2] = {lwp ? 7e-3 : 6e-3, lwp ? 8e-3 : 6e-3};
        for (int st = 0; st < 2 && st < p->n_stages; st++)
          CHECK(fabs(p->stages[st].time - t[st]) <= 1e-12 * t[st] &&
                    fabs(p->stages[st].time_bwd - bw[st]) <= 1e-12 * bw[st],
                "prediction %s (%s): stage %d %.9g s (backward %.9g), want "
                "%.9g (%.9g)",
                lwp ? "on" : "off", a ? "bisect" : "dp", st, p->stages[st].time,
                p->stages[st].time_bwd, t[st], bw[st]);
        st_plan_destroy(p);
      }
  }
}

/* The model of c's config (descriptors), or NULL. */
static st_model *model_of(const st_config *c, st_shape in) {
  st_model *m = NULL;
  st_error err = {0};
  CHECK(st_model_create(&m, c, in, &err) == 0, "%s", err.msg);
  return m;
}

static void test_measure(const char *what, const st_config *c, st_shape in) {
  st_model *m = model_of(c, in);
  if (!m) return;
  int n = m->n_blocks;
  st_block_cost *a = calloc((size_t)n, sizeof *a);
  st_block_cost *b = calloc((size_t)n, sizeof *b);
  st_error err = {0};
  st_config cm = *c;
  set(&cm, "execution.block_costs=model");
  CHECK(st_plan_block_costs(a, m, &cm, &err) == 0, "%s: %s", what, err.msg);
  int zero = 1;
  for (int i = 0; i < n; i++)
    zero &= a[i].measured_fwd == 0 && a[i].measured_bwd == 0;
  CHECK(zero, "%s: block_costs model measured something", what);
  st_config cx = *c;
  set(&cx, "execution.block_costs=measured");
  CHECK(st_plan_block_costs(a, m, &cx, &err) == 0, "%s: %s", what, err.msg);
  CHECK(st_plan_block_costs(b, m, &cx, &err) == 0, "%s: %s", what, err.msg);
  for (int i = 0; i < n; i++) {
    CHECK(isfinite(a[i].measured_fwd) && a[i].measured_fwd > 0 &&
              isfinite(a[i].measured_bwd) && a[i].measured_bwd > 0,
          "%s: %s measured %g s forward, %g s backward", what, a[i].name,
          a[i].measured_fwd, a[i].measured_bwd);
    CHECK(a[i].measured_fwd == b[i].measured_fwd &&
              a[i].measured_bwd == b[i].measured_bwd,
          "%s: %s measured again: %g / %g, first %g / %g", what, a[i].name,
          b[i].measured_fwd, b[i].measured_bwd, a[i].measured_fwd,
          a[i].measured_bwd);
    /* the modelled terms are still filled in beside the timing */
    CHECK(a[i].flops_fwd == b[i].flops_fwd && a[i].flops_fwd > 0,
          "%s: %s flops %g", what, a[i].name, a[i].flops_fwd);
  }
  /* another precision is another measurement, not the cached one (the
   * products run another kernel) */
  st_config cb = cx;
  set(&cb, "train.precision=bf16");
  CHECK(st_plan_block_costs(b, m, &cb, &err) == 0, "%s: %s", what, err.msg);
  int same = 1;
  for (int i = 0; i < n; i++)
    same &= a[i].measured_fwd == b[i].measured_fwd &&
            a[i].measured_bwd == b[i].measured_bwd;
  CHECK(!same, "%s: bf16 took fp32's cached block times", what);
  /* st_plan_measure itself times again (no cache): positive again */
  CHECK(st_plan_measure(b, m, &cx, &err) == 0, "%s: %s", what, err.msg);
  int pos = 1;
  for (int i = 0; i < n; i++)
    pos &= b[i].measured_fwd > 0 && b[i].measured_bwd > 0;
  CHECK(pos, "%s: a second measurement has a block at 0", what);
  free(a);
  free(b);
  st_model_destroy(m);
}

/* The blocks are timed in the arithmetic the run trains in: bf16 products
 * and flushed subnormals where the config says so, set process-wide as
 * the trainer sets them (`strata compile` makes no trainer: it timed fp32
 * products for a bf16 run, and kept subnormals the run flushes). Each case
 * starts from the other modes and a model not measured yet. */
static void test_modes(const st_config *c, st_shape in) {
  const char *const cases[][2] = {{"bf16", "true"}, {"fp32", "false"}};
  for (int k = 0; k < 2; k++) {
    st_config cm = *c;
    set(&cm, "execution.block_costs=measured");
    set(&cm, "train.seed=7"); /* another key than test_measure's */
    char kv[64];
    snprintf(kv, sizeof kv, "train.precision=%s", cases[k][0]);
    set(&cm, kv);
    snprintf(kv, sizeof kv, "train.flush_subnormals=%s", cases[k][1]);
    set(&cm, kv);
    st_model *m = model_of(&cm, in);
    if (!m) return;
    st_block_cost *b = calloc((size_t)m->n_blocks, sizeof *b);
    int bf16 = k == 0;
    st_gemm_set_bf16(!bf16);
    st_fp_set_flush(!bf16);
    st_error err = {0};
    CHECK(st_plan_block_costs(b, m, &cm, &err) == 0, "%s: %s", cases[k][0],
          err.msg);
    CHECK(st_gemm_bf16_on() == bf16 && st_fp_flush() == bf16,
          "precision %s, flush_subnormals %s: measured with bf16 products "
          "%s, subnormals %s",
          cases[k][0], cases[k][1], st_gemm_bf16_on() ? "on" : "off",
          st_fp_flush() ? "flushed" : "kept");
    free(b);
    st_model_destroy(m);
  }
  st_gemm_set_bf16(0); /* the process's modes at start */
  st_fp_set_flush(0);
}

/* Weight prediction's costs of pipelined backprop's blocks: modelled, the
 * bytes it moves a sample (closed form: a fused update writes the
 * prediction, 4 bytes a parameter an update, and each step's first
 * forward makes it in a pass of 12; unfused, that pass before every
 * forward), none without lwp or outside pipelined backprop; measured, a
 * finite figure of at least 0 for every block, 0 without lwp. */
static void test_lwp_costs(const st_config *mlp, st_shape in) {
  const char *const cases[][3] = {/* mitigation, micro-batch, mode */
                                  {"sc+lwp", "1", "pipelined_backprop"},
                                  {"lwp", "2", "pipelined_backprop"},
                                  {"sc", "1", "pipelined_backprop"},
                                  {"sc+lwp", "1", "pipeline"}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    st_config c = *mlp;
    char kv[64];
    snprintf(kv, sizeof kv, "execution.mode=%s", cases[k][2]);
    set(&c, kv);
    set(&c, "optimizer.nesterov=false");
    set(&c, "train.batch=8");
    snprintf(kv, sizeof kv, "execution.mitigation=%s", cases[k][0]);
    set(&c, kv);
    if (!strcmp(cases[k][2], "pipelined_backprop")) {
      snprintf(kv, sizeof kv, "execution.micro_batch=%s", cases[k][1]);
      set(&c, kv);
    }
    st_model *m = model_of(&c, in);
    if (!m) continue;
    int n = m->n_blocks, mb = atoi(cases[k][1]);
    int lwp =
        strcmp(cases[k][0], "sc") && !strcmp(cases[k][2], "pipelined_backprop");
    st_block_cost *a = calloc((size_t)n, sizeof *a);
    st_error err = {0};
    CHECK(st_plan_block_costs(a, m, &c, &err) == 0, "%s", err.msg);
    for (int i = 0; a && i < n; i++) {
      double P = (double)m->blocks[i].n_params;
      double want = !lwp      ? 0
                    : mb == 1 ? 4 * P * (1.0 + 3.0 / 8)
                              : 4 * P * 3.0 / mb;
      CHECK(fabs(a[i].lwp_bytes - want) <= 1e-12 * want,
            "%s mb %d %s: %s predicts %.6g bytes a sample, want %.6g",
            cases[k][0], mb, cases[k][2], a[i].name, a[i].lwp_bytes, want);
    }
    if (!strcmp(cases[k][2], "pipelined_backprop") && mb == 1) {
      set(&c, "execution.block_costs=measured");
      CHECK(st_plan_block_costs(a, m, &c, &err) == 0, "%s", err.msg);
      for (int i = 0; a && i < n; i++)
        CHECK(isfinite(a[i].measured_lwp) && a[i].measured_lwp >= 0 &&
                  (lwp || a[i].measured_lwp == 0) && a[i].measured_fwd > 0,
              "%s: %s measured %g s of prediction", cases[k][0], a[i].name,
              a[i].measured_lwp);
    }
    free(a);
    st_model_destroy(m);
  }
}

/* The stages a run cuts on measured costs: figures seeded so that the last
 * block alone outweighs the rest (a cut the model never makes here: it is
 * checked), then the runtime's cut, the plan's, the report and plan.json. */
static void test_cut(const char *what, const st_config *base, const char *mode,
                     st_shape in) {
  st_config c = *base;
  set(&c, "execution.block_costs=measured");
  snprintf(c.execution.mode, sizeof c.execution.mode, "%s", mode);
  c.execution.stages = 2;
  c.train.threads = 2;
  if (!strcmp(mode, "pipelined_backprop")) {
    set(&c, "optimizer.nesterov=false");
    set(&c, "execution.mitigation=sc");
  }
  st_model *m = model_of(&c, in);
  if (!m) return;
  int n = m->n_blocks;
  double fwd[64], bwd[64];
  for (int i = 0; i < n && i < 64; i++) fwd[i] = 1e-4, bwd[i] = 2e-4;
  fwd[n - 1] = 1e-3 * n, bwd[n - 1] = 2e-3 * n; /* 10x the rest together */
  st_measure_seed(m, &c, fwd, bwd, NULL);
  st_model_destroy(m);
  st_error err = {0};
  st_config cm = c;
  set(&cm, "execution.block_costs=model");
  st_trainer *t = make(&cm, &err);
  CHECK(t != NULL, "%s: %s", what, err.msg);
  int first[64], count[64], owner[64], k;
  int pb = !strcmp(mode, "pipelined_backprop");
#define LAYOUT(t)                                                              \
  (pb ? st_pb_layout(st_trainer_exec_state(t), first, count, owner)            \
      : st_pipeline_stages(st_trainer_exec_state(t), first, count))
  if (t) {
    k = LAYOUT(t);
    CHECK(k == 2 && count[1] != 1,
          "%s: the model's own cut is %d+%d: the "
          "seeded cut would not show",
          what, count[0], count[1]);
    st_trainer_destroy(t);
  }
  t = make(&c, &err);
  CHECK(t != NULL, "%s: %s", what, err.msg);
  if (!t) return;
  k = LAYOUT(t);
#undef LAYOUT
  CHECK(k == 2 && first[0] == 0 && count[0] == n - 1 && first[1] == n - 1 &&
            count[1] == 1,
        "%s: measured cut %d+%d, want %d+1", what, count[0], count[1], n - 1);
  CHECK(st_fabric_parse(&c, "cpu:2", &err) == 0, "%s", err.msg);
  st_plan *plan = NULL;
  CHECK(st_plan_compile(&plan, &c, 2, &err) == 0, "%s: %s", what, err.msg);
  CHECK(plan && plan->n_stages == 2 && plan->stages[1].first == n - 1 &&
            plan->blocks[n - 1].measured_fwd == fwd[n - 1],
        "%s: the plan does not cut by the seeded figures", what);
  if (plan) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/strata_measure_%d.json", (int)getpid());
    CHECK(st_plan_write_json(plan, path, &err) == 0, "%s", err.msg);
    FILE *f = fopen(path, "r");
    char buf[1 << 16];
    size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[got] = '\0';
    if (f) fclose(f);
    unlink(path);
    CHECK(strstr(buf, "\"measured_fwd\"") && strstr(buf, "\"measured_bwd\""),
          "%s: plan.json has no measured costs", what);
    snprintf(path, sizeof path, "/tmp/strata_measure_%d.txt", (int)getpid());
    f = fopen(path, "w+");
    if (f) {
      st_plan_print(plan, f);
      rewind(f);
      got = fread(buf, 1, sizeof buf - 1, f);
      buf[got] = '\0';
      fclose(f);
    }
    unlink(path);
    CHECK(strstr(buf, "block costs: measured") != NULL,
          "%s: the report does not say the costs were measured", what);
  }
  st_plan_destroy(plan);
  st_trainer_destroy(t);
}

/* A threaded pipelined-backprop run with weight prediction cuts by it:
 * blocks seeded equal, each with a prediction of twice its time; the
 * first stage, which pays it, takes the blocks the 2-stage cut with the
 * prediction charged to it alone wants, fewer than without, in the run
 * and in st_plan_compile's plan. */
static void test_lwp_run(const st_config *base, st_shape in) {
  int cut[2] = {-1, -1}; /* first stage's blocks: sc, sc+lwp */
  for (int lwp = 0; lwp < 2; lwp++) {
    st_config c = *base;
    set(&c, "execution.block_costs=measured");
    set(&c, "execution.mode=pipelined_backprop");
    set(&c, "execution.stages=2");
    set(&c, "train.threads=2");
    set(&c, "optimizer.nesterov=false");
    set(&c, lwp ? "execution.mitigation=sc+lwp" : "execution.mitigation=sc");
    st_model *m = model_of(&c, in);
    if (!m) return;
    int n = m->n_blocks;
    double fwd[64], bwd[64], pred[64];
    for (int i = 0; i < n && i < 64; i++)
      fwd[i] = 1e-4, bwd[i] = 2e-4, pred[i] = 6e-4;
    st_measure_seed(m, &c, fwd, bwd, lwp ? pred : NULL);
    st_model_destroy(m);
    /* the cut wanted: k blocks first, each 3e-4 s (9e-4 with the
     * prediction), the rest 3e-4 s each */
    int want = 1;
    double best = INFINITY;
    for (int k = 1; k < n; k++) {
      double a = k * (lwp ? 9e-4 : 3e-4), b = (n - k) * 3e-4;
      if ((a > b ? a : b) < best) best = a > b ? a : b, want = k;
    }
    st_error err = {0};
    st_trainer *t = make(&c, &err);
    CHECK(t != NULL, "lwp %d: %s", lwp, err.msg);
    if (!t) return;
    int first[64], count[64], owner[64];
    int k = st_pb_layout(st_trainer_exec_state(t), first, count, owner);
    CHECK(k == 2 && count[0] == want,
          "prediction %s: the run cut %d+%d, want %d+%d", lwp ? "on" : "off",
          count[0], k > 1 ? count[1] : 0, want, n - want);
    cut[lwp] = count[0];
    st_trainer_destroy(t);
    CHECK(st_fabric_parse(&c, "cpu:2", &err) == 0, "%s", err.msg);
    st_plan *plan = NULL;
    CHECK(st_plan_compile(&plan, &c, 2, &err) == 0, "%s", err.msg);
    CHECK(plan && plan->n_stages == 2 && plan->stages[0].count == want &&
              plan->blocks[0].measured_lwp == (lwp ? pred[0] : 0),
          "prediction %s: the plan does not cut by the seeded figures",
          lwp ? "on" : "off");
    /* the report says what the prediction adds, only where there is one */
    char path[64], buf[1 << 16];
    snprintf(path, sizeof path, "/tmp/strata_lwp_%d.txt", (int)getpid());
    FILE *f = plan ? fopen(path, "w+") : NULL;
    size_t got = 0;
    if (f) {
      st_plan_print(plan, f);
      rewind(f);
      got = fread(buf, 1, sizeof buf - 1, f);
      fclose(f);
    }
    buf[got] = '\0';
    unlink(path);
    CHECK(!strstr(buf, "weight prediction") == !lwp,
          "prediction %s: the report %s it", lwp ? "on" : "off",
          lwp ? "does not mention" : "mentions");
    st_plan_destroy(plan);
  }
  CHECK(cut[1] < cut[0], "the prediction moved no block: %d, %d", cut[0],
        cut[1]);
}

/* gpipe on measured costs against the sequential mode; pipelined backprop
 * threaded against emulated, both on measured costs. */
static void test_bits(const char *what, const st_config *base) {
  st_config seq = *base, gp = *base;
  seq.train.batch = gp.train.batch = BATCH;
  seq.execution.micro_batch = gp.execution.micro_batch = BATCH / 4;
  set(&gp, "execution.mode=pipeline");
  set(&gp, "execution.schedule=gpipe");
  set(&gp, "execution.stages=2");
  set(&gp, "execution.block_costs=measured");
  size_t n = 0, n2 = 0;
  float *want = train(&seq, &n, NULL), *got = train(&gp, &n2, NULL);
  CHECK(want && got && n == n2 && !memcmp(want, got, n * sizeof *got),
        "%s: gpipe on measured costs differs from sequential", what);
  free(want);
  free(got);
  st_config pb = *base;
  set(&pb, "execution.mode=pipelined_backprop");
  set(&pb, "execution.stages=2");
  set(&pb, "execution.block_costs=measured");
  set(&pb, "optimizer.kind=sgd");
  set(&pb, "optimizer.nesterov=false");
  set(&pb, "optimizer.momentum=0.9");
  set(&pb, "optimizer.lr=0.001"); /* one sample an update */
  set(&pb, "execution.mitigation=sc+lwp");
  st_config em = pb;
  set(&em, "execution.emulate=true");
  want = train(&em, &n, NULL);
  got = train(&pb, &n2, NULL);
  CHECK(want && got && n == n2 && !memcmp(want, got, n * sizeof *got),
        "%s: pipelined backprop threaded differs from emulated on measured "
        "costs",
        what);
  free(want);
  free(got);
}

/* A model only weight streaming trains here: measuring it would need it
 * all in memory, refused with the key and the sizes (a machine with 640 GB
 * or more would try, and is skipped). */
static void test_too_big(void) {
  st_config c;
  st_error err = {0};
  const char *path = "configs/gpt_neox_20b.yaml";
  CHECK(st_config_load(&c, path, &err) == 0, "%s", err.msg);
  set(&c, "execution.block_costs=measured");
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if ((double)pages * (double)page > 640e9) return;
  st_plan *p = NULL;
  int rc = st_plan_compile(&p, &c, 0, &err);
  CHECK(rc == ST_EUNSUPPORTED && strstr(err.msg, "execution.block_costs") &&
            strstr(err.msg, "this process may use"),
        "20B measured: rc %d '%s'", rc, err.msg);
  st_plan_destroy(p);
}

/* Measured costs are this machine's: a plan for a mesh is refused. */
static void test_mesh(void) {
  st_config c;
  st_error err = {0};
  mlp_config(&c);
  set(&c, "execution.block_costs=measured");
  CHECK(st_fabric_parse(&c, "wse2", &err) == 0, "%s", err.msg);
  st_plan *p = NULL;
  int rc = st_plan_compile(&p, &c, 0, &err);
  CHECK(rc == ST_ECONFIG && strstr(err.msg, "execution.block_costs") &&
            strstr(err.msg, "plans another machine"),
        "wse2 measured: rc %d '%s'", rc, err.msg);
  st_plan_destroy(p);
}

/* The cut a trainer of c runs: its stage count, first and count. */
static int run_cut(const st_config *c, int *first, int *count, st_error *err) {
  st_trainer *t = make(c, err);
  if (!t) return -1;
  int owner[64],
      k = !strcmp(c->execution.mode, "pipelined_backprop")
              ? st_pb_layout(st_trainer_exec_state(t), first, count, owner)
              : st_pipeline_stages(st_trainer_exec_state(t), first, count);
  st_trainer_destroy(t);
  return k;
}

/* A run of c and its plan on cpu:2 are both refused, naming
 * execution.stage_blocks (and `also`, if given, in the run's message). */
static void pin_refused(const st_config *c, const char *what, const char *mode,
                        const char *label, const char *also) {
  st_error err = {0};
  st_trainer *t = make(c, &err);
  CHECK(!t && strstr(err.msg, "execution.stage_blocks") &&
            (!also || strstr(err.msg, also)),
        "%s %s: %s: the run: %s", what, mode, label, err.msg);
  st_trainer_destroy(t);
  st_config cp = *c;
  CHECK(st_fabric_parse(&cp, "cpu:2", &err) == 0, "%s", err.msg);
  st_plan *plan = NULL;
  CHECK(st_plan_compile(&plan, &cp, 0, &err) != 0 &&
            strstr(err.msg, "execution.stage_blocks"),
        "%s %s: %s: the plan: %s", what, mode, label, err.msg);
  st_plan_destroy(plan);
}

/* execution.stage_blocks pins the cut: both pipelined modes, on model
 * costs and on measured figures seeded to call for the last block alone,
 * run (and plan) the pinned stages where the costs would cut elsewhere
 * (checked); pinned, gpipe trains the sequential bits and pipelined
 * backprop threaded the emulated bits; a pin that does not add up to the
 * model's blocks is refused by the run and by the plan, naming the key. */
static void test_pin(const char *what, const st_config *base, st_shape in) {
  st_model *m = model_of(base, in);
  if (!m) return;
  int n = m->n_blocks;
  double fwd[64], bwd[64];
  for (int i = 0; i < n && i < 64; i++) fwd[i] = 1e-4, bwd[i] = 2e-4;
  fwd[n - 1] = 1e-3 * n, bwd[n - 1] = 2e-3 * n;
  static const char *const modes[] = {"pipeline", "pipelined_backprop"};
  st_error err = {0};
  for (int k = 0; k < 4; k++) {
    st_config c = *base;
    set(&c, k & 1 ? "execution.block_costs=measured"
                  : "execution.block_costs=model");
    snprintf(c.execution.mode, sizeof c.execution.mode, "%s", modes[k / 2]);
    if (k / 2) { /* one sample an update */
      set(&c, "optimizer.kind=sgd");
      set(&c, "optimizer.nesterov=false");
      set(&c, "optimizer.momentum=0.9");
      set(&c, "optimizer.lr=0.001");
      set(&c, "execution.mitigation=sc+lwp");
    }
    c.train.threads = 2;
    if (k & 1) st_measure_seed(m, &c, fwd, bwd, NULL);
    c.execution.stages = 2;
    int first[64], count[64];
    int got = run_cut(&c, first, count, &err);
    CHECK(got == 2, "%s %s: %s", what, modes[k / 2], err.msg);
    if (got != 2) continue;
    /* a pin the costs do not choose */
    int p1 = count[0] == 1 ? n - 1 : 1;
    char pin[64];
    snprintf(pin, sizeof pin, "execution.stage_blocks=[%d, %d]", p1, n - p1);
    c.execution.stages = 0;
    set(&c, pin);
    got = run_cut(&c, first, count, &err);
    CHECK(got == 2 && first[0] == 0 && count[0] == p1 && first[1] == p1 &&
              count[1] == n - p1,
          "%s %s (%s costs): pinned [%d, %d], ran %d stages [%d, %d]: %s", what,
          modes[k / 2], k & 1 ? "measured" : "model", p1, n - p1, got, count[0],
          got > 1 ? count[1] : -1, err.msg);
    st_config cp = c;
    CHECK(st_fabric_parse(&cp, "cpu:2", &err) == 0, "%s", err.msg);
    st_plan *plan = NULL;
    CHECK(st_plan_compile(&plan, &cp, 0, &err) == 0 && plan->n_stages == 2 &&
              plan->stages[0].count == p1 && plan->stages[1].count == n - p1,
          "%s %s: the plan does not follow the pin: %s", what, modes[k / 2],
          err.msg);
    st_plan_destroy(plan);
    /* pinned, the bits are the unpinned modes' */
    size_t nw = 0, nw2 = 0;
    float *want = NULL, *have = NULL;
    if (k / 2) {
      st_config em = c;
      set(&em, "execution.emulate=true");
      want = train(&em, &nw, NULL);
      have = train(&c, &nw2, NULL);
    } else {
      st_config seq = c, gp = c;
      seq.execution.stage_blocks.n = 0;
      set(&seq, "execution.mode=sequential");
      set(&gp, "execution.schedule=gpipe");
      seq.train.batch = gp.train.batch = BATCH;
      seq.execution.micro_batch = gp.execution.micro_batch = BATCH / 4;
      want = train(&seq, &nw, NULL);
      have = train(&gp, &nw2, NULL);
    }
    CHECK(want && have && nw == nw2 && !memcmp(want, have, nw * sizeof *have),
          "%s %s pinned [%d, %d]: differs from %s", what, modes[k / 2], p1,
          n - p1, k / 2 ? "the emulated run" : "sequential");
    free(want);
    free(have);
    /* a pin of the wrong size */
    snprintf(pin, sizeof pin, "execution.stage_blocks=[%d, %d]", p1, n);
    set(&c, pin);
    pin_refused(&c, what, modes[k / 2], "a pin of the wrong size",
                "the model has");
    /* entries whose int sum would wrap to the model's blocks */
    st_config wrap = c;
    wrap.execution.stage_blocks.n = 3;
    wrap.execution.stage_blocks.v[0] = wrap.execution.stage_blocks.v[1] =
        2147483647;
    wrap.execution.stage_blocks.v[2] = n + 2;
    pin_refused(&wrap, what, modes[k / 2], "a pin of huge entries", NULL);
    /* more stages than blocks: still the pin's error, not execution.stages' */
    st_config many = c;
    many.execution.stage_blocks.n = n + 1;
    for (int s2 = 0; s2 <= n; s2++) many.execution.stage_blocks.v[s2] = 1;
    pin_refused(&many, what, modes[k / 2], "more one-block stages than blocks",
                NULL);
  }
  st_model_destroy(m);
}

int main(void) {
  setenv("STRATA_CALIBRATION", "none", 1);
  st_blas_init();
  test_partition();
  test_partition_lwp();
  st_config mlp, cnn, gpt;
  mlp_config(&mlp);
  cnn_config(&cnn);
  gpt_config(&gpt);
  set(&gpt, "model.vocab=256"); /* built without its corpus: byte tokens */
  st_shape img = {1, 28, 28}, tokens = {1, 16, 1};
  st_config pb = mlp; /* one-sample fused SGD updates */
  set(&pb, "execution.mode=pipelined_backprop");
  set(&pb, "optimizer.nesterov=false");
  set(&pb, "execution.mitigation=sc");
  test_measure("mlp pb", &pb, img);
  test_measure("mlp sequential", &mlp, img);
  test_measure("cnn", &cnn, img);
  test_measure("gpt", &gpt, tokens);
  st_config gpt1 = gpt; /* one position: inputs still token ids */
  set(&gpt1, "model.context=1");
  test_measure("gpt context 1", &gpt1, (st_shape){1, 1, 1});
  test_modes(&mlp, img);
  test_lwp_costs(&mlp, img);
  test_lwp_run(&mlp, img);
  test_cut("mlp pb", &mlp, "pipelined_backprop", img);
  test_cut("cnn pipeline", &cnn, "pipeline", img);
  test_bits("mlp", &mlp);
  test_bits("cnn", &cnn);
  test_pin("mlp", &mlp, img);
  test_pin("cnn", &cnn, img);
  test_too_big();
  test_mesh();
  printf("%d passed, %d failed\n", th_passed, th_failed);
  return th_failed != 0;
}
