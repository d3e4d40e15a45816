/*
 * test_gpt.c — the GPT model (model.kind gpt, src/model/model.c build_gpt)
 * against PyTorch and by its causal structure:
 *   1. gpt_tiny's shapes (context 64, 4 layers, 4 heads, width 128, byte
 *      vocabulary) built through the config API and the trainer, weights set
 *      by name from a formula both sides compute bit for bit; on the first
 *      batch of tests/fixtures/gpt_corpus.txt the logits, the loss and the
 *      gradient of every parameter tensor (the tied head's gradient summed
 *      into the token embedding's) match a minimal GPT-2 written in PyTorch
 *      (tests/ref/gen_gpt.py, fixture tests/fixtures/gpt_tiny.safetensors);
 *   2. then 50 AdamW steps of the trainer follow PyTorch's loss at every
 *      step;
 *   3. both for the learned-position, tied-head model (gpt_tiny) and for a
 *      rotary, untied variant (rotary_dim 16 of 32 head dims);
 *   4. causality of the whole model: changing the token at position t
 *      leaves the logits at every position before t bit-identical and
 *      changes some at t or later; changing one sequence of a batch leaves
 *      the others bit-identical.
 *
 * The relative measure, for logits and each gradient tensor: max |strata -
 * torch| / max |torch| over the tensor. Gradients are compared at the
 * fixture's sampled elements (all of a small tensor, every 61st of a
 * matrix: every row and column is hit) with the denominator taken over the
 * whole tensor, and by the whole tensor's max |g| and L2 norm. The losses:
 * |strata - torch| / torch at each step. The tolerance is the 1e-4
 * everywhere. The reference is PyTorch in float64 from the same float32
 * weights, and gen_gpt.py asserts that PyTorch's own float32 run stays within
 * 1e-5 of it and that rounding-sized nudges of the weights move the
 * trajectory by less than 2.5e-5, so what is measured here is strata's own
 * fp32 rounding. When written: logits, loss and gradients within 6e-7; the
 * losses within 1.5e-5 (learned, step 29) and 2.3e-6 (rotary, step 4) —
 * the two steps where the reference trajectory is most sensitive to
 * rounding. STRATA_TEST_VERBOSE=1 prints every tensor and step.
 *
 * What the first-batch check cannot see: at a GPT-2 initialisation the MLP's
 * pre-activations are ~0.2, where GELU's tanh and erf forms agree to ~1e-6,
 * so the erf form would pass it; the 50-step trajectory catches that (3e-3
 * off by step 29), as it catches every optimizer, data-order and tied-update
 * error.
 *
 * Runs from the repository root.
 */
#include "../../src/config/schema.h" /* internal: the keys' help */
#include "../../src/exec/exec.h"     /* internal: the stage worker */
#include "harness.h"
#include "strata.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#define REGENERATE "/usr/bin/python3 tests/ref/gen_gpt.py"
#include "ops/op_fixtures.h"

#define FIXTURE FIXTURE_DIR "gpt_tiny.safetensors"
#define CORPUS FIXTURE_DIR "gpt_corpus.txt"

/* The run gen_gpt.py describes; the fixture's dims must say the same. */
enum {
  B = 4,
  T = 64,
  LAYERS = 4,
  HEADS = 4,
  WIDTH = 128,
  VOCAB = 256,
  STEPS = 50,
  GRAD_STRIDE = 61,
  FULL_BELOW = 1024
};

/* The bound for logits, gradients and losses (file comment). */
#define TOL 1e-4

typedef struct variant {
  const char *name;
  int rotary_dim; /* 0: learned positions */
  int tied;
  int logit_rows; /* sequences of batch 0 whose logits the fixture holds */
} variant;

static const variant VARIANTS[] = {
    {"learned", 0, 1, 2},
    {"rotary", 16, 0, 1},
};

static int verbose(void) { return getenv("STRATA_TEST_VERBOSE") != NULL; }

/* ------------------------------------------------------ formula weights */

static uint64_t fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Element i of tensor `name`, as gen_gpt.py's formula_weights: integer
 * hashing, exact conversions, one multiply (and one add) in double, one
 * rounding to float. */
static float formula(const char *name, uint64_t key, size_t i) {
  double s = 2.0 * ((double)(splitmix64(key + i) >> 11) * 0x1p-53) - 1.0;
  size_t len = strlen(name);
  int weight = len > 7 && strcmp(name + len - 7, ".weight") == 0;
  if (strstr(name, ".ln_"))
    return weight ? (float)(1.0 + 0.1 * s) : (float)(0.05 * s);
  if (!weight) return (float)(0.01 * s);
  if (strstr(name, "wpe")) return (float)(0.0175 * s);
  if (strstr(name, "c_proj")) return (float)(0.0125 * s);
  return (float)(0.035 * s);
}

/* Sets the weights by name: every tensor the fixture lists under
 * "<variant>.init.", found with st_model_find, gets the formula; then the
 * tied head copies its source. The fixture's per-tensor sum, first and last
 * element must match (a formula drifted from the script's fails here, not
 * as a mysterious gradient mismatch), and every parameter of the model must
 * have been set. */
static void set_weights(const st_model *m, float *params,
                        const st_safetensors *st, const char *v) {
  char prefix[64];
  int plen = snprintf(prefix, sizeof prefix, "%s.init.", v), set_count = 0;
  for (int i = 0; i < st->n_tensors; i++) {
    if (strncmp(st->tensors[i].name, prefix, (size_t)plen) != 0) continue;
    const char *name = st->tensors[i].name + plen;
    const st_tensor_info *ti = NULL;
    int64_t off = st_model_find(m, name, &ti);
    CHECK(off >= 0 && ti->tie < 0, "%s: no parameter %s in the model", v, name);
    if (off < 0 || ti->tie >= 0) continue;
    float *w = params + off;
    uint64_t key = fnv1a64(name);
    double sum = 0;
    for (size_t e = 0; e < ti->numel; e++) {
      w[e] = formula(name, key, e);
      sum += w[e];
    }
    const float *want = fx(st, v, st->tensors[i].name + strlen(v) + 1, 3);
    /* numpy sums pairwise, we in order, and the fixture holds the sum
     * rounded to float: 1e-6 is far above both, far below a wrong scale */
    CHECK(fabs(sum - want[0]) <= 1e-6 * fmax(1.0, fabs(want[0])) &&
              w[0] == want[1] && w[ti->numel - 1] == want[2],
          "%s %s: formula weights differ from gen_gpt.py's (sum %.9g vs "
          "%.9g, first %.9g vs %.9g)",
          v, name, sum, want[0], w[0], want[1]);
    set_count++;
  }
  int untied = 0;
  for (int i = 0; i < m->n_blocks; i++)
    for (int k = 0; k < m->blocks[i].n_tensors; k++)
      untied += m->blocks[i].tensors[k].tie < 0;
  CHECK(set_count == untied, "%s: %d of the model's %d parameters set", v,
        set_count, untied);
  st_model_sync_ties(m, params);
}

/* ------------------------------------------------------------- set-up */

static int set(st_config *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int set(st_config *c, const char *fmt, ...) {
  char kv[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kv, sizeof kv, fmt, ap);
  va_end(ap);
  st_error err = {0};
  int rc = st_config_set(c, kv, &err);
  CHECK(rc == 0, "config %s: %s", kv, err.msg);
  return rc;
}

/* gpt_tiny's model section (configs/gpt_tiny.yaml) with the variant's
 * positions and head, the fixture's corpus and gen_gpt.py's optimizer. */
static void configure(st_config *c, const variant *v) {
  st_config_defaults(c);
  set(c, "model.kind=gpt");
  set(c, "model.context=%d", T);
  set(c, "model.layers=%d", LAYERS);
  set(c, "model.heads=%d", HEADS);
  set(c, "model.width=%d", WIDTH);
  set(c, "model.mlp_ratio=4");
  set(c, "model.activation=gelu_tanh");
  set(c, "model.dropout=0");
  set(c, "model.positions=%s", v->rotary_dim ? "rotary" : "learned");
  set(c, "model.rotary_dim=%d", v->rotary_dim);
  set(c, "model.tied=%s", v->tied ? "true" : "false");
  set(c, "data.dataset=text");
  set(c, "data.path=" CORPUS);
  set(c, "data.tokenizer=bytes");
  set(c, "data.val_fraction=0.1");
  set(c, "data.shuffle=false");
  set(c, "optimizer.kind=adamw");
  set(c, "optimizer.lr=0.001");
  set(c, "optimizer.beta1=0.9");
  set(c, "optimizer.beta2=0.95");
  set(c, "optimizer.eps=1e-8");
  set(c, "optimizer.weight_decay=0.1");
  set(c, "optimizer.schedule=constant");
  set(c, "optimizer.warmup_steps=0");
  set(c, "train.batch=%d", B);
  set(c, "train.steps=%d", STEPS);
  set(c, "train.threads=2");
  set(c, "metrics.progress=off");
}

static st_safetensors *open_gpt_fixture(void) {
  st_safetensors *st = NULL;
  st_error err = {0};
  int rc = st_safetensors_read(&st, FIXTURE, &err);
  CHECK(rc == 0, "%s (regenerate with %s)", err.msg, REGENERATE);
  if (rc) return NULL;
  const char *version = st_safetensors_meta(st, "strata_fixture");
  CHECK(version && strcmp(version, "1") == 0,
        "%s: fixture version %s, expected 1 (regenerate with %s)", FIXTURE,
        version ? version : "missing", REGENERATE);
  return st;
}

/* The fixture was made for this test's run. */
static int dims_match(const st_safetensors *st, const variant *v) {
  const int32_t *d = fx_i32(st, v->name, "dims", 11);
  const int want[11] = {B,     T,           LAYERS,        HEADS,
                        WIDTH, VOCAB,       v->rotary_dim, v->tied,
                        STEPS, GRAD_STRIDE, FULL_BELOW};
  int same = 1;
  for (int i = 0; i < 11; i++) same &= d[i] == want[i];
  CHECK(same, "%s: %s was made for another run (dims); regenerate with %s",
        v->name, FIXTURE, REGENERATE);
  return same;
}

/* The first n sequences of batch 0 as the trainer makes them: windows
 * 0 .. n-1 of T + 1 bytes. */
static void first_batch(float *x, int *y, int n_seq) {
  uint8_t *text = NULL;
  size_t n = 0;
  st_error err = {0};
  int rc = st_file_read(&text, &n, CORPUS, &err);
  CHECK(rc == 0 && n > (size_t)B * T, "%s: %s", CORPUS, err.msg);
  for (size_t i = 0; i < (size_t)n_seq * T; i++) {
    x[i] = rc ? 0.0f : (float)text[i];
    y[i] = rc ? 0 : text[i + 1];
  }
  st_free(text);
}

/* max |a - b| over n elements, over `den` (> 0). */
static double err_over(const float *a, const float *b, size_t n, double den) {
  return th_max_abs(a, b, n) / den;
}

/* ------------------------------------------- logits, loss and gradients */

typedef struct worst_seen {
  double err;
  char what[128];
} worst_seen;

static void note(worst_seen *w, double err, const char *what) {
  if (!(err <= w->err)) { /* NaN is the worst */
    w->err = err;
    snprintf(w->what, sizeof w->what, "%s", what);
  }
}

/* Gradient of one tensor (sampled elements, whole-tensor max and norm)
 * against the fixture. */
static void check_gradient(const st_safetensors *st, const variant *v,
                           const st_tensor_info *ti, const float *g,
                           worst_seen *wst) {
  char key[96], what[128];
  size_t n = ti->numel;
  size_t stride = n <= FULL_BELOW ? 1 : GRAD_STRIDE;
  size_t ns = (n + stride - 1) / stride;
  snprintf(key, sizeof key, "grad.%s", ti->name);
  const float *want = fx(st, v->name, key, ns);
  snprintf(key, sizeof key, "gstat.%s", ti->name);
  const float *stat = fx(st, v->name, key, 2); /* max |g|, L2 norm */
  float *got = new_floats(ns);
  double max_abs = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    max_abs = fmax(max_abs, fabs((double)g[i]));
    norm += (double)g[i] * g[i];
  }
  norm = sqrt(norm);
  for (size_t j = 0; j < ns; j++) got[j] = g[j * stride];
  double den = stat[0] > 0 ? stat[0] : 1.0;
  double e = err_over(got, want, ns, den);
  double e_max = fabs(max_abs - stat[0]) / den;
  double e_norm = fabs(norm - stat[1]) / (stat[1] > 0 ? stat[1] : 1.0);
  snprintf(what, sizeof what, "%s grad %s", v->name, ti->name);
  CHECK(e <= TOL && e_max <= TOL && e_norm <= TOL,
        "%s: elements %.3g, max %.3g, norm %.3g (relative; tol %.0e)", what, e,
        e_max, e_norm, TOL);
  note(wst, fmax(e, fmax(e_max, e_norm)), what);
  if (verbose())
    fprintf(stderr, "  %-56s %.2g %.2g %.2g (max|g| %.3g)\n", what, e, e_max,
            e_norm, stat[0]);
}

/* For the model m, with the head and loss apart (logits compared) or fused
 * (model.fused_loss: each row's loss and hit, no logits). */
static void check_forward_backward(const st_model *m, const float *params,
                                   const st_safetensors *st, const variant *v) {
  const char *head = m->fused_loss ? "fused head" : "head apart";
  st_error err = {0};
  st_stage *s = NULL;
  st_pool *pool = st_pool_create(2);
  int rc = st_stage_create(&s, m, 0, m->n_blocks, B, &err);
  CHECK(rc == 0 && pool, "%s: stage: %s", v->name, err.msg);
  if (rc || !pool) goto done;
  float *x = new_floats((size_t)B * T);
  int *y = keep(calloc((size_t)B * T, sizeof(int)));
  first_batch(x, y, B);
  size_t nl = (size_t)B * T * m->out_cols;
  float *probs = new_floats((size_t)B * T * VOCAB), *dlogits = new_floats(nl);
  float *losses = new_floats((size_t)B * T), *grads = new_floats(m->n_params);
  st_ctx ctx = {pool, 1, 42, 0, NULL, y};
  const float *out = st_stage_forward(s, &ctx, params, x, B);

  char what[96];
  worst_seen wst = {0, ""};
  size_t nref = (size_t)v->logit_rows * T * VOCAB;
  const float *want = fx(st, v->name, "logits", nref);
  double e;
  if (!m->fused_loss) {
    double den = 0;
    for (size_t i = 0; i < nref; i++) den = fmax(den, fabs((double)want[i]));
    e = err_over(out, want, nref, den);
    snprintf(what, sizeof what, "%s logits", v->name);
    CHECK(e <= TOL, "%s: max |diff| / max |logit| %.3g > %.0e", what, e, TOL);
    note(&wst, e, what);
  } else {
    /* the hit of each row the fixture has logits for: its argmax is the
     * label (torch's logits; no two of a row tie) */
    int differ = 0;
    for (size_t r = 0; r < (size_t)v->logit_rows * T; r++) {
      const float *z = want + r * VOCAB;
      int best = 0;
      for (int c = 1; c < VOCAB; c++) best = z[c] > z[best] ? c : best;
      differ += st_model_hit(m, out, y, r) != (best == y[r]);
    }
    CHECK(differ == 0, "%s %s: %d rows' hits differ from torch's argmax",
          v->name, head, differ);
  }

  st_model_loss(m, pool, losses, probs, out, y, B * T);
  double loss = 0;
  for (int i = 0; i < B * T; i++) loss += losses[i];
  loss /= B * T;
  const float *want_loss = fx(st, v->name, "loss", 1);
  e = fabs(loss - want_loss[0]) / want_loss[0];
  snprintf(what, sizeof what, "%s loss", v->name);
  CHECK(e <= TOL, "%s %s: %.7f vs torch %.7f", what, head, loss, want_loss[0]);
  note(&wst, e, what);

  /* the trainer's loss gradient (sequential.c): mean over B * T labels */
  st_model_loss_grad(m, pool, dlogits, probs, y, B * T, 1.0f / (float)(B * T));
  st_stage_backward(s, &ctx, params, grads, x, dlogits, NULL, B);
  /* A tied copy's gradient belongs to its source, as gather_tied sums it. */
  for (int i = 0; i < m->n_blocks; i++)
    for (int k = 0; k < m->blocks[i].n_tensors; k++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[k];
      if (ti->tie < 0) continue;
      const float *copy = grads + m->blocks[i].param_off + ti->offset;
      for (size_t j = 0; j < ti->numel; j++) grads[ti->tie + j] += copy[j];
    }
  int checked = 0;
  for (int i = 0; i < m->n_blocks; i++)
    for (int k = 0; k < m->blocks[i].n_tensors; k++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[k];
      if (ti->tie >= 0) continue;
      check_gradient(st, v, ti, grads + m->blocks[i].param_off + ti->offset,
                     &wst);
      checked++;
    }
  /* every gradient the fixture holds belongs to a tensor of the model */
  char prefix[64];
  int in_fixture = 0;
  int plen = snprintf(prefix, sizeof prefix, "%s.grad.", v->name);
  for (int i = 0; i < st->n_tensors; i++)
    in_fixture += strncmp(st->tensors[i].name, prefix, (size_t)plen) == 0;
  int expect =
      1 + (v->rotary_dim ? 0 : 1) + 12 * LAYERS + 2 + (v->tied ? 0 : 1);
  CHECK(checked == in_fixture && checked == expect,
        "%s: %d gradients checked, %d in the fixture, %d parameters expected",
        v->name, checked, in_fixture, expect);
  fprintf(stderr,
          "  %s, %s: %s, loss, %d gradients: worst %.2g (%s), tol %.0e\n",
          v->name, head, m->fused_loss ? "hits" : "logits", checked, wst.err,
          wst.what, TOL);
done:
  st_stage_destroy(s);
  st_pool_destroy(pool);
}

/* --------------------------------------------------------- trajectory */

static void check_training(st_trainer *t, const st_safetensors *st,
                           const variant *v) {
  const float *want = fx(st, v->name, "losses", STEPS);
  float got[STEPS];
  st_error err = {0};
  int rc = 0;
  for (int s = 0; s < STEPS && !rc; s++) {
    double loss = 0;
    rc = st_trainer_step(t, &loss, &err);
    got[s] = (float)loss;
  }
  CHECK(rc == 0, "%s: step failed: %s", v->name, err.msg);
  if (rc) return;
  double worst = 0;
  int at = 0;
  for (int s = 0; s < STEPS; s++) {
    double e = fabs((double)got[s] - want[s]) / want[s];
    if (!(e <= worst)) worst = e, at = s;
  }
  CHECK(worst <= TOL, "%s: loss at step %d: %.7f vs torch %.7f (%.3g > %.0e)",
        v->name, at, got[at], want[at], worst, TOL);
  fprintf(stderr,
          "  %s: %d AdamW steps, loss %.4f -> %.4f, worst %.2g at "
          "step %d, tol %.0e\n",
          v->name, STEPS, got[0], got[STEPS - 1], worst, at, TOL);
  if (verbose())
    for (int s = 0; s < STEPS; s++)
      fprintf(stderr, "%d:%.1e%s", s, fabs(got[s] - want[s]) / want[s],
              s % 10 == 9 ? "\n" : " ");
}

/* ----------------------------------------------------------- causality */

/* Changing token t of a sequence leaves every logit before t bit-identical
 * (attention never looks ahead; everything else is per position) and
 * changes some logit at t or later (the perturbation is seen). With two
 * sequences, the other one must not change at all. */
static void check_causality(const st_model *m, const float *params,
                            const variant *v) {
  st_error err = {0};
  st_stage *s = NULL;
  st_pool *pool = st_pool_create(2);
  int rc = st_stage_create(&s, m, 0, m->n_blocks, 2, &err);
  CHECK(rc == 0 && pool, "%s: stage: %s", v->name, err.msg);
  if (rc || !pool) goto done;
  float *x = new_floats(2 * T);
  int *y = keep(calloc(2 * T, sizeof(int)));
  st_ctx ctx = {pool, 0, 42, 0, NULL, y};
  /* logits, or a fused head's loss and hit, of each position */
  size_t row = (size_t)m->out_cols, seq = (size_t)T * row;
  float *base = new_floats(2 * seq);
  first_batch(x, y, 2);
  memcpy(base, st_stage_forward(s, &ctx, params, x, 2),
         2 * seq * sizeof(float));
  const int positions[] = {1, 31, 32, 50, 63};
  for (int p = 0; p < 5; p++) {
    for (int which = 0; which < 2; which++) {
      int at = positions[p];
      size_t off = (size_t)which * T; /* sequence `which` */
      float saved = x[off + at];
      x[off + at] = (float)(((int)saved + 101) % VOCAB);
      const float *l = st_stage_forward(s, &ctx, params, x, 2);
      const float *was = base + which * seq, *now = l + which * seq;
      int before = memcmp(now, was, (size_t)at * row * sizeof(float)) == 0;
      int after = memcmp(now + at * row, was + at * row,
                         (T - at) * row * sizeof(float)) != 0;
      const float *other_was = base + (1 - which) * seq;
      const float *other_now = l + (1 - which) * seq;
      int other = memcmp(other_now, other_was, seq * sizeof(float)) == 0;
      CHECK(before && after && other,
            "%s: token %d of sequence %d changed: earlier logits %s, later "
            "%s, other sequence %s",
            v->name, at, which, before ? "same" : "CHANGED",
            after ? "changed" : "UNCHANGED", other ? "same" : "CHANGED");
      x[off + at] = saved;
    }
  }
done:
  st_stage_destroy(s);
  st_pool_destroy(pool);
}

/* -------------------------------------------------------------- main */

static void run_variant(const st_safetensors *st, const variant *v) {
  if (!dims_match(st, v)) return;
  st_config cfg;
  configure(&cfg, v);
  st_trainer *t = NULL;
  st_error err = {0};
  int rc = st_trainer_create(&t, &cfg, NULL, &err);
  CHECK(rc == 0, "%s: trainer: %s", v->name, err.msg);
  if (rc) return;
  const st_model *m = st_trainer_model(t);
  CHECK(m->n_ties == (v->tied ? 1 : 0) && m->classes == VOCAB &&
            (st_model_find(m, "transformer.wpe.weight", NULL) >= 0) ==
                !v->rotary_dim,
        "%s: the model is not the variant (ties %d, vocab %d)", v->name,
        m->n_ties, m->classes);
  set_weights(m, st_trainer_params(t), st, v->name);
  /* the same tensors with the head and its loss apart: the logits */
  st_config apart = cfg;
  apart.model.fused_loss = 0;
  apart.model.vocab = m->classes; /* the tokenizer's, as the trainer took */
  st_model *mu = NULL;
  rc = st_model_create(&mu, &apart, m->in, &err);
  CHECK(rc == 0 && m->fused_loss && !mu->fused_loss &&
            mu->n_params == m->n_params,
        "%s: the model with its head apart: %s", v->name, err.msg);
  if (!rc) {
    check_causality(mu, st_trainer_params(t), v);
    check_forward_backward(mu, st_trainer_params(t), st, v);
  }
  st_model_destroy(mu);
  check_causality(m, st_trainer_params(t), v);
  check_forward_backward(m, st_trainer_params(t), st, v);
  check_training(t, st, v); /* last: it changes the weights */
  st_trainer_destroy(t);
  release_all();
}

/* The evaluation batch keeps each of its buffers within 64 MiB (16M
 * floats): a fused head's logits are 2 floats a position, but its
 * vocabulary chunk and the chunks it keeps are scratch (7 MB a sample
 * here), which must bound the batch as the logits did (a small GPT over
 * GPT-2's vocabulary). */
static void check_eval_budget(void) {
  st_config c;
  st_config_defaults(&c);
  const char *sets[] = {
      "model.kind=gpt", "model.context=32",  "model.layers=2", "model.width=64",
      "model.heads=2",  "model.vocab=50257", "model.dropout=0"};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    set(&c, "%s", sets[i]);
  for (int fused = 0; fused < 2; fused++) {
    c.model.fused_loss = fused;
    st_model *m = NULL;
    st_error err = {0};
    if (st_model_create(&m, &c, (st_shape){1, 32, 1}, &err)) {
      CHECK(0, "eval budget: %s", err.msg);
      return;
    }
    size_t B = (size_t)st_eval_batch(m, 1), logits = 32 * (size_t)m->out_cols;
    CHECK(B >= 1 && B * m->max_scratch_per_sample <= (size_t)16 << 20 &&
              B * logits <= (size_t)16 << 20,
          "eval batch %zu (%s head): scratch %zu, logits %zu floats", B,
          fused ? "fused" : "apart", B * m->max_scratch_per_sample, B * logits);
    st_model_destroy(m);
  }
}

/* The fused head keeps its last chunks of logits for the backward only in
 * a mode whose backward finds them (model.c, head_keeps): not gpipe's or
 * block_sequential's with more than one micro-batch (every forward runs
 * before the first backward), whose head then has only its chunk as
 * scratch, and the plan's FLOPs the whole product again; zb1p's weight
 * half makes every chunk once more. The micro-batches are a replica's:
 * over 2 ranks (a plan's launch.ranks) each rank runs half the batch, one
 * micro-batch of 4, unless the ranks are a pipeline's stages; the noise
 * scale without micro-batches measures two halves. */
static void check_head_keeps(void) {
  enum { T = 32, V = 50257 };
  const char *base[] = {
      "model.kind=gpt", "model.context=32",  "model.layers=1", "model.width=64",
      "model.heads=2",  "model.vocab=50257", "train.batch=8"};
  /* mode, schedule, micro-batch, another setting; kept (1:
   * st_linear_xent_keep), split */
  const struct {
    const char *mode, *schedule;
    int micro;
    const char *also;
    int kept, split;
  } cases[] = {{"sequential", "1f1b", 2, NULL, 1, 0},
               {"pipeline", "gpipe", 2, NULL, 0, 0},
               {"pipeline", "gpipe", 8, NULL, 1, 0},
               {"block_sequential", "1f1b", 4, NULL, 0, 0},
               {"pipeline", "1f1b", 2, NULL, 1, 0},
               {"pipeline", "zb1p", 2, NULL, 1, 1},
               {"pipelined_backprop", "1f1b", 1, NULL, 1, 0},
               {"pipeline", "gpipe", 4, "ranks", 1, 0},
               {"pipeline", "gpipe", 2, "ranks", 0, 0},
               {"pipeline", "gpipe", 0, "metrics.noise_scale=true", 0, 0}};
  int keep = st_linear_xent_keep(T, V), chunk = st_linear_xent_chunk(T, V);
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    st_config c;
    st_config_defaults(&c);
    for (size_t i = 0; i < sizeof base / sizeof *base; i++)
      set(&c, "%s", base[i]);
    set(&c, "execution.mode=%s", cases[k].mode);
    set(&c, "execution.schedule=%s", cases[k].schedule);
    set(&c, "execution.micro_batch=%d", cases[k].micro);
    if (cases[k].also && !strcmp(cases[k].also, "ranks"))
      c.launch.ranks = 2; /* not a key: the plan's, from --ranks */
    else if (cases[k].also)
      set(&c, "%s", cases[k].also);
    st_model *m = NULL;
    st_error err = {0};
    if (st_model_create(&m, &c, (st_shape){1, T, 1}, &err)) {
      CHECK(0, "head keeps: %s", err.msg);
      continue;
    }
    const st_block *h = &m->blocks[m->n_blocks - 1];
    const st_layer *L = &h->layers[h->n_layers - 1];
    int want = cases[k].kept ? keep : 0;
    double D = 64,
           again = want ? (double)((V + chunk - 1) / chunk - want) * chunk / V
                        : 1.0;
    again += cases[k].split;
    /* the head's backward a position: its two products, the forward's
     * again, and the softmax's 4 a word; ln_f's beside it */
    st_cost f = st_linear_xent_cost(T, (int)D, V, want, cases[k].split);
    CHECK(L->kind == ST_OP_LINEAR_XENT && L->keep == want &&
              L->split == cases[k].split &&
              h->scratch_floats_per_sample >=
                  st_linear_xent_scratch_floats(T, V, want) &&
              (want > 0 || h->scratch_floats_per_sample <
                               st_linear_xent_scratch_floats(T, V, keep)) &&
              fabs(f.flops_bwd - (4 * D * V + again * 2 * D * V + 4.0 * V)) <=
                  1e-9 * f.flops_bwd,
          "%s %s, micro-batch %d: the head keeps %d of %d chunks (want %d), "
          "split %d, scratch %zu floats a sample, backward %g FLOPs a "
          "position",
          cases[k].mode, cases[k].schedule, cases[k].micro, L->keep, keep, want,
          L->split, h->scratch_floats_per_sample, f.flops_bwd);
    st_model_destroy(m);
  }
  /* the help of model.fused_loss (docs/config.md) gives the kept logits'
   * bound a sample: GPT-2's 16 chunks of 1024 words at context 1024 (it
   * said 4M, the bound before 2026-11-30's 16M) */
  char *help = NULL, want[48];
  size_t len = 0;
  FILE *f = open_memstream(&help, &len);
  if (f) {
    st_config_schema_markdown(f);
    fclose(f);
  }
  int bound = (int)(((size_t)st_linear_xent_keep(1024, V) *
                     (size_t)st_linear_xent_chunk(1024, V) * 1024) >>
                    20);
  snprintf(want, sizeof want, "at most %dM logits a sample", bound);
  const char *row = help ? strstr(help, "| `model.fused_loss` |") : NULL;
  const char *eol = row ? strchr(row, '\n') : NULL;
  const char *at = row ? strstr(row, want) : NULL;
  CHECK(bound == 16 && at && at < eol,
        "model.fused_loss's help does not say '%s'", want);
  free(help);
}

int main(void) {
  st_blas_init();
  check_eval_budget();
  check_head_keeps();
  st_safetensors *st = open_gpt_fixture();
  if (st)
    for (size_t i = 0; i < sizeof VARIANTS / sizeof VARIANTS[0]; i++)
      run_variant(st, &VARIANTS[i]);
  st_safetensors_destroy(st);
  TH_DONE();
}
