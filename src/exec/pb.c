/*
 * pb.c — pipelined backpropagation (DESIGN.md; BACKGROUND.md 2; Petrowski
 * et al. 1993; Kosson et al., MLSys 2021): a layer pipeline that is never
 * drained. Every stage updates its own blocks after every micro-batch's
 * backward (default one sample), so the stages stay busy at batch size one;
 * the gradients are delayed and the forward and backward of a micro-batch
 * may see different weights, which the mitigations correct.
 *
 * The schedule, per stage: stage s of S has delay D(s) = 2 (S - 1 - s);
 * for each micro-batch n in turn it runs the forward of n, then the
 * backward of n - D(s) and the update with its gradient. That is BACKGROUND
 * .md's tick convention (at tick t stage s forwards t - s and backs t -
 * 2(S - 1) + s) read stage by stage: the last stage forwards, takes the
 * loss and backs the same micro-batch; D(s) updates happen at stage s
 * between a micro-batch's forward and its own update.
 *
 * A trainer step hands the executor train.batch samples, K micro-batches:
 * every stage runs its (forward, backward + update) pairs for those K, so
 * when the step returns every loss of the batch is known and the pipeline
 * is still full — the next step carries on where this one stopped. The
 * last micro-batches' gradients reach the early stages during later steps.
 * A step comes in two halves (pb_start, pb_wait) so that the trainer can
 * start the next one before it waits for this one: each stage then goes
 * from its last pair of one step into its first of the next, instead of
 * idling while the later stages finish the step (S - 1 pairs' time a step).
 *
 * Two drivers run the same per-stage pairs on the same buffers:
 *   threaded  each stage is a thread with a pool of its cores (the
 *             compiler's plan), pinned when they fit, messages passed
 *             through single-producer rings; a stage runs ahead as far as
 *             its inputs allow;
 *   emulated  (execution.emulate) one thread, tick by tick: for t, for s,
 *             the pair of micro-batch t - s.
 * Each stage's sequence of operations and the data each one reads are the
 * same in both, and no kernel's result depends on its pool size, so the
 * weights are bit-identical whatever the timing.
 *
 * Buffers, at stage s: D(s) + 1 activation slots (micro-batch n in slot n
 * mod (D + 1); by the schedule n - D - 1 has finished its backward when n
 * starts); stage 0 copies its input there too (the batch it came from is
 * gone when its backward runs); DIN_RING input-gradient buffers toward the
 * stage before (at most three are ever unread, see chan_send). A forward
 * message points at the sender's output in its slot, which it keeps until
 * this stage has sent back that micro-batch's gradient.
 *
 * Weights: the stage's blocks are one contiguous range of the model's slab
 * (its live weights, updated in place, optimizer state beside them); the
 * stage ops take weight pointers relative to it (st_stage.base), so a
 * forward or backward can run on a prediction or a stashed copy.
 *   none       forward and backward on the live weights;
 *   stash      the backward on the copy its forward used: D copies in a
 *              ring (copy n mod D holds the version micro-batch n saw,
 *              written just before the update that would change it);
 *   sc         the update applies a v + b d (st_pb_update);
 *   lwp        the forward on w - lr D v (BACKGROUND.md's spectrain is
 *              this rule in fine-grained PB, where its backward predicts
 *              0 updates ahead);
 *   sc+lwp     both;
 *   pipemare   each stage's lr warmed up by D^-(1 - min(t/T, 1)) and the
 *              backward on w - D delta, delta an EMA of the updates.
 * A non-finite loss stops every stage before the backward of its
 * micro-batch: no gradient of it reaches any weight. The pipeline cannot go
 * on after that; further steps are refused.
 *
 * Placed over MPI ranks (st_pb_create_placed), each rank runs its own
 * stages on the threaded driver, and a stage whose neighbour is on another
 * rank exchanges MPI messages with it instead: forward messages are sent
 * from the sender's slot (not overwritten before the send is done) into
 * per-slot buffers of the receiver, each posted as soon as the slot's
 * backward has read it; gradients are sent from the DIN_RING buffers into
 * a ring of BWD_RING receive buffers. The receives stay posted from one
 * step to the next, as the pipeline stays full. A stop (a non-finite loss)
 * sends an empty message in place of the gradient each remote stage
 * before a stopped one waits for; every rank then stops before the
 * backward of that micro-batch reaches it.
 */
#include "exec.h"

#include "../compile/compile.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  DIN_RING = 4, /* input-gradient buffers per stage (3 unread + 1 in use) */
  BWD_RING = 4, /* over ranks: gradients received ahead, per stage */
};

enum { MIT_NONE, MIT_STASH, MIT_SC, MIT_LWP, MIT_SC_LWP, MIT_PIPEMARE };

typedef struct pb_stage {
  st_rt_stage rt; /* first: the runtime's part (cores, slots, links) */
  struct pb *p;
  int D;
  size_t off, n;          /* its weights: slab floats [off, off + n) */
  int64_t *fwd_version;   /* [slots]: updates done when its forward ran */
  float *x_copy;          /* stage 0: slots x mb x input floats */
  float *probs, *dlogits; /* last stage: mb x R x out_cols */
  float *din[DIN_RING];   /* stages > 0 */
  float *wf;              /* lwp/sc+lwp: predicted forward weights */
  int64_t wf_n0;          /* the step (its first micro-batch, pb.n0) whose
                             last update wrote wf along with the weights, so
                             the next forward of that step finds it ready;
                             -1: never */
  float *wb, *delta;      /* pipemare: backward weights, update EMA */
  float **stash;          /* stash: [D] copies */
  int64_t updates;        /* since create */
  int64_t updates0;       /* a resumed run's updates before it (the rules'
                             step count: momentum's first step, AdamW's bias
                             correction, pipemare's warm-up) */
  int delay_min, delay_max, delay_all; /* counted (tests) */
  int versions, max_versions;
  /* the busy seconds of its last forward, backward (to the send) and
   * update, and where pair() files them (its row of the job's times) */
  double last_f, last_bk, last_u;
  double *rec;
  int64_t n0;         /* the first micro-batch of the step it runs */
  atomic_llong done;  /* steps it has finished (threaded driver) */
  atomic_llong clean; /* of those, run to the end before any stop */
} pb_stage;

/* A trainer step as the stages see it: its view (copied: the caller's goes
 * out of scope; the buffers it points at stay untouched until the step is
 * waited for) and its micro-batches [n0, n0 + K). */
typedef struct pb_job {
  st_trainer_view v;
  int64_t n0;
  int K;
  int emulated_ok; /* emulated: every pair of it ran */
  /* stage s's busy seconds in its pair n0 + i: forward, backward and
   * update at times[(s K + i) 3 + 0, 1, 2] (cap pairs a stage) */
  double *times;
  int cap;
} pb_job;

typedef struct pb {
  st_rt rt; /* the stages' runtime: S, mb, errors, links */
  int mitigation, adamw;
  int fuse; /* micro-batch 1: linear layers update inside the
               backward (execution.fused_update) */
  float pipemare_gamma;
  int pipemare_warmup;
  pb_stage *stages;
  st_stage *eval;
  int64_t next; /* micro-batches started so far */
  /* Step control: the caller writes step g into jobs[g % 2] and (threaded)
   * publishes it by bumping generation to g + 1; each stage runs the steps
   * in order, going from one into the next without waiting, and counts
   * them in its `done`. At most two steps are started and not waited for
   * (pb_start), so a job is rewritten only after every stage finished it. */
  pb_job jobs[2];
  long long started, waited; /* the caller's counts */
  atomic_llong generation;
  int broken;
  double wall, wall_t0; /* seconds with a step in flight; since when */
  st_pb_replay replay;  /* the steps' busy times with free hand-offs */
  st_pb_probe probe;
  void *probe_arg;
  int local;  /* this rank's stages */
  int closed; /* st_pb_close_links done */
} pb;

/* ------------------------------------------------------------- a stage */

static float *live(const pb_stage *st, const st_trainer_view *v) {
  return v->params + st->off;
}

static int lwp_like(int mit) { return mit == MIT_LWP || mit == MIT_SC_LWP; }

/* The forward of micro-batch n (index n - n0 in this step's batch). */
static int forward(pb_stage *st, st_trainer_view *v, int64_t n) {
  pb *p = st->p;
  const st_model *m = p->rt.model;
  int slot = (int)(n % st->rt.slots), mb = p->rt.mb, R = m->label_rows;
  int64_t k = n - st->n0;
  size_t in_floats = (size_t)mb * st_shape_numel(m->in);
  const float *in;
  if (st->rt.index == 0) {
    float *x = st->x_copy + (size_t)slot * in_floats;
    memcpy(x, v->x + (size_t)k * in_floats, in_floats * sizeof *x);
    in = x;
  } else if (!(in = st_rt_recv(&st->rt, v, ST_RT_FWD, n))) {
    return -1;
  }
  /* the slot's output goes to another rank: its last send is done */
  if (st_rt_reuse(&st->rt, ST_RT_FWD, n)) return -1;
  double t0 = st_now();
  const float *w = live(st, v);
  if (lwp_like(p->mitigation) && st->D > 0) {
    /* An update of this step already wrote the prediction (its k, lr D,
     * is the step's); else, in a new step or before any update, a pass. */
    if (st->wf_n0 != st->n0)
      st_pb_predict(v->ctx.pool, st->wf, w, v->opt + st->off,
                    v->lr * (float)st->D, st->n);
    w = st->wf;
  }
  if (p->probe) p->probe(p->probe_arg, st->rt.index, n, 1, w, st->n);
  st->rt.in[slot] = in;
  st->fwd_version[slot] = st->updates;
  st_ctx ctx = st_rt_ctx(v, (int64_t)k * mb);
  const float *out = st_stage_forward(st->rt.run[slot], &ctx, w, in, mb);
  /* stash: micro-batches started before the first update all saw the
   * initial weights; later ones are saved just before their update */
  if (p->mitigation == MIT_STASH && st->D > 0 && n < st->D) {
    memcpy(st->stash[n % st->D], live(st, v), st->n * sizeof(float));
    if (++st->versions > st->max_versions) st->max_versions = st->versions;
  }
  if (st->rt.index < p->rt.S - 1) {
    double t1 = st_now();
    st_rt_trace(v, ST_TRACE_FORWARD, n, t0, t1);
    st->rt.busy += t1 - t0;
    st->last_f = t1 - t0;
    return st_rt_send(&st->rt, v, ST_RT_FWD, n, out);
  }
  size_t rows = (size_t)mb * R;
  const float *losses = v->losses + (size_t)k * rows;
  st_rt_loss(v, ctx.pool, k, mb, out, st->probs);
  double sum = 0;
  for (size_t i = 0; i < rows; i++) sum += losses[i];
  double t1 = st_now();
  st_rt_trace(v, ST_TRACE_FORWARD, n, t0, t1);
  st->rt.busy += t1 - t0;
  st->last_f = t1 - t0;
  if (!isfinite(sum)) {
    st_error err = {0};
    st_error_set(&err, ST_ENONFINITE,
                 "step %lld: training loss is %s (samples %lld..%lld); "
                 "pipelined backprop stopped before its backward, no "
                 "checkpoint written — lower optimizer.lr",
                 (long long)v->step + 1, isnan(sum) ? "NaN" : "infinite",
                 (long long)(v->first_sample + k * mb),
                 (long long)(v->first_sample + k * mb + mb - 1));
    st_rt_fail(&p->rt, &err);
    return -1;
  }
  return 0;
}

/* After a fused backward: the tensors the backward did not update (every
 * layer but the linear ones), tensor by tensor, by the same rule. */
static void update_unfused(pb_stage *st, const st_trainer_view *v,
                           const st_ctx *ctx, const st_optim_rule *rule,
                           float *pred) {
  const st_model *m = st->p->rt.model;
  for (int i = st->rt.first; i < st->rt.first + st->rt.count; i++) {
    const st_block *b = &m->blocks[i];
    for (int l = 0; l < b->n_layers; l++) {
      const st_layer *L = &b->layers[l];
      if (L->w_tensor < 0 ||
          (st_layer_fuses_update(L, ctx, 1) && b->tensors[L->w_tensor].tie < 0))
        continue;
      const int tensors[2] = {L->w_tensor, L->b_tensor};
      for (int k = 0; k < 2; k++) { /* tied copies: see mirror_ties */
        if (tensors[k] < 0 || b->tensors[tensors[k]].tie >= 0) continue;
        size_t at = b->param_off + b->tensors[tensors[k]].offset;
        st_pb_update(v->ctx.pool, rule, v->params + at, v->grads + at,
                     v->opt + at, NULL, pred ? pred + (at - st->off) : NULL,
                     b->tensors[tensors[k]].numel);
      }
    }
  }
}

/* A tied pair (a GPT's embedding and head) is one weight: after the
 * backward the copy's gradient joins the source's (gather 1); after the
 * update the copy takes the source's weights and optimizer slots (gather
 * 0), so that its next forward and update are the source's. A pair is
 * refused across stages, and the embedding is the first block and the
 * head the last, so a tied model runs as one stage: D = 0, and no
 * mitigation keeps per-weight buffers (stash, prediction, pipemare's
 * delta) to mirror. */
static void mirror_ties(pb_stage *st, const st_trainer_view *v, int gather) {
  const st_model *m = st->p->rt.model;
  size_t lo = st->off, hi = st->off + st->n;
  if (!m->n_ties) return;
  assert(st->D == 0 && !st->wf && !st->delta);
  if (gather) {
    st_trainer_ties(v, v->grads, 0, lo, hi, 1);
    return;
  }
  st_trainer_ties(v, v->params, 0, lo, hi, 0);
  for (int k = 0; k < (st->p->adamw ? 2 : 1); k++)
    st_trainer_ties(v, v->opt + (size_t)k * m->n_params, 0, lo, hi, 0);
}

/* The backward of micro-batch j (forwarded D updates ago) and the update
 * with its gradient. */
static int backward(pb_stage *st, st_trainer_view *v, int64_t j) {
  pb *p = st->p;
  const st_model *m = p->rt.model;
  int slot = (int)(j % st->rt.slots), mb = p->rt.mb;
  const float *dout;
  double t0;
  if (st->rt.index == p->rt.S - 1) {
    t0 = st_now();
    st_rt_loss_grad(v, v->ctx.pool, j - st->n0, mb, mb, st->probs, st->dlogits);
    dout = st->dlogits;
  } else {
    if (!(dout = st_rt_recv(&st->rt, v, ST_RT_BWD, j))) return -1;
    t0 = st_now();
  }
  float *w = live(st, v), *g = v->grads + st->off, *vel = v->opt + st->off;
  const float *wb = w;
  if (p->mitigation == MIT_STASH && st->D > 0) {
    wb = st->stash[j % st->D];
  } else if (p->mitigation == MIT_PIPEMARE && st->D > 0) {
    st_pb_predict(v->ctx.pool, st->wb, w, st->delta, (float)st->D, st->n);
    wb = st->wb;
  }
  if (p->probe) p->probe(p->probe_arg, st->rt.index, j, 0, wb, st->n);
  int mit = p->mitigation;
  float lr = mit == MIT_PIPEMARE
                 ? st_pb_pipemare_lr(v->lr, st->D, st->updates0 + st->updates,
                                     p->pipemare_warmup)
                 : v->lr;
  /* one rule for the fused linear layers and for the rest */
  st_optim_rule rule;
  st_optim_rule_pb(
      &rule, lr, v->cfg->optimizer.momentum, v->cfg->optimizer.weight_decay,
      st->D, mit == MIT_SC || mit == MIT_SC_LWP, st->updates0 + st->updates);
  rule.gamma = p->pipemare_gamma;
  /* With the update folded into the backward, linear weight prediction is
   * folded in too: each parameter's prediction for the next forward is
   * written as it is updated (the forward's k, this step's lr D), instead
   * of a pass over w and v before that forward. */
  float *pred = p->fuse && lwp_like(mit) && st->D > 0 ? st->wf : NULL;
  rule.pk = lwp_like(mit) ? v->lr * (float)st->D : 0.0f;
  st_ctx ctx = v->ctx;
  st_fused_update fused = {&rule,       v->params, v->opt,
                           m->n_params, pred,      st->off};
  if (p->fuse) ctx.fused = &fused;
  float *din = st->rt.index ? st->din[j % DIN_RING] : NULL;
  if (st_rt_reuse(&st->rt, ST_RT_BWD, j)) return -1;
  st_stage_backward(st->rt.run[slot], &ctx, wb, g, st->rt.in[slot], dout, din,
                    mb);
  double t1 = st_now();
  st_rt_trace(v, ST_TRACE_BACKWARD, j, t0, t1);
  st->rt.busy += t1 - t0;
  st->last_bk = t1 - t0;
  /* the buffers just read are free: post the receives that reuse them */
  if (st->rt.remote_next && st_rt_post(&st->rt, ST_RT_BWD, j + BWD_RING))
    return -1;
  if (st->rt.remote_prev && st_rt_post(&st->rt, ST_RT_FWD, j + st->rt.slots))
    return -1;
  /* the stage before may go on while this one updates */
  if (st->rt.index && st_rt_send(&st->rt, v, ST_RT_BWD, j, din)) return -1;
  t0 = st_now();
  int delay = (int)(st->updates - st->fwd_version[slot]);
  if (delay > st->delay_all) st->delay_all = delay;
  if (j >= st->D) {
    if (st->delay_min < 0 || delay < st->delay_min) st->delay_min = delay;
    if (delay > st->delay_max) st->delay_max = delay;
  }
  if (p->mitigation == MIT_STASH && st->D > 0)
    /* copy (j + D) mod D = j mod D held j's version and is free now: it
     * takes the version of j + D, forwarded just before this backward,
     * which this update is about to change */
    memcpy(st->stash[j % st->D], w, st->n * sizeof(float));
  mirror_ties(st, v, 1);
  if (p->adamw) { /* none or stash (st_config_validate) */
    st_optim_step_range(v->ctx.pool, v->cfg, w, g, vel, m->n_params, st->n,
                        v->lr, st->updates0 + st->updates);
  } else if (p->fuse) {
    update_unfused(st, v, &ctx, &rule, pred);
  } else {
    st_pb_update(v->ctx.pool, &rule, w, g, vel,
                 mit == MIT_PIPEMARE && st->D > 0 ? st->delta : NULL, NULL,
                 st->n);
  }
  mirror_ties(st, v, 0);
  if (pred) st->wf_n0 = st->n0;
  st->updates++;
  t1 = st_now();
  st_rt_trace(v, ST_TRACE_UPDATE, j, t0, t1);
  st->rt.busy += t1 - t0;
  st->last_u = t1 - t0;
  return 0;
}

/* Stage st's share of micro-batch n: its forward, then the backward and
 * update of the micro-batch D(s) behind it. */
static int pair(pb_stage *st, st_trainer_view *v, int64_t n) {
  st->last_f = st->last_bk = st->last_u = 0;
  int rc = forward(st, v, n) || (n >= st->D && backward(st, v, n - st->D));
  if (st->rec) {
    double *r = st->rec + (n - st->n0) * 3;
    r[0] = st->last_f, r[1] = st->last_bk, r[2] = st->last_u;
  }
  return rc ? -1 : 0;
}

/* ------------------------------------------------------------ replay */

int st_pb_replay_init(st_pb_replay *r, int S) {
  *r = (st_pb_replay){.S = S};
  r->clock = calloc((size_t)S, sizeof *r->clock);
  r->bend = calloc((size_t)S * ST_PB_REPLAY_RING, sizeof *r->bend);
  if (r->clock && r->bend) return 0;
  st_pb_replay_free(r);
  return -1;
}

void st_pb_replay_free(st_pb_replay *r) {
  free(r->clock);
  free(r->bend);
  r->clock = r->bend = NULL;
}

/* Within pair n the stages go in order, so stage s - 1 reads the backward
 * of stage s that ended two pairs before (D(s - 1) = D(s) + 2), and the
 * ring of ends is never overwritten before it is read. */
void st_pb_replay_step(st_pb_replay *r, int64_t n0, int K,
                       const double *times) {
  const int S = r->S, ring = ST_PB_REPLAY_RING;
  for (int i = 0; i < K; i++) {
    double fwd_end = 0; /* stage s - 1's forward of this micro-batch */
    for (int s = 0; s < S; s++) {
      const double *t = times + ((size_t)s * K + i) * 3;
      double at = r->clock[s];
      if (s > 0 && fwd_end > at) at = fwd_end;
      fwd_end = at + t[0];
      r->clock[s] = fwd_end;
      int64_t j = n0 + i - 2 * (S - 1 - s);
      if (j < 0) continue;
      at = r->clock[s];
      if (s < S - 1 && r->bend[(s + 1) * ring + j % ring] > at)
        at = r->bend[(s + 1) * ring + j % ring];
      r->bend[s * ring + j % ring] = at + t[1];
      r->clock[s] = at + t[1] + t[2];
    }
  }
  for (int s = 0; s < S; s++)
    if (r->clock[s] > r->wall) r->wall = r->clock[s];
}

/* ----------------------------------------------------------- drivers */

/* Stage st's pairs of one step; 0 if it ran them all. */
static int run_stage(pb_stage *st, const pb_job *job) {
  pb *p = st->p;
  st_trainer_view view = job->v, *v = &view;
  view.ctx.pool = st->rt.pool;
  view.track = job->v.track + st->rt.index;
  st->n0 = job->n0;
  st->rec = job->times ? job->times + (size_t)st->rt.index * job->K * 3 : NULL;
  double now = st_now();
  if (st->rt.last_end > 0)
    st_rt_trace(v, ST_TRACE_IDLE, -1, st->rt.last_end, now);
  int rc = 0;
  for (int64_t n = job->n0; n < job->n0 + job->K && !rc; n++)
    rc = atomic_load(&p->rt.abort) || atomic_load(&p->rt.stop) || pair(st, v, n)
             ? -1
             : 0;
  st->rt.last_end = st_now();
  return rc;
}

/* A stage's thread: the steps in order, each as soon as it is published
 * (the next one may already be: then the stage goes straight on). */
static void *worker(void *arg) {
  pb_stage *st = arg;
  pb *p = st->p;
  long long done = 0;
  for (;;) {
    if (st_wait_ge(&st->rt.w, &p->generation, done + 1, p->rt.spin, NULL,
                   &p->rt.stop))
      return NULL; /* stopped */
    st_fp_apply();
    int ok = !run_stage(st, &p->jobs[done % 2]);
    /* clean counts the steps before the first stop (none after it) */
    if (ok && atomic_load(&st->clean) == done)
      atomic_store(&st->clean, done + 1);
    atomic_store(&st->done, ++done);
    st_waiter_wake(&p->rt.w);
  }
}

/* One thread, tick by tick: at tick t stage s runs micro-batch t - s. */
static void emulate(pb *p, pb_job *job) {
  for (int s = 0; s < p->rt.S; s++) {
    p->stages[s].n0 = job->n0;
    p->stages[s].rec = job->times ? job->times + (size_t)s * job->K * 3 : NULL;
  }
  for (int64_t t = job->n0; t < job->n0 + job->K + p->rt.S - 1; t++)
    for (int s = 0; s < p->rt.S; s++) {
      int64_t n = t - s;
      if (n < job->n0 || n >= job->n0 + job->K) continue;
      st_trainer_view view = job->v;
      view.track = job->v.track + s;
      if (pair(&p->stages[s], &view, n)) return;
    }
  job->emulated_ok = 1;
}

/* ------------------------------------------------------- the executor */

static int mitigation_of(const char *name) {
  static const char *const names[] = {"none", "stash",  "sc",
                                      "lwp",  "sc+lwp", "pipemare"};
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    if (!strcmp(name, names[i])) return i;
  return -1;
}

static void pb_destroy(void *state) {
  pb *p = state;
  if (!p) return;
  /* every thread first: a stage still in a step (one started ahead) may
   * send to its neighbours until it sees the stop */
  if (p->stages) st_rt_stop_threads(&p->rt);
  for (int s = 0; p->stages && s < p->rt.S; s++) {
    pb_stage *st = &p->stages[s];
    if (st->rt.leaky) /* MPI may still read these */
      for (int k = 0; k < DIN_RING; k++) st->din[k] = NULL;
    free(st->fwd_version);
    st_free(st->x_copy);
    st_free(st->probs);
    st_free(st->dlogits);
    for (int k = 0; k < DIN_RING; k++) st_free(st->din[k]);
    st_free(st->wf);
    st_free(st->wb);
    st_free(st->delta);
    for (int k = 0; st->stash && k < st->D; k++) st_free(st->stash[k]);
    free(st->stash);
    st_rt_stage_free(&st->rt);
  }
  free(p->stages);
  st_stage_destroy(p->eval);
  for (int k = 0; k < 2; k++) free(p->jobs[k].times);
  st_pb_replay_free(&p->replay);
  st_rt_free(&p->rt);
  free(p);
}

/* A model whose tied tensors would sit in two stages (a GPT's head and
 * embedding) cannot be pipelined this way: each stage updates its own
 * weights at its own delay. */
static int tie_crosses(const st_model *m, const pb_stage *st, int S) {
  for (int s = 0; s < S; s++)
    for (int b = st[s].rt.first; b < st[s].rt.first + st[s].rt.count; b++)
      for (int t = 0; t < m->blocks[b].n_tensors; t++) {
        long tie = m->blocks[b].tensors[t].tie;
        if (tie >= 0 &&
            ((size_t)tie < st[s].off || (size_t)tie >= st[s].off + st[s].n))
          return 1;
      }
  return 0;
}

/* What this process's stages will hold, before any of it is allocated:
 * stage s keeps D(s) + 1 micro-batches' activations in flight (the
 * trainer's own check counted one) and its weight versions (stash: D(s)
 * copies; lwp: a predicted one; pipemare: two). The model's weights,
 * gradients and optimizer state besides. Past what this machine allows a
 * rank, refused naming the stage that holds most: 4096 x 4096 images had
 * the kernel kill the run without a word. */
static int check_in_flight(const pb *p, const st_config *cfg, st_error *err) {
  const st_model *m = p->rt.model;
  double slots = st_optim_state_per_param(cfg), need = 0, most = 0;
  int worst = 0;
  for (int s = 0; s < p->rt.S; s++) {
    const pb_stage *st = &p->stages[s];
    if (!st->rt.local) continue; /* over ranks: another rank's to hold */
    need += 4.0 * (double)st->n * (2 + slots); /* weights, grads, state */
    double acts = 0;
    for (int b = st->rt.first; b < st->rt.first + st->rt.count; b++)
      acts += (double)m->blocks[b].act_per_sample;
    int copies = st_pb_weight_copies(cfg->execution.mitigation, st->D);
    double here = 4.0 * ((double)(st->D + 1) * p->rt.mb * acts +
                         (double)copies * (double)st->n);
    need += here;
    if (here > most) most = here, worst = s;
  }
  double allowed = st_rank_memory_allowed();
  if (allowed <= 0 || need <= allowed) return 0;
  char a[32], b[32], c[32];
  const pb_stage *w = &p->stages[worst];
  return st_error_set(
      err, ST_ENOMEM,
      "pipelined backprop needs at least %s: stage %d alone holds %s (%d "
      "micro-batches of %d samples in flight, and its weight versions), "
      "more than the %s this machine allows (RAM or the cgroup limit, and "
      "swap); fewer stages, a smaller micro-batch or model; refused before "
      "allocating",
      st_plan_fmt_bytes(a, sizeof a, need), worst,
      st_plan_fmt_bytes(b, sizeof b, most), w->D + 1, p->rt.mb,
      st_plan_fmt_bytes(c, sizeof c, allowed));
}

static int alloc_stage(pb *p, pb_stage *st, st_error *err) {
  const st_model *m = p->rt.model;
  int mb = p->rt.mb, R = m->label_rows;
  st->rt.slots = st->D + 1;
  st->rt.rx_ring = BWD_RING;
  st->rt.tx_ring = DIN_RING;
  /* forward messages come from the stage before: D(s) + 2 + 1 of them */
  int rc = st_rt_stage_alloc(&st->rt, !p->rt.emulate,
                             st->D + 3 > 3 ? st->D + 3 : 3, 3, st->off, err);
  if (rc) return rc;
  st->fwd_version = calloc((size_t)st->rt.slots, sizeof *st->fwd_version);
  int ok = st->fwd_version != NULL;
  size_t per = (size_t)mb * R * m->out_cols;
  if (ok && st->rt.index == 0)
    ok = (st->x_copy = st_alloc((size_t)st->rt.slots * mb *
                                st_shape_numel(m->in) * sizeof(float))) != NULL;
  if (ok && st->rt.index == p->rt.S - 1)
    ok = (st->probs = st_alloc(per * sizeof(float))) &&
         (st->dlogits = st_alloc(per * sizeof(float)));
  size_t in_floats = (size_t)mb * st_shape_numel(m->blocks[st->rt.first].in);
  for (int k = 0; ok && st->rt.index > 0 && k < DIN_RING; k++)
    ok = (st->din[k] = st_alloc(in_floats * sizeof(float))) != NULL;
  size_t wbytes = st->n * sizeof(float);
  if (ok && st->D > 0 && lwp_like(p->mitigation))
    ok = (st->wf = st_alloc(wbytes)) != NULL;
  if (ok && st->D > 0 && p->mitigation == MIT_PIPEMARE)
    ok = (st->wb = st_alloc(wbytes)) && (st->delta = st_alloc(wbytes));
  if (ok && st->D > 0 && p->mitigation == MIT_STASH) {
    ok = (st->stash = calloc((size_t)st->D, sizeof *st->stash)) != NULL;
    for (int k = 0; ok && k < st->D; k++)
      ok = (st->stash[k] = st_alloc(wbytes)) != NULL;
  }
  if (ok && st->delta) memset(st->delta, 0, wbytes);
  st->versions = st->max_versions = 1; /* the live weights */
  st->delay_min = -1;
  st->wf_n0 = -1;
  if (ok) return 0;
  return st_error_set(err, ST_ENOMEM,
                      "out of memory for pipelined backprop stage %d "
                      "(%d weight versions of %zu floats)",
                      st->rt.index, st->D + 1, st->n);
}

/* The receives every remote link keeps posted ahead. */
static int post_ahead(pb *p) {
  for (int s = 0; s < p->rt.S; s++) {
    st_rt_stage *st = &p->stages[s].rt;
    for (int n = 0; st->remote_prev && n < st->slots; n++)
      if (st_rt_post(st, ST_RT_FWD, n)) return -1;
    for (int j = 0; st->remote_next && j < st->rx_ring; j++)
      if (st_rt_post(st, ST_RT_BWD, j)) return -1;
  }
  return 0;
}

static int create(void **state, const st_model *m, const st_config *cfg,
                  int micro_batch, int max_batch, const st_placement *pl,
                  st_error *err) {
  *state = NULL;
  int S = st_pipeline_asked_stages(cfg);
  int cores = cfg->train.threads > 0 ? cfg->train.threads : st_usable_cores();
  if (S == ST_STAGES_PER_BLOCK) S = m->n_blocks;
  /* over ranks, the cut of S stages on one core each (the threaded run's
   * cut when it has no more cores than stages); 0: a stage per rank */
  if (pl) {
    if (S == 0) S = st_dist_group_size(pl->group);
    cores = S;
  }
  if (st_pipeline_check_pin(cfg, m->n_blocks, err)) return err->code;
  if (S > m->n_blocks)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stages: %d stages for a model of %d "
                        "blocks; each stage needs at least one block",
                        st_config_where(cfg, "execution.stages"), S,
                        m->n_blocks);
  pb *p = calloc(1, sizeof *p);
  if (!p) return st_error_set(err, ST_ENOMEM, "out of memory");
  int n = m->n_blocks, rc = 0;
  if (st_rt_init(&p->rt, m, micro_batch, n, "pipelined backprop")) {
    pb_destroy(p);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  p->mitigation = mitigation_of(cfg->execution.mitigation);
  p->rt.emulate = cfg->execution.emulate;
  p->adamw = !strcmp(cfg->optimizer.kind, "adamw");
  /* the update may go inside the backward when the backward runs on the
   * live weights and the rule is the elementwise SGD one (stash needs the
   * live weights copied before the update, pipemare the change after) */
  p->fuse = cfg->execution.fused_update && micro_batch == 1 && !p->adamw &&
            p->mitigation != MIT_STASH && p->mitigation != MIT_PIPEMARE;
  p->pipemare_gamma = cfg->execution.pipemare_gamma;
  p->pipemare_warmup = cfg->execution.pipemare_warmup;
  int *first = malloc((size_t)n * 3 * sizeof *first);
  p->stages = calloc((size_t)n, sizeof *p->stages);
  if (!first || !p->stages || p->mitigation < 0) {
    int unknown = p->mitigation < 0;
    free(first);
    pb_destroy(p);
    return unknown ? st_error_set(err, ST_ECONFIG,
                                  "%s: execution.mitigation: "
                                  "unknown '%s'",
                                  st_config_where(cfg, "execution.mitigation"),
                                  cfg->execution.mitigation)
                   : st_error_set(err, ST_ENOMEM, "out of memory");
  }
  int *count = first + n, *pes = first + 2 * n;
  int k = st_pipeline_split(m, cfg, S, cores, first, count, pes, err);
  if (k < 0) {
    free(first);
    pb_destroy(p);
    return err && err->code ? err->code : ST_ENOMEM;
  }
  p->rt.S = k;
  int threads = 0;
  for (int s = 0, off = 0; s < k; s++) {
    pb_stage *st = &p->stages[s];
    const st_block *lo = &m->blocks[first[s]],
                   *hi = &m->blocks[first[s] + count[s] - 1];
    st->p = p;
    p->rt.st[s] = &st->rt;
    st->rt.rt = &p->rt;
    st->rt.index = s;
    st->rt.first = first[s];
    st->rt.count = count[s];
    st->rt.cores = pes[s];
    st->rt.cpu_off = off;
    off += pes[s];
    threads += pes[s];
    st->D = 2 * (k - 1 - s);
    st->off = lo->param_off;
    st->n = hi->param_off + hi->n_params - lo->param_off;
    snprintf(st->rt.name, sizeof st->rt.name, "stage %d", s);
  }
  free(first);
  for (int s = 0; s < p->rt.S; s++) p->stages[s].rt.local = 1;
  p->local = p->rt.S;
  if (pl && p->rt.S < st_dist_group_size(pl->group)) {
    pb_destroy(p);
    return st_error_set(err, ST_ECONFIG,
                        "%s: %s: %d stages over %d ranks "
                        "(execution.placement: ranks): each rank needs a "
                        "stage",
                        st_config_where(cfg, st_stages_key(cfg)),
                        st_stages_key(cfg), k, st_dist_group_size(pl->group));
  }
  if (pl) { /* stage s on member s P / S, sharing its cores */
    st_rt_place(&p->rt, pl->group, 0, p->rt.S, pl->threads);
    st_rt_mark_links(&p->rt);
    p->local = 0;
    for (int s = 0; s < p->rt.S; s++) p->local += p->stages[s].rt.local;
  }
  if (m->n_ties && tie_crosses(m, p->stages, p->rt.S)) {
    pb_destroy(p);
    return st_error_set(err, ST_ECONFIG,
                        "%s: model.tied: the head and the token embedding "
                        "share weights but land in different stages, which "
                        "update at different delays in pipelined_backprop; "
                        "set model.tied: false",
                        st_config_where(cfg, "model.tied"));
  }
  /* Spin before sleeping only when every stage has a core of its own. */
  p->rt.spin = threads <= st_usable_cores() && p->rt.S <= cores ? ST_SPIN : 0;
  if (pl) /* ranks sharing this machine's cores: spin only on spare ones */
    p->rt.spin = st_dist_local_size() <= st_usable_cores() ? ST_SPIN : 0;
  /* the replay needs every stage's times: all stages in this process */
  if (p->local == p->rt.S && st_pb_replay_init(&p->replay, p->rt.S))
    rc = st_error_set(err, ST_ENOMEM, "out of memory (pipelined backprop)");
  if (!rc) rc = check_in_flight(p, cfg, err);
  for (int s = 0; !rc && s < p->rt.S; s++)
    if (p->stages[s].rt.local) rc = alloc_stage(p, &p->stages[s], err);
  /* evaluation in one process (over ranks: ranks.c, stage by stage) */
  if (!rc && !pl)
    rc = st_stage_create(&p->eval, m, 0, m->n_blocks, max_batch, err);
  if (!rc && pl && post_ahead(p)) {
    rc = p->rt.rc;
    *err = p->rt.err;
  }
  if (!rc && !p->rt.emulate && st_rt_start(&p->rt, worker))
    rc = st_error_set(err, ST_ENOMEM,
                      "cannot start the threads of a %d-stage pipeline",
                      p->rt.S);
  if (rc) {
    pb_destroy(p);
    return rc;
  }
  if (cfg->execution.pin && !p->rt.emulate && !pl) {
    int cpus[CPU_SETSIZE], nc = st_usable_cpus(cpus, CPU_SETSIZE);
    if (threads <= nc) st_rt_pin(&p->rt, cpus, nc);
  }
  *state = p;
  return 0;
}

static int pb_create(void **state, const st_model *m, const st_config *cfg,
                     int micro_batch, int max_batch, st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, NULL, err);
}

int st_pb_create_placed(void **state, const st_model *m, const st_config *cfg,
                        int micro_batch, int max_batch, const st_placement *pl,
                        st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, pl, err);
}

int st_pb_layout(const void *state, int *first, int *count, int *owner) {
  return st_rt_layout(&((const pb *)state)->rt, first, count, owner);
}

int st_pb_close_links(void *state, st_error *err) {
  pb *p = state;
  if (!p->rt.group || p->closed || p->broken) return 0;
  /* The pipeline is never drained: gradients of the last micro-batches are
   * in flight toward receives posted for them, and receives are posted
   * for messages never to be sent. Each rank completes or cancels its
   * receives (reading from senders that are all still here), then waits
   * for every rank to have done so; no send can be matched after that,
   * so its buffer is free. */
  for (int s = 0; s < p->rt.S; s++) {
    pb_stage *st = &p->stages[s];
    for (int j = 0; st->rt.rx_fwd_req && j < st->rt.slots; j++)
      st_dist_drop(&st->rt.rx_fwd_req[j]);
    for (int j = 0; j < ST_RT_RX_RING; j++) st_dist_drop(&st->rt.rx_bwd_req[j]);
  }
  int rc = st_dist_barrier(p->rt.group, err);
  for (int s = 0; !rc && s < p->rt.S; s++) {
    pb_stage *st = &p->stages[s];
    for (int j = 0; st->rt.tx_fwd && j < st->rt.slots; j++)
      st_dist_drop(&st->rt.tx_fwd[j]);
    for (int j = 0; st->rt.tx_bwd && j < st->rt.tx_ring; j++)
      st_dist_drop(&st->rt.tx_bwd[j]);
  }
  p->closed = !rc;
  p->broken = 1; /* no more steps */
  return rc;
}

/* A step asked of a pipeline an earlier error stopped. */
static int stopped_earlier(st_error *err) {
  return st_error_set(err, ST_EUNSUPPORTED,
                      "pipelined backprop stopped at an earlier error; its "
                      "pipeline cannot go on");
}

/* Starts a step: the stages may still be running the one before (at most
 * one), and go on into this one as soon as each is done with it — no stage
 * waits at the boundary for the others to finish the earlier step. */
static int pb_start(void *state, const st_trainer_view *v, st_error *err) {
  pb *p = state;
  if (p->broken) return stopped_earlier(err);
  if (p->started - p->waited >= 2)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "internal error: pipelined backprop: a third step "
                        "started before the first was waited for");
  pb_job *job = &p->jobs[p->started % 2];
  job->v = *v;
  job->v.ctx.fused = NULL; /* updates are this executor's own, per stage */
  job->n0 = p->next;
  job->K = v->batch / p->rt.mb;
  if (p->replay.clock && job->K > job->cap) {
    double *t = realloc(job->times, (size_t)p->rt.S * job->K * 3 * sizeof *t);
    if (!t)
      return st_error_set(err, ST_ENOMEM,
                          "out of memory (pipelined backprop's step times)");
    job->times = t, job->cap = job->K;
  }
  /* A resumed run starts with an empty pipeline; by its checkpoint's step
   * stage s had updated for every micro-batch but the last D(s). */
  if (p->next == 0 && v->step > 0)
    for (int s = 0; s < p->rt.S; s++) {
      int64_t done = v->step * job->K - p->stages[s].D;
      p->stages[s].updates0 = done > 0 ? done : 0;
    }
  if (p->started == p->waited) p->wall_t0 = st_now();
  p->next += job->K;
  p->started++;
  if (p->rt.emulate) {
    job->emulated_ok = 0;
    if (!atomic_load(&p->rt.abort)) emulate(p, job); /* else stopped before */
  } else {
    atomic_store(&p->generation, p->started);
    for (int s = 0; s < p->rt.S; s++)
      if (p->stages[s].rt.waiter_ready) st_waiter_wake(&p->stages[s].rt.w);
  }
  return 0;
}

/* Waits for the oldest started step: its loss, or the error that stopped
 * the stages (then the pipeline cannot go on). */
static int pb_wait(void *state, double *loss, st_error *err) {
  pb *p = state;
  if (p->waited == p->started)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "internal error: pipelined backprop: no step to "
                        "wait for");
  const pb_job *job = &p->jobs[p->waited % 2];
  /* the caller sleeps: the stages have the cores */
  int ok = p->rt.emulate ? job->emulated_ok : 1;
  for (int s = 0; !p->rt.emulate && s < p->rt.S; s++) {
    pb_stage *st = &p->stages[s];
    if (!st->rt.local) continue;
    st_wait_ge(&p->rt.w, &st->done, p->waited + 1, 0, NULL, NULL);
    if (atomic_load(&st->clean) < p->waited + 1) ok = 0;
  }
  p->waited++;
  if (p->waited == p->started) p->wall += st_now() - p->wall_t0;
  if (ok && !p->broken && job->times)
    st_pb_replay_step(&p->replay, job->n0, job->K, job->times);
  /* A step every stage ran to its end is whole, whatever stopped the one
   * after it (that one's wait reports it). */
  if (ok && !p->broken) {
    /* over ranks the losses are the last stage's rank's (ranks.c) */
    if (!p->stages[p->rt.S - 1].rt.local) return 0;
    return st_trainer_check_loss(&job->v, loss, err);
  }
  if (p->broken) return stopped_earlier(err);
  p->broken = 1;
  if (p->rt.group) {
    /* an empty message in place of the next gradient each remote stage
     * before one of this rank's waits for, and every request given up */
    for (int s = 1; s < p->rt.S; s++)
      if (p->stages[s].rt.remote_prev) st_rt_send_stop(&p->rt, s);
    st_rt_forget_links(&p->rt);
  }
  int rc = st_rt_result(&p->rt, err);
  if (rc) return rc;
  return st_error_set(err, ST_EUNSUPPORTED,
                      "internal error: pipelined backprop: a step stopped "
                      "with no error");
}

static int pb_step(void *state, st_trainer_view *v, double *loss,
                   st_error *err) {
  int rc = pb_start(state, v, err);
  return rc ? rc : pb_wait(state, loss, err);
}

static const float *pb_forward(void *state, const st_ctx *ctx,
                               const float *params, const float *x, int B) {
  pb *p = state;
  return st_stage_forward(p->eval, ctx, params, x, B);
}

static int pb_stage_count(void *state) { return ((pb *)state)->rt.S; }

static int pb_stats(void *state, st_track_stats *out, int cap, double *wall) {
  pb *p = state;
  *wall = p->wall;
  return st_rt_stats(&p->rt, out, cap, p->replay.wall);
}

int st_pb_delay(const void *state, int stage, int *steady_min, int *steady_max,
                int *max_all) {
  const pb *p = state;
  if (stage < 0 || stage >= p->rt.S) return -1;
  const pb_stage *st = &p->stages[stage];
  *steady_min = st->delay_min;
  *steady_max = st->delay_max;
  *max_all = st->delay_all;
  return st->D;
}

int st_pb_versions(const void *state, int stage) {
  const pb *p = state;
  return stage >= 0 && stage < p->rt.S ? p->stages[stage].max_versions : -1;
}

void st_pb_set_probe(void *state, st_pb_probe fn, void *arg) {
  pb *p = state;
  p->probe = fn;
  p->probe_arg = arg;
}

const st_executor st_exec_pipelined_backprop = {
    .mode = "pipelined_backprop",
    .step = pb_step,
    .start = pb_start,
    .wait = pb_wait,
    .forward = pb_forward,
    .create = pb_create,
    .destroy = pb_destroy,
    .stages = pb_stage_count,
    .stats = pb_stats,
};
