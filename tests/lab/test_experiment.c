/*
 * test_experiment.c — `strata experiment pb` (src/lab/experiment.c) on a
 * tiny problem: a 4-block MLP (hidden [8, 8, 8]) on 64 synthetic samples,
 * batch 4, 6 steps, so the 7 variants x 2 seeds take well under a second.
 *  - the variants' configs: the baseline is sequential with the recipe as
 *    given, the others pipelined_backprop with heavy-ball momentum,
 *    reference_batch = train.batch, per_block stages emulated, the seed
 *    offset, one thread and no pinning when runs share the machine;
 *  - jobs = 1 (all cores per run) and jobs = 2 (one each) write the same
 *    results.csv apart from the measured speeds, one row per run in
 *    (variant, seed) order;
 *  - results.md has one table row per variant, its accuracy results.csv's
 *    mean ± sample standard deviation (n - 1), curves.svg is an SVG with a
 *    line per variant;
 *  - results.md's samples/s is the mean of results.csv's over the seeds,
 *    diverged runs included;
 *  - results.csv's accuracy and final train loss are those of the same
 *    config trained by a trainer of its own (plain steps, no evaluation
 *    between, the mean loss of the last 10% of steps);
 *  - a config's optimizer.reference_batch other than train.batch (a recipe
 *    tuned at another batch) is the batch every variant moves the recipe
 *    from, the baseline included, and results.md says so;
 *  - a run whose loss turns non-finite is recorded as diverged;
 *  - errors: a config the variants refuse (adamw) fails before any run or
 *    file, naming the variant and seed; a failure at run time reports the
 *    first failed run in (variant, seed) order whatever jobs is; bad
 *    options are refused.
 */
#include "harness.h"
#include "../exec/models.h"
#include "strata.h"

#include <string.h>
#include <sys/stat.h>

/* The field after the n-th comma of a CSV row, or NULL if the row has
 * fewer (a short row fails a check, not the test). */
static const char *csv_field(const char *row, int n) {
  for (int c = 0; c < n && row; c++) {
    row = strchr(row, ',');
    if (row) row++;
  }
  return row;
}

/* The tiny problem; Nesterov, so the baseline differs from PB's rule. */
static void tiny_config(st_config *c) {
  mlp_config(c);
  set_all(c,
          (const char *[]){"model.hidden=[8,8,8]", "optimizer.nesterov=true",
                           "train.steps=6", "train.batch=4",
                           "data.train_limit=64"},
          5);
}

static st_experiment_options options(const char *dir, int seeds, int jobs) {
  st_experiment_options o = {.seeds = seeds, .points = 3, .jobs = jobs};
  snprintf(o.out_dir, sizeof o.out_dir, "%s", dir);
  return o;
}

/* A whole file (malloc'd, NUL-terminated), or NULL. */
static char *slurp(const char *dir, const char *name) {
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n + 1);
  if (text && fread(text, 1, (size_t)n, f) != (size_t)n)
    free(text), text = NULL;
  if (text) text[n] = 0;
  fclose(f);
  return text;
}

/* results.csv with the last two fields (samples_per_s, seconds) of every
 * line cut off, in place. */
static void drop_speeds(char *csv) {
  char *out = csv;
  for (char *line = csv; *line;) {
    char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    size_t keep = len;
    for (int cut = 0; cut < 2 && keep > 0; cut++)
      while (keep > 0 && line[--keep] != ',') {
      }
    memmove(out, line, keep);
    out += keep;
    *out++ = '\n';
    line += len + (end != NULL);
  }
  *out = 0;
}

static int count_lines_starting(const char *text, const char *prefix) {
  int n = 0;
  for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    n += strncmp(p, prefix, strlen(prefix)) == 0;
  return n;
}

static void test_variant_configs(const st_config *base) {
  CHECK(!strcmp(st_experiment_pb_variant(0), "baseline") &&
            !strcmp(st_experiment_pb_variant(5), "sc+lwp") &&
            !strcmp(st_experiment_pb_variant(6), "pipemare") &&
            !st_experiment_pb_variant(7) && !st_experiment_pb_variant(-1),
        "variant names");
  st_experiment_options o = options("unused", 2, 2);
  st_config c;
  st_error err = {0};
  CHECK(st_experiment_pb_config(&c, base, &o, 0, 1, &err) == 0, "%s", err.msg);
  CHECK(!strcmp(c.execution.mode, "sequential") && c.optimizer.nesterov &&
            c.optimizer.reference_batch == 0 && c.execution.micro_batch == 0 &&
            !c.execution.emulate && c.train.seed == base->train.seed + 1 &&
            c.train.batch == 4,
        "baseline: mode %s nesterov %d reference %d seed %llu",
        c.execution.mode, c.optimizer.nesterov, c.optimizer.reference_batch,
        (unsigned long long)c.train.seed);
  /* train.threads = 2 is the config's own: kept; pinning is off */
  CHECK(st_experiment_pb_config(&c, base, &o, 3, 0, &err) == 0, "%s", err.msg);
  CHECK(!strcmp(c.execution.mode, "pipelined_backprop") &&
            !strcmp(c.execution.mitigation, "sc") && !c.optimizer.nesterov &&
            c.optimizer.reference_batch == 4 && c.train.batch == 4 &&
            c.execution.stages == ST_STAGES_PER_BLOCK && c.execution.emulate &&
            c.train.threads == 2 && !c.execution.pin &&
            c.train.seed == base->train.seed,
        "sc: mode %s mitigation %s stages %d emulate %d threads %d pin %d",
        c.execution.mode, c.execution.mitigation, c.execution.stages,
        c.execution.emulate, c.train.threads, c.execution.pin);
  /* two stages fit two threads: threaded as configured; three do not */
  st_config two = *base;
  two.execution.stages = 2;
  CHECK(st_experiment_pb_config(&c, &two, &o, 1, 0, &err) == 0 &&
            c.execution.stages == 2 && !c.execution.emulate,
        "2 stages on 2 threads: emulate %d (%s)", c.execution.emulate, err.msg);
  two.execution.stages = 3;
  CHECK(st_experiment_pb_config(&c, &two, &o, 1, 0, &err) == 0 &&
            c.execution.emulate,
        "3 stages on 2 threads: emulate %d (%s)", c.execution.emulate, err.msg);
  /* a pinned cut: the baseline drops it (sequential has no stages), the
   * variants keep it, per_block is not forced beside it, and its count
   * decides emulation (three pinned stages on two threads) */
  st_config pin = *base;
  pin.execution.stages = 0;
  pin.execution.stage_blocks.n = 3;
  pin.execution.stage_blocks.v[0] = pin.execution.stage_blocks.v[1] = 1;
  pin.execution.stage_blocks.v[2] = 2;
  CHECK(st_experiment_pb_config(&c, &pin, &o, 0, 0, &err) == 0 &&
            c.execution.stage_blocks.n == 0,
        "pinned baseline: %s", err.msg);
  CHECK(st_experiment_pb_config(&c, &pin, &o, 1, 0, &err) == 0 &&
            c.execution.stage_blocks.n == 3 && c.execution.stages == 0 &&
            c.execution.emulate,
        "pinned variant: stages %d, pin %d, emulate %d (%s)",
        c.execution.stages, c.execution.stage_blocks.n, c.execution.emulate,
        err.msg);
  /* one job on a config without train.threads keeps all cores and pins */
  st_config all = *base;
  all.train.threads = 0;
  o.jobs = 1;
  CHECK(st_experiment_pb_config(&c, &all, &o, 2, 0, &err) == 0 &&
            c.train.threads == 0 && c.execution.pin == base->execution.pin,
        "jobs 1: threads %d pin %d", c.train.threads, c.execution.pin);
  o.jobs = 4;
  CHECK(st_experiment_pb_config(&c, &all, &o, 2, 0, &err) == 0 &&
            c.train.threads == 1,
        "jobs 4: threads %d", c.train.threads);
  CHECK(st_experiment_pb_config(&c, base, &o, 7, 0, &err) == ST_EARG,
        "variant 7 accepted");
}

/* results.md's "beyond the spread" column against results.csv's
 * accuracies: "yes" exactly when |mean - baseline mean| is larger than both
 * sample standard deviations (2 seeds a variant). */
static void check_spread_column(const char *dir) {
  char *csv = slurp(dir, "results.csv"), *md = slurp(dir, "results.md");
  CHECK(csv && md, "results.csv or results.md missing");
  double mean[ST_EXPERIMENT_PB_VARIANTS], sd[ST_EXPERIMENT_PB_VARIANTS];
  const char *p = csv ? strchr(csv, '\n') : NULL;
  for (int v = 0; p && v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    double a[2];
    for (int k = 0; k < 2 && p; k++) {
      const char *f = csv_field(p + 1, 2); /* variant,seed,accuracy,... */
      a[k] = f ? atof(f) : NAN;
      p = strchr(p + 1, '\n');
    }
    mean[v] = (a[0] + a[1]) / 2;
    sd[v] = fabs(a[0] - a[1]) / sqrt(2.0);
  }
  /* the accuracy column: the mean and the sample standard deviation (n -
   * 1: two seeds give |a0 - a1| / sqrt 2), in percent to 2 decimals */
  for (int v = 0; p && md && v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    char row[32];
    snprintf(row, sizeof row, "\n| %s | ", st_experiment_pb_variant(v));
    const char *r = strstr(md, row);
    double m = -1, sd_shown = -1;
    int got = r ? sscanf(r + strlen(row), "%lf ± %lf", &m, &sd_shown) : 0;
    const char *eol = r ? strchr(r + 1, '\n') : NULL;
    const char *div = r ? strstr(r + 1, "diverged") : NULL;
    if (div && (!eol || div < eol))
      continue; /* a diverged seed: no two-seed spread to check */
    CHECK(got == 2 && fabs(m - 100 * mean[v]) <= 0.005 + 1e-9 &&
              fabs(sd_shown - 100 * sd[v]) <= 0.005 + 1e-9,
          "results.md: %s's accuracy %g ± %g, results.csv's %.4f ± %.4f",
          st_experiment_pb_variant(v), m, sd_shown, 100 * mean[v], 100 * sd[v]);
  }
  for (int v = 1; p && md && v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    char row[32];
    snprintf(row, sizeof row, "\n| %s | ", st_experiment_pb_variant(v));
    const char *r = strstr(md, row);
    for (int c = 0; c < 3 && r; c++) r = strstr(r + 1, " | ");
    double spread = sd[v] > sd[0] ? sd[v] : sd[0];
    const char *want = fabs(mean[v] - mean[0]) > spread ? "yes" : "no";
    CHECK(r && !strncmp(r + 3, want, strlen(want)) &&
              r[3 + strlen(want)] == ' ',
          "results.md: %s's beyond-the-spread column is not %s (difference "
          "%g, spread %g)",
          st_experiment_pb_variant(v), want, mean[v] - mean[0], spread);
  }
  free(csv);
  free(md);
}

/* results.md's samples/s column against results.csv: each variant's mean
 * of its seeds' samples_per_s, diverged runs included (they trained, and
 * were timed, up to the step that diverged). The CSV rounds each to 0.1
 * and the column the mean to 1: they agree within 0.05 + 0.5. */
static void check_speed_column(const char *dir, int seeds) {
  char *csv = slurp(dir, "results.csv"), *md = slurp(dir, "results.md");
  CHECK(csv && md, "%s: results.csv or results.md missing", dir);
  const char *p = csv ? strchr(csv, '\n') : NULL;
  int timed = 0; /* variants whose runs trained at least a step */
  for (int v = 0; p && md && v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    double sum = 0;
    for (int k = 0; k < seeds && p; k++) {
      /* variant,seed,accuracy,loss,samples_per_s */
      const char *f = csv_field(p + 1, 4);
      sum += f ? atof(f) : NAN;
      p = strchr(p + 1, '\n');
    }
    double mean = sum / seeds;
    char row[32];
    snprintf(row, sizeof row, "\n| %s | ", st_experiment_pb_variant(v));
    const char *r = strstr(md, row), *eol = r ? strchr(r + 1, '\n') : NULL;
    const char *bar = eol ? eol - 2 : NULL; /* before the closing " |" */
    while (bar && bar > r && bar[-1] != '|') bar--;
    double shown = bar ? atof(bar) : -1;
    timed += mean > 0;
    CHECK(fabs(shown - mean) <= 0.55,
          "%s: %s's samples/s %g, the mean of its %d runs' %.2f", dir,
          st_experiment_pb_variant(v), shown, seeds, mean);
  }
  /* a run that diverged at its first step trained no sample and reads 0
   * samples/s, as a mean over no finished run would: some must have */
  CHECK(timed > 0, "%s: no variant's runs trained a sample", dir);
  free(csv);
  free(md);
}

/* results.csv's accuracy and final train loss of each variant's first seed
 * against the same config trained independently: a trainer of
 * st_experiment_pb_config's config, plain st_trainer_step for its steps
 * (no evaluation between), evaluated once at the end, and the mean of its
 * losses over the last 10% of steps (at least one). The accuracy is a
 * count over the test set, printed with 9 digits: equal to 1e-9; the loss
 * is printed with 9 significant digits: equal to 1e-8 relative. */
static void check_against_trainer(const st_config *base, const char *dir,
                                  const st_experiment_options *o) {
  char *csv = slurp(dir, "results.csv");
  CHECK(csv != NULL, "%s: results.csv missing", dir);
  for (int v = 0; csv && v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    st_config c;
    st_error err = {0};
    st_trainer *t = NULL;
    if (st_experiment_pb_config(&c, base, o, v, 0, &err) ||
        st_trainer_create(&t, &c, NULL, &err)) {
      CHECK(0, "%s: %s", st_experiment_pb_variant(v), err.msg);
      continue;
    }
    int64_t n = st_trainer_total_steps(t), tail = (n + 9) / 10;
    double loss, sum = 0, test_loss, acc = -1;
    int rc = 0;
    for (int64_t s = 1; !rc && s <= n; s++) {
      rc = st_trainer_step(t, &loss, &err);
      if (s > n - tail) sum += loss;
    }
    if (!rc) rc = st_trainer_evaluate(t, &test_loss, &acc, &err);
    st_trainer_destroy(t);
    CHECK(rc == 0, "%s: %s", st_experiment_pb_variant(v), err.msg);
    char key[64];
    snprintf(key, sizeof key, "\n%s,%llu,", st_experiment_pb_variant(v),
             (unsigned long long)base->train.seed);
    const char *row = strstr(csv, key);
    const char *f = row ? csv_field(row + 1, 3) : NULL;
    double got_acc = row ? atof(row + strlen(key)) : -1;
    double got_loss = f ? atof(f) : NAN, want_loss = sum / (double)tail;
    CHECK(fabs(got_acc - acc) <= 1e-9 &&
              fabs(got_loss - want_loss) <= 1e-8 * fabs(want_loss),
          "%s: results.csv's accuracy %.9g and final loss %.9g, an "
          "independent trainer's %.9g and %.9g",
          st_experiment_pb_variant(v), got_acc, got_loss, acc, want_loss);
  }
  free(csv);
}

static void test_runs(const st_config *base, const char *root) {
  char one[256], two[256];
  snprintf(one, sizeof one, "%s/jobs1", root);
  snprintf(two, sizeof two, "%s/jobs2", root);
  st_experiment_options o1 = options(one, 2, 1), o2 = options(two, 2, 2);
  st_error err = {0};
  int rc = st_experiment_pb(&o1, base, &err);
  CHECK(rc == 0, "jobs 1: %s", err.msg);
  rc = rc ? rc : st_experiment_pb(&o2, base, &err);
  CHECK(rc == 0, "jobs 2: %s", err.msg);
  if (rc) return;
  char *csv1 = slurp(one, "results.csv"), *csv2 = slurp(two, "results.csv");
  CHECK(csv1 && csv2, "results.csv missing");
  if (csv1 && csv2) {
    drop_speeds(csv1);
    drop_speeds(csv2);
    CHECK(strcmp(csv1, csv2) == 0,
          "results.csv differs between jobs 1 and 2:\n%s---\n%s", csv1, csv2);
    CHECK(!strncmp(csv1, "variant,seed,test_accuracy,final_train_loss\n", 44),
          "header: %.60s", csv1);
    /* (variant, seed) order, seeds 42 and 43 (mlp_config's 42) */
    char want[64];
    const char *p = strchr(csv1, '\n') + 1;
    for (int v = 0; v < ST_EXPERIMENT_PB_VARIANTS; v++)
      for (int s = 0; s < 2; s++) {
        snprintf(want, sizeof want, "%s,%d,", st_experiment_pb_variant(v),
                 42 + s);
        CHECK(!strncmp(p, want, strlen(want)), "row %d: want %s, got %.40s",
              v * 2 + s, want, p);
        double acc = atof(p + strlen(want));
        CHECK(acc > 0 && acc <= 1, "%s accuracy %g", want, acc);
        p = strchr(p, '\n');
        p = p ? p + 1 : "";
      }
    CHECK(*p == 0, "extra rows: %.40s", p);
  }
  free(csv1);
  free(csv2);
  char *md = slurp(one, "results.md");
  CHECK(md != NULL, "results.md missing");
  if (md) {
    CHECK(count_lines_starting(md, "| ") == 1 + ST_EXPERIMENT_PB_VARIANTS,
          "results.md: %d table lines", count_lines_starting(md, "| "));
    for (int v = 0; v < ST_EXPERIMENT_PB_VARIANTS; v++) {
      char row[32];
      snprintf(row, sizeof row, "| %s | ", st_experiment_pb_variant(v));
      CHECK(count_lines_starting(md, row) == 1, "no row for %s", row);
    }
    /* the recipe moved from batch 4 to micro-batch 1: momentum 0.9^(1/4) */
    char moved[64];
    snprintf(moved, sizeof moved, "momentum %g -> %.6g",
             (double)base->optimizer.momentum,
             (double)(float)pow(base->optimizer.momentum, 0.25));
    CHECK(strstr(md, moved) && strstr(md, "4 stages") &&
              strstr(md, "optimizer.reference_batch=4"),
          "results.md settings: want '%s' and 4 stages", moved);
  }
  free(md);
  check_spread_column(one);
  check_speed_column(one, 2);
  check_against_trainer(base, one, &o1);
  char *svg = slurp(one, "curves.svg");
  CHECK(svg && !strncmp(svg, "<svg", 4) && strstr(svg, "</svg>"),
        "curves.svg is not an SVG");
  CHECK(svg &&
            count_lines_starting(svg, "<polyline") == ST_EXPERIMENT_PB_VARIANTS,
        "curves.svg: want a line per variant");
  free(svg);
}

/* A recipe tuned at batch 8 (optimizer.reference_batch) run at
 * train.batch 4: the baseline moves it from 8 to 4, the pipelined variants
 * from 8 to the micro-batch; results.md names 8, not train.batch. */
static void test_tuned_elsewhere(const st_config *base, const char *root) {
  st_config tuned = *base;
  tuned.optimizer.reference_batch = 8;
  st_experiment_options o = options("unused", 1, 1);
  st_config c;
  st_error err = {0};
  CHECK(st_experiment_pb_config(&c, &tuned, &o, 0, 0, &err) == 0 &&
            c.optimizer.reference_batch == 8 && c.train.batch == 4,
        "baseline of a recipe tuned at 8: reference_batch %d (%s)",
        c.optimizer.reference_batch, err.msg);
  CHECK(st_experiment_pb_config(&c, &tuned, &o, 1, 0, &err) == 0 &&
            c.optimizer.reference_batch == 8 && c.train.batch == 4,
        "none of a recipe tuned at 8: reference_batch %d (%s)",
        c.optimizer.reference_batch, err.msg);
  char dir[256];
  snprintf(dir, sizeof dir, "%s/tuned8", root);
  o = options(dir, 1, 1);
  int rc = st_experiment_pb(&o, &tuned, &err);
  CHECK(rc == 0, "tuned at 8: %s", err.msg);
  char *md = rc ? NULL : slurp(dir, "results.md");
  /* momentum 0.9 at 8 is 0.9^(4/8) at the baseline's batch 4 and
   * 0.9^(1/8) at micro-batch 1 (rounded to float, as the trainer runs) */
  char seq[64], pb[64];
  snprintf(seq, sizeof seq, "momentum %g -> %.6g",
           (double)base->optimizer.momentum,
           (double)(float)pow(base->optimizer.momentum, 0.5));
  snprintf(pb, sizeof pb, "momentum %g -> %.6g",
           (double)base->optimizer.momentum,
           (double)(float)pow(base->optimizer.momentum, 0.125));
  CHECK(md && strstr(md, "tuned at batch R = 8 (optimizer.reference_batch)") &&
            strstr(md, "the recipe moved from batch 8 to B = 4") &&
            strstr(md, seq) && strstr(md, "optimizer.reference_batch=8") &&
            strstr(md, pb),
        "results.md of a recipe tuned at 8: want '%s' and '%s':\n%s", seq, pb,
        md ? md : "(missing)");
  free(md);
}

/* --depths 2,4 on the 4-block MLP: the baseline, then none, sc, lwp and
 * sc+lwp cut into 2 and 4 stages; depth 4 is the per-block pipeline of
 * test_runs, so its rows repeat that experiment's accuracies. A depth the
 * model cannot be cut into is refused before any run. */
static void test_depths(const st_config *base, const char *root) {
  char dir[256], one[256];
  snprintf(dir, sizeof dir, "%s/depths", root);
  snprintf(one, sizeof one, "%s/jobs1", root);
  st_experiment_options o = options(dir, 2, 2);
  o.depths[0] = 2, o.depths[1] = 4, o.n_depths = 2;
  st_error err = {0};
  int rc = st_experiment_pb(&o, base, &err);
  CHECK(rc == 0, "depths: %s", err.msg);
  if (rc) return;
  char *csv = slurp(dir, "depth.csv"), *md = slurp(dir, "depth.md"),
       *svg = slurp(dir, "depth.svg"), *ref = slurp(one, "results.csv");
  CHECK(csv && md && svg && ref, "depth.csv, depth.md or depth.svg missing");
  if (csv && md && svg && ref) {
    CHECK(!strncmp(csv, "stages,variant,seed,test_accuracy,", 34),
          "depth.csv header: %.60s", csv);
    const char *names[] = {"none", "sc", "lwp", "sc+lwp"};
    const char *p = strchr(csv, '\n') + 1;
    for (int k = 0; k < 9; k++)
      for (int s = 0; s < 2; s++) {
        char want[64];
        int S = k == 0 ? 1 : k <= 4 ? 2 : 4;
        snprintf(want, sizeof want, "%d,%s,%d,", S,
                 k ? names[(k - 1) % 4] : "baseline", 42 + s);
        CHECK(!strncmp(p, want, strlen(want)),
              "depth.csv row %d: want %s, "
              "got %.40s",
              2 * k + s, want, p);
        if (S == 4 || k == 0) { /* the same run as test_runs's */
          char key[64];
          snprintf(key, sizeof key, "\n%s,%d,",
                   k ? names[(k - 1) % 4] : "baseline", 42 + s);
          const char *q = strstr(ref, key);
          CHECK(q && atof(q + strlen(key)) == atof(p + strlen(want)),
                "%s: accuracy %g, the 7-variant experiment's %g", want,
                atof(p + strlen(want)), q ? atof(q + strlen(key)) : -1.0);
        }
        p = strchr(p, '\n');
        p = p ? p + 1 : "";
      }
    CHECK(*p == 0, "depth.csv: extra rows: %.40s", p);
    CHECK(count_lines_starting(md, "| 2 |") == 1 &&
              count_lines_starting(md, "| 4 |") == 1 &&
              strstr(md, "| stages | none | sc | lwp | sc+lwp |") &&
              strstr(md, "Baseline (sequential at batch 4): "),
          "depth.md: a row per depth, a column per mitigation");
    CHECK(!strncmp(svg, "<svg", 4) &&
              count_lines_starting(svg, "<polyline") == 4,
          "depth.svg: want a line per mitigation");
  }
  free(csv);
  free(md);
  free(svg);
  free(ref);
  /* 8 stages of a 4-block model: refused before any run or file, naming
   * --depths (not the config's execution.stages) */
  snprintf(dir, sizeof dir, "%s/depths8", root);
  o = options(dir, 1, 2);
  o.depths[0] = 2, o.depths[1] = 8, o.n_depths = 2;
  rc = st_experiment_pb(&o, base, &err);
  struct stat sb;
  CHECK(rc == ST_EARG &&
            strstr(err.msg, "--depths 8: the model has 4 blocks; each stage "
                            "needs at least one") &&
            stat(dir, &sb) != 0,
        "depth 8 of 4 blocks: rc %d, '%s'", rc, err.msg);
  o.depths[0] = 4, o.depths[1] = 2;
  CHECK(st_experiment_pb(&o, base, &err) == ST_EARG &&
            strstr(err.msg, "rising"),
        "falling depths accepted: %s", err.msg);
}

static void test_divergence(const st_config *base, const char *root) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/diverged", root);
  st_config c = *base;
  c.optimizer.lr = 1e5f; /* non-finite within a few steps in every mode */
  st_experiment_options o = options(dir, 1, 2);
  st_error err = {0};
  CHECK(st_experiment_pb(&o, &c, &err) == 0, "%s", err.msg);
  char *csv = slurp(dir, "results.csv"), *md = slurp(dir, "results.md");
  CHECK(csv && strstr(csv, "\nbaseline,42,nan,nan,"),
        "diverged baseline not recorded: %s", csv ? csv : "(none)");
  CHECK(md && strstr(md, "| baseline | diverged |"),
        "results.md does not say diverged");
  free(csv);
  free(md);
  /* a diverged run's speed counts: with every run diverged the mean is
   * still theirs, not 0 or a division by no finished run */
  check_speed_column(dir, 1);
  /* One step: its training loss is the initial weights' (finite), and the
   * update after it leaves the weights non-finite. The test loss says so,
   * as it does in strata train; the baseline is diverged, not a run with
   * the accuracy NaN logits happen to score. */
  snprintf(dir, sizeof dir, "%s/diverged_last", root);
  c.train.steps = 1;
  c.optimizer.lr = 1e30f;
  o = options(dir, 1, 1);
  CHECK(st_experiment_pb(&o, &c, &err) == 0, "%s", err.msg);
  csv = slurp(dir, "results.csv"), md = slurp(dir, "results.md");
  CHECK(csv && strstr(csv, "\nbaseline,42,nan,nan,"),
        "baseline with non-finite weights after its last update not "
        "diverged: %s",
        csv ? csv : "(none)");
  CHECK(md && strstr(md, "| baseline | diverged |"),
        "results.md: baseline with non-finite weights not diverged");
  free(csv);
  free(md);
}

static void test_errors(const st_config *base, const char *root) {
  char dir[256];
  struct stat sb;
  st_error err = {0};
  /* adamw: every variant's config is checked before anything runs */
  snprintf(dir, sizeof dir, "%s/adamw", root);
  st_config c = *base;
  set_all(&c, (const char *[]){"optimizer.kind=adamw"}, 1);
  st_experiment_options o = options(dir, 2, 2);
  int rc = st_experiment_pb(&o, &c, &err);
  CHECK(rc == ST_ECONFIG && strstr(err.msg, "variant none, seed 42") &&
            strstr(err.msg, "optimizer.kind"),
        "adamw: rc %d: %s", rc, err.msg);
  CHECK(stat(dir, &sb) != 0, "adamw: %s was created", dir);
  /* 7 stages for 4 blocks fails when the trainer is made: the first failed
   * run in (variant, seed) order is reported, whichever failed first */
  for (int jobs = 1; jobs <= 3; jobs += 2) {
    snprintf(dir, sizeof dir, "%s/stages%d", root, jobs);
    c = *base;
    c.execution.stages = 7;
    o = options(dir, 2, jobs);
    rc = st_experiment_pb(&o, &c, &err);
    CHECK(rc == ST_ECONFIG && strstr(err.msg, "variant none, seed 42: ") &&
              strstr(err.msg, "execution.stages"),
          "jobs %d: rc %d: %s", jobs, rc, err.msg);
  }
  o = options(dir, 0, 1);
  CHECK(st_experiment_pb(&o, base, &err) == ST_EARG, "seeds 0 accepted");
  o = options(dir, 1, 0);
  CHECK(st_experiment_pb(&o, base, &err) == ST_EARG, "jobs 0 accepted");
  o = options(dir, 1, 1);
  o.points = 0;
  CHECK(st_experiment_pb(&o, base, &err) == ST_EARG, "points 0 accepted");
  o = options("", 1, 1);
  CHECK(st_experiment_pb(&o, base, &err) == ST_EARG, "no out_dir accepted");
}

int main(void) {
  (void)train, (void)cnn_config, (void)gpt_config; /* models.h's others */
  st_config base;
  tiny_config(&base);
  test_variant_configs(&base);
  char root[] = "/tmp/strata-test-experiment-XXXXXX";
  if (!mkdtemp(root)) {
    CHECK(0, "mkdtemp");
    TH_DONE();
  }
  /* train.threads unset: jobs 1 runs on every core, jobs 2 on one each */
  st_config any_threads = base;
  any_threads.train.threads = 0;
  test_runs(&any_threads, root);
  test_depths(&any_threads, root);
  test_tuned_elsewhere(&any_threads, root);
  test_divergence(&base, root);
  test_errors(&base, root);
  char cmd[sizeof root + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  TH_DONE();
}
