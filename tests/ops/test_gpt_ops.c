/*
 * test_gpt_ops.c — the GPT kernels (src/ops/embedding.c, src/ops/attention.c)
 * against independent oracles:
 *   1. PyTorch fixtures (tests/fixtures/ops_{embedding,attention}.safetensors,
 *      written by tests/ref/gen_gpt_ops.py): float64 results from the same
 *      float32 inputs, so any difference is our own fp32 rounding;
 *   2. central finite differences of L = sum(out * dout) in double;
 *   3. a naive attention in double (plain loops, full T x T) at lengths that
 *      cross the kernel's row blocks.
 * And by properties: causality (a later position's k or v leaves earlier
 * outputs bit-identical), bitwise independence of the pool's thread count,
 * the documented scatter-add order of the embedding backward, rotary's
 * inverse, and the cost functions' closed forms.
 *
 * Runs from the repository root. Set STRATA_TEST_VERBOSE=1 to print the
 * worst difference of every comparison.
 */
#include "harness.h"
#include "strata.h"

#include <stdint.h>
#include <string.h>

#define REGENERATE "/usr/bin/python3 tests/ref/gen_gpt_ops.py"

#include "op_fixtures.h"

/* ------------------------------------------------------------ embedding */

typedef struct embedding_ctx {
  float *out, *wte, *wpe, *dout;
  int32_t *tokens;
  int B, T, C;
} embedding_ctx;

static double embedding_loss(void *p) {
  embedding_ctx *c = p;
  st_embedding_forward(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
  return dot(c->out, c->dout, (size_t)c->B * c->T * c->C);
}

/* Tolerances. out = wte + wpe is one fp32 addition of fp32 inputs, rounded
 * once like the float64 reference: exact. dwpe sums B = 2 rows, one
 * rounding: exact too. A dwte row sums up to 4 dout rows (token 7 appears 3
 * times, 3 and 10 twice), so 2 extra roundings of partial sums of size ~2:
 * ~2.5e-7 absolute; 1e-6 relative above a floor of 1 leaves 4x. */
#define EMB_DWTE_TOL 1e-6

static void test_embedding(void) {
  st_safetensors *st = open_fixture("embedding");
  if (!st) return;
  const char *cases[] = {"learned", "nowpe"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 6);
    int B = d[0], T = d[1], C = d[2], V = d[3], T_max = d[4], has_wpe = d[5];
    size_t nout = (size_t)B * T * C, nwte = (size_t)V * C,
           nwpe = (size_t)T_max * C;
    int32_t *tokens = fx_i32(st, c, "tokens", (size_t)B * T);
    float *wte = fx(st, c, "wte", nwte), *wpe = fx(st, c, "wpe", nwpe);
    float *dout = fx(st, c, "dout", nout);
    float *out = new_floats(nout), *dwte = new_floats(nwte);
    float *dwpe = new_floats(nwpe);
    float *use_wpe = has_wpe ? wpe : NULL;
    st_embedding_forward(out, tokens, wte, use_wpe, B, T, C);
    st_embedding_backward(dwte, has_wpe ? dwpe : NULL, dout, tokens, B, T, C);
    label(what, sizeof what, "embedding", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", nout), nout, 0.0, 1e-30);
    label(what, sizeof what, "embedding", c, "dwte");
    CHECK_CLOSE(what, dwte, fx(st, c, "dwte", nwte), nwte, EMB_DWTE_TOL, 1.0);
    if (has_wpe) { /* rows T .. T_max-1 must stay zero */
      label(what, sizeof what, "embedding", c, "dwpe");
      CHECK_CLOSE(what, dwpe, fx(st, c, "dwpe", nwpe), nwpe, 0.0, 1e-30);
    }
    embedding_ctx ctx = {new_floats(nout), wte, use_wpe, dout, tokens, B, T, C};
    label(what, sizeof what, "embedding", c, "fd dwte");
    /* row 7 (the token seen 3 times), column 2 */
    check_fd(what, wte, nwte, dwte, embedding_loss, &ctx, 7 * (size_t)C + 2);
    if (has_wpe) {
      label(what, sizeof what, "embedding", c, "fd dwpe");
      check_fd(what, wpe, (size_t)T * C, dwpe, embedding_loss, &ctx, 1);
    }
    release_all();
  }
  st_safetensors_destroy(st);
}

/* The backward adds into what the gradients hold, visiting (b, t) in order:
 * bitwise equal to that loop written out, every run. */
static void test_embedding_determinism(void) {
  enum { B = 4, T = 32, C = 24, V = 5 }; /* 128 tokens over 5 rows */
  int32_t tokens[B * T];
  st_rng rng;
  st_rng_init(&rng, 41, ST_RNG_DATA, 0);
  for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)st_rng_below(&rng, V);
  float *dout = random_floats((size_t)B * T * C, 42, 1.0f);
  float *prior_wte = random_floats((size_t)V * C, 43, 0.1f);
  float *prior_wpe = random_floats((size_t)T * C, 44, 0.1f);
  float *want_wte = copy_floats(prior_wte, (size_t)V * C);
  float *want_wpe = copy_floats(prior_wpe, (size_t)T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < C; i++) {
        float g = dout[((size_t)b * T + t) * C + i];
        want_wte[(size_t)tokens[b * T + t] * C + i] += g;
        want_wpe[(size_t)t * C + i] += g;
      }
  for (int run = 0; run < 2; run++) {
    float *dwte = copy_floats(prior_wte, (size_t)V * C);
    float *dwpe = copy_floats(prior_wpe, (size_t)T * C);
    uint64_t allocs = st_alloc_count();
    st_embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    CHECK(st_alloc_count() == allocs, "embedding allocated inside the kernel");
    CHECK(memcmp(dwte, want_wte, (size_t)V * C * 4) == 0,
          "embedding dwte (run %d) differs from adding in (b, t) order", run);
    CHECK(memcmp(dwpe, want_wpe, (size_t)T * C * 4) == 0,
          "embedding dwpe (run %d) differs from adding in (b, t) order", run);
  }
  release_all();
}

/* ------------------------------------------------------------ attention */

typedef struct attention_ctx {
  float *out, *att, *qkv, *dout;
  int B, T, C, NH, rotary_dim; /* rotary_dim 0: attention alone */
} attention_ctx;

static double attention_loss(void *p) {
  attention_ctx *c = p; /* att: the forward's scratch here */
  st_attention_forward(NULL, c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
  return dot(c->out, c->dout, (size_t)c->B * c->T * c->C);
}

/* The forward, and the probabilities it computes (which it does not keep)
 * into att, as st_attention_probs gives them. */
static void forward_with_probs(st_pool *pool, float *out, float *att,
                               const float *qkv, int B, int T, int C, int NH) {
  float *scratch = new_floats(st_attention_scratch_floats(B, T, C, NH));
  st_attention_forward(pool, out, scratch, qkv, B, T, C, NH);
  st_attention_probs(pool, att, scratch, qkv, B, T, C, NH);
}

/* Tolerances against float64 references, for unit-normal qkv and dout.
 * exp turns an absolute error of a score s into the same relative error of
 * its probability, and s carries the rounding of a dot product of hs terms
 * (~sqrt(hs) * 6e-8 of its unit-sized partial sums: 5e-7 at hs = 64) plus
 * that of s - max (an ulp of up to ~10: 6e-7); expf and the normaliser add
 * an ulp each. That is ~1.2e-6 at worst, seen at T = 200, hs = 64; 5e-6
 * relative (floor 1e-6, far below 1/T) leaves a margin of 4x.
 * Outputs and gradients are sums of T products of such probabilities with
 * unit-sized values, and dS = A (dP - r) cancels within a row: errors a few
 * 1e-7 of the row's unit-sized terms. 1e-5 relative above a floor of 1, the
 * GEMM tolerance of test_ops.c, leaves a margin of 10x or more. */
#define ATT_PROB_TOL 5e-6
#define ATT_PROB_FLOOR 1e-6
#define ATT_TOL 1e-5
#define ATT_FLOOR 1.0

static void test_attention_fixtures(void) {
  st_safetensors *st = open_fixture("attention");
  if (!st) return;
  const char *cases[] = {"small", "long"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 4);
    int B = d[0], T = d[1], C = d[2], NH = d[3];
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
           natt = (size_t)B * NH * T * T;
    float *qkv = fx(st, c, "qkv", nqkv), *dout = fx(st, c, "dout", nout);
    float *out = new_floats(nout), *att = new_floats(natt);
    float *dqkv = random_floats(nqkv, 1, 1.0f); /* written, not added to */
    float *scratch = new_floats(st_attention_scratch_floats(B, T, C, NH));
    forward_with_probs(NULL, out, att, qkv, B, T, C, NH);
    st_attention_backward(NULL, dqkv, dout, qkv, scratch, B, T, C, NH);
    label(what, sizeof what, "attention", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", nout), nout, ATT_TOL, ATT_FLOOR);
    label(what, sizeof what, "attention", c, "att");
    CHECK_CLOSE(what, att, fx(st, c, "att", natt), natt, ATT_PROB_TOL,
                ATT_PROB_FLOOR);
    label(what, sizeof what, "attention", c, "dqkv");
    CHECK_CLOSE(what, dqkv, fx(st, c, "dqkv", nqkv), nqkv, ATT_TOL, ATT_FLOOR);
    int masked_zero = 1; /* exact zeros above the diagonal, as PyTorch */
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
      for (int s = (int)(r % T) + 1; s < T; s++)
        masked_zero &= att[r * T + s] == 0.0f;
    CHECK(masked_zero, "attention %s: att not zero above the diagonal", c);
    attention_ctx ctx = {new_floats(nout),
                         new_floats(st_attention_scratch_floats(B, T, C, NH)),
                         qkv,
                         dout,
                         B,
                         T,
                         C,
                         NH,
                         0};
    /* one element each of q, k and v of the last sample's last head */
    size_t last = ((size_t)(B - 1) * T + T / 2) * 3 * C + (C - 1);
    label(what, sizeof what, "attention", c, "fd dq");
    check_fd(what, qkv, nqkv, dqkv, attention_loss, &ctx, last);
    label(what, sizeof what, "attention", c, "fd dk");
    check_fd(what, qkv, nqkv, dqkv, attention_loss, &ctx, last + C);
    label(what, sizeof what, "attention", c, "fd dv");
    check_fd(what, qkv, nqkv, dqkv, attention_loss, &ctx, last + 2 * C);
    release_all();
  }
  st_safetensors_destroy(st);
}

/* The reference path: attention in double with plain loops over the full
 * T x T (no blocks, no GEMM), forward and backward. */
static void naive_attention(double *out, double *att, double *dqkv,
                            const float *qkv, const float *dout, int B, int T,
                            int C, int NH) {
  int hs = C / NH, ld = 3 * C;
  double scale = 1.0 / sqrt(hs);
  double *dp = new_doubles((size_t)T);
  memset(dqkv, 0, sizeof(double) * (size_t)B * T * ld);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs;
      const float *k = q + C, *v = q + 2 * C;
      double *dq = dqkv + (size_t)b * T * ld + (size_t)h * hs;
      double *dk = dq + C, *dv = dq + 2 * C;
      double *a = att + ((size_t)b * NH + h) * T * T;
      for (int t = 0; t < T; t++) {
        double *row = a + (size_t)t * T, max = -INFINITY, sum = 0;
        for (int s = 0; s < T; s++) {
          double x = 0;
          for (int i = 0; i < hs; i++)
            x += (double)q[(size_t)t * ld + i] * k[(size_t)s * ld + i];
          row[s] = s <= t ? x * scale : -INFINITY;
          if (row[s] > max) max = row[s];
        }
        for (int s = 0; s < T; s++) sum += row[s] = exp(row[s] - max);
        for (int s = 0; s < T; s++) row[s] /= sum;
        for (int i = 0; i < hs; i++) {
          double y = 0;
          for (int s = 0; s < T; s++) y += row[s] * v[(size_t)s * ld + i];
          out[((size_t)b * T + t) * C + (size_t)h * hs + i] = y;
        }
        /* backward of row t */
        const float *dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
        double r = 0;
        for (int s = 0; s < T; s++) {
          dp[s] = 0;
          for (int i = 0; i < hs; i++)
            dp[s] += (double)dy[i] * v[(size_t)s * ld + i];
          r += row[s] * dp[s];
        }
        for (int s = 0; s < T; s++) {
          double ds = row[s] * (dp[s] - r) * scale;
          for (int i = 0; i < hs; i++) {
            dq[(size_t)t * ld + i] += ds * k[(size_t)s * ld + i];
            dk[(size_t)s * ld + i] += ds * q[(size_t)t * ld + i];
            dv[(size_t)s * ld + i] += row[s] * dy[i];
          }
        }
      }
    }
}

/* The forward (and its probabilities) and backward of qkv against
 * naive_attention's float64, at the tolerances above. */
static void check_naive(const char *name, const char *c, const float *qkv,
                        const float *dout, int B, int T, int C, int NH) {
  size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
         natt = (size_t)B * NH * T * T;
  char what[128];
  float *out = new_floats(nout), *att = new_floats(natt);
  float *dqkv = new_floats(nqkv);
  float *scratch = new_floats(st_attention_scratch_floats(B, T, C, NH));
  double *ref_out = new_doubles(nout), *ref_att = new_doubles(natt);
  double *ref_dqkv = new_doubles(nqkv);
  forward_with_probs(NULL, out, att, qkv, B, T, C, NH);
  st_attention_backward(NULL, dqkv, dout, qkv, scratch, B, T, C, NH);
  naive_attention(ref_out, ref_att, ref_dqkv, qkv, dout, B, T, C, NH);
  label(what, sizeof what, name, c, "out");
  CHECK_CLOSE(what, out, to_floats(ref_out, nout), nout, ATT_TOL, ATT_FLOOR);
  label(what, sizeof what, name, c, "att");
  CHECK_CLOSE(what, att, to_floats(ref_att, natt), natt, ATT_PROB_TOL,
              ATT_PROB_FLOOR);
  label(what, sizeof what, name, c, "dqkv");
  CHECK_CLOSE(what, dqkv, to_floats(ref_dqkv, nqkv), nqkv, ATT_TOL, ATT_FLOOR);
}

/* Lengths around the kernel's 32-row blocks: one row, one partial block,
 * exactly one and two blocks, two blocks and one row, several blocks with a
 * ragged end; head sizes 1 to 64. */
static void test_attention_naive(void) {
  struct {
    int B, T, C, NH;
  } shapes[] = {{1, 1, 4, 1},   {2, 5, 6, 6},    {1, 32, 16, 2}, {1, 64, 32, 2},
                {2, 65, 24, 3}, {1, 150, 64, 4}, {1, 200, 64, 1}};
  for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
    int B = shapes[k].B, T = shapes[k].T, C = shapes[k].C, NH = shapes[k].NH;
    char c[48];
    snprintf(c, sizeof c, "B%d T%d C%d NH%d", B, T, C, NH);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    check_naive("attention naive", c, random_floats(nqkv, 50 + k, 1.0f),
                random_floats(nout, 60 + k, 1.0f), B, T, C, NH);
    release_all();
  }
}

/* Scores far apart (q and k of size 6: scores of spread ~36, rows whose
 * exponents span hundreds) take the exp's clamp at -87 and must still give
 * finite probabilities that sum to 1 and outputs as the naive reference's.
 * Every score now carries ~36x the rounding of the unit case, and so do the
 * probabilities and, relative to their own size, the outputs and gradients:
 * 36 times the unit tolerances (observed ~3e-5 against 1.8e-4 and 3.6e-4),
 * which still fails on any real error (a wrong exp, a missed max). */
static void test_attention_large_scores(void) {
  enum { B = 1, T = 100, C = 32, NH = 2 };
  size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
         natt = (size_t)B * NH * T * T;
  float *qkv = random_floats(nqkv, 75, 6.0f);
  float *dout = random_floats(nout, 76, 1.0f);
  float *out = new_floats(nout), *att = new_floats(natt);
  float *dqkv = new_floats(nqkv);
  float *scratch = new_floats(st_attention_scratch_floats(B, T, C, NH));
  double *ref_out = new_doubles(nout), *ref_att = new_doubles(natt);
  double *ref_dqkv = new_doubles(nqkv);
  forward_with_probs(NULL, out, att, qkv, B, T, C, NH);
  st_attention_backward(NULL, dqkv, dout, qkv, scratch, B, T, C, NH);
  naive_attention(ref_out, ref_att, ref_dqkv, qkv, dout, B, T, C, NH);
  double worst_sum = 0;
  int finite = 1, tiny = 0;
  for (size_t r = 0; r < (size_t)B * NH * T; r++) {
    double sum = 0;
    for (int s = 0; s < T; s++) {
      float p = att[r * T + s];
      finite &= isfinite(p);
      tiny += s <= (int)(r % T) && ref_att[r * T + s] < 1e-38;
      sum += p;
    }
    if (fabs(sum - 1.0) > worst_sum) worst_sum = fabs(sum - 1.0);
  }
  CHECK(tiny > 0, "large scores: no score reached the exp's clamp");
  CHECK(finite, "large scores: a probability is not finite");
  /* n probabilities each rounded to an ulp, summed: 1e-6 is ~8 ulp */
  CHECK(worst_sum <= 1e-6, "large scores: a row sums to 1 +- %.3g", worst_sum);
  CHECK_CLOSE("attention large scores out", out, to_floats(ref_out, nout), nout,
              36 * ATT_TOL, ATT_FLOOR);
  CHECK_CLOSE("attention large scores att", att, to_floats(ref_att, natt), natt,
              36 * ATT_PROB_TOL, ATT_PROB_FLOOR);
  CHECK_CLOSE("attention large scores dqkv", dqkv, to_floats(ref_dqkv, nqkv),
              nqkv, 36 * ATT_TOL, ATT_FLOOR);
  release_all();
}

/* A row whose last visible score beats every earlier one by more than the
 * exp's range (~88): the max must include that score, or exp of the others
 * minus a too-small max overflows its clamp. The spread of the test above
 * is ~36, so a max search that skipped the last score of a row passed it
 * (row 2 of T = 3 gave probabilities (0.5, 0.5, -1e-38) for (0, 0, 1)).
 * Here q = k = a (1, ..., 1) at the last position, zero before it: that
 * row's diagonal score a^2 sqrt(hs) = 98 against 0, and every length of
 * row from 1 to T (the vector loops' tails). */
static void test_attention_dominant_diagonal(void) {
  enum { B = 1, C = 4, NH = 1 };
  for (int T = 1; T <= 20; T++) {
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = random_floats(nqkv, 90 + (uint64_t)T, 1.0f);
    for (int t = 0; t < T; t++)
      for (int i = 0; i < 2 * C; i++) /* q and k */
        qkv[(size_t)t * 3 * C + i] = t == T - 1 ? 7.0f : 0.0f;
    char c[16];
    snprintf(c, sizeof c, "T%d", T);
    check_naive("attention dominant diagonal", c, qkv,
                random_floats(nout, 130 + (uint64_t)T, 1.0f), B, T, C, NH);
    release_all();
  }
}

/* Changing position p's k and v (every head) must leave outputs and
 * probabilities at positions < p bit-identical, and change position p. */
static void test_attention_causality(void) {
  enum { B = 2, T = 150, C = 32, NH = 2 };
  size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
         natt = (size_t)B * NH * T * T;
  float *qkv = random_floats(nqkv, 70, 1.0f);
  float *out = new_floats(nout), *att = new_floats(natt);
  float *out2 = new_floats(nout), *att2 = new_floats(natt);
  forward_with_probs(NULL, out, att, qkv, B, T, C, NH);
  const int positions[] = {1, 31, 32, 63, 64, 100, T - 1};
  for (int k = 0; k < 7; k++) {
    int p = positions[k];
    float *changed = copy_floats(qkv, nqkv);
    for (int b = 0; b < B; b++)
      for (int i = C; i < 3 * C; i++) /* k and v of position p */
        changed[((size_t)b * T + p) * 3 * C + i] += 0.5f + (float)(i % 7);
    forward_with_probs(NULL, out2, att2, changed, B, T, C, NH);
    int same = 1, moved = 0;
    for (int b = 0; b < B; b++) {
      size_t at = (size_t)b * T * C;
      same &= memcmp(out + at, out2 + at, (size_t)p * C * 4) == 0;
      moved |= memcmp(out + at + (size_t)p * C, out2 + at + (size_t)p * C,
                      (size_t)C * 4) != 0;
      for (int h = 0; h < NH; h++) {
        size_t a = ((size_t)b * NH + h) * T * T;
        same &= memcmp(att + a, att2 + a, (size_t)p * T * 4) == 0;
      }
    }
    CHECK(same, "attention: changing position %d altered an earlier output", p);
    CHECK(moved, "attention: changing position %d left it unchanged", p);
  }
  release_all();
}

/* Bitwise equality for no pool, 1 and 3 threads, forward and backward; the
 * second shape crosses row blocks. */
static void test_attention_determinism(void) {
  struct {
    int B, T, C, NH;
  } shapes[] = {{2, 64, 64, 4}, {2, 130, 32, 2}};
  st_pool *pools[3] = {NULL, st_pool_create(1), st_pool_create(3)};
  CHECK(pools[1] && pools[2], "st_pool_create failed");
  if (!pools[1] || !pools[2]) goto done;
  for (int k = 0; k < 2; k++) {
    int B = shapes[k].B, T = shapes[k].T, C = shapes[k].C, NH = shapes[k].NH;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
           natt = (size_t)B * NH * T * T;
    float *qkv = random_floats(nqkv, 80 + k, 1.0f);
    float *dout = random_floats(nout, 90 + k, 1.0f);
    float *out[3], *att[3], *dqkv[3];
    for (int p = 0; p < 3; p++) {
      float *scratch = new_floats(st_attention_scratch_floats(B, T, C, NH));
      out[p] = new_floats(nout), att[p] = new_floats(natt);
      dqkv[p] = new_floats(nqkv);
      uint64_t allocs = st_alloc_count();
      forward_with_probs(pools[p], out[p], att[p], qkv, B, T, C, NH);
      st_attention_backward(pools[p], dqkv[p], dout, qkv, scratch, B, T, C, NH);
      CHECK(st_alloc_count() == allocs,
            "attention allocated inside the kernel");
    }
    for (int p = 1; p < 3; p++) {
      const char *who = p == 1 ? "1 thread" : "3 threads";
      CHECK(memcmp(out[0], out[p], nout * 4) == 0,
            "attention shape %d out: %s differs from no pool", k, who);
      CHECK(memcmp(att[0], att[p], natt * 4) == 0,
            "attention shape %d att: %s differs from no pool", k, who);
      CHECK(memcmp(dqkv[0], dqkv[p], nqkv * 4) == 0,
            "attention shape %d dqkv: %s differs from no pool", k, who);
    }
    release_all();
  }
done:
  st_pool_destroy(pools[1]);
  st_pool_destroy(pools[2]);
}

/* Under bf16 each task packs its head's keys and values once for the
 * products that take them (st_gemm_bf16_panels): the same bits as the
 * products of the definition one element at a time (st_bf16_set_plain,
 * which test_gemm_bf16 holds to it), at an odd length, head sizes under
 * one 32-column panel and over, and row blocks crossed; not fp32's (so that
 * bf16 ran); and nothing allocated once a shape has run. */
static void test_attention_bf16(void) {
  struct {
    int B, T, C, NH;
  } shapes[] = {{2, 77, 96, 3},
                {1, 160, 128, 2},
                {3, 33, 48, 2},
                {1, 1030, 16, 1}}; /* past one K block: values unpacked */
  int flush = st_fp_flush();
  st_fp_set_flush(1); /* the instruction's bits are the definition's so */
  st_pool *pool = st_pool_create(2);
  CHECK(pool, "st_pool_create failed");
  for (int k = 0; pool && k < 4; k++) {
    int B = shapes[k].B, T = shapes[k].T, C = shapes[k].C, NH = shapes[k].NH;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
           natt = (size_t)B * NH * T * T;
    float *qkv = random_floats(nqkv, 100 + k, 1.0f);
    float *dout = random_floats(nout, 110 + k, 1.0f);
    float *scratch = new_floats(st_attention_scratch_floats(B, T, C, NH));
    float *out[3], *att[3], *dqkv[3];
    for (int r = 0; r < 3; r++) { /* bf16, bf16 one element at a time, fp32 */
      out[r] = new_floats(nout), att[r] = new_floats(natt);
      dqkv[r] = new_floats(nqkv);
      st_gemm_set_bf16(r < 2);
      st_bf16_set_plain(r == 1);
      forward_with_probs(pool, out[r], att[r], qkv, B, T, C, NH);
      st_attention_backward(pool, dqkv[r], dout, qkv, scratch, B, T, C, NH);
    }
    st_bf16_set_plain(0);
    st_gemm_set_bf16(0);
    CHECK(memcmp(out[0], out[1], nout * 4) == 0 &&
              memcmp(att[0], att[1], natt * 4) == 0 &&
              memcmp(dqkv[0], dqkv[1], nqkv * 4) == 0,
          "bf16 attention, shape %d: not the definition's bits", k);
    CHECK(memcmp(out[0], out[2], nout * 4) != 0 &&
              memcmp(dqkv[0], dqkv[2], nqkv * 4) != 0,
          "bf16 attention, shape %d: fp32's bits", k);
    st_gemm_set_bf16(1); /* one thread, so that it has seen every product */
    for (int again = 0; again < 2; again++) {
      uint64_t allocs = st_alloc_count();
      forward_with_probs(NULL, out[2], att[2], qkv, B, T, C, NH);
      st_attention_backward(NULL, dqkv[2], dout, qkv, scratch, B, T, C, NH);
      CHECK(!again || st_alloc_count() == allocs,
            "bf16 attention allocated once its shape had run");
    }
    st_gemm_set_bf16(0);
    release_all();
  }
  st_pool_destroy(pool);
  st_fp_set_flush(flush);
}

/* --------------------------------------------------------------- rotary */

typedef struct rotary_ctx {
  float *qkv, *work, *dout;
  int B, T, C, NH, rotary_dim;
} rotary_ctx;

static double rotary_loss(void *p) {
  rotary_ctx *c = p;
  size_t n = (size_t)c->B * c->T * 3 * c->C;
  memcpy(c->work, c->qkv, n * sizeof(float));
  st_rotary_forward(c->work, c->B, c->T, c->C, c->NH, c->rotary_dim);
  return dot(c->work, c->dout, n);
}

/* Rotary is computed in double from the fp32 inputs with angles in double and
 * rounded once, as the float64 reference is: at most an ulp apart, from libm
 * and torch differing in the last bits of cos/sin. 2.4e-7 (2 ulp) relative;
 * values below the floor 1e-6 (cancellation in x1 cos - x2 sin) are held to
 * 2.4e-13 absolute, still far above what double arithmetic leaves. */
#define ROT_TOL 2.4e-7
#define ROT_FLOOR 1e-6

static void test_rotary(void) {
  st_safetensors *st = open_fixture("attention");
  if (!st) return;
  const char *cases[] = {"rotary_full", "rotary_half"};
  for (int k = 0; k < 2; k++) {
    const char *c = cases[k];
    char what[96];
    int32_t *d = fx_i32(st, c, "dims", 5);
    int B = d[0], T = d[1], C = d[2], NH = d[3], rd = d[4], hs = C / NH;
    size_t n = (size_t)B * T * 3 * C;
    float *qkv = fx(st, c, "qkv", n), *dout = fx(st, c, "dout", n);
    float *out = copy_floats(qkv, n), *dqkv = copy_floats(dout, n);
    st_rotary_forward(out, B, T, C, NH, rd);
    st_rotary_backward(dqkv, B, T, C, NH, rd);
    label(what, sizeof what, "rotary", c, "out");
    CHECK_CLOSE(what, out, fx(st, c, "out", n), n, ROT_TOL, ROT_FLOOR);
    label(what, sizeof what, "rotary", c, "dqkv");
    CHECK_CLOSE(what, dqkv, fx(st, c, "dqkv", n), n, ROT_TOL, ROT_FLOOR);
    /* v, the dims past rotary_dim and position 0 come through bit for bit */
    int untouched = 1;
    for (size_t r = 0; r < (size_t)B * T; r++)
      for (int i = 0; i < 3 * C; i++) {
        size_t at = r * 3 * C + i;
        if (i >= 2 * C || i % hs >= rd || r % T == 0)
          untouched &= out[at] == qkv[at] && dqkv[at] == dout[at];
      }
    CHECK(untouched, "rotary %s changed v, a pass-through dim or t = 0", c);
    /* the backward is the inverse turn: forward then backward gives the
     * input back up to the rounding of the rotated pair (an ulp of each of
     * x1', x2', unit-sized, ~3 at most) and the final rounding: 1e-6 above a
     * floor of 1 leaves a margin of 2x or more over that bound */
    float *round_trip = copy_floats(out, n);
    st_rotary_backward(round_trip, B, T, C, NH, rd);
    label(what, sizeof what, "rotary", c, "round trip");
    CHECK_CLOSE(what, round_trip, qkv, n, 1e-6, 1.0);
    rotary_ctx ctx = {qkv, new_floats(n), dout, B, T, C, NH, rd};
    label(what, sizeof what, "rotary", c, "fd dqkv");
    /* a k element of the last position, in the rotated part */
    check_fd(what, qkv, n, dqkv, rotary_loss, &ctx,
             ((size_t)B * T - 1) * 3 * C + C + rd / 2);
    release_all();
  }
  st_safetensors_destroy(st);
}

/* ---------------------------------------------------------------- costs */

static void test_costs(void) {
  /* embedding, T = 1024, C = 768, V = 50257 (GPT-2 small): 786432 adds
   * forward, twice that backward; 4 * (50257 + 1024) * 768 = 157535232
   * parameter bytes;
   * output plus the int32 tokens, 4 * (786432 + 1024). */
  st_cost c = st_embedding_cost(1024, 768, 50257);
  CHECK(c.flops_fwd == 786432.0 && c.flops_bwd == 1572864.0,
        "embedding flops %g %g", c.flops_fwd, c.flops_bwd);
  CHECK(c.param_bytes == 157535232.0, "embedding params %g", c.param_bytes);
  CHECK(c.act_bytes == 3149824.0, "embedding act %g", c.act_bytes);

  /* attention, T = 4, C = 8, NH = 2: 10 causal scores per head, 20 in all;
   * products 2 * 8 * 4 * 5 = 320; forward 320 + 5 * 20 = 420, backward
   * (the scores again) 800 + 9 * 20 = 980; kept the output, 4 * 32 = 128
   * bytes (no probabilities). */
  c = st_attention_cost(4, 8, 2);
  CHECK(c.flops_fwd == 420.0 && c.flops_bwd == 980.0, "attention flops %g %g",
        c.flops_fwd, c.flops_bwd);
  CHECK(c.param_bytes == 0.0 && c.act_bytes == 128.0, "attention bytes %g %g",
        c.param_bytes, c.act_bytes);
  /* GPT-2 small's attention at T = 1024: products 2 * 768 * 1024 * 1025 =
   * 1612185600, scores 12 * 1024 * 1025 / 2 = 6297600 */
  c = st_attention_cost(1024, 768, 12);
  CHECK(c.flops_fwd == 1612185600.0 + 5.0 * 6297600.0,
        "attention 1024 flops %g", c.flops_fwd);

  /* rotary, T = 10, NH = 4, rotary_dim = 16: 10 * 4 * 8 pairs of q and the
   * same of k, 6 flops each: 3840 each way; nothing saved. */
  c = st_rotary_cost(10, 4, 16);
  CHECK(c.flops_fwd == 3840.0 && c.flops_bwd == 3840.0 && c.act_bytes == 0.0 &&
            c.param_bytes == 0.0,
        "rotary cost %g %g", c.flops_fwd, c.act_bytes);

  /* scratch: two blocks of min(T, 32) rows of T per (b, h) */
  CHECK(st_attention_scratch_floats(2, 7, 12, 3) == 2 * 3 * 2 * 7 * 7,
        "attention scratch, short T");
  CHECK(st_attention_scratch_floats(4, 256, 768, 12) ==
            (size_t)4 * 12 * 2 * 32 * 256,
        "attention scratch, T = 256");
}

int main(void) {
  st_blas_init();
  test_embedding();
  test_embedding_determinism();
  test_attention_fixtures();
  test_attention_naive();
  test_attention_large_scores();
  test_attention_dominant_diagonal();
  test_attention_causality();
  test_attention_determinism();
  test_attention_bf16();
  test_rotary();
  test_costs();
  TH_DONE();
}
