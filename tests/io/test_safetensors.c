/*
 * test_safetensors.c — src/io/safetensors.c, checkpoint.c and inspect.c:
 *   - round trip through st_st_writer and st_safetensors_read (F32 and I32,
 *     0-d to 4-d, a zero-size tensor, metadata), and the raw layout the
 *     specification fixes (little-endian u64 header length, JSON header,
 *     data section; strata pads the header to a multiple of 8);
 *   - every way a file can be malformed or cut short is refused with a
 *     negative code and a message naming the file and the cause (SQLite's
 *     habit: failure paths are tested like success paths);
 *   - atomic writes: a failed write leaves nothing behind (and an old file
 *     byte for byte, even failing after its first tensor went out), a
 *     successful one leaves no temp file, an overwrite replaces the file
 *     whole;
 *   - checkpoints: weights, optimizer slots and training position survive a
 *     round trip bit for bit; the wrong optimizer or a differently shaped
 *     model is refused naming the key or tensor;
 *   - st_inspect prints each tensor's shape and statistics.
 * Files go to a fresh directory under /tmp, removed at the end. Run it under
 * ASan (make test-asan) to prove the error paths free what they allocate.
 */
#include "harness.h"
#include "strata.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char dir[256]; /* the scratch directory */

/* dir/name in one of a few rotating buffers, so two fit in one call. */
static const char *in_dir(const char *name) {
  static char ring[4][512];
  static int next;
  char *p = ring[next++ & 3];
  snprintf(p, sizeof ring[0], "%s/%s", dir, name);
  return p;
}

static int contains(const char *hay, const char *needle) {
  return strstr(hay, needle) != NULL;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n) {
    fprintf(stderr, "test_safetensors: cannot write %s\n", path);
    exit(2);
  }
  fclose(f);
}

/* The whole file; NULL if it cannot be read. Caller frees. */
static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(size > 0 ? (size_t)size : 1);
  *n = fread(buf, 1, (size_t)size, f);
  fclose(f);
  return buf;
}

static long file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* A hand-made safetensors file: 8-byte little-endian length, the header
 * text as given, then `data_bytes` bytes of data (0, 1, 2, ...). */
static void write_handmade(const char *path, const char *header,
                           size_t data_bytes) {
  size_t hlen = strlen(header), total = 8 + hlen + data_bytes;
  uint8_t *img = malloc(total);
  for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  memcpy(img + 8, header, hlen);
  for (size_t i = 0; i < data_bytes; i++) img[8 + hlen + i] = (uint8_t)i;
  write_bytes(path, img, total);
  free(img);
}

/* Names of files in dir containing ".tmp." (left-over temp files). */
static int count_temp_files(const char *where) {
  DIR *d = opendir(where);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

/* ------------------------------------------------------------ round trip */

/* The tensors of the round-trip file, in the order they are added. */
static float t4[2 * 3 * 1 * 2];
static float scalar = -1.25f;
static int32_t ints[5] = {-2, 0, 7, INT32_MAX, INT32_MIN};
static float nothing[1];

static const struct {
  const char *name, *dtype;
  int ndim;
  int64_t dims[4];
  const void *data;
  size_t bytes;
} rt[] = {
    {"blocks.0.conv0.weight", "F32", 4, {2, 3, 1, 2}, t4, sizeof t4},
    {"scalar", "F32", 0, {0}, &scalar, 4},
    {"ints", "I32", 1, {5}, ints, sizeof ints},
    {"empty", "F32", 2, {0, 5}, nothing, 0},
};
#define N_RT (int)(sizeof rt / sizeof rt[0])
/* commas, colons, braces and spaces inside a string must not confuse the
 * header parser */
static const char *meta_note = "lr: 0.1, {tricky} [value]";

static int write_roundtrip_file(const char *path) {
  for (int i = 0; i < 12; i++) t4[i] = 0.5f * (float)i - 3.0f;
  st_st_writer *w = st_st_writer_create();
  st_error err = {0};
  int rc = w ? 0 : ST_ENOMEM;
  for (int i = 0; i < N_RT && !rc; i++)
    rc = st_st_writer_add(w, rt[i].name, rt[i].dtype, rt[i].ndim, rt[i].dims,
                          rt[i].data, &err);
  if (!rc) rc = st_st_writer_meta(w, "format", "test", &err);
  if (!rc) rc = st_st_writer_meta(w, "note", meta_note, &err);
  if (!rc) rc = st_st_writer_write(w, path, &err);
  CHECK(rc == 0, "round trip: write %s: %s", path, err.msg);
  st_st_writer_destroy(w);
  return rc;
}

static void test_roundtrip(void) {
  const char *path = in_dir("rt.safetensors");
  if (write_roundtrip_file(path)) return;
  st_safetensors *st = NULL;
  st_error err = {0};
  int rc = st_safetensors_read(&st, path, &err);
  CHECK(rc == 0 && st, "round trip: read: %s", err.msg);
  if (rc) return;
  CHECK(st->n_tensors == N_RT, "round trip: %d tensors, want %d", st->n_tensors,
        N_RT);
  size_t total = 0;
  for (int i = 0; i < N_RT; i++) {
    const st_st_tensor *t = st_safetensors_find(st, rt[i].name);
    CHECK(t != NULL, "round trip: tensor %s missing", rt[i].name);
    if (!t) continue;
    int dims_ok = t->ndim == rt[i].ndim;
    for (int d = 0; dims_ok && d < rt[i].ndim; d++)
      dims_ok = t->dims[d] == rt[i].dims[d];
    CHECK(strcmp(t->dtype, rt[i].dtype) == 0 && dims_ok,
          "round trip: %s came back as %s with %d dims", rt[i].name, t->dtype,
          t->ndim);
    CHECK(t->end - t->begin == rt[i].bytes && t->end <= st->data_bytes,
          "round trip: %s spans [%zu, %zu), want %zu bytes", rt[i].name,
          t->begin, t->end, rt[i].bytes);
    CHECK(rt[i].bytes == 0 ||
              memcmp(st->data + t->begin, rt[i].data, rt[i].bytes) == 0,
          "round trip: %s bytes differ", rt[i].name);
    total += rt[i].bytes;
  }
  CHECK(st_safetensors_find(st, "nope") == NULL,
        "round trip: found a tensor that was never written");
  CHECK(st->data_bytes == total, "round trip: data section %zu bytes, want %zu",
        st->data_bytes, total);
  const char *fmt = st_safetensors_meta(st, "format");
  const char *note = st_safetensors_meta(st, "note");
  CHECK(st->n_meta == 2 && fmt && strcmp(fmt, "test") == 0 && note &&
            strcmp(note, meta_note) == 0,
        "round trip: metadata came back as %d entries, note '%s'", st->n_meta,
        note ? note : "(missing)");
  CHECK(st_safetensors_meta(st, "absent") == NULL,
        "round trip: found metadata that was never written");
  CHECK(strcmp(st->path, path) == 0, "round trip: st->path is %s", st->path);

  /* The raw layout: u64 little-endian header length N, N bytes of JSON
   * padded to a multiple of 8 (data 8-byte aligned), then exactly the data,
   * each tensor at data start + begin. */
  size_t n = 0;
  uint8_t *raw = slurp(path, &n);
  CHECK(raw && n >= 8, "round trip: cannot read back %s", path);
  if (raw && n >= 8) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
    CHECK(hlen % 8 == 0, "round trip: header length %llu not a multiple of 8",
          (unsigned long long)hlen);
    CHECK(8 + hlen + total == n, "round trip: 8 + %llu + %zu != file size %zu",
          (unsigned long long)hlen, total, n);
    CHECK(hlen > 0 && raw[8] == '{',
          "round trip: header does not start with {");
    size_t last = 8 + hlen - 1;
    while (last > 8 && raw[last] == ' ') last--;
    CHECK(raw[last] == '}', "round trip: header ends in '%c', not '}'",
          raw[last]);
    for (int i = 0; i < N_RT && 8 + hlen + total == n; i++) {
      const st_st_tensor *t = st_safetensors_find(st, rt[i].name);
      CHECK(t && (rt[i].bytes == 0 || memcmp(raw + 8 + hlen + t->begin,
                                             rt[i].data, rt[i].bytes) == 0),
            "round trip: %s is not at data start + begin in the file",
            rt[i].name);
    }
  }
  free(raw);
  st_safetensors_destroy(st);
  st_safetensors_destroy(NULL); /* accepted, as every destroy */
}

/* ------------------------------------------------------------ malformed */

/* Reads path expecting failure: negative code (want_code unless 0), *out
 * left NULL, message naming the file and containing each keyword. */
static void expect_fail(const char *what, const char *path, int want_code,
                        const char *kw1, const char *kw2) {
  st_safetensors *st = (st_safetensors *)&st; /* must be reset to NULL */
  st_error err = {0};
  int rc = st_safetensors_read(&st, path, &err);
  CHECK(rc < 0 && (!want_code || rc == want_code), "%s: rc %d, want %d (%s)",
        what, rc, want_code, err.msg);
  CHECK(st == NULL, "%s: *out not NULL after failure", what);
  CHECK(err.code == rc, "%s: err.code %d != rc %d", what, err.code, rc);
  CHECK(contains(err.msg, path), "%s: message does not name %s: %s", what, path,
        err.msg);
  CHECK(!kw1 || contains(err.msg, kw1), "%s: message lacks '%s': %s", what, kw1,
        err.msg);
  CHECK(!kw2 || contains(err.msg, kw2), "%s: message lacks '%s': %s", what, kw2,
        err.msg);
  if (getenv("STRATA_TEST_VERBOSE"))
    fprintf(stderr, "  %-36s %s\n", what, err.msg);
  if (rc == 0) st_safetensors_destroy(st);
}

/* ------------------------------------------------------------ CRC-32 */

/* Flips bit `bit` of the data section's byte `at` of the file at path. */
static void flip_data_bit(const char *path, size_t at, int bit) {
  size_t n = 0;
  uint8_t *raw = slurp(path, &n);
  uint64_t hlen = 0;
  for (int i = 7; raw && n >= 8 && i >= 0; i--) hlen = hlen << 8 | raw[i];
  CHECK(raw && 8 + hlen + at < n, "flip: %s too short", path);
  if (raw && 8 + hlen + at < n) {
    raw[8 + hlen + at] ^= (uint8_t)(1u << bit);
    write_bytes(path, raw, n);
  }
  free(raw);
}

static void test_crc(void) {
  /* every file the writer makes lists each tensor's CRC-32, in header
   * order, under metadata "strata.crc32": zlib's crc32 of its bytes */
  const char *path = in_dir("crc.safetensors");
  if (write_roundtrip_file(path)) return;
  size_t n = 0;
  uint8_t *raw = slurp(path, &n);
  char want[4 * 9 + 1] = "", *w = want;
  for (int i = 0; i < N_RT; i++)
    w += sprintf(w, "%s%08lx", i ? "," : "",
                 crc32_z(0, rt[i].data, rt[i].bytes));
  char line[128];
  snprintf(line, sizeof line, "\"strata.crc32\":\"%s\"", want);
  CHECK(raw && n > 8 && memmem(raw + 8, n - 8, line, strlen(line)),
        "crc: the header lacks %s", line);
  free(raw);
  st_safetensors *st = NULL;
  st_error err = {0};
  int rc = st_safetensors_read(&st, path, &err);
  CHECK(rc == 0, "crc: read: %s", err.msg);
  for (int i = 0; !rc && i < N_RT; i++) {
    const st_st_tensor *t = st_safetensors_find(st, rt[i].name);
    CHECK(t && t->has_crc && t->crc == crc32_z(0, rt[i].data, rt[i].bytes),
          "crc: %s's CRC not as written", rt[i].name);
  }
  CHECK(!rc && st_safetensors_meta(st, "strata.crc32") == NULL,
        "crc: the CRC list shows as ordinary metadata");
  st_safetensors_destroy(st);

  /* one bit of 'ints' flipped: refused naming the file and that tensor;
   * opened without the data, the other tensors and part reads still serve */
  flip_data_bit(path, sizeof t4 + 4 + 9, 3);
  expect_fail("crc: a flipped bit", path, ST_EFORMAT,
              "tensor 'ints' is damaged", "CRC-32");
  rc = st_safetensors_open(&st, path, &err);
  CHECK(rc == 0, "crc: open: %s", err.msg);
  if (!rc) {
    int32_t got[5];
    float f4[12];
    const st_st_tensor *ti = st_safetensors_find(st, "ints");
    rc = st_safetensors_pread(st, ti, 0, sizeof got, got, &err);
    CHECK(rc == ST_EFORMAT && contains(err.msg, path) &&
              contains(err.msg, "tensor 'ints' is damaged"),
          "crc: pread of the damaged tensor: rc %d: %s", rc, err.msg);
    rc = st_safetensors_pread(st, ti, 0, 8, got, &err); /* a part: unchecked */
    CHECK(rc == 0 && got[0] == -2 && got[1] == 0, "crc: part read: %s",
          err.msg);
    rc = st_safetensors_pread(st, st_safetensors_find(st, rt[0].name), 0,
                              sizeof f4, f4, &err);
    CHECK(rc == 0 && !memcmp(f4, t4, sizeof f4), "crc: intact tensor: %s",
          err.msg);
    /* a tensor read in pieces: its running CRC, checked at the end (the
     * file lists the CRC of the bytes as written) */
    rc = st_safetensors_pread(st, ti, 8, sizeof got - 8, got + 2, &err);
    uint32_t c = (uint32_t)crc32_z(0, (const Bytef *)got, 8);
    c = (uint32_t)crc32_z(c, (const Bytef *)(got + 2), sizeof got - 8);
    CHECK(rc == 0 && got[2] == (7 ^ 8 << 8), "crc: pieces: %s", err.msg);
    rc = st_safetensors_verify(st, ti, c, &err);
    CHECK(rc == ST_EFORMAT && contains(err.msg, "tensor 'ints' is damaged"),
          "crc: verify of the damaged bytes read in pieces: rc %d %s", rc,
          err.msg);
    c = (uint32_t)crc32_z(0, (const Bytef *)ints, sizeof ints);
    rc = st_safetensors_verify(st, ti, c, &err);
    CHECK(rc == 0, "crc: verify of the bytes as written: %s", err.msg);
    st_safetensors_destroy(st);
  }

  /* hand-made lists: right, wrong, short, and not hex. Data bytes are 0,
   * 1, 2, ...: a's 4 bytes, then b's 4. */
  uint8_t bytes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  char hdr[512];
  const char *tensors = "\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                        "\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\","
                        "\"shape\":[1],\"data_offsets\":[4,8]}}";
  snprintf(hdr, sizeof hdr,
           "{\"__metadata__\":{\"strata.crc32\":\"%08lx,%08lx\"},%s",
           crc32_z(0, bytes, 4), crc32_z(0, bytes + 4, 4), tensors);
  write_handmade(path, hdr, 8);
  rc = st_safetensors_read(&st, path, &err);
  CHECK(rc == 0, "crc: hand-made, right: %s", err.msg);
  if (!rc) st_safetensors_destroy(st);
  snprintf(hdr, sizeof hdr,
           "{\"__metadata__\":{\"strata.crc32\":\"%08lx,%08lx\"},%s",
           crc32_z(0, bytes, 4), crc32_z(0, bytes, 4), tensors);
  write_handmade(path, hdr, 8);
  expect_fail("crc: hand-made, b's wrong", path, ST_EFORMAT,
              "tensor 'b' is damaged", NULL);
  snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"strata.crc32\":\"%08lx\"},%s",
           crc32_z(0, bytes, 4), tensors);
  write_handmade(path, hdr, 8);
  expect_fail("crc: one CRC for two tensors", path, ST_EFORMAT,
              "lists 1 CRCs for 2 tensors", NULL);
  snprintf(hdr, sizeof hdr,
           "{\"__metadata__\":{\"strata.crc32\":\"0000000g,00000000\"},%s",
           tensors);
  write_handmade(path, hdr, 8);
  expect_fail("crc: not hex", path, ST_EFORMAT, "bad strata.crc32", NULL);
}

static void test_malformed(void) {
  const char *path = in_dir("bad.safetensors");

  expect_fail("missing file", in_dir("does-not-exist.safetensors"), ST_EIO,
              "cannot open", NULL);

  write_bytes(path, "\x10\0\0\0\0", 5);
  expect_fail("5-byte file", path, ST_EFORMAT, "truncated", "8-byte");

  write_bytes(path, "", 0);
  expect_fail("empty file", path, ST_EFORMAT, "truncated", NULL);

  /* header length 1000, but only 10 bytes follow */
  uint8_t big[18] = {0xe8, 0x03};
  memcpy(big + 8, "{}        ", 10);
  write_bytes(path, big, sizeof big);
  expect_fail("header length past the end", path, ST_EFORMAT, "truncated",
              "1000");

  /* a length with the high byte set: the bound check must not overflow */
  uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
  write_bytes(path, huge, sizeof huge);
  expect_fail("header length 2^63", path, ST_EFORMAT, "truncated", NULL);

  write_handmade(path, "{garbage}", 0);
  expect_fail("garbage JSON", path, ST_EFORMAT, "corrupt", NULL);

  write_handmade(path, "[1, 2]  ", 0);
  expect_fail("JSON array header", path, ST_EFORMAT, "corrupt", NULL);

  write_handmade(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],", 4);
  expect_fail("header cut mid-object", path, ST_EFORMAT, "corrupt", NULL);

  write_handmade(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4);
  expect_fail("tensor without data_offsets", path, ST_EFORMAT, "corrupt",
              "data_offsets");

  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[4,0]}}",
                 4);
  expect_fail("data_offsets end before begin", path, ST_EFORMAT, "corrupt",
              "data_offsets");

  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                 "\"data_offsets\":[0,4]}}",
                 8);
  expect_fail("data_offsets not shape x dtype", path, ST_EFORMAT, "'a'",
              "data_offsets");

  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],"
                 "\"data_offsets\":[0,8]}}",
                 8);
  expect_fail("negative dimension", path, ST_EFORMAT, "'a'", "negative");

  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],"
                 "\"data_offsets\":[0,8]}}",
                 8);
  expect_fail("unknown dtype", path, ST_EFORMAT, "dtype", "F33");

  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],"
                 "\"data_offsets\":[8,24]}}",
                 16);
  expect_fail("data_offsets past the data section", path, ST_EFORMAT,
              "truncated", "'a'");

  /* A valid file cut short by truncate(): the last tensor in the data
   * section ("ints", bytes [52, 72)) no longer fits. */
  if (write_roundtrip_file(path) == 0) {
    long size = file_size(path);
    CHECK(size > 0 && truncate(path, size - 4) == 0, "truncate %s: %s", path,
          strerror(errno));
    expect_fail("file truncated by 4 bytes", path, ST_EFORMAT, "truncated",
                "'ints'");
    /* cut into the header: the length now points past the end */
    CHECK(truncate(path, 40) == 0, "truncate %s: %s", path, strerror(errno));
    expect_fail("file truncated into the header", path, ST_EFORMAT, "truncated",
                NULL);
  }

  /* A name listed twice, far apart in a long header. */
  write_handmade(path,
                 "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],"
                 "\"data_offsets\":[0,1]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
                 "\"data_offsets\":[1,2]},"
                 "\"b\":{\"dtype\":\"U8\",\"shape\":[1],"
                 "\"data_offsets\":[2,3]}}",
                 3);
  expect_fail("a tensor listed twice", path, ST_EFORMAT, "'b'",
              "appears twice");

  /* Empty tensors are valid wherever they sit in the header (a tie of
   * offsets with a full tensor once read as an overlap), and a zero
   * dimension makes no bytes however large the others. */
  const char *empties[] = {
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,0],"
      "\"data_offsets\":[8,8]}}",
  };
  for (int i = 0; i < 3; i++) {
    write_handmade(path, empties[i], 8);
    st_safetensors *st = NULL;
    st_error err = {0};
    int rc = st_safetensors_read(&st, path, &err);
    CHECK(rc == 0 && st->n_tensors == 2 && st_safetensors_find(st, "a") &&
              st_safetensors_find(st, "b") && !st_safetensors_find(st, "c"),
          "empty tensor, header %d: rc %d %s", i, rc, err.msg);
    st_safetensors_destroy(st);
  }

  /* A directory is not a file. */
  expect_fail("a directory", dir, 0, NULL, NULL);
}

/* The writer refuses what it could not write as valid JSON or safetensors. */
static void test_writer_arguments(void) {
  st_st_writer *w = st_st_writer_create();
  st_error err = {0};
  int64_t d[1] = {2};
  float v[2] = {1, 2};
  CHECK(st_st_writer_add(w, "x", "F99", 1, d, v, &err) == ST_EARG &&
            contains(err.msg, "'x'"),
        "writer: unknown dtype accepted (%s)", err.msg);
  CHECK(st_st_writer_add(w, "x", "F32", 9, d, v, &err) == ST_EARG,
        "writer: 9 dimensions accepted");
  char long_name[200];
  memset(long_name, 'n', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;
  CHECK(st_st_writer_add(w, long_name, "F32", 1, d, v, &err) == ST_EARG,
        "writer: a 199-character name accepted");
  CHECK(st_st_writer_meta(w, "k", "say \"hi\"", &err) == ST_EARG,
        "writer: a metadata value with a quote accepted");
  CHECK(st_st_writer_meta(w, "k\\", "v", &err) == ST_EARG,
        "writer: a metadata key with a backslash accepted");
  /* nothing was added, so the file holds an empty header */
  const char *path = in_dir("empty.safetensors");
  CHECK(st_st_writer_write(w, path, &err) == 0, "writer: %s", err.msg);
  st_st_writer_destroy(w);
  st_safetensors *st = NULL;
  CHECK(st_safetensors_read(&st, path, &err) == 0 && st && st->n_tensors == 0 &&
            st->n_meta == 0 && st->data_bytes == 0,
        "writer: empty file did not read back empty: %s", err.msg);
  st_safetensors_destroy(st);
  st_st_writer_destroy(NULL);
}

/* ------------------------------------------------------------ atomic */

/* A fetch that fails: the writer's peer had nothing to send. */
static const void *fail_fetch(void *arg, int index, st_error *err) {
  (void)arg;
  st_error_set(err, ST_EIO, "tensor %d never came", index);
  return NULL;
}

static void test_atomic(void) {
  st_error err = {0};
  float small[1] = {42.0f};
  static float large[1000];
  int64_t d_small[1] = {1}, d_large[1] = {1000};

  /* a directory that does not exist: error names the path, nothing left */
  const char *nowhere = in_dir("no/such/dir/x.safetensors");
  st_st_writer *w = st_st_writer_create();
  st_st_writer_add(w, "x", "F32", 1, d_small, small, &err);
  int rc = st_st_writer_write(w, nowhere, &err);
  CHECK(rc == ST_EIO, "write into a missing directory: rc %d, want ST_EIO", rc);
  CHECK(contains(err.msg, nowhere), "missing directory: message lacks %s: %s",
        nowhere, err.msg);
  CHECK(access(nowhere, F_OK) != 0 && access(in_dir("no"), F_OK) != 0,
        "missing directory: something was created");
  CHECK(count_temp_files(dir) == 0, "missing directory: a temp file is left");
  st_st_writer_destroy(w);

  /* overwrite a large file with a small one: replaced whole, no tail of
   * the old one, no temp file left */
  const char *path = in_dir("over.safetensors");
  for (int i = 0; i < 1000; i++) large[i] = (float)i;
  w = st_st_writer_create();
  st_st_writer_add(w, "big", "F32", 1, d_large, large, &err);
  rc = st_st_writer_write(w, path, &err);
  st_st_writer_destroy(w);
  long first = file_size(path);
  CHECK(rc == 0 && first > 4000, "large write: rc %d, %ld bytes (%s)", rc,
        first, err.msg);
  w = st_st_writer_create();
  st_st_writer_add(w, "x", "F32", 1, d_small, small, &err);
  rc = st_st_writer_write(w, path, &err);
  st_st_writer_destroy(w);
  long second = file_size(path);
  CHECK(rc == 0 && second > 0 && second < 200,
        "overwrite: rc %d, %ld bytes, want a small file (%s)", rc, second,
        err.msg);
  st_safetensors *st = NULL;
  rc = st_safetensors_read(&st, path, &err);
  CHECK(rc == 0 && st->n_tensors == 1 && st_safetensors_find(st, "x") &&
            !st_safetensors_find(st, "big") && st->data_bytes == 4,
        "overwrite: file does not hold only the new tensor (%s)", err.msg);
  if (rc == 0) st_safetensors_destroy(st);
  CHECK(count_temp_files(dir) == 0, "after writes: a *.tmp.* file is left");

  /* a write that fails half way (a fetched tensor that never comes, after
   * the header and the first tensor went out) leaves the old file whole,
   * byte for byte, and no temp file */
  size_t old_n = 0;
  uint8_t *before = slurp(path, &old_n);
  w = st_st_writer_create();
  st_st_writer_add(w, "big", "F32", 1, d_large, large, &err);
  st_st_writer_add(w, "late", "F32", 1, d_large, NULL, &err);
  rc = st_st_writer_write_fetch(w, path, fail_fetch, NULL, &err);
  st_st_writer_destroy(w);
  size_t after_n = 0;
  uint8_t *after = slurp(path, &after_n);
  CHECK(rc != 0 && contains(err.msg, "never came"),
        "a failed fetch: rc %d (%s)", rc, err.msg);
  CHECK(before && after && after_n == old_n &&
            memcmp(before, after, old_n) == 0,
        "a failed write changed the old file (%zu bytes, was %zu)", after_n,
        old_n);
  CHECK(count_temp_files(dir) == 0, "a failed write left a temp file");
  free(before);
  free(after);

  /* st_write_file_atomic directly: exact bytes */
  const char *plain = in_dir("plain.txt");
  rc = st_write_file_atomic(plain, "hello, world", 12, &err);
  size_t n = 0;
  uint8_t *back = slurp(plain, &n);
  CHECK(rc == 0 && back && n == 12 && memcmp(back, "hello, world", 12) == 0,
        "st_write_file_atomic: content differs (%s)", err.msg);
  free(back);
  rc = st_write_file_atomic(plain, "bye", 3, &err);
  CHECK(rc == 0 && file_size(plain) == 3,
        "st_write_file_atomic: overwrite "
        "left %ld bytes",
        file_size(plain));

  /* the rename fails (the target is a directory): the error names the
   * target, the temp file is removed, the directory is untouched */
  const char *sub = in_dir("adir");
  CHECK(mkdir(sub, 0755) == 0, "mkdir %s: %s", sub, strerror(errno));
  rc = st_write_file_atomic(sub, "x", 1, &err);
  struct stat sb;
  CHECK(rc == ST_EIO && contains(err.msg, sub),
        "write onto a directory: rc %d (%s)", rc, err.msg);
  CHECK(stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode),
        "write onto a directory: the directory is gone");
  CHECK(count_temp_files(dir) == 0,
        "write onto a directory: the temp file was left behind");
  rmdir(sub);
}

/* ------------------------------------------------------------ checkpoint */

static st_model *small_model(int width) {
  st_config c;
  st_config_defaults(&c);
  c.model.hidden = (st_int_list){1, {width}};
  snprintf(c.model.norm, sizeof c.model.norm, "layernorm");
  c.model.classes = 3;
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, &c, (st_shape){4, 1, 1}, &err);
  CHECK(rc == 0, "small model: %s", err.msg);
  return m;
}

static void fill(float *v, size_t n, uint64_t seed) {
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, 0);
  for (size_t i = 0; i < n; i++) v[i] = st_rng_normal(&rng);
}

/* A position at `step`, 630 samples in, at batch 10 over 300 samples:
 * step 63 is epoch 2 x 30 steps + 30 / 10 into epoch 2 (a consistent
 * position; other steps are not). */
static st_train_pos position(int64_t step) {
  return (st_train_pos){.step = step,
                        .epoch = 2,
                        .epoch_pos = 30,
                        .samples = 630,
                        .seed = 99,
                        .batch = 10,
                        .train_samples = 300,
                        .shuffle = 1};
}

static void roundtrip_checkpoint(const st_model *m, const char *kind,
                                 int slots) {
  size_t np = m->n_params;
  float *params = calloc(np, sizeof(float));
  float *opt = calloc(slots * np, sizeof(float));
  float *params2 = calloc(np, sizeof(float));
  float *opt2 = calloc(slots * np, sizeof(float));
  st_model_init(m, params, 3);
  fill(opt, slots * np, 4);
  st_train_pos pos = position(63), pos2 = {0};
  const char *path = in_dir("ckpt.safetensors");
  st_error err = {0};
  int rc = st_checkpoint_save(path, m, params, opt, kind, &pos, &err);
  CHECK(rc == 0, "checkpoint %s: save: %s", kind, err.msg);
  rc = st_checkpoint_load(path, m, params2, opt2, kind, &pos2, &err);
  CHECK(rc == 0, "checkpoint %s: load: %s", kind, err.msg);
  CHECK(memcmp(params, params2, np * sizeof(float)) == 0,
        "checkpoint %s: weights differ after the round trip", kind);
  CHECK(memcmp(opt, opt2, slots * np * sizeof(float)) == 0,
        "checkpoint %s: %d optimizer slot(s) differ after the round trip", kind,
        slots);
  CHECK(pos2.step == 63 && pos2.epoch == 2 && pos2.epoch_pos == 30 &&
            pos2.samples == 630,
        "checkpoint %s: position came back as %lld %lld %lld %lld", kind,
        (long long)pos2.step, (long long)pos2.epoch, (long long)pos2.epoch_pos,
        (long long)pos2.samples);

  /* The file itself: weights under their names, optimizer state under
   * optim.<name>.<slot>, exactly (1 + slots) tensors per model tensor. */
  st_safetensors *st = NULL;
  if (st_safetensors_read(&st, path, &err) == 0) {
    CHECK(st->n_tensors == (1 + slots) * m->n_tensors,
          "checkpoint %s: %d tensors, want %d", kind, st->n_tensors,
          (1 + slots) * m->n_tensors);
    const char *want = slots == 2 ? "optim.blocks.0.ln0.bias.exp_avg_sq"
                                  : "optim.blocks.0.ln0.bias.momentum";
    CHECK(st_safetensors_find(st, want) != NULL, "checkpoint %s: no %s", kind,
          want);
    const char *seed = st_safetensors_meta(st, "seed");
    const char *opt_kind = st_safetensors_meta(st, "optimizer");
    CHECK(seed && strcmp(seed, "99") == 0 && opt_kind &&
              strcmp(opt_kind, kind) == 0,
          "checkpoint %s: metadata seed %s optimizer %s", kind,
          seed ? seed : "-", opt_kind ? opt_kind : "-");
    st_safetensors_destroy(st);
  } else {
    CHECK(0, "checkpoint %s: %s", kind, err.msg);
  }
  free(params);
  free(opt);
  free(params2);
  free(opt2);
}

static void test_checkpoint(void) {
  st_model *m = small_model(5), *wide = small_model(6);
  if (!m || !wide) {
    st_model_destroy(m);
    st_model_destroy(wide);
    return;
  }
  roundtrip_checkpoint(m, "sgd", 1);
  roundtrip_checkpoint(m, "adamw", 2); /* leaves an adamw checkpoint */
  const char *path = in_dir("ckpt.safetensors");
  size_t np = m->n_params;
  float *params = calloc(np, sizeof(float)), *opt = calloc(2 * np, 4);
  st_train_pos pos;
  st_error err = {0};

  /* a position that is not one: a step more than its samples say; and a
   * NaN weight, refused naming the tensor and the element */
  float *p0 = calloc(np, sizeof(float)), *o0 = calloc(2 * np, sizeof(float));
  st_train_pos bad = position(64); /* one step past what its samples say */
  const char *odd = in_dir("odd.safetensors");
  int rc = st_checkpoint_save(odd, m, p0, o0, "sgd", &bad, &err);
  rc = rc ? rc : st_checkpoint_load(odd, m, params, opt, "sgd", &pos, &err);
  CHECK(rc == ST_EFORMAT &&
            contains(err.msg, "metadata step 64, epoch 2, epoch_pos 30 and "
                              "samples 630 do not describe one position at "
                              "batch 10 over 300 samples"),
        "inconsistent position: rc %d: %s", rc, err.msg);
  bad.step = 63, bad.samples = 631; /* samples alone disagree */
  rc = st_checkpoint_save(odd, m, p0, o0, "sgd", &bad, &err);
  rc = rc ? rc : st_checkpoint_load(odd, m, params, opt, "sgd", &pos, &err);
  CHECK(rc == ST_EFORMAT && contains(err.msg, "samples 631 do not describe"),
        "samples that are not step x batch: rc %d: %s", rc, err.msg);
  bad.samples = 630;
  /* the noise scale's averages: read back as the same doubles (1/3 and a
   * subnormal need all 17 digits); none kept, none read; a weight that is
   * no bias correction refused naming the key */
  st_train_pos noisy = bad;
  noisy.noise_g2 = 1.0 / 3, noisy.noise_trace = -4.9e-320;
  noisy.noise_weight = 0.1 * 3, noisy.noise_n = 7;
  noisy.train_crc = 0xdeadbeef, noisy.has_train_crc = 1;
  noisy.tokenizer_crc = 0x0badcafe, noisy.has_tokenizer_crc = 1;
  noisy.normalize = 0, noisy.has_normalize = 1;
  noisy.pb_micro_batch = 4;
  rc = st_checkpoint_save(odd, m, p0, o0, "sgd", &noisy, &err);
  memset(&pos, 0xff, sizeof pos);
  rc = rc ? rc : st_checkpoint_load(odd, m, params, opt, "sgd", &pos, &err);
  CHECK(rc == 0 && pos.noise_g2 == 1.0 / 3 && pos.noise_trace == -4.9e-320 &&
            pos.noise_weight == 0.1 * 3 && pos.noise_n == 7 &&
            pos.train_crc == 0xdeadbeef && pos.has_train_crc == 1 &&
            pos.tokenizer_crc == 0x0badcafe && pos.has_tokenizer_crc == 1 &&
            pos.normalize == 0 && pos.has_normalize == 1 &&
            pos.pb_micro_batch == 4,
        "noise averages round trip: rc %d (%s): %.17g %.17g %.17g %lld", rc,
        err.msg, pos.noise_g2, pos.noise_trace, pos.noise_weight,
        (long long)pos.noise_n);
  rc = st_checkpoint_save(odd, m, p0, o0, "sgd", &bad, &err);
  memset(&pos, 0xff, sizeof pos);
  rc = rc ? rc : st_checkpoint_load(odd, m, params, opt, "sgd", &pos, &err);
  CHECK(rc == 0 && pos.noise_n == 0 && pos.noise_g2 == 0 &&
            pos.noise_weight == 0 && pos.has_train_crc == 0 &&
            pos.has_tokenizer_crc == 0 && pos.has_normalize == 0 &&
            pos.pb_micro_batch == 0,
        "no noise averages kept: rc %d (%s), n %lld", rc, err.msg,
        (long long)pos.noise_n);
  noisy.noise_weight = 1.5;
  rc = st_checkpoint_save(odd, m, p0, o0, "sgd", &noisy, &err);
  rc = rc ? rc : st_checkpoint_load(odd, m, params, opt, "sgd", &pos, &err);
  CHECK(rc == ST_EFORMAT && contains(err.msg, "metadata 'noise_weight' is 1.5"),
        "a noise weight past 1: rc %d: %s", rc, err.msg);
  p0[m->blocks[1].param_off + 2] = NAN;
  bad.step = 63;
  rc = st_checkpoint_save(odd, m, p0, o0, "sgd", &bad, &err);
  rc = rc ? rc : st_checkpoint_load(odd, m, params, NULL, "sgd", NULL, &err);
  CHECK(rc == ST_EFORMAT && contains(err.msg, "holds NaN at element 2") &&
            contains(err.msg, m->blocks[1].tensors[0].name),
        "NaN weight: rc %d: %s", rc, err.msg);
  /* a BF16 weight (as `strata export` writes them) damaged in the file,
   * past the first 1024 of a tensor's weights: widened in pieces, so no
   * single read is the whole tensor, yet its CRC is checked */
  st_model *bm = small_model(300); /* a 300 x 4 weight */
  size_t bn = bm ? bm->n_params : 1;
  uint16_t *half = calloc(bn, sizeof *half);
  float *back = calloc(bn, sizeof *back);
  for (size_t i = 0; i < bn; i++) half[i] = st_bf16_from(0.01f * (float)i);
  bad.step = 63, bad.samples = 630;
  rc =
      bm ? st_checkpoint_save_as(odd, bm, half, "BF16", NULL, "sgd", &bad, &err)
         : ST_ENOMEM;
  if (!rc) rc = st_checkpoint_load(odd, bm, back, NULL, "sgd", NULL, &err);
  CHECK(rc == 0 && back[bn - 1] == st_bf16_to(half[bn - 1]),
        "BF16 round trip: %s", err.msg);
  st_safetensors *sf = NULL;
  const st_st_tensor *big = NULL;
  char big_name[200] = "";
  size_t big_at = 0;
  if (!rc && st_safetensors_open(&sf, odd, &err) == 0) {
    for (int i = 0; i < sf->n_tensors && !big; i++)
      if (sf->tensors[i].end - sf->tensors[i].begin > 2 * 1024 + 2)
        big = &sf->tensors[i];
    if (big) {
      snprintf(big_name, sizeof big_name, "tensor '%s' is damaged", big->name);
      big_at = big->begin + 2 * 1024 + 1;
    }
    st_safetensors_destroy(sf);
  }
  CHECK(big_at > 0, "BF16: no weight tensor of more than 1024 elements");
  if (big_at) {
    flip_data_bit(odd, big_at, 0);
    rc = st_checkpoint_load(odd, bm, back, NULL, "sgd", NULL, &err);
    CHECK(rc == ST_EFORMAT && contains(err.msg, big_name),
          "BF16 weight damaged past its first piece: rc %d: %s", rc, err.msg);
  }
  free(half);
  free(back);
  st_model_destroy(bm);
  free(p0);
  free(o0);

  /* adamw state into an sgd run */
  rc = st_checkpoint_load(path, m, params, opt, "sgd", &pos, &err);
  CHECK(rc < 0 && contains(err.msg, "optimizer.kind") &&
            contains(err.msg, path) && contains(err.msg, "adamw"),
        "wrong optimizer: rc %d: %s", rc, err.msg);

  /* a model one unit wider: names the first tensor and both shapes */
  float *wparams = calloc(wide->n_params, sizeof(float));
  rc = st_checkpoint_load(path, wide, wparams, NULL, "adamw", NULL, &err);
  CHECK(rc == ST_EFORMAT && contains(err.msg, "blocks.0.linear0.weight") &&
            contains(err.msg, "5x4") && contains(err.msg, "6x4") &&
            contains(err.msg, path),
        "wider model: rc %d: %s", rc, err.msg);
  free(wparams);

  /* weights only, from a file with no metadata (as PyTorch would write) */
  const char *bare = in_dir("bare.safetensors");
  float *src = calloc(np, sizeof(float));
  fill(src, np, 5);
  st_st_writer *w = st_st_writer_create();
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[t];
      st_st_writer_add(w, ti->name, "F32", ti->ndim, ti->dims,
                       src + m->blocks[i].param_off + ti->offset, &err);
    }
  rc = st_st_writer_write(w, bare, &err);
  st_st_writer_destroy(w);
  CHECK(rc == 0, "bare file: %s", err.msg);
  memset(params, 0, np * sizeof(float));
  rc = st_checkpoint_load(bare, m, params, NULL, "sgd", NULL, &err);
  CHECK(rc == 0 && memcmp(params, src, np * sizeof(float)) == 0,
        "weights-only load of a file without metadata: rc %d: %s", rc, err.msg);
  /* a tensor the model lacks (a checkpoint of a deeper or untied model)
   * is refused, naming it; optimizer state is ignored by a weights-only
   * load, and so is, in another tool's file, a tensor outside the model's
   * namespaces (a PyTorch fixture's reference values) */
  for (int extra = 0; extra < 4; extra++) {
    char more[512]; /* not in_dir's ring, which holds bare */
    snprintf(more, sizeof more, "%s/more.safetensors", dir);
    const char *name = extra >= 2 ? "losses.sgd"
                       : extra    ? "optim.blocks.0.linear0.weight.momentum"
                                  : "blocks.7.linear0.weight";
    w = st_st_writer_create();
    for (int i = 0; i < m->n_blocks; i++)
      for (int t = 0; t < m->blocks[i].n_tensors; t++) {
        const st_tensor_info *ti = &m->blocks[i].tensors[t];
        st_st_writer_add(w, ti->name, "F32", ti->ndim, ti->dims,
                         src + m->blocks[i].param_off + ti->offset, &err);
      }
    const st_tensor_info *t0 = &m->blocks[0].tensors[0];
    st_st_writer_add(w, name, "F32", t0->ndim, t0->dims, src, &err);
    /* 3: the same extra in a strata checkpoint, where every tensor counts */
    if (extra == 3) st_st_writer_meta(w, "format", "strata-checkpoint", &err);
    rc = st_st_writer_write(w, more, &err);
    st_st_writer_destroy(w);
    CHECK(rc == 0, "file with an extra tensor: %s", err.msg);
    rc = st_checkpoint_load(more, m, params, NULL, "sgd", NULL, &err);
    if (extra == 1 || extra == 2)
      CHECK(rc == 0, "weights-only load ignores %s: %s", name, err.msg);
    else
      CHECK(rc == ST_EFORMAT && contains(err.msg, name) &&
                contains(err.msg, "is not in this model") &&
                contains(err.msg, more),
            "a tensor the model lacks (%s): rc %d: %s", name, rc, err.msg);
  }
  /* asking the same file for a training position fails, naming the key */
  rc = st_checkpoint_load(bare, m, params, NULL, "sgd", &pos, &err);
  CHECK(rc < 0 && contains(err.msg, "'step'") && contains(err.msg, bare),
        "position from a file without metadata: rc %d: %s", rc, err.msg);
  /* asking it for optimizer state fails on the optimizer kind */
  rc = st_checkpoint_load(bare, m, params, opt, "sgd", NULL, &err);
  CHECK(rc < 0 && contains(err.msg, "optimizer.kind"),
        "optimizer state from a file without metadata: rc %d: %s", rc, err.msg);

  /* every tensor present, one of them I32: refused naming it and the dtype */
  w = st_st_writer_create();
  int32_t as_int[20] = {0};
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[t];
      int as_i32 = strcmp(ti->name, "blocks.0.linear0.weight") == 0;
      st_st_writer_add(w, ti->name, as_i32 ? "I32" : "F32", ti->ndim, ti->dims,
                       as_i32 ? (const void *)as_int
                              : src + m->blocks[i].param_off + ti->offset,
                       &err);
    }
  rc = st_st_writer_write(w, bare, &err);
  st_st_writer_destroy(w);
  rc = st_checkpoint_load(bare, m, params, NULL, "sgd", NULL, &err);
  CHECK(rc == ST_EFORMAT && contains(err.msg, "blocks.0.linear0.weight") &&
            contains(err.msg, "I32"),
        "I32 weight: rc %d: %s", rc, err.msg);

  /* one tensor left out: refused naming it */
  w = st_st_writer_create();
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[t];
      if (strcmp(ti->name, "blocks.1.linear0.bias") == 0) continue;
      st_st_writer_add(w, ti->name, "F32", ti->ndim, ti->dims,
                       src + m->blocks[i].param_off + ti->offset, &err);
    }
  st_st_writer_write(w, bare, &err);
  st_st_writer_destroy(w);
  rc = st_checkpoint_load(bare, m, params, NULL, "sgd", NULL, &err);
  CHECK(rc == ST_EFORMAT && contains(err.msg, "blocks.1.linear0.bias") &&
            contains(err.msg, "missing"),
        "missing tensor: rc %d: %s", rc, err.msg);

  /* loading a file that is not there passes the reader's error through */
  rc = st_checkpoint_load(in_dir("none.safetensors"), m, params, NULL, "sgd",
                          NULL, &err);
  CHECK(rc == ST_EIO && contains(err.msg, "none.safetensors"),
        "missing checkpoint: rc %d: %s", rc, err.msg);

  free(src);
  free(params);
  free(opt);
  st_model_destroy(m);
  st_model_destroy(wide);
}

/* ------------------------------------------------------------ inspect */

/* The inspect line of tensor `name`, parsed; 0 if absent. */
static int inspect_line(const char *text, const char *name, char *dtype,
                        char *shape, double stats[4]) {
  char key[80];
  snprintf(key, sizeof key, "\n  %s ", name);
  const char *p = strstr(text, key);
  if (!p) return 0;
  char got[64];
  return sscanf(p + 1, "%63s %7s %31s %lf %lf %lf %lf", got, dtype, shape,
                &stats[0], &stats[1], &stats[2], &stats[3]) == 7 &&
         strcmp(got, name) == 0;
}

static void test_inspect(void) {
  const char *path = in_dir("inspect.safetensors");
  float w6[6] = {1, 2, 3, 4, 5, 6}, s = 2.5f;
  /* NaN and infinities: counted and placed, the figures the finite ones'
   * (10001, 10002, 10003: mean 10002, std sqrt(2/3)) */
  float odd[6] = {NAN, 10001, INFINITY, 10002, NAN, 10003};
  int64_t d6[1] = {6};
  int32_t n3[3] = {-1, 0, 4};
  int64_t d23[2] = {2, 3}, d3[1] = {3}, d0[2] = {0, 7};
  st_error err = {0};
  st_st_writer *w = st_st_writer_create();
  st_st_writer_add(w, "layer.w", "F32", 2, d23, w6, &err);
  st_st_writer_add(w, "counts", "I32", 1, d3, n3, &err);
  st_st_writer_add(w, "s", "F32", 0, d3, &s, &err);
  st_st_writer_add(w, "void", "F32", 2, d0, w6, &err);
  st_st_writer_add(w, "odd", "F32", 1, d6, odd, &err);
  /* half precision: 1, 2, -0.5 and the smallest subnormal 2^-24 */
  uint16_t h4[4] = {0x3c00, 0x4000, 0xb800, 0x0001};
  int64_t d4[1] = {4};
  st_st_writer_add(w, "half", "F16", 1, d4, h4, &err);
  st_st_writer_meta(w, "format", "strata-checkpoint", &err);
  int rc = st_st_writer_write(w, path, &err);
  st_st_writer_destroy(w);
  CHECK(rc == 0, "inspect: write: %s", err.msg);

  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  rc = st_inspect(path, f, &err);
  fclose(f);
  CHECK(rc == 0, "inspect: %s", err.msg);
  CHECK(text && contains(text, path) && contains(text, "6 tensors"),
        "inspect: no title line naming the file and 6 tensors:\n%s", text);
  CHECK(text && contains(text, "format") && contains(text, "strata-checkpoint"),
        "inspect: metadata not printed:\n%s", text);

  /* Statistics are printed with %.5g: 5 significant digits, so 1e-4
   * relative (plus 1e-9 absolute for zeros) covers the rounding. */
  char dtype[8], shape[32];
  double st[4];
  int ok = text && inspect_line(text, "layer.w", dtype, shape, st);
  CHECK(ok && strcmp(dtype, "F32") == 0 && strcmp(shape, "2x3") == 0,
        "inspect: layer.w line missing or wrong:\n%s", text);
  /* 1..6: min 1, max 6, mean 3.5, population std sqrt(35/12) */
  double want_w[4] = {1, 6, 3.5, sqrt(35.0 / 12.0)};
  for (int i = 0; ok && i < 4; i++)
    CHECK(fabs(st[i] - want_w[i]) <= 1e-4 * fabs(want_w[i]) + 1e-9,
          "inspect: layer.w stat %d is %g, want %g", i, st[i], want_w[i]);
  ok = text && inspect_line(text, "counts", dtype, shape, st);
  CHECK(ok && strcmp(dtype, "I32") == 0 && strcmp(shape, "3") == 0,
        "inspect: counts line missing or wrong:\n%s", text);
  /* -1, 0, 4: mean 1, population std sqrt(17/3 - 1) */
  double want_n[4] = {-1, 4, 1, sqrt(14.0 / 3.0)};
  for (int i = 0; ok && i < 4; i++)
    CHECK(fabs(st[i] - want_n[i]) <= 1e-4 * fabs(want_n[i]) + 1e-9,
          "inspect: counts stat %d is %g, want %g", i, st[i], want_n[i]);
  ok = text && inspect_line(text, "s", dtype, shape, st);
  CHECK(ok && strcmp(shape, "scalar") == 0 && st[0] == 2.5 && st[1] == 2.5 &&
            st[2] == 2.5 && st[3] == 0,
        "inspect: scalar line missing or wrong:\n%s", text);
  ok = text && inspect_line(text, "void", dtype, shape, st);
  CHECK(ok && strcmp(shape, "0x7") == 0 && st[0] == 0 && st[1] == 0 &&
            st[2] == 0 && st[3] == 0,
        "inspect: zero-size tensor line missing or wrong:\n%s", text);
  ok = text && inspect_line(text, "odd", dtype, shape, st);
  double want_o[4] = {10001, 10003, 10002, sqrt(2.0 / 3.0)};
  for (int i = 0; ok && i < 4; i++)
    CHECK(fabs(st[i] - want_o[i]) <= 1e-4 * fabs(want_o[i]) + 1e-9,
          "inspect: odd stat %d is %g, want %g", i, st[i], want_o[i]);
  CHECK(ok && contains(text, "holds 2 NaN and 1 infinities, the first at "
                             "element 0"),
        "inspect: the NaN and infinities are not counted:\n%s", text);
  /* F16 read as half precision: min -0.5, max 2, mean (2.5 + 2^-24) / 4,
   * std by hand from the deviations 0.375, 1.375, -1.125, -0.625 */
  ok = text && inspect_line(text, "half", dtype, shape, st);
  double want_h[4] = {-0.5, 2, 0.625, sqrt(3.6875 / 4)};
  CHECK(ok && strcmp(dtype, "F16") == 0 && !contains(text, "holds 4 NaN"),
        "inspect: half line missing or read as NaN:\n%s", text);
  for (int i = 0; ok && i < 4; i++)
    CHECK(fabs(st[i] - want_h[i]) <= 1e-4 * fabs(want_h[i]) + 1e-9,
          "inspect: half stat %d is %g, want %g", i, st[i], want_h[i]);
  free(text);

  /* a file that cannot be read: the error, and nothing printed */
  text = NULL;
  f = open_memstream(&text, &len);
  rc = st_inspect(in_dir("nothing.safetensors"), f, &err);
  fclose(f);
  CHECK(rc == ST_EIO && contains(err.msg, "nothing.safetensors") && len == 0,
        "inspect of a missing file: rc %d, %zu bytes printed: %s", rc, len,
        err.msg);
  free(text);
}

/* --against: a NaN difference is the largest, wherever it falls: in a
 * tensor before elements that agree, and in a tensor before others that
 * agree (a NaN compares false with everything, so `d > most` alone never
 * keeps it, and `!(d <= most)` lets the next finite one replace it). */
static void test_inspect_against(void) {
  const char *pa = in_dir("against_a.safetensors");
  const char *pb = in_dir("against_b.safetensors");
  float a_early[3] = {NAN, 1, 2}, b_early[3] = {0, 1, 2};
  float a_rest[2] = {5, 6}, b_rest[2] = {5, 7};
  int64_t d3[1] = {3}, d2[1] = {2};
  st_error err = {0};
  for (int i = 0; i < 2; i++) {
    st_st_writer *w = st_st_writer_create();
    st_st_writer_add(w, "a.early", "F32", 1, d3, i ? b_early : a_early, &err);
    st_st_writer_add(w, "b.rest", "F32", 1, d2, i ? b_rest : a_rest, &err);
    int rc = st_st_writer_write(w, i ? pb : pa, &err);
    st_st_writer_destroy(w);
    CHECK(rc == 0, "against: write: %s", err.msg);
  }
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  int rc = st_inspect_against(pa, pb, f, &err);
  fclose(f);
  CHECK(rc == 0, "against: %s", err.msg);
  CHECK(text && contains(text, "a.early") &&
            contains(strstr(text, "a.early"), "max |a - b| nan"),
        "against: the NaN in a.early is not its largest difference:\n%s",
        text ? text : "");
  CHECK(text && contains(text, "largest difference nan (a.early)"),
        "against: the NaN is not the largest of all:\n%s", text ? text : "");
  free(text);
  unlink(pa);
  unlink(pb);
}

/* --against of a tensor with the same infinities in both files: no
 * difference there (inf - inf is NaN, which read as the largest of all,
 * so a checkpoint compared with its own copy differed by NaN). */
static void test_inspect_against_inf(void) {
  const char *pa = in_dir("inf_a.safetensors");
  const char *pb = in_dir("inf_b.safetensors");
  float a[3] = {INFINITY, -INFINITY, 1}, b[3] = {INFINITY, -INFINITY, 1.5f};
  int64_t d3[1] = {3};
  st_error err = {0};
  for (int i = 0; i < 2; i++) {
    st_st_writer *w = st_st_writer_create();
    st_st_writer_add(w, "w", "F32", 1, d3, i ? b : a, &err);
    int rc = st_st_writer_write(w, i ? pb : pa, &err);
    st_st_writer_destroy(w);
    CHECK(rc == 0, "against inf: write: %s", err.msg);
  }
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  int rc = st_inspect_against(pa, pb, f, &err);
  fclose(f);
  CHECK(rc == 0 && text &&
            contains(text, "largest difference 0.5 (w), largest relative "
                           "0.333333"),
        "against: equal infinities are no difference: rc %d %s\n%s", rc,
        err.msg, text ? text : "");
  free(text);
  unlink(pa);
  unlink(pb);
}

/* ------------------------------------------------------------ cleanup */

static void remove_dir(void) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      unlink(in_dir(e->d_name));
  closedir(d);
  rmdir(dir);
}

/* What a strict reader must refuse beyond truncation: the specification's
 * layout (ranges tile the data section), one object and nothing after it,
 * unique names, sizes that do not overflow; and a writer that never produces
 * a file its own reader rejects. */
static void test_strict(void) {
  const char *path = in_dir("strict.safetensors");
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":"
                 "[4611686018427387905,4],\"data_offsets\":[0,16]}}",
                 16);
  expect_fail("shape size overflows", path, ST_EFORMAT, "'a'", "too large");
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,4]}}garbage",
                 4);
  expect_fail("text after the header", path, ST_EFORMAT, "corrupt", NULL);
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\","
                 "\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8);
  expect_fail("duplicate name", path, ST_EFORMAT, "'a'", "twice");
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[4,8]}}",
                 8);
  expect_fail("hole before a tensor", path, ST_EFORMAT, "'a'", "hole");
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,4]}}",
                 8);
  expect_fail("unused bytes after the tensors", path, ST_EFORMAT, "end at",
              NULL);
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\" \"shape\":[1],"
                 "\"data_offsets\":[0,4]}}",
                 4);
  expect_fail("missing comma", path, ST_EFORMAT, "corrupt", NULL);
  expect_fail("a directory", dir, ST_EIO, "not a regular file", NULL);

  st_st_writer *w = st_st_writer_create();
  st_error err = {0};
  int64_t d[1] = {1};
  float v = 1.0f;
  CHECK(st_st_writer_add(w, "a\"b", "F32", 1, d, &v, &err) == ST_EARG,
        "writer accepted a name with a quote");
  CHECK(st_st_writer_add(w, "__metadata__", "F32", 1, d, &v, &err) == ST_EARG,
        "writer accepted the reserved name __metadata__");
  st_st_writer_destroy(w);
}

/* The bounds the reader keeps on a header a file may lie in: each refused
 * with its own cause (a check removed let the next one catch some of these
 * under another name, and wrote past a buffer for others: every one of them
 * passed the tests above). */
static void test_bounds(void) {
  const char *path = in_dir("bounds.safetensors");
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                 "\"data_offsets\":[0,4]}}",
                 4);
  expect_fail("nine dimensions", path, ST_EFORMAT, "too many dimensions", NULL);
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                 "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\","
                 "\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8);
  expect_fail("overlapping tensors", path, ST_EFORMAT, "'b'", "overlap");
  write_handmade(path,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                 "\"data_offsets\":[-4,4]}}",
                 4);
  expect_fail("negative data_offsets", path, ST_EFORMAT, "corrupt",
              "bad data_offsets");
  write_handmade(path, "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4);
  expect_fail("no shape", path, ST_EFORMAT, "corrupt", "lacks");
  write_handmade(path,
                 "{\"__metadata__\":{\"strata.crc32\":\"00000000\","
                 "\"strata.crc32\":\"00000000\"},\"a\":{\"dtype\":\"U8\","
                 "\"shape\":[1],\"data_offsets\":[0,1]}}",
                 1);
  expect_fail("the CRC list twice", path, ST_EFORMAT, "strata.crc32",
              "appears twice");
  write_handmade(path,
                 "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],"
                 "\"data_offsets\":[0,1]}}",
                 1);
  expect_fail("a NUL in a name", path, ST_EFORMAT, "corrupt", "escape");
  /* names up to 127 bytes are read; a longer one is refused, not cut */
  char header[512], name[130];
  for (int len = 127; len <= 128; len++) {
    memset(name, 'n', (size_t)len);
    name[len] = 0;
    snprintf(header, sizeof header,
             "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
             name);
    write_handmade(path, header, 1);
    if (len == 128) {
      expect_fail("a name of 128 bytes", path, ST_EFORMAT, "string too long",
                  NULL);
      continue;
    }
    st_safetensors *st = NULL;
    st_error err = {0};
    int rc = st_safetensors_read(&st, path, &err);
    CHECK(rc == 0 && st_safetensors_find(st, name),
          "a name of 127 bytes: rc %d %s", rc, err.msg);
    st_safetensors_destroy(st);
  }
  /* metadata entries: 1024 read (each one, across the buffers' growth),
   * 1025 refused — each costs 320 bytes however short, so a header of a
   * million tiny ones would cost gigabytes */
  for (int n = 1024; n <= 1025; n++) {
    size_t cap = 64 + 24 * (size_t)n, used = 0;
    char *big = malloc(cap);
    used += (size_t)snprintf(big, cap, "{\"__metadata__\":{");
    for (int i = 0; i < n; i++)
      used += (size_t)snprintf(big + used, cap - used, "%s\"k%d\":\"%d\"",
                               i ? "," : "", i, 7 * i);
    snprintf(big + used, cap - used, "}}");
    write_handmade(path, big, 0);
    free(big);
    if (n == 1025) {
      expect_fail("1025 metadata entries", path, ST_EFORMAT,
                  "more than 1024 metadata entries", NULL);
      continue;
    }
    st_safetensors *st = NULL;
    st_error err = {0};
    int rc = st_safetensors_read(&st, path, &err), all = rc == 0;
    for (int i = 0; all && i < n; i++) {
      char key[16], want[16];
      snprintf(key, sizeof key, "k%d", i);
      snprintf(want, sizeof want, "%d", 7 * i);
      const char *got = st_safetensors_meta(st, key);
      all = got && !strcmp(got, want);
    }
    CHECK(all && st->n_meta == n,
          "1024 metadata entries, each read back: rc %d %s", rc, err.msg);
    st_safetensors_destroy(st);
  }
  /* a header length past the specification's 100 MB, in a file that long
   * (sparse): refused before it is allocated and read */
  uint8_t len[8] = {0};
  uint64_t hlen = (100u << 20) + 8;
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)(hlen >> (8 * i));
  write_bytes(path, len, 8);
  CHECK(truncate(path, (off_t)(8 + hlen)) == 0, "truncate: %s",
        strerror(errno));
  expect_fail("a header of 100 MB and 8 bytes", path, ST_EFORMAT,
              "header length 104857608", NULL);

  st_error err = {0};
  int rc;
  /* a sharded checkpoint's index: shards lie beside it (no way up or
   * elsewhere), and it has a weight_map */
  const char *index = in_dir("model.safetensors.index.json");
  static const struct {
    const char *text, *cause;
  } bad_index[] = {
      {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "'/'"},
      {"{\"weight_map\":{\"a\":\"/etc/x.safetensors\"}}", "'/'"},
      {"{\"weight_map\":{\"a\":\"..\"}}", "'/'"},
      {"{\"metadata\":{\"total_size\":4}}", "no weight_map"},
  };
  for (size_t i = 0; i < sizeof bad_index / sizeof bad_index[0]; i++) {
    write_bytes(index, bad_index[i].text, strlen(bad_index[i].text));
    st_st_index x;
    st_error ierr = {0};
    rc = st_safetensors_index_read(index, &x, &ierr);
    CHECK(rc == ST_EFORMAT && contains(ierr.msg, index) &&
              contains(ierr.msg, bad_index[i].cause),
          "index %s: rc %d: %s", bad_index[i].text, rc, ierr.msg);
    if (!rc) st_safetensors_index_free(&x);
  }
  /* a folder whose index maps no tensor: refused, not read as one file */
  st_model *m = small_model(5);
  const char *empty = "{\"weight_map\":{}}";
  write_bytes(index, empty, strlen(empty));
  float *params = m ? calloc(m->n_params, sizeof(float)) : NULL;
  rc = m ? st_checkpoint_load(dir, m, params, NULL, NULL, NULL, &err)
         : ST_ENOMEM;
  CHECK(rc == ST_EFORMAT && contains(err.msg, "an empty weight_map"),
        "an index with an empty weight_map: rc %d: %s", rc, err.msg);
  /* an epoch far past the steps (epoch x steps per epoch overflows) */
  st_train_pos far = {.epoch = (int64_t)1 << 62,
                      .seed = 1,
                      .batch = 10,
                      .train_samples = 40,
                      .shuffle = 1};
  rc = m ? st_checkpoint_save(path, m, params, NULL, "sgd", &far, &err)
         : ST_ENOMEM;
  st_train_pos got;
  if (!rc) rc = st_checkpoint_load(path, m, params, NULL, "sgd", &got, &err);
  CHECK(rc == ST_EFORMAT && contains(err.msg, "do not describe one position"),
        "epoch 2^62 at step 0: rc %d: %s", rc, err.msg);
  free(params);
  st_model_destroy(m);
  unlink(index);
  unlink(path);
}

/* The float8 dtypes of the safetensors specification (F8_E4M3, F8_E5M2:
 * one byte an element) are read, and inspect decodes them: a file of them
 * was refused as "unknown dtype". E4M3 0x38 = 1, 0x40 = 2, 0xc0 = -2, 0x7e
 * = 448 (its largest); E5M2 0x3c = 1, 0x40 = 2, 0x7b = 57344 (its largest),
 * 0x7c = infinity. */
static void test_float8(void) {
  const char *path = in_dir("float8.safetensors");
  write_handmade(path,
                 "{\"e4\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],"
                 "\"data_offsets\":[0,4]},\"e5\":{\"dtype\":\"F8_E5M2\","
                 "\"shape\":[2,2],\"data_offsets\":[4,8]}}",
                 8);
  size_t n = 0;
  uint8_t *raw = slurp(path, &n);
  static const uint8_t values[8] = {0x38, 0x40, 0xc0, 0x7e,
                                    0x3c, 0x40, 0x7b, 0x7c};
  if (raw && n >= 8) {
    memcpy(raw + n - 8, values, 8);
    write_bytes(path, raw, n);
  }
  free(raw);
  st_safetensors *st = NULL;
  st_error err = {0};
  int rc = st_safetensors_read(&st, path, &err);
  CHECK(rc == 0 && st->n_tensors == 2 && st_safetensors_find(st, "e5"),
        "float8 tensors: rc %d %s", rc, err.msg);
  st_safetensors_destroy(st);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  rc = st_inspect(path, f, &err);
  fclose(f);
  /* %12.5g of min, max, mean and std over the finite elements */
  CHECK(rc == 0 && contains(text, "F8_E4M3 4                          -2 "
                                  "         448       112.25"),
        "inspect of F8_E4M3: rc %d %s\n%s", rc, err.msg, text ? text : "");
  CHECK(rc == 0 &&
            contains(text, "F8_E5M2 2x2                         1 "
                           "       57344        19116") &&
            contains(text, "holds 0 NaN and 1 infinities, the first at "
                           "element 3"),
        "inspect of F8_E5M2: rc %d %s\n%s", rc, err.msg, text ? text : "");
  free(text);
  unlink(path);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/strata-test-safetensors.XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 2;
  }
  test_roundtrip();
  test_crc();
  test_malformed();
  test_writer_arguments();
  test_atomic();
  test_checkpoint();
  test_inspect();
  test_inspect_against();
  test_inspect_against_inf();
  test_strict();
  test_bounds();
  test_float8();
  remove_dir();
  TH_DONE();
}
