/*
 * test_noise.c — the gradient noise scale (BACKGROUND.md 5).
 *  1. The estimator against a closed form: per-sample gradients drawn as
 *     g = G + D z (z standard normal, D diagonal) have true gradient G and
 *     covariance diag(D^2), so B_simple = sum(D^2) / |G|^2 exactly. Batch
 *     means at B_s = 8 and B_b = 64 fed to the estimator must recover it
 *     within 10% (the bound).
 *     The same on a linear-regression problem, whose per-sample gradient
 *     covariance follows from Gaussian moments: B_simple = d (1 +
 *     s^2 / |w - w*|^2) + 1.
 *     The averages' bias correction by hand: one estimate is its own
 *     |G|^2 and tr(S) at any beta, two their beta-weighted mean.
 *     Without replacement from a training set of N (as an epoch draws its
 *     batches), exactly: over every ordered draw of B_b of N = 6 fixed
 *     per-sample gradients, the first B_s the small batch, the estimates'
 *     means are the set's |G|^2 and tr(S) (divisor N - 1) with the
 *     population given, and |G|^2 - tr(S)/N without it.
 *     The squared norm it is fed counts a tied pair of tensors as the one
 *     weight it is: against the norm of the unique parameters' gradient.
 *  2. In training, measuring does not perturb: with the same micro-batch
 *     split, weights with metrics.noise_scale on and off are bit-identical,
 *     and the estimate is finite and positive early in training.
 *  3. Resumed (from a checkpoint file or a file store), the averages go on
 *     from where they were, bit for bit.
 *  4. The squared norms training feeds the estimator (sequential, weight
 *     streaming from memory and from a file, a tied GPT) against those of
 *     the batch's and the first micro-batch's gradients read off plain
 *     SGD's first update at each batch size.
 */
#include "harness.h"
#include "strata.h"

#include "../../src/runtime/runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { DIM = 40, BS = 8, BB = 64, PAIRS = 3000 };

static void test_closed_form(void) {
  double G[DIM], D[DIM], true_g2 = 0, true_trace = 0;
  st_rng rng;
  st_rng_init(&rng, 3, ST_RNG_DATA, 0);
  for (int i = 0; i < DIM; i++) {
    G[i] = 0.5 + 0.5 * st_rng_uniform(&rng); /* |G|^2 ~ 23 */
    D[i] = 2.0 + 3.0 * st_rng_uniform(&rng); /* tr ~ 500 */
    true_g2 += G[i] * G[i];
    true_trace += D[i] * D[i];
  }
  double want = true_trace / true_g2;
  st_noise_scale ns;
  st_noise_scale_init(&ns, 0.999);
  for (int p = 0; p < PAIRS; p++) {
    /* One batch of BB samples; its first BS samples are the small batch,
     * as in training (the first micro-batch inside the batch). */
    double sum_s[DIM] = {0}, sum_b[DIM] = {0};
    for (int s = 0; s < BB; s++)
      for (int i = 0; i < DIM; i++) {
        double g = G[i] + D[i] * st_rng_normal(&rng);
        sum_b[i] += g;
        if (s < BS) sum_s[i] += g;
      }
    double gs2 = 0, gb2 = 0;
    for (int i = 0; i < DIM; i++) {
      gs2 += (sum_s[i] / BS) * (sum_s[i] / BS);
      gb2 += (sum_b[i] / BB) * (sum_b[i] / BB);
    }
    st_noise_scale_add(&ns, gs2, BS, gb2, BB);
  }
  double g2, trace, got = st_noise_scale_value(&ns, &g2, &trace);
  /* 10%: the bound. The EMA (beta 0.999, ~1000 pairs) of these
   * estimates has a relative spread of a few per cent here. */
  CHECK(fabs(got / want - 1) < 0.10,
        "B_simple %.2f, closed form %.2f (|G|^2 %.2f vs %.2f, tr %.1f vs %.1f)",
        got, want, g2, true_g2, trace, true_trace);
  if (getenv("STRATA_TEST_VERBOSE"))
    fprintf(stderr, "  B_simple %.2f vs closed form %.2f\n", got, want);
  /* The averages are bias-corrected as Adam's moments are: after one
   * measurement, or several equal ones, |G|^2 and tr(S) are that
   * measurement's estimates whatever beta, not (1 - beta^n) times them
   * (run.c reports them as noise_g2 and noise_trace). Estimates 5 and 20
   * from gs2 = 5 + 20 / 2 at B_s 2 and gb2 = 5 + 20 / 8 at B_b 8. */
  st_noise_scale early;
  st_noise_scale_init(&early, 0.9);
  for (int n = 1; n <= 3; n++) {
    st_noise_scale_add(&early, 15.0, 2, 7.5, 8);
    double eg2, etr, ev = st_noise_scale_value(&early, &eg2, &etr);
    /* exact in double but for the EMA's roundings: 1e-12 */
    CHECK(fabs(eg2 - 5) < 1e-12 && fabs(etr - 20) < 1e-12 &&
              fabs(ev - 4) < 1e-12,
          "after %d equal measurements: |G|^2 %g (want 5), tr %g (want 20), "
          "B_simple %g (want 4)",
          n, eg2, etr, ev);
  }
  st_noise_scale empty;
  st_noise_scale_init(&empty, 0.99);
  CHECK(isnan(st_noise_scale_value(&empty, NULL, NULL)),
        "no estimate before the first measurement");
  /* a small batch's norm below the large one's: tr(S) = (1 - 4) / (1/1 -
   * 1/4) = -4 < 0 while |G|^2 = (4 * 4 - 1) / 3 = 5 > 0: no scale */
  /* The averages are bias-corrected (Adam's 1 - beta^n): one estimate
   * gives its own |G|^2 and tr(S) at any beta, and two give their
   * beta-weighted mean: with (gs2, bs, gb2, bb) = (2, 1, 1, 4), |G|^2 =
   * (4 - 2) / 3 = 2/3 and tr(S) = 1 / (1 - 1/4) = 4/3; with (3, 1, 1.5,
   * 4), 1 and 2. At beta 0.9 the second pair weighs 1 / 1.9 of the mean:
   * |G|^2 = (0.9 * 2/3 + 1) / 1.9, tr(S) = (0.9 * 4/3 + 2) / 1.9. */
  st_noise_scale ema;
  st_noise_scale_init(&ema, 0.9);
  st_noise_scale_add(&ema, 2.0, 1, 1.0, 4);
  double eg2, etr, ev = st_noise_scale_value(&ema, &eg2, &etr);
  CHECK(fabs(eg2 - 2.0 / 3) < 1e-12 && fabs(etr - 4.0 / 3) < 1e-12 &&
            fabs(ev - 2) < 1e-12,
        "one estimate at beta 0.9: |G|^2 %.15g (want 2/3), tr %.15g (want "
        "4/3), B %.15g (want 2)",
        eg2, etr, ev);
  st_noise_scale_add(&ema, 3.0, 1, 1.5, 4);
  st_noise_scale_value(&ema, &eg2, &etr);
  CHECK(fabs(eg2 - (0.9 * 2.0 / 3 + 1) / 1.9) < 1e-12 &&
            fabs(etr - (0.9 * 4.0 / 3 + 2) / 1.9) < 1e-12,
        "two estimates at beta 0.9: |G|^2 %.15g (want %.15g), tr %.15g "
        "(want %.15g)",
        eg2, (0.9 * 2.0 / 3 + 1) / 1.9, etr, (0.9 * 4.0 / 3 + 2) / 1.9);
  st_noise_scale neg;
  st_noise_scale_init(&neg, 0);
  st_noise_scale_add(&neg, 1.0, 1, 4.0, 4);
  double ng2, ntr, nv = st_noise_scale_value(&neg, &ng2, &ntr);
  CHECK(isnan(nv) && fabs(ng2 - 5) < 1e-12 && fabs(ntr + 4) < 1e-12,
        "a negative tr(S) estimate gives no scale: got %g (|G|^2 %g, tr %g)",
        nv, ng2, ntr);
  /* tr(S) = 0 (both batches' norms equal: no noise) is an estimate, not
   * noise: B_simple = 0, any batch as good as a larger one. (2, 1, 2, 4):
   * |G|^2 = (8 - 2) / 3 = 2, tr(S) = 0 / (3/4) = 0, exactly. */
  st_noise_scale quiet;
  st_noise_scale_init(&quiet, 0.9);
  st_noise_scale_add(&quiet, 2.0, 1, 2.0, 4);
  double qg2, qtr, qv = st_noise_scale_value(&quiet, &qg2, &qtr);
  CHECK(qv == 0 && qg2 == 2 && qtr == 0,
        "a zero tr(S) estimate gives B_simple 0: got %g (|G|^2 %g, tr %g)", qv,
        qg2, qtr);
}

/* A linear-regression problem: loss 1/2 (w.x - y)^2 with x ~ N(0, I_d) and
 * y = w*.x + e, e ~ N(0, s^2). At weights w, with r = w - w*, a sample's
 * gradient is (r.x - e) x: its mean is G = r, and (Gaussian fourth
 * moments) E[g g^T] = (|r|^2 + s^2) I + 2 r r^T, so the per-sample
 * covariance is S = (|r|^2 + s^2) I + r r^T and
 *   B_simple = tr(S) / |G|^2 = d (1 + s^2 / |r|^2) + 1.
 * The estimator, fed the gradients of batches drawn from it, must give
 * that within 10%. */
static void test_linear_regression(void) {
  enum { D2 = 20 };
  const double s = 0.5;
  double r[D2], r2 = 0;
  st_rng rng;
  st_rng_init(&rng, 11, ST_RNG_DATA, 0);
  for (int i = 0; i < D2; i++) {
    r[i] = 0.1 + 0.2 * st_rng_uniform(&rng); /* |r|^2 ~ 0.9 */
    r2 += r[i] * r[i];
  }
  double want = D2 * (1 + s * s / r2) + 1;
  st_noise_scale ns;
  st_noise_scale_init(&ns, 0.999);
  for (int p = 0; p < PAIRS; p++) {
    double sum_s[D2] = {0}, sum_b[D2] = {0};
    for (int k = 0; k < BB; k++) {
      double x[D2], rx = 0;
      for (int i = 0; i < D2; i++) {
        x[i] = st_rng_normal(&rng);
        rx += r[i] * x[i];
      }
      double res = rx - s * st_rng_normal(&rng);
      for (int i = 0; i < D2; i++) {
        sum_b[i] += res * x[i];
        if (k < BS) sum_s[i] += res * x[i];
      }
    }
    double gs2 = 0, gb2 = 0;
    for (int i = 0; i < D2; i++) {
      gs2 += (sum_s[i] / BS) * (sum_s[i] / BS);
      gb2 += (sum_b[i] / BB) * (sum_b[i] / BB);
    }
    st_noise_scale_add(&ns, gs2, BS, gb2, BB);
  }
  double got = st_noise_scale_value(&ns, NULL, NULL);
  if (getenv("STRATA_TEST_VERBOSE"))
    fprintf(stderr, "  linear regression: B_simple %.2f vs %.2f\n", got, want);
  CHECK(fabs(got / want - 1) < 0.10,
        "linear regression: B_simple %.2f, closed form d (1 + s^2/|r|^2) + 1 "
        "= %.2f",
        got, want);
}

/* st_trainer_grad_sq on a GPT whose head shares the token embedding: the
 * model's weight is one tensor, its gradient the sum of the two copies',
 * so the norm is that of the sum, not the sum of the two norms (which
 * overstates |G|^2 and understates B_simple by the cross term). */
static void test_without_replacement(void) {
  enum { N = 6, D3 = 3, SMALL = 2, BIG = 4 };
  static const double g[N][D3] = {{1.0, -2.0, 0.5},  {3.0, 1.0, -1.0},
                                  {-0.5, 0.25, 2.0}, {2.0, 2.0, 2.0},
                                  {0.0, -1.5, 1.0},  {4.0, -0.75, -3.0}};
  double G[D3] = {0}, g2 = 0, trace = 0;
  for (int i = 0; i < N; i++)
    for (int d = 0; d < D3; d++) G[d] += g[i][d] / N;
  for (int d = 0; d < D3; d++) g2 += G[d] * G[d];
  for (int i = 0; i < N; i++)
    for (int d = 0; d < D3; d++) trace += (g[i][d] - G[d]) * (g[i][d] - G[d]);
  trace /= N - 1;
  for (int population = 0; population <= N; population += N) {
    double sum_g2 = 0, sum_trace = 0;
    int draws = 0;
    for (int a = 0; a < N; a++)
      for (int b = 0; b < N; b++)
        for (int c = 0; c < N; c++)
          for (int e = 0; e < N; e++) {
            int pick[BIG] = {a, b, c, e};
            if (a == b || a == c || a == e || b == c || b == e || c == e)
              continue;
            double ms[D3] = {0}, mb[D3] = {0}, gs2 = 0, gb2 = 0;
            for (int k = 0; k < BIG; k++)
              for (int d = 0; d < D3; d++) {
                mb[d] += g[pick[k]][d] / BIG;
                if (k < SMALL) ms[d] += g[pick[k]][d] / SMALL;
              }
            for (int d = 0; d < D3; d++)
              gs2 += ms[d] * ms[d], gb2 += mb[d] * mb[d];
            st_noise_scale ns;
            st_noise_scale_init(&ns, 0); /* each draw's own estimates */
            ns.population = population;
            st_noise_scale_add(&ns, gs2, SMALL, gb2, BIG);
            double eg2, etrace;
            st_noise_scale_value(&ns, &eg2, &etrace);
            sum_g2 += eg2, sum_trace += etrace, draws++;
          }
    double want = population ? g2 : g2 - trace / N;
    CHECK(draws == 360 && fabs(sum_g2 / draws - want) < 1e-12 * trace,
          "population %d: mean |G|^2 estimate %.15g over %d draws, want %.15g",
          population, sum_g2 / draws, draws, want);
    CHECK(fabs(sum_trace / draws - trace) < 1e-12 * trace,
          "population %d: mean tr(S) estimate %.15g, want %.15g", population,
          sum_trace / draws, trace);
  }
}

static void test_tied_norm(void) {
  st_config c;
  st_config_defaults(&c);
  const char *sets[] = {"model.kind=gpt",  "model.context=4", "model.layers=1",
                        "model.width=8",   "model.heads=1",   "model.vocab=16",
                        "model.tied=true", "model.dropout=0"};
  st_error err = {0};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    CHECK(st_config_set(&c, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
  st_model *m = NULL;
  if (st_model_create(&m, &c, (st_shape){1, 4, 1}, &err)) {
    CHECK(0, "tied gpt: %s", err.msg);
    return;
  }
  size_t n = m->n_params;
  float *g = malloc(n * sizeof *g);
  double *unique = malloc(n * sizeof *unique), want = 0;
  st_rng rng;
  st_rng_init(&rng, 5, ST_RNG_DATA, 0);
  for (size_t i = 0; i < n; i++) unique[i] = g[i] = st_rng_normal(&rng);
  int ties = 0;
  for (int b = 0; b < m->n_blocks; b++)
    for (int t = 0; t < m->blocks[b].n_tensors; t++) {
      const st_tensor_info *ti = &m->blocks[b].tensors[t];
      if (ti->tie < 0) continue;
      ties++;
      size_t copy = m->blocks[b].param_off + ti->offset;
      for (size_t k = 0; k < ti->numel; k++) {
        unique[ti->tie + k] += unique[copy + k];
        unique[copy + k] = 0;
      }
    }
  for (size_t i = 0; i < n; i++) want += unique[i] * unique[i];
  st_trainer_view v = {.model = m, .grads = g};
  double got = st_trainer_grad_sq(&v);
  /* sums of ~2000 squares in double, in another order: 1e-12 relative */
  CHECK(ties == 1 && fabs(got - want) <= 1e-12 * want,
        "tied gpt (%d tied tensors): |g|^2 %.15g, of the unique parameters "
        "%.15g",
        ties, got, want);
  free(g);
  free(unique);
  st_model_destroy(m);
}

/* The trainings' config: batch 32 in micro-batches of 8. */
static void small_config(st_config *c, int64_t steps) {
  st_config_defaults(c);
  c->data.train_limit = 2000;
  c->data.test_limit = 100;
  c->train.batch = 32;
  c->train.steps = steps;
  c->execution.micro_batch = 8;
  c->optimizer.lr = 0.02f;
  snprintf(c->metrics.progress, sizeof c->metrics.progress, "off");
}

static void test_training(void) {
  st_config c;
  small_config(&c, 40);
  st_error err = {0};
  st_trainer *off = NULL, *on = NULL;
  CHECK(st_trainer_create(&off, &c, NULL, &err) == 0, "%s", err.msg);
  c.metrics.noise_scale = 1;
  c.metrics.noise_ema = 0.9f;
  CHECK(st_trainer_create(&on, &c, NULL, &err) == 0, "%s", err.msg);
  if (!off || !on) return;
  double loss;
  for (int s = 0; s < 40; s++) {
    st_trainer_step(off, &loss, &err);
    st_trainer_step(on, &loss, &err);
  }
  size_t np = st_trainer_model(on)->n_params;
  CHECK(memcmp(st_trainer_params(on), st_trainer_params(off),
               np * sizeof(float)) == 0,
        "measuring the noise scale changed the weights");
  CHECK(st_trainer_noise(off) == NULL, "noise estimator present when off");
  double b = st_trainer_noise(on)
                 ? st_noise_scale_value(st_trainer_noise(on), NULL, NULL)
                 : NAN;
  CHECK(isfinite(b) && b > 0, "B_simple after 40 steps: %g", b);
  st_trainer_destroy(off);
  st_trainer_destroy(on);
  /* batch 1 has no second size */
  c.train.batch = 1;
  c.execution.micro_batch = 0;
  CHECK(st_config_validate(&c, &err) == ST_ECONFIG &&
            strstr(err.msg, "metrics.noise_scale"),
        "batch 1 with the noise scale: %s", err.msg);
}

/* The noise scale's averages and their count, bit for bit. */
static int same_noise(const st_noise_scale *a, const st_noise_scale *b) {
  return a && b && memcmp(&a->g2, &b->g2, sizeof a->g2) == 0 &&
         memcmp(&a->trace, &b->trace, sizeof a->trace) == 0 &&
         memcmp(&a->weight, &b->weight, sizeof a->weight) == 0 && a->n == b->n;
}

static st_trainer *steps(const st_config *c, int n, st_error *err) {
  st_trainer *t = NULL;
  double loss;
  if (st_trainer_create(&t, c, NULL, err)) return NULL;
  for (int s = 0; s < n; s++)
    if (st_trainer_step(t, &loss, err)) {
      st_trainer_destroy(t);
      return NULL;
    }
  return t;
}

/* 3. Resumed, the averages go on from where they were: a run stopped
 * after 10 of 24 steps and resumed, from a checkpoint file or from a file
 * store (which commits them with every step), reports what the
 * uninterrupted run does, bit for bit; a checkpoint without them starts
 * them afresh. */
static void test_resume(void) {
  static char dir[] = "/tmp/strata_test_noise_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp");
    return;
  }
  st_config c;
  small_config(&c, 24);
  c.metrics.noise_scale = 1;
  c.metrics.noise_ema = 0.9f;
  char path[ST_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
  for (int store = 0; store < 2; store++) {
    const char *what = store ? "a file store" : "a checkpoint";
    if (store) {
      snprintf(c.execution.mode, sizeof c.execution.mode, "weight_streaming");
      snprintf(c.execution.store, sizeof c.execution.store, "file");
      snprintf(c.execution.store_path, sizeof c.execution.store_path,
               "%s/whole.strata", dir);
    }
    st_error err = {0};
    st_trainer *whole = steps(&c, 24, &err), *part = NULL, *rest = NULL;
    CHECK(whole, "%s: the uninterrupted run: %s", what, err.msg);
    if (store)
      snprintf(c.execution.store_path, sizeof c.execution.store_path,
               "%s/part.strata", dir);
    part = steps(&c, 10, &err);
    int rc = part ? 0 : -1;
    if (!rc)
      rc = store ? st_trainer_sync(part, &err)
                 : st_trainer_save(part, path, &err);
    st_trainer_destroy(part);
    if (!rc && st_trainer_create(&rest, &c, NULL, &err) == 0 && !store)
      rc = st_trainer_load(rest, path, 0, &err);
    double loss;
    rc = rc || !rest ? -1 : 0;
    CHECK(!rc && st_trainer_pos(rest)->step == 10 &&
              st_trainer_noise(rest)->n == 10,
          "%s: resumed at step %lld with %lld measurements: %s", what,
          rest ? (long long)st_trainer_pos(rest)->step : -1LL,
          rest ? (long long)st_trainer_noise(rest)->n : -1LL, err.msg);
    for (int s = 10; !rc && s < 24; s++)
      rc = st_trainer_step(rest, &loss, &err);
    if (whole && !rc)
      CHECK(same_noise(st_trainer_noise(whole), st_trainer_noise(rest)),
            "%s: resumed at step 10, the noise averages at step 24 are "
            "%.17g %.17g %.17g (%lld), uninterrupted %.17g %.17g %.17g "
            "(%lld)",
            what, st_trainer_noise(rest)->g2, st_trainer_noise(rest)->trace,
            st_trainer_noise(rest)->weight,
            (long long)st_trainer_noise(rest)->n, st_trainer_noise(whole)->g2,
            st_trainer_noise(whole)->trace, st_trainer_noise(whole)->weight,
            (long long)st_trainer_noise(whole)->n);
    st_trainer_destroy(whole);
    st_trainer_destroy(rest);
  }
  /* a checkpoint of a run that did not measure: the averages start afresh
   * (and the first measurement after it is its own estimate) */
  snprintf(c.execution.mode, sizeof c.execution.mode, "sequential");
  snprintf(c.execution.store, sizeof c.execution.store, "memory");
  c.metrics.noise_scale = 0;
  st_error err = {0};
  st_trainer *off = steps(&c, 10, &err), *on = NULL;
  int rc = off ? st_trainer_save(off, path, &err) : -1;
  c.metrics.noise_scale = 1;
  if (!rc) rc = st_trainer_create(&on, &c, NULL, &err);
  if (!rc) rc = st_trainer_load(on, path, 0, &err);
  CHECK(!rc && st_trainer_noise(on)->n == 0 &&
            isnan(st_noise_scale_value(st_trainer_noise(on), NULL, NULL)),
        "a checkpoint without the averages: %s", err.msg);
  st_trainer_destroy(off);
  st_trainer_destroy(on);
  unlink(path);
  char store_file[ST_PATH_MAX + 32];
  snprintf(store_file, sizeof store_file, "%s/whole.strata", dir);
  unlink(store_file);
  snprintf(store_file, sizeof store_file, "%s/part.strata", dir);
  unlink(store_file);
  rmdir(dir);
}

/* The norms training feeds the estimator, against gradients taken from the
 * updates themselves: plain SGD (no momentum, weight decay or dropout)
 * moves the weights by lr G on its first step, so |w1 - w0|^2 / lr^2 is
 * the squared norm of the batch's mean gradient. A run at batch BB whose
 * first micro-batch is BS samples measures (gs2, gb2); a run at batch BB
 * and one at batch BS (the same first BS samples, from the same initial
 * weights) give |G_b|^2 and |G_s|^2 independently. With metrics.noise_ema
 * 0 the estimator holds the one step's |G|^2 and tr(S), from which gs2 =
 * |G|^2 + tr(S) (1/BS - 1/N) and gb2 = |G|^2 + tr(S) (1/BB - 1/N), N the
 * training set's samples (windows for the GPT). In the sequential mode,
 * the two halves of the batch (no micro_batch set), and weight streaming
 * from a memory and a file store. A tied GPT counts its tied weight once:
 * the copy's update mirrors its source's. */
static double first_step_norm(const st_config *c, int batch, double lr) {
  st_config b = *c;
  b.train.batch = batch;
  b.execution.micro_batch = 0;
  b.metrics.noise_scale = 0;
  snprintf(b.execution.store, sizeof b.execution.store, "memory");
  st_error err = {0};
  st_trainer *t = NULL;
  double loss, sum = NAN;
  if (st_trainer_create(&t, &b, NULL, &err) == 0) {
    const st_model *m = st_trainer_model(t);
    size_t n = m->n_params;
    float *w0 = malloc(n * sizeof *w0);
    memcpy(w0, st_trainer_params(t), n * sizeof *w0);
    if (st_trainer_step(t, &loss, &err) == 0) {
      const float *w1 = st_trainer_params(t);
      sum = 0;
      for (int i = 0; i < m->n_blocks; i++)
        for (int k = 0; k < m->blocks[i].n_tensors; k++) {
          const st_tensor_info *ti = &m->blocks[i].tensors[k];
          if (ti->tie >= 0) continue; /* its source's update */
          size_t at = m->blocks[i].param_off + ti->offset;
          for (size_t e = 0; e < ti->numel; e++) {
            double d = ((double)w1[at + e] - w0[at + e]) / lr;
            sum += d * d;
          }
        }
    }
    free(w0);
  }
  CHECK(isfinite(sum), "batch %d: %s", batch, err.msg);
  st_trainer_destroy(t);
  return sum;
}

static void check_fed_norms(const char *what, st_config c, int bs, int bb) {
  const double lr = 0.5;
  c.optimizer.lr = (float)lr;
  c.optimizer.momentum = 0;
  c.optimizer.nesterov = 0;
  c.optimizer.weight_decay = 0;
  c.model.dropout = 0;
  c.train.batch = bb;
  c.metrics.noise_scale = 1;
  c.metrics.noise_ema = 0;
  snprintf(c.metrics.progress, sizeof c.metrics.progress, "off");
  st_error err = {0};
  st_trainer *t = NULL;
  double loss, g2 = NAN, trace = NAN, n = 0;
  CHECK(st_trainer_create(&t, &c, NULL, &err) == 0, "%s: %s", what, err.msg);
  if (t && st_trainer_step(t, &loss, &err) == 0) {
    st_noise_scale_value(st_trainer_noise(t), &g2, &trace);
    n = (double)st_trainer_noise(t)->population;
  }
  st_trainer_destroy(t);
  if (c.execution.store_path[0]) unlink(c.execution.store_path);
  /* the training set's N, drawn without replacement: E|G_B|^2 = |G|^2 +
   * tr(S) (1/B - 1/N) (noise_scale.c) */
  double bytes;
  int want_n = -1;
  CHECK(st_data_footprint(&c, &bytes, &want_n, &err) == 0 && n == want_n,
        "%s: population %.0f, want the training samples, %d", what, n, want_n);
  double gs2 = g2 + trace * (1.0 / bs - 1.0 / n),
         gb2 = g2 + trace * (1.0 / bb - 1.0 / n);
  double want_s = first_step_norm(&c, bs, lr),
         want_b = first_step_norm(&c, bb, lr);
  /* each update w - lr g is rounded to the weights' float, and the runs
   * sum the batch in other orders: 4e-9 relative measured, 1e-6 allowed.
   * A wrong B_s, or a norm scaled by any factor but 1, is off by 10% or
   * more. */
  CHECK(fabs(gs2 / want_s - 1) < 1e-6 && fabs(gb2 / want_b - 1) < 1e-6,
        "%s: the estimator was fed |G_%d|^2 %.9g and |G_%d|^2 %.9g; the "
        "updates of batch %d and %d give %.9g and %.9g",
        what, bs, gs2, bb, gb2, bs, bb, want_s, want_b);
}

static void test_fed_norms(void) {
  st_config c;
  st_config_defaults(&c);
  const char *sets[] = {"data.dataset=synthetic", "data.train_limit=256",
                        "data.test_limit=32", "model.hidden=[32,32]",
                        "train.threads=2"};
  st_error err = {0};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
    CHECK(st_config_set(&c, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
  check_fed_norms("sequential, halves", c, 16, 32);
  st_config mb = c;
  mb.execution.micro_batch = 8;
  check_fed_norms("sequential, micro-batch 8", mb, 8, 32);
  st_config ws = mb;
  snprintf(ws.execution.mode, sizeof ws.execution.mode, "weight_streaming");
  check_fed_norms("weight streaming, memory store", ws, 8, 32);
  snprintf(ws.execution.store, sizeof ws.execution.store, "file");
  char path[64];
  snprintf(path, sizeof path, "/tmp/strata-noise-%d.strata", (int)getpid());
  snprintf(ws.execution.store_path, sizeof ws.execution.store_path, "%s", path);
  check_fed_norms("weight streaming, file store", ws, 8, 32);
  st_config g;
  st_config_defaults(&g);
  const char *gsets[] = {"model.kind=gpt",
                         "data.dataset=text",
                         "data.path=tests/fixtures/gpt_corpus.txt",
                         "model.context=8",
                         "model.layers=1",
                         "model.heads=2",
                         "model.width=16",
                         "model.tied=true",
                         "optimizer.kind=sgd",
                         "train.threads=2"};
  for (size_t i = 0; i < sizeof gsets / sizeof *gsets; i++)
    CHECK(st_config_set(&g, gsets[i], &err) == 0, "%s: %s", gsets[i], err.msg);
  check_fed_norms("tied gpt", g, 4, 8);
}

int main(void) {
  test_closed_form();
  test_linear_regression();
  test_without_replacement();
  test_tied_norm();
  test_training();
  test_resume();
  test_fed_norms();
  TH_DONE();
}
