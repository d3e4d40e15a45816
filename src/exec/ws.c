/*
 * ws.c — weight streaming (DESIGN.md; BACKGROUND.md 4): weights and
 * optimizer state live in a parameter store; the compute side holds only
 * the blocks in flight. Per micro-batch the forward walks the blocks
 * 0 .. n-1 and the backward n-1 .. 0; each walk fetches the block's
 * weights from the store into one of prefetch + 1 slots, and a fetch thread
 * fills the slots ahead of the compute, so the copy overlaps the compute
 * of the block before. The backward forms the block's gradient in a
 * compute-side buffer and sends it to the store; after the last
 * micro-batch an optimizer thread updates that block in the store while
 * the compute side goes on to the block before it.
 *
 * The memory store is the trainer's parameter, gradient and optimizer
 * slabs (execution.store: memory). The file store (store.c) keeps two
 * copies of the weights and optimizer state in a file: fetches read the
 * live copy, the update reads a chunk of the block's weights and state
 * from it, applies the same rule and writes the chunk into the other copy;
 * the step is committed (synced, then the header) on the optimizer thread
 * while the next step's forward runs, and that step's first update waits
 * for it. Gradients go to the store's gradient slab in the file and the
 * update reads them from there, chunk by chunk with the weights and state,
 * so this process holds no slab of any kind: only its buffers (and the
 * page cache, not this process's memory, holds the file). The update is the
 * sequential mode's st_trainer_update_blocks on the same slabs, and every
 * kernel sees the same inputs in the same order, so the weights are the
 * sequential mode's bit for bit — with micro-batches too: a block's partial
 * gradient goes to the store and comes back for the next micro-batch's backward
 * to add to, as the sequential mode adds into its gradient slab.
 *
 * keep_activations: false keeps only each block's output (the next one's
 * input) and reruns the block's forward, with the same weights and dropout
 * stream, just before its backward.
 *
 * Threads: the calling (compute) thread with the trainer's pool; a fetch
 * thread (when prefetch > 0); an optimizer thread with a pool of one. The
 * first block's update, the step's last, runs on the compute side's pool
 * once the optimizer thread is done: nothing else is left to overlap it
 * with. A step returns once every update of it is done, so the trainer may
 * read or save the weights between steps.
 *
 * Over MPI ranks (mpirun -np N, N > 1): rank 0 is the store — the trainer's
 * slabs or the file store, and the optimizer thread — and ranks 1 .. N-1
 * compute, data parallel, each on its share of batch / (N - 1) samples
 * (compute rank r is replica r - 1 of execution.replicas: N - 1). For each
 * use of the walk the store sends the block's weights to every compute
 * rank (from a copy in one of prefetch + 1 send slots: its sends run while
 * it reads the next block) and each compute rank has the receives of the
 * next prefetch uses posted while it computes this one. After a block's
 * backward each compute rank sends its gradient to the store, which sums
 * them in rank order — ((g1 + g2) + g3) + ..., the order the in-process
 * replicas add their slabs (deterministic: false: MPI_Reduce, the
 * library's order) — and updates the block on its optimizer thread while
 * the next block's gradients come in. So the weights are those of the
 * sequential mode with execution.replicas: N - 1, bit for bit. The losses
 * are all-gathered before the first backward: every rank checks the same
 * batch loss, and a non-finite one stops every rank before any update.
 * Compute ranks hold no weights but their slots, no gradient but the
 * block's being sent, no optimizer state. Evaluation: the store sends each
 * block to rank 1, which broadcasts the logits; a checkpoint is the store
 * rank's (its slabs, or its store file).
 */
#include "exec.h"

#include "../dist/dist.h"

#include <stdlib.h>
#include <string.h>
#include <signal.h>

typedef struct ws {
  const st_model *model;
  int nb, slots, keep, rows;
  size_t max_params;     /* the largest block's parameters */
  float *wslot;          /* slots x max_params: weights in flight */
  float *gbuf;           /* max_params: the gradient being formed */
  st_stage *stage;       /* every block's compute, fed the slots' weights:
                            activations per block (keep), else one shared */
  float **outs;          /* recompute: per block, its output */
  int64_t compute_bytes; /* what the buffers above hold */

  /* One step's walk: use u needs block use_block[u]'s weights in slot
   * u % slots. The fetch thread fills use u once use u - slots is
   * released. Counters only grow within a step; under mu. */
  int *use_block;
  int n_use;
  const float *store_params; /* this step's store weights */
  int64_t fetched, released;
  long long generation; /* bumped to start the fetch of a step */
  int stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t fetcher;
  int fetch_thread;

  /* The optimizer thread: blocks whose gradient is complete in the store,
   * updated in order; under mu. */
  int *queue;
  int q_head, q_tail, q_done;
  const st_trainer_view *qv; /* the step's view, with the thread's pool */
  st_trainer_view opt_view;
  st_pool *opt_pool;
  pthread_t optimizer;
  int opt_thread;

  /* The file store (NULL: memory) and the update's chunk buffers: weights,
   * each optimizer slot, the gradient and a tied copy's gradient, UCHUNK
   * floats each. I/O errors on either thread land in io_err (under mu) and
   * fail the step. */
  st_store *store;
  float *ubuf;
  int ubuf_tasks; /* buffer sets in ubuf: the compute side's threads */
  int opt_slots;
  size_t weight_size; /* bytes of a stored weight: 4, or 2 for bf16 */
  int stochastic;     /* bf16: round updates stochastically */
  int io_rc;
  st_error io_err;
  st_train_pos commit_pos; /* the queued commit's (queue entry -1) */
  int commit_copy;

  /* Over MPI ranks (0 in one process): the world's size and this rank (0:
   * the store), each compute rank's samples, a group of the world with
   * channels of its own; the store: slots x (ranks - 1) sends of the
   * weights in sbuf (slots x max_params), the ranks' gradients of a block
   * (ggot: (ranks - 1) x max_params); a compute rank: a receive per slot,
   * a second gradient buffer (gnext) so one is sent while the next forms;
   * both: every rank's losses (lossbuf: ranks x share rows), the logits an
   * evaluation broadcasts, the store's position at start (kept). */
  int ranks, me, share, reduce;
  st_dist_group *all;
  st_dist_req *req, greq[2];
  float *sbuf, *ggot, *gnext, *lossbuf, *logits;
  st_train_pos kept;
  int leaky; /* requests given up after a failed step: MPI may still write
              * or read their buffers, which are then kept (ws_destroy) */

  /* Counters (st_ws_stats). */
  int held_max;         /* most slots filled and not released at once */
  double stall_s;       /* compute waiting for weights */
  double wait_opt_s;    /* step end waiting for the optimizer thread */
  double last_update_s; /* the first block's update on the compute side */
  int64_t bytes_in, bytes_out, steps;
  double busy;
} ws;

/* ------------------------------------------------------------- fetching */

static void io_failed(ws *w, const st_error *e) {
  pthread_mutex_lock(&w->mu);
  if (!w->io_rc) {
    w->io_rc = e->code ? e->code : ST_EIO;
    w->io_err = *e;
  }
  pthread_mutex_unlock(&w->mu);
}

/* The first I/O error of either thread, if any, into err. */
static int pending_error(ws *w, st_error *err) {
  pthread_mutex_lock(&w->mu);
  int rc = w->io_rc;
  if (rc) *err = w->io_err;
  pthread_mutex_unlock(&w->mu);
  return rc;
}

/* Block b's gradient to (write 1) or from the file store. */
static void grad_io(ws *w, int write, const st_block *b, float *buf) {
  st_error e = {0};
  if (st_store_grad_io(w->store, write, b->param_off, b->n_params, buf, &e))
    io_failed(w, &e);
}

/* Block b's weights from the store into dst. */
static void fetch_block(ws *w, const st_block *b, const float *params,
                        float *dst) {
  if (!w->store) {
    memcpy(dst, params + b->param_off, b->n_params * sizeof(float));
    return;
  }
  st_error e = {0};
  if (st_store_read(w->store, 0, b->param_off, b->n_params, dst, &e))
    io_failed(w, &e);
}

static void *fetch_main(void *arg) {
  ws *w = arg;
  long long seen = 0;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->stop && w->generation == seen) pthread_cond_wait(&w->cv, &w->mu);
    if (w->stop) break;
    seen = w->generation;
    st_fp_apply();
    for (int u = 0; u < w->n_use && !w->stop; u++) {
      while (!w->stop && w->released < u + 1 - w->slots)
        pthread_cond_wait(&w->cv, &w->mu);
      if (w->stop) break;
      const st_block *b = &w->model->blocks[w->use_block[u]];
      float *dst = w->wslot + (size_t)(u % w->slots) * w->max_params;
      pthread_mutex_unlock(&w->mu);
      fetch_block(w, b, w->store_params, dst);
      pthread_mutex_lock(&w->mu);
      w->fetched = u + 1;
      int held = (int)(w->fetched - w->released);
      if (held > w->held_max) w->held_max = held;
      pthread_cond_broadcast(&w->cv);
    }
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* The weights of use u, once fetched; without a fetch thread, copied here. */
static const float *acquire(ws *w, int u) {
  float *slot = w->wslot + (size_t)(u % w->slots) * w->max_params;
  const st_block *b = &w->model->blocks[w->use_block[u]];
  w->bytes_in += (int64_t)(b->n_params * w->weight_size);
  if (!w->fetch_thread) {
    fetch_block(w, b, w->store_params, slot);
    w->fetched = u + 1;
    if (w->fetched - w->released > w->held_max)
      w->held_max = (int)(w->fetched - w->released);
    return slot;
  }
  pthread_mutex_lock(&w->mu);
  if (w->fetched <= u) {
    double t0 = st_now();
    while (w->fetched <= u) pthread_cond_wait(&w->cv, &w->mu);
    w->stall_s += st_now() - t0;
  }
  pthread_mutex_unlock(&w->mu);
  return slot;
}

static void release(ws *w, int u) {
  if (!w->fetch_thread) {
    w->released = u + 1;
    return;
  }
  pthread_mutex_lock(&w->mu);
  w->released = u + 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* ------------------------------------------------------------ the store */

enum {
  UCHUNK = 1 << 15
}; /* floats per array in one file update chunk:
      its six arrays stay in L2 */

enum { MAX_TASKS = 64 }; /* chunk tasks of one range, at most */

typedef struct file_job {
  ws *w;
  const st_trainer_view *v;
  double *gb2;   /* the noise scale's sum of squared gradients, else NULL */
  size_t off, n; /* the range file_range was given */
  int tasks;     /* its chunks, task t taking t, t + tasks, ... */
  st_error err[MAX_TASKS];
  int rc[MAX_TASKS];
} file_job;

/* The tied copies of slab range [at, at + len): write 0 adds each copy's
 * gradient into buf (the range's, tmp a scratch chunk), in the order
 * st_trainer_update_blocks gathers them; write 1 writes buf (the range's
 * new weights) over the copies in the other copy of the store. */
static int chunk_ties(const ws *w, size_t at, size_t len, int write, float *buf,
                      float *tmp, st_error *err) {
  const st_model *m = w->model;
  int rc = 0;
  for (int i = 0; m->n_ties && i < m->n_blocks && !rc; i++)
    for (int t = 0; t < m->blocks[i].n_tensors && !rc; t++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[t];
      if (ti->tie < 0) continue;
      size_t src = (size_t)ti->tie, a = at > src ? at : src;
      size_t b = at + len < src + ti->numel ? at + len : src + ti->numel;
      if (a >= b) continue;
      size_t copy = m->blocks[i].param_off + ti->offset + (a - src);
      if (write) {
        rc = st_store_write(w->store, 0, copy, b - a, buf + (a - at), err);
        continue;
      }
      rc = st_store_grad_io(w->store, 0, copy, b - a, tmp, err);
      for (size_t k = 0; !rc && k < b - a; k++) buf[a - at + k] += tmp[k];
    }
  return rc;
}

/* Chunk by chunk (task t's share of the range, with its own buffers):
 * weights and state read from the live copy and the gradient from the
 * store, every tied copy's gradient added in (as st_trainer_update_blocks
 * gathers them), the rule applied, the results written into the other
 * copy — and into every tied copy of these weights. */
static void file_chunks(void *arg, int task) {
  file_job *j = arg;
  ws *w = j->w;
  const st_trainer_view *v = j->v;
  const st_store *s = w->store;
  float *p = w->ubuf + (size_t)task * (3 + w->opt_slots) * UCHUNK;
  float *o = p + UCHUNK;
  float *g = o + (size_t)w->opt_slots * UCHUNK, *tg = g + UCHUNK;
  st_error *err = &j->err[task];
  int rc = 0;
  double sq = 0; /* one task: in index order, as st_sum_squares */
  for (size_t lo = (size_t)task * UCHUNK; lo < j->n && !rc;
       lo += (size_t)j->tasks * UCHUNK) {
    size_t at = j->off + lo, len = j->n - lo < UCHUNK ? j->n - lo : UCHUNK;
    rc = st_store_read(s, 0, at, len, p, err);
    for (int k = 0; k < w->opt_slots && !rc; k++)
      rc = st_store_read(s, 1 + k, at, len, o + (size_t)k * UCHUNK, err);
    if (!rc) rc = st_store_grad_io(s, 0, at, len, g, err);
    /* tied copies of [at, at + len): their gradients first */
    if (!rc) rc = chunk_ties(w, at, len, 0, g, tg, err);
    if (rc) break;
    if (j->gb2)
      for (size_t k = 0; k < len; k++) sq += (double)g[k] * g[k];
    st_optim_step_range(NULL, v->cfg, p, g, o, UCHUNK, len, v->lr, v->step);
    if (w->weight_size == 2) /* element by element: the chunking is free */
      st_bf16_round(p, len, w->stochastic, v->cfg->train.seed,
                    (uint64_t)v->step, at);
    rc = st_store_write(s, 0, at, len, p, err);
    for (int k = 0; k < w->opt_slots && !rc; k++)
      rc = st_store_write(s, 1 + k, at, len, o + (size_t)k * UCHUNK, err);
    if (!rc) rc = chunk_ties(w, at, len, 1, p, NULL, err);
  }
  j->rc[task] = rc;
  if (j->gb2) *j->gb2 += sq; /* one task when summing: see file_range */
}

/* One range of the slab, its chunks spread over the view's pool — or on
 * one thread when the noise scale sums the squared gradients, which must
 * be in index order to be the sequential mode's bits. */
static void file_range(void *arg, size_t off, size_t n) {
  file_job *j = arg;
  if (j->rc[0]) return; /* an earlier range failed */
  size_t chunks = (n + UCHUNK - 1) / UCHUNK;
  int threads = j->v->ctx.pool ? st_pool_threads(j->v->ctx.pool) : 1;
  j->off = off;
  j->n = n;
  j->tasks = j->gb2 || threads > j->w->ubuf_tasks ? 1 : threads;
  if ((size_t)j->tasks > chunks) j->tasks = (int)chunks;
  st_pool_for(j->v->ctx.pool, j->tasks, file_chunks, j);
  for (int t = 1; t < j->tasks; t++)
    if (j->rc[t] && !j->rc[0]) j->rc[0] = j->rc[t], j->err[0] = j->err[t];
}

/* Updates block b in the store (v: the step's view, whose pool runs it). */
static void update_block(ws *w, const st_trainer_view *v, int b) {
  if (!w->store) {
    st_trainer_update_blocks(v, b, 1);
    return;
  }
  /* the ranges only: the gradients and their squares are file_range's */
  st_trainer_view ranges = *v;
  ranges.gb2 = NULL;
  file_job j = {.w = w, .v = v, .gb2 = v->gb2};
  st_trainer_each_range(&ranges, b, 1, 0, file_range, &j);
  if (j.rc[0]) io_failed(w, &j.err[0]);
  if (b == w->nb / 2 &&
      st_store_crash_point(w->store, v->step) == ST_CRASH_MID_UPDATE)
    raise(SIGKILL);
}

static void *optimizer_main(void *arg) {
  ws *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->stop && w->q_head == w->q_tail)
      pthread_cond_wait(&w->cv, &w->mu);
    if (w->stop && w->q_head == w->q_tail) break;
    int block = w->queue[w->q_head % (w->nb + 1)];
    const st_trainer_view *v = w->qv;
    st_train_pos pos = w->commit_pos;
    int copy = w->commit_copy, failed = w->io_rc;
    pthread_mutex_unlock(&w->mu);
    st_fp_apply();
    st_error e = {0};
    /* after a failed commit nothing more is written: the other copy is
     * the one the last good header names */
    if (failed)
      ;
    else if (block >= 0)
      update_block(w, v, block);
    else if (st_store_commit(w->store, copy, &pos, &e))
      io_failed(w, &e);
    pthread_mutex_lock(&w->mu);
    w->q_head++;
    w->q_done++;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Block b's gradient is complete in the store: update it there. */
static void submit(ws *w, int b) {
  if (!w->opt_thread) {
    update_block(w, w->qv, b);
    return;
  }
  pthread_mutex_lock(&w->mu);
  w->queue[w->q_tail % (w->nb + 1)] = b;
  w->q_tail++;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void drain(ws *w) {
  if (!w->opt_thread) return;
  pthread_mutex_lock(&w->mu);
  if (w->q_head != w->q_tail) {
    double t0 = st_now();
    while (w->q_head != w->q_tail) pthread_cond_wait(&w->cv, &w->mu);
    w->wait_opt_s += st_now() - t0;
  }
  pthread_mutex_unlock(&w->mu);
}

/* ------------------------------------------------------------ lifecycle */

/* A failed step's requests given up (cancelled and freed), as the stage
 * runtime's are (rt.c): 1 if any was still live. */
static int forget_requests(ws *w) {
  int live = 0;
  size_t n = !w->req      ? 0
             : w->me == 0 ? (size_t)w->slots * (w->ranks - 1)
                          : (size_t)w->slots;
  for (size_t k = 0; k < n; k++) live |= st_dist_forget(&w->req[k]);
  for (int j = 0; j < 2; j++) live |= st_dist_forget(&w->greq[j]);
  return live;
}

static void ws_destroy(void *state) {
  ws *w = state;
  if (!w) return;
  if (w->ranks && forget_requests(w)) w->leaky = 1;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->fetch_thread) pthread_join(w->fetcher, NULL);
  if (w->opt_thread) pthread_join(w->optimizer, NULL);
  if (w->leaky) /* MPI may still write or read these: kept */
    w->wslot = w->sbuf = w->ggot = w->gbuf = w->gnext = NULL;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  st_pool_destroy(w->opt_pool);
  st_store_close(w->store);
  st_free(w->ubuf);
  st_stage_destroy(w->stage);
  if (w->outs)
    for (int i = 0; i < w->nb; i++) st_free(w->outs[i]);
  free(w->outs);
  st_free(w->wslot);
  st_free(w->gbuf);
  st_free(w->sbuf);
  st_free(w->ggot);
  st_free(w->gnext);
  st_free(w->lossbuf);
  st_free(w->logits);
  free(w->req);
  st_dist_group_destroy(w->all);
  free(w->use_block);
  free(w->queue);
  free(w);
}

/* Counts n floats into w->compute_bytes and, unless dry, allocates them. */
static float *alloc_floats(ws *w, size_t n, int dry, int *ok) {
  w->compute_bytes += (int64_t)(n * sizeof(float));
  if (dry) return NULL;
  float *p = *ok ? st_alloc(n * sizeof(float)) : NULL;
  if (!p) *ok = 0;
  return p;
}

/* The compute side's buffers, sized for w->rows samples; dry: only
 * counted, so the limit is checked before anything is allocated. */
static int buffers(ws *w, int dry) {
  const st_model *m = w->model;
  int ok = 1;
  w->compute_bytes = 0;
  w->wslot = alloc_floats(w, (size_t)w->slots * w->max_params, dry, &ok);
  w->gbuf = alloc_floats(w, w->max_params, dry, &ok);
  /* the stage: activations (all blocks' when kept, else the largest
   * block's once), workspace, scratch and the gradient hand-off */
  w->compute_bytes += (int64_t)st_stage_bytes(m, 0, w->nb, w->rows, !w->keep);
  st_error ignored = {0};
  if (!dry && ok &&
      st_stage_create_shared(&w->stage, m, 0, w->nb, w->rows, !w->keep,
                             &ignored))
    ok = 0;
  for (int i = 0; !w->keep && i < w->nb; i++) {
    const st_block *b = &m->blocks[i];
    float *o =
        alloc_floats(w, (size_t)w->rows * st_shape_numel(b->out), dry, &ok);
    if (!dry) w->outs[i] = o;
  }
  return ok;
}

/* What the compute side holds for `rows` samples: the weight slots, the
 * gradient, the activations (all blocks' when kept) and the shared
 * workspace — the figure compute_memory_limit is checked against. slots:
 * the weight slots counted (prefetch + 1, at most the walk's 2 n uses);
 * rows is the larger of the micro-batch and the evaluation batch
 * (eval_rows). */
static int check_limit(const st_model *m, const st_config *cfg, int slots,
                       int rows, int eval_rows, int64_t have, st_error *err) {
  int64_t limit = cfg->execution.compute_memory_limit;
  if (limit <= 0 || have <= limit) return 0;
  /* name the block that needs the most of it */
  int worst = 0;
  for (int i = 1; i < m->n_blocks; i++)
    if (m->blocks[i].n_params + (size_t)rows * m->blocks[i].act_per_sample >
        m->blocks[worst].n_params +
            (size_t)rows * m->blocks[worst].act_per_sample)
      worst = i;
  const st_block *b = &m->blocks[worst];
  return st_error_set(
      err, ST_ECONFIG,
      "%s: execution.compute_memory_limit: %lld bytes cannot hold block %d "
      "(%s): %d slot%s of its %zu weights, its gradient and activations "
      "for %d samples (%s) need %lld bytes in all (raise the limit, lower "
      "execution.prefetch or the samples, or set "
      "execution.keep_activations: false)",
      st_config_where(cfg, "execution.compute_memory_limit"), (long long)limit,
      worst, b->name, slots, slots > 1 ? "s" : "", b->n_params, rows,
      rows == eval_rows ? "the evaluation batch" : "the micro-batch",
      (long long)have);
}

/* The file store and the update's buffers. */
static int open_store(ws *w, const st_model *m, const st_config *cfg,
                      st_error *err) {
  if (!cfg->execution.store_path[0])
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.store: file needs execution.store_path "
                        "when the run has no directory",
                        st_config_where(cfg, "execution.store"));
  int rc = st_store_open(&w->store, cfg->execution.store_path, m, cfg, err);
  if (rc) return rc;
  if (st_store_bf16(w->store)) w->weight_size = 2;
  w->stochastic = strcmp(cfg->execution.store_rounding, "stochastic") == 0;
  w->opt_slots = st_optim_state_per_param(cfg);
  /* a set of chunk buffers for each thread of the trainer's pool (the
   * compute side runs the step's last update) */
  int threads = cfg->train.threads > 0 ? cfg->train.threads : st_usable_cores();
  w->ubuf_tasks = threads < MAX_TASKS ? threads : MAX_TASKS;
  w->ubuf = st_alloc((size_t)w->ubuf_tasks * (3 + (size_t)w->opt_slots) *
                     UCHUNK * sizeof(float));
  if (!w->ubuf) return st_error_set(err, ST_ENOMEM, "out of memory");
  return 0;
}

/* Over MPI ranks: rank 0 the store (its store file, send slots, the
 * ranks' gradients of a block, the optimizer thread), the others compute
 * (their buffers, as in one process). Every rank learns whether any
 * failed. */
static int remote_create(ws *w, const st_model *m, const st_config *cfg,
                         int micro_batch, int max_batch, st_error *err) {
  const int N = st_dist_size(), C = N - 1, batch = cfg->train.batch;
  w->ranks = N;
  w->me = st_dist_rank();
  w->reduce = !cfg->execution.deterministic;
  /* the config's faults: every rank finds the same */
  st_dist_share_error();
  if (strcmp(cfg->execution.placement, "threads"))
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.placement: ranks spreads a pipeline's "
                        "stages over the ranks; weight streaming over %d "
                        "ranks is a store rank and %d compute ranks "
                        "(placement: threads)",
                        st_config_where(cfg, "execution.placement"), N, C);
  /* as data parallel over ranks: the compute ranks' shares are the
   * replicas', and no rank forms a first micro-batch's gradient */
  if (cfg->metrics.noise_scale)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: metrics.noise_scale is measured in one process "
                        "(not over MPI ranks yet)",
                        st_config_where(cfg, "metrics.noise_scale"));
  if (batch % C)
    return st_error_set(err, ST_ECONFIG,
                        "%s: train.batch: %d does not split over %d compute "
                        "ranks (rank 0 of %d is the store)",
                        st_config_where(cfg, "train.batch"), batch, C, N);
  w->share = batch / C;
  if (micro_batch < w->share)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: execution.micro_batch: %d; weight streaming over "
                        "ranks runs each compute rank's %d samples as one "
                        "micro-batch (several are not built)",
                        st_config_where(cfg, "execution.micro_batch"),
                        micro_batch, w->share);
  w->rows = w->share > max_batch ? w->share : max_batch;
  for (int i = 0; i < m->n_blocks; i++)
    if (m->blocks[i].n_params * sizeof(float) > (size_t)INT32_MAX)
      return st_error_set(err, ST_EUNSUPPORTED,
                          "block %d (%s): %zu weights, more than one MPI "
                          "message carries (2 GiB); weight streaming over "
                          "ranks sends a block whole (larger blocks are not "
                          "built)",
                          i, m->blocks[i].name, m->blocks[i].n_params);
  /* from here a failure may be this rank's alone */
  st_dist_unshare_error();
  int rc = st_dist_group_create(&w->all, 0, w->me, err);
  if (rc) return rc;
  size_t rows = (size_t)m->label_rows;
  w->lossbuf = st_alloc((size_t)N * w->share * rows * sizeof(float));
  w->logits = st_alloc((size_t)max_batch * rows * m->out_cols * sizeof(float));
  w->use_block = malloc(2 * (size_t)w->nb * sizeof *w->use_block);
  w->queue = malloc(((size_t)w->nb + 1) * sizeof *w->queue);
  if (!w->lossbuf || !w->logits || !w->use_block || !w->queue)
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
  if (!rc && w->me == 0) {
    if (!strcmp(cfg->execution.store, "file")) rc = open_store(w, m, cfg, err);
    if (!rc && w->store) w->kept = *st_store_pos(w->store);
    size_t slot_floats = (size_t)w->slots * w->max_params;
    w->sbuf = st_alloc(slot_floats * sizeof(float));
    w->ggot = st_alloc((size_t)C * w->max_params * sizeof(float));
    w->req = calloc((size_t)w->slots * C, sizeof *w->req);
    w->opt_pool = st_pool_create(1);
    if (!rc && !(w->sbuf && w->ggot && w->req && w->opt_pool))
      rc = st_error_set(err, ST_ENOMEM,
                        "out of memory for weight streaming's store rank");
    if (!rc) {
      w->opt_thread =
          pthread_create(&w->optimizer, NULL, optimizer_main, w) == 0;
      if (!w->opt_thread)
        rc = st_error_set(err, ST_ENOMEM, "cannot start the optimizer thread");
    }
  } else if (!rc) {
    buffers(w, 1);
    rc = check_limit(m, cfg, w->slots, w->rows, max_batch, w->compute_bytes,
                     err);
    if (!rc) {
      w->outs = calloc((size_t)w->nb, sizeof *w->outs);
      w->gnext = st_alloc(w->max_params * sizeof(float));
      w->req = calloc((size_t)w->slots, sizeof *w->req);
      if (!(w->outs && w->gnext && w->req && buffers(w, 0)))
        rc = st_error_set(err, ST_ENOMEM,
                          "out of memory for weight streaming's compute side "
                          "(%lld bytes)",
                          (long long)w->compute_bytes);
    }
  }
  /* where a file store stands, for every rank (a resumed run) */
  st_error e = {0};
  int sent = st_dist_bcast(w->all, &w->kept, sizeof w->kept, 0, &e);
  if (!rc && sent) rc = sent, *err = e;
  return st_dist_agree(rc, err);
}

static int ws_create(void **state, const st_model *m, const st_config *cfg,
                     int micro_batch, int max_batch, st_error *err) {
  *state = NULL;
  ws *w = calloc(1, sizeof *w);
  if (!w) return st_error_set(err, ST_ENOMEM, "out of memory");
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->model = m;
  w->nb = m->n_blocks;
  w->weight_size = sizeof(float);
  w->qv = &w->opt_view; /* the step's view, rewritten by each step (the
                           updates of a step are queued after its start) */
  /* a walk uses 2 n slots at most: more prefetch would fill nothing */
  w->slots = cfg->execution.prefetch < 2 * w->nb ? cfg->execution.prefetch + 1
                                                 : 2 * w->nb;
  w->keep = cfg->execution.keep_activations;
  w->rows = micro_batch > max_batch ? micro_batch : max_batch;
  for (int i = 0; i < m->n_blocks; i++)
    if (m->blocks[i].n_params > w->max_params)
      w->max_params = m->blocks[i].n_params;
  if (st_dist_size() > 1) { /* a store rank and compute ranks */
    int rc = remote_create(w, m, cfg, micro_batch, max_batch, err);
    if (rc) {
      ws_destroy(w);
      return rc;
    }
    *state = w;
    return 0;
  }
  /* size first, check the limit, then allocate */
  buffers(w, 1);
  int rc =
      check_limit(m, cfg, w->slots, w->rows, max_batch, w->compute_bytes, err);
  if (!rc && strcmp(cfg->execution.store, "file") != 0 &&
      strcmp(cfg->execution.store_weights, "bf16") == 0)
    rc = st_error_set(err, ST_ECONFIG,
                      "%s: execution.store_weights: bf16 needs "
                      "execution.store: file (the memory store is the "
                      "trainer's own fp32 weights)",
                      st_config_where(cfg, "execution.store_weights"));
  /* the store before the buffers: making one touches a block or two of
   * its pages, which should not add to the buffers' resident memory */
  if (!rc && strcmp(cfg->execution.store, "file") == 0)
    rc = open_store(w, m, cfg, err);
  if (!rc) {
    w->outs = calloc((size_t)w->nb, sizeof *w->outs);
    w->use_block = malloc(2 * (size_t)w->nb * sizeof *w->use_block);
    w->queue = malloc(((size_t)w->nb + 1) * sizeof *w->queue);
    w->opt_pool = st_pool_create(1);
    if (!(w->outs && w->use_block && w->queue && w->opt_pool && buffers(w, 0)))
      rc = st_error_set(err, ST_ENOMEM,
                        "out of memory for weight streaming's compute side "
                        "(%lld bytes)",
                        (long long)w->compute_bytes);
  }
  if (!rc && cfg->execution.prefetch > 0) {
    w->fetch_thread = pthread_create(&w->fetcher, NULL, fetch_main, w) == 0;
    if (!w->fetch_thread)
      rc = st_error_set(err, ST_ENOMEM, "cannot start the fetch thread");
  }
  if (!rc) {
    w->opt_thread = pthread_create(&w->optimizer, NULL, optimizer_main, w) == 0;
    if (!w->opt_thread)
      rc = st_error_set(err, ST_ENOMEM, "cannot start the optimizer thread");
  }
  if (rc) {
    ws_destroy(w);
    return rc;
  }
  *state = w;
  return 0;
}

/* -------------------------------------------------------------- a step */

/* Block i's input for these rows: the batch, or the block before's output. */
static const float *input_of(const ws *w, int i, const float *x, int B) {
  if (i == 0) return x;
  const st_block *p = &w->model->blocks[i - 1];
  return w->keep ? st_block_output(p, w->stage->acts[i - 1], B)
                 : w->outs[i - 1];
}

/* The end of a step (rc: how it went so far): the optimizer thread's
 * updates waited for; then, unless it failed or update is 0, the first
 * block's update, the step's last, when the compute side has nothing left
 * to do: it runs on the compute side's cores (the same bits: the rules are
 * elementwise), and a file store moves on to the copy it wrote. */
static int finish_step(ws *w, st_trainer_view *v, int rc, int update,
                       st_error *err) {
  drain(w);
  /* a failed read, write or commit: write nothing more, and say so first.
   * Weights a read left stale may be what made the loss non-finite, and a
   * sweep takes ST_ENONFINITE for a diverged trial, not a disk's fault. */
  st_error io = {0};
  int failed = pending_error(w, &io);
  if (failed) {
    *err = io;
    return failed;
  }
  if (rc || !update) return rc;
  st_trainer_view last_view = w->opt_view;
  last_view.ctx.pool = v->ctx.pool;
  double t0 = st_now();
  update_block(w, &last_view, 0);
  st_rt_trace(v, ST_TRACE_UPDATE, 0, t0, st_now());
  w->last_update_s += st_now() - t0;
  /* every value of the other copy is written: the next step reads it */
  rc = pending_error(w, err);
  if (!rc && w->store) st_store_advance(w->store);
  return rc;
}

/* ------------------------------------------------ a step over MPI ranks */

/* This step's walk: forward 0 .. n-1, backward n-1 .. 0. */
static void walk(ws *w) {
  for (int i = 0; i < w->nb; i++) {
    w->use_block[i] = i;
    w->use_block[w->nb + i] = w->nb - 1 - i;
  }
}

/* A compute rank: the receive of use u's weights into its slot. */
static int post_weights(ws *w, int u, st_error *err) {
  const st_block *b = &w->model->blocks[w->use_block[u]];
  float *slot = w->wslot + (size_t)(u % w->slots) * w->max_params;
  return st_dist_irecv(w->all, 0, slot, b->n_params * sizeof(float), 0, 0,
                       &w->req[u % w->slots], err);
}

/* A compute rank: use u's weights, once here. */
static const float *wait_weights(ws *w, int u, st_error *err) {
  double t0 = st_now();
  if (st_dist_wait(&w->req[u % w->slots], NULL, NULL, err)) return NULL;
  w->stall_s += st_now() - t0;
  const st_block *b = &w->model->blocks[w->use_block[u]];
  w->bytes_in += (int64_t)(b->n_params * sizeof(float));
  int held = w->slots < 2 * w->nb ? w->slots : 2 * w->nb;
  if (held > w->held_max) w->held_max = held;
  return w->wslot + (size_t)(u % w->slots) * w->max_params;
}

/* The store: every send from slot k done. */
static int slot_sent(ws *w, int k, st_error *err) {
  int rc = 0;
  for (int r = 0; r < w->ranks - 1; r++) {
    int e =
        st_dist_wait(&w->req[(size_t)k * (w->ranks - 1) + r], NULL, NULL, err);
    if (!rc) rc = e;
  }
  return rc;
}

/* The store: the weights of uses *next .. upto - 1 read into their slots
 * (once the slot's last sends are done) and sent to every compute rank. */
static int send_upto(ws *w, int *next, int upto, const float *params,
                     st_error *err) {
  if (upto > 2 * w->nb) upto = 2 * w->nb;
  int rc = 0;
  for (; *next < upto && !rc; (*next)++) {
    int u = *next, k = u % w->slots;
    const st_block *b = &w->model->blocks[w->use_block[u]];
    float *slot = w->sbuf + (size_t)k * w->max_params;
    if ((rc = slot_sent(w, k, err))) break;
    fetch_block(w, b, params, slot);
    if ((rc = pending_error(w, err))) break;
    for (int r = 1; r < w->ranks && !rc; r++)
      rc = st_dist_isend(w->all, 0, slot, b->n_params * sizeof(float), r, 0,
                         &w->req[(size_t)k * (w->ranks - 1) + r - 1], err);
    w->bytes_out += (int64_t)(b->n_params * sizeof(float)) * (w->ranks - 1);
  }
  return rc;
}

/* Every rank: the compute ranks' losses into v->losses (rank r's share at
 * (r - 1) x share), then the batch loss checked as in one process. */
static int gather_losses(ws *w, st_trainer_view *v, const float *mine,
                         double *loss, st_error *err) {
  size_t part = (size_t)w->share * w->model->label_rows;
  if (mine) /* a compute rank's; the store has none */
    memcpy(w->lossbuf + (size_t)w->me * part, mine, part * sizeof(float));
  int rc =
      st_dist_group_allgather(w->all, w->lossbuf, part * sizeof(float), err);
  if (rc) return rc;
  memcpy(v->losses, w->lossbuf + part,
         (size_t)(w->ranks - 1) * part * sizeof(float));
  rc = st_trainer_check_loss(v, loss, err);
  if (rc) st_dist_share_error(); /* every rank checked the same losses */
  return rc;
}

/* A compute rank's step: its share forward and back, block by block, the
 * weights received, each block's gradient sent to the store. */
static int compute_step(ws *w, st_trainer_view *v, double *loss,
                        st_error *err) {
  const st_model *m = w->model;
  const int nb = w->nb, uses = 2 * nb, mb = w->share;
  st_trainer_view r;
  st_replica_view(&r, v, m, w->me - 1, w->share, w->share);
  st_ctx ctx = st_rt_ctx(&r, 0);
  int rc = 0, posted = 0;
  for (; posted < w->slots && posted < uses && !rc; posted++)
    rc = post_weights(w, posted, err);
  double t0 = st_now();
  const float *h = r.x;
  for (int i = 0; i < nb && !rc; i++) {
    const st_block *b = &m->blocks[i];
    const float *wb = wait_weights(w, i, err);
    if (!wb) return err->code ? err->code : ST_EIO;
    h = st_stage_forward_block(w->stage, &ctx, i, wb, h, mb);
    if (!w->keep) {
      memcpy(w->outs[i], h, (size_t)mb * st_shape_numel(b->out) * sizeof *h);
      h = w->outs[i];
    }
    if (posted < uses) rc = post_weights(w, posted++, err);
  }
  if (rc) return rc;
  st_rt_loss(&r, ctx.pool, 0, mb, h, r.probs);
  st_rt_trace(v, ST_TRACE_FORWARD, 0, t0, st_now());
  if ((rc = gather_losses(w, v, r.losses, loss, err))) {
    /* stopped before any update: the weights already on their way are
     * taken (the store sent them), nothing more is asked for */
    st_error ignored = {0};
    for (int u = nb; u < posted; u++) wait_weights(w, u, &ignored);
    return rc;
  }
  t0 = st_now();
  st_rt_loss_grad(&r, ctx.pool, 0, mb, r.loss_batch, r.probs, r.dlogits);
  const float *g = r.dlogits;
  float *gb[2] = {w->gbuf, w->gnext};
  for (int u = nb; u < uses && !rc; u++) {
    int i = w->use_block[u], j = (u - nb) & 1;
    const st_block *b = &m->blocks[i];
    const float *wb = wait_weights(w, u, err);
    if (!wb) return err->code ? err->code : ST_EIO;
    const float *in = input_of(w, i, r.x, mb);
    if (!w->keep) st_stage_forward_block(w->stage, &ctx, i, wb, in, mb);
    /* the buffer sent two blocks ago is free again */
    if ((rc = st_dist_wait(&w->greq[j], NULL, NULL, err))) break;
    memset(gb[j], 0, b->n_params * sizeof(float));
    float *dx = st_stage_grad_to(w->stage->grad_io, g, i, NULL);
    st_stage_backward_block(w->stage, &ctx, i, wb, gb[j], in, g, dx, mb);
    if (posted < uses) rc = post_weights(w, posted++, err);
    if (!rc && w->reduce) /* the library's sum, at the store */
      rc = st_dist_reduce_in(w->all, gb[j], b->n_params, 0, err);
    else if (!rc)
      rc = st_dist_isend(w->all, 1, gb[j], b->n_params * sizeof(float), 0, 0,
                         &w->greq[j], err);
    w->bytes_out += (int64_t)(b->n_params * sizeof(float));
    g = dx;
  }
  for (int j = 0; j < 2 && !rc; j++)
    rc = st_dist_wait(&w->greq[j], NULL, NULL, err);
  st_rt_trace(v, ST_TRACE_BACKWARD, 0, t0, st_now());
  return rc;
}

/* The store: block b's gradient from every compute rank, summed in rank
 * order (or by MPI_Reduce), into the store's gradient. */
static int gather_grad(ws *w, st_trainer_view *v, const st_block *b,
                       st_error *err) {
  const int C = w->ranks - 1;
  size_t n = b->n_params;
  float *sum = w->store ? w->ggot : v->grads + b->param_off;
  int rc = 0;
  if (w->reduce) {
    memset(sum, 0, n * sizeof(float));
    rc = st_dist_reduce_in(w->all, sum, n, 0, err);
  } else {
    st_dist_req got[ST_DIST_MAX_RANKS];
    memset(got, 0, (size_t)C * sizeof *got); /* none live */
    for (int r = 0; r < C && !rc; r++)
      rc = st_dist_irecv(w->all, 1, w->ggot + (size_t)r * w->max_params,
                         n * sizeof(float), r + 1, 0, &got[r], err);
    for (int r = 0; r < C && !rc; r++)
      rc = st_dist_wait(&got[r], NULL, NULL, err);
    for (int r = 0; rc && r < C; r++) /* those not waited for: given up */
      w->leaky |= st_dist_forget(&got[r]);
    /* ((g1 + g2) + g3) + ...: the replicas' order */
    if (!rc && sum != w->ggot) memcpy(sum, w->ggot, n * sizeof(float));
    for (int r = 1; r < C && !rc; r++) {
      const float *restrict add = w->ggot + (size_t)r * w->max_params;
      for (size_t k = 0; k < n; k++) sum[k] += add[k];
    }
  }
  w->bytes_in += (int64_t)(n * sizeof(float)) * C;
  if (!rc && w->store) grad_io(w, 1, b, sum);
  return rc;
}

/* The store's step: the weights out, the losses checked, the gradients in
 * and each block updated as its gradient completes. */
static int store_step(ws *w, st_trainer_view *v, double *loss, st_error *err) {
  const int nb = w->nb;
  w->opt_view = *v;
  w->opt_view.ctx.pool = w->opt_pool;
  w->opt_view.ctx.fused = NULL;
  w->opt_view.trace = NULL;
  int next = 0;
  /* the forward's weights, and the backward's that the compute ranks have
   * posted receives for before the losses are gathered */
  int rc = send_upto(w, &next, nb + w->slots, v->params, err);
  if (!rc) rc = gather_losses(w, v, NULL, loss, err);
  for (int j = 0; j < nb && !rc; j++) {
    int u = nb + j, i = w->use_block[u];
    double t0 = st_now();
    rc = send_upto(w, &next, u + w->slots, v->params, err);
    if (!rc) rc = gather_grad(w, v, &w->model->blocks[i], err);
    st_rt_trace(v, ST_TRACE_RECV, 0, t0, st_now());
    if (!rc && i > 0) submit(w, i);
  }
  /* every send done (a stopped step's too: the compute ranks take them) */
  for (int k = 0; k < w->slots; k++) {
    st_error ignored = {0};
    int e = slot_sent(w, k, rc ? &ignored : err);
    if (!rc) rc = e;
  }
  return finish_step(w, v, rc, 1, err);
}

static int remote_step(ws *w, st_trainer_view *v, double *loss, st_error *err) {
  if (pending_error(w, err)) return err->code;
  double start = st_now();
  walk(w);
  int rc =
      w->me == 0 ? store_step(w, v, loss, err) : compute_step(w, v, loss, err);
  w->steps++;
  w->busy += st_now() - start;
  return rc;
}

/* Evaluation over ranks: the store sends each block to rank 1, which runs
 * the batch and broadcasts the logits. NULL if a message failed. */
static const float *remote_forward(ws *w, const st_ctx *ctx,
                                   const float *params, const float *x, int B) {
  const st_model *m = w->model;
  st_error err = {0};
  const float *h = x;
  for (int i = 0; i < w->nb && w->me <= 1; i++) {
    const st_block *b = &m->blocks[i];
    size_t bytes = b->n_params * sizeof(float);
    st_dist_req r;
    if (w->me == 0) {
      fetch_block(w, b, params, w->sbuf);
      if (pending_error(w, &err) ||
          st_dist_isend(w->all, 0, w->sbuf, bytes, 1, 1, &r, &err) ||
          st_dist_wait(&r, NULL, NULL, &err))
        return NULL;
      continue;
    }
    if (st_dist_irecv(w->all, 0, w->wslot, bytes, 0, 1, &r, &err) ||
        st_dist_wait(&r, NULL, NULL, &err))
      return NULL;
    h = st_stage_forward_block(w->stage, ctx, i, w->wslot, h, B);
    if (!w->keep) {
      memcpy(w->outs[i], h, (size_t)B * st_shape_numel(b->out) * sizeof *h);
      h = w->outs[i];
    }
  }
  size_t bytes = (size_t)B * m->label_rows * m->out_cols * sizeof(float);
  if (w->me == 1) memcpy(w->logits, h, bytes);
  return st_dist_bcast(w->all, w->logits, bytes, 1, &err) ? NULL : w->logits;
}

static int ws_step(void *state, st_trainer_view *v, double *loss,
                   st_error *err) {
  ws *w = state;
  if (w->ranks) return remote_step(w, v, loss, err);
  const st_model *m = v->model;
  size_t in_numel = st_shape_numel(m->in);
  int mb = v->micro_batch, nb = w->nb;
  /* an earlier commit that failed stops the run here */
  if (pending_error(w, err)) return err->code;
  double start = st_now();
  /* The store's update is the sequential mode's, on the optimizer thread's
   * pool, never fused into the backward (the compute side does not touch
   * the store's weights). Same bits: the rules are elementwise. */
  w->opt_view = *v;
  w->opt_view.ctx.pool = w->opt_pool;
  w->opt_view.ctx.fused = NULL;
  w->opt_view.trace = NULL;
  st_ctx ctx = v->ctx;
  ctx.fused = NULL;
  /* this step's walk: forward 0 .. n-1, backward n-1 .. 0 */
  for (int i = 0; i < nb; i++) {
    w->use_block[i] = i;
    w->use_block[nb + i] = nb - 1 - i;
  }
  int rc = 0;
  for (int k = 0; k < v->batch && !rc; k += mb) {
    const float *x = v->x + (size_t)k * in_numel;
    int first = k == 0, last = k + mb >= v->batch;
    ctx = st_rt_ctx(v, k);
    ctx.fused = NULL;
    /* the walk of this micro-batch */
    pthread_mutex_lock(&w->mu);
    w->n_use = 2 * nb;
    w->store_params = v->params;
    w->fetched = w->released = 0;
    w->generation++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);

    double t0 = st_now();
    const float *h = x;
    for (int i = 0; i < nb; i++) {
      const st_block *b = &m->blocks[i];
      const float *wb = acquire(w, i);
      h = st_stage_forward_block(w->stage, &ctx, i, wb, h, mb);
      if (!w->keep) {
        memcpy(w->outs[i], h, (size_t)mb * st_shape_numel(b->out) * sizeof *h);
        h = w->outs[i];
      }
      release(w, i);
    }
    st_rt_loss(v, ctx.pool, k / mb, mb, h, v->probs);
    st_rt_trace(v, ST_TRACE_FORWARD, k / mb, t0, st_now());
    /* every loss is known before the last backward, where weights start
     * to change: a NaN stops the step untouched */
    if (last && (rc = st_trainer_check_loss(v, loss, err))) {
      /* let the fetch thread finish the walk it was given */
      for (int u = nb; u < 2 * nb; u++) {
        acquire(w, u);
        release(w, u);
      }
      break;
    }
    t0 = st_now();
    st_rt_loss_grad(v, ctx.pool, k / mb, mb, v->loss_batch, v->probs,
                    v->dlogits);
    const float *g = v->dlogits;
    for (int u = nb; u < 2 * nb; u++) {
      int i = w->use_block[u];
      const st_block *b = &m->blocks[i];
      const float *wb = acquire(w, u);
      const float *in = input_of(w, i, x, mb);
      if (!w->keep) st_stage_forward_block(w->stage, &ctx, i, wb, in, mb);
      /* the gradient so far: none on the first micro-batch, else what the
       * store holds (fetched back to add to) */
      float *store_g = v->grads + b->param_off;
      size_t bytes = b->n_params * sizeof(float);
      if (first) {
        memset(w->gbuf, 0, bytes);
      } else {
        if (w->store)
          grad_io(w, 0, b, w->gbuf);
        else
          memcpy(w->gbuf, store_g, bytes);
        w->bytes_in += (int64_t)bytes;
      }
      float *dx = st_stage_grad_to(w->stage->grad_io, g, i, NULL);
      st_stage_backward_block(w->stage, &ctx, i, wb, w->gbuf, in, g, dx, mb);
      release(w, u);
      /* send it to the store; after the last micro-batch the store
       * updates the block while the compute side goes on */
      if (w->store)
        grad_io(w, 1, b, w->gbuf);
      else
        memcpy(store_g, w->gbuf, bytes);
      w->bytes_out += (int64_t)bytes;
      if (last && !v->grads_only && i > 0) submit(w, i);
      g = dx;
    }
    st_rt_trace(v, ST_TRACE_BACKWARD, k / mb, t0, st_now());
    if (first) st_rt_noise_first(v, mb);
  }
  rc = finish_step(w, v, rc, !v->grads_only, err);
  w->steps++;
  w->busy += st_now() - start;
  return rc;
}

static const float *ws_forward(void *state, const st_ctx *ctx,
                               const float *params, const float *x, int B) {
  /* Evaluation: the same walk without a backward, fetching each block from
   * the store (synchronously: evaluation is not where the time goes). A
   * failed read stops it (NULL; ws_commit names the error): the slot holds
   * whatever it held before, and an evaluation on it reported a loss. */
  ws *w = state;
  if (w->ranks) return remote_forward(w, ctx, params, x, B);
  const float *h = x;
  float *slot = w->wslot;
  for (int i = 0; i < w->nb; i++) {
    const st_block *b = &w->model->blocks[i];
    st_error e = {0};
    fetch_block(w, b, params, slot);
    if (w->store && pending_error(w, &e)) return NULL;
    h = st_stage_forward_block(w->stage, ctx, i, slot, h, B);
    if (!w->keep) {
      memcpy(w->outs[i], h, (size_t)B * st_shape_numel(b->out) * sizeof *h);
      h = w->outs[i];
    }
  }
  return h;
}

static int ws_stats(void *state, st_track_stats *out, int cap, double *wall) {
  const ws *w = state;
  *wall = w->busy;
  if (cap > 0)
    out[0] = (st_track_stats){"compute", 0, w->nb, w->busy - w->stall_s, 0};
  return 1;
}

int st_ws_stats(const void *state, st_stream_stats *out) {
  const ws *w = state;
  if (!w) return -1;
  out->steps = w->steps;
  out->bytes_in = w->bytes_in;
  out->bytes_out = w->bytes_out;
  out->stall_s = w->stall_s;
  out->wait_optimizer_s = w->wait_opt_s;
  out->last_update_s = w->last_update_s;
  out->max_blocks_held = w->held_max;
  out->compute_bytes = w->compute_bytes;
  return 0;
}

static int ws_slabs(void *state, float **params, const uint16_t **bf16,
                    float **grads, float **opt) {
  ws *w = state;
  if (!w->store) return 0;
  *params = st_store_bf16(w->store) ? NULL : st_store_slab(w->store, 0);
  *bf16 = st_store_bf16(w->store) ? st_store_slab(w->store, 0) : NULL;
  *opt = st_store_slab(w->store, 1);
  *grads = st_store_grads(w->store);
  return 1;
}

static const st_train_pos *ws_stored_pos(void *state) {
  ws *w = state;
  if (w->store) return st_store_pos(w->store);
  /* a compute rank: where the store rank's file store stood at start */
  return w->ranks && w->kept.batch > 0 ? &w->kept : NULL;
}

/* Over ranks: the store rank keeps every block, a compute rank none. */
static int ws_owns(void *state, unsigned char *mine) {
  ws *w = state;
  if (!w->ranks) return 0;
  memset(mine, w->me == 0, (size_t)w->nb);
  return 1;
}

/* Over ranks, the store rank's memory store written by it alone. */
static int ws_save(void *state, const char *path, int shards,
                   const float *params, const float *opt,
                   const char *optim_kind, const st_train_pos *pos,
                   st_error *err) {
  ws *w = state;
  if (w->me != 0) return 0;
  if (shards)
    return st_checkpoint_save_sharded(path, w->model, params, opt, optim_kind,
                                      pos, err);
  return st_checkpoint_save(path, w->model, params, opt, optim_kind, pos, err);
}

/* The step just taken, committed on the optimizer thread while the next
 * one's forward runs (its first update queues behind the commit). */
static int ws_commit(void *state, const st_train_pos *pos, int wait,
                     st_error *err) {
  ws *w = state;
  if (!w->store) return 0;
  if (pending_error(w, err)) return err->code;
  if (pos) {
    pthread_mutex_lock(&w->mu);
    w->commit_pos = *pos;
    w->commit_copy = st_store_live(w->store);
    pthread_mutex_unlock(&w->mu);
    if (w->opt_thread) {
      submit(w, -1);
    } else {
      st_error e = {0};
      if (st_store_commit(w->store, w->commit_copy, pos, &e)) io_failed(w, &e);
    }
  }
  if (wait) drain(w);
  return pending_error(w, err) ? err->code : 0;
}

st_store *st_ws_store(void *state) { return ((ws *)state)->store; }

const st_executor st_exec_weight_streaming = {
    .mode = "weight_streaming",
    .step = ws_step,
    .forward = ws_forward,
    .create = ws_create,
    .destroy = ws_destroy,
    .stats = ws_stats,
    .slabs = ws_slabs,
    .stored_pos = ws_stored_pos,
    .commit = ws_commit,
    .owns = ws_owns,
    .save = ws_save,
};
