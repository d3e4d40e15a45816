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
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

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
    /* with C < LANES the lanes are all +0, and adding them (16 dependent
     * adds, a third of a 10-class row's time) leaves the sum as it is */
    if (C >= LANES)
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

/* A row costs about ROW_LOGITS logits' work besides its own (its log and
 * division in double): 37 ns a row of 10 classes against 1.35 ns a logit
 * at 4096 (Zen 3, 2026-11-29), so a batch of 256 rows of 10 is several
 * tasks, not one. */
enum { ROW_LOGITS = 32 };

static int xent_rows(int C) {
  int r = (1 << 12) / ((C > 0 ? C : 1) + ROW_LOGITS);
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

/* ------------------------------------------- the head and its loss fused */

/* At most XENT_MAX_CHUNK words a chunk: the input gradient's product sums
 * over the chunk (K = its words), and up to 3072 it is one narrow.c's
 * packed kernel takes with AVX-512 (PACKED_K); past it the BLAS's. On the
 * Zen 4 VM (2026-11-29) the packed kernel ran that class at 110 GFLOP/s on
 * one thread and OpenBLAS's Cooperlake kernels at 80. */
enum {
  XENT_CHUNK_FLOATS = 1 << 20,
  XENT_MIN_CHUNK = 256,
  XENT_MAX_CHUNK = 3072
};

int st_linear_xent_chunk(int R, int V) {
  int r = R > 0 ? R : 1;
  int c = XENT_CHUNK_FLOATS / r;
  c = c < XENT_MIN_CHUNK   ? XENT_MIN_CHUNK
      : c > XENT_MAX_CHUNK ? XENT_MAX_CHUNK
                           : c & ~15; /* whole vectors */
  return c < V ? c : V;
}

/* The last chunks' logits the forward keeps for the backward, at most
 * XENT_KEEP_FLOATS a sample (64 MB): they need not be made again. At the
 * GPT-2 shape, T = 256, all 17 chunks (51 MB); at T = 1024, 16 of 50.
 * Making a chunk again costs its forward product once more: with 16 MB a
 * sample (5 of 17 kept at T = 256) bench_gpt 124m 4 2 stepped 10-14%
 * slower than with every chunk kept (Intel Xeon VM of docs/bench.md,
 * 2026-11-30, 3 alternating pairs: 289-319 against 327-357 tokens/s),
 * for 38 MB a sample less scratch (18.9 MB against 56.6). */
enum { XENT_KEEP_FLOATS = 1 << 24 };

static int chunks_of(int V, int chunk) { return (V + chunk - 1) / chunk; }

int st_linear_xent_keep(int R, int V) {
  int chunk = st_linear_xent_chunk(R, V), n = chunks_of(V, chunk);
  long long k = XENT_KEEP_FLOATS / ((long long)(R > 0 ? R : 1) * chunk);
  return k < n ? (int)k : n;
}

/* The scratch: a header (the forward's token, 16 floats, so that what
 * follows keeps its 64-byte alignment), the running sums (a double a row),
 * the chunk being made, then the kept chunks. */
enum { XENT_HEADER = 16 };

size_t st_linear_xent_scratch_floats(int R, int V, int keep) {
  size_t chunk = (size_t)st_linear_xent_chunk(R, V);
  return XENT_HEADER + (size_t)R * (chunk * (1 + (size_t)keep) + 2);
}

/* Chunk c's logits: the kept chunks (the last `keep`) in their own slot,
 * every other in slot 0. */
static float *chunk_slot(float *scratch, int rows, int chunk, int n, int keep,
                         int c) {
  float *z0 = scratch + XENT_HEADER + 2 * (size_t)rows;
  int slot = c >= n - keep ? 1 + c - (n - keep) : 0;
  return z0 + (size_t)slot * rows * chunk;
}

/* A forward's token: a number no other forward in this process had. */
static _Atomic unsigned long long forwards;

typedef struct head_job {
  float *z; /* the chunk's logits, rows x n */
  double *sum;
  float *out, *lse;
  const int32_t *lab;
  const int *labels;
  const float *g;
  int c0, n, rows, per;
} head_job;

/* Rows in a task: about 4K logits, by the chunk's width alone. */
static void head_run(st_pool *pool, head_job *j, void (*fn)(void *, int)) {
  j->per = (1 << 12) / j->n > 1 ? (1 << 12) / j->n : 1;
  st_pool_for(pool, (j->rows + j->per - 1) / j->per, fn, j);
}

/* The first index of the largest of z[0 .. n): the c at which the loop
 * `best = z[c] > z[best] ? c : best` ends (a NaN never larger, so one at
 * z[0] stays the answer; -0 and +0 equal), in LANES lanes, each keeping
 * its first largest (from -inf at its own first index), then the smallest
 * index among the lanes whose largest is the largest of all: where that is
 * -inf, z[0] is -inf and lane 0 gives 0, as the loop. The loop, dependent
 * through z[best], was two thirds of the head's forward softmax in a GPT-2
 * step (perf, Zen 5 VM). */
typedef float vlanes __attribute__((vector_size(4 * LANES), aligned(4)));
typedef int32_t ilanes __attribute__((vector_size(4 * LANES)));

static int first_largest(const float *z, int n) {
  int best = 0;
  if (n < 2 * LANES || z[0] != z[0]) {
    for (int c = 1; c < n; c++) best = z[c] > z[best] ? c : best;
    return best;
  }
  vlanes top;
  ilanes at, next;
  for (int l = 0; l < LANES; l++) top[l] = -INFINITY, at[l] = l, next[l] = l;
  int c = 0;
  for (; c + LANES <= n; c += LANES) {
    vlanes v = *(const vlanes *)(z + c);
    ilanes larger = v > top; /* -1 where larger */
    top = (vlanes)((larger & (ilanes)v) | (~larger & (ilanes)top));
    at = (larger & next) | (~larger & at);
    next += LANES;
  }
  float m = top[0];
  for (int l = 1; l < LANES; l++) m = top[l] > m ? top[l] : m;
  best = n;
  for (int l = 0; l < LANES; l++)
    best = top[l] == m && at[l] < best ? at[l] : best;
  for (; c < n; c++) best = z[c] > z[best] ? c : best;
  return best;
}

/* Rows of one chunk, forward: the running max lives in lse and the
 * label's logit in out[2 r] until the last chunk, the first index of the
 * largest logit in out[2 r + 1] (exact as a float below 2^24). */
static void head_fwd_task(void *arg, int task) {
  const head_job *j = arg;
  int r0 = task * j->per, r1 = r0 + j->per < j->rows ? r0 + j->per : j->rows;
  for (int r = r0; r < r1; r++) {
    const float *z = j->z + (size_t)r * j->n;
    int best = first_largest(z, j->n);
    float cm = z[best], m = j->c0 ? j->lse[r] : cm;
    if (j->c0 == 0) /* a label outside the vocabulary leaves a NaN loss */
      j->out[2 * r] = NAN;
    if (j->c0 == 0 || cm > m) {
      if (j->c0 > 0) j->sum[r] *= exp((double)m - cm);
      m = j->lse[r] = cm;
      j->out[2 * r + 1] = (float)(j->c0 + best);
    }
    double lane[LANES] = {0}, sum = 0;
    int c = 0;
    for (; c + LANES <= j->n; c += LANES)
      for (int l = 0; l < LANES; l++) lane[l] += exp_nonpositive(z[c + l] - m);
    for (; c < j->n; c++) sum += exp_nonpositive(z[c] - m);
    for (int l = 0; l < LANES; l++) sum += lane[l];
    j->sum[r] = (j->c0 == 0 ? 0 : j->sum[r]) + sum;
    int y = j->labels[r];
    if (y >= j->c0 && y < j->c0 + j->n) j->out[2 * r] = z[y - j->c0];
  }
}

/* Rows of one chunk, backward: z becomes g (softmax - onehot). */
static void head_bwd_task(void *arg, int task) {
  const head_job *j = arg;
  int r0 = task * j->per, r1 = r0 + j->per < j->rows ? r0 + j->per : j->rows;
  for (int r = r0; r < r1; r++) {
    float *z = j->z + (size_t)r * j->n, s = j->g[2 * r], l = j->lse[r];
    int y = j->lab[r] - j->c0, has = y >= 0 && y < j->n;
    float zy = has ? z[y] : 0.0f;
    for (int c = 0; c < j->n; c++) z[c] = s * exp_nonpositive(z[c] - l);
    if (has) z[y] = s * (exp_nonpositive(zy - l) - 1.0f);
  }
}

void st_linear_xent_forward(st_pool *pool, float *out, float *lse,
                            int32_t *saved_labels, const float *x,
                            const float *w, const float *b, const int *labels,
                            float *scratch, int rows, int D, int V, int chunk,
                            int keep) {
  double *sum = (double *)(scratch + XENT_HEADER);
  int n = chunks_of(V, chunk);
  for (int c0 = 0, c = 0; c0 < V; c0 += chunk, c++) {
    int nc = V - c0 < chunk ? V - c0 : chunk;
    float *z = chunk_slot(scratch, rows, chunk, n, keep, c);
    /* the chunk's logits: words [c0, c0 + nc) are rows of W */
    st_linear_forward(pool, z, x, w + (size_t)c0 * D, b ? b + c0 : NULL, rows,
                      D, nc);
    head_job j = {z, sum, out, lse, NULL, labels, NULL, c0, nc, rows, 0};
    head_run(pool, &j, head_fwd_task);
  }
  for (int r = 0; r < rows; r++) {
    double m = lse[r], lsum = log(sum[r]);
    int y = labels[r];
    /* out[2r] holds z[y]; out[2r+1] the first index of the row's max */
    out[2 * r + 1] = (int)out[2 * r + 1] == y ? 1.0f : 0.0f;
    out[2 * r] = (float)(lsum - ((double)out[2 * r] - m));
    lse[r] = (float)(m + lsum);
    saved_labels[r] = y;
  }
  /* the token, in the scratch beside the kept chunks and beside the
   * labels: the backward takes the kept chunks only where the two agree */
  unsigned long long token = atomic_fetch_add(&forwards, 1) + 1;
  memcpy(scratch, &token, sizeof token);
  memcpy(saved_labels + rows, &token, sizeof token);
}

void st_linear_xent_forget(float *scratch) {
  memset(scratch, 0, sizeof(unsigned long long));
}

void st_linear_xent_backward(st_pool *pool, float *dx, float *dw, float *db,
                             const float *g, const float *x, const float *w,
                             const float *b, const float *lse,
                             const int32_t *labels, float *scratch, int rows,
                             int D, int V, int chunk, int keep) {
  int n = chunks_of(V, chunk);
  unsigned long long mine, held;
  memcpy(&mine, labels + rows, sizeof mine);
  memcpy(&held, scratch, sizeof held);
  /* the kept chunks are this forward's (their bits are the ones made
   * again). Any backward ends what the scratch holds: the kept chunks
   * become its gradient, and where it is another forward's backward, a
   * weight update may follow it (pipelined backprop), after which that
   * forward's logits are no longer the ones made again. Without them,
   * every chunk is made again in slot 0, leaving the kept slots alone. */
  int kept = keep > 0 && mine != 0 && mine == held;
  memset(scratch, 0, sizeof held);
  for (int c0 = 0, c = 0; c0 < V; c0 += chunk, c++) {
    int nc = V - c0 < chunk ? V - c0 : chunk;
    float *z = chunk_slot(scratch, rows, chunk, n, kept ? keep : 0, c);
    /* the chunk's logits: words [c0, c0 + nc) are rows of W, the same call
     * as the forward's */
    if (!kept || c < n - keep)
      st_linear_forward(pool, z, x, w + (size_t)c0 * D, b ? b + c0 : NULL, rows,
                        D, nc);
    head_job j = {z, NULL, NULL, (float *)lse, labels, NULL,
                  g, c0,   nc,   rows,         0};
    head_run(pool, &j, head_bwd_task);
    /* the weight gradient of these words, K = every row; the bias's in row
     * order, as st_linear_backward sums it */
    if (dw)
      st_gemm(pool, 1, 0, nc, D, rows, 1.0f, z, nc, x, D, 1.0f,
              dw + (size_t)c0 * D, D);
    if (db) st_pool_sum_rows(pool, db + c0, z, rows, nc);
    if (dx)
      st_gemm(pool, 0, 0, rows, D, nc, 1.0f, z, nc, w + (size_t)c0 * D, D,
              c0 ? 1.0f : 0.0f, dx, D);
  }
}

double st_linear_xent_again(int R, int V, int keep, int split) {
  int chunk = st_linear_xent_chunk(R, V);
  /* every chunk but the kept (the last, the short one among them); a
   * split backward's second half, all of them */
  return (keep > 0 ? (double)(chunks_of(V, chunk) - keep) * chunk / V : 1.0) +
         (split ? 1.0 : 0.0);
}

st_cost st_linear_xent_cost(int R, int D, int V, int keep, int split) {
  st_cost c;
  double again = st_linear_xent_again(R, V, keep, split) * V; /* words */
  c.flops_fwd = 2.0 * D * V + 6.0 * V; /* the product; max, exp, sum */
  /* the product again for the chunks not kept, then dW and dx; softmax */
  c.flops_bwd = 2.0 * D * again + 4.0 * D * V + 4.0 * V;
  c.param_bytes = 4.0 * D * V;
  c.act_bytes = 4.0 * 4; /* loss, hit, lse, label */
  return c;
}
