/*
 * test_sweep.c — the steps-to-result sweep (src/exec/sweep.c) on a tiny
 * problem: an MLP with one hidden layer of 16 on 512 synthetic samples
 * (128 to test, from the same prototypes, written as IDX files),
 * batch sizes 8, 16, 32, two trials each, 60 steps, evaluation every 5.
 *  - it runs and writes sweep.csv, steps.csv, steps.svg and report.md, with
 *    one steps.csv row per batch size and one sweep.csv row per trial;
 *  - trial points follow the Halton sequence (closed form for the first two);
 *  - determinism: two sweeps give byte-identical sweep.csv;
 *  - resume: a sweep.csv with one row deleted is filled back to the full
 *    file, and rows from another learning-rate range are refused;
 *  - target parsing accepts accuracy=/loss= and refuses the rest.
 */
#include "harness.h"
#include "strata.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char data_dir[64]; /* the IDX files written by write_data */

/* Big-endian IDX header: magic, then one int32 per dimension. */
static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static int write_idx(const char *name, const uint8_t *data, int n, int h,
                     int w) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", data_dir, name);
  uint8_t head[16];
  int images = h > 0, len = images ? 16 : 8;
  put_be32(head, images ? 2051 : 2049);
  put_be32(head + 4, (uint32_t)n);
  if (images)
    put_be32(head + 8, (uint32_t)h), put_be32(head + 12, (uint32_t)w);
  gzFile gz = gzopen(path, "wb");
  if (!gz)
    return -1;
  size_t bytes = (size_t)n * (images ? (size_t)h * w : 1);
  int ok = gzwrite(gz, head, (unsigned)len) == len &&
           gzwrite(gz, data, (unsigned)bytes) == (int)bytes;
  return gzclose(gz) == Z_OK && ok ? 0 : -1;
}

/* Train and test sets drawn from ONE synthetic problem (the same class
 * prototypes): 512 + 128 samples, split and written as Fashion-MNIST IDX
 * files, so the test accuracy measures what training learned.
 * (data.dataset: synthetic draws its test set with seed + 1, whose
 * prototypes differ, so its test accuracy stays at chance.) */
static int write_data(void) {
  st_dataset *ds;
  st_error err = {0};
  if (st_dataset_synthetic(&ds, 640, (st_shape){1, 28, 28}, 10, 1, &err)) {
    CHECK(0, "synthetic data: %s", err.msg);
    return -1;
  }
  const size_t px = 28 * 28;
  int rc = write_idx("train-images-idx3-ubyte.gz", ds->pixels, 512, 28, 28);
  if (!rc)
    rc = write_idx("train-labels-idx1-ubyte.gz", ds->labels, 512, 0, 0);
  if (!rc)
    rc = write_idx("t10k-images-idx3-ubyte.gz", ds->pixels + 512 * px, 128, 28,
                   28);
  if (!rc)
    rc = write_idx("t10k-labels-idx1-ubyte.gz", ds->labels + 512, 128, 0, 0);
  st_dataset_destroy(ds);
  CHECK(rc == 0, "writing IDX files into %s", data_dir);
  return rc;
}

static void tiny_config(st_config *c) {
  st_config_defaults(c);
  snprintf(c->data.dir, sizeof c->data.dir, "%s", data_dir);
  c->model.hidden = (st_int_list){1, {16}};
  c->data.train_limit = 512;
  c->data.test_limit = 128;
  c->train.threads = 1;
  snprintf(c->metrics.progress, sizeof c->metrics.progress, "off");
}

static void tiny_options(st_sweep_options *o, const char *dir) {
  memset(o, 0, sizeof *o);
  o->batch_sizes = (st_int_list){3, {8, 16, 32}};
  o->trials = 2;
  o->budget_steps = 60;
  o->eval_every = 5;
  o->lr_min = 1e-3;
  o->lr_max = 1;
  o->target = (st_sweep_target){ST_TARGET_ACCURACY, 0.9};
  snprintf(o->out_dir, sizeof o->out_dir, "%s", dir);
}

/* Whole file into a malloc'd string (caller frees); NULL if unreadable. */
static char *slurp(const char *dir, const char *name) {
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  fclose(f);
  return s;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; s && *s; s++)
    n += *s == '\n';
  return n;
}

static void put(const char *dir, const char *name, const char *text) {
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  fputs(text, f);
  fclose(f);
}

static int run(const st_sweep_options *o, const st_config *c) {
  st_error err = {0};
  int rc = st_sweep_run(o, c, &err);
  CHECK(rc == 0, "sweep: %s", err.msg);
  return rc;
}

static void test_halton(void) {
  /* Radical inverses: 1 -> 1/2, 2 -> 1/4, 3 -> 3/4 in base 2; 1 -> 1/3,
   * 5 -> 2/3 + 1/9 in base 3. Exact in binary floating point or within one
   * rounding of a few additions (1e-15). */
  CHECK(st_sweep_halton(1, 2) == 0.5, "halton(1, 2)");
  CHECK(st_sweep_halton(2, 2) == 0.25, "halton(2, 2)");
  CHECK(st_sweep_halton(3, 2) == 0.75, "halton(3, 2)");
  CHECK(fabs(st_sweep_halton(1, 3) - 1.0 / 3) < 1e-15, "halton(1, 3)");
  CHECK(fabs(st_sweep_halton(5, 3) - (2.0 / 3 + 1.0 / 9)) < 1e-15,
        "halton(5, 3)");
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  tiny_options(&o, "unused");
  double lr, mom;
  /* Trial 0 is the log-midpoint of [1e-3, 1]: 10^-1.5. Trial 1 sits a
   * quarter of the way: 10^-2.25. Momentum: 1 - 10^u, u at 1/3 of
   * [log10 0.01, log10 0.5]. Tolerance: a few roundings of pow/log10. */
  st_sweep_point(&o, &c, 0, &lr, &mom);
  CHECK(fabs(lr - pow(10, -1.5)) < 1e-12, "trial 0 lr %g", lr);
  double u = log10(0.01) + (log10(0.5) - log10(0.01)) / 3;
  CHECK(fabs(mom - (1 - pow(10, u))) < 1e-12, "trial 0 momentum %g", mom);
  CHECK(mom > 0.5 && mom < 0.99, "momentum %g in range", mom);
  st_sweep_point(&o, &c, 1, &lr, &mom);
  CHECK(fabs(lr - pow(10, -2.25)) < 1e-12, "trial 1 lr %g", lr);
  c.optimizer.momentum = 0; /* plain SGD: no momentum searched */
  st_sweep_point(&o, &c, 0, &lr, &mom);
  CHECK(mom == -1, "no momentum for plain sgd: %g", mom);
}

static void test_target_parse(void) {
  st_sweep_target t;
  st_error err = {0};
  CHECK(st_sweep_target_parse(&t, "accuracy=0.85", &err) == 0 &&
            t.kind == ST_TARGET_ACCURACY && t.value == 0.85,
        "accuracy=0.85: %s", err.msg);
  CHECK(st_sweep_target_parse(&t, "loss=0.4", &err) == 0 &&
            t.kind == ST_TARGET_LOSS && t.value == 0.4,
        "loss=0.4: %s", err.msg);
  const char *bad[] = {
      "accuracy",   "acc=0.5", "accuracy=", "accuracy=x", "accuracy=1.5",
      "accuracy=0", "loss=-1", "loss=0.4x", "=0.4",       ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err.msg[0] = 0;
    int rc = st_sweep_target_parse(&t, bad[i], &err);
    CHECK(rc == ST_EARG && strstr(err.msg, "target"),
          "'%s' refused with a message naming the target (rc %d, '%s')", bad[i],
          rc, err.msg);
  }
}

static void test_sweep(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char a[ST_PATH_MAX], b[ST_PATH_MAX];
  snprintf(a, sizeof a, "%s/a", root);
  snprintf(b, sizeof b, "%s/b", root);

  tiny_options(&o, a);
  if (run(&o, &c))
    return;
  const char *files[] = {"sweep.csv", "steps.csv", "steps.svg", "report.md"};
  char *text[4];
  for (int i = 0; i < 4; i++) {
    text[i] = slurp(a, files[i]);
    CHECK(text[i] && text[i][0], "%s written", files[i]);
  }
  CHECK(count_lines(text[0]) == 1 + 3 * 2,
        "sweep.csv: header + 6 trials, "
        "got %d lines",
        count_lines(text[0]));
  CHECK(count_lines(text[1]) == 1 + 3,
        "steps.csv: header + 3 batch sizes, "
        "got %d lines",
        count_lines(text[1]));
  CHECK(text[1] && strstr(text[1], "\n8,") && strstr(text[1], "\n16,") &&
            strstr(text[1], "\n32,"),
        "steps.csv has batch sizes 8, 16, 32:\n%s", text[1] ? text[1] : "");
  /* The target must be reachable here for the test to mean anything: at
   * least one trial of batch 8 reached it (a steps value after "8,"). */
  long steps8 = -1;
  if (text[1] && strstr(text[1], "\n8,"))
    steps8 = strtol(strstr(text[1], "\n8,") + 3, NULL, 10);
  CHECK(steps8 > 0 && steps8 <= 60 && steps8 % 5 == 0,
        "batch 8 reached the target at an evaluated step: %ld", steps8);
  CHECK(text[2] && strstr(text[2], "<svg") && strstr(text[2], "</svg>") &&
            strstr(text[2], "perfect scaling"),
        "steps.svg is an svg with the perfect-scaling line");
  CHECK(text[3] && strstr(text[3], "| batch |") && strstr(text[3], "Rule:") &&
            strstr(text[3], "0.6") && strstr(text[3], "0.9"),
        "report.md has the table and states the rule");

  /* Determinism: a second sweep into another folder. */
  tiny_options(&o, b);
  if (run(&o, &c))
    goto out;
  char *again = slurp(b, "sweep.csv");
  CHECK(again && text[0] && strcmp(again, text[0]) == 0,
        "two sweeps give identical sweep.csv:\n%s---\n%s", text[0], again);
  char *steps_again = slurp(b, "steps.csv");
  CHECK(steps_again && text[1] && strcmp(steps_again, text[1]) == 0,
        "two sweeps give identical steps.csv");
  free(steps_again);

  /* Resume: drop the row of batch 16, trial 1 and sweep again. */
  if (again) {
    char *row = strstr(again, "\n16,1,");
    CHECK(row != NULL, "sweep.csv has batch 16 trial 1");
    if (row) {
      char *next = strchr(row + 1, '\n');
      memmove(row + 1, next + 1, strlen(next + 1) + 1);
      put(b, "sweep.csv", again);
      CHECK(count_lines(again) == 6, "one row removed");
      if (run(&o, &c) == 0) {
        char *filled = slurp(b, "sweep.csv");
        CHECK(filled && strcmp(filled, text[0]) == 0,
              "resumed sweep fills the missing row:\n%s", filled);
        char *rep = slurp(b, "report.md");
        CHECK(rep && text[3] && strcmp(rep, text[3]) == 0,
              "resumed sweep gives the same report");
        free(rep);
        free(filled);
      }
    }
  }
  free(again);

  /* Rows written by another learning-rate range are refused. */
  o.lr_min = 1e-2;
  st_error err = {0};
  int rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EFORMAT && strstr(err.msg, "sweep.csv") &&
            strstr(err.msg, "lr"),
        "another lr range refused: rc %d '%s'", rc, err.msg);

  /* Bad options are refused before anything runs. */
  tiny_options(&o, b);
  o.batch_sizes = (st_int_list){2, {16, 8}};
  rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EARG && strstr(err.msg, "increase"),
        "decreasing batch sizes refused: '%s'", err.msg);
out:
  for (int i = 0; i < 4; i++)
    free(text[i]);
}

int main(void) {
  test_halton();
  test_target_parse();
  char root[] = "/tmp/strata-test-sweep-XXXXXX";
  if (!mkdtemp(root)) {
    CHECK(0, "mkdtemp");
    TH_DONE();
  }
  snprintf(data_dir, sizeof data_dir, "%s", root);
  if (write_data() == 0)
    test_sweep(root);
  char cmd[sizeof root + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", root);
  TH_DONE();
}
