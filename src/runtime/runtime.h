/*
 * runtime.h — the stage runtime every pipelined schedule runs on (internal,
 * not part of the public API). A stage is a contiguous range of blocks with
 * its activation slots, its share of the cores (a pool, a pinned thread)
 * and its links to the stages before and after it: in-process channels or
 * MPI messages behind one interface (st_rt_send, st_rt_recv). The runtime
 * owns what every schedule repeats — the first error that stops a step,
 * placement of stages on ranks, threads and pinning, link buffers, busy
 * counters and the trace — and a schedule (exec/pipeline.c: gpipe, 1f1b,
 * block_sequential; exec/pb.c: pipelined backprop) says only in which
 * order each stage runs which micro-batch's forward and backward, and what
 * it does to its weights.
 *
 * st_stage (stage.c) is the compute part alone: a stage's blocks, their
 * activations for up to max_batch samples, the backward's workspace. The
 * sequential mode and weight streaming run one; the pipelined schedules
 * one per activation slot.
 */
#ifndef STRATA_RUNTIME_H
#define STRATA_RUNTIME_H

#include "strata.h"

#include "../base/chan.h"
#include "../dist/dist.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>

/* Stage s of a segment of k stages, over P members: its member. */
static inline int st_placed_owner(int s, int k, int P) {
  return (int)((long long)s * P / k);
}
/* Pins a thread to the cpus cpus[0 .. n); -1 if the system refused
 * (base/pool.c). */
int st_pin_thread(pthread_t thread, const int *cpus, int n);

/* ------------------------------------------------- a step's inputs */

/* One optimizer step over the trainer's batch, as a mode's stages see it:
 * its data, weights, buffers and settings. The view carries what the executor
 * needs to update weights itself, block by block (st_trainer_update_blocks), as
 * soon as a block's gradient is complete. */
typedef struct st_trainer_view {
  const st_model *model;
  st_ctx ctx; /* pool, seed; first_sample set per batch */
  float *params, *grads, *opt;
  const float *x;         /* batch inputs */
  const int *y;           /* batch labels */
  float *losses;          /* per sample (batch) */
  float *probs, *dlogits; /* micro_batch * label rows * out_cols */
  int batch, micro_batch;
  int loss_batch;       /* the loss is a mean over this many samples: the
                           step's whole batch (replicas run a share of it,
                           `batch`, each) */
  int grads_only;       /* replicas: accumulate gradients and check the
                           loss, but update nothing; the caller reduces the
                           replicas' gradients and updates */
  st_trace *trace;      /* --trace, else NULL */
  int track;            /* this executor's first trace track */
  const st_config *cfg; /* optimizer settings */
  float lr;             /* this step's learning rate */
  int64_t step;         /* optimizer steps done before this one */
  int64_t first_sample; /* global index of the batch's first sample */
  /* Noise scale (metrics.noise_scale), else NULL: the executor writes the
   * first micro-batch's squared gradient norm to *gs2 (as a mean over its
   * samples); st_trainer_update_blocks adds the batch's, block by block,
   * into *gb2 before updating. */
  double *gs2, *gb2;
} st_trainer_view;

/* The context of the micro-batch whose first sample is sample `first` of
 * the view's batch: its dropout stream and its labels (a fused head reads
 * them in its forward). */
static inline st_ctx st_rt_ctx(const st_trainer_view *v, int64_t first) {
  st_ctx c = v->ctx;
  c.first_sample = (uint64_t)(v->first_sample + first);
  c.labels = v->y + (size_t)first * (size_t)v->model->label_rows;
  return c;
}

/* A step stopped by a stage on another rank (the cause is that rank's). */
enum { ST_EXEC_PEER_STOPPED = 1000 };

/* ------------------------------------------------- blocks of one stage */

typedef struct st_stage {
  const st_model *model;
  int first, count; /* blocks [first, first + count) */
  int max_batch;
  float **acts; /* per block: max_batch * act_per_sample */
  /* The workspace, sized by the stage's own blocks (their largest
   * max_numel and scratch_floats_per_sample): */
  float *work;       /* 3 * max_batch * max_numel */
  float *scratch;    /* max_batch * scratch_floats_per_sample */
  float *grad_io[2]; /* gradients between blocks: max_batch * max_numel */
  int owns_work;     /* 0: another stage's (st_stage_create_with) */
  size_t base;       /* params/grads passed in start at this slab offset
                        (0: the model's slab; pipelined_backprop passes
                        its stage's own weight versions) */
  int shared_acts;   /* one activation buffer for every block (weight
                        streaming's recompute): block by block only */
  float **dys;       /* split backward (st_stage_enable_split): per block,
                        max_batch * st_block_dys_floats, from B to W */
} st_stage;

int st_stage_create(st_stage **out, const st_model *m, int first, int count,
                    int max_batch, st_error *err);
/* The same with shared_acts: every block's activations in one buffer, the
 * largest block's size, for a caller that keeps each block's output itself
 * and runs its forward again before its backward (weight streaming's
 * keep_activations: false); only the block-by-block calls below apply. */
int st_stage_create_shared(st_stage **out, const st_model *m, int first,
                           int count, int max_batch, int shared_acts,
                           st_error *err);
/* The same, the workspace (work, scratch, grad_io) taken from `with`, a
 * stage of the same blocks and max_batch that never runs at the same time
 * (a schedule's activation slots of one stage: its thread runs one
 * micro-batch's forward or backward at a time, and nothing in the
 * workspace outlives the call). NULL: its own. */
int st_stage_create_with(st_stage **out, const st_model *m, int first,
                         int count, int max_batch, int shared_acts,
                         const st_stage *with, st_error *err);
/* The bytes such a stage's buffers take (activations, and the workspace:
 * scratch, the backward's work and the two gradient hand-off buffers,
 * st_stage_work_bytes). */
size_t st_stage_bytes(const st_model *m, int first, int count, int max_batch,
                      int shared_acts);
size_t st_stage_work_bytes(const st_model *m, int first, int count,
                           int max_batch);
void st_stage_destroy(st_stage *s);
/* Block first + i alone on B samples, its weights (and gradient) at w (g):
 * the block's own slab, wherever the caller keeps it (weight streaming: a
 * slot the store filled). The forward returns the block's output. */
const float *st_stage_forward_block(st_stage *s, const st_ctx *ctx, int i,
                                    const float *w, const float *in, int B);
void st_stage_backward_block(st_stage *s, const st_ctx *ctx, int i,
                             const float *w, float *g, const float *in,
                             const float *dout, float *din, int B);
/* Where block i's input gradient goes on the way back, given the output
 * gradient g it is computed from: din for the first block (i == 0; NULL:
 * not wanted), else whichever of the two hand-off buffers g is not. */
static inline float *st_stage_grad_to(float *const io[2], const float *g, int i,
                                      float *din) {
  return i == 0 ? din : g == io[0] ? io[1] : io[0];
}
/* Runs the stage's blocks on B samples; returns the last block's output. */
const float *st_stage_forward(st_stage *s, const st_ctx *ctx,
                              const float *params, const float *in, int B);
/* Backward through the stage's blocks; adds into grads (model-wide slab
 * layout); writes din unless it is NULL. */
void st_stage_backward(st_stage *s, const st_ctx *ctx, const float *params,
                       float *grads, const float *in, const float *dout,
                       float *din, int B);
/* The same, calling after_block(arg, block index) as soon as each block's
 * backward is done — its input gradient is computed, so its weights may be
 * updated while its gradients are still in cache. */
void st_stage_backward_each(st_stage *s, const st_ctx *ctx, const float *params,
                            float *grads, const float *in, const float *dout,
                            float *din, int B,
                            void (*after_block)(void *arg, int block),
                            void *arg);

/* The backward in two halves (zb1p): st_stage_enable_split allocates
 * what B keeps for W; B writes din (unless NULL) and no weight gradient;
 * W then adds each block's weight gradient, last block first, calling
 * after_block as st_stage_backward_each does. Together they add the bits
 * st_stage_backward adds. The activations must stay until W. */
int st_stage_enable_split(st_stage *s, st_error *err);
void st_stage_backward_input(st_stage *s, const st_ctx *ctx,
                             const float *params, const float *in,
                             const float *dout, float *din, int B);
void st_stage_backward_weights_each(st_stage *s, const st_ctx *ctx,
                                    const float *params, float *grads,
                                    const float *in, int B,
                                    void (*after_block)(void *arg, int block),
                                    void *arg);

/* ------------------------------------------------- a micro-batch's step */

/* The loss of micro-batch k of the step (its mb samples from k mb): the
 * per-sample losses into v->losses, the softmax of logits into probs
 * (mb x label rows x classes). */
void st_rt_loss(const st_trainer_view *v, st_pool *pool, int64_t k, int mb,
                const float *logits, float *probs);
/* Its gradient into dlogits, as the mean over `over` samples (the step's
 * whole batch, v->loss_batch; pipelined backprop: the micro-batch). */
void st_rt_loss_grad(const st_trainer_view *v, st_pool *pool, int64_t k, int mb,
                     int over, const float *probs, float *dlogits);
/* metrics.noise_scale (v->gs2 set), after micro-batch 0's backward: its
 * squared gradient norm, as a mean over its samples, into *v->gs2. */
void st_rt_noise_first(const st_trainer_view *v, int mb);
/* The squared norm of the gradient in v->grads, a tied pair counted as one
 * weight with the sum of the two gradients. */
double st_trainer_grad_sq(const st_trainer_view *v);
/* Sums v->losses over the batch into *loss; a non-finite loss is an error
 * naming the step and samples (nothing may be updated after it). */
int st_trainer_check_loss(const st_trainer_view *v, double *loss,
                          st_error *err);
/* Sum of squares, in double, in index order (deterministic). */
double st_sum_squares(const float *x, size_t n);

/* --------------------------------------------- the stages of a schedule */

enum { ST_RT_FWD = 0, ST_RT_BWD = 1 }; /* a link's direction (MPI channel) */
enum { ST_RT_RX_RING = 4 };            /* most gradients received ahead */

typedef struct st_rt st_rt;

/* What every schedule's stage holds; a schedule's own stage struct starts
 * with one (so st_rt_start's threads get the schedule's struct). */
typedef struct st_rt_stage {
  st_rt *rt;
  int index, first, count; /* index among all stages (every segment) */
  int cores, cpu_off;      /* its share of the cores: cpus [cpu_off, +cores) */
  char name[48];
  st_pool *pool;    /* NULL where the schedule runs on the caller */
  int slots;        /* activation slots: micro-batch n in n mod slots */
  st_stage **run;   /* [slots]: the stage's blocks for one micro-batch */
  const float **in; /* [slots]: each slot's input */
  st_chan fwd, bwd; /* in-process messages from the stage before /
                       after */
  st_waiter w;      /* where its thread waits */
  int waiter_ready;
  /* placed over ranks: the member running it, and its links to stages on
   * other ranks (remote_prev / remote_next) */
  int owner, local, remote_prev, remote_next;
  int rx_ring;    /* gradients received ahead (<= ST_RT_RX_RING) */
  int tx_ring;    /* its input-gradient buffers, each sent */
  float **rx_fwd; /* [slots]: inputs received from the stage before */
  st_dist_req *rx_fwd_req;
  float *rx_bwd[ST_RT_RX_RING]; /* gradients received from the stage after */
  st_dist_req rx_bwd_req[ST_RT_RX_RING];
  st_dist_req *tx_fwd; /* [slots]: each slot's output, sent */
  st_dist_req *tx_bwd; /* [tx_ring]: each input-gradient buffer, sent */
  int leaky;           /* requests given up after a stop: MPI may still
                          use the buffers, which are never freed */
  int threadless;      /* runs on another stage's thread (a worker's
                          chunk after its first), with that stage's pool */
  int borrowed_pool;   /* pool is that stage's: not destroyed here */
  int hosted;          /* runs on the thread that calls the step: no
                          thread of its own (st_rt_start, st_rt_pin) */
  double busy;         /* seconds of forward, backward and update */
  double last_end;     /* when it last finished work (trace: idle) */
  pthread_t thread;
  int started;
} st_rt_stage;

struct st_rt {
  const st_model *model;
  const char *what; /* the schedule, for internal errors */
  int S, mb;
  st_rt_stage **st;   /* [S] */
  pthread_mutex_t mu; /* rc, err, peer_stop */
  st_waiter w;        /* the caller's wait */
  atomic_int stop;    /* torn down: every thread leaves */
  atomic_int abort;   /* the step stopped: every wait gives up */
  int spin;           /* polls before a waiting stage sleeps (0 or ST_SPIN;
                         a message of the step: ST_SPIN_LINK) */
  int emulate;        /* one thread runs every stage: nothing waits */
  int rc, peer_stop;
  st_error err;
  /* placed over ranks: this process is member `me` of group */
  st_dist_group *group;
  int me;
};

/* Room for up to n stages (rt->st[s] set by the schedule). */
int st_rt_init(st_rt *rt, const st_model *m, int mb, int n, const char *what);
/* After st_rt_stop_threads and every stage's st_rt_stage_free. */
void st_rt_free(st_rt *rt);
/* Stops the step with err (the first error wins; code 0: only stops) and
 * wakes every wait. */
void st_rt_fail(st_rt *rt, const st_error *err);
void st_rt_internal(st_rt *rt, const char *what, int64_t n, int stage);
/* The step's error code: the first error, else ST_EXEC_PEER_STOPPED
 * (another rank stopped it: err says so), else 0. */
int st_rt_result(st_rt *rt, st_error *err);
void st_rt_trace(const st_trainer_view *v, st_trace_kind kind, int64_t n,
                 double t0, double t1);

/* Placed over ranks: stages [lo, hi) (one segment) go to the group's
 * members in order, stage lo + i to member i P / (hi - lo), and this
 * process's stages among them share its `threads` cores. */
void st_rt_place(st_rt *rt, st_dist_group *group, int lo, int hi, int threads);
/* After every segment is placed: the links to other ranks' stages marked
 * and each stage's name given its rank. */
void st_rt_mark_links(st_rt *rt);

/* A local stage's pool, activation slots (slots st_stages of micro-batch
 * rows each, weights at slab offset base), channels of fwd_cap and bwd_cap
 * messages, and (over ranks) its link buffers and requests: st->slots,
 * rx_ring and tx_ring are set first. pooled = 0: no pool. */
int st_rt_stage_alloc(st_rt_stage *st, int pooled, int fwd_cap, int bwd_cap,
                      size_t base, st_error *err);
void st_rt_stage_free(st_rt_stage *st);
/* A thread running worker(stage) for each local stage; -1 when one could
 * not start (the others run). */
int st_rt_start(st_rt *rt, void *(*worker)(void *stage));
void st_rt_stop_threads(st_rt *rt);
/* Pins each local stage (its thread and its pool) to cpus[cpu_off, +cores);
 * -1 when they do not fit in n (nothing pinned). */
int st_rt_pin(st_rt *rt, const int *cpus, int n);
/* Stats of this process's stages (bound_s = bound). */
int st_rt_stats(const st_rt *rt, st_track_stats *out, int cap, double bound);
int st_rt_layout(const st_rt *rt, int *first, int *count, int *owner);

/* Micro-batch n's message from the stage before (ST_RT_FWD: its input) or
 * after (ST_RT_BWD: its output gradient), or NULL when the step stopped. */
const float *st_rt_recv(st_rt_stage *st, const st_trainer_view *v, int dir,
                        int64_t n);
/* Sends micro-batch n's output to the stage after (ST_RT_FWD, from slot
 * n mod slots) or its input gradient to the stage before (ST_RT_BWD, from
 * buffer n mod tx_ring); -1 when the step stopped. */
int st_rt_send(st_rt_stage *st, const st_trainer_view *v, int dir, int64_t n,
               const float *data);
/* Over ranks, before a send's buffer is written again: the earlier send
 * from it (slot n mod slots, or gradient buffer n mod tx_ring) is done. */
int st_rt_reuse(st_rt_stage *st, int dir, int64_t n);
/* Over ranks: posts the receive of micro-batch n's input (into its slot)
 * or output gradient (ring of rx_ring). */
int st_rt_post(st_rt_stage *st, int dir, int64_t n);
/* Every request of this process's stages given up without waiting. */
void st_rt_forget_links(st_rt *rt);
/* An empty message to the stage before s, in place of the gradient it
 * waits for: it stops. */
void st_rt_send_stop(st_rt *rt, int s);

/* ------------------------------------------- fill-and-drain schedules */

/* The order each worker of a fill-and-drain pipeline runs its ops in
 * (schedule.c): pure functions of (schedule, S workers, M micro-batches,
 * V chunks a worker). Pipeline stage j = k + v S is chunk v of worker k. */
enum { ST_PASS_F = 0, ST_PASS_B = 1, ST_PASS_W = 2, ST_PASS_BW = 3 };
enum { ST_SCHED_GPIPE, ST_SCHED_1F1B, ST_SCHED_INTERLEAVED, ST_SCHED_ZB1P };
typedef struct st_sched_op {
  unsigned char kind, chunk; /* ST_OP_*, the worker's chunk */
  int mb;                    /* micro-batch */
} st_sched_op;
typedef struct st_schedule {
  int kind, S, M, V;
  int split;        /* backward split into B and W (zb1p) */
  st_sched_op *ops; /* worker k's ops: ops[start[k] .. start[k + 1]) */
  int *start;       /* [S + 1] */
  int n_ops;
  int *slots; /* [S V]: stage j's activation slots (most micro-batches
                 between its F and the op that frees them) */
} st_schedule;

/* name: gpipe, 1f1b, interleaved (V >= 1) or zb1p; V > 1 only for
 * interleaved. */
int st_schedule_build(st_schedule *s, const char *name, int S, int M, int V,
                      st_error *err);
void st_schedule_free(st_schedule *s);
const char *st_schedule_op_name(int kind);
/* Runs the lists on an emulated clock, op kind i taking cost[i]: each
 * op's start and end (either may be NULL) and the makespan; -1 with why
 * when an op comes before what it needs or the workers deadlock. */
int st_schedule_emulate(const st_schedule *s, const double cost[4],
                        double *begin, double *end, double *makespan, char *why,
                        size_t why_len);
/* The schedule on that clock (F, B, W one tick, BW two) as an SVG. */
int st_schedule_svg(const st_schedule *s, const char *title, FILE *f);

#endif
