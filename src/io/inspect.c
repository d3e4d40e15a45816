/*
 * inspect.c — `strata inspect FILE`: lists the tensors of a safetensors file
 * (name, dtype, shape, min, max, mean, std) and its metadata, so a user can
 * look into a checkpoint without Python.
 */
#include "strata.h"

#include <math.h>
#include <string.h>

static double element(const uint8_t *p, const char *dtype, size_t i) {
  if (strcmp(dtype, "F32") == 0) {
    float v;
    memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (strcmp(dtype, "BF16") == 0) {
    uint16_t v;
    memcpy(&v, p + 2 * i, 2);
    return st_bf16_to(v);
  }
  if (strcmp(dtype, "I32") == 0) {
    int32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (strcmp(dtype, "I64") == 0) {
    int64_t v;
    memcpy(&v, p + 8 * i, 8);
    return (double)v;
  }
  if (strcmp(dtype, "U8") == 0) return p[i];
  return NAN;
}

int st_inspect(const char *path, FILE *f, st_error *err) {
  st_safetensors *st;
  int rc = st_safetensors_read(&st, path, err);
  if (rc) return rc;
  fprintf(f, "%s: %d tensors, %zu data bytes\n", path, st->n_tensors,
          st->data_bytes);
  for (int i = 0; i < st->n_meta; i++)
    fprintf(f, "  meta %-12s %s\n", st->meta_keys[i], st->meta_values[i]);
  fprintf(f, "  %-44s %-5s %-16s %12s %12s %12s %12s\n", "name", "dtype",
          "shape", "min", "max", "mean", "std");
  for (int i = 0; i < st->n_tensors; i++) {
    const st_st_tensor *t = &st->tensors[i];
    char shape[64] = "";
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld",
               d ? "x" : "", (long long)t->dims[d]);
      n *= (size_t)t->dims[d];
    }
    if (t->ndim == 0) snprintf(shape, sizeof shape, "scalar");
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
    const uint8_t *p = st->data + t->begin;
    for (size_t k = 0; k < n; k++) {
      double v = element(p, t->dtype, k);
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      sum += v;
      sq += v * v;
    }
    double mean = n ? sum / n : 0, var = n ? sq / n - mean * mean : 0;
    fprintf(f, "  %-44s %-5s %-16s %12.5g %12.5g %12.5g %12.5g\n", t->name,
            t->dtype, shape, n ? lo : 0, n ? hi : 0, mean,
            sqrt(var > 0 ? var : 0));
  }
  st_safetensors_destroy(st);
  return 0;
}
