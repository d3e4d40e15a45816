/*
 * mem.c — the one allocator strata uses: aligned, zero-filled, counted.
 * The counter lets a test prove that steady-state training allocates nothing.
 */
#include "strata.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Atomic uint64_t alloc_count;

void *st_alloc(size_t bytes) {
  atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
  if (bytes == 0) bytes = 1;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, rounded);
  if (p) memset(p, 0, rounded);
  return p;
}

void st_free(void *p) { free(p); }

uint64_t st_alloc_count(void) {
  return atomic_load_explicit(&alloc_count, memory_order_relaxed);
}

double st_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
