/*
 * compile.h — private to src/compile/: the pieces the passes share.
 *
 * The time and memory model of one stage (docs/compiler.md, BACKGROUND.md
 * §6) lives here once, so that the partitioner optimises exactly what the
 * report prints. A stage of blocks [i, j) on c PEs of rate r takes, per
 * sample,
 *     t = (F_fwd + F_bwd) / (c r e(c)) + (o_{j-1} [j < n] + i_i [i > 0]) / bw
 * (F_bwd with the optimizer step's FLOPs, st_block_cost.flops_update)
 * where e(c) = 1 / (1 + slope (c - 1)), o the output bytes sent forward and
 * i the input-gradient bytes sent back, each over its edge: bw is a copy's
 * on a cpu; on a mesh the links along the edge the two stages' rectangles
 * share times a link's (layout_links), which the partitioner's search
 * takes as the band height (a placed plan counts them, plan.c). With a
 * calibration profile (cpu), F / r becomes sum over GEMM classes of F_k / r_k
 * (linear GEMMs, conv2d and attention each at their own measured rate), plus a
 * serial term sum over op classes of bytes_k / bw_k that does not shrink with
 * c. The calibration's core sharing m(n) = 1/(1 + sigma (n - 1)) — the rate
 * each of n independent one-thread GEMMs keeps when run at once (hyperthreads
 * of one core, a shared memory bus) — scales the GEMM time of a stage on c
 * of the fabric's P cores by m(c) / m(P): e(c) was measured with only c
 * busy, a plan keeps all P busy. And
 * On a mesh a stage's region of w x h PEs also pays, per pass, its layers'
 * inputs over h links, their partial sums over w links, w + h hops a layer
 * and a fixed per-PE cost a layer (stage_time; docs/compiler.md, "The mesh
 * model"), so its time falls and then rises as the region grows. Stage s
 * holds
 *     versions(s) x weights + gradient and optimizer state
 *       + (input + activations) x in_flight(s)   <=   c x pe_memory,
 * in flight as its schedule keeps it (stage_in_flight).
 *
 * Layout: PEs are handed out in units of one column slice of a band (a band
 * is `h` whole rows of the mesh; a cpu is one band of height 1, so a unit is
 * a core). Units are numbered along a snake: band 0 left to right, band 1
 * right to left, and so on. A stage takes a run of units inside one band (a
 * rectangle h tall), or whole bands when it needs more than one band (a
 * rectangle the full width). See layout_place.
 */
#ifndef STRATA_COMPILE_H
#define STRATA_COMPILE_H

#include "strata.h"

#include <math.h>

/* Each block's FLOPs per sample as they run (st_plan_costs: the first
 * block computes no gradient for the model's input) into flops[i], forward
 * plus backward, and the model's forward and backward totals into *fwd and
 * *bwd (either may be NULL). ST_ENOMEM when its scratch cannot be had. */
int st_plan_run_flops(const st_model *m, const st_config *cfg, double *flops,
                      double *fwd, double *bwd);
/* The model of cfg, descriptors only, on its dataset's input shape. */
int st_plan_model(st_model **out, const st_config *cfg, st_error *err);
/* cfg's fabric, resolved, and its model (st_plan_model). */
int st_plan_prepare(st_fabric *fabric, st_model **m, const st_config *cfg,
                    st_error *err);
/* st_plan_compile's plan once the n blocks' costs are known (measured ones
 * come from the executors' timing, src/exec/measure.c: an input here, so
 * that the compiler never runs a block itself). */
int st_plan_from_costs(st_plan **out, const st_config *cfg,
                       const st_fabric *fabric, const st_block_cost *costs,
                       int n, int stages, st_error *err);

/* Weight-sized buffers a pipelined-backprop stage with delay D holds
 * besides its live weights, as src/exec/pb.c allocates them for
 * execution.mitigation: stash D (a version per micro-batch in flight),
 * pipemare 2 (the backward's weights and the EMA of the updates), lwp and
 * sc+lwp 1 (the forward's predicted weights), none and sc 0 (spike
 * compensation works on the optimizer's velocity). A stage of delay 0 (the
 * last) mitigates nothing and holds none. */
int st_pb_weight_copies(const char *mitigation, int delay);

/* Samples per micro-batch as the trainer runs cfg: execution.micro_batch,
 * else 1 in pipelined backprop and the whole batch in the other modes;
 * with execution.replicas R, at most a replica's share B / R (not modelled: the
 * halves the trainer measures for metrics.noise_scale when no micro-batch is
 * set). */
int st_plan_micro_batch(const st_config *cfg);
/* The plan options of cfg's mode, stages 0: the activations and weight
 * copies a stage holds and the schedule whose fill and drain the stage
 * count is chosen by — what `strata compile` plans, and what the runtime
 * cuts its stages by (st_cut_split), so the two choose alike. */
st_plan_options st_plan_mode_options(const st_config *cfg);

/* Whether linear layers' updates ride in a one-sample backward as the
 * trainer runs cfg: pb.c's condition (a micro-batch of one, the
 * elementwise SGD rules: not AdamW, stash or pipemare); elsewhere the
 * trainer's (a batch of one, any rule), except in replicas and weight
 * streaming, which never fuse. */
int st_plan_fuses_update(const st_config *cfg);

/* Whether cfg runs pipelined backprop with a mitigation that predicts the
 * forward's weights (lwp, sc+lwp): work at every stage but the
 * last. */
int st_plan_predicts(const st_config *cfg);

/* Text for the report (report.c): "1,234,567", "0.0476" (a rate below
 * 100), "3.3 MB", "12.5 us". */
const char *st_plan_fmt_count(char *buf, size_t cap, double v);
const char *st_plan_fmt_rate(char *buf, size_t cap, double v);
const char *st_plan_fmt_bytes(char *buf, size_t cap, double bytes);
const char *st_plan_fmt_time(char *buf, size_t cap, double seconds);

/* One partition problem: block costs and sums over every range [i, j). */
typedef struct problem {
  const st_block_cost *blocks;
  int n;
  const st_fabric *fabric;
  double in_flight, versions;
  /* the same per stage index s of the stage count being solved
   * (st_plan_options.in_flight_schedule); NULL: in_flight, versions */
  const double *in_flight_at, *versions_at;
  /* sums over blocks [i, j), summed left to right: index i * (n + 1) + j;
   * memory = weights, state and acts (input and activations per sample)
   * as stage s holds them: stage_memory */
  double *flops_fwd, *flops_bwd, *weights, *state, *acts;
  /* the workspace the stage holds once (st_block_cost.work_*) */
  double *work_mem;
  /* mesh: the bytes moved through a stage's region per sample and pass,
   * and the layers that move them (st_block_cost.region_*) */
  double *region_in, *region_out, *region_layers;
  /* calibrated cpu: what a micro-batch's step touches (st_block_cost
   * ws_bytes), and the seconds of work a sample its narrow linear calls
   * add when a core's share of that passes L2 (l2_traffic) */
  double *ws, *l2_fwd, *l2_bwd;
  /* what a step touches, ws and the optimizer state beside it
   * (st_block_cost.state_touched): past the cache, memory's bandwidth
   * bounds the stage (stage_dram_time) */
  double *touched;
  /* one-row products' work (the row curve's), which scales on a stage's
   * cores by the fabric's row_slope, not efficiency_slope */
  double *row_fwd, *row_bwd;
  /* a bf16 run's linear products that do not share out over the stage's
   * cores (bf16_share's y part): one-core seconds, slowed by the other
   * stages' contention as work is (seconds_per_work_at at slope 1) */
  double *solo_fwd, *solo_bwd;
  /* cpu: the bytes a sample moves through memory (dram_bytes), for the
   * machine's memory bandwidth (stage_dram_time) */
  double *dram;
  /* what the time model uses, same indexing: parallel work (FLOPs at
   * work_rate = pe_flops uncalibrated; one-core seconds at work_rate = 1
   * calibrated) and single-threaded seconds (0 uncalibrated) */
  double *work_fwd, *work_bwd, *serial_fwd, *serial_bwd;
  /* the same, paid by a stage unless it is the last: pipelined
   * backprop's weight prediction (st_block_cost.lwp_bytes, measured_lwp),
   * with the backward; NULL when no block has any */
  double *last_free_work, *last_free_serial;
  double work_rate;
  /* where a stage may begin or end: cut_ok[j] for the boundary before
   * block j (0 .. n); NULL = anywhere (execution.stage_blocks pins them) */
  const unsigned char *cut_ok;
  /* no stage hands data to another (weight streaming: one block at a time
   * on the whole fabric, its activations staying there) */
  int no_edges;
  /* the links stage_time counts at the edges before and after a stage; 0:
   * the search's model, the band height (a copy of the problem sets them
   * to ask about one placed stage with its neighbours as they are) */
  double edge_before, edge_after;
} problem;

/* The geometry of one candidate layout. */
typedef struct layout {
  int h;         /* band height: PEs in one unit */
  int bands;     /* R */
  int width;     /* units per band (W) */
  int64_t units; /* R * W */
} layout;

/* The band heights a mesh of height h is tried at, into out[], largest
 * first: every divisor of h. An int has at most 1600 divisors
 * (2095133040), so ST_MAX_BAND_HEIGHTS holds them all. Returns the count. */
enum { ST_MAX_BAND_HEIGHTS = 1600 };
int st_band_heights(int h, int *out);

int problem_init(problem *p, const st_block_cost *blocks, int n,
                 const st_fabric *f, double in_flight, double versions,
                 st_error *err);
void problem_free(problem *p);

static inline int64_t range_index(const problem *p, int i, int j) {
  return (int64_t)i * (p->n + 1) + j;
}

/* One block's calibrated narrow term (seconds per sample) and weight
 * traffic (weight bytes per sample, to multiply by spill_cost and
 * st_spill_fraction), see st_fabric; [0] forward, [1] backward. */
void linear_memory(const st_fabric *f, const st_block_cost *b, double narrow[2],
                   double traffic[2]);

/* Samples in flight and weight versions at stage index s. */
double stage_in_flight(const problem *p, int s);
double stage_versions(const problem *p, int s);
/* Bytes stage [i, j) holds as stage s. */
double stage_memory(const problem *p, int i, int j, int s);
/* Seconds per sample of stage [i, j) on `units` units of layout L; the parts
 * (forward, backward, communication) go to the pointers that are not NULL.
 * On a mesh the communication includes the region's own (compile.h top). */
/* cpu: the least seconds per sample a stage [i, j) on `units` cores needs
 * to move its bytes through memory, at its share units / C of the
 * machine's bandwidth, where its working set exceeds its share of the
 * last-level cache; 0 where the caches hold it (or no bandwidth). */
double stage_dram_time(const problem *p, const layout *L, int i, int j,
                       int64_t units);
double stage_time(const problem *p, const layout *L, int i, int j,
                  int64_t units, double *fwd, double *bwd, double *comm);
/* The same with the links of the edge before the stage and after it
 * (layout_links; 0: the partitioner's search model, L->h on a mesh, which
 * stage_time uses unless the problem's edge_* say otherwise): a placed
 * stage's time. */
double stage_time_links(const problem *p, const layout *L, int i, int j,
                        int64_t units, double before, double after, double *fwd,
                        double *bwd, double *comm);
/* The rectangle `span` units from snake position `start` of L cover, in
 * PEs: r = {x, y, w, h}. */
void layout_rect(const layout *L, int64_t start, int64_t span, int64_t r[4]);
/* The links between two consecutive stages of L placed at (start, span):
 * on a mesh the PEs along the edge their rectangles share (side by side
 * in a band, the band height; one above the other at a band turn, the
 * columns both cover); on a cpu 1 (one copy at link_bandwidth). */
double layout_links(const problem *p, const layout *L, int64_t start_a,
                    int64_t span_a, int64_t start_b, int64_t span_b);
/* The region `units` units of L make: w PEs across, h down. */
void region_shape(const layout *L, int64_t units, double *w, double *h);
/* Whether stage [i, j) fits its memory in `units` units as stage s. */
int stage_fits(const problem *p, const layout *L, int i, int j, int s,
               int64_t units);
/* The fewest units, at least `from`, for which stage [i, j) takes <= T
 * (T = INFINITY: any time); INT64_MAX if no count up to the whole layout
 * does. A stage's time need not fall with its units (on a mesh the hops
 * across a region grow with it): it is taken to fall and then rise along
 * each of the two runs of unit counts (1 .. W, then whole bands). */
int64_t units_for_time(const problem *p, const layout *L, int i, int j,
                       double T, int64_t from);
/* The units with the least time for stage [i, j). */
int64_t units_fastest(const problem *p, const layout *L, int i, int j);
int64_t units_for_memory(const problem *p, const layout *L, int i, int j,
                         int s);

/* A stage of u units after a stage that ended at snake position `end`:
 * returns its start (inside the same band if it fits there, else at the
 * next band's start) and sets *span to the units it really occupies (u, or
 * whole bands when u > W); -1 if it runs past the last band. Monotone: a
 * later `end` or a larger u never gives an earlier finish. */
int64_t layout_place(const layout *L, int64_t end, int64_t u, int64_t *span);

/* Pass 2 result: stage k is blocks [cut[k], cut[k + 1]) on units[k] units
 * (the units it occupies in the layout). */
typedef struct partition {
  int k;
  int *cut;       /* k + 1 entries */
  int64_t *units; /* k entries */
  double bottleneck;
  int n_by_k;   /* by_k[k - 1]: best bottleneck with exactly k stages */
  double *by_k; /* (INFINITY: none fits); NULL unless asked and cheap */
} partition;

void partition_free(partition *q);
/* Optimal partition into between k_lo and k_hi stages (ties: fewest). With
 * want_by_k, also the best bottleneck for every k in [1, k_hi] when that is
 * cheap to compute. Returns 0, ST_EUNSUPPORTED when no plan fits (the
 * caller explains why), or ST_ENOMEM. */
int partition_solve(const problem *p, const layout *L, int k_lo, int k_hi,
                    st_partition_algorithm algo, int want_by_k, partition *out);

#endif
