/*
 * measure.c — block costs timed on this machine (execution.block_costs:
 * measured), for a cut that is balanced in fact and not only as the cost
 * model predicts it (a pipeline runs at the pace of its slowest stage, and
 * the model misses a stage by up to 17% on some models, docs/compiler.md).
 *
 * Each block runs as training runs it: one thread, the plan's micro-batch
 * (st_plan_micro_batch), the forward of every block in order, the loss,
 * then the backward in reverse with the update folded in where the trainer
 * folds it (st_plan_fuses_update: linear layers at one sample), then each
 * block's remaining tensors updated by the configured rule. A block's
 * forward figure is the span of its st_block_forward; its backward figure
 * the span of its st_block_backward, plus its update's span once per
 * update: every micro-batch in pipelined backprop, once a batch in the
 * other modes. The loss (softmax cross-entropy) goes to the last block,
 * whose stage runs it. The hand-off between stages is nobody's block and
 * stays out (the plan models the copy).
 *
 * With linear weight prediction (pipelined backprop, st_plan_predicts),
 * every stage but the last also predicts its forward's weights: each run
 * is followed by one made as such a stage makes it, the forward reading
 * the prediction and the update writing it beside the weights (or, where
 * the update is not fused, a pass over w and v before each forward). A
 * block's measured_lwp is that run's time less the plain run's, which the
 * partitioner charges to every stage but the last.
 *
 * Repeats: a few untimed runs warm caches and the pool, then timed runs
 * until MEASURE_S has passed (at least MIN_RUNS, at most MAX_RUNS); each
 * block's figure is the median of its runs, so a burst of load elsewhere
 * (a shared VM's neighbours) moves no block.
 *
 * st_plan_compile lives here, not in compile/: it is the config's plan on
 * costs that may be measured, and the compiler takes costs as an input.
 */
#include "exec.h"

#include "../compile/compile.h"

#include <stdio.h>
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
 * nothing is fused), by the configured rule, as the executors do: where
 * the update is fused in pipelined backprop, by pb_rule (st_pb_update, as
 * pb.c's update of those tensors), writing their prediction to pred too
 * when pred is not NULL. */
static void update_block(const st_block *b, const st_ctx *ctx,
                         const st_config *cfg, float *params, float *grads,
                         float *opt, size_t n_params, int mb,
                         const st_optim_rule *pb_rule, float *pred) {
  float lr = cfg->optimizer.lr;
  if (!ctx->fused) {
    st_optim_step_range(ctx->pool, cfg, params + b->param_off,
                        grads + b->param_off, opt + b->param_off, n_params,
                        b->n_params, lr, 1);
    return;
  }
  for (int l = 0; l < b->n_layers; l++) {
    const st_layer *L = &b->layers[l];
    if (L->w_tensor < 0 ||
        (st_layer_fuses_update(L, ctx, mb) && b->tensors[L->w_tensor].tie < 0))
      continue; /* a tied copy is not fused: its time stands for the tie's */
    const int tensors[2] = {L->w_tensor, L->b_tensor};
    for (int k = 0; k < 2; k++) {
      if (tensors[k] < 0) continue;
      size_t at = b->param_off + b->tensors[tensors[k]].offset;
      if (pb_rule)
        st_pb_update(ctx->pool, pb_rule, params + at, grads + at, opt + at,
                     NULL, pred ? pred + at : NULL,
                     b->tensors[tensors[k]].numel);
      else
        st_optim_step_range(ctx->pool, cfg, params + at, grads + at, opt + at,
                            n_params, b->tensors[tensors[k]].numel, lr, 1);
    }
  }
}

/* Whether the model's input is token ids: its first layer an embedding
 * (then ids below that layer's vocabulary). */
static int token_input(const st_model *m, int *vocab) {
  const st_block *b = &m->blocks[0];
  if (b->n_layers < 1 || b->layers[0].kind != ST_OP_EMBED) return 0;
  *vocab = b->layers[0].vocab;
  return 1;
}

int st_plan_measure(st_block_cost *out, const st_model *m, const st_config *cfg,
                    st_error *err) {
  const int n = m->n_blocks, mb = st_plan_micro_batch(cfg);
  const size_t P = m->n_params;
  const int slots = st_optim_state_per_param(cfg);
  const int R = m->label_rows, C = m->classes, O = m->out_cols;
  const int pb = !strcmp(cfg->execution.mode, "pipelined_backprop");
  /* updates per sample: each micro-batch's in pipelined backprop, each
   * batch's elsewhere */
  const double per_update = pb ? 1.0 / mb : 1.0 / cfg->train.batch;
  /* the model must fit beside everything else: a model only weight
   * streaming can train is refused, not swapped through */
  double acts = 0;
  for (int i = 0; i < n; i++) acts += (double)m->blocks[i].act_per_sample;
  /* (weights, gradients, the optimizer's slots and, with linear weight
   * prediction, its predicted copy: `pred` below) */
  double need = ((double)P * (2 + slots + st_plan_predicts(cfg)) +
                 (double)mb * (acts + 6.0 * (double)m->max_numel +
                               (double)m->max_scratch_per_sample)) *
                sizeof(float);
  double ram = st_usable_memory();
  if (ram > 0 && need > ram / 2)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: execution.block_costs: measured times the "
                        "blocks with the whole model in memory: %.3g GB of "
                        "weights, gradients, optimizer state and "
                        "activations, more than half of the %.3g GB this "
                        "process may use; use model",
                        st_config_where(cfg, "execution.block_costs"),
                        need / 1e9, ram / 1e9);
  /* the arithmetic training runs in, process-wide as the trainer sets it:
   * `strata compile` makes no trainer, and timed bf16 products as fp32's
   * and subnormals at the slow path the run would flush */
  st_fp_set_flush(cfg->train.flush_subnormals);
  st_gemm_set_bf16(!strcmp(cfg->train.precision, "bf16"));
  st_gemm_choose_profile_once();
  const size_t in_n = (size_t)mb * st_shape_numel(m->in);
  const size_t rows = (size_t)mb * R;
  float *params = st_alloc(P * sizeof(float));
  float *grads = st_alloc(P * sizeof(float));
  float *opt = st_alloc((slots > 0 ? (size_t)slots : 1) * P * sizeof(float));
  float *x = st_alloc(in_n * sizeof(float));
  float *losses = st_alloc(rows * sizeof(float));
  float *probs = st_alloc(rows * O * sizeof(float));
  float *dlogits = st_alloc(rows * O * sizeof(float));
  int *labels = st_alloc(rows * sizeof(int));
  /* linear weight prediction (pipelined backprop): each run is followed
   * by one of the blocks as a stage with D > 0 runs them, the forward on
   * the predicted weights and the update writing them (a pass over w and
   * v before each forward where the update is not fused) */
  const int lwp = st_plan_predicts(cfg), variants = 1 + lwp;
  float *pred = lwp ? st_alloc(P * sizeof(float)) : NULL;
  double *fwd = malloc((size_t)variants * MAX_RUNS * n * sizeof *fwd);
  double *bwd = malloc((size_t)variants * MAX_RUNS * n * sizeof *bwd);
  double *col = malloc((size_t)MAX_RUNS * sizeof *col);
  st_pool *pool = st_pool_create(1);
  st_stage *s = NULL;
  int rc = 0;
  if (!params || !grads || !opt || !x || !losses || !probs || !dlogits ||
      !labels || !fwd || !bwd || !col || !pool || (lwp && !pred)) {
    rc =
        st_error_set(err, ST_ENOMEM,
                     "%s: execution.block_costs: measured: out of memory "
                     "for the model's %.3g GB to time its blocks",
                     st_config_where(cfg, "execution.block_costs"), need / 1e9);
    goto done;
  }
  if ((rc = st_stage_create(&s, m, 0, n, mb, err))) goto done;
  st_model_init(m, params, cfg->train.seed);
  /* inputs: token ids below the vocabulary for a sequence model, else
   * values in [-1, 1); labels below the classes */
  st_rng rng;
  st_rng_init(&rng, cfg->train.seed, 0x6d656173u /* "meas" */, 0);
  int vocab = 0, tokens = token_input(m, &vocab);
  for (size_t i = 0; i < in_n; i++)
    x[i] = tokens ? (float)st_rng_below(&rng, (uint32_t)vocab)
                  : 2 * st_rng_uniform(&rng) - 1;
  for (size_t i = 0; i < rows; i++)
    labels[i] = (int)st_rng_below(&rng, (uint32_t)C);
  st_optim_rule rule;
  st_optim_rule_init(&rule, cfg, cfg->optimizer.lr, 1);
  const int fuses = st_plan_fuses_update(cfg) && mb == 1;
  st_fused_update fused = {&rule, params, opt, P, NULL, 0};
  /* the prediction's variant: k = lr D at the first stage of a pipeline
   * of two (D = 2), the update as pb.c makes it; both variants update the
   * tensors the backward does not by pb_rule in pipelined backprop (with
   * pb.c's spike compensation at that stage), so that they differ by the
   * prediction alone */
  const float pk = 2 * cfg->optimizer.lr;
  st_optim_rule rule_p = rule;
  rule_p.pk = pk;
  st_fused_update fused_p = {&rule_p, params, opt, P, pred, 0};
  const char *mit = cfg->execution.mitigation;
  st_optim_rule pb_rule;
  st_optim_rule_pb(&pb_rule, cfg->optimizer.lr, cfg->optimizer.momentum,
                   cfg->optimizer.weight_decay, 2,
                   !strcmp(mit, "sc") || !strcmp(mit, "sc+lwp"), 1);
  pb_rule.pk = pk;
  if (pred) memcpy(pred, params, P * sizeof(float));
  st_ctx ctx = {pool, 1, cfg->train.seed, 0, fuses ? &fused : NULL, labels};
  double began = 0;
  int runs = 0;
  for (int r = 0; r < WARM_RUNS + MAX_RUNS; r++) {
    int timed = r >= WARM_RUNS;
    if (r == WARM_RUNS) began = st_now();
    for (int v = 0; v < variants; v++) {
      size_t row = (size_t)v * MAX_RUNS + (size_t)(timed ? runs : 0);
      double *f = fwd + row * n, *b = bwd + row * n;
      const float *w = v ? pred : params; /* what the forward reads */
      ctx.fused = fuses ? (v ? &fused_p : &fused) : NULL;
      const float *in = x;
      for (int i = 0; i < n; i++) {
        const st_block *blk = &m->blocks[i];
        double t0 = st_now();
        if (v && !fuses) /* the pass before every forward */
          st_pb_predict(pool, pred + blk->param_off, params + blk->param_off,
                        opt + blk->param_off, pk, blk->n_params);
        st_block_forward(blk, &ctx, w + blk->param_off, in, s->acts[i],
                         s->scratch, mb);
        f[i] = st_now() - t0;
        in = st_block_output(blk, s->acts[i], mb);
      }
      /* the loss, the last block's stage's, from its output `in` */
      double t0 = st_now();
      st_model_loss(m, pool, losses, probs, in, labels, (int)rows);
      double t1 = st_now();
      st_model_loss_grad(m, pool, dlogits, probs, labels, (int)rows,
                         1.0f / (float)rows);
      f[n - 1] += t1 - t0;
      stamps st = {t1, b};
      st_stage_backward_each(s, &ctx, params, grads, x, dlogits, NULL, mb,
                             stamp, &st);
      /* scaled now to one micro-batch's share of an update */
      for (int i = 0; i < n; i++) {
        t0 = st_now();
        update_block(&m->blocks[i], &ctx, cfg, params, grads, opt, P, mb,
                     pb ? &pb_rule : NULL, v && fuses ? pred : NULL);
        b[i] += (st_now() - t0) * per_update * mb;
      }
      /* fused: the pass at a step's first forward, its share a micro-batch
       * (timed after the updates, as it follows the step before's last;
       * just before this run's forward it would have warmed what that
       * forward reads) */
      for (int i = 0; v && fuses && i < n; i++) {
        const st_block *blk = &m->blocks[i];
        t0 = st_now();
        st_pb_predict(pool, pred + blk->param_off, params + blk->param_off,
                      opt + blk->param_off, pk, blk->n_params);
        f[i] += (st_now() - t0) * mb / cfg->train.batch;
      }
      ctx.first_sample += (uint64_t)mb;
    }
    if (timed && ++runs >= MIN_RUNS && st_now() - began >= MEASURE_S * variants)
      break;
  }
  for (int i = 0; i < n; i++) {
    for (int r = 0; r < runs; r++) col[r] = fwd[(size_t)r * n + i];
    out[i].measured_fwd = median(col, runs) / mb;
    for (int r = 0; r < runs; r++) col[r] = bwd[(size_t)r * n + i];
    out[i].measured_bwd = median(col, runs) / mb;
    out[i].measured_lwp = 0;
    if (!lwp) continue;
    /* the prediction's seconds: the median of its runs' forward plus
     * backward, less the plain runs' median forward and median backward
     * (never below 0) */
    for (int r = 0; r < runs; r++)
      col[r] = fwd[((size_t)MAX_RUNS + r) * n + i] +
               bwd[((size_t)MAX_RUNS + r) * n + i];
    double with = median(col, runs) / mb;
    double plain = out[i].measured_fwd + out[i].measured_bwd;
    out[i].measured_lwp = with > plain ? with - plain : 0;
  }
done:
  st_stage_destroy(s);
  st_pool_destroy(pool);
  st_free(params);
  st_free(grads);
  st_free(opt);
  st_free(x);
  st_free(losses);
  st_free(probs);
  st_free(dlogits);
  st_free(labels);
  st_free(pred);
  free(fwd);
  free(bwd);
  free(col);
  return rc;
}

/* The measurements made, kept for the rest of the process: the run's
 * executor and the plan printed beside it (st_plan_compile on a model of
 * its own) cut by the same figures, as does a run made again (a bench's
 * repeats, a sweep's points). Keyed by what the figures depend on
 * (key_of). CACHED entries, the oldest replaced first. */
enum { CACHED = 32 };
typedef struct cached {
  uint64_t key;
  int n;
  double *fwd, *bwd, *lwp; /* [n] each, one allocation */
} cached;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cached cache[CACHED];
static int cache_next;

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}

static uint64_t mix_shape(uint64_t h, st_shape a) {
  return mix(mix(mix(h, (uint64_t)a.c), (uint64_t)a.h), (uint64_t)a.w);
}

static uint64_t mix_float(uint64_t h, float v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  return mix(h, bits);
}

static uint64_t mix_text(uint64_t h, const char *t) {
  for (; *t; t++) h = mix(h, (uint64_t)(unsigned char)*t);
  return mix(h, 0);
}

/* Everything a block's time depends on: every layer's kind, shapes,
 * settings and what it keeps (transient, bf16), the products' precision
 * and subnormal mode, and what decides the update (mode, batch,
 * micro-batch, fusing, the optimizer's rule and its constants' zero tests)
 * and the weights (seed). */
static uint64_t key_of(const st_model *m, const st_config *cfg) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix(h, (uint64_t)m->n_blocks);
  h = mix_shape(h, m->in);
  h = mix(mix(h, (uint64_t)m->classes), (uint64_t)m->label_rows);
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    h = mix(mix(h, b->n_params), (uint64_t)b->n_layers);
    h = mix_shape(mix_shape(h, b->in), b->out);
    for (int l = 0; l < b->n_layers; l++) {
      const st_layer *L = &b->layers[l];
      h = mix_shape(mix_shape(mix(h, (uint64_t)L->kind), L->in), L->out);
      const int ints[] = {L->k,           L->stride,   L->pad,  L->groups,
                          L->approximate, L->rows,     L->wt,   L->heads,
                          L->rotary_dim,  L->vocab,    L->skip, L->w_tensor,
                          L->b_tensor,    L->transient};
      for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        h = mix(h, (uint64_t)(int64_t)ints[k]);
      h = mix_float(mix_float(h, L->eps), L->p);
    }
  }
  h = mix_text(h, cfg->execution.mode);
  h = mix_text(h, cfg->execution.mitigation);
  h = mix(h, (uint64_t)cfg->train.batch);
  h = mix(h, (uint64_t)st_plan_micro_batch(cfg));
  h = mix(h, (uint64_t)st_plan_fuses_update(cfg));
  h = mix_text(h, cfg->train.precision); /* bf16 products, flushing */
  h = mix(h, (uint64_t)cfg->train.flush_subnormals);
  h = mix_text(h, cfg->optimizer.kind);
  h = mix_float(h, cfg->optimizer.momentum);
  h = mix_float(h, cfg->optimizer.weight_decay);
  h = mix(h, (uint64_t)cfg->optimizer.nesterov);
  return mix(h, (uint64_t)cfg->train.seed);
}

/* Keeps figures under key (cache_mu held); a failed allocation keeps
 * nothing, and the next plan measures again. */
static void cache_put(uint64_t key, int n, const double *fwd, const double *bwd,
                      const double *lwp, size_t stride) {
  cached *c = &cache[cache_next];
  for (int k = 0; k < CACHED; k++) /* the same key's entry is replaced */
    if (cache[k].fwd && cache[k].n == n && cache[k].key == key) {
      c = &cache[k];
      break;
    }
  int fresh = c == &cache[cache_next];
  double *f = realloc(c->fwd, 3 * (size_t)n * sizeof *f);
  if (!f) return;
  c->fwd = f;
  c->bwd = f + n;
  c->lwp = f + 2 * (size_t)n;
  c->n = n;
  c->key = key;
  for (int i = 0; i < n; i++) {
    c->fwd[i] = *(const double *)((const char *)fwd + i * stride);
    c->bwd[i] = *(const double *)((const char *)bwd + i * stride);
    c->lwp[i] = lwp ? *(const double *)((const char *)lwp + i * stride) : 0;
  }
  if (fresh) cache_next = (cache_next + 1) % CACHED;
}

void st_measure_seed(const st_model *m, const st_config *cfg, const double *fwd,
                     const double *bwd, const double *lwp) {
  pthread_mutex_lock(&cache_mu);
  cache_put(key_of(m, cfg), m->n_blocks, fwd, bwd, lwp, sizeof *fwd);
  pthread_mutex_unlock(&cache_mu);
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
      out[i].measured_lwp = hit->lwp[i];
    }
  } else if (!(rc = st_plan_measure(out, m, cfg, err))) {
    cache_put(key, n, &out[0].measured_fwd, &out[0].measured_bwd,
              &out[0].measured_lwp, sizeof *out);
  }
  pthread_mutex_unlock(&cache_mu);
  return rc;
}

int st_plan_compile(st_plan **out, const st_config *cfg, int stages,
                    st_error *err) {
  *out = NULL;
  st_fabric fabric;
  st_model *m;
  int rc = st_plan_prepare(&fabric, &m, cfg, err);
  if (rc) return rc;
  st_block_cost *costs = st_alloc((size_t)m->n_blocks * sizeof *costs);
  if (!costs) rc = st_error_set(err, ST_ENOMEM, "out of memory");
  /* pass 1 (measured: each block timed here, for this machine's cores
   * only: a mesh's PEs are not this cpu's) */
  else if (fabric.kind != ST_FABRIC_CPU &&
           !strcmp(cfg->execution.block_costs, "measured"))
    rc = st_error_set(err, ST_ECONFIG,
                      "%s: execution.block_costs: measured times the blocks "
                      "on this machine's cores; fabric %s plans another "
                      "machine: use model",
                      st_config_where(cfg, "execution.block_costs"),
                      fabric.name);
  if (!rc && !(rc = st_plan_block_costs(costs, m, cfg, err)))
    rc = st_plan_from_costs(out, cfg, &fabric, costs, m->n_blocks, stages, err);
  /* what an evaluation allocates, sized by the stage runtime: per stage
   * (a stage on a rank of its own evaluates its blocks) and whole */
  if (!rc) {
    st_plan *p = *out;
    int eval = st_eval_batch(m, p->micro_batch > 0 ? p->micro_batch : 1);
    p->eval_batch = eval;
    for (int s = 0; s < p->n_stages; s++)
      p->stages[s].mem_eval = (double)st_stage_bytes(
          m, p->stages[s].first, p->stages[s].count, eval, 0);
    p->mem_eval_whole = (double)st_stage_bytes(m, 0, m->n_blocks, eval, 0);
    /* what a rank holds beside its stages, where ranks are checked
     * (st_plan_place_ranks): every rank loads the data and sizes the
     * trainer's buffers, as `strata train` counts them against
     * execution.rank_memory_limit */
    if (cfg->launch.ranks > 1 || cfg->execution.rank_memory_limit > 0) {
      int n_train = 0;
      st_error e = {0};
      if (st_data_footprint(cfg, &p->mem_data, &n_train, &e)) {
        p->mem_data = -1;
        snprintf(p->data_note, sizeof p->data_note, "%.150s", e.msg);
      }
      p->mem_batch = st_trainer_batch_bytes(m, cfg, cfg->launch.ranks, n_train);
    }
  }
  st_free(costs);
  st_model_destroy(m);
  return rc;
}
