/*
 * narrow.h — private to src/base/: the GEMMs of a narrow batch (narrow.c).
 */
#ifndef STRATA_BASE_NARROW_H
#define STRATA_BASE_NARROW_H

#include "strata.h"

/* Rows of A (untransposed) up to which narrow.c's dot and axpy kernels run:
 * with B transposed (dot), and without (axpy, for K up to
 * ST_NARROW_AXPY_K). Its packed kernel takes more rows (narrow.c). */
#define ST_NARROW_DOT_ROWS 8
#define ST_NARROW_AXPY_K 512

/* Whether the BLAS runs vector kernels of 16 floats (AVX-512) here:
 * OpenBLAS's SkylakeX, Cooperlake and SapphireRapids kernels; any other
 * BLAS library is assumed to; OpenBLAS's others and a plain CBLAS not. It
 * bounds narrow.c's packed products (gemm.c, asked once). */
int st_blas_avx512(void);

/* Which of narrow.c's kernels a product goes to (alpha not 0): NARROW_NONE
 * (the BLAS's), or dot, axpy, packed, or packed on op(A) first copied out
 * in panels of rows (NARROW_PACKED_COPY: the bits of packed, which reads
 * it in place); a function of the shape, A's row stride, the target, the
 * size of L2 and the BLAS's kernels (st_blas_avx512) alone. */
enum {
  NARROW_NONE,
  NARROW_DOT,
  NARROW_AXPY,
  NARROW_PACKED,
  NARROW_PACKED_COPY
};
int st_gemm_narrow_kernel(int trans_a, int trans_b, int M, int N, int K,
                          int lda);

/* Computes C = alpha op(A) op(B) + beta C as st_gemm does and returns 1
 * when the call is one narrow.c handles (2 .. M rows, K >= 1: A
 * untransposed with rows as above, or the packed kernel's limits in
 * narrow.c); returns 0, touching nothing, otherwise. With a bias (alpha
 * and beta 1 then), C = op(A) op(B) + bias on every row, C not read: the
 * bits of C filled with the bias and then C += op(A) op(B). With relu set,
 * each element of C then goes through relu (x > 0 ? x : 0), as written. */
int st_gemm_narrow(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
                   float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc, const float *bias,
                   int relu);

/* y (1 x N) = alpha x (1 x K) B, B stored K x N (row stride ldb), on the
 * calling thread by the axpy kernel: each element one FMA chain over k in
 * order from 0, then times alpha; y is not read. gemm.c's one-row
 * products summed in bands make each band's partial with it (OpenBLAS's
 * sgemv took 3.6x as long over 52 bands of 5 rows as one call over all
 * 256 rows). */
void st_narrow_row(int N, int K, float alpha, const float *x, const float *B,
                   int ldb, float *y);

/* The packed kernel's most rows and inner size where products past them
 * are cut into pieces within them (gemm.c), with AVX-512; 0 and 0
 * elsewhere. */
void st_gemm_piece_limits(int *rows, int *K);

/* For tests: 1 runs every product whose op(A) narrow.c would copy out
 * (NARROW_PACKED_COPY) with A read in place, as when the calling thread's
 * scratch cannot be had; 0 as usual. */
void st_gemm_copy_a_off(int on);

/* For tests: rows > 0 makes every packed product read op(A) from a copy
 * in panels (NARROW_PACKED_COPY, with AVX-512 only), `rows` rows a pass
 * (whole panels, one at least); 0 as usual. The bits are the same either
 * way. */
void st_gemm_copy_a_pass(int rows);

/* For tests: the strips of op(B) the packed kernel packs at once (g from
 * 1 to 8, as long as they fit 1 MB; narrow.c's packed_group), 0 the rule
 * as usual. The bits are the same whatever it is. */
void st_gemm_strip_group(int g);

/* For tests: 1 runs every one-row product summed in bands whose partials
 * do not fit the stack in waves on the stack, as when the calling thread's
 * buffer for them cannot be had (gemm.c); 0 as usual. */
void st_gemv_waves(int on);

#endif
