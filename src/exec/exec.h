/*
 * exec.h — internal interface of the executors (not part of the public API).
 * An executor is one execution.mode: a schedule over the stage runtime
 * (src/runtime/runtime.h). sequential runs one st_stage holding every
 * block; pipeline, block_sequential and pipelined_backprop run several on
 * the runtime's stage threads and links; replicas and ranks wrap those.
 */
#ifndef STRATA_EXEC_H
#define STRATA_EXEC_H

#include "strata.h"

#include "../runtime/runtime.h"

#include <string.h>

/* Applies this step's update to blocks [first, first + count) and zeroes
 * their gradients. A tied copy (st_tensor_info.tie) is updated with its
 * source: the source's block must be updated after the copy's gradient is
 * complete (the embedding comes first, so its backward ends the pass). */
void st_trainer_update_blocks(const st_trainer_view *v, int first, int count);
/* What st_trainer_update_blocks runs before the rule: each tied copy
 * whose source is in these blocks adds its gradient into the source's
 * (zeroing its own; unless gather is 0: the caller does it); then fn(arg,
 * off, n) on each slab range to update, its squared gradient first added
 * into *v->gb2. Tied copies' weights are left to the caller. */
typedef void (*st_range_fn)(void *arg, size_t off, size_t n);
void st_trainer_each_range(const st_trainer_view *v, int first, int count,
                           int gather, st_range_fn fn, void *arg);
/* Each tied copy whose source lies in slab offsets [lo, hi): gather 1 adds
 * the copy's values into the source's and zeroes the copy's (gradients);
 * gather 0 copies the source's values over the copy's (weights, optimizer
 * state). slab[k - base] holds the value of slab offset k; the copies must
 * lie in the slab too. Runs on v->ctx.pool. */
void st_trainer_ties(const st_trainer_view *v, float *slab, size_t base,
                     size_t lo, size_t hi, int gather);
/* st_trainer_update_blocks of one block, as an st_stage_backward_each
 * callback (view is a st_trainer_view); traced on v->track. */
void st_exec_update_block(void *view, int block);

typedef struct st_executor {
  const char *mode;
  /* One optimizer step on the batch: forward and backward, per-sample
   * losses into v->losses, loss checked with st_trainer_check_loss before
   * any weight changes, every block updated once. v->grads is all zeros on
   * entry and must be all zeros on return (updates zero what they use). */
  int (*step)(void *state, st_trainer_view *v, double *loss, st_error *err);
  /* Optional, both or neither: step in two halves, so that the trainer
   * can start the next step before it waits for this one and the mode's
   * workers go from one batch into the next without waiting at the
   * boundary (pipelined backprop: no bubble between steps). start copies
   * the view (whose buffers must stay untouched until the step is waited
   * for); wait finishes the oldest started step as step would (0 and
   * *loss, or the error). At most two steps started and not waited for;
   * anything else the trainer asks of the executor (forward, stats,
   * gather, ...) only with none in flight. */
  int (*start)(void *state, const st_trainer_view *v, st_error *err);
  int (*wait)(void *state, double *loss, st_error *err);
  /* Inference on B samples (B <= the create-time max_batch); returns the
   * logits, valid until the next call, or NULL if a message to another
   * rank or a read failed (the read's error: commit with pos NULL). Used
   * by evaluation. */
  const float *(*forward)(void *state, const st_ctx *ctx, const float *params,
                          const float *x, int B);
  /* Buffers for micro-batches of cfg's split and inference batches of up
   * to max_batch samples. */
  int (*create)(void **state, const st_model *m, const st_config *cfg,
                int micro_batch, int max_batch, st_error *err);
  void (*destroy)(void *state);
  /* Stages the mode runs (NULL: one). */
  int (*stages)(void *state);
  /* Its trace tracks (one per stage and replica): names and the seconds
   * each spent working (forward, backward, update) since create; *wall is
   * the seconds spent inside steps. Returns the number of tracks (at most
   * cap are filled). */
  int (*stats)(void *state, st_track_stats *out, int cap, double *wall);
  /* Executors that keep the weights and optimizer state themselves
   * (weight streaming's file store): the slabs of the current state and
   * the gradient slab, returning 1; NULL or 0: the trainer allocates them.
   * Weights stored as bf16 come as *bf16, with *params NULL. Asked again
   * after every step (the state may move). */
  int (*slabs)(void *state, float **params, const uint16_t **bf16,
               float **grads, float **opt);
  /* Stages placed over ranks: mine[i] = 1 for each block whose weights,
   * gradients and optimizer state this rank keeps (its stages'), 0 for
   * the rest, returning 1; the trainer then commits only those ranges of
   * its slabs. 0 or NULL: every block. */
  int (*owns)(void *state, unsigned char *mine);
  /* With owns: the checkpoint at path (NULL on the ranks other than rank
   * 0), assembled from every rank's own blocks — one file, or with shards
   * a directory of a shard per rank and the index. Collective: every rank
   * calls it at the same point. */
  int (*save)(void *state, const char *path, int shards, const float *params,
              const float *opt, const char *optim_kind, const st_train_pos *pos,
              st_error *err);
  /* The run ended on every rank (collective, like gather): what is still
   * in flight between ranks is finished. NULL: nothing to do. */
  int (*finish)(void *state, st_error *err);
  /* Where the kept state's run stands (step 0: a new one). */
  const st_train_pos *(*stored_pos)(void *state);
  /* After a step and the position's advance: make both durable. wait = 0
   * may finish in the background (an error then surfaces at the next
   * call); wait = 1 finishes everything pending. */
  int (*commit)(void *state, const st_train_pos *pos, int wait, st_error *err);
} st_executor;

/* Weight streaming's file store (store.c): a model's weights and optimizer
 * state, twice (the live copy and the one a step writes), committed step by
 * step. Regions: 0 the weights, 1 + k optimizer slot k. */
typedef struct st_store st_store;
/* Opens the store at path for model m under cfg's optimizer, first making
 * it (weights from train.seed, optimizer state zero) if there is none. */
/* The bytes one rank of this machine may hold: RAM (or the cgroup limit)
 * and swap, over the ranks started on it (trainer.c). */
double st_rank_memory_allowed(void);

int st_store_open(st_store **out, const char *path, const st_model *m,
                  const st_config *cfg, st_error *err);
void st_store_close(st_store *s);
const char *st_store_path(const st_store *s);
/* The position after the last committed step (step 0: a new store). */
const st_train_pos *st_store_pos(const st_store *s);
/* A region of the live copy, mapped (touch it, then st_store_drop it):
 * floats, but uint16_t bf16 values for the weights when st_store_bf16. */
void *st_store_slab(const st_store *s, int region);
int st_store_bf16(const st_store *s);
int st_store_live(const st_store *s);
/* n floats at slab offset off: read from the live copy, written into the
 * other one. bf16 weights are widened on the way in; written, they must be
 * bf16 values already (st_bf16_round). */
int st_store_read(const st_store *s, int region, size_t off, size_t n,
                  float *dst, st_error *err);
int st_store_write(const st_store *s, int region, size_t off, size_t n,
                   const float *src, st_error *err);
/* The gradient slab (mapped), and n of its floats at off read (write 0)
 * or written (write 1). */
float *st_store_grads(const st_store *s);
int st_store_grad_io(const st_store *s, int write, size_t off, size_t n,
                     float *buf, st_error *err);
/* Every value of the other copy is written: reads move to it. */
void st_store_advance(st_store *s);
/* Makes copy and pos the committed state: data synced, then the header. */
int st_store_commit(st_store *s, int copy, const st_train_pos *pos,
                    st_error *err);
/* Drops this process's pages of a mapped range (the page cache keeps them). */
void st_store_drop(const void *p, size_t n);
/* Test knob: SIGKILL the process at `point` of step `step` (0-based). */
enum {
  ST_CRASH_MID_UPDATE = 1,    /* half of the step's blocks written */
  ST_CRASH_BEFORE_HEADER = 2, /* data synced, header not written */
  ST_CRASH_AFTER_HEADER = 3   /* committed */
};
void st_store_set_crash(st_store *s, int64_t step, int point);
int st_store_crash_point(const st_store *s, int64_t step);
/* The weight streaming executor's store (NULL: memory). */
st_store *st_ws_store(void *state);

extern const st_executor st_exec_sequential;
extern const st_executor st_exec_pipeline;
extern const st_executor st_exec_block_sequential;
extern const st_executor st_exec_pipelined_backprop;
extern const st_executor st_exec_weight_streaming;
/* Weight streaming's counters (executor state of that mode). */
int st_ws_stats(const void *state, st_stream_stats *out);
/* execution.replicas > 1: R copies of the mode's executor (sequential or
 * pipeline) on a share of the cores each; gradients are summed in replica
 * order, then every block is updated once. */
extern const st_executor st_exec_replicas;
extern const st_executor st_exec_ranks;
/* Data parallelism's split (replicas.c): cfg's execution.replicas shares of
 * the batch, each of whole micro-batches of *mb, run by *inner (sequential
 * or pipeline); refused, naming the key, when the batch does not split. */
int st_replicas_split(const st_config *cfg, int micro_batch,
                      const st_executor **inner, int *share, int *mb,
                      st_error *err);
/* Replica `index`'s part of the step v: its share of the samples (and of
 * the losses), the loss scaled by the whole batch, gradients only. */
void st_replica_view(st_trainer_view *w, const st_trainer_view *v,
                     const st_model *m, int index, int share, int mb);

/* Stages over MPI ranks (execution.placement: ranks; ranks.c): the
 * pipeline modes spread their stages over the members of `group`, stage s
 * of a segment of k stages on member s * P / k, each member running its
 * stages with `threads` cores. The cut is the one the same stage count
 * gets with threads in one process (one core per stage), so the weights
 * are the threaded run's, bit for bit. A non-finite loss stops the step
 * at the last stage before any update and the stop travels back along
 * the pipeline; a rank stopped that way returns ST_EXEC_PEER_STOPPED (the
 * caller learns the cause from the rank that found it) and the executor
 * refuses further steps. Only the stages' owners update their blocks:
 * st_placed_layout says which member holds which blocks; forward (the
 * whole model in one process) is the caller's (ranks.c evaluates stage by
 * stage over the ranks). */
typedef struct st_dist_group st_dist_group;
typedef struct st_placement {
  st_dist_group *group;
  int threads;
} st_placement;
int st_pipeline_create_placed(void **state, const st_model *m,
                              const st_config *cfg, int micro_batch,
                              int max_batch, int blockseq,
                              const st_placement *pl, st_error *err);
int st_pb_create_placed(void **state, const st_model *m, const st_config *cfg,
                        int micro_batch, int max_batch, const st_placement *pl,
                        st_error *err);
/* Pipelined backprop over ranks, at the end of a run every rank finished:
 * the receives posted ahead completed or cancelled, and (collective over
 * the pipeline's ranks) then every send, so that destroying it frees
 * everything. Without it, an executor torn down with messages in flight
 * keeps their buffers. No step may follow. */
int st_pb_close_links(void *state, st_error *err);
/* The stages' block ranges and owners (members); returns the count. */
int st_pipeline_layout(const void *state, int *first, int *count, int *owner);
int st_pb_layout(const void *state, int *first, int *count, int *owner);

/* The executor of an execution.mode, NULL if none. */
const st_executor *st_find_executor(const char *mode);
/* Pipeline introspection (tests): the most micro-batches stage s held in
 * flight during the last step; the stages' block ranges (returns S). */
int st_pipeline_held(const void *state, int stage);
int st_pipeline_stages(const void *state, int *first, int *count);
/* The threads stage s runs on (its share of the cores). */
int st_pipeline_cores(const void *state, int stage);
/* Test knob: each stage sleeps a pseudo-random 0 .. max_us microseconds
 * before every forward and backward (0 turns it off). Call between steps. */
void st_pipeline_set_jitter(void *state, int max_us, uint32_t seed);
/* Tests: files fwd[i], bwd[i] and lwp[i] (seconds per sample; lwp NULL
 * for none) as the measurement of m's blocks under cfg, so that the plans
 * and runs made next with execution.block_costs: measured cut by them
 * (src/exec/measure.c). */
void st_measure_seed(const st_model *m, const st_config *cfg, const double *fwd,
                     const double *bwd, const double *lwp);
/* Whether cfg's mode cuts its stages as execution.stage_blocks pins them
 * (pipeline, pipelined_backprop); another mode ignores the pin. */
static inline int st_pipeline_pinned(const st_config *cfg) {
  return cfg->execution.stage_blocks.n > 0 &&
         (!strcmp(cfg->execution.mode, "pipeline") ||
          !strcmp(cfg->execution.mode, "pipelined_backprop"));
}
/* The stages a pipelined mode asks for: execution.stage_blocks' count when
 * the cut is pinned (the interleaved schedule's: its chunks over
 * execution.virtual_stages), else execution.stages (0, N or
 * ST_STAGES_PER_BLOCK). */
int st_pipeline_asked_stages(const st_config *cfg);
/* The key that set that count, for messages. */
static inline const char *st_stages_key(const st_config *cfg) {
  return st_pipeline_pinned(cfg) ? "execution.stage_blocks"
                                 : "execution.stages";
}
/* execution.stage_blocks against a model of n blocks: 0, or ST_ECONFIG
 * naming the key when an entry exceeds n or the stages do not hold exactly
 * n blocks (the config checked that entries are >= 1, and their count). */
int st_pipeline_check_pin(const st_config *cfg, int n, st_error *err);
/* The compiler's cut of all blocks into stages on `cores` cores (S = 0:
 * the plan's choice; more stages than cores share them, one thread each;
 * execution.stage_blocks pins the cut), or the FLOP balance when no plan
 * can be made: first/count/pes per stage (arrays of n_blocks); the blocks'
 * costs as cfg's execution.block_costs says (st_plan_block_costs).
 * Returns the stage count, or -1 with *err (out of memory; a measurement
 * that failed). */
int st_pipeline_split(const st_model *m, const st_config *cfg, int S, int cores,
                      int *first, int *count, int *pes, st_error *err);
/* The cut of blocks [0, n) of c into stages on `cores` cores as the
 * compiler plans it on fab (S = 0: the plan's choice, by the fill and
 * drain of the schedule of mode's config as `strata compile` chooses;
 * mode NULL: by the steady state): first/count/pes per stage; returns the
 * stage count. `shared`: more stages than cores, one thread each. A model
 * the planner cannot place (or no fab) falls back to the FLOP balance with
 * the cores shared evenly. */
int st_cut_split(const st_block_cost *c, int n, const st_fabric *fab, int S,
                 int cores, int shared, const st_int_list *pin,
                 const st_config *mode, int *first, int *count, int *pes);
/* The cpu fabric of `cores` cores (S of them when there are more stages)
 * in *fab, or NULL when it cannot be resolved (an unreadable calibration
 * profile). cpu: scratch space for the config it is resolved from. */
st_fabric *st_cut_fabric(st_fabric *fab, st_config *cpu, const st_config *cfg,
                         int S, int cores);
/* block_sequential's segments: `per` blocks each, or (0) the fewest runs
 * of blocks whose weights, optimizer state and batch activations fit the
 * machine's memory. Returns the count; starts[g] is a first block. */
int st_cut_segments(const st_block_cost *c, int n, const st_fabric *fab,
                    int per, int batch, int *starts);
/* Pipelined backprop introspection (tests): stage s's delay D(s); the
 * fewest and most updates counted between a micro-batch's forward and its
 * update, over the micro-batches with a full pipeline ahead (n >= D(s))
 * and over all; the most weight versions it held at once (the live
 * weights and stashed copies). Returns -1 for a bad stage. */
int st_pb_delay(const void *state, int stage, int *steady_min, int *steady_max,
                int *max_all);
int st_pb_versions(const void *state, int stage);
/* The replay (pb.c): pipelined backprop's steps run once more on paper,
 * each stage's forward, backward and update taking the busy seconds it
 * measured, but every hand-off free: a stage starts a forward as soon as
 * it is free and the stage before has finished that forward, a backward
 * as soon as the stage after has finished that backward (its send comes
 * before its update). The wall this gives bounds the real one from below
 * for the same busy times: busy / replay wall is the utilization those
 * times allow; what the real run falls short of it, the hand-offs and the
 * runtime cost (a wait at a step boundary, where a step did not start
 * before the last returned, among them). Pair n of stage s is its forward
 * of n and its backward of n - D(s), D(s) = 2 (S - 1 - s). */
enum { ST_PB_REPLAY_RING = 4 }; /* backward ends kept per stage */
typedef struct st_pb_replay {
  int S;
  double *clock; /* [S]: when each stage is next free */
  double *bend;  /* [S][ST_PB_REPLAY_RING]: when stage s's backward of
                    micro-batch j ended, at j mod the ring */
  double wall;   /* the latest clock: the steps' replayed wall */
} st_pb_replay;
int st_pb_replay_init(st_pb_replay *r, int S); /* -1: out of memory */
void st_pb_replay_free(st_pb_replay *r);
/* Replays pairs n0 .. n0 + K - 1 (the steps in order, each once): stage s's
 * busy seconds in pair n0 + i are times[(s K + i) 3 + 0, 1, 2] (forward,
 * backward, update; 0 where the pair has no backward). */
void st_pb_replay_step(st_pb_replay *r, int64_t n0, int K, const double *times);
/* Test probe: called with the weights each forward and backward at each
 * stage used (fwd = 1 for a forward), the stage's slab of n floats. */
typedef void (*st_pb_probe)(void *arg, int stage, int64_t micro_batch, int fwd,
                            const float *w, size_t n);
void st_pb_set_probe(void *state, st_pb_probe fn, void *arg);
/* Pins the pipeline's stages to cpus[0 .. n), each stage to its own share
 * (the plan's cores per stage); -1 when they do not fit (nothing pinned).
 * The replicas executor gives each replica its own cpus this way. */
int st_pipeline_pin(void *state, const int *cpus, int n);
/* Executor state of a trainer (tests). */
void *st_trainer_exec_state(st_trainer *t);
/* The samples of an evaluation batch (the trainer's, and what a plan
 * counts an evaluation stage's buffers for). */
int st_eval_batch(const st_model *m, int micro_batch);
/* The bytes of the trainer's own buffers (its batch's input, labels and
 * losses, the logits' probabilities and gradient, the epoch's permutation
 * of n_train samples, an evaluation's indices, a second batch where steps
 * overlap) for model m under cfg over `ranks` MPI ranks (<= 1: one
 * process), as the trainer sizes them and st_alloc_bytes counts them: what
 * the compiler adds to each rank's memory. */
double st_trainer_batch_bytes(const st_model *m, const st_config *cfg,
                              int ranks, int n_train);
/* Cores this process may run on (affinity and cgroup cpusets included). */
int st_usable_cores(void);

/* Trainer internals the run loop needs. */
/* What one rank (or the one process) holds: the plan — its stages'
 * weights, gradients and optimizer state (the whole model's but over
 * ranks), the executor's buffers and the trainer's data and batch
 * buffers, as sized at start — and what it measured: the counted
 * allocator's peak (st_alloc_peak), the resident peak (VmHWM, libraries
 * included), and the bytes it sent and received per training step
 * (st_dist_traffic, 0 in one process). */
typedef struct st_rank_memory {
  double weights, grads, state, buffers, data, planned;
  double batch; /* within buffers: the trainer's batch buffers (the rest
                   the executor's) */
  double peak, resident;
  double sent, received;
  int blocks;      /* the blocks whose weights it keeps */
  int first, last; /* those blocks: first .. last (-1: several runs) */
} st_rank_memory;
void st_trainer_memory(const st_trainer *t, st_rank_memory *out);

/* 1 when this rank keeps only its own stages (execution.placement: ranks):
 * st_trainer_save is then collective, every rank calling it, path NULL on
 * all but rank 0, which writes the file. */
int st_trainer_saves_together(const st_trainer *t);
/* ST_ENONFINITE, naming the tensor and element, when a weight this rank
 * keeps is NaN or infinite: a checkpoint of it would not load. */
int st_trainer_check_finite(const st_trainer *t, st_error *err);
/* A sharded checkpoint into the directory dir (train.checkpoint_format:
 * shards): a shard per rank holding stages (one in one process) and the
 * index; collective as st_trainer_save. */
int st_trainer_save_shards(st_trainer *t, const char *dir, st_error *err);
/* After a run that ended well on every rank (every rank calls it). */
int st_trainer_finish(st_trainer *t, st_error *err);
const char *st_trainer_dir(const st_trainer *t); /* NULL when none */
int64_t st_trainer_steps_per_epoch(const st_trainer *t);
int st_trainer_threads(const st_trainer *t); /* resolved from train.threads */
/* What st_trainer_set_prediction stored. */
double st_trainer_plan_rate(const st_trainer *t, double *utilization);
void st_trainer_note_result(st_trainer *t, double loss, double accuracy,
                            double samples_per_s);

#endif
