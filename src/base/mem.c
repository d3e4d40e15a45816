/*
 * mem.c — the one allocator strata uses: aligned, zero-filled, counted.
 * The counter lets a test prove that steady-state training allocates nothing.
 */
#include "strata.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint64_t alloc_count;
/* bytes held (st_alloc's usable sizes and committed slab pages) and the
 * most held at once */
static _Atomic size_t held, peak;

static void hold(size_t bytes) {
  size_t now =
      atomic_fetch_add_explicit(&held, bytes, memory_order_relaxed) + bytes;
  size_t top = atomic_load_explicit(&peak, memory_order_relaxed);
  while (now > top &&
         !atomic_compare_exchange_weak_explicit(
             &peak, &top, now, memory_order_relaxed, memory_order_relaxed)) {
  }
}

static void unhold(size_t bytes) {
  atomic_fetch_sub_explicit(&held, bytes, memory_order_relaxed);
}

/* A buffer on a 2 MB boundary is counted by the bytes asked for (rounded
 * to 64), not by glibc's usable size, which includes the alignment's
 * unbacked slack (4 MB more on a 40 MB slab): these few big buffers are
 * listed with their counted size until freed. */
static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static struct big {
  void *p;
  size_t bytes;
} * bigs;
static size_t n_bigs, cap_bigs;

static int big_add(void *p, size_t bytes) {
  pthread_mutex_lock(&big_lock);
  int ok = 1;
  if (n_bigs == cap_bigs) {
    size_t cap = cap_bigs ? 2 * cap_bigs : 64;
    struct big *grown = realloc(bigs, cap * sizeof *grown);
    if (grown)
      bigs = grown, cap_bigs = cap;
    else
      ok = 0;
  }
  if (ok) bigs[n_bigs++] = (struct big){p, bytes};
  pthread_mutex_unlock(&big_lock);
  return ok;
}

/* The counted size of p if it is a big buffer (removed from the list),
 * else 0. */
static size_t big_take(void *p) {
  size_t bytes = 0;
  pthread_mutex_lock(&big_lock);
  for (size_t i = n_bigs; i-- > 0;)
    if (bigs[i].p == p) {
      bytes = bigs[i].bytes;
      bigs[i] = bigs[--n_bigs];
      break;
    }
  pthread_mutex_unlock(&big_lock);
  return bytes;
}

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
   * under 2 MB (advice only; a failure leaves the default). A bigger one
   * asks for huge pages over its whole 2 MB pieces, all within the bytes
   * the memset below touches, so no more memory is backed than without:
   * Debian's default ("madvise") gives them only when asked, and strata
   * never asked, so the GPT-2 124M step's 3.2 GB sat in 4 KB pages. With
   * the advice `bench_gpt 124m 4 2` rose by 4.6% on average over 4
   * alternating pairs on a Zen 3 VM (156.7 against 149.8 tokens/s) and
   * about 2% on the Intel Xeon VM (see docs/bench.md, thirty-sixth
   * session). */
  if (align == BIG_ALIGN && size == BIG_ALIGN && rounded < size)
    (void)madvise(p, size, MADV_NOHUGEPAGE);
  else if (align == BIG_ALIGN && rounded >= BIG_ALIGN)
    (void)madvise(p, rounded & ~((size_t)BIG_ALIGN - 1), MADV_HUGEPAGE);
  memset(p, 0, rounded);
  if (align == BIG_ALIGN && !big_add(p, rounded)) {
    free(p);
    return NULL;
  }
  hold(align == BIG_ALIGN ? rounded : malloc_usable_size(p));
  return p;
}

void st_free(void *p) {
  if (!p) return;
  size_t big = (uintptr_t)p % BIG_ALIGN == 0 ? big_take(p) : 0;
  unhold(big ? big : malloc_usable_size(p));
  free(p);
}

/* ------------------------------------------------- per-thread scratch */

typedef struct scratch_bufs {
  size_t cap[ST_SCRATCH_SLOTS];
  void *p[ST_SCRATCH_SLOTS];
} scratch_bufs;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_bufs_free(void *v) {
  scratch_bufs *b = v;
  for (int i = 0; i < ST_SCRATCH_SLOTS; i++) st_free(b->p[i]);
  free(b);
}

static void scratch_key_init(void) {
  scratch_key_ok = !pthread_key_create(&scratch_key, scratch_bufs_free);
}

void *st_thread_scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= ST_SCRATCH_SLOTS) return NULL;
  pthread_once(&scratch_once, scratch_key_init);
  if (!scratch_key_ok) return NULL;
  scratch_bufs *b = pthread_getspecific(scratch_key);
  if (!b) {
    if (!(b = calloc(1, sizeof *b))) return NULL;
    if (pthread_setspecific(scratch_key, b)) {
      free(b);
      return NULL;
    }
  }
  if (b->cap[slot] < bytes) {
    st_free(b->p[slot]);
    b->p[slot] = st_alloc(bytes);
    b->cap[slot] = b->p[slot] ? bytes : 0;
  }
  return b->p[slot];
}

size_t st_alloc_counted(size_t bytes) {
  if (bytes == 0) bytes = 1;
  return (bytes + 63) & ~(size_t)63;
}

size_t st_alloc_bytes(void) {
  return atomic_load_explicit(&held, memory_order_relaxed);
}

size_t st_alloc_peak(void) {
  return atomic_load_explicit(&peak, memory_order_relaxed);
}

void st_alloc_reset_peak(void) {
  atomic_store_explicit(&peak, st_alloc_bytes(), memory_order_relaxed);
}

static size_t page_size(void) {
  long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? (size_t)page : 4096;
}

int st_slab_reserve(st_slab *s, size_t bytes) {
  memset(s, 0, sizeof *s);
  size_t page = page_size();
  if (bytes == 0) bytes = 1;
  if (bytes > SIZE_MAX - page) return -1;
  bytes = (bytes + page - 1) & ~(page - 1);
  void *p = mmap(NULL, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return -1;
  s->base = p;
  s->bytes = bytes;
  return 0;
}

int st_slab_commit(st_slab *s, size_t off, size_t n) {
  size_t page = page_size();
  if (n == 0) return 0;
  if (off > s->bytes || n > s->bytes - off) return -1;
  size_t lo = off & ~(page - 1), hi = (off + n + page - 1) & ~(page - 1);
  if (lo < s->end) lo = s->end; /* its first page is committed already */
  if (hi <= lo) return 0;
  if (mprotect((char *)s->base + lo, hi - lo, PROT_READ | PROT_WRITE))
    return -1;
  s->committed += hi - lo;
  s->end = hi;
  hold(hi - lo);
  return 0;
}

void st_slab_release(st_slab *s) {
  if (!s->base) return;
  munmap(s->base, s->bytes);
  unhold(s->committed);
  memset(s, 0, sizeof *s);
}

uint64_t st_alloc_count(void) {
  return atomic_load_explicit(&alloc_count, memory_order_relaxed);
}

double st_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double st_peak_resident(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lf kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb < 0 ? -1 : kb * 1024;
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
