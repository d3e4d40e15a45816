/*
 * rundir.c — a run's directory as a whole: which checkpoints it holds,
 * whether it holds an earlier run that a new one would overwrite, removing
 * such a run (--overwrite), pruning old checkpoints and the temp files of
 * writes that a kill cut short.
 *
 * A run's files: config.yaml, metrics.jsonl, summary.json, plan.json,
 * plan.svg, schedule.svg (a pipeline's), checkpoints/step-NNNNNNNN.safetensors
 * (or, sharded, the directory checkpoints/step-NNNNNNNN/ of shards and the
 * model.safetensors.index.json written last, which makes it whole) and, for
 * weight streaming from a file store, store.strata. Atomic writes go
 * through PATH.tmp.PID (safetensors.c); a PID that no longer runs left its temp
 * file for good. A run holds a lock on its folder (st_run_lock) while it
 * lives.
 */
#include "strata.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* "step-NNNNNNNN.safetensors" (or "step-NNNNNNNN" with sharded = 1) ->
 * NNNNNNNN; -1 for any other name, and for the digits of a step in another
 * form than "%08lld" (step-9, step-000000009): st_run_checkpoint_path
 * names a step's checkpoint by that form, which such a file is not. */
static int64_t step_of(const char *name, int sharded) {
  if (strncmp(name, "step-", 5) != 0) return -1;
  const char *p = name + 5, *q = p;
  int64_t v = 0;
  while (*q >= '0' && *q <= '9' && q - p < 18) v = v * 10 + (*q++ - '0');
  char canon[24];
  int n = snprintf(canon, sizeof canon, "%08lld", (long long)v);
  return q > p && n == q - p && strcmp(q, sharded ? "" : ".safetensors") == 0
             ? v
             : -1;
}

/* A sharded checkpoint's directory is whole once its index is there. */
static int whole_shards(const char *ck, const char *name) {
  char path[2 * ST_PATH_MAX];
  snprintf(path, sizeof path, "%s/%s/model.safetensors.index.json", ck, name);
  return access(path, F_OK) == 0;
}

int st_run_checkpoints(const char *dir, int64_t **steps, st_error *err) {
  *steps = NULL;
  char ck[ST_PATH_MAX + 16];
  snprintf(ck, sizeof ck, "%s/checkpoints", dir);
  DIR *d = opendir(ck);
  if (!d) {
    if (errno == ENOENT) return 0;
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", ck,
                        strerror(errno)),
           -1;
  }
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t s = step_of(e->d_name, 0);
    if (s < 0 && (s = step_of(e->d_name, 1)) >= 0 &&
        !whole_shards(ck, e->d_name))
      s = -1;
    if (s < 0) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *grown = realloc(*steps, (size_t)cap * sizeof *grown);
      if (!grown) {
        closedir(d);
        free(*steps);
        *steps = NULL;
        return st_error_set(err, ST_ENOMEM, "%s: out of memory", ck), -1;
      }
      *steps = grown;
    }
    (*steps)[n++] = s;
  }
  closedir(d);
  if (n) qsort(*steps, (size_t)n, sizeof **steps, cmp_i64);
  int kept = 0; /* a step both as a file and as shards: once */
  for (int i = 0; i < n; i++)
    if (!kept || (*steps)[kept - 1] != (*steps)[i])
      (*steps)[kept++] = (*steps)[i];
  return kept;
}

int st_run_checkpoint_path(const char *dir, int64_t step, char *out,
                           size_t cap) {
  char shards[ST_PATH_MAX + 64];
  st_run_checkpoint_dir(dir, step, shards, sizeof shards);
  char ck[ST_PATH_MAX + 16], name[32];
  snprintf(ck, sizeof ck, "%s/checkpoints", dir);
  snprintf(name, sizeof name, "step-%08lld", (long long)step);
  int n = snprintf(out, cap, "%s/checkpoints/step-%08lld.safetensors", dir,
                   (long long)step);
  /* a sharded one where there is no file */
  if (access(out, F_OK) != 0 && whole_shards(ck, name))
    n = snprintf(out, cap, "%s", shards);
  return n >= (int)cap ? -1 : 0;
}

int st_run_checkpoint_dir(const char *dir, int64_t step, char *out,
                          size_t cap) {
  return snprintf(out, cap, "%s/checkpoints/step-%08lld", dir,
                  (long long)step) >= (int)cap
             ? -1
             : 0;
}

/* Removes a sharded checkpoint's directory: its index first (made durable:
 * a kill part-way leaves a directory that is no longer whole, never an
 * index beside missing shards), then everything else in it. */
static int remove_shards(const char *path, st_error *err) {
  char index[2 * ST_PATH_MAX];
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
  struct stat sb;
  if (stat(path, &sb) != 0 && errno == ENOENT) return 0; /* none there */
  if (unlink(index) != 0 && errno != ENOENT)
    return st_error_set(err, ST_EIO, "%s: cannot remove: %s", index,
                        strerror(errno));
  int rc = st_sync_dir(path, err);
  if (rc) return rc;
  DIR *d = opendir(path);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char file[2 * ST_PATH_MAX];
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    unlink(file);
  }
  if (d) closedir(d);
  if (rmdir(path) != 0 && errno != ENOENT)
    return st_error_set(err, ST_EIO, "%s: cannot remove: %s", path,
                        strerror(errno));
  return 0;
}

/* Removes a checkpoint: its file and its shards' directory, whichever are
 * there. */
static int remove_checkpoint(const char *dir, int64_t step, st_error *err) {
  char path[ST_PATH_MAX + 64];
  st_run_checkpoint_dir(dir, step, path, sizeof path);
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    int rc = remove_shards(path, err);
    if (rc) return rc;
  }
  snprintf(path + strlen(path), sizeof path - strlen(path), ".safetensors");
  if (unlink(path) != 0 && errno != ENOENT)
    return st_error_set(err, ST_EIO, "%s: cannot remove: %s", path,
                        strerror(errno));
  return 0;
}

int st_run_prune(const char *dir, int keep, st_error *err) {
  int64_t *steps;
  int n = st_run_checkpoints(dir, &steps, err);
  if (n < 0) return err->code;
  int rc = 0;
  for (int i = 0; i + keep < n && !rc; i++)
    rc = remove_checkpoint(dir, steps[i], err);
  free(steps);
  return rc;
}

/* "NAME.tmp.PID" of a process that no longer runs (or "store.strata.tmp",
 * whose creator removes it itself before it makes another). */
static int stale_tmp(const char *name) {
  const char *t = strstr(name, ".tmp.");
  if (!t || t == name) return 0;
  char *end;
  long pid = strtol(t + 5, &end, 10);
  if (end == t + 5 || *end || pid <= 0) return 0;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int st_run_clean_tmp(const char *dir) {
  int removed = 0;
  for (int sub = 0; sub < 2; sub++) {
    char d_path[ST_PATH_MAX + 16], path[2 * ST_PATH_MAX];
    snprintf(d_path, sizeof d_path, "%s%s", dir, sub ? "/checkpoints" : "");
    DIR *d = opendir(d_path);
    if (!d) continue;
    struct dirent *e;
    while ((e = readdir(d))) {
      if (stale_tmp(e->d_name)) {
        snprintf(path, sizeof path, "%s/%s", d_path, e->d_name);
        removed += unlink(path) == 0;
      }
      /* shards whose index was never written: a save a kill cut short */
      if (sub && step_of(e->d_name, 1) >= 0 &&
          !whole_shards(d_path, e->d_name)) {
        st_error ignored = {0};
        snprintf(path, sizeof path, "%s/%s", d_path, e->d_name);
        removed += remove_shards(path, &ignored) == 0;
      }
    }
    closedir(d);
  }
  return removed;
}

static int exists(const char *dir, const char *name, off_t *size) {
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  struct stat sb;
  if (stat(path, &sb) != 0) return 0;
  if (size) *size = sb.st_size;
  return 1;
}

int st_run_describe(const char *dir, const char *store, char *what,
                    size_t cap) {
  what[0] = '\0';
  size_t used = 0;
#define ADD(...)                                                               \
  used +=                                                                      \
      (size_t)snprintf(what + used, used < cap ? cap - used : 0, __VA_ARGS__)
  st_error ignored = {0};
  int64_t *steps;
  int n = st_run_checkpoints(dir, &steps, &ignored);
  if (n > 0)
    ADD("%d checkpoint%s up to step %lld", n, n == 1 ? "" : "s",
        (long long)steps[n - 1]);
  free(steps);
  struct stat sb;
  if (store && store[0] && stat(store, &sb) == 0)
    ADD("%s%s", used ? ", " : "", store);
  off_t size = 0;
  /* metrics.jsonl is opened empty at the start: a line is a step taken */
  if (exists(dir, "metrics.jsonl", &size) && size > 0)
    ADD("%smetrics.jsonl", used ? ", " : "");
  if (exists(dir, "summary.json", NULL))
    ADD("%ssummary.json", used ? ", " : "");
#undef ADD
  if (used >= cap && cap > 4) strcpy(what + cap - 4, "...");
  return used > 0;
}

int st_run_remove(const char *dir, const char *store, st_error *err) {
  static const char *const files[] = {"config.yaml",  "metrics.jsonl",
                                      "summary.json", "plan.json",
                                      "plan.svg",     "schedule.svg"};
  char path[ST_PATH_MAX + 64];
  int64_t *steps;
  int n = st_run_checkpoints(dir, &steps, err);
  if (n < 0) return err->code;
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) rc = remove_checkpoint(dir, steps[i], err);
  free(steps);
  for (size_t i = 0; !rc && i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (unlink(path) != 0 && errno != ENOENT)
      rc = st_error_set(err, ST_EIO, "%s: cannot remove: %s", path,
                        strerror(errno));
  }
  if (!rc && store && store[0] && unlink(store) != 0 && errno != ENOENT)
    rc = st_error_set(err, ST_EIO, "%s: cannot remove: %s", store,
                      strerror(errno));
  return rc;
}

/* --overwrite in two halves: the earlier run moves into DIR/.overwritten
 * and is removed only once the new run has started, so a new run that
 * fails first (a data path mistyped, a model that cannot be made) puts it
 * back. */
static const char *const run_files[] = {
    "config.yaml", "metrics.jsonl", "summary.json", "plan.json",
    "plan.svg",    "schedule.svg",  "checkpoints"};
#define N_RUN_FILES (sizeof run_files / sizeof run_files[0])
#define ASIDE_STORE "store.strata"

static void aside_path(const char *dir, const char *name, char *out,
                       size_t cap) {
  snprintf(out, cap, "%s/.overwritten%s%s", dir, name ? "/" : "",
           name ? name : "");
}

int st_run_set_aside(const char *dir, const char *store, st_error *err) {
  char aside[ST_PATH_MAX + 64], from[ST_PATH_MAX + 64], to[ST_PATH_MAX + 64];
  aside_path(dir, NULL, aside, sizeof aside);
  struct stat sb;
  /* left by a replacement killed before it started: the same run, which
   * --overwrite was asked to replace again */
  if (stat(aside, &sb) == 0) {
    int rc = st_run_drop_aside(dir, err);
    if (rc) return rc;
  }
  if (mkdir(aside, 0777) != 0)
    return st_error_set(err, ST_EIO, "%s: cannot make: %s", aside,
                        strerror(errno));
  for (size_t i = 0; i < N_RUN_FILES; i++) {
    snprintf(from, sizeof from, "%s/%s", dir, run_files[i]);
    aside_path(dir, run_files[i], to, sizeof to);
    if (rename(from, to) != 0 && errno != ENOENT) {
      int e = errno;
      st_run_put_back(dir, NULL);
      return st_error_set(err, ST_EIO, "%s: cannot move to %s: %s", from, to,
                          strerror(e));
    }
  }
  if (!store || !store[0]) return 0;
  aside_path(dir, ASIDE_STORE, to, sizeof to);
  if (rename(store, to) == 0 || errno == ENOENT) return 0;
  /* on another file system: removed now, as --overwrite always did */
  if (errno == EXDEV && unlink(store) == 0) return 0;
  int e = errno;
  st_run_put_back(dir, NULL);
  return st_error_set(err, ST_EIO, "%s: cannot remove: %s", store, strerror(e));
}

void st_run_put_back(const char *dir, const char *store) {
  char from[ST_PATH_MAX + 64], to[ST_PATH_MAX + 64];
  for (size_t i = 0; i < N_RUN_FILES; i++) {
    aside_path(dir, run_files[i], from, sizeof from);
    snprintf(to, sizeof to, "%s/%s", dir, run_files[i]);
    struct stat sb;
    if (stat(from, &sb) != 0) continue;
    if (S_ISDIR(sb.st_mode)) rmdir(to); /* the new run's, while empty */
    rename(from, to);
  }
  aside_path(dir, ASIDE_STORE, from, sizeof from);
  if (store && store[0]) rename(from, store);
  aside_path(dir, NULL, from, sizeof from);
  rmdir(from);
}

int st_run_drop_aside(const char *dir, st_error *err) {
  char aside[ST_PATH_MAX + 64], store[ST_PATH_MAX + 64];
  aside_path(dir, NULL, aside, sizeof aside);
  aside_path(dir, ASIDE_STORE, store, sizeof store);
  int rc = st_run_remove(aside, store, err);
  if (rc) return rc;
  st_run_clean_tmp(aside);
  char ck[ST_PATH_MAX + 80];
  snprintf(ck, sizeof ck, "%s/checkpoints", aside);
  if ((rmdir(ck) != 0 && errno != ENOENT) || rmdir(aside) != 0)
    return st_error_set(err, ST_EIO,
                        "%s: cannot remove: %s (files no run wrote are "
                        "left there)",
                        aside, strerror(errno));
  return 0;
}

int st_run_lock(const char *dir, st_error *err) {
  int rc = st_mkdir_p(dir, 1, err);
  if (rc) return rc;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return st_error_set(err, ST_EIO, "%s: cannot open: %s", dir,
                        strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0; /* fd held to the exit */
  int e = errno;
  close(fd);
  if (e != EWOULDBLOCK) return 0; /* no locks here: nothing to hold */
  return st_error_set(err, ST_EIO,
                      "%s: in use by another strata process (a run in it "
                      "holds the folder's lock): wait for it to end, or give "
                      "another --out",
                      dir);
}

int st_run_prepare(const char *dir, st_error *err) {
  char ck[ST_PATH_MAX + 16];
  snprintf(ck, sizeof ck, "%s/checkpoints", dir);
  int rc = st_mkdir_p(ck, 1, err);
  if (rc) return rc;
  const char *paths[] = {dir, ck};
  for (int i = 0; i < 2; i++)
    if (access(paths[i], W_OK | X_OK) != 0)
      return st_error_set(err, ST_EIO, "%s: cannot write: %s", paths[i],
                          strerror(errno));
  st_run_clean_tmp(dir);
  return 0;
}
