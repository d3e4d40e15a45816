/*
 * run.c — the training loop around st_trainer_step: evaluation, metrics
 * (metrics.jsonl, summary.json), checkpoints every N steps and at the end,
 * and the live progress line. Shared by every mode; nothing here allocates
 * per step except the periodic file writes.
 */
#include "exec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct run_state {
  st_trainer *t;
  const st_config *cfg;
  const char *dir;
  FILE *metrics;
  double t0, train_s, last_progress;
  int64_t step0, samples0; /* where this process started (after a resume) */
  double window_loss;
  int window_n;
  double last_loss, test_loss, test_acc;
  int64_t evaluated_at;
  int tty, progress;
} run_state;

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
          rows > 1 ? "tokens" : "samples", eta_s, r->tty ? "" : "\n");
  if (r->tty && final) fputc('\n', stderr);
  fflush(stderr);
}

static int evaluate(run_state *r, st_error *err) {
  int rc = st_trainer_evaluate(r->t, &r->test_loss, &r->test_acc, err);
  if (rc) return rc;
  const st_train_pos *p = st_trainer_pos(r->t);
  r->evaluated_at = p->step;
  if (r->metrics) {
    fprintf(r->metrics,
            "{\"type\":\"eval\",\"step\":%lld,\"epoch\":%lld,"
            "\"test_loss\":%.6f,\"test_accuracy\":%.6f,\"wall_s\":%.3f}\n",
            (long long)p->step, (long long)p->epoch, r->test_loss, r->test_acc,
            st_now() - r->t0);
    fflush(r->metrics);
  }
  if (r->progress && r->tty) fputs("\r\033[K", stderr);
  if (r->progress && st_trainer_model(r->t)->label_rows > 1)
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

static void log_train(run_state *r) {
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
    fflush(r->metrics);
  }
  r->window_loss = 0;
  r->window_n = 0;
}

static int checkpoint(run_state *r, st_error *err) {
  /* A store that keeps the weights commits every step: it is the
   * checkpoint (wait for its last commit). */
  if (st_trainer_store(r->t)) return st_trainer_sync(r->t, err);
  /* over ranks, every rank takes part in fetching the weights */
  int rc = st_trainer_gather(r->t, err);
  if (rc || !r->dir) return rc;
  const st_train_pos *p = st_trainer_pos(r->t);
  char path[ST_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/checkpoints/step-%08lld.safetensors", r->dir,
           (long long)p->step);
  if ((rc = st_trainer_save(r->t, path, err))) return rc;
  /* Keep the newest keep_checkpoints step files. */
  int every = r->cfg->train.checkpoint_every,
      keep = r->cfg->train.keep_checkpoints;
  if (every > 0 && keep > 0) {
    long long old = (long long)p->step - (long long)keep * every;
    old -= old % every;
    if (old > 0) {
      snprintf(path, sizeof path, "%s/checkpoints/step-%08lld.safetensors",
               r->dir, old);
      unlink(path);
    }
  }
  return 0;
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

static int write_summary(run_state *r, st_error *err) {
  if (!r->dir) return 0;
  const st_train_pos *p = st_trainer_pos(r->t);
  const st_model *m = st_trainer_model(r->t);
  char *text = NULL, path[ST_PATH_MAX + 32], noise[160];
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "out of memory");
  noise_fields(r, noise, sizeof noise);
  fprintf(
      f,
      "{\n  \"mode\": \"%s\",\n  \"model\": \"%s\",\n  \"parameters\": %zu,\n"
      "  \"steps\": %lld,\n  \"epochs\": %lld,\n  \"samples\": %lld,\n"
      "  \"batch\": %d,\n  \"train_loss\": %.6f,\n  \"test_loss\": %.6f,\n"
      "  \"test_accuracy\": %.6f,\n  \"samples_per_s\": %.1f,\n"
      "  \"train_s\": %.3f,\n  \"wall_s\": %.3f,\n  \"threads\": %d,\n"
      "  \"replicas\": %d,\n  \"blas\": \"%s\"%s",
      r->cfg->execution.mode, m->kind, m->n_params, (long long)p->step,
      (long long)p->epoch + (p->epoch_pos > 0), (long long)p->samples,
      r->cfg->train.batch, r->last_loss, r->test_loss, r->test_acc,
      samples_per_s(r), r->train_s, st_now() - r->t0, st_trainer_threads(r->t),
      r->cfg->execution.replicas, st_blas_name(), noise);
  stage_fields(r, f);
  fprintf(f, "\n}\n");
  snprintf(path, sizeof path, "%s/summary.json", r->dir);
  return st_write_stream_atomic(f, &text, &len, path, err);
}

static int open_outputs(run_state *r, st_error *err) {
  if (!r->dir) return 0;
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/config.yaml", r->dir);
  /* Atomically, like checkpoints: `--resume DIR -` reads it back. */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "out of memory");
  st_config_write(r->cfg, f);
  int rc = st_write_stream_atomic(f, &text, &len, path, err);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/metrics.jsonl", r->dir);
  int resumed = st_trainer_pos(r->t)->step > 0;
  r->metrics = fopen(path, resumed ? "a" : "w");
  if (!r->metrics)
    return st_error_set(err, ST_EIO, "%s: cannot write: %s", path,
                        strerror(errno));
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
    /* with nothing to do between this step and the next, the next may
     * start before this one returns */
    int64_t after = st_trainer_pos(t)->step + 1;
    int ahead = after < total && !pauses_after(r, after, total);
    int rc = st_trainer_step_ahead(t, ahead, &loss, err);
    r->train_s += st_now() - t_step;
    if (rc) return rc;
    r->last_loss = loss;
    r->window_loss += loss;
    r->window_n++;
    const st_train_pos *p = st_trainer_pos(t);
    if (p->step % c->metrics.log_every == 0) log_train(r);
    progress(r, 0);
    int pause = pauses_after(r, p->step, total);
    if ((pause & 1) && (rc = evaluate(r, err))) return rc;
    if ((pause & 2) && (rc = checkpoint(r, err))) return rc;
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
  r.samples0 = st_trainer_pos(t)->samples;
  int rc = open_outputs(&r, err);
  if (!rc) rc = loop(&r, err);
  if (!rc && r.window_n) log_train(&r);
  if (!rc) progress(&r, 1);
  if (!rc && r.evaluated_at != st_trainer_pos(t)->step) rc = evaluate(&r, err);
  if (!rc)
    st_trainer_note_result(t, r.test_loss, r.test_acc, samples_per_s(&r));
  if (!rc) rc = checkpoint(&r, err);
  if (!rc) rc = st_trainer_finish(t, err); /* over ranks: every rank */
  if (!rc) rc = write_summary(&r, err);
  /* a failed run still waits for its store's last commit */
  if (rc) {
    st_error ignored = {0};
    st_trainer_sync(t, &ignored);
  }
  if (r.metrics) fclose(r.metrics);
  return rc;
}
