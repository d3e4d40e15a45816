/*
 * bench.c — `strata bench --calibrate`: measures this machine's kernel
 * rates and writes the calibration profile the cpu fabric loads
 * (docs/compiler.md, "Calibration"). Errors end as "strata: error: ..." and
 * exit status 1; a misused command line exits 2.
 */
#include "cli.h"
#include "strata.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *usage_bench =
    "usage: strata bench --calibrate [--out FILE] [--threads N] [--passes N]\n"
    "       strata bench --probe [--threads N]\n"
    "\n"
    "Measures this machine (about 16 seconds a pass on 2 cores): GEMM rate by\n"
    "shape class on one thread, the parallel efficiency e(c) at 1, 2, 4, ...\n"
    "threads, a narrow (8-row) GEMM hot and with its weights pushed out of "
    "the\n"
    "caches, the packed kernel against the BLAS per product class (strata\n"
    "train then takes the faster), the conv2d and attention kernels by shape\n"
    "class, the single-threaded ops (relu, groupnorm, maxpool, optimizer "
    "step,\n"
    "gelu) in bytes/s, the stage-to-stage copy and the machine's memory\n"
    "bandwidth (a triad past the last-level cache). Each figure is the median\n"
    "of its passes, so a burst of other load in one pass (a shared VM's\n"
    "neighbours) is outvoted. `strata compile` and `strata train` then\n"
    "predict cpu plans from these figures (docs/compiler.md).\n"
    "\n"
    "options:\n"
    "  --calibrate   measure and write the profile\n"
    "  --probe       print the machine's state now (0.1 s): one round trip\n"
    "                of an empty task to every thread of a pool and back,\n"
    "                the cost of moving data between the cores, which a\n"
    "                shared VM's host changes when it moves the vCPUs\n"
    "  --out FILE    where (default $STRATA_CALIBRATION, else\n"
    "                ~/.cache/strata/calibration.json)\n"
    "  --threads N   most threads to measure (default: usable cores)\n"
    "  --passes N    passes over every measurement, 1 to 9 (default 3)\n";

/* --passes/--threads: a whole number from 1 to max, or -1. */
static int count_of(const char *text, long max) {
  uint64_t n;
  return st_cli_whole(text, (uint64_t)max, &n) && n >= 1 ? (int)n : -1;
}

int st_cli_bench(int argc, char **argv) {
  int calibrate = 0, probe = 0, help = 0, threads = 0, passes = 3;
  const char *out = NULL, *threads_text = NULL, *passes_text = NULL;
  const st_cli_option options[] = {{"--calibrate", NULL, &calibrate},
                                   {"--probe", NULL, &probe},
                                   {"--out", &out, NULL},
                                   {"--threads", &threads_text, NULL},
                                   {"--passes", &passes_text, NULL},
                                   {NULL, NULL, NULL}};
  const st_cli_spec spec = {usage_bench, options, {NULL, NULL},
                            NULL,        NULL,    &help};
  int rc = st_cli_parse(argc, argv, &spec);
  if (rc || help) return rc ? rc : (fputs(usage_bench, stdout), 0);
  if (passes_text &&
      (passes = count_of(passes_text, ST_CALIBRATION_MAX_PASSES)) < 0)
    return st_cli_usage_error(usage_bench,
                              "--passes takes a count from 1 to 9, not '%s'",
                              passes_text);
  if (threads_text && (threads = count_of(threads_text, 4096)) < 0)
    return st_cli_usage_error(
        usage_bench, "--threads takes a count from 1 to 4096, not '%s'",
        threads_text);
  if (calibrate == probe)
    return st_cli_usage_error(
        usage_bench, "bench needs one of --calibrate and --probe%s", "");
  if (probe && (out || passes_text))
    return st_cli_usage_error(usage_bench, "--probe takes only --threads%s",
                              "");
  if (probe) {
    long n = threads ? threads : sysconf(_SC_NPROCESSORS_ONLN);
    double t = st_calibration_round_trip(n > 0 ? (int)n : 1);
    if (t < 0) {
      fprintf(stderr, "strata: error: probe: cannot start %ld threads\n", n);
      return 1;
    }
    printf("round trip on %ld thread%s: %.3f us\n", n, n == 1 ? "" : "s",
           t * 1e6);
    return 0;
  }
  char path[ST_PATH_MAX];
  if (out)
    snprintf(path, sizeof path, "%s", out);
  else
    st_calibration_path(path, sizeof path);
  /* a folder, FIFO or device there: refused now, not after the passes (the
   * write's rename would fail on a folder, or replace the other two) */
  st_error where = {0};
  if ((out || path[0]) &&
      st_cli_out_folder(out ? "--out" : "STRATA_CALIBRATION", path, &where))
    return st_cli_fail(&where);
  if (!path[0])
    return st_cli_usage_error(usage_bench,
                              "STRATA_CALIBRATION=none: give --out FILE%s", "");
  if (threads == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    threads = n > 0 ? (int)n : 1;
  }
  st_blas_init();
  st_error err = {0};
  st_calibration c, each[ST_CALIBRATION_MAX_PASSES],
      near[ST_CALIBRATION_MAX_PASSES];
  int keep[ST_CALIBRATION_MAX_PASSES], made = 0, kept = 0;
  /* a pass measured in another state than the usual one (a shared VM's
   * host moved its vCPUs: st_calibration_round_trip) is measured again,
   * up to twice the passes asked in all, and set aside */
  double ref = 0;
  int most = 2 * passes < ST_CALIBRATION_MAX_PASSES ? 2 * passes
                                                    : ST_CALIBRATION_MAX_PASSES;
  printf("strata: calibrating on %d thread%s (%s), %d pass%s\n", threads,
         threads == 1 ? "" : "s", st_blas_name(), passes,
         passes == 1 ? "" : "es");
  fflush(stdout);
  double t0 = st_now();
  rc = 0;
  while (!rc && kept < passes && made < most) {
    if (made >= passes)
      printf(" pass %d, again: %d of %d passes near\n", made + 1, kept, passes);
    else if (passes > 1)
      printf(" pass %d of %d\n", made + 1, passes);
    rc = st_calibration_measure(&each[made++], threads, stdout, &err);
    if (!rc) kept = st_calibration_near(each, made, keep, &ref);
  }
  int n = 0;
  if (!rc && kept == 0) { /* never near twice alike: every pass counts */
    printf(" no pass near another's state: the profile is the median of "
           "all %d\n",
           made);
    for (int k = 0; k < made; k++) keep[k] = 1;
  }
  for (int k = 0; k < made && !rc; k++) {
    if (keep[k])
      near[n++] = each[k];
    else
      printf(" pass %d set aside: its round trips %.3f and %.3f us, not "
             "within %.1f times the usual %.3f\n",
             k + 1, each[k].round_trip[0] * 1e6, each[k].round_trip[1] * 1e6,
             ST_CALIBRATION_FAR, ref * 1e6);
  }
  if (!rc && n < passes && kept > 0)
    printf(" %d of %d passes near: the profile is the median of %d\n", n,
           passes, n);
  passes = n;
  if (!rc && st_calibration_merge(&c, near, passes))
    rc = st_error_set(&err, ST_EARG,
                      "calibration: the passes disagree on "
                      "the threads measured");
  if (!rc && passes > 1)
    printf(" median of %d passes: gemm large %.2f GFLOP/s (one thread), "
           "e(c) = 1/(1 + %.4f (c - 1)), m(n) = 1/(1 + %.4f (n - 1)), "
           "spill %.1f us per MB, one row %.2f GB/s, optimizer %.2f GB/s "
           "(one thread)\n",
           passes, c.gemm_rate[ST_GEMM_CLASSES - 1] / 1e9, c.efficiency_slope,
           c.sharing_slope, c.spill_cost * 1048576.0 * 1e6,
           c.row_bandwidth / 1e9, c.op_bandwidth[3] / 1e9);
  if (!rc) rc = st_mkdir_p(path, 0, &err);
  if (!rc) rc = st_calibration_write(&c, path, &err);
  if (rc) {
    fprintf(stderr, "strata: error: %s\n", err.msg);
    return 1;
  }
  printf("strata: wrote %s (%.1f s)\n", path, st_now() - t0);
  return 0;
}
