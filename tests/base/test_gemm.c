/*
 * test_gemm.c — st_gemm on every path it takes: one row (the BLAS's
 * matrix-vector product), a few rows (src/base/narrow.c's dot and axpy
 * kernels), its packed kernel (each side of the limits), and the tiled
 * sgemm, for every transpose pair, alpha and beta.
 *
 * Reference: the same products summed in double. Tolerance: each element
 * within 1e-5 of the sum of its terms' magnitudes (|alpha| sum |a b| +
 * |beta c|): fp32 with K <= 1100 terms summed in any order errs by at most
 * about K 2^-24 of that sum (6.6e-5 in the worst case, ~1e-6 typically), and
 * a wrong or missing term is off by a whole term (>= 1e-3 of it here).
 * At K = 140000 the worst case would pass 1e-5, but with terms of random
 * sign the running sums stay far below sum |a b|, and so do their
 * roundings. Alpha 0 gives beta C exactly.
 * Also: beta = 0 ignores a NaN in C (BLAS semantics); nothing outside C's
 * M x N window is written (leading dimensions padded with a sentinel); the
 * result is bitwise the same on pools of 1, 2 and 3 threads and none.
 * st_gemm_bias equals filling C with the bias and adding, bit for bit.
 * A sweep of random small shapes (every transpose pair, M, N and K from 0
 * or 1 up, leading dimensions from tight to 40 floats past the width,
 * alpha 0 and not, beta 0 with NaN in C) holds the same checks on pools
 * of 1, 2, 3 and 5 threads, with a bias and a relu too.
 * Where the target has FMA, the axpy and packed kernels give each element
 * exactly one fmaf chain over k in order from 0 (then C's term), as
 * narrow.c's header says: so their vector width and register blocks
 * change no bit.
 */
#include "harness.h"
#include "strata.h"
#include "../../src/base/narrow.h"

#include <stdatomic.h>
#include <string.h>

static uint64_t rng_state = 88172645463325252ull;
static float uniform(void) { /* xorshift, in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) / (double)(1 << 23)) - 1.0f;
}

#if defined(__FMA__)
/* n floats from malloc, each drawn from uniform() in order. */
static float *uniform_array(size_t n) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = uniform();
  return p;
}
#endif

static const float SENTINEL = 1234.5f;

/* Whether the packed kernel can take inner size K on this target at all
 * (narrow.c: K <= 3072, A transposed past K = 64 with AVX-512 only, or
 * with AVX2 up to K = 512 with rows at most 128 floats apart, which the
 * transposed shapes this macro serves do not reach past K = 64; with
 * AVX2 alone, B untransposed past K = 1024 only from 512 rows, which the
 * shapes this macro serves do not reach: 60 rows, K 1000 then). */
/* The rule built in for class c (narrow.c): the BLAS for A transposed
 * past K = 1536 where the BLAS has 16-lane kernels, on targets whose
 * packed kernel goes past it (AVX-512). */
#if defined(__AVX512F__) && defined(__FMA__)
#define RULE_BLAS(c) ((c) == 5 && st_blas_avx512())
#else
#define RULE_BLAS(c) 0
#endif
#if defined(__AVX512F__) && defined(__FMA__)
#define PACKED_ANY(ta, K) ((K) <= 3072)
#elif defined(__FMA__)
#define PACKED_ANY(ta, K) ((K) <= ((ta) ? 64 : 3072))
#else
#define PACKED_ANY(ta, K) 0
#endif

typedef struct shape {
  int ta, tb, M, N, K;
  const char *path; /* which path it takes, for the failure message */
} shape;

/* st_gemv_then's `after`: counts the times each row is handed over. */
typedef struct seen_rows {
  int K;
  _Atomic int times[400];
} seen_rows;

static void see_rows(void *arg, int r0, int r1) {
  seen_rows *s = arg;
  for (int r = r0; r < r1 && r < s->K; r++) s->times[r]++;
}

/* Leading dimensions: the stored width plus this (a sentinel between rows). */
enum { PAD = 3 };

static void run(const shape *s, int pad, float alpha, float beta, int nan_c,
                st_pool **pools, int npools) {
  int M = s->M, N = s->N, K = s->K;
  /* stored shapes: A is M x K (or K x M), B is K x N (or N x K) */
  int a_rows = s->ta ? K : M, a_cols = s->ta ? M : K;
  int b_rows = s->tb ? N : K, b_cols = s->tb ? K : N;
  int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  size_t na = (size_t)a_rows * lda, nb = (size_t)b_rows * ldb,
         nc = (size_t)M * ldc;
  float *A = malloc(na * 4), *B = malloc(nb * 4), *C0 = malloc(nc * 4),
        *C = malloc(nc * 4), *first = malloc(nc * 4);
  for (size_t i = 0; i < na; i++) A[i] = uniform();
  for (size_t i = 0; i < nb; i++) B[i] = uniform();
  for (int r = 0; r < M; r++)
    for (int c = 0; c < ldc; c++)
      C0[(size_t)r * ldc + c] = c >= N                      ? SENTINEL
                                : nan_c && (r + c) % 3 == 0 ? NAN
                                                            : uniform();
  char what[160];
  snprintf(what, sizeof what, "%s ta%d tb%d %dx%dx%d alpha %g beta %g%s",
           s->path, s->ta, s->tb, M, N, K, alpha, beta,
           nan_c ? " (NaN in C)" : "");
  for (int p = 0; p < npools; p++) {
    memcpy(C, C0, nc * 4);
    st_gemm(pools[p], s->ta, s->tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
            ldc);
    if (p == 0) {
      double worst = 0;
      int outside = 0;
      for (int r = 0; r < M; r++) {
        for (int c = 0; c < N; c++) {
          double sum = 0, mag = 0;
          for (int k = 0; k < K; k++) {
            double a = s->ta ? A[(size_t)k * lda + r] : A[(size_t)r * lda + k];
            double b = s->tb ? B[(size_t)c * ldb + k] : B[(size_t)k * ldb + c];
            sum += a * b;
            mag += fabs(a * b);
          }
          double c0 = C0[(size_t)r * ldc + c];
          double want = alpha * sum + (beta == 0 ? 0 : beta * c0);
          double scale = fabs(alpha) * mag + (beta == 0 ? 0 : fabs(beta * c0));
          double err = fabs(C[(size_t)r * ldc + c] - want) / (scale + 1e-30);
          if (!(err <= worst)) worst = err; /* NaN fails */
        }
        for (int c = N; c < ldc; c++)
          outside += C[(size_t)r * ldc + c] != SENTINEL;
      }
      CHECK(worst <= 1e-5, "%s: worst error %.3g of the terms' sum > 1e-5",
            what, worst);
      CHECK(outside == 0, "%s: %d elements written past column N", what,
            outside);
      memcpy(first, C, nc * 4);
    } else {
      CHECK(memcmp(first, C, nc * 4) == 0,
            "%s: %d threads differ from the pool-less result in some bit", what,
            st_pool_threads(pools[p]));
    }
  }
  free(A), free(B), free(C0), free(C), free(first);
}

#if defined(__AVX512F__) && defined(__FMA__)
/* A product cut into pieces of m rows and k of K (gemm.c, with AVX-512):
 * the same bits as the pieces called one by one, alpha on each, beta on
 * the first piece of K only, on every pool. */
static void run_pieces(const shape *s, int m, int k, st_pool **pools,
                       int npools) {
  int M = s->M, N = s->N, K = s->K;
  int lda = s->ta ? M : K, ldb = s->tb ? K : N;
  size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
  float *A = uniform_array(na), *B = uniform_array(nb), *C0 = uniform_array(nc),
        *want = malloc(nc * 4), *C = malloc(nc * 4);
  const float alpha = 0.5f, beta = -0.75f;
  memcpy(want, C0, nc * 4);
  for (int k0 = 0; k0 < K; k0 += k) {
    int kk = K - k0 < k ? K - k0 : k;
    for (int i0 = 0; i0 < M; i0 += m) {
      int mm = M - i0 < m ? M - i0 : m;
      const float *a =
          s->ta ? A + (size_t)k0 * lda + i0 : A + (size_t)i0 * lda + k0;
      const float *b = s->tb ? B + k0 : B + (size_t)k0 * ldb;
      st_gemm(NULL, s->ta, s->tb, mm, N, kk, alpha, a, lda, b, ldb,
              k0 ? 1.0f : beta, want + (size_t)i0 * N, N);
    }
  }
  for (int p = 0; p < npools; p++) {
    memcpy(C, C0, nc * 4);
    st_gemm(pools[p], s->ta, s->tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
    CHECK(!memcmp(C, want, nc * 4),
          "%s ta%d tb%d %dx%dx%d on %d threads: not the pieces' bits", s->path,
          s->ta, s->tb, M, N, K, st_pool_threads(pools[p]));
  }
  free(A), free(B), free(C0), free(want), free(C);
}

#endif

/* st_gemm_bias: the same bits as C filled with the bias and st_gemm with
 * alpha and beta 1, on every path; C's old contents (NaN here) never read;
 * nothing past column N written. */
/* A shape's operands for run_bias and run_relu: A, B and a bias drawn
 * from uniform(), stored with PAD floats past each row; want and C for
 * M x ldc results. */
typedef struct operands {
  int lda, ldb, ldc;
  size_t nc;
  float *A, *B, *bias, *want, *C;
} operands;

static operands operands_make(const shape *s) {
  int M = s->M, N = s->N, K = s->K;
  operands o = {(s->ta ? M : K) + PAD,
                (s->tb ? K : N) + PAD,
                N + PAD,
                0,
                NULL,
                NULL,
                NULL,
                NULL,
                NULL};
  size_t na = (size_t)(s->ta ? K : M) * o.lda,
         nb = (size_t)(s->tb ? N : K) * o.ldb;
  o.nc = (size_t)M * o.ldc;
  o.A = malloc(na * 4), o.B = malloc(nb * 4), o.bias = malloc((size_t)N * 4);
  o.want = malloc(o.nc * 4), o.C = malloc(o.nc * 4);
  for (size_t i = 0; i < na; i++) o.A[i] = uniform();
  for (size_t i = 0; i < nb; i++) o.B[i] = uniform();
  for (int j = 0; j < N; j++) o.bias[j] = uniform();
  return o;
}

static void operands_free(operands *o) {
  free(o->A), free(o->B), free(o->bias), free(o->want), free(o->C);
}

static void run_bias(const shape *s, st_pool **pools, int npools) {
  int M = s->M, N = s->N, K = s->K;
  operands o = operands_make(s);
  int lda = o.lda, ldb = o.ldb, ldc = o.ldc;
  size_t nc = o.nc;
  float *A = o.A, *B = o.B, *bias = o.bias, *want = o.want, *C = o.C;
  for (int r = 0; r < M; r++)
    for (int c = 0; c < ldc; c++)
      want[(size_t)r * ldc + c] = c < N ? bias[c] : SENTINEL;
  st_gemm(NULL, s->ta, s->tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, want, ldc);
  for (int p = 0; p < npools; p++) {
    for (int r = 0; r < M; r++)
      for (int c = 0; c < ldc; c++)
        C[(size_t)r * ldc + c] = c < N ? NAN : SENTINEL;
    st_gemm_bias(pools[p], s->ta, s->tb, M, N, K, A, lda, B, ldb, bias, C, ldc);
    CHECK(memcmp(want, C, nc * 4) == 0,
          "%s ta%d tb%d %dx%dx%d with a bias (%d threads): not the bits of the "
          "bias filled in and then added to",
          s->path, s->ta, s->tb, M, N, K, st_pool_threads(pools[p]));
  }
  operands_free(&o);
}

/* st_gemm_bias_relu, with and without a bias: the bits of st_gemm_bias
 * (or st_gemm, alpha 1, beta 0) and then st_relu_forward over each row, on
 * every path and pool; op(A)'s row 0 has a NaN, so C's row 0 is all NaN
 * before the relu and after it (relu keeps a NaN, as PyTorch's: one mapped
 * to 0 hid a divergence behind finite losses); C's old contents never
 * read; nothing past column N written. */
static void run_relu(const shape *s, st_pool **pools, int npools) {
  int M = s->M, N = s->N, K = s->K;
  operands o = operands_make(s);
  int lda = o.lda, ldb = o.ldb, ldc = o.ldc;
  size_t nc = o.nc;
  float *A = o.A, *B = o.B, *bias = o.bias, *want = o.want, *C = o.C;
  A[0] = NAN; /* op(A)'s element (0, 0) either way */
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    const float *b = with_bias ? bias : NULL;
    for (int r = 0; r < M; r++)
      for (int c = 0; c < ldc; c++)
        want[(size_t)r * ldc + c] = c < N ? NAN : SENTINEL;
    if (b)
      st_gemm_bias(NULL, s->ta, s->tb, M, N, K, A, lda, B, ldb, b, want, ldc);
    else
      st_gemm(NULL, s->ta, s->tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, want,
              ldc);
    int row0_nan = 1;
    for (int c = 0; c < N; c++) row0_nan &= isnan(want[c]);
    for (int r = 0; r < M; r++)
      st_relu_forward(want + (size_t)r * ldc, want + (size_t)r * ldc,
                      (size_t)N);
    int row0_kept = 1, negatives = 0;
    for (int c = 0; c < N; c++) row0_kept &= isnan(want[c]);
    for (size_t i = 0; i < nc; i++) negatives += want[i] < 0;
    CHECK(row0_nan && row0_kept && negatives == 0,
          "%s %dx%dx%d: the reference relu: row 0 NaN %d then NaN %d, %d "
          "negatives",
          s->path, M, N, K, row0_nan, row0_kept, negatives);
    for (int p = 0; p < npools; p++) {
      for (int r = 0; r < M; r++)
        for (int c = 0; c < ldc; c++)
          C[(size_t)r * ldc + c] = c < N ? NAN : SENTINEL;
      st_gemm_bias_relu(pools[p], s->ta, s->tb, M, N, K, A, lda, B, ldb, b, C,
                        ldc);
      CHECK(memcmp(want, C, nc * 4) == 0,
            "%s ta%d tb%d %dx%dx%d %s a bias, then relu (%d threads): not the "
            "bits of the product and then st_relu_forward",
            s->path, s->ta, s->tb, M, N, K, b ? "with" : "without",
            st_pool_threads(pools[p]));
    }
  }
  operands_free(&o);
}

/* Random small shapes against the double reference (run, run_bias and
 * run_relu), on pools of 1, 2, 3 and 5 threads: whichever path each lands
 * on (one row, dot, axpy, packed, the BLAS's tiles), odd sizes and tails
 * of every kernel's blocks, K 0 and 1, rows padded or not. */
static void run_sweep(st_pool **pools, int npools) {
  const float alphas[] = {1.0f, 0.5f, 0.0f, -2.0f},
              betas[] = {0.0f, 1.0f, -0.75f};
  for (int i = 0; i < 300; i++) {
    uint32_t r = (uint32_t)(rng_state >> 11);
    uniform();
    shape s = {(int)(r & 1),           (int)(r >> 1 & 1),
               1 + (int)(r >> 2) % 40, 1 + (int)(r >> 8) % 70,
               (int)(r >> 15) % 90,    "random"};
    if (i % 10 == 0) s.M = 1 + i / 10 % 2; /* one row or two */
    if (i % 8 == 1) s.K = i / 8 % 3;       /* K 0, 1 or 2 */
    if (i % 16 == 2) s.N = 1;              /* one column */
    int pad = i % 3 ? (int)(r >> 22) % 40 : 0;
    if (s.K == 0 && pad == 0) pad = 1; /* lda >= 1, as the BLAS asks */
    float alpha = alphas[(r >> 28) % 4], beta = betas[(r >> 30) % 3];
    run(&s, pad, alpha, beta, beta == 0.0f && (r >> 29 & 1), pools, npools);
    if (s.K > 0 && i % 4 == 0) {
      run_bias(&s, pools, npools);
      run_relu(&s, pools, npools);
    }
  }
}

#if defined(__FMA__)
/* The axpy and packed paths: each element is s = fmaf(a_k, b_k, s) for
 * k = 0, 1, ... from s = 0, then C = s (alpha 1, beta 0), C + s (alpha 1,
 * beta 1) or fmaf(alpha, s, beta C) (alpha 0.5, beta -0.75), bit for
 * bit. */
static void run_chain(const shape *s) {
  int M = s->M, N = s->N, K = s->K;
  int lda = s->ta ? M : K, ldb = s->tb ? K : N;
  float *A = uniform_array((size_t)M * K), *B = uniform_array((size_t)K * N),
        *C0 = uniform_array((size_t)M * N), *C = malloc((size_t)M * N * 4);
  const float alphas[] = {1.0f, 1.0f, 0.5f}, betas[] = {0.0f, 1.0f, -0.75f};
  for (int v = 0; v < 3; v++) {
    float alpha = alphas[v], beta = betas[v];
    memcpy(C, C0, (size_t)M * N * 4);
    st_gemm(NULL, s->ta, s->tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
    int off = 0;
    for (int r = 0; r < M; r++)
      for (int c = 0; c < N; c++) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++)
          acc = fmaf(s->ta ? A[(size_t)k * lda + r] : A[(size_t)r * lda + k],
                     s->tb ? B[(size_t)c * ldb + k] : B[(size_t)k * ldb + c],
                     acc);
        float c0 = C0[(size_t)r * N + c];
        float want = v == 0   ? acc
                     : v == 1 ? c0 + acc
                              : fmaf(alpha, acc, beta * c0);
        off += memcmp(&want, &C[(size_t)r * N + c], 4) != 0;
      }
    CHECK(off == 0,
          "%s ta%d tb%d %dx%dx%d alpha %g beta %g: %d elements not one fmaf "
          "chain over k in order",
          s->path, s->ta, s->tb, M, N, K, alpha, beta, off);
  }
  free(A), free(B), free(C0), free(C);
}
#endif

int main(void) {
  st_blas_init();
  st_pool *pools[4] = {NULL, st_pool_create(1), st_pool_create(2),
                       st_pool_create(3)};
  const shape shapes[] = {
      /* one row: matrix-vector, both layouts, one tile and several; B
       * stored K x N summed in bands of rows where the partials fit */
      {0, 1, 1, 256, 784, "gemv in bands"},
      {0, 0, 1, 784, 256, "gemv summed in bands"},
      {0, 0, 1, 256, 255, "gemv summed in bands, the last one short"},
      {0, 1, 1, 10, 37, "gemv"},
      {0, 0, 1, 37, 10, "gemv"},
      {0, 1, 1, 2304, 600, "gemv tiled"},
      {0, 0, 1, 3000, 400, "gemv summed in 58 bands, partials past the stack"},
      {0, 0, 1, 5000, 64, "gemv tiled (bands of 3 rows)"},
      {0, 0, 1, 9000, 400, "gemv tiled (wider than half the stack)"},
      /* dot: 2 .. 8 rows, every row-pair remainder, K tails, N tails */
      {0, 1, 2, 256, 784, "dot"},
      {0, 1, 3, 13, 29, "dot"},
      {0, 1, 5, 7, 8, "dot"},
      {0, 1, 8, 256, 256, "8 rows (AVX2 dot, AVX-512 packed)"},
      {0, 1, 7, 1030, 517, "7 rows, tasks (AVX2 dot, AVX-512 packed)"},
      {0, 1, 5, 1030, 517, "dot tasks"},
      {0, 1, 4, 3, 1, "dot K=1"},
      {0, 1, 8, 31, 300, "dot, 8 rows of 31"},
      {0, 1, 8, 64, 3073, "dot, 8 rows past the packed K"},
      {0, 1, 2, 5, 140000, "dot K past a task's FLOPs"},
      /* axpy: 2 .. 16 rows (blocks of 6 and each remainder), N tails */
      {0, 0, 2, 784, 256, "axpy"},
      {0, 0, 5, 19, 13, "axpy"},
      {0, 0, 6, 8, 1, "axpy K=1"},
      {0, 0, 11, 33, 64, "axpy"},
      {0, 0, 16, 784, 512, "axpy"},
      {0, 0, 13, 2051, 300, "axpy tasks"},
      {0, 0, 9, 1, 5, "axpy N=1"},
      /* packed: more rows, or A or B transposed; blocks of 6 rows and
       * each remainder, strips of 16 columns and every tail (past 8 and
       * below), K tails of the 8 x 8 transpose, both edges of the limits */
      {0, 1, 9, 300, 200, "packed"},
      {0, 0, 17, 64, 64, "packed"},
      {0, 0, 23, 27, 29, "packed"},
      {0, 1, 19, 27, 29, "packed"},
      {0, 1, 20, 5, 3, "packed"},
      {0, 0, 22, 13, 1, "packed K=1"},
      {1, 0, 256, 784, 8, "packed dW"},
      {1, 0, 2, 3, 1, "packed dW"},
      {1, 0, 21, 40, 64, "packed dW"},
      {1, 1, 5, 6, 7, "packed"},
      {1, 1, 25, 35, 17, "packed"},
      {0, 1, 200, 300, 100, "packed tasks"},
      {0, 0, 20, 2051, 100, "packed tasks"},
      {0, 1, 13, 45, 37, "packed"},
      {0, 0, 20, 95, 40, "packed"},
      {1, 0, 31, 61, 33, "packed dW"},
      /* 10 strips, the last of 12 columns: groups of strips (below) */
      {0, 1, 250, 300, 200, "packed, 10 strips"},
      {1, 0, 250, 300, 100, "packed dW, 10 strips"},
      {0, 0, 43, 1000, 64, "packed, 32 strips"},
      {0, 0, 12, 29, 16, "axpy"},
      {0, 0, 14, 95, 40, "axpy"},
      {0, 0, 1024, 40, 512, "packed limits"},
      {0, 1, 1024, 40, 512, "packed limits"},
      /* gpt_tiny's products at batch 1 */
      {0, 1, 64, 128, 512, "packed"},
      {0, 0, 64, 128, 128, "packed"},
      {1, 0, 384, 128, 64, "packed dW"},
      {0, 1, 64, 384, 128, "packed"},
      /* with AVX-512 packed up to 4096 rows and K = 3072 (A transposed
       * too, unless its rows lie a multiple of 4 KB apart, below; K =
       * 1536 where the BLAS has AVX-512 kernels); past them, and without
       * AVX-512, the tiled sgemm. Few columns: row chunks of whole
       * panels, 264 rows at 4096 (the last 136) and 108 at 1000 (the
       * last 28) with AVX-512. */
      {0, 1, 64, 40, 3072, "K=3072 (packed; the BLAS's if AVX-512)"},
      /* with AVX2 alone, B untransposed past K = 1024 only from 512 rows */
      {0, 0, 511, 40, 1025, "K=1025 511 rows (AVX2 sgemm)"},
      {0, 0, 512, 40, 1025, "K=1025 512 rows (packed)"},
      {0, 0, 30, 40, 3073, "K>3072 (sgemm; AVX-512 pieces)"},
      {0, 0, 4096, 20, 64, "4096 rows (AVX-512 packed, row chunks)"},
      {0, 1, 1000, 20, 100, "1000 rows (AVX-512 packed, row chunks)"},
      {0, 1, 4097, 20, 40, "M>4096 (sgemm; AVX-512 pieces)"},
      {1, 0, 100, 40, 300, "dW K=300 (AVX-512 packed)"},
      {1, 0, 100, 40, 3072, "dW K=3072 (AVX-512 packed)"},
      {1, 0, 100, 40, 3073, "dW K>3072 (sgemm; AVX-512 pieces)"},
      /* past the kernels' limits: the tiled sgemm */
      {0, 0, 8, 64, 513, "K>512 (AVX2 sgemm)"},
      {0, 0, 64, 40, 513, "K>512 (AVX2 sgemm)"},
      {0, 1, 1025, 40, 30, "M>1024 (AVX2 sgemm)"},
      {1, 0, 130, 40, 65, "dW K>64, lda 133 (AVX2 sgemm)"},
      {1, 1, 130, 40, 65, "K>64, lda 133 (AVX2 sgemm)"},
      {1, 0, 10, 256, 256, "dW K>64, lda 13 (packed)"},
      {1, 1, 30, 40, 65, "K>64, lda 33 (packed)"},
      {1, 0, 120, 50, 512, "dW K=512, lda 123 (packed)"},
      {1, 0, 20, 50, 513, "dW K>512 (AVX2 sgemm)"},
      /* with AVX-512, A transposed with rows 512 floats apart or more:
       * copied out in panels of 12 rows (the last short, 4 panels a
       * task); passes of fewer rows below */
      {1, 0, 517, 70, 93, "dW lda 517 (AVX-512: A copied out; AVX2 sgemm)"},
      {1, 1, 530, 24, 3000, "lda 530 (AVX-512: A copied out)"},
      /* with AVX-512, A untransposed past half of L2 (where L2 is 2 MB at
       * most) against 256 columns or more: copied out too (the 8 x 8
       * transposes' K tails; row chunks of 132 rows, whole panels; with
       * AVX2 the sgemm, or packed in place with B transposed) */
      {0, 0, 250, 256, 1100, "A past L2 / 2 (AVX-512: copied out)"},
      {0, 1, 250, 260, 1099, "A past L2 / 2 (AVX-512: copied out)"},
      {0, 1, 200, 300, 600, "tiled (AVX2 sgemm)"},
      {0, 1, 130, 140, 3100, "tiled K>3072 (sgemm; AVX-512 pieces)"},
      /* too few tiles at the usual edge: split further (gpt_tiny's
       * weight gradient at batch 2) */
      {1, 0, 384, 128, 128, "few tiles dW (AVX2 sgemm)"},
      {0, 1, 64, 128, 520, "few tiles (AVX2 sgemm)"},
      {0, 1, 64, 128, 3080, "few tiles K>3072 (sgemm; AVX-512 pieces)"},
  };
  int n = (int)(sizeof shapes / sizeof shapes[0]);
  const float alphas[] = {1.0f, 0.5f, 0.0f}, betas[] = {0.0f, 1.0f, -0.75f};
  for (int i = 0; i < n; i++)
    for (int a = 0; a < 3; a++)
      for (int b = 0; b < 3; b++)
        run(&shapes[i], PAD, alphas[a], betas[b], 0, pools, 4);
  for (int i = 0; i < n; i++) /* beta = 0 never reads C */
    run(&shapes[i], PAD, 1.0f, 0.0f, 1, pools, 1);
  /* 8 rows, B transposed, K past the packed kernel's: the dot kernel on
   * every target (with AVX-512 these rows go to packed where it fits) */
  /* st_row_band: about 16K elements a band (one row at least), at most
   * 64 bands: the MLP's 256 x 784 in 13 bands of 20 rows, a vocabulary's
   * 50257 x 768 capped at 64 bands, a row past 16K elements one a band */
  const int band_cases[][3] = {{256, 784, 20}, {256, 256, 64},
                               {10, 256, 64},  {50257, 768, 786},
                               {9, 4001, 4},   {40, 20000, 1}};
  for (int i = 0; i < 6; i++) {
    int rows = band_cases[i][0], len = band_cases[i][1];
    int r = st_row_band(rows, len);
    CHECK(r == band_cases[i][2] && (rows + r - 1) / r <= 64,
          "st_row_band(%d, %d) = %d, want %d", rows, len, r, band_cases[i][2]);
  }
  /* a split whose partials do not fit the stack, run in waves on it (as
   * when the thread's buffer cannot be had): the same bits as in one job,
   * on every pool, beta 0 and not, and every band's rows handed to
   * `after` once, after its partial */
  {
    enum { N = 3000, K = 400 };
    float *x = malloc(K * 4), *B = malloc((size_t)K * N * 4);
    float *y0 = malloc(N * 4), *y = malloc(N * 4), *yb = malloc(N * 4);
    for (int k = 0; k < K; k++) x[k] = uniform();
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = uniform();
    for (int j = 0; j < N; j++) yb[j] = uniform();
    for (int beta = 0; beta < 2; beta++) {
      memcpy(y0, yb, N * 4);
      st_gemm(pools[2], 0, 0, 1, N, K, 1.0f, x, K, B, N, beta ? 0.5f : 0.0f, y0,
              N);
      st_gemv_waves(1);
      for (int p = 0; p < 4; p++) {
        memcpy(y, yb, N * 4);
        st_gemm(pools[p], 0, 0, 1, N, K, 1.0f, x, K, B, N, beta ? 0.5f : 0.0f,
                y, N);
        CHECK(!memcmp(y, y0, N * 4),
              "gemv 1x%dx%d beta %d in waves on %d threads: not the bits of "
              "one job",
              N, K, beta, st_pool_threads(pools[p]));
      }
      st_gemv_waves(0);
    }
    seen_rows seen = {.K = K};
    st_gemv_waves(1);
    int split = st_gemv_then(pools[3], y, x, B, K, N, see_rows, &seen);
    st_gemv_waves(0);
    memcpy(y0, yb, N * 4);
    st_gemm(NULL, 0, 0, 1, N, K, 1.0f, x, K, B, N, 0.0f, y0, N);
    int once = 1;
    for (int k = 0; k < K; k++) once &= seen.times[k] == 1;
    CHECK(split && once && !memcmp(y, y0, N * 4),
          "st_gemv_then in waves: split %d, every row once %d, bits %d", split,
          once, !memcmp(y, y0, N * 4));
    free(x), free(B), free(y0), free(y), free(yb);
  }
  CHECK(st_gemm_narrow_kernel(0, 1, 8, 64, 3073, 3073) == NARROW_DOT,
        "8 x 64 x 3073, B transposed: not the dot kernel");
#if defined(__FMA__)
  /* K 1025-3072: packed with B transposed at any row count, untransposed
   * from 512 rows, and under them only with AVX-512 (K 1536 at most here:
   * past it the rule gives a BLAS with AVX-512 kernels the product) */
  {
#if defined(__AVX512F__)
    int few_rows_plain_b = NARROW_PACKED;
#else
    int few_rows_plain_b = NARROW_NONE;
#endif
    CHECK(
        st_gemm_narrow_kernel(0, 1, 16, 64, 1536, 1536) == NARROW_PACKED &&
            st_gemm_narrow_kernel(0, 0, 512, 64, 1536, 1536) == NARROW_PACKED &&
            st_gemm_narrow_kernel(0, 0, 511, 64, 1025, 1025) ==
                few_rows_plain_b &&
            st_gemm_narrow_kernel(0, 0, 64, 64, 1024, 1024) == NARROW_PACKED &&
            st_gemm_narrow_kernel(0, 1, 64, 64, 3073, 3073) == NARROW_NONE,
        "K past 1024: kernels %d %d %d %d %d",
        st_gemm_narrow_kernel(0, 1, 16, 64, 1536, 1536),
        st_gemm_narrow_kernel(0, 0, 512, 64, 1536, 1536),
        st_gemm_narrow_kernel(0, 0, 511, 64, 1025, 1025),
        st_gemm_narrow_kernel(0, 0, 64, 64, 1024, 1024),
        st_gemm_narrow_kernel(0, 1, 64, 64, 3073, 3073));
  }
  /* A transposed past K = 64: packed up to K 512 with its rows at most
   * 128 floats apart (a narrow layer's weight gradient); past that the
   * BLAS with AVX2; with AVX-512 packed, on a copy from rows 512 floats
   * apart */
  {
    const int P = NARROW_PACKED, N = NARROW_NONE, C = NARROW_PACKED_COPY;
#if defined(__AVX512F__)
    const int want[7] = {P, P, P, P, P, C, C};
    (void)N;
#else
    const int want[7] = {P, P, N, N, N, N, N};
    (void)C;
#endif
    int k[7] = {st_gemm_narrow_kernel(1, 0, 10, 256, 256, 10),
                st_gemm_narrow_kernel(1, 0, 128, 784, 512, 128),
                st_gemm_narrow_kernel(1, 0, 129, 784, 512, 129),
                st_gemm_narrow_kernel(1, 0, 128, 784, 513, 128),
                st_gemm_narrow_kernel(1, 0, 256, 784, 256, 511),
                st_gemm_narrow_kernel(1, 0, 256, 784, 256, 512),
                st_gemm_narrow_kernel(1, 1, 256, 784, 256, 1024)};
    CHECK(!memcmp(k, want, sizeof k),
          "A transposed past K 64: kernels %d %d %d %d %d %d %d", k[0], k[1],
          k[2], k[3], k[4], k[5], k[6]);
  }
#endif
#if defined(__AVX512F__) && defined(__FMA__)
  /* A untransposed copied out past half of L2 against 256 columns or
   * more: GPT-2's 1024 x 768 x 3072 (12 MB of A), not at 255 columns nor
   * with A of 64 x 768 (192 KB) */
  CHECK(st_gemm_narrow_kernel(0, 0, 1024, 768, 3072, 3072) ==
                NARROW_PACKED_COPY &&
            st_gemm_narrow_kernel(0, 1, 1024, 768, 3072, 3072) ==
                NARROW_PACKED_COPY &&
            st_gemm_narrow_kernel(0, 0, 1024, 255, 3072, 3072) ==
                NARROW_PACKED &&
            st_gemm_narrow_kernel(0, 0, 64, 768, 768, 768) == NARROW_PACKED,
        "A untransposed: kernels %d %d %d %d",
        st_gemm_narrow_kernel(0, 0, 1024, 768, 3072, 3072),
        st_gemm_narrow_kernel(0, 1, 1024, 768, 3072, 3072),
        st_gemm_narrow_kernel(0, 0, 1024, 255, 3072, 3072),
        st_gemm_narrow_kernel(0, 0, 64, 768, 768, 768));
#endif
  /* A transposed with rows a multiple of 4 KB apart (lda 1024 and 2048):
   * the tiled sgemm past K = 64 (read in place its steps down A fall into
   * a few cache sets), or with AVX-512 a copy */
#if defined(__AVX512F__) && defined(__FMA__)
  const int aliased_kernel = NARROW_PACKED_COPY;
#else
  const int aliased_kernel = NARROW_NONE;
#endif
  const shape aliased[] = {{1, 0, 1021, 20, 100, "dW lda 1024"},
                           {1, 0, 1024, 20, 100, "dW lda 2048"}};
  const int alias_pad[] = {3, 1024};
  for (int i = 0; i < 2; i++) {
    const shape *s = &aliased[i];
    int kernel =
        st_gemm_narrow_kernel(1, 0, s->M, s->N, s->K, s->M + alias_pad[i]);
    CHECK(kernel == aliased_kernel, "%s: kernel %d, want %d", s->path, kernel,
          aliased_kernel);
    run(s, alias_pad[i], 1.0f, 1.0f, 0, pools, 4);
  }
#if defined(__AVX512F__) && defined(__FMA__)
  /* With AVX-512, past the packed kernel's 4096 rows or K = 3072: even
   * pieces of a multiple of 16 (gemm.c), C = alpha op(A_1) op(B_1) + beta
   * C and then C += alpha op(A_k) op(B_k), bit for bit on every pool (the
   * BLAS's tiles over the whole of K differ) */
  {
    const struct {
      shape s;
      int m, k; /* the pieces, worked out by hand */
    } cut[] = {
        {{0, 0, 30, 40, 3073, "K 3073: 2 pieces of K"}, 30, 1552},
        {{1, 0, 600, 40, 6200, "dW K 6200, A copied: 3 of K"}, 600, 2080},
        {{0, 1, 4097, 20, 40, "4097 rows: 2 pieces of rows"}, 2064, 40},
        {{1, 1, 4100, 24, 3100, "4100 rows, K 3100: 2 x 2"}, 2064, 1552},
    };
    /* every class on the packed kernel: the rule sends K past 1536 to
     * the BLAS where it has 16-lane kernels (OpenBLAS's SkylakeX on an
     * Intel Xeon that it knows), pieces and all, and then nothing is cut */
    int packed[ST_GEMM_CHOICES];
    for (int c = 0; c < ST_GEMM_CHOICES; c++) packed[c] = 0;
    st_gemm_choose(packed);
    for (int i = 0; i < 4; i++)
      run_pieces(&cut[i].s, cut[i].m, cut[i].k, pools, 4);
    st_gemm_choose(NULL);
  }
#endif
  /* The kernel table (st_gemm_choose): each class forced to the BLAS and to
   * the packed kernel routes its products there, every class of the six,
   * and the result is right and the same on every pool either way; NULL
   * restores the built-in rule (the BLAS for A transposed past K = 1536,
   * only where it has 16-lane kernels), and a forced class moves no
   * other. */
  {
    const shape chosen[] = {
        {0, 1, 60, 70, 500, "class 0"},  {0, 0, 60, 70, 1000, "class 1"},
        {0, 1, 60, 70, 2000, "class 2"}, {1, 0, 60, 70, 50, "class 3"},
        {1, 0, 60, 70, 1000, "class 4"}, {1, 0, 60, 70, 3000, "class 5"}};
    int force[ST_GEMM_CHOICES];
    for (int c = 0; c < ST_GEMM_CHOICES; c++) {
      const shape *s = &chosen[c];
      int lda = s->ta ? s->M + PAD : s->K + PAD;
      CHECK(st_gemm_choice_class(s->ta, s->K) == c, "%s: class %d", s->path,
            st_gemm_choice_class(s->ta, s->K));
      int packs = PACKED_ANY(s->ta, s->K);
      for (int blas = 0; blas < 2; blas++) {
        for (int k = 0; k < ST_GEMM_CHOICES; k++) force[k] = -1;
        force[c] = blas;
        st_gemm_choose(force);
        int kernel = st_gemm_narrow_kernel(s->ta, s->tb, s->M, s->N, s->K, lda);
        CHECK(kernel == (blas || !packs ? NARROW_NONE : NARROW_PACKED),
              "%s forced to the %s: kernel %d", s->path,
              blas ? "BLAS" : "packed kernel", kernel);
        CHECK(st_gemm_chosen(c) == blas && st_gemm_choice_measured(),
              "%s: the table does not say what was set", s->path);
        run(s, PAD, 1.0f, 1.0f, 0, pools, 4);
        for (int k = 0; k < ST_GEMM_CHOICES; k++)
          if (k != c)
            CHECK(st_gemm_chosen(k) == RULE_BLAS(k), "%s: class %d moved",
                  s->path, k);
      }
    }
    /* a few rows (up to ST_NARROW_ROWS) keep the rule whatever the table */
    int narrow[2];
    for (int blas = 0; blas < 2; blas++) {
      for (int k = 0; k < ST_GEMM_CHOICES; k++) force[k] = blas;
      st_gemm_choose(force);
      narrow[blas] = st_gemm_narrow_kernel(0, 1, 12, 300, 2000, 2000);
    }
    st_gemm_choose(NULL);
    CHECK(narrow[0] == narrow[1] &&
              narrow[0] == st_gemm_narrow_kernel(0, 1, 12, 300, 2000, 2000),
          "12 rows x K 2000: kernel %d or %d by the table, %d by the rule",
          narrow[0], narrow[1],
          st_gemm_narrow_kernel(0, 1, 12, 300, 2000, 2000));
    CHECK(!st_gemm_choice_measured() && st_gemm_chosen(2) == RULE_BLAS(2) &&
              st_gemm_chosen(5) == RULE_BLAS(5) && !st_gemm_chosen(1),
          "st_gemm_choose(NULL) does not restore the built-in rule");
  }
  for (int i = 0; i < n; i++) run_bias(&shapes[i], pools, 4);
  for (int i = 0; i < n; i++) run_relu(&shapes[i], pools, 4);
  {
    st_pool *five = st_pool_create(5);
    st_pool *sweep_pools[5] = {NULL, pools[1], pools[2], pools[3], five};
    run_sweep(sweep_pools, 5);
    st_pool_destroy(five);
  }
#if defined(__FMA__)
  for (int i = 0; i < n; i++) {
    const shape *s = &shapes[i];
    int kernel = st_gemm_narrow_kernel(s->ta, s->tb, s->M, s->N, s->K,
                                       s->ta ? s->M : s->K);
    if (kernel == NARROW_PACKED || kernel == NARROW_AXPY ||
        kernel == NARROW_PACKED_COPY)
      run_chain(s);
    if (kernel == NARROW_PACKED_COPY) { /* and A read in place */
      st_gemm_copy_a_off(1);
      run_chain(s);
      st_gemm_copy_a_off(0);
    }
  }
  /* the packed kernel's strips packed in groups of 2, 3 and 8 (a task's
   * last group short, rows in blocks and a rest, each block over every
   * strip of its group): each element still one chain, and the same bits
   * on every pool, with a bias and a relu too */
  for (int g = 2; g <= 8; g += g == 2 ? 1 : 5) {
    st_gemm_strip_group(g);
    for (int i = 0; i < n; i++) {
      const shape *s = &shapes[i];
      int kernel = st_gemm_narrow_kernel(s->ta, s->tb, s->M, s->N, s->K,
                                         s->ta ? s->M : s->K);
      if (kernel != NARROW_PACKED && kernel != NARROW_PACKED_COPY) continue;
      run_chain(s);
      run(s, PAD, 0.5f, -0.75f, 0, pools, 4);
      run_bias(s, pools, 4);
      run_relu(s, pools, 4);
    }
  }
  st_gemm_strip_group(0);
#endif
#if defined(__AVX512F__) && defined(__FMA__)
  /* op(A) copied in panels of 12 rows for every packed product, A
   * transposed or not, in passes of 12 rows (5 asked), 36 and 240 (a
   * pass's last panel short where M is not a multiple of 12; from 240
   * rows, row chunks of whole panels within a pass): each element still
   * one chain, and the same bits on every pool, with alpha and beta, a
   * bias and a relu */
  static const int passes[3] = {5, 36, 240};
  for (int v = 0; v < 3; v++) {
    int pass = passes[v];
    st_gemm_copy_a_pass(pass);
    for (int i = 0; i < n; i++) {
      const shape *s = &shapes[i];
      int kernel = st_gemm_narrow_kernel(s->ta, s->tb, s->M, s->N, s->K,
                                         s->ta ? s->M : s->K);
      if (kernel == NARROW_PACKED) {
        CHECK(0, "%s: kernel packed with every A copied in panels", s->path);
        continue;
      }
      if (kernel != NARROW_PACKED_COPY) continue;
      run_chain(s);
      run(s, PAD, 0.5f, -0.75f, 0, pools, 4);
      run_bias(s, pools, 4);
      run_relu(s, pools, 4);
    }
  }
  st_gemm_copy_a_pass(0);
#endif
  for (int p = 1; p < 4; p++) st_pool_destroy(pools[p]);
  printf("%d passed, %d failed\n", th_passed, th_failed);
  return th_failed != 0;
}
