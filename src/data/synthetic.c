/*
 * synthetic.c — deterministic classification data for tests and benches,
 * shaped like the real thing (bytes, any (c, h, w), up to 256 classes) so
 * every path that takes Fashion-MNIST can run without it.
 *
 * Each class has a prototype image of uniform random bytes; sample s has
 * label s % classes (exactly balanced) and pixels prototype + noise, clipped
 * to 0..255. The noise is triangular with a standard deviation of about 52,
 * half the spread between prototypes (about 104 per pixel), so a linear model
 * separates the classes well but not instantly. Sample s draws from its own
 * stream (seed, ST_RNG_DATA, s + 1) and the prototypes from stream 0, so any
 * sample can be recomputed alone.
 */
#include "strata.h"

/* From idx.c; internal to src/data, so not in strata.h. */
int st_dataset_alloc(st_dataset **out, const char *name, int n, st_shape shape,
                     st_error *err);
void st_dataset_compute_stats(st_dataset *ds);

static void make_prototypes(uint8_t *protos, size_t bytes, uint64_t seed) {
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, 0);
  for (size_t i = 0; i < bytes; i++) protos[i] = (uint8_t)st_rng_u32(&rng);
}

/* The difference of two uniform bytes is triangular on [-255, 255] (std
 * 255 / sqrt(6), about 104); halving it gives the noise described above. One
 * 32-bit draw feeds two pixels. */
static void make_sample(uint8_t *out, const uint8_t *proto, size_t numel,
                        uint64_t seed, int s) {
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, (uint64_t)s + 1);
  uint32_t bits = 0;
  for (size_t i = 0; i < numel; i++) {
    if (i % 2 == 0)
      bits = st_rng_u32(&rng);
    else
      bits >>= 16;
    int noise = ((int)(bits & 0xff) - (int)((bits >> 8) & 0xff)) / 2;
    int v = proto[i] + noise;
    out[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
  }
}

static int check_args(int n, st_shape shape, int classes, st_error *err) {
  if (n < 1)
    return st_error_set(err, ST_EARG, "synthetic data: n = %d must be >= 1", n);
  if (classes < 1 || classes > 256)
    return st_error_set(err, ST_EARG,
                        "synthetic data: classes = %d must be 1..256", classes);
  if (shape.c < 1 || shape.h < 1 || shape.w < 1)
    return st_error_set(err, ST_EARG,
                        "synthetic data: shape (%d, %d, %d) must be positive",
                        shape.c, shape.h, shape.w);
  return 0;
}

int st_dataset_synthetic(st_dataset **out, int n, st_shape shape, int classes,
                         uint64_t seed, st_error *err) {
  return st_dataset_synthetic_range(out, 0, n, shape, classes, seed, err);
}

int st_dataset_synthetic_range(st_dataset **out, int first, int n,
                               st_shape shape, int classes, uint64_t seed,
                               st_error *err) {
  *out = NULL;
  int rc = check_args(n, shape, classes, err);
  if (rc) return rc;
  size_t numel = st_shape_numel(shape);
  st_dataset *ds = NULL;
  rc = st_dataset_alloc(&ds, "synthetic", n, shape, err);
  if (rc) return rc;
  if (numel > SIZE_MAX / (size_t)classes) goto nomem;
  uint8_t *protos = st_alloc((size_t)classes * numel); /* (classes, numel) */
  if (!protos) goto nomem;
  make_prototypes(protos, (size_t)classes * numel, seed);
  for (int s = 0; s < n; s++) {
    int index = first + s; /* a sample depends only on its index */
    int label = index % classes;
    ds->labels[s] = (uint8_t)label;
    make_sample(ds->pixels + (size_t)s * numel, protos + (size_t)label * numel,
                numel, seed, index);
  }
  st_free(protos);
  ds->classes = classes;
  st_dataset_compute_stats(ds);
  *out = ds;
  return 0;
nomem:
  st_dataset_destroy(ds);
  return st_error_set(
      err, ST_ENOMEM,
      "synthetic data: %d prototypes of %zu bytes: out of memory", classes,
      numel);
}
