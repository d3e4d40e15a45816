/*
 * common.c — what every `strata` command shares: the one-line error and
 * usage-error conventions and the default output folder.
 */
#include "strata.h"
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int st_cli_out_folder(const char *option, const char *path, st_error *err) {
  struct stat sb;
  if (path && !*path) { /* else found at the end: ": rename failed" */
    st_error_set(err, ST_EARG, "%s: an empty path: give a file's path", option);
    return 1;
  }
  if (!path || stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return 0;
  if (S_ISDIR(sb.st_mode))
    st_error_set(err, ST_EARG,
                 "%s %s: a folder, not a file: give a file's path", option,
                 path);
  else /* the write renames its temp file over the path: a device's node
        * (root may replace /dev/full) or a FIFO would become the file */
    st_error_set(err, ST_EARG,
                 "%s %s: not a regular file (a device, FIFO or socket), "
                 "which the write would replace: give a file's path",
                 option, path);
  return 1;
}

int st_cli_same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

void st_cli_notice_unused(const st_config *cfg) {
  const char *unused[ST_CONFIG_MAX_KEYS];
  int n = st_config_unused(cfg, unused, ST_CONFIG_MAX_KEYS);
  for (int i = 0; i < n && i < ST_CONFIG_MAX_KEYS; i++)
    fprintf(stderr, "strata: notice: %s: %s is not used by %s; ignored\n",
            st_config_where(cfg, unused[i]), unused[i],
            st_config_unused_why(cfg, unused[i]));
}

int st_cli_fail(const st_error *err) {
  /* over MPI ranks an error every rank shares is printed once, by rank 0;
   * one rank's own error names the rank */
  if (st_dist_size() > 1 && st_dist_rank() > 0) {
    /* (not twice: many messages over ranks name their rank already) */
    char mine[32];
    int n = snprintf(mine, sizeof mine, "rank %d: ", st_dist_rank());
    if (!st_dist_error_shared())
      fprintf(stderr, "strata: error: %s%s\n",
              strncmp(err->msg, mine, (size_t)n) ? mine : "", err->msg);
    return 1;
  }
  fprintf(stderr, "strata: error: %s\n", err->msg);
  return 1;
}

/* Misuse: the cause on one line, then the command's synopsis (its usage
 * up to the first blank line) and where the rest is, not the whole help:
 * train's ran to 53 lines, burying the one that mattered. */
static char usage_pending[512];

const char *st_cli_usage_pending(void) { return usage_pending; }

int st_cli_usage_error(const char *usage, const char *fmt, const char *what) {
  snprintf(usage_pending, sizeof usage_pending, fmt, what);
  /* over MPI ranks only rank 0 speaks; another's is agreed (cmd_train) */
  if (st_dist_size() > 1 && st_dist_rank() > 0) return 2;
  fprintf(stderr, "strata: error: %s", usage_pending);
  const char *end = strstr(usage, "\n\n");
  int n = end ? (int)(end - usage) + 1 : (int)strlen(usage);
  /* "usage: strata train CONFIG ...": the command is the word after strata */
  const char *cmd = strncmp(usage, "usage: strata ", 14) ? "" : usage + 14;
  int cn = (int)strcspn(cmd, " \n");
  if (cn && cmd[0] >= 'a' && cmd[0] <= 'z')
    fprintf(stderr, "\n%.*s(strata %.*s --help: every option)\n", n, usage, cn,
            cmd);
  else
    fprintf(stderr, "\n%.*s(strata --help: the commands)\n", n, usage);
  return 2;
}

void st_cli_default_out(char *out, size_t cap, const char *config) {
  const char *base = strrchr(config, '/');
  base = base ? base + 1 : config;
  size_t n = strcspn(base, ".");
  snprintf(out, cap, "runs/%.*s", (int)n, base);
}

/* The option a word names, or NULL. */
static const st_cli_option *find_option(const st_cli_spec *spec,
                                        const char *word) {
  for (const st_cli_option *o = spec->options; o && o->name; o++)
    if (strcmp(o->name, word) == 0) return o;
  return NULL;
}

int st_cli_parse(int argc, char **argv, const st_cli_spec *spec) {
  int n_pos = 0;
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    const char **slot = NULL;
    const st_cli_option *o = find_option(spec, s);
    if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
      *spec->help = 1;
      continue;
    }
    if (o && o->flag) {
      *o->flag = 1;
      continue;
    }
    if (o) {
      slot = o->value;
    } else if (spec->sets && strcmp(s, "--set") == 0) {
      if (*spec->n_sets == ST_CLI_MAX_SETS)
        return st_cli_usage_error(spec->usage, "too many --set options%s", "");
      slot = &spec->sets[(*spec->n_sets)++];
    } else if (s[0] == '-' && s[1]) {
      return st_cli_usage_error(spec->usage, "unknown option '%s'", s);
    } else if (n_pos < 2 && spec->positional[n_pos]) {
      *spec->positional[n_pos++] = s;
      continue;
    } else {
      return st_cli_usage_error(spec->usage, "unexpected argument '%s'", s);
    }
    if (i + 1 >= argc)
      return st_cli_usage_error(spec->usage, "%s needs a value", s);
    /* `--set --out DIR` once set "--out" as the override and refused DIR
     * as a stray argument; `--out --overwrite` made a folder of that name */
    const char *next = argv[i + 1];
    if (find_option(spec, next) || !strcmp(next, "--set") ||
        !strcmp(next, "--help") || !strcmp(next, "-h")) {
      char why[160];
      snprintf(why, sizeof why, "%s needs a value before the option '%s'", s,
               next);
      return st_cli_usage_error(spec->usage, "%s", why);
    }
    *slot = argv[++i];
  }
  return 0;
}

int st_cli_whole(const char *text, uint64_t hi, uint64_t *v) {
  if (!*text || strspn(text, "0123456789") != strlen(text)) return 0;
  errno = 0;
  *v = strtoull(text, NULL, 10);
  return errno != ERANGE && *v <= hi;
}

int st_cli_real(const char *text, double *v) {
  if (!*text || strspn(text, "+-.0123456789eE") != strlen(text)) return 0;
  char *end;
  errno = 0;
  *v = strtod(text, &end);
  return end != text && !*end && errno != ERANGE && isfinite(*v);
}
