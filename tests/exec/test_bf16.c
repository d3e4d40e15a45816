/*
 * test_bf16.c — bf16 weights in weight streaming's file store
 * (execution.store_weights: bf16; src/tensor/bf16.c, src/exec/store.c):
 *  - rounding to nearest against a reference written with doubles (the two
 *    bf16 neighbours of x, the nearer taken, ties to the even one) over a
 *    million random bit patterns and the edge cases: exact values, ties,
 *    overflow to infinity, signed zeros, infinities, NaN;
 *  - stochastic rounding: bf16 values are left alone, every result is one
 *    of the two neighbours, the frequency of rounding up is the closed
 *    form (x - down) / (up - down) within 5 standard deviations, and the
 *    bits are a pure function of (seed, step, index): a range rounded in
 *    two pieces equals it rounded whole, another step or seed rounds
 *    otherwise; elements 1 to 16 apart round
 *    up together at the independent rate;
 *  - after 20 steps a bf16 store's weights equal, bit for bit, the
 *    sequential mode's with its weights rounded to bf16 after every step,
 *    for the MLP (SGD), the CNN (AdamW) and the GPT (AdamW, tied head),
 *    rounding to nearest and stochastically, with activations kept and
 *    recomputed and in micro-batches;
 *  - the weights stream in at 2 bytes each; the store file is the size
 *    the layout gives; the export writes BF16 weights and F32 state;
 *  - a bf16 store opened as fp32 (and the reverse), with the other
 *    rounding, or written by another store format version, and bf16 with
 *    the memory store are refused, naming the key or the version.
 */
#include "harness.h"
#include "bf16_ref.h"
#include "models.h"
#include "strata.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char dir[] = "/tmp/strata_test_bf16_XXXXXX";

static void test_nearest(void) {
  struct {
    float x;
    float want;
  } cases[] = {
      {1.0f, 1.0f},
      {1.0f + 0x1p-8f, 1.0f},                     /* tie: to even (down) */
      {1.0f + 0x1p-7f + 0x1p-8f, 1.0f + 0x1p-6f}, /* tie: to even (up) */
      {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f},
      {-1.0f - 0x1p-8f - 0x1p-20f, -1.0f - 0x1p-7f},
      {0x1.fffffep+127f,
       INFINITY}, /* beyond bf16's largest finite + half ulp */
      {0x1.fdp+127f, 0x1.fcp+127f}, /* a tie below it: to even */
      {-0.0f, -0.0f},
      {INFINITY, INFINITY},
      {-INFINITY, -INFINITY},
      {0x1p-133f + 0x1p-140f, 0x1p-133f}, /* subnormal */
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    float got = st_bf16_to(st_bf16_from(cases[i].x));
    float want = cases[i].want;
    if (bits(got) != bits(want)) {
      bad++;
      printf("  %a rounds to %a, want %a\n", (double)cases[i].x, (double)got,
             (double)want);
    }
  }
  CHECK(bad == 0, "bf16 to nearest: %d of the edge cases wrong", bad);
  float nan = st_bf16_to(st_bf16_from(NAN));
  CHECK(isnan(nan) && isnan(st_bf16_to(st_bf16_from(-NAN))),
        "NaN stays NaN (not infinity)");
  /* a signalling NaN whose payload is only in the low half */
  CHECK(isnan(st_bf16_to(st_bf16_from(from_bits(0x7F800001u)))),
        "a NaN with its payload in the low half stays NaN");
  st_rng rng;
  st_rng_init(&rng, 7, ST_RNG_DATA, 0);
  int wrong = 0;
  uint32_t first_wrong = 0;
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = st_rng_u32(&rng);
    float x = from_bits(u);
    if (isnan(x)) continue;
    if (st_bf16_from(x) != nearest_reference(x) && !wrong++) first_wrong = u;
  }
  CHECK(wrong == 0,
        "bf16 to nearest equals the reference on 1e6 random "
        "bit patterns (%d wrong, first %08x)",
        wrong, first_wrong);
  /* widening is exact and packing round-trips */
  uint16_t h[3];
  float w[3] = {0.5f, -2.25f, 1.0f + 0x1p-7f}, back[3];
  st_bf16_pack(w, h, 3);
  st_bf16_unpack(h, back, 3);
  CHECK(memcmp(w, back, sizeof w) == 0, "bf16 values pack and unpack exactly");
}

static void test_stochastic(void) {
  enum { N = 200000 };
  float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
  /* x = 1 + 0.3 ulp: up with probability 0.3 */
  const float ulp = 0x1p-7f, v = 1.0f + 0.3f * ulp;
  for (int i = 0; i < N; i++) x[i] = v;
  memcpy(y, x, N * sizeof *x);
  st_bf16_round(y, N, 1, 42, 5, 1000);
  int ups = 0, other = 0;
  for (int i = 0; i < N; i++) {
    if (y[i] == 1.0f + ulp)
      ups++;
    else if (y[i] != 1.0f)
      other++;
  }
  double p = (double)(v - 1.0f) / ulp, f = (double)ups / N;
  double sd = sqrt(p * (1 - p) / N);
  CHECK(other == 0, "stochastic rounding gives a neighbour (%d did not)",
        other);
  CHECK(fabs(f - p) < 5 * sd,
        "rounds up %.5f of the time, the closed form "
        "%.5f (5 sd = %.5f)",
        f, p, 5 * sd);
  /* negative values: away from zero with the same probability */
  for (int i = 0; i < N; i++) y[i] = -v;
  st_bf16_round(y, N, 1, 42, 6, 0);
  ups = 0;
  for (int i = 0; i < N; i++) ups += y[i] == -1.0f - ulp;
  f = (double)ups / N;
  CHECK(fabs(f - p) < 5 * sd,
        "negative: away from zero %.5f, closed form "
        "%.5f",
        f, p);
  /* neighbours round independently: at probability 1/2, two elements k
   * apart (within and across a Philox block of 8) both go up a quarter of
   * the time, within 5 standard deviations */
  const float half = 1.0f + 0.5f * ulp;
  for (int i = 0; i < N; i++) y[i] = half;
  st_bf16_round(y, N, 1, 42, 7, 0);
  int worst_lag = 0;
  double worst = 0, sd2 = sqrt(0.25 * 0.75 / (N - 16));
  for (int k = 1; k <= 16; k++) {
    int both = 0;
    for (int i = 0; i + k < N; i++) both += y[i] != 1.0f && y[i + k] != 1.0f;
    double dev = fabs((double)both / (N - k) - 0.25);
    if (dev > worst) worst = dev, worst_lag = k;
  }
  CHECK(worst < 5 * sd2,
        "elements 1..16 apart round up together at the "
        "independent rate 1/4 (worst lag %d: off by %.5f, 5 sd = %.5f)",
        worst_lag, worst, 5 * sd2);
  /* bf16 values stay */
  for (int i = 0; i < N; i++) x[i] = st_bf16_to((uint16_t)(0x3F00 + i % 256));
  memcpy(y, x, N * sizeof *x);
  st_bf16_round(y, N, 1, 3, 9, 0);
  CHECK(memcmp(x, y, N * sizeof *x) == 0, "bf16 values are left alone");
  /* pure function of (seed, step, index) */
  st_rng rng;
  st_rng_init(&rng, 11, ST_RNG_DATA, 0);
  for (int i = 0; i < N; i++) x[i] = st_rng_normal(&rng);
  memcpy(y, x, N * sizeof *x);
  float *z = malloc(N * sizeof *z);
  memcpy(z, x, N * sizeof *x);
  st_bf16_round(y, N, 1, 3, 9, 100);
  st_bf16_round(z, 777, 1, 3, 9, 100);
  st_bf16_round(z + 777, N - 777, 1, 3, 9, 100 + 777);
  CHECK(memcmp(y, z, N * sizeof *y) == 0,
        "a range rounded in two pieces equals it rounded whole");
  memcpy(z, x, N * sizeof *x);
  st_bf16_round(z, N, 1, 3, 10, 100);
  CHECK(memcmp(y, z, N * sizeof *y) != 0, "another step rounds otherwise");
  memcpy(z, x, N * sizeof *x);
  st_bf16_round(z, N, 1, 4, 9, 100);
  CHECK(memcmp(y, z, N * sizeof *y) != 0, "another seed rounds otherwise");
  free(x);
  free(y);
  free(z);
}

static void bf16_store(st_config *c, const char *rounding, int keep) {
  static int serial;
  snprintf(c->execution.mode, sizeof c->execution.mode, "weight_streaming");
  snprintf(c->execution.store, sizeof c->execution.store, "file");
  snprintf(c->execution.store_path, sizeof c->execution.store_path,
           "%s/%d.strata", dir, serial++);
  snprintf(c->execution.store_weights, sizeof c->execution.store_weights,
           "bf16");
  snprintf(c->execution.store_rounding, sizeof c->execution.store_rounding,
           "%s", rounding);
  c->execution.keep_activations = keep;
}

static void test_equal(const char *what, const st_config *base) {
  static const char *const roundings[] = {"nearest", "stochastic"};
  for (int r = 0; r < 2; r++) {
    st_config c = *base;
    bf16_store(&c, roundings[r], r == 0);
    size_t n = 0, n2 = 0;
    float *want = train_bf16_reference(&c, &n);
    st_trainer *t = NULL;
    float *got = want ? train(&c, &n2, &t) : NULL;
    CHECK(got && n2 == n && memcmp(got, want, n * sizeof *got) == 0,
          "%s, bf16 rounded %s, keep_activations %d: weights after %d steps "
          "equal sequential's rounded to bf16 after every step",
          what, roundings[r], c.execution.keep_activations, STEPS);
    /* what the store holds are bf16 values */
    int exact = 1;
    for (size_t i = 0; got && i < n; i++)
      exact &= st_bf16_to(st_bf16_from(got[i])) == got[i];
    CHECK(got && exact, "%s: every stored weight is a bf16 value", what);
    st_stream_stats s;
    if (t && st_trainer_stream_stats(t, &s) == 0) {
      int M =
          c.train.batch / (c.execution.micro_batch > 0 ? c.execution.micro_batch
                                                       : c.train.batch);
      /* weights at 2 bytes twice per micro-batch; partial gradients fp32 */
      int64_t want_in =
          STEPS * (2 * M * (int64_t)n * 2 + (M - 1) * (int64_t)n * 4);
      CHECK(s.bytes_in == want_in && s.bytes_out == STEPS * M * (int64_t)n * 4,
            "%s: streamed %lld in (want %lld), %lld out", what,
            (long long)s.bytes_in, (long long)want_in, (long long)s.bytes_out);
    }
    st_trainer_destroy(t);
    free(want);
    free(got);
  }
}

/* The file's size, and the export's dtypes. */
static void test_layout(void) {
  st_config c;
  cnn_config(&c);
  bf16_store(&c, "nearest", 1);
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "a bf16 store: %s", err.msg);
  if (!t) return;
  double loss;
  int rc = st_trainer_step(t, &loss, &err);
  if (!rc) rc = st_trainer_sync(t, &err);
  CHECK(rc == 0, "a step on a bf16 store: %s", err.msg);
  const st_model *m = st_trainer_model(t);
  size_t n = m->n_params;
  CHECK(st_trainer_params(t) == NULL,
        "no float slab of the weights is offered (they are bf16)");
  /* headers, two copies of (weights at 2 bytes, padded to 4; AdamW's two
   * slots at 4), each a whole number of pages, then the fp32 gradients */
  size_t page = (size_t)sysconf(_SC_PAGESIZE),
         copy = ((n * 2 + 3) / 4 * 4 + 2 * n * 4 + page - 1) / page * page;
  size_t want = 2 * page + 2 * copy + (n * 4 + page - 1) / page * page;
  struct stat sb;
  CHECK(stat(c.execution.store_path, &sb) == 0 && (size_t)sb.st_size == want,
        "the store is %lld bytes, the layout gives %zu", (long long)sb.st_size,
        want);
  char path[128];
  snprintf(path, sizeof path, "%s/export.safetensors", dir);
  rc = st_trainer_save(t, path, &err);
  st_safetensors *st = NULL;
  if (!rc) rc = st_safetensors_read(&st, path, &err);
  CHECK(rc == 0, "exported: %s", err.msg);
  if (st) {
    int weights_bf16 = 0, weights = 0, state_f32 = 0, state = 0;
    for (int i = 0; i < st->n_tensors; i++) {
      const st_st_tensor *x = &st->tensors[i];
      int opt = strncmp(x->name, "optim.", 6) == 0;
      state += opt, weights += !opt;
      state_f32 += opt && strcmp(x->dtype, "F32") == 0;
      weights_bf16 += !opt && strcmp(x->dtype, "BF16") == 0;
    }
    CHECK(weights > 0 && weights_bf16 == weights && state == 2 * weights &&
              state_f32 == state,
          "export: %d of %d weight tensors BF16, %d of %d state tensors F32",
          weights_bf16, weights, state_f32, state);
    st_safetensors_destroy(st);
  }
  st_trainer_destroy(t);
  /* the same store as fp32 is refused, and fp32 as bf16 */
  st_config f = c;
  snprintf(f.execution.store_weights, sizeof f.execution.store_weights, "fp32");
  t = make(&f, &err);
  CHECK(!t && strstr(err.msg, "bf16") && strstr(err.msg, "store_weights"),
        "a bf16 store opened as fp32 is refused: '%s'", err.msg);
  st_trainer_destroy(t);
  snprintf(f.execution.store_path, sizeof f.execution.store_path,
           "%s/fp32.strata", dir);
  t = make(&f, &err);
  st_trainer_destroy(t);
  snprintf(f.execution.store_weights, sizeof f.execution.store_weights, "bf16");
  t = make(&f, &err);
  CHECK(!t && strstr(err.msg, "fp32") && strstr(err.msg, "store_weights"),
        "an fp32 store opened as bf16 is refused: '%s'", err.msg);
  st_trainer_destroy(t);
  /* the rounding is part of the run: another one is refused */
  f = c;
  snprintf(f.execution.store_rounding, sizeof f.execution.store_rounding,
           "stochastic");
  t = make(&f, &err);
  CHECK(!t && strstr(err.msg, "rounded to nearest") &&
            strstr(err.msg, "store_rounding is stochastic"),
        "a store rounded to nearest, opened to round stochastically, is "
        "refused: '%s'",
        err.msg);
  st_trainer_destroy(t);
  /* a store of another format version: named, not called corrupt */
  char old[ST_PATH_MAX], cmd[4 * ST_PATH_MAX + 256];
  snprintf(old, sizeof old, "%s/v1.strata", dir);
  snprintf(cmd, sizeof cmd,
           "cp %s %s && printf '\\001' | dd of=%s bs=1 seek=8 conv=notrunc "
           "2>/dev/null && printf '\\001' | dd of=%s bs=1 seek=4104 "
           "conv=notrunc 2>/dev/null",
           c.execution.store_path, old, old, old);
  CHECK(system(cmd) == 0, "%s", cmd);
  f = c;
  snprintf(f.execution.store_path, sizeof f.execution.store_path, "%s", old);
  t = make(&f, &err);
  CHECK(!t && strstr(err.msg, "format version 1") &&
            strstr(err.msg, "reads version 5"),
        "a store of format version 1 is refused as such: '%s'", err.msg);
  st_trainer_destroy(t);
  /* the memory store is the trainer's fp32 slabs */
  f = c;
  snprintf(f.execution.store, sizeof f.execution.store, "memory");
  t = make(&f, &err);
  CHECK(!t && strstr(err.msg, "execution.store_weights") &&
            strstr(err.msg, "file"),
        "bf16 weights with the memory store are refused: '%s'", err.msg);
  st_trainer_destroy(t);
}

int main(void) {
  st_blas_init();
  if (!mkdtemp(dir)) {
    perror(dir);
    return 1;
  }
  test_nearest();
  test_stochastic();
  st_config c;
  mlp_config(&c);
  test_equal("mlp", &c);
  c.execution.micro_batch = 4;
  test_equal("mlp, micro-batches of 4", &c);
  cnn_config(&c);
  test_equal("cnn", &c);
  gpt_config(&c);
  test_equal("gpt (tied head)", &c);
  test_layout();
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0, "%s", cmd);
  TH_DONE();
}
