/*
 * bench_linear.c — a large linear layer through strata's kernels
 * (st_linear_forward / st_linear_backward on a pool of T threads) against the
 * raw BLAS sgemm rate on the same shapes, measured in the same program and
 * interleaved so that both see the same machine (STYLE.md 13).
 *
 *   forward : out (B, OC) = in (B, IC) W^T + b           2*B*IC*OC + B*OC flops
 *   backward: dW (OC, IC) += dout^T in, din = dout W,
 *             db += column sums of dout                  4*B*IC*OC + B*OC flops
 *
 * The peer calls cblas_sgemm directly on the whole problem (one call per
 * GEMM, no bias work) with openblas_set_num_threads(T): the raw BLAS uses its
 * own threading. strata pins the BLAS to one thread (st_blas_init) and splits
 * each GEMM into fixed tiles over its own pool (src/base/gemm.c), which buys
 * thread-count-independent results; this bench shows what that costs. Both
 * rates are counted with the same flop formula, so the ratio is a ratio of
 * times.
 *
 * Prints one line per shape and pass:
 *   linear B=.. IC=.. OC=.. threads=T pass=forward strata_gflops=X
 *          raw_gflops=Y ratio=Z
 * and checks that strata's results match the raw sgemm (exit 1 if not).
 *
 * Usage: bench_linear [THREADS] [SECONDS]   (THREADS default: online CPUs;
 *        SECONDS: timed span per measurement, default 0.15)
 */
#include "strata.h"

#include <cblas.h>
#include <math.h>
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
#define set_blas_threads(n) ((void)(n)) /* no portable knob; raw runs as is */
#endif

enum { REPEATS = 4 };

typedef struct problem {
  int B, IC, OC;
  st_pool *pool;
  int threads;
  float *in, *w, *b, *out, *dout, *din, *dw, *db; /* strata */
  float *out_raw, *din_raw, *dw_raw;              /* raw sgemm */
} problem;

static void fill(float *x, size_t n, uint32_t stream) {
  st_rng rng;
  st_rng_init(&rng, 7, ST_RNG_DATA, stream);
  for (size_t i = 0; i < n; i++) x[i] = 2.0f * st_rng_uniform(&rng) - 1.0f;
}

static void strata_forward(problem *p) {
  st_linear_forward(p->pool, p->out, p->in, p->w, p->b, p->B, p->IC, p->OC);
}

static void strata_backward(problem *p) {
  st_linear_backward(p->pool, p->din, p->dw, p->db, p->dout, p->in, p->w, p->B,
                     p->IC, p->OC);
}

static void raw_forward(problem *p) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p->B, p->OC, p->IC, 1.0f,
              p->in, p->IC, p->w, p->IC, 0.0f, p->out_raw, p->OC);
}

static void raw_backward(problem *p) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, p->OC, p->IC, p->B, 1.0f,
              p->dout, p->OC, p->in, p->IC, 1.0f, p->dw_raw, p->IC);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p->B, p->IC, p->OC,
              1.0f, p->dout, p->OC, p->w, p->IC, 0.0f, p->din_raw, p->IC);
}

/* Seconds per call of fn, over at least `span` seconds after one warm-up. */
static double time_per_call(void (*fn)(problem *), problem *p, double span) {
  fn(p);
  int n = 0;
  double t0 = st_now(), elapsed;
  do {
    fn(p);
    n++;
    elapsed = st_now() - t0;
  } while (elapsed < span);
  return elapsed / n;
}

/* Strata with its own pool and a one-thread BLAS, then the BLAS threaded. */
static double time_strata(void (*fn)(problem *), problem *p, double span) {
  st_blas_init();
  return time_per_call(fn, p, span);
}

static double time_raw(void (*fn)(problem *), problem *p, double span) {
  set_blas_threads(p->threads);
  return time_per_call(fn, p, span);
}

static double max_rel_diff(const float *a, const float *ref, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)a[i] - ref[i]));
    scale = fmax(scale, fabs((double)ref[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

/* strata's forward minus its bias must equal the raw GEMM; its din and dW
 * must equal the raw din and dW (half the backward's FLOPs: unchecked, a
 * backward that skipped it would time at twice the rate). 1e-4 of the
 * largest entry: a sum of B, IC or OC <= 2048 products
 * of terms in [-1, 1] in float, summed in a different blocking, differs by a
 * few ulps of the partial sums (~1e-6 relative), far below 1e-4, while any
 * wrong index or missing tile gives an O(1) difference. */
static int check(problem *p) {
  size_t n_out = (size_t)p->B * p->OC, n_in = (size_t)p->B * p->IC;
  size_t n_w = (size_t)p->OC * p->IC;
  /* dW accumulates: both from zero here */
  memset(p->dw, 0, n_w * sizeof(float));
  memset(p->dw_raw, 0, n_w * sizeof(float));
  st_blas_init();
  strata_forward(p);
  strata_backward(p);
  set_blas_threads(p->threads);
  raw_forward(p);
  raw_backward(p);
  for (size_t s = 0; s < (size_t)p->B; s++)
    for (int o = 0; o < p->OC; o++) p->out[s * p->OC + o] -= p->b[o];
  double e_out = max_rel_diff(p->out, p->out_raw, n_out);
  double e_din = max_rel_diff(p->din, p->din_raw, n_in);
  double e_dw = max_rel_diff(p->dw, p->dw_raw, n_w);
  if (e_out > 1e-4 || e_din > 1e-4 || e_dw > 1e-4) {
    fprintf(stderr,
            "bench_linear: error: B=%d IC=%d OC=%d: strata differs from raw "
            "sgemm (forward %.2e, din %.2e, dW %.2e relative; tolerance "
            "1e-4)\n",
            p->B, p->IC, p->OC, e_out, e_din, e_dw);
    return -1;
  }
  return 0;
}

static void print_pass(const problem *p, const char *pass, double flops,
                       double t_strata, double t_raw) {
  printf("linear B=%d IC=%d OC=%d threads=%d pass=%s strata_gflops=%.1f "
         "raw_gflops=%.1f ratio=%.2f\n",
         p->B, p->IC, p->OC, p->threads, pass, flops / t_strata * 1e-9,
         flops / t_raw * 1e-9, t_raw / t_strata);
}

static int bench_shape(int B, int IC, int OC, int threads, st_pool *pool,
                       double span) {
  problem p = {.B = B, .IC = IC, .OC = OC, .pool = pool, .threads = threads};
  size_t n_in = (size_t)B * IC, n_out = (size_t)B * OC, n_w = (size_t)OC * IC;
  p.in = st_alloc(n_in * sizeof(float));
  p.w = st_alloc(n_w * sizeof(float));
  p.b = st_alloc((size_t)OC * sizeof(float));
  p.out = st_alloc(n_out * sizeof(float));
  p.dout = st_alloc(n_out * sizeof(float));
  p.din = st_alloc(n_in * sizeof(float));
  p.dw = st_alloc(n_w * sizeof(float));
  p.db = st_alloc((size_t)OC * sizeof(float));
  p.out_raw = st_alloc(n_out * sizeof(float));
  p.din_raw = st_alloc(n_in * sizeof(float));
  p.dw_raw = st_alloc(n_w * sizeof(float));
  int rc = -1;
  if (!p.in || !p.w || !p.b || !p.out || !p.dout || !p.din || !p.dw || !p.db ||
      !p.out_raw || !p.din_raw || !p.dw_raw) {
    fprintf(stderr, "bench_linear: error: out of memory for B=%d IC=%d OC=%d\n",
            B, IC, OC);
    goto done;
  }
  fill(p.in, n_in, 1);
  fill(p.w, n_w, 2);
  fill(p.b, (size_t)OC, 3);
  fill(p.dout, n_out, 4);
  if (check(&p)) goto done;

  /* Interleaved repeats, best of each: a neighbour stealing the CPU for a
   * moment lowers one sample, not the ratio. */
  double fs = INFINITY, fr = INFINITY, bs = INFINITY, br = INFINITY;
  for (int r = 0; r < REPEATS; r++) {
    fr = fmin(fr, time_raw(raw_forward, &p, span));
    fs = fmin(fs, time_strata(strata_forward, &p, span));
    br = fmin(br, time_raw(raw_backward, &p, span));
    bs = fmin(bs, time_strata(strata_backward, &p, span));
  }
  double gemm = 2.0 * B * (double)IC * OC, bias = (double)B * OC;
  print_pass(&p, "forward", gemm + bias, fs, fr);
  print_pass(&p, "backward", 2.0 * gemm + bias, bs, br);
  rc = 0;
done:
  st_free(p.in);
  st_free(p.w);
  st_free(p.b);
  st_free(p.out);
  st_free(p.dout);
  st_free(p.din);
  st_free(p.dw);
  st_free(p.db);
  st_free(p.out_raw);
  st_free(p.din_raw);
  st_free(p.dw_raw);
  return rc;
}

int main(int argc, char **argv) {
  int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  double span = 0.15;
  if (argc > 1) threads = atoi(argv[1]);
  if (argc > 2) span = atof(argv[2]);
  if (argc > 3 || threads < 1 || span <= 0) {
    fprintf(stderr, "usage: bench_linear [THREADS] [SECONDS]\n");
    return 2;
  }
  st_pool *pool = st_pool_create(threads);
  if (!pool) {
    fprintf(stderr, "bench_linear: error: cannot start %d threads\n", threads);
    return 1;
  }
  static const int shapes[][3] = {{256, 2048, 2048}, {256, 1024, 1024}};
  int rc = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && !rc; i++)
    rc = bench_shape(shapes[i][0], shapes[i][1], shapes[i][2], threads, pool,
                     span);
  st_pool_destroy(pool);
  return rc ? 1 : 0;
}
