/*
 * test_gemm_bf16.c — st_gemm_bf16 (train.precision: bf16) against two
 * references written here from the definition in src/base/gemm_bf16.c's
 * header, for every transpose pair, alpha and beta, shapes that cut
 * register blocks, tiles, K blocks (KC = 512 pairs) and chunks (4096 rows
 * or columns) anywhere.
 *
 * 1. The rounding: bf16 of each input, found by comparing its two bf16
 *    neighbours in double (tests/bf16_ref.h, not the kernel's
 *    add-and-shift), ties to the even one, subnormals to zero.
 * 2. Bit for bit: each element is the fmaf chain over pairs, odd product
 *    first, from beta C (alpha 1) or 0, on the rounded inputs. This pins
 *    the order, the pairing and the rounding at once; the native kernel
 *    (VDPBF16PS, where the CPU has it) and the emulated one must both
 *    give exactly it.
 * 3. In double: the sum of the rounded inputs' exact products, within
 *    1e-5 of the sum of the terms' magnitudes (as test_gemm.c: fp32 sums
 *    of K <= 1100 terms of random sign err far below that). The same data
 *    multiplied in fp32 without rounding miss this reference by more than
 *    the tolerance (checked below), so a kernel that skipped the rounding
 *    would fail it.
 * A linear layer's forward, weight and input gradients run through it
 * (against the same double sums); its bias gradient stays an fp32 sum.
 * Where AMX's tiles run the products, whose sums are not the chain's
 * (gemm_bf16.c), they are held to 3 (and to every invariance below), and
 * must differ from 2 somewhere; then 1-3 again with the tiles off.
 * Also: the bits do not depend on the pool (none, 1, 2, 3 threads), nor on
 * splitting the rows or the columns into two calls; nothing outside C's window
 * is written; beta 0 ignores a NaN in C; st_gemm and st_gemm_bias run this
 * product when st_gemm_set_bf16(1), and fp32 again after (0).
 */
#include "harness.h"
#include "bf16_ref.h"
#include "strata.h"

#include <float.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* xorshift, in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) / (double)(1 << 23)) - 1.0f;
}

/* The bf16 value nearest x (bf16_ref.h), a subnormal x a zero of its
 * sign, as the product rounds its inputs. */
static float bf16_ref(float x) {
  if (fpclassify(x) == FP_SUBNORMAL) return signbit(x) ? -0.0f : 0.0f;
  return from_bits((uint32_t)nearest_reference(x) << 16);
}

enum { PAD = 3 };
static const float SENTINEL = 1234.5f;

typedef struct shape {
  int ta, tb, M, N, K;
} shape;

typedef struct operands {
  int M, N, K, lda, ldb, ldc, ta, tb;
  float *A, *B, *C0;
} operands;

static float op_a(const operands *o, int i, int k) {
  return o->ta ? o->A[(size_t)k * o->lda + i] : o->A[(size_t)i * o->lda + k];
}
static float op_b(const operands *o, int k, int j) {
  return o->tb ? o->B[(size_t)j * o->ldb + k] : o->B[(size_t)k * o->ldb + j];
}

/* Reference 2: the chain. */
static float chain(const operands *o, int i, int j, float alpha, float beta) {
  float c = o->C0[(size_t)i * o->ldc + j];
  float s = alpha == 1.0f && beta != 0.0f ? beta * c : 0.0f;
  for (int k = 0; k < o->K; k += 2) {
    float a1 = 0, b1 = 0;
    if (k + 1 < o->K)
      a1 = bf16_ref(op_a(o, i, k + 1)), b1 = bf16_ref(op_b(o, k + 1, j));
    s = fmaf(a1, b1, s);
    s = fmaf(bf16_ref(op_a(o, i, k)), bf16_ref(op_b(o, k, j)), s);
  }
  if (alpha != 1.0f) s = beta == 0.0f ? s * alpha : s * alpha + beta * c;
  return s;
}

/* Reference 3: exact products of the rounded inputs summed in double
 * (unrounded with round 0); *mag gets the sum of the terms' magnitudes. */
static double in_double(const operands *o, int i, int j, float alpha,
                        float beta, int round, double *mag) {
  double s = 0, m = 0;
  for (int k = 0; k < o->K; k++) {
    float a = op_a(o, i, k), b = op_b(o, k, j);
    double t = round ? (double)bf16_ref(a) * bf16_ref(b) : (double)a * b;
    s += t, m += fabs(t);
  }
  double c = beta == 0.0f ? 0 : (double)beta * o->C0[(size_t)i * o->ldc + j];
  *mag = fabs(alpha) * m + fabs(c);
  return alpha * s + c;
}

static void fill(operands *o, const shape *s) {
  o->M = s->M, o->N = s->N, o->K = s->K, o->ta = s->ta, o->tb = s->tb;
  int a_rows = s->ta ? s->K : s->M, a_cols = s->ta ? s->M : s->K;
  int b_rows = s->tb ? s->N : s->K, b_cols = s->tb ? s->K : s->N;
  o->lda = a_cols + PAD, o->ldb = b_cols + PAD, o->ldc = s->N + PAD;
  size_t na = (size_t)a_rows * o->lda, nb = (size_t)b_rows * o->ldb,
         nc = (size_t)s->M * o->ldc;
  /* each operand followed by a row of NaN, as a product of rows inside a
   * larger buffer (a weight gradient's dout and input, K = the batch
   * rows) has its neighbours' values there: a read past the last row of
   * op(A) or op(B) (an odd K's last pair taking row K) poisons C */
  o->A = malloc((na + o->lda) * 4), o->B = malloc((nb + o->ldb) * 4);
  o->C0 = malloc(nc * 4);
  for (size_t i = 0; i < na; i++) o->A[i] = uniform();
  for (size_t i = 0; i < nb; i++) o->B[i] = uniform();
  for (int i = 0; i < o->lda; i++) o->A[na + i] = NAN;
  for (int i = 0; i < o->ldb; i++) o->B[nb + i] = NAN;
  for (size_t i = 0; i < nc; i++)
    o->C0[i] = (i % o->ldc) < (size_t)s->N ? uniform() : SENTINEL;
  /* ties: inputs exactly half-way between two bf16 values, both parities */
  o->A[0] = from_bits(0x3F808000u); /* 1.00390625: rounds down (even) */
  if (na > 1) o->A[1] = from_bits(0x3F818000u); /* rounds up (to even) */
}

static void release(operands *o) { free(o->A), free(o->B), free(o->C0); }

static float *run(const operands *o, st_pool *pool, float alpha, float beta) {
  size_t nc = (size_t)o->M * o->ldc;
  float *C = malloc(nc * 4);
  memcpy(C, o->C0, nc * 4);
  st_gemm_bf16(pool, o->ta, o->tb, o->M, o->N, o->K, alpha, o->A, o->lda, o->B,
               o->ldb, beta, C, o->ldc);
  return C;
}

/* Whether the product run with set(1) (set(0) after) has C's bits. */
static int same_with(void (*set)(int), const operands *o, st_pool *pool,
                     float alpha, float beta, const float *C) {
  set(1);
  float *D = run(o, pool, alpha, beta);
  set(0);
  int same = memcmp(C, D, (size_t)o->M * o->ldc * 4) == 0;
  free(D);
  return same;
}

/* 1 while AMX's tiles run the products (st_bf16_tiles): their sums are
 * not the chain's (gemm_bf16.c), so the chain and the one-element path are
 * not asked of them; the double reference, the pools and the splits are.
 * chain_differs counts their elements off the chain, to show they ran. */
static int under_tiles;
static long chain_differs;

static void check_shape(const shape *s, float alpha, float beta,
                        st_pool **pools, int npools) {
  operands o;
  fill(&o, s);
  char what[128];
  snprintf(what, sizeof what, "ta %d tb %d %dx%dx%d alpha %g beta %g", s->ta,
           s->tb, s->M, s->N, s->K, alpha, beta);
  float *C = run(&o, NULL, alpha, beta);
  long differ = 0, outside = 0;
  double worst = 0, worst_unrounded = 0;
  for (int i = 0; i < o.M; i++) {
    for (int j = 0; j < o.ldc; j++) {
      float got = C[(size_t)i * o.ldc + j];
      if (j >= o.N) {
        outside += got != SENTINEL;
        continue;
      }
      differ += bits(got) != bits(chain(&o, i, j, alpha, beta));
      double mag, ref = in_double(&o, i, j, alpha, beta, 1, &mag);
      double r = fabs(got - ref) / (mag > 1e-30 ? mag : 1e-30);
      if (!(r <= worst)) worst = r;
    }
  }
  if (under_tiles)
    chain_differs += differ;
  else
    CHECK(differ == 0, "%s: %ld elements differ from the chain", what, differ);
  CHECK(outside == 0, "%s: %ld writes outside C's window", what, outside);
  CHECK(worst <= 1e-5, "%s: %.3g of the terms' magnitude off the double sum",
        what, worst);
  /* the fp32 product of the unrounded inputs is far from this reference
   * (so rounding is what the checks above see), at K of 64 or more */
  if (s->K >= 64 && s->M * s->N >= 64) {
    float *F = malloc((size_t)o.M * o.ldc * 4);
    memcpy(F, o.C0, (size_t)o.M * o.ldc * 4);
    st_gemm(NULL, o.ta, o.tb, o.M, o.N, o.K, alpha, o.A, o.lda, o.B, o.ldb,
            beta, F, o.ldc);
    for (int i = 0; i < o.M; i++)
      for (int j = 0; j < o.N; j++) {
        double mag, ref = in_double(&o, i, j, alpha, beta, 1, &mag);
        double r = fabs(F[(size_t)i * o.ldc + j] - ref) / mag;
        if (r > worst_unrounded) worst_unrounded = r;
      }
    CHECK(worst_unrounded > 1e-4,
          "%s: fp32 without rounding only %.3g off: the data cannot tell", what,
          worst_unrounded);
    free(F);
  }
  for (int p = 0; p < npools; p++) {
    float *D = run(&o, pools[p], alpha, beta);
    CHECK(memcmp(C, D, (size_t)o.M * o.ldc * 4) == 0,
          "%s: bits differ on a pool of %d", what, st_pool_threads(pools[p]));
    free(D);
  }
  /* the rows in two calls */
  if (o.M >= 2 && !o.ta) {
    int h = o.M / 2 + 1;
    float *D = malloc((size_t)o.M * o.ldc * 4);
    memcpy(D, o.C0, (size_t)o.M * o.ldc * 4);
    st_gemm_bf16(pools[0], 0, o.tb, h, o.N, o.K, alpha, o.A, o.lda, o.B, o.ldb,
                 beta, D, o.ldc);
    st_gemm_bf16(pools[0], 0, o.tb, o.M - h, o.N, o.K, alpha,
                 o.A + (size_t)h * o.lda, o.lda, o.B, o.ldb, beta,
                 D + (size_t)h * o.ldc, o.ldc);
    CHECK(memcmp(C, D, (size_t)o.M * o.ldc * 4) == 0,
          "%s: bits differ with the rows in two calls", what);
    free(D);
  }
  /* the columns in two calls */
  if (o.N >= 2) {
    int h = o.N / 2 + 1;
    float *D = malloc((size_t)o.M * o.ldc * 4);
    memcpy(D, o.C0, (size_t)o.M * o.ldc * 4);
    st_gemm_bf16(pools[1], o.ta, o.tb, o.M, h, o.K, alpha, o.A, o.lda, o.B,
                 o.ldb, beta, D, o.ldc);
    st_gemm_bf16(pools[1], o.ta, o.tb, o.M, o.N - h, o.K, alpha, o.A, o.lda,
                 o.tb ? o.B + (size_t)h * o.ldb : o.B + h, o.ldb, beta, D + h,
                 o.ldc);
    CHECK(memcmp(C, D, (size_t)o.M * o.ldc * 4) == 0,
          "%s: bits differ with the columns in two calls", what);
    free(D);
  }
  /* without the packing scratch (one element at a time; under the tiles,
   * one tile at a time): the same bits */
  CHECK(same_with(st_bf16_set_plain, &o, pools[npools - 1], alpha, beta, C),
        "%s: without the packing scratch, the bits differ from the kernel's",
        what);
  if (strncmp(st_bf16_support(), "AVX512", 6) == 0)
    CHECK(
        same_with(st_bf16_set_emulated, &o, pools[npools - 1], alpha, beta, C),
        "%s: the emulated kernel's bits differ from the native one's", what);
  free(C);
  release(&o);
}

/* A calibration profile's preference for the emulation: taken while
 * subnormals are flushed (the same bits as the instruction, checked in
 * check_shape), never with them kept, and only where the build has the
 * instruction to prefer it to. */
static void check_preference(const shape *sh, st_pool *pool) {
#if defined(__AVX512BF16__) /* the build has the instruction */
  int built = 1;
#else
  int built = 0;
#endif
  CHECK(st_bf16_native() == built, "native %d in a build with%s AVX512-BF16",
        st_bf16_native(), built ? "" : "out");
  st_bf16_prefer_emulated(1);
  CHECK(!st_bf16_native() &&
            (!built || strstr(st_bf16_support(), "calibration profile")),
        "the profile's preference not taken with subnormals flushed: %s",
        st_bf16_support());
  operands o;
  fill(&o, sh);
  float *E = run(&o, pool, 1.0f, 0.0f);
  st_fp_set_flush(0);
  CHECK(st_bf16_native() == built,
        "with subnormals kept the instruction did not run (%s)",
        st_bf16_support());
  st_fp_set_flush(1);
  st_bf16_prefer_emulated(0);
  float *N = run(&o, pool, 1.0f, 0.0f);
  CHECK(memcmp(E, N, (size_t)o.M * o.ldc * 4) == 0,
        "the preferred emulation's bits differ from the instruction's");
  CHECK(st_bf16_native() == built, "the preference outlived its reset");
  free(E), free(N);
  release(&o);
}

static void check_rounding(void) {
  /* the reference against hand-picked cases */
  CHECK(bf16_ref(from_bits(0x3F808000u)) == 1.0f, "tie rounds to even (down)");
  CHECK(bits(bf16_ref(from_bits(0x3F818000u))) == 0x3F820000u,
        "tie rounds to even (up)");
  CHECK(bits(bf16_ref(from_bits(0x3F808001u))) == 0x3F810000u,
        "above the tie rounds up");
  CHECK(bf16_ref(FLT_MIN / 4) == 0.0f && signbit(bf16_ref(-FLT_MIN / 4)),
        "subnormals become signed zeros");
  CHECK(isinf(bf16_ref(FLT_MAX)), "FLT_MAX rounds to infinity");
  /* one element products: the kernel's rounding of every kind of input */
  float xs[] = {1.0f,
                from_bits(0x3F808000u),
                from_bits(0x3F818000u),
                -3.14159f,
                1e-30f,
                FLT_MIN / 8,
                -FLT_MIN / 3,
                65504.7f,
                FLT_MAX,
                0.1f,
                from_bits(0x7F800001u), /* NaN, its payload in the low half */
                from_bits(0xFF800001u)};
  int n = sizeof xs / sizeof *xs, bad = 0;
  /* op(A) packed along k (one at a time) and along r (16 lanes) */
  for (int ta = 0; ta < 2; ta++)
    for (int i = 0; i < n; i++) {
      float one = 1.0f, c = 0.0f;
      st_gemm_bf16(NULL, ta, 0, 1, 1, 1, 1.0f, &xs[i], 1, &one, 1, 0.0f, &c, 1);
      int ok = isnan(xs[i]) ? isnan(c) /* not infinity */
                            : bits(c) == bits(bf16_ref(xs[i])) ||
                                  (c == 0.0f && bf16_ref(xs[i]) == 0.0f);
      if (!ok)
        bad++, fprintf(stderr, "  %a -> %a, want %a (ta %d)\n", xs[i], c,
                       bf16_ref(xs[i]), ta);
    }
  CHECK(bad == 0, "%d inputs rounded unlike the reference (%s)", bad,
        st_bf16_support());
  /* the same inputs in a row of K = 64 (zeros but one, at an even or an
   * odd k), times ones: each operand packed along k (16 pairs at a time)
   * and along r (two k rows interleaved), as op(A) and as op(B) */
  enum { KR = 64 };
  float row[KR], ones[KR];
  for (int k = 0; k < KR; k++) ones[k] = 1.0f;
  bad = 0;
  for (int side = 0; side < 2; side++)
    for (int t = 0; t < 2; t++)
      for (int i = 0; i < n; i++) {
        int at = (7 * i + side + t) % KR;
        for (int k = 0; k < KR; k++) row[k] = k == at ? xs[i] : 0.0f;
        const float *a = side ? ones : row, *b = side ? row : ones;
        float c = 0.0f;
        /* 1 x 1 products: op(A) is a row (ta 0, along k; ta 1, along r
         * with lda 1) and op(B) a column (tb 1, along k; tb 0, along r) */
        st_gemm_bf16(NULL, t, !t, 1, 1, KR, 1.0f, a, t ? 1 : KR, b, t ? 1 : KR,
                     0.0f, &c, 1);
        int ok = isnan(xs[i]) ? isnan(c)
                              : bits(c) == bits(bf16_ref(xs[i])) ||
                                    (c == 0.0f && bf16_ref(xs[i]) == 0.0f);
        if (!ok)
          bad++, fprintf(stderr, "  %a at k %d -> %a, want %a (%s, ta %d)\n",
                         xs[i], at, c, bf16_ref(xs[i]), side ? "B" : "A", t);
      }
  CHECK(bad == 0, "%d inputs in a row of %d rounded unlike the reference (%s)",
        bad, KR, st_bf16_support());
}

/* st_bf16_pack_as_gemm (activations kept as bf16): each value is the
 * reference's rounding (what the kernel does to an input), widening and
 * packing again changes nothing, over the edge cases (the largest
 * subnormal, which plain rounding to nearest would carry up to FLT_MIN,
 * NaN, infinities, ties) and 100,003 random bit patterns (a tail past the
 * vector chunks), on a pool. */
static void check_keep(st_pool *pool) {
  enum { N = 100003 };
  float *x = malloc(N * sizeof *x), *back = malloc(N * sizeof *back);
  uint16_t *h = malloc(N * sizeof *h), *again = malloc(N * sizeof *again);
  const uint32_t edges[] = {0x807FFFFFu, 0x7F800001u, 0x3F818000u, 0x00800000u,
                            0x7F800000u, 0xFF800000u, 0x7FC00001u, 0x007FFFFFu,
                            0x3F808000u, 0x00000001u, 0x7F7FFFFFu, 0x80000000u};
  uint32_t state = 12345u;
  for (int i = 0; i < N; i++) {
    state = state * 1664525u + 1013904223u;
    /* the edges first (vector lanes) and last (the scalar tail, 3: a
     * negative subnormal, a NaN with its payload in the low half, a tie) */
    uint32_t u = i < 12       ? edges[i]
                 : i >= N - 3 ? edges[N - 1 - i]
                              : state ^ (state << 13);
    x[i] = from_bits(u);
  }
  st_bf16_pack_as_gemm(pool, x, h, N);
  st_bf16_unpack_pool(pool, h, back, N);
  st_bf16_pack_as_gemm(pool, back, again, N);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    /* by the bits: under DAZ a subnormal compares equal to zero */
    uint32_t u = bits(x[i]), got = bits(back[i]);
    int zero = (u & 0x7F800000u) == 0;
    float want = zero ? from_bits(u & 0x80000000u) : bf16_ref(x[i]);
    int ok = (u & 0x7FFFFFFFu) > 0x7F800000u
                 ? (got & 0x7FFFFFFFu) > 0x7F800000u /* NaN stays NaN */
                 : got == bits(want);
    if (!ok && bad++ < 5)
      fprintf(stderr, "  %a kept as %a, the kernel's %a\n", x[i], back[i],
              want);
  }
  CHECK(bad == 0, "%d values kept unlike the kernel rounds them (%s)", bad,
        st_bf16_support());
  CHECK(memcmp(h, again, N * sizeof *h) == 0,
        "a kept value widened and kept again changed");
  free(x), free(back), free(h), free(again);
}

static void check_routing(st_pool *pool) {
  shape s = {0, 1, 37, 45, 70};
  operands o;
  fill(&o, &s);
  size_t nc = (size_t)o.M * o.ldc;
  float *want = run(&o, pool, 1.0f, 1.0f);
  float *C = malloc(nc * 4), *bias = malloc((size_t)o.N * 4);
  for (int j = 0; j < o.N; j++) bias[j] = uniform();
  st_gemm_set_bf16(1);
  CHECK(st_gemm_bf16_on(), "bf16 on");
  memcpy(C, o.C0, nc * 4);
  st_gemm(pool, 0, 1, o.M, o.N, o.K, 1.0f, o.A, o.lda, o.B, o.ldb, 1.0f, C,
          o.ldc);
  CHECK(memcmp(C, want, nc * 4) == 0, "st_gemm runs the bf16 product");
  memcpy(C, o.C0, nc * 4);
  st_gemm_bias(pool, 0, 1, o.M, o.N, o.K, o.A, o.lda, o.B, o.ldb, bias, C,
               o.ldc);
  float *filled = malloc(nc * 4);
  memcpy(filled, o.C0, nc * 4);
  for (int i = 0; i < o.M; i++)
    memcpy(filled + (size_t)i * o.ldc, bias, (size_t)o.N * 4);
  st_gemm_bf16(pool, 0, 1, o.M, o.N, o.K, 1.0f, o.A, o.lda, o.B, o.ldb, 1.0f,
               filled, o.ldc);
  CHECK(memcmp(C, filled, nc * 4) == 0,
        "st_gemm_bias: the bias, then the bf16 product added");
  st_gemm_set_bf16(0);
  memcpy(C, o.C0, nc * 4);
  st_gemm(pool, 0, 1, o.M, o.N, o.K, 1.0f, o.A, o.lda, o.B, o.ldb, 1.0f, C,
          o.ldc);
  CHECK(memcmp(C, want, nc * 4) != 0, "fp32 again once bf16 is off");
  free(want), free(C), free(bias), free(filled);
  release(&o);
}

/* A linear layer in bf16 against double sums of its rounded operands:
 * out = b + in W^T; dW (accumulated onto what it held) += dout^T in;
 * din = dout W; the bias gradient, a sum rather than a product, from the
 * unrounded dout. Tolerance 1e-5 of the terms' magnitudes, as above. */
static double worst_of(const float *got, const double *want, const double *mag,
                       size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) {
    double r = fabs(got[i] - want[i]) / (mag[i] > 1e-30 ? mag[i] : 1e-30);
    if (!(r <= w)) w = r;
  }
  return w;
}

static void check_linear(st_pool *pool) {
  enum { B = 5, IC = 70, OC = 33 };
  static float in[B * IC], w[OC * IC], b[OC], dout[B * OC], out[B * OC],
      din[B * IC], dw[OC * IC], db[OC], dw0[OC * IC], db0[OC];
  static double want[OC * IC], mag[OC * IC];
  for (int i = 0; i < B * IC; i++) in[i] = uniform();
  for (int i = 0; i < OC * IC; i++)
    w[i] = uniform(), dw0[i] = dw[i] = uniform();
  for (int i = 0; i < OC; i++) b[i] = uniform(), db0[i] = db[i] = uniform();
  for (int i = 0; i < B * OC; i++) dout[i] = uniform();
  st_gemm_set_bf16(1);
  st_linear_forward(pool, out, in, w, b, B, IC, OC);
  st_linear_backward(pool, din, dw, db, dout, in, w, B, IC, OC);
  st_gemm_set_bf16(0);
  for (int s = 0; s < B; s++)
    for (int o = 0; o < OC; o++) {
      double t = b[o], m = fabs(b[o]);
      for (int i = 0; i < IC; i++) {
        double p = (double)bf16_ref(in[s * IC + i]) * bf16_ref(w[o * IC + i]);
        t += p, m += fabs(p);
      }
      want[s * OC + o] = t, mag[s * OC + o] = m;
    }
  double e = worst_of(out, want, mag, B * OC);
  CHECK(e <= 1e-5, "linear forward: %.3g off", e);
  for (int o = 0; o < OC; o++)
    for (int i = 0; i < IC; i++) {
      double t = dw0[o * IC + i], m = fabs(t);
      for (int s = 0; s < B; s++) {
        double p =
            (double)bf16_ref(dout[s * OC + o]) * bf16_ref(in[s * IC + i]);
        t += p, m += fabs(p);
      }
      want[o * IC + i] = t, mag[o * IC + i] = m;
    }
  e = worst_of(dw, want, mag, OC * IC);
  CHECK(e <= 1e-5, "linear weight gradient: %.3g off", e);
  for (int s = 0; s < B; s++)
    for (int i = 0; i < IC; i++) {
      double t = 0, m = 0;
      for (int o = 0; o < OC; o++) {
        double p = (double)bf16_ref(dout[s * OC + o]) * bf16_ref(w[o * IC + i]);
        t += p, m += fabs(p);
      }
      want[s * IC + i] = t, mag[s * IC + i] = m;
    }
  e = worst_of(din, want, mag, B * IC);
  CHECK(e <= 1e-5, "linear input gradient: %.3g off", e);
  for (int o = 0; o < OC; o++) {
    double t = db0[o], m = fabs(t);
    for (int s = 0; s < B; s++)
      t += dout[s * OC + o], m += fabs(dout[s * OC + o]);
    want[o] = t, mag[o] = m;
  }
  e = worst_of(db, want, mag, OC);
  CHECK(e <= 1e-6, "linear bias gradient (fp32, unrounded): %.3g off", e);
}

/* beta 0 ignores C, NaN included (a partial tile and a whole one) */
static void check_beta0(st_pool *pool) {
  float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, C[4] = {NAN, NAN, NAN, NAN};
  st_gemm_bf16(pool, 0, 0, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2);
  CHECK(C[0] == 1 && C[1] == 2 && C[2] == 3 && C[3] == 4,
        "beta 0 ignores a NaN in C (%s)", st_bf16_support());
  enum { W = 16 };
  static float I[W * W], X[W * W], D[W * W];
  for (int i = 0; i < W * W; i++)
    I[i] = i % (W + 1) == 0, X[i] = (float)(i % 7), D[i] = NAN;
  st_gemm_bf16(pool, 0, 0, W, W, W, 1.0f, X, W, I, W, 0.0f, D, W);
  CHECK(memcmp(D, X, sizeof D) == 0, "beta 0 ignores NaNs in a whole tile");
}

/* st_gemm_bf16_bias: the sums start from the bias in the kernel itself;
 * bit for bit C filled with it and st_gemm_bf16 at beta 1, on every pool,
 * over K blocks, column chunks and partial panels, the bias's columns
 * followed into each chunk; nothing outside C's window written. */
static void check_bias(st_pool **pools, int npools) {
  shape shapes[] = {{0, 1, 37, 45, 70},  {1, 0, 30, 100, 2100},
                    {0, 0, 3, 4200, 40}, {1, 1, 25, 65, 1},
                    {0, 1, 64, 96, 512}, {0, 0, 13, 31, 1025}};
  for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
    operands o;
    fill(&o, &shapes[k]);
    size_t nc = (size_t)o.M * o.ldc;
    float *bias = malloc((size_t)o.N * 4), *want = malloc(nc * 4),
          *got = malloc(nc * 4);
    for (int j = 0; j < o.N; j++) bias[j] = uniform();
    memcpy(want, o.C0, nc * 4);
    for (int i = 0; i < o.M; i++)
      memcpy(want + (size_t)i * o.ldc, bias, (size_t)o.N * 4);
    st_gemm_bf16(NULL, o.ta, o.tb, o.M, o.N, o.K, 1.0f, o.A, o.lda, o.B, o.ldb,
                 1.0f, want, o.ldc);
    for (int p = -1; p < npools; p++) {
      memcpy(got, o.C0, nc * 4);
      st_gemm_bf16_bias(p < 0 ? NULL : pools[p], o.ta, o.tb, o.M, o.N, o.K, o.A,
                        o.lda, o.B, o.ldb, bias, got, o.ldc);
      CHECK(memcmp(got, want, nc * 4) == 0,
            "bias: %d x %d x %d, ta %d tb %d, pool %d: not the filled C's bits",
            o.M, o.N, o.K, o.ta, o.tb, p);
    }
    free(bias), free(want), free(got);
    release(&o);
  }
}

/* st_gemm_bf16_panels: op(B) packed once (st_bf16_pack_panels), products
 * over prefixes of its columns and rows, bit for bit st_gemm_bf16's, C
 * outside the window untouched. Prefixes the panels cannot serve (an odd
 * K short of theirs, whose last pair would take row K where the product
 * pads with zero) and shapes past one K block run st_gemm_bf16 itself. */
static void check_panels(void) {
  shape full[] = {{0, 1, 32, 77, 64},   {0, 0, 32, 24, 77}, {1, 0, 13, 40, 100},
                  {0, 1, 50, 300, 130}, {1, 1, 9, 33, 7},   {0, 0, 8, 16, 1030},
                  {1, 0, 100, 40, 64}}; /* op(A)'s panels in fours */
  float ab[][2] = {{1, 0},    {1, 1}, {0.125f, 0}, {1, 0.5f},
                   {0.5f, 2}, {0, 0}, {0, 1}};
  int served = 0;
  for (size_t f = 0; f < sizeof full / sizeof *full; f++) {
    operands o;
    fill(&o, &full[f]);
    /* an infinity in op(B)'s last row: a prefix one short of it, padded
     * with zeros, must not meet it (0 x inf is NaN) */
    if (o.K % 2 == 0)
      o.B[o.tb ? (size_t)o.K - 1 : (size_t)(o.K - 1) * o.ldb] = INFINITY;
    size_t words = st_bf16_panels_words(o.N, o.K);
    CHECK(words > 0 || o.K > 1024 || st_bf16_tiles(),
          "no panels for %d x %d within one K block", o.N, o.K);
    CHECK(o.K <= 1024 || words == 0, "panels past one K block (K = %d)", o.K);
    uint32_t *panels = words ? malloc(words * 4) : NULL;
    if (panels) st_bf16_pack_panels(o.tb, o.N, o.K, o.B, o.ldb, panels);
    int ns[] = {o.N, o.N - 13, 1}, ks[] = {o.K, o.K - 1, o.K - 2, 2, 1};
    size_t nc = (size_t)o.M * o.ldc;
    float *C1 = malloc(nc * 4), *C2 = malloc(nc * 4);
    for (int a = 0; a < 3; a++)
      for (int b = 0; b < 5; b++)
        for (int c = 0; c < 7; c++) {
          int n = ns[a], k = ks[b];
          if (n < 1 || k < 1) continue;
          memcpy(C1, o.C0, nc * 4), memcpy(C2, o.C0, nc * 4);
          st_gemm_bf16(NULL, o.ta, o.tb, o.M, n, k, ab[c][0], o.A, o.lda, o.B,
                       o.ldb, ab[c][1], C1, o.ldc);
          st_gemm_bf16_panels(o.ta, o.tb, o.M, n, k, ab[c][0], o.A, o.lda, o.B,
                              o.ldb, panels, o.K, ab[c][1], C2, o.ldc);
          CHECK(memcmp(C1, C2, nc * 4) == 0,
                "panels: %d x %d x %d (of %d x %d), ta %d tb %d, alpha %g "
                "beta %g: not st_gemm_bf16's bits",
                o.M, n, k, o.N, o.K, o.ta, o.tb, ab[c][0], ab[c][1]);
          served += panels && (k % 2 == 0 || k == o.K);
        }
    free(C1), free(C2), free(panels);
    release(&o);
  }
  CHECK(served > 0 || st_bf16_tiles(), "the panels served no product");
}

int main(void) {
  st_blas_init();
  st_fp_set_flush(1); /* the instruction flushes; so must the chain here */
  printf("bf16 products: %s\n", st_bf16_support());
  st_pool *pools[3] = {st_pool_create(1), st_pool_create(2), st_pool_create(3)};
  check_rounding();
  shape shapes[] = {
      {0, 0, 1, 1, 1},
      {0, 0, 1, 40, 33},
      {0, 1, 5, 7, 3},
      {1, 0, 13, 33, 64},
      {1, 1, 25, 65, 129},
      {0, 1, 64, 96, 512},
      {0, 0, 100, 70, 513},
      {1, 0, 37, 130, 1100},
      {0, 1, 150, 200, 300},
      {1, 1, 12, 32, 1025},
      {0, 0, 300, 260, 96},
      {0, 1, 2, 300, 768},
      {0, 1, 3, 4200, 40},
      {1, 0, 4100, 2, 9},  /* chunks of 4096 */
      {1, 0, 7, 9, 5},     /* both packed along r, K odd */
      {0, 1, 4, 40, 2100}, /* three K blocks of 512 pairs */
      {0, 1, 48, 16, 96},  /* whole AMX tiles, one of a block's two */
      /* op(A) along r in 12-row panels four at a time (fours_r12), then
       * the rest one at a time: 100 rows (two fours and 4 rows), odd K;
       * 200 rows, a task's panels starting past a four's boundary */
      {1, 0, 100, 70, 513},
      {1, 1, 200, 64, 64},
  };
  float ab[][2] = {{1, 0}, {1, 1}, {0.125f, 0}, {1, 0.5f}, {0.5f, 2}};
  /* AMX's tiles where they run: within the double reference's tolerance,
   * their bits the same on every pool and split, and not the chain's (so
   * that it was they that ran); then the definition without them */
  if (st_bf16_tiles()) {
    under_tiles = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
      for (size_t c = 0; c < sizeof ab / sizeof *ab; c++)
        check_shape(&shapes[s], ab[c][0], ab[c][1], pools, 3);
    CHECK(chain_differs > 0, "the tiles gave the chain's bits everywhere");
    printf("AMX's tiles: %ld elements off the chain\n", chain_differs);
    check_routing(pools[1]);
    check_linear(pools[1]);
    check_beta0(pools[1]);
    under_tiles = 0;
    st_bf16_set_tiles(0);
    CHECK(!st_bf16_tiles() && !strstr(st_bf16_support(), "AMX"),
          "the tiles still run once turned off: %s", st_bf16_support());
    printf("bf16 products without the tiles: %s\n", st_bf16_support());
    check_rounding();
  }
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (size_t c = 0; c < sizeof ab / sizeof *ab; c++)
      check_shape(&shapes[s], ab[c][0], ab[c][1], pools, 3);
  check_beta0(pools[1]);
  check_panels();
  check_bias(pools, 3);
  st_bf16_set_plain(1); /* the definition one element at a time */
  check_bias(pools, 1);
  st_bf16_set_plain(0);
  /* a subnormal input counts as zero */
  float sub[2] = {FLT_MIN / 4, 1.0f}, col[2] = {1e30f, 1.0f}, out = 0;
  st_gemm_bf16(NULL, 0, 0, 1, 1, 2, 1.0f, sub, 2, col, 1, 0.0f, &out, 1);
  CHECK(out == 1.0f, "a subnormal input is zero (got %g)", out);
  check_preference(&shapes[5], pools[1]);
  check_routing(pools[1]);
  check_linear(pools[1]);
  check_keep(pools[1]);
  /* where the instruction runs, the emulation's rounding too: a
   * calibration profile makes it the one that runs (st_bf16_prefer_emulated),
   * and check_shape's random operands hold no NaN or subnormal */
  if (st_bf16_native()) {
    st_bf16_set_emulated(1);
    check_rounding();
    check_keep(pools[1]);
    check_panels(); /* op(A) packed wide */
    check_bias(pools, 3);
    st_bf16_set_emulated(0);
  }
  for (int p = 0; p < 3; p++) st_pool_destroy(pools[p]);
  printf("%d passed, %d failed\n", th_passed, th_failed);
  return th_failed != 0;
}
