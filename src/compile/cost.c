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

#include <string.h>

/* Per-sample input of the configured dataset, known without loading it:
 * Fashion-MNIST and the synthetic set are both 1 x 28 x 28 (data/). */
static st_shape input_shape(const st_config *cfg) {
  (void)cfg;
  return (st_shape){1, 28, 28};
}

void st_plan_costs(st_block_cost *out, const st_model *m,
                   const st_config *cfg) {
  double slots = st_optim_state_per_param(cfg);
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    st_block_cost *c = &out[i];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", b->name);
    c->flops_fwd = b->cost.flops_fwd;
    c->flops_bwd = b->cost.flops_bwd;
    c->param_bytes = 4.0 * (double)b->n_params;
    c->state_bytes = 4.0 * (double)b->n_params * (1.0 + slots); /* grad + */
    c->act_bytes = 4.0 * (double)b->act_per_sample;
    c->in_bytes = 4.0 * (double)st_shape_numel(b->in);
    c->out_bytes = 4.0 * (double)st_shape_numel(b->out);
  }
}

int st_plan_model(st_model **out, const st_config *cfg, st_error *err) {
  return st_model_create(out, cfg, input_shape(cfg), err);
}

int st_plan_validate(const st_config *cfg, FILE *f, st_error *err) {
  st_fabric fabric;
  int rc = st_fabric_resolve(&fabric, cfg, err);
  if (rc)
    return rc;
  st_model *m;
  if ((rc = st_plan_model(&m, cfg, err)))
    return rc;
  double fwd = 0, bwd = 0, acts = 0;
  for (int i = 0; i < m->n_blocks; i++) {
    fwd += m->blocks[i].cost.flops_fwd;
    bwd += m->blocks[i].cost.flops_bwd;
    acts += 4.0 * (double)m->blocks[i].act_per_sample;
  }
  acts += 4.0 * (double)st_shape_numel(m->in);
  int slots = st_optim_state_per_param(cfg);
  double weights = 4.0 * (double)m->n_params;
  char a[32], b[32], c[32], d[32];
  fprintf(f, "config %s: valid\n", cfg->path[0] ? cfg->path : "(defaults)");
  fprintf(f, "model: %s, %d blocks, input %dx%dx%d, %d classes\n", m->kind,
          m->n_blocks, m->in.c, m->in.h, m->in.w, m->classes);
  st_model_print(m, f);
  fprintf(f, "parameters: %s (%s as fp32)\n",
          st_plan_fmt_count(a, sizeof a, (double)m->n_params),
          st_plan_fmt_bytes(b, sizeof b, weights));
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
