/*
 * footprint.c — what the trainer's data holds in memory, known before it
 * is loaded: the compiler counts it in each rank's memory (every rank
 * loads the data), as `strata train` counts the bytes its load allocated
 * against execution.rank_memory_limit. The same files and counts as the
 * trainer's load_data (st_data_idx_paths, ST_SYNTHETIC_*), the same bytes
 * as the loaders allocate (st_dataset_bytes beside st_dataset_alloc, a
 * token a byte beside st_text_dataset_load, st_tokenizer_bytes); only the
 * files' headers and lengths are read.
 */
#include "strata.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void st_data_idx_paths(const st_config *cfg, int test, char *images,
                       char *labels, size_t cap) {
  const char *part = test ? "t10k" : "train";
  snprintf(images, cap, "%s/%s-images-idx3-ubyte.gz", cfg->data.dir, part);
  snprintf(labels, cap, "%s/%s-labels-idx1-ubyte.gz", cfg->data.dir, part);
}

/* The corpus's token ids (st_text_dataset_load: room for a token a byte)
 * and the tokenizer the trainer keeps. */
static int text_footprint(const st_config *cfg, double *bytes, int *n_train,
                          st_error *err) {
  int fd = st_open_regular(cfg->data.path, err);
  if (fd < 0) return err->code;
  struct stat sb;
  int ok = fstat(fd, &sb) == 0;
  close(fd);
  if (!ok)
    return st_error_set(err, ST_EIO, "%s: cannot read its size",
                        cfg->data.path);
  size_t n_bytes = (size_t)sb.st_size;
  st_tokenizer *tok;
  int rc = st_text_tokenizer(&tok, cfg, err);
  if (rc) return rc;
  *bytes = (double)st_alloc_counted(n_bytes * sizeof(int32_t)) +
           (double)st_tokenizer_bytes(tok);
  st_tokenizer_destroy(tok);
  /* at most a token a byte; the validation part is the end of them */
  size_t val = (size_t)floor((double)n_bytes * cfg->data.val_fraction);
  *n_train =
      st_text_windows(n_bytes - val, cfg->model.context, cfg->data.train_limit);
  return 0;
}

int st_data_footprint(const st_config *cfg, double *bytes, int *n_train,
                      st_error *err) {
  *bytes = 0;
  *n_train = 0;
  if (!strcmp(cfg->data.dataset, "text"))
    return text_footprint(cfg, bytes, n_train, err);
  if (!strcmp(cfg->data.dataset, "synthetic")) {
    st_shape shape = {1, 28, 28};
    int train =
        cfg->data.train_limit ? cfg->data.train_limit : ST_SYNTHETIC_TRAIN;
    int test = cfg->data.test_limit ? cfg->data.test_limit : ST_SYNTHETIC_TEST;
    *bytes = (double)st_dataset_bytes(train, shape) +
             (double)st_dataset_bytes(test, shape);
    *n_train = train;
    return 0;
  }
  for (int test = 0; test < 2; test++) {
    char images[ST_PATH_MAX + 64], labels[ST_PATH_MAX + 64];
    st_data_idx_paths(cfg, test, images, labels, sizeof images);
    int n;
    st_shape shape;
    int rc = st_dataset_idx_count(
        images, labels, test ? cfg->data.test_limit : cfg->data.train_limit, &n,
        &shape, err);
    if (rc) return rc;
    *bytes += (double)st_dataset_bytes(n, shape);
    if (!test) *n_train = n;
  }
  return 0;
}
