/*
 * syncspy.c — a preloaded library (LD_PRELOAD) that writes down, in the
 * order they happen, the calls that make a file durable: fsync, fdatasync
 * (each with the path of its descriptor), rename and renameat2 (from and
 * to), linkat (the path of the file linked, " (deleted)" off where it had
 * none yet, and to), and pwrite into a file's first 8 KiB (a weight store's two
 * header slots: the path and the offset), one line each, to the file
 * $SYNCSPY_LOG. It then makes the call (or fails it, below).
 *
 * tests/io/test_durable.sh reads the lines to check what no result of a
 * run can show: that a file is synced before it is renamed into place,
 * and its folder after (STYLE.md: atomic writes). Not a test itself.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int log_fd = -1;

/* opened as the library loads, before the program has threads */
__attribute__((constructor)) static void open_log(void) {
  const char *path = getenv("SYNCSPY_LOG");
  if (path)
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void note(const char *what, const char *a, const char *b) {
  if (log_fd < 0) return;
  char line[2 * 4096 + 64];
  int n = snprintf(line, sizeof line, "%s %s%s%s\n", what, a, b ? " " : "",
                   b ? b : "");
  if (n > 0 && (size_t)n < sizeof line) {
    ssize_t w = write(log_fd, line, (size_t)n); /* O_APPEND: one line */
    (void)w;
  }
}

static void note_fd(const char *what, int fd, const char *b) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  path[n > 0 ? n : 0] = '\0';
  note(what, n > 0 ? path : "?", b);
}

static void *real(const char *name) { return dlsym(RTLD_NEXT, name); }

/* $SYNCSPY_FAIL_DIR set to EIO, EINVAL or EACCES: every fsync of a folder
 * fails with that errno (a failing disk; a file system that cannot sync
 * one; a folder this process may not read). */
int fsync(int fd) {
  note_fd("fsync", fd, NULL);
  const char *fail = getenv("SYNCSPY_FAIL_DIR");
  struct stat sb;
  if (fail && fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    errno = strcmp(fail, "EINVAL") == 0   ? EINVAL
            : strcmp(fail, "EACCES") == 0 ? EACCES
                                          : EIO;
    return -1;
  }
  int (*f)(int) = (int (*)(int))real("fsync");
  return f(fd);
}

int fdatasync(int fd) {
  note_fd("fdatasync", fd, NULL);
  int (*f)(int) = (int (*)(int))real("fdatasync");
  return f(fd);
}

int rename(const char *from, const char *to) {
  note("rename", from, to);
  int (*f)(const char *, const char *) =
      (int (*)(const char *, const char *))real("rename");
  return f(from, to);
}

int renameat2(int dfrom, const char *from, int dto, const char *to,
              unsigned flags) {
  note("renameat2", from, to);
  int (*f)(int, const char *, int, const char *, unsigned) = (int (*)(
      int, const char *, int, const char *, unsigned))real("renameat2");
  return f(dfrom, from, dto, to, flags);
}

/* A file with no name (O_TMPFILE) linked in by its descriptor, as
 * /proc/self/fd/N or with AT_EMPTY_PATH: the path fsync and fdatasync
 * wrote for it, without the " (deleted)" the kernel adds. */
int linkat(int dfrom, const char *from, int dto, const char *to, int flags) {
  char path[4096] = "";
  int fd = -1;
  if (!strncmp(from, "/proc/self/fd/", 14))
    fd = atoi(from + 14);
  else if (!from[0] && (flags & AT_EMPTY_PATH))
    fd = dfrom;
  if (fd >= 0) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    path[n > 0 ? n : 0] = '\0';
    char *gone = strstr(path, " (deleted)");
    if (gone) *gone = '\0';
  }
  note("linkat", path[0] ? path : from, to);
  int (*f)(int, const char *, int, const char *, int) =
      (int (*)(int, const char *, int, const char *, int))real("linkat");
  return f(dfrom, from, dto, to, flags);
}

static ssize_t spied_pwrite(const char *name, int fd, const void *buf, size_t n,
                            off_t at) {
  if (at < 8192) {
    char where[32];
    snprintf(where, sizeof where, "%lld", (long long)at);
    note_fd("pwrite", fd, where);
  }
  ssize_t (*f)(int, const void *, size_t, off_t) =
      (ssize_t(*)(int, const void *, size_t, off_t))real(name);
  return f(fd, buf, n, at);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
  return spied_pwrite("pwrite", fd, buf, n, at);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) {
  return spied_pwrite("pwrite64", fd, buf, n, at);
}
