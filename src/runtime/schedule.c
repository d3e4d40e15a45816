/*
 * schedule.c — the fill-and-drain schedules as pure functions: for S
 * workers, M micro-batches and V chunks a worker, the order in which each
 * worker runs its ops (runtime.h, st_schedule). The pipeline executor runs
 * these lists as they are; the tests, the bench's formulas and the
 * schedule picture run them on an emulated clock (st_schedule_emulate).
 *
 * Pipeline stage j = k + v S is chunk v of worker k (V = 1: stage k).
 * An op is F (forward), B (input gradient), W (weight gradient) or BW
 * (the whole backward, B and W together); each worker runs a chunk's
 * forwards, and its backwards, in micro-batch order, so gradients
 * accumulate over micro-batches in the sequential mode's order.
 *
 *   gpipe        every forward, then every backward (BW): M in flight.
 *   1f1b         w = min(M, S-1-k) forwards, then one forward and one BW
 *                alternately, then the remaining BWs (PipeDream-Flush,
 *                Narayanan et al. 2021): at most S - k in flight.
 *   interleaved  V chunks a worker (Megatron-LM's virtual pipeline stages,
 *                Narayanan et al. SC'21): forwards run through micro-batches
 *                in groups of S, chunk 0 of a group, then chunk 1, ..., and
 *                backwards the same with the chunks reversed; worker k warms
 *                up with 2(S-1-k) + (V-1) S forwards, then alternates.
 *   zb1p         ZB-H1 (Qi et al., ICLR 2024): 1f1b's warm-up and its
 *                F/B alternation, the backward split into B and W, and
 *                worker k runs W of micro-batch n only once k + 1 Bs later
 *                have run (its last k Ws fill the drain's idle slots). At
 *                most S - k micro-batches between F and B, as 1f1b, and at
 *                most S between F and W on every worker, 1f1b's peak at
 *                worker 0. With F, B and W of one cost the bubble shrinks
 *                from 1f1b's (S-1)(F+B+W) to (S-1)(F+B-W) for M >= S.
 */
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The forward (or backward) order of a worker's chunks in the interleaved
 * schedule: its i-th op's micro-batch and chunk. Micro-batches go in groups
 * of S (the last group may be smaller); within a group chunk 0 of each,
 * then chunk 1, ... (backward: chunk V-1 first). */
static void interleaved_at(int i, int S, int M, int V, int backward, int *mb,
                           int *chunk) {
  int full = M / S * S; /* micro-batches in whole groups */
  int g, in, size;
  if (i < full * V) {
    g = i / (S * V);
    in = i % (S * V);
    size = S;
  } else { /* the last, partial group */
    g = M / S;
    in = i - full * V;
    size = M - full;
  }
  int v = in / size;
  *mb = g * S + in % size;
  *chunk = backward ? V - 1 - v : v;
}

static void put(st_schedule *s, int *n, int kind, int chunk, int mb) {
  s->ops[*n].kind = (unsigned char)kind;
  s->ops[*n].chunk = (unsigned char)chunk;
  s->ops[*n].mb = mb;
  (*n)++;
}

/* Megatron's order for M a multiple of S: 2(S-1-k) + (V-1) S forwards,
 * then one forward and one backward alternately, then the backwards. */
static void interleaved_fixed(st_schedule *s, int *n, int k) {
  int S = s->S, M = s->M, V = s->V, total = V * M, mb, ch, f = 0;
  long warm = 2L * (S - 1 - k) + (long)(V - 1) * S;
  int w = warm < total ? (int)warm : total;
  for (; f < w; f++) {
    interleaved_at(f, S, M, V, 0, &mb, &ch);
    put(s, n, ST_PASS_F, ch, mb);
  }
  for (int b = 0; b < total; b++) {
    if (f < total) {
      interleaved_at(f++, S, M, V, 0, &mb, &ch);
      put(s, n, ST_PASS_F, ch, mb);
    }
    interleaved_at(b, S, M, V, 1, &mb, &ch);
    put(s, n, ST_PASS_BW, ch, mb);
  }
}

/* With a partial last group that warm-up can leave a worker waiting for a
 * forward that waits for it. There the order is found on the emulated
 * clock (F one tick, BW two): each worker, when free, runs the op
 * Megatron's order wants next (warm-up forwards, then alternately), or,
 * when that one cannot run yet, the other one that can. An order that ran
 * to the end on one clock has no cycle, so it runs on any timing. */
static int interleaved_greedy(st_schedule *s, st_error *err) {
  int S = s->S, M = s->M, V = s->V, J = S * V, total = V * M;
  double *fdone = malloc((size_t)J * M * sizeof *fdone);
  double *bdone = malloc((size_t)J * M * sizeof *bdone);
  int *st = calloc((size_t)S * 4, sizeof *st); /* f, b, warm, last */
  double *free_at = calloc((size_t)S, sizeof *free_at);
  int *len = calloc((size_t)S, sizeof *len); /* ops each worker has */
  int rc = 0, left = 2 * S * total;
  if (!fdone || !bdone || !st || !free_at || !len) {
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
    goto done;
  }
  for (int i = 0; i < J * M; i++) fdone[i] = bdone[i] = -1;
  for (int k = 0; k < S; k++) {
    long warm = 2L * (S - 1 - k) + (long)(V - 1) * S;
    st[4 * k + 2] = warm < total ? (int)warm : total;
    st[4 * k + 3] = ST_PASS_BW; /* the last op: the first wants F */
  }
  /* worker k's ops go to s->ops[2 total k ..) */
  for (double now = 0; left > 0;) {
    double soonest = -1;
    for (int k = 0; k < S; k++) {
      int *f = &st[4 * k], *b = f + 1, warm = f[2], *last = f + 3;
      if (*f + *b == 2 * total || free_at[k] > now) {
        if (*f + *b < 2 * total && (soonest < 0 || free_at[k] < soonest))
          soonest = free_at[k];
        continue;
      }
      int mb, ch, fm = -1, fc = 0, bm = -1, bc = 0;
      double fr = -1, br = -1;
      if (*f < total) {
        interleaved_at(*f, S, M, V, 0, &fm, &fc);
        int j = k + fc * S;
        fr = j == 0 ? 0 : fdone[(size_t)(j - 1) * M + fm];
      }
      if (*b < *f) {
        interleaved_at(*b, S, M, V, 1, &bm, &bc);
        int j = k + bc * S;
        br = j == J - 1 ? fdone[(size_t)j * M + bm]
                        : bdone[(size_t)(j + 1) * M + bm];
      }
      int fok = fr >= 0 && fr <= now, bok = br >= 0 && br <= now;
      int want_f = *f < warm || *last == ST_PASS_BW || *b >= *f;
      int kind = want_f ? (fok   ? ST_PASS_F
                           : bok ? ST_PASS_BW
                                 : -1)
                        : (bok   ? ST_PASS_BW
                           : fok ? ST_PASS_F
                                 : -1);
      if (kind < 0) {
        double t = fr > now ? fr : -1;
        if (br > now && (t < 0 || br < t)) t = br;
        if (t > now && (soonest < 0 || t < soonest)) soonest = t;
        continue;
      }
      st_sched_op *o = &s->ops[(size_t)k * 2 * total + len[k]++];
      o->kind = (unsigned char)kind;
      if (kind == ST_PASS_F) {
        mb = fm, ch = fc;
        fdone[(size_t)(k + ch * S) * M + mb] = now + 1;
        free_at[k] = now + 1;
        (*f)++;
      } else {
        mb = bm, ch = bc;
        bdone[(size_t)(k + ch * S) * M + mb] = now + 2;
        free_at[k] = now + 2;
        (*b)++;
      }
      o->chunk = (unsigned char)ch;
      o->mb = mb;
      *last = kind;
      left--;
      if (soonest < 0 || free_at[k] < soonest) soonest = free_at[k];
    }
    if (left > 0 && !(soonest > now)) {
      rc = st_error_set(err, ST_EUNSUPPORTED,
                        "schedule interleaved: no order found for %d "
                        "workers, %d micro-batches and %d chunks a worker; "
                        "a micro-batch count that is a multiple of %d has "
                        "one",
                        S, M, V, S);
      goto done;
    }
    now = soonest;
  }
  /* the per-worker ranges are already where start[] says */
  for (int k = 0; k <= S; k++) s->start[k] = k * 2 * total;
done:
  free(len);
  free(fdone);
  free(bdone);
  free(st);
  free(free_at);
  return rc;
}

static int kind_of(const char *name) {
  if (strcmp(name, "gpipe") == 0) return ST_SCHED_GPIPE;
  if (strcmp(name, "1f1b") == 0) return ST_SCHED_1F1B;
  if (strcmp(name, "interleaved") == 0) return ST_SCHED_INTERLEAVED;
  if (strcmp(name, "zb1p") == 0) return ST_SCHED_ZB1P;
  return -1;
}

int st_schedule_build(st_schedule *s, const char *name, int S, int M, int V,
                      st_error *err) {
  memset(s, 0, sizeof *s);
  int kind = kind_of(name);
  if (kind < 0)
    return st_error_set(err, ST_ECONFIG, "unknown pipeline schedule '%s'",
                        name);
  if (S < 1 || M < 1 || V < 1 || V > 255 ||
      (V > 1 && kind != ST_SCHED_INTERLEAVED))
    return st_error_set(err, ST_ECONFIG,
                        "schedule %s: %d workers, %d micro-batches, %d chunks "
                        "a worker is not a schedule",
                        name, S, M, V);
  s->kind = kind;
  s->S = S;
  s->M = M;
  s->V = V;
  s->split = kind == ST_SCHED_ZB1P;
  size_t per = (size_t)V * M * (s->split ? 3 : 2);
  s->ops = malloc((size_t)S * per * sizeof *s->ops);
  s->start = malloc(((size_t)S + 1) * sizeof *s->start);
  s->slots = calloc((size_t)S * V, sizeof *s->slots);
  if (!s->ops || !s->start || !s->slots) {
    st_schedule_free(s);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  int n = 0;
  for (int k = 0; k < S; k++) {
    s->start[k] = n;
    int w = S - 1 - k < M ? S - 1 - k : M, f = 0, b = 0, wd = 0;
    switch (kind) {
    case ST_SCHED_GPIPE:
      for (int m = 0; m < M; m++) put(s, &n, ST_PASS_F, 0, m);
      for (int m = 0; m < M; m++) put(s, &n, ST_PASS_BW, 0, m);
      break;
    case ST_SCHED_1F1B:
      for (; f < w; f++) put(s, &n, ST_PASS_F, 0, f);
      for (; b < M; b++) {
        if (f < M) put(s, &n, ST_PASS_F, 0, f++);
        put(s, &n, ST_PASS_BW, 0, b);
      }
      break;
    case ST_SCHED_ZB1P:
      for (; f < w; f++) put(s, &n, ST_PASS_F, 0, f);
      for (; b < M;) {
        if (f < M) put(s, &n, ST_PASS_F, 0, f++);
        put(s, &n, ST_PASS_B, 0, b++);
        if (b - wd > k) put(s, &n, ST_PASS_W, 0, wd++);
      }
      for (; wd < M; wd++) put(s, &n, ST_PASS_W, 0, wd);
      break;
    case ST_SCHED_INTERLEAVED:
      if (M % S) break; /* below, all workers at once */
      interleaved_fixed(s, &n, k);
      break;
    }
  }
  s->start[S] = n;
  s->n_ops = n;
  if (kind == ST_SCHED_INTERLEAVED && M % S) {
    if (interleaved_greedy(s, err)) {
      int code = err->code;
      st_schedule_free(s); /* as the allocation's failure above */
      return code;
    }
    s->n_ops = s->start[S]; /* every worker's ops, laid out by the greedy */
  }
  /* each chunk's activation slots: the most micro-batches between a
   * forward and the op that frees them (BW, or W when split) */
  for (int k = 0; k < S; k++) {
    int *held = calloc((size_t)V, sizeof *held);
    if (!held) {
      st_schedule_free(s);
      return st_error_set(err, ST_ENOMEM, "out of memory");
    }
    for (int i = s->start[k]; i < s->start[k + 1]; i++) {
      const st_sched_op *o = &s->ops[i];
      int j = k + o->chunk * S;
      if (o->kind == ST_PASS_F && ++held[o->chunk] > s->slots[j])
        s->slots[j] = held[o->chunk];
      if (o->kind == ST_PASS_BW || o->kind == ST_PASS_W) held[o->chunk]--;
    }
    free(held);
  }
  return 0;
}

void st_schedule_free(st_schedule *s) {
  free(s->ops);
  free(s->start);
  free(s->slots);
  memset(s, 0, sizeof *s);
}

const char *st_schedule_op_name(int kind) {
  static const char *const names[] = {"F", "B", "W", "BW"};
  return kind >= 0 && kind < 4 ? names[kind] : "?";
}

/* ------------------------------------------------ the emulated clock */

/* Ops are done in each worker's order; an op starts when its worker is
 * free and what it needs is done: F of stage j needs F of stage j - 1, the
 * backward of stage j needs the input gradient (B or BW) of stage j + 1,
 * or, at the last stage, its own F; W needs its B. */
int st_schedule_emulate(const st_schedule *s, const double cost[4],
                        double *begin, double *end, double *makespan, char *why,
                        size_t why_len) {
  int S = s->S, M = s->M, V = s->V, J = S * V;
  /* when each (stage, micro-batch) had its forward / input gradient */
  double *fdone = malloc((size_t)J * M * sizeof *fdone);
  double *bdone = malloc((size_t)J * M * sizeof *bdone);
  double *free_at = calloc((size_t)S, sizeof *free_at);
  int *next = malloc((size_t)S * sizeof *next);
  int rc = 0;
  if (!fdone || !bdone || !free_at || !next) {
    snprintf(why, why_len, "out of memory");
    rc = -1;
    goto done;
  }
  for (int i = 0; i < J * M; i++) fdone[i] = bdone[i] = -1;
  for (int k = 0; k < S; k++) next[k] = s->start[k];
  double last = 0;
  for (int left = s->n_ops; left > 0;) {
    int moved = 0;
    for (int k = 0; k < S; k++)
      while (next[k] < s->start[k + 1]) {
        int i = next[k];
        const st_sched_op *o = &s->ops[i];
        int j = k + o->chunk * S, m = o->mb;
        double ready;
        if (o->kind == ST_PASS_F)
          ready = j == 0 ? 0 : fdone[(size_t)(j - 1) * M + m];
        else if (o->kind == ST_PASS_W)
          ready = bdone[(size_t)j * M + m];
        else
          ready = j == J - 1 ? fdone[(size_t)j * M + m]
                             : bdone[(size_t)(j + 1) * M + m];
        if (ready < 0) break; /* not yet: another worker first */
        double t0 = ready > free_at[k] ? ready : free_at[k];
        double t1 = t0 + cost[o->kind];
        if (o->kind == ST_PASS_F) {
          if (fdone[(size_t)j * M + m] >= 0) {
            snprintf(why, why_len, "worker %d: F of micro-batch %d twice", k,
                     m);
            rc = -1;
            goto done;
          }
          fdone[(size_t)j * M + m] = t1;
        } else if (o->kind != ST_PASS_W) {
          if (fdone[(size_t)j * M + m] < 0) {
            snprintf(why, why_len,
                     "worker %d: backward of micro-batch %d before its "
                     "forward",
                     k, m);
            rc = -1;
            goto done;
          }
          bdone[(size_t)j * M + m] = t1;
        }
        if (begin) begin[i] = t0;
        if (end) end[i] = t1;
        free_at[k] = t1;
        if (t1 > last) last = t1;
        next[k]++;
        left--;
        moved = 1;
      }
    if (!moved && left > 0) {
      int k = 0;
      while (next[k] >= s->start[k + 1]) k++;
      const st_sched_op *o = &s->ops[next[k]];
      snprintf(why, why_len,
               "deadlock: worker %d waits at %s of micro-batch %d, chunk %d", k,
               st_schedule_op_name(o->kind), o->mb, o->chunk);
      rc = -1;
      goto done;
    }
  }
  if (makespan) *makespan = last;
done:
  free(fdone);
  free(bdone);
  free(free_at);
  free(next);
  return rc;
}

double st_schedule_formula(const char *name, int S, int M, int V) {
  st_schedule s;
  st_error err = {0};
  if (st_schedule_build(&s, name, S, M, V, &err)) return 0;
  double cost[4] = {1.0 / V, 1.0 / V, 1.0 / V, 2.0 / V}, span = 0;
  char why[160];
  int rc = st_schedule_emulate(&s, cost, NULL, NULL, &span, why, sizeof why);
  st_schedule_free(&s);
  return rc || span <= 0 ? 0 : 3.0 * M / span;
}

/* ------------------------------------------------------ the picture */

/* An SVG of the schedule on the emulated clock with F, B and W of one
 * cost each (BW two): one row per worker, a box per op labelled with its
 * micro-batch (and chunk), idle time left blank, in the style of the
 * published schedule figures. */
int st_schedule_svg(const st_schedule *s, const char *title, FILE *f) {
  const double cost[4] = {1, 1, 1, 2};
  double *begin = malloc((size_t)s->n_ops * sizeof *begin);
  double *end = malloc((size_t)s->n_ops * sizeof *end);
  double span = 0;
  char why[160];
  if (!begin || !end ||
      st_schedule_emulate(s, cost, begin, end, &span, why, sizeof why)) {
    free(begin);
    free(end);
    return -1;
  }
  const double cell = 22, row = 28, left = 90, top = 46;
  double width = left + span * cell + 20, height = top + s->S * row + 56;
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
          "height=\"%.0f\" font-family=\"sans-serif\" font-size=\"10\">\n",
          width, height);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  double idle = 0;
  for (int k = 0; k < s->S; k++) {
    double busy = 0;
    for (int i = s->start[k]; i < s->start[k + 1]; i++)
      busy += end[i] - begin[i];
    idle += span - busy;
  }
  char chunks[48] = "";
  if (s->V > 1) snprintf(chunks, sizeof chunks, ", %d chunks a worker", s->V);
  fprintf(f,
          "<text x=\"8\" y=\"18\" font-size=\"13\">%s: %d workers, %d "
          "micro-batches%s; F, B, W one tick each, a whole backward two; "
          "bubble %.1f%% (%.0f idle "
          "ticks of %.0f)</text>\n",
          title, s->S, s->M, chunks, 100.0 * idle / (span * s->S), idle,
          span * s->S);
  static const char *const fill[4] = {"#4e79a7", "#f28e2b", "#59a14f",
                                      "#e15759"};
  for (int k = 0; k < s->S; k++) {
    double y = top + k * row;
    fprintf(f, "<text x=\"8\" y=\"%.0f\">worker %d</text>\n", y + 16, k);
    fprintf(f,
            "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
            "fill=\"#eeeeee\"/>\n",
            left, y, span * cell, row - 4);
    for (int i = s->start[k]; i < s->start[k + 1]; i++) {
      const st_sched_op *o = &s->ops[i];
      double x = left + begin[i] * cell, w = (end[i] - begin[i]) * cell;
      fprintf(f,
              "<rect x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" "
              "fill=\"%s\" fill-opacity=\"%.2f\" stroke=\"white\"/>\n",
              x, y, w, row - 4, fill[o->kind],
              1.0 - 0.35 * o->chunk / (s->V > 1 ? s->V - 1 : 1));
      if (s->V > 1)
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.0f\" fill=\"white\" "
                "text-anchor=\"middle\">%d.%d</text>\n",
                x + w / 2, y + 16, o->mb, o->chunk);
      else
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.0f\" fill=\"white\" "
                "text-anchor=\"middle\">%d</text>\n",
                x + w / 2, y + 16, o->mb);
    }
  }
  double ly = top + s->S * row + 20;
  static const char *const label[4] = {"F forward", "B input gradient",
                                       "W weight gradient",
                                       "BW whole backward"};
  for (int kind = 0, at = 0; kind < 4; kind++) {
    int shown = kind == ST_PASS_F || (kind == ST_PASS_BW) != s->split;
    if (!shown) continue;
    fprintf(f,
            "<rect x=\"%d\" y=\"%.0f\" width=\"14\" height=\"14\" "
            "fill=\"%s\"/><text x=\"%d\" y=\"%.0f\">%s</text>\n",
            90 + at * 150, ly, fill[kind], 108 + at * 150, ly + 11,
            label[kind]);
    at++;
  }
  fprintf(f,
          "<text x=\"8\" y=\"%.0f\">blank: idle. Labels: micro-batch%s."
          "</text>\n</svg>\n",
          ly + 30, s->V > 1 ? ".chunk" : "");
  free(begin);
  free(end);
  return ferror(f) ? -1 : 0;
}

int st_schedule_write_svg(const char *name, int S, int M, int V,
                          const char *path, st_error *err) {
  st_schedule s;
  int rc = st_schedule_build(&s, name, S, M, V, err);
  if (rc) return rc;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    st_schedule_free(&s);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  if (st_schedule_svg(&s, name, f)) {
    fclose(f);
    free(text);
    st_schedule_free(&s);
    return st_error_set(err, ST_EIO, "%s: cannot draw the schedule", path);
  }
  st_schedule_free(&s);
  return st_write_stream_atomic(f, &text, &len, path, err);
}
