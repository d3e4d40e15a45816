/*
 * test_config.c — the config module: defaults, loading YAML files, --set,
 * validation, writing and reading back, and every error message a user can
 * hit (with its exact file:line:col), plus docs/config.md being in sync with
 * the schema table.
 *
 * Expected values are written out here by hand (not read from the schema
 * table), so a wrong default or a wrong offset in the table fails a check.
 * YAML files are written to /tmp with mkstemp and removed after each test.
 */
#include "harness.h"
#include "strata.h"

#include "../../src/config/schema.h" /* only for the docs sync check */

#include <dirent.h>
#include <inttypes.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */

/* Writes text to a fresh /tmp file; path receives its name. */
static void write_temp(const char *text, char path[64]) {
  strcpy(path, "/tmp/strata_cfg_XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0) {
    perror("mkstemp");
    exit(2);
  }
  size_t n = strlen(text);
  if (write(fd, text, n) != (ssize_t)n) {
    perror("write");
    exit(2);
  }
  close(fd);
}

/* Loads YAML text over cfg; the file's name goes to path (already removed
 * when this returns, but messages still carry it). */
static int load_text(st_config *cfg, const char *text, char path[64],
                     st_error *err) {
  write_temp(text, path);
  int rc = st_config_load(cfg, path, err);
  unlink(path);
  return rc;
}

/* The public fields: everything between `path` and the hidden origins.
 * Defaults, loads and sets zero whole fields first, so memcmp is exact. */
static int same_settings(const st_config *a, const st_config *b) {
  size_t from = offsetof(st_config, model), to = offsetof(st_config, origin);
  return memcmp((const char *)a + from, (const char *)b + from, to - from) == 0;
}

/* Loading `yaml` fails with `code` and exactly the message `want`, in which
 * every %s is replaced by the temp file's path. */
static void expect_load_error(const char *yaml, int code, const char *want,
                              int line) {
  st_config cfg;
  st_error err = {0};
  char path[64], expected[1024];
  st_config_defaults(&cfg);
  int rc = load_text(&cfg, yaml, path, &err);
  snprintf(expected, sizeof expected, want, path, path);
  CHECK(rc == code, "line %d: rc %d, want %d (msg: %s)", line, rc, code,
        err.msg);
  CHECK(err.code == code, "line %d: err.code %d", line, err.code);
  CHECK(strcmp(err.msg, expected) == 0, "line %d:\n  got  '%s'\n  want '%s'",
        line, err.msg, expected);
}
#define LOAD_ERROR(yaml, want)                                                 \
  expect_load_error(yaml, ST_ECONFIG, want, __LINE__)

/* st_config_set(assignment) fails with exactly `want`. */
static void expect_set_error(const char *assignment, const char *want,
                             int line) {
  st_config cfg, before;
  st_error err = {0};
  st_config_defaults(&cfg);
  before = cfg;
  int rc = st_config_set(&cfg, assignment, &err);
  CHECK(rc == ST_ECONFIG, "line %d: --set %s: rc %d", line, assignment, rc);
  CHECK(strcmp(err.msg, want) == 0, "line %d:\n  got  '%s'\n  want '%s'", line,
        err.msg, want);
  CHECK(memcmp(&cfg, &before, sizeof cfg) == 0,
        "line %d: failed --set %s changed the config", line, assignment);
}
#define SET_ERROR(assignment, want) expect_set_error(assignment, want, __LINE__)

/* Applies the NULL-terminated sets (each must succeed), then validation
 * must fail with exactly `want`. */
static void expect_invalid(const char *const *sets, const char *want,
                           int line) {
  st_config cfg;
  st_error err = {0};
  st_config_defaults(&cfg);
  for (int i = 0; sets[i]; i++) {
    int rc = st_config_set(&cfg, sets[i], &err);
    CHECK(rc == 0, "line %d: --set %s: %s", line, sets[i], err.msg);
  }
  int rc = st_config_validate(&cfg, &err);
  CHECK(rc == ST_ECONFIG, "line %d: validate rc %d, want ST_ECONFIG", line, rc);
  CHECK(strcmp(err.msg, want) == 0, "line %d:\n  got  '%s'\n  want '%s'", line,
        err.msg, want);
}
#define INVALID(want, ...)                                                     \
  expect_invalid((const char *const[]){__VA_ARGS__, NULL}, want, __LINE__)

static int list_is(const st_int_list *l, int n, const int *v) {
  if (l->n != n) return 0;
  for (int i = 0; i < n; i++)
    if (l->v[i] != v[i]) return 0;
  return 1;
}
#define LIST_IS(l, ...)                                                        \
  list_is(&(l), (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)),             \
          (int[]){__VA_ARGS__})

/* Captures what fn writes to a FILE into a malloc'ed string. */
static char *capture(void (*fn)(FILE *, const void *), const void *arg) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  fn(f, arg);
  fclose(f);
  return buf;
}

static void print_schema(FILE *f, const void *arg) {
  (void)arg;
  st_config_print_schema(f);
}
static void write_config(FILE *f, const void *arg) { st_config_write(arg, f); }
static void schema_markdown(FILE *f, const void *arg) {
  (void)arg;
  st_config_schema_markdown(f);
}

/* Every key, written out independently of the table: the user interface. */
static const char *const all_keys[] = {
    "model.kind",
    "model.hidden",
    "model.activation",
    "model.dropout",
    "model.norm",
    "model.groups",
    "model.channels",
    "model.kernel",
    "model.residual_blocks",
    "model.pool",
    "model.dense",
    "model.classes",
    "model.vocab",
    "model.context",
    "model.layers",
    "model.heads",
    "model.width",
    "model.mlp_ratio",
    "model.tied",
    "model.positions",
    "model.rotary_dim",
    "data.dataset",
    "data.dir",
    "data.train_limit",
    "data.test_limit",
    "data.shuffle",
    "data.normalize",
    "data.path",
    "data.tokenizer",
    "data.encoding",
    "data.val_fraction",
    "optimizer.kind",
    "optimizer.lr",
    "optimizer.momentum",
    "optimizer.nesterov",
    "optimizer.weight_decay",
    "optimizer.beta1",
    "optimizer.beta2",
    "optimizer.eps",
    "optimizer.schedule",
    "optimizer.warmup_steps",
    "optimizer.min_lr",
    "optimizer.step_size",
    "optimizer.gamma",
    "optimizer.reference_batch",
    "train.batch",
    "train.epochs",
    "train.steps",
    "train.seed",
    "train.eval_every",
    "train.checkpoint_every",
    "train.threads",
    "train.keep_checkpoints",
    "train.flush_subnormals",
    "execution.mode",
    "execution.micro_batch",
    "execution.schedule",
    "execution.stages",
    "execution.blocks_per_segment",
    "execution.replicas",
    "execution.placement",
    "execution.deterministic",
    "execution.pin",
    "execution.fused_update",
    "execution.mitigation",
    "execution.emulate",
    "execution.pipemare_warmup",
    "execution.pipemare_gamma",
    "execution.store",
    "execution.store_path",
    "execution.store_weights",
    "execution.store_rounding",
    "execution.prefetch",
    "execution.keep_activations",
    "execution.compute_memory_limit",
    "fabric.kind",
    "fabric.cores",
    "fabric.width",
    "fabric.height",
    "fabric.pe_flops",
    "fabric.pe_memory",
    "fabric.link_bandwidth",
    "metrics.log_every",
    "metrics.progress",
    "metrics.noise_scale",
    "metrics.noise_ema",
};
enum { N_KEYS = sizeof all_keys / sizeof all_keys[0] };

/* --------------------------------------------------------------- tests */

static void test_defaults(void) {
  st_config c;
  memset(&c, 0xAB, sizeof c); /* defaults must overwrite every byte we read */
  st_config_defaults(&c);
  CHECK(!strcmp(c.path, ""), "path '%s'", c.path);
  CHECK(!strcmp(c.model.kind, "mlp"), "model.kind");
  CHECK(LIST_IS(c.model.hidden, 256, 256), "model.hidden");
  CHECK(!strcmp(c.model.activation, "relu"), "model.activation");
  CHECK(c.model.dropout == 0.0f, "model.dropout");
  CHECK(!strcmp(c.model.norm, "none"), "model.norm");
  CHECK(c.model.groups == 8, "model.groups");
  CHECK(LIST_IS(c.model.channels, 32, 64), "model.channels");
  CHECK(c.model.kernel == 3, "model.kernel");
  CHECK(c.model.residual_blocks == 0, "model.residual_blocks");
  CHECK(!strcmp(c.model.pool, "max"), "model.pool");
  CHECK(LIST_IS(c.model.dense, 128), "model.dense");
  CHECK(c.model.classes == 10, "model.classes");
  CHECK(!strcmp(c.data.dataset, "fashion_mnist"), "data.dataset");
  CHECK(!strcmp(c.data.dir, "/usr/share/datasets/fashion-mnist"), "data.dir");
  CHECK(c.data.train_limit == 0 && c.data.test_limit == 0, "data limits");
  CHECK(c.data.shuffle == 1 && c.data.normalize == 1, "data bools");
  CHECK(!strcmp(c.optimizer.kind, "sgd"), "optimizer.kind");
  CHECK(c.optimizer.lr == 0.05f, "optimizer.lr %g", (double)c.optimizer.lr);
  CHECK(c.optimizer.momentum == 0.9f, "optimizer.momentum");
  CHECK(c.optimizer.nesterov == 0, "optimizer.nesterov");
  CHECK(c.optimizer.weight_decay == 0.0f, "optimizer.weight_decay");
  CHECK(c.optimizer.beta1 == 0.9f && c.optimizer.beta2 == 0.999f, "betas");
  CHECK(c.optimizer.eps == 1e-8f, "optimizer.eps");
  CHECK(!strcmp(c.optimizer.schedule, "constant"), "optimizer.schedule");
  CHECK(c.optimizer.warmup_steps == 0 && c.optimizer.min_lr == 0.0f, "warmup");
  CHECK(c.optimizer.step_size == 1000 && c.optimizer.gamma == 0.1f, "step");
  CHECK(c.train.batch == 32 && c.train.epochs == 1, "batch/epochs");
  CHECK(c.train.steps == 0 && c.train.seed == 42, "steps/seed");
  CHECK(c.train.eval_every == 0 && c.train.checkpoint_every == 0, "every");
  CHECK(c.train.threads == 0 && c.train.keep_checkpoints == 2, "threads/keep");
  CHECK(c.train.flush_subnormals == 1, "train.flush_subnormals");
  CHECK(!strcmp(c.execution.mode, "sequential"), "execution.mode");
  CHECK(c.execution.micro_batch == 0, "execution.micro_batch");
  CHECK(!strcmp(c.fabric.kind, "cpu") && c.fabric.cores == 0, "fabric");
  CHECK(c.fabric.width == 0 && c.fabric.height == 0, "fabric mesh size");
  CHECK(c.fabric.pe_flops == 0 && c.fabric.pe_memory == 0 &&
            c.fabric.link_bandwidth == 0,
        "fabric per-PE figures: 0, the fabric's own");
  CHECK(c.metrics.log_every == 50, "metrics.log_every");
  CHECK(!strcmp(c.metrics.progress, "auto"), "metrics.progress");

  for (int i = 0; i < N_KEYS; i++)
    CHECK(!strcmp(st_config_where(&c, all_keys[i]), "default"), "where %s: %s",
          all_keys[i], st_config_where(&c, all_keys[i]));
  CHECK(!strcmp(st_config_where(&c, "model.hiden"), "unknown key"),
        "where of an unknown key");

  st_error err = {0};
  CHECK(st_config_validate(&c, &err) == 0, "defaults invalid: %s", err.msg);

  /* Two default configs are byte-identical (no stray bytes left). */
  st_config d;
  memset(&d, 0x11, sizeof d);
  st_config_defaults(&d);
  CHECK(memcmp(&c, &d, sizeof c) == 0, "defaults not deterministic");
}

static const char *full_yaml =
    "# every key, none at its default\n" /* 1 */
    "model:\n"                           /* 2 */
    "  kind: cnn\n"                      /* 3 */
    "  hidden: [64]\n"                   /* 4 */
    "  activation: gelu_tanh\n"          /* 5 */
    "  dropout: 0.25\n"                  /* 6 */
    "  norm: groupnorm\n"                /* 7 */
    "  groups: 4\n"                      /* 8 */
    "  channels:\n"                      /* 9 */
    "    - 16\n"                         /* 10 */
    "    - 32\n"                         /* 11 */
    "  kernel: 5\n"                      /* 12 */
    "  residual_blocks: 2\n"             /* 13 */
    "  pool: avg\n"                      /* 14 */
    "  dense: []\n"                      /* 15 */
    "  classes: 7\n"                     /* 16 */
    "data:\n"                            /* 17 */
    "  dataset: synthetic\n"             /* 18 */
    "  dir: \"/tmp/a dir/with \\\"quotes\\\" and \\\\\"\n"
    "  train_limit: 1000\n" /* 20 */
    "  test_limit: 200\n"
    "  shuffle: no\n"
    "  normalize: Off\n"
    "optimizer:\n"
    "  kind: adamw\n" /* 25 */
    "  lr: 3e-4\n"
    "  momentum: 0\n"
    "  nesterov: false\n"
    "  weight_decay: 0.01\n"
    "  beta1: 0.8\n" /* 30 */
    "  beta2: 0.99\n"
    "  eps: 1e-6\n"
    "  schedule: cosine\n"
    "  warmup_steps: 100\n"
    "  min_lr: 1e-5\n" /* 35 */
    "  step_size: 10\n"
    "  gamma: 0.5\n"
    "train:\n"
    "  batch: 64\n"
    "  epochs: 3\n" /* 40 */
    "  steps: 5000000000\n"
    "  seed: 18446744073709551615\n"
    "  eval_every: 100\n"
    "  checkpoint_every: 1000\n"
    "  threads: 4\n" /* 45 */
    "  keep_checkpoints: 5\n"
    "execution: {mode: sequential, micro_batch: 16}\n"
    "fabric:\n"
    "  kind: cpu\n"
    "  cores: 8\n" /* 50 */
    "  width: 4\n"
    "  height: 3\n"
    "  pe_flops: 1e9\n"
    "  pe_memory: 65536\n"
    "  link_bandwidth: 2.5e9\n" /* 55 */
    "metrics:\n"
    "  log_every: 10\n"
    "  progress: off\n";

static void check_full(const st_config *c) {
  CHECK(!strcmp(c->model.kind, "cnn"), "model.kind");
  CHECK(LIST_IS(c->model.hidden, 64), "model.hidden");
  CHECK(!strcmp(c->model.activation, "gelu_tanh"), "model.activation");
  CHECK(c->model.dropout == 0.25f, "model.dropout");
  CHECK(!strcmp(c->model.norm, "groupnorm") && c->model.groups == 4, "norm");
  CHECK(LIST_IS(c->model.channels, 16, 32), "model.channels (block list)");
  CHECK(c->model.kernel == 5 && c->model.residual_blocks == 2, "kernel/res");
  CHECK(!strcmp(c->model.pool, "avg"), "model.pool");
  CHECK(c->model.dense.n == 0, "model.dense []: n %d", c->model.dense.n);
  CHECK(c->model.classes == 7, "model.classes");
  CHECK(!strcmp(c->data.dataset, "synthetic"), "data.dataset");
  CHECK(!strcmp(c->data.dir, "/tmp/a dir/with \"quotes\" and \\"),
        "data.dir '%s'", c->data.dir);
  CHECK(c->data.train_limit == 1000 && c->data.test_limit == 200, "limits");
  CHECK(c->data.shuffle == 0 && c->data.normalize == 0, "no / Off");
  CHECK(!strcmp(c->optimizer.kind, "adamw"), "optimizer.kind");
  CHECK(c->optimizer.lr == 3e-4f, "optimizer.lr %.9g", (double)c->optimizer.lr);
  CHECK(c->optimizer.momentum == 0.0f && c->optimizer.nesterov == 0, "mom");
  CHECK(c->optimizer.weight_decay == 0.01f, "weight_decay");
  CHECK(c->optimizer.beta1 == 0.8f && c->optimizer.beta2 == 0.99f, "betas");
  CHECK(c->optimizer.eps == 1e-6f, "eps");
  CHECK(!strcmp(c->optimizer.schedule, "cosine"), "schedule");
  CHECK(c->optimizer.warmup_steps == 100 && c->optimizer.min_lr == 1e-5f,
        "warmup/min_lr");
  CHECK(c->optimizer.step_size == 10 && c->optimizer.gamma == 0.5f, "step");
  CHECK(c->train.batch == 64 && c->train.epochs == 3, "batch/epochs");
  CHECK(c->train.steps == INT64_C(5000000000), "steps (int64)");
  CHECK(c->train.seed == UINT64_MAX, "seed %" PRIu64, c->train.seed);
  CHECK(c->train.eval_every == 100 && c->train.checkpoint_every == 1000, "ev");
  CHECK(c->train.threads == 4 && c->train.keep_checkpoints == 5, "threads");
  CHECK(!strcmp(c->execution.mode, "sequential"), "execution.mode");
  CHECK(c->execution.micro_batch == 16, "micro_batch (flow mapping)");
  CHECK(!strcmp(c->fabric.kind, "cpu") && c->fabric.cores == 8, "fabric");
  CHECK(c->fabric.width == 4 && c->fabric.height == 3, "fabric mesh size");
  CHECK(c->fabric.pe_flops == 1e9f && c->fabric.pe_memory == 65536 &&
            c->fabric.link_bandwidth == 2.5e9f,
        "fabric per-PE figures");
  CHECK(c->metrics.log_every == 10, "log_every");
  CHECK(!strcmp(c->metrics.progress, "off"), "progress");
}

static void test_full_file(void) {
  st_config c;
  st_error err = {0};
  char path[64], want[256];
  st_config_defaults(&c);
  int rc = load_text(&c, full_yaml, path, &err);
  CHECK(rc == 0, "full file: %s", err.msg);
  check_full(&c);
  CHECK(!strcmp(c.path, path), "path '%s'", c.path);
  CHECK(st_config_validate(&c, &err) == 0, "full file invalid: %s", err.msg);

  /* where: the value's line:col (1-based), for every style of value */
  snprintf(want, sizeof want, "%s:4:11", path);
  CHECK(!strcmp(st_config_where(&c, "model.hidden"), want), "where %s",
        st_config_where(&c, "model.hidden"));
  snprintf(want, sizeof want, "%s:10:5", path); /* block list: first '-' */
  CHECK(!strcmp(st_config_where(&c, "model.channels"), want), "where %s",
        st_config_where(&c, "model.channels"));
  snprintf(want, sizeof want, "%s:47:44", path); /* inside a flow mapping */
  CHECK(!strcmp(st_config_where(&c, "execution.micro_batch"), want), "where %s",
        st_config_where(&c, "execution.micro_batch"));
  /* two calls in one expression get two buffers */
  char both[256];
  snprintf(both, sizeof both, "%s %s", st_config_where(&c, "train.batch"),
           st_config_where(&c, "train.epochs"));
  snprintf(want, sizeof want, "%s:39:10 %s:40:11", path, path);
  CHECK(!strcmp(both, want), "two wheres '%s'", both);
}

static void test_partial_and_empty_files(void) {
  st_config c, d;
  st_error err = {0};
  char path[64];
  st_config_defaults(&d);

  /* An empty file, a comment-only file and an empty section are defaults. */
  const char *empties[] = {"", "# nothing here\n", "model:\n", "---\n"};
  for (int i = 0; i < 4; i++) {
    st_config_defaults(&c);
    int rc = load_text(&c, empties[i], path, &err);
    CHECK(rc == 0, "empty #%d: %s", i, err.msg);
    CHECK(same_settings(&c, &d), "empty #%d is not all defaults", i);
  }

  /* A load starts from the defaults: keys not in the file do not survive
   * from an earlier --set or load. */
  st_config_defaults(&c);
  st_config_set(&c, "train.batch=7", &err);
  int rc = load_text(&c, "train:\n  epochs: 4\n", path, &err);
  CHECK(rc == 0 && c.train.epochs == 4, "partial file: %s", err.msg);
  CHECK(c.train.batch == 32, "batch %d: load must start from defaults",
        c.train.batch);
  CHECK(!strcmp(st_config_where(&c, "train.batch"), "default"), "where");

  /* A failed load leaves the config exactly as it was. */
  st_config before;
  st_config_defaults(&c);
  st_config_set(&c, "train.batch=7", &err);
  before = c;
  rc = load_text(&c, "train:\n  epochs: 9\n  batch: x\n", path, &err);
  CHECK(rc == ST_ECONFIG, "bad file loaded");
  CHECK(memcmp(&c, &before, sizeof c) == 0, "failed load changed cfg");

  /* A block sequence given as the whole value, and YAML anchors/aliases. */
  st_config_defaults(&c);
  rc = load_text(&c, "model:\n  hidden: &w\n  - 3\n  - 5\n  dense: *w\n", path,
                 &err);
  CHECK(rc == 0, "anchors: %s", err.msg);
  CHECK(LIST_IS(c.model.hidden, 3, 5) && LIST_IS(c.model.dense, 3, 5),
        "anchored lists");
}

static void test_round_trip(void) {
  st_config a, b;
  st_error err = {0};
  char path[64];

  /* defaults -> text -> defaults */
  st_config_defaults(&a);
  char *text = capture(write_config, &a);
  CHECK(strstr(text, "model:\n  kind: mlp\n  hidden: [256, 256]\n") != NULL,
        "defaults written as:\n%s", text);
  CHECK(strstr(text, "  lr: 0.05\n") && strstr(text, "  eps: 1e-08\n"),
        "floats use their shortest exact form:\n%s", text);
  CHECK(strstr(text, "  dir: \"/usr/share/datasets/fashion-mnist\"\n") != NULL,
        "strings quoted");
  for (int i = 0; i < N_KEYS; i++) {
    const char *name = strchr(all_keys[i], '.') + 1;
    char line[64];
    snprintf(line, sizeof line, "\n  %s: ", name);
    CHECK(strstr(text, line) != NULL, "write misses %s", all_keys[i]);
  }
  int rc = load_text(&b, text, path, &err);
  CHECK(rc == 0 && same_settings(&a, &b), "defaults round trip: %s", err.msg);
  free(text);

  /* every key changed, plus floats that only survive with 9 digits */
  st_config_defaults(&a);
  rc = load_text(&a, full_yaml, path, &err);
  CHECK(rc == 0, "full: %s", err.msg);
  text = capture(write_config, &a);
  st_config_defaults(&b);
  rc = load_text(&b, text, path, &err);
  CHECK(rc == 0 && same_settings(&a, &b), "full round trip: %s", err.msg);
  check_full(&b); /* field by field, not only memcmp */
  free(text);

  const float hard[] = {
      0.1f,           1.0f / 3.0f,     1e-8f,
      3.40282347e38f, 1.17549435e-38f, 1.40129846e-45f /* denormal */,
      -0.0f,          16777217.0f,     0.7f};
  for (size_t i = 0; i < sizeof hard / sizeof hard[0]; i++) {
    a.optimizer.weight_decay = hard[i];
    a.model.dropout = hard[(i + 1) % 9];
    text = capture(write_config, &a);
    st_config_defaults(&b);
    rc = load_text(&b, text, path, &err);
    CHECK(rc == 0, "reload: %s\n%s", err.msg, text);
    CHECK(same_settings(&a, &b), "round trip differs for %.9g",
          (double)hard[i]);
    CHECK(memcmp(&a.optimizer.weight_decay, &b.optimizer.weight_decay,
                 sizeof(float)) == 0,
          "float bits %.9g -> %.9g", (double)hard[i],
          (double)b.optimizer.weight_decay);
    free(text);
  }

  /* what --set produced round-trips too */
  st_config_defaults(&a);
  st_config_set(&a, "data.dir=\"tab\\there\"", &err);
  st_config_set(&a, "model.hidden=[]", &err);
  text = capture(write_config, &a);
  rc = load_text(&b, text, path, &err);
  CHECK(rc == 0 && same_settings(&a, &b) && !strcmp(b.data.dir, "tab\there"),
        "control characters in strings: %s", err.msg);
  free(text);
  /* characters YAML's reader refuses raw (C1 controls, U+FFFE, U+FFFF)
   * or reads as a line break (NEL, U+0085): the file written must still
   * load, as the same string */
  static const char *const odd[] = {"data.dir=\"/a\\x80b\"",
                                    "data.dir=\"/a\\x85b\"",
                                    "data.dir=\"/a\\x9fb\\ufffec\\uffffd\""};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    st_config_defaults(&a);
    CHECK(st_config_set(&a, odd[i], &err) == 0, "--set %s: %s", odd[i],
          err.msg);
    text = capture(write_config, &a);
    st_config_defaults(&b);
    rc = load_text(&b, text, path, &err);
    CHECK(rc == 0 && !strcmp(a.data.dir, b.data.dir),
          "--set %s: written, then read back: rc %d %s", odd[i], rc, err.msg);
    free(text);
  }

  /* st_config_write reports a failed stream */
  FILE *ro = fopen("/dev/null", "r");
  st_config_defaults(&a);
  CHECK(st_config_write(&a, ro) == ST_EIO, "write to a read-only stream");
  fclose(ro);
}

static void test_set(void) {
  st_config c;
  st_error err = {0};
  st_config_defaults(&c);
#define SET_OK(text)                                                           \
  CHECK(st_config_set(&c, text, &err) == 0, "--set %s: %s", text, err.msg)
  SET_OK("train.batch=128");
  CHECK(c.train.batch == 128, "int");
  SET_OK(" train.epochs = 5"); /* blanks around the key are forgiven */
  CHECK(c.train.epochs == 5, "int with blanks");
  SET_OK("train.steps=9000000000");
  CHECK(c.train.steps == INT64_C(9000000000), "int64");
  SET_OK("train.seed=18446744073709551615");
  CHECK(c.train.seed == UINT64_MAX, "uint64");
  SET_OK("optimizer.lr=0.1");
  CHECK(c.optimizer.lr == 0.1f, "float");
  SET_OK("optimizer.momentum=1"); /* an integer is a number */
  CHECK(c.optimizer.momentum == 1.0f, "float from int");
  SET_OK("data.shuffle=off");
  CHECK(c.data.shuffle == 0, "bool off");
  SET_OK("data.shuffle=YES");
  CHECK(c.data.shuffle == 1, "bool YES");
  SET_OK("data.normalize=false");
  CHECK(c.data.normalize == 0, "bool false");
  SET_OK("data.dir='/x y/z'");
  CHECK(!strcmp(c.data.dir, "/x y/z"), "string '%s'", c.data.dir);
  SET_OK("data.dir=a=b"); /* only the first '=' splits */
  CHECK(!strcmp(c.data.dir, "a=b"), "string with '=': '%s'", c.data.dir);
  SET_OK("model.activation=gelu");
  CHECK(!strcmp(c.model.activation, "gelu"), "enum");
  SET_OK("model.hidden=[512,512]");
  CHECK(LIST_IS(c.model.hidden, 512, 512), "flow list");
  SET_OK("model.dense=[]");
  CHECK(c.model.dense.n == 0, "empty list");
  SET_OK("model.channels=[-1, 2147483647, -2147483648]");
  CHECK(LIST_IS(c.model.channels, -1, 2147483647, -2147483647 - 1),
        "list int range (validation rejects -1 later)");
  SET_OK("model.hidden=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, "
         "16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32]");
  CHECK(c.model.hidden.n == 32 && c.model.hidden.v[31] == 32, "32 items");
  SET_OK("optimizer.eps=1e-8 # a comment");
  CHECK(c.optimizer.eps == 1e-8f, "trailing comment");
#undef SET_OK
  CHECK(!strcmp(st_config_where(&c, "model.hidden"), "--set"), "where --set");
  CHECK(!strcmp(st_config_where(&c, "model.kind"), "default"), "where default");
}

static void test_set_errors(void) {
  SET_ERROR("optimizer.lr=fast",
            "--set optimizer.lr=fast: optimizer.lr: expected a number, got "
            "'fast'");
  SET_ERROR("optimizer.lrr=0.1", "--set optimizer.lrr=0.1: unknown key "
                                 "'optimizer.lrr' (did you mean "
                                 "'optimizer.lr'?)");
  SET_ERROR("optimizer.rl=0.1", /* a swap is one edit, not two */
            "--set optimizer.rl=0.1: unknown key 'optimizer.rl' (did you mean "
            "'optimizer.lr'?)");
  SET_ERROR("lr=0.1",
            "--set lr=0.1: unknown key 'lr' (did you mean 'optimizer.lr'?)");
  SET_ERROR("model.zzzzzzzz=1", "--set model.zzzzzzzz=1: unknown key "
                                "'model.zzzzzzzz'");
  SET_ERROR("optimizer.lr", "--set optimizer.lr: expected section.key=value");
  SET_ERROR("optimizer.lr=", "--set optimizer.lr=: optimizer.lr: no value");
  SET_ERROR("optimizer.lr=~",
            "--set optimizer.lr=~: optimizer.lr: expected a number, got no "
            "value");
  SET_ERROR("optimizer.lr=nan",
            "--set optimizer.lr=nan: optimizer.lr: expected a number, got "
            "'nan'");
  SET_ERROR("optimizer.lr=0x10", /* strtof alone reads 16 */
            "--set optimizer.lr=0x10: optimizer.lr: expected a number, got "
            "'0x10'");
  SET_ERROR("optimizer.lr=0x1p-3",
            "--set optimizer.lr=0x1p-3: optimizer.lr: expected a number, got "
            "'0x1p-3'");
  SET_ERROR("optimizer.lr=infinity",
            "--set optimizer.lr=infinity: optimizer.lr: expected a number, "
            "got 'infinity'");
  SET_ERROR("optimizer.lr=1e39", "--set optimizer.lr=1e39: optimizer.lr: 1e39 "
                                 "is out of range for a float");
  SET_ERROR("optimizer.lr=1e-50", "--set optimizer.lr=1e-50: optimizer.lr: "
                                  "1e-50 is out of range for a float");
  SET_ERROR("optimizer.lr=[1]",
            "--set optimizer.lr=[1]: optimizer.lr: expected a number, got a "
            "list");
  SET_ERROR("train.batch=1.5",
            "--set train.batch=1.5: train.batch: expected an integer, got "
            "'1.5'");
  SET_ERROR("train.batch=3000000000",
            "--set train.batch=3000000000: train.batch: 3000000000 is out of "
            "range [-2147483648, 2147483647]");
  SET_ERROR("train.batch=12abc", "--set train.batch=12abc: train.batch: "
                                 "expected an integer, got '12abc'");
  SET_ERROR("train.seed=-1", "--set train.seed=-1: train.seed: expected a "
                             "non-negative integer, got '-1'");
  SET_ERROR("train.seed=18446744073709551616",
            "--set train.seed=18446744073709551616: train.seed: "
            "18446744073709551616 is out of range");
  SET_ERROR("data.shuffle=maybe",
            "--set data.shuffle=maybe: data.shuffle: "
            "expected true or false (or yes/no, on/off), got 'maybe'");
  SET_ERROR("model.activation=rleu",
            "--set model.activation=rleu: model.activation: 'rleu' is not one "
            "of relu, gelu, gelu_tanh");
  SET_ERROR("execution.mode=pipe", "--set execution.mode=pipe: "
                                   "execution.mode: 'pipe' is not one of "
                                   "sequential, pipeline, block_sequential, "
                                   "pipelined_backprop, weight_streaming");
  SET_ERROR("execution.mitigation=spectrain",
            "--set execution.mitigation=spectrain: execution.mitigation: "
            "'spectrain' is lwp here: in fine-grained pipelined backprop "
            "each stage applies a micro-batch's gradient right after its "
            "backward, so SpecTrain's backward predicts 0 updates ahead and "
            "its forward lwp's D; write lwp");
  SET_ERROR("model.hidden=5", "--set model.hidden=5: model.hidden: expected a "
                              "list of integers such as [256, 256], got '5'");
  SET_ERROR("model.hidden=[1, x]", "--set model.hidden=[1, x]: "
                                   "model.hidden[1]: expected an integer, got "
                                   "'x'");
  SET_ERROR("model.hidden=[1, [2]]", "--set model.hidden=[1, [2]]: "
                                     "model.hidden[1]: expected an integer, "
                                     "got a list");
  SET_ERROR("model.hidden=[1,2",
            "--set model.hidden=[1,2: YAML syntax error: did not find expected "
            "',' or ']' (while parsing a flow sequence at 1:1)");
  SET_ERROR("model.kind={a: 1}", "--set model.kind={a: 1}: model.kind: "
                                 "expected a string, got a mapping");
  SET_ERROR(
      "model.hidden=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, "
      "16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, "
      "32, 33]",
      "--set model.hidden=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
      "15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, "
      "31, 32, 33]: model.hidden: more than 32 items");

  /* a string longer than its field: data.dir holds 511 characters */
  char long_set[600] = "data.dir=";
  memset(long_set + 9, 'a', 512);
  long_set[9 + 512] = '\0';
  st_config c;
  st_error err = {0};
  st_config_defaults(&c);
  CHECK(st_config_set(&c, long_set, &err) == ST_ECONFIG &&
            strstr(err.msg, ": data.dir: longer than 511 characters"),
        "long string: %s", err.msg);
  long_set[9 + 511] = '\0';
  CHECK(st_config_set(&c, long_set, &err) == 0 && strlen(c.data.dir) == 511,
        "511 characters fit: %s", err.msg);
}

static void test_load_errors(void) {
  LOAD_ERROR("model:\n  kind: mlp\n  hidden: a: b\n",
             "%s:3:12: YAML syntax error: mapping values are not allowed in "
             "this context");
  LOAD_ERROR("model:\n  hidden: [1, 2\ndata:\n  dir: x\n",
             "%s:3:5: YAML syntax error: did not find expected ',' or ']' "
             "(while parsing a flow sequence at 2:11)");
  LOAD_ERROR("model:\n\tkind: cnn\n",
             "%s:2:1: YAML syntax error: a tab; YAML indents with spaces");
  LOAD_ERROR("model:\n  kind: cnn\ntrain:\n  batch: 3\n\t\n",
             "%s:5:1: YAML syntax error: a tab; YAML indents with spaces");
  /* libyaml's marks count characters: text of two- and three-byte ones,
   * or a byte-order mark, before the tab must not hide it */
  LOAD_ERROR("# caf\xc3\xa9 \xe2\x80\x94 x\nmodel:\n\tkind: cnn\n",
             "%s:3:1: YAML syntax error: a tab; YAML indents with spaces");
  LOAD_ERROR("\xef\xbb\xbfmodel:\n\tkind: cnn\n",
             "%s:2:1: YAML syntax error: a tab; YAML indents with spaces");
  LOAD_ERROR("model: \xff\n",
             "%s:1:8: YAML syntax error: invalid leading UTF-8 octet (0xff)");
  /* a byte that is not text: its line and column, not only its offset
   * (characters counted, as libyaml's marks count them; a BOM not one) */
  LOAD_ERROR("\xef\xbb\xbf# caf\xc3\xa9\r\nmodel:\n  kind: ml\xc3p\n",
             "%s:3:12: YAML syntax error: invalid trailing UTF-8 octet "
             "(0x70)");
  LOAD_ERROR("model:\n  kind: mlp\n  activation: re\x01lu\n",
             "%s:3:17: YAML syntax error: control characters are not "
             "allowed (0x01)");
  LOAD_ERROR("# a comment\nmodle:\n  kind: mlp\n",
             "%s:2:1: unknown section 'modle' (did you mean 'model'?)");
  LOAD_ERROR("model:\n  kind: mlp\nparallelism:\n  x: 1\n",
             "%s:3:1: unknown section 'parallelism'");
  LOAD_ERROR("model:\n  kind: mlp\n  activation: relu\n  hiden: [1]\n",
             "%s:4:3: unknown key 'model.hiden' (did you mean "
             "'model.hidden'?)");
  LOAD_ERROR("train:\n  lr: 0.1\n",
             "%s:2:3: unknown key 'train.lr' (did you mean 'optimizer.lr'?)");
  LOAD_ERROR("train:\n  batch_size_per_worker: 8\n",
             "%s:2:3: unknown key 'train.batch_size_per_worker'");
  LOAD_ERROR("optimizer:\n  kind: sgd\n  momentum: 0.5\n  nesterov: true\n"
             "  lr:     fast\n",
             "%s:5:11: optimizer.lr: expected a number, got 'fast'");
  LOAD_ERROR("execution:\n  mode: pipe\n",
             "%s:2:9: execution.mode: 'pipe' is not one of sequential, "
             "pipeline, block_sequential, pipelined_backprop, "
             "weight_streaming");
  LOAD_ERROR("train:\n  batch: 8\n  epochs: 2\n  batch: 16\n",
             "%s:4:3: duplicate key 'train.batch' (first at 2:3)");
  LOAD_ERROR("train:\n  batch: 8\nmodel: {}\ntrain:\n  epochs: 2\n",
             "%s:4:1: duplicate section 'train' (first at 1:1)");
  LOAD_ERROR("model:\n  hidden: [1, two, 3]\n",
             "%s:2:15: model.hidden[1]: expected an integer, got 'two'");
  LOAD_ERROR("train:\n  batch:\n",
             "%s:2:9: train.batch: expected an integer, got no value");
  LOAD_ERROR("train:\n  batch:\n    x: 1\n",
             "%s:3:5: train.batch: expected an integer, got a mapping");
  LOAD_ERROR("model: 5\n", "%s:1:8: section 'model' must be a mapping of key: "
                           "value, got a scalar");
  LOAD_ERROR("model:\n  - kind\n", "%s:2:3: section 'model' must be a mapping "
                                   "of key: value, got a list");
  LOAD_ERROR("- model\n- data\n", "%s:1:1: expected sections (model:, data:, "
                                  "...) at the top level, got a list");
  LOAD_ERROR("model:\n  kind: mlp\n---\ntrain:\n  batch: 4\n",
             "%s:4:1: expected one YAML document, found a second one");
  LOAD_ERROR("model:\n  [a]: 1\n", "%s:2:3: expected a key name, got a list");
  /* a NUL inside a quoted key: not the key before it */
  LOAD_ERROR("model:\n  \"kind\\0x\": mlp\n",
             "%s:2:3: a key name contains a NUL character");
  LOAD_ERROR("model:\n  kind: *nothing\n",
             "%s:2:9: YAML syntax error: found undefined alias");
  /* a long value is cut short in the message at a character's first byte:
   * "a" and 40 two-byte characters cut to "a" and 33 of them, not 33 and a
   * half */
  {
    char yaml[128] = "train:\n  batch: a", want[160];
    char *w = want + sprintf(want, "%%s:2:10: train.batch: expected an "
                                   "integer, got 'a");
    for (int i = 0; i < 40; i++) strcat(yaml, "\xc3\xa9");
    strcat(yaml, "\n");
    for (int i = 0; i < 33; i++) w += sprintf(w, "\xc3\xa9");
    strcpy(w, "...'");
    LOAD_ERROR(yaml, want);
  }
}

/* Text a config never is, refused before it is loaded (libyaml's load is
 * quadratic in depth): nesting past 64 levels, counted on libyaml's own
 * events up to the first level too many; files past 16 MiB. */
static void test_limits(void) {
  enum { DEEP = 100000 };
  char *text = malloc(DEEP * 4 + 64);
  memset(text, '[', DEEP);
  text[DEEP] = '\0';
  LOAD_ERROR(text, "%s:1:65: nested deeper than 64 levels (a config needs "
                   "3); refused before parsing");
  /* a deep block mapping: "a:\n b:\n  c:..." */
  size_t n = 0;
  for (int i = 0; i < 70; i++) {
    memset(text + n, ' ', (size_t)i);
    n += (size_t)i;
    n += (size_t)sprintf(text + n, "k%d:\n", i);
  }
  text[n] = '\0';
  LOAD_ERROR(text, "%s:65:65: nested deeper than 64 levels (a config needs "
                   "3); refused before parsing");
  /* a compact sequence, each "- " one level deeper */
  n = 0;
  n += (size_t)sprintf(text, "model:\n  hidden:\n  ");
  for (int i = 0; i < 70; i++) n += (size_t)sprintf(text + n, "- ");
  sprintf(text + n, "1\n");
  LOAD_ERROR(text, "%s:3:127: nested deeper than 64 levels (a config needs "
                   "3); refused before parsing");
  /* brackets in comments and quoted strings do not count; a flow list 60
   * deep inside a mapping is under the limit (and then a wrong type) */
  n = (size_t)sprintf(text, "# %s\ndata:\n  dir: \"", "[[[[[[[[[[[[[[[[");
  for (int i = 0; i < 80; i++) text[n++] = '[';
  n += (size_t)sprintf(text + n, "\\\"'[\"  # [[[[[[[[[[[[[[[[[[[[[[[[[[[\n");
  text[n] = '\0';
  st_config c;
  st_error err = {0};
  char path[64];
  st_config_defaults(&c);
  CHECK(load_text(&c, text, path, &err) == 0 && strlen(c.data.dir) == 83 &&
            !strcmp(c.data.dir + 80, "\"'["),
        "brackets in strings and comments: %s ('%s')", err.msg, c.data.dir);
  n = (size_t)sprintf(text, "model:\n  hidden: ");
  for (int i = 0; i < 60; i++) text[n++] = '[';
  text[n++] = '1';
  for (int i = 0; i < 60; i++) text[n++] = ']';
  sprintf(text + n, "\n");
  st_config_defaults(&c);
  int rc = load_text(&c, text, path, &err);
  CHECK(rc == ST_ECONFIG && !strstr(err.msg, "nested deeper"),
        "62 levels are parsed (and refused as a type): %s", err.msg);
  /* a quote inside a plain scalar opens no string: the brackets after it
   * count (they hid 200k levels from the guard, and libyaml took minutes) */
  n = (size_t)sprintf(text, "model: {kind: b'c, hidden: ");
  for (int i = 0; i < 100; i++) text[n++] = '[';
  sprintf(text + n, "\n");
  LOAD_ERROR(text, "%s:1:90: nested deeper than 64 levels (a config needs "
                   "3); refused before parsing");
  /* nor does one after a blank inside a plain scalar (x 'y), nor a
   * multi-line quoted string whose brackets a line-by-line count took for
   * closing ones: both hid the brackets after them */
  n = (size_t)sprintf(text, "model:\n  hidden: [x 'y, ");
  for (int i = 0; i < 100; i++) text[n++] = '[';
  sprintf(text + n, "\n");
  LOAD_ERROR(text, "%s:2:79: nested deeper than 64 levels (a config needs "
                   "3); refused before parsing");
  n = (size_t)sprintf(text, "model:\n  hidden: ");
  for (int i = 0; i < 60; i++) text[n++] = '[';
  n += (size_t)sprintf(text + n, " \"x\n");
  for (int i = 0; i < 60; i++) text[n++] = ']';
  n += (size_t)sprintf(text + n, " \" , ");
  for (int i = 0; i < 100; i++) text[n++] = '[';
  sprintf(text + n, "\n");
  LOAD_ERROR(text, "%s:3:68: nested deeper than 64 levels (a config needs "
                   "3); refused before parsing");
  /* --set values are held to the same depth, and to one document */
  n = (size_t)sprintf(text, "model.hidden=");
  for (int i = 0; i < 100; i++) text[n++] = '[';
  text[n] = '\0';
  st_config_defaults(&c);
  rc = st_config_set(&c, text, &err);
  CHECK(rc == ST_ECONFIG && strstr(err.msg, ":1:65: nested deeper than 64"),
        "a deep --set value: rc %d '%s'", rc, err.msg);
  st_config_defaults(&c);
  rc = st_config_set(&c, "model.hidden=[5]\n---\n[6]", &err);
  CHECK(rc == ST_ECONFIG &&
            strstr(err.msg, "model.hidden: the value holds a second YAML "
                            "document") &&
            c.model.hidden.n == 2,
        "a second document in a --set value: rc %d '%s'", rc, err.msg);
  free(text);

  /* 16 MiB and one byte: refused, naming the size */
  strcpy(path, "/tmp/strata_cfg_XXXXXX");
  int fd = mkstemp(path);
  CHECK(fd >= 0 && ftruncate(fd, (16 << 20) + 1) == 0, "a large file");
  close(fd);
  char want[160];
  snprintf(want, sizeof want,
           "%s: larger than the 16 MiB a config may be (16777217 bytes); "
           "refused before parsing",
           path);
  st_config_defaults(&c);
  rc = st_config_load(&c, path, &err);
  CHECK(rc == ST_ECONFIG && !strcmp(err.msg, want), "got '%s'", err.msg);
  unlink(path);
}

static void test_open_errors(void) {
  st_config c, before;
  st_error err = {0};
  st_config_defaults(&c);
  before = c;
  int rc = st_config_load(&c, "/tmp/strata_no_such_dir/x.yaml", &err);
  CHECK(rc == ST_EIO && err.code == ST_EIO, "missing file rc %d", rc);
  CHECK(!strcmp(err.msg, "/tmp/strata_no_such_dir/x.yaml: cannot open: No "
                         "such file or directory"),
        "missing file: '%s'", err.msg);
  rc = st_config_load(&c, "/tmp", &err);
  CHECK(rc == ST_EIO && !strcmp(err.msg, "/tmp: cannot open: Is a directory"),
        "directory: '%s'", err.msg);
  CHECK(memcmp(&c, &before, sizeof c) == 0, "failed open changed cfg");
}

static void test_validate(void) {
  INVALID("--set: train.batch: must be in [1, 16777216], got 0",
          "train.batch=0");
  INVALID("--set: train.epochs: must be >= 0, got -1", "train.epochs=-1");
  INVALID("--set: train.steps: must be >= 0, got -5", "train.steps=-5");
  INVALID("--set: optimizer.lr: must be > 0, got 0", "optimizer.lr=0");
  INVALID("--set: optimizer.momentum: must be in [0, 1), got 1",
          "optimizer.momentum=1");
  /* a float as written, an integer whole */
  INVALID("--set: optimizer.momentum: must be in [0, 1), got -0.1",
          "optimizer.momentum=-0.1");
  INVALID("--set: optimizer.lr: must be > 0, got -3e-07",
          "optimizer.lr=-3.0000001e-7");
  INVALID("--set: model.layers: must be in [0, 65536], got 2000000000",
          "model.layers=2000000000");
  INVALID("--set: model.residual_blocks: must be in [0, 65536], got 65537",
          "model.residual_blocks=65537");
  INVALID("--set: model.dropout: must be in [0, 1), got 1", "model.dropout=1");
  INVALID("--set: optimizer.eps: must be > 0, got 0", "optimizer.eps=0");
  INVALID("--set: optimizer.beta1: must be in [0, 1), got 1",
          "optimizer.beta1=1");
  INVALID("--set: optimizer.beta2: must be in [0, 1), got 1.5",
          "optimizer.beta2=1.5");
  INVALID("--set: train.threads: must be in [0, 4096], got -1",
          "train.threads=-1");
  INVALID("--set: model.hidden: every entry must be in [1, 16777216], got 0 at "
          "[1]",
          "model.hidden=[256, 0]");
  INVALID("--set: model.channels: every entry must be in [1, 16777216], got -3 "
          "at [0]",
          "model.channels=[-3]");
  INVALID("--set: model.kernel: must be odd ('same' padding), got 4",
          "model.kernel=4");
  INVALID("--set: model.kernel: must be in [1, 4096], got -1",
          "model.kernel=-1");
  INVALID("--set: model.classes: must be in [2, 16777216], got 1",
          "model.classes=1");
  /* upper bounds: products of these overflowed the builder and kernels */
  INVALID("--set: model.width: must be in [1, 16777216], got 1073741824",
          "model.width=1073741824");
  INVALID("--set: model.mlp_ratio: must be in [1, 64], got 1073741824",
          "model.mlp_ratio=1073741824");
  INVALID("--set: model.vocab: must be in [0, 16777216], got 2147483646",
          "model.vocab=2147483646");
  INVALID("--set: model.kernel: must be in [1, 4096], got 2147483647",
          "model.kernel=2147483647");
  INVALID("--set: execution.prefetch: must be in [0, 65536], got 2147483646",
          "execution.prefetch=2147483646");
  INVALID("--set: fabric.cores: must be in [0, 1048576], got 2147483647",
          "fabric.cores=2147483647");
  INVALID("--set: model.groups: must be >= 1, got 0", "model.groups=0");
  INVALID("--set: execution.micro_batch: must be >= 0, got -1",
          "execution.micro_batch=-1");
  INVALID("--set: execution.micro_batch: 5 does not divide train.batch = 32 "
          "(the default)",
          "execution.micro_batch=5");
  INVALID("--set: train.eval_every: must be >= 0, got -2",
          "train.eval_every=-2");
  INVALID("--set: metrics.log_every: must be >= 1, got 0",
          "metrics.log_every=0");
  INVALID("--set: optimizer.nesterov: needs optimizer.momentum > 0, got 0 "
          "(set by --set)",
          "optimizer.nesterov=true", "optimizer.momentum=0");
  INVALID("--set: metrics.noise_scale: is not available with "
          "execution.replicas = 2 yet",
          "metrics.noise_scale=true", "execution.replicas=2");
  INVALID("--set: metrics.noise_scale: is not available in the pipeline mode "
          "yet; sequential and weight_streaming measure it",
          "metrics.noise_scale=true", "execution.mode=pipeline");
  INVALID("--set: metrics.noise_scale: is not available in the "
          "block_sequential mode yet; sequential and weight_streaming "
          "measure it",
          "metrics.noise_scale=true", "execution.mode=block_sequential");
  INVALID("--set: optimizer.min_lr: 0.1 is above optimizer.lr = 0.05 (the "
          "default)",
          "optimizer.schedule=cosine", "optimizer.min_lr=0.1");
  INVALID("--set: model.norm: groupnorm is for a cnn; model.kind is mlp (the "
          "default), which uses layernorm",
          "model.norm=groupnorm");
  INVALID("default: model.groups: 8 groups do not divide model.channels[1] = "
          "20 (set by --set)",
          "model.kind=cnn", "model.norm=groupnorm", "model.channels=[16, 20]");
  INVALID("--set: model.channels: a cnn needs at least one conv stage, got []",
          "model.kind=cnn", "model.channels=[]");
  /* the byte tokenizer's vocabulary needs no file: compile refuses what
   * train would (its 256 ids fit, as does 0, the tokenizer's own) */
  INVALID("--set: model.vocab: 100, but the tokenizer (bytes) makes ids up "
          "to 255",
          "model.kind=gpt", "data.dataset=text", "model.vocab=100");
  {
    st_config g;
    st_error e = {0};
    st_config_defaults(&g);
    const char *gpt[] = {"model.kind=gpt", "data.dataset=text",
                         "model.vocab=256"};
    for (size_t i = 0; i < sizeof gpt / sizeof gpt[0]; i++)
      st_config_set(&g, gpt[i], &e);
    CHECK(st_config_validate(&g, &e) == 0, "vocab 256 of bytes: %s", e.msg);
  }

  /* the remaining simple bounds: the message names the key and its rule */
  static const char *const more[][2] = {
      {"model.residual_blocks=-1",
       "--set: model.residual_blocks: must be in [0, 65536]"},
      {"model.dense=[0]", "--set: model.dense: every entry must be in [1, "},
      {"data.train_limit=-1", "--set: data.train_limit: must be >= 0"},
      {"data.test_limit=-1", "--set: data.test_limit: must be >= 0"},
      {"optimizer.weight_decay=-1",
       "--set: optimizer.weight_decay: must be >= 0"},
      {"optimizer.warmup_steps=-1",
       "--set: optimizer.warmup_steps: must be >= 0"},
      {"optimizer.min_lr=-1", "--set: optimizer.min_lr: must be >= 0"},
      {"optimizer.step_size=0", "--set: optimizer.step_size: must be >= 1"},
      {"optimizer.gamma=0", "--set: optimizer.gamma: must be > 0"},
      {"train.checkpoint_every=-1",
       "--set: train.checkpoint_every: must be >= 0"},
      {"train.keep_checkpoints=-1",
       "--set: train.keep_checkpoints: must be >= 0"},
      {"fabric.cores=-1", "--set: fabric.cores: must be in [0, 1048576]"},
  };
  for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
    st_config m;
    st_error e = {0};
    st_config_defaults(&m);
    int rc = st_config_set(&m, more[i][0], &e);
    if (!rc) rc = st_config_validate(&m, &e);
    CHECK(rc == ST_ECONFIG && !strncmp(e.msg, more[i][1], strlen(more[i][1])),
          "--set %s: '%s'", more[i][0], e.msg);
  }

  /* valid edge values pass */
  st_config c;
  st_error err = {0};
  st_config_defaults(&c);
  const char *edges[] = {"train.batch=1",       "optimizer.momentum=0",
                         "model.dropout=0.999", "model.classes=2",
                         "model.kernel=1",      "execution.micro_batch=1",
                         "model.hidden=[]",     "train.epochs=0"};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
    st_config_set(&c, edges[i], &err);
  CHECK(st_config_validate(&c, &err) == 0, "edge values rejected: %s", err.msg);

  /* a struct filled by hand with a bad enum or a NaN is caught too */
  st_config_defaults(&c);
  strcpy(c.model.kind, "rnn");
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG &&
            !strcmp(err.msg, "default: model.kind: 'rnn' is not one of "
                             "mlp, cnn, gpt"),
        "hand-set enum: '%s'", err.msg);
  st_config_defaults(&c);
  c.optimizer.lr = NAN;
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG &&
            !strcmp(err.msg, "default: optimizer.lr: must be > 0, got nan"),
        "NaN lr: '%s'", err.msg);

  /* errors about file values start with the file's line:col */
  char path[64], want[512];
  st_config_defaults(&c);
  CHECK(load_text(&c, "train:\n  batch: 0\n", path, &err) == 0, "load");
  snprintf(want, sizeof want,
           "%s:2:10: train.batch: must be in [1, 16777216], got 0", path);
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG && !strcmp(err.msg, want),
        "batch 0 from file:\n  got  '%s'\n  want '%s'", err.msg, want);
  st_config_defaults(&c);
  CHECK(load_text(&c, "train:\n  batch: 32\nexecution:\n  micro_batch: 5\n",
                  path, &err) == 0,
        "load");
  snprintf(want, sizeof want,
           "%s:4:16: execution.micro_batch: 5 does not divide train.batch = "
           "32 (set at %s:2:10)",
           path, path);
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG && !strcmp(err.msg, want),
        "micro_batch from file:\n  got  '%s'\n  want '%s'", err.msg, want);
  /* a value given by an alias is placed at its own key, not at the anchor
   * (another key's line, which libyaml's node is marked with) */
  st_config_defaults(&c);
  CHECK(load_text(&c, "optimizer:\n  lr: &x 1\n  momentum: *x\n", path, &err) ==
            0,
        "load: %s", err.msg);
  snprintf(want, sizeof want,
           "%s:3:3: optimizer.momentum: must be in [0, 1), got 1", path);
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG && !strcmp(err.msg, want),
        "an alias's value:\n  got  '%s'\n  want '%s'", err.msg, want);
}

static void test_schema_print(void) {
  char *text = capture(print_schema, NULL);
  for (int i = 0; i < N_KEYS; i++) {
    char row[64];
    snprintf(row, sizeof row, "  %s ", all_keys[i]);
    CHECK(strstr(text, row) != NULL, "--help misses %s", all_keys[i]);
  }
  /* the key column as wide as the longest key, so every type lines up */
  CHECK(
      strstr(text, "  model.hidden                   int list [256, 256]   ") !=
              NULL &&
          strstr(text, "  execution.compute_memory_limit int64    0   ") !=
              NULL,
      "row layout:\n%s", text);
  CHECK(strstr(text, "one of: relu, gelu, gelu_tanh") != NULL, "enum values");
  free(text);
}

/* docs/config.md carries the generated table between two markers; it must
 * match the schema. STRATA_UPDATE_DOCS=1 rewrites it instead of failing. */
static void test_docs_in_sync(void) {
  static const char begin[] = "<!-- BEGIN GENERATED: st_config_schema_markdown "
                              "(tests/config/test_config.c) -->\n";
  static const char end[] = "<!-- END GENERATED -->";
  /* From the repository root (as make test runs it) or from the binary's
   * own folder under BUILD/tests/config. */
  static const char *const candidates[] = {"docs/config.md",
                                           "../../../docs/config.md",
                                           "../../../../docs/config.md"};
  const char *path = candidates[0];
  FILE *f = NULL;
  for (int i = 0; i < 3 && !f; i++) f = fopen(path = candidates[i], "rb");
  CHECK(f != NULL, "cannot open docs/config.md (run from the repository "
                   "root)");
  if (!f) return;
  static char doc[1 << 16];
  size_t n = fread(doc, 1, sizeof doc - 1, f);
  doc[n] = '\0';
  fclose(f);
  char *table = capture(schema_markdown, NULL);
  char *b = strstr(doc, begin), *e = b ? strstr(b, end) : NULL;
  CHECK(b && e, "%s lacks the generated-table markers", path);
  if (b && e) {
    b += strlen(begin);
    int same = (size_t)(e - b) == strlen(table) &&
               memcmp(b, table, strlen(table)) == 0;
    if (!same && getenv("STRATA_UPDATE_DOCS")) {
      f = fopen(path, "wb");
      fwrite(doc, 1, (size_t)(b - doc), f);
      fputs(table, f);
      fputs(e, f);
      fclose(f);
      fprintf(stderr, "rewrote %s\n", path);
      same = 1;
    }
    CHECK(same, "%s is out of date: run STRATA_UPDATE_DOCS=1 %s", path,
          "build/tests/config/test_config");
  }
  for (int i = 0; i < N_KEYS; i++) {
    char cell[64];
    snprintf(cell, sizeof cell, "| `%s` |", all_keys[i]);
    CHECK(strstr(table, cell) != NULL, "docs table misses %s", all_keys[i]);
  }
  free(table);
}

/* A run writes its resolved config as config.yaml; loading that file back
 * must give the run's config, in every mode, for every shipped config — and
 * the same behaviour where a key's value alone should decide it: the fabric
 * the compiler plans on, the keys a mode ignores, validation. Before, every
 * written key counted as set, so the written fabric.pe_* figures replaced a
 * cpu fabric's and `compile D/config.yaml` planned on 47 KB cores. */
static void test_shipped_round_trip(void) {
  static const char *const dirs[] = {"configs", "../../../configs",
                                     "../../../../configs"};
  static const char *const modes[] = {"sequential", "pipeline",
                                      "block_sequential", "pipelined_backprop",
                                      "weight_streaming"};
  DIR *d = NULL;
  const char *dir = dirs[0];
  for (int i = 0; i < 3 && !d; i++) d = opendir(dir = dirs[i]);
  CHECK(d != NULL, "cannot open configs/ (run from the repository root)");
  if (!d) return;
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".yaml")) continue;
    files++;
    char path[512], set[64];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    {
      /* as shipped, every key it sets is read: a notice from `strata
       * train` on a shipped config is a dead line in the config */
      st_config c;
      st_error err = {0};
      const char *unused[ST_CONFIG_MAX_KEYS];
      st_config_defaults(&c);
      int rc = st_config_load(&c, path, &err);
      if (!rc) rc = st_config_validate(&c, &err);
      int n = rc ? 0 : st_config_unused(&c, unused, ST_CONFIG_MAX_KEYS);
      CHECK(rc == 0 && n == 0, "%s: %d keys it sets are not read (%s %s) %s",
            path, n, n ? unused[0] : "",
            n ? st_config_unused_why(&c, unused[0]) : "", err.msg);
    }
    for (int m = 0; m < 5; m++) {
      st_config a, b;
      st_error err = {0}, err_b = {0};
      st_config_defaults(&a);
      int rc = st_config_load(&a, path, &err);
      snprintf(set, sizeof set, "execution.mode=%s", modes[m]);
      if (!rc) rc = st_config_set(&a, set, &err);
      CHECK(rc == 0, "%s: %s", path, err.msg);
      if (rc) continue;
      char *text = capture(write_config, &a);
      char tmp[64];
      st_config_defaults(&b);
      rc = load_text(&b, text, tmp, &err);
      CHECK(rc == 0 && same_settings(&a, &b),
            "%s (%s): written and read back "
            "differs: %s",
            path, modes[m], err.msg);
      int va = st_config_validate(&a, &err),
          vb = st_config_validate(&b, &err_b);
      CHECK(va == vb, "%s (%s): validates %d, its written config %d", path,
            modes[m], va, vb);
      const char *ua[32], *ub[32];
      int na = st_config_unused(&a, ua, 32), nb = st_config_unused(&b, ub, 32);
      int same_unused = na == nb;
      for (int i = 0; same_unused && i < na && i < 32; i++)
        same_unused = !strcmp(ua[i], ub[i]);
      CHECK(same_unused, "%s (%s): %d unused keys, written config %d", path,
            modes[m], na, nb);
      st_fabric fa, fb;
      st_error ea = {0}, eb = {0};
      int ra = st_fabric_resolve(&fa, &a, &ea),
          rb = st_fabric_resolve(&fb, &b, &eb);
      CHECK(ra == rb && (ra || memcmp(&fa, &fb, sizeof fa) == 0),
            "%s (%s): the fabric resolves differently from the written "
            "config: %s pe_memory %g / %s pe_memory %g",
            path, modes[m], fa.name, fa.pe_memory, fb.name, fb.pe_memory);
      free(text);
    }
  }
  closedir(d);
  CHECK(files >= 10, "only %d configs found in %s", files, dir);
}

/* Keys the chosen setting does not read (st_config_unused): a key another
 * model kind, optimizer, schedule, dataset or mode reads, set away from its
 * default, is listed with the key and value that leave it unread, as the
 * code that consumes it reads it (model.c's builders, optim.c, load_data,
 * the executors); a key the setting reads, or one left at its default, is
 * not. Before, only execution.mode's keys were listed: model.hidden under a
 * cnn or optimizer.beta1 under sgd were ignored without a word. */
static void test_unused_keys(void) {
  static const struct {
    const char *sets; /* --set assignments, space-separated; the last is
                         the key in question */
    const char *why;  /* st_config_unused_why, or NULL: the key is read */
  } cases[] = {
      {"model.kind=cnn model.hidden=[64]", "model.kind cnn"},
      {"model.kind=cnn model.residual=true", "model.kind cnn"},
      {"model.channels=[8]", "model.kind mlp"},
      {"model.kernel=5", "model.kind mlp"},
      {"model.residual_blocks=1", "model.kind mlp"},
      {"model.pool=avg", "model.kind mlp"},
      {"model.dense=[64]", "model.kind mlp"},
      {"model.groups=4", "model.kind mlp"},
      {"model.kind=cnn model.groups=4", "model.norm none"},
      {"model.kind=cnn model.norm=groupnorm model.groups=4", NULL},
      {"model.kind=cnn model.channels=[8]", NULL},
      {"model.kind=cnn model.dense=[64]", NULL},
      {"model.vocab=300", "model.kind mlp"},
      {"model.context=32", "model.kind mlp"},
      {"model.layers=2", "model.kind mlp"},
      {"model.heads=2", "model.kind mlp"},
      {"model.width=64", "model.kind mlp"},
      {"model.mlp_ratio=2", "model.kind mlp"},
      {"model.tied=false", "model.kind mlp"},
      {"model.fused_loss=false", "model.kind mlp"},
      {"model.positions=rotary", "model.kind mlp"},
      {"model.rotary_dim=8", "model.kind mlp"},
      {"model.hidden=[64]", NULL},
      {"model.residual=true model.hidden=[64,64]", NULL},
      {"model.norm=layernorm", NULL},
      {"model.classes=12", NULL},
      {"model.kind=gpt data.dataset=text model.hidden=[64]", "model.kind gpt"},
      {"model.kind=gpt data.dataset=text model.classes=5", "model.kind gpt"},
      {"model.kind=gpt data.dataset=text model.norm=layernorm",
       "model.kind gpt"},
      {"model.kind=gpt data.dataset=text model.rotary_dim=8",
       "model.positions learned"},
      {"model.kind=gpt data.dataset=text model.positions=rotary "
       "model.rotary_dim=8",
       NULL},
      {"model.kind=gpt data.dataset=text model.width=64", NULL},
      {"model.kind=gpt data.dataset=text model.dropout=0.1", NULL},
      {"model.kind=gpt data.dataset=text model.activation=gelu", NULL},
      {"optimizer.beta1=0.95", "optimizer.kind sgd"},
      {"optimizer.beta2=0.95", "optimizer.kind sgd"},
      {"optimizer.eps=1e-6", "optimizer.kind sgd"},
      {"optimizer.kind=adamw optimizer.momentum=0.5", "optimizer.kind adamw"},
      {"optimizer.kind=adamw optimizer.nesterov=true", "optimizer.kind adamw"},
      {"optimizer.kind=adamw optimizer.beta2=0.95", NULL},
      {"optimizer.momentum=0.5", NULL},
      {"optimizer.nesterov=true", NULL},
      {"optimizer.weight_decay=0.1", NULL},
      {"optimizer.warmup_steps=10", NULL},
      {"optimizer.min_lr=0.001", "optimizer.schedule constant"},
      {"optimizer.schedule=step optimizer.min_lr=0.001",
       "optimizer.schedule step"},
      {"optimizer.schedule=cosine optimizer.min_lr=0.001", NULL},
      {"optimizer.schedule=linear optimizer.min_lr=0.001", NULL},
      {"optimizer.step_size=10", "optimizer.schedule constant"},
      {"optimizer.schedule=cosine optimizer.gamma=0.5",
       "optimizer.schedule cosine"},
      {"optimizer.schedule=step optimizer.step_size=10", NULL},
      {"optimizer.schedule=step optimizer.gamma=0.5", NULL},
      {"data.path=/tmp/corpus", "data.dataset fashion_mnist"},
      {"data.tokenizer=tok.json", "data.dataset fashion_mnist"},
      {"data.encoding=utf8", "data.dataset fashion_mnist"},
      {"data.val_fraction=0.2", "data.dataset fashion_mnist"},
      {"data.dataset=synthetic data.dir=/tmp", "data.dataset synthetic"},
      {"data.dataset=synthetic data.normalize=false", NULL},
      {"model.kind=gpt data.dataset=text data.normalize=false",
       "data.dataset text"},
      {"model.kind=gpt data.dataset=text data.val_fraction=0.2", NULL},
      {"data.train_limit=100", NULL},
      {"data.shuffle=false", NULL},
      {"train.bf16_activations=false", "model.kind mlp"},
      {"model.kind=gpt data.dataset=text train.bf16_activations=false",
       "train.precision fp32"},
      {"model.kind=gpt data.dataset=text train.precision=bf16 "
       "train.bf16_activations=false",
       NULL},
      {"metrics.noise_ema=0.5", "metrics.noise_scale false"},
      {"metrics.noise_scale=true metrics.noise_ema=0.5", NULL},
      {"execution.stages=2", "execution.mode sequential"},
      {"execution.mode=pipeline execution.virtual_stages=3",
       "execution.schedule 1f1b"},
      {"execution.mode=pipeline execution.schedule=interleaved "
       "execution.virtual_stages=3",
       NULL},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    st_config cfg;
    st_error err = {0};
    st_config_defaults(&cfg);
    char sets[256], key[96] = "";
    snprintf(sets, sizeof sets, "%s", cases[c].sets);
    int rc = 0;
    for (char *tok = strtok(sets, " "); tok && !rc; tok = strtok(NULL, " ")) {
      rc = st_config_set(&cfg, tok, &err);
      snprintf(key, sizeof key, "%.*s", (int)strcspn(tok, "="), tok);
    }
    if (!rc) rc = st_config_validate(&cfg, &err);
    CHECK(rc == 0, "%s: %s", cases[c].sets, err.msg);
    if (rc) continue;
    const char *unused[ST_CONFIG_MAX_KEYS];
    int n = st_config_unused(&cfg, unused, ST_CONFIG_MAX_KEYS);
    const char *why = st_config_unused_why(&cfg, key);
    if (cases[c].why)
      CHECK(n == 1 && !strcmp(unused[0], key) && why &&
                !strcmp(why, cases[c].why),
            "%s: %d keys listed (first %s), why '%s', not %s alone by '%s'",
            cases[c].sets, n, n ? unused[0] : "none", why ? why : "(read)", key,
            cases[c].why);
    else
      CHECK(n == 0 && !why, "%s: %d keys listed (first %s), why '%s'",
            cases[c].sets, n, n ? unused[0] : "none", why ? why : "(read)");
  }
  /* set, but to the default: nothing said (a run's own config.yaml holds
   * every key); the same value away from the default is listed */
  st_config cfg;
  st_error err = {0};
  char path[64];
  st_config_defaults(&cfg);
  const char *unused[ST_CONFIG_MAX_KEYS];
  int rc = load_text(&cfg,
                     "optimizer:\n  kind: sgd\n  beta1: 0.9\n  eps: 1e-8\n"
                     "model:\n  kernel: 3\n",
                     path, &err);
  CHECK(rc == 0 && st_config_unused(&cfg, unused, ST_CONFIG_MAX_KEYS) == 0,
        "keys set to their defaults: %d listed (%s)",
        rc ? -1 : st_config_unused(&cfg, unused, ST_CONFIG_MAX_KEYS), err.msg);
  /* a file's key names its line, for the CLI's notice */
  st_config_defaults(&cfg);
  rc = load_text(&cfg, "optimizer:\n  kind: sgd\n  beta1: 0.95\n", path, &err);
  int n = rc ? -1 : st_config_unused(&cfg, unused, ST_CONFIG_MAX_KEYS);
  char want[128];
  snprintf(want, sizeof want, "%s:3:10", path);
  CHECK(n == 1 && !strcmp(unused[0], "optimizer.beta1") &&
            !strcmp(st_config_where(&cfg, "optimizer.beta1"), want),
        "a file's beta1 under sgd: %d listed, at %s (%s)", n,
        n == 1 ? st_config_where(&cfg, unused[0]) : "-", err.msg);
}

/* The fabric kinds the compiler knows; anything else is refused here. */
static void test_fabric_kinds(void) {
  const char *ok[] = {"fabric.kind=cpu", "fabric.kind=mesh",
                      "fabric.kind=wse2"};
  for (int i = 0; i < 3; i++) {
    st_config c;
    st_error e = {0};
    st_config_defaults(&c);
    int rc = st_config_set(&c, ok[i], &e);
    if (!rc) rc = st_config_validate(&c, &e);
    CHECK(rc == 0 && !strcmp(c.fabric.kind, ok[i] + 12), "--set %s: %s", ok[i],
          e.msg);
  }
  st_config c;
  st_error e = {0};
  st_config_defaults(&c);
  CHECK(st_config_set(&c, "fabric.kind=tpu", &e) == ST_ECONFIG &&
            strstr(e.msg, "cpu, mesh, wse2") != NULL,
        "unknown fabric kind: '%s'", e.msg);
}

/* st_config_changes: the keys whose values differ, in the schema's order,
 * each with both values as config.yaml writes them; none for two equal
 * configs. */
static void test_changes(void) {
  st_config a, b;
  st_error err = {0};
  st_config_defaults(&a);
  b = a;
  const char *sets[] = {"train.steps=30", "optimizer.lr=0.1",
                        "model.hidden=[64]", "execution.stages=per_block"};
  for (int i = 0; i < 4; i++)
    CHECK(st_config_set(&b, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  int n = st_config_changes(&a, &b, f), none = st_config_changes(&b, &b, f);
  fclose(f);
  CHECK(n == 4 && none == 0 &&
            !strcmp(text, "model.hidden [256, 256] -> [64], optimizer.lr "
                          "0.05 -> 0.1, train.steps 0 -> 30, "
                          "execution.stages 0 -> per_block"),
        "%d and %d changes: '%s'", n, none, text);
  free(text);
}

int main(void) {
  test_defaults();
  test_fabric_kinds();
  test_full_file();
  test_partial_and_empty_files();
  test_round_trip();
  test_changes();
  test_shipped_round_trip();
  test_unused_keys();
  test_set();
  test_set_errors();
  test_load_errors();
  test_limits();
  test_open_errors();
  test_validate();
  test_schema_print();
  test_docs_in_sync();
  TH_DONE();
}
