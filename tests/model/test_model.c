/*
 * test_model.c — whole models built by src/model/model.c and run by the
 * stage worker (src/exec/stage.c), checked against independent oracles:
 *   1. central finite differences of the batch-mean cross-entropy, for about
 *      twenty parameter elements (every tensor of every block at least once)
 *      and ten input elements, on four small models that together use every
 *      layer kind the builders emit (flatten, linear, relu, gelu, layernorm,
 *      conv, groupnorm, residual, max and avg pooling);
 *   2. finite differences of one residual block alone, with a proof that its
 *      input gradient needs the skip path (dropping it breaks the match);
 *   3. closed-form facts: the default FC-MNIST parameter count, tensor names
 *      and shapes, block counts from the builder's rules, a linear layer's
 *      FLOPs, an impossible CNN refused with the key that caused it;
 *   4. initialisation: deterministic per seed, within PyTorch's bounds,
 *      norms at weight 1 and bias 0.
 * The ops themselves are tested against PyTorch in tests/ops/test_ops.c;
 * here the question is whether the model wires them together correctly:
 * shapes, offsets into the slab, the activation layout, the order of the
 * backward pass and the skip connection.
 *
 * Set STRATA_TEST_VERBOSE=1 to print every finite-difference comparison.
 */
#include "../../src/exec/exec.h" /* internal: the stage worker under test */
#include "harness.h"
#include "strata.h"

#include <stdint.h>
#include <string.h>

static int verbose(void) { return getenv("STRATA_TEST_VERBOSE") != NULL; }

static float *floats(size_t n) {
  float *p = st_alloc((n ? n : 1) * sizeof(float));
  if (!p) {
    fprintf(stderr, "test_model: out of memory\n");
    exit(2);
  }
  return p;
}

static void fill_normal(float *v, size_t n, uint64_t seed) {
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, 0);
  for (size_t i = 0; i < n; i++) v[i] = st_rng_normal(&rng);
}

/* ------------------------------------------------------ kink detection */

/* Relu and max pooling are not differentiable everywhere: when a +-eps step
 * moves a relu input across 0 or changes a pooling window's argmax, the
 * central difference measures a mix of two slopes, not the derivative. A
 * finite difference is only trusted when both perturbed forwards reproduce
 * the unperturbed forward's relu on/off pattern and argmax indices exactly;
 * this hash over a block's activation buffer summarises that pattern. */
static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}

static uint64_t block_pattern(const st_block *b, const float *acts, int B,
                              uint64_t h) {
  for (int l = 0; l < b->n_layers; l++) {
    const st_layer *L = &b->layers[l];
    size_t n = (size_t)B * st_shape_numel(L->out);
    if (L->kind == ST_OP_RELU) {
      const float *y = acts + L->out_off * (size_t)B;
      for (size_t i = 0; i < n; i++) h = mix(h, y[i] > 0.0f);
    } else if (L->kind == ST_OP_MAXPOOL) {
      const int32_t *idx = (const int32_t *)(acts + L->save_off * (size_t)B);
      for (size_t i = 0; i < n; i++) h = mix(h, (uint32_t)idx[i]);
    }
  }
  return h;
}

/* Finite differences are trusted only this close:
 *   |fd - analytic| <= FD_REL * |analytic| + dl / (2 eps)
 * where dl bounds the float32 rounding error of L(+eps) - L(-eps).
 * - dl, whole model: each per-sample loss (about ln 3 ~ 1.1) is rounded to
 *   within an ulp or so (2^-23 relative); measured over every parameter of
 *   the four models at eps 1e-4, where truncation is nil, the worst error of
 *   L(+eps) - L(-eps) was 1.2e-7 ~ 1 ulp of the loss. MODEL_ULPS = 3 ulps of
 *   the unperturbed loss gives dl ~ 4e-7: an absolute term of 2e-5 at eps
 *   1e-2 and 2e-3 at 1e-4.
 * - dl, one block: L = sum(out * dout) moves by about 2^-23 sum|out * dout|
 *   at worst, since a perturbed input re-rounds every output behind a norm;
 *   measured 0.2 of that, BLOCK_ULPS = 1 of it is used.
 * - FD_REL, 2e-2, covers the truncation error eps^2 f''' / 6 of the smooth
 *   ops (gelu, norms, softmax) at eps <= 1e-2; measured at most 2e-3.
 * A wrong gradient (a missing term, a wrong offset, a transposed weight) is
 * off by O(1) relative. */
#define FD_REL 2e-2
#define ULP 0x1p-23
#define MODEL_ULPS 3.0
#define BLOCK_ULPS 1.0

static double fd_tol(double an, double eps, double dl) {
  return FD_REL * fabs(an) + dl / (2 * eps);
}

static int fd_agrees(double fd, double an, double eps, double dl) {
  return fabs(fd - an) <= fd_tol(an, eps, dl);
}

/* Step sizes tried in order: the largest one whose perturbed forwards keep
 * the kink pattern wins. A relu input within eps of 0 (models (c) and (d)
 * have about 2500 relus and pooling windows, so a few always are) needs a
 * smaller step; when no step is clean, another element of the same tensor is
 * drawn (up to MAX_TRIES). Choosing elements by where the kinks lie does not
 * look at the gradient code, so it cannot hide a wrong gradient. */
static const float eps_steps[] = {1e-2f, 3e-3f, 1e-3f, 3e-4f, 1e-4f};
#define N_EPS (int)(sizeof eps_steps / sizeof eps_steps[0])
#define MAX_TRIES 12

/* ------------------------------------------------------ whole model */

typedef struct fixture {
  const char *what;
  st_model *m;
  st_stage *stage;
  st_ctx ctx;
  int B;
  float *params, *grads; /* n_params */
  float *x, *din;        /* B * numel(in) */
  int *y;                /* B */
  float *losses, *probs, *dlogits;
  uint64_t pattern; /* kink pattern of the unperturbed forward */
  double dl;        /* rounding bound of L(+eps) - L(-eps), see FD_REL */
} fixture;

static uint64_t model_pattern(const fixture *fx) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < fx->stage->count; i++)
    h = block_pattern(&fx->m->blocks[fx->stage->first + i], fx->stage->acts[i],
                      fx->B, h);
  return h;
}

/* Mean cross-entropy of the batch, the per-sample float losses summed in
 * double; leaves the stage's activations for a backward pass. */
static double model_loss(fixture *fx) {
  const float *logits =
      st_stage_forward(fx->stage, &fx->ctx, fx->params, fx->x, fx->B);
  st_xent_forward(fx->losses, fx->probs, logits, fx->y, fx->B, fx->m->classes);
  double sum = 0;
  for (int i = 0; i < fx->B; i++) sum += fx->losses[i];
  return sum / fx->B;
}

/* gain multiplies every weight matrix and conv kernel after the PyTorch
 * init: its bound 1/sqrt(fan_in) halves the signal's variance at every relu,
 * so through the six convs of model (d) the gradients would shrink to the
 * noise floor; a gain of 2 (about He scaling) keeps them well above it. */
static int fixture_create(fixture *fx, const char *what, const st_config *c,
                          st_shape in, uint64_t seed, float gain) {
  memset(fx, 0, sizeof *fx);
  fx->what = what;
  fx->B = 3;
  st_error err = {0};
  int rc = st_model_create(&fx->m, c, in, &err);
  CHECK(rc == 0, "%s: st_model_create: %s", what, err.msg);
  if (rc) return rc;
  rc = st_stage_create(&fx->stage, fx->m, 0, fx->m->n_blocks, fx->B, &err);
  CHECK(rc == 0, "%s: st_stage_create: %s", what, err.msg);
  if (rc) return rc;
  /* training 0: dropout off; on (c->model.dropout > 0), the masks are a
   * function of the seed and the sample (dropout.c), so the loss is still a
   * deterministic function of the parameters */
  fx->ctx = (st_ctx){NULL, c->model.dropout > 0, seed, 0, NULL, NULL};
  size_t nx = (size_t)fx->B * st_shape_numel(in);
  fx->params = floats(fx->m->n_params);
  fx->grads = floats(fx->m->n_params);
  fx->x = floats(nx);
  fx->din = floats(nx);
  fx->y = st_alloc((size_t)fx->B * sizeof *fx->y);
  fx->losses = floats((size_t)fx->B);
  fx->probs = floats((size_t)fx->B * fx->m->classes);
  fx->dlogits = floats((size_t)fx->B * fx->m->classes);
  st_model_init(fx->m, fx->params, seed);
  for (int i = 0; i < fx->m->n_blocks; i++) {
    const st_block *b = &fx->m->blocks[i];
    for (int t = 0; t < b->n_tensors; t++)
      if (b->tensors[t].ndim >= 2)
        for (size_t k = 0; k < b->tensors[t].numel; k++)
          fx->params[b->param_off + b->tensors[t].offset + k] *= gain;
  }
  fill_normal(fx->x, nx, seed + 100);
  for (int i = 0; i < fx->B; i++) fx->y[i] = (i * 2 + 1) % fx->m->classes;
  return 0;
}

static void fixture_destroy(fixture *fx) {
  st_stage_destroy(fx->stage);
  st_model_destroy(fx->m);
  st_free(fx->params);
  st_free(fx->grads);
  st_free(fx->x);
  st_free(fx->din);
  st_free(fx->y);
  st_free(fx->losses);
  st_free(fx->probs);
  st_free(fx->dlogits);
}

/* Analytic gradients of the mean loss for every parameter and input. */
static void model_gradients(fixture *fx) {
  memset(fx->grads, 0, fx->m->n_params * sizeof(float));
  fx->dl = MODEL_ULPS * ULP * model_loss(fx);
  fx->pattern = model_pattern(fx);
  st_xent_backward(fx->dlogits, fx->probs, fx->y, fx->B, fx->m->classes,
                   1.0f / (float)fx->B);
  st_stage_backward(fx->stage, &fx->ctx, fx->params, fx->grads, fx->x,
                    fx->dlogits, fx->din, fx->B);
}

/* Central difference of the mean loss in *v; returns 0 (and leaves *fd
 * alone) when every step size crosses a kink. */
static int model_fd(fixture *fx, float *v, double *fd, double *eps_used) {
  float saved = *v;
  for (int e = 0; e < N_EPS; e++) {
    float hi = saved + eps_steps[e], lo = saved - eps_steps[e];
    *v = hi;
    double lp = model_loss(fx);
    uint64_t pp = model_pattern(fx);
    *v = lo;
    double lm = model_loss(fx);
    uint64_t pm = model_pattern(fx);
    *v = saved;
    if (pp == fx->pattern && pm == fx->pattern) {
      *fd = (lp - lm) / ((double)hi - (double)lo);
      *eps_used = eps_steps[e];
      return 1;
    }
  }
  return 0;
}

/* Where a parameter element sits, for messages. */
static const char *tensor_of(const st_model *m, size_t g, size_t *within) {
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    for (int t = 0; t < b->n_tensors; t++) {
      size_t off = b->param_off + b->tensors[t].offset;
      if (g >= off && g < off + b->tensors[t].numel) {
        *within = g - off;
        return b->tensors[t].name;
      }
    }
  }
  *within = 0;
  return "?";
}

typedef struct fd_tally {
  int checked, skipped, strong; /* strong: |grad| well above the noise */
} fd_tally;

/* One draw of an element to check: a pointer into params or x, and the
 * analytic gradient there. */
typedef struct element {
  float *v;
  float analytic;
  const char *label;
  size_t index;
} element;

/* Checks the first of `n` candidate elements that is clear of kinks;
 * counts a skip when none is. */
static void check_first_smooth(fixture *fx, const element *cand, int n,
                               fd_tally *t) {
  for (int k = 0; k < n; k++) {
    const element *c = &cand[k];
    double fd, eps;
    if (!model_fd(fx, c->v, &fd, &eps)) continue;
    t->checked++;
    double tol_abs = fd_tol(0, eps, fx->dl);
    t->strong += fabs(c->analytic) > 5 * tol_abs;
    CHECK(fd_agrees(fd, c->analytic, eps, fx->dl),
          "%s: d loss / d %s[%zu]: analytic %.6g, finite difference %.6g "
          "(eps %g; tol %.2g rel + %.2g abs)",
          fx->what, c->label, c->index, (double)c->analytic, fd, eps, FD_REL,
          tol_abs);
    if (verbose())
      fprintf(stderr, "  %s: %-24s[%4zu] analytic %+.6e fd %+.6e eps %g%s\n",
              fx->what, c->label, c->index, (double)c->analytic, fd, eps,
              k ? " (redrawn)" : "");
    return;
  }
  t->skipped++;
  CHECK(0, "%s: %s: %d draws all cross a relu or max-pool kink", fx->what,
        cand[0].label, n);
}

/* Gradient check of one model: one element of every tensor, random slab
 * elements up to 20, then 10 input elements. */
static void check_model_gradients(const char *what, const st_config *c,
                                  st_shape in, uint64_t seed, float gain) {
  fixture fx;
  if (fixture_create(&fx, what, c, in, seed, gain)) {
    fixture_destroy(&fx);
    return;
  }
  const st_model *m = fx.m;
  model_gradients(&fx);
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, 7);
  fd_tally t = {0};
  element cand[MAX_TRIES];

  /* Every tensor of every block; and no tensor's gradient may be all zero
   * (a block whose backward never ran, or wrote to the wrong offset). */
  int n_picked = 0;
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    for (int k = 0; k < b->n_tensors; k++) {
      const st_tensor_info *ti = &b->tensors[k];
      size_t off = b->param_off + ti->offset;
      float biggest = 0;
      for (size_t e = 0; e < ti->numel; e++)
        biggest = fmaxf(biggest, fabsf(fx.grads[off + e]));
      CHECK(biggest > 0, "%s: gradient of %s is all zero", what, ti->name);
      for (int r = 0; r < MAX_TRIES; r++) {
        size_t e = st_rng_below(&rng, (uint32_t)ti->numel);
        cand[r] =
            (element){&fx.params[off + e], fx.grads[off + e], ti->name, e};
      }
      check_first_smooth(&fx, cand, MAX_TRIES, &t);
      n_picked++;
    }
  }
  for (; n_picked < 20; n_picked++) {
    for (int r = 0; r < MAX_TRIES; r++) {
      size_t g = st_rng_below(&rng, (uint32_t)m->n_params), e;
      const char *name = tensor_of(m, g, &e);
      cand[r] = (element){&fx.params[g], fx.grads[g], name, e};
    }
    check_first_smooth(&fx, cand, MAX_TRIES, &t);
  }
  /* The input gradient crosses every block's backward. */
  size_t nx = (size_t)fx.B * st_shape_numel(in);
  for (int k = 0; k < 10; k++) {
    for (int r = 0; r < MAX_TRIES; r++) {
      size_t e = st_rng_below(&rng, (uint32_t)nx);
      cand[r] = (element){&fx.x[e], fx.din[e], "input", e};
    }
    check_first_smooth(&fx, cand, MAX_TRIES, &t);
  }
  /* Every perturbed value was restored exactly, so a second backward gives
   * the same gradients bit for bit: guards the checker itself, and shows
   * the backward leaves no state behind that changes the next one. */
  float *again = floats(m->n_params);
  memcpy(again, fx.grads, m->n_params * sizeof(float));
  model_gradients(&fx);
  CHECK(memcmp(again, fx.grads, m->n_params * sizeof(float)) == 0,
        "%s: gradients changed after the finite differences", what);
  st_free(again);

  /* Two thirds of the checked gradients must sit well above the noise term, so
   * the comparisons are not passing on the absolute tolerance alone. */
  CHECK(t.checked >= 30 && 3 * t.strong >= 2 * t.checked,
        "%s: only %d of %d checked gradients are above 5x the noise floor",
        what, t.strong, t.checked);
  if (verbose())
    fprintf(stderr, "  %s: %d checked, %d skipped, %d above the noise\n", what,
            t.checked, t.skipped, t.strong);
  fixture_destroy(&fx);
}

/* ------------------------------------------------------ residual block */

typedef struct block_run {
  const st_block *b;
  const float *params;
  st_ctx ctx;
  int B;
  float *in, *dout, *acts, *scratch;
  double magnitude; /* sum |out * dout| of the last forward */
} block_run;

/* L = sum(out * dout), summed in double. */
static double block_objective(block_run *r) {
  st_block_forward(r->b, &r->ctx, r->params, r->in, r->acts, r->scratch, r->B);
  const float *out = st_block_output(r->b, r->acts, r->B);
  size_t n = (size_t)r->B * st_shape_numel(r->b->out);
  double sum = 0, mag = 0;
  for (size_t i = 0; i < n; i++) {
    sum += (double)out[i] * (double)r->dout[i];
    mag += fabs((double)out[i] * (double)r->dout[i]);
  }
  r->magnitude = mag;
  return sum;
}

/* The residual block of a model, alone: its input gradient against finite
 * differences of sum(out * dout), and the skip path's share of it. */
static void check_residual_block(const char *what, const st_config *c,
                                 st_shape in, uint64_t seed) {
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, c, in, &err);
  CHECK(rc == 0, "%s: st_model_create: %s", what, err.msg);
  if (rc) return;
  int k = -1;
  for (int i = 0; i < m->n_blocks && k < 0; i++)
    if (m->blocks[i].has_residual) k = i;
  CHECK(k >= 0, "%s: no block has has_residual set", what);
  if (k < 0) {
    st_model_destroy(m);
    return;
  }
  const st_block *b = &m->blocks[k];
  int res_layer = -1;
  for (int l = 0; l < b->n_layers; l++)
    if (b->layers[l].kind == ST_OP_RESIDUAL) res_layer = l;
  CHECK(res_layer > 0, "%s: %s has has_residual but no residual layer", what,
        b->name);
  CHECK(res_layer > 0 && b->layers[res_layer].out.c == b->in.c &&
            b->layers[res_layer].out.h == b->in.h &&
            b->layers[res_layer].out.w == b->in.w,
        "%s: %s: the residual add's shape differs from the block input", what,
        b->name);

  float *all = floats(m->n_params);
  st_model_init(m, all, seed);
  block_run r = {.b = b, .params = all + b->param_off, .B = 2};
  r.ctx = (st_ctx){NULL, 0, seed, 0, NULL, NULL};
  size_t nin = (size_t)r.B * st_shape_numel(b->in);
  size_t nout = (size_t)r.B * st_shape_numel(b->out);
  r.in = floats(nin);
  r.dout = floats(nout);
  r.acts = floats((size_t)r.B * b->act_per_sample);
  r.scratch = floats((size_t)r.B * b->scratch_floats_per_sample);
  float *work = floats(3 * (size_t)r.B * b->max_numel);
  float *grads = floats(b->n_params);
  float *din = floats(nin), *din_noskip = floats(nin);
  fill_normal(r.in, nin, seed + 1);
  fill_normal(r.dout, nout, seed + 2);

  block_objective(&r);
  double dl = BLOCK_ULPS * ULP * r.magnitude;
  uint64_t pattern = block_pattern(b, r.acts, r.B, 1);
  st_block_backward(b, &r.ctx, r.params, grads, r.in, r.acts, r.dout, din, work,
                    r.scratch, r.B);
  /* The same block told it has no skip: the backward then stops adding the
   * skip gradient, so din - din_noskip is exactly the skip path's share. */
  st_block noskip = *b;
  noskip.has_residual = 0;
  st_block_backward(&noskip, &r.ctx, r.params, grads, r.in, r.acts, r.dout,
                    din_noskip, work, r.scratch, r.B);
  double n_all = 0, n_skip = 0;
  for (size_t i = 0; i < nin; i++) {
    n_all += (double)din[i] * din[i];
    n_skip +=
        ((double)din[i] - din_noskip[i]) * ((double)din[i] - din_noskip[i]);
  }
  /* The skip path carries dout straight through (behind the final relu and
   * the pooling), so it is a sizeable part of din, not a rounding residue. */
  CHECK(n_skip >= 0.01 * n_all && n_skip > 0,
        "%s: %s: skip path is %.3g of |din|^2 = %.3g", what, b->name, n_skip,
        n_all);

  /* Finite differences at the five elements with the largest skip share and
   * five random ones; tolerance from fd_agrees with the block's dl. */
  size_t pick[10];
  for (int p = 0; p < 5; p++) {
    size_t best = 0;
    double best_v = -1;
    for (size_t i = 0; i < nin; i++) {
      int used = 0;
      for (int q = 0; q < p; q++) used |= pick[q] == i;
      double s = fabs((double)din[i] - din_noskip[i]);
      if (!used && s > best_v) best_v = s, best = i;
    }
    pick[p] = best;
  }
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, 9);
  for (int p = 5; p < 10; p++) pick[p] = st_rng_below(&rng, (uint32_t)nin);
  int checked = 0, noskip_wrong = 0;
  for (int p = 0; p < 10; p++) {
    float *v = &r.in[pick[p]], saved = *v;
    int done = 0;
    for (int e = 0; e < N_EPS && !done; e++) {
      float hi = saved + eps_steps[e], lo = saved - eps_steps[e];
      *v = hi;
      double lp = block_objective(&r);
      uint64_t pp = block_pattern(b, r.acts, r.B, 1);
      *v = lo;
      double lm = block_objective(&r);
      uint64_t pm = block_pattern(b, r.acts, r.B, 1);
      *v = saved;
      if (pp != pattern || pm != pattern) continue;
      done = 1;
      double fd = (lp - lm) / ((double)hi - (double)lo);
      CHECK(fd_agrees(fd, din[pick[p]], eps_steps[e], dl),
            "%s: %s: d/d in[%zu]: analytic %.6g, finite difference %.6g "
            "(eps %g)",
            what, b->name, pick[p], (double)din[pick[p]], fd,
            (double)eps_steps[e]);
      noskip_wrong += !fd_agrees(fd, din_noskip[pick[p]], eps_steps[e], dl);
      checked++;
      if (verbose())
        fprintf(stderr,
                "  %s: %s in[%3zu] analytic %+.6e fd %+.6e without skip "
                "%+.6e eps %g\n",
                what, b->name, pick[p], (double)din[pick[p]], fd,
                (double)din_noskip[pick[p]], (double)eps_steps[e]);
    }
  }
  CHECK(checked >= 8, "%s: %s: only %d of 10 elements clear of kinks", what,
        b->name, checked);
  /* Without the skip term the gradient must fail the same comparison: at
   * least the five elements chosen for their skip share. */
  CHECK(noskip_wrong >= 5,
        "%s: %s: dropping the skip path fails only %d comparisons", what,
        b->name, noskip_wrong);

  st_free(all);
  st_free(r.in);
  st_free(r.dout);
  st_free(r.acts);
  st_free(r.scratch);
  st_free(work);
  st_free(grads);
  st_free(din);
  st_free(din_noskip);
  st_model_destroy(m);
}

/* ------------------------------------------------------ configs */

static void set_str(char *dst, size_t cap, const char *s) {
  snprintf(dst, cap, "%s", s);
}
#define SET(field, s) set_str((field), sizeof(field), (s))

/* (a) mlp [7, 5] relu on a 1x4x4 image: two hidden blocks, head (the first
 * linear layer reads the image's 16 elements as a vector: no flatten) */
static void config_a(st_config *c) {
  st_config_defaults(c);
  SET(c->model.kind, "mlp");
  c->model.hidden = (st_int_list){2, {7, 5}};
  SET(c->model.activation, "relu");
  c->model.classes = 3;
}

/* (b) mlp [6] with layernorm and exact gelu on a 12-vector */
static void config_b(st_config *c) {
  st_config_defaults(c);
  SET(c->model.kind, "mlp");
  c->model.hidden = (st_int_list){1, {6}};
  SET(c->model.norm, "layernorm");
  SET(c->model.activation, "gelu");
  c->model.classes = 3;
}

/* (f) mlp [40000] relu, dropout 0.3, on a 1x4x4 image: a hidden output of
 * over 32K floats a sample is a task per sample (block.c), so each sample's
 * dropout finds its own mask bits at its own offset (check_dropout_block) */
static void config_f(st_config *c) {
  st_config_defaults(c);
  SET(c->model.kind, "mlp");
  c->model.hidden = (st_int_list){1, {40000}};
  SET(c->model.activation, "relu");
  c->model.dropout = 0.3f;
  c->model.classes = 3;
}

/* (e) mlp [6, 6, 6] with layernorm, relu and model.residual on a
 * 5-vector: the second and third hidden blocks add their input back */
static void config_e(st_config *c) {
  st_config_defaults(c);
  SET(c->model.kind, "mlp");
  c->model.hidden = (st_int_list){3, {6, 6, 6}};
  SET(c->model.norm, "layernorm");
  SET(c->model.activation, "relu");
  c->model.residual = 1;
  c->model.classes = 3;
}

/* model.residual: blocks 1 and 2 of (e) have the add, block 0 (784 -> 6
 * in FC-MNIST terms: widths differ) does not; unequal hidden widths are
 * refused, naming the key. */
static void check_mlp_residual(void) {
  st_config c;
  config_e(&c);
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, &c, (st_shape){5, 1, 1}, &err);
  CHECK(rc == 0, "(e): %s", err.msg);
  if (!rc)
    CHECK(m->n_blocks == 4 && !m->blocks[0].has_residual &&
              m->blocks[1].has_residual && m->blocks[2].has_residual &&
              !m->blocks[3].has_residual,
          "(e): residual adds in blocks 1 and 2 only");
  st_model_destroy(m);
  m = NULL;
  c.model.hidden = (st_int_list){2, {6, 5}};
  rc = st_model_create(&m, &c, (st_shape){5, 1, 1}, &err);
  CHECK(rc == ST_ESHAPE && strstr(err.msg, "model.residual") &&
            strstr(err.msg, "widths must match"),
        "unequal widths with model.residual: rc %d, '%s'", rc, err.msg);
  st_model_destroy(m);
}

/* (c) cnn [4], groupnorm 2 groups, one residual block, max pool, dense [6] */
static void config_c(st_config *c) {
  st_config_defaults(c);
  SET(c->model.kind, "cnn");
  c->model.channels = (st_int_list){1, {4}};
  c->model.kernel = 3;
  SET(c->model.norm, "groupnorm");
  c->model.groups = 2;
  c->model.residual_blocks = 1;
  SET(c->model.pool, "max");
  c->model.dense = (st_int_list){1, {6}};
  c->model.classes = 3;
}

/* (d) cnn [4, 4], no norm, one residual block per stage, avg pool, no dense
 * layers: the flatten goes into the head block */
static void config_d(st_config *c) {
  st_config_defaults(c);
  SET(c->model.kind, "cnn");
  c->model.channels = (st_int_list){2, {4, 4}};
  SET(c->model.norm, "none");
  c->model.residual_blocks = 1;
  SET(c->model.pool, "avg");
  c->model.dense = (st_int_list){0, {0}};
  c->model.classes = 3;
}

/* The block structure of the four models, from the builder's rules. */
static void check_structure(void) {
  st_config c;
  st_model *m = NULL;
  st_error err = {0};

  config_a(&c);
  if (st_model_create(&m, &c, (st_shape){1, 4, 4}, &err) == 0) {
    CHECK(m->n_blocks == 3, "(a): %d blocks, want 3", m->n_blocks);
    CHECK(m->blocks[0].layers[0].kind == ST_OP_LINEAR &&
              m->blocks[0].layers[0].in.h == 4,
          "(a): block 0 does not start with the linear layer on the image");
    /* 16*7+7 + 7*5+5 + 5*3+3 */
    CHECK(m->n_params == 119 + 40 + 18, "(a): %zu params, want 177",
          m->n_params);
    st_model_destroy(m);
  } else {
    CHECK(0, "(a): %s", err.msg);
  }

  config_b(&c);
  if (st_model_create(&m, &c, (st_shape){12, 1, 1}, &err) == 0) {
    CHECK(m->n_blocks == 2, "(b): %d blocks, want 2", m->n_blocks);
    /* a vector input needs no flatten: linear, ln, gelu */
    CHECK(m->blocks[0].n_layers == 3 &&
              m->blocks[0].layers[0].kind == ST_OP_LINEAR &&
              m->blocks[0].layers[1].kind == ST_OP_LAYERNORM &&
              m->blocks[0].layers[2].kind == ST_OP_GELU &&
              m->blocks[0].layers[2].approximate == 0,
          "(b): block 0 is not [linear ln gelu(exact)]");
    /* 12*6+6 + 6+6 + 6*3+3 */
    CHECK(m->n_params == 78 + 12 + 21, "(b): %zu params, want 111",
          m->n_params);
    st_model_destroy(m);
  } else {
    CHECK(0, "(b): %s", err.msg);
  }

  config_c(&c);
  if (st_model_create(&m, &c, (st_shape){1, 8, 8}, &err) == 0) {
    /* conv block, residual block (pooled), dense block, head */
    CHECK(m->n_blocks == 4, "(c): %d blocks, want 4", m->n_blocks);
    if (m->n_blocks == 4) {
      CHECK(m->blocks[1].has_residual && !m->blocks[0].has_residual,
            "(c): block 1 should be the residual one");
      const st_block *r = &m->blocks[1];
      CHECK(r->layers[r->n_layers - 1].kind == ST_OP_MAXPOOL && r->out.c == 4 &&
                r->out.h == 4 && r->out.w == 4,
            "(c): the residual block should end in a 2x2 max pool to 4x4x4");
      CHECK(m->blocks[2].layers[0].kind == ST_OP_FLATTEN &&
                m->blocks[2].in.c == 4 && m->blocks[2].out.c == 6,
            "(c): block 2 should flatten 4x4x4 into a dense 6");
    }
    st_model_destroy(m);
  } else {
    CHECK(0, "(c): %s", err.msg);
  }

  config_d(&c);
  if (st_model_create(&m, &c, (st_shape){1, 8, 8}, &err) == 0) {
    /* two stages of (conv block, residual block), then the head */
    CHECK(m->n_blocks == 5, "(d): %d blocks, want 5", m->n_blocks);
    if (m->n_blocks == 5) {
      const st_block *h = &m->blocks[4];
      CHECK(h->layers[0].kind == ST_OP_FLATTEN &&
                h->layers[1].kind == ST_OP_LINEAR && h->n_layers == 2,
            "(d): the head block should be [flatten linear]");
      CHECK(h->in.c == 4 && h->in.h == 2 && h->in.w == 2 && h->out.c == 3,
            "(d): head %dx%dx%d -> %d, want 4x2x2 -> 3", h->in.c, h->in.h,
            h->in.w, h->out.c);
      CHECK(m->blocks[1].has_residual && m->blocks[3].has_residual,
            "(d): blocks 1 and 3 should be residual");
    }
    st_model_destroy(m);
  } else {
    CHECK(0, "(d): %s", err.msg);
  }
}

/* ------------------------------------------------------ model facts */

static void check_fc_mnist(void) {
  st_config c;
  st_config_defaults(&c); /* mlp [256, 256], 10 classes */
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == 0, "fc_mnist: %s", err.msg);
  if (rc) return;
  CHECK(m->n_blocks == 3, "fc_mnist: %d blocks, want 3", m->n_blocks);
  size_t want = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10;
  CHECK(want == 269322 && m->n_params == want,
        "fc_mnist: %zu parameters, want 269322", m->n_params);
  size_t sum = 0;
  for (int i = 0; i < m->n_blocks; i++) sum += m->blocks[i].n_params;
  CHECK(sum == m->n_params, "fc_mnist: blocks hold %zu params, model %zu", sum,
        m->n_params);
  const st_tensor_info *ti = NULL;
  int64_t off = st_model_find(m, "blocks.0.linear0.weight", &ti);
  CHECK(off == 0 && ti && ti->ndim == 2 && ti->dims[0] == 256 &&
            ti->dims[1] == 784 && ti->numel == 256 * 784,
        "fc_mnist: blocks.0.linear0.weight at %lld, want offset 0 dims "
        "{256, 784}",
        (long long)off);
  /* the bias follows its weight; the head's weight starts block 2's slab */
  CHECK(st_model_find(m, "blocks.0.linear0.bias", NULL) == 784 * 256,
        "fc_mnist: blocks.0.linear0.bias not right after the weight");
  off = st_model_find(m, "blocks.2.linear0.weight", &ti);
  CHECK(off == (int64_t)(784 * 256 + 256 + 256 * 256 + 256) && ti &&
            ti->dims[0] == 10 && ti->dims[1] == 256,
        "fc_mnist: head weight at %lld", (long long)off);
  CHECK(st_model_find(m, "blocks.0.linear9.weight", NULL) == -1,
        "fc_mnist: a missing tensor was found");
  CHECK(m->n_tensors == 6, "fc_mnist: %d tensors, want 6", m->n_tensors);
  CHECK(m->blocks[0].n_layers == 2 &&
            m->blocks[0].layers[0].kind == ST_OP_LINEAR,
        "fc_mnist: block 0 is not [linear relu]");
  CHECK(m->blocks[0].in.c == 1 && m->blocks[0].in.h == 28 &&
            m->blocks[2].out.c == 10,
        "fc_mnist: model does not map 1x28x28 to 10 logits");
  /* a 784 -> 256 linear is 784*256 multiply-adds, 2 FLOPs each */
  CHECK(m->blocks[0].cost.flops_fwd >= 2.0 * 784 * 256,
        "fc_mnist: block 0 forward %.0f FLOPs < 2*784*256",
        m->blocks[0].cost.flops_fwd);
  st_model_destroy(m);
}

static void check_cnn_counts(void) {
  st_config c;
  st_config_defaults(&c);
  SET(c.model.kind, "cnn");
  c.model.channels = (st_int_list){2, {32, 64}};
  c.model.residual_blocks = 4;
  /* dense stays at its default [128] */
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == 0, "cnn [32, 64] x4: %s", err.msg);
  if (rc) return;
  /* per stage one conv block + residual_blocks residual blocks; one block
   * per dense width; one head */
  int want = 2 * (1 + 4) + c.model.dense.n + 1;
  CHECK(c.model.dense.n == 1 && m->n_blocks == want && want == 12,
        "cnn [32, 64] x4: %d blocks, want %d", m->n_blocks, want);
  int residual = 0;
  for (int i = 0; i < m->n_blocks; i++) residual += m->blocks[i].has_residual;
  CHECK(residual == 8, "cnn [32, 64] x4: %d residual blocks, want 8", residual);
  /* 28 -> 14 -> 7 after two 2x2 pools; the dense block flattens 64*7*7 */
  const st_tensor_info *ti = NULL;
  st_model_find(m, "blocks.10.linear0.weight", &ti);
  CHECK(ti && ti->dims[0] == 128 && ti->dims[1] == 64 * 7 * 7,
        "cnn [32, 64] x4: dense weight is not 128 x 3136");
  st_model_find(m, "blocks.1.conv1.weight", &ti);
  CHECK(ti && ti->ndim == 4 && ti->dims[0] == 32 && ti->dims[1] == 32 &&
            ti->dims[2] == 3 && ti->dims[3] == 3,
        "cnn [32, 64] x4: blocks.1.conv1.weight is not 32x32x3x3");
  st_model_destroy(m);
  /* more blocks over its stages than the tables are built for: refused
   * by name before any is built (each stage alone within the key's range) */
  c.model.channels = (st_int_list){3, {4, 4, 4}};
  c.model.residual_blocks = 30000;
  m = NULL;
  rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == ST_ESHAPE && m == NULL &&
            strstr(err.msg, "model.residual_blocks: 30000 per stage over 3 "
                            "stages is 90003 blocks; at most 65536"),
        "cnn [4, 4, 4] x30000: rc %d '%s'", rc, err.msg);

  /* 28 -> 14 -> 7 -> 3 -> 1: the fifth stage would pool 1x1 */
  c.model.channels = (st_int_list){6, {4, 4, 4, 4, 4, 4}};
  c.model.residual_blocks = 0;
  m = (st_model *)&c; /* must be reset to NULL on failure */
  rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == ST_ESHAPE, "impossible cnn: rc %d, want ST_ESHAPE", rc);
  CHECK(m == NULL, "impossible cnn: *out not NULL after failure");
  CHECK(strstr(err.msg, "model.channels") != NULL,
        "impossible cnn: message lacks model.channels: %s", err.msg);
  if (rc == 0) st_model_destroy(m);

  /* every key in range, a tensor past int: 65536 x 65536 x 3 x 3 = 3.9e10
   * elements, which the kernels cannot index: refused naming it */
  c.model.channels = (st_int_list){2, {65536, 65536}};
  m = NULL;
  rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == ST_ESHAPE && m == NULL &&
            strstr(err.msg, "model: tensor blocks.1.conv0.weight would hold "
                            "3.87e+10 elements, more than the 2147483647"),
        "a tensor past int: rc %d '%s'", rc, err.msg);
  if (rc == 0) st_model_destroy(m);

  /* every key in range, every tensor within int, but the flattened map
   * past it: 2^24 x 14 x 14 = 3.3e9 floats, which the flatten's vector
   * width (an int) cannot hold; it wrapped negative and the model was
   * built with a negative-width dense layer (negative FLOPs, exabytes) */
  c.model.channels = (st_int_list){1, {1 << 24}};
  c.model.dense = (st_int_list){0, {0}};
  c.model.classes = 2;
  m = NULL;
  rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == ST_ESHAPE && m == NULL && strstr(err.msg, "model.channels") &&
            strstr(err.msg, "16777216x14x14"),
        "a flattened map past int: rc %d '%s'", rc, err.msg);
  if (rc == 0) st_model_destroy(m);
}

/* ------------------------------------------------------ initialisation */

/* GPT-2's initialisation (model.c): weights N(0, 0.02), the residual
 * projections (both c_proj) N(0, 0.02 / sqrt(2 layers)). Each weight's
 * sample standard deviation against its closed form: over n draws it is
 * off by about 1 / sqrt(2 n) relative, 3% for the smallest tensor here
 * (wpe, 8 x 64); 15% is five of those, and half the residual scale (2
 * layers: 0.01 against 0.02) is far outside it. */
static void check_gpt_init(void) {
  st_config c;
  st_config_defaults(&c);
  const char *sets[] = {"model.kind=gpt",  "model.context=8", "model.layers=2",
                        "model.width=64",  "model.heads=2",   "model.vocab=64",
                        "model.dropout=0", "model.tied=true"};
  st_error err = {0};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    CHECK(st_config_set(&c, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
  st_model *m = NULL;
  if (st_model_create(&m, &c, (st_shape){1, 8, 1}, &err)) {
    CHECK(0, "gpt init model: %s", err.msg);
    return;
  }
  float *p = floats(m->n_params);
  st_model_init(m, p, 7);
  int normal = 0, residual = 0;
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *blk = &m->blocks[i];
    for (int l = 0; l < blk->n_layers; l++) {
      const st_layer *L = &blk->layers[l];
      if (L->w_tensor < 0 || L->kind == ST_OP_LAYERNORM) continue;
      /* the weight, and the embedding's second table (learned positions,
       * drawn like the first) */
      int t[2] = {L->w_tensor, L->kind == ST_OP_EMBED ? L->b_tensor : -1};
      for (int k = 0; k < 2 && t[k] >= 0; k++) {
        const st_tensor_info *w = &blk->tensors[t[k]];
        if (w->tie >= 0) continue;
        const float *pw = p + blk->param_off + w->offset;
        double sq = 0;
        for (size_t e = 0; e < w->numel; e++) sq += (double)pw[e] * pw[e];
        int is_residual = strstr(w->name, "c_proj") != NULL;
        double got = sqrt(sq / (double)w->numel),
               want = is_residual ? 0.02 / sqrt(2.0 * 2) : 0.02;
        residual += is_residual, normal += !is_residual;
        CHECK(fabs(got / want - 1) < 0.15,
              "gpt init: %s has std %.4f, want %.4f", w->name, got, want);
      }
    }
  }
  /* c_proj twice a layer; wte, wpe, c_attn and c_fc twice (the head is
   * wte's tied copy) */
  CHECK(residual == 4 && normal == 6,
        "gpt init: %d residual projections, %d other weights", residual,
        normal);
  st_free(p);
  st_model_destroy(m);

  /* rotary positions with model.rotary_dim left 0 (the whole head) over an
   * odd head size, 66 / 2 = 33: the message named model.rotary_dim 33, a
   * value the user never set ("default: model.rotary_dim: 33; must be
   * even and at most the head size 33"); it says what 0 meant and why
   * that is refused */
  CHECK(st_config_set(&c, "model.positions=rotary", &err) == 0 &&
            st_config_set(&c, "model.width=66", &err) == 0,
        "rotary, head size 33: %s", err.msg);
  m = NULL;
  int rc = st_model_create(&m, &c, (st_shape){1, 8, 1}, &err);
  CHECK(rc == ST_ESHAPE && m == NULL &&
            strstr(err.msg, "model.rotary_dim: 0 rotates all 33 dims of a "
                            "head (model.width 66 / model.heads 2)"),
        "rotary, head size 33: rc %d '%s'", rc, err.msg);
  if (rc == 0) st_model_destroy(m);
  /* one set to an odd value says so, as before */
  CHECK(st_config_set(&c, "model.rotary_dim=5", &err) == 0, "%s", err.msg);
  m = NULL;
  rc = st_model_create(&m, &c, (st_shape){1, 8, 1}, &err);
  CHECK(rc == ST_ESHAPE && m == NULL &&
            strstr(err.msg, "model.rotary_dim: 5; must be even and at most "
                            "the head size 33"),
        "rotary_dim 5: rc %d '%s'", rc, err.msg);
  if (rc == 0) st_model_destroy(m);
}

static void check_init(void) {
  st_config c;
  config_c(&c); /* conv, groupnorm, linear: every kind of tensor init */
  st_model *m = NULL;
  st_error err = {0};
  if (st_model_create(&m, &c, (st_shape){1, 8, 8}, &err)) {
    CHECK(0, "init model: %s", err.msg);
    return;
  }
  size_t n = m->n_params;
  float *a = floats(n), *b = floats(n), *d = floats(n);
  st_model_init(m, a, 42);
  st_model_init(m, b, 42);
  st_model_init(m, d, 43);
  CHECK(memcmp(a, b, n * sizeof(float)) == 0, "init: seed 42 twice differs");
  size_t same = 0;
  for (size_t i = 0; i < n; i++) same += a[i] == d[i];
  /* only the norm tensors (1s and 0s) may coincide */
  size_t norm_floats = 0;
  for (int i = 0; i < m->n_blocks; i++)
    for (int l = 0; l < m->blocks[i].n_layers; l++) {
      const st_layer *L = &m->blocks[i].layers[l];
      if (L->kind == ST_OP_GROUPNORM || L->kind == ST_OP_LAYERNORM)
        norm_floats += 2 * m->blocks[i].tensors[L->w_tensor].numel;
    }
  CHECK(norm_floats > 0 && same == norm_floats,
        "init: seeds 42 and 43 agree on %zu floats, want only the %zu norm "
        "floats",
        same, norm_floats);

  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *blk = &m->blocks[i];
    for (int l = 0; l < blk->n_layers; l++) {
      const st_layer *L = &blk->layers[l];
      if (L->w_tensor < 0) continue;
      const st_tensor_info *w = &blk->tensors[L->w_tensor];
      const st_tensor_info *bias = &blk->tensors[L->b_tensor];
      const float *pw = a + blk->param_off + w->offset;
      const float *pb = a + blk->param_off + bias->offset;
      if (L->kind == ST_OP_GROUPNORM || L->kind == ST_OP_LAYERNORM) {
        int ok = 1;
        for (size_t k = 0; k < w->numel; k++)
          ok &= pw[k] == 1.0f && pb[k] == 0.0f;
        CHECK(ok, "init: %s / %s are not 1 / 0", w->name, bias->name);
        continue;
      }
      /* fan_in = in_features (linear) or in_channels * K * K (conv) */
      size_t fan_in = w->numel / (size_t)w->dims[0];
      CHECK(fan_in == (L->kind == ST_OP_CONV2D ? (size_t)(L->in.c * L->k * L->k)
                                               : st_shape_numel(L->in)),
            "init: %s: fan_in %zu does not match the layer", w->name, fan_in);
      double bound = 1.0 / sqrt((double)fan_in), biggest = 0, sum = 0;
      int inside = 1;
      for (size_t k = 0; k < w->numel; k++) {
        inside &= fabs(pw[k]) <= bound;
        biggest = fmax(biggest, fabs(pw[k]));
        sum += pw[k];
      }
      for (size_t k = 0; k < bias->numel; k++) inside &= fabs(pb[k]) <= bound;
      CHECK(inside, "init: %s or its bias outside +-1/sqrt(%zu)", w->name,
            fan_in);
      /* Uniform on [-bound, bound]: with n >= 36 draws, the largest falls
       * below 0.8 bound with probability 0.8^36 < 1e-3 (and the seed is
       * fixed), and the mean of n draws has std bound / sqrt(3n), so 5
       * std of room; a smaller bound or a one-sided draw fails these. */
      if (w->numel >= 36) {
        CHECK(biggest >= 0.8 * bound, "init: %s: max |w| %.4g < 0.8 * %.4g",
              w->name, biggest, bound);
        double mean = sum / (double)w->numel;
        CHECK(fabs(mean) <= 5 * bound / sqrt(3.0 * (double)w->numel),
              "init: %s: mean %.4g too far from 0", w->name, mean);
      }
    }
  }
  st_free(a);
  st_free(b);
  st_free(d);
  st_model_destroy(m);
}

/* Which outputs a block keeps (model.c mark_transient), by hand: a GPT
 * layer [ln linear attention linear dropout residual ln linear gelu linear
 * dropout residual] keeps ln, qkv, attention (read by the backwards after
 * them), the residual (its source and ln's input) and the last; the two
 * projections and dropouts are read by no backward; the gelu's output is
 * made again for the projection's. An MLP block [linear relu] keeps relu's
 * output alone. The activations hold the kept outputs and every save area;
 * the scratch two slots of the largest transient output past the layers'
 * own. */
/* Block [linear relu dropout] of model (f), training, 3 samples on
 * a pool of 3: a task per sample. Its gradients against the ops' chain with
 * each sample's own mask (st_dropout_forward on that sample alone, from its
 * global index): dropout, then relu, then the linear layer's gradient —
 * the same calls, so the same bits; its dropout output against the same
 * masks. A sample reading another's mask bits fails either. */
static void check_dropout_block(const st_config *c) {
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, c, (st_shape){1, 4, 4}, &err);
  CHECK(rc == 0, "(f): %s", err.msg);
  if (rc) return;
  const st_block *b = &m->blocks[0];
  const st_layer *lin = &b->layers[0], *relu = &b->layers[1],
                 *drop = &b->layers[2];
  CHECK(b->n_layers == 3 && lin->kind == ST_OP_LINEAR &&
            relu->kind == ST_OP_RELU && drop->kind == ST_OP_DROPOUT,
        "(f): block 0 is not [linear relu dropout]");
  enum { B = 3, IC = 16, H = 40000 };
  float *params = floats(m->n_params), *grads = floats(m->n_params);
  float *want = floats(m->n_params), *x = floats(B * IC),
        *dout = floats((size_t)B * H);
  float *acts = floats((size_t)B * b->act_per_sample);
  float *scratch = floats((size_t)B * b->scratch_floats_per_sample);
  float *work = floats(3 * (size_t)B * b->max_numel);
  float *g1 = floats((size_t)B * H), *g2 = floats((size_t)B * H),
        *y = floats((size_t)B * H);
  uint32_t *mask = (uint32_t *)floats((size_t)B * st_dropout_mask_words(H));
  st_model_init(m, params, 5);
  fill_normal(x, B * IC, 6);
  fill_normal(dout, (size_t)B * H, 7);
  memset(grads, 0, m->n_params * sizeof(float));
  memset(want, 0, m->n_params * sizeof(float));
  st_pool *pool = st_pool_create(3);
  st_ctx ctx = {pool, 1, 99, 1000, NULL, NULL};
  st_block_forward(b, &ctx, params + b->param_off, x, acts, scratch, B);
  st_block_backward(b, &ctx, params + b->param_off, grads + b->param_off, x,
                    acts, dout, NULL, work, scratch, B);
  const float *r = acts + relu->out_off * (size_t)B; /* relu's, kept */
  for (int s = 0; s < B; s++)
    st_dropout_forward(y + (size_t)s * H,
                       mask + (size_t)s * st_dropout_mask_words(H),
                       r + (size_t)s * H, 1, H, drop->p, ctx.seed, drop->id,
                       ctx.first_sample + (uint64_t)s);
  CHECK(memcmp(y, st_block_output(b, acts, B), (size_t)B * H * 4) == 0,
        "(f): a sample's dropout output is not its own mask's");
  st_dropout_backward(g1, dout, mask, B, H, drop->p);
  st_relu_backward(g2, g1, r, (size_t)B * H);
  const float *w = params + b->param_off + b->tensors[lin->w_tensor].offset;
  st_linear_backward(NULL, NULL,
                     want + b->param_off + b->tensors[lin->w_tensor].offset,
                     want + b->param_off + b->tensors[lin->b_tensor].offset, g2,
                     x, w, B, IC, H);
  CHECK(memcmp(want + b->param_off, grads + b->param_off,
               b->n_params * sizeof(float)) == 0,
        "(f): the block's gradients are not the op chain's with each "
        "sample's own mask");
  st_pool_destroy(pool);
  float *all[] = {params,  grads, want, x,  dout, acts,
                  scratch, work,  g1,   g2, y,    (float *)mask};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) st_free(all[i]);
  st_model_destroy(m);
}

/* gelu and layernorm run in chunks of 4K elements or whole rows (block.c,
 * fine_job), the last one partial: mlp [3000] ln gelu at batch 3 (9000
 * gelu elements: two chunks and 808 more) against the op chain called by
 * hand, bit for bit, forward and input gradient. */
static void check_fine_chunks(void) {
  st_config c;
  config_b(&c);
  c.model.hidden = (st_int_list){1, {3000}};
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, &c, (st_shape){5, 1, 1}, &err);
  CHECK(rc == 0, "mlp [3000] ln gelu: %s", err.msg);
  if (rc) return;
  const st_block *b = &m->blocks[0];
  const st_layer *lin = &b->layers[0], *ln = &b->layers[1];
  CHECK(b->n_layers == 3 && lin->kind == ST_OP_LINEAR &&
            ln->kind == ST_OP_LAYERNORM && b->layers[2].kind == ST_OP_GELU,
        "mlp [3000] ln gelu: block 0 is not [linear layernorm gelu]");
  enum { B = 3, IC = 5, H = 3000 };
  float *params = floats(m->n_params), *x = floats(B * IC);
  float *acts = floats((size_t)B * b->act_per_sample);
  float *scratch = floats((size_t)B * b->scratch_floats_per_sample);
  float *work = floats(3 * (size_t)B * b->max_numel);
  float *h = floats(B * H), *n = floats(B * H), *y = floats(B * H);
  float *dout = floats(B * H), *g = floats(B * H), *din = floats(B * IC);
  float *want = floats(B * IC), *stats = floats(2 * B);
  float *grads = floats(m->n_params);
  st_model_init(m, params, 9);
  fill_normal(x, B * IC, 10);
  fill_normal(dout, B * H, 11);
  memset(grads, 0, m->n_params * sizeof(float));
  st_pool *pool = st_pool_create(3);
  st_ctx ctx = {pool, 1, 99, 0, NULL, NULL};
  const float *p = params + b->param_off;
  const float *w = p + b->tensors[lin->w_tensor].offset,
              *bias = p + b->tensors[lin->b_tensor].offset,
              *lw = p + b->tensors[ln->w_tensor].offset,
              *lb = p + b->tensors[ln->b_tensor].offset;
  st_block_forward(b, &ctx, p, x, acts, scratch, B);
  st_block_backward(b, &ctx, p, grads + b->param_off, x, acts, dout, din, work,
                    scratch, B);
  st_linear_forward(NULL, h, x, w, bias, B, IC, H);
  st_layernorm_forward(n, stats, stats + B, h, lw, lb, B, H, ln->eps);
  st_gelu_forward(y, n, (size_t)B * H, 0);
  CHECK(memcmp(y, st_block_output(b, acts, B), sizeof(float) * B * H) == 0,
        "mlp [3000] ln gelu: the block's output is not the op chain's");
  st_gelu_backward(g, dout, n, (size_t)B * H, 0);
  st_layernorm_backward(NULL, y, NULL, NULL, g, h, lw, stats, stats + B, NULL,
                        B, H);
  st_linear_backward(NULL, want, NULL, NULL, y, x, w, B, IC, H);
  CHECK(memcmp(want, din, sizeof(float) * B * IC) == 0,
        "mlp [3000] ln gelu: the block's input gradient is not the op "
        "chain's");
  st_pool_destroy(pool);
  float *all[] = {params, x,    acts, scratch, work, h,     n,
                  y,      dout, g,    din,     want, stats, grads};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) st_free(all[i]);
  st_model_destroy(m);
}

/* A linear layer and the relu after it run as one product that applies
 * the relu as it stores (block.c): fc_mnist's first block's output must be
 * the bits of st_linear_forward and then st_relu_forward, at batches whose
 * products take each path of st_gemm (1: the matrix-vector product; 2-8:
 * dot; 12: packed; 40 and 256: packed in tasks), with no pool and a pool
 * of 3. Sample 0's first pixel is a NaN: its outputs are NaN before the
 * relu and after it (relu keeps a NaN, as PyTorch's). */
static void check_linear_relu(void) {
  st_config c;
  st_config_defaults(&c);
  st_model *m = NULL;
  st_error err = {0};
  int rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == 0, "fc_mnist: %s", err.msg);
  if (rc) return;
  const st_block *b = &m->blocks[0];
  const st_layer *lin = &b->layers[0];
  CHECK(b->n_layers == 2 && lin->kind == ST_OP_LINEAR &&
            lin->transient == ST_TRANSIENT && b->layers[1].kind == ST_OP_RELU,
        "fc_mnist: block 0 is not [linear relu] with the linear's output "
        "transient");
  enum { MAXB = 256, IC = 784, OC = 256 };
  float *params = floats(m->n_params), *x = floats((size_t)MAXB * IC);
  float *acts = floats((size_t)MAXB * b->act_per_sample);
  float *scratch = floats((size_t)MAXB * b->scratch_floats_per_sample);
  float *want = floats((size_t)MAXB * OC);
  st_model_init(m, params, 8);
  fill_normal(x, (size_t)MAXB * IC, 9);
  x[0] = NAN;
  const float *w = params + b->param_off + b->tensors[lin->w_tensor].offset;
  const float *bias = params + b->param_off + b->tensors[lin->b_tensor].offset;
  st_pool *pool = st_pool_create(3);
  const int batches[] = {1, 2, 5, 8, 12, 40, 256};
  for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
    int B = batches[i];
    st_linear_forward(NULL, want, x, w, bias, B, IC, OC);
    int nan_row = 1;
    for (int o = 0; o < OC; o++) nan_row &= isnan(want[o]);
    st_relu_forward(want, want, (size_t)B * OC);
    int kept_row = 1, positive = 0, zeros = 0; /* relu keeps a NaN */
    for (int o = 0; o < OC; o++) kept_row &= isnan(want[o]);
    for (size_t k = OC; k < (size_t)B * OC; k++) {
      positive += want[k] > 0;
      zeros += want[k] == 0;
    }
    CHECK(nan_row && kept_row && (B == 1 || (positive > 0 && zeros > 0)),
          "batch %d: the op chain's relu: sample 0 NaN %d then NaN %d; %d "
          "positive, %d zero elsewhere",
          B, nan_row, kept_row, positive, zeros);
    for (int p = 0; p < 2; p++) {
      memset(acts, 0xff, (size_t)B * b->act_per_sample * sizeof(float));
      st_ctx ctx = {p ? pool : NULL, 1, 99, 0, NULL, NULL};
      st_block_forward(b, &ctx, params + b->param_off, x, acts, scratch, B);
      CHECK(memcmp(want, st_block_output(b, acts, B),
                   (size_t)B * OC * sizeof(float)) == 0,
            "batch %d (%s): [linear relu] is not the bits of the linear "
            "forward and then relu",
            B, p ? "3 threads" : "no pool");
    }
  }
  st_pool_destroy(pool);
  float *all[] = {params, x, acts, scratch, want};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) st_free(all[i]);
  st_model_destroy(m);
}

static void check_kept_outputs(void) {
  st_config c;
  st_config_defaults(&c);
  const char *sets[] = {"model.kind=gpt",    "model.context=8",
                        "model.layers=1",    "model.heads=2",
                        "model.width=16",    "model.vocab=40",
                        "model.dropout=0.1", "model.activation=gelu_tanh"};
  st_error err = {0};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    CHECK(st_config_set(&c, sets[i], &err) == 0, "%s", err.msg);
  st_model *m = NULL;
  int rc = st_model_create(&m, &c, (st_shape){1, 8, 1}, &err);
  CHECK(rc == 0, "gpt: %s", err.msg);
  if (rc) return;
  const st_block *b = &m->blocks[1]; /* h.0 */
  int want[] = {ST_KEPT,       ST_KEPT,      ST_KEPT,      ST_TRANSIENT,
                ST_TRANSIENT,  ST_KEPT,      ST_KEPT,      ST_KEPT,
                ST_RECOMPUTED, ST_TRANSIENT, ST_TRANSIENT, ST_KEPT};
  int n = (int)(sizeof want / sizeof *want), same = b->n_layers == n;
  size_t kept = 0, saves = 0, slot[2] = {0, 0};
  for (int l = 0; same && l < n; l++) {
    const st_layer *L = &b->layers[l];
    same &= L->transient == want[l];
    size_t numel = st_shape_numel(L->out);
    if (L->transient)
      slot[l % 2] = numel > slot[l % 2] ? numel : slot[l % 2];
    else
      kept += numel;
    saves += L->save_per_sample;
  }
  CHECK(same, "gpt block %s: kept outputs not as by hand", b->name);
  CHECK(b->act_per_sample == kept + saves,
        "gpt block: %zu floats of activations a sample, by hand %zu + %zu",
        b->act_per_sample, kept, saves);
  /* a transient output sits past the largest layer scratch (attention's
   * here), in slot l % 2, each slot its largest: the gelu's 64 x 8 floats
   * among the even layers, a projection's 16 x 8 among the odd */
  size_t own = b->scratch_floats_per_sample - slot[0] - slot[1];
  CHECK(slot[0] == 64 * 8 && slot[1] == 16 * 8 &&
            b->layers[3].out_off == own + slot[0] &&
            b->layers[9].out_off == own + slot[0] &&
            b->layers[4].out_off == own && b->layers[8].out_off == own,
        "gpt block: slots of %zu and %zu floats at %zu, %zu, %zu past %zu",
        slot[0], slot[1], b->layers[3].out_off, b->layers[4].out_off,
        b->layers[8].out_off, own);
  st_model_destroy(m);
  st_config_defaults(&c); /* fc_mnist: [linear relu] x 2, [linear] */
  rc = st_model_create(&m, &c, (st_shape){1, 28, 28}, &err);
  CHECK(rc == 0, "mlp: %s", err.msg);
  if (rc) return;
  const st_block *h = &m->blocks[1];
  CHECK(h->n_layers == 2 && h->layers[0].transient == ST_TRANSIENT &&
            h->layers[1].transient == ST_KEPT && h->act_per_sample == 256 &&
            m->blocks[0].act_per_sample == 256 &&
            m->blocks[2].act_per_sample == 10,
        "mlp blocks: %zu, %zu, %zu floats a sample, want 256, 256, 10",
        m->blocks[0].act_per_sample, h->act_per_sample,
        m->blocks[2].act_per_sample);
  st_model_destroy(m);
}

int main(void) {
  st_blas_init();
  st_config c;

  check_structure();
  check_gpt_init();

  config_a(&c);
  check_model_gradients("(a) mlp [7,5] relu", &c, (st_shape){1, 4, 4}, 11,
                        1.0f);
  config_b(&c);
  check_model_gradients("(b) mlp [6] ln gelu", &c, (st_shape){12, 1, 1}, 12,
                        1.0f);
  config_c(&c);
  check_model_gradients("(c) cnn [4] gn res max [6]", &c, (st_shape){1, 8, 8},
                        13, 1.0f);
  check_residual_block("(c) cnn [4] gn res max [6]", &c, (st_shape){1, 8, 8},
                       23);
  config_d(&c);
  check_model_gradients("(d) cnn [4,4] res avg []", &c, (st_shape){1, 8, 8}, 14,
                        2.0f);
  check_residual_block("(d) cnn [4,4] res avg []", &c, (st_shape){1, 8, 8}, 24);
  config_e(&c);
  check_model_gradients("(e) mlp [6,6,6] ln relu residual", &c,
                        (st_shape){5, 1, 1}, 15, 1.0f);
  check_residual_block("(e) mlp [6,6,6] ln relu residual", &c,
                       (st_shape){5, 1, 1}, 25);
  config_f(&c);
  check_dropout_block(&c);
  check_fine_chunks();
  check_mlp_residual();

  check_fc_mnist();
  check_linear_relu();
  check_kept_outputs();
  check_cnn_counts();
  check_init();
  TH_DONE();
}
