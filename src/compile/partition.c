/*
 * partition.c — pass 2: contiguous blocks into stages, minimising the
 * slowest stage, with the PEs of each stage chosen by its demand.
 *
 * Two exact algorithms over the same model (compile.h):
 *
 *   DP        best[k][j][e] = the smallest bottleneck of blocks [0, j) in k
 *             stages whose last stage ends at snake position e. Every stage
 *             size is tried, so it is optimal by construction; it costs
 *             O(K n^2 U^2) for U units, fine for a cpu's cores.
 *
 *   BISECT    for a candidate bottleneck T every stage [i, j) needs at least
 *             need(i, j, T) units (the fewest that meet T and hold its
 *             memory; stage time falls and capacity grows with units, so
 *             that is a threshold). end[k][j] = the earliest snake position
 *             at which blocks [0, j) can finish in k stages meeting T:
 *                 end[k][j] = min over i of place(end[k-1][i], need(i, j, T))
 *             It is exact because place() is monotone in both the previous
 *             end and the units: finishing a prefix earlier, or giving a
 *             stage more units than it needs, can never let a later stage
 *             start earlier. So T is feasible iff some end[k][n] fits, and
 *             bisection on T (each feasible step lowering the upper bound to
 *             the bottleneck its plan really has) converges on the optimum
 *             T* within a few ulps. It costs O(K n^2) per step, independent
 *             of the PE count, so it serves an 850,000-PE mesh.
 *
 * Ties between stage counts go to fewer stages.
 */
#include "compile.h"

#include <stdlib.h>
#include <string.h>

/* Relative slack under which two bottlenecks count as equal when choosing
 * the number of stages (ties go to fewer stages). */
#define TIE 1e-9

/* ----------------------------------------------------------- the model */

/* The op class of the optimizer's pass (cost.c's names). */
enum { OP_OPTIMIZER = 3 };

/* Whether one-row products go by the bytes they stream (the profile has a
 * one-row rate) rather than at their class's GEMM rate. */
static int rows_by_bytes(const st_fabric *f) {
  return f->row_bandwidth > 0 || f->n_row_step >= 2;
}

/* The one-row rate of a block alone (its own bytes touched), for the
 * shares of a measured block: st_row_rate where the profile has the
 * curve, else the single figure. */
static double block_row_rate(const st_fabric *f, const st_block_cost *b) {
  return f->n_row_step >= 2 ? st_row_rate(f, b->ws_bytes) : f->row_bandwidth;
}

/* A class's linear products in a bf16 run (ST_PRODUCTS_BF16) whose
 * parallel efficiency the profile measured (gemm_slope_bf16, s_k): of T
 * one-core seconds, x T shared by the stage's c cores under fp32's e(c)
 * (slope s) and y T on one of them, both slowed alike by the other stages'
 * contention (F, seconds_per_work_at), so that F (x T (s + (1 - s)/c) + y
 * T) = F T (s_k + (1 - s_k)/c) at every c: x = (1 - s_k)/(1 - s), y =
 * (s_k - s)/(1 - s). A class that shares out better than fp32's (s_k < s)
 * keeps fp32's e(c) (y would be negative); so does every class of an fp32
 * run. */
static void bf16_share(const st_fabric *f, int k, double *x, double *y) {
  double s = f->efficiency_slope, sk = f->gemm_slope_bf16[k];
  *x = 1, *y = 0;
  if (f->bf16 != ST_PRODUCTS_BF16 || !(sk > s) || !(s < 1)) return;
  *x = (1 - sk) / (1 - s);
  *y = (sk - s) / (1 - s);
}

/* One block's calibrated terms (without the narrow and spill terms, which
 * depend on the stage): t[0], t[1] the forward and backward work (one-core
 * seconds that more cores share), t[2], t[3] their serial seconds, t[4],
 * t[5] a bf16 run's linear products that stay on one core (bf16_share);
 * one-row products at rho (infinite: see below). Uncalibrated: the FLOPs
 * as work, no serial time. */
static void block_terms(const st_fabric *f, const st_block_cost *b, double rho,
                        double t[6]) {
  t[0] = t[1] = t[2] = t[3] = t[4] = t[5] = 0;
  if (!f->calibrated) {
    t[0] = b->flops_fwd;
    t[1] = b->flops_bwd + b->flops_update;
    return;
  }
  /* one-row linear products by the bytes they stream at rho, where the
   * profile has a one-row rate (rho infinite: the caller adds those of
   * fused layers at its stage's rate, and the rest at its stage's rank-one
   * rate where the profile has that curve, else here at the rank-one
   * step's row bandwidth); else at their class's GEMM rate */
  if (rows_by_bytes(f) && isfinite(rho)) {
    t[0] += b->row_bytes_fwd / rho;
    t[1] += b->row_bytes_bwd / rho;
  } else if (rows_by_bytes(f) && f->n_rank_one < 2) {
    double r =
        f->row_bandwidth > 0 ? f->row_bandwidth : st_row_rate(f, b->ws_bytes);
    t[0] += (b->row_bytes_fwd - b->row_fused_fwd) / r;
    t[1] += (b->row_bytes_bwd - b->row_fused_bwd) / r;
  }
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    /* a linear layer's products of class k, one-core seconds: x of them
     * shared by the stage's cores under e(c), y serial (bf16_share) */
    double x, y, fwd = 0, bwd = 0, r = f->gemm_rate[k];
    bf16_share(f, k, &x, &y);
    if (!rows_by_bytes(f)) {
      fwd += b->row_gemm_fwd[k] / r;
      bwd += b->row_gemm_bwd[k] / r;
    }
    fwd += b->gemm_fwd[k] / r;
    bwd += b->gemm_bwd[k] / r;
    t[0] += x * fwd, t[1] += x * bwd;
    t[4] += y * fwd, t[5] += y * bwd;
    /* conv2d and attention at their kernels' rates when measured; their
     * products run one to a thread (a sample's, a head's), so they share
     * out over cores as the kernels' fp32 e(c) says in either precision */
    double cf = f->conv_rate[0][k] > 0 ? f->conv_rate[0][k] : r;
    double cb = f->conv_rate[1][k] > 0 ? f->conv_rate[1][k] : r;
    double af = f->attention_rate[0][k] > 0 ? f->attention_rate[0][k] : r;
    double ab = f->attention_rate[1][k] > 0 ? f->attention_rate[1][k] : r;
    t[0] += b->conv_fwd[k] / cf + b->attn_fwd[k] / af;
    t[1] += b->conv_bwd[k] / cb + b->attn_bwd[k] / ab;
  }
  for (int k = 0; k < ST_OP_CLASSES; k++) {
    t[2] += b->bytes_fwd[k] / f->op_bandwidth[k];
    /* (with rho infinite the caller streams the optimizer's bytes too) */
    if (k != OP_OPTIMIZER || isfinite(rho))
      t[3] += b->bytes_bwd[k] / f->op_bandwidth[k];
  }
}

/* The weight-sized passes through memory of one call of a multi-row linear
 * layer l (forward and backward): each of its step's GEMMs reads the
 * weights once (the forward, the input gradient, the fused head's product
 * made again) and the weight gradient's GEMM accumulates into its slab in
 * place (st_gemm with beta 1: src/ops/linear.c, xent.c), reading and
 * writing it: one pass more than the GEMMs. 4 for a layer's step, 3 for
 * the model's first layer (no input gradient). */
static double weight_passes(const st_block_cost *b, int l) {
  return b->linear_gemms[l] + 1;
}

/* The weights a narrow call (2 <= r rows) of a linear layer that fits L2
 * alone streams from the last-level cache when its stage's working set
 * has pushed it out of L2, per sample at the row bandwidth: forward the
 * weights once, backward the rest of its passes (the input gradient's read
 * of them, the weight gradient's read and write of its slab: weight_passes
 * less the forward's), each call covering r rows. Layers larger than L2
 * pay the narrow term instead. */
static void l2_traffic(const st_fabric *f, const st_block_cost *b,
                       double out[2]) {
  out[0] = out[1] = 0;
  if (!(f->row_bandwidth > 0) || !(f->l2_bytes > 0) || !(b->call_samples > 0))
    return;
  for (int l = 0; l < b->n_linear; l++) {
    double w = b->linear_bytes[l], r = b->linear_rows[l];
    if (r < 2 || w > f->l2_bytes) continue;
    double per = w / r * (r / b->call_samples) / f->row_bandwidth;
    out[0] += per;
    out[1] += (weight_passes(b, l) - 1) * per;
  }
}

/* The bytes one sample's step moves through memory in block b, at the
 * least: a one-row product's weights each pass (the forward's read, the
 * input gradient's, the weight gradient's read and write or the fused
 * update's weights and state: row_bytes_*), a wider product's the same
 * passes once a GEMM call shared by its rows (weight_passes: the weight
 * gradient is read and written there too), the other ops' reads and writes
 * and the optimizer's pass (bytes_*, per sample already). The activations
 * the GEMMs read and write are left out: a lower bound. */
static double dram_bytes(const st_block_cost *b) {
  double bytes = b->row_bytes_fwd + b->row_bytes_bwd;
  for (int l = 0; l < b->n_linear && b->call_samples > 0; l++)
    if (b->linear_rows[l] >= 2)
      bytes += weight_passes(b, l) * b->linear_bytes[l] / b->call_samples;
  /* of the other ops' bytes (cost.c), the norms' count their passes over a
   * row or group (st_layernorm_*, st_groupnorm_*: the statistics, then the
   * output; backward, two over dy and x), which stay in cache between
   * passes: from memory, forward x read and y written (2 of its 3 n),
   * backward dy and x read and dx written (3 of its 5 n) */
  static const double from_memory[2][ST_OP_CLASSES] = {{1, 2.0 / 3, 1, 1, 1},
                                                       {1, 3.0 / 5, 1, 1, 1}};
  for (int k = 0; k < ST_OP_CLASSES; k++)
    bytes += b->bytes_fwd[k] * from_memory[0][k] +
             b->bytes_bwd[k] * from_memory[1][k];
  return bytes;
}

int problem_init(problem *p, const st_block_cost *blocks, int n,
                 const st_fabric *f, double in_flight, double versions,
                 st_error *err) {
  memset(p, 0, sizeof *p);
  p->blocks = blocks;
  p->n = n;
  p->fabric = f;
  p->in_flight = in_flight;
  p->versions = versions;
  size_t cells = (size_t)(n + 1) * (size_t)(n + 1);
  double **arrays[] = {
      &p->flops_fwd,  &p->flops_bwd, &p->weights,    &p->state,
      &p->acts,       &p->work_fwd,  &p->work_bwd,   &p->serial_fwd,
      &p->serial_bwd, &p->region_in, &p->region_out, &p->region_layers,
      &p->ws,         &p->l2_fwd,    &p->l2_bwd,     &p->work_mem,
      &p->row_fwd,    &p->row_bwd,   &p->dram,       &p->touched,
      &p->solo_fwd,   &p->solo_bwd};
  int ok = 1;
  for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++)
    ok &= (*arrays[a] = st_alloc(cells * sizeof(double))) != NULL;
  /* Uncalibrated: the work is every FLOP at pe_flops. Calibrated: GEMM,
   * conv2d and attention FLOPs over their class's measured one-core rate
   * (core-seconds, at a rate of 1), and the single-threaded ops' bytes over
   * their bandwidth. */
  p->work_rate = f->calibrated ? 1.0 : f->pe_flops;
  if (!ok) {
    problem_free(p);
    return st_error_set(err, ST_ENOMEM, "out of memory for %d blocks", n);
  }
  /* weight prediction's arrays only where some block has it: measured, or
   * modelled by bytes (calibrated: no bandwidth prices them otherwise) */
  int last_free = 0;
  for (int i = 0; i < n; i++)
    last_free |= blocks[i].measured_lwp > 0 ||
                 (f->calibrated && blocks[i].lwp_bytes > 0);
  if (last_free) {
    p->last_free_work = st_alloc(cells * sizeof(double));
    p->last_free_serial = st_alloc(cells * sizeof(double));
    if (!p->last_free_work || !p->last_free_serial) {
      problem_free(p);
      return st_error_set(err, ST_ENOMEM, "out of memory for %d blocks", n);
    }
  }
  for (int i = 0; i < n; i++) {
    double ff = 0, fb = 0, weights = 0, state = 0, acts = blocks[i].in_bytes;
    double lw = 0, ls = 0; /* weight prediction: work, serial seconds */
    double rin = 0, rout = 0, rl = 0; /* through a mesh region */
    double wf = 0, wb = 0, sf = 0, sb = 0, ws = 0, dram = 0, touched = 0;
    double of = 0, ob = 0; /* a bf16 run's products on one core */
    double narrow[2] = {0, 0}, traffic[2] = {0, 0}; /* forward, backward */
    double l2t[2] = {0, 0};  /* weights from past L2, seconds a sample */
    double wn = 0, wsc = 0;  /* the workspace's largest terms */
    double rbf = 0, rbb = 0; /* one-row bytes streamed (row curve) */
    double ubf = 0, ubb = 0; /* the same, gradient accumulated (rank one) */
    for (int j = i + 1; j <= n; j++) {
      const st_block_cost *b = &blocks[j - 1];
      wn = fmax(wn, b->work_numel_bytes * b->call_samples);
      wsc = fmax(wsc, b->work_scratch_bytes * b->call_samples);
      ff += b->flops_fwd;
      fb += b->flops_bwd;
      if (b->measured_fwd > 0 || b->measured_bwd > 0) {
        /* timed on one core (st_plan_measure): its seconds stand for
         * every modelled term, shared between work that more cores speed
         * up and serial time as the model shares the block's */
        double m[6];
        block_terms(f, b, block_row_rate(f, b), m);
        double par_f = m[0] + m[2] + m[4] > 0 ? m[0] / (m[0] + m[2] + m[4]) : 1;
        double par_b = m[1] + m[3] + m[5] > 0 ? m[1] / (m[1] + m[3] + m[5]) : 1;
        wf += b->measured_fwd * par_f * p->work_rate;
        wb += b->measured_bwd * par_b * p->work_rate;
        sf += b->measured_fwd * (1 - par_f);
        sb += b->measured_bwd * (1 - par_b);
        lw += b->measured_lwp * par_b * p->work_rate;
        ls += b->measured_lwp * (1 - par_b);
        ws += b->ws_bytes;
      } else if (f->calibrated) {
        double nb[2], tb[2], m[6];
        linear_memory(f, b, nb, tb);
        double lb[2];
        l2_traffic(f, b, lb);
        for (int d = 0; d < 2; d++) {
          narrow[d] += nb[d];
          traffic[d] += tb[d];
          l2t[d] += lb[d];
        }
        ws += b->ws_bytes;
        /* with the curve, one-row products at the rate of the whole
         * range's bytes (below); else at the single figure */
        block_terms(f, b, f->n_row_step >= 2 ? INFINITY : f->row_bandwidth, m);
        rbf += b->row_fused_fwd;
        rbb += b->row_fused_bwd;
        if (f->n_row_step >= 2) rbb += b->bytes_bwd[OP_OPTIMIZER];
        if (f->n_row_step >= 2 && f->n_rank_one >= 2) {
          ubf += b->row_bytes_fwd - b->row_fused_fwd;
          ubb += b->row_bytes_bwd - b->row_fused_bwd;
        }
        wf += m[0];
        wb += m[1];
        sf += m[2];
        sb += m[3];
        of += m[4];
        ob += m[5];
        ls += b->lwp_bytes / f->op_bandwidth[3]; /* as the update's bytes */
      } else {
        wf += b->flops_fwd;
        wb += b->flops_bwd + b->flops_update;
        ws += b->ws_bytes;
      }
      dram += dram_bytes(b);
      touched += b->ws_bytes + b->state_touched;
      weights += b->param_bytes;
      state += b->state_bytes;
      acts += b->act_bytes;
      rin += b->region_in;
      rout += b->region_out;
      rl += b->region_layers;
      int64_t at = range_index(p, i, j);
      /* the memory terms ride with the GEMMs' work */
      double spill = st_spill_fraction(f, ws) * f->spill_cost;
      p->flops_fwd[at] = ff;
      p->flops_bwd[at] = fb;
      /* one-row products at the rate of the bytes the range touches a
       * step (its weights, state and activations: each comes back after
       * the others have passed through the caches), and so the optimizer's
       * pass, which streams weights, gradients and state the same way, on
       * the pool (st_optim_step) */
      double rho = f->n_row_step >= 2 && rbf + rbb > 0 ? st_row_rate(f, ws) : 0;
      double row_f = rho > 0 ? rbf / rho : 0, row_b = rho > 0 ? rbb / rho : 0;
      /* and those whose gradient accumulates at the rank-one step's rate
       * for the same bytes, as work the GEMMs' cores share */
      double ro = ubf + ubb > 0 ? st_rank_one_rate(f, ws) : 0;
      p->work_fwd[at] =
          wf + narrow[0] + spill * traffic[0] + (ro > 0 ? ubf / ro : 0);
      p->work_bwd[at] =
          wb + narrow[1] + spill * traffic[1] + (ro > 0 ? ubb / ro : 0);
      p->row_fwd[at] = row_f;
      p->row_bwd[at] = row_b;
      p->solo_fwd[at] = of;
      p->solo_bwd[at] = ob;
      p->ws[at] = ws;
      p->dram[at] = dram;
      p->touched[at] = touched;
      p->l2_fwd[at] = l2t[0];
      p->l2_bwd[at] = l2t[1];
      p->serial_fwd[at] = sf;
      p->serial_bwd[at] = sb;
      if (last_free) {
        p->last_free_work[at] = lw;
        p->last_free_serial[at] = ls;
      }
      p->weights[at] = weights;
      p->state[at] = state;
      p->acts[at] = acts;
      p->work_mem[at] = 5 * wn + wsc;
      p->region_in[at] = rin;
      p->region_out[at] = rout;
      p->region_layers[at] = rl;
    }
  }
  return 0;
}

double st_spill_fraction(const st_fabric *f, double ws) {
  int n = f->n_spill;
  if (!f->calibrated || n < 1 || !(f->spill_cost > 0) || ws <= f->spill_ws[0])
    return 0;
  for (int k = 1; k < n; k++)
    if (ws <= f->spill_ws[k]) {
      double a = f->spill_ws[k - 1], b = f->spill_ws[k];
      double fa = f->spill_fraction[k - 1], fb = f->spill_fraction[k];
      return b > a ? fa + (fb - fa) * (ws - a) / (b - a) : fb;
    }
  return 1;
}

double st_row_slope(const st_fabric *f, double ws) {
  if (!f->calibrated || f->n_row_step < 2) return 0;
  double a = f->row_step_ws[0], b = f->row_step_ws[1];
  if (ws <= a) return f->row_slope_small;
  if (ws >= b || !(b > a)) return f->row_slope;
  return f->row_slope_small +
         (f->row_slope - f->row_slope_small) * (ws - a) / (b - a);
}

/* A curve's rate at ws bytes touched: seconds per byte interpolated
 * between its two points around ws, the first rate below the first point
 * and the last past the last; 0 without a curve. */
static double curve_rate(const st_fabric *f, const double *x, const double *r,
                         int n, double ws) {
  if (!f->calibrated || n < 2) return 0;
  if (ws <= x[0]) return r[0];
  for (int k = 1; k < n; k++)
    if (ws <= x[k]) {
      double a = x[k - 1], b = x[k], ta = 1 / r[k - 1], tb = 1 / r[k];
      return 1 / (b > a ? ta + (tb - ta) * (ws - a) / (b - a) : tb);
    }
  return r[n - 1];
}

double st_row_rate(const st_fabric *f, double ws) {
  return curve_rate(f, f->row_step_ws, f->row_step_rate, f->n_row_step, ws);
}

double st_rank_one_rate(const st_fabric *f, double ws) {
  return curve_rate(f, f->rank_one_ws, f->rank_one_rate, f->n_rank_one, ws);
}

void linear_memory(const st_fabric *f, const st_block_cost *b, double narrow[2],
                   double traffic[2]) {
  narrow[0] = narrow[1] = traffic[0] = traffic[1] = 0;
  if (!(b->call_samples > 0)) return;
  double ref = ST_GEMM_REF_ROWS;
  for (int l = 0; l < b->n_linear; l++) {
    double w = b->linear_bytes[l], r = b->linear_rows[l];
    double g = b->linear_gemms[l];
    /* at one row the layer streams its weights every call, at the row
     * bandwidth (the LLC's; past it, memory's, which is not modelled):
     * the spill law, a re-read of weights a hot step keeps in cache, is
     * not its cost (with it a PB stage of 9.6 MB was planned at 574 us,
     * without it 455, measured 353-464) */
    if (r < 2 && rows_by_bytes(f)) continue;
    /* per sample, each GEMM of the step a third of it: one forward, the
     * rest (one or two) backward */
    double gemm = 1.0 / 3 / b->call_samples, nar = 0;
    /* at one row the linear kernels are matrix-vector products, not GEMMs
     * (st_linear_forward / _backward at batch 1): not this law */
    /* and whatever the weights, the narrow kernels' slower FLOPs: a layer
     * step's three GEMMs are 6 r (w / 4) of them */
    if (r >= 2 && r < ref)
      nar = (1 - r / ref) * (f->narrow_cost * fmax(w - f->l2_bytes, 0) +
                             f->narrow_flop_cost * 1.5 * r * w);
    narrow[0] += gemm * nar;
    narrow[1] += (g - 1) * gemm * nar;
    traffic[0] += gemm * w;
    traffic[1] += (g - 1) * gemm * w;
  }
}

void problem_free(problem *p) {
  double **arrays[] = {
      &p->flops_fwd,  &p->flops_bwd, &p->weights,        &p->state,
      &p->acts,       &p->work_fwd,  &p->work_bwd,       &p->serial_fwd,
      &p->serial_bwd, &p->region_in, &p->region_out,     &p->region_layers,
      &p->ws,         &p->l2_fwd,    &p->l2_bwd,         &p->row_fwd,
      &p->row_bwd,    &p->work_mem,  &p->last_free_work, &p->last_free_serial,
      &p->dram,       &p->touched,   &p->solo_fwd,       &p->solo_bwd};
  for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
    st_free(*arrays[a]);
    *arrays[a] = NULL;
  }
}

double stage_in_flight(const problem *p, int s) {
  return p->in_flight_at ? p->in_flight_at[s] : p->in_flight;
}

double stage_versions(const problem *p, int s) {
  return p->versions_at ? p->versions_at[s] : p->versions;
}

double stage_memory(const problem *p, int i, int j, int s) {
  int64_t at = range_index(p, i, j);
  return stage_versions(p, s) * p->weights[at] + p->state[at] +
         stage_in_flight(p, s) * p->acts[at] + p->work_mem[at];
}

/* The bytes stage [i, j) hands on per sample: its output activation
 * forward, over the edge after it (j < n), and the gradient of its input
 * back, over the edge before it (i > 0). */
static void comm_bytes(const problem *p, int i, int j, double *before,
                       double *after) {
  *before = *after = 0;
  if (p->no_edges) return;
  if (j < p->n) *after = p->blocks[j - 1].out_bytes;
  if (i > 0) *before = p->blocks[i].in_bytes;
}

void layout_rect(const layout *L, int64_t start, int64_t span, int64_t r[4]) {
  int64_t W = L->width, band = start / W, off = start % W;
  if (span <= W) {
    r[2] = span;
    r[3] = L->h;
    r[0] = band % 2 == 0 ? off : W - off - span;
  } else {
    r[2] = W;
    r[3] = span / W * L->h;
    r[0] = 0;
  }
  r[1] = band * L->h;
}

/* The length of [a0, a0 + a) and [b0, b0 + b) in common. */
static int64_t overlap(int64_t a0, int64_t a, int64_t b0, int64_t b) {
  int64_t lo = a0 > b0 ? a0 : b0, hi = a0 + a < b0 + b ? a0 + a : b0 + b;
  return hi > lo ? hi - lo : 0;
}

double layout_links(const problem *p, const layout *L, int64_t start_a,
                    int64_t span_a, int64_t start_b, int64_t span_b) {
  if (p->fabric->kind != ST_FABRIC_MESH) return 1;
  int64_t a[4], b[4], links = 0;
  layout_rect(L, start_a, span_a, a);
  layout_rect(L, start_b, span_b, b);
  if (a[0] + a[2] == b[0] || b[0] + b[2] == a[0]) /* side by side */
    links = overlap(a[1], a[3], b[1], b[3]);
  if (a[1] + a[3] == b[1] || b[1] + b[3] == a[1]) { /* one above the other */
    int64_t across = overlap(a[0], a[2], b[0], b[2]);
    links = across > links ? across : links;
  }
  /* consecutive stages always share an edge (the snake; tested): never 0 */
  return links > 0 ? (double)links : 1;
}

/* Seconds per unit of work on c PEs: 1 / (c r e(c)) written as
 * (s + (1 - s)/c) / r, which is the same number but provably non-increasing
 * in c in floating point too (each operation is monotone), so "the fewest
 * units meeting T" is well defined. With core sharing (a calibrated cpu,
 * compile.h), times m(c) / m(P): e(c) was measured with c cores busy, the
 * plan keeps all P busy; also non-increasing in c. */
static double seconds_per_work_at(const problem *p, double c, double s) {
  const st_fabric *f = p->fabric;
  double t = (s + (1.0 - s) / c) / p->work_rate;
  double m = f->sharing_slope;
  if (m > 0 && c < (double)f->pes)
    t *= (1.0 + m * ((double)f->pes - 1.0)) / (1.0 + m * (c - 1.0));
  return t;
}

static double seconds_per_work(const problem *p, double c) {
  return seconds_per_work_at(p, c, p->fabric->efficiency_slope);
}

void region_shape(const layout *L, int64_t units, double *w, double *h) {
  if (units <= L->width) {
    *w = (double)units;
    *h = L->h;
  } else { /* whole bands */
    *w = L->width;
    *h = (double)(units / L->width) * L->h;
  }
}

double stage_dram_time(const problem *p, const layout *L, int i, int j,
                       int64_t units) {
  const st_fabric *f = p->fabric;
  if (!(f->memory_bandwidth > 0) || !p->dram) return 0;
  int64_t at = range_index(p, i, j);
  double share = (double)units * L->h / (double)f->pes;
  /* a mesh's PEs have no cache before their memory (cache_bytes 0): every
   * byte is the SRAM's, at the PEs' share of the fabric's bandwidth */
  double cache = f->cache_bytes > 0 ? f->cache_bytes : 0;
  if (p->touched[at] <= cache * share) return 0;
  return p->dram[at] / (f->memory_bandwidth * share);
}

double stage_time(const problem *p, const layout *L, int i, int j,
                  int64_t units, double *fwd, double *bwd, double *comm) {
  return stage_time_links(p, L, i, j, units, p->edge_before, p->edge_after, fwd,
                          bwd, comm);
}

double stage_time_links(const problem *p, const layout *L, int i, int j,
                        int64_t units, double before, double after, double *fwd,
                        double *bwd, double *comm) {
  const st_fabric *f = p->fabric;
  double g = seconds_per_work(p, (double)units * L->h);
  int64_t at = range_index(p, i, j);
  double tf = p->work_fwd[at] * g + p->serial_fwd[at];
  double tb = p->work_bwd[at] * g + p->serial_bwd[at];
  if (p->solo_fwd[at] > 0 || p->solo_bwd[at] > 0) { /* bf16_share's y */
    double g1 = seconds_per_work_at(p, (double)units * L->h, 1.0);
    tf += p->solo_fwd[at] * g1;
    tb += p->solo_bwd[at] * g1;
  }
  if (p->row_fwd[at] > 0 || p->row_bwd[at] > 0) {
    double gr = seconds_per_work_at(p, (double)units * L->h,
                                    st_row_slope(f, p->ws[at]));
    tf += p->row_fwd[at] * gr;
    tb += p->row_bwd[at] * gr;
  }
  if (p->last_free_work && j < p->n)
    tb += p->last_free_work[at] * g + p->last_free_serial[at];
  /* a core whose share of the step touches more than its L2 keeps no
   * layer's weights there between calls (l2_traffic) */
  if (f->l2_bytes > 0 && p->ws[at] / ((double)units * L->h) > f->l2_bytes) {
    tf += p->l2_fwd[at] * g;
    tb += p->l2_bwd[at] * g;
  }
  /* the edges' links: as given, else the search's h a side (on a cpu one
   * copy) */
  double h = f->kind == ST_FABRIC_MESH ? L->h : 1, sent_back, sent_on;
  comm_bytes(p, i, j, &sent_back, &sent_on);
  if (!(before > 0)) before = h;
  if (!(after > 0)) after = h;
  double tc = before == after
                  ? (sent_back + sent_on) / (f->link_bandwidth * before)
                  : sent_back / (f->link_bandwidth * before) +
                        sent_on / (f->link_bandwidth * after);
  if (f->kind == ST_FABRIC_MESH) {
    /* the region's own traffic, each pass (forward, backward): the layers'
     * inputs enter along its west edge, h links wide, their partial sums
     * cross it to the south edge, w links wide, and each layer's data
     * crosses w + h hops; and each PE's fixed work per layer */
    double w, h, nl = p->region_layers[at];
    region_shape(L, units, &w, &h);
    double pass = p->region_in[at] / (h * f->link_bandwidth) +
                  p->region_out[at] / (w * f->link_bandwidth) +
                  nl * (w + h) * f->hop_latency;
    tc += 2 * pass;
    tf += nl * f->pe_overhead;
    tb += nl * f->pe_overhead;
  }
  /* no faster than memory carries its bytes (a cpu's DRAM, a mesh's
   * SRAM): the passes stretched in proportion, the copies to the next
   * stage beside them */
  double dram = stage_dram_time(p, L, i, j, units);
  if (dram > tf + tb && tf + tb > 0) {
    double k = dram / (tf + tb);
    tf *= k;
    tb *= k;
  }
  if (fwd) *fwd = tf;
  if (bwd) *bwd = tb;
  if (comm) *comm = tc;
  return tf + tb + tc;
}

int stage_fits(const problem *p, const layout *L, int i, int j, int s,
               int64_t units) {
  return stage_memory(p, i, j, s) <=
         (double)units * L->h * p->fabric->pe_memory;
}

int64_t units_for_memory(const problem *p, const layout *L, int i, int j,
                         int s) {
  double unit_bytes = (double)L->h * p->fabric->pe_memory;
  double guess = ceil(stage_memory(p, i, j, s) / unit_bytes);
  if (!(guess <= (double)L->units)) return INT64_MAX;
  int64_t u = guess < 1 ? 1 : (int64_t)guess;
  /* the division rounds; settle on the exact threshold of stage_fits */
  while (u > 1 && stage_fits(p, L, i, j, s, u - 1)) u--;
  while (u <= L->units && !stage_fits(p, L, i, j, s, u)) u++;
  return u <= L->units ? u : INT64_MAX;
}

/* The unit counts a stage may take, as indices: 0 .. W - 1 are 1 .. W
 * units inside a band, W .. W + bands - 2 are 2 .. bands whole bands. */
static int64_t n_sizes(const layout *L) { return L->width + L->bands - 1; }

static int64_t size_units(const layout *L, int64_t idx) {
  return idx < L->width ? idx + 1 : (idx - L->width + 2) * L->width;
}

/* The first size index holding at least u units. */
static int64_t size_index(const layout *L, int64_t u) {
  if (u <= L->width) return u < 1 ? 0 : u - 1;
  return (u + L->width - 1) / L->width - 2 + L->width;
}

static double time_at(const problem *p, const layout *L, int i, int j,
                      int64_t idx) {
  return stage_time(p, L, i, j, size_units(L, idx), 0, 0, 0);
}

/* The index of the least time in [a, b], the time taken to fall and then
 * rise (ties: the first): ternary search, then the few left. */
static int64_t argmin_run(const problem *p, const layout *L, int i, int j,
                          int64_t a, int64_t b) {
  while (b - a > 3) {
    int64_t m1 = a + (b - a) / 3, m2 = b - (b - a) / 3;
    if (time_at(p, L, i, j, m1) <= time_at(p, L, i, j, m2))
      b = m2;
    else
      a = m1 + 1;
  }
  int64_t best = a;
  for (int64_t x = a + 1; x <= b; x++)
    if (time_at(p, L, i, j, x) < time_at(p, L, i, j, best)) best = x;
  return best;
}

/* The two runs of sizes: inside a band, then whole bands. */
static int runs(const layout *L, int64_t lo[2], int64_t hi[2]) {
  lo[0] = 0;
  hi[0] = (L->units < L->width ? L->units : L->width) - 1;
  if (L->bands < 2) return 1;
  lo[1] = L->width;
  hi[1] = n_sizes(L) - 1;
  return 2;
}

/* units_for_time with each run's fastest size given (argmin_run). */
static int64_t first_meeting(const problem *p, const layout *L, int i, int j,
                             double T, int64_t from, const int64_t amin[2]) {
  int64_t lo[2], hi[2];
  int nr = runs(L, lo, hi);
  int64_t start = size_index(L, from);
  for (int r = 0; r < nr; r++) {
    int64_t a = start > lo[r] ? start : lo[r], m = amin[r];
    if (a > hi[r]) continue;
    if (T == INFINITY) return size_units(L, a);
    if (a > m) { /* past the fastest: it only gets slower */
      if (time_at(p, L, i, j, a) <= T) return size_units(L, a);
      continue;
    }
    if (!(time_at(p, L, i, j, m) <= T)) continue;
    while (a < m) { /* the time falls over [a, m]: the first <= T */
      int64_t mid = a + (m - a) / 2;
      if (time_at(p, L, i, j, mid) <= T)
        m = mid;
      else
        a = mid + 1;
    }
    return size_units(L, a);
  }
  return INT64_MAX;
}

static void run_argmins(const problem *p, const layout *L, int i, int j,
                        int64_t amin[2]) {
  int64_t lo[2], hi[2];
  int nr = runs(L, lo, hi);
  amin[1] = 0;
  for (int r = 0; r < nr; r++) amin[r] = argmin_run(p, L, i, j, lo[r], hi[r]);
}

int64_t units_for_time(const problem *p, const layout *L, int i, int j,
                       double T, int64_t from) {
  int64_t amin[2];
  run_argmins(p, L, i, j, amin);
  return first_meeting(p, L, i, j, T, from, amin);
}

int64_t units_fastest(const problem *p, const layout *L, int i, int j) {
  int64_t amin[2], lo[2], hi[2];
  run_argmins(p, L, i, j, amin);
  int nr = runs(L, lo, hi);
  int64_t best = amin[0];
  if (nr > 1 && time_at(p, L, i, j, amin[1]) < time_at(p, L, i, j, best))
    best = amin[1];
  return size_units(L, best);
}

int64_t layout_place(const layout *L, int64_t end, int64_t u, int64_t *span) {
  int64_t W = L->width, start;
  if (u <= W) {
    int64_t off = end % W;
    start = off + u <= W ? end : (end / W + 1) * W;
    *span = u;
  } else { /* whole bands, starting at a band's start */
    start = end % W == 0 ? end : (end / W + 1) * W;
    *span = (u + W - 1) / W * W;
  }
  return start + *span <= L->units ? start : -1;
}

void partition_free(partition *q) {
  st_free(q->cut);
  st_free(q->units);
  st_free(q->by_k);
  memset(q, 0, sizeof *q);
}

static int partition_alloc(partition *q, int k) {
  q->k = k;
  q->cut = st_alloc((size_t)(k + 1) * sizeof *q->cut);
  q->units = st_alloc((size_t)k * sizeof *q->units);
  return q->cut && q->units ? 0 : ST_ENOMEM;
}

/* ------------------------------------------------------------------ DP */

/* Whether blocks [i, j) may form a stage (execution.stage_blocks). */
static int range_allowed(const problem *p, int i, int j) {
  return !p->cut_ok || (p->cut_ok[i] && p->cut_ok[j]);
}

/* The units a stage may take, in increasing order: every count up to one
 * band, then whole bands (other counts above a band round up to those). */
static int64_t next_units(const layout *L, int64_t u) {
  return u < L->width ? u + 1 : (u / L->width + 1) * L->width;
}

static int solve_dp(const problem *p, const layout *L, int k_lo, int k_hi,
                    partition *out, double *by_k) {
  int n = p->n;
  int64_t U = L->units;
  size_t per_k = (size_t)(n + 1) * (size_t)(U + 1);
  size_t cells = (size_t)(k_hi + 1) * per_k;
  double *best = st_alloc(cells * sizeof *best);
  int *from_block = st_alloc(cells * sizeof *from_block);
  int64_t *from_end = st_alloc(cells * sizeof *from_end);
  int64_t *from_span = st_alloc(cells * sizeof *from_span);
  if (!best || !from_block || !from_end || !from_span) {
    st_free(best), st_free(from_block), st_free(from_end), st_free(from_span);
    return ST_ENOMEM;
  }
#define AT(k, j, e)                                                            \
  ((size_t)(k)*per_k + (size_t)(j) * (size_t)(U + 1) + (size_t)(e))
  for (size_t c = 0; c < cells; c++) best[c] = INFINITY;
  best[AT(0, 0, 0)] = 0;
  for (int k = 1; k <= k_hi; k++)
    for (int j = k; j <= n; j++)
      for (int i = k - 1; i < j; i++)
        for (int64_t e0 = 0; e0 <= U && range_allowed(p, i, j); e0++) {
          double before = best[AT(k - 1, i, e0)];
          if (before == INFINITY) continue;
          for (int64_t u = 1; u <= U; u = next_units(L, u)) {
            int64_t span, start = layout_place(L, e0, u, &span);
            if (start < 0) break; /* monotone: larger u cannot fit either */
            if (!stage_fits(p, L, i, j, k - 1, span)) continue;
            double t = stage_time(p, L, i, j, span, 0, 0, 0);
            double v = t > before ? t : before;
            size_t at = AT(k, j, start + span);
            if (v < best[at]) {
              best[at] = v;
              from_block[at] = i;
              from_end[at] = e0;
              from_span[at] = span;
            }
          }
        }
  /* The best over allowed k; ties (within TIE) go to the fewest stages. */
  double overall = INFINITY;
  for (int k = 1; k <= k_hi; k++) {
    double v = INFINITY;
    for (int64_t e = 0; e <= U; e++)
      if (best[AT(k, n, e)] < v) v = best[AT(k, n, e)];
    if (by_k) by_k[k - 1] = v;
    if (k >= k_lo && v < overall) overall = v;
  }
  int rc = ST_EUNSUPPORTED, pick = -1;
  for (int k = k_lo; k <= k_hi && pick < 0 && overall < INFINITY; k++)
    for (int64_t e = 0; e <= U && pick < 0; e++)
      if (best[AT(k, n, e)] <= overall * (1 + (k_lo < k_hi ? TIE : 0)))
        pick = k;
  if (pick > 0 && (rc = partition_alloc(out, pick)) == 0) {
    int64_t end = -1;
    double v = INFINITY;
    for (int64_t e = 0; e <= U; e++)
      if (best[AT(pick, n, e)] < v) v = best[AT(pick, n, e)], end = e;
    out->bottleneck = v;
    int j = n;
    for (int k = pick; k >= 1; k--) {
      size_t at = AT(k, j, end);
      int i = from_block[at];
      int64_t e0 = from_end[at];
      out->cut[k] = j;
      out->units[k - 1] = from_span[at];
      j = i;
      end = e0;
    }
    out->cut[0] = 0;
  }
#undef AT
  st_free(best);
  st_free(from_block);
  st_free(from_end);
  st_free(from_span);
  return rc;
}

/* -------------------------------------------------------------- BISECT */

typedef struct bisect_state {
  const problem *p;
  const layout *L;
  int k_hi;
  int64_t *mem_units; /* k_hi x (n + 1)^2: units_for_memory as stage s */
  int64_t *amin;      /* 2 (n + 1)^2: each run's fastest size (run_argmins) */
  int64_t *need;      /* k_hi x (n + 1)^2: need(i, j, T) as stage s */
  int64_t *end;       /* (k_hi + 1) x (n + 1) */
  int *from;          /* (k_hi + 1) x (n + 1) */
} bisect_state;

/* Fills end[k][j] for T; returns the smallest k in [k_lo, k_hi] whose
 * end[k][n] fits, or 0. */
static int feasible(bisect_state *b, double T, int k_lo) {
  const problem *p = b->p;
  int n = p->n;
  int64_t cells = (int64_t)(n + 1) * (n + 1);
  /* stage index s only changes the memory when the in-flight count does */
  int per_stage = p->in_flight_at || p->versions_at;
  for (int s = 0; s < (per_stage ? b->k_hi : 1); s++)
    for (int i = 0; i < n; i++)
      for (int j = i + 1; j <= n; j++) {
        int64_t at = range_index(p, i, j), m = b->mem_units[s * cells + at];
        if (!range_allowed(p, i, j)) m = INT64_MAX;
        if (s > 0 && m == b->mem_units[(s - 1) * cells + at] &&
            range_allowed(p, i, j)) { /* the same memory, the same need */
          b->need[s * cells + at] = b->need[(s - 1) * cells + at];
          continue;
        }
        b->need[s * cells + at] =
            m == INT64_MAX
                ? INT64_MAX
                : first_meeting(p, b->L, i, j, T, m, b->amin + 2 * at);
      }
  int64_t *end = b->end;
  for (int c = 0; c < (b->k_hi + 1) * (n + 1); c++) end[c] = INT64_MAX;
  end[0] = 0;
  for (int k = 1; k <= b->k_hi; k++)
    for (int j = k; j <= n; j++)
      for (int i = k - 1; i < j; i++) {
        int64_t
            e0 = end[(k - 1) * (n + 1) + i],
            u = b->need[(per_stage ? k - 1 : 0) * cells + range_index(p, i, j)];
        if (e0 == INT64_MAX || u == INT64_MAX) continue;
        int64_t span, start = layout_place(b->L, e0, u, &span);
        if (start < 0) continue;
        if (start + span < end[k * (n + 1) + j]) {
          end[k * (n + 1) + j] = start + span;
          b->from[k * (n + 1) + j] = i;
        }
      }
  for (int k = k_lo; k <= b->k_hi; k++)
    if (end[k * (n + 1) + n] != INT64_MAX) return k;
  return 0;
}

/* The plan of k stages that the last feasible() call found, into out (if
 * not NULL); returns its real bottleneck. */
static double extract(bisect_state *b, int k, partition *out) {
  const problem *p = b->p;
  int n = p->n, cut[k + 1];
  int64_t cells = (int64_t)(n + 1) * (n + 1);
  int per_stage = p->in_flight_at || p->versions_at;
  cut[k] = n;
  for (int s = k; s >= 1; s--) cut[s - 1] = b->from[s * (n + 1) + cut[s]];
  double worst = 0;
  int64_t e = 0;
  for (int s = 0; s < k; s++) {
    int64_t span, u = b->need[(per_stage ? s : 0) * cells +
                              range_index(p, cut[s], cut[s + 1])];
    int64_t start = layout_place(b->L, e, u, &span);
    e = start + span;
    double t = stage_time(p, b->L, cut[s], cut[s + 1], span, 0, 0, 0);
    if (t > worst) worst = t;
    if (out) {
      out->cut[s] = cut[s];
      out->units[s] = span;
    }
  }
  if (out) {
    out->cut[k] = n;
    out->bottleneck = worst;
  }
  return worst;
}

static int solve_bisect_range(bisect_state *b, int k_lo, int k_hi,
                              partition *out) {
  int k = feasible(b, INFINITY, k_lo);
  if (!k) return ST_EUNSUPPORTED;
  (void)k_hi;
  double lo = 0, hi = extract(b, k, NULL);
  for (int iter = 0; iter < 2000; iter++) {
    double mid = lo + (hi - lo) / 2;
    if (!(mid > lo && mid < hi)) break;
    if ((k = feasible(b, mid, k_lo)))
      hi = extract(b, k, NULL); /* <= mid: the plan's real bottleneck */
    else
      lo = mid;
  }
  /* hi is achieved and nothing below lo is: the optimum is in (lo, hi].
   * Ties go to the fewest stages. */
  double T = k_lo < b->k_hi ? hi * (1 + TIE) : hi;
  k = feasible(b, T, k_lo);
  if (!k) k = feasible(b, hi, k_lo); /* cannot happen; kept for safety */
  if (!k) return ST_EUNSUPPORTED;
  int rc = partition_alloc(out, k);
  if (rc) return rc;
  extract(b, k, out);
  return 0;
}

static int solve_bisect(const problem *p, const layout *L, int k_lo, int k_hi,
                        partition *out, double *by_k) {
  int n = p->n;
  size_t cells = (size_t)(n + 1) * (size_t)(n + 1);
  int per_stage = p->in_flight_at || p->versions_at;
  size_t layers = per_stage ? (size_t)k_hi : 1;
  bisect_state b = {.p = p, .L = L, .k_hi = k_hi};
  b.mem_units = st_alloc(layers * cells * sizeof *b.mem_units);
  b.need = st_alloc(layers * cells * sizeof *b.need);
  b.amin = st_alloc(2 * cells * sizeof *b.amin);
  b.end = st_alloc((size_t)(k_hi + 1) * (size_t)(n + 1) * sizeof *b.end);
  b.from = st_alloc((size_t)(k_hi + 1) * (size_t)(n + 1) * sizeof *b.from);
  int rc = ST_ENOMEM;
  if (b.mem_units && b.need && b.amin && b.end && b.from) {
    for (int i = 0; i < n; i++)
      for (int j = i + 1; j <= n; j++) {
        int64_t at = range_index(p, i, j);
        for (size_t s = 0; s < layers; s++)
          b.mem_units[s * cells + at] = units_for_memory(p, L, i, j, (int)s);
        run_argmins(p, L, i, j, b.amin + 2 * at);
      }
    rc = solve_bisect_range(&b, k_lo, k_hi, out);
    for (int k = 1; by_k && k <= k_hi && rc != ST_ENOMEM; k++) {
      partition one = {0};
      bisect_state bk = b;
      bk.k_hi = k;
      int r = solve_bisect_range(&bk, k, k, &one);
      by_k[k - 1] = r == 0 ? one.bottleneck : INFINITY;
      partition_free(&one);
    }
  }
  st_free(b.mem_units);
  st_free(b.amin);
  st_free(b.need);
  st_free(b.end);
  st_free(b.from);
  return rc;
}

int partition_solve(const problem *p, const layout *L, int k_lo, int k_hi,
                    st_partition_algorithm algo, int want_by_k,
                    partition *out) {
  memset(out, 0, sizeof *out);
  int64_t cap = p->n < L->units ? p->n : L->units;
  if (k_hi > cap) k_hi = (int)cap;
  if (k_lo < 1) k_lo = 1;
  if (k_lo > k_hi) return ST_EUNSUPPORTED;
  double n = p->n, U = (double)L->units;
  if (algo == ST_PARTITION_AUTO)
    algo = p->fabric->kind == ST_FABRIC_CPU && k_hi * n * n * U * U <= 2e8
               ? ST_PARTITION_DP
               : ST_PARTITION_BISECT;
  /* The per-k table for the report, when it is cheap: the DP has it for
   * free, bisection needs one more solve per k, about K^2 n^2 / 2 steps for
   * each of its ~100 iterations, and a mesh is solved once per band height
   * (12 on wse2). Bounded at 1e6 that is about half a second (26-31
   * blocks); at 4e6 a 42-block GPT-3 13B took 2 s on wse2 for the table
   * alone. */
  double *table = NULL;
  if (want_by_k && k_lo < k_hi &&
      (algo == ST_PARTITION_DP || (double)k_hi * k_hi * n * n <= 1e6)) {
    table = st_alloc((size_t)k_hi * sizeof *table);
    if (!table) return ST_ENOMEM;
  }
  int rc = algo == ST_PARTITION_DP ? solve_dp(p, L, k_lo, k_hi, out, table)
                                   : solve_bisect(p, L, k_lo, k_hi, out, table);
  if (rc) {
    st_free(table);
    return rc;
  }
  out->by_k = table;
  out->n_by_k = table ? k_hi : 0;
  return 0;
}
