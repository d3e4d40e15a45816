/*
 * optim.c — update rules on a parameter slab, written once and used by every
 * mode: SGD with momentum/Nesterov (PyTorch's convention: velocity without
 * dampening, L2 weight decay added to the gradient) and AdamW (decoupled
 * weight decay, bias-corrected moments), plus learning-rate schedules.
 * Operation order mirrors torch.optim (1.13, single-tensor path) so that
 * trajectories follow PyTorch's to fp32 rounding.
 */
#include "strata.h"

#include <math.h>
#include <string.h>

/* The rules, once, one element at a time. Every path below — the
 * reference calls, the chunked slab step and the fused batch-1 update —
 * runs these, so they agree bit for bit by construction. */
static inline void sgd_one(const st_optim_rule *r, float *w, float *v,
                           float g) {
  float d = g;
  if (r->weight_decay != 0.0f) d = d + r->weight_decay * *w;
  if (r->momentum != 0.0f) {
    /* torch starts the buffer as a copy of the first gradient */
    *v = r->first_step ? d : r->momentum * *v + d;
    d = r->nesterov ? d + r->momentum * *v
        : r->sc     ? r->sc_a * *v + r->sc_b * d
                    : *v;
  } else if (r->pk != 0.0f) {
    /* v = 0 v + d (BACKGROUND.md 2): linear weight prediction's velocity
     * without momentum, w - pk v then the last step extended; left 0, the
     * prediction was the weights themselves, lwp the same as none */
    *v = d;
  }
  *w = *w - r->lr * d;
}

static inline void adamw_one(const st_optim_rule *r, float *w, float *m,
                             float *v, float g) {
  *w *= r->decay;
  *m = *m * r->beta1 + (1.0f - r->beta1) * g;
  *v = *v * r->beta2 + (1.0f - r->beta2) * (g * g);
  /* x / 1 is x: once beta2^t no longer shows in 1 - beta2^t (from t = 338 at
   * beta2 0.95, t = 17,321 at 0.999) the division is skipped, the same
   * bits for a third of the divider's work. The branch is the loops'
   * invariant: GCC makes a loop of each. st_adamw_update on 1M floats, one
   * thread, best of 60 alternating: 0.61-0.62 ns an element against
   * 0.70-0.71 (Intel Xeon VM of docs/bench.md, 2026-11-30). */
  float root = sqrtf(*v);
  float denom = (r->bc2_sqrt == 1.0f ? root : root / r->bc2_sqrt) + r->eps;
  *w = *w - r->step_size * (*m / denom);
}

/* AdamW's per-step constants, in torch's order of operations. */
static void adamw_constants(st_optim_rule *r, int64_t t) {
  r->decay = 1.0f - r->lr * r->weight_decay;
  r->bc2_sqrt = sqrtf(1.0f - powf(r->beta2, (float)t));
  r->step_size = r->lr / (1.0f - powf(r->beta1, (float)t));
}

void st_sgd_update(float *restrict w, float *restrict v,
                   const float *restrict g, size_t n, float lr, float momentum,
                   int nesterov, float weight_decay, int first_step) {
  const st_optim_rule r = {.nesterov = nesterov,
                           .first_step = first_step,
                           .lr = lr,
                           .momentum = momentum,
                           .weight_decay = weight_decay};
  for (size_t i = 0; i < n; i++) sgd_one(&r, &w[i], &v[i], g[i]);
}

void st_adamw_update(float *restrict w, float *restrict m, float *restrict v,
                     const float *restrict g, size_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int64_t t) {
  st_optim_rule r = {.adamw = 1,
                     .lr = lr,
                     .weight_decay = weight_decay,
                     .beta1 = beta1,
                     .beta2 = beta2,
                     .eps = eps};
  adamw_constants(&r, t);
  for (size_t i = 0; i < n; i++) adamw_one(&r, &w[i], &m[i], &v[i], g[i]);
}

void st_optim_rule_init(st_optim_rule *r, const st_config *cfg, float lr,
                        int64_t step) {
  memset(r, 0, sizeof *r);
  r->adamw = strcmp(cfg->optimizer.kind, "adamw") == 0;
  r->lr = lr;
  r->weight_decay = cfg->optimizer.weight_decay;
  r->momentum = cfg->optimizer.momentum;
  r->nesterov = cfg->optimizer.nesterov;
  r->first_step = step == 0;
  r->beta1 = cfg->optimizer.beta1;
  r->beta2 = cfg->optimizer.beta2;
  r->eps = cfg->optimizer.eps;
  adamw_constants(r, step + 1);
}

/* p[i] = w[i] - k v[i]: predict_chunk's expression, so the folded
 * prediction has its bits. */
static inline float predicted(float w, float k, float v) { return w - k * v; }

void st_optim_update_vec(const st_optim_rule *rule, float *restrict w,
                         float *restrict s0, float *restrict s1,
                         const float *restrict g, size_t n, float *restrict p) {
  const st_optim_rule r = *rule; /* a local copy: provably not aliased */
  if (r.adamw) {
    for (size_t i = 0; i < n; i++) adamw_one(&r, &w[i], &s0[i], &s1[i], g[i]);
  } else if (p) {
    for (size_t i = 0; i < n; i++) {
      sgd_one(&r, &w[i], &s0[i], g[i]);
      p[i] = predicted(w[i], r.pk, s0[i]);
    }
  } else {
    for (size_t i = 0; i < n; i++) sgd_one(&r, &w[i], &s0[i], g[i]);
  }
}

static int heavy_ball(const st_optim_rule *r, float *restrict w,
                      float *restrict g, float *restrict v,
                      float *restrict delta, float *restrict pred, size_t len,
                      const float *restrict x, float dy);

typedef struct outer_job {
  const st_optim_rule *r;
  float *w, *s0, *s1, *p;
  const float *dy, *x;
  int OC, IC, rows; /* rows: a task's band of output rows (st_row_band) */
  int bf16;         /* train.precision: bf16 (st_gemm_bf16_on) */
} outer_job;

/* Row o's elements [i0, i0 + n) with gradient d x[i - i0]. Each element's
 * update reads and writes only its own w, state and prediction. */
static void outer_segment(const st_optim_rule *rp, const outer_job *j, int o,
                          int i0, int n, const float *restrict x, float d) {
  const st_optim_rule r = *rp;
  size_t at = (size_t)o * j->IC + i0;
  float *wr = j->w + at, *ar = j->s0 + at;
  float *pr = j->p ? j->p + at : NULL;
  if (heavy_ball(&r, wr, NULL, ar, NULL, pr, (size_t)n, x, d)) return;
  if (r.adamw) {
    float *br = j->s1 + at;
    for (int i = 0; i < n; i++) adamw_one(&r, &wr[i], &ar[i], &br[i], d * x[i]);
  } else if (pr) {
    for (int i = 0; i < n; i++) {
      sgd_one(&r, &wr[i], &ar[i], d * x[i]);
      pr[i] = predicted(wr[i], r.pk, ar[i]);
    }
  } else {
    for (int i = 0; i < n; i++) sgd_one(&r, &wr[i], &ar[i], d * x[i]);
  }
}

/* bf16: x rounded this many elements at a time, on the stack */
enum { OUTER_CHUNK = 256 };

/* Output rows [o0, o1), so the bands may run in any order on any thread
 * and the bits stay those of one pass. In bf16 dy x^T is a product like
 * any other (docs/bf16.md): dy[o] and x rounded as st_gemm_bf16 rounds
 * them, whose products are exact in fp32, the bits of the unfused
 * backward's product. */
static void outer_rows(void *arg, int o0, int o1) {
  const outer_job *j = arg;
  if (!j->bf16) {
    for (int o = o0; o < o1; o++)
      outer_segment(j->r, j, o, 0, j->IC, j->x, j->dy[o]);
    return;
  }
  float xr[OUTER_CHUNK];
  for (int i0 = 0; i0 < j->IC; i0 += OUTER_CHUNK) {
    int n = j->IC - i0 < OUTER_CHUNK ? j->IC - i0 : OUTER_CHUNK;
    st_bf16_round_as_gemm(j->x + i0, xr, (size_t)n);
    for (int o = o0; o < o1; o++) {
      float d;
      st_bf16_round_as_gemm(&j->dy[o], &d, 1);
      outer_segment(j->r, j, o, i0, n, xr, d);
    }
  }
}

static void outer_band(void *arg, int task) {
  const outer_job *j = arg;
  int o0 = task * j->rows;
  outer_rows(arg, o0, o0 + j->rows < j->OC ? o0 + j->rows : j->OC);
}

void st_optim_update_outer(st_pool *pool, const st_optim_rule *rule,
                           float *restrict w, float *restrict s0,
                           float *restrict s1, const float *restrict dy,
                           const float *restrict x, int OC, int IC,
                           float *restrict p, float *restrict dx) {
  /* bands of rows as the layer's one-row products cut them (st_row_band),
   * so each core updates the rows its forward read: a 3136 x 256 layer's
   * update streams 13 MB at batch 1, half a step on one core */
  outer_job j = {.r = rule,
                 .w = w,
                 .s0 = s0,
                 .s1 = s1,
                 .p = p,
                 .dy = dy,
                 .x = x,
                 .OC = OC,
                 .IC = IC,
                 .rows = st_row_band(OC, IC),
                 .bf16 = st_gemm_bf16_on()};
  /* the input gradient with the weights before the update: in the same
   * pass over each band where the shape allows, else first */
  if (dx && st_gemv_then(pool, dx, dy, w, OC, IC, outer_rows, &j)) return;
  if (dx) st_gemm(pool, 0, 0, 1, IC, OC, 1.0f, dy, OC, w, IC, 0.0f, dx, IC);
  st_pool_for(pool, (OC + j.rows - 1) / j.rows, outer_band, &j);
}

/* 16K floats: 64 KB per array, so a chunk's weights, gradients and state
 * stay in L2 while it is updated; each gradient element is cleared in the
 * same pass (a separate memset was 10% of a batch-1 step). */
enum { CHUNK = 1 << 14 };

typedef struct step_job {
  st_optim_rule rule;
  float *w, *g, *s0, *s1;
  size_t n;
} step_job;

/* sgd_one with momentum past the first step (every SGD update but the
 * first), its choices fixed where it is called (weight decay; plain,
 * spike-compensated or Nesterov; pipelined backprop's delta and
 * prediction), so each loop vectorises: with the choices tested per
 * element the loops stayed scalar, 70% of a pipemare or stash run. The
 * same operations in the same order as sgd_one, so the same bits (C's ISO
 * mode does not contract a * b + c into an FMA). */
enum { PLAIN, SC, NESTEROV };
static inline __attribute__((always_inline)) void
heavy_ball_loop(const st_optim_rule *rp, float *restrict w, float *restrict g,
                float *restrict v, float *restrict delta, float *restrict pred,
                size_t len, const float *restrict x, float dy, int outer,
                int wd, int kind, int has_delta, int has_pred) {
  const float lr = rp->lr, m = rp->momentum, lambda = rp->weight_decay;
  const float a = rp->sc_a, b = rp->sc_b, gamma = rp->gamma, pk = rp->pk;
  for (size_t i = 0; i < len; i++) {
    float d, old = w[i];
    if (outer) { /* the batch-1 gradient dy x_i, never stored */
      d = dy * x[i];
    } else {
      d = g[i];
      g[i] = 0.0f;
    }
    if (wd) d = d + lambda * old;
    float vi = m * v[i] + d;
    v[i] = vi;
    float step = kind == NESTEROV ? d + m * vi
                 : kind == SC     ? a * vi + b * d
                                  : vi;
    float wi = old - lr * step;
    w[i] = wi;
    if (has_delta) delta[i] = gamma * delta[i] + (1.0f - gamma) * (wi - old);
    if (has_pred) pred[i] = predicted(wi, pk, vi);
  }
}

/* The loop for r's choices, on the gradient g (zeroed) or, with x, dy
 * x_i; 0 (nothing done) for a rule it does not cover (AdamW, no momentum,
 * the first step: sgd_one's loop). */
static int heavy_ball(const st_optim_rule *r, float *restrict w,
                      float *restrict g, float *restrict v,
                      float *restrict delta, float *restrict pred, size_t len,
                      const float *restrict x, float dy) {
  if (r->adamw || r->momentum == 0.0f || r->first_step) return 0;
  int kind = r->nesterov ? NESTEROV : r->sc ? SC : PLAIN;
#define CASE(wd, k, de, pr)                                                    \
  if ((r->weight_decay != 0.0f) == (wd) && kind == (k) &&                      \
      (delta != NULL) == (de) && (pred != NULL) == (pr)) {                     \
    if (x)                                                                     \
      heavy_ball_loop(r, w, g, v, delta, pred, len, x, dy, 1, wd, k, de, pr);  \
    else                                                                       \
      heavy_ball_loop(r, w, g, v, delta, pred, len, x, dy, 0, wd, k, de, pr);  \
    return 1;                                                                  \
  }
#define KINDS(wd, de, pr)                                                      \
  do {                                                                         \
    CASE(wd, PLAIN, de, pr) CASE(wd, SC, de, pr) CASE(wd, NESTEROV, de, pr)    \
  } while (0)
  KINDS(0, 0, 0);
  KINDS(0, 0, 1);
  KINDS(0, 1, 0);
  KINDS(0, 1, 1);
  KINDS(1, 0, 0);
  KINDS(1, 0, 1);
  KINDS(1, 1, 0);
  KINDS(1, 1, 1);
#undef KINDS
#undef CASE
  return 0;
}

static void step_chunk(void *arg, int task) {
  const step_job *j = arg;
  const st_optim_rule r = j->rule;
  size_t lo = (size_t)task * CHUNK, len = j->n - lo < CHUNK ? j->n - lo : CHUNK;
  float *restrict w = j->w + lo, *restrict g = j->g + lo;
  float *restrict s0 = j->s0 + lo;
  if (r.adamw) {
    float *restrict s1 = j->s1 + lo;
    for (size_t i = 0; i < len; i++) {
      float gi = g[i];
      g[i] = 0.0f;
      adamw_one(&r, &w[i], &s0[i], &s1[i], gi);
    }
  } else if (!heavy_ball(&r, w, g, s0, NULL, NULL, len, NULL, 0.0f)) {
    for (size_t i = 0; i < len; i++) {
      float gi = g[i];
      g[i] = 0.0f;
      sgd_one(&r, &w[i], &s0[i], gi);
    }
  }
}

void st_optim_step_range(st_pool *pool, const st_config *cfg, float *params,
                         float *grads, float *opt, size_t slot_stride, size_t n,
                         float lr, int64_t step) {
  step_job j = {
      .w = params, .g = grads, .s0 = opt, .s1 = opt + slot_stride, .n = n};
  st_optim_rule_init(&j.rule, cfg, lr, step);
  st_pool_for(pool, (int)((n + CHUNK - 1) / CHUNK), step_chunk, &j);
}

void st_optim_step(st_pool *pool, const st_config *cfg, float *params,
                   float *grads, float *opt, size_t n, float lr, int64_t step) {
  st_optim_step_range(pool, cfg, params, grads, opt, n, n, lr, step);
}

/* Pipelined backprop (BACKGROUND.md 2): sgd_one, whose spike compensation
 * applies a*v + b*d in place of v; with a pipemare delta, the change the
 * update made is folded into it; with a prediction, w - pk v is written. */
typedef struct pb_job {
  st_optim_rule r;
  float *w, *g, *v, *delta, *pred;
  const float *src;
  size_t n;
} pb_job;

static void pb_chunk(void *arg, int task) {
  const pb_job *j = arg;
  const st_optim_rule r = j->r;
  size_t lo = (size_t)task * CHUNK, len = j->n - lo < CHUNK ? j->n - lo : CHUNK;
  float *restrict w = j->w + lo, *restrict g = j->g + lo,
                  *restrict v = j->v + lo;
  float *restrict delta = j->delta ? j->delta + lo : NULL;
  float *restrict pred = j->pred ? j->pred + lo : NULL;
  if (heavy_ball(&r, w, g, v, delta, pred, len, NULL, 0.0f)) return;
  for (size_t i = 0; i < len; i++) {
    float gi = g[i], old = w[i];
    g[i] = 0.0f;
    sgd_one(&r, &w[i], &v[i], gi);
    if (delta) delta[i] = r.gamma * delta[i] + (1.0f - r.gamma) * (w[i] - old);
    if (pred) pred[i] = predicted(w[i], r.pk, v[i]);
  }
}

void st_pb_update(st_pool *pool, const st_optim_rule *r, float *w, float *g,
                  float *v, float *delta, float *pred, size_t n) {
  pb_job j = {
      .r = *r, .w = w, .g = g, .v = v, .delta = delta, .pred = pred, .n = n};
  st_pool_for(pool, (int)((n + CHUNK - 1) / CHUNK), pb_chunk, &j);
}

static void predict_chunk(void *arg, int task) {
  const pb_job *j = arg;
  size_t lo = (size_t)task * CHUNK, len = j->n - lo < CHUNK ? j->n - lo : CHUNK;
  float *restrict out = j->w + lo;
  const float *restrict w = j->src + lo, *restrict v = j->v + lo;
  const float k = j->r.lr;
  for (size_t i = 0; i < len; i++) out[i] = predicted(w[i], k, v[i]);
}

void st_pb_predict(st_pool *pool, float *out, const float *w, const float *v,
                   float k, size_t n) {
  pb_job j = {.r = {.lr = k}, .w = out, .src = w, .v = (float *)v, .n = n};
  st_pool_for(pool, (int)((n + CHUNK - 1) / CHUNK), predict_chunk, &j);
}

float st_pb_pipemare_lr(float lr, int delay, int64_t updates, int warmup) {
  if (delay <= 1 || warmup <= 0) return lr;
  double done = (double)updates / (double)warmup;
  if (done > 1) done = 1;
  return (float)(lr * pow((double)delay, -(1.0 - done)));
}

void st_optim_rule_pb(st_optim_rule *r, float lr, float momentum,
                      float weight_decay, int delay, int sc, int64_t updates) {
  memset(r, 0, sizeof *r);
  r->lr = lr;
  r->momentum = momentum;
  r->weight_decay = weight_decay;
  r->first_step = updates == 0;
  r->sc = sc && delay > 0 && momentum != 0.0f;
  if (r->sc) {
    double mD = pow((double)momentum, delay);
    r->sc_a = (float)mD;
    r->sc_b = (float)((1.0 - mD) / (1.0 - (double)momentum));
  }
}

float st_lr_at(const st_config *cfg, int64_t step, int64_t total_steps) {
  double lr = cfg->optimizer.lr, floor_lr = cfg->optimizer.min_lr;
  int64_t warm = cfg->optimizer.warmup_steps;
  if (step < warm) return (float)(lr * (double)(step + 1) / (double)warm);
  int64_t span = total_steps - warm;
  double progress = span > 0 ? (double)(step - warm) / (double)span : 1.0;
  if (progress > 1) progress = 1;
  const char *s = cfg->optimizer.schedule;
  if (strcmp(s, "cosine") == 0)
    return (float)(floor_lr +
                   (lr - floor_lr) * 0.5 * (1.0 + cos(M_PI * progress)));
  if (strcmp(s, "linear") == 0)
    return (float)(floor_lr + (lr - floor_lr) * (1.0 - progress));
  if (strcmp(s, "step") == 0 && cfg->optimizer.step_size > 0)
    return (float)(lr *
                   pow(cfg->optimizer.gamma,
                       (double)((step - warm) / cfg->optimizer.step_size)));
  return (float)lr;
}

void st_optim_scale_batch(float *lr, float *momentum, float *min_lr,
                          int reference, int batch) {
  double r = (double)batch / reference, m = *momentum;
  double m_hat = m > 0 ? pow(m, r) : 0;
  /* (1 - m^r) / (1 - m) -> r as m -> 1: the momentum-free factor is r */
  double f = m > 0 && m < 1 ? r * (1 - m_hat) / (1 - m) : r;
  *lr = (float)(*lr * f);
  if (min_lr) *min_lr = (float)(*min_lr * f);
  *momentum = (float)m_hat;
}

int st_optim_state_per_param(const st_config *cfg) {
  return strcmp(cfg->optimizer.kind, "adamw") == 0 ? 2 : 1;
}
