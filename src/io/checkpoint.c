/*
 * checkpoint.c — model checkpoints as safetensors: every parameter under its
 * tensor name (PyTorch layouts, so torch / safetensors read them directly),
 * the optimizer state as "optim.<name>.<slot>", and the training position in
 * the metadata. Written atomically; on load every tensor's presence, dtype
 * and shape is checked and a mismatch names the tensor.
 */
#include "strata.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *slot_name(const char *optim_kind, int slot) {
  if (strcmp(optim_kind, "adamw") == 0) return slot ? "exp_avg_sq" : "exp_avg";
  return "momentum";
}

static int slots(const char *optim_kind) {
  return strcmp(optim_kind, "adamw") == 0 ? 2 : 1;
}

static int add_meta_i64(st_st_writer *w, const char *key, int64_t v,
                        st_error *err) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  return st_st_writer_meta(w, key, buf, err);
}

int st_checkpoint_save(const char *path, const st_model *m,
                       const float *params, const float *opt_state,
                       const char *optim_kind, const st_train_pos *pos,
                       uint64_t seed, st_error *err) {
  st_st_writer *w = st_st_writer_create();
  if (!w) return st_error_set(err, ST_ENOMEM, "out of memory");
  char (*names)[ST_NAME_MAX + 32] = NULL;
  int rc = 0, ns = opt_state ? slots(optim_kind) : 0;
  names = malloc((size_t)(m->n_tensors * ns + 1) * sizeof *names);
  if (!names) {
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
    goto done;
  }
  int k = 0;
  for (int s = -1; s < ns && !rc; s++) {
    for (int i = 0; i < m->n_blocks && !rc; i++) {
      const st_block *b = &m->blocks[i];
      for (int t = 0; t < b->n_tensors && !rc; t++) {
        const st_tensor_info *ti = &b->tensors[t];
        size_t off = b->param_off + ti->offset;
        if (s < 0) {
          rc = st_st_writer_add(w, ti->name, "F32", ti->ndim, ti->dims,
                                params + off, err);
        } else {
          snprintf(names[k], sizeof names[k], "optim.%s.%s", ti->name,
                   slot_name(optim_kind, s));
          rc = st_st_writer_add(w, names[k++], "F32", ti->ndim, ti->dims,
                                opt_state + (size_t)s * m->n_params + off, err);
        }
      }
    }
  }
  if (!rc) rc = st_st_writer_meta(w, "format", "strata-checkpoint", err);
  if (!rc) rc = st_st_writer_meta(w, "version", "1", err);
  if (!rc) rc = st_st_writer_meta(w, "model", m->kind, err);
  if (!rc) rc = st_st_writer_meta(w, "optimizer", optim_kind, err);
  if (!rc) rc = add_meta_i64(w, "seed", (int64_t)seed, err);
  if (!rc && pos) {
    rc = add_meta_i64(w, "step", pos->step, err);
    if (!rc) rc = add_meta_i64(w, "epoch", pos->epoch, err);
    if (!rc) rc = add_meta_i64(w, "epoch_pos", pos->epoch_pos, err);
    if (!rc) rc = add_meta_i64(w, "samples", pos->samples, err);
  }
  if (!rc) rc = st_st_writer_write(w, path, err);
done:
  free(names);
  st_st_writer_destroy(w);
  return rc;
}

/* Copies one named F32 tensor of the expected shape into dst. */
static int load_tensor(const st_safetensors *st, const char *name,
                       const st_tensor_info *ti, float *dst, st_error *err) {
  const st_st_tensor *t = st_safetensors_find(st, name);
  if (!t)
    return st_error_set(err, ST_EFORMAT, "%s: tensor '%s' is missing",
                        st->path, name);
  int same = strcmp(t->dtype, "F32") == 0 && t->ndim == ti->ndim;
  for (int d = 0; same && d < ti->ndim; d++) same = t->dims[d] == ti->dims[d];
  if (!same) {
    char want[64] = "", got[64] = "";
    for (int d = 0; d < ti->ndim; d++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld",
               d ? "x" : "", (long long)ti->dims[d]);
    for (int d = 0; d < t->ndim; d++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld",
               d ? "x" : "", (long long)t->dims[d]);
    return st_error_set(err, ST_EFORMAT,
                        "%s: tensor '%s' is %s %s, the model needs F32 %s",
                        st->path, name, t->dtype, got, want);
  }
  memcpy(dst, st->data + t->begin, ti->numel * sizeof(float));
  return 0;
}

static int meta_i64(const st_safetensors *st, const char *key, int64_t *v,
                    st_error *err) {
  const char *s = st_safetensors_meta(st, key);
  char *end = NULL;
  if (s) *v = strtoll(s, &end, 10);
  if (!s || end == s || *end)
    return st_error_set(err, ST_EFORMAT,
                        "%s: metadata '%s' is missing or not an integer: not a "
                        "strata training checkpoint",
                        st->path, key);
  return 0;
}

int st_checkpoint_load(const char *path, const st_model *m, float *params,
                       float *opt_state, const char *optim_kind,
                       st_train_pos *pos, st_error *err) {
  st_safetensors *st;
  int rc = st_safetensors_read(&st, path, err);
  if (rc) return rc;
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
  for (int s = -1; s < ns && !rc; s++) {
    for (int i = 0; i < m->n_blocks && !rc; i++) {
      const st_block *b = &m->blocks[i];
      for (int t = 0; t < b->n_tensors && !rc; t++) {
        const st_tensor_info *ti = &b->tensors[t];
        size_t off = b->param_off + ti->offset;
        if (s < 0) {
          rc = load_tensor(st, ti->name, ti, params + off, err);
        } else {
          char name[ST_NAME_MAX + 32];
          snprintf(name, sizeof name, "optim.%s.%s", ti->name,
                   slot_name(optim_kind, s));
          rc = load_tensor(st, name, ti,
                           opt_state + (size_t)s * m->n_params + off, err);
        }
      }
    }
  }
  if (!rc && pos) {
    rc = meta_i64(st, "step", &pos->step, err);
    if (!rc) rc = meta_i64(st, "epoch", &pos->epoch, err);
    if (!rc) rc = meta_i64(st, "epoch_pos", &pos->epoch_pos, err);
    if (!rc) rc = meta_i64(st, "samples", &pos->samples, err);
  }
done:
  st_safetensors_destroy(st);
  return rc;
}
