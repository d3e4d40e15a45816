/*
 * sequential.c — the layer-sequential mode (DESIGN.md): all blocks on one
 * stage, one after another. A batch may be split into micro-batches whose
 * gradients accumulate (the loss gradient of each is scaled by 1/batch), so
 * a pipeline with the same split can be held to bit-identical results.
 */
#include "exec.h"

static int seq_create(void **state, const st_model *m, int max_batch,
                      st_error *err) {
  return st_stage_create((st_stage **)state, m, 0, m->n_blocks, max_batch,
                         err);
}

static void seq_destroy(void *state) { st_stage_destroy(state); }

static int seq_gradients(void *state, st_trainer_view *v, st_error *err) {
  (void)err;
  st_stage *s = state;
  const st_model *m = v->model;
  size_t in_numel = st_shape_numel(m->in);
  int mb = v->micro_batch;
  st_ctx ctx = v->ctx;
  for (int k = 0; k < v->batch; k += mb) {
    const float *x = v->x + (size_t)k * in_numel;
    ctx.first_sample = v->ctx.first_sample + (uint64_t)k;
    const float *logits = st_stage_forward(s, &ctx, v->params, x, mb);
    st_xent_forward(v->losses + k, v->probs, logits, v->y + k, mb,
                    m->classes);
    st_xent_backward(v->dlogits, v->probs, v->y + k, mb, m->classes,
                     1.0f / (float)v->batch);
    st_stage_backward(s, &ctx, v->params, v->grads, x, v->dlogits, NULL, mb);
  }
  return 0;
}

static const float *seq_forward(void *state, const st_ctx *ctx,
                                const float *params, const float *x, int B) {
  return st_stage_forward(state, ctx, params, x, B);
}

const st_executor st_exec_sequential = {
    .mode = "sequential",
    .gradients = seq_gradients,
    .forward = seq_forward,
    .create = seq_create,
    .destroy = seq_destroy,
};
