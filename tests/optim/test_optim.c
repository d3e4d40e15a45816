/*
 * test_optim.c — update rules and schedules against closed forms computed
 * here in double precision. The trajectories against PyTorch itself are in
 * tests/exec/test_e2e.c; this file pins each rule's arithmetic on its own.
 */
#include "harness.h"
#include "strata.h"

#include <math.h>
#include <string.h>

/* Heavy-ball SGD, PyTorch convention: v1 = g1, v_t = m v + g (+ wd w);
 * Nesterov uses g + m v. Three steps with known gradients. */
static void test_sgd(int nesterov, float wd) {
  float w[2] = {1.0f, -2.0f}, v[2] = {0, 0};
  double wr[2] = {1.0, -2.0}, vr[2] = {0, 0};
  const float g[3][2] = {{0.5f, -1.0f}, {0.25f, 2.0f}, {-1.0f, 0.125f}};
  const double lr = 0.1, m = 0.9;
  for (int t = 0; t < 3; t++) {
    st_sgd_update(w, v, g[t], 2, (float)lr, (float)m, nesterov, wd, t == 0);
    for (int i = 0; i < 2; i++) {
      double d = g[t][i] + wd * wr[i];
      vr[i] = t == 0 ? d : m * vr[i] + d;
      wr[i] -= lr * (nesterov ? d + m * vr[i] : vr[i]);
    }
  }
  float want[2] = {(float)wr[0], (float)wr[1]};
  /* float vs double arithmetic over 3 steps of 4 operations: < 1e-6 rel. */
  CHECK_CLOSE(nesterov ? "sgd nesterov" : "sgd momentum", w, want, 2, 1e-6,
              1e-6);
}

static void test_adamw(void) {
  float w[2] = {0.5f, -0.25f}, m[2] = {0, 0}, v[2] = {0, 0};
  double wr[2] = {0.5, -0.25}, mr[2] = {0, 0}, vr[2] = {0, 0};
  const float g[4][2] = {
      {0.1f, -0.2f}, {0.3f, 0.1f}, {-0.05f, 0.4f}, {0.2f, -0.3f}};
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  for (int t = 1; t <= 4; t++) {
    st_adamw_update(w, m, v, g[t - 1], 2, (float)lr, (float)b1, (float)b2,
                    (float)eps, (float)wd, t);
    for (int i = 0; i < 2; i++) {
      double gi = g[t - 1][i];
      wr[i] *= 1 - lr * wd;
      mr[i] = b1 * mr[i] + (1 - b1) * gi;
      vr[i] = b2 * vr[i] + (1 - b2) * gi * gi;
      double mhat = mr[i] / (1 - pow(b1, t)), vhat = vr[i] / (1 - pow(b2, t));
      wr[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
  }
  float want[2] = {(float)wr[0], (float)wr[1]};
  /* bias corrections in float (powf) vs double: a few ulps per step. */
  CHECK_CLOSE("adamw", w, want, 2, 1e-5, 1e-6);
  /* The first AdamW step moves every weight by lr (sign of g) plus decay. */
  float w1[1] = {1.0f}, m1[1] = {0}, v1[1] = {0}, g1[1] = {-3.0f};
  st_adamw_update(w1, m1, v1, g1, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
  CHECK(fabsf(w1[0] - 1.01f) < 1e-6f, "adamw first step: %.8f", w1[0]);
}

/* Late in training 1 - beta2^t rounds to 1 in float and adamw_one skips
 * its division by the correction's root (x / 1 is x): one step at t = 1000,
 * beta2 0.95 (0.95^1000 ~ 5e-23), against the double closed form and, bit
 * for bit, against torch's order of float operations with the division
 * written out. v is small enough that eps moves the step by ~10%. */
static void test_adamw_late(void) {
  enum { N = 3 };
  const int64_t t = 1000;
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const float g[N] = {2e-7f, -3e-7f, 0.05f};
  float w[N] = {0.5f, -0.25f, 1.0f}, m[N] = {1e-7f, -1e-7f, 0.01f},
        v[N] = {1e-14f, 4e-14f, 1e-3f};
  float w0[N], m0[N], v0[N], want[N], bits[N];
  memcpy(w0, w, sizeof w);
  memcpy(m0, m, sizeof m);
  memcpy(v0, v, sizeof v);
  st_adamw_update(w, m, v, g, N, lr, b1, b2, eps, wd, t);
  float bc2 = sqrtf(1.0f - powf(b2, (float)t));
  float step = lr / (1.0f - powf(b1, (float)t));
  CHECK(bc2 == 1.0f, "adamw late: the correction rounds to 1 (%.9g)", bc2);
  for (int i = 0; i < N; i++) {
    double mm = 0.9 * m0[i] + 0.1 * g[i],
           vv = 0.95 * v0[i] + 0.05 * g[i] * g[i];
    want[i] = (float)(w0[i] * (1 - 0.01 * 0.1) - 0.01 * mm / (sqrt(vv) + 1e-8));
    float wf = w0[i] * (1.0f - lr * wd);
    float mf = m0[i] * b1 + (1.0f - b1) * g[i];
    float vf = v0[i] * b2 + (1.0f - b2) * (g[i] * g[i]);
    bits[i] = wf - step * (mf / (sqrtf(vf) / bc2 + eps));
  }
  /* float against double over one step: a few ulps */
  CHECK_CLOSE("adamw late step", w, want, N, 1e-6, 1e-9);
  CHECK(memcmp(w, bits, sizeof w) == 0,
        "adamw late step: torch's float order, bit for bit (%.9g %.9g %.9g)",
        w[0], w[1], w[2]);
}

/* Linear weight prediction without momentum (BACKGROUND.md 2: v <- m v +
 * g, so v = g at m = 0; the forward uses w - lr D v): the velocity keeps
 * the step's d = g + wd w, and the prediction is w_new - pk d. It was
 * left 0, so the prediction was w itself: lwp ran as none. Without a
 * prediction (pk 0) the velocity is not written. */
static void test_lwp_no_momentum(void) {
  enum { N = 3 };
  const float lr = 0.1f, wd = 0.01f, pk = 0.1f * 3;
  float w[N] = {0.5f, -0.25f, 1.0f}, g[N] = {0.2f, -0.4f, 0.05f};
  float v[N] = {0, 0, 0}, pred[N], w0[N], g0[N];
  memcpy(w0, w, sizeof w);
  memcpy(g0, g, sizeof g);
  st_optim_rule r;
  st_optim_rule_pb(&r, lr, 0.0f, wd, 3, 0, 5);
  r.pk = pk;
  st_pb_update(NULL, &r, w, g, v, NULL, pred, N);
  int ok = 1;
  for (int i = 0; i < N; i++) {
    float d = g0[i] + wd * w0[i], wn = w0[i] - lr * d;
    ok &= v[i] == d && w[i] == wn && pred[i] == wn - pk * d && g[i] == 0.0f;
  }
  CHECK(ok, "lwp without momentum: v %g %g %g, prediction %g %g %g", v[0], v[1],
        v[2], pred[0], pred[1], pred[2]);
  float v2[N] = {0, 0, 0};
  memcpy(g, g0, sizeof g);
  r.pk = 0.0f;
  st_pb_update(NULL, &r, w, g, v2, NULL, NULL, N);
  CHECK(v2[0] == 0 && v2[1] == 0 && v2[2] == 0,
        "no prediction, no momentum: the velocity written");
}

static void test_schedules(void) {
  st_config c;
  st_config_defaults(&c);
  c.optimizer.lr = 0.1f;
  c.optimizer.min_lr = 0.01f;
  snprintf(c.optimizer.schedule, sizeof c.optimizer.schedule, "constant");
  CHECK(st_lr_at(&c, 0, 100) == 0.1f && st_lr_at(&c, 99, 100) == 0.1f,
        "constant schedule");
  snprintf(c.optimizer.schedule, sizeof c.optimizer.schedule, "cosine");
  CHECK(fabsf(st_lr_at(&c, 0, 100) - 0.1f) < 1e-7f, "cosine start");
  CHECK(fabsf(st_lr_at(&c, 50, 100) - 0.055f) < 1e-6f, "cosine middle %g",
        st_lr_at(&c, 50, 100));
  CHECK(fabsf(st_lr_at(&c, 100, 100) - 0.01f) < 1e-7f, "cosine end");
  snprintf(c.optimizer.schedule, sizeof c.optimizer.schedule, "linear");
  CHECK(fabsf(st_lr_at(&c, 25, 100) - 0.0775f) < 1e-6f, "linear quarter %g",
        st_lr_at(&c, 25, 100));
  /* Past the end (progress > 1, clamped to 1) both stay at min_lr: unclamped,
   * linear at twice the span is 0.01 - 0.09 = -0.08, a negative rate, and
   * cosine at 1.5 spans climbs back to the middle, 0.055. */
  CHECK(st_lr_at(&c, 200, 100) == 0.01f, "linear past the end: %g",
        st_lr_at(&c, 200, 100));
  snprintf(c.optimizer.schedule, sizeof c.optimizer.schedule, "cosine");
  CHECK(st_lr_at(&c, 150, 100) == 0.01f, "cosine past the end: %g",
        st_lr_at(&c, 150, 100));
  snprintf(c.optimizer.schedule, sizeof c.optimizer.schedule, "step");
  c.optimizer.step_size = 30;
  c.optimizer.gamma = 0.5f;
  CHECK(st_lr_at(&c, 29, 100) == 0.1f &&
            fabsf(st_lr_at(&c, 30, 100) - 0.05f) < 1e-8f &&
            fabsf(st_lr_at(&c, 95, 100) - 0.0125f) < 1e-8f,
        "step schedule");
  /* Linear warm-up reaches lr at the last warm-up step, then the schedule
   * runs over the remaining steps. */
  snprintf(c.optimizer.schedule, sizeof c.optimizer.schedule, "cosine");
  c.optimizer.warmup_steps = 10;
  CHECK(fabsf(st_lr_at(&c, 0, 110) - 0.01f) < 1e-7f &&
            fabsf(st_lr_at(&c, 9, 110) - 0.1f) < 1e-7f &&
            fabsf(st_lr_at(&c, 10, 110) - 0.1f) < 1e-7f &&
            fabsf(st_lr_at(&c, 60, 110) - 0.055f) < 1e-6f,
        "warm-up then cosine");
  /* The step schedule counts its steps after the warm-up too (docs/
   * config.md, optimizer.step_size): with 10 warm-up steps and decays
   * every 30, the first decay is at step 40, not 30. */
  snprintf(c.optimizer.schedule, sizeof c.optimizer.schedule, "step");
  CHECK(st_lr_at(&c, 10, 110) == 0.1f && st_lr_at(&c, 39, 110) == 0.1f &&
            fabsf(st_lr_at(&c, 40, 110) - 0.05f) < 1e-8f &&
            fabsf(st_lr_at(&c, 100, 110) - 0.0125f) < 1e-8f,
        "warm-up then step: %g at step 39, %g at 40", st_lr_at(&c, 39, 110),
        st_lr_at(&c, 40, 110));
}

/* st_optim_step (chunked, on a pool) must equal one call of the rule over
 * the whole slab bit for bit, and leave the gradients zeroed. */
static void test_slab_step(const char *kind) {
  enum { N = 100003 }; /* not a multiple of the chunk size */
  st_config c;
  st_config_defaults(&c);
  snprintf(c.optimizer.kind, sizeof c.optimizer.kind, "%s", kind);
  c.optimizer.nesterov = 1;
  c.optimizer.weight_decay = 0.01f;
  int slots = st_optim_state_per_param(&c);
  float *w[2], *g[2], *s[2];
  st_rng rng;
  for (int k = 0; k < 2; k++) {
    w[k] = st_alloc(N * sizeof(float));
    g[k] = st_alloc(N * sizeof(float));
    s[k] = st_alloc((size_t)slots * N * sizeof(float));
  }
  st_pool *pool = st_pool_create(3);
  for (int step = 0; step < 3; step++) {
    st_rng_init(&rng, 7, ST_RNG_DATA, (uint64_t)step);
    for (int i = 0; i < N; i++) {
      float v = st_rng_normal(&rng);
      g[0][i] = g[1][i] = v;
      if (step == 0) w[0][i] = w[1][i] = 0.5f * v;
    }
    st_optim_step(pool, &c, w[0], g[0], s[0], N, 0.01f, step);
    if (slots == 2)
      st_adamw_update(w[1], s[1], s[1] + N, g[1], N, 0.01f, c.optimizer.beta1,
                      c.optimizer.beta2, c.optimizer.eps,
                      c.optimizer.weight_decay, step + 1);
    else
      st_sgd_update(w[1], s[1], g[1], N, 0.01f, c.optimizer.momentum, 1,
                    c.optimizer.weight_decay, step == 0);
  }
  CHECK(memcmp(w[0], w[1], N * sizeof(float)) == 0 &&
            memcmp(s[0], s[1], (size_t)slots * N * sizeof(float)) == 0,
        "%s: chunked pool step differs from the single-call rule", kind);
  int zero = 1;
  for (int i = 0; i < N; i++) zero &= g[0][i] == 0.0f;
  CHECK(zero, "%s: gradients not zeroed by the step", kind);
  st_pool_destroy(pool);
  for (int k = 0; k < 2; k++) {
    st_free(w[k]);
    st_free(g[k]);
    st_free(s[k]);
  }
}

/* st_pb_update, whose loops are specialised per rule (weight decay;
 * plain, spike-compensated or Nesterov momentum; a pipemare delta; a
 * prediction) so they vectorise, against the rule written out here one
 * element at a time in sgd_one's order: the same bits, for every
 * combination, the first step (v <- d) included, over several chunks and
 * a ragged tail. */
/* One element of r's rule written out in sgd_one's order: weight decay,
 * heavy ball (v <- d on the first step), plain / spike-compensated /
 * Nesterov step, then pipemare's delta and the prediction. */
static void rule_by_hand(const st_optim_rule *r, float g, float *w, float *v,
                         float *delta, float *pred) {
  float d = g, old = *w;
  if (r->weight_decay != 0.0f) d = d + r->weight_decay * old;
  *v = r->first_step ? d : r->momentum * *v + d;
  float s = r->nesterov ? d + r->momentum * *v
            : r->sc     ? r->sc_a * *v + r->sc_b * d
                        : *v;
  *w = old - r->lr * s;
  *delta = r->gamma * *delta + (1.0f - r->gamma) * (*w - old);
  *pred = *w - r->pk * *v;
}

static void test_update_paths(void) {
  enum { N = 40013 };
  float *w = st_alloc(N * sizeof(float)), *v = st_alloc(N * sizeof(float));
  float *g = st_alloc(N * sizeof(float)), *de = st_alloc(N * sizeof(float));
  float *p = st_alloc(N * sizeof(float)), *rw = st_alloc(N * sizeof(float));
  float *rv = st_alloc(N * sizeof(float)), *rd = st_alloc(N * sizeof(float));
  float *rp = st_alloc(N * sizeof(float)), *gs = st_alloc(N * sizeof(float));
  st_pool *pool = st_pool_create(2);
  st_rng rng;
  int bad = 0, cases = 0;
  for (int combo = 0; combo < 24; combo++) {
    int wd = combo & 1, kind = combo >> 1 & 3, delta = combo >> 3 & 1,
        pred = combo >> 4 & 1;
    if (kind == 3) continue;
    cases++;
    st_rng_init(&rng, 11, ST_RNG_DATA, (uint64_t)combo);
    for (int i = 0; i < N; i++) {
      rw[i] = w[i] = st_rng_normal(&rng);
      rv[i] = v[i] = rd[i] = de[i] = 0;
    }
    for (int step = 0; step < 3; step++) {
      st_optim_rule r;
      st_optim_rule_pb(&r, 0.05f, 0.9f, wd ? 0.01f : 0.0f, 4, kind == 1, step);
      r.nesterov = kind == 2;
      r.gamma = 0.75f;
      r.pk = 0.2f;
      for (int i = 0; i < N; i++) g[i] = gs[i] = st_rng_normal(&rng);
      st_pb_update(pool, &r, w, g, v, delta ? de : NULL, pred ? p : NULL, N);
      for (int i = 0; i < N; i++) {
        rule_by_hand(&r, gs[i], &rw[i], &rv[i], &rd[i], &rp[i]);
        bad += g[i] != 0.0f;
      }
      bad += memcmp(w, rw, N * sizeof(float)) != 0;
      bad += memcmp(v, rv, N * sizeof(float)) != 0;
      bad += delta && memcmp(de, rd, N * sizeof(float)) != 0;
      bad += pred && memcmp(p, rp, N * sizeof(float)) != 0;
      CHECK(!bad,
            "st_pb_update: weight decay %d, %s momentum, delta %d, "
            "prediction %d, step %d: not sgd_one's bits",
            wd,
            kind == 2   ? "Nesterov"
            : kind == 1 ? "sc"
                        : "plain",
            delta, pred, step);
      bad = 0;
    }
  }
  CHECK(cases == 18, "%d combinations", cases);
  /* the fused batch-1 update: gradient dy_o x_i, never stored; on the
   * pool in bands of 4 rows (16K elements), the last one partial. From
   * step 1 on it also makes the input gradient dx = dy w, band by band
   * with the weights before the update: st_gemm's bits (computed here
   * before the update by hand), and the sum in double within 1e-5. */
  enum { OC = 9, IC = 4001 };
  float dy[OC], *x = gs;
  float *dx = st_alloc(IC * sizeof(float)), *rdx = st_alloc(IC * sizeof(float));
  for (int o = 0; o < OC; o++) dy[o] = 1.0f;
  CHECK(st_row_band(OC, IC) == 4 &&
            st_gemv_then(pool, rdx, dy, rw, OC, IC, NULL, NULL),
        "a 9 x 4001 weight: %d rows a band, not summed band by band",
        st_row_band(OC, IC));
  for (int combo = 0; combo < 12; combo++) {
    int wd = combo & 1, kind = combo >> 1 & 3, pred = combo >> 3 & 1;
    if (kind == 3) continue;
    st_rng_init(&rng, 13, ST_RNG_DATA, (uint64_t)combo);
    for (int i = 0; i < OC * IC; i++) {
      rw[i] = w[i] = st_rng_normal(&rng);
      rv[i] = v[i] = rd[i] = 0;
    }
    for (int step = 0; step < 3; step++) {
      st_optim_rule r;
      st_optim_rule_pb(&r, 0.05f, 0.9f, wd ? 0.01f : 0.0f, 4, kind == 1, step);
      r.nesterov = kind == 2;
      r.pk = 0.2f;
      for (int o = 0; o < OC; o++) dy[o] = st_rng_normal(&rng);
      for (int i = 0; i < IC; i++) x[i] = st_rng_normal(&rng);
      st_gemm(pool, 0, 0, 1, IC, OC, 1.0f, dy, OC, rw, IC, 0.0f, rdx, IC);
      double dx_err = 0;
      for (int i = 0; i < IC; i++) {
        double e = 0, mag = 0;
        for (int o = 0; o < OC; o++) {
          e += (double)dy[o] * rw[o * IC + i];
          mag += fabs((double)dy[o] * rw[o * IC + i]);
        }
        e = fabs(rdx[i] - e) / (mag + 1e-30);
        dx_err = e > dx_err ? e : dx_err;
      }
      st_optim_update_outer(pool, &r, w, v, NULL, dy, x, OC, IC,
                            pred ? p : NULL, step ? dx : NULL);
      CHECK(!step || (!memcmp(dx, rdx, IC * sizeof(float)) && dx_err < 1e-5),
            "st_optim_update_outer: combo %d step %d: dx not st_gemm's bits "
            "(or %.2g from the sum in double)",
            combo, step, dx_err);
      for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
          int k = o * IC + i;
          rule_by_hand(&r, dy[o] * x[i], &rw[k], &rv[k], &rd[k], &rp[k]);
        }
      size_t bytes = (size_t)OC * IC * sizeof(float);
      CHECK(!memcmp(w, rw, bytes) && !memcmp(v, rv, bytes) &&
                (!pred || !memcmp(p, rp, bytes)),
            "st_optim_update_outer: weight decay %d, %s momentum, prediction "
            "%d, step %d: not sgd_one's bits",
            wd,
            kind == 2   ? "Nesterov"
            : kind == 1 ? "sc"
                        : "plain",
            pred, step);
    }
  }
  /* shapes whose input gradient is not summed in bands, made first and
   * then the update: one band (3 x 100), and 22 bands of 3 rows whose
   * partials do not fit the stack (64 x 5000: column tiles for dx, the
   * update in bands); and one summed in 13 bands of 5 rows whose partials
   * do not fit the stack either (64 x 3000: the thread's buffer) */
  const int shapes[3][3] = {{3, 100, 0}, {64, 5000, 0}, {64, 3000, 1}};
  for (int k = 0; k < 3; k++) {
    int oc = shapes[k][0], ic = shapes[k][1], split = shapes[k][2];
    size_t nw = (size_t)oc * ic;
    float *w2 = st_alloc(nw * 4), *v2 = st_alloc(nw * 4),
          *rw2 = st_alloc(nw * 4);
    float *rv2 = st_alloc(nw * 4), *dy2 = st_alloc((size_t)oc * 4);
    float *x2 = st_alloc((size_t)ic * 4), *dx2 = st_alloc((size_t)ic * 4);
    float *rdx2 = st_alloc((size_t)ic * 4), junk[2];
    st_optim_rule r;
    st_optim_rule_pb(&r, 0.05f, 0.9f, 0.0f, 4, 0, 1);
    for (size_t i = 0; i < nw; i++) rw2[i] = w2[i] = st_rng_normal(&rng);
    for (size_t i = 0; i < nw; i++) rv2[i] = v2[i] = st_rng_normal(&rng);
    for (int o = 0; o < oc; o++) dy2[o] = st_rng_normal(&rng);
    for (int i = 0; i < ic; i++) x2[i] = st_rng_normal(&rng);
    CHECK(st_gemv_then(pool, rdx2, dy2, rw2, oc, ic, NULL, NULL) == split,
          "a %d x %d weight %s in bands", oc, ic,
          split ? "not summed" : "summed");
    st_gemm(pool, 0, 0, 1, ic, oc, 1.0f, dy2, oc, rw2, ic, 0.0f, rdx2, ic);
    st_optim_update_outer(pool, &r, w2, v2, NULL, dy2, x2, oc, ic, NULL, dx2);
    for (size_t i = 0; i < nw; i++)
      rule_by_hand(&r, dy2[i / ic] * x2[i % ic], &rw2[i], &rv2[i], &junk[0],
                   &junk[1]);
    CHECK(!memcmp(dx2, rdx2, (size_t)ic * 4) && !memcmp(w2, rw2, nw * 4) &&
              !memcmp(v2, rv2, nw * 4),
          "st_optim_update_outer, %d x %d: dx, w or v not the bits of the "
          "product, then the rule",
          oc, ic);
    float *own[] = {w2, v2, rw2, rv2, dy2, x2, dx2, rdx2};
    for (int f = 0; f < 8; f++) st_free(own[f]);
  }
  st_pool_destroy(pool);
  float *all[] = {w, v, g, de, p, rw, rv, rd, rp, gs, dx, rdx};
  for (int k = 0; k < 12; k++) st_free(all[k]);
}

int main(void) {
  test_update_paths();
  test_slab_step("sgd");
  test_slab_step("adamw");
  test_sgd(0, 0.0f);
  test_sgd(1, 0.0f);
  test_sgd(0, 0.01f);
  test_sgd(1, 0.01f);
  test_adamw();
  test_adamw_late();
  test_lwp_no_momentum();
  test_schedules();
  st_config c;
  st_config_defaults(&c);
  CHECK(st_optim_state_per_param(&c) == 1, "sgd keeps one slot");
  snprintf(c.optimizer.kind, sizeof c.optimizer.kind, "adamw");
  CHECK(st_optim_state_per_param(&c) == 2, "adamw keeps two slots");
  TH_DONE();
}
