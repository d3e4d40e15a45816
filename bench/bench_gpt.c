/*
 * bench_gpt.c — GPT training throughput of strata's own engine, in tokens
 * per second, with the share of this machine's sgemm peak it reaches.
 *
 * A config built in code (model.kind gpt with the shape from the command
 * line: pre-LN GPT-2, learned positions, gelu tanh, tied head, no dropout;
 * data.dataset text on a file of deterministic random bytes, byte tokenizer;
 * AdamW lr 3e-4, betas 0.9 / 0.95, weight decay 0.1, constant schedule) goes
 * through the public trainer API: st_trainer_create, then st_trainer_step
 * (next batch of token windows, forward, softmax cross-entropy at every
 * position, backward, update). The 124M shape keeps model.vocab = 50257, as
 * GPT-2; the byte tokenizer's ids all lie below it, and the logits, the loss
 * and the tied embedding are computed over the whole vocabulary all the same.
 *
 * FLOPs per step come from the model's own cost descriptors: the sum of
 * every block's cost.flops_fwd + cost.flops_bwd per sample (embedding,
 * transformer blocks, ln_f and the head), times the batch, plus the softmax
 * cross-entropy (st_xent_cost) at every position; the fused head
 * (model.fused_loss) is counted as the head and the loss apart, without
 * the product its backward makes again. The sgemm peak is measured
 * in the same process after the timed steps: one large square product on
 * THREADS threads, best of a few calls, by the BLAS (cblas_sgemm, the BLAS
 * given THREADS threads) and by strata's own st_gemm (a pool of THREADS),
 * the faster of the two; the fraction is (FLOPs per step x steps/s) /
 * peak. Both are printed: with AVX-512 on Zen 5 strata's packed kernel
 * outruns OpenBLAS 0.3.21, which runs 8-lane kernels there, so the BLAS
 * alone would understate what the machine does. The FMA peak is the
 * arithmetic ceiling: THREADS threads each running independent vector
 * FMAs of the widest width the target has, in registers, best of 5
 * tries before the steps and 5 after, and never below the sgemm peak.
 *
 * The peer is bench/bench_gpt.py (the same model in PyTorch); the ratio is
 * printed by tools/run-bench.sh, which runs both in the same session
 * (STYLE.md 13). This program prints one line:
 *
 *   strata gpt model=M layers=L width=C heads=NH context=T vocab=V batch=B
 *     threads=N precision=P head=H warmup_steps=W steps=S steps_per_s=X
 *     tokens_per_s=Y
 *     gflop_per_step=F gflops=G peak_gflops=P peak_fraction=R
 *     blas_peak_gflops=PB strata_peak_gflops=PS fma_peak_gflops=PF
 *     fma_fraction=RF round_trip_ns=BEFORE/AFTER
 *
 * (gflops: the FLOP rate reached, F x X; P: the larger of PB and PS;
 * peak_fraction: gflops / P; fma_fraction: gflops / PF; round_trip_ns: a
 * cache line's round trip between two threads before the trainer is made
 * and after it is gone, 0 on one thread.)
 *
 * Usage: bench_gpt MODEL BATCH THREADS [SECONDS]   (timed span, default 1.5;
 *        at least 2 steps are timed whatever the span)
 *   MODEL: 124m  GPT-2 small: 12 layers, width 768, 12 heads, context 256,
 *                vocab 50257
 *          tiny  configs/gpt_tiny.yaml: 4 layers, width 128, 4 heads,
 *                context 64, vocab 256
 *          L,C,NH,T,V  any other shape
 */
#include "corpus.h"
#include "roundtrip.h"
#include "strata.h"

#include <cblas.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(ST_BLAS_OPENBLAS)
#define set_blas_threads(n) openblas_set_num_threads(n)
#elif defined(ST_BLAS_BLIS) /* st_blas_init pins it to 1: unpin */
#include <blis/blis.h>
#define set_blas_threads(n) bli_thread_set_num_threads(n)
#else
#define set_blas_threads(n) ((void)(n)) /* no portable knob; runs as is */
#endif

typedef struct gpt_shape {
  const char *name;
  int layers, width, heads, context, vocab;
} gpt_shape;

static const gpt_shape presets[] = {
    {"124m", 12, 768, 12, 256, 50257},
    {"tiny", 4, 128, 4, 64, 256},
};

enum {
  CORPUS_BYTES = 1 << 18, /* 256 KiB: 921 training windows of 256 tokens */
  PEAK_N = 2048           /* the square sgemm of the peak: 17 GFLOP a call */
};

static int parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < 1 || v > 1 << 20) return -1;
  *out = (int)v;
  return 0;
}

static int parse_shape(const char *s, gpt_shape *out) {
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
    if (strcmp(s, presets[i].name) == 0) {
      *out = presets[i];
      return 0;
    }
  gpt_shape g = {s, 0, 0, 0, 0, 0};
  char tail;
  if (sscanf(s, "%d,%d,%d,%d,%d%c", &g.layers, &g.width, &g.heads, &g.context,
             &g.vocab, &tail) != 5)
    return -1;
  *out = g;
  return 0;
}

/* The trainer config for shape g, batch and threads, through the same
 * key=value path as --set so every value is validated as a user's would be. */
static int make_config(st_config *cfg, const gpt_shape *g, int batch,
                       int threads, const char *corpus, const char *precision,
                       const char *head, st_error *err) {
  char sets[32][ST_PATH_MAX + 32];
  int n = 0;
#define SET(...) snprintf(sets[n++], sizeof sets[0], __VA_ARGS__)
  SET("model.kind=gpt");
  SET("train.precision=%s", precision);
  SET("model.fused_loss=%s", strcmp(head, "apart") ? "true" : "false");
  SET("model.layers=%d", g->layers);
  SET("model.width=%d", g->width);
  SET("model.heads=%d", g->heads);
  SET("model.context=%d", g->context);
  SET("model.vocab=%d", g->vocab);
  SET("model.mlp_ratio=4");
  SET("model.activation=gelu_tanh");
  SET("model.positions=learned");
  SET("model.tied=true");
  SET("model.dropout=0");
  SET("data.dataset=text");
  SET("data.path=%s", corpus);
  SET("data.tokenizer=bytes");
  SET("optimizer.kind=adamw");
  SET("optimizer.lr=3e-4");
  SET("optimizer.beta1=0.9");
  SET("optimizer.beta2=0.95");
  SET("optimizer.eps=1e-8");
  SET("optimizer.weight_decay=0.1");
  SET("optimizer.schedule=constant");
  SET("train.batch=%d", batch);
  SET("train.threads=%d", threads);
  SET("train.steps=1000000000");
  SET("metrics.progress=off");
#undef SET
  st_config_defaults(cfg);
  for (int i = 0; i < n; i++) {
    int rc = st_config_set(cfg, sets[i], err);
    if (rc) return rc;
  }
  return 0;
}

/* FLOPs of one training step of B samples, from the cost descriptors: the
 * model's arithmetic once, as PyTorch runs it. A fused head's backward makes
 * its product again for the chunks it did not keep (st_linear_xent_cost
 * counts that); here it counts as
 * the head and the loss apart, so the rate is the same work's. */
static double step_flops(const st_model *m, int B) {
  double per_sample = 0;
  for (int i = 0; i < m->n_blocks; i++) {
    const st_block *b = &m->blocks[i];
    per_sample += b->cost.flops_fwd + b->cost.flops_bwd;
    for (int l = 0; l < b->n_layers; l++) {
      const st_layer *L = &b->layers[l];
      if (L->kind != ST_OP_LINEAR_XENT) continue;
      int D = (int)(st_shape_numel(L->in) / L->rows);
      st_cost f = st_linear_xent_cost(L->rows, D, L->vocab, L->keep, L->split);
      st_cost u = st_linear_cost(D, L->vocab);
      per_sample -=
          (f.flops_fwd + f.flops_bwd - u.flops_fwd - u.flops_bwd) * L->rows;
    }
  }
  st_cost loss = st_xent_cost(m->classes);
  per_sample += (loss.flops_fwd + loss.flops_bwd) * m->label_rows;
  return per_sample * B;
}

/* Best FLOP/s of one PEAK_N-square product, at least 3 calls and 0.5 s
 * (call 0 warms up), by the BLAS on `threads` threads (`own` 0) or by
 * st_gemm on `pool` (`own` 1). */
static double square_rate(const float *a, const float *b, float *c,
                          st_pool *pool, int own) {
  double best = 0, flops = 2.0 * PEAK_N * PEAK_N * PEAK_N, start = st_now();
  for (int k = 0; k < 4 || st_now() - start < 0.5; k++) {
    double t0 = st_now();
    if (own)
      st_gemm(pool, 0, 0, PEAK_N, PEAK_N, PEAK_N, 1.0f, a, PEAK_N, b, PEAK_N,
              0.0f, c, PEAK_N);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, PEAK_N, PEAK_N,
                  PEAK_N, 1.0f, a, PEAK_N, b, PEAK_N, 0.0f, c, PEAK_N);
    double rate = flops / (st_now() - t0);
    if (k > 0 && rate > best) best = rate;
  }
  return best;
}

/* The sgemm peaks on `threads` threads: the BLAS's (given that many
 * threads, then pinned back to one, as st_blas_init leaves it) and
 * st_gemm's (a pool of that many). Both 0 if out of memory. */
static void sgemm_peaks(int threads, double *blas, double *own) {
  size_t n = (size_t)PEAK_N * PEAK_N;
  float *a = st_alloc(n * sizeof(float)), *b = st_alloc(n * sizeof(float));
  float *c = st_alloc(n * sizeof(float));
  st_pool *pool = st_pool_create(threads);
  *blas = *own = 0;
  if (a && b && c && pool) {
    st_rng rng;
    st_rng_init(&rng, 7, ST_RNG_DATA, 1);
    for (size_t i = 0; i < n; i++) {
      a[i] = 2.0f * st_rng_uniform(&rng) - 1.0f;
      b[i] = 2.0f * st_rng_uniform(&rng) - 1.0f;
    }
    set_blas_threads(threads);
    *blas = square_rate(a, b, c, NULL, 0);
    st_blas_init();
    *own = square_rate(a, b, c, pool, 1);
  }
  st_pool_destroy(pool);
  st_free(a);
  st_free(b);
  st_free(c);
}

/* The FMA ceiling: each of `threads` threads runs FMA_CHAINS independent
 * chains of vector FMAs (the widest the target has) in registers for
 * FMA_ROUNDS rounds; all their FLOPs over the span from the first thread's
 * start to the last one's end. 0 where the target has no FMA. */
enum { FMA_CHAINS = 12, FMA_ROUNDS = 20000000 };
static _Atomic long long fma_flops;

static void *fma_thread(void *arg) {
  (void)arg;
  double flops = 0, sink = 0;
#if defined(__AVX512F__)
  __m512 acc[FMA_CHAINS], x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(0.25f);
  for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm512_setzero_ps();
  for (int r = 0; r < FMA_ROUNDS; r++)
    for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  for (int i = 0; i < FMA_CHAINS; i++) sink += _mm512_reduce_add_ps(acc[i]);
  flops = 2.0 * 16 * FMA_CHAINS * (double)FMA_ROUNDS;
#elif defined(__FMA__)
  __m256 acc[FMA_CHAINS], x = _mm256_set1_ps(0.5f), y = _mm256_set1_ps(0.25f);
  for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_setzero_ps();
  for (int r = 0; r < FMA_ROUNDS; r++)
    for (int i = 0; i < FMA_CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  float lane[8];
  for (int i = 0; i < FMA_CHAINS; i++) {
    _mm256_storeu_ps(lane, acc[i]);
    sink += lane[0];
  }
  flops = 2.0 * 8 * FMA_CHAINS * (double)FMA_ROUNDS;
#endif
  if (sink == 42.0)
    flops += 1; /* keeps the chains live (never: they go to 0.5) */
  atomic_fetch_add(&fma_flops, (long long)flops);
  return NULL;
}

/* The best of FMA_TRIES: a ceiling is the fastest the machine was seen
 * to run. One try, on the 2-vCPU Zen 4 VM, once read 117 GFLOP/s where
 * the others read 222-233, and put the step at 1.44 of the peak; five
 * tries after the steps once read 186. */
enum { FMA_TRIES = 5 };

static double fma_peak(int threads) {
  double best = 0;
  for (int i = 0; i < FMA_TRIES; i++) {
    atomic_store(&fma_flops, 0);
    double t0 = st_now();
    st_run_workers(threads, fma_thread, NULL);
    double rate = (double)atomic_load(&fma_flops) / (st_now() - t0);
    if (rate > best) best = rate;
  }
  return best;
}

int main(int argc, char **argv) {
  gpt_shape g;
  int batch, threads;
  double seconds = 1.5;
  const char *precision = argc >= 6 ? argv[5] : "fp32";
  const char *head = argc >= 7 ? argv[6] : "fused";
  if (argc < 4 || argc > 7 || parse_shape(argv[1], &g) ||
      parse_int(argv[2], &batch) || parse_int(argv[3], &threads) ||
      (argc >= 5 && (seconds = atof(argv[4])) <= 0) ||
      (strcmp(head, "fused") && strcmp(head, "apart"))) {
    fprintf(stderr,
            "usage: bench_gpt MODEL BATCH THREADS [SECONDS [fp32|bf16 "
            "[fused|apart]]]\n"
            "  MODEL: 124m, tiny or LAYERS,WIDTH,HEADS,CONTEXT,VOCAB\n"
            "  fused: the head and its loss fused (model.fused_loss, the "
            "default); apart: a logits buffer\n");
    return 2;
  }
  st_blas_init();
  /* the FMA ceiling before the run and after it, the higher of the two:
   * this VM's rate for the same loop moves for seconds at a time */
  double fma_before = fma_peak(threads);

  char corpus[ST_PATH_MAX];
  if (bench_write_corpus(corpus, sizeof corpus, "gpt", CORPUS_BYTES, 42)) {
    perror("bench_gpt: error: cannot write the corpus to a temporary file");
    return 1;
  }
  /* before the trainer's pool, whose idle workers would share the cores */
  double round_trip_before = core_round_trip_ns(threads);
  st_config cfg;
  st_trainer *t = NULL;
  st_error err = {0};
  int rc = make_config(&cfg, &g, batch, threads, corpus, precision, head, &err);
  if (!rc) rc = st_trainer_create(&t, &cfg, NULL, &err);
  unlink(corpus); /* read whole at create: no longer needed */
  if (rc) {
    fprintf(stderr, "bench_gpt: error: %s\n", err.msg);
    return 1;
  }

  /* Warm-up: steps until 0.25 s have passed, at least one. The first step
   * touches every buffer for the first time (page faults over gigabytes at
   * the 124M shape, whose steps take seconds: one is all it gets). The timed
   * span follows: at least `seconds` and 2 steps. */
  double loss, warm = st_now();
  int warm_steps = 0;
  do {
    rc = st_trainer_step(t, &loss, &err);
    warm_steps++;
  } while (!rc && st_now() - warm < 0.25);
  int64_t steps = 0;
  double start = st_now(), elapsed = 0;
  while (!rc && (steps < 2 || elapsed < seconds)) {
    rc = st_trainer_step(t, &loss, &err);
    steps++;
    elapsed = st_now() - start;
  }
  if (rc) {
    fprintf(stderr, "bench_gpt: error: %s\n", err.msg);
    st_trainer_destroy(t);
    return 1;
  }
  double flops = step_flops(st_trainer_model(t), batch);
  st_trainer_destroy(t); /* frees its memory before the peak's matrices */
  st_gemm_set_bf16(0);   /* the peaks are fp32's, whatever the run's */
  double round_trip_after = core_round_trip_ns(threads); /* its pool gone */
  double blas, own;
  sgemm_peaks(threads, &blas, &own);
  double peak = blas > own ? blas : own, fma = fma_peak(threads);
  if (fma_before > fma) fma = fma_before;
  /* a ceiling is at least what a product was seen to reach: on the Intel
   * Xeon VM of docs/bench.md the best of the ten tries once read 294
   * GFLOP/s on 2 threads where strata's 2048-square product reached 323
   * (2026-11-30) */
  if (fma > 0 && peak > fma) fma = peak;
  double steps_per_s = (double)steps / elapsed, rate = flops * steps_per_s;
  char fma_text[32] = "-"; /* no FMA: no ceiling measured */
  if (fma > 0) snprintf(fma_text, sizeof fma_text, "%.3f", rate / fma);
  if (!strcmp(precision, "bf16"))
    printf("# bf16 products: %s\n", st_bf16_support());
  printf("strata gpt model=%s layers=%d width=%d heads=%d context=%d "
         "vocab=%d batch=%d threads=%d precision=%s head=%s warmup_steps=%d "
         "steps=%lld "
         "steps_per_s=%.4f tokens_per_s=%.1f gflop_per_step=%.2f gflops=%.1f "
         "peak_gflops=%.1f peak_fraction=%.3f blas_peak_gflops=%.1f "
         "strata_peak_gflops=%.1f fma_peak_gflops=%.1f fma_fraction=%s "
         "round_trip_ns=%.0f/%.0f\n",
         g.name, g.layers, g.width, g.heads, g.context, g.vocab, batch, threads,
         precision, head, warm_steps, (long long)steps, steps_per_s,
         steps_per_s * batch * g.context, flops / 1e9, rate / 1e9, peak / 1e9,
         peak > 0 ? rate / peak : 0.0, blas / 1e9, own / 1e9, fma / 1e9,
         fma_text, round_trip_before, round_trip_after);
  return 0;
}
