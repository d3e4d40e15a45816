/*
 * linear.c — fully connected layer: out (B, OC) = in (B, IC) W^T + b, with W
 * (OC, IC) as in PyTorch. Forward and backward are GEMMs through st_gemm;
 * the bias gradient sums over the batch in sample order (fixed, so the
 * result does not depend on threads).
 */
#include "strata.h"

void st_linear_forward(st_pool *pool, float *out, const float *in,
                       const float *w, const float *b, int B, int IC, int OC) {
  if (b) {
    for (int s = 0; s < B; s++)
      for (int o = 0; o < OC; o++) out[(size_t)s * OC + o] = b[o];
  }
  st_gemm(pool, 0, 1, B, OC, IC, 1.0f, in, IC, w, IC, b ? 1.0f : 0.0f, out,
          OC);
}

void st_linear_backward(st_pool *pool, float *din, float *dw, float *db,
                        const float *dout, const float *in, const float *w,
                        int B, int IC, int OC) {
  /* dW (OC, IC) += dout^T (OC, B) . in (B, IC) */
  if (dw) st_gemm(pool, 1, 0, OC, IC, B, 1.0f, dout, OC, in, IC, 1.0f, dw, IC);
  if (db)
    for (int s = 0; s < B; s++)
      for (int o = 0; o < OC; o++) db[o] += dout[(size_t)s * OC + o];
  /* din (B, IC) = dout (B, OC) . W (OC, IC) */
  if (din) st_gemm(pool, 0, 0, B, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, din, IC);
}

/* Transposed weight W (IC, OC): the three GEMMs with the other transpose
 * flags; the bias is the same. */
void st_linear_t_forward(st_pool *pool, float *out, const float *in,
                         const float *w, const float *b, int B, int IC,
                         int OC) {
  if (b) {
    for (int s = 0; s < B; s++)
      for (int o = 0; o < OC; o++) out[(size_t)s * OC + o] = b[o];
  }
  st_gemm(pool, 0, 0, B, OC, IC, 1.0f, in, IC, w, OC, b ? 1.0f : 0.0f, out,
          OC);
}

void st_linear_t_backward(st_pool *pool, float *din, float *dw, float *db,
                          const float *dout, const float *in, const float *w,
                          int B, int IC, int OC) {
  /* dW (IC, OC) += in^T (IC, B) . dout (B, OC) */
  if (dw) st_gemm(pool, 1, 0, IC, OC, B, 1.0f, in, IC, dout, OC, 1.0f, dw, OC);
  if (db)
    for (int s = 0; s < B; s++)
      for (int o = 0; o < OC; o++) db[o] += dout[(size_t)s * OC + o];
  /* din (B, IC) = dout (B, OC) . W^T (OC, IC) */
  if (din) st_gemm(pool, 0, 1, B, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, din, IC);
}

st_cost st_linear_cost(int IC, int OC) {
  st_cost c;
  c.flops_fwd = 2.0 * IC * OC + OC;
  c.flops_bwd = 4.0 * IC * OC + OC; /* dW and din */
  c.param_bytes = 4.0 * ((double)IC * OC + OC);
  c.act_bytes = 4.0 * OC;
  return c;
}
