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
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int st_open_regular(const char *path, st_error *err) {
  /* O_NONBLOCK: a FIFO with no writer would hold the open (and a signal
   * with it); a regular file reads the same either way */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", path,
                        strerror(errno)),
           -1;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return st_error_set(err, ST_EIO, "%s: not a regular file", path), -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int st_file_read(uint8_t **data, size_t *n, const char *path, st_error *err) {
  *data = NULL;
  *n = 0;
  int fd = st_open_regular(path, err);
  if (fd < 0) return err->code;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0) {
    fclose(f);
    return st_error_set(err, ST_EIO, "%s: %s", path, strerror(errno));
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
  if (!ds) return;
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
  if (!ds) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  int rc = 0;
  if (!tok) {
    rc = st_tokenizer_create_bytes(&bytes, err);
    tok = bytes;
  }
  /* BPE's encoder indexes a text with int32 (st_tokenizer_encode): a
   * corpus past that is refused here, naming it, before it is read and
   * 4 bytes a byte are set aside for its ids */
  struct stat sb;
  if (!rc && st_tokenizer_vocab(tok) > 256 && stat(path, &sb) == 0 &&
      sb.st_size >= INT32_MAX)
    rc = st_error_set(err, ST_EDATA,
                      "%s: %lld bytes; a BPE tokenizer encodes a corpus of "
                      "at most %d bytes (split the corpus, or train on bytes)",
                      path, (long long)sb.st_size, INT32_MAX - 1);
  if (!rc) rc = st_file_read(&text, &ds->n_bytes, path, err);
  if (rc) goto fail;
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
  if (rc) goto fail;
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

size_t st_utf8_invalid(const uint8_t *d, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = d[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    int len;
    uint32_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0; /* no overlongs */
      if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90; /* no overlongs */
      if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else
      return i;
    if (n - i < (size_t)len) return i;
    if (d[i + 1] < lo || d[i + 1] > hi) return i;
    for (int k = 2; k < len; k++)
      if (d[i + k] < 0x80 || d[i + k] > 0xBF) return i;
    i += (size_t)len;
  }
  return n;
}

int st_text_windows(size_t tokens, int T, int limit) {
  size_t n = tokens > (size_t)T ? (tokens - 1) / (size_t)T : 0;
  if (n > INT32_MAX) n = INT32_MAX;
  return limit > 0 && (size_t)limit < n ? limit : (int)n;
}

static int uses_bytes(const st_config *cfg) {
  return !cfg->data.tokenizer[0] || !strcmp(cfg->data.tokenizer, "bytes");
}

int st_text_tokenizer(st_tokenizer **out, const st_config *cfg, st_error *err) {
  if (uses_bytes(cfg)) return st_tokenizer_create_bytes(out, err);
  int rc = st_tokenizer_load(out, cfg->data.tokenizer, err);
  if (rc) { /* the file is the key's value: say which key, and the other */
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    st_error_set(err, rc,
                 "%s: data.tokenizer: %.400s (the key is \"bytes\" or a "
                 "file from strata tokenize train)",
                 st_config_where(cfg, "data.tokenizer"), why);
  }
  return rc;
}

int st_text_vocab(const st_config *cfg, int *vocab, st_error *err) {
  if (cfg->model.vocab > 0) {
    *vocab = cfg->model.vocab;
    return 0;
  }
  st_tokenizer *tok;
  int rc = st_text_tokenizer(&tok, cfg, err);
  if (rc) return rc;
  *vocab = st_tokenizer_vocab(tok);
  st_tokenizer_destroy(tok);
  return 0;
}

/* Refuses a corpus that is not valid UTF-8, naming line and column (in
 * bytes, 1-based) of the first bad byte. */
static int check_utf8(const char *path, st_error *err) {
  uint8_t *data;
  size_t n;
  int rc = st_file_read(&data, &n, path, err);
  if (rc) return rc;
  size_t bad = st_utf8_invalid(data, n);
  if (bad < n) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < bad; i++) {
      col++;
      if (data[i] == '\n') line++, col = 1;
    }
    rc = st_error_set(err, ST_EDATA,
                      "%s:%zu:%zu: byte 0x%02X is not valid UTF-8 "
                      "(data.encoding utf8; use bytes to accept any file)",
                      path, line, col, data[bad]);
  }
  st_free(data);
  return rc;
}

int st_text_open(st_text_dataset **out, st_tokenizer **tok,
                 const st_config *cfg, st_error *err) {
  *out = NULL;
  *tok = NULL;
  int rc = 0;
  if (!strcmp(cfg->data.encoding, "utf8")) rc = check_utf8(cfg->data.path, err);
  if (!rc) rc = st_text_tokenizer(tok, cfg, err);
  if (!rc)
    rc = st_text_dataset_load(out, cfg->data.path, *tok, cfg->data.val_fraction,
                              err);
  if (rc) {
    st_tokenizer_destroy(*tok);
    *tok = NULL;
  }
  return rc;
}
