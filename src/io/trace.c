/*
 * trace.c — Chrome trace-event JSON (the "X" complete-event form, times in
 * microseconds; Perfetto and chrome://tracing read it). Events sit in a
 * fixed array per track, filled by the track's own thread; the file is
 * written once, at the end, atomically.
 */
#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct event {
  double t0, t1;
  int64_t step;
  int32_t index;
  int32_t kind;
} event;

typedef struct track {
  event *ev;
  int n;
  int64_t dropped;
  char name[48];
} trace_track;

struct st_trace {
  int tracks, cap;
  double origin;
  trace_track *t;
};

static const char *const kind_names[ST_TRACE_KINDS] = {
    "forward", "backward", "update",     "send",
    "recv",    "idle",     "all-reduce", "weight-grad",
};

int st_trace_create(st_trace **out, int tracks, int events_per_track,
                    st_error *err) {
  *out = NULL;
  st_trace *t = calloc(1, sizeof *t);
  if (t) t->t = calloc((size_t)tracks, sizeof *t->t);
  int ok = t && t->t;
  for (int i = 0; ok && i < tracks; i++) {
    t->t[i].ev = malloc((size_t)events_per_track * sizeof(event));
    ok = t->t[i].ev != NULL;
    snprintf(t->t[i].name, sizeof t->t[i].name, "track %d", i);
  }
  if (!ok) {
    if (t) t->tracks = tracks;
    st_trace_destroy(t);
    return st_error_set(err, ST_ENOMEM,
                        "out of memory for a trace of %d tracks x %d events",
                        tracks, events_per_track);
  }
  t->tracks = tracks;
  t->cap = events_per_track;
  t->origin = st_now();
  *out = t;
  return 0;
}

void st_trace_destroy(st_trace *t) {
  if (!t) return;
  for (int i = 0; t->t && i < t->tracks; i++) free(t->t[i].ev);
  free(t->t);
  free(t);
}

void st_trace_name(st_trace *t, int track, const char *name) {
  if (t && track >= 0 && track < t->tracks)
    snprintf(t->t[track].name, sizeof t->t[track].name, "%s", name);
}

void st_trace_add(st_trace *t, int track, st_trace_kind kind, int64_t step,
                  int index, double t0, double t1) {
  if (!t || track < 0 || track >= t->tracks) return;
  trace_track *tr = &t->t[track];
  if (tr->n == t->cap) {
    tr->dropped++;
    return;
  }
  tr->ev[tr->n++] = (event){t0, t1, step, index, (int32_t)kind};
}

int64_t st_trace_dropped(const st_trace *t) {
  int64_t n = 0;
  for (int i = 0; t && i < t->tracks; i++) n += t->t[i].dropped;
  return n;
}

/* A track name as a JSON string body (names are ours, but stay safe). */
static void json_name(FILE *f, const char *s) {
  for (; *s; s++)
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s >= 0x20)
      fputc(*s, f);
}

int st_trace_write(const st_trace *t, const char *path, st_error *err) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "out of memory for the trace");
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
  fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\","
             "\"args\":{\"name\":\"strata\"}}");
  for (int i = 0; i < t->tracks; i++) {
    fprintf(f,
            ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\","
            "\"args\":{\"name\":\"",
            i);
    json_name(f, t->t[i].name);
    fprintf(f,
            "\"}},\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
            "\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
            i, i);
  }
  for (int i = 0; i < t->tracks; i++)
    for (int e = 0; e < t->t[i].n; e++) {
      const event *ev = &t->t[i].ev[e];
      double ts = (ev->t0 - t->origin) * 1e6, dur = (ev->t1 - ev->t0) * 1e6;
      if (dur < 0) dur = 0;
      fprintf(f,
              ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"name\":\"%s\","
              "\"ts\":%.3f,\"dur\":%.3f,\"args\":{",
              i, kind_names[ev->kind], ts, dur);
      int any = 0;
      if (ev->step >= 0)
        fprintf(f, "\"step\":%lld", (long long)ev->step), any = 1;
      if (ev->index >= 0)
        fprintf(f, "%s\"%s\":%d", any ? "," : "",
                ev->kind == ST_TRACE_UPDATE ? "block" : "micro_batch",
                ev->index);
      fputs("}}", f);
    }
  fprintf(f,
          "\n],\"otherData\":{\"dropped_events\":%lld,"
          "\"events_per_track\":%d}}\n",
          (long long)st_trace_dropped(t), t->cap);
  return st_write_stream_atomic(f, &text, &len, path, err);
}
