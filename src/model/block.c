/*
 * block.c — running a block: its layers in order on B samples (forward) and
 * in reverse (backward). A block's activations live in one caller-provided
 * buffer (layer l's output for B samples at out_off * B, its saved state at
 * save_off * B), so a pipeline stage can keep several micro-batches in flight
 * by holding several buffers; an output no backward reads lives in the
 * stage's scratch instead (st_layer.transient: always pass the scratch, B x
 * scratch_floats_per_sample floats). Parameter gradients are ADDED into the
 * block's gradient slab, which is how micro-batches accumulate.
 */
#include "strata.h"

#include <assert.h>
#include <string.h>

/* Layer L's output for B samples: in the activations, or (transient, see
 * st_layer) in the stage's scratch. */
static const float *layer_out(const st_layer *L, const float *acts,
                              const float *scratch, int B) {
  return (L->transient ? scratch : acts) + L->out_off * (size_t)B;
}

static float *layer_save(const st_layer *L, float *acts, int B) {
  return acts + L->save_off * (size_t)B;
}

static const float *param(const st_block *b, const float *slab, int t) {
  return t < 0 || !slab ? NULL : slab + b->tensors[t].offset;
}

static float *grad(const st_block *b, float *slab, int t) {
  return t < 0 ? NULL : slab + b->tensors[t].offset;
}

/* Per-sample layers (everything but linear and conv, which parallelise
 * inside their GEMMs, and gelu and layernorm, which split finer: see
 * fine_job) run on the stage's pool in chunks of samples whose size
 * depends only on the layer's shape. Each sample's result depends on that
 * sample alone, so any thread count gives the same bits. A chunk of 4K
 * floats (16 KB) is a few hundred nanoseconds of a relu, about what a
 * hand-off to the pool costs; with 32K, the MLP's relus and flatten at
 * batch 32 (8K and 25K floats) were one task each, run by the caller
 * while the other threads waited (2026-11-29, Zen 4 VM, 2 threads,
 * bench_mlp 32: the worker's idle share of a perf profile 11% -> 6%; the
 * rate +3-9% with the VM slow, within its noise, +0-4%, when fast; batch
 * 256 unchanged). */
enum { CHUNK_FLOATS = 1 << 12 };

static int rows_per_task(const st_layer *L) {
  size_t n = st_shape_numel(L->out);
  return n >= CHUNK_FLOATS ? 1 : (int)((CHUNK_FLOATS + n - 1) / n);
}

/* gelu (a tanh or an erf per element) and layernorm (two passes in double
 * per row) cost enough per element to split below a sample: at batch 1 a
 * GPT's 64 positions would otherwise be one task and leave the other
 * threads idle. Chunks of about FINE_FLOATS elements (gelu) or whole rows
 * (layernorm), by shape alone; each element or row is computed alone, so
 * the chunking does not change a bit. */
enum { FINE_FLOATS = 1 << 12 };

typedef struct fine_job {
  const st_layer *L;
  const float *x, *w, *bias, *g; /* g: backward's output gradient */
  float *y, *mean, *rstd, *dx;
  size_t n;   /* elements (gelu) or rows (layernorm) */
  size_t per; /* of them per task */
  int D;      /* layernorm's features */
} fine_job;

static int fine_layer(const st_layer *L) {
  return L->kind == ST_OP_GELU || L->kind == ST_OP_LAYERNORM;
}

static fine_job fine_split(const st_layer *L, int B) {
  fine_job j = {.L = L};
  size_t numel = (size_t)B * st_shape_numel(L->out);
  if (L->kind == ST_OP_LAYERNORM) {
    j.D = (int)(st_shape_numel(L->in) / (size_t)L->rows);
    j.n = (size_t)B * (size_t)L->rows;
    j.per = FINE_FLOATS / (size_t)j.D ? FINE_FLOATS / (size_t)j.D : 1;
  } else {
    j.n = numel;
    j.per = FINE_FLOATS;
  }
  return j;
}

static int fine_tasks(const fine_job *j) {
  return (int)((j->n + j->per - 1) / j->per);
}

static void fine_forward_task(void *arg, int task) {
  const fine_job *j = arg;
  size_t lo = (size_t)task * j->per,
         cnt = j->n - lo < j->per ? j->n - lo : j->per;
  if (j->L->kind == ST_OP_GELU) {
    st_gelu_forward(j->y + lo, j->x + lo, cnt, j->L->approximate);
    return;
  }
  size_t at = lo * (size_t)j->D;
  st_layernorm_forward(j->y + at, j->mean + lo, j->rstd + lo, j->x + at, j->w,
                       j->bias, (int)cnt, j->D, j->L->eps);
}

static void fine_backward_task(void *arg, int task) {
  const fine_job *j = arg;
  size_t lo = (size_t)task * j->per,
         cnt = j->n - lo < j->per ? j->n - lo : j->per;
  st_gelu_backward(j->dx + lo, j->g + lo, j->x + lo, cnt, j->L->approximate);
}

/* Forward of a per-sample layer on samples [s0, s0 + cnt) of a batch of B
 * (B locates the saved-state arrays, which are laid out per batch). */
static void forward_rows(const st_block *b, const st_layer *L,
                         const st_ctx *ctx, const float *block_in,
                         const float *x, float *acts, float *scratch, int B,
                         int s0, int cnt) {
  size_t n_in = st_shape_numel(L->in), n_out = st_shape_numel(L->out);
  float *y = (float *)layer_out(L, acts, scratch, B) + (size_t)s0 * n_out;
  float *save = layer_save(L, acts, B);
  size_t n = (size_t)cnt * n_out;
  x += (size_t)s0 * n_in;
  switch (L->kind) {
  case ST_OP_RELU:
    st_relu_forward(y, x, n);
    break;
  case ST_OP_MAXPOOL:
    st_maxpool_forward(y, (int32_t *)save + (size_t)s0 * n_out, x, cnt, L->in.c,
                       L->in.h, L->in.w, L->k, L->stride);
    break;
  case ST_OP_AVGPOOL:
    st_avgpool_forward(y, x, cnt, L->in.c, L->in.h, L->in.w, L->k, L->stride);
    break;
  case ST_OP_FLATTEN:
    memcpy(y, x, n * sizeof *y);
    break;
  case ST_OP_ROTARY:
    memcpy(y, x, n * sizeof *y);
    st_rotary_forward(y, cnt, L->out.h, L->out.c / 3, L->heads, L->rotary_dim);
    break;
  case ST_OP_RESIDUAL: {
    const float *from = L->skip < 0
                            ? block_in
                            : layer_out(&b->layers[L->skip], acts, scratch, B);
    const float *skip = from + (size_t)s0 * n_out;
    for (size_t i = 0; i < n; i++) y[i] = x[i] + skip[i];
    break;
  }
  case ST_OP_DROPOUT:
    if (ctx->training)
      st_dropout_forward(
          y, (uint32_t *)save + (size_t)s0 * st_dropout_mask_words(n_out), x,
          cnt, n_in, L->p, ctx->seed, L->id, ctx->first_sample + (uint64_t)s0);
    else
      memcpy(y, x, n * sizeof *y);
    break;
  case ST_OP_GELU:
  case ST_OP_LAYERNORM:
  case ST_OP_GROUPNORM:
  case ST_OP_LINEAR:
  case ST_OP_CONV2D:
  case ST_OP_EMBED:
  case ST_OP_ATTENTION:
  case ST_OP_LINEAR_XENT:
    break; /* not per-sample: see layer_forward */
  }
}

typedef struct rows_job {
  const st_block *b;
  const st_layer *L;
  const st_ctx *ctx;
  const float *params, *block_in, *x;
  float *acts, *scratch;
  const float *g; /* backward: output gradient */
  float *dx;      /* backward: input gradient */
  int B, rows;
} rows_job;

static void forward_task(void *arg, int task) {
  const rows_job *j = arg;
  int s0 = task * j->rows, cnt = j->B - s0 < j->rows ? j->B - s0 : j->rows;
  forward_rows(j->b, j->L, j->ctx, j->block_in, j->x, j->acts, j->scratch, j->B,
               s0, cnt);
}

static void layer_forward(const st_block *b, const st_layer *L,
                          const st_ctx *ctx, const float *params,
                          const float *block_in, const float *x, float *acts,
                          float *scratch, int B) {
  float *y = (float *)layer_out(L, acts, scratch, B);
  const float *w = param(b, params, L->w_tensor);
  const float *bias = param(b, params, L->b_tensor);
  int R = L->rows;
  if (L->kind == ST_OP_LINEAR) {
    int ic = (int)(st_shape_numel(L->in) / R), oc = L->out.c;
    if (L->wt)
      st_linear_t_forward(ctx->pool, y, x, w, bias, B * R, ic, oc);
    else
      st_linear_forward(ctx->pool, y, x, w, bias, B * R, ic, oc);
  } else if (L->kind == ST_OP_LINEAR_XENT) {
    /* the executor names the micro-batch's labels; the layer keeps them
     * (int32) beside each row's logsumexp for its backward */
    float *lse = layer_save(L, acts, B);
    assert(ctx->labels);
    st_linear_xent_forward(ctx->pool, y, lse, (int32_t *)(lse + (size_t)B * R),
                           x, w, bias, ctx->labels, scratch, B * R,
                           (int)(st_shape_numel(L->in) / R), L->vocab,
                           st_linear_xent_chunk(R, L->vocab), L->keep);
  } else if (L->kind == ST_OP_EMBED) {
    /* token ids arrive as floats (exact below 2^24); kept as int32 for the
     * backward's scatter */
    int32_t *tok = (int32_t *)layer_save(L, acts, B);
    size_t n = (size_t)B * L->out.h;
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)x[i];
    st_embedding_forward(y, tok, w, bias, B, L->out.h, L->out.c);
  } else if (L->kind == ST_OP_ATTENTION) {
    st_attention_forward(ctx->pool, y, scratch, x, B, L->out.h, L->out.c,
                         L->heads);
  } else if (L->kind == ST_OP_CONV2D) {
    st_conv2d_forward(ctx->pool, y, x, w, bias, scratch, B, L->in.c, L->in.h,
                      L->in.w, L->out.c, L->k, L->stride, L->pad);
  } else if (L->kind == ST_OP_GROUPNORM) {
    float *save = layer_save(L, acts, B);
    st_groupnorm_forward(ctx->pool, y, save, save + (size_t)B * L->groups, x, w,
                         bias, B, L->in.c, L->in.h * L->in.w, L->groups,
                         L->eps);
  } else if (fine_layer(L)) {
    fine_job j = fine_split(L, B);
    j.x = x, j.w = w, j.bias = bias, j.y = y;
    j.mean = layer_save(L, acts, B);
    j.rstd = j.mean + (size_t)B * (size_t)R;
    st_pool_for(ctx->pool, fine_tasks(&j), fine_forward_task, &j);
  } else {
    rows_job j = {b,    L,       ctx,  params, block_in, x,
                  acts, scratch, NULL, NULL,   B,        rows_per_task(L)};
    st_pool_for(ctx->pool, (B + j.rows - 1) / j.rows, forward_task, &j);
  }
}

/* An ST_HALF output's bf16 copy in the activations. */
static uint16_t *layer_half(const st_layer *L, const float *acts, int B) {
  return (uint16_t *)(acts + L->half_off * (size_t)B);
}

/* A block without the fused head may write anywhere in the stage's
 * scratch, the fused head's kept logits too (st_linear_xent_forward): it
 * ends them first. (The head's own block passes reach the head's forward
 * last and its backward first, or, in the weight half, the head right
 * after the layernorm before it.) */
static void end_kept_logits(const st_block *b, float *scratch) {
  for (int l = 0; l < b->n_layers; l++)
    if (b->layers[l].kind == ST_OP_LINEAR_XENT) return;
  if (scratch) st_linear_xent_forget(scratch);
}

/* strata.h. The linear's scratch slot is then never written: no backward
 * reads it (relu's reads its own output). The same bits as the two apart;
 * at batch 256 the MLP's two relu passes and their hand-offs to the pool
 * were 1-2% of a step. */
int st_layer_fuses_relu(const st_block *b, int l) {
  const st_layer *L = &b->layers[l];
  return L->kind == ST_OP_LINEAR && L->transient == ST_TRANSIENT &&
         l + 1 < b->n_layers && b->layers[l + 1].kind == ST_OP_RELU;
}

void st_block_forward(const st_block *b, const st_ctx *ctx, const float *params,
                      const float *in, float *acts, float *scratch, int B) {
  end_kept_logits(b, scratch);
  const float *x = in;
  for (int l = 0; l < b->n_layers; l++) {
    const st_layer *L = &b->layers[l];
    if (st_layer_fuses_relu(b, l)) {
      const st_layer *relu = &b->layers[++l];
      st_linear_relu_forward(
          ctx->pool, L->wt, (float *)layer_out(relu, acts, scratch, B), x,
          param(b, params, L->w_tensor), param(b, params, L->b_tensor),
          B * L->rows, (int)(st_shape_numel(L->in) / L->rows), L->out.c);
      L = relu;
    } else {
      layer_forward(b, L, ctx, params, in, x, acts, scratch, B);
    }
    x = layer_out(L, acts, scratch, B);
    if (L->transient == ST_HALF) /* kept for the backward as bf16 */
      st_bf16_pack_as_gemm(ctx->pool, x, layer_half(L, acts, B),
                           (size_t)B * st_shape_numel(L->out));
  }
}

const float *st_block_output(const st_block *b, const float *acts, int B) {
  return layer_out(&b->layers[b->n_layers - 1], acts, NULL, B); /* kept */
}

/* Layer l's input for a backward: a recomputed gelu's output made again
 * into its scratch slot from its own input, with the forward's calls (the
 * same bits: gelu has no parameters and reads nothing else); an ST_HALF
 * output widened from its bf16 copy into its slot (what the product reads
 * of it is the same bf16). */
static const float *backward_input(const st_block *b, const st_ctx *ctx,
                                   const float *in, const float *acts,
                                   float *scratch, int l, int B) {
  if (l == 0) return in;
  const st_layer *P = &b->layers[l - 1];
  if (P->transient == ST_HALF) /* widened into its scratch slot */
    st_bf16_unpack_pool(ctx->pool, layer_half(P, acts, B),
                        (float *)layer_out(P, acts, scratch, B),
                        (size_t)B * st_shape_numel(P->out));
  if (P->transient == ST_RECOMPUTED) {
    const float *px =
        l == 1 ? in : layer_out(&b->layers[l - 2], acts, scratch, B);
    layer_forward(b, P, ctx, NULL, in, px, (float *)acts, scratch, B);
  }
  return layer_out(P, acts, scratch, B);
}

int st_layer_fuses_update(const st_layer *L, const st_ctx *ctx, int B) {
  /* one position (a tied copy is updated with its source's gradient) */
  return ctx->fused && B == 1 && L->kind == ST_OP_LINEAR && L->rows == 1 &&
         !L->wt;
}

/* Backward of a per-sample layer on samples [s0, s0 + cnt). */
static void backward_rows(const st_layer *L, const st_ctx *ctx, const float *x,
                          const float *acts, const float *g, float *dx, int B,
                          int s0, int cnt) {
  size_t n_in = st_shape_numel(L->in), n_out = st_shape_numel(L->out);
  const float *save = acts + L->save_off * (size_t)B;
  size_t n = (size_t)cnt * n_out;
  x += (size_t)s0 * n_in;
  g += (size_t)s0 * n_out;
  dx += (size_t)s0 * n_in;
  switch (L->kind) {
  case ST_OP_RELU: /* its output is kept (model.c) */
    st_relu_backward(dx, g, layer_out(L, acts, NULL, B) + (size_t)s0 * n_out,
                     n);
    break;
  case ST_OP_MAXPOOL:
    st_maxpool_backward(dx, g, (const int32_t *)save + (size_t)s0 * n_out, cnt,
                        L->in.c, L->in.h, L->in.w, L->k, L->stride);
    break;
  case ST_OP_AVGPOOL:
    st_avgpool_backward(dx, g, cnt, L->in.c, L->in.h, L->in.w, L->k, L->stride);
    break;
  case ST_OP_ROTARY:
    memcpy(dx, g, n * sizeof *dx);
    st_rotary_backward(dx, cnt, L->out.h, L->out.c / 3, L->heads,
                       L->rotary_dim);
    break;
  case ST_OP_DROPOUT:
    if (ctx->training)
      st_dropout_backward(dx, g,
                          (const uint32_t *)save +
                              (size_t)s0 * st_dropout_mask_words(n_out),
                          cnt, n_out, L->p);
    else /* without training dropout is the identity */
      memcpy(dx, g, n * sizeof *dx);
    break;
  default: /* flatten, residual (its skip half is the caller's) */
    memcpy(dx, g, n * sizeof *dx);
    break;
  }
}

static void backward_task(void *arg, int task) {
  const rows_job *j = arg;
  int s0 = task * j->rows, cnt = j->B - s0 < j->rows ? j->B - s0 : j->rows;
  backward_rows(j->L, j->ctx, j->x, j->acts, j->g, j->dx, j->B, s0, cnt);
}

/* Computes the gradient of one layer. dx may be NULL only for layers whose
 * kernels accept it (linear, conv2d); the caller guarantees that. */
static void layer_backward(const st_block *b, const st_layer *L,
                           const st_ctx *ctx, const float *params, float *grads,
                           const float *x, const float *acts, const float *g,
                           float *dx, float *scratch, int B) {
  const float *save = acts + L->save_off * (size_t)B;
  const float *w = param(b, params, L->w_tensor);
  /* grads NULL: the input gradient alone (a split backward's B) */
  float *dw = grads ? grad(b, grads, L->w_tensor) : NULL;
  float *db = grads ? grad(b, grads, L->b_tensor) : NULL;
  size_t n_in = st_shape_numel(L->in);
  int R = L->rows;
  switch (L->kind) {
  case ST_OP_LINEAR:
    if (grads && st_layer_fuses_update(L, ctx, B) &&
        b->tensors[L->w_tensor].tie < 0) {
      /* The input gradient, with the weights the forward used, and the
       * update straight from dy and x (BACKGROUND: batch-1 training). */
      const st_fused_update *f = ctx->fused;
      size_t wo = b->param_off + b->tensors[L->w_tensor].offset;
      int adamw = f->rule->adamw;
      float *pw = f->predict ? f->predict + (wo - f->predict_base) : NULL;
      st_optim_update_outer(ctx->pool, f->rule, f->params + wo, f->opt + wo,
                            adamw ? f->opt + f->slot_stride + wo : NULL, g, x,
                            L->out.c, (int)n_in, pw, dx);
      if (L->b_tensor >= 0) { /* a GPT's lm_head has none */
        size_t bo = b->param_off + b->tensors[L->b_tensor].offset;
        float *pb = f->predict ? f->predict + (bo - f->predict_base) : NULL;
        st_optim_update_vec(f->rule, f->params + bo, f->opt + bo,
                            adamw ? f->opt + f->slot_stride + bo : NULL, g,
                            (size_t)L->out.c, pb);
      }
      break;
    }
    if (L->wt)
      st_linear_t_backward(ctx->pool, dx, dw, db, g, x, w, B * R,
                           (int)(n_in / R), L->out.c);
    else
      st_linear_backward(ctx->pool, dx, dw, db, g, x, w, B * R, (int)(n_in / R),
                         L->out.c);
    break;
  case ST_OP_LINEAR_XENT:
    st_linear_xent_backward(
        ctx->pool, dx, dw, db, g, x, w, param(b, params, L->b_tensor), save,
        (const int32_t *)(save + (size_t)B * R), scratch, B * R,
        (int)(n_in / R), L->vocab, st_linear_xent_chunk(R, L->vocab), L->keep);
    break;
  case ST_OP_EMBED:
    if (dw || db)
      st_embedding_backward(dw, db, g, (const int32_t *)save, B, L->out.h,
                            L->out.c);
    if (dx) memset(dx, 0, (size_t)B * n_in * sizeof *dx); /* token ids */
    break;
  case ST_OP_ATTENTION:
    st_attention_backward(ctx->pool, dx, g, x, scratch, B, L->out.h, L->out.c,
                          L->heads);
    break;
  case ST_OP_CONV2D:
    st_conv2d_backward(ctx->pool, dx, dw, db, g, x, w, scratch, B, L->in.c,
                       L->in.h, L->in.w, L->out.c, L->k, L->stride, L->pad);
    break;
  case ST_OP_GELU: {
    fine_job j = fine_split(L, B);
    j.x = x, j.g = g, j.dx = dx;
    st_pool_for(ctx->pool, fine_tasks(&j), fine_backward_task, &j);
    break;
  }
  case ST_OP_RELU:
  case ST_OP_MAXPOOL:
  case ST_OP_AVGPOOL:
  case ST_OP_FLATTEN:
  case ST_OP_RESIDUAL: /* the skip half is handled by the caller */
  case ST_OP_ROTARY:
  case ST_OP_DROPOUT: {
    rows_job j = {b, L,  ctx, params,          NULL, x, (float *)acts, NULL,
                  g, dx, B,   rows_per_task(L)};
    st_pool_for(ctx->pool, (B + j.rows - 1) / j.rows, backward_task, &j);
    break;
  }
  case ST_OP_LAYERNORM:
    st_layernorm_backward(ctx->pool, dx, dw, db, g, x, w, save,
                          save + (size_t)B * R, scratch, B * R,
                          (int)(n_in / R));
    break;
  case ST_OP_GROUPNORM:
    st_groupnorm_backward(ctx->pool, dx, dw, db, g, x, w, save,
                          save + (size_t)B * L->groups, B, L->in.c,
                          L->in.h * L->in.w, L->groups);
    break;
  }
}

/* The lowest layer whose backward must run when the caller wants no input
 * gradient: the first layer with parameters. Layers below it (a flatten in
 * front of the first linear layer) would only produce a gradient for the
 * model's input, which nothing uses. */
static int lowest_needed(const st_block *b) {
  for (int l = 0; l < b->n_layers; l++)
    if (b->layers[l].w_tensor >= 0) return l;
  return b->n_layers;
}

/* The whole backward (dys NULL), or its B half: every layer's input
 * gradient, no weight gradient, each layer with weights leaving its output
 * gradient in dys for the W half. */
static void backward(const st_block *b, const st_ctx *ctx, const float *params,
                     float *grads, const float *in, const float *acts,
                     const float *dout, float *din, float *work, float *scratch,
                     float *dys, int B) {
  size_t span = (size_t)B * b->max_numel;
  float *ping = work, *pong = work + span, *skip = work + 2 * span;
  const float *g = dout;
  int stop = din ? 0 : lowest_needed(b);
  /* A residual's skip gradient waits in `skip` until the backward reaches
   * the layer it came from: NONE, -1 (the block input) or a layer index.
   * Residual spans never overlap (the builders' rule), so one buffer
   * serves. */
  enum { NONE = -2 };
  int pending = NONE;
  size_t dy_end = dys ? st_block_dys_floats(b) * (size_t)B : 0;
  for (int l = b->n_layers - 1; l >= stop; l--) {
    const st_layer *L = &b->layers[l];
    /* (the B half's linear and conv read no input: no gelu made again) */
    const float *x =
        dys && (L->kind == ST_OP_LINEAR || L->kind == ST_OP_CONV2D) && l > 0
            ? layer_out(&b->layers[l - 1], acts, scratch, B)
            : backward_input(b, ctx, in, acts, scratch, l, B);
    if (L->kind == ST_OP_RESIDUAL) {
      st_pool_copy(ctx->pool, skip, g, (size_t)B * st_shape_numel(L->out));
      pending = L->skip;
    }
    if (dys && L->w_tensor >= 0) { /* kept for the W half */
      size_t n = (size_t)B * st_shape_numel(L->out);
      dy_end -= n;
      st_pool_copy(ctx->pool, dys + dy_end, g, n);
    }
    float *dx = g == ping ? pong : ping;
    if (l == stop) {
      /* The input gradient goes straight to the caller. Without a caller
       * buffer, these kernels skip it; others need somewhere to write, and
       * ping/pong serves. */
      int optional = L->kind == ST_OP_LINEAR || L->kind == ST_OP_CONV2D ||
                     L->kind == ST_OP_LINEAR_XENT || L->kind == ST_OP_EMBED;
      dx = din ? din : optional ? NULL : dx;
    }
    if (dx || !dys)
      layer_backward(b, L, ctx, params, dys ? NULL : grads, x, acts, g, dx,
                     scratch, B);
    if (pending == l - 1 && l > 0 && dx) {
      /* dx is the gradient of layer l-1's output: the skip joins here */
      st_pool_add(ctx->pool, dx, skip, (size_t)B * st_shape_numel(L->in));
      pending = NONE;
    }
    g = dx;
  }
  if (pending == -1 && din && b->has_residual) {
    st_pool_add(ctx->pool, din, skip, (size_t)B * st_shape_numel(b->in));
  }
}

void st_block_backward(const st_block *b, const st_ctx *ctx,
                       const float *params, float *grads, const float *in,
                       const float *acts, const float *dout, float *din,
                       float *work, float *scratch, int B) {
  end_kept_logits(b, scratch);
  backward(b, ctx, params, grads, in, acts, dout, din, work, scratch, NULL, B);
}

size_t st_block_dys_floats(const st_block *b) {
  size_t n = 0;
  for (int l = 0; l < b->n_layers; l++)
    if (b->layers[l].w_tensor >= 0) n += st_shape_numel(b->layers[l].out);
  return n;
}

void st_block_backward_input(const st_block *b, const st_ctx *ctx,
                             const float *params, const float *in,
                             const float *acts, const float *dout, float *din,
                             float *work, float *scratch, float *dys, int B) {
  assert(!ctx->fused); /* a fused update needs the whole backward */
  end_kept_logits(b, scratch);
  backward(b, ctx, params, NULL, in, acts, dout, din, work, scratch, dys, B);
}

void st_block_backward_weights(const st_block *b, const st_ctx *ctx,
                               const float *params, float *grads,
                               const float *in, const float *acts,
                               const float *dys, float *scratch, int B) {
  assert(!ctx->fused);
  end_kept_logits(b, scratch);
  /* the same calls as the whole backward makes for these gradients, each
   * layer's from its input and its output gradient; every tensor belongs
   * to one layer, so the order across layers changes no bit */
  size_t at = 0;
  for (int l = 0; l < b->n_layers; l++) {
    const st_layer *L = &b->layers[l];
    if (L->w_tensor < 0) continue;
    const float *x = backward_input(b, ctx, in, acts, scratch, l, B);
    /* (the weights: a fused head makes its logits again) */
    layer_backward(b, L, ctx, params, grads, x, acts, dys + at, NULL, scratch,
                   B);
    at += (size_t)B * st_shape_numel(L->out);
  }
}
