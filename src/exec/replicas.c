/*
 * replicas.c — the data-parallel mode (execution.replicas = R > 1): R
 * copies of the configured mode's executor (sequential or pipeline), each on
 * its own share of the cores, run the step's batch in R equal shares at
 * once. Each replica accumulates its share's gradient into its own slab
 * (replica 0 into the trainer's) and updates nothing (grads_only); the
 * caller then sums the slabs into the trainer's gradient and updates every
 * block once (st_trainer_update_blocks), as the inner mode would have.
 *
 * Contract: deterministic — the weights after every step depend only on the
 * config, never on thread timing or pool sizes: every replica runs the same
 * kernels on fixed samples (its share, first_sample offset, so dropout draws
 * the same masks as in the sequential mode), and the reduce adds the slabs
 * element by element in replica order, ((g0 + g1) + g2) + ..., in chunks
 * whose bounds depend only on the parameter count. Equal to the sequential
 * mode (R = 1) within fp32 rounding, not bit for bit: the sequential mode
 * sums a batch's per-sample gradients in one chain inside the GEMMs (and
 * across its micro-batches), the replicas sum per-replica partial sums. Why
 * replicas: a pipeline cannot use more stages than a model has blocks, and
 * small layers stop scaling with more cores per GEMM; copies of the model on
 * fewer cores each keep every core busy (DESIGN.md, data parallelism).
 *
 * Threads: one driver thread per replica, persistent, woken per step by a
 * generation counter under `mu` (as pipeline.c's workers): the sequential
 * inner mode runs its step on the driver and the replica's own pool; a
 * pipeline's driver publishes the step to the pipeline's own stage threads
 * and waits. The caller waits for all R, then reduces and updates on the
 * trainer's pool. Replica r's view, slab and buffers are written by the
 * caller only while the drivers wait and read by driver r only during the
 * step; the handoff under `mu` orders the two. Replica 0's first trace track
 * is also written by the caller (reduce, update), after its driver is done.
 */
#include "exec.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct replica {
  struct reps *owner;
  int index;
  st_config cfg;          /* the inner executor's config: its share of the
                             batch and of the cores, unpinned */
  void *state;            /* the inner executor's */
  st_pool *pool;          /* sequential inner mode: its cores; else NULL */
  float *grads;           /* n_params; NULL for replica 0 (the trainer's) */
  float *probs, *dlogits; /* mb * label_rows * out_cols; NULL for replica 0
                             (the view's, which no one else uses then) */
  int first_track, tracks;
  /* The step: set by the caller, read by the driver. */
  st_trainer_view view;
  /* Its result: written by the driver, read by the caller after `done`. */
  double loss;
  int rc;
  st_error err;
  pthread_t thread;
  int started;
} replica;

typedef struct reps {
  const st_executor *inner;
  const st_model *model;
  int R, share, mb;      /* replicas; samples and micro-batch of each */
  int tracks;            /* over all replicas */
  replica *rep;          /* [R] */
  st_track_stats *names; /* [tracks]: scratch for rep_stats */
  double busy;           /* seconds inside steps */
  /* Step control: the caller bumps `generation`; each driver runs its
   * replica's step and counts itself in `done`. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t generation;
  int done, stop;
} reps;

/* ------------------------------------------------------------ drivers */

static void *driver(void *arg) {
  replica *rp = arg;
  reps *p = rp->owner;
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
    st_fp_apply();
    rp->rc = p->inner->step(rp->state, &rp->view, &rp->loss, &rp->err);
    pthread_mutex_lock(&p->mu);
    p->done++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
}

/* ------------------------------------------------------------- reduce */

/* 64 KiB of each slab per task: the sum and the slab being added stay in
 * cache; the bounds depend only on n_params, not on the pool. */
enum { REDUCE_CHUNK = 1 << 14 };

typedef struct reduce_job {
  float *sum; /* replica 0's slab: the trainer's gradient */
  const replica *rep;
  int R;
  size_t n;
} reduce_job;

/* sum[i] = ((g0[i] + g1[i]) + g2[i]) + ... over the task's chunk, zeroing
 * g1 .. g(R-1) as they are read: per element, the order of the additions is
 * fixed whatever the loop order. */
static void reduce_task(void *arg, int task) {
  const reduce_job *j = arg;
  size_t lo = (size_t)task * REDUCE_CHUNK;
  size_t n = j->n - lo < REDUCE_CHUNK ? j->n - lo : REDUCE_CHUNK;
  float *restrict sum = j->sum + lo;
  for (int r = 1; r < j->R; r++) {
    float *restrict g = j->rep[r].grads + lo;
    for (size_t k = 0; k < n; k++) sum[k] += g[k];
    memset(g, 0, n * sizeof *g);
  }
}

static void reduce(const reps *p, const st_trainer_view *v) {
  size_t n = p->model->n_params;
  reduce_job j = {v->grads, p->rep, p->R, n};
  st_pool_for(v->ctx.pool, (int)((n + REDUCE_CHUNK - 1) / REDUCE_CHUNK),
              reduce_task, &j);
}

/* After a failed step: no slab may keep a partial gradient (v->grads too,
 * which the exec.h contract asks to be zero on return). */
static void zero_slabs(const reps *p, const st_trainer_view *v) {
  size_t bytes = p->model->n_params * sizeof(float);
  memset(v->grads, 0, bytes);
  for (int r = 1; r < p->R; r++) memset(p->rep[r].grads, 0, bytes);
}

/* ------------------------------------------------------- the executor */

static void rep_destroy(void *state) {
  reps *p = state;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int r = 0; p->rep && r < p->R; r++) {
    replica *rp = &p->rep[r];
    if (rp->started) pthread_join(rp->thread, NULL);
    if (rp->state) p->inner->destroy(rp->state);
    st_pool_destroy(rp->pool);
    st_free(rp->grads);
    st_free(rp->probs);
    st_free(rp->dlogits);
  }
  free(p->rep);
  free(p->names);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}

/* Best effort (execution.pin): replica r on usable cpus [r*per, (r+1)*per)
 * when the C cores fit the usable cpus. A sequential replica pins its pool's
 * workers and its driver (which takes part in the pool's work); a pipeline
 * pins its stages itself. Failures leave threads where the system put
 * them. */
static void pin(reps *p, int C, int per) {
  int n = st_usable_cpus(NULL, 0);
  if (C / p->R < 1 || C > n) return;
  int *cpus = malloc((size_t)n * sizeof *cpus);
  if (!cpus) return;
  n = st_usable_cpus(cpus, n);
  for (int r = 0; r < p->R && (r + 1) * per <= n; r++) {
    replica *rp = &p->rep[r];
    const int *mine = cpus + (size_t)r * per;
    if (rp->pool) {
      st_pool_pin(rp->pool, mine, per);
      st_pin_thread(rp->thread, mine, per);
    } else {
      st_pipeline_pin(rp->state, mine, per);
    }
  }
  free(cpus);
}

/* Makes replica r: its config, inner executor, pool, slab and buffers. */
static int make_replica(reps *p, int r, const st_config *cfg, int per,
                        int max_batch, st_error *err) {
  const st_model *m = p->model;
  replica *rp = &p->rep[r];
  rp->owner = p;
  rp->index = r;
  rp->cfg = *cfg;
  rp->cfg.train.threads = per;
  rp->cfg.train.batch = p->share; /* a pipeline cuts this into micro-batches */
  rp->cfg.execution.micro_batch = p->mb;
  rp->cfg.execution.replicas = 1;
  rp->cfg.execution.pin = 0; /* pinned here, to the replica's own cpus */
  /* Only replica 0 runs evaluation batches (rep_forward). */
  int rc = p->inner->create(&rp->state, m, &rp->cfg, p->mb,
                            r == 0 ? max_batch : p->mb, err);
  if (rc) return rc;
  if (p->inner == &st_exec_sequential && !(rp->pool = st_pool_create(per)))
    return st_error_set(err, ST_ENOMEM,
                        "cannot start %d threads for replica %d", per, r);
  if (r > 0) {
    size_t out = (size_t)p->mb * m->label_rows * m->out_cols;
    rp->grads = st_alloc(m->n_params * sizeof(float));
    rp->probs = st_alloc(out * sizeof(float));
    rp->dlogits = st_alloc(out * sizeof(float));
    if (!rp->grads || !rp->probs || !rp->dlogits)
      return st_error_set(err, ST_ENOMEM,
                          "out of memory for replica %d's gradients (%zu "
                          "parameters)",
                          r, m->n_params);
  }
  double wall;
  rp->tracks = p->inner->stats(rp->state, NULL, 0, &wall);
  return 0;
}

int st_replicas_split(const st_config *cfg, int micro_batch,
                      const st_executor **inner, int *share, int *mb,
                      st_error *err) {
  const int R = cfg->execution.replicas, batch = cfg->train.batch;
  *inner = st_find_executor(cfg->execution.mode);
  /* st_config_validate refuses these; checked again because a bad split
   * would index past the batch. */
  if (*inner != &st_exec_sequential && *inner != &st_exec_pipeline)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.replicas: replicas run the sequential "
                        "and pipeline modes, not '%s'",
                        st_config_where(cfg, "execution.replicas"),
                        cfg->execution.mode);
  *share = R > 0 ? batch / R : 0;
  *mb = micro_batch < *share ? micro_batch : *share;
  if (R < 2 || *share < 1 || *mb < 1 || batch % R != 0 || *share % *mb != 0)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.replicas: train.batch = %d does not "
                        "split into %d replicas of whole micro-batches of %d",
                        st_config_where(cfg, "execution.replicas"), batch, R,
                        micro_batch);
  return 0;
}

void st_replica_view(st_trainer_view *w, const st_trainer_view *v,
                     const st_model *m, int index, int share, int mb) {
  size_t first = (size_t)index * share;
  size_t rows = (size_t)m->label_rows, in = st_shape_numel(m->in);
  *w = *v;
  w->x = v->x + first * in;
  w->y = v->y + first * rows;
  w->losses = v->losses + first * rows;
  w->batch = share;
  w->micro_batch = mb;
  w->loss_batch = v->loss_batch;
  w->first_sample = v->first_sample + (int64_t)first;
  w->ctx.first_sample = v->ctx.first_sample + first;
  w->ctx.fused = NULL; /* nothing may update inside a replica */
  w->grads_only = 1;
  w->gs2 = w->gb2 = NULL;
}

static int rep_create(void **state, const st_model *m, const st_config *cfg,
                      int micro_batch, int max_batch, st_error *err) {
  *state = NULL;
  const int R = cfg->execution.replicas;
  const st_executor *inner;
  int share, mb;
  int rc = st_replicas_split(cfg, micro_batch, &inner, &share, &mb, err);
  if (rc) return rc;
  int C = cfg->train.threads > 0 ? cfg->train.threads : st_usable_cores();
  int per = C / R > 0 ? C / R : 1;
  reps *p = calloc(1, sizeof *p);
  if (!p) return st_error_set(err, ST_ENOMEM, "out of memory");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->inner = inner;
  p->model = m;
  p->R = R;
  p->share = share;
  p->mb = mb;
  if (!(p->rep = calloc((size_t)R, sizeof *p->rep)))
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
  for (int r = 0; !rc && r < R; r++) {
    rc = make_replica(p, r, cfg, per, max_batch, err);
    if (!rc) {
      p->rep[r].first_track = p->tracks;
      p->tracks += p->rep[r].tracks;
    }
  }
  if (!rc && !(p->names = malloc((size_t)p->tracks * sizeof *p->names)))
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
  for (int r = 0; !rc && r < R; r++) {
    if (pthread_create(&p->rep[r].thread, NULL, driver, &p->rep[r]))
      rc = st_error_set(err, ST_ENOMEM,
                        "cannot start the driver thread of replica %d", r);
    p->rep[r].started = !rc;
  }
  if (rc) {
    rep_destroy(p);
    return rc;
  }
  if (cfg->execution.pin) pin(p, C, per);
  *state = p;
  return 0;
}

static void trace(const st_trainer_view *v, st_trace_kind kind, double t0) {
  if (v->trace)
    st_trace_add(v->trace, v->track, kind, v->step, -1, t0, st_now());
}

/* Replica r's part of the step: its share of the samples, its own slab and
 * buffers, the loss scaled by the whole batch, gradients only. */
static void share_view(const reps *p, replica *rp, const st_trainer_view *v) {
  st_trainer_view *w = &rp->view;
  st_replica_view(w, v, p->model, rp->index, p->share, p->mb);
  w->ctx.pool = rp->pool; /* a pipeline runs on its stages' pools */
  if (rp->index > 0) {
    w->grads = rp->grads;
    w->probs = rp->probs;
    w->dlogits = rp->dlogits;
  }
  w->track = v->track + rp->first_track;
}

static int rep_step(void *state, st_trainer_view *v, double *loss,
                    st_error *err) {
  reps *p = state;
  double start = st_now();
  assert(v->batch == p->R * p->share);
  for (int r = 0; r < p->R; r++) share_view(p, &p->rep[r], v);
  pthread_mutex_lock(&p->mu);
  p->done = 0;
  p->generation++;
  pthread_cond_broadcast(&p->cv);
  while (p->done < p->R) pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
  /* The first failure in replica order, then the loss of the whole batch
   * (summed in sample order, as the sequential mode does): either stops
   * the step before any weight changes. */
  int rc = 0;
  for (int r = 0; r < p->R && !rc; r++)
    if ((rc = p->rep[r].rc)) *err = p->rep[r].err;
  if (!rc) rc = st_trainer_check_loss(v, loss, err);
  if (rc) {
    zero_slabs(p, v);
    p->busy += st_now() - start;
    return rc;
  }
  double t0 = st_now();
  reduce(p, v);
  trace(v, ST_TRACE_REDUCE, t0);
  t0 = st_now();
  st_trainer_update_blocks(v, 0, p->model->n_blocks);
  trace(v, ST_TRACE_UPDATE, t0);
  p->busy += st_now() - start;
  return 0;
}

static const float *rep_forward(void *state, const st_ctx *ctx,
                                const float *params, const float *x, int B) {
  reps *p = state;
  return p->inner->forward(p->rep[0].state, ctx, params, x, B);
}

static int rep_stages(void *state) {
  reps *p = state;
  return p->inner->stages ? p->inner->stages(p->rep[0].state) : 1;
}

/* The replicas' tracks in replica order, named "replica r " + the inner
 * mode's name ("replica 1 stage 0"). *wall is this executor's own time
 * inside steps (replicas, reduce and update), not an inner executor's. */
static int rep_stats(void *state, st_track_stats *out, int cap, double *wall) {
  reps *p = state;
  int n = 0;
  for (int r = 0; r < p->R; r++) {
    const replica *rp = &p->rep[r];
    double inner_wall;
    int k = p->inner->stats(rp->state, p->names + n, rp->tracks, &inner_wall);
    if (k > rp->tracks) k = rp->tracks; /* fixed at create; never more */
    for (int i = 0; i < k && n + i < cap; i++) {
      st_track_stats *o = &out[n + i];
      const st_track_stats *in = &p->names[n + i];
      char prefix[16];
      int len = snprintf(prefix, sizeof prefix, "replica %d ", r);
      snprintf(o->name, sizeof o->name, "%s%.*s", prefix,
               (int)sizeof o->name - len - 1, in->name);
      o->first = in->first;
      o->count = in->count;
      o->busy_s = in->busy_s;
      o->bound_s = 0; /* each replica's own timeline, not this wall's */
    }
    n += k;
  }
  *wall = p->busy;
  return n;
}

const st_executor st_exec_replicas = {
    .mode = "replicas",
    .step = rep_step,
    .forward = rep_forward,
    .create = rep_create,
    .destroy = rep_destroy,
    .stages = rep_stages,
    .stats = rep_stats,
};
