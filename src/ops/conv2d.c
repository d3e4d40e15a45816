/*
 * conv2d.c — 2-D convolution, NCHW, square kernel K, stride S, zero padding P,
 * weight (OC, IC, K, K) and optional bias (OC) as in PyTorch. Each sample is
 * unrolled by im2col into a (IC*K*K, OH*OW) matrix so that the convolution is
 * one GEMM through st_gemm: out_s (OC, OH*OW) = W (OC, IC*K*K) . col_s.
 *
 * Determinism (STYLE.md 8): every task partition below depends only on the
 * shapes, never on the pool's size, and each output element is produced by
 * one task with a fixed summation order, so results are bitwise the same for
 * any thread count:
 *   forward  — one task per sample: im2col, then a single-threaded GEMM;
 *              a batch of fewer than 8 samples is cut finer (make_job):
 *              im2col by channel chunks, then the GEMM by column tiles of
 *              the output, each element still one GEMM's sum;
 *   backward — the batch is cut into at most MAX_GROUPS sample groups; a
 *              group runs its samples in order (im2col, its partial dW +=
 *              dout_s col_s^T, din_s = col2im(W^T dout_s) while the columns
 *              are in cache), then fixed chunks of dW add the partials in
 *              group order and db sums each channel in sample order.
 *              Batches too small for two groups' partials fall back to
 *              fixed dW tiles that each add all samples in order, and cut
 *              din as the forward is cut (column tiles of dcol, channel
 *              chunks of col2im) when the batch is small.
 * Backward recomputes im2col rather than trusting that the scratch still holds
 * the forward's, so callers may reuse the scratch between layers.
 *
 * A 1x1 convolution with stride 1 and no padding needs no unrolling: the input
 * sample already is its column matrix, and dcol is din itself.
 */
#include "strata.h"

#include <string.h>

/* MAX_GROUPS: sample groups of the grouped dW, enough for a 16-core stage;
 * more would only add partial sums to reduce. REDUCE_CHUNK: dW elements per
 * reduction task. DW_TILE_*: dW tile of the tiled fallback, rows of output
 * channels by columns of IC*K*K, small enough to give several tasks, large
 * enough that each per-sample GEMM call stays efficient. */
enum {
  MAX_GROUPS = 16,
  REDUCE_CHUNK = 4096,
  DW_TILE_ROWS = 16,
  DW_TILE_COLS = 96,
  SPLIT_TASKS = 8,
  SPLIT_MIN_COLS = 64
};

static int out_size(int n, int K, int S, int P) {
  return (n + 2 * P - K) / S + 1;
}

static int is_pointwise(int K, int S, int P) {
  return K == 1 && S == 1 && P == 0;
}

/* One column matrix per sample, even for a pointwise conv, which unrolls
 * nothing but uses the space for its partial weight gradients. */
size_t st_conv2d_scratch_floats(int B, int IC, int H, int W, int K, int S,
                                int P) {
  size_t ohw = (size_t)out_size(H, K, S, P) * (size_t)out_size(W, K, S, P);
  return (size_t)B * (size_t)IC * (size_t)K * (size_t)K * ohw;
}

/* The range [lo, hi) of output positions o whose input position o*S - P + k
 * lies in [0, n). */
static void valid_range(int n, int k, int S, int P, int on, int *lo, int *hi) {
  int first = P - k; /* o*S >= P - k */
  int a = first <= 0 ? 0 : (first + S - 1) / S;
  int last = n - 1 + P - k; /* o*S <= n - 1 + P - k */
  int b = last < 0 ? 0 : last / S + 1;
  if (b > on) b = on;
  if (a > b) a = b;
  *lo = a, *hi = b;
}

/* Rows c0*K*K .. c1*K*K of col (IC*K*K, OH*OW): channels [c0, c1) of one
 * sample in (IC, H, W). */
static void im2col(float *restrict col, const float *restrict in, int c0,
                   int c1, int H, int W, int K, int S, int P, int OH, int OW) {
  for (int c = c0; c < c1; c++) {
    const float *plane = in + (size_t)c * H * W;
    for (int ki = 0; ki < K; ki++) {
      int oh_lo, oh_hi;
      valid_range(H, ki, S, P, OH, &oh_lo, &oh_hi);
      for (int kj = 0; kj < K; kj++) {
        int ow_lo, ow_hi;
        valid_range(W, kj, S, P, OW, &ow_lo, &ow_hi);
        float *row = col + ((size_t)(c * K + ki) * K + kj) * OH * OW;
        for (int oh = 0; oh < OH; oh++) {
          float *dst = row + (size_t)oh * OW;
          if (oh < oh_lo || oh >= oh_hi) {
            memset(dst, 0, sizeof(float) * (size_t)OW);
            continue;
          }
          /* input column of ow is ow*S + kj - P, inside [0, W) for ow in
           * [ow_lo, ow_hi); indices stay ints so no pointer leaves the row */
          const float *src = plane + (size_t)(oh * S - P + ki) * W;
          int shift = kj - P;
          for (int ow = 0; ow < ow_lo; ow++) dst[ow] = 0.0f;
          if (S == 1 && ow_hi > ow_lo)
            memcpy(dst + ow_lo, src + ow_lo + shift,
                   sizeof(float) * (size_t)(ow_hi - ow_lo));
          else
            for (int ow = ow_lo; ow < ow_hi; ow++)
              dst[ow] = src[ow * S + shift];
          for (int ow = ow_hi; ow < OW; ow++) dst[ow] = 0.0f;
        }
      }
    }
  }
}

/* Channels [c0, c1) of din (IC, H, W) = sum of dcol (IC*K*K, OH*OW) over
 * the windows each input position falls in, in a fixed (ki, kj, oh, ow)
 * order: a channel's sums read its own rows of dcol alone. */
static void col2im(float *restrict din, const float *restrict dcol, int c0,
                   int c1, int H, int W, int K, int S, int P, int OH, int OW) {
  memset(din + (size_t)c0 * H * W, 0,
         sizeof(float) * (size_t)(c1 - c0) * H * W);
  for (int c = c0; c < c1; c++) {
    float *plane = din + (size_t)c * H * W;
    for (int ki = 0; ki < K; ki++) {
      int oh_lo, oh_hi;
      valid_range(H, ki, S, P, OH, &oh_lo, &oh_hi);
      for (int kj = 0; kj < K; kj++) {
        int ow_lo, ow_hi;
        valid_range(W, kj, S, P, OW, &ow_lo, &ow_hi);
        const float *row = dcol + ((size_t)(c * K + ki) * K + kj) * OH * OW;
        for (int oh = oh_lo; oh < oh_hi; oh++) {
          const float *src = row + (size_t)oh * OW;
          float *dst = plane + (size_t)(oh * S - P + ki) * W;
          int shift = kj - P;
          for (int ow = ow_lo; ow < ow_hi; ow++) dst[ow * S + shift] += src[ow];
        }
      }
    }
  }
}

typedef struct conv_job {
  float *out, *din, *dw, *db, *col;
  const float *in, *w, *b, *dout;
  int B, IC, H, W, OC, K, S, P, OH, OW;
  int rows;        /* IC*K*K: rows of a column matrix */
  int ohw;         /* OH*OW: its columns */
  int tiles_cols;  /* tiled dW: tiles per band of output channels */
  int groups;      /* grouped dW: sample groups */
  int group_slots; /* grouped dW: column-matrix-sized slots per group */
  int dw_chunks;   /* grouped dW: reduction tasks over dW elements */
  int tiles;       /* small batches: column tiles of a sample's products */
  int tile_cols;   /* their width (the last one may be narrower) */
  int chunks;      /* small batches: channel chunks of im2col and col2im */
} conv_job;

static conv_job make_job(int B, int IC, int H, int W, int OC, int K, int S,
                         int P) {
  conv_job j = {.B = B,
                .IC = IC,
                .H = H,
                .W = W,
                .OC = OC,
                .K = K,
                .S = S,
                .P = P,
                .OH = out_size(H, K, S, P),
                .OW = out_size(W, K, S, P)};
  j.rows = IC * K * K;
  j.ohw = j.OH * j.OW;
  /* A batch of fewer than SPLIT_TASKS samples would leave cores idle with
   * a task per sample: each sample's products are cut into column tiles
   * (of at least SPLIT_MIN_COLS, in whole vectors) and its unrolling into
   * channel chunks, so that the batch gives about SPLIT_TASKS tasks. The
   * batch and the shape decide the cut, never the pool. */
  int want = (SPLIT_TASKS + B - 1) / B, most = j.ohw / SPLIT_MIN_COLS;
  j.tiles = want < most ? want : most;
  if (j.tiles < 1) j.tiles = 1;
  j.tile_cols = (j.ohw + j.tiles - 1) / j.tiles;
  j.tile_cols = (j.tile_cols + 15) / 16 * 16;
  j.tiles = (j.ohw + j.tile_cols - 1) / j.tile_cols;
  j.chunks = j.tiles < IC ? j.tiles : IC;
  return j;
}

static size_t slot_floats(const conv_job *j) {
  return (size_t)j->rows * j->ohw;
}

static const float *sample_in(const conv_job *j, int s) {
  return j->in + (size_t)s * j->IC * j->H * j->W;
}

static const float *sample_dout(const conv_job *j, int s) {
  return j->dout + (size_t)s * j->OC * j->ohw;
}

/* The column matrix of sample s, unrolled into buf unless the conv is
 * pointwise, where the input already is one. */
static const float *columns(const conv_job *j, int s, float *buf) {
  if (is_pointwise(j->K, j->S, j->P)) return sample_in(j, s);
  im2col(buf, sample_in(j, s), 0, j->IC, j->H, j->W, j->K, j->S, j->P, j->OH,
         j->OW);
  return buf;
}

/* Small batches (j->tiles > 1): task s * chunks + k unrolls channel chunk k
 * of sample s into its slot. */
static void unroll_chunk(void *arg, int task) {
  const conv_job *j = arg;
  int s = task / j->chunks, k = task % j->chunks;
  im2col(j->col + (size_t)s * slot_floats(j), sample_in(j, s),
         k * j->IC / j->chunks, (k + 1) * j->IC / j->chunks, j->H, j->W, j->K,
         j->S, j->P, j->OH, j->OW);
}

/* Every sample's columns in its slot (a pointwise conv has them already). */
static void unroll_all(st_pool *pool, conv_job *j,
                       void (*per_sample)(void *, int)) {
  if (is_pointwise(j->K, j->S, j->P)) return;
  if (j->tiles > 1)
    st_pool_for(pool, j->B * j->chunks, unroll_chunk, j);
  else
    st_pool_for(pool, j->B, per_sample, j);
}

/* Columns [a, b) of column tile t. */
static void tile_range(const conv_job *j, int t, int *a, int *b) {
  *a = t * j->tile_cols;
  *b = *a + j->tile_cols < j->ohw ? *a + j->tile_cols : j->ohw;
}

/* Task s * tiles + t: columns of tile t of sample s's output. */
static void forward_tile(void *arg, int task) {
  const conv_job *j = arg;
  int s = task / j->tiles, a, b;
  tile_range(j, task % j->tiles, &a, &b);
  float *out = j->out + (size_t)s * j->OC * j->ohw + a;
  const float *col = is_pointwise(j->K, j->S, j->P)
                         ? sample_in(j, s)
                         : j->col + (size_t)s * slot_floats(j);
  if (j->b)
    for (int o = 0; o < j->OC; o++)
      for (int i = 0; i < b - a; i++) out[(size_t)o * j->ohw + i] = j->b[o];
  st_gemm(NULL, 0, 0, j->OC, b - a, j->rows, 1.0f, j->w, j->rows, col + a,
          j->ohw, j->b ? 1.0f : 0.0f, out, j->ohw);
}

static void forward_sample(void *arg, int s) {
  const conv_job *j = arg;
  float *out = j->out + (size_t)s * j->OC * j->ohw;
  const float *col = columns(j, s, j->col + (size_t)s * slot_floats(j));
  if (j->b)
    for (int o = 0; o < j->OC; o++)
      for (int i = 0; i < j->ohw; i++) out[(size_t)o * j->ohw + i] = j->b[o];
  /* out_s (OC, OH*OW) = W (OC, rows) . col_s (rows, OH*OW) */
  st_gemm(NULL, 0, 0, j->OC, j->ohw, j->rows, 1.0f, j->w, j->rows, col, j->ohw,
          j->b ? 1.0f : 0.0f, out, j->ohw);
}

void st_conv2d_forward(st_pool *pool, float *out, const float *in,
                       const float *w, const float *b, float *col, int B,
                       int IC, int H, int W, int OC, int K, int S, int P) {
  conv_job j = make_job(B, IC, H, W, OC, K, S, P);
  j.out = out, j.col = col, j.in = in, j.w = w, j.b = b;
  if (j.tiles == 1) {
    st_pool_for(pool, B, forward_sample, &j);
    return;
  }
  unroll_all(pool, &j, NULL);
  st_pool_for(pool, B * j.tiles, forward_tile, &j);
}

/* din_s = col2im(W^T . dout_s); buf (one slot) receives dcol and may be the
 * sample's columns, which must then be finished with. */
static void input_grad(const conv_job *j, int s, float *buf) {
  float *din = j->din + (size_t)s * j->IC * j->H * j->W;
  float *dcol = is_pointwise(j->K, j->S, j->P) ? din : buf;
  /* dcol (rows, OH*OW) = W^T (rows, OC) . dout_s (OC, OH*OW) */
  st_gemm(NULL, 1, 0, j->rows, j->ohw, j->OC, 1.0f, j->w, j->rows,
          sample_dout(j, s), j->ohw, 0.0f, dcol, j->ohw);
  if (dcol != din)
    col2im(din, dcol, 0, j->IC, j->H, j->W, j->K, j->S, j->P, j->OH, j->OW);
}

/* Sum of one output channel's gradient over a sample, in eight fixed lanes
 * (which the compiler can keep in one vector register) combined in order. */
static float channel_sum(const float *restrict d, int n) {
  float lane[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) lane[l] += d[i + l];
  for (int l = 0; i < n; i++, l++) lane[l] += d[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static void bias_grad(const conv_job *j, int o) {
  double sum = 0;
  for (int s = 0; s < j->B; s++)
    sum += channel_sum(sample_dout(j, s) + (size_t)o * j->ohw, j->ohw);
  j->db[o] += (float)sum;
}

/* Grouped dW (the usual case). Sample group g owns group_slots slots of the
 * scratch: one for a sample's columns, the rest for its partial dW (OC, rows).
 * Each group runs its samples in order: im2col, partial dW += dout_s col_s^T,
 * then din_s from the same, still cached, slot. A second pass adds the
 * partials into dW in group order. Groups depend on the shape only. */
static void backward_group(void *arg, int g) {
  const conv_job *j = arg;
  float *buf = j->col + (size_t)g * j->group_slots * slot_floats(j);
  float *partial = buf + slot_floats(j);
  int s0 = (int)((int64_t)g * j->B / j->groups);
  int s1 = (int)((int64_t)(g + 1) * j->B / j->groups);
  for (int s = s0; s < s1; s++) {
    const float *col = columns(j, s, buf);
    /* partial (OC, rows) (+)= dout_s (OC, OH*OW) . col_s^T (OH*OW, rows) */
    st_gemm(NULL, 0, 1, j->OC, j->rows, j->ohw, 1.0f, sample_dout(j, s), j->ohw,
            col, j->ohw, s == s0 ? 0.0f : 1.0f, partial, j->rows);
    if (j->din) input_grad(j, s, buf);
  }
}

static void reduce_partials(void *arg, int t) {
  const conv_job *j = arg;
  if (t >= j->dw_chunks) {
    bias_grad(j, t - j->dw_chunks);
    return;
  }
  size_t n = (size_t)j->OC * j->rows, e0 = (size_t)t * REDUCE_CHUNK;
  size_t e1 = e0 + REDUCE_CHUNK < n ? e0 + REDUCE_CHUNK : n;
  float *restrict dw = j->dw;
  for (int g = 0; g < j->groups; g++) {
    const float *restrict part =
        j->col + ((size_t)g * j->group_slots + 1) * slot_floats(j);
    for (size_t e = e0; e < e1; e++) dw[e] += part[e];
  }
}

/* Tiled dW, for batches too small to hold two groups' partials: all samples
 * are unrolled first, then each fixed (OC rows x rows columns) tile of dW adds
 * the samples' contributions in sample order; din follows per sample. */
static void unroll_sample(void *arg, int s) {
  const conv_job *j = arg;
  columns(j, s, j->col + (size_t)s * slot_floats(j));
}

static void weight_grad_tile(void *arg, int t) {
  const conv_job *j = arg;
  int o0 = (t / j->tiles_cols) * DW_TILE_ROWS;
  int c0 = (t % j->tiles_cols) * DW_TILE_COLS;
  int m = j->OC - o0 < DW_TILE_ROWS ? j->OC - o0 : DW_TILE_ROWS;
  int n = j->rows - c0 < DW_TILE_COLS ? j->rows - c0 : DW_TILE_COLS;
  for (int s = 0; s < j->B; s++) {
    const float *col = is_pointwise(j->K, j->S, j->P)
                           ? sample_in(j, s)
                           : j->col + (size_t)s * slot_floats(j);
    /* dW[o0.., c0..] (m, n) += dout_s (m, OH*OW) . col_s^T (OH*OW, n) */
    st_gemm(NULL, 0, 1, m, n, j->ohw, 1.0f,
            sample_dout(j, s) + (size_t)o0 * j->ohw, j->ohw,
            col + (size_t)c0 * j->ohw, j->ohw, 1.0f,
            j->dw + (size_t)o0 * j->rows + c0, j->rows);
  }
  if (j->db && c0 == 0)
    for (int o = o0; o < o0 + m; o++) bias_grad(j, o);
}

static void input_grad_sample(void *arg, int s) {
  const conv_job *j = arg;
  input_grad(j, s, j->col + (size_t)s * slot_floats(j));
}

/* Small batches: task s * tiles + t computes columns of tile t of sample s's
 * dcol (din itself for a pointwise conv) into its slot ... */
static void dcol_tile(void *arg, int task) {
  const conv_job *j = arg;
  int s = task / j->tiles, a, b;
  tile_range(j, task % j->tiles, &a, &b);
  float *dcol = is_pointwise(j->K, j->S, j->P)
                    ? j->din + (size_t)s * j->IC * j->H * j->W
                    : j->col + (size_t)s * slot_floats(j);
  st_gemm(NULL, 1, 0, j->rows, b - a, j->OC, 1.0f, j->w, j->rows,
          sample_dout(j, s) + a, j->ohw, 0.0f, dcol + a, j->ohw);
}

/* ... and task s * chunks + k folds channel chunk k of it into din. */
static void fold_chunk(void *arg, int task) {
  const conv_job *j = arg;
  int s = task / j->chunks, k = task % j->chunks;
  col2im(j->din + (size_t)s * j->IC * j->H * j->W,
         j->col + (size_t)s * slot_floats(j), k * j->IC / j->chunks,
         (k + 1) * j->IC / j->chunks, j->H, j->W, j->K, j->S, j->P, j->OH,
         j->OW);
}

/* din for every sample, each using its own slot of the scratch. */
static void input_grads(st_pool *pool, conv_job *j) {
  if (j->tiles == 1) {
    st_pool_for(pool, j->B, input_grad_sample, j);
    return;
  }
  st_pool_for(pool, j->B * j->tiles, dcol_tile, j);
  if (!is_pointwise(j->K, j->S, j->P))
    st_pool_for(pool, j->B * j->chunks, fold_chunk, j);
}

void st_conv2d_backward(st_pool *pool, float *din, float *dw, float *db,
                        const float *dout, const float *in, const float *w,
                        float *col, int B, int IC, int H, int W, int OC, int K,
                        int S, int P) {
  conv_job j = make_job(B, IC, H, W, OC, K, S, P);
  j.din = din, j.dw = dw, j.db = db, j.col = col, j.in = in, j.w = w;
  j.dout = dout;
  /* A partial dW (OC, rows) fills ceil(OC / OH*OW) column-matrix slots. */
  j.group_slots = 1 + (OC + j.ohw - 1) / j.ohw;
  j.groups = B / j.group_slots < MAX_GROUPS ? B / j.group_slots : MAX_GROUPS;
  if (!dw && !db) { /* the input gradient alone (a split backward's B) */
    /* the same products as with dW below, so the same bits: whole
     * samples where the groups make them (their GEMM's width decides
     * which kernel runs: a build without -march=native sent the column
     * tiles to another, and B4 IC8 14x14 OC20 differed on Zen 3) */
    if (din && j.groups >= 2)
      st_pool_for(pool, B, input_grad_sample, &j);
    else if (din)
      input_grads(pool, &j);
    return;
  }
  if (!dw) { /* din and db without dW: db's sums alone (reduce_partials) */
    if (din)
      st_conv2d_backward(pool, din, NULL, NULL, dout, in, w, col, B, IC, H, W,
                         OC, K, S, P);
    j.dw_chunks = 0;
    st_pool_for(pool, OC, reduce_partials, &j);
    return;
  }
  if (j.groups >= 2) {
    size_t n = (size_t)OC * j.rows;
    j.dw_chunks = (int)((n + REDUCE_CHUNK - 1) / REDUCE_CHUNK);
    st_pool_for(pool, j.groups, backward_group, &j);
    st_pool_for(pool, j.dw_chunks + (db ? OC : 0), reduce_partials, &j);
    return;
  }
  j.tiles_cols = (j.rows + DW_TILE_COLS - 1) / DW_TILE_COLS;
  int tiles_rows = (OC + DW_TILE_ROWS - 1) / DW_TILE_ROWS;
  unroll_all(pool, &j, unroll_sample);
  st_pool_for(pool, tiles_rows * j.tiles_cols, weight_grad_tile, &j);
  if (din) input_grads(pool, &j);
}

st_cost st_conv2d_cost(int IC, int H, int W, int OC, int K, int S, int P) {
  double ohw = (double)out_size(H, K, S, P) * out_size(W, K, S, P);
  double macs = (double)OC * IC * K * K * ohw;
  st_cost c;
  c.flops_fwd = 2.0 * macs + OC * ohw;
  c.flops_bwd = 4.0 * macs + OC * ohw; /* dW and din, plus db */
  c.param_bytes = 4.0 * ((double)OC * IC * K * K + OC);
  c.act_bytes = 4.0 * OC * ohw;
  return c;
}
