/*
 * test_e2e.c — strata follows PyTorch's training trajectory. From the same
 * initial weights and the same samples in the same order (fixtures written by
 * tests/ref/gen_e2e.py), the MLP and the CNN are trained for 100 steps with
 * SGD (Nesterov momentum, weight decay) and with AdamW, and the loss at every
 * step must match PyTorch's within 1e-4 relative (the bound; fp32
 * rounding differences between two GEMM libraries grow slowly along a
 * trajectory and stay around 1e-6 to 1e-5 over 100 steps).
 */
#include "harness.h"
#include "strata.h"

#include <string.h>

static void base_config(st_config *c, const char *kind, const char *opt) {
  st_config_defaults(c);
  snprintf(c->model.kind, sizeof c->model.kind, "%s", kind);
  if (strcmp(kind, "mlp") == 0) {
    c->model.hidden = (st_int_list){2, {64, 64}};
  } else {
    c->model.channels = (st_int_list){2, {8, 16}};
    c->model.kernel = 3;
    snprintf(c->model.norm, sizeof c->model.norm, "groupnorm");
    c->model.groups = 4;
    c->model.dense = (st_int_list){1, {32}};
  }
  c->data.train_limit = 3200;
  c->data.test_limit = 64;
  c->data.shuffle = 0;
  c->data.normalize = 0;
  c->train.batch = 32;
  c->train.steps = 100;
  c->train.threads = 2;
  snprintf(c->optimizer.kind, sizeof c->optimizer.kind, "%s", opt);
  snprintf(c->optimizer.schedule, sizeof c->optimizer.schedule, "constant");
  if (strcmp(opt, "sgd") == 0) {
    /* gen_e2e.py: the CNN's SGD trajectory is chaotic at 0.05 */
    c->optimizer.lr = strcmp(kind, "mlp") == 0 ? 0.05f : 0.001f;
    c->optimizer.momentum = 0.9f;
    c->optimizer.nesterov = 1;
    c->optimizer.weight_decay = 5e-4f;
  } else {
    c->optimizer.lr = 1e-3f;
    c->optimizer.weight_decay = 0.01f;
  }
  snprintf(c->metrics.progress, sizeof c->metrics.progress, "off");
}

static void follow(const char *kind, const char *opt) {
  char fixture[128], what[64], name[32];
  snprintf(fixture, sizeof fixture, "tests/fixtures/e2e_%s.safetensors", kind);
  st_config cfg;
  base_config(&cfg, kind, opt);
  st_error err = {0};
  st_trainer *t = NULL;
  st_safetensors *ref = NULL;
  int rc = st_trainer_create(&t, &cfg, NULL, &err);
  CHECK(rc == 0, "%s: trainer: %s", kind, err.msg);
  if (!rc) rc = st_trainer_load(t, fixture, 1, &err);
  CHECK(rc == 0, "%s: initial weights: %s", kind, err.msg);
  if (!rc) rc = st_safetensors_read(&ref, fixture, &err);
  snprintf(name, sizeof name, "losses.%s", opt);
  const st_st_tensor *losses = ref ? st_safetensors_find(ref, name) : NULL;
  CHECK(losses && losses->dims[0] == 100, "%s: fixture lacks %s", kind, name);
  if (rc || !losses) goto done;
  const float *want = (const float *)(ref->data + losses->begin);
  float got[100];
  for (int s = 0; s < 100 && !rc; s++) {
    double loss;
    rc = st_trainer_step(t, &loss, &err);
    got[s] = (float)loss;
  }
  CHECK(rc == 0, "%s %s: step failed: %s", kind, opt, err.msg);
  snprintf(what, sizeof what, "%s %s loss, 100 steps", kind, opt);
  /* 1e-4 relative: the bound (see the file comment). */
  CHECK_CLOSE(what, got, want, 100, 1e-4, 1e-6);
  if (getenv("STRATA_TEST_VERBOSE"))
    for (int s = 0; s < 100; s++)
      fprintf(stderr, "%d:%.1e%s", s, fabs(got[s] - want[s]) / want[s],
              s % 10 == 9 ? "\n" : " ");
  fprintf(stderr, "  %s: first %.6f/%.6f last %.6f/%.6f (strata/torch)\n", what,
          got[0], want[0], got[99], want[99]);
done:
  st_safetensors_destroy(ref);
  st_trainer_destroy(t);
}

int main(void) {
  st_blas_init();
  follow("mlp", "sgd");
  follow("mlp", "adamw");
  follow("cnn", "sgd");
  follow("cnn", "adamw");
  TH_DONE();
}
