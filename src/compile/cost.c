/*
 * cost.c — pass 1 (cost) and `compile --validate-only`.
 *
 * The cost of a block comes from the model's descriptors alone: FLOPs per
 * sample from each op's cost function (the closed forms beside the kernels
 * in src/ops/), bytes from the shapes and the activation layout the model
 * builder planned. Nothing here allocates parameter or activation memory:
 * st_model_create builds descriptors only, so a model far larger than RAM
 * can be validated and compiled.
 */
#include "compile.h"

#include <stdlib.h>
#include <string.h>

/* Per-sample input of the configured dataset, known without loading it:
 * Fashion-MNIST and the synthetic set are both 1 x 28 x 28 (data/). */
static st_shape input_shape(const st_config *cfg) {
  if (strcmp(cfg->model.kind, "gpt") == 0) /* the builder sets its own */
    return (st_shape){1, cfg->model.context, 1};
  return (st_shape){1, 28, 28};
}

static int is_pb(const st_config *cfg) {
  return strcmp(cfg->execution.mode, "pipelined_backprop") == 0;
}

int st_plan_micro_batch(const st_config *cfg) {
  /* replicas (replicas.c) each run their share of the batch, in
   * micro-batches of at most that share */
  int R = cfg->execution.replicas > 1 ? cfg->execution.replicas : 1;
  int share = cfg->train.batch / R > 0 ? cfg->train.batch / R : 1;
  int mb = cfg->execution.micro_batch > 0 ? cfg->execution.micro_batch
           : is_pb(cfg)                   ? 1 /* the trainer's default */
                                          : share;
  return mb < share ? mb : share;
}

/* What the costs of a block depend on besides its layers. */
typedef struct cost_ctx {
  int batch;    /* samples per GEMM call: the micro-batch, which decides
                   the GEMMs' shape class (st_plan_micro_batch) */
  int fused;    /* linear weights are updated inside the backward
                   (st_plan_fuses_update; per layer, fuses) */
  double slots; /* optimizer state floats per parameter */
} cost_ctx;

/* compile.h */
int st_plan_predicts(const st_config *cfg) {
  const char *m = cfg->execution.mitigation;
  return is_pb(cfg) && (!strcmp(m, "lwp") || !strcmp(m, "sc+lwp"));
}

int st_plan_fuses_update(const st_config *cfg) {
  if (!cfg->execution.fused_update) return 0;
  if (is_pb(cfg))
    return st_plan_micro_batch(cfg) == 1 &&
           strcmp(cfg->optimizer.kind, "adamw") != 0 &&
           strcmp(cfg->execution.mitigation, "stash") != 0 &&
           strcmp(cfg->execution.mitigation, "pipemare") != 0;
  return cfg->train.batch == 1 && cfg->execution.replicas <= 1 &&
         strcmp(cfg->execution.mode, "weight_streaming") != 0;
}

/* A linear layer whose update rides in its backward (st_layer_fuses_update
 * at one sample, its weights not a tied copy). */
static int fuses(const cost_ctx *x, const st_block *b, const st_layer *L) {
  return x->fused && L->kind == ST_OP_LINEAR && L->rows == 1 && !L->wt &&
         L->w_tensor >= 0 && b->tensors[L->w_tensor].tie < 0;
}

/* A layer's weights (w bytes) for the spill and narrow terms, read by
 * `gemms` products a step at M rows. */
static void linear_weights(st_block_cost *c, double w, double gemms, double M) {
  int at =
      c->n_linear < ST_BLOCK_LINEARS ? c->n_linear++ : ST_BLOCK_LINEARS - 1;
  if (c->linear_bytes[at] > 0) {
    /* folded (no shipped model has more than 4 linear layers a block):
     * exact for the spill traffic; the narrow term sees one layer of the
     * summed weights at the narrowest call's rows */
    c->linear_gemms[at] =
        (c->linear_gemms[at] * c->linear_bytes[at] + gemms * w) /
        (c->linear_bytes[at] + w);
    c->linear_rows[at] = M < c->linear_rows[at] ? M : c->linear_rows[at];
  } else {
    c->linear_gemms[at] = gemms;
    c->linear_rows[at] = M;
  }
  c->linear_bytes[at] += w;
}

/* Splits one layer's work for the calibrated model: linear layers are
 * GEMM FLOPs of their shape class, conv2d and attention FLOPs of their own
 * kernels (im2col and col2im, softmax ride with them) by the class of
 * their GEMMs; the other ops are bytes moved (fp32 reads and writes of the
 * kernels in src/ops/ and src/model/block.c, counted per sample). Bias
 * adds ride with their GEMM. */
static void split_layer(st_block_cost *c, const st_block *b, const st_layer *L,
                        const cost_ctx *x) {
  double n_in = (double)st_shape_numel(L->in),
         n = (double)st_shape_numel(L->out);
  int batch = x->batch;
  /* on a mesh the layers whose weights or work spread over a region move
   * their input in along one edge and their output (partial sums) across
   * it (st_block_cost.region_*); an embedding's input is its ids. The
   * fused head's output is a loss a position, but what crosses its region
   * is its product's partial sums, T x V logits, as an unfused head's */
  if (L->kind == ST_OP_LINEAR || L->kind == ST_OP_CONV2D ||
      L->kind == ST_OP_LINEAR_XENT || L->kind == ST_OP_ATTENTION ||
      L->kind == ST_OP_EMBED) {
    c->region_in += 4 * n_in;
    c->region_out +=
        L->kind == ST_OP_LINEAR_XENT ? 4.0 * L->rows * L->vocab : 4 * n;
    c->region_layers += 1;
  }
  switch (L->kind) {
  case ST_OP_LINEAR: {
    /* a sequence layer is one GEMM over batch x positions rows */
    double rows = L->rows;
    st_cost k = st_linear_cost((int)(n_in / rows), (int)(n / rows));
    /* a narrow call (2 .. 63 rows) is classed by its weights at the
     * calibration's rows: it runs at that rate plus the narrow memory term
     * (partition.c); one row is a matrix-vector product, classed as is and
     * timed by the bytes it streams where the profile has the bandwidth */
    double M = batch * rows;
    double Mc = M >= 2 && M < ST_GEMM_REF_ROWS ? ST_GEMM_REF_ROWS : M;
    int cls = st_gemm_class(Mc, n / rows, n_in / rows);
    double w = 4.0 * (n_in / rows) * (n / rows);
    if (M == 1) {
      c->row_gemm_fwd[cls] += k.flops_fwd;
      c->row_gemm_bwd[cls] += k.flops_bwd;
      c->row_bytes_fwd += w;
      /* the input gradient reads the weights; the weight gradient reads and
       * writes its slab, or the fused update the weights and their state */
      double bwd = w + (fuses(x, b, L) ? w * (2 + 2 * x->slots) : 2 * w);
      c->row_bytes_bwd += bwd;
      if (fuses(x, b, L)) c->row_fused_fwd += w, c->row_fused_bwd += bwd;
    } else {
      c->gemm_fwd[cls] += k.flops_fwd * rows;
      c->gemm_bwd[cls] += k.flops_bwd * rows;
    }
    linear_weights(c, w, 3, M);
    break;
  }
  case ST_OP_LINEAR_XENT: {
    /* the fused head: its forward product, then in the backward the same
     * product again (but for the chunks the forward kept), dW and dx, all
     * by vocabulary chunks over every row */
    double rows = L->rows, D = n_in / rows, V = L->vocab;
    st_cost k = st_linear_xent_cost(L->rows, (int)D, (int)V, L->keep, L->split);
    double M = batch * rows;
    double Mc = M >= 2 && M < ST_GEMM_REF_ROWS ? ST_GEMM_REF_ROWS : M;
    int cls = st_gemm_class(Mc, st_linear_xent_chunk(L->rows, (int)V), D);
    c->gemm_fwd[cls] += k.flops_fwd * rows;
    c->gemm_bwd[cls] += k.flops_bwd * rows;
    linear_weights(c, 4.0 * D * V,
                   3 + st_linear_xent_again(L->rows, (int)V, L->keep, L->split),
                   M);
    break;
  }
  case ST_OP_ATTENTION: {
    /* per (sample, head): row blocks of 32 against up to T keys, K = the
     * head size (attention.c) */
    st_cost k = st_attention_cost(L->out.h, L->out.c, L->heads);
    double T = L->out.h, hs = (double)L->out.c / L->heads;
    int cls = st_gemm_class(T < 32 ? T : 32, T, hs);
    c->attn_fwd[cls] += k.flops_fwd;
    c->attn_bwd[cls] += k.flops_bwd;
    break;
  }
  case ST_OP_EMBED:
    c->bytes_fwd[0] += 4 * 3 * n; /* two table rows in, one out */
    c->bytes_bwd[0] += 4 * 5 * n; /* two read-add-writes, dy */
    break;
  case ST_OP_ROTARY:
    c->bytes_fwd[0] += 4 * 2 * n; /* copy and rotate */
    c->bytes_bwd[0] += 4 * 2 * n;
    break;
  case ST_OP_CONV2D: {
    st_cost k = st_conv2d_cost(L->in.c, L->in.h, L->in.w, L->out.c, L->k,
                               L->stride, L->pad);
    /* per sample: (OC) x (OH OW) x (IC K K), one GEMM per sample */
    int cls = st_gemm_class(L->out.c, (double)L->out.h * L->out.w,
                            (double)L->in.c * L->k * L->k);
    c->conv_fwd[cls] += k.flops_fwd;
    c->conv_bwd[cls] += k.flops_bwd;
    break;
  }
  case ST_OP_RELU:
    /* read x, write y; nothing after a linear layer that stores it */
    if (L == b->layers || !st_layer_fuses_relu(b, (int)(L - b->layers) - 1))
      c->bytes_fwd[0] += 4 * (n_in + n);
    c->bytes_bwd[0] += 4 * 3 * n; /* read dy, y, write dx */
    break;
  case ST_OP_GELU:
    c->bytes_fwd[4] += 4 * (n_in + n); /* read x, write y */
    c->bytes_bwd[4] += 4 * 3 * n;      /* read dy, x, write dx */
    if (L->transient == ST_RECOMPUTED) /* y made again (block.c) */
      c->bytes_bwd[4] += 4 * (n_in + n);
    break;
  case ST_OP_DROPOUT: {
    /* the mask is a bit an element (st_dropout_mask_words), written
     * forward beside y, read backward beside dy */
    double mask = 4.0 * (double)st_dropout_mask_words((size_t)n);
    c->bytes_fwd[0] += 4 * (n_in + n) + mask;
    c->bytes_bwd[0] += 4 * 2 * n + mask;
    break;
  }
  case ST_OP_RESIDUAL:
    c->bytes_fwd[0] += 4 * 3 * n; /* y = x + block input */
    c->bytes_bwd[0] += 4 * 4 * n; /* copy to dx and to the skip */
    break;
  case ST_OP_FLATTEN:
    c->bytes_fwd[0] += 4 * 2 * n; /* a memcpy each way */
    c->bytes_bwd[0] += 4 * 2 * n;
    break;
  case ST_OP_LAYERNORM:
  case ST_OP_GROUPNORM:
    c->bytes_fwd[1] += 4 * 3 * n; /* stats pass, normalise pass */
    c->bytes_bwd[1] += 4 * 5 * n; /* two passes over dy and x */
    break;
  case ST_OP_MAXPOOL:
    c->bytes_fwd[2] += 4 * (n_in + 2 * n); /* and the argmax index */
    c->bytes_bwd[2] += 4 * (n_in + 2 * n); /* clear dx, scatter dy */
    break;
  case ST_OP_AVGPOOL:
    c->bytes_fwd[2] += 4 * (n_in + n);
    c->bytes_bwd[2] += 4 * (n_in + n);
    break;
  }
}

/* FLOPs of one update of one parameter by cfg's rule (src/optim/optim.c):
 * SGD's w - lr d, with weight decay's d + wd w, momentum's v = mu v + d
 * and Nesterov's d + mu v; AdamW's decay, two moments, the square root,
 * the bias correction, eps and the step. */
static double update_flops(const st_config *cfg) {
  if (!strcmp(cfg->optimizer.kind, "adamw")) return 14;
  double f = 2;
  if (cfg->optimizer.weight_decay != 0) f += 2;
  if (cfg->optimizer.momentum != 0) f += cfg->optimizer.nesterov ? 4 : 2;
  return f;
}

/* The model's first block computes no gradient for the model's input
 * (st_block_backward without a din): layers below its first weighted layer
 * run no backward, and that layer (linear, conv2d) skips its input-gradient
 * GEMM, which has the forward GEMM's FLOPs. Stage 0 is that much cheaper
 * than its blocks' full backward. */
static void skip_input_gradient(st_block_cost *c, const st_block *b,
                                const cost_ctx *x) {
  int first = 0;
  while (first < b->n_layers && b->layers[first].w_tensor < 0) first++;
  for (int l = 0; l <= first && l < b->n_layers; l++) {
    const st_layer *L = &b->layers[l];
    st_block_cost one;
    memset(&one, 0, sizeof one);
    split_layer(&one, b, L, x);
    double n_out = (double)st_shape_numel(L->out);
    int gemm = L->kind == ST_OP_LINEAR || L->kind == ST_OP_CONV2D;
    if (l == first && !gemm) break; /* it needs somewhere to write: runs */
    if (l == first && L->kind == ST_OP_LINEAR && c->n_linear > 0)
      c->linear_gemms[0] = 2; /* the block's first linear layer is this one */
    for (int k = 0; k < ST_GEMM_CLASSES; k++) {
      /* below `first` nothing runs; at it, the skipped input-gradient
       * GEMM has the forward's products but not its bias term (one FLOP
       * per output): the weight and bias gradients still run */
      double drop = l < first             ? one.gemm_bwd[k]
                    : one.gemm_fwd[k] > 0 ? one.gemm_fwd[k] - n_out
                                          : 0;
      double conv = l < first             ? one.conv_bwd[k]
                    : one.conv_fwd[k] > 0 ? one.conv_fwd[k] - n_out
                                          : 0;
      double attn = l < first ? one.attn_bwd[k] : 0;
      double row = l < first                 ? one.row_gemm_bwd[k]
                   : one.row_gemm_fwd[k] > 0 ? one.row_gemm_fwd[k] - n_out
                                             : 0;
      c->gemm_bwd[k] -= drop;
      c->conv_bwd[k] -= conv;
      c->attn_bwd[k] -= attn;
      c->row_gemm_bwd[k] -= row;
      c->flops_bwd -= drop + conv + attn + row;
    }
    /* at one row: the skipped product's read of the weights */
    c->row_bytes_bwd -= l < first ? one.row_bytes_bwd : one.row_bytes_fwd;
    c->row_fused_bwd -= l < first ? one.row_fused_bwd : one.row_fused_fwd;
    if (l < first)
      for (int k = 0; k < ST_OP_CLASSES; k++)
        c->bytes_bwd[k] -= one.bytes_bwd[k];
  }
}

void st_plan_costs(st_block_cost *out, const st_model *m,
                   const st_config *cfg) {
  double slots = st_optim_state_per_param(cfg);
  int batch = st_plan_micro_batch(cfg);
  cost_ctx x = {batch, st_plan_fuses_update(cfg), slots};
  /* updates per sample: one a batch, or one a micro-batch in pipelined
   * backprop */
  double updates = 1.0 / (is_pb(cfg) ? batch : cfg->train.batch);
  int lwp = st_plan_predicts(cfg);
  int zb1p = !strcmp(cfg->execution.mode, "pipeline") &&
             !strcmp(cfg->execution.schedule, "zb1p");
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    st_block_cost *c = &out[i];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", b->name);
    c->flops_fwd = b->cost.flops_fwd;
    c->flops_bwd = b->cost.flops_bwd;
    c->param_bytes = 4.0 * (double)b->n_params;
    c->state_bytes = 4.0 * (double)b->n_params * (1.0 + slots); /* grad + */
    for (int t = 0; t < b->n_tensors; t++)
      if (b->tensors[t].tie >= 0)
        c->tied_bytes += 4.0 * (double)b->tensors[t].numel;
    c->act_bytes = 4.0 * (double)b->act_per_sample;
    /* zb1p's B keeps each weighted layer's output gradient until its W,
     * a buffer per micro-batch in flight (pipeline.c's
     * st_stage_enable_split): held as the activations are */
    if (zb1p) c->act_bytes += 4.0 * (double)st_block_dys_floats(b);
    c->in_bytes = 4.0 * (double)st_shape_numel(b->in);
    c->out_bytes = 4.0 * (double)st_shape_numel(b->out);
    c->work_numel_bytes = 4.0 * (double)b->max_numel;
    c->work_scratch_bytes = 4.0 * (double)b->scratch_floats_per_sample;
    double fused = 0; /* parameters updated inside the backward */
    for (int l = 0; l < b->n_layers; l++) {
      const st_layer *L = &b->layers[l];
      split_layer(c, b, L, &x);
      if (fuses(&x, b, L))
        fused += (double)st_shape_numel(L->in) * st_shape_numel(L->out) +
                 (L->b_tensor >= 0 ? (double)st_shape_numel(L->out) : 0);
    }
    c->call_samples = batch;
    /* weights and gradients, and the activations and inputs of one
     * micro-batch's forward beside another's backward (one batch's when
     * the batch is not split) */
    c->ws_bytes = 2 * c->param_bytes + (batch < cfg->train.batch ? 2 : 1) *
                                           batch * (c->act_bytes + c->in_bytes);
    /* beside them the update reads and writes the optimizer state; a
     * fused layer's stands where its gradient would (ws_bytes) */
    c->state_touched = 4.0 * ((double)b->n_params - fused) * slots;
    if (strcmp(cfg->execution.mode, "weight_streaming") != 0)
      c->flops_update = ((double)b->n_params - c->tied_bytes / 4) *
                        update_flops(cfg) * updates;
    if (i == 0) skip_input_gradient(c, b, &x);
    /* the optimizer step: read weights, gradients and state, write weights
     * and state, clear the gradients; a fused update's weights are in
     * row_bytes_bwd (its biases, one per output, are left out) */
    c->bytes_bwd[3] +=
        4.0 * ((double)b->n_params - fused) * (4.0 + 2.0 * slots) * updates;
    /* linear weight prediction at a stage with D > 0 (the partitioner
     * charges it to every stage but the last): folded into a fused
     * update, a write of the prediction an update, and a pass (read w
     * and v, write the prediction) at a step's first forward; else that
     * pass before every forward */
    if (lwp)
      c->lwp_bytes = 4.0 * (double)b->n_params *
                     (x.fused ? updates + 3.0 / cfg->train.batch : 3.0 / batch);
  }
  /* softmax cross-entropy on the last block's output (every position),
   * and the labels it reads: one 4-byte class a position */
  if (m->n_blocks > 0) {
    double C = (double)st_shape_numel(m->blocks[m->n_blocks - 1].out);
    out[m->n_blocks - 1].bytes_fwd[0] += 4 * 3 * C;
    out[m->n_blocks - 1].bytes_bwd[0] += 4 * 2 * C;
    out[m->n_blocks - 1].label_bytes =
        4.0 * (m->label_rows > 0 ? m->label_rows : 1);
  }
}

int st_gemm_class(double M, double N, double K) {
  double v = M * N * K;
  return v < 262144.0 ? 0 : v < 2097152.0 ? 1 : v < 16777216.0 ? 2 : 3;
}

const char *st_gemm_class_name(int cls) {
  static const char *names[ST_GEMM_CLASSES] = {"tiny", "small", "medium",
                                               "large"};
  return cls >= 0 && cls < ST_GEMM_CLASSES ? names[cls] : "?";
}

const char *st_op_class_name(int cls) {
  static const char *names[ST_OP_CLASSES] = {"pointwise", "norm", "pool",
                                             "optimizer", "gelu"};
  return cls >= 0 && cls < ST_OP_CLASSES ? names[cls] : "?";
}

int st_plan_model(st_model **out, const st_config *cfg, st_error *err) {
  if (strcmp(cfg->model.kind, "gpt") == 0 && cfg->model.vocab == 0) {
    /* the vocabulary comes from the tokenizer (its file's header) */
    st_config resolved = *cfg;
    int rc = st_text_vocab(cfg, &resolved.model.vocab, err);
    return rc ? rc : st_model_create(out, &resolved, input_shape(cfg), err);
  }
  return st_model_create(out, cfg, input_shape(cfg), err);
}

int st_plan_prepare(st_fabric *fabric, st_model **m, const st_config *cfg,
                    st_error *err) {
  *m = NULL;
  int rc = st_fabric_resolve(fabric, cfg, err);
  return rc ? rc : st_plan_model(m, cfg, err);
}

int st_plan_run_flops(const st_model *m, const st_config *cfg, double *flops,
                      double *fwd, double *bwd) {
  st_block_cost *costs = malloc((size_t)m->n_blocks * sizeof *costs);
  if (!costs) return ST_ENOMEM;
  st_plan_costs(costs, m, cfg);
  double f = 0, b = 0;
  for (int i = 0; i < m->n_blocks; i++) {
    f += costs[i].flops_fwd;
    b += costs[i].flops_bwd;
    flops[i] = costs[i].flops_fwd + costs[i].flops_bwd;
  }
  free(costs);
  if (fwd) *fwd = f;
  if (bwd) *bwd = b;
  return 0;
}

int st_plan_validate(const st_config *cfg, FILE *f, st_error *err) {
  st_fabric fabric;
  st_model *m;
  int rc = st_plan_prepare(&fabric, &m, cfg, err);
  if (rc) return rc;
  /* the FLOPs as they run, as the plan counts them */
  double fwd = 0, bwd = 0, acts = 0;
  double *flops = malloc((size_t)m->n_blocks * sizeof *flops);
  if (!flops || st_plan_run_flops(m, cfg, flops, &fwd, &bwd)) {
    free(flops);
    st_model_destroy(m);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  for (int i = 0; i < m->n_blocks; i++)
    acts += 4.0 * (double)m->blocks[i].act_per_sample;
  acts += 4.0 * (double)st_shape_numel(m->in);
  int slots = st_optim_state_per_param(cfg);
  double weights = 4.0 * (double)m->n_params;
  char a[32], b[32], c[32], d[32];
  fprintf(f, "config %s: valid\n", cfg->path[0] ? cfg->path : "(defaults)");
  if (!strcmp(m->kind, "gpt"))
    fprintf(f, "model: %s, %d blocks, %d tokens per sequence, vocabulary %d\n",
            m->kind, m->n_blocks, m->in.h, m->classes);
  else
    fprintf(f, "model: %s, %d blocks, input %dx%dx%d, %d classes\n", m->kind,
            m->n_blocks, m->in.c, m->in.h, m->in.w, m->classes);
  st_model_print(m, flops, f);
  free(flops);
  size_t unique = st_model_unique_params(m);
  fprintf(f, "parameters: %s (%zu; %s as fp32)",
          st_plan_fmt_count(a, sizeof a, (double)unique), unique,
          st_plan_fmt_bytes(b, sizeof b, 4.0 * (double)unique));
  if (unique != m->n_params)
    fprintf(f, "; the tied output head's copy adds %s",
            st_plan_fmt_count(c, sizeof c, (double)(m->n_params - unique)));
  fputc('\n', f);
  fprintf(f,
          "FLOPs per sample: forward %.4g M, backward %.4g M, total "
          "%.4g M\n",
          fwd / 1e6, bwd / 1e6, (fwd + bwd) / 1e6);
  fprintf(f,
          "memory: weights %s; gradients %s; optimizer state %s (%s, %d "
          "slot%s per parameter)\n",
          st_plan_fmt_bytes(a, sizeof a, weights),
          st_plan_fmt_bytes(b, sizeof b, weights),
          st_plan_fmt_bytes(c, sizeof c, weights * slots), cfg->optimizer.kind,
          slots, slots == 1 ? "" : "s");
  fprintf(f,
          "        activations %s per sample (input, outputs and saved "
          "state), %s at batch %d\n",
          st_plan_fmt_bytes(a, sizeof a, acts),
          st_plan_fmt_bytes(d, sizeof d, acts * cfg->train.batch),
          cfg->train.batch);
  fprintf(f, "fabric: %s, %lld %s (not compiled: --validate-only)\n",
          fabric.name, (long long)fabric.pes,
          fabric.kind == ST_FABRIC_CPU ? "cores" : "PEs");
  fprintf(f, "no model memory allocated: descriptors only\n");
  st_model_destroy(m);
  return 0;
}
