/*
 * fpmode.c — subnormal numbers flushed to zero, or kept, on every thread
 * that computes.
 *
 * A product whose inputs or result fall below FLT_MIN (1.2e-38) takes a
 * slow path on x86 cores, 3x to 20x (the softmax's gradients of the wrong
 * classes go there as a model grows confident, and every product
 * downstream with them). The CPU can instead treat subnormal inputs as
 * zero (DAZ) and write subnormal results as zero (FTZ), as GPUs and most
 * training frameworks' fast paths do. The mode is a register of each
 * thread (MXCSR on x86, FPCR on AArch64), so it is one process-wide
 * setting that every thread which computes applies whenever it takes up
 * work: the main thread, pool workers, stage workers, the store's
 * threads, replica drivers. All threads in one mode, so a result does not
 * depend on which thread computed it, and every bit-identity between modes
 * and thread counts holds in either.
 */
#include "strata.h"

#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
enum { FLUSH_BITS = 0x8040 }; /* MXCSR: FTZ (bit 15) | DAZ (bit 6) */
static unsigned read_mode(void) { return _mm_getcsr(); }
static void write_mode(unsigned v) { _mm_setcsr(v); }
static const char support[] = "x86 MXCSR FTZ+DAZ";
#elif defined(__aarch64__)
enum { FLUSH_BITS = 1u << 24 }; /* FPCR.FZ */
static unsigned read_mode(void) {
  unsigned long v;
  __asm__ volatile("mrs %0, fpcr" : "=r"(v));
  return (unsigned)v;
}
static void write_mode(unsigned v) {
  unsigned long w = v;
  __asm__ volatile("msr fpcr, %0" : : "r"(w));
}
static const char support[] = "AArch64 FPCR FZ";
#else
enum { FLUSH_BITS = 0 };
static unsigned read_mode(void) { return 0; }
static void write_mode(unsigned v) { (void)v; }
static const char support[] = "none (subnormals kept)";
#endif

static atomic_int flush_mode; /* 0: IEEE subnormals (the C default) */

void st_fp_apply(void) {
  unsigned now = read_mode();
  unsigned want = atomic_load_explicit(&flush_mode, memory_order_relaxed)
                      ? now | FLUSH_BITS
                      : now & ~(unsigned)FLUSH_BITS;
  if (want != now) write_mode(want);
}

void st_fp_set_flush(int flush) {
  atomic_store(&flush_mode, flush != 0);
  st_fp_apply();
}

int st_fp_flush(void) { return atomic_load(&flush_mode); }

int st_fp_thread_flushes(void) {
  return FLUSH_BITS && (read_mode() & FLUSH_BITS) == FLUSH_BITS;
}

const char *st_fp_flush_support(void) { return support; }
