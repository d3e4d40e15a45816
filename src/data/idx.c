/*
 * idx.c — datasets in memory: the gzip IDX reader (Fashion-MNIST layout) and
 * the st_dataset life cycle that every source shares (storage, pixel
 * statistics, batch assembly, destroy).
 *
 * IDX (http://yann.lecun.com/exdb/mnist/): a big-endian int32 magic (2049 for
 * labels, 2051 for images), one big-endian int32 per dimension, then the
 * bytes. Files come from outside, so every field is checked and every failure
 * is one line naming the file and the cause. inflate verifies the gzip CRC
 * only when the stream ends, so a full load reads past the last sample to
 * reach the trailer; a load with `limit` stops early and trusts the bytes it
 * read.
 */
#include "strata.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_LABEL_MAGIC 2049u /* 0x00000801: unsigned bytes, 1 dimension */
#define IDX_IMAGE_MAGIC 2051u /* 0x00000803: unsigned bytes, 3 dimensions */
#define IDX_MAX_SIDE 4096u

/* Shared with synthetic.c; internal to src/data, so not in strata.h. */
int st_dataset_alloc(st_dataset **out, const char *name, int n, st_shape shape,
                     st_error *err);
void st_dataset_compute_stats(st_dataset *ds);

/* One IDX file being read: plain, or one or more gzip members read with
 * inflate directly (gzread ends quietly when input runs out at a buffer's
 * edge, so a file cut inside its trailer could load without a CRC check,
 * and it skips bytes after the last member). */
typedef struct idx_file {
  const char *path;
  const char *kind;
  int fd;
  int gzip;         /* starts with the gzip magic 1f 8b */
  int ended;        /* gzip: the last member ended where the file does */
  int inflating;    /* z was initialised */
  long long before; /* file bytes read before the buffer's first */
  z_stream z;
  uint8_t *in; /* IDX_IN bytes */
} idx_file;

#define IDX_IN (1u << 17) /* 128 KiB: fewer reads than zlib's 8 KiB */

/* The offset in the file of the next byte inflate would take. */
static long long idx_offset(const idx_file *f) {
  return f->before + (long long)(f->z.next_in - f->in);
}

/* Moves the unread input to the buffer's start and reads more behind it.
 * Returns the bytes now available; 0 only at the end of the file. */
static int idx_fill(idx_file *f, size_t *avail, st_error *err) {
  size_t keep = f->z.avail_in;
  f->before = idx_offset(f);
  memmove(f->in, f->z.next_in, keep);
  f->z.next_in = f->in;
  while (keep < IDX_IN) {
    ssize_t n = read(f->fd, f->in + keep, IDX_IN - keep);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return st_error_set(err, ST_EIO, "%s: read error at byte %lld: %s",
                          f->path, f->before + (long long)keep,
                          strerror(errno));
    if (n == 0) break;
    keep += (size_t)n;
    if (keep >= 2) break; /* enough for a caller that peeks at a magic */
  }
  f->z.avail_in = (uInt)keep;
  *avail = keep;
  return 0;
}

/* Opens f->path; `kind` ("image" or "label") goes into the messages. */
static int idx_open(idx_file *f, const char *kind, st_error *err) {
  f->kind = kind;
  f->fd = st_open_regular(f->path, err);
  if (f->fd < 0) return err->code;
  f->in = st_alloc(IDX_IN);
  if (!f->in) return st_error_set(err, ST_ENOMEM, "%s: out of memory", f->path);
  f->z.next_in = f->in;
  size_t avail;
  int rc = idx_fill(f, &avail, err);
  if (rc) return rc;
  f->gzip = avail >= 2 && f->in[0] == 0x1f && f->in[1] == 0x8b;
  if (!f->gzip) return 0;
  if (inflateInit2(&f->z, 16 + MAX_WBITS) != Z_OK)
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", f->path);
  f->inflating = 1;
  return 0;
}

static void idx_close(idx_file *f) {
  if (f->inflating) inflateEnd(&f->z);
  f->inflating = 0;
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  st_free(f->in);
  f->in = NULL;
}

/* After a member's end: another member may follow, anything else is not
 * part of a gzip file. */
static int idx_next_member(idx_file *f, st_error *err) {
  size_t avail = f->z.avail_in;
  if (avail < 2) {
    int rc = idx_fill(f, &avail, err);
    if (rc) return rc;
  }
  if (avail == 0) {
    f->ended = 1;
    return 0;
  }
  if (avail >= 2 && f->z.next_in[0] == 0x1f && f->z.next_in[1] == 0x8b) {
    inflateReset(&f->z);
    return 0;
  }
  struct stat sb;
  long long size = fstat(f->fd, &sb) == 0 ? (long long)sb.st_size : -1;
  return st_error_set(err, ST_EFORMAT,
                      "%s: %lld bytes after the gzip stream's end at byte "
                      "%lld are not gzip data",
                      f->path, size - idx_offset(f), idx_offset(f));
}

/* Reads up to `want` bytes into buf; *got < want only where the data ends
 * cleanly (a plain file's end, or the last gzip member's). *cut says the
 * file ended inside a gzip member. */
static int idx_pull(idx_file *f, uint8_t *buf, size_t want, size_t *got,
                    int *cut, st_error *err) {
  *got = 0;
  *cut = 0;
  while (*got < want) {
    size_t avail = f->z.avail_in;
    if (!f->gzip) {
      if (avail == 0) {
        int rc = idx_fill(f, &avail, err);
        if (rc) return rc;
        if (avail == 0) return 0;
      }
      size_t n = want - *got < avail ? want - *got : avail;
      memcpy(buf + *got, f->z.next_in, n);
      f->z.next_in += n;
      f->z.avail_in -= (uInt)n;
      *got += n;
      continue;
    }
    if (f->ended) return 0;
    if (avail == 0) {
      int rc = idx_fill(f, &avail, err);
      if (rc) return rc;
      if (avail == 0) return *cut = 1, 0;
    }
    size_t slice = want - *got;
    if (slice > (1u << 30)) slice = 1u << 30;
    f->z.next_out = buf + *got;
    f->z.avail_out = (uInt)slice;
    int zrc = inflate(&f->z, Z_NO_FLUSH);
    *got += slice - f->z.avail_out;
    if (zrc == Z_STREAM_END) {
      int rc = idx_next_member(f, err);
      if (rc) return rc;
    } else if (zrc == Z_MEM_ERROR) {
      return st_error_set(err, ST_ENOMEM, "%s: out of memory", f->path);
    } else if (zrc != Z_OK && zrc != Z_BUF_ERROR) {
      return st_error_set(
          err, ST_EFORMAT, "%s: corrupt gzip data: %s (at byte %lld)", f->path,
          f->z.msg ? f->z.msg : "inflate failed", idx_offset(f));
    }
  }
  return 0;
}

/* Reads exactly `bytes` bytes or fails, naming `what` was cut short. */
static int idx_read(idx_file *f, void *buf, size_t bytes, const char *what,
                    st_error *err) {
  size_t got;
  int cut;
  int rc = idx_pull(f, buf, bytes, &got, &cut, err);
  if (rc) return rc;
  if (got < bytes)
    return st_error_set(err, ST_EFORMAT,
                        "%s: truncated: expected %zu %s, got %zu", f->path,
                        bytes, what, got);
  return 0;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

/* Checks the magic and reads the `ndims` dimensions that follow it. */
static int idx_read_header(idx_file *f, uint32_t magic, int ndims,
                           uint32_t *dims, st_error *err) {
  uint8_t raw[4 * 4];
  int rc = idx_read(f, raw, 4, "header bytes", err);
  if (rc) return rc;
  uint32_t found = be32(raw);
  if (found != magic) {
    const char *hint = "";
    if (found == IDX_LABEL_MAGIC) hint = "; this is a label file";
    if (found == IDX_IMAGE_MAGIC) hint = "; this is an image file";
    return st_error_set(
        err, ST_EFORMAT,
        "%s: not a gzip IDX %s file (magic 0x%08x, expected %u)%s", f->path,
        f->kind, found, magic, hint);
  }
  rc = idx_read(f, raw, 4 * (size_t)ndims, "header bytes", err);
  if (rc) return rc;
  for (int d = 0; d < ndims; d++) dims[d] = be32(raw + 4 * d);
  if (dims[0] == 0 || dims[0] > INT_MAX)
    return st_error_set(err, ST_EDATA,
                        "%s: sample count %u out of range (1..%d)", f->path,
                        dims[0], INT_MAX);
  return 0;
}

/* After the last sample the data must end: reading on makes inflate check
 * the CRC and length in the gzip trailer, and bytes left over in a sound
 * file mean the header's count is wrong. */
static int idx_expect_end(idx_file *f, int count, st_error *err) {
  uint8_t extra[4096];
  size_t got, more = 0;
  int cut;
  /* read to the end: damage inside the deflate data can decode to extra
   * bytes, and then the CRC names the cause rather than the count */
  do {
    int rc = idx_pull(f, extra, sizeof extra, &got, &cut, err);
    if (rc) return rc;
    more += got;
  } while (got == sizeof extra);
  if (more)
    return st_error_set(err, ST_EFORMAT,
                        "%s: trailing data after %d %ss: %zu byte%s more "
                        "(header count too small?)",
                        f->path, count, f->kind, more, more == 1 ? "" : "s");
  if (cut)
    return st_error_set(err, ST_EFORMAT,
                        "%s: truncated: gzip trailer missing after %d %ss",
                        f->path, count, f->kind);
  return 0;
}

/* Opens both files and validates their headers against each other. */
static int open_pair(idx_file *images, idx_file *labels, int *count,
                     st_shape *shape, st_error *err) {
  uint32_t label_dims[1] = {0}, image_dims[3] = {0};
  int rc = idx_open(labels, "label", err);
  if (!rc) rc = idx_read_header(labels, IDX_LABEL_MAGIC, 1, label_dims, err);
  if (!rc) rc = idx_open(images, "image", err);
  if (!rc) rc = idx_read_header(images, IDX_IMAGE_MAGIC, 3, image_dims, err);
  if (rc) return rc;
  uint32_t rows = image_dims[1], cols = image_dims[2];
  if (rows < 1 || rows > IDX_MAX_SIDE || cols < 1 || cols > IDX_MAX_SIDE)
    return st_error_set(
        err, ST_EFORMAT,
        "%s: image size %ux%u out of range (rows and cols must be 1..%u)",
        images->path, rows, cols, IDX_MAX_SIDE);
  if (image_dims[0] != label_dims[0])
    return st_error_set(err, ST_EDATA, "%s: %u images but %s has %u labels",
                        images->path, image_dims[0], labels->path,
                        label_dims[0]);
  *count = (int)image_dims[0];
  *shape = (st_shape){1, (int)rows, (int)cols};
  return 0;
}

/* Whether the file can hold `bytes` more bytes after its header, before
 * they are allocated: a header's count is the file's word, and a corrupt one
 * (20 million samples in a file of 600) had the load zero 15 GB and read
 * for a minute before the end of the file said so. A plain file holds its
 * size; a gzip stream at most 1032 bytes for each of its own (deflate's
 * largest expansion). */
static int fits_file(const idx_file *f, int count, size_t per_sample,
                     size_t header, st_error *err) {
  struct stat sb;
  if (stat(f->path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
  double need = (double)count * (double)per_sample;
  double room = !f->gzip ? (double)sb.st_size - (double)header
                         : 1032.0 * (double)sb.st_size;
  if (need <= room) return 0;
  return st_error_set(err, ST_EFORMAT,
                      "%s: the header counts %d %ss (%.0f bytes), more than "
                      "this %lld-byte %s can hold: a corrupt header or a "
                      "truncated file",
                      f->path, count, f->kind, need, (long long)sb.st_size,
                      !f->gzip ? "file" : "gzip file");
}

/* The file name without its directories, as the dataset's name. */
static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* Reads the n samples the dataset has room for; checks the trailers when the
 * whole file was asked for. Labels are bytes, so every label is a valid class
 * once classes = max label + 1 (<= 256 by construction). */
static int read_body(st_dataset *ds, idx_file *images, idx_file *labels,
                     int count, st_error *err) {
  size_t numel = st_shape_numel(ds->shape);
  int rc = idx_read(labels, ds->labels, (size_t)ds->n, "label bytes", err);
  if (!rc)
    rc =
        idx_read(images, ds->pixels, (size_t)ds->n * numel, "image bytes", err);
  if (!rc && ds->n == count) rc = idx_expect_end(labels, count, err);
  if (!rc && ds->n == count) rc = idx_expect_end(images, count, err);
  if (rc) return rc;
  int max_label = 0;
  for (int s = 0; s < ds->n; s++)
    if (ds->labels[s] > max_label) max_label = ds->labels[s];
  ds->classes = max_label + 1;
  return 0;
}

int st_dataset_load_idx(st_dataset **out, const char *images_gz,
                        const char *labels_gz, int limit, st_error *err) {
  *out = NULL;
  if (limit < 0)
    return st_error_set(err, ST_EARG, "%s: limit %d must be >= 0", images_gz,
                        limit);
  idx_file images = {.path = images_gz, .fd = -1},
           labels = {.path = labels_gz, .fd = -1};
  st_dataset *ds = NULL;
  int count = 0;
  st_shape shape;
  int rc = open_pair(&images, &labels, &count, &shape, err);
  if (rc) goto fail;
  int n = limit > 0 && limit < count ? limit : count;
  rc = fits_file(&labels, n, 1, 8, err);
  if (!rc) rc = fits_file(&images, n, st_shape_numel(shape), 16, err);
  if (rc) goto fail;
  rc = st_dataset_alloc(&ds, base_name(images_gz), n, shape, err);
  if (rc) goto fail;
  rc = read_body(ds, &images, &labels, count, err);
  if (rc) goto fail;
  snprintf(ds->labels_name, sizeof ds->labels_name, "%s", base_name(labels_gz));
  idx_close(&images);
  idx_close(&labels);
  st_dataset_compute_stats(ds);
  *out = ds;
  return 0;
fail:
  st_dataset_destroy(ds);
  idx_close(&images);
  idx_close(&labels);
  return rc;
}

int st_dataset_idx_count(const char *images_gz, const char *labels_gz,
                         int limit, int *n, st_shape *shape, st_error *err) {
  *n = 0;
  idx_file images = {.path = images_gz, .fd = -1},
           labels = {.path = labels_gz, .fd = -1};
  int count = 0;
  int rc = open_pair(&images, &labels, &count, shape, err);
  if (!rc) {
    *n = limit > 0 && limit < count ? limit : count;
    rc = fits_file(&labels, *n, 1, 8, err);
  }
  if (!rc) rc = fits_file(&images, *n, st_shape_numel(*shape), 16, err);
  idx_close(&images);
  idx_close(&labels);
  return rc;
}

/* ------------------------------------------------- the dataset life cycle */

size_t st_dataset_bytes(int n, st_shape shape) {
  size_t numel = st_shape_numel(shape);
  return st_alloc_counted(sizeof(st_dataset)) +
         st_alloc_counted((size_t)n * numel) + st_alloc_counted((size_t)n);
}

/* Creates a dataset with zeroed storage for n samples of `shape`; the
 * caller fills pixels and labels, sets classes, then computes the stats. */
int st_dataset_alloc(st_dataset **out, const char *name, int n, st_shape shape,
                     st_error *err) {
  *out = NULL;
  size_t numel = st_shape_numel(shape);
  if (n > 0 && numel > SIZE_MAX / (size_t)n)
    return st_error_set(err, ST_ENOMEM,
                        "%s: %d samples of %zu bytes do not fit in memory",
                        name, n, numel);
  st_dataset *ds = st_alloc(sizeof *ds);
  if (!ds) goto nomem;
  snprintf(ds->name, sizeof ds->name, "%s", name);
  ds->n = n;
  ds->shape = shape;
  ds->pixels = st_alloc((size_t)n * numel);
  ds->labels = st_alloc((size_t)n);
  if (!ds->pixels || !ds->labels) goto nomem;
  *out = ds;
  return 0;
nomem:
  st_dataset_destroy(ds);
  return st_error_set(err, ST_ENOMEM,
                      "%s: %d samples of %zu bytes: out of memory", name, n,
                      numel);
}

/* mean and std of all pixels scaled to [0, 1], over the population (as
 * torchvision's published 0.2860 / 0.3530 for Fashion-MNIST train). A
 * histogram of the 256 byte values makes the sums exact integers, so the
 * result does not depend on summation order. */
void st_dataset_compute_stats(st_dataset *ds) {
  uint64_t hist[256] = {0};
  size_t total = (size_t)ds->n * st_shape_numel(ds->shape);
  for (size_t i = 0; i < total; i++) hist[ds->pixels[i]]++;
  double sum = 0, mean, var = 0;
  for (int v = 0; v < 256; v++) sum += (double)hist[v] * v;
  mean = total ? sum / 255.0 / (double)total : 0;
  for (int v = 0; v < 256; v++) {
    double d = v / 255.0 - mean;
    var += (double)hist[v] * d * d;
  }
  var = total ? var / (double)total : 0;
  ds->mean = (float)mean;
  /* A constant dataset has no spread; 1 keeps normalisation finite. */
  ds->std = var > 1e-12 ? (float)sqrt(var) : 1.0f;
}

void st_dataset_destroy(st_dataset *ds) {
  if (!ds) return;
  st_free(ds->pixels);
  st_free(ds->labels);
  st_free(ds);
}

void st_dataset_batch(const st_dataset *ds, const int32_t *idx, int B,
                      int normalize, float *x, int *y) {
  /* Straight arithmetic rather than a 256-entry table: the same operations
   * per pixel (so the same values), but the loop vectorises where a table
   * lookup is a gather — it was 4% of an MLP step at batch 32. */
  size_t numel = st_shape_numel(ds->shape);
  const float mean = ds->mean, std = ds->std;
  for (int b = 0; b < B; b++) {
    assert(idx[b] >= 0 && idx[b] < ds->n);
    const uint8_t *restrict src = ds->pixels + (size_t)idx[b] * numel;
    float *restrict dst = x + (size_t)b * numel;
    if (normalize)
      for (size_t i = 0; i < numel; i++)
        dst[i] = ((float)src[i] / 255.0f - mean) / std;
    else
      for (size_t i = 0; i < numel; i++) dst[i] = (float)src[i] / 255.0f;
    y[b] = ds->labels[idx[b]];
  }
}
