/*
 * compile.c — `strata compile`: checks a config and its model, or compiles
 * it onto a fabric and writes the plan (DESIGN.md, "The compiler";
 * docs/compiler.md). Errors end as one line "strata: error: ..." and exit
 * status 1; a misused command line prints the usage and exits 2.
 */
#include "cli.h"
#include "strata.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *usage_compile =
    "usage: strata compile CONFIG [--set key.path=value ...]\n"
    "                      [--fabric cpu | cpu:N | mesh:WxH | wse2]\n"
    "                      [--stages K] [--mode MODE]\n"
    "                      [--ranks N [--ranks-per-machine L]]\n"
    "                      [--validate-only | --compile-only] [--out DIR]\n"
    "\n"
    "Compiles the model of CONFIG onto a fabric: splits its blocks into\n"
    "pipeline stages (optimal: the slowest stage is as fast as it can be),\n"
    "gives each stage cores or PEs in proportion to its work within its\n"
    "memory, places the stages so neighbours touch, and predicts time per\n"
    "sample, memory and throughput (docs/compiler.md). Nothing is trained.\n"
    "\n"
    "options:\n"
    "  --set KEY=VALUE   override a config key, e.g. --set train.batch=128;\n"
    "                    repeatable (fabric keys: fabric.pe_flops,\n"
    "                    fabric.pe_memory, fabric.link_bandwidth, ...)\n"
    "  --fabric SPEC     what to compile for (overrides fabric.kind):\n"
    "                      cpu       this machine's cores (detected)\n"
    "                      cpu:N     N cores of this machine's kind\n"
    "                      mesh:WxH  a W x H grid of PEs; per-PE compute,\n"
    "                                memory and link bandwidth from the\n"
    "                                fabric.pe_* keys (default: a WSE-2 PE)\n"
    "                      wse2      Cerebras WSE-2, published figures\n"
    "                    a cpu plan can run; a mesh plan is a what-if\n"
    "  --stages K        exactly K pipeline stages (default: a pipeline or\n"
    "                    pipelined_backprop config's execution.stages, if a\n"
    "                    number; a sequential config's one stage; else the\n"
    "                    K with the best predicted throughput; ties go to\n"
    "                    fewer); such a\n"
    "                    config's execution.stage_blocks pins the cut itself\n"
    "  --mode MODE       plan this execution mode (sequential, pipeline,\n"
    "                    pipelined_backprop, block_sequential,\n"
    "                    weight_streaming) and say what it costs against the\n"
    "                    one compile chooses; default auto: the mode chosen\n"
    "                    by memory (mesh: layer-pipelined if it fits, else\n"
    "                    weight streaming; cpu: the config's, else weight\n"
    "                    streaming), execution.micro_batch 0 picked too\n"
    "  --ranks N         the run's MPI ranks (mpirun -np N): which stages "
    "each\n"
    "                    rank holds and its memory by the plan, checked\n"
    "                    against execution.rank_memory_limit and against\n"
    "                    its machine's memory (the fabric's: each rank\n"
    "                    holds only its own replica or stages)\n"
    "  --ranks-per-machine L\n"
    "                    L of the N ranks share each machine and split its\n"
    "                    memory, as the run splits it (default 1; mpirun\n"
    "                    -np N on this one machine: L = N)\n"
    "  --validate-only   check the config and the model, print parameters,\n"
    "                    FLOPs per sample and memory; allocate no model\n"
    "                    memory, write nothing\n"
    "  --compile-only    compile and write the plan without training (the\n"
    "                    default of this command)\n"
    "  --out DIR         where plan.json and plan.svg go (default\n"
    "                    runs/<config name>)\n"
    "  --help            this text\n"
    "\n"
    "writes:\n"
    "  DIR/plan.json     the plan, machine-readable: fabric, blocks, stages\n"
    "                    (blocks, PEs, rectangle, predicted times, memory,\n"
    "                    cause), throughput, bottleneck, utilization\n"
    "  DIR/plan.svg      the map: each stage's region coloured and labelled\n";

typedef struct compile_args {
  const char *config, *out, *fabric, *stages, *ranks, *per_machine, *mode;
  const char *sets[ST_CLI_MAX_SETS];
  int n_sets, help, validate_only, compile_only;
} compile_args;

static int parse(int argc, char **argv, compile_args *a) {
  const st_cli_option options[] = {
      {"--validate-only", NULL, &a->validate_only},
      {"--compile-only", NULL, &a->compile_only},
      {"--out", &a->out, NULL},
      {"--fabric", &a->fabric, NULL},
      {"--stages", &a->stages, NULL},
      {"--ranks", &a->ranks, NULL},
      {"--ranks-per-machine", &a->per_machine, NULL},
      {"--mode", &a->mode, NULL},
      {NULL, NULL, NULL}};
  const st_cli_spec spec = {usage_compile, options,    {&a->config, NULL},
                            a->sets,       &a->n_sets, &a->help};
  int rc = st_cli_parse(argc, argv, &spec);
  if (!rc && a->validate_only && a->compile_only)
    return st_cli_usage_error(usage_compile,
                              "--validate-only and --compile-only exclude "
                              "each other%s",
                              "");
  return rc;
}

/* --stages K: a whole number from 1 to 1000000, or 0 when absent; -1 if
 * malformed. */
static int stages_of(const char *text) {
  if (!text) return 0;
  uint64_t k;
  return st_cli_whole(text, 1000000, &k) && k >= 1 ? (int)k : -1;
}

static int load(st_config *cfg, const compile_args *a, st_error *err) {
  st_config_defaults(cfg);
  int rc = st_config_load(cfg, a->config, err);
  for (int i = 0; !rc && i < a->n_sets; i++)
    rc = st_config_set(cfg, a->sets[i], err);
  if (!rc && a->fabric) rc = st_fabric_parse(cfg, a->fabric, err);
  if (!rc) rc = st_config_validate(cfg, err);
  return rc;
}

int st_cli_compile(int argc, char **argv) {
  compile_args a = {0};
  int rc = parse(argc, argv, &a);
  if (rc) return rc;
  if (a.help) return fputs(usage_compile, stdout), 0;
  if (!a.config)
    return st_cli_usage_error(usage_compile, "compile needs a CONFIG%s", "");
  int stages = stages_of(a.stages), ranks = stages_of(a.ranks),
      per_machine = stages_of(a.per_machine);
  /* the bound is said: '2000000' is >= 1 */
  if (stages < 0)
    return st_cli_usage_error(usage_compile,
                              "--stages takes a whole number from 1 to "
                              "1000000, not '%s'",
                              a.stages);
  if (ranks < 0)
    return st_cli_usage_error(usage_compile,
                              "--ranks takes a whole number from 1 to "
                              "1000000, not '%s'",
                              a.ranks);
  if (per_machine < 0 || (a.per_machine && !ranks) || per_machine > ranks)
    return st_cli_usage_error(usage_compile,
                              "--ranks-per-machine takes a whole number from "
                              "1 to --ranks N, not '%s'",
                              a.per_machine);
  st_error err = {0};
  st_config cfg;
  /* a malformed --fabric is a misused command line, as --stages x is:
   * its spec checked before the config is read */
  st_config_defaults(&cfg);
  if (a.fabric && st_fabric_parse(&cfg, a.fabric, &err) == ST_EARG)
    return st_cli_usage_error(usage_compile, "%s", err.msg);
  if (load(&cfg, &a, &err)) return st_cli_fail(&err);
  cfg.launch.ranks = ranks;
  cfg.launch.per_machine = per_machine;
  /* the keys the config sets that its setting does not read, as train
   * says them (a mode forced by --mode is the one planned) */
  if (a.validate_only) {
    st_cli_notice_unused(&cfg);
    return st_plan_validate(&cfg, stdout, &err) ? st_cli_fail(&err) : 0;
  }

  char out[ST_PATH_MAX], json[ST_PATH_MAX + 16], svg[ST_PATH_MAX + 16];
  if (a.out)
    snprintf(out, sizeof out, "%s", a.out);
  else
    st_cli_default_out(out, sizeof out, a.config);
  snprintf(json, sizeof json, "%s/plan.json", out);
  snprintf(svg, sizeof svg, "%s/plan.svg", out);
  const char *force = a.mode && strcmp(a.mode, "auto") ? a.mode : NULL;
  if (force) {
    static const char *const modes[] = {"sequential", "pipeline",
                                        "pipelined_backprop",
                                        "block_sequential", "weight_streaming"};
    int known = 0;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
      known |= !strcmp(force, modes[i]);
    if (!known)
      return st_cli_usage_error(usage_compile,
                                "--mode takes auto, sequential, pipeline, "
                                "pipelined_backprop, block_sequential or "
                                "weight_streaming, not '%s'",
                                force);
  }
  st_config noticed = cfg;
  if (force)
    snprintf(noticed.execution.mode, sizeof noticed.execution.mode, "%s",
             force);
  st_cli_notice_unused(&noticed);
  /* a pipeline over ranks with execution.stages 0 runs a stage a rank
   * (each replica's pipeline its share of them), as `strata train` does */
  const char *mode = force ? force : cfg.execution.mode;
  if (!stages && ranks > 1 && !strcmp(cfg.execution.placement, "ranks") &&
      cfg.execution.stages == 0 && cfg.execution.stage_blocks.n == 0 &&
      (!strcmp(mode, "pipeline") || !strcmp(mode, "pipelined_backprop")))
    cfg.execution.stages =
        ranks / (cfg.execution.replicas > 0 ? cfg.execution.replicas : 1);
  st_plan *plan;
  st_config as_planned; /* the ranks hold what compile chose */
  if (st_plan_choose(&plan, &cfg, stages, force, &as_planned, &err))
    return st_cli_fail(&err);
  /* the mode planned (--mode's, or the chooser's) under the config's own
   * rules, as `strata train` would check it: pipelined backprop's
   * mitigations with AdamW, its heavy-ball momentum, ... */
  if (st_config_validate(&as_planned, &err)) {
    st_plan_destroy(plan);
    return st_cli_fail(&err);
  }
  /* pipelined backprop refuses a tied head and embedding in different
   * stages (src/exec/pb.c): the run would refuse this plan, so compile
   * does, as the run says it */
  if (!strcmp(plan->mode, "pipelined_backprop") && plan->n_stages > 1 &&
      !strcmp(cfg.model.kind, "gpt") && cfg.model.tied) {
    st_plan_destroy(plan);
    st_error_set(&err, ST_ECONFIG,
                 "%s: model.tied: the head and the token embedding share "
                 "weights but land in different stages, which update at "
                 "different delays in pipelined_backprop; set model.tied: "
                 "false",
                 st_config_where(&cfg, "model.tied"));
    return st_cli_fail(&err);
  }
  if (st_plan_place_ranks(plan, &as_planned, &err)) {
    st_plan_destroy(plan);
    return st_cli_fail(&err);
  }
  st_plan_print(plan, stdout);
  rc = st_mkdir_p(out, 1, &err);
  if (!rc) rc = st_plan_write_json(plan, json, &err);
  if (!rc) rc = st_plan_write_svg(plan, svg, &err);
  st_plan_destroy(plan);
  if (rc) return st_cli_fail(&err);
  printf("wrote %s and %s\n", json, svg);
  return 0;
}
