/*
 * mem.c — the one allocator strata uses: aligned, zero-filled, counted.
 * The counter lets a test prove that steady-state training allocates nothing.
 */
#include "strata.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint64_t alloc_count;

/* Buffers of BIG bytes or more start on a 2 MB boundary. Left to glibc
 * (a mapping of their own, 64 bytes in), the MLP's batch-1 step ran at
 * 3.7-3.9k samples/s in every run with address randomization off and at
 * anything from 3.8k to 16.7k with it on, 84% of a slow run in the
 * fused update that streams the weights and their momentum
 * (st_optim_update_outer); 2 MB-aligned, 14.3-16.3k either way. The cause
 * lies in how the big slabs sit relative to one another above the 4 KB
 * page (no hardware counters here to say which structure; moving them
 * within the page did not help); aligning them makes the layout, and the
 * speed, the same in every run. Only the bytes asked for are touched: the
 * rounding to 2 MB stays unbacked virtual memory. */
enum { BIG = 1 << 19, BIG_ALIGN = 1 << 21 };

void *st_alloc(size_t bytes) {
  atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
  if (bytes == 0) bytes = 1;
  if (bytes > SIZE_MAX - 2 * (size_t)BIG_ALIGN) return NULL;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  size_t align = rounded >= BIG ? BIG_ALIGN : 64;
  size_t size = (rounded + align - 1) & ~(align - 1);
  void *p = aligned_alloc(align, size);
  if (!p) return NULL;
  /* Where transparent huge pages are always on, a 2 MB-aligned block
   * would be backed by a whole huge page at its first touch: not for one
   * under 2 MB (advice only; a failure leaves the default). */
  if (align == BIG_ALIGN && size == BIG_ALIGN && rounded < size)
    (void)madvise(p, size, MADV_NOHUGEPAGE);
  memset(p, 0, rounded);
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

double st_usable_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double ram = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
  FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
  double lim;
  if (f && fscanf(f, "%lf", &lim) == 1 && lim > 0 && (ram == 0 || lim < ram))
    ram = lim; /* "max" (no limit) does not scan as a number */
  if (f) fclose(f);
  return ram;
}
