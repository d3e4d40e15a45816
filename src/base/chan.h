/*
 * chan.h — hand-offs between the threads of one process (chan.c): a waiter
 * where one thread spins a while, then sleeps, and a one-producer,
 * one-consumer ring of (micro-batch, buffer) messages. The stage runtime
 * links in-process stages with them; calibration times its hand-off with
 * the same waiter.
 */
#ifndef STRATA_BASE_CHAN_H
#define STRATA_BASE_CHAN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* A waiter is where one thread sleeps: st_wait_ge spins `spin` polls, then
 * sleeps until *val >= want (0) or either stop flag is set (-1; a NULL flag is
 * never set). st_waiter_wake wakes it only if it sleeps, after the value
 * was published; st_waiter_wake_always after a stop flag was set. */
enum { ST_SPIN = 4000 }; /* polls before a waiting stage thread sleeps */
/* A stage waiting for a message of its step (about 1 ms of ~25 ns polls
 * on Zen 4). Asleep there, it cost a hand-off 31-37 us from the send to
 * the receiver's work, the send 12.5 us of it (the futex wake), twice a
 * micro-batch: cnn_fmnist's 2-stage pipeline at batch 1 on the 2-vCPU Zen
 * 4 VM, where a stage waits 200-450 us. A message is due within the other
 * stages' work on a micro-batch; a wait past the spin pays the wake at
 * under 4% of it. Between steps the caller needs a core, and the stages
 * spin ST_SPIN there: spinning as long cost fc_mnist's pipeline at batch
 * 1 up to a quarter of its rate. */
enum { ST_SPIN_LINK = 40000 };
typedef struct st_waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_int sleeping;
} st_waiter;
void st_waiter_init(st_waiter *w);
void st_waiter_destroy(st_waiter *w);
void st_waiter_wake(st_waiter *w);
void st_waiter_wake_always(st_waiter *w);
int st_wait_ge(st_waiter *w, const atomic_llong *val, long long want, int spin,
               const atomic_int *stop_a, const atomic_int *stop_b);
/* A one-producer, one-consumer ring of messages (micro-batch n, buffer).
 * st_chan_put returns -1 when the ring is full (the caller's schedule
 * allows no more: a bug); after a message is put, the caller wakes the
 * receiver's waiter.
 * st_chan_take waits on the receiver's waiter (-1: stopped). Reset only
 * while neither end runs. */
typedef struct st_msg {
  int64_t n;
  const float *data;
} st_msg;
typedef struct st_chan {
  atomic_llong sent, taken;
  st_msg *buf;
  int cap;
} st_chan;
int st_chan_init(st_chan *c, int cap);
void st_chan_free(st_chan *c);
void st_chan_reset(st_chan *c);
int st_chan_put(st_chan *c, int64_t n, const float *data);
int st_chan_take(st_chan *c, st_waiter *w, int spin, const atomic_int *stop_a,
                 const atomic_int *stop_b, st_msg *out);

#endif
