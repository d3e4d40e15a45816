/*
 * test_replicas.c — the data-parallel mode's contract (src/exec/replicas.c):
 *  - R in {2, 4} replicas of the sequential mode and of 2-stage pipelines
 *    (gpipe, 1f1b) end 20 steps within fp32 rounding of the sequential mode
 *    (R = 1) for an MLP, a CNN and a GPT (tied head), also with
 *    micro-batches; twice the same config gives the same bits (SGD and
 *    AdamW), and so do the inner modes among themselves at the same split,
 *    and so does any number of threads a replica;
 *  - a non-finite loss stops the step before any weight changes, and no
 *    replica keeps a partial gradient afterwards;
 *  - the steady state allocates nothing;
 *  - configurations replicas cannot run are refused, naming the key, and
 *    an inner executor's failure unwinds the replicas made before it;
 *  - the stats and the trace have one track per replica and stage.
 */
#include "harness.h"
#include "models.h"
#include "strata.h"
#include "../../src/exec/exec.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The three models of models.h, each with SGD + momentum: the
 * equivalence bound below is stated for it (AdamW divides by sqrt(v) and
 * so turns rounding in near-zero gradients into O(lr) steps). */
static void sgd(st_config *c, const char *lr) {
  const char *sets[] = {"optimizer.kind=sgd", lr, "optimizer.momentum=0.9",
                        "optimizer.weight_decay=0"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

static void adamw(st_config *c) {
  const char *sets[] = {"optimizer.kind=adamw", "optimizer.lr=0.003",
                        "optimizer.weight_decay=0.01"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

/* Inner modes: sequential, and 2-stage pipelines under both schedules. */
static const char *const mode_names[] = {"sequential", "pipeline gpipe",
                                         "pipeline 1f1b"};
enum { MODES = 3 };

static void set_mode(st_config *c, int mode) {
  snprintf(c->execution.mode, sizeof c->execution.mode, "%s",
           mode == 0 ? "sequential" : "pipeline");
  snprintf(c->execution.schedule, sizeof c->execution.schedule, "%s",
           mode == 1 ? "gpipe" : "1f1b");
  c->execution.stages = mode == 0 ? 0 : 2;
}

/* ||a - b|| / ||b||, in double. */
static double rel_dist(const float *a, const float *b, size_t n) {
  double d = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    double e = (double)a[i] - (double)b[i];
    d += e * e;
    s += (double)b[i] * b[i];
  }
  return sqrt(d) / sqrt(s);
}

/* R replicas of each inner mode against the sequential mode at the same
 * batch and micro-batch (0: the whole share). With SGD + momentum the
 * weights stay within 1e-5 of the weight norm: the replicas only reorder
 * the sum over samples of each gradient (fp32 rounding, ~1e-7 relative per
 * step), which 20 steps of momentum carry forward without amplifying by
 * more than a small factor; a wrong share, scale or missing replica gives
 * differences of order 1e-2 and above. Each case runs twice and must give
 * the same bits; the inner modes at the same R must agree bit for bit too
 * (a pipeline equals the sequential mode at the same split). With adamw
 * set, only the bitwise checks are made. */
static void test_equivalence(const char *what, const st_config *base,
                             const int *Rs, int nR, int micro_batch,
                             int with_adamw) {
  st_config ref = *base;
  ref.train.batch = BATCH;
  ref.execution.micro_batch = micro_batch;
  if (with_adamw) adamw(&ref);
  size_t n = 0, na = 0, nb = 0;
  float *want = with_adamw ? NULL : train(&ref, &n, NULL);
  if (!with_adamw && !want) return;
  for (int ri = 0; ri < nR; ri++) {
    float *first = NULL; /* the sequential inner mode's weights */
    for (int mode = 0; mode < MODES; mode++) {
      st_config c = ref;
      c.execution.replicas = Rs[ri];
      set_mode(&c, mode);
      float *a = train(&c, &na, NULL), *b = train(&c, &nb, NULL);
      if (!a || !b) {
        free(a);
        free(b);
        continue;
      }
      CHECK(na == nb && memcmp(a, b, na * sizeof *a) == 0,
            "%s%s: R=%d %s mb=%d: two runs differ", what,
            with_adamw ? " adamw" : "", Rs[ri], mode_names[mode], micro_batch);
      if (want) {
        double d = rel_dist(a, want, n);
        CHECK(na == n && d <= 1e-5,
              "%s: R=%d %s mb=%d: |w_R - w_1| / |w_1| = %.3g > 1e-5", what,
              Rs[ri], mode_names[mode], micro_batch, d);
        if (getenv("STRATA_TEST_VERBOSE"))
          fprintf(stderr, "  %s R=%d %-15s mb=%d: rel dist %.3g\n", what,
                  Rs[ri], mode_names[mode], micro_batch, d);
      }
      if (!first) {
        first = a;
      } else {
        CHECK(memcmp(a, first, na * sizeof *a) == 0,
              "%s%s: R=%d mb=%d: %s differs from the sequential inner mode",
              what, with_adamw ? " adamw" : "", Rs[ri], micro_batch,
              mode_names[mode]);
        free(a);
      }
      free(b);
    }
    free(first);
  }
  free(want);
}

/* The contract holds whatever the cores: R replicas on 1, 2, 3 and 5
 * threads each (train.threads R, 2R, 3R, 5R; the inner pools and a
 * pipeline's stage pools sized by them) end with the same bits. */
static void test_threads(const char *what, const st_config *base, int mode,
                         int R, int micro_batch) {
  st_config c = *base;
  c.train.batch = BATCH;
  c.execution.micro_batch = micro_batch;
  c.execution.replicas = R;
  set_mode(&c, mode);
  const int per[] = {1, 2, 3, 5};
  float *first = NULL;
  size_t n0 = 0;
  for (int i = 0; i < 4; i++) {
    c.train.threads = R * per[i];
    size_t n = 0;
    float *w = train(&c, &n, NULL);
    if (!w) continue;
    if (!first) {
      first = w, n0 = n;
      continue;
    }
    CHECK(n == n0 && memcmp(w, first, n * sizeof *w) == 0,
          "%s: R=%d %s mb=%d: %d threads a replica give other weights than %d",
          what, R, mode_names[mode], micro_batch, per[i], per[0]);
    free(w);
  }
  free(first);
}

/* A step whose loss is not finite changes no weight, and leaves no
 * replica's slab holding the gradients of the micro-batches before it
 * (two micro-batches per replica: the first one's backward has run when the
 * second one's loss stops the step). The trainer is then reloaded from its
 * step-0 checkpoint: its next step must give exactly the weights its first
 * step gave, which it cannot if any slab kept a gradient. */
static void test_nan(const char *what, const st_config *base, int mode) {
  st_config c = *base;
  c.train.batch = BATCH;
  c.execution.micro_batch = 4;
  c.execution.replicas = 2;
  set_mode(&c, mode);
  /* weights of ~1e36 after the first update: the second step's logits
   * overflow to inf (1e30 left them finite on an AVX2 machine) */
  c.optimizer.lr = 1e38f;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  char dir[] = "/tmp/strata-replicas-XXXXXX", path[64];
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  snprintf(path, sizeof path, "%s/step0.safetensors", dir);
  CHECK(st_trainer_save(t, path, &err) == 0, "save: %s", err.msg);
  size_t n = st_trainer_model(t)->n_params, bytes = n * sizeof(float);
  float *before = malloc(bytes), *first = malloc(bytes);
  double loss;
  int rc = 0, i;
  for (i = 0; i < 10 && !rc; i++) {
    memcpy(before, st_trainer_params(t), bytes);
    rc = st_trainer_step(t, &loss, &err);
    if (i == 0) memcpy(first, st_trainer_params(t), bytes);
  }
  CHECK(i > 1 && rc == ST_ENONFINITE &&
            strstr(err.msg, "stopped before updating"),
        "%s %s: huge lr: rc %d after %d steps: %s", what, mode_names[mode], rc,
        i, err.msg);
  CHECK(memcmp(before, st_trainer_params(t), bytes) == 0,
        "%s %s: a non-finite step changed weights", what, mode_names[mode]);
  /* the replicas are usable again: the next step runs (and fails) cleanly */
  rc = st_trainer_step(t, &loss, &err);
  CHECK(rc == ST_ENONFINITE && memcmp(before, st_trainer_params(t), bytes) == 0,
        "%s %s: step after an aborted one: rc %d: %s", what, mode_names[mode],
        rc, err.msg);
  rc = st_trainer_load(t, path, 0, &err);
  CHECK(rc == 0, "load: %s", err.msg);
  rc = st_trainer_step(t, &loss, &err);
  CHECK(rc == 0 && memcmp(first, st_trainer_params(t), bytes) == 0,
        "%s %s: after aborted steps, step 1 again gives other weights "
        "(a replica kept gradients?): rc %d %s",
        what, mode_names[mode], rc, rc ? err.msg : "");
  unlink(path);
  rmdir(dir);
  free(before);
  free(first);
  st_trainer_destroy(t);
}

/* Steps 3 .. 10 allocate nothing (with a trace being recorded, too). */
static void test_no_alloc(const st_config *base, int mode, int R) {
  st_config c = *base;
  c.train.batch = BATCH;
  c.execution.micro_batch = 2;
  c.execution.replicas = R;
  set_mode(&c, mode);
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  CHECK(st_trainer_trace(t, 256, &err) == 0, "trace: %s", err.msg);
  double loss;
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++) rc = st_trainer_step(t, &loss, &err);
  uint64_t count = st_alloc_count();
  for (int i = 3; i <= 10 && !rc; i++) rc = st_trainer_step(t, &loss, &err);
  CHECK(rc == 0, "R=%d %s: %s", R, mode_names[mode], err.msg);
  CHECK(st_alloc_count() == count, "R=%d %s: steps 3..10 allocated %llu times",
        R, mode_names[mode], (unsigned long long)(st_alloc_count() - count));
  st_trainer_destroy(t);
}

static void expect_refusal(const st_config *c, const char *what,
                           const char *needle) {
  st_error err = {0};
  CHECK(st_config_validate(c, &err) == ST_ECONFIG &&
            strstr(err.msg, "execution.replicas") && strstr(err.msg, needle),
        "%s: %s", what, err.msg);
  st_trainer *t = NULL;
  err = (st_error){0};
  CHECK(st_trainer_create(&t, c, NULL, &err) == ST_ECONFIG && !t &&
            strstr(err.msg, "execution.replicas"),
        "%s: trainer: %s", what, err.msg);
  st_trainer_destroy(t);
}

static void test_refusals(const st_config *base) {
  st_config c = *base;
  c.train.batch = BATCH;
  c.execution.replicas = 2;
  snprintf(c.execution.mode, sizeof c.execution.mode, "block_sequential");
  expect_refusal(&c, "replicas of block_sequential", "block_sequential");
  c = *base;
  c.train.batch = BATCH;
  c.execution.replicas = 3;
  expect_refusal(&c, "batch 16 over 3 replicas", "does not split");
  c.execution.replicas = 4;
  c.execution.micro_batch = 8;
  expect_refusal(&c, "4 replicas of micro-batches of 8 in 16",
                 "does not split");
  c = *base;
  c.train.batch = BATCH;
  c.execution.replicas = 2;
  c.metrics.noise_scale = 1;
  expect_refusal(&c, "replicas with the noise scale", "metrics.noise_scale");
  /* an inner executor that cannot be made: its own error comes back and
   * what was made is freed (the sanitizer build checks for leaks) */
  c = *base;
  c.train.batch = BATCH;
  c.execution.replicas = 2;
  set_mode(&c, 2);
  c.execution.stages = 9; /* the MLP has 4 blocks */
  st_error err = {0};
  st_trainer *t = NULL;
  CHECK(st_trainer_create(&t, &c, NULL, &err) == ST_ECONFIG && !t &&
            strstr(err.msg, "execution.stages") && strstr(err.msg, "4 blocks"),
        "replicas of an impossible pipeline: %s", err.msg);
  st_trainer_destroy(t);
}

/* R x S tracks, named "replica r " + the inner mode's own track name, in
 * replica order; the stage count is the inner mode's. Evaluation (replica
 * 0's forward) gives exactly the sequential mode's numbers, and a trace
 * names its tracks the same way and records the all-reduce. */
static void test_stats(const st_config *base, int mode, int R) {
  st_config one = *base;
  one.train.batch = BATCH;
  set_mode(&one, mode);
  st_config c = one;
  c.execution.replicas = R;
  st_error err = {0};
  st_trainer *t1 = make(&one, &err), *t = make(&c, &err);
  CHECK(t1 && t, "%s", err.msg);
  if (!t1 || !t) {
    st_trainer_destroy(t1);
    st_trainer_destroy(t);
    return;
  }
  double l1, a1, lR, aR;
  st_trainer_evaluate(t1, &l1, &a1, &err);
  st_trainer_evaluate(t, &lR, &aR, &err);
  CHECK(l1 == lR && a1 == aR,
        "R=%d %s: evaluation differs from one replica: %g %g vs %g %g", R,
        mode_names[mode], lR, aR, l1, a1);
  char dir[] = "/tmp/strata-replicas-XXXXXX", path[64];
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  snprintf(path, sizeof path, "%s/trace.json", dir);
  CHECK(st_trainer_trace(t, 64, &err) == 0, "trace: %s", err.msg);
  double loss;
  for (int i = 0; i < 3; i++)
    CHECK(st_trainer_step(t, &loss, &err) == 0, "step: %s", err.msg);
  int S = st_trainer_stages(t1);
  CHECK(st_trainer_stages(t) == S, "R=%d %s: %d stages, want %d", R,
        mode_names[mode], st_trainer_stages(t), S);
  st_track_stats inner[8], got[32];
  double wall1, wall;
  int n1 = st_trainer_stats(t1, inner, 8, &wall1);
  int n = st_trainer_stats(t, got, 32, &wall);
  CHECK(n1 == S && n == R * S, "R=%d %s: %d tracks, want %d x %d", R,
        mode_names[mode], n, R, S);
  for (int i = 0; i < n && i < 32 && n1 == S; i++) {
    char want[64];
    snprintf(want, sizeof want, "replica %d %s", i / S, inner[i % S].name);
    CHECK(strcmp(got[i].name, want) == 0, "track %d: '%s', want '%s'", i,
          got[i].name, want);
    CHECK(got[i].busy_s >= 0 && got[i].busy_s <= wall,
          "track %d: busy %g s of a %g s wall", i, got[i].busy_s, wall);
  }
  CHECK(wall > 0, "R=%d %s: no time inside steps", R, mode_names[mode]);
  /* a too-small cap fills only cap entries and still counts them all */
  CHECK(st_trainer_stats(t, got, 1, &wall) == R * S, "stats with cap 1");
  CHECK(st_trainer_write_trace(t, path, &err) == 0, "trace: %s", err.msg);
  FILE *f = fopen(path, "r");
  static char text[1 << 20];
  size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[len] = 0;
  if (f) fclose(f);
  char last[64];
  snprintf(last, sizeof last, "replica %d %s", R - 1, inner[S - 1].name);
  CHECK(strstr(text, "all-reduce") && strstr(text, last),
        "R=%d %s: the trace lacks the all-reduce or '%s'", R, mode_names[mode],
        last);
  unlink(path);
  rmdir(dir);
  st_trainer_destroy(t1);
  st_trainer_destroy(t);
}

int main(void) {
  st_blas_init();
  st_config mlp, cnn, gpt;
  mlp_config(&mlp);
  cnn_config(&cnn);
  sgd(&cnn, "optimizer.lr=0.02");
  gpt_config(&gpt);
  sgd(&gpt, "optimizer.lr=0.05");
  const int both[] = {2, 4}, two[] = {2};
  test_equivalence("mlp", &mlp, both, 2, 0, 0);
  test_equivalence("cnn", &cnn, both, 2, 0, 0);
  test_equivalence("gpt", &gpt, both, 2, 0, 0);
  test_equivalence("mlp", &mlp, both, 2, 0, 1);
  test_equivalence("cnn", &cnn, two, 1, 0, 1);
  test_equivalence("gpt", &gpt, two, 1, 0, 1);
  /* micro-batches inside each replica: 2 of 4 samples per replica */
  test_equivalence("mlp", &mlp, two, 1, 4, 0);
  test_equivalence("gpt", &gpt, two, 1, 4, 0);
  test_equivalence("cnn", &cnn, two, 1, 4, 1);
  /* the same bits on any number of threads a replica */
  test_threads("mlp", &mlp, 0, 2, 0);
  test_threads("cnn", &cnn, 0, 2, 4);
  test_threads("gpt", &gpt, 0, 4, 0);
  test_threads("mlp", &mlp, 2, 2, 2);
  test_threads("gpt", &gpt, 1, 2, 4);
  test_nan("mlp", &mlp, 0);
  test_nan("mlp", &mlp, 2);
  test_nan("gpt", &gpt, 0); /* the tied head's copy in every slab */
  test_no_alloc(&mlp, 0, 2);
  test_no_alloc(&gpt, 2, 2);
  test_refusals(&mlp);
  test_stats(&mlp, 0, 2);
  test_stats(&mlp, 2, 2);
  test_stats(&gpt, 1, 4);
  TH_DONE();
}
