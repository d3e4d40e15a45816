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

#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct pipe_stage {
  st_rt_stage rt; /* first: the runtime's part (cores, slots, links) */
  struct pipe *p;
  int worker;            /* its chunk c is pipeline stage worker + c S */
  float *probs;          /* last stage: slots x mb x R x out_cols */
  float *dlogits;        /* last stage: mb x R x out_cols */
  float **dgrad;         /* [M] input gradients (stages > 0) */
  float **own_in;        /* split backward, stages > 0: [slots] each slot's
                            input, kept until its W (the sender's buffer
                            may be reused once B has answered it) */
  int bwd_sent;          /* over ranks: of them, sent this step */
  int tie_copies;        /* split backward: other stages holding copies of
                            tensors tied to this stage's (a GPT's head),
                            whose last W must be done before it updates */
  int tie_source;        /* the stage whose tensor this one holds a copy
                            of, else -1 */
  int held, max_held;    /* micro-batches in flight, and the most this step */
  int track;             /* its trace track: its place among this process's
                            stages, the order st_rt_stats names them in */
  uint32_t jitter_state; /* test knob: this stage's sleep stream */
} pipe_stage;

enum { PHASE_ALL, PHASE_FORWARD, PHASE_BACKWARD };

typedef struct pipe {
  st_rt rt; /* the stages' runtime: S, mb, errors, links */
  int M, blockseq;
  int workers;       /* threads (or ranks' stage threads): S; rt.S = S V */
  int V;             /* chunks a worker (interleaved), else 1 */
  st_schedule sched; /* pipeline: each worker's ops (runtime/schedule.c) */
  int segments;      /* block_sequential: G segments; pipeline: 1 */
  int *seg;          /* [G + 1]: segment g runs stages [seg[g], seg[g+1]) */
  pipe_stage *stages;
  st_stage *eval; /* all blocks, for inference batches */
  /* step control: the caller publishes a view and a phase over stages
   * [lo, hi), then bumps `generation`; every worker of this rank looks,
   * those in range run it, and all count themselves done */
  atomic_llong generation, done;
  atomic_llong copies_done; /* split backward: tie copies' last Ws, this
                               step (their gradients are complete) */
  int phase, lo, hi;
  int jitter_us; /* test knob: sleep up to this long before each op */
  st_trainer_view *v;
  double loss, wall;
  int broken;
} pipe;

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
  st_rt_stage *r = &st->rt;
  jitter(st);
  const st_model *m = p->rt.model;
  int slot = k % r->slots, mb = p->rt.mb, R = m->label_rows;
  const float *in = r->index == 0
                        ? v->x + (size_t)k * mb * st_shape_numel(m->in)
                        : st_rt_recv(r, v, ST_RT_FWD, k);
  if (!in) return -1;
  /* the slot's output goes to another rank: its last send is done */
  if (st_rt_reuse(r, ST_RT_FWD, k)) return -1;
  double t0 = st_now();
  if (st->own_in) { /* kept until W; the buffer it came in is free */
    size_t n = (size_t)mb * st_shape_numel(m->blocks[r->first].in);
    memcpy(st->own_in[slot], in, n * sizeof *in);
    in = st->own_in[slot];
    if (r->remote_prev && k + r->slots < p->M &&
        st_rt_post(r, ST_RT_FWD, k + r->slots))
      return -1;
  }
  r->in[slot] = in;
  if (++st->held > st->max_held) st->max_held = st->held;
  st_ctx ctx = st_rt_ctx(v, (int64_t)k * mb);
  const float *out = st_stage_forward(r->run[slot], &ctx, v->params, in, mb);
  if (r->index < p->rt.S - 1) {
    st_rt_trace(v, ST_TRACE_FORWARD, k, t0, st_now());
    int rc = st_rt_send(r, v, ST_RT_FWD, k, out);
    r->busy += st_now() - t0;
    return rc;
  }
  size_t per = (size_t)mb * R * m->out_cols;
  st_rt_loss(v, ctx.pool, k, mb, out, st->probs + (size_t)slot * per);
  double t1 = st_now();
  st_rt_trace(v, ST_TRACE_FORWARD, k, t0, t1);
  r->busy += t1 - t0;
  if (k == p->M - 1) {
    /* every loss of the batch is known; no weight has changed yet */
    double loss;
    st_error err = {0};
    if (st_trainer_check_loss(v, &loss, &err)) {
      st_rt_fail(&p->rt, &err);
      return -1;
    }
    p->loss = loss;
  }
  return 0;
}

/* Micro-batch k's backward at this stage: whole (BW), or its B half alone
 * (the input gradient, sent on; the slot stays held for W). */
static int backward_one(pipe_stage *st, st_trainer_view *v, int k,
                        int input_only) {
  pipe *p = st->p;
  st_rt_stage *r = &st->rt;
  jitter(st);
  const st_model *m = p->rt.model;
  int slot = k % r->slots, mb = p->rt.mb, R = m->label_rows;
  const float *dout;
  double t0;
  if (r->index == p->rt.S - 1) {
    t0 = st_now();
    size_t per = (size_t)mb * R * m->out_cols;
    st_rt_loss_grad(v, v->ctx.pool, k, mb, v->loss_batch,
                    st->probs + (size_t)slot * per, st->dlogits);
    dout = st->dlogits;
  } else {
    if (!(dout = st_rt_recv(r, v, ST_RT_BWD, k))) return -1;
    t0 = st_now();
  }
  float *din = r->index == 0 ? NULL : st->dgrad[k];
  int last = k == p->M - 1;
  if (input_only) {
    st_stage_backward_input(r->run[slot], &v->ctx, v->params, r->in[slot], dout,
                            din, mb);
  } else {
    st_stage_backward_each(
        r->run[slot], &v->ctx, v->params, v->grads, r->in[slot], dout, din, mb,
        last && !v->grads_only ? st_exec_update_block : NULL, v);
    st->held--;
  }
  st_rt_trace(v, ST_TRACE_BACKWARD, k, t0, st_now());
  int rc = 0;
  /* the buffers just read are free: post the receives that reuse them (a
   * split backward's input slot is posted again by its forward) */
  if (r->remote_next && k + r->rx_ring < p->M)
    rc = st_rt_post(r, ST_RT_BWD, k + r->rx_ring);
  if (!rc && !st->own_in && r->remote_prev && k + r->slots < p->M)
    rc = st_rt_post(r, ST_RT_FWD, k + r->slots);
  if (!rc && r->index > 0) {
    rc = st_rt_send(r, v, ST_RT_BWD, k, din);
    st->bwd_sent += !rc;
  }
  r->busy += st_now() - t0;
  return rc;
}

/* Micro-batch k's W half: the weight gradients its B left, then (the
 * last micro-batch) each block's update; the slot is free after it. */
static int weights_one(pipe_stage *st, st_trainer_view *v, int k) {
  pipe *p = st->p;
  st_rt_stage *r = &st->rt;
  jitter(st);
  int slot = k % r->slots, last = k == p->M - 1;
  /* a tied tensor is updated with its copies' gradients: their last W
   * (on another stage, not ordered before this one by the schedule) first;
   * the wait is idle, not this W's work (its span and busy time start
   * after it, as a forward's start after its receive) */
  if (last && st->tie_copies &&
      st_wait_ge(&r->w, &p->copies_done, st->tie_copies, p->rt.spin,
                 &p->rt.abort, &p->rt.stop))
    return -1;
  double t0 = st_now();
  st_stage_backward_weights_each(
      r->run[slot], &v->ctx, v->params, v->grads, r->in[slot], p->rt.mb,
      last && !v->grads_only ? st_exec_update_block : NULL, v);
  st->held--;
  double t1 = st_now(); /* before the source may start its own W */
  if (last && st->tie_source >= 0) {
    atomic_fetch_add(&p->copies_done, 1);
    st_waiter_wake(&p->stages[st->tie_source].rt.w);
  }
  st_rt_trace(v, ST_TRACE_WEIGHT, k, t0, t1);
  r->busy += t1 - t0;
  return 0;
}

/* One op of the worker's schedule, on the chunk's stage. A batch of one
 * sample updates inside the backward (a fused update): there B runs the
 * whole backward and W has nothing left. */
static int run_op(pipe_stage *st, st_trainer_view *v, const st_sched_op *o) {
  int split = st->p->sched.split && !v->ctx.fused;
  switch (o->kind) {
  case ST_PASS_F:
    return forward_one(st, v, o->mb);
  case ST_PASS_BW:
    return backward_one(st, v, o->mb, 0);
  case ST_PASS_B:
    return backward_one(st, v, o->mb, split);
  case ST_PASS_W:
    return split ? weights_one(st, v, o->mb) : 0;
  }
  return -1;
}

/* Posts the receives a stage's step starts with, over ranks: every free
 * input slot, and the first gradients. */
static int post_ahead(st_rt_stage *r, int M, int phase) {
  int ok = 1;
  if (phase != PHASE_BACKWARD && r->remote_prev)
    for (int k = 0; ok && k < r->slots && k < M; k++)
      ok = !st_rt_post(r, ST_RT_FWD, k);
  if (phase != PHASE_FORWARD && r->remote_next)
    for (int k = 0; ok && k < r->rx_ring && k < M; k++)
      ok = !st_rt_post(r, ST_RT_BWD, k);
  return ok;
}

/* A worker's part of the step: its chunks' stages (one, but for
 * interleaved), its schedule's ops in order; block_sequential's phases
 * run every forward, or every backward, of its one stage. */
static void run_phase(pipe_stage *st, int phase) {
  pipe *p = st->p;
  st_rt_stage *r = &st->rt;
  st_trainer_view view = *p->v, *v = &view; /* with this worker's pool */
  view.ctx.pool = r->pool;
  view.track = p->v->track + st->track;
  double now = st_now();
  /* (a replica's gaps hold the caller's all-reduce: not marked idle) */
  if (r->last_end > 0 && !v->grads_only)
    st_rt_trace(v, ST_TRACE_IDLE, -1, r->last_end, now);
  int M = p->M, V = p->sched.V > 0 ? p->sched.V : 1, ok = 1;
  for (int c = 0; c < V; c++) {
    pipe_stage *cs = &p->stages[st->worker + c * p->workers];
    if (phase != PHASE_BACKWARD) cs->held = cs->max_held = 0;
    ok = ok && post_ahead(&cs->rt, M, phase);
  }
  if (!ok) {
    /* nothing runs */
  } else if (phase == PHASE_FORWARD) {
    for (int k = 0; k < M; k++)
      if (forward_one(st, v, k)) break;
  } else if (phase == PHASE_BACKWARD) {
    for (int k = 0; k < M; k++)
      if (backward_one(st, v, k, 0)) break;
  } else {
    const st_schedule *s = &p->sched;
    for (int i = s->start[st->worker]; ok && i < s->start[st->worker + 1];
         i++) {
      const st_sched_op *o = &s->ops[i];
      pipe_stage *cs = &p->stages[st->worker + o->chunk * p->workers];
      /* each chunk on its own track (only this thread writes to them) */
      view.track = p->v->track + cs->track;
      ok = !run_op(cs, v, o);
    }
  }
  r->last_end = st_now();
}

static void *worker(void *arg) {
  pipe_stage *st = arg;
  pipe *p = st->p;
  long long seen = 0;
  for (;;) {
    if (st_wait_ge(&st->rt.w, &p->generation, seen + 1, p->rt.spin, &p->rt.stop,
                   NULL))
      return NULL; /* destroyed */
    seen = atomic_load(&p->generation);
    st_fp_apply();
    /* published before the generation */
    if (st->rt.index >= p->lo && st->rt.index < p->hi) run_phase(st, p->phase);
    atomic_fetch_add(&p->done, 1);
    st_waiter_wake(&p->rt.w);
  }
}

/* ------------------------------------------------------- the executor */

/* n buffers of `floats` each, or NULL (nothing left allocated). */
static float **buffers(int n, size_t floats) {
  float **b = calloc((size_t)n, sizeof *b);
  int ok = b != NULL;
  for (int i = 0; ok && i < n; i++)
    ok = (b[i] = st_alloc(floats * sizeof(float))) != NULL;
  if (ok) return b;
  for (int i = 0; b && i < n; i++) st_free(b[i]);
  free(b);
  return NULL;
}

static void free_buffers(float **b, int n) {
  for (int i = 0; b && i < n; i++) st_free(b[i]);
  free(b);
}

static void pipe_destroy(void *state) {
  pipe *p = state;
  if (!p) return;
  if (p->stages) st_rt_stop_threads(&p->rt);
  for (int s = 0; p->stages && s < p->rt.S; s++) {
    pipe_stage *st = &p->stages[s];
    if (st->rt.leaky) st->dgrad = NULL; /* MPI may still read these */
    st_free(st->probs);
    st_free(st->dlogits);
    free_buffers(st->dgrad, p->M);
    free_buffers(st->own_in, st->rt.slots);
    st_rt_stage_free(&st->rt);
  }
  free(p->stages);
  free(p->seg);
  st_schedule_free(&p->sched);
  st_stage_destroy(p->eval);
  st_rt_free(&p->rt);
  free(p);
}

/* interleaved: S workers of V chunks each. The compiler's plan cuts S V
 * chunks (one core each: every worker runs V of them in turn); chunk v of
 * worker k is pipeline stage k + v S and shares the worker's thread, pool
 * and cores. */
static int lay_out_chunks(pipe *p, const st_config *cfg, const st_block_cost *c,
                          int S, int cores, int *first, int *count, int *pes,
                          st_error *err) {
  const st_model *m = p->rt.model;
  int n = m->n_blocks, V = p->V;
  const char *key = st_config_where(cfg, "execution.virtual_stages");
  if (S == ST_STAGES_PER_BLOCK)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stages: per_block with the interleaved "
                        "schedule; give a number of stage workers",
                        st_config_where(cfg, "execution.stages"));
  st_config *cpu = malloc(sizeof *cpu);
  if (!cpu) return st_error_set(err, ST_ENOMEM, "out of memory");
  st_fabric fab, *plan_on;
  if (S == 0) {
    /* the plan's count of workers, chosen as `strata compile` chooses it
     * (interleaved's fill and drain of V chunks a worker, at most n / V
     * workers); no plan: one a core, as many as the blocks allow */
    plan_on = st_cut_fabric(&fab, cpu, cfg, 0, cores);
    S = st_cut_split(c, n, plan_on, 0, cores, 0, NULL, cfg, first, count, pes);
    if (S > n / V) S = n / V;
  }
  if (S < 1 || (long)S * V > n) {
    free(cpu);
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.virtual_stages: %d chunks for each of "
                        "%d stage workers need %d blocks; the model has %d",
                        key, V, S > 0 ? S : 1, (S > 0 ? S : 1) * V, n);
  }
  int J = S * V;
  if (cfg->execution.stage_blocks.n > 0 && cfg->execution.stage_blocks.n != J) {
    free(cpu);
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stage_blocks: %d entries; the "
                        "interleaved schedule cuts %d chunks (execution.stages "
                        "x execution.virtual_stages)",
                        st_config_where(cfg, "execution.stage_blocks"),
                        cfg->execution.stage_blocks.n, J);
  }
  plan_on = st_cut_fabric(&fab, cpu, cfg, J, J);
  int k = st_cut_split(c, n, plan_on, J, J, 1, &cfg->execution.stage_blocks,
                       NULL, first, count, pes);
  free(cpu);
  if (k != J)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "internal error: the plan cut %d chunks, not %d", k, J);
  p->workers = S;
  p->segments = 1;
  p->seg = calloc(2, sizeof *p->seg);
  p->stages = calloc((size_t)J, sizeof *p->stages);
  if (!p->seg || !p->stages)
    return st_error_set(err, ST_ENOMEM, "out of memory");
  for (int j = 0, off = 0; j < J; j++) {
    pipe_stage *ps = &p->stages[j];
    st_rt_stage *st = &ps->rt;
    int w = j % S, v = j / S;
    ps->p = p;
    ps->worker = w;
    p->rt.st[j] = st;
    st->rt = &p->rt;
    st->index = j;
    st->first = first[j];
    st->count = count[j];
    st->cores = cores / S + (w < cores % S);
    if (st->cores < 1) st->cores = 1;
    st->cpu_off = v == 0 ? off : p->stages[w].rt.cpu_off;
    if (v == 0) off += st->cores;
    st->local = 1;
    st->threadless = v > 0;
    snprintf(st->name, sizeof st->name, "stage %d chunk %d", w, v);
  }
  p->seg[1] = J;
  p->rt.S = J;
  return 0;
}

/* The stages of both modes: S stages per segment (0: the plan's), every
 * stage's blocks, cores and cpu offset, in p->stages and p->seg. */
static int lay_out(pipe *p, const st_config *cfg, int blockseq, int S,
                   int cores, st_error *err) {
  const st_model *m = p->rt.model;
  int n = m->n_blocks, rc = 0;
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
  if (p->V > 1) {
    rc = lay_out_chunks(p, cfg, c, S, cores, first, count, pes, err);
    goto done;
  }
  /* The plan for this machine's cores, whatever fabric the config plans
   * for otherwise (a mesh is a what-if; a run runs here). More stages than
   * cores share them. A calibration profile that cannot be read leaves no
   * plan: the FLOP balance runs, as for a model the planner cannot place. */
  st_fabric fab, *plan_on = st_cut_fabric(&fab, cpu, cfg, S, cores);
  int per = cfg->execution.blocks_per_segment;
  if (blockseq && !per && !plan_on) per = n; /* no memory figure: one */
  int G = blockseq
              ? st_cut_segments(c, n, plan_on, per, cfg->train.batch, starts)
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
    /* S = 0: the plan's stage count, chosen as `strata compile` chooses
     * it (block_sequential: by gpipe's fill and drain of its segment) */
    int want = S > nb ? nb : S;
    int k = st_cut_split(c + b0, nb, plan_on, want, cores, S > cores,
                         blockseq ? NULL : &cfg->execution.stage_blocks, cfg,
                         first, count, pes);
    p->seg[g] = total;
    for (int s = 0, off = 0; s < k; s++, total++) {
      pipe_stage *ps = &p->stages[total];
      st_rt_stage *st = &ps->rt;
      ps->p = p;
      ps->worker = total;
      p->rt.st[total] = st;
      st->rt = &p->rt;
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
  p->rt.S = total;
  p->workers = total;
done:
  free(c);
  free(cpu);
  free(starts);
  free(first);
  return rc;
}

/* Which stages hold copies of a tensor another stage holds (model.tied:
 * a GPT's head shares the token embedding): the source's update needs the
 * copies' gradients, complete only after their stages' last backward. */
static void mark_ties(pipe *p) {
  const st_model *m = p->rt.model;
  for (int s = 0; s < p->rt.S; s++) p->stages[s].tie_source = -1;
  for (int s = 0; s < p->rt.S; s++) {
    st_rt_stage *r = &p->stages[s].rt;
    for (int b = r->first; b < r->first + r->count; b++)
      for (int t = 0; t < m->blocks[b].n_tensors; t++) {
        long tie = m->blocks[b].tensors[t].tie;
        if (tie < 0) continue;
        for (int src = 0; src < p->rt.S; src++) {
          const st_rt_stage *o = &p->stages[src].rt;
          size_t lo = m->blocks[o->first].param_off;
          size_t hi = m->blocks[o->first + o->count - 1].param_off +
                      m->blocks[o->first + o->count - 1].n_params;
          if (src != s && (size_t)tie >= lo && (size_t)tie < hi &&
              p->stages[s].tie_source < 0) {
            p->stages[s].tie_source = src;
            p->stages[src].tie_copies++;
          }
        }
      }
  }
}

int st_pipeline_pin(void *state, const int *cpus, int n) {
  return st_rt_pin(&((pipe *)state)->rt, cpus, n);
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
            : S > 0                  ? S
                                     : st_dist_group_size(pl->group);
  /* over ranks a pipeline's stages: 0 is one a rank (the plan's own choice
   * could leave a rank without one) */
  if (pl && !blockseq && S == 0) {
    S = cores;
    if (S > m->n_blocks)
      return st_error_set(err, ST_ECONFIG,
                          "%s: execution.stages: 0, one stage for each of %d "
                          "ranks (execution.placement: ranks), but the model "
                          "has %d blocks; each stage needs at least one",
                          st_config_where(cfg, "execution.stages"), S,
                          m->n_blocks);
  }
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
  if (st_rt_init(&p->rt, m, micro_batch, m->n_blocks, cfg->execution.mode)) {
    pipe_destroy(p);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  p->M = cfg->train.batch / micro_batch;
  p->blockseq = blockseq;
  p->V = !blockseq && !strcmp(cfg->execution.schedule, "interleaved")
             ? cfg->execution.virtual_stages
             : 1;
  int rc = lay_out(p, cfg, blockseq, S, cores, err);
  if (!rc && !blockseq)
    rc = st_schedule_build(&p->sched, cfg->execution.schedule, p->workers, p->M,
                           p->V, err);
  if (!rc) mark_ties(p);
  if (!rc && pl) {
    /* each segment's stages over the members in order; a worker's later
     * chunks where its first is */
    if (p->V > 1) {
      st_rt_place(&p->rt, pl->group, 0, p->workers, pl->threads);
      for (int j = p->workers; j < p->rt.S; j++) {
        st_rt_stage *st = &p->stages[j].rt, *w = &p->stages[j % p->workers].rt;
        st->owner = w->owner;
        st->local = w->local;
        st->cores = w->cores;
        st->cpu_off = w->cpu_off;
      }
    } else {
      for (int g = 0; g < p->segments; g++)
        st_rt_place(&p->rt, pl->group, p->seg[g], p->seg[g + 1], pl->threads);
    }
    st_rt_mark_links(&p->rt);
    int P = st_dist_group_size(pl->group);
    if (!blockseq && p->workers < P)
      rc = st_error_set(err, ST_ECONFIG,
                        "%s: %s: %d stage%s over %d ranks "
                        "(execution.placement: ranks): each rank needs a "
                        "stage",
                        st_config_where(cfg, st_stages_key(cfg)),
                        st_stages_key(cfg), p->workers,
                        p->workers == 1 ? "" : "s", P);
  }
  if (rc) {
    pipe_destroy(p);
    return rc;
  }
  for (int s = 0, track = 0; s < p->rt.S; s++)
    p->stages[s].track = p->stages[s].rt.local ? track++ : -1;
  /* Spin before sleeping only when every stage thread has a core of its
   * own (over ranks: when the ranks on this machine have one each). */
  int threads = 0;
  for (int s = 0; s < p->rt.S; s++)
    if (p->stages[s].rt.local && !p->stages[s].rt.threadless)
      threads += p->stages[s].rt.cores;
  p->rt.spin = threads <= st_usable_cores() ? ST_SPIN : 0;
  if (pl) p->rt.spin = st_dist_local_size() <= st_usable_cores() ? ST_SPIN : 0;
  int R = m->label_rows;
  size_t per_mb = (size_t)micro_batch * R * m->out_cols;
  for (int s = 0; !rc && s < p->rt.S; s++) {
    pipe_stage *ps = &p->stages[s];
    st_rt_stage *st = &ps->rt;
    /* the most micro-batches the schedule has in flight here (1f1b: S - s
     * at stage s); block_sequential holds all M */
    st->slots = blockseq ? p->M : p->sched.slots[s];
    st->rx_ring = 2;          /* the next gradient posted while one is used */
    st->tx_ring = p->M;       /* an input-gradient buffer per micro-batch */
    if (!st->local) continue; /* another rank's */
    /* a channel holds at most M messages, all of one step; a worker's
     * later chunks run on its first chunk's thread and pool */
    if ((rc = st_rt_stage_alloc(st, !st->threadless, p->M, p->M, 0, err)))
      break;
    if (st->threadless) {
      st->pool = p->stages[ps->worker].rt.pool;
      st->borrowed_pool = 1;
    }
    int ok = 1;
    for (int j = 0; ok && p->sched.split && j < st->slots; j++)
      ok = !st_stage_enable_split(st->run[j], err);
    size_t in_floats =
        (size_t)micro_batch * st_shape_numel(m->blocks[st->first].in);
    if (ok && p->sched.split && s > 0)
      ok = (ps->own_in = buffers(st->slots, in_floats)) != NULL;
    if (ok && s == p->rt.S - 1) {
      ps->probs = st_alloc((size_t)st->slots * per_mb * sizeof(float));
      ps->dlogits = st_alloc(per_mb * sizeof(float));
      ok = ps->probs && ps->dlogits;
    }
    if (ok && s > 0) ok = (ps->dgrad = buffers(p->M, in_floats)) != NULL;
    if (!ok)
      rc = st_error_set(err, ST_ENOMEM, "out of memory for %s", st->name);
  }
  /* evaluation in one process (over ranks: ranks.c, stage by stage) */
  if (!rc && !pl)
    rc = st_stage_create(&p->eval, m, 0, m->n_blocks, max_batch, err);
  /* In one process the caller runs the first worker's part of each step
   * itself (run_on). With a thread of its own, the step's end woke the
   * sleeping caller and the next step woke that thread again: fc_mnist's
   * 2-stage pipeline with one hidden layer of 16, at batch 1, spent about
   * 50 us a step there against 10 of stage work (19k samples/s; 53-86k
   * hosted) on the 2-vCPU Zen 4 VM. */
  if (!rc && !pl) p->stages[0].rt.hosted = 1;
  if (!rc && st_rt_start(&p->rt, worker))
    rc = st_error_set(err, ST_ENOMEM,
                      "cannot start the threads of a %d-stage pipeline",
                      p->rt.S);
  if (rc) {
    pipe_destroy(p);
    return rc;
  }
  /* Pinned when every stage's cores are real cpus of this process; more
   * stages or threads than cpus share them, unpinned. */
  if (cfg->execution.pin && !pl) {
    int cpus[CPU_SETSIZE], n = st_usable_cpus(cpus, CPU_SETSIZE);
    if (cores <= n) st_rt_pin(&p->rt, cpus, cores);
  }
  *state = p;
  return 0;
}

static int pipe_create(void **state, const st_model *m, const st_config *cfg,
                       int micro_batch, int max_batch, st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, 0, NULL, err);
}

static int blockseq_create(void **state, const st_model *m,
                           const st_config *cfg, int micro_batch, int max_batch,
                           st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, 1, NULL, err);
}

int st_pipeline_create_placed(void **state, const st_model *m,
                              const st_config *cfg, int micro_batch,
                              int max_batch, int blockseq,
                              const st_placement *pl, st_error *err) {
  return create(state, m, cfg, micro_batch, max_batch, blockseq, pl, err);
}

int st_pipeline_layout(const void *state, int *first, int *count, int *owner) {
  return st_rt_layout(&((const pipe *)state)->rt, first, count, owner);
}

/* Runs one phase on stages [lo, hi) and waits for every worker of this
 * rank to have seen it; returns the step's error code. */
static int run_on(pipe *p, int ph, int lo, int hi, st_error *err) {
  int mine = 0; /* workers of this rank (all, in one process) */
  pipe_stage *host = NULL;
  for (int s = 0; s < p->rt.S; s++) {
    st_rt_stage *r = &p->stages[s].rt;
    if (r->hosted) host = &p->stages[s];
    mine += r->local && !r->threadless && !r->hosted;
  }
  p->phase = ph;
  p->lo = lo;
  p->hi = hi;
  atomic_store(&p->done, 0);
  atomic_fetch_add(&p->generation, 1);
  for (int s = 0; s < p->rt.S; s++)
    if (p->stages[s].rt.local && !p->stages[s].rt.hosted)
      st_waiter_wake(&p->stages[s].rt.w);
  if (host && host->rt.index >= lo && host->rt.index < hi) {
    st_fp_apply(); /* as a stage thread takes up each step */
    run_phase(host, ph);
  }
  /* then waits for the others: hosting a stage, on that stage's core,
   * spinning first as a stage does; else asleep (they have the cores) */
  st_wait_ge(&p->rt.w, &p->done, mine, host ? p->rt.spin : 0, NULL, NULL);
  return st_rt_result(&p->rt, err);
}

/* After a step over ranks: every send done, or, when the step stopped (or
 * a send failed), an empty message in place of each gradient a stage on
 * another rank still waits for, and every request given up: the pipeline
 * cannot go on, and the buffers of those requests are never freed. */
static int finish_links(pipe *p, int stopped, st_error *err) {
  int rc = 0;
  for (int s = 0; !stopped && s < p->rt.S; s++) {
    st_rt_stage *st = &p->stages[s].rt;
    for (int j = 0; !rc && st->local && st->remote_next && j < st->slots; j++)
      rc = st_dist_wait(&st->tx_fwd[j], NULL, NULL, err);
    for (int k = 0; !rc && st->local && st->remote_prev && k < p->M; k++)
      rc = st_dist_wait(&st->tx_bwd[k], NULL, NULL, err);
    stopped = rc != 0;
  }
  if (!stopped) return 0;
  for (int s = 0; s < p->rt.S; s++)
    if (p->stages[s].rt.local && p->stages[s].rt.remote_prev &&
        p->stages[s].bwd_sent < p->M)
      st_rt_send_stop(&p->rt, s);
  st_rt_forget_links(&p->rt);
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
  atomic_store(&p->rt.abort, 0);
  atomic_store(&p->copies_done, 0);
  p->rt.rc = 0;
  for (int s = 0; s < p->rt.S; s++) {
    st_chan_reset(&p->stages[s].rt.fwd);
    st_chan_reset(&p->stages[s].rt.bwd);
    p->stages[s].bwd_sent = 0;
  }
  int rc = 0;
  if (!p->blockseq) {
    rc = run_on(p, PHASE_ALL, 0, p->rt.S, err);
  } else {
    /* block_sequential: every segment's forwards, then the backwards from
     * the last segment down; the loss is checked in the last forward */
    for (int g = 0; !rc && g < p->segments; g++)
      rc = run_on(p, PHASE_FORWARD, p->seg[g], p->seg[g + 1], err);
    for (int g = p->segments - 1; !rc && g >= 0; g--)
      rc = run_on(p, PHASE_BACKWARD, p->seg[g], p->seg[g + 1], err);
  }
  if (p->rt.group) {
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
  return stage >= 0 && stage < p->rt.S ? p->stages[stage].max_held : -1;
}

void st_pipeline_set_jitter(void *state, int max_us, uint32_t seed) {
  pipe *p = state;
  p->jitter_us = max_us;
  for (int s = 0; s < p->rt.S; s++)
    p->stages[s].jitter_state = seed + 7919u * s;
}

int st_pipeline_cores(const void *state, int stage) {
  const pipe *p = state;
  return stage >= 0 && stage < p->rt.S ? p->stages[stage].rt.cores : -1;
}

int st_pipeline_stages(const void *state, int *first, int *count) {
  return st_rt_layout(&((const pipe *)state)->rt, first, count, NULL);
}

/* The plan's stage count: per segment for block_sequential (the most). */
static int pipe_stage_count(void *state) {
  const pipe *p = state;
  if (p->V > 1) return p->workers; /* interleaved: the workers */
  int most = 0;
  for (int g = 0; g < p->segments; g++)
    if (p->seg[g + 1] - p->seg[g] > most) most = p->seg[g + 1] - p->seg[g];
  return most;
}

static int pipe_stats(void *state, st_track_stats *out, int cap, double *wall) {
  pipe *p = state;
  *wall = p->wall;
  return st_rt_stats(&p->rt, out, cap, 0);
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
