/*
 * linear.c — fully connected layer: out (B, OC) = in (B, IC) W^T + b, with W
 * (OC, IC) as in PyTorch. Forward and backward are GEMMs through st_gemm;
 * the bias gradient sums over the batch in sample order (fixed, so the
 * result does not depend on threads; st_pool_sum_rows splits the columns).
 */
#include "strata.h"

/* Both weight layouts share one body: wt = 0 is W (OC, IC), wt = 1 is W
 * (IC, OC), which only changes the GEMMs' transpose flags and the weight's
 * leading dimension. */
static void forward(st_pool *pool, int wt, float *out, const float *in,
                    const float *w, const float *b, int B, int IC, int OC) {
  /* out (B, OC) = in (B, IC) . W^T (+ b), or in . W for the transposed
   * layout */
  if (b)
    st_gemm_bias(pool, 0, !wt, B, OC, IC, in, IC, w, wt ? OC : IC, b, out, OC);
  else
    st_gemm(pool, 0, !wt, B, OC, IC, 1.0f, in, IC, w, wt ? OC : IC, 0.0f, out,
            OC);
}

void st_linear_relu_forward(st_pool *pool, int wt, float *out, const float *in,
                            const float *w, const float *b, int B, int IC,
                            int OC) {
  st_gemm_bias_relu(pool, 0, !wt, B, OC, IC, in, IC, w, wt ? OC : IC, b, out,
                    OC);
}

static void backward(st_pool *pool, int wt, float *din, float *dw, float *db,
                     const float *dout, const float *in, const float *w, int B,
                     int IC, int OC) {
  /* dW (OC, IC) += dout^T . in, or (IC, OC) += in^T . dout */
  if (dw && !wt)
    st_gemm(pool, 1, 0, OC, IC, B, 1.0f, dout, OC, in, IC, 1.0f, dw, IC);
  if (dw && wt)
    st_gemm(pool, 1, 0, IC, OC, B, 1.0f, in, IC, dout, OC, 1.0f, dw, OC);
  if (db) st_pool_sum_rows(pool, db, dout, B, OC);
  /* din (B, IC) = dout (B, OC) . W, or dout . W^T */
  if (din)
    st_gemm(pool, 0, wt, B, IC, OC, 1.0f, dout, OC, w, wt ? OC : IC, 0.0f, din,
            IC);
}

void st_linear_forward(st_pool *pool, float *out, const float *in,
                       const float *w, const float *b, int B, int IC, int OC) {
  forward(pool, 0, out, in, w, b, B, IC, OC);
}

void st_linear_backward(st_pool *pool, float *din, float *dw, float *db,
                        const float *dout, const float *in, const float *w,
                        int B, int IC, int OC) {
  backward(pool, 0, din, dw, db, dout, in, w, B, IC, OC);
}

void st_linear_t_forward(st_pool *pool, float *out, const float *in,
                         const float *w, const float *b, int B, int IC,
                         int OC) {
  forward(pool, 1, out, in, w, b, B, IC, OC);
}

void st_linear_t_backward(st_pool *pool, float *din, float *dw, float *db,
                          const float *dout, const float *in, const float *w,
                          int B, int IC, int OC) {
  backward(pool, 1, din, dw, db, dout, in, w, B, IC, OC);
}

st_cost st_linear_cost(int IC, int OC) {
  st_cost c;
  c.flops_fwd = 2.0 * IC * OC + OC;
  c.flops_bwd = 4.0 * IC * OC + OC; /* dW and din */
  c.param_bytes = 4.0 * ((double)IC * OC + OC);
  c.act_bytes = 4.0 * OC;
  return c;
}
