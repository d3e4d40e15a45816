/*
 * calibrate.c — this machine's kernel rates, measured once and stored as a
 * profile the cpu fabric uses (docs/compiler.md, "Calibration").
 *
 * What is measured, each the best of three short timed windows:
 *   - GEMM rate through st_gemm on one thread, for one representative shape
 *     per st_gemm_class; each iteration is the three GEMMs of a layer's
 *     step (forward, weight gradient, input gradient: op(A) op(B) with the
 *     transposes (N,T), (T,N), (N,N)), so the rate mixes them as training
 *     does;
 *   - the large class at 1, 2, 4, ... threads: e(c) = rate(c) / (c rate(1)),
 *     and the slope s of e(c) = 1/(1 + s (c - 1)) fitted by least squares on
 *     1/e - 1 = s (c - 1), so the partitioner keeps its closed form;
 *   - conv2d and attention, forward and backward, as FLOP/s of the
 *     kernels themselves (im2col, col2im and the bias; softmax and the
 *     causal mask, beside their GEMMs) for one shape per GEMM class; their
 *     GEMMs alone ran 1.3-2.5x faster than the kernels;
 *   - the single-threaded ops (relu, groupnorm, maxpool, the optimizer
 *     step, gelu) as bytes/s, with "bytes" counted exactly as pass 1 counts
 * them (cost.c), so time = bytes / bandwidth holds by construction;
 *   - memcpy of activation-sized buffers: the stage-to-stage copy;
 *   - the machine's memory bandwidth on each thread count: a STREAM-like
 *     triad over arrays together four times the last-level cache,
 *     allocated once (measure_memory);
 *   - each st_gemm_choose class's product by the packed kernel and by the
 *     BLAS, for the trainer to take the faster (not used by the plans);
 *   - the optimizer step on a slab larger than any last-level cache: in a
 *     run its weights, gradients and state are touched once a step and
 *     come from memory (a hot-cache figure was 2-3x too fast);
 *   - the caller's work between steps: a batch of 64 Fashion-MNIST-shaped
 *     samples filled from a dataset larger than the caches, as bytes/s of
 *     fp32 input written; and a step handed to a spinning stage thread and
 *     back to the sleeping caller (st_waiter, as the pipelines do).
 * The profile is JSON, format "strata-calibration" version 1 (STYLE 19:
 * checked on load, with a hint on mismatch).
 */
#include "compile.h"
#include "../base/chan.h"
#include "../base/narrow.h"

#include <ctype.h>
#include <stddef.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FORMAT_NAME "strata-calibration"
#define WINDOW_S 0.08  /* one timed window; best of three */
#define ROUNDS 3       /* paired rounds of the multi-thread measurements */
#define HANDOFF_MAX 64 /* stage threads of the hand-off */

/* Representative GEMM per class (M, N, K), at the batch-64 shapes of the
 * shipped configs: conv1 of cnn_fmnist (32 x 784 x 9), a small linear,
 * fc_mnist's hidden layer, cnn_fmnist's dense layer. */
static const int gemm_shapes[ST_GEMM_CLASSES][3] = {
    {32, 784, 9}, {64, 128, 128}, {64, 256, 256}, {64, 256, 3136}};

/* ------------------------------------------------------------ timing */

typedef void (*work_fn)(void *arg);

/* Seconds per call of fn: the best of three windows of >= WINDOW_S. */
static double time_per_call(work_fn fn, void *arg) {
  fn(arg); /* warm caches and pages */
  double best = INFINITY;
  for (int rep = 0; rep < 3; rep++) {
    long calls = 0;
    double t0 = st_now(), t;
    do {
      fn(arg);
      calls++;
      t = st_now() - t0;
    } while (t < WINDOW_S);
    if (t / (double)calls < best) best = t / (double)calls;
  }
  return best;
}

typedef struct gemm_job {
  st_pool *pool;
  int M, N, K;
  float *a, *b, *c, *d;
} gemm_job;

/* One layer's step: forward C = A B^T-like, weight gradient added to the
 * gradient as training does, input gradient (the transposes and betas of
 * st_linear_forward / _backward). */
static void gemm_step(void *arg) {
  gemm_job *j = arg;
  int M = j->M, N = j->N, K = j->K;
  st_gemm(j->pool, 0, 1, M, N, K, 1.0f, j->a, K, j->b, K, 0.0f, j->c, N);
  st_gemm(j->pool, 1, 0, N, K, M, 1.0f, j->c, N, j->a, K, 1.0f, j->d, K);
  st_gemm(j->pool, 0, 0, M, K, N, 1.0f, j->c, N, j->b, K, 0.0f, j->a, K);
}

static void fill(float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
}

/* Allocates and fills j's matrices for its M, N, K; 0 or ST_ENOMEM. */
static int gemm_job_alloc(gemm_job *j) {
  j->a = st_alloc((size_t)j->M * j->K * sizeof(float));
  j->b = st_alloc((size_t)j->N * j->K * sizeof(float));
  j->c = st_alloc((size_t)j->M * j->N * sizeof(float));
  j->d = st_alloc((size_t)j->N * j->K * sizeof(float));
  if (!j->a || !j->b || !j->c || !j->d) return ST_ENOMEM;
  fill(j->a, (size_t)j->M * j->K);
  fill(j->b, (size_t)j->N * j->K);
  memset(j->d, 0, (size_t)j->N * j->K * sizeof(float));
  return 0;
}

static void gemm_job_free(gemm_job *j) {
  st_free(j->a);
  st_free(j->b);
  st_free(j->c);
  st_free(j->d);
  j->a = j->b = j->c = j->d = NULL;
}

/* FLOP/s of gemm_step on shape cls with `threads` threads. */
static int gemm_rate(int cls, int threads, double *rate) {
  gemm_job j = {.M = gemm_shapes[cls][0],
                .N = gemm_shapes[cls][1],
                .K = gemm_shapes[cls][2]};
  j.pool = threads > 1 ? st_pool_create(threads) : NULL;
  int rc = gemm_job_alloc(&j);
  if (!rc && threads > 1 && !j.pool) rc = ST_ENOMEM;
  if (!rc) *rate = 6.0 * j.M * j.N * j.K / time_per_call(gemm_step, &j);
  if (j.pool) st_pool_destroy(j.pool);
  gemm_job_free(&j);
  return rc;
}

/* ------------------------------------- narrow GEMMs and cache spill */

#define NARROW_ROWS 8 /* the pipelines' micro-batch of 8 */

/* One core's cache of `level` (2, 3) from sysfs, bytes; 0 if unknown. */
static double cache_bytes(int level) {
  for (int i = 0; i < 8; i++) {
    const char *dir = "/sys/devices/system/cpu/cpu0/cache";
    char path[96], text[32];
    double size = 0;
    int lv = 0, ok = 0;
    snprintf(path, sizeof path, "%s/index%d/level", dir, i);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    ok = fscanf(f, "%d", &lv) == 1;
    fclose(f);
    snprintf(path, sizeof path, "%s/index%d/type", dir, i);
    if (!ok || lv != level || !(f = fopen(path, "r"))) continue;
    ok = fgets(text, sizeof text, f) && strncmp(text, "Instruction", 11) != 0;
    fclose(f);
    snprintf(path, sizeof path, "%s/index%d/size", dir, i);
    if (!ok || !(f = fopen(path, "r"))) continue;
    char unit = 0;
    if (fscanf(f, "%lf%c", &size, &unit) >= 1)
      size *= unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : 1.0;
    fclose(f);
    return size;
  }
  return 0;
}

/* Seconds per call of fn with `junk_n` floats written between calls (not
 * timed): the best of three windows of WINDOW_S / 2 of call time. */
static double time_after(work_fn fn, void *arg, float *junk, size_t junk_n) {
  double best = INFINITY;
  fn(arg);
  for (int rep = 0; rep < 3; rep++) {
    long calls = 0;
    double busy = 0;
    do {
      for (size_t i = 0; i < junk_n; i++) junk[i] += 1.0f;
      double t0 = st_now();
      fn(arg);
      busy += st_now() - t0;
      calls++;
    } while (busy < WINDOW_S / 2);
    if (busy / (double)calls < best) best = busy / (double)calls;
  }
  return best;
}

static double step_after(gemm_job *j, float *junk, size_t junk_n) {
  return time_after(gemm_step, j, junk, junk_n);
}

/* The large class's layer step at NARROW_ROWS rows: its rate with the
 * weights hot, then with 0.5, 1, 2, ... MB below a cold amount (twice the
 * L3, at least 64 MB) and that amount written between steps, which evicts
 * its weights and gradient to memory on the way. */
static int measure_narrow(st_calibration *c, FILE *progress, st_error *err) {
  const int *shape = gemm_shapes[ST_GEMM_CLASSES - 1];
  gemm_job j = {.M = NARROW_ROWS, .N = shape[1], .K = shape[2]};
  double l3 = cache_bytes(3), cold = 2 * l3 > 64e6 ? 2 * l3 : 64e6;
  size_t junk_n = (size_t)(cold / sizeof(float));
  float *junk = st_alloc(junk_n * sizeof(float));
  int rc = gemm_job_alloc(&j);
  if (rc || !junk) {
    gemm_job_free(&j);
    st_free(junk);
    return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
  }
  memset(junk, 0, junk_n * sizeof(float));
  c->narrow_rows = NARROW_ROWS;
  c->l2_bytes = cache_bytes(2);
  double w = 4.0 * j.N * j.K, flops = 6.0 * j.M * j.N * j.K;
  double base = 2 * w + 4.0 * j.M * (j.N + j.K); /* weights, gradient, rows */
  double hot = step_after(&j, junk, 0);
  c->narrow_rate = flops / hot;
  /* the medium class at the same rows, its weights (256 KB) in L2 */
  const int *mid = gemm_shapes[ST_GEMM_CLASSES - 2];
  gemm_job m = {.M = NARROW_ROWS, .N = mid[1], .K = mid[2]};
  if (gemm_job_alloc(&m)) {
    gemm_job_free(&m);
    gemm_job_free(&j);
    st_free(junk);
    return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
  }
  c->narrow_l2_rate = 6.0 * m.M * m.N * m.K / step_after(&m, junk, 0);
  gemm_job_free(&m);
  double t[ST_SPILL_POINTS], mb = 0.5;
  int n = 0;
  c->spill_ws[n] = base;
  t[n++] = hot;
  for (; n < ST_SPILL_POINTS - 1 && mb * 1048576.0 < cold; n++, mb *= 2) {
    c->spill_ws[n] = base + mb * 1048576.0;
    t[n] = step_after(&j, junk, (size_t)(mb * 1048576.0 / sizeof(float)));
  }
  c->spill_ws[n] = base + cold;
  t[n] = step_after(&j, junk, junk_n);
  c->n_spill = ++n;
  /* the share of the cold step's extra time paid at each amount, made
   * monotone (a window slowed by the host cannot undo a spill) */
  double extra = t[n - 1] - hot;
  c->spill_cost = extra > 0 ? extra / w : 0;
  for (int k = 0; k < n; k++) {
    double fr = extra > 0 ? (t[k] - hot) / extra : 0;
    fr = fr < 0 ? 0 : fr > 1 ? 1 : fr;
    c->spill_fraction[k] =
        k && fr < c->spill_fraction[k - 1] ? c->spill_fraction[k - 1] : fr;
  }
  c->spill_fraction[0] = 0;
  c->spill_fraction[n - 1] = 1;
  if (!(extra > 0)) c->n_spill = 0; /* the cold step was no slower: no curve */
  if (progress) {
    fprintf(progress,
            "  gemm large at %d rows %8.2f GFLOP/s (weights hot; L2 %.0f KB)\n",
            j.M, c->narrow_rate / 1e9, c->l2_bytes / 1024);
    fprintf(progress,
            "  gemm medium at %d rows %7.2f GFLOP/s (weights in L2)\n", j.M,
            c->narrow_l2_rate / 1e9);
    fprintf(progress,
            "  spill: %.1f us per MB of weights from memory; share "
            "paid by MB touched:",
            c->spill_cost * 1048576.0 * 1e6);
    for (int k = 0; k < n; k++)
      fprintf(progress, " %.1f:%.2f", c->spill_ws[k] / 1048576.0,
              c->spill_fraction[k]);
    fprintf(progress, "\n");
  }
  gemm_job_free(&j);
  st_free(junk);
  return 0;
}

/* The trainer's one-row layer step (block.c at one sample, the update
 * fused into the backward): y = W x + b, then SGD with momentum from the
 * outer product y x^T, the input gradient y W made in the same pass. */
typedef struct row_job {
  st_pool *pool; /* NULL: the calling thread */
  int OC, IC;
  float *w, *v, *x, *y, *b, *dx;
  st_optim_rule rule;
} row_job;

static void row_step(void *arg) {
  row_job *j = arg;
  st_linear_forward(j->pool, j->y, j->x, j->w, j->b, 1, j->IC, j->OC);
  st_optim_update_outer(j->pool, &j->rule, j->w, j->v, NULL, j->y, j->x, j->OC,
                        j->IC, NULL, j->dx);
}

static double row_after(row_job *j, float *junk, size_t junk_n) {
  return time_after(row_step, j, junk, junk_n);
}

static void row_job_free(row_job *j) {
  float **a[] = {&j->w, &j->v, &j->x, &j->y, &j->b, &j->dx};
  for (size_t k = 0; k < sizeof a / sizeof a[0]; k++) {
    st_free(*a[k]);
    *a[k] = NULL;
  }
}

static int row_job_alloc(row_job *j, int OC, int IC) {
  size_t n = (size_t)OC * IC;
  j->OC = OC, j->IC = IC;
  j->w = st_alloc(n * sizeof(float));
  j->v = st_alloc(n * sizeof(float));
  j->x = st_alloc((size_t)IC * sizeof(float));
  j->dx = st_alloc((size_t)IC * sizeof(float));
  j->y = st_alloc((size_t)OC * sizeof(float));
  j->b = st_alloc((size_t)OC * sizeof(float));
  if (!j->w || !j->v || !j->x || !j->dx || !j->y || !j->b) return ST_ENOMEM;
  fill(j->w, n);
  memset(j->v, 0, n * sizeof(float));
  fill(j->x, (size_t)IC);
  fill(j->b, (size_t)OC);
  st_config cfg; /* SGD with momentum past its first step */
  st_config_defaults(&cfg);
  snprintf(cfg.optimizer.kind, sizeof cfg.optimizer.kind, "sgd");
  cfg.optimizer.momentum = 0.9f;
  cfg.optimizer.weight_decay = 0;
  st_optim_rule_init(&j->rule, &cfg, 1e-7f, 1);
  return 0;
}

/* Rates made not to rise with the bytes: a window slowed by the host at a
 * smaller amount cannot make more bytes cheaper. */
static void not_rising(double *rate, int n) {
  for (int k = 1; k < n; k++)
    if (rate[k] > rate[k - 1]) rate[k] = rate[k - 1];
}

/* j's step on `most` threads against one, in paired rounds (as e(c)):
 * *e = rate(most) / (most rate(1)); 1 on one thread. 0 or ST_ENOMEM. */
static int row_efficiency(row_job *j, int most, float *junk, double *e) {
  *e = 1;
  if (most < 2) return 0;
  st_pool *pool = st_pool_create(most);
  if (!pool) return ST_ENOMEM;
  double one = INFINITY, many = INFINITY;
  for (int r = 0; r < ROUNDS; r++) {
    one = fmin(one, row_after(j, junk, 0));
    j->pool = pool;
    many = fmin(many, row_after(j, junk, 0));
    j->pool = NULL;
  }
  *e = one / (most * many);
  st_pool_destroy(pool);
  return 0;
}

/* "  <what>, GB/s by MB touched a step: MB:GB/s ..." (no newline) */
static void print_curve(FILE *f, const char *what, const double *ws,
                        const double *rate, int n) {
  fprintf(f, "  %s, GB/s by MB touched a step:", what);
  for (int k = 0; k < n; k++)
    fprintf(f, " %.1f:%.1f", ws[k] / 1048576.0, rate[k] / 1e9);
}

/* The curve of the trainer's one-row step (st_calibration.row_step_*):
 * bytes touched a step against bytes of weights streamed per second. Two
 * shapes with nothing else (fc_mnist's 784 x 256 and the large class's
 * 3136 x 256, their weights and momentum 1.5 and 6.1 MB), then the larger
 * with 1, 2, 4, 8 and 16 MB and a cold amount (twice the L3, at least 64
 * MB) written between steps. In training a layer's weights come back
 * after the rest of the step has used the caches: on the 2-vCPU Zen 4 VM
 * a trace of cnn_fmnist's 3136 x 256 layer at one sample streamed at
 * about 49 GB/s in training and 80 in a loop. */
static int measure_row_step(st_calibration *c, FILE *progress, st_error *err) {
  static const int ic[2] = {784, 3136};
  static const double junk_mb[] = {1, 2, 4, 8, 16};
  const int OC = 256;
  double l3 = cache_bytes(3), cold = 2 * l3 > 64e6 ? 2 * l3 : 64e6;
  size_t junk_n = (size_t)(cold / sizeof(float));
  float *junk = st_alloc(junk_n * sizeof(float));
  row_job j = {0};
  int n = 0, rc = junk ? 0 : ST_ENOMEM;
  int most = c->n_threads > 0 ? c->threads[c->n_threads - 1] : 1;
  if (junk) memset(junk, 0, junk_n * sizeof(float));
  for (int s = 0; s < 2 && !rc; s++) {
    if ((rc = row_job_alloc(&j, OC, ic[s]))) break;
    double w = 4.0 * OC * ic[s], own = 2 * w + 4.0 * (2 * ic[s] + 2 * OC);
    c->row_step_ws[n] = own;
    c->row_step_rate[n++] = 6 * w / row_after(&j, junk, 0);
    for (size_t k = 0; s == 1 && k <= sizeof junk_mb / sizeof *junk_mb; k++) {
      double bytes =
          k < sizeof junk_mb / sizeof *junk_mb ? junk_mb[k] * 1048576.0 : cold;
      c->row_step_ws[n] = own + bytes;
      c->row_step_rate[n++] =
          6 * w / row_after(&j, junk, (size_t)(bytes / sizeof(float)));
    }
    /* each shape's scaling on the most threads */
    if (!rc)
      rc = row_efficiency(&j, most, junk,
                          s ? &c->row_step_efficiency
                            : &c->row_step_efficiency_small);
    if (s == 0) row_job_free(&j);
  }
  row_job_free(&j);
  st_free(junk);
  if (rc) {
    c->n_row_step = 0;
    return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
  }
  c->n_row_step = n;
  not_rising(c->row_step_rate, n);
  if (progress) {
    print_curve(progress, "one-row layer step", c->row_step_ws,
                c->row_step_rate, n);
    fprintf(progress, "; on %d threads e = %.3f (%.3f at 784 x 256)\n", most,
            c->row_step_efficiency, c->row_step_efficiency_small);
  }
  return 0;
}

/* The curve of the same step where the gradient accumulates over
 * micro-batches of one row (st_calibration.rank_one_*): no update fused,
 * a rank-one weight gradient added to the gradient. Bytes touched a step
 * against bytes of weights streamed per second (4 per weight byte), on
 * the curve of the fused step's points: fc_mnist's 784 x 256 and the
 * large class's 3136 x 256 alone (weights and gradient 1.5 and 6.1 MB),
 * then the larger with 1, 2, 4, 8 and 16 MB and a cold amount written
 * between steps. fc_mnist's 2-stage pipeline at batch 8 (8 one-row
 * micro-batches) on the 2-vCPU Zen 3 VM: its first stage's 784 x 256
 * forward took 16.8 us timed alone (execution.block_costs: measured), 23.3
 * at the large shape's single figure. */
static int measure_rank_one(st_calibration *c, FILE *progress, st_error *err) {
  static const int ic[2] = {784, 3136};
  static const double junk_mb[] = {1, 2, 4, 8, 16};
  const int n_junk = sizeof junk_mb / sizeof *junk_mb;
  double l3 = cache_bytes(3), cold = 2 * l3 > 64e6 ? 2 * l3 : 64e6;
  size_t junk_n = (size_t)(cold / sizeof(float));
  float *junk = st_alloc(junk_n * sizeof(float));
  int n = 0, rc = junk ? 0 : ST_ENOMEM;
  if (junk) memset(junk, 0, junk_n * sizeof(float));
  for (int s = 0; s < 2 && !rc; s++) {
    gemm_job j = {.M = 1, .N = 256, .K = ic[s]};
    if ((rc = gemm_job_alloc(&j))) {
      gemm_job_free(&j);
      break;
    }
    double w = 4.0 * j.N * j.K, own = 2 * w + 4.0 * (2 * j.K + 2 * j.N);
    for (int k = -1; k < (s ? n_junk + 1 : 0); k++) {
      double bytes = k < 0 ? 0 : k < n_junk ? junk_mb[k] * 1048576.0 : cold;
      c->rank_one_ws[n] = own + bytes;
      c->rank_one_rate[n++] =
          4 * w / step_after(&j, junk, (size_t)(bytes / sizeof(float)));
    }
    gemm_job_free(&j);
  }
  st_free(junk);
  if (rc) {
    c->n_rank_one = 0;
    return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
  }
  c->n_rank_one = n;
  not_rising(c->rank_one_rate, n);
  if (progress) {
    print_curve(progress, "one-row rank-one step", c->rank_one_ws,
                c->rank_one_rate, n);
    fprintf(progress, "\n");
  }
  return 0;
}

/* The large class's layer step at one row — matrix-vector products
 * forward and for the input gradient, a rank-one weight gradient — on its
 * weights, which are past L2 and within the last-level cache, as they are
 * in pipelined backprop's stages: bytes of weights streamed per second,
 * 4 per weight byte (read, read, gradient read and written). At one row
 * these layers move bytes more than they compute (cost.c). */
static int measure_row(st_calibration *c, FILE *progress, st_error *err) {
  const int *shape = gemm_shapes[ST_GEMM_CLASSES - 1];
  gemm_job j = {.M = 1, .N = shape[1], .K = shape[2]};
  if (gemm_job_alloc(&j)) {
    gemm_job_free(&j);
    return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
  }
  double w = 4.0 * j.N * j.K;
  c->row_bandwidth = 4 * w / time_per_call(gemm_step, &j);
  if (progress)
    fprintf(progress,
            "  gemm large at 1 row  %8.2f GB/s of weights streamed "
            "(matrix-vector, rank one; %.1f MB)\n",
            c->row_bandwidth / 1e9, w / 1048576.0);
  gemm_job_free(&j);
  int rc = measure_rank_one(c, progress, err);
  return rc ? rc : measure_row_step(c, progress, err);
}

/* n one-thread GEMM streams at once, as n one-core stages run. They start
 * together and run to one deadline, so every timed call overlaps the
 * others' (a best-of-windows per thread could time a window run alone). */
#define STREAM_S 0.25

typedef struct streams {
  atomic_int ready, go; /* go: 1 run, -1 abort */
  double deadline;      /* st_now() at which each stream stops */
} streams;

typedef struct stream {
  streams *all;
  double rate;
  int rc;
} stream;

static void *stream_main(void *arg) {
  stream *s = arg;
  const int *shape = gemm_shapes[ST_GEMM_CLASSES - 1];
  gemm_job j = {.M = shape[0], .N = shape[1], .K = shape[2]};
  s->rc = gemm_job_alloc(&j);
  if (!s->rc) gemm_step(&j); /* warm */
  atomic_fetch_add(&s->all->ready, 1);
  int go;
  while ((go = atomic_load(&s->all->go)) == 0)
    ;
  if (go > 0 && !s->rc) {
    long calls = 0;
    double t0 = st_now(), t;
    do {
      gemm_step(&j);
      calls++;
    } while ((t = st_now()) < s->all->deadline);
    s->rate = 6.0 * j.M * j.N * j.K * (double)calls / (t - t0);
  }
  gemm_job_free(&j);
  return NULL;
}

/* Their summed rate, or -1 when threads or memory ran out. */
static double streams_rate(int n) {
  streams all;
  atomic_init(&all.ready, 0);
  atomic_init(&all.go, 0);
  stream *s = calloc((size_t)n, sizeof *s);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  double sum = -1;
  int started = 0;
  if (s && th) {
    for (; started < n; started++) {
      s[started].all = &all;
      if (pthread_create(&th[started], NULL, stream_main, &s[started])) break;
    }
    while (started == n && atomic_load(&all.ready) < n)
      ;
    all.deadline = st_now() + STREAM_S;
    atomic_store(&all.go, started == n ? 1 : -1);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (started == n) {
      sum = 0;
      for (int i = 0; i < n && sum >= 0; i++)
        sum = s[i].rc ? -1 : sum + s[i].rate;
    }
  }
  free(s);
  free(th);
  return sum;
}

/* ----------------------------------------------- single-threaded ops */

/* Shapes: a batch of 64 of 32 channels at 14 x 14 (2 MB per tensor), the
 * middle of the shipped configs' activations. */
enum { OB = 64, OC = 32, OH = 14, OW = 14, OG = 8 };

typedef struct op_job {
  st_config cfg;
  size_t n;
  float *x, *y, *dx, *dy, *mean, *rstd, *w, *b, *dw, *db;
  int32_t *idx;
} op_job;

static void relu_step(void *arg) {
  op_job *j = arg;
  st_relu_forward(j->y, j->x, j->n);
  st_relu_backward(j->dx, j->dy, j->y, j->n);
}

static void norm_step(void *arg) {
  op_job *j = arg;
  st_groupnorm_forward(NULL, j->y, j->mean, j->rstd, j->x, j->w, j->b, OB, OC,
                       OH * OW, OG, 1e-5f);
  st_groupnorm_backward(NULL, j->dx, j->dw, j->db, j->dy, j->x, j->w, j->mean,
                        j->rstd, OB, OC, OH * OW, OG);
}

static void gelu_step(void *arg) {
  op_job *j = arg;
  st_gelu_forward(j->y, j->x, j->n, 1);
  st_gelu_backward(j->dx, j->dy, j->x, j->n, 1);
}

static void pool_step(void *arg) {
  op_job *j = arg;
  st_maxpool_forward(j->y, j->idx, j->x, OB, OC, OH, OW, 2, 2);
  st_maxpool_backward(j->dx, j->dy, j->idx, OB, OC, OH, OW, 2, 2);
}

/* The optimizer's slab: 3 x 64 MB with one state slot, past any
 * last-level cache. The step clears the gradients itself. */
enum { OPT_FLOATS = 1 << 24 };

typedef struct optim_job {
  st_config cfg;
  float *w, *g, *s;
} optim_job;

static void optim_step(void *arg) {
  optim_job *j = arg;
  st_optim_step(NULL, &j->cfg, j->w, j->g, j->s, OPT_FLOATS, 1e-6f, 1);
}

/* bytes/s of the optimizer step as cost.c counts them (4 + 2 slots floats
 * per parameter), or -1 out of memory */
static double optim_bandwidth(const st_config *cfg) {
  optim_job j = {.cfg = *cfg};
  double slots = st_optim_state_per_param(cfg), bw = -1;
  size_t bytes = (size_t)OPT_FLOATS * sizeof(float);
  j.w = st_alloc(bytes);
  j.g = st_alloc(bytes);
  j.s = st_alloc(bytes * (size_t)(slots > 1 ? slots : 1));
  if (j.w && j.g && j.s) {
    fill(j.w, OPT_FLOATS);
    memset(j.g, 0, bytes);
    memset(j.s, 0, bytes * (size_t)(slots > 1 ? slots : 1));
    bw = 4.0 * OPT_FLOATS * (4 + 2 * slots) / time_per_call(optim_step, &j);
  }
  st_free(j.w);
  st_free(j.g);
  st_free(j.s);
  return bw;
}

/* A batch's input from a dataset of 60,000 28 x 28 samples (47 MB). */
enum { IN_SAMPLES = 60000, IN_BATCH = 64 };

typedef struct input_job {
  st_dataset ds;
  int32_t idx[IN_BATCH];
  float *x;
  int y[IN_BATCH];
  uint32_t state;
} input_job;

static void input_step(void *arg) {
  input_job *j = arg;
  for (int b = 0; b < IN_BATCH; b++) { /* a shuffled epoch's draw */
    j->state = j->state * 1664525u + 1013904223u;
    j->idx[b] = (int32_t)((j->state >> 8) % IN_SAMPLES);
  }
  st_dataset_batch(&j->ds, j->idx, IN_BATCH, 1, j->x, j->y);
}

static double input_bandwidth(void) {
  input_job j;
  memset(&j, 0, sizeof j);
  j.ds.n = IN_SAMPLES;
  j.ds.shape = (st_shape){1, 28, 28};
  j.ds.classes = 10;
  j.ds.mean = 0.25f;
  j.ds.std = 0.35f;
  size_t numel = 28 * 28;
  j.ds.pixels = st_alloc((size_t)IN_SAMPLES * numel);
  j.ds.labels = st_alloc(IN_SAMPLES);
  j.x = st_alloc((size_t)IN_BATCH * numel * sizeof(float));
  double bw = -1;
  if (j.ds.pixels && j.ds.labels && j.x) {
    for (size_t i = 0; i < (size_t)IN_SAMPLES * numel; i++)
      j.ds.pixels[i] = (uint8_t)(i * 2654435761u >> 24);
    memset(j.ds.labels, 0, IN_SAMPLES);
    bw = 4.0 * IN_BATCH * numel / time_per_call(input_step, &j);
  }
  st_free(j.ds.pixels);
  st_free(j.ds.labels);
  st_free(j.x);
  return bw;
}

/* A step handed to the stage threads and back, two ways.
 * - As threaded pipelined backprop's caller does (and a pipeline's did
 *   before its first stage ran on the caller's thread): the caller
 *   publishes the step and sleeps; the stages, spinning as between steps,
 *   count it done, and the last one wakes the caller. There are as many
 *   stage threads as cores, so the caller's wake-up has to take a core
 *   from a spinning stage (2 stages on 2 cores: fc_mnist's 2-stage
 *   pipeline at one sample had 25 us a step between its stages' work).
 * - Hosted, as a pipeline and block_sequential in one process do: the
 *   caller is the first stage, publishes the step to the other stage
 *   threads and spins for their counts on its own core, as run_on in
 *   src/exec/pipeline.c does (docs/bench.md, "The first stage on the
 *   caller's thread"). */
typedef struct handoff handoff;
typedef struct handoff_thread { /* one stage: a waiter has one sleeper */
  handoff *h;
  st_waiter w;
} handoff_thread;
struct handoff {
  st_waiter caller;
  handoff_thread stage[HANDOFF_MAX];
  atomic_llong generation, done;
  atomic_int stop;
  int spin;   /* as a pipeline's stages: only with a core of their own */
  int stages; /* threads */
  int hosted; /* the caller runs the first stage: one thread fewer */
};

static void *handoff_stage(void *arg) {
  handoff_thread *me = arg;
  handoff *h = me->h;
  for (long long seen = 1;; seen++) {
    if (st_wait_ge(&me->w, &h->generation, seen, h->spin, &h->stop, NULL))
      return NULL;
    atomic_fetch_add(&h->done, 1);
    st_waiter_wake(&h->caller);
  }
}

static void handoff_step(void *arg) {
  handoff *h = arg;
  long long want = atomic_load(&h->done) + h->stages;
  atomic_fetch_add(&h->generation, 1);
  for (int i = 0; i < h->stages; i++) st_waiter_wake(&h->stage[i].w);
  /* hosting the first stage, the caller spins on that stage's core as a
   * stage does; else it sleeps (the stage threads have the cores) */
  st_wait_ge(&h->caller, &h->done, want, h->hosted ? h->spin : 0, NULL, NULL);
}

double st_calibration_handoff(int stages, int hosted) {
  if (stages > HANDOFF_MAX) stages = HANDOFF_MAX;
  if (stages < 1) stages = 1;
  handoff *h = calloc(1, sizeof *h);
  if (!h) return -1;
  st_waiter_init(&h->caller);
  h->spin = st_usable_cpus(NULL, 0) >= stages ? ST_SPIN : 0;
  h->hosted = hosted != 0;
  stages -= h->hosted; /* the caller is the first: one thread fewer */
  pthread_t th[HANDOFF_MAX];
  int started = 0;
  for (; started < stages; started++) {
    h->stage[started].h = h;
    st_waiter_init(&h->stage[started].w);
    if (pthread_create(&th[started], NULL, handoff_stage, &h->stage[started])) {
      st_waiter_destroy(&h->stage[started].w);
      break;
    }
  }
  h->stages = started;
  double t = started == stages ? time_per_call(handoff_step, h) : -1;
  atomic_store(&h->stop, 1);
  for (int i = 0; i < started; i++) st_waiter_wake_always(&h->stage[i].w);
  for (int i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    st_waiter_destroy(&h->stage[i].w);
  }
  st_waiter_destroy(&h->caller);
  free(h);
  return t;
}

static double median(double *v, int n);

static void empty_task(void *arg, int task) {
  (void)arg;
  (void)task;
}

static void round_trip_step(void *arg) {
  st_pool *pool = arg;
  st_pool_for(pool, st_pool_threads(pool), empty_task, NULL);
}

double st_calibration_round_trip(int threads) {
  if (threads < 2) return 0;
  st_pool *pool = st_pool_create(threads);
  if (!pool) return -1;
  double t[9];
  for (int k = 0; k < 9; k++) {
    round_trip_step(pool); /* the workers awake and spinning */
    long calls = 0;
    double t0 = st_now(), dt;
    do {
      for (int r = 0; r < 64; r++) round_trip_step(pool);
      calls += 64;
      dt = st_now() - t0;
    } while (dt < 0.01);
    t[k] = dt / (double)calls;
  }
  st_pool_destroy(pool);
  return median(t, 9);
}

static void copy_step(void *arg) {
  op_job *j = arg;
  memcpy(j->y, j->x, j->n * sizeof(float));
}

static int measure_ops(st_calibration *c, FILE *progress, st_error *err) {
  op_job j;
  memset(&j, 0, sizeof j);
  st_config_defaults(&j.cfg);
  /* the shipped configs' optimizer: SGD with momentum, one state slot */
  int rc = st_config_set(&j.cfg, "optimizer.kind=sgd", err);
  if (!rc) rc = st_config_set(&j.cfg, "optimizer.momentum=0.9", err);
  if (rc) return rc;
  size_t n = (size_t)OB * OC * OH * OW, bytes = n * sizeof(float);
  j.n = n;
  float **bufs[] = {&j.x, &j.y, &j.dx, &j.dy, &j.w, &j.dw};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    *bufs[i] = st_alloc(bytes);
  j.idx = st_alloc(n * sizeof(int32_t));
  j.mean = st_alloc(OB * OG * sizeof(float));
  j.rstd = st_alloc(OB * OG * sizeof(float));
  j.b = st_alloc(OC * sizeof(float));
  j.db = st_alloc(OC * sizeof(float));
  rc = 0;
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    if (!*bufs[i]) rc = ST_ENOMEM;
  if (rc || !j.idx || !j.mean || !j.rstd || !j.b || !j.db) {
    rc = st_error_set(err, ST_ENOMEM, "calibration: out of memory");
    goto done;
  }
  fill(j.x, n);
  fill(j.dy, n);
  fill(j.w, n);
  memset(j.dw, 0, bytes);
  memset(j.b, 0, OC * sizeof(float));
  double dn = (double)n, pooled = dn / 4;
  /* bytes as cost.c counts them for the same layers */
  c->op_bandwidth[0] = 4 * (2 * dn + 3 * dn) / time_per_call(relu_step, &j);
  c->op_bandwidth[1] = 4 * (3 * dn + 5 * dn) / time_per_call(norm_step, &j);
  c->op_bandwidth[2] = 4 * 2 * (dn + 2 * pooled) / time_per_call(pool_step, &j);
  c->op_bandwidth[3] = optim_bandwidth(&j.cfg);
  c->op_bandwidth[4] = 4 * (2 * dn + 3 * dn) / time_per_call(gelu_step, &j);
  c->copy_bandwidth = (double)bytes / time_per_call(copy_step, &j);
  c->input_bandwidth = input_bandwidth();
  c->step_latency = st_calibration_handoff(c->cores, 0);
  c->hosted_latency = st_calibration_handoff(c->cores, 1);
  if (c->op_bandwidth[3] <= 0 || c->input_bandwidth <= 0 ||
      c->step_latency <= 0 || c->hosted_latency <= 0) {
    rc = st_error_set(err, ST_ENOMEM, "calibration: out of memory or threads");
    goto done;
  }
  if (progress)
    for (int k = 0; k < ST_OP_CLASSES; k++)
      fprintf(progress, "  %-10s %8.2f GB/s (one thread)\n",
              st_op_class_name(k), c->op_bandwidth[k] / 1e9);
  if (progress) {
    fprintf(progress, "  %-10s %8.2f GB/s (memcpy of %.1f MB)\n", "copy",
            c->copy_bandwidth / 1e9, (double)bytes / 1e6);
    fprintf(progress, "  %-10s %8.2f GB/s (a batch's fp32 input filled)\n",
            "input", c->input_bandwidth / 1e9);
    fprintf(progress,
            "  %-10s %8.2f us (a step to %d spinning stage threads and "
            "back)\n",
            "hand-off", c->step_latency * 1e6, c->cores);
    fprintf(progress,
            "  %-10s %8.2f us (the caller as the first stage, to %d stage "
            "thread%s and back)\n",
            "hosted", c->hosted_latency * 1e6, c->cores - 1,
            c->cores == 2 ? "" : "s");
  }
done:
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) st_free(*bufs[i]);
  st_free(j.idx);
  st_free(j.mean);
  st_free(j.rstd);
  st_free(j.b);
  st_free(j.db);
  return rc;
}

/* --------------------------------------------- conv2d and attention */

/* conv2d per class (batch, in channels, height = width, out channels),
 * 3x3 padded by 1, at micro-batch 8: the shipped CNN's first (tiny) and
 * second (medium) convolutions, a residual stage's 32 -> 32 (small), and
 * 64 -> 64 at 28 x 28 (large). */
static const int conv_shapes[ST_GEMM_CLASSES][4] = {
    {8, 1, 28, 32}, {8, 32, 14, 32}, {8, 32, 14, 64}, {8, 64, 28, 64}};

/* attention per class of its tiles' GEMMs, (32 rows, T, head size):
 * (batch, context, width, heads) of gpt_tiny (tiny), a 64-wide head at
 * context 256 (small, GPT-2's head), a 128-wide head at 1024 (medium, GPT-3
 * XL's head) and a 256-wide head at 2048 (large, GPT-J's). */
static const int attention_shapes[ST_GEMM_CLASSES][4] = {
    {8, 64, 128, 4}, {2, 256, 256, 4}, {1, 1024, 256, 2}, {1, 2048, 256, 1}};

typedef struct kernel_job {
  int B, IC, HW, OC; /* conv2d */
  int T, C, NH;      /* attention */
  /* attention: in is qkv, col the probabilities, w the backward's scratch */
  float *in, *w, *b, *out, *col, *dout, *din, *dw, *db;
} kernel_job;

static void conv_fwd_step(void *arg) {
  kernel_job *j = arg;
  st_conv2d_forward(NULL, j->out, j->in, j->w, j->b, j->col, j->B, j->IC, j->HW,
                    j->HW, j->OC, 3, 1, 1);
}

static void conv_bwd_step(void *arg) {
  kernel_job *j = arg;
  st_conv2d_backward(NULL, j->din, j->dw, j->db, j->dout, j->in, j->w, j->col,
                     j->B, j->IC, j->HW, j->HW, j->OC, 3, 1, 1);
}

static void attention_fwd_step(void *arg) {
  kernel_job *j = arg; /* in: qkv; w: the scratch */
  st_attention_forward(NULL, j->out, j->w, j->in, j->B, j->T, j->C, j->NH);
}

static void attention_bwd_step(void *arg) {
  kernel_job *j = arg;
  st_attention_backward(NULL, j->din, j->dout, j->in, j->w, j->B, j->T, j->C,
                        j->NH);
}

/* j's buffers, in the order kernel_alloc's counts give them */
enum { KERNEL_BUFS = 9 };
static void kernel_bufs(kernel_job *j, float **bufs[KERNEL_BUFS]) {
  float **all[KERNEL_BUFS] = {&j->in,   &j->w,   &j->b,  &j->out, &j->col,
                              &j->dout, &j->din, &j->dw, &j->db};
  memcpy(bufs, all, sizeof all);
}

static void kernel_free(kernel_job *j) {
  float **bufs[KERNEL_BUFS];
  kernel_bufs(j, bufs);
  for (int i = 0; i < KERNEL_BUFS; i++) {
    st_free(*bufs[i]);
    *bufs[i] = NULL;
  }
}

/* Allocates each buffer of j with its float count in n[] (0: none) and
 * fills the inputs; 0 or ST_ENOMEM. */
static int kernel_alloc(kernel_job *j, const size_t n[KERNEL_BUFS]) {
  float **bufs[KERNEL_BUFS];
  kernel_bufs(j, bufs);
  for (int i = 0; i < KERNEL_BUFS; i++) {
    if (!n[i]) continue;
    if (!(*bufs[i] = st_alloc(n[i] * sizeof(float)))) {
      kernel_free(j);
      return ST_ENOMEM;
    }
    fill(*bufs[i], n[i]);
  }
  return 0;
}

/* FLOP/s forward and backward of conv2d shape k, one thread. */
static int conv_rates(int k, double *fwd, double *bwd) {
  const int *s = conv_shapes[k];
  kernel_job j = {.B = s[0], .IC = s[1], .HW = s[2], .OC = s[3]};
  size_t in = (size_t)j.B * j.IC * j.HW * j.HW,
         out = (size_t)j.B * j.OC * j.HW * j.HW;
  size_t w = (size_t)j.OC * j.IC * 9;
  size_t n[KERNEL_BUFS] = {
      in,
      w,
      (size_t)j.OC,
      out,
      st_conv2d_scratch_floats(j.B, j.IC, j.HW, j.HW, 3, 1, 1),
      out,
      in,
      w,
      (size_t)j.OC};
  if (kernel_alloc(&j, n)) return ST_ENOMEM;
  st_cost c = st_conv2d_cost(j.IC, j.HW, j.HW, j.OC, 3, 1, 1);
  *fwd = j.B * c.flops_fwd / time_per_call(conv_fwd_step, &j);
  *bwd = j.B * c.flops_bwd / time_per_call(conv_bwd_step, &j);
  kernel_free(&j);
  return 0;
}

/* FLOP/s forward and backward of attention shape k, one thread. */
static int attention_rates(int k, double *fwd, double *bwd) {
  const int *s = attention_shapes[k];
  kernel_job j = {.B = s[0], .T = s[1], .C = s[2], .NH = s[3]};
  size_t qkv = (size_t)j.B * j.T * 3 * j.C, y = (size_t)j.B * j.T * j.C;
  size_t n[KERNEL_BUFS] = {
      qkv, st_attention_scratch_floats(j.B, j.T, j.C, j.NH) + 1,
      0,   y,
      0,   y,
      qkv, 0,
      0};
  if (kernel_alloc(&j, n)) return ST_ENOMEM;
  st_cost c = st_attention_cost(j.T, j.C, j.NH);
  attention_fwd_step(&j); /* first touch of the buffers */
  *fwd = j.B * c.flops_fwd / time_per_call(attention_fwd_step, &j);
  *bwd = j.B * c.flops_bwd / time_per_call(attention_bwd_step, &j);
  kernel_free(&j);
  return 0;
}

static int measure_kernels(st_calibration *c, FILE *progress, st_error *err) {
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    memcpy(c->conv_shape[k], conv_shapes[k], sizeof conv_shapes[k]);
    memcpy(c->attention_shape[k], attention_shapes[k],
           sizeof attention_shapes[k]);
    if (conv_rates(k, &c->conv_rate[0][k], &c->conv_rate[1][k]))
      return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
    if (attention_rates(k, &c->attention_rate[0][k], &c->attention_rate[1][k]))
      return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
    if (!progress) continue;
    const int *s = conv_shapes[k], *a = attention_shapes[k];
    fprintf(progress,
            "  conv2d %-6s %2dx%2dx%2d->%-3d fwd %6.2f bwd %6.2f GFLOP/s; "
            "attention T %4d hs %3d fwd %6.2f bwd %6.2f GFLOP/s\n",
            st_gemm_class_name(k), s[1], s[2], s[2], s[3],
            c->conv_rate[0][k] / 1e9, c->conv_rate[1][k] / 1e9, a[1],
            a[2] / a[3], c->attention_rate[0][k] / 1e9,
            c->attention_rate[1][k] / 1e9);
  }
  return 0;
}

/* ----------------------------------------------------------- measure */

/* ----------------------------------------- the packed kernel or the BLAS */

typedef struct choice_job {
  int ta, M, N, K;
  float *A, *B, *C;
} choice_job;

static void choice_step(void *arg) {
  const choice_job *j = arg;
  /* ta: A stored K x M; else M x K with B stored N x K (a linear layer's
   * forward, and its weight gradient's transposes) */
  st_gemm(NULL, j->ta, !j->ta, j->M, j->N, j->K, 1.0f, j->A,
          j->ta ? j->M : j->K, j->B, j->ta ? j->N : j->K, 0.0f, j->C, j->N);
}

/* Each st_gemm_choose class's product on one thread, the packed kernel and
 * the BLAS's tiles in turn (the table forced, then restored to its rule);
 * a class the packed kernel cannot take here stays 0. CHOICE_M rows: a
 * transposed A's rows CHOICE_M floats apart, as wide as those narrow.c
 * copies out with AVX-512 (COPY_A_LDA), as a wide layer's weight gradient
 * is. */
enum { CHOICE_M = 512 };
static int measure_choices(st_calibration *c, FILE *progress) {
  static const int k_top[3] = {512, 1536, 3072};
  choice_job j = {.M = CHOICE_M, .N = 768};
  size_t most = (size_t)3072 * 768;
  j.A = st_alloc((size_t)3072 * CHOICE_M * sizeof(float));
  j.B = st_alloc(most * sizeof(float));
  j.C = st_alloc((size_t)CHOICE_M * 768 * sizeof(float));
  if (!j.A || !j.B || !j.C) {
    st_free(j.A), st_free(j.B), st_free(j.C);
    return ST_ENOMEM;
  }
  fill(j.A, (size_t)3072 * CHOICE_M);
  fill(j.B, most);
  int force[ST_GEMM_CHOICES];
  for (int k = 0; k < ST_GEMM_CHOICES; k++) {
    j.ta = k >= 3, j.K = k_top[k % 3];
    for (int i = 0; i < ST_GEMM_CHOICES; i++) force[i] = -1;
    force[k] = 0;
    st_gemm_choose(force);
    int kernel =
        st_gemm_narrow_kernel(j.ta, !j.ta, j.M, j.N, j.K, j.ta ? j.M : j.K);
    if (kernel != NARROW_PACKED && kernel != NARROW_PACKED_COPY) continue;
    double flops = 2.0 * j.M * j.N * j.K;
    c->gemm_choice_rate[0][k] = flops / time_per_call(choice_step, &j);
    force[k] = 1;
    st_gemm_choose(force);
    c->gemm_choice_rate[1][k] = flops / time_per_call(choice_step, &j);
    if (progress)
      fprintf(progress,
              "  %s A, K %4d: packed %6.2f, BLAS %6.2f GFLOP/s (one thread)\n",
              j.ta ? "transposed" : "plain     ", j.K,
              c->gemm_choice_rate[0][k] / 1e9, c->gemm_choice_rate[1][k] / 1e9);
  }
  st_gemm_choose(NULL);
  /* bf16 at class 1, by the instruction where the build has it (AMX's
   * tiles where they run, else VDPBF16PS), then by the emulation; the
   * process left in fp32, the instruction preferred */
  j.ta = 0, j.K = k_top[1];
  double flops = 2.0 * j.M * j.N * j.K;
  st_gemm_set_bf16(1);
  st_bf16_prefer_emulated(0);
  for (int emulate = 0; emulate < 2; emulate++) {
    st_bf16_set_emulated(emulate);
    c->gemm_bf16_rate[emulate] = emulate || st_bf16_native()
                                     ? flops / time_per_call(choice_step, &j)
                                     : 0;
  }
  st_bf16_set_emulated(0);
  st_gemm_set_bf16(0);
  if (progress && c->gemm_bf16_rate[0] > 0)
    fprintf(progress,
            "  bf16 at K %4d: %s %6.2f, emulated %6.2f GFLOP/s (one "
            "thread)\n",
            j.K, st_bf16_tiles() ? "AMX tiles" : "vdpbf16ps",
            c->gemm_bf16_rate[0] / 1e9, c->gemm_bf16_rate[1] / 1e9);
  else if (progress)
    fprintf(progress,
            "  bf16 at K %4d: emulated %6.2f GFLOP/s (one thread; no "
            "AVX512-BF16 in this build)\n",
            j.K, c->gemm_bf16_rate[1] / 1e9);
  st_free(j.A), st_free(j.B), st_free(j.C);
  return 0;
}

/* Whether a profile prefers bf16's emulation to its instruction
 * (st_gemm_choose_profile: while subnormals are flushed, and never over
 * AMX's tiles): measure_choices found it the faster. */
static int prefers_emulation(const st_calibration *c) {
  const double *bf = c->gemm_bf16_rate;
  return bf[0] > 0 && bf[1] > bf[0];
}

/* Each class's layer step (gemm_rate's) under train.precision: bf16, by
 * the kernel a run with subnormals flushed (the default) takes: AMX's
 * tiles where they run, else the emulation where the profile prefers it,
 * else the instruction; on one thread and on all the profile's cores. The
 * process is left in fp32 with the instruction preferred. */
static int measure_bf16_classes(st_calibration *c, FILE *progress) {
  st_gemm_set_bf16(1);
  st_bf16_set_emulated(!st_bf16_tiles() && prefers_emulation(c));
  int rc = 0;
  for (int k = 0; k < ST_GEMM_CLASSES && !rc; k++) {
    double *one = &c->gemm_bf16_class_rate[k],
           *all = &c->gemm_bf16_class_rate_all[k];
    rc = gemm_rate(k, 1, one);
    *all = 0;
    if (!rc && c->cores > 1) rc = gemm_rate(k, c->cores, all);
    if (!rc && progress) {
      fprintf(progress,
              "  gemm %-6s %4dx%4dx%4d %8.2f GFLOP/s in bf16 (one thread, %s)",
              st_gemm_class_name(k), gemm_shapes[k][0], gemm_shapes[k][1],
              gemm_shapes[k][2], *one / 1e9,
              st_bf16_tiles()    ? "AMX tiles"
              : st_bf16_native() ? "vdpbf16ps"
                                 : "emulated");
      if (*all > 0) fprintf(progress, ", %.2f on %d", *all / 1e9, c->cores);
      fputc('\n', progress);
    }
  }
  st_bf16_set_emulated(0);
  st_gemm_set_bf16(0);
  return rc;
}

void st_calibration_gemm_choice(const st_calibration *c,
                                int blas[ST_GEMM_CHOICES]) {
  for (int k = 0; k < ST_GEMM_CHOICES; k++) {
    double packed = c->gemm_choice_rate[0][k],
           other = c->gemm_choice_rate[1][k];
    blas[k] = packed > 0 && other > 0 ? other > packed : -1;
  }
}

/* The applied profile's bf16 and fp32 rates (st_bf16_profile_rates):
 * set by st_gemm_choose_profile, which one thread calls before the
 * trainers it makes run. */
static double applied_bf16[2], applied_fp32;

int st_bf16_profile_rates(double *bf16, double *fp32) {
  *bf16 = applied_bf16[st_bf16_native() ? 0 : 1];
  *fp32 = applied_fp32;
  return *bf16 > 0 && *fp32 > 0;
}

static void choose_profile(void) { st_gemm_choose_profile(); }

void st_gemm_choose_profile_once(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, choose_profile);
}

int st_gemm_choose_profile(void) {
  char path[ST_PATH_MAX];
  st_calibration c;
  st_error err = {0};
  int blas[ST_GEMM_CHOICES];
  st_calibration_path(path, sizeof path);
  applied_bf16[0] = applied_bf16[1] = applied_fp32 = 0;
  st_bf16_prefer_emulated(0);
  if (!path[0] || access(path, R_OK) != 0 ||
      st_calibration_read(&c, path, &err) != 0) {
    st_gemm_choose(NULL);
    return 0;
  }
  st_calibration_gemm_choice(&c, blas);
  st_gemm_choose(blas);
  const double *bf = c.gemm_bf16_rate;
  st_bf16_prefer_emulated(prefers_emulation(&c));
  applied_bf16[0] = bf[0], applied_bf16[1] = bf[1];
  double packed = c.gemm_choice_rate[0][1], other = c.gemm_choice_rate[1][1];
  applied_fp32 = packed > other ? packed : other; /* class 1's faster */
  for (int k = 0; k < ST_GEMM_CHOICES; k++)
    if (blas[k] >= 0) return 1;
  return 0;
}

/* ---------------------------------------------------- memory bandwidth */

#define TRIAD_PASSES 3               /* timed passes a thread count; the best */
#define TRIAD_MIN_ARRAY 64e6         /* bytes of each array, at least */
#define TRIAD_MAX_ARRAY 1073741824.0 /* and at most (1 GiB) */
#define LLC_INSTANCES_MAX 256

int st_memory_bandwidth_plausible(double bw) {
  return isfinite(bw) && bw >= ST_MEMORY_BANDWIDTH_MIN &&
         bw <= ST_MEMORY_BANDWIDTH_MAX;
}

/* Every core's last-level cache together, bytes: cpu0's L3 (sysfs) times
 * the distinct L3s the online cpus share (a part of many chiplets has one
 * a chiplet, and cpu0's is then a fraction of the whole); 0 if unknown. */
static double llc_total_bytes(void) {
  double l3 = cache_bytes(3);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (!(l3 > 0) || cpus < 1) return l3 > 0 ? l3 : 0;
  char seen[LLC_INSTANCES_MAX][64]; /* 16 KB */
  int n = 0;
  for (long cpu = 0; cpu < cpus; cpu++)
    for (int i = 0; i < 8; i++) {
      char path[128], text[64] = "";
      int lv = 0;
      snprintf(path, sizeof path,
               "/sys/devices/system/cpu/cpu%ld/cache/index%d/level", cpu, i);
      FILE *f = fopen(path, "r");
      if (!f) break;
      int ok = fscanf(f, "%d", &lv) == 1;
      fclose(f);
      if (!ok || lv != 3) continue;
      snprintf(path, sizeof path,
               "/sys/devices/system/cpu/cpu%ld/cache/index%d/shared_cpu_list",
               cpu, i);
      if ((f = fopen(path, "r"))) {
        if (!fgets(text, sizeof text, f)) text[0] = '\0';
        fclose(f);
      }
      int known = 0;
      for (int k = 0; k < n && !known; k++) known = !strcmp(seen[k], text);
      if (!known && n < LLC_INSTANCES_MAX) memcpy(seen[n++], text, sizeof text);
      break;
    }
  return l3 * (n > 0 ? n : 1);
}

typedef struct triad_job {
  float *a, *b, *c; /* (n) each */
  size_t n;
  int parts; /* tasks: one a thread */
} triad_job;

static void triad_part(void *arg, int task) {
  triad_job *j = arg;
  size_t lo = j->n * (size_t)task / (size_t)j->parts,
         hi = j->n * (size_t)(task + 1) / (size_t)j->parts;
  float *restrict a = j->a;
  const float *restrict b = j->b, *restrict c = j->c;
  for (size_t i = lo; i < hi; i++) a[i] = b[i] + 3.0f * c[i];
}

/* First touch by the threads that will stream each part (on a machine of
 * several memory nodes the pages then sit near them). */
static void triad_fill(void *arg, int task) {
  triad_job *j = arg;
  size_t lo = j->n * (size_t)task / (size_t)j->parts,
         hi = j->n * (size_t)(task + 1) / (size_t)j->parts;
  for (size_t i = lo; i < hi; i++) {
    j->a[i] = 0.0f;
    j->b[i] = 1.0f;
    j->c[i] = 2.0f;
  }
}

/* bytes/s of the triad on `threads` threads: the best of TRIAD_PASSES
 * timed passes after one untimed; -1 if the pool cannot be made. */
static double triad_rate(triad_job *j, int threads) {
  st_pool *pool = threads > 1 ? st_pool_create(threads) : NULL;
  if (threads > 1 && !pool) return -1;
  j->parts = threads;
  st_pool_for(pool, j->parts, triad_part, j); /* the workers awake */
  double best = INFINITY;
  for (int k = 0; k < TRIAD_PASSES; k++) {
    double t0 = st_now();
    st_pool_for(pool, j->parts, triad_part, j);
    double t = st_now() - t0;
    if (t < best) best = t;
  }
  if (pool) st_pool_destroy(pool);
  return best > 0 ? 12.0 * (double)j->n / best : -1;
}

/* The machine's memory bandwidth on each of the profile's thread counts
 * (st_calibration.memory_bandwidth): three arrays, allocated once, of at
 * least 4/3 of every core's last-level cache each (the three four times
 * it, STREAM's rule), at least 64 MB, at most 1 GiB and a sixteenth of
 * the memory this process may use; a few tens of ms a thread count. A
 * figure outside the physical bounds is not stored: the built-in one
 * then stands, and progress says why. */
static int measure_memory(st_calibration *c, FILE *progress, st_error *err) {
  double llc = llc_total_bytes(), ram = st_usable_memory();
  double bytes =
      fmax(4.0 / 3.0 * (llc > 0 ? llc : 32.0 * 1048576), TRIAD_MIN_ARRAY);
  bytes = fmin(bytes, TRIAD_MAX_ARRAY);
  if (ram > 0) bytes = fmin(bytes, ram / 16);
  triad_job j = {.n = (size_t)(bytes / sizeof(float))};
  j.a = st_alloc(j.n * sizeof(float));
  j.b = st_alloc(j.n * sizeof(float));
  j.c = st_alloc(j.n * sizeof(float));
  int rc = 0;
  double t0 = st_now();
  if (!j.a || !j.b || !j.c) {
    rc = st_error_set(err, ST_ENOMEM,
                      "calibration: out of memory (the memory bandwidth's "
                      "3 x %.0f MB)",
                      bytes / 1e6);
    goto done;
  }
  int most = c->threads[c->n_threads - 1];
  st_pool *pool = most > 1 ? st_pool_create(most) : NULL;
  j.parts = most;
  st_pool_for(pool, most, triad_fill, &j);
  if (pool) st_pool_destroy(pool);
  int plausible = 1;
  for (int i = 0; i < c->n_threads; i++) {
    c->memory_bandwidth[i] = triad_rate(&j, c->threads[i]);
    if (c->memory_bandwidth[i] < 0) {
      rc = st_error_set(err, ST_ENOMEM,
                        "calibration: cannot start %d threads for the "
                        "memory bandwidth",
                        c->threads[i]);
      goto done;
    }
    plausible &= st_memory_bandwidth_plausible(c->memory_bandwidth[i]);
    if (progress)
      fprintf(progress, "  memory on %d thread%s %8.2f GB/s (triad)\n",
              c->threads[i], c->threads[i] == 1 ? " " : "s",
              c->memory_bandwidth[i] / 1e9);
  }
  if (progress)
    fprintf(progress,
            "  memory     3 x %.0f MB past %.1f MB of last-level cache, "
            "%.0f ms\n",
            bytes / 1e6, llc / 1e6, (st_now() - t0) * 1e3);
  if (!plausible) {
    if (progress)
      fprintf(progress,
              "  memory     ignored: a figure outside %.1f GB/s .. %.0f "
              "TB/s is no memory's; the built-in estimate stands\n",
              ST_MEMORY_BANDWIDTH_MIN / 1e9, ST_MEMORY_BANDWIDTH_MAX / 1e12);
    memset(c->memory_bandwidth, 0, sizeof c->memory_bandwidth);
  }
done:
  st_free(j.a);
  st_free(j.b);
  st_free(j.c);
  return rc;
}

/* The large GEMM's best one-thread rate and best rate on t threads (one
 * pool, or with `streams` t independent one-thread streams) over ROUNDS
 * rounds, each timing one thread and then t back to back: a burst of other
 * load on the host (a shared VM's neighbours) that hits one window is
 * outvoted. Measured once each, one burst made e(2) 0.57 against 0.8-0.96
 * in every other run. 0, or ST_ENOMEM when memory or threads ran out. */
static int paired_rates(int t, int streams, double *one, double *many) {
  *one = *many = 0;
  for (int r = 0; r < ROUNDS; r++) {
    double a, b = streams ? streams_rate(t) : 0;
    if ((streams ? b <= 0 : gemm_rate(ST_GEMM_CLASSES - 1, t, &b)) ||
        gemm_rate(ST_GEMM_CLASSES - 1, 1, &a))
      return ST_ENOMEM;
    *one = a > *one ? a : *one;
    *many = b > *many ? b : *many;
  }
  return 0;
}

/* The pass's state, on its threads (st_calibration.round_trip). */
static double round_trip(int threads, FILE *progress, const char *when) {
  double t = threads > 1 ? st_calibration_round_trip(threads) : 0;
  if (progress && threads > 1)
    fprintf(progress, "  round trip on %d threads %.3f us as the pass %s\n",
            threads, t * 1e6, when);
  return t > 0 ? t : 0;
}

int st_calibration_measure(st_calibration *c, int max_threads, FILE *progress,
                           st_error *err) {
  memset(c, 0, sizeof *c);
  if (max_threads < 1) max_threads = 1;
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(c->date, sizeof c->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  c->cores = max_threads;
  c->round_trip[0] = round_trip(max_threads, progress, "began");
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    memcpy(c->gemm_shape[k], gemm_shapes[k], sizeof gemm_shapes[k]);
    if (gemm_rate(k, 1, &c->gemm_rate[k]))
      return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
    if (progress)
      fprintf(progress, "  gemm %-6s %4dx%4dx%4d %8.2f GFLOP/s (one thread)\n",
              st_gemm_class_name(k), gemm_shapes[k][0], gemm_shapes[k][1],
              gemm_shapes[k][2], c->gemm_rate[k] / 1e9);
  }
  double num = 0, den = 0;
  for (int t = 1; t <= max_threads && c->n_threads < ST_CALIBRATION_MAX_THREADS;
       t *= 2) {
    int i = c->n_threads++;
    c->threads[i] = t;
    if (t == 1) {
      if (gemm_rate(ST_GEMM_CLASSES - 1, 1, &c->gemm_rate_threads[0]))
        return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
      c->efficiency[0] = 1;
    } else {
      double one, many;
      if (paired_rates(t, 0, &one, &many))
        return st_error_set(err, ST_ENOMEM, "calibration: out of memory");
      c->gemm_rate_threads[i] = many;
      c->efficiency[i] = many / (t * one);
      num += (t - 1) * (1 / c->efficiency[i] - 1);
      den += (double)(t - 1) * (t - 1);
    }
    if (progress)
      fprintf(progress, "  gemm large on %d thread%s %8.2f GFLOP/s, e = %.3f\n",
              t, t == 1 ? " " : "s", c->gemm_rate_threads[i] / 1e9,
              c->efficiency[i]);
  }
  /* one thread only: nothing to fit; the built-in 5% per core stands */
  double s = den > 0 ? num / den : 0.05;
  c->efficiency_slope = s < 0 ? 0 : s > 0.99 ? 0.99 : s;
  if (progress)
    fprintf(progress, "  e(c) = 1/(1 + %.4f (c - 1)), fitted\n",
            c->efficiency_slope);
  /* independent one-thread GEMMs on 1, 2, 4, ... cores at once */
  num = den = 0;
  for (int i = 0; i < c->n_threads; i++) {
    int t = c->threads[i];
    double one = 0, sum = 0;
    c->sharing[i] = 1;
    if (t > 1) {
      if (paired_rates(t, 1, &one, &sum))
        return st_error_set(err, ST_ENOMEM,
                            "calibration: cannot run %d GEMM threads", t);
      c->sharing[i] = sum / (t * one);
      num += (t - 1) * (1 / c->sharing[i] - 1);
      den += (double)(t - 1) * (t - 1);
    }
    if (progress && t > 1)
      fprintf(progress,
              "  gemm large, %d one-thread streams %8.2f GFLOP/s, m = %.3f\n",
              t, sum / 1e9, c->sharing[i]);
  }
  s = den > 0 ? num / den : 0;
  c->sharing_slope = s < 0 ? 0 : s > 0.99 ? 0.99 : s;
  if (progress)
    fprintf(progress, "  m(n) = 1/(1 + %.4f (n - 1)), fitted\n",
            c->sharing_slope);
  int rc = measure_narrow(c, progress, err);
  if (!rc) rc = measure_row(c, progress, err);
  if (!rc &&
      (measure_choices(c, progress) || measure_bf16_classes(c, progress)))
    rc = st_error_set(err, ST_ENOMEM, "calibration: out of memory");
  if (!rc) rc = measure_kernels(c, progress, err);
  if (!rc) rc = measure_ops(c, progress, err);
  if (!rc) rc = measure_memory(c, progress, err);
  if (!rc) c->round_trip[1] = round_trip(max_threads, progress, "ended");
  return rc;
}

/* ------------------------------------------------------------- merge */

/* v within ST_CALIBRATION_FAR of ref, either way */
static int alike(double v, double ref) {
  return v <= ST_CALIBRATION_FAR * ref && ref <= ST_CALIBRATION_FAR * v;
}

int st_calibration_near(const st_calibration *p, int n, int *keep,
                        double *reference) {
  /* the reference: the round trip most others are alike to (ties: the
   * least), the state the passes spent most time in */
  double ref = 0;
  int most = -1;
  for (int i = 0; i < n; i++)
    for (int e = 0; e < 2; e++) {
      double v = p[i].round_trip[e];
      if (!(v > 0)) continue;
      int company = 0;
      for (int k = 0; k < n; k++)
        for (int f = 0; f < 2; f++)
          company += (k != i || f != e) && alike(p[k].round_trip[f], v);
      if (company > most || (company == most && v < ref))
        most = company, ref = v;
    }
  int kept = 0;
  for (int i = 0; i < n; i++) {
    keep[i] = ref == 0 || (alike(p[i].round_trip[0], ref) &&
                           alike(p[i].round_trip[1], ref));
    kept += keep[i];
  }
  if (reference) *reference = ref;
  return kept;
}

/* The middle of n values (the mean of the two middle ones for even n). */
static double median(double *v, int n) {
  for (int i = 1; i < n; i++) /* insertion sort: n is a few passes */
    for (int k = i; k > 0 && v[k] < v[k - 1]; k--) {
      double t = v[k];
      v[k] = v[k - 1], v[k - 1] = t;
    }
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The median over the passes of the double at byte offset `off`. */
static double median_at(const st_calibration *p, int n, size_t off) {
  double v[ST_CALIBRATION_MAX_PASSES];
  for (int i = 0; i < n; i++) memcpy(&v[i], (const char *)&p[i] + off, 8);
  return median(v, n);
}

/* s of 1/(1 + s (c - 1)) by least squares over the counts measured. */
static double fit_slope(const int *threads, const double *e, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; i++)
    if (threads[i] > 1 && e[i] > 0) {
      num += (threads[i] - 1) * (1 / e[i] - 1);
      den += (double)(threads[i] - 1) * (threads[i] - 1);
    }
  double s = den > 0 ? num / den : 0;
  return s < 0 ? 0 : s > 0.99 ? 0.99 : s;
}

int st_calibration_merge(st_calibration *out, const st_calibration *p, int n) {
  if (n < 1 || n > ST_CALIBRATION_MAX_PASSES) return ST_EARG;
  for (int i = 1; i < n; i++)
    if (p[i].n_threads != p[0].n_threads || p[i].cores != p[0].cores)
      return ST_EARG;
  /* The memory terms of narrow steps go together (the spill curve is a
   * share of spill_cost): the pass whose spill_cost is the median, the
   * lower middle one for an even count. */
  int mid = 0;
  for (int i = 0; i < n; i++) {
    int below = 0, same_before = 0;
    for (int k = 0; k < n; k++) {
      below += p[k].spill_cost < p[i].spill_cost;
      same_before += k < i && p[k].spill_cost == p[i].spill_cost;
    }
    if (below + same_before == (n - 1) / 2) mid = i;
  }
  *out = p[mid];
  memcpy(out->date, p[0].date, sizeof out->date);
  /* every other figure its own median */
#define MED(field) out->field = median_at(p, n, offsetof(st_calibration, field))
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    MED(gemm_rate[k]);
    MED(conv_rate[0][k]);
    MED(conv_rate[1][k]);
    MED(attention_rate[0][k]);
    MED(attention_rate[1][k]);
  }
  for (int i = 0; i < out->n_threads; i++) {
    MED(gemm_rate_threads[i]);
    MED(efficiency[i]);
    MED(sharing[i]);
  }
  /* all passes, or none: a median of a measured figure and a 0 (none)
   * would be half a measurement */
  int memory = 1;
  for (int k = 0; k < n; k++) memory &= p[k].memory_bandwidth[0] > 0;
  for (int i = 0; i < out->n_threads; i++)
    if (memory)
      MED(memory_bandwidth[i]);
    else
      out->memory_bandwidth[i] = 0;
  for (int k = 0; k < ST_OP_CLASSES; k++) MED(op_bandwidth[k]);
  MED(copy_bandwidth);
  MED(input_bandwidth);
  MED(step_latency);
  MED(hosted_latency);
  MED(narrow_l2_rate);
  MED(row_bandwidth);
  /* the one-row curves point by point where every pass has the same
   * points (else the median spill pass's stand), then again not rising */
  int same = 1, same_rank_one = 1;
  for (int i = 1; i < n; i++) {
    same &= p[i].n_row_step == p[0].n_row_step;
    for (int k = 0; same && k < p[0].n_row_step; k++)
      same &= p[i].row_step_ws[k] == p[0].row_step_ws[k];
    same_rank_one &= p[i].n_rank_one == p[0].n_rank_one;
    for (int k = 0; same_rank_one && k < p[0].n_rank_one; k++)
      same_rank_one &= p[i].rank_one_ws[k] == p[0].rank_one_ws[k];
  }
  MED(row_step_efficiency);
  MED(row_step_efficiency_small);
  for (int k = 0; same && k < out->n_row_step; k++) MED(row_step_rate[k]);
  not_rising(out->row_step_rate, out->n_row_step);
  for (int k = 0; same_rank_one && k < out->n_rank_one; k++)
    MED(rank_one_rate[k]);
  not_rising(out->rank_one_rate, out->n_rank_one);
  for (int k = 0; k < ST_GEMM_CHOICES; k++) {
    MED(gemm_choice_rate[0][k]);
    MED(gemm_choice_rate[1][k]);
  }
  MED(gemm_bf16_rate[0]);
  MED(gemm_bf16_rate[1]);
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    MED(gemm_bf16_class_rate[k]);
    MED(gemm_bf16_class_rate_all[k]);
  }
#undef MED
  if (out->n_threads > 1) { /* a one-thread profile keeps its built-in 5% */
    out->efficiency_slope =
        fit_slope(out->threads, out->efficiency, out->n_threads);
    out->sharing_slope = fit_slope(out->threads, out->sharing, out->n_threads);
  }
  return 0;
}

/* ------------------------------------------------------------- write */

/* v in the fewest significant digits (6 at least) that read back as v:
 * at a fixed 6, the L2's 1048576 bytes came back 1048580. */
static int json_number(char *out, size_t cap, double v) {
  int n = 0;
  for (int digits = 6; digits <= 17; digits++) {
    n = snprintf(out, cap, "%.*g", digits, v);
    if (strtod(out, NULL) == v) break;
  }
  return n;
}

static void json_array(char *buf, size_t cap, size_t *at, const char *key,
                       const double *v, int n, int last) {
  *at += (size_t)snprintf(buf + *at, cap - *at, "  \"%s\": [", key);
  for (int i = 0; i < n && *at < cap; i++) {
    char num[32];
    json_number(num, sizeof num, v[i]);
    *at += (size_t)snprintf(buf + *at, cap - *at, "%s%s", i ? ", " : "", num);
  }
  if (*at < cap)
    *at += (size_t)snprintf(buf + *at, cap - *at, "]%s\n", last ? "" : ",");
}

/* "key": [[a, b, c, d], ...], one shape per GEMM class */
static void json_shapes(char *buf, size_t cap, size_t *at, const char *key,
                        const int (*shape)[4]) {
  *at += (size_t)snprintf(buf + *at, cap - *at, "  \"%s\": [", key);
  for (int k = 0; k < ST_GEMM_CLASSES && *at < cap; k++)
    *at += (size_t)snprintf(buf + *at, cap - *at, "%s[%d, %d, %d, %d]",
                            k ? ", " : "", shape[k][0], shape[k][1],
                            shape[k][2], shape[k][3]);
  if (*at < cap) *at += (size_t)snprintf(buf + *at, cap - *at, "],\n");
}

int st_calibration_write(const st_calibration *c, const char *path,
                         st_error *err) {
  char buf[8192]; /* a profile of 8 thread counts is about 3 KB */
  size_t cap = sizeof buf, at = 0;
  at += (size_t)snprintf(
      buf + at, cap - at,
      "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"date\": \"%s\",\n"
      "  \"cores\": %d,\n  \"blas\": \"%s\",\n  \"gemm_classes\": [",
      FORMAT_NAME, ST_CALIBRATION_VERSION, c->date, c->cores, st_blas_name());
  for (int k = 0; k < ST_GEMM_CLASSES; k++)
    at += (size_t)snprintf(buf + at, cap - at, "%s\"%s\"", k ? ", " : "",
                           st_gemm_class_name(k));
  at += (size_t)snprintf(buf + at, cap - at, "],\n  \"gemm_shapes\": [");
  for (int k = 0; k < ST_GEMM_CLASSES; k++)
    at += (size_t)snprintf(buf + at, cap - at, "%s[%d, %d, %d]", k ? ", " : "",
                           c->gemm_shape[k][0], c->gemm_shape[k][1],
                           c->gemm_shape[k][2]);
  at += (size_t)snprintf(buf + at, cap - at, "],\n");
  json_array(buf, cap, &at, "gemm_rate", c->gemm_rate, ST_GEMM_CLASSES, 0);
  double threads[ST_CALIBRATION_MAX_THREADS];
  for (int i = 0; i < c->n_threads; i++) threads[i] = c->threads[i];
  json_array(buf, cap, &at, "threads", threads, c->n_threads, 0);
  json_array(buf, cap, &at, "gemm_rate_threads", c->gemm_rate_threads,
             c->n_threads, 0);
  json_array(buf, cap, &at, "efficiency", c->efficiency, c->n_threads, 0);
  json_array(buf, cap, &at, "efficiency_slope", &c->efficiency_slope, 1, 0);
  json_array(buf, cap, &at, "sharing", c->sharing, c->n_threads, 0);
  json_array(buf, cap, &at, "sharing_slope", &c->sharing_slope, 1, 0);
  at += (size_t)snprintf(buf + at, cap - at, "  \"op_classes\": [");
  for (int k = 0; k < ST_OP_CLASSES; k++)
    at += (size_t)snprintf(buf + at, cap - at, "%s\"%s\"", k ? ", " : "",
                           st_op_class_name(k));
  at += (size_t)snprintf(buf + at, cap - at, "],\n");
  json_array(buf, cap, &at, "op_bandwidth", c->op_bandwidth, ST_OP_CLASSES, 0);
  json_shapes(buf, cap, &at, "conv_shapes", c->conv_shape);
  json_array(buf, cap, &at, "conv_rate_fwd", c->conv_rate[0], ST_GEMM_CLASSES,
             0);
  json_array(buf, cap, &at, "conv_rate_bwd", c->conv_rate[1], ST_GEMM_CLASSES,
             0);
  json_shapes(buf, cap, &at, "attention_shapes", c->attention_shape);
  json_array(buf, cap, &at, "attention_rate_fwd", c->attention_rate[0],
             ST_GEMM_CLASSES, 0);
  json_array(buf, cap, &at, "attention_rate_bwd", c->attention_rate[1],
             ST_GEMM_CLASSES, 0);
  json_array(buf, cap, &at, "copy_bandwidth", &c->copy_bandwidth, 1, 0);
  json_array(buf, cap, &at, "input_bandwidth", &c->input_bandwidth, 1, 0);
  if (c->memory_bandwidth[0] > 0) /* measured (a profile may lack it) */
    json_array(buf, cap, &at, "memory_bandwidth", c->memory_bandwidth,
               c->n_threads, 0);
  int measured = 0; /* (a profile may lack them) */
  for (int k = 0; k < ST_GEMM_CHOICES; k++)
    measured |= c->gemm_choice_rate[0][k] > 0 || c->gemm_choice_rate[1][k] > 0;
  if (measured) {
    json_array(buf, cap, &at, "gemm_choice_packed", c->gemm_choice_rate[0],
               ST_GEMM_CHOICES, 0);
    json_array(buf, cap, &at, "gemm_choice_blas", c->gemm_choice_rate[1],
               ST_GEMM_CHOICES, 0);
  }
  if (c->gemm_bf16_rate[0] > 0 || c->gemm_bf16_rate[1] > 0) /* likewise */
    json_array(buf, cap, &at, "gemm_bf16", c->gemm_bf16_rate, 2, 0);
  if (c->gemm_bf16_class_rate[ST_GEMM_CLASSES - 1] > 0) /* likewise */
    json_array(buf, cap, &at, "gemm_bf16_classes", c->gemm_bf16_class_rate,
               ST_GEMM_CLASSES, 0);
  if (c->gemm_bf16_class_rate_all[ST_GEMM_CLASSES - 1] > 0) /* likewise */
    json_array(buf, cap, &at, "gemm_bf16_classes_all",
               c->gemm_bf16_class_rate_all, ST_GEMM_CLASSES, 0);
  int narrow = c->narrow_rows > 0; /* measured (a profile read may lack it) */
  int row = c->row_bandwidth > 0;  /* likewise */
  if (c->hosted_latency > 0)       /* likewise */
    json_array(buf, cap, &at, "hosted_latency", &c->hosted_latency, 1, 0);
  if (c->n_rank_one >= 2) { /* likewise */
    json_array(buf, cap, &at, "rank_one_ws", c->rank_one_ws, c->n_rank_one, 0);
    json_array(buf, cap, &at, "rank_one_rate", c->rank_one_rate, c->n_rank_one,
               0);
  }
  json_array(buf, cap, &at, "step_latency", &c->step_latency, 1,
             !narrow && !row && c->n_row_step < 2);
  if (row)
    json_array(buf, cap, &at, "row_bandwidth", &c->row_bandwidth, 1,
               !narrow && c->n_row_step < 2);
  if (c->n_row_step >= 2) {
    json_array(buf, cap, &at, "row_step_ws", c->row_step_ws, c->n_row_step, 0);
    json_array(buf, cap, &at, "row_step_rate", c->row_step_rate, c->n_row_step,
               0);
    json_array(buf, cap, &at, "row_step_efficiency", &c->row_step_efficiency, 1,
               !narrow && !(c->row_step_efficiency_small > 0));
    if (c->row_step_efficiency_small > 0)
      json_array(buf, cap, &at, "row_step_efficiency_small",
                 &c->row_step_efficiency_small, 1, !narrow);
  }
  if (narrow) {
    double rows = c->narrow_rows;
    json_array(buf, cap, &at, "narrow_rows", &rows, 1, 0);
    json_array(buf, cap, &at, "narrow_rate", &c->narrow_rate, 1, 0);
    if (c->narrow_l2_rate > 0)
      json_array(buf, cap, &at, "narrow_l2_rate", &c->narrow_l2_rate, 1, 0);
    json_array(buf, cap, &at, "l2_bytes", &c->l2_bytes, 1, 0);
    json_array(buf, cap, &at, "spill_cost", &c->spill_cost, 1, c->n_spill < 2);
    if (c->n_spill >= 2) {
      json_array(buf, cap, &at, "spill_ws", c->spill_ws, c->n_spill, 0);
      json_array(buf, cap, &at, "spill_fraction", c->spill_fraction, c->n_spill,
                 1);
    }
  }
  if (at + 3 > cap)
    return st_error_set(err, ST_EIO, "%s: calibration profile too long", path);
  at += (size_t)snprintf(buf + at, cap - at, "}\n");
  return st_write_file_atomic(path, buf, at, err);
}

/* -------------------------------------------------------------- read */

/* The text after `"key":` (spaces skipped), or NULL. Keys are unique and
 * never appear inside string values in this format. */
static const char *value_of(const char *text, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  const char *p = strstr(text, pat);
  if (!p) return NULL;
  p += strlen(pat);
  while (isspace((unsigned char)*p)) p++;
  if (*p != ':') return NULL;
  p++;
  while (isspace((unsigned char)*p)) p++;
  return p;
}

/* Numbers of a (possibly nested) array, flattened; returns the count, or
 * -1 if malformed. */
static int numbers_of(const char *p, double *out, int cap) {
  if (!p || *p != '[') return -1;
  int depth = 0, n = 0;
  for (;;) {
    if (*p == '[') {
      depth++;
      p++;
    } else if (*p == ']') {
      p++;
      if (--depth == 0) return n;
    } else if (*p == ',' || isspace((unsigned char)*p)) {
      p++;
    } else {
      char *end;
      errno = 0;
      double v = strtod(p, &end);
      if (end == p || errno || n == cap) return -1;
      out[n++] = v;
      p = end;
    }
  }
}

static int bad(st_error *err, const char *path, const char *what) {
  return st_error_set(err, ST_EFORMAT,
                      "%s: calibration profile: %s; re-run `strata bench "
                      "--calibrate` (or set STRATA_CALIBRATION=none)",
                      path, what);
}

/* Reads array `key` of exactly n positive finite numbers. */
/* An optional key of exactly n rates, each finite and at least 0 (0: not
 * measured); all 0 where the profile lacks it. */
static int rates_of(const char *text, const char *path, const char *key,
                    double *out, int n, st_error *err) {
  for (int k = 0; k < n; k++) out[k] = 0;
  const char *at = value_of(text, key);
  if (!at) return 0;
  double v[64];
  char what[128];
  if (numbers_of(at, v, 64) != n) {
    snprintf(what, sizeof what, "\"%s\": expected %d numbers", key, n);
    return bad(err, path, what);
  }
  for (int k = 0; k < n; k++) {
    if (!(v[k] >= 0) || !isfinite(v[k])) {
      snprintf(what, sizeof what, "\"%s\": %g is not a rate", key, v[k]);
      return bad(err, path, what);
    }
    out[k] = v[k];
  }
  return 0;
}

static int positive_array(const char *text, const char *path, const char *key,
                          double *out, int n, st_error *err) {
  double v[64];
  int got = numbers_of(value_of(text, key), v, 64);
  char what[128];
  if (got != n) {
    snprintf(what, sizeof what, "\"%s\": expected %d number%s", key, n,
             n == 1 ? "" : "s");
    return bad(err, path, what);
  }
  for (int i = 0; i < n; i++) {
    if (!(v[i] > 0) || !isfinite(v[i])) {
      snprintf(what, sizeof what, "\"%s\": %g is not a positive number", key,
               v[i]);
      return bad(err, path, what);
    }
    out[i] = v[i];
  }
  return 0;
}

/* Whether v[0 .. n) are whole numbers from 1 to INT_MAX (counts and
 * sizes, which the profile keeps as int). */
static int whole(const double *v, int n) {
  for (int i = 0; i < n; i++)
    if (!(v[i] >= 1 && v[i] <= INT_MAX && v[i] == floor(v[i]))) return 0;
  return 1;
}

/* The whole number >= 1 at `at` ("key": N), alone up to the next ',' or
 * '}', into *out; 0 if it is anything else. */
static int count_at(const char *at, long *out) {
  char *end;
  errno = 0;
  long v = at ? strtol(at, &end, 10) : 0;
  if (!at || end == at || errno || v < 1 || v > INT_MAX) return 0;
  while (isspace((unsigned char)*end)) end++;
  if (*end != ',' && *end != '}') return 0;
  *out = v;
  return 1;
}

/* Reads an optional curve, "<name>_ws" and "<name>_rate": 2 to
 * ST_ROW_POINTS points, the bytes rising and the rates not; *n = 0 when
 * the profile has neither key. */
static int read_curve(const char *text, const char *path, const char *name,
                      double *ws, double *rate, int *n, st_error *err) {
  char wk[64], rk[64], what[256];
  snprintf(wk, sizeof wk, "%s_ws", name);
  snprintf(rk, sizeof rk, "%s_rate", name);
  *n = 0;
  if (!value_of(text, wk) && !value_of(text, rk)) return 0;
  double w[ST_ROW_POINTS + 1], v[ST_ROW_POINTS + 1];
  int nw = numbers_of(value_of(text, wk), w, ST_ROW_POINTS + 1);
  int nr = numbers_of(value_of(text, rk), v, ST_ROW_POINTS + 1);
  int ok = nw >= 2 && nw <= ST_ROW_POINTS && nr == nw;
  for (int k = 0; ok && k < nw; k++)
    ok &= w[k] > (k ? w[k - 1] : 0) && isfinite(w[k]) && v[k] > 0 &&
          isfinite(v[k]) && (k == 0 || v[k] <= v[k - 1]);
  if (!ok) {
    snprintf(what, sizeof what,
             "\"%s\" and \"%s\": expected 2 to %d positive numbers each, "
             "as many of one as the other, the bytes rising and the rates not",
             wk, rk, ST_ROW_POINTS);
    return bad(err, path, what);
  }
  memcpy(ws, w, (size_t)nw * sizeof *w);
  memcpy(rate, v, (size_t)nw * sizeof *v);
  *n = nw;
  return 0;
}

static int parse(st_calibration *c, const char *text, const char *path,
                 st_error *err) {
  const char *fmt = value_of(text, "format");
  size_t flen = strlen(FORMAT_NAME);
  if (!fmt || fmt[0] != '"' || strncmp(fmt + 1, FORMAT_NAME, flen) != 0 ||
      fmt[flen + 1] != '"')
    return bad(err, path,
               "not a strata calibration profile (no \"format\": "
               "\"" FORMAT_NAME "\")");
  const char *ver = value_of(text, "version");
  long version;
  if (!ver) return bad(err, path, "no \"version\"");
  if (!count_at(ver, &version))
    return bad(err, path, "\"version\": expected a whole number");
  if (version != ST_CALIBRATION_VERSION) {
    char what[128];
    snprintf(what, sizeof what, "version %ld, this strata reads version %d",
             version, ST_CALIBRATION_VERSION);
    return bad(err, path, what);
  }
  const char *date = value_of(text, "date");
  if (!date || *date != '"') return bad(err, path, "no \"date\"");
  size_t dlen = strcspn(date + 1, "\"");
  if (dlen == 0 || dlen >= sizeof c->date || date[1 + dlen] != '"')
    return bad(err, path, "\"date\": malformed");
  memcpy(c->date, date + 1, dlen);
  c->date[dlen] = '\0';
  double one[1], shapes[3 * ST_GEMM_CLASSES], th[ST_CALIBRATION_MAX_THREADS];
  int rc;
  if ((rc = positive_array(text, path, "gemm_rate", c->gemm_rate,
                           ST_GEMM_CLASSES, err)) ||
      (rc = positive_array(text, path, "copy_bandwidth", &c->copy_bandwidth, 1,
                           err)) ||
      (rc = positive_array(text, path, "gemm_shapes", shapes,
                           3 * ST_GEMM_CLASSES, err)))
    return rc;
  if (!whole(shapes, 3 * ST_GEMM_CLASSES))
    return bad(err, path, "\"gemm_shapes\": expected whole numbers");
  for (int k = 0; k < 3 * ST_GEMM_CLASSES; k++)
    c->gemm_shape[k / 3][k % 3] = (int)shapes[k];
  /* a profile before gelu had its own class lists one fewer: gelu is then
   * timed as pointwise */
  double ops[ST_OP_CLASSES];
  int n_ops = numbers_of(value_of(text, "op_bandwidth"), ops, ST_OP_CLASSES);
  if ((rc = positive_array(text, path, "op_bandwidth", c->op_bandwidth,
                           n_ops == ST_OP_CLASSES - 1 ? n_ops : ST_OP_CLASSES,
                           err)))
    return rc;
  if (n_ops == ST_OP_CLASSES - 1)
    c->op_bandwidth[ST_OP_CLASSES - 1] = c->op_bandwidth[0];
  /* optional (profiles before them): conv2d and attention as GEMMs */
  if (value_of(text, "conv_rate_fwd")) {
    double sh[4 * ST_GEMM_CLASSES];
    if ((rc = positive_array(text, path, "conv_shapes", sh, 4 * ST_GEMM_CLASSES,
                             err)) ||
        (rc = positive_array(text, path, "conv_rate_fwd", c->conv_rate[0],
                             ST_GEMM_CLASSES, err)) ||
        (rc = positive_array(text, path, "conv_rate_bwd", c->conv_rate[1],
                             ST_GEMM_CLASSES, err)))
      return rc;
    if (!whole(sh, 4 * ST_GEMM_CLASSES))
      return bad(err, path, "\"conv_shapes\": expected whole numbers");
    for (int k = 0; k < 4 * ST_GEMM_CLASSES; k++)
      c->conv_shape[k / 4][k % 4] = (int)sh[k];
    if ((rc = positive_array(text, path, "attention_shapes", sh,
                             4 * ST_GEMM_CLASSES, err)) ||
        (rc = positive_array(text, path, "attention_rate_fwd",
                             c->attention_rate[0], ST_GEMM_CLASSES, err)) ||
        (rc = positive_array(text, path, "attention_rate_bwd",
                             c->attention_rate[1], ST_GEMM_CLASSES, err)))
      return rc;
    if (!whole(sh, 4 * ST_GEMM_CLASSES))
      return bad(err, path, "\"attention_shapes\": expected whole numbers");
    for (int k = 0; k < 4 * ST_GEMM_CLASSES; k++)
      c->attention_shape[k / 4][k % 4] = (int)sh[k];
  }
  int n = numbers_of(value_of(text, "threads"), th, ST_CALIBRATION_MAX_THREADS);
  int rising = n >= 1 && whole(th, n);
  for (int i = 1; rising && i < n; i++) rising = th[i] > th[i - 1];
  if (!rising)
    return bad(err, path, "\"threads\": expected 1 to 8 thread counts, rising");
  c->n_threads = n;
  for (int i = 0; i < n; i++) c->threads[i] = (int)th[i];
  if ((rc = positive_array(text, path, "gemm_rate_threads",
                           c->gemm_rate_threads, n, err)) ||
      (rc = positive_array(text, path, "efficiency", c->efficiency, n, err)))
    return rc;
  int ns = numbers_of(value_of(text, "efficiency_slope"), one, 1);
  if (ns != 1 || !(one[0] >= 0 && one[0] < 1))
    return bad(err, path,
               "\"efficiency_slope\": expected one number in [0, 1)");
  c->efficiency_slope = one[0];
  /* optional (profiles before it): independent cores */
  for (int i = 0; i < n; i++) c->sharing[i] = 1;
  c->sharing_slope = 0;
  if (value_of(text, "sharing_slope")) {
    if ((rc = positive_array(text, path, "sharing", c->sharing, n, err)))
      return rc;
    ns = numbers_of(value_of(text, "sharing_slope"), one, 1);
    if (ns != 1 || !(one[0] >= 0 && one[0] < 1))
      return bad(err, path, "\"sharing_slope\": expected one number in [0, 1)");
    c->sharing_slope = one[0];
  }
  /* optional (profiles before it): the built-in memory bandwidth; a
   * figure no memory has is refused, not used */
  memset(c->memory_bandwidth, 0, sizeof c->memory_bandwidth);
  if (value_of(text, "memory_bandwidth")) {
    double v[64];
    char what[160];
    if (numbers_of(value_of(text, "memory_bandwidth"), v, 64) != n) {
      snprintf(what, sizeof what,
               "\"memory_bandwidth\": expected %d number%s, one for each "
               "of \"threads\"",
               n, n == 1 ? "" : "s");
      return bad(err, path, what);
    }
    for (int i = 0; i < n; i++) {
      if (!st_memory_bandwidth_plausible(v[i])) {
        snprintf(what, sizeof what,
                 "\"memory_bandwidth\": %g bytes/s is no memory's "
                 "bandwidth (expected %g to %g)",
                 v[i], ST_MEMORY_BANDWIDTH_MIN, ST_MEMORY_BANDWIDTH_MAX);
        return bad(err, path, what);
      }
      c->memory_bandwidth[i] = v[i];
    }
  }
  /* optional (profiles before them): the caller's time not modelled */
  c->input_bandwidth = c->step_latency = 0;
  if (value_of(text, "input_bandwidth") &&
      (rc = positive_array(text, path, "input_bandwidth", &c->input_bandwidth,
                           1, err)))
    return rc;
  if (value_of(text, "step_latency") &&
      (rc = positive_array(text, path, "step_latency", &c->step_latency, 1,
                           err)))
    return rc;
  /* optional (profiles before it): the hosted hand-off */
  c->hosted_latency = 0;
  if (value_of(text, "hosted_latency") &&
      (rc = positive_array(text, path, "hosted_latency", &c->hosted_latency, 1,
                           err)))
    return rc;
  /* optional (profiles before them): the built-in kernel rule; 0 where the
   * packed kernel could not be measured */
  if ((rc = rates_of(text, path, "gemm_choice_packed", c->gemm_choice_rate[0],
                     ST_GEMM_CHOICES, err)) ||
      (rc = rates_of(text, path, "gemm_choice_blas", c->gemm_choice_rate[1],
                     ST_GEMM_CHOICES, err)) ||
      /* optional (profiles before them): bf16's kernels */
      (rc = rates_of(text, path, "gemm_bf16", c->gemm_bf16_rate, 2, err)) ||
      (rc = rates_of(text, path, "gemm_bf16_classes", c->gemm_bf16_class_rate,
                     ST_GEMM_CLASSES, err)) ||
      (rc = rates_of(text, path, "gemm_bf16_classes_all",
                     c->gemm_bf16_class_rate_all, ST_GEMM_CLASSES, err)))
    return rc;
  c->row_bandwidth = 0; /* optional (profiles before it): GEMM rates */
  if (value_of(text, "row_bandwidth") &&
      (rc = positive_array(text, path, "row_bandwidth", &c->row_bandwidth, 1,
                           err)))
    return rc;
  /* optional (profiles before them): row_bandwidth prices one row */
  if ((rc = read_curve(text, path, "rank_one", c->rank_one_ws, c->rank_one_rate,
                       &c->n_rank_one, err)) ||
      (rc = read_curve(text, path, "row_step", c->row_step_ws, c->row_step_rate,
                       &c->n_row_step, err)))
    return rc;
  if (c->n_row_step) {
    if ((rc = positive_array(text, path, "row_step_efficiency",
                             &c->row_step_efficiency, 1, err)))
      return rc;
    c->row_step_efficiency_small = 0; /* optional: profiles before it */
    if (value_of(text, "row_step_efficiency_small") &&
        (rc = positive_array(text, path, "row_step_efficiency_small",
                             &c->row_step_efficiency_small, 1, err)))
      return rc;
  }
  /* optional (profiles before them): linear GEMMs' memory not modelled */
  c->narrow_rows = c->n_spill = 0;
  c->narrow_rate = c->l2_bytes = c->spill_cost = c->narrow_l2_rate = 0;
  if (value_of(text, "narrow_rows")) {
    double v[ST_SPILL_POINTS];
    if (numbers_of(value_of(text, "narrow_rows"), v, 1) != 1 ||
        !(v[0] >= 2 && v[0] < ST_GEMM_REF_ROWS) || v[0] != floor(v[0]))
      return bad(err, path,
                 "\"narrow_rows\": expected a whole number in "
                 "[2, 64)");
    c->narrow_rows = (int)v[0];
    if ((rc = positive_array(text, path, "narrow_rate", &c->narrow_rate, 1,
                             err)))
      return rc;
    /* optional (profiles before it): no compute term */
    if (value_of(text, "narrow_l2_rate") &&
        (rc = positive_array(text, path, "narrow_l2_rate", &c->narrow_l2_rate,
                             1, err)))
      return rc;
    if (numbers_of(value_of(text, "l2_bytes"), &c->l2_bytes, 1) != 1 ||
        !(c->l2_bytes >= 0) || !isfinite(c->l2_bytes))
      return bad(err, path,
                 "\"l2_bytes\": expected one number >= 0 (0: "
                 "unknown)");
    if (numbers_of(value_of(text, "spill_cost"), &c->spill_cost, 1) != 1 ||
        !(c->spill_cost >= 0) || !isfinite(c->spill_cost))
      return bad(err, path, "\"spill_cost\": expected one number >= 0");
    /* no curve when the cold step measured no slower */
    int nw =
        numbers_of(value_of(text, "spill_ws"), c->spill_ws, ST_SPILL_POINTS);
    int nf = numbers_of(value_of(text, "spill_fraction"), v, ST_SPILL_POINTS);
    if (value_of(text, "spill_ws") || value_of(text, "spill_fraction")) {
      if (nw < 2 || nf != nw)
        return bad(err, path,
                   "\"spill_ws\" and \"spill_fraction\": "
                   "expected 2 to 10 numbers each, as many of one "
                   "as the other");
      int ok = v[0] == 0 && v[nw - 1] == 1;
      for (int k = 0; k < nw; k++)
        ok &= c->spill_ws[k] > (k ? c->spill_ws[k - 1] : 0) &&
              isfinite(c->spill_ws[k]) && v[k] >= (k ? v[k - 1] : 0) &&
              v[k] <= 1;
      if (!ok)
        return bad(err, path,
                   "\"spill_ws\" must rise, and "
                   "\"spill_fraction\" rise from 0 to 1");
      memcpy(c->spill_fraction, v, (size_t)nw * sizeof *v);
      c->n_spill = nw;
    }
  }
  long cores;
  if (!count_at(value_of(text, "cores"), &cores))
    return bad(err, path, "\"cores\": expected a count >= 1");
  c->cores = (int)cores;
  /* the object closed: a profile cut at a line's end has every figure
   * before the cut whole, and the optional ones after it missing, so it
   * would read as an older profile without them */
  size_t len = strlen(text);
  while (len > 0 && isspace((unsigned char)text[len - 1])) len--;
  if (len == 0 || text[len - 1] != '}')
    return bad(err, path, "truncated (it does not end with '}')");
  return 0;
}

int st_calibration_read(st_calibration *c, const char *path, st_error *err) {
  memset(c, 0, sizeof *c);
  FILE *f = fopen(path, "rb");
  if (!f)
    return st_error_set(err, ST_EIO, "%s: cannot open calibration profile: %s",
                        path, strerror(errno));
  /* a folder opens, and reads as nothing (EISDIR): said as what it is,
   * not as a file without the format's name */
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && !S_ISREG(sb.st_mode)) {
    fclose(f);
    return bad(err, path,
               S_ISDIR(sb.st_mode) ? "a folder, not a file" : "not a file");
  }
  char text[16384];
  size_t n = fread(text, 1, sizeof text - 1, f);
  int too_long = n == sizeof text - 1 && fgetc(f) != EOF;
  int failed = ferror(f), why = errno;
  fclose(f);
  text[n] = '\0';
  if (failed)
    return st_error_set(err, ST_EIO, "%s: cannot read calibration profile: %s",
                        path, strerror(why));
  if (too_long) return bad(err, path, "longer than 16 KB");
  if (strlen(text) != n) return bad(err, path, "binary data (NUL bytes)");
  return parse(c, text, path, err);
}

int st_calibration_path(char *buf, size_t cap) {
  const char *env = getenv("STRATA_CALIBRATION");
  if (env && *env) {
    snprintf(buf, cap, "%s", strcmp(env, "none") == 0 ? "" : env);
    return 0;
  }
  const char *home = getenv("HOME");
  snprintf(buf, cap, "%s/.cache/strata/calibration.json",
           home && *home ? home : ".");
  return 0;
}

void st_calibration_apply(const st_calibration *c, st_fabric *f,
                          const char *path) {
  f->calibrated = 1;
  f->estimated = 0;
  snprintf(f->calibrated_at, sizeof f->calibrated_at, "%s", c->date);
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    f->gemm_rate[k] = c->gemm_rate[k];
    f->gemm_rate_bf16[k] = c->gemm_bf16_class_rate[k];
    /* e(C) = all / (C one) on the profile's C cores, and the slope of
     * 1/(1 + slope (C - 1)) through it, as efficiency_slope's form */
    double one = c->gemm_bf16_class_rate[k],
           all = c->gemm_bf16_class_rate_all[k];
    f->gemm_slope_bf16[k] = -1;
    if (c->cores > 1 && one > 0 && all > 0) {
      double e = all / (c->cores * one);
      f->gemm_slope_bf16[k] = fit_slope(&c->cores, &e, 1);
    }
  }
  for (int k = 0; k < ST_OP_CLASSES; k++)
    f->op_bandwidth[k] = c->op_bandwidth[k];
  memcpy(f->conv_rate, c->conv_rate, sizeof f->conv_rate);
  memcpy(f->attention_rate, c->attention_rate, sizeof f->attention_rate);
  f->pe_flops = c->gemm_rate[ST_GEMM_CLASSES - 1];
  f->efficiency_slope = c->efficiency_slope;
  f->sharing_slope = c->sharing_slope;
  f->link_bandwidth = c->copy_bandwidth;
  /* the machine's memory bandwidth: the most the triad reached on any of
   * the thread counts (every core at once, as a plan's stages run; a
   * profile without it keeps the built-in figure) */
  double memory = 0;
  for (int i = 0; i < c->n_threads; i++)
    memory = fmax(memory, c->memory_bandwidth[i]);
  if (st_memory_bandwidth_plausible(memory)) {
    f->memory_bandwidth = memory;
    snprintf(f->memory_bandwidth_source, sizeof f->memory_bandwidth_source,
             "calibrated");
  }
  f->input_bandwidth = c->input_bandwidth;
  f->step_latency = c->step_latency;
  f->hosted_latency = c->hosted_latency;
  /* the narrow term: the large class's step at narrow_rows rows against
   * (narrow_rows / ref) of it at ref rows; the rest is its weights past L2
   * re-read once per call. Off when L2 is unknown, or the large shape's
   * rows are not the reference cost.c classes linear layers at. */
  const int *ls = c->gemm_shape[ST_GEMM_CLASSES - 1];
  const int *ms = c->gemm_shape[ST_GEMM_CLASSES - 2];
  double w = 4.0 * ls[1] * ls[2], ref = ST_GEMM_REF_ROWS, r = c->narrow_rows;
  f->narrow_cost = f->l2_bytes = f->narrow_flop_cost = 0;
  if (r >= 2 && r < ref) {
    /* the compute term first: the medium class's step at r rows from L2
     * against its rate at ref rows, seconds per FLOP at r rows */
    double e = 0;
    if (c->narrow_l2_rate > 0 && ms[0] == ST_GEMM_REF_ROWS &&
        c->gemm_rate[ST_GEMM_CLASSES - 2] > 0)
      e = fmax(1 / c->narrow_l2_rate - 1 / c->gemm_rate[ST_GEMM_CLASSES - 2],
               0);
    /* then the memory term: what the large class's step at r rows takes
     * past its scaled 64-row time and that compute term. Where the
     * compute term alone would exceed that excess, it is cut to it (no
     * memory term), so that the two never predict the large step slower
     * than it was measured. */
    if (c->narrow_rate > 0 && ls[0] == ST_GEMM_REF_ROWS) {
      double flops_r = 6.0 * r * ls[1] * ls[2];
      double t_ref =
          6.0 * ref * ls[1] * ls[2] / c->gemm_rate[ST_GEMM_CLASSES - 1];
      double excess = fmax(flops_r / c->narrow_rate - r / ref * t_ref, 0);
      e = fmin(e, excess / flops_r);
      if (c->l2_bytes > 0 && w > c->l2_bytes) {
        double x = (excess - flops_r * e) / (1 - r / ref);
        f->narrow_cost = x > 0 ? x / (w - c->l2_bytes) : 0;
        f->l2_bytes = c->l2_bytes;
      }
    }
    f->narrow_flop_cost = e / (1 - r / ref); /* the slope of (1 - r / ref) */
  }
  /* the spill curve stands on its own */
  f->spill_cost = c->n_spill >= 2 ? c->spill_cost : 0;
  f->n_spill = c->n_spill >= 2 ? c->n_spill : 0;
  memcpy(f->spill_ws, c->spill_ws, sizeof f->spill_ws);
  memcpy(f->spill_fraction, c->spill_fraction, sizeof f->spill_fraction);
  f->row_bandwidth = c->row_bandwidth;
  f->n_rank_one = c->n_rank_one >= 2 ? c->n_rank_one : 0;
  memcpy(f->rank_one_ws, c->rank_one_ws, sizeof f->rank_one_ws);
  memcpy(f->rank_one_rate, c->rank_one_rate, sizeof f->rank_one_rate);
  f->n_row_step = c->n_row_step >= 2 ? c->n_row_step : 0;
  memcpy(f->row_step_ws, c->row_step_ws, sizeof f->row_step_ws);
  memcpy(f->row_step_rate, c->row_step_rate, sizeof f->row_step_rate);
  /* the slope of e(c) = 1/(1 + s (c - 1)) through the one point measured,
   * as efficiency_slope's fit is kept to [0, 0.99] */
  int most = c->n_threads > 0 ? c->threads[c->n_threads - 1] : 1;
  f->row_slope =
      f->n_row_step ? fit_slope(&most, &c->row_step_efficiency, 1) : 0;
  f->row_slope_small = f->n_row_step && c->row_step_efficiency_small > 0
                           ? fit_slope(&most, &c->row_step_efficiency_small, 1)
                           : f->row_slope;
  size_t used = strlen(f->source);
  snprintf(f->source + used, sizeof f->source - used,
           "; calibrated %s from %.200s (GEMM, conv2d and attention by shape "
           "class, one-thread ops by bytes%s%s; measured on %d cores)",
           c->date, path,
           strcmp(f->memory_bandwidth_source, "calibrated")
               ? ""
               : ", memory bandwidth by a triad",
           f->narrow_cost > 0 || f->narrow_flop_cost > 0 || f->n_spill ||
                   f->row_bandwidth > 0 || f->n_row_step
               ? ", linear layers' memory terms"
               : "",
           c->cores);
}
