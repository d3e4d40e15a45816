/*
 * mpi.c — the processes of one run (DESIGN.md: beyond one machine). Started
 * by mpirun, strata runs one rank per process over MPI (Open MPI from
 * Debian); otherwise, or when built without MPI (make MPI=0), it is a world
 * of one and every call here is a no-op. The collectives the data-parallel
 * mode needs live here, so nothing else includes mpi.h:
 *  - st_dist_allgather: every rank's slice of a buffer, in place;
 *  - st_dist_sum_ranks: the gradient summed over the ranks in rank order,
 *    ((g0 + g1) + g2) + ..., per element — the order the in-process
 *    replicas add their slabs in, so R ranks give R replicas' bits whatever
 *    the MPI library's reduction algorithm: each rank gathers its part of
 *    every rank's gradient (an all-to-all), adds the parts in rank order and
 *    sends the sum to all (an all-gather);
 *  - st_dist_check_same: a value every rank must share (the config's hash),
 *    checked at start so mismatched ranks stop with an error, not a hang.
 *  - groups (st_dist_group): the world split into pipelines and into the
 *    replicas of one stage (execution.placement: ranks), each with its
 *    collectives and two channels (forward, backward) of non-blocking
 *    point-to-point messages, which the stages' own threads send and wait
 *    for (MPI_THREAD_MULTIPLE).
 * Errors come back as codes (MPI_ERRORS_RETURN) and become st_error
 * messages; the CLI then aborts the job, so no rank waits forever on one
 * that has failed. MPI itself reports a rank that dies, not one that goes
 * silent (stopped, stuck, or cut off by the network): every wait on the
 * others is watched, and one that lasts execution.rank_timeout seconds
 * ends the job with a line naming the wait (st_dist_watch).
 */
#include "dist.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef ST_MPI
#include <mpi.h>
#endif

static int world_rank = 0, world_size = 1, started = 0, threads_ok = 0;
/* the last error is every rank's (st_dist_agree). Atomic: a sweep's or
 * an experiment's jobs make their trainers on threads at once, each
 * clearing it (a race TSan saw; no value is read across jobs). */
static _Atomic int shared_error;

void st_dist_share_error(void) {
  atomic_store_explicit(&shared_error, 1, memory_order_relaxed);
}
void st_dist_unshare_error(void) {
  atomic_store_explicit(&shared_error, 0, memory_order_relaxed);
}
int st_dist_error_shared(void) {
  return atomic_load_explicit(&shared_error, memory_order_relaxed);
}

/* ------------------------------------------------------------ the watch */
#ifdef ST_MPI

/* Each thread that waits on the others holds a slot: when its wait began
 * (0: not waiting), what it waits in, and on whom (-1: a collective, any
 * rank). Slots are claimed on a thread's first wait and given back when it
 * ends (pipeline stages' threads come and go). A watcher thread looks ten
 * times a second. */
enum { WATCH_SLOTS = 64 };
typedef struct watch_slot {
  _Atomic int taken;
  _Atomic int64_t since; /* CLOCK_MONOTONIC ns */
  _Atomic(const char *) what;
  _Atomic int peer;
} watch_slot;
static watch_slot slots[WATCH_SLOTS];
static _Atomic int64_t watch_limit_ns; /* 0: off */
static _Atomic int watch_quit, finishing;
static pthread_t watcher;
static int watcher_started;
static pthread_key_t slot_key;
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;
static _Atomic int64_t last_end; /* when a wait last ended */
/* The watchers' own channel: a watch whose wait lasted too long asks every
 * rank what it is doing, and each rank's watcher answers, so that the line
 * can say who is silent (stopped, cut off) and who answers but is busy.
 * MPI is called from the watcher under watch_mpi, never once
 * st_dist_finalize has begun. */
enum { TAG_ASK = 1, TAG_TOLD = 2 };
static MPI_Comm watch_comm = MPI_COMM_NULL;
static pthread_mutex_t watch_mpi = PTHREAD_MUTEX_INITIALIZER;
static st_dist_told told_out[ST_DIST_MAX_RANKS]; /* answers in flight */
static int32_t asked_out;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void slot_release(void *w) {
  atomic_store(&((watch_slot *)w)->since, 0);
  atomic_store(&((watch_slot *)w)->taken, 0);
}
static void slot_key_make(void) { pthread_key_create(&slot_key, slot_release); }

/* Marks the calling thread as waiting in `what` on world rank `peer` (-1:
 * the others); NULL (unwatched) in a world of one or past 64 threads. */
static watch_slot *watch_begin(const char *what, int peer) {
  if (world_size == 1) return NULL;
  pthread_once(&slot_once, slot_key_make);
  watch_slot *w = pthread_getspecific(slot_key);
  for (int i = 0; !w && i < WATCH_SLOTS; i++) {
    int free_slot = 0;
    if (atomic_compare_exchange_strong(&slots[i].taken, &free_slot, 1)) {
      w = &slots[i];
      pthread_setspecific(slot_key, w);
    }
  }
  if (!w) return NULL;
  atomic_store(&w->what, what);
  atomic_store(&w->peer, peer);
  atomic_store(&w->since, now_ns());
  return w;
}

static void watch_end(watch_slot *w) {
  if (!w) return;
  atomic_store(&w->since, 0);
  atomic_store_explicit(&last_end, now_ns(), memory_order_relaxed);
}

/* This rank's longest wait now, or how long it has waited on no one. */
static st_dist_told watch_state(int64_t now) {
  st_dist_told t = {.peer = -1};
  int64_t oldest = 0;
  for (int i = 0; i < WATCH_SLOTS; i++) {
    int64_t since = atomic_load(&slots[i].since);
    if (!since || (oldest && since >= oldest)) continue;
    const char *what = atomic_load(&slots[i].what);
    int peer = atomic_load(&slots[i].peer);
    if (atomic_load(&slots[i].since) != since) continue; /* moved on */
    oldest = since;
    t.peer = peer;
    snprintf(t.what, sizeof t.what, "%s", what ? what : "a wait");
  }
  t.waiting = oldest != 0;
  int64_t from = oldest ? oldest : atomic_load(&last_end);
  t.ms = from && now > from ? (now - from) / 1000000 : 0;
  return t;
}

/* Answers every watch that has asked this rank (watch_mpi held). The
 * answer is sent and left to finish on its own; its buffer is the asker's
 * slot in told_out, which nothing rewrites before the job ends (a watch
 * asks once, then ends it). */
static void watch_answer(void) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_ASK, watch_comm, &flag, &st) !=
            MPI_SUCCESS ||
        !flag)
      return;
    int32_t ask;
    MPI_Request req;
    if (MPI_Recv(&ask, 1, MPI_INT32_T, st.MPI_SOURCE, TAG_ASK, watch_comm,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    told_out[st.MPI_SOURCE] = watch_state(now_ns());
    if (MPI_Isend(&told_out[st.MPI_SOURCE], (int)sizeof(st_dist_told), MPI_BYTE,
                  st.MPI_SOURCE, TAG_TOLD, watch_comm, &req) == MPI_SUCCESS)
      MPI_Request_free(&req);
  }
}

/* Asks every other rank what it is doing and collects the answers for up
 * to 2 s, answering the others' asks meanwhile (they may be asking too).
 * Returns 0 when it could not ask (MPI is shutting down). */
static int watch_ask(st_dist_told *told, unsigned char *answered) {
  pthread_mutex_lock(&watch_mpi);
  if (atomic_load(&finishing) || watch_comm == MPI_COMM_NULL) {
    pthread_mutex_unlock(&watch_mpi);
    return 0;
  }
  for (int r = 0; r < world_size; r++) {
    MPI_Request req;
    if (r != world_rank && MPI_Isend(&asked_out, 1, MPI_INT32_T, r, TAG_ASK,
                                     watch_comm, &req) == MPI_SUCCESS)
      MPI_Request_free(&req);
  }
  int missing = world_size - 1;
  const struct timespec pause = {0, 10000000};
  for (int64_t end = now_ns() + 2000000000; missing > 0 && now_ns() < end;) {
    watch_answer();
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_TOLD, watch_comm, &flag, &st) !=
        MPI_SUCCESS)
      break;
    if (!flag) {
      nanosleep(&pause, NULL);
      continue;
    }
    st_dist_told t;
    if (MPI_Recv(&t, (int)sizeof t, MPI_BYTE, st.MPI_SOURCE, TAG_TOLD,
                 watch_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
    t.what[sizeof t.what - 1] = 0;
    if (!answered[st.MPI_SOURCE]) missing--;
    answered[st.MPI_SOURCE] = 1;
    told[st.MPI_SOURCE] = t;
  }
  pthread_mutex_unlock(&watch_mpi);
  return 1;
}

/* The others asked (watch_ask), then one line naming the wait and whom to
 * blame, and the job ends: MPI_Abort takes every rank down (mpirun kills a
 * stopped one too); where MPI may not be called from this thread, or it is
 * shutting down, this process exits and mpirun ends the rest. */
static void watch_fire(watch_slot *w, int64_t since, int64_t waited) {
  /* the wait as one snapshot: a slot whose thread has moved on to another
   * wait meanwhile is not this one (the next look judges that) */
  int peer = atomic_load(&w->peer);
  const char *what = atomic_load(&w->what);
  if (atomic_load(&w->since) != since) return;
  char who[96] = "a rank", why[160] = "it is stopped, stuck or cut off";
  if (peer >= 0) snprintf(who, sizeof who, "rank %d", peer);
  if (threads_ok) {
    static st_dist_told told[ST_DIST_MAX_RANKS];
    static unsigned char answered[ST_DIST_MAX_RANKS];
    memset(answered, 0, sizeof answered);
    answered[world_rank] = 1;
    if (watch_ask(told, answered))
      st_dist_watch_verdict(world_rank, world_size, what, peer, told, answered,
                            who, sizeof who, why, sizeof why);
    /* the wait ended while the others were asked: the job goes on */
    if (atomic_load(&w->since) != since) return;
  }
  fprintf(stderr,
          "strata: error: rank %d: no answer from %s in %.0f s, waiting in "
          "%s (execution.rank_timeout: %g): %s; ending the job\n",
          world_rank, who, (double)waited / 1e9, what,
          (double)atomic_load(&watch_limit_ns) / 1e9, why);
  fflush(stderr);
  if (threads_ok && !atomic_load(&finishing)) MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}

/* A tick that took far longer than asked means this process was stopped
 * (SIGSTOP, a suspended VM): its own waits count from when it resumed, so
 * the rank that was stopped does not blame the others once it runs again. */
static void *watch_loop(void *arg) {
  (void)arg;
  const struct timespec tick = {0, 100000000};
  int64_t last = now_ns(), resumed = 0;
  while (!atomic_load(&watch_quit)) {
    nanosleep(&tick, NULL);
    int64_t limit = atomic_load(&watch_limit_ns), now = now_ns();
    if (now - last > 1000000000) resumed = now;
    last = now;
    /* Answers only once this rank has itself waited, or gone without a
     * wait, a quarter of the limit (0.5 to 10 s): a rank another's watch
     * asks is then stalled too, or busy. A healthy run's watcher makes no
     * MPI call beside the run's own (under ThreadSanitizer, an MPI_Iprobe
     * every tick beside the ranks' collectives stalled them). */
    int64_t quiet = limit / 4;
    if (quiet < 500000000) quiet = 500000000;
    if (quiet > 10000000000) quiet = 10000000000;
    if (threads_ok && watch_state(now).ms * 1000000 > quiet) {
      pthread_mutex_lock(&watch_mpi);
      if (!atomic_load(&finishing) && watch_comm != MPI_COMM_NULL)
        watch_answer();
      pthread_mutex_unlock(&watch_mpi);
    }
    for (int i = 0; limit > 0 && i < WATCH_SLOTS; i++) {
      int64_t since = atomic_load(&slots[i].since), from = since;
      if (from && from < resumed) from = resumed;
      if (from && now - from > limit) watch_fire(&slots[i], since, now - from);
    }
  }
  return NULL;
}

void st_dist_watch(double seconds) {
  if (world_size == 1 || !(seconds >= 0)) return;
  double ns = seconds * 1e9;
  atomic_store(&watch_limit_ns, ns > 9e18 ? INT64_MAX : (int64_t)ns);
  if (watcher_started || seconds == 0) return;
  atomic_store(&last_end, now_ns());
  /* signals go to the threads that handle them, never to the watcher */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  watcher_started = pthread_create(&watcher, NULL, watch_loop, NULL) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}
#else
void st_dist_watch(double seconds) { (void)seconds; } /* a world of one */
#endif

/* "rank 3", "ranks 1 and 3", "ranks 1, 2, 3, 4, 5, 6 and 9 more" */
static void rank_list(char *out, size_t size, const int *ranks, int n) {
  size_t at = (size_t)snprintf(out, size, n == 1 ? "rank" : "ranks");
  int named = n > 7 ? 6 : n;
  for (int i = 0; i < named && at < size; i++)
    at += (size_t)snprintf(out + at, size - at, "%s%d",
                           i == 0       ? " "
                           : i == n - 1 ? " and "
                                        : ", ",
                           ranks[i]);
  if (named < n && at < size)
    snprintf(out + at, size - at, " and %d more", n - named);
}

void st_dist_watch_verdict(int me, int size, const char *what, int peer,
                           const st_dist_told *told,
                           const unsigned char *answered, char *who,
                           size_t who_size, char *why, size_t why_size) {
  int silent[ST_DIST_MAX_RANKS], busy[ST_DIST_MAX_RANKS], n_silent = 0,
                                                          n_busy = 0;
  long long busy_ms = 0;
  if (peer == me) peer = -1; /* a root waiting on the others */
  for (int r = 0; r < size && r < ST_DIST_MAX_RANKS; r++) {
    if (r == me || (peer >= 0 && r != peer)) continue;
    if (!answered[r]) {
      silent[n_silent++] = r;
    } else if (!told[r].waiting) {
      busy[n_busy++] = r;
      if (told[r].ms > busy_ms) busy_ms = (long long)told[r].ms;
    }
  }
  if (n_silent) {
    rank_list(who, who_size, silent, n_silent);
    snprintf(why, why_size,
             n_silent == 1 ? "it does not answer the watch either: it is "
                             "stopped or cut off"
                           : "they do not answer the watch either: they are "
                             "stopped or cut off");
  } else if (n_busy) {
    rank_list(who, who_size, busy, n_busy);
    snprintf(why, why_size,
             n_busy == 1 ? "it answers, and has waited on no one for %lld "
                           "s: it is busy or stuck in its own work"
                         : "they answer, and have waited on no one for up "
                           "to %lld s: they are busy or stuck in their own "
                           "work",
             busy_ms / 1000);
  } else {
    /* every rank asked answers from a wait: the first one waiting on
     * something else shows where the chain leads */
    int other = -1;
    for (int r = 0; r < size && r < ST_DIST_MAX_RANKS && other < 0; r++)
      if (r != me && (peer < 0 || r == peer) &&
          (told[r].peer >= 0 || strcmp(told[r].what, what)))
        other = r;
    if (peer >= 0)
      snprintf(who, who_size, "rank %d", peer);
    else
      snprintf(who, who_size, "a rank");
    const char *it = peer >= 0 ? "it answers" : "every rank answers";
    if (other < 0) {
      snprintf(why, why_size,
               "%s the watch and waits in it too: the messages between them "
               "do not arrive",
               it);
    } else {
      char on[32] = "", by[32] = ",";
      if (told[other].peer >= 0)
        snprintf(on, sizeof on, " on rank %d", (int)told[other].peer);
      if (peer < 0) snprintf(by, sizeof by, ", rank %d", other);
      snprintf(why, why_size, "%s%s waiting in %s%s for %lld s", it, by,
               told[other].what, on, (long long)told[other].ms / 1000);
    }
  }
}

int st_dist_built(void) {
#ifdef ST_MPI
  return 1;
#else
  return 0;
#endif
}

/* The number of processes mpirun (or another PMIx launcher) started, or
 * 0 when this process was not started by one. */
static int launched_size(void) {
  const char *keys[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const char *v = getenv(keys[i]);
    if (v && atoi(v) > 0) return atoi(v);
  }
  return getenv("PMIX_RANK") ? 1 : 0;
}

int st_dist_init(int *argc, char ***argv, st_error *err) {
  int n = launched_size();
  if (n == 0 || started) return 0;
#ifndef ST_MPI
  (void)argc, (void)argv;
  if (n > 1)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "mpirun started %d processes, but this strata was "
                        "built without MPI: install libopenmpi-dev and "
                        "openmpi-bin and rebuild (make) to train across "
                        "processes",
                        n);
  return 0;
#else
  if (n > ST_DIST_MAX_RANKS)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "mpirun started %d processes; "
                        "strata runs at most %d ranks",
                        n, ST_DIST_MAX_RANKS);
  int provided = 0;
  /* the stages of a pipeline across ranks send and receive from their own
   * threads; data parallelism calls MPI from the stepping thread only */
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) !=
      MPI_SUCCESS)
    return st_error_set(err, ST_EIO, "MPI_Init failed");
  started = 1;
  threads_ok = provided >= MPI_THREAD_MULTIPLE;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  /* collective, so here, where every rank comes, not in st_dist_watch,
   * which a rank whose config failed to load skips */
  if (world_size > 1 &&
      MPI_Comm_dup(MPI_COMM_WORLD, &watch_comm) == MPI_SUCCESS)
    MPI_Comm_set_errhandler(watch_comm, MPI_ERRORS_RETURN);
  return 0;
#endif
}

void st_dist_finalize(void) {
#ifdef ST_MPI
  pthread_mutex_lock(&watch_mpi); /* the watcher's MPI calls are over */
  atomic_store(&finishing, 1);
  pthread_mutex_unlock(&watch_mpi);
  if (started) {
    watch_slot *w = watch_begin("the last handshake", -1);
    MPI_Finalize();
    watch_end(w);
  }
  if (watcher_started) {
    atomic_store(&watch_quit, 1);
    pthread_join(watcher, NULL);
    watcher_started = 0;
  }
  started = 0;
#endif
}

void st_dist_abort(int code) {
#ifdef ST_MPI
  if (started && world_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

int st_dist_rank(void) { return world_rank; }
int st_dist_threads_ok(void) { return world_size == 1 || threads_ok; }

int st_dist_local_size(void) {
  const char *v = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  int n = v ? atoi(v) : 0;
  return started && n > 0 ? n : 1;
}
int st_dist_size(void) { return world_size; }

#ifdef ST_MPI
static int mpi_failed(int code, const char *what, st_error *err) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(code, text, &len);
  return st_error_set(err, ST_EIO, "rank %d: %s failed: %s", world_rank, what,
                      text);
}
#endif

static void traffic(size_t sent, size_t received);

int st_dist_allgather(void *buf, size_t bytes_per_rank, st_error *err) {
  if (world_size == 1) return 0;
  traffic(bytes_per_rank * (size_t)(world_size - 1),
          bytes_per_rank * (size_t)(world_size - 1));
#ifdef ST_MPI
  if (bytes_per_rank > (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG,
                        "rank %d: %zu bytes per rank exceed "
                        "one all-gather",
                        world_rank, bytes_per_rank);
  watch_slot *w = watch_begin("the all-gather", -1);
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, buf, (int)bytes_per_rank,
                         MPI_BYTE, MPI_COMM_WORLD);
  watch_end(w);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "the all-gather", err);
#else
  (void)buf, (void)bytes_per_rank, (void)err;
  return 0;
#endif
}

int st_dist_agree(int rc, st_error *err) {
  if (world_size == 1) return rc;
#ifdef ST_MPI
  int all[ST_DIST_MAX_RANKS]; /* every step: nothing allocated */
  watch_slot *w = watch_begin("the step's check", -1);
  int e = MPI_Allgather(&rc, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
  watch_end(w);
  int first = -1;
  for (int r = 0; e == MPI_SUCCESS && r < world_size && first < 0; r++)
    if (all[r]) first = r;
  if (e != MPI_SUCCESS) return mpi_failed(e, "the step's check", err);
  if (first < 0) return 0;
  /* the first failure's message, on every rank */
  st_error got = *err;
  w = watch_begin("the error's broadcast", first == world_rank ? -1 : first);
  e = MPI_Bcast(&got, (int)sizeof got, MPI_BYTE, first, MPI_COMM_WORLD);
  watch_end(w);
  if (e != MPI_SUCCESS) return mpi_failed(e, "the error's broadcast", err);
  if (first == 0 || !strncmp(got.msg, "rank ", 5)) /* named already */
    *err = got;
  else
    st_error_set(err, got.code, "rank %d: %.*s", first,
                 (int)sizeof got.msg - 16, got.msg);
  shared_error = 1;
  return err->code ? err->code : ST_EIO;
#else
  (void)err;
  return rc;
#endif
}

int st_dist_check_same(uint64_t value, const char *what, st_error *err) {
  if (world_size == 1) return 0;
#ifdef ST_MPI
  uint64_t all[ST_DIST_MAX_RANKS];
  watch_slot *w = watch_begin("the start-up check", -1);
  int rc = MPI_Allgather(&value, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T,
                         MPI_COMM_WORLD);
  watch_end(w);
  int differs = -1;
  for (int r = 1; rc == MPI_SUCCESS && r < world_size && differs < 0; r++)
    if (all[r] != all[0]) differs = r;
  if (rc != MPI_SUCCESS) return mpi_failed(rc, "the start-up check", err);
  shared_error = differs >= 0;
  if (differs >= 0)
    return st_error_set(err, ST_ECONFIG,
                        "rank %d's %s differs from rank 0's: every rank must "
                        "run the same config and data",
                        differs, what);
  return 0;
#else
  (void)value, (void)what, (void)err;
  return 0;
#endif
}

int st_dist_max(int *value, st_error *err) {
  if (world_size == 1) return 0;
#ifdef ST_MPI
  watch_slot *w = watch_begin("the stop check", -1);
  int rc =
      MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  watch_end(w);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "the stop check", err);
#else
  (void)value, (void)err;
  return 0;
#endif
}

/* ------------------------------------------------------------ groups */

struct st_dist_group {
#ifdef ST_MPI
  MPI_Comm comm, chan[2];
#endif
  int rank, size;
  int *world; /* [size]: members' world ranks */
};

int st_dist_group_create(st_dist_group **out, int color, int key,
                         st_error *err) {
  *out = NULL;
  st_dist_group *g = calloc(1, sizeof *g);
  if (!g) return st_error_set(err, ST_ENOMEM, "out of memory");
  g->size = 1;
#ifdef ST_MPI
  g->comm = g->chan[0] = g->chan[1] = MPI_COMM_NULL;
  if (started) {
    watch_slot *w = watch_begin("making a group of ranks", -1);
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(g->comm, &g->chan[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(g->comm, &g->chan[1]);
    watch_end(w);
    if (rc != MPI_SUCCESS) {
      st_dist_group_destroy(g);
      return mpi_failed(rc, "making a group of ranks", err);
    }
    for (int c = 0; c < 3; c++)
      MPI_Comm_set_errhandler(c ? g->chan[c - 1] : g->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g->comm, &g->rank);
    MPI_Comm_size(g->comm, &g->size);
  }
#else
  (void)color, (void)key;
#endif
  g->world = malloc((size_t)g->size * sizeof *g->world);
  if (!g->world) {
    st_dist_group_destroy(g);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  g->world[0] = world_rank;
#ifdef ST_MPI
  watch_slot *w = started ? watch_begin("making a group of ranks", -1) : NULL;
  int rc = started ? MPI_Allgather(&world_rank, 1, MPI_INT, g->world, 1,
                                   MPI_INT, g->comm)
                   : MPI_SUCCESS;
  watch_end(w);
  if (rc != MPI_SUCCESS) {
    st_dist_group_destroy(g);
    return st_error_set(err, ST_EIO,
                        "rank %d: making a group of ranks "
                        "failed",
                        world_rank);
  }
#endif
  *out = g;
  return 0;
}

void st_dist_group_destroy(st_dist_group *g) {
  if (!g) return;
#ifdef ST_MPI
  for (int c = 0; c < 2; c++)
    if (g->chan[c] != MPI_COMM_NULL) MPI_Comm_free(&g->chan[c]);
  if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
#endif
  free(g->world);
  free(g);
}

int st_dist_group_rank(const st_dist_group *g) { return g->rank; }
int st_dist_group_size(const st_dist_group *g) { return g->size; }
int st_dist_group_world(const st_dist_group *g, int member) {
  return member >= 0 && member < g->size ? g->world[member] : -1;
}

/* Payload bytes this rank gave to and took from others (st_dist_traffic):
 * each message's bytes; a collective's as if done by direct messages (a
 * broadcast's root gives each member a copy, an all-gather gives and takes
 * a part per member, the ordered sum sends every other member its part and
 * the sum). The library's own algorithms may move more. */
static _Atomic uint64_t bytes_sent, bytes_received;

void st_dist_traffic(uint64_t *sent, uint64_t *received) {
  *sent = atomic_load(&bytes_sent);
  *received = atomic_load(&bytes_received);
}

static void traffic(size_t sent, size_t received) {
  atomic_fetch_add(&bytes_sent, sent);
  atomic_fetch_add(&bytes_received, received);
}

int st_dist_bcast(st_dist_group *g, void *buf, size_t bytes, int root,
                  st_error *err) {
  if (g->size == 1) return 0;
  if (g->rank == root)
    traffic(bytes * (size_t)(g->size - 1), 0);
  else
    traffic(0, bytes);
#ifdef ST_MPI
  for (size_t at = 0; at < bytes; at += (size_t)INT32_MAX / 2) {
    size_t len =
        bytes - at < (size_t)INT32_MAX / 2 ? bytes - at : (size_t)INT32_MAX / 2;
    /* the root waits on the others (any of them), the others on it */
    watch_slot *w =
        watch_begin("a broadcast", root == g->rank ? -1 : g->world[root]);
    int rc = MPI_Bcast((char *)buf + at, (int)len, MPI_BYTE, root, g->comm);
    watch_end(w);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "a broadcast", err);
  }
  return 0;
#else
  (void)buf, (void)bytes, (void)root, (void)err;
  return 0;
#endif
}

int st_dist_group_allgather(st_dist_group *g, void *buf,
                            size_t bytes_per_member, st_error *err) {
  if (g->size == 1) return 0;
#ifdef ST_MPI
  if (bytes_per_member > (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG,
                        "rank %d: %zu bytes per rank exceed "
                        "one all-gather",
                        world_rank, bytes_per_member);
  traffic(bytes_per_member * (size_t)(g->size - 1),
          bytes_per_member * (size_t)(g->size - 1));
  watch_slot *w = watch_begin("the all-gather", -1);
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, buf, (int)bytes_per_member,
                         MPI_BYTE, g->comm);
  watch_end(w);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "the all-gather", err);
#else
  (void)buf, (void)bytes_per_member, (void)err;
  return 0;
#endif
}

static size_t sum_scratch(size_t W, size_t n) {
  size_t part = (n + W - 1) / W;
  if (part > DIST_PART) part = DIST_PART;
  /* MPI's counts and displacements are ints: a round's W parts must fit */
  if (part > (size_t)INT32_MAX / W) part = (size_t)INT32_MAX / W;
  return W * part;
}

size_t st_dist_sum_scratch(size_t n) {
  return sum_scratch((size_t)world_size, n);
}
size_t st_dist_sum_scratch_in(const st_dist_group *g, size_t n) {
  return sum_scratch(g ? (size_t)g->size : (size_t)world_size, n);
}

int st_dist_allreduce(float *grads, size_t n, st_error *err) {
  return st_dist_allreduce_in(NULL, grads, n, err);
}

int st_dist_allreduce_in(st_dist_group *g, float *grads, size_t n,
                         st_error *err) {
  const int W = g ? g->size : world_size;
  if (W == 1) return 0;
  /* as a ring would: each rank gives and takes 2 (W - 1) / W of the data */
  size_t ring = 2 * (size_t)(W - 1) * (n / (size_t)W) * sizeof(float);
  traffic(ring, ring);
#ifdef ST_MPI
  MPI_Comm comm = g ? g->comm : MPI_COMM_WORLD;
  for (size_t s = 0; s < n; s += (size_t)INT32_MAX / 2) {
    size_t len = n - s < (size_t)INT32_MAX / 2 ? n - s : (size_t)INT32_MAX / 2;
    watch_slot *w = watch_begin("the all-reduce", -1);
    int rc = MPI_Allreduce(MPI_IN_PLACE, grads + s, (int)len, MPI_FLOAT,
                           MPI_SUM, comm);
    watch_end(w);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the all-reduce", err);
  }
  return 0;
#else
  (void)grads, (void)n, (void)err;
  return 0;
#endif
}

int st_dist_reduce_in(st_dist_group *g, float *grads, size_t n, int root,
                      st_error *err) {
  if (g->size == 1) return 0;
  size_t bytes = n * sizeof(float);
  if (g->rank == root)
    traffic(0, bytes * (size_t)(g->size - 1));
  else
    traffic(bytes, 0);
#ifdef ST_MPI
  for (size_t s = 0; s < n; s += (size_t)INT32_MAX / 2) {
    size_t len = n - s < (size_t)INT32_MAX / 2 ? n - s : (size_t)INT32_MAX / 2;
    watch_slot *w = watch_begin("the reduction", -1);
    int rc = g->rank == root ? MPI_Reduce(MPI_IN_PLACE, grads + s, (int)len,
                                          MPI_FLOAT, MPI_SUM, root, g->comm)
                             : MPI_Reduce(grads + s, NULL, (int)len, MPI_FLOAT,
                                          MPI_SUM, root, g->comm);
    watch_end(w);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the reduction", err);
  }
  return 0;
#else
  (void)grads, (void)root, (void)err;
  return 0;
#endif
}

int st_dist_sum_ranks(float *grads, size_t n, float *scratch, st_error *err) {
  return st_dist_sum_in(NULL, grads, n, scratch, err);
}

int st_dist_sum_in(st_dist_group *g, float *grads, size_t n, float *scratch,
                   st_error *err) {
  const int W = g ? g->size : world_size;
  if (W == 1) return 0;
#ifdef ST_MPI
  const int me = g ? g->rank : world_rank;
  MPI_Comm comm = g ? g->comm : MPI_COMM_WORLD;
  int cnt[ST_DIST_MAX_RANKS], off[ST_DIST_MAX_RANKS], rcnt[ST_DIST_MAX_RANKS],
      roff[ST_DIST_MAX_RANKS];
  size_t step = sum_scratch((size_t)W, n); /* floats of grads per round */
  for (size_t s = 0; s < n; s += step) {
    size_t len = n - s < step ? n - s : step;
    /* the round's W parts, as even as they come: part k is rank k's */
    for (int k = 0, at = 0; k < W; k++) {
      cnt[k] = (int)(len / W + ((size_t)k < len % W));
      off[k] = at;
      at += cnt[k];
    }
    for (int k = 0; k < W; k++) rcnt[k] = cnt[me], roff[k] = k * cnt[me];
    /* the others' parts out, this rank's part from each; then the sum of
     * this part to each, the others' sums from them */
    size_t mine = (size_t)cnt[me] * sizeof(float),
           rest = (len - (size_t)cnt[me]) * sizeof(float);
    traffic(rest + mine * (size_t)(W - 1), mine * (size_t)(W - 1) + rest);
    watch_slot *w = watch_begin("the gradient exchange", -1);
    int rc = MPI_Alltoallv(grads + s, cnt, off, MPI_FLOAT, scratch, rcnt, roff,
                           MPI_FLOAT, comm);
    watch_end(w);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "the gradient exchange", err);
    /* rank order, as the in-process replicas: ((g0 + g1) + g2) + ... */
    float *restrict sum = grads + s + off[me];
    memcpy(sum, scratch, (size_t)cnt[me] * sizeof *sum);
    for (int k = 1; k < W; k++) {
      const float *restrict add = scratch + (size_t)k * cnt[me];
      for (int i = 0; i < cnt[me]; i++) sum[i] += add[i];
    }
    w = watch_begin("the gradient all-gather", -1);
    rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, grads + s, cnt, off,
                        MPI_FLOAT, comm);
    watch_end(w);
    if (rc != MPI_SUCCESS)
      return mpi_failed(rc, "the gradient all-gather", err);
  }
  return 0;
#else
  (void)grads, (void)n, (void)scratch, (void)err;
  return 0;
#endif
}

/* ---------------------------------------------------- point to point */

#ifdef ST_MPI
_Static_assert(sizeof(MPI_Request) <= sizeof(((st_dist_req *)0)->h),
               "st_dist_req holds an MPI_Request");
static MPI_Request *req_of(st_dist_req *r) { return (MPI_Request *)r->h; }
#endif

/* A non-blocking send (send = 1) or receive on channel chan of g. */
static int post(int send, st_dist_group *g, int chan, void *buf, size_t bytes,
                int peer, int tag, st_dist_req *r, st_error *err) {
#ifdef ST_MPI
  const char *what = send ? "a send" : "a receive";
  if (bytes > (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG,
                        "rank %d: %s of %zu bytes is larger "
                        "than one MPI message",
                        world_rank, what, bytes);
  int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, g->chan[chan],
                            req_of(r))
                : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, g->chan[chan],
                            req_of(r));
  if (rc != MPI_SUCCESS) return mpi_failed(rc, what, err);
  r->live = 1;
  r->send = send;
  r->peer = g->world[peer];
  if (send) traffic(bytes, 0);
  return 0;
#else
  (void)send, (void)g, (void)chan, (void)buf, (void)bytes, (void)peer;
  (void)tag, (void)r;
  return st_error_set(err, ST_EUNSUPPORTED, "built without MPI");
#endif
}

int st_dist_isend(st_dist_group *g, int chan, const void *buf, size_t bytes,
                  int peer, int tag, st_dist_req *r, st_error *err) {
  return post(1, g, chan, (void *)buf, bytes, peer, tag, r, err);
}

int st_dist_irecv(st_dist_group *g, int chan, void *buf, size_t bytes, int peer,
                  int tag, st_dist_req *r, st_error *err) {
  return post(0, g, chan, buf, bytes, peer, tag, r, err);
}

int st_dist_wait(st_dist_req *r, size_t *got, const atomic_int *stop,
                 st_error *err) {
  if (got) *got = 0;
  if (!r->live) return 0;
#ifdef ST_MPI
  /* poll at first (a neighbour's message is usually close), then sleep
   * between polls so that ranks sharing cores leave them to the work;
   * from then on the wait is watched */
  watch_slot *w = NULL;
  int rc = MPI_SUCCESS, done = 0;
  MPI_Status status;
  for (long i = 0;; i++) {
    rc = MPI_Test(req_of(r), &done, &status);
    if (rc != MPI_SUCCESS || done || (stop && atomic_load(stop))) break;
    if (i == 2000) w = watch_begin(r->send ? "a send" : "a receive", r->peer);
    if (i >= 2000) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  watch_end(w);
  if (rc != MPI_SUCCESS) {
    r->live = 0;
    return mpi_failed(rc, r->send ? "a send" : "a receive", err);
  }
  if (!done) return 1; /* stopped */
  r->live = 0;
  if (!r->send) {
    int n = 0;
    MPI_Get_count(&status, MPI_BYTE, &n);
    traffic(0, (size_t)n);
    if (got) *got = (size_t)n;
  }
  return 0;
#else
  (void)stop;
  return st_error_set(err, ST_EUNSUPPORTED, "built without MPI");
#endif
}

void st_dist_drop(st_dist_req *r) {
  if (!r->live) return;
#ifdef ST_MPI
  if (r->send) {
    MPI_Request_free(req_of(r));
  } else {
    MPI_Cancel(req_of(r));
    MPI_Wait(req_of(r), MPI_STATUS_IGNORE);
  }
#endif
  r->live = 0;
}

int st_dist_forget(st_dist_req *r) {
  if (!r->live) return 0;
#ifdef ST_MPI
  if (!r->send) MPI_Cancel(req_of(r));
  MPI_Request_free(req_of(r));
#endif
  r->live = 0;
  return 1;
}

int st_dist_barrier(st_dist_group *g, st_error *err) {
  if (g->size == 1) return 0;
#ifdef ST_MPI
  watch_slot *w = watch_begin("a barrier", -1);
  int rc = MPI_Barrier(g->comm);
  watch_end(w);
  return rc == MPI_SUCCESS ? 0 : mpi_failed(rc, "a barrier", err);
#else
  (void)err;
  return 0;
#endif
}
