/*
 * sweep.c — steps to result against batch size (BACKGROUND.md §5; Shallue
 * et al. 2018, "Measuring the effects of data parallelism").
 *
 * For every batch size B a fixed number of trials, each a plain st_trainer
 * run at train.batch = B with its learning rate (and momentum) taken from a
 * Halton sequence, so the search points are spread evenly and the same for
 * every batch size and every run. A trial evaluates the test set every
 * eval_every steps and stops at the first evaluation that meets the target;
 * that step is its steps to result. B's steps to result is its best trial's.
 *
 * Files in out_dir: sweep.csv (every trial, rewritten atomically after each
 * one, so a killed sweep resumes from it), steps.csv (best per batch size),
 * steps.svg (log-log plot) and report.md (table and regimes).
 *
 * Trials run in parallel: o->jobs workers (the calling thread and jobs - 1
 * pthreads) take the trials still to run in (batch, trial) order from one
 * mutex-guarded index, each trial its own st_trainer, on one thread unless
 * the config sets train.threads. A trial's result depends only on its
 * config (the trainer is bitwise independent of its thread count), and
 * every file is written from the results in (batch, trial) order, so the
 * files do not depend on jobs or on the order in which trials finish.
 */
#include "strata.h"

#include "../io/svg.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct trial {
  int done;
  int64_t steps; /* first step meeting the target, -1: not reached */
  double metric; /* at the trial's last evaluation; NaN if it diverged */
} trial;

typedef struct best {
  int trial; /* -1: no trial reached the target */
  int64_t steps;
} best;

/* The gradient noise scale along one batch size's best trial, run again
 * with metrics.noise_scale (o->noise_batch). */
typedef struct noise {
  int batch;     /* 0: not measured */
  int64_t steps; /* the run's length: that trial's steps to result */
  /* B_simple over three windows of the run: the steps' estimates of
   * tr(S) and |G|^2 each averaged over the window, then divided */
  double b_early;      /* the first 10% of the steps */
  double b_mid;        /* 40% to 60% */
  double b_end;        /* the last 20%: at the target */
  int failed;          /* the run stopped at an error */
  const char *none[3]; /* why each window has no figure, if it has none */
} noise;

/* What the report and the plot say beyond the table. */
typedef struct summary {
  int n_train;                 /* training samples, for budget_at */
  double s_min, e_min, b_crit; /* st_sweep_fit; NaN without a fit */
  noise ns;
} summary;

int st_sweep_target_parse(st_sweep_target *t, const char *spec, st_error *err) {
  const char *eq = spec ? strchr(spec, '=') : NULL;
  if (!eq)
    return st_error_set(err, ST_EARG,
                        "target '%s': expected accuracy=VALUE or loss=VALUE",
                        spec ? spec : "");
  /* the metric is the test set's: also by the names summary.json and
   * metrics.jsonl give it */
  static const struct {
    const char *name;
    int kind;
  } names[] = {{"accuracy", ST_TARGET_ACCURACY},
               {"test_accuracy", ST_TARGET_ACCURACY},
               {"loss", ST_TARGET_LOSS},
               {"test_loss", ST_TARGET_LOSS}};
  size_t n = (size_t)(eq - spec);
  int k = 0, count = (int)(sizeof names / sizeof names[0]);
  while (k < count &&
         !(strlen(names[k].name) == n && !strncmp(spec, names[k].name, n)))
    k++;
  if (k == count)
    return st_error_set(err, ST_EARG,
                        "target '%s': unknown metric '%.*s' (accuracy, "
                        "test_accuracy, loss or test_loss)",
                        spec, (int)n, spec);
  t->kind = names[k].kind;
  char *end;
  errno = 0;
  t->value = strtod(eq + 1, &end);
  if (eq[1] == 0 || *end != 0 || errno || !isfinite(t->value))
    return st_error_set(err, ST_EARG, "target '%s': '%s' is not a number", spec,
                        eq + 1);
  if (t->kind == ST_TARGET_ACCURACY && !(t->value > 0 && t->value <= 1))
    return st_error_set(err, ST_EARG,
                        "target '%s': accuracy must lie in (0, 1]", spec);
  if (t->kind == ST_TARGET_LOSS && !(t->value > 0))
    return st_error_set(err, ST_EARG, "target '%s': loss must be > 0", spec);
  return 0;
}

double st_sweep_halton(int64_t index, int base) {
  double f = 1, r = 0;
  for (int64_t i = index; i > 0; i /= base) {
    f /= base;
    r += f * (double)(i % base);
  }
  return r;
}

static int has_momentum(const st_config *c) {
  return strcmp(c->optimizer.kind, "sgd") == 0 && c->optimizer.momentum != 0;
}

void st_sweep_point(const st_sweep_options *o, const st_config *base, int trial,
                    double *lr, double *momentum) {
  /* Index 0 of the sequence is 0 in every base: start at 1. */
  double u = st_sweep_halton(trial + 1, 2);
  *lr = o->lr_min * pow(o->lr_max / o->lr_min, u);
  if (!has_momentum(base)) {
    *momentum = -1;
    return;
  }
  /* 1 - momentum log-uniform over [0.01, 0.5]. */
  double lo = log10(0.01), hi = log10(0.5);
  double v = st_sweep_halton(trial + 1, 3);
  *momentum = 1 - pow(10, lo + v * (hi - lo));
}

static int check_options(const st_sweep_options *o, st_error *err) {
  const st_int_list *b = &o->batch_sizes;
  if (b->n < 1) return st_error_set(err, ST_EARG, "sweep: no batch sizes");
  for (int i = 0; i < b->n; i++) {
    if (b->v[i] < 1)
      return st_error_set(err, ST_EARG, "sweep: batch size %d must be >= 1",
                          b->v[i]);
    if (i && b->v[i] <= b->v[i - 1])
      return st_error_set(err, ST_EARG,
                          "sweep: batch sizes must increase (%d after %d)",
                          b->v[i], b->v[i - 1]);
  }
  if (o->trials < 1)
    return st_error_set(err, ST_EARG, "sweep: trials = %d must be >= 1",
                        o->trials);
  if (o->budget_steps < 1)
    return st_error_set(err, ST_EARG, "sweep: budget = %lld steps must be >= 1",
                        (long long)o->budget_steps);
  if (o->eval_every < 1)
    return st_error_set(err, ST_EARG, "sweep: eval-every = %d must be >= 1",
                        o->eval_every);
  if (!(o->budget_epochs >= 0 && isfinite(o->budget_epochs)))
    return st_error_set(err, ST_EARG,
                        "sweep: budget = %g epochs must be >= 0 (0: off)",
                        o->budget_epochs);
  if (!isfinite(o->eval_growth) || o->eval_growth > 100)
    return st_error_set(err, ST_EARG,
                        "sweep: eval-growth = %g must be at most 100 (<= 1: "
                        "every eval-every steps)",
                        o->eval_growth);
  if (o->noise_batch) {
    int in = 0;
    for (int i = 0; i < b->n; i++) in |= b->v[i] == o->noise_batch;
    if (!in || o->noise_batch < 2 || o->noise_batch % 2)
      return st_error_set(err, ST_EARG,
                          "sweep: noise batch %d must be one of the batch "
                          "sizes, even (its gradient is measured on each "
                          "half and on the whole)",
                          o->noise_batch);
  }
  if (!(o->lr_min > 0 && o->lr_min <= o->lr_max && isfinite(o->lr_max)))
    return st_error_set(err, ST_EARG,
                        "sweep: learning-rate range %g,%g: need 0 < min <= max",
                        o->lr_min, o->lr_max);
  if (!o->out_dir[0])
    return st_error_set(err, ST_EARG, "sweep: no output directory");
  if (o->jobs < 1)
    return st_error_set(err, ST_EARG,
                        "sweep: jobs = %d must be >= 1 (trials run at once)",
                        o->jobs);
  return 0;
}

/* x, a product of a number given as decimal text, as a whole number when
 * it is one but for the double's rounding: 0.56 epochs of 400 samples are
 * 224.00000000000003 in doubles, and 2.2 x 25 steps 55.000000000000007,
 * whose ceilings would be one more than the decimal's. */
static double whole_if_near(double x) {
  double whole = round(x);
  return fabs(x - whole) <= 1e-9 * fabs(x) ? whole : x;
}

/* A trial's steps at this batch size: budget_steps, or budget_epochs passes
 * over the n_train training samples when that is fewer. */
static int64_t budget_at(const st_sweep_options *o, int n_train, int batch) {
  int64_t s = o->budget_steps;
  if (o->budget_epochs > 0) {
    double e = ceil(whole_if_near(o->budget_epochs * n_train) / batch);
    if (e < (double)s) s = e < 1 ? 1 : (int64_t)e;
  }
  return s;
}

/* The step of the evaluation after step s (s = 0: the first). */
static int64_t next_eval(const st_sweep_options *o, int64_t s) {
  int64_t n = s + o->eval_every;
  if (o->eval_growth > 1) {
    double g = ceil(whole_if_near((double)s * o->eval_growth));
    if (g > (double)n) n = (int64_t)g;
  }
  return n;
}

static const char *metric_name(const st_sweep_options *o) {
  return o->target.kind == ST_TARGET_ACCURACY ? "accuracy" : "loss";
}

static int meets(const st_sweep_options *o, double metric) {
  return o->target.kind == ST_TARGET_ACCURACY ? metric >= o->target.value
                                              : metric <= o->target.value;
}

static void join(char *out, size_t cap, const char *dir, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

/* A number as the CSV writes it; "%.9g" survives a read back and a rewrite
 * unchanged, which the resume relies on. */
static void put_num(FILE *f, double v) { fprintf(f, "%.9g", v); }

/* kept: rows of an earlier sweep.csv outside this sweep's grid, written
 * after the grid's own so that a narrower resume loses none of them. */
static int write_sweep_csv(const st_sweep_options *o, const st_config *base,
                           const trial *t, const char *kept, st_error *err) {
  char path[ST_PATH_MAX + 32];
  join(path, sizeof path, o->out_dir, "sweep.csv");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  fprintf(f, "batch,trial,lr,momentum,steps_to_target,final_%s\n",
          metric_name(o));
  for (int b = 0; b < o->batch_sizes.n; b++)
    for (int i = 0; i < o->trials; i++) {
      const trial *r = &t[b * o->trials + i];
      if (!r->done) continue;
      double lr, mom;
      st_sweep_point(o, base, i, &lr, &mom);
      fprintf(f, "%d,%d,", o->batch_sizes.v[b], i);
      put_num(f, lr);
      fputc(',', f);
      if (mom >= 0) put_num(f, mom);
      fputc(',', f);
      if (r->steps >= 0) fprintf(f, "%lld", (long long)r->steps);
      fputc(',', f);
      put_num(f, r->metric);
      fputc('\n', f);
    }
  if (kept) fputs(kept, f);
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* Same decimal text as put_num wrote for this value? */
static int same_num(const char *text, double v) {
  char s[64];
  snprintf(s, sizeof s, "%.9g", v);
  return strcmp(text, s) == 0;
}

/* Reads trials from an earlier DIR/sweep.csv. Rows of batch sizes or trial
 * numbers outside this sweep are kept as they are (*kept, malloc'd, NULL
 * when none) for write_sweep_csv: finished work a later, wider resume
 * reuses. A row whose learning rate or momentum differs from what this
 * sweep would use means another sweep wrote the file, which is an error. */
static int read_sweep_csv(const st_sweep_options *o, const st_config *base,
                          trial *t, int *reused, char **kept, st_error *err) {
  char path[ST_PATH_MAX + 32];
  join(path, sizeof path, o->out_dir, "sweep.csv");
  *reused = 0;
  *kept = NULL;
  FILE *f = fopen(path, "r");
  if (!f) {
    if (errno == ENOENT) return 0;
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", path,
                        strerror(errno));
  }
  char line[512], want[128];
  snprintf(want, sizeof want,
           "batch,trial,lr,momentum,steps_to_target,final_%s", metric_name(o));
  int rc = 0, lineno = 1;
  size_t kept_len = 0;
  FILE *keep = open_memstream(kept, &kept_len);
  if (!keep) {
    fclose(f);
    return st_error_set(err, ST_ENOMEM, "sweep: out of memory");
  }
  if (!fgets(line, sizeof line, f) ||
      (line[strcspn(line, "\r\n")] = 0, strcmp(line, want) != 0)) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s:1: header is not '%s' (a sweep with another "
                      "target metric? use another --out)",
                      path, want);
    goto done;
  }
  while (fgets(line, sizeof line, f)) {
    lineno++;
    /* every row was written whole, newline and all (atomically): one
     * without it was cut short ("0.5312" read as "0.5"), or is too long */
    if (!strchr(line, '\n')) {
      rc = st_error_set(err, ST_EFORMAT,
                        "%s:%d: %s; remove the row to run its trial again",
                        path, lineno,
                        feof(f) ? "the last row has no end of line: the file "
                                  "was cut short"
                                : "row longer than any sweep writes");
      goto done;
    }
    line[strcspn(line, "\r\n")] = 0;
    if (!line[0]) continue;
    char row[sizeof line];
    strcpy(row, line); /* the same size: it fits */
    char *field[6];
    int n = 0;
    for (char *p = line; n < 6; n++) {
      field[n] = p;
      char *c = strchr(p, ',');
      if (!c) {
        n++;
        break;
      }
      *c = 0;
      p = c + 1;
    }
    if (n != 6) {
      rc = st_error_set(err, ST_EFORMAT, "%s:%d: expected 6 fields, got %d",
                        path, lineno, n);
      goto done;
    }
    char *end;
    long batch = strtol(field[0], &end, 10);
    int ok = *field[0] && !*end;
    long index = strtol(field[1], &end, 10);
    ok = ok && *field[1] && !*end;
    long long steps = -1;
    if (ok && *field[4]) {
      steps = strtoll(field[4], &end, 10);
      ok = !*end && steps >= 1; /* a trial's first step is step 1 */
    }
    double metric = strtod(field[5], &end);
    ok = ok && *field[5] && !*end && index >= 0 && index < INT_MAX;
    if (!ok) {
      rc = st_error_set(err, ST_EFORMAT, "%s:%d: malformed row", path, lineno);
      goto done;
    }
    double lr, mom;
    st_sweep_point(o, base, (int)index, &lr, &mom);
    if (!same_num(field[2], lr) ||
        (mom >= 0 ? !same_num(field[3], mom) : *field[3] != 0)) {
      rc = st_error_set(err, ST_EFORMAT,
                        "%s:%d: trial %ld has lr %s momentum '%s', but this "
                        "sweep would use lr %.9g (another --lr-range or "
                        "optimizer? use another --out)",
                        path, lineno, index, field[2], field[3], lr);
      goto done;
    }
    int b = -1;
    for (int k = 0; k < o->batch_sizes.n; k++)
      if (o->batch_sizes.v[k] == batch) b = k;
    if (b < 0 || index >= o->trials) {
      fprintf(keep, "%s\n", row);
      continue;
    }
    trial *r = &t[b * o->trials + index];
    if (!r->done) ++*reused;
    *r = (trial){1, steps, metric};
  }
done:
  fclose(f);
  if (fclose(keep) != 0 && !rc)
    rc = st_error_set(err, ST_ENOMEM, "sweep: out of memory");
  if (rc || !kept_len) {
    free(*kept);
    *kept = NULL;
  }
  return rc;
}

/* A file store (weight streaming) is a run's state, which the next run
 * with its path resumes: each trainer the sweep makes gets a store of its
 * own in the sweep's directory, `name`, with none there before it (a
 * sweep stopped mid-trial leaves one), removed when the trainer is done
 * (drop_store). With the config's path, every trial after the first went
 * on from the one before's weights, whatever its learning rate. */
static int file_store(const st_config *c) {
  return !strcmp(c->execution.mode, "weight_streaming") &&
         !strcmp(c->execution.store, "file");
}

static void drop_store(const st_config *c) {
  if (!file_store(c) || !c->execution.store_path[0]) return;
  char tmp[sizeof c->execution.store_path + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", c->execution.store_path);
  unlink(c->execution.store_path);
  unlink(tmp);
}

static int own_store(const st_sweep_options *o, st_config *c, const char *name,
                     st_error *err) {
  if (!file_store(c)) return 0;
  if (!o->out_dir[0])
    return st_error_set(err, ST_EARG,
                        "sweep: execution.store: file: each trial needs a "
                        "store of its own, in the sweep's directory, and "
                        "this sweep has none");
  char path[sizeof c->execution.store_path];
  int n = snprintf(path, sizeof path, "%s/%s", o->out_dir, name);
  if (n < 0 || (size_t)n >= sizeof path) {
    c->execution.store_path[0] = '\0'; /* nothing of it to remove */
    return st_error_set(err, ST_EARG,
                        "sweep: %s/%s: a trial's store path is too long",
                        o->out_dir, name);
  }
  memcpy(c->execution.store_path, path, (size_t)n + 1);
  drop_store(c);
  return 0;
}

/* Trial `index`'s config at this batch size: its point of the search, the
 * budget as the schedule's length, no progress line, a store of its own. */
static int trial_config(const st_sweep_options *o, const st_config *base,
                        int n_train, int batch, int index, st_config *c,
                        st_error *err) {
  *c = *base;
  char name[64];
  snprintf(name, sizeof name, "trial-b%d-%d.store", batch, index);
  int rc = own_store(o, c, name, err);
  if (rc) return rc;
  double lr, mom;
  st_sweep_point(o, base, index, &lr, &mom);
  c->train.batch = batch;
  c->train.steps = budget_at(o, n_train, batch);
  c->optimizer.lr = (float)lr;
  if (mom >= 0) c->optimizer.momentum = (float)mom;
  /* The point is the recipe at this batch, searched for it: a recipe the
   * config says was tuned at another batch is moved from this one (to the
   * micro-batch, in pipelined backprop; not at all elsewhere). */
  if (c->optimizer.reference_batch > 0) c->optimizer.reference_batch = batch;
  snprintf(c->metrics.progress, sizeof c->metrics.progress, "off");
  return st_config_validate(c, err);
}

/* One trial: trains from scratch, evaluating on the schedule of next_eval
 * and at the budget's end, until the target is met. A diverged run
 * (non-finite loss) did not reach the target; any other error stops the
 * sweep. */
static int run_trial(const st_sweep_options *o, const st_config *base,
                     int n_train, int batch, int index, trial *r,
                     st_error *err) {
  st_config c;
  int rc = trial_config(o, base, n_train, batch, index, &c, err);
  if (rc) return rc;
  st_trainer *t;
  if ((rc = st_trainer_create(&t, &c, NULL, err))) {
    drop_store(&c);
    return rc;
  }
  *r = (trial){1, -1, NAN};
  int64_t budget = c.train.steps, eval_at = next_eval(o, 0);
  for (int64_t step = 1; step <= budget; step++) {
    double loss, eval_loss, acc;
    rc = st_trainer_step(t, &loss, err);
    if (rc == ST_ENONFINITE) {
      rc = 0;
      r->metric = NAN;
      break;
    }
    if (rc) break;
    if (step < eval_at && step != budget) continue;
    eval_at = next_eval(o, step);
    if ((rc = st_trainer_evaluate(t, &eval_loss, &acc, err))) break;
    /* an update after the last checked training loss left the weights
     * non-finite: diverged (the accuracy NaN logits score is no result) */
    if (!isfinite(eval_loss)) {
      r->metric = NAN;
      break;
    }
    r->metric = o->target.kind == ST_TARGET_ACCURACY ? acc : eval_loss;
    if (meets(o, r->metric)) {
      r->steps = step;
      break;
    }
  }
  st_trainer_destroy(t);
  drop_store(&c);
  if (rc) r->done = 0;
  return rc;
}

static best best_of(const st_sweep_options *o, const trial *t, int b) {
  best x = {-1, -1};
  for (int i = 0; i < o->trials; i++) {
    const trial *r = &t[b * o->trials + i];
    if (r->steps >= 0 && (x.trial < 0 || r->steps < x.steps))
      x = (best){i, r->steps};
  }
  return x;
}

static int write_steps_csv(const st_sweep_options *o, const st_config *base,
                           const best *bs, st_error *err) {
  char path[ST_PATH_MAX + 32];
  join(path, sizeof path, o->out_dir, "steps.csv");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  fprintf(f, "batch,steps_to_target,trial,lr,momentum\n");
  for (int b = 0; b < o->batch_sizes.n; b++) {
    fprintf(f, "%d,", o->batch_sizes.v[b]);
    if (bs[b].trial >= 0) {
      double lr, mom;
      st_sweep_point(o, base, bs[b].trial, &lr, &mom);
      fprintf(f, "%lld,%d,", (long long)bs[b].steps, bs[b].trial);
      put_num(f, lr);
      fputc(',', f);
      if (mom >= 0) put_num(f, mom);
    } else {
      fprintf(f, ",,,");
    }
    fputc('\n', f);
  }
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* The steps ratio from batch a to batch b (a < b, both reached) normalised
 * to one doubling: r^(1 / log2(b / a)). */
static double per_doubling(int a, int64_t sa, int b, int64_t sb) {
  return pow((double)sb / (double)sa, 1.0 / log2((double)b / a));
}

static st_sweep_regime classify(double r) {
  return r <= ST_SWEEP_PERFECT   ? ST_REGIME_PERFECT
         : r >= ST_SWEEP_MAXIMAL ? ST_REGIME_MAXIMAL
                                 : ST_REGIME_DIMINISHING;
}

static const char *regime_name(st_sweep_regime g) {
  static const char *names[] = {"perfect scaling", "diminishing returns",
                                "maximal data parallelism"};
  return names[g];
}

/* The one regime rule: report.md's table and summary and steps.svg's
 * shading all come from here (and tests/exec/test_nqm.c checks it against
 * the noisy quadratic model). */
st_sweep_scaling st_sweep_regimes(const int *batch, const int64_t *steps, int n,
                                  double *ratio, int *regime) {
  st_sweep_scaling s = {0, -1, -1};
  int prev = -1, end_perfect = -1;
  for (int k = 0; k < n; k++) {
    if (ratio) ratio[k] = NAN;
    if (regime) regime[k] = ST_REGIME_NONE;
    if (steps[k] < 1) continue;
    s.reached++;
    if (prev >= 0) {
      double r = per_doubling(batch[prev], steps[prev], batch[k], steps[k]);
      st_sweep_regime g = classify(r);
      if (ratio) ratio[k] = r;
      if (regime) regime[k] = g;
      if (g != ST_REGIME_PERFECT && end_perfect < 0) end_perfect = prev;
      /* Maximal data parallelism starts where no later doubling helps. */
      if (g != ST_REGIME_MAXIMAL)
        s.start_maximal = -1;
      else if (s.start_maximal < 0)
        s.start_maximal = prev;
    }
    prev = k;
  }
  if (s.reached >= 2) s.end_perfect = end_perfect >= 0 ? end_perfect : prev;
  return s;
}

/* Steps to result per batch size as st_sweep_regimes takes them. */
static st_sweep_scaling regimes_of(const st_sweep_options *o, const best *bs,
                                   double *ratio, int *regime) {
  int64_t steps[ST_MAX_LIST] = {0};
  for (int b = 0; b < o->batch_sizes.n; b++)
    steps[b] = bs[b].trial >= 0 ? bs[b].steps : -1;
  return st_sweep_regimes(o->batch_sizes.v, steps, o->batch_sizes.n, ratio,
                          regime);
}

/* Indices of the batch sizes that reached the target, in order. */
static int reached(const st_sweep_options *o, const best *bs, int *idx) {
  int n = 0;
  for (int b = 0; b < o->batch_sizes.n; b++)
    if (bs[b].trial >= 0) idx[n++] = b;
  return n;
}

double st_sweep_fit(const int *batch, const int64_t *steps, int n,
                    double *s_min, double *e_min) {
  /* With u = 1/steps and v = 1/(B steps) the residual is a u + c v - 1:
   * linear least squares in (a, c) = (S_min, E_min). */
  double uu = 0, uv = 0, vv = 0, su = 0, sv = 0;
  int m = 0;
  for (int k = 0; k < n; k++) {
    if (steps[k] < 1) continue;
    double u = 1.0 / (double)steps[k], v = u / batch[k];
    uu += u * u, uv += u * v, vv += v * v, su += u, sv += v;
    m++;
  }
  double det = uu * vv - uv * uv, a = NAN, c = NAN;
  if (m >= 2 && det > 1e-12 * uu * vv) {
    a = (su * vv - sv * uv) / det;
    c = (sv * uu - su * uv) / det;
  }
  if (!(a > 0 && c > 0)) a = c = NAN;
  if (s_min) *s_min = a;
  if (e_min) *e_min = c;
  return c / a;
}

/* Estimates of tr(S) and |G|^2 summed over a window of steps. */
typedef struct window {
  double trace, g2;
  int64_t n;
} window;

static void window_add(window *w, double trace, double g2) {
  w->trace += trace, w->g2 += g2, w->n++;
}

static double window_b(const window *w) {
  return w->n > 0 && w->g2 > 0 ? w->trace / w->g2 : NAN;
}

/* Why window_b gives no B_simple (NaN, or a ratio <= 0): no steps in the
 * window, or estimates that are noise (each is unbiased, so either sum
 * can be <= 0). */
static const char *window_none(const window *w) {
  return w->n == 0    ? "too few steps"
         : w->g2 <= 0 ? "a |G|^2 estimate <= 0"
                      : "a ratio <= 0";
}

/* The noise run's config: trial `index` at the noise batch, measuring. */
static int noise_config(const st_sweep_options *o, const st_config *base,
                        int n_train, int index, st_config *c, st_error *err) {
  int rc = trial_config(o, base, n_train, o->noise_batch, index, c, err);
  if (rc) return rc;
  c->metrics.noise_scale = 1;
  c->metrics.noise_ema = 0; /* each step's own estimates (windows below) */
  return st_config_validate(c, err);
}

/* Before any trial: the noise run must be possible with this config (its
 * mode measures the noise scale, its batch splits), or the sweep would
 * fail after all its trials. A trainer is made and dropped. */
static int check_noise(const st_sweep_options *o, const st_config *base,
                       int n_train, st_error *err) {
  st_config c;
  st_trainer *t = NULL;
  int rc = noise_config(o, base, n_train, 0, &c, err);
  if (!rc) rc = st_trainer_create(&t, &c, NULL, err);
  st_trainer_destroy(t);
  drop_store(&c);
  if (rc) {
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    st_error_set(err, rc,
                 "sweep: --noise-batch %d: the noise run cannot measure "
                 "with this config: %s",
                 o->noise_batch, msg);
  }
  return rc;
}

/* Runs batch o->noise_batch's best trial again with metrics.noise_scale for
 * its steps to result (the same run but for rounding: the batch's gradient
 * is summed from its two halves). Each step gives unbiased estimates of
 * tr(S) and |G|^2 (metrics.noise_ema 0: the step's own); B_simple over a
 * window of steps is the ratio of their means there. An exponential moving
 * average would not do: |G|^2 falls by orders of magnitude early on, and
 * over a run of a few hundred steps an average of ~100 steps still carries
 * the start. DIR/noise.csv has one row per evaluation-schedule point, the
 * window since the row before. Not measured (ns->batch 0) when that batch
 * size never reached the target. */
static int run_noise(const st_sweep_options *o, const st_config *base,
                     int n_train, const best *bs, noise *ns, st_error *err) {
  *ns = (noise){0, 0, NAN, NAN, NAN, 0, {NULL, NULL, NULL}};
  int b = 0;
  while (o->batch_sizes.v[b] != o->noise_batch) b++;
  char path[ST_PATH_MAX + 32];
  join(path, sizeof path, o->out_dir, "noise.csv");
  if (bs[b].trial < 0) {
    unlink(path); /* not measured: no earlier run's file stands for it */
    return 0;
  }
  st_config c;
  int rc = noise_config(o, base, n_train, bs[b].trial, &c, err);
  if (rc) return rc;
  if (o->progress) {
    fprintf(o->progress,
            "sweep: gradient noise scale along batch %d's best trial (%lld "
            "steps)\n",
            o->noise_batch, (long long)bs[b].steps);
    fflush(o->progress);
  }
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  fprintf(f, "step,samples,b_simple,g2,trace\n");
  st_trainer *t;
  if ((rc = st_trainer_create(&t, &c, NULL, err))) {
    fclose(f);
    free(buf);
    drop_store(&c);
    return rc;
  }
  int64_t S = bs[b].steps, eval_at = next_eval(o, 0);
  window row = {0}, early = {0}, mid = {0}, end = {0};
  ns->batch = o->noise_batch;
  for (int64_t step = 1; step <= S; step++) {
    double loss, g2, trace;
    if ((rc = st_trainer_step(t, &loss, err))) break;
    st_noise_scale_value(st_trainer_noise(t), &g2, &trace);
    ns->steps = step;
    window_add(&row, trace, g2);
    if (10 * step <= S || step == 1) window_add(&early, trace, g2);
    if (5 * step > 2 * S && 5 * step <= 3 * S) window_add(&mid, trace, g2);
    if (5 * step > 4 * S) window_add(&end, trace, g2);
    if (step < eval_at && step != S) continue;
    eval_at = next_eval(o, step);
    fprintf(f, "%lld,%lld,", (long long)step, (long long)step * o->noise_batch);
    put_num(f, window_b(&row));
    fputc(',', f);
    put_num(f, row.g2 / (double)row.n);
    fputc(',', f);
    put_num(f, row.trace / (double)row.n);
    fputc('\n', f);
    row = (window){0};
  }
  ns->b_early = window_b(&early);
  ns->b_mid = window_b(&mid);
  ns->b_end = window_b(&end);
  ns->none[0] = window_none(&early);
  ns->none[1] = window_none(&mid);
  ns->none[2] = window_none(&end);
  st_trainer_destroy(t);
  drop_store(&c);
  /* A divergence here (the trial itself did not diverge) ends the
   * measurement early; the rows so far stand. */
  if (rc == ST_ENONFINITE) rc = 0;
  if (rc) {
    fclose(f);
    free(buf);
    return rc;
  }
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* The fitted critical batch size and the noise scale, as report.md says
 * them. */
static void report_critical(FILE *f, const st_sweep_options *o,
                            const st_config *base, const best *bs,
                            const summary *sum, st_sweep_scaling sc) {
  const int *B = o->batch_sizes.v;
  fprintf(f, "\n## Critical batch size\n\n");
  if (isnan(sum->b_crit))
    fprintf(f, "No fit of McCandlish et al.'s S(B) = S_min (1 + B_crit / B): "
               "it needs at least two batch sizes that reached the target, "
               "with steps that fall and level off.\n");
  else
    fprintf(f,
            "Fit of McCandlish et al.'s S(B) = S_min (1 + B_crit / B) to "
            "the batch sizes that reached the target (least squares on the "
            "relative error): S_min = %.0f steps, E_min = %.0f samples, "
            "**B_crit = E_min / S_min = %.0f**. On that curve a doubling "
            "from B takes the steps down by (B + B_crit/2) / (B + B_crit), "
            "so by the rule's thresholds perfect scaling ends near B_crit / "
            "4 = %.0f and maximal data parallelism starts near 4 B_crit = "
            "%.0f.",
            sum->s_min, sum->e_min, sum->b_crit, sum->b_crit / 4,
            4 * sum->b_crit);
  if (sc.end_perfect >= 0 && sc.start_maximal >= 0)
    fprintf(f,
            " By the rule the turn lies between batch %d and batch %d, "
            "geometric middle %.0f.",
            B[sc.end_perfect], B[sc.start_maximal],
            sqrt((double)B[sc.end_perfect] * B[sc.start_maximal]));
  fputc('\n', f);
  if (!o->noise_batch) return;
  const noise *ns = &sum->ns;
  if (!ns->batch) {
    fprintf(f,
            ns->failed ? "\nGradient noise scale: not measured, the run at "
                         "batch %d stopped at an error (the sweep's).\n"
                       : "\nGradient noise scale: not measured, batch %d "
                         "never reached the target.\n",
            o->noise_batch);
    return;
  }
  int b = 0;
  while (B[b] != o->noise_batch) b++;
  double lr, mom;
  st_sweep_point(o, base, bs[b].trial, &lr, &mom);
  fprintf(f,
          "\nGradient noise scale B_simple = tr(S) / |G|^2 (BACKGROUND.md "
          "§5; McCandlish et al. appendix A), along batch %d's best trial "
          "(lr %.4g",
          ns->batch, lr);
  if (mom >= 0) fprintf(f, ", momentum %.4g", mom);
  /* a window of too few steps, or whose estimates are <= 0 or divide to
   * a ratio <= 0 (each is unbiased, so it can be negative), has no
   * figure */
  char w[3][48];
  const double v[3] = {ns->b_early, ns->b_mid, ns->b_end};
  for (int i = 0; i < 3; i++)
    if (isfinite(v[i]) && v[i] > 0)
      snprintf(w[i], sizeof w[i], "**%.0f**", v[i]);
    else
      snprintf(w[i], sizeof w[i], "no estimate (%s)", ns->none[i]);
  /* the small batch: the first micro-batch where the config sets one */
  char small[64];
  if (base->execution.micro_batch)
    snprintf(small, sizeof small, "first micro-batch (%d samples)",
             base->execution.micro_batch);
  else
    snprintf(small, sizeof small, "first half of the batch");
  fprintf(f,
          ") run again for %lld steps; each step's gradient norms on the "
          "%s and on the whole batch give unbiased estimates of "
          "tr(S) and |G|^2, averaged over a window of steps and then "
          "divided: %s over the first 10%% of the steps, %s over 40-60%%, "
          "%s over the last 20%%, at the target (noise.csv: every "
          "evaluation interval).",
          (long long)ns->steps, small, w[0], w[1], w[2]);
  if (!isnan(sum->b_crit) && ns->b_end > 0)
    fprintf(f,
            " At the target B_simple is %.2f times the fitted B_crit "
            "(McCandlish et al. find B_crit close to B_noise, of which "
            "B_simple is the Hessian-free proxy).",
            ns->b_end / sum->b_crit);
  fputc('\n', f);
}

static int write_report(const st_sweep_options *o, const st_config *base,
                        const best *bs, const summary *sum, st_error *err) {
  char path[ST_PATH_MAX + 32];
  join(path, sizeof path, o->out_dir, "report.md");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  const int *B = o->batch_sizes.v;
  char epochs[96] = "", evals[160];
  if (o->budget_epochs > 0)
    snprintf(epochs, sizeof epochs, " and at most %g epochs", o->budget_epochs);
  if (o->eval_growth > 1)
    snprintf(evals, sizeof evals,
             "at step %d and then at max(s + %d, ceil(%g s)) after step s",
             o->eval_every, o->eval_every, o->eval_growth);
  else
    snprintf(evals, sizeof evals, "every %d steps", o->eval_every);
  fprintf(f, "# Steps to result against batch size\n\n");
  fprintf(f,
          "Config `%s`, model %s, optimizer %s%s. Target: test %s %s %g. "
          "%d trial%s per batch size, at most %lld steps each%s, evaluated "
          "%s; learning rate searched on a log scale over "
          "[%g, %g]%s (Halton sequence). Steps to result is the best "
          "trial's first evaluated step meeting the target (Shallue et al. "
          "2018; BACKGROUND.md §5).\n\n",
          base->path[0] ? base->path : "(none)", base->model.kind,
          base->optimizer.kind,
          has_momentum(base)
              ? (base->optimizer.nesterov ? " (Nesterov)" : " (momentum)")
              : "",
          metric_name(o),
          o->target.kind == ST_TARGET_ACCURACY ? ">=" : "<=", o->target.value,
          o->trials, o->trials == 1 ? "" : "s", (long long)o->budget_steps,
          epochs, evals, o->lr_min, o->lr_max,
          has_momentum(base) ? ", momentum as 1 - m log-uniform over "
                               "[0.01, 0.5]"
                             : "");
  fprintf(f, "| batch | steps to target | samples | lr | momentum | steps "
             "ratio per doubling | regime | budget |\n");
  fprintf(f, "|---:|---:|---:|---:|---:|---:|---|---:|\n");
  double ratio[ST_MAX_LIST];
  int regime[ST_MAX_LIST];
  st_sweep_scaling sc = regimes_of(o, bs, ratio, regime);
  for (int b = 0; b < o->batch_sizes.n; b++) {
    long long budget = (long long)budget_at(o, sum->n_train, B[b]);
    if (bs[b].trial < 0) {
      fprintf(f, "| %d | not reached | | | | | | %lld |\n", B[b], budget);
      continue;
    }
    double lr, mom;
    st_sweep_point(o, base, bs[b].trial, &lr, &mom);
    fprintf(f, "| %d | %lld | %lld | %.4g | ", B[b], (long long)bs[b].steps,
            (long long)bs[b].steps * B[b], lr);
    if (mom >= 0) fprintf(f, "%.4g", mom);
    if (regime[b] != ST_REGIME_NONE)
      fprintf(f, " | %.2f | %s | %lld |\n", ratio[b], regime_name(regime[b]),
              budget);
    else
      fprintf(f, " | | | %lld |\n", budget);
  }
  fprintf(f,
          "\nRule: between consecutive batch sizes that reached the target, "
          "the ratio of their steps is taken per doubling of the batch, r = "
          "(steps(B2) / steps(B1))^(1 / log2(B2 / B1)). r <= %.1f is perfect "
          "scaling, r >= %.1f is maximal data parallelism, in between "
          "diminishing returns.\n\n",
          ST_SWEEP_PERFECT, ST_SWEEP_MAXIMAL);
  int idx[ST_MAX_LIST];
  int n = reached(o, bs, idx);
  if (n < 2) {
    fprintf(f, "Fewer than two batch sizes reached the target: no regimes "
               "to name. Raise --budget-steps or ease --target.\n");
  } else {
    int end_perfect = sc.end_perfect, start_maximal = sc.start_maximal;
    if (end_perfect == idx[n - 1])
      fprintf(f,
              "Steps halve with every doubling measured: perfect scaling "
              "up to batch %d, the largest that reached the target.\n",
              B[idx[n - 1]]);
    else if (end_perfect == idx[0])
      fprintf(f,
              "Steps stop halving at once: already from batch %d, the "
              "smallest measured, doubling the batch no longer halves the "
              "steps.\n",
              B[end_perfect]);
    else
      fprintf(f,
              "Perfect scaling up to batch %d; beyond it steps stop "
              "halving.\n",
              B[end_perfect]);
    if (start_maximal >= 0)
      fprintf(f,
              "Maximal data parallelism from batch %d: larger batches "
              "save (almost) no steps.\n",
              B[start_maximal]);
    else
      fprintf(f, "No maximal data parallelism within the batch sizes "
                 "measured.\n");
    /* Noisy step counts make single spans jump between regimes; then the
     * statements above rest on one span each, and the fit is the better
     * reading. */
    int order = 1, seen = ST_REGIME_PERFECT;
    for (int b = 0; b < o->batch_sizes.n; b++) {
      if (regime[b] == ST_REGIME_NONE) continue;
      order &= regime[b] >= seen;
      if (regime[b] > seen) seen = regime[b];
    }
    if (!order)
      fprintf(f, "\nThe spans' regimes are out of order (a span scales better "
                 "than one at smaller batch sizes): the step counts are noisy "
                 "at this number of trials, and each statement above rests on "
                 "one span. The fit below uses every batch size at once.\n");
    if (o->eval_growth > 1)
      fprintf(f,
              "\nSteps are known to within the evaluation schedule (a "
              "factor %g, or %d step%s), so ratios are coarse by as much.\n",
              o->eval_growth, o->eval_every, o->eval_every == 1 ? "" : "s");
    else
      fprintf(f,
              "\nSteps are known to within the evaluation interval (%d "
              "steps), so ratios between small step counts are coarse.\n",
              o->eval_every);
  }
  int missing = 0;
  for (int b = 0; b < o->batch_sizes.n; b++) missing += bs[b].trial < 0;
  if (missing)
    fprintf(f,
            "\n%d batch size%s did not reach the target within %s budget "
            "in any trial and %s left out of the analysis.\n",
            missing, missing == 1 ? "" : "s", missing == 1 ? "its" : "their",
            missing == 1 ? "is" : "are");
  report_critical(f, o, base, bs, sum, sc);
  fprintf(f,
          "\nFiles: sweep.csv (every trial), steps.csv (best per batch "
          "size), steps.svg (log-log plot with the perfect-scaling "
          "line and the fit)%s.\n",
          sum->ns.batch ? ", noise.csv (B_simple along the noise run)" : "");
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* The plot: log2 batch across, log10 steps up; measured points joined, the
 * perfect-scaling line steps(B0) B0 / B dashed, each span between measured
 * points shaded by its regime. */
static int write_svg(const st_sweep_options *o, const best *bs,
                     const summary *sum, st_error *err) {
  char path[ST_PATH_MAX + 32];
  join(path, sizeof path, o->out_dir, "steps.svg");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  const int *B = o->batch_sizes.v;
  int nb = o->batch_sizes.n;
  int idx[ST_MAX_LIST];
  int n = reached(o, bs, idx);
  /* log2 of the batch across, log10 of the steps up */
  double x0 = log2(B[0]), x1 = log2(B[nb - 1]);
  if (x1 - x0 < 1) x0 -= 0.5, x1 += 0.5;
  double smin = 1, smax = 10;
  for (int k = 0; k < n; k++) {
    double s = (double)bs[idx[k]].steps;
    if (k == 0 || s < smin) smin = s;
    if (k == 0 || s > smax) smax = s;
  }
  double y0 = floor(log10(smin)), y1 = ceil(log10(smax));
  if (y1 <= y0) y1 = y0 + 1;
  st_svg_chart c = {f, 800, 480, 80, 250, 50, 60, x0, x1, y0, y1, 0};
  char text[160];
  snprintf(text, sizeof text, "Steps to %s %s %g against batch size",
           metric_name(o),
           o->target.kind == ST_TARGET_ACCURACY ? "\u2265" : "\u2264",
           o->target.value);
  st_svg_chart_begin(&c, text, "batch size (log scale)",
                     "steps to target (log scale)");
  /* the regimes shaded between consecutive reached batch sizes */
  static const char *shade[] = {"#d9f2d9", "#fff2cc", "#f8d7d7"};
  int regime[ST_MAX_LIST];
  regimes_of(o, bs, NULL, regime);
  for (int k = 1; k < n; k++) {
    int a = idx[k - 1], b = idx[k];
    double xa = st_svg_x(&c, log2(B[a])), xb = st_svg_x(&c, log2(B[b]));
    st_svg_rect(f, xa, c.T, xb - xa, c.H - c.T - c.B, shade[regime[b]], NULL);
  }
  for (int b = 0; b < nb; b++) {
    snprintf(text, sizeof text, "%d", B[b]);
    st_svg_grid_x(&c, log2(B[b]), "#ccc", text);
  }
  for (int e = (int)y0; e <= (int)y1; e++)
    for (int m = 1; m <= 5; m += m == 1 ? 1 : 3) {
      double ly = e + log10(m);
      if (ly > y1 + 1e-9) break;
      snprintf(text, sizeof text, "%.0f", pow(10, ly));
      st_svg_grid_y(&c, ly, "#ccc", text);
    }
  const st_svg_pen measured = {"#1f5fbf", "2", NULL},
                   perfect = {"#555", "1.5", "6 4"},
                   fit = {"#2a8a2a", "1.5", "2 3"},
                   crit = {"#2a8a2a", "1.5", NULL},
                   simple = {"#c06000", "1.5", NULL};
  if (n > 0) {
    /* Perfect scaling through the smallest reached batch, clipped to the
     * plot's steps range: log s = log s0 - (log B - log B0) log10 2. */
    int a = idx[0];
    double lb0 = log2(B[a]), ls0 = log10((double)bs[a].steps);
    double lb1 = x1, ls1 = ls0 - (lb1 - lb0) * log10(2.0);
    if (ls1 < y0) ls1 = y0, lb1 = lb0 + (ls0 - y0) / log10(2.0);
    st_svg_line(f, st_svg_x(&c, lb0), st_svg_y(&c, ls0), st_svg_x(&c, lb1),
                st_svg_y(&c, ls1), perfect);
    st_svg_poly_begin(f, measured);
    for (int k = 0; k < n; k++)
      st_svg_poly_point(f, k == 0, st_svg_x(&c, log2(B[idx[k]])),
                        st_svg_y(&c, log10((double)bs[idx[k]].steps)));
    st_svg_poly_end(f);
    for (int k = 0; k < n; k++)
      st_svg_circle(f, st_svg_x(&c, log2(B[idx[k]])),
                    st_svg_y(&c, log10((double)bs[idx[k]].steps)), 4,
                    measured.color);
  }
  if (!isnan(sum->b_crit)) {
    /* The fit S_min (1 + B_crit / B), sampled across the plot and clipped
     * to its steps range. */
    st_svg_poly_begin(f, fit);
    int first = 1;
    for (int k = 0; k <= 64; k++) {
      double lb = x0 + (x1 - x0) * k / 64;
      double ls = log10(sum->s_min * (1 + sum->b_crit / pow(2, lb)));
      if (ls < y0 || ls > y1) continue;
      st_svg_poly_point(f, first, st_svg_x(&c, lb), st_svg_y(&c, ls));
      first = 0;
    }
    st_svg_poly_end(f);
  }
  /* Vertical markers: the fitted B_crit and B_simple at the target. */
  double mark[2] = {sum->b_crit, sum->ns.batch ? sum->ns.b_end : NAN};
  const st_svg_pen mark_pen[2] = {crit, simple};
  for (int m = 0; m < 2; m++) {
    if (!(mark[m] > 0) || log2(mark[m]) < x0 || log2(mark[m]) > x1) continue;
    double x = st_svg_x(&c, log2(mark[m]));
    st_svg_line(f, x, c.T, x, c.H - c.B, mark_pen[m]);
  }
  for (int b = 0; b < nb; b++)
    if (bs[b].trial < 0) st_svg_mark_x(&c, log2(B[b]), "#b00", "\u00d7");
  st_svg_legend(&c, measured, NULL, NULL, "measured (best trial)");
  st_svg_legend(&c, perfect, NULL, NULL, "perfect scaling, steps ~ 1/B");
  for (int g = 0; g < 3; g++)
    st_svg_legend(&c, (st_svg_pen){0}, shade[g], NULL, regime_name(g));
  st_svg_legend(&c, (st_svg_pen){0}, NULL, "#b00", "\u00d7 not reached");
  if (!isnan(sum->b_crit)) {
    st_svg_legend(&c, fit, NULL, NULL, "fit S_min (1 + B_crit/B)");
    snprintf(text, sizeof text, "B_crit = %.0f (fit)", sum->b_crit);
    st_svg_legend(&c, crit, NULL, NULL, text);
  }
  if (sum->ns.batch && sum->ns.b_end > 0) {
    snprintf(text, sizeof text, "B_simple = %.0f (at target)", sum->ns.b_end);
    st_svg_legend(&c, simple, NULL, NULL, text);
  }
  st_svg_chart_end(&c);
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* The trials of one st_sweep_run, shared by its workers. The fields above
 * `lock` are set before the workers start and only read by them; the ones
 * below are touched only under lock. */
typedef struct work {
  const st_sweep_options *o;
  const st_config *base;  /* the sweep's config, for the trial points */
  const st_config *trial; /* the same with train.threads as trials run */
  const int *todo;        /* trials to run, as b * trials + i, increasing */
  int n_todo;
  int n_train; /* training samples, for budget_at */
  pthread_mutex_t lock;
  trial *t;         /* every trial; a running one is not written here */
  const char *kept; /* sweep.csv's rows outside the grid (write_sweep_csv) */
  int next;         /* next entry of todo to hand out */
  int failed_at;    /* the first failed trial in (batch, trial) order, or -1 */
  int failed_rc;    /* its error code */
  st_error error;   /* its message */
} work;

/* Under lock: keeps the error of trial k if it comes before any kept. */
static void keep_error(work *w, int k, int rc, const st_error *err) {
  if (w->failed_at >= 0 && w->failed_at < k) return;
  w->failed_at = k;
  w->failed_rc = rc;
  w->error = *err;
}

/* Under lock: one line for a finished trial. */
static void report_trial(const work *w, int batch, int i, const trial *r) {
  const st_sweep_options *o = w->o;
  double lr, mom;
  st_sweep_point(o, w->base, i, &lr, &mom);
  fprintf(o->progress, "sweep: batch %d trial %d/%d lr %.4g", batch, i + 1,
          o->trials, lr);
  if (mom >= 0) fprintf(o->progress, " momentum %.4g", mom);
  if (r->steps >= 0)
    fprintf(o->progress, ": target at step %lld (%s %.4f)\n",
            (long long)r->steps, metric_name(o), r->metric);
  else if (isnan(r->metric))
    fprintf(o->progress, ": diverged\n");
  else
    fprintf(o->progress, ": not reached (%s %.4f at step %lld)\n",
            metric_name(o), r->metric,
            (long long)budget_at(o, w->n_train, batch));
  fflush(o->progress);
}

/* A worker: takes the next trial to run until none is left or one has
 * failed, runs it outside the lock, then records it under the lock and
 * rewrites sweep.csv, so the file always holds exactly the finished
 * trials. Trials already running when another fails still finish and are
 * recorded (a resumed sweep then need not run them again). */
static void *worker(void *arg) {
  work *w = arg;
  const st_sweep_options *o = w->o;
  for (;;) {
    pthread_mutex_lock(&w->lock);
    if (w->failed_at >= 0 || w->next == w->n_todo) {
      pthread_mutex_unlock(&w->lock);
      return NULL;
    }
    int k = w->todo[w->next++];
    pthread_mutex_unlock(&w->lock);

    int b = k / o->trials, i = k % o->trials, batch = o->batch_sizes.v[b];
    trial r;
    st_error err = {0};
    int rc = run_trial(o, w->trial, w->n_train, batch, i, &r, &err);
    if (rc) {
      char msg[sizeof err.msg];
      snprintf(msg, sizeof msg, "%s", err.msg);
      st_error_set(&err, rc, "sweep: batch %d, trial %d: %s", batch, i, msg);
    }
    pthread_mutex_lock(&w->lock);
    if (!rc) {
      w->t[k] = r;
      rc = write_sweep_csv(o, w->base, w->t, w->kept, &err);
      if (!rc && o->progress) report_trial(w, batch, i, &r);
    }
    if (rc) keep_error(w, k, rc, &err);
    pthread_mutex_unlock(&w->lock);
  }
}

/* Runs the trials not yet done with up to o->jobs workers: the calling
 * thread and jobs - 1 pthreads. A pthread that cannot be started only
 * means fewer workers. Returns the first error in (batch, trial) order. */
static int run_trials(const st_sweep_options *o, const st_config *base,
                      int n_train, trial *t, const char *kept, st_error *err) {
  int n = o->batch_sizes.n * o->trials, n_todo = 0;
  int *todo = malloc((size_t)n * sizeof *todo);
  if (!todo) return st_error_set(err, ST_ENOMEM, "sweep: out of memory");
  for (int k = 0; k < n; k++)
    if (!t[k].done) todo[n_todo++] = k;
  int jobs = o->jobs < n_todo ? o->jobs : n_todo;
  /* Trials sharing the machine get a core each; a train.threads the user
   * set is kept (then jobs x threads cores are busy). None pins: each
   * would pin its threads to the same first cpus (as experiment.c). */
  st_config trial_config = *base;
  if (jobs > 1 && base->train.threads == 0) trial_config.train.threads = 1;
  if (jobs > 1) trial_config.execution.pin = 0;
  work w = {.o = o,
            .base = base,
            .trial = &trial_config,
            .todo = todo,
            .n_todo = n_todo,
            .n_train = n_train,
            .lock = PTHREAD_MUTEX_INITIALIZER,
            .t = t,
            .kept = kept,
            .failed_at = -1};
  st_run_workers(jobs, worker, &w);
  free(todo);
  pthread_mutex_destroy(&w.lock);
  if (w.failed_at < 0) return 0;
  if (err) *err = w.error;
  return w.failed_rc;
}

/* DIR/sweep.key: everything that decides a trial's result besides its
 * batch size and point — the target, budget, evaluation schedule, search
 * range and the config's keys that differ from their defaults (threads,
 * progress, logging and checkpoints aside, which do not change results). A
 * sweep resuming from DIR/sweep.csv must have the same key; the file is written
 * before any trial runs. */
static int sweep_key(const st_sweep_options *o, const st_config *base,
                     char **text, size_t *len, st_error *err) {
  FILE *f = open_memstream(text, len);
  if (!f) return st_error_set(err, ST_ENOMEM, "sweep: out of memory");
  /* The keys every trial sets itself (batch, budget, its point) and those
   * that do not change results (threads, progress, logging, checkpoints)
   * are left at their
   * defaults, so they never make two sweeps differ. */
  st_config c = *base, d;
  st_config_defaults(&d);
  c.train.threads = d.train.threads;
  c.train.batch = d.train.batch;
  c.train.steps = d.train.steps;
  c.train.epochs = d.train.epochs;
  c.optimizer.lr = d.optimizer.lr;
  if (has_momentum(base)) c.optimizer.momentum = d.optimizer.momentum;
  snprintf(c.metrics.progress, sizeof c.metrics.progress, "%s",
           d.metrics.progress);
  /* what is logged and saved, and when, and how long a rank waits, change
   * no trial's numbers */
  c.metrics.log_every = d.metrics.log_every;
  c.train.checkpoint_every = d.train.checkpoint_every;
  c.train.keep_checkpoints = d.train.keep_checkpoints;
  c.execution.rank_timeout = d.execution.rank_timeout;
  fprintf(f, "# strata sweep: what decides a trial's result; a sweep that "
             "resumes from sweep.csv must match\n");
  fprintf(f, "target: %s %s %.9g\n", metric_name(o),
          o->target.kind == ST_TARGET_ACCURACY ? ">=" : "<=", o->target.value);
  fprintf(f, "budget_steps: %lld\nbudget_epochs: %.9g\n",
          (long long)o->budget_steps, o->budget_epochs);
  fprintf(f, "eval_every: %d\neval_growth: %.9g\n", o->eval_every,
          o->eval_growth > 1 ? o->eval_growth : 1);
  fprintf(f, "lr_range: %.9g,%.9g\n", o->lr_min, o->lr_max);
  /* The config's keys that differ from the defaults, as section.key:
   * value — so a strata with more keys (at their defaults) resumes it. */
  char *ct = NULL, *dt = NULL;
  size_t cn = 0, dn = 0;
  FILE *cf = open_memstream(&ct, &cn), *df = open_memstream(&dt, &dn);
  int ok = cf && df;
  if (cf) st_config_write(&c, cf), ok &= fclose(cf) == 0;
  if (df) st_config_write(&d, df), ok &= fclose(df) == 0;
  char section[64] = "";
  for (char *a = ok ? ct : NULL, *b = dt; a && *a && b && *b;) {
    char *ae = strchr(a, '\n'), *be = strchr(b, '\n');
    size_t al = ae ? (size_t)(ae - a) : strlen(a),
           bl = be ? (size_t)(be - b) : strlen(b);
    if (al > 1 && a[0] != ' ' && a[0] != '#' && a[al - 1] == ':')
      snprintf(section, sizeof section, "%.*s", (int)(al - 1), a);
    else if (a[0] == ' ' && (al != bl || memcmp(a, b, al) != 0))
      fprintf(f, "%s.%.*s\n", section, (int)(al - 2), a + 2);
    a = ae ? ae + 1 : a + al;
    b = be ? be + 1 : b + bl;
  }
  free(ct);
  free(dt);
  if (fclose(f) != 0 || !ok) {
    free(*text);
    return st_error_set(err, ST_ENOMEM, "sweep: out of memory");
  }
  return 0;
}

/* Refuses to resume a sweep.csv another sweep wrote (its sweep.key differs;
 * the first differing line is named), then writes this sweep's key. A
 * sweep.csv without a key (strata before keys) is resumed unchecked. */
static int check_key(const st_sweep_options *o, const st_config *base,
                     st_error *err) {
  char *key;
  size_t len;
  int rc = sweep_key(o, base, &key, &len, err);
  if (rc) return rc;
  char csv[ST_PATH_MAX + 32], path[ST_PATH_MAX + 32];
  join(csv, sizeof csv, o->out_dir, "sweep.csv");
  join(path, sizeof path, o->out_dir, "sweep.key");
  FILE *f = access(csv, F_OK) == 0 ? fopen(path, "r") : NULL;
  if (f) {
    char line[1024];
    const char *want = key;
    for (int lineno = 1;; lineno++) {
      const char *eol = strchr(want, '\n');
      size_t n = eol ? (size_t)(eol - want) : strlen(want);
      int got = fgets(line, sizeof line, f) != NULL;
      if (got) line[strcspn(line, "\n")] = 0;
      if (!got && !*want) break;
      if (!got || strlen(line) != n || strncmp(line, want, n) != 0) {
        rc =
            st_error_set(err, ST_EFORMAT,
                         "%s was written by another sweep: %s:%d is '%s', "
                         "this sweep's is '%.*s' (use another --out)",
                         csv, path, lineno, got ? line : "(end)", (int)n, want);
        break;
      }
      want = eol ? eol + 1 : want + n;
    }
    fclose(f);
  }
  if (!rc) rc = st_write_file_atomic(path, key, len, err);
  free(key);
  return rc;
}

/* The training samples one epoch of this config passes over (the largest
 * batch's bound, --budget-epochs): a trainer is made to load the data and
 * asked. */
static int train_size(const st_sweep_options *o, const st_config *base, int *n,
                      st_error *err) {
  st_config c = *base;
  c.train.steps = 1;
  c.train.batch = o->batch_sizes.v[0]; /* the base's may be too large */
  c.execution.pin = 0;                 /* it never steps */
  snprintf(c.metrics.progress, sizeof c.metrics.progress, "off");
  st_trainer *t;
  int rc = own_store(o, &c, "size.store", err);
  if (!rc) rc = st_trainer_create(&t, &c, NULL, err);
  if (!rc) {
    *n = st_trainer_train_size(t);
    st_trainer_destroy(t);
  }
  drop_store(&c);
  return rc;
}

int st_sweep_run(const st_sweep_options *o, const st_config *base,
                 st_error *err) {
  int rc = check_options(o, err);
  if (rc) return rc;
  if ((rc = st_mkdir_p(o->out_dir, 1, err))) return rc;
  int nb = o->batch_sizes.n;
  trial *t = calloc((size_t)nb * o->trials, sizeof *t);
  best *bs = calloc((size_t)nb, sizeof *bs);
  char *kept = NULL;
  if (!t || !bs) {
    rc = st_error_set(err, ST_ENOMEM, "sweep: out of memory");
    goto done;
  }
  if ((rc = check_key(o, base, err))) goto done;
  summary sum = {
      0, NAN, NAN, NAN, {0, 0, NAN, NAN, NAN, 0, {NULL, NULL, NULL}}};
  /* every batch size checked against the data before any trial: the
   * largest used to fail only when the sweep reached it */
  if ((rc = train_size(o, base, &sum.n_train, err))) goto done;
  if (o->batch_sizes.v[nb - 1] > sum.n_train) {
    rc = st_error_set(err, ST_EARG,
                      "sweep: --batch-sizes: %d is larger than the %d "
                      "training %s",
                      o->batch_sizes.v[nb - 1], sum.n_train,
                      !strcmp(base->model.kind, "gpt") ? "sequences"
                                                       : "samples");
    goto done;
  }
  if (o->noise_batch && (rc = check_noise(o, base, sum.n_train, err)))
    goto done;
  int reused;
  if ((rc = read_sweep_csv(o, base, t, &reused, &kept, err))) goto done;
  if (o->progress && reused)
    fprintf(o->progress, "sweep: %d trial%s reused from %s/sweep.csv\n", reused,
            reused == 1 ? "" : "s", o->out_dir);
  if ((rc = run_trials(o, base, sum.n_train, t, kept, err))) goto done;
  /* Rewritten even when every trial was reused: the same rows, in order. */
  if ((rc = write_sweep_csv(o, base, t, kept, err))) goto done;
  int64_t steps[ST_MAX_LIST];
  for (int b = 0; b < nb; b++) {
    bs[b] = best_of(o, t, b);
    steps[b] = bs[b].trial >= 0 ? bs[b].steps : -1;
  }
  sum.b_crit =
      st_sweep_fit(o->batch_sizes.v, steps, nb, &sum.s_min, &sum.e_min);
  /* A failed noise run (the trials stand) still leaves the other files,
   * the report saying it was not measured; its error is returned. */
  int noise_rc = 0;
  st_error noise_err = {0};
  if (o->noise_batch &&
      (noise_rc = run_noise(o, base, sum.n_train, bs, &sum.ns, &noise_err)))
    sum.ns = (noise){0, 0, NAN, NAN, NAN, 1, {NULL, NULL, NULL}};
  if (!o->noise_batch) { /* an earlier run's, which this report lacks */
    char noise_csv[ST_PATH_MAX + 32];
    join(noise_csv, sizeof noise_csv, o->out_dir, "noise.csv");
    unlink(noise_csv);
  }
  if ((rc = write_steps_csv(o, base, bs, err))) goto done;
  if ((rc = write_svg(o, bs, &sum, err))) goto done;
  if ((rc = write_report(o, base, bs, &sum, err))) goto done;
  if (noise_rc) {
    rc = noise_rc;
    *err = noise_err;
  }
done:
  free(t);
  free(bs);
  free(kept);
  return rc;
}
