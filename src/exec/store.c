/*
 * store.c — weight streaming's file store (execution.store: file): the
 * weights and optimizer state of a model in one file, which is also the
 * run's checkpoint.
 *
 * Layout: two 4 KiB header slots, then two copies of the state, each the
 * weights (n_params floats, or bf16 values with execution.store_weights:
 * bf16, padded to 4 bytes) then each optimizer slot (n_params floats),
 * rounded up to a page, then the gradients (n_params floats: what the
 * compute side sends, in no copy — a step's are complete before its
 * updates read them). A header names the copy that holds its step's state,
 * that state's checksum (element_sum) and the training position after that
 * step, under a CRC; opening a store checks the whole state against the
 * sum.
 *
 * A step reads the live copy and writes every updated value into the other
 * one (st_store_write); st_store_commit then syncs the data, writes the
 * header into the slot the last commit did not use, and syncs again. A
 * crash at any point leaves the newest valid header naming a copy that was
 * completely written and synced: the previous step's state, or this one's.
 * The file is made whole with no name (or a temporary one) and linked
 * (renamed) into place, so a store that exists is never half made.
 *
 * Reads go through pread, and the trainer reads the state through a shared
 * mapping, whose pages this process drops again after touching them (the
 * page cache keeps them): resident memory stays a block's worth however
 * large the store is.
 */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

/* 2: bf16 weights; 3: the committed copy's checksum; 4: the noise scale's
 * averages in the position; 5: the training set's and the tokenizer's
 * CRC-32 and data.normalize in the position (added under 4, which made
 * the stores 4 had written read as corrupt), and pipelined backprop's
 * micro-batch */
enum { SLOT_BYTES = 4096, STORE_VERSION = 5 };
/* The header holds the position as it is: another layout of it is another
 * format version (bump STORE_VERSION, then this size). */
_Static_assert(sizeof(st_train_pos) == 128,
               "st_train_pos changed: a new STORE_VERSION");
static const char MAGIC[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'W', 'S'};

/* One header slot as stored (little-endian fields, the build's layout:
 * a store moves between machines of the same kind). */
typedef struct header {
  char magic[8];
  uint32_t version, bytes;
  uint64_t seq;         /* commits so far; the newer valid slot wins */
  uint64_t fingerprint; /* the model's tensor layout */
  uint64_t n_params;
  uint32_t n_blocks, opt_slots;
  char optimizer[16];
  uint64_t data_off, copy_bytes;
  uint32_t cur;      /* the copy holding this commit's state */
  uint32_t dtype;    /* the weights': 0 fp32, 1 bf16 */
  uint32_t rounding; /* bf16: 0 to nearest, 1 stochastic */
  st_train_pos pos;  /* after the committed step */
  uint32_t sum;      /* copy cur's values: element_sum over all of them */
  uint32_t pad;
  uint32_t crc; /* of everything above */
} header;

struct st_store {
  char path[ST_PATH_MAX];
  int fd;
  const st_model *model;
  header h; /* the last committed header (the optimizer thread's) */
  /* its layout, fixed when opened: what every thread reads */
  uint64_t n_params, data_off, copy_bytes;
  uint64_t weight_bytes; /* the weights' region of a copy */
  int bf16;              /* the weights are bf16 */
  int live;  /* the copy reads come from (written, maybe uncommitted) */
  char *map; /* the whole file, shared (read-only: private) */
  size_t map_len;
  char read_only[64]; /* why it was opened read-only ("": read-write) */
  int crash_point;    /* test knob: st_store_set_crash */
  int64_t crash_step;
  /* element_sum of what this step has written into the other copy: every
   * value of it, once (st_store_write), whatever the order or thread */
  _Atomic uint32_t written;
  uint32_t unwritten; /* the values no step writes: see tie_state_sum */
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Every tensor's name, size, place and tie: stores of another layout (the
 * same count differently cut) are told apart. */
static uint64_t fingerprint(const st_model *m) {
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    h = fnv(h, &b->param_off, sizeof b->param_off);
    for (int t = 0; t < b->n_tensors; t++) {
      const st_tensor_info *ti = &b->tensors[t];
      h = fnv(h, ti->name, strlen(ti->name) + 1);
      h = fnv(h, &ti->numel, sizeof ti->numel);
      h = fnv(h, &ti->offset, sizeof ti->offset);
      h = fnv(h, &ti->tie, sizeof ti->tie);
    }
  }
  return h;
}

/* The checksum of a copy: over every value v at element e (the weights
 * 0..n-1, then each optimizer slot's n), the sum mod 2^32 of
 * fmix32(mix(e) ^ v). Order-free, so the update's threads add their
 * chunks' terms as they write them; for a given e the term is a bijection
 * of v, so a value that changes always changes the sum (a change of
 * several cancels with odds of about 2^-32, as a CRC-32 collides). */
static inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

/* n values of `width` bytes (4: fp32 bits, 2: bf16) from element e0 */
static uint32_t element_sum(uint64_t e0, const void *values, size_t n,
                            int width) {
  uint32_t sum = 0; /* 32-bit lanes: 1.7x the speed of 64-bit sums */
  while (n > 0) {   /* in runs that keep e's high half */
    uint64_t room = ((e0 >> 32) + 1) << 32;
    size_t k = room - e0 < n ? (size_t)(room - e0) : n;
    uint32_t hi = (uint32_t)(e0 >> 32) * 0x85ebca77u, lo = (uint32_t)e0;
    if (width == 4) {
      const uint32_t *v = values;
      for (size_t i = 0; i < k; i++)
        sum += fmix32(((lo + (uint32_t)i) * 0x9e3779b1u ^ hi) ^ v[i]);
    } else {
      const uint16_t *v = values;
      for (size_t i = 0; i < k; i++)
        sum += fmix32(((lo + (uint32_t)i) * 0x9e3779b1u ^ hi) ^ v[i]);
    }
    values = (const char *)values + k * (size_t)width;
    e0 += k, n -= k;
  }
  return sum;
}

static uint32_t header_crc(const header *h) {
  return (uint32_t)crc32(0, (const Bytef *)h, offsetof(header, crc));
}

static size_t page_round(size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (n + page - 1) / page * page;
}

/* pread/pwrite of all n bytes (short transfers continue; EINTR retries). */
static int io_all(int fd, int write_, void *buf, size_t n, off_t off) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = write_ ? pwrite(fd, p, n, off) : pread(fd, p, n, off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = write_ ? ENOSPC : EIO; /* EOF: a short file */
      return -1;
    }
    p += k, off += k, n -= (size_t)k;
  }
  return 0;
}

/* The weights' region of a copy: fp32 or bf16 values, padded so the
 * optimizer state after it stays aligned. */
static uint64_t weight_bytes(uint64_t n_params, uint32_t dtype) {
  return (n_params * (dtype ? 2 : 4) + 3) / 4 * 4;
}

/* element_sum of copy `copy` as the file holds it, read in pieces. */
static int copy_sum(int fd, const header *h, int copy, uint32_t *sum) {
  enum { PIECE = 1 << 18 }; /* values a read */
  uint32_t *buf = malloc(PIECE * sizeof *buf), s = 0;
  uint64_t n = h->n_params;
  if (!buf) return errno = ENOMEM, -1;
  off_t at = (off_t)(h->data_off + (uint64_t)copy * h->copy_bytes);
  int wbytes = h->dtype ? 2 : 4;
  for (uint32_t r = 0; r <= h->opt_slots; r++) {
    int width = r == 0 ? wbytes : 4;
    off_t base = r == 0 ? at
                        : at + (off_t)weight_bytes(n, h->dtype) +
                              (off_t)((r - 1) * n * sizeof(float));
    for (uint64_t lo = 0; lo < n; lo += PIECE) {
      size_t k = n - lo < PIECE ? (size_t)(n - lo) : PIECE;
      if (io_all(fd, 0, buf, k * (size_t)width, base + (off_t)(lo * width))) {
        int e = errno;
        free(buf);
        return errno = e, -1;
      }
      s += element_sum(r * n + lo, buf, k, width);
    }
  }
  free(buf);
  *sum = s;
  return 0;
}

/* The optimizer state of a tied copy is never written (the update writes
 * the copy's weights from its source's; the state is the source's): it
 * stays the zeros the store was made with, and a step's checksum counts
 * them as this constant. */
static uint32_t tie_state_sum(const st_model *m, uint32_t slots) {
  static const uint32_t zeros[1024];
  uint64_t n = m->n_params;
  uint32_t sum = 0;
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[t];
      if (ti->tie < 0) continue;
      uint64_t at = m->blocks[i].param_off + ti->offset;
      for (uint32_t r = 1; r <= slots; r++)
        for (size_t lo = 0; lo < ti->numel; lo += 1024) {
          size_t k = ti->numel - lo < 1024 ? ti->numel - lo : 1024;
          sum += element_sum(r * n + at + lo, zeros, k, 4);
        }
    }
  return sum;
}

/* The file's length: header slots, two copies, the gradients. */
static uint64_t total_bytes(const header *h) {
  return h->data_off + 2 * h->copy_bytes +
         page_round(h->n_params * sizeof(float));
}

static off_t grad_offset(const st_store *s, size_t off) {
  return (off_t)(s->data_off + 2 * s->copy_bytes + off * sizeof(float));
}

/* Element off of region (0 the weights, 1.. the optimizer slots) of copy. */
static off_t offset_of(const st_store *s, int copy, int region, size_t off) {
  uint64_t at = s->data_off + (uint64_t)copy * s->copy_bytes;
  if (region == 0) return (off_t)(at + off * (s->bf16 ? 2 : 4));
  return (off_t)(at + s->weight_bytes +
                 ((uint64_t)(region - 1) * s->n_params + off) * sizeof(float));
}

/* Drops this process's pages of [p, p + n) (whole pages inside it): the
 * page cache keeps the data, dirty or not. */
void st_store_drop(const void *p, size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)p + page - 1) / page * page;
  uintptr_t hi = ((uintptr_t)p + n) / page * page;
  if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void fill_header(header *h, const st_model *m, const st_config *cfg) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, MAGIC, sizeof MAGIC);
  h->version = STORE_VERSION;
  h->bytes = sizeof *h;
  h->fingerprint = fingerprint(m);
  h->n_params = m->n_params;
  h->n_blocks = (uint32_t)m->n_blocks;
  h->opt_slots = (uint32_t)st_optim_state_per_param(cfg);
  snprintf(h->optimizer, sizeof h->optimizer, "%s", cfg->optimizer.kind);
  h->dtype = strcmp(cfg->execution.store_weights, "bf16") == 0;
  h->rounding =
      h->dtype && strcmp(cfg->execution.store_rounding, "stochastic") == 0;
  h->data_off = 2 * SLOT_BYTES;
  h->copy_bytes =
      page_round(weight_bytes(m->n_params, h->dtype) +
                 (size_t)h->opt_slots * m->n_params * sizeof(float));
}

static const char *dtype_name(uint32_t dtype) {
  return dtype ? "bf16" : "fp32";
}

static int write_header(int fd, header *h) {
  h->crc = header_crc(h);
  char slot[SLOT_BYTES] = {0};
  memcpy(slot, h, sizeof *h);
  return io_all(fd, 1, slot, SLOT_BYTES, (off_t)(h->seq % 2) * SLOT_BYTES);
}

/* "1.50 GiB", "12.3 MiB", "200 KiB": a size in the unit that shows it */
static const char *size_text(char *buf, size_t cap, uint64_t bytes) {
  double b = (double)bytes;
  if (b >= 1u << 30)
    snprintf(buf, cap, "%.2f GiB", b / (1u << 30));
  else if (b >= 1u << 20)
    snprintf(buf, cap, "%.1f MiB", b / (1u << 20));
  else
    snprintf(buf, cap, "%.0f KiB", b / 1024);
  return buf;
}

/* A file in dir with no name (O_TMPFILE), or where the file system has
 * none, `tmp` made anew; *named says which. */
static int open_unnamed(const char *dir, const char *tmp, int *named) {
  *named = 0;
  unlink(tmp); /* a named creation killed before: its space is free again */
#ifdef O_TMPFILE
  /* linked in through /proc/self/fd (link_unnamed); without /proc only a
   * process that may read any file could link it, by its descriptor */
  if (access("/proc/self/fd", X_OK) == 0) {
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL))
      return fd;
  }
#endif
  *named = 1;
  return open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

/* The unnamed file open at fd, linked in at path: never over a store
 * another process made meanwhile (a link does not replace). */
static int link_unnamed(int fd, const char *path) {
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  return linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW);
}

/* Makes the store at path: in a file with no name yet (or, where the file
 * system cannot, under a temporary one), space reserved, weights
 * initialised block by block (train.seed, as every mode), optimizer state
 * zero, one header; synced, then linked (renamed) into place. With no
 * name, two processes making the same store at once each fill their own
 * file, and the second to finish is refused, and a creation killed leaves
 * nothing; under the one temporary name (a file system without O_TMPFILE,
 * or no /proc), the second's unlink and create under it can let the first
 * rename the second's half-made file into place, which opening then
 * refuses (its header, its checksum). */
static int create_store(const char *path, const st_model *m,
                        const st_config *cfg, st_error *err) {
  header h;
  fill_header(&h, m, cfg);
  uint64_t total = total_bytes(&h);
  char tmp[ST_PATH_MAX + 16], dir[ST_PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    snprintf(dir, sizeof dir, "/");
  else if (slash)
    *slash = '\0';
  else
    snprintf(dir, sizeof dir, ".");
  struct statvfs vfs;
  char need[32], have[32];
  if (statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < total)
    return st_error_set(
        err, ST_EIO,
        "%s: the store needs %s (two copies of %zu %s weights and "
        "their %s state, and their gradients), and %s has %s free",
        path, size_text(need, sizeof need, total), m->n_params,
        dtype_name(h.dtype), h.optimizer, dir,
        size_text(have, sizeof have, (uint64_t)vfs.f_bavail * vfs.f_frsize));
  int named;
  int fd = open_unnamed(dir, tmp, &named);
  if (fd < 0)
    return st_error_set(err, ST_EIO, "%s: cannot create: %s",
                        named ? tmp : path, strerror(errno));
  int rc = 0;
  int e = posix_fallocate(fd, 0, (off_t)total);
  if (e)
    rc = st_error_set(err, ST_EIO, "%s: cannot reserve %s for the store: %s",
                      path, size_text(need, sizeof need, total), strerror(e));
  char *map = MAP_FAILED;
  if (!rc) {
    map = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
      rc = st_error_set(err, ST_EIO, "%s: cannot map: %s", named ? tmp : path,
                        strerror(errno));
  }
  if (!rc) {
    /* bf16 weights are made in fp32 where the gradients will be (a tied
     * copy reads its source back from there), then rounded to nearest into
     * copy 0 */
    char *weights = map + h.data_off;
    float *params =
        h.dtype ? (float *)(weights + 2 * h.copy_bytes) : (float *)weights;
    for (int i = 0; i < m->n_blocks; i++) {
      const st_block *b = &m->blocks[i];
      st_model_init_blocks(m, params, cfg->train.seed, i, 1);
      if (h.dtype) {
        uint16_t *packed = (uint16_t *)weights + b->param_off;
        st_bf16_pack(params + b->param_off, packed, b->n_params);
        st_store_drop(packed, b->n_params * sizeof *packed);
      }
      st_store_drop(params + b->param_off, b->n_params * sizeof(float));
    }
    if (m->n_ties) st_store_drop(params, m->n_params * sizeof(float));
    h.seq = 1;
    h.cur = 0;
    h.pos.seed = cfg->train.seed;
    if (msync(map, (size_t)total, MS_SYNC) != 0 ||
        copy_sum(fd, &h, 0, &h.sum) || write_header(fd, &h) ||
        fdatasync(fd) != 0)
      rc = st_error_set(err, ST_EIO, "%s: cannot write: %s", named ? tmp : path,
                        strerror(errno));
  }
  if (map != MAP_FAILED) munmap(map, (size_t)total);
  if (!rc && !named && link_unnamed(fd, path) != 0)
    rc = st_error_set(err, ST_EIO, "%s: cannot link into place: %s", path,
                      strerror(errno));
  if (close(fd) != 0 && !rc)
    rc = st_error_set(err, ST_EIO, "%s: %s", named ? tmp : path,
                      strerror(errno));
  /* never over a store another process made meanwhile */
  if (!rc && named &&
      renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0)
    rc = st_error_set(err, ST_EIO, "%s: cannot rename into place: %s", path,
                      strerror(errno));
  if (rc) {
    if (named) unlink(tmp);
    return rc;
  }
  return st_sync_dir(dir, err);
}

/* The newer valid header slot of the store open at fd (path: for the
 * message), whatever model it holds, or an error saying why neither is. */
static int newest_slot(int fd, const char *path, header *out, st_error *err) {
  header best = {0}, h;
  int found = 0, marked = 0;  /* valid slots; slots with the magic */
  int cut = 0;                /* a slot with the magic, cut short */
  uint32_t other_version = 0; /* a slot of another format version */
  for (int k = 0; k < 2; k++) {
    char slot[SLOT_BYTES] = {0};
    ssize_t got;
    do got = pread(fd, slot, SLOT_BYTES, (off_t)k * SLOT_BYTES);
    while (got < 0 && errno == EINTR);
    if (got < (ssize_t)sizeof MAGIC) continue;
    memcpy(&h, slot, sizeof h);
    if (memcmp(h.magic, MAGIC, sizeof MAGIC) != 0) continue;
    marked = 1;
    if (got < SLOT_BYTES) { /* the file ends inside it */
      cut = 1;
      continue;
    }
    if (h.version != STORE_VERSION) other_version = h.version;
    if (h.version != STORE_VERSION || h.bytes != sizeof h ||
        h.crc != header_crc(&h) || h.seq % 2 != (uint64_t)k || h.cur > 1)
      continue;
    if (!found || h.seq > best.seq) best = h;
    found = 1;
  }
  if (!found && other_version)
    return st_error_set(err, ST_EDATA,
                        "%s: a store of format version %u; this strata "
                        "reads version %d (export it with the strata that "
                        "wrote it)",
                        path, other_version, STORE_VERSION);
  /* ST_EFORMAT: no store at all (the CLI never writes over such a file);
   * ST_EDATA: a store, damaged */
  struct stat st;
  if (!found && cut && fstat(fd, &st) == 0)
    return st_error_set(err, ST_EDATA,
                        "%s: truncated: %lld bytes, less than the store's two "
                        "header slots (%d)",
                        path, (long long)st.st_size, 2 * SLOT_BYTES);
  if (!found && !marked)
    return st_error_set(err, ST_EFORMAT, "%s: not a strata weight store", path);
  if (!found)
    return st_error_set(err, ST_EDATA,
                        "%s: no valid header (both header slots fail their "
                        "checksum): the store is corrupt",
                        path);
  *out = best;
  return 0;
}

int st_store_committed_step(const char *path, int64_t *step, st_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", path,
                        strerror(errno));
  header h;
  int rc = newest_slot(fd, path, &h, err);
  close(fd);
  if (!rc) *step = h.pos.step;
  return rc;
}

/* The newer valid header, checked against the model and config the store
 * is opened for, and the layout it gives s. */
static int read_header(st_store *s, const st_model *m, const st_config *cfg,
                       off_t size, st_error *err) {
  header best;
  int rc = newest_slot(s->fd, s->path, &best, err);
  if (rc) return rc;
  header want;
  fill_header(&want, m, cfg);
  if (best.n_params != want.n_params || best.n_blocks != want.n_blocks)
    return st_error_set(err, ST_ECONFIG,
                        "%s: the store holds a model of %llu parameters in %u "
                        "blocks; this config's model has %zu in %d",
                        s->path, (unsigned long long)best.n_params,
                        best.n_blocks, m->n_params, m->n_blocks);
  if (best.fingerprint != want.fingerprint)
    return st_error_set(err, ST_ECONFIG,
                        "%s: the store holds another model of the same size "
                        "(its tensors' names or layout differ from this "
                        "config's)",
                        s->path);
  if (best.dtype != want.dtype)
    return st_error_set(err, ST_ECONFIG,
                        "%s: the store holds %s weights; this config's "
                        "execution.store_weights is %s",
                        s->path, dtype_name(best.dtype),
                        dtype_name(want.dtype));
  if (best.rounding != want.rounding)
    return st_error_set(err, ST_ECONFIG,
                        "%s: the store's bf16 weights were rounded %s; this "
                        "config's execution.store_rounding is %s (a change "
                        "would not continue the same run)",
                        s->path,
                        best.rounding ? "stochastically" : "to nearest",
                        want.rounding ? "stochastic" : "nearest");
  if (strcmp(best.optimizer, want.optimizer) != 0 ||
      best.opt_slots != want.opt_slots)
    return st_error_set(err, ST_ECONFIG,
                        "%s: the store holds %s state; this config's "
                        "optimizer.kind is %s",
                        s->path, best.optimizer, want.optimizer);
  if (best.data_off != want.data_off || best.copy_bytes != want.copy_bytes)
    return st_error_set(err, ST_EDATA, "%s: the header's layout is corrupt",
                        s->path);
  uint64_t total = total_bytes(&want);
  if ((uint64_t)size < total)
    return st_error_set(err, ST_EDATA,
                        "%s: truncated: %lld bytes, and this model's store "
                        "has %llu",
                        s->path, (long long)size, (unsigned long long)total);
  s->h = best;
  s->n_params = best.n_params;
  s->data_off = best.data_off;
  s->copy_bytes = best.copy_bytes;
  s->bf16 = best.dtype == 1;
  s->weight_bytes = weight_bytes(best.n_params, best.dtype);
  s->live = (int)best.cur;
  return 0;
}

int st_store_open(st_store **out, const char *path, const st_model *m,
                  const st_config *cfg, st_error *err) {
  *out = NULL;
  struct stat st;
  int rc = 0, made = 0;
  if (stat(path, &st) != 0) {
    if (errno != ENOENT)
      return st_error_set(err, ST_EIO, "%s: %s", path, strerror(errno));
    if ((rc = create_store(path, m, cfg, err))) return rc;
    made = 1;
  }
  st_store *s = calloc(1, sizeof *s);
  if (!s) return st_error_set(err, ST_ENOMEM, "out of memory");
  snprintf(s->path, sizeof s->path, "%s", path);
  s->model = m;
  s->map = MAP_FAILED;
  s->fd = open(path, O_RDWR | O_CLOEXEC);
  /* on a read-only file system, or a file this user may only read, the
   * store can still be read (export): writes are refused, saying why */
  if (s->fd < 0 && (errno == EROFS || errno == EACCES)) {
    snprintf(s->read_only, sizeof s->read_only, "%s", strerror(errno));
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
  }
  if (s->fd < 0) {
    rc =
        st_error_set(err, ST_EIO, "%s: cannot open: %s", path, strerror(errno));
    goto fail;
  }
  /* one run per store: two writers would corrupt it */
  if (flock(s->fd, (s->read_only[0] ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    rc = errno == EWOULDBLOCK
             ? st_error_set(err, ST_EIO, "%s: in use by another process", path)
             : st_error_set(err, ST_EIO, "%s: cannot lock: %s", path,
                            strerror(errno));
    goto fail;
  }
  if (fstat(s->fd, &st) != 0) {
    rc = st_error_set(err, ST_EIO, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if ((rc = read_header(s, m, cfg, st.st_size, err))) goto fail;
  s->unwritten = tie_state_sum(m, s->h.opt_slots);
  /* every value of the committed copy, against the header's checksum: a
   * bit the disk flipped is found here, not trained on (a store made just
   * now was summed from its bytes as it was made: not read twice) */
  uint32_t sum = s->h.sum;
  if (!made && copy_sum(s->fd, &s->h, s->live, &sum)) {
    rc =
        st_error_set(err, ST_EIO, "%s: read failed: %s", path, strerror(errno));
    goto fail;
  }
  if (sum != s->h.sum) {
    rc = st_error_set(err, ST_EDATA,
                      "%s: the state of step %lld is damaged: its values' "
                      "checksum is %08x, the header lists %08x",
                      path, (long long)s->h.pos.step, sum, s->h.sum);
    goto fail;
  }
  s->map_len = (size_t)total_bytes(&s->h);
  s->map = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE,
                s->read_only[0] ? MAP_PRIVATE : MAP_SHARED, s->fd, 0);
  if (s->map == MAP_FAILED) {
    rc = st_error_set(err, ST_EIO, "%s: cannot map: %s", path, strerror(errno));
    goto fail;
  }
  *out = s;
  return 0;
fail:
  st_store_close(s);
  return rc;
}

void st_store_close(st_store *s) {
  if (!s) return;
  if (s->map != MAP_FAILED) munmap(s->map, s->map_len);
  if (s->fd >= 0) close(s->fd); /* releases the lock */
  free(s);
}

const char *st_store_path(const st_store *s) { return s->path; }

const st_train_pos *st_store_pos(const st_store *s) { return &s->h.pos; }

void *st_store_slab(const st_store *s, int region) {
  return s->map + offset_of(s, s->live, region, 0);
}

int st_store_bf16(const st_store *s) { return s->bf16; }

enum { CONVERT = 1 << 14 }; /* bf16 values converted per pread/pwrite */

/* n bf16 weights at file offset at, widened into dst (write 0), or dst's
 * values narrowed and written there (write 1; they are bf16 values
 * already: the update rounded them). */
static int bf16_io(int fd, int write_, float *dst, size_t n, off_t at,
                   uint64_t e0, uint32_t *sum) {
  uint16_t h[CONVERT];
  for (size_t lo = 0; lo < n; lo += CONVERT) {
    size_t k = n - lo < CONVERT ? n - lo : CONVERT;
    off_t where = at + (off_t)(lo * sizeof *h);
    if (write_) st_bf16_pack(dst + lo, h, k);
    if (write_) *sum += element_sum(e0 + lo, h, k, 2);
    if (io_all(fd, write_, h, k * sizeof *h, where)) return -1;
    if (!write_) st_bf16_unpack(h, dst + lo, k);
  }
  return 0;
}

int st_store_live(const st_store *s) { return s->live; }

int st_store_read(const st_store *s, int region, size_t off, size_t n,
                  float *dst, st_error *err) {
  off_t at = offset_of(s, s->live, region, off);
  if (region == 0 && s->bf16 ? !bf16_io(s->fd, 0, dst, n, at, 0, NULL)
                             : !io_all(s->fd, 0, dst, n * sizeof(float), at))
    return 0;
  return st_error_set(err, ST_EIO, "%s: read failed: %s", s->path,
                      strerror(errno));
}

/* A store opened read-only is read (export), never updated. */
static int refuse_write(const st_store *s, st_error *err) {
  return st_error_set(err, ST_EIO,
                      "%s: opened read-only (%s): a run cannot update it",
                      s->path, s->read_only);
}

int st_store_write(const st_store *s, int region, size_t off, size_t n,
                   const float *src, st_error *err) {
  if (s->read_only[0]) return refuse_write(s, err);
  off_t at = offset_of(s, 1 - s->live, region, off);
  uint64_t e0 = (uint64_t)region * s->n_params + off;
  uint32_t sum = 0;
  int ok = region == 0 && s->bf16
               ? !bf16_io(s->fd, 1, (float *)src, n, at, e0, &sum)
               : !io_all(s->fd, 1, (void *)src, n * sizeof(float), at);
  if (ok && !(region == 0 && s->bf16)) sum = element_sum(e0, src, n, 4);
  if (ok) { /* the store's count, not its layout: const to the caller */
    atomic_fetch_add_explicit((_Atomic uint32_t *)&s->written, sum,
                              memory_order_relaxed);
    return 0;
  }
  return st_error_set(err, ST_EIO, "%s: write failed: %s", s->path,
                      strerror(errno));
}

float *st_store_grads(const st_store *s) {
  return (float *)(s->map + grad_offset(s, 0));
}

int st_store_grad_io(const st_store *s, int write, size_t off, size_t n,
                     float *buf, st_error *err) {
  if (write && s->read_only[0]) return refuse_write(s, err);
  if (!io_all(s->fd, write, buf, n * sizeof(float), grad_offset(s, off)))
    return 0;
  return st_error_set(err, ST_EIO, "%s: gradient %s failed: %s", s->path,
                      write ? "write" : "read", strerror(errno));
}

void st_store_advance(st_store *s) { s->live = 1 - s->live; }

void st_store_set_crash(st_store *s, int64_t step, int point) {
  s->crash_step = step;
  s->crash_point = point;
}

int st_store_crash_point(const st_store *s, int64_t step) {
  return s->crash_step == step ? s->crash_point : 0;
}

int st_store_commit(st_store *s, int copy, const st_train_pos *pos,
                    st_error *err) {
  if (s->read_only[0]) return refuse_write(s, err);
  /* a file removed under the run still takes writes and syncs, but what
   * it commits goes when this process does: stop, rather than report
   * steps committed that no resume can find */
  struct stat st;
  if (fstat(s->fd, &st) == 0 && st.st_nlink == 0)
    return st_error_set(err, ST_EIO,
                        "%s: the store file was removed while the run was "
                        "using it: no step can be committed (start the run "
                        "again)",
                        s->path);
  if (fdatasync(s->fd) != 0)
    return st_error_set(err, ST_EIO,
                        "%s: sync failed: %s (the previous "
                        "step's state is intact)",
                        s->path, strerror(errno));
  if (st_store_crash_point(s, pos->step - 1) == ST_CRASH_BEFORE_HEADER)
    raise(SIGKILL);
  header h = s->h;
  h.seq++;
  h.cur = (uint32_t)copy;
  h.pos = *pos;
  /* every write of the step is done (the caller waited for them) */
  h.sum = atomic_exchange_explicit(&s->written, 0, memory_order_acquire) +
          s->unwritten;
  if (write_header(s->fd, &h) || fdatasync(s->fd) != 0)
    return st_error_set(err, ST_EIO,
                        "%s: cannot write the header: %s (the "
                        "previous step's state is intact)",
                        s->path, strerror(errno));
  s->h = h;
  if (st_store_crash_point(s, pos->step - 1) == ST_CRASH_AFTER_HEADER)
    raise(SIGKILL);
  return 0;
}
