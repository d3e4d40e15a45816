/*
 * test_sweep.c — the steps-to-result sweep (src/lab/sweep.c) on a tiny
 * problem: an MLP with one hidden layer of 16 on 512 synthetic samples
 * (128 to test, from the same prototypes, written as IDX files),
 * batch sizes 8, 16, 32, two trials each, 60 steps, evaluation every 5.
 *  - it runs and writes sweep.csv, steps.csv, steps.svg and report.md, with
 *    one steps.csv row per batch size and one sweep.csv row per trial;
 *  - trial points follow the Halton sequence (closed form for the first two);
 *  - determinism: two sweeps give byte-identical sweep.csv;
 *  - resume: a sweep.csv with one row deleted is filled back to the full
 *    file, and rows from another learning-rate range, target or config
 *    are refused (sweep.key), other thread counts accepted;
 *  - parallel trials: jobs = 3 writes the same four files byte for byte as
 *    jobs = 1, also when resuming a partial sweep that jobs = 3 began;
 *    jobs < 1 is refused; when several trials fail the error is the first
 *    failed trial's in (batch, trial) order, whichever failed first in
 *    time, and a trial already running when another failed is recorded;
 *  - the regime rule (st_sweep_regimes) on hand-made step counts, and the
 *    fit of S_min (1 + B_crit / B) (st_sweep_fit) on exact and perturbed
 *    curves;
 *  - a metric equal to the target meets it (accuracy and loss);
 *  - budget_epochs caps each batch size's steps at ceil(E n / B), rounded
 *    up where E n / B is not whole;
 *    eval_growth puts every steps to result on the geometric schedule;
 *    noise_batch reruns that batch's best trial and writes the B_simple of
 *    the windows an independent trainer with metrics.noise_scale gives,
 *    bit for bit (noise.csv's last row; report.md's first 10%, 40-60% and
 *    last 20%);
 *  - target parsing accepts accuracy=/loss= and refuses the rest;
 *  - weights an update left non-finite after a finite training loss are a
 *    divergence, not a trial that met an accuracy target.
 */
#include "harness.h"
#include "strata.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char data_dir[64]; /* the IDX files written by write_data */

/* Threads pinned to cpus (execution.pin), counted: this definition stands
 * in for the C library's, and pins nothing. */
static atomic_int pins;
int pthread_setaffinity_np(pthread_t thread, size_t size,
                           const cpu_set_t *set) {
  (void)thread, (void)size, (void)set;
  atomic_fetch_add(&pins, 1);
  return 0;
}

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
  if (images) put_be32(head + 8, (uint32_t)h), put_be32(head + 12, (uint32_t)w);
  gzFile gz = gzopen(path, "wb");
  if (!gz) return -1;
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
  if (!rc) rc = write_idx("train-labels-idx1-ubyte.gz", ds->labels, 512, 0, 0);
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
  o->jobs = 1;
}

/* Whole file into a malloc'd string (caller frees); NULL if unreadable. */
static char *slurp(const char *dir, const char *name) {
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
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
  for (; s && *s; s++) n += *s == '\n';
  return n;
}

static int count_matches(const char *s, const char *what) {
  int n = 0;
  for (; s && (s = strstr(s, what)); s++) n++;
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

/* The regime rule on hand-made step counts, boundaries included: the
 * ratios below are exact quotients (150/250 is the double nearest 0.6, as
 * is the constant), so r == 0.6 must count as perfect and r == 0.9 as
 * maximal. */
static void test_regimes(void) {
  const int batch[] = {1, 2, 4, 8, 16, 32, 64};
  const int64_t steps[] = {1000, 500, 250, 150, 120, 108, 106};
  double ratio[7];
  int regime[7];
  st_sweep_scaling s = st_sweep_regimes(batch, steps, 7, ratio, regime);
  const int want[] = {ST_REGIME_NONE,        ST_REGIME_PERFECT,
                      ST_REGIME_PERFECT,     ST_REGIME_PERFECT,
                      ST_REGIME_DIMINISHING, ST_REGIME_MAXIMAL,
                      ST_REGIME_MAXIMAL};
  for (int k = 0; k < 7; k++)
    CHECK(regime[k] == want[k], "batch %d: regime %d, want %d (r %g)", batch[k],
          regime[k], want[k], ratio[k]);
  CHECK(isnan(ratio[0]) && ratio[1] == 0.5 && ratio[3] == 0.6 &&
            ratio[5] == 0.9,
        "ratios %g %g %g %g", ratio[0], ratio[1], ratio[3], ratio[5]);
  CHECK(s.reached == 7 && s.end_perfect == 3 && s.start_maximal == 4,
        "perfect up to batch 8, maximal from 16: reached %d end %d start %d",
        s.reached, s.end_perfect, s.start_maximal);

  /* A batch size that was not reached is skipped, and a span over two
   * doublings is normalised to one: (100 / 400)^(1/2) = 0.5. */
  const int b2[] = {4, 8, 16, 32};
  const int64_t s2[] = {400, -1, 100, 90};
  s = st_sweep_regimes(b2, s2, 4, ratio, regime);
  CHECK(regime[1] == ST_REGIME_NONE && isnan(ratio[1]) &&
            fabs(ratio[2] - 0.5) < 1e-15 && regime[2] == ST_REGIME_PERFECT &&
            regime[3] == ST_REGIME_MAXIMAL,
        "gap: regimes %d %d %d, r %g", regime[1], regime[2], regime[3],
        ratio[2]);
  CHECK(s.reached == 3 && s.end_perfect == 2 && s.start_maximal == 2,
        "gap: reached %d end %d start %d", s.reached, s.end_perfect,
        s.start_maximal);

  /* Every span perfect: perfect scaling ends at the last batch size. */
  const int64_t s3[] = {100, 50, 25};
  s = st_sweep_regimes(batch, s3, 3, NULL, NULL);
  CHECK(s.end_perfect == 2 && s.start_maximal == -1, "all perfect: %d %d",
        s.end_perfect, s.start_maximal);
  /* Maximal first, then a helpful doubling: no maximal data parallelism,
   * and perfect scaling ends at once. */
  const int64_t s4[] = {100, 95, 40};
  s = st_sweep_regimes(batch, s4, 3, NULL, regime);
  CHECK(regime[1] == ST_REGIME_MAXIMAL && s.end_perfect == 0 &&
            s.start_maximal == -1,
        "maximal then perfect: %d %d %d", regime[1], s.end_perfect,
        s.start_maximal);
  /* Fewer than two reached: nothing to name. */
  const int64_t s5[] = {-1, 5};
  s = st_sweep_regimes(batch, s5, 2, ratio, regime);
  CHECK(s.reached == 1 && s.end_perfect == -1 && s.start_maximal == -1 &&
            regime[1] == ST_REGIME_NONE,
        "one reached: %d %d %d", s.reached, s.end_perfect, s.start_maximal);
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
  /* the names the run's own files give the metrics (summary.json,
   * metrics.jsonl) */
  CHECK(st_sweep_target_parse(&t, "test_accuracy=0.8", &err) == 0 &&
            t.kind == ST_TARGET_ACCURACY && t.value == 0.8,
        "test_accuracy=0.8: %s", err.msg);
  CHECK(st_sweep_target_parse(&t, "test_loss=0.5", &err) == 0 &&
            t.kind == ST_TARGET_LOSS && t.value == 0.5,
        "test_loss=0.5: %s", err.msg);
  const char *bad[] = {
      "accuracy",       "acc=0.5",    "accuracy=",         "accuracy=x",
      "accuracy=1.5",   "accuracy=0", "loss=-1",           "loss=0.4x",
      "=0.4",           "",           "test_accuracy=1.5", "test_acc=0.8",
      "train_loss=0.4", "test_loss="};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err.msg[0] = 0;
    int rc = st_sweep_target_parse(&t, bad[i], &err);
    CHECK(rc == ST_EARG && strstr(err.msg, "target"),
          "'%s' refused with a message naming the target (rc %d, '%s')", bad[i],
          rc, err.msg);
  }
}

static void test_fit(void) {
  /* Exact points of S = 1024 (1 + 64 / B) for B = 1 .. 1024 (whole
   * numbers): the fit is exact up to rounding. */
  int batch[11];
  int64_t steps[11];
  for (int k = 0; k < 11; k++) {
    batch[k] = 1 << k;
    steps[k] = 1024 + 65536 / batch[k];
  }
  double s_min, e_min, b = st_sweep_fit(batch, steps, 11, &s_min, &e_min);
  CHECK(fabs(b - 64) < 1e-6 && fabs(s_min - 1024) < 1e-6 &&
            fabs(e_min - 65536) < 1e-3,
        "fit of an exact curve: B_crit %.9g S_min %.9g E_min %.9g", b, s_min,
        e_min);
  /* Steps off by +-10% alternately: B_crit within 25%. */
  for (int k = 0; k < 11; k++)
    steps[k] =
        (int64_t)llround((1024 + 65536.0 / batch[k]) * (k % 2 ? 1.1 : 0.9));
  b = st_sweep_fit(batch, steps, 11, NULL, NULL);
  CHECK(fabs(b / 64 - 1) < 0.25, "fit of +-10%% noisy steps: B_crit %.2f", b);
  /* Not-reached entries are skipped: the same exact curve with holes. */
  for (int k = 0; k < 11; k++)
    steps[k] = k % 3 == 1 ? -1 : 1024 + 65536 / batch[k];
  b = st_sweep_fit(batch, steps, 11, NULL, NULL);
  CHECK(fabs(b - 64) < 1e-6, "not-reached batch sizes skipped: %.9g", b);
  /* No fit: one point; steps that grow with the batch. */
  b = st_sweep_fit(batch, steps, 1, &s_min, &e_min);
  CHECK(isnan(b) && isnan(s_min) && isnan(e_min), "one point: no fit");
  for (int k = 0; k < 11; k++) steps[k] = 100 + 10 * k;
  b = st_sweep_fit(batch, steps, 11, NULL, NULL);
  CHECK(isnan(b), "growing steps: no fit (%g)", b);
}

static const char *files[] = {"sweep.csv", "steps.csv", "steps.svg",
                              "report.md"};

/* Each of the four files in dir equals want[i] byte for byte. */
static void check_same_files(const char *dir, char *const want[4],
                             const char *what) {
  for (int i = 0; i < 4; i++) {
    char *got = slurp(dir, files[i]);
    CHECK(got && want[i] && strcmp(got, want[i]) == 0,
          "%s: %s differs from the jobs = 1 sweep's:\n%s---\n%s", what,
          files[i], want[i] ? want[i] : "", got ? got : "(missing)");
    free(got);
  }
}

/* Drops the row of sweep.csv starting with prefix ("16,1,"). */
static int drop_row(const char *dir, const char *prefix) {
  char *s = slurp(dir, "sweep.csv");
  char key[32];
  snprintf(key, sizeof key, "\n%s", prefix);
  char *row = s ? strstr(s, key) : NULL;
  if (row) {
    char *next = strchr(row + 1, '\n');
    memmove(row + 1, next + 1, strlen(next + 1) + 1);
    put(dir, "sweep.csv", s);
  }
  free(s);
  return row ? 0 : -1;
}

/* want: the four files of the jobs = 1 sweep (tiny_options). Three jobs run
 * the six trials two or three at a time, finishing in an order that depends
 * on timing; the files may not. */
static void test_jobs(const char *root, char *const want[4]) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char dir[ST_PATH_MAX];

  snprintf(dir, sizeof dir, "%s/jobs3", root);
  tiny_options(&o, dir);
  o.jobs = 3;
  char *log = NULL;
  size_t log_len = 0;
  o.progress = open_memstream(&log, &log_len);
  int rc = run(&o, &c);
  fclose(o.progress);
  if (rc == 0) {
    check_same_files(dir, want, "jobs = 3");
    CHECK(count_lines(log) == 6 && count_matches(log, ": target at") +
                                           count_matches(log, ": not reached") +
                                           count_matches(log, ": diverged") ==
                                       6,
          "jobs = 3: one progress line per trial:\n%s", log);
  }
  free(log);

  /* train.threads left at 0 (all cores): with jobs > 1 each trial is put
   * on one thread, which must not change a bit either. */
  snprintf(dir, sizeof dir, "%s/jobs3-threads0", root);
  tiny_options(&o, dir);
  o.jobs = 3;
  c.train.threads = 0;
  if (run(&o, &c) == 0)
    check_same_files(dir, want, "jobs = 3, train.threads = 0");
  c.train.threads = 1;

  /* More jobs than trials: the extra ones have nothing to do. */
  snprintf(dir, sizeof dir, "%s/jobs16", root);
  tiny_options(&o, dir);
  o.jobs = 16;
  if (run(&o, &c) == 0) check_same_files(dir, want, "jobs = 16");

  /* Resume with jobs > 1: a first sweep over batch sizes 8 and 32 (what a
   * sweep killed part-way leaves: some finished trials), one of its rows
   * lost as well, then the full sweep into the same folder runs the three
   * missing trials and must end with the uninterrupted sweep's files. */
  snprintf(dir, sizeof dir, "%s/resume3", root);
  tiny_options(&o, dir);
  o.jobs = 3;
  o.batch_sizes = (st_int_list){2, {8, 32}};
  if (run(&o, &c) == 0) {
    char *part = slurp(dir, "sweep.csv");
    CHECK(count_lines(part) == 1 + 2 * 2, "partial sweep: 4 trials, got %d",
          count_lines(part) - 1);
    free(part);
    CHECK(drop_row(dir, "32,0,") == 0, "partial sweep.csv has 32,0");
    tiny_options(&o, dir);
    o.jobs = 3;
    o.progress = open_memstream(&log, &log_len);
    rc = run(&o, &c);
    fclose(o.progress);
    if (rc == 0) {
      check_same_files(dir, want, "resumed with jobs = 3");
      /* Only the three missing trials ran: 16,0, 16,1 and 32,0. */
      CHECK(count_lines(log) == 4 && strstr(log, "3 trials reused") &&
                count_matches(log, "sweep: batch 16 trial") == 2 &&
                count_matches(log, "sweep: batch 32 trial 1/") == 1,
            "resume runs the missing trials only:\n%s", log);
    }
    free(log);

    /* A narrower resume (batch 8, one trial) loses no finished trial:
     * the five rows outside its grid stay in sweep.csv, after its own, and
     * a full resume then reuses all six and ends with the uninterrupted
     * files. An earlier noise.csv, which this report lacks, goes. */
    char *full = slurp(dir, "sweep.csv");
    char noise[ST_PATH_MAX + 16];
    snprintf(noise, sizeof noise, "%s/noise.csv", dir);
    FILE *nf = fopen(noise, "w");
    if (nf) fputs("step,samples,b_simple,g2,trace\n", nf), fclose(nf);
    tiny_options(&o, dir);
    o.batch_sizes = (st_int_list){1, {8}};
    o.trials = 1;
    if (full && run(&o, &c) == 0) {
      char *narrow = slurp(dir, "sweep.csv");
      /* full: header, 8,0 8,1 16,0 16,1 32,0 32,1; narrow: header, 8,0,
       * then the others in the file's order */
      const char *row1 = strchr(full, '\n') + 1;
      const char *row2 = strchr(row1, '\n') + 1;
      CHECK(narrow && count_lines(narrow) == 7 &&
                strncmp(narrow, full, (size_t)(row2 - full)) == 0 &&
                strcmp(narrow + (row2 - full), row2) == 0,
            "a narrower resume keeps every finished row:\n%s\nwas:\n%s",
            narrow ? narrow : "(missing)", full);
      struct stat st;
      CHECK(stat(noise, &st) != 0, "a resume without a noise run removes "
                                   "the earlier noise.csv");
      free(narrow);
      tiny_options(&o, dir);
      o.progress = open_memstream(&log, &log_len);
      rc = run(&o, &c);
      fclose(o.progress);
      if (rc == 0) {
        check_same_files(dir, want, "resumed after a narrower resume");
        CHECK(strstr(log, "6 trials reused") && count_lines(log) == 1,
              "the full resume reuses the kept rows:\n%s", log);
      }
      free(log);
    }
    free(full);
  }

  /* jobs < 1 is refused before anything runs, naming the option. */
  for (int jobs = 0; jobs >= -1; jobs--) {
    snprintf(dir, sizeof dir, "%s/nojobs", root);
    tiny_options(&o, dir);
    o.jobs = jobs;
    st_error err = {0};
    int rc = st_sweep_run(&o, &c, &err);
    CHECK(rc == ST_EARG && strstr(err.msg, "jobs"),
          "jobs = %d refused: rc %d '%s'", jobs, rc, err.msg);
    struct stat st;
    CHECK(stat(dir, &st) != 0, "jobs = %d: nothing written", jobs);
  }

  /* A batch size past the training set is refused before any trial: it
   * used to fail only when the sweep reached it, after the smaller ones had
   * trained. */
  snprintf(dir, sizeof dir, "%s/big", root);
  tiny_options(&o, dir);
  o.batch_sizes = (st_int_list){2, {8, 1024}};
  st_error err = {0};
  rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EARG && !strcmp(err.msg, "sweep: --batch-sizes: 1024 is "
                                          "larger than the 512 training "
                                          "samples"),
        "a batch size past the data refused first: rc %d '%s'", rc, err.msg);
  char *none = slurp(dir, "sweep.csv");
  CHECK(!none, "no trial ran before the refusal");
  free(none);

  /* Errors: with micro-batches of 8, batch sizes 12 and 20 do not split,
   * so their trials fail at once, in whichever order the threads get
   * there; the error must be batch 12's, the first in (batch, trial)
   * order. The trial of batch 8 was handed out before them, so it was
   * running and finishes, and sweep.csv records it. */
  st_config cm = c;
  cm.execution.micro_batch = 8;
  snprintf(dir, sizeof dir, "%s/fail", root);
  tiny_options(&o, dir);
  o.jobs = 3;
  o.trials = 1;
  o.batch_sizes = (st_int_list){3, {8, 12, 20}};
  rc = st_sweep_run(&o, &cm, &err);
  CHECK(rc == ST_ECONFIG && strstr(err.msg, "sweep: batch 12, trial 0:") &&
            strstr(err.msg, "does not divide train.batch = 12"),
        "first error in order wins: rc %d '%s'", rc, err.msg);
  char *rows = slurp(dir, "sweep.csv");
  CHECK(rows && strstr(rows, "\n8,0,") && count_lines(rows) == 2,
        "the running batch-8 trial is recorded, nothing else:\n%s",
        rows ? rows : "(missing)");
  free(rows);

  /* The order is (batch, trial), not time: batch 8's trial trains before
   * its sweep.csv write fails (a folder sits where the atomic write puts its
   * temp file), long after batch 12's trial failed at creation; the
   * error returned is still batch 8's. */
  snprintf(dir, sizeof dir, "%s/fail2", root);
  tiny_options(&o, dir);
  o.jobs = 2;
  o.trials = 1;
  o.batch_sizes = (st_int_list){2, {8, 12}};
  char tmp[ST_PATH_MAX + 64];
  snprintf(tmp, sizeof tmp, "%s/sweep.csv.tmp.%ld", dir, (long)getpid());
  CHECK(mkdir(dir, 0755) == 0 && mkdir(tmp, 0755) == 0, "mkdir %s", tmp);
  err.msg[0] = 0;
  rc = st_sweep_run(&o, &cm, &err);
  CHECK(rc == ST_EIO && strstr(err.msg, "sweep.csv"),
        "the earlier trial's later error wins: rc %d '%s'", rc, err.msg);
}

/* Weight streaming from a file store trains as sequential does, bit for
 * bit, so the sweep's files are the sequential sweep's (want) — with each
 * trial in a store of its own: given the config's store path, every trial
 * after the first went on from the one before's weights (batch 8's second
 * trial "reached" the target at its first step), and the next batch size
 * was refused as another run's store. That path is never touched, and no
 * trial's store is left in the sweep's directory. Two jobs: two stores at
 * once. */
static void test_file_store(const char *root, char *const want[4]) {
  st_config c;
  tiny_config(&c);
  snprintf(c.execution.mode, sizeof c.execution.mode, "weight_streaming");
  snprintf(c.execution.store, sizeof c.execution.store, "file");
  snprintf(c.execution.store_path, sizeof c.execution.store_path,
           "%s/user.store", root);
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/file-store", root);
  tiny_options(&o, dir);
  o.jobs = 2;
  if (run(&o, &c)) return;
  check_same_files(dir, want, "a file store's sweep");
  CHECK(access(c.execution.store_path, F_OK) != 0,
        "the config's store path %s was made", c.execution.store_path);
  char cmd[3 * ST_PATH_MAX];
  snprintf(cmd, sizeof cmd, "ls %s | grep -c store >/dev/null", dir);
  CHECK(system(cmd) != 0, "a trial's store left in %s", dir);
}

static void test_sweep(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char a[ST_PATH_MAX], b[ST_PATH_MAX];
  snprintf(a, sizeof a, "%s/a", root);
  snprintf(b, sizeof b, "%s/b", root);

  tiny_options(&o, a);
  if (run(&o, &c)) return;
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

  test_jobs(root, text);
  test_file_store(root, text);

  /* Determinism: a second sweep into another folder. */
  tiny_options(&o, b);
  if (run(&o, &c)) goto out;
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

  /* A sweep.csv cut inside its last row is refused, naming the line: a
   * cut that leaves six fields ("0.5312" read as "0.5") parsed, and its
   * trial counted as done with a metric never measured. Here only the
   * newline is cut, which the old reader took as whole. */
  char *whole = slurp(b, "sweep.csv");
  if (whole && strlen(whole) > 1) {
    whole[strlen(whole) - 1] = '\0';
    put(b, "sweep.csv", whole);
    st_error cut = {0};
    int rc_cut = st_sweep_run(&o, &c, &cut);
    CHECK(rc_cut == ST_EFORMAT && strstr(cut.msg, "sweep.csv:7: the last row "
                                                  "has no end of line"),
          "a row cut short refused: rc %d '%s'", rc_cut, cut.msg);
    put(b, "sweep.csv", text[0]);
  }
  free(whole);

  /* A trial that reached the target took a step at least: a row of 0
   * steps is refused, naming the line, before anything is written. Taken
   * as done, its log10(0) = -inf became steps.svg's lowest decade, and
   * the grid loop from (int)-inf wrote lines until memory ran out. A
   * folder where steps.csv's temp file goes stops the old code there
   * (ST_EIO) rather than in that loop. */
  char *zero = slurp(b, "sweep.csv");
  int zero_line = 0;
  for (char *row = zero ? strchr(zero, '\n') : NULL; row && !zero_line;
       row = strchr(row + 1, '\n')) {
    char *field = row + 1;
    for (int k = 0; k < 4 && field; k++)
      field = strchr(field, ',') ? strchr(field, ',') + 1 : NULL;
    if (!field || *field == ',') continue; /* not reached: no steps */
    char *end = strchr(field, ',');
    memmove(field + 1, end, strlen(end) + 1);
    field[0] = '0';
    zero_line = 1;
    for (char *c = zero; c <= row; c++) zero_line += *c == '\n';
  }
  CHECK(zero_line > 0, "sweep.csv has a trial that reached the target");
  if (zero_line) {
    put(b, "sweep.csv", zero);
    char stop[ST_PATH_MAX + 64];
    snprintf(stop, sizeof stop, "%s/steps.csv.tmp.%ld", b, (long)getpid());
    CHECK(mkdir(stop, 0755) == 0, "mkdir %s", stop);
    st_error bad = {0};
    char want[64];
    snprintf(want, sizeof want, "sweep.csv:%d: malformed row", zero_line);
    int rc_zero = st_sweep_run(&o, &c, &bad);
    CHECK(rc_zero == ST_EFORMAT && strstr(bad.msg, want),
          "a row of 0 steps: rc %d '%s' (want '%s')", rc_zero, bad.msg, want);
    rmdir(stop);
    put(b, "sweep.csv", text[0]);
  }
  free(zero);

  /* Rows written by another learning-rate range are refused. */
  o.lr_min = 1e-2;
  st_error err = {0};
  int rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EFORMAT && strstr(err.msg, "sweep.csv") &&
            strstr(err.msg, "lr"),
        "another lr range refused: rc %d '%s'", rc, err.msg);

  /* So are a changed target or config (DIR/sweep.key), naming the line. */
  tiny_options(&o, b);
  o.target.value = 0.8;
  rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EFORMAT && strstr(err.msg, "sweep.key:2") &&
            strstr(err.msg, "accuracy >= 0.9") &&
            strstr(err.msg, "accuracy >= 0.8"),
        "another target refused: '%s'", err.msg);
  tiny_options(&o, b);
  st_config other = c;
  other.model.hidden.v[0] = 17;
  rc = st_sweep_run(&o, &other, &err);
  CHECK(rc == ST_EFORMAT && strstr(err.msg, "hidden"),
        "another config refused: '%s'", err.msg);
  other = c;
  other.train.threads = 2; /* does not change results: accepted */
  CHECK(st_sweep_run(&o, &other, &err) == 0,
        "another train.threads accepted: '%s'", err.msg);
  other = c; /* what is logged and saved: accepted */
  other.metrics.log_every = 10;
  other.train.checkpoint_every = 3;
  other.train.keep_checkpoints = 1;
  CHECK(st_sweep_run(&o, &other, &err) == 0,
        "another metrics.log_every, train.checkpoint_every, "
        "train.keep_checkpoints accepted: '%s'",
        err.msg);
  other = c;
  other.train.steps = 100; /* every trial sets its own: accepted */
  other.train.batch = 7;
  other.optimizer.lr = 0.3f;
  CHECK(st_sweep_run(&o, &other, &err) == 0,
        "another train.steps, train.batch, optimizer.lr accepted: '%s'",
        err.msg);

  /* A noise run the config cannot make is refused before any trial. */
  char nd[ST_PATH_MAX + 16];
  snprintf(nd, sizeof nd, "%s/nonoise", root);
  tiny_options(&o, nd);
  o.noise_batch = 16;
  other = c;
  snprintf(other.execution.mode, sizeof other.execution.mode, "pipeline");
  other.execution.micro_batch = 4;
  rc = st_sweep_run(&o, &other, &err);
  char *rows = slurp(nd, "sweep.csv");
  CHECK(rc != 0 && strstr(err.msg, "--noise-batch 16") && !rows,
        "a pipeline's noise run refused before the trials: rc %d '%s'", rc,
        err.msg);
  free(rows);

  /* Bad options are refused before anything runs. */
  tiny_options(&o, b);
  o.batch_sizes = (st_int_list){2, {16, 8}};
  rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EARG && strstr(err.msg, "increase"),
        "decreasing batch sizes refused: '%s'", err.msg);
out:
  for (int i = 0; i < 4; i++) free(text[i]);
}

/* In a report.md table, the budget column of batch B's row. */
static long budget_column(const char *report, int batch) {
  char row[32];
  snprintf(row, sizeof row, "\n| %d |", batch);
  const char *p = report ? strstr(report, row) : NULL;
  const char *eol = p ? strchr(p + 1, '\n') : NULL;
  if (!eol) return -1;
  const char *bar = eol - 1; /* the closing '|' */
  while (bar > p && bar[-1] != '|') bar--;
  return strtol(bar, NULL, 10);
}

/* budget_epochs, eval_growth and noise_batch. */
static void test_budget_noise(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/noise", root);
  tiny_options(&o, dir);
  /* 512 training samples: half an epoch is 32, 16 and 8 steps. */
  o.budget_epochs = 0.5;
  o.eval_every = 2;
  o.eval_growth = 1.5; /* evaluations at 2, 4, 6, 9, 14, 21, 32 */
  o.noise_batch = 16;
  o.target.value = 0.8;
  char *progress = NULL;
  size_t plen = 0;
  o.progress = open_memstream(&progress, &plen);
  int rc = run(&o, &c);
  fclose(o.progress);
  if (rc) {
    free(progress);
    return;
  }
  char *report = slurp(dir, "report.md"), *steps = slurp(dir, "steps.csv"),
       *sweep = slurp(dir, "sweep.csv"), *noise = slurp(dir, "noise.csv");
  const int budget[3] = {32, 16, 8};
  for (int b = 0; b < 3; b++)
    CHECK(budget_column(report, o.batch_sizes.v[b]) == budget[b],
          "batch %d: budget %ld steps, want %d", o.batch_sizes.v[b],
          budget_column(report, o.batch_sizes.v[b]), budget[b]);
  /* Every trial stopped on the schedule, or at its batch's budget. */
  int on_grid = 1, reached = 0;
  for (const char *p = sweep ? strchr(sweep, '\n') : NULL; p && p[1];
       p = strchr(p + 1, '\n')) {
    int batch, k;
    double lr;
    long st = -1;
    if (sscanf(p + 1, "%d,%d,%lf,", &batch, &k, &lr) != 3) break;
    const char *f = p + 1;
    for (int comma = 0; comma < 4; comma++) f = strchr(f, ',') + 1;
    if (*f != ',') st = strtol(f, NULL, 10);
    if (st < 0) continue;
    reached++;
    int b = batch == 8 ? 0 : batch == 16 ? 1 : 2;
    on_grid &= st == 2 || st == 4 || st == 6 || st == 9 || st == 14 ||
               st == 21 || st == 32 || st == budget[b];
    on_grid &= st <= budget[b];
  }
  CHECK(reached > 0 && on_grid,
        "%d trials reached the target, all at scheduled steps:\n%s", reached,
        sweep ? sweep : "");
  /* Every trial that did not reach the target ran to its batch's budget. */
  int short_runs = 0;
  for (const char *p = progress; p && (p = strstr(p, "sweep: batch ")); p++) {
    int batch = atoi(p + 13);
    const char *eol = strchr(p, '\n'), *at = strstr(p, "not reached (");
    if (!at || (eol && at > eol)) continue;
    const char *step = strstr(at, "at step ");
    long got = step ? strtol(step + 8, NULL, 10) : -1;
    short_runs += got != (batch == 8 ? 32 : batch == 16 ? 16 : 8);
  }
  CHECK(short_runs == 0,
        "every trial not reaching the target ran to its budget:\n%s", progress);

  /* The noise run: batch 16's best trial, as steps.csv names it. */
  long s16 = -1, trial16 = -1;
  const char *row = steps ? strstr(steps, "\n16,") : NULL;
  if (row && sscanf(row + 4, "%ld,%ld,", &s16, &trial16) != 2) s16 = -1;
  CHECK(s16 > 0 && noise && report && strstr(report, "B_simple") &&
            strstr(report, "at the target") &&
            strstr(report, "norms on the first half of the batch and on the "
                           "whole batch"),
        "batch 16 reached the target (step %ld) and noise.csv and the report "
        "say B_simple",
        s16);
  if (s16 > 0 && noise) {
    st_config n = c;
    double lr, mom;
    st_sweep_point(&o, &c, (int)trial16, &lr, &mom);
    n.train.batch = 16;
    n.train.steps = 16; /* the budget: the schedule's length */
    n.optimizer.lr = (float)lr;
    if (mom >= 0) n.optimizer.momentum = (float)mom;
    n.metrics.noise_scale = 1;
    n.metrics.noise_ema = 0; /* each step's own estimates */
    st_trainer *t;
    st_error err = {0};
    if (st_config_validate(&n, &err) == 0 &&
        st_trainer_create(&t, &n, NULL, &err) == 0) {
      /* the windows: the last row's, since the schedule point before s16
       * (2, 4, 6, 9, 14), and the last 20% of the steps */
      long prev = 0;
      const long sched[] = {2, 4, 6, 9, 14, 21, 32};
      for (int k = 0; k < 7 && sched[k] < s16; k++) prev = sched[k];
      double row_tr = 0, row_g2 = 0, end_tr = 0, end_g2 = 0, loss;
      double early_tr = 0, early_g2 = 0, mid_tr = 0, mid_g2 = 0;
      for (long k = 1; k <= s16; k++) {
        st_trainer_step(t, &loss, &err);
        double g2, tr;
        st_noise_scale_value(st_trainer_noise(t), &g2, &tr);
        if (k > prev) row_tr += tr, row_g2 += g2;
        /* report.md's windows: the first 10% of the steps (at least the
         * first), 40% to 60%, the last 20% */
        if (10 * k <= s16 || k == 1) early_tr += tr, early_g2 += g2;
        if (5 * k > 2 * s16 && 5 * k <= 3 * s16) mid_tr += tr, mid_g2 += g2;
        if (5 * k > 4 * s16) end_tr += tr, end_g2 += g2;
      }
      st_trainer_destroy(t);
      double want = row_tr / row_g2, at_end = end_tr / end_g2;
      char last[96];
      snprintf(last, sizeof last, "\n%ld,%ld,%.9g,", s16, s16 * 16, want);
      CHECK(strstr(noise, last) != NULL && isfinite(want),
            "noise.csv ends with step %ld, B_simple %.9g over steps %ld.."
            "%ld as a trainer gives it:\n%s",
            s16, want, prev + 1, s16, noise);
      const double windows[3] = {early_g2 > 0 ? early_tr / early_g2 : NAN,
                                 mid_g2 > 0 ? mid_tr / mid_g2 : NAN,
                                 end_g2 > 0 ? at_end : NAN};
      /* the windows' |G|^2 sums and whether they hold a step (40-60%
       * holds none only in a run of one step) */
      const double g2s[3] = {early_g2, mid_g2, end_g2};
      const int empty[3] = {0, s16 < 2, 0};
      const char *const where[3] = {"the first 10%% of the steps", "40-60%%",
                                    "the last 20%%"};
      for (int w = 0; w < 3; w++) {
        char said[96], fmt[64];
        double b = windows[w];
        if (isfinite(b) && b > 0) {
          snprintf(fmt, sizeof fmt, "**%%.0f** over %s", where[w]);
          snprintf(said, sizeof said, fmt, b);
        } else { /* estimates <= 0, or a ratio <= 0, give no figure */
          snprintf(fmt, sizeof fmt, "no estimate (%%s) over %s", where[w]);
          snprintf(said, sizeof said, fmt,
                   empty[w]      ? "too few steps"
                   : g2s[w] <= 0 ? "a |G|^2 estimate <= 0"
                                 : "a ratio <= 0");
        }
        CHECK(report && strstr(report, said), "report says %s (%ld steps)",
              said, s16);
      }
    } else {
      CHECK(0, "noise trainer: %s", err.msg);
    }
  }
  CHECK(report && strstr(report, "## Critical batch size"),
        "report has the critical-batch section");

  /* Refused: a noise batch outside the list, an odd one, negative epochs. */
  st_error err = {0};
  tiny_options(&o, dir);
  o.noise_batch = 12;
  rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EARG && strstr(err.msg, "noise batch 12"),
        "noise batch outside the list refused: '%s'", err.msg);
  o.batch_sizes = (st_int_list){2, {7, 8}};
  o.noise_batch = 7;
  rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EARG && strstr(err.msg, "even"),
        "odd noise batch refused: '%s'", err.msg);
  tiny_options(&o, dir);
  o.budget_epochs = -1;
  rc = st_sweep_run(&o, &c, &err);
  CHECK(rc == ST_EARG && strstr(err.msg, "epochs"),
        "negative epochs refused: '%s'", err.msg);
  free(progress);
  free(report);
  free(steps);
  free(sweep);
  free(noise);
}

/* A target the metric equals exactly is met: accuracy >= target, loss <=
 * target. The value is what an independent trainer with trial 0's config
 * at batch 8 gives at step 5, the sweep's first evaluation, so that trial
 * must stop there (steps.csv "8,5,0,"); a strict comparison would pass
 * step 5 by. */
static void test_target_equal(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  tiny_options(&o, "unused");
  double lr, mom, loss, test_loss = NAN, acc = NAN;
  st_sweep_point(&o, &c, 0, &lr, &mom);
  st_config n = c;
  n.train.batch = 8;
  n.train.steps = o.budget_steps; /* the trial's schedule length */
  n.optimizer.lr = (float)lr;
  if (mom >= 0) n.optimizer.momentum = (float)mom;
  st_trainer *t;
  st_error err = {0};
  int rc = st_config_validate(&n, &err);
  if (!rc) rc = st_trainer_create(&t, &n, NULL, &err);
  if (rc) {
    CHECK(0, "trainer for the target: %s", err.msg);
    return;
  }
  for (int k = 1; k <= o.eval_every && !rc; k++)
    rc = st_trainer_step(t, &loss, &err);
  if (!rc) rc = st_trainer_evaluate(t, &test_loss, &acc, &err);
  st_trainer_destroy(t);
  CHECK(rc == 0 && acc > 0 && test_loss > 0, "step 5: accuracy %g, loss %g: %s",
        acc, test_loss, err.msg);
  if (rc || !(acc > 0) || !(test_loss > 0)) return;

  const st_sweep_target targets[2] = {{ST_TARGET_ACCURACY, acc},
                                      {ST_TARGET_LOSS, test_loss}};
  for (int i = 0; i < 2; i++) {
    char dir[ST_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/equal%d", root, i);
    tiny_options(&o, dir);
    o.batch_sizes = (st_int_list){1, {8}};
    o.trials = 1;
    o.target = targets[i];
    if (run(&o, &c)) continue;
    char *steps = slurp(dir, "steps.csv");
    CHECK(steps && strstr(steps, "\n8,5,0,"),
          "target %s = %.9g, the metric at step 5: reached at step 5:\n%s",
          i ? "loss" : "accuracy", targets[i].value, steps ? steps : "");
    free(steps);
  }
}

/* budget_epochs not a whole number of steps: 0.3 epochs of the 512
 * training samples is 153.6 samples, 19.2, 9.6 and 4.8 steps of batch 8,
 * 16 and 32, rounded up to 20, 10 and 5 (a trial may see a little more
 * than E epochs, never less). A loss target no trial reaches makes every
 * trial run to its budget. */
static void test_budget_rounding(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/rounding", root);
  tiny_options(&o, dir);
  o.trials = 1;
  o.budget_epochs = 0.3;
  o.target = (st_sweep_target){ST_TARGET_LOSS, 1e-30};
  char *progress = NULL;
  size_t plen = 0;
  o.progress = open_memstream(&progress, &plen);
  int rc = run(&o, &c);
  fclose(o.progress);
  char *report = rc ? NULL : slurp(dir, "report.md");
  const int budget[3] = {20, 10, 5};
  for (int b = 0; !rc && b < 3; b++) {
    int batch = o.batch_sizes.v[b];
    CHECK(budget_column(report, batch) == budget[b],
          "batch %d: budget %ld steps, want %d", batch,
          budget_column(report, batch), budget[b]);
    char line[64];
    snprintf(line, sizeof line, "sweep: batch %d trial 1/1 ", batch);
    const char *p = progress ? strstr(progress, line) : NULL;
    const char *at = p ? strstr(p, " at step ") : NULL;
    CHECK(at && strtol(at + 9, NULL, 10) == budget[b],
          "batch %d: not reached at step %d:\n%s", batch, budget[b],
          progress ? progress : "");
  }
  free(report);
  free(progress);
}

/* optimizer.reference_batch in the config: each trial's point is the
 * recipe at its own batch (the sweep searches lr and momentum per batch
 * size), so in a sequential run no rescaling applies and the trials are
 * those of a config without the key: the same sweep.csv byte for byte,
 * whose lr and momentum columns are then what the trials ran. */
static void test_reference_batch(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char plain[ST_PATH_MAX], ref[ST_PATH_MAX];
  snprintf(plain, sizeof plain, "%s/ref0", root);
  snprintf(ref, sizeof ref, "%s/ref8", root);
  tiny_options(&o, plain);
  o.batch_sizes = (st_int_list){1, {16}};
  if (run(&o, &c)) return;
  st_config r = c;
  r.optimizer.reference_batch = 8; /* the recipe "tuned at batch 8" */
  tiny_options(&o, ref);
  o.batch_sizes = (st_int_list){1, {16}};
  if (run(&o, &r)) return;
  char *a = slurp(plain, "sweep.csv"), *b = slurp(ref, "sweep.csv");
  CHECK(a && b && !strcmp(a, b),
        "reference_batch 8: batch 16's trials run the searched lr and "
        "momentum:\n%s\nwant\n%s",
        b ? b : "", a ? a : "");
  free(a);
  free(b);
}

/* A window whose |G|^2 estimates sum to <= 0 (each step's is unbiased, so
 * it can be) has no B_simple, and report.md says so: not "too few
 * steps". Batch 2 measured on its first sample and on both: the step's
 * |G|^2 estimate 2 |G_2|^2 - |G_1|^2 is negative for some seeds; a loss
 * target every trial meets at its first evaluation (step 1) makes the
 * noise run that one step, every window but 40-60% (no step) step 1. */
static void test_noise_negative(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/negative", root);
  tiny_options(&o, dir);
  o.batch_sizes = (st_int_list){1, {2}};
  o.trials = 1;
  o.budget_steps = 1;
  o.eval_every = 1;
  o.noise_batch = 2;
  o.target = (st_sweep_target){ST_TARGET_LOSS, 100};
  /* a seed whose first step's |G|^2 estimate is <= 0, as an independent
   * trainer measures it */
  int found = 0;
  for (uint64_t seed = 1; seed <= 40 && !found; seed++) {
    st_config n = c;
    double lr, mom, loss, g2 = NAN, tr;
    st_sweep_point(&o, &c, 0, &lr, &mom);
    n.train.seed = seed;
    n.train.batch = 2;
    n.train.steps = 1;
    n.optimizer.lr = (float)lr;
    if (mom >= 0) n.optimizer.momentum = (float)mom;
    n.metrics.noise_scale = 1;
    n.metrics.noise_ema = 0;
    st_trainer *t;
    st_error err = {0};
    int rc = st_config_validate(&n, &err);
    if (!rc) rc = st_trainer_create(&t, &n, NULL, &err);
    if (rc) {
      CHECK(0, "noise trainer: %s", err.msg);
      return;
    }
    if (!st_trainer_step(t, &loss, &err))
      st_noise_scale_value(st_trainer_noise(t), &g2, &tr);
    st_trainer_destroy(t);
    if (g2 <= 0) c.train.seed = seed, found = 1;
  }
  CHECK(found, "a seed whose first |G|^2 estimate is <= 0");
  if (!found || run(&o, &c)) return;
  char *report = slurp(dir, "report.md");
  CHECK(report &&
            strstr(report, "no estimate (a |G|^2 estimate <= 0) over the "
                           "first 10% of the steps") &&
            strstr(report, "no estimate (too few steps) over 40-60%") &&
            strstr(report, "no estimate (a |G|^2 estimate <= 0) over the "
                           "last 20%"),
        "seed %llu: the windows of step 1 have no estimate, its |G|^2 "
        "being <= 0:\n%s",
        (unsigned long long)c.train.seed, report ? report : "");
  free(report);
}

/* Trials run at once pin nothing: execution.pin (on by default) pins a
 * pipeline's stage threads to the first train.threads cpus of the
 * process, the same ones in every trial, so trials run side by side would
 * share those cpus and leave the others idle. A lone pipeline trainer of the
 * config pins (on a machine with the cpus for its stages), the sweep's trials
 * with jobs = 2 do not. */
static void test_pinned(const char *root) {
  st_config c;
  tiny_config(&c);
  snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
  c.execution.stages = 2;
  c.train.threads = 2; /* kept by the trials: a core a stage */
  c.train.batch = 8;
  st_trainer *t;
  st_error err = {0};
  atomic_store(&pins, 0);
  int rc = st_config_validate(&c, &err);
  if (!rc) rc = st_trainer_create(&t, &c, NULL, &err);
  if (rc) {
    CHECK(0, "pipeline trainer: %s", err.msg);
    return;
  }
  st_trainer_destroy(t);
  if (atomic_load(&pins) == 0) return; /* too few cpus to pin: no case */
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/pinned", root);
  tiny_options(&o, dir);
  o.batch_sizes = (st_int_list){2, {8, 16}};
  o.budget_steps = 5;
  o.jobs = 2;
  atomic_store(&pins, 0);
  if (run(&o, &c)) return;
  CHECK(atomic_load(&pins) == 0,
        "jobs = 2: the trials' pipelines pinned %d threads to the same cpus",
        atomic_load(&pins));
}

/* budget_epochs whose product with the training samples is whole in
 * decimal but not in binary: 0.56 epochs of 400 samples are 224 samples,
 * 28, 14 and 7 steps of batch 8, 16 and 32, where 0.56 x 400 in doubles
 * is 224.00000000000003 and its ceiling a step more. */
static void test_budget_decimal(const char *root) {
  st_config c;
  tiny_config(&c);
  c.data.train_limit = 400;
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/decimal", root);
  tiny_options(&o, dir);
  o.trials = 1;
  o.budget_epochs = 0.56;
  o.target = (st_sweep_target){ST_TARGET_LOSS, 1e-30};
  if (run(&o, &c)) return;
  char *report = slurp(dir, "report.md");
  const int budget[3] = {28, 14, 7};
  for (int b = 0; b < 3; b++)
    CHECK(budget_column(report, o.batch_sizes.v[b]) == budget[b],
          "0.56 epochs of 400 samples at batch %d: budget %ld steps, want %d",
          o.batch_sizes.v[b], budget_column(report, o.batch_sizes.v[b]),
          budget[b]);
  free(report);
}

/* eval_growth as decimal text: with eval_every 2 and growth 2.2 the
 * schedule is 2, 5, 11, 25, then ceil(2.2 x 25) = 55, which in doubles is
 * 55.000000000000007, whose ceiling is 56. A loss target that trial 0 at
 * batch 8 first meets at step 55 of those (its test loss there, as an
 * independent trainer gives it) must be met at step 55. */
static void test_growth_decimal(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/growth", root);
  tiny_options(&o, dir);
  o.batch_sizes = (st_int_list){1, {8}};
  o.trials = 1;
  o.eval_every = 2;
  o.eval_growth = 2.2;
  const int at[5] = {2, 5, 11, 25, 55};
  double lr, mom, loss, test_loss[5], acc;
  st_sweep_point(&o, &c, 0, &lr, &mom);
  st_config n = c;
  n.train.batch = 8;
  n.train.steps = o.budget_steps;
  n.optimizer.lr = (float)lr;
  if (mom >= 0) n.optimizer.momentum = (float)mom;
  st_trainer *t;
  st_error err = {0};
  int rc = st_config_validate(&n, &err);
  if (!rc) rc = st_trainer_create(&t, &n, NULL, &err);
  if (rc) {
    CHECK(0, "trainer: %s", err.msg);
    return;
  }
  for (int k = 1, e = 0; k <= 55 && !rc; k++)
    if (!(rc = st_trainer_step(t, &loss, &err)) && k == at[e])
      rc = st_trainer_evaluate(t, &test_loss[e++], &acc, &err);
  st_trainer_destroy(t);
  CHECK(rc == 0, "trainer: %s", err.msg);
  int first = 1; /* the target first met at step 55 */
  for (int e = 0; e < 4; e++) first &= test_loss[e] > test_loss[4];
  CHECK(first, "trial 0's test loss at 2, 5, 11, 25 above step 55's (%.6g)",
        test_loss[4]);
  if (rc || !first) return;
  o.target = (st_sweep_target){ST_TARGET_LOSS, test_loss[4]};
  if (run(&o, &c)) return;
  char *steps = slurp(dir, "steps.csv");
  CHECK(steps && strstr(steps, "\n8,55,0,"),
        "eval growth 2.2: evaluated at step 55, where the target is met:\n%s",
        steps ? steps : "");
  free(steps);
}

/* An update that leaves the weights non-finite after a finite training
 * loss (here the first step's, at lr 1e20) is a divergence, as in strata
 * train and strata experiment: the evaluation right after it scores NaN
 * logits as class 0 everywhere, an accuracy of the test set's share of
 * class 0, which met a target below it. The trial must not reach the
 * target, and sweep.csv's final metric is nan. An independent trainer
 * shows the premise: finite loss at step 1, non-finite test loss, an
 * accuracy above the target. */
static void test_nonfinite_weights(const char *root) {
  st_config c;
  tiny_config(&c);
  st_sweep_options o;
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s/nonfinite", root);
  tiny_options(&o, dir);
  o.batch_sizes = (st_int_list){1, {8}};
  o.trials = 1;
  o.budget_steps = 1;
  o.eval_every = 1;
  o.lr_min = o.lr_max = 1e20;
  o.target = (st_sweep_target){ST_TARGET_ACCURACY, 0.01};
  double lr, mom, loss = NAN, test_loss = 0, acc = NAN;
  st_sweep_point(&o, &c, 0, &lr, &mom);
  st_config n = c;
  n.train.batch = 8;
  n.train.steps = 1;
  n.optimizer.lr = (float)lr;
  if (mom >= 0) n.optimizer.momentum = (float)mom;
  st_trainer *t;
  st_error err = {0};
  int rc = st_config_validate(&n, &err);
  if (!rc) rc = st_trainer_create(&t, &n, NULL, &err);
  if (rc) {
    CHECK(0, "trainer at lr 1e20: %s", err.msg);
    return;
  }
  rc = st_trainer_step(t, &loss, &err);
  if (!rc) rc = st_trainer_evaluate(t, &test_loss, &acc, &err);
  st_trainer_destroy(t);
  CHECK(rc == 0 && isfinite(loss) && !isfinite(test_loss) && acc >= 0.01,
        "lr 1e20, step 1: loss %g, test loss %g, accuracy %g: %s", loss,
        test_loss, acc, err.msg);
  if (run(&o, &c)) return;
  char *steps = slurp(dir, "steps.csv"), *sweep = slurp(dir, "sweep.csv");
  CHECK(steps && strstr(steps, "\n8,,,,\n"),
        "non-finite weights do not reach the target:\n%s", steps ? steps : "");
  CHECK(sweep && strstr(sweep, ",nan\n"),
        "non-finite weights: final accuracy nan:\n%s", sweep ? sweep : "");
  free(steps);
  free(sweep);
}

int main(void) {
  test_halton();
  test_fit();
  test_regimes();
  test_target_parse();
  char root[] = "/tmp/strata-test-sweep-XXXXXX";
  if (!mkdtemp(root)) {
    CHECK(0, "mkdtemp");
    TH_DONE();
  }
  snprintf(data_dir, sizeof data_dir, "%s", root);
  if (write_data() == 0) {
    test_sweep(root);
    test_budget_noise(root);
    test_target_equal(root);
    test_budget_rounding(root);
    test_reference_batch(root);
    test_noise_negative(root);
    test_pinned(root);
    test_budget_decimal(root);
    test_growth_decimal(root);
    test_nonfinite_weights(root);
  }
  char cmd[sizeof root + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  TH_DONE();
}
