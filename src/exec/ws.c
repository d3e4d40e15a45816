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
 */
#include "exec.h"

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

static void ws_destroy(void *state) {
  ws *w = state;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->fetch_thread) pthread_join(w->fetcher, NULL);
  if (w->opt_thread) pthread_join(w->optimizer, NULL);
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
 * workspace — the figure compute_memory_limit is checked against. rows is
 * the larger of the micro-batch and the evaluation batch (eval_rows). */
static int check_limit(const st_model *m, const st_config *cfg, int rows,
                       int eval_rows, int64_t have, st_error *err) {
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
      worst, b->name, cfg->execution.prefetch + 1,
      cfg->execution.prefetch ? "s" : "", b->n_params, rows,
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
  /* size first, check the limit, then allocate */
  buffers(w, 1);
  int rc = check_limit(m, cfg, w->rows, max_batch, w->compute_bytes, err);
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

static int ws_step(void *state, st_trainer_view *v, double *loss,
                   st_error *err) {
  ws *w = state;
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
    ctx.first_sample = v->first_sample + (uint64_t)k;
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
  drain(w);
  /* The first block's update comes last, when the compute side has nothing
   * left to do: the store runs it on the compute side's cores (the same
   * bits: the rules are elementwise). */
  if (!rc) rc = pending_error(w, err); /* a failed commit: write nothing */
  if (!rc && !v->grads_only) {
    st_trainer_view last_view = w->opt_view;
    last_view.ctx.pool = v->ctx.pool;
    double t0 = st_now();
    update_block(w, &last_view, 0);
    st_rt_trace(v, ST_TRACE_UPDATE, 0, t0, st_now());
    w->last_update_s += st_now() - t0;
    /* every value of the other copy is written: the next step reads it */
    rc = pending_error(w, err);
    if (!rc && w->store) st_store_advance(w->store);
  }
  w->steps++;
  w->busy += st_now() - start;
  return rc;
}

static const float *ws_forward(void *state, const st_ctx *ctx,
                               const float *params, const float *x, int B) {
  /* Evaluation: the same walk without a backward, fetching each block from
   * the store (synchronously: evaluation is not where the time goes). */
  ws *w = state;
  const float *h = x;
  float *slot = w->wslot;
  for (int i = 0; i < w->nb; i++) {
    const st_block *b = &w->model->blocks[i];
    fetch_block(w, b, params, slot);
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
  return w->store ? st_store_pos(w->store) : NULL;
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
};
