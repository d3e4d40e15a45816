/*
 * pipeline.c — the synchronous layer-pipelined mode (DESIGN.md; GPipe,
 * Huang et al. 2019; 1F1B, Narayanan et al. 2019): the blocks are cut into S
 * stages of contiguous blocks balanced by FLOPs, each stage a worker thread
 * with its own pool; a batch of M micro-batches flows forward through
 * channels and its gradients flow back.
 *
 * Contract: the weights after every step are bit-identical to the
 * sequential mode at the same micro-batch split, whatever the thread timing.
 * That holds because every block sees exactly the calls the sequential mode
 * makes — the same forward and backward kernels on the same micro-batch,
 * whose results do not depend on the pool size (st_gemm, chunked per-sample
 * layers) — and accumulates its gradient over micro-batches in the same
 * order, 0 .. M-1: both schedules run a stage's backwards in micro-batch
 * order. A block is updated right after the last micro-batch's backward
 * leaves it, as in the sequential mode. The loss of every micro-batch is
 * known at the last stage before its last backward, which is where weights
 * start to change: a non-finite loss stops every stage before any update.
 *
 * Schedules, at stage s of S with M micro-batches:
 *   gpipe  F0 .. F(M-1), then B0 .. B(M-1): M micro-batches in flight;
 *   1f1b   w = min(M, S-1-s) forwards, then alternately one forward and one
 *          backward, then the remaining backwards: at most S - s in flight.
 * A stage keeps one activation slot per micro-batch it may hold in flight
 * (micro-batch k uses slot k mod slots; by the schedule, k - slots has
 * finished its backward when k starts), and counts what it holds.
 *
 * Channels carry (micro-batch, pointer): a forward message points at the
 * sender's output in its slot, which the sender does not reuse before this
 * stage has sent back that micro-batch's input gradient; a backward message
 * points at the sender's per-micro-batch input-gradient buffer. Each
 * channel's messages arrive in micro-batch order.
 */
#include "exec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct msg {
  int k;
  const float *data;
} msg;

typedef struct chan {
  msg *buf; /* M entries: never more in flight in one step */
  int head, count, cap;
} chan;

typedef struct pipe_stage {
  struct pipe *p;
  int index, first, count;
  st_pool *pool;
  int slots;
  st_stage **run;      /* [slots]: the stage's blocks for one micro-batch */
  const float **in;    /* [slots]: each slot's input */
  float *probs;        /* last stage: slots x mb x R x classes */
  float *dlogits;      /* last stage: mb x R x classes */
  float **dgrad;       /* [M] input gradients (stages > 0) */
  chan fwd, bwd;       /* from the stage before / after */
  int held, max_held;  /* micro-batches in flight, and the most this step */
  uint32_t jitter_state; /* test knob: this stage's sleep stream */
  pthread_t thread;
  int started;
} pipe_stage;

typedef struct pipe {
  const st_model *model;
  int S, M, mb, gpipe;
  pipe_stage *stages;
  st_stage *eval;      /* all blocks, for inference batches */
  /* step control: the caller publishes a view and bumps `generation`;
   * each worker runs its schedule and counts itself done */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t generation;
  int done, stop, abort;
  int jitter_us;       /* test knob: sleep up to this long before each op */
  st_trainer_view *v;
  double loss;
  int rc;
  st_error err;
} pipe;

/* ------------------------------------------------------------ channels */

static void chan_send(pipe *p, chan *c, int k, const float *data) {
  pthread_mutex_lock(&p->mu);
  c->buf[(c->head + c->count) % c->cap] = (msg){k, data};
  c->count++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* The next message, or NULL when the step was aborted. */
static const float *chan_recv(pipe *p, chan *c, int k) {
  pthread_mutex_lock(&p->mu);
  while (!c->count && !p->abort) pthread_cond_wait(&p->cv, &p->mu);
  const float *data = NULL;
  if (c->count) {
    msg m = c->buf[c->head];
    c->head = (c->head + 1) % c->cap;
    c->count--;
    /* FIFO per channel and both ends in micro-batch order: anything else
     * is a bug in the schedules, stopped rather than computed on */
    if (m.k == k) {
      data = m.data;
    } else {
      p->rc = st_error_set(&p->err, ST_EUNSUPPORTED,
                           "internal error: pipeline message for micro-batch "
                           "%d arrived where %d was due",
                           m.k, k);
      p->abort = 1;
      pthread_cond_broadcast(&p->cv);
    }
  }
  pthread_mutex_unlock(&p->mu);
  return data;
}

/* ------------------------------------------------------------- a stage */

static void update_block(void *view, int block) {
  st_trainer_update_blocks(view, block, 1);
}

/* Test knob (st_pipeline_set_jitter): a random pause before each op, so
 * the stress test sees many interleavings of the stages. */
static void jitter(pipe_stage *st) {
  if (!st->p->jitter_us) return;
  st->jitter_state = st->jitter_state * 1664525u + 1013904223u;
  long us = (long)((st->jitter_state >> 8) % (uint32_t)st->p->jitter_us);
  struct timespec ts = {0, us * 1000L};
  nanosleep(&ts, NULL);
}

static int forward_one(pipe_stage *st, st_trainer_view *v, int k) {
  pipe *p = st->p;
  jitter(st);
  const st_model *m = p->model;
  int slot = k % st->slots, mb = p->mb, R = m->label_rows;
  const float *in =
      st->index == 0
          ? v->x + (size_t)k * mb * st_shape_numel(m->in)
          : chan_recv(p, &st->fwd, k);
  if (!in) return -1;
  st->in[slot] = in;
  if (++st->held > st->max_held) st->max_held = st->held;
  st_ctx ctx = v->ctx;
  ctx.first_sample = (uint64_t)v->first_sample + (uint64_t)k * mb;
  const float *out = st_stage_forward(st->run[slot], &ctx, v->params, in, mb);
  if (st->index < p->S - 1) {
    chan_send(p, &p->stages[st->index + 1].fwd, k, out);
    return 0;
  }
  size_t per = (size_t)mb * R * m->classes;
  st_xent_forward_pool(ctx.pool, v->losses + (size_t)k * mb * R,
                       st->probs + (size_t)slot * per, out,
                       v->y + (size_t)k * mb * R, mb * R, m->classes);
  if (k == p->M - 1) {
    /* every loss of the batch is known; no weight has changed yet */
    double loss;
    st_error err = {0};
    if (st_trainer_check_loss(v, &loss, &err)) {
      pthread_mutex_lock(&p->mu);
      p->rc = err.code;
      p->err = err;
      p->abort = 1;
      pthread_cond_broadcast(&p->cv);
      pthread_mutex_unlock(&p->mu);
      return -1;
    }
    p->loss = loss;
  }
  return 0;
}

static int backward_one(pipe_stage *st, st_trainer_view *v, int k) {
  pipe *p = st->p;
  jitter(st);
  const st_model *m = p->model;
  int slot = k % st->slots, mb = p->mb, R = m->label_rows;
  const float *dout;
  if (st->index == p->S - 1) {
    size_t per = (size_t)mb * R * m->classes;
    st_xent_backward_pool(v->ctx.pool, st->dlogits,
                          st->probs + (size_t)slot * per,
                          v->y + (size_t)k * mb * R, mb * R, m->classes,
                          1.0f / ((float)v->loss_batch * (float)R));
    dout = st->dlogits;
  } else {
    dout = chan_recv(p, &st->bwd, k);
    if (!dout) return -1;
  }
  float *din = st->index == 0 ? NULL : st->dgrad[k];
  int last = k == p->M - 1;
  st_stage_backward_each(st->run[slot], &v->ctx, v->params, v->grads,
                         st->in[slot], dout, din, mb,
                         last && !v->grads_only ? update_block : NULL, v);
  st->held--;
  if (st->index > 0) chan_send(p, &p->stages[st->index - 1].bwd, k, din);
  return 0;
}

static void run_schedule(pipe_stage *st) {
  pipe *p = st->p;
  st_trainer_view view = *p->v, *v = &view; /* with this stage's pool */
  view.ctx.pool = st->pool;
  st->held = st->max_held = 0;
  int M = p->M, w = p->gpipe ? M : p->S - 1 - st->index;
  if (w > M) w = M;
  for (int k = 0; k < w; k++)
    if (forward_one(st, v, k)) return;
  for (int i = 0; i < M - w; i++) {
    if (forward_one(st, v, w + i)) return;
    if (backward_one(st, v, i)) return;
  }
  for (int k = M - w; k < M; k++)
    if (backward_one(st, v, k)) return;
}

static void *worker(void *arg) {
  pipe_stage *st = arg;
  pipe *p = st->p;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (p->generation == seen && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    seen = p->generation;
    pthread_mutex_unlock(&p->mu);
    run_schedule(st);
    pthread_mutex_lock(&p->mu);
    p->done++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
}

/* ----------------------------------------------------------- the split */

/* Cuts the blocks into S contiguous runs minimising the largest run's FLOPs
 * (forward + backward per sample): a small dynamic program. cut[s] is the
 * first block of stage s. */
static void balance(const st_model *m, int S, int *cut) {
  int n = m->n_blocks;
  double *pre = calloc((size_t)n + 1, sizeof *pre);
  double *best = malloc((size_t)(S + 1) * (n + 1) * sizeof *best);
  int *from = malloc((size_t)(S + 1) * (n + 1) * sizeof *from);
  if (!pre || !best || !from) { /* fall back to an even split by count */
    for (int s = 0; s < S; s++) cut[s] = s * n / S;
    goto done;
  }
  for (int i = 0; i < n; i++)
    pre[i + 1] = pre[i] + m->blocks[i].cost.flops_fwd +
                 m->blocks[i].cost.flops_bwd;
#define AT(s, i) ((size_t)(s) * (n + 1) + (i))
  for (int s = 0; s <= S; s++)
    for (int i = 0; i <= n; i++) best[AT(s, i)] = -1;
  best[AT(0, 0)] = 0;
  for (int s = 1; s <= S; s++)
    for (int i = s; i <= n; i++)
      for (int j = s - 1; j < i; j++) {
        if (best[AT(s - 1, j)] < 0) continue;
        double load = pre[i] - pre[j], worst = best[AT(s - 1, j)];
        if (load > worst) worst = load;
        if (best[AT(s, i)] < 0 || worst < best[AT(s, i)]) {
          best[AT(s, i)] = worst;
          from[AT(s, i)] = j;
        }
      }
  for (int s = S, i = n; s > 0; s--) {
    i = from[AT(s, i)];
    cut[s - 1] = i;
  }
#undef AT
done:
  free(pre);
  free(best);
  free(from);
}

/* ------------------------------------------------------- the executor */

static void pipe_destroy(void *state) {
  pipe *p = state;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int s = 0; p->stages && s < p->S; s++) {
    pipe_stage *st = &p->stages[s];
    if (st->started) pthread_join(st->thread, NULL);
    for (int j = 0; st->run && j < st->slots; j++) st_stage_destroy(st->run[j]);
    free(st->run);
    free(st->in);
    st_free(st->probs);
    st_free(st->dlogits);
    for (int k = 0; st->dgrad && k < p->M; k++) st_free(st->dgrad[k]);
    free(st->dgrad);
    free(st->fwd.buf);
    free(st->bwd.buf);
    st_pool_destroy(st->pool);
  }
  free(p->stages);
  st_stage_destroy(p->eval);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}

static int pipe_create(void **state, const st_model *m, const st_config *cfg,
                       int micro_batch, int max_batch, st_error *err) {
  *state = NULL;
  int S = cfg->execution.stages;
  int threads = cfg->train.threads > 0 ? cfg->train.threads
                                       : st_usable_cores();
  if (S == 0) S = threads < m->n_blocks ? threads : m->n_blocks;
  if (S > m->n_blocks)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stages: %d stages for a model of %d "
                        "blocks; each stage needs at least one block",
                        st_config_where(cfg, "execution.stages"), S,
                        m->n_blocks);
  if (cfg->metrics.noise_scale)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: metrics.noise_scale is not available in the "
                        "pipeline mode yet",
                        st_config_where(cfg, "metrics.noise_scale"));
  pipe *p = calloc(1, sizeof *p);
  if (!p) return st_error_set(err, ST_ENOMEM, "out of memory");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->model = m;
  p->S = S;
  p->mb = micro_batch;
  p->M = cfg->train.batch / micro_batch;
  p->gpipe = strcmp(cfg->execution.schedule, "gpipe") == 0;
  p->stages = calloc((size_t)S, sizeof *p->stages);
  int *cuts = malloc((size_t)(S + 1) * sizeof *cuts);
  int ok = p->stages && cuts, rc = 0; /* rc: a stage buffer's own error */
  if (ok) balance(m, S, cuts);
  int per_stage = threads / S > 0 ? threads / S : 1;
  int R = m->label_rows;
  size_t per_mb = (size_t)micro_batch * R * m->classes;
  for (int s = 0; ok && s < S; s++) {
    pipe_stage *st = &p->stages[s];
    st->p = p;
    st->index = s;
    st->first = cuts[s];
    st->count = (s + 1 < S ? cuts[s + 1] : m->n_blocks) - cuts[s];
    int w = p->gpipe ? p->M : S - s;
    st->slots = w < p->M ? w : p->M;
    st->pool = st_pool_create(per_stage);
    st->run = calloc((size_t)st->slots, sizeof *st->run);
    st->in = calloc((size_t)st->slots, sizeof *st->in);
    st->fwd.buf = malloc((size_t)p->M * sizeof(msg));
    st->bwd.buf = malloc((size_t)p->M * sizeof(msg));
    st->fwd.cap = st->bwd.cap = p->M;
    ok = st->pool && st->run && st->in && st->fwd.buf && st->bwd.buf;
    for (int j = 0; ok && j < st->slots; j++)
      ok = (rc = st_stage_create(&st->run[j], m, st->first, st->count,
                                 micro_batch, err)) == 0;
    if (ok && s == S - 1) {
      st->probs = st_alloc((size_t)st->slots * per_mb * sizeof(float));
      st->dlogits = st_alloc(per_mb * sizeof(float));
      ok = st->probs && st->dlogits;
    }
    if (ok && s > 0) {
      size_t in_floats =
          (size_t)micro_batch * st_shape_numel(m->blocks[st->first].in);
      st->dgrad = calloc((size_t)p->M, sizeof *st->dgrad);
      ok = st->dgrad != NULL;
      for (int k = 0; ok && k < p->M; k++)
        ok = (st->dgrad[k] = st_alloc(in_floats * sizeof(float))) != NULL;
    }
  }
  free(cuts);
  if (ok)
    ok = (rc = st_stage_create(&p->eval, m, 0, m->n_blocks, max_batch,
                               err)) == 0;
  for (int s = 0; ok && s < S; s++) {
    ok = pthread_create(&p->stages[s].thread, NULL, worker, &p->stages[s]) == 0;
    p->stages[s].started = ok;
  }
  if (!ok) {
    pipe_destroy(p);
    return rc ? rc
              : st_error_set(err, ST_ENOMEM,
                             "out of memory or threads for a %d-stage "
                             "pipeline",
                             S);
  }
  *state = p;
  return 0;
}

static int pipe_step(void *state, st_trainer_view *v, double *loss,
                     st_error *err) {
  pipe *p = state;
  pthread_mutex_lock(&p->mu);
  p->v = v;
  p->done = 0;
  p->abort = 0;
  p->rc = 0;
  for (int s = 0; s < p->S; s++) {
    p->stages[s].fwd.head = p->stages[s].fwd.count = 0;
    p->stages[s].bwd.head = p->stages[s].bwd.count = 0;
  }
  p->generation++;
  pthread_cond_broadcast(&p->cv);
  while (p->done < p->S) pthread_cond_wait(&p->cv, &p->mu);
  int rc = p->rc;
  if (rc) *err = p->err;
  pthread_mutex_unlock(&p->mu);
  if (!rc) *loss = p->loss;
  return rc;
}

static const float *pipe_forward(void *state, const st_ctx *ctx,
                                 const float *params, const float *x, int B) {
  pipe *p = state;
  return st_stage_forward(p->eval, ctx, params, x, B);
}

int st_pipeline_held(const void *state, int stage) {
  const pipe *p = state;
  return stage >= 0 && stage < p->S ? p->stages[stage].max_held : -1;
}

void st_pipeline_set_jitter(void *state, int max_us, uint32_t seed) {
  pipe *p = state;
  p->jitter_us = max_us;
  for (int s = 0; s < p->S; s++) p->stages[s].jitter_state = seed + 7919u * s;
}

int st_pipeline_stages(const void *state, int *first, int *count) {
  const pipe *p = state;
  for (int s = 0; s < p->S; s++) {
    if (first) first[s] = p->stages[s].first;
    if (count) count[s] = p->stages[s].count;
  }
  return p->S;
}

static int pipe_stage_count(void *state) { return ((pipe *)state)->S; }


int st_pipeline_pin(void *state, const int *cpus, int n) {
  (void)state, (void)cpus, (void)n;
  return -1;
}

static int pipe_stats(void *state, st_track_stats *out, int cap,
                      double *wall) {
  pipe *p = state;
  *wall = 0;
  for (int s = 0; s < p->S && s < cap; s++)
    out[s] = (st_track_stats){"stage", 0};
  return p->S;
}

const st_executor st_exec_block_sequential = {
    .mode = "block_sequential",
    .step = pipe_step,
    .forward = pipe_forward,
    .create = pipe_create,
    .destroy = pipe_destroy,
    .stages = pipe_stage_count,
    .stats = pipe_stats,
};

const st_executor st_exec_pipeline = {
    .mode = "pipeline",
    .step = pipe_step,
    .forward = pipe_forward,
    .create = pipe_create,
    .destroy = pipe_destroy,
    .stages = pipe_stage_count,
    .stats = pipe_stats,
};
