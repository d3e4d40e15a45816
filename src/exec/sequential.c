/*
 * sequential.c — the layer-sequential mode (DESIGN.md): all blocks on one
 * stage, one after another. A batch may be split into micro-batches whose
 * gradients accumulate (the loss gradient of each is scaled by 1/batch), so
 * a pipeline with the same split can be held to bit-identical results. Each
 * block is updated as soon as the last micro-batch's backward leaves it —
 * elementwise rules, so the result equals one update after the whole pass.
 */
#include "exec.h"

#include <stdlib.h>

typedef struct seq {
  st_stage *stage;
  double busy, last_end; /* seconds in steps; when the last step ended */
} seq;

static void seq_destroy(void *state) {
  seq *q = state;
  if (!q) return;
  st_stage_destroy(q->stage);
  free(q);
}

static int seq_create(void **state, const st_model *m, const st_config *cfg,
                      int micro_batch, int max_batch, st_error *err) {
  (void)cfg;
  *state = NULL;
  seq *q = calloc(1, sizeof *q);
  if (!q) return st_error_set(err, ST_ENOMEM, "out of memory");
  int rows = micro_batch > max_batch ? micro_batch : max_batch;
  int rc = st_stage_create(&q->stage, m, 0, m->n_blocks, rows, err);
  if (rc) {
    seq_destroy(q);
    return rc;
  }
  *state = q;
  return 0;
}

static int seq_step(void *state, st_trainer_view *v, double *loss,
                    st_error *err) {
  seq *q = state;
  st_stage *s = q->stage;
  const st_model *m = v->model;
  size_t in_numel = st_shape_numel(m->in);
  int mb = v->micro_batch;
  st_ctx ctx;
  double start = st_now(), t0;
  /* (a replica's gaps hold the caller's all-reduce: not marked idle) */
  if (q->last_end > 0 && !v->grads_only)
    st_rt_trace(v, ST_TRACE_IDLE, -1, q->last_end, st_now());
  int rc = 0;
  for (int k = 0; k < v->batch; k += mb) {
    const float *x = v->x + (size_t)k * in_numel;
    int last = k + mb >= v->batch;
    ctx = st_rt_ctx(v, k);
    t0 = st_now();
    const float *logits = st_stage_forward(s, &ctx, v->params, x, mb);
    st_rt_loss(v, ctx.pool, k / mb, mb, logits, v->probs);
    st_rt_trace(v, ST_TRACE_FORWARD, k / mb, t0, st_now());
    /* Every loss of the batch is known before the last backward, which is
     * where weights start to change: a NaN stops the step untouched. */
    if (last && (rc = st_trainer_check_loss(v, loss, err))) break;
    t0 = st_now();
    st_rt_loss_grad(v, ctx.pool, k / mb, mb, v->loss_batch, v->probs,
                    v->dlogits);
    /* The last micro-batch completes each block's gradient as its backward
     * finishes: update that block then, while its gradient is in cache. */
    st_stage_backward_each(
        s, &ctx, v->params, v->grads, x, v->dlogits, NULL, mb,
        last && !v->grads_only ? st_exec_update_block : NULL, v);
    st_rt_trace(v, ST_TRACE_BACKWARD, k / mb, t0, st_now());
    if (k == 0) st_rt_noise_first(v, mb);
  }
  q->last_end = st_now();
  q->busy += q->last_end - start;
  return rc;
}

static const float *seq_forward(void *state, const st_ctx *ctx,
                                const float *params, const float *x, int B) {
  return st_stage_forward(((seq *)state)->stage, ctx, params, x, B);
}

static int seq_stats(void *state, st_track_stats *out, int cap, double *wall) {
  const seq *q = state;
  *wall = q->busy;
  if (cap > 0)
    out[0] = (st_track_stats){"stage 0", 0, q->stage->count, q->busy, 0};
  return 1;
}

const st_executor st_exec_sequential = {
    .mode = "sequential",
    .step = seq_step,
    .forward = seq_forward,
    .create = seq_create,
    .destroy = seq_destroy,
    .stats = seq_stats,
};
