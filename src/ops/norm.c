/*
 * norm.c — layer normalisation over the last D features of (N, D) rows (Ba et
 * al. 2016) and group normalisation over (B, C, HW) with G groups of C/G
 * channels (Wu & He 2018), each with a per-feature / per-channel affine
 * (w, b; either may be NULL for none). Both use the biased variance and save
 * mean and rstd = 1/sqrt(var + eps) for the backward pass, as PyTorch does.
 *
 * Statistics and every reduction are taken in double with two passes (mean,
 * then squared deviations), so the fp32 outputs match PyTorch to a few ulps
 * even when the mean is large compared with the spread.
 *
 * Backward, with xhat = (x - mean) * rstd and g = dout * w over one row or
 * group of n elements:
 *   din = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dw += sum dout * xhat,  db += sum dout  (over rows / samples and HW)
 * Gradients of w and b are summed per feature in a fixed order (rows in
 * order, in double within blocks of BLOCK rows or samples), so results do
 * not depend on threads.
 */
#include "strata.h"

#include <assert.h>
#include <math.h>

/* Reductions in double over four lanes combined in a fixed order: the
 * independent lanes let the compiler vectorise and keep several additions in
 * flight, which a single double accumulator (a chain of dependent adds) does
 * not allow without -ffast-math. */
static double lane_sum(const float *restrict x, size_t n) {
  double lane[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; l++) lane[l] += x[i + l];
  for (int l = 0; i < n; i++, l++) lane[l] += x[i];
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

/* sum (x - m)^2 */
static double lane_sum_sq(const float *restrict x, size_t n, double m) {
  double lane[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; l++) {
      double d = x[i + l] - m;
      lane[l] += d * d;
    }
  for (int l = 0; i < n; i++, l++) {
    double d = x[i] - m;
    lane[l] += d * d;
  }
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

/* sum dy and sum dy * (x - m) */
static void lane_sums_dy(const float *restrict dy, const float *restrict x,
                         size_t n, double m, double *dy_sum, double *dyx_sum) {
  double a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; l++) {
      a[l] += dy[i + l];
      b[l] += dy[i + l] * (x[i + l] - m);
    }
  for (int l = 0; i < n; i++, l++) {
    a[l] += dy[i];
    b[l] += dy[i] * (x[i] - m);
  }
  *dy_sum = (a[0] + a[1]) + (a[2] + a[3]);
  *dyx_sum = (b[0] + b[1]) + (b[2] + b[3]);
}

/* mean and rstd of n floats, two passes. */
static void moments(const float *restrict x, size_t n, float eps, double *mean,
                    double *rstd) {
  double m = lane_sum(x, n) / (double)n;
  *mean = m;
  *rstd = 1.0 / sqrt(lane_sum_sq(x, n, m) / (double)n + eps);
}

void st_layernorm_forward(float *out, float *mean, float *rstd, const float *in,
                          const float *w, const float *b, int N, int D,
                          float eps) {
  for (int r = 0; r < N; r++) {
    const float *x = in + (size_t)r * D;
    float *y = out + (size_t)r * D;
    double m, s;
    moments(x, (size_t)D, eps, &m, &s);
    for (int i = 0; i < D; i++) {
      double v = (x[i] - m) * s;
      if (w) v *= w[i];
      if (b) v += b[i];
      y[i] = (float)v;
    }
    mean[r] = (float)m;
    rstd[r] = (float)s;
  }
}

/* The saved mean is fp32; when |mean| >> std its rounding (up to 6e-8 |mean|)
 * shows in x - mean. The backward passes therefore refine it in double, m =
 * mean + sum(x - mean) / n, one extra pass over the row or group. They work
 * on blocks of BLOCK rows or samples so the refined means fit on the stack. */
enum { BLOCK = 32, SUMS = 256, ROW_LANES = 8 };

static double refined_mean(const float *restrict x, size_t n, float saved) {
  double lane[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; l++) lane[l] += x[i + l] - (double)saved;
  for (int l = 0; i < n; i++, l++) lane[l] += x[i] - (double)saved;
  return saved + ((lane[0] + lane[1]) + (lane[2] + lane[3])) / (double)n;
}

static void layernorm_row_grad(float *restrict dx, const float *restrict dy,
                               const float *restrict x, const float *w,
                               double m, double s, int D) {
  /* the two sums in ROW_LANES lanes (one chain each, they were a third
   * of a GPT-2 layernorm backward, waiting on the adds' latency) */
  double gl[ROW_LANES] = {0}, gxl[ROW_LANES] = {0};
  int i = 0;
  for (; i + ROW_LANES <= D; i += ROW_LANES)
    for (int l = 0; l < ROW_LANES; l++) {
      double g = w ? (double)dy[i + l] * w[i + l] : dy[i + l];
      gl[l] += g;
      gxl[l] += g * (x[i + l] - m) * s;
    }
  for (int l = 0; i < D; i++, l++) {
    double g = w ? (double)dy[i] * w[i] : dy[i];
    gl[l] += g;
    gxl[l] += g * (x[i] - m) * s;
  }
  double g_sum = 0, gx_sum = 0;
  for (int l = 0; l < ROW_LANES; l++) g_sum += gl[l], gx_sum += gxl[l];
  double g_mean = g_sum / D, gx_mean = gx_sum / D;
  for (i = 0; i < D; i++) {
    double g = w ? (double)dy[i] * w[i] : dy[i];
    dx[i] = (float)(s * (g - g_mean - (x[i] - m) * s * gx_mean));
  }
}

size_t st_layernorm_scratch_floats(int N, int D) {
  return 2 * (size_t)((N + BLOCK - 1) / BLOCK) * (size_t)D;
}

typedef struct ln_bwd_job {
  float *din, *part;
  const float *dout, *in, *w, *mean, *rstd;
  int N, D, sums; /* sums: the block partials of dw and db are wanted */
} ln_bwd_job;

/* Rows [BLOCK t, BLOCK (t + 1)): their din, and the block's sums of
 * dout * xhat and dout per feature, rounded to float, at part + 2 D t. */
static void ln_bwd_block(void *arg, int t) {
  const ln_bwd_job *j = arg;
  int r0 = t * BLOCK, rows = j->N - r0 < BLOCK ? j->N - r0 : BLOCK, D = j->D;
  double m[BLOCK];
  for (int k = 0; k < rows; k++) {
    size_t at = (size_t)(r0 + k) * D;
    m[k] = refined_mean(j->in + at, (size_t)D, j->mean[r0 + k]);
    if (j->din)
      layernorm_row_grad(j->din + at, j->dout + at, j->in + at, j->w, m[k],
                         j->rstd[r0 + k], D);
  }
  if (!j->sums) return;
  /* each feature's sums over the block's rows in row order, SUMS features
   * at a time row by row (one feature at a time down the rows, the sums
   * were scalar: 40% of a GPT-2 layernorm backward) */
  float *pw = j->part + (size_t)2 * D * t, *pb = pw + D;
  for (int i0 = 0; i0 < D; i0 += SUMS) {
    int n = D - i0 < SUMS ? D - i0 : SUMS;
    double w_sum[SUMS], b_sum[SUMS];
    for (int i = 0; i < n; i++) w_sum[i] = b_sum[i] = 0;
    for (int k = 0; k < rows; k++) {
      const float *restrict dy = j->dout + (size_t)(r0 + k) * D + i0;
      const float *restrict x = j->in + (size_t)(r0 + k) * D + i0;
      double mk = m[k];
      float s = j->rstd[r0 + k];
      for (int i = 0; i < n; i++) {
        w_sum[i] += (double)dy[i] * (x[i] - mk) * s;
        b_sum[i] += dy[i];
      }
    }
    for (int i = 0; i < n; i++) {
      pw[i0 + i] = (float)w_sum[i];
      pb[i0 + i] = (float)b_sum[i];
    }
  }
}

void st_layernorm_backward(st_pool *pool, float *din, float *dw, float *db,
                           const float *dout, const float *in, const float *w,
                           const float *mean, const float *rstd, float *scratch,
                           int N, int D) {
  int blocks = (N + BLOCK - 1) / BLOCK;
  ln_bwd_job j = {din, scratch, dout, in, w, mean, rstd, N, D, dw || db};
  assert(scratch || !j.sums);
  st_pool_for(pool, blocks, ln_bwd_block, &j);
  /* the blocks' partials in block order, whatever ran them */
  for (int t = 0; t < blocks && j.sums; t++) {
    const float *pw = scratch + (size_t)2 * D * t, *pb = pw + D;
    for (int i = 0; i < D; i++) {
      if (dw) dw[i] += pw[i];
      if (db) db[i] += pb[i];
    }
  }
}

/* GroupNorm on the pool. The forward's tasks are (sample, group) pairs,
 * each independent. The backward's are groups: a task makes its group's
 * input gradient sample by sample and sums its channels' dw and db over
 * the samples in order, so every value is made by the same operations in
 * the same order as one thread would make it. On the caller alone, the
 * CNN's two group norms were 8% of its batch-1 step on 2 threads (perf),
 * the worker idle meanwhile. */
typedef struct gn_job {
  float *out, *mean, *rstd, *din, *dw, *db;
  const float *in, *w, *b, *dout, *smean, *srstd;
  int B, C, HW, G;
  float eps;
} gn_job;

static void gn_forward_task(void *arg, int task) {
  const gn_job *j = arg;
  int s = task / j->G, g = task % j->G, CG = j->C / j->G, HW = j->HW;
  size_t base = ((size_t)s * j->C + (size_t)g * CG) * HW;
  double m, r;
  moments(j->in + base, (size_t)CG * HW, j->eps, &m, &r); /* contiguous */
  for (int c = g * CG; c < (g + 1) * CG; c++) {
    const float *x = j->in + ((size_t)s * j->C + c) * HW;
    float *y = j->out + ((size_t)s * j->C + c) * HW;
    double scale = j->w ? r * j->w[c] : r, shift = j->b ? j->b[c] : 0.0;
    for (int i = 0; i < HW; i++) y[i] = (float)((x[i] - m) * scale + shift);
  }
  j->mean[task] = (float)m; /* task = s G + g */
  j->rstd[task] = (float)r;
}

void st_groupnorm_forward(st_pool *pool, float *out, float *mean, float *rstd,
                          const float *in, const float *w, const float *b,
                          int B, int C, int HW, int G, float eps) {
  assert(G > 0 && C % G == 0);
  gn_job j = {.out = out,
              .mean = mean,
              .rstd = rstd,
              .in = in,
              .w = w,
              .b = b,
              .B = B,
              .C = C,
              .HW = HW,
              .G = G,
              .eps = eps};
  st_pool_for(pool, B * G, gn_forward_task, &j);
}

/* din over one group of CG channels (HW each) with refined mean m. */
static void groupnorm_group_grad(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, const float *w,
                                 double m, double r, int CG, int HW) {
  double g_sum = 0, gx_sum = 0, n = (double)CG * HW;
  for (int c = 0; c < CG; c++) {
    double wc = w ? w[c] : 1.0, dy_sum, dyx_sum;
    lane_sums_dy(dy + (size_t)c * HW, x + (size_t)c * HW, (size_t)HW, m,
                 &dy_sum, &dyx_sum);
    g_sum += wc * dy_sum;
    gx_sum += wc * dyx_sum * r;
  }
  double g_mean = g_sum / n, gx_mean = gx_sum / n;
  for (int c = 0; c < CG; c++) {
    double wc = w ? w[c] : 1.0;
    size_t at = (size_t)c * HW;
    for (int i = 0; i < HW; i++)
      dx[at + i] = (float)(r * (wc * dy[at + i] - g_mean -
                                (x[at + i] - m) * r * gx_mean));
  }
}

static void gn_backward_task(void *arg, int g) {
  const gn_job *j = arg;
  int B = j->B, C = j->C, HW = j->HW, G = j->G, CG = C / G;
  const float *in = j->in, *dout = j->dout, *w = j->w;
  for (int s0 = 0; s0 < B; s0 += BLOCK) {
    int samples = B - s0 < BLOCK ? B - s0 : BLOCK;
    double m[BLOCK];
    for (int k = 0; k < samples; k++) {
      size_t stat = (size_t)(s0 + k) * G + g;
      size_t at = ((size_t)(s0 + k) * C + (size_t)g * CG) * HW;
      m[k] = refined_mean(in + at, (size_t)CG * HW, j->smean[stat]);
      if (j->din)
        groupnorm_group_grad(j->din + at, dout + at, in + at,
                             w ? w + g * CG : NULL, m[k], j->srstd[stat], CG,
                             HW);
    }
    for (int c = g * CG; c < (g + 1) * CG && (j->dw || j->db); c++) {
      double w_sum = 0, b_sum = 0;
      for (int k = 0; k < samples; k++) {
        size_t at = ((size_t)(s0 + k) * C + c) * HW;
        double dys, dyx;
        lane_sums_dy(dout + at, in + at, (size_t)HW, m[k], &dys, &dyx);
        w_sum += dyx * j->srstd[(size_t)(s0 + k) * G + g];
        b_sum += dys;
      }
      if (j->dw) j->dw[c] += (float)w_sum;
      if (j->db) j->db[c] += (float)b_sum;
    }
  }
}

void st_groupnorm_backward(st_pool *pool, float *din, float *dw, float *db,
                           const float *dout, const float *in, const float *w,
                           const float *mean, const float *rstd, int B, int C,
                           int HW, int G) {
  assert(G > 0 && C % G == 0);
  gn_job j = {.din = din,
              .dw = dw,
              .db = db,
              .in = in,
              .w = w,
              .dout = dout,
              .smean = mean,
              .srstd = rstd,
              .B = B,
              .C = C,
              .HW = HW,
              .G = G};
  st_pool_for(pool, G, gn_backward_task, &j);
}

/* Per sample, counting a handful of flops per element each way; the saved
 * state is the output plus mean and rstd. */
st_cost st_layernorm_cost(int D) {
  st_cost c;
  c.flops_fwd = 8.0 * D;
  c.flops_bwd = 12.0 * D;
  c.param_bytes = 8.0 * D;
  c.act_bytes = 4.0 * (D + 2.0);
  return c;
}

st_cost st_groupnorm_cost(int C, int HW, int G) {
  double n = (double)C * HW;
  st_cost c;
  c.flops_fwd = 8.0 * n;
  c.flops_bwd = 12.0 * n;
  c.param_bytes = 8.0 * C;
  c.act_bytes = 4.0 * (n + 2.0 * G);
  return c;
}
