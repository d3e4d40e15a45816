/*
 * test_data.c — the data module: the gzip IDX loader on the real
 * Fashion-MNIST files and on damaged copies of them, batch assembly and
 * normalisation, the per-epoch shuffle and the synthetic dataset.
 *
 * Reference values for the real files (sums, pixel rows, mean/std) were
 * computed independently with Python's gzip module over the same files
 * (/usr/share/datasets/fashion-mnist, Debian package dataset-fashion-mnist).
 * Damaged inputs are written to a private temporary folder removed at exit.
 */
#include "harness.h"
#include "strata.h"

#include <dirent.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define FM_DIR "/usr/share/datasets/fashion-mnist/"
#define TEST_IMAGES FM_DIR "t10k-images-idx3-ubyte.gz"
#define TEST_LABELS FM_DIR "t10k-labels-idx1-ubyte.gz"
#define TRAIN_IMAGES FM_DIR "train-images-idx3-ubyte.gz"
#define TRAIN_LABELS FM_DIR "train-labels-idx1-ubyte.gz"

/* mean/std are stored as float: 1e-6 covers the float rounding (~3e-8) of
 * values computed in double from exact integer histograms. */
#define STATS_TOL 1e-6

static char tmp_dir[64];

/* A path inside the temporary folder; a fresh static slot per call so a
 * test can hold a few at once. */
static const char *tmp_path(const char *name) {
  static char slots[8][320];
  static int next;
  char *p = slots[next++ % 8];
  snprintf(p, sizeof slots[0], "%s/%s", tmp_dir, name);
  return p;
}

static uint8_t *read_whole(const char *path, size_t *bytes) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
  *bytes = buf ? fread(buf, 1, (size_t)len, f) : 0;
  fclose(f);
  return buf;
}

static size_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

static void write_raw(const char *path, const void *data, size_t bytes) {
  FILE *f = fopen(path, "wb");
  if (f) {
    fwrite(data, 1, bytes, f);
    fclose(f);
  }
}

/* mode "wb" compresses; "wb0" writes stored (uncompressed) deflate blocks,
 * so a flipped byte in the middle changes one data byte and only the CRC in
 * the gzip trailer can tell. */
static void write_gz(const char *path, const char *mode, const void *data,
                     size_t bytes) {
  gzFile gz = gzopen(path, mode);
  if (gz) {
    if (bytes) gzwrite(gz, data, (unsigned)bytes);
    gzclose(gz);
  }
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* An IDX label file: magic 2049, count, then the labels. */
static void write_labels(const char *path, const char *mode, uint32_t magic,
                         uint32_t count, const uint8_t *labels, size_t n) {
  uint8_t buf[8 + 4096];
  put_be32(buf, magic);
  put_be32(buf + 4, count);
  memcpy(buf + 8, labels, n);
  write_gz(path, mode, buf, 8 + n);
}

/* An IDX image file: magic 2051, count, rows, cols, then the pixels. */
static void write_images(const char *path, const char *mode, uint32_t count,
                         uint32_t rows, uint32_t cols, const uint8_t *pixels,
                         size_t n) {
  uint8_t buf[16 + 4096];
  put_be32(buf, 2051);
  put_be32(buf + 4, count);
  put_be32(buf + 8, rows);
  put_be32(buf + 12, cols);
  memcpy(buf + 16, pixels, n);
  write_gz(path, mode, buf, 16 + n);
}

/* A failed load must return `code`, leave *out NULL and say which file and
 * what went wrong. */
static void check_failure(const char *what, int rc, const st_dataset *ds,
                          const st_error *err, int code, const char *path,
                          const char *cause) {
  CHECK(rc == code, "%s: rc %d, want %d (%s)", what, rc, code, err->msg);
  CHECK(ds == NULL, "%s: dataset returned on failure", what);
  CHECK(strstr(err->msg, path) != NULL, "%s: message lacks path %s: %s", what,
        path, err->msg);
  CHECK(strstr(err->msg, cause) != NULL, "%s: message lacks '%s': %s", what,
        cause, err->msg);
  CHECK(strchr(err->msg, '\n') == NULL, "%s: message is not one line", what);
  if (getenv("STRATA_TEST_VERBOSE"))
    fprintf(stderr, "  %-16s %s\n", what, err->msg);
}

static uint64_t pixel_sum(const uint8_t *p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += p[i];
  return sum;
}

static void test_load_test_set(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_load_idx(&ds, TEST_IMAGES, TEST_LABELS, 0, &err);
  CHECK(rc == 0 && ds, "load t10k: %s", err.msg);
  if (!ds) return;
  CHECK(ds->n == 10000, "t10k n = %d", ds->n);
  CHECK(ds->shape.c == 1 && ds->shape.h == 28 && ds->shape.w == 28,
        "t10k shape (%d, %d, %d)", ds->shape.c, ds->shape.h, ds->shape.w);
  CHECK(ds->classes == 10, "t10k classes = %d", ds->classes);
  CHECK(strcmp(ds->name, "t10k-images-idx3-ubyte.gz") == 0, "name %s",
        ds->name);
  /* The first test image is an ankle boot (class 9). */
  const uint8_t first_labels[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  CHECK(memcmp(ds->labels, first_labels, 10) == 0, "first labels differ");
  int per_class[256] = {0};
  for (int s = 0; s < ds->n; s++) per_class[ds->labels[s]]++;
  for (int c = 0; c < 10; c++)
    CHECK(per_class[c] == 1000, "class %d has %d samples", c, per_class[c]);
  const uint8_t row14[28] = {0,   0,   0,   0,   0,   0,   2,   4,   1,   0,
                             0,   0,   98,  136, 110, 109, 110, 162, 135, 144,
                             149, 159, 167, 144, 158, 169, 119, 0};
  CHECK(memcmp(ds->pixels + 14 * 28, row14, 28) == 0, "image 0 row 14");
  CHECK(pixel_sum(ds->pixels, 784) == 33456, "image 0 sum");
  CHECK(pixel_sum(ds->pixels + 9999 * 784, 784) == 24390, "image 9999 sum");
  CHECK(pixel_sum(ds->pixels, 7840000) == 573469082ull, "all pixels sum");
  CHECK(fabs(ds->mean - 0.28684928) < STATS_TOL, "t10k mean %.8f", ds->mean);
  CHECK(fabs(ds->std - 0.35244415) < STATS_TOL, "t10k std %.8f", ds->std);
  st_dataset_destroy(ds);
}

static void test_limit(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_load_idx(&ds, TEST_IMAGES, TEST_LABELS, 100, &err);
  CHECK(rc == 0 && ds && ds->n == 100, "limit 100: %s", err.msg);
  if (ds) {
    CHECK(pixel_sum(ds->pixels, 100 * 784) == 5854180, "first 100 sum");
    CHECK(ds->labels[0] == 9 && ds->labels[99] < 10, "limit labels");
    /* The stats describe what was loaded, not the whole file. */
    double mean = 5854180.0 / 255.0 / (100 * 784);
    CHECK(fabs(ds->mean - mean) < STATS_TOL, "limit mean %.8f, want %.8f",
          ds->mean, mean);
  }
  st_dataset_destroy(ds);
  ds = NULL;
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, TEST_LABELS, 20000, &err);
  CHECK(rc == 0 && ds && ds->n == 10000, "limit above count keeps all");
  st_dataset_destroy(ds);
  ds = NULL;
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, TEST_LABELS, -1, &err);
  CHECK(rc == ST_EARG && ds == NULL, "negative limit: rc %d", rc);
}

static void test_load_train_set(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_load_idx(&ds, TRAIN_IMAGES, TRAIN_LABELS, 0, &err);
  CHECK(rc == 0 && ds, "load train: %s", err.msg);
  if (!ds) return;
  CHECK(ds->n == 60000 && ds->classes == 10, "train n %d classes %d", ds->n,
        ds->classes);
  CHECK(ds->labels[0] == 9, "first train label %d", ds->labels[0]);
  CHECK(pixel_sum(ds->pixels, 784) == 76247, "train image 0 sum");
  CHECK(pixel_sum(ds->pixels, (size_t)60000 * 784) == 3431114169ull,
        "train pixels sum");
  CHECK(fabs(ds->mean - 0.28604060) < STATS_TOL, "train mean %.8f", ds->mean);
  CHECK(fabs(ds->std - 0.35302424) < STATS_TOL, "train std %.8f", ds->std);
  /* The published figures, rounded to four places. */
  CHECK(fabs(ds->mean - 0.2860) < 5e-5 && fabs(ds->std - 0.3530) < 5e-5,
        "train mean/std %.4f / %.4f", ds->mean, ds->std);
  st_dataset_destroy(ds);
}

/* Small IDX files written here: every field the loader reads is known. */
static void test_small_files(void) {
  const uint8_t labels[3] = {0, 4, 2};
  uint8_t pixels[3 * 2 * 3];
  for (int i = 0; i < 18; i++) pixels[i] = (uint8_t)(i * 15);
  const char *img = tmp_path("small-images.gz");
  const char *lab = tmp_path("small-labels.gz");
  write_images(img, "wb", 3, 2, 3, pixels, sizeof pixels);
  write_labels(lab, "wb", 2049, 3, labels, 3);
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_load_idx(&ds, img, lab, 0, &err);
  CHECK(rc == 0 && ds, "small files: %s", err.msg);
  if (ds) {
    CHECK(ds->n == 3 && ds->shape.c == 1 && ds->shape.h == 2 &&
              ds->shape.w == 3,
          "small shape");
    CHECK(ds->classes == 5, "classes = max label + 1, got %d", ds->classes);
    CHECK(memcmp(ds->pixels, pixels, 18) == 0, "small pixels");
    CHECK(memcmp(ds->labels, labels, 3) == 0, "small labels");
  }
  st_dataset_destroy(ds);
  /* gzopen reads an uncompressed file as is; the format checks still hold. */
  uint8_t raw[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 0, 4, 2};
  const char *plain = tmp_path("plain-labels");
  write_raw(plain, raw, sizeof raw);
  ds = NULL;
  rc = st_dataset_load_idx(&ds, img, plain, 0, &err);
  CHECK(rc == 0 && ds && ds->labels[1] == 4, "uncompressed labels: %s",
        err.msg);
  st_dataset_destroy(ds);
}

static void test_missing_files(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  const char *missing = tmp_path("missing-images.gz");
  int rc = st_dataset_load_idx(&ds, missing, TEST_LABELS, 0, &err);
  check_failure("missing images", rc, ds, &err, ST_EIO, missing,
                "cannot open: No such file or directory");
  const char *missing_labels = tmp_path("missing-labels.gz");
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, missing_labels, 0, &err);
  check_failure("missing labels", rc, ds, &err, ST_EIO, missing_labels,
                "cannot open");
  /* a FIFO no one writes is refused at once, not waited on (nor is any
   * other file that is not a regular one) */
  const char *fifo = tmp_path("fifo-labels.gz");
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, fifo, 0, &err);
  check_failure("a FIFO", rc, ds, &err, ST_EIO, fifo, "not a regular file");
  uint8_t *bytes = NULL;
  size_t n = 0;
  rc = st_file_read(&bytes, &n, fifo, &err);
  CHECK(rc == ST_EIO && strstr(err.msg, "not a regular file") && !bytes,
        "a FIFO read as a corpus: rc %d '%s'", rc, err.msg);
  unlink(fifo);
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, "/tmp", 0, &err);
  check_failure("a directory", rc, ds, &err, ST_EIO, "/tmp",
                "not a regular file");
}

/* Copies `src` to `dst` with `count` bytes flipped from offset `at`. */
static void write_flipped(const char *src, const char *dst, size_t at,
                          size_t count) {
  size_t bytes = 0;
  uint8_t *data = read_whole(src, &bytes);
  if (!data) return;
  for (size_t i = at; i < at + count && i < bytes; i++) data[i] ^= 0xff;
  write_raw(dst, data, bytes);
  free(data);
}

static void test_corrupt_gzip(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  const char *labels = tmp_path("corrupt-labels.gz");
  write_flipped(TEST_LABELS, labels, file_size(TEST_LABELS) / 2, 8);
  int rc = st_dataset_load_idx(&ds, TEST_IMAGES, labels, 0, &err);
  check_failure("corrupt labels", rc, ds, &err, ST_EFORMAT, labels,
                "corrupt gzip data");
  const char *images = tmp_path("corrupt-images.gz");
  write_flipped(TEST_IMAGES, images, file_size(TEST_IMAGES) / 2, 8);
  rc = st_dataset_load_idx(&ds, images, TEST_LABELS, 0, &err);
  check_failure("corrupt images", rc, ds, &err, ST_EFORMAT, images,
                "corrupt gzip data");
}

/* Damage that inflate cannot see: a stored (uncompressed) gzip whose data
 * byte changed. Only the CRC at the end of the stream catches it, so this
 * fails only if the loader reads through the trailer. */
static void test_crc_only_damage(void) {
  uint8_t labels[1000];
  for (int i = 0; i < 1000; i++) labels[i] = (uint8_t)(i % 10);
  uint8_t pixels[1000];
  memset(pixels, 7, sizeof pixels);
  const char *img = tmp_path("crc-images.gz");
  const char *good = tmp_path("crc-labels-good.gz");
  const char *bad = tmp_path("crc-labels-bad.gz");
  write_images(img, "wb", 1000, 1, 1, pixels, sizeof pixels);
  write_labels(good, "wb0", 2049, 1000, labels, sizeof labels);
  size_t bytes = 0;
  uint8_t *data = read_whole(good, &bytes);
  if (data) {
    data[bytes / 2] ^= 0x01; /* a label 0..9 becomes another valid one */
    write_raw(bad, data, bytes);
    free(data);
  }
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_load_idx(&ds, img, good, 0, &err);
  CHECK(rc == 0 && ds, "stored gzip loads: %s", err.msg);
  st_dataset_destroy(ds);
  ds = NULL;
  rc = st_dataset_load_idx(&ds, img, bad, 0, &err);
  check_failure("crc mismatch", rc, ds, &err, ST_EFORMAT, bad,
                "corrupt gzip data: incorrect data check");
  st_dataset_destroy(ds);
}

/* Writes the first `keep` bytes of src (or all but the last `drop`). */
static void write_prefix(const char *src, const char *dst, size_t keep,
                         size_t drop) {
  size_t bytes = 0;
  uint8_t *data = read_whole(src, &bytes);
  if (!data) return;
  size_t n = keep ? keep : bytes - drop;
  write_raw(dst, data, n < bytes ? n : bytes);
  free(data);
}

static void test_truncated(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  const char *images = tmp_path("half-images.gz");
  write_prefix(TEST_IMAGES, images, file_size(TEST_IMAGES) / 2, 0);
  int rc = st_dataset_load_idx(&ds, images, TEST_LABELS, 0, &err);
  check_failure("half images", rc, ds, &err, ST_EFORMAT, images,
                "truncated: expected 7840000 image bytes, got ");
  /* A limit reads only the samples it keeps, and those are all there. */
  rc = st_dataset_load_idx(&ds, images, TEST_LABELS, 100, &err);
  CHECK(rc == 0 && ds && ds->n == 100 &&
            pixel_sum(ds->pixels, 100 * 784) == 5854180,
        "limit 100 of a half file: %s", err.msg);
  st_dataset_destroy(ds);
  ds = NULL;
  const char *labels = tmp_path("half-labels.gz");
  write_prefix(TEST_LABELS, labels, file_size(TEST_LABELS) / 2, 0);
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, labels, 0, &err);
  check_failure("half labels", rc, ds, &err, ST_EFORMAT, labels,
                "truncated: expected 10000 label bytes");
  /* All data present, the 8-byte gzip trailer (CRC, length) cut off. */
  const char *no_trailer = tmp_path("no-trailer-labels.gz");
  write_prefix(TEST_LABELS, no_trailer, 0, 8);
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, no_trailer, 0, &err);
  check_failure("no trailer", rc, ds, &err, ST_EFORMAT, no_trailer,
                "truncated");
  const char *empty = tmp_path("empty-labels.gz");
  write_gz(empty, "wb", "", 0);
  rc = st_dataset_load_idx(&ds, TEST_IMAGES, empty, 0, &err);
  check_failure("empty", rc, ds, &err, ST_EFORMAT, empty,
                "truncated: expected 4 header bytes, got 0");
  /* A count the file cannot hold is refused before anything is allocated:
   * 20 million labels in a gzip file of a few dozen bytes (deflate expands
   * at most 1032:1), 5 labels in a plain file of 3. */
  const uint8_t three[3] = {0, 1, 2};
  const char *huge = tmp_path("huge-count-labels.gz");
  write_labels(huge, "wb", 2049, 20000000, three, 3);
  uint8_t px[3] = {0};
  const char *imgs = tmp_path("huge-count-images.gz");
  write_images(imgs, "wb", 20000000, 1, 1, px, 3);
  rc = st_dataset_load_idx(&ds, imgs, huge, 0, &err);
  check_failure("a count past the gzip file", rc, ds, &err, ST_EFORMAT, huge,
                "the header counts 20000000 labels (20000000 bytes), more "
                "than this");
  uint8_t raw[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 5, 0, 1, 2};
  const char *plain = tmp_path("plain-five-labels");
  write_raw(plain, raw, sizeof raw);
  const char *five = tmp_path("five-images.gz");
  uint8_t px5[5] = {0};
  write_images(five, "wb", 5, 1, 1, px5, 5);
  rc = st_dataset_load_idx(&ds, five, plain, 0, &err);
  check_failure("a count past the plain file", rc, ds, &err, ST_EFORMAT, plain,
                "the header counts 5 labels (5 bytes), more than this 11-byte "
                "file can hold");
}

/* The gzip trailer on a file larger than the reader's buffer: zlib's gzread
 * ended quietly when input ran out at a buffer's edge, so the 4.4 MB test
 * images with 1, 4 or 8 trailer bytes cut loaded with no CRC check (the
 * small label file above was caught). */
static void test_trailer_of_large_file(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  const size_t cuts[] = {1, 4, 8};
  for (int i = 0; i < 3; i++) {
    char name[64];
    snprintf(name, sizeof name, "cut%zu-images.gz", cuts[i]);
    const char *cut = tmp_path(name);
    write_prefix(TEST_IMAGES, cut, 0, cuts[i]);
    int rc = st_dataset_load_idx(&ds, cut, TEST_LABELS, 0, &err);
    check_failure("large file, trailer cut", rc, ds, &err, ST_EFORMAT, cut,
                  "truncated: gzip trailer missing after 10000 images");
  }
  /* Damage inflate cannot see, in a stored gzip larger than the buffer,
   * with the trailer that would catch it cut off. */
  enum { N = 300000 };
  uint8_t *pixels = malloc(N), *labels = malloc(N);
  size_t bytes = 16 + (size_t)N;
  uint8_t *raw = malloc(bytes);
  if (!pixels || !labels || !raw) {
    CHECK(0, "out of memory");
    free(pixels), free(labels), free(raw);
    return;
  }
  for (int j = 0; j < N; j++) pixels[j] = (uint8_t)(j * 7), labels[j] = 1;
  put_be32(raw, 2051), put_be32(raw + 4, N), put_be32(raw + 8, 1);
  put_be32(raw + 12, 1);
  memcpy(raw + 16, pixels, N);
  const char *img = tmp_path("stored-images.gz");
  write_gz(img, "wb0", raw, bytes);
  memcpy(raw + 8, labels, N);
  put_be32(raw, 2049), put_be32(raw + 4, N);
  const char *lab = tmp_path("stored-labels.gz");
  write_gz(lab, "wb", raw, 8 + (size_t)N);
  int rc = st_dataset_load_idx(&ds, img, lab, 0, &err);
  CHECK(rc == 0 && ds && memcmp(ds->pixels, pixels, N) == 0,
        "stored gzip of 300000 images loads: %s", err.msg);
  st_dataset_destroy(ds);
  ds = NULL;
  size_t size = 0;
  uint8_t *file = read_whole(img, &size);
  if (file) {
    file[size / 2] ^= 0x01;
    const char *bad = tmp_path("stored-flipped-cut-images.gz");
    write_raw(bad, file, size - 8);
    rc = st_dataset_load_idx(&ds, bad, lab, 0, &err);
    check_failure("stored, flipped, trailer cut", rc, ds, &err, ST_EFORMAT, bad,
                  "truncated: gzip trailer missing after 300000 images");
    free(file);
  }
  free(pixels), free(labels), free(raw);
}

/* gzip members: a file of two loads as their concatenation (as gzip -d
 * reads it); bytes after the last member that are not one are refused with
 * their offset, as is damage inside the deflate data. */
static void test_gzip_members(void) {
  size_t bytes = 0;
  uint8_t *whole = read_whole(TEST_LABELS, &bytes);
  if (!whole) {
    CHECK(0, "cannot read %s", TEST_LABELS);
    return;
  }
  uint8_t *plain = NULL;
  size_t n = 0;
  gzFile gz = gzopen(TEST_LABELS, "rb");
  if (gz) {
    plain = malloc(8 + 10000 + 1);
    n = plain ? (size_t)gzread(gz, plain, 8 + 10000 + 1) : 0;
    gzclose(gz);
  }
  CHECK(n == 8 + 10000, "t10k labels decompress to %zu bytes", n);
  if (n != 8 + 10000) {
    free(whole), free(plain);
    return;
  }
  const char *a = tmp_path("member-a.gz"), *b = tmp_path("member-b.gz");
  write_gz(a, "wb", plain, 5000);
  write_gz(b, "wb", plain + 5000, n - 5000);
  size_t na = 0, nb = 0;
  uint8_t *da = read_whole(a, &na), *db = read_whole(b, &nb);
  uint8_t *two = da && db ? malloc(na + nb + 3) : NULL;
  if (two) {
    memcpy(two, da, na);
    memcpy(two + na, db, nb);
    const char *joined = tmp_path("two-members-labels.gz");
    write_raw(joined, two, na + nb);
    st_dataset *ds = NULL;
    st_error err = {0};
    int rc = st_dataset_load_idx(&ds, TEST_IMAGES, joined, 0, &err);
    CHECK(rc == 0 && ds && memcmp(ds->labels, plain + 8, 10000) == 0,
          "two gzip members load as one: %s", err.msg);
    st_dataset_destroy(ds);
    ds = NULL;
    memcpy(two + na + nb, "\n\0x", 3);
    const char *junk = tmp_path("junk-after-labels.gz");
    write_raw(junk, two, na + nb + 3);
    rc = st_dataset_load_idx(&ds, TEST_IMAGES, junk, 0, &err);
    char want[96];
    snprintf(want, sizeof want,
             "3 bytes after the gzip stream's end at byte %zu are not gzip "
             "data",
             na + nb);
    check_failure("bytes after the stream", rc, ds, &err, ST_EFORMAT, junk,
                  want);
  }
  free(two), free(da), free(db), free(whole), free(plain);
  /* a deflate error names where in the file it was found */
  const char *flipped = tmp_path("flipped-at-labels.gz");
  write_flipped(TEST_LABELS, flipped, 100, 8);
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_load_idx(&ds, TEST_IMAGES, flipped, 0, &err);
  check_failure("corrupt deflate data", rc, ds, &err, ST_EFORMAT, flipped,
                "corrupt gzip data: ");
  CHECK(strstr(err.msg, "(at byte ") != NULL, "no offset: %s", err.msg);
}

static void test_wrong_content(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  const char *text = tmp_path("text.gz");
  const char hello[] = "hello, this is not an IDX file\n";
  write_gz(text, "wb", hello, sizeof hello - 1);
  int rc = st_dataset_load_idx(&ds, text, TEST_LABELS, 0, &err);
  check_failure("wrong magic", rc, ds, &err, ST_EFORMAT, text,
                "not a gzip IDX image file (magic 0x68656c6c, expected 2051)");
  rc = st_dataset_load_idx(&ds, TEST_LABELS, TEST_IMAGES, 0, &err);
  check_failure("swapped files", rc, ds, &err, ST_EFORMAT, TEST_IMAGES,
                "this is an image file");
  rc = st_dataset_load_idx(&ds, TRAIN_IMAGES, TEST_LABELS, 0, &err);
  check_failure("count mismatch", rc, ds, &err, ST_EDATA, TRAIN_IMAGES,
                "60000 images but " TEST_LABELS " has 10000 labels");
  uint8_t pixels[28] = {0};
  const char *flat = tmp_path("zero-rows.gz");
  write_images(flat, "wb", 1, 0, 28, pixels, 0);
  const uint8_t one_label[1] = {3};
  const char *one = tmp_path("one-label.gz");
  write_labels(one, "wb", 2049, 1, one_label, 1);
  rc = st_dataset_load_idx(&ds, flat, one, 0, &err);
  check_failure("zero rows", rc, ds, &err, ST_EFORMAT, flat,
                "image size 0x28 out of range");
  const char *none = tmp_path("no-labels.gz");
  write_labels(none, "wb", 2049, 0, one_label, 0);
  rc = st_dataset_load_idx(&ds, flat, none, 0, &err);
  check_failure("zero count", rc, ds, &err, ST_EDATA, none,
                "sample count 0 out of range");
  const uint8_t four[4] = {1, 2, 3, 4};
  const char *extra = tmp_path("extra-labels.gz");
  write_labels(extra, "wb", 2049, 3, four, 4);
  uint8_t three[3] = {0};
  const char *img = tmp_path("three-images.gz");
  write_images(img, "wb", 3, 1, 1, three, 3);
  rc = st_dataset_load_idx(&ds, img, extra, 0, &err);
  check_failure("trailing data", rc, ds, &err, ST_EFORMAT, extra,
                "trailing data after 3 labels: 1 byte more");
  const char *extra_images = tmp_path("extra-images.gz");
  write_images(extra_images, "wb", 3, 1, 1, four, 4);
  const char *three_labels = tmp_path("three-labels.gz");
  write_labels(three_labels, "wb", 2049, 3, three, 3);
  rc = st_dataset_load_idx(&ds, extra_images, three_labels, 0, &err);
  check_failure("trailing images", rc, ds, &err, ST_EFORMAT, extra_images,
                "trailing data after 3 images: 1 byte more");
}

static int is_permutation(const int32_t *perm, int n) {
  char *seen = calloc((size_t)n + 1, 1);
  int ok = seen != NULL;
  for (int i = 0; ok && i < n; i++) {
    ok = perm[i] >= 0 && perm[i] < n && !seen[perm[i]];
    if (ok) seen[perm[i]] = 1;
  }
  free(seen);
  return ok;
}

static void test_shuffle(void) {
  enum { N = 1000 };
  static int32_t a[N], b[N], c[N], d[N];
  uint64_t allocs = st_alloc_count();
  st_shuffle(a, N, 42, 0);
  st_shuffle(b, N, 42, 0);
  st_shuffle(c, N, 42, 1);
  st_shuffle(d, N, 43, 0);
  CHECK(st_alloc_count() == allocs, "st_shuffle allocated");
  CHECK(is_permutation(a, N), "shuffle is a permutation of [0, n)");
  CHECK(memcmp(a, b, sizeof a) == 0, "same (seed, epoch), same order");
  CHECK(memcmp(a, c, sizeof a) != 0, "another epoch, another order");
  CHECK(memcmp(a, d, sizeof a) != 0, "another seed, another order");
  int fixed = 0;
  for (int i = 0; i < N; i++) fixed += a[i] == i;
  /* A uniform permutation has 1 fixed point on average; 10 is p < 1e-7. */
  CHECK(fixed < 10, "shuffle left %d of %d in place", fixed, N);
  int32_t one = -1;
  st_shuffle(&one, 1, 42, 0);
  CHECK(one == 0, "n = 1");
  st_shuffle(NULL, 0, 42, 0); /* n = 0 touches nothing */
  /* All 24 orders of 4 items over 24000 epochs: 1000 expected each, binomial
   * std ~31, so [850, 1150] is a ~5-sigma band. A Fisher-Yates off by one
   * (drawing j < i) only yields the 6 cyclic orders and fails here. */
  int counts[4 * 4 * 4 * 4] = {0};
  for (int64_t epoch = 0; epoch < 24000; epoch++) {
    int32_t p[4];
    st_shuffle(p, 4, 7, epoch);
    counts[((p[0] * 4 + p[1]) * 4 + p[2]) * 4 + p[3]]++;
  }
  int orders = 0, low = 24000, high = 0;
  for (int k = 0; k < 256; k++) {
    if (!counts[k]) continue;
    orders++;
    if (counts[k] < low) low = counts[k];
    if (counts[k] > high) high = counts[k];
  }
  CHECK(orders == 24 && low >= 850 && high <= 1150,
        "shuffle of 4: %d orders, counts %d..%d", orders, low, high);
}

static void test_batch(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_synthetic(&ds, 50, (st_shape){3, 4, 5}, 7, 1, &err);
  CHECK(rc == 0 && ds, "synthetic for batch: %s", err.msg);
  if (!ds) return;
  enum { B = 3, NUMEL = 60 };
  const int32_t idx[B] = {17, 0, 49};
  float x[B * NUMEL], xn[B * NUMEL], want[B * NUMEL], wantn[B * NUMEL];
  int y[B] = {-1, -1, -1};
  uint64_t allocs = st_alloc_count();
  st_dataset_batch(ds, idx, B, 0, x, y);
  st_dataset_batch(ds, idx, B, 1, xn, y);
  CHECK(st_alloc_count() == allocs, "st_dataset_batch allocated");
  for (int b = 0; b < B; b++) {
    CHECK(y[b] == ds->labels[idx[b]], "label of batch row %d", b);
    for (int i = 0; i < NUMEL; i++) {
      double p = ds->pixels[(size_t)idx[b] * NUMEL + i] / 255.0;
      want[b * NUMEL + i] = (float)p;
      wantn[b * NUMEL + i] = (float)((p - ds->mean) / ds->std);
    }
  }
  /* pixel/255 in float is the double value rounded: 1 ulp relative. */
  CHECK_CLOSE("batch pixel/255", x, want, B * NUMEL, 1.2e-7, 1e-3);
  /* pixel/255 - mean cancels, so the float error is absolute, not relative:
   * ~6e-8 from each operand over std ~0.3 gives ~3e-7; floor 1 makes the
   * comparison absolute for these values of order 1. */
  CHECK_CLOSE("batch (pixel/255 - mean)/std", xn, wantn, B * NUMEL, 1e-6, 1.0);
  st_dataset_destroy(ds);
}

/* Normalised with its own statistics, a whole dataset has mean 0 and std 1. */
static void test_batch_standardises(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_load_idx(&ds, TEST_IMAGES, TEST_LABELS, 0, &err);
  if (rc || !ds) return;
  size_t numel = st_shape_numel(ds->shape);
  float *x = malloc(sizeof(float) * numel * 1000);
  int32_t *idx = malloc(sizeof(int32_t) * 1000);
  int *y = malloc(sizeof(int) * 1000);
  double sum = 0, sq = 0;
  for (int start = 0; x && idx && y && start < ds->n; start += 1000) {
    for (int b = 0; b < 1000; b++) idx[b] = start + b;
    st_dataset_batch(ds, idx, 1000, 1, x, y);
    for (size_t i = 0; i < numel * 1000; i++) {
      sum += x[i];
      sq += (double)x[i] * x[i];
    }
  }
  double count = (double)ds->n * (double)numel;
  double mean = sum / count, std = sqrt(sq / count - mean * mean);
  /* Only float rounding of mean, std and each value separates these from
   * 0 and 1: 1e-5 is ~100x that. */
  CHECK(fabs(mean) < 1e-5 && fabs(std - 1) < 1e-5,
        "normalised t10k mean %.3g std %.6f", mean, std);
  free(x);
  free(idx);
  free(y);
  st_dataset_destroy(ds);
}

/* Nearest class centroid, fitted on the first half, scored on the second. */
static double centroid_accuracy(const st_dataset *ds) {
  size_t numel = st_shape_numel(ds->shape);
  double *centroid = calloc((size_t)ds->classes * numel, sizeof(double));
  int *count = calloc((size_t)ds->classes, sizeof(int));
  int half = ds->n / 2, right = 0;
  if (!centroid || !count) goto done;
  for (int s = 0; s < half; s++) {
    count[ds->labels[s]]++;
    for (size_t i = 0; i < numel; i++)
      centroid[ds->labels[s] * numel + i] += ds->pixels[s * numel + i];
  }
  for (int c = 0; c < ds->classes; c++)
    for (size_t i = 0; i < numel; i++)
      centroid[c * numel + i] /= count[c] ? count[c] : 1;
  for (int s = half; s < ds->n; s++) {
    int best = -1;
    double best_d = INFINITY;
    for (int c = 0; c < ds->classes; c++) {
      double d = 0;
      for (size_t i = 0; i < numel; i++) {
        double e = ds->pixels[s * numel + i] - centroid[c * numel + i];
        d += e * e;
      }
      if (d < best_d) best_d = d, best = c;
    }
    right += best == ds->labels[s];
  }
done:
  free(centroid);
  free(count);
  return (double)right / (ds->n - half);
}

static void test_synthetic(void) {
  st_shape shape = {1, 8, 8};
  st_dataset *a = NULL, *b = NULL, *c = NULL, *small = NULL;
  st_error err = {0};
  int rc = st_dataset_synthetic(&a, 2000, shape, 10, 5, &err);
  CHECK(rc == 0 && a, "synthetic: %s", err.msg);
  st_dataset_synthetic(&b, 2000, shape, 10, 5, &err);
  st_dataset_synthetic(&c, 2000, shape, 10, 6, &err);
  st_dataset_synthetic(&small, 5, shape, 10, 5, &err);
  if (!a || !b || !c || !small) goto done;
  CHECK(a->n == 2000 && a->classes == 10 && a->shape.h == 8, "synthetic dims");
  CHECK(memcmp(a->pixels, b->pixels, 2000 * 64) == 0 &&
            memcmp(a->labels, b->labels, 2000) == 0,
        "same seed, same data");
  CHECK(memcmp(a->pixels, c->pixels, 2000 * 64) != 0, "another seed differs");
  CHECK(memcmp(a->pixels, small->pixels, 5 * 64) == 0,
        "sample s does not depend on n");
  int balanced = 1;
  for (int s = 0; s < a->n; s++) balanced &= a->labels[s] == s % 10;
  CHECK(balanced, "labels are s %% classes");
  /* Stats recomputed the plain two-pass way, not from a histogram. */
  double sum = 0, sq = 0, total = 2000.0 * 64;
  for (int i = 0; i < 2000 * 64; i++) sum += a->pixels[i] / 255.0;
  double mean = sum / total;
  for (int i = 0; i < 2000 * 64; i++) {
    double d = a->pixels[i] / 255.0 - mean;
    sq += d * d;
  }
  CHECK(fabs(a->mean - mean) < STATS_TOL &&
            fabs(a->std - sqrt(sq / total)) < STATS_TOL,
        "synthetic mean/std %.6f/%.6f, want %.6f/%.6f", a->mean, a->std, mean,
        sqrt(sq / total));
  /* Learnable: with 64 pixels of prototype spread ~104 against noise ~52 the
   * classes are far apart; chance would be 0.1. */
  double acc = centroid_accuracy(a);
  CHECK(acc > 0.9, "nearest-centroid accuracy %.3f", acc);
done:
  st_dataset_destroy(a);
  st_dataset_destroy(b);
  st_dataset_destroy(c);
  st_dataset_destroy(small);
}

static void test_synthetic_errors(void) {
  st_dataset *ds = NULL;
  st_error err = {0};
  int rc = st_dataset_synthetic(&ds, 0, (st_shape){1, 2, 2}, 3, 1, &err);
  CHECK(rc == ST_EARG && !ds && strstr(err.msg, "n = 0"), "n = 0: %s", err.msg);
  rc = st_dataset_synthetic(&ds, 10, (st_shape){1, 2, 2}, 257, 1, &err);
  CHECK(rc == ST_EARG && !ds && strstr(err.msg, "classes = 257"),
        "classes = 257: %s", err.msg);
  rc = st_dataset_synthetic(&ds, 10, (st_shape){1, 0, 2}, 3, 1, &err);
  CHECK(rc == ST_EARG && !ds && strstr(err.msg, "shape (1, 0, 2)"),
        "empty shape: %s", err.msg);
}

/* Removes the files this program wrote, then its folder. */
static void remove_tmp_dir(void) {
  DIR *dir = opendir(tmp_dir);
  if (dir) {
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
        unlink(tmp_path(e->d_name));
    closedir(dir);
  }
  if (rmdir(tmp_dir) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
}

/* A range of a synthetic problem is exactly those samples of the whole
 * problem: same prototypes, same pixels, same labels. This is how the
 * trainer holds out its synthetic test set. */
static void test_synthetic_range(void) {
  st_error err = {0};
  st_dataset *all = NULL, *tail = NULL;
  st_shape shape = {1, 6, 6};
  int rc = st_dataset_synthetic(&all, 300, shape, 7, 11, &err);
  if (!rc) rc = st_dataset_synthetic_range(&tail, 200, 100, shape, 7, 11, &err);
  CHECK(rc == 0, "synthetic range: %s", err.msg);
  if (!rc) {
    size_t numel = st_shape_numel(shape);
    CHECK(memcmp(tail->pixels, all->pixels + 200 * numel, 100 * numel) == 0 &&
              memcmp(tail->labels, all->labels + 200, 100) == 0,
          "samples [200, 300) differ between the range and the whole set");
  }
  st_dataset_destroy(all);
  st_dataset_destroy(tail);
}

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/strata-test-data-XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_load_test_set();
  test_limit();
  test_load_train_set();
  test_small_files();
  test_missing_files();
  test_corrupt_gzip();
  test_crc_only_damage();
  test_truncated();
  test_trailer_of_large_file();
  test_gzip_members();
  test_wrong_content();
  test_shuffle();
  test_batch();
  test_batch_standardises();
  test_synthetic();
  test_synthetic_errors();
  test_synthetic_range();
  remove_tmp_dir();
  TH_DONE();
}
