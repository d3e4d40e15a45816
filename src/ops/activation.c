/*
 * activation.c — pointwise activations: relu and gelu (exact erf form, and
 * the tanh approximation used by GPT-2). Their costs are counted per element.
 */
#include "strata.h"
#include "fastmath.h"

#include <math.h>

/* relu(x) = max(x, 0), a NaN kept (as PyTorch's): a NaN mapped to 0 let
 * weights turn NaN behind finite losses, so no check saw the divergence.
 * -0 gives +0. Its gradient passes where the output is not <= 0 (a NaN's
 * too, as PyTorch's threshold_backward). */
void st_relu_forward(float *out, const float *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = in[i] <= 0.0f ? 0.0f : in[i];
}

void st_relu_backward(float *din, const float *dout, const float *out,
                      size_t n) {
  for (size_t i = 0; i < n; i++) din[i] = out[i] <= 0.0f ? 0.0f : dout[i];
}

/* GELU (Hendrycks & Gimpel 2016). Exact: x * Phi(x), Phi the normal CDF;
 * its derivative is Phi(x) + x * phi(x). Tanh form (PyTorch
 * approximate='tanh'): 0.5 * x * (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715
 * x^3), with derivative 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'.
 *
 * Both are written without the cancellation of 1 + erf or 1 + tanh for
 * negative x, so even the far negative tail keeps full fp32 relative
 * accuracy:
 *   Phi(x) = 0.5 * erfc(-x / sqrt 2),
 *   0.5 (1 + tanh u) = sigma(2u) = 1 / (1 + e^{-2u}),
 *   1 - sigma(2u) = e^{-2u} sigma(2u)   (taken with |u| so nothing overflows).
 * The exact form runs in double through libm's erfc. The tanh form, GPT's
 * activation and a large share of a transformer's pointwise time, runs in
 * float with the vectorising exp of fastmath.h (a few ulp): with libm's
 * double exp it took 17% of a gpt_tiny training step. */
#define GELU_SQRT_2_OVER_PI 0.7978845608028654
#define GELU_INV_SQRT_2 0.7071067811865476
#define GELU_INV_SQRT_2PI 0.3989422804014327
#define GELU_CUBIC 0.044715

/* sigma(2u) and 1 - sigma(2u) for the tanh form, in float. */
static inline void gelu_sigmas(float u, float *s, float *sc) {
  float e = exp_nonpositive(-2.0f * fabsf(u)), r = 1.0f / (1.0f + e);
  *s = u >= 0 ? r : e * r;
  *sc = u >= 0 ? e * r : r;
}

void st_gelu_forward(float *out, const float *in, size_t n, int approximate) {
  if (approximate) {
    const float c = (float)GELU_SQRT_2_OVER_PI, a = (float)GELU_CUBIC;
    for (size_t i = 0; i < n; i++) {
      float x = in[i], s, sc;
      gelu_sigmas(c * (x + a * x * x * x), &s, &sc);
      out[i] = x * s;
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      double x = in[i];
      out[i] = (float)(0.5 * x * erfc(-x * GELU_INV_SQRT_2));
    }
  }
}

void st_gelu_backward(float *din, const float *dout, const float *in, size_t n,
                      int approximate) {
  if (approximate) {
    const float c = (float)GELU_SQRT_2_OVER_PI, a = (float)GELU_CUBIC;
    for (size_t i = 0; i < n; i++) {
      float x = in[i], s, sc;
      gelu_sigmas(c * (x + a * x * x * x), &s, &sc);
      /* beyond |x| = 100, s * sc is below 1e-37: clamping x in the
       * polynomial keeps x^3 from overflowing into inf * 0 */
      float xc = x > 100.0f ? 100.0f : x < -100.0f ? -100.0f : x;
      float du = c * (1.0f + 3.0f * a * xc * xc);
      din[i] = dout[i] * (s + 2.0f * xc * s * sc * du);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      double x = in[i];
      double cdf = 0.5 * erfc(-x * GELU_INV_SQRT_2);
      double pdf = GELU_INV_SQRT_2PI * exp(-0.5 * x * x);
      din[i] = (float)(dout[i] * (cdf + x * pdf));
    }
  }
}

st_cost st_pointwise_cost(size_t numel, double flops_fwd, double flops_bwd) {
  st_cost c;
  c.flops_fwd = flops_fwd * (double)numel;
  c.flops_bwd = flops_bwd * (double)numel;
  c.param_bytes = 0;
  c.act_bytes = 4.0 * (double)numel;
  return c;
}
