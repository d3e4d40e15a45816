/*
 * gemm.c — the one way strata multiplies matrices: CBLAS sgemm behind a
 * wrapper whose caller passes its thread pool (its cores).
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

#if defined(ST_BLAS_OPENBLAS)
#include <cblas.h>
#elif defined(ST_BLAS_BLIS)
#include <blis/cblas.h>
#include <blis/blis.h>
#else
#include <cblas.h>
#endif

/* Tile edge. 256 keeps the repacking overhead of a tiled call within a few
 * per cent of one big call while giving 16 cores work on a 1024x1024 output. */
enum { TILE = 256, SMALL_FLOPS = 1 << 20 };

void st_blas_init(void) {
#if defined(ST_BLAS_OPENBLAS)
  openblas_set_num_threads(1);
#elif defined(ST_BLAS_BLIS)
  bli_thread_set_num_threads(1);
#endif
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
  int trans_a, trans_b, M, N, K, lda, ldb, ldc, tiles_n;
  float alpha, beta;
  const float *A, *B;
  float *C;
} gemm_job;

static void gemm_tile(void *arg, int t) {
  const gemm_job *j = arg;
  int i0 = (t / j->tiles_n) * TILE, j0 = (t % j->tiles_n) * TILE;
  int m = j->M - i0 < TILE ? j->M - i0 : TILE;
  int n = j->N - j0 < TILE ? j->N - j0 : TILE;
  /* op(A) rows i0.. : plain A is M x K (row i at A + i*lda); transposed A is
   * stored K x M (row i of op(A) is column i). Likewise for op(B) columns. */
  const float *a = j->trans_a ? j->A + i0 : j->A + (size_t)i0 * j->lda;
  const float *b = j->trans_b ? j->B + (size_t)j0 * j->ldb : j->B + j0;
  cblas_sgemm(CblasRowMajor, j->trans_a ? CblasTrans : CblasNoTrans,
              j->trans_b ? CblasTrans : CblasNoTrans, m, n, j->K, j->alpha, a,
              j->lda, b, j->ldb, j->beta, j->C + (size_t)i0 * j->ldc + j0,
              j->ldc);
}

void st_gemm(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
             float alpha, const float *A, int lda, const float *B, int ldb,
             float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  gemm_job j = {trans_a, trans_b, M, N, K, lda, ldb, ldc, 1,
                alpha,   beta,    A, B, C};
  double flops = 2.0 * M * N * (double)K;
  int tiles_m = 1;
  if (flops >= SMALL_FLOPS) {
    tiles_m = (M + TILE - 1) / TILE;
    j.tiles_n = (N + TILE - 1) / TILE;
  }
  if (tiles_m * j.tiles_n == 1) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                ldb, beta, C, ldc);
    return;
  }
  st_pool_for(pool, tiles_m * j.tiles_n, gemm_tile, &j);
}
