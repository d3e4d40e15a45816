/*
 * checkpoint.c — model checkpoints as safetensors: every parameter under its
 * tensor name (PyTorch layouts, so torch / safetensors read them directly),
 * the optimizer state as "optim.<name>.<slot>", and the training position in
 * the metadata. Written atomically; on load every tensor's presence, dtype
 * and shape is checked and a mismatch names the tensor.
 */
#include "strata.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static const char *slot_name(const char *optim_kind, int slot) {
  if (strcmp(optim_kind, "adamw") == 0) return slot ? "exp_avg_sq" : "exp_avg";
  return "momentum";
}

static int slots(const char *optim_kind) {
  return strcmp(optim_kind, "adamw") == 0 ? 2 : 1;
}

/* The integer fields of st_train_pos as metadata keys, with the smallest
 * value each may take (a hand-edited or corrupt file is refused, never
 * trusted as an index). */
static const struct {
  const char *key;
  size_t offset;
  int64_t min;
} pos_keys[] = {
    {"step", offsetof(st_train_pos, step), 0},
    {"epoch", offsetof(st_train_pos, epoch), 0},
    {"epoch_pos", offsetof(st_train_pos, epoch_pos), 0},
    {"samples", offsetof(st_train_pos, samples), 0},
    {"batch", offsetof(st_train_pos, batch), 1},
    {"train_samples", offsetof(st_train_pos, train_samples), 1},
    {"shuffle", offsetof(st_train_pos, shuffle), 0},
};
enum { N_POS_KEYS = sizeof pos_keys / sizeof pos_keys[0] };

static int add_meta_i64(st_st_writer *w, const char *key, int64_t v,
                        st_error *err) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  return st_st_writer_meta(w, key, buf, err);
}

/* A CRC-32 as 8 hex digits (read_crc reads it back). */
static int add_crc(st_st_writer *w, const char *key, uint32_t crc,
                   st_error *err) {
  char text[16];
  snprintf(text, sizeof text, "%08x", (unsigned)crc);
  return st_st_writer_meta(w, key, text, err);
}

/* The noise scale's averages (st_train_pos), where the run keeps some:
 * 17 significant digits read back as the same double. */
static const struct {
  const char *key;
  size_t offset;
} noise_keys[] = {
    {"noise_g2", offsetof(st_train_pos, noise_g2)},
    {"noise_trace", offsetof(st_train_pos, noise_trace)},
    {"noise_weight", offsetof(st_train_pos, noise_weight)},
};
enum { N_NOISE_KEYS = sizeof noise_keys / sizeof noise_keys[0] };

static int add_noise(st_st_writer *w, const st_train_pos *pos, st_error *err) {
  int rc = add_meta_i64(w, "noise_n", pos->noise_n, err);
  for (int k = 0; !rc && k < N_NOISE_KEYS; k++) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g",
             *(const double *)((const char *)pos + noise_keys[k].offset));
    rc = st_st_writer_meta(w, noise_keys[k].key, buf, err);
  }
  return rc;
}

int st_checkpoint_save(const char *path, const st_model *m, const float *params,
                       const float *opt_state, const char *optim_kind,
                       const st_train_pos *pos, st_error *err) {
  return st_checkpoint_save_as(path, m, params, "F32", opt_state, optim_kind,
                               pos, err);
}

/* The file's tensors in order: the weights (slot -1), then each optimizer
 * slot's; fn(arg, slot, tensor, its slab offset) until one fails. Tied
 * copies are not stored (their source is). */
typedef int (*tensor_fn)(void *arg, int slot, const st_tensor_info *ti,
                         size_t off, st_error *err);
static int each_tensor(const st_model *m, int ns, const unsigned char *mine,
                       tensor_fn fn, void *arg, st_error *err) {
  for (int s = -1; s < ns; s++)
    for (int i = 0; i < m->n_blocks; i++) {
      const st_block *b = &m->blocks[i];
      if (mine && !mine[i]) continue;
      for (int t = 0; t < b->n_tensors; t++) {
        if (b->tensors[t].tie >= 0) continue;
        int rc = fn(arg, s, &b->tensors[t], b->param_off + b->tensors[t].offset,
                    err);
        if (rc) return rc;
      }
    }
  return 0;
}

typedef struct each_arg {
  st_checkpoint_fn fn;
  void *arg;
} each_arg;

static int each_call(void *arg, int slot, const st_tensor_info *ti, size_t off,
                     st_error *err) {
  each_arg *e = arg;
  return e->fn(e->arg, slot, off, ti->numel, err);
}

int st_checkpoint_each(const st_model *m, const char *optim_kind,
                       st_checkpoint_fn fn, void *arg, st_error *err) {
  each_arg e = {fn, arg};
  return each_tensor(m, optim_kind ? slots(optim_kind) : 0, NULL, each_call, &e,
                     err);
}

/* Builds the file: each tensor added with its data where the caller gave
 * slabs (params in wsize-byte elements), NULL where fetched. */
typedef struct saving {
  st_st_writer *w;
  const char *optim_kind, *params_dtype;
  const void *params;
  const float *opt;
  size_t wsize, n_params;
  int fetched;
  struct {
    int slot;
    size_t off, numel;
  } * at; /* per tensor added: where it lies (fetched) */
  int n;
  st_checkpoint_fetch fetch;
  void *fetch_arg;
  const unsigned char *mine; /* the blocks to write (NULL: all) */
} saving;

static int add_tensor(void *arg, int slot, const st_tensor_info *ti, size_t off,
                      st_error *err) {
  saving *sv = arg;
  char name[ST_NAME_MAX + 32];
  const void *data = NULL;
  if (slot < 0) {
    snprintf(name, sizeof name, "%s", ti->name);
    if (!sv->fetched) data = (const char *)sv->params + off * sv->wsize;
  } else {
    snprintf(name, sizeof name, "optim.%s.%s", ti->name,
             slot_name(sv->optim_kind, slot));
    if (!sv->fetched) data = sv->opt + (size_t)slot * sv->n_params + off;
  }
  sv->at[sv->n].slot = slot;
  sv->at[sv->n].off = off;
  sv->at[sv->n++].numel = ti->numel;
  return st_st_writer_add(sv->w, name, slot < 0 ? sv->params_dtype : "F32",
                          ti->ndim, ti->dims, data, err);
}

static const void *fetch_tensor(void *arg, int index, st_error *err) {
  saving *sv = arg;
  return sv->fetch(sv->fetch_arg, sv->at[index].slot, sv->at[index].off,
                   sv->at[index].numel, err);
}

static int save(const char *path, const st_model *m, saving *sv, int ns,
                const st_train_pos *pos, st_error *err) {
  sv->w = st_st_writer_create();
  sv->at = malloc((size_t)(m->n_tensors * (ns + 1) + 1) * sizeof *sv->at);
  sv->n_params = m->n_params;
  if (!sv->w || !sv->at) {
    st_st_writer_destroy(sv->w);
    free(sv->at);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  st_st_writer *w = sv->w;
  int rc = each_tensor(m, ns, sv->mine, add_tensor, sv, err);
  if (!rc) rc = st_st_writer_meta(w, "format", "strata-checkpoint", err);
  if (!rc) rc = st_st_writer_meta(w, "version", "1", err);
  if (!rc) rc = st_st_writer_meta(w, "model", m->kind, err);
  if (!rc) rc = st_st_writer_meta(w, "optimizer", sv->optim_kind, err);
  if (!rc && pos) {
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, pos->seed);
    rc = st_st_writer_meta(w, "seed", seed, err);
    for (int k = 0; !rc && k < N_POS_KEYS; k++)
      rc = add_meta_i64(
          w, pos_keys[k].key,
          *(const int64_t *)((const char *)pos + pos_keys[k].offset), err);
    if (!rc && pos->noise_n > 0) rc = add_noise(w, pos, err);
    if (!rc && pos->has_train_crc)
      rc = add_crc(w, "train_crc", pos->train_crc, err);
    if (!rc && pos->has_tokenizer_crc)
      rc = add_crc(w, "tokenizer_crc", pos->tokenizer_crc, err);
    if (!rc && pos->has_normalize)
      rc = st_st_writer_meta(w, "normalize", pos->normalize ? "1" : "0", err);
    if (!rc && pos->pb_micro_batch > 0)
      rc = add_meta_i64(w, "pb_micro_batch", pos->pb_micro_batch, err);
  }
  if (!rc)
    rc = st_st_writer_write_fetch(w, path, sv->fetched ? fetch_tensor : NULL,
                                  sv, err);
  free(sv->at);
  st_st_writer_destroy(w);
  return rc;
}

int st_checkpoint_save_as(const char *path, const st_model *m,
                          const void *params, const char *params_dtype,
                          const float *opt_state, const char *optim_kind,
                          const st_train_pos *pos, st_error *err) {
  saving sv = {.optim_kind = optim_kind,
               .params_dtype = params_dtype,
               .params = params,
               .opt = opt_state,
               .wsize = strcmp(params_dtype, "BF16") == 0 ? 2 : sizeof(float)};
  return save(path, m, &sv, opt_state ? slots(optim_kind) : 0, pos, err);
}

int st_checkpoint_save_shard(const char *path, const st_model *m,
                             const float *params, const float *opt_state,
                             const char *optim_kind, const st_train_pos *pos,
                             const unsigned char *mine, st_error *err) {
  saving sv = {.optim_kind = optim_kind,
               .params_dtype = "F32",
               .params = params,
               .opt = opt_state,
               .wsize = sizeof(float),
               .mine = mine};
  return save(path, m, &sv, slots(optim_kind), pos, err);
}

void st_checkpoint_shard_name(char *out, size_t cap, int shard, int shards) {
  snprintf(out, cap, "model-%05d-of-%05d.safetensors", shard + 1, shards);
}

/* The index's entries: each tensor and its shard's file. */
typedef struct indexing {
  FILE *f;
  const st_model *m;
  const char *optim_kind;
  const int *shard_of;
  int shards, n;
  double bytes;
} indexing;

static int index_entry(void *arg, int slot, const st_tensor_info *ti,
                       size_t off, st_error *err) {
  (void)err;
  indexing *x = arg;
  int block = 0;
  while (block + 1 < x->m->n_blocks && x->m->blocks[block + 1].param_off <= off)
    block++;
  char file[64];
  st_checkpoint_shard_name(file, sizeof file, x->shard_of[block], x->shards);
  fprintf(x->f, "%s\n    \"%s%s%s%s\": \"%s\"", x->n++ ? "," : "",
          slot < 0 ? "" : "optim.", ti->name, slot < 0 ? "" : ".",
          slot < 0 ? "" : slot_name(x->optim_kind, slot), file);
  x->bytes += 4.0 * (double)ti->numel;
  return 0;
}

int st_checkpoint_write_index(const char *dir, const st_model *m,
                              const char *optim_kind, const int *shard_of,
                              int shards, const st_train_pos *pos,
                              st_error *err) {
  char *text = NULL, path[ST_PATH_MAX + 48];
  size_t len = 0;
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "out of memory");
  /* the weight map first, to know the total; then the whole file */
  indexing x = {f, m, optim_kind, shard_of, shards, 0, 0};
  fprintf(f, "  \"weight_map\": {");
  int rc = each_tensor(m, slots(optim_kind), NULL, index_entry, &x, err);
  fprintf(f, "\n  }\n}\n");
  if (fclose(f) != 0 || !text) {
    free(text);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  char *whole = NULL;
  size_t whole_len = 0;
  FILE *g = open_memstream(&whole, &whole_len);
  if (!g) {
    free(text);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  fprintf(g,
          "{\n  \"metadata\": {\"total_size\": %.0f, \"format\": "
          "\"strata-checkpoint\", \"model\": \"%s\", \"optimizer\": \"%s\", "
          "\"shards\": %d, \"step\": %lld},\n%s",
          x.bytes, m->kind, optim_kind, shards,
          pos ? (long long)pos->step : 0LL, text);
  free(text);
  if (!rc)
    rc = st_write_stream_atomic(g, &whole, &whole_len, path, err);
  else {
    fclose(g);
    free(whole);
  }
  return rc;
}

int st_checkpoint_save_sharded(const char *dir, const st_model *m,
                               const float *params, const float *opt_state,
                               const char *optim_kind, const st_train_pos *pos,
                               st_error *err) {
  char shard[ST_PATH_MAX + 64], name[64];
  int *shard_of = calloc((size_t)m->n_blocks, sizeof *shard_of);
  int rc = shard_of ? st_mkdir_p(dir, 1, err)
                    : st_error_set(err, ST_ENOMEM, "out of memory");
  st_checkpoint_shard_name(name, sizeof name, 0, 1);
  snprintf(shard, sizeof shard, "%s/%s", dir, name);
  if (!rc)
    rc = st_checkpoint_save_shard(shard, m, params, opt_state, optim_kind, pos,
                                  NULL, err);
  if (!rc)
    rc = st_checkpoint_write_index(dir, m, optim_kind, shard_of, 1, pos, err);
  free(shard_of);
  return rc;
}

int st_checkpoint_save_fetch(const char *path, const st_model *m,
                             const char *optim_kind, const st_train_pos *pos,
                             st_checkpoint_fetch fetch, void *arg,
                             st_error *err) {
  saving sv = {.optim_kind = optim_kind,
               .params_dtype = "F32",
               .wsize = sizeof(float),
               .fetched = 1,
               .fetch = fetch,
               .fetch_arg = arg};
  return save(path, m, &sv, slots(optim_kind), pos, err);
}

/* Finds one named F32 tensor of the expected shape; NULL with an error
 * naming the tensor otherwise. */
static const st_st_tensor *find_tensor(const st_safetensors *st,
                                       const char *name,
                                       const st_tensor_info *ti, int weights,
                                       st_error *err) {
  const st_st_tensor *t = st_safetensors_find(st, name);
  if (!t) {
    st_error_set(err, ST_EFORMAT, "%s: tensor '%s' is missing", st->path, name);
    return NULL;
  }
  /* weights may be bf16 (a bf16 store's export); optimizer state not */
  int same = (strcmp(t->dtype, "F32") == 0 ||
              (weights && strcmp(t->dtype, "BF16") == 0)) &&
             t->ndim == ti->ndim;
  for (int d = 0; same && d < ti->ndim; d++) same = t->dims[d] == ti->dims[d];
  if (!same) {
    char want[64] = "", got[64] = "";
    for (int d = 0; d < ti->ndim; d++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld",
               d ? "x" : "", (long long)ti->dims[d]);
    for (int d = 0; d < t->ndim; d++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld",
               d ? "x" : "", (long long)t->dims[d]);
    st_error_set(err, ST_EFORMAT,
                 "%s: tensor '%s' is %s %s, the model needs F32 %s", st->path,
                 name, t->dtype, got, want);
    return NULL;
  }
  return t;
}

static int meta_i64(const st_safetensors *st, const char *key, int64_t min,
                    int64_t *v, st_error *err) {
  const char *s = st_safetensors_meta(st, key);
  char *end = NULL;
  errno = 0;
  if (s) *v = strtoll(s, &end, 10);
  if (s && end != s && !*end && errno == ERANGE)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata '%s' is %.32s, out of range: corrupt "
                        "checkpoint",
                        st->path, key, s);
  if (!s || end == s || *end)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata '%s' is missing or not an integer: not a "
                        "strata training checkpoint",
                        st->path, key);
  if (*v < min)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata '%s' is %lld, below its minimum %lld: "
                        "corrupt checkpoint",
                        st->path, key, (long long)*v, (long long)min);
  return 0;
}

/* The noise scale's averages, when the checkpoint keeps them: all four
 * keys, finite, the weight a bias correction in (0, 1]. */
static int read_noise(const st_safetensors *st, st_train_pos *p,
                      st_error *err) {
  if (!st_safetensors_meta(st, "noise_n")) return 0;
  int rc = meta_i64(st, "noise_n", 1, &p->noise_n, err);
  for (int k = 0; !rc && k < N_NOISE_KEYS; k++) {
    const char *s = st_safetensors_meta(st, noise_keys[k].key);
    char *end = NULL;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || end == s || *end || !isfinite(v) ||
        (k == N_NOISE_KEYS - 1 && !(v > 0 && v <= 1)))
      return st_error_set(err, ST_EFORMAT,
                          "%s: metadata '%s' is %.32s, not %s: corrupt "
                          "checkpoint",
                          st->path, noise_keys[k].key, s ? s : "missing",
                          k == N_NOISE_KEYS - 1 ? "a weight in (0, 1]"
                                                : "a finite number");
    *(double *)((char *)p + noise_keys[k].offset) = v;
  }
  return rc;
}

/* Metadata `key` as add_crc writes it into *crc, *has 1; absent: *has 0. */
static int read_crc(const st_safetensors *st, const char *key, uint32_t *crc,
                    uint32_t *has, st_error *err) {
  const char *text = st_safetensors_meta(st, key);
  *has = 0;
  if (!text) return 0;
  if (strlen(text) != 8 || strspn(text, "0123456789abcdef") != 8)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata '%s' is %.32s, not 8 hex digits: "
                        "corrupt checkpoint",
                        st->path, key, text);
  *crc = (uint32_t)strtoul(text, NULL, 16);
  *has = 1;
  return 0;
}

/* Metadata 'normalize', where recorded: "0" or "1". */
static int read_normalize(const st_safetensors *st, uint32_t *v, uint32_t *has,
                          st_error *err) {
  const char *text = st_safetensors_meta(st, "normalize");
  *has = 0;
  if (!text) return 0;
  if (strcmp(text, "0") != 0 && strcmp(text, "1") != 0)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata 'normalize' is %.32s, not 0 or 1: "
                        "corrupt checkpoint",
                        st->path, text);
  *v = text[0] == '1';
  *has = 1;
  return 0;
}

static int read_pos(const st_safetensors *st, st_train_pos *pos,
                    st_error *err) {
  st_train_pos p = {0};
  for (int k = 0; k < N_POS_KEYS; k++) {
    int rc = meta_i64(st, pos_keys[k].key, pos_keys[k].min,
                      (int64_t *)((char *)&p + pos_keys[k].offset), err);
    if (rc) return rc;
  }
  const char *seed = st_safetensors_meta(st, "seed");
  char *end = NULL;
  if (seed) p.seed = strtoull(seed, &end, 10);
  if (!seed || end == seed || *end)
    return st_error_set(err, ST_EFORMAT, "%s: metadata 'seed' is missing",
                        st->path);
  if (p.epoch_pos > p.train_samples)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata 'epoch_pos' %lld exceeds the %lld "
                        "training samples: corrupt checkpoint",
                        st->path, (long long)p.epoch_pos,
                        (long long)p.train_samples);
  /* the position is one step count seen three ways: each step takes a
   * batch, an epoch has train_samples / batch of them */
  int64_t per_epoch = p.train_samples / p.batch;
  int consistent = p.epoch_pos % p.batch == 0 && per_epoch > 0 &&
                   p.step <= INT64_MAX / p.batch &&
                   p.samples == p.step * p.batch &&
                   p.epoch <= p.step / per_epoch &&
                   p.step == p.epoch * per_epoch + p.epoch_pos / p.batch;
  if (!consistent)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata step %lld, epoch %lld, epoch_pos %lld "
                        "and samples %lld do not describe one position at "
                        "batch %lld over %lld samples: corrupt checkpoint",
                        st->path, (long long)p.step, (long long)p.epoch,
                        (long long)p.epoch_pos, (long long)p.samples,
                        (long long)p.batch, (long long)p.train_samples);
  int rc = read_noise(st, &p, err);
  if (rc) return rc;
  /* the training set's and the tokenizer's CRC-32, where recorded */
  if ((rc = read_crc(st, "train_crc", &p.train_crc, &p.has_train_crc, err)) ||
      (rc = read_crc(st, "tokenizer_crc", &p.tokenizer_crc,
                     &p.has_tokenizer_crc, err)) ||
      (rc = read_normalize(st, &p.normalize, &p.has_normalize, err)))
    return rc;
  /* pipelined backprop's micro-batch, where recorded: at least 1 */
  if (st_safetensors_meta(st, "pb_micro_batch") &&
      (rc = meta_i64(st, "pb_micro_batch", 1, &p.pb_micro_batch, err)))
    return rc;
  *pos = p;
  return 0;
}

/* Visits every tensor the load needs: slot -1 is the weights, 0.. the
 * optimizer slots. With copy == 0 it only checks; with 1 it reads those of
 * the blocks `mine` marks (NULL: all). */
/* What a checkpoint is read from: one file, or a sharded checkpoint's
 * directory — its index and a shard per file the index names (headers
 * only: tensors are read where they go). */
typedef struct source {
  st_safetensors **parts;
  int n;
  st_st_index index; /* n == 0: one file */
  int *part_of;      /* the part of index entry i */
  char index_path[ST_PATH_MAX + 48];
} source;

static void source_close(source *src) {
  for (int i = 0; i < src->n; i++) st_safetensors_destroy(src->parts[i]);
  free(src->parts);
  free(src->part_of);
  st_safetensors_index_free(&src->index);
}

static int source_open(source *src, const char *path, st_error *err) {
  memset(src, 0, sizeof *src);
  struct stat sb;
  int dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
  if (!dir) {
    if (!(src->parts = malloc(sizeof *src->parts)))
      return st_error_set(err, ST_ENOMEM, "out of memory");
    int rc = st_safetensors_open(&src->parts[0], path, err);
    src->n = !rc;
    return rc;
  }
  snprintf(src->index_path, sizeof src->index_path,
           "%s/model.safetensors.index.json", path);
  if (access(src->index_path, F_OK) != 0)
    return st_error_set(err, ST_EFORMAT,
                        "%s: no model.safetensors.index.json: not a "
                        "checkpoint, or one whose writing was cut short",
                        path);
  int rc = st_safetensors_index_read(src->index_path, &src->index, err);
  int n = src->index.n;
  int *first = NULL; /* part k's first index entry */
  if (!rc && (!(src->parts = calloc((size_t)n + 1, sizeof *src->parts)) ||
              !(src->part_of = malloc(((size_t)n + 1) * sizeof(int))) ||
              !(first = malloc(((size_t)n + 1) * sizeof(int)))))
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
  for (int i = 0; !rc && i < n; i++) {
    const char *file = src->index.files[i];
    int k = 0;
    while (k < src->n && strcmp(src->index.files[first[k]], file) != 0) k++;
    if (k == src->n) { /* a shard not opened yet */
      char shard[2 * ST_PATH_MAX];
      snprintf(shard, sizeof shard, "%s/%s", path, file);
      if ((rc = st_safetensors_open(&src->parts[k], shard, err))) break;
      first[k] = i;
      src->n++;
    }
    src->part_of[i] = k;
  }
  free(first);
  if (!rc && src->n == 0)
    rc = st_error_set(err, ST_EFORMAT, "%s: an empty weight_map",
                      src->index_path);
  return rc;
}

/* The file holding tensor `name`: the one file, or the shard the index
 * names (NULL, err set, if it names none). */
static const st_safetensors *locate(const source *src, const char *name,
                                    st_error *err) {
  if (!src->index.n) return src->parts[0];
  for (int i = 0; i < src->index.n; i++)
    if (!strcmp(src->index.names[i], name)) return src->parts[src->part_of[i]];
  st_error_set(err, ST_EFORMAT, "%s: tensor '%s' is missing from weight_map",
               src->index_path, name);
  return NULL;
}

/* Visits every tensor the load needs: slot -1 is the weights, 0.. the
 * optimizer slots. With copy == 0 it only checks; with 1 it reads those of
 * the blocks `mine` marks (NULL: all). */
static int visit(const source *src, const st_model *m, float *params,
                 float *opt_state, const char *optim_kind, int ns,
                 const unsigned char *mine, int copy, st_error *err) {
  for (int s = -1; s < ns; s++)
    for (int i = 0; i < m->n_blocks; i++) {
      const st_block *b = &m->blocks[i];
      for (int k = 0; k < b->n_tensors; k++) {
        const st_tensor_info *ti = &b->tensors[k];
        size_t off = b->param_off + ti->offset;
        if (ti->tie >= 0) continue; /* filled from its source */
        char name[ST_NAME_MAX + 32];
        if (s < 0)
          snprintf(name, sizeof name, "%s", ti->name);
        else
          snprintf(name, sizeof name, "optim.%s.%s", ti->name,
                   slot_name(optim_kind, s));
        const st_safetensors *st = locate(src, name, err);
        const st_st_tensor *t =
            st ? find_tensor(st, name, ti, s < 0, err) : NULL;
        if (!t) return ST_EFORMAT;
        if (!copy || (mine && !mine[i])) continue;
        float *dst =
            s < 0 ? params + off : opt_state + (size_t)s * m->n_params + off;
        int rc = 0;
        if (strcmp(t->dtype, "BF16") == 0) { /* widened in pieces */
          uint16_t h[1024];
          uLong crc = crc32_z(0, NULL, 0);
          for (size_t at = 0; !rc && at < ti->numel; at += 1024) {
            size_t n = ti->numel - at < 1024 ? ti->numel - at : 1024;
            rc = st_safetensors_pread(st, t, 2 * at, 2 * n, h, err);
            if (!rc) crc = crc32_z(crc, (const Bytef *)h, 2 * n);
            for (size_t j = 0; !rc && j < n; j++)
              dst[at + j] = st_bf16_to(h[j]);
          }
          if (!rc) rc = st_safetensors_verify(st, t, (uint32_t)crc, err);
        } else {
          rc = st_safetensors_pread(st, t, 0, ti->numel * sizeof(float), dst,
                                    err);
        }
        if (rc) return rc;
        /* weights a diverged run saved: refused here, not printed as
         * NUL bytes by generate or as a NaN loss by eval */
        for (size_t k = 0; s < 0 && k < ti->numel; k++)
          if (!isfinite(dst[k]))
            return st_error_set(err, ST_EFORMAT,
                                "%s: tensor '%s' holds %s at element %zu: "
                                "the run that wrote it had diverged",
                                st->path, name,
                                isnan(dst[k]) ? "NaN" : "an infinity", k);
      }
    }
  return 0;
}

/* Whether the checkpoint holds tensor `name` of slot s (-1: weights). */
static int expected(const st_model *m, const char *name, const char *optim_kind,
                    int ns) {
  for (int i = 0; i < m->n_blocks; i++)
    for (int k = 0; k < m->blocks[i].n_tensors; k++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[k];
      if (ti->tie >= 0) continue;
      if (!strcmp(name, ti->name)) return 1;
      size_t len = strlen(ti->name);
      for (int s = 0; s < ns; s++)
        if (!strncmp(name, "optim.", 6) && !strncmp(name + 6, ti->name, len) &&
            name[6 + len] == '.' &&
            !strcmp(name + 7 + len, slot_name(optim_kind, s)))
          return 1;
    }
  return 0;
}

/* Whether `name` lies in one of the model's namespaces: the part before
 * the first '.' of one of its tensors ("blocks", "transformer", ...). */
static int model_namespace(const st_model *m, const char *name) {
  size_t len = strcspn(name, ".");
  if (!name[len]) return 0;
  for (int i = 0; i < m->n_blocks; i++)
    for (int k = 0; k < m->blocks[i].n_tensors; k++) {
      const char *t = m->blocks[i].tensors[k].name;
      if (strcspn(t, ".") == len && !strncmp(t, name, len)) return 1;
    }
  return 0;
}

/* After visit found every tensor the model needs: a tensor left over means
 * the checkpoint is of another model (more layers, an untied head, ...),
 * which must not load as a part of it. In a strata checkpoint every tensor
 * counts; in another tool's file only those in the model's namespaces
 * (a PyTorch file may carry its own extras: buffers, reference values).
 * Optimizer state counts only when it is loaded (ns > 0). Counted first;
 * named only when one is left over. */
static int check_all_used(const source *src, const st_model *m,
                          const char *optim_kind, int ns, st_error *err) {
  const char *format = st_safetensors_meta(src->parts[0], "format");
  int ours = format && !strcmp(format, "strata-checkpoint");
  size_t want = 0, have = 0;
  for (int i = 0; i < m->n_blocks; i++)
    for (int k = 0; k < m->blocks[i].n_tensors; k++)
      want += m->blocks[i].tensors[k].tie < 0 ? 1 + (size_t)ns : 0;
  int n = src->index.n ? src->index.n : src->parts[0]->n_tensors;
  for (int i = 0; i < n; i++) {
    const char *name =
        src->index.n ? src->index.names[i] : src->parts[0]->tensors[i].name;
    have += (ns > 0 || strncmp(name, "optim.", 6) != 0) &&
            (ours || model_namespace(m, name));
  }
  /* ours: every tensor the model needs is there (visit), names are unique,
   * so equal counts mean none is left over */
  if (ours && have == want) return 0;
  for (int i = 0; i < n; i++) {
    const char *name =
        src->index.n ? src->index.names[i] : src->parts[0]->tensors[i].name;
    if ((ns > 0 || strncmp(name, "optim.", 6) != 0) &&
        (ours || model_namespace(m, name)) &&
        !expected(m, name, optim_kind, ns))
      return st_error_set(err, ST_EFORMAT,
                          "%s: tensor '%s' is not in this model: the "
                          "checkpoint is of another one (the config's "
                          "model keys: layers, width, tied, ...)",
                          src->index.n ? src->index_path : src->parts[0]->path,
                          name);
  }
  return 0;
}

int st_checkpoint_load(const char *path, const st_model *m, float *params,
                       float *opt_state, const char *optim_kind,
                       st_train_pos *pos, st_error *err) {
  return st_checkpoint_load_blocks(path, m, params, opt_state, optim_kind, pos,
                                   NULL, err);
}

int st_checkpoint_train_samples(const char *path, int64_t *n) {
  source src;
  st_error ignored = {0};
  int has = !source_open(&src, path, &ignored) &&
            !meta_i64(src.parts[0], "train_samples", 1, n, &ignored);
  source_close(&src);
  return has;
}

/* Whether the checkpoint at path records the CRC-32 `key`, into *crc. */
static int recorded_crc(const char *path, const char *key, uint32_t *crc) {
  source src;
  st_error ignored = {0};
  uint32_t has = 0;
  if (!source_open(&src, path, &ignored))
    read_crc(src.parts[0], key, crc, &has, &ignored);
  source_close(&src);
  return (int)has;
}

int st_checkpoint_tokenizer_crc(const char *path, uint32_t *crc) {
  return recorded_crc(path, "tokenizer_crc", crc);
}

int st_checkpoint_train_crc(const char *path, uint32_t *crc) {
  return recorded_crc(path, "train_crc", crc);
}

int st_checkpoint_normalize(const char *path, int *normalize) {
  source src;
  st_error ignored = {0};
  uint32_t has = 0, v = 0;
  if (!source_open(&src, path, &ignored))
    read_normalize(src.parts[0], &v, &has, &ignored);
  source_close(&src);
  if (has) *normalize = (int)v;
  return (int)has;
}

int st_checkpoint_load_blocks(const char *path, const st_model *m,
                              float *params, float *opt_state,
                              const char *optim_kind, st_train_pos *pos,
                              const unsigned char *mine, st_error *err) {
  source src;
  int rc = source_open(&src, path, err);
  if (rc) {
    source_close(&src);
    return rc;
  }
  const st_safetensors *st = src.parts[0]; /* every shard's metadata */
  if (opt_state) {
    const char *kind = st_safetensors_meta(st, "optimizer");
    if (!kind || strcmp(kind, optim_kind) != 0) {
      rc = st_error_set(err, ST_EFORMAT,
                        "%s: holds %s optimizer state but the config asks "
                        "for %s (optimizer.kind)",
                        path, kind ? kind : "no", optim_kind);
      goto done;
    }
  }
  int ns = opt_state ? slots(optim_kind) : 0;
  st_train_pos p;
  rc = visit(&src, m, params, opt_state, optim_kind, ns, mine, 0, err);
  if (!rc) rc = check_all_used(&src, m, optim_kind, ns, err);
  if (!rc && pos) rc = read_pos(st, &p, err);
  if (rc) goto done;
  if (params &&
      (rc = visit(&src, m, params, opt_state, optim_kind, ns, mine, 1, err)))
    goto done;
  /* tied copies are not stored */
  for (int i = 0; params && i < m->n_blocks; i++)
    if (!mine || mine[i]) st_model_sync_ties_blocks(m, params, i, 1);
  if (pos) *pos = p;
done:
  source_close(&src);
  return rc;
}

/* st_checkpoint_merge's reads: each tensor from its shard. */
typedef struct merging {
  const source *src;
  const char *optim_kind;
  const st_model *m;
  float *buf;
} merging;

static const float *merge_fetch(void *arg, int slot, size_t off, size_t numel,
                                st_error *err) {
  merging *g = arg;
  const st_model *m = g->m;
  int b = 0;
  while (b + 1 < m->n_blocks && m->blocks[b + 1].param_off <= off) b++;
  const st_tensor_info *ti = NULL;
  for (int t = 0; t < m->blocks[b].n_tensors; t++)
    if (m->blocks[b].param_off + m->blocks[b].tensors[t].offset == off)
      ti = &m->blocks[b].tensors[t];
  char name[ST_NAME_MAX + 32];
  if (slot < 0)
    snprintf(name, sizeof name, "%s", ti->name);
  else
    snprintf(name, sizeof name, "optim.%s.%s", ti->name,
             slot_name(g->optim_kind, slot));
  const st_safetensors *st = locate(g->src, name, err);
  const st_st_tensor *t = st ? find_tensor(st, name, ti, 0, err) : NULL;
  if (!t || st_safetensors_pread(st, t, 0, numel * sizeof(float), g->buf, err))
    return NULL;
  return g->buf;
}

int st_checkpoint_merge(const char *dir, const char *out, const st_model *m,
                        st_train_pos *pos, st_error *err) {
  source src;
  int rc = source_open(&src, dir, err);
  if (!rc && !src.index.n)
    rc = st_error_set(err, ST_EARG, "%s: not a sharded checkpoint's directory",
                      dir);
  const char *kind = rc ? NULL : st_safetensors_meta(src.parts[0], "optimizer");
  if (!rc && (!kind || (strcmp(kind, "sgd") && strcmp(kind, "adamw"))))
    rc = st_error_set(err, ST_EFORMAT, "%s: no optimizer named in metadata",
                      src.parts[0]->path);
  st_train_pos p;
  if (!rc) rc = read_pos(src.parts[0], &p, err);
  /* everything checked before the file is begun */
  if (!rc) rc = visit(&src, m, NULL, NULL, kind, slots(kind), NULL, 0, err);
  if (!rc) rc = check_all_used(&src, m, kind, slots(kind), err);
  size_t most = 0;
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++)
      if (m->blocks[i].tensors[t].numel > most)
        most = m->blocks[i].tensors[t].numel;
  merging g = {&src, kind, m, rc ? NULL : st_alloc(most * sizeof(float))};
  if (!rc && !g.buf) rc = st_error_set(err, ST_ENOMEM, "out of memory");
  if (!rc)
    rc = st_checkpoint_save_fetch(out, m, kind, &p, merge_fetch, &g, err);
  if (!rc && pos) *pos = p;
  st_free(g.buf);
  source_close(&src);
  return rc;
}
