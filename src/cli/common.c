/*
 * common.c — what every `strata` command shares: the one-line error and
 * usage-error conventions and the default output folder.
 */
#include "strata.h"
#include "cli.h"

#include <string.h>

int st_cli_fail(const st_error *err) {
  /* over MPI ranks an error every rank shares is printed once, by rank 0;
   * one rank's own error names the rank */
  if (st_dist_size() > 1 && st_dist_rank() > 0) {
    if (!st_dist_error_shared())
      fprintf(stderr, "strata: error: rank %d: %s\n", st_dist_rank(), err->msg);
    return 1;
  }
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
    *slot = argv[++i];
  }
  return 0;
}
