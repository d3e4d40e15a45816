/*
 * test_generate.c — src/exec/generate.c's sampler against the definition:
 * the next token is drawn from softmax(logits / temperature) restricted to
 * the top_k likeliest (ties: the lower id), by the inverse of its CDF at the
 * first uniform of the stream (seed, ST_RNG_SAMPLE, 0) — the CDF over the k
 * likeliest in that order, or over every id in id order when there is no
 * top_k; temperature 0 takes the likeliest.
 *
 * A one-layer GPT with its initial weights is written as a checkpoint; its
 * logits after the prompt come from the stage worker here, the expected
 * token of each seed from those logits in float64, and st_generate must draw
 * exactly that token for every seed. Same seed, same text held before; this
 * also holds the draw to the distribution (a sampler that ignored top_k or
 * the temperature, or drew from the wrong CDF, passed the seeded tests).
 */
#include "harness.h"
#include "strata.h"

#include "../../src/exec/exec.h" /* internal: the stage worker */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { T = 8, SEEDS = 200 };
static const char prompt[] = "ab";

/* The token st_generate draws after the prompt (one byte: the byte
 * tokenizer), or -1 if it fails. */
static int generated(const st_config *cfg, const char *ck, float temperature,
                     int top_k, uint64_t seed) {
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  st_generate_options o = {1, temperature, top_k, seed};
  st_error err = {0};
  int rc = st_generate(cfg, ck, (const uint8_t *)prompt, 2, &o, out, &err);
  fclose(out);
  int tok = rc == 0 && len == 3 && !memcmp(text, prompt, 2)
                ? (unsigned char)text[2]
                : -1;
  if (tok < 0)
    fprintf(stderr, "generate: rc %d, %zu bytes: %s\n", rc, len, err.msg);
  free(text);
  return tok;
}

/* The token the definition draws at uniform u from logits z (V of them);
 * *near is set where u lies so close to a CDF boundary (1e-5 of the mass:
 * float against float64 sums) that either neighbour may be right. */
static int expected(const float *z, int V, double temperature, int top_k,
                    double u, int *near) {
  int order[256];
  double p[256], zmax = z[0];
  for (int c = 1; c < V; c++) zmax = z[c] > zmax ? z[c] : zmax;
  for (int c = 0; c < V; c++) {
    p[c] = exp(((double)z[c] - zmax) / temperature);
    order[c] = c;
  }
  /* the top k by probability, descending, ties the lower id first
   * (insertion sort: V = 256); with no top_k, all in id order */
  for (int i = 1; i < V; i++)
    for (int j = i;
         j > 0 && (p[order[j]] > p[order[j - 1]] ||
                   (p[order[j]] == p[order[j - 1]] && order[j] < order[j - 1]));
         j--) {
      int s = order[j];
      order[j] = order[j - 1];
      order[j - 1] = s;
    }
  int k = top_k > 0 && top_k < V ? top_k : V;
  for (int c = 0; k == V && c < V; c++) order[c] = c; /* all: by id */
  double sum = 0;
  for (int i = 0; i < k; i++) sum += p[order[i]];
  double at = u * sum, acc = 0;
  *near = 0;
  for (int i = 0; i < k; i++) {
    acc += p[order[i]];
    if (fabs(at - acc) < 1e-5 * sum) *near = 1;
    if (at < acc) return order[i];
  }
  return order[k - 1];
}

int main(void) {
  st_config cfg;
  st_config_defaults(&cfg);
  const char *sets[] = {
      "model.kind=gpt",  "data.dataset=text", "model.context=8",
      "model.layers=1",  "model.heads=2",     "model.width=16",
      "model.dropout=0", "train.threads=1",   "metrics.progress=off"};
  st_error err = {0};
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    CHECK(st_config_set(&cfg, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
  /* the model generate builds: the tokenizer's vocabulary, logits out */
  st_config mc = cfg;
  CHECK(st_text_vocab(&mc, &mc.model.vocab, &err) == 0, "vocab: %s", err.msg);
  mc.model.fused_loss = 0;
  st_model *m = NULL;
  int rc = st_model_create(&m, &mc, (st_shape){1, T, 1}, &err);
  CHECK(rc == 0, "model: %s", err.msg);
  if (rc) TH_DONE();
  CHECK(m->classes == 256, "byte vocabulary: %d classes", m->classes);
  float *params = st_alloc(m->n_params * sizeof *params);
  st_model_init(m, params, 7);
  /* weights 4x their initial scale: logits spread over a few units, so
   * that the temperature and top_k change which token each seed draws */
  for (size_t i = 0; i < m->n_params; i++) params[i] *= 4;
  char ck[64];
  snprintf(ck, sizeof ck, "/tmp/strata-test-generate-%d.safetensors",
           (int)getpid());
  rc = st_checkpoint_save(ck, m, params, NULL, "sgd", NULL, &err);
  CHECK(rc == 0, "save %s: %s", ck, err.msg);

  /* the logits at the prompt's last position, as generate computes them */
  st_pool *pool = st_pool_create(1);
  st_stage *s = NULL;
  rc = st_stage_create(&s, m, 0, m->n_blocks, 1, &err);
  CHECK(rc == 0, "stage: %s", err.msg);
  float x[T] = {(float)prompt[0], (float)prompt[1]};
  st_ctx ctx = {pool, 0, cfg.train.seed, 0, NULL, NULL};
  float z[256];
  memcpy(z, st_stage_forward(s, &ctx, params, x, 1) + 256, sizeof z);
  st_stage_destroy(s);
  st_pool_destroy(pool);
  int best = 0;
  for (int c = 1; c < 256; c++) best = z[c] > z[best] ? c : best;
  float lo = z[0];
  for (int c = 1; c < 256; c++) lo = z[c] < lo ? z[c] : lo;
  if (getenv("STRATA_TEST_VERBOSE"))
    fprintf(stderr, "  logits from %.3g to %.3g (token %d)\n", (double)lo,
            (double)z[best], best);

  static const struct {
    float temperature;
    int top_k;
  } cases[] = {{1, 0}, {0.5f, 0}, {2, 0}, {2, 5}, {1, 1}, {0, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    float tp = cases[c].temperature;
    int k = cases[c].top_k, wrong = 0, near = 0, distinct = 0;
    unsigned char seen[256] = {0};
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
      st_rng rng;
      st_rng_init(&rng, seed, ST_RNG_SAMPLE, 0);
      double u = st_rng_uniform(&rng);
      int close = 0;
      int want = tp > 0 ? expected(z, 256, tp, k, u, &close) : best;
      int got = generated(&cfg, ck, tp, k, seed);
      if (got >= 0 && !seen[got]) seen[got] = 1, distinct++;
      near += close;
      if (got != want && !close) {
        if (!wrong)
          fprintf(stderr,
                  "  temperature %g, top_k %d, seed %llu: drew %d, "
                  "the definition %d\n",
                  (double)tp, k, (unsigned long long)seed, got, want);
        wrong++;
      }
    }
    CHECK(wrong == 0,
          "temperature %g, top_k %d: %d of %d seeds drew another token than "
          "the definition",
          (double)tp, k, wrong, SEEDS);
    /* the draws must spread where the definition spreads them: a check
     * of the check (the logits are not one-hot) */
    int want_spread = tp > 0 && k != 1;
    CHECK(want_spread ? distinct >= (k ? 2 : 10) : distinct == 1,
          "temperature %g, top_k %d: %d distinct tokens over %d seeds",
          (double)tp, k, distinct, SEEDS);
    CHECK(near <= SEEDS / 20, "temperature %g, top_k %d: %d seeds undecided",
          (double)tp, k, near);
    CHECK(distinct <= (k ? k : 256), "top_k %d: %d distinct tokens", k,
          distinct);
    if (getenv("STRATA_TEST_VERBOSE"))
      fprintf(stderr, "  temperature %-4g top_k %d: %3d distinct, %d near\n",
              (double)tp, k, distinct, near);
  }
  unlink(ck);
  st_free(params);
  st_model_destroy(m);
  TH_DONE();
}
