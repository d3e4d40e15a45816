/*
 * sequential.c — the layer-sequential mode (DESIGN.md): all blocks on one
 * stage, one after another. A batch may be split into micro-batches whose
 * gradients accumulate (the loss gradient of each is scaled by 1/batch), so
 * a pipeline with the same split can be held to bit-identical results. Each
 * block is updated as soon as the last micro-batch's backward leaves it —
 * elementwise rules, so the result equals one update after the whole pass.
 */
#include "exec.h"

static int seq_create(void **state, const st_model *m, const st_config *cfg,
                      int micro_batch, int max_batch, st_error *err) {
  (void)cfg;
  int rows = micro_batch > max_batch ? micro_batch : max_batch;
  return st_stage_create((st_stage **)state, m, 0, m->n_blocks, rows, err);
}

static void seq_destroy(void *state) { st_stage_destroy(state); }

static void update_block(void *view, int block) {
  st_trainer_update_blocks(view, block, 1);
}

static int seq_step(void *state, st_trainer_view *v, double *loss,
                    st_error *err) {
  st_stage *s = state;
  const st_model *m = v->model;
  size_t in_numel = st_shape_numel(m->in);
  int mb = v->micro_batch, R = m->label_rows; /* R labels per sample */
  st_ctx ctx = v->ctx;
  for (int k = 0; k < v->batch; k += mb) {
    const float *x = v->x + (size_t)k * in_numel;
    int last = k + mb >= v->batch;
    ctx.first_sample = v->first_sample + (uint64_t)k;
    const float *logits = st_stage_forward(s, &ctx, v->params, x, mb);
    st_xent_forward_pool(ctx.pool, v->losses + (size_t)k * R, v->probs,
                         logits, v->y + (size_t)k * R, mb * R, m->classes);
    /* Every loss of the batch is known before the last backward, which is
     * where weights start to change: a NaN stops the step untouched. */
    if (last) {
      int rc = st_trainer_check_loss(v, loss, err);
      if (rc) return rc;
    }
    st_xent_backward_pool(ctx.pool, v->dlogits, v->probs,
                          v->y + (size_t)k * R, mb * R, m->classes,
                          1.0f / ((float)v->batch * (float)R));
    /* The last micro-batch completes each block's gradient as its backward
     * finishes: update that block then, while its gradient is in cache. */
    st_stage_backward_each(s, &ctx, v->params, v->grads, x, v->dlogits, NULL,
                           mb, last ? update_block : NULL, v);
    /* The gradient so far is the first micro-batch's sum scaled by 1/batch;
     * its mean over the micro-batch is batch/mb times that. */
    if (v->gs2 && k == 0) {
      double scale = (double)v->batch / mb;
      *v->gs2 = st_trainer_grad_sq(v) * scale * scale;
    }
  }
  return 0;
}

static const float *seq_forward(void *state, const st_ctx *ctx,
                                const float *params, const float *x, int B) {
  return st_stage_forward(state, ctx, params, x, B);
}

const st_executor st_exec_sequential = {
    .mode = "sequential",
    .step = seq_step,
    .forward = seq_forward,
    .create = seq_create,
    .destroy = seq_destroy,
};
