/*
 * op_fixtures.h — what the op tests share: test-side buffers freed per case,
 * loading PyTorch fixtures (tests/fixtures/ops_*.safetensors) with dtype and
 * size checks, and central finite differences of L = sum(out * dout).
 * Include after harness.h and strata.h, with REGENERATE defined as the
 * command that rewrites the including test's fixtures.
 */
#ifndef STRATA_OP_FIXTURES_H
#define STRATA_OP_FIXTURES_H

#include <stdint.h>
#include <string.h>

#define FIXTURE_DIR "tests/fixtures/"

/* ------------------------------------------------------------ fixtures */

/* Test-side buffers, freed together at the end of each case. */
static void *owned[512];
static int n_owned;

static inline void *keep(void *p) {
  if (!p || n_owned == (int)(sizeof owned / sizeof owned[0])) {
    fprintf(stderr, "op test: out of memory or owned[] full\n");
    exit(2);
  }
  owned[n_owned++] = p;
  return p;
}

static inline void release_all(void) {
  while (n_owned) free(owned[--n_owned]);
}

static inline float *new_floats(size_t n) {
  return keep(calloc(n ? n : 1, sizeof(float)));
}

static inline double *new_doubles(size_t n) {
  return keep(calloc(n ? n : 1, sizeof(double)));
}

static inline float *copy_floats(const float *x, size_t n) {
  return memcpy(new_floats(n), x, n * sizeof(float));
}

static inline float *to_floats(const double *x, size_t n) {
  float *y = new_floats(n);
  for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
  return y;
}

static inline float *random_floats(size_t n, uint64_t seed, float scale) {
  float *x = new_floats(n);
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, 0);
  for (size_t i = 0; i < n; i++) x[i] = scale * st_rng_normal(&rng);
  return x;
}

static inline st_safetensors *open_fixture(const char *op) {
  char path[256];
  snprintf(path, sizeof path, FIXTURE_DIR "ops_%s.safetensors", op);
  st_safetensors *st = NULL;
  st_error err = {0};
  int rc = st_safetensors_read(&st, path, &err);
  CHECK(rc == 0, "%s (regenerate with %s)", err.msg, REGENERATE);
  if (rc) return NULL;
  const char *version = st_safetensors_meta(st, "strata_fixture");
  CHECK(version && strcmp(version, "1") == 0,
        "%s: fixture version %s, expected 1 (regenerate with %s)", path,
        version ? version : "missing", REGENERATE);
  return st;
}

/* A copy of tensor "<case>.<key>" (so alignment is ours), checked for dtype
 * and element count; a missing tensor fails and reads as zeros. */
static inline void *fixture_tensor(const st_safetensors *st,
                                   const char *case_name, const char *key,
                                   const char *dtype, size_t numel) {
  char name[160];
  snprintf(name, sizeof name, "%s.%s", case_name, key);
  void *copy = keep(calloc(numel ? numel : 1, 4));
  const st_st_tensor *t = st_safetensors_find(st, name);
  CHECK(t != NULL, "%s: tensor %s missing", st->path, name);
  if (!t) return copy;
  CHECK(strcmp(t->dtype, dtype) == 0, "%s: %s is %s, expected %s", st->path,
        name, t->dtype, dtype);
  size_t have = (t->end - t->begin) / 4;
  CHECK(have == numel, "%s: %s has %zu elements, expected %zu", st->path, name,
        have, numel);
  memcpy(copy, st->data + t->begin, 4 * (have < numel ? have : numel));
  return copy;
}

static inline float *fx(const st_safetensors *st, const char *c,
                        const char *key, size_t numel) {
  return fixture_tensor(st, c, key, "F32", numel);
}

static inline int32_t *fx_i32(const st_safetensors *st, const char *c,
                              const char *key, size_t numel) {
  return fixture_tensor(st, c, key, "I32", numel);
}

static inline void label(char *buf, size_t cap, const char *op, const char *c,
                         const char *what) {
  snprintf(buf, cap, "%s %s %s", op, c, what);
}

/* --------------------------------------------------- finite differences */

typedef double (*loss_fn)(void *ctx);

static inline double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* Central difference of L in element x; the step is the difference of the
 * two rounded floats, not 2 * eps. */
static inline double central_difference(float *x, loss_fn loss, void *ctx,
                                        float eps) {
  float x0 = *x, plus = x0 + eps, minus = x0 - eps;
  *x = plus;
  double l_plus = loss(ctx);
  *x = minus;
  double l_minus = loss(ctx);
  *x = x0;
  return (l_plus - l_minus) / ((double)plus - (double)minus);
}

/* Finite-difference tolerance, as in test_ops.c. With eps = 1e-2 the
 * truncation error eps^2 |L'''| / 6 is ~2e-5 for attention's softmax on unit
 * inputs (0 for embedding and rotary, which are linear); fp32 rounding of the
 * perturbed outputs, summed in double over the m affected outputs, adds
 * ~sqrt(m) * 6e-8 * |out| / 2e-2, ~1e-5 here. 1e-3 relative to max(1, |g|)
 * leaves a margin of 50x. */
#define FD_EPS 1e-2f
#define FD_TOL 1e-3

/* Compares analytic g[i] with the central difference at a few elements i of
 * x: first, last, some in between and the extra index `also`. */
static inline void check_fd(const char *what, float *x, size_t n,
                            const float *g, loss_fn loss, void *ctx,
                            size_t also) {
  size_t picks[6] = {0, n / 3, n / 2, (7 * n) / 9, n - 1, also % n};
  double worst = 0;
  for (int k = 0; k < 6; k++) {
    size_t i = picks[k];
    int seen = 0; /* small n repeats picks: check each element once */
    for (int q = 0; q < k; q++) seen |= picks[q] == i;
    if (seen) continue;
    double fd = central_difference(&x[i], loss, ctx, FD_EPS);
    double den = fabs((double)g[i]) > 1.0 ? fabs((double)g[i]) : 1.0;
    double r = fabs(fd - (double)g[i]) / den;
    CHECK(r <= FD_TOL, "%s[%zu]: finite difference %.7g vs analytic %.7g", what,
          i, fd, (double)g[i]);
    if (r > worst) worst = r;
  }
  if (getenv("STRATA_TEST_VERBOSE"))
    fprintf(stderr, "  %-40s max fd diff %.3g (tol %.3g)\n", what, worst,
            FD_TOL);
}

#endif
