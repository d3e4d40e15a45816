/*
 * measure.c — block costs timed on this machine (execution.block_costs:
 * measured), for a cut that is balanced in fact and not only as the cost
 * model predicts it (the model is within about 5% on a stage, and a
 * pipeline runs at the pace of its slowest stage).
 *
 * Each block runs as training runs it: one thread, the plan's micro-batch
 * (st_plan_micro_batch), the forward of every block in order, then the
 * backward in reverse with the update folded in where the trainer folds it
 * (st_plan_fuses_update: linear layers at one sample), then each block's
 * remaining tensors updated by the configured rule. A block's forward time
 * is the span of its st_block_forward; its backward time the span of its
 * st_block_backward plus that of its update. The loss (a few hundred
 * floats) and the hand-off between stages are not a block's and stay out.
 *
 * Repeats: a few untimed runs warm caches and the pool, then timed runs
 * until MEASURE_S has passed (at least MIN_RUNS, at most MAX_RUNS); each
 * block's figure is the median of its runs, so a burst of load elsewhere
 * (a shared VM's neighbours) moves no block.
 */
#include "exec.h"

#include "../compile/compile.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { WARM_RUNS = 3, MIN_RUNS = 5, MAX_RUNS = 201 };
#define MEASURE_S 0.25

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0 .. n), n >= 1 (sorts v). */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The backward's per-block stamps: st_stage_backward_each calls back after
 * each block, in reverse order. */
typedef struct stamps {
  double last;
  double *bwd; /* [n_blocks] of this run */
} stamps;

static void stamp(void *arg, int block) {
  stamps *s = arg;
  double now = st_now();
  s->bwd[block] = now - s->last;
  s->last = now;
}

/* The tensors of block b the backward did not update (all of them when
 * nothing is fused), by the configured rule, as the executors do. */
static void update_block(const st_block *b, const st_ctx *ctx,
                         const st_config *cfg, float *params, float *grads,
                         float *opt, size_t n_params, int mb) {
  float lr = cfg->optimizer.lr;
  if (!ctx->fused) {
    st_optim_step_range(ctx->pool, cfg, params + b->param_off,
                        grads + b->param_off, opt + b->param_off, n_params,
                        b->n_params, lr, 1);
    return;
  }
  for (int l = 0; l < b->n_layers; l++) {
    const st_layer *L = &b->layers[l];
    if (L->w_tensor < 0 || st_layer_fuses_update(L, ctx, mb)) continue;
    const int tensors[2] = {L->w_tensor, L->b_tensor};
    for (int k = 0; k < 2; k++) {
      if (tensors[k] < 0) continue;
      size_t at = b->param_off + b->tensors[tensors[k]].offset;
      st_optim_step_range(ctx->pool, cfg, params + at, grads + at, opt + at,
                          n_params, b->tensors[tensors[k]].numel, lr, 1);
    }
  }
}

int st_plan_measure(st_block_cost *out, const st_model *m, const st_config *cfg,
                    st_error *err) {
  const int n = m->n_blocks, mb = st_plan_micro_batch(cfg);
  const size_t P = m->n_params;
  const int slots = st_optim_state_per_param(cfg);
  /* the model must fit beside everything else: a model only weight
   * streaming can train is refused, not swapped through */
  double need = (double)P * sizeof(float) * (2 + slots);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double ram = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
  if (ram > 0 && need > ram / 2)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: execution.block_costs: measured times the "
                        "blocks with the whole model in memory: %.3g GB of "
                        "weights, gradients and optimizer state, more than "
                        "half of this machine's %.3g GB; use model",
                        st_config_where(cfg, "execution.block_costs"),
                        need / 1e9, ram / 1e9);
  const size_t in_n = (size_t)mb * st_shape_numel(m->in);
  const size_t out_n = (size_t)mb * st_shape_numel(m->blocks[n - 1].out);
  float *params = st_alloc(P * sizeof(float));
  float *grads = st_alloc(P * sizeof(float));
  float *opt = st_alloc((slots > 0 ? (size_t)slots : 1) * P * sizeof(float));
  float *x = st_alloc(in_n * sizeof(float));
  float *dout = st_alloc(out_n * sizeof(float));
  double *fwd = malloc((size_t)MAX_RUNS * n * sizeof *fwd);
  double *bwd = malloc((size_t)MAX_RUNS * n * sizeof *bwd);
  double *col = malloc((size_t)MAX_RUNS * sizeof *col);
  st_pool *pool = st_pool_create(1);
  st_stage *s = NULL;
  int rc = 0;
  if (!params || !grads || !opt || !x || !dout || !fwd || !bwd || !col ||
      !pool) {
    rc = st_error_set(err, ST_ENOMEM,
                      "%s: execution.block_costs: measured: out of memory "
                      "for the model's %.3g GB of weights, gradients and "
                      "optimizer state to time its blocks",
                      st_config_where(cfg, "execution.block_costs"),
                      need / 1e9);
    goto done;
  }
  if ((rc = st_stage_create(&s, m, 0, n, mb, err))) goto done;
  st_model_init(m, params, cfg->train.seed);
  memset(grads, 0, P * sizeof(float));
  memset(opt, 0, (size_t)slots * P * sizeof(float));
  /* inputs: token ids below the vocabulary for a sequence model, else
   * values in [-1, 1); the output gradient a small pattern, as a loss's */
  st_rng rng;
  st_rng_init(&rng, cfg->train.seed, 0x6d656173u /* "meas" */, 0);
  for (size_t i = 0; i < in_n; i++)
    x[i] = m->label_rows > 1 ? (float)st_rng_below(&rng, (uint32_t)m->classes)
                             : 2 * st_rng_uniform(&rng) - 1;
  for (size_t i = 0; i < out_n; i++)
    dout[i] = (st_rng_uniform(&rng) - 0.5f) * 1e-2f;
  st_optim_rule rule;
  st_optim_rule_init(&rule, cfg, cfg->optimizer.lr, 1);
  st_fused_update fused = {&rule, params, opt, P, NULL, 0};
  st_ctx ctx = {pool, 1, cfg->train.seed, 0,
                st_plan_fuses_update(cfg) && mb == 1 ? &fused : NULL};
  double began = 0;
  int runs = 0;
  for (int r = 0; r < WARM_RUNS + MAX_RUNS; r++) {
    int timed = r >= WARM_RUNS;
    if (r == WARM_RUNS) began = st_now();
    double *f = fwd + (size_t)(timed ? runs : 0) * n;
    double *b = bwd + (size_t)(timed ? runs : 0) * n;
    const float *in = x;
    for (int i = 0; i < n; i++) {
      const st_block *blk = &m->blocks[i];
      double t0 = st_now();
      st_block_forward(blk, &ctx, params + blk->param_off, in, s->acts[i],
                       s->scratch, mb);
      f[i] = st_now() - t0;
      in = st_block_output(blk, s->acts[i], mb);
    }
    stamps st = {st_now(), b};
    st_stage_backward_each(s, &ctx, params, grads, x, dout, NULL, mb, stamp,
                           &st);
    for (int i = 0; i < n; i++) {
      double t0 = st_now();
      update_block(&m->blocks[i], &ctx, cfg, params, grads, opt, P, mb);
      b[i] += st_now() - t0;
    }
    ctx.first_sample += (uint64_t)mb;
    if (timed && ++runs >= MIN_RUNS && st_now() - began >= MEASURE_S) break;
  }
  for (int i = 0; i < n; i++) {
    for (int r = 0; r < runs; r++) col[r] = fwd[(size_t)r * n + i];
    out[i].measured_fwd = median(col, runs) / mb;
    for (int r = 0; r < runs; r++) col[r] = bwd[(size_t)r * n + i];
    out[i].measured_bwd = median(col, runs) / mb;
  }
done:
  st_stage_destroy(s);
  st_pool_destroy(pool);
  st_free(params);
  st_free(grads);
  st_free(opt);
  st_free(x);
  st_free(dout);
  free(fwd);
  free(bwd);
  free(col);
  return rc;
}

/* The measurements made, kept for the rest of the process: the run's
 * executor and the plan printed beside it (st_plan_compile on a model of
 * its own) cut by the same figures, as does a run made again (a bench's
 * repeats, a sweep's points). Keyed by what the figures depend on: the
 * blocks' shapes and layers, the micro-batch, whether updates fuse, the
 * optimizer and the seed. CACHED entries, the oldest replaced first. */
enum { CACHED = 32 };
typedef struct cached {
  uint64_t key;
  int n;
  double *fwd, *bwd; /* [n] each, one allocation */
} cached;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cached cache[CACHED];
static int cache_next;

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}

static uint64_t key_of(const st_model *m, const st_config *cfg) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix(h, (uint64_t)m->n_blocks);
  h = mix(h, st_shape_numel(m->in));
  h = mix(h, (uint64_t)m->classes);
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    h = mix(h, b->n_params);
    h = mix(h, st_shape_numel(b->in));
    h = mix(h, st_shape_numel(b->out));
    h = mix(h, (uint64_t)b->n_layers);
    for (int l = 0; l < b->n_layers; l++) {
      const st_layer *L = &b->layers[l];
      h = mix(h, (uint64_t)L->kind);
      h = mix(h, st_shape_numel(L->in));
      h = mix(h, st_shape_numel(L->out));
      h = mix(h, (uint64_t)L->rows);
    }
  }
  h = mix(h, (uint64_t)st_plan_micro_batch(cfg));
  h = mix(h, (uint64_t)st_plan_fuses_update(cfg));
  for (const char *c = cfg->optimizer.kind; *c; c++)
    h = mix(h, (uint64_t)(unsigned char)*c);
  return mix(h, (uint64_t)cfg->train.seed);
}

int st_plan_block_costs(st_block_cost *out, const st_model *m,
                        const st_config *cfg, st_error *err) {
  st_plan_costs(out, m, cfg);
  if (strcmp(cfg->execution.block_costs, "measured") != 0) return 0;
  const int n = m->n_blocks;
  const uint64_t key = key_of(m, cfg);
  /* one measurement at a time: two would slow each other */
  pthread_mutex_lock(&cache_mu);
  int rc = 0;
  const cached *hit = NULL;
  for (int k = 0; k < CACHED && !hit; k++)
    if (cache[k].fwd && cache[k].n == n && cache[k].key == key) hit = &cache[k];
  if (hit) {
    for (int i = 0; i < n; i++) {
      out[i].measured_fwd = hit->fwd[i];
      out[i].measured_bwd = hit->bwd[i];
    }
  } else if (!(rc = st_plan_measure(out, m, cfg, err))) {
    cached *c = &cache[cache_next];
    double *f = realloc(c->fwd, 2 * (size_t)n * sizeof *f);
    if (f) { /* else not kept: the next plan measures again */
      c->fwd = f;
      c->bwd = f + n;
      c->n = n;
      c->key = key;
      for (int i = 0; i < n; i++) {
        c->fwd[i] = out[i].measured_fwd;
        c->bwd[i] = out[i].measured_bwd;
      }
      cache_next = (cache_next + 1) % CACHED;
    }
  }
  pthread_mutex_unlock(&cache_mu);
  return rc;
}
