/*
 * test_precision.c — train.precision: bf16 in every execution mode, for the
 * MLP (SGD), the CNN and the GPT (AdamW, tied head) of models.h.
 *
 * The bf16 product of an element depends on its inputs and K alone
 * (src/base/gemm_bf16.c), so each mode's bit-identity contract holds in
 * bf16 as in fp32, and is checked here against the sequential mode in
 * bf16 after 20 steps at the same micro-batch split:
 *  - pipeline, gpipe / 1f1b / interleaved / zb1p, S = 2 and 3, M = 4;
 *  - block_sequential; weight_streaming (memory store, prefetch 1);
 *  - pipelined_backprop: the threaded runtime equals its single-threaded
 *    emulation (execution.emulate), its contract in fp32 too;
 *  - replicas: two runs give the same bits;
 *  - the update fused into a one-sample backward (execution.fused_update)
 *    gives the unfused bits, sequential at batch 1 (SGD, AdamW) and
 *    pipelined backprop (lwp).
 * In every mode the bf16 weights differ from the same mode's fp32 ones (the
 * products did go through bf16) and stay near them: |w_bf16 - w_fp32| is
 * under half of |w_fp32 - w_0|, the fp32 run's own displacement. Measured
 * (Zen 4): MLP 0.081, CNN 0.15, GPT 0.0083, pipelined backprop 0.21; the
 * MLP's is 0.038 after its first step already, the relative error of a
 * gradient whose per-sample terms largely cancel (a sum of B terms of
 * random sign is sqrt(B) times smaller than the sum of their sizes, and
 * each term carries bf16's 2^-9). A product gone wrong rather than rounded
 * gives about 1 (dropping the odd products: 0.92 to 1.25). The CNN trains
 * with SGD here: AdamW's update is the sign of gradients that rounding
 * flips where they are near zero (0.27 with it). The checks that pin the
 * arithmetic itself are test_gemm_bf16's.
 * Also: a fp32 trainer made after a bf16 one computes in fp32 again; a
 * checkpoint keeps the fp32 master weights (values bf16 cannot hold).
 */
#include "harness.h"
#include "models.h"
#include "strata.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void with(st_config *c, const char *set) { set_all(c, &set, 1); }

/* The initial weights of config c (fp32: the same in either precision). */
static float *initial(const st_config *c) {
  st_error err = {0};
  st_trainer *t = make(c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return NULL;
  size_t n = st_trainer_model(t)->n_params;
  float *w = malloc(n * sizeof *w);
  if (trainer_weights(t, w, &err)) CHECK(0, "%s", err.msg);
  st_trainer_destroy(t);
  return w;
}

static double distance(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * (a[i] - b[i]);
  return sqrt(s);
}

/* The mode's weights in fp32 and bf16: bf16 must differ, and stay near. */
static float *both(const char *what, const st_config *c, size_t *n) {
  st_config f = *c, b = *c;
  with(&f, "train.precision=fp32");
  with(&b, "train.precision=bf16");
  size_t nf = 0, nb = 0;
  float *wf = train(&f, &nf, NULL), *wb = train(&b, &nb, NULL);
  float *w0 = initial(&f);
  if (!wf || !wb || !w0 || nf != nb) {
    CHECK(0, "%s: a run failed", what);
    free(wf), free(wb), free(w0);
    return NULL;
  }
  double r = distance(wb, wf, nb) / distance(wf, w0, nb);
  CHECK(memcmp(wf, wb, nb * sizeof *wb) != 0,
        "%s: bf16 gave fp32's bits (no bf16 product ran)", what);
  CHECK(r < 0.5,
        "%s: bf16 weights %.3g of the fp32 run's path away from "
        "them (bound 0.5)",
        what, r);
  if (getenv("STRATA_TEST_VERBOSE"))
    printf("  %s: |w_bf16 - w_fp32| / |w_fp32 - w_0| = %.3g\n", what, r);
  free(wf), free(w0);
  *n = nb;
  return wb;
}

static void same(const char *what, const float *got, const float *want,
                 size_t n) {
  CHECK(got && want && memcmp(got, want, n * sizeof *got) == 0,
        "%s: bf16 weights differ from sequential bf16", what);
}

static void test_modes(const char *name, const st_config *base) {
  char what[160];
  st_config seq = *base;
  seq.train.batch = BATCH;
  seq.execution.micro_batch = BATCH / 4;
  size_t n = 0, m = 0;
  snprintf(what, sizeof what, "%s sequential", name);
  float *want = both(what, &seq, &n);
  if (!want) return;
  const char *schedules[] = {"gpipe", "1f1b", "interleaved", "zb1p"};
  for (int s = 0; s < 4; s++)
    for (int S = 2; S <= 3; S++) {
      st_config c = seq;
      with(&c, "execution.mode=pipeline");
      snprintf(c.execution.schedule, sizeof c.execution.schedule, "%s",
               schedules[s]);
      c.execution.stages = S;
      if (s == 2) c.execution.virtual_stages = 2;
      st_error err = {0};
      st_trainer *probe = make(&c, &err); /* too few blocks: skip */
      if (!probe) continue;
      st_trainer_destroy(probe);
      snprintf(what, sizeof what, "%s pipeline %s S=%d", name, schedules[s], S);
      float *got = both(what, &c, &m);
      same(what, got, want, n);
      free(got);
    }
  st_config bs = seq;
  with(&bs, "execution.mode=block_sequential");
  bs.execution.stages = 2;
  bs.execution.blocks_per_segment = 2;
  snprintf(what, sizeof what, "%s block_sequential", name);
  float *got = both(what, &bs, &m);
  same(what, got, want, n);
  free(got);
  st_config ws = seq;
  with(&ws, "execution.mode=weight_streaming");
  with(&ws, "execution.prefetch=1");
  snprintf(what, sizeof what, "%s weight_streaming", name);
  got = both(what, &ws, &m);
  same(what, got, want, n);
  free(got);
  st_config rep = seq;
  rep.execution.replicas = 2;
  snprintf(what, sizeof what, "%s replicas 2", name);
  got = both(what, &rep, &m);
  with(&rep, "train.precision=bf16");
  float *again = train(&rep, &m, NULL);
  CHECK(got && again && memcmp(got, again, n * sizeof *got) == 0,
        "%s: two runs differ", what);
  free(got), free(again), free(want);
}

static void test_pb(void) {
  st_config c;
  mlp_config(&c);
  set_all(&c,
          (const char *[]){
              "model.hidden=[16,16,16]", "execution.mode=pipelined_backprop",
              "execution.mitigation=sc+lwp", "optimizer.nesterov=false",
              "optimizer.lr=0.01", "train.batch=2"},
          6);
  size_t n = 0, m = 0;
  float *threaded = both("pipelined_backprop", &c, &n);
  with(&c, "execution.emulate=true");
  with(&c, "train.precision=bf16");
  float *emulated = train(&c, &m, NULL);
  CHECK(threaded && emulated && m == n &&
            memcmp(threaded, emulated, n * sizeof *threaded) == 0,
        "pipelined_backprop bf16: threaded and emulated runtimes differ");
  free(threaded), free(emulated);
}

/* At one sample a linear layer's update rides in its backward
 * (execution.fused_update): its weight gradient dy x^T is a product too,
 * on bf16 operands, so fused or not the bits are the same, in the
 * sequential mode at batch 1 and in pipelined backprop's one-sample
 * micro-batches (it took dy and x unrounded: 53,493 of the MLP's 53,706
 * weights differed). */
static void test_fused(void) {
  /* heavy-ball momentum, as pipelined backprop takes it; lwp: the fused
   * update writes the prediction too */
  static const char *const runs[][3] = {
      {"sequential at batch 1", "train.batch=1", "execution.mode=sequential"},
      {"sequential at batch 1, AdamW", "train.batch=1", "optimizer.kind=adamw"},
      {"pipelined_backprop", "train.batch=2",
       "execution.mode=pipelined_backprop"}};
  for (int k = 0; k < 3; k++) {
    st_config c;
    mlp_config(&c);
    set_all(&c,
            (const char *[]){"train.precision=bf16", "model.dropout=0",
                             "optimizer.nesterov=false", runs[k][1],
                             runs[k][2]},
            5);
    if (k == 2) with(&c, "execution.mitigation=lwp");
    size_t n = 0, m = 0;
    float *fused = train(&c, &n, NULL);
    with(&c, "execution.fused_update=false");
    float *apart = train(&c, &m, NULL);
    size_t differ = 0;
    for (size_t i = 0; fused && apart && i < n; i++)
      differ += memcmp(&fused[i], &apart[i], sizeof *fused) != 0;
    CHECK(fused && apart && m == n && differ == 0,
          "%s, bf16: %zu of %zu weights differ with the update fused",
          runs[k][0], differ, n);
    free(fused), free(apart);
  }
}

/* The mode is process-wide: a trainer sets it when made and when it
 * steps, so one in fp32 after one in bf16 computes in fp32. */
static void test_switch(void) {
  st_config f, b;
  mlp_config(&f);
  b = f;
  with(&b, "train.precision=bf16");
  size_t n = 0;
  float *w1 = train(&f, &n, NULL), *wb = train(&b, &n, NULL),
        *w2 = train(&f, &n, NULL);
  CHECK(w1 && wb && w2 && memcmp(w1, w2, n * sizeof *w1) == 0,
        "fp32 after bf16: not fp32's bits");
  CHECK(!st_gemm_bf16_on(), "the mode stays as the last trainer set it");
  free(w1), free(wb), free(w2);
}

/* A checkpoint of a bf16 run holds the fp32 master weights. */
static void test_checkpoint(void) {
  st_config c;
  mlp_config(&c);
  with(&c, "train.precision=bf16");
  st_trainer *t = NULL;
  size_t n = 0;
  float *w = train(&c, &n, &t);
  if (!w || !t) return;
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata_prec_%d.safetensors", (int)getpid());
  st_error err = {0};
  float *back = malloc(n * sizeof *back);
  int rc = st_trainer_save(t, path, &err);
  if (!rc)
    rc = st_checkpoint_load(path, st_trainer_model(t), back, NULL, NULL, NULL,
                            &err);
  CHECK(rc == 0, "checkpoint: %s", err.msg);
  CHECK(rc == 0 && memcmp(back, w, n * sizeof *w) == 0,
        "the checkpoint's weights are not the trainer's");
  size_t not_bf16 = 0;
  for (size_t i = 0; i < n; i++)
    not_bf16 += st_bf16_to(st_bf16_from(w[i])) != w[i];
  CHECK(not_bf16 > n / 2, "only %zu of %zu weights need fp32", not_bf16, n);
  unlink(path);
  free(w), free(back);
  st_trainer_destroy(t);
}

/* train.bf16_activations: the GPT's inputs of products kept as bf16 give
 * the bits of keeping them in fp32 (the products round them to the same
 * bf16), in the sequential mode, the zb1p pipeline (its W half widens
 * them again) and weight streaming that runs the forward again; and the
 * activations a sample shrink, some output being kept as bf16. */
static void test_half_activations(const st_config *gpt) {
  const char *modes[][3] = {
      {"sequential", "execution.mode=sequential", "execution.mode=sequential"},
      {"pipeline zb1p S=2", "execution.mode=pipeline",
       "execution.schedule=zb1p"},
      {"weight_streaming, recomputed", "execution.mode=weight_streaming",
       "execution.keep_activations=false"}};
  for (int i = 0; i < 3; i++) {
    st_config half = *gpt, full;
    half.train.batch = BATCH;
    half.execution.micro_batch = BATCH / 4;
    with(&half, "train.precision=bf16");
    with(&half, modes[i][1]);
    with(&half, modes[i][2]);
    if (i == 1) half.execution.stages = 2;
    full = half;
    with(&full, "train.bf16_activations=false");
    size_t nh = 0, nf = 0;
    float *wh = train(&half, &nh, NULL), *wf = train(&full, &nf, NULL);
    CHECK(wh && wf && nh == nf && memcmp(wh, wf, nh * sizeof *wh) == 0,
          "gpt %s: bf16-kept activations changed the weights", modes[i][0]);
    free(wh), free(wf);
  }
  st_config half = *gpt, full;
  with(&half, "train.precision=bf16");
  with(&half, "model.vocab=256"); /* the byte tokenizer's, as trained */
  full = half;
  with(&full, "train.bf16_activations=false");
  st_model *mh = NULL, *mf = NULL;
  st_error err = {0};
  st_shape in = {1, half.model.context, 1};
  int rc = st_model_create(&mh, &half, in, &err) ||
           st_model_create(&mf, &full, in, &err);
  CHECK(rc == 0, "%s", err.msg);
  size_t ah = 0, af = 0;
  int halves = 0;
  for (int b = 0; !rc && b < mh->n_blocks; b++) {
    ah += mh->blocks[b].act_per_sample;
    af += mf->blocks[b].act_per_sample;
    for (int l = 0; l < mh->blocks[b].n_layers; l++) {
      const st_layer *L = &mh->blocks[b].layers[l];
      halves += L->transient == ST_HALF;
      /* only what a product alone reads in the backward */
      st_op_kind next = l + 1 < mh->blocks[b].n_layers
                            ? mh->blocks[b].layers[l + 1].kind
                            : ST_OP_RELU;
      CHECK(L->transient != ST_HALF || next == ST_OP_LINEAR ||
                next == ST_OP_ATTENTION || next == ST_OP_LINEAR_XENT,
            "%s %s kept as bf16 before a %s", mh->blocks[b].name, L->name,
            st_op_name(next));
    }
  }
  CHECK(!rc && halves > 0 && ah < af,
        "gpt bf16: %d outputs kept as bf16, %zu against %zu floats a sample",
        halves, ah, af);
  if (getenv("STRATA_TEST_VERBOSE"))
    printf("  gpt bf16-kept activations: %d outputs, %zu -> %zu floats a "
           "sample\n",
           halves, af, ah);
  st_model_destroy(mh);
  st_model_destroy(mf);
}

int main(void) {
  st_blas_init();
  printf("bf16 products: %s\n", st_bf16_support());
  st_config mlp, cnn, gpt;
  mlp_config(&mlp);
  cnn_config(&cnn);
  set_all(&cnn, (const char *[]){"optimizer.kind=sgd", "optimizer.lr=0.02"},
          2); /* see the header */
  gpt_config(&gpt);
  test_modes("mlp", &mlp);
  test_modes("cnn", &cnn);
  test_modes("gpt", &gpt);
  test_half_activations(&gpt);
  test_pb();
  test_fused();
  test_switch();
  test_checkpoint();
  TH_DONE();
}
