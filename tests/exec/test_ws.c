/*
 * test_ws.c — weight streaming's contract (src/exec/ws.c, DESIGN.md:
 * bit-identical to sequential):
 *  - after 20 steps the weights equal the sequential mode's bit for bit for
 *    the MLP (SGD, Nesterov, dropout), the CNN (AdamW, group norm,
 *    residual blocks) and the GPT (AdamW, tied head), with activations kept
 *    and recomputed, prefetch 0, 1 and 2, the batch whole and in
 *    micro-batches of 4, and the MLP at batch 1 (where sequential folds
 *    the update into the backward), and so do the losses the steps report;
 *  - evaluation gives the sequential mode's loss and accuracy;
 *  - the compute side never holds more than prefetch + 1 blocks of weights
 *    (the runtime's count), and the bytes streamed are exactly the blocks
 *    walked: per micro-batch every block's weights twice and its gradient
 *    out once, its partial gradient back in for every micro-batch but the
 *    first;
 *  - the gradient noise scale is the sequential mode's, from either store;
 *  - a non-finite loss stops the step with the weights untouched;
 *  - the steady state allocates nothing;
 *  - compute_memory_limit below what one block needs is refused at start,
 *    naming the key and the block.
 */
#include "harness.h"
#include "models.h"
#include "strata.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void streaming(st_config *c, int prefetch, int keep) {
  snprintf(c->execution.mode, sizeof c->execution.mode, "weight_streaming");
  c->execution.prefetch = prefetch;
  c->execution.keep_activations = keep;
}

static char dir[] = "/tmp/strata_test_ws_XXXXXX";

/* execution.store: file, in a new file of the test's directory. */
static void file_store(st_config *c) {
  static int serial;
  snprintf(c->execution.store, sizeof c->execution.store, "file");
  snprintf(c->execution.store_path, sizeof c->execution.store_path,
           "%s/%d.strata", dir, serial++);
}

static void test_equal(const char *what, const st_config *base) {
  size_t n = 0, n2 = 0;
  float *want = train(base, &n, NULL);
  if (!want) return;
  double want_loss[STEPS];
  memcpy(want_loss, train_losses, sizeof want_loss);
  for (int file = 0; file <= 1; file++)
    for (int keep = 0; keep <= 1; keep++)
      for (int prefetch = 0; prefetch <= 2; prefetch++) {
        st_config c = *base;
        streaming(&c, prefetch, keep);
        if (file) file_store(&c);
        st_trainer *t = NULL;
        float *got = train(&c, &n2, &t);
        CHECK(got && n2 == n && memcmp(got, want, n * sizeof *got) == 0,
              "%s, %s store, keep_activations %d, prefetch %d: weights after "
              "%d steps equal sequential's",
              what, c.execution.store, keep, prefetch, STEPS);
        CHECK(got && memcmp(train_losses, want_loss, sizeof want_loss) == 0,
              "%s, %s store, keep_activations %d, prefetch %d: the steps' "
              "losses equal sequential's",
              what, c.execution.store, keep, prefetch);
        st_stream_stats s;
        if (t && st_trainer_stream_stats(t, &s) == 0) {
          /* one step's walk, per micro-batch: in, every block twice; out,
           * every gradient; back in, the partial gradients after the first */
          int64_t P = (int64_t)(n * sizeof(float));
          int M = c.train.batch / (c.execution.micro_batch > 0
                                       ? c.execution.micro_batch
                                       : c.train.batch);
          CHECK(s.steps == STEPS && s.bytes_in == STEPS * (2 * M + M - 1) * P &&
                    s.bytes_out == STEPS * M * P,
                "%s: streamed %lld in, %lld out over %lld steps (P %lld, M %d)",
                what, (long long)s.bytes_in, (long long)s.bytes_out,
                (long long)s.steps, (long long)P, M);
          CHECK(s.max_blocks_held >= 1 && s.max_blocks_held <= prefetch + 1,
                "%s, prefetch %d: at most %d blocks held, counted %d", what,
                prefetch, prefetch + 1, s.max_blocks_held);
        } else {
          CHECK(0, "%s: stream stats", what);
        }
        st_trainer_destroy(t);
        free(got);
      }
  free(want);
}

static void test_eval(void) {
  st_config c;
  mlp_config(&c);
  size_t n;
  st_trainer *a = NULL, *b = NULL;
  float *wa = train(&c, &n, &a);
  streaming(&c, 1, 0);
  float *wb = train(&c, &n, &b);
  double la = 0, aa = 0, lb = 1, ab = 1;
  st_error err = {0};
  if (a && b) {
    st_trainer_evaluate(a, &la, &aa, &err);
    st_trainer_evaluate(b, &lb, &ab, &err);
  }
  CHECK(la == lb && aa == ab,
        "evaluation: loss %.9g / %.9g, accuracy %.9g / %.9g", la, lb, aa, ab);
  st_trainer_destroy(a);
  st_trainer_destroy(b);
  free(wa);
  free(wb);
}

/* file: the file store, whose update sums the squared gradients chunk by
 * chunk (in index order on one thread, as the sequential mode's ranges) */
static void test_noise(int file) {
  st_config c;
  mlp_config(&c);
  c.metrics.noise_scale = 1;
  st_trainer *a = NULL, *b = NULL;
  size_t n;
  float *wa = train(&c, &n, &a);
  streaming(&c, 1, 1);
  if (file) file_store(&c);
  float *wb = train(&c, &n, &b);
  double va = a ? st_noise_scale_value(st_trainer_noise(a), NULL, NULL) : 0;
  double vb = b ? st_noise_scale_value(st_trainer_noise(b), NULL, NULL) : 1;
  CHECK(va == vb && isfinite(va), "%s store: noise scale %.9g, sequential %.9g",
        c.execution.store, vb, va);
  CHECK(wa && wb && memcmp(wa, wb, n * sizeof *wa) == 0,
        "%s store: with the noise scale on, weights equal sequential's",
        c.execution.store);
  st_trainer_destroy(a);
  st_trainer_destroy(b);
  free(wa);
  free(wb);
}

static void test_nan_alloc(void) {
  st_config c;
  mlp_config(&c);
  streaming(&c, 1, 1);
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  double loss;
  uint64_t before = 0;
  for (int i = 0; i < 8; i++) {
    if (i == 4) before = st_alloc_count();
    st_trainer_step(t, &loss, &err);
  }
  CHECK(st_alloc_count() == before, "%llu allocations in 4 steps",
        (unsigned long long)(st_alloc_count() - before));
  /* poison the input of the next batch's loss: a weight of the last layer */
  const st_model *m = st_trainer_model(t);
  size_t n = m->n_params;
  float *w = st_trainer_params(t);
  w[n - 1] = NAN; /* the last bias */
  float *copy = malloc(n * sizeof *copy);
  memcpy(copy, w, n * sizeof *copy);
  int rc = st_trainer_step(t, &loss, &err);
  CHECK(rc == ST_ENONFINITE && strstr(err.msg, "loss"),
        "NaN loss stops the step: rc %d '%s'", rc, err.msg);
  CHECK(memcmp(copy, w, n * sizeof *copy) == 0,
        "no weight changed in the stopped step");
  free(copy);
  st_trainer_destroy(t);
}

static void test_limit(void) {
  st_config c;
  mlp_config(&c);
  streaming(&c, 1, 1);
  c.execution.compute_memory_limit = 4096;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(!t && strstr(err.msg, "execution.compute_memory_limit") &&
            strstr(err.msg, "block"),
        "a limit below one block is refused: '%s'", err.msg);
  st_trainer_destroy(t);
  /* prefetch past the walk's 2 n uses fills no more slots than 2 n: the
   * message counts those it sized (it said prefetch + 1, 51 here) */
  c.execution.prefetch = 50;
  int n = 2 * 4; /* the MLP's 4 blocks, each used twice */
  char want[64];
  snprintf(want, sizeof want, ": %d slots of its", n);
  err = (st_error){0};
  t = make(&c, &err);
  CHECK(!t && strstr(err.msg, want),
        "a limit with prefetch 50 names the %d slots it counted: '%s'", n,
        err.msg);
  st_trainer_destroy(t);
  c.execution.prefetch = 1;
  c.execution.compute_memory_limit = (int64_t)1 << 30;
  t = make(&c, &err);
  CHECK(t != NULL, "a limit that fits is accepted: '%s'", err.msg);
  st_trainer_destroy(t);
}

int main(void) {
  st_blas_init();
  if (!mkdtemp(dir)) {
    perror(dir);
    return 1;
  }
  st_config c;
  mlp_config(&c);
  test_equal("mlp", &c);
  c.execution.micro_batch = 4;
  test_equal("mlp, micro-batches of 4", &c);
  mlp_config(&c);
  c.train.batch = 1;
  test_equal("mlp, batch 1", &c);
  cnn_config(&c);
  test_equal("cnn", &c);
  cnn_config(&c);
  c.execution.micro_batch = 4;
  test_equal("cnn, micro-batches of 4", &c);
  gpt_config(&c);
  test_equal("gpt (tied head)", &c);
  test_eval();
  test_noise(0);
  test_noise(1);
  test_nan_alloc();
  test_limit();
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0, "%s", cmd);
  TH_DONE();
}
