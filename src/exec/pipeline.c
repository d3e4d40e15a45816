/*
 * pipeline.c — the synchronous layer-pipelined modes (DESIGN.md): pipeline
 * (fill and drain; GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2019)
 * and block_sequential. The compiler's plan (st_plan_build on this
 * machine's cores) cuts the blocks into S stages of contiguous blocks and
 * gives each stage its cores; each stage is a worker thread with its own
 * pool of that many threads, pinned to its own cpus when they fit. A batch
 * of M micro-batches flows forward through channels and its gradients flow
 * back.
 *
 * Contract: the weights after every step are bit-identical to the
 * sequential mode at the same micro-batch split, whatever the thread timing.
 * That holds because every block sees exactly the calls the sequential mode
 * makes — the same forward and backward kernels on the same micro-batch,
 * whose results do not depend on the pool size (st_gemm, chunked per-sample
 * layers) — and accumulates its gradient over micro-batches in the same
 * order, 0 .. M-1: every schedule runs a stage's backwards in micro-batch
 * order. A block is updated right after the last micro-batch's backward
 * leaves it, as in the sequential mode. The loss of every micro-batch is
 * known at the last stage before its last backward, which is where weights
 * start to change: a non-finite loss stops every stage before any update.
 *
 * Schedules, at stage s of S with M micro-batches:
 *   gpipe  F0 .. F(M-1), then B0 .. B(M-1): M micro-batches in flight;
 *   1f1b   w = min(M, S-1-s) forwards, then alternately one forward and one
 *          backward, then the remaining backwards: at most S - s in flight.
 * block_sequential cuts the blocks into segments first (blocks_per_segment,
 * or the fewest whose memory fits the machine) and each segment into
 * stages; it runs the forwards of all M micro-batches through segment 0,
 * then segment 1, ..., then the backwards from the last segment down: one
 * segment on the cores at a time, pipelined inside (gpipe order).
 *
 * A stage keeps one activation slot per micro-batch it may hold in flight
 * (micro-batch k uses slot k mod slots; by the schedule, k - slots has
 * finished its backward when k starts), and counts what it holds.
 * Channels carry (micro-batch, pointer): a forward message points at the
 * sender's output in its slot, which the sender does not reuse before this
 * stage has sent back that micro-batch's input gradient; a backward message
 * points at the sender's per-micro-batch input-gradient buffer. Each
 * channel's messages arrive in micro-batch order.
 *
 * Placed over MPI ranks (st_pipeline_create_placed), each rank runs its own
 * stages as above, and a stage whose neighbour is on another rank sends
 * and receives MPI messages instead (the stage's own thread, non-blocking):
 * a forward message is sent from the sender's slot, which it does not
 * overwrite before that send is done; it is received into one of the
 * receiver's per-slot buffers, posted as soon as the slot is free. Input
 * gradients are sent from the per-micro-batch buffers and received into a
 * ring of two, the next ones posted while a backward runs. Every stage
 * does the same work on the same data as with threads, so the weights are
 * the same bits. A step stopped by a non-finite loss sends an empty
 * message to each remote stage before one of its stages in place of the
 * gradient it waits for: every rank stops before any update.
 */
#include "exec.h"

#include "../dist/dist.h"

#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct pipe_stage {
  struct pipe *p;
  int index, first, count; /* index among all stages (every segment) */
  int cores, cpu_off;  /* its share of the cores: cpus [cpu_off, +cores) */
  char name[48];
  st_pool *pool;
  int slots;
  st_stage **run;      /* [slots]: the stage's blocks for one micro-batch */
  const float **in;    /* [slots]: each slot's input */
  float *probs;        /* last stage: slots x mb x R x classes */
  float *dlogits;      /* last stage: mb x R x classes */
  float **dgrad;       /* [M] input gradients (stages > 0) */
  st_chan fwd, bwd;    /* from the stage before / after: M entries, never
                          more in flight in one step */
  st_waiter w;         /* where its thread waits (messages, the next step) */
  /* placed over ranks: the member running it, and its links to stages on
   * other ranks (remote_prev / remote_next) */
  int owner, local, remote_prev, remote_next;
  float **rx_fwd;      /* [slots]: inputs received from the stage before */
  st_dist_req *rx_fwd_req;
  float *rx_bwd[2];    /* gradients received from the stage after */
  st_dist_req rx_bwd_req[2];
  st_dist_req *tx_fwd; /* [slots]: each slot's output, sent */
  st_dist_req *tx_bwd; /* [M]: input gradients, sent */
  int bwd_sent;        /* of them, this step */
  int leaky;           /* requests given up after a stop: MPI may still use
                          the buffers, which are never freed */
  int held, max_held;  /* micro-batches in flight, and the most this step */
  double busy;         /* seconds of forward, backward and update */
  double last_end;     /* when it last finished work (trace: idle) */
  uint32_t jitter_state; /* test knob: this stage's sleep stream */
  pthread_t thread;
  int started;
} pipe_stage;

enum { PHASE_ALL, PHASE_FORWARD, PHASE_BACKWARD };

typedef struct pipe {
  const st_model *model;
  int S, M, mb, gpipe, blockseq;
  int segments;        /* block_sequential: G segments; pipeline: 1 */
  int *seg;            /* [G + 1]: segment g runs stages [seg[g], seg[g+1]) */
  pipe_stage *stages;
  st_stage *eval;      /* all blocks, for inference batches */
  /* step control: the caller publishes a view and a phase over stages
   * [lo, hi), then bumps `generation`; every worker of this rank looks,
   * those in range run it, and all count themselves done */
  pthread_mutex_t mu;  /* the error */
  st_waiter w;         /* the caller's wait */
  atomic_llong generation, done;
  int phase, lo, hi;
  int spin;            /* polls before a waiting stage sleeps */
  atomic_int stop;
  int jitter_us;       /* test knob: sleep up to this long before each op */
  st_trainer_view *v;
  double loss, wall;
  int rc;
  st_error err;
  /* placed over ranks: this rank is member `me` of group */
  st_dist_group *group;
  int me, broken, peer_stop;
  atomic_int stopped; /* the step stopped (aborted): every wait gives up */
} pipe;

/* ------------------------------------------------------------ channels */

static void trace(const st_trainer_view *v, st_trace_kind kind, int k,
                  double t0, double t1) {
  if (v->trace) st_trace_add(v->trace, v->track, kind, v->step, k, t0, t1);
}

/* Stops every stage of this rank and wakes every wait. */
static void stop_all(pipe *p) {
  atomic_store(&p->stopped, 1);
  for (int s = 0; s < p->S; s++)
    if (p->stages[s].local) st_waiter_wake_always(&p->stages[s].w);
  st_waiter_wake_always(&p->w);
}

/* Stops the step with an error (the first one wins). */
static void stop_with(pipe *p, const st_error *err) {
  pthread_mutex_lock(&p->mu);
  if (!p->rc) {
    p->rc = err->code;
    p->err = *err;
  }
  pthread_mutex_unlock(&p->mu);
  stop_all(p);
}

static void chan_send(pipe_stage *st, const st_trainer_view *v,
                      pipe_stage *to, st_chan *c, int k, const float *data) {
  double t0 = v->trace ? st_now() : 0;
  /* a channel holds at most M messages, all of one step */
  if (st_chan_put(c, k, data)) {
    st_error err = {0};
    st_error_set(&err, ST_EUNSUPPORTED,
                 "internal error: pipeline channel to %s overflowed at "
                 "micro-batch %d",
                 to->name, k);
    stop_with(st->p, &err);
    return;
  }
  st_waiter_wake(&to->w);
  if (v->trace) trace(v, ST_TRACE_SEND, k, t0, st_now());
}

/* The next message, or NULL when the step was stopped. */
static const float *chan_recv(pipe_stage *st, const st_trainer_view *v,
                              st_chan *c, int k) {
  pipe *p = st->p;
  double t0 = v->trace ? st_now() : 0;
  st_msg m;
  if (st_chan_take(c, &st->w, p->spin, &p->stopped, NULL, &m)) return NULL;
  if (v->trace) trace(v, ST_TRACE_RECV, k, t0, st_now());
  /* FIFO per channel and both ends in micro-batch order: anything else
   * is a bug in the schedules, stopped rather than computed on */
  if (m.n != k) {
    st_error err = {0};
    st_error_set(&err, ST_EUNSUPPORTED,
                 "internal error: pipeline message for micro-batch %lld "
                 "arrived where %d was due",
                 (long long)m.n, k);
    stop_with(p, &err);
    return NULL;
  }
  return m.data;
}

/* ------------------------------------------- links to other ranks */

enum { CH_FWD = 0, CH_BWD = 1 };

/* Bytes of a message between stage s - 1 and stage s (either way). */
static size_t link_bytes(const pipe *p, int s) {
  return (size_t)p->mb *
         st_shape_numel(p->model->blocks[p->stages[s].first].in) *
         sizeof(float);
}

/* An MPI failure stops the step (the first error wins). */
static int link_failed(pipe *p, const st_error *err) {
  stop_with(p, err);
  return -1;
}

/* Posts the receive of micro-batch k's input into its slot's buffer. */
static int post_fwd(pipe_stage *st, int k) {
  pipe *p = st->p;
  st_error err = {0};
  int slot = k % st->slots;
  if (st_dist_irecv(p->group, CH_FWD, st->rx_fwd[slot],
                    link_bytes(p, st->index), p->stages[st->index - 1].owner,
                    st->index, &st->rx_fwd_req[slot], &err))
    return link_failed(p, &err);
  return 0;
}

/* Posts the receive of micro-batch k's output gradient (ring of two). */
static int post_bwd(pipe_stage *st, int k) {
  pipe *p = st->p;
  st_error err = {0};
  if (st_dist_irecv(p->group, CH_BWD, st->rx_bwd[k % 2],
                    link_bytes(p, st->index + 1),
                    p->stages[st->index + 1].owner, st->index,
                    &st->rx_bwd_req[k % 2], &err))
    return link_failed(p, &err);
  return 0;
}

/* The message of request r, received into buf; NULL when the step stops
 * (an empty message: another rank stopped it). */
static const float *link_recv(pipe_stage *st, const st_trainer_view *v,
                              st_dist_req *r, const float *buf, int k) {
  pipe *p = st->p;
  double t0 = v->trace ? st_now() : 0;
  size_t got = 0;
  st_error err = {0};
  int rc = st_dist_wait(r, &got, &p->stopped, &err);
  if (v->trace) trace(v, ST_TRACE_RECV, k, t0, st_now());
  if (rc < 0) return link_failed(p, &err), NULL;
  if (rc > 0) return NULL;
  if (got == 0) {
    pthread_mutex_lock(&p->mu);
    p->peer_stop = 1;
    pthread_mutex_unlock(&p->mu);
    stop_all(p);
    return NULL;
  }
  return buf;
}

static int link_send(pipe_stage *st, const st_trainer_view *v, int ch, int to,
                     const float *data, int k, st_dist_req *r) {
  pipe *p = st->p;
  double t0 = v->trace ? st_now() : 0;
  st_error err = {0};
  if (st_dist_isend(p->group, ch, data, link_bytes(p, ch ? st->index : to),
                    p->stages[to].owner, to, r, &err))
    return link_failed(p, &err);
  if (v->trace) trace(v, ST_TRACE_SEND, k, t0, st_now());
  return 0;
}

/* Waits for an earlier send from a buffer about to be written. */
static int link_sent(pipe_stage *st, st_dist_req *r) {
  st_error err = {0};
  int rc = st_dist_wait(r, NULL, &st->p->stopped, &err);
  return rc < 0 ? link_failed(st->p, &err) : rc ? -1 : 0;
}

/* ------------------------------------------------------------- a stage */

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
      st->index == 0 ? v->x + (size_t)k * mb * st_shape_numel(m->in)
      : st->remote_prev
          ? link_recv(st, v, &st->rx_fwd_req[slot], st->rx_fwd[slot], k)
          : chan_recv(st, v, &st->fwd, k);
  if (!in) return -1;
  /* the slot's output goes to another rank: its last send is done */
  if (st->remote_next && link_sent(st, &st->tx_fwd[slot])) return -1;
  double t0 = st_now();
  st->in[slot] = in;
  if (++st->held > st->max_held) st->max_held = st->held;
  st_ctx ctx = v->ctx;
  ctx.first_sample = (uint64_t)v->first_sample + (uint64_t)k * mb;
  const float *out = st_stage_forward(st->run[slot], &ctx, v->params, in, mb);
  if (st->index < p->S - 1) {
    double t1 = st_now();
    trace(v, ST_TRACE_FORWARD, k, t0, t1);
    int rc = 0;
    if (st->remote_next)
      rc = link_send(st, v, CH_FWD, st->index + 1, out, k, &st->tx_fwd[slot]);
    else
      chan_send(st, v, &p->stages[st->index + 1],
                &p->stages[st->index + 1].fwd, k, out);
    st->busy += st_now() - t0;
    return rc;
  }
  size_t per = (size_t)mb * R * m->classes;
  st_xent_forward_pool(ctx.pool, v->losses + (size_t)k * mb * R,
                       st->probs + (size_t)slot * per, out,
                       v->y + (size_t)k * mb * R, mb * R, m->classes);
  double t1 = st_now();
  trace(v, ST_TRACE_FORWARD, k, t0, t1);
  st->busy += t1 - t0;
  if (k == p->M - 1) {
    /* every loss of the batch is known; no weight has changed yet */
    double loss;
    st_error err = {0};
    if (st_trainer_check_loss(v, &loss, &err)) {
      stop_with(p, &err);
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
  double t0;
  if (st->index == p->S - 1) {
    t0 = st_now();
    size_t per = (size_t)mb * R * m->classes;
    st_xent_backward_pool(v->ctx.pool, st->dlogits,
                          st->probs + (size_t)slot * per,
                          v->y + (size_t)k * mb * R, mb * R, m->classes,
                          1.0f / ((float)v->loss_batch * (float)R));
    dout = st->dlogits;
  } else {
    dout = st->remote_next ? link_recv(st, v, &st->rx_bwd_req[k % 2],
                                       st->rx_bwd[k % 2], k)
                           : chan_recv(st, v, &st->bwd, k);
    if (!dout) return -1;
    t0 = st_now();
  }
  float *din = st->index == 0 ? NULL : st->dgrad[k];
  int last = k == p->M - 1;
  st_stage_backward_each(st->run[slot], &v->ctx, v->params, v->grads,
                         st->in[slot], dout, din, mb,
                         last && !v->grads_only ? st_exec_update_block : NULL,
                         v);
  st->held--;
  trace(v, ST_TRACE_BACKWARD, k, t0, st_now());
  int rc = 0;
  /* the buffers just read are free: post the receives that reuse them */
  if (st->remote_next && k + 2 < p->M) rc = post_bwd(st, k + 2);
  if (!rc && st->remote_prev && k + st->slots < p->M)
    rc = post_fwd(st, k + st->slots);
  if (!rc && st->remote_prev) {
    rc = link_send(st, v, CH_BWD, st->index - 1, din, k, &st->tx_bwd[k]);
    st->bwd_sent += !rc;
  } else if (!rc && st->index > 0) {
    chan_send(st, v, &p->stages[st->index - 1],
              &p->stages[st->index - 1].bwd, k, din);
  }
  st->busy += st_now() - t0;
  return rc;
}

static void run_phase(pipe_stage *st, int phase) {
  pipe *p = st->p;
  st_trainer_view view = *p->v, *v = &view; /* with this stage's pool */
  view.ctx.pool = st->pool;
  view.track = p->v->track + st->index;
  double now = st_now();
  /* (a replica's gaps hold the caller's all-reduce: not marked idle) */
  if (st->last_end > 0 && !v->grads_only)
    trace(v, ST_TRACE_IDLE, -1, st->last_end, now);
  int M = p->M, ok = 1;
  /* receives from other ranks, posted ahead: every free input slot, and
   * the first two gradients */
  if (phase != PHASE_BACKWARD && st->remote_prev)
    for (int k = 0; ok && k < st->slots && k < M; k++) ok = !post_fwd(st, k);
  if (phase != PHASE_FORWARD && st->remote_next)
    for (int k = 0; ok && k < 2 && k < M; k++) ok = !post_bwd(st, k);
  if (!ok) {
    /* nothing runs */
  } else if (phase == PHASE_FORWARD) {
    st->held = st->max_held = 0;
    for (int k = 0; k < M; k++)
      if (forward_one(st, v, k)) break;
  } else if (phase == PHASE_BACKWARD) {
    for (int k = 0; k < M; k++)
      if (backward_one(st, v, k)) break;
  } else {
    st->held = st->max_held = 0;
    int w = p->gpipe ? M : p->S - 1 - st->index;
    if (w > M) w = M;
    for (int k = 0; ok && k < w; k++) ok = !forward_one(st, v, k);
    for (int i = 0; ok && i < M - w; i++)
      ok = !forward_one(st, v, w + i) && !backward_one(st, v, i);
    for (int k = M - w; ok && k < M; k++) ok = !backward_one(st, v, k);
  }
  st->last_end = st_now();
}

static void *worker(void *arg) {
  pipe_stage *st = arg;
  pipe *p = st->p;
  long long seen = 0;
  for (;;) {
    if (st_wait_ge(&st->w, &p->generation, seen + 1, p->spin, &p->stop, NULL))
      return NULL; /* destroyed */
    seen = atomic_load(&p->generation);
    /* published before the generation */
    if (st->index >= p->lo && st->index < p->hi) run_phase(st, p->phase);
    atomic_fetch_add(&p->done, 1);
    st_waiter_wake(&p->w);
  }
}

/* ----------------------------------------------------------- the plan */

/* FLOP-balanced contiguous split into S runs, one core each (the fallback
 * when the compiler finds no plan): a small dynamic program minimising the
 * largest run's forward + backward FLOPs (measured blocks: seconds). */
static void balance(const st_block_cost *c, int n, int S, int *first,
                    int *count) {
  double *pre = calloc((size_t)n + 1, sizeof *pre);
  double *best = malloc((size_t)(S + 1) * (n + 1) * sizeof *best);
  int *from = malloc((size_t)(S + 1) * (n + 1) * sizeof *from);
  if (!pre || !best || !from) { /* an even split by count */
    for (int s = 0; s < S; s++) first[s] = s * n / S;
    goto done;
  }
  for (int i = 0; i < n; i++)
    pre[i + 1] = pre[i] + (c[i].measured_fwd + c[i].measured_bwd > 0
                               ? c[i].measured_fwd + c[i].measured_bwd
                               : c[i].flops_fwd + c[i].flops_bwd);
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
    first[s - 1] = i;
  }
#undef AT
done:
  for (int s = 0; s < S; s++)
    count[s] = (s + 1 < S ? first[s + 1] : n) - first[s];
  free(pre);
  free(best);
  free(from);
}

/* Splits blocks [0, n) of c into stages on `cores` cores as the compiler
 * plans it on fab (S = 0: the plan's choice): first/count/pes per stage;
 * returns the stage count. `shared`: more stages than cores, one thread
 * each. A model the planner cannot place (or no fab) falls back to the
 * FLOP balance with the cores shared evenly. */
static int split(const st_block_cost *c, int n, const st_fabric *fab, int S,
                 int cores, int shared, const st_int_list *pin, int *first,
                 int *count, int *pes) {
  st_plan_options opt = {.stages = S,
                         .samples_in_flight = 1,
                         .weight_versions = 1,
                         .algorithm = ST_PARTITION_AUTO};
  if (pin && pin->n > 0) { /* execution.stage_blocks */
    opt.stage_blocks = pin->v;
    opt.n_stage_blocks = pin->n;
  }
  st_plan *plan = NULL;
  st_error err = {0};
  if (fab && st_plan_build(&plan, c, n, fab, &opt, &err) == 0) {
    int k = plan->n_stages;
    for (int s = 0; s < k; s++) {
      first[s] = plan->stages[s].first;
      count[s] = plan->stages[s].count;
      pes[s] = (int)plan->stages[s].pes;
      if (shared || pes[s] < 1) pes[s] = 1;
    }
    st_plan_destroy(plan);
    return k;
  }
  if (S == 0) S = cores < n ? cores : n;
  if (pin && pin->n == S) /* validated against n by the caller */
    for (int s = 0, at = 0; s < S; at += pin->v[s++])
      first[s] = at, count[s] = pin->v[s];
  else
    balance(c, n, S, first, count);
  for (int s = 0; s < S; s++)
    pes[s] = shared || S > cores ? 1 : cores / S + (s < cores % S);
  return S;
}

/* The cpu fabric of `cores` cores (S of them when there are more stages)
 * in *fab, or NULL when it cannot be resolved (an unreadable calibration
 * profile). cpu: scratch space for the config it is resolved from. */
static st_fabric *plan_fabric(st_fabric *fab, st_config *cpu,
                              const st_config *cfg, int S, int cores) {
  st_error no_plan = {0};
  char spec[32];
  *cpu = *cfg;
  snprintf(spec, sizeof spec, "cpu:%d", S > cores ? S : cores);
  if (st_fabric_parse(cpu, spec, &no_plan) ||
      st_fabric_resolve(fab, cpu, &no_plan))
    return NULL;
  return fab;
}

int st_pipeline_check_pin(const st_config *cfg, int n, st_error *err) {
  const st_int_list *pin = &cfg->execution.stage_blocks;
  long long sum = 0;
  for (int s = 0; s < pin->n; s++) {
    if (pin->v[s] > n)
      return st_error_set(err, ST_ECONFIG,
                          "%s: execution.stage_blocks: entry %d is %d: the "
                          "model has %d blocks",
                          st_config_where(cfg, "execution.stage_blocks"), s,
                          pin->v[s], n);
    sum += pin->v[s];
  }
  if (pin->n > 0 && sum != n)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stage_blocks: the stages hold %lld "
                        "blocks in all; the model has %d",
                        st_config_where(cfg, "execution.stage_blocks"), sum,
                        n);
  return 0;
}

int st_pipeline_asked_stages(const st_config *cfg) {
  const st_int_list *pin = &cfg->execution.stage_blocks;
  return pin->n > 0 ? pin->n : cfg->execution.stages;
}

int st_pipeline_split(const st_model *m, const st_config *cfg, int S,
                      int cores, int *first, int *count, int *pes,
                      st_error *err) {
  int n = m->n_blocks;
  st_block_cost *c = malloc((size_t)n * sizeof *c);
  st_config *cpu = malloc(sizeof *cpu);
  int k = -1;
  if (!c || !cpu) {
    st_error_set(err, ST_ENOMEM, "out of memory");
  } else if (!st_pipeline_check_pin(cfg, n, err) &&
             !st_plan_block_costs(c, m, cfg, err)) {
    st_fabric fab, *on = plan_fabric(&fab, cpu, cfg, S, cores);
    k = split(c, n, on, S, cores, S > cores, &cfg->execution.stage_blocks,
              first, count, pes);
  }
  free(c);
  free(cpu);
  return k;
}

/* block_sequential segments: blocks_per_segment each, or (0) the fewest
 * runs of blocks whose weights, optimizer state and batch activations fit
 * the machine's memory. Returns the count; starts[g] is a first block. */
static int segment(const st_block_cost *c, int n, const st_fabric *fab,
                   int per, int batch, int *starts) {
  int g = 0;
  if (per > 0) {
    for (int b = 0; b < n; b += per) starts[g++] = b;
    return g;
  }
  double cap = (double)fab->pes * fab->pe_memory, used = 0;
  for (int b = 0; b < n; b++) {
    double need = c[b].param_bytes + c[b].state_bytes +
                  (c[b].act_bytes + c[b].in_bytes) * batch;
    if (b == 0 || used + need > cap) {
      starts[g++] = b;
      used = 0;
    }
    used += need;
  }
  return g;
}

/* ------------------------------------------------------- the executor */

static void pipe_destroy(void *state) {
  pipe *p = state;
  if (!p) return;
  atomic_store(&p->stop, 1);
  for (int s = 0; p->stages && s < p->S; s++)
    if (p->stages[s].started) st_waiter_wake_always(&p->stages[s].w);
  for (int s = 0; p->stages && s < p->S; s++) {
    pipe_stage *st = &p->stages[s];
    if (st->started) pthread_join(st->thread, NULL);
    if (st->leaky) { /* MPI may still read or write these */
      st->run = NULL;
      st->dgrad = NULL;
      st->rx_fwd = NULL;
      st->rx_bwd[0] = st->rx_bwd[1] = NULL;
    }
    for (int j = 0; st->run && j < st->slots; j++) st_stage_destroy(st->run[j]);
    free(st->run);
    free(st->in);
    st_free(st->probs);
    st_free(st->dlogits);
    for (int k = 0; st->dgrad && k < p->M; k++) st_free(st->dgrad[k]);
    free(st->dgrad);
    st_chan_free(&st->fwd);
    st_chan_free(&st->bwd);
    st_waiter_destroy(&st->w);
    st_pool_destroy(st->pool);
    /* links: after a whole step every request is done; after a stopped
     * one each was given up, its buffers kept (leaky, above) */
    for (int j = 0; st->rx_fwd && j < st->slots; j++) st_free(st->rx_fwd[j]);
    free(st->rx_fwd);
    free(st->rx_fwd_req);
    for (int j = 0; j < 2; j++) st_free(st->rx_bwd[j]);
    free(st->tx_fwd);
    free(st->tx_bwd);
  }
  free(p->stages);
  free(p->seg);
  st_stage_destroy(p->eval);
  pthread_mutex_destroy(&p->mu);
  st_waiter_destroy(&p->w);
  free(p);
}

/* The stages of both modes: S stages per segment (0: the plan's), every
 * stage's blocks, cores and cpu offset, in p->stages and p->seg. */
static int lay_out(pipe *p, const st_config *cfg, int blockseq, int cores,
                   st_error *err) {
  const st_model *m = p->model;
  int n = m->n_blocks, S = st_pipeline_asked_stages(cfg), rc = 0;
  int per_block = S == ST_STAGES_PER_BLOCK;
  if (per_block) S = n;
  st_block_cost *c = malloc((size_t)n * sizeof *c);
  st_config *cpu = malloc(sizeof *cpu);
  int *starts = malloc(((size_t)n + 1) * sizeof *starts);
  int *first = malloc((size_t)n * 3 * sizeof *first);
  if (!c || !cpu || !starts || !first) {
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
    goto done;
  }
  int *count = first + n, *pes = first + 2 * n;
  if (!blockseq && (rc = st_pipeline_check_pin(cfg, n, err))) goto done;
  if ((rc = st_plan_block_costs(c, m, cfg, err))) goto done;
  /* The plan for this machine's cores, whatever fabric the config plans
   * for otherwise (a mesh is a what-if; a run runs here). More stages than
   * cores share them. A calibration profile that cannot be read leaves no
   * plan: the FLOP balance runs, as for a model the planner cannot place. */
  st_fabric fab, *plan_on = plan_fabric(&fab, cpu, cfg, S, cores);
  int per = cfg->execution.blocks_per_segment;
  if (blockseq && !per && !plan_on) per = n; /* no memory figure: one */
  int G = blockseq ? segment(c, n, plan_on, per, cfg->train.batch, starts)
                   : (starts[0] = 0, 1);
  starts[G] = n;
  if (blockseq && cfg->execution.blocks_per_segment > 0 && !per_block &&
      S > cfg->execution.blocks_per_segment) {
    rc = st_error_set(err, ST_ECONFIG,
                      "%s: execution.stages: %d stages in segments of %d "
                      "blocks (execution.blocks_per_segment); each stage "
                      "needs at least one block",
                      st_config_where(cfg, "execution.stages"), S,
                      cfg->execution.blocks_per_segment);
    goto done;
  }
  p->segments = G;
  p->seg = calloc((size_t)G + 1, sizeof *p->seg);
  p->stages = calloc((size_t)n, sizeof *p->stages); /* at most one a block */
  if (!p->seg || !p->stages) {
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
    goto done;
  }
  int total = 0;
  for (int g = 0; g < G; g++) {
    int b0 = starts[g], nb = starts[g + 1] - b0;
    int want = S == 0 && blockseq ? (cores < nb ? cores : nb)
               : S > nb           ? nb
                                  : S;
    int k = split(c + b0, nb, plan_on, want, cores, S > cores,
                  blockseq ? NULL : &cfg->execution.stage_blocks, first, count,
                  pes);
    p->seg[g] = total;
    for (int s = 0, off = 0; s < k; s++, total++) {
      pipe_stage *st = &p->stages[total];
      st->p = p;
      st->index = total;
      st->first = b0 + first[s];
      st->count = count[s];
      st->cores = pes[s];
      st->cpu_off = off;
      st->local = 1;
      off += pes[s];
      if (blockseq)
        snprintf(st->name, sizeof st->name, "segment %d stage %d", g, s);
      else
        snprintf(st->name, sizeof st->name, "stage %d", s);
    }
  }
  p->seg[G] = total;
  p->S = total;
  for (int i = 0; i < total; i++) st_waiter_init(&p->stages[i].w);
done:
  free(c);
  free(cpu);
  free(starts);
  free(first);
  return rc;
}

/* Pins each stage (its thread and its pool) to cpus[cpu_off, +cores). */
static int pin(pipe *p, const int *cpus, int n) {
  for (int s = 0; s < p->S; s++)
    if (p->stages[s].cpu_off + p->stages[s].cores > n) return -1;
  int rc = 0;
  for (int s = 0; s < p->S; s++) {
    pipe_stage *st = &p->stages[s];
    const int *mine = cpus + st->cpu_off;
    if (st_pin_thread(st->thread, mine, st->cores) ||
        st_pool_pin(st->pool, mine, st->cores))
      rc = -1;
  }
  return rc;
}

int st_pipeline_pin(void *state, const int *cpus, int n) {
  return pin(state, cpus, n);
}

/* Placed over ranks: each segment's k stages go to the members in order,
 * stage s to member s * P / k, and this rank's stages in a segment share
 * its `threads` cores; the links to other ranks' stages are marked. */
static void place(pipe *p, const st_placement *pl) {
  int P = st_dist_group_size(pl->group);
  for (int g = 0; g < p->segments; g++) {
    int lo = p->seg[g], k = p->seg[g + 1] - lo, mine = 0;
    for (int s = lo; s < lo + k; s++) {
      pipe_stage *st = &p->stages[s];
      st->owner = st_placed_owner(s - lo, k, P);
      st->local = st->owner == p->me;
      mine += st->local;
    }
    for (int s = lo, off = 0, i = 0; s < lo + k; s++) {
      pipe_stage *st = &p->stages[s];
      if (!st->local) continue;
      int share = pl->threads / mine + (i++ < pl->threads % mine);
      st->cores = share > 0 ? share : 1;
      st->cpu_off = off;
      off += st->cores;
    }
  }
  for (int s = 0; s < p->S; s++) {
    pipe_stage *st = &p->stages[s];
    st->remote_prev = st->local && s > 0 && p->stages[s - 1].owner != p->me;
    st->remote_next =
        st->local && s < p->S - 1 && p->stages[s + 1].owner != p->me;
    snprintf(st->name + strlen(st->name),
             sizeof st->name - strlen(st->name), " (rank %d)",
             st_dist_group_world(pl->group, st->owner));
  }
}

/* A placed stage's link buffers and requests. */
static int alloc_links(pipe *p, pipe_stage *st) {
  int ok = 1;
  if (st->remote_prev) {
    size_t bytes = link_bytes(p, st->index);
    st->rx_fwd = calloc((size_t)st->slots, sizeof *st->rx_fwd);
    st->rx_fwd_req = calloc((size_t)st->slots, sizeof *st->rx_fwd_req);
    st->tx_bwd = calloc((size_t)p->M, sizeof *st->tx_bwd);
    ok = st->rx_fwd && st->rx_fwd_req && st->tx_bwd;
    for (int j = 0; ok && j < st->slots; j++)
      ok = (st->rx_fwd[j] = st_alloc(bytes)) != NULL;
  }
  if (ok && st->remote_next) {
    size_t bytes = link_bytes(p, st->index + 1);
    st->tx_fwd = calloc((size_t)st->slots, sizeof *st->tx_fwd);
    ok = st->tx_fwd && (st->rx_bwd[0] = st_alloc(bytes)) &&
         (st->rx_bwd[1] = st_alloc(bytes));
  }
  return ok;
}

static int create(void **state, const st_model *m, const st_config *cfg,
                  int micro_batch, int max_batch, int blockseq,
                  const st_placement *pl, st_error *err) {
  *state = NULL;
  int S = st_pipeline_asked_stages(cfg);
  int cores = cfg->train.threads > 0 ? cfg->train.threads : st_usable_cores();
  /* over ranks, the cut of S stages on one core each (the threaded run's
   * cut when it has no more cores than stages); 0: a stage per rank */
  if (pl)
    cores = S == ST_STAGES_PER_BLOCK ? m->n_blocks
            : S > 0                 ? S
                                    : st_dist_group_size(pl->group);
  if (!blockseq && st_pipeline_check_pin(cfg, m->n_blocks, err))
    return err->code;
  if (S > m->n_blocks && S != ST_STAGES_PER_BLOCK)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stages: %d stages for a model of %d "
                        "blocks; each stage needs at least one block",
                        st_config_where(cfg, "execution.stages"), S,
                        m->n_blocks);
  if (cfg->metrics.noise_scale)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: metrics.noise_scale is not available in the "
                        "%s mode yet",
                        st_config_where(cfg, "metrics.noise_scale"),
                        cfg->execution.mode);
  pipe *p = calloc(1, sizeof *p);
  if (!p) return st_error_set(err, ST_ENOMEM, "out of memory");
  pthread_mutex_init(&p->mu, NULL);
  st_waiter_init(&p->w);
  p->model = m;
  p->mb = micro_batch;
  p->M = cfg->train.batch / micro_batch;
  p->blockseq = blockseq;
  p->gpipe = blockseq || strcmp(cfg->execution.schedule, "gpipe") == 0;
  int rc = lay_out(p, cfg, blockseq, cores, err);
  if (!rc && pl) {
    p->group = pl->group;
    p->me = st_dist_group_rank(pl->group);
    place(p, pl);
    int P = st_dist_group_size(pl->group);
    if (!blockseq && p->S < P)
      rc = st_error_set(err, ST_ECONFIG,
                        "%s: %s: %d stages over %d ranks "
                        "(execution.placement: ranks): each rank needs a "
                        "stage",
                        st_config_where(cfg, st_stages_key(cfg)),
                        st_stages_key(cfg), p->S, P);
  }
  if (rc) {
    pipe_destroy(p);
    return rc;
  }
  /* Spin before sleeping only when every stage thread has a core of its
   * own (over ranks: when the ranks on this machine have one each). */
  int threads = 0;
  for (int s = 0; s < p->S; s++)
    if (p->stages[s].local) threads += p->stages[s].cores;
  p->spin = threads <= st_usable_cores() ? ST_SPIN : 0;
  if (pl) p->spin = st_dist_local_size() <= st_usable_cores() ? ST_SPIN : 0;
  int ok = 1, R = m->label_rows;
  size_t per_mb = (size_t)micro_batch * R * m->classes;
  for (int s = 0; ok && s < p->S; s++) {
    pipe_stage *st = &p->stages[s];
    /* 1f1b: stage s of its pipeline holds at most S - s micro-batches */
    int w = p->gpipe ? p->M : p->S - s;
    st->slots = w < p->M ? w : p->M;
    if (!st->local) continue; /* another rank's */
    st->pool = st_pool_create(st->cores);
    st->run = calloc((size_t)st->slots, sizeof *st->run);
    st->in = calloc((size_t)st->slots, sizeof *st->in);
    ok = st->pool && st->run && st->in && !st_chan_init(&st->fwd, p->M) &&
         !st_chan_init(&st->bwd, p->M);
    for (int j = 0; ok && j < st->slots; j++)
      ok = (rc = st_stage_create(&st->run[j], m, st->first, st->count,
                                 micro_batch, err)) == 0;
    if (ok && s == p->S - 1) {
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
    if (ok) ok = alloc_links(p, st);
  }
  if (ok)
    ok = (rc = st_stage_create(&p->eval, m, 0, m->n_blocks, max_batch,
                               err)) == 0;
  for (int s = 0; ok && s < p->S; s++) {
    if (!p->stages[s].local) continue;
    ok = pthread_create(&p->stages[s].thread, NULL, worker, &p->stages[s]) == 0;
    p->stages[s].started = ok;
  }
  if (!ok) {
    pipe_destroy(p);
    return rc ? rc
              : st_error_set(err, ST_ENOMEM,
                             "out of memory or threads for a %d-stage "
                             "pipeline",
                             p->S);
  }
  /* Pinned when every stage's cores are real cpus of this process; more
   * stages or threads than cpus share them, unpinned. */
  if (cfg->execution.pin && !pl) {
    int cpus[CPU_SETSIZE], n = st_usable_cpus(cpus, CPU_SETSIZE);
    if (cores <= n) pin(p, cpus, cores);
  }
  *state = p;
  return 0;
}

static int pipe_create(void **state, const st_model *m, const st_config *cfg,
                       int micro_batch, int max_batch, st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, 0, NULL, err);
}

static int blockseq_create(void **state, const st_model *m,
                           const st_config *cfg, int micro_batch,
                           int max_batch, st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, 1, NULL, err);
}

int st_pipeline_create_placed(void **state, const st_model *m,
                              const st_config *cfg, int micro_batch,
                              int max_batch, int blockseq,
                              const st_placement *pl, st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, blockseq, pl, err);
}

int st_pipeline_layout(const void *state, int *first, int *count,
                       int *owner) {
  const pipe *p = state;
  for (int s = 0; s < p->S; s++) {
    first[s] = p->stages[s].first;
    count[s] = p->stages[s].count;
    owner[s] = p->stages[s].owner;
  }
  return p->S;
}

/* Runs one phase on stages [lo, hi) and waits for every worker of this
 * rank to have seen it; returns the step's error code. */
static int run_on(pipe *p, int ph, int lo, int hi) {
  int mine = 0; /* workers of this rank (all, in one process) */
  for (int s = 0; s < p->S; s++) mine += p->stages[s].local;
  p->phase = ph;
  p->lo = lo;
  p->hi = hi;
  atomic_store(&p->done, 0);
  atomic_fetch_add(&p->generation, 1);
  for (int s = 0; s < p->S; s++)
    if (p->stages[s].local) st_waiter_wake(&p->stages[s].w);
  /* the caller sleeps: the stages have the cores */
  st_wait_ge(&p->w, &p->done, mine, 0, NULL, NULL);
  return p->rc ? p->rc : p->peer_stop ? ST_EXEC_PEER_STOPPED : 0;
}

/* After a step over ranks: every send done, or, when the step stopped (or
 * a send failed), an empty message in place of each gradient a stage on
 * another rank still waits for, and every request given up: the pipeline
 * cannot go on, and the buffers of those requests are never freed. */
static int finish_links(pipe *p, int stopped, st_error *err) {
  static const float none[1];
  int rc = 0;
  for (int s = 0; !stopped && s < p->S; s++) {
    pipe_stage *st = &p->stages[s];
    for (int j = 0; !rc && st->local && st->remote_next && j < st->slots; j++)
      rc = st_dist_wait(&st->tx_fwd[j], NULL, NULL, err);
    for (int k = 0; !rc && st->local && st->remote_prev && k < p->M; k++)
      rc = st_dist_wait(&st->tx_bwd[k], NULL, NULL, err);
    stopped = rc != 0;
  }
  if (!stopped) return 0;
  for (int s = 0; s < p->S; s++) {
    pipe_stage *st = &p->stages[s];
    if (!st->local) continue;
    for (int j = 0; st->tx_fwd && j < st->slots; j++)
      st->leaky |= st_dist_forget(&st->tx_fwd[j]);
    for (int k = 0; st->tx_bwd && k < p->M; k++)
      st->leaky |= st_dist_forget(&st->tx_bwd[k]);
    for (int j = 0; st->rx_fwd_req && j < st->slots; j++)
      st->leaky |= st_dist_forget(&st->rx_fwd_req[j]);
    for (int j = 0; j < 2; j++) st->leaky |= st_dist_forget(&st->rx_bwd_req[j]);
    if (st->remote_prev && st->bwd_sent < p->M) {
      st_dist_req r = {0};
      st_error ignored = {0};
      if (!st_dist_isend(p->group, CH_BWD, none, 0,
                         p->stages[s - 1].owner, s - 1, &r, &ignored))
        st_dist_forget(&r);
    }
  }
  p->broken = 1;
  return rc;
}

static int pipe_step(void *state, st_trainer_view *v, double *loss,
                     st_error *err) {
  pipe *p = state;
  if (p->broken)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "the pipeline across ranks stopped at an earlier "
                        "error; it cannot go on");
  double t0 = st_now();
  p->v = v;
  atomic_store(&p->stopped, 0);
  p->rc = 0;
  for (int s = 0; s < p->S; s++) {
    st_chan_reset(&p->stages[s].fwd);
    st_chan_reset(&p->stages[s].bwd);
    p->stages[s].bwd_sent = 0;
  }
  int rc = 0;
  if (!p->blockseq) {
    rc = run_on(p, PHASE_ALL, 0, p->S);
  } else {
    /* block_sequential: every segment's forwards, then the backwards from
     * the last segment down; the loss is checked in the last forward */
    for (int g = 0; !rc && g < p->segments; g++)
      rc = run_on(p, PHASE_FORWARD, p->seg[g], p->seg[g + 1]);
    for (int g = p->segments - 1; !rc && g >= 0; g--)
      rc = run_on(p, PHASE_BACKWARD, p->seg[g], p->seg[g + 1]);
  }
  if (rc && rc != ST_EXEC_PEER_STOPPED) *err = p->err;
  if (rc == ST_EXEC_PEER_STOPPED)
    st_error_set(err, ST_EIO, "stopped by a stage on another rank");
  if (p->group) {
    int frc = finish_links(p, rc != 0, err);
    if (!rc) rc = frc;
  }
  if (!rc) *loss = p->loss;
  p->wall += st_now() - t0;
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

int st_pipeline_cores(const void *state, int stage) {
  const pipe *p = state;
  return stage >= 0 && stage < p->S ? p->stages[stage].cores : -1;
}

int st_pipeline_stages(const void *state, int *first, int *count) {
  const pipe *p = state;
  for (int s = 0; s < p->S; s++) {
    if (first) first[s] = p->stages[s].first;
    if (count) count[s] = p->stages[s].count;
  }
  return p->S;
}

/* The plan's stage count: per segment for block_sequential (the most). */
static int pipe_stage_count(void *state) {
  const pipe *p = state;
  int most = 0;
  for (int g = 0; g < p->segments; g++)
    if (p->seg[g + 1] - p->seg[g] > most) most = p->seg[g + 1] - p->seg[g];
  return most;
}

/* Busy seconds are read between steps, when no worker writes them. */
static int pipe_stats(void *state, st_track_stats *out, int cap,
                      double *wall) {
  pipe *p = state;
  *wall = p->wall;
  int n = 0; /* this rank's stages */
  for (int s = 0; s < p->S; s++) {
    const pipe_stage *st = &p->stages[s];
    if (!st->local) continue;
    if (n < cap) {
      snprintf(out[n].name, sizeof out[n].name, "%s", st->name);
      out[n].first = st->first;
      out[n].count = st->count;
      out[n].busy_s = st->busy;
      out[n].bound_s = 0;
    }
    n++;
  }
  return n;
}

const st_executor st_exec_pipeline = {
    .mode = "pipeline",
    .step = pipe_step,
    .forward = pipe_forward,
    .create = pipe_create,
    .destroy = pipe_destroy,
    .stages = pipe_stage_count,
    .stats = pipe_stats,
};

const st_executor st_exec_block_sequential = {
    .mode = "block_sequential",
    .step = pipe_step,
    .forward = pipe_forward,
    .create = blockseq_create,
    .destroy = pipe_destroy,
    .stages = pipe_stage_count,
    .stats = pipe_stats,
};
