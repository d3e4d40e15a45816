/*
 * sweep.c — `strata sweep`: steps to reach a target against batch size, the
 * best of a quasi-random learning-rate (and momentum) search per batch size
 * (docs/sweep.md; BACKGROUND.md §5). The work is st_sweep_run; this file
 * reads the command line. Errors end as one line "strata: error: ..." and
 * exit status 1; a misused command line (a malformed option value included)
 * prints the usage and exits 2.
 */
#include "cli.h"
#include "strata.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *usage_sweep =
    "usage: strata sweep CONFIG --batch-sizes B1,B2,... --target METRIC=VALUE\n"
    "                    [--trials N] [--budget-steps N] [--budget-epochs E]\n"
    "                    [--eval-every N] [--eval-growth G]\n"
    "                    [--lr-range MIN,MAX] [--noise-batch B] [--jobs N]\n"
    "                    [--optimizer sgd|momentum|nesterov|adam]\n"
    "                    [--out DIR] [--set key.path=value ...]\n"
    "\n"
    "Measures how many steps the model of CONFIG needs to reach a test-set\n"
    "target at each batch size (Shallue et al. 2018): per batch size, N\n"
    "trials with the learning rate (and momentum, for sgd with momentum)\n"
    "from a Halton sequence; a trial evaluates every --eval-every steps and\n"
    "stops at the first evaluation meeting the target; the batch size's\n"
    "steps to result is its best trial's. --jobs trials run at once, each\n"
    "on one thread unless train.threads is set; the files are the same\n"
    "whatever --jobs is. A sweep stopped part-way resumes: trials already\n"
    "in DIR/sweep.csv are not run again.\n"
    "\n"
    "options:\n"
    "  --batch-sizes LIST  increasing batch sizes, e.g. 1,2,4,8,16 (required)\n"
    "  --target M=V        accuracy=0.85 (test accuracy >= 0.85) or loss=0.4\n"
    "                      (test loss <= 0.4) (required)\n"
    "  --trials N          trials per batch size (default 8)\n"
    "  --budget-steps N    most steps per trial (default train.steps when "
    "set,\n"
    "                      else 1000); the schedule spans this many steps\n"
    "  --budget-epochs E   and at most E passes over the training set: a\n"
    "                      trial at batch B stops after ceil(E n / B) steps\n"
    "                      when that is fewer (default: no such limit)\n"
    "  --eval-every N      evaluate every N steps and at the end (default\n"
    "                      train.eval_every when set, else budget / 100)\n"
    "  --eval-growth G     evaluate at step N, then after step s at\n"
    "                      max(s + N, ceil(G s)): steps known to a factor G\n"
    "                      at every batch size (default 1: every N steps)\n"
    "  --lr-range MIN,MAX  learning rates searched on a log scale (default\n"
    "                      0.001,1)\n"
    "  --noise-batch B     after the trials, run batch B's best trial again\n"
    "                      measuring the gradient noise scale B_simple, and\n"
    "                      report it beside the critical batch size (B: one\n"
    "                      of the batch sizes, even)\n"
    "  --jobs N            trials run at once (default: the cores this\n"
    "                      process may use); with N > 1 each trial gets one\n"
    "                      thread, or train.threads when the config sets it\n"
    "  --optimizer NAME    sgd (no momentum), momentum, nesterov (both search\n"
    "                      momentum in [0.5, 0.99]) or adam (adamw); default:\n"
    "                      the config's optimizer\n"
    "  --out DIR           output directory (default runs/sweep-<config "
    "name>)\n"
    "  --set KEY=VALUE     override a config key; repeatable\n"
    "  --help              this text\n"
    "\n"
    "writes:\n"
    "  DIR/sweep.csv   every trial: batch, trial, lr, momentum,\n"
    "                  steps_to_target (empty: not reached), final metric\n"
    "  DIR/steps.csv   the best trial per batch size\n"
    "  DIR/steps.svg   steps against batch size, log-log, with the\n"
    "                  perfect-scaling line and the regimes shaded\n"
    "  DIR/report.md   the table, where steps stop halving, the fitted\n"
    "                  critical batch size and B_simple\n"
    "  DIR/noise.csv   B_simple along the noise run (with --noise-batch)\n"
    "  DIR/sweep.key   the target, budgets and config a resumed sweep must\n"
    "                  match\n";

typedef struct sweep_args {
  const char *config, *batch_sizes, *target, *trials, *budget, *epochs,
      *eval_every, *growth, *lr_range, *noise_batch, *optimizer, *out, *jobs;
  const char *sets[ST_CLI_MAX_SETS];
  int n_sets, help;
} sweep_args;

static int parse(int argc, char **argv, sweep_args *a) {
  const st_cli_option options[] = {{"--batch-sizes", &a->batch_sizes, NULL},
                                   {"--target", &a->target, NULL},
                                   {"--trials", &a->trials, NULL},
                                   {"--budget-steps", &a->budget, NULL},
                                   {"--budget-epochs", &a->epochs, NULL},
                                   {"--eval-every", &a->eval_every, NULL},
                                   {"--eval-growth", &a->growth, NULL},
                                   {"--noise-batch", &a->noise_batch, NULL},
                                   {"--lr-range", &a->lr_range, NULL},
                                   {"--jobs", &a->jobs, NULL},
                                   {"--optimizer", &a->optimizer, NULL},
                                   {"--out", &a->out, NULL},
                                   {NULL, NULL, NULL}};
  const st_cli_spec spec = {usage_sweep, options,    {&a->config, NULL},
                            a->sets,     &a->n_sets, &a->help};
  return st_cli_parse(argc, argv, &spec);
}

/* A whole number in [1, max]; -1 if malformed. */
static long long positive(const char *text, long long max) {
  uint64_t v;
  return st_cli_whole(text, (uint64_t)max, &v) && v >= 1 ? (long long)v : -1;
}

/* A finite number >= lo; NAN if malformed. */
static double at_least(const char *text, double lo) {
  double v;
  return st_cli_real(text, &v) && v >= lo ? v : NAN;
}

static int parse_batches(st_int_list *l, const char *text) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", text);
  l->n = 0;
  /* strsep, not strtok: "1,,2" has an empty entry, which is an error */
  for (char *rest = buf, *p; (p = strsep(&rest, ","));) {
    long long v = positive(p, 1 << 30);
    if (v < 0 || l->n == ST_MAX_LIST) return -1;
    if (l->n && v <= l->v[l->n - 1]) return -1;
    l->v[l->n++] = (int)v;
  }
  return l->n ? 0 : -1;
}

static int parse_range(double *lo, double *hi, const char *text) {
  char buf[128];
  const char *comma = strchr(text, ',');
  size_t len = comma ? (size_t)(comma - text) : sizeof buf;
  if (len >= sizeof buf) return -1;
  memcpy(buf, text, len);
  buf[len] = 0;
  if (!st_cli_real(buf, lo) || !st_cli_real(comma + 1, hi)) return -1;
  return *lo > 0 && *lo <= *hi ? 0 : -1;
}

/* --optimizer: the config keys it stands for, applied as --set would. */
static int apply_optimizer(st_config *cfg, const char *name, st_error *err) {
  static const struct {
    const char *name, *sets[3];
  } table[] = {
      {"sgd",
       {"optimizer.kind=sgd", "optimizer.momentum=0",
        "optimizer.nesterov=false"}},
      {"momentum",
       {"optimizer.kind=sgd", "optimizer.momentum=0.9",
        "optimizer.nesterov=false"}},
      {"nesterov",
       {"optimizer.kind=sgd", "optimizer.momentum=0.9",
        "optimizer.nesterov=true"}},
      {"adam", {"optimizer.kind=adamw", NULL, NULL}},
  };
  for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
    if (strcmp(name, table[k].name) != 0) continue;
    for (int j = 0; j < 3 && table[k].sets[j]; j++) {
      int rc = st_config_set(cfg, table[k].sets[j], err);
      if (rc) return rc;
    }
    return 0;
  }
  return 1;
}

int st_cli_sweep(int argc, char **argv) {
  sweep_args a = {0};
  int rc = parse(argc, argv, &a);
  if (rc) return rc;
  if (a.help) return fputs(usage_sweep, stdout), 0;
  if (!a.config)
    return st_cli_usage_error(usage_sweep, "sweep needs a CONFIG%s", "");
  if (!a.batch_sizes)
    return st_cli_usage_error(usage_sweep, "sweep needs --batch-sizes%s", "");
  if (!a.target)
    return st_cli_usage_error(usage_sweep, "sweep needs --target%s", "");

  st_sweep_options o = {0};
  st_error err = {0};
  if (parse_batches(&o.batch_sizes, a.batch_sizes))
    return st_cli_usage_error(
        usage_sweep,
        "--batch-sizes takes increasing whole numbers >= 1, "
        "at most 32, as 1,2,4; not '%s'",
        a.batch_sizes);
  if (st_sweep_target_parse(&o.target, a.target, &err))
    return st_cli_usage_error(usage_sweep, "%s", err.msg);
  o.trials = 8;
  if (a.trials && (o.trials = (int)positive(a.trials, 1 << 20)) < 0)
    return st_cli_usage_error(
        usage_sweep,
        "--trials takes a whole number from 1 to 1048576, not '%s'", a.trials);
  o.jobs = st_usable_cpus(NULL, 0);
  if (a.jobs && (o.jobs = (int)positive(a.jobs, 1 << 16)) < 0)
    return st_cli_usage_error(
        usage_sweep, "--jobs takes a whole number from 1 to 65536, not '%s'",
        a.jobs);
  o.lr_min = 1e-3, o.lr_max = 1;
  if (a.lr_range && parse_range(&o.lr_min, &o.lr_max, a.lr_range))
    return st_cli_usage_error(
        usage_sweep,
        "--lr-range takes MIN,MAX with 0 < MIN <= MAX, not "
        "'%s'",
        a.lr_range);

  st_config cfg;
  st_config_defaults(&cfg);
  rc = st_config_load(&cfg, a.config, &err);
  if (!rc && a.optimizer && (rc = apply_optimizer(&cfg, a.optimizer, &err)) > 0)
    return st_cli_usage_error(
        usage_sweep,
        "--optimizer takes sgd, momentum, nesterov or adam, "
        "not '%s'",
        a.optimizer);
  for (int i = 0; !rc && i < a.n_sets; i++)
    rc = st_config_set(&cfg, a.sets[i], &err);
  if (!rc) rc = st_config_validate(&cfg, &err);
  if (rc) return st_cli_fail(&err);

  o.budget_steps = cfg.train.steps > 0 ? cfg.train.steps : 1000;
  if (a.budget && (o.budget_steps = positive(a.budget, (long long)1 << 40)) < 0)
    return st_cli_usage_error(
        usage_sweep,
        "--budget-steps takes a whole number from 1 to 2^40, not '%s'",
        a.budget);
  /* a hundredth of the budget, within an int (2^40 steps' is not) */
  long long hundredth = o.budget_steps / 100;
  o.eval_every = cfg.train.eval_every > 0 ? cfg.train.eval_every
                 : hundredth < (1 << 30)  ? (int)hundredth
                                          : 1 << 30;
  if (o.eval_every < 1) o.eval_every = 1;
  if (a.eval_every && (o.eval_every = (int)positive(a.eval_every, 1 << 30)) < 0)
    return st_cli_usage_error(
        usage_sweep,
        "--eval-every takes a whole number from 1 to 2^30, not '%s'",
        a.eval_every);
  if (a.epochs && isnan(o.budget_epochs = at_least(a.epochs, 0)))
    return st_cli_usage_error(
        usage_sweep, "--budget-epochs takes a number >= 0, not '%s'", a.epochs);
  if (a.growth && isnan(o.eval_growth = at_least(a.growth, 1)))
    return st_cli_usage_error(
        usage_sweep, "--eval-growth takes a number >= 1, not '%s'", a.growth);
  if (a.noise_batch &&
      (o.noise_batch = (int)positive(a.noise_batch, 1 << 30)) < 0)
    return st_cli_usage_error(
        usage_sweep,
        "--noise-batch takes a whole number from 1 to 2^30, not '%s'",
        a.noise_batch);
  if (a.out)
    snprintf(o.out_dir, sizeof o.out_dir, "%s", a.out);
  else {
    /* runs/sweep-<name>, beside the runs/<name> of `strata train` */
    char dir[ST_PATH_MAX - 16];
    st_cli_default_out(dir, sizeof dir, a.config);
    snprintf(o.out_dir, sizeof o.out_dir, "runs/sweep-%s", dir + 5);
  }
  o.progress = stdout;
  /* every trial trains the config's mode, model and optimizer: a key none
   * of them reads is as dead here as under `strata train` */
  st_cli_notice_unused(&cfg);

  printf("strata: sweep of %s: %d batch size%s x %d trial%s, at most %lld "
         "steps each, target %s, %d at once; writing %s\n",
         a.config, o.batch_sizes.n, o.batch_sizes.n == 1 ? "" : "s", o.trials,
         o.trials == 1 ? "" : "s", (long long)o.budget_steps, a.target, o.jobs,
         o.out_dir);
  fflush(stdout);
  if (st_sweep_run(&o, &cfg, &err)) return st_cli_fail(&err);
  /* noise.csv where the noise run measured B_simple */
  char noise[ST_PATH_MAX + 16];
  snprintf(noise, sizeof noise, "%s/noise.csv", o.out_dir);
  printf("strata: done: wrote %s/sweep.csv, steps.csv, steps.svg%s and "
         "report.md\n",
         o.out_dir,
         o.noise_batch && access(noise, F_OK) == 0 ? ", noise.csv" : "");
  return 0;
}
