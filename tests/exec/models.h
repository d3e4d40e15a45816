/*
 * models.h — the three small models the executor tests run every mode on
 * (test_pipeline.c, test_replicas.c): an MLP with dropout, a CNN with
 * residual blocks, group norm and dropout, and a two-layer GPT with a tied
 * head, all on 2 threads and quick to train; and training one for STEPS
 * steps.
 */
#ifndef STRATA_TESTS_EXEC_MODELS_H
#define STRATA_TESTS_EXEC_MODELS_H

#include "harness.h"
#include "strata.h"

#include <stdlib.h>
#include <string.h>

enum { STEPS = 20, BATCH = 16 };

static void set_all(st_config *c, const char *const *sets, size_t n) {
  st_error err = {0};
  for (size_t i = 0; i < n; i++)
    CHECK(st_config_set(c, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
}

/* SGD with Nesterov momentum. */
static void mlp_config(st_config *c) {
  st_config_defaults(c);
  const char *sets[] = {"data.dataset=synthetic", "data.train_limit=512",
                        "data.test_limit=64", "model.hidden=[64,32,32]",
                        "model.dropout=0.1", "optimizer.nesterov=true",
                        "train.threads=2", "metrics.progress=off"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

/* AdamW. */
static void cnn_config(st_config *c) {
  st_config_defaults(c);
  const char *sets[] = {"data.dataset=synthetic", "data.train_limit=512",
                        "data.test_limit=64", "model.kind=cnn",
                        "model.channels=[4,8]", "model.residual_blocks=1",
                        "model.norm=groupnorm", "model.groups=2",
                        "model.dense=[16]", "model.dropout=0.1",
                        "optimizer.kind=adamw", "optimizer.lr=0.002",
                        "optimizer.weight_decay=0.01", "train.threads=2",
                        "metrics.progress=off"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

/* AdamW. */
static void gpt_config(st_config *c) {
  st_config_defaults(c);
  const char *sets[] = {"model.kind=gpt", "data.dataset=text",
                        "data.path=tests/fixtures/gpt_corpus.txt",
                        "model.context=16", "model.layers=2", "model.heads=2",
                        "model.width=16", "model.dropout=0.1",
                        "model.activation=gelu_tanh", "optimizer.kind=adamw",
                        "optimizer.lr=0.003", "train.threads=2",
                        "metrics.progress=off"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

static st_trainer *make(const st_config *c, st_error *err) {
  st_trainer *t = NULL;
  if (st_trainer_create(&t, c, NULL, err)) return NULL;
  return t;
}

/* Weights after STEPS steps (malloc'd), or NULL after a failure. */
static float *train(const st_config *c, size_t *n, st_trainer **keep) {
  st_error err = {0};
  st_trainer *t = make(c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return NULL;
  double loss;
  for (int i = 0; i < STEPS; i++)
    if (st_trainer_step(t, &loss, &err)) {
      CHECK(0, "step %d: %s", i, err.msg);
      st_trainer_destroy(t);
      return NULL;
    }
  *n = st_trainer_model(t)->n_params;
  float *w = malloc(*n * sizeof *w);
  memcpy(w, st_trainer_params(t), *n * sizeof *w);
  if (keep)
    *keep = t;
  else
    st_trainer_destroy(t);
  return w;
}

#endif
