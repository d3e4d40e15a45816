/*
 * relax.h — the pause inside a spin-wait, shared by the thread pool
 * (pool.c) and the stage hand-off (src/exec/chan.c).
 */
#ifndef STRATA_BASE_RELAX_H
#define STRATA_BASE_RELAX_H

/* Tells the core this thread is spinning: an SMT sibling gets the core's
 * issue slots meanwhile, and leaving the loop costs no mis-speculation. */
static inline void st_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

#endif
