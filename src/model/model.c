/*
 * model.c — builds a model from the config: an ordered array of blocks, each
 * with its layers, named parameter tensors in one contiguous slab, its
 * activation layout and its cost per sample. Builders:
 *   mlp — FC-MNIST: (linear, [layernorm], [+x], activation, [dropout])
 *         per hidden width, then a linear head; one block per hidden layer
 *         (+x: model.residual, every hidden layer but the first). The
 *         first linear layer reads an image's elements as one vector, in
 *         place: a flatten layer in front of it copied the batch (800 KB
 *         at batch 256), 3.4% of `bench_mlp 256 2`'s step in the pool's
 *         jobs, with 784 floats a sample kept for nothing (2026-11-29,
 *         Zen 3).
 *   cnn — per stage of `channels`: a conv block (conv, [groupnorm], relu) and
 *         `residual_blocks` residual blocks (conv, [gn], relu, conv, [gn], +x,
 *         relu), then pooling 2x2 on the stage's last block; then flatten,
 *         dense blocks and a linear head.
 * Every shape is checked here, so an impossible config fails before any
 * memory is allocated, naming the key and where it was set.
 */
#include "strata.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* A builder appends layers to the block under construction. */
typedef struct builder {
  st_model *m;
  st_block *b; /* current block */
  int cap_blocks;
  int cap_layers, cap_tensors;
  st_shape cur;     /* shape flowing out of the last layer */
  uint32_t next_id; /* model-wide layer index */
  int rows;         /* positions per sample of the layers added (gpt) */
  /* Tensor-name prefix of the next layer's parameters; "" means
   * "<block>.<layer>" (gpt sets the Hugging Face module path). */
  char module[ST_NAME_MAX - 8];
  const st_config *cfg;
  st_error *err;
  int failed;
} builder;

static int oom(builder *bd) {
  bd->failed = 1;
  return st_error_set(bd->err, ST_ENOMEM, "out of memory building the model");
}

/* The code of the error that stopped the build (out of memory or a
 * shape). */
static int failure(const builder *bd) {
  return bd->err->code ? bd->err->code : ST_ENOMEM;
}

static void begin_block(builder *bd) {
  st_model *m = bd->m;
  if (bd->failed) return;
  if (m->n_blocks == bd->cap_blocks) {
    int cap = bd->cap_blocks ? 2 * bd->cap_blocks : 16;
    st_block *grown = realloc(m->blocks, (size_t)cap * sizeof *grown);
    if (!grown) {
      oom(bd);
      return;
    }
    m->blocks = grown;
    bd->cap_blocks = cap;
  }
  bd->b = &m->blocks[m->n_blocks++];
  memset(bd->b, 0, sizeof *bd->b);
  snprintf(bd->b->name, sizeof bd->b->name, "blocks.%d", m->n_blocks - 1);
  bd->b->in = bd->cur;
  bd->cap_layers = bd->cap_tensors = 0;
}

static int add_tensor(builder *bd, const st_layer *L, const char *what,
                      int ndim, const int64_t *dims) {
  st_block *b = bd->b;
  if (b->n_tensors == bd->cap_tensors) {
    int cap = bd->cap_tensors ? 2 * bd->cap_tensors : 8;
    st_tensor_info *grown = realloc(b->tensors, (size_t)cap * sizeof *grown);
    if (!grown) return oom(bd), -1;
    b->tensors = grown;
    bd->cap_tensors = cap;
  }
  st_tensor_info *t = &b->tensors[b->n_tensors];
  memset(t, 0, sizeof *t);
  if (bd->module[0])
    snprintf(t->name, sizeof t->name, "%s.%s", bd->module, what);
  else
    snprintf(t->name, sizeof t->name, "%s.%s.%s", b->name, L->name, what);
  t->ndim = ndim;
  t->numel = 1;
  double numel = 1;
  for (int d = 0; d < ndim; d++) {
    t->dims[d] = dims[d];
    t->numel *= (size_t)dims[d];
    numel *= (double)dims[d];
  }
  /* the kernels index a tensor with int */
  if (numel > INT_MAX) {
    bd->failed = 1;
    st_error_set(bd->err, ST_ESHAPE,
                 "model: tensor %s would hold %.3g elements, more than the "
                 "%d one tensor may (a model key too large?)",
                 t->name, numel, INT_MAX);
    return -1;
  }
  t->offset = b->n_params;
  t->tie = -1;
  b->n_params += t->numel;
  return b->n_tensors++;
}

/* Appends a layer of `kind` whose output shape is `out`; returns it (zeroed
 * hyperparameters, no tensors) or NULL after an allocation failure. */
static st_layer *add_layer(builder *bd, st_op_kind kind, st_shape out) {
  if (bd->failed) return NULL;
  st_block *b = bd->b;
  if (b->n_layers == bd->cap_layers) {
    int cap = bd->cap_layers ? 2 * bd->cap_layers : 8;
    st_layer *grown = realloc(b->layers, (size_t)cap * sizeof *grown);
    if (!grown) return oom(bd), NULL;
    b->layers = grown;
    bd->cap_layers = cap;
  }
  st_layer *L = &b->layers[b->n_layers];
  memset(L, 0, sizeof *L);
  L->kind = kind;
  int same = 0;
  for (int l = 0; l < b->n_layers; l++) same += b->layers[l].kind == kind;
  snprintf(L->name, sizeof L->name, "%s%d", st_op_name(kind), same);
  L->in = bd->cur;
  L->out = out;
  L->id = bd->next_id++;
  L->w_tensor = L->b_tensor = -1;
  L->rows = bd->rows ? bd->rows : 1;
  L->skip = -1;
  b->n_layers++;
  bd->cur = out;
  return L;
}

static st_shape vec(int n) { return (st_shape){n, 1, 1}; }

static void add_linear(builder *bd, int out_features) {
  int in = (int)st_shape_numel(bd->cur);
  st_layer *L = add_layer(bd, ST_OP_LINEAR, vec(out_features));
  if (!L) return;
  int64_t wd[2] = {out_features, in}, bd1[1] = {out_features};
  L->w_tensor = add_tensor(bd, L, "weight", 2, wd);
  L->b_tensor = add_tensor(bd, L, "bias", 1, bd1);
}

static void add_activation(builder *bd, const char *name) {
  st_op_kind kind = strcmp(name, "relu") == 0 ? ST_OP_RELU : ST_OP_GELU;
  st_layer *L = add_layer(bd, kind, bd->cur);
  if (L) L->approximate = strcmp(name, "gelu_tanh") == 0;
}

static void add_affine_norm(builder *bd, st_op_kind kind, int channels,
                            int groups) {
  st_layer *L = add_layer(bd, kind, bd->cur);
  if (!L) return;
  L->eps = 1e-5f;
  L->groups = groups;
  int64_t d[1] = {channels};
  L->w_tensor = add_tensor(bd, L, "weight", 1, d);
  L->b_tensor = add_tensor(bd, L, "bias", 1, d);
}

static void add_dropout(builder *bd, float p) {
  if (p <= 0) return;
  st_layer *L = add_layer(bd, ST_OP_DROPOUT, bd->cur);
  if (L) L->p = p;
}

static void add_conv(builder *bd, int oc, int k) {
  st_shape in = bd->cur;
  st_layer *L = add_layer(bd, ST_OP_CONV2D, (st_shape){oc, in.h, in.w});
  if (!L) return;
  L->k = k, L->stride = 1, L->pad = k / 2;
  int64_t wd[4] = {oc, in.c, k, k}, bd1[1] = {oc};
  L->w_tensor = add_tensor(bd, L, "weight", 4, wd);
  L->b_tensor = add_tensor(bd, L, "bias", 1, bd1);
}

static int shape_error(builder *bd, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int shape_error(builder *bd, const char *key, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  bd->failed = 1;
  return st_error_set(bd->err, ST_ESHAPE, "%s: %s: %s",
                      st_config_where(bd->cfg, key), key, why);
}

static int build_mlp(builder *bd) {
  const st_config *c = bd->cfg;
  for (int i = 0; i < c->model.hidden.n; i++) {
    begin_block(bd);
    if (c->model.residual && i > 0 &&
        c->model.hidden.v[i] != c->model.hidden.v[i - 1])
      return shape_error(bd, "model.residual",
                         "hidden layer %d is %d wide and its input %d: a "
                         "residual layer adds its input, so the widths must "
                         "match",
                         i, c->model.hidden.v[i], c->model.hidden.v[i - 1]);
    add_linear(bd, c->model.hidden.v[i]);
    if (strcmp(c->model.norm, "layernorm") == 0)
      add_affine_norm(bd, ST_OP_LAYERNORM, c->model.hidden.v[i], 1);
    else if (strcmp(c->model.norm, "none") != 0)
      return shape_error(bd, "model.norm",
                         "the mlp takes 'none' or 'layernorm'");
    if (c->model.residual && i > 0 && add_layer(bd, ST_OP_RESIDUAL, bd->cur))
      bd->b->has_residual = 1;
    add_activation(bd, c->model.activation);
    add_dropout(bd, c->model.dropout);
  }
  begin_block(bd);
  add_linear(bd, c->model.classes);
  return bd->failed ? failure(bd) : 0;
}

/* conv, [groupnorm], relu */
static int conv_unit(builder *bd, int oc) {
  const st_config *c = bd->cfg;
  add_conv(bd, oc, c->model.kernel);
  if (strcmp(c->model.norm, "groupnorm") == 0) {
    if (oc % c->model.groups)
      return shape_error(bd, "model.groups",
                         "%d channels do not split into %d groups", oc,
                         c->model.groups);
    add_affine_norm(bd, ST_OP_GROUPNORM, oc, c->model.groups);
  } else if (strcmp(c->model.norm, "none") != 0) {
    return shape_error(bd, "model.norm", "the cnn takes 'none' or 'groupnorm'");
  }
  return 0;
}

/* The flatten in front of the first dense layer: the map as one vector,
 * whose width (st_shape.c, an int) must hold every element of it. */
static int add_flatten(builder *bd) {
  size_t n = st_shape_numel(bd->cur);
  if (n > INT_MAX)
    return shape_error(bd, "model.channels",
                       "the last stage's %dx%dx%d map is %zu values, more "
                       "than the %d a dense layer may read",
                       bd->cur.c, bd->cur.h, bd->cur.w, n, INT_MAX);
  add_layer(bd, ST_OP_FLATTEN, vec((int)n));
  return 0;
}

static int build_cnn(builder *bd) {
  const st_config *c = bd->cfg;
  /* the blocks' tables are built before the memory check can refuse them */
  double blocks =
      (double)c->model.channels.n * (1.0 + c->model.residual_blocks);
  if (blocks > ST_MAX_BLOCKS)
    return shape_error(bd, "model.residual_blocks",
                       "%d per stage over %d stages is %.0f blocks; at most "
                       "%d",
                       c->model.residual_blocks, c->model.channels.n, blocks,
                       ST_MAX_BLOCKS);
  for (int s = 0; s < c->model.channels.n; s++) {
    int oc = c->model.channels.v[s];
    begin_block(bd);
    if (conv_unit(bd, oc)) return ST_ESHAPE;
    add_activation(bd, "relu");
    for (int r = 0; r < c->model.residual_blocks; r++) {
      begin_block(bd);
      if (conv_unit(bd, oc)) return ST_ESHAPE;
      add_activation(bd, "relu");
      if (conv_unit(bd, oc)) return ST_ESHAPE;
      if (add_layer(bd, ST_OP_RESIDUAL, bd->cur)) bd->b->has_residual = 1;
      add_activation(bd, "relu");
    }
    if (bd->cur.h < 2 || bd->cur.w < 2)
      return shape_error(bd, "model.channels",
                         "stage %d would pool a %dx%d map below 1x1: too "
                         "many stages for the input",
                         s, bd->cur.h, bd->cur.w);
    st_shape pooled = {oc, bd->cur.h / 2, bd->cur.w / 2};
    st_layer *L = add_layer(
        bd, strcmp(c->model.pool, "avg") == 0 ? ST_OP_AVGPOOL : ST_OP_MAXPOOL,
        pooled);
    if (L) L->k = 2, L->stride = 2;
  }
  for (int i = 0; i < c->model.dense.n; i++) {
    begin_block(bd);
    if (i == 0 && add_flatten(bd)) return ST_ESHAPE;
    add_linear(bd, c->model.dense.v[i]);
    add_activation(bd, c->model.activation);
    add_dropout(bd, c->model.dropout);
  }
  begin_block(bd);
  if (c->model.dense.n == 0 && add_flatten(bd)) return ST_ESHAPE;
  add_linear(bd, c->model.classes);
  return bd->failed ? failure(bd) : 0;
}

/* ------------------------------------------------------------------- gpt */

/* Sets the next layer's tensor prefix (printf-style), "" for the default. */
static void set_module(builder *bd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_module(builder *bd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(bd->module, sizeof bd->module, fmt, ap);
  va_end(ap);
}

static void name_layer(st_layer *L, const char *name) {
  if (L) snprintf(L->name, sizeof L->name, "%s", name);
}

/* A linear layer on each of the `rows` positions: (rows, IC) -> (rows, OC).
 * wt: weight stored (IC, OC) as HF's Conv1D; bias: whether there is one. */
static st_layer *add_seq_linear(builder *bd, const char *name, int oc, int wt,
                                int bias, float std) {
  int ic = bd->cur.c;
  st_layer *L = add_layer(bd, ST_OP_LINEAR, (st_shape){oc, bd->cur.h, 1});
  if (!L) return NULL;
  name_layer(L, name);
  L->wt = wt;
  L->init_std = std;
  int64_t wd[2] = {wt ? ic : oc, wt ? oc : ic}, bd1[1] = {oc};
  L->w_tensor = add_tensor(bd, L, "weight", 2, wd);
  if (bias) L->b_tensor = add_tensor(bd, L, "bias", 1, bd1);
  return L;
}

static void add_seq_layernorm(builder *bd, const char *name) {
  st_layer *L = add_layer(bd, ST_OP_LAYERNORM, bd->cur);
  if (!L) return;
  name_layer(L, name);
  L->eps = 1e-5f;
  int64_t d[1] = {bd->cur.c};
  L->w_tensor = add_tensor(bd, L, "weight", 1, d);
  L->b_tensor = add_tensor(bd, L, "bias", 1, d);
}

/* Whether a fused head's backward finds the logits its forward kept: the
 * forward must be the last one run in the stage's scratch before it. Not
 * so where every micro-batch's forward runs before the first backward —
 * gpipe and block_sequential with more than one micro-batch, which run
 * the backwards in micro-batch order: the first finds the last forward's
 * chunks, and ends them (reviewed by a helper on gpt_tiny: 0 of 24
 * backwards took them). There the head keeps none, and neither its
 * scratch nor the plan's FLOPs count them. The micro-batches are a
 * replica's: over MPI ranks without execution.placement: ranks, each rank
 * is one (the run's ranks, or the plan's launch.ranks), and without
 * micro-batches configured the noise scale measures the batch in two
 * halves (trainer.c). */
static int head_keeps(const st_config *c) {
  const char *mode = c->execution.mode;
  int fill =
      !strcmp(mode, "block_sequential") ||
      (!strcmp(mode, "pipeline") && !strcmp(c->execution.schedule, "gpipe"));
  int W = st_dist_size() > 1 ? st_dist_size() : c->launch.ranks;
  int R = c->execution.replicas > 1 ? c->execution.replicas
          : W > 1 && strcmp(c->execution.placement, "ranks") ? W
                                                             : 1;
  int share = c->train.batch / R > 0 ? c->train.batch / R : 1;
  int mb = c->execution.micro_batch > 0 ? c->execution.micro_batch
           : c->metrics.noise_scale     ? share / 2
                                        : share;
  if (mb < 1 || mb > share) mb = share;
  return !fill || share / mb <= 1;
}

/* GPT-2 style (Radford et al. 2019), pre-layernorm: an embedding block,
 * `layers` transformer blocks
 *   x + c_proj(attention(c_attn(ln_1(x))))  then  y + mlp(ln_2(y)),
 * and a head block (ln_f, lm_head). Activations are (T, C) per sample,
 * position-major, written as the shape {C, T, 1}. Tensor names are Hugging
 * Face GPT-2's, c_attn / c_proj / c_fc weights in its (IC, OC) layout; the
 * initialisation is GPT-2's: N(0, 0.02), residual projections N(0, 0.02 /
 * sqrt(2 layers)), biases 0, layernorms 1 and 0. */
static int build_gpt(builder *bd) {
  const st_config *c = bd->cfg;
  int T = c->model.context, C = c->model.width, NH = c->model.heads;
  int V = c->model.vocab, NL = c->model.layers, R = c->model.mlp_ratio;
  int rotary = strcmp(c->model.positions, "rotary") == 0;
  if (V < 1)
    return shape_error(bd, "model.vocab",
                       "%d; set it, or leave it 0 with a text dataset to take "
                       "the tokenizer's",
                       V);
  if (T < 1) return shape_error(bd, "model.context", "%d; must be >= 1", T);
  if (NL < 0) return shape_error(bd, "model.layers", "%d; must be >= 0", NL);
  if (C < 1) return shape_error(bd, "model.width", "%d; must be >= 1", C);
  if (NH < 1 || C % NH)
    return shape_error(bd, "model.heads",
                       "%d heads do not split model.width %d evenly", NH, C);
  if (R < 1) return shape_error(bd, "model.mlp_ratio", "%d; must be >= 1", R);
  int hs = C / NH, rd = c->model.rotary_dim ? c->model.rotary_dim : hs;
  if (rotary && !c->model.rotary_dim && (rd < 2 || rd % 2))
    return shape_error(bd, "model.rotary_dim",
                       "0 rotates all %d dims of a head (model.width %d / "
                       "model.heads %d), but rotary turns them in pairs: set "
                       "it to an even number of at most %d, or make the head "
                       "size even",
                       hs, C, NH, hs);
  if (rotary && (rd < 2 || rd % 2 || rd > hs))
    return shape_error(bd, "model.rotary_dim",
                       "%d; must be even and at most the head size %d", rd, hs);
  /* the attention probabilities of one sample and head are T x T floats */
  if ((double)T * T * NH > 1e12)
    return shape_error(bd, "model.context", "%d is too long", T);
  bd->m->in = bd->cur = (st_shape){1, T, 1};
  bd->m->label_rows = T;
  bd->m->classes = V;
  bd->rows = T;
  const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (NL ? NL : 1));

  begin_block(bd);
  if (bd->failed) return failure(bd);
  snprintf(bd->b->name, sizeof bd->b->name, "embed");
  st_layer *E = add_layer(bd, ST_OP_EMBED, (st_shape){C, T, 1});
  if (E) {
    name_layer(E, "wte");
    E->init_std = std;
    E->vocab = V;
    set_module(bd, "transformer.wte");
    int64_t wd[2] = {V, C}, pd[2] = {T, C};
    E->w_tensor = add_tensor(bd, E, "weight", 2, wd);
    if (!rotary) {
      set_module(bd, "transformer.wpe");
      E->b_tensor = add_tensor(bd, E, "weight", 2, pd);
    }
  }
  add_dropout(bd, c->model.dropout);

  for (int i = 0; i < NL; i++) {
    begin_block(bd);
    if (bd->failed) return failure(bd);
    snprintf(bd->b->name, sizeof bd->b->name, "h.%d", i);
    set_module(bd, "transformer.h.%d.ln_1", i);
    add_seq_layernorm(bd, "ln_1");
    set_module(bd, "transformer.h.%d.attn.c_attn", i);
    add_seq_linear(bd, "c_attn", 3 * C, 1, 1, std);
    if (rotary) {
      st_layer *L = add_layer(bd, ST_OP_ROTARY, bd->cur);
      if (L) L->heads = NH, L->rotary_dim = rd;
    }
    st_layer *A = add_layer(bd, ST_OP_ATTENTION, (st_shape){C, T, 1});
    if (A) A->heads = NH;
    set_module(bd, "transformer.h.%d.attn.c_proj", i);
    add_seq_linear(bd, "attn_proj", C, 1, 1, proj_std);
    add_dropout(bd, c->model.dropout);
    st_layer *r1 = add_layer(bd, ST_OP_RESIDUAL, bd->cur);
    int r1_index = bd->b->n_layers - 1;
    if (r1) bd->b->has_residual = 1;
    set_module(bd, "transformer.h.%d.ln_2", i);
    add_seq_layernorm(bd, "ln_2");
    set_module(bd, "transformer.h.%d.mlp.c_fc", i);
    add_seq_linear(bd, "c_fc", R * C, 1, 1, std);
    add_activation(bd, c->model.activation);
    set_module(bd, "transformer.h.%d.mlp.c_proj", i);
    add_seq_linear(bd, "mlp_proj", C, 1, 1, proj_std);
    add_dropout(bd, c->model.dropout);
    st_layer *r2 = add_layer(bd, ST_OP_RESIDUAL, bd->cur);
    if (r2) r2->skip = r1_index;
  }

  begin_block(bd);
  if (bd->failed) return failure(bd);
  snprintf(bd->b->name, sizeof bd->b->name, "head");
  set_module(bd, "transformer.ln_f");
  add_seq_layernorm(bd, "ln_f");
  set_module(bd, "lm_head");
  st_layer *H;
  if (c->model.fused_loss) {
    /* the same weight (V, C), scored against the labels in vocabulary
     * chunks: no logits buffer (ST_OP_LINEAR_XENT) */
    H = add_layer(bd, ST_OP_LINEAR_XENT, (st_shape){2, T, 1});
    if (H) {
      name_layer(H, "lm_head");
      H->init_std = std;
      H->vocab = V;
      H->keep = head_keeps(c) ? st_linear_xent_keep(T, V) : 0;
      /* zb1p's weight half makes every chunk again (the input half took
       * the kept ones and ended them) */
      H->split = !strcmp(c->execution.mode, "pipeline") &&
                 !strcmp(c->execution.schedule, "zb1p");
      int64_t wd[2] = {V, C};
      H->w_tensor = add_tensor(bd, H, "weight", 2, wd);
    }
    bd->m->fused_loss = 1;
    bd->m->out_cols = 2;
  } else {
    H = add_seq_linear(bd, "lm_head", V, 0, 0, std);
    bd->m->out_cols = V;
  }
  if (H && c->model.tied) bd->b->tensors[H->w_tensor].tie = -2; /* below */
  bd->module[0] = '\0';
  return bd->failed ? failure(bd) : 0;
}

/* Per-layer saved state, in floats per sample, beside the output. */
static size_t save_floats(const st_layer *L) {
  switch (L->kind) {
  case ST_OP_MAXPOOL:
    return st_shape_numel(L->out); /* int32 argmax */
  case ST_OP_LAYERNORM:
    return 2 * (size_t)L->rows; /* mean, rstd */
  case ST_OP_EMBED:
    return (size_t)L->in.h; /* int32 tokens */
  case ST_OP_GROUPNORM:
    return 2 * (size_t)L->groups;
  case ST_OP_DROPOUT:
    return st_dropout_mask_words(st_shape_numel(L->out)); /* a bit each */
  case ST_OP_LINEAR_XENT:
    /* lse, int32 label; the forward's token (two a call: B >= 1) */
    return 2 * (size_t)L->rows + 2;
  default:
    return 0;
  }
}

/* Per-position cost times the positions (sequence layers); the parameters
 * are held once. */
static st_cost per_position(st_cost c, int rows) {
  c.flops_fwd *= rows;
  c.flops_bwd *= rows;
  c.act_bytes *= rows;
  return c;
}

/* Each op's cost comes from the kernel file that implements it. */
static st_cost layer_cost(const st_layer *L) {
  size_t n = st_shape_numel(L->out);
  int rows = L->rows;
  switch (L->kind) {
  case ST_OP_LINEAR:
    return per_position(
        st_linear_cost((int)(st_shape_numel(L->in) / rows), (int)(n / rows)),
        rows);
  case ST_OP_CONV2D:
    return st_conv2d_cost(L->in.c, L->in.h, L->in.w, L->out.c, L->k, L->stride,
                          L->pad);
  case ST_OP_MAXPOOL:
    return st_maxpool_cost(L->in.c, L->in.h, L->in.w, L->k, L->stride);
  case ST_OP_AVGPOOL:
    return st_avgpool_cost(L->in.c, L->in.h, L->in.w, L->k, L->stride);
  case ST_OP_LAYERNORM:
    return per_position(st_layernorm_cost((int)(n / rows)), rows);
  case ST_OP_GROUPNORM:
    return st_groupnorm_cost(L->in.c, L->in.h * L->in.w, L->groups);
  case ST_OP_DROPOUT:
    return st_dropout_cost(n);
  case ST_OP_GELU: /* erf/tanh: ~20 flops each way */
    /* a recomputed output is made again before the backward */
    return st_pointwise_cost(n, 20,
                             L->transient == ST_RECOMPUTED ? 30 + 20 : 30);
  case ST_OP_FLATTEN:
    return st_pointwise_cost(n, 0, 0); /* a copy */
  case ST_OP_RELU:
  case ST_OP_RESIDUAL:
    return st_pointwise_cost(n, 1, 1);
  case ST_OP_EMBED: {
    st_cost c = st_embedding_cost(L->out.h, L->out.c, L->vocab);
    if (L->b_tensor < 0) c.param_bytes -= 4.0 * L->out.h * L->out.c;
    return c;
  }
  case ST_OP_ATTENTION:
    return st_attention_cost(L->out.h, L->out.c, L->heads);
  case ST_OP_ROTARY:
    return st_rotary_cost(L->out.h, L->heads, L->rotary_dim);
  case ST_OP_LINEAR_XENT:
    return per_position(st_linear_xent_cost(rows,
                                            (int)(st_shape_numel(L->in) / rows),
                                            L->vocab, L->keep, L->split),
                        rows);
  }
  return st_pointwise_cost(n, 1, 1);
}

static void add_cost(st_cost *sum, st_cost c) {
  sum->flops_fwd += c.flops_fwd;
  sum->flops_bwd += c.flops_bwd;
  sum->param_bytes += c.param_bytes;
  sum->act_bytes += c.act_bytes;
}

/* Whether a layer's backward (block.c) reads its input, or its own output
 * (relu's mask); every other saved thing is in its save area. */
static int backward_reads_input(const st_layer *L) {
  return L->kind == ST_OP_LINEAR || L->kind == ST_OP_CONV2D ||
         L->kind == ST_OP_LINEAR_XENT || L->kind == ST_OP_ATTENTION ||
         L->kind == ST_OP_LAYERNORM || L->kind == ST_OP_GROUPNORM ||
         L->kind == ST_OP_GELU;
}

/* Which outputs a block keeps (st_layer.transient): the last layer's, a
 * residual's source, relu's, and any the next layer's backward reads; of
 * those, a gelu's is cheap to make again from its input (kept: gelu reads
 * it), as the recomputing schemes do (Chen et al. 2016), and bit for bit
 * the forward's. */
static void mark_transient(st_block *b, int half) {
  for (int l = 0; l < b->n_layers; l++) {
    st_layer *L = &b->layers[l];
    int source = 0;
    for (int k = l + 1; k < b->n_layers; k++)
      source |= b->layers[k].kind == ST_OP_RESIDUAL && b->layers[k].skip == l;
    L->transient = ST_KEPT;
    if (l == b->n_layers - 1 || source || L->kind == ST_OP_RELU) continue;
    st_op_kind next = b->layers[l + 1].kind;
    if (!backward_reads_input(&b->layers[l + 1]))
      L->transient = ST_TRANSIENT;
    else if (L->kind == ST_OP_GELU &&
             (l == 0 || b->layers[l - 1].transient == ST_KEPT))
      L->transient = ST_RECOMPUTED; /* from a kept input only */
    else if (half && L->rows > 1 &&
             (next == ST_OP_LINEAR || next == ST_OP_ATTENTION ||
              next == ST_OP_LINEAR_XENT))
      /* read in the backward by products alone (a sequence layer: never
       * the fused batch-1 update, which reads its input in fp32) */
      L->transient = ST_HALF;
  }
}

/* Lays out each block's activations and slab offsets; sums costs. A
 * transient output takes one of two slots past the layers' own scratch,
 * by the parity of its index (consecutive transient layers alternate),
 * each slot as large as its largest. */
static void finish(st_model *m, int half) {
  for (int i = 0; i < m->n_blocks; i++) {
    st_block *b = &m->blocks[i];
    size_t off = 0, slot[2] = {0, 0};
    b->max_numel = st_shape_numel(b->in);
    mark_transient(b, half);
    for (int l = 0; l < b->n_layers; l++) {
      st_layer *L = &b->layers[l];
      if (L->transient == ST_HALF) { /* a bf16 each, two to a float */
        L->half_off = off;
        off += (st_shape_numel(L->out) + 1) / 2;
      }
      if (L->transient) {
        if (st_shape_numel(L->out) > slot[l % 2])
          slot[l % 2] = st_shape_numel(L->out);
      } else {
        L->out_off = off;
        off += st_shape_numel(L->out);
      }
      L->save_per_sample = save_floats(L);
      L->save_off = off;
      off += L->save_per_sample;
      if (st_shape_numel(L->out) > b->max_numel)
        b->max_numel = st_shape_numel(L->out);
      size_t s = 0;
      if (L->kind == ST_OP_CONV2D)
        s = st_conv2d_scratch_floats(1, L->in.c, L->in.h, L->in.w, L->k,
                                     L->stride, L->pad);
      if (L->kind == ST_OP_ATTENTION)
        s = st_attention_scratch_floats(1, L->out.h, L->out.c, L->heads);
      if (L->kind == ST_OP_LINEAR_XENT)
        s = st_linear_xent_scratch_floats(L->rows, L->vocab, L->keep);
      if (L->kind == ST_OP_LAYERNORM) /* B samples' blocks <= B x one's */
        s = st_layernorm_scratch_floats(
            L->rows, (int)(st_shape_numel(L->in) / (size_t)L->rows));
      if (s > b->scratch_floats_per_sample) b->scratch_floats_per_sample = s;
      add_cost(&b->cost, layer_cost(L));
    }
    for (int l = 0; l < b->n_layers; l++)
      if (b->layers[l].transient)
        b->layers[l].out_off = b->scratch_floats_per_sample + (l % 2) * slot[0];
    b->scratch_floats_per_sample += slot[0] + slot[1];
    b->act_per_sample = off;
    b->out = b->layers[b->n_layers - 1].out;
    b->param_off = m->n_params;
    m->n_params += b->n_params;
    m->n_tensors += b->n_tensors;
    if (b->max_numel > m->max_numel) m->max_numel = b->max_numel;
    if (b->scratch_floats_per_sample > m->max_scratch_per_sample)
      m->max_scratch_per_sample = b->scratch_floats_per_sample;
  }
  /* A tied output head mirrors the token embedding (gpt). */
  int64_t wte = st_model_find(m, "transformer.wte.weight", NULL);
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++)
      if (m->blocks[i].tensors[t].tie == -2) {
        m->blocks[i].tensors[t].tie = wte;
        m->n_ties++;
      }
}

int st_model_create(st_model **out, const st_config *cfg, st_shape in,
                    st_error *err) {
  *out = NULL;
  st_model *m = calloc(1, sizeof *m);
  if (!m) return st_error_set(err, ST_ENOMEM, "out of memory");
  snprintf(m->kind, sizeof m->kind, "%s", cfg->model.kind);
  m->in = in;
  m->classes = m->out_cols = cfg->model.classes;
  m->label_rows = 1;
  builder bd = {.m = m, .cur = in, .cfg = cfg, .err = err};
  int rc;
  if (strcmp(cfg->model.kind, "mlp") == 0)
    rc = build_mlp(&bd);
  else if (strcmp(cfg->model.kind, "cnn") == 0)
    rc = build_cnn(&bd);
  else if (strcmp(cfg->model.kind, "gpt") == 0)
    rc = build_gpt(&bd);
  else
    rc = st_error_set(err, ST_ECONFIG, "%s: model.kind: unknown model '%s'",
                      st_config_where(cfg, "model.kind"), cfg->model.kind);
  if (rc) {
    st_model_destroy(m);
    return rc;
  }
  finish(m,
         !strcmp(cfg->train.precision, "bf16") && cfg->train.bf16_activations);
  *out = m;
  return 0;
}

void st_model_destroy(st_model *m) {
  if (!m) return;
  for (int i = 0; i < m->n_blocks; i++) {
    free(m->blocks[i].layers);
    free(m->blocks[i].tensors);
  }
  free(m->blocks);
  free(m);
}

const char *st_op_name(st_op_kind kind) {
  static const char *names[] = {[ST_OP_LINEAR] = "linear",
                                [ST_OP_RELU] = "relu",
                                [ST_OP_GELU] = "gelu",
                                [ST_OP_CONV2D] = "conv",
                                [ST_OP_MAXPOOL] = "maxpool",
                                [ST_OP_AVGPOOL] = "avgpool",
                                [ST_OP_FLATTEN] = "flatten",
                                [ST_OP_LAYERNORM] = "ln",
                                [ST_OP_GROUPNORM] = "gn",
                                [ST_OP_RESIDUAL] = "residual",
                                [ST_OP_DROPOUT] = "dropout",
                                [ST_OP_EMBED] = "embed",
                                [ST_OP_ATTENTION] = "attention",
                                [ST_OP_ROTARY] = "rotary",
                                [ST_OP_LINEAR_XENT] = "linear+xent"};
  return names[kind];
}

/* Tied copies in blocks [first, first + count) take their source's values. */
static void sync_ties(const st_model *m, float *params, int first, int count) {
  for (int i = first; m->n_ties && i < first + count; i++) {
    const st_block *b = &m->blocks[i];
    for (int t = 0; t < b->n_tensors; t++) {
      const st_tensor_info *ti = &b->tensors[t];
      if (ti->tie >= 0)
        memcpy(params + b->param_off + ti->offset, params + ti->tie,
               ti->numel * sizeof *params);
    }
  }
}

/* Fills n floats with N(0, std) from stream `index`. */
static void init_normal(float *w, size_t n, float std, uint64_t seed,
                        uint64_t index) {
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_INIT, index);
  for (size_t k = 0; k < n; k++) w[k] = std * st_rng_normal(&rng);
}

void st_model_init(const st_model *m, float *params, uint64_t seed) {
  st_model_init_blocks(m, params, seed, 0, m->n_blocks);
}

void st_model_init_blocks(const st_model *m, float *params, uint64_t seed,
                          int first, int count) {
  uint64_t index = 0; /* one RNG stream per (weight, bias) slot */
  for (int i = 0; i < first + count; i++) {
    const st_block *b = &m->blocks[i];
    for (int l = 0; l < b->n_layers; l++) {
      const st_layer *L = &b->layers[l];
      if (L->w_tensor < 0) continue;
      if (i < first) { /* an earlier block: only its streams are counted */
        index += 2;
        continue;
      }
      const st_tensor_info *w = &b->tensors[L->w_tensor];
      const st_tensor_info *bias =
          L->b_tensor >= 0 ? &b->tensors[L->b_tensor] : NULL;
      float *pw = params + b->param_off + w->offset;
      float *pb = bias ? params + b->param_off + bias->offset : NULL;
      if (L->kind == ST_OP_LAYERNORM || L->kind == ST_OP_GROUPNORM) {
        for (size_t k = 0; k < w->numel; k++) pw[k] = 1.0f, pb[k] = 0.0f;
        index += 2;
        continue;
      }
      if (w->tie >= 0) { /* filled from its source below */
        index += 2;
        continue;
      }
      if (L->init_std > 0) {
        /* GPT-2: normal weights; zero biases, except that the embedding's
         * second table (learned positions) is drawn like the first */
        init_normal(pw, w->numel, L->init_std, seed, index++);
        if (pb && L->kind == ST_OP_EMBED)
          init_normal(pb, bias->numel, L->init_std, seed, index);
        else if (pb)
          for (size_t k = 0; k < bias->numel; k++) pb[k] = 0.0f;
        index++;
        continue;
      }
      /* PyTorch's default for linear and conv: kaiming_uniform(a=sqrt(5))
       * gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same
       * bound. One RNG stream per tensor. */
      size_t fan_in = w->numel / (size_t)w->dims[0];
      float bound = 1.0f / sqrtf((float)fan_in);
      st_rng rng;
      st_rng_init(&rng, seed, ST_RNG_INIT, index++);
      for (size_t k = 0; k < w->numel; k++)
        pw[k] = (2.0f * st_rng_uniform(&rng) - 1.0f) * bound;
      st_rng_init(&rng, seed, ST_RNG_INIT, index++);
      for (size_t k = 0; pb && k < bias->numel; k++)
        pb[k] = (2.0f * st_rng_uniform(&rng) - 1.0f) * bound;
    }
  }
  /* tied copies in these blocks take their source's values */
  sync_ties(m, params, first, count);
}

size_t st_model_unique_params(const st_model *m) {
  size_t n = m->n_params;
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++)
      if (m->blocks[i].tensors[t].tie >= 0) n -= m->blocks[i].tensors[t].numel;
  return n;
}

void st_model_sync_ties(const st_model *m, float *params) {
  sync_ties(m, params, 0, m->n_blocks);
}

void st_model_sync_ties_blocks(const st_model *m, float *params, int first,
                               int count) {
  sync_ties(m, params, first, count);
}

int64_t st_model_find(const st_model *m, const char *name,
                      const st_tensor_info **info) {
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++)
      if (strcmp(m->blocks[i].tensors[t].name, name) == 0) {
        if (info) *info = &m->blocks[i].tensors[t];
        return (int64_t)(m->blocks[i].param_off +
                         m->blocks[i].tensors[t].offset);
      }
  return -1;
}

static void shape_text(char *buf, size_t cap, st_shape s) {
  if (s.h == 1 && s.w == 1)
    snprintf(buf, cap, "%d", s.c);
  else
    snprintf(buf, cap, "%dx%dx%d", s.c, s.h, s.w);
}

void st_model_print(const st_model *m, const double *run, FILE *f) {
  double flops = 0;
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    char in[32], out[32];
    shape_text(in, sizeof in, b->in);
    shape_text(out, sizeof out, b->out);
    double fl = run ? run[i] : b->cost.flops_fwd + b->cost.flops_bwd;
    fprintf(f,
            "  %-10s %10s -> %-10s params %9zu  fwd+bwd %8.2f MFLOP/sample  [",
            b->name, in, out, b->n_params, fl / 1e6);
    for (int l = 0; l < b->n_layers; l++)
      fprintf(f, "%s%s", l ? " " : "", st_op_name(b->layers[l].kind));
    fprintf(f, "]\n");
    flops += fl;
  }
  fprintf(f,
          "  %s: %d blocks, %zu parameters (%.2f MB), %.2f MFLOP/sample "
          "forward+backward\n",
          m->kind, m->n_blocks, m->n_params, 4.0 * m->n_params / 1e6,
          flops / 1e6);
}

void st_model_loss(const st_model *m, st_pool *pool, float *losses,
                   float *probs, const float *out, const int *labels,
                   int rows) {
  if (!m->fused_loss) {
    st_xent_forward_pool(pool, losses, probs, out, labels, rows, m->classes);
    return;
  }
  for (int r = 0; r < rows; r++) losses[r] = out[2 * (size_t)r];
}

void st_model_loss_grad(const st_model *m, st_pool *pool, float *dout,
                        const float *probs, const int *labels, int rows,
                        float scale) {
  if (!m->fused_loss) {
    st_xent_backward_pool(pool, dout, probs, labels, rows, m->classes, scale);
    return;
  }
  /* d(scale x loss)/d(row's loss), nothing for the hit */
  for (int r = 0; r < rows; r++) {
    dout[2 * (size_t)r] = scale;
    dout[2 * (size_t)r + 1] = 0.0f;
  }
}

int st_model_hit(const st_model *m, const float *out, const int *labels,
                 size_t i) {
  if (m->fused_loss) return out[2 * i + 1] != 0.0f;
  const float *z = out + i * (size_t)m->classes;
  int best = 0;
  for (int c = 1; c < m->classes; c++)
    if (z[c] > z[best]) best = c;
  return best == labels[i];
}
