/*
 * safetensors.c — read and write the safetensors format: an 8-byte
 * little-endian header length N, N bytes of JSON describing each tensor
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}} plus an
 * optional "__metadata__" object of strings), then the raw little-endian data.
 * strata's checkpoints and the PyTorch test fixtures both use it, so other
 * tools read strata's weights without a converter.
 *
 * Reading validates everything a truncated or hand-edited file can break:
 * header length, JSON syntax, dtype, shape x dtype size = byte range, ranges
 * inside the file. Writing is atomic (temp file, fsync, rename, fsync dir).
 */
#include "strata.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ------------------------------------------------------------ JSON reader */

typedef struct json {
  const char *start, *p, *end;
  const char *path;
  st_error *err;
  const char *kind; /* what is parsed, for errors (NULL: the header) */
} json;

static int json_fail(json *j, const char *what) {
  if (j->kind)
    return st_error_set(j->err, ST_EFORMAT, "%s: corrupt %s: %s at byte %ld",
                        j->path, j->kind, what, (long)(j->p - j->start));
  return st_error_set(j->err, ST_EFORMAT,
                      "%s: corrupt safetensors header: %s at header byte %ld",
                      j->path, what, (long)(j->p - j->start));
}

static void skip_ws(json *j) {
  while (j->p < j->end &&
         (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
    j->p++;
}

static int expect(json *j, char c) {
  skip_ws(j);
  if (j->p >= j->end || *j->p != c) {
    char what[32];
    snprintf(what, sizeof what, "expected '%c'", c);
    return json_fail(j, what);
  }
  j->p++;
  return 0;
}

/* Reads a JSON string into out (cap bytes, NUL-terminated). Escapes other
 * than \" \\ \/ and \uXXXX below 0x80 are rejected: names are ASCII. */
static int read_string(json *j, char *out, size_t cap) {
  if (expect(j, '"')) return ST_EFORMAT;
  size_t n = 0;
  while (j->p < j->end && *j->p != '"') {
    char c = *j->p++;
    if (c == '\\') {
      if (j->p >= j->end) break;
      c = *j->p++;
      if (c == 'u') {
        if (j->end - j->p < 4) return json_fail(j, "bad \\u escape");
        long v = 0;
        for (int h = 0; h < 4; h++) {
          char x = j->p[h];
          int d = x >= '0' && x <= '9'   ? x - '0'
                  : x >= 'a' && x <= 'f' ? x - 'a' + 10
                  : x >= 'A' && x <= 'F' ? x - 'A' + 10
                                         : -1;
          if (d < 0) return json_fail(j, "bad \\u escape");
          v = v * 16 + d;
        }
        j->p += 4;
        if (v <= 0 || v >= 0x80) return json_fail(j, "non-ASCII \\u escape");
        c = (char)v;
      } else if (c == 'n' || c == 't' || c == 'r' || c == 'b' || c == 'f') {
        c = c == 'n'   ? '\n'
            : c == 't' ? '\t'
            : c == 'r' ? '\r'
            : c == 'b' ? '\b'
                       : '\f';
      } else if (c != '"' && c != '\\' && c != '/') {
        return json_fail(j, "bad escape");
      }
    }
    if (n + 1 >= cap) return json_fail(j, "string too long");
    out[n++] = c;
  }
  if (j->p >= j->end) return json_fail(j, "unterminated string");
  j->p++;
  out[n] = 0;
  return 0;
}

static int read_int(json *j, int64_t *v) {
  skip_ws(j);
  const char *start = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  const char *digits = j->p;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  /* JSON integers: at least one digit, no leading zero, within int64 */
  if (j->p == digits || j->p - digits > 19 ||
      (digits[0] == '0' && j->p - digits > 1))
    return json_fail(j, "bad integer");
  char buf[24];
  memcpy(buf, start, (size_t)(j->p - start));
  buf[j->p - start] = 0;
  errno = 0;
  *v = strtoll(buf, NULL, 10);
  if (errno == ERANGE) return json_fail(j, "integer out of range");
  return 0;
}

static int peek(json *j, char c) {
  skip_ws(j);
  return j->p < j->end && *j->p == c;
}

/* [int, int, ...] into v (at most cap); returns the count in *n. */
static int read_int_array(json *j, int64_t *v, int cap, int *n) {
  if (expect(j, '[')) return ST_EFORMAT;
  *n = 0;
  if (peek(j, ']')) return j->p++, 0;
  for (;;) {
    if (*n >= cap) return json_fail(j, "too many dimensions");
    if (read_int(j, &v[(*n)++])) return ST_EFORMAT;
    if (peek(j, ',')) {
      j->p++;
      continue;
    }
    return expect(j, ']');
  }
}

static size_t dtype_size(const char *dtype) {
  static const struct {
    const char *name;
    size_t size;
  } table[] = {{"F64", 8},     {"F32", 4},     {"F16", 2}, {"BF16", 2},
               {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I64", 8}, {"I32", 4},
               {"I16", 2},     {"I8", 1},      {"U8", 1},  {"BOOL", 1},
               {"U16", 2},     {"U32", 4},     {"U64", 8}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(dtype, table[i].name) == 0) return table[i].size;
  return 0;
}

/* The metadata key that lists each tensor's CRC-32, in header order. */
#define CRC_KEY "strata.crc32"

static int hex_digit(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : -1;
}

/* CRC_KEY's value: "xxxxxxxx,xxxxxxxx,...", 8 lowercase hex digits each. */
static int read_crcs(json *j, st_safetensors *st) {
  if (st->crcs) return json_fail(j, CRC_KEY " appears twice");
  if (expect(j, '"')) return ST_EFORMAT;
  size_t n = 1;
  for (const char *q = j->p; q < j->end && *q != '"'; q++) n += *q == ',';
  if (!(st->crcs = malloc(n * sizeof *st->crcs)))
    return st_error_set(j->err, ST_ENOMEM, "%s: out of memory", j->path);
  for (;;) {
    uint32_t v = 0;
    for (int d = 0; d < 8; d++, j->p++) {
      int h = j->p < j->end ? hex_digit(*j->p) : -1;
      if (h < 0) return json_fail(j, "bad " CRC_KEY " (8 hex digits each)");
      v = v << 4 | (uint32_t)h;
    }
    st->crcs[st->n_crcs++] = v;
    if (j->p < j->end && *j->p == ',' && (size_t)st->n_crcs < n) {
      j->p++;
      continue;
    }
    return expect(j, '"');
  }
}

#define MAX_META 1024 /* metadata entries a header may hold */
_Static_assert(MAX_META == 1024, "read_metadata's message names 1024");

static int read_metadata(json *j, st_safetensors *st) {
  if (expect(j, '{')) return ST_EFORMAT;
  if (peek(j, '}')) return j->p++, 0;
  for (;;) {
    skip_ws(j);
    if (j->end - j->p > (long)sizeof CRC_KEY &&
        !memcmp(j->p, "\"" CRC_KEY "\"", sizeof CRC_KEY + 1)) {
      j->p += sizeof CRC_KEY + 1;
      if (expect(j, ':') || read_crcs(j, st)) return ST_EFORMAT;
      if (peek(j, ',')) {
        j->p++;
        continue;
      }
      return expect(j, '}');
    }
    /* each entry holds a 64-byte key and a 256-byte value however short:
     * a bounded count, grown by doubling, so a header of a million tiny
     * entries costs neither gigabytes nor quadratic copying */
    if (st->n_meta == MAX_META)
      return json_fail(j, "more than 1024 metadata entries");
    if ((st->n_meta & (st->n_meta - 1)) == 0) { /* 0, 1, 2, 4, ...: full */
      size_t cap = st->n_meta ? 2 * (size_t)st->n_meta : 1;
      void *k = realloc(st->meta_keys, cap * 64);
      if (!k)
        return st_error_set(j->err, ST_ENOMEM, "%s: out of memory", j->path);
      st->meta_keys = k;
      void *v = realloc(st->meta_values, cap * 256);
      if (!v)
        return st_error_set(j->err, ST_ENOMEM, "%s: out of memory", j->path);
      st->meta_values = v;
    }
    if (read_string(j, st->meta_keys[st->n_meta], 64) || expect(j, ':') ||
        read_string(j, st->meta_values[st->n_meta], 256))
      return ST_EFORMAT;
    st->n_meta++;
    if (peek(j, ',')) {
      j->p++;
      continue;
    }
    return expect(j, '}');
  }
}

static int read_tensor(json *j, st_st_tensor *t) {
  int have_dtype = 0, have_shape = 0, have_offsets = 0;
  if (expect(j, '{')) return ST_EFORMAT;
  while (!peek(j, '}')) {
    char key[32];
    if (read_string(j, key, sizeof key) || expect(j, ':')) return ST_EFORMAT;
    if (strcmp(key, "dtype") == 0) {
      if (read_string(j, t->dtype, sizeof t->dtype)) return ST_EFORMAT;
      have_dtype = 1;
    } else if (strcmp(key, "shape") == 0) {
      if (read_int_array(j, t->dims, 8, &t->ndim)) return ST_EFORMAT;
      have_shape = 1;
    } else if (strcmp(key, "data_offsets") == 0) {
      int64_t off[2];
      int n;
      if (read_int_array(j, off, 2, &n)) return ST_EFORMAT;
      if (n != 2 || off[0] < 0 || off[1] < off[0])
        return json_fail(j, "bad data_offsets");
      t->begin = (size_t)off[0];
      t->end = (size_t)off[1];
      have_offsets = 1;
    } else {
      return json_fail(j, "unknown tensor field");
    }
    if (peek(j, ','))
      j->p++;
    else if (!peek(j, '}'))
      return json_fail(j, "expected ',' or '}'");
  }
  j->p++;
  if (!have_dtype || !have_shape || !have_offsets)
    return json_fail(j, "tensor entry lacks dtype, shape or data_offsets");
  return 0;
}

static int parse_header(json *j, st_safetensors *st) {
  if (expect(j, '{')) return ST_EFORMAT;
  if (peek(j, '}')) return j->p++, 0;
  int cap = 0; /* grown by doubling: a header may list millions */
  for (;;) {
    char name[128];
    if (read_string(j, name, sizeof name) || expect(j, ':')) return ST_EFORMAT;
    if (strcmp(name, "__metadata__") == 0) {
      if (read_metadata(j, st)) return ST_EFORMAT;
    } else {
      if (st->n_tensors == cap) {
        cap = cap ? 2 * cap : 64;
        void *grown = realloc(st->tensors, (size_t)cap * sizeof *st->tensors);
        if (!grown)
          return st_error_set(j->err, ST_ENOMEM, "%s: out of memory", j->path);
        st->tensors = grown;
      }
      st_st_tensor *t = &st->tensors[st->n_tensors++];
      memset(t, 0, sizeof *t);
      snprintf(t->name, sizeof t->name, "%s", name);
      if (read_tensor(j, t)) return ST_EFORMAT;
    }
    if (peek(j, ',')) {
      j->p++;
      continue;
    }
    return expect(j, '}');
  }
}

/* By where the bytes begin; an empty tensor before a full one that begins
 * where it does (both tile the section, in any header order). */
static int by_begin(const void *a, const void *b) {
  const st_st_tensor *x = *(const st_st_tensor *const *)a,
                     *y = *(const st_st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const st_st_tensor *const *)a)->name,
                (*(const st_st_tensor *const *)b)->name);
}

/* The tensors in name order (st->by_name, for st_safetensors_find); a name
 * listed twice is corrupt. O(n log n): a header may list millions. */
static int index_names(st_safetensors *st, st_error *err) {
  if (st->n_tensors == 0) return 0;
  st->by_name = malloc((size_t)st->n_tensors * sizeof *st->by_name);
  if (!st->by_name) return st_error_set(err, ST_ENOMEM, "out of memory");
  for (int i = 0; i < st->n_tensors; i++) st->by_name[i] = &st->tensors[i];
  qsort(st->by_name, (size_t)st->n_tensors, sizeof *st->by_name, by_name);
  for (int i = 1; i < st->n_tensors; i++)
    if (!strcmp(st->by_name[i]->name, st->by_name[i - 1]->name))
      return st_error_set(err, ST_EFORMAT,
                          "%s: corrupt safetensors header: tensor '%s' "
                          "appears twice",
                          st->path, st->by_name[i]->name);
  return 0;
}

/* The specification's layout: the byte ranges tile the data section from 0
 * to its end with no hole and no overlap. */
static int check_tiling(const st_safetensors *st, st_error *err) {
  if (st->n_tensors == 0) return 0;
  const st_st_tensor **order = malloc((size_t)st->n_tensors * sizeof *order);
  if (!order) return st_error_set(err, ST_ENOMEM, "out of memory");
  for (int i = 0; i < st->n_tensors; i++) order[i] = &st->tensors[i];
  qsort(order, (size_t)st->n_tensors, sizeof *order, by_begin);
  size_t at = 0;
  int rc = 0;
  for (int i = 0; i < st->n_tensors && !rc; i++) {
    if (order[i]->begin != at)
      rc = st_error_set(err, ST_EFORMAT,
                        "%s: corrupt safetensors data: tensor '%s' starts at "
                        "byte %zu, expected %zu (a hole or an overlap)",
                        st->path, order[i]->name, order[i]->begin, at);
    at = order[i]->end;
  }
  if (!rc && at != st->data_bytes)
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: corrupt safetensors data: tensors end at byte %zu "
                      "but the data section has %zu",
                      st->path, at, st->data_bytes);
  free(order);
  return rc;
}

/* Every tensor's byte range must match its dtype and shape and lie inside
 * the data section: this is where a truncated file is caught. */
static int check_tensors(st_safetensors *st, st_error *err) {
  for (int i = 0; i < st->n_tensors; i++) {
    const st_st_tensor *t = &st->tensors[i];
    size_t es = dtype_size(t->dtype);
    if (!es)
      return st_error_set(err, ST_EFORMAT,
                          "%s: tensor '%s': unknown dtype '%s'", st->path,
                          t->name, t->dtype);
    size_t bytes = es;
    int empty = 0; /* a zero dimension: no bytes, however large the rest */
    for (int d = 0; d < t->ndim; d++) empty |= t->dims[d] == 0;
    for (int d = 0; d < t->ndim; d++) {
      if (t->dims[d] < 0)
        return st_error_set(err, ST_EFORMAT,
                            "%s: tensor '%s': negative dimension", st->path,
                            t->name);
      if (empty) {
        bytes = 0;
        continue;
      }
      if (bytes > SIZE_MAX / (size_t)t->dims[d])
        return st_error_set(err, ST_EFORMAT, "%s: tensor '%s': shape too large",
                            st->path, t->name);
      bytes *= (size_t)t->dims[d];
    }
    if (bytes != t->end - t->begin)
      return st_error_set(err, ST_EFORMAT,
                          "%s: tensor '%s': shape needs %zu bytes but "
                          "data_offsets give %zu",
                          st->path, t->name, bytes, t->end - t->begin);
    if (t->end > st->data_bytes)
      return st_error_set(err, ST_EFORMAT,
                          "%s: truncated: tensor '%s' needs bytes [%zu, %zu) "
                          "of the data section, which has only %zu",
                          st->path, t->name, t->begin, t->end, st->data_bytes);
  }
  /* names first: a name listed twice is that, not an overlap */
  int rc = index_names(st, err);
  return rc ? rc : check_tiling(st, err);
}

/* Reads and checks the header; the data section too when load is 1, else
 * the file stays open for st_safetensors_pread. */
static int open_file(st_safetensors **out, const char *path, int load,
                     st_error *err) {
  *out = NULL;
  int rc = 0;
  uint8_t *buf = NULL;
  char *header = NULL;
  st_safetensors *st = calloc(1, sizeof *st);
  if (!st) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  st->fd = -1;
  snprintf(st->path, sizeof st->path, "%s", path);
  int fd = st_open_regular(path, err);
  FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
  if (fd >= 0 && !f) {
    close(fd);
    rc = st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  if (!f) {
    rc = err->code;
    goto fail;
  }
  uint8_t len_bytes[8];
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0) {
    rc = st_error_set(err, ST_EIO, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (fread(len_bytes, 1, 8, f) != 8) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: truncated: shorter than the 8-byte header length",
                      path);
    goto fail;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len_bytes[i];
  size_t fsize = (size_t)sb.st_size;
  if (memcmp(len_bytes, "STRATAWS", 8) == 0) { /* src/exec/store.c's magic */
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: a weight-streaming store, not safetensors: "
                      "`strata export RUN_DIR` writes its weights as a "
                      "checkpoint",
                      path);
    goto fail;
  }
  if (hlen > fsize - 8 || hlen > (100u << 20)) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: truncated or not safetensors: header length %llu "
                      "but the file has %zu bytes",
                      path, (unsigned long long)hlen, fsize);
    goto fail;
  }
  header = malloc(hlen + 1);
  st->data_bytes = fsize - 8 - hlen;
  st->data_start = 8 + hlen;
  if (load) buf = st_alloc(st->data_bytes);
  if (!header || (load && !buf)) {
    rc = st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  if (fread(header, 1, hlen, f) != hlen ||
      (load && fread(buf, 1, st->data_bytes, f) != st->data_bytes)) {
    rc =
        st_error_set(err, ST_EIO, "%s: read failed: %s", path,
                     ferror(f) ? strerror(errno) : "file shrank while reading");
    goto fail;
  }
  json j = {header, header, header + hlen, path, err, NULL};
  if ((rc = parse_header(&j, st))) goto fail;
  skip_ws(&j);
  if (j.p != j.end) {
    rc = json_fail(&j, "text after the header object");
    goto fail;
  }
  st->data = buf;
  buf = NULL;
  if ((rc = check_tensors(st, err))) goto fail;
  if (st->crcs) {
    if (st->n_crcs != st->n_tensors) {
      rc = st_error_set(err, ST_EFORMAT,
                        "%s: corrupt safetensors header: " CRC_KEY
                        " lists %d CRCs for %d tensors",
                        path, st->n_crcs, st->n_tensors);
      goto fail;
    }
    for (int i = 0; i < st->n_tensors; i++) {
      st->tensors[i].has_crc = 1;
      st->tensors[i].crc = st->crcs[i];
    }
    free(st->crcs); /* the tensors hold them now */
    st->crcs = NULL;
  }
  for (int i = 0; load && i < st->n_tensors; i++) {
    const st_st_tensor *t = &st->tensors[i];
    if ((rc = st_safetensors_verify(
             st, t,
             (uint32_t)crc32_z(0, st->data + t->begin, t->end - t->begin),
             err)))
      goto fail;
  }
  if (!load && (st->fd = dup(fileno(f))) < 0) {
    rc =
        st_error_set(err, ST_EIO, "%s: cannot open: %s", path, strerror(errno));
    goto fail;
  }
  fclose(f);
  free(header);
  *out = st;
  return 0;
fail:
  if (f) fclose(f);
  free(header);
  st_free(buf);
  st_safetensors_destroy(st);
  return rc;
}

int st_safetensors_read(st_safetensors **out, const char *path, st_error *err) {
  return open_file(out, path, 1, err);
}

int st_safetensors_open(st_safetensors **out, const char *path, st_error *err) {
  return open_file(out, path, 0, err);
}

int st_safetensors_pread(const st_safetensors *st, const st_st_tensor *t,
                         size_t off, size_t bytes, void *dst, st_error *err) {
  if (off > t->end - t->begin || bytes > t->end - t->begin - off)
    return st_error_set(err, ST_EARG,
                        "%s: internal error: a read past tensor '%s'", st->path,
                        t->name);
  int whole = off == 0 && bytes == t->end - t->begin;
  if (st->data) {
    memcpy(dst, st->data + t->begin + off, bytes);
    return 0; /* checked when read */
  }
  uint8_t *p = dst;
  off_t at = (off_t)(st->data_start + t->begin + off);
  while (bytes) {
    ssize_t n = pread(st->fd, p, bytes, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return st_error_set(err, ST_EIO, "%s: reading tensor '%s': %s", st->path,
                          t->name, n < 0 ? strerror(errno) : "the file shrank");
    p += n;
    at += n;
    bytes -= (size_t)n;
  }
  return whole ? st_safetensors_verify(
                     st, t, (uint32_t)crc32_z(0, dst, p - (uint8_t *)dst), err)
               : 0;
}

int st_safetensors_verify(const st_safetensors *st, const st_st_tensor *t,
                          uint32_t crc, st_error *err) {
  if (!t->has_crc || crc == t->crc) return 0;
  return st_error_set(err, ST_EFORMAT,
                      "%s: tensor '%s' is damaged: its bytes' CRC-32 is "
                      "%08x, the file lists %08x",
                      st->path, t->name, crc, t->crc);
}

void st_safetensors_destroy(st_safetensors *st) {
  if (!st) return;
  free(st->tensors);
  free(st->by_name);
  free(st->meta_keys);
  free(st->meta_values);
  free(st->crcs);
  st_free(st->data);
  if (st->fd >= 0) close(st->fd);
  free(st);
}

const st_st_tensor *st_safetensors_find(const st_safetensors *st,
                                        const char *name) {
  int lo = 0, hi = st->by_name ? st->n_tensors : 0; /* none: no tensors */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(st->by_name[mid]->name, name);
    if (c == 0) return st->by_name[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

const char *st_safetensors_meta(const st_safetensors *st, const char *key) {
  for (int i = 0; i < st->n_meta; i++)
    if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
  return NULL;
}

/* ------------------------------------------------------------ the index */

/* Skips one metadata value: a string or an integer. */
static int skip_value(json *j) {
  char buf[512];
  int64_t v;
  return peek(j, '"') ? read_string(j, buf, sizeof buf) : read_int(j, &v);
}

int st_safetensors_index_read(const char *path, st_st_index *out,
                              st_error *err) {
  memset(out, 0, sizeof *out);
  size_t len = 0;
  uint8_t *bytes = NULL;
  int rc = st_file_read(&bytes, &len, path, err);
  if (rc) return rc;
  const char *text = (const char *)bytes;
  json j = {text, text, text + len, path, err, "model.safetensors.index.json"};
  int seen_map = 0;
  rc = expect(&j, '{');
  while (!rc && !peek(&j, '}')) {
    char key[64];
    if ((rc = read_string(&j, key, sizeof key)) || (rc = expect(&j, ':')) ||
        (rc = expect(&j, '{')))
      break;
    int map = !strcmp(key, "weight_map");
    seen_map |= map;
    while (!rc && !peek(&j, '}')) {
      char name[sizeof out->names[0]], file[sizeof out->files[0]];
      if ((rc = read_string(&j, name, sizeof name)) || (rc = expect(&j, ':')))
        break;
      if (!map) {
        rc = skip_value(&j);
      } else if (!(rc = read_string(&j, file, sizeof file))) {
        /* a shard beside the index: no directories, no way up */
        if (strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, "..")) {
          rc = json_fail(&j, "a shard's file name holds a '/'");
          break;
        }
        if (out->n == out->cap) {
          int cap = out->cap ? 2 * out->cap : 64;
          void *n2 = realloc(out->names, (size_t)cap * sizeof *out->names);
          if (n2) out->names = n2;
          void *f2 = realloc(out->files, (size_t)cap * sizeof *out->files);
          if (f2) out->files = f2;
          if (!n2 || !f2) {
            rc = st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
            break;
          }
          out->cap = cap;
        }
        memcpy(out->names[out->n], name, sizeof name);
        memcpy(out->files[out->n++], file, sizeof file);
      }
      if (!rc && peek(&j, ',')) j.p++;
    }
    if (!rc) rc = expect(&j, '}');
    if (!rc && peek(&j, ',')) j.p++;
  }
  if (!rc) rc = expect(&j, '}');
  if (!rc && !seen_map) rc = json_fail(&j, "no weight_map");
  st_free(bytes);
  if (rc) st_safetensors_index_free(out);
  return rc;
}

void st_safetensors_index_free(st_st_index *x) {
  free(x->names);
  free(x->files);
  memset(x, 0, sizeof *x);
}

/* ------------------------------------------------------------------ writer */

typedef struct entry {
  char name[128];
  char dtype[8];
  int ndim;
  int64_t dims[8];
  const void *data;
  size_t bytes;
  uint32_t crc; /* of its bytes, once written */
} entry;

struct st_st_writer {
  entry *entries;
  int n, cap;
  char (*meta)[2][256];
  int n_meta;
};

st_st_writer *st_st_writer_create(void) {
  return calloc(1, sizeof(st_st_writer));
}

void st_st_writer_destroy(st_st_writer *w) {
  if (!w) return;
  free(w->entries);
  free(w->meta);
  free(w);
}

int st_st_writer_add(st_st_writer *w, const char *name, const char *dtype,
                     int ndim, const int64_t *dims, const void *data,
                     st_error *err) {
  size_t es = dtype_size(dtype);
  if (!es || ndim < 0 || ndim > 8 || strlen(name) >= sizeof w->entries->name ||
      strpbrk(name, "\"\\") || strcmp(name, "__metadata__") == 0)
    return st_error_set(err, ST_EARG,
                        "safetensors: tensor name '%s' is too long, reserved "
                        "or holds a quote or backslash, or its dtype/rank is "
                        "unsupported",
                        name);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    entry *grown = realloc(w->entries, (size_t)cap * sizeof *grown);
    if (!grown) return st_error_set(err, ST_ENOMEM, "out of memory");
    w->entries = grown;
    w->cap = cap;
  }
  entry *e = &w->entries[w->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  snprintf(e->dtype, sizeof e->dtype, "%s", dtype);
  e->ndim = ndim;
  e->bytes = es;
  for (int d = 0; d < ndim; d++) {
    e->dims[d] = dims[d];
    e->bytes *= (size_t)dims[d];
  }
  e->data = data;
  return 0;
}

int st_st_writer_meta(st_st_writer *w, const char *key, const char *value,
                      st_error *err) {
  if (strlen(key) >= 64 || strlen(value) >= 256 || strpbrk(key, "\"\\") ||
      strpbrk(value, "\"\\"))
    return st_error_set(err, ST_EARG, "safetensors: bad metadata '%s'", key);
  void *grown = realloc(w->meta, (size_t)(w->n_meta + 1) * sizeof *w->meta);
  if (!grown) return st_error_set(err, ST_ENOMEM, "out of memory");
  w->meta = grown;
  snprintf(w->meta[w->n_meta][0], 256, "%s", key);
  snprintf(w->meta[w->n_meta][1], 256, "%s", value);
  w->n_meta++;
  return 0;
}

/* Appends printf output to a growing buffer. */
typedef struct sbuf {
  char *s;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0,
                      fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if (b->s && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *grown = realloc(b->s, cap);
    if (!grown) {
      b->oom = 1;
      return;
    }
    b->s = grown;
    b->cap = cap;
  }
}

/* The header, with every tensor's CRC as it stands in w (the same length
 * whatever they are: 8 hex digits each). */
static char *build_header(const st_st_writer *w, size_t *len) {
  sbuf b = {0};
  sb_printf(&b, "{");
  int meta = w->n_meta || w->n;
  if (meta) {
    sb_printf(&b, "\"__metadata__\":{");
    for (int i = 0; i < w->n_meta; i++)
      sb_printf(&b, "%s\"%s\":\"%s\"", i ? "," : "", w->meta[i][0],
                w->meta[i][1]);
    for (int i = 0; i < w->n; i++)
      sb_printf(&b, "%s%08x",
                i           ? ","
                : w->n_meta ? ",\"" CRC_KEY "\":\""
                            : "\"" CRC_KEY "\":\"",
                (unsigned)w->entries[i].crc);
    sb_printf(&b, "%s}", w->n ? "\"" : "");
  }
  size_t off = 0;
  for (int i = 0; i < w->n; i++) {
    const entry *e = &w->entries[i];
    sb_printf(&b, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
              (i || meta) ? "," : "", e->name, e->dtype);
    for (int d = 0; d < e->ndim; d++)
      sb_printf(&b, "%s%lld", d ? "," : "", (long long)e->dims[d]);
    sb_printf(&b, "],\"data_offsets\":[%zu,%zu]}", off, off + e->bytes);
    off += e->bytes;
  }
  sb_printf(&b, "}");
  /* Pad with spaces so the data section starts 8-byte aligned. */
  while (!b.oom && b.len % 8) sb_printf(&b, " ");
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  *len = b.len;
  return b.s;
}

int st_st_writer_write(st_st_writer *w, const char *path, st_error *err) {
  return st_st_writer_write_fetch(w, path, NULL, NULL, err);
}

int st_st_writer_write_fetch(st_st_writer *w, const char *path,
                             st_st_fetch fetch, void *arg, st_error *err) {
  size_t hlen;
  char *header = build_header(w, &hlen);
  if (!header) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  /* Streamed into a temp file, tensor by tensor (no image of the whole
   * file in memory), then renamed: the file on disk is either the old
   * one or the complete new one, never a prefix. Every fetch is made
   * even after a write failed (a peer sending tensors is not left
   * waiting); the first error is returned. */
  st_atomic_file f;
  int rc = st_atomic_open(&f, path, err);
  if (!rc) rc = st_atomic_write(&f, len, 8, err);
  if (!rc) rc = st_atomic_write(&f, header, hlen, err);
  for (int i = 0; i < w->n; i++) { /* every fetch, even after an error */
    const void *data = w->entries[i].data;
    if (!data && fetch) {
      st_error fetch_err = {0};
      data = fetch(arg, i, &fetch_err);
      if (!data && !rc) {
        *err = fetch_err;
        rc = fetch_err.code ? fetch_err.code : ST_EIO;
      }
    } else if (!data && !rc && w->entries[i].bytes) {
      rc = st_error_set(err, ST_EARG,
                        "%s: internal error: tensor '%s' has no data", path,
                        w->entries[i].name);
    }
    w->entries[i].crc =
        data ? (uint32_t)crc32_z(0, data, w->entries[i].bytes) : 0;
    if (!rc && data && w->entries[i].bytes)
      rc = st_atomic_write(&f, data, w->entries[i].bytes, err);
  }
  /* the header again, now with the CRCs: the same length, in place */
  if (!rc) {
    size_t again;
    free(header);
    header = build_header(w, &again);
    if (!header || again != hlen)
      rc = st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
    for (size_t done = 0; !rc && done < hlen;) {
      ssize_t n = pwrite(f.fd, header + done, hlen - done, (off_t)(8 + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        rc = st_error_set(err, ST_EIO, "%s: write failed: %s", path,
                          strerror(n < 0 ? errno : EIO));
      else
        done += (size_t)n;
    }
  }
  rc = st_atomic_close(&f, rc, err);
  free(header);
  return rc;
}

int st_mkdir_p(const char *path, int include_last, st_error *err) {
  char buf[ST_PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return st_error_set(err, ST_EARG, "%.64s...: path too long", path);
  for (char *p = buf + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    if (*p == '\0' && !include_last) break;
    char keep = *p;
    *p = '\0';
    struct stat sb;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return st_error_set(err, ST_EIO, "%s: cannot create: %s", buf,
                          strerror(errno));
    /* a file of that name: found now, not when the first write fails */
    if (stat(buf, &sb) == 0 && !S_ISDIR(sb.st_mode))
      return st_error_set(err, ST_EIO, "%s: cannot create: %s", buf,
                          strerror(ENOTDIR));
    *p = keep;
    if (!keep) break;
  }
  return 0;
}

int st_write_stream_atomic(FILE *f, char **text, size_t *len, const char *path,
                           st_error *err) {
  /* the stream's text and length are final only once it is closed */
  int rc = fclose(f) == 0
               ? st_write_file_atomic(path, *text, *len, err)
               : st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  free(*text);
  *text = NULL;
  return rc;
}

int st_atomic_open(st_atomic_file *f, const char *path, st_error *err) {
  f->fd = -1;
  if (strlen(path) >= ST_PATH_MAX)
    return st_error_set(err, ST_EARG, "%.64s...: path longer than %d bytes",
                        path, ST_PATH_MAX - 1);
  snprintf(f->path, sizeof f->path, "%s", path);
  snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld", path, (long)getpid());
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (f->fd < 0)
    return st_error_set(err, ST_EIO, "%s: cannot create (temp file %s): %s",
                        path, f->tmp, strerror(errno));
  return 0;
}

int st_atomic_write(st_atomic_file *f, const void *data, size_t bytes,
                    st_error *err) {
  const uint8_t *p = data;
  size_t left = bytes;
  while (left) {
    ssize_t n = write(f->fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return st_error_set(err, ST_EIO, "%s: write failed: %s", f->path,
                          strerror(n < 0 ? errno : EIO));
    p += n;
    left -= (size_t)n;
  }
  return 0;
}

int st_atomic_close(st_atomic_file *f, int rc, st_error *err) {
  if (f->fd < 0) return rc;
  if (rc) { /* the old file stays */
    close(f->fd);
    unlink(f->tmp);
    f->fd = -1;
    return rc;
  }
  int synced = fsync(f->fd) == 0 ? 0 : errno;
  int closed = close(f->fd) == 0 ? 0 : errno;
  f->fd = -1;
  if (synced || closed) {
    int e = synced ? synced : closed;
    unlink(f->tmp);
    return st_error_set(err, ST_EIO, "%s: fsync failed: %s", f->path,
                        strerror(e));
  }
  if (rename(f->tmp, f->path) != 0) {
    int e = errno;
    unlink(f->tmp);
    return st_error_set(err, ST_EIO, "%s: rename failed: %s", f->path,
                        strerror(e));
  }
  /* The rename is durable only once the directory entry is on disk. */
  char dir[ST_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", f->path);
  return st_sync_dir(dirname(dir), err);
}

int st_sync_dir(const char *dir, st_error *err) {
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int e = dfd < 0 || fsync(dfd) != 0 ? errno : 0;
  if (dfd >= 0) close(dfd);
  /* EACCES: a folder one may write but not read cannot be opened to
   * sync, by this process or any other without privilege */
  if (!e || e == EINVAL || e == ENOTSUP || e == EOPNOTSUPP || e == EACCES)
    return 0;
  return st_error_set(err, ST_EIO,
                      "%s: cannot sync the folder: %s (its last change may "
                      "not survive a crash)",
                      dir, strerror(e));
}

int st_write_file_atomic(const char *path, const void *data, size_t bytes,
                         st_error *err) {
  st_atomic_file f;
  int rc = st_atomic_open(&f, path, err);
  if (!rc) rc = st_atomic_write(&f, data, bytes, err);
  return st_atomic_close(&f, rc, err);
}
