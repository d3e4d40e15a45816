/*
 * test_rt.c — the stage runtime (src/runtime/) on its own, without an
 * executor above it:
 *  - links between in-process stages deliver every message, in order, with
 *    the sender's own buffer (no copy), forward and back, with the stages
 *    on their own threads;
 *  - a message for the wrong micro-batch, a ring that overflows and (one
 *    thread running every stage) a message that is not there yet are
 *    internal errors that stop the step, never computed on;
 *  - st_rt_fail stops a stage that waits for a message that never comes,
 *    and the first error wins;
 *  - the micro-batch loss step against softmax cross-entropy computed here
 *    in double: the losses land at micro-batch k's rows, the gradient is
 *    (softmax - one-hot) / over.
 * The pipelines and pipelined backprop on top are held to their contracts
 * (bit-identity with sequential, the emulator) in tests/exec/.
 */
#include "harness.h"
#include "strata.h"

#include "../../src/runtime/runtime.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

enum { S = 3, N = 40 }; /* stages, messages each way */

/* A stage as a schedule would hold it: the runtime's part first. */
typedef struct test_stage {
  st_rt_stage rt;
  float buf[N];            /* what it sends: buf + n for micro-batch n */
  const float *fwd_got[N]; /* what arrived, in order */
  const float *bwd_got[N];
  int ok; /* its loop ran to the end */
} test_stage;

static test_stage stages[S];
static st_trainer_view view; /* no trace */

/* Forward n from stage 0 to the last, back again, for n = 0 .. N-1. */
static void *relay(void *arg) {
  test_stage *t = arg;
  st_rt_stage *st = &t->rt;
  int last = st->index == S - 1;
  for (int n = 0; n < N; n++) {
    if (st->index > 0) {
      if (!(t->fwd_got[n] = st_rt_recv(st, &view, ST_RT_FWD, n))) return NULL;
    }
    if (!last && st_rt_send(st, &view, ST_RT_FWD, n, t->buf + n)) return NULL;
    if (!last) {
      if (!(t->bwd_got[n] = st_rt_recv(st, &view, ST_RT_BWD, n))) return NULL;
    }
    if (st->index > 0 && st_rt_send(st, &view, ST_RT_BWD, n, t->buf + n))
      return NULL;
  }
  t->ok = 1;
  return NULL;
}

/* A stage that waits for a forward message nobody sends. */
static void *waits(void *arg) {
  test_stage *t = arg;
  t->ok = st_rt_recv(&t->rt, &view, ST_RT_FWD, 0) == NULL;
  return NULL;
}

static st_model *tiny_model(void) {
  st_config c;
  st_config_defaults(&c);
  st_error err = {0};
  CHECK(st_config_set(&c, "model.hidden=[8,8]", &err) == 0, "%s", err.msg);
  st_model *m = NULL;
  CHECK(st_model_create(&m, &c, (st_shape){1, 4, 4}, &err) == 0, "%s", err.msg);
  return m;
}

/* A runtime of S stages on m, one block each (the last takes the rest),
 * channels of cap messages. */
static void make_rt(st_rt *rt, const st_model *m, int cap) {
  st_error err = {0};
  memset(stages, 0, sizeof stages);
  CHECK(st_rt_init(rt, m, 1, S, "test") == 0, "st_rt_init");
  rt->S = S;
  for (int s = 0; s < S; s++) {
    st_rt_stage *st = &stages[s].rt;
    rt->st[s] = st;
    st->rt = rt;
    st->index = s;
    st->first = s;
    st->count = s == S - 1 ? m->n_blocks - s : 1;
    st->cores = 1;
    st->local = 1;
    st->slots = 1;
    st->rx_ring = 2;
    st->tx_ring = 2;
    snprintf(st->name, sizeof st->name, "stage %d", s);
    CHECK(st_rt_stage_alloc(st, 0, cap, cap, 0, &err) == 0, "%s", err.msg);
  }
}

/* Waits for every stage's thread to return (then what it wrote is seen). */
static void join_all(void) {
  for (int s = 0; s < S; s++)
    if (stages[s].rt.started) {
      pthread_join(stages[s].rt.thread, NULL);
      stages[s].rt.started = 0;
    }
}

static void free_rt(st_rt *rt) {
  st_rt_stop_threads(rt);
  for (int s = 0; s < S; s++) st_rt_stage_free(&stages[s].rt);
  st_rt_free(rt);
}

static void test_relay(const st_model *m) {
  st_rt rt;
  make_rt(&rt, m, 4);
  rt.spin = ST_SPIN;
  CHECK(st_rt_start(&rt, relay) == 0, "threads start");
  join_all();
  for (int s = 0; s < S; s++) CHECK(stages[s].ok, "stage %d ran to the end", s);
  int in_order = 1;
  for (int n = 0; n < N; n++) {
    for (int s = 1; s < S; s++)
      in_order &= stages[s].fwd_got[n] == stages[s - 1].buf + n;
    for (int s = 0; s < S - 1; s++)
      in_order &= stages[s].bwd_got[n] == stages[s + 1].buf + n;
  }
  CHECK(in_order, "every message arrives in order, as the sender's buffer");
  st_error err = {0};
  CHECK(st_rt_result(&rt, &err) == 0, "no error: %s", err.msg);
  free_rt(&rt);
}

static void test_schedule_bugs(const st_model *m) {
  st_rt rt;
  st_error err = {0};
  make_rt(&rt, m, 2);
  /* micro-batch 1 arrives where 0 is due */
  CHECK(st_rt_send(&stages[0].rt, &view, ST_RT_FWD, 1, stages[0].buf) == 0,
        "send");
  CHECK(st_rt_recv(&stages[1].rt, &view, ST_RT_FWD, 0) == NULL,
        "out of order: not delivered");
  CHECK(st_rt_result(&rt, &err) == ST_EUNSUPPORTED &&
            strstr(err.msg, "internal error: test") &&
            strstr(err.msg, "out of order") && strstr(err.msg, "stage 1"),
        "out of order: %s", err.msg);
  free_rt(&rt);

  make_rt(&rt, m, 2);
  int rc[3];
  for (int n = 0; n < 3; n++)
    rc[n] = st_rt_send(&stages[1].rt, &view, ST_RT_BWD, n, stages[1].buf + n);
  CHECK(rc[0] == 0 && rc[1] == 0 && rc[2] == -1, "a ring of 2: %d %d %d", rc[0],
        rc[1], rc[2]);
  CHECK(st_rt_result(&rt, &err) == ST_EUNSUPPORTED &&
            strstr(err.msg, "overflowed") && strstr(err.msg, "stage 0"),
        "overflow: %s", err.msg);
  free_rt(&rt);

  /* one thread runs every stage: a missing message is a schedule bug, not
   * something to wait for */
  make_rt(&rt, m, 2);
  rt.emulate = 1;
  CHECK(st_rt_recv(&stages[2].rt, &view, ST_RT_FWD, 0) == NULL &&
            st_rt_result(&rt, &err) == ST_EUNSUPPORTED &&
            strstr(err.msg, "not ready"),
        "emulated, not ready: %s", err.msg);
  free_rt(&rt);
}

static void test_fail(const st_model *m) {
  st_rt rt;
  make_rt(&rt, m, 2);
  rt.spin = 100; /* then sleep: the stop must wake it */
  CHECK(st_rt_start(&rt, waits) == 0, "threads start");
  usleep(20000);
  st_error first = {0}, second = {0}, err = {0};
  st_error_set(&first, ST_EIO, "the first");
  st_error_set(&second, ST_ENOMEM, "the second");
  st_rt_fail(&rt, &first);
  st_rt_fail(&rt, &second);
  join_all();
  CHECK(stages[0].ok && stages[1].ok && stages[2].ok,
        "every waiting stage gave up");
  CHECK(st_rt_result(&rt, &err) == ST_EIO && strstr(err.msg, "the first"),
        "the first error wins: %s", err.msg);
  free_rt(&rt);
}

/* Softmax cross-entropy of micro-batch k = 1 of one sample with two label
 * rows (a sequence of two tokens), 3 classes, against the formula in
 * double: loss_i = log sum_j e^{z_ij} - z_{i y_i}, gradient
 * (p_ij - [j == y_i]) / (over R), the mean over over samples' R rows. */
static void test_loss(const st_model *m) {
  st_model mm = *m;
  mm.classes = 3;
  mm.label_rows = 2;
  const float logits[6] = {1.0f, -2.0f, 0.5f, 3.0f, 3.0f, -1.0f};
  const int y[4] = {0, 0, 2, 1};
  float losses[4] = {-7, -7, -7, -7}, probs[6], dlogits[6];
  st_trainer_view v = {0};
  v.model = &mm;
  v.losses = losses;
  v.y = y;
  st_rt_loss(&v, NULL, 1, 1, logits, probs);
  st_rt_loss_grad(&v, NULL, 1, 1, 8, probs, dlogits);
  CHECK(losses[0] == -7 && losses[1] == -7, "micro-batch 0's rows untouched");
  double worst = 0, worst_g = 0;
  for (int i = 0; i < 2; i++) {
    const float *z = logits + 3 * i;
    double sum = 0;
    for (int j = 0; j < 3; j++) sum += exp((double)z[j]);
    int label = y[2 + i];
    double want = log(sum) - z[label];
    worst = fmax(worst, fabs(losses[2 + i] - want) / want);
    for (int j = 0; j < 3; j++) {
      double g = (exp((double)z[j]) / sum - (j == label)) / (8 * 2);
      worst_g = fmax(worst_g, fabs(dlogits[3 * i + j] - g));
    }
  }
  /* fp32 softmax and log: a few ulps of values near 1 */
  CHECK(worst < 1e-6, "losses: relative error %.3g", worst);
  CHECK(worst_g < 1e-7, "gradient: error %.3g", worst_g);
}

/* What a stage holds (the figure weight streaming checks
 * execution.compute_memory_limit against), as DESIGN's buffers: the
 * backward's workspace (3 spans of max_numel per sample), the two gradient
 * hand-off buffers (2 spans), scratch, and every block's activations, or
 * with shared activations the largest block's once. */
static void test_bytes(const st_model *m) {
  const int B = 5, n = m->n_blocks;
  size_t span = (size_t)B * m->max_numel, acts = 0, most = 0;
  for (int i = 0; i < n; i++) {
    acts += (size_t)B * m->blocks[i].act_per_sample;
    if (m->blocks[i].act_per_sample > most) most = m->blocks[i].act_per_sample;
  }
  size_t rest = 3 * span + 2 * span + (size_t)B * m->max_scratch_per_sample;
  CHECK(st_stage_bytes(m, 0, n, B, 0) == (rest + acts) * sizeof(float),
        "stage bytes: %zu, want %zu", st_stage_bytes(m, 0, n, B, 0),
        (rest + acts) * sizeof(float));
  CHECK(st_stage_bytes(m, 0, n, B, 1) == (rest + B * most) * sizeof(float),
        "shared stage bytes: %zu, want %zu", st_stage_bytes(m, 0, n, B, 1),
        (rest + B * most) * sizeof(float));
  /* a shared stage's blocks all write the one buffer; destroyed once */
  st_stage *s = NULL;
  st_error err = {0};
  CHECK(st_stage_create_shared(&s, m, 0, n, B, 1, &err) == 0, "%s", err.msg);
  int one = s != NULL;
  for (int i = 1; s && i < n; i++) one &= s->acts[i] == s->acts[0];
  CHECK(one, "shared activations: one buffer");
  st_stage_destroy(s);
  /* a stage's workspace is sized by its own blocks (the last alone) */
  const st_block *bl = &m->blocks[n - 1];
  size_t own = (5 * (size_t)B * bl->max_numel +
                (size_t)B * bl->scratch_floats_per_sample) *
               sizeof(float);
  CHECK(st_stage_work_bytes(m, n - 1, 1, B) == own &&
            st_stage_bytes(m, n - 1, 1, B, 0) ==
                own + (size_t)B * bl->act_per_sample * sizeof(float) &&
            (bl->max_numel < m->max_numel ||
             bl->scratch_floats_per_sample < m->max_scratch_per_sample),
        "the last block's stage: %zu workspace bytes, want %zu (not the "
        "model's largest)",
        st_stage_work_bytes(m, n - 1, 1, B), own);
  /* the activation slots of one stage share one workspace, each with its
   * own activations; freed once (ASan sees a second free) */
  st_rt rt;
  CHECK(st_rt_init(&rt, m, B, 1, "test") == 0, "st_rt_init");
  rt.S = 1;
  st_rt_stage one_stage;
  memset(&one_stage, 0, sizeof one_stage);
  st_rt_stage *st = &one_stage;
  rt.st[0] = st;
  st->rt = &rt;
  st->count = n;
  st->cores = st->local = 1;
  st->slots = 3;
  st->rx_ring = st->tx_ring = 2;
  snprintf(st->name, sizeof st->name, "slots");
  int rc = st_rt_stage_alloc(st, 0, 4, 4, 0, &err);
  CHECK(rc == 0, "%s", err.msg);
  int shared = rc == 0, apart = rc == 0;
  for (int j = 1; !rc && j < 3; j++) {
    const st_stage *a = st->run[0], *b = st->run[j];
    shared &= b->work == a->work && b->scratch == a->scratch &&
              b->grad_io[0] == a->grad_io[0] && b->grad_io[1] == a->grad_io[1];
    apart &= b->acts[0] != a->acts[0];
  }
  CHECK(shared && apart,
        "3 slots: one workspace %s, activations of their own %s",
        shared ? "yes" : "NO", apart ? "yes" : "NO");
  st_rt_stage_free(st);
  st_rt_free(&rt);
}

int main(void) {
  /* generous: TSan runs the threads 10-20x slower */
  th_alarm(300, "FAIL tests/runtime/test_rt.c: the test ran 300 s: a stage "
                "waiting for ever (a lost wake)\n");
  st_model *m = tiny_model();
  if (!m) TH_DONE();
  CHECK(m->n_blocks >= S, "%d blocks for %d stages", m->n_blocks, S);
  test_relay(m);
  test_schedule_bugs(m);
  test_fail(m);
  test_loss(m);
  test_bytes(m);
  st_model_destroy(m);
  TH_DONE();
}
