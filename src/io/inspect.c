/*
 * inspect.c — `strata inspect FILE`: lists the tensors of a safetensors file
 * (name, dtype, shape, min, max, mean, std) and its metadata, so a user can
 * look into a checkpoint without Python (a sharded one shard by shard); with
 * --against, how far two files of the same tensors are apart (two modes, two
 * ranks counts).
 */
#include "strata.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* IEEE half precision (F16) to double: 1 sign, 5 exponent, 10 fraction
 * bits. */
static double half_to(uint16_t h) {
  int e = h >> 10 & 0x1f, m = h & 0x3ff;
  double v = e == 0    ? ldexp(m, -24) /* subnormal */
             : e == 31 ? (m ? NAN : INFINITY)
                       : ldexp(1024 + m, e - 25);
  return h >> 15 ? -v : v;
}

/* The float8 formats of the safetensors specification (OCP FP8, as
 * torch.float8_e4m3fn and float8_e5m2): E4M3 has no infinity and its
 * NaN is S.1111.111; E5M2 is IEEE-like. */
static double f8_to(uint8_t b, int e4m3) {
  int e = e4m3 ? b >> 3 & 0xf : b >> 2 & 0x1f, m = e4m3 ? b & 7 : b & 3;
  double v = e4m3 ? (e == 15 && m == 7 ? NAN
                     : e == 0          ? ldexp(m, -9)
                                       : ldexp(8 + m, e - 10))
                  : (e == 31  ? (m ? NAN : INFINITY)
                     : e == 0 ? ldexp(m, -16)
                              : ldexp(4 + m, e - 17));
  return b >> 7 ? -v : v;
}

/* Element i of a tensor of `dtype` at p, as a double (NAN for a dtype it
 * does not read: numeric() says which it does). */
static double element(const uint8_t *p, const char *dtype, size_t i) {
#define AS(name, type)                                                         \
  if (strcmp(dtype, name) == 0) {                                              \
    type v;                                                                    \
    memcpy(&v, p + sizeof v * i, sizeof v);                                    \
    return (double)v;                                                          \
  }
  AS("F32", float)
  AS("F64", double)
  AS("I8", int8_t)
  AS("I16", int16_t)
  AS("I32", int32_t)
  AS("I64", int64_t)
  AS("U8", uint8_t)
  AS("U16", uint16_t)
  AS("U32", uint32_t)
  AS("U64", uint64_t)
  AS("BOOL", uint8_t)
#undef AS
  if (strcmp(dtype, "F8_E4M3") == 0) return f8_to(p[i], 1);
  if (strcmp(dtype, "F8_E5M2") == 0) return f8_to(p[i], 0);
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  if (strcmp(dtype, "BF16") == 0) return st_bf16_to(h);
  if (strcmp(dtype, "F16") == 0) return half_to(h);
  return NAN;
}

/* The dtypes element() reads. */
static int numeric(const char *dtype) {
  static const char *const known[] = {
      "F32", "F64", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I8",   "I16",
      "I32", "I64", "U8",  "U16",  "U32",     "U64",     "BOOL",
  };
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
    if (!strcmp(dtype, known[k])) return 1;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A sharded checkpoint (checkpoint.c): model-NNNNN-of-NNNNN.safetensors
 * beside model.safetensors.index.json, each shard in name order. */
static int inspect_shards(const char *dir, FILE *f, st_error *err) {
  char path[ST_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  if (access(path, F_OK) != 0)
    return st_error_set(err, ST_EFORMAT,
                        "%s: a folder without model.safetensors.index.json: "
                        "not a whole sharded checkpoint",
                        dir);
  DIR *d = opendir(dir);
  if (!d)
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", dir,
                        strerror(errno));
  char **names = NULL;
  int n = 0, cap = 0, rc = 0;
  for (struct dirent *e; !rc && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "model-", 6) || len < 12 ||
        strcmp(e->d_name + len - 12, ".safetensors"))
      continue;
    if (n == cap) {
      char **more =
          realloc(names, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *names);
      if (!more) {
        rc = st_error_set(err, ST_ENOMEM, "out of memory");
        break;
      }
      names = more;
    }
    if (!(names[n] = strdup(e->d_name)))
      rc = st_error_set(err, ST_ENOMEM, "out of memory");
    else
      n++;
  }
  closedir(d);
  if (!rc && n == 0)
    rc =
        st_error_set(err, ST_EFORMAT, "%s: no model-*.safetensors shards", dir);
  if (!rc) qsort(names, (size_t)n, sizeof *names, by_name);
  for (int i = 0; !rc && i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    rc = st_inspect(path, f, err);
  }
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc;
}

int st_inspect(const char *path, FILE *f, st_error *err) {
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
    return inspect_shards(path, f, err);
  st_safetensors *st;
  int rc = st_safetensors_read(&st, path, err);
  if (rc) return rc;
  fprintf(f, "%s: %d tensors, %zu data bytes\n", path, st->n_tensors,
          st->data_bytes);
  for (int i = 0; i < st->n_meta; i++)
    fprintf(f, "  meta %-14s %s\n", st->meta_keys[i], st->meta_values[i]);
  fprintf(f, "  %-44s %-7s %-16s %12s %12s %12s %12s\n", "name", "dtype",
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
    if (!numeric(t->dtype)) { /* a dtype element() does not read: listed */
      fprintf(f, "  %-44s %-7s %-16s %12s %12s %12s %12s\n", t->name, t->dtype,
              shape, "-", "-", "-", "-");
      continue;
    }
    /* over the finite elements, two passes (a sum of squares less the
     * squared mean cancels where the mean is large); NaN and infinities
     * counted apart and named, not folded into the figures */
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
    size_t nan = 0, inf = 0, first_bad = 0;
    const uint8_t *p = st->data + t->begin;
    for (size_t k = 0; k < n; k++) {
      double v = element(p, t->dtype, k);
      if (!isfinite(v)) {
        if (!nan && !inf) first_bad = k;
        nan += isnan(v) != 0, inf += isinf(v) != 0;
        continue;
      }
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      sum += v;
    }
    size_t fin = n - nan - inf;
    double mean = fin ? sum / (double)fin : 0;
    for (size_t k = 0; k < n; k++) {
      double v = element(p, t->dtype, k);
      if (isfinite(v)) sq += (v - mean) * (v - mean);
    }
    fprintf(f, "  %-44s %-7s %-16s %12.5g %12.5g %12.5g %12.5g", t->name,
            t->dtype, shape, fin ? lo : 0, fin ? hi : 0, mean,
            fin ? sqrt(sq / (double)fin) : 0);
    if (nan || inf)
      fprintf(f,
              "  holds %zu NaN and %zu infinities, the first at element "
              "%zu (the figures are the finite elements')",
              nan, inf, first_bad);
    fputc('\n', f);
  }
  st_safetensors_destroy(st);
  return 0;
}

int st_inspect_against(const char *path, const char *other, FILE *f,
                       st_error *err) {
  st_safetensors *a = NULL, *b = NULL;
  /* a sharded checkpoint (a run's folder names its newest, which may be
   * one) is not one file: said as such, not as "not a regular file" */
  struct stat sb;
  for (int i = 0; i < 2; i++)
    if (stat(i ? other : path, &sb) == 0 && S_ISDIR(sb.st_mode))
      return st_error_set(err, ST_EARG,
                          "%s: a sharded checkpoint's folder: --against "
                          "compares two files (`strata export` of its run "
                          "merges its shards into one)",
                          i ? other : path);
  int rc = st_safetensors_read(&a, path, err);
  if (!rc) rc = st_safetensors_read(&b, other, err);
  if (!rc && a->n_tensors != b->n_tensors)
    rc = st_error_set(err, ST_EFORMAT, "%s: %d tensors, but %s has %d", other,
                      b->n_tensors, path, a->n_tensors);
  double worst_abs = 0, worst_rel = 0;
  const char *worst_name = NULL;
  for (int i = 0; !rc && i < a->n_tensors; i++) {
    const st_st_tensor *t = &a->tensors[i];
    const st_st_tensor *u = st_safetensors_find(b, t->name);
    /* two numeric dtypes compare as the values they hold (a bf16 store's
     * export against an fp32 run's checkpoint, widened exactly) */
    int same = u && t->ndim == u->ndim &&
               (!strcmp(t->dtype, u->dtype) ||
                (numeric(t->dtype) && numeric(u->dtype)));
    for (int d = 0; same && d < t->ndim; d++) same = t->dims[d] == u->dims[d];
    if (!same) {
      rc = st_error_set(err, ST_EFORMAT,
                        "%s: tensor '%s' is missing or has another dtype or "
                        "shape than in %s",
                        other, t->name, path);
      break;
    }
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->dims[d];
    if (!numeric(t->dtype)) n = 0;
    double most = 0, rel = 0;
    for (size_t k = 0; k < n; k++) {
      double x = element(a->data + t->begin, t->dtype, k),
             y = element(b->data + u->begin, u->dtype, k);
      /* equal infinities differ by nothing, not by inf - inf = NaN */
      double d = x == y ? 0 : fabs(x - y), m = fmax(fabs(x), fabs(y));
      /* a NaN in either counts as the most, and stays the most */
      if (!isnan(most) && !(d <= most)) most = d;
      if (m > 0 && d / m > rel) rel = d / m;
    }
    fprintf(f, "  %-44s max |a - b| %-12.5g max relative %.5g\n", t->name, most,
            rel);
    if (!worst_name || (!isnan(worst_abs) && !(most <= worst_abs)))
      worst_abs = most, worst_name = t->name;
    if (rel > worst_rel) worst_rel = rel;
  }
  if (!rc)
    fprintf(f, "largest difference %.6g (%s), largest relative %.6g\n",
            worst_abs, worst_name ? worst_name : "no tensors", worst_rel);
  st_safetensors_destroy(a);
  st_safetensors_destroy(b);
  return rc;
}
