/*
 * chan.c — how the threads of one process hand work to each other (the
 * stage runtime's in-process links, calibration): a waiter (spin a while, then
 * sleep on a condition variable, woken only when asleep) and a one-producer,
 * one-consumer ring of (micro-batch, buffer) messages.
 *
 * Why not one mutex and a broadcast: every hand-off then costs a futex
 * system call and wakes threads that have nothing to do. A stage whose
 * next message is due within microseconds finds it while spinning; a
 * sender pays a system call only when its receiver is really asleep.
 *
 * The sleeping protocol: the sleeper sets `sleeping` (under its mutex)
 * before its last look at the value, and the waker publishes the value
 * before it looks at `sleeping`; both are sequentially consistent, so one
 * of them sees the other and no wake-up is lost.
 */
#include "chan.h"

#include "relax.h"

#include <stdlib.h>

void st_waiter_init(st_waiter *w) {
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  atomic_init(&w->sleeping, 0);
}

void st_waiter_destroy(st_waiter *w) {
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}

void st_waiter_wake(st_waiter *w) {
  if (!atomic_load(&w->sleeping)) return;
  st_waiter_wake_always(w);
}

void st_waiter_wake_always(st_waiter *w) {
  pthread_mutex_lock(&w->mu);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static int stopped(const atomic_int *a, const atomic_int *b) {
  return (a && atomic_load(a)) || (b && atomic_load(b));
}

int st_wait_ge(st_waiter *w, const atomic_llong *val, long long want, int spin,
               const atomic_int *stop_a, const atomic_int *stop_b) {
  for (int i = 0; i < spin; i++) {
    if (atomic_load(val) >= want) return 0;
    if (stopped(stop_a, stop_b)) return -1;
    st_cpu_relax();
  }
  pthread_mutex_lock(&w->mu);
  atomic_store(&w->sleeping, 1);
  while (atomic_load(val) < want && !stopped(stop_a, stop_b))
    pthread_cond_wait(&w->cv, &w->mu);
  atomic_store(&w->sleeping, 0);
  pthread_mutex_unlock(&w->mu);
  return atomic_load(val) >= want ? 0 : -1;
}

int st_chan_init(st_chan *c, int cap) {
  atomic_init(&c->sent, 0);
  atomic_init(&c->taken, 0);
  c->cap = cap;
  c->buf = malloc((size_t)cap * sizeof *c->buf);
  return c->buf ? 0 : -1;
}

void st_chan_free(st_chan *c) {
  free(c->buf);
  c->buf = NULL;
}

void st_chan_reset(st_chan *c) {
  atomic_store(&c->sent, 0);
  atomic_store(&c->taken, 0);
}

int st_chan_put(st_chan *c, int64_t n, const float *data) {
  long long s = atomic_load_explicit(&c->sent, memory_order_relaxed);
  if (s - atomic_load(&c->taken) >= c->cap) return -1;
  c->buf[s % c->cap] = (st_msg){n, data};
  atomic_store(&c->sent, s + 1);
  return 0;
}

int st_chan_take(st_chan *c, st_waiter *w, int spin, const atomic_int *stop_a,
                 const atomic_int *stop_b, st_msg *out) {
  long long t = atomic_load_explicit(&c->taken, memory_order_relaxed);
  if (st_wait_ge(w, &c->sent, t + 1, spin, stop_a, stop_b)) return -1;
  *out = c->buf[t % c->cap];
  atomic_store(&c->taken, t + 1);
  return 0;
}
