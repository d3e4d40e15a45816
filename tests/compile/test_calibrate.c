/*
 * test_calibrate.c — the calibration profile and the calibrated cost model
 * (docs/compiler.md, "Calibration"): the profile round-trips through its
 * file; a corrupt, foreign or wrong-version profile is an error naming the
 * file; pass 1 splits a block's work into GEMM FLOPs by shape class and
 * bytes by op class exactly as counted by hand; and a plan on a calibrated
 * fabric takes the hand-computed time. Nothing here is timed: the profiles
 * are written by the test with made-up rates.
 */
#include "harness.h"
#include "strata.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static void path_in(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
}

/* A profile with round figures. */
static st_calibration sample_profile(void) {
  st_calibration c;
  memset(&c, 0, sizeof c);
  snprintf(c.date, sizeof c.date, "2026-01-02T03:04:05Z");
  c.cores = 4;
  int shapes[ST_GEMM_CLASSES][3] = {
      {32, 784, 9}, {64, 128, 128}, {64, 256, 256}, {64, 256, 3136}};
  memcpy(c.gemm_shape, shapes, sizeof shapes);
  double rates[ST_GEMM_CLASSES] = {2e10, 4e10, 5e10, 8e10};
  memcpy(c.gemm_rate, rates, sizeof rates);
  c.n_threads = 3;
  int th[] = {1, 2, 4};
  double r[] = {8e10, 1.5e11, 2.5e11};
  for (int i = 0; i < 3; i++) {
    c.threads[i] = th[i];
    c.gemm_rate_threads[i] = r[i];
    c.efficiency[i] = r[i] / (th[i] * r[0]);
  }
  c.efficiency_slope = 0.25;
  double m[] = {1, 0.75, 0.5};
  memcpy(c.sharing, m, sizeof m);
  c.sharing_slope = 0.375;
  double bw[ST_OP_CLASSES] = {1e10, 5e9, 4e9, 2e10, 2.5e9};
  memcpy(c.op_bandwidth, bw, sizeof bw);
  int conv[ST_GEMM_CLASSES][4] = {
      {8, 1, 28, 32}, {8, 32, 14, 32}, {8, 32, 14, 64}, {8, 64, 28, 64}};
  int attn[ST_GEMM_CLASSES][4] = {
      {8, 64, 128, 4}, {2, 256, 256, 4}, {1, 1024, 256, 2}, {1, 1024, 256, 2}};
  memcpy(c.conv_shape, conv, sizeof conv);
  memcpy(c.attention_shape, attn, sizeof attn);
  double cr[2][ST_GEMM_CLASSES] = {{1e10, 3e10, 4e10, 6e10},
                                   {5e9, 2e10, 3.5e10, 5.5e10}};
  double ar[2][ST_GEMM_CLASSES] = {{2.5e10, 4.5e10, 5e10, 5e10},
                                   {4e10, 6.5e10, 7e10, 7e10}};
  memcpy(c.conv_rate, cr, sizeof cr);
  memcpy(c.attention_rate, ar, sizeof ar);
  c.copy_bandwidth = 2.5e10;
  c.input_bandwidth = 4e9;
  c.step_latency = 2e-5;
  c.hosted_latency = 1e-6;
  return c;
}

/* The same with the linear GEMMs' memory terms: the large class's step at
 * 8 rows at 4e10 against 8e10 at 64, a 1 MiB L2, and a spill curve. */
static st_calibration narrow_profile(void) {
  st_calibration c = sample_profile();
  c.narrow_rows = 8;
  c.narrow_rate = 4e10;
  c.l2_bytes = 1048576;
  c.spill_cost = 2e-10;
  c.n_spill = 3;
  double ws[] = {6e6, 1e7, 4e7}, fr[] = {0, 0.25, 1};
  memcpy(c.spill_ws, ws, sizeof ws);
  memcpy(c.spill_fraction, fr, sizeof fr);
  return c;
}

/* cfg with the assignments applied, and its model on input `in` (NULL,
 * with the failure counted, if either is refused). */
static st_model *model_of(st_config *cfg, const char **sets, size_t n,
                          st_shape in) {
  st_error err = {0};
  for (size_t i = 0; i < n; i++)
    CHECK(st_config_set(cfg, sets[i], &err) == 0, "%s", err.msg);
  st_model *m = NULL;
  CHECK(st_model_create(&m, cfg, in, &err) == 0, "%s", err.msg);
  return m;
}

/* A one-core cpu fabric with room for anything, to apply profiles to. */
static st_fabric one_core(void) {
  st_fabric f;
  memset(&f, 0, sizeof f);
  f.kind = ST_FABRIC_CPU;
  snprintf(f.name, sizeof f.name, "cpu:1");
  f.width = f.height = 1;
  f.pes = 1;
  f.pe_memory = 1e12;
  return f;
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

/* The profile at path with ins written just after the first "key": [;
 * -1 if it has no such key or the result would not fit 8 KB. */
static int insert_after_key(const char *path, const char *key,
                            const char *ins) {
  char text[8192], open[64];
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  snprintf(open, sizeof open, "\"%s\": [", key);
  char *at = strstr(text, open);
  size_t extra = strlen(ins);
  if (!at || n + extra >= sizeof text) return -1;
  at += strlen(open);
  memmove(at + extra, at, strlen(at) + 1);
  memcpy(at, ins, extra);
  return write_text(path, text);
}

static void test_round_trip(void) {
  char path[128];
  path_in(path, sizeof path, "cal.json");
  st_calibration c = sample_profile(), back;
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0, "write: %s", err.msg);
  CHECK(st_calibration_read(&back, path, &err) == 0, "read: %s", err.msg);
  CHECK(strcmp(back.date, c.date) == 0, "date '%s'", back.date);
  CHECK(back.cores == 4 && back.n_threads == 3, "cores %d threads %d",
        back.cores, back.n_threads);
  int same = 1;
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    same &= back.gemm_rate[k] == c.gemm_rate[k];
    for (int d = 0; d < 3; d++)
      same &= back.gemm_shape[k][d] == c.gemm_shape[k][d];
  }
  for (int k = 0; k < ST_OP_CLASSES; k++)
    same &= back.op_bandwidth[k] == c.op_bandwidth[k];
  for (int k = 0; k < ST_GEMM_CLASSES; k++)
    for (int d = 0; d < 4; d++)
      same &= back.conv_shape[k][d] == c.conv_shape[k][d] &&
              back.attention_shape[k][d] == c.attention_shape[k][d];
  for (int dir = 0; dir < 2; dir++)
    for (int k = 0; k < ST_GEMM_CLASSES; k++)
      same &= back.conv_rate[dir][k] == c.conv_rate[dir][k] &&
              back.attention_rate[dir][k] == c.attention_rate[dir][k];
  for (int i = 0; i < 3; i++)
    same &= back.threads[i] == c.threads[i] &&
            back.gemm_rate_threads[i] == c.gemm_rate_threads[i];
  /* efficiency 1.5e11 / 1.6e11 = 0.9375, 2.5e11 / 3.2e11 = 0.78125: exact
   * in 6 significant digits */
  same &= back.efficiency[1] == 0.9375 && back.efficiency[2] == 0.78125;
  same &= back.efficiency_slope == 0.25 && back.copy_bandwidth == 2.5e10;
  same &= back.sharing[1] == 0.75 && back.sharing[2] == 0.5 &&
          back.sharing_slope == 0.375;
  same &= back.input_bandwidth == 4e9 && back.step_latency == 2e-5 &&
          back.hosted_latency == 1e-6;
  same &= back.narrow_rows == 0 && back.n_spill == 0 && back.row_bandwidth == 0;
  CHECK(same, "every figure survives the round trip");
  /* a measured figure keeps every digit it has, not 6 of them */
  c.gemm_rate[0] = 123456789012.345, c.copy_bandwidth = 0.1 + 0.2;
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.gemm_rate[0] == c.gemm_rate[0] &&
            back.copy_bandwidth == c.copy_bandwidth,
        "figures of 15 and 17 digits round trip: %.17g, %.17g (%s)",
        back.gemm_rate[0], back.copy_bandwidth, err.msg);
  c = sample_profile();
  /* the one-row bandwidth, alone and beside the narrow terms */
  c.row_bandwidth = 6.5e10;
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.row_bandwidth == 6.5e10 && back.narrow_rows == 0,
        "row bandwidth alone: %s (%g)", err.msg, back.row_bandwidth);
  /* and beside the rank-one curve, the fused one absent (row_bandwidth
   * then ends the object) */
  c.n_rank_one = 2;
  c.rank_one_ws[0] = 1e6, c.rank_one_ws[1] = 1e7;
  c.rank_one_rate[0] = 3e10, c.rank_one_rate[1] = 2e10;
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.row_bandwidth == 6.5e10 && back.n_rank_one == 2 &&
            back.rank_one_rate[1] == 2e10 && back.n_row_step == 0,
        "the rank-one curve beside the row bandwidth alone: %s", err.msg);
  c = narrow_profile();
  c.row_bandwidth = 6.5e10;
  CHECK(st_calibration_write(&c, path, &err) == 0, "write: %s", err.msg);
  CHECK(st_calibration_read(&back, path, &err) == 0, "read: %s", err.msg);
  CHECK(back.row_bandwidth == 6.5e10,
        "row bandwidth beside the narrow "
        "terms: %g",
        back.row_bandwidth);
  CHECK(back.narrow_rows == 8 && back.narrow_rate == 4e10 &&
            back.l2_bytes == 1048576 && /* not 1048580: every digit */
            back.spill_cost == 2e-10 && back.n_spill == 3 &&
            back.spill_ws[1] == 1e7 && back.spill_fraction[1] == 0.25 &&
            back.spill_fraction[2] == 1 && back.step_latency == 2e-5,
        "the memory terms survive the round trip: rows %d, %d points",
        back.narrow_rows, back.n_spill);
  /* a cold step measured no slower leaves no curve, and reads back so */
  c.n_spill = 0;
  CHECK(st_calibration_write(&c, path, &err) == 0, "write: %s", err.msg);
  CHECK(st_calibration_read(&back, path, &err) == 0 && back.n_spill == 0 &&
            back.narrow_rate == 4e10,
        "no spill curve: %s", err.msg);
}

/* The model reproduces its own calibration point: cnn_fmnist's dense
 * layer (3136 -> 256, the large class's weights) in a pipeline of
 * micro-batches of 8 is predicted at the measured 8-row step's time, t8 / 8
 * per sample, up to its bias FLOPs; and with weights of half the width
 * (3136 -> 128, 1.6 MB) at the 64-row time scaled to
 * 8 rows plus 7/8 of the step's re-read of the weights past L2, by the
 * law's two points. Memory spill off (its curve starts past the stage). */
static void test_narrow_reproduces(void) {
  st_calibration c = narrow_profile();
  c.spill_ws[0] = 1e12, c.spill_ws[1] = 2e12, c.spill_ws[2] = 3e12;
  st_fabric f = one_core();
  st_calibration_apply(&c, &f, "test");
  for (int half = 0; half < 2; half++) {
    st_config cfg;
    st_config_defaults(&cfg);
    st_error err = {0};
    const char *sets[] = {"model.kind=cnn",
                          "model.channels=[32,64]",
                          half ? "model.dense=[128]" : "model.dense=[256]",
                          "train.batch=64",
                          "execution.mode=pipeline",
                          "execution.micro_batch=8"};
    st_model *m =
        model_of(&cfg, sets, sizeof sets / sizeof *sets, (st_shape){1, 28, 28});
    if (!m) return;
    st_block_cost bc[4];
    st_plan_costs(bc, m, &cfg);
    st_block_cost dense = bc[2]; /* flatten, linear, relu */
    memset(dense.bytes_fwd, 0, sizeof dense.bytes_fwd);
    memset(dense.bytes_bwd, 0, sizeof dense.bytes_bwd);
    st_plan_options opt = {
        .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
    st_plan *p = NULL;
    CHECK(st_plan_build(&p, &dense, 1, &f, &opt, &err) == 0, "%s", err.msg);
    if (p) {
      double n = half ? 128 : 256, k = 3136, t = p->stages[0].time;
      double t8 = 6.0 * 8 * 256 * k / c.narrow_rate; /* the measured step */
      double t64 = 6.0 * 64 * 256 * k / c.gemm_rate[3];
      double want = t8 / 8; /* per sample */
      if (half) {
        /* the large rate (64 x 128 x 3136 is large too) for the FLOPs,
         * and of the large step's
         * excess over 8/64 of its 64-row time, the share of the weights
         * past L2 that this layer has */
        double x =
            (t8 - t64 / 8) * (4 * n * k - 1048576) / (4 * 256 * k - 1048576);
        want = (6.0 * n * k / c.gemm_rate[3] + x / 8);
      }
      /* the bias: n FLOPs forward, n backward per sample, at the rate */
      CHECK(fabs(t - want) <= 2e-4 * want,
            "dense %g: %.9g s per sample, "
            "want %.9g",
            n, t, want);
      st_plan_destroy(p);
    }
    st_model_destroy(m);
  }
}

/* The memory terms by hand, on one block of one 256 x 3136 linear layer
 * (the large class's weights, 3,211,264 bytes) with no FLOPs of its own:
 * per sample t = (narrow + spill(ws) spill_cost W) / call_samples, a third
 * of it forward. narrow_cost from the profile: the 8-row step takes
 * t8 = 6 8 256 3136 / 4e10, the 64-row one t64 = 6 64 256 3136 / 8e10;
 * x = (t8 - t64 / 8) / (1 - 8 / 64) over the weights past L2. */
/* One block of one linear layer with no FLOPs of its own: only the
 * memory and narrow terms price it. */
static st_block_cost linear_block(double rows, double samples, double bytes,
                                  double ws, double gemms) {
  st_block_cost b;
  memset(&b, 0, sizeof b);
  snprintf(b.name, sizeof b.name, "blocks.0");
  b.n_linear = 1;
  b.linear_rows[0] = rows;
  b.linear_bytes[0] = bytes;
  b.linear_gemms[0] = gemms;
  b.call_samples = samples;
  b.ws_bytes = ws;
  return b;
}

/* The narrow kernels' compute term: the medium class (64 x 256 x 256,
 * 5e10 FLOP/s) at 8 rows from L2 at 4e10, so e = 1/4e10 - 1/5e10 =
 * 5e-12 s per FLOP at 8 rows, narrow_flop_cost = e / (1 - 8/64). It
 * survives a profile's round trip (and reads as 0 from one without it);
 * a layer whose weights fit L2 pays (1 - r/64) narrow_flop_cost per FLOP
 * of its step; the memory term gives up what the compute term explains,
 * so the large class's 8-row step is still reproduced exactly. And where
 * the compute term would explain more than that step's excess over its
 * scaled 64-row time (8 rows from L2 at 2.5e10: e k8 = 7.7e-4 s, the
 * excess 4.8e-4), it is cut to the excess and the memory term is 0. */
static void test_narrow_compute(void) {
  st_calibration c = narrow_profile(), back;
  c.narrow_l2_rate = 4e10;
  char path[128];
  snprintf(path, sizeof path, "/tmp/strata_test_cal_l2_%d.json", (int)getpid());
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.narrow_l2_rate == 4e10,
        "narrow_l2_rate round trip: %s (%g)", err.msg, back.narrow_l2_rate);
  st_calibration old = narrow_profile();
  CHECK(st_calibration_write(&old, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.narrow_l2_rate == 0,
        "a profile without narrow_l2_rate reads 0: %s", err.msg);
  remove(path);

  st_fabric f = one_core();
  st_calibration_apply(&c, &f, "test");
  double e = 1 / 4e10 - 1 / 5e10, nfc = e / (1 - 8.0 / 64);
  CHECK(fabs(f.narrow_flop_cost - nfc) <= 1e-12 * nfc,
        "narrow_flop_cost %g want %g", f.narrow_flop_cost, nfc);
  double wl = 4.0 * 256 * 3136, l2 = 1048576, k8 = 6.0 * 8 * 256 * 3136;
  double t8 = k8 / 4e10, t64 = 6.0 * 64 * 256 * 3136 / 8e10;
  double x = (t8 - t64 / 8 - k8 * e) / (1 - 8.0 / 64);
  CHECK(fabs(f.narrow_cost - x / (wl - l2)) <= 1e-12 * f.narrow_cost,
        "narrow cost %g want %g", f.narrow_cost, x / (wl - l2));
  /* {rows, weight bytes}: per sample, the step's narrow terms */
  double ws = 4.0 * 256 * 256; /* in L2 */
  struct {
    double rows, bytes, want;
  } cases[] = {
      {8, ws, (1 - 8.0 / 64) * nfc * 1.5 * 8 * ws / 8},
      {16, ws, (1 - 16.0 / 64) * nfc * 1.5 * 16 * ws / 16},
      {8, wl, (t8 - t64 / 8) / 8}, /* the calibration point, both terms */
      {64, ws, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    /* working set below the spill curve */
    st_block_cost b =
        linear_block(cases[i].rows, cases[i].rows, cases[i].bytes, 1e6, 3);
    st_plan_options opt = {
        .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
    st_plan *p = NULL;
    CHECK(st_plan_build(&p, &b, 1, &f, &opt, &err) == 0, "%s", err.msg);
    if (!p) continue;
    double t = p->stages[0].time, want = cases[i].want;
    CHECK(fabs(t - want) <= 1e-9 * (want > 0 ? want : 1e-9),
          "case %zu (%g rows, %g bytes): %.9g s per sample, want %.9g", i,
          cases[i].rows, cases[i].bytes, t, want);
    st_plan_destroy(p);
  }
  /* the cut: 2.5e10 from L2 would explain more than the large step's
   * excess */
  c.narrow_l2_rate = 2.5e10;
  st_fabric g = one_core();
  st_calibration_apply(&c, &g, "test");
  double cut = (t8 - t64 / 8) / k8 / (1 - 8.0 / 64);
  CHECK(fabs(g.narrow_flop_cost - cut) <= 1e-12 * cut && g.narrow_cost == 0,
        "cut compute term %g want %g, memory term %g want 0",
        g.narrow_flop_cost, cut, g.narrow_cost);
}

static void test_memory_terms(void) {
  st_calibration c = narrow_profile();
  double w = 4.0 * 256 * 3136, l2 = 1048576;
  double t8 = 6.0 * 8 * 256 * 3136 / 4e10, t64 = 6.0 * 64 * 256 * 3136 / 8e10;
  double x = (t8 - t64 / 8) / (1 - 8.0 / 64);
  st_fabric f = one_core();
  st_calibration_apply(&c, &f, "test");
  CHECK(fabs(f.narrow_cost - x / (w - l2)) <= 1e-12 * f.narrow_cost &&
            f.l2_bytes == l2,
        "narrow cost %g want %g", f.narrow_cost, x / (w - l2));
  /* the spill curve: 0 up to its first point, linear between, 1 past */
  double probe[][2] = {{1e6, 0},       {6e6, 0}, {8e6, 0.125}, {1e7, 0.25},
                       {2.5e7, 0.625}, {4e7, 1}, {1e9, 1}};
  for (size_t i = 0; i < sizeof probe / sizeof *probe; i++)
    CHECK(fabs(st_spill_fraction(&f, probe[i][0]) - probe[i][1]) <= 1e-15,
          "spill(%g) = %g want %g", probe[i][0],
          st_spill_fraction(&f, probe[i][0]), probe[i][1]);
  /* {rows, call samples, weight bytes, working set, GEMMs}, and the
   * narrow and spill terms expected per sample for the whole step; a
   * third of a 3-GEMM step runs forward, half of a 2-GEMM one */
  struct {
    double rows, samples, bytes, ws, gemms, narrow, spill;
  } cases[] = {
      {8, 8, w, 8e6, 3, (1 - 8.0 / 64) * x / 8, 0.125 * 2e-10 * w / 8},
      {16, 8, w, 1e6, 3, (1 - 16.0 / 64) * x / 8, 0}, /* 2 positions */
      {8, 8, w, 8e6, 2, (1 - 8.0 / 64) * x / 12, 0.125 * 2e-10 * w / 12},
      {8, 8, w, 2.5e7, 3, (1 - 8.0 / 64) * x / 8, 0.625 * 2e-10 * w / 8},
      {64, 64, w, 5e7, 3, 0, 2e-10 * w / 64}, /* no narrow term */
      {1, 1, w, 1e6, 3, 0, 0},                /* batch 1: no GEMMs */
      {8, 8, l2, 1e6, 3, 0, 0},               /* weights in L2 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    st_block_cost b = linear_block(cases[i].rows, cases[i].samples,
                                   cases[i].bytes, cases[i].ws, cases[i].gemms);
    st_plan_options opt = {
        .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
    st_plan *p = NULL;
    st_error err = {0};
    CHECK(st_plan_build(&p, &b, 1, &f, &opt, &err) == 0, "%s", err.msg);
    if (!p) continue;
    double t = cases[i].narrow + cases[i].spill;
    double fwd = t / cases[i].gemms, bwd = t - fwd;
    CHECK(fabs(p->stages[0].time_fwd - fwd) <= 1e-12 * t &&
              fabs(p->stages[0].time_bwd - bwd) <= 1e-12 * t,
          "case %zu: fwd %.9g bwd %.9g want %.9g %.9g", i,
          p->stages[0].time_fwd, p->stages[0].time_bwd, fwd, bwd);
    st_plan_destroy(p);
  }
  /* with a row bandwidth, a one-row layer pays no spill term (it streams
   * its weights every call at that bandwidth): the case above at 25 MB */
  {
    st_fabric g = f;
    g.row_bandwidth = 5e10;
    st_block_cost b;
    memset(&b, 0, sizeof b);
    snprintf(b.name, sizeof b.name, "blocks.0");
    b.n_linear = 1;
    b.linear_rows[0] = 1, b.linear_bytes[0] = w, b.linear_gemms[0] = 3;
    b.call_samples = 1, b.ws_bytes = 2.5e7;
    b.row_bytes_fwd = w;
    st_plan_options opt = {
        .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
    st_plan *p = NULL;
    st_error e = {0};
    CHECK(st_plan_build(&p, &b, 1, &g, &opt, &e) == 0, "%s", e.msg);
    if (p)
      CHECK(fabs(p->stages[0].time - w / 5e10) <= 1e-12 * w / 5e10,
            "one row, 25 MB: %.9g s, want %.9g", p->stages[0].time, w / 5e10);
    st_plan_destroy(p);
    /* and without it (an older profile), the spill term as before */
    g.row_bandwidth = 0;
    b.row_bytes_fwd = 0;
    CHECK(st_plan_build(&p, &b, 1, &g, &opt, &e) == 0, "%s", e.msg);
    if (p)
      CHECK(fabs(p->stages[0].time - 0.625 * 2e-10 * w) <= 1e-9 * w * 2e-10,
            "one row, 25 MB, no row bandwidth: %.9g s", p->stages[0].time);
    st_plan_destroy(p);
  }
  /* the L2 term: a layer of 0.5 MB (inside L2) at 8 rows, with a row
   * bandwidth of 5e10 B/s, in a stage whose working set passes L2 on its
   * one core, streams w / 8 a sample forward and 3 w / 8 backward (the
   * input gradient's read, the weight gradient's read and write) on top
   * of what it costs without the bandwidth; inside L2, or for weights past
   * L2 on their own (the narrow term's), nothing */
  {
    double w2 = 5e5;
    struct {
      double bytes, ws, fwd, bwd;
    } l2c[] = {{w2, 2e6, w2 / 8 / 5e10, 3 * w2 / 8 / 5e10},
               {w2, 9e5, 0, 0},
               {w, 2e6, 0, 0}};
    for (int k = 0; k < 3; k++) {
      st_block_cost b = linear_block(8, 8, l2c[k].bytes, l2c[k].ws, 3);
      st_plan_options opt = {
          .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
      double tf[2] = {0, 0}, tb[2] = {0, 0};
      for (int with = 0; with < 2; with++) {
        st_fabric g = f;
        g.row_bandwidth = with ? 5e10 : 0;
        st_plan *p = NULL;
        st_error e = {0};
        CHECK(st_plan_build(&p, &b, 1, &g, &opt, &e) == 0, "%s", e.msg);
        if (p)
          tf[with] = p->stages[0].time_fwd, tb[with] = p->stages[0].time_bwd;
        st_plan_destroy(p);
      }
      double scale = tf[0] + tb[0] + l2c[k].fwd + l2c[k].bwd;
      CHECK(fabs(tf[1] - tf[0] - l2c[k].fwd) <= 1e-12 * scale &&
                fabs(tb[1] - tb[0] - l2c[k].bwd) <= 1e-12 * scale,
            "L2 case %d: +%.9g s forward, +%.9g backward, want +%.9g, +%.9g", k,
            tf[1] - tf[0], tb[1] - tb[0], l2c[k].fwd, l2c[k].bwd);
    }
  }
  /* a spill curve that falls, leaves [0, 1] or does not run from 0 to 1,
   * narrow rows at the reference, a falling working set: refused, naming
   * the file and the key */
  char path[128];
  path_in(path, sizeof path, "bad_spill.json");
  st_error err = {0};
  st_calibration bad, back;
  for (int k = 0; k < 6; k++) {
    bad = narrow_profile();
    const char *key = "\"spill_fraction\" rise from 0 to 1";
    if (k == 0) bad.spill_fraction[1] = 1.5;
    if (k == 1) bad.spill_fraction[2] = 0.2; /* falls */
    if (k == 2) bad.spill_fraction[0] = 0.1;
    if (k == 3) bad.spill_fraction[2] = 0.9;
    if (k == 4) bad.spill_ws[1] = 5e6; /* below the first */
    if (k == 5) {
      bad.narrow_rows = 64;
      key = "\"narrow_rows\"";
    }
    CHECK(st_calibration_write(&bad, path, &err) == 0, "%s", err.msg);
    CHECK(st_calibration_read(&back, path, &err) == ST_EFORMAT &&
              strstr(err.msg, key) && strstr(err.msg, path),
          "bad memory terms %d: '%s'", k, err.msg);
  }
  /* a fabric that drops the calibration (fabric.pe_flops) pays no spill */
  f.calibrated = 0;
  CHECK(st_spill_fraction(&f, 1e9) == 0, "uncalibrated: no spill");
  f.calibrated = 1;
  /* a profile without the measurement: neither term */
  c = sample_profile();
  st_calibration_apply(&c, &f, "test");
  CHECK(f.narrow_cost == 0 && f.spill_cost == 0 && f.n_spill == 0 &&
            st_spill_fraction(&f, 1e9) == 0,
        "older profile: no memory terms");
}

/* A profile written before core sharing was measured reads as independent
 * cores (m = 1, slope 0); with sharing, a plan that keeps every core busy
 * with one-core stages is slower than one without, a one-stage plan on all
 * the cores is not. */
static void test_sharing(void) {
  char path[128], text[4096], old[4096];
  path_in(path, sizeof path, "shared.json");
  st_calibration c = sample_profile(), back;
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0, "%s", err.msg);
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = '\0';
  /* drop the two sharing lines and the caller's time (input_bandwidth;
   * step_latency, the last, leaves "copy_bandwidth" ending the object) */
  size_t o = 0;
  for (const char *line = text; *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
    if (memmem(line, len, "\"step_latency", 13) && o > 2 && old[o - 2] == ',') {
      old[o - 2] = '\n'; /* the line before it now ends the object */
      o--;
    } else if (memmem(line, len, "\"op_bandwidth", 13)) {
      /* before gelu's class: four op bandwidths */
      size_t keep = 0; /* up to the last ", " between numbers */
      for (size_t i = 0; i + 1 < len; i++)
        if (line[i] == ',' && line[i + 1] == ' ') keep = i;
      memcpy(old + o, line, keep);
      o += keep;
      memcpy(old + o, "],\n", 3);
      o += 3;
    } else if (!memmem(line, len, "\"sharing", 8) &&
               !memmem(line, len, "\"input_bandwidth", 16) &&
               !memmem(line, len, "\"hosted_latency", 15) &&
               !memmem(line, len, "\"conv_", 6) &&

               !memmem(line, len, "\"attention_", 11)) {
      memcpy(old + o, line, len);
      o += len;
    }
    line += len;
  }
  old[o] = '\0';
  CHECK(o < n && write_text(path, old) == 0, "an older profile");
  CHECK(st_calibration_read(&back, path, &err) == 0, "older profile: %s",
        err.msg);
  CHECK(back.sharing_slope == 0 && back.sharing[0] == 1 && back.sharing[2] == 1,
        "older profile: sharing slope %g", back.sharing_slope);
  CHECK(back.input_bandwidth == 0 && back.step_latency == 0 &&
            back.hosted_latency == 0,
        "older profile: the caller's time not modelled (%g, %g, %g)",
        back.input_bandwidth, back.step_latency, back.hosted_latency);
  CHECK(back.op_bandwidth[3] == 2e10 && back.op_bandwidth[4] == 1e10,
        "older profile: gelu timed as pointwise (%g, optimizer %g)",
        back.op_bandwidth[4], back.op_bandwidth[3]);
  CHECK(back.conv_rate[0][0] == 0 && back.conv_rate[1][3] == 0 &&
            back.attention_rate[0][0] == 0 && back.attention_rate[1][3] == 0,
        "older profile: conv2d and attention timed as GEMMs");

  st_calibration_write(&c, path, &err);
  setenv("STRATA_CALIBRATION", path, 1);
  st_config cfg;
  st_config_defaults(&cfg);
  CHECK(st_config_set(&cfg, "fabric.cores=4", &err) == 0, "%s", err.msg);
  CHECK(st_config_set(&cfg, "model.hidden=[256,256,256]", &err) == 0, "%s",
        err.msg);
  st_fabric fab;
  CHECK(st_fabric_resolve(&fab, &cfg, &err) == 0 && fab.sharing_slope == 0.375,
        "fabric: %s", err.msg);
  setenv("STRATA_CALIBRATION", "none", 1);
  st_model *m = NULL;
  CHECK(st_model_create(&m, &cfg, (st_shape){1, 28, 28}, &err) == 0, "%s",
        err.msg);
  if (!m) return;
  st_block_cost bc[8];
  st_plan_costs(bc, m, &cfg);
  double t[2][2]; /* [sharing off/on][1 stage / 4 stages] */
  for (int on = 0; on < 2; on++) {
    st_fabric fb = fab;
    fb.sharing_slope = on ? 0.375 : 0;
    for (int k = 0; k < 2; k++) {
      st_plan_options opt = {
          .stages = k ? 4 : 1, .samples_in_flight = 1, .weight_versions = 1};
      st_plan *plan = NULL;
      CHECK(st_plan_build(&plan, bc, m->n_blocks, &fb, &opt, &err) == 0, "%s",
            err.msg);
      t[on][k] = plan ? plan->bottleneck_time : 0;
      st_plan_destroy(plan);
    }
  }
  CHECK(t[1][0] == t[0][0], "one stage on all 4 cores: %g vs %g", t[1][0],
        t[0][0]);
  /* one core each while all 4 are busy: GEMM time x m(1)/m(4) = 2.125 */
  CHECK(t[1][1] > 1.2 * t[0][1] && t[1][1] <= 2.125 * t[0][1] * (1 + 1e-12),
        "four one-core stages: %g with sharing, %g without", t[1][1], t[0][1]);
  st_model_destroy(m);
}

/* Reads `text` as a profile; the error must name the file and contain
 * `want`. */
static void expect_bad(const char *name, const char *text, const char *want) {
  char path[128];
  path_in(path, sizeof path, name);
  CHECK(write_text(path, text) == 0, "cannot write %s", path);
  st_calibration c;
  st_error err = {0};
  int rc = st_calibration_read(&c, path, &err);
  CHECK(rc == ST_EFORMAT && strstr(err.msg, path) && strstr(err.msg, want) &&
            strstr(err.msg, "strata bench --calibrate"),
        "%s: rc %d, message '%s' (want '%s', the path and the hint)", name, rc,
        err.msg, want);
}

static void test_bad_profiles(void) {
  char good_path[128], text[4096];
  path_in(good_path, sizeof good_path, "good.json");
  st_calibration c = sample_profile();
  st_error err = {0};
  CHECK(st_calibration_write(&c, good_path, &err) == 0, "%s", err.msg);
  FILE *f = fopen(good_path, "rb");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = '\0';

  expect_bad("foreign.json", "{\"format\": \"strata-plan\", \"version\": 1}",
             "not a strata calibration profile");
  expect_bad("empty.json", "", "not a strata calibration profile");
  /* STRATA_CALIBRATION naming a folder: said so, not "no format" */
  char folder[128];
  path_in(folder, sizeof folder, "a_folder");
  mkdir(folder, 0700);
  st_calibration back;
  err.msg[0] = 0;
  CHECK(st_calibration_read(&back, folder, &err) != 0 &&
            strstr(err.msg, folder) && strstr(err.msg, "a folder, not a file"),
        "a folder as the profile: '%s'", err.msg);
  rmdir(folder);
  char edited[4096];
  /* a future version */
  snprintf(edited, sizeof edited, "%s", text);
  char *v = strstr(edited, "\"version\": 1");
  CHECK(v != NULL, "the written profile has a version");
  if (v) v[strlen("\"version\": ")] = '2';
  expect_bad("v2.json", edited, "version 2, this strata reads version 1");
  /* truncated in the middle */
  snprintf(edited, sizeof edited, "%.*s", (int)(n / 2), text);
  expect_bad("truncated.json", edited, "\"");
  /* truncated at a line's end, every figure before it whole: the keys it
   * lost are optional (the narrow and spill terms), so it had read as an
   * older profile without them */
  {
    char cut[4096];
    st_calibration nc = narrow_profile();
    CHECK(st_calibration_write(&nc, good_path, &err) == 0, "%s", err.msg);
    f = fopen(good_path, "rb");
    size_t cn = f ? fread(cut, 1, sizeof cut - 1, f) : 0;
    if (f) fclose(f);
    cut[cn] = '\0';
    char *at = strstr(cut, "  \"narrow_rows\"");
    CHECK(at != NULL, "the written profile has narrow_rows");
    if (at) *at = '\0';
    expect_bad("truncated.json", cut, "truncated");
  }
  /* a negative rate */
  snprintf(edited, sizeof edited, "%s", text);
  char *g = strstr(edited, "\"gemm_rate\": [");
  CHECK(g != NULL, "the written profile has gemm_rate");
  if (g) g[strlen("\"gemm_rate\": [")] = '-';
  expect_bad("negative.json", edited, "\"gemm_rate\"");
  /* counts and sizes are whole numbers, the thread counts rising: each
   * of these was read (atoi's 4, (int) 32.5, thread counts 0 and -3) */
  static const char *const wrong[][3] = {
      {"\"threads\": [1, 2, 4]", "\"threads\": [0, -3, 4]", "\"threads\""},
      {"\"threads\": [1, 2, 4]", "\"threads\": [1, 4, 2]", "rising"},
      {"\"threads\": [1, 2, 4]", "\"threads\": [1, 2.5, 4]", "\"threads\""},
      {"[32, 784, 9]", "[32.5, 784, 9]", "\"gemm_shapes\""},
      {"[8, 1, 28, 32]", "[8, 1, 28, 32.25]", "\"conv_shapes\""},
      {"[2, 256, 256, 4]", "[2, 256, 256, 4.5]", "\"attention_shapes\""},
      {"\"cores\": 4", "\"cores\": 4x", "\"cores\""},
      {"\"cores\": 4", "\"cores\": 1e9", "\"cores\""},
      {"\"version\": 1", "\"version\": 1.5", "\"version\""}};
  for (size_t k = 0; k < sizeof wrong / sizeof *wrong; k++) {
    char *at = strstr(text, wrong[k][0]);
    CHECK(at != NULL, "the written profile has %s", wrong[k][0]);
    if (!at) continue;
    snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - text), text,
             wrong[k][1], at + strlen(wrong[k][0]));
    expect_bad("wrong.json", edited, wrong[k][2]);
  }
  /* an optional figure, present, is checked like the others */
  st_calibration with_row = sample_profile();
  with_row.row_bandwidth = 6.5e10;
  CHECK(st_calibration_write(&with_row, good_path, &err) == 0, "%s", err.msg);
  f = fopen(good_path, "rb");
  n = f ? fread(edited, 1, sizeof edited - 1, f) : 0;
  if (f) fclose(f);
  edited[n] = '\0';
  g = strstr(edited, "\"row_bandwidth\": [");
  CHECK(g != NULL, "the written profile has row_bandwidth");
  if (g) g[strlen("\"row_bandwidth\": [")] = '-';
  expect_bad("negative.json", edited, "\"row_bandwidth\"");

  /* the cpu fabric refuses a bad profile rather than guess, naming it */
  char bad_path[128];
  path_in(bad_path, sizeof bad_path, "v2.json");
  setenv("STRATA_CALIBRATION", bad_path, 1);
  st_config cfg;
  st_config_defaults(&cfg);
  st_fabric fab;
  int rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == ST_EFORMAT && strstr(err.msg, bad_path), "fabric: %d '%s'", rc,
        err.msg);
  /* no file: the built-in estimate, said so */
  char none[128];
  path_in(none, sizeof none, "absent.json");
  setenv("STRATA_CALIBRATION", none, 1);
  rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == 0 && fab.estimated && !fab.calibrated &&
            strstr(fab.source, "not calibrated") && strstr(fab.source, none),
        "absent profile: rc %d source '%s'", rc, fab.source);
  /* a good one: calibrated, with its date and file in the source */
  setenv("STRATA_CALIBRATION", good_path, 1);
  rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == 0 && fab.calibrated && !fab.estimated &&
            strstr(fab.source, "calibrated 2026-01-02T03:04:05Z") &&
            strstr(fab.source, good_path) && fab.efficiency_slope == 0.25 &&
            fab.link_bandwidth == 2.5e10 && fab.gemm_rate[2] == 5e10,
        "good profile: rc %d source '%s'", rc, fab.source);
  /* an explicit fabric.pe_flops means one rate for every FLOP */
  CHECK(st_config_set(&cfg, "fabric.pe_flops=1e9", &err) == 0, "%s", err.msg);
  rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == 0 && !fab.calibrated && fab.pe_flops == 1e9,
        "pe_flops override drops the per-class rates");
  setenv("STRATA_CALIBRATION", "none", 1);
}

/* Pass 1's split for a small cnn: conv 1->4 (3x3 same), relu, maxpool 2x2 |
 * flatten, linear 784->10; sgd with momentum (1 slot), batch 32. */
static void test_split_by_hand(void) {
  st_config cfg;
  st_config_defaults(&cfg);
  const char *sets[] = {"model.kind=cnn",     "model.channels=[4]",
                        "model.dense=[]",     "model.norm=none",
                        "optimizer.kind=sgd", "optimizer.momentum=0.9",
                        "train.batch=32"};
  st_model *m =
      model_of(&cfg, sets, sizeof sets / sizeof *sets, (st_shape){1, 28, 28});
  if (!m) return;
  st_block_cost bc[2];
  st_plan_costs(bc, m, &cfg);
  st_cost conv = st_conv2d_cost(1, 28, 28, 4, 3, 1, 1);
  st_cost lin = st_linear_cost(784, 10);
  /* conv GEMM (4) x (784) x (9): 28,224 < 2^18, tiny; linear at batch 32,
   * classed by its weights at 64 rows: 64 x 10 x 784 = 501,760, small */
  CHECK(st_gemm_class(4, 784, 9) == 0 && st_gemm_class(32, 10, 784) == 0 &&
            st_gemm_class(64, 128, 128) == 1 &&
            st_gemm_class(64, 256, 256) == 2 &&
            st_gemm_class(64, 256, 3136) == 3,
        "gemm classes");
  CHECK(bc[0].conv_fwd[0] == conv.flops_fwd &&
            /* no input gradient in the first block: dW and db only (the
             * forward's bias term, 4 x 28 x 28, is not the skipped GEMM's) */
            bc[0].conv_bwd[0] == conv.flops_bwd - conv.flops_fwd + 3136 &&
            bc[0].conv_fwd[1] == 0 && bc[0].gemm_fwd[0] == 0 &&
            bc[0].gemm_bwd[0] == 0,
        "block 0 conv2d %g %g", bc[0].conv_fwd[0], bc[0].conv_bwd[0]);
  /* relu on 4x28x28 = 3136: read + write 2n floats forward, 3n backward;
   * maxpool 3136 -> 784: in + out + index forward and backward */
  CHECK(bc[0].bytes_fwd[0] == 4.0 * 2 * 3136 &&
            bc[0].bytes_bwd[0] == 4.0 * 3 * 3136,
        "block 0 pointwise %g %g", bc[0].bytes_fwd[0], bc[0].bytes_bwd[0]);
  CHECK(bc[0].bytes_fwd[2] == 4.0 * (3136 + 2 * 784) &&
            bc[0].bytes_bwd[2] == 4.0 * (3136 + 2 * 784),
        "block 0 pool %g", bc[0].bytes_fwd[2]);
  /* optimizer: 40 parameters x (4 + 2 x 1 slot) floats, once per 32 */
  CHECK(bc[0].bytes_bwd[3] == 4.0 * 40 * 6 / 32, "block 0 optimizer %g",
        bc[0].bytes_bwd[3]);
  CHECK(bc[1].gemm_fwd[1] == lin.flops_fwd &&
            bc[1].gemm_bwd[1] == lin.flops_bwd && bc[1].gemm_fwd[0] == 0,
        "block 1 GEMM");
  /* the memory terms' inputs: one linear layer of 784 x 10 weights, calls
   * of 32 rows, its three GEMMs; none in block 0 (a conv); a micro-batch's
   * step touches weights and gradient, two micro-batches' activations and
   * inputs */
  CHECK(bc[0].n_linear == 0 && bc[1].n_linear == 1 &&
            bc[1].linear_bytes[0] == 4.0 * 7840 && bc[1].linear_rows[0] == 32 &&
            bc[1].linear_gemms[0] == 3 && bc[1].call_samples == 32,
        "block 1 linear: %d, %g bytes, %g rows, %g gemms", bc[1].n_linear,
        bc[1].linear_bytes[0], bc[1].linear_rows[0], bc[1].linear_gemms[0]);
  CHECK(bc[1].ws_bytes == 2 * 4.0 * 7850 + 32 * (bc[1].act_bytes + 4.0 * 784),
        "block 1 working set %g (one batch: not split)", bc[1].ws_bytes);
  /* flatten: a copy each way (784); softmax-xent on 10: 3C and 2C floats */
  CHECK(bc[1].bytes_fwd[0] == 4.0 * (2 * 784 + 3 * 10) &&
            bc[1].bytes_bwd[0] == 4.0 * (2 * 784 + 2 * 10),
        "block 1 pointwise %g %g", bc[1].bytes_fwd[0], bc[1].bytes_bwd[0]);
  CHECK(bc[1].bytes_bwd[3] == 4.0 * 7850 * 6 / 32, "block 1 optimizer");
  st_model_destroy(m);
}

/* A relu after a linear layer is stored by the linear's product
 * (st_layer_fuses_relu): fc_mnist's [linear relu] blocks have no forward
 * pass of pointwise bytes, the backward's mask pass still 3n; a relu after
 * a conv (test_split_by_hand) keeps its forward pass. */
static void test_split_linear_relu(void) {
  st_config cfg;
  st_config_defaults(&cfg); /* mlp [256, 256] */
  st_model *m = model_of(&cfg, NULL, 0, (st_shape){1, 28, 28});
  if (!m) return;
  st_block_cost bc[3];
  st_plan_costs(bc, m, &cfg);
  for (int i = 0; i < 2; i++)
    CHECK(st_layer_fuses_relu(&m->blocks[i], 0) && bc[i].bytes_fwd[0] == 0 &&
              bc[i].bytes_bwd[0] == 4.0 * 3 * 256,
          "block %d [linear relu]: fused %d, pointwise %g %g", i,
          st_layer_fuses_relu(&m->blocks[i], 0), bc[i].bytes_fwd[0],
          bc[i].bytes_bwd[0]);
  st_model_destroy(m);
}

/* A GPT block's split: attention FLOPs apart from the linear layers' GEMMs,
 * in the class of its (32 rows, T, head size) tiles, and gelu's bytes in
 * the gelu class, not pointwise. */
static void test_split_gpt(void) {
  st_config cfg;
  st_config_defaults(&cfg);
  const char *sets[] = {"model.kind=gpt",
                        "model.vocab=256",
                        "model.context=64",
                        "model.layers=1",
                        "model.heads=4",
                        "model.width=128",
                        "model.activation=gelu_tanh",
                        "train.batch=8"};
  st_model *m =
      model_of(&cfg, sets, sizeof sets / sizeof *sets, (st_shape){1, 64, 1});
  if (!m) return;
  CHECK(m->n_blocks == 3, "embed, h.0, head: %d blocks", m->n_blocks);
  st_block_cost bc[3];
  st_plan_costs(bc, m, &cfg);
  st_cost a = st_attention_cost(64, 128, 4);
  int cls = st_gemm_class(32, 64, 32); /* 65,536: tiny */
  double conv = 0, attn_other = 0;
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    conv += bc[1].conv_fwd[k] + bc[1].conv_bwd[k];
    if (k != cls) attn_other += bc[1].attn_fwd[k] + bc[1].attn_bwd[k];
  }
  CHECK(cls == 0 && bc[1].attn_fwd[0] == a.flops_fwd &&
            bc[1].attn_bwd[0] == a.flops_bwd && attn_other == 0 && conv == 0,
        "h.0 attention %g %g (want %g %g)", bc[1].attn_fwd[0],
        bc[1].attn_bwd[0], a.flops_fwd, a.flops_bwd);
  /* gelu on 64 positions x 512: read x, write y; in the backward its
   * output is made again for the projection's (ST_RECOMPUTED: read x,
   * write y, 20 FLOPs an element, as the forward), then read dy and x,
   * write dx */
  double n = 64.0 * 512;
  CHECK(m->blocks[1].layers[7].kind == ST_OP_GELU &&
            m->blocks[1].layers[7].transient == ST_RECOMPUTED,
        "h.0 layer 7 is a recomputed gelu");
  CHECK(bc[1].bytes_fwd[4] == 4 * 2 * n &&
            bc[1].bytes_bwd[4] == 4 * 2 * n + 4 * 3 * n,
        "h.0 gelu %g %g", bc[1].bytes_fwd[4], bc[1].bytes_bwd[4]);
  /* the block's backward FLOPs, op by op (model.c's layer_cost) */
  double T = 64, C = 128;
  double want = 2 * T * st_layernorm_cost(128).flops_bwd +
                T * (st_linear_cost(128, 384).flops_bwd +
                     st_linear_cost(128, 128).flops_bwd +
                     st_linear_cost(128, 512).flops_bwd +
                     st_linear_cost(512, 128).flops_bwd) +
                a.flops_bwd + 2 * T * C /* two residual adds */ + 30 * n +
                20 * n /* gelu's backward, and it again */;
  CHECK(fabs(m->blocks[1].cost.flops_bwd - want) <= 1e-9 * want,
        "h.0 backward FLOPs %.0f, want %.0f", m->blocks[1].cost.flops_bwd,
        want);
  /* the four linear layers (qkv, projection, MLP up and down) stay GEMMs:
   * 2 x 64 x 128 x (384 + 128 + 512 + 512) forward */
  double gemm = 0;
  for (int k = 0; k < ST_GEMM_CLASSES; k++) gemm += bc[1].gemm_fwd[k];
  CHECK(gemm == 2.0 * 64 * 128 * (384 + 128 + 512 + 512) +
                    64.0 * (384 + 128 + 512 + 128),
        "h.0 linear forward FLOPs %g", gemm);
  /* their memory terms' inputs: a call is the batch of 8 sequences, 8 x 64
   * rows, on 128 x 384, 128 x 128, 128 x 512 and 512 x 128 weights */
  double wb[] = {128 * 384, 128 * 128, 128 * 512, 512 * 128};
  int same = bc[1].n_linear == 4 && bc[1].call_samples == 8;
  for (int l = 0; l < 4 && same; l++)
    same = bc[1].linear_bytes[l] == 4 * wb[l] &&
           bc[1].linear_rows[l] == 8 * 64 && bc[1].linear_gemms[l] == 3;
  CHECK(same, "h.0 linear layers: %d, rows %g, %g samples a call",
        bc[1].n_linear, bc[1].linear_rows[0], bc[1].call_samples);
  /* the other ops' bytes on nc = 64 x 128 floats a sample: the embedding
   * reads two table rows and writes one (forward), reads dy and adds into
   * both tables (backward, the first block's: it still runs); each
   * layernorm a stats pass and a normalise pass (3n), its backward two
   * passes over dy and x (5n); each residual reads two and writes one
   * (3n), its backward copies dy to dx and to the skip (4n) */
  double nc = 64.0 * 128; /* nc above was the MLP's 512 wide */
  CHECK(bc[0].bytes_fwd[0] == 4 * 3 * nc && bc[0].bytes_bwd[0] == 4 * 5 * nc,
        "embed pointwise %g %g, want %g %g", bc[0].bytes_fwd[0],
        bc[0].bytes_bwd[0], 4 * 3 * nc, 4 * 5 * nc);
  CHECK(bc[1].bytes_fwd[1] == 2 * 4 * 3 * nc &&
            bc[1].bytes_bwd[1] == 2 * 4 * 5 * nc,
        "h.0 two layernorms %g %g, want %g %g", bc[1].bytes_fwd[1],
        bc[1].bytes_bwd[1], 2 * 4 * 3 * nc, 2 * 4 * 5 * nc);
  CHECK(bc[1].bytes_fwd[0] == 2 * 4 * 3 * nc &&
            bc[1].bytes_bwd[0] == 2 * 4 * 4 * nc,
        "h.0 two residuals %g %g, want %g %g", bc[1].bytes_fwd[0],
        bc[1].bytes_bwd[0], 2 * 4 * 3 * nc, 2 * 4 * 4 * nc);
  /* what a sample brings in (64 token ids) and its labels (64, one a
   * position: the I/O cap's bytes); the tied head's copy of the token
   * table, 256 x 128, which weight streaming writes and never updates */
  CHECK(bc[0].in_bytes == 4 * 64 && bc[2].label_bytes == 4 * 64 &&
            bc[0].label_bytes == 0,
        "in %g bytes, labels %g bytes a sample, want 256 and 256",
        bc[0].in_bytes, bc[2].label_bytes);
  CHECK(bc[2].tied_bytes == 4.0 * 256 * 128 && bc[0].tied_bytes == 0 &&
            bc[1].tied_bytes == 0,
        "tied bytes %g %g %g, want 0 0 %g", bc[0].tied_bytes, bc[1].tied_bytes,
        bc[2].tied_bytes, 4.0 * 256 * 128);
  st_model_destroy(m);
  /* rotary positions and dropout: the rotation copies and rotates the
   * qkv output (3 x 128 x 64: 2 of its n forward and backward); dropout
   * reads x, writes y and its mask, a bit an element (2n floats and n / 32
   * words), its backward reads dy and the mask and writes dx (the same),
   * after the embedding and after each of the block's two projections */
  st_config rot;
  st_config_defaults(&rot);
  const char *rsets[] = {"model.kind=gpt",
                         "model.vocab=256",
                         "model.context=64",
                         "model.layers=1",
                         "model.heads=4",
                         "model.width=128",
                         "model.activation=gelu_tanh",
                         "model.positions=rotary",
                         "model.dropout=0.1",
                         "train.batch=8"};
  m = model_of(&rot, rsets, sizeof rsets / sizeof *rsets, (st_shape){1, 64, 1});
  if (!m) return;
  st_plan_costs(bc, m, &rot);
  double qkv = 3 * nc, drop = 4 * 2 * nc + 4 * nc / 32;
  CHECK(bc[0].bytes_fwd[0] == 4 * 3 * nc + drop &&
            bc[0].bytes_bwd[0] == 4 * 5 * nc + drop,
        "rotary embed and dropout %g %g, want %g %g", bc[0].bytes_fwd[0],
        bc[0].bytes_bwd[0], 4 * 3 * nc + drop, 4 * 5 * nc + drop);
  CHECK(bc[1].bytes_fwd[0] == 2 * 4 * 3 * nc + 2 * drop + 4 * 2 * qkv &&
            bc[1].bytes_bwd[0] == 2 * 4 * 4 * nc + 2 * drop + 4 * 2 * qkv,
        "h.0 residuals, dropouts and rotary %g %g, want %g %g",
        bc[1].bytes_fwd[0], bc[1].bytes_bwd[0],
        2 * 4 * 3 * nc + 2 * drop + 4 * 2 * qkv,
        2 * 4 * 4 * nc + 2 * drop + 4 * 2 * qkv);
  st_model_destroy(m);
}

/* The working set of a split batch, the micro-batch replicas run, and
 * average pooling's bytes, by hand on test_split_by_hand's CNN (a conv
 * block; a linear block of 784 x 10 weights): micro-batches of 8 of 32
 * hold two micro-batches' activations and inputs beside weights and
 * gradient (one's forward beside another's backward), the optimizer
 * still runs once a batch; 4 replicas of batch 32 asked for micro-batches
 * of 16 run their share, 8; an average pool reads its input and writes
 * its output, both ways. */
static void test_split_micro(void) {
  st_config cfg;
  st_config_defaults(&cfg);
  const char *sets[] = {
      "model.kind=cnn",  "model.channels=[4]",      "model.dense=[]",
      "model.norm=none", "optimizer.kind=sgd",      "optimizer.momentum=0.9",
      "train.batch=32",  "execution.micro_batch=8", "model.pool=avg"};
  st_model *m =
      model_of(&cfg, sets, sizeof sets / sizeof *sets, (st_shape){1, 28, 28});
  if (!m) return;
  st_block_cost bc[2];
  st_plan_costs(bc, m, &cfg);
  CHECK(bc[1].call_samples == 8 &&
            bc[1].ws_bytes ==
                2 * 4.0 * 7850 + 2 * 8 * (bc[1].act_bytes + 4.0 * 784),
        "block 1 working set %g at micro-batches of 8 (%g samples a call)",
        bc[1].ws_bytes, bc[1].call_samples);
  CHECK(bc[1].bytes_bwd[3] == 4.0 * 7850 * 6 / 32,
        "block 1 optimizer %g: once a batch of 32", bc[1].bytes_bwd[3]);
  CHECK(bc[0].bytes_fwd[2] == 4.0 * (3136 + 784) &&
            bc[0].bytes_bwd[2] == 4.0 * (3136 + 784),
        "block 0 average pool %g %g, want %g", bc[0].bytes_fwd[2],
        bc[0].bytes_bwd[2], 4.0 * (3136 + 784));
  cfg.execution.micro_batch = 16;
  cfg.execution.replicas = 4;
  st_plan_costs(bc, m, &cfg);
  CHECK(bc[1].call_samples == 8,
        "4 replicas of 32 asked for micro-batches of 16: costs at %g samples "
        "a call, want their share, 8",
        bc[1].call_samples);
  st_model_destroy(m);
}

/* conv2d and attention at their kernels' calibrated rates, by hand; with a
 * profile that lacks them (older), at the GEMM rate of their class. */
static void test_kernel_time(void) {
  st_calibration c = sample_profile();
  st_block_cost b;
  memset(&b, 0, sizeof b);
  snprintf(b.name, sizeof b.name, "blocks.0");
  b.conv_fwd[1] = 3e6;    /* 3e6 / 3e10 = 100 us; as a GEMM 3e6 / 4e10 */
  b.conv_bwd[1] = 4e6;    /* 4e6 / 2e10 = 200 us; 4e6 / 4e10 */
  b.attn_fwd[0] = 2e6;    /* 2e6 / 2.5e10 = 80 us; 2e6 / 2e10 */
  b.attn_bwd[2] = 7e6;    /* 7e6 / 7e10 = 100 us; 7e6 / 5e10 */
  b.bytes_fwd[4] = 2.5e5; /* gelu: 2.5e5 / 2.5e9 = 100 us */
  b.flops_fwd = 5e6;
  b.flops_bwd = 11e6;
  for (int older = 0; older < 2; older++) {
    st_fabric f = one_core();
    if (older) {
      memset(c.conv_rate, 0, sizeof c.conv_rate);
      memset(c.attention_rate, 0, sizeof c.attention_rate);
    }
    st_calibration_apply(&c, &f, "test");
    st_plan_options opt = {
        .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
    st_plan *p = NULL;
    st_error err = {0};
    CHECK(st_plan_build(&p, &b, 1, &f, &opt, &err) == 0, "%s", err.msg);
    if (!p) continue;
    double fwd = older ? 3e6 / 4e10 + 2e6 / 2e10 + 1e-4 : 100e-6 + 80e-6 + 1e-4;
    double bwd = older ? 4e6 / 4e10 + 7e6 / 5e10 : 200e-6 + 100e-6;
    CHECK(fabs(p->stages[0].time_fwd - fwd) <= 1e-12 * fwd &&
              fabs(p->stages[0].time_bwd - bwd) <= 1e-12 * bwd,
          "%s: fwd %.9g want %.9g, bwd %.9g want %.9g",
          older ? "older profile" : "kernel rates", p->stages[0].time_fwd, fwd,
          p->stages[0].time_bwd, bwd);
    st_plan_destroy(p);
  }
}

/* A calibrated fabric: t = sum_k G_k / r_k (s + (1 - s)/c) + sum_k B_k / bw_k
 * + comm / copy bandwidth, by hand. */
static void test_time_by_hand(void) {
  st_calibration c = sample_profile();
  st_fabric f;
  memset(&f, 0, sizeof f);
  f.kind = ST_FABRIC_CPU;
  snprintf(f.name, sizeof f.name, "cpu:4");
  f.width = 4;
  f.height = 1;
  f.pes = 4;
  f.pe_memory = 1e12;
  st_calibration_apply(&c, &f, "test");
  f.sharing_slope = 0; /* e(c) alone here; test_sharing has m(n) */
  st_block_cost b[2];
  memset(b, 0, sizeof b);
  snprintf(b[0].name, sizeof b[0].name, "blocks.0");
  snprintf(b[1].name, sizeof b[1].name, "blocks.1");
  b[0].gemm_fwd[0] = 2e6;  /* 2e6 / 2e10 = 100 us on one core */
  b[0].gemm_bwd[3] = 16e6; /* 16e6 / 8e10 = 200 us */
  b[0].bytes_fwd[1] = 1e5; /* 1e5 / 5e9 = 20 us, serial */
  b[0].flops_fwd = 2e6;
  b[0].flops_bwd = 16e6;
  b[0].out_bytes = 2.5e5; /* 10 us at 2.5e10 */
  b[1].in_bytes = 2.5e5;
  b[1].gemm_fwd[2] = 5e6;  /* 100 us */
  b[1].bytes_bwd[3] = 4e5; /* 20 us */
  b[1].flops_fwd = 5e6;
  st_plan_options opt = {
      .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
  st_plan *p = NULL;
  st_error err = {0};
  CHECK(st_plan_build(&p, b, 2, &f, &opt, &err) == 0, "%s", err.msg);
  /* one stage on 4 cores, s = 0.25: (0.25 + 0.75/4) = 0.4375 of one core */
  double g = 0.25 + 0.75 / 4;
  double want_fwd = (100e-6 + 100e-6) * g + 20e-6;
  double want_bwd = 200e-6 * g + 20e-6;
  /* tolerance: a few roundings of sums of doubles */
  double tol = 1e-12;
  if (p) {
    CHECK(fabs(p->stages[0].time_fwd - want_fwd) <= tol * want_fwd &&
              fabs(p->stages[0].time_bwd - want_bwd) <= tol * want_bwd &&
              p->stages[0].time_comm == 0,
          "one stage: fwd %.9g want %.9g, bwd %.9g want %.9g",
          p->stages[0].time_fwd, want_fwd, p->stages[0].time_bwd, want_bwd);
    st_plan_destroy(p);
  }
  /* two stages: every split of 4 cores; the best is by hand
   * stage 0 (300 us work, 20 us serial, 10 us send + 0 back):
   *   c = 3: 300 (0.25 + 0.25) + 20 + 10 = 180 us; c = 2: 300 x 0.625 + 30
   *   = 217.5 us; stage 1 (100 us work, 20 serial, 10 us gradient back):
   *   c = 1: 130 us. Best: 3 + 1 cores, bottleneck 180 us. */
  opt.stages = 2;
  CHECK(st_plan_build(&p, b, 2, &f, &opt, &err) == 0, "%s", err.msg);
  if (p) {
    double want = 300e-6 * 0.5 + 20e-6 + 10e-6;
    CHECK(p->n_stages == 2 && p->stages[0].pes == 3 && p->stages[1].pes == 1 &&
              fabs(p->bottleneck_time - want) <= tol * want &&
              fabs(p->stages[1].time - 130e-6) <= tol * 130e-6,
          "two stages: %lld + %lld cores, bottleneck %.9g want %.9g, "
          "stage 1 %.9g",
          (long long)p->stages[0].pes, (long long)p->stages[1].pes,
          p->bottleneck_time, want, p->stages[1].time);
    st_plan_destroy(p);
  }
}

/* The caller's time between steps, by hand: the batch input at the
 * profile's input bandwidth per sample, plus (modes on stage threads) one
 * step hand-off per batch: the hosted one where the caller runs the first
 * stage (a pipeline and block_sequential in one process), the one where it
 * sleeps for threaded pipelined backprop and for a pipeline placed over
 * ranks (block_sequential: two, its forwards' and its backwards'); the
 * predicted rate adds it to each sample's time at the
 * schedule's utilization. Without a profile: none. */
static void test_host_time(void) {
  char path[128];
  path_in(path, sizeof path, "host.json");
  st_calibration c = sample_profile();
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0, "%s", err.msg);
  st_config cfg;
  st_config_defaults(&cfg);
  const char *sets[] = {"model.kind=mlp", "model.hidden=[256,256]",
                        "train.batch=64", "fabric.cores=2",
                        "execution.micro_batch=8"};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    CHECK(st_config_set(&cfg, sets[i], &err) == 0, "%s", err.msg);
  const double input = 4.0 * 784 / 4e9; /* 784 fp32 per sample */
  /* one thread runs an emulated pipelined backprop: no hand-off */
  const char *modes[] = {"sequential", "pipeline", "pipelined_backprop",
                         "block_sequential", "pipelined_backprop"};
  /* block_sequential hands its one segment over twice a step: the
   * forwards, then the backwards */
  const double handoff[] = {0, 1e-6, 2e-5, 2e-6, 0};
  for (int k = 0; k < 5; k++) {
    char set[64];
    snprintf(set, sizeof set, "execution.mode=%s", modes[k]);
    CHECK(st_config_set(&cfg, set, &err) == 0 &&
              st_config_set(&cfg,
                            k == 4 ? "execution.emulate=true"
                                   : "execution.emulate=false",
                            &err) == 0,
          "%s", err.msg);
    setenv("STRATA_CALIBRATION", path, 1);
    st_plan *p = NULL;
    CHECK(st_plan_compile(&p, &cfg, k ? 2 : 1, &err) == 0, "%s: %s", modes[k],
          err.msg);
    setenv("STRATA_CALIBRATION", "none", 1);
    if (!p) continue;
    double want = input + handoff[k] / 64;
    double tol = 1e-12 * want;
    CHECK(fabs(p->host_time - want) <= tol, "%s: host time %.9g want %.9g",
          modes[k], p->host_time, want);
    int pb = k == 2 || k == 4;
    /* fill and drain of 8 micro-batches over stages of unequal time */
    double sum = 0, t_max = 0;
    for (int s = 0; s < p->n_stages; s++) {
      sum += p->stages[s].time;
      t_max = fmax(t_max, p->stages[s].time);
    }
    double util = pb ? 1.0 : 8.0 * t_max / (7.0 * t_max + sum);
    double rate = 1.0 / (1.0 / (p->throughput * util) + want);
    CHECK(fabs(st_plan_rate(p, pb) - rate) <= 1e-12 * rate &&
              st_plan_rate(p, pb) < p->throughput * util,
          "%s: rate %.9g want %.9g", modes[k], st_plan_rate(p, pb), rate);
    if (k == 1 || k == 3) { /* placed over 2 ranks: no stage hosted */
      cfg.launch.ranks = 2;
      CHECK(st_config_set(&cfg, "execution.placement=ranks", &err) == 0 &&
                st_plan_place_ranks(p, &cfg, &err) == 0,
            "%s over ranks: %s", modes[k], err.msg);
      CHECK(st_config_set(&cfg, "execution.placement=threads", &err) == 0, "%s",
            err.msg);
      cfg.launch.ranks = 0;
      want = input + (k == 3 ? 2 : 1) * 2e-5 / 64;
      CHECK(fabs(p->host_time - want) <= tol,
            "%s over ranks: host time %.9g want %.9g", modes[k], p->host_time,
            want);
    }
    st_plan_destroy(p);
    /* the built-in estimate models no caller time */
    CHECK(st_plan_compile(&p, &cfg, k ? 2 : 1, &err) == 0, "%s", err.msg);
    if (p)
      CHECK(p->host_time == 0 &&
                st_plan_rate(p, pb) ==
                    p->throughput * (pb ? 1.0 : p->util_fill_drain),
            "%s uncalibrated: host time %g", modes[k], p->host_time);
    st_plan_destroy(p);
  }
}

/* Linear layers at one row (pipelined backprop's default micro-batch of
 * one): pass 1 moves their FLOPs out of the GEMM classes and counts the
 * bytes they stream, by hand: forward the weights W once; backward W for
 * the input gradient (none in the first block) and 2 W for the weight
 * gradient, or, where the update is fused, the weights and one momentum
 * slot read and written (4 W). The optimizer's bytes come once a
 * micro-batch, less the fused weights'. A plan on a profile with a row
 * bandwidth takes bytes / bandwidth for them. */
static void test_one_row(void) {
  /* 784 -> 64 -> 10, heavy-ball SGD (one slot) */
  double w0 = 4.0 * 784 * 64, w1 = 4.0 * 64 * 10;
  double p0 = 784 * 64 + 64, p1 = 64 * 10 + 10;
  struct {
    const char *mode, *mitigation, *mb;
    int fused, rows1;
    double updates; /* optimizer steps per sample */
  } cases[] = {
      {"pipelined_backprop", "sc", NULL, 1, 1, 1},
      {"pipelined_backprop", "stash", NULL, 0, 1, 1},
      {"pipelined_backprop", "sc", "execution.micro_batch=4", 0, 0, 0.25},
      {"sequential", "none", NULL, 0, 0, 1.0 / 64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    st_config cfg;
    st_config_defaults(&cfg);
    char mode[64], mit[64];
    snprintf(mode, sizeof mode, "execution.mode=%s", cases[i].mode);
    snprintf(mit, sizeof mit, "execution.mitigation=%s", cases[i].mitigation);
    const char *sets[] = {"model.hidden=[64]",
                          "optimizer.momentum=0.9",
                          "train.batch=64",
                          mode,
                          mit,
                          cases[i].mb ? cases[i].mb : "train.batch=64"};
    st_model *m =
        model_of(&cfg, sets, sizeof sets / sizeof *sets, (st_shape){1, 28, 28});
    if (!m) return;
    st_block_cost bc[2];
    st_plan_costs(bc, m, &cfg);
    int one = cases[i].rows1, fused = cases[i].fused;
    double g0 = 0, g1 = 0, r0 = 0, r1 = 0;
    for (int k = 0; k < ST_GEMM_CLASSES; k++) {
      g0 += bc[0].gemm_fwd[k] + bc[0].gemm_bwd[k];
      g1 += bc[1].gemm_fwd[k] + bc[1].gemm_bwd[k];
      r0 += bc[0].row_gemm_fwd[k] + bc[0].row_gemm_bwd[k];
      r1 += bc[1].row_gemm_fwd[k] + bc[1].row_gemm_bwd[k];
    }
    /* linear 784->64 without an input gradient: 2+2 FLOPs a weight and
     * the bias twice; 64->10 with one: 2+4 and twice */
    double f0 = 4 * 784 * 64 + 2 * 64, f1 = 6 * 64 * 10 + 2 * 10;
    CHECK(one ? g0 == 0 && g1 == 0 && r0 == f0 && r1 == f1
              : r0 == 0 && r1 == 0 && g0 == f0 && g1 == f1,
          "case %zu: GEMM FLOPs %g %g, one-row %g %g", i, g0, g1, r0, r1);
    double want_f0 = one ? w0 : 0, want_f1 = one ? w1 : 0;
    double want_b0 = one ? (fused ? 4 * w0 : 2 * w0) : 0;
    double want_b1 = one ? w1 + (fused ? 4 * w1 : 2 * w1) : 0;
    CHECK(bc[0].row_bytes_fwd == want_f0 && bc[1].row_bytes_fwd == want_f1 &&
              bc[0].row_bytes_bwd == want_b0 && bc[1].row_bytes_bwd == want_b1,
          "case %zu: row bytes %g %g / %g %g, want %g %g / %g %g", i,
          bc[0].row_bytes_fwd, bc[0].row_bytes_bwd, bc[1].row_bytes_fwd,
          bc[1].row_bytes_bwd, want_f0, want_b0, want_f1, want_b1);
    /* the fused layers' share, which the one-row curve prices */
    CHECK(bc[0].row_fused_fwd == (fused ? want_f0 : 0) &&
              bc[0].row_fused_bwd == (fused ? want_b0 : 0) &&
              bc[1].row_fused_fwd == (fused ? want_f1 : 0) &&
              bc[1].row_fused_bwd == (fused ? want_b1 : 0),
          "case %zu: fused row bytes %g %g / %g %g", i, bc[0].row_fused_fwd,
          bc[0].row_fused_bwd, bc[1].row_fused_fwd, bc[1].row_fused_bwd);
    /* read w, g, v; write w, v; clear g: 6 floats, per update */
    double o0 = 4 * (fused ? 0 : p0) * 6 * cases[i].updates;
    double o1 = 4 * (fused ? 0 : p1) * 6 * cases[i].updates;
    CHECK(fabs(bc[0].bytes_bwd[3] - o0) <= 1e-9 * o0 &&
              fabs(bc[1].bytes_bwd[3] - o1) <= 1e-9 * o1,
          "case %zu: optimizer bytes %g %g, want %g %g", i, bc[0].bytes_bwd[3],
          bc[1].bytes_bwd[3], o0, o1);
    if (i == 0) {
      /* the plan: one block, its op bytes cleared, spill off */
      st_calibration c = narrow_profile();
      c.spill_ws[0] = 1e12, c.spill_ws[1] = 2e12, c.spill_ws[2] = 3e12;
      c.row_bandwidth = 5e10;
      st_fabric f = one_core();
      st_calibration_apply(&c, &f, "test");
      st_block_cost b = bc[1];
      memset(b.bytes_fwd, 0, sizeof b.bytes_fwd);
      memset(b.bytes_bwd, 0, sizeof b.bytes_bwd);
      st_plan_options opt = {
          .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
      st_plan *p = NULL;
      st_error err = {0};
      CHECK(st_plan_build(&p, &b, 1, &f, &opt, &err) == 0, "%s", err.msg);
      double want = (w1 + 5 * w1) / 5e10;
      if (p)
        CHECK(fabs(p->stages[0].time - want) <= 1e-12 * want,
              "one-row block: %.9g s, want %.9g", p->stages[0].time, want);
      st_plan_destroy(p);
      /* without the bandwidth (an older profile): at the class's rate */
      c.row_bandwidth = 0;
      f = one_core();
      st_calibration_apply(&c, &f, "test");
      CHECK(st_plan_build(&p, &b, 1, &f, &opt, &err) == 0, "%s", err.msg);
      want = 0;
      for (int k = 0; k < ST_GEMM_CLASSES; k++)
        want += (b.row_gemm_fwd[k] + b.row_gemm_bwd[k]) / c.gemm_rate[k];
      if (p)
        CHECK(fabs(p->stages[0].time - want) <= 1e-12 * want,
              "one-row block, no bandwidth: %.9g s, want %.9g",
              p->stages[0].time, want);
      st_plan_destroy(p);
    }
    st_model_destroy(m);
  }
  /* sequential at batch 1 fuses too (trainer.c), AdamW included: two
   * slots, (2 + 2 x 2) W for the update, no optimizer pass for them */
  st_config cfg;
  st_config_defaults(&cfg);
  const char *sets[] = {"model.hidden=[64]", "optimizer.kind=adamw",
                        "train.batch=1"};
  st_model *m = model_of(&cfg, sets, 3, (st_shape){1, 28, 28});
  if (!m) return;
  st_block_cost bc[2];
  st_plan_costs(bc, m, &cfg);
  CHECK(bc[1].row_bytes_fwd == w1 && bc[1].row_bytes_bwd == w1 + 6 * w1 &&
            bc[0].row_bytes_bwd == 6 * w0 && bc[0].bytes_bwd[3] == 0 &&
            bc[1].bytes_bwd[3] == 0,
        "sequential batch 1, adamw: row bytes %g / %g, optimizer %g %g",
        bc[1].row_bytes_fwd, bc[1].row_bytes_bwd, bc[0].bytes_bwd[3],
        bc[1].bytes_bwd[3]);
  st_model_destroy(m);
}

/* compile's micro-batch for a pipeline with execution.micro_batch 0: the
 * smallest divisor of the batch whose predicted rate is within 5% of the
 * best, each divisor planned here on its own (narrow calls slow small
 * micro-batches down, the bubble large ones). */
static void test_micro_batch_pick(void) {
  char path[128];
  path_in(path, sizeof path, "pick.json");
  st_calibration c = narrow_profile();
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0, "%s", err.msg);
  setenv("STRATA_CALIBRATION", path, 1);
  st_config cfg;
  st_config_defaults(&cfg);
  /* the best at 128, and 64 within 5% of it (1,776 and 1,783 samples/s) */
  const char *sets[] = {"model.kind=mlp",          "model.hidden=[2048,2048]",
                        "train.batch=256",         "fabric.cores=2",
                        "execution.mode=pipeline", "execution.stages=2",
                        "execution.micro_batch=0"};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    CHECK(st_config_set(&cfg, sets[i], &err) == 0, "%s", err.msg);
  double rate[257] = {0}, best = 0;
  int best_mb = 0;
  for (int mb = 1; mb <= 256; mb *= 2) { /* every divisor of 256 */
    st_config one = cfg;
    one.execution.micro_batch = mb;
    st_plan *p = NULL;
    CHECK(st_plan_compile(&p, &one, 0, &err) == 0, "mb %d: %s", mb, err.msg);
    if (!p) continue;
    rate[mb] = st_plan_rate(p, 0);
    if (rate[mb] > best) best = rate[mb], best_mb = mb;
    st_plan_destroy(p);
  }
  int want = best_mb;
  for (int mb = 1; mb <= 256; mb *= 2)
    if (rate[mb] >= 0.95 * best) {
      want = mb;
      break;
    }
  st_plan *p = NULL;
  CHECK(st_plan_choose(&p, &cfg, 0, NULL, NULL, &err) == 0, "%s", err.msg);
  if (p)
    CHECK(p->micro_batch == want && want < best_mb &&
              strstr(p->mode_why, "within 5% of the best"),
          "picked %d (want %d; best %d at %.6g/s): %s", p->micro_batch, want,
          best_mb, best, p->mode_why);
  st_plan_destroy(p);
  setenv("STRATA_CALIBRATION", "none", 1);
  unlink(path);
}

/* Passes merged: each figure the median of its passes (three passes, and
 * four: the mean of the middle two), the spill curve whole from the pass
 * with the median spill cost, e(c) and m(n) refitted to the medians; bad
 * counts and passes over different threads refused. */
static void test_merge(void) {
  st_calibration p[4];
  double scale[4] = {1.0, 0.5, 1.25, 0.75}; /* pass k's rates x scale */
  for (int k = 0; k < 4; k++) {
    p[k] = narrow_profile();
    for (int c = 0; c < ST_GEMM_CLASSES; c++) {
      p[k].gemm_rate[c] *= scale[k];
      p[k].conv_rate[1][c] *= scale[k];
      p[k].attention_rate[0][c] *= scale[k];
    }
    for (int c = 0; c < ST_OP_CLASSES; c++) p[k].op_bandwidth[c] *= scale[k];
    p[k].efficiency[1] = 0.5 + 0.1 * k;   /* 0.5 0.6 0.7 0.8 */
    p[k].efficiency[2] = 0.9 - 0.1 * k;   /* 0.9 0.8 0.7 0.6 */
    p[k].sharing[1] = 1.0 - 0.05 * k;     /* 1 .95 .9 .85 */
    p[k].step_latency = 1e-5 * (4 - k);   /* 4 3 2 1 e-5 */
    p[k].hosted_latency = 1e-6 * (k + 1); /* 1 2 3 4 e-6 */
    p[k].n_rank_one = 2;
    p[k].rank_one_ws[0] = 1e6, p[k].rank_one_ws[1] = 1e7;
    p[k].rank_one_rate[0] = 3e10 + 1e9 * k; /* 30 31 32 33 e9 */
    p[k].rank_one_rate[1] = 2e10 - 1e9 * k; /* 20 19 18 17 e9 */
    p[k].spill_cost = 1e-10 * (k == 0 ? 3 : k == 1 ? 1 : k == 2 ? 2 : 4);
    p[k].spill_fraction[1] = 0.1 * (k + 1); /* marks its pass */
  }
  st_calibration m;
  CHECK(st_calibration_merge(&m, p, 3) == 0, "merge of 3 refused");
  /* three passes: scales 1, 0.5, 1.25 -> median 1 */
  CHECK(m.gemm_rate[3] == narrow_profile().gemm_rate[3] &&
            m.conv_rate[1][0] == narrow_profile().conv_rate[1][0] &&
            m.attention_rate[0][2] == narrow_profile().attention_rate[0][2] &&
            m.op_bandwidth[3] == narrow_profile().op_bandwidth[3],
        "median of 3: gemm %g conv %g attention %g optimizer %g",
        m.gemm_rate[3], m.conv_rate[1][0], m.attention_rate[0][2],
        m.op_bandwidth[3]);
  CHECK(fabs(m.efficiency[1] - 0.6) < 1e-12 &&
            fabs(m.efficiency[2] - 0.8) < 1e-12 &&
            fabs(m.sharing[1] - 0.95) < 1e-12 &&
            fabs(m.step_latency - 3e-5) < 1e-18 &&
            fabs(m.hosted_latency - 2e-6) < 1e-18,
        "median of 3: e %g %g m %g latency %g hosted %g", m.efficiency[1],
        m.efficiency[2], m.sharing[1], m.step_latency, m.hosted_latency);
  CHECK(m.n_rank_one == 2 && m.rank_one_rate[0] == 3.1e10 &&
            m.rank_one_rate[1] == 1.9e10,
        "median of 3: rank-one curve %g %g", m.rank_one_rate[0],
        m.rank_one_rate[1]);
  /* spill costs 3, 1, 2 (x 1e-10): the median is pass 2's, curve and all */
  CHECK(m.spill_cost == 2e-10 && fabs(m.spill_fraction[1] - 0.3) < 1e-12,
        "spill of 3: %g with pass %g's curve", m.spill_cost,
        m.spill_fraction[1] * 10 - 1);
  /* s = sum (t-1)(1/e - 1) / sum (t-1)^2 over t = 2, 4 */
  double s = (1 * (1 / 0.6 - 1) + 3 * (1 / 0.8 - 1)) / (1 + 9);
  double sm = (1 * (1 / 0.95 - 1) + 3 * (1 / 0.5 - 1)) / (1 + 9);
  CHECK(fabs(m.efficiency_slope - s) < 1e-12 &&
            fabs(m.sharing_slope - sm) < 1e-12,
        "slopes %.6f %.6f, by hand %.6f %.6f", m.efficiency_slope,
        m.sharing_slope, s, sm);
  CHECK(st_calibration_merge(&m, p, 4) == 0, "merge of 4 refused");
  /* four: scales 0.5 0.75 1 1.25 -> 0.875; spill 1 2 3 4 -> the lower
   * middle, 2 (pass 2) */
  CHECK(fabs(m.gemm_rate[3] - 0.875 * narrow_profile().gemm_rate[3]) <
                1e-6 * m.gemm_rate[3] &&
            fabs(m.efficiency[1] - 0.65) < 1e-12 && m.spill_cost == 2e-10 &&
            fabs(m.spill_fraction[1] - 0.3) < 1e-12,
        "median of 4: gemm %g e %g spill %g", m.gemm_rate[3], m.efficiency[1],
        m.spill_cost);
  CHECK(st_calibration_merge(&m, p, 1) == 0 &&
            m.gemm_rate[3] == p[0].gemm_rate[3],
        "one pass is itself");
  CHECK(st_calibration_merge(&m, p, 0) == ST_EARG &&
            st_calibration_merge(&m, p, ST_CALIBRATION_MAX_PASSES + 1) ==
                ST_EARG,
        "pass counts 0 and %d not refused", ST_CALIBRATION_MAX_PASSES + 1);
  p[2].n_threads = 2;
  CHECK(st_calibration_merge(&m, p, 3) == ST_EARG,
        "passes over different thread counts not refused");
}

/* The measured memory bandwidth (st_calibration.memory_bandwidth): it
 * round-trips through the file; a value no memory has (0, 1e15 bytes/s,
 * negative, not a number) or the wrong count is refused naming the key and
 * the file; merged passes take its median, or drop it when a pass lacks
 * it; the cpu fabric takes the most of the thread counts, says it is
 * calibrated, and keeps the built-in figure for a profile without it;
 * fabric.memory_bandwidth wins over both. And it reaches the plan: a
 * memory-bound stage (one-row layers streaming 69 MB of weights, gradient
 * and momentum past the 32 MiB cache) takes D / bandwidth a sample, so
 * the profile's 1 GB/s against 2 GB/s halves it exactly, and the same
 * 1 GB/s given as the config key, uncalibrated, plans the same time
 * (the memory term is the one closed form both use; compute is under a
 * fiftieth of it at either rate). */
static void test_memory_bandwidth(void) {
  char path[128];
  path_in(path, sizeof path, "memory.json");
  st_calibration c = sample_profile(), back;
  double bw[3] = {1.2e10, 2e10, 1.8e10}; /* threads 1, 2, 4 */
  memcpy(c.memory_bandwidth, bw, sizeof bw);
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            !memcmp(back.memory_bandwidth, bw, sizeof bw),
        "memory bandwidth round trip: %s (%g %g %g)", err.msg,
        back.memory_bandwidth[0], back.memory_bandwidth[1],
        back.memory_bandwidth[2]);
  /* refused where the figure is no memory's, or miscounted */
  char text[4096], edited[4096];
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = '\0';
  const char *key = "\"memory_bandwidth\": [1.2e+10, 2e+10, 1.8e+10]";
  char *at = strstr(text, key);
  CHECK(at != NULL, "the written profile has %s", key);
  const char *bad_values[][2] = {
      {"[0, 2e+10, 1.8e+10]", "0 bytes/s is no memory's bandwidth"},
      {"[1.2e+10, 1e+15, 1.8e+10]", "1e+15 bytes/s is no memory's"},
      {"[1.2e+10, 2e+10, -5]", "-5 bytes/s is no memory's"},
      {"[1.2e+10, nan, 1.8e+10]", "is no memory's"},
      {"[1.2e+10, 2e+10]", "expected 3 numbers, one for each of"}};
  for (size_t k = 0; at && k < sizeof bad_values / sizeof *bad_values; k++) {
    snprintf(edited, sizeof edited, "%.*s\"memory_bandwidth\": %s%s",
             (int)(at - text), text, bad_values[k][0], at + strlen(key));
    expect_bad("bad_memory.json", edited, bad_values[k][1]);
  }
  /* merged: the median of three, or none when one pass has none */
  st_calibration p[3] = {c, c, c}, m;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 3; i++) p[k].memory_bandwidth[i] *= 1.0 + 0.5 * k;
  CHECK(st_calibration_merge(&m, p, 3) == 0 &&
            m.memory_bandwidth[1] == 1.5 * bw[1],
        "median of 3 memory bandwidths: %g, want %g", m.memory_bandwidth[1],
        1.5 * bw[1]);
  memset(p[1].memory_bandwidth, 0, sizeof p[1].memory_bandwidth);
  CHECK(st_calibration_merge(&m, p, 3) == 0 && m.memory_bandwidth[0] == 0 &&
            m.memory_bandwidth[2] == 0,
        "a pass without it: none merged (%g)", m.memory_bandwidth[0]);

  /* the fabric: calibrated, the most of the counts; else as before */
  st_config cfg;
  st_config_defaults(&cfg);
  st_fabric fab;
  setenv("STRATA_CALIBRATION", path, 1);
  int rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == 0 && fab.memory_bandwidth == 2e10 &&
            !strcmp(fab.memory_bandwidth_source, "calibrated") &&
            strstr(fab.source, "memory bandwidth by a triad"),
        "profile's memory bandwidth: rc %d %g (%s)", rc, fab.memory_bandwidth,
        fab.memory_bandwidth_source);
  CHECK(st_config_set(&cfg, "fabric.memory_bandwidth=3e10", &err) == 0, "%s",
        err.msg);
  rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == 0 && fab.memory_bandwidth == (double)3e10f && /* a float key */
            !strcmp(fab.memory_bandwidth_source, "config") && fab.calibrated,
        "the config key wins: rc %d %g (%s)", rc, fab.memory_bandwidth,
        fab.memory_bandwidth_source);
  CHECK(st_config_set(&cfg, "fabric.memory_bandwidth=0", &err) == 0, "%s",
        err.msg);
  char older[128];
  path_in(older, sizeof older, "good.json"); /* sample_profile: none */
  st_calibration none = sample_profile();
  CHECK(st_calibration_write(&none, older, &err) == 0, "%s", err.msg);
  setenv("STRATA_CALIBRATION", older, 1);
  rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == 0 && fab.calibrated && fab.memory_bandwidth == 100e9 &&
            !strcmp(fab.memory_bandwidth_source, "default"),
        "a profile without it: rc %d %g (%s)", rc, fab.memory_bandwidth,
        fab.memory_bandwidth_source);
  setenv("STRATA_CALIBRATION", "none", 1);
  rc = st_fabric_resolve(&fab, &cfg, &err);
  CHECK(rc == 0 && fab.memory_bandwidth == 100e9 &&
            !strcmp(fab.memory_bandwidth_source, "default"),
        "no profile: %g (%s)", fab.memory_bandwidth,
        fab.memory_bandwidth_source);

  /* the plan: one sequential stage of 784-2048-2048-10 at batch 8 on
   * both cores, bound by memory */
  const char *sets[] = {"model.hidden=[2048, 2048]", "train.batch=8",
                        "fabric.cores=2"};
  for (size_t k = 0; k < sizeof sets / sizeof *sets; k++)
    CHECK(st_config_set(&cfg, sets[k], &err) == 0, "%s", err.msg);
  double t[3] = {0, 0, 0}; /* profile 1 GB/s, profile 2 GB/s, key 1 GB/s */
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 3; i++) c.memory_bandwidth[i] = k == 1 ? 2e9 : 1e9;
    CHECK(st_calibration_write(&c, path, &err) == 0, "%s", err.msg);
    setenv("STRATA_CALIBRATION", k < 2 ? path : "none", 1);
    CHECK(st_config_set(&cfg,
                        k < 2 ? "fabric.memory_bandwidth=0"
                              : "fabric.memory_bandwidth=1e9",
                        &err) == 0,
          "%s", err.msg);
    st_plan *pl = NULL;
    CHECK(st_plan_compile(&pl, &cfg, 0, &err) == 0, "plan %d: %s", k, err.msg);
    if (!pl) continue;
    CHECK(pl->n_stages == 1 &&
              !strcmp(pl->stages[0].bound, "memory bandwidth") &&
              pl->fabric.memory_bandwidth == (k == 1 ? 2e9 : 1e9) &&
              !strcmp(pl->fabric.memory_bandwidth_source,
                      k < 2 ? "calibrated" : "config"),
          "plan %d: %d stage(s), bound '%s', %g bytes/s (%s)", k, pl->n_stages,
          pl->stages[0].bound, pl->fabric.memory_bandwidth,
          pl->fabric.memory_bandwidth_source);
    t[k] = pl->stages[0].time;
    st_plan_destroy(pl);
  }
  setenv("STRATA_CALIBRATION", "none", 1);
  /* 1e-12: the same bytes over two rates; the key's through a float */
  CHECK(t[1] > 0 && fabs(t[0] / t[1] - 2) <= 1e-12 &&
            fabs(t[2] - t[0]) <= 1e-9 * t[0],
        "memory-bound stage: %.9g s a sample at 1 GB/s, %.9g at 2 GB/s "
        "(ratio %.12f, want 2), %.9g by the config key",
        t[0], t[1], t[0] / t[1], t[2]);
}

/* The kernel per product class a profile measured: written and read back
 * (a class it could not measure stays 0), the faster of the two taken
 * (-1 where unmeasured), the medians of passes, and applied by the trainer's
 * st_gemm_choose_profile from STRATA_CALIBRATION; "none" restores the rule
 * built in; a negative rate is refused. */
static void test_gemm_choice(void) {
  char path[128];
  path_in(path, sizeof path, "choice.json");
  st_calibration c = sample_profile(), back;
  double packed[ST_GEMM_CHOICES] = {9e10,   1e11,   1.04e11,
                                    9.8e10, 9.6e10, 4.7e10};
  double blas[ST_GEMM_CHOICES] = {8.3e10, 8.6e10, 7.5e10, 8.2e10, 7e10, 7.2e10};
  memcpy(c.gemm_choice_rate[0], packed, sizeof packed);
  memcpy(c.gemm_choice_rate[1], blas, sizeof blas);
  c.gemm_choice_rate[0][4] = c.gemm_choice_rate[1][4] = 0; /* not measured */
  c.gemm_bf16_rate[0] = 6e10, c.gemm_bf16_rate[1] = 8e10;  /* emulation ahead */
  double bf16_classes[ST_GEMM_CLASSES] = {1e10, 5e10, 1.2e11, 3e11};
  memcpy(c.gemm_bf16_class_rate, bf16_classes, sizeof bf16_classes);
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0,
        "choice round trip: %s", err.msg);
  CHECK(memcmp(back.gemm_choice_rate, c.gemm_choice_rate,
               sizeof c.gemm_choice_rate) == 0 &&
            memcmp(back.gemm_bf16_rate, c.gemm_bf16_rate,
                   sizeof c.gemm_bf16_rate) == 0 &&
            memcmp(back.gemm_bf16_class_rate, c.gemm_bf16_class_rate,
                   sizeof c.gemm_bf16_class_rate) == 0,
        "the kernel rates survive the round trip");
  int want[ST_GEMM_CHOICES] = {0, 0, 0, 0, -1, 1}, got[ST_GEMM_CHOICES];
  st_calibration_gemm_choice(&back, got);
  CHECK(memcmp(got, want, sizeof want) == 0,
        "choices %d %d %d %d %d %d, want 0 0 0 0 -1 1", got[0], got[1], got[2],
        got[3], got[4], got[5]);
  /* the trainer's hook, through the environment */
  const char *old = getenv("STRATA_CALIBRATION");
  char saved[256] = "";
  if (old) snprintf(saved, sizeof saved, "%s", old);
  setenv("STRATA_CALIBRATION", path, 1);
  CHECK(st_gemm_choose_profile() == 1 && st_gemm_chosen(2) == 0 &&
            st_gemm_chosen(5) == 1 && st_gemm_choice_measured(),
        "st_gemm_choose_profile did not apply %s", path);
  /* bf16: the emulation, measured faster, runs while subnormals are
   * flushed where the build has the instruction; fp32's rate is class 1's
   * faster kernel (1e11 packed against 8.6e10) */
#if defined(__AVX512BF16__) /* the build has the instruction */
  int built = 1;
#else
  int built = 0;
#endif
  int flush = st_fp_flush();
  double bf, f32;
  st_fp_set_flush(1);
  /* AMX's tiles, where they run, take no preference (their bits are not
   * the emulation's): they stay, at the instruction's rate; the checks
   * after are VDPBF16PS's, with the tiles off */
  int tiles = st_bf16_tiles();
  if (tiles) {
    int ok = st_bf16_profile_rates(&bf, &f32);
    CHECK(st_bf16_native() && strstr(st_bf16_support(), "AMX") && ok &&
              bf == 6e10,
          "under a profile preferring the emulation, the tiles: %s, rate %g",
          st_bf16_support(), bf);
    st_bf16_set_tiles(0);
  }
  int rates = st_bf16_profile_rates(&bf, &f32);
  CHECK(!st_bf16_native() && rates && bf == 8e10 && f32 == 1e11,
        "profile's bf16: native %d, rates %d: %g and %g (want 0, 1: 8e10 "
        "and 1e11)",
        st_bf16_native(), rates, bf, f32);
  st_fp_set_flush(0);
  rates = st_bf16_profile_rates(&bf, &f32);
  /* the instruction's rate where it runs, else the emulation's */
  CHECK(st_bf16_native() == built && rates && bf == (built ? 6e10 : 8e10),
        "with subnormals kept: native %d (want %d), bf16 rate %g",
        st_bf16_native(), built, bf);
  st_fp_set_flush(flush);
  st_bf16_set_tiles(tiles);
  setenv("STRATA_CALIBRATION", "none", 1);
  CHECK(st_gemm_choose_profile() == 0 && !st_gemm_choice_measured() &&
            st_bf16_native() == built && !st_bf16_profile_rates(&bf, &f32),
        "STRATA_CALIBRATION=none kept a measured kernel table or bf16's");
  if (old)
    setenv("STRATA_CALIBRATION", saved, 1);
  else
    unsetenv("STRATA_CALIBRATION");
  /* passes: each rate its median */
  st_calibration p[3] = {c, c, c};
  p[0].gemm_choice_rate[0][2] = 5e10; /* 5e10, 1.04e11, 2e11 -> 1.04e11 */
  p[2].gemm_choice_rate[0][2] = 2e11;
  p[0].gemm_bf16_rate[1] = 9e10, p[1].gemm_bf16_rate[1] = 7e10; /* 8e10 */
  p[1].gemm_bf16_class_rate[3] = 1e11, p[2].gemm_bf16_class_rate[3] = 4e11;
  st_calibration m;
  CHECK(st_calibration_merge(&m, p, 3) == 0 &&
            m.gemm_choice_rate[0][2] == 1.04e11 &&
            m.gemm_choice_rate[1][5] == 7.2e10 && m.gemm_bf16_rate[1] == 8e10 &&
            m.gemm_bf16_class_rate[3] == 3e11,
        "merged kernel rates %g %g %g %g", m.gemm_choice_rate[0][2],
        m.gemm_choice_rate[1][5], m.gemm_bf16_rate[1],
        m.gemm_bf16_class_rate[3]);
  /* a negative rate is refused, naming the key */
  CHECK(insert_after_key(path, "gemm_choice_blas", "-") == 0 &&
            st_calibration_read(&back, path, &err) != 0 &&
            strstr(err.msg, "gemm_choice_blas"),
        "a negative kernel rate: %s", err.msg);
  /* bf16's rates: exactly two */
  CHECK(st_calibration_write(&c, path, &err) == 0, "%s", err.msg);
  CHECK(insert_after_key(path, "gemm_bf16", "1e9,") == 0 &&
            st_calibration_read(&back, path, &err) != 0 &&
            strstr(err.msg, "\"gemm_bf16\": expected 2 numbers"),
        "three bf16 rates: %s", err.msg);
}

/* A bf16 run's plan (train.precision: bf16) times its products at the
 * profile's bf16 rates by class, each class's conv2d and attention rates
 * scaled as its GEMM's, the rest as fp32's, and shares each class's out
 * over a stage's cores as measured on the profile's (e(c) with the
 * slope fitted to e(4), where it is worse than fp32's): by hand, on 1 and
 * 2 cores, the stage's time is fp32's with each class's GEMM seconds
 * replaced. A profile without bf16 rates (older) leaves fp32's rates and
 * says so (fabric.bf16 -1); an fp32 run ignores them. */
static void test_bf16_rates(void) {
  char path[128], older[128];
  path_in(path, sizeof path, "bf16.json");
  path_in(older, sizeof older, "bf16-older.json");
  st_calibration c = sample_profile();
  st_error err = {0};
  CHECK(st_calibration_write(&c, older, &err) == 0, "%s", err.msg);
  /* bf16 against fp32 by class, and e(4) of bf16's products: classes 0
   * and 1 share out worse than fp32's e(c) (slope 0.25), 2 and 3 better */
  const double ratio[ST_GEMM_CLASSES] = {0.5, 1.5, 2.5, 3};
  const double e4[ST_GEMM_CLASSES] = {0.25, 0.5, 0.8, 0.95};
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    c.gemm_bf16_class_rate[k] = ratio[k] * c.gemm_rate[k];
    c.gemm_bf16_class_rate_all[k] = 4 * e4[k] * c.gemm_bf16_class_rate[k];
  }
  CHECK(st_calibration_write(&c, path, &err) == 0, "%s", err.msg);
  st_calibration back;
  CHECK(st_calibration_read(&back, path, &err) == 0 &&
            memcmp(back.gemm_bf16_class_rate_all, c.gemm_bf16_class_rate_all,
                   sizeof c.gemm_bf16_class_rate_all) == 0,
        "bf16's rates on all cores survive the round trip: %s", err.msg);
  const char *saved = getenv("STRATA_CALIBRATION");
  char keep[256] = "";
  if (saved) snprintf(keep, sizeof keep, "%s", saved);
  /* one stage on 1 core, on 2; two pinned stages of a core each on 2,
   * where the other stage's contention slows both parts alike */
  for (int layout = 0; layout < 3; layout++) {
    int cores = layout ? 2 : 1, stages = layout == 2 ? 2 : 1;
    st_config cfg;
    st_config_defaults(&cfg);
    char cs[32];
    snprintf(cs, sizeof cs, "fabric.cores=%d", cores);
    const char *sets[] = {"model.kind=mlp", "model.hidden=[256,256]",
                          "train.batch=64", cs};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
      CHECK(st_config_set(&cfg, sets[i], &err) == 0, "%s", err.msg);
    if (stages == 2)
      CHECK(st_config_set(&cfg, "execution.mode=pipeline", &err) == 0 &&
                st_config_set(&cfg, "execution.stage_blocks=[1,2]", &err) == 0,
            "%s", err.msg);
    /* fp32, bf16, bf16 on the older profile, fp32 on it */
    st_plan *p[4] = {NULL, NULL, NULL, NULL};
    const char *profile[4] = {path, path, older, older};
    for (int i = 0; i < 4; i++) {
      setenv("STRATA_CALIBRATION", profile[i], 1);
      CHECK(st_config_set(
                &cfg, i % 3 ? "train.precision=bf16" : "train.precision=fp32",
                &err) == 0 &&
                st_plan_compile(&p[i], &cfg, stages, &err) == 0,
            "plan %d: %s", i, err.msg);
    }
    if (p[0] && p[1] && p[2] && p[3]) {
      const st_fabric *f = &p[1]->fabric;
      int rates = f->bf16 == ST_PRODUCTS_BF16 &&
                  p[0]->fabric.bf16 == ST_PRODUCTS_FP32 &&
                  !strcmp(st_fabric_products(f), "bf16");
      for (int k = 0; k < ST_GEMM_CLASSES; k++) {
        double r = ratio[k];
        rates = rates && f->gemm_rate[k] == c.gemm_bf16_class_rate[k] &&
                p[0]->fabric.gemm_rate[k] == c.gemm_rate[k];
        for (int d = 0; d < 2; d++)
          rates = rates &&
                  fabs(f->conv_rate[d][k] - r * c.conv_rate[d][k]) <=
                      1e-15 * r * c.conv_rate[d][k] &&
                  fabs(f->attention_rate[d][k] - r * c.attention_rate[d][k]) <=
                      1e-15 * r * c.attention_rate[d][k];
      }
      CHECK(rates, "bf16's fabric: bf16 %d, large %g (want 1, %g)", f->bf16,
            f->gemm_rate[3], c.gemm_bf16_class_rate[3]);
      /* by hand, stage by stage: fp32's GEMM seconds out, bf16's in, each
       * class on the stage's n cores at e(n) with slope max(s, s_k), s_k
       * through e(4), times the contention F = m(P) / m(n) on P cores */
      double s = c.efficiency_slope, m = c.sharing_slope;
      int same = p[0]->n_stages == stages && p[1]->n_stages == stages;
      for (int st = 0; same && st < stages; st++) {
        const st_plan_stage *s32 = &p[0]->stages[st], *s16 = &p[1]->stages[st];
        double n = (double)s16->pes,
               F = (1 + m * (cores - 1)) / (1 + m * (n - 1));
        double d_fwd = 0, d_bwd = 0, flops = 0;
        for (int b = s16->first; b < s16->first + s16->count; b++)
          for (int k = 0; k < ST_GEMM_CLASSES; k++) {
            double sk = fmin((1 / e4[k] - 1) / 3, 0.99);
            sk = sk > s ? sk : s;
            double d = F * ((sk + (1 - sk) / n) / c.gemm_bf16_class_rate[k] -
                            (s + (1 - s) / n) / c.gemm_rate[k]);
            d_fwd += p[1]->blocks[b].gemm_fwd[k] * d;
            d_bwd += p[1]->blocks[b].gemm_bwd[k] * d;
            flops += p[1]->blocks[b].gemm_fwd[k];
          }
        double fwd = s32->time_fwd + d_fwd, bwd = s32->time_bwd + d_bwd;
        CHECK(flops > 0 && s16->pes == s32->pes &&
                  s16->pes == (stages == 2 ? 1 : cores) &&
                  s16->first == s32->first &&
                  fabs(s16->time_fwd - fwd) <= 1e-12 * fwd &&
                  fabs(s16->time_bwd - bwd) <= 1e-12 * bwd,
              "bf16's stage %d of %d on %lld of %d cores: fwd %.9g want %.9g, "
              "bwd %.9g want %.9g",
              st, stages, (long long)s16->pes, cores, s16->time_fwd, fwd,
              s16->time_bwd, bwd);
      }
      CHECK(same, "stages %d and %d, want %d", p[0]->n_stages, p[1]->n_stages,
            stages);
      CHECK(p[2]->fabric.bf16 == ST_PRODUCTS_BF16_AS_FP32 &&
                p[3]->fabric.bf16 == ST_PRODUCTS_FP32 &&
                !strcmp(st_fabric_products(&p[2]->fabric),
                        "bf16 at fp32's rates") &&
                p[2]->stages[0].time == p[3]->stages[0].time &&
                p[3]->stages[0].time == p[0]->stages[0].time,
            "an older profile: bf16 %d, %.9g against fp32's %.9g",
            p[2]->fabric.bf16, p[2]->stages[0].time, p[3]->stages[0].time);
    }
    for (int i = 0; i < 4; i++) st_plan_destroy(p[i]);
  }
  /* st_fabric_resolve gives the bf16 rates to every fabric made from a
   * config (`strata compile`'s, the runtime cut's: st_cut_fabric), and says
   * how a bf16 run's products are timed where no profile's rates apply */
  struct {
    const char *set, *profile;
    int want;
    const char *words;
  } cases[] = {
      {"fabric.cores=2", path, ST_PRODUCTS_BF16, "bf16"},
      {"fabric.cores=2", older, ST_PRODUCTS_BF16_AS_FP32,
       "bf16 at fp32's rates"},
      {"fabric.cores=2", "none", ST_PRODUCTS_BF16_AS_FP32,
       "bf16 at fp32's rates"},
      {"fabric.pe_flops=1e12", path, ST_PRODUCTS_BF16_PE_FLOPS,
       "bf16 at the fabric's pe_flops"},
      {"fabric.kind=wse2", path, ST_PRODUCTS_BF16_PE_FLOPS,
       "bf16 at the fabric's pe_flops"},
      {"execution.block_costs=measured", path, ST_PRODUCTS_BF16_MEASURED,
       "bf16, blocks measured"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    st_config cfg;
    st_config_defaults(&cfg);
    st_fabric f;
    setenv("STRATA_CALIBRATION", cases[i].profile, 1);
    int ok = st_config_set(&cfg, "train.precision=bf16", &err) == 0 &&
             st_config_set(&cfg, cases[i].set, &err) == 0 &&
             st_fabric_resolve(&f, &cfg, &err) == 0;
    CHECK(ok && f.bf16 == cases[i].want &&
              !strcmp(st_fabric_products(&f), cases[i].words) &&
              (f.bf16 != ST_PRODUCTS_BF16 ||
               f.gemm_rate[3] == c.gemm_bf16_class_rate[3]),
          "%s on %s: %s, products %d (%s), want %d", cases[i].set,
          cases[i].profile, err.msg, f.bf16, st_fabric_products(&f),
          cases[i].want);
    CHECK(st_config_set(&cfg, "train.precision=fp32", &err) == 0 &&
              st_fabric_resolve(&f, &cfg, &err) == 0 &&
              f.bf16 == ST_PRODUCTS_FP32 &&
              !strcmp(st_fabric_products(&f), "fp32"),
          "%s in fp32: products %d", cases[i].set, f.bf16);
  }
  if (saved)
    setenv("STRATA_CALIBRATION", keep, 1);
  else
    unsetenv("STRATA_CALIBRATION");
}

/* The one-row step's curve (st_calibration.row_step_*): written and read
 * back; refused when the bytes do not rise, the rates rise, or the counts
 * differ; st_row_rate interpolates seconds per byte between points and
 * holds the end rates outside them; a plan prices a one-row block at the
 * rate of the bytes its stage touches, on c cores by the curve's own
 * efficiency and not the GEMMs'; merged point by point. */
static st_calibration row_profile(void) {
  st_calibration c = narrow_profile();
  c.row_bandwidth = 4e10;
  c.n_row_step = 3;
  double ws[] = {1e6, 1e7, 1e8}, rate[] = {1e11, 5e10, 2.5e10};
  memcpy(c.row_step_ws, ws, sizeof ws);
  memcpy(c.row_step_rate, rate, sizeof rate);
  c.row_step_efficiency = 0.8;
  return c;
}

static void test_row_curve(void) {
  char path[128];
  path_in(path, sizeof path, "row.json");
  st_calibration c = row_profile(), back;
  st_error err = {0};
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0,
        "round trip: %s", err.msg);
  CHECK(back.n_row_step == 3 && back.row_step_ws[1] == 1e7 &&
            back.row_step_rate[2] == 2.5e10 &&
            back.row_step_efficiency == 0.8 && back.row_bandwidth == 4e10 &&
            back.narrow_rows == 8,
        "the curve survives the round trip: %d points", back.n_row_step);
  /* alone, without the narrow terms */
  st_calibration lone = sample_profile();
  lone.n_row_step = 2;
  lone.row_step_ws[0] = 1e6, lone.row_step_ws[1] = 2e6;
  lone.row_step_rate[0] = lone.row_step_rate[1] = 7e10;
  lone.row_step_efficiency = 1;
  CHECK(st_calibration_write(&lone, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.n_row_step == 2 && back.row_step_rate[1] == 7e10,
        "the curve alone: %s", err.msg);

  /* refused, naming the keys */
  const struct {
    double ws1, rate1;
    int n;
  } bad[] = {{5e5, 5e10, 3}, {1e7, 2e11, 3}, {1e7, 5e10, 1}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    st_calibration b = row_profile();
    b.row_step_ws[1] = bad[i].ws1, b.row_step_rate[1] = bad[i].rate1;
    b.n_row_step = bad[i].n == 1 ? 3 : bad[i].n;
    CHECK(st_calibration_write(&b, path, &err) == 0, "%s", err.msg);
    if (bad[i].n == 1) { /* one rate dropped from the file */
      char text[8192];
      FILE *f = fopen(path, "rb");
      size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
      if (f) fclose(f);
      text[n] = '\0';
      char *r = strstr(text, "\"row_step_rate\": [");
      char *comma = r ? strchr(r, ',') : NULL;
      if (comma)
        memmove(r + strlen("\"row_step_rate\": ["), comma + 2,
                strlen(comma + 2) + 1);
      CHECK(r && comma && write_text(path, text) == 0, "edit %zu", i);
    }
    CHECK(st_calibration_read(&back, path, &err) == ST_EFORMAT &&
              strstr(err.msg, "\"row_step_ws\"") &&
              strstr(err.msg, "\"row_step_rate\""),
          "bad curve %zu: '%s'", i, err.msg);
  }

  /* st_row_rate: 1/rate linear in the bytes between points */
  st_fabric f = one_core();
  c = row_profile();
  st_calibration_apply(&c, &f, "test");
  double mid = 1 / (0.5 / 1e11 + 0.5 / 5e10); /* half way from 1e6 to 1e7 */
  CHECK(st_row_rate(&f, 1e5) == 1e11 && st_row_rate(&f, 1e6) == 1e11 &&
            fabs(st_row_rate(&f, 5.5e6) - mid) <= 1e-9 * mid &&
            st_row_rate(&f, 1e7) == 5e10 && st_row_rate(&f, 1e9) == 2.5e10,
        "row rates %g %g %g %g %g", st_row_rate(&f, 1e5), st_row_rate(&f, 1e6),
        st_row_rate(&f, 5.5e6), st_row_rate(&f, 1e7), st_row_rate(&f, 1e9));
  st_fabric plain = one_core();
  st_calibration old = narrow_profile();
  old.row_bandwidth = 4e10;
  st_calibration_apply(&old, &plain, "test");
  CHECK(st_row_rate(&plain, 5e6) == 0 && plain.row_slope == 0,
        "an older profile has no curve");

  /* a plan: one block of one-row bytes, nothing else; its ws decides */
  st_block_cost b;
  memset(&b, 0, sizeof b);
  snprintf(b.name, sizeof b.name, "rows");
  b.row_bytes_fwd = 1e6, b.row_bytes_bwd = 4e6; /* a fused layer's */
  b.row_fused_fwd = 1e6, b.row_fused_bwd = 4e6;
  b.bytes_bwd[3] = 1e6; /* the optimizer's pass streams at the same rate */
  b.ws_bytes = 5.5e6;
  b.param_bytes = 1e6, b.state_bytes = 2e6, b.call_samples = 1;
  st_plan_options opt = {
      .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
  for (int cores = 1; cores <= 2; cores++) {
    st_fabric g = one_core();
    if (cores == 2) {
      snprintf(g.name, sizeof g.name, "cpu:2");
      g.width = 2, g.pes = 2;
    }
    st_calibration_apply(&c, &g, "test");
    /* e = 0.8 for rows, measured on the profile's 4 threads: the slope
     * (1/0.8 - 1) / 3 = 1/12; the GEMMs' slope set apart, so that the two
     * cannot be confused */
    g.efficiency_slope = 0.9;
    g.sharing_slope = 0;
    st_plan *p = NULL;
    CHECK(st_plan_build(&p, &b, 1, &g, &opt, &err) == 0, "%s", err.msg);
    double s = (1 / 0.8 - 1) / 3;
    double want = 6e6 / mid * (cores == 1 ? 1 : s + (1 - s) / 2);
    if (p)
      CHECK(fabs(p->stages[0].time - want) <= 1e-9 * want,
            "one-row block on %d cores: %.9g s, want %.9g", cores,
            p->stages[0].time, want);
    st_plan_destroy(p);
  }
  /* with the small shape's efficiency (0.5 at the first point, 1e6
   * bytes; 0.8 at the second, 1e7): the slope interpolated on the bytes
   * the stage touches, each end's beyond it; kept by the profile */
  c.row_step_efficiency_small = 0.5;
  CHECK(st_calibration_write(&c, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.row_step_efficiency_small == 0.5,
        "the small shape's efficiency survives the round trip: %g",
        back.row_step_efficiency_small);
  {
    st_fabric g = one_core();
    snprintf(g.name, sizeof g.name, "cpu:2");
    g.width = 2, g.pes = 2;
    st_calibration_apply(&c, &g, "test");
    g.efficiency_slope = 0.9;
    g.sharing_slope = 0;
    double small = (1 / 0.5 - 1) / 3, large = (1 / 0.8 - 1) / 3;
    double half = (small + large) / 2; /* 5.5e6: half way */
    CHECK(st_row_slope(&g, 1e5) == small && st_row_slope(&g, 1e6) == small &&
              fabs(st_row_slope(&g, 5.5e6) - half) <= 1e-15 &&
              st_row_slope(&g, 1e7) == large && st_row_slope(&g, 1e9) == large,
          "row slopes %g %g %g %g %g", st_row_slope(&g, 1e5),
          st_row_slope(&g, 1e6), st_row_slope(&g, 5.5e6), st_row_slope(&g, 1e7),
          st_row_slope(&g, 1e9));
    st_plan *p = NULL;
    CHECK(st_plan_build(&p, &b, 1, &g, &opt, &err) == 0, "%s", err.msg);
    double want = 6e6 / mid * (half + (1 - half) / 2);
    if (p)
      CHECK(fabs(p->stages[0].time - want) <= 1e-9 * want,
            "one-row block on 2 cores, small shape's slope: %.9g s, want %.9g",
            p->stages[0].time, want);
    st_plan_destroy(p);
    /* a profile without it: the larger shape's slope at every size */
    st_calibration older = c;
    older.row_step_efficiency_small = 0;
    CHECK(st_calibration_write(&older, path, &err) == 0 &&
              st_calibration_read(&back, path, &err) == 0 &&
              back.row_step_efficiency_small == 0,
          "older: %s", err.msg);
    st_fabric h = g;
    st_calibration_apply(&back, &h, "test");
    CHECK(st_row_slope(&h, 1e5) == large && st_row_slope(&h, 5.5e6) == large,
          "without the small shape, slope %g", st_row_slope(&h, 1e5));
    CHECK(st_row_slope(&plain, 1e5) == 0, "no curve, no slope");
  }
  c.row_step_efficiency_small = 0;
  /* two such blocks in one stage: the rate of the bytes both touch (1e7:
   * 5e10), not of each block's own */
  st_block_cost two[2] = {b, b};
  two[0].ws_bytes = two[1].ws_bytes = 5e6;
  st_fabric g1 = one_core();
  st_calibration_apply(&c, &g1, "test");
  st_plan *p2 = NULL;
  CHECK(st_plan_build(&p2, two, 2, &g1, &opt, &err) == 0, "%s", err.msg);
  if (p2)
    CHECK(p2->n_stages == 1 &&
              fabs(p2->stages[0].time - 12e6 / 5e10) <= 1e-9 * 12e6 / 5e10,
          "two one-row blocks in %d stage(s): %.9g s, want %.9g", p2->n_stages,
          p2->stages[0].time, 12e6 / 5e10);
  st_plan_destroy(p2);
  /* a layer that writes its rank-one gradient (not fused) goes at the
   * rank-one step's row bandwidth, curve or not */
  st_block_cost u = b;
  u.row_fused_fwd = u.row_fused_bwd = 0;
  CHECK(st_plan_build(&p2, &u, 1, &g1, &opt, &err) == 0, "%s", err.msg);
  double want_u = 5e6 / 4e10 + 1e6 / mid;
  if (p2)
    CHECK(fabs(p2->stages[0].time - want_u) <= 1e-9 * want_u,
          "unfused one-row block: %.9g s, want %.9g", p2->stages[0].time,
          want_u);
  st_plan_destroy(p2);
  /* with the rank-one curve, at its rate for the bytes the stage touches
   * (5.5e6, half way from 1e6 to 1e7: 1/rate interpolated), the
   * optimizer's pass still at the fused curve's; kept by the profile */
  st_calibration r1 = c;
  r1.n_rank_one = 2;
  r1.rank_one_ws[0] = 1e6, r1.rank_one_ws[1] = 1e7;
  r1.rank_one_rate[0] = 3e10, r1.rank_one_rate[1] = 2e10;
  CHECK(st_calibration_write(&r1, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == 0 &&
            back.n_rank_one == 2 && back.rank_one_ws[1] == 1e7 &&
            back.rank_one_rate[0] == 3e10 && back.rank_one_rate[1] == 2e10,
        "the rank-one curve survives the round trip: %s", err.msg);
  st_fabric g2 = one_core();
  st_calibration_apply(&back, &g2, "test");
  double half_r1 = 1 / (0.5 / 3e10 + 0.5 / 2e10);
  CHECK(st_rank_one_rate(&g2, 1e5) == 3e10 &&
            fabs(st_rank_one_rate(&g2, 5.5e6) - half_r1) <= 1e-9 * half_r1 &&
            st_rank_one_rate(&g2, 1e9) == 2e10 &&
            st_rank_one_rate(&g1, 5.5e6) == 0,
        "rank-one rates %g %g %g, none without the curve %g",
        st_rank_one_rate(&g2, 1e5), st_rank_one_rate(&g2, 5.5e6),
        st_rank_one_rate(&g2, 1e9), st_rank_one_rate(&g1, 5.5e6));
  CHECK(st_plan_build(&p2, &u, 1, &g2, &opt, &err) == 0, "%s", err.msg);
  want_u = 5e6 / half_r1 + 1e6 / mid;
  if (p2)
    CHECK(fabs(p2->stages[0].time - want_u) <= 1e-9 * want_u,
          "unfused one-row block, rank-one curve: %.9g s, want %.9g",
          p2->stages[0].time, want_u);
  st_plan_destroy(p2);
  /* a fused layer's bytes stay on the fused curve beside it */
  CHECK(st_plan_build(&p2, &b, 1, &g2, &opt, &err) == 0, "%s", err.msg);
  if (p2)
    CHECK(fabs(p2->stages[0].time - 6e6 / mid) <= 1e-9 * 6e6 / mid,
          "fused one-row block beside the rank-one curve: %.9g s, want %.9g",
          p2->stages[0].time, 6e6 / mid);
  st_plan_destroy(p2);
  /* refused like the fused curve, naming its keys */
  r1.rank_one_rate[1] = 4e10; /* rising */
  CHECK(st_calibration_write(&r1, path, &err) == 0 &&
            st_calibration_read(&back, path, &err) == ST_EFORMAT &&
            strstr(err.msg, "\"rank_one_ws\"") &&
            strstr(err.msg, "\"rank_one_rate\""),
        "a rising rank-one curve: '%s'", err.msg);
  /* without the curve: the single figure, as before, and the optimizer's
   * pass serial at its own bandwidth */
  st_plan *p = NULL;
  CHECK(st_plan_build(&p, &b, 1, &plain, &opt, &err) == 0, "%s", err.msg);
  double old_t = 5e6 / 4e10 + 1e6 / old.op_bandwidth[3];
  if (p)
    CHECK(fabs(p->stages[0].time - old_t) <= 1e-9 * old_t,
          "one-row block, older profile: %.9g s, want %.9g", p->stages[0].time,
          old_t);
  st_plan_destroy(p);

  /* merged point by point (medians), made not to rise again */
  st_calibration pass[3] = {row_profile(), row_profile(), row_profile()};
  pass[0].row_step_rate[1] = 4e10, pass[2].row_step_rate[1] = 9e10;
  pass[1].row_step_rate[2] = 6e10; /* above its pass's own point 1 */
  pass[0].row_step_rate[2] = 4.5e10;
  pass[0].row_step_efficiency = 0.6, pass[2].row_step_efficiency = 0.9;
  for (int k = 0; k < 3; k++) pass[k].row_step_efficiency_small = 0.3 + 0.2 * k;
  pass[1].row_step_efficiency_small = 0.9; /* 0.3, 0.9, 0.7: median 0.7 */
  st_calibration m;
  CHECK(st_calibration_merge(&m, pass, 3) == 0, "merge refused");
  CHECK(m.row_step_efficiency_small == 0.7, "merged small e %g",
        m.row_step_efficiency_small);
  CHECK(m.row_step_rate[0] == 1e11 && m.row_step_rate[1] == 5e10 &&
            m.row_step_rate[2] == 4.5e10 && m.row_step_efficiency == 0.8,
        "merged curve %g %g %g, e %g", m.row_step_rate[0], m.row_step_rate[1],
        m.row_step_rate[2], m.row_step_efficiency);
  /* medians that would rise with the bytes are held to the point before */
  for (int k = 0; k < 3; k++) pass[k].row_step_rate[2] = 6e10;
  CHECK(st_calibration_merge(&m, pass, 3) == 0 && m.row_step_rate[2] == 5e10,
        "a rising median %g, not held to %g", m.row_step_rate[2],
        m.row_step_rate[1]);
}

/* Passes measured with the cores far apart (a round trip past
 * ST_CALIBRATION_FAR times the least of any pass, as it began or as it
 * ended) are set aside; passes without round trips (one thread) are kept;
 * the probe itself measures something on 2 threads and nothing on one. */
static void test_near(void) {
  st_calibration p[5];
  memset(p, 0, sizeof p);
  double rt[5][2] = {{0.8e-6, 0.78e-6}, /* far throughout */
                     {0.23e-6, 0.24e-6},
                     {0.24e-6, 0.77e-6}, /* moved during the pass */
                     {0.30e-6, 0.32e-6}, /* under 1.5 x 0.22: near */
                     {0.22e-6, 0.23e-6}};
  for (int i = 0; i < 5; i++)
    p[i].round_trip[0] = rt[i][0], p[i].round_trip[1] = rt[i][1];
  int keep[5];
  double ref = 0;
  int n = st_calibration_near(p, 5, keep, &ref);
  CHECK(ref == 0.22e-6, "reference %g", ref);
  CHECK(n == 3 && !keep[0] && keep[1] && !keep[2] && keep[3] && keep[4],
        "kept %d: %d %d %d %d %d", n, keep[0], keep[1], keep[2], keep[3],
        keep[4]);
  n = st_calibration_near(p, 1, keep, NULL);
  CHECK(n == 1 && keep[0], "one far pass alone is its own reference");
  n = st_calibration_near(p + 2, 1, keep, NULL);
  CHECK(n == 0 && !keep[0], "a pass that moved part way is never near");
  /* a round trip far below the others is another state too (a
   * calibration here began at 0.100 us among 0.19-0.24; as the least it
   * had set every pass aside), and no reference */
  p[0].round_trip[0] = 0.10e-6, p[0].round_trip[1] = 0.23e-6;
  n = st_calibration_near(p, 5, keep, NULL);
  CHECK(n == 3 && !keep[0] && keep[1] && !keep[2] && keep[3] && keep[4],
        "kept %d beside a low outlier", n);
  /* the state most round trips share is the reference, not the least */
  double mostly_far[4][2] = {{0.22e-6, 0.23e-6},
                             {0.8e-6, 0.78e-6},
                             {0.77e-6, 0.8e-6},
                             {0.79e-6, 0.23e-6}};
  for (int i = 0; i < 4; i++)
    p[i].round_trip[0] = mostly_far[i][0],
    p[i].round_trip[1] = mostly_far[i][1];
  n = st_calibration_near(p, 4, keep, NULL);
  CHECK(n == 2 && !keep[0] && keep[1] && keep[2] && !keep[3],
        "kept %d of passes mostly far", n);
  /* two states as common: the nearer cores' is the reference */
  p[0].round_trip[0] = p[0].round_trip[1] = 0.4e-6;
  p[1].round_trip[0] = p[1].round_trip[1] = 0.2e-6;
  CHECK(st_calibration_near(p, 2, keep, NULL) == 1 && !keep[0] && keep[1],
        "a tie goes to the least round trip");
  /* two passes each far at one end, near alike at the other: none kept */
  p[0].round_trip[0] = 0.23e-6, p[0].round_trip[1] = 0.8e-6;
  p[1].round_trip[0] = 0.8e-6, p[1].round_trip[1] = 0.24e-6;
  CHECK(st_calibration_near(p, 2, keep, NULL) == 0 && !keep[0] && !keep[1],
        "passes far at one end are not near");
  memset(p, 0, sizeof p);
  CHECK(st_calibration_near(p, 3, keep, NULL) == 3 && keep[0] && keep[2],
        "passes on one thread (no round trips) kept");
  double one = st_calibration_round_trip(1), two = st_calibration_round_trip(2);
  CHECK(one == 0 && two > 0 && isfinite(two), "round trips %g and %g", one,
        two);
  /* the hand-off comes back with every stage's count: one waiter per
   * stage (two sleepers on one lost a wake-up and hung) */
  for (int stages = 1; stages <= 3; stages++)
    for (int hosted = 0; hosted < 2; hosted++) {
      double h = st_calibration_handoff(stages, hosted);
      CHECK(h > 0 && isfinite(h), "hand-off to %d stages (hosted %d): %g s",
            stages, hosted, h);
    }
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/strata-test-calibrate-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  setenv("STRATA_CALIBRATION", "none", 1);
  test_round_trip();
  test_sharing();
  test_bad_profiles();
  test_split_by_hand();
  test_time_by_hand();
  test_split_linear_relu();
  test_split_gpt();
  test_split_micro();
  test_kernel_time();
  test_memory_terms();
  test_narrow_compute();
  test_narrow_reproduces();
  test_host_time();
  test_one_row();
  test_micro_batch_pick();
  test_merge();
  test_gemm_choice();
  test_bf16_rates();
  test_memory_bandwidth();
  test_row_curve();
  test_near();
  /* leave nothing behind */
  const char *files[] = {"cal.json",       "good.json",   "foreign.json",
                         "empty.json",     "v2.json",     "truncated.json",
                         "negative.json",  "shared.json", "host.json",
                         "bad_spill.json", "row.json",    "memory.json",
                         "bad_memory.json"};
  char path[128];
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    path_in(path, sizeof path, files[i]);
    unlink(path);
  }
  rmdir(dir);
  TH_DONE();
}
