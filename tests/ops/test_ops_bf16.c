/*
 * test_ops_bf16.c — strata's bf16 products (train.precision: bf16) against
 * PyTorch's CPU bf16 autocast (tests/fixtures/ops_bf16_autocast.safetensors,
 * written by tests/ref/gen_bf16.py): a linear layer's forward, input and
 * weight gradients, and a matmul whose K (600) spans two of strata's K
 * blocks, with its two gradients.
 *
 * Autocast rounds the inputs to bf16, sums in fp32 and returns bf16.
 * strata returns the fp32 sum. Rounded to bf16, the two must agree: both
 * are the same exact products summed in fp32, so they differ only where
 * the two fp32 sums (different orders, each within ~1e-7 relative of the
 * exact one) fall on either side of a bf16 rounding boundary, about 1e-7 /
 * 2^-8 = 3e-5 of the elements. Bound: at most 0.5% of the elements differ,
 * and none by more than one bf16 step. Had strata not rounded its inputs,
 * half the elements would differ (measured in Python: 49-51%).
 */
#include "harness.h"
#include "strata.h"

#include <stdint.h>
#include <string.h>

#define REGENERATE "/usr/bin/python3 tests/ref/gen_bf16.py"

#include "op_fixtures.h"

/* got rounded to bf16 against want (a bf16 value): elements that differ,
 * and the largest distance in bf16 steps. */
static void compare(const char *what, const float *got, const float *want,
                    size_t n) {
  size_t differ = 0;
  long worst = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t a = st_bf16_from(got[i]), b = st_bf16_from(want[i]);
    /* steps apart: the sign-magnitude bit patterns as a number line */
    int32_t la = a & 0x8000 ? -(a & 0x7FFF) : a;
    int32_t lb = b & 0x8000 ? -(b & 0x7FFF) : b;
    long d = labs((long)la - lb);
    differ += d != 0;
    if (d > worst) worst = d;
  }
  CHECK(differ * 200 <= n, "%s: %zu of %zu elements differ from autocast's",
        what, differ, n);
  CHECK(worst <= 1, "%s: %ld bf16 steps from autocast's", what, worst);
  if (getenv("STRATA_TEST_VERBOSE"))
    printf("  %s: %zu of %zu differ, at most %ld step\n", what, differ, n,
           worst);
}

static void test_linear(const st_safetensors *st) {
  int32_t *d = fx_i32(st, "linear", "dims", 3);
  int B = d[0], IC = d[1], OC = d[2];
  float *in = fx(st, "linear", "in", (size_t)B * IC);
  float *w = fx(st, "linear", "w", (size_t)OC * IC);
  float *dout = fx(st, "linear", "dout", (size_t)B * OC);
  float *out = new_floats((size_t)B * OC), *din = new_floats((size_t)B * IC);
  float *dw = new_floats((size_t)OC * IC);
  st_linear_forward(NULL, out, in, w, NULL, B, IC, OC);
  st_linear_backward(NULL, din, dw, NULL, dout, in, w, B, IC, OC);
  compare("linear out", out, fx(st, "linear", "out", (size_t)B * OC),
          (size_t)B * OC);
  compare("linear din", din, fx(st, "linear", "din", (size_t)B * IC),
          (size_t)B * IC);
  compare("linear dw", dw, fx(st, "linear", "dw", (size_t)OC * IC),
          (size_t)OC * IC);
  release_all();
}

static void test_matmul(const st_safetensors *st, st_pool *pool) {
  int32_t *d = fx_i32(st, "matmul", "dims", 3);
  int M = d[0], K = d[1], N = d[2];
  float *in = fx(st, "matmul", "in", (size_t)M * K);
  float *w = fx(st, "matmul", "w", (size_t)K * N);
  float *dout = fx(st, "matmul", "dout", (size_t)M * N);
  float *out = new_floats((size_t)M * N), *din = new_floats((size_t)M * K);
  float *dw = new_floats((size_t)K * N);
  st_gemm(pool, 0, 0, M, N, K, 1.0f, in, K, w, N, 0.0f, out, N);
  st_gemm(pool, 0, 1, M, K, N, 1.0f, dout, N, w, N, 0.0f, din, K); /* dY W^T */
  st_gemm(pool, 1, 0, K, N, M, 1.0f, in, K, dout, N, 0.0f, dw, N); /* X^T dY */
  compare("matmul out", out, fx(st, "matmul", "out", (size_t)M * N),
          (size_t)M * N);
  compare("matmul din", din, fx(st, "matmul", "din", (size_t)M * K),
          (size_t)M * K);
  compare("matmul dw", dw, fx(st, "matmul", "dw", (size_t)K * N),
          (size_t)K * N);
  release_all();
}

int main(void) {
  st_blas_init();
  st_fp_set_flush(1);
  st_safetensors *st = open_fixture("bf16_autocast");
  if (st) {
    st_pool *pool = st_pool_create(2);
    st_gemm_set_bf16(1);
    test_linear(st);
    test_matmul(st, pool);
    st_gemm_set_bf16(0);
    st_pool_destroy(pool);
    st_safetensors_destroy(st);
  }
  TH_DONE();
}
