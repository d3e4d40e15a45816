/*
 * activation.c — pointwise activations: relu and gelu (exact erf form, and
 * the tanh approximation used by GPT-2). Their costs are counted per element.
 */
#include "strata.h"

#include <math.h>

void st_relu_forward(float *out, const float *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

void st_relu_backward(float *din, const float *dout, const float *out,
                      size_t n) {
  for (size_t i = 0; i < n; i++) din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

st_cost st_pointwise_cost(size_t numel, double flops_fwd, double flops_bwd) {
  st_cost c;
  c.flops_fwd = flops_fwd * (double)numel;
  c.flops_bwd = flops_bwd * (double)numel;
  c.param_bytes = 0;
  c.act_bytes = 4.0 * (double)numel;
  return c;
}
