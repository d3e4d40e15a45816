/*
 * pool.c — a small persistent thread pool (STYLE.md 18). A stage owns one pool
 * sized to its cores; each op splits its work into tasks that depend only on
 * the problem shape, never on the thread count, so results are bitwise the
 * same with 1 or N threads. Workers spin briefly between jobs (ops come in
 * quick succession during a step), then sleep on a condition variable.
 *
 * Who runs which task: each taking part (the caller and the active
 * workers) owns a contiguous block of the tasks and runs it in order, then
 * takes what is left of the others' blocks. The same op in the next step
 * gives the same thread the same block, so what its tasks wrote last time
 * (an optimizer chunk's weights and moments, say) is still in that core's
 * caches; and taking a task from one's own block is an atomic add on a
 * line that, once the caller has set the job up, no other thread touches
 * unless it comes to steal. One shared counter handed tasks to whichever
 * thread came first. At times this VM's two vCPUs sit on different L3s (a
 * cache line's round trip between them 360 ns, against 100 ns at others);
 * there, gpt_tiny's batch-1 step on 2 threads ran at 35.5-36.6k tokens/s
 * with the shared counter and 36.4-37.9k with blocks (6 alternating
 * pairs, blocks ahead in 5). Which thread runs a task never changes a
 * result: tasks depend only on the problem's shape.
 */
#include "strata.h"

#include "relax.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A worker's turn in the current job: (job << 2) | TURN_*. The caller sets
 * it WAITING for each worker taking part; the worker moves it to RUNNING
 * before it touches the job, or finds it SKIPPED: once every task has been
 * taken, the caller skips the workers that have not started, rather than
 * wait for them to be scheduled just to find nothing left. */
enum { TURN_WAITING = 0, TURN_RUNNING = 1, TURN_SKIPPED = 2 };
typedef struct worker {
  _Alignas(64) _Atomic uint64_t turn;
  struct st_pool *pool;
  int index; /* 0 .. nthreads - 2 */
} worker;

/* One participant's block of the current job's tasks: next is the next
 * task not yet taken, end one past its last. Others take from it once
 * their own block is done. A cache line each, so that taking a task from
 * one's own block touches no line another thread writes, unless it comes
 * to steal. */
typedef struct block {
  _Alignas(64) _Atomic int next;
  int end;
} block;

/* generation = (job counter << ACTIVE_BITS) | workers taking part: read in
 * one load, so a slow worker can never pair one job's counter with another
 * job's participant count. */
enum { ACTIVE_BITS = 16 };

struct st_pool {
  int nthreads; /* including the caller */
  pthread_t *threads;
  worker *workers;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  /* The current job; written by the caller before it bumps `generation`,
   * read by workers after they see the new generation. */
  void (*fn)(void *arg, int task);
  void *arg;
  int parts;     /* the caller and the workers taking part */
  block *blocks; /* nthreads of them: participant i (caller 0, worker w w+1) */
  _Atomic int busy_workers;
  _Atomic uint64_t generation;
  _Atomic int stop;
  _Atomic int sleepers; /* workers asleep, or about to be, on `wake` */
  double spin_s;        /* SPIN_S, or SPIN_SHARED_S on shared cores */
};

/* A worker waits for the next job spinning for about SPIN_S, then sleeps.
 * The ops of a step come microseconds apart, but a serial stretch between
 * them (a small op the caller runs alone, the loss, the next batch) can
 * last hundreds of microseconds: a worker that fell asleep there costs a
 * futex wake and a reschedule, 10-50 us, on the next op. With 2 threads on
 * gpt_tiny at batch 1, in a 2-3 s run: a spin of 16k rounds (about 20 us
 * here) slept 15,000 times; 200 us, 1,500-2,000 times, at 1.14-1.24x the
 * step rate of the short spin; 1 ms, 120-170 times. The caller spins as
 * long before it yields. */
#define SPIN_S 1e-3
/* A pool with more threads than the usable cores spins briefly: there a
 * spinning worker holds a core the caller or another worker needs (a pool
 * of 8 threads on 2 cores ran test_pool 25x slower at 1 ms). Decided per
 * pool: pools that each fit but run at once (a sweep's jobs with
 * train.threads set) still spin long. */
#define SPIN_SHARED_S 20e-6
enum { SPIN_CHECK = 256 }; /* rounds between looks at the clock */

/* Participant `me` runs its own block, then what is left of the others',
 * going round from the next one. */
static void run_tasks(st_pool *p, int me) {
  for (int i = 0; i < p->parts; i++) {
    block *b = &p->blocks[(me + i) % p->parts];
    for (;;) {
      int t = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed);
      if (t >= b->end) break;
      p->fn(p->arg, t);
    }
  }
}

static void *worker_main(void *arg) {
  worker *self = arg;
  st_pool *p = self->pool;
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    unsigned spins = 0;
    double since = st_now(), spin = p->spin_s;
    while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) ==
               seen &&
           !atomic_load(&p->stop)) {
      st_cpu_relax();
      if (++spins % SPIN_CHECK) continue;
      if (st_now() - since < spin) continue;
      /* Announce the sleep before the last look at generation (both
       * sequentially consistent, as the caller's store of generation and
       * its load of sleepers): either the caller sees this sleeper and
       * broadcasts under the mutex, or this look sees its job. */
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->stop)) break;
    seen = g;
    /* Only the first `active` workers take part; the others go back to
     * waiting without touching the job. */
    if (self->index >= (int)(g & ((1u << ACTIVE_BITS) - 1))) continue;
    uint64_t job = g >> ACTIVE_BITS, want = job << 2 | TURN_WAITING;
    if (!atomic_compare_exchange_strong(&self->turn, &want,
                                        job << 2 | TURN_RUNNING))
      continue;    /* skipped: the caller took every task */
    st_fp_apply(); /* the run's subnormal mode (a load and a compare) */
    run_tasks(p, self->index + 1);
    atomic_fetch_sub_explicit(&p->busy_workers, 1, memory_order_release);
  }
  return NULL;
}

/* strata.h; the pool's spin depends on it */
int st_usable_cpus(int *cpus, int cap) {
  cpu_set_t set;
  int n = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) {
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &set)) {
        if (n < cap) cpus[n] = c;
        n++;
      }
    return n;
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  n = online > 0 ? (int)online : 1;
  for (int c = 0; c < n && c < cap; c++) cpus[c] = c;
  return n;
}

static st_pool *create(int nthreads, int brief) {
  if (nthreads < 1) nthreads = 1;
  if (nthreads > (1 << ACTIVE_BITS)) nthreads = 1 << ACTIVE_BITS;
  st_pool *p = st_alloc(sizeof *p);
  if (!p) return NULL;
  p->nthreads = nthreads;
  p->spin_s =
      !brief && nthreads <= st_usable_cpus(NULL, 0) ? SPIN_S : SPIN_SHARED_S;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  if (nthreads > 1) {
    p->blocks = st_alloc(sizeof(block) * (size_t)nthreads);
    if (!p->blocks) goto fail;
    p->threads = st_alloc(sizeof(pthread_t) * (size_t)(nthreads - 1));
    p->workers = st_alloc(sizeof(worker) * (size_t)(nthreads - 1));
    if (!p->threads || !p->workers) {
      p->nthreads = 1; /* no thread started: destroy joins none */
      goto fail;
    }
    for (int i = 0; i < nthreads - 1; i++) {
      p->workers[i] = (worker){.pool = p, .index = i};
      if (pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]) !=
          0) {
        p->nthreads = i + 1; /* destroy joins the ones that started */
        goto fail;
      }
    }
  }
  return p;
fail:
  st_pool_destroy(p);
  return NULL;
}

st_pool *st_pool_create(int nthreads) { return create(nthreads, 0); }

st_pool *st_pool_create_brief(int nthreads) { return create(nthreads, 1); }

void st_pool_destroy(st_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  if (p->threads)
    for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->threads[i], NULL);
  st_free(p->threads);
  st_free(p->workers);
  st_free(p->blocks);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  st_free(p);
}

int st_pool_threads(const st_pool *p) { return p ? p->nthreads : 1; }

void st_pool_for(st_pool *p, int ntasks, void (*fn)(void *arg, int task),
                 void *arg) {
  if (ntasks <= 0) return;
  if (!p || p->nthreads == 1 || ntasks == 1) {
    for (int t = 0; t < ntasks; t++) fn(arg, t);
    return;
  }
  /* The caller runs tasks too, so ntasks - 1 helpers at most are useful. */
  int active = ntasks - 1 < p->nthreads - 1 ? ntasks - 1 : p->nthreads - 1;
  p->fn = fn;
  p->arg = arg;
  p->parts = active + 1;
  for (int i = 0; i < p->parts; i++) {
    atomic_store_explicit(&p->blocks[i].next,
                          (int)((long long)ntasks * i / p->parts),
                          memory_order_relaxed);
    p->blocks[i].end = (int)((long long)ntasks * (i + 1) / p->parts);
  }
  atomic_store_explicit(&p->busy_workers, active, memory_order_relaxed);
  uint64_t job = (atomic_load_explicit(&p->generation, memory_order_relaxed) >>
                  ACTIVE_BITS) +
                 1;
  for (int i = 0; i < active; i++)
    atomic_store_explicit(&p->workers[i].turn, job << 2 | TURN_WAITING,
                          memory_order_relaxed);
  atomic_store(&p->generation, job << ACTIVE_BITS | (uint64_t)active);
  /* only sleeping workers need the mutex and a wake (see worker_main) */
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
  }
  run_tasks(p, 0);
  /* Every task is taken: a worker that has not started has nothing left
   * to do, and waiting for it would wait for the scheduler (on a machine
   * whose cores other processes share, a time slice each job). */
  for (int i = 0; i < active; i++) {
    uint64_t want = job << 2 | TURN_WAITING;
    if (atomic_compare_exchange_strong(&p->workers[i].turn, &want,
                                       job << 2 | TURN_SKIPPED))
      atomic_fetch_sub_explicit(&p->busy_workers, 1, memory_order_relaxed);
  }
  unsigned spins = 0;
  double since = 0, spin = 0;
  while (atomic_load_explicit(&p->busy_workers, memory_order_acquire) > 0) {
    st_cpu_relax();
    if (++spins % SPIN_CHECK) continue;
    double now = st_now();
    if (since == 0) since = now, spin = p->spin_s;
    if (now - since >= spin) sched_yield();
  }
}

int st_pin_thread(pthread_t thread, const int *cpus, int n) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int i = 0; i < n; i++)
    if (cpus[i] >= 0 && cpus[i] < CPU_SETSIZE) CPU_SET(cpus[i], &set);
  return CPU_COUNT(&set) &&
                 pthread_setaffinity_np(thread, sizeof set, &set) == 0
             ? 0
             : -1;
}

int st_pool_pin(st_pool *p, const int *cpus, int n) {
  int rc = 0;
  for (int i = 0; p && i < p->nthreads - 1; i++)
    if (st_pin_thread(p->threads[i], cpus, n)) rc = -1;
  return rc;
}

void st_run_workers(int workers, void *(*fn)(void *arg), void *arg) {
  pthread_t *threads =
      calloc(workers > 1 ? (size_t)workers - 1 : 1, sizeof *threads);
  int started = 0;
  if (threads)
    while (started < workers - 1 &&
           pthread_create(&threads[started], NULL, fn, arg) == 0)
      started++;
  fn(arg);
  for (int j = 0; j < started; j++) pthread_join(threads[j], NULL);
  free(threads);
}

/* ------------------------------------------------ elementwise on the pool */

/* Pieces by the length alone (each element's result is the same however
 * the work is cut); under ELEMENTWISE_MIN elements (two pieces), inline:
 * an MLP's bias sums at batch 1 (256 floats, tens of nanoseconds) would
 * otherwise wait on a hand-off (about 0.5 us, bench_gpt's round_trip_ns).
 * In a GPT-2 step these loops (the bias gradients, the residuals'
 * gradients kept and added back) ran on the caller alone, about 1% of the
 * step, the workers waiting. */
enum { ELEMENTWISE_CHUNK = 1 << 14, ELEMENTWISE_MIN = 1 << 15, SUM_COLS = 128 };

typedef struct elementwise_job {
  float *dst;
  const float *src;
  size_t n;
  int rows, cols, add;
} elementwise_job;

static void elementwise_task(void *arg, int task) {
  const elementwise_job *j = arg;
  size_t lo = (size_t)task * ELEMENTWISE_CHUNK;
  size_t n = j->n - lo < ELEMENTWISE_CHUNK ? j->n - lo : ELEMENTWISE_CHUNK;
  float *restrict d = j->dst + lo;
  const float *restrict s = j->src + lo;
  if (!j->add) {
    memcpy(d, s, n * sizeof *d);
    return;
  }
  for (size_t i = 0; i < n; i++) d[i] += s[i];
}

static void elementwise(st_pool *pool, float *dst, const float *src, size_t n,
                        int add) {
  elementwise_job j = {dst, src, n, 0, 0, add};
  st_pool_for(n < ELEMENTWISE_MIN ? NULL : pool,
              (int)((n + ELEMENTWISE_CHUNK - 1) / ELEMENTWISE_CHUNK),
              elementwise_task, &j);
}

void st_pool_add(st_pool *pool, float *dst, const float *src, size_t n) {
  elementwise(pool, dst, src, n, 1);
}

void st_pool_copy(st_pool *pool, float *dst, const float *src, size_t n) {
  elementwise(pool, dst, src, n, 0);
}

/* SUM_COLS columns a task, each summed over the rows in order. */
static void sum_rows_task(void *arg, int task) {
  const elementwise_job *j = arg;
  int c0 = task * SUM_COLS;
  int w = j->cols - c0 < SUM_COLS ? j->cols - c0 : SUM_COLS;
  float *restrict acc = j->dst + c0;
  for (int r = 0; r < j->rows; r++) {
    const float *restrict x = j->src + (size_t)r * (size_t)j->cols + c0;
    for (int c = 0; c < w; c++) acc[c] += x[c];
  }
}

void st_pool_sum_rows(st_pool *pool, float *acc, const float *x, int rows,
                      int cols) {
  if (rows <= 0 || cols <= 0) return;
  elementwise_job j = {acc, x, 0, rows, cols, 1};
  st_pool_for((size_t)rows * (size_t)cols < ELEMENTWISE_MIN ? NULL : pool,
              (cols + SUM_COLS - 1) / SUM_COLS, sum_rows_task, &j);
}
