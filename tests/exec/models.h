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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
                        "data.test_limit=64",     "model.hidden=[64,32,32]",
                        "model.dropout=0.1",      "optimizer.nesterov=true",
                        "train.threads=2",        "metrics.progress=off"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

/* AdamW. */
static void cnn_config(st_config *c) {
  st_config_defaults(c);
  const char *sets[] = {"data.dataset=synthetic",
                        "data.train_limit=512",
                        "data.test_limit=64",
                        "model.kind=cnn",
                        "model.channels=[4,8]",
                        "model.residual_blocks=1",
                        "model.norm=groupnorm",
                        "model.groups=2",
                        "model.dense=[16]",
                        "model.dropout=0.1",
                        "optimizer.kind=adamw",
                        "optimizer.lr=0.002",
                        "optimizer.weight_decay=0.01",
                        "train.threads=2",
                        "metrics.progress=off"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

/* AdamW. */
static void gpt_config(st_config *c) {
  st_config_defaults(c);
  const char *sets[] = {"model.kind=gpt",
                        "data.dataset=text",
                        "data.path=tests/fixtures/gpt_corpus.txt",
                        "model.context=16",
                        "model.layers=2",
                        "model.heads=2",
                        "model.width=16",
                        "model.dropout=0.1",
                        "model.activation=gelu_tanh",
                        "optimizer.kind=adamw",
                        "optimizer.lr=0.003",
                        "train.threads=2",
                        "metrics.progress=off"};
  set_all(c, sets, sizeof sets / sizeof sets[0]);
}

static st_trainer *make(const st_config *c, st_error *err) {
  st_trainer *t = NULL;
  if (st_trainer_create(&t, c, NULL, err)) return NULL;
  return t;
}

/* The trainer's weights as floats into dst: its slab, or, when a file store
 * keeps them as bf16 (no float slab), exported and read back (widened). */
static int trainer_weights(st_trainer *t, float *dst, st_error *err) {
  const st_model *m = st_trainer_model(t);
  if (st_trainer_params(t)) {
    memcpy(dst, st_trainer_params(t), m->n_params * sizeof *dst);
    return 0;
  }
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata_weights_%d.safetensors",
           (int)getpid());
  int rc = st_trainer_save(t, path, err);
  if (!rc) rc = st_checkpoint_load(path, m, dst, NULL, NULL, NULL, err);
  unlink(path);
  return rc;
}

/* The loss each step of the last train() reported: a mode held to the
 * sequential mode's weights bit for bit reports its losses too (the same
 * rows' losses, summed in the same order). */
static double train_losses[STEPS];

/* Weights after STEPS steps (malloc'd), or NULL after a failure. */
static float *train(const st_config *c, size_t *n, st_trainer **keep) {
  st_error err = {0};
  st_trainer *t = make(c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return NULL;
  double loss;
  for (int i = 0; i < STEPS; i++) {
    if (st_trainer_step(t, &loss, &err)) {
      CHECK(0, "step %d: %s", i, err.msg);
      st_trainer_destroy(t);
      return NULL;
    }
    train_losses[i] = loss;
  }
  *n = st_trainer_model(t)->n_params;
  float *w = malloc(*n * sizeof *w);
  if (trainer_weights(t, w, &err)) {
    CHECK(0, "the weights: %s", err.msg);
    free(w);
    w = NULL;
  }
  if (keep)
    *keep = t;
  else
    st_trainer_destroy(t);
  return w;
}

/* The reference for a store of bf16 weights: the sequential mode with its
 * weights rounded to bf16 after initialisation (to nearest, as the store
 * makes them) and after every step (execution.store_rounding, with the
 * step and the slab index the store rounds with; a tied copy takes its
 * source's rounded value). Weights after STEPS steps, malloc'd. */
static inline float *train_bf16_reference(const st_config *base, size_t *n) {
  st_config c = *base;
  snprintf(c.execution.mode, sizeof c.execution.mode, "sequential");
  snprintf(c.execution.store, sizeof c.execution.store, "memory");
  snprintf(c.execution.store_weights, sizeof c.execution.store_weights, "fp32");
  int stochastic = strcmp(base->execution.store_rounding, "stochastic") == 0;
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  CHECK(t != NULL, "%s", err.msg);
  if (!t) return NULL;
  const st_model *m = st_trainer_model(t);
  float *p = st_trainer_params(t);
  st_bf16_round(p, m->n_params, 0, 0, 0, 0);
  double loss;
  for (int i = 0; i < STEPS; i++) {
    if (st_trainer_step(t, &loss, &err)) {
      CHECK(0, "reference step %d: %s", i, err.msg);
      st_trainer_destroy(t);
      return NULL;
    }
    st_bf16_round(p, m->n_params, stochastic, c.train.seed,
                  (uint64_t)st_trainer_pos(t)->step - 1, 0);
    st_model_sync_ties(m, p);
  }
  *n = m->n_params;
  float *w = malloc(*n * sizeof *w);
  memcpy(w, p, *n * sizeof *w);
  st_trainer_destroy(t);
  return w;
}

#endif
