/*
 * bench_mlp.c — MLP training throughput of strata's own engine, in samples
 * per second: 784-256-256-10 with ReLU, softmax cross-entropy, SGD (lr 0.01,
 * momentum 0.9) on synthetic data, driven through the public trainer API
 * (st_trainer_step: next batch, forward, backward, optimizer update).
 *
 * The peer is bench/bench_mlp.py (the same model in PyTorch); the ratio is
 * printed by tools/run-bench.sh, which runs both in the same session
 * (STYLE.md 13). This program only measures and prints one line:
 *
 *   strata mlp batch=B threads=T samples_per_s=X
 *
 * Usage: bench_mlp BATCH THREADS [SECONDS]   (SECONDS: timed span, default 1.5)
 */
#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < 1 || v > 1 << 20) return -1;
  *out = (int)v;
  return 0;
}

static int run_steps(st_trainer *t, int64_t n, st_error *err) {
  double loss;
  for (int64_t i = 0; i < n; i++) {
    int rc = st_trainer_step(t, &loss, err);
    if (rc) return rc;
  }
  return 0;
}

int main(int argc, char **argv) {
  int batch, threads;
  double seconds = 1.5;
  const char *precision = argc == 5 ? argv[4] : "fp32";
  if (argc < 3 || argc > 5 || parse_int(argv[1], &batch) ||
      parse_int(argv[2], &threads) ||
      (argc >= 4 && (seconds = atof(argv[3])) <= 0) ||
      (strcmp(precision, "fp32") && strcmp(precision, "bf16"))) {
    fprintf(stderr, "usage: bench_mlp BATCH THREADS [SECONDS [fp32|bf16]]\n");
    return 2;
  }
  st_blas_init();

  st_config cfg;
  st_config_defaults(&cfg);
  snprintf(cfg.model.kind, sizeof cfg.model.kind, "mlp");
  cfg.model.hidden.n = 2;
  cfg.model.hidden.v[0] = 256;
  cfg.model.hidden.v[1] = 256;
  snprintf(cfg.model.activation, sizeof cfg.model.activation, "relu");
  snprintf(cfg.data.dataset, sizeof cfg.data.dataset, "synthetic");
  /* Enough samples that even batch 256 runs 32 steps per epoch; the test set
   * is never evaluated here, so keep it tiny. */
  cfg.data.train_limit = 8192;
  cfg.data.test_limit = 16;
  snprintf(cfg.optimizer.kind, sizeof cfg.optimizer.kind, "sgd");
  cfg.optimizer.lr = 0.01f;
  cfg.optimizer.momentum = 0.9f;
  cfg.train.batch = batch;
  cfg.train.threads = threads;
  snprintf(cfg.train.precision, sizeof cfg.train.precision, "%s", precision);
  snprintf(cfg.metrics.progress, sizeof cfg.metrics.progress, "off");

  st_trainer *t = NULL;
  st_error err = {0};
  if (st_trainer_create(&t, &cfg, NULL, &err)) {
    fprintf(stderr, "bench_mlp: error: %s\n", err.msg);
    return 1;
  }

  /* Warm-up: first-step paths (momentum buffer init), caches and pool
   * threads; it also measures the step time so that the timed run lasts
   * about `seconds` however fast a step is. */
  int rc = run_steps(t, 5, &err);
  int64_t warm = 0;
  double t0 = st_now(), elapsed = 0;
  while (!rc && elapsed < 0.25) {
    rc = run_steps(t, 5, &err);
    warm += 5;
    elapsed = st_now() - t0;
  }
  int64_t steps = 0;
  if (!rc) {
    steps = (int64_t)(seconds * (double)warm / elapsed) + 1;
    if (steps < 10) steps = 10;
    t0 = st_now();
    rc = run_steps(t, steps, &err);
    elapsed = st_now() - t0;
  }
  if (rc) {
    fprintf(stderr, "bench_mlp: error: %s\n", err.msg);
    st_trainer_destroy(t);
    return 1;
  }
  printf("strata mlp batch=%d threads=%d precision=%s samples_per_s=%.1f\n",
         batch, threads, precision, (double)steps * batch / elapsed);
  st_trainer_destroy(t);
  return 0;
}
