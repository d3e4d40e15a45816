/*
 * test_store.c — weight streaming's file store (src/exec/store.c) as a
 * checkpoint:
 *  - a process killed (SIGKILL) in the middle of a step's updates, after
 *    the data is synced but before the header, and just after the header,
 *    resumes at the step the store committed, and the weights after 20
 *    steps are the uninterrupted sequential run's bit for bit (MLP with
 *    SGD, GPT with AdamW and a tied head; and the GPT with bf16 weights
 *    rounded stochastically, against the sequential run rounding its
 *    weights after every step);
 *  - a store trained to step k and reopened continues as if never stopped;
 *  - bad stores are refused with the path and the cause, and left as they
 *    were: another model's, another optimizer's, another seed's, a
 *    truncated one (also inside its header slots), one whose headers are
 *    both corrupt, one whose weights or optimizer state changed or two of
 *    whose weights swapped places (their checksum), another model of the
 *    same size, another weight dtype or rounding, a file that is no store,
 *    one in use by another trainer; the newest header with its checksum field
 * changed gives way to the one before;
 *  - a store that cannot get its space (a size-limited file: RLIMIT_FSIZE)
 *    is refused at start, leaving no file behind;
 *  - two processes making the same store at once: one makes it, the other
 *    is refused or opens it, and what is there is a whole store;
 *  - a checkpoint file cannot be loaded over the store;
 *  - an evaluation whose read of the store fails says so, with the path,
 *    rather than reporting a loss of whatever weights the slot held; a
 *    step whose reads fail (pread interposed below) says so too, even
 *    where what they left made the loss non-finite;
 *  - a commit whose sync fails (fdatasync interposed below) stops the run
 *    with the store's error, the step after it writes nothing, and the
 *    store reopens at the last good commit;
 *  - a store file removed under a running trainer stops it at the next
 *    commit, naming the path, rather than committing steps that no file
 *    holds once the process ends.
 */
#include "harness.h"
#include "models.h"
#include "strata.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The store's test knob (src/exec/exec.h). */
typedef struct st_store st_store;
st_store *st_ws_store(void *state);
void *st_trainer_exec_state(st_trainer *t);
void st_store_set_crash(st_store *s, int64_t step, int point);

static char dir[] = "/tmp/strata_test_store_XXXXXX";

/* While set, reads of a file whose path ends so fail with EIO, leaving
 * NaNs in the buffer (what a read that failed halfway left is anyone's).
 * This pread is the test binary's own: the library's calls reach it. */
static const char *failing;

static int is_failing(int fd) {
  char link[64], path[ST_PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = failing ? readlink(link, path, sizeof path - 1) : -1;
  if (n <= 0) return 0;
  path[n] = 0;
  size_t k = strlen(failing);
  return (size_t)n >= k && !strcmp(path + n - k, failing);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  static ssize_t (*real)(int, void *, size_t, off_t);
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "pread");
  if (is_failing(fd)) {
    for (size_t i = 0; i + sizeof(float) <= n; i += sizeof(float))
      ((float *)buf)[i / sizeof(float)] = NAN;
    errno = EIO;
    return -1;
  }
  return real(fd, buf, n, off);
}

/* While set, fdatasync of a file whose path ends so fails with EIO, after
 * a pause long enough for the step that follows a commit to queue its
 * updates behind it (the commit runs on the optimizer thread). */
static const char *sync_failing;

int fdatasync(int fd) {
  static int (*real)(int);
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "fdatasync");
  if (sync_failing) {
    char link[64], path[ST_PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    size_t k = strlen(sync_failing);
    if (n > 0 && (size_t)n >= k && !memcmp(path + n - k, sync_failing, k)) {
      usleep(300 * 1000);
      errno = EIO;
      return -1;
    }
  }
  return real(fd);
}

static void file_store(st_config *c, const char *name) {
  snprintf(c->execution.mode, sizeof c->execution.mode, "weight_streaming");
  snprintf(c->execution.store, sizeof c->execution.store, "file");
  snprintf(c->execution.store_path, sizeof c->execution.store_path, "%s/%s",
           dir, name);
}

/* Runs steps until the trainer's position reaches `to`. */
static int run_until(st_trainer *t, int64_t to, st_error *err) {
  double loss;
  while (st_trainer_pos(t)->step < to)
    if (st_trainer_step(t, &loss, err)) return -1;
  return st_trainer_sync(t, err);
}

/* In a child: train on the store, killed at `point` of step `step`. */
static int killed_at(const st_config *c, int64_t step, int point) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    st_error err = {0};
    st_trainer *t = make(c, &err);
    if (!t) _exit(2);
    st_store_set_crash(st_ws_store(st_trainer_exec_state(t)), step, point);
    run_until(t, STEPS, &err);
    _exit(3); /* not killed */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

/* Whether t's weights are want's n, bit for bit. */
static int same_weights(st_trainer *t, const float *want, size_t n) {
  float *got = malloc(n * sizeof *got);
  st_error err = {0};
  int same = got && trainer_weights(t, got, &err) == 0 &&
             memcmp(got, want, n * sizeof *got) == 0;
  free(got);
  return same;
}

/* base: the sequential config, or a bf16 store's (whose reference is the
 * sequential mode rounding its weights to bf16 after every step). */
static void test_crash(const char *what, const st_config *base) {
  size_t n = 0;
  float *want = strcmp(base->execution.store_weights, "bf16") == 0
                    ? train_bf16_reference(base, &n)
                    : train(base, &n, NULL);
  if (!want) return;
  static const char *points[] = {NULL, "mid-update", "before the header",
                                 "after the header"};
  char name[64];
  for (int point = 1; point <= 3; point++) {
    st_config c = *base;
    snprintf(name, sizeof name, "crash-%s-%d", what, point);
    file_store(&c, name);
    int64_t at = 7; /* the eighth step */
    CHECK(killed_at(&c, at, point), "%s: killed %s in step %lld", what,
          points[point], (long long)at + 1);
    st_error err = {0};
    st_trainer *t = make(&c, &err);
    CHECK(t != NULL, "%s, %s: reopens: %s", what, points[point], err.msg);
    if (!t) continue;
    int64_t resumed = st_trainer_pos(t)->step;
    int64_t expect = point == 3 ? at + 1 : at;
    CHECK(resumed == expect, "%s, killed %s: resumes at step %lld (want %lld)",
          what, points[point], (long long)resumed, (long long)expect);
    int rc = run_until(t, STEPS, &err);
    CHECK(rc == 0 && same_weights(t, want, n),
          "%s, killed %s and resumed: weights after %d steps equal an "
          "uninterrupted sequential run's (%s)",
          what, points[point], STEPS, err.msg);
    st_trainer_destroy(t);
  }
  /* stopped cleanly at step 9 and reopened */
  st_config c = *base;
  snprintf(name, sizeof name, "stop-%s", what);
  file_store(&c, name);
  st_error err = {0};
  st_trainer *t = make(&c, &err);
  int rc = t ? run_until(t, 9, &err) : -1;
  st_trainer_destroy(t);
  t = rc ? NULL : make(&c, &err);
  CHECK(t && st_trainer_pos(t)->step == 9,
        "%s: a stopped store reopens at "
        "step 9 (%s)",
        what, err.msg);
  if (t) {
    rc = run_until(t, STEPS, &err);
    CHECK(rc == 0 && same_weights(t, want, n),
          "%s: stopped at 9 and reopened: the uninterrupted weights", what);
  }
  st_trainer_destroy(t);
  free(want);
}

static unsigned long file_sum(const char *path, off_t *size) {
  FILE *f = fopen(path, "rb");
  unsigned long h = 5381;
  *size = 0;
  if (!f) return 0;
  int ch;
  while ((ch = getc(f)) != EOF) h = h * 33 + (unsigned)ch, (*size)++;
  fclose(f);
  return h;
}

/* make() must fail with every word of want in its message, leaving the
 * file as it was. */
static void refused(const st_config *c, const char *what, const char *want1,
                    const char *want2) {
  off_t size0, size1;
  unsigned long before = file_sum(c->execution.store_path, &size0);
  st_error err = {0};
  st_trainer *t = make(c, &err);
  unsigned long after = file_sum(c->execution.store_path, &size1);
  CHECK(!t && strstr(err.msg, c->execution.store_path) &&
            strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2)),
        "%s is refused, naming the store and '%s': '%s'", what, want1, err.msg);
  CHECK(before == after && size0 == size1, "%s: the store is left as it was",
        what);
  st_trainer_destroy(t);
}

static void test_bad(void) {
  st_config mlp, c;
  mlp_config(&mlp);
  file_store(&mlp, "mlp.strata");
  st_error err = {0};
  st_trainer *t = make(&mlp, &err);
  int rc = t ? run_until(t, 3, &err) : -1;
  CHECK(rc == 0, "an MLP store at step 3: %s", err.msg);
  /* a second trainer on the same store while the first holds it */
  st_trainer *t2 = make(&mlp, &err);
  CHECK(!t2 && strstr(err.msg, "in use"), "a store in use is refused: '%s'",
        err.msg);
  st_trainer_destroy(t2);
  /* a checkpoint file cannot be loaded over the store */
  char ck[ST_PATH_MAX + 32];
  snprintf(ck, sizeof ck, "%s/w.safetensors", dir);
  rc = st_trainer_save(t, ck, &err);
  CHECK(rc == 0, "a store's state saves as safetensors: %s", err.msg);
  rc = st_trainer_load(t, ck, 0, &err);
  CHECK(rc != 0 && strstr(err.msg, "store"),
        "loading a checkpoint over the store is refused: '%s'", err.msg);
  st_trainer_destroy(t);

  c = mlp;
  c.model.hidden.v[0] += 8;
  refused(&c, "another model's store", "parameters", NULL);
  c = mlp;
  snprintf(c.optimizer.kind, sizeof c.optimizer.kind, "adamw");
  refused(&c, "an SGD store under adamw", "sgd", "adamw");
  c = mlp;
  c.train.seed += 1;
  refused(&c, "another seed's store", "seed", NULL);
  c = mlp;
  c.train.batch *= 2;
  refused(&c, "another batch's store", "batch", NULL);

  /* truncated: a copy of the store, cut */
  char path[128], cmd[1024];
  snprintf(path, sizeof path, "%s/cut.strata", dir);
  snprintf(cmd, sizeof cmd, "cp %s %s && truncate -s -4096 %s",
           mlp.execution.store_path, path, path);
  CHECK(system(cmd) == 0, "%s", cmd);
  c = mlp;
  snprintf(c.execution.store_path, sizeof c.execution.store_path, "%s", path);
  refused(&c, "a truncated store", "truncated", NULL);
  /* cut inside its header slots: a store still, not some other file */
  snprintf(cmd, sizeof cmd, "cp %s %s && truncate -s 100 %s",
           mlp.execution.store_path, path, path);
  CHECK(system(cmd) == 0, "%s", cmd);
  refused(&c, "a store cut inside its headers", "truncated: 100 bytes",
          "header slots");
  /* both headers corrupt */
  snprintf(cmd, sizeof cmd,
           "cp %s %s && printf 'xx' | dd of=%s bs=1 seek=40 conv=notrunc "
           "2>/dev/null && printf 'xx' | dd of=%s bs=1 seek=4136 "
           "conv=notrunc 2>/dev/null",
           mlp.execution.store_path, path, path, path);
  CHECK(system(cmd) == 0, "%s", cmd);
  refused(&c, "a store with both headers corrupt", "corrupt", NULL);
  /* one header corrupt: the other is used (an older commit) */
  snprintf(cmd, sizeof cmd,
           "cp %s %s && printf 'xx' | dd of=%s bs=1 seek=40 conv=notrunc "
           "2>/dev/null",
           mlp.execution.store_path, path, path);
  CHECK(system(cmd) == 0, "%s", cmd);
  t = make(&c, &err);
  CHECK(t && st_trainer_pos(t)->step == 2,
        "with the newest header corrupt, the one before is used: step %lld "
        "(%s)",
        t ? (long long)st_trainer_pos(t)->step : -1LL, err.msg);
  st_trainer_destroy(t);
  /* one value of the committed state changed (a bit the disk flipped):
   * its checksum refuses it; a flip in every copy reaches the live one */
  {
    st_trainer *probe = make(&mlp, &err);
    size_t n = probe ? st_trainer_model(probe)->n_params : 0;
    st_trainer_destroy(probe);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t copy = (2 * 4 * n + page - 1) / page * page; /* weights, momentum */
    for (int k = 0; k < 2; k++) {
      snprintf(cmd, sizeof cmd,
               "cp %s %s && printf '\\x5a' | dd of=%s bs=1 seek=%zu "
               "conv=notrunc 2>/dev/null && printf '\\x5a' | dd of=%s bs=1 "
               "seek=%zu conv=notrunc 2>/dev/null",
               mlp.execution.store_path, path, path,
               (size_t)8192 + (k ? 4 * n + 12 : 101), path,
               (size_t)8192 + copy + (k ? 4 * n + 12 : 101));
      CHECK(n > 0 && system(cmd) == 0, "%s", cmd);
      refused(&c,
              k ? "a store whose momentum was changed"
                : "a store whose weights were changed",
              "state of step 3 is damaged", "checksum");
    }
  }
  /* the newest header's checksum field (sum, 12 bytes before the header's
   * end: sum, pad, crc) changed: the header's CRC covers it, so that
   * header is invalid and the one before is used, not the state refused */
  {
    uint32_t hbytes = 0;
    FILE *hf = fopen(mlp.execution.store_path, "rb");
    CHECK(hf && fseek(hf, 12, SEEK_SET) == 0 && fread(&hbytes, 4, 1, hf) == 1 &&
              hbytes > 12 && hbytes < 4096,
          "the header's size: %u", hbytes);
    if (hf) fclose(hf);
    snprintf(cmd, sizeof cmd,
             "cp %s %s && printf 'x' | dd of=%s bs=1 seek=%u conv=notrunc "
             "2>/dev/null",
             mlp.execution.store_path, path, path, hbytes - 12);
    CHECK(system(cmd) == 0, "%s", cmd);
    t = make(&c, &err);
    CHECK(t && st_trainer_pos(t)->step == 2,
          "with the newest header's checksum field changed, the header "
          "before is used: step %lld (%s)",
          t ? (long long)st_trainer_pos(t)->step : -1LL, err.msg);
    st_trainer_destroy(t);
  }
  /* two weights swapped in both copies (every value still one the state
   * held, at another element): the checksum is of values at their
   * elements, so it refuses them */
  {
    st_trainer *probe = make(&mlp, &err);
    size_t n = probe ? st_trainer_model(probe)->n_params : 0;
    st_trainer_destroy(probe);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t copy = (2 * 4 * n + page - 1) / page * page; /* weights, momentum */
    snprintf(cmd, sizeof cmd, "cp %s %s", mlp.execution.store_path, path);
    CHECK(n > 0 && system(cmd) == 0, "%s", cmd);
    FILE *sf = fopen(path, "r+b");
    int swapped = sf != NULL;
    for (int k = 0; k < 2 && sf; k++) {
      uint32_t w[2];
      long at = 8192 + (long)(k * copy);
      swapped &= fseek(sf, at, SEEK_SET) == 0 && fread(w, 4, 2, sf) == 2 &&
                 w[0] != w[1];
      uint32_t x[2] = {w[1], w[0]};
      swapped &= fseek(sf, at, SEEK_SET) == 0 && fwrite(x, 4, 2, sf) == 2;
    }
    if (sf) fclose(sf);
    CHECK(swapped, "two distinct weights swapped in both copies");
    refused(&c, "a store with two weights swapped",
            "state of step 3 is damaged", "checksum");
  }
  /* another model of the same size (MLP [63, 32, 51] has the 53,706
   * parameters of [64, 32, 32], in as many blocks): its tensors' layout
   * differs */
  c = mlp;
  c.model.hidden = (st_int_list){3, {63, 32, 51}};
  refused(&c, "another model of the same size",
          "another model of the same size", NULL);
  /* an fp32 store opened for bf16 weights */
  c = mlp;
  snprintf(c.execution.store_weights, sizeof c.execution.store_weights, "bf16");
  refused(&c, "an fp32 store under bf16 weights", "fp32",
          "execution.store_weights");
  /* a bf16 store rounded to nearest opened to round stochastically */
  file_store(&c, "bf16.strata");
  t = make(&c, &err);
  CHECK(t != NULL, "a bf16 store: %s", err.msg);
  st_trainer_destroy(t);
  snprintf(c.execution.store_rounding, sizeof c.execution.store_rounding,
           "stochastic");
  refused(&c, "a store rounded to nearest under stochastic rounding",
          "to nearest", "execution.store_rounding");
  c = mlp;
  snprintf(c.execution.store_path, sizeof c.execution.store_path, "%s", path);
  /* no store at all */
  snprintf(cmd, sizeof cmd,
           "printf 'not a store at all' > %s && "
           "truncate -s 8192 %s",
           path, path);
  CHECK(system(cmd) == 0, "%s", cmd);
  refused(&c, "a file that is no store", "not a strata weight store", NULL);
}

/* A size-limited file: the store cannot reserve its space. */
static void test_full(void) {
  st_config c;
  mlp_config(&c);
  file_store(&c, "full.strata");
  fflush(NULL);
  int fds[2];
  if (pipe(fds) != 0) return;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {1 << 16, 1 << 16};
    setrlimit(RLIMIT_FSIZE, &rl);
    st_error err = {0};
    st_trainer *t = make(&c, &err);
    if (write(fds[1], err.msg, strlen(err.msg) + 1) < 0) _exit(4);
    _exit(t ? 3 : 0);
  }
  close(fds[1]);
  char msg[512] = {0};
  ssize_t got = read(fds[0], msg, sizeof msg - 1);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  struct stat st;
  char tmp[ST_PATH_MAX + 16];
  snprintf(tmp, sizeof tmp, "%s.tmp", c.execution.store_path);
  CHECK(got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
            strstr(msg, c.execution.store_path) && strstr(msg, "reserve"),
        "a store that cannot get its space is refused: '%s'", msg);
  CHECK(stat(c.execution.store_path, &st) != 0 && stat(tmp, &st) != 0,
        "and leaves no file behind");
}

/* Two processes make the same store at once, ROUNDS times (a wider model:
 * its making takes a while). Each either trains a step on it or is refused
 * (the other made it, or holds it); at least one trains, and the store
 * then opens whole (its checksum) with no temporary file beside it. With
 * one temporary name for both, the second's unlink and create under it let
 * the first rename a half-made file into place. */
static void test_create_race(void) {
  enum { ROUNDS = 6 };
  st_config c;
  mlp_config(&c);
  st_error err = {0};
  CHECK(st_config_set(&c, "model.hidden=[1024,1024,1024]", &err) == 0, "%s",
        err.msg);
  int trained = 0, whole = 0;
  for (int r = 0; r < ROUNDS; r++) {
    char name[32];
    snprintf(name, sizeof name, "race-%d.strata", r);
    file_store(&c, name);
    fflush(NULL);
    pid_t pid[2];
    for (int k = 0; k < 2; k++)
      if ((pid[k] = fork()) == 0) {
        st_error e = {0};
        st_trainer *t = make(&c, &e);
        double loss;
        int ok = t && st_trainer_step(t, &loss, &e) == 0 &&
                 st_trainer_sync(t, &e) == 0;
        st_trainer_destroy(t);
        _exit(ok ? 0 : 1);
      }
    int won = 0;
    for (int k = 0; k < 2; k++) {
      int status = 0;
      waitpid(pid[k], &status, 0);
      won += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    trained += won > 0;
    st_trainer *t = make(&c, &err);
    char tmp[ST_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", c.execution.store_path);
    whole += t != NULL && access(tmp, F_OK) != 0;
    if (!t) fprintf(stderr, "round %d: %s\n", r, err.msg);
    st_trainer_destroy(t);
  }
  CHECK(trained == ROUNDS && whole == ROUNDS,
        "two processes making one store: %d of %d rounds trained, %d left a "
        "whole store and no temporary file",
        trained, ROUNDS, whole);
}

/* A trainer of the MLP on a new store `name`, `steps` steps trained and
 * committed; NULL (a failed check) if it could not be made. */
static st_trainer *trained(st_config *c, const char *name, int steps) {
  mlp_config(c);
  file_store(c, name);
  st_error err = {0};
  st_trainer *t = make(c, &err);
  CHECK(t && run_until(t, steps, &err) == 0, "%s: %s", name, err.msg);
  return t;
}

/* The store cut short under a trainer (its weights gone): the next
 * evaluation's first read fails. Before, the evaluation returned 0 with
 * the loss of the block's slot as the last step left it. */
static void test_eval_read(void) {
  st_config c;
  st_error err = {0};
  st_trainer *t = trained(&c, "eval.strata", 2);
  if (!t) return;
  double loss = 0, acc = 0;
  CHECK(st_trainer_evaluate(t, &loss, &acc, &err) == 0, "%s", err.msg);
  CHECK(truncate(c.execution.store_path, 8192) == 0, "truncate %s",
        c.execution.store_path);
  err = (st_error){0};
  int rc = st_trainer_evaluate(t, &loss, &acc, &err);
  CHECK(rc == ST_EIO && strstr(err.msg, c.execution.store_path) &&
            strstr(err.msg, "read failed"),
        "an evaluation after a failed read: rc %d, '%s' (loss %g)", rc, err.msg,
        loss);
  st_trainer_destroy(t);
}

/* A step whose reads of the store fail: the read's error, not the
 * non-finite loss the NaNs it left in the weights' slots make (a sweep
 * took that for a diverged trial, and went on). */
static void test_step_read(void) {
  st_config c;
  st_error err = {0};
  st_trainer *t = trained(&c, "step.strata", 1);
  if (!t) return;
  double loss = 0;
  failing = "step.strata";
  int rc = st_trainer_step(t, &loss, &err);
  failing = NULL;
  CHECK(rc == ST_EIO && strstr(err.msg, "step.strata") &&
            strstr(err.msg, "read failed"),
        "a step whose reads failed: rc %d, '%s' (loss %g)", rc, err.msg, loss);
  st_trainer_destroy(t);
}

/* A commit whose sync fails while the next step runs: that step says so
 * and writes nothing (its updates would go into the copy the last good
 * header names), and the store reopens at the last good commit and goes
 * on to the uninterrupted run's weights. */
static void test_commit_fails(void) {
  st_config c;
  st_error err = {0};
  mlp_config(&c);
  size_t n = 0;
  float *want = train(&c, &n, NULL);
  st_trainer *t = trained(&c, "syncfail.strata", 3);
  if (!t || !want) {
    st_trainer_destroy(t);
    free(want);
    return;
  }
  double loss;
  sync_failing = "syncfail.strata";
  int rc = st_trainer_step(t, &loss, &err); /* its commit: queued */
  if (!rc) rc = st_trainer_step(t, &loss, &err);
  if (!rc) rc = st_trainer_sync(t, &err);
  sync_failing = NULL;
  CHECK(rc == ST_EIO && strstr(err.msg, "syncfail.strata") &&
            strstr(err.msg, "sync failed") && strstr(err.msg, "intact"),
        "a failed commit stops the run, naming the store: rc %d, '%s'", rc,
        err.msg);
  st_trainer_destroy(t);
  err = (st_error){0};
  t = make(&c, &err);
  CHECK(t && st_trainer_pos(t)->step == 3,
        "after a failed commit the store reopens at the last good one, step "
        "3: step %lld (%s)",
        t ? (long long)st_trainer_pos(t)->step : -1LL, err.msg);
  rc = t ? run_until(t, STEPS, &err) : -1;
  CHECK(rc == 0 && same_weights(t, want, n),
        "after a failed commit and a reopen: the uninterrupted weights (%s)",
        err.msg);
  st_trainer_destroy(t);
  free(want);
}

/* The store's file unlinked while a trainer has it open: writes and syncs
 * still succeed (the process holds the inode), so before, every later step
 * was "committed" into a file that vanishes with the process, and the run
 * ended saying its store had committed the last step. */
static void test_removed(void) {
  st_config c;
  st_error err = {0};
  st_trainer *t = trained(&c, "removed.strata", 2);
  if (!t) return;
  CHECK(unlink(c.execution.store_path) == 0, "unlink %s",
        c.execution.store_path);
  double loss;
  int rc = st_trainer_step(t, &loss, &err); /* its commit: queued */
  if (!rc) rc = st_trainer_sync(t, &err);
  CHECK(rc == ST_EIO && strstr(err.msg, c.execution.store_path) &&
            strstr(err.msg, "removed"),
        "a commit to a removed store fails, naming it: rc %d, '%s'", rc,
        err.msg);
  st_trainer_destroy(t);
}

int main(void) {
  st_blas_init();
  if (!mkdtemp(dir)) {
    perror(dir);
    return 1;
  }
  st_config c;
  (void)cnn_config; /* the MLP and the GPT cover both optimizers */
  mlp_config(&c);
  test_crash("mlp", &c);
  gpt_config(&c);
  test_crash("gpt", &c);
  st_error err = {0};
  CHECK(st_config_set(&c, "execution.store_weights=bf16", &err) == 0 &&
            st_config_set(&c, "execution.store_rounding=stochastic", &err) == 0,
        "%s", err.msg);
  test_crash("gpt, bf16 weights", &c);
  test_bad();
  test_full();
  test_eval_read();
  test_step_read();
  test_commit_fails();
  test_removed();
  test_create_race();
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0, "%s", cmd);
  TH_DONE();
}
