/*
 * pooling.c — 2-D max and average pooling over (B, C, H, W), square window K,
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

static int pooled_size(int n, int K, int S) { return (n - K) / S + 1; }

/* The common 2x2 window, stride 2, without branches: after ReLU many
 * comparisons are ties at zero, which makes the general loop's branches
 * unpredictable (it took 12% of a CNN step). Same decisions as the general
 * loop: a first element of -inf leaves (-inf, first) either way, and a tie
 * keeps the first of the two (-0 and +0 are a tie: the first one's sign is
 * the output's, as the general loop's and PyTorch's). */
static inline float max2(float a, float b) { return b > a ? b : a; }

/* Returns 0 when the window has a NaN; the caller then uses the general
 * loop, whose NaN rules are PyTorch's. */
static int maxpool_2x2(float *restrict y, int32_t *restrict arg,
                       const float *restrict x, int W, int OH, int OW) {
  for (int oh = 0; oh < OH; oh++) {
    const float *r0 = x + (size_t)2 * oh * W, *r1 = r0 + W;
    for (int ow = 0; ow < OW; ow++) {
      float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow],
            d = r1[2 * ow + 1];
      if ((a != a) | (b != b) | (c != c) | (d != d)) return 0;
      float best = max2(max2(a, b), max2(c, d));
      /* first maximum in row-major order, as integer arithmetic on the
       * equality flags so that no branch depends on the data */
      int ea = a == best, eb = b == best, ec = c == best;
      int off = (1 - ea) * (eb + (1 - eb) * (ec * W + (1 - ec) * (W + 1)));
      y[oh * OW + ow] = best;
      arg[oh * OW + ow] = 2 * oh * W + 2 * ow + off;
    }
  }
  return 1;
}

void st_maxpool_forward(float *out, int32_t *idx, const float *in, int B, int C,
                        int H, int W, int K, int S) {
  int OH = pooled_size(H, K, S), OW = pooled_size(W, K, S);
  for (size_t plane = 0; plane < (size_t)B * C; plane++) {
    const float *x = in + plane * H * W;
    float *y = out + plane * OH * OW;
    int32_t *arg = idx + plane * OH * OW;
    if (K == 2 && S == 2 && maxpool_2x2(y, arg, x, W, OH, OW)) continue;
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
    for (int o = 0; o < OH * OW; o++) dx[arg[o]] += dy[o];
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
          for (int kj = 0; kj < K; kj++) sum += win[ki * W + kj];
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
          for (int kj = 0; kj < K; kj++) win[ki * W + kj] += g;
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
