/*
 * plan.c — the compiler's driver: runs the passes in order and keeps why.
 *
 *   1 cost       st_plan_costs (cost.c): per block FLOPs and bytes
 *   2 partition  partition.c: optimal contiguous stages, PEs by demand; on a
 *                mesh once per band height h (every divisor of the height),
 *                keeping the best
 *   3 allocate   here: spare PEs handed out (in proportion to FLOPs, then to
 *                the slowest stage), gaps at band ends absorbed, each
 *                stage's cause written (why this many PEs, why cut here)
 *   4 place      here: each stage's rectangle along the snake of bands
 *   5 report     report.c: text, plan.json, plan.svg
 */
#include "compile.h"
#include "../runtime/runtime.h"

#include <stdlib.h>
#include <string.h>

#define TIE 1e-9 /* as partition.c: bottlenecks this close count as equal */

static const char *pe_word(const st_fabric *f) {
  return f->kind == ST_FABRIC_CPU ? "cores" : "PEs";
}

static layout make_layout(const st_fabric *f, int h) {
  layout L = {.h = h, .bands = f->height / h, .width = f->width};
  L.units = (int64_t)L.bands * L.width;
  return L;
}

/* Band heights to try, largest first: every divisor of the height (a cpu
 * has height 1), found in pairs up to its square root (a loop over every
 * height took 1e9 turns at mesh:1x1000000000). */
int st_band_heights(int h, int *out) {
  int n = 0, small[ST_MAX_BAND_HEIGHTS], ns = 0;
  for (int d = 1; (int64_t)d * d <= h; d++)
    if (h % d == 0) small[ns++] = d;
  for (int i = 0; i < ns; i++) /* the large halves, largest (h) first */
    if ((int64_t)small[i] * small[i] != h) out[n++] = h / small[i];
  for (int i = ns - 1; i >= 0; i--) out[n++] = small[i];
  /* out is descending: h / small[i] falls as small[i] grows, every large
   * half is past the root and every small one at most it */
  return n;
}

/* Lays the stages out one after another; fills start[] and span[] (either
 * may be NULL... not both needed) and returns the end, or -1 if they do not
 * fit. units[] are requests; span[] what each occupies. */
static int64_t lay_out(const layout *L, const int64_t *units, int k,
                       int64_t *start, int64_t *span) {
  int64_t end = 0;
  for (int s = 0; s < k; s++) {
    int64_t sp, st = layout_place(L, end, units[s], &sp);
    if (st < 0) return -1;
    if (start) start[s] = st;
    if (span) span[s] = sp;
    end = st + sp;
  }
  return end;
}

/* ------------------------------------------------------------ errors */

/* A pinned cut (execution.stage_blocks) that no assignment of PEs holds:
 * the PEs its stages need for their memory, and its largest stage. */
static int explain_pin_no_fit(const problem *p, const st_fabric *f,
                              const char *where, const char *sep,
                              const char *key, st_error *err) {
  double pes = 0, worst = -1;
  int wi = 0, wj = 0;
  for (int i = 0, s = 0; i < p->n; s++) {
    int j = i + 1;
    while (!p->cut_ok[j]) j++;
    double m = stage_memory(p, i, j, s);
    pes += ceil(m / f->pe_memory);
    if (m > worst) worst = m, wi = i, wj = j;
    i = j;
  }
  char need[32], each[32];
  return st_error_set(err, ST_EARG,
                      "%s%s%s: the pinned stages do not fit %s: their memory "
                      "needs %.0f %s of %s at least (the largest stage, %s "
                      "to %s, holds %s)",
                      where, sep, key, f->name, pes, pe_word(f),
                      st_plan_fmt_bytes(each, sizeof each, f->pe_memory),
                      p->blocks[wi].name, p->blocks[wj - 1].name,
                      st_plan_fmt_bytes(need, sizeof need, worst));
}

/* No plan fits: name the block and the shortfall. First a block that alone
 * outgrows the whole fabric; else the first prefix of blocks that no layout
 * can hold in at most `kmax` stages, with the capacity the most compact
 * layout of it needs. */
static int explain_no_fit(const problem *p, const st_fabric *f, int kmax,
                          int stages_given, st_error *err) {
  double total = (double)f->pes * f->pe_memory;
  char need[32], have[32], short_by[32], w[32], st[32], a[32], pe[32];
  for (int b = 0; b < p->n; b++) {
    /* alone, at the place where a stage holds the least in flight */
    int s0 = 0;
    for (int s = 1; s < kmax; s++)
      if (stage_memory(p, b, b + 1, s) < stage_memory(p, b, b + 1, s0)) s0 = s;
    double m = stage_memory(p, b, b + 1, s0);
    if (m <= total) continue;
    const st_block_cost *c = &p->blocks[b];
    return st_error_set(
        err, ST_EUNSUPPORTED,
        "%s does not fit %s: it needs %s (weights %s x %g, gradient and "
        "optimizer state %s, input and activations %s x %g samples in "
        "flight) but the whole fabric holds %s (%lld %s x %s): short by %s",
        c->name, f->name, st_plan_fmt_bytes(need, sizeof need, m),
        st_plan_fmt_bytes(w, sizeof w, c->param_bytes), stage_versions(p, s0),
        st_plan_fmt_bytes(st, sizeof st, c->state_bytes),
        st_plan_fmt_bytes(a, sizeof a, c->in_bytes + c->act_bytes),
        stage_in_flight(p, s0), st_plan_fmt_bytes(have, sizeof have, total),
        (long long)f->pes, pe_word(f),
        st_plan_fmt_bytes(pe, sizeof pe, f->pe_memory),
        st_plan_fmt_bytes(short_by, sizeof short_by, m - total));
  }
  /* Memory-only packing, uncapped: the fewest units each prefix needs. */
  int hs[ST_MAX_BAND_HEIGHTS], nh = st_band_heights(f->height, hs), n = p->n;
  double best_need = INFINITY;
  int worst_block = n - 1;
  for (int t = 0; t < nh; t++) {
    layout L = make_layout(f, hs[t]), open = L;
    open.bands = 1 << 30;
    open.units = (int64_t)open.bands * open.width;
    int64_t *end = st_alloc((size_t)(kmax + 1) * (size_t)(n + 1) * sizeof *end);
    if (!end) return st_error_set(err, ST_ENOMEM, "out of memory");
    for (int c = 0; c < (kmax + 1) * (n + 1); c++) end[c] = INT64_MAX;
    end[0] = 0;
    for (int k = 1; k <= kmax; k++)
      for (int j = k; j <= n; j++)
        for (int i = k - 1; i < j; i++) {
          int64_t e0 = end[(k - 1) * (n + 1) + i];
          int64_t u = units_for_memory(p, &open, i, j, k - 1);
          if (e0 == INT64_MAX || u == INT64_MAX) continue;
          int64_t span, st = layout_place(&open, e0, u, &span);
          if (st >= 0 && st + span < end[k * (n + 1) + j])
            end[k * (n + 1) + j] = st + span;
        }
    /* the first prefix that no longer fits, or the whole model at K */
    for (int j = 1; j <= n; j++) {
      int64_t e = INT64_MAX;
      int k_top = j < kmax ? j : kmax;
      if (j == n && stages_given)
        e = end[stages_given * (n + 1) + n];
      else
        for (int k = 1; k <= k_top; k++)
          if (end[k * (n + 1) + j] < e) e = end[k * (n + 1) + j];
      if (e > L.units) {
        double bytes = (double)e * L.h * f->pe_memory;
        if (bytes < best_need || (bytes == best_need && j - 1 < worst_block))
          best_need = bytes, worst_block = j - 1;
        break;
      }
    }
    st_free(end);
  }
  if (best_need == INFINITY)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "no plan of %d stages fits %s: every stage needs "
                        "whole PE columns and there are not enough",
                        stages_given ? stages_given : kmax, f->name);
  char stages[48] = "";
  if (stages_given)
    snprintf(stages, sizeof stages, " in %d stages", stages_given);
  /* the first prefix that fails can be far from the whole story (a 20B
   * model can miss 40 GB by a few GB at its fourth block): say what all
   * the blocks need, a lower bound for any split. Every stage of any plan
   * holds at least the fewest samples (and versions) any stage holds here
   * (the last stage of 1f1b and of pipelined backprop: one), so the whole
   * model at that place is the bound; at the first stage's count it would
   * be what kmax stages hold, not what a plan of fewer needs. */
  int s_all = 0;
  for (int s = 1; s < kmax; s++)
    if (stage_memory(p, 0, n, s) < stage_memory(p, 0, n, s_all)) s_all = s;
  char all[32];
  return st_error_set(
      err, ST_EUNSUPPORTED,
      "%s does not fit %s: %s and the blocks before it need %s%s (each stage "
      "holds its weights, gradient and optimizer state, and input and "
      "activations x the samples in flight, %g at the first stage, rounded "
      "up to whole PEs) but the "
      "fabric holds %s: short by %s; all %d blocks need at least %s",
      p->blocks[worst_block].name, f->name, p->blocks[worst_block].name,
      st_plan_fmt_bytes(need, sizeof need, best_need), stages,
      stage_in_flight(p, 0), st_plan_fmt_bytes(have, sizeof have, total),
      st_plan_fmt_bytes(short_by, sizeof short_by, best_need - total), n,
      st_plan_fmt_bytes(all, sizeof all, stage_memory(p, 0, n, s_all)));
}

int st_pb_weight_copies(const char *mitigation, int delay) {
  if (delay <= 0 || !mitigation) return 0;
  if (!strcmp(mitigation, "stash")) return delay;
  if (!strcmp(mitigation, "pipemare")) return 2;
  if (!strcmp(mitigation, "lwp") || !strcmp(mitigation, "sc+lwp")) return 1;
  return 0;
}

/* What stage s of S holds as its schedule keeps it (st_plan_options): the
 * micro-batches between a forward and the op that frees its activations
 * (st_schedule's slots, an interleaved worker's the mean of its V
 * chunks'; pipelined backprop 2 (S - s) - 1, pb.c's delay D plus one),
 * times the micro-batch; weight versions, in pipelined backprop
 * the live weights and the copies its mitigation keeps at delay D
 * (st_pb_weight_copies: with stashing one per micro-batch in flight). A
 * schedule that cannot be built for S counts every micro-batch. */
static void in_flight_table(const st_plan_options *o, int S, double *flight,
                            double *vers) {
  const char *name = o->in_flight_schedule;
  double mb = o->micro_batch > 0 ? o->micro_batch : 1;
  int M = o->micro_batches > 0 ? o->micro_batches : 1;
  int V = !strcmp(name, "interleaved") && o->virtual_stages > 1
              ? o->virtual_stages
              : 1;
  int pb = !strcmp(name, "pb");
  double held[S];
  for (int s = 0; s < S; s++) held[s] = pb ? 2.0 * (S - s) - 1 : M;
  st_schedule sc;
  st_error e;
  /* interleaved: stage s is worker s of S (execution.stages counts them),
   * running chunks s, s + S, ..., each an equal share of its blocks: the
   * mean of their slots */
  if (!pb && st_schedule_build(&sc, name, S, M, V, &e) == 0) {
    for (int s = 0; s < S; s++) {
      double sum = 0;
      for (int v = 0; v < V; v++) sum += sc.slots[s + v * S];
      held[s] = sum / V;
    }
    st_schedule_free(&sc);
  }
  for (int s = 0; s < S; s++) {
    flight[s] = mb * held[s];
    vers[s] = pb ? 1 + st_pb_weight_copies(o->mitigation, (int)held[s] - 1)
              : o->weight_versions > 0 ? o->weight_versions
                                       : 1;
  }
}

/* Stage s of S as in_flight_table says, into p: per stage where the counts
 * differ, else one count for all (the partitioner's faster path). */
static void use_table(problem *p, const st_plan_options *o, int S,
                      double *flight, double *vers) {
  in_flight_table(o, S, flight, vers);
  int same = 1;
  for (int s = 1; s < S; s++)
    same &= flight[s] == flight[0] && vers[s] == vers[0];
  p->in_flight_at = same ? NULL : flight;
  p->versions_at = same ? NULL : vers;
  p->in_flight = flight[0];
  p->versions = vers[0];
}

static void apply_io(st_plan *plan);

/* ---------------------------------------------------- pass 3: allocate */

typedef struct alloc_state {
  const problem *p;
  const layout *L;
  int k;
  const int *cut;
  int64_t *units, *start, *span;
} alloc_state;

/* Stage s of k, blocks [cut[s], cut[s + 1]) placed at (start, span) with
 * its neighbours: its time with the links it shares with each
 * (layout_links), its parts into the pointers that are not NULL. */
static double placed_time(const problem *p, const layout *L, int k,
                          const int *cut, const int64_t *start,
                          const int64_t *span, int s, double *fwd, double *bwd,
                          double *comm) {
  double before =
      s > 0 ? layout_links(p, L, start[s - 1], span[s - 1], start[s], span[s])
            : 0;
  double after = s + 1 < k ? layout_links(p, L, start[s], span[s], start[s + 1],
                                          span[s + 1])
                           : 0;
  return stage_time_links(p, L, cut[s], cut[s + 1], span[s], before, after, fwd,
                          bwd, comm);
}

/* The stage times of partition q as laid out (its units in order along the
 * snake), into t[]; returns the slowest. The partitioner's search prices
 * every edge at the band height h (stage_time); here each counts the links
 * its two rectangles share, fewer (or more) at a band turn. */
static double partition_times(const problem *p, const layout *L,
                              const partition *q, double *t) {
  int64_t start[q->k], span[q->k];
  double worst = 0;
  if (lay_out(L, q->units, q->k, start, span) < 0) return INFINITY;
  for (int s = 0; s < q->k; s++) {
    t[s] = placed_time(p, L, q->k, q->cut, start, span, s, 0, 0, 0);
    worst = fmax(worst, t[s]);
  }
  return worst;
}

static double time_of(const alloc_state *a, int s) {
  return placed_time(a->p, a->L, a->k, a->cut, a->start, a->span, s, 0, 0, 0);
}

/* Whether no stage takes longer than was[] (their times before a change:
 * more units for one stage move the later ones along the snake, which can
 * change the links at their edges). */
static int none_slower(const alloc_state *a, const double *was) {
  for (int t = 0; t < a->k; t++)
    if (time_of(a, t) > was[t]) return 0;
  return 1;
}

/* Grows stage s by up to `want` units (halving on a misfit, or where more
 * units would make it, or another stage, slower: on a mesh the hops across
 * a region grow with it, and the stages after it move); returns the units
 * it took. */
static int64_t grow(alloc_state *a, int s, int64_t want) {
  double was[a->k];
  for (int t = 0; t < a->k; t++) was[t] = time_of(a, t);
  if (a->p->fabric->kind == ST_FABRIC_MESH) { /* no further than its best */
    int64_t best = units_fastest(a->p, a->L, a->cut[s], a->cut[s + 1]);
    if (want > best - a->units[s]) want = best - a->units[s];
  }
  for (; want >= 1; want /= 2) {
    a->units[s] += want;
    if (lay_out(a->L, a->units, a->k, a->start, a->span) >= 0 &&
        none_slower(a, was)) {
      /* a request above one band occupies whole bands: keep what it got */
      for (int t = 0; t < a->k; t++) a->units[t] = a->span[t];
      return want;
    }
    a->units[s] -= want;
  }
  lay_out(a->L, a->units, a->k, a->start, a->span);
  return 0;
}

/* Spare units after the optimal partition: first in proportion to each
 * stage's FLOPs (flexible workers sized by demand), then one by one to the
 * slowest stage that can still grow, then gaps left at band ends go to the
 * stage before them. Every step keeps the layout valid. */
static void hand_out_spare(alloc_state *a, int64_t *spare_out) {
  const problem *p = a->p;
  int k = a->k;
  int64_t before = 0;
  for (int s = 0; s < k; s++) before += a->span[s];
  int64_t spare = a->L->units - lay_out(a->L, a->units, k, a->start, a->span);
  double flops = 0;
  for (int s = 0; s < k; s++) {
    int64_t at = range_index(p, a->cut[s], a->cut[s + 1]);
    flops += p->flops_fwd[at] + p->flops_bwd[at];
  }
  for (int s = 0; s < k && spare > 0 && flops > 0; s++) {
    int64_t at = range_index(p, a->cut[s], a->cut[s + 1]);
    double share = (p->flops_fwd[at] + p->flops_bwd[at]) / flops;
    grow(a, s, (int64_t)(share * (double)spare));
  }
  int saturated[k];
  memset(saturated, 0, sizeof saturated);
  for (;;) {
    int s = -1;
    double worst = -1;
    for (int t = 0; t < k; t++)
      if (!saturated[t] && time_of(a, t) > worst) worst = time_of(a, t), s = t;
    if (s < 0) break;
    int64_t left = a->L->units - lay_out(a->L, a->units, k, a->start, a->span);
    int64_t step = left / (2 * k);
    if (!grow(a, s, step < 1 ? 1 : step)) saturated[s] = 1;
  }
  /* A stage followed by a gap in its band (the next one did not fit there)
   * or ending the plan takes the rest of its band: a rectangle still. */
  for (int s = 0; s < k; s++) {
    int64_t W = a->L->width, end = a->start[s] + a->span[s];
    int alone = s == k - 1 || a->start[s + 1] != end;
    if (a->span[s] <= W && end % W != 0 && alone) {
      double was[k];
      for (int t = 0; t < k; t++) was[t] = time_of(a, t);
      a->units[s] += W - end % W;
      lay_out(a->L, a->units, k, a->start, a->span);
      /* a mesh region past its best size (the next stage, below it, only
       * shares more of its edge) */
      if (!none_slower(a, was)) {
        a->units[s] -= W - end % W;
        lay_out(a->L, a->units, k, a->start, a->span);
      }
    }
  }
  int64_t after = 0;
  for (int s = 0; s < k; s++) {
    after += a->span[s];
    a->units[s] = a->span[s];
  }
  *spare_out = after - before;
}

/* ----------------------------------------------------- pass 4: place */

static void place_stage(const layout *L, int64_t start, int64_t span,
                        st_plan_stage *st) {
  int64_t r[4];
  layout_rect(L, start, span, r);
  st->x = (int)r[0];
  st->y = (int)r[1];
  st->w = (int)r[2];
  st->h = (int)r[3];
  st->pes = (int64_t)st->w * st->h;
}

/* --------------------------------------------------------- the driver */

static void describe_stage(const problem *p, const layout *L,
                           const st_plan *plan, int s, int64_t spare_here) {
  const st_fabric *f = &plan->fabric;
  st_plan_stage *st = &plan->stages[s];
  const char *word = pe_word(f);
  char t1[32], t2[32], n1[32], n2[32], n3[32], why_cut[200], why_pes[200];
  int i = st->first, j = st->first + st->count, later = plan->n_stages - s - 1;
  if (plan->n_stages == 1) {
    snprintf(why_cut, sizeof why_cut, "one stage holds the whole model");
  } else if (j == p->n) {
    snprintf(why_cut, sizeof why_cut, "last stage: ends with %s",
             p->blocks[j - 1].name);
  } else if (p->cut_ok) {
    snprintf(why_cut, sizeof why_cut,
             "cut before %s: pinned (execution.stage_blocks)",
             p->blocks[j].name);
  } else if (p->n - j == later) {
    snprintf(why_cut, sizeof why_cut,
             "cut before %s: forced, the %d later stage%s a block each",
             p->blocks[j].name, later, later == 1 ? " needs" : "s need");
  } else {
    int64_t units = st->pes / L->h;
    double ext = stage_time(p, L, i, j + 1, units, 0, 0, 0);
    if (!stage_fits(p, L, i, j + 1, s, units))
      snprintf(why_cut, sizeof why_cut,
               "cut before %s: with it this stage would not fit its memory",
               p->blocks[j].name);
    else if (ext > plan->bottleneck_time)
      snprintf(why_cut, sizeof why_cut,
               "cut before %s: with it this stage would take %s > bottleneck "
               "%s",
               p->blocks[j].name, st_plan_fmt_time(t1, sizeof t1, ext),
               st_plan_fmt_time(t2, sizeof t2, plan->bottleneck_time));
    else
      snprintf(why_cut, sizeof why_cut,
               "cut before %s: an optimal split (with it this stage would "
               "take %s, within the bottleneck, but no split beats it)",
               p->blocks[j].name, st_plan_fmt_time(t1, sizeof t1, ext));
  }
  st_plan_fmt_count(n1, sizeof n1, (double)st->pes);
  st_plan_fmt_count(n2, sizeof n2, (double)st->pes_for_time);
  st_plan_fmt_count(n3, sizeof n3, (double)st->pes_for_memory);
  if (st->pes_for_memory > st->pes_for_time)
    snprintf(why_pes, sizeof why_pes,
             "%s %s: memory-bound, %s hold its %s (%s would meet the "
             "bottleneck)",
             n1, word, n3, st_plan_fmt_bytes(t1, sizeof t1, st->mem_total), n2);
  else
    snprintf(why_pes, sizeof why_pes,
             "%s %s: %s meet the bottleneck %s, %s hold its memory", n1, word,
             n2, st_plan_fmt_time(t1, sizeof t1, plan->bottleneck_time), n3);
  int n = snprintf(st->cause, sizeof st->cause, "%s; %s", why_cut, why_pes);
  if (spare_here > 0 && n > 0 && (size_t)n < sizeof st->cause)
    snprintf(st->cause + n, sizeof st->cause - (size_t)n, ", +%s spare",
             st_plan_fmt_count(t1, sizeof t1, (double)spare_here));
}

/* How a mode hands a step to its stage threads (set_schedule) */
enum { ST_HANDOFF_ASLEEP = 1, ST_HANDOFF_HOSTED = 2 };

/* The hand-offs a step makes: one, but block_sequential's two a segment
 * (pipeline.c's pipe_step: a run_on for the forwards, one for the
 * backwards), of the plan's one segment. */
static double step_handoffs(const char *mode) {
  return !strcmp(mode, "block_sequential") ? 2 : 1;
}

/* Bubble utilization of the fill-and-drain schedule (BACKGROUND.md §1):
 * M t_max / ((M - 1) t_max + sum t_s) for gpipe and 1f1b (M / (M + S - 1)
 * with stages of equal time), and the bubble of interleaved or
 * zb1p with ops of equal cost (st_schedule_formula); pipelined backprop
 * never drains: 1 in steady state. An interleaved worker holds V chunks,
 * each receiving its input and sending its output: V hand-offs per sample
 * where a contiguous stage makes one, charged at the bottleneck stage's
 * own hand-off time. The caller's own time between steps, host_time: the
 * next batch's input, and (threaded: a ST_HANDOFF_ way) the step's
 * hand-offs (step_handoffs) once a batch. */
static void set_schedule(st_plan *plan, const char *mode, const char *schedule,
                         int V, int batch, int micro_batch, int threaded) {
  snprintf(plan->mode, sizeof plan->mode, "%s", mode);
  snprintf(plan->schedule, sizeof plan->schedule, "%s",
           strcmp(mode, "pipeline") == 0 ? schedule : "gpipe");
  plan->virtual_stages = strcmp(plan->schedule, "interleaved") == 0 ? V : 1;
  plan->batch = batch;
  plan->micro_batch = micro_batch > 0 ? micro_batch : batch;
  plan->micro_batches = plan->micro_batch > 0 ? batch / plan->micro_batch : 1;
  if (plan->micro_batches < 1) plan->micro_batches = 1;
  double M = plan->micro_batches, S = plan->n_stages;
  plan->util_fill_drain = M / (M + S - 1);
  double f = S > 1 ? st_schedule_formula(plan->schedule, (int)S, (int)M,
                                         plan->virtual_stages)
                   : 0;
  if (f > 0) plan->util_fill_drain = f;
  if (S > 1 && plan->virtual_stages == 1 &&
      (!strcmp(plan->schedule, "gpipe") || !strcmp(plan->schedule, "1f1b"))) {
    /* stages of unequal time: the makespan of M micro-batches is every
     * stage's time once (the first micro-batch's way through and back)
     * and the slowest stage's M - 1 times more, (M - 1) t_max + sum t_s;
     * M / (M + S - 1) when they are equal */
    double sum = 0, worst = 0;
    for (int s = 0; s < plan->n_stages; s++) {
      sum += plan->stages[s].time;
      if (plan->stages[s].time > worst) worst = plan->stages[s].time;
    }
    if (worst > 0) plan->util_fill_drain = M * worst / ((M - 1) * worst + sum);
  }
  plan->handoff_time = plan->virtual_stages > 1 && plan->n_stages > 0
                           ? (plan->virtual_stages - 1) *
                                 plan->stages[plan->bottleneck].time_comm
                           : 0;
  plan->util_pipelined = 1.0;
  /* Between steps the caller fills the next batch's input, and the modes
   * on stage threads hand the step to them and wait (calibrated cpu only:
   * 0 otherwise). Serial with the stages: it adds to every sample. */
  const st_fabric *fb = &plan->fabric;
  plan->host_time = 0;
  if (fb->input_bandwidth > 0 && plan->n_blocks > 0)
    plan->host_time += plan->blocks[0].in_bytes / fb->input_bandwidth;
  if (threaded && batch > 0)
    plan->host_time += step_handoffs(mode) *
                       (threaded == ST_HANDOFF_HOSTED ? fb->hosted_latency
                                                      : fb->step_latency) /
                       batch;
}

double st_plan_rate(const st_plan *p, int pipelined) {
  /* the stages' own steady state; the fabric's I/O caps the result, not
   * the steady state before the bubble (apply_io); with replicas, one
   * replica's, R of them at once, then their gradients' sum a step */
  int R = p->replicas > 1 ? p->replicas : 1;
  double steady = p->throughput;
  if ((p->io_rate > 0 || R > 1) && p->bottleneck_time > 0)
    steady = 1.0 / p->bottleneck_time;
  double rate = steady * (pipelined ? p->util_pipelined : p->util_fill_drain);
  if (!pipelined && p->handoff_time > 0 && steady > 0)
    rate = p->util_fill_drain / (1.0 / steady + p->handoff_time);
  if (p->host_time > 0 && rate > 0 && isfinite(rate))
    rate = 1.0 / (1.0 / rate + p->host_time);
  rate *= R;
  if (p->reduce_time > 0 && rate > 0 && isfinite(rate))
    rate = 1.0 / (1.0 / rate + p->reduce_time);
  return p->io_rate > 0 && rate > p->io_rate ? p->io_rate : rate;
}

static int build_stages(st_plan *plan, const problem *p, const layout *L,
                        partition *q, st_error *err) {
  int k = q->k;
  plan->n_stages = k;
  plan->band_height = L->h;
  plan->bands = L->bands;
  plan->stages = st_alloc((size_t)k * sizeof *plan->stages);
  int64_t *start = st_alloc((size_t)k * sizeof *start);
  int64_t *span = st_alloc((size_t)k * sizeof *span);
  int64_t *before = st_alloc((size_t)k * sizeof *before);
  if (!plan->stages || !start || !span || !before) {
    st_free(start), st_free(span), st_free(before);
    return st_error_set(err, ST_ENOMEM, "out of memory for %d stages", k);
  }
  alloc_state a = {.p = p,
                   .L = L,
                   .k = k,
                   .cut = q->cut,
                   .units = q->units,
                   .start = start,
                   .span = span};
  lay_out(L, q->units, k, start, span);
  memcpy(before, span, (size_t)k * sizeof *before);
  int64_t spare;
  hand_out_spare(&a, &spare);

  double worst = -1, sum = 0;
  for (int s = 0; s < k; s++) {
    st_plan_stage *st = &plan->stages[s];
    int i = q->cut[s], j = q->cut[s + 1];
    st->first = i;
    st->count = j - i;
    place_stage(L, start[s], span[s], st);
    int64_t at = range_index(p, i, j);
    st->flops_fwd = p->flops_fwd[at];
    st->flops_bwd = p->flops_bwd[at];
    st->time = placed_time(p, L, k, q->cut, start, span, s, &st->time_fwd,
                           &st->time_bwd, &st->time_comm);
    double weights = 0, state = 0, acts = p->blocks[i].in_bytes;
    st->working_set = 0;
    for (int b = i; b < j; b++) {
      st->working_set += p->blocks[b].ws_bytes;
      weights += p->blocks[b].param_bytes;
      state += p->blocks[b].state_bytes;
      acts += p->blocks[b].act_bytes;
    }
    st->in_flight = stage_in_flight(p, s);
    st->versions = stage_versions(p, s);
    st->mem_weights = st->versions * weights;
    st->mem_state = state;
    st->mem_acts = st->in_flight * acts;
    st->mem_work = p->work_mem[range_index(p, i, j)];
    st->spill = st_spill_fraction(&plan->fabric, st->working_set);
    st->mem_total = stage_memory(p, i, j, s);
    st->mem_capacity = (double)st->pes * plan->fabric.pe_memory;
    plan->pes_used += st->pes;
    sum += st->time;
    if (st->time > worst) worst = st->time, plan->bottleneck = s;
  }
  plan->bottleneck_time = worst;
  plan->throughput = worst > 0 ? 1.0 / worst : INFINITY;
  plan->balance = worst > 0 ? sum / k / worst : 1;
  for (int s = 0; s < k; s++) {
    st_plan_stage *st = &plan->stages[s];
    int i = st->first, j = st->first + st->count;
    /* the fewest that meet the bottleneck with the links its edges have */
    problem here = *p;
    here.edge_before =
        s > 0 ? layout_links(p, L, start[s - 1], span[s - 1], start[s], span[s])
              : 0;
    here.edge_after = s + 1 < k ? layout_links(p, L, start[s], span[s],
                                               start[s + 1], span[s + 1])
                                : 0;
    int64_t ut = units_for_time(&here, L, i, j, worst, 1);
    st->pes_for_time = ut == INT64_MAX ? st->pes : ut * L->h;
    st->pes_for_memory = units_for_memory(p, L, i, j, s) * L->h;
    double dram = stage_dram_time(p, L, i, j, span[s]);
    snprintf(st->bound, sizeof st->bound, "%s",
             st->pes_for_memory > st->pes_for_time         ? "memory"
             : st->time_comm > st->time_fwd + st->time_bwd ? "communication"
             /* (stretched to dram: equal but for the scaling's rounding) */
             : dram > 0 && dram >= (st->time_fwd + st->time_bwd) * (1 - 1e-12)
                 ? "memory bandwidth"
                 : "compute");
    describe_stage(&here, L, plan, s, (span[s] - before[s]) * L->h);
  }
  (void)spare;
  st_free(start);
  st_free(span);
  st_free(before);
  return 0;
}

/* "K=3 1.28e+03/s" or "K=3 no fit": one entry of the throughput list. */
static void by_k_text(char *buf, size_t cap, const partition *q, int k) {
  double t = q->by_k[k - 1];
  if (t < INFINITY)
    snprintf(buf, cap, "K=%d %.3g/s", k, 1.0 / t);
  else
    snprintf(buf, cap, "K=%d no fit", k);
}

/* Room the end of the cause keeps: the elision with the last K, "); ties go
 * to fewer stages" and a mesh's band height. */
#define CAUSE_TAIL 120

/* what asks a sequential config's plan for its one stage */
#define ONE_STAGE_KEY "execution.mode sequential"

static int choose_stages_text(st_plan *plan, const partition *q,
                              int stages_given, const char *key,
                              int n_heights) {
  char *c = plan->cause;
  size_t cap = sizeof plan->cause;
  int n;
  if (plan->options.n_stage_blocks > 0)
    n = snprintf(c, cap, "as pinned (%s)", key);
  else if (stages_given && key && !strcmp(key, ONE_STAGE_KEY))
    n = snprintf(c, cap, "%s runs one stage on every core, no pipeline", key);
  else if (stages_given)
    n = snprintf(c, cap, "as asked (%s %d)", key, plan->n_stages);
  else if (q->by_k) {
    const char *sched = plan->options.in_flight_schedule;
    if (sched && sched[0] && strcmp(sched, "pb"))
      n = snprintf(c, cap,
                   "the best predicted rate, %s's fill and drain of M = %d "
                   "included, of K = 1..%d (",
                   sched, plan->options.micro_batches, q->n_by_k);
    else
      n = snprintf(c, cap, "the best predicted throughput of K = 1..%d (",
                   q->n_by_k);
    /* a long model's list would not fit the cause: the first K that fit,
     * then "...", then the last (plan.json has them all) */
    for (int k = 1; k <= q->n_by_k && n > 0 && (size_t)n < cap; k++) {
      char entry[48];
      by_k_text(entry, sizeof entry, q, k);
      if (k < q->n_by_k && (size_t)n + strlen(entry) + CAUSE_TAIL > cap) {
        by_k_text(entry, sizeof entry, q, q->n_by_k);
        n += snprintf(c + n, cap - (size_t)n, ", ..., %s", entry);
        break;
      }
      n += snprintf(c + n, cap - (size_t)n, "%s%s", k > 1 ? ", " : "", entry);
    }
    if (n > 0 && (size_t)n < cap)
      n += snprintf(c + n, cap - (size_t)n, "); ties go to fewer stages");
  } else {
    n = snprintf(c, cap,
                 "the best predicted throughput of K = 1..%d; ties "
                 "go to fewer stages",
                 plan->n_blocks);
  }
  if (plan->fabric.kind == ST_FABRIC_MESH && n > 0 && (size_t)n < cap)
    snprintf(c + n, cap - (size_t)n,
             "; stages in bands of %d row%s (best of %d band heights)",
             plan->band_height, plan->band_height == 1 ? "" : "s", n_heights);
  return 0;
}

/* A fill-and-drain schedule's utilization of k stages taking t[] (a
 * partition's, partition_times; set_schedule's
 * formula: gpipe and 1f1b at stages of unequal time M t_max / ((M - 1)
 * t_max + sum t_s); interleaved and zb1p st_schedule_formula); 1 for
 * pipelined backprop, which never drains, and for modes without a
 * schedule. The stage count is chosen by bottleneck / this: the rate a
 * run gets, not the steady state it never reaches at small M. */
static double drain_utilization(const double *t, int k,
                                const st_plan_options *o) {
  const char *name = o->in_flight_schedule;
  if (!name || !name[0] || !strcmp(name, "pb") || k < 2) return 1;
  int M = o->micro_batches > 0 ? o->micro_batches : 1;
  int V = !strcmp(name, "interleaved") && o->virtual_stages > 1
              ? o->virtual_stages
              : 1;
  if (V == 1 && (!strcmp(name, "gpipe") || !strcmp(name, "1f1b"))) {
    double sum = 0, worst = 0;
    for (int s = 0; s < k; s++) {
      sum += t[s];
      worst = fmax(worst, t[s]);
    }
    return worst > 0 ? M * worst / ((M - 1) * worst + sum) : 1;
  }
  double f = st_schedule_formula(name, k, M, V);
  return f > 0 ? f : (double)M / (M + k - 1);
}

int st_plan_build(st_plan **out, const st_block_cost *blocks, int n_blocks,
                  const st_fabric *fabric, const st_plan_options *opt,
                  st_error *err) {
  *out = NULL;
  const char *word = pe_word(fabric);
  int K = opt->stages;
  const char *key = opt->stages_key ? opt->stages_key : "--stages";
  const char *where = opt->stages_where ? opt->stages_where : "";
  const char *sep = opt->stages_where ? ": " : "";
  if (n_blocks < 1)
    return st_error_set(err, ST_EARG, "the model has no blocks to compile");
  int pinned = opt->stage_blocks && opt->n_stage_blocks > 0;
  if (pinned) { /* execution.stage_blocks: the cut is given */
    long long sum = 0;
    for (int s = 0; s < opt->n_stage_blocks; s++) {
      int b = opt->stage_blocks[s];
      if (b < 1 || b > n_blocks)
        return st_error_set(err, ST_EARG,
                            "%s%s%s: entry %d is %d: a stage holds 1 to %d "
                            "blocks",
                            where, sep, key, s, b, n_blocks);
      sum += b;
    }
    if (K && K != opt->n_stage_blocks)
      return st_error_set(err, ST_EARG,
                          "%s%s%s: %d stages, but %d asked for: give one",
                          where, sep, key, opt->n_stage_blocks, K);
    if (sum != n_blocks)
      return st_error_set(err, ST_EARG,
                          "%s%s%s: the stages hold %lld blocks in all; the "
                          "model has %d",
                          where, sep, key, sum, n_blocks);
    K = opt->n_stage_blocks;
  }
  if (K < 0)
    return st_error_set(err, ST_EARG, "%s%s%s %d: must be >= 1", where, sep,
                        key, K);
  if (K > n_blocks)
    return st_error_set(err, ST_EARG,
                        "%s%s%s %d: more stages than the model's %d blocks "
                        "(a stage holds at least one block)",
                        where, sep, key, K, n_blocks);
  /* interleaved: the stages are workers of V chunks, each chunk a block
   * or more (pipeline.c cuts S V of them) */
  int V = opt->in_flight_schedule &&
                  !strcmp(opt->in_flight_schedule, "interleaved") &&
                  opt->virtual_stages > 1
              ? opt->virtual_stages
              : 1;
  if ((long long)K * V > n_blocks)
    return st_error_set(err, ST_EARG,
                        "%s%s%s %d: %d stage workers of %d chunks each "
                        "(execution.virtual_stages) need %lld blocks; the "
                        "model has %d",
                        where, sep, key, K, K, V, (long long)K * V, n_blocks);
  if (K > fabric->pes) {
    char hint[96] = "";
    if (pinned)
      snprintf(hint, sizeof hint, "; a plan needs a larger --fabric");
    else if (opt->stages_key)
      snprintf(hint, sizeof hint,
               "; a run shares them, a plan needs --stages %lld or fewer, or "
               "a larger --fabric",
               (long long)fabric->pes);
    return st_error_set(err, ST_EARG,
                        "%s%s%s %d: more stages than the %lld %s of %s (a "
                        "stage needs at least one%s)",
                        where, sep, key, K, (long long)fabric->pes, word,
                        fabric->name, hint);
  }
  if (!(fabric->efficiency_slope >= 0 && fabric->efficiency_slope < 1))
    return st_error_set(err, ST_EARG, "%s: efficiency slope %g not in [0, 1)",
                        fabric->name, fabric->efficiency_slope);
  double in_flight = opt->samples_in_flight > 0 ? opt->samples_in_flight : 1;
  double versions = opt->weight_versions > 0 ? opt->weight_versions : 1;

  st_plan *plan = st_alloc(sizeof *plan);
  if (!plan) return st_error_set(err, ST_ENOMEM, "out of memory");
  plan->fabric = *fabric;
  plan->options = *opt;
  plan->options.samples_in_flight = in_flight;
  plan->options.weight_versions = versions;
  plan->n_blocks = n_blocks;
  plan->blocks = st_alloc((size_t)n_blocks * sizeof *plan->blocks);
  if (!plan->blocks) {
    st_plan_destroy(plan);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  memcpy(plan->blocks, blocks, (size_t)n_blocks * sizeof *blocks);

  /* the caller's memory (the stages say what the pin said) */
  plan->options.stage_blocks = NULL;
  plan->options.n_stage_blocks = pinned ? opt->n_stage_blocks : 0;
  plan->options.stages_where = NULL;
  problem p;
  int rc = problem_init(&p, plan->blocks, n_blocks, &plan->fabric, in_flight,
                        versions, err);
  if (rc) {
    st_plan_destroy(plan);
    return rc;
  }
  unsigned char cut_ok[n_blocks + 1];
  if (pinned) {
    memset(cut_ok, 0, sizeof cut_ok);
    for (int s = 0, at = 0; s <= opt->n_stage_blocks; s++) {
      cut_ok[at] = 1;
      if (s < opt->n_stage_blocks) at += opt->stage_blocks[s];
    }
    p.cut_ok = cut_ok;
  }
  /* Pass 2 once per band height; keep the best (ties: fewer stages, then
   * taller bands, which are tried first). When what a stage holds depends
   * on its place in a pipeline of S stages (in_flight_schedule), once per
   * S as well, each S solved exactly. */
  int hs[ST_MAX_BAND_HEIGHTS], nh = st_band_heights(fabric->height, hs);
  int k_lo = K ? K : 1, k_hi = K ? K : n_blocks;
  if (k_hi > fabric->pes) k_hi = (int)fabric->pes;
  if (!K && k_hi > n_blocks / V) k_hi = n_blocks / V > 0 ? n_blocks / V : 1;
  int per_stage = opt->in_flight_schedule && opt->in_flight_schedule[0];
  /* each S on its own where a schedule's bubble or a mesh's band turns
   * (each S's plan laid out, its edges' real links: partition_times) make
   * the chosen plan's figure other than the search's bottleneck */
  int each_S = per_stage || fabric->kind == ST_FABRIC_MESH;
  double *flight = NULL, *vers = NULL, *table = NULL;
  double *times = st_alloc((size_t)n_blocks * sizeof *times);
  if (!times) rc = ST_ENOMEM;
  if (per_stage) {
    flight = st_alloc((size_t)n_blocks * sizeof *flight);
    vers = st_alloc((size_t)n_blocks * sizeof *vers);
    if (!flight || !vers) rc = ST_ENOMEM;
  }
  if (each_S && K == 0) {
    table = st_alloc((size_t)n_blocks * sizeof *table);
    if (!table) rc = ST_ENOMEM;
    for (int k = 0; table && k < n_blocks; k++) table[k] = INFINITY;
  }
  partition best = {0};
  double best_eff = INFINITY;
  layout best_layout = {0};
  int best_S = 0;
  for (int S = each_S ? k_lo : 0; S <= (each_S ? k_hi : 0) && rc != ST_ENOMEM;
       S++) {
    if (per_stage) use_table(&p, opt, S, flight, vers);
    int lo = each_S ? S : k_lo, hi = each_S ? S : k_hi;
    for (int t = 0; t < nh && rc != ST_ENOMEM; t++) {
      layout L = make_layout(fabric, hs[t]);
      partition q;
      rc = partition_solve(&p, &L, lo, hi, opt->algorithm, K == 0 && !each_S,
                           &q);
      if (rc) continue;
      /* per stage count, the time a sample takes as laid out, with the
       * bubble */
      double eff = partition_times(&p, &L, &q, times);
      if (per_stage) eff /= drain_utilization(times, q.k, opt);
      if (table && eff < table[S - 1]) table[S - 1] = eff;
      double b = eff, bb = best_eff;
      int better = !best.k || (q.k < best.k && b <= bb * (1 + TIE)) ||
                   (q.k == best.k && b < bb) ||
                   (q.k > best.k && b < bb * (1 - TIE));
      if (better) {
        /* keep the per-K table: the best of every band height */
        if (best.by_k && q.by_k)
          for (int k = 0; k < q.n_by_k && k < best.n_by_k; k++)
            if (best.by_k[k] < q.by_k[k]) q.by_k[k] = best.by_k[k];
        partition_free(&best);
        best = q;
        best_eff = eff;
        best_layout = L;
        best_S = S;
      } else {
        if (best.by_k && q.by_k)
          for (int k = 0; k < q.n_by_k && k < best.n_by_k; k++)
            if (q.by_k[k] < best.by_k[k]) best.by_k[k] = q.by_k[k];
        partition_free(&q);
      }
    }
  }
  st_free(times);
  if (rc == ST_ENOMEM) {
    partition_free(&best);
    problem_free(&p);
    st_free(flight), st_free(vers), st_free(table);
    st_plan_destroy(plan);
    return st_error_set(err, ST_ENOMEM, "out of memory partitioning");
  }
  if (!best.k) {
    int kmax = K ? K : k_hi;
    if (per_stage) use_table(&p, opt, kmax, flight, vers);
    rc = pinned ? explain_pin_no_fit(&p, fabric, where, sep, key, err)
                : explain_no_fit(&p, fabric, kmax, K, err);
    problem_free(&p);
    st_free(flight), st_free(vers), st_free(table);
    st_plan_destroy(plan);
    return rc;
  }
  if (per_stage) use_table(&p, opt, best_S, flight, vers);
  if (table && k_lo < k_hi) { /* (each S solved alone: best has none) */
    best.by_k = table;
    best.n_by_k = k_hi;
    table = NULL;
  }
  rc = build_stages(plan, &p, &best_layout, &best, err);
  if (!rc) {
    apply_io(plan);
    choose_stages_text(plan, &best, K, key, nh);
    if (best.by_k) {
      plan->n_tried = best.n_by_k;
      plan->throughput_by_k = st_alloc((size_t)best.n_by_k * sizeof(double));
      for (int k = 0; plan->throughput_by_k && k < best.n_by_k; k++)
        plan->throughput_by_k[k] =
            best.by_k[k] < INFINITY ? 1.0 / best.by_k[k] : 0;
      if (!plan->throughput_by_k) plan->n_tried = 0;
    }
    set_schedule(plan, "", "gpipe", 1, 1, 1, 0);
  }
  partition_free(&best);
  problem_free(&p);
  st_free(flight), st_free(vers), st_free(table);
  if (rc) {
    st_plan_destroy(plan);
    return rc;
  }
  *out = plan;
  return 0;
}

/* The I/O cap (st_plan.io_rate): samples/s the fabric's I/O carries in,
 * each sample's input and labels; applied to the throughput, and every
 * stage then waits on it. */
static void apply_io(st_plan *plan) {
  const st_fabric *f = &plan->fabric;
  plan->io_rate = 0;
  if (!(f->io_bandwidth > 0) || plan->n_blocks < 1) return;
  double bytes =
      plan->blocks[0].in_bytes + plan->blocks[plan->n_blocks - 1].label_bytes;
  if (!(bytes > 0)) return;
  plan->io_rate = f->io_bandwidth / bytes;
  if (plan->io_rate < plan->throughput) {
    plan->throughput = plan->io_rate;
    for (int s = 0; s < plan->n_stages; s++)
      snprintf(plan->stages[s].bound, sizeof plan->stages[s].bound, "I/O");
  }
}

/* What weight streaming's fabric holds, summed over the blocks. */
typedef struct ws_sums {
  double acts;    /* every block's input and activations, a sample */
  double ins;     /* every block's input, a sample */
  double act_max; /* the largest block's activations, a sample */
  double w_max;   /* the largest block's weights */
  double store;   /* every block's weights and state */
  double weights; /* every block's weights */
  double work;    /* the compute stage's workspace a sample (work_*) */
} ws_sums;

static ws_sums streaming_sums(const st_block_cost *blocks, int n) {
  ws_sums w = {0};
  double wn = 0, wsc = 0;
  for (int b = 0; b < n; b++) {
    const st_block_cost *c = &blocks[b];
    wn = fmax(wn, c->work_numel_bytes);
    wsc = fmax(wsc, c->work_scratch_bytes);
    w.acts += c->act_bytes + c->in_bytes;
    w.ins += c->in_bytes;
    w.act_max = fmax(w.act_max, c->act_bytes);
    w.w_max = fmax(w.w_max, c->param_bytes);
    w.store += c->param_bytes + c->state_bytes;
    w.weights += c->param_bytes;
  }
  w.work = 5 * wn + wsc;
  return w;
}

double st_plan_streaming_need(const st_block_cost *blocks, int n, int m,
                              int slots, int keep_activations,
                              int store_on_fabric) {
  ws_sums w = streaming_sums(blocks, n);
  return m * (keep_activations ? w.acts : w.ins + w.act_max) +
         (slots < 1 ? 2 : slots + 1) * w.w_max + m * w.work +
         (store_on_fabric ? w.store : 0);
}

/* What crosses between weight streaming's store and its compute side for
 * block c, in bytes (ws.c, store.c): its stored weights (W', fetched for
 * each pass of each micro-batch), its gradient (G, out every micro-batch,
 * back every one after the first) and its update once a step (the weights,
 * gradient and state read, the weights and state written; a tied copy's
 * gradient read and weights written). r: a stored weight's bytes over 4. */
typedef struct ws_bytes {
  double in, grad, update, update_writes;
} ws_bytes;

static ws_bytes block_traffic(const st_block_cost *c, double r) {
  double W = c->param_bytes, tied = fmin(c->tied_bytes, W), own = W - tied;
  double slots = W > 0 ? (c->state_bytes - W) / W : 0; /* state: s x W */
  ws_bytes b = {.in = r * W, .grad = W};
  b.update_writes = r * own + slots * own + r * tied;
  b.update = (r + 1 + slots) * own + tied + b.update_writes;
  return b;
}

int st_plan_streaming(st_plan **out, const st_block_cost *blocks, int n,
                      const st_fabric *fabric, int batch, int micro_batch,
                      int slots, int keep_activations,
                      const st_stream_store *where, st_error *err) {
  *out = NULL;
  static const st_stream_store beside = {0, 0, 0};
  if (!where) where = &beside;
  const int store_on_fabric = where->on_fabric;
  if (n < 1) return st_error_set(err, ST_EARG, "the model has no blocks");
  if (batch < 1) batch = 1;
  int m = micro_batch > 0 && micro_batch < batch ? micro_batch : batch;
  if (m < 1) m = 1;
  if (slots < 1) slots = 1;
  /* what the fabric holds */
  ws_sums sums = streaming_sums(blocks, n);
  double store = sums.store, weights = sums.weights;
  double per_sample = keep_activations ? sums.acts : sums.ins + sums.act_max;
  double held_weights = (slots + 1) * sums.w_max; /* slots, and a gradient */
  double need = st_plan_streaming_need(blocks, n, m, slots, keep_activations,
                                       store_on_fabric);
  double cap = (double)fabric->pes * fabric->pe_memory;
  if (!(need <= cap)) {
    char a[32], b[32], c[32], d[32];
    return st_error_set(
        err, ST_EUNSUPPORTED,
        "weight streaming does not fit %s: micro-batches of %d need %s (%s, "
        "%s a sample, %d blocks of weights and a gradient, %s%s) but the "
        "fabric holds %s",
        fabric->name, m, st_plan_fmt_bytes(a, sizeof a, need),
        keep_activations ? "the activations of every block"
                         : "every block's input and one block's activations",
        st_plan_fmt_bytes(b, sizeof b, per_sample), slots,
        st_plan_fmt_bytes(c, sizeof c, held_weights),
        store_on_fabric ? ", and the store's weights and state" : "",
        st_plan_fmt_bytes(d, sizeof d, cap));
  }
  st_plan *plan = st_alloc(sizeof *plan);
  double *tfs = st_alloc(2 * (size_t)n * sizeof *tfs), *tbs = tfs + n;
  double *tcs = st_alloc((size_t)n * sizeof *tcs);
  if (!plan || !tfs || !tcs) {
    st_free(plan), st_free(tfs), st_free(tcs);
    return st_error_set(err, ST_ENOMEM, "out of memory");
  }
  plan->fabric = *fabric;
  plan->n_blocks = n;
  plan->blocks = st_alloc((size_t)n * sizeof *plan->blocks);
  plan->stages = st_alloc(sizeof *plan->stages);
  problem p;
  int rc = plan->blocks && plan->stages
               ? 0
               : st_error_set(err, ST_ENOMEM, "out of memory");
  if (!rc) {
    memcpy(plan->blocks, blocks, (size_t)n * sizeof *blocks);
    rc = problem_init(&p, plan->blocks, n, fabric, m, 1, err);
  }
  if (rc) {
    st_free(tfs), st_free(tcs);
    st_plan_destroy(plan);
    return rc;
  }
  p.no_edges = 1;
  layout L = make_layout(fabric, fabric->height); /* one band: all PEs */
  for (int b = 0; b < n; b++) {
    double tf, tb, tc;
    stage_time(&p, &L, b, b + 1, L.units, &tf, &tb, &tc);
    tf += tc / 2; /* the region's traffic, half each pass */
    tb += tc / 2;
    if (!keep_activations) { /* the backward runs the forward again */
      tb += tf;
      tc *= 1.5;
    }
    tfs[b] = tf, tbs[b] = tb, tcs[b] = tc;
  }
  problem_free(&p);
  double bw =
      fabric->stream_bandwidth > 0 ? fabric->stream_bandwidth : INFINITY;
  const int one_channel = fabric->kind == ST_FABRIC_CPU;
  const double r = where->bf16 ? 0.5 : 1.0;
  /* micro-batch by micro-batch (the last may be short), block by block:
   * C the compute side's seconds, B the store channel's, U_0 the first
   * block's update (the step's last); on a mesh the link's time where it
   * is longer than the compute (bound) */
  double C = 0, B = 0, U0 = 0, compute = 0, comm = 0, bound = 0, tf_all = 0,
         tb_all = 0, step_bytes = 0, read_bytes = 0, write_bytes = 0,
         inward = 0;
  for (int k = 0; k * m < batch; k++) {
    double rows = batch - k * m < m ? batch - k * m : m;
    for (int b = 0; b < n; b++) {
      ws_bytes x = block_traffic(&blocks[b], r);
      double in = x.in / bw, g = x.grad / bw, back = k ? g : 0;
      double f = fmax(rows * tfs[b], in), bk;
      if (one_channel) { /* the gradient copies on the compute thread */
        bk = fmax(rows * tbs[b], in) + g + back;
        B += 2 * in + g + back;
        bound += (in > rows * tfs[b] ? f - rows * tfs[b] : 0) +
                 (in > rows * tbs[b] ? in - rows * tbs[b] : 0) + g + back;
      } else { /* two directions, each overlapping the compute */
        bk = fmax(rows * tbs[b], fmax(in + back, g));
        bound += (f > rows * tfs[b] ? f : 0) + (bk > rows * tbs[b] ? bk : 0);
      }
      step_bytes += 2 * x.in + x.grad + (k ? x.grad : 0);
      read_bytes += 2 * x.in + (k ? x.grad : 0);
      write_bytes += x.grad;
      inward += 2 * x.in + (k ? x.grad : 0);
      C += f + bk;
      compute += rows * (tfs[b] + tbs[b] - tcs[b]);
      comm += rows * tcs[b];
      tf_all += f;
      tb_all += bk;
    }
  }
  for (int b = 0; b < n && one_channel; b++) {
    ws_bytes x = block_traffic(&blocks[b], r);
    B += x.update / bw;
    if (b == 0) U0 = x.update / bw;
    step_bytes += x.update;
    read_bytes += x.update - x.update_writes;
    write_bytes += x.update_writes;
  }
  double T = one_channel ? fmax(C, B - U0) + U0 : C;
  /* a file store's disk: the commit syncs what the step wrote (the
   * gradient slab once, the update's weights and state); the page cache
   * holds the file beside what the fabric holds, else every read and
   * write goes to the disk (a scan larger than an LRU cache misses
   * every time) */
  double disk = 0;
  int cached = 0;
  if (where->file && fabric->disk_bandwidth > 0) {
    double grads = 0, file = 0;
    for (int b = 0; b < n; b++) {
      grads += blocks[b].param_bytes;
      file += 2 * (r * blocks[b].param_bytes + blocks[b].state_bytes -
                   blocks[b].param_bytes) +
              blocks[b].param_bytes;
    }
    double synced = grads;
    for (int b = 0; b < n; b++)
      synced += block_traffic(&blocks[b], r).update_writes;
    cached = file <= cap - need;
    disk =
        (cached ? synced : read_bytes + write_bytes) / fabric->disk_bandwidth;
  }
  int disk_binds = disk > T;
  if (disk_binds) T = disk;
  st_free(tfs), st_free(tcs);
  st_plan_stage *st = &plan->stages[0];
  plan->n_stages = 1;
  plan->band_height = fabric->height;
  plan->bands = 1;
  st->first = 0;
  st->count = n;
  st->pes = fabric->pes;
  st->w = fabric->width;
  st->h = fabric->height;
  st->pes_for_time = st->pes_for_memory = fabric->pes;
  for (int b = 0; b < n; b++) {
    st->flops_fwd += blocks[b].flops_fwd;
    st->flops_bwd += blocks[b].flops_bwd;
  }
  /* the step's time apart from its passes (the update's tail, waits on
   * the channel or the disk) is the backward's */
  st->time_fwd = tf_all / batch;
  st->time_bwd = (T - tf_all) / batch;
  st->time = T / batch;
  st->time_comm = comm / batch; /* within time_fwd and time_bwd */
  st->in_flight = m;
  st->versions = 1;
  st->mem_weights = held_weights + (store_on_fabric ? weights : 0);
  st->mem_state = store_on_fabric ? store - weights : 0;
  st->mem_acts = m * per_sample;
  st->mem_work = m * sums.work;
  st->mem_total = need;
  st->mem_capacity = cap;
  /* the channel's seconds a step; a mesh's link: its busier direction */
  double channel = one_channel ? B : fmax(inward, write_bytes) / bw;
  snprintf(st->bound, sizeof st->bound, "%s",
           disk_binds                          ? "disk"
           : one_channel && B > compute + comm ? "I/O"
           : !one_channel && bound > T / 2     ? "I/O"
           : comm > compute                    ? "communication"
                                               : "compute");
  char t1[32], t2[32], t3[32], t4[32], t5[32];
  if (isfinite(bw))
    snprintf(t2, sizeof t2, "at %s/s", st_plan_fmt_bytes(t1, sizeof t1, bw));
  else
    snprintf(t2, sizeof t2, "(bandwidth not modelled)");
  snprintf(st->cause, sizeof st->cause,
           "one block at a time on all %s %s; %s a step cross between the "
           "store and it %s%s (%s a sample), its compute takes %s a sample",
           st_plan_fmt_count(t1, sizeof t1, (double)fabric->pes),
           pe_word(fabric), st_plan_fmt_bytes(t5, sizeof t5, step_bytes), t2,
           one_channel ? " on one channel" : ", each way at once",
           st_plan_fmt_time(t3, sizeof t3, channel / batch),
           st_plan_fmt_time(t4, sizeof t4, (compute + comm) / batch));
  plan->pes_used = fabric->pes;
  plan->bottleneck = 0;
  plan->bottleneck_time = st->time;
  plan->throughput = st->time > 0 ? 1.0 / st->time : INFINITY;
  plan->balance = 1;
  plan->ws_compute = (compute + comm) / batch;
  plan->ws_stream = channel / batch;
  plan->ws_disk = disk / batch;
  plan->ws_cached = cached;
  plan->options.samples_in_flight = m;
  plan->options.weight_versions = 1;
  snprintf(plan->cause, sizeof plan->cause,
           "weight streaming: one stage, the whole fabric, one block at a "
           "time");
  set_schedule(plan, "weight_streaming", "gpipe", 1, batch, m, 0);
  apply_io(plan);
  *out = plan;
  return 0;
}

static int plan_replicas(st_plan **out, const st_config *cfg,
                         const st_fabric *fabric, const st_block_cost *costs,
                         int n, int stages, st_error *err);

st_plan_options st_plan_mode_options(const st_config *cfg) {
  const char *mode = cfg->execution.mode;
  int mb = st_plan_micro_batch(cfg);
  /* Samples whose activations a stage holds, as its mode keeps them: a
   * sequential step one micro-batch (the batch, unless split), block-
   * sequential all of the batch; a pipeline's schedule and pipelined
   * backprop what stage s of S keeps (st_plan_options.in_flight_schedule),
   * with the weight copies its mitigation keeps (st_pb_weight_copies). */
  int pipelined =
      !strcmp(mode, "pipeline") || !strcmp(mode, "pipelined_backprop");
  int pb = !strcmp(mode, "pipelined_backprop");
  /* block_sequential runs gpipe's order inside its segment (pipeline.c:
   * every stage's M forwards, then its M backwards, each stage holding all
   * M): it fills and drains as gpipe does, and the stage count is chosen
   * with that bubble, not by a steady state it never reaches (at M = 1 its
   * stages never overlap). One segment: a plan that fits the machine is one
   * (st_cut_segments), unless execution.blocks_per_segment cuts more. */
  int blockseq = !strcmp(mode, "block_sequential");
  st_plan_options opt = {.samples_in_flight = blockseq ? cfg->train.batch : mb,
                         .weight_versions = 1,
                         .algorithm = ST_PARTITION_AUTO,
                         .in_flight_schedule = pb ? "pb"
                                               : pipelined
                                                   ? cfg->execution.schedule
                                               : blockseq ? "gpipe"
                                                          : NULL,
                         .micro_batch = mb,
                         .micro_batches = mb > 0 ? cfg->train.batch / mb : 1,
                         .virtual_stages = cfg->execution.virtual_stages,
                         .mitigation = pb ? cfg->execution.mitigation : NULL};
  return opt;
}

int st_plan_from_costs(st_plan **out, const st_config *cfg,
                       const st_fabric *fabric, const st_block_cost *costs,
                       int n, int stages, st_error *err) {
  *out = NULL;
  const char *mode = cfg->execution.mode;
  if (cfg->execution.replicas > 1 && strcmp(mode, "weight_streaming"))
    return plan_replicas(out, cfg, fabric, costs, n, stages, err);
  int mb = st_plan_micro_batch(cfg);
  if (!strcmp(mode, "weight_streaming")) {
    /* the store: a file's are on disk; a cpu's memory store is in RAM
     * (a mesh's store is beside it, never on it) */
    int cpu = fabric->kind == ST_FABRIC_CPU,
        file = !strcmp(cfg->execution.store, "file");
    st_stream_store where = {
        .on_fabric = cpu && !file,
        .file = cpu && file,
        .bf16 = file && !strcmp(cfg->execution.store_weights, "bf16")};
    int rc = st_plan_streaming(out, costs, n, fabric, cfg->train.batch, mb,
                               cfg->execution.prefetch + 1,
                               cfg->execution.keep_activations, &where, err);
    if (!rc) snprintf((*out)->model, sizeof(*out)->model, "%s", cfg->path);
    return rc;
  }
  int pipelined =
      !strcmp(mode, "pipeline") || !strcmp(mode, "pipelined_backprop");
  int blockseq = !strcmp(mode, "block_sequential");
  /* the sequential mode runs one stage on every core (what `strata train`
   * runs): a cut of it would be a pipeline's steady state, which no
   * sequential step reaches */
  int one_stage = !stages && !strcmp(mode, "sequential");
  if (one_stage) stages = 1;
  st_plan_options opt = st_plan_mode_options(cfg);
  opt.stages = stages;
  /* a config that asks a pipelined mode for K stages (block_sequential: in
   * its segment) compiles to K (what
   * `strata train` runs; more than the fabric's cores is an error naming
   * the key, where the run would share them); per_block stays automatic,
   * as the shipped per_block configs are emulated experiments of 10-20
   * stages that no small machine's plan holds */
  char where[160];
  const st_int_list *pin = &cfg->execution.stage_blocks;
  int chunks = pipelined && !strcmp(cfg->execution.mode, "pipeline") &&
               !strcmp(cfg->execution.schedule, "interleaved") &&
               cfg->execution.virtual_stages > 1;
  if (pipelined && pin->n > 0 && chunks) {
    /* the interleaved pin cuts chunks, V to a worker and not contiguous:
     * the plan, whose stages are its workers, takes their count */
    opt.stages = pin->n / cfg->execution.virtual_stages;
    opt.stages_key = "execution.stage_blocks";
    snprintf(where, sizeof where, "%s",
             st_config_where(cfg, "execution.stage_blocks"));
    opt.stages_where = where;
  } else if (pipelined && pin->n > 0) { /* the cut is given */
    opt.stage_blocks = pin->v;
    opt.n_stage_blocks = pin->n;
    opt.stages_key = "execution.stage_blocks";
    snprintf(where, sizeof where, "%s",
             st_config_where(cfg, "execution.stage_blocks"));
    opt.stages_where = where;
  } else if (!stages && (pipelined || blockseq) && cfg->execution.stages > 0 &&
             cfg->execution.stages != ST_STAGES_PER_BLOCK) {
    opt.stages = cfg->execution.stages;
    opt.stages_key = "execution.stages";
    snprintf(where, sizeof where, "%s",
             st_config_where(cfg, "execution.stages"));
    opt.stages_where = where;
  }
  if (one_stage) opt.stages_key = ONE_STAGE_KEY;
  int rc = st_plan_build(out, costs, n, fabric, &opt, err);
  if (!rc) {
    snprintf((*out)->model, sizeof(*out)->model, "%s", cfg->path);
    /* the modes on stage threads hand each step over (block_sequential:
     * once a phase, step_handoffs; emulated pipelined backprop: none); in
     * one process a pipeline's and block_sequential's caller runs their
     * first stage (over ranks it does not: st_plan_place_ranks) */
    int threaded =
        !strcmp(mode, "pipeline") || !strcmp(mode, "block_sequential")
            ? ST_HANDOFF_HOSTED
        : !strcmp(mode, "pipelined_backprop") && !cfg->execution.emulate
            ? ST_HANDOFF_ASLEEP
            : 0;
    set_schedule(*out, mode, cfg->execution.schedule,
                 cfg->execution.virtual_stages, cfg->train.batch,
                 st_plan_micro_batch(cfg), threaded);
  }
  return rc;
}

/* Data parallelism in one process (replicas.c): R copies of the mode's
 * executor, replica r on cores [r P, (r + 1) P) with P = C / R (the rest
 * idle), each running B / R samples a step into its own gradient slab;
 * the caller then sums the R slabs in a fixed order and updates once.
 * Planned as one replica on its P cores and its share of the batch (the
 * machine's memory is one pool: the replica may use all of it, and what
 * all R hold together is checked against it — in one process only: over
 * MPI ranks, cfg->launch, no process holds the R copies, and
 * st_plan_place_ranks checks what each rank does hold against what its
 * machine gives it), then scaled: R replicas'
 * samples at once, each stage held R times but for the weights and the
 * optimizer state (shared), and the sum of the slabs after every step:
 * for each r >= 1 slab r read and cleared, the sum read and written once
 * (its 64 KiB chunks stay in cache), 2 R x the weights' bytes a step, at
 * the fabric's memory bandwidth. A mesh (a what-if: replicas.c runs on a
 * cpu) gives each replica a strip of W / R columns, and a PE has only its
 * own memory: each strip holds its replica's own weights and optimizer
 * state beside its slab, activations and workspace (the replica is
 * planned on the strip's own memory); the slabs are summed along the
 * strips' edges, one after another, and the sum goes back the same way to
 * every strip, which updates its own copy. */
static int plan_replicas(st_plan **out, const st_config *cfg,
                         const st_fabric *fabric, const st_block_cost *costs,
                         int n, int stages, st_error *err) {
  const int R = cfg->execution.replicas;
  int64_t per =
      fabric->kind == ST_FABRIC_CPU ? fabric->pes / R : fabric->width / R;
  if (per < 1)
    return st_error_set(
        err, ST_EARG,
        "%s: execution.replicas %d: more replicas than the %lld %s of %s "
        "(a replica needs at least one%s; a run shares them, a plan needs "
        "execution.replicas %lld or fewer, or a larger --fabric)",
        st_config_where(cfg, "execution.replicas"), R,
        (long long)(fabric->kind == ST_FABRIC_CPU ? fabric->pes
                                                  : fabric->width),
        fabric->kind == ST_FABRIC_CPU ? "cores" : "PE columns", fabric->name,
        fabric->kind == ST_FABRIC_CPU ? "" : " column",
        (long long)(fabric->kind == ST_FABRIC_CPU ? fabric->pes
                                                  : fabric->width));
  st_config one = *cfg;
  one.execution.replicas = 1;
  one.train.batch = cfg->train.batch / R;
  const int mesh = fabric->kind == ST_FABRIC_MESH;
  st_fabric sub = *fabric;
  sub.width = (int)per;
  sub.pes = per * sub.height;
  /* a cpu's memory is one pool; a mesh PE's is its own */
  if (!mesh)
    sub.pe_memory = fabric->pe_memory * (double)fabric->pes / (double)sub.pes;
  /* the R replicas run at once: each has its share of the machine's
   * memory bandwidth and last-level cache, not all of it */
  sub.memory_bandwidth =
      fabric->memory_bandwidth * (double)sub.pes / (double)fabric->pes;
  sub.cache_bytes = fabric->cache_bytes * (double)sub.pes / (double)fabric->pes;
  snprintf(sub.name, sizeof sub.name, "%.14s/%d replicas", fabric->name, R);
  int rc = st_plan_from_costs(out, &one, &sub, costs, n, stages, err);
  if (rc) return rc;
  st_plan *p = *out;
  p->fabric = *fabric;
  p->replicas = R;
  p->replica_pes = sub.pes;
  p->global_batch = cfg->train.batch;
  double grads = 0, held = 0;
  p->pes_used = 0;
  for (int s = 0; s < p->n_stages; s++) {
    st_plan_stage *st = &p->stages[s];
    double g = 0;
    for (int b = st->first; b < st->first + st->count; b++)
      g += p->blocks[b].param_bytes; /* the slab: one float a parameter */
    grads += g;
    if (mesh) { /* every strip all of its stage: R copies of each part */
      st->mem_replicas = (R - 1) * st->mem_total;
      st->mem_weights *= R;
      st->mem_state *= R;
    } else {
      st->mem_replicas = (R - 1) * (g + st->mem_acts + st->mem_work);
      st->mem_state += (R - 1) * g;
    }
    st->mem_acts *= R;
    st->mem_work *= R;
    st->mem_total += st->mem_replicas;
    st->mem_capacity = (double)R * (double)st->pes * fabric->pe_memory;
    p->pes_used += R * st->pes;
    held += st->mem_total;
  }
  double cap = (double)fabric->pes * fabric->pe_memory;
  /* a mesh's strips each held their own above */
  if (!mesh && cfg->launch.ranks <= 1 && !(held <= cap)) {
    char a[32], b[32], c[32], d[32], e[32];
    double one_acts = (p->stages[0].mem_acts) / R;
    st_plan_destroy(p);
    *out = NULL;
    return st_error_set(
        err, ST_EUNSUPPORTED,
        "%d replicas do not fit %s: each holds its own gradient slab (%s) "
        "and its micro-batch's activations (%s at the first stage); with "
        "the shared weights and optimizer state they need %s, the machine "
        "holds %s: short by %s",
        R, fabric->name, st_plan_fmt_bytes(a, sizeof a, grads),
        st_plan_fmt_bytes(b, sizeof b, one_acts),
        st_plan_fmt_bytes(c, sizeof c, held),
        st_plan_fmt_bytes(d, sizeof d, cap),
        st_plan_fmt_bytes(e, sizeof e, held - cap));
  }
  p->throughput = p->bottleneck_time > 0 ? R / p->bottleneck_time : INFINITY;
  /* all R take their samples in through the one fabric's I/O */
  apply_io(p);
  /* cpu: through the machine's memory; a mesh: each strip's slab across
   * the edge to the next, H links wide, one after another, and the sum
   * back across the same R - 1 edges to every strip's own weights */
  double bytes = mesh ? 2.0 * (R - 1.0) * grads : 2.0 * R * grads;
  double bw = fabric->kind == ST_FABRIC_CPU
                  ? fabric->memory_bandwidth
                  : fabric->height * fabric->link_bandwidth;
  p->reduce_time =
      bw > 0 && cfg->train.batch > 0 ? bytes / bw / cfg->train.batch : 0;
  return 0;
}

/* What rank r holds past `allowed`: an error naming the rank, the limit
 * that binds (`what`, `why`: where it comes from), its largest block and
 * the shortfall. */
static int rank_over(const st_plan *p, int r, double allowed, const char *what,
                     const char *why, st_error *err) {
  int worst = -1;
  for (int s = p->rank_stages[r]; s < p->rank_stages_end[r]; s++)
    for (int b = p->stages[s].first;
         b < p->stages[s].first + p->stages[s].count; b++)
      if (worst < 0 || p->blocks[b].param_bytes > p->blocks[worst].param_bytes)
        worst = b;
  char need[32], lim[32], short_by[32], biggest[32], tail[160] = "",
                                                     host[160] = "";
  if (worst >= 0)
    snprintf(tail, sizeof tail, "; its largest block, %s, holds %s of weights",
             p->blocks[worst].name,
             st_plan_fmt_bytes(biggest, sizeof biggest,
                               p->blocks[worst].param_bytes));
  if (p->mem_batch > 0) {
    char d[32], b[32];
    if (p->mem_data >= 0)
      snprintf(host, sizeof host,
               ", the data %s and the trainer's batch "
               "buffers %s",
               st_plan_fmt_bytes(d, sizeof d, p->mem_data),
               st_plan_fmt_bytes(b, sizeof b, p->mem_batch));
    else
      snprintf(host, sizeof host,
               ", the trainer's batch buffers %s; the "
               "data not counted",
               st_plan_fmt_bytes(b, sizeof b, p->mem_batch));
  }
  return st_error_set(
      err, ST_ENOMEM,
      "%s is %s%s, but the plan gives rank %d of %d %s (its stages' "
      "weights, state and activations%s): short by %s%s",
      what, st_plan_fmt_bytes(lim, sizeof lim, allowed), why, r, p->ranks,
      st_plan_fmt_bytes(need, sizeof need, p->rank_memory[r]), host,
      st_plan_fmt_bytes(short_by, sizeof short_by, p->rank_memory[r] - allowed),
      tail);
}

int st_plan_place_ranks(st_plan *p, const st_config *cfg, st_error *err) {
  int ranks = cfg->launch.ranks;
  /* one process: only its limit to check */
  if (ranks <= 1 && cfg->execution.rank_memory_limit <= 0) return 0;
  if (ranks < 1) ranks = 1;
  const int k = p->n_stages;
  /* in one process every stage is this process's */
  int placed = ranks > 1 && !strcmp(cfg->execution.placement, "ranks");
  int ws = ranks > 1 && !strcmp(cfg->execution.mode, "weight_streaming");
  int R = placed && cfg->execution.replicas > 0 ? cfg->execution.replicas : 1;
  if (placed && ranks % R)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.replicas: %d replicas do not split "
                        "%d ranks into pipelines of equal size",
                        st_config_where(cfg, "execution.replicas"), R, ranks);
  int P = placed ? ranks / R : 1;
  /* as `strata train` refuses it: a rank without a stage of the pipeline */
  const char *mode = cfg->execution.mode;
  if (placed && k < P &&
      (!strcmp(mode, "pipeline") || !strcmp(mode, "pipelined_backprop")))
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.stages: %d stage%s over %d ranks "
                        "(execution.placement: ranks): each rank needs a "
                        "stage",
                        st_config_where(cfg, "execution.stages"), k,
                        k == 1 ? "" : "s", P);
  p->rank_memory = st_alloc((size_t)ranks * sizeof *p->rank_memory);
  p->rank_stages = st_alloc(2 * (size_t)ranks * sizeof *p->rank_stages);
  if (!p->rank_memory || !p->rank_stages)
    return st_error_set(err, ST_ENOMEM, "out of memory");
  p->rank_stages_end = p->rank_stages + ranks;
  p->ranks = ranks;
  /* placed over ranks, a pipeline's stages all keep their threads (its
   * caller hosts none, src/exec/pipeline.c): the caller's hand-off is the
   * one where it sleeps, not the hosted one set_schedule charged */
  if (placed && p->batch > 0 &&
      (!strcmp(p->mode, "pipeline") || !strcmp(p->mode, "block_sequential")))
    p->host_time += step_handoffs(p->mode) *
                    (p->fabric.step_latency - p->fabric.hosted_latency) /
                    p->batch;
  /* the largest block's weights: what a compute rank of weight streaming
   * holds in each of its prefetch + 1 slots */
  double block_w = 0, acts = 0, held = 0;
  for (int b = 0; b < p->n_blocks; b++)
    if (p->blocks[b].param_bytes > block_w) block_w = p->blocks[b].param_bytes;
  for (int s = 0; s < k; s++) acts += p->stages[s].mem_acts;
  /* over ranks a rank holds one replica (ranks.c); in one process the
   * replicas' copies are this process's too */
  for (int s = 0; s < k; s++)
    held +=
        p->stages[s].mem_total - (ranks > 1 ? p->stages[s].mem_replicas : 0);
  held += p->mem_eval_whole; /* a replica evaluates the whole model */
  /* every rank loads the data and sizes the trainer's batch buffers
   * (st_plan_compile: mem_data, mem_batch) */
  double host = (p->mem_data > 0 ? p->mem_data : 0) + p->mem_batch;
  int file = !strcmp(cfg->execution.store, "file");
  for (int r = 0; r < ranks; r++) {
    double bytes = 0;
    int lo = 0, hi = k;
    if (ws && r == 0) { /* the store: a file store's are on disk */
      hi = 0;
      for (int b = 0; b < p->n_blocks && !file; b++)
        bytes += p->blocks[b].param_bytes + p->blocks[b].state_bytes;
    } else if (ws) {
      hi = 0;
      /* the walk's slots and two gradients; an evaluation walks the same
       * buffers, sized for the larger of the micro-batch and the
       * evaluation batch (ws.c: rows) */
      double rows = p->micro_batch > 0 && p->eval_batch > p->micro_batch
                        ? (double)p->eval_batch / p->micro_batch
                        : 1;
      bytes = acts * rows + (cfg->execution.prefetch + 3) * block_w;
    } else if (placed) {
      int member = r % P;
      lo = hi = -1;
      for (int s = 0; s < k; s++)
        if ((int)((long long)s * P / k) == member) {
          if (lo < 0) lo = s;
          hi = s + 1;
          bytes += p->stages[s].mem_total - p->stages[s].mem_replicas +
                   p->stages[s].mem_eval;
        }
      if (lo < 0) lo = hi = 0;
    } else {
      bytes = held;
    }
    p->rank_memory[r] = bytes + host;
    p->rank_stages[r] = lo;
    p->rank_stages_end[r] = hi;
  }
  /* What a rank may hold: the limit, and over ranks on a cpu its share of
   * its machine's memory (the fabric's: one machine), split over the ranks
   * that share the machine as the trainer splits it at run time
   * (st_rank_memory_allowed); the lesser binds. A mesh's ranks are not
   * modelled: only the limit. */
  double limit = (double)cfg->execution.rank_memory_limit;
  int per = cfg->launch.per_machine > 0 ? cfg->launch.per_machine : 1;
  double machine = (double)p->fabric.pes * p->fabric.pe_memory;
  double share =
      ranks > 1 && p->fabric.kind == ST_FABRIC_CPU ? machine / per : INFINITY;
  int by_limit = limit > 0 && limit <= share;
  double allowed = by_limit ? limit : share;
  p->rank_allowed = isfinite(allowed) ? allowed : 0;
  p->rank_per_machine = by_limit ? 0 : per;
  for (int r = 0; isfinite(allowed) && r < ranks; r++) {
    if (p->rank_memory[r] <= allowed) continue;
    char what[160], why[160] = "";
    if (by_limit) {
      snprintf(what, sizeof what, "%s: execution.rank_memory_limit",
               st_config_where(cfg, "execution.rank_memory_limit"));
    } else {
      char m[32], over[48] = "";
      if (per > 1)
        snprintf(over, sizeof over, ", over the %d ranks on it", per);
      snprintf(what, sizeof what, "the memory its machine gives a rank");
      snprintf(why, sizeof why, " (%s: %s of memory%s)", p->fabric.name,
               st_plan_fmt_bytes(m, sizeof m, machine), over);
    }
    return rank_over(p, r, allowed, what, why, err);
  }
  return 0;
}

void st_plan_destroy(st_plan *p) {
  if (!p) return;
  st_free(p->rank_memory);
  st_free(p->rank_stages);
  st_free(p->blocks);
  st_free(p->stages);
  st_free(p->throughput_by_k);
  st_free(p);
}
