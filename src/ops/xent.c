/*
 * xent.c — softmax cross-entropy over C classes, computed stably (subtract
 * the row max) in double per row so the loss matches PyTorch to fp32
 * rounding. The gradient scale is passed in so that micro-batches of one
 * batch add up to the gradient of the batch mean.
 */
#include "strata.h"

#include <math.h>

void st_xent_forward(float *losses, float *probs, const float *logits,
                     const int *labels, int B, int C) {
  for (int s = 0; s < B; s++) {
    const float *z = logits + (size_t)s * C;
    float *p = probs + (size_t)s * C;
    float zmax = z[0];
    for (int c = 1; c < C; c++)
      if (z[c] > zmax) zmax = z[c];
    double sum = 0;
    for (int c = 0; c < C; c++) sum += exp((double)z[c] - zmax);
    double logsum = log(sum);
    for (int c = 0; c < C; c++) p[c] = (float)exp((double)z[c] - zmax - logsum);
    losses[s] = (float)(logsum - ((double)z[labels[s]] - zmax));
  }
}

void st_xent_backward(float *dlogits, const float *probs, const int *labels,
                      int B, int C, float scale) {
  for (int s = 0; s < B; s++) {
    const float *p = probs + (size_t)s * C;
    float *d = dlogits + (size_t)s * C;
    for (int c = 0; c < C; c++) d[c] = p[c] * scale;
    d[labels[s]] -= scale;
  }
}

st_cost st_xent_cost(int C) {
  st_cost c;
  c.flops_fwd = 5.0 * C + 2.0; /* max, subtract+exp, sum, log, normalise */
  c.flops_bwd = 2.0 * C;       /* (p - onehot) * scale */
  c.param_bytes = 0;
  c.act_bytes = 4.0 * C + 4.0; /* probabilities and the loss */
  return c;
}
