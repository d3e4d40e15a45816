/*
 * trainer.c — one training run, whatever the mode: loads the data, builds the
 * model, sizes and allocates every buffer once (weights, gradients and
 * optimizer state are one slab each, blocks hold views into them), then per
 * step: next batch from the epoch's permutation -> the mode's executor runs
 * forward and backward and updates each block's slab as its gradient
 * completes (st_trainer_update_blocks). The position in
 * the data (epoch, offset, samples seen) is part of the checkpoint, so a
 * resumed run continues bit for bit.
 */
#include "exec.h"

#include "../compile/compile.h"
#include "../dist/dist.h"

#include <sched.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

struct st_trainer {
  st_config cfg;
  char out_dir[ST_PATH_MAX];
  st_dataset *train, *test; /* images (mlp, cnn) */
  st_text_dataset *text;    /* or a corpus (gpt): sample i of a split is
                               the window of T + 1 tokens from i * T */
  st_tokenizer *tok;
  int n_train, n_test; /* samples (windows for text) */
  int rows;            /* labels per sample: 1, or T for text */
  st_model *model;
  st_pool *pool;
  const st_executor *exec;
  void *exec_state;
  float *params, *grads, *opt;
  const uint16_t *params_bf16;  /* a file store's bf16 weights (params NULL) */
  int owned;                    /* the three above are the trainer's (else the
                                   executor's: a file store) */
  char store_path[ST_PATH_MAX]; /* that file store's */
  float *x, *losses, *probs, *dlogits;
  int *y;
  /* An executor that starts a step before the last is waited for
   * (st_executor.start): the batch buffers of the two steps in flight,
   * [0] the ones above; cur: the current step's. pending: the next step
   * was started too (st_trainer_step_ahead), its position in ahead_pos. */
  float *xb[2], *lb[2];
  int *yb[2];
  int cur, pending;
  st_train_pos ahead_pos;
  int32_t *perm, *eval_idx;
  int batch, micro_batch, eval_batch;
  int evaluated;              /* st_trainer_note_result was called */
  st_noise_scale noise;       /* metrics.noise_scale */
  uint32_t train_crc;         /* the training set's (st_train_pos) */
  double eval_loss, eval_acc; /* the run's final evaluation */
  double samples_per_s;       /* and its training rate */
  int64_t total_steps, steps_per_epoch;
  st_train_pos pos;
  st_trace *trace;             /* --trace, else NULL */
  double plan_rate, plan_util; /* the plan's predictions (0: none) */
  /* Stages placed over ranks (st_executor.owns): this rank keeps only its
   * own blocks' ranges of the three slabs, committed in reserved address
   * space (mine: a flag per block; slabs: weights, gradients, optimizer
   * state); NULL mine: the whole slabs, from st_alloc. */
  unsigned char *mine;
  st_slab slabs[3];
  /* sized at start (st_trainer_memory): the data as loaded, the
   * executor's buffers, the trainer's batch buffers; the bytes sent and
   * received inside steps, and the steps */
  size_t data_bytes, exec_bytes, batch_bytes;
  uint64_t step_sent, step_received;
  int64_t steps_run;
};

static int check_same_run(const st_trainer *t, const st_train_pos *p,
                          const char *path, st_error *err);
static st_train_pos run_pos(const st_trainer *t);
static void take_pos(st_trainer *t, const st_train_pos *p);

const st_executor *st_find_executor(const char *mode) {
  static const st_executor *all[] = {
      &st_exec_sequential, &st_exec_pipeline, &st_exec_block_sequential,
      &st_exec_pipelined_backprop, &st_exec_weight_streaming};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(all[i]->mode, mode) == 0) return all[i];
  return NULL;
}

/* A data file that would not open, named by the key that gives it and where
 * that was set: "tests/fixtures/corpus.txt: cannot open" named neither, and
 * a run's config.yaml keeps a relative path, read from the working
 * directory (a resume from elsewhere). */
static int name_data_key(const st_config *c, const char *key, const char *path,
                         int rc, st_error *err) {
  size_t n = strlen(path);
  if (!rc || !n || strncmp(err->msg, path, n) != 0) return rc;
  char msg[sizeof err->msg];
  snprintf(msg, sizeof msg, "%s", err->msg);
  return st_error_set(err, rc, "%s: %s: %s%s", st_config_where(c, key), key,
                      msg,
                      path[0] == '/' || !strstr(msg, ": cannot open")
                          ? ""
                          : " (a relative path: read from the working "
                            "directory)");
}

static int load_text(st_trainer *t, st_error *err) {
  st_config *c = &t->cfg;
  int rc = st_text_open(&t->text, &t->tok, c, err);
  if (rc) return name_data_key(c, "data.path", c->data.path, rc, err);
  int vocab = st_tokenizer_vocab(t->tok);
  if (c->model.vocab == 0)
    c->model.vocab = vocab; /* the tokenizer's */
  else if (c->model.vocab < vocab)
    return st_error_set(err, ST_ECONFIG,
                        "%s: model.vocab: %d, but the tokenizer (%s) makes ids "
                        "up to %d",
                        st_config_where(c, "model.vocab"), c->model.vocab,
                        c->data.tokenizer, vocab - 1);
  int T = c->model.context;
  t->rows = T;
  t->n_train = st_text_windows(t->text->n_train, T, c->data.train_limit);
  t->n_test = st_text_windows(t->text->n_val, T, c->data.test_limit);
  if (t->n_train < 1 || t->n_test < 1)
    return st_error_set(
        err, ST_EDATA,
        "%s: %zu training and %zu validation tokens: each part needs more "
        "than model.context = %d (%s) to give one sequence",
        c->data.path, t->text->n_train, t->text->n_val, T,
        st_config_set_at(c, "model.context"));
  return 0;
}

static int load_data(st_trainer *t, st_error *err) {
  const st_config *c = &t->cfg;
  if (strcmp(c->data.dataset, "text") == 0) return load_text(t, err);
  t->rows = 1;
  if (strcmp(c->data.dataset, "synthetic") == 0) {
    st_shape shape = {1, 28, 28};
    if (c->model.classes > 256) /* its labels are bytes, as IDX's */
      return st_error_set(err, ST_ECONFIG,
                          "%s: model.classes: %d, but data.dataset synthetic "
                          "makes at most 256 classes",
                          st_config_where(c, "model.classes"),
                          c->model.classes);
    int ntrain = c->data.train_limit ? c->data.train_limit : ST_SYNTHETIC_TRAIN;
    int ntest = c->data.test_limit ? c->data.test_limit : ST_SYNTHETIC_TEST;
    int rc = st_dataset_synthetic(&t->train, ntrain, shape, c->model.classes,
                                  c->train.seed, err);
    /* the test set: later samples of the same problem, never seen in
     * training (another seed would draw other class prototypes) */
    if (!rc)
      rc = st_dataset_synthetic_range(&t->test, ntrain, ntest, shape,
                                      c->model.classes, c->train.seed, err);
    if (!rc) {
      /* Test data is standardised with the training statistics. */
      t->test->mean = t->train->mean;
      t->test->std = t->train->std;
      t->n_train = t->train->n, t->n_test = t->test->n;
    }
    return rc;
  }
  char img[ST_PATH_MAX + 64], lab[ST_PATH_MAX + 64];
  st_data_idx_paths(c, 0, img, lab, sizeof img);
  int rc = st_dataset_load_idx(&t->train, img, lab, c->data.train_limit, err);
  if (rc) return name_data_key(c, "data.dir", c->data.dir, rc, err);
  st_data_idx_paths(c, 1, img, lab, sizeof img);
  rc = st_dataset_load_idx(&t->test, img, lab, c->data.test_limit, err);
  if (rc) return name_data_key(c, "data.dir", c->data.dir, rc, err);
  if (!rc) {
    t->test->mean = t->train->mean;
    t->test->std = t->train->std;
    t->n_train = t->train->n, t->n_test = t->test->n;
  }
  return rc;
}

/* The training set as trained on: its samples and labels, or the tokens
 * its windows cover (a resumed run must read the same). */
static uint32_t train_crc(const st_trainer *t) {
  if (t->text) {
    size_t tokens = (size_t)t->n_train * (size_t)t->rows + 1;
    return (uint32_t)crc32_z(0, (const Bytef *)t->text->train,
                             tokens * sizeof *t->text->train);
  }
  size_t n = (size_t)t->n_train;
  uLong crc = crc32_z(0, t->train->pixels, n * st_shape_numel(t->train->shape));
  return (uint32_t)crc32_z(crc, t->train->labels, n);
}

static int max_int(int a, int b) { return a > b ? a : b; }

/* Labels index the logits and test images fill buffers sized for training
 * images, so both are checked against the model before anything runs. */
static int check_data(const st_trainer *t, st_error *err) {
  const st_config *c = &t->cfg;
  if (t->text) return 0; /* ids below the vocabulary: load_text */
  const st_dataset *sets[2] = {t->train, t->test};
  /* IDX files by their paths under data.dir (a dataset keeps base names) */
  const int idx = !strcmp(c->data.dataset, "fashion_mnist");
  char img[2][ST_PATH_MAX + 64], lab[2][ST_PATH_MAX + 64];
  for (int i = 0; i < 2; i++) {
    const st_dataset *d = sets[i];
    if (idx) {
      st_data_idx_paths(c, i, img[i], lab[i], sizeof img[i]);
      continue;
    }
    snprintf(img[i], sizeof img[i], "%s", d->name);
    snprintf(lab[i], sizeof lab[i], "%s",
             d->labels_name[0] ? d->labels_name : d->name);
  }
  for (int i = 0; i < 2; i++) {
    const st_dataset *d = sets[i];
    if (d->classes <= c->model.classes) continue;
    /* the first sample past it: one damaged byte reads as a class count */
    int s = 0;
    while (s < d->n - 1 && d->labels[s] < c->model.classes) s++;
    return st_error_set(err, ST_ECONFIG,
                        "%s: model.classes: %d, but %s has labels up to %d "
                        "(the first past it: label %d of sample %d)",
                        st_config_where(c, "model.classes"), c->model.classes,
                        lab[i], d->classes - 1, d->labels[s], s);
  }
  st_shape a = t->train->shape, b = t->test->shape;
  if (a.c != b.c || a.h != b.h || a.w != b.w)
    return st_error_set(err, ST_EDATA,
                        "%s: test images are %dx%dx%d but the training "
                        "images (%s) are %dx%dx%d",
                        img[1], b.c, b.h, b.w, img[0], a.c, a.h, a.w);
  return 0;
}

int st_usable_cores(void) { return st_usable_cpus(NULL, 0); }

int st_eval_batch(const st_model *m, int micro_batch) {
  /* 256 samples, fewer when their logits, activations or scratch would
   * pass 64 MiB each (a GPT's vocabulary at every position, unfused; a
   * fused head's vocabulary chunk and the chunks it keeps, up to 71 MB a
   * sample at GPT-2's context 1024: one sample) — but never fewer than a
   * training micro-batch, whose buffers exist anyway */
  size_t logits = (size_t)m->label_rows * (size_t)m->out_cols, acts = 0;
  for (int i = 0; i < m->n_blocks; i++) acts += m->blocks[i].act_per_sample;
  size_t per_sample = logits > acts ? logits : acts, budget = (size_t)16 << 20;
  if (m->max_scratch_per_sample > per_sample)
    per_sample = m->max_scratch_per_sample;
  size_t fit = budget / (per_sample ? per_sample : 1);
  int b = fit > 256 ? 256 : fit < 1 ? 1 : (int)fit;
  return b < micro_batch ? micro_batch : b;
}

/* Whether steps may overlap: the executor starts one before the last is
 * waited for, with no noise-scale sums (their pointers are a step's own),
 * on the trainer's slabs (no executor that starts steps keeps slabs of its
 * own: the compiler counts by steps_overlap alone). */
static int steps_overlap(const st_executor *ex, const st_config *cfg) {
  return ex && ex->start && ex->wait && !cfg->metrics.noise_scale;
}

static int overlaps(const st_trainer *t) {
  return t->owned && steps_overlap(t->exec, &t->cfg);
}

/* Each run of consecutive blocks this rank keeps: calls fn(arg, first,
 * count, slab offset, floats). */
typedef int (*own_fn)(void *arg, int first, int count, size_t off, size_t n);
static int each_own(const st_trainer *t, own_fn fn, void *arg) {
  const st_model *m = t->model;
  for (int i = 0; i < m->n_blocks;) {
    if (!t->mine[i]) {
      i++;
      continue;
    }
    int j = i;
    while (j < m->n_blocks && t->mine[j]) j++;
    const st_block *lo = &m->blocks[i], *hi = &m->blocks[j - 1];
    int rc = fn(arg, i, j - i, lo->param_off,
                hi->param_off + hi->n_params - lo->param_off);
    if (rc) return rc;
    i = j;
  }
  return 0;
}

typedef struct commit_arg {
  st_slab *slab;
  size_t base; /* the optimizer slot's offset in its slab */
} commit_arg;

static int commit_range(void *arg, int first, int count, size_t off, size_t n) {
  (void)first, (void)count;
  commit_arg *c = arg;
  return st_slab_commit(c->slab, (c->base + off) * sizeof(float),
                        n * sizeof(float));
}

/* Weights, gradients and optimizer state slabs holding this rank's blocks
 * alone (slabs[0 .. 3)). */
static int own_slabs(const st_trainer *t, st_slab *slabs, st_error *err) {
  size_t n = t->model->n_params;
  int slots = st_optim_state_per_param(&t->cfg), rc = 0;
  size_t floats[3] = {n, n, (size_t)slots * n};
  for (int k = 0; !rc && k < 3; k++) {
    rc = st_slab_reserve(&slabs[k], floats[k] * sizeof(float));
    for (int j = 0; !rc && j < (k < 2 ? 1 : slots); j++) {
      commit_arg c = {&slabs[k], (size_t)j * n};
      rc = each_own(t, commit_range, &c);
    }
  }
  if (rc) {
    for (int k = 0; k < 3; k++) st_slab_release(&slabs[k]);
    return st_error_set(err, ST_ENOMEM,
                        "out of memory for this rank's stages' weights, "
                        "gradients and optimizer state");
  }
  return 0;
}

static int init_range(void *arg, int first, int count, size_t off, size_t n) {
  (void)off, (void)n;
  const st_trainer *t = arg;
  st_model_init_blocks(t->model, t->params, t->cfg.train.seed, first, count);
  return 0;
}

static int zero_range(void *arg, int first, int count, size_t off, size_t n) {
  (void)first, (void)count;
  memset((float *)arg + off, 0, n * sizeof(float));
  return 0;
}

/* The gradients back to zero after a failed step (the ones this rank
 * keeps). */
static void zero_grads(st_trainer *t) {
  if (t->mine)
    each_own(t, zero_range, t->grads);
  else
    memset(t->grads, 0, t->model->n_params * sizeof(float));
}

/* Swap space (/proc/meminfo SwapTotal), in bytes; 0 if none or unknown. */
static double swap_total(void);

double st_rank_memory_allowed(void) {
  return (st_usable_memory() + swap_total()) / st_dist_local_size();
}

static double swap_total(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  double kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "SwapTotal: %lf kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024;
}

/* This rank's parameters (every one, but over ranks its own blocks'). */
static size_t own_params(const st_trainer *t) {
  size_t n = 0;
  for (int i = 0; i < t->model->n_blocks; i++)
    if (!t->mine || t->mine[i]) n += t->model->blocks[i].n_params;
  return n;
}

void st_trainer_memory(const st_trainer *t, st_rank_memory *out) {
  memset(out, 0, sizeof *out);
  double w = 4.0 * (double)own_params(t);
  if (t->owned) {
    out->weights = w;
    out->grads = w;
    out->state = w * st_optim_state_per_param(&t->cfg);
  }
  out->buffers = (double)(t->exec_bytes + t->batch_bytes);
  out->batch = (double)t->batch_bytes;
  out->data = (double)t->data_bytes;
  out->planned =
      out->weights + out->grads + out->state + out->buffers + out->data;
  out->peak = (double)st_alloc_peak();
  out->resident = st_peak_resident();
  if (t->steps_run > 0) {
    out->sent = (double)t->step_sent / (double)t->steps_run;
    out->received = (double)t->step_received / (double)t->steps_run;
  }
  out->first = -1;
  out->last = -1;
  for (int i = 0; i < t->model->n_blocks; i++)
    if (!t->mine || t->mine[i]) {
      if (out->first < 0) out->first = i;
      out->last = i;
      out->blocks++;
    }
  for (int i = out->first; t->mine && out->first >= 0 && i <= out->last; i++)
    if (!t->mine[i]) out->first = out->last = -1; /* not one run */
}

/* execution.rank_memory_limit: this rank's share, as planned, refused at
 * start when it does not fit, naming the rank, its largest block and the
 * shortfall. */
static int check_rank_memory(const st_trainer *t, st_error *err) {
  int64_t limit = t->cfg.execution.rank_memory_limit;
  st_rank_memory r;
  st_trainer_memory(t, &r);
  /* a rank of a pipeline over ranks: its share against its machine's
   * share (in one process, or a replica a rank, check_memory did this
   * before allocating) */
  double allowed = st_rank_memory_allowed();
  char need[32], have[32];
  if (t->mine && allowed > 0 && r.planned > allowed)
    return st_error_set(
        err, ST_ENOMEM,
        "rank %d: its stages need %s, more than the %s this machine allows "
        "each of its ranks (RAM or the cgroup limit, and swap)",
        st_dist_rank(), st_plan_fmt_bytes(need, sizeof need, r.planned),
        st_plan_fmt_bytes(have, sizeof have, allowed));
  if (limit <= 0 || r.planned <= (double)limit) return 0;
  const st_model *m = t->model;
  int worst = -1;
  for (int i = 0; i < m->n_blocks; i++)
    if ((!t->mine || t->mine[i]) &&
        (worst < 0 || m->blocks[i].n_params > m->blocks[worst].n_params))
      worst = i;
  int slots = st_optim_state_per_param(&t->cfg);
  char rank[32] = "";
  if (st_dist_size() > 1)
    snprintf(rank, sizeof rank, "rank %d: ", st_dist_rank());
  char lim[32], w[32], g[32], s[32], b[32], d[32], short_by[32], biggest[32],
      tail[160] = "";
  if (worst >= 0) /* a rank that keeps no block has none to name */
    snprintf(tail, sizeof tail,
             "; its largest block, %d (%s), holds %s of weights, gradients "
             "and optimizer state",
             worst, m->blocks[worst].name,
             st_plan_fmt_bytes(biggest, sizeof biggest,
                               4.0 * (double)m->blocks[worst].n_params *
                                   (2 + slots)));
  return st_error_set(
      err, ST_ENOMEM,
      "%s%s: execution.rank_memory_limit is %s, but %s needs %s (weights %s, "
      "gradients %s, optimizer state %s, buffers %s, data %s): short by "
      "%s%s",
      rank, st_config_where(&t->cfg, "execution.rank_memory_limit"),
      st_plan_fmt_bytes(lim, sizeof lim, (double)limit),
      st_dist_size() > 1 ? "this rank" : "this run",
      st_plan_fmt_bytes(need, sizeof need, r.planned),
      st_plan_fmt_bytes(w, sizeof w, r.weights),
      st_plan_fmt_bytes(g, sizeof g, r.grads),
      st_plan_fmt_bytes(s, sizeof s, r.state),
      st_plan_fmt_bytes(b, sizeof b, r.buffers),
      st_plan_fmt_bytes(d, sizeof d, r.data),
      st_plan_fmt_bytes(short_by, sizeof short_by, r.planned - (double)limit),
      tail);
}

/* The executor a trainer of cfg runs over `ranks` MPI ranks (<= 1: one
 * process): replicas or stages over ranks (ranks.c), or weight streaming's
 * store and compute ranks (ws.c); NULL for a mode this build lacks. */
static const st_executor *executor_of(const st_config *cfg, int ranks) {
  if (ranks > 1)
    return !strcmp(cfg->execution.mode, "weight_streaming")
               ? &st_exec_weight_streaming
               : &st_exec_ranks;
  return cfg->execution.replicas > 1 ? &st_exec_replicas
                                     : st_find_executor(cfg->execution.mode);
}

/* The samples the trainer hands its executor at once: execution.micro_batch,
 * else pipelined backprop's 1 or the batch; the noise scale measures the
 * batch in two halves unless micro-batches are configured. */
static int micro_batch_of(const st_config *cfg) {
  if (cfg->execution.micro_batch) return cfg->execution.micro_batch;
  if (cfg->metrics.noise_scale) return cfg->train.batch / 2;
  return !strcmp(cfg->execution.mode, "pipelined_backprop") ? 1
                                                            : cfg->train.batch;
}

/* The trainer's own buffers, in bytes (allocate sizes them here; the
 * compiler counts them, st_trainer_batch_bytes): a batch's input, labels
 * and losses (a row per label) at the larger of the batch and the
 * evaluation batch; the logits' probabilities and gradient at the larger of
 * the micro-batch the executor runs and the evaluation batch; the epoch's
 * permutation and an evaluation's indices; and with steps that overlap a
 * second batch's input, labels and losses. */
typedef struct batch_sizes {
  size_t x, y, losses, probs, dlogits, perm, eval_idx, x2, y2, losses2;
} batch_sizes;

static batch_sizes batch_sizes_of(const st_model *m, int label_rows, int batch,
                                  int micro_batch, int eval_batch, int n_train,
                                  int two) {
  size_t in_numel = st_shape_numel(m->in), classes = (size_t)m->out_cols;
  size_t rows = (size_t)max_int(batch, eval_batch);
  size_t labels = rows * (size_t)label_rows;
  size_t exec_rows =
      (size_t)max_int(micro_batch, eval_batch) * (size_t)label_rows;
  size_t b = (size_t)batch;
  return (batch_sizes){.x = rows * in_numel * sizeof(float),
                       .y = labels * sizeof(int),
                       .losses = labels * sizeof(float),
                       .probs = exec_rows * classes * sizeof(float),
                       .dlogits = exec_rows * classes * sizeof(float),
                       .perm = (size_t)n_train * sizeof(int32_t),
                       .eval_idx = (size_t)eval_batch * sizeof(int32_t),
                       .x2 = two ? b * in_numel * sizeof(float) : 0,
                       .y2 = two ? b * (size_t)label_rows * sizeof(int) : 0,
                       .losses2 =
                           two ? b * (size_t)label_rows * sizeof(float) : 0};
}

double st_trainer_batch_bytes(const st_model *m, const st_config *cfg,
                              int ranks, int n_train) {
  int mb = micro_batch_of(cfg);
  int two = steps_overlap(executor_of(cfg, ranks), cfg);
  batch_sizes z =
      batch_sizes_of(m, m->label_rows > 0 ? m->label_rows : 1, cfg->train.batch,
                     mb, st_eval_batch(m, mb), n_train, two);
  size_t sizes[] = {z.x,    z.y,        z.losses, z.probs, z.dlogits,
                    z.perm, z.eval_idx, z.x2,     z.y2,    z.losses2};
  int n = two ? 10 : 7; /* the second batch's three only where allocated */
  double bytes = 0;
  for (int i = 0; i < n; i++) bytes += (double)st_alloc_counted(sizes[i]);
  return bytes;
}

static int allocate(st_trainer *t, st_error *err) {
  const st_model *m = t->model;
  /* The executor first: one that keeps the weights (a file store) makes
   * them and says where they are. */
  st_config resolved = t->cfg; /* a file store's path, in the run's dir
                                 unless given (the config keeps "") */
  int stored = st_store_resolve(&resolved, t->out_dir[0] ? t->out_dir : NULL);
  if (stored)
    snprintf(t->store_path, sizeof t->store_path, "%s",
             resolved.execution.store_path);
  size_t held = st_alloc_bytes();
  int rc = t->exec->create(&t->exec_state, m, stored ? &resolved : &t->cfg,
                           t->micro_batch, t->eval_batch, err);
  if (rc) return rc;
  t->exec_bytes = st_alloc_bytes() - held;
  t->owned =
      !(t->exec->slabs && t->exec->slabs(t->exec_state, &t->params,
                                         &t->params_bf16, &t->grads, &t->opt));
  /* from here a failure may be this rank's alone: agreed on below */
  st_dist_unshare_error();
  if (t->owned && t->exec->owns) {
    if (!(t->mine = malloc((size_t)m->n_blocks)))
      rc = st_error_set(err, ST_ENOMEM, "out of memory");
    else if (!t->exec->owns(t->exec_state, t->mine)) {
      free(t->mine);
      t->mine = NULL;
    }
  }
  if (rc) {
  } else if (t->owned && t->mine) {
    if (!(rc = own_slabs(t, t->slabs, err))) {
      t->params = t->slabs[0].base;
      t->grads = t->slabs[1].base;
      t->opt = t->slabs[2].base;
    }
  } else if (t->owned) {
    t->params = st_alloc(m->n_params * sizeof(float));
    t->grads = st_alloc(m->n_params * sizeof(float));
    t->opt = st_alloc((size_t)st_optim_state_per_param(&t->cfg) * m->n_params *
                      sizeof(float));
  }
  held = st_alloc_bytes();
  int two = overlaps(t);
  batch_sizes z = batch_sizes_of(m, t->rows, t->batch, t->micro_batch,
                                 t->eval_batch, t->n_train, two);
  t->x = st_alloc(z.x);
  t->y = st_alloc(z.y);
  t->losses = st_alloc(z.losses);
  t->probs = st_alloc(z.probs);
  t->dlogits = st_alloc(z.dlogits);
  t->perm = st_alloc(z.perm);
  t->eval_idx = st_alloc(z.eval_idx);
  t->xb[0] = t->x, t->yb[0] = t->y, t->lb[0] = t->losses;
  if (two) {
    t->xb[1] = st_alloc(z.x2);
    t->yb[1] = st_alloc(z.y2);
    t->lb[1] = st_alloc(z.losses2);
  }
  if (!rc && ((t->owned && !t->params) || !t->grads || !t->opt || !t->x ||
              !t->y || !t->losses || !t->probs || !t->dlogits || !t->perm ||
              !t->eval_idx || (two && (!t->xb[1] || !t->yb[1] || !t->lb[1]))))
    rc = st_error_set(err, ST_ENOMEM,
                      "out of memory for %zu parameters at batch %d",
                      m->n_params, t->batch);
  t->batch_bytes = st_alloc_bytes() - held;
  if (!rc) rc = check_rank_memory(t, err);
  /* over MPI ranks, every rank learns whether any failed (the executor's
   * create agreed already: every rank is here) */
  return st_dist_size() > 1 ? st_dist_agree(rc, err) : rc;
}

/* The order of the training samples in an epoch. */
static void make_permutation(st_trainer *t, int64_t epoch) {
  int n = t->n_train;
  if (t->cfg.data.shuffle)
    st_shuffle(t->perm, n, t->cfg.train.seed, epoch);
  else
    for (int i = 0; i < n; i++) t->perm[i] = i;
}

/* The config as config.yaml writes it, hashed (FNV-1a): ranks compare it. */
/* The resolved config as st_config_write gives it (NULL: out of memory);
 * the caller frees it. */
static char *config_text(const st_config *cfg, size_t *len) {
  char *text = NULL;
  FILE *f = open_memstream(&text, len);
  if (!f) return NULL;
  st_config_write(cfg, f);
  fclose(f);
  return text;
}

/* FNV-1a over n bytes */
static uint64_t fnv1a(const char *p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return h;
}

static uint64_t config_hash(const st_config *cfg) {
  size_t len = 0;
  char *text = config_text(cfg, &len);
  uint64_t h = text ? fnv1a(text, len) : 0;
  free(text);
  return h;
}

/* The ranks' configs differ (config_hash): every rank compares the
 * resolved config line by line, in step, so the error names the first key
 * that differs. */
static void name_differing_key(const st_config *cfg, st_error *err) {
  size_t len = 0;
  char *text = config_text(cfg, &len);
  if (!text) return;
  char section[64] = "", what[160];
  st_error e = {0};
  /* as many calls on every rank: the line counts first (another strata's
   * schema could have more keys) */
  uint64_t lines = 0;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  if (st_dist_check_same(lines, "config's line count", &e)) {
    if (e.code == ST_ECONFIG) *err = e;
    free(text);
    return;
  }
  for (char *line = text, *end; line && *line; line = end) {
    end = strchr(line, '\n');
    if (end) *end++ = '\0';
    size_t name = strcspn(line, ":");
    if (line[0] != ' ' && line[0] != '#' && line[name] == ':')
      snprintf(section, sizeof section, "%.*s", (int)name, line);
    uint64_t h = fnv1a(line, strlen(line));
    const char *key = line + strspn(line, " ");
    snprintf(what, sizeof what, "config key %s.%.*s", section,
             (int)strcspn(key, ":"), key);
    if (line[0] == ' ' && st_dist_check_same(h, what, &e)) {
      if (e.code == ST_ECONFIG) *err = e;
      break;
    }
  }
  free(text);
}

/* The least this run must hold — weights, gradients, optimizer state and
 * one micro-batch's activations, as `compile --validate-only` counts them
 * — against what this machine allows a rank: refused before anything is
 * allocated (a 318 GB model zeroed a 12.8 GB buffer for a minute before
 * the allocation that had to fail). A file store keeps the weights and the
 * state on disk; the compute side's own limit is weight streaming's. */
static int check_memory(const st_trainer *t, st_error *err) {
  const st_config *c = &t->cfg;
  const st_model *m = t->model;
  int ws = !strcmp(c->execution.mode, "weight_streaming");
  int file = ws && !strcmp(c->execution.store, "file");
  double w = 4.0 * (double)m->n_params,
         acts = 4.0 * (double)st_shape_numel(m->in);
  for (int i = 0; i < m->n_blocks; i++)
    acts += 4.0 * (double)m->blocks[i].act_per_sample;
  acts *= t->micro_batch;
  double slots = st_optim_state_per_param(c);
  double grads = file ? 0 : w, state = file ? 0 : w * slots,
         weights = file ? 0 : w;
  double need = weights + grads + state + acts;
  double allowed = st_rank_memory_allowed();
  if (allowed <= 0 || need <= allowed) return 0;
  char a[32], b[32], g[32], s[32], x[32], l[32];
  return st_error_set(
      err, ST_ENOMEM,
      "%s: the model needs at least %s (weights %s, gradients %s, optimizer "
      "state %s, activations %s at micro-batch %d), more than the %s this "
      "machine allows%s (RAM or the cgroup limit, and swap); refused before "
      "allocating",
      c->path[0] ? c->path : "config", st_plan_fmt_bytes(a, sizeof a, need),
      st_plan_fmt_bytes(b, sizeof b, weights),
      st_plan_fmt_bytes(g, sizeof g, grads),
      st_plan_fmt_bytes(s, sizeof s, state),
      st_plan_fmt_bytes(x, sizeof x, acts), t->micro_batch,
      st_plan_fmt_bytes(l, sizeof l, allowed),
      st_dist_local_size() > 1 ? " each rank" : "");
}

int st_trainer_create(st_trainer **out, const st_config *cfg,
                      const char *out_dir, st_error *err) {
  *out = NULL;
  /* Started by mpirun: rank r is replica r (ranks.c). Every rank must run
   * the same config, so every rank finds the same fault in it. */
  int rc = 0;
  if (st_dist_size() > 1 &&
      (rc = st_dist_check_same(config_hash(cfg), "config", err))) {
    if (rc == ST_ECONFIG) name_differing_key(cfg, err);
    return rc;
  }
  if ((rc = st_config_validate(cfg, err))) {
    if (st_dist_size() > 1) st_dist_share_error();
    return rc;
  }
  st_trainer *t = calloc(1, sizeof *t);
  if (!t) return st_error_set(err, ST_ENOMEM, "out of memory");
  t->cfg = *cfg;
  /* The longest file written is checkpoints/step-NNNNNNNN.safetensors:
   * refuse an output path that could not hold it now, not after training. */
  if (out_dir && strlen(out_dir) + 48 >= ST_PATH_MAX) {
    rc = st_error_set(err, ST_EARG, "%.64s...: output path too long (max %d)",
                      out_dir, ST_PATH_MAX - 48);
    goto fail;
  }
  if (out_dir) snprintf(t->out_dir, sizeof t->out_dir, "%s", out_dir);
  /* over MPI ranks: replicas or stages (ranks.c), or weight streaming's
   * store and compute ranks (ws.c) */
  t->exec = executor_of(cfg, st_dist_size());
  if (!t->exec) {
    rc = st_error_set(err, ST_EUNSUPPORTED,
                      "%s: execution.mode: '%s' is not available in this build",
                      st_config_where(cfg, "execution.mode"),
                      cfg->execution.mode);
    goto fail;
  }
  t->batch = cfg->train.batch;
  int pb = !strcmp(cfg->execution.mode, "pipelined_backprop");
  t->micro_batch = cfg->execution.micro_batch ? cfg->execution.micro_batch
                   : pb                       ? 1
                                              : cfg->train.batch;
  if (pb && t->batch % t->micro_batch) {
    rc = st_error_set(err, ST_ECONFIG,
                      "%s: train.batch: %d is not a whole number of "
                      "micro-batches of %d",
                      st_config_where(cfg, "train.batch"), t->batch,
                      t->micro_batch);
    goto fail;
  }
  /* A recipe tuned at optimizer.reference_batch, rescaled to the batch
   * every update sees (the trainer's copy of the config is what runs). */
  if (cfg->optimizer.reference_batch > 0)
    st_optim_scale_batch(&t->cfg.optimizer.lr, &t->cfg.optimizer.momentum,
                         &t->cfg.optimizer.min_lr,
                         cfg->optimizer.reference_batch,
                         pb ? t->micro_batch : t->batch);
  /* The noise scale needs gradients at two sizes: measure the batch in two
   * halves unless micro-batches are configured (validated even). */
  t->micro_batch = micro_batch_of(cfg);
  st_noise_scale_init(&t->noise, cfg->metrics.noise_ema);
  size_t held = st_alloc_bytes();
  if ((rc = load_data(t, err))) goto fail;
  t->data_bytes = st_alloc_bytes() - held;
  if ((rc = check_data(t, err))) goto fail;
  /* an epoch draws its batches without replacement from the n_train */
  t->noise.population = t->n_train;
  if ((rc = st_dist_check_same((uint64_t)t->n_train << 32 | (uint32_t)t->n_test,
                               "data (its training and test set sizes)", err)))
    goto fail;
  t->train_crc = train_crc(t);
  if ((rc = st_dist_check_same(t->train_crc, "training data (by its CRC-32)",
                               err)))
    goto fail;
  if (t->n_train < t->batch)
    rc = st_error_set(err, ST_ECONFIG,
                      "%s: train.batch: %d is larger than the %d training "
                      "%s",
                      st_config_where(cfg, "train.batch"), t->batch, t->n_train,
                      t->text ? "sequences" : "samples");
  st_shape in =
      t->text ? (st_shape){1, cfg->model.context, 1} : t->train->shape;
  if (!rc) rc = st_model_create(&t->model, &t->cfg, in, err);
  /* the same config and data sizes on every rank fail alike here: said
   * once, by rank 0 (memory aside, which the agreement names by rank) */
  if (st_dist_size() > 1) rc = st_dist_agree(rc, err);
  if (rc) goto fail;
  t->eval_batch = st_eval_batch(t->model, t->micro_batch);
  /* stages over ranks, or weight streaming's store and compute ranks: each
   * rank's share, once known (check_rank_memory) */
  int shared =
      st_dist_size() > 1 && (!strcmp(cfg->execution.placement, "ranks") ||
                             !strcmp(cfg->execution.mode, "weight_streaming"));
  if (!shared && (rc = check_memory(t, err))) goto fail;
  st_blas_init(); /* idempotent; library users need not remember it */
  /* before any thread starts: each applies the mode as it takes up work */
  st_fp_set_flush(cfg->train.flush_subnormals);
  st_gemm_set_bf16(!strcmp(cfg->train.precision, "bf16"));
  /* the packed kernel or the BLAS per product class, as this machine's
   * profile measured them (else the rule built in), once a process */
  st_gemm_choose_profile_once();
  /* all the cores, or over MPI ranks this rank's share of its machine's */
  int threads = cfg->train.threads > 0
                    ? cfg->train.threads
                    : st_usable_cores() / st_dist_local_size();
  if (threads < 1) threads = 1;
  /* Under stage threads that hold the cores through a step, the trainer's
   * pool (the next batch, evaluation) only waits beside them: its worker
   * spinning 1 ms after each batch took a core from a stage (fc_mnist's
   * 2-stage pipeline at batch 64 on 2 cores: 21% of a perf profile in the
   * worker's spin). */
  const char *mode = cfg->execution.mode;
  int staged = !strcmp(mode, "pipeline") || !strcmp(mode, "block_sequential") ||
               (!strcmp(mode, "pipelined_backprop") && !cfg->execution.emulate);
  t->pool = staged ? st_pool_create_brief(threads) : st_pool_create(threads);
  if (!t->pool) {
    rc = st_error_set(err, ST_ENOMEM, "cannot start %d threads", threads);
    goto fail;
  }
  /* the run's directory first: a store in it is made with the executor */
  if (out_dir) {
    char ck[ST_PATH_MAX + 16];
    snprintf(ck, sizeof ck, "%s/checkpoints", out_dir);
    if ((rc = st_mkdir_p(ck, 1, err))) goto fail;
  }
  if ((rc = allocate(t, err))) goto fail;
  if (t->owned && t->mine)
    each_own(t, init_range, t);
  else if (t->owned)
    st_model_init(t->model, t->params, cfg->train.seed);
  t->steps_per_epoch = t->n_train / t->batch;
  t->total_steps = cfg->train.steps > 0
                       ? cfg->train.steps
                       : t->steps_per_epoch * (int64_t)cfg->train.epochs;
  /* A kept state (a file store) that has trained continues where it
   * stopped, under the same run's settings. */
  const st_train_pos *kept =
      t->exec->stored_pos ? t->exec->stored_pos(t->exec_state) : NULL;
  if (kept) {
    /* a new store has only its weights' seed to agree on */
    st_train_pos p = *kept;
    if (p.step == 0) {
      p = run_pos(t);
      p.seed = kept->seed;
    }
    if ((rc = check_same_run(t, &p, t->store_path, err))) goto fail;
    if (kept->step > 0) take_pos(t, kept);
  }
  make_permutation(t, t->pos.epoch);
  *out = t;
  return 0;
fail:
  st_trainer_destroy(t);
  return rc;
}

void st_trainer_destroy(st_trainer *t) {
  if (!t) return;
  if (t->exec && t->exec_state) t->exec->destroy(t->exec_state);
  st_trace_destroy(t->trace);
  if (t->owned && t->mine) {
    for (int k = 0; k < 3; k++) st_slab_release(&t->slabs[k]);
  } else if (t->owned) {
    st_free(t->params);
    st_free(t->grads);
    st_free(t->opt);
  }
  free(t->mine);
  st_free(t->x);
  st_free(t->y);
  st_free(t->losses);
  st_free(t->xb[1]);
  st_free(t->yb[1]);
  st_free(t->lb[1]);
  st_free(t->probs);
  st_free(t->dlogits);
  st_free(t->perm);
  st_free(t->eval_idx);
  st_pool_destroy(t->pool);
  st_model_destroy(t->model);
  st_dataset_destroy(t->train);
  st_dataset_destroy(t->test);
  st_text_dataset_destroy(t->text);
  st_tokenizer_destroy(t->tok);
  free(t);
}

typedef struct fill_job {
  const st_dataset *ds;
  const int32_t *idx;
  int B, normalize;
  float *x;
  int *y;
} fill_job;

enum { FILL_SAMPLES = 16 }; /* a task's images */

static void fill_task(void *arg, int task) {
  const fill_job *j = arg;
  int s0 = task * FILL_SAMPLES;
  int n = j->B - s0 < FILL_SAMPLES ? j->B - s0 : FILL_SAMPLES;
  size_t numel = st_shape_numel(j->ds->shape);
  st_dataset_batch(j->ds, j->idx + s0, n, j->normalize, j->x + s0 * numel,
                   j->y + s0);
}

/* Samples idx[0..B) of the training (test == 0) or test split into x and
 * y: images and labels, or token windows (inputs as floats, and each
 * position's next token). Images on `pool` when not NULL (each pixel the
 * same operations wherever it runs): on the caller alone it was 3.5% of
 * an MLP step at batch 256 on 2 threads, the worker idle meanwhile. */
static void fill_batch(st_trainer *t, st_pool *pool, int test,
                       const int32_t *idx, int B, float *x, int *y) {
  if (!t->text) {
    fill_job j = {test ? t->test : t->train, idx, B,
                  t->cfg.data.normalize,     x,   y};
    st_pool_for(pool, (B + FILL_SAMPLES - 1) / FILL_SAMPLES, fill_task, &j);
    return;
  }
  const int32_t *tok = test ? t->text->val : t->text->train;
  size_t T = (size_t)t->rows;
  for (int b = 0; b < B; b++) {
    const int32_t *w = tok + (size_t)idx[b] * T;
    for (size_t i = 0; i < T; i++) {
      x[(size_t)b * T + i] = (float)w[i];
      y[(size_t)b * T + i] = w[i + 1];
    }
  }
}

/* Fills x, y with the batch of the step at *pos; starts a new epoch (in
 * *pos) when the current one cannot supply a whole batch (the remainder is
 * dropped, as PyTorch's drop_last). pool: the trainer's, where nothing
 * else runs on it meanwhile, else NULL. */
static void next_batch(st_trainer *t, st_pool *pool, st_train_pos *pos,
                       float *x, int *y) {
  if (pos->epoch_pos + t->batch > t->n_train) {
    pos->epoch++;
    pos->epoch_pos = 0;
    make_permutation(t, pos->epoch);
  }
  fill_batch(t, pool, 0, t->perm + pos->epoch_pos, t->batch, x, y);
}

static void update_range(void *arg, size_t off, size_t n) {
  const st_trainer_view *v = arg;
  st_optim_step_range(v->ctx.pool, v->cfg, v->params + off, v->grads + off,
                      v->opt + off, v->model->n_params, n, v->lr, v->step);
}

/* Whether block b holds a tied copy (its update rides with the source's). */
static int has_tied_copy(const st_block *b) {
  for (int t = 0; t < b->n_tensors; t++)
    if (b->tensors[t].tie >= 0) return 1;
  return 0;
}

/* Tied pairs move 2 x V x C floats per step (a GPT-2 head: 38.6M): on the
 * pool, in chunks fixed by the size (each element's result is the same). */
enum { TIE_CHUNK = 1 << 16 };

typedef struct tie_job {
  float *src, *copy;
  size_t n;
  int gather; /* 1: src += copy, copy = 0 (gradients); 0: copy = src */
} tie_job;

static void tie_task(void *arg, int task) {
  const tie_job *j = arg;
  size_t lo = (size_t)task * TIE_CHUNK;
  size_t n = j->n - lo < TIE_CHUNK ? j->n - lo : TIE_CHUNK;
  float *restrict src = j->src + lo, *restrict copy = j->copy + lo;
  if (!j->gather) {
    memcpy(copy, src, n * sizeof *copy);
    return;
  }
  for (size_t k = 0; k < n; k++) src[k] += copy[k];
  memset(copy, 0, n * sizeof *copy);
}

void st_trainer_ties(const st_trainer_view *v, float *slab, size_t base,
                     size_t lo, size_t hi, int gather) {
  const st_model *m = v->model;
  for (int i = 0; m->n_ties && i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    for (int t = 0; t < b->n_tensors; t++) {
      const st_tensor_info *ti = &b->tensors[t];
      if (ti->tie < 0 || (size_t)ti->tie < lo || (size_t)ti->tie >= hi)
        continue;
      tie_job j = {slab + ((size_t)ti->tie - base),
                   slab + (b->param_off + ti->offset - base), ti->numel,
                   gather};
      st_pool_for(v->ctx.pool, (int)((ti->numel + TIE_CHUNK - 1) / TIE_CHUNK),
                  tie_task, &j);
    }
  }
}

/* The ranges one pass visits: fn on each, its squared gradient first into
 * *v->gb2. With `merge` (only for rules that treat every weight alone,
 * and only without *v->gb2, whose sums go range by range), ranges that
 * touch are joined into one call; a gap (a fused layer's tensors, a tied
 * copy) is never joined over. A tied GPT goes tensor by tensor, and its 52
 * tensors were 52 pool jobs of AdamW, some one task too small to split:
 * joined, gpt_tiny's AdamW at batch 1 on 2 threads took 15-20% less time
 * (3 alternating 1,500-step runs). */
typedef struct range_run {
  const st_trainer_view *v;
  st_range_fn fn;
  void *arg;
  int merge;
  size_t off, n; /* the range held back to join the next (n 0: none) */
} range_run;

static void range_flush(range_run *r) {
  if (r->n) r->fn(r->arg, r->off, r->n);
  r->n = 0;
}

static void range_add(range_run *r, size_t off, size_t n) {
  if (r->v->gb2) *r->v->gb2 += st_sum_squares(r->v->grads + off, n);
  if (r->merge && r->n && r->off + r->n == off) {
    r->n += n;
    return;
  }
  range_flush(r);
  r->off = off, r->n = n;
  if (!r->merge) range_flush(r);
}

static void each_range(const st_trainer_view *v, int first, int count,
                       int gather, int merge, st_range_fn fn, void *arg) {
  const st_model *m = v->model;
  const st_block *lo = &m->blocks[first], *hi = &m->blocks[first + count - 1];
  size_t begin = lo->param_off, end = hi->param_off + hi->n_params;
  range_run r = {v, fn, arg, merge && !v->gb2, 0, 0};
  /* Each tied copy whose source is updated here adds its gradient into the
   * source's first (the copy's gradient is complete: see exec.h). */
  if (gather) st_trainer_ties(v, v->grads, 0, begin, end, 1);
  int per_tensor = v->ctx.fused != NULL;
  for (int i = first; i < first + count && !per_tensor; i++)
    per_tensor = has_tied_copy(&m->blocks[i]);
  if (!per_tensor) {
    range_add(&r, begin, end - begin);
    range_flush(&r);
    return;
  }
  /* Tensor by tensor: the layers that fuse (linear at batch 1) were
   * updated in the backward, and tied copies are updated with their
   * source (the elementwise rules give the same bits either way). */
  for (int i = first; i < first + count; i++) {
    const st_block *b = &m->blocks[i];
    for (int l = 0; l < b->n_layers; l++) {
      const st_layer *L = &b->layers[l];
      if (L->w_tensor < 0 || (st_layer_fuses_update(L, &v->ctx, v->batch) &&
                              b->tensors[L->w_tensor].tie < 0))
        continue;
      const int tensors[2] = {L->w_tensor, L->b_tensor};
      for (int k = 0; k < 2; k++)
        if (tensors[k] >= 0 && b->tensors[tensors[k]].tie < 0)
          range_add(&r, b->param_off + b->tensors[tensors[k]].offset,
                    b->tensors[tensors[k]].numel);
    }
  }
  range_flush(&r);
}

void st_trainer_each_range(const st_trainer_view *v, int first, int count,
                           int gather, st_range_fn fn, void *arg) {
  each_range(v, first, count, gather, 0, fn, arg);
}

void st_trainer_update_blocks(const st_trainer_view *v, int first, int count) {
  each_range(v, first, count, 1, 1, update_range, (void *)v);
  /* Tied copies take their source's new weights. (A copy's optimizer state
   * is never read: the copy is only ever overwritten.) */
  const st_model *m = v->model;
  const st_block *hi = &m->blocks[first + count - 1];
  st_trainer_ties(v, v->params, 0, m->blocks[first].param_off,
                  hi->param_off + hi->n_params, 0);
}

void st_exec_update_block(void *view, int block) {
  const st_trainer_view *v = view;
  double t0 = v->trace ? st_now() : 0;
  st_trainer_update_blocks(v, block, 1);
  if (v->trace)
    st_trace_add(v->trace, v->track, ST_TRACE_UPDATE, v->step, block, t0,
                 st_now());
}

/* The position with the settings a resumed run must share (check_same_run). */
static st_train_pos run_pos(const st_trainer *t) {
  st_train_pos pos = t->pos;
  pos.seed = t->cfg.train.seed;
  pos.batch = t->batch;
  pos.train_samples = t->n_train;
  pos.shuffle = t->cfg.data.shuffle;
  pos.train_crc = t->train_crc;
  pos.has_train_crc = 1;
  if (t->tok) {
    pos.tokenizer_crc = st_tokenizer_crc(t->tok);
    pos.has_tokenizer_crc = 1;
  } else {
    pos.normalize = t->cfg.data.normalize != 0;
    pos.has_normalize = 1;
  }
  pos.pb_micro_batch =
      !strcmp(t->cfg.execution.mode, "pipelined_backprop") ? t->micro_batch : 0;
  if (t->cfg.metrics.noise_scale) {
    pos.noise_g2 = t->noise.g2;
    pos.noise_trace = t->noise.trace;
    pos.noise_weight = t->noise.weight;
    pos.noise_n = t->noise.n;
  }
  return pos;
}

/* A kept position becomes the trainer's, with the noise scale's averages
 * where it kept some (a run without them starts its averages afresh). */
static void take_pos(st_trainer *t, const st_train_pos *p) {
  t->pos = *p;
  t->pos.noise_g2 = t->pos.noise_trace = t->pos.noise_weight = 0;
  t->pos.noise_n = 0;
  if (t->cfg.metrics.noise_scale && p->noise_n > 0) {
    t->noise.g2 = p->noise_g2;
    t->noise.trace = p->noise_trace;
    t->noise.weight = p->noise_weight;
    t->noise.n = p->noise_n;
  }
}

/* Evaluating, saving, ... while st_trainer_step_ahead left a step running
 * (the caller broke its promise): the weights are moving. */
static int in_flight(st_error *err) {
  return st_error_set(err, ST_EUNSUPPORTED,
                      "internal error: a training step is still running "
                      "(st_trainer_step_ahead was told another step would "
                      "follow)");
}

/* The view of the step at pos on batch buffers (x, y, losses). */
static st_trainer_view view_of(const st_trainer *t, const st_train_pos *pos,
                               float *x, int *y, float *losses,
                               st_fused_update *fused) {
  return (st_trainer_view){
      .model = t->model,
      .ctx = {t->pool, 1, t->cfg.train.seed, (uint64_t)pos->samples, fused},
      .params = t->params,
      .grads = t->grads,
      .opt = t->opt,
      .x = x,
      .y = y,
      .losses = losses,
      .probs = t->probs,
      .dlogits = t->dlogits,
      .batch = t->batch,
      .micro_batch = t->micro_batch,
      .loss_batch = t->batch,
      .trace = t->trace,
      .cfg = &t->cfg,
      .lr = st_lr_at(&t->cfg, pos->step, t->total_steps),
      .step = pos->step,
      .first_sample = pos->samples,
  };
}

/* After a step: the position moves past its batch; a kept state (a file
 * store) is committed with it and followed. */
static int advance(st_trainer *t, st_error *err) {
  t->pos.step++;
  t->pos.epoch_pos += t->batch;
  t->pos.samples += t->batch;
  if (t->owned) return 0;
  /* the kept state moved: commit it with the position (in the
   * background), and follow it */
  st_train_pos pos = run_pos(t);
  int rc = t->exec->commit(t->exec_state, &pos, 0, err);
  if (rc) return rc;
  t->exec->slabs(t->exec_state, &t->params, &t->params_bf16, &t->grads,
                 &t->opt);
  return 0;
}

/* Steps on an executor that overlaps them: the step at t->pos is started
 * here unless the last call started it; with `ahead` the next one is
 * started before this one is waited for. */
static int step_overlapped(st_trainer *t, int ahead, double *loss,
                           st_error *err) {
  int rc;
  if (t->pending) { /* started by the last call: take its batch's position */
    t->pending = 0;
    t->cur ^= 1;
    t->pos = t->ahead_pos;
  } else {
    next_batch(t, NULL, &t->pos, t->xb[t->cur], t->yb[t->cur]);
    st_trainer_view v =
        view_of(t, &t->pos, t->xb[t->cur], t->yb[t->cur], t->lb[t->cur], NULL);
    if ((rc = t->exec->start(t->exec_state, &v, err))) return rc;
  }
  if (ahead) {
    /* the next step's position once this one is done, its batch in the
     * other buffers (a new epoch's order is a function of the epoch) */
    st_train_pos q = t->pos;
    q.step++;
    q.epoch_pos += t->batch;
    q.samples += t->batch;
    int nb = t->cur ^ 1;
    next_batch(t, NULL, &q, t->xb[nb], t->yb[nb]);
    st_trainer_view v = view_of(t, &q, t->xb[nb], t->yb[nb], t->lb[nb], NULL);
    st_error ignored = {0}; /* a stopped executor: the wait below says why */
    if (!t->exec->start(t->exec_state, &v, &ignored)) {
      t->pending = 1;
      t->ahead_pos = q;
    }
  }
  rc = t->exec->wait(t->exec_state, loss, err);
  if (rc && t->pending) { /* stopped: the next step is not taken either */
    double ignored_loss;
    st_error ignored = {0};
    t->exec->wait(t->exec_state, &ignored_loss, &ignored);
    t->pending = 0;
  }
  if (rc) {
    zero_grads(t);
    return rc;
  }
  return advance(t, err);
}

static int step_ahead(st_trainer *t, int ahead, double *loss, st_error *err);

int st_trainer_step_ahead(st_trainer *t, int ahead, double *loss,
                          st_error *err) {
  uint64_t sent, received, sent1, received1;
  st_dist_traffic(&sent, &received);
  int rc = step_ahead(t, ahead, loss, err);
  st_dist_traffic(&sent1, &received1);
  t->step_sent += sent1 - sent;
  t->step_received += received1 - received;
  t->steps_run += rc == 0;
  return rc;
}

static int step_ahead(st_trainer *t, int ahead, double *loss, st_error *err) {
  st_fp_set_flush(t->cfg.train.flush_subnormals); /* another trainer's? */
  st_gemm_set_bf16(!strcmp(t->cfg.train.precision, "bf16"));
  if (overlaps(t)) return step_overlapped(t, ahead, loss, err);
  next_batch(t, t->pool, &t->pos, t->x, t->y);
  /* t->grads is all zeros here: allocated zeroed, and every update zeroes
   * the gradients it used. */
  /* A one-sample batch lets linear layers update inside the backward. */
  st_optim_rule rule;
  st_fused_update fused = {.rule = &rule,
                           .params = t->params,
                           .opt = t->opt,
                           .slot_stride = t->model->n_params};
  int fuse = t->batch == 1 && t->cfg.execution.fused_update;
  st_trainer_view v =
      view_of(t, &t->pos, t->x, t->y, t->losses, fuse ? &fused : NULL);
  if (fuse) st_optim_rule_init(&rule, &t->cfg, v.lr, t->pos.step);
  double gs2 = 0, gb2 = 0;
  if (t->cfg.metrics.noise_scale) v.gs2 = &gs2, v.gb2 = &gb2;
  int rc = t->exec->step(t->exec_state, &v, loss, err);
  if (rc) {
    /* Nothing was updated; drop the partial gradients of earlier
     * micro-batches so the zero-gradient invariant holds (an executor
     * that keeps the slabs clears its own). */
    if (t->owned) zero_grads(t);
    return rc;
  }
  if (v.gs2) st_noise_scale_add(&t->noise, gs2, t->micro_batch, gb2, t->batch);
  return advance(t, err);
}

int st_trainer_in_flight(const st_trainer *t) { return t->pending; }

int st_trainer_step(st_trainer *t, double *loss, st_error *err) {
  return st_trainer_step_ahead(t, 0, loss, err);
}

int st_store_resolve(st_config *cfg, const char *out_dir) {
  if (strcmp(cfg->execution.mode, "weight_streaming") ||
      strcmp(cfg->execution.store, "file"))
    return 0;
  /* with no path given, the store lives in the run's directory */
  if (!cfg->execution.store_path[0] && out_dir)
    snprintf(cfg->execution.store_path, sizeof cfg->execution.store_path,
             "%.*s/store.strata", (int)sizeof cfg->execution.store_path - 16,
             out_dir);
  return 1;
}

const char *st_trainer_store(const st_trainer *t) {
  return t->owned ? NULL : t->store_path;
}

int st_trainer_sync(st_trainer *t, st_error *err) {
  if (t->owned || !t->exec->commit) return 0;
  return t->exec->commit(t->exec_state, NULL, 1, err);
}

int st_trainer_saves_together(const st_trainer *t) { return t->mine != NULL; }

int st_trainer_check_finite(const st_trainer *t, st_error *err) {
  const st_model *m = t->model;
  for (int i = 0; t->params && i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    for (int k = 0; (!t->mine || t->mine[i]) && k < b->n_tensors; k++) {
      const st_tensor_info *ti = &b->tensors[k];
      const float *w = t->params + b->param_off + ti->offset;
      for (size_t j = 0; j < ti->numel; j++)
        if (!isfinite(w[j]))
          return st_error_set(
              err, ST_ENONFINITE,
              "step %lld: tensor '%s' holds %s at element %zu: the model "
              "diverged though its losses stayed finite; stopped, no "
              "checkpoint written — lower optimizer.lr",
              (long long)t->pos.step, ti->name,
              isnan(w[j]) ? "NaN" : "an infinity", j);
    }
  }
  return 0;
}

int st_trainer_finish(st_trainer *t, st_error *err) {
  if (t->pending) return in_flight(err);
  return t->exec->finish ? t->exec->finish(t->exec_state, err) : 0;
}

int st_trainer_evaluate(st_trainer *t, double *loss, double *accuracy,
                        st_error *err) {
  st_fp_set_flush(t->cfg.train.flush_subnormals);
  st_gemm_set_bf16(!strcmp(t->cfg.train.precision, "bf16"));
  if (t->pending) return in_flight(err);
  const st_model *m = t->model;
  st_ctx ctx = {t->pool, 0, t->cfg.train.seed, 0, NULL, t->y};
  double loss_sum = 0;
  int64_t correct = 0;
  int n = t->n_test, R = t->rows;
  for (int start = 0; start < n; start += t->eval_batch) {
    int B = n - start < t->eval_batch ? n - start : t->eval_batch;
    for (int i = 0; i < B; i++) t->eval_idx[i] = start + i;
    fill_batch(t, t->pool, 1, t->eval_idx, B, t->x, t->y);
    const float *logits =
        t->exec->forward(t->exec_state, &ctx, t->params, t->x, B);
    int rc = logits || !t->exec->commit
                 ? 0
                 : t->exec->commit(t->exec_state, NULL, 0, err);
    if (rc) return rc; /* a store's read failed: its error */
    if (!logits)       /* over ranks: a message failed */
      return st_error_set(err, ST_EIO,
                          "rank %d: evaluation stopped: a message to or from "
                          "another rank failed",
                          st_dist_rank());
    st_model_loss(m, t->pool, t->losses, t->probs, logits, t->y, B * R);
    for (size_t i = 0; i < (size_t)B * R; i++) {
      loss_sum += t->losses[i];
      correct += st_model_hit(m, logits, t->y, i);
    }
  }
  /* per label: per image, or per token */
  *loss = loss_sum / ((double)n * R);
  *accuracy = (double)correct / ((double)n * R);
  return 0;
}

int st_trainer_save(st_trainer *t, const char *path, st_error *err) {
  if (t->pending) return in_flight(err);
  st_train_pos pos = run_pos(t);
  if (t->mine) /* every rank sends its own stages to the one writing */
    return t->exec->save(t->exec_state, path, 0, t->params, t->opt,
                         t->cfg.optimizer.kind, &pos, err);
  if (!t->params) /* a store's bf16 weights: written as they are */
    return st_checkpoint_save_as(path, t->model, t->params_bf16, "BF16", t->opt,
                                 t->cfg.optimizer.kind, &pos, err);
  return st_checkpoint_save(path, t->model, t->params, t->opt,
                            t->cfg.optimizer.kind, &pos, err);
}

int st_trainer_save_shards(st_trainer *t, const char *dir, st_error *err) {
  if (t->pending) return in_flight(err);
  st_train_pos pos = run_pos(t);
  if (t->mine)
    return t->exec->save(t->exec_state, dir, 1, t->params, t->opt,
                         t->cfg.optimizer.kind, &pos, err);
  if (!t->params)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: a store's bf16 weights are exported as one file "
                        "(train.checkpoint_format: single)",
                        dir);
  return st_checkpoint_save_sharded(dir, t->model, t->params, t->opt,
                                    t->cfg.optimizer.kind, &pos, err);
}

/* A checkpoint continues this run only under the same seed, batch, training
 * set, shuffling, pixel standardisation and (pipelined backprop) the same
 * micro-batch; anything else would silently train something else. */
static int check_same_run(const st_trainer *t, const st_train_pos *p,
                          const char *path, st_error *err) {
  const char *what = NULL, *key = NULL;
  long long had = 0, now = 0;
  if (p->seed != t->cfg.train.seed)
    what = "seed", key = "train.seed", had = (long long)p->seed,
    now = (long long)t->cfg.train.seed;
  else if (p->batch != t->batch)
    what = "batch", key = "train.batch", had = p->batch, now = t->batch;
  else if (p->train_samples != t->n_train)
    what = "training-set size",
    key = t->text ? "data.path, data.tokenizer, data.val_fraction or "
                    "data.train_limit"
          : !strcmp(t->cfg.data.dataset, "fashion_mnist")
              ? "data.dataset, data.dir or data.train_limit"
              : "data.dataset or data.train_limit",
    had = p->train_samples, now = t->n_train;
  else if (p->shuffle != t->cfg.data.shuffle)
    what = "shuffling", key = "data.shuffle", had = p->shuffle,
    now = t->cfg.data.shuffle;
  else if (p->has_normalize && !t->text &&
           p->normalize != (t->cfg.data.normalize != 0))
    what = "pixel standardisation", key = "data.normalize", had = p->normalize,
    now = t->cfg.data.normalize != 0;
  else if (p->pb_micro_batch > 0 &&
           !strcmp(t->cfg.execution.mode, "pipelined_backprop") &&
           p->pb_micro_batch != t->micro_batch)
    /* each micro-batch an update: the stages' update counts (pb.c's
     * updates0) would be taken at another number per step */
    what = "pipelined_backprop's micro-batch", key = "execution.micro_batch",
    had = p->pb_micro_batch, now = t->micro_batch;
  else if (p->has_tokenizer_crc && t->tok &&
           p->tokenizer_crc != st_tokenizer_crc(t->tok))
    return st_tokenizer_check(t->tok, &t->cfg, path, p->tokenizer_crc, err);
  else if (p->has_train_crc && p->train_crc != t->train_crc)
    return st_error_set(
        err, ST_ECONFIG,
        "%s: written on a training set of CRC-32 %08x, the config's (%s) has "
        "%08x: the same size, other data: resuming would not continue the "
        "same run",
        path, (unsigned)p->train_crc,
        t->text ? "data.path, data.tokenizer or data.val_fraction"
                : "data.dataset or data.dir",
        (unsigned)t->train_crc);
  if (!what) return 0;
  return st_error_set(err, ST_ECONFIG,
                      "%s: written with %s %lld, the config (%s) gives %lld: "
                      "resuming would not continue the same run",
                      path, what, had, key, now);
}

/* The tokenizer a text run's checkpoint records must be the config's, for
 * eval and for a resume alike (checked before the tensors, whose shapes a
 * tokenizer of another vocabulary changes: that is not a damaged file). */
static int check_tokenizer(const st_trainer *t, const char *path,
                           st_error *err) {
  uint32_t tok_crc;
  return t->tok && st_checkpoint_tokenizer_crc(path, &tok_crc)
             ? st_tokenizer_check(t->tok, &t->cfg, path, tok_crc, err)
             : 0;
}

/* What a resume checks of a checkpoint before it reads any tensor's data:
 * its tokenizer, every tensor (weights, and optimizer state of the
 * config's kind) in this model's shapes, its position, that it is this
 * run's and within its steps. */
static int check_resume(const st_trainer *t, const char *path,
                        st_train_pos *pos, st_error *err) {
  int rc = check_tokenizer(t, path, err);
  /* opt without params: the optimizer state is checked, nothing copied */
  if (!rc)
    rc = st_checkpoint_load_blocks(path, t->model, NULL, t->opt,
                                   t->cfg.optimizer.kind, pos, t->mine, err);
  if (!rc) rc = check_same_run(t, pos, path, err);
  /* the key that sets the run's length: train.steps, or train.epochs
   * where train.steps is 0 */
  const char *length = t->cfg.train.steps > 0 ? "train.steps" : "train.epochs";
  if (!rc && pos->step > t->total_steps)
    rc = st_error_set(err, ST_ECONFIG,
                      "%s: at step %lld, past this run's last step %lld "
                      "(%s): raise %s to continue it",
                      path, (long long)pos->step, (long long)t->total_steps,
                      st_config_set_at(&t->cfg, length), length);
  return rc;
}

int st_trainer_check_resume(const st_trainer *t, const char *path,
                            st_error *err) {
  st_train_pos pos;
  return check_resume(t, path, &pos, err);
}

int st_trainer_load(st_trainer *t, const char *path, int weights_only,
                    st_error *err) {
  if (t->pending) return in_flight(err);
  /* Pipelined backprop is never drained: the micro-batches of the steps
   * run so far are in flight (activations, stashed weights, the stages'
   * update counts), and their backward would reach the loaded weights. */
  if (t->steps_run > 0 && !strcmp(t->cfg.execution.mode, "pipelined_backprop"))
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: this pipelined_backprop trainer has run %lld "
                        "steps and its pipeline is full: load a checkpoint "
                        "into a new trainer",
                        path, (long long)t->steps_run);
  if (!t->owned)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: the weights live in the store %s, which is this "
                        "run's checkpoint: a checkpoint file cannot be loaded "
                        "into it (use execution.store: memory)",
                        path, t->store_path);
  int rc;
  if (weights_only)
    return (rc = check_tokenizer(t, path, err))
               ? rc
               : st_checkpoint_load_blocks(path, t->model, t->params, NULL,
                                           NULL, NULL, t->mine, err);
  /* A checkpoint of another run must leave this trainer as it was: every
   * tensor and the position are checked first; then the weights are read
   * into copies (in one process) or, over ranks, where they go (a rank's
   * own stages: copies would double their memory). */
  st_train_pos pos;
  const st_model *m = t->model;
  size_t state = (size_t)st_optim_state_per_param(&t->cfg) * m->n_params;
  rc = check_resume(t, path, &pos, err);
  if (rc) return rc;
  if (t->mine) {
    rc = st_checkpoint_load_blocks(path, m, t->params, t->opt,
                                   t->cfg.optimizer.kind, &pos, t->mine, err);
  } else {
    float *params = st_alloc(m->n_params * sizeof(float));
    float *opt = st_alloc(state * sizeof(float));
    rc = params && opt ? 0 : st_error_set(err, ST_ENOMEM, "out of memory");
    if (!rc)
      rc = st_checkpoint_load(path, m, params, opt, t->cfg.optimizer.kind, &pos,
                              err);
    if (!rc) {
      memcpy(t->params, params, m->n_params * sizeof(float));
      memcpy(t->opt, opt, state * sizeof(float));
    }
    st_free(params);
    st_free(opt);
  }
  if (!rc) {
    take_pos(t, &pos);
    make_permutation(t, t->pos.epoch);
  }
  return rc;
}

const st_model *st_trainer_model(const st_trainer *t) { return t->model; }
void *st_trainer_exec_state(st_trainer *t) { return t->exec_state; }
int st_trainer_stages(const st_trainer *t) {
  return t->exec->stages ? t->exec->stages(t->exec_state) : 1;
}
float *st_trainer_params(st_trainer *t) { return t->params; }
const st_train_pos *st_trainer_pos(const st_trainer *t) { return &t->pos; }
int64_t st_trainer_train_samples(const st_trainer *t) { return t->n_train; }
uint32_t st_trainer_train_crc(const st_trainer *t) { return t->train_crc; }
int64_t st_trainer_total_steps(const st_trainer *t) { return t->total_steps; }
const st_config *st_trainer_config(const st_trainer *t) { return &t->cfg; }
const char *st_trainer_dir(const st_trainer *t) {
  return t->out_dir[0] ? t->out_dir : NULL;
}
int st_trainer_train_size(const st_trainer *t) { return t->n_train; }
int st_trainer_stream_stats(const st_trainer *t, st_stream_stats *out) {
  if (t->exec != &st_exec_weight_streaming) return -1;
  return st_ws_stats(t->exec_state, out);
}
int64_t st_trainer_steps_per_epoch(const st_trainer *t) {
  return t->steps_per_epoch;
}
int st_trainer_threads(const st_trainer *t) { return st_pool_threads(t->pool); }
int st_trainer_micro_batch(const st_trainer *t) { return t->micro_batch; }

int st_trainer_stats(const st_trainer *t, st_track_stats *out, int cap,
                     double *wall) {
  return t->exec->stats(t->exec_state, out, cap, wall);
}

double st_trainer_utilization(const st_trainer *t, double *bubble) {
  double wall = 0, busy = 0;
  int n = st_trainer_stats(t, NULL, 0, &wall);
  st_track_stats *all = malloc((size_t)n * sizeof *all);
  if (all) st_trainer_stats(t, all, n, &wall);
  for (int i = 0; all && i < n; i++) busy += all[i].busy_s;
  free(all);
  /* the batch's shares: the replicas, or over ranks data parallel one a
   * rank (execution.replicas 1 takes the ranks; n: this rank's tracks) */
  int R = t->exec == &st_exec_ranks &&
                  strcmp(t->cfg.execution.placement, "ranks") != 0
              ? st_dist_size()
              : t->cfg.execution.replicas,
      S = st_trainer_stages(t);
  /* stages that run at once: every track, except that block_sequential's
   * segments take turns on the same cores */
  int at_once = n < R * S ? n : R * S;
  int share = t->batch / R,
      mb = t->micro_batch < share ? t->micro_batch : share;
  double M = (double)share / mb;
  /* pipelined backprop never drains: no bubble in steady state; the fill-
   * and-drain schedules' bubble with ops of equal cost (block_sequential's
   * segments each run gpipe) */
  const char *sched = !strcmp(t->cfg.execution.mode, "pipeline")
                          ? t->cfg.execution.schedule
                          : "gpipe";
  int V = !strcmp(sched, "interleaved") ? t->cfg.execution.virtual_stages : 1;
  if (bubble)
    *bubble = !strcmp(t->cfg.execution.mode, "pipelined_backprop") ? 1
              : S <= 1                                             ? 1
                       : st_schedule_formula(sched, S, (int)M, V);
  return wall > 0 && at_once > 0 ? busy / (wall * at_once) : 0;
}

void st_trainer_set_prediction(st_trainer *t, double samples_per_s,
                               double utilization) {
  t->plan_rate = samples_per_s;
  t->plan_util = utilization;
}

double st_trainer_plan_rate(const st_trainer *t, double *utilization) {
  if (utilization) *utilization = t->plan_util;
  return t->plan_rate;
}

int st_trainer_trace(st_trainer *t, int events_per_track, st_error *err) {
  if (t->trace) return 0;
  double wall;
  int n = st_trainer_stats(t, NULL, 0, &wall);
  st_track_stats *names = malloc((size_t)n * sizeof *names);
  if (!names) return st_error_set(err, ST_ENOMEM, "out of memory");
  st_trainer_stats(t, names, n, &wall);
  int rc = st_trace_create(&t->trace, n, events_per_track, err);
  for (int i = 0; !rc && i < n; i++) st_trace_name(t->trace, i, names[i].name);
  free(names);
  return rc;
}

int st_trainer_write_trace(st_trainer *t, const char *path, st_error *err) {
  if (!t->trace)
    return st_error_set(err, ST_EARG, "%s: no trace was recorded", path);
  return st_trace_write(t->trace, path, err);
}

void st_trainer_note_result(st_trainer *t, double loss, double accuracy,
                            double samples_per_s) {
  t->evaluated = 1;
  t->eval_loss = loss;
  t->eval_acc = accuracy;
  t->samples_per_s = samples_per_s;
}

int st_trainer_last_eval(const st_trainer *t, double *loss, double *accuracy,
                         double *samples_per_s) {
  if (!t->evaluated) return -1;
  *loss = t->eval_loss;
  *accuracy = t->eval_acc;
  if (samples_per_s) *samples_per_s = t->samples_per_s;
  return 0;
}

const st_noise_scale *st_trainer_noise(const st_trainer *t) {
  return t->cfg.metrics.noise_scale ? &t->noise : NULL;
}
