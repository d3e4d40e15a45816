/*
 * test_schedule.c — the fill-and-drain schedules as pure functions
 * (src/runtime/schedule.c), for S = 1..8 workers, M = 1..16 micro-batches
 * and V = 2, 3 chunks a worker (interleaved), against the published
 * schedules' properties, counted here from the op lists themselves:
 *  - every stage runs each micro-batch's forward once and its backward
 *    once (BW, or B then W), forwards and backwards in micro-batch order
 *    (the sequential mode's gradient order);
 *  - on an emulated clock no op starts before what it needs and nothing
 *    deadlocks; the emulator is checked on lists made wrong on purpose;
 *  - in flight: gpipe holds M, 1f1b min(M, S - k) at worker k; zb1p the
 *    same between F and B and at most min(M, S) between F and W (1f1b's
 *    peak, at worker 0); the slots the runtime allocates are these counts;
 *  - idle ticks with F, B and W of one tick each (BW two; a chunk's ops
 *    1/V of that): gpipe and 1f1b 3(S-1) a worker, zb1p S - 1 for M >= S
 *    (Qi et al.: (S-1)(F+B-W)), interleaved 3(S-1)/V for M a multiple of
 *    S (Narayanan et al. SC'21: the bubble over V); zb1p and interleaved
 *    never slower than 1f1b;
 *  - a known small case op for op (ZB-H1 with S = 4, M = 8 as drawn in the
 *    paper's figure 3, and 1f1b), and interleaved with M not a multiple of
 *    S (the emulated-clock order) worked out by hand for three small cases
 *    that turn on each worker's warm-up count.
 */
#include "harness.h"
#include "strata.h"

#include "../../src/runtime/runtime.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"gpipe", "1f1b", "interleaved", "zb1p"};

/* Op counts and orders per stage, and the in-flight counts. */
static void check_lists(const st_schedule *s, const char *what) {
  int S = s->S, M = s->M, V = s->V, bad = 0;
  for (int k = 0; k < S && !bad; k++) {
    int nf[8] = {0}, nb[8] = {0}, nw[8] = {0}, most_fb = 0, most_fw = 0;
    for (int i = s->start[k]; i < s->start[k + 1]; i++) {
      const st_sched_op *o = &s->ops[i];
      int v = o->chunk;
      if (v >= V) {
        bad = 1;
        break;
      }
      if (o->kind == ST_PASS_F) bad |= o->mb != nf[v]++;
      if (o->kind == ST_PASS_B || o->kind == ST_PASS_BW)
        bad |= o->mb != nb[v]++ || nb[v] > nf[v];
      if (o->kind == ST_PASS_W) bad |= o->mb != nw[v]++ || nw[v] > nb[v];
      if (o->kind == ST_PASS_BW) nw[v]++;
      if (o->kind != ST_PASS_F) bad |= (o->kind == ST_PASS_BW) == s->split;
      int fb = 0, fw = 0;
      for (int c = 0; c < V; c++) fb += nf[c] - nb[c], fw += nf[c] - nw[c];
      if (fb > most_fb) most_fb = fb;
      if (fw > most_fw) most_fw = fw;
      /* each chunk's slots cover what it holds */
      for (int c = 0; c < V; c++) bad |= nf[c] - nw[c] > s->slots[k + c * S];
    }
    for (int c = 0; c < V; c++) bad |= nf[c] != M || nb[c] != M || nw[c] != M;
    CHECK(!bad, "%s: worker %d: an op missing, repeated or out of order", what,
          k);
    int mk = S - k < M ? S - k : M, ms = S < M ? S : M;
    if (s->kind == ST_SCHED_GPIPE)
      CHECK(most_fb == M && s->slots[k] == M, "%s: worker %d holds %d, want %d",
            what, k, most_fb, M);
    if (s->kind == ST_SCHED_1F1B)
      CHECK(most_fb == mk && s->slots[k] == mk,
            "%s: worker %d holds %d (slots %d), want %d", what, k, most_fb,
            s->slots[k], mk);
    if (s->kind == ST_SCHED_ZB1P) {
      CHECK(most_fb == mk, "%s: worker %d holds %d between F and B, want %d",
            what, k, most_fb, mk);
      CHECK(most_fw <= ms && s->slots[k] == most_fw,
            "%s: worker %d holds %d between F and W (slots %d), want <= %d",
            what, k, most_fw, s->slots[k], ms);
    }
  }
}

/* Idle ticks per worker on the unit clock (every worker is busy 3M). */
static double idle_per_worker(const st_schedule *s, double *makespan) {
  double V = s->V;
  double cost[4] = {1 / V, 1 / V, 1 / V, 2 / V};
  char why[160] = "";
  double span = -1;
  int rc = st_schedule_emulate(s, cost, NULL, NULL, &span, why, sizeof why);
  CHECK(rc == 0, "%s S=%d M=%d V=%d: %s", names[s->kind], s->S, s->M, s->V,
        why);
  *makespan = span;
  return span - 3.0 * s->M;
}

static void test_all(void) {
  int checked = 0;
  for (int kind = 0; kind < 4; kind++)
    for (int S = 1; S <= 8; S++)
      for (int M = 1; M <= 16; M++)
        for (int V = 1; V <= 3; V++) {
          if ((V > 1) != (kind == ST_SCHED_INTERLEAVED) && V > 1) continue;
          /* interleaved with V = 1 too: a valid, if pointless, order */
          st_schedule s;
          st_error err = {0};
          char what[64];
          snprintf(what, sizeof what, "%s S=%d M=%d V=%d", names[kind], S, M,
                   V);
          if (st_schedule_build(&s, names[kind], S, M, V, &err)) {
            CHECK(0, "%s: %s", what, err.msg);
            continue;
          }
          check_lists(&s, what);
          /* the ops counted where the picture and the emulator read them
           * (the greedy interleaved order of M % S != 0 once left it 0) */
          int per = V * M * (kind == ST_SCHED_ZB1P ? 3 : 2);
          CHECK(s.n_ops == s.start[S] && s.n_ops == S * per,
                "%s: n_ops %d, start[S] %d, want %d", what, s.n_ops, s.start[S],
                S * per);
          double span, idle = idle_per_worker(&s, &span);
          double want = -1;
          if (kind == ST_SCHED_GPIPE || kind == ST_SCHED_1F1B)
            want = 3.0 * (S - 1);
          if (kind == ST_SCHED_ZB1P && M >= S) want = S - 1;
          if (kind == ST_SCHED_INTERLEAVED && M % S == 0)
            want = 3.0 * (S - 1) / V;
          if (want >= 0)
            CHECK(fabs(idle - want) < 1e-9,
                  "%s: %.3f idle ticks a worker, the formula says %.3f", what,
                  idle, want);
          /* never worse than 1f1b */
          st_schedule base;
          if (!st_schedule_build(&base, "1f1b", S, M, 1, &err)) {
            double bspan, bidle = idle_per_worker(&base, &bspan);
            CHECK(idle <= bidle + 1e-9, "%s: %.3f idle ticks, 1f1b %.3f", what,
                  idle, bidle);
            st_schedule_free(&base);
          }
          st_schedule_free(&s);
          checked++;
        }
  CHECK(checked == 4 * 8 * 16 + 2 * 8 * 16, "%d schedules checked", checked);
}

/* Op strings of worker k, e.g. "F0 F1 B0 W0". */
static void ops_of(const st_schedule *s, int k, char *out, size_t cap) {
  out[0] = 0;
  for (int i = s->start[k]; i < s->start[k + 1]; i++) {
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "%s%s%d", i > s->start[k] ? " " : "",
             st_schedule_op_name(s->ops[i].kind), s->ops[i].mb);
  }
}

/* ZB-H1 as Qi et al. draw it (figure 3, four workers, eight
 * micro-batches): worker k starts its Ws after k + 1 Bs, one W after each
 * B from then on, and its last k Ws in the drain. */
static void test_known(void) {
  st_schedule s;
  st_error err = {0};
  char got[512];
  CHECK(st_schedule_build(&s, "zb1p", 4, 8, 1, &err) == 0, "%s", err.msg);
  const char *want[4] = {
      "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7",
      "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7",
      "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7",
      "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 "
      "W7"};
  for (int k = 0; k < 4; k++) {
    ops_of(&s, k, got, sizeof got);
    CHECK(strcmp(got, want[k]) == 0, "zb1p worker %d: %s", k, got);
  }
  st_schedule_free(&s);
  CHECK(st_schedule_build(&s, "1f1b", 3, 4, 1, &err) == 0, "%s", err.msg);
  const char *w1[3] = {"F0 F1 F2 BW0 F3 BW1 BW2 BW3",
                       "F0 F1 BW0 F2 BW1 F3 BW2 BW3",
                       "F0 BW0 F1 BW1 F2 BW2 F3 BW3"};
  for (int k = 0; k < 3; k++) {
    ops_of(&s, k, got, sizeof got);
    CHECK(strcmp(got, w1[k]) == 0, "1f1b worker %d: %s", k, got);
  }
  st_schedule_free(&s);
  /* interleaved, 2 workers, 4 micro-batches, 2 chunks: worker 0 warms up
   * with 2 (S-1) + (V-1) S = 4 forwards: micro-batches 0, 1 on chunk 0,
   * then 0, 1 on chunk 1 */
  CHECK(st_schedule_build(&s, "interleaved", 2, 4, 2, &err) == 0, "%s",
        err.msg);
  int chunks[] = {0, 0, 1, 1}, mbs[] = {0, 1, 0, 1};
  for (int i = 0; i < 4; i++)
    CHECK(s.ops[i].kind == ST_PASS_F && s.ops[i].chunk == chunks[i] &&
              s.ops[i].mb == mbs[i],
          "interleaved worker 0 op %d: %s%d chunk %d", i,
          st_schedule_op_name(s.ops[i].kind), s.ops[i].mb, s.ops[i].chunk);
  /* its first backward is micro-batch 0 on the last chunk */
  CHECK(s.ops[5].kind == ST_PASS_BW && s.ops[5].chunk == 1 && s.ops[5].mb == 0,
        "interleaved worker 0: op 5 is %s%d chunk %d",
        st_schedule_op_name(s.ops[5].kind), s.ops[5].mb, s.ops[5].chunk);
  st_schedule_free(&s);
}

/* Op strings of worker k with chunks, e.g. "F0c0 F1c0 BW0c1". */
static void chunk_ops_of(const st_schedule *s, int k, char *out, size_t cap) {
  out[0] = 0;
  for (int i = s->start[k]; i < s->start[k + 1]; i++) {
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "%s%s%dc%d", i > s->start[k] ? " " : "",
             st_schedule_op_name(s->ops[i].kind), s->ops[i].mb,
             s->ops[i].chunk);
  }
}

static void check_interleaved(int S, int M, int V, const char *const *want) {
  st_schedule s;
  st_error err = {0};
  char got[512];
  if (st_schedule_build(&s, "interleaved", S, M, V, &err)) {
    CHECK(0, "interleaved S=%d M=%d V=%d: %s", S, M, V, err.msg);
    return;
  }
  for (int k = 0; k < S; k++) {
    chunk_ops_of(&s, k, got, sizeof got);
    CHECK(strcmp(got, want[k]) == 0,
          "interleaved S=%d M=%d V=%d worker %d:\n  got  %s\n  want %s", S, M,
          V, k, got, want[k]);
  }
  st_schedule_free(&s);
}

/* Interleaved with M not a multiple of S, worked out by hand from the rule
 * (schedule.c, docs/modes.md): on a clock of F one tick and BW two, each
 * free worker runs the op Megatron's order wants next (w = min(V M,
 * 2(S-1-k) + (V-1) S) forwards, then alternately B and F), or the other
 * one when that cannot run yet. Forward order: micro-batches in groups of
 * S (the last one partial), chunk 0 of the group, then chunk 1; backward
 * the same, chunks reversed. Each case hinges on the warm-up count w. */
static void test_interleaved_partial(void) {
  /* S = 2, M = 3, V = 2: forwards F0c0 F1c0 F0c1 F1c1 F2c0 F2c1, w = 4
   * and 2. Worker 1, past its warm-up at t = 3, wants BW0c1 but it waits
   * for its own F0c1, so it runs F0c1; BW0c1 at t = 4. Worker 0 at t = 4
   * wants BW0c1 (not before t = 6): runs F2c0; at t = 5 neither can run;
   * t = 6 BW0c1; at t = 9 it wants F2c1, which waits for worker 1's F2c0
   * (9..10): BW1c1, ... A warm-up of 2 more (2(S-k) + (V-1) S) has worker 0 run
   * F2c1 before BW1c1 and worker 1 F1c1 before BW0c1. */
  const char *s2m3[2] = {
      "F0c0 F1c0 F0c1 F1c1 F2c0 BW0c1 BW1c1 F2c1 BW0c0 BW1c0 BW2c1 BW2c0",
      "F0c0 F1c0 F0c1 BW0c1 F1c1 BW1c1 F2c0 BW0c0 F2c1 BW1c0 BW2c1 BW2c0"};
  check_interleaved(2, 3, 2, s2m3);
  /* S = 3, M = 2, V = 2 (one partial group): w = 4, 4, 3. Worker 2 has run
   * F0c0 F1c0 F0c1 (t = 2..3, 3..4, 5..6) when at t = 6 both BW0c1 (the
   * last stage: its own F0c1) and F1c1 (worker 1's F1c1 done at 6) can
   * run; past its warm-up of 3 it takes BW0c1. Workers 0 and 1 run all four
   * forwards, then the backwards. One more forward of warm-up (w = 4 at
   * worker 2) puts F1c1 first. */
  const char *s3m2[3] = {"F0c0 F1c0 F0c1 F1c1 BW0c1 BW1c1 BW0c0 BW1c0",
                         "F0c0 F1c0 F0c1 F1c1 BW0c1 BW1c1 BW0c0 BW1c0",
                         "F0c0 F1c0 F0c1 BW0c1 F1c1 BW1c1 BW0c0 BW1c0"};
  check_interleaved(3, 2, 2, s3m2);
  /* S = 3, M = 2, V = 3: w = min(6, 10), min(6, 8), min(6, 6): every worker
   * runs its six forwards, then its six backwards. At t = 9 worker 2 has
   * run five forwards (F0c2 at 8..9) and both BW0c2 (its own F0c2) and
   * F1c2 (worker 1's, done at 9) can run: its warm-up of 6 takes F1c2. One
   * forward less (w = 5), or no (V-1) S term (w = 0), takes BW0c2. */
  const char *all_f = "F0c0 F1c0 F0c1 F1c1 F0c2 F1c2 BW0c2 BW1c2 BW0c1 "
                      "BW1c1 BW0c0 BW1c0";
  const char *s3m2v3[3] = {all_f, all_f, all_f};
  check_interleaved(3, 2, 3, s3m2v3);
  /* The clock's BW of two ticks decides S = 2, M = 5, V = 2 (w = 4 and 2;
   * stages 0, 1 are chunk 0 of workers 0, 1, stages 2, 3 their chunk 1).
   * Worker 0 runs F0c0 F1c0 F0c1 F1c1 at 0..4, worker 1 F0c0 F1c0 at 1..3,
   * then (wanting BW0c1, which waits for its own F0c1) F0c1 at 3..4 and
   * BW0c1 at 4..6. Worker 0, past its warm-up at 4, wants BW0c1, which
   * waits for worker 1's (6): F2c0 at 4..5; at 5 still not: F3c0 at
   * 5..6; then BW0c1. On a clock of BW one tick, worker 1's BW0c1 ends at
   * 5 and worker 0 runs BW0c1 before F3c0. */
  st_schedule s;
  st_error err = {0};
  char got[512];
  const char *want = "F0c0 F1c0 F0c1 F1c1 F2c0 F3c0 BW0c1 ";
  if (st_schedule_build(&s, "interleaved", 2, 5, 2, &err) == 0) {
    chunk_ops_of(&s, 0, got, sizeof got);
    CHECK(strncmp(got, want, strlen(want)) == 0,
          "interleaved S=2 M=5 V=2 worker 0:\n  got  %s\n  want %s...", got,
          want);
    st_schedule_free(&s);
  } else {
    CHECK(0, "interleaved S=2 M=5 V=2: %s", err.msg);
  }
}

/* The emulator catches what a wrong list does: a backward before its
 * forward, a W before its B, and two workers each waiting for the other. */
static void test_emulator(void) {
  st_schedule s;
  st_error err = {0};
  const double unit[4] = {1, 1, 1, 2};
  char why[160];
  double span;
  CHECK(st_schedule_build(&s, "1f1b", 2, 2, 1, &err) == 0, "%s", err.msg);
  CHECK(st_schedule_emulate(&s, unit, NULL, NULL, &span, why, sizeof why) ==
                0 &&
            span == 3 * (2 + 2 - 1),
        "1f1b S=2 M=2: makespan %.1f, want 9", span);
  /* worker 1 runs BW0 before F0 */
  st_sched_op t = s.ops[s.start[1]];
  s.ops[s.start[1]] = s.ops[s.start[1] + 1];
  s.ops[s.start[1] + 1] = t;
  CHECK(st_schedule_emulate(&s, unit, NULL, NULL, &span, why, sizeof why) != 0,
        "a backward before its forward was not caught");
  st_schedule_free(&s);
  /* worker 0 runs all backwards before its forwards: it waits for a
   * gradient that needs its own forward */
  CHECK(st_schedule_build(&s, "gpipe", 2, 2, 1, &err) == 0, "%s", err.msg);
  st_sched_op *o = s.ops + s.start[0];
  st_sched_op f0 = o[0], f1 = o[1];
  o[0] = o[2], o[1] = o[3], o[2] = f0, o[3] = f1;
  CHECK(st_schedule_emulate(&s, unit, NULL, NULL, &span, why, sizeof why) !=
                0 &&
            strstr(why, "deadlock"),
        "a deadlock was not caught (%s)", why);
  st_schedule_free(&s);
  /* a split backward's W before its own B: it needs the B's weight
   * gradient inputs, which do not exist yet (zb1p S=1 M=1: F0 B0 W0) */
  CHECK(st_schedule_build(&s, "zb1p", 1, 1, 1, &err) == 0, "%s", err.msg);
  o = s.ops;
  CHECK(s.n_ops == 3 && o[1].kind == ST_PASS_B && o[2].kind == ST_PASS_W,
        "zb1p S=1 M=1 is F0 B0 W0");
  st_sched_op b0 = o[1];
  o[1] = o[2], o[2] = b0;
  CHECK(st_schedule_emulate(&s, unit, NULL, NULL, &span, why, sizeof why) != 0,
        "a W before its B was not caught");
  st_schedule_free(&s);
  CHECK(st_schedule_build(&s, "1f1b", 2, 2, 2, &err) != 0,
        "1f1b with 2 chunks a worker accepted");
  CHECK(st_schedule_build(&s, "zb2p", 2, 2, 1, &err) != 0 &&
            strstr(err.msg, "zb2p"),
        "an unknown schedule accepted");
}

/* The picture: one row per worker and a box per op. */
static void test_svg(void) {
  st_schedule s;
  st_error err = {0};
  CHECK(st_schedule_build(&s, "zb1p", 3, 4, 1, &err) == 0, "%s", err.msg);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK(f && st_schedule_svg(&s, "zb1p", f) == 0, "svg");
  fclose(f);
  int rows = 0, boxes = 0;
  for (const char *p = buf; (p = strstr(p, "worker ")); p++) rows++;
  for (const char *p = buf; (p = strstr(p, "stroke=\"white\"")); p++) boxes++;
  CHECK(rows == 3 && boxes == s.n_ops, "svg: %d rows, %d boxes (want 3, %d)",
        rows, boxes, s.n_ops);
  /* 3 workers, 4 micro-batches: makespan 3*4 + 2 = 14 ticks, 2 idle each */
  CHECK(strstr(buf, "(6 idle ticks of 42)") != NULL, "svg title: %.200s", buf);
  free(buf);
  st_schedule_free(&s);
  /* interleaved with a partial group (M = 3 of 2 workers): every op drawn */
  CHECK(st_schedule_build(&s, "interleaved", 2, 3, 2, &err) == 0, "%s",
        err.msg);
  buf = NULL;
  f = open_memstream(&buf, &len);
  CHECK(f && st_schedule_svg(&s, "interleaved", f) == 0, "svg interleaved");
  fclose(f);
  boxes = 0;
  for (const char *p = buf; (p = strstr(p, "stroke=\"white\"")); p++) boxes++;
  CHECK(boxes == 24 && s.n_ops == 24,
        "svg interleaved M=3: %d boxes, n_ops %d (want 24)", boxes, s.n_ops);
  free(buf);
  st_schedule_free(&s);
}

int main(void) {
  test_all();
  test_known();
  test_interleaved_partial();
  test_emulator();
  test_svg();
  TH_DONE();
}
