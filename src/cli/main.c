/*
 * main.c — the `strata` command. The only place that prints errors and picks
 * exit statuses: library calls return an st_error, turned here into one line
 * "strata: error: ..." and exit status 1 (2 for a misused command line).
 */
#include "strata.h"
#include "cli.h"

#include "../compile/compile.h"
#include "../dist/dist.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct args {
  const char *config, *out, *resume, *checkpoint, *trace;
  const char *sets[ST_CLI_MAX_SETS];
  int n_sets, help, overwrite;
} args;

static const char *usage_main =
    "usage: strata COMMAND [options]\n"
    "\n"
    "Trains neural networks in several execution modes (DESIGN.md).\n"
    "\n"
    "commands:\n"
    "  train CONFIG     train a model described by a YAML config\n"
    "  eval CONFIG      evaluate a checkpoint on the test set\n"
    "  compile CONFIG   plan the model onto a fabric (cores, a mesh, wse2)\n"
    "  inspect FILE     list the tensors of a checkpoint (safetensors)\n"
    "  bench --calibrate  measure this machine's kernel rates for the "
    "compiler\n"
    "  bench --probe    time a round trip to every core now (a VM's state)\n"
    "  tokenize train|encode  train a BPE tokenizer on a corpus, or encode "
    "text\n"
    "  sweep CONFIG     steps to a target across batch sizes (Shallue et al.)\n"
    "  experiment pb CONFIG  pipelined backprop's mitigations against the\n"
    "                   sequential baseline, over seeds\n"
    "  generate CONFIG  sample text from a trained gpt checkpoint\n"
    "  export DIR       write the weights a run's store holds as safetensors\n"
    "\n"
    "Run 'strata COMMAND --help' for a command's options.\n";

static const char *usage_train =
    "usage: strata train CONFIG [--set key.path=value ...] [--out DIR]\n"
    "                    [--resume DIR | --overwrite] [--trace FILE]\n"
    "\n"
    "Trains the model of CONFIG and writes to DIR (default runs/<config "
    "name>):\n"
    "  DIR/config.yaml     the resolved config (defaults, file, --set)\n"
    "  DIR/metrics.jsonl   one JSON object per logged step and per evaluation\n"
    "  DIR/summary.json    mode, steps, samples, losses, test accuracy, speed\n"
    "  DIR/checkpoints/    step-NNNNNNNN.safetensors (weights, optimizer "
    "state,\n"
    "                      data position)\n"
    "  DIR/plan.json       the compiler's plan for the run\n"
    "  DIR/plan.svg        the plan's map, each stage's cores\n"
    "  DIR/schedule.svg    a pipeline's order of forwards and backwards per "
    "worker\n"
    "  DIR/store.strata    weight_streaming, execution.store file: the "
    "weights\n"
    "                      and optimizer state (the run's checkpoint)\n"
    "\n"
    "options:\n"
    "  --set KEY=VALUE  override a config key, e.g. --set train.batch=64,\n"
    "                   --set model.hidden=[512,512]; repeatable\n"
    "  --out DIR        output directory; one that holds an earlier run "
    "(its\n"
    "                   checkpoints, store, metrics or summary) is refused\n"
    "  --resume DIR     continue the run in DIR from its newest checkpoint\n"
    "                   (bit-identical to an uninterrupted run, except in\n"
    "                   pipelined_backprop, which refills its pipeline);\n"
    "                   CONFIG may be '-' to reuse DIR/config.yaml\n"
    "  --overwrite      replace the earlier run in DIR, so nothing of two "
    "runs\n"
    "                   mixes (removed once this one starts; put back if "
    "it\n"
    "                   fails before)\n"
    "  --trace FILE     write a Chrome trace-event JSON of the run (open it "
    "in\n"
    "                   Perfetto or chrome://tracing): one track per stage "
    "and\n"
    "                   replica; forward, backward, update, send, recv, idle\n"
    "                   (the first 200,000 spans of each track)\n"
    "  --help           this text, then every config key with its default\n";

static const char *usage_export =
    "usage: strata export DIR [--out FILE]\n"
    "\n"
    "Writes the state that the weight-streaming file store of the run in DIR\n"
    "(execution.store: file) last committed -- weights, optimizer state and\n"
    "data position -- as a safetensors checkpoint, FILE (default\n"
    "DIR/checkpoints/step-NNNNNNNN.safetensors), which `strata eval`,\n"
    "`strata generate` and `strata inspect` read. For a run without a store:\n"
    "its newest checkpoint as one file -- a sharded one (train.\n"
    "checkpoint_format: shards) merged tensor by tensor into the file a\n"
    "single-file checkpoint is (default DIR/checkpoints/step-NNNNNNNN.\n"
    "safetensors), a single file copied to FILE.\n";

static const char *usage_eval =
    "usage: strata eval CONFIG --checkpoint FILE [--set key.path=value ...]\n"
    "\n"
    "Loads the weights of FILE into the model of CONFIG and prints the test\n"
    "loss and accuracy. FILE may be a run's folder: its newest checkpoint;\n"
    "then CONFIG '-' is the run's own config.yaml.\n";

static const char *usage_generate =
    "usage: strata generate CONFIG --checkpoint FILE --prompt TEXT\n"
    "                       [--tokens N] [--temperature T] [--top-k K]\n"
    "                       [--seed S] [--set key.path=value ...]\n"
    "\n"
    "Samples text from the gpt model of CONFIG with the weights of FILE: the\n"
    "prompt, then N new tokens, printed as they come, and a newline. The\n"
    "tokenizer is the config's data.tokenizer; no corpus is read. The prompt\n"
    "must fit model.context tokens; past it, each new token is predicted\n"
    "from the last model.context tokens. FILE may be a run's folder (its\n"
    "newest checkpoint); CONFIG '-' is then the run's config.yaml.\n"
    "\n"
    "options:\n"
    "  --tokens N        new tokens (default 200)\n"
    "  --temperature T   divides the logits; 0 always takes the likeliest\n"
    "                    token (default 0.8)\n"
    "  --top-k K         sample among the K likeliest tokens (default 40;\n"
    "                    0 = all)\n"
    "  --seed S          the sampling stream (default 1): same seed, same "
    "text\n";

static const char *usage_inspect =
    "usage: strata inspect FILE [--against OTHER]\n"
    "\n"
    "Lists the tensors of a safetensors file: name, dtype, shape, min, max,\n"
    "mean, std, and its metadata (step, epoch, optimizer, ...); FILE may be\n"
    "a sharded checkpoint's folder (each shard in turn), or a run's folder\n"
    "(its newest checkpoint; OTHER too).\n"
    "  --against OTHER  compare with another file of the same tensors: the\n"
    "                   largest absolute and relative difference of each,\n"
    "                   then the largest of all (two runs of two modes)\n";

/* Parses options after the command; positional goes to a->config. */
static int parse_args(int argc, char **argv, args *a, const char *usage) {
  /* --overwrite: train's alone */
  const st_cli_option options[] = {
      {"--out", &a->out, NULL},
      {"--resume", &a->resume, NULL},
      {"--checkpoint", &a->checkpoint, NULL},
      {"--trace", &a->trace, NULL},
      {usage == usage_train ? "--overwrite" : NULL, NULL, &a->overwrite},
      {NULL, NULL, NULL}};
  const st_cli_spec spec = {usage,   options,    {&a->config, NULL},
                            a->sets, &a->n_sets, &a->help};
  return st_cli_parse(argc, argv, &spec);
}

static int load_config(st_config *cfg, const args *a, st_error *err) {
  st_config_defaults(cfg);
  const char *path = a->config;
  char resumed[ST_PATH_MAX + 16];
  if (a->resume && strcmp(path, "-") == 0) {
    snprintf(resumed, sizeof resumed, "%s/config.yaml", a->resume);
    path = resumed;
  } else if (strcmp(path, "-") == 0) {
    return st_error_set(err, ST_ECONFIG,
                        "-: CONFIG '-' is DIR/config.yaml in 'strata train "
                        "- --resume DIR' and 'strata eval - --checkpoint "
                        "DIR' (DIR a run's folder); give a config file here");
  }
  int rc = st_config_load(cfg, path, err);
  for (int i = 0; !rc && i < a->n_sets; i++)
    rc = st_config_set(cfg, a->sets[i], err);
  if (!rc) rc = st_config_validate(cfg, err);
  return rc;
}

/* Newest DIR/checkpoints/step-*.safetensors, by step number; "" if none. */
static int newest_checkpoint(const char *dir, char *out, size_t cap,
                             int64_t *step, st_error *err) {
  int64_t *steps;
  int n = st_run_checkpoints(dir, &steps, err);
  out[0] = '\0';
  if (n < 0) return err->code;
  if (n > 0) st_run_checkpoint_path(dir, steps[n - 1], out, cap);
  if (n > 0) *step = steps[n - 1];
  free(steps);
  return 0;
}

/* --resume where this config finds no state (a run killed before its
 * first checkpoint starts again at step 0): refused where the run's state
 * is elsewhere — a checkpoint in checkpoints/ while this config keeps a
 * file store, or a store where the run's own config (DIR/config.yaml)
 * kept it while this one keeps checkpoints or names another path. Either
 * way the run would start again beside the steps it took (a killed run
 * has no summary.json to say so). */
static int state_elsewhere(const char *out, int stored, const char *store,
                           st_error *err) {
  char ck[ST_PATH_MAX + 64];
  int64_t step = 0;
  st_error none = {0}; /* no checkpoints/ at all: none */
  if (stored && newest_checkpoint(out, ck, sizeof ck, &step, &none) == 0 &&
      ck[0])
    return st_error_set(err, ST_ECONFIG,
                        "%s: no store, but %s holds step %lld: the run kept "
                        "checkpoints; resume it without execution.store: "
                        "file (or --overwrite to start again)",
                        store, ck, (long long)step);
  char path[ST_PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/config.yaml", out);
  st_config run;
  st_error ignored = {0};
  struct stat sb;
  st_config_defaults(&run);
  if (st_config_load(&run, path, &ignored) || !st_store_resolve(&run, out) ||
      (stored && !strcmp(run.execution.store_path, store)) ||
      stat(run.execution.store_path, &sb) != 0)
    return 0;
  return st_error_set(err, ST_ECONFIG,
                      "%s: no %s, but %s holds the run's state (its "
                      "execution.store_path in %s): resume it with the "
                      "store it kept (or --overwrite to start again)",
                      stored ? store : out,
                      stored ? "store" : "checkpoint in checkpoints/",
                      run.execution.store_path, path);
}

/* The run's folder a path names, as its first n bytes at *base (n is
 * returned): the path without trailing slashes, or, for a run's
 * checkpoints/ folder itself (not a sharded checkpoint's folder, which
 * holds its index), the folder above it. */
static size_t run_folder(const char *path, const char **base) {
  size_t n = strlen(path);
  *base = path;
  while (n > 1 && path[n - 1] == '/') n--; /* "runs/demo/" */
  char index[ST_PATH_MAX + 48];
  struct stat sb;
  snprintf(index, sizeof index, "%.*s/model.safetensors.index.json", (int)n,
           path);
  if (stat(index, &sb) != 0 && n >= 11 &&
      !strncmp(path + n - 11, "checkpoints", 11) &&
      (n == 11 || path[n - 12] == '/')) {
    n -= 11;
    while (n > 1 && path[n - 1] == '/') n--;
    if (n == 0) *base = ".", n = 1;
  }
  return n;
}

/* A checkpoint named by the folder of the run that wrote it: its newest
 * checkpoint (a file, or a sharded one's folder). Anything else -- a file,
 * a sharded checkpoint's own folder, a path that does not exist -- is left
 * as given, for the reader's own message. A weight-streaming run keeps its
 * weights in its store (where its config.yaml puts it, DIR/store.strata by
 * default) and has checkpoints only where `strata export` wrote them: one
 * of an earlier step than the store's last commit is refused, by step
 * numbers (a copied folder's file times say nothing), as is a store never
 * exported. */
static int run_checkpoint(const char **path, char *buf, size_t cap,
                          st_error *err) {
  char dir[ST_PATH_MAX], probe[ST_PATH_MAX + 48];
  const char *base;
  size_t n = run_folder(*path, &base);
  struct stat sb;
  snprintf(probe, sizeof probe, "%.*s/checkpoints", (int)n, base);
  int run = stat(probe, &sb) == 0 && S_ISDIR(sb.st_mode);
  snprintf(probe, sizeof probe, "%.*s/store.strata", (int)n, base);
  run |= stat(probe, &sb) == 0;
  snprintf(probe, sizeof probe, "%.*s/config.yaml", (int)n, base);
  run |= stat(probe, &sb) == 0 && S_ISREG(sb.st_mode);
  if (!run) return 0;
  if (n + 48 >= sizeof dir)
    return st_error_set(err, ST_EARG,
                        "%s: a run's folder whose path is too long (%zu "
                        "bytes; at most %d)",
                        *path, n, (int)sizeof dir - 48);
  snprintf(dir, sizeof dir, "%.*s", (int)n, base);
  /* the run's store, if it keeps one: its config says where (without a
   * config that loads, the default place) */
  st_config cfg;
  st_error ignored = {0};
  const char *store = NULL;
  if (st_config_load(&cfg, probe, &ignored) == 0) {
    if (st_store_resolve(&cfg, dir) && stat(cfg.execution.store_path, &sb) == 0)
      store = cfg.execution.store_path;
  } else {
    char *at = cfg.execution.store_path;
    if (snprintf(at, sizeof cfg.execution.store_path, "%s/store.strata", dir) <
            (int)sizeof cfg.execution.store_path &&
        stat(at, &sb) == 0)
      store = at;
  }
  int64_t step = 0, committed = -1;
  if (newest_checkpoint(dir, buf, cap, &step, err)) return err->code;
  if (store && st_store_committed_step(store, &committed, err))
    return err->code;
  if (buf[0] && step >= committed) {
    *path = buf;
    return 0;
  }
  if (!store)
    return st_error_set(err, ST_EDATA,
                        "%s: a run's folder with no checkpoint in "
                        "%s/checkpoints yet",
                        *path, dir);
  char newest[64] = ", not in checkpoints";
  if (buf[0])
    snprintf(newest, sizeof newest, "; its newest checkpoint is step %lld",
             (long long)step);
  return st_error_set(err, ST_EDATA,
                      "%s: the run keeps its weights in its store (%s, step "
                      "%lld)%s: `strata export %s` writes them as a "
                      "safetensors file",
                      *path, store, (long long)committed, newest, dir);
}

/* CONFIG '-' with --checkpoint DIR, a run's folder: the run's own
 * config.yaml (as 'train - --resume DIR' takes it), so that the model and
 * the data's statistics are the run's. */
static void run_config(args *a, char *buf, size_t cap) {
  if (!a->config || strcmp(a->config, "-") || !a->checkpoint) return;
  const char *base;
  size_t n = run_folder(a->checkpoint, &base);
  struct stat sb;
  if (snprintf(buf, cap, "%.*s/config.yaml", (int)n, base) < (int)cap &&
      stat(buf, &sb) == 0 && S_ISREG(sb.st_mode))
    a->config = buf;
}

/* Appends to err's message the checkpoint a run can go back to: the
 * newest in DIR other than `skip` (a damaged one), when there is one. With
 * t (the resume that refused `skip`), that one is checked as t would
 * resume from it: refused too, it is the config that is not the run's
 * (another width, optimizer, ...), and it is said so, not that `skip` is
 * damaged and should be moved aside. */
static void name_fallback(const char *dir, const char *skip,
                          const st_trainer *t, st_error *err) {
  int64_t *steps;
  st_error e = {0};
  int n = st_run_checkpoints(dir, &steps, &e);
  char path[ST_PATH_MAX + 64] = "";
  for (int i = n - 1; i >= 0 && !path[0]; i--) {
    st_run_checkpoint_path(dir, steps[i], path, sizeof path);
    if (skip && !strcmp(path, skip)) path[0] = '\0';
  }
  if (n >= 0) free(steps);
  if (!path[0]) return;
  char msg[sizeof err->msg];
  snprintf(msg, sizeof msg, "%s", err->msg);
  st_error older = {0};
  if (t && st_trainer_check_resume(t, path, &older))
    st_error_set(err, err->code,
                 "%s; the older %s is refused too: it is the config that "
                 "differs from the run's",
                 msg, path);
  else if (skip)
    st_error_set(err, err->code,
                 "%s; the older %s is there to go back to (move the damaged "
                 "one aside)",
                 msg, path);
  else
    st_error_set(err, err->code,
                 "%s; the newest checkpoint, %s, is there to go back to", msg,
                 path);
}

/* Whether DIR/summary.json is a finished run's (not an interrupted one's). */
static int summary_says_done(const char *dir) {
  char path[ST_PATH_MAX + 16], text[8192];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return strstr(text, "\"interrupted\": false") != NULL;
}

/* What --overwrite set aside in the run's folder ("" for nothing). */
static char overwritten[256];

/* A fresh run refused before its first step takes back what it made: its
 * config.yaml (when DIR had none), an empty checkpoints/ and DIR itself
 * (when it made DIR), and puts back the run --overwrite set aside. Nothing
 * else: a plan `strata compile` wrote there, or a store (perhaps another
 * run's, at a shared execution.store_path), stays. The folder's lock is
 * held to the exit; rmdir does not need it. */
static void abandon(const char *dir, const char *store, int had_dir,
                    int had_config) {
  char path[ST_PATH_MAX + 16];
  if (!had_config) {
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/checkpoints", dir);
  rmdir(path); /* only when empty, as the folder's */
  if (overwritten[0]) st_run_put_back(dir, store);
  if (!had_dir) rmdir(dir);
}

/* Whether path is absent or a config a run wrote (its first line, as
 * st_config_write begins it). */
#define CONFIG_HEADER "# strata config, fully resolved"
static int written_by_run(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return errno == ENOENT;
  char line[64] = "";
  int ours = fgets(line, sizeof line, f) &&
             !strncmp(line, CONFIG_HEADER, strlen(CONFIG_HEADER));
  fclose(f);
  return ours;
}

/* Whether DIR may take this run: a fresh one must not overwrite an earlier
 * run's work unless told to (--overwrite, which sets it aside first); a
 * resumed one needs the run's config.yaml. The filesystem root is refused. */
static int check_out(const char *dir, const args *a, const char *store,
                     st_error *err) {
  char real[PATH_MAX], what[256], path[ST_PATH_MAX + 16];
  struct stat sb;
  if (realpath(dir, real) && strcmp(real, "/") == 0)
    return st_error_set(err, ST_EARG,
                        "%s: the filesystem root cannot hold a run; give "
                        "--out DIR",
                        dir);
  /* what is there and no run wrote is the user's: never written over, nor
   * removed by --overwrite (a store path naming another file, or DIR
   * holding a config.yaml of its own: `train config.yaml --out .` wrote
   * the resolved config over the one it read) */
  int64_t step;
  st_error not_store = {0};
  int unread = store && stat(store, &sb) == 0 && !S_ISDIR(sb.st_mode)
                   ? st_store_committed_step(store, &step, &not_store)
                   : 0;
  /* a store, damaged or of another version: its own error says which */
  if (unread && unread != ST_EFORMAT) {
    *err = not_store;
    return unread;
  }
  if (store && stat(store, &sb) == 0 && (S_ISDIR(sb.st_mode) || unread))
    return st_error_set(
        err, ST_ECONFIG,
        "execution.store_path: %s is not a weight store (%s): "
        "a run makes its store there, and never over "
        "another file; give another path",
        store, S_ISDIR(sb.st_mode) ? "a directory" : "no store header");
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  if (!a->resume && !written_by_run(path))
    return st_error_set(err, ST_ECONFIG,
                        "%s: not a run's config (strata writes a run's "
                        "resolved config there, and never over a file of "
                        "yours): give another --out",
                        path);
  if (a->resume) {
    if (access(path, F_OK) != 0)
      return st_error_set(err, ST_EIO, "%s: cannot open: no run to resume",
                          path);
    return st_run_lock(dir, err);
  }
  /* one process a folder: two runs in one would mix their files */
  int rc = st_run_lock(dir, err);
  if (rc) return rc;
  if (!st_run_describe(dir, store, what, sizeof what)) return 0;
  if (!a->overwrite)
    return st_error_set(err, ST_ECONFIG,
                        "%s: holds an earlier run (%s): --resume %s "
                        "continues it, --overwrite replaces it, or give "
                        "another --out",
                        dir, what, dir);
  /* removed once this run has started (main: st_run_drop_aside) */
  rc = st_run_set_aside(dir, store, err);
  if (!rc) snprintf(overwritten, sizeof overwritten, "%s", what);
  return rc;
}

/* DIR/config.yaml, the config as given (before the trainer rescales the
 * optimizer for optimizer.reference_batch): `--resume DIR -` and
 * `compile DIR/config.yaml` read it back as this run's config. Makes DIR
 * and DIR/checkpoints, refusing what is in their way. */
static int write_config(const char *dir, const st_config *cfg, st_error *err) {
  int rc = st_run_prepare(dir, err);
  if (rc) return rc;
  char path[ST_PATH_MAX + 16], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "out of memory");
  st_config_write(cfg, f);
  return st_write_stream_atomic(f, &text, &len, path, err);
}

/* A resume may change keys (train.steps to go on, a new lr, more threads):
 * those that would not continue the same run are refused with the
 * checkpoint (st_trainer_load); the rest are said in one line, naming each
 * with its value in the run's DIR/config.yaml and the new one, before
 * config.yaml is rewritten with them. Nothing said when it cannot be read
 * (the resume goes on as before). */
static void notice_changes(const char *dir, const st_config *cfg) {
  char path[ST_PATH_MAX + 16], *text = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  st_config run;
  st_error ignored = {0};
  st_config_defaults(&run);
  if (st_config_load(&run, path, &ignored)) return;
  FILE *f = open_memstream(&text, &len);
  if (!f) return;
  int n = st_config_changes(&run, cfg, f);
  if (fclose(f) == 0 && n > 0)
    fprintf(stderr,
            "strata: notice: --resume: %d key%s differ%s from the run's %s: "
            "%s; the run goes on with the new value%s, which %s now holds\n",
            n, n == 1 ? "" : "s", n == 1 ? "s" : "", path, text,
            n == 1 ? "" : "s", path);
  free(text);
}

/* Compiles cfg and writes DIR/plan.json and DIR/plan.svg; prints one line. */
static int compile_into(st_plan **plan, const st_config *cfg, int stages,
                        const char *dir, st_error *err) {
  char json[ST_PATH_MAX + 16], svg[ST_PATH_MAX + 16];
  snprintf(json, sizeof json, "%s/plan.json", dir);
  snprintf(svg, sizeof svg, "%s/plan.svg", dir);
  /* planned as the run holds its memory: over ranks, each rank its own
   * share of what its machine gives it */
  st_config launched = *cfg;
  launched.launch.ranks = st_dist_size();
  launched.launch.per_machine = st_dist_local_size();
  int rc = st_plan_compile(plan, &launched, stages, err);
  if (!rc) rc = st_plan_place_ranks(*plan, &launched, err);
  if (rc) {
    st_plan_destroy(*plan);
    *plan = NULL;
    return rc;
  }
  /* a plan that cannot be made is reported; one that cannot be written
   * stops the run, like any output file (ST_EIO) */
  rc = st_plan_write_json(*plan, json, err);
  if (!rc) rc = st_plan_write_svg(*plan, svg, err);
  if (rc) {
    st_plan_destroy(*plan);
    *plan = NULL;
    return ST_EIO;
  }
  printf("strata: plan: %d stage%s on %s; wrote %s and plan.svg\n",
         (*plan)->n_stages, (*plan)->n_stages == 1 ? "" : "s",
         (*plan)->fabric.name, json);
  return 0;
}

/* Weight streaming: what crossed between the store and the compute side,
 * the compute side's waits and what it held. */
static void print_stream(const st_trainer *t) {
  st_stream_stats s;
  double wall = 0;
  if (st_trainer_stream_stats(t, &s) || s.steps < 1) return;
  double peak = st_peak_resident();
  const char *store = st_trainer_store(t);
  if (store)
    printf("strata: store %s (%s weights) committed step %lld; peak "
           "resident memory %.2f GiB (VmHWM)\n",
           store, st_trainer_config(t)->execution.store_weights,
           (long long)st_trainer_pos(t)->step,
           peak < 0 ? -1.0 : (double)peak / (1u << 30));
  st_trainer_stats(t, NULL, 0, &wall);
  double mb = 1024.0 * 1024.0, per = (double)s.steps;
  if (st_dist_size() > 1) { /* this is the store rank */
    printf("strata: weight streaming over %d ranks: the store (rank 0) sent "
           "%.1f MB of weights and received %.1f MB of gradients per step; "
           "of its step time, waiting for the optimizer thread %.1f%%, the "
           "last update %.1f%% (each rank's memory and traffic above)\n",
           st_dist_size(), (double)s.bytes_out / per / mb,
           (double)s.bytes_in / per / mb,
           wall > 0 ? 100 * s.wait_optimizer_s / wall : 0,
           wall > 0 ? 100 * s.last_update_s / wall : 0);
    return;
  }
  printf("strata: weight streaming: %.1f MB per step from the store, %.1f "
         "MB of gradients to it; of the step time, waiting for weights "
         "%.1f%%, for the store's optimizer thread %.1f%%, its last update "
         "(on the compute cores) %.1f%%; at most %d block%s of weights held, "
         "compute-side buffers %.1f MB\n",
         (double)s.bytes_in / per / mb, (double)s.bytes_out / per / mb,
         wall > 0 ? 100 * s.stall_s / wall : 0,
         wall > 0 ? 100 * s.wait_optimizer_s / wall : 0,
         wall > 0 ? 100 * s.last_update_s / wall : 0, s.max_blocks_held,
         s.max_blocks_held == 1 ? "" : "s", (double)s.compute_bytes / mb);
}

/* Where the pipeline's time went: each stage's busy fraction and its
 * measured time per sample beside the plan's prediction (where the plan
 * cut the same blocks), and the measured utilization beside the plan's and
 * the bubble formula's. `samples`: trained by this process. */
static void print_stages(const st_trainer *t, const st_config *c,
                         const st_plan *plan, int64_t samples) {
  if (!strcmp(c->execution.mode, "weight_streaming")) {
    print_stream(t);
    return;
  }
  if (!strcmp(c->execution.mode, "sequential") && c->execution.replicas == 1)
    return;
  double wall = 0, bubble = 1;
  int n = st_trainer_stats(t, NULL, 0, &wall);
  st_track_stats *st = malloc((size_t)n * sizeof *st);
  if (!st || wall <= 0 || samples <= 0) {
    free(st);
    return;
  }
  st_trainer_stats(t, st, n, &wall);
  /* pipelined backprop's replay: the utilization its busy times allow */
  double busy = 0, bound = n > 0 ? st[0].bound_s : 0;
  for (int i = 0; i < n; i++) busy += st[i].busy_s;
  /* each replica's stages see its share of the samples; over ranks data
   * parallel (execution.replicas 1 takes the ranks) a rank's */
  int shares = st_dist_size() > 1 && strcmp(c->execution.placement, "ranks")
                   ? st_dist_size()
                   : c->execution.replicas;
  double per = (double)samples / shares;
  printf("strata: stage          blocks   busy   measured/sample   "
         "planned/sample\n");
  for (int i = 0; i < n; i++) {
    char blocks[32], planned[32] = "-";
    snprintf(blocks, sizeof blocks, "%d-%d", st[i].first,
             st[i].first + st[i].count - 1);
    for (int k = 0; plan && k < plan->n_stages; k++)
      if (plan->stages[k].first == st[i].first &&
          plan->stages[k].count == st[i].count)
        snprintf(planned, sizeof planned, "%.1f us",
                 plan->stages[k].time * 1e6);
    printf("strata:   %-18s %-6s %5.2f   %12.1f us   %14s\n", st[i].name,
           blocks, st[i].busy_s / wall, st[i].busy_s / per * 1e6, planned);
  }
  free(st);
  double util = st_trainer_utilization(t, &bubble);
  int S = st_trainer_stages(t);
  if (!strcmp(c->execution.mode, "sequential")) { /* replicas, no pipeline */
    printf("strata: replica utilization %.2f measured (busy share of the "
           "wall time; one stage each, no pipeline bubble)\n",
           util);
    return;
  }
  printf("strata: pipeline utilization %.2f measured", util);
  if (plan && plan->n_stages == S && c->execution.replicas == 1 &&
      strcmp(c->execution.mode, "block_sequential") != 0)
    printf(", %.2f planned (stage balance %.2f)",
           plan->balance * (strcmp(c->execution.mode, "pipelined_backprop")
                                ? plan->util_fill_drain
                                : plan->util_pipelined),
           plan->balance);
  if (!strcmp(c->execution.mode, "pipelined_backprop")) {
    printf(", 1.00 in steady state for a never-drained pipeline of %d "
           "stages%s\n",
           S,
           c->execution.emulate ? " (emulated: one thread runs them all)" : "");
    if (bound > 0 && !c->execution.emulate)
      printf("strata: the stages' own busy times allow %.2f (replayed with "
             "free hand-offs); the hand-offs and the runtime cost the "
             "rest\n",
             busy / n / bound);
  } else {
    const char *sched = strcmp(c->execution.mode, "pipeline") == 0
                            ? c->execution.schedule
                            : "gpipe";
    /* the closed forms hold for whole groups of S micro-batches
     * (interleaved) and for M >= S (zb1p); otherwise the figure is the
     * schedule's span on the emulated clock (st_schedule_formula) */
    int share = c->train.batch / shares;
    int mb = c->execution.micro_batch > 0 && c->execution.micro_batch < share
                 ? c->execution.micro_batch
                 : share;
    int M = mb > 0 ? share / mb : 1;
    const char *form = !strcmp(sched, "zb1p")
                           ? (M >= S ? "; (S-1)/3M of the ideal"
                                     : "; its span on the emulated clock, "
                                       "M < S")
                       : !strcmp(sched, "interleaved")
                           ? (M % S == 0 ? "; (S-1)/VM of the ideal"
                                         : "; its span on the emulated clock, "
                                           "M not a multiple of S")
                           : "; M/(M+S-1)";
    printf(", %.2f by %s's bubble at S = %d (ops of equal cost%s)\n", bubble,
           sched, S, form);
  }
}

/* The first SIGINT or SIGTERM asks the run to stop after its step; the
 * second takes the signal's own action (the process ends; what was written
 * is whole: every write is atomic). */
static void on_stop(int sig) {
  if (st_run_request_stop(sig)) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
  st_run_say_durable();
}

/* The command line's own faults, before anything is read. */
static int train_usage(const args *a) {
  const char *given = a->resume ? a->resume : a->out;
  if (!a->config)
    return st_cli_usage_error(usage_train, "train needs a CONFIG%s", "");
  if (a->resume && a->overwrite)
    return st_cli_usage_error(usage_train,
                              "--overwrite replaces a run and --resume "
                              "continues one: give one of the two%s",
                              "");
  if (a->resume && a->out)
    return st_cli_usage_error(usage_train,
                              "--resume DIR continues the run in DIR; --out "
                              "names another (give one of the two)%s",
                              "");
  if (given && !given[0])
    return st_cli_usage_error(usage_train, "%s: an empty path is no directory",
                              a->resume ? "--resume" : "--out");
  return 0;
}

static int cmd_train(int argc, char **argv) {
  args a = {0};
  int rc = parse_args(argc, argv, &a, usage_train);
  if (!rc && a.help) {
    fputs(usage_train, stdout);
    putchar('\n');
    st_config_print_schema(stdout);
    return 0;
  }
  if (!rc) rc = train_usage(&a);
  /* over ranks, mpirun gives each the same command line as a rule: the
   * fault is said once, by rank 0 (with the synopsis), or by rank 0 for the
   * first rank that has one alone; every rank then ends with no abort */
  if (st_dist_size() > 1) {
    st_error uerr = {0};
    if (rc) st_error_set(&uerr, ST_EARG, "%s", st_cli_usage_pending());
    if (st_dist_agree(rc ? ST_EARG : 0, &uerr)) {
      if (!rc && st_dist_rank() == 0)
        fprintf(stderr, "strata: error: %s\n", uerr.msg);
      return 2;
    }
  }
  if (rc) return rc;
  st_error err = {0};
  st_config cfg;
  /* over ranks the same config fails the same way on each: said once;
   * from here a rank that stops answering ends the job, not hangs it */
  rc = load_config(&cfg, &a, &err);
  /* SIGINT, SIGTERM: the run stops after its step with a checkpoint; a
   * second one ends the process at once (on_stop). Not before the config
   * is read: nothing is written until then, and a config that is a FIFO
   * with no writer would hold the open against the first signal. */
  struct sigaction sa = {.sa_handler = on_stop, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  if (!rc) st_dist_watch(cfg.execution.rank_timeout);
  if (st_dist_agree(rc, &err)) return st_cli_fail(&err);
  /* keys the setting does not read: said once, and the run goes on */
  if (st_dist_rank() == 0) st_cli_notice_unused(&cfg);
  char out[ST_PATH_MAX];
  const char *given = a.resume ? a.resume : a.out;
  if (given)
    snprintf(out, sizeof out, "%s", given);
  else
    st_cli_default_out(out, sizeof out, a.config);
  /* The run's directory, checked before anything is loaded or made: rank 0
   * decides (it writes the files) and every rank learns the outcome. A file
   * store is the run's checkpoint: resumed from, never overwritten. */
  st_config kept = cfg;
  int stored = st_store_resolve(&kept, out);
  const char *store = stored ? kept.execution.store_path : NULL;
  int speaks = st_dist_rank() == 0;
  struct stat sb;
  char cfg_path[ST_PATH_MAX + 16];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.yaml", out);
  const int had_out = stat(out, &sb) == 0,
            had_config = stat(cfg_path, &sb) == 0;
  const int fresh = speaks && !a.resume;
  if (st_dist_agree(speaks ? check_out(out, &a, store, &err) : 0, &err))
    return st_cli_fail(&err);
  /* --resume of a run killed before its first checkpoint: from step 0 */
  char ck[ST_PATH_MAX + 64] = "";
  int64_t ck_step = 0;
  if (a.resume && !stored &&
      st_dist_agree(newest_checkpoint(out, ck, sizeof ck, &ck_step, &err),
                    &err))
    return st_cli_fail(&err);
  int fresh_resume =
      a.resume && (stored ? stat(store, &sb) != 0 : ck[0] == '\0');
  /* a run that wrote its summary wrote a checkpoint (or committed its
   * store) first: none now means it was removed, not never written */
  char summary[ST_PATH_MAX + 16];
  snprintf(summary, sizeof summary, "%s/summary.json", out);
  int gone = 0;
  if (speaks && fresh_resume) gone = state_elsewhere(out, stored, store, &err);
  if (speaks && fresh_resume && !gone && stat(summary, &sb) == 0) {
    gone = ST_EIO;
    st_error_set(&err, ST_EIO,
                 "%s: %s, yet %s says the run took steps: it cannot "
                 "continue (--overwrite starts it again)",
                 stored ? store : out,
                 stored ? "no store" : "no checkpoint in checkpoints/",
                 summary);
  }
  if (st_dist_agree(gone, &err)) return st_cli_fail(&err);
  /* the trace is written at the end: its folder is checked now */
  if (a.trace && speaks && st_cli_out_folder("--trace", a.trace, &err))
    rc = err.code;
  else if (a.trace && speaks) {
    char folder[ST_PATH_MAX];
    snprintf(folder, sizeof folder, "%s", a.trace);
    char *slash = strrchr(folder, '/');
    if (slash) *slash = '\0';
    const char *where = !slash ? "." : folder[0] ? folder : "/";
    rc = access(where, W_OK | X_OK)
             ? st_error_set(&err, ST_EIO, "%s: cannot write: %s", a.trace,
                            strerror(errno))
             : 0;
  }
  if (st_dist_agree(rc, &err)) {
    if (fresh) abandon(out, store, had_out, had_config);
    return st_cli_fail(&err);
  }
  /* A fresh run's config.yaml comes first, so a kill at any later moment
   * leaves a directory that --resume continues (a resumed run rewrites it
   * once its checkpoint has been checked against the config). */
  if (!a.resume &&
      st_dist_agree(speaks ? write_config(out, &cfg, &err) : 0, &err)) {
    if (fresh) abandon(out, store, had_out, had_config);
    return st_cli_fail(&err);
  }
  /* Over MPI ranks, rank 0 alone prints and writes the run's files. */
  if (!speaks && !freopen("/dev/null", "w", stdout)) {
    st_error_set(&err, ST_EIO, "/dev/null: %s", strerror(errno));
    return st_cli_fail(&err);
  }
  st_trainer *t;
  if (st_trainer_create(&t, &cfg, speaks ? out : NULL, &err)) {
    if (fresh) abandon(out, store, had_out, had_config);
    return st_cli_fail(&err);
  }
  if (overwritten[0]) {
    st_error gone = {0};
    if (st_run_drop_aside(out, &gone))
      fprintf(stderr, "strata: warning: --overwrite: %s\n", gone.msg);
    else
      printf("strata: --overwrite: removed the earlier run in %s (%s)\n", out,
             overwritten);
  }
  const st_model *m = st_trainer_model(t);
  int W = st_dist_size(), R = cfg.execution.replicas;
  int share = cfg.train.batch / R; /* the samples of a replica or a rank */
  if (W > 1 && strcmp(cfg.execution.placement, "ranks") != 0)
    share = cfg.train.batch /
            (!strcmp(cfg.execution.mode, "weight_streaming") ? W - 1 : W);
  if (W > 1 && !strcmp(cfg.execution.placement, "ranks"))
    printf("strata: %d MPI ranks: %d replica%s of %d samples per step, each "
           "a pipeline over %d ranks that hold only their own stages\n",
           W, R, R == 1 ? "" : "s", cfg.train.batch / R, W / R);
  else if (W > 1 && !strcmp(cfg.execution.mode, "weight_streaming"))
    printf("strata: %d MPI ranks: rank 0 the store of the weights and "
           "optimizer state, %d compute rank%s of %d samples per step\n",
           W, W - 1, W == 2 ? "" : "s", cfg.train.batch / (W - 1));
  else if (W > 1)
    printf("strata: %d MPI ranks, each a replica of %d samples per step\n", W,
           cfg.train.batch / W);
  printf("strata: %s model, %d blocks, %zu parameters; mode %s, batch %d, "
         "%lld steps, %s\n",
         m->kind, m->n_blocks, m->n_params, cfg.execution.mode, cfg.train.batch,
         (long long)st_trainer_total_steps(t), st_blas_name());
  if (!strcmp(cfg.train.precision, "bf16")) {
    printf("strata: precision bf16: products on bf16 inputs, fp32 sums, "
           "fp32 master weights; %s\n",
           st_bf16_support());
    /* each product rounds and lays out its weights anew: at a few rows that
     * costs more than the products save (MLP, Zen 4: 0.25x fp32's rate at
     * batch 1, 0.75x at 16, 1.4x at 32 and 256; docs/bf16.md) */
    int each =
        st_trainer_micro_batch(t) < share ? st_trainer_micro_batch(t) : share;
    long rows = (long)each * m->label_rows;
    if (rows < 32)
      printf("strata: notice: %ld row%s per product: bf16 is slower than "
             "fp32 below about 32 (docs/bf16.md)\n",
             rows, rows == 1 ? "" : "s");
    /* what the calibration profile measured of both on this CPU */
    double bf, f32;
    if (st_bf16_profile_rates(&bf, &f32) && bf < f32)
      printf("strata: notice: on this CPU bf16's products ran slower than "
             "fp32's (%.0f against %.0f GFLOP/s a thread, calibration "
             "profile): bf16 here saves memory, not time (docs/bf16.md)\n",
             bf / 1e9, f32 / 1e9);
  }
  { /* as they run, as the plan counts them */
    double *flops = malloc((size_t)m->n_blocks * sizeof *flops);
    int ok = flops && !st_plan_run_flops(m, &cfg, flops, NULL, NULL);
    st_model_print(m, ok ? flops : NULL, stdout);
    free(flops);
  }
  if (cfg.optimizer.reference_batch > 0) {
    const st_config *run = st_trainer_config(t);
    int pb = !strcmp(cfg.execution.mode, "pipelined_backprop");
    int each = pb ? (cfg.execution.micro_batch ? cfg.execution.micro_batch : 1)
                  : cfg.train.batch;
    printf("strata: optimizer tuned at batch %d (lr %g, momentum %g); every "
           "update sees %d sample%s: lr %.6g, momentum %.6g "
           "(optimizer.reference_batch)\n",
           cfg.optimizer.reference_batch, (double)cfg.optimizer.lr,
           (double)cfg.optimizer.momentum, each, each == 1 ? "" : "s",
           (double)run->optimizer.lr, (double)run->optimizer.momentum);
  }
  if (fresh_resume) {
    printf("strata: %s: no checkpoint yet (the run stopped before its "
           "first); starting at step 0\n",
           out);
  } else if (a.resume && stored) {
    printf("strata: resumed from the store %s at step %lld\n",
           kept.execution.store_path, (long long)st_trainer_pos(t)->step);
  } else if (a.resume) {
    rc = st_trainer_load(t, ck, 0, &err);
    /* the newest is found by its name: a file that holds another step
     * (renamed, copied in) would resume somewhere else than it says */
    if (!rc && st_trainer_pos(t)->step != ck_step)
      rc = st_error_set(&err, ST_EFORMAT,
                        "%s: holds step %lld, but its name says step %lld: "
                        "a renamed or misplaced checkpoint",
                        ck, (long long)st_trainer_pos(t)->step,
                        (long long)ck_step);
    /* every rank reads the same file: said once (or by the rank that
     * failed alone) */
    if (st_dist_size() > 1) rc = st_dist_agree(rc, &err);
    if (rc) {
      if (rc == ST_EFORMAT) name_fallback(out, ck, t, &err);
      st_trainer_destroy(t);
      return st_cli_fail(&err);
    }
    printf("strata: resumed from %s at step %lld\n", ck,
           (long long)st_trainer_pos(t)->step);
  }
  /* over MPI ranks: every rank resumed from the same step; the config
   * that continues the run is its config.yaml from here on */
  if (st_dist_check_same((uint64_t)st_trainer_pos(t)->step, "step resumed from",
                         &err)) {
    st_trainer_destroy(t);
    return st_cli_fail(&err);
  }
  /* a finished run: its summary, plan and files stay as they are (one
   * killed after its last step, before its summary, runs the rest: the
   * final evaluation and the summary) */
  int done = speaks && a.resume &&
             st_trainer_pos(t)->step >= st_trainer_total_steps(t) &&
             summary_says_done(out);
  if (st_dist_max(&done, &err)) { /* rank 0's files decide for every rank */
    st_trainer_destroy(t);
    return st_cli_fail(&err);
  }
  if (done) {
    if (speaks)
      printf("strata: %s finished at step %lld of %lld: nothing to train, "
             "nothing rewritten (--set train.steps=N continues it)\n",
             out, (long long)st_trainer_pos(t)->step,
             (long long)st_trainer_total_steps(t));
    st_trainer_destroy(t);
    return 0;
  }
  if (a.resume && speaks) notice_changes(out, &cfg);
  if ((a.resume &&
       st_dist_agree(speaks ? write_config(out, &cfg, &err) : 0, &err))) {
    st_trainer_destroy(t);
    return st_cli_fail(&err);
  }
  /* Compile first (DESIGN.md): the plan the run follows — one stage for the
   * sequential mode — beside the run's other files. A plan that cannot be
   * made does not stop a sequential run; it is reported. */
  st_plan *plan = NULL;
  st_fabric fab;
  if (speaks && !st_fabric_resolve(&fab, &cfg, &err) &&
      st_trainer_stages(t) > fab.pes) {
    /* more stages than cores: the run shares them; a plan gives each
     * stage a core of its own, so there is none to compare with (over
     * ranks too: the plan's error named a --stages no one gave) */
    printf("strata: no plan: the run's %d stages share the %lld cores of "
           "%s; a plan gives each stage one of its own ('strata compile' "
           "with a larger --fabric plans them)\n",
           st_trainer_stages(t), (long long)fab.pes, fab.name);
    rc = 0;
  } else {
    rc =
        speaks ? compile_into(&plan, &cfg, st_trainer_stages(t), out, &err) : 0;
  }
  if (rc && rc != ST_EIO)
    fprintf(stderr, "strata: warning: no plan: %s\n", err.msg);
  /* a fill-and-drain pipeline's schedule, drawn beside the plan */
  if (speaks && rc != ST_EIO && !strcmp(cfg.execution.mode, "pipeline")) {
    char path[ST_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/schedule.svg", out);
    /* a replica's share: over ranks data parallel, a rank's */
    int share = cfg.train.batch /
                (W > 1 && strcmp(cfg.execution.placement, "ranks") ? W : R);
    int mb = cfg.execution.micro_batch > 0 && cfg.execution.micro_batch < share
                 ? cfg.execution.micro_batch
                 : share;
    rc = st_schedule_write_svg(cfg.execution.schedule, st_trainer_stages(t),
                               share / mb,
                               strcmp(cfg.execution.schedule, "interleaved")
                                   ? 1
                                   : cfg.execution.virtual_stages,
                               path, &err);
    if (rc) rc = ST_EIO; /* like any output file */
  }
  if (st_dist_agree(rc == ST_EIO ? rc : 0, &err)) {
    st_trainer_destroy(t);
    return st_cli_fail(&err);
  }
  /* the plan's utilization: the bubble at its stage balance — for the
   * modes it describes (the printed plan cuts the whole model on all the
   * cores: not block_sequential's segments, not one replica's share) */
  int comparable = cfg.execution.replicas == 1 &&
                   strcmp(cfg.execution.mode, "block_sequential") != 0;
  /* a never-drained pipeline has no bubble; the others fill and drain */
  double plan_util = !plan ? 0
                     : strcmp(cfg.execution.mode, "pipelined_backprop")
                         ? plan->util_fill_drain
                         : plan->util_pipelined;
  if (plan)
    st_trainer_set_prediction(
        t,
        st_plan_rate(plan, !strcmp(cfg.execution.mode, "pipelined_backprop")),
        comparable && plan->n_stages == st_trainer_stages(t)
            ? plan->balance * plan_util
            : 0);
  fflush(stdout);
  if (!speaks) a.trace = NULL;
  if (a.trace && (rc = st_trainer_trace(t, 200000, &err))) {
    st_plan_destroy(plan);
    st_trainer_destroy(t);
    return st_cli_fail(&err);
  }
  int64_t samples0 = st_trainer_pos(t)->samples;
  rc = st_trainer_run(t, &err);
  /* the trace of a failed run too: that is when it is wanted most */
  if (a.trace) {
    st_error terr = {0};
    if (st_trainer_write_trace(t, a.trace, &terr) == 0)
      printf("strata: wrote trace %s\n", a.trace);
    else if (!rc)
      rc = (err = terr).code;
    else
      fprintf(stderr, "strata: warning: %s\n", terr.msg);
  }
  if (rc) {
    if (rc == ST_ENONFINITE && speaks && !st_trainer_store(t))
      name_fallback(out, NULL, NULL, &err);
    st_plan_destroy(plan);
    st_trainer_destroy(t);
    return st_cli_fail(&err);
  }
  int sig = st_run_stopped_by();
  if (sig) { /* one line on stderr, like an error: the run did not end */
    if (speaks)
      fprintf(stderr,
              "strata: stopped by %s at step %lld of %lld; wrote a %s and "
              "summary.json; 'strata train - --resume %s' continues it\n",
              sig == SIGINT    ? "SIGINT"
              : sig == SIGTERM ? "SIGTERM"
                               : "a signal",
              (long long)st_trainer_pos(t)->step,
              (long long)st_trainer_total_steps(t),
              st_trainer_store(t) ? "store commit" : "checkpoint", out);
    st_plan_destroy(plan);
    st_trainer_destroy(t);
    return 128 + sig;
  }
  double loss, acc, rate = 0;
  int text = !strcmp(m->kind, "gpt");
  if (st_trainer_last_eval(t, &loss, &acc, &rate) == 0 && text)
    printf("strata: done: %lld steps, validation loss %.4f (%.3f bits per "
           "token), next-token accuracy %.4f; wrote %s\n",
           (long long)st_trainer_pos(t)->step, loss, loss / log(2.0), acc, out);
  else if (st_trainer_last_eval(t, &loss, &acc, &rate) == 0)
    printf("strata: done: %lld steps, test accuracy %.4f, test loss %.4f; "
           "wrote %s\n",
           (long long)st_trainer_pos(t)->step, acc, loss, out);
  /* a resume at the last step takes none: nothing was measured */
  char measured[64] = "not measured (no step in this run)";
  if (rate > 0)
    snprintf(measured, sizeof measured, "measured %.0f samples/s", rate);
  /* the synchronous modes fill and drain every step: the plan's steady
   * state times the bubble (1 for one stage, and for pipelined backprop) */
  if (plan)
    printf(
        "strata: training rate: %s, plan predicted %.0f (%s%s)%s\n", measured,
        st_plan_rate(plan, !strcmp(cfg.execution.mode, "pipelined_backprop")),
        plan->fabric.name,
        plan->fabric.estimated ? ", uncalibrated estimate" : "",
        text ? "; a sample is one sequence" : "");
  else if (rate > 0) /* no plan to set beside it, but the rate is the run's */
    printf("strata: training rate: measured %.0f samples/s (no plan to "
           "compare it with)%s\n",
           rate, text ? "; a sample is one sequence" : "");
  print_stages(t, &cfg, plan, st_trainer_pos(t)->samples - samples0);
  st_plan_destroy(plan);
  st_trainer_destroy(t);
  return 0;
}

/* from to to, atomically, a megabyte at a time */
static int copy_file(const char *from, const char *to, st_error *err) {
  FILE *f = fopen(from, "rb");
  if (!f)
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", from,
                        strerror(errno));
  st_atomic_file out;
  int rc = st_atomic_open(&out, to, err);
  static char buf[1 << 20];
  size_t n;
  while (!rc && (n = fread(buf, 1, sizeof buf, f)) > 0)
    rc = st_atomic_write(&out, buf, n, err);
  if (!rc && ferror(f)) rc = st_error_set(err, ST_EIO, "%s: read failed", from);
  fclose(f);
  return st_atomic_close(&out, rc, err);
}

/* 1 if out (existing or not) lies directly in the folder dir. */
static int inside_folder(const char *out, const char *dir) {
  char parent[ST_PATH_MAX];
  snprintf(parent, sizeof parent, "%s", out);
  char *slash = strrchr(parent, '/');
  if (slash == parent) /* "/name": the root */
    parent[1] = 0;
  else if (slash)
    *slash = 0;
  else
    snprintf(parent, sizeof parent, ".");
  return st_cli_same_file(parent, dir);
}

/* export of a run without a store: its newest checkpoint as one file —
 * sharded, merged (the file a single-file checkpoint would be); one file
 * already, copied to --out. */
static int export_shards(const char *dir, const st_config *cfg,
                         const char *out) {
  st_error err = {0};
  int64_t *steps;
  int n = st_run_checkpoints(dir, &steps, &err);
  if (n < 0) return st_cli_fail(&err);
  char ck[ST_PATH_MAX + 64], path[ST_PATH_MAX + 80];
  struct stat sb;
  if (n > 0) st_run_checkpoint_path(dir, steps[n - 1], ck, sizeof ck);
  if (n == 0) {
    free(steps);
    st_error_set(&err, ST_EIO,
                 "%s: no checkpoint to export (and no store: "
                 "execution.store is not file)",
                 dir);
    return st_cli_fail(&err);
  }
  if (stat(ck, &sb) == 0 && !S_ISDIR(sb.st_mode)) { /* one file already */
    long long step = (long long)steps[n - 1];
    free(steps);
    if (!out) {
      printf("strata: %s is one file already: step %lld\n", ck, step);
      return 0;
    }
    /* read whole first (every tensor's shape and CRC, the position):
     * a damaged checkpoint is named, not passed on */
    st_model *m = NULL;
    float *params = NULL, *opt = NULL;
    int rc = st_plan_model(&m, cfg, &err);
    if (!rc) {
      size_t n = m->n_params, state = (size_t)st_optim_state_per_param(cfg) * n;
      params = st_alloc(n * sizeof *params);
      opt = st_alloc(state * sizeof *opt);
      rc = params && opt ? 0 : st_error_set(&err, ST_ENOMEM, "out of memory");
    }
    st_train_pos pos;
    if (!rc)
      rc = st_checkpoint_load(ck, m, params, opt, cfg->optimizer.kind, &pos,
                              &err);
    st_free(params);
    st_free(opt);
    st_model_destroy(m);
    if (rc || copy_file(ck, out, &err)) return st_cli_fail(&err);
    printf("strata: wrote %s: step %lld of %s\n", out, step, ck);
    return 0;
  }
  free(steps);
  /* the merged file renamed over a shard or the index, or beside them:
   * the folder it reads would no longer be the checkpoint */
  if (out && inside_folder(out, ck)) {
    st_error_set(&err, ST_EARG,
                 "--out %s is inside the sharded checkpoint %s that the "
                 "export reads: the file would be written among its shards; "
                 "give another --out",
                 out, ck);
    return st_cli_fail(&err);
  }
  if (out)
    snprintf(path, sizeof path, "%s", out);
  else
    snprintf(path, sizeof path, "%s.safetensors", ck);
  st_model *m = NULL;
  st_train_pos pos;
  int rc = st_plan_model(&m, cfg, &err);
  if (!rc) rc = st_checkpoint_merge(ck, path, m, &pos, &err);
  st_model_destroy(m);
  if (rc) return st_cli_fail(&err);
  printf("strata: wrote %s: step %lld of %s\n", path, (long long)pos.step, ck);
  return 0;
}

static int cmd_export(int argc, char **argv) {
  args a = {0};
  int rc = parse_args(argc, argv, &a, usage_export);
  if (rc) return rc;
  if (a.help) return fputs(usage_export, stdout), 0;
  if (!a.config || a.resume || a.checkpoint || a.trace || a.n_sets)
    return st_cli_usage_error(usage_export, "export takes DIR and --out FILE%s",
                              "");
  st_error err = {0};
  st_config cfg;
  a.resume = a.config; /* the run's own config.yaml */
  const char *dir = a.config;
  a.config = "-";
  struct stat sb;
  int failed = stat(dir, &sb) != 0 ? errno : 0;
  if (failed || !S_ISDIR(sb.st_mode)) {
    st_error_set(&err, ST_EIO, "%s: %s", dir,
                 failed == ENOENT ? "no such run directory"
                 : failed         ? strerror(failed)
                                  : "not a run directory (export takes one)");
    return st_cli_fail(&err);
  }
  if (st_cli_out_folder("--out", a.out, &err) || load_config(&cfg, &a, &err))
    return st_cli_fail(&err);
  /* the run's config.yaml, which the export reads, renamed over by it */
  char own[ST_PATH_MAX + 16];
  snprintf(own, sizeof own, "%s/config.yaml", dir);
  if (a.out && st_cli_same_file(a.out, own)) {
    st_error_set(&err, ST_EARG,
                 "--out %s is the run's config %s: the checkpoint would be "
                 "written over it; give another --out",
                 a.out, own);
    return st_cli_fail(&err);
  }
  if (!st_store_resolve(&cfg, dir)) return export_shards(dir, &cfg, a.out);
  if (stat(cfg.execution.store_path, &sb) != 0) {
    st_error_set(&err, ST_EIO, "%s: no store to export",
                 cfg.execution.store_path);
    return st_cli_fail(&err);
  }
  /* the store renamed over by its own export */
  if (a.out && st_cli_same_file(a.out, cfg.execution.store_path)) {
    st_error_set(&err, ST_EARG,
                 "--out %s is the run's store %s: the checkpoint would be "
                 "written over it; give another --out",
                 a.out, cfg.execution.store_path);
    return st_cli_fail(&err);
  }
  st_trainer *t;
  if (st_trainer_create(&t, &cfg, dir, &err)) return st_cli_fail(&err);
  char path[ST_PATH_MAX + 64];
  if (a.out)
    snprintf(path, sizeof path, "%s", a.out);
  else
    snprintf(path, sizeof path, "%s/checkpoints/step-%08lld.safetensors", dir,
             (long long)st_trainer_pos(t)->step);
  rc = st_trainer_save(t, path, &err);
  if (!rc)
    printf("strata: wrote %s: step %lld of %s\n", path,
           (long long)st_trainer_pos(t)->step, cfg.execution.store_path);
  st_trainer_destroy(t);
  return rc ? st_cli_fail(&err) : 0;
}

static int cmd_eval(int argc, char **argv) {
  args a = {0};
  int rc = parse_args(argc, argv, &a, usage_eval);
  if (rc) return rc;
  if (a.help) return fputs(usage_eval, stdout), 0;
  if (a.trace)
    return st_cli_usage_error(usage_eval, "--trace is an option of train%s",
                              "");
  if (!a.config || !a.checkpoint)
    return st_cli_usage_error(usage_eval,
                              "eval needs CONFIG and --checkpoint FILE%s", "");
  st_error err = {0};
  char newest[ST_PATH_MAX + 64], own[ST_PATH_MAX + 16];
  run_config(&a, own, sizeof own);
  if (run_checkpoint(&a.checkpoint, newest, sizeof newest, &err))
    return st_cli_fail(&err);
  st_config cfg;
  if (load_config(&cfg, &a, &err)) return st_cli_fail(&err);
  /* The weights come from FILE (a file store's run: its export), never
   * from a store: a file store is a run's training state, which a trainer
   * without a run's folder cannot name and no checkpoint loads into. The
   * memory store, the trainer's own fp32 slabs, takes them as it takes any
   * checkpoint (bf16 weights widen exactly, as a fetch widens them). */
  if (!strcmp(cfg.execution.mode, "weight_streaming") &&
      !strcmp(cfg.execution.store, "file")) {
    snprintf(cfg.execution.store, sizeof cfg.execution.store, "memory");
    snprintf(cfg.execution.store_weights, sizeof cfg.execution.store_weights,
             "fp32");
    cfg.execution.store_path[0] = '\0';
  }
  st_trainer *t;
  if (st_trainer_create(&t, &cfg, NULL, &err)) return st_cli_fail(&err);
  double loss, acc;
  rc = st_trainer_load(t, a.checkpoint, 1, &err);
  /* images standardised (data.normalize) or not as the weights saw them */
  int trained_norm;
  int image = strcmp(cfg.data.dataset, "text") != 0;
  if (!rc && image && st_checkpoint_normalize(a.checkpoint, &trained_norm) &&
      trained_norm != (cfg.data.normalize != 0)) {
    fprintf(stderr,
            "strata: notice: %s was trained on %s images, this config "
            "(data.normalize, %s) gives %s ones: the inputs are not those of "
            "training; evaluate with the run's config.yaml\n",
            a.checkpoint, trained_norm ? "standardised" : "raw",
            st_config_set_at(&cfg, "data.normalize"),
            trained_norm ? "raw" : "standardised");
    image = 0; /* the statistics below are beside the point */
  }
  /* images are standardised with the training set's statistics: the set
   * this config selects, which need not be the one the weights saw */
  int64_t had, now = st_trainer_train_samples(t);
  if (!rc && cfg.data.normalize && image &&
      st_checkpoint_train_samples(a.checkpoint, &had) && had != now)
    fprintf(stderr,
            "strata: notice: %s was trained on %lld samples, this config "
            "selects %lld (data.train_limit, %s): the images are "
            "standardised with other "
            "statistics than in training; evaluate with the run's "
            "config.yaml\n",
            a.checkpoint, (long long)had, (long long)now,
            st_config_set_at(&cfg, "data.train_limit"));
  /* as many samples, but other ones: its CRC-32 says so */
  uint32_t had_crc, now_crc = st_trainer_train_crc(t);
  if (!rc && cfg.data.normalize && image &&
      st_checkpoint_train_samples(a.checkpoint, &had) && had == now &&
      st_checkpoint_train_crc(a.checkpoint, &had_crc) && had_crc != now_crc)
    fprintf(stderr,
            "strata: notice: %s was trained on %lld samples of CRC-32 %08x, "
            "this config selects %lld of CRC-32 %08x (data.dataset, %s; "
            "data.dir, %s): the images are standardised with other "
            "statistics than in training; evaluate with the run's "
            "config.yaml\n",
            a.checkpoint, (long long)had, (unsigned)had_crc, (long long)now,
            (unsigned)now_crc, st_config_set_at(&cfg, "data.dataset"),
            st_config_set_at(&cfg, "data.dir"));
  if (!rc) rc = st_trainer_evaluate(t, &loss, &acc, &err);
  if (!rc && !strcmp(st_trainer_model(t)->kind, "gpt"))
    printf("validation loss %.4f, next-token accuracy %.4f (%s)\n", loss, acc,
           a.checkpoint);
  else if (!rc)
    printf("test accuracy %.4f, test loss %.4f (%s)\n", acc, loss,
           a.checkpoint);
  st_trainer_destroy(t);
  return rc ? st_cli_fail(&err) : 0;
}

/* A decimal number in [0, FLT_MAX]: it is used as a float. */
static int parse_real(const char *text, double *v) {
  return st_cli_real(text, v) && *v >= 0 && *v <= FLT_MAX;
}

static int cmd_generate(int argc, char **argv) {
  args a = {0};
  const char *prompt = NULL, *tokens = "200", *temp = "0.8", *topk = "40",
             *seed = "1";
  const st_cli_option options[] = {{"--checkpoint", &a.checkpoint, NULL},
                                   {"--prompt", &prompt, NULL},
                                   {"--tokens", &tokens, NULL},
                                   {"--temperature", &temp, NULL},
                                   {"--top-k", &topk, NULL},
                                   {"--seed", &seed, NULL},
                                   {NULL, NULL, NULL}};
  const st_cli_spec spec = {usage_generate, options,   {&a.config, NULL},
                            a.sets,         &a.n_sets, &a.help};
  int rc = st_cli_parse(argc, argv, &spec);
  if (rc) return rc;
  if (a.help) return fputs(usage_generate, stdout), 0;
  if (!a.config || !a.checkpoint || !prompt)
    return st_cli_usage_error(usage_generate,
                              "generate needs CONFIG, --checkpoint FILE and "
                              "--prompt TEXT%s",
                              "");
  uint64_t n, k, s;
  double t;
  if (!st_cli_whole(tokens, INT_MAX, &n))
    return st_cli_usage_error(usage_generate,
                              "--tokens: '%s' is not a whole number from 0 to "
                              "2147483647",
                              tokens);
  if (!parse_real(temp, &t))
    return st_cli_usage_error(usage_generate,
                              "--temperature: '%s' is not a number from 0 to "
                              "3.4e38 (a float)",
                              temp);
  if (!st_cli_whole(topk, INT_MAX, &k))
    return st_cli_usage_error(usage_generate,
                              "--top-k: '%s' is not a whole number from 0 to "
                              "2147483647",
                              topk);
  if (!st_cli_whole(seed, UINT64_MAX, &s))
    return st_cli_usage_error(usage_generate,
                              "--seed: '%s' is not a whole number from 0 to "
                              "2^64 - 1",
                              seed);
  st_error err = {0};
  char newest[ST_PATH_MAX + 64], own[ST_PATH_MAX + 16];
  run_config(&a, own, sizeof own);
  if (run_checkpoint(&a.checkpoint, newest, sizeof newest, &err))
    return st_cli_fail(&err);
  st_config cfg;
  if (load_config(&cfg, &a, &err)) return st_cli_fail(&err);
  st_generate_options o = {(int)n, (float)t, (int)k, (uint64_t)s};
  rc = st_generate(&cfg, a.checkpoint, (const uint8_t *)prompt, strlen(prompt),
                   &o, stdout, &err);
  if (rc) return st_cli_fail(&err);
  /* a line's end, so that what follows (a shell's prompt, the next
   * sample in a file) starts on a line of its own */
  fputc('\n', stdout);
  return 0;
}

static int cmd_inspect(int argc, char **argv) {
  const char *file = NULL, *against = NULL;
  int help = 0;
  const st_cli_option options[] = {{"--against", &against, NULL},
                                   {NULL, NULL, NULL}};
  const st_cli_spec spec = {usage_inspect, options, {&file, NULL},
                            NULL,          NULL,    &help};
  int rc = st_cli_parse(argc, argv, &spec);
  if (rc) return rc;
  if (help) return fputs(usage_inspect, stdout), 0;
  if (!file)
    return st_cli_usage_error(usage_inspect, "inspect needs a FILE%s", "");
  st_error err = {0};
  char newest[ST_PATH_MAX + 64], other[ST_PATH_MAX + 64];
  if (run_checkpoint(&file, newest, sizeof newest, &err) ||
      (against && run_checkpoint(&against, other, sizeof other, &err)))
    return st_cli_fail(&err);
  if (against ? st_inspect_against(file, against, stdout, &err)
              : st_inspect(file, stdout, &err))
    return st_cli_fail(&err);
  return 0;
}

/* A command's output that could not all be written (a full disk, a
 * closed file) fails the command, rather than exiting 0 with a part. */
static int output_written(int rc) {
  int e = fflush(stdout) != 0 ? errno : 0;
  if (!e && !ferror(stdout)) return rc;
  if (rc == 0)
    fprintf(stderr, "strata: error: cannot write the standard output: %s\n",
            e ? strerror(e) : "a write failed");
  return rc ? rc : 1;
}

static int run_command(int argc, char **argv);

int main(int argc, char **argv) {
  st_blas_init();
  return output_written(run_command(argc, argv));
}

static int run_command(int argc, char **argv) {
  if (argc < 2) return fputs(usage_main, stderr), 2;
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
      strcmp(cmd, "help") == 0)
    return fputs(usage_main, stdout), 0;
  if (strcmp(cmd, "train") == 0) {
    /* mpirun's processes: ranks of one run (a plain start: a world of one) */
    st_error err = {0};
    if (st_dist_init(&argc, &argv, &err)) return st_cli_fail(&err);
    int rc = cmd_train(argc - 2, argv + 2);
    /* an error only this rank has: the others may wait on it forever. A
     * stop for a signal is every rank's, but an error while stopping (rank
     * 0's checkpoint or log failing to write) is still this rank's alone */
    int sig = st_run_stopped_by();
    if (rc && !(sig && rc == 128 + sig) && st_dist_size() > 1 &&
        !st_dist_error_shared())
      st_dist_abort(rc);
    st_dist_finalize();
    return rc;
  }
  if (strcmp(cmd, "eval") == 0) return cmd_eval(argc - 2, argv + 2);
  if (strcmp(cmd, "export") == 0) return cmd_export(argc - 2, argv + 2);
  if (strcmp(cmd, "compile") == 0) return st_cli_compile(argc - 2, argv + 2);
  if (strcmp(cmd, "bench") == 0) return st_cli_bench(argc - 2, argv + 2);
  if (strcmp(cmd, "tokenize") == 0) return st_cli_tokenize(argc - 2, argv + 2);
  if (strcmp(cmd, "sweep") == 0) return st_cli_sweep(argc - 2, argv + 2);
  if (strcmp(cmd, "experiment") == 0)
    return st_cli_experiment(argc - 2, argv + 2);
  if (strcmp(cmd, "inspect") == 0) return cmd_inspect(argc - 2, argv + 2);
  if (strcmp(cmd, "generate") == 0) return cmd_generate(argc - 2, argv + 2);
  return st_cli_usage_error(usage_main, "unknown command '%s'", cmd);
}
