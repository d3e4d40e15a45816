/*
 * experiment.c — `strata experiment pb`: pipelined backprop under every
 * mitigation against the sequential baseline, on one config, over several
 * seeds (BACKGROUND.md 2). The work is st_experiment_pb; this file reads
 * the command line. Errors end as one line "strata: error: ..." and exit
 * status 1; a misused command line (a malformed option value included)
 * prints the usage and exits 2.
 */
#include "cli.h"
#include "strata.h"

#include <stdlib.h>
#include <string.h>

static const char *usage_experiment =
    "usage: strata experiment pb CONFIG [--seeds N] [--jobs N] [--points N]\n"
    "                            [--depths S1,S2,...] [--out DIR]\n"
    "                            [--set key.path=value ...]\n"
    "\n"
    "pb  trains the model of CONFIG in seven variants for the same steps\n"
    "    and samples and compares them. CONFIG's optimizer is an SGD recipe\n"
    "    tuned at its optimizer.reference_batch R, if set, else at its\n"
    "    train.batch B (R = B).\n"
    "      baseline   execution.mode sequential at batch B, the recipe as\n"
    "                 given (Nesterov if set), moved from R to B if R != B\n"
    "      none, stash, sc, lwp, sc+lwp, pipemare\n"
    "                 execution.mode pipelined_backprop with that\n"
    "                 execution.mitigation: heavy-ball momentum\n"
    "                 (optimizer.nesterov false), optimizer.reference_batch\n"
    "                 R (lr and momentum moved from R to the micro-batch),\n"
    "                 train.batch B (a step hands the pipeline B samples\n"
    "                 as micro-batches of execution.micro_batch, default 1,\n"
    "                 so steps, lr schedule and samples are the\n"
    "                 baseline's), execution.stages as configured (0\n"
    "                 becomes per_block); emulated on one thread (same\n"
    "                 bits) for per_block or more stages than threads\n"
    "    Each variant runs with train.seed + 0 .. N-1 for train.steps steps\n"
    "    (else train.epochs epochs), evaluating the test set at evenly\n"
    "    spaced steps, the last at the end. Runs go --jobs at a time; the\n"
    "    results do not depend on --jobs (only the measured speeds do).\n"
    "    A diverged run is recorded as such; any other error stops the\n"
    "    experiment with the first failed run's variant and seed.\n"
    "\n"
    "options:\n"
    "  --seeds N        runs per variant (default 3)\n"
    "  --points N       test evaluations per run (default 20)\n"
    "  --jobs N         runs at once (default: the cores this process may\n"
    "                   use); with N > 1 each run gets one thread, or\n"
    "                   train.threads when the config sets it\n"
    "  --depths LIST    instead of the seven variants: the baseline, then\n"
    "                   none, sc, lwp and sc+lwp with execution.stages at\n"
    "                   each stage count of LIST (e.g. 4,8,16,32: rising,\n"
    "                   each >= 2; the model needs that many blocks);\n"
    "                   writes depth.md, depth.csv and depth.svg (final\n"
    "                   accuracy against stages)\n"
    "  --out DIR        output directory (default runs/experiment-pb-<config\n"
    "                   name>)\n"
    "  --set KEY=VALUE  override a config key for every run; repeatable\n"
    "  --help           this text\n"
    "\n"
    "writes:\n"
    "  DIR/results.md   the settings (stages, micro-batch, lr and momentum\n"
    "                   given and rescaled) and a table per variant: test\n"
    "                   accuracy (mean ± std over seeds), its difference to\n"
    "                   the baseline, final train loss (last 10% of steps),\n"
    "                   samples/s (training steps only)\n"
    "  DIR/results.csv  one row per run: variant, seed, test_accuracy,\n"
    "                   final_train_loss, samples_per_s, seconds\n"
    "  DIR/curves.svg   mean test accuracy against samples seen, a line per\n"
    "                   variant\n";

typedef struct experiment_args {
  const char *kind, *config, *seeds, *jobs, *points, *out, *depths;
  const char *sets[ST_CLI_MAX_SETS];
  int n_sets, help;
} experiment_args;

static int parse(int argc, char **argv, experiment_args *a) {
  const st_cli_option options[] = {
      {"--seeds", &a->seeds, NULL},   {"--jobs", &a->jobs, NULL},
      {"--points", &a->points, NULL}, {"--out", &a->out, NULL},
      {"--depths", &a->depths, NULL}, {NULL, NULL, NULL}};
  const st_cli_spec spec = {
      usage_experiment, options,    {&a->kind, &a->config},
      a->sets,          &a->n_sets, &a->help};
  return st_cli_parse(argc, argv, &spec);
}

/* A whole number in [1, max]; -1 if malformed. */
static int positive(const char *text, int max) {
  uint64_t v;
  return st_cli_whole(text, (uint64_t)max, &v) && v >= 1 ? (int)v : -1;
}

/* --NAME's value into *out when given; a usage error when malformed. */
static int count_option(int *out, const char *name, const char *text, int max) {
  if (!text) return 0;
  if ((*out = positive(text, max)) > 0) return 0;
  char what[160];
  snprintf(what, sizeof what, "%s takes a whole number >= 1, not '%s'", name,
           text);
  return st_cli_usage_error(usage_experiment, "%s", what);
}

/* --depths S1,S2,...: whole numbers >= 2, rising; a usage error else. */
static int depths_option(st_experiment_options *o, const char *text) {
  if (!text) return 0;
  const char *p = text;
  o->n_depths = 0;
  for (;;) {
    const char *end = strchr(p, ',');
    char one[32] = "";
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len < sizeof one) memcpy(one, p, len), one[len] = 0;
    uint64_t v = 0;
    if (!st_cli_whole(one, 1 << 20, &v) || v < 2 ||
        o->n_depths == ST_EXPERIMENT_MAX_DEPTHS ||
        (o->n_depths && (int)v <= o->depths[o->n_depths - 1])) {
      char what[200];
      snprintf(what, sizeof what,
               "--depths takes rising stage counts >= 2 separated by "
               "commas (at most %d), not '%s'",
               ST_EXPERIMENT_MAX_DEPTHS, text);
      return st_cli_usage_error(usage_experiment, "%s", what);
    }
    o->depths[o->n_depths++] = (int)v;
    if (!end) return 0;
    p = end + 1;
  }
}

int st_cli_experiment(int argc, char **argv) {
  experiment_args a = {0};
  int rc = parse(argc, argv, &a);
  if (rc) return rc;
  if (a.help) return fputs(usage_experiment, stdout), 0;
  if (!a.kind)
    return st_cli_usage_error(usage_experiment, "experiment needs a kind: pb%s",
                              "");
  if (strcmp(a.kind, "pb") != 0)
    return st_cli_usage_error(usage_experiment, "unknown experiment '%s' (pb)",
                              a.kind);
  if (!a.config)
    return st_cli_usage_error(usage_experiment,
                              "experiment pb needs a CONFIG%s", "");

  st_experiment_options o = {.seeds = 3, .points = 20, .log = stdout};
  o.jobs = st_usable_cpus(NULL, 0);
  if ((rc = count_option(&o.seeds, "--seeds", a.seeds, 1 << 16)) ||
      (rc = count_option(&o.points, "--points", a.points, 1 << 20)) ||
      (rc = count_option(&o.jobs, "--jobs", a.jobs, 1 << 16)) ||
      (rc = depths_option(&o, a.depths)))
    return rc;
  if (a.out) {
    snprintf(o.out_dir, sizeof o.out_dir, "%s", a.out);
  } else {
    /* runs/<name> from the shared rule, as runs/experiment-pb-<name> */
    char plain[ST_PATH_MAX];
    st_cli_default_out(plain, sizeof plain, a.config);
    const char *prefix = "runs/experiment-pb-";
    snprintf(o.out_dir, sizeof o.out_dir, "%s%.*s", prefix,
             (int)(sizeof o.out_dir - 1 - strlen(prefix)),
             plain + strlen("runs/"));
  }

  /* The config itself is not validated: no run trains it as it stands
   * (a pipelined_backprop config with Nesterov gives a valid baseline);
   * st_experiment_pb validates every variant's config, naming it. */
  st_config cfg;
  st_error err = {0};
  st_config_defaults(&cfg);
  rc = st_config_load(&cfg, a.config, &err);
  for (int i = 0; !rc && i < a.n_sets; i++)
    rc = st_config_set(&cfg, a.sets[i], &err);
  if (rc) return st_cli_fail(&err);

  int n_variants = o.n_depths ? 1 + 4 * o.n_depths : ST_EXPERIMENT_PB_VARIANTS;
  printf("strata: experiment pb of %s: %d variants x %d seed%s, %d at "
         "once; writing %s\n",
         a.config, n_variants, o.seeds, o.seeds == 1 ? "" : "s", o.jobs,
         o.out_dir);
  fflush(stdout);
  if (st_experiment_pb(&o, &cfg, &err)) return st_cli_fail(&err);
  if (o.n_depths)
    printf("strata: done: wrote %s/depth.md, depth.csv and depth.svg\n",
           o.out_dir);
  else
    printf("strata: done: wrote %s/results.md, results.csv and curves.svg\n",
           o.out_dir);
  return 0;
}
