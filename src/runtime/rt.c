/*
 * rt.c — the stage runtime (runtime.h): what every pipelined schedule's
 * stages share, written once. Errors: the first one stops the step and
 * every wait gives up. Links: a message between neighbouring stages goes
 * through a one-producer ring when both are in this process, and as a
 * non-blocking MPI message when the other is on another rank; either way
 * the receiver checks it is the micro-batch its schedule expects.
 * Placement, threads, pinning and the busy counters of the stages.
 *
 * Over ranks a message is sent from the sender's own buffer (a slot's
 * output, an input-gradient buffer), which it does not write again before
 * that send is done (st_rt_reuse), and received into the receiver's
 * buffers: one per activation slot for inputs, each posted as soon as the
 * slot is free, and a ring of rx_ring for gradients. An empty message in
 * place of a gradient says the step was stopped on another rank.
 */
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int st_rt_init(st_rt *rt, const st_model *m, int mb, int n, const char *what) {
  memset(rt, 0, sizeof *rt);
  rt->model = m;
  rt->mb = mb;
  rt->what = what;
  pthread_mutex_init(&rt->mu, NULL);
  st_waiter_init(&rt->w);
  rt->st = calloc((size_t)n, sizeof *rt->st);
  return rt->st ? 0 : -1;
}

void st_rt_free(st_rt *rt) {
  free(rt->st);
  rt->st = NULL;
  pthread_mutex_destroy(&rt->mu);
  st_waiter_destroy(&rt->w);
}

/* ------------------------------------------------------------- errors */

void st_rt_fail(st_rt *rt, const st_error *err) {
  pthread_mutex_lock(&rt->mu);
  if (err->code && !rt->rc) {
    rt->rc = err->code;
    rt->err = *err;
  }
  pthread_mutex_unlock(&rt->mu);
  atomic_store(&rt->abort, 1);
  for (int s = 0; s < rt->S; s++)
    if (rt->st[s]->waiter_ready) st_waiter_wake_always(&rt->st[s]->w);
  st_waiter_wake_always(&rt->w);
}

void st_rt_internal(st_rt *rt, const char *what, int64_t n, int stage) {
  st_error err = {0};
  st_error_set(&err, ST_EUNSUPPORTED,
               "internal error: %s: %s (micro-batch %lld, stage %d)", rt->what,
               what, (long long)n, stage);
  st_rt_fail(rt, &err);
}

int st_rt_result(st_rt *rt, st_error *err) {
  pthread_mutex_lock(&rt->mu);
  int rc = rt->rc, peer = rt->peer_stop;
  if (rc) *err = rt->err;
  pthread_mutex_unlock(&rt->mu);
  if (rc) return rc;
  if (!peer) return 0;
  st_error_set(err, ST_EIO, "stopped by a stage on another rank");
  return ST_EXEC_PEER_STOPPED;
}

void st_rt_trace(const st_trainer_view *v, st_trace_kind kind, int64_t n,
                 double t0, double t1) {
  if (v->trace) st_trace_add(v->trace, v->track, kind, v->step, (int)n, t0, t1);
}

/* ------------------------------------------------------------- links */

/* Bytes of a message between stage s - 1 and stage s (either way). */
static size_t link_bytes(const st_rt *rt, int s) {
  return (size_t)rt->mb *
         st_shape_numel(rt->model->blocks[rt->st[s]->first].in) * sizeof(float);
}

int st_rt_post(st_rt_stage *st, int dir, int64_t n) {
  st_rt *rt = st->rt;
  st_error err = {0};
  int rc;
  if (dir == ST_RT_FWD) {
    int slot = (int)(n % st->slots);
    rc = st_dist_irecv(rt->group, ST_RT_FWD, st->rx_fwd[slot],
                       link_bytes(rt, st->index), rt->st[st->index - 1]->owner,
                       st->index, &st->rx_fwd_req[slot], &err);
  } else {
    int at = (int)(n % st->rx_ring);
    rc = st_dist_irecv(
        rt->group, ST_RT_BWD, st->rx_bwd[at], link_bytes(rt, st->index + 1),
        rt->st[st->index + 1]->owner, st->index, &st->rx_bwd_req[at], &err);
  }
  if (rc) st_rt_fail(rt, &err);
  return rc ? -1 : 0;
}

/* The message of request r, received into buf; NULL when the step stops
 * (an empty message: another rank stopped it). */
static const float *link_recv(st_rt_stage *st, const st_trainer_view *v,
                              st_dist_req *r, const float *buf, int64_t n) {
  st_rt *rt = st->rt;
  double t0 = v->trace ? st_now() : 0;
  size_t got = 0;
  st_error err = {0};
  int rc = st_dist_wait(r, &got, &rt->abort, &err);
  if (v->trace) st_rt_trace(v, ST_TRACE_RECV, n, t0, st_now());
  if (rc < 0) return st_rt_fail(rt, &err), NULL;
  if (rc > 0) return NULL;
  if (got == 0) { /* stopped by another rank: no error of this one's */
    st_error none = {0};
    pthread_mutex_lock(&rt->mu);
    rt->peer_stop = 1;
    pthread_mutex_unlock(&rt->mu);
    st_rt_fail(rt, &none);
    return NULL;
  }
  return buf;
}

/* The next message on channel c, or NULL. FIFO per channel and both ends
 * in micro-batch order: anything else is a bug in the schedule, stopped
 * rather than computed on. */
static const float *chan_recv(st_rt_stage *st, const st_trainer_view *v,
                              st_chan *c, int64_t n) {
  st_rt *rt = st->rt;
  double t0 = v->trace ? st_now() : 0;
  if (rt->emulate && atomic_load(&c->sent) <= atomic_load(&c->taken)) {
    st_rt_internal(rt, "a message was not ready", n, st->index);
    return NULL;
  }
  st_msg m; /* a stage with a core of its own spins through its step */
  int spin = rt->spin ? ST_SPIN_LINK : 0;
  if (st_chan_take(c, &st->w, spin, &rt->abort, &rt->stop, &m)) return NULL;
  if (v->trace) st_rt_trace(v, ST_TRACE_RECV, n, t0, st_now());
  if (m.n != n) {
    st_rt_internal(rt, "a message arrived out of order", n, st->index);
    return NULL;
  }
  return m.data;
}

const float *st_rt_recv(st_rt_stage *st, const st_trainer_view *v, int dir,
                        int64_t n) {
  if (dir == ST_RT_FWD) {
    int slot = (int)(n % st->slots);
    return st->remote_prev
               ? link_recv(st, v, &st->rx_fwd_req[slot], st->rx_fwd[slot], n)
               : chan_recv(st, v, &st->fwd, n);
  }
  int at = (int)(n % st->rx_ring);
  return st->remote_next
             ? link_recv(st, v, &st->rx_bwd_req[at], st->rx_bwd[at], n)
             : chan_recv(st, v, &st->bwd, n);
}

int st_rt_send(st_rt_stage *st, const st_trainer_view *v, int dir, int64_t n,
               const float *data) {
  st_rt *rt = st->rt;
  int to = dir == ST_RT_FWD ? st->index + 1 : st->index - 1;
  double t0 = v->trace ? st_now() : 0;
  if (dir == ST_RT_FWD ? st->remote_next : st->remote_prev) {
    st_dist_req *r = dir == ST_RT_FWD ? &st->tx_fwd[n % st->slots]
                                      : &st->tx_bwd[n % st->tx_ring];
    st_error err = {0};
    if (st_dist_isend(rt->group, dir, data,
                      link_bytes(rt, dir == ST_RT_BWD ? st->index : to),
                      rt->st[to]->owner, to, r, &err)) {
      st_rt_fail(rt, &err);
      return -1;
    }
  } else {
    st_rt_stage *recv = rt->st[to];
    if (st_chan_put(dir == ST_RT_FWD ? &recv->fwd : &recv->bwd, n, data)) {
      st_rt_internal(rt, "a channel overflowed", n, to);
      return -1;
    }
    st_waiter_wake(&recv->w);
  }
  if (v->trace) st_rt_trace(v, ST_TRACE_SEND, n, t0, st_now());
  return 0;
}

int st_rt_reuse(st_rt_stage *st, int dir, int64_t n) {
  st_dist_req *r = NULL;
  if (dir == ST_RT_FWD && st->remote_next) r = &st->tx_fwd[n % st->slots];
  if (dir == ST_RT_BWD && st->remote_prev) r = &st->tx_bwd[n % st->tx_ring];
  if (!r) return 0;
  st_error err = {0};
  int rc = st_dist_wait(r, NULL, &st->rt->abort, &err);
  if (rc < 0) st_rt_fail(st->rt, &err);
  return rc ? -1 : 0;
}

void st_rt_forget_links(st_rt *rt) {
  for (int s = 0; s < rt->S; s++) {
    st_rt_stage *st = rt->st[s];
    for (int j = 0; st->rx_fwd_req && j < st->slots; j++)
      st->leaky |= st_dist_forget(&st->rx_fwd_req[j]);
    for (int j = 0; st->tx_fwd && j < st->slots; j++)
      st->leaky |= st_dist_forget(&st->tx_fwd[j]);
    for (int j = 0; j < ST_RT_RX_RING; j++)
      st->leaky |= st_dist_forget(&st->rx_bwd_req[j]);
    for (int j = 0; st->tx_bwd && j < st->tx_ring; j++)
      st->leaky |= st_dist_forget(&st->tx_bwd[j]);
  }
}

void st_rt_send_stop(st_rt *rt, int s) {
  static const float none[1];
  st_dist_req r = {0};
  st_error ignored = {0};
  if (!st_dist_isend(rt->group, ST_RT_BWD, none, 0, rt->st[s - 1]->owner, s - 1,
                     &r, &ignored))
    st_dist_forget(&r);
}

/* ------------------------------------------------- placement, threads */

void st_rt_place(st_rt *rt, st_dist_group *group, int lo, int hi, int threads) {
  int P = st_dist_group_size(group), k = hi - lo, mine = 0;
  rt->group = group;
  rt->me = st_dist_group_rank(group);
  for (int s = lo; s < hi; s++) {
    st_rt_stage *st = rt->st[s];
    st->owner = st_placed_owner(s - lo, k, P);
    st->local = st->owner == rt->me;
    mine += st->local;
  }
  for (int s = lo, off = 0, i = 0; s < hi; s++) {
    st_rt_stage *st = rt->st[s];
    if (!st->local) continue;
    int share = threads / mine + (i++ < threads % mine);
    st->cores = share > 0 ? share : 1;
    st->cpu_off = off;
    off += st->cores;
  }
}

void st_rt_mark_links(st_rt *rt) {
  for (int s = 0; s < rt->S; s++) {
    st_rt_stage *st = rt->st[s];
    st->remote_prev = st->local && s > 0 && rt->st[s - 1]->owner != rt->me;
    st->remote_next =
        st->local && s < rt->S - 1 && rt->st[s + 1]->owner != rt->me;
    size_t len = strlen(st->name);
    snprintf(st->name + len, sizeof st->name - len, " (rank %d)",
             st_dist_group_world(rt->group, st->owner));
  }
}

int st_rt_stage_alloc(st_rt_stage *st, int pooled, int fwd_cap, int bwd_cap,
                      size_t base, st_error *err) {
  st_rt *rt = st->rt;
  int rc = 0;
  st_waiter_init(&st->w);
  st->waiter_ready = 1;
  st->pool = pooled ? st_pool_create(st->cores) : NULL;
  st->run = calloc((size_t)st->slots, sizeof *st->run);
  st->in = calloc((size_t)st->slots, sizeof *st->in);
  int ok = (!pooled || st->pool) && st->run && st->in &&
           !st_chan_init(&st->fwd, fwd_cap) && !st_chan_init(&st->bwd, bwd_cap);
  for (int j = 0; ok && j < st->slots; j++) {
    /* one workspace for the stage: its thread runs one slot at a time */
    ok =
        (rc = st_stage_create_with(&st->run[j], rt->model, st->first, st->count,
                                   rt->mb, 0, j ? st->run[0] : NULL, err)) == 0;
    if (ok) st->run[j]->base = base;
  }
  if (ok && st->remote_prev) {
    st->rx_fwd = calloc((size_t)st->slots, sizeof *st->rx_fwd);
    st->rx_fwd_req = calloc((size_t)st->slots, sizeof *st->rx_fwd_req);
    st->tx_bwd = calloc((size_t)st->tx_ring, sizeof *st->tx_bwd);
    ok = st->rx_fwd && st->rx_fwd_req && st->tx_bwd;
    for (int j = 0; ok && j < st->slots; j++)
      ok = (st->rx_fwd[j] = st_alloc(link_bytes(rt, st->index))) != NULL;
  }
  if (ok && st->remote_next) {
    ok = (st->tx_fwd = calloc((size_t)st->slots, sizeof *st->tx_fwd)) != NULL;
    for (int j = 0; ok && j < st->rx_ring; j++)
      ok = (st->rx_bwd[j] = st_alloc(link_bytes(rt, st->index + 1))) != NULL;
  }
  if (ok) return 0;
  return rc ? rc
            : st_error_set(err, ST_ENOMEM, "out of memory for %s's %s",
                           rt->what, st->name);
}

void st_rt_stage_free(st_rt_stage *st) {
  if (st->leaky) { /* MPI may still read or write these */
    st->run = NULL;
    st->rx_fwd = NULL;
    for (int j = 0; j < ST_RT_RX_RING; j++) st->rx_bwd[j] = NULL;
  }
  for (int j = 0; st->run && j < st->slots; j++) st_stage_destroy(st->run[j]);
  free(st->run);
  free(st->in);
  st_chan_free(&st->fwd);
  st_chan_free(&st->bwd);
  if (st->waiter_ready) st_waiter_destroy(&st->w);
  st->waiter_ready = 0;
  if (!st->borrowed_pool) st_pool_destroy(st->pool);
  st->pool = NULL;
  /* links: after a whole step every request is done; after a stopped one
   * each was given up, its buffers kept (leaky, above) */
  for (int j = 0; st->rx_fwd && j < st->slots; j++) st_free(st->rx_fwd[j]);
  free(st->rx_fwd);
  free(st->rx_fwd_req);
  for (int j = 0; j < ST_RT_RX_RING; j++) st_free(st->rx_bwd[j]);
  free(st->tx_fwd);
  free(st->tx_bwd);
}

int st_rt_start(st_rt *rt, void *(*worker)(void *stage)) {
  for (int s = 0; s < rt->S; s++) {
    st_rt_stage *st = rt->st[s];
    if (!st->local || st->threadless || st->hosted) continue;
    if (pthread_create(&st->thread, NULL, worker, st)) return -1;
    st->started = 1;
  }
  return 0;
}

void st_rt_stop_threads(st_rt *rt) {
  atomic_store(&rt->stop, 1);
  for (int s = 0; s < rt->S; s++)
    if (rt->st[s]->waiter_ready) st_waiter_wake_always(&rt->st[s]->w);
  /* over ranks, every request given up first (none is live after a whole
   * run): a stage still in a step may wait on one until it sees the stop */
  if (rt->group) st_rt_forget_links(rt);
  for (int s = 0; s < rt->S; s++)
    if (rt->st[s]->started) pthread_join(rt->st[s]->thread, NULL);
  for (int s = 0; s < rt->S; s++) rt->st[s]->started = 0;
}

int st_rt_pin(st_rt *rt, const int *cpus, int n) {
  for (int s = 0; s < rt->S; s++)
    if ((rt->st[s]->started || rt->st[s]->hosted) &&
        rt->st[s]->cpu_off + rt->st[s]->cores > n)
      return -1;
  int rc = 0;
  for (int s = 0; s < rt->S; s++) {
    st_rt_stage *st = rt->st[s];
    if (!st->started && !st->hosted) continue;
    const int *mine = cpus + st->cpu_off;
    /* a hosted stage's caller stays free: it is the trainer's thread */
    if ((st->started && st_pin_thread(st->thread, mine, st->cores)) ||
        st_pool_pin(st->pool, mine, st->cores))
      rc = -1;
  }
  return rc;
}

/* Busy seconds are read between steps, when no worker writes them. */
int st_rt_stats(const st_rt *rt, st_track_stats *out, int cap, double bound) {
  int n = 0; /* this process's stages */
  for (int s = 0; s < rt->S; s++) {
    const st_rt_stage *st = rt->st[s];
    if (!st->local) continue;
    if (n < cap) {
      snprintf(out[n].name, sizeof out[n].name, "%s", st->name);
      out[n].first = st->first;
      out[n].count = st->count;
      out[n].busy_s = st->busy;
      out[n].bound_s = bound;
    }
    n++;
  }
  return n;
}

int st_rt_layout(const st_rt *rt, int *first, int *count, int *owner) {
  for (int s = 0; s < rt->S; s++) {
    if (first) first[s] = rt->st[s]->first;
    if (count) count[s] = rt->st[s]->count;
    if (owner) owner[s] = rt->st[s]->owner;
  }
  return rt->S;
}
