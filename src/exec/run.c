/*
 * run.c — the training loop around st_trainer_step: evaluation, metrics
 * (metrics.jsonl, summary.json), checkpoints every N steps and at the end,
 * and the live progress line. Shared by every mode; nothing here allocates
 * per step except the periodic file writes.
 */
#include "exec.h"

#include "../compile/compile.h"
#include "../dist/dist.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A stop asked for (a signal number), and the one the last run stopped
 * for once every rank agreed. */
static atomic_int stop_asked; /* lock-free: safe in a signal handler */
static int stopped_by;

int st_run_request_stop(int signo) {
  /* two signals handled at once on two threads: one of them is first */
  int before = 0;
  atomic_compare_exchange_strong(&stop_asked, &before,
                                 signo > 0 ? signo : SIGINT);
  return before;
}

int st_run_stopped_by(void) { return stopped_by; }

/* What st_run_say_durable writes: the line for the last durable state,
 * kept in two buffers, the one to read named by an atomic index, so a
 * signal handler never reads one being written. */
static char durable[2][ST_PATH_MAX + 256];
static atomic_int durable_at = -1;

/* Said at a stop's first signal, before the run has saved its step: a
 * plain stop goes on to save it and say so, but mpirun signals every rank
 * when one is lost and ends them soon after. */
#define STOP_NOTE                                                              \
  "strata: stopping on a signal (if mpirun sent it for a lost rank, it may "   \
  "end this process before the step is saved); "

static void note_durable(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static void note_durable(const char *fmt, ...) {
  int k = (atomic_load(&durable_at) + 1) & 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(durable[k], sizeof durable[k], fmt, ap);
  va_end(ap);
  atomic_store(&durable_at, k);
}

void st_run_say_durable(void) {
  int k = atomic_load(&durable_at);
  if (k < 0 || st_dist_size() == 1) return; /* in one process: the user's */
  size_t n = strnlen(durable[k], sizeof durable[k]);
  (void)!write(STDERR_FILENO, durable[k], n);
}

/* Whether to stop before the next step (*stop: the signal, or 0): asked
 * on any rank (a collective over ranks, once a step). */
static int stop_agreed(int *stop, st_error *err) {
  *stop = atomic_load(&stop_asked);
  int rc = st_dist_max(stop, err);
  if (!rc && *stop) stopped_by = *stop;
  return rc;
}

typedef struct run_state {
  st_trainer *t;
  const st_config *cfg;
  const char *dir;
  st_rank_memory *memory; /* every rank's, at the end (gather_memory) */
  FILE *metrics;
  off_t metrics_whole; /* its bytes up to the last line written whole */
  double t0, train_s, last_progress;
  int64_t step0, samples0; /* where this process started (after a resume) */
  double window_loss;
  int window_n;
  double last_loss, test_loss, test_acc;
  int64_t evaluated_at;
  int tty, progress;
  int output_failed; /* a write to metrics.jsonl failed: the error says */
} run_state;

/* After a line to metrics.jsonl: a failed write (a full disk) stops the
 * run, naming the file and the OS error, rather than tear the log. */
static int metrics_written(run_state *r, st_error *err) {
  if (fflush(r->metrics) == 0 && !ferror(r->metrics)) {
    r->metrics_whole = ftello(r->metrics);
    return 0;
  }
  int e = errno ? errno : EIO;
  r->output_failed = 1;
  /* a line cut short by a full disk: the log ends at its last whole one */
  (void)!ftruncate(fileno(r->metrics), r->metrics_whole);
  __fpurge(r->metrics); /* and the line's unwritten rest is not retried */
  return st_error_set(err, ST_EIO, "%s/metrics.jsonl: cannot write: %s", r->dir,
                      strerror(e));
}

static void fmt_duration(char *buf, size_t cap, double s) {
  if (s < 0 || s > 1e7) s = 0;
  long v = (long)(s + 0.5);
  if (v >= 3600)
    snprintf(buf, cap, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
  else
    snprintf(buf, cap, "%ld:%02ld", v / 60, v % 60);
}

/* Rate of this process: samples before a resume were not timed here. */
static double samples_per_s(const run_state *r) {
  int64_t n = st_trainer_pos(r->t)->samples - r->samples0;
  return r->train_s > 0 ? (double)n / r->train_s : 0;
}

static void progress(run_state *r, int final) {
  if (!r->progress) return;
  double now = st_now();
  if (!final && now - r->last_progress < (r->tty ? 0.2 : 10.0)) return;
  r->last_progress = now;
  const st_train_pos *p = st_trainer_pos(r->t);
  int64_t total = st_trainer_total_steps(r->t);
  double rate = samples_per_s(r);
  int64_t done = p->step - r->step0;
  double eta =
      done > 0 ? r->train_s / (double)done * (double)(total - p->step) : 0;
  char eta_s[32];
  fmt_duration(eta_s, sizeof eta_s, eta);
  int64_t per_epoch = st_trainer_steps_per_epoch(r->t);
  int64_t epochs = (total + per_epoch - 1) / per_epoch;
  /* a language model's samples are sequences: count its tokens */
  int rows = st_trainer_model(r->t)->label_rows;
  fprintf(stderr,
          "%sepoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f %s/s  "
          "ETA %s%s",
          r->tty ? "\r\033[K" : "", (long long)p->epoch + 1, (long long)epochs,
          (long long)p->step, (long long)total, r->last_loss, rate * rows,
          !strcmp(st_trainer_model(r->t)->kind, "gpt") ? "tokens" : "samples",
          eta_s, r->tty ? "" : "\n");
  if (r->tty && final) fputc('\n', stderr);
  fflush(stderr);
}

static int evaluate(run_state *r, st_error *err) {
  int rc = st_trainer_evaluate(r->t, &r->test_loss, &r->test_acc, err);
  if (rc) return rc;
  const st_train_pos *p = st_trainer_pos(r->t);
  /* an update after the last checked loss diverged: the weights (or the
   * outputs they give) are no longer finite, and no checkpoint of them
   * would load. A store commits every step: it holds them already, and a
   * resume would evaluate them again. Over ranks every rank evaluates
   * (the same weights, or the logits a placed pipeline's last rank
   * broadcast): agreed, said once, the job not aborted. */
  const char *store = st_trainer_store(r->t);
  if (!isfinite(r->test_loss))
    rc = st_error_set(
        err, ST_ENONFINITE,
        "step %lld: the %s loss is %s: the model diverged in its last "
        "updates; stopped, %s%s%s — lower optimizer.lr%s",
        (long long)p->step,
        !strcmp(st_trainer_model(r->t)->kind, "gpt") ? "validation" : "test",
        isnan(r->test_loss) ? "NaN" : "infinite",
        store ? "but the store " : "no checkpoint written", store ? store : "",
        store ? " holds these weights (committed with the step)" : "",
        store ? " and start afresh (a resume evaluates them again)" : "");
  if (st_dist_size() > 1) rc = st_dist_agree(rc, err);
  if (rc) return rc;
  r->evaluated_at = p->step;
  if (r->metrics) {
    fprintf(r->metrics,
            "{\"type\":\"eval\",\"step\":%lld,\"epoch\":%lld,"
            "\"test_loss\":%.6f,\"test_accuracy\":%.6f,\"wall_s\":%.3f}\n",
            (long long)p->step, (long long)p->epoch, r->test_loss, r->test_acc,
            st_now() - r->t0);
    if ((rc = metrics_written(r, err))) return rc;
  }
  if (r->progress && r->tty) fputs("\r\033[K", stderr);
  if (r->progress && !strcmp(st_trainer_model(r->t)->kind, "gpt"))
    fprintf(stderr,
            "eval  step %lld  validation loss %.4f  next-token accuracy "
            "%.4f\n",
            (long long)p->step, r->test_loss, r->test_acc);
  else if (r->progress)
    fprintf(stderr, "eval  step %lld  test loss %.4f  test accuracy %.4f\n",
            (long long)p->step, r->test_loss, r->test_acc);
  return 0;
}

/* ", \"noise_scale\": B, \"noise_g2\": G, \"noise_trace\": S" or "";
 * JSON has no NaN, so an estimate not available yet is null. */
static void noise_fields(const run_state *r, char *buf, size_t cap) {
  const st_noise_scale *ns = st_trainer_noise(r->t);
  buf[0] = 0;
  if (!ns) return;
  double g2, trace, b = st_noise_scale_value(ns, &g2, &trace);
  char bs[32] = "null", gs[32] = "null", ts[32] = "null";
  if (isfinite(b)) snprintf(bs, sizeof bs, "%.6g", b);
  if (isfinite(g2)) snprintf(gs, sizeof gs, "%.6g", g2);
  if (isfinite(trace)) snprintf(ts, sizeof ts, "%.6g", trace);
  snprintf(buf, cap, ",\"noise_scale\":%s,\"noise_g2\":%s,\"noise_trace\":%s",
           bs, gs, ts);
}

static int log_train(run_state *r, st_error *err) {
  const st_train_pos *p = st_trainer_pos(r->t);
  if (r->metrics && r->window_n) {
    char noise[160];
    noise_fields(r, noise, sizeof noise);
    fprintf(r->metrics,
            "{\"type\":\"train\",\"step\":%lld,\"epoch\":%lld,"
            "\"samples\":%lld,\"loss\":%.6f,\"lr\":%.6g,"
            "\"samples_per_s\":%.1f,\"wall_s\":%.3f%s}\n",
            (long long)p->step, (long long)p->epoch, (long long)p->samples,
            r->window_loss / r->window_n,
            st_lr_at(r->cfg, p->step - 1, st_trainer_total_steps(r->t)),
            samples_per_s(r), st_now() - r->t0, noise);
    r->window_loss = 0;
    r->window_n = 0;
    return metrics_written(r, err);
  }
  r->window_loss = 0;
  r->window_n = 0;
  return 0;
}

/* alone: this rank's own save after its own failure (the others are not
 * here to agree with). */
static int checkpoint(run_state *r, int alone, st_error *err) {
  /* Weights can turn NaN while every loss stays finite (a row no sample
   * reads, as an untied embedding's for a byte the corpus lacks): such a
   * checkpoint would not load, and pruning would drop the good ones before
   * it. Over ranks every rank checks (a placed one its own blocks): one
   * that finds such a weight stops them all with its error before the
   * save, which the others would enter (a collective where ranks save
   * together), rather than end the job by MPI_Abort. Every rank agrees,
   * the store's rank of weight streaming too (it checks nothing). */
  const char *store = st_trainer_store(r->t);
  int rc = store ? 0 : st_trainer_check_finite(r->t, err);
  if (!alone && st_dist_size() > 1) rc = st_dist_agree(rc, err);
  if (rc) return rc;
  /* A store that keeps the weights commits every step: it is the
   * checkpoint (wait for its last commit). */
  if (store) return st_trainer_sync(r->t, err);
  /* stages over ranks: every rank sends its own to rank 0, which writes
   * (or writes its own shard) */
  int shards = !strcmp(r->cfg->train.checkpoint_format, "shards");
  if (!r->dir)
    return !st_trainer_saves_together(r->t) ? 0
           : shards ? st_trainer_save_shards(r->t, NULL, err)
                    : st_trainer_save(r->t, NULL, err);
  const st_train_pos *p = st_trainer_pos(r->t);
  char path[ST_PATH_MAX + 64];
  st_run_checkpoint_dir(r->dir, p->step, path, sizeof path);
  if (shards) {
    rc = st_trainer_save_shards(r->t, path, err);
  } else {
    /* the file, even where this step's shards are there (a sharded run
     * resumed at its last step with single files): st_run_checkpoint_path
     * would name their folder, which a file cannot replace */
    strncat(path, ".safetensors", sizeof path - strlen(path) - 1);
    rc = st_trainer_save(r->t, path, err);
  }
  if (rc) return rc;
  note_durable(STOP_NOTE "the last complete checkpoint is %s "
                         "(step %lld): rerun with --resume %s to continue\n",
               path, (long long)p->step, r->dir);
  /* Keep exactly the newest keep_checkpoints step files, whatever an
   * earlier run or a kill between rename and unlink left. */
  int keep = r->cfg->train.keep_checkpoints;
  return keep > 0 ? st_run_prune(r->dir, keep, err) : 0;
}

/* ",\n  \"stages\": [...], \"utilization\": ..." — where the time went,
 * beside the plan's prediction and the bubble formula (null: no plan). */
static void stage_fields(const run_state *r, FILE *f) {
  double wall = 0, bubble = 1, plan_util = 0;
  int n = st_trainer_stats(r->t, NULL, 0, &wall);
  st_track_stats *st = malloc((size_t)n * sizeof *st);
  double util = st_trainer_utilization(r->t, &bubble);
  double plan_rate = st_trainer_plan_rate(r->t, &plan_util);
  fprintf(f, ",\n  \"stages\": [");
  if (st) st_trainer_stats(r->t, st, n, &wall);
  double busy = 0, bound = st && n > 0 ? st[0].bound_s : 0;
  for (int i = 0; st && i < n; i++) {
    fprintf(f,
            "%s{\"name\": \"%s\", \"blocks\": [%d, %d], "
            "\"busy_fraction\": %.4f}",
            i ? ", " : "", st[i].name, st[i].first,
            st[i].first + st[i].count - 1, wall > 0 ? st[i].busy_s / wall : 0);
    busy += st[i].busy_s;
  }
  free(st);
  char pu[32] = "null", pr[32] = "null", al[32] = "null";
  if (plan_util > 0) snprintf(pu, sizeof pu, "%.4f", plan_util);
  if (plan_rate > 0) snprintf(pr, sizeof pr, "%.1f", plan_rate);
  /* pipelined backprop: what its busy times allow with free hand-offs
   * (not emulated: one thread ran every stage, no hand-off to replay) */
  if (bound > 0 && !r->cfg->execution.emulate)
    snprintf(al, sizeof al, "%.4f", busy / n / bound);
  fprintf(f,
          "],\n  \"utilization\": %.4f,\n  \"utilization_plan\": %s,\n"
          "  \"utilization_bubble\": %.4f,\n  \"utilization_allowed\": %s,"
          "\n  \"plan_samples_per_s\": %s",
          util, pu, bubble, al, pr);
}

/* Every rank's memory and traffic (collective over the ranks): printed by
 * rank 0, one line a rank, and kept for summary.json. */
static int gather_memory(run_state *r, st_error *err) {
  int W = st_dist_size();
  r->memory = calloc((size_t)W, sizeof *r->memory);
  if (!r->memory) return st_error_set(err, ST_ENOMEM, "out of memory");
  st_trainer_memory(r->t, &r->memory[st_dist_rank()]);
  int rc = st_dist_allgather(r->memory, sizeof *r->memory, err);
  if (rc || W == 1 || st_dist_rank() != 0) return rc;
  for (int k = 0; k < W; k++) {
    const st_rank_memory *m = &r->memory[k];
    char blocks[32] = "", plan[32], peak[32], res[32], tx[32], rx[32];
    if (m->first >= 0)
      snprintf(blocks, sizeof blocks, " (blocks %d-%d)", m->first, m->last);
    else if (m->blocks)
      snprintf(blocks, sizeof blocks, " (%d blocks)", m->blocks);
    else
      snprintf(blocks, sizeof blocks, " (no weights kept)");
    printf("strata: rank %d%s: memory planned %s, peak %s counted, %s "
           "resident; per step sent %s, received %s\n",
           k, blocks, st_plan_fmt_bytes(plan, sizeof plan, m->planned),
           st_plan_fmt_bytes(peak, sizeof peak, m->peak),
           st_plan_fmt_bytes(res, sizeof res, m->resident),
           st_plan_fmt_bytes(tx, sizeof tx, m->sent),
           st_plan_fmt_bytes(rx, sizeof rx, m->received));
  }
  fflush(stdout);
  return 0;
}

/* ",\n  \"memory\": [...]": each rank's (one in one process). */
static void memory_fields(const run_state *r, FILE *f) {
  fprintf(f, ",\n  \"memory\": [");
  for (int k = 0; r->memory && k < st_dist_size(); k++) {
    const st_rank_memory *m = &r->memory[k];
    fprintf(f,
            "%s{\"rank\": %d, \"blocks\": %d, \"first_block\": %d, "
            "\"last_block\": %d, "
            "\"planned_bytes\": %.0f, \"weights_bytes\": %.0f, "
            "\"gradients_bytes\": %.0f, \"optimizer_state_bytes\": %.0f, "
            "\"buffers_bytes\": %.0f, \"data_bytes\": %.0f, "
            "\"peak_bytes\": %.0f, \"resident_peak_bytes\": %.0f, "
            "\"sent_bytes_per_step\": %.0f, "
            "\"received_bytes_per_step\": %.0f}",
            k ? ",\n    " : "\n    ", k, m->blocks, m->first, m->last,
            m->planned, m->weights, m->grads, m->state, m->buffers, m->data,
            m->peak, m->resident, m->sent, m->received);
  }
  fprintf(f, "]");
}

static int write_summary(run_state *r, st_error *err) {
  if (!r->dir) return 0;
  const st_train_pos *p = st_trainer_pos(r->t);
  const st_model *m = st_trainer_model(r->t);
  char *text = NULL, path[ST_PATH_MAX + 32], noise[160], interrupted[16];
  /* the signal a run stopped for ("SIGINT"), or false */
  snprintf(interrupted, sizeof interrupted, "%s%s%s", stopped_by ? "\"" : "",
           stopped_by == SIGINT    ? "SIGINT"
           : stopped_by == SIGTERM ? "SIGTERM"
           : stopped_by            ? "signal"
                                   : "false",
           stopped_by ? "\"" : "");
  /* a run stopped before any evaluation has no test figures (null) */
  char tl[32] = "null", ta[32] = "null", at[32] = "null";
  if (r->evaluated_at >= 0) {
    snprintf(tl, sizeof tl, "%.6f", r->test_loss);
    snprintf(ta, sizeof ta, "%.6f", r->test_acc);
    snprintf(at, sizeof at, "%lld", (long long)r->evaluated_at);
  }
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "out of memory");
  noise_fields(r, noise, sizeof noise);
  fprintf(
      f,
      "{\n  \"mode\": \"%s\",\n  \"model\": \"%s\",\n  \"parameters\": %zu,\n"
      "  \"steps\": %lld,\n  \"epochs\": %lld,\n  \"samples\": %lld,\n"
      "  \"batch\": %d,\n  \"train_loss\": %.6f,\n  \"test_loss\": %s,\n"
      "  \"test_accuracy\": %s,\n  \"evaluated_at_step\": %s,\n"
      "  \"samples_per_s\": %.1f,\n"
      "  \"train_s\": %.3f,\n  \"wall_s\": %.3f,\n  \"threads\": %d,\n"
      "  \"replicas\": %d,\n  \"blas\": \"%s\",\n  \"gemm_kernels\": \"%s\",\n"
      "  \"precision\": \"%s%s%s\",\n"
      "  \"subnormals\": \"%s%s\"%s,\n"
      "  \"interrupted\": %s",
      r->cfg->execution.mode, m->kind, m->n_params, (long long)p->step,
      (long long)p->epoch + (p->epoch_pos > 0), (long long)p->samples,
      r->cfg->train.batch, r->last_loss, tl, ta, at, samples_per_s(r),
      r->train_s, st_now() - r->t0, st_trainer_threads(r->t),
      r->cfg->execution.replicas, st_blas_name(),
      st_gemm_choice_measured()
          ? "packed kernel or the BLAS by product class, as measured by the "
            "calibration profile"
          : "packed kernel or the BLAS by the built-in rule",
      r->cfg->train.precision,
      strcmp(r->cfg->train.precision, "bf16") ? "" : ": ",
      strcmp(r->cfg->train.precision, "bf16") ? "" : st_bf16_support(),
      !r->cfg->train.flush_subnormals ? "kept"
      : st_fp_flush_support()[0] == 'n'
          ? "kept: this CPU has no flush mode strata sets"
          : "flushed: ",
      r->cfg->train.flush_subnormals && st_fp_flush_support()[0] != 'n'
          ? st_fp_flush_support()
          : "",
      noise, interrupted);
  stage_fields(r, f);
  memory_fields(r, f);
  fprintf(f, "\n}\n");
  snprintf(path, sizeof path, "%s/summary.json", r->dir);
  return st_write_stream_atomic(f, &text, &len, path, err);
}

/* The log a resumed run appends to: its whole lines up to the step resumed
 * from. A line cut short (a full disk, a kill) and the lines of steps past
 * the checkpoint (logged before a later checkpoint failed, or a kill) go,
 * so the log reads as one run's. An evaluation logged at that step is the
 * run's (r->evaluated_at): the run's end does not make it again. */
static void trim_log(run_state *r, const char *path, int64_t step) {
  FILE *f = fopen(path, "r+");
  if (!f) return;
  char *line = NULL;
  size_t cap = 0;
  long keep = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    if (line[n - 1] != '\n') break; /* torn */
    const char *at = strstr(line, "\"step\":");
    if (at && strtoll(at + 7, NULL, 10) > step) break;
    keep += (long)n;
    const char *tl = strstr(line, "\"test_loss\":"),
               *ta = strstr(line, "\"test_accuracy\":");
    if (at && strtoll(at + 7, NULL, 10) == step && tl && ta &&
        strstr(line, "\"type\":\"eval\"")) {
      r->evaluated_at = step;
      r->test_loss = strtod(tl + 12, NULL);
      r->test_acc = strtod(ta + 16, NULL);
    }
  }
  free(line);
  if (fseek(f, 0, SEEK_END) == 0 && ftell(f) > keep)
    (void)!ftruncate(fileno(f), keep);
  fclose(f);
}

/* metrics.jsonl: appended to by a resumed run. config.yaml is the
 * caller's (strata train writes it before the trainer exists). */
static int open_outputs(run_state *r, st_error *err) {
  if (!r->dir) return 0;
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/metrics.jsonl", r->dir);
  int64_t at = st_trainer_pos(r->t)->step;
  int resumed = at > 0;
  if (resumed) trim_log(r, path, at);
  r->metrics = fopen(path, resumed ? "a" : "w");
  if (!r->metrics)
    return st_error_set(err, ST_EIO, "%s: cannot write: %s", path,
                        strerror(errno));
  struct stat sb;
  r->metrics_whole = fstat(fileno(r->metrics), &sb) == 0 ? sb.st_size : 0;
  return 0;
}

/* What the loop does after `step` steps besides logging: evaluate (bit 1)
 * and checkpoint (bit 2); the run's end is the caller's. */
static int pauses_after(const run_state *r, int64_t step, int64_t total) {
  const st_config *c = r->cfg;
  int epoch_done = step % st_trainer_steps_per_epoch(r->t) == 0;
  int eval = (c->train.eval_every > 0 && step % c->train.eval_every == 0) ||
             (c->train.eval_every == 0 && epoch_done && step < total);
  int ckpt = c->train.checkpoint_every > 0 &&
             step % c->train.checkpoint_every == 0 && step < total;
  return eval | ckpt << 1;
}

static int loop(run_state *r, st_error *err) {
  st_trainer *t = r->t;
  const st_config *c = r->cfg;
  int64_t total = st_trainer_total_steps(t);
  while (st_trainer_pos(t)->step < total) {
    double t_step = st_now(), loss;
    /* a stop asked for: the step already started ahead is finished, then
     * the loop ends */
    int stop, rc = stop_agreed(&stop, err);
    if (rc) return rc;
    if (stop && !st_trainer_in_flight(t)) return 0;
    /* with nothing to do between this step and the next, the next may
     * start before this one returns */
    int64_t after = st_trainer_pos(t)->step + 1;
    int ahead = !stop && !atomic_load(&stop_asked) && after < total &&
                !pauses_after(r, after, total);
    rc = st_trainer_step_ahead(t, ahead, &loss, err);
    r->train_s += st_now() - t_step;
    if (rc) return rc;
    r->last_loss = loss;
    r->window_loss += loss;
    r->window_n++;
    const st_train_pos *p = st_trainer_pos(t);
    int pause = pauses_after(r, p->step, total);
    /* a checkpoint closes the loss window too: a run resumed from it
     * starts a new one, and its next line then averages the same steps as
     * this run's does */
    if ((p->step % c->metrics.log_every == 0 || (pause & 2)) &&
        (rc = log_train(r, err)))
      return rc;
    progress(r, 0);
    if ((pause & 1) && (rc = evaluate(r, err))) return rc;
    if ((pause & 2) && (rc = checkpoint(r, 0, err))) return rc;
  }
  return 0;
}

int st_trainer_run(st_trainer *t, st_error *err) {
  const st_config *c = st_trainer_config(t);
  run_state r = {.t = t,
                 .cfg = c,
                 .dir = st_trainer_dir(t),
                 .t0 = st_now(),
                 .evaluated_at = -1};
  r.tty = isatty(fileno(stderr));
  r.progress = st_dist_rank() == 0 && /* over MPI, rank 0 speaks */
               (strcmp(c->metrics.progress, "on") == 0 ||
                (strcmp(c->metrics.progress, "auto") == 0 && r.tty));
  r.step0 = st_trainer_pos(t)->step;
  if (r.dir && st_trainer_store(t)) {
    note_durable(STOP_NOTE
                 "the store %s holds the last "
                 "committed step: rerun with --resume %s to continue\n",
                 st_trainer_store(t), r.dir);
  } else if (r.dir && r.step0 > 0) {
    char path[ST_PATH_MAX + 64];
    st_run_checkpoint_path(r.dir, r.step0, path, sizeof path);
    note_durable(STOP_NOTE
                 "the last complete checkpoint is "
                 "%s (step %lld): rerun with --resume %s to continue\n",
                 path, (long long)r.step0, r.dir);
  } else if (r.dir) {
    note_durable(STOP_NOTE "no checkpoint is complete yet: "
                           "a rerun with --resume %s starts at step 0\n",
                 r.dir);
  }
  r.samples0 = st_trainer_pos(t)->samples;
  /* the stop the last run made is spent (one asked since, or before the
   * first run, stands) */
  if (stopped_by) atomic_store(&stop_asked, 0);
  stopped_by = 0;
  int rc = open_outputs(&r, err);
  /* rank 0's log decides whether the run's end evaluates: over ranks the
   * evaluation is every rank's */
  int logged = r.evaluated_at >= 0;
  if (!rc && st_dist_size() > 1 && !(rc = st_dist_max(&logged, err)) && logged)
    r.evaluated_at = r.step0;
  if (!rc) rc = loop(&r, err);
  if (!rc && r.window_n) rc = log_train(&r, err);
  if (!rc) progress(&r, 1);
  /* stopped by a signal: no evaluation (it may take long), the rest */
  if (!rc && !stopped_by && r.evaluated_at != st_trainer_pos(t)->step)
    rc = evaluate(&r, err);
  if (!rc && !stopped_by)
    st_trainer_note_result(t, r.test_loss, r.test_acc, samples_per_s(&r));
  if (!rc) rc = checkpoint(&r, 0, err);
  if (!rc) rc = st_trainer_finish(t, err); /* over ranks: every rank */
  if (!rc) rc = gather_memory(&r, err);    /* every rank too */
  if (!rc) rc = write_summary(&r, err);
  /* a failed run still waits for its store's last commit; one whose log
   * could not be written still saves its weights where it can */
  if (rc) {
    st_error ignored = {0};
    if (r.output_failed) {
      double loss;
      if (st_trainer_in_flight(t)) st_trainer_step_ahead(t, 0, &loss, &ignored);
      /* (not where every rank must take part: only this one failed) */
      if (!st_trainer_in_flight(t) && !st_trainer_saves_together(t))
        checkpoint(&r, 1, &ignored);
    }
    st_trainer_sync(t, &ignored);
  }
  if (r.metrics) fclose(r.metrics);
  free(r.memory);
  return rc;
}
