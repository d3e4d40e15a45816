/*
 * test_pb.c — pipelined backprop's contract (src/exec/pb.c, BACKGROUND.md
 * 2):
 *  - the threaded runtime gives exactly the emulator's weights (one thread,
 *    tick by tick) for every mitigation, S in {2, 4, 8}, 200 steps, on an
 *    8-block MLP with dropout and weight decay; on the CNN (group norm,
 *    residual blocks) for two mitigations, and with AdamW for none/stash;
 *  - the delay each stage counts between a micro-batch's forward and its
 *    update is D(s) = 2 (S - 1 - s) (min(n, D) while the pipeline fills);
 *  - at micro-batch 1 the updates folded into the backward give the bits
 *    of updating after it, for every mitigation, and so does the linear
 *    weight prediction written in the same pass (lwp, sc+lwp)
 *    against a separate pass before each forward (train.batch 2: the
 *    second forward of every step uses the folded one), also with a
 *    cosine schedule, where a step's first forward must not;
 *  - one stage (D = 0) is plain SGD: every mitigation gives the weights of
 *    the sequential mode at batch = micro-batch, momentum SGD and AdamW;
 *  - spike compensation with a gradient constant in time: after the first
 *    D steps its trajectory is undelayed momentum SGD's shifted by D;
 *  - stash: every backward sees exactly the weights its forward saw (a
 *    probe hashes them), while none's differ once updates happen in
 *    between; stage s holds D(s) + 1 versions, no more;
 *  - the steady state allocates nothing; a non-finite loss stops before
 *    its micro-batch's backward and the pipeline refuses to go on;
 *  - steps started before the last returns (st_trainer_step_ahead) give
 *    the same weights and position, across epochs and a schedule; a NaN
 *    in the step started ahead fails at its own step, with the message
 *    of the run without overlap; evaluating or saving meanwhile is refused;
 *  - optimizer.reference_batch's rescaling against its closed form;
 *  - a resume refills the pipeline and the rules go on from each stage's
 *    count of updates, N K - D(s): after one resumed step at micro-batch
 *    1 the last stage holds the uninterrupted run's weights and the
 *    others the checkpoint's; pipemare's warm-up factor on stage 0's first
 *    resumed update is the closed form's at that count;
 *    a checkpoint loaded into a trainer that has run steps is refused;
 *  - the replay of the stages' busy times with free hand-offs, on
 *    hand-worked schedules, and below the real wall of a threaded run;
 *  - impossible settings fail before any work.
 */
#include "harness.h"
#include "models.h"
#include "strata.h"
#include "../../src/exec/exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const MITIGATIONS[] = {"none", "stash",  "sc",
                                          "lwp",  "sc+lwp", "pipemare"};
enum { N_MIT = 6 };

/* An 8-block MLP, heavy-ball SGD with weight decay, dropout. */
static void deep_config(st_config *c) {
  mlp_config(c);
  set_all(c,
          (const char *[]){"model.hidden=[16,16,16,16,16,16,16]",
                           "optimizer.nesterov=false",
                           "optimizer.weight_decay=0.001", "optimizer.lr=0.02",
                           "execution.mode=pipelined_backprop",
                           "execution.pipemare_warmup=50", "train.batch=2"},
          7);
}

/* The weights after `steps` steps; with `ahead` every step but the last
 * lets the next one start before it returns (st_trainer_step_ahead). */
static float *run_steps_ahead(const st_config *c, int steps, int ahead,
                              st_trainer **keep) {
  st_error err = {0};
  st_trainer *t = make(c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return NULL;
  double loss;
  for (int i = 0; i < steps; i++)
    if (st_trainer_step_ahead(t, ahead && i + 1 < steps, &loss, &err)) {
      CHECK(0, "step %d: %s", i, err.msg);
      st_trainer_destroy(t);
      return NULL;
    }
  size_t n = st_trainer_model(t)->n_params;
  float *w = malloc(n * sizeof *w);
  memcpy(w, st_trainer_params(t), n * sizeof *w);
  if (keep)
    *keep = t;
  else
    st_trainer_destroy(t);
  return w;
}

static float *run_steps(const st_config *c, int steps, st_trainer **keep) {
  return run_steps_ahead(c, steps, 0, keep);
}

static void test_threaded_emulated(const char *what, const st_config *base,
                                   const int *Ss, int nS,
                                   const char *const *mits, int nmit) {
  enum { N = 200 };
  for (int si = 0; si < nS; si++)
    for (int mi = 0; mi < nmit; mi++) {
      st_config c = *base;
      c.execution.stages = Ss[si];
      snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "%s",
               mits[mi]);
      c.execution.emulate = 1;
      st_trainer *t = NULL;
      float *want = run_steps(&c, N, &t);
      if (!want) continue;
      size_t n = st_trainer_model(t)->n_params;
      st_trainer_destroy(t);
      /* the threaded runtime with each next step started before the last
       * returned: the stages go on without waiting at step boundaries */
      c.execution.emulate = 0;
      float *got = run_steps_ahead(&c, N, 1, &t);
      if (got) {
        CHECK(memcmp(got, want, n * sizeof *got) == 0,
              "%s %s S=%d: threaded weights differ from the emulator's", what,
              mits[mi], Ss[si]);
        /* and they moved, and stayed finite */
        int finite = 1;
        for (size_t i = 0; i < n; i++) finite &= isfinite(got[i]) != 0;
        CHECK(finite, "%s %s S=%d: non-finite weights", what, mits[mi], Ss[si]);
        /* the delay each stage counted */
        void *state = st_trainer_exec_state(t);
        CHECK(st_trainer_stages(t) == Ss[si], "%s: %d stages, want %d", what,
              st_trainer_stages(t), Ss[si]);
        for (int s = 0; s < Ss[si]; s++) {
          int lo, hi, all, D = st_pb_delay(state, s, &lo, &hi, &all);
          CHECK(D == 2 * (Ss[si] - 1 - s) && lo == D && hi == D && all == D,
                "%s %s S=%d stage %d: delay %d..%d (all %d), want D = %d", what,
                mits[mi], Ss[si], s, lo, hi, all, 2 * (Ss[si] - 1 - s));
        }
        st_trainer_destroy(t);
      }
      free(got);
      free(want);
    }
}

/* One stage: every mitigation is plain SGD at batch = micro-batch. */
static void test_one_stage(const char *what, const st_config *base,
                           const char *const *mits, int nmit) {
  enum { N = 30, B = 4 };
  st_config seq = *base;
  snprintf(seq.execution.mode, sizeof seq.execution.mode, "sequential");
  seq.train.batch = 1;
  seq.execution.micro_batch = 0;
  st_trainer *t = NULL;
  float *want = run_steps(&seq, N * B, &t);
  if (!want) return;
  size_t n = st_trainer_model(t)->n_params;
  st_trainer_destroy(t);
  for (int mi = 0; mi < nmit; mi++) {
    st_config c = *base;
    c.train.batch = B;
    c.execution.stages = 1;
    snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "%s",
             mits[mi]);
    float *got = run_steps(&c, N, NULL);
    if (got)
      CHECK(memcmp(got, want, n * sizeof *got) == 0,
            "%s %s S=1: weights differ from sequential SGD at batch 1", what,
            mits[mi]);
    free(got);
  }
  free(want);
}

/* BACKGROUND.md 2: with a constant gradient, SC's j-th update equals the
 * undelayed run's (j + D)-th, so w_sc(j) = w0 + w(j + D) - w(D). */
static void test_sc_constant(void) {
  enum { D = 6, STEPS = 60, NW = 3 };
  const float m = 0.9f, lr = 0.05f, g0[NW] = {1.0f, -0.5f, 0.25f};
  st_pool *pool = st_pool_create(1);
  float w[NW] = {0}, v[NW] = {0}, g[NW];
  double ref[STEPS + D + 1][NW];
  memcpy(ref[0], w, sizeof w);
  for (int t = 0; t < STEPS + D; t++) {
    st_optim_rule r;
    st_optim_rule_pb(&r, lr, m, 0, 0, 0, t);
    memcpy(g, g0, sizeof g);
    st_pb_update(pool, &r, w, g, v, NULL, NULL, NW);
    for (int i = 0; i < NW; i++) ref[t + 1][i] = w[i];
  }
  float ws[NW] = {0}, vs[NW] = {0};
  double worst = 0;
  for (int j = 0; j < STEPS; j++) {
    st_optim_rule r;
    st_optim_rule_pb(&r, lr, m, 0, D, 1, j);
    memcpy(g, g0, sizeof g);
    st_pb_update(pool, &r, ws, g, vs, NULL, NULL, NW);
    for (int i = 0; i < NW; i++) {
      double want = ref[j + 1 + D][i] - ref[D][i];
      double e = fabs(ws[i] - want) / (fabs(want) + 1e-3);
      if (e > worst) worst = e;
    }
  }
  CHECK(worst < 1e-5, "sc constant gradient: relative error %.3g", worst);
  /* and the gradient is zeroed; an uncompensated delayed run is not this */
  CHECK(g[0] == 0 && g[1] == 0, "st_pb_update left the gradient");
  st_optim_rule r;
  st_optim_rule_pb(&r, lr, m, 0, D, 1, 1);
  CHECK(fabsf(r.sc_a - powf(m, D)) < 1e-6f &&
            fabsf(r.sc_b - (1 - powf(m, D)) / (1 - m)) < 1e-5f,
        "sc coefficients a %g b %g", r.sc_a, r.sc_b);
  st_optim_rule_pb(&r, lr, m, 0, 0, 1, 1);
  CHECK(!r.sc, "sc at D = 0 must be plain momentum SGD");
  st_pool_destroy(pool);
}

/* Hashes of the weights each forward and backward used, per stage and
 * micro-batch. */
enum { PROBE_S = 4, PROBE_N = 64 };
typedef struct probe {
  uint64_t fwd[PROBE_S][PROBE_N], bwd[PROBE_S][PROBE_N];
  int seen_b[PROBE_S][PROBE_N];
} probe;

static uint64_t hash(const float *w, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)w;
  for (size_t i = 0; i < n * sizeof *w; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static void on_probe(void *arg, int stage, int64_t n, int fwd, const float *w,
                     size_t count) {
  probe *p = arg;
  if (stage >= PROBE_S || n >= PROBE_N) return;
  if (fwd) {
    p->fwd[stage][n] = hash(w, count);
  } else {
    p->bwd[stage][n] = hash(w, count);
    p->seen_b[stage][n] = 1;
  }
}

static void test_stash(const st_config *base) {
  for (int stash = 0; stash < 2; stash++) {
    st_config c = *base;
    c.execution.stages = PROBE_S;
    snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "%s",
             stash ? "stash" : "none");
    st_error err = {0};
    st_trainer *t = make(&c, &err);
    CHECK(t != NULL, "%s", err.msg);
    if (!t) return;
    probe *p = calloc(1, sizeof *p);
    st_pb_set_probe(st_trainer_exec_state(t), on_probe, p);
    double loss;
    for (int i = 0; i < PROBE_N / c.train.batch; i++)
      CHECK(st_trainer_step(t, &loss, &err) == 0, "%s", err.msg);
    int same = 0, differ = 0, backs = 0;
    for (int s = 0; s < PROBE_S; s++)
      for (int n = 0; n < PROBE_N; n++) {
        if (!p->seen_b[s][n]) continue;
        backs++;
        int eq = p->fwd[s][n] == p->bwd[s][n];
        same += eq;
        /* updates happened in between from micro-batch 1 on (D > 0) */
        differ += !eq && n >= 1 && s < PROBE_S - 1;
      }
    if (stash)
      CHECK(same == backs && backs > 100,
            "stash: %d of %d backwards saw their forward's weights", same,
            backs);
    else
      CHECK(differ > 100, "none: only %d backwards saw other weights", differ);
    for (int s = 0; s < PROBE_S; s++) {
      int want = stash ? 2 * (PROBE_S - 1 - s) + 1 : 1;
      int got = st_pb_versions(st_trainer_exec_state(t), s);
      CHECK(got == want, "%s stage %d: %d weight versions, want %d",
            c.execution.mitigation, s, got, want);
    }
    free(p);
    st_trainer_destroy(t);
  }
}

static void test_steady_and_nan(const st_config *base) {
  char first_msg[sizeof(st_error){0}.msg] = "";
  int first_at = -1;
  for (int k = 0; k < 4; k++) {
    int emu = k % 2, ahead = k / 2;
    st_config c = *base;
    c.execution.stages = 4;
    c.execution.emulate = emu;
    c.train.batch = 4;
    st_error err = {0};
    st_trainer *t = make(&c, &err);
    CHECK(t != NULL, "%s", err.msg);
    if (!t) return;
    double loss;
    uint64_t before = 0;
    for (int i = 0; i < 12; i++) {
      if (i == 4) before = st_alloc_count();
      CHECK(st_trainer_step_ahead(t, ahead && i < 11, &loss, &err) == 0, "%s",
            err.msg);
    }
    CHECK(st_alloc_count() == before,
          "emulate=%d ahead=%d: %llu allocations in 8 steps", emu, ahead,
          (unsigned long long)(st_alloc_count() - before));
    st_trainer_destroy(t);

    /* a huge lr: the same step fails with the same message whether or not
     * the next step was already running */
    c.optimizer.lr = 1e38f;
    t = make(&c, &err);
    if (!t) return;
    int rc = 0, i;
    for (i = 0; i < 50 && !rc; i++)
      rc = st_trainer_step_ahead(t, ahead, &loss, &err);
    CHECK(rc == ST_ENONFINITE && strstr(err.msg, "before its backward") &&
              strstr(err.msg, "samples"),
          "emulate=%d ahead=%d: huge lr: rc %d after %d steps: %s", emu, ahead,
          rc, i, err.msg);
    if (first_at < 0) {
      first_at = i;
      snprintf(first_msg, sizeof first_msg, "%s", err.msg);
    } else {
      CHECK(i == first_at && !strcmp(err.msg, first_msg),
            "emulate=%d ahead=%d: failed at step %d (%s), first run at %d (%s)",
            emu, ahead, i, err.msg, first_at, first_msg);
    }
    CHECK(st_trainer_pos(t)->step == i - 1,
          "emulate=%d ahead=%d: position %lld after failing step %d", emu,
          ahead, (long long)st_trainer_pos(t)->step, i);
    rc = st_trainer_step(t, &loss, &err);
    CHECK(rc != 0 && strstr(err.msg, "cannot go on"),
          "emulate=%d ahead=%d: a step after the error: rc %d: %s", emu, ahead,
          rc, err.msg);
    st_trainer_destroy(t);
  }
}

/* Poisons the last stage's weights just before the forward of one
 * micro-batch: its loss is NaN, on any machine. */
typedef struct poison {
  int stage;
  int64_t micro_batch;
} poison;

static void on_poison(void *arg, int stage, int64_t micro_batch, int fwd,
                      const float *w, size_t n) {
  const poison *p = arg;
  /* all of them (a ReLU would turn one NaN unit into 0): the live weights
   * at the last stage (D = 0), which the forward about to run reads */
  if (stage == p->stage && micro_batch == p->micro_batch && fwd)
    for (size_t i = 0; i < n; i++) ((float *)w)[i] = NAN;
}

/* A NaN in the step started ahead: the step before it still returns its
 * loss, and the NaN's step fails with the message it fails with when the
 * steps do not overlap (and emulated). */
static void test_nan_ahead(const st_config *base) {
  enum { K = 4, S = 4 };
  poison target = {S - 1, 2 * K + 1}; /* the third step's second sample */
  char first_msg[sizeof(st_error){0}.msg] = "";
  for (int k = 0; k < 4; k++) {
    int emu = k % 2, ahead = k / 2;
    st_config c = *base;
    c.execution.stages = S;
    c.execution.emulate = emu;
    c.train.batch = K;
    st_error err = {0};
    st_trainer *t = make(&c, &err);
    CHECK(t != NULL, "%s", err.msg);
    if (!t) return;
    st_pb_set_probe(st_trainer_exec_state(t), on_poison, &target);
    double loss;
    int rc = 0, i;
    for (i = 0; i < 6 && !rc; i++)
      rc = st_trainer_step_ahead(t, ahead, &loss, &err);
    CHECK(rc == ST_ENONFINITE && i == 3 && strstr(err.msg, "step 3:") &&
              strstr(err.msg, "samples 9..9"),
          "emulate=%d ahead=%d: NaN at micro-batch 9: rc %d at call %d: %s",
          emu, ahead, rc, i, err.msg);
    if (!k)
      snprintf(first_msg, sizeof first_msg, "%s", err.msg);
    else
      CHECK(!strcmp(err.msg, first_msg), "emulate=%d ahead=%d: '%s', not '%s'",
            emu, ahead, err.msg, first_msg);
    CHECK(st_trainer_pos(t)->step == 2, "emulate=%d ahead=%d: position %lld",
          emu, ahead, (long long)st_trainer_pos(t)->step);
    st_trainer_destroy(t);
  }
}

/* Steps started ahead (st_trainer_step_ahead): the same weights and
 * position as one at a time, across epochs (the next epoch's order made
 * for the step started early) and a cosine schedule (each step its own
 * lr); evaluating or saving with a step still running is refused, and a
 * trainer destroyed then stops it cleanly. */
static void test_ahead(const st_config *base) {
  enum { N = 60 };
  st_config c = *base;
  set_all(&c,
          (const char *[]){"data.train_limit=50", "data.shuffle=true",
                           "optimizer.schedule=cosine",
                           "execution.mitigation=sc+lwp", "execution.stages=4"},
          5);
  c.execution.emulate = 1;
  st_trainer *t = NULL;
  float *want = run_steps(&c, N, &t);
  if (!want) return;
  size_t n = st_trainer_model(t)->n_params;
  st_train_pos pos = *st_trainer_pos(t);
  st_trainer_destroy(t);
  CHECK(pos.epoch >= 2, "the test crosses epochs: epoch %lld",
        (long long)pos.epoch);
  for (int emu = 0; emu < 2; emu++) {
    c.execution.emulate = emu;
    float *got = run_steps_ahead(&c, N, 1, &t);
    if (!got) continue;
    const st_train_pos *p = st_trainer_pos(t);
    CHECK(!memcmp(got, want, n * sizeof *got),
          "emulate=%d: steps started ahead: the weights differ", emu);
    CHECK(p->step == pos.step && p->epoch == pos.epoch &&
              p->epoch_pos == pos.epoch_pos && p->samples == pos.samples,
          "emulate=%d: position step %lld epoch %lld+%lld samples %lld, "
          "want %lld %lld+%lld %lld",
          emu, (long long)p->step, (long long)p->epoch, (long long)p->epoch_pos,
          (long long)p->samples, (long long)pos.step, (long long)pos.epoch,
          (long long)pos.epoch_pos, (long long)pos.samples);
    /* a broken promise: evaluate and save refuse while a step runs */
    double loss, acc;
    st_error err = {0};
    CHECK(st_trainer_step_ahead(t, 1, &loss, &err) == 0, "%s", err.msg);
    CHECK(st_trainer_evaluate(t, &loss, &acc, &err) != 0 &&
              strstr(err.msg, "still running"),
          "emulate=%d: evaluate with a step running: %s", emu, err.msg);
    CHECK(st_trainer_save(t, "/nonexistent/x", &err) != 0 &&
              strstr(err.msg, "still running"),
          "emulate=%d: save with a step running: %s", emu, err.msg);
    st_trainer_destroy(t);
    free(got);
  }
  free(want);
}

static void test_reference_batch(const st_config *base) {
  float lr = 0.1f, m = 0.9f, floor_lr = 0.01f;
  st_optim_scale_batch(&lr, &m, &floor_lr, 128, 1);
  double mh = pow(0.9, 1.0 / 128);
  double lh = 0.1 / 128 * (1 - mh) / 0.1;
  CHECK(fabs(m - mh) < 1e-7 && fabs(lr - lh) / lh < 1e-5 &&
            fabs(floor_lr / lr - 0.1) < 1e-5,
        "reference 128 -> 1: lr %g (want %g), momentum %.7f (want %.7f)", lr,
        lh, m, mh);
  /* per-sample step: (lr/(1-m)) / B kept */
  CHECK(fabs(lh / (1 - mh) - 0.1 / 0.1 / 128) < 1e-6,
        "each sample's total contribution changed");
  lr = 0.1f, m = 0;
  st_optim_scale_batch(&lr, &m, NULL, 8, 32);
  CHECK(fabsf(lr - 0.4f) < 1e-6f && m == 0, "no momentum: lr %g", lr);
  /* the trainer runs the rescaled recipe (micro-batch 1 in PB) */
  st_config c = *base;
  c.optimizer.lr = 0.1f;
  c.optimizer.momentum = 0.9f;
  c.optimizer.reference_batch = 128;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return;
  const st_config *rc = st_trainer_config(t);
  CHECK(fabs(rc->optimizer.momentum - mh) < 1e-7 &&
            fabs(rc->optimizer.lr - lh) / lh < 1e-5,
        "trainer: lr %g momentum %g", rc->optimizer.lr, rc->optimizer.momentum);
  st_trainer_destroy(t);
}

static void test_refusals(const st_config *base) {
  st_error err = {0};
  st_config c = *base;
  set_all(&c, (const char *[]){"optimizer.kind=adamw"}, 1);
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG &&
            strstr(err.msg, "execution.mitigation") &&
            strstr(err.msg, "none or stash"),
        "adamw with sc+lwp: %s", err.msg);
  c = *base;
  c.optimizer.nesterov = 1;
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG &&
            strstr(err.msg, "heavy-ball"),
        "nesterov: %s", err.msg);
  c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "sequential");
  c.execution.emulate = 1;
  /* another mode's key: valid, and listed for the CLI's notice (with the
   * mitigation this config set away from its default); the key the mode
   * reads is not */
  const char *unused[16] = {0};
  err.msg[0] = 0;
  int n_seq = st_config_unused(&c, unused, 16), listed = 0;
  for (int i = 0; i < n_seq && i < 16; i++)
    listed += !strcmp(unused[i], "execution.emulate");
  CHECK(st_config_validate(&c, &err) == 0 && listed == 1,
        "emulate in sequential: a notice (%d of %d keys), not an error: %s",
        listed, n_seq, err.msg);
  snprintf(c.execution.mode, sizeof c.execution.mode, "pipelined_backprop");
  int n_pb = st_config_unused(&c, unused, 16);
  CHECK(n_pb == 0, "emulate in pipelined_backprop: used (%d listed: %s)", n_pb,
        n_pb ? unused[0] : "");
  c = *base;
  c.execution.replicas = 2;
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG &&
            strstr(err.msg, "execution.replicas"),
        "replicas: %s", err.msg);
  c = *base;
  CHECK(st_config_set(&c, "execution.mitigation=magic", &err) == ST_ECONFIG &&
            strstr(err.msg, "sc+lwp"),
        "unknown mitigation: %s", err.msg);
  CHECK(st_config_set(&c, "execution.stages=per_block", &err) == 0 &&
            c.execution.stages == ST_STAGES_PER_BLOCK,
        "per_block: %s", err.msg);
  c = *base;
  c.execution.stages = 9; /* 8 blocks */
  st_trainer *t = make(&c, &err);
  CHECK(!t && strstr(err.msg, "8 blocks"), "9 stages: %s", err.msg);
  st_trainer_destroy(t);
  /* a GPT's tied head and embedding in two stages */
  st_config g;
  gpt_config(&g);
  set_all(&g,
          (const char *[]){"execution.mode=pipelined_backprop",
                           "optimizer.kind=sgd", "execution.stages=2",
                           "execution.mitigation=none"},
          4);
  t = make(&g, &err);
  CHECK(!t && err.code == ST_ECONFIG && strstr(err.msg, "model.tied"),
        "tied gpt: %s", err.msg);
  st_trainer_destroy(t);
  /* untied, it trains */
  g.model.tied = 0;
  float *w = run_steps(&g, 5, NULL);
  CHECK(w != NULL, "untied gpt in 2 stages");
  free(w);
}

/* The replay (st_pb_replay_step) on hand-worked schedules, and on a real
 * threaded run: its wall is no more than the run's (the same busy times
 * with free hand-offs) and no less than any stage's busy time. */
static void test_replay(const st_config *base) {
  st_pb_replay r;
  CHECK(st_pb_replay_init(&r, 2) == 0, "replay: out of memory");
  /* S = 2 (D = 2, 0), forward 1, backward 2, no update, K = 4 a step:
   * stage 0 waits for stage 1's backward of 0 until 4, then both run a
   * pair every 3; ends 9 and 13 after one step, 21 and 25 after two */
  double t[2 * 4 * 3];
  for (int i = 0; i < 2 * 4; i++)
    t[i * 3] = 1, t[i * 3 + 1] = 2, t[i * 3 + 2] = 0;
  for (int i = 0; i < 2; i++) t[i * 3 + 1] = 0; /* pairs 0, 1: no backward */
  st_pb_replay_step(&r, 0, 4, t);
  CHECK(r.clock[0] == 9 && r.clock[1] == 13 && r.wall == 13,
        "replay, first step: clocks %g %g wall %g, want 9 13 13", r.clock[0],
        r.clock[1], r.wall);
  for (int i = 0; i < 2; i++) t[i * 3 + 1] = 2; /* pairs 4, 5 have one */
  st_pb_replay_step(&r, 4, 4, t);
  CHECK(r.clock[0] == 21 && r.clock[1] == 25 && r.wall == 25,
        "replay, second step: clocks %g %g wall %g, want 21 25 25", r.clock[0],
        r.clock[1], r.wall);
  st_pb_replay_free(&r);
  /* the stage after sends before it updates: stage 1's update (1) delays
   * its next pair, not stage 0's backward (which starts at 4, not 5) */
  CHECK(st_pb_replay_init(&r, 2) == 0, "replay: out of memory");
  double u[2 * 3 * 3] = {1, 0, 0, 1, 0, 0, 1, 1, 0,  /* stage 0 */
                         1, 2, 1, 1, 2, 1, 1, 2, 1}; /* stage 1 */
  st_pb_replay_step(&r, 0, 3, u);
  CHECK(r.clock[0] == 5 && r.clock[1] == 13 && r.wall == 13,
        "replay with updates: clocks %g %g wall %g, want 5 13 13", r.clock[0],
        r.clock[1], r.wall);
  st_pb_replay_free(&r);

  for (int S = 2; S <= 4; S += 2) {
    st_config c = *base;
    c.execution.stages = S;
    c.train.batch = 16;
    snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "sc");
    st_error err = {0};
    st_trainer *tr = make(&c, &err);
    CHECK(tr != NULL, "%s", err.msg);
    if (!tr) return;
    double loss;
    for (int i = 0; i < 20; i++)
      CHECK(st_trainer_step_ahead(tr, i < 19, &loss, &err) == 0, "%s", err.msg);
    st_track_stats st[8];
    double wall = 0;
    int n = st_trainer_stats(tr, st, 8, &wall);
    CHECK(n == S, "S=%d: %d tracks", S, n);
    for (int i = 0; i < n && i < 8; i++) {
      CHECK(st[i].bound_s > 0 && st[i].bound_s == st[0].bound_s,
            "S=%d stage %d: replayed wall %g (stage 0's %g)", S, i,
            st[i].bound_s, st[0].bound_s);
      CHECK(st[i].bound_s >= st[i].busy_s * (1 - 1e-12),
            "S=%d stage %d: replayed wall %g under its busy %g", S, i,
            st[i].bound_s, st[i].busy_s);
    }
    CHECK(st[0].bound_s <= wall * (1 + 1e-9),
          "S=%d: replayed wall %g over the real one %g", S, st[0].bound_s,
          wall);
    st_trainer_destroy(tr);
  }
}

/* A resumed run starts with an empty pipeline (pb_start): by its
 * checkpoint's step stage s had done every update but the last D(s)'s, and
 * the rules go on from that count (momentum's first step, AdamW's bias
 * correction, pipemare's warm-up). At micro-batch 1 the first micro-batch
 * after the checkpoint meets in every stage's forward the weights the
 * uninterrupted run's forward of it met, and the last stage (D = 0)
 * updates with its gradient at once: after one resumed step that stage's
 * weights are the uninterrupted run's, bit for bit, while every other
 * stage still holds the checkpoint's (its first update comes D(s) steps
 * later). */
static void test_resume(const st_config *base) {
  enum { N = 9 };
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-pb-resume-%d.safetensors",
           (int)getpid());
  const char *const cases[][2] = {
      {"none", "sgd"}, {"sc+lwp", "sgd"}, {"none", "adamw"}};
  for (int k = 0; k < 3; k++) {
    st_config c = *base;
    c.execution.stages = 4;
    c.train.batch = 1;
    snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "%s",
             cases[k][0]);
    snprintf(c.optimizer.kind, sizeof c.optimizer.kind, "%s", cases[k][1]);
    if (k == 2) c.optimizer.lr = 0.003f;
    st_error err = {0};
    st_trainer *a = NULL, *b = NULL, *r = NULL;
    float *want = run_steps(&c, N + 1, &a);
    float *saved = run_steps(&c, N, &b);
    int ok = want && saved && st_trainer_save(b, path, &err) == 0;
    CHECK(ok, "%s %s: %s", cases[k][0], cases[k][1], err.msg);
    if (ok) r = make(&c, &err);
    ok = r && st_trainer_load(r, path, 0, &err) == 0;
    double loss;
    ok = ok && st_trainer_step(r, &loss, &err) == 0;
    CHECK(ok, "%s %s: resume: %s", cases[k][0], cases[k][1], err.msg);
    if (ok) {
      const st_model *m = st_trainer_model(r);
      int first[8], count[8];
      int S = st_pb_layout(st_trainer_exec_state(r), first, count, NULL);
      const float *got = st_trainer_params(r);
      for (int s = 0; s < S; s++) {
        const st_block *lo = &m->blocks[first[s]],
                       *hi = &m->blocks[first[s] + count[s] - 1];
        size_t off = lo->param_off,
               n = hi->param_off + hi->n_params - lo->param_off;
        const float *ref = s == S - 1 ? want : saved;
        CHECK(memcmp(got + off, ref + off, n * sizeof *got) == 0,
              "%s %s: stage %d of %d after one resumed step: weights differ "
              "from %s",
              cases[k][0], cases[k][1], s, S,
              s == S - 1 ? "the uninterrupted run's" : "the checkpoint's");
      }
    }
    /* into a trainer that has run steps (its pipeline full of
     * micro-batches whose backward would reach the loaded weights): refused,
     * the trainer as it was */
    size_t np = a ? st_trainer_model(a)->n_params : 0;
    for (int only = 0; a && want && k == 0 && only < 2; only++) {
      err = (st_error){0};
      int rc = st_trainer_load(a, path, only, &err);
      CHECK(rc == ST_EUNSUPPORTED && strstr(err.msg, "new trainer") &&
                memcmp(st_trainer_params(a), want, np * sizeof *want) == 0,
            "a checkpoint loaded (weights only: %d) into a pipelined_backprop "
            "trainer that ran %d steps: rc %d, %s",
            only, N + 1, rc, err.msg);
    }
    free(want);
    free(saved);
    st_trainer_destroy(a);
    st_trainer_destroy(b);
    st_trainer_destroy(r);
    unlink(path);
  }
}

/* The count a resumed stage goes on from, through pipemare's warm-up: at
 * 2 stages and micro-batch 1, stage 0 (D = 2) makes its first update after
 * a resume at step N in the resumed run's third step, with the gradient of
 * the first micro-batch after the checkpoint. That gradient is the same
 * whatever the warm-up T (stage 1, D = 0, is never rescaled; the backward
 * runs on w - D delta with delta 0 after the load), so the change of stage
 * 0's weights at T = 20 over the change at T = 1 (factor 1 from t = 1 on)
 * is the warm-up's factor at its count t = N - D:
 * D^-(1 - min(t / T, 1)) = 2^-(1 - 10 / 20) = 0.7071 (t = N: 0.758). */
static void test_resume_count(const st_config *base) {
  enum { N = 12, T = 20, D = 2 };
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-pb-count-%d.safetensors",
           (int)getpid());
  st_config c = *base;
  c.execution.stages = 2;
  c.train.batch = 1;
  c.execution.pipemare_warmup = T;
  snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "pipemare");
  st_error err = {0};
  st_trainer *b = NULL;
  float *saved = run_steps(&c, N, &b);
  int ok = saved && st_trainer_save(b, path, &err) == 0;
  CHECK(ok, "pipemare resume: save: %s", err.msg);
  st_trainer_destroy(b);
  float *after[2] = {NULL, NULL};
  size_t off = 0, n = 0;
  for (int k = 0; ok && k < 2; k++) {
    c.execution.pipemare_warmup = k == 0 ? T : 1;
    st_trainer *r = make(&c, &err);
    double loss;
    ok = r && st_trainer_load(r, path, 0, &err) == 0;
    for (int i = 0; ok && i < D + 1; i++)
      ok = st_trainer_step(r, &loss, &err) == 0;
    CHECK(ok, "pipemare resume, warm-up %d: %s", c.execution.pipemare_warmup,
          err.msg);
    if (ok) {
      const st_model *m = st_trainer_model(r);
      int first[2], count[2];
      st_pb_layout(st_trainer_exec_state(r), first, count, NULL);
      off = m->blocks[first[0]].param_off;
      const st_block *hi = &m->blocks[first[0] + count[0] - 1];
      n = hi->param_off + hi->n_params - off;
      after[k] = malloc(n * sizeof(float));
      memcpy(after[k], st_trainer_params(r) + off, n * sizeof(float));
    }
    st_trainer_destroy(r);
  }
  if (ok && after[0] && after[1]) {
    double warm = 0, plain = 0;
    for (size_t i = 0; i < n; i++) {
      warm += fabs((double)after[0][i] - saved[off + i]);
      plain += fabs((double)after[1][i] - saved[off + i]);
    }
    double want = pow(D, -(1.0 - (double)(N - D) / T)), got = warm / plain;
    /* each change is a difference of floats of about 0.1 that moved by
     * about 1e-3 to 1e-2: 1e-5 relative each; 1e-3 sits 70x under the
     * factor at the count N (0.758) */
    CHECK(plain > 0 && fabs(got / want - 1) < 1e-3,
          "pipemare after a resume at step %d: stage 0's first update "
          "scaled by %.6f, want the warm-up's factor at t = %d, %.6f",
          N, got, N - D, want);
  }
  free(after[0]);
  free(after[1]);
  free(saved);
  unlink(path);
}

int main(void) {
  (void)train; /* models.h's 20-step helper; these tests count their own */
  st_blas_init();
  st_config deep;
  deep_config(&deep);
  const int all_S[] = {2, 4, 8};
  test_threaded_emulated("mlp", &deep, all_S, 3, MITIGATIONS, N_MIT);
  /* every block its own stage */
  st_config per = deep;
  per.execution.stages = ST_STAGES_PER_BLOCK;
  {
    st_error err = {0};
    st_trainer *t = make(&per, &err);
    CHECK(t && st_trainer_stages(t) == 8, "per_block: %d stages: %s",
          t ? st_trainer_stages(t) : -1, err.msg);
    st_trainer_destroy(t);
  }
  st_config cnn;
  cnn_config(&cnn);
  set_all(&cnn,
          (const char *[]){"optimizer.kind=sgd", "optimizer.lr=0.02",
                           "optimizer.weight_decay=0.001",
                           "execution.mode=pipelined_backprop",
                           "train.batch=2"},
          5);
  const int cnn_S[] = {2, 4};
  const char *const cnn_mits[] = {"stash", "sc+lwp", "pipemare"};
  test_threaded_emulated("cnn", &cnn, cnn_S, 2, cnn_mits, 3);
  st_config adam = deep;
  set_all(&adam, (const char *[]){"optimizer.kind=adamw", "optimizer.lr=0.003"},
          2);
  const int adam_S[] = {4};
  test_threaded_emulated("mlp adamw", &adam, adam_S, 1, MITIGATIONS, 2);
  test_ahead(&deep);
  test_nan_ahead(&deep);
  /* micro-batch 1 folds linear layers' updates, and the prediction of the
   * next forward's weights, into the backward: the same bits as updating
   * after it and predicting in a pass of its own */
  for (int k = 0; k < 2 * N_MIT; k++) {
    int mi = k % N_MIT;
    st_config c = deep;
    c.execution.stages = 4;
    /* the second round with a cosine schedule: each step's learning rate
     * differs, so a prediction written by an update of the step before
     * must not be used */
    if (k >= N_MIT)
      set_all(&c,
              (const char *[]){"optimizer.schedule=cosine", "train.steps=50"},
              2);
    snprintf(c.execution.mitigation, sizeof c.execution.mitigation, "%s",
             MITIGATIONS[mi]);
    st_trainer *t = NULL;
    float *fused = run_steps(&c, 50, &t);
    size_t n = t ? st_trainer_model(t)->n_params : 0;
    st_trainer_destroy(t);
    c.execution.fused_update = 0;
    float *plain = run_steps(&c, 50, NULL);
    CHECK(fused && plain && memcmp(fused, plain, n * sizeof *fused) == 0,
          "%s%s: fused updates differ from updates after the backward",
          MITIGATIONS[mi], k >= N_MIT ? " (cosine)" : "");
    free(fused);
    free(plain);
  }
  test_one_stage("mlp", &deep, MITIGATIONS, N_MIT);
  test_one_stage("mlp adamw", &adam, MITIGATIONS, 2);
  test_one_stage("cnn", &cnn, cnn_mits, 3);
  /* a tied GPT fits only one stage: its head's gradient must reach the
   * embedding, and the head must follow it (context 1: the head's update
   * would be fused, but a tied copy never is). With one stage D = 0 and
   * every mitigation is `none`'s rule (test_one_stage above), so `none`
   * alone. */
  for (int k = 0; k < 4; k++) {
    st_config g;
    gpt_config(&g);
    set_all(
        &g,
        (const char *[]){"execution.mode=pipelined_backprop", "model.dropout=0",
                         k & 1 ? "model.context=1" : "model.context=8",
                         k & 2 ? "optimizer.kind=adamw" : "optimizer.kind=sgd"},
        4);
    test_one_stage(k & 1 ? "tied gpt, context 1" : "tied gpt", &g, MITIGATIONS,
                   1);
  }
  test_sc_constant();
  test_stash(&deep);
  test_steady_and_nan(&deep);
  test_reference_batch(&deep);
  test_refusals(&deep);
  test_replay(&deep);
  test_resume(&deep);
  test_resume_count(&deep);
  TH_DONE();
}
