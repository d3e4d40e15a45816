/*
 * xent.c — softmax cross-entropy over C classes, computed stably (subtract
 * the row max): the exponentials in float with the vectorising exp of
 * fastmath.h, their sum and the logarithm in double, so the loss matches
 * PyTorch to fp32 rounding. A GPT has a row per position over its whole
 * vocabulary (1024 x 50257 for GPT-2 at T = 256, B = 4), where libm's exp per
 * element cost as much as a transformer layer. The gradient scale is passed
 * in so that micro-batches of one batch add up to the gradient of the batch
 * mean.
 */
#include "strata.h"
#include "fastmath.h"

#include <math.h>

enum { LANES = 16 }; /* independent partial sums: a fixed order, vectorised */

void st_xent_forward(float *losses, float *probs, const float *logits,
                     const int *labels, int B, int C) {
  for (int s = 0; s < B; s++) {
    const float *z = logits + (size_t)s * C;
    float *p = probs + (size_t)s * C;
    float zmax = z[0];
    for (int c = 1; c < C; c++) zmax = z[c] > zmax ? z[c] : zmax;
    for (int c = 0; c < C; c++) p[c] = exp_nonpositive(z[c] - zmax);
    double lane[LANES] = {0}, sum = 0;
    int c = 0;
    for (; c + LANES <= C; c += LANES)
      for (int l = 0; l < LANES; l++) lane[l] += p[c + l];
    for (; c < C; c++) sum += p[c];
    for (int l = 0; l < LANES; l++) sum += lane[l];
    float inv = (float)(1.0 / sum);
    for (c = 0; c < C; c++) p[c] *= inv;
    losses[s] = (float)(log(sum) - ((double)z[labels[s]] - zmax));
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

/* The pooled forms: rows are independent, so chunks of rows (a count fixed
 * by C, about 4K logits each) run as pool tasks with the same bits as one
 * call. A GPT has B * T rows over its whole vocabulary; gpt_tiny's 64 rows
 * of 256 at batch 1 are 4 tasks (in chunks of 64K logits they were one,
 * 20 us a step on one thread while the others waited). */
typedef struct xent_job {
  float *losses, *probs, *dlogits;
  const float *logits;
  const int *labels;
  int B, C, rows;
  float scale;
} xent_job;

static int xent_rows(int C) {
  int r = (1 << 12) / (C > 0 ? C : 1);
  return r < 1 ? 1 : r;
}

static void xent_fwd_task(void *arg, int task) {
  const xent_job *j = arg;
  int s0 = task * j->rows, n = j->B - s0 < j->rows ? j->B - s0 : j->rows;
  size_t o = (size_t)s0 * j->C;
  st_xent_forward(j->losses + s0, j->probs + o, j->logits + o, j->labels + s0,
                  n, j->C);
}

static void xent_bwd_task(void *arg, int task) {
  const xent_job *j = arg;
  int s0 = task * j->rows, n = j->B - s0 < j->rows ? j->B - s0 : j->rows;
  size_t o = (size_t)s0 * j->C;
  st_xent_backward(j->dlogits + o, j->probs + o, j->labels + s0, n, j->C,
                   j->scale);
}

void st_xent_forward_pool(st_pool *pool, float *losses, float *probs,
                          const float *logits, const int *labels, int B,
                          int C) {
  xent_job j = {losses, probs, NULL, logits, labels, B, C, xent_rows(C), 0};
  st_pool_for(pool, (B + j.rows - 1) / j.rows, xent_fwd_task, &j);
}

void st_xent_backward_pool(st_pool *pool, float *dlogits, const float *probs,
                           const int *labels, int B, int C, float scale) {
  xent_job j = {NULL, (float *)probs, dlogits, NULL, labels, B,
                C,    xent_rows(C),   scale};
  st_pool_for(pool, (B + j.rows - 1) / j.rows, xent_bwd_task, &j);
}

st_cost st_xent_cost(int C) {
  st_cost c;
  c.flops_fwd = 5.0 * C + 2.0; /* max, subtract+exp, sum, log, normalise */
  c.flops_bwd = 2.0 * C;       /* (p - onehot) * scale */
  c.param_bytes = 0;
  c.act_bytes = 4.0 * C + 4.0; /* probabilities and the loss */
  return c;
}
