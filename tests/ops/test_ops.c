/*
 * test_ops.c — the kernels of src/ops/ against three independent oracles:
 *   1. PyTorch fixtures (tests/fixtures/ops_*.safetensors, written by
 *      tests/ref/gen_ops.py): outputs and gradients computed in float64 from
 *      the same float32 inputs, so any difference is our own fp32 rounding;
 *   2. central finite differences of L = sum(out * dout), accumulated in
 *      double, for a few input and parameter elements of each op;
 *   3. a naive plain-loop conv2d (in double) beside the im2col + GEMM one.
 * It also proves that conv2d is bitwise independent of the pool's thread
 * count, that kernels allocate nothing, and checks dropout by its properties
 * (its RNG is not PyTorch's, so there is nothing to compare against).
 *
 * Runs from the repository root. Set STRATA_TEST_VERBOSE=1 to print the
 * worst difference of every comparison.
 */
#include "harness.h"
#include "strata.h"

#include <stdint.h>
#include <string.h>

#define REGENERATE "/usr/bin/python3 tests/ref/gen_ops.py"

#include "op_fixtures.h"

/* ------------------------------------------------------------- linear */

typedef struct linear_ctx {
  float *out, *in, *w, *b, *dout;
  int B, IC, OC;
} linear_ctx;

static double linear_loss(void *p) {
  linear_ctx *c = p;
  st_linear_forward(NULL, c->out, c->in, c->w, c->b, c->B, c->IC, c->OC);
  return dot(c->out, c->dout, (size_t)c->B * c->OC);
}

/* GEMM outputs. A dot product of n fp32 terms carries a rounding error of
 * about sqrt(n) * 6e-8 times the size of its partial sums (Higham, Accuracy
 * and Stability, ch. 3, for random-sign rounding). Outputs and input
 * gradients here are sums whose typical size is 1 (weights are scaled by
 * 1/sqrt(fan_in)): 1e-5 relative above a floor of 1 leaves a margin of 10x
 * or more. Weight and bias gradients sum n = B*OH*OW unit-sized terms, so
 * their typical size is sqrt(n) and that is their floor (grad_floor):
 * values far below it come from cancellation and are held to 1e-5 * sqrt(n)
 * absolute, which is still 10x the expected rounding. */
#define GEMM_TOL 1e-5
#define GEMM_FLOOR 1.0

static double grad_floor(size_t terms) {
  double f = sqrt((double)terms);
  return f > 1.0 ? f : 1.0;
}

static void test_linear(void) {
  st_safetensors *st = open_fixture("linear");
  if (!st) return;
  const char *cases[] = {"bias", "nobias"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 4);
    int B = d[0], IC = d[1], OC = d[2], has_bias = d[3];
    size_t nin = (size_t)B * IC, nw = (size_t)OC * IC, nout = (size_t)B * OC;
    float *in = fx(st, c, "in", nin), *w = fx(st, c, "w", nw);
    float *b = has_bias ? fx(st, c, "b", (size_t)OC) : NULL;
    float *dout = fx(st, c, "dout", nout);
    float *out = new_floats(nout), *din = new_floats(nin);
    float *dw = new_floats(nw), *db = new_floats((size_t)OC);
    st_linear_forward(NULL, out, in, w, b, B, IC, OC);
    st_linear_backward(NULL, din, dw, has_bias ? db : NULL, dout, in, w, B, IC,
                       OC);
    label(what, sizeof what, "linear", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", nout), nout, GEMM_TOL, GEMM_FLOOR);
    label(what, sizeof what, "linear", c, "din");
    CHECK_CLOSE(what, din, fx(st, c, "din", nin), nin, GEMM_TOL, GEMM_FLOOR);
    label(what, sizeof what, "linear", c, "dw");
    CHECK_CLOSE(what, dw, fx(st, c, "dw", nw), nw, GEMM_TOL,
                grad_floor((size_t)B));
    if (has_bias) {
      label(what, sizeof what, "linear", c, "db");
      CHECK_CLOSE(what, db, fx(st, c, "db", (size_t)OC), (size_t)OC, GEMM_TOL,
                  grad_floor((size_t)B));
    }
    linear_ctx ctx = {new_floats(nout), in, w, b, dout, B, IC, OC};
    label(what, sizeof what, "linear", c, "fd din");
    check_fd(what, in, nin, din, linear_loss, &ctx, 0);
    label(what, sizeof what, "linear", c, "fd dw");
    check_fd(what, w, nw, dw, linear_loss, &ctx, 0);
    if (has_bias) {
      label(what, sizeof what, "linear", c, "fd db");
      check_fd(what, b, (size_t)OC, db, linear_loss, &ctx, 0);
    }
    release_all();
  }
  st_safetensors_destroy(st);
}

/* The transposed layout (W stored (IC, OC), a GPT's Conv1D) against the
 * same fixture with W transposed, and the accumulation a micro-batch split
 * relies on in both layouts: a second backward over the same data ADDS
 * to dW and db (block.c), so they end at twice the fixture's gradients,
 * while din is overwritten. Tolerances as in test_linear. */
static void test_linear_layouts(void) {
  st_safetensors *st = open_fixture("linear");
  if (!st) return;
  const char *cases[] = {"bias", "nobias"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 4);
    int B = d[0], IC = d[1], OC = d[2], has_bias = d[3];
    size_t nin = (size_t)B * IC, nw = (size_t)OC * IC, nout = (size_t)B * OC;
    float *in = fx(st, c, "in", nin), *w = fx(st, c, "w", nw);
    float *b = has_bias ? fx(st, c, "b", (size_t)OC) : NULL;
    float *dout = fx(st, c, "dout", nout);
    float *want_dw = fx(st, c, "dw", nw), *want_db = NULL;
    float *wt = new_floats(nw), *twice = new_floats(nw);
    for (int o = 0; o < OC; o++)
      for (int i = 0; i < IC; i++)
        wt[(size_t)i * OC + o] = w[(size_t)o * IC + i];
    for (int wl = 0; wl < 2; wl++) { /* 0: W (OC, IC), 1: W (IC, OC) */
      const char *layout = wl ? "(IC, OC)" : "(OC, IC)";
      float *out = new_floats(nout), *din = new_floats(nin);
      float *dw = new_floats(nw), *db = new_floats((size_t)OC);
      for (int pass = 0; pass < 2; pass++) {
        if (wl) {
          st_linear_t_forward(NULL, out, in, wt, b, B, IC, OC);
          st_linear_t_backward(NULL, din, dw, has_bias ? db : NULL, dout, in,
                               wt, B, IC, OC);
        } else {
          st_linear_forward(NULL, out, in, w, b, B, IC, OC);
          st_linear_backward(NULL, din, dw, has_bias ? db : NULL, dout, in, w,
                             B, IC, OC);
        }
      }
      snprintf(what, sizeof what, "linear %s, W %s: out", c, layout);
      CHECK_CLOSE(what, out, fx(st, c, "out", nout), nout, GEMM_TOL,
                  GEMM_FLOOR);
      snprintf(what, sizeof what, "linear %s, W %s: din (2nd pass)", c, layout);
      CHECK_CLOSE(what, din, fx(st, c, "din", nin), nin, GEMM_TOL, GEMM_FLOOR);
      for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
          float g = 2.0f * want_dw[(size_t)o * IC + i];
          twice[wl ? (size_t)i * OC + o : (size_t)o * IC + i] = g;
        }
      snprintf(what, sizeof what, "linear %s, W %s: dw after 2 passes", c,
               layout);
      CHECK_CLOSE(what, dw, twice, nw, GEMM_TOL, 2 * grad_floor((size_t)B));
      if (has_bias) {
        want_db = fx(st, c, "db", (size_t)OC);
        float *db2 = new_floats((size_t)OC);
        for (int o = 0; o < OC; o++) db2[o] = 2.0f * want_db[o];
        snprintf(what, sizeof what, "linear %s, W %s: db after 2 passes", c,
                 layout);
        CHECK_CLOSE(what, db, db2, (size_t)OC, GEMM_TOL,
                    2 * grad_floor((size_t)B));
      }
    }
    release_all();
  }
  st_safetensors_destroy(st);
}

/* ------------------------------------------------------- activations */

/* Pointwise ops evaluated in double and rounded once: within an ulp or two
 * of the float64 reference; 1e-6 relative, floor 1e-6 (tiny outputs near
 * x = 0 or x << 0 are compared absolutely at 1e-12). */
#define POINTWISE_TOL 1e-6
#define POINTWISE_FLOOR 1e-6
/* GELU's tanh form runs in float (activation.c): about ten roundings of
 * 2^-24 each, measured max 1.1e-6 relative against float64. */
#define GELU_TANH_TOL 3e-6

static void test_relu(void) {
  st_safetensors *st = open_fixture("relu");
  if (!st) return;
  int32_t *d = fx_i32(st, "relu", "dims", 1);
  size_t n = (size_t)d[0];
  float *in = fx(st, "relu", "in", n), *dout = fx(st, "relu", "dout", n);
  float *out = new_floats(n), *din = new_floats(n);
  st_relu_forward(out, in, n);
  st_relu_backward(din, dout, out, n);
  /* relu is exact: max(x, 0) and a copy or a zero of dout. */
  CHECK_CLOSE("relu out", out, fx(st, "relu", "out", n), n, 0.0, 1e-30);
  CHECK_CLOSE("relu din", din, fx(st, "relu", "din", n), n, 0.0, 1e-30);
  /* a NaN stays NaN and passes its gradient, as PyTorch's relu and
   * threshold_backward do (mapped to 0, weights went NaN behind finite
   * losses); -0 gives +0 */
  float x[3] = {NAN, -0.0f, -1.0f}, y[3], g[3] = {2, 3, 4}, dx[3];
  st_relu_forward(y, x, 3);
  st_relu_backward(dx, g, y, 3);
  CHECK(isnan(y[0]) && y[1] == 0 && !signbit(y[1]) && y[2] == 0 && dx[0] == 2 &&
            dx[1] == 0 && dx[2] == 0,
        "relu of NaN, -0, -1: %g %g %g, gradients %g %g %g", y[0], y[1], y[2],
        dx[0], dx[1], dx[2]);
  release_all();
  st_safetensors_destroy(st);
}

typedef struct gelu_ctx {
  float *out, *in, *dout;
  size_t n;
  int approximate;
} gelu_ctx;

static double gelu_loss(void *p) {
  gelu_ctx *c = p;
  st_gelu_forward(c->out, c->in, c->n, c->approximate);
  return dot(c->out, c->dout, c->n);
}

static void test_gelu(void) {
  st_safetensors *st = open_fixture("gelu");
  if (!st) return;
  const char *cases[] = {"exact", "tanh"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 2);
    size_t n = (size_t)d[0];
    int approximate = d[1];
    float *in = fx(st, c, "in", n), *dout = fx(st, c, "dout", n);
    float *out = new_floats(n), *din = new_floats(n);
    st_gelu_forward(out, in, n, approximate);
    st_gelu_backward(din, dout, in, n, approximate);
    double tol = approximate ? GELU_TANH_TOL : POINTWISE_TOL;
    label(what, sizeof what, "gelu", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", n), n, tol, POINTWISE_FLOOR);
    label(what, sizeof what, "gelu", c, "din");
    CHECK_CLOSE(what, din, fx(st, c, "din", n), n, tol, POINTWISE_FLOOR);
    gelu_ctx ctx = {new_floats(n), in, dout, n, approximate};
    label(what, sizeof what, "gelu", c, "fd din");
    check_fd(what, in, n, din, gelu_loss, &ctx, 0);
    release_all();
  }
  st_safetensors_destroy(st);
  /* The far negative tail keeps its relative accuracy (activation.c): the
   * fixture compares values under 1e-6 absolutely, which would pass a
   * tail of zeros. At x = -8 .. -9.5 the tanh form is x sigma(2u) with 2u
   * down to -76 (values near 1e-33), against the same formula in double:
   * 5e-5 relative, as u is rounded to float (|2u| up to 76 times a few
   * ulps, 2e-5) before the exponential. */
  const float xs[4] = {-8.0f, -8.75f, -9.0f, -9.5f};
  const double c = 0.7978845608028654, a = 0.044715;
  float out[4], din[4], ones[4] = {1, 1, 1, 1};
  st_gelu_forward(out, xs, 4, 1);
  st_gelu_backward(din, ones, xs, 4, 1);
  for (int i = 0; i < 4; i++) {
    double x = xs[i], u2 = 2 * c * (x + a * x * x * x);
    double sg = 1 / (1 + exp(-u2)), du2 = 2 * c * (1 + 3 * a * x * x);
    double want = x * sg, dwant = sg + x * du2 * sg * (1 - sg);
    CHECK(fabs(out[i] / want - 1) < 5e-5 && fabs(din[i] / dwant - 1) < 5e-5,
          "gelu tanh tail at x = %g: %g (want %g), din %g (want %g)", x, out[i],
          want, din[i], dwant);
  }
}

/* ----------------------------------------------------------------- xent */

typedef struct xent_ctx {
  float *losses, *probs, *logits;
  int *labels;
  int B, C;
} xent_ctx;

static double xent_mean_loss(void *p) {
  xent_ctx *c = p;
  st_xent_forward(c->losses, c->probs, c->logits, c->labels, c->B, c->C);
  double sum = 0;
  for (int s = 0; s < c->B; s++) sum += c->losses[s];
  return sum / c->B;
}

/* The loss and probabilities against their closed form in double, at
 * class counts around the 16 partial-sum lanes (fewer, as many, more: C <
 * 16 skips the lanes) and the pooled form's task split at 10 classes. */
static void test_xent_widths(void) {
  const int widths[] = {1, 2, 10, 15, 16, 17, 31, 32, 33, 40};
  enum { B = 300 };
  st_pool *pool = st_pool_create(3);
  for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
    int C = widths[w];
    size_t n = (size_t)B * C;
    float *z = new_floats(n), *probs = new_floats(n), *want_p = new_floats(n);
    float *losses = new_floats(B), *want = new_floats(B),
          *pooled = new_floats(B);
    int *labels = keep(calloc(B, sizeof(int)));
    uint32_t h = 12345u + (uint32_t)C;
    for (size_t i = 0; i < n; i++) {
      h = h * 1664525u + 1013904223u;
      z[i] = (float)((h >> 8) / 16777216.0 * 12.0 - 6.0);
    }
    for (int s = 0; s < B; s++) {
      const float *r = z + (size_t)s * C;
      labels[s] = (s * 7) % C;
      double m = r[0], sum = 0;
      for (int c = 1; c < C; c++) m = r[c] > m ? r[c] : m;
      for (int c = 0; c < C; c++) sum += exp((double)r[c] - m);
      for (int c = 0; c < C; c++)
        want_p[(size_t)s * C + c] = (float)(exp((double)r[c] - m) / sum);
      want[s] = (float)(log(sum) - ((double)r[labels[s]] - m));
    }
    st_xent_forward(losses, probs, z, labels, B, C);
    st_xent_forward_pool(pool, pooled, probs, z, labels, B, C);
    char what[64];
    snprintf(what, sizeof what, "xent %d classes: losses", C);
    CHECK_CLOSE(what, losses, want, (size_t)B, 1e-5, 1e-6);
    snprintf(what, sizeof what, "xent %d classes: probs", C);
    CHECK_CLOSE(what, probs, want_p, n, 1e-5, 1e-7);
    CHECK(memcmp(losses, pooled, (size_t)B * sizeof(float)) == 0,
          "xent %d classes: the pooled loss is not the one call's bits", C);
  }
  st_pool_destroy(pool);
  release_all();
}

static void test_xent(void) {
  st_safetensors *st = open_fixture("xent");
  if (!st) return;
  const char *c = "xent";
  int32_t *d = fx_i32(st, c, "dims", 2);
  int B = d[0], C = d[1];
  size_t n = (size_t)B * C;
  float *logits = fx(st, c, "logits", n);
  int32_t *labels32 = fx_i32(st, c, "labels", (size_t)B);
  int *labels = keep(calloc((size_t)B, sizeof(int)));
  for (int s = 0; s < B; s++) labels[s] = labels32[s];
  float *losses = new_floats((size_t)B), *probs = new_floats(n);
  float *dlogits = new_floats(n);
  st_xent_forward(losses, probs, logits, labels, B, C);
  st_xent_backward(dlogits, probs, labels, B, C, 1.0f / (float)B);
  float mean = 0;
  {
    double sum = 0;
    for (int s = 0; s < B; s++) sum += losses[s];
    mean = (float)(sum / B);
  }
  /* computed in double per row, rounded once: ulp-level. */
  CHECK_CLOSE("xent losses", losses, fx(st, c, "losses", (size_t)B), (size_t)B,
              1e-6, 1e-6);
  CHECK_CLOSE("xent loss mean", &mean, fx(st, c, "loss", 1), 1, 1e-6, 1e-6);
  CHECK_CLOSE("xent probs", probs, fx(st, c, "probs", n), n, 1e-6, 1e-6);
  /* dlogits = (p - onehot) / B in fp32: two roundings of O(1/B) values. */
  CHECK_CLOSE("xent dlogits", dlogits, fx(st, c, "dlogits", n), n, 1e-6, 1e-6);
  xent_ctx ctx = {new_floats((size_t)B), new_floats(n), logits, labels, B, C};
  check_fd("xent fd dlogits", logits, n, dlogits, xent_mean_loss, &ctx, 0);
  release_all();
  st_safetensors_destroy(st);
}

/* ------------------------------------------ the head and its loss fused */

/* One run of the fused head: loss and hit per row, then the gradients (dW
 * and db added to a non-zero start, dx overwritten) for per-row scales g. */
typedef struct head_run {
  float *out, *lse, *dx, *dw, *db;
  int32_t *lab;
} head_run;

/* The scratch a call of `rows` rows needs (strata.h). */
static float *head_scratch(int rows, int chunk, int kept) {
  return new_floats(16 + (size_t)rows * ((size_t)chunk * (1 + kept) + 2));
}

/* A run's buffers; dW and db start non-zero (the backward adds to them),
 * dx at a value it overwrites; the labels with room for the token. */
static head_run head_buffers(int rows, int D, int V) {
  head_run h = {
      new_floats(2 * (size_t)rows), new_floats((size_t)rows),
      new_floats((size_t)rows * D), new_floats((size_t)V * D),
      new_floats((size_t)V),        keep(calloc((size_t)rows + 2, 4))};
  for (size_t i = 0; i < (size_t)rows * D; i++) h.dx[i] = 7.0f;
  for (size_t i = 0; i < (size_t)V * D; i++) h.dw[i] = 0.5f;
  for (int i = 0; i < V; i++) h.db[i] = 0.25f;
  return h;
}

static head_run fused_head(st_pool *pool, const float *x, const float *w,
                           const float *b, const int *y, const float *g,
                           int rows, int D, int V, int chunk, int kept) {
  head_run h = head_buffers(rows, D, V);
  float *scratch = head_scratch(rows, chunk, kept);
  float *gg = new_floats(2 * (size_t)rows);
  for (int r = 0; r < rows; r++) gg[2 * r] = g[r], gg[2 * r + 1] = 0.0f;
  st_linear_xent_forward(pool, h.out, h.lse, h.lab, x, w, b, y, scratch, rows,
                         D, V, chunk, kept);
  st_linear_xent_backward(pool, h.dx, h.dw, h.db, gg, x, w, b, h.lse, h.lab,
                          scratch, rows, D, V, chunk, kept);
  for (size_t i = 0; i < (size_t)V * D; i++) h.dw[i] -= 0.5f;
  for (int i = 0; i < V; i++) h.db[i] -= 0.25f;
  return h;
}

static int same_run(head_run a, head_run b, int rows, int D, int V) {
  return !memcmp(a.out, b.out, 2 * (size_t)rows * sizeof(float)) &&
         !memcmp(a.dx, b.dx, (size_t)rows * D * sizeof(float)) &&
         !memcmp(a.dw, b.dw, (size_t)V * D * sizeof(float)) &&
         !memcmp(a.db, b.db, (size_t)V * sizeof(float));
}

/* The chunks the forward keeps for the backward (strata.h): the same bits
 * as every chunk made again (`ref`: kept 0), with some kept and with all
 * 5; the backward takes them (a kept logit changed in between changes its
 * result) only from its own forward: after another forward in the same
 * scratch, or a backward (which ends them), it makes them again; and the
 * weight half of a split backward after the input half has them made
 * again, with the whole backward's bits. */
static void test_linear_xent_kept(st_pool *one, st_pool *three, const float *x,
                                  const float *w, const float *b, const int *y,
                                  const float *g, head_run ref, int rows, int D,
                                  int V, int chunk) {
  int n = (V + chunk - 1) / chunk;
  const int some[] = {1, 2, n};
  for (int i = 0; i < 3; i++) {
    int kept = some[i];
    head_run k1 = fused_head(one, x, w, b, y, g, rows, D, V, chunk, kept);
    head_run k3 = fused_head(three, x, w, b, y, g, rows, D, V, chunk, kept);
    CHECK(same_run(k1, ref, rows, D, V) && same_run(k3, ref, rows, D, V),
          "linear_xent, %d of %d chunks kept: not the bits of all made again",
          kept, n);
  }
  int kept = 2;
  float *gg = new_floats(2 * (size_t)rows), *x2 = new_floats((size_t)rows * D);
  for (int r = 0; r < rows; r++) gg[2 * r] = g[r], gg[2 * r + 1] = 0.0f;
  for (size_t i = 0; i < (size_t)rows * D; i++) x2[i] = 0.5f * x[i];
  /* poke: one kept logit changed between the forward and the backward;
   * stale: another forward in the same scratch in between; ended: a
   * backward of the other forward in between (its own kept chunks gone
   * with it); split: the input half, then the weight half; forgotten: a
   * kept logit changed, then st_linear_xent_forget */
  for (int how = 0; how < 5; how++) {
    head_run h = head_buffers(rows, D, V), o = head_buffers(rows, D, V);
    float *scratch = head_scratch(rows, chunk, kept);
    st_linear_xent_forward(three, h.out, h.lse, h.lab, x, w, b, y, scratch,
                           rows, D, V, chunk, kept);
    if (how == 0 || how == 4) /* the last chunk's slot, its first logit */
      scratch[16 + 2 * rows + (size_t)kept * rows * chunk] += 1.0f;
    if (how == 4) st_linear_xent_forget(scratch);
    if (how == 1 || how == 2)
      st_linear_xent_forward(three, o.out, o.lse, o.lab, x2, w, b, y, scratch,
                             rows, D, V, chunk, kept);
    if (how == 2)
      st_linear_xent_backward(three, o.dx, o.dw, o.db, gg, x2, w, b, o.lse,
                              o.lab, scratch, rows, D, V, chunk, kept);
    if (how == 3) {
      st_linear_xent_backward(three, h.dx, NULL, NULL, gg, x, w, b, h.lse,
                              h.lab, scratch, rows, D, V, chunk, kept);
      st_linear_xent_backward(three, NULL, h.dw, h.db, gg, x, w, b, h.lse,
                              h.lab, scratch, rows, D, V, chunk, kept);
    } else
      st_linear_xent_backward(three, h.dx, h.dw, h.db, gg, x, w, b, h.lse,
                              h.lab, scratch, rows, D, V, chunk, kept);
    for (size_t i = 0; i < (size_t)V * D; i++) h.dw[i] -= 0.5f;
    for (int i = 0; i < V; i++) h.db[i] -= 0.25f;
    const char *what[] = {"a kept logit changed", "another forward between",
                          "another backward between", "split in two halves",
                          "changed, then forgotten"};
    CHECK(how == 0 ? !same_run(h, ref, rows, D, V)
                   : same_run(h, ref, rows, D, V),
          "linear_xent, %d chunks kept, %s: %s", kept, what[how],
          how == 0 ? "the backward made them again"
                   : "not the bits of all made again");
  }
}

/* The head's hit (out[2 r + 1]: the label is the first index of the
 * largest logit) where the largest is tied or odd: one row a call, its
 * logits the bias (W zero: z = b + 0, so b exactly, infinities and NaNs
 * too, but a -0 becomes +0, so the ties of -0 and +0 are not reached
 * here), over one chunk of V = 83 words (16-word lanes, then 3 more). The
 * answer is the loop `best = z[c] > z[best] ? c : best`. */
static void test_xent_first_largest(void) {
  enum { V = 83, D = 4 };
  const float inf = INFINITY, nan = NAN;
  struct {
    int at[3]; /* words set to `top` (-1: none) */
    float top, rest, odd;
    int odd_at, want;
  } cases[] = {
      {{5, 21, -1}, 2.0f, 0.0f, 0.0f, -1, 5},   /* tie in one lane */
      {{40, 62, -1}, 2.0f, 0.0f, 0.0f, -1, 40}, /* lanes 8 and 14 */
      {{36, 13, -1}, 2.0f, 0.0f, 0.0f, -1, 13}, /* lane 13 before lane 4 */
      {{50, -1, -1}, 1.0f, 0.0f, nan, 7, 50},   /* a NaN past word 0 */
      {{50, -1, -1}, 1.0f, 0.0f, nan, 0, 0},    /* a NaN at word 0 */
      {{-1, -1, -1}, 0.0f, -inf, 0.0f, -1, 0},  /* all -inf */
      {{-1, -1, -1}, 0.0f, -inf, nan, 3, 0},    /* -inf and a NaN */
      {{81, 10, -1}, 3.0f, 0.0f, 0.0f, -1, 10}, /* tied in the last 3 */
      {{82, -1, -1}, 3.0f, 0.0f, 0.0f, -1, 82}, /* largest in them */
      {{0, 16, 32}, 0.0f, -1.0f, 0.0f, -1, 0},  /* +0 thrice in lane 0 */
      {{70, 20, -1}, inf, 0.0f, nan, 4, 20},    /* +inf twice, a NaN */
  };
  float x[D] = {1, 1, 1, 1}, *w = new_floats((size_t)V * D), b[V];
  float out[2], lse[1];
  int32_t lab[3];
  float *scratch = head_scratch(1, V, 0);
  int n = (int)(sizeof cases / sizeof cases[0]), ok = 0;
  for (int i = 0; i < n; i++)
    for (int label = 0; label < V; label++) {
      for (int v = 0; v < V; v++) b[v] = cases[i].rest;
      for (int k = 0; k < 3; k++)
        if (cases[i].at[k] >= 0) b[cases[i].at[k]] = cases[i].top;
      if (cases[i].odd_at >= 0) b[cases[i].odd_at] = cases[i].odd;
      st_linear_xent_forward(NULL, out, lse, lab, x, w, b, &label, scratch, 1,
                             D, V, V, 0);
      ok += out[1] == (label == cases[i].want ? 1.0f : 0.0f);
    }
  CHECK(ok == n * V,
        "linear_xent: the hit is the first largest logit's in "
        "%d of %d rows with ties, NaNs or -inf",
        ok, n * V);
}

/* st_linear_xent_* against the closed form in double (logits x W^T + b,
 * logsumexp, softmax - onehot), over a vocabulary of 203 in chunks of 48
 * (four whole chunks and one of 11), labels on chunk edges and in the
 * short last chunk, rows with their largest logit in a later chunk than
 * the first (the running max and sum rescaled), per-row gradient scales;
 * then bit for bit across thread counts, and against one chunk. */
static void test_linear_xent(void) {
  enum { ROWS = 37, D = 24, V = 203, CHUNK = 48 };
  float *x = random_floats((size_t)ROWS * D, 61, 1.0f);
  float *w = random_floats((size_t)V * D, 62, 0.4f);
  float *b = random_floats(V, 63, 0.5f), *g = new_floats(ROWS);
  int *y = keep(calloc(ROWS, sizeof(int)));
  /* some rows' best word far from the first chunk: word 150 pulled up;
   * row 9's best twice, words 20 and 100 the same (its label, as every
   * third row's: the first index of the largest logit scores), and row
   * 12's twice within one chunk, words 30 and 40 */
  for (int d = 0; d < D; d++) {
    w[150 * D + d] = 1.5f * x[3 * D + d];
    w[20 * D + d] = w[100 * D + d] = 2.0f * x[9 * D + d];
    w[30 * D + d] = w[40 * D + d] = 2.5f * x[12 * D + d];
  }
  b[100] = b[20];
  b[40] = b[30];
  /* the closed form */
  double *ref_loss = calloc(ROWS, sizeof *ref_loss);
  int *ref_hit = keep(calloc(ROWS, sizeof(int)));
  float *rdx = new_floats((size_t)ROWS * D), *rdw = new_floats((size_t)V * D);
  float *rdb = new_floats(V);
  double *z = calloc((size_t)ROWS * V, sizeof *z);
  double *dwd = calloc((size_t)V * D, sizeof *dwd),
         *dbd = calloc(V, sizeof *dbd);
  int later_best = 0;
  const int edges[] = {0, 47, 48, 95, 96, 191, 192, 202};
  for (int r = 0; r < ROWS; r++) {
    int best = 0;
    double *zr = z + (size_t)r * V;
    for (int v = 0; v < V; v++) {
      zr[v] = b[v];
      for (int d = 0; d < D; d++)
        zr[v] += (double)x[(size_t)r * D + d] * w[(size_t)v * D + d];
      if (zr[v] > zr[best]) best = v;
    }
    /* labels on the chunks' edges, every third row its best word */
    y[r] = r < 8 ? edges[r] : r % 3 ? (int)((r * 37u + 11u) % V) : best;
    g[r] = (1.0f + (float)(r % 3)) / ROWS;
    later_best += best >= CHUNK;
  }
  for (int r = 0; r < ROWS; r++) {
    const double *zr = z + (size_t)r * V;
    int best = 0;
    for (int v = 1; v < V; v++) best = zr[v] > zr[best] ? v : best;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp(zr[v] - zr[best]);
    double lse = zr[best] + log(sum);
    ref_loss[r] = lse - zr[y[r]];
    ref_hit[r] = best == y[r];
    for (int v = 0; v < V; v++) {
      double dv = g[r] * (exp(zr[v] - lse) - (v == y[r]));
      dbd[v] += dv;
      for (int d = 0; d < D; d++) {
        dwd[(size_t)v * D + d] += dv * x[(size_t)r * D + d];
        rdx[(size_t)r * D + d] += (float)(dv * w[(size_t)v * D + d]);
      }
    }
  }
  for (size_t i = 0; i < (size_t)V * D; i++) rdw[i] = (float)dwd[i];
  for (int v = 0; v < V; v++) rdb[v] = (float)dbd[v];
  CHECK(later_best >= 3 && y[9] == 20 && z[9 * V + 20] == z[9 * V + 100] &&
            y[12] == 30 && z[12 * V + 30] == z[12 * V + 40],
        "linear_xent: only %d rows peak past chunk 0, or row 9 or 12 has no "
        "tie",
        later_best);
  st_pool *one = st_pool_create(1), *three = st_pool_create(3);
  head_run a = fused_head(one, x, w, b, y, g, ROWS, D, V, CHUNK, 0);
  float *loss = new_floats(ROWS), *want = new_floats(ROWS);
  int hits = 0, hit_ok = 1, labels_kept = 1;
  for (int r = 0; r < ROWS; r++) {
    loss[r] = a.out[2 * r];
    want[r] = (float)ref_loss[r];
    hit_ok &= a.out[2 * r + 1] == (float)ref_hit[r];
    hits += ref_hit[r];
    labels_kept &= a.lab[r] == y[r];
  }
  /* the loss: a double sum over exps within 2 ulp, as st_xent_forward */
  CHECK_CLOSE("linear_xent losses", loss, want, ROWS, 1e-5, 1.0);
  CHECK(hit_ok && hits > 0 && hits < ROWS && labels_kept,
        "linear_xent: hits or kept labels differ from the closed form");
  /* gradients: sums of terms g (p - onehot) (times x or W), each at most
   * the largest g, 3/37, in size, the label's p - 1 rounded from p near 1:
   * GEMM_TOL above that floor */
  const double term = 3.0 / ROWS;
  CHECK_CLOSE("linear_xent dx", a.dx, rdx, (size_t)ROWS * D, GEMM_TOL, term);
  CHECK_CLOSE("linear_xent dW", a.dw, rdw, (size_t)V * D, GEMM_TOL, term);
  CHECK_CLOSE("linear_xent db", a.db, rdb, V, GEMM_TOL, term);
  /* any thread count: the same bits */
  head_run t = fused_head(three, x, w, b, y, g, ROWS, D, V, CHUNK, 0);
  CHECK(memcmp(a.out, t.out, 2 * ROWS * sizeof(float)) == 0 &&
            memcmp(a.dx, t.dx, (size_t)ROWS * D * sizeof(float)) == 0 &&
            memcmp(a.dw, t.dw, (size_t)V * D * sizeof(float)) == 0 &&
            memcmp(a.db, t.db, V * sizeof(float)) == 0,
        "linear_xent: 1 and 3 threads differ");
  /* the whole vocabulary as one chunk: the same sums, rounded apart */
  head_run u = fused_head(three, x, w, b, y, g, ROWS, D, V, V, 0);
  for (int r = 0; r < ROWS; r++) loss[r] = u.out[2 * r];
  CHECK_CLOSE("linear_xent one chunk", loss, want, ROWS, 1e-5, 1.0);
  CHECK_CLOSE("linear_xent one chunk dW", u.dw, rdw, (size_t)V * D, GEMM_TOL,
              term);
  test_linear_xent_kept(one, three, x, w, b, y, g, a, ROWS, D, V, CHUNK);
  /* a label outside the vocabulary: that row's loss is NaN (the trainer's
   * non-finite check stops there), the others as before */
  y[5] = V;
  float *scratch = head_scratch(ROWS, CHUNK, 0);
  float *out = new_floats(2 * ROWS), *lse = new_floats(ROWS);
  int32_t *lab = keep(calloc(ROWS + 2, sizeof(int32_t)));
  for (int r = 0; r < 2 * ROWS; r++) out[r] = 1.0f; /* stale values */
  st_linear_xent_forward(three, out, lse, lab, x, w, b, y, scratch, ROWS, D, V,
                         CHUNK, 0);
  CHECK(isnan(out[2 * 5]) && out[2 * 6] == a.out[2 * 6],
        "linear_xent: a label past the vocabulary gave loss %g", out[2 * 5]);
  /* the chunk is a function of shape alone, whole vectors, <= V, and at
   * most 3072 words (the packed kernel's K for the input gradient) */
  CHECK(st_linear_xent_chunk(1024, 50257) == 1024 &&
            st_linear_xent_chunk(64, 256) == 256 &&
            st_linear_xent_chunk(4096, 50257) == 256 &&
            st_linear_xent_chunk(512, 50257) == 2048 &&
            st_linear_xent_chunk(256, 50257) == 3072 &&
            st_linear_xent_chunk(64, 50257) == 3072 &&
            st_linear_xent_scratch_floats(1024, 50257, 16) ==
                16 + 1024 * (1024 * 17 + 2) &&
            st_linear_xent_scratch_floats(1024, 50257, 0) ==
                16 + 1024 * (1024 + 2),
        "linear_xent chunk %d %d %d %d %d %d",
        st_linear_xent_chunk(1024, 50257), st_linear_xent_chunk(64, 256),
        st_linear_xent_chunk(4096, 50257), st_linear_xent_chunk(512, 50257),
        st_linear_xent_chunk(256, 50257), st_linear_xent_chunk(64, 50257));
  st_pool_destroy(one);
  st_pool_destroy(three);
  free(ref_loss);
  free(z);
  free(dwd);
  free(dbd);
  release_all();
}

/* --------------------------------------------------------------- conv2d */

typedef struct conv_shape {
  int B, IC, H, W, OC, K, S, P;
} conv_shape;

static int conv_out(int n, int K, int S, int P) {
  return (n + 2 * P - K) / S + 1;
}

static size_t conv_in_numel(conv_shape s) {
  return (size_t)s.B * s.IC * s.H * s.W;
}
static size_t conv_w_numel(conv_shape s) {
  return (size_t)s.OC * s.IC * s.K * s.K;
}
static size_t conv_out_numel(conv_shape s) {
  return (size_t)s.B * s.OC * conv_out(s.H, s.K, s.S, s.P) *
         conv_out(s.W, s.K, s.S, s.P);
}

typedef struct conv_ctx {
  conv_shape s;
  float *out, *in, *w, *b, *dout, *col;
} conv_ctx;

static double conv_loss(void *p) {
  conv_ctx *c = p;
  conv_shape s = c->s;
  st_conv2d_forward(NULL, c->out, c->in, c->w, c->b, c->col, s.B, s.IC, s.H,
                    s.W, s.OC, s.K, s.S, s.P);
  return dot(c->out, c->dout, conv_out_numel(s));
}

/* The oracle: convolution by its definition, in double. */
static void naive_conv_forward(double *out, const float *in, const float *w,
                               const float *b, conv_shape s) {
  int OH = conv_out(s.H, s.K, s.S, s.P), OW = conv_out(s.W, s.K, s.S, s.P);
  for (int n = 0; n < s.B; n++)
    for (int o = 0; o < s.OC; o++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double sum = b ? b[o] : 0.0;
          for (int c = 0; c < s.IC; c++)
            for (int ki = 0; ki < s.K; ki++)
              for (int kj = 0; kj < s.K; kj++) {
                int ih = oh * s.S - s.P + ki, iw = ow * s.S - s.P + kj;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                sum +=
                    (double)in[((size_t)(n * s.IC + c) * s.H + ih) * s.W + iw] *
                    w[((size_t)(o * s.IC + c) * s.K + ki) * s.K + kj];
              }
          out[((size_t)(n * s.OC + o) * OH + oh) * OW + ow] = sum;
        }
}

static void naive_conv_backward(double *din, double *dw, double *db,
                                const float *dout, const float *in,
                                const float *w, conv_shape s) {
  int OH = conv_out(s.H, s.K, s.S, s.P), OW = conv_out(s.W, s.K, s.S, s.P);
  for (int n = 0; n < s.B; n++)
    for (int o = 0; o < s.OC; o++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double g = dout[((size_t)(n * s.OC + o) * OH + oh) * OW + ow];
          db[o] += g;
          for (int c = 0; c < s.IC; c++)
            for (int ki = 0; ki < s.K; ki++)
              for (int kj = 0; kj < s.K; kj++) {
                int ih = oh * s.S - s.P + ki, iw = ow * s.S - s.P + kj;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                size_t xi = ((size_t)(n * s.IC + c) * s.H + ih) * s.W + iw;
                size_t wi = ((size_t)(o * s.IC + c) * s.K + ki) * s.K + kj;
                dw[wi] += g * in[xi];
                din[xi] += g * w[wi];
              }
        }
}

static void test_conv2d_fixtures(void) {
  st_safetensors *st = open_fixture("conv2d");
  if (!st) return;
  /* B = 2 puts every case but k3s1p1_b4 on the tiled dW path (src/ops/
   * conv2d.c); the naive comparison below covers the grouped path widely. */
  const char *cases[] = {"k3s1p1", "k3s1p1_nobias", "k3s1p1_b4",
                         "k5s2p2", "k5s2p2_nobias", "k3s2p0_rect",
                         "k1s1p0"};
  for (int k = 0; k < 7; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 9);
    conv_shape s = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]};
    int has_bias = d[8];
    size_t nin = conv_in_numel(s), nw = conv_w_numel(s),
           nout = conv_out_numel(s);
    float *in = fx(st, c, "in", nin), *w = fx(st, c, "w", nw);
    float *b = has_bias ? fx(st, c, "b", (size_t)s.OC) : NULL;
    float *dout = fx(st, c, "dout", nout);
    float *col = new_floats(
        st_conv2d_scratch_floats(s.B, s.IC, s.H, s.W, s.K, s.S, s.P));
    float *out = new_floats(nout), *din = new_floats(nin);
    float *dw = new_floats(nw), *db = new_floats((size_t)s.OC);
    /* Backward adds into dw and db: start them at 0.5 and take it off. */
    for (size_t i = 0; i < nw; i++) dw[i] = 0.5f;
    for (int o = 0; o < s.OC; o++) db[o] = 0.5f;
    st_conv2d_forward(NULL, out, in, w, b, col, s.B, s.IC, s.H, s.W, s.OC, s.K,
                      s.S, s.P);
    st_conv2d_backward(NULL, din, dw, has_bias ? db : NULL, dout, in, w, col,
                       s.B, s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
    for (size_t i = 0; i < nw; i++) dw[i] -= 0.5f;
    for (int o = 0; o < s.OC; o++) db[o] -= 0.5f;
    label(what, sizeof what, "conv2d", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", nout), nout, GEMM_TOL, GEMM_FLOOR);
    label(what, sizeof what, "conv2d", c, "din");
    CHECK_CLOSE(what, din, fx(st, c, "din", nin), nin, GEMM_TOL, GEMM_FLOOR);
    /* dw and db went through accumulators that started at 0.5; taking 0.5
     * off again adds at most 3e-8 absolute, far inside the floor below. */
    size_t terms = nout / (size_t)s.OC; /* B*OH*OW */
    label(what, sizeof what, "conv2d", c, "dw (added)");
    CHECK_CLOSE(what, dw, fx(st, c, "dw", nw), nw, GEMM_TOL, grad_floor(terms));
    if (has_bias) {
      label(what, sizeof what, "conv2d", c, "db (added)");
      CHECK_CLOSE(what, db, fx(st, c, "db", (size_t)s.OC), (size_t)s.OC,
                  GEMM_TOL, grad_floor(terms));
    } else {
      int untouched = 1;
      for (int o = 0; o < s.OC; o++) untouched &= db[o] == 0.0f;
      CHECK(untouched, "conv2d %s: db written although NULL was passed", c);
    }
    /* din == NULL is allowed and must not change dw. */
    float *dw2 = new_floats(nw);
    for (size_t i = 0; i < nw; i++) dw2[i] = 0.5f;
    st_conv2d_backward(NULL, NULL, dw2, NULL, dout, in, w, col, s.B, s.IC, s.H,
                       s.W, s.OC, s.K, s.S, s.P);
    for (size_t i = 0; i < nw; i++) dw2[i] -= 0.5f;
    CHECK(memcmp(dw, dw2, nw * sizeof(float)) == 0,
          "conv2d %s: dw differs when din is NULL", c);

    conv_ctx ctx = {s, new_floats(nout), in, w, b, dout, col};
    label(what, sizeof what, "conv2d", c, "fd din");
    check_fd(what, in, nin, din, conv_loss, &ctx, 0);
    label(what, sizeof what, "conv2d", c, "fd dw");
    check_fd(what, w, nw, dw, conv_loss, &ctx, 0);
    if (has_bias) {
      label(what, sizeof what, "conv2d", c, "fd db");
      check_fd(what, b, (size_t)s.OC, db, conv_loss, &ctx, 0);
    }
    release_all();
  }
  st_safetensors_destroy(st);
}

/* Fast conv2d against the naive one, including shapes whose last rows and
 * columns fall outside every window ((H + 2P - K) not a multiple of S), both
 * dW strategies (tiled: the first five and the last four; grouped: the
 * rest, with uneven groups for B = 9) and the pointwise shortcut on both.
 * The last four are small batches whose products are cut into column tiles
 * (7 tiles of 112 columns; 5 with a last one of 3; 2 over a pointwise conv;
 * 5 with channel chunks of 1 and 2), as is the forward of B = 4. */
static void test_conv2d_naive(void) {
  conv_shape shapes[] = {
      {3, 4, 10, 11, 5, 3, 2, 1},
      {2, 5, 12, 9, 6, 5, 3, 1},
      {2, 3, 7, 7, 8, 1, 1, 0},
      {2, 2, 6, 6, 3, 1, 2, 0},
      {2, 3, 8, 8, 4, 3, 1, 2},
      {4, 8, 14, 14, 20, 3, 1, 1},
      {9, 3, 10, 11, 5, 3, 2, 1},
      {6, 4, 9, 9, 7, 5, 2, 2},
      {6, 8, 5, 5, 12, 1, 1, 0},
      {8, 3, 6, 6, 40, 3, 1, 1},
      {1, 3, 28, 28, 8, 3, 1, 1},
      {1, 5, 17, 19, 6, 3, 1, 1},
      {2, 4, 12, 12, 7, 1, 1, 0},
      {1, 7, 20, 20, 9, 5, 1, 2},
      /* padding past K / 2, stride past K, an even K, a 1x1 image, a
       * batch of 20 pointwise (grouped dW) */
      {2, 3, 5, 6, 4, 1, 1, 2},
      {3, 2, 5, 5, 3, 3, 1, 3},
      {2, 3, 7, 8, 4, 1, 3, 0},
      {2, 3, 9, 7, 4, 2, 3, 1},
      {1, 2, 4, 4, 3, 3, 4, 2},
      {40, 2, 3, 3, 5, 3, 5, 4},
      {1, 1, 1, 1, 1, 1, 1, 0},
      {1, 1, 1, 1, 2, 3, 1, 1},
      {20, 3, 2, 2, 70, 1, 1, 0},
  };
  for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
    conv_shape s = shapes[k];
    char what[96], c[48];
    snprintf(c, sizeof c, "B%d IC%d %dx%d OC%d K%d S%d P%d", s.B, s.IC, s.H,
             s.W, s.OC, s.K, s.S, s.P);
    size_t nin = conv_in_numel(s), nw = conv_w_numel(s),
           nout = conv_out_numel(s);
    float *in = random_floats(nin, 11 + k, 1.0f);
    float *w =
        random_floats(nw, 12 + k, 1.0f / sqrtf((float)(s.IC * s.K * s.K)));
    float *b = random_floats((size_t)s.OC, 13 + k, 0.3f);
    float *dout = random_floats(nout, 14 + k, 1.0f);
    float *col = new_floats(
        st_conv2d_scratch_floats(s.B, s.IC, s.H, s.W, s.K, s.S, s.P));
    float *out = new_floats(nout), *din = new_floats(nin);
    float *dw = new_floats(nw), *db = new_floats((size_t)s.OC);
    double *ref_out = new_doubles(nout), *ref_din = new_doubles(nin);
    double *ref_dw = new_doubles(nw), *ref_db = new_doubles((size_t)s.OC);
    st_conv2d_forward(NULL, out, in, w, b, col, s.B, s.IC, s.H, s.W, s.OC, s.K,
                      s.S, s.P);
    st_conv2d_backward(NULL, din, dw, db, dout, in, w, col, s.B, s.IC, s.H, s.W,
                       s.OC, s.K, s.S, s.P);
    naive_conv_forward(ref_out, in, w, b, s);
    naive_conv_backward(ref_din, ref_dw, ref_db, dout, in, w, s);
    /* Same tolerances and floors as for the fixtures (GEMM_TOL). */
    size_t terms = nout / (size_t)s.OC; /* B*OH*OW */
    label(what, sizeof what, "conv2d naive", c, "out");
    CHECK_CLOSE(what, out, to_floats(ref_out, nout), nout, GEMM_TOL,
                GEMM_FLOOR);
    label(what, sizeof what, "conv2d naive", c, "din");
    CHECK_CLOSE(what, din, to_floats(ref_din, nin), nin, GEMM_TOL, GEMM_FLOOR);
    label(what, sizeof what, "conv2d naive", c, "dw");
    CHECK_CLOSE(what, dw, to_floats(ref_dw, nw), nw, GEMM_TOL,
                grad_floor(terms));
    label(what, sizeof what, "conv2d naive", c, "db");
    CHECK_CLOSE(what, db, to_floats(ref_db, (size_t)s.OC), (size_t)s.OC,
                GEMM_TOL, grad_floor(terms));
    /* the input gradient alone (a split backward's B): the same bits */
    float *din2 = new_floats(nin);
    st_conv2d_backward(NULL, din2, NULL, NULL, dout, in, w, col, s.B, s.IC, s.H,
                       s.W, s.OC, s.K, s.S, s.P);
    CHECK(memcmp(din, din2, nin * sizeof(float)) == 0,
          "conv2d naive %s: din alone differs from din with dW", c);
    /* the bias's gradient without dW (the header allows either NULL): the
     * same sums, accumulated into db as with dW */
    float *db2 = new_floats((size_t)s.OC);
    st_conv2d_backward(NULL, NULL, NULL, db2, dout, in, w, col, s.B, s.IC, s.H,
                       s.W, s.OC, s.K, s.S, s.P);
    CHECK(memcmp(db, db2, (size_t)s.OC * sizeof(float)) == 0,
          "conv2d naive %s: db without dW differs from db with it", c);
    release_all();
  }
}

/* Bitwise equality for 1 and 3 threads (and no pool): every task partition
 * depends on the shape only. The first three shapes take the grouped dW path
 * (4, 4 and 2 groups), the fourth the tiled one with 6 tiles, the fifth the
 * pointwise shortcut with 4 groups; the last two are one sample, its
 * products cut into column tiles (2, and 4 over a pointwise conv). */
static void test_conv2d_determinism(void) {
  conv_shape shapes[] = {
      {8, 8, 14, 14, 16, 3, 1, 1}, {8, 16, 14, 14, 40, 3, 1, 1},
      {5, 6, 15, 13, 20, 5, 2, 2}, {3, 16, 6, 6, 40, 3, 1, 1},
      {8, 16, 7, 7, 24, 1, 1, 0},  {1, 16, 14, 14, 40, 3, 1, 1},
      {1, 16, 16, 16, 24, 1, 1, 0}};
  st_pool *pools[3] = {NULL, st_pool_create(1), st_pool_create(3)};
  CHECK(pools[1] && pools[2], "st_pool_create failed");
  if (!pools[1] || !pools[2]) goto done;
  for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
    conv_shape s = shapes[k];
    size_t nin = conv_in_numel(s), nw = conv_w_numel(s),
           nout = conv_out_numel(s);
    size_t ncol = st_conv2d_scratch_floats(s.B, s.IC, s.H, s.W, s.K, s.S, s.P);
    float *in = random_floats(nin, 21 + k, 1.0f);
    float *w = random_floats(nw, 22 + k, 0.1f);
    float *b = random_floats((size_t)s.OC, 23 + k, 0.3f);
    float *dout = random_floats(nout, 24 + k, 1.0f);
    float *out[3], *din[3], *dw[3], *db[3];
    for (int p = 0; p < 3; p++) {
      float *col = new_floats(ncol);
      out[p] = new_floats(nout), din[p] = new_floats(nin);
      dw[p] = random_floats(nw, 25, 0.01f); /* a previous micro-batch */
      db[p] = random_floats((size_t)s.OC, 26, 0.01f);
      uint64_t allocs = st_alloc_count();
      st_conv2d_forward(pools[p], out[p], in, w, b, col, s.B, s.IC, s.H, s.W,
                        s.OC, s.K, s.S, s.P);
      st_conv2d_backward(pools[p], din[p], dw[p], db[p], dout, in, w, col, s.B,
                         s.IC, s.H, s.W, s.OC, s.K, s.S, s.P);
      CHECK(st_alloc_count() == allocs, "conv2d allocated inside the kernel");
    }
    for (int p = 1; p < 3; p++) {
      const char *who = p == 1 ? "1 thread" : "3 threads";
      CHECK(memcmp(out[0], out[p], nout * 4) == 0,
            "conv2d shape %d out: %s differs from no pool", k, who);
      CHECK(memcmp(din[0], din[p], nin * 4) == 0,
            "conv2d shape %d din: %s differs from no pool", k, who);
      CHECK(memcmp(dw[0], dw[p], nw * 4) == 0,
            "conv2d shape %d dw: %s differs from no pool", k, who);
      CHECK(memcmp(db[0], db[p], (size_t)s.OC * 4) == 0,
            "conv2d shape %d db: %s differs from no pool", k, who);
    }
    release_all();
  }
done:
  st_pool_destroy(pools[1]);
  st_pool_destroy(pools[2]);
}

static void test_xent_cost(void) {
  /* 10 classes: 5*10 + 2 forward, 2*10 backward, 10 probabilities + loss. */
  st_cost c = st_xent_cost(10);
  CHECK(c.flops_fwd == 52 && c.flops_bwd == 20 && c.param_bytes == 0 &&
            c.act_bytes == 44,
        "xent cost %g %g %g %g", c.flops_fwd, c.flops_bwd, c.param_bytes,
        c.act_bytes);
}

/* The fused head's cost: the forward product of the head apart (its bias
 * term aside) and the softmax's 6 a word; the backward the head apart's two
 * products plus the forward product again for the chunks not kept (all of
 * them with none kept), once more for all of them where the backward is
 * split in two halves, and 4 a word. */
static void test_linear_xent_cost(void) {
  const int D = 768, V = 50257;
  /* rows a sample, the chunk, the chunks kept: 32768 rows keep 2 of 197
   * chunks of 256 words, 1024 keep 16 of 50 of 1024, 256 all 17 of 3072,
   * 131072 (a chunk past 16M floats) none */
  const int cases[4][3] = {
      {32768, 256, 2}, {1024, 1024, 16}, {256, 3072, 17}, {131072, 256, 0}};
  st_cost u = st_linear_cost(D, V);
  double fwd = u.flops_fwd - V, bwd = u.flops_bwd - V; /* products alone */
  for (int i = 0; i < 4; i++) {
    int R = cases[i][0], chunk = cases[i][1], kept = cases[i][2];
    int n = (V + chunk - 1) / chunk;
    double again = kept ? (double)(n - kept) * chunk / V : 1.0;
    st_cost f = st_linear_xent_cost(R, D, V, kept, 0);
    st_cost none = st_linear_xent_cost(R, D, V, 0, 0);
    st_cost split = st_linear_xent_cost(R, D, V, kept, 1);
    CHECK(st_linear_xent_chunk(R, V) == chunk &&
              st_linear_xent_keep(R, V) == kept,
          "linear_xent at %d rows: chunk %d, %d kept", R,
          st_linear_xent_chunk(R, V), st_linear_xent_keep(R, V));
    CHECK(fabs(none.flops_bwd - (bwd + fwd + 4.0 * V)) <=
                  1e-12 * none.flops_bwd &&
              fabs(split.flops_bwd - (bwd + (again + 1) * fwd + 4.0 * V)) <=
                  1e-12 * split.flops_bwd,
          "linear_xent cost at %d rows, none kept %g, split %g", R,
          none.flops_bwd, split.flops_bwd);
    CHECK(f.flops_fwd == fwd + 6.0 * V &&
              fabs(f.flops_bwd - (bwd + again * fwd + 4.0 * V)) <=
                  1e-12 * f.flops_bwd &&
              f.param_bytes == 4.0 * D * V,
          "linear_xent cost at %d rows: %g %g %g", R, f.flops_fwd, f.flops_bwd,
          f.param_bytes);
  }
}

static void test_conv2d_cost(void) {
  /* 28x28x1 -> 32 channels, K=3 'same': 2 * 32*9*784 MACs + 32*784 bias. */
  st_cost c = st_conv2d_cost(1, 28, 28, 32, 3, 1, 1);
  CHECK(c.flops_fwd == 2.0 * 32 * 9 * 784 + 32 * 784, "conv2d cost %g",
        c.flops_fwd);
  CHECK(c.param_bytes == 4.0 * (32 * 9 + 32), "conv2d param bytes %g",
        c.param_bytes);
  CHECK(st_conv2d_scratch_floats(4, 3, 9, 9, 5, 2, 2) ==
            (size_t)4 * 3 * 25 * 5 * 5,
        "conv2d scratch size");
}

/* -------------------------------------------------------------- pooling */

static void test_maxpool(void) {
  st_safetensors *st = open_fixture("maxpool");
  if (!st) return;
  const char *cases[] = {"k2s2", "k3s2", "k2s2_ties", "k3s2_ties"};
  for (int k = 0; k < 4; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 6);
    int B = d[0], C = d[1], H = d[2], W = d[3], K = d[4], S = d[5];
    size_t nin = (size_t)B * C * H * W,
           nout = (size_t)B * C * ((H - K) / S + 1) * ((W - K) / S + 1);
    float *in = fx(st, c, "in", nin), *dout = fx(st, c, "dout", nout);
    int32_t *want_idx = fx_i32(st, c, "idx", nout);
    float *out = new_floats(nout), *din = new_floats(nin);
    int32_t *idx = keep(calloc(nout, sizeof(int32_t)));
    st_maxpool_forward(out, idx, in, B, C, H, W, K, S);
    st_maxpool_backward(din, dout, idx, B, C, H, W, K, S);
    /* A max is a copy and the argmax an integer: both exact, ties included
     * (first maximum in row-major window order, as PyTorch). din adds up to
     * four dout values per input (with K=3, S=2 a corner cell lies in four
     * windows): three fp32 roundings, < 2e-7 of values of order 1, so 1e-6
     * above a floor of 1. */
    label(what, sizeof what, "maxpool", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", nout), nout, 0.0, 1e-30);
    CHECK(memcmp(idx, want_idx, nout * sizeof(int32_t)) == 0,
          "maxpool %s: argmax indices differ from PyTorch", c);
    label(what, sizeof what, "maxpool", c, "din");
    CHECK_CLOSE(what, din, fx(st, c, "din", nin), nin, 1e-6, 1.0);
    release_all();
  }
  st_safetensors_destroy(st);
}

/* Closed forms for what the fixtures cannot hold: a NaN wins its window (the
 * last NaN if several) and an all -inf window points at its first element,
 * as PyTorch's CPU kernel does. */
static void test_maxpool_special(void) {
  const float in[8] = {
      NAN,       1.0f,      NAN,       2.0f, /* window 0 (2x2 in a 2x4 map) */
      -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  /* (1, 2, 2, 2): channel 0 holds the NaNs, channel 1 the -infs */
  float out[2];
  int32_t idx[2];
  st_maxpool_forward(out, idx, in, 1, 2, 2, 2, 2, 2);
  CHECK(isnan(out[0]) && idx[0] == 2, "maxpool NaN: out %g idx %d",
        (double)out[0], idx[0]);
  CHECK(out[1] == -INFINITY && idx[1] == 0, "maxpool -inf: out %g idx %d",
        (double)out[1], idx[1]);

  /* Zeros of both signs compare equal: the first in row-major order is the
   * maximum, its sign kept (PyTorch's val > maxval leaves the first).
   * Window 0 is -0, +0 / -1, -1: -0 at 0; window 1 is -1, -0 / +0, -1:
   * -0 at 3 (a 2x4 map, k2s2, whose branch-free path decides these), the
   * same as the general loop's (k2s1 over the map's first two columns). */
  const float z[8] = {-0.0f, 0.0f, -1.0f, -0.0f, -1.0f, -1.0f, 0.0f, -1.0f};
  float zo[3];
  int32_t zi[3];
  st_maxpool_forward(zo, zi, z, 1, 1, 2, 4, 2, 2);
  CHECK(zo[0] == 0 && signbit(zo[0]) && zi[0] == 0 && zo[1] == 0 &&
            signbit(zo[1]) && zi[1] == 3,
        "maxpool k2s2 of signed zeros: %g at %d, %g at %d; want -0 at 0, -0 "
        "at 3",
        (double)zo[0], zi[0], (double)zo[1], zi[1]);
  st_maxpool_forward(zo, zi, z, 1, 1, 2, 4, 2, 1);
  CHECK(zo[0] == 0 && signbit(zo[0]) && zi[0] == 0,
        "maxpool k2s1 of signed zeros: %g at %d; want -0 at 0", (double)zo[0],
        zi[0]);
}

/* Maps whose windows do not tile them ((H - K) % S != 0, as a CNN pooling
 * 28 -> 14 -> 7 -> 3 meets), which the PyTorch fixtures (8 with k2s2, 9
 * with k3s2) never are: the output is floor((n - K) / S) + 1 a side, and
 * nothing past it is written, against a float64 reference written here
 * from the definition (first maximum in row-major window order, as
 * PyTorch takes it; the mean of the K x K window). */
static void test_pool_untiled(void) {
  const int dims[][4] = {{7, 7, 2, 2}, {7, 9, 3, 2}, {10, 6, 3, 3},
                         {5, 8, 2, 3}, {9, 9, 4, 3}, {6, 11, 3, 1}};
  for (int k = 0; k < 6; k++) {
    const int B = 2, C = 3, H = dims[k][0], W = dims[k][1], K = dims[k][2],
              S = dims[k][3];
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    size_t nin = (size_t)B * C * H * W, nout = (size_t)B * C * OH * OW;
    enum { GUARD = 64 };
    float *in = random_floats(nin, 300 + (uint64_t)k, 1.0f);
    float *dout = random_floats(nout, 400 + (uint64_t)k, 1.0f);
    float *out = new_floats(nout + GUARD), *din = new_floats(nin);
    int32_t *idx = malloc((nout + GUARD) * sizeof *idx);
    double *want = new_doubles(nout), *want_din = new_doubles(nin);
    double *avg = new_doubles(nout), *avg_din = new_doubles(nin);
    int32_t *want_idx = malloc(nout * sizeof *want_idx);
    if (!idx || !want_idx) {
      CHECK(0, "out of memory");
      free(idx), free(want_idx);
      return;
    }
    for (size_t i = 0; i < nout + GUARD; i++) out[i] = 7.0f, idx[i] = -7;
    memset(want_din, 0, nin * sizeof *want_din);
    memset(avg_din, 0, nin * sizeof *avg_din);
    for (size_t p = 0; p < (size_t)B * C; p++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          size_t o = p * OH * OW + (size_t)oh * OW + ow;
          double best = -INFINITY, sum = 0;
          int at = -1;
          for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++) {
              int e = (oh * S + i) * W + ow * S + j;
              double v = in[p * H * W + (size_t)e];
              if (at < 0 || v > best) best = v, at = e;
              sum += v;
            }
          want[o] = best, want_idx[o] = at;
          avg[o] = sum / (K * K);
          want_din[p * H * W + (size_t)at] += dout[o];
          for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++)
              avg_din[p * H * W + (size_t)((oh * S + i) * W + ow * S + j)] +=
                  dout[o] / (K * K);
        }
    char what[96];
    snprintf(what, sizeof what, "maxpool %dx%d k%ds%d", H, W, K, S);
    st_maxpool_forward(out, idx, in, B, C, H, W, K, S);
    int untouched = 1, same_idx = 1;
    for (size_t i = nout; i < nout + GUARD; i++)
      untouched &= out[i] == 7.0f && idx[i] == -7;
    for (size_t i = 0; i < nout; i++) same_idx &= idx[i] == want_idx[i];
    CHECK(untouched, "%s: wrote past its %d x %d output", what, OH, OW);
    CHECK(same_idx, "%s: argmax differs from the definition's", what);
    CHECK_CLOSE(what, out, to_floats(want, nout), nout, 0, 0);
    st_maxpool_backward(din, dout, idx, B, C, H, W, K, S);
    snprintf(what, sizeof what, "maxpool %dx%d k%ds%d din", H, W, K, S);
    CHECK_CLOSE(what, din, to_floats(want_din, nin), nin, 1e-6, 1.0);
    for (size_t i = 0; i < nout + GUARD; i++) out[i] = 7.0f;
    st_avgpool_forward(out, in, B, C, H, W, K, S);
    untouched = 1;
    for (size_t i = nout; i < nout + GUARD; i++) untouched &= out[i] == 7.0f;
    snprintf(what, sizeof what, "avgpool %dx%d k%ds%d", H, W, K, S);
    CHECK(untouched, "%s: wrote past its %d x %d output", what, OH, OW);
    /* fp32 sums of K*K <= 16 terms of order 1: a few 1e-7 absolute */
    CHECK_CLOSE(what, out, to_floats(avg, nout), nout, 1e-6, 1.0);
    st_avgpool_backward(din, dout, B, C, H, W, K, S);
    snprintf(what, sizeof what, "avgpool %dx%d k%ds%d din", H, W, K, S);
    CHECK_CLOSE(what, din, to_floats(avg_din, nin), nin, 1e-6, 1.0);
    free(idx), free(want_idx);
    release_all();
  }
  /* a window of -inf alone off the 2x2 fast path: PyTorch's index is the
   * window's first element, and the gradient goes there */
  float in[9], out1;
  int32_t at;
  for (int i = 0; i < 9; i++) in[i] = -INFINITY;
  st_maxpool_forward(&out1, &at, in, 1, 1, 3, 3, 3, 3);
  CHECK(out1 == -INFINITY && at == 0, "maxpool k3 -inf: out %g idx %d",
        (double)out1, at);
}

static void test_avgpool(void) {
  st_safetensors *st = open_fixture("avgpool");
  if (!st) return;
  const char *cases[] = {"k2s2", "k3s2"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 6);
    int B = d[0], C = d[1], H = d[2], W = d[3], K = d[4], S = d[5];
    size_t nin = (size_t)B * C * H * W,
           nout = (size_t)B * C * ((H - K) / S + 1) * ((W - K) / S + 1);
    float *in = fx(st, c, "in", nin), *dout = fx(st, c, "dout", nout);
    float *out = new_floats(nout), *din = new_floats(nin);
    st_avgpool_forward(out, in, B, C, H, W, K, S);
    st_avgpool_backward(din, dout, B, C, H, W, K, S);
    /* fp32 sums of K*K <= 9 terms of order 1: a few 1e-7 absolute. */
    label(what, sizeof what, "avgpool", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", nout), nout, 1e-6, 1.0);
    label(what, sizeof what, "avgpool", c, "din");
    CHECK_CLOSE(what, din, fx(st, c, "din", nin), nin, 1e-6, 1.0);
    release_all();
  }
  st_safetensors_destroy(st);
}

/* --------------------------------------------------------------- norms */

/* Norm kernels reduce in double and round once; backward refines the fp32
 * mean it is handed (src/ops/norm.c), so the offset case (mean 64 x the
 * spread) is as accurate as the plain one. What remains is the fp32 rstd
 * (6e-8 relative) and cancellation where din or dw is small against its
 * terms: a few 1e-7 above a floor of 0.1. 1e-5 leaves a margin of 10x; without
 * the refinement the offset case misses it (~6e-8 * 64 * sqrt(D) ~ 1e-5). */
#define NORM_TOL 1e-5
#define NORM_FLOOR 0.1

typedef struct layernorm_ctx {
  float *out, *mean, *rstd, *in, *w, *b, *dout;
  int N, D;
  float eps;
} layernorm_ctx;

static double layernorm_loss(void *p) {
  layernorm_ctx *c = p;
  st_layernorm_forward(c->out, c->mean, c->rstd, c->in, c->w, c->b, c->N, c->D,
                       c->eps);
  return dot(c->out, c->dout, (size_t)c->N * c->D);
}

/* The backward past the fixtures' widths: 70 rows (blocks of 32, 32 and
 * 6) of 300 features (two pieces of the feature sums, 256 and 44, and a
 * row's 8 lanes with a tail of 4), against the closed form in double:
 * din = rstd (g - mean(g) - xhat mean(g xhat)), g = dout w, dw = sum dout
 * xhat, db = sum dout. */
static void test_layernorm_wide(void) {
  enum { N = 70, D = 300 };
  size_t n = (size_t)N * D;
  float *in = random_floats(n, 71, 1.0f), *dout = random_floats(n, 72, 1.0f);
  float *w = random_floats(D, 73, 0.3f), *b = random_floats(D, 74, 0.3f);
  for (size_t i = 0; i < n; i++) in[i] += 3.0f;
  for (int i = 0; i < D; i++) w[i] += 1.0f;
  float *out = new_floats(n), *din = new_floats(n), *rdin = new_floats(n);
  float *mean = new_floats(N), *rstd = new_floats(N);
  float *dw = new_floats(D), *db = new_floats(D);
  float *rdw = new_floats(D), *rdb = new_floats(D);
  double *sw = calloc(D, sizeof *sw), *sb = calloc(D, sizeof *sb);
  for (int r = 0; r < N; r++) {
    const float *x = in + (size_t)r * D, *dy = dout + (size_t)r * D;
    double m = 0, v = 0, gm = 0, gxm = 0;
    for (int i = 0; i < D; i++) m += x[i];
    m /= D;
    for (int i = 0; i < D; i++) v += (x[i] - m) * (x[i] - m);
    double s = 1 / sqrt(v / D + 1e-5);
    for (int i = 0; i < D; i++) {
      double g = (double)dy[i] * w[i], xh = (x[i] - m) * s;
      gm += g / D, gxm += g * xh / D;
      sw[i] += dy[i] * xh, sb[i] += dy[i];
    }
    for (int i = 0; i < D; i++) {
      double g = (double)dy[i] * w[i], xh = (x[i] - m) * s;
      rdin[(size_t)r * D + i] = (float)(s * (g - gm - xh * gxm));
    }
  }
  for (int i = 0; i < D; i++) rdw[i] = (float)sw[i], rdb[i] = (float)sb[i];
  free(sw), free(sb);
  st_pool *pool = st_pool_create(2);
  st_layernorm_forward(out, mean, rstd, in, w, b, N, D, 1e-5f);
  st_layernorm_backward(pool, din, dw, db, dout, in, w, mean, rstd,
                        new_floats(st_layernorm_scratch_floats(N, D)), N, D);
  st_pool_destroy(pool);
  CHECK_CLOSE("layernorm 70 x 300 din", din, rdin, n, NORM_TOL, NORM_FLOOR);
  CHECK_CLOSE("layernorm 70 x 300 dw", dw, rdw, D, NORM_TOL, NORM_FLOOR);
  CHECK_CLOSE("layernorm 70 x 300 db", db, rdb, D, NORM_TOL, NORM_FLOOR);
  release_all();
}

static void test_layernorm(void) {
  st_safetensors *st = open_fixture("layernorm");
  if (!st) return;
  const char *cases[] = {"plain", "offset"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 2);
    int N = d[0], D = d[1];
    size_t n = (size_t)N * D;
    float eps = fx(st, c, "eps", 1)[0];
    float *in = fx(st, c, "in", n), *w = fx(st, c, "w", (size_t)D);
    float *b = fx(st, c, "b", (size_t)D), *dout = fx(st, c, "dout", n);
    float *out = new_floats(n), *din = new_floats(n);
    float *mean = new_floats((size_t)N), *rstd = new_floats((size_t)N);
    float *dw = new_floats((size_t)D), *db = new_floats((size_t)D);
    st_layernorm_forward(out, mean, rstd, in, w, b, N, D, eps);
    st_layernorm_backward(NULL, din, dw, db, dout, in, w, mean, rstd,
                          new_floats(st_layernorm_scratch_floats(N, D)), N, D);
    label(what, sizeof what, "layernorm", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", n), n, NORM_TOL, NORM_FLOOR);
    label(what, sizeof what, "layernorm", c, "mean");
    CHECK_CLOSE(what, mean, fx(st, c, "mean", (size_t)N), (size_t)N, 1e-6,
                1e-3);
    label(what, sizeof what, "layernorm", c, "rstd");
    CHECK_CLOSE(what, rstd, fx(st, c, "rstd", (size_t)N), (size_t)N, 1e-6,
                1e-3);
    label(what, sizeof what, "layernorm", c, "din");
    CHECK_CLOSE(what, din, fx(st, c, "din", n), n, NORM_TOL, NORM_FLOOR);
    label(what, sizeof what, "layernorm", c, "dw");
    CHECK_CLOSE(what, dw, fx(st, c, "dw", (size_t)D), (size_t)D, NORM_TOL,
                NORM_FLOOR);
    label(what, sizeof what, "layernorm", c, "db");
    CHECK_CLOSE(what, db, fx(st, c, "db", (size_t)D), (size_t)D, NORM_TOL,
                NORM_FLOOR);
    layernorm_ctx ctx = {new_floats(n),
                         new_floats((size_t)N),
                         new_floats((size_t)N),
                         in,
                         w,
                         b,
                         dout,
                         N,
                         D,
                         eps};
    label(what, sizeof what, "layernorm", c, "fd din");
    check_fd(what, in, n, din, layernorm_loss, &ctx, 0);
    label(what, sizeof what, "layernorm", c, "fd dw");
    check_fd(what, w, (size_t)D, dw, layernorm_loss, &ctx, 0);
    label(what, sizeof what, "layernorm", c, "fd db");
    check_fd(what, b, (size_t)D, db, layernorm_loss, &ctx, 0);
    release_all();
  }
  st_safetensors_destroy(st);
}

/* A float64 norm over `groups` of n values each (layernorm: a row, w and b
 * per element of it; groupnorm: CG channels of HW, w and b per channel):
 * out, and din, dw, db from dout, by the textbook formulas. dw and db
 * accumulate: the caller zeroes them. */
static void naive_norm(double *out, double *din, double *dw, double *db,
                       const float *in, const float *w, const float *b,
                       const float *dout, int groups, int n, int per_w, int n_w,
                       float eps) {
  for (int g = 0; g < groups; g++) {
    const float *x = in + (size_t)g * n, *dy = dout + (size_t)g * n;
    double mean = 0, var = 0, a = 0, c = 0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    double r = 1 / sqrt(var / n + eps);
    for (int i = 0; i < n; i++) {
      /* element i's w: per_w elements share one, a group holds n / per_w
       * of them, and the groups run through the n_w in order */
      int wi = (g * (n / per_w) + i / per_w) % n_w;
      double xh = (x[i] - mean) * r, dxh = dy[i] * (double)w[wi];
      out[(size_t)g * n + i] = xh * w[wi] + b[wi];
      dw[wi] += dy[i] * xh;
      db[wi] += dy[i];
      a += dxh, c += dxh * xh;
    }
    for (int i = 0; i < n; i++) {
      int wi = (g * (n / per_w) + i / per_w) % n_w;
      double xh = (x[i] - mean) * r;
      din[(size_t)g * n + i] = r * (dy[i] * (double)w[wi] - a / n - xh * c / n);
    }
  }
}

/* Layer norm and group norm on inputs whose mean is 1e4 times their spread,
 * against the float64 formulas: the backward refines the fp32 mean it is
 * handed, without which din misses by ~6e-8 * 1e4 * sqrt(n) (5e-5 measured),
 * where the offset-64 fixtures left it at 6e-7, inside the tolerance. Group
 * norm had no offset case at all. Also: layer norm's dw alone (db NULL, as
 * the header allows) is the dw of the full call. */
static void test_norm_far_offset(void) {
  enum { N = 40, D = 96, B = 3, C = 8, HW = 30, G = 2 };
  const float eps = 1e-5f;
  float *in = random_floats((size_t)N * D, 501, 1.0f);
  float *dout = random_floats((size_t)N * D, 502, 1.0f);
  float *w = random_floats(D, 503, 1.0f), *b = random_floats(D, 504, 1.0f);
  for (size_t i = 0; i < (size_t)N * D; i++) in[i] += 1e4f;
  size_t n = (size_t)N * D;
  float *out = new_floats(n), *din = new_floats(n);
  float *mean = new_floats(N), *rstd = new_floats(N);
  float *dw = new_floats(D), *db = new_floats(D), *dw2 = new_floats(D);
  double *ro = new_doubles(n), *rdin = new_doubles(n);
  double *rdw = new_doubles(D), *rdb = new_doubles(D);
  memset(rdw, 0, D * sizeof *rdw), memset(rdb, 0, D * sizeof *rdb);
  naive_norm(ro, rdin, rdw, rdb, in, w, b, dout, N, D, 1, D, eps);
  st_layernorm_forward(out, mean, rstd, in, w, b, N, D, eps);
  float *scratch = new_floats(st_layernorm_scratch_floats(N, D));
  st_layernorm_backward(NULL, din, dw, db, dout, in, w, mean, rstd, scratch, N,
                        D);
  CHECK_CLOSE("layernorm far offset out", out, to_floats(ro, n), n, NORM_TOL,
              NORM_FLOOR);
  CHECK_CLOSE("layernorm far offset din", din, to_floats(rdin, n), n, NORM_TOL,
              NORM_FLOOR);
  CHECK_CLOSE("layernorm far offset dw", dw, to_floats(rdw, D), D, NORM_TOL,
              NORM_FLOOR);
  CHECK_CLOSE("layernorm far offset db", db, to_floats(rdb, D), D, NORM_TOL,
              NORM_FLOOR);
  st_layernorm_backward(NULL, NULL, dw2, NULL, dout, in, w, mean, rstd, scratch,
                        N, D);
  CHECK(memcmp(dw2, dw, D * sizeof *dw) == 0,
        "layernorm dw alone (db NULL) differs from the full call's");

  size_t m = (size_t)B * C * HW;
  float *gin = random_floats(m, 511, 1.0f),
        *gdout = random_floats(m, 512, 1.0f);
  float *gw = random_floats(C, 513, 1.0f), *gb = random_floats(C, 514, 1.0f);
  for (size_t i = 0; i < m; i++) gin[i] += 1e4f;
  float *gout = new_floats(m), *gdin = new_floats(m);
  float *gmean = new_floats(B * G), *grstd = new_floats(B * G);
  float *gdw = new_floats(C), *gdb = new_floats(C);
  double *go = new_doubles(m), *gdin_ref = new_doubles(m);
  double *gdw_ref = new_doubles(C), *gdb_ref = new_doubles(C);
  memset(gdw_ref, 0, C * sizeof *gdw_ref),
      memset(gdb_ref, 0, C * sizeof *gdb_ref);
  /* a group: C / G channels of HW values, w and b per channel */
  naive_norm(go, gdin_ref, gdw_ref, gdb_ref, gin, gw, gb, gdout, B * G,
             (C / G) * HW, HW, C, eps);
  st_groupnorm_forward(NULL, gout, gmean, grstd, gin, gw, gb, B, C, HW, G, eps);
  memset(gdw, 0, C * sizeof *gdw), memset(gdb, 0, C * sizeof *gdb);
  st_groupnorm_backward(NULL, gdin, gdw, gdb, gdout, gin, gw, gmean, grstd, B,
                        C, HW, G);
  CHECK_CLOSE("groupnorm far offset out", gout, to_floats(go, m), m, NORM_TOL,
              NORM_FLOOR);
  CHECK_CLOSE("groupnorm far offset din", gdin, to_floats(gdin_ref, m), m,
              NORM_TOL, NORM_FLOOR);
  CHECK_CLOSE("groupnorm far offset dw", gdw, to_floats(gdw_ref, C), C,
              NORM_TOL, NORM_FLOOR);
  CHECK_CLOSE("groupnorm far offset db", gdb, to_floats(gdb_ref, C), C,
              NORM_TOL, NORM_FLOOR);
  release_all();
}

/* The backward on pools of 1 and 3 threads gives the bits of no pool: 100
 * rows are 4 blocks (the last partial), dw and db are added to. */
static void test_layernorm_threads(void) {
  enum { N = 100, D = 48 };
  st_pool *pools[3] = {NULL, st_pool_create(1), st_pool_create(3)};
  CHECK(pools[1] && pools[2], "st_pool_create failed");
  if (!pools[1] || !pools[2]) goto done;
  size_t n = (size_t)N * D;
  float *in = random_floats(n, 31, 2.0f), *dout = random_floats(n, 32, 1.0f);
  float *w = random_floats(D, 33, 1.0f), *b = random_floats(D, 34, 0.5f);
  float *mean = new_floats(N), *rstd = new_floats(N), *out = new_floats(n);
  st_layernorm_forward(out, mean, rstd, in, w, b, N, D, 1e-5f);
  float *din[3], *dw[3], *db[3];
  for (int p = 0; p < 3; p++) {
    din[p] = new_floats(n);
    dw[p] = random_floats(D, 35, 0.01f); /* a previous micro-batch */
    db[p] = random_floats(D, 36, 0.01f);
    float *part = new_floats(st_layernorm_scratch_floats(N, D));
    uint64_t allocs = st_alloc_count();
    st_layernorm_backward(pools[p], din[p], dw[p], db[p], dout, in, w, mean,
                          rstd, part, N, D);
    CHECK(st_alloc_count() == allocs, "layernorm allocated inside the kernel");
  }
  for (int p = 1; p < 3; p++) {
    const char *who = p == 1 ? "1 thread" : "3 threads";
    CHECK(memcmp(din[0], din[p], n * 4) == 0,
          "layernorm din: %s differs from no pool", who);
    CHECK(memcmp(dw[0], dw[p], D * 4) == 0,
          "layernorm dw: %s differs from no pool", who);
    CHECK(memcmp(db[0], db[p], D * 4) == 0,
          "layernorm db: %s differs from no pool", who);
  }
  /* the old serial loop's order: blocks of 32 rows, each block's sum
   * rounded to float and added to dw and db in turn */
  float *dw_ser = random_floats(D, 35, 0.01f);
  float *db_ser = random_floats(D, 36, 0.01f);
  float *din_ser = new_floats(n), *part1 = new_floats(2 * D);
  for (int r0 = 0; r0 < N; r0 += 32) {
    int rows = N - r0 < 32 ? N - r0 : 32;
    size_t at = (size_t)r0 * D;
    st_layernorm_backward(NULL, din_ser + at, dw_ser, db_ser, dout + at,
                          in + at, w, mean + r0, rstd + r0, part1, rows, D);
  }
  CHECK(memcmp(din[0], din_ser, n * 4) == 0 &&
            memcmp(dw[0], dw_ser, D * 4) == 0 &&
            memcmp(db[0], db_ser, D * 4) == 0,
        "layernorm backward differs from 32-row blocks summed in order");
  /* without dw and db no scratch is needed, and din is the same */
  float *din_only = new_floats(n);
  st_layernorm_backward(pools[2], din_only, NULL, NULL, dout, in, w, mean, rstd,
                        NULL, N, D);
  CHECK(memcmp(din[0], din_only, n * 4) == 0,
        "layernorm din without dw, db differs");
  release_all();
done:
  st_pool_destroy(pools[1]);
  st_pool_destroy(pools[2]);
}

typedef struct groupnorm_ctx {
  float *out, *mean, *rstd, *in, *w, *b, *dout;
  int B, C, HW, G;
  float eps;
} groupnorm_ctx;

/* The finite differences' context: fresh outputs, the given inputs. */
static groupnorm_ctx groupnorm_ctx_for(float *in, float *w, float *b,
                                       float *dout, int B, int C, int HW, int G,
                                       float eps) {
  size_t n = (size_t)B * C * HW, ns = (size_t)B * G;
  return (groupnorm_ctx){new_floats(n),
                         new_floats(ns),
                         new_floats(ns),
                         in,
                         w,
                         b,
                         dout,
                         B,
                         C,
                         HW,
                         G,
                         eps};
}

static double groupnorm_loss(void *p) {
  groupnorm_ctx *c = p;
  st_groupnorm_forward(NULL, c->out, c->mean, c->rstd, c->in, c->w, c->b, c->B,
                       c->C, c->HW, c->G, c->eps);
  return dot(c->out, c->dout, (size_t)c->B * c->C * c->HW);
}

static void test_groupnorm(void) {
  st_safetensors *st = open_fixture("groupnorm");
  if (!st) return;
  const char *cases[] = {"g2", "gc", "g1"};
  for (int k = 0; k < 3; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 4);
    int B = d[0], C = d[1], HW = d[2], G = d[3];
    size_t n = (size_t)B * C * HW, ns = (size_t)B * G;
    float eps = fx(st, c, "eps", 1)[0];
    float *in = fx(st, c, "in", n), *w = fx(st, c, "w", (size_t)C);
    float *b = fx(st, c, "b", (size_t)C), *dout = fx(st, c, "dout", n);
    float *out = new_floats(n), *din = new_floats(n);
    float *mean = new_floats(ns), *rstd = new_floats(ns);
    float *dw = new_floats((size_t)C), *db = new_floats((size_t)C);
    st_groupnorm_forward(NULL, out, mean, rstd, in, w, b, B, C, HW, G, eps);
    st_groupnorm_backward(NULL, din, dw, db, dout, in, w, mean, rstd, B, C, HW,
                          G);
    /* on 3 threads: the same bits (tasks are samples x groups forward,
     * groups backward, each made as one thread makes it); dw and db add
     * onto what is there, as a step's micro-batches do */
    {
      st_pool *three = st_pool_create(3);
      float *o3 = new_floats(n), *m3 = new_floats(ns), *r3 = new_floats(ns);
      float *d3 = new_floats(n), *w3 = new_floats((size_t)C),
            *b3 = new_floats((size_t)C);
      st_groupnorm_forward(three, o3, m3, r3, in, w, b, B, C, HW, G, eps);
      st_groupnorm_backward(three, d3, w3, b3, dout, in, w, m3, r3, B, C, HW,
                            G);
      CHECK(three && !memcmp(o3, out, n * 4) && !memcmp(m3, mean, ns * 4) &&
                !memcmp(r3, rstd, ns * 4) && !memcmp(d3, din, n * 4) &&
                !memcmp(w3, dw, (size_t)C * 4) &&
                !memcmp(b3, db, (size_t)C * 4),
            "groupnorm %s: 3 threads not the bits of the caller alone", c);
      st_pool_destroy(three);
    }
    label(what, sizeof what, "groupnorm", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", n), n, NORM_TOL, NORM_FLOOR);
    label(what, sizeof what, "groupnorm", c, "mean");
    CHECK_CLOSE(what, mean, fx(st, c, "mean", ns), ns, 1e-6, 1e-3);
    label(what, sizeof what, "groupnorm", c, "rstd");
    CHECK_CLOSE(what, rstd, fx(st, c, "rstd", ns), ns, 1e-6, 1e-3);
    label(what, sizeof what, "groupnorm", c, "din");
    CHECK_CLOSE(what, din, fx(st, c, "din", n), n, NORM_TOL, NORM_FLOOR);
    label(what, sizeof what, "groupnorm", c, "dw");
    CHECK_CLOSE(what, dw, fx(st, c, "dw", (size_t)C), (size_t)C, NORM_TOL,
                NORM_FLOOR);
    label(what, sizeof what, "groupnorm", c, "db");
    CHECK_CLOSE(what, db, fx(st, c, "db", (size_t)C), (size_t)C, NORM_TOL,
                NORM_FLOOR);
    groupnorm_ctx ctx = groupnorm_ctx_for(in, w, b, dout, B, C, HW, G, eps);
    label(what, sizeof what, "groupnorm", c, "fd din");
    check_fd(what, in, n, din, groupnorm_loss, &ctx, 0);
    label(what, sizeof what, "groupnorm", c, "fd dw");
    check_fd(what, w, (size_t)C, dw, groupnorm_loss, &ctx, 0);
    label(what, sizeof what, "groupnorm", c, "fd db");
    check_fd(what, b, (size_t)C, db, groupnorm_loss, &ctx, 0);
    release_all();
  }
  st_safetensors_destroy(st);
  /* past one block of samples (norm.c works in blocks of 32), dw and db
   * added onto what is there: 40 samples, 2 groups, on 3 threads; the
   * gradients against finite differences and against the caller alone */
  {
    enum { B = 40, C = 6, HW = 5, G = 2 };
    size_t n = (size_t)B * C * HW, ns = (size_t)B * G;
    float *in = random_floats(n, 71, 1.0f), *w = random_floats(C, 72, 1.0f);
    float *b = random_floats(C, 73, 1.0f), *dout = random_floats(n, 74, 1.0f);
    float *out = new_floats(n), *mean = new_floats(ns), *rstd = new_floats(ns);
    float *din = new_floats(n), *din1 = new_floats(n);
    float *dw = random_floats(C, 75, 1.0f), *db = random_floats(C, 76, 1.0f);
    float *dw1 = new_floats(C), *db1 = new_floats(C);
    float *gw = new_floats(C), *gb = new_floats(C);
    memcpy(dw1, dw, C * 4), memcpy(db1, db, C * 4);
    memcpy(gw, dw, C * 4), memcpy(gb, db, C * 4);
    st_pool *three = st_pool_create(3);
    st_groupnorm_forward(three, out, mean, rstd, in, w, b, B, C, HW, G, 1e-5f);
    st_groupnorm_backward(three, din, dw, db, dout, in, w, mean, rstd, B, C, HW,
                          G);
    st_groupnorm_backward(NULL, din1, dw1, db1, dout, in, w, mean, rstd, B, C,
                          HW, G);
    CHECK(three && !memcmp(din, din1, n * 4) && !memcmp(dw, dw1, C * 4) &&
              !memcmp(db, db1, C * 4),
          "groupnorm, 40 samples: 3 threads not the bits of the caller alone");
    for (int c = 0; c < C; c++) gw[c] = dw[c] - gw[c], gb[c] = db[c] - gb[c];
    groupnorm_ctx ctx = groupnorm_ctx_for(in, w, b, dout, B, C, HW, G, 1e-5f);
    check_fd("groupnorm 40 samples fd din", in, n, din, groupnorm_loss, &ctx,
             n - 7);
    check_fd("groupnorm 40 samples fd dw (added)", w, C, gw, groupnorm_loss,
             &ctx, 0);
    check_fd("groupnorm 40 samples fd db (added)", b, C, gb, groupnorm_loss,
             &ctx, 0);
    st_pool_destroy(three);
    release_all();
  }
}

/* -------------------------------------------------------------- dropout */

/* Element i's keep bit in a mask of n-element samples. */
static int kept_bit(const uint32_t *mask, size_t n, size_t i) {
  size_t s = i / n, j = i % n;
  return mask[s * st_dropout_mask_words(n) + j / 32] >> (j % 32) & 1;
}

static uint32_t *new_mask(int B, size_t n) {
  return (uint32_t *)new_floats((size_t)B * st_dropout_mask_words(n));
}

static void test_dropout(void) {
  const float p = 0.3f, scale = 1.0f / (1.0f - p);
  const uint64_t seed = 1234;
  const uint32_t layer = 7;

  /* Kept fraction over B*n = 400,000 draws: binomial, sigma =
   * sqrt(N p (1-p)) ~ 290 (~7e-4 of the mean); 6 sigma bounds a false
   * failure at ~2e-9 for a correct RNG. Each of the four Philox words
   * (j mod 4) is checked on its own (N/4, sigma ~ 145). */
  {
    int B = 4;
    size_t n = 100000, N = (size_t)B * n;
    float *in = random_floats(N, 31, 1.0f);
    float *out = new_floats(N);
    uint32_t *mask = new_mask(B, n);
    st_dropout_forward(out, mask, in, B, n, p, seed, layer, 0);
    size_t kept = 0, kept_lane[4] = {0}, exact = 0;
    for (size_t i = 0; i < N; i++) {
      int keep_i = kept_bit(mask, n, i);
      kept += (size_t)keep_i;
      kept_lane[(i % n) % 4] += (size_t)keep_i;
      /* out is exactly in * 1/(1-p) where kept, else 0 */
      exact += out[i] == in[i] * (keep_i ? scale : 0.0f);
    }
    double expect = (double)N * (1.0 - p),
           sigma = sqrt((double)N * p * (1.0 - p));
    CHECK(fabs((double)kept - expect) <= 6 * sigma,
          "dropout kept %zu of %zu, expected %.0f +- %.0f", kept, N, expect,
          6 * sigma);
    for (int l = 0; l < 4; l++)
      CHECK(fabs((double)kept_lane[l] - expect / 4) <= 6 * sigma / 2,
            "dropout lane %d kept %zu, expected %.0f", l, kept_lane[l],
            expect / 4);
    CHECK(exact == N, "dropout: %zu of %zu elements not 0 or in/(1-p)",
          N - exact, N);
    if (getenv("STRATA_TEST_VERBOSE"))
      fprintf(stderr, "  dropout kept fraction %.5f (expected %.5f +- %.5f)\n",
              (double)kept / N, 1.0 - p, 6 * sigma / N);
    release_all();
  }

  /* The mask of global sample k does not depend on the batch split; n = 37
   * is not a multiple of 4 (the last Philox block is cut short) and takes
   * two mask words a sample, the second partial. */
  {
    size_t n = 37, w = st_dropout_mask_words(n);
    int B = 6;
    CHECK(w == 2, "37 elements in %zu mask words, want 2", w);
    float *in = random_floats((size_t)B * n, 32, 1.0f);
    float *out = new_floats((size_t)B * n), *out2 = new_floats((size_t)B * n);
    uint32_t *mask = new_mask(B, n), *mask2 = new_mask(B, n);
    st_dropout_forward(out, mask, in, B, n, p, seed, layer, 100);
    st_dropout_forward(out2, mask2, in, 2, n, p, seed, layer, 100);
    st_dropout_forward(out2 + 2 * n, mask2 + 2 * w, in + 2 * n, 1, n, p, seed,
                       layer, 102);
    st_dropout_forward(out2 + 3 * n, mask2 + 3 * w, in + 3 * n, 3, n, p, seed,
                       layer, 103);
    CHECK(memcmp(mask, mask2, (size_t)B * w * 4) == 0,
          "dropout mask depends on the batch split");
    CHECK(memcmp(out, out2, (size_t)B * n * 4) == 0,
          "dropout out depends on the batch split");

    /* Another layer, seed or sample gives another mask. */
    float *tmp = new_floats((size_t)B * n);
    uint32_t *other = new_mask(B, n);
    st_dropout_forward(tmp, other, in, B, n, p, seed, layer + 1, 100);
    CHECK(memcmp(mask, other, (size_t)B * w * 4) != 0,
          "dropout: layers share a mask");
    st_dropout_forward(tmp, other, in, B, n, p, seed + 1, layer, 100);
    CHECK(memcmp(mask, other, (size_t)B * w * 4) != 0,
          "dropout: seeds share a mask");
    CHECK(memcmp(mask, mask + w, w * 4) != 0, "dropout: samples share a mask");

    /* Backward is exactly dout times the forward's factor. */
    float *dout = random_floats((size_t)B * n, 33, 1.0f);
    float *din = new_floats((size_t)B * n);
    st_dropout_backward(din, dout, mask, B, n, p);
    int ok = 1;
    for (size_t i = 0; i < (size_t)B * n; i++)
      ok &= din[i] == dout[i] * (kept_bit(mask, n, i) ? scale : 0.0f) &&
            (out[i] == 0.0f || kept_bit(mask, n, i));
    CHECK(ok, "dropout backward is not dout * 1/(1-p) where kept, else 0");

    /* p = 0: identity, every bit set; the backward passes dout through. */
    st_dropout_forward(out, mask, in, B, n, 0.0f, seed, layer, 100);
    st_dropout_backward(din, dout, mask, B, n, 0.0f);
    ok = memcmp(out, in, (size_t)B * n * 4) == 0 &&
         memcmp(din, dout, (size_t)B * n * 4) == 0;
    for (size_t i = 0; i < (size_t)B * n; i++) ok &= kept_bit(mask, n, i);
    CHECK(ok, "dropout p=0 is not the identity with every bit set");

    /* p = 1 drops everything (as PyTorch), with no 1/0 scale. */
    st_dropout_forward(out, mask, in, B, n, 1.0f, seed, layer, 100);
    st_dropout_backward(din, dout, mask, B, n, 1.0f);
    ok = 1;
    for (size_t i = 0; i < (size_t)B * n; i++)
      ok &= out[i] == 0.0f && din[i] == 0.0f && !kept_bit(mask, n, i);
    CHECK(ok, "dropout p=1 does not drop everything");
    release_all();
  }
}

/* ----------------------------------------------------------------- costs */

static void test_costs(void) {
  st_cost c = st_maxpool_cost(32, 28, 28, 2, 2);
  CHECK(c.act_bytes == 8.0 * 32 * 14 * 14, "maxpool keeps out + idx");
  c = st_avgpool_cost(32, 28, 28, 2, 2);
  CHECK(c.act_bytes == 4.0 * 32 * 14 * 14 && c.param_bytes == 0,
        "avgpool cost");
  c = st_layernorm_cost(256);
  CHECK(c.param_bytes == 8.0 * 256, "layernorm params w and b");
  c = st_groupnorm_cost(32, 196, 8);
  CHECK(c.param_bytes == 8.0 * 32, "groupnorm params w and b");
  c = st_dropout_cost(1000);
  /* out, and a mask bit per element: 32 words */
  CHECK(c.act_bytes == 4000.0 + 4.0 * 32, "dropout keeps out + mask");

  /* The pooling and pointwise FLOPs by hand (pooling.c, activation.c): the
   * plan's block costs add these up, so a test that compared a block with
   * the same functions could not see a wrong term. Max 3x3 stride 2 on
   * 28x28 gives 13x13 (floor(25 / 2) + 1) a channel, 8 x 169 = 1352
   * outputs: 9 compares each forward, one add each backward. Average: the
   * 9 adds and the division, both ways. Pointwise: per element. */
  c = st_maxpool_cost(8, 28, 28, 3, 2);
  CHECK(c.flops_fwd == 1352.0 * 9 && c.flops_bwd == 1352.0,
        "maxpool 8x28x28 k3s2 FLOPs %g %g, by hand 12168 1352", c.flops_fwd,
        c.flops_bwd);
  c = st_avgpool_cost(8, 28, 28, 3, 2);
  CHECK(c.flops_fwd == 1352.0 * 10 && c.flops_bwd == 1352.0 * 10,
        "avgpool 8x28x28 k3s2 FLOPs %g %g, by hand 13520 13520", c.flops_fwd,
        c.flops_bwd);
  c = st_pointwise_cost(1000, 20, 30);
  CHECK(c.flops_fwd == 20000.0 && c.flops_bwd == 30000.0 && c.param_bytes == 0,
        "pointwise 1000 at 20/30 FLOPs: %g %g", c.flops_fwd, c.flops_bwd);
}

int main(void) {
  st_blas_init();
  test_linear();
  test_linear_layouts();
  test_relu();
  test_gelu();
  test_xent();
  test_xent_widths();
  test_linear_xent();
  test_xent_first_largest();
  test_conv2d_fixtures();
  test_conv2d_naive();
  test_conv2d_determinism();
  test_conv2d_cost();
  test_xent_cost();
  test_linear_xent_cost();
  test_maxpool();
  test_maxpool_special();
  test_pool_untiled();
  test_norm_far_offset();
  test_avgpool();
  test_layernorm();
  test_layernorm_wide();
  test_layernorm_threads();
  test_groupnorm();
  test_dropout();
  test_costs();
  TH_DONE();
}
