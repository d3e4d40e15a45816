/*
 * cli.h — private to src/cli/: commands that live in files of their own.
 * Each takes the arguments after the command word (argv[0] is the first
 * option or operand) and returns the exit status: 0, 1 for an error
 * ("strata: error: ..."), 2 for a misused command line.
 */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

#include "strata.h"

/* Shared conventions (common.c). */
int st_cli_fail(const st_error *err); /* "strata: error: ...", returns 1 */
/* "strata: <fmt with what>" then the usage text; returns 2 */
int st_cli_usage_error(const char *usage, const char *fmt, const char *what);
/* The last usage error's line, as st_cli_usage_error formatted it. */
const char *st_cli_usage_pending(void);
/* An output file's path that names a folder: "OPTION PATH: a folder, not
 * a file" into err and 1, before any work (the write at the end failed
 * with "rename failed: Is a directory"); one that names another file that
 * is not regular (a device, a FIFO: the atomic write's rename would
 * replace it) likewise, and an empty path ("OPTION: an empty path");
 * else 0. */
int st_cli_out_folder(const char *option, const char *path, st_error *err);
/* 1 if paths a and b name the same existing file or folder (an output the
 * atomic write would rename over an input), else 0. */
int st_cli_same_file(const char *a, const char *b);
/* One line on stderr for each key cfg sets that its setting does not read
 * (st_config_unused): "strata: notice: WHERE: KEY is not used by WHY;
 * ignored". train and compile say the same of the same config. */
void st_cli_notice_unused(const st_config *cfg);
/* runs/<config file name without extension> */
void st_cli_default_out(char *out, size_t cap, const char *config);
/* Numbers on the command line, as written: a whole number in [0, hi], every
 * character a decimal digit (strtol alone takes blanks, a sign, and
 * strtoull wraps "-1"); a real, finite, in decimal digits with a sign, a
 * point and an exponent (strtod alone takes blanks, hex, inf and nan).
 * 1 and *v, else 0. */
int st_cli_whole(const char *text, uint64_t hi, uint64_t *v);
int st_cli_real(const char *text, double *v);

/* Command-line parsing shared by every command: --help/-h, a repeatable
 * --set KEY=VALUE, valued options ("--out DIR"), flags, and up to two
 * positional operands. Misuse gives a usage error (exit status 2). */
#define ST_CLI_MAX_SETS 64

typedef struct st_cli_option {
  const char *name;   /* "--out" */
  const char **value; /* valued option: where its text goes */
  int *flag;          /* flag (no value): set to 1 */
} st_cli_option;

typedef struct st_cli_spec {
  const char *usage;
  const st_cli_option *options; /* ends with a {NULL} entry */
  const char **positional[2];   /* where operands go; NULL = none accepted */
  const char **sets;            /* ST_CLI_MAX_SETS slots, or NULL: no --set */
  int *n_sets;
  int *help;
} st_cli_spec;

int st_cli_parse(int argc, char **argv, const st_cli_spec *spec);

/* strata compile CONFIG [...] (compile.c) */
int st_cli_compile(int argc, char **argv);
/* strata bench --calibrate [...] (bench.c) */
int st_cli_bench(int argc, char **argv);
/* strata tokenize train|encode [...] (tokenize.c) */
int st_cli_tokenize(int argc, char **argv);
/* strata sweep CONFIG --batch-sizes ... --target ... (sweep.c) */
int st_cli_sweep(int argc, char **argv);
/* strata experiment pb CONFIG [...] (experiment.c) */
int st_cli_experiment(int argc, char **argv);

#endif
