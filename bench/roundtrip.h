/*
 * roundtrip.h — how far apart two threads' cores are, for the benchmarks
 * that split small work across cores (bench_gpt, bench_pb): a cache
 * line's round trip between two threads.
 */
#ifndef STRATA_BENCH_ROUNDTRIP_H
#define STRATA_BENCH_ROUNDTRIP_H

#include "strata.h"

#include <pthread.h>
#include <stdatomic.h>

/* A cache line's round trip between two threads, in ns: hand-offs of an
 * atomic counter back and forth, PING_ROUNDS to a trial, the fastest of
 * PING_TRIALS trials (timed by one thread once both run, so neither
 * thread start-up nor a moment's interference from another process
 * counts). It tells how far apart the VM's vCPUs sit when it is measured
 * (on the 2-vCPU Zen 5 VM here: about 90-100 ns at times, 360-380 ns at
 * others, when each vCPU has an L3 of its own), which is what a batch-1
 * step's many small parallel ops pay for. 0 with fewer than 2 threads. */
enum { PING_ROUNDS = 4000, PING_TRIALS = 5 };
static _Atomic int ping_turn, ping_who;
static double ping_best_s;

static inline void *ping_thread(void *arg) {
  (void)arg;
  int me = atomic_fetch_add(&ping_who, 1); /* 0 or 1 */
  while (atomic_load(&ping_who) < 2)       /* both running */
    ;
  for (int trial = 0; trial < PING_TRIALS; trial++) {
    double t0 = st_now();
    for (int i = trial * PING_ROUNDS; i < (trial + 1) * PING_ROUNDS; i++) {
      while (atomic_load_explicit(&ping_turn, memory_order_acquire) !=
             2 * i + me)
        ;
      atomic_store_explicit(&ping_turn, 2 * i + me + 1, memory_order_release);
    }
    double t = st_now() - t0;
    if (me == 0 && (trial == 0 || t < ping_best_s)) ping_best_s = t;
  }
  return NULL;
}

/* 0 as well where fewer than 2 cpus are usable (two spinning threads on
 * one would hand off only when the scheduler preempts one: minutes) or
 * the second thread cannot be started. */
static inline double core_round_trip_ns(int threads) {
  if (threads < 2 || st_usable_cpus(NULL, 0) < 2) return 0;
  atomic_store(&ping_turn, 0);
  atomic_store(&ping_who, 0);
  pthread_t other;
  if (pthread_create(&other, NULL, ping_thread, NULL) != 0) return 0;
  ping_thread(NULL);
  pthread_join(other, NULL);
  return ping_best_s / PING_ROUNDS * 1e9;
}

#endif
