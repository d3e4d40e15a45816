/*
 * exec.h — internal interface of the executors (not part of the public API).
 * A stage is the shared worker every mode runs on: a contiguous range of
 * blocks with their activation buffers for up to max_batch samples, a
 * backward workspace and the pool of cores it may use. The sequential mode
 * is one stage holding all blocks; pipeline modes (later) run several.
 */
#ifndef STRATA_EXEC_H
#define STRATA_EXEC_H

#include "strata.h"

typedef struct st_stage {
  const st_model *model;
  int first, count;   /* blocks [first, first + count) */
  int max_batch;
  float **acts;       /* per block: max_batch * act_per_sample */
  float *work;        /* 3 * max_batch * model->max_numel */
  float *scratch;     /* max_batch * model->max_scratch_per_sample */
  float *grad_io[2];  /* gradients between blocks: max_batch * max_numel */
} st_stage;

int st_stage_create(st_stage **out, const st_model *m, int first, int count,
                    int max_batch, st_error *err);
void st_stage_destroy(st_stage *s);
/* Runs the stage's blocks on B samples; returns the last block's output. */
const float *st_stage_forward(st_stage *s, const st_ctx *ctx,
                              const float *params, const float *in, int B);
/* Backward through the stage's blocks; adds into grads (model-wide slab
 * layout); writes din unless it is NULL. */
void st_stage_backward(st_stage *s, const st_ctx *ctx, const float *params,
                       float *grads, const float *in, const float *dout,
                       float *din, int B);

/* A mode: how one optimizer step runs over the trainer's batch. */
typedef struct st_trainer_view {
  const st_model *model;
  st_ctx ctx;           /* pool, seed; first_sample set per batch */
  float *params, *grads, *opt;
  const float *x;       /* batch inputs */
  const int *y;         /* batch labels */
  float *losses;        /* per sample (batch) */
  float *probs, *dlogits; /* micro_batch * classes */
  int batch, micro_batch;
} st_trainer_view;

typedef struct st_executor {
  const char *mode;
  /* Forward and backward of the whole batch; gradients summed into
   * v->grads (zeroed by the caller), losses written per sample. */
  int (*gradients)(void *state, st_trainer_view *v, st_error *err);
  /* Inference on B samples (B <= the create-time max_batch); returns the
   * logits, valid until the next call. Used by evaluation. */
  const float *(*forward)(void *state, const st_ctx *ctx, const float *params,
                          const float *x, int B);
  int (*create)(void **state, const st_model *m, int max_batch,
                st_error *err);
  void (*destroy)(void *state);
} st_executor;

extern const st_executor st_exec_sequential;

/* Trainer internals the run loop needs. */
const st_config *st_trainer_config(const st_trainer *t);
const char *st_trainer_dir(const st_trainer *t); /* NULL when none */
int64_t st_trainer_steps_per_epoch(const st_trainer *t);
int st_trainer_threads(const st_trainer *t); /* resolved from train.threads */

#endif
