/*
 * test_train.c — contracts of a training run that must hold bit for bit:
 *  - resume: 2N steps in one go == N steps, checkpoint, new process state,
 *    load, N more steps (weights, optimizer state, data position, dropout);
 *  - determinism: the same config and seed give identical weights with 1 and
 *    3 threads, and twice in a row;
 *  - steady state allocates nothing: st_alloc_count does not move over 20
 *    steps after the first;
 *  - at batch 1 the update folded into the backward (execution.fused_update)
 *    gives exactly the weights of computing gradients and then updating;
 *  - the loss a step reports is the whole batch's mean, in micro-batches
 *    too; a step stopped by a non-finite loss leaves no partial gradient
 *    (sequential and a 1f1b pipeline, reloaded and stepped again);
 *  - a run whose weights hold a NaN while its losses stay finite writes no
 *    checkpoint of them;
 *  - a stop asked for ends one run, not the next.
 */
#include "harness.h"
#include "strata.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

/* A small CNN with a residual block, group norm, dropout, AdamW, cosine
 * schedule and shuffling, on 1000 samples so runs cross epoch boundaries
 * (31 steps per epoch at batch 32): every piece of state a resume needs. */
static void cnn_config(st_config *c) {
  st_config_defaults(c);
  snprintf(c->model.kind, sizeof c->model.kind, "cnn");
  c->model.channels = (st_int_list){2, {8, 16}};
  c->model.residual_blocks = 1;
  snprintf(c->model.norm, sizeof c->model.norm, "groupnorm");
  c->model.groups = 4;
  c->model.dense = (st_int_list){1, {32}};
  c->model.dropout = 0.2f;
  c->data.train_limit = 1000;
  c->data.test_limit = 100;
  c->train.batch = 32;
  c->train.steps = 80;
  c->train.threads = 2;
  snprintf(c->optimizer.kind, sizeof c->optimizer.kind, "adamw");
  c->optimizer.lr = 2e-3f;
  c->optimizer.weight_decay = 0.01f;
  snprintf(c->optimizer.schedule, sizeof c->optimizer.schedule, "cosine");
  c->optimizer.warmup_steps = 5;
  snprintf(c->metrics.progress, sizeof c->metrics.progress, "off");
}

static void mlp_config(st_config *c) {
  st_config_defaults(c);
  c->data.train_limit = 2000;
  c->data.test_limit = 100;
  c->model.dropout = 0.1f;
  c->train.batch = 16;
  c->train.steps = 60;
  c->optimizer.nesterov = 1;
  snprintf(c->metrics.progress, sizeof c->metrics.progress, "off");
}

/* A GPT with a tied head, dropout, AdamW and shuffled windows of the
 * committed corpus (337 windows of 16: 42 steps per epoch at batch 8). */
static void gpt_config(st_config *c) {
  st_config_defaults(c);
  st_error err = {0};
  const char *sets[] = {"model.kind=gpt",
                        "data.dataset=text",
                        "data.path=tests/fixtures/gpt_corpus.txt",
                        "model.context=16",
                        "model.layers=2",
                        "model.heads=2",
                        "model.width=32",
                        "model.dropout=0.1",
                        "model.activation=gelu_tanh",
                        "train.batch=8",
                        "train.threads=2",
                        "optimizer.kind=adamw",
                        "optimizer.lr=0.003",
                        "optimizer.weight_decay=0.1",
                        "optimizer.schedule=cosine",
                        "train.steps=100",
                        "metrics.progress=off"};
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    CHECK(st_config_set(c, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
}

static st_trainer *make(const st_config *c) {
  st_error err = {0};
  st_trainer *t = NULL;
  int rc = st_trainer_create(&t, c, NULL, &err);
  CHECK(rc == 0, "trainer: %s", err.msg);
  return t;
}

static int steps(st_trainer *t, int n) {
  st_error err = {0};
  double loss;
  for (int i = 0; i < n; i++)
    if (st_trainer_step(t, &loss, &err)) {
      CHECK(0, "step: %s", err.msg);
      return -1;
    }
  return 0;
}

static float *copy_params(st_trainer *t) {
  size_t n = st_trainer_model(t)->n_params;
  float *p = malloc(n * sizeof *p);
  memcpy(p, st_trainer_params(t), n * sizeof *p);
  return p;
}

static void test_resume(const char *what, const st_config *c, int n) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-resume-%d.safetensors",
           (int)getpid());
  st_error err = {0};
  st_trainer *a = make(c);
  if (!a || steps(a, 2 * n)) return;
  float *want = copy_params(a);
  size_t np = st_trainer_model(a)->n_params;
  st_trainer *b = make(c);
  if (!b || steps(b, n)) return;
  CHECK(st_trainer_save(b, path, &err) == 0, "save: %s", err.msg);
  st_trainer_destroy(b);
  st_trainer *r = make(c); /* fresh state, re-initialised weights */
  CHECK(st_trainer_load(r, path, 0, &err) == 0, "load: %s", err.msg);
  CHECK(st_trainer_pos(r)->step == n, "%s: resumed at step %lld, want %d", what,
        (long long)st_trainer_pos(r)->step, n);
  steps(r, n);
  CHECK(memcmp(st_trainer_params(r), want, np * sizeof(float)) == 0,
        "%s: resumed weights differ from an uninterrupted run", what);
  CHECK(st_trainer_pos(r)->samples == st_trainer_pos(a)->samples &&
            st_trainer_pos(r)->epoch == st_trainer_pos(a)->epoch,
        "%s: data position differs after resume", what);
  unlink(path);
  free(want);
  st_trainer_destroy(a);
  st_trainer_destroy(r);
}

static void test_threads(const char *what, st_config c, int n) {
  c.train.threads = 1;
  st_trainer *one = make(&c);
  c.train.threads = 3;
  st_trainer *three = make(&c);
  st_trainer *again = make(&c);
  if (!one || !three || !again) return;
  steps(one, n);
  steps(three, n);
  steps(again, n);
  size_t np = st_trainer_model(one)->n_params;
  CHECK(memcmp(st_trainer_params(one), st_trainer_params(three),
               np * sizeof(float)) == 0,
        "%s: 1 thread and 3 threads give different weights", what);
  CHECK(memcmp(st_trainer_params(three), st_trainer_params(again),
               np * sizeof(float)) == 0,
        "%s: two identical runs differ", what);
  st_trainer_destroy(one);
  st_trainer_destroy(three);
  st_trainer_destroy(again);
}

static void test_no_alloc(const char *what, const st_config *c) {
  st_trainer *t = make(c);
  if (!t) return;
  steps(t, 1);
  uint64_t before = st_alloc_count();
  steps(t, 40); /* crosses an epoch boundary: reshuffling allocates nothing */
  uint64_t after = st_alloc_count();
  CHECK(after == before, "%s: %llu allocations in 40 steady-state steps", what,
        (unsigned long long)(after - before));
  st_trainer_destroy(t);
}

/* Fused and unfused batch-1 training must agree bit for bit: an MLP with a
 * layernorm (a block whose linear layer fuses and whose norm does not) and
 * a CNN whose dense layers fuse while its convs do not, with SGD (Nesterov,
 * weight decay) and AdamW. */
static void test_fused(const char *what, st_config c, int n) {
  c.train.batch = 1;
  c.execution.fused_update = 1;
  st_trainer *fused = make(&c);
  c.execution.fused_update = 0;
  st_trainer *plain = make(&c);
  if (!fused || !plain) return;
  steps(fused, n);
  steps(plain, n);
  size_t np = st_trainer_model(fused)->n_params;
  CHECK(memcmp(st_trainer_params(fused), st_trainer_params(plain),
               np * sizeof(float)) == 0,
        "%s: fused batch-1 update differs from gradient-then-update", what);
  /* The optimizer state too, in the slab's layout (AdamW: m, then v): the
   * fused run's checkpoint, resumed without fusing, must go on as the
   * plain run does. Equal weights alone miss state kept in another order
   * (a bias's m and v swapped by the fused path give the same weights). */
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-fused-%d.safetensors",
           (int)getpid());
  st_error err = {0};
  st_trainer *resumed = make(&c);
  if (resumed) {
    CHECK(st_trainer_save(fused, path, &err) == 0 &&
              st_trainer_load(resumed, path, 0, &err) == 0,
          "%s: save or load: %s", what, err.msg);
    steps(resumed, 3);
    steps(plain, 3);
    CHECK(memcmp(st_trainer_params(resumed), st_trainer_params(plain),
                 np * sizeof(float)) == 0,
          "%s: the fused run's state, resumed unfused, differs", what);
    st_trainer_destroy(resumed);
  }
  remove(path);
  st_trainer_destroy(fused);
  st_trainer_destroy(plain);
}

/* The loss a step reports is the mean over the whole batch, whatever the
 * split: micro-batches of 4 report what the unsplit batch does, step by
 * step. The two runs see the same samples, dropout masks (drawn by sample
 * index) and initial weights; only the GEMMs' rounding at 4 rows against
 * 16 differs, ~1e-7 relative, and 5 steps of SGD carry that to ~1e-6:
 * 1e-5 relative. A mean over the micro-batches seen so far, or over stale
 * rows of the last step, is off by far more. */
static void test_split_loss(const char *what, st_config c) {
  c.train.batch = 16;
  c.execution.micro_batch = 0;
  st_trainer *whole = make(&c);
  c.execution.micro_batch = 4;
  st_trainer *split = make(&c);
  if (!whole || !split) return;
  st_error err = {0};
  for (int i = 0; i < 5; i++) {
    double a = 0, b = 0;
    int ra = st_trainer_step(whole, &a, &err);
    int rb = st_trainer_step(split, &b, &err);
    CHECK(ra == 0 && rb == 0 && fabs(a - b) <= 1e-5 * fabs(a),
          "%s: step %d: loss %.9g in micro-batches of 4, %.9g unsplit", what,
          i + 1, b, a);
  }
  st_trainer_destroy(whole);
  st_trainer_destroy(split);
}

/* A step stopped by a non-finite loss leaves no gradient behind: the
 * micro-batches before the last have run their backward into the
 * gradient slab when the last one's loss stops the step, and the trainer
 * clears them. Reloaded from its step-0 checkpoint, the trainer's next
 * step must give exactly the weights its first step gave. (lr 1e38: the
 * weights are ~1e36 after one update and the next logits overflow.) */
static void test_nan_clears(const char *what, st_config c) {
  c.train.batch = 16;
  c.execution.micro_batch = 4;
  c.optimizer.lr = 1e38f;
  st_trainer *t = make(&c);
  if (!t) return;
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-nan-%d.safetensors", (int)getpid());
  st_error err = {0};
  CHECK(st_trainer_save(t, path, &err) == 0, "save: %s", err.msg);
  size_t np = st_trainer_model(t)->n_params;
  float *first = NULL;
  double loss;
  int rc = 0, i;
  for (i = 0; i < 10 && !rc; i++) {
    rc = st_trainer_step(t, &loss, &err);
    if (i == 0) first = copy_params(t);
  }
  CHECK(i > 1 && rc == ST_ENONFINITE, "%s: huge lr: rc %d after %d steps: %s",
        what, rc, i, err.msg);
  rc = st_trainer_load(t, path, 0, &err);
  CHECK(rc == 0, "load: %s", err.msg);
  rc = rc ? rc : st_trainer_step(t, &loss, &err);
  CHECK(rc == 0 && first &&
            memcmp(first, st_trainer_params(t), np * sizeof(float)) == 0,
        "%s: after a stopped step, step 1 again gives other weights (a "
        "partial gradient kept?): rc %d %s",
        what, rc, rc ? err.msg : "");
  unlink(path);
  free(first);
  st_trainer_destroy(t);
}

/* A run refuses what would make it index out of bounds or silently train
 * something else: labels beyond model.classes, a checkpoint of another run
 * (seed, batch), a checkpoint whose position is out of range. A refused
 * load leaves the trainer exactly as it was. */
static void test_refusals(const st_config *base) {
  st_error err = {0};
  st_trainer *t = NULL;
  st_config c = *base;
  c.model.classes = 5;
  int rc = st_trainer_create(&t, &c, NULL, &err);
  CHECK(rc == ST_ECONFIG && strstr(err.msg, "model.classes") &&
            strstr(err.msg, "labels up to 9"),
        "classes 5 on Fashion-MNIST: rc %d, %s", rc, err.msg);

  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-refuse-%d.safetensors",
           (int)getpid());
  st_trainer *a = make(base);
  if (!a) return;
  steps(a, 3);
  CHECK(st_trainer_save(a, path, &err) == 0, "save: %s", err.msg);
  const char *keys[2] = {"train.seed", "train.batch"};
  for (int k = 0; k < 2; k++) {
    c = *base;
    if (k == 0) c.train.seed += 1;
    if (k == 1) c.train.batch *= 2;
    st_trainer *b = make(&c);
    if (!b) continue;
    size_t np = st_trainer_model(b)->n_params;
    float *before = copy_params(b);
    rc = st_trainer_load(b, path, 0, &err);
    CHECK(rc == ST_ECONFIG && strstr(err.msg, keys[k]) &&
              strstr(err.msg, "same run"),
          "resume under another %s: rc %d, %s", keys[k], rc, err.msg);
    CHECK(memcmp(before, st_trainer_params(b), np * sizeof(float)) == 0 &&
              st_trainer_pos(b)->step == 0,
          "a refused load changed the trainer (%s)", keys[k]);
    free(before);
    st_trainer_destroy(b);
  }
  /* Out-of-range positions written by hand. */
  st_train_pos bad[2] = {{.step = 3,
                          .epoch = 0,
                          .epoch_pos = -64,
                          .samples = 96,
                          .seed = base->train.seed,
                          .batch = base->train.batch,
                          .train_samples = 2000,
                          .shuffle = 1},
                         {.step = 3,
                          .epoch = 0,
                          .epoch_pos = 4000,
                          .samples = 96,
                          .seed = base->train.seed,
                          .batch = base->train.batch,
                          .train_samples = 2000,
                          .shuffle = 1}};
  const char *want[2] = {"below its minimum", "exceeds"};
  for (int k = 0; k < 2; k++) {
    const st_model *m = st_trainer_model(a);
    rc = st_checkpoint_save(path, m, st_trainer_params(a), NULL, "sgd", &bad[k],
                            &err);
    st_train_pos got;
    if (!rc)
      rc = st_checkpoint_load(path, m, st_trainer_params(a), NULL, "sgd", &got,
                              &err);
    CHECK(rc == ST_EFORMAT && strstr(err.msg, "epoch_pos") &&
              strstr(err.msg, want[k]),
          "tampered epoch_pos %lld: rc %d, %s", (long long)bad[k].epoch_pos, rc,
          err.msg);
  }
  unlink(path);
  st_trainer_destroy(a);
}

/* A NaN weight: the run stops and writes no checkpoint of it (its resume
 * would refuse the file). Where the weight reaches the loss (an MLP's
 * first weight: relu keeps the NaN) the loss's check stops it; where it
 * never does (`hidden`: an untied GPT's embedding row of a byte the
 * corpus lacks) the checkpoint's own check, naming the tensor. */
static void test_nan_weight_run(const char *what, st_config c,
                                const char *hidden) {
  char dir[] = "/tmp/strata-nanw-XXXXXX", cmd[64];
  if (!mkdtemp(dir)) {
    CHECK(0, "%s: mkdtemp", what);
    return;
  }
  c.train.steps = 3;
  st_error err = {0};
  st_trainer *t = NULL;
  int rc = st_trainer_create(&t, &c, dir, &err);
  CHECK(rc == 0, "%s: trainer: %s", what, err.msg);
  if (t) {
    st_trainer_params(t)[0] = NAN; /* blocks.0's first weight */
    rc = st_trainer_run(t, &err);
    CHECK(rc == ST_ENONFINITE && strstr(err.msg, "NaN") &&
              strstr(err.msg, "no checkpoint written") &&
              (!hidden || (strstr(err.msg, hidden) &&
                           strstr(err.msg, "NaN at element 0"))),
          "%s: a NaN weight was not refused: rc %d, %s", what, rc, err.msg);
    int64_t *ck = NULL;
    int n = st_run_checkpoints(dir, &ck, &err);
    CHECK(n == 0, "%s: %d checkpoint(s) of a NaN weight written", what, n);
    free(ck);
    st_trainer_destroy(t);
  }
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0, "%s: %s", what, cmd);
}

/* A stop asked for (a signal) ends the run it reaches, not the next one a
 * library user starts in the same process. */
static void test_stop_spent(const char *what, st_config c) {
  c.train.steps = 3;
  st_error err = {0};
  st_run_request_stop(SIGINT);
  for (int k = 0; k < 2; k++) {
    st_trainer *t = make(&c);
    if (!t) return;
    int rc = st_trainer_run(t, &err);
    int64_t want = k ? 3 : 0;
    CHECK(rc == 0 && st_trainer_pos(t)->step == want &&
              st_run_stopped_by() == (k ? 0 : SIGINT),
          "%s: run %d: rc %d (%s), stopped at step %lld by %d, want step "
          "%lld",
          what, k + 1, rc, err.msg, (long long)st_trainer_pos(t)->step,
          st_run_stopped_by(), (long long)want);
    st_trainer_destroy(t);
  }
}

int main(void) {
  st_blas_init();
  st_config cnn, mlp;
  cnn_config(&cnn);
  mlp_config(&mlp);
  test_resume("cnn adamw cosine dropout", &cnn, 40);
  test_resume("mlp sgd nesterov dropout", &mlp, 30);
  st_config gpt;
  gpt_config(&gpt);
  test_resume("gpt tied adamw dropout", &gpt, 50);
  test_threads("gpt", gpt, 12);
  test_no_alloc("gpt", &gpt);
  test_threads("cnn", cnn, 12);
  test_threads("mlp", mlp, 12);
  test_no_alloc("cnn", &cnn);
  test_no_alloc("mlp", &mlp);
  test_refusals(&mlp);
  test_split_loss("mlp sequential", mlp);
  st_config gs = gpt;
  test_split_loss("gpt sequential", gs);
  test_nan_clears("mlp sequential", mlp);
  st_config p1 = mlp;
  snprintf(p1.execution.mode, sizeof p1.execution.mode, "pipeline");
  snprintf(p1.execution.schedule, sizeof p1.execution.schedule, "1f1b");
  p1.execution.stages = 2;
  test_nan_clears("mlp pipeline 1f1b", p1);
  test_nan_weight_run("mlp sequential", mlp, NULL);
  test_nan_weight_run("mlp pipeline 1f1b", p1, NULL);
  st_config untied = gpt;
  untied.model.tied = 0;
  untied.model.dropout = 0;
  test_nan_weight_run("untied gpt, a byte never seen", untied,
                      "'transformer.wte.weight'");
  test_stop_spent("mlp sequential", mlp);
  st_config ln = mlp;
  snprintf(ln.model.norm, sizeof ln.model.norm, "layernorm");
  ln.optimizer.weight_decay = 0.01f;
  ln.optimizer.lr = 0.005f;
  test_fused("mlp layernorm sgd", ln, 50);
  snprintf(ln.optimizer.kind, sizeof ln.optimizer.kind, "adamw");
  ln.optimizer.lr = 1e-3f;
  test_fused("mlp layernorm adamw", ln, 50);
  test_fused("cnn adamw", cnn, 20);
  st_config b1 = mlp;
  b1.train.batch = 1;
  b1.optimizer.lr = 0.005f;
  test_no_alloc("mlp batch 1 fused", &b1);
  /* a one-token context: the GPT's linear layers see one row, so they fuse,
   * including the untied lm_head, which has no bias */
  st_config g1 = gpt;
  g1.model.context = 1;
  g1.model.tied = 0;
  test_fused("gpt context 1 untied", g1, 30);
  g1.model.tied = 1; /* a tied head never fuses: its gradient is gathered */
  test_fused("gpt context 1 tied", g1, 30);
  TH_DONE();
}
