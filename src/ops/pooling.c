/*
 * pool.c — 2-D max and average pooling over (B, C, H, W), square window K,
 * stride S, no padding, OH = (H - K) / S + 1 as in PyTorch.
 *
 * Max pooling saves, per output element, the index of its maximum inside the
 * (H, W) plane of its channel — PyTorch's return_indices convention — so the
 * backward pass routes each gradient to one input without recomputing.
 * Ties go to the first maximum in row-major window order and a NaN wins over
 * any number (the last NaN of a window, if several), exactly as PyTorch's CPU
 * kernel decides. With overlapping windows (K > S)
 * several outputs may route to one input; their gradients add.
 */
#include "strata.h"

#include <math.h>
#include <string.h>

static int pooled_size(int n, int K, int S) {
  return (n - K) / S + 1;
}

void st_maxpool_forward(float *out, int32_t *idx, const float *in, int B, int C,
                        int H, int W, int K, int S) {
  int OH = pooled_size(H, K, S), OW = pooled_size(W, K, S);
  for (size_t plane = 0; plane < (size_t)B * C; plane++) {
    const float *x = in + plane * H * W;
    float *y = out + plane * OH * OW;
    int32_t *arg = idx + plane * OH * OW;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        int first = oh * S * W + ow * S;
        float best = -INFINITY;
        int32_t where = first;
        for (int ki = 0; ki < K; ki++)
          for (int kj = 0; kj < K; kj++) {
            int i = first + ki * W + kj;
            if (x[i] > best || isnan(x[i])) {
              best = x[i];
              where = i;
            }
          }
        y[oh * OW + ow] = best;
        arg[oh * OW + ow] = where;
      }
  }
}

void st_maxpool_backward(float *din, const float *dout, const int32_t *idx,
                         int B, int C, int H, int W, int K, int S) {
  int OH = pooled_size(H, K, S), OW = pooled_size(W, K, S);
  memset(din, 0, sizeof(float) * (size_t)B * C * H * W);
  for (size_t plane = 0; plane < (size_t)B * C; plane++) {
    float *dx = din + plane * H * W;
    const float *dy = dout + plane * OH * OW;
    const int32_t *arg = idx + plane * OH * OW;
    for (int o = 0; o < OH * OW; o++)
      dx[arg[o]] += dy[o];
  }
}

void st_avgpool_forward(float *out, const float *in, int B, int C, int H, int W,
                        int K, int S) {
  int OH = pooled_size(H, K, S), OW = pooled_size(W, K, S);
  float area = (float)(K * K);
  for (size_t plane = 0; plane < (size_t)B * C; plane++) {
    const float *x = in + plane * H * W;
    float *y = out + plane * OH * OW;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        const float *win = x + (size_t)oh * S * W + (size_t)ow * S;
        float sum = 0.0f;
        for (int ki = 0; ki < K; ki++)
          for (int kj = 0; kj < K; kj++)
            sum += win[ki * W + kj];
        y[oh * OW + ow] = sum / area;
      }
  }
}

void st_avgpool_backward(float *din, const float *dout, int B, int C, int H,
                         int W, int K, int S) {
  int OH = pooled_size(H, K, S), OW = pooled_size(W, K, S);
  float area = (float)(K * K);
  memset(din, 0, sizeof(float) * (size_t)B * C * H * W);
  for (size_t plane = 0; plane < (size_t)B * C; plane++) {
    float *dx = din + plane * H * W;
    const float *dy = dout + plane * OH * OW;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        float g = dy[oh * OW + ow] / area;
        float *win = dx + (size_t)oh * S * W + (size_t)ow * S;
        for (int ki = 0; ki < K; ki++)
          for (int kj = 0; kj < K; kj++)
            win[ki * W + kj] += g;
      }
  }
}

/* Per sample: one compare (max) or add (avg) per window element forward, one
 * add per output backward (avg: per window element); maxpool keeps its int32
 * argmax beside the output. */
st_cost st_maxpool_cost(int C, int H, int W, int K, int S) {
  double outs = (double)C * pooled_size(H, K, S) * pooled_size(W, K, S);
  st_cost c;
  c.flops_fwd = outs * K * K;
  c.flops_bwd = outs;
  c.param_bytes = 0;
  c.act_bytes = 8.0 * outs;
  return c;
}

st_cost st_avgpool_cost(int C, int H, int W, int K, int S) {
  double outs = (double)C * pooled_size(H, K, S) * pooled_size(W, K, S);
  st_cost c;
  c.flops_fwd = outs * (K * K + 1);
  c.flops_bwd = outs * (K * K + 1);
  c.param_bytes = 0;
  c.act_bytes = 4.0 * outs;
  return c;
}
