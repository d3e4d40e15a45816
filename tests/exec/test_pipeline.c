/*
 * test_pipeline.c — the pipeline mode's contract (src/exec/pipeline.c):
 *  - gpipe and 1f1b give weights (and report losses) bit-identical to the
 *    sequential mode after 20 steps at the same batch and micro-batch split,
 * for an MLP, a CNN (residual blocks, group norm, dropout) and a GPT (tied
 * head, dropout), with S in {2, 3, 4} stages and M in {1, 2, 4, 8}
 * micro-batches, each case run twice (the threads' timing differs from run to
 * run; the bits may not); configs/gpt_tiny.yaml itself in three cases;
 *  - 1f1b holds at most S - s micro-batches in flight at stage s, gpipe M
 *    (the runtime's own counters);
 *  - a non-finite loss stops the step before any weight changes;
 *  - 10,000 steps with random pauses in the stages give the same weights
 *    as without (no deadlock, no lost or reordered message);
 *  - block_sequential (segments of blocks, each pipelined inside) gives the
 *    same bits for the three models, S in {2, 3, 4}, M in {1, 2, 4, 8},
 *    segments of S blocks and of half the model, each case twice;
 *  - the stages are the compiler's plan (its cut points on this machine's
 *    cores), and the runtime's busy times and trace cover every stage;
 *  - impossible settings fail before any work starts.
 */
#include "harness.h"
#include "models.h"
#include "strata.h"
#include "../../src/exec/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_equivalence(const char *what, const st_config *base) {
  const int Ms[] = {1, 2, 4, 8};
  const char *schedules[] = {"gpipe", "1f1b"};
  for (int mi = 0; mi < 4; mi++) {
    st_config seq = *base;
    seq.train.batch = BATCH;
    seq.execution.micro_batch = BATCH / Ms[mi];
    size_t n = 0, np;
    float *want = train(&seq, &n, NULL);
    if (!want) return;
    double want_loss[STEPS];
    memcpy(want_loss, train_losses, sizeof want_loss);
    for (int S = 2; S <= 4; S++)
      for (int sc = 0; sc < 2; sc++)
        for (int rep = 0; rep < 2; rep++) {
          st_config c = seq;
          snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
          snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s",
                   schedules[sc]);
          c.execution.stages = S;
          st_trainer *t = NULL;
          float *got = train(&c, &np, &t);
          if (!got) continue;
          CHECK(np == n && memcmp(got, want, n * sizeof *got) == 0,
                "%s: %s S=%d M=%d run %d: weights differ from sequential", what,
                schedules[sc], S, Ms[mi], rep);
          CHECK(memcmp(train_losses, want_loss, sizeof want_loss) == 0,
                "%s: %s S=%d M=%d run %d: losses differ from sequential", what,
                schedules[sc], S, Ms[mi], rep);
          /* the runtime's own in-flight counters */
          void *state = st_trainer_exec_state(t);
          int worst = 0;
          for (int s = 0; s < S; s++) {
            int held = st_pipeline_held(state, s);
            int bound = sc == 0 ? Ms[mi] : (S - s < Ms[mi] ? S - s : Ms[mi]);
            if (held != bound) worst = 1;
            CHECK(held == bound,
                  "%s: %s S=%d M=%d: stage %d held %d micro-batches, want %d",
                  what, schedules[sc], S, Ms[mi], s, held, bound);
          }
          (void)worst;
          free(got);
          st_trainer_destroy(t);
        }
    free(want);
  }
}

/* interleaved and zb1p against sequential, bit for bit, over the issue's
 * grid: S stage workers, M micro-batches (multiples of S and not: the
 * interleaved order of a partial group comes from the emulated clock),
 * V = 2 and 3 chunks a worker; the in-flight counters against the
 * schedule's slots (zb1p: held from F to W). `stages` lists S, `ms` M;
 * a case needing more blocks than the model has is skipped. */
static void test_new_schedules(const char *what, const st_config *base,
                               const int *stages, int n_stages, const int *ms,
                               int n_ms) {
  int cases = 0;
  for (int mi = 0; mi < n_ms; mi++) {
    st_config seq = *base;
    seq.train.batch = 2 * ms[mi]; /* micro-batches of 2 */
    seq.execution.micro_batch = seq.train.batch / ms[mi];
    size_t n = 0, np;
    st_trainer *t0 = NULL;
    float *want = train(&seq, &n, &t0);
    if (!want) return;
    double want_loss[STEPS];
    memcpy(want_loss, train_losses, sizeof want_loss);
    int blocks = st_trainer_model(t0)->n_blocks;
    st_trainer_destroy(t0);
    for (int si = 0; si < n_stages; si++)
      for (int V = 1; V <= 3; V++) {
        int S = stages[si];
        if (S * V > blocks) continue;
        st_config c = seq;
        snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
        snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s",
                 V == 1 ? "zb1p" : "interleaved");
        c.execution.stages = S;
        c.execution.virtual_stages = V;
        st_trainer *t = NULL;
        float *got = train(&c, &np, &t);
        if (!got) continue;
        CHECK(np == n && memcmp(got, want, n * sizeof *got) == 0,
              "%s: %s S=%d V=%d M=%d: weights differ from sequential", what,
              c.execution.schedule, S, V, ms[mi]);
        CHECK(memcmp(train_losses, want_loss, sizeof want_loss) == 0,
              "%s: %s S=%d V=%d M=%d: losses differ from sequential", what,
              c.execution.schedule, S, V, ms[mi]);
        void *state = st_trainer_exec_state(t);
        int first[64], count[64], k = st_pipeline_stages(state, first, count);
        CHECK(k == S * V, "%s: %s S=%d V=%d: %d pipeline stages, want %d", what,
              c.execution.schedule, S, V, k, S * V);
        for (int j = 1; j < k && k <= 64; j++)
          CHECK(first[j] == first[j - 1] + count[j - 1],
                "%s: chunk %d does not follow chunk %d", what, j, j - 1);
        /* the run's bubble figure is its schedule's closed form */
        double bubble = 0, M = ms[mi];
        st_trainer_utilization(t, &bubble);
        double closed =
            V > 1 ? V * M / (V * M + S - 1) : 3 * M / (3 * M + S - 1);
        if ((V > 1 && ms[mi] % S == 0) || (V == 1 && ms[mi] >= S))
          CHECK(fabs(bubble - closed) < 1e-12,
                "%s: %s S=%d V=%d M=%d: bubble figure %.6f, closed form %.6f",
                what, c.execution.schedule, S, V, ms[mi], bubble, closed);
        if (V == 1)
          for (int s = 0; s < S; s++) {
            /* zb1p holds a micro-batch from F to W: at most min(M, S) */
            int held = st_pipeline_held(state, s);
            int cap = S < ms[mi] ? S : ms[mi];
            CHECK(held >= 1 && held <= cap,
                  "%s: zb1p S=%d M=%d: stage %d held %d, at most %d", what, S,
                  ms[mi], s, held, cap);
          }
        cases++;
        free(got);
        st_trainer_destroy(t);
        /* the interleaved cut pinned chunk by chunk (execution.stage_blocks
         * of S V entries, the worker count taken from it): one block in
         * every chunk but the last. It was refused whatever its length. */
        if (V == 1 || mi > 0 || S * V > ST_MAX_LIST) continue;
        st_config p = c;
        p.execution.stages = 0;
        p.execution.stage_blocks.n = S * V;
        for (int j = 0; j < S * V; j++)
          p.execution.stage_blocks.v[j] = j < S * V - 1 ? 1 : blocks - j;
        got = train(&p, &np, &t);
        if (!got) continue;
        CHECK(np == n && memcmp(got, want, n * sizeof *got) == 0,
              "%s: interleaved S=%d V=%d pinned: weights differ from "
              "sequential",
              what, S, V);
        state = st_trainer_exec_state(t);
        k = st_pipeline_stages(state, first, count);
        int pinned = k == S * V;
        for (int j = 0; pinned && j < k; j++)
          pinned = count[j] == p.execution.stage_blocks.v[j];
        CHECK(pinned, "%s: interleaved S=%d V=%d: %d chunks, not the pinned %d",
              what, S, V, k, S * V);
        free(got);
        st_trainer_destroy(t);
      }
    free(want);
  }
  CHECK(cases > 0, "%s: no case ran", what);
}

/* block_sequential against sequential: segments of S blocks and of half
 * the model (at least S), every stage holding all M micro-batches. */
static void test_block_sequential(const char *what, const st_config *base) {
  const int Ms[] = {1, 2, 4, 8};
  for (int mi = 0; mi < 4; mi++) {
    st_config seq = *base;
    seq.train.batch = BATCH;
    seq.execution.micro_batch = BATCH / Ms[mi];
    size_t n = 0, np;
    st_trainer *t0 = NULL;
    float *want = train(&seq, &n, &t0);
    if (!want) return;
    double want_loss[STEPS];
    memcpy(want_loss, train_losses, sizeof want_loss);
    int blocks = st_trainer_model(t0)->n_blocks;
    st_trainer_destroy(t0);
    for (int S = 2; S <= 4; S++)
      for (int half = 0; half < 2; half++)
        for (int rep = 0; rep < 2; rep++) {
          int per = half ? (blocks + 1) / 2 : S;
          if (per < S) per = S;
          st_config c = seq;
          snprintf(c.execution.mode, sizeof c.execution.mode,
                   "block_sequential");
          c.execution.stages = S;
          c.execution.blocks_per_segment = per;
          if (rep) { /* a pin block_sequential does not read (a notice) */
            c.execution.stage_blocks.n = 2;
            c.execution.stage_blocks.v[0] = 1;
            c.execution.stage_blocks.v[1] = blocks - 1;
          }
          st_trainer *t = NULL;
          float *got = train(&c, &np, &t);
          if (!got) continue;
          CHECK(np == n && memcmp(got, want, n * sizeof *got) == 0,
                "%s: block_sequential S=%d segments of %d M=%d run %d: "
                "weights differ from sequential",
                what, S, per, Ms[mi], rep);
          CHECK(memcmp(train_losses, want_loss, sizeof want_loss) == 0,
                "%s: block_sequential S=%d segments of %d M=%d run %d: "
                "losses differ from sequential",
                what, S, per, Ms[mi], rep);
          /* segments of `per` blocks, each cut into min(S, its blocks) */
          void *state = st_trainer_exec_state(t);
          int first[64], count[64], k = st_pipeline_stages(state, first, count);
          int expect = 0;
          for (int b = 0; b < blocks; b += per)
            expect += blocks - b < per ? (blocks - b < S ? blocks - b : S) : S;
          CHECK(k == expect,
                "%s: block_sequential S=%d per=%d%s: %d stages, "
                "want %d",
                what, S, per, rep ? " (stage_blocks ignored)" : "", k, expect);
          for (int s = 0; s < k; s++) {
            CHECK(first[s] / per == (first[s] + count[s] - 1) / per,
                  "%s: stage %d (blocks %d..%d) crosses a segment of %d", what,
                  s, first[s], first[s] + count[s] - 1, per);
            CHECK(st_pipeline_held(state, s) == Ms[mi],
                  "%s: block_sequential stage %d held %d, want %d", what, s,
                  st_pipeline_held(state, s), Ms[mi]);
          }
          free(got);
          st_trainer_destroy(t);
        }
    free(want);
  }
}

/* block_sequential as it runs unpinned by the config: the plan's stages
 * (S = 0) and segments (blocks_per_segment = 0), or a stage a block, on 1,
 * 3 and 8 threads (other cuts, other stage pools), with M in {1, 4} and at
 * batch 1 (the update fused into the backward): the sequential mode's bits
 * on 2 threads, every time. */
static void test_block_sequential_cores(const char *what,
                                        const st_config *base) {
  const int Ms[] = {1, 4, 1}, threads[] = {1, 3, 8};
  for (int mi = 0; mi < 3; mi++) {
    st_config seq = *base;
    seq.train.batch = mi == 2 ? 1 : BATCH;
    seq.execution.micro_batch = seq.train.batch / Ms[mi];
    size_t n = 0, np;
    float *want = train(&seq, &n, NULL);
    if (!want) return;
    for (int ti = 0; ti < 3; ti++)
      for (int per_block = 0; per_block < 2; per_block++) {
        st_config c = seq;
        snprintf(c.execution.mode, sizeof c.execution.mode, "block_sequential");
        c.train.threads = threads[ti];
        c.execution.stages = per_block ? ST_STAGES_PER_BLOCK : 0;
        c.execution.blocks_per_segment = 0;
        float *got = train(&c, &np, NULL);
        if (!got) continue;
        CHECK(np == n && memcmp(got, want, n * sizeof *got) == 0,
              "%s: block_sequential %s on %d threads batch %d M=%d: weights "
              "differ from sequential",
              what, per_block ? "per_block" : "S=0", threads[ti],
              seq.train.batch, Ms[mi]);
        free(got);
      }
    free(want);
  }
}

/* The stages are the compiler's plan for this machine's cores: the same
 * cut points and cores per stage as st_plan_compile on fabric
 * cpu:threads, the stage count too when S = 0 (chosen by the mode's fill
 * and drain, as `strata compile` chooses it). More stages than threads:
 * one thread each. */
static void test_plan(const st_config *base, const char *mode, const char *what,
                      int S, int threads) {
  st_config c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "%s", mode);
  c.execution.stages = S;
  c.train.threads = threads;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  char spec[32];
  snprintf(spec, sizeof spec, "cpu:%d", c.train.threads);
  CHECK(st_fabric_parse(&c, spec, &err) == 0, "%s", err.msg);
  st_plan *plan = NULL;
  if (S > threads) { /* shared cores: one thread a stage */
    for (int s = 0; s < S; s++)
      CHECK(st_pipeline_cores(st_trainer_exec_state(t), s) == 1,
            "%s: stage %d of %d on %d threads: %d threads", what, s, S, threads,
            st_pipeline_cores(st_trainer_exec_state(t), s));
    st_trainer_destroy(t);
    return;
  }
  CHECK(st_plan_compile(&plan, &c, S, &err) == 0, "%s: %s", what, err.msg);
  int first[64], count[64];
  int k = st_pipeline_stages(st_trainer_exec_state(t), first, count);
  CHECK(plan && k == plan->n_stages, "%s: %d stages, plan %d", what, k,
        plan ? plan->n_stages : -1);
  for (int s = 0; plan && s < k && s < plan->n_stages; s++) {
    CHECK(first[s] == plan->stages[s].first &&
              count[s] == plan->stages[s].count,
          "%s: stage %d is blocks %d+%d, the plan's %d+%d", what, s, first[s],
          count[s], plan->stages[s].first, plan->stages[s].count);
    int cores = st_pipeline_cores(st_trainer_exec_state(t), s);
    CHECK(cores == plan->stages[s].pes,
          "%s: stage %d runs on %d threads, "
          "the plan gives it %lld cores",
          what, s, cores, (long long)plan->stages[s].pes);
  }
  st_plan_destroy(plan);
  st_trainer_destroy(t);
}

/* The interleaved schedule with S = 0 runs the plan's count of stage
 * workers, as `strata compile` picks it on cpu:threads (interleaved's
 * fill and drain of V chunks a worker counted, of 1 .. blocks / V
 * workers), each worker V chunks. The run took one worker a core, up to blocks
 * / V: a 6-block GPT on 8 threads ran 3 workers where the plan has 2. */
static void test_plan_interleaved(const st_config *base, const char *what,
                                  int V, int threads) {
  st_config c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
  snprintf(c.execution.schedule, sizeof c.execution.schedule, "interleaved");
  c.execution.stages = 0;
  c.execution.virtual_stages = V;
  c.train.threads = threads;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s: %s", what, err.msg);
  if (!t) return;
  char spec[32];
  snprintf(spec, sizeof spec, "cpu:%d", threads);
  CHECK(st_fabric_parse(&c, spec, &err) == 0, "%s", err.msg);
  st_plan *plan = NULL;
  CHECK(st_plan_compile(&plan, &c, 0, &err) == 0, "%s: %s", what, err.msg);
  int workers = st_trainer_stages(t), first[64], count[64];
  int k = st_pipeline_stages(st_trainer_exec_state(t), first, count);
  CHECK(plan && workers == plan->n_stages,
        "%s: V=%d on %d threads: %d stage workers, the plan %d", what, V,
        threads, workers, plan ? plan->n_stages : -1);
  CHECK(k == workers * V, "%s: V=%d: %d chunks for %d workers", what, V, k,
        workers);
  /* a worker count the run cannot cut is never a choice */
  int blocks = st_trainer_model(t)->n_blocks;
  CHECK(plan && plan->n_tried * V <= blocks,
        "%s: V=%d: the plan tried up to %d workers; %d blocks hold %d", what, V,
        plan ? plan->n_tried : -1, blocks, blocks / V);
  st_plan_destroy(plan);
  st_trainer_destroy(t);
}

/* configs/gpt_tiny.yaml on 8 threads with 2 chunks a worker and
 * micro-batches of 1 (M = 16): the plan's 2 workers, where the run took 3 */
static void test_plan_interleaved_tiny(void) {
  st_config c;
  st_error err = {0};
  st_config_defaults(&c);
  CHECK(st_config_load(&c, "configs/gpt_tiny.yaml", &err) == 0, "%s", err.msg);
  set_all(&c,
          (const char *[]){"data.path=tests/fixtures/gpt_corpus.txt",
                           "metrics.progress=off", "execution.micro_batch=1"},
          3);
  test_plan_interleaved(&c, "gpt_tiny", 2, 8);
}

/* Steps allocate nothing once running (st_alloc counts every buffer). */
static void test_steady(const st_config *base, const char *mode) {
  st_config c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "%s", mode);
  c.train.batch = BATCH;
  c.execution.micro_batch = 4;
  c.execution.stages = 2;
  c.execution.blocks_per_segment = 3;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  double loss;
  uint64_t before = 0;
  for (int i = 0; i < 10; i++) {
    if (i == 3) before = st_alloc_count();
    CHECK(st_trainer_step(t, &loss, &err) == 0, "%s", err.msg);
  }
  CHECK(st_alloc_count() == before, "%s: %llu allocations in 7 steps", mode,
        (unsigned long long)(st_alloc_count() - before));
  st_trainer_destroy(t);
}

/* Busy seconds per stage and the trace: a track per pipeline stage (under
 * the interleaved schedule, per chunk: S V), each with M forwards and M
 * backwards a step and one update per block. schedule NULL: the default. */
static void test_stats_trace(const st_config *base, const char *mode,
                             const char *schedule, int V) {
  enum { M = 4, S = 2, NSTEPS = 3 };
  st_config c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "%s", mode);
  if (schedule)
    snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s", schedule);
  c.execution.virtual_stages = V;
  const char *what = schedule ? schedule : mode;
  c.train.batch = BATCH;
  c.execution.micro_batch = BATCH / M;
  c.execution.stages = S;
  c.execution.blocks_per_segment = 2;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  CHECK(st_trainer_trace(t, 1000, &err) == 0, "%s", err.msg);
  double loss, wall = 0;
  for (int i = 0; i < NSTEPS; i++)
    CHECK(st_trainer_step(t, &loss, &err) == 0, "%s", err.msg);
  st_track_stats st[16];
  int n = st_trainer_stats(t, st, 16, &wall);
  int stages = st_pipeline_stages(st_trainer_exec_state(t), NULL, NULL);
  CHECK(n == stages && wall > 0, "%s: %d tracks, %d stages, wall %g", what, n,
        stages, wall);
  for (int i = 0; i < n && i < 16; i++)
    CHECK(st[i].busy_s > 0 && st[i].busy_s <= wall, "%s: %s busy %g of %g s",
          what, st[i].name, st[i].busy_s, wall);
  char path[] = "/tmp/strata_trace_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  if (fd >= 0) close(fd);
  CHECK(st_trainer_write_trace(t, path, &err) == 0, "%s", err.msg);
  FILE *f = fopen(path, "r");
  char *text = calloc(1, 1 << 22);
  size_t len = f ? fread(text, 1, (1 << 22) - 1, f) : 0;
  if (f) fclose(f);
  CHECK(len > 0 && strncmp(text, "{\"displayTimeUnit\"", 18) == 0 &&
            strstr(text, "\"dropped_events\":0"),
        "%s: trace file: %.60s", what, text);
  int first[16], count[16];
  st_pipeline_stages(st_trainer_exec_state(t), first, count);
  for (int s = 0; s < n; s++) {
    char key[96];
    int fwd = 0, bwd = 0, upd = 0;
    const char *names[3] = {"forward", "backward", "update"};
    int *counts[3] = {&fwd, &bwd, &upd};
    for (int kind = 0; kind < 3; kind++) {
      snprintf(key, sizeof key, "\"tid\":%d,\"name\":\"%s\"", s, names[kind]);
      for (const char *q = text; (q = strstr(q, key)); q++) (*counts[kind])++;
    }
    CHECK(fwd == M * NSTEPS && bwd == M * NSTEPS && upd == count[s] * NSTEPS,
          "%s: track %d: %d forwards, %d backwards, %d updates", what, s, fwd,
          bwd, upd);
    snprintf(key, sizeof key, "\"name\":\"%.47s\"", st[s].name);
    CHECK(strstr(text, key) != NULL, "%s: no track named %s", what, st[s].name);
  }
  free(text);
  unlink(path);
  st_trainer_destroy(t);
}

/* configs/gpt_tiny.yaml itself (4 layers, width 128, context 64, AdamW
 * with warm-up and cosine) on the fixture corpus: each synchronous mode
 * against sequential at its micro-batch split, bit for bit. */
static void test_gpt_tiny(void) {
  st_config base;
  st_error err = {0};
  st_config_defaults(&base);
  CHECK(st_config_load(&base, "configs/gpt_tiny.yaml", &err) == 0, "%s",
        err.msg);
  const char *sets[] = {"data.path=tests/fixtures/gpt_corpus.txt",
                        "train.threads=2", "metrics.progress=off",
                        "model.dropout=0.1"};
  set_all(&base, sets, sizeof sets / sizeof sets[0]);
  const struct {
    const char *mode, *schedule;
    int S, M, per;
  } cases[] = {{"pipeline", "gpipe", 3, 4, 0},
               {"pipeline", "1f1b", 4, 8, 0},
               {"block_sequential", "1f1b", 2, 2, 3}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st_config seq = base;
    seq.execution.micro_batch = seq.train.batch / cases[i].M;
    size_t n = 0, np = 0;
    float *want = train(&seq, &n, NULL);
    st_config c = seq;
    snprintf(c.execution.mode, sizeof c.execution.mode, "%s", cases[i].mode);
    snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s",
             cases[i].schedule);
    c.execution.stages = cases[i].S;
    c.execution.blocks_per_segment = cases[i].per;
    float *got = train(&c, &np, NULL);
    CHECK(want && got && n == np && memcmp(want, got, n * sizeof *got) == 0,
          "gpt_tiny.yaml: %s %s S=%d M=%d: weights differ from sequential",
          cases[i].mode, cases[i].schedule, cases[i].S, cases[i].M);
    free(want);
    free(got);
  }
}

/* One pipeline case against sequential at the config's batch (M
 * micro-batches of it), bitwise. */
static void test_one(const st_config *base, const char *what, int M,
                     const char *schedule, int S) {
  st_config seq = *base;
  if (seq.train.batch < M) seq.train.batch = M;
  seq.execution.micro_batch = seq.train.batch / M;
  size_t n = 0, np = 0;
  float *want = train(&seq, &n, NULL);
  st_config c = seq;
  snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
  snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s", schedule);
  c.execution.stages = S;
  float *got = train(&c, &np, NULL);
  CHECK(want && got && n == np && memcmp(want, got, n * sizeof *got) == 0,
        "%s: %s S=%d M=%d: weights differ from sequential", what, schedule, S,
        M);
  free(want);
  free(got);
}

/* zb1p and interleaved with random pauses in every stage (the test knob)
 * on the tied GPT, against sequential: 200 steps each, no deadlock, and
 * the tied embedding updated only once its head copy's deferred weight
 * gradient is complete (a race the pauses would expose). */
static void test_jitter_schedules(const st_config *base) {
  const struct {
    const char *schedule;
    int S, V, M;
  } cases[] = {{"zb1p", 3, 1, 5},
               {"zb1p", 4, 1, 8},
               {"interleaved", 2, 2, 3},
               {"interleaved", 3, 2, 6}};
  enum { N = 200 };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    float *w[2] = {NULL, NULL};
    size_t n = 0;
    for (int run = 0; run < 2; run++) {
      st_config c = *base;
      c.train.batch = 2 * cases[i].M;
      c.execution.micro_batch = 2;
      if (run) {
        snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
        snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s",
                 cases[i].schedule);
        c.execution.stages = cases[i].S;
        c.execution.virtual_stages = cases[i].V;
      }
      st_error err = {0};
      st_trainer *t = make(&c, &err);
      CHECK(t != NULL, "%s", err.msg);
      if (!t) break;
      if (run) st_pipeline_set_jitter(st_trainer_exec_state(t), 40, 777 + i);
      double loss;
      int rc = 0;
      for (int k = 0; k < N && !rc; k++) rc = st_trainer_step(t, &loss, &err);
      CHECK(rc == 0, "%s jitter: %s", cases[i].schedule, err.msg);
      n = st_trainer_model(t)->n_params;
      w[run] = malloc(n * sizeof(float));
      trainer_weights(t, w[run], &err);
      st_trainer_destroy(t);
    }
    CHECK(w[0] && w[1] && memcmp(w[0], w[1], n * sizeof(float)) == 0,
          "%s S=%d V=%d M=%d with random pauses: weights differ from "
          "sequential",
          cases[i].schedule, cases[i].S, cases[i].V, cases[i].M);
    free(w[0]);
    free(w[1]);
  }
}

/* zb1p on the tied GPT with random pauses, traced: the stage holding the
 * token embedding waits for its head copy's last W before its own last W
 * updates the pair. That wait is idle, not the W's work: its span (and
 * the stage's busy seconds) started before the wait, so the embedding's
 * last W began before the copy's had ended in about a third of the steps.
 * Every step, the one must begin no earlier than the other ends (the
 * file's microseconds have three decimals: 0.002 of rounding either way). */
static void test_tie_wait_traced(const st_config *base) {
  enum { S = 4, M = 8, N = 100 };
  st_config c = *base;
  c.train.batch = 2 * M;
  c.execution.micro_batch = 2;
  snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
  snprintf(c.execution.schedule, sizeof c.execution.schedule, "zb1p");
  c.execution.stages = S;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  CHECK(st_trainer_trace(t, 100000, &err) == 0, "%s", err.msg);
  st_pipeline_set_jitter(st_trainer_exec_state(t), 1000, 4242);
  double loss;
  int rc = 0;
  for (int i = 0; i < N && !rc; i++) rc = st_trainer_step(t, &loss, &err);
  CHECK(rc == 0, "zb1p traced: %s", err.msg);
  char path[] = "/tmp/strata_tie_trace_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  if (fd >= 0) close(fd);
  CHECK(st_trainer_write_trace(t, path, &err) == 0, "%s", err.msg);
  double begin[N], end[N];
  for (int i = 0; i < N; i++) begin[i] = end[i] = -1;
  FILE *f = fopen(path, "r");
  char line[512];
  while (f && fgets(line, sizeof line, f)) {
    int tid, step, mb;
    double ts, dur;
    if (sscanf(line,
               "{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"name\":\"weight-grad\","
               "\"ts\":%lf,\"dur\":%lf,\"args\":{\"step\":%d,"
               "\"micro_batch\":%d",
               &tid, &ts, &dur, &step, &mb) != 5 ||
        mb != M - 1 || step < 0 || step >= N)
      continue;
    if (tid == 0) begin[step] = ts;
    if (tid == S - 1) end[step] = ts + dur;
  }
  if (f) fclose(f);
  unlink(path);
  int bad = 0, missing = 0;
  for (int i = 0; i < N; i++) {
    missing += begin[i] < 0 || end[i] < 0;
    bad += begin[i] >= 0 && end[i] >= 0 && begin[i] < end[i] - 0.002;
  }
  CHECK(missing == 0, "zb1p traced: %d of %d steps without both last Ws",
        missing, N);
  CHECK(bad == 0,
        "zb1p traced: in %d of %d steps the tied embedding's last W began "
        "before its head copy's last W ended (the wait counted as work)",
        bad, N);
  st_trainer_destroy(t);
}

/* 10,000 steps of a 4-stage 1f1b pipeline with random pauses in every
 * stage (a test-only knob) end with the same weights as without: no
 * deadlock, no lost or reordered message. */
static void test_stress(const st_config *base) {
  st_config c = *base;
  const char *sets[] = {"model.hidden=[16,16,16]", "train.batch=8",
                        "execution.micro_batch=2", "execution.mode=pipeline",
                        "execution.schedule=1f1b", "execution.stages=4",
                        "model.dropout=0",         "optimizer.lr=0.01"};
  set_all(&c, sets, sizeof sets / sizeof sets[0]);
  enum { N = 10000 };
  float *w[2] = {NULL, NULL};
  size_t n = 0;
  for (int run = 0; run < 2; run++) {
    st_error err = {0};
    st_trainer *t = make(&c, &err);
    CHECK(t != NULL, "%s", err.msg);
    if (!t) return;
    if (run) st_pipeline_set_jitter(st_trainer_exec_state(t), 40, 12345);
    double loss;
    int rc = 0;
    for (int i = 0; i < N && !rc; i++) rc = st_trainer_step(t, &loss, &err);
    CHECK(rc == 0, "stress run %d: %s", run, err.msg);
    n = st_trainer_model(t)->n_params;
    w[run] = malloc(n * sizeof(float));
    memcpy(w[run], st_trainer_params(t), n * sizeof(float));
    st_trainer_destroy(t);
  }
  CHECK(memcmp(w[0], w[1], n * sizeof(float)) == 0,
        "10,000 steps with random pauses end with other weights");
  free(w[0]);
  free(w[1]);
}

/* A step whose loss is not finite changes no weight, on any stage. */
static void test_nan(const st_config *base, const char *schedule) {
  st_config c = *base;
  c.train.batch = BATCH;
  c.execution.micro_batch = 4;
  int bseq = strcmp(schedule, "block_sequential") == 0;
  snprintf(c.execution.mode, sizeof c.execution.mode, "%s",
           bseq ? "block_sequential" : "pipeline");
  if (!bseq)
    snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s", schedule);
  c.execution.stages = bseq ? 2 : 3;
  c.execution.blocks_per_segment = 2;
  /* weights of ~1e36 after the first update: the second step's logits
   * overflow to inf (1e30 left them finite on an AVX2 machine) */
  c.optimizer.lr = 1e38f;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  double loss;
  int rc = 0, i;
  size_t n = st_trainer_model(t)->n_params;
  float *before = malloc(n * sizeof *before);
  for (i = 0; i < 10 && !rc; i++) {
    memcpy(before, st_trainer_params(t), n * sizeof *before);
    rc = st_trainer_step(t, &loss, &err);
  }
  CHECK(rc == ST_ENONFINITE && strstr(err.msg, "stopped before updating"),
        "%s: huge lr: rc %d after %d steps: %s", schedule, rc, i, err.msg);
  CHECK(memcmp(before, st_trainer_params(t), n * sizeof *before) == 0,
        "%s: a non-finite step changed weights", schedule);
  /* the pipeline is usable again: the next steps run (and fail) cleanly */
  rc = st_trainer_step(t, &loss, &err);
  CHECK(rc == ST_ENONFINITE, "%s: step after an aborted one: rc %d: %s",
        schedule, rc, err.msg);
  free(before);
  st_trainer_destroy(t);
}

static void test_refusals(const st_config *base) {
  st_config c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
  c.execution.stages = 9; /* the MLP has 4 blocks */
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(!t && err.code == ST_ECONFIG && strstr(err.msg, "execution.stages") &&
            strstr(err.msg, "4 blocks"),
        "more stages than blocks: %s", err.msg);
  st_trainer_destroy(t);
  snprintf(c.execution.mode, sizeof c.execution.mode, "block_sequential");
  c.execution.stages = 3;
  c.execution.blocks_per_segment = 2;
  t = make(&c, &err);
  CHECK(!t && err.code == ST_ECONFIG && strstr(err.msg, "execution.stages") &&
            strstr(err.msg, "segments of 2 blocks"),
        "more stages than a segment's blocks: %s", err.msg);
  st_trainer_destroy(t);
  c = *base;
  st_config_defaults(&c);
  CHECK(st_config_set(&c, "execution.schedule=zigzag", &err) == ST_ECONFIG &&
            strstr(err.msg, "gpipe, 1f1b"),
        "unknown schedule: %s", err.msg);
  c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "pipeline");
  c.train.batch = 16;
  c.execution.micro_batch = 5;
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG &&
            strstr(err.msg, "execution.micro_batch"),
        "micro-batch not dividing the batch: %s", err.msg);
}

int main(void) {
  st_blas_init();
  st_config mlp, cnn, gpt;
  mlp_config(&mlp);
  cnn_config(&cnn);
  gpt_config(&gpt);
  test_equivalence("mlp", &mlp);
  test_equivalence("cnn", &cnn);
  test_equivalence("gpt", &gpt);
  test_gpt_tiny();
  /* interleaved and zb1p: 2-8 stage workers on a 24-block MLP, a CNN of
   * residual blocks and an 8-block GPT (as many as their blocks allow);
   * 1-16 micro-batches */
  st_config deep24 = mlp, gpt6 = gpt;
  set_all(&deep24,
          (const char *[]){"model.hidden=[16,16,16,16,16,16,16,16,16,16,16,"
                           "16,16,16,16,16,16,16,16,16,16,16,16]",
                           "model.dropout=0.1"},
          2);
  set_all(&gpt6, (const char *[]){"model.layers=6"}, 1);
  const int all_s[] = {2, 3, 4, 5, 6, 7, 8};
  const int many_m[] = {1, 3, 8, 13, 16}, few_m[] = {2, 5, 8};
  test_new_schedules("mlp 24 blocks", &deep24, all_s, 7, many_m, 5);
  st_config deep_cnn = cnn;
  set_all(&deep_cnn, (const char *[]){"model.residual_blocks=3"}, 1);
  test_new_schedules("cnn", &deep_cnn, all_s, 7, few_m, 3);
  test_new_schedules("gpt 8 blocks", &gpt6, all_s, 7, few_m, 3);
  /* block_sequential on deeper models: 8, 6 and 6 blocks */
  st_config deep = mlp, deep_gpt = gpt;
  set_all(&deep, (const char *[]){"model.hidden=[32,32,32,32,32,32,32]"}, 1);
  set_all(&deep_gpt, (const char *[]){"model.layers=4"}, 1);
  test_block_sequential("mlp", &deep);
  test_block_sequential("cnn", &cnn);
  test_block_sequential("gpt", &deep_gpt);
  test_block_sequential_cores("mlp", &deep);
  test_block_sequential_cores("gpt", &deep_gpt);
  test_plan(&mlp, "pipeline", "mlp S=2", 2, 2);
  test_plan(&cnn, "pipeline", "cnn S=2", 2, 2);
  test_plan(&cnn, "pipeline", "cnn S=0 (the plan's count)", 0, 2);
  /* block_sequential's own count: it ran min(cores, blocks) stages where
   * the compiler, counting gpipe's fill and drain at M = 1 (no overlap),
   * plans fewer */
  test_plan(&cnn, "block_sequential", "block_sequential cnn S=0", 0, 2);
  test_plan(&deep, "block_sequential", "block_sequential deep mlp S=0", 0, 8);
  st_config deep_m = deep;
  deep_m.execution.micro_batch = 4;
  test_plan(&deep_m, "block_sequential",
            "block_sequential deep mlp S=0 M=4 on 8 threads", 0, 8);
  test_plan(&deep_m, "pipeline", "deep mlp S=0 M=4 on 8 threads", 0, 8);
  /* 784-128x7-10: a FLOP balance gives the first block a stage of its
   * own; the plan gives stage 0 two of 3 cores and blocks 0-3 */
  st_config mlp128 = mlp;
  set_all(&mlp128,
          (const char *[]){"model.hidden=[128,128,128,128,128,128,128]"}, 1);
  test_plan(&mlp128, "pipeline", "mlp 128x7 S=2 on 3 threads", 2, 3);
  test_plan(&deep, "pipeline", "deep mlp S=3 on 8 threads", 3, 8);
  test_plan(&deep, "pipeline", "deep mlp S=4 on 2 threads", 4, 2);
  test_plan_interleaved(&deep_gpt, "gpt 6 blocks", 2, 8);
  test_plan_interleaved(&deep_gpt, "gpt 6 blocks", 3, 8);
  test_plan_interleaved(&deep, "deep mlp", 2, 8);
  test_plan_interleaved(&deep24, "mlp 24 blocks", 2, 8);
  test_plan_interleaved(&deep24, "mlp 24 blocks", 3, 2);
  test_plan_interleaved_tiny();
  test_steady(&mlp, "pipeline");
  test_steady(&deep, "block_sequential");
  test_stats_trace(&mlp, "pipeline", NULL, 1);
  test_stats_trace(&deep, "block_sequential", NULL, 1);
  test_stats_trace(&deep, "pipeline", "interleaved", 2);
  test_nan(&mlp, "1f1b");
  test_nan(&mlp, "gpipe");
  test_nan(&gpt, "1f1b"); /* the tied copy is updated by stage 0 */
  test_nan(&mlp, "block_sequential");
  test_nan(&gpt, "block_sequential");
  /* stage pools of several threads (8 threads over 2-4 stages), batch 1
   * with fused updates */
  st_config wide = mlp;
  wide.train.threads = 8;
  test_one(&wide, "mlp 8 threads", 4, "1f1b", 3);
  st_config b1 = mlp;
  b1.train.batch = 1;
  b1.execution.micro_batch = 1;
  test_one(&b1, "mlp batch 1 fused", 1, "gpipe", 4);
  test_one(&b1, "mlp batch 1 fused", 1, "zb1p", 4);
  st_config wgpt = gpt;
  wgpt.train.threads = 8;
  test_one(&wgpt, "gpt 8 threads", 4, "gpipe", 2);
  test_refusals(&mlp);
  test_stress(&mlp);
  test_jitter_schedules(&gpt6);
  test_tie_wait_traced(&gpt6);
  TH_DONE();
}
