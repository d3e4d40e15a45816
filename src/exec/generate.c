/*
 * generate.c — sampling text from a trained GPT. The model runs as it
 * trains, one sequence of model.context positions: the prompt's tokens fill
 * the first positions and the rest are padding, which causal attention keeps
 * from reaching earlier positions, so the logits at the last real position
 * are the next-token distribution. Each new token re-runs the forward (no
 * key/value cache: the model is small and this keeps one code path); once the
 * sequence fills the context, the window slides.
 */
#include "exec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen {
  st_model *model;
  st_tokenizer *tok;
  st_pool *pool;
  st_stage *stage;
  float *params, *x;
  int32_t *ids; /* the whole text so far, prompt first: room for the
                   prompt's bytes (at most as many ids) and the new */
  size_t n_ids;
  float *probs;   /* vocab */
  int *order;     /* vocab: indices sorted for top-k */
  uint8_t *bytes; /* decode buffer */
  size_t cap_bytes;
} gen;

static void gen_free(gen *g) {
  st_stage_destroy(g->stage);
  st_pool_destroy(g->pool);
  st_free(g->params);
  st_free(g->x);
  st_free(g->ids);
  st_free(g->probs);
  free(g->order);
  st_free(g->bytes);
  st_tokenizer_destroy(g->tok);
  st_model_destroy(g->model);
}

/* Writes the bytes of ids[0..n) to out. */
static int emit(gen *g, const int32_t *ids, size_t n, FILE *out,
                st_error *err) {
  size_t len;
  int rc = st_tokenizer_decode(g->tok, ids, n, NULL, 0, &len, err);
  if (rc) return rc;
  if (len > g->cap_bytes) {
    st_free(g->bytes);
    g->cap_bytes = len;
    g->bytes = st_alloc(len);
    if (!g->bytes) return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  rc = st_tokenizer_decode(g->tok, ids, n, g->bytes, g->cap_bytes, &len, err);
  if (!rc && len) fwrite(g->bytes, 1, len, out);
  fflush(out);
  return rc;
}

static int by_prob(const void *a, const void *b, void *probs) {
  const float *p = probs;
  float pa = p[*(const int *)a], pb = p[*(const int *)b];
  if (pa != pb) return pa > pb ? -1 : 1;
  return *(const int *)a - *(const int *)b; /* ties: lower id first */
}

/* The next token from logits z. Only ids the tokenizer can decode are
 * drawn: a model's vocabulary may be padded past the tokenizer's (GPT-2's
 * 50257 over bytes), and its extra rows are never targets. */
static int32_t sample(gen *g, const float *z, const st_generate_options *o,
                      st_rng *rng) {
  int V = st_tokenizer_vocab(g->tok);
  int best = 0;
  for (int c = 1; c < V; c++)
    if (z[c] > z[best]) best = c;
  if (!(o->temperature > 0) || !isfinite(z[best])) return best;
  double sum = 0;
  for (int c = 0; c < V; c++) {
    g->probs[c] = (float)exp(((double)z[c] - z[best]) / o->temperature);
    sum += g->probs[c];
  }
  if (!(sum > 0) || !isfinite(sum)) return best; /* NaN logits */
  int k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
  for (int c = 0; c < V; c++) g->order[c] = c;
  if (k < V) {
    qsort_r(g->order, (size_t)V, sizeof *g->order, by_prob, g->probs);
    sum = 0;
    for (int i = 0; i < k; i++) sum += g->probs[g->order[i]];
  }
  double u = st_rng_uniform(rng) * sum, acc = 0;
  for (int i = 0; i < k; i++) {
    acc += g->probs[g->order[i]];
    if (u < acc) return g->order[i];
  }
  return g->order[k - 1]; /* rounding left u at the very top */
}

int st_generate(const st_config *cfg_in, const char *checkpoint,
                const uint8_t *prompt, size_t prompt_len,
                const st_generate_options *o, FILE *out, st_error *err) {
  if (strcmp(cfg_in->model.kind, "gpt") != 0)
    return st_error_set(
        err, ST_ECONFIG, "%s: model.kind: generate needs a gpt, not %s",
        st_config_where(cfg_in, "model.kind"), cfg_in->model.kind);
  if (prompt_len == 0)
    return st_error_set(err, ST_EARG,
                        "the prompt is empty: give at least one character");
  if (o->tokens < 0 || o->top_k < 0 || !(o->temperature >= 0))
    return st_error_set(err, ST_EARG,
                        "--tokens and --top-k must be >= 0 and --temperature "
                        ">= 0");
  st_config cfg = *cfg_in;
  gen g = {0};
  int rc = st_text_vocab(&cfg, &cfg.model.vocab, err);
  if (!rc) rc = st_text_tokenizer(&g.tok, &cfg, err);
  if (!rc && st_tokenizer_vocab(g.tok) > cfg.model.vocab)
    rc = st_error_set(err, ST_ECONFIG,
                      "%s: model.vocab: %d, but the tokenizer (%s) makes ids "
                      "up to %d",
                      st_config_where(&cfg, "model.vocab"), cfg.model.vocab,
                      cfg.data.tokenizer, st_tokenizer_vocab(g.tok) - 1);
  int T = cfg.model.context;
  cfg.model.fused_loss = 0; /* sampling reads the logits */
  if (!rc) rc = st_model_create(&g.model, &cfg, (st_shape){1, T, 1}, err);
  if (!rc &&
      !(g.ids = st_alloc((prompt_len + (size_t)o->tokens) * sizeof *g.ids)))
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
  if (!rc)
    rc = st_tokenizer_encode(g.tok, prompt, prompt_len, g.ids, &g.n_ids, err);
  if (!rc && g.n_ids > (size_t)T)
    rc = st_error_set(err, ST_EARG,
                      "the prompt is %zu tokens, longer than the context of "
                      "%d (model.context, %s)",
                      g.n_ids, T, st_config_where(&cfg, "model.context"));
  if (rc) {
    gen_free(&g);
    return rc;
  }
  const st_model *m = g.model;
  int V = m->classes;
  int threads = cfg.train.threads > 0 ? cfg.train.threads : 1;
  st_fp_set_flush(cfg.train.flush_subnormals);
  st_gemm_choose_profile_once(); /* the kernels training took */
  st_gemm_set_bf16(!strcmp(cfg.train.precision, "bf16"));
  g.pool = st_pool_create(threads);
  g.params = st_alloc(m->n_params * sizeof(float));
  g.x = st_alloc((size_t)T * sizeof(float));
  g.probs = st_alloc((size_t)V * sizeof(float));
  g.order = malloc((size_t)V * sizeof *g.order);
  if (!g.pool || !g.params || !g.x || !g.probs || !g.order)
    rc = st_error_set(err, ST_ENOMEM, "out of memory for %zu parameters",
                      m->n_params);
  if (!rc) rc = st_stage_create(&g.stage, m, 0, m->n_blocks, 1, err);
  uint32_t had;
  if (!rc && st_checkpoint_tokenizer_crc(checkpoint, &had))
    rc = st_tokenizer_check(g.tok, &cfg, checkpoint, had, err);
  if (!rc)
    rc = st_checkpoint_load(checkpoint, m, g.params, NULL, NULL, NULL, err);
  if (!rc) rc = emit(&g, g.ids, g.n_ids, out, err);
  st_rng rng;
  st_rng_init(&rng, o->seed, ST_RNG_SAMPLE, 0);
  st_ctx ctx = {g.pool, 0, cfg.train.seed, 0, NULL, NULL};
  for (int i = 0; !rc && i < o->tokens; i++) {
    /* the newest T tokens; the padding after them never reaches them */
    size_t n = g.n_ids < (size_t)T ? g.n_ids : (size_t)T;
    const int32_t *win = g.ids + g.n_ids - n;
    for (int t = 0; t < T; t++) g.x[t] = (size_t)t < n ? (float)win[t] : 0.0f;
    const float *logits = st_stage_forward(g.stage, &ctx, g.params, g.x, 1);
    int32_t next = sample(&g, logits + (n - 1) * (size_t)V, o, &rng);
    g.ids[g.n_ids++] = next;
    rc = emit(&g, &next, 1, out, err);
  }
  gen_free(&g);
  return rc;
}
