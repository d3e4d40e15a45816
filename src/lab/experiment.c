/*
 * experiment.c — `strata experiment pb`: does pipelined backprop train as
 * well as the sequential mode it replaces, and which mitigation of its
 * delayed, mismatched gradients (BACKGROUND.md 2; Kosson et al., MLSys
 * 2021) closes the gap?
 *
 * One config, seven variants (st_experiment_pb_config): the config's
 * recipe run sequentially at its batch B, and pipelined_backprop under
 * each mitigation. Every PB variant keeps train.batch = B, so a trainer
 * step hands the pipeline B micro-batches of one sample: the step count,
 * the lr schedule and the samples seen are the baseline's, and the
 * recipe tuned at B is moved to the micro-batch by
 * optimizer.reference_batch = B (st_optim_scale_batch). A config whose
 * optimizer.reference_batch R names another batch was tuned at R: every
 * variant, the baseline included, moves it from R. Each variant runs
 * for o->seeds seeds; each run evaluates the test set at o->points evenly
 * spaced steps, the last at the final step.
 *
 * Runs are independent st_trainers (no output folder, no progress) run in
 * parallel like sweep.c's trials: o->jobs workers (the calling thread and
 * jobs - 1 pthreads) take runs in (variant, seed) order from one
 * mutex-guarded index. A run's numbers depend only on its config (the
 * trainer is bitwise independent of its thread count, and emulated
 * pipelined backprop of the threaded one), and the files are written at
 * the end from the results in (variant, seed) order, so no number in them
 * but the measured speeds depends on jobs or on the order runs finish in.
 *
 * Files in out_dir: results.csv (a row per run), results.md (settings and
 * the comparison table), curves.svg (mean test accuracy against samples).
 */
#include "strata.h"

#include "../compile/compile.h"
#include "../io/svg.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *const variants[ST_EXPERIMENT_PB_VARIANTS] = {
    "baseline", "none", "stash", "sc", "lwp", "sc+lwp", "pipemare"};

/* One run's results. curve holds (samples seen, test accuracy) at each
 * evaluation point; accuracy is NaN at the points after a divergence. */
typedef struct run {
  int64_t steps;        /* the run's total steps */
  int64_t diverged_at;  /* step whose training loss, or test loss after
                           it, was non-finite; 0: none */
  double accuracy;      /* test accuracy at the last point; NaN: diverged */
  double final_loss;    /* mean step loss over the last 10% of steps */
  double samples_per_s; /* samples / seconds inside st_trainer_step */
  double seconds;       /* the whole run: create, steps, evaluations */
  int points;
  double *curve; /* (points, 2), malloc'd */
  /* what the trainer ran, for results.md */
  int blocks, stages, micro_batch, emulated;
  float lr, momentum;
} run;

const char *st_experiment_pb_variant(int k) {
  return k >= 0 && k < ST_EXPERIMENT_PB_VARIANTS ? variants[k] : NULL;
}

static int check_options(const st_experiment_options *o, st_error *err) {
  if (o->seeds < 1)
    return st_error_set(err, ST_EARG, "experiment pb: seeds = %d must be >= 1",
                        o->seeds);
  if (o->points < 1)
    return st_error_set(err, ST_EARG, "experiment pb: points = %d must be >= 1",
                        o->points);
  if (o->jobs < 1)
    return st_error_set(err, ST_EARG,
                        "experiment pb: jobs = %d must be >= 1 (runs at once)",
                        o->jobs);
  if (!o->out_dir[0])
    return st_error_set(err, ST_EARG, "experiment pb: no output directory");
  if (o->n_depths < 0 || o->n_depths > ST_EXPERIMENT_MAX_DEPTHS)
    return st_error_set(err, ST_EARG, "experiment pb: %d depths; at most %d",
                        o->n_depths, ST_EXPERIMENT_MAX_DEPTHS);
  for (int d = 0; d < o->n_depths; d++)
    if (o->depths[d] < 2 || (d && o->depths[d] <= o->depths[d - 1]))
      return st_error_set(err, ST_EARG,
                          "experiment pb: --depths: %d; each a stage count "
                          ">= 2, in rising order",
                          o->depths[d]);
  return 0;
}

/* The batch base's SGD recipe was tuned at: its optimizer.reference_batch
 * where it sets one, else its train.batch B. */
static int tuned_batch(const st_config *base) {
  return base->optimizer.reference_batch > 0 ? base->optimizer.reference_batch
                                             : base->train.batch;
}

/* Puts "experiment pb: variant V, seed S: " before err's message. */
static int name_run(st_error *err, int rc, const char *label, uint64_t seed) {
  if (!err) return rc;
  char msg[sizeof err->msg];
  snprintf(msg, sizeof msg, "%s", err->msg);
  return st_error_set(err, rc, "experiment pb: variant %s, seed %llu: %s",
                      label, (unsigned long long)seed, msg);
}

int st_experiment_pb_config(st_config *out, const st_config *base,
                            const st_experiment_options *o, int variant,
                            int seed, st_error *err) {
  if (!st_experiment_pb_variant(variant))
    return st_error_set(err, ST_EARG, "experiment pb: no variant %d (0..%d)",
                        variant, ST_EXPERIMENT_PB_VARIANTS - 1);
  st_config c = *base;
  c.train.seed = base->train.seed + (uint64_t)seed;
  c.execution.replicas = 1;
  c.metrics.noise_scale = 0;
  snprintf(c.metrics.progress, sizeof c.metrics.progress, "off");
  /* Runs sharing the machine get a core each (a train.threads the user set
   * is kept), and none pins: they would all pin to the same first cores. */
  if (o->jobs > 1) {
    if (c.train.threads == 0) c.train.threads = 1;
    c.execution.pin = 0;
  }
  /* the batch the recipe was tuned at: the config's reference_batch where
   * it sets one (the baseline then moves the recipe to train.batch, as
   * `strata train` would), else train.batch (the baseline runs it as given) */
  int tuned = tuned_batch(base);
  if (variant == 0) {
    snprintf(c.execution.mode, sizeof c.execution.mode, "sequential");
    c.execution.micro_batch = 0;
    c.execution.emulate = 0;
    c.execution.stage_blocks.n = 0; /* a pipelined mode's */
    c.optimizer.reference_batch = tuned != base->train.batch ? tuned : 0;
  } else {
    /* reference_batch would refuse it too, but naming its own key */
    if (strcmp(c.optimizer.kind, "sgd") != 0) {
      st_error_set(err, ST_ECONFIG,
                   "%s: optimizer.kind: %s, but the pipelined_backprop "
                   "variants move an SGD recipe tuned at train.batch to the "
                   "micro-batch (optimizer.reference_batch); use sgd",
                   st_config_where(base, "optimizer.kind"), c.optimizer.kind);
      return name_run(err, ST_ECONFIG, variants[variant], c.train.seed);
    }
    snprintf(c.execution.mode, sizeof c.execution.mode, "pipelined_backprop");
    snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "%s",
             variants[variant]);
    c.optimizer.nesterov = 0;
    c.optimizer.reference_batch = tuned;
    if (c.execution.stages == 0 && c.execution.stage_blocks.n == 0)
      c.execution.stages = ST_STAGES_PER_BLOCK;
    /* More stages than threads would time-share the cores: one thread
     * running every stage tick by tick does the same work, bit for bit. */
    int threads =
        c.train.threads > 0 ? c.train.threads : st_usable_cpus(NULL, 0);
    int S = c.execution.stage_blocks.n ? c.execution.stage_blocks.n
                                       : c.execution.stages;
    if (S == ST_STAGES_PER_BLOCK || S > threads) c.execution.emulate = 1;
  }
  int rc = st_config_validate(&c, err);
  if (rc) return name_run(err, rc, variants[variant], c.train.seed);
  *out = c;
  return 0;
}

/* Step of evaluation point i of n over total steps: evenly spaced, the
 * last at total (n <= total, so no two coincide). */
static int64_t point_step(int i, int n, int64_t total) {
  return (int64_t)(i + 1) * total / n;
}

/* One run from scratch. A non-finite training loss, or test loss, ends it
 * as diverged; any other error is returned. */
static int run_one(const st_config *c, int points, run *r, st_error *err) {
  double t0 = st_now();
  *r = (run){.accuracy = NAN, .final_loss = NAN};
  st_trainer *t;
  int rc = st_trainer_create(&t, c, NULL, err);
  if (rc) return rc;
  const st_config *used = st_trainer_config(t);
  r->blocks = st_trainer_model(t)->n_blocks;
  r->stages = st_trainer_stages(t);
  /* execution.micro_batch 0: one sample in pipelined_backprop, else all */
  int pb = !strcmp(c->execution.mode, "pipelined_backprop");
  r->micro_batch = c->execution.micro_batch ? c->execution.micro_batch
                   : pb                     ? 1
                                            : c->train.batch;
  r->emulated = c->execution.emulate;
  r->lr = used->optimizer.lr;
  r->momentum = used->optimizer.momentum;
  r->steps = st_trainer_total_steps(t);
  if (r->steps < 1) {
    st_trainer_destroy(t);
    return st_error_set(err, ST_ECONFIG,
                        "train.steps and train.epochs give no step to train");
  }
  r->points = points < r->steps ? points : (int)r->steps;
  r->curve = malloc((size_t)r->points * 2 * sizeof *r->curve);
  if (!r->curve) {
    st_trainer_destroy(t);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  for (int i = 0; i < r->points; i++) {
    r->curve[2 * i] =
        (double)point_step(i, r->points, r->steps) * c->train.batch;
    r->curve[2 * i + 1] = NAN;
  }
  /* the final loss window: the last 10% of steps, at least one */
  int64_t tail = (r->steps + 9) / 10;
  double step_s = 0, tail_sum = 0;
  int next = 0;
  for (int64_t step = 1; step <= r->steps; step++) {
    double loss, s0 = st_now();
    /* the next step may start early unless this one is evaluated after */
    int ahead =
        step < r->steps && step != point_step(next, r->points, r->steps);
    rc = st_trainer_step_ahead(t, ahead, &loss, err);
    step_s += st_now() - s0;
    if (rc == ST_ENONFINITE) {
      rc = 0;
      r->diverged_at = step;
      break;
    }
    if (rc) break;
    if (step > r->steps - tail) tail_sum += loss;
    if (step != point_step(next, r->points, r->steps)) continue;
    double test_loss, acc;
    if ((rc = st_trainer_evaluate(t, &test_loss, &acc, err))) break;
    /* an update after the last checked training loss left the weights
     * non-finite (strata train stops there too): the accuracy NaN logits
     * score is no result */
    if (!isfinite(test_loss)) {
      r->diverged_at = step;
      break;
    }
    r->curve[2 * next] = (double)st_trainer_pos(t)->samples;
    r->curve[2 * next + 1] = acc;
    next++;
  }
  if (!rc && !r->diverged_at) {
    r->accuracy = r->points ? r->curve[2 * (r->points - 1) + 1] : NAN;
    r->final_loss = tail ? tail_sum / (double)tail : NAN;
  }
  r->samples_per_s =
      step_s > 0 ? (double)st_trainer_pos(t)->samples / step_s : 0;
  st_trainer_destroy(t);
  r->seconds = st_now() - t0;
  return rc;
}

/* The runs of one st_experiment_pb, shared by its workers. The fields
 * above `lock` are set before the workers start and only read by them;
 * the ones below are touched only under lock. */
typedef struct work {
  const st_experiment_options *o;
  const st_config *configs;  /* per variant, seed offset 0 */
  const char *const *labels; /* per variant, for the log and errors */
  int n_runs; /* variants x seeds, run k = variant * seeds + seed */
  pthread_mutex_t lock;
  run *runs;      /* every run; a running one is not written here */
  int next;       /* next run to hand out */
  int finished;   /* runs finished so far, for the log */
  int failed_at;  /* the first failed run in (variant, seed) order, or -1 */
  int failed_rc;  /* its error code */
  st_error error; /* its message */
} work;

/* Under lock: one line for a finished run. */
static void log_run(work *w, int variant, uint64_t seed, const run *r) {
  FILE *f = w->o->log;
  fprintf(f, "strata: experiment: [%d/%d] %s seed %llu: ", ++w->finished,
          w->n_runs, w->labels[variant], (unsigned long long)seed);
  if (r->diverged_at)
    fprintf(f, "diverged at step %lld of %lld", (long long)r->diverged_at,
            (long long)r->steps);
  else
    fprintf(f, "test accuracy %.4f, final train loss %.3f", r->accuracy,
            r->final_loss);
  fprintf(f, ", %.0f samples/s (%.1f s)\n", r->samples_per_s, r->seconds);
  fflush(f);
}

/* A worker: takes the next run until none is left or one has failed, runs
 * it outside the lock, records it under the lock. */
static void *worker(void *arg) {
  work *w = arg;
  const int seeds = w->o->seeds;
  for (;;) {
    pthread_mutex_lock(&w->lock);
    if (w->failed_at >= 0 || w->next == w->n_runs) {
      pthread_mutex_unlock(&w->lock);
      return NULL;
    }
    int k = w->next++;
    pthread_mutex_unlock(&w->lock);

    int variant = k / seeds;
    st_config c = w->configs[variant];
    c.train.seed += (uint64_t)(k % seeds);
    run r;
    st_error err = {0};
    int rc = run_one(&c, w->o->points, &r, &err);
    if (rc) {
      free(r.curve);
      name_run(&err, rc, w->labels[variant], c.train.seed);
    }
    pthread_mutex_lock(&w->lock);
    if (rc && (w->failed_at < 0 || k < w->failed_at)) {
      w->failed_at = k;
      w->failed_rc = rc;
      w->error = err;
    } else if (!rc) {
      w->runs[k] = r;
      if (w->o->log) log_run(w, variant, c.train.seed, &r);
    }
    pthread_mutex_unlock(&w->lock);
  }
}

/* Runs every run of n_configs configs with up to o->jobs workers: the
 * calling thread and jobs - 1 pthreads (one that cannot start only means
 * fewer workers). Returns the first error in (variant, seed) order. */
static int run_all(const st_experiment_options *o, const st_config *configs,
                   const char *const *labels, int n_configs, run *runs,
                   st_error *err) {
  int n = n_configs * o->seeds;
  int jobs = o->jobs < n ? o->jobs : n;
  work w = {.o = o,
            .configs = configs,
            .labels = labels,
            .n_runs = n,
            .lock = PTHREAD_MUTEX_INITIALIZER,
            .runs = runs,
            .failed_at = -1};
  st_run_workers(jobs, worker, &w);
  pthread_mutex_destroy(&w.lock);
  if (w.failed_at < 0) return 0;
  if (err) *err = w.error;
  return w.failed_rc;
}

/* A variant over its seeds: the finite final accuracies' mean and sample
 * standard deviation, the mean final loss of the runs that did not
 * diverge, the mean speed of all. */
typedef struct summary {
  int ok, diverged;
  double acc_mean, acc_std, loss_mean, speed_mean;
} summary;

static summary summarize(const st_experiment_options *o, const run *runs,
                         int variant) {
  summary s = {0};
  const run *v = runs + (size_t)variant * o->seeds;
  double acc = 0, loss = 0, speed = 0;
  for (int i = 0; i < o->seeds; i++) {
    speed += v[i].samples_per_s;
    if (v[i].diverged_at) {
      s.diverged++;
      continue;
    }
    s.ok++;
    acc += v[i].accuracy;
    loss += v[i].final_loss;
  }
  s.speed_mean = speed / o->seeds;
  s.acc_mean = s.ok ? acc / s.ok : NAN;
  s.loss_mean = s.ok ? loss / s.ok : NAN;
  double ss = 0;
  for (int i = 0; i < o->seeds; i++)
    if (!v[i].diverged_at)
      ss += (v[i].accuracy - s.acc_mean) * (v[i].accuracy - s.acc_mean);
  s.acc_std = s.ok > 1 ? sqrt(ss / (s.ok - 1)) : NAN;
  return s;
}

/* Whether variant s's mean accuracy differs from the baseline's (s0) by
 * more than the seed-to-seed spread: |difference of means| above the
 * larger of the two sample standard deviations. "—" without two finished
 * runs on each side. */
static const char *beyond_spread(const summary *s, const summary *s0) {
  if (s->ok < 2 || s0->ok < 2) return "—";
  double spread = s->acc_std > s0->acc_std ? s->acc_std : s0->acc_std;
  return fabs(s->acc_mean - s0->acc_mean) > spread ? "yes" : "no";
}

/* Opens a memory stream for DIR/name; path gets the file's path. */
static FILE *open_text(char *path, size_t cap, const char *dir,
                       const char *name, char **buf, size_t *len,
                       st_error *err) {
  snprintf(path, cap, "%s/%s", dir, name);
  *buf = NULL;
  *len = 0;
  FILE *f = open_memstream(buf, len);
  if (!f) st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  return f;
}

static int write_csv(const st_experiment_options *o, const st_config *base,
                     const run *runs, st_error *err) {
  char path[ST_PATH_MAX + 32], *buf;
  size_t len;
  FILE *f =
      open_text(path, sizeof path, o->out_dir, "results.csv", &buf, &len, err);
  if (!f) return ST_ENOMEM;
  fprintf(f, "variant,seed,test_accuracy,final_train_loss,samples_per_s,"
             "seconds\n");
  for (int v = 0; v < ST_EXPERIMENT_PB_VARIANTS; v++)
    for (int i = 0; i < o->seeds; i++) {
      const run *r = &runs[v * o->seeds + i];
      /* "nan" for a diverged run: what CSV readers take as missing */
      fprintf(f, "%s,%llu,%.9g,%.9g,%.1f,%.3f\n", variants[v],
              (unsigned long long)(base->train.seed + (uint64_t)i), r->accuracy,
              r->final_loss, r->samples_per_s, r->seconds);
    }
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* "85.12 ± 0.31" in percent; the spread needs two runs. */
static void put_accuracy(FILE *f, const summary *s) {
  if (!s->ok) {
    fprintf(f, "diverged");
    return;
  }
  fprintf(f, "%.2f", 100 * s->acc_mean);
  if (s->ok > 1) fprintf(f, " ± %.2f", 100 * s->acc_std);
  if (s->diverged)
    fprintf(f, " (%d of %d diverged)", s->diverged, s->ok + s->diverged);
}

static int write_report(const st_experiment_options *o, const st_config *base,
                        const st_config *configs, const run *runs,
                        st_error *err) {
  char path[ST_PATH_MAX + 32], *buf;
  size_t len;
  FILE *f =
      open_text(path, sizeof path, o->out_dir, "results.md", &buf, &len, err);
  if (!f) return ST_ENOMEM;
  const run *seq = &runs[0], *pb = &runs[o->seeds]; /* first of each */
  const st_config *pc = &configs[1];
  int B = base->train.batch, R = tuned_batch(base);
  fprintf(f, "# Pipelined backprop against sequential training\n\n");
  fprintf(f,
          "Config `%s`: model %s, %d blocks; optimizer sgd, lr %g, momentum "
          "%g%s, schedule %s, ",
          base->path[0] ? base->path : "(none)", base->model.kind, seq->blocks,
          (double)base->optimizer.lr, (double)base->optimizer.momentum,
          base->optimizer.nesterov ? " (Nesterov)" : "",
          base->optimizer.schedule);
  if (R != B)
    fprintf(f,
            "tuned at batch R = %d (optimizer.reference_batch), "
            "train.batch B = %d. ",
            R, B);
  else
    fprintf(f, "tuned at train.batch B = %d. ", B);
  fprintf(f,
          "Every run trains %lld steps of %d samples (%lld samples), "
          "evaluating the test set at %d evenly spaced steps, the last at "
          "the end; %d seed%s (train.seed %llu..%llu).\n\n",
          (long long)seq->steps, B, (long long)seq->steps * B, seq->points,
          o->seeds, o->seeds == 1 ? "" : "s",
          (unsigned long long)base->train.seed,
          (unsigned long long)(base->train.seed + (uint64_t)o->seeds - 1));
  fprintf(f, "- **baseline**: `strata train CONFIG --set "
             "execution.mode=sequential --set execution.micro_batch=0`, ");
  if (R != B)
    fprintf(f,
            "the recipe moved from batch %d to B = %d: lr %g -> %.6g, "
            "momentum %g -> %.6g.\n",
            R, B, (double)base->optimizer.lr, (double)seq->lr,
            (double)base->optimizer.momentum, (double)seq->momentum);
  else
    fprintf(f, "the recipe as given.\n");
  fprintf(f,
          "- **pipelined backprop** (the other rows, M the row's name): "
          "`strata train CONFIG "
          "--set execution.mode=pipelined_backprop --set "
          "execution.mitigation=M --set optimizer.nesterov=false --set "
          "optimizer.reference_batch=%d --set execution.stages=",
          R);
  const st_int_list *pin = &pc->execution.stage_blocks;
  if (pin->n > 0) { /* the pinned cut: execution.stages stays 0 */
    fprintf(f, "0 --set execution.stage_blocks=[");
    for (int i = 0; i < pin->n; i++)
      fprintf(f, "%s%d", i ? "," : "", pin->v[i]);
    fprintf(f, "]");
  } else if (pc->execution.stages == ST_STAGES_PER_BLOCK) {
    fprintf(f, "per_block");
  } else {
    fprintf(f, "%d", pc->execution.stages);
  }
  fprintf(
      f,
      "%s`: %d stages, micro-batches of %d sample%s (%d per step), "
      "%s. Heavy-ball momentum with the recipe moved from batch %d "
      "to the micro-batch (m' = m^(b/%s), lr' = lr (b/%s) (1 - m') / "
      "(1 - m); BACKGROUND.md 2): lr %g -> %.6g, momentum %g -> "
      "%.6g.\n",
      pc->execution.emulate ? " --set execution.emulate=true" : "", pb->stages,
      pb->micro_batch, pb->micro_batch == 1 ? "" : "s", B / pb->micro_batch,
      pb->emulated ? "emulated (one thread runs every stage, tick by "
                     "tick; bit-identical to threaded)"
                   : "one thread per stage",
      R, R != B ? "R" : "B", R != B ? "R" : "B", (double)base->optimizer.lr,
      (double)pb->lr, (double)base->optimizer.momentum, (double)pb->momentum);
  fprintf(f, "- The same `--set` options given to the experiment apply to "
             "every run; run k uses train.seed + k.\n\n");
  fprintf(f, "| variant | test accuracy (%%) | Δ vs baseline (pp) | beyond "
             "the spread | final train loss | samples/s |\n");
  fprintf(f, "|---|---:|---:|:---:|---:|---:|\n");
  summary s0 = summarize(o, runs, 0);
  int any_diverged = 0;
  for (int v = 0; v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    summary s = summarize(o, runs, v);
    any_diverged |= s.diverged > 0;
    fprintf(f, "| %s | ", variants[v]);
    put_accuracy(f, &s);
    fprintf(f, " | ");
    if (v == 0)
      fprintf(f, "—");
    else if (s.ok && s0.ok)
      fprintf(f, "%+.2f", 100 * (s.acc_mean - s0.acc_mean));
    fprintf(f, " | %s | ", v ? beyond_spread(&s, &s0) : "—");
    if (s.ok) fprintf(f, "%.4f", s.loss_mean);
    fprintf(f, " | %.0f |\n", s.speed_mean);
  }
  fprintf(f,
          "\nTest accuracy: at the final step, mean ± sample standard "
          "deviation over seeds; Δ is the difference of the means in "
          "percentage points, beyond the spread when it is larger than "
          "both the baseline's and the variant's standard deviation. Final "
          "train loss: the mean training loss over "
          "the last 10%% of steps, averaged over seeds. samples/s: samples "
          "over the seconds spent inside training steps (evaluation "
          "excluded), averaged over seeds. They were measured with up to %d "
          "run%s sharing the cores at once, and emulated runs run every "
          "stage on one thread, so they compare what the variants cost on "
          "this machine, not a pipeline's speed.\n",
          o->jobs, o->jobs == 1 ? "" : "s");
  if (any_diverged)
    fprintf(f, "\nA diverged run's training loss (or the test loss after "
               "its last updates) turned non-finite; it is "
               "left out of the accuracy and loss columns (results.csv has "
               "nan) and its curve ends there.\n");
  fprintf(f, "\nFiles: results.csv (every run), curves.svg (mean test "
             "accuracy against samples seen, per variant).\n");
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* A tick spacing of 1, 2 or 5 x 10^k giving about `want` ticks over span. */
static double tick_step(double span, int want) {
  double raw = span / want, p = pow(10, floor(log10(raw)));
  double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* A sample count as a tick label: 800, 12k, 1.5M. */
static void count_text(char *buf, size_t cap, double v) {
  if (v >= 1e6)
    snprintf(buf, cap, "%gM", v / 1e6);
  else if (v >= 1e4)
    snprintf(buf, cap, "%gk", v / 1e3);
  else
    snprintf(buf, cap, "%.0f", v);
}

/* Mean test accuracy of a variant at point i over the seeds that have one
 * (NaN when none has). */
static double mean_at(const st_experiment_options *o, const run *runs,
                      int variant, int i, double *x) {
  const run *v = runs + (size_t)variant * o->seeds;
  double sum = 0;
  int n = 0;
  *x = v[0].curve[2 * i];
  for (int k = 0; k < o->seeds; k++)
    if (isfinite(v[k].curve[2 * i + 1])) sum += v[k].curve[2 * i + 1], n++;
  return n ? sum / n : NAN;
}

/* The plot: samples seen across, test accuracy (percent) up, one line per
 * variant through its mean at each evaluation point. */
static int write_svg(const st_experiment_options *o, const run *runs,
                     st_error *err) {
  char path[ST_PATH_MAX + 32], *buf;
  size_t len;
  FILE *f =
      open_text(path, sizeof path, o->out_dir, "curves.svg", &buf, &len, err);
  if (!f) return ST_ENOMEM;
  static const char *color[ST_EXPERIMENT_PB_VARIANTS] = {
      "#000000", "#1f77b4", "#ff7f0e", "#2ca02c",
      "#d62728", "#9467bd", "#e377c2"};
  const int n = runs[0].points;
  double xmax = runs[0].curve[2 * (n - 1)], lo = 1, hi = 0, x;
  for (int v = 0; v < ST_EXPERIMENT_PB_VARIANTS; v++)
    for (int i = 0; i < n; i++) {
      double y = mean_at(o, runs, v, i, &x);
      if (isfinite(y)) lo = y < lo ? y : lo, hi = y > hi ? y : hi;
    }
  if (hi < lo) /* nothing finite */
    lo = 0, hi = 1;
  double y0 = floor(lo * 10) / 10, y1 = ceil(hi * 10) / 10;
  if (y1 - y0 < 0.1) y1 = y0 + 0.1;
  if (xmax <= 0) xmax = 1;
  st_svg_chart c = {f, 800, 480, 80, 190, 50, 60, 0, xmax, y0, y1, 0};
  char text[160];
  snprintf(text, sizeof text,
           "Pipelined backprop against sequential: test accuracy, mean of "
           "%d seed%s",
           o->seeds, o->seeds == 1 ? "" : "s");
  st_svg_chart_begin(&c, text, "samples seen", "test accuracy");
  double dx = tick_step(xmax, 5);
  for (double s = 0; s <= xmax * (1 + 1e-9); s += dx) {
    count_text(text, sizeof text, s);
    st_svg_grid_x(&c, s, "#ddd", text);
  }
  double dy = tick_step(y1 - y0, 5);
  for (double a = y0; a <= y1 + 1e-9; a += dy) {
    snprintf(text, sizeof text, "%g%%", round(a * 1000) / 10);
    st_svg_grid_y(&c, a, "#ddd", text);
  }
  for (int v = 0; v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    /* one polyline per stretch of points that have a mean */
    st_svg_pen pen = {color[v], v ? "1.8" : "2.5", v ? NULL : "7 4"};
    int open = 0;
    for (int i = 0; i < n; i++) {
      double y = mean_at(o, runs, v, i, &x);
      if (!isfinite(y)) {
        if (open) st_svg_poly_end(f);
        open = 0;
        continue;
      }
      if (!open) st_svg_poly_begin(f, pen);
      st_svg_poly_point(f, !open, st_svg_x(&c, x), st_svg_y(&c, y));
      open = 1;
    }
    if (open) st_svg_poly_end(f);
    for (int i = 0; i < n; i++) {
      double y = mean_at(o, runs, v, i, &x);
      if (isfinite(y))
        st_svg_circle(f, st_svg_x(&c, x), st_svg_y(&c, y), 2.5, color[v]);
    }
  }
  for (int v = 0; v < ST_EXPERIMENT_PB_VARIANTS; v++) {
    summary s = summarize(o, runs, v);
    int at = snprintf(text, sizeof text, "%s%s", variants[v],
                      v ? "" : " (sequential)");
    if (s.diverged)
      snprintf(text + at, sizeof text - at, " (%d/%d diverged)", s.diverged,
               o->seeds);
    st_svg_legend(&c,
                  (st_svg_pen){color[v], v ? "1.8" : "2.5", v ? NULL : "7 4"},
                  NULL, NULL, text);
  }
  st_svg_chart_end(&c);
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* ------------------------------------------------------ --depths */

/* The mitigations the depth experiment compares (variant indices: none,
 * sc, lwp, sc+lwp), each at every depth. */
static const int depth_variants[] = {1, 3, 4, 5};
enum { N_DEPTH_VARIANTS = 4 };

/* Config k of the depth experiment: 0 the baseline, then depth d and
 * mitigation j at 1 + d * N_DEPTH_VARIANTS + j. */
static int depth_config(st_config *out, const st_config *base,
                        const st_experiment_options *o, int k, char *label,
                        size_t cap, st_error *err) {
  if (k == 0) {
    snprintf(label, cap, "baseline");
    return st_experiment_pb_config(out, base, o, 0, 0, err);
  }
  int d = (k - 1) / N_DEPTH_VARIANTS;
  int v = depth_variants[(k - 1) % N_DEPTH_VARIANTS], S = o->depths[d];
  snprintf(label, cap, "%s at %d stages", variants[v], S);
  /* the cut at S stages (emulated past the threads, as any variant) */
  st_config c = *base;
  c.execution.stages = S;
  c.execution.stage_blocks.n = 0;
  return st_experiment_pb_config(out, &c, o, v, 0, err);
}

/* The depth experiment's runs: d's mitigation j over the seeds. */
static const run *depth_runs(const st_experiment_options *o, const run *runs,
                             int d, int j) {
  return runs + (size_t)(1 + d * N_DEPTH_VARIANTS + j) * o->seeds;
}

static int write_depth_csv(const st_experiment_options *o,
                           const st_config *base, const run *runs,
                           st_error *err) {
  char path[ST_PATH_MAX + 32], *buf;
  size_t len;
  FILE *f =
      open_text(path, sizeof path, o->out_dir, "depth.csv", &buf, &len, err);
  if (!f) return ST_ENOMEM;
  fprintf(f, "stages,variant,seed,test_accuracy,final_train_loss,"
             "samples_per_s,seconds\n");
  for (int k = 0; k < 1 + o->n_depths * N_DEPTH_VARIANTS; k++)
    for (int i = 0; i < o->seeds; i++) {
      const run *r = &runs[(size_t)k * o->seeds + i];
      /* the stages the run's trainer cut (the baseline: 1) */
      int S = r->stages;
      const char *name =
          k ? variants[depth_variants[(k - 1) % N_DEPTH_VARIANTS]] : "baseline";
      fprintf(f, "%d,%s,%llu,%.9g,%.9g,%.1f,%.3f\n", S, name,
              (unsigned long long)(base->train.seed + (uint64_t)i), r->accuracy,
              r->final_loss, r->samples_per_s, r->seconds);
    }
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

static summary summarize_runs(const st_experiment_options *o, const run *v) {
  /* summarize() reads variant k's runs at runs + k * seeds */
  return summarize(o, v, 0);
}

static int write_depth_report(const st_experiment_options *o,
                              const st_config *base, const run *runs,
                              st_error *err) {
  char path[ST_PATH_MAX + 32], *buf;
  size_t len;
  FILE *f =
      open_text(path, sizeof path, o->out_dir, "depth.md", &buf, &len, err);
  if (!f) return ST_ENOMEM;
  const run *seq = &runs[0];
  int B = base->train.batch, R = tuned_batch(base);
  fprintf(f, "# Pipelined backprop against depth\n\n");
  fprintf(f,
          "Config `%s`: model %s, %d blocks; optimizer sgd, lr %g, momentum "
          "%g, ",
          base->path[0] ? base->path : "(none)", base->model.kind, seq->blocks,
          (double)base->optimizer.lr, (double)base->optimizer.momentum);
  if (R != B)
    fprintf(f,
            "tuned at batch R = %d (optimizer.reference_batch), "
            "train.batch B = %d; ",
            R, B);
  else
    fprintf(f, "tuned at train.batch B = %d; ", B);
  fprintf(f,
          "%lld steps of %d samples per run, %d seed%s. Each row cuts the "
          "model into that many stages (`--set execution.stages=N`), the "
          "rest as in `strata experiment pb` (micro-batch %d, the recipe "
          "moved to it by optimizer.reference_batch = %s). Stage s of S "
          "waits D(s) = 2 (S - 1 - s) updates for its gradient: the deeper "
          "the pipeline, the staler the first stages' gradients.\n\n",
          (long long)seq->steps, B, o->seeds, o->seeds == 1 ? "" : "s",
          depth_runs(o, runs, 0, 0)->micro_batch, R != B ? "R" : "B");
  summary s0 = summarize_runs(o, runs);
  if (R != B)
    fprintf(f,
            "Baseline (sequential at batch %d, the recipe moved from "
            "batch %d): ",
            B, R);
  else
    fprintf(f, "Baseline (sequential at batch %d): ", B);
  put_accuracy(f, &s0);
  fprintf(f, "%s.\n\n| stages |", s0.ok ? "% test accuracy" : "");
  for (int j = 0; j < N_DEPTH_VARIANTS; j++)
    fprintf(f, " %s |", variants[depth_variants[j]]);
  fprintf(f, "\n|---:|");
  for (int j = 0; j < N_DEPTH_VARIANTS; j++) fprintf(f, "---:|");
  fprintf(f, "\n");
  for (int d = 0; d < o->n_depths; d++) {
    fprintf(f, "| %d |", o->depths[d]);
    for (int j = 0; j < N_DEPTH_VARIANTS; j++) {
      summary s = summarize_runs(o, depth_runs(o, runs, d, j));
      fprintf(f, " ");
      put_accuracy(f, &s);
      if (s.ok && s0.ok)
        fprintf(f, " (%+.2f%s)", 100 * (s.acc_mean - s0.acc_mean),
                !strcmp(beyond_spread(&s, &s0), "yes") ? "*" : "");
      fprintf(f, " |");
    }
    fprintf(f, "\n");
  }
  fprintf(f, "\nTest accuracy in percent at the final step, mean ± sample "
             "standard deviation over seeds; in brackets the difference "
             "from the baseline in percentage points, starred where it is "
             "larger than both standard deviations (beyond the seed-to-seed "
             "spread). Files: depth.csv (every run), depth.svg.\n");
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

/* Final accuracy (percent) against stages on a log2 axis, a line per
 * mitigation through its means, the baseline dashed across. */
static int write_depth_svg(const st_experiment_options *o, const run *runs,
                           st_error *err) {
  char path[ST_PATH_MAX + 32], *buf;
  size_t len;
  FILE *f =
      open_text(path, sizeof path, o->out_dir, "depth.svg", &buf, &len, err);
  if (!f) return ST_ENOMEM;
  static const char *color[N_DEPTH_VARIANTS] = {"#1f77b4", "#2ca02c", "#d62728",
                                                "#9467bd"};
  summary s0 = summarize_runs(o, runs);
  double lo = s0.ok ? s0.acc_mean : 1, hi = s0.ok ? s0.acc_mean : 0;
  double x0 = log2(o->depths[0]), x1 = x0;
  for (int d = 0; d < o->n_depths; d++) {
    double x = log2(o->depths[d]);
    x0 = x < x0 ? x : x0, x1 = x > x1 ? x : x1;
    for (int j = 0; j < N_DEPTH_VARIANTS; j++) {
      summary s = summarize_runs(o, depth_runs(o, runs, d, j));
      if (s.ok) {
        lo = s.acc_mean < lo ? s.acc_mean : lo;
        hi = s.acc_mean > hi ? s.acc_mean : hi;
      }
    }
  }
  if (hi < lo) lo = 0, hi = 1;
  double y0 = floor(lo * 20) / 20, y1 = ceil(hi * 20) / 20;
  if (y1 - y0 < 0.05) y1 = y0 + 0.05;
  if (x1 - x0 < 1) x0 -= 0.5, x1 += 0.5;
  double pad = (x1 - x0) * 0.05;
  st_svg_chart c = {f,  800,      480,      80, 190, 50,
                    60, x0 - pad, x1 + pad, y0, y1,  0};
  char text[160];
  snprintf(text, sizeof text,
           "Pipelined backprop against depth: final test accuracy, mean of "
           "%d seed%s",
           o->seeds, o->seeds == 1 ? "" : "s");
  st_svg_chart_begin(&c, text, "pipeline stages", "test accuracy");
  for (int d = 0; d < o->n_depths; d++) {
    snprintf(text, sizeof text, "%d", o->depths[d]);
    st_svg_grid_x(&c, log2(o->depths[d]), "#ddd", text);
  }
  double dy = tick_step(y1 - y0, 5);
  for (double a = y0; a <= y1 + 1e-9; a += dy) {
    snprintf(text, sizeof text, "%g%%", round(a * 1000) / 10);
    st_svg_grid_y(&c, a, "#ddd", text);
  }
  st_svg_pen base_pen = {"#000000", "2.5", "7 4"};
  if (s0.ok)
    st_svg_line(f, st_svg_x(&c, c.x0), st_svg_y(&c, s0.acc_mean),
                st_svg_x(&c, c.x1), st_svg_y(&c, s0.acc_mean), base_pen);
  for (int j = 0; j < N_DEPTH_VARIANTS; j++) {
    st_svg_pen pen = {color[j], "1.8", NULL};
    int open = 0;
    for (int d = 0; d < o->n_depths; d++) {
      summary s = summarize_runs(o, depth_runs(o, runs, d, j));
      if (!s.ok) {
        if (open) st_svg_poly_end(f);
        open = 0;
        continue;
      }
      if (!open) st_svg_poly_begin(f, pen);
      st_svg_poly_point(f, !open, st_svg_x(&c, log2(o->depths[d])),
                        st_svg_y(&c, s.acc_mean));
      open = 1;
    }
    if (open) st_svg_poly_end(f);
    for (int d = 0; d < o->n_depths; d++) {
      summary s = summarize_runs(o, depth_runs(o, runs, d, j));
      if (s.ok)
        st_svg_circle(f, st_svg_x(&c, log2(o->depths[d])),
                      st_svg_y(&c, s.acc_mean), 3, color[j]);
    }
  }
  st_svg_legend(&c, base_pen, NULL, NULL, "baseline (sequential)");
  for (int j = 0; j < N_DEPTH_VARIANTS; j++)
    st_svg_legend(&c, (st_svg_pen){color[j], "1.8", NULL}, NULL, NULL,
                  variants[depth_variants[j]]);
  st_svg_chart_end(&c);
  return st_write_stream_atomic(f, &buf, &len, path, err);
}

static int depth_experiment(const st_experiment_options *o,
                            const st_config *base, st_error *err) {
  const int n = 1 + o->n_depths * N_DEPTH_VARIANTS;
  st_config *configs = malloc((size_t)n * sizeof *configs);
  char(*label)[48] = malloc((size_t)n * sizeof *label);
  const char **labels = malloc((size_t)n * sizeof *labels);
  run *runs = calloc((size_t)n * o->seeds, sizeof *runs);
  int rc = 0;
  if (!configs || !label || !labels || !runs) {
    rc = st_error_set(err, ST_ENOMEM, "experiment pb: out of memory");
    goto done;
  }
  for (int k = 0; !rc && k < n; k++) {
    rc = depth_config(&configs[k], base, o, k, label[k], sizeof label[k], err);
    labels[k] = label[k];
  }
  if (rc) goto done;
  { /* --depths against the model's blocks, naming the option */
    st_model *m = NULL;
    int deepest = o->depths[o->n_depths - 1];
    if (!(rc = st_plan_model(&m, base, err)) && deepest > m->n_blocks)
      rc = st_error_set(err, ST_EARG,
                        "experiment pb: --depths %d: the model has %d "
                        "blocks; each stage needs at least one",
                        deepest, m->n_blocks);
    st_model_destroy(m);
    if (rc) goto done;
  }
  /* the deepest cut is tried first: a model too shallow for it fails
   * before any run */
  {
    const st_config *deep = &configs[n - N_DEPTH_VARIANTS];
    st_trainer *t = NULL;
    rc = st_trainer_create(&t, deep, NULL, err);
    if (!rc && st_trainer_stages(t) != deep->execution.stages)
      rc = st_error_set(err, ST_ECONFIG,
                        "experiment pb: --depths %d: the model cuts into %d "
                        "stages, not %d",
                        deep->execution.stages, st_trainer_stages(t),
                        deep->execution.stages);
    st_trainer_destroy(t);
    if (rc) {
      name_run(err, rc, labels[n - N_DEPTH_VARIANTS], deep->train.seed);
      goto done;
    }
  }
  if ((rc = st_mkdir_p(o->out_dir, 1, err))) goto done;
  if ((rc = run_all(o, configs, labels, n, runs, err))) goto done;
  if ((rc = write_depth_csv(o, base, runs, err))) goto done;
  if ((rc = write_depth_report(o, base, runs, err))) goto done;
  rc = write_depth_svg(o, runs, err);
done:
  if (runs)
    for (int k = 0; k < n * o->seeds; k++) free(runs[k].curve);
  free(runs);
  free(labels);
  free(label);
  free(configs);
  return rc;
}

int st_experiment_pb(const st_experiment_options *o, const st_config *base,
                     st_error *err) {
  int rc = check_options(o, err);
  if (rc) return rc;
  if (o->n_depths) return depth_experiment(o, base, err);
  /* Every variant's config is checked before any run starts. */
  st_config *configs = malloc(ST_EXPERIMENT_PB_VARIANTS * sizeof *configs);
  run *runs =
      calloc((size_t)ST_EXPERIMENT_PB_VARIANTS * o->seeds, sizeof *runs);
  if (!configs || !runs) {
    rc = st_error_set(err, ST_ENOMEM, "experiment pb: out of memory");
    goto done;
  }
  for (int v = 0; !rc && v < ST_EXPERIMENT_PB_VARIANTS; v++)
    rc = st_experiment_pb_config(&configs[v], base, o, v, 0, err);
  if (rc) goto done;
  if ((rc = st_mkdir_p(o->out_dir, 1, err))) goto done;
  if ((rc =
           run_all(o, configs, variants, ST_EXPERIMENT_PB_VARIANTS, runs, err)))
    goto done;
  if ((rc = write_csv(o, base, runs, err))) goto done;
  if ((rc = write_report(o, base, configs, runs, err))) goto done;
  rc = write_svg(o, runs, err);
done:
  if (runs)
    for (int k = 0; k < ST_EXPERIMENT_PB_VARIANTS * o->seeds; k++)
      free(runs[k].curve);
  free(runs);
  free(configs);
  return rc;
}
