/*
 * narrow.c — the GEMMs of a narrow batch, without the BLAS's packing.
 *
 * Why: a linear layer at a micro-batch of a few samples multiplies a few
 * rows by its whole weight matrix. A BLAS sgemm first packs both operands
 * into its own layout; at 8 rows, packing the 784 x 256 weights of
 * FC-MNIST's first layer took as long as the products (OpenBLAS 0.3.21,
 * Zen 3). These kernels read each weight once, in place, and keep the few
 * rows of the other operand in cache. (One row goes to the BLAS's
 * matrix-vector product instead: gemm.c.)
 *
 * The two products of a linear layer's forward and input gradient, with
 * either weight layout, and where each beats OpenBLAS's sgemm (measured):
 *   dot:  C (M x N) = A (M x K) . B^T, B stored N x K   (trans_a 0, trans_b 1)
 *         2 <= M <= 8: 1.1x at 8 rows, 1.7x at 4, 3.8x at 2 (with AVX-512,
 *         6-8 rows go to the packed kernel unless N < 32: below);
 *   axpy: C (M x N) = A (M x K) . B,   B stored K x N   (trans_a 0, trans_b 0)
 *         2 <= M <= 16 and K <= 512: 1.3x to 3x. Past K = 512 its walk
 *         down a strip of B (2 VL columns) falls out of L1 (and, with B's
 *         rows a multiple of 4 KB apart, into a few cache sets): 0.4x to
 *         0.6x.
 *   packed: C = op(A) op(B) with any transposes, 2 <= M <= 1024 rows, K <=
 *         3072 (past K = 1024 with B transposed or from 512 rows; with A
 *         transposed K <= 64, or K <= 512 where A's rows lie at most 128
 *         floats apart), where the two above do not run; with
 *         AVX-512, far larger products (the limits below). A
 *         strip of op(B), K x 2 VL columns, is copied into one
 *         contiguous buffer (B transposed: 8 x 8 blocks at a time, in
 *         registers), and blocks of 6 rows of op(A) (12 with AVX-512)
 *         pass over it as in axpy; op(A) is read in place (with AVX-512,
 *         a transposed A whose rows lie far apart, or a large one, is
 *         first copied out in panels of 12 rows: COPY_A_LDA). The strip's
 *         copy keeps it in L1 whatever B's row stride, where axpy's walk
 *         down B fell into a few cache sets. On 1 thread (OpenBLAS 0.3.21, Zen
 * 3, best of 200): gpt_tiny's 12 products at batch 1 ran at 84-93 GFLOP/s
 * against the BLAS's 73-82 (one call each); attention's 32 x 32 blocks at 72-81
 * against 43-58; an MLP's at batch 32 and 256, 76-96 against 60-91, except a 32
 * x 512 x 512 product without transposes (73 against 76). With A transposed the
 * walk down A's columns costs past K = 64 (512 x 512 x 128: 82 against 84; 1024
 * x 1024 x 512: 67 against 92), hence its limit.
 *
 * VL, the lanes of the axpy and packed kernels, is 16 where the target has
 * AVX-512, else 8 (AVX) or 4. On Zen 5 (2026-11-27: one thread, hot caches,
 * best of 7 x 200 calls), 16 lanes against 8: gpt_tiny's 15 products at
 * batch 1 (forward, input and weight gradients of its 5 linear layers) at
 * 248 GFLOP/s against 132, axpy's shapes of 2-16 rows 1.1x to
 * 1.8x; gpt_tiny's batch-1 step on one thread 32-33k tokens/s against 20k,
 * the MLP's at batch 32 1.35x. (With 8 lanes GCC merged pairs of them
 * into 16-lane FMAs, but not the loads and broadcasts around them.)
 *
 * Determinism: every element of C is computed by the same instructions in
 * the same order wherever it falls in a register block, a strip or a task
 * (a lane of a vector FMA rounds as the scalar FMA does), so the
 * result depends only on the call's shape and operands, never on the thread
 * count. Register blocks are written with GCC's vector extension (16-float
 * AVX-512 registers, 8-float AVX ones, 4-float SSE ones, the widest the
 * target has). Each
 * a * b + c is one FMA where the target has one: spelled out with the
 * x86 intrinsics (vfma, fma1), elsewhere left to -ffp-contract=fast
 * (Makefile).
 */
#include "strata.h"
#include "narrow.h"

#include <stdatomic.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* Registers of floats. vd, DL lanes: the 8 x 8 transposes', 8 with AVX
 * (or AVX2), else 4 (SSE; a 32-byte vector there would be split in two
 * and would change the ABI of these inline helpers). vf, VL lanes: the
 * kernels', 16 where the target has AVX-512, else vd's width. A lane of
 * the axpy and packed kernels is one element's FMA chain over k, so their
 * width changes no bit; the dot kernel's lanes split the sum over k, so
 * its bits differ between a target with AVX-512 and one without. (One
 * Zen 5 core: 286 GFLOP/s of 16-lane FMAs, 143 of 8-lane ones; the dot
 * kernel at 8 rows of K = 784 ran 73 GFLOP/s with 16 lanes, 58 with 8.)
 * aligned(4) makes every load and store an unaligned one. */
#if defined(__AVX__)
typedef float vd __attribute__((vector_size(32), aligned(4), may_alias));
enum { DL = 8 };
#else
typedef float vd __attribute__((vector_size(16), aligned(4), may_alias));
enum { DL = 4 };
#endif
#if defined(__AVX512F__)
typedef float vf __attribute__((vector_size(64), aligned(4), may_alias));
enum { VL = 16 };
#else
typedef vd vf;
enum { VL = DL };
#endif

#define INLINE static inline __attribute__((always_inline))

INLINE vf load(const float *p) { return *(const vf *)p; }
INLINE vd load_d(const float *p) { return *(const vd *)p; }

/* Keeps v in a register: without it GCC folds a value that several FMAs
 * use into each of them as a memory operand, and the loads, not the FMAs,
 * bound the loop (the dot kernel ran at 37 GFLOP/s instead of 50). With
 * AVX-512 any of the 32 vector registers ("v"), else one of the 16. */
#if defined(__AVX512F__)
#define KEEP(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) || defined(__i386__)
#define KEEP(v) __asm__("" : "+x"(v)) /* an xmm or ymm register */
#else
#define KEEP(v) ((void)0)
#endif
INLINE void store(float *p, vf v) { *(vf *)p = v; }
INLINE void store_d(float *p, vd v) { *(vd *)p = v; }
INLINE vf splat(float x) {
#if defined(__AVX512F__)
  return (vf){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#elif defined(__AVX__)
  return (vf){x, x, x, x, x, x, x, x};
#else
  return (vf){x, x, x, x};
#endif
}

/* a b + c as one FMA where the target has one. Spelled out for scalar
 * loops: GCC vectorises `s += a[k] * b[k]` as an in-order reduction whose
 * products round apart from the sums, and so differs from the kernels'
 * lanes (an axpy tail column broke the one-chain rule of test_gemm). */
INLINE float fma1(float a, float b, float c) {
#if defined(__FMA__) || defined(__FP_FAST_FMAF)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

/* a b + c in every lane, as one FMA where the target has one: spelled out,
 * so that the bits do not hang on the compiler contracting `c += a * b`
 * (at -O1, as the sanitizer builds compile, GCC 12 left some of this
 * file's products and sums apart even with -ffp-contract=fast, and
 * test_e2e's AdamW MLP drifted 1.1% from PyTorch's loss in 100 steps). */
INLINE vf vfma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

/* The lanes' sum in a fixed tree: 16 lanes fold into 8 (lane i + lane
 * i + 8), then 8 as before. */
INLINE float hsum(vf v) {
#if defined(__AVX512F__)
  float u[8];
  for (int i = 0; i < 8; i++) u[i] = v[i] + v[i + 8];
  return ((u[0] + u[4]) + (u[2] + u[6])) + ((u[1] + u[5]) + (u[3] + u[7]));
#elif defined(__AVX__)
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
#else
  return (v[0] + v[2]) + (v[1] + v[3]);
#endif
}

/* How a sum x meets C: C = alpha x + beta C, with C not read when beta is
 * 0 (it may hold anything, as with the BLAS); the linear layers' two
 * cases, C = x and C += x, without the multiplications by 1. With relu,
 * the result then goes through relu as activation.c computes it (x > 0 ?
 * x : 0, so a NaN or -0 gives +0): a linear layer's forward with the
 * relu after it, the same bits as the two apart. */
enum { SET, ADD, SCALED };

INLINE float finish(int how, float x, float alpha, float beta, const float *c,
                    int relu) {
  float y = how == SET   ? alpha * x
            : how == ADD ? *c + x
                         : fma1(alpha, x, beta * *c);
  return relu && y <= 0.0f ? 0.0f : y; /* a NaN kept: st_relu_forward */
}

/* Integers of vf's width: a lane-wise compare's mask. */
typedef int vfm __attribute__((vector_size(sizeof(vf))));

INLINE vf finish_v(int how, vf x, float alpha, float beta, const float *c,
                   int relu) {
  vf y;
  if (how == SET)
    y = splat(alpha) * x;
  else if (how == ADD)
    y = load(c) + x;
  else
    y = vfma(splat(alpha), x, splat(beta) * load(c));
  /* +0 where y <= 0, else y (a NaN kept: st_relu_forward); a true
   * compare's lanes are all one bits */
  return relu ? (vf)(~(vfm)(y <= splat(0.0f)) & (vfm)y) : y;
}

typedef struct narrow_job {
  int M, N, K, lda, ldb, ldc;
  int how; /* SET, ADD or SCALED */
  float alpha, beta;
  const float *A, *B;
  float *C;
  int per_task;      /* columns of C per task */
  int ta, tb;        /* the packed path's transposes; ta A_PANELS: panels */
  const float *bias; /* with how ADD: added in place of C (C not read) */
  int relu;          /* C then goes through relu (finish) */
  /* The packed path's tasks: col_tasks across C's columns times row
   * chunks of rows_per_task (1 chunk of M rows unless few columns). */
  int col_tasks, rows_per_task;
  int group; /* strips of op(B) packed at once (packed_task) */
} narrow_job;

/* What a sum of C's row is added to (how ADD): C's own element, or with a
 * bias the bias's element of the same column. */
INLINE const float *addend(const narrow_job *J, const float *c, int col) {
  return J->bias ? J->bias + col : c;
}

/* ---------------------------------------------------------------- dot */

/* C[r][j] for RR rows from r0 and RJ columns from j0: lanes accumulate
 * k = lane (mod VL) in order, then a fixed tree, then the tail in order. */
INLINE void dot_block(const narrow_job *J, int r0, int j0, int RR, int RJ,
                      int RELU) {
  const float *A = J->A, *B = J->B;
  int K = J->K, lda = J->lda, ldb = J->ldb;
  vf acc[2][4];
  for (int r = 0; r < RR; r++)
    for (int j = 0; j < RJ; j++) acc[r][j] = splat(0.0f);
  int k = 0;
  for (; k + VL <= K; k += VL) {
    vf b[4];
    for (int j = 0; j < RJ; j++) b[j] = load(B + (size_t)(j0 + j) * ldb + k);
    for (int r = 0; r < RR; r++) {
      vf a = load(A + (size_t)(r0 + r) * lda + k);
      KEEP(a);
      for (int j = 0; j < RJ; j++) acc[r][j] = vfma(a, b[j], acc[r][j]);
    }
  }
  float alpha = J->alpha, beta = J->beta, *C = J->C;
  int how = J->how;
  size_t ldc = (size_t)J->ldc;
  for (int r = 0; r < RR; r++)
    for (int j = 0; j < RJ; j++) {
      const float *a = A + (size_t)(r0 + r) * lda;
      const float *b = B + (size_t)(j0 + j) * ldb;
      float s = hsum(acc[r][j]);
      for (int t = k; t < K; t++) s = fma1(a[t], b[t], s);
      float *c = C + (r0 + r) * ldc + j0 + j;
      *c = finish(how, s, alpha, beta, addend(J, c, j0 + j), RELU);
    }
}

/* Rows in pairs (then one) against columns in blocks of 4 (then 1): 8
 * accumulators and 6 loads per 8 FMAs, within AVX2's 16 registers. The 4
 * columns of B (4 rows of the weights) stay in L1 while every row of A
 * passes over them. */
INLINE void dot_columns(const narrow_job *J, int j0, int RJ, int RELU) {
  int r = 0;
  for (; r + 2 <= J->M; r += 2) dot_block(J, r, j0, 2, RJ, RELU);
  if (r < J->M) dot_block(J, r, j0, 1, RJ, RELU);
}

/* RELU a constant in each copy (as axpy_span, below) */
INLINE void dot_span(const narrow_job *J, int t, int RELU) {
  int j = t * J->per_task,
      end = j + J->per_task < J->N ? j + J->per_task : J->N;
  for (; j + 4 <= end; j += 4) dot_columns(J, j, 4, RELU);
  for (; j < end; j++) dot_columns(J, j, 1, RELU);
}
static void dot_task(void *arg, int t) {
  const narrow_job *J = arg;
  if (J->relu)
    dot_span(J, t, 1);
  else
    dot_span(J, t, 0);
}

/* --------------------------------------------------------------- axpy */

/* C[r][n .. n + 8 NV) for RR rows from r0: each lane sums over k in
 * order, A's element broadcast against B's row segment. */
INLINE void axpy_block(const narrow_job *J, int r0, int n, int RR, int NV,
                       int RELU) {
  const float *A = J->A, *B = J->B;
  int K = J->K, lda = J->lda, ldb = J->ldb;
  vf acc[6][2];
  for (int r = 0; r < RR; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = splat(0.0f);
  for (int k = 0; k < K; k++) {
    vf b[2];
    for (int v = 0; v < NV; v++) {
      b[v] = load(B + (size_t)k * ldb + n + v * VL);
      KEEP(b[v]);
    }
    for (int r = 0; r < RR; r++) {
      vf a = splat(A[(size_t)(r0 + r) * lda + k]);
      for (int v = 0; v < NV; v++) acc[r][v] = vfma(a, b[v], acc[r][v]);
    }
  }
  float alpha = J->alpha, beta = J->beta, *C = J->C;
  int how = J->how;
  size_t ldc = (size_t)J->ldc;
  for (int r = 0; r < RR; r++)
    for (int v = 0; v < NV; v++) {
      float *c = C + (r0 + r) * ldc + n + v * VL;
      store(c, finish_v(how, acc[r][v], alpha, beta, addend(J, c, n + v * VL),
                        RELU));
    }
}

/* The same sums for one column (the last N mod VL). */
static void axpy_column(const narrow_job *J, int n) {
  for (int r = 0; r < J->M; r++) {
    const float *a = J->A + (size_t)r * J->lda;
    float s = 0.0f;
    for (int k = 0; k < J->K; k++)
      s = fma1(a[k], J->B[(size_t)k * J->ldb + n], s);
    float *c = J->C + (size_t)r * J->ldc + n;
    *c = finish(J->how, s, J->alpha, J->beta, addend(J, c, n), J->relu);
  }
}

/* Rows in blocks of 6 (the rest in one block) against 2 VL columns (16
 * with AVX, 32 with AVX-512): 12 accumulators, 8 loads per 12 FMAs. The
 * strip of B (K x 2 VL floats: 64 KB at the packed kernel's K = 1024 with
 * AVX2, 384 KB at its 3072 with AVX-512) stays in cache while the blocks
 * of rows pass over it. */
INLINE void axpy_columns(const narrow_job *J, int n, int NV, int RELU) {
  int r = 0;
  for (; r + 6 <= J->M; r += 6) axpy_block(J, r, n, 6, NV, RELU);
  switch (J->M - r) {
  case 5:
    axpy_block(J, r, n, 5, NV, RELU);
    break;
  case 4:
    axpy_block(J, r, n, 4, NV, RELU);
    break;
  case 3:
    axpy_block(J, r, n, 3, NV, RELU);
    break;
  case 2:
    axpy_block(J, r, n, 2, NV, RELU);
    break;
  case 1:
    axpy_block(J, r, n, 1, NV, RELU);
    break;
  }
}

/* RELU a constant in each copy, so that the plain product's stores are
 * what they were before relu came (a test of it at every store cost 7% of
 * 8 x 256 x 256). */
INLINE void axpy_span(const narrow_job *J, int t, int RELU) {
  int n = t * J->per_task,
      end = n + J->per_task < J->N ? n + J->per_task : J->N;
  for (; n + 2 * VL <= end; n += 2 * VL) axpy_columns(J, n, 2, RELU);
  for (; n + VL <= end; n += VL) axpy_columns(J, n, 1, RELU);
  for (; n < end; n++) axpy_column(J, n);
}
static void axpy_task(void *arg, int t) {
  const narrow_job *J = arg;
  if (J->relu)
    axpy_span(J, t, 1);
  else
    axpy_span(J, t, 0);
}

/* narrow.h */
void st_narrow_row(int N, int K, float alpha, const float *x, const float *B,
                   int ldb, float *y) {
  narrow_job J = {.M = 1,
                  .N = N,
                  .K = K,
                  .lda = K,
                  .ldb = ldb,
                  .ldc = N,
                  .how = SET,
                  .alpha = alpha,
                  .A = x,
                  .B = B,
                  .C = y,
                  .per_task = N};
  axpy_task(&J, 0);
}

/* ------------------------------------------------------------- packed */

/* A strip of op(B): K rows of STRIP consecutive columns of C, copied into
 * one contiguous buffer (the columns past N zero). */
enum { STRIP = 2 * VL };
#if defined(__AVX512F__)
#define PACKED_MR 12 /* rows of a register block at most (packed_rows) */
#else
#define PACKED_MR 6
#endif
/* op(A)'s layouts in the packed kernel: its rows (A untransposed, row
 * stride lda), its columns (A transposed), or panels of PANEL rows, each
 * step of k their PANEL elements side by side (copied: copy_a_task). */
enum { A_ROWS, A_COLS, A_PANELS };
enum { PANEL = PACKED_MR, PANEL_AHEAD = 1024 };
/* The packed kernel's limits (this file's header). It runs only where the
 * target has FMA: without it (a build without -march=native) each product
 * and sum round apart, and a CNN's AdamW trajectory in test_e2e drifted
 * from PyTorch's by 5.5e-4 in 100 steps (1e-4 allowed), where OpenBLAS
 * picks FMA kernels at run time. Without AVX-512 the limits are those
 * measured against OpenBLAS's 8-lane kernels on Zen 3 (above).
 *
 * With AVX-512 it takes far larger products, up to 4096 rows and K =
 * 3072. Measured on Zen 5 (2026-11-27, one thread unless said), where
 * OpenBLAS 0.3.21 does not know the CPU and runs its 8-lane Haswell
 * kernels:
 *   - a GPT-2-124M layer's products at 1024 rows: 257-274 GFLOP/s at K <=
 *     1536, 166-192 at K = 2048-3072, against the BLAS's 122-137;
 *     4096 x 768 x 768 at 270 against 135, and on 2 threads 4096 x 768 x
 *     3072 at 335 against 245;
 *   - a transposed A past K = 64, read in place down its columns: at 768
 *     columns and K = 1024, 190-270 against 126-131, except with A's rows
 *     a multiple of 4 KB apart (lda 1024, 2048, 3072, 4096 measured:
 *     115-143, about the BLAS's), which go to the BLAS;
 *   - where OpenBLAS runs its own AVX-512 kernels (OPENBLAS_CORETYPE=
 *     SkylakeX on the same machine) it reached 223-235 on the 124M
 *     products and 195-231 at K = 2048-3072: there the packed kernel
 *     took K up to 1536 only (st_blas_avx512; since 2026-12-02 with A
 *     transposed only: rule_blas). Other BLAS libraries count as having
 *     such kernels.
 * The strips, K x STRIP floats each, live on the task's stack: one strip
 * up to 192 KB at K = 3072 with AVX2, 384 KB with AVX-512, or a group of
 * strips up to GROUP_CAP (512 KB; packed_group). glibc gives the main
 * thread and every new thread the stack size limit, 8 MB unless set
 * otherwise; a limit (`ulimit -s`) under about 1 MB is not supported. */
#if defined(__AVX512F__) && defined(__FMA__)
enum { PACKED_ROWS = 4096, PACKED_K = 3072, PACKED_K_WIDE_BLAS = 1536 };
/* B untransposed: no row limit past some K was measured with AVX-512 */
enum { PACKED_K_PLAIN_B = PACKED_K, PACKED_PLAIN_B_ROWS = 0 };
#elif defined(__FMA__)
/* AVX2: K up to 1024 since 2026-11-29 (from 512), and up to 3072 later
 * that day with B transposed or at least PACKED_PLAIN_B_ROWS rows. On the
 * 2-vCPU Zen 3 VM (OpenBLAS 0.3.21's "Zen" kernels), 2 threads:
 *   - K 1024 against 512, alternating pairs: `bench_gpt 124m 4 2`
 *     191.6-199.0 against 185.4-190.3 tokens/s (each of 4 pairs ahead;
 *     its products at K = 768 leave the BLAS), `bench_mlp` at batch 32
 *     +2-7% and at 256 +1-6% (3 pairs each; the first layer's K = 784).
 *     The strip then spills L1 into L2; the BLAS's packing costs more
 *     than that at these sizes.
 *   - K 3072 (hot operands, best of 7): GPT-2's K = 3072 products at 1024
 *     rows, 186-190 GFLOP/s against the BLAS's 172-174; B transposed at
 *     16-256 rows and K 3072-4096, 129-189 against 110-169. B not
 *     transposed, its strip is K rows far apart (a page or more each at
 *     N = 3072): at 16-192 rows 78-170 against 120-173, at 256 mixed
 *     (160-175 against 170-174), from 512 rows 174-188 against 170-178.
 *     `bench_gpt 124m 4 2`, alternating with K up to 1024: 204.1-207.1
 *     tokens/s against 198.7-199.6 in 2 pairs, 199.6-200.5 against
 *     190.9-197.0 in 3 more (FMA-peak share 0.74-0.77 against 0.71-0.74).
 *     (Its products at K = 3072 have 1024 rows, so the row limit for B
 *     untransposed does not touch them.) */
enum { PACKED_ROWS = 1024, PACKED_K = 3072, PACKED_K_WIDE_BLAS = 3072 };
enum { PACKED_K_PLAIN_B = 1024, PACKED_PLAIN_B_ROWS = 512 };
#else
enum { PACKED_ROWS = 0, PACKED_K = 0, PACKED_K_WIDE_BLAS = 0 };
enum { PACKED_K_PLAIN_B = 0, PACKED_PLAIN_B_ROWS = 0 };
#endif
/* A transposed is read in place down its columns up to this K whatever
 * its stride; up to PACKED_TRANS_A_K where its rows lie at most
 * PACKED_TRANS_A_LDA floats apart (a narrow layer's weight gradient); and
 * past both (with AVX-512 only) where its rows do not lie a multiple of
 * ALIAS_STRIDE floats (4 KB) apart.
 *
 * The narrow case, measured on the Zen 3 VM (2026-11-29, AVX2, 2 threads,
 * hot operands, best of 7 x 200 calls), packed against the BLAS's tiles,
 * GFLOP/s: an MLP head's weight gradient 10 x 256 x 256 (M x N x K, lda
 * 10) 100-107 against 60-63, 10 x 784 x 400 110 against 75, 32 x 784 x
 * 256 149 against 136, 64 x 784 x 256 171 against 155, 128 x 256 x 256
 * 175 against 165, 128 x 784 x 512 169 against 164. Past the limits it
 * lost: lda 256 (256 x 256 x 128: 153 against 167; 256 x 256 x 256: 144
 * against 171) and K 1024 (64 x 768 x 1024: 146 against 162; 10 x 768 x
 * 3072: 70 against 73). */
enum { PACKED_TRANS_A_ANY_K = 64, ALIAS_STRIDE = 1024 };
enum { PACKED_TRANS_A_LDA = 128, PACKED_TRANS_A_K = 512 };

/* With AVX-512, a transposed A past K = PACKED_TRANS_A_ANY_K whose rows
 * lie at least COPY_A_LDA floats apart is first copied out (op(A) in
 * panels of 12 rows, A_PANELS, on the pool) into the calling thread's
 * scratch, COPY_A_BYTES at most a pass, and the packed kernel reads the
 * copy: each element is the same FMA chain as when A is read in place
 * (the header), which is what runs if the scratch cannot be had. (Until
 * 2026-12-02 the copy was op(A) untransposed, in 8 x 8 transposes, 4 MB a
 * pass.) Read in place, each step of k is a
 * row of A lda floats on: past 2 KB a new page every step or two, which
 * the prefetchers do not follow, and with rows a multiple of 4 KB apart
 * the same few cache sets. GPT-2's weight gradients are such products (A
 * the output gradient, K the tokens, lda the layer's width).
 *
 * Measured on a 2-vCPU Intel Xeon VM (family 6 model 207: AVX-512 with
 * AVX512-BF16; 2026-11-30, OpenBLAS 0.3.21 does not know the CPU and runs
 * its SSE3 "Prescott" kernels at 26-37 GFLOP/s a thread), GFLOP/s, hot
 * operands, best of 25 x 3 calls, one thread unless said, in place
 * against copied:
 *   - GPT-2-124M's weight gradients at 1024 tokens (M x N x K, lda M):
 *     2304 x 768 x 1024 69-95 against 114-171, 768 x 768 x 1024 91-106
 *     against 173-175, 768 x 3072 x 1024 74-98 against 101-171; 3072 x
 *     768 x 1024 (lda 3072, which went to the BLAS) 26-37 against 160-165;
 *   - 512 x 784 x 1024 104 against 177 (2 threads 189 against 327),
 *     1024 x 1024 x 512 102 against 184, 2304 x 768 x 256 113 against 184;
 *   - at lda 256 and less in place held: 256 x 784 x 256 193 against 127
 *     (2 threads 193 against 291), 256 x 3072 x 256 192 against 190,
 *     64 x 768 x 1024 (lda 64) 170 against 153 (2 threads 340 against
 *     155).
 * `bench_gpt 124m 4 2`, alternating: 158-184 tokens/s (0.29-0.36 of the
 * FMA peak) before, 320-334 (0.60-0.65) copied. Without AVX-512 a copy
 * paid only at 128-256 rows and by about 1% in a training step (Zen 3,
 * docs/bench.md), so it does not run there.
 *
 * Since 2026-12-02 an untransposed A is copied so too where it passes
 * half of L2 against at least PANEL_MIN_N columns (GPT-2's products but
 * for the weight gradients, which copy as above). In place a 12-row block
 * reads 12 streams lda floats apart, once for each group of strips (a
 * group is one strip past K = 1024 on Zen 5's 1 MB of L2: packed_group);
 * the panels are one stream,
 * prefetched PANEL_AHEAD floats on (from DRAM the one stream without it
 * ran slower than the twelve). On the 2-vCPU Zen 5 VM (AMD EPYC family 26
 * model 2, one thread, the kernel's rate over an FMA loop's measured
 * beside each call, medians of 20-30 calls alternating copied and in
 * place, operands in st_alloc's huge pages):
 *   - one 12 x 32 register block over 85 blocks of A (a harness): 3 MB of
 *     A (K = 768) 0.86 in place against 0.96 in panels; 12 MB (K = 3072)
 *     0.85 against 0.65-0.69 without the prefetch, 0.94-0.96 with it 512
 *     and 1024 floats on;
 *   - GPT-2-124M's products, M x N x K: 1024 x 768 x 3072 0.70-0.80
 *     against 0.84-0.88 copied, B transposed 0.69 against 0.86; 3072 x
 *     768 x 1024 (A transposed, read in place down its columns) 0.76
 *     against 0.87; 1024 x 3072 x 768, 1024 x 2304 x 768 and 1024 x 768 x
 *     768 within 1% either way. 1024 x 768 x 1024 ran in place at 0.69
 *     in some processes and 0.89-0.90 in others, copied at 0.84-0.89 in
 *     all; the copy lost 3-6% at 1024 x 768 x 1536 and 1024 x 256 x 3072.
 *   - `bench_gpt 124m 4 2` (fp32), this binary against the one before,
 *     alternating: see docs/bench.md (forty-second session).
 * The copy is a pass over A, a share 1/N of the product's FMAs; under
 * PANEL_MIN_N columns it was not measured. */
#if defined(__AVX512F__) && defined(__FMA__)
enum { COPY_A_LDA = 512, COPY_A_BYTES = 16 << 20, PANEL_MIN_N = 256 };
#else
enum { COPY_A_LDA = 0, COPY_A_BYTES = 0, PANEL_MIN_N = 0 };
#endif

/* The packed kernel or the BLAS, by product class (st_gemm_choose): 0
 * packed, 1 BLAS, -1 unset (rule_blas: the BLAS for A transposed past
 * PACKED_K_WIDE_BLAS where it has 16-lane kernels). Read once per product;
 * set between runs, never during one. */
static _Atomic int choice[ST_GEMM_CHOICES] = {-1, -1, -1, -1, -1, -1};

int st_gemm_choice_class(int trans_a, int K) {
  int band = K <= 512 ? 0 : K <= 1536 ? 1 : 2;
  return (trans_a ? 3 : 0) + band;
}

void st_gemm_choose(const int *blas) {
  for (int c = 0; c < ST_GEMM_CHOICES; c++)
    atomic_store_explicit(&choice[c], blas && blas[c] >= 0 ? blas[c] != 0 : -1,
                          memory_order_relaxed);
}

int st_gemm_choice_measured(void) {
  for (int c = 0; c < ST_GEMM_CHOICES; c++)
    if (atomic_load_explicit(&choice[c], memory_order_relaxed) >= 0) return 1;
  return 0;
}

/* The rule built in: the BLAS for A transposed past PACKED_K_WIDE_BLAS
 * (class 5) where it has 16-lane kernels, the packed kernel for the rest.
 * Until 2026-12-02 the rule sent A plain past that K (class 2) to the BLAS
 * too, from Zen 5 with OpenBLAS forced onto its SkylakeX kernels
 * (above), before the packed kernel's 12-row blocks and strip groups.
 * Every machine since whose OpenBLAS picks such kernels by itself
 * measured class 2 faster packed, one thread, GFLOP/s packed against the
 * BLAS: Zen 4 (Cooperlake's kernels, 500 x 768 x 3072) 103.5 against
 * 75.2; an Intel Xeon with AMX (SkylakeX's, the calibration's 512 x 768 x
 * 3072) 201.0 against 148.0, and GPT-2-124M's 1024 x 768 x 3072 and 1024
 * x 768 x 2304 199-208 against 153-167. Class 5 is mixed: Zen 4 read a
 * transposed A of 500 rows in place at 47.0 against 72.4; the Intel Xeon
 * 160.6 against 129.2. */
static int rule_blas(int c) {
  return c == 5 && st_blas_avx512() && PACKED_K_WIDE_BLAS < PACKED_K;
}

int st_gemm_chosen(int c) {
  int v = atomic_load_explicit(&choice[c], memory_order_relaxed);
  return v >= 0 ? v : rule_blas(c);
}

void st_gemm_piece_limits(int *rows, int *K) {
#if defined(__AVX512F__) && defined(__FMA__)
  *rows = PACKED_ROWS, *K = PACKED_K;
#else
  *rows = 0, *K = 0;
#endif
}

static long l2_bytes(void);

/* Whether the packed kernel reads op(A) from a copy in panels: a
 * transposed A as COPY_A_LDA says; an untransposed one past half of L2
 * against at least PANEL_MIN_N columns (COPY_A_LDA). */
static int copies_a(int trans_a, int M, int N, int K, int lda) {
  if (COPY_A_LDA == 0) return 0;
  if (trans_a) return K > PACKED_TRANS_A_ANY_K && lda >= COPY_A_LDA;
  return N >= PANEL_MIN_N && (long)M * K * (long)sizeof(float) > l2_bytes() / 2;
}

/* Products of up to ST_NARROW_ROWS rows keep the rule: the table was
 * measured at 500 rows, where the BLAS's packing pays for itself, and a
 * few rows are the dot or axpy kernels' or the packed kernel's (below). */
static int packed_fits(int trans_a, int trans_b, int M, int K, int lda) {
  if (M > PACKED_ROWS || K > PACKED_K) return 0;
  if (!trans_b && K > PACKED_K_PLAIN_B && M < PACKED_PLAIN_B_ROWS) return 0;
  int c = st_gemm_choice_class(trans_a, K);
  if (M > ST_NARROW_ROWS ? st_gemm_chosen(c) : rule_blas(c)) return 0;
  if (!trans_a || K <= PACKED_TRANS_A_ANY_K) return 1;
  if (lda <= PACKED_TRANS_A_LDA && K <= PACKED_TRANS_A_K) return 1;
  if (copies_a(trans_a, M, 0, K, lda)) return 1;
#if defined(__AVX512F__)
  return lda % ALIAS_STRIDE != 0;
#else
  (void)lda;
  return 0;
#endif
}

#if defined(__AVX__)
/* Lanes of a and b (0-7 a's, 8-15 b's) picked by 8 constant indices:
 * GCC's and clang's spellings of the same shuffle. */
#if defined(__clang__)
#define SHUF(a, b, i0, i1, i2, i3, i4, i5, i6, i7)                             \
  __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
typedef int vi __attribute__((vector_size(32)));
#define SHUF(a, b, i0, i1, i2, i3, i4, i5, i6, i7)                             \
  __builtin_shuffle(a, b, (vi){i0, i1, i2, i3, i4, i5, i6, i7})
#endif

/* dst[j * dld + i] = src[i * ld + j] for an 8 x 8 block: pairs, then
 * quads within each half, then the halves (unpack, shuffle, permute). */
INLINE void transpose8(const float *src, size_t ld, float *dst, size_t dld) {
  vd r[8], t[8];
  for (int i = 0; i < 8; i++) r[i] = load_d(src + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = SHUF(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = SHUF(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; h++) {
      r[i + h] = SHUF(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      r[i + h + 2] = SHUF(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  /* r[0..3]: columns 0, 2, 1, 3 of rows 0-3 (low half) and 4, 6, 5, 7
   * (high half); r[4..7] the same for rows 4-7 */
  static const int col[4] = {0, 2, 1, 3};
  for (int q = 0; q < 4; q++) {
    store_d(dst + (size_t)col[q] * dld,
            SHUF(r[q], r[q + 4], 0, 1, 2, 3, 8, 9, 10, 11));
    store_d(dst + (size_t)(col[q] + 4) * dld,
            SHUF(r[q], r[q + 4], 4, 5, 6, 7, 12, 13, 14, 15));
  }
}
#endif

static void pack_strip(const narrow_job *J, int n, int w, float *strip) {
  const float *B = J->B;
  size_t ldb = (size_t)J->ldb;
  int K = J->K;
  if (w < STRIP)
    for (int k = 0; k < K; k++)
      for (int j = w; j < STRIP; j++) strip[(size_t)k * STRIP + j] = 0.0f;
  if (J->tb) { /* B stored N x K: the strip's column j is B's row n + j */
    int j = 0;
#if defined(__AVX__)
    for (; j + 8 <= w; j += 8) {
      int k = 0;
      for (; k + 8 <= K; k += 8)
        transpose8(B + (n + j) * ldb + k, ldb, strip + (size_t)k * STRIP + j,
                   STRIP);
      for (int jj = j; jj < j + 8; jj++)
        for (int kk = k; kk < K; kk++)
          strip[(size_t)kk * STRIP + jj] = B[(n + jj) * ldb + kk];
    }
#endif
    for (; j < w; j++) {
      const float *b = B + (n + j) * ldb;
      for (int k = 0; k < K; k++) strip[(size_t)k * STRIP + j] = b[k];
    }
  } else if (w == STRIP) {
    for (int k = 0; k < K; k++) {
      const float *b = B + k * ldb + n;
      store(strip + (size_t)k * STRIP, load(b));
      store(strip + (size_t)k * STRIP + VL, load(b + VL));
    }
  } else {
    for (int k = 0; k < K; k++)
      for (int j = 0; j < w; j++)
        strip[(size_t)k * STRIP + j] = B[k * ldb + n + j];
  }
}

/* C[r][n .. n + w) for RR rows of op(A) from r0 against a packed strip:
 * as axpy_block, each lane sums over k in order. op(A)'s element (r, k)
 * lies at A + r * rs + k * ks: A untransposed (TA A_ROWS) or transposed
 * (A_COLS), or copied into panels (A_PANELS: copy_a_task; the block lies
 * within one panel). */
INLINE void packed_block(const narrow_job *J, const float *strip, int r0, int n,
                         int w, int RR, int TA, int RELU) {
  const float *A = J->A;
  size_t rs = TA == A_ROWS ? (size_t)J->lda : 1, ks = TA == A_ROWS ? 1
                                                      : TA == A_COLS
                                                          ? (size_t)J->lda
                                                          : PANEL;
  if (TA == A_PANELS) /* row r0 + r of the panel at A + (r0 / PANEL) PANEL K */
    A += (size_t)(r0 / PANEL) * PANEL * (J->K - 1);
  vf acc[PACKED_MR][2];
  for (int r = 0; r < RR; r++) acc[r][0] = acc[r][1] = splat(0.0f);
  for (int k = 0; k < J->K; k++) {
    vf b0 = load(strip + (size_t)k * STRIP),
       b1 = load(strip + (size_t)k * STRIP + VL);
    KEEP(b0);
    KEEP(b1);
    if (TA == A_PANELS) __builtin_prefetch(A + r0 + k * ks + PANEL_AHEAD);
    for (int r = 0; r < RR; r++) {
      vf a = splat(A[(r0 + r) * rs + k * ks]);
      acc[r][0] = vfma(a, b0, acc[r][0]);
      acc[r][1] = vfma(a, b1, acc[r][1]);
    }
  }
  float alpha = J->alpha, beta = J->beta, *C = J->C;
  int how = J->how, relu = RELU;
  size_t ldc = (size_t)J->ldc;
  for (int r = 0; r < RR; r++) {
    float *c = C + (r0 + r) * ldc + n;
    if (w == STRIP) {
      store(c, finish_v(how, acc[r][0], alpha, beta, addend(J, c, n), relu));
      store(c + VL, finish_v(how, acc[r][1], alpha, beta,
                             addend(J, c + VL, n + VL), relu));
    } else {
      float lane[STRIP]; /* acc itself stays in registers */
      store(lane, acc[r][0]);
      store(lane + VL, acc[r][1]);
      for (int j = 0; j < w; j++)
        c[j] = finish(how, lane[j], alpha, beta, addend(J, c + j, n + j), relu);
    }
  }
}

/* Rows in blocks of PACKED_MR, then of 6 (the rest in one block) against
 * one packed strip: with 6, 12 accumulators, 2 loads and 6 broadcasts per
 * 12 FMAs. With AVX-512's 32 registers blocks of 12 rows come first (24
 * accumulators, 2 loads per 24 FMAs, half the strip's reads from L2): on
 * the Intel Xeon VM of COPY_A_LDA (2026-11-30, hot operands, 40
 * alternating pairs, median GFLOP/s, 6 against 12 rows), one thread:
 * GPT-2-124M's 1024 x 3072 x 768 155.7 against 166.0, 3072 x 768 x 1024
 * (A transposed) 158.7 / 163.6, 1024 x 768 x 3072 172.5 / 178.0, 768 x
 * 3072 x 1024 157.4 / 160.1; two threads: the first three 264 / 279, 241
 * / 244, 292 / 303, 1024 x 2304 x 768 241 / 256, an MLP's 256 x 784 x 784
 * 234 / 254, 32 x 256 x 784 165 / 173. (Tasks of fewer rows, so that a
 * task's rows of A stay in L2 across its strips, lost: 1024 x 768 x 3072
 * at 111.) An element's chain is the same in either block. */
INLINE void packed_rows(const narrow_job *J, const float *strip, int n, int w,
                        int TA, int RELU, int r, int end) {
#if PACKED_MR == 12
  for (; r + 12 <= end; r += 12) packed_block(J, strip, r, n, w, 12, TA, RELU);
#endif
  for (; r + 6 <= end; r += 6) packed_block(J, strip, r, n, w, 6, TA, RELU);
  switch (end - r) {
  case 5:
    packed_block(J, strip, r, n, w, 5, TA, RELU);
    break;
  case 4:
    packed_block(J, strip, r, n, w, 4, TA, RELU);
    break;
  case 3:
    packed_block(J, strip, r, n, w, 3, TA, RELU);
    break;
  case 2:
    packed_block(J, strip, r, n, w, 2, TA, RELU);
    break;
  case 1:
    packed_block(J, strip, r, n, w, 1, TA, RELU);
    break;
  }
}

/* TA and RELU constants in each copy, as in axpy_span (a test of relu
 * at every store cost 15% of 256 x 784 x 8, A transposed); a function for
 * each layout: with the three in one, GCC 12 kept the 12-row blocks'
 * accumulators in registers no longer (moves and spills in the loop, all
 * three layouts at 0.7 of the FMA peak against 0.9). */
#define PACKED_STRIP(name, TA)                                                 \
  static void name(const narrow_job *J, const float *strip, int n, int w,      \
                   int r0, int r1) {                                           \
    if (J->relu)                                                               \
      packed_rows(J, strip, n, w, TA, 1, r0, r1);                              \
    else                                                                       \
      packed_rows(J, strip, n, w, TA, 0, r0, r1);                              \
  }
PACKED_STRIP(packed_strip_rows, A_ROWS)
PACKED_STRIP(packed_strip_cols, A_COLS)
PACKED_STRIP(packed_strip_panels, A_PANELS)

static void packed_strip(const narrow_job *J, const float *strip, int n, int w,
                         int r0, int r1) {
  if (J->ta == A_PANELS)
    packed_strip_panels(J, strip, n, w, r0, r1);
  else if (J->ta)
    packed_strip_cols(J, strip, n, w, r0, r1);
  else
    packed_strip_rows(J, strip, n, w, r0, r1);
}

enum { GROUP_MAX = 8, GROUP_CAP = 512 << 10 }; /* packed_group */

/* A task's columns in groups of J->group strips: the group's strips
 * packed, then each register block of rows passes over every strip of the
 * group in turn, so that its rows of op(A) come from L1 for all but the
 * first strip where they came from L3 for each (op(A) at GPT-2's 1024 x 768
 * is 3 MB, past L2). The elements' chains are those of one strip at a time. */
static void packed_task(void *arg, int t) {
  const narrow_job *J = arg;
  size_t each = (size_t)J->K * STRIP;
  float strips[each * J->group] __attribute__((aligned(64)));
  int n = (t % J->col_tasks) * J->per_task;
  int end = n + J->per_task < J->N ? n + J->per_task : J->N;
  int r0 = (t / J->col_tasks) * J->rows_per_task;
  int r1 = r0 + J->rows_per_task < J->M ? r0 + J->rows_per_task : J->M;
  int at[GROUP_MAX], w[GROUP_MAX];
  while (n < end) {
    int g = 0;
    for (; g < J->group && n < end; g++, n += STRIP) {
      at[g] = n, w[g] = end - n < STRIP ? end - n : STRIP;
      pack_strip(J, n, w[g], strips + g * each);
    }
    int r = r0;
    for (; r + PACKED_MR <= r1; r += PACKED_MR)
      for (int s = 0; s < g; s++)
        packed_strip(J, strips + s * each, at[s], w[s], r, r + PACKED_MR);
    for (int s = 0; r < r1 && s < g; s++)
      packed_strip(J, strips + s * each, at[s], w[s], r, r1);
  }
}

/* -------------------------------------------------- A copied in panels */

/* op(A)'s M x K rows written to T in panels (A_PANELS): row i's element k
 * at T[(i / PANEL) PANEL K + k PANEL + i % PANEL], the last panel's rows
 * past M not written (no block reads them), from A untransposed (row
 * stride lda) or transposed (stored K x (its rows), row stride lda):
 * COPY_PANELS panels a task. Transposed, a panel's PANEL elements of one
 * step of k lie side by side in A already: a copy of runs, COPY_STEPS
 * steps of each of the task's panels at a time (so that a panel is
 * written in runs, and A's rows are read from L1 for all but the first).
 * On Zen 5, one thread, G floats/s: 3072 x 1024 from lda 3072 1.7 a
 * panel at a time over all of K, 2.0 step by step over the task's
 * panels, 4.1-4.8 so; 768 x 1024 and 2304 x 1024 7.1 and 4.3 before, 8-10
 * and 5-7 after. Untransposed, 12 rows: 6-9. */
typedef struct copy_a_job {
  const float *A;
  int ta, lda, M, K;
  float *T;
} copy_a_job;

enum { COPY_PANELS = 4, COPY_STEPS = 16 };

static void copy_a_task(void *arg, int t) {
  const copy_a_job *j = arg;
  int panels = (j->M + PANEL - 1) / PANEL, p0 = t * COPY_PANELS;
  int p1 = p0 + COPY_PANELS < panels ? p0 + COPY_PANELS : panels;
  size_t lda = (size_t)j->lda, K = (size_t)j->K;
  if (j->ta) { /* A's row k holds step k of the task's panels side by side */
    for (size_t k0 = 0; k0 < K; k0 += COPY_STEPS) {
      size_t k1 = k0 + COPY_STEPS < K ? k0 + COPY_STEPS : K;
      for (int p = p0; p < p1; p++) {
        int rows = j->M - p * PANEL < PANEL ? j->M - p * PANEL : PANEL;
        const float *a = j->A + (size_t)p * PANEL;
        float *T = j->T + (size_t)p * PANEL * K;
        size_t k = k0;
#if defined(__AVX__) && PACKED_MR == 12
        if (rows == PANEL) /* 12 floats as 8 and the last 8 */
          for (; k < k1; k++) {
            store_d(T + k * PANEL, load_d(a + k * lda));
            store_d(T + k * PANEL + 4, load_d(a + k * lda + 4));
          }
#endif
        for (; k < k1; k++)
          for (int i = 0; i < rows; i++) T[k * PANEL + i] = a[k * lda + i];
      }
    }
    return;
  }
  for (int p = p0; p < p1; p++) {
    int rows = j->M - p * PANEL < PANEL ? j->M - p * PANEL : PANEL;
    const float *A = j->A + (size_t)p * PANEL * lda;
    float *T = j->T + (size_t)p * PANEL * K;
    size_t k = 0;
#if defined(__AVX__) && PACKED_MR == 12
    if (rows == PANEL) /* rows 0-7, then 4-11 (4-7 again, the same) */
      for (; k + 8 <= K; k += 8) {
        transpose8(A + k, lda, T + k * PANEL, PANEL);
        transpose8(A + 4 * lda + k, lda, T + k * PANEL + 4, PANEL);
      }
#endif
    for (; k < K; k++)
      for (int i = 0; i < rows; i++) T[k * PANEL + i] = A[i * lda + k];
  }
}

static _Atomic int copy_a_off, pass_forced;

void st_gemm_copy_a_off(int on) { atomic_store(&copy_a_off, on); }

void st_gemm_copy_a_pass(int rows) {
  atomic_store(&pass_forced, rows < 0 ? 0 : rows);
}

/* ------------------------------------------------------------ dispatch */

/* Work of one task at least this many FLOPs; a task's edge a multiple of
 * 16, or of 2 VL where that is wider (every block's width divides it: 4
 * columns for dot, 2 VL for axpy and packed's strips), so that no block
 * but the last of a product is cut short. (An element's bits never depend
 * on its block: see the header.) */
enum { TASK_FLOPS = 1 << 19, TASK_ALIGN = 2 * VL > 16 ? 2 * VL : 16 };

static int task_edge(int edge, double flops_per_column) {
  double fit = TASK_FLOPS / (flops_per_column > 1 ? flops_per_column : 1);
  int units = fit < 1      ? 1
              : fit > edge ? edge
                           : (int)fit; /* a column at least */
  units = (units + TASK_ALIGN - 1) / TASK_ALIGN * TASK_ALIGN;
  return units < edge ? units : edge;
}

/* Rows of a packed task. A product with few column tasks (a tall, narrow
 * C: 4096 x 32 was one task) is cut across its rows too, in chunks of
 * whole panels (PANEL rows: a copy's panels are never cut) and at least
 * ROW_CHUNK, towards TARGET_TASKS tasks of
 * at least TASK_FLOPS; each chunk packs its own strips of op(B), K x STRIP
 * floats against at least ROW_CHUNK x K x STRIP FMAs. From the shape
 * alone, so no bit depends on the thread count. */
enum { TARGET_TASKS = 16, ROW_CHUNK = 96 };

/* Strips of op(B) a packed task packs at once (packed_task): as many as
 * fit in a quarter of L2 (GROUP_CAP at most), GROUP_MAX at most, and few
 * enough that the product still has TARGET_TASKS tasks where its rows
 * allow (columns' tasks times chunks of ROW_CHUNK rows). The tasks change
 * no bit (the header), so L2's size may decide them. (An MLP's products
 * and gpt_tiny's have too few strips for groups: one strip at a time, as
 * before. Not measured on AMD's CPUs, whose L2 is 512 KB or 1 MB: groups
 * of 1 or 2 at K = 768 there.)
 *
 * Measured on the Intel Xeon VM of COPY_A_LDA (2026-12-01, 2 MB of L2 a
 * core: groups of 5 strips at K = 768, 4 at 1024, 1 from 1366), one
 * thread, operands out of cache (a 256 MB pass between calls), 12-20
 * alternating calls, mean GFLOP/s, one strip at a time against grouped:
 * GPT-2-124M's 1024 x 2304 x 768 (B transposed) 152.5 against 169.3,
 * 1024 x 3072 x 768 (B transposed) 155.7 / 170.8, the same untransposed
 * 152.0 / 175.3, 768 x 3072 x 1024 (A transposed, copied) 159.7 / 175.3;
 * the products at K = 2304 and 3072 (one strip either way) unchanged. */
static long l2_bytes(void) {
  static _Atomic long known;
  long b = atomic_load_explicit(&known, memory_order_relaxed);
  if (!b) {
    b = sysconf(_SC_LEVEL2_CACHE_SIZE);
    b = b > 0 ? b : 1 << 20; /* unknown: 1 MB */
    atomic_store_explicit(&known, b, memory_order_relaxed);
  }
  return b;
}

static _Atomic int group_forced;

void st_gemm_strip_group(int g) {
  atomic_store(&group_forced, g < 0 ? 0 : g > GROUP_MAX ? GROUP_MAX : g);
}

static int packed_group(int M, int N, int K) {
  int forced = atomic_load_explicit(&group_forced, memory_order_relaxed);
  long fit = (1L << 20) / ((long)K * STRIP * (long)sizeof(float));
  if (forced) return forced < fit ? forced : fit < 1 ? 1 : (int)fit;
  long budget = l2_bytes() / 4 < GROUP_CAP ? l2_bytes() / 4 : GROUP_CAP;
  long g = budget / ((long)K * STRIP * (long)sizeof(float));
  int strips = (N + STRIP - 1) / STRIP, chunks = M / ROW_CHUNK;
  chunks = chunks < 1 ? 1 : chunks;
  g = g < 1 ? 1 : g > GROUP_MAX ? GROUP_MAX : g;
  while (g > 1 && (strips + g - 1) / g * chunks < TARGET_TASKS) g--;
  return (int)g;
}

static int packed_row_chunk(int M, int K, int per_task, int col_tasks) {
  int chunks = (TARGET_TASKS + col_tasks - 1) / col_tasks;
  double task_flops = 2.0 * K * per_task * ((double)M / chunks);
  while (chunks > 1 && (M / chunks < ROW_CHUNK || task_flops < TASK_FLOPS)) {
    chunks--;
    task_flops = 2.0 * K * per_task * ((double)M / chunks);
  }
  int rows = (M + chunks - 1) / chunks;
  return (rows + PANEL - 1) / PANEL * PANEL; /* whole panels (A_PANELS) */
}

/* With AVX-512, B transposed: rows up to which the dot kernel runs, and
 * up to ST_NARROW_DOT_ROWS where C is narrower than DOT_NARROW_N or the
 * packed kernel does not take the product. On Zen 5
 * (2026-11-27, one thread, K = 784 unless said) the packed kernel against
 * the dot kernel's 16 lanes: at 8 rows 91-121 GFLOP/s against 64-73 (K =
 * 256-784, N >= 32), at 6 rows 84-110 against 61-79; at 5 rows 73 against
 * 78, at 2 31 against 70; and at N = 10, 8 rows, 21 against 55. */
#if defined(__AVX512F__) && defined(__FMA__)
enum { DOT_ROWS = 5, DOT_NARROW_N = 32 };
#else
enum { DOT_ROWS = ST_NARROW_DOT_ROWS, DOT_NARROW_N = 0 };
#endif

int st_gemm_narrow_kernel(int trans_a, int trans_b, int M, int N, int K,
                          int lda) {
  if (M < 2 || K < 1) return NARROW_NONE;
  if (!trans_a && trans_b && M <= ST_NARROW_DOT_ROWS &&
      (M <= DOT_ROWS || N < DOT_NARROW_N || !packed_fits(0, 1, M, K, lda)))
    return NARROW_DOT; /* (past the packed kernel's K: dot, as before) */
  if (!trans_a && !trans_b && M <= ST_NARROW_ROWS && K <= ST_NARROW_AXPY_K)
    return NARROW_AXPY;
  if (!packed_fits(trans_a, trans_b, M, K, lda)) return NARROW_NONE;
  int forced = COPY_A_LDA > 0 &&
               atomic_load_explicit(&pass_forced, memory_order_relaxed) > 0;
  return forced || copies_a(trans_a, M, N, K, lda) ? NARROW_PACKED_COPY
                                                   : NARROW_PACKED;
}

/* A product's tasks (J's shape, operands and transposes set). */
static void narrow_run(st_pool *pool, int kernel, narrow_job *J) {
  J->per_task = task_edge(J->N, 2.0 * J->M * J->K); /* over C's columns */
  if (kernel == NARROW_PACKED) {
    J->group = packed_group(J->M, J->N, J->K);
    if (J->per_task < J->group * STRIP) J->per_task = J->group * STRIP;
  }
  J->col_tasks = (J->N + J->per_task - 1) / J->per_task;
  int tasks = J->col_tasks;
  if (kernel == NARROW_PACKED) {
    J->rows_per_task = packed_row_chunk(J->M, J->K, J->per_task, J->col_tasks);
    tasks *= (J->M + J->rows_per_task - 1) / J->rows_per_task;
  }
  st_pool_for(pool, tasks,
              kernel == NARROW_PACKED ? packed_task
              : kernel == NARROW_DOT  ? dot_task
                                      : axpy_task,
              J);
}

int st_gemm_narrow(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
                   float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc, const float *bias,
                   int relu) {
  /* alpha 0: C = beta C without reading A or B, as the BLAS does */
  int kernel = alpha == 0.0f
                   ? NARROW_NONE
                   : st_gemm_narrow_kernel(trans_a, trans_b, M, N, K, lda);
  if (kernel == NARROW_NONE) return 0;
  int how = bias                            ? ADD
            : beta == 0.0f                  ? SET
            : alpha == 1.0f && beta == 1.0f ? ADD
                                            : SCALED;
  narrow_job J = {M, N, K, lda, ldb, ldc,  how,  alpha, beta, A,
                  B, C, 0, 0,   0,   bias, relu, 0,     0,    1};
  J.ta = trans_a != 0, J.tb = trans_b != 0; /* ta 2 would be A_PANELS */
  if (kernel == NARROW_PACKED_COPY) {
    /* rows a pass: whole panels in COPY_A_BYTES, one panel at least */
    int forced = atomic_load_explicit(&pass_forced, memory_order_relaxed);
    int pass = (forced ? forced : COPY_A_BYTES / (int)sizeof(float) / K) /
               PANEL * PANEL;
    pass = pass < PANEL ? PANEL : pass < M ? pass : M;
    size_t floats = (size_t)(pass + PANEL - 1) / PANEL * PANEL * K;
    float *T = atomic_load_explicit(&copy_a_off, memory_order_relaxed)
                   ? NULL
                   : st_thread_scratch(ST_SCRATCH_COPY_A, floats * sizeof *T);
    if (T) { /* else A is read in place: the same bits */
      for (int r = 0; r < M; r += pass) {
        narrow_job P = J;
        P.M = M - r < pass ? M - r : pass;
        copy_a_job cj = {
            trans_a ? A + r : A + (size_t)r * lda, trans_a, lda, P.M, K, T};
        int panels = (P.M + PANEL - 1) / PANEL;
        st_pool_for(pool, (panels + COPY_PANELS - 1) / COPY_PANELS, copy_a_task,
                    &cj);
        P.A = T, P.lda = K, P.ta = A_PANELS, P.C = C + (size_t)r * ldc;
        narrow_run(pool, NARROW_PACKED, &P);
      }
      return 1;
    }
    kernel = NARROW_PACKED;
  }
  narrow_run(pool, kernel, &J);
  return 1;
}
