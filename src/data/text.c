/*
 * text.c — text corpora as token ids for language models: reads any file,
 * tokenizes it (bytes by default, or a trained BPE tokenizer) and splits it
 * by position into train and validation parts. The split is contiguous — the
 * validation part is the end of the file — so no validation text leaks into
 * training through overlapping context windows, and it is deterministic.
 */
#include "strata.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int st_file_read(uint8_t **data, size_t *n, const char *path, st_error *err) {
  *data = NULL;
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f)
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", path,
                        strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return st_error_set(err, ST_EIO, "%s: not a regular file", path);
  }
  size_t size = (size_t)sb.st_size;
  uint8_t *buf = NULL;
  if (size) {
    buf = st_alloc(size);
    if (!buf) {
      fclose(f);
      return st_error_set(err, ST_ENOMEM, "%s: out of memory (%zu bytes)", path,
                          size);
    }
    size_t got = fread(buf, 1, size, f);
    if (got != size) {
      int bad = ferror(f);
      st_free(buf);
      fclose(f);
      return st_error_set(err, ST_EIO, "%s: %s after %zu of %zu bytes", path,
                          bad ? "read error" : "file shrank while reading", got,
                          size);
    }
  }
  fclose(f);
  *data = buf;
  *n = size;
  return 0;
}

void st_text_dataset_destroy(st_text_dataset *ds) {
  if (!ds)
    return;
  st_free(ds->tokens);
  free(ds);
}

int st_text_dataset_load(st_text_dataset **out, const char *path,
                         const st_tokenizer *tok, double val_fraction,
                         st_error *err) {
  *out = NULL;
  if (!(val_fraction >= 0 && val_fraction < 1))
    return st_error_set(err, ST_EARG,
                        "%s: validation fraction %g is outside [0, 1)", path,
                        val_fraction);
  st_tokenizer *bytes = NULL;
  uint8_t *text = NULL;
  st_text_dataset *ds = calloc(1, sizeof *ds);
  if (!ds)
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  int rc = 0;
  if (!tok) {
    rc = st_tokenizer_create_bytes(&bytes, err);
    tok = bytes;
  }
  if (!rc)
    rc = st_file_read(&text, &ds->n_bytes, path, err);
  if (rc)
    goto fail;
  if (ds->n_bytes == 0) {
    rc = st_error_set(err, ST_EDATA, "%s: the corpus is empty", path);
    goto fail;
  }
  snprintf(ds->path, sizeof ds->path, "%s", path);
  ds->vocab = st_tokenizer_vocab(tok);
  ds->tokens = st_alloc(ds->n_bytes * sizeof *ds->tokens);
  if (!ds->tokens) {
    rc = st_error_set(err, ST_ENOMEM, "%s: out of memory (%zu tokens)", path,
                      ds->n_bytes);
    goto fail;
  }
  rc = st_tokenizer_encode(tok, text, ds->n_bytes, ds->tokens, &ds->n_tokens,
                           err);
  if (rc)
    goto fail;
  ds->n_val = (size_t)floor((double)ds->n_tokens * val_fraction);
  ds->n_train = ds->n_tokens - ds->n_val;
  if (ds->n_train == 0 || (val_fraction > 0 && ds->n_val == 0)) {
    rc = st_error_set(err, ST_EDATA,
                      "%s: %zu tokens are too few to split with validation "
                      "fraction %g",
                      path, ds->n_tokens, val_fraction);
    goto fail;
  }
  ds->train = ds->tokens;
  ds->val = ds->tokens + ds->n_train;
  st_free(text);
  st_tokenizer_destroy(bytes);
  *out = ds;
  return 0;
fail:
  st_free(text);
  st_tokenizer_destroy(bytes);
  st_text_dataset_destroy(ds);
  return rc;
}
