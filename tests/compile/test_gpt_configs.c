/*
 * test_gpt_configs.c — the published GPT shapes in configs/ (docs/models.md):
 * GPT-2 124M, GPT-3 XL, GPT-J-6B, GPT-3 13B and GPT-NeoX-20B.
 *
 * Each config file is loaded as `strata compile` loads it and checked
 * against the shape written here from the papers (layers, width, heads,
 * context, vocabulary, tied head, positions); its model is built as
 * descriptors only, with no st_alloc (the parameters of NeoX-20B alone are
 * 82 GB in fp32). The unique parameter count must equal, as an exact
 * integer, the closed form of strata's block computed here independently
 * of src/model/, and lie within 1% of the published total (the issue's
 * criterion). Where strata's architecture differs from the original, the
 * difference is checked exactly as well, so the 1% is never what hides it.
 * Then `compile --validate-only` prints that count without allocating, and
 * the compiler answers on wse2: a plan where the model fits, else the
 * block that does not fit and by how much.
 */
#include "harness.h"
#include "strata.h"

#include <stdint.h>
#include <string.h>

typedef struct gpt_shape {
  const char *config;
  int64_t layers, width, heads, context, vocab;
  int tied, rotary, rotary_dim;
  /* the reference total and what it is */
  int64_t published;
  const char *source;
} gpt_shape;

/* The published shapes; the sources and strata's deviations are in each
 * config file's header. */
static const gpt_shape shapes[] = {
    /* Radford et al. 2019; Hugging Face gpt2's count of the released
     * checkpoint */
    {"configs/gpt2_124m.yaml", 12, 768, 12, 1024, 50257, 1, 0, 0, 124439808,
     "GPT-2 124M checkpoint (HF gpt2)"},
    /* Brown et al. 2020 Table 2.1 says "1.3B", two digits, which cannot
     * check a count to 1%: the reference is GPT-Neo 1.3B, the same shape
     * (24 x 2048, context 2048, vocabulary 50257, tied), counted exactly;
     * 16 heads of 128 because 24 x 128 is not 2048 */
    {"configs/gpt3_xl_1.3b.yaml", 24, 2048, 16, 2048, 50257, 1, 0, 0,
     1315575808, "GPT-Neo 1.3B (HF EleutherAI/gpt-neo-1.3B)"},
    /* Wang & Komatsuzaki 2021, model card */
    {"configs/gptj_6b.yaml", 28, 4096, 16, 2048, 50400, 0, 1, 64, 6053381344,
     "GPT-J-6B model card"},
    /* Brown et al. 2020 Table 2.1: 13.0B with d_model 5140; 20 heads since
     * 40 do not divide 5140 */
    {"configs/gpt3_13b.yaml", 40, 5140, 20, 2048, 50257, 1, 0, 0, 13000000000,
     "GPT-3 13B, Table 2.1 (13.0B)"},
    /* Black et al. 2022, Table 1 */
    {"configs/gpt_neox_20b.yaml", 44, 6144, 64, 2048, 50432, 0, 1, 24,
     20554567680, "GPT-NeoX-20B paper"},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

/* strata's gpt (src/model/model.c, build_gpt) counted by hand: per layer
 * ln_1 and ln_2 (2 C each), c_attn C x 3C + 3C, attention projection
 * C x C + C, c_fc C x 4C + 4C, MLP projection 4C x C + C, so 12 C^2 + 13 C;
 * the token table V C, a position table T C unless rotary, ln_f 2 C and
 * the head V C (no bias) unless tied to the token table. */
static int64_t closed_form(const gpt_shape *s) {
  int64_t C = s->width, L = s->layers, V = s->vocab, T = s->context;
  int64_t per_layer = 12 * C * C + 13 * C;
  return V * C + (s->rotary ? 0 : T * C) + L * per_layer + 2 * C +
         (s->tied ? 0 : V * C);
}

static int load(st_config *cfg, const char *path, st_error *err) {
  st_config_defaults(cfg);
  int rc = st_config_load(cfg, path, err);
  return rc ? rc : st_config_validate(cfg, err);
}

static void test_shape(const gpt_shape *s) {
  st_config cfg;
  st_error err = {0};
  int rc = load(&cfg, s->config, &err);
  CHECK(rc == 0, "%s: %s", s->config, err.msg);
  if (rc) return;
  const char *kind = cfg.model.kind, *pos = cfg.model.positions;
  CHECK(!strcmp(kind, "gpt") && cfg.model.layers == s->layers &&
            cfg.model.width == s->width && cfg.model.heads == s->heads &&
            cfg.model.context == s->context && cfg.model.vocab == s->vocab &&
            cfg.model.mlp_ratio == 4 && cfg.model.tied == s->tied &&
            !strcmp(pos, s->rotary ? "rotary" : "learned") &&
            (!s->rotary || cfg.model.rotary_dim == s->rotary_dim),
        "%s: the shape is not the published one", s->config);
  CHECK(!strcmp(cfg.optimizer.kind, "adamw") && cfg.train.batch > 1,
        "%s: a training section to compile (adamw, batch %d)", s->config,
        cfg.train.batch);

  uint64_t before = st_alloc_count();
  st_model *m = NULL;
  rc = st_model_create(&m, &cfg, (st_shape){1, (int)s->context, 1}, &err);
  uint64_t after = st_alloc_count();
  CHECK(rc == 0, "%s: %s", s->config, err.msg);
  if (rc) return;
  CHECK(after == before, "%s: st_alloc called %llu times building it",
        s->config, (unsigned long long)(after - before));
  CHECK(m->n_blocks == s->layers + 2, "%s: %d blocks", s->config, m->n_blocks);

  int64_t got = (int64_t)st_model_unique_params(m), want = closed_form(s);
  CHECK(got == want, "%s: %lld parameters, closed form %lld", s->config,
        (long long)got, (long long)want);
  /* the acceptance criterion: within 1% of the published total */
  double rel = (double)(got - s->published) / (double)s->published;
  CHECK(fabs(rel) <= 0.01, "%s: %lld vs %s %lld: %+.3f%%", s->config,
        (long long)got, s->source, (long long)s->published, 100 * rel);
  if (getenv("STRATA_TEST_VERBOSE"))
    fprintf(stderr, "  %-28s %15lld vs %15lld (%s): %+.4f%%\n", s->config,
            (long long)got, (long long)s->published, s->source, 100 * rel);
  /* a tied head's copy is in the slab but counted once */
  CHECK(m->n_params - (size_t)got ==
            (s->tied ? (size_t)(s->vocab * s->width) : 0),
        "%s: the tied copy", s->config);
  st_model_destroy(m);
}

/* The architectural differences, exactly (config headers). */
static void test_differences(void) {
  int64_t L, C, V;
  /* GPT-2 and GPT-NeoX: strata's block has their parameters exactly (NeoX's
   * parallel residual moves no weight) */
  CHECK(closed_form(&shapes[0]) == shapes[0].published, "GPT-2 exact");
  CHECK(closed_form(&shapes[4]) == shapes[4].published, "GPT-NeoX exact");
  /* GPT-Neo 1.3B has no q, k, v biases: 3 C a layer fewer */
  L = shapes[1].layers, C = shapes[1].width;
  CHECK(closed_form(&shapes[1]) - shapes[1].published == 3 * C * L,
        "GPT-3 XL vs GPT-Neo 1.3B: 3 C L");
  /* ... and the paper's "1.3B" holds anything in [1.25B, 1.35B) */
  CHECK(closed_form(&shapes[1]) >= 1250000000 &&
            closed_form(&shapes[1]) < 1350000000,
        "GPT-3 XL rounds to 1.3B");
  /* "13.0B" holds [12.95B, 13.05B); d_model 5120 (40 heads of 128) would
   * not: 12,853,386,240 rounds to 12.9B */
  CHECK(closed_form(&shapes[3]) >= 12950000000 &&
            closed_form(&shapes[3]) < 13050000000,
        "GPT-3 13B rounds to 13.0B");
  gpt_shape narrow = shapes[3];
  narrow.width = 5120;
  CHECK(closed_form(&narrow) == 12853386240 &&
            closed_form(&narrow) < 12950000000,
        "GPT-3 13B at width 5120 would not");
  /* GPT-J as Hugging Face holds it (6,050,882,784): one layernorm and no
   * attention biases per layer, a head bias; strata has +6 C a layer, no
   * head bias */
  L = shapes[2].layers, C = shapes[2].width, V = shapes[2].vocab;
  int64_t hf_gptj = 2 * V * C + V + L * (12 * C * C + 7 * C) + 2 * C;
  CHECK(hf_gptj == 6050882784, "GPT-J closed form, HF layout: %lld",
        (long long)hf_gptj);
  CHECK(closed_form(&shapes[2]) - hf_gptj == 6 * C * L - V,
        "GPT-J: strata - HF = 6 C L - V");
}

/* What `compile --validate-only` prints, with no st_alloc. */
static void test_validate(const gpt_shape *s) {
  st_config cfg;
  st_error err = {0};
  if (load(&cfg, s->config, &err)) return; /* reported by test_shape */
  FILE *out = tmpfile();
  uint64_t before = st_alloc_count();
  int rc = st_plan_validate(&cfg, out, &err);
  uint64_t after = st_alloc_count();
  CHECK(rc == 0, "%s: validate: %s", s->config, err.msg);
  CHECK(after == before, "%s: validate allocated %llu times", s->config,
        (unsigned long long)(after - before));
  static char text[1 << 16];
  rewind(out);
  size_t n = fread(text, 1, sizeof text - 1, out);
  text[n] = 0;
  fclose(out);
  /* "parameters: 20,554,567,680 (20554567680; 82.2 GB as fp32)" */
  char digits[32], grouped[48], line[96];
  snprintf(digits, sizeof digits, "%lld", (long long)closed_form(s));
  size_t len = strlen(digits), o = 0;
  for (size_t i = 0; i < len; i++) {
    if (i && (len - i) % 3 == 0) grouped[o++] = ',';
    grouped[o++] = digits[i];
  }
  grouped[o] = 0;
  snprintf(line, sizeof line, "\nparameters: %s (%s; ", grouped, digits);
  CHECK(strstr(text, line) && strstr(text, "no model memory allocated"),
        "%s: validate output lacks '%s':\n%s", s->config, line + 1, text);
}

/* A refusal's bound for the whole model: at least its weights and state and
 * more than the fabric holds, but less than twice its weights and state
 * (one sample's activations, not as many as the most stages would hold). */
static void check_whole_need(const gpt_shape *s, const st_error *err,
                             double weights_and_state, double cap,
                             const char *what) {
  const char *at = strstr(err->msg, "blocks need at least ");
  double v = 0;
  char unit[8] = "";
  CHECK(at && sscanf(at, "blocks need at least %lf %7s", &v, unit) == 2,
        "%s, %s: the whole model's need named: %s", s->config, what, err->msg);
  double scale = !strcmp(unit, "GB") ? 1e9 : !strcmp(unit, "TB") ? 1e12 : 0;
  CHECK(v * scale >= weights_and_state * 0.995 && v * scale > cap &&
            v * scale < 2 * weights_and_state,
        "%s, %s: the whole model needs at least %g %s (weights and state "
        "%.4g, capacity %.4g)",
        s->config, what, v, unit, weights_and_state, cap);
}

/* The compiler on wse2: at the published batch no model fits layer-
 * pipelined (the activations of hundreds of sequences); at batch 1 the
 * smallest does, GPT-3 XL misses the 26.7 GB a wafer gives tensors (two
 * thirds of 40 GB, fabric.c) by its activations alone (its weights,
 * gradients and AdamW state are 21 GB), and the others by their weights and
 * state alone - the published line: layer-pipelined below about a billion
 * parameters. Either way an answer: a plan that holds its memory, or the
 * block that does not fit and by how much. */
static void test_compile_wse2(const gpt_shape *s) {
  st_config cfg;
  st_error err = {0};
  if (load(&cfg, s->config, &err)) return;
  CHECK(st_fabric_parse(&cfg, "wse2", &err) == 0, "%s", err.msg);
  st_plan *p = NULL;
  int rc = st_plan_compile(&p, &cfg, 0, &err);
  CHECK(rc == ST_EUNSUPPORTED && strstr(err.msg, "does not fit wse2") &&
            strstr(err.msg, "short by"),
        "%s at batch %d on wse2: rc %d '%s'", s->config, cfg.train.batch, rc,
        err.msg);
  st_plan_destroy(p);

  CHECK(st_config_set(&cfg, "train.batch=1", &err) == 0, "%s", err.msg);
  double weights_and_state = 4.0 * 4.0 * (double)closed_form(s);
  st_fabric f;
  CHECK(st_fabric_resolve(&f, &cfg, &err) == 0, "%s", err.msg);
  double cap = (double)f.pes * f.pe_memory;
  p = NULL;
  rc = st_plan_compile(&p, &cfg, 0, &err);
  if (closed_form(s) >= 1000000000) { /* above the published line */
    CHECK(rc == ST_EUNSUPPORTED && strstr(err.msg, "short by"),
          "%s at batch 1 on wse2: rc %d '%s'", s->config, rc, err.msg);
    check_whole_need(s, &err, weights_and_state, cap, "batch 1");
    /* at the published batch in micro-batches of one, 1f1b's first stage
     * holds as many as there are stages, its last one: the bound is the
     * last's, what one stage holding everything needs */
    st_config pub;
    CHECK(load(&pub, s->config, &err) == 0 &&
              st_fabric_parse(&pub, "wse2", &err) == 0 &&
              st_config_set(&pub, "execution.mode=pipeline", &err) == 0 &&
              st_config_set(&pub, "execution.micro_batch=1", &err) == 0,
          "%s", err.msg);
    st_plan *q = NULL;
    rc = st_plan_compile(&q, &pub, 0, &err);
    CHECK(rc == ST_EUNSUPPORTED, "%s in micro-batches of 1: rc %d", s->config,
          rc);
    check_whole_need(s, &err, weights_and_state, cap, "micro-batches of 1");
    st_plan_destroy(q);
  } else {
    CHECK(rc == 0, "%s at batch 1 on wse2: %s", s->config, err.msg);
    if (rc == 0) {
      CHECK(p->n_blocks == s->layers + 2 && p->n_stages >= 1 &&
                p->throughput > 0 && p->pes_used <= p->fabric.pes,
            "%s: a plan of %d stages", s->config, p->n_stages);
      double held = 0;
      for (int k = 0; k < p->n_stages; k++) {
        CHECK(p->stages[k].mem_total <= p->stages[k].mem_capacity,
              "%s: stage %d holds its memory", s->config, k);
        held += p->stages[k].mem_total;
      }
      CHECK(held <= cap, "%s: %.3g bytes held on a wafer giving tensors %.3g",
            s->config, held, cap);
    }
  }
  st_plan_destroy(p);

  /* --stages 4 with room for everything (pe_memory 1 MB): four stages, the
   * 20B model included */
  CHECK(st_config_set(&cfg, "fabric.pe_memory=1000000", &err) == 0, "%s",
        err.msg);
  p = NULL;
  rc = st_plan_compile(&p, &cfg, 4, &err);
  CHECK(rc == 0 && p->n_stages == 4, "%s --stages 4: rc %d %s", s->config, rc,
        err.msg);
  st_plan_destroy(p);
}

int main(void) {
  setenv("STRATA_CALIBRATION", "none", 1);
  for (int i = 0; i < N_SHAPES; i++) test_shape(&shapes[i]);
  test_differences();
  for (int i = 0; i < N_SHAPES; i++) test_validate(&shapes[i]);
  for (int i = 0; i < N_SHAPES; i++) test_compile_wse2(&shapes[i]);
  TH_DONE();
}
