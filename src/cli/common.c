/*
 * common.c — what every `strata` command shares: the one-line error and
 * usage-error conventions, the default output folder, and mkdir -p.
 */
#include "strata.h"
#include "cli.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

int st_cli_fail(const st_error *err) {
  fprintf(stderr, "strata: error: %s\n", err->msg);
  return 1;
}

int st_cli_usage_error(const char *usage, const char *fmt, const char *what) {
  fprintf(stderr, "strata: ");
  fprintf(stderr, fmt, what);
  fprintf(stderr, "\n%s", usage);
  return 2;
}

void st_cli_default_out(char *out, size_t cap, const char *config) {
  const char *base = strrchr(config, '/');
  base = base ? base + 1 : config;
  size_t n = strcspn(base, ".");
  snprintf(out, cap, "runs/%.*s", (int)n, base);
}

int st_cli_mkdir_p(const char *path, int include_last, st_error *err) {
  char buf[ST_PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return st_error_set(err, ST_EARG, "%.64s...: path too long", path);
  for (char *p = buf + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    if (*p == '\0' && !include_last) break;
    char keep = *p;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return st_error_set(err, ST_EIO, "%s: cannot create: %s", buf,
                          strerror(errno));
    *p = keep;
    if (!keep) break;
  }
  return 0;
}
