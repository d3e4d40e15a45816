/*
 * attention.c — the core of causal multi-head self-attention (Vaswani et al.
 * 2017, "Attention is all you need", eq. 1; GPT-2's masked form), the part
 * between the QKV projection and the output projection, which are linear
 * layers of their own. Plus rotary position embedding (RoPE) applied to q and
 * k in place, for GPT-J / GPT-NeoX shaped models.
 *
 * Layout (B batch, T time, C channels, NH heads, hs = C / NH head size):
 * qkv (B, T, 3C) is [q | k | v] along the last axis and head h uses columns
 * h*hs .. (h+1)*hs of each part; out (B, T, C) puts head h in the same
 * columns. For one (b, h), with scale = 1/sqrt(hs):
 *   S = scale Q K^T,  A = softmax_row(S + causal mask),  Y = A V
 * and backward, with dP = dY V^T and r_t = sum_s A[t,s] dP[t,s]:
 *   dV = A^T dY,  dS = A * (dP - r) * scale,  dQ = dS K,  dK = dS^T Q.
 *
 * How it runs: one task per (b, h) pair on the pool; a task's work depends on
 * the shape only, so results are bitwise independent of the thread count.
 * Inside a task the T rows go in blocks of BLOCK: a row block [i0, i1) only
 * needs keys 0 .. i1, so each block is a few single-threaded GEMMs
 * (st_gemm(NULL, ...)) over the lower-triangular part plus one diagonal
 * square: about (1 + BLOCK/T) times the causal minimum of multiply-adds
 * instead of 2x for one full T x T product. Measured forward + backward,
 * B = 4, NH = 12, hs = 64, one thread, sgemm peak ~99 GFLOP/s: at T = 256
 * blocks of 32 / 64 / 128 / T rows take 22 / 23 / 28 / 35 ms, llm.c-style
 * plain loops 134 ms (fp32 dot products cannot be vectorised without
 * -ffast-math); at T = 1024, 338 / 324 / 325 / 594 ms. 32 is within noise of
 * the best at every length and needs the least scratch.
 *
 * Under bf16 (st_gemm_bf16) a task packs its head's keys and values once,
 * in the layouts of the four products that take a prefix of them as op(B)
 * (head_panels), instead of once for each row block: at T = 256, B = 4,
 * 12 heads of 64, forward and backward on the 2-vCPU Zen 5 VM of
 * docs/bench.md (2026-12-02) 110-119 ms a step's 12 layers fell to 83-85
 * (fp32: 95-107), the products' bits unchanged.
 *
 * Nothing T x T is kept: a block's probabilities live in a BLOCK x T slice
 * of the task's scratch, and the backward computes them again, block by
 * block, with the very calls the forward made (the same product of the same
 * operands, the same softmax), so they are the forward's bits and the
 * results those of keeping them. Saved for the backward: nothing (q, k and
 * v are the layer's input). The price is the score product once more in the
 * backward, a fifth more products; the gain, at GPT-2's context of 1024,
 * 48 MB a sample and a layer (12 heads x 1024 x 1024 floats). A task's
 * scratch is two slices (the probabilities and dP): 256 KB at T = 1024.
 *
 * Softmax subtracts the row maximum before exp and sums in double; masked
 * entries are written as exact zeros, never computed from exp(-inf), so a
 * later position's q, k or v cannot change an earlier output, not even in
 * its last bit.
 */
#include "strata.h"
#include "fastmath.h"

#include <assert.h>
#include <math.h>
#include <string.h>

enum { BLOCK = 32 }; /* rows of a block; see the header comment */

static int block_rows(int T) { return T < BLOCK ? T : BLOCK; }

/* A task's slice of scratch: probabilities, then dP (backward). */
static size_t slice_floats(int T) { return (size_t)block_rows(T) * T; }

size_t st_attention_scratch_floats(int B, int T, int C, int NH) {
  (void)C; /* slices T columns wide: nothing per channel */
  return (size_t)B * NH * 2 * slice_floats(T);
}

typedef struct attention_job {
  float *out, *dqkv, *scratch; /* written: forward, backward */
  const float *qkv, *dout;     /* read */
  int T, C, NH, hs;
  float scale;
} attention_job;

/* Reductions over a row go through LANES independent accumulators combined
 * in a fixed order: the compiler can then vectorise them (it may not
 * reorder a single fp accumulator), and the order, hence every bit of the
 * result, depends on the row length only, on any machine. */
enum { LANES = 16 };

static double lanes_total(const double *lane) {
  double s = 0;
  for (int l = 0; l < LANES; l++) s += lane[l];
  return s;
}

/* Row t of S (n = t + 1 visible keys of T) into softmax probabilities, zero
 * from column n on. */
static void softmax_causal_row(float *restrict row, int n, int T) {
  float lane_max[LANES];
  for (int l = 0; l < LANES; l++) lane_max[l] = row[0];
  int s = 0;
  for (; s + LANES <= n; s += LANES)
    for (int l = 0; l < LANES; l++)
      lane_max[l] = row[s + l] > lane_max[l] ? row[s + l] : lane_max[l];
  for (int l = 0; s < n; s++, l++)
    lane_max[l] = row[s] > lane_max[l] ? row[s] : lane_max[l];
  float max = lane_max[0];
  for (int l = 1; l < LANES; l++) max = lane_max[l] > max ? lane_max[l] : max;

  for (s = 0; s < n; s++) row[s] = exp_nonpositive(row[s] - max);
  double lane_sum[LANES] = {0};
  for (s = 0; s + LANES <= n; s += LANES)
    for (int l = 0; l < LANES; l++) lane_sum[l] += row[s + l];
  for (int l = 0; s < n; s++, l++) lane_sum[l] += row[s];
  float inv = (float)(1.0 / lanes_total(lane_sum));
  for (s = 0; s < n; s++) row[s] *= inv;
  memset(row + n, 0, sizeof(float) * (size_t)(T - n));
}

/* The shape part of a job: batch rows of T tokens, C channels, NH heads. */
static attention_job job_of(int T, int C, int NH) {
  assert(NH > 0 && C % NH == 0);
  attention_job j = {.T = T, .C = C, .NH = NH, .hs = C / NH};
  j.scale = (float)(1.0 / sqrt(j.hs));
  return j;
}

/* Under bf16 a task packs its head's keys and values once as op(B) of the
 * products that take a prefix of them (st_gemm_bf16_panels; packed again
 * for each row block they were 4.5 times each at T = 256): keys and values
 * transposed (the scores, dP) and not (dQ, Y). The products' bits are
 * st_gemm's. NULL where a layout is not wanted or would not serve. */
typedef struct head_panels {
  const uint32_t *kt, *vt, *k, *v;
} head_panels;

enum { WANT_KT = 1, WANT_VT = 2, WANT_K = 4, WANT_V = 8 };

static head_panels pack_head(const attention_job *j, const float *k,
                             const float *v, int want) {
  head_panels h = {0};
  if (!st_gemm_bf16_on()) return h;
  int T = j->T, hs = j->hs, ld = 3 * j->C;
  size_t across = st_bf16_panels_words(T, hs),
         down = st_bf16_panels_words(hs, T);
  size_t words = 0;
  for (int b = WANT_KT; b <= WANT_V; b <<= 1)
    if (want & b) words += b <= WANT_VT ? across : down;
  uint32_t *w = words ? st_thread_scratch(ST_SCRATCH_HEADS, words * 4) : NULL;
  if (!w) return h;
  if ((want & WANT_KT) && across) {
    st_bf16_pack_panels(1, T, hs, k, ld, w);
    h.kt = w, w += across;
  }
  if ((want & WANT_VT) && across) {
    st_bf16_pack_panels(1, T, hs, v, ld, w);
    h.vt = w, w += across;
  }
  if ((want & WANT_K) && down) {
    st_bf16_pack_panels(0, hs, T, k, ld, w);
    h.k = w, w += down;
  }
  if ((want & WANT_V) && down) {
    st_bf16_pack_panels(0, hs, T, v, ld, w);
    h.v = w;
  }
  return h;
}

/* st_gemm(NULL, ...) with op(B) taken from its panels where packed
 * (panels_K: the K they were packed with). */
static void gemm_b(int ta, int tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb,
                   const uint32_t *panels, int panels_K, float beta, float *C,
                   int ldc) {
  if (panels)
    st_gemm_bf16_panels(ta, tb, M, N, K, alpha, A, lda, B, ldb, panels,
                        panels_K, beta, C, ldc);
  else
    st_gemm(NULL, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The probabilities of rows [i0, i1) (keys 0 .. i1) into ab (leading
 * dimension T): the forward's and, again, the backward's. */
static void block_probs(const attention_job *j, const float *q, const float *k,
                        const uint32_t *kt, int i0, int i1, float *ab) {
  int T = j->T, ld = 3 * j->C;
  /* S[i0:i1, 0:i1] = scale Q[i0:i1] K[0:i1]^T */
  gemm_b(0, 1, i1 - i0, i1, j->hs, j->scale, q + (size_t)i0 * ld, ld, k, ld, kt,
         j->hs, 0.0f, ab, T);
  for (int t = i0; t < i1; t++)
    softmax_causal_row(ab + (size_t)(t - i0) * T, t + 1, T);
}

static void forward_task(void *arg, int task) {
  const attention_job *j = arg;
  int T = j->T, C = j->C, hs = j->hs, b = task / j->NH, h = task % j->NH;
  int ld = 3 * C;
  const float *q = j->qkv + (size_t)b * T * ld + (size_t)h * hs;
  const float *k = q + C, *v = q + 2 * C;
  float *ab = j->scratch + (size_t)task * 2 * slice_floats(T);
  float *y = j->out + (size_t)b * T * C + (size_t)h * hs;
  head_panels p = pack_head(j, k, v, WANT_KT | WANT_V);
  for (int i0 = 0; i0 < T; i0 += BLOCK) {
    int i1 = T - i0 < BLOCK ? T : i0 + BLOCK, rows = i1 - i0;
    block_probs(j, q, k, p.kt, i0, i1, ab);
    /* Y[i0:i1] = A[i0:i1, 0:i1] V[0:i1] */
    gemm_b(0, 0, rows, hs, i1, 1.0f, ab, T, v, ld, p.v, T, 0.0f,
           y + (size_t)i0 * C, C);
  }
}

void st_attention_forward(st_pool *pool, float *out, float *scratch,
                          const float *qkv, int B, int T, int C, int NH) {
  attention_job j = job_of(T, C, NH);
  j.out = out, j.scratch = scratch, j.qkv = qkv;
  st_pool_for(pool, B * NH, forward_task, &j);
}

static void probs_task(void *arg, int task) {
  const attention_job *j = arg; /* out: the (B, NH, T, T) probabilities */
  int T = j->T, C = j->C, hs = j->hs, b = task / j->NH, h = task % j->NH;
  const float *q = j->qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
  float *ab = j->scratch + (size_t)task * 2 * slice_floats(T);
  head_panels p = pack_head(j, q + C, NULL, WANT_KT);
  for (int i0 = 0; i0 < T; i0 += BLOCK) {
    int i1 = T - i0 < BLOCK ? T : i0 + BLOCK;
    block_probs(j, q, q + C, p.kt, i0, i1, ab);
    memcpy(j->out + ((size_t)task * T + i0) * T, ab,
           sizeof(float) * (size_t)(i1 - i0) * T);
  }
}

void st_attention_probs(st_pool *pool, float *att, float *scratch,
                        const float *qkv, int B, int T, int C, int NH) {
  attention_job j = job_of(T, C, NH);
  j.out = att, j.scratch = scratch, j.qkv = qkv;
  st_pool_for(pool, B * NH, probs_task, &j);
}

/* dP rows (rows x n, leading dimension n) into dS, in place; ab holds the
 * rows' probabilities (leading dimension T). */
static void softmax_causal_grad(float *restrict dp, const float *restrict ab,
                                int i0, int rows, int n, int T, float scale) {
  for (int r = 0; r < rows; r++) {
    int visible = i0 + r + 1;
    float *restrict g = dp + (size_t)r * n;
    const float *restrict p = ab + (size_t)r * T;
    double lane[LANES] = {0};
    int s = 0;
    for (; s + LANES <= visible; s += LANES)
      for (int l = 0; l < LANES; l++) lane[l] += (double)p[s + l] * g[s + l];
    for (int l = 0; s < visible; s++, l++) lane[l] += (double)p[s] * g[s];
    float rd = (float)lanes_total(lane);
    for (int s = 0; s < visible; s++) g[s] = p[s] * (g[s] - rd) * scale;
    memset(g + visible, 0, sizeof(float) * (size_t)(n - visible));
  }
}

static void backward_task(void *arg, int task) {
  const attention_job *j = arg;
  int T = j->T, C = j->C, hs = j->hs, b = task / j->NH, h = task % j->NH;
  int ld = 3 * C;
  size_t head = (size_t)b * T * ld + (size_t)h * hs;
  const float *q = j->qkv + head, *k = q + C, *v = q + 2 * C;
  float *dq = j->dqkv + head, *dk = dq + C, *dv = dq + 2 * C;
  const float *dy = j->dout + (size_t)b * T * C + (size_t)h * hs;
  float *ab = j->scratch + (size_t)task * 2 * slice_floats(T);
  float *dp = ab + slice_floats(T);
  for (int t = 0; t < T; t++) { /* dK and dV accumulate over row blocks */
    memset(dk + (size_t)t * ld, 0, sizeof(float) * (size_t)hs);
    memset(dv + (size_t)t * ld, 0, sizeof(float) * (size_t)hs);
  }
  head_panels p = pack_head(j, k, v, WANT_KT | WANT_VT | WANT_K);
  for (int i0 = 0; i0 < T; i0 += BLOCK) {
    int i1 = T - i0 < BLOCK ? T : i0 + BLOCK, rows = i1 - i0;
    block_probs(j, q, k, p.kt, i0, i1, ab); /* the forward's, bit for bit */
    const float *dyb = dy + (size_t)i0 * C;
    /* dV[0:i1] += A[i0:i1, 0:i1]^T dY[i0:i1] */
    st_gemm(NULL, 1, 0, i1, hs, rows, 1.0f, ab, T, dyb, C, 1.0f, dv, ld);
    /* dP = dY[i0:i1] V[0:i1]^T, then dS in place */
    gemm_b(0, 1, rows, i1, hs, 1.0f, dyb, C, v, ld, p.vt, hs, 0.0f, dp, i1);
    softmax_causal_grad(dp, ab, i0, rows, i1, T, j->scale);
    /* dQ[i0:i1] = dS K[0:i1];  dK[0:i1] += dS^T Q[i0:i1] */
    gemm_b(0, 0, rows, hs, i1, 1.0f, dp, i1, k, ld, p.k, T, 0.0f,
           dq + (size_t)i0 * ld, ld);
    st_gemm(NULL, 1, 0, i1, hs, rows, 1.0f, dp, i1, q + (size_t)i0 * ld, ld,
            1.0f, dk, ld);
  }
}

void st_attention_backward(st_pool *pool, float *dqkv, const float *dout,
                           const float *qkv, float *scratch, int B, int T,
                           int C, int NH) {
  attention_job j = job_of(T, C, NH);
  j.dqkv = dqkv, j.scratch = scratch, j.qkv = qkv;
  j.dout = dout;
  st_pool_for(pool, B * NH, backward_task, &j);
}

/* Per sample, counting the causal minimum: T(T+1)/2 scores per head, each a
 * dot product of hs (2 hs flops), likewise for A V, so 2 * C T(T+1) flops of
 * products forward; the backward has two and a half times as many (the
 * scores again, dV, dP, dQ, dK). Softmax takes about 5 flops per score
 * forward (max, subtract, exp, sum, scale), and backward 5 again plus 4
 * (dot, subtract, two products). Kept: the output, nothing for the
 * backward. */
st_cost st_attention_cost(int T, int C, int NH) {
  double scores = (double)NH * T * (T + 1) / 2.0;
  double products = 2.0 * C * (double)T * (T + 1);
  st_cost c;
  c.flops_fwd = products + 5.0 * scores;
  c.flops_bwd = 2.5 * products + 9.0 * scores;
  c.param_bytes = 0;
  c.act_bytes = 4.0 * (double)T * C;
  return c;
}

/* ------------------------------------------------------------------ rotary */

/*
 * Rotary position embedding (Su et al. 2021, "RoFormer", eq. 34) in the
 * GPT-NeoX convention (Hugging Face GPTNeoXAttention, "rotate_half"): in each
 * head of q and of k, the first rd = rotary_dim dims are split into halves
 * x1 = x[0 : rd/2], x2 = x[rd/2 : rd]; pair i (< rd/2) at position t turns by
 * theta = t * 10000^(-2i / rd):
 *   x1' = x1 cos(theta) - x2 sin(theta),  x2' = x2 cos(theta) + x1 sin(theta)
 * and dims rd .. hs pass through; v is untouched. The original GPT-J weights
 * pair interleaved dims (2i, 2i+1) instead; permuting the rows of their q and
 * k projections converts them to this convention. Angles are taken in double
 * (Hugging Face takes them in fp32, which drifts at large t).
 *
 * The backward applies the transpose, a turn by -theta, to dq and dk in place.
 */
static void rotate(float *qkv, int B, int T, int C, int NH, int rotary_dim,
                   double direction) {
  assert(NH > 0 && C % NH == 0 && rotary_dim % 2 == 0 && rotary_dim <= C / NH);
  int hs = C / NH, half = rotary_dim / 2;
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double theta = t * pow(10000.0, -2.0 * i / rotary_dim);
      double cs = cos(theta), sn = direction * sin(theta);
      for (int b = 0; b < B; b++) {
        float *row = qkv + ((size_t)b * T + t) * 3 * C;
        for (int x = 0; x < 2 * NH; x++) { /* NH heads of q, then of k */
          float *head = row + (size_t)x * hs;
          double x1 = head[i], x2 = head[i + half];
          head[i] = (float)(x1 * cs - x2 * sn);
          head[i + half] = (float)(x2 * cs + x1 * sn);
        }
      }
    }
}

void st_rotary_forward(float *qkv, int B, int T, int C, int NH,
                       int rotary_dim) {
  rotate(qkv, B, T, C, NH, rotary_dim, 1.0);
}

void st_rotary_backward(float *dqkv, int B, int T, int C, int NH,
                        int rotary_dim) {
  rotate(dqkv, B, T, C, NH, rotary_dim, -1.0);
}

/* Per sample: rd/2 pairs per head of q and of k, 6 flops a pair each way
 * (the angles are shared by the batch and not counted). In place, nothing
 * saved. */
st_cost st_rotary_cost(int T, int NH, int rotary_dim) {
  st_cost c;
  c.flops_fwd = 6.0 * T * NH * rotary_dim;
  c.flops_bwd = c.flops_fwd;
  c.param_bytes = 0;
  c.act_bytes = 0;
  return c;
}
