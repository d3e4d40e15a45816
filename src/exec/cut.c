/*
 * cut.c — where the pipelined modes cut the model into stages: the
 * compiler's plan for this machine's cores (st_plan_build on a cpu fabric
 * of that many cores, whatever fabric the config plans for otherwise: a
 * mesh is a what-if, a run runs here), a pinned cut (execution.stage_blocks),
 * or, where no plan can be made, the FLOP balance; and block_sequential's
 * segments. The blocks' costs come from st_plan_block_costs (measured or
 * modelled, execution.block_costs).
 */
#include "exec.h"

#include "../compile/compile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FLOP-balanced contiguous split into S runs, one core each (the fallback
 * when the compiler finds no plan): a small dynamic program minimising the
 * largest run's forward + backward FLOPs (measured blocks: seconds). */
static void balance(const st_block_cost *c, int n, int S, int *first,
                    int *count) {
  double *pre = calloc((size_t)n + 1, sizeof *pre);
  double *best = malloc((size_t)(S + 1) * (n + 1) * sizeof *best);
  int *from = malloc((size_t)(S + 1) * (n + 1) * sizeof *from);
  if (!pre || !best || !from) { /* an even split by count */
    for (int s = 0; s < S; s++) first[s] = s * n / S;
    goto done;
  }
  for (int i = 0; i < n; i++)
    pre[i + 1] = pre[i] + (c[i].measured_fwd + c[i].measured_bwd > 0
                               ? c[i].measured_fwd + c[i].measured_bwd
                               : c[i].flops_fwd + c[i].flops_bwd);
#define AT(s, i) ((size_t)(s) * (n + 1) + (i))
  for (int s = 0; s <= S; s++)
    for (int i = 0; i <= n; i++) best[AT(s, i)] = -1;
  best[AT(0, 0)] = 0;
  for (int s = 1; s <= S; s++)
    for (int i = s; i <= n; i++)
      for (int j = s - 1; j < i; j++) {
        if (best[AT(s - 1, j)] < 0) continue;
        double load = pre[i] - pre[j], worst = best[AT(s - 1, j)];
        if (load > worst) worst = load;
        if (best[AT(s, i)] < 0 || worst < best[AT(s, i)]) {
          best[AT(s, i)] = worst;
          from[AT(s, i)] = j;
        }
      }
  for (int s = S, i = n; s > 0; s--) {
    i = from[AT(s, i)];
    first[s - 1] = i;
  }
#undef AT
done:
  for (int s = 0; s < S; s++)
    count[s] = (s + 1 < S ? first[s + 1] : n) - first[s];
  free(pre);
  free(best);
  free(from);
}

/* Splits blocks [0, n) of c into stages on `cores` cores as the compiler
 * plans it on fab (S = 0: the plan's choice, by the fill and drain of
 * mode's schedule as `strata compile` chooses; mode NULL: by the steady
 * state): first/count/pes per stage; returns the stage count. `shared`:
 * more stages than cores, one thread each. A model the planner cannot
 * place (or no fab) falls back to the FLOP balance with the cores shared
 * evenly. */
int st_cut_split(const st_block_cost *c, int n, const st_fabric *fab, int S,
                 int cores, int shared, const st_int_list *pin,
                 const st_config *mode, int *first, int *count, int *pes) {
  st_plan_options opt = {.samples_in_flight = 1,
                         .weight_versions = 1,
                         .algorithm = ST_PARTITION_AUTO};
  if (mode) opt = st_plan_mode_options(mode);
  opt.stages = S;
  if (pin && pin->n > 0) { /* execution.stage_blocks */
    opt.stage_blocks = pin->v;
    opt.n_stage_blocks = pin->n;
  }
  st_plan *plan = NULL;
  st_error err = {0};
  if (fab && st_plan_build(&plan, c, n, fab, &opt, &err) == 0) {
    int k = plan->n_stages;
    for (int s = 0; s < k; s++) {
      first[s] = plan->stages[s].first;
      count[s] = plan->stages[s].count;
      pes[s] = (int)plan->stages[s].pes;
      if (shared || pes[s] < 1) pes[s] = 1;
    }
    st_plan_destroy(plan);
    return k;
  }
  if (S == 0) S = cores < n ? cores : n;
  if (pin && pin->n == S) /* validated against n by the caller */
    for (int s = 0, at = 0; s < S; at += pin->v[s++])
      first[s] = at, count[s] = pin->v[s];
  else
    balance(c, n, S, first, count);
  for (int s = 0; s < S; s++)
    pes[s] = shared || S > cores ? 1 : cores / S + (s < cores % S);
  return S;
}

/* The cpu fabric of `cores` cores (S of them when there are more stages)
 * in *fab, or NULL when it cannot be resolved (an unreadable calibration
 * profile). cpu: scratch space for the config it is resolved from. */
st_fabric *st_cut_fabric(st_fabric *fab, st_config *cpu, const st_config *cfg,
                         int S, int cores) {
  st_error no_plan = {0};
  char spec[32];
  *cpu = *cfg;
  snprintf(spec, sizeof spec, "cpu:%d", S > cores ? S : cores);
  if (st_fabric_parse(cpu, spec, &no_plan) ||
      st_fabric_resolve(fab, cpu, &no_plan))
    return NULL;
  return fab;
}

int st_pipeline_check_pin(const st_config *cfg, int n, st_error *err) {
  const st_int_list *pin = &cfg->execution.stage_blocks;
  long long sum = 0;
  for (int s = 0; s < pin->n; s++) {
    if (pin->v[s] > n)
      return st_error_set(err, ST_ECONFIG,
                          "%s: execution.stage_blocks: entry %d is %d: the "
                          "model has %d blocks",
                          st_config_where(cfg, "execution.stage_blocks"), s,
                          pin->v[s], n);
    sum += pin->v[s];
  }
  if (pin->n > 0 && sum != n)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stage_blocks: the stages hold %lld "
                        "blocks in all; the model has %d",
                        st_config_where(cfg, "execution.stage_blocks"), sum, n);
  return 0;
}

int st_pipeline_asked_stages(const st_config *cfg) {
  if (!st_pipeline_pinned(cfg)) return cfg->execution.stages;
  /* interleaved: the pin is the chunks', V to a stage worker */
  int V = !strcmp(cfg->execution.mode, "pipeline") &&
                  !strcmp(cfg->execution.schedule, "interleaved")
              ? cfg->execution.virtual_stages
              : 1;
  return cfg->execution.stage_blocks.n / (V > 1 ? V : 1);
}

int st_pipeline_split(const st_model *m, const st_config *cfg, int S, int cores,
                      int *first, int *count, int *pes, st_error *err) {
  int n = m->n_blocks;
  st_block_cost *c = malloc((size_t)n * sizeof *c);
  st_config *cpu = malloc(sizeof *cpu);
  int k = -1;
  if (!c || !cpu) {
    st_error_set(err, ST_ENOMEM, "out of memory");
  } else if (!st_pipeline_check_pin(cfg, n, err) &&
             !st_plan_block_costs(c, m, cfg, err)) {
    st_fabric fab, *on = st_cut_fabric(&fab, cpu, cfg, S, cores);
    k = st_cut_split(c, n, on, S, cores, S > cores,
                     &cfg->execution.stage_blocks, cfg, first, count, pes);
  }
  free(c);
  free(cpu);
  return k;
}

/* block_sequential segments: blocks_per_segment each, or (0) the fewest
 * runs of blocks whose weights, optimizer state and batch activations fit
 * the machine's memory. Returns the count; starts[g] is a first block. */
int st_cut_segments(const st_block_cost *c, int n, const st_fabric *fab,
                    int per, int batch, int *starts) {
  int g = 0;
  if (per > 0) {
    for (int b = 0; b < n; b += per) starts[g++] = b;
    return g;
  }
  double cap = (double)fab->pes * fab->pe_memory, used = 0;
  for (int b = 0; b < n; b++) {
    double need = c[b].param_bytes + c[b].state_bytes +
                  (c[b].act_bytes + c[b].in_bytes) * batch;
    if (b == 0 || used + need > cap) {
      starts[g++] = b;
      used = 0;
    }
    used += need;
  }
  return g;
}
