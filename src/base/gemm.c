/*
 * gemm.c — the one way strata multiplies matrices: CBLAS sgemm behind a
 * wrapper whose caller passes its thread pool (its cores). One row of A
 * goes to the BLAS's sgemv instead, and a few rows or a short inner size
 * to narrow.c's kernels where they are faster (both tiled by shape, as
 * below).
 *
 * Why tiles: the BLAS is pinned to one thread per call (st_blas_init) so that
 * several stage workers calling at once never oversubscribe the machine; the
 * parallelism is ours. The output C is cut into tiles whose sizes depend only
 * on (M, N) — never on the thread count — and each tile is one BLAS call that
 * sums over all of K in the BLAS's own order. Every element of C is therefore
 * computed by the same call with the same arguments whether 1 or 16 threads
 * run, which makes results bitwise independent of the thread count.
 */
#include "strata.h"
#include "narrow.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#if defined(ST_BLAS_OPENBLAS)
#include <cblas.h>
#elif defined(ST_BLAS_BLIS)
#include <blis/cblas.h>
#include <blis/blis.h>
#else
#include <cblas.h>
#endif

/* Tiling policy, a function of (M, N, K) only. Products under MIN_TILE_FLOPS
 * are one call (splitting them costs more than a thread gains). Larger ones
 * are halved along their longer side, in multiples of ALIGN, until there are
 * TARGET_TILES tiles or a tile would fall under MIN_TILE_FLOPS or MIN_EDGE;
 * no tile edge exceeds MAX_EDGE, which bounds repacking to a few per cent of
 * one big call and gives 16 cores work on a 1024x1024 output. A product
 * left with fewer than FEW_TILES tiles goes on halving down to FEW_EDGE, to
 * FEW_TILES: a 64-row product with a 128-wide output (gpt_tiny's attention
 * projection and second MLP layer at batch 1) is then two calls, not one.
 * On 2 threads gpt_tiny's step ran 13.0-14.6k tokens/s before, 13.7-17.1k
 * after; on 1 thread 1.4% slower (mean of 6 alternating pairs). A MIN_EDGE
 * of 64 for every product did as well there, but also cut the MLP's batch
 * 256 products into 16 smaller tiles (2-13% slower on 2 threads in 2 of 3
 * noisy pairs); small tiles only where there would be too few. (Those
 * gpt_tiny products have since gone to narrow.c's packed kernel; the
 * rule still splits, for one, its weight gradients at batch 2.) */
enum {
  MIN_TILE_FLOPS = 1 << 19,
  TARGET_TILES = 16,
  MIN_EDGE = 128,
  MAX_EDGE = 512,
  ALIGN = 16,
  FEW_TILES = 4,
  FEW_EDGE = 64
};

void st_blas_init(void) {
#if defined(ST_BLAS_OPENBLAS)
  openblas_set_num_threads(1);
#elif defined(ST_BLAS_BLIS)
  bli_thread_set_num_threads(1);
#endif
}

/* narrow.h. The answer cannot change within a process (OpenBLAS picks
 * its kernels when it loads), so it is worked out once. */
int st_blas_avx512(void) {
  static _Atomic int known = -1;
  int v = atomic_load_explicit(&known, memory_order_relaxed);
  if (v >= 0) return v;
#if defined(ST_BLAS_OPENBLAS)
  const char *core = openblas_get_corename();
  v = core && (strcasestr(core, "skylakex") || strcasestr(core, "cooperlake") ||
               strcasestr(core, "sapphire"));
#elif defined(ST_BLAS_BLIS)
  v = 1;
#else
  v = 0;
#endif
  atomic_store_explicit(&known, v, memory_order_relaxed);
  return v;
}

const char *st_blas_name(void) {
#if defined(ST_BLAS_OPENBLAS)
  return "openblas";
#elif defined(ST_BLAS_BLIS)
  return "blis";
#else
  return "cblas";
#endif
}

typedef struct gemm_job {
  int trans_a, trans_b, M, N, K, lda, ldb, ldc, tiles_n, tm, tn;
  float alpha, beta;
  const float *A, *B;
  float *C;
} gemm_job;

/* C = alpha op(A) op(B) + beta C, one BLAS call. With OpenBLAS, for beta 0
 * the output is zeroed here and the call accumulates into it: OpenBLAS's
 * own beta pass (sgemm_beta, 3.9% of gpt_tiny's batch-1 step in a
 * profile) is slower than memset, and it too zeroes C and then adds the
 * product, so the bits are the same. A single call on 1 thread, gpt_tiny's
 * 12 products: 1,058 us before, 980 after. (BLIS writes C at beta 0
 * without a pass of its own.) */
static void sgemm(int trans_a, int trans_b, int m, int n, int K, float alpha,
                  const float *a, int lda, const float *b, int ldb, float beta,
                  float *c, int ldc) {
#if defined(ST_BLAS_OPENBLAS)
  if (beta == 0.0f) {
    for (int i = 0; i < m; i++)
      memset(c + (size_t)i * ldc, 0, (size_t)n * sizeof *c);
    beta = 1.0f;
  }
#endif
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, K, alpha, a, lda, b,
              ldb, beta, c, ldc);
}

static void gemm_tile(void *arg, int t) {
  const gemm_job *j = arg;
  int i0 = (t / j->tiles_n) * j->tm, j0 = (t % j->tiles_n) * j->tn;
  int m = j->M - i0 < j->tm ? j->M - i0 : j->tm;
  int n = j->N - j0 < j->tn ? j->N - j0 : j->tn;
  /* op(A) rows i0.. : plain A is M x K (row i at A + i*lda); transposed A is
   * stored K x M (row i of op(A) is column i). Likewise for op(B) columns. */
  const float *a = j->trans_a ? j->A + i0 : j->A + (size_t)i0 * j->lda;
  const float *b = j->trans_b ? j->B + (size_t)j0 * j->ldb : j->B + j0;
  sgemm(j->trans_a, j->trans_b, m, n, j->K, j->alpha, a, j->lda, b, j->ldb,
        j->beta, j->C + (size_t)i0 * j->ldc + j0, j->ldc);
}

static int halve(int edge) {
  int h = (edge + 1) / 2;
  return (h + ALIGN - 1) / ALIGN * ALIGN;
}

static int count(int total, int tile) { return (total + tile - 1) / tile; }

/* Halves the longer of (tm, tn) (or, if it may not be, the other) while
 * there are fewer than `target` tiles, no edge going under `min_edge` and
 * no tile under MIN_TILE_FLOPS. */
static void split_to(int M, int N, int K, int target, int min_edge, int *tm,
                     int *tn) {
  while (count(M, *tm) * count(N, *tn) < target) {
    int *longer = *tn >= *tm ? tn : tm;
    int h = halve(*longer);
    if (*longer < 2 * min_edge ||
        2.0 * h * (longer == tn ? *tm : *tn) * K < MIN_TILE_FLOPS) {
      longer = longer == tn ? tm : tn; /* try the other side once */
      h = halve(*longer);
      if (*longer < 2 * min_edge ||
          2.0 * h * (longer == tn ? *tm : *tn) * K < MIN_TILE_FLOPS)
        return;
    }
    *longer = h;
  }
}

/* Chooses the tile edges (tm, tn) for an M x N output with inner size K. */
static void choose_tiles(int M, int N, int K, int *tm, int *tn) {
  *tm = M, *tn = N;
  if (2.0 * M * N * K < MIN_TILE_FLOPS) return;
  while (*tm > MAX_EDGE) *tm = halve(*tm);
  while (*tn > MAX_EDGE) *tn = halve(*tn);
  split_to(M, N, K, TARGET_TILES, MIN_EDGE, tm, tn);
  split_to(M, N, K, FEW_TILES, FEW_EDGE, tm, tn);
}

/* One row, y (1 x N) = alpha x op(B) + beta y: OpenBLAS's sgemm runs it
 * at a fifth of the speed of its sgemv (it packs B for one row).
 *
 * Where a batch-1 step spends its time: a linear layer's weight W (OC x
 * IC) is read by the forward (y = x W^T, B stored N x K), read by the
 * input gradient (dx = dy W, B stored K x N) and read and written by the
 * fused update (st_optim_update_outer), each one row of x at a time. The
 * three cut W into the same bands of rows (st_row_band), and the pool
 * gives a band to the same thread each time (pool.c), so a core reads and
 * writes the rows its L2 already holds. With the forward in one call and
 * the input gradient on the caller alone, the worker's half of the update
 * pulled its rows from the other core every step: the 784-256-256-10
 * MLP's batch-1 step ran no faster on 2 threads than on 1.
 *
 * B stored N x K (y[j] = x . B[j], the forward): each task is one band of
 * y's elements, one sgemv call over all of K.
 * B stored K x N (y = sum_k x[k] B[k], the input gradient): each task sums
 * its band of B's rows into its own partial, and the partials are added in
 * band order (gemv_split), wherever the partials fit in GEMV_PARTS floats
 * (on the stack) or the bands have at least GEMV_MIN_ROWS rows (then the
 * partials, at most a quarter of B, in a buffer the calling thread keeps);
 * else tiles of y's columns, their width from (N, K) as for the GEMM
 * tiles, at least GEMV_ROW_EDGE columns long (192-column tiles of a
 * 3072-wide B ran at two thirds of one call's speed). Column tiles read
 * every row of W on every thread: with the update in bands after them,
 * the CNN's 256 x 3136 layer's one-row step ran at 230 us on one thread
 * and 1,150 on two while this VM's two vCPUs sat on different L3s.
 * Either way the bands, tiles and order come from the shape alone. */
enum { ROW_BAND = 1 << 14, MAX_BANDS = 64, GEMV_ROW_EDGE = 1024 };
enum { GEMV_PARTS = 1 << 14, GEMV_MIN_ROWS = 4 };

int st_row_band(int rows, int len) {
  int r = len >= ROW_BAND ? 1 : ROW_BAND / len;
  if (count(rows, r) > MAX_BANDS) r = count(rows, MAX_BANDS);
  return r;
}

typedef struct gemv_job {
  int trans_b, N, K, ldb, w; /* w: a task's columns or rows of B */
  int band0;                 /* the split: the first band of this wave */
  float alpha, beta;
  const float *x, *B;
  float *y;
  float *part; /* the split's partials, band band0 + t at part + t N */
  void (*after)(void *arg, int r0, int r1);
  void *after_arg;
} gemv_job;

static int gemv_tile(int N, int K) { /* B stored K x N, not split */
  int w = N;
  while (w >= 2 * GEMV_ROW_EDGE && 2.0 * K * w >= 2.0 * MIN_TILE_FLOPS &&
         count(N, w) < TARGET_TILES)
    w = halve(w);
  return w;
}

/* Bands of B's K rows when y = x B is summed band by band, or 0. The
 * second case keeps N within half the stack's partials, so that the
 * split can always run in waves there (gemv_split). */
static int gemv_split_rows(int N, int K) {
  int r = st_row_band(K, N), bands = count(K, r);
  if (bands < 2) return 0;
  if ((size_t)bands * N <= GEMV_PARTS) return r;
  return r >= GEMV_MIN_ROWS && N <= GEMV_PARTS / 2 ? r : 0;
}

static _Atomic int waves_forced;

void st_gemv_waves(int on) { atomic_store(&waves_forced, on); }

static void gemv_tile_run(void *arg, int tile) {
  const gemv_job *g = arg;
  int t = tile * g->w, n = g->N - t < g->w ? g->N - t : g->w;
  if (g->trans_b) /* B stored N x K: y[j] = x . B[j] */
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, g->K, g->alpha,
                g->B + (size_t)t * g->ldb, g->ldb, g->x, 1, g->beta, g->y + t,
                1);
  else /* B stored K x N: y = sum_k x[k] B[k] */
    cblas_sgemv(CblasRowMajor, CblasTrans, g->K, n, g->alpha, g->B + t, g->ldb,
                g->x, 1, g->beta, g->y + t, 1);
}

static void gemv_band_run(void *arg, int task) {
  const gemv_job *g = arg;
  int k0 = (g->band0 + task) * g->w, k = g->K - k0 < g->w ? g->K - k0 : g->w;
  st_narrow_row(g->N, k, g->alpha, g->x + k0, g->B + (size_t)k0 * g->ldb,
                g->ldb, g->part + (size_t)task * g->N);
  if (g->after) g->after(g->after_arg, k0, k0 + k);
}

/* y = x B (+ beta y), B stored K x N, summed in bands of `rows` of B's
 * rows (gemv_split_rows); after, when not NULL, runs on each band's rows
 * on the thread that summed it, once its partial is made. All bands run
 * in one job where their partials fit the stack or the thread's buffer;
 * if that buffer cannot be had, in waves of as many as fit the stack,
 * each wave's partials added to a running sum: the same additions in the
 * same order, so the same bits. */
static void gemv_split(st_pool *pool, int rows, int N, int K, float alpha,
                       const float *x, const float *B, int ldb, float beta,
                       float *y, void (*after)(void *, int, int), void *arg) {
  float stack[GEMV_PARTS];
  int bands = count(K, rows), wave = bands;
  float *part = stack;
  if ((size_t)bands * N > GEMV_PARTS &&
      (atomic_load_explicit(&waves_forced, memory_order_relaxed) ||
       !(part = st_thread_scratch(ST_SCRATCH_GEMV,
                                  (size_t)bands * N * sizeof *part)))) {
    part = stack; /* slot 0 the running sum, the wave's partials after it */
    wave = GEMV_PARTS / N - 1;
  }
  float *sum = wave < bands ? part : NULL, *wp = sum ? part + N : part;
  gemv_job g = {.N = N,
                .K = K,
                .ldb = ldb,
                .w = rows,
                .alpha = alpha,
                .x = x,
                .B = B,
                .part = wp,
                .after = after,
                .after_arg = arg};
  /* the partials added in band order, into the first (or the running
   * sum) a band at a time: each element's additions in the same order,
   * the bands read one after the other */
  for (int b0 = 0; b0 < bands; b0 += wave) {
    int n = bands - b0 < wave ? bands - b0 : wave;
    g.band0 = b0;
    st_pool_for(pool, n, gemv_band_run, &g);
    float *acc = sum && b0 ? sum : wp;
    for (int b = acc == sum ? 0 : 1; b < n; b++) {
      const float *q = wp + (size_t)b * N;
      for (int j = 0; j < N; j++) acc[j] += q[j];
    }
    if (sum && !b0) memcpy(sum, wp, (size_t)N * sizeof *sum);
  }
  const float *s = sum ? sum : wp;
  for (int j = 0; j < N; j++) y[j] = beta == 0.0f ? s[j] : beta * y[j] + s[j];
}

int st_gemv_then(st_pool *pool, float *y, const float *x, const float *B, int K,
                 int N, void (*after)(void *arg, int r0, int r1), void *arg) {
  int rows = K > 0 && N > 0 && !st_gemm_bf16_on() ? gemv_split_rows(N, K) : 0;
  if (rows) gemv_split(pool, rows, N, K, 1.0f, x, B, N, 0.0f, y, after, arg);
  return rows > 0;
}

/* With AVX-512, a product past the packed kernel's rows or inner size
 * (st_gemm_piece_limits: 4096 and 3072) whose pieces narrow.c takes is cut
 * into even pieces within them, in multiples of 16: C = alpha op(A_1)
 * op(B_1) + beta C, then C += alpha op(A_k) op(B_k) for each further piece
 * of K in order, each row piece apart. The sums are those of the pieces,
 * not one chain over all of K, and so the same on every pool. GPT-2 at
 * context 1024 has more than 4096 rows (tokens) from a micro-batch of 5
 * sequences, and its weight gradients' inner size is the tokens, past 3072
 * from 4 sequences: whole, they went to the BLAS's tiles, which OpenBLAS 0.3.21
 * runs with its SSE3 kernels on the Intel Xeon of narrow.c's COPY_A_LDA (26-37
 * GFLOP/s a thread). There (2026-11-30, hot operands, best of 25 x 3 calls),
 * GFLOP/s whole against in pieces, 1 / 2 threads: 768 x 3072 x 4096 (A
 * transposed) 33.5 / 70.8 against 159.8 / 317.9; 8192 x 768 x 768 36.4 / 64.0
 * against 155.4 / 312.9; 3072 x 768 x 8192 (A transposed) 35.4 / 70.6 against
 * 146.4 / 295.1; cnn_fmnist's dense layer at batch 64, 64 x 256 x 3136, 34.2 /
 * 68.4 against 163.1 / 320.9. 0: not cut (the pieces would go to the BLAS
 * too, or nothing is past the limits). */
static int gemm_pieces(st_pool *pool, int trans_a, int trans_b, int M, int N,
                       int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
  int rows, kmax;
  st_gemm_piece_limits(&rows, &kmax);
  if (!rows || alpha == 0.0f || K <= 0 || (M <= rows && K <= kmax)) return 0;
  int m = count(count(M, count(M, rows)), 16) * 16;
  int k = count(count(K, count(K, kmax)), 16) * 16;
  m = m < M ? m : M, k = k < K ? k : K;
  if (st_gemm_narrow_kernel(trans_a, trans_b, m, N, k, lda) == NARROW_NONE)
    return 0;
  for (int k0 = 0; k0 < K; k0 += k) {
    int kk = K - k0 < k ? K - k0 : k;
    const float *a = trans_a ? A + (size_t)k0 * lda : A + k0;
    const float *b = trans_b ? B + k0 : B + (size_t)k0 * ldb;
    for (int i0 = 0; i0 < M; i0 += m)
      st_gemm(pool, trans_a, trans_b, M - i0 < m ? M - i0 : m, N, kk, alpha,
              trans_a ? a + i0 : a + (size_t)i0 * lda, lda, b, ldb,
              k0 ? 1.0f : beta, C + (size_t)i0 * ldc, ldc);
  }
  return 1;
}

void st_gemm(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
             float alpha, const float *A, int lda, const float *B, int ldb,
             float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (st_gemm_bf16_on()) { /* train.precision: bf16 */
    st_gemm_bf16(pool, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                 C, ldc);
    return;
  }
  if (M == 1 && !trans_a && K > 0) { /* one row: a matrix-vector product */
    int rows = !trans_b && alpha != 0.0f ? gemv_split_rows(N, K) : 0;
    if (rows) {
      gemv_split(pool, rows, N, K, alpha, A, B, ldb, beta, C, NULL, NULL);
      return;
    }
    /* B stored N x K: bands of y's elements; K x N: tiles of its columns */
    gemv_job g = {.trans_b = trans_b,
                  .N = N,
                  .K = K,
                  .ldb = ldb,
                  .w = trans_b ? st_row_band(N, K) : gemv_tile(N, K),
                  .alpha = alpha,
                  .beta = beta,
                  .x = A,
                  .B = B,
                  .y = C};
    st_pool_for(pool, count(N, g.w), gemv_tile_run, &g);
    return;
  }
  if (st_gemm_narrow(pool, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                     beta, C, ldc, NULL, 0) ||
      gemm_pieces(pool, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                  C, ldc))
    return;
  gemm_job j = {trans_a, trans_b, M, N,     K,    lda, ldb, ldc,
                1,       0,       0, alpha, beta, A,   B,   C};
  choose_tiles(M, N, K, &j.tm, &j.tn);
  int tiles_m = count(M, j.tm);
  j.tiles_n = count(N, j.tn);
  if (tiles_m * j.tiles_n == 1) {
    sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  st_pool_for(pool, tiles_m * j.tiles_n, gemm_tile, &j);
}

void st_gemm_bias(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
                  const float *A, int lda, const float *B, int ldb,
                  const float *bias, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (st_gemm_bf16_on()) { /* the sums start from the bias there */
    st_gemm_bf16_bias(pool, trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, C,
                      ldc);
    return;
  }
  if (st_gemm_narrow(pool, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb,
                     1.0f, C, ldc, bias, 0))
    return;
  for (int i = 0; i < M; i++)
    memcpy(C + (size_t)i * ldc, bias, (size_t)N * sizeof *C);
  st_gemm(pool, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
}

/* relu over C's rows in place, in tasks of about RELU_FLOATS elements
 * (whole rows): the pass after a product narrow.c's kernels do not take. */
enum { RELU_FLOATS = 1 << 12 };

typedef struct relu_job {
  float *C;
  int M, N, ldc, rows;
} relu_job;

static void relu_rows(void *arg, int t) {
  const relu_job *j = arg;
  int r0 = t * j->rows, r1 = r0 + j->rows < j->M ? r0 + j->rows : j->M;
  for (int r = r0; r < r1; r++) {
    float *c = j->C + (size_t)r * j->ldc;
    st_relu_forward(c, c, (size_t)j->N);
  }
}

void st_gemm_bias_relu(st_pool *pool, int trans_a, int trans_b, int M, int N,
                       int K, const float *A, int lda, const float *B, int ldb,
                       const float *bias, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (!st_gemm_bf16_on() &&
      st_gemm_narrow(pool, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb,
                     bias ? 1.0f : 0.0f, C, ldc, bias, 1))
    return;
  if (bias)
    st_gemm_bias(pool, trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, C, ldc);
  else
    st_gemm(pool, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C,
            ldc);
  relu_job j = {C, M, N, ldc, RELU_FLOATS / N > 1 ? RELU_FLOATS / N : 1};
  st_pool_for(pool, (M + j.rows - 1) / j.rows, relu_rows, &j);
}
