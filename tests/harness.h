/*
 * harness.h — the test harness: a handful of macros, one file, no framework.
 * Each test program counts its checks and ends with the closing line
 * "N passed, N failed"; tools/run-tests.sh adds the lines up.
 * Tolerances are stated at each comparison, with the reason beside them.
 */
#ifndef STRATA_TEST_HARNESS_H
#define STRATA_TEST_HARNESS_H

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int th_passed, th_failed;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (cond) {                                                                \
      th_passed++;                                                             \
    } else {                                                                   \
      th_failed++;                                                             \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                     \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
    }                                                                          \
  } while (0)

/* Largest |a - b| / max(|b|, floor) over n floats; floor keeps tiny
 * reference values from turning rounding noise into huge ratios. */
static inline double th_max_rel(const float *a, const float *b, size_t n,
                                double floor_abs) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double den = fabs((double)b[i]);
    if (den < floor_abs) den = floor_abs;
    double r = fabs((double)a[i] - (double)b[i]) / den;
    if (!(r <= worst)) worst = r; /* NaN propagates as a failure */
  }
  return worst;
}

static inline double th_max_abs(const float *a, const float *b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

/* Compares two arrays and prints the worst difference, llm.c style. */
#define CHECK_CLOSE(what, got, want, n, tol, floor_abs)                        \
  do {                                                                         \
    double th_r = th_max_rel((got), (want), (n), (floor_abs));                 \
    CHECK(th_r <= (tol), "%s: max rel diff %.3g > tol %.3g", (what), th_r,     \
          (double)(tol));                                                      \
    if (getenv("STRATA_TEST_VERBOSE"))                                         \
      fprintf(stderr, "  %-40s max rel diff %.3g (tol %.3g)\n", (what), th_r,  \
              (double)(tol));                                                  \
  } while (0)

/* A test of threads that could wait for ever (a lost wake): after `seconds`
 * the program prints msg (a FAIL line) and exits 1 instead of hanging. */
static const char *th_alarm_msg;
static void th_timed_out(int sig) {
  (void)sig;
  (void)!write(2, th_alarm_msg, strlen(th_alarm_msg));
  _exit(1);
}
static inline void th_alarm(unsigned seconds, const char *msg) {
  th_alarm_msg = msg;
  signal(SIGALRM, th_timed_out);
  alarm(seconds);
}

#define TH_DONE()                                                              \
  do {                                                                         \
    printf("%d passed, %d failed\n", th_passed, th_failed);                    \
    return th_failed ? 1 : 0;                                                  \
  } while (0)

#endif
