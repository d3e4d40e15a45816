/*
 * stage.c — the compute of a stage, shared by every mode: a range of
 * blocks, their activation buffers and a backward workspace, sized once for
 * max_batch samples. Forward chains the blocks' outputs; backward walks them in
 * reverse passing the input gradient of one block as the output gradient of the
 * one before, ping-ponging between two buffers.
 */
#include "runtime.h"

#include <stdlib.h>

int st_stage_create(st_stage **out, const st_model *m, int first, int count,
                    int max_batch, st_error *err) {
  *out = NULL;
  st_stage *s = calloc(1, sizeof *s);
  if (!s) return st_error_set(err, ST_ENOMEM, "out of memory");
  s->model = m;
  s->first = first;
  s->count = count;
  s->max_batch = max_batch;
  s->acts = calloc((size_t)count, sizeof *s->acts);
  size_t span = (size_t)max_batch * m->max_numel;
  s->work = st_alloc(3 * span * sizeof(float));
  s->scratch =
      st_alloc((size_t)max_batch * m->max_scratch_per_sample * sizeof(float));
  s->grad_io[0] = st_alloc(span * sizeof(float));
  s->grad_io[1] = st_alloc(span * sizeof(float));
  int ok = s->acts && s->work && s->scratch && s->grad_io[0] && s->grad_io[1];
  for (int i = 0; ok && i < count; i++) {
    const st_block *b = &m->blocks[first + i];
    s->acts[i] =
        st_alloc((size_t)max_batch * b->act_per_sample * sizeof(float));
    ok = s->acts[i] != NULL;
  }
  if (!ok) {
    st_stage_destroy(s);
    return st_error_set(err, ST_ENOMEM,
                        "out of memory allocating activations for batch %d",
                        max_batch);
  }
  *out = s;
  return 0;
}

void st_stage_destroy(st_stage *s) {
  if (!s) return;
  if (s->acts)
    for (int i = 0; i < s->count; i++) st_free(s->acts[i]);
  free(s->acts);
  st_free(s->work);
  st_free(s->scratch);
  st_free(s->grad_io[0]);
  st_free(s->grad_io[1]);
  free(s);
}

const float *st_stage_forward(st_stage *s, const st_ctx *ctx,
                              const float *params, const float *in, int B) {
  const float *x = in;
  for (int i = 0; i < s->count; i++) {
    const st_block *b = &s->model->blocks[s->first + i];
    st_block_forward(b, ctx, params + (b->param_off - s->base), x, s->acts[i],
                     s->scratch, B);
    x = st_block_output(b, s->acts[i], B);
  }
  return x;
}

void st_stage_backward(st_stage *s, const st_ctx *ctx, const float *params,
                       float *grads, const float *in, const float *dout,
                       float *din, int B) {
  st_stage_backward_each(s, ctx, params, grads, in, dout, din, B, NULL, NULL);
}

void st_stage_backward_each(st_stage *s, const st_ctx *ctx, const float *params,
                            float *grads, const float *in, const float *dout,
                            float *din, int B,
                            void (*after_block)(void *arg, int block),
                            void *arg) {
  const float *g = dout;
  for (int i = s->count - 1; i >= 0; i--) {
    const st_block *b = &s->model->blocks[s->first + i];
    const float *x = i == 0
                         ? in
                         : st_block_output(&s->model->blocks[s->first + i - 1],
                                           s->acts[i - 1], B);
    float *dx = st_stage_grad_to(s->grad_io, g, i, din);
    size_t at = b->param_off - s->base;
    st_block_backward(b, ctx, params + at, grads + at, x, s->acts[i], g, dx,
                      s->work, s->scratch, B);
    if (after_block) after_block(arg, s->first + i);
    g = dx;
  }
}
