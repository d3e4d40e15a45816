/*
 * cli.h — private to src/cli/: commands that live in files of their own.
 * Each takes the arguments after the command word (argv[0] is the first
 * option or operand) and returns the exit status: 0, 1 for an error
 * ("strata: error: ..."), 2 for a misused command line.
 */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

/* strata compile CONFIG [...] (compile.c) */
int st_cli_compile(int argc, char **argv);
/* strata bench --calibrate [...] (bench.c) */
int st_cli_bench(int argc, char **argv);
/* strata tokenize train|encode [...] (tokenize.c) */
int st_cli_tokenize(int argc, char **argv);
/* strata sweep CONFIG --batch-sizes ... --target ... (sweep.c) */
int st_cli_sweep(int argc, char **argv);

#endif
