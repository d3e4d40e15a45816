/*
 * stage.c — the compute of a stage, shared by every mode: a range of
 * blocks, their activation buffers and a backward workspace, sized once for
 * max_batch samples. Forward chains the blocks' outputs; backward walks them in
 * reverse passing the input gradient of one block as the output gradient of the
 * one before, ping-ponging between two buffers.
 */
#include "runtime.h"

#include <stdlib.h>

/* Floats of block i's activations for max_batch samples; shared: the
 * largest block's, once for all. */
static size_t act_floats(const st_model *m, int first, int count, int i,
                         int max_batch, int shared) {
  size_t most = m->blocks[first + i].act_per_sample;
  for (int j = 0; shared && j < count; j++)
    if (m->blocks[first + j].act_per_sample > most)
      most = m->blocks[first + j].act_per_sample;
  return (size_t)max_batch * most;
}

/* The largest layer input or output, and the largest scratch, per sample
 * over blocks [first, first + count): what the workspace is sized by. */
static void work_sizes(const st_model *m, int first, int count, size_t *numel,
                       size_t *scratch) {
  *numel = *scratch = 0;
  for (int i = first; i < first + count; i++) {
    const st_block *b = &m->blocks[i];
    if (b->max_numel > *numel) *numel = b->max_numel;
    if (b->scratch_floats_per_sample > *scratch)
      *scratch = b->scratch_floats_per_sample;
  }
}

size_t st_stage_work_bytes(const st_model *m, int first, int count,
                           int max_batch) {
  size_t numel, scratch;
  work_sizes(m, first, count, &numel, &scratch);
  return (5 * numel + scratch) * (size_t)max_batch * sizeof(float);
}

size_t st_stage_bytes(const st_model *m, int first, int count, int max_batch,
                      int shared_acts) {
  size_t floats = 0;
  for (int i = 0; i < (shared_acts ? 1 : count); i++)
    floats += act_floats(m, first, count, i, max_batch, shared_acts);
  return floats * sizeof(float) +
         st_stage_work_bytes(m, first, count, max_batch);
}

int st_stage_create_with(st_stage **out, const st_model *m, int first,
                         int count, int max_batch, int shared_acts,
                         const st_stage *with, st_error *err) {
  *out = NULL;
  st_stage *s = calloc(1, sizeof *s);
  if (!s) return st_error_set(err, ST_ENOMEM, "out of memory");
  s->model = m;
  s->first = first;
  s->count = count;
  s->max_batch = max_batch;
  s->shared_acts = shared_acts;
  s->acts = calloc((size_t)count, sizeof *s->acts);
  size_t numel, scratch;
  work_sizes(m, first, count, &numel, &scratch);
  size_t span = (size_t)max_batch * numel;
  s->owns_work = !with;
  if (with) { /* the same blocks and batch, never run at once */
    s->work = with->work;
    s->scratch = with->scratch;
    s->grad_io[0] = with->grad_io[0];
    s->grad_io[1] = with->grad_io[1];
  } else {
    s->work = st_alloc(3 * span * sizeof(float));
    s->scratch =
        st_alloc((size_t)max_batch * (scratch ? scratch : 1) * sizeof(float));
    s->grad_io[0] = st_alloc(span * sizeof(float));
    s->grad_io[1] = st_alloc(span * sizeof(float));
  }
  int ok = s->acts && s->work && s->scratch && s->grad_io[0] && s->grad_io[1];
  for (int i = 0; ok && i < count; i++) {
    s->acts[i] =
        shared_acts && i > 0
            ? s->acts[0]
            : st_alloc(act_floats(m, first, count, i, max_batch, shared_acts) *
                       sizeof(float));
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

int st_stage_create_shared(st_stage **out, const st_model *m, int first,
                           int count, int max_batch, int shared_acts,
                           st_error *err) {
  return st_stage_create_with(out, m, first, count, max_batch, shared_acts,
                              NULL, err);
}

int st_stage_create(st_stage **out, const st_model *m, int first, int count,
                    int max_batch, st_error *err) {
  return st_stage_create_shared(out, m, first, count, max_batch, 0, err);
}

int st_stage_enable_split(st_stage *s, st_error *err) {
  s->dys = calloc((size_t)s->count, sizeof *s->dys);
  int ok = s->dys != NULL;
  for (int i = 0; ok && i < s->count; i++) {
    size_t n = (size_t)s->max_batch *
               st_block_dys_floats(&s->model->blocks[s->first + i]);
    ok = (s->dys[i] = st_alloc((n ? n : 1) * sizeof(float))) != NULL;
  }
  return ok ? 0
            : st_error_set(err, ST_ENOMEM,
                           "out of memory for the deferred weight gradients "
                           "of blocks %d-%d",
                           s->first, s->first + s->count - 1);
}

void st_stage_destroy(st_stage *s) {
  if (!s) return;
  for (int i = 0; s->dys && i < s->count; i++) st_free(s->dys[i]);
  free(s->dys);
  if (s->acts)
    for (int i = 0; i < (s->shared_acts ? 1 : s->count); i++)
      st_free(s->acts[i]);
  free(s->acts);
  if (s->owns_work) {
    st_free(s->work);
    st_free(s->scratch);
    st_free(s->grad_io[0]);
    st_free(s->grad_io[1]);
  }
  free(s);
}

const float *st_stage_forward_block(st_stage *s, const st_ctx *ctx, int i,
                                    const float *w, const float *in, int B) {
  const st_block *b = &s->model->blocks[s->first + i];
  st_block_forward(b, ctx, w, in, s->acts[i], s->scratch, B);
  return st_block_output(b, s->acts[i], B);
}

void st_stage_backward_block(st_stage *s, const st_ctx *ctx, int i,
                             const float *w, float *g, const float *in,
                             const float *dout, float *din, int B) {
  const st_block *b = &s->model->blocks[s->first + i];
  st_block_backward(b, ctx, w, g, in, s->acts[i], dout, din, s->work,
                    s->scratch, B);
}

const float *st_stage_forward(st_stage *s, const st_ctx *ctx,
                              const float *params, const float *in, int B) {
  const float *x = in;
  for (int i = 0; i < s->count; i++) {
    const st_block *b = &s->model->blocks[s->first + i];
    x = st_stage_forward_block(s, ctx, i, params + (b->param_off - s->base), x,
                               B);
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
    st_stage_backward_block(s, ctx, i, params + at, grads + at, x, g, dx, B);
    if (after_block) after_block(arg, s->first + i);
    g = dx;
  }
}

/* Block i's input: the stage's input, or block i - 1's output. */
static const float *block_in(const st_stage *s, int i, const float *in, int B) {
  return i == 0 ? in
                : st_block_output(&s->model->blocks[s->first + i - 1],
                                  s->acts[i - 1], B);
}

void st_stage_backward_input(st_stage *s, const st_ctx *ctx,
                             const float *params, const float *in,
                             const float *dout, float *din, int B) {
  const float *g = dout;
  for (int i = s->count - 1; i >= 0; i--) {
    const st_block *b = &s->model->blocks[s->first + i];
    float *dx = st_stage_grad_to(s->grad_io, g, i, din);
    st_block_backward_input(b, ctx, params + (b->param_off - s->base),
                            block_in(s, i, in, B), s->acts[i], g, dx, s->work,
                            s->scratch, s->dys[i], B);
    g = dx;
  }
}

void st_stage_backward_weights_each(st_stage *s, const st_ctx *ctx,
                                    const float *params, float *grads,
                                    const float *in, int B,
                                    void (*after_block)(void *arg, int block),
                                    void *arg) {
  /* last block first, as the whole backward updates them */
  for (int i = s->count - 1; i >= 0; i--) {
    const st_block *b = &s->model->blocks[s->first + i];
    st_block_backward_weights(b, ctx, params + (b->param_off - s->base),
                              grads + (b->param_off - s->base),
                              block_in(s, i, in, B), s->acts[i], s->dys[i],
                              s->scratch, B);
    if (after_block) after_block(arg, s->first + i);
  }
}
