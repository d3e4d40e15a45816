/*
 * test_mesh.c — the compiler on a mesh and the mode it chooses
 * (docs/compiler.md, "The mesh model", "Choosing the mode"), on cases with a
 * known answer:
 *   - one layer's region grown column by column: its time falls, reaches
 *     its least at the closed-form width sqrt(b / c) of t(w) = a + b/w + c w,
 *     then rises; a plan on a wider mesh stops there;
 *   - equal layers get equal regions;
 *   - a layer whose weights and state outgrow a region is never given it;
 *   - the fabric's I/O caps the throughput at io_bandwidth / (input +
 *     labels) and every stage says so;
 *   - weight streaming equals its closed form for a uniform model, both
 *     when streaming and when compute binds;
 *   - in flight as each schedule keeps it (1f1b, gpipe, pipelined backprop
 *     with stashing), against the counts written out here;
 *   - a mesh's band heights are every divisor of its height;
 *   - a PE's SRAM bandwidth bounds a plan whose compute is near free;
 *   - every published GPT config plans at its published batch on cpu:16,
 *     cpu:64, mesh:757x996 and wse2 with a mode whose plan fits, and a mesh
 *     too small for any is refused naming the smallest that would do.
 */
#include "harness.h"
#include "strata.h"

#include "../../src/compile/compile.h"
#include "mesh_fabric.h"

#include <math.h>
#include <string.h>

static st_fabric mesh(int w, int h) {
  st_fabric f = test_mesh_fabric(w, h, 48e3, 4e9);
  f.hop_latency = 1e-9;
  f.pe_overhead = 2e-8;
  f.io_bandwidth = f.stream_bandwidth = 150e9;
  return f;
}

/* A linear layer of `in` x `out` as one block, as cost.c counts it. */
/* One block on the whole fabric, by hand (the mesh model): forward and
 * backward seconds a sample, its FLOPs over every PE plus the per-PE
 * overhead and the region's traffic (input across the height, partial sums
 * across the width, w + h hops), and the seconds to stream its weights. */
static void whole_fabric_pass(const st_block_cost *b, const st_fabric *f,
                              double *tf, double *tb, double *in) {
  double P = (double)f->pes, W = f->width, H = f->height;
  double comm = b->region_in / (H * f->link_bandwidth) +
                b->region_out / (W * f->link_bandwidth) +
                (W + H) * f->hop_latency;
  *tf = b->flops_fwd / (P * f->pe_flops) + f->pe_overhead + comm;
  *tb = b->flops_bwd / (P * f->pe_flops) + f->pe_overhead + comm;
  *in = b->param_bytes / f->stream_bandwidth;
}

static st_block_cost linear_block(const char *name, double in, double out) {
  st_block_cost b;
  memset(&b, 0, sizeof b);
  snprintf(b.name, sizeof b.name, "%s", name);
  b.flops_fwd = 2 * in * out + out;
  b.flops_bwd = 4 * in * out + out;
  b.param_bytes = 4 * (in * out + out);
  b.state_bytes = 2 * b.param_bytes;
  b.act_bytes = 4 * out;
  b.in_bytes = 4 * in;
  b.out_bytes = 4 * out;
  b.region_in = 4 * in;
  b.region_out = 4 * out;
  b.region_layers = 1;
  b.label_bytes = 4;
  return b;
}

/* One layer, one band of height H, w columns: the time by stage_time
 * against t(w) = a + b / w + c w written out here. */
static void test_region_grows(void) {
  st_fabric f = mesh(2000, 40);
  st_block_cost b = linear_block("l", 784, 256);
  problem p;
  st_error err = {0};
  CHECK(problem_init(&p, &b, 1, &f, 1, 1, &err) == 0, "%s", err.msg);
  layout L = {.h = 40, .bands = 1, .width = 2000, .units = 2000};
  double H = 40, bw = f.link_bandwidth, lat = f.hop_latency;
  double a = 2 * (b.region_in / (H * bw) + H * lat + f.pe_overhead);
  double bb =
      (b.flops_fwd + b.flops_bwd) / (H * f.pe_flops) + 2 * b.region_out / bw;
  double c = 2 * lat;
  double worst = 0, prev = INFINITY;
  int fell = 1, rose = 1;
  double w_star = sqrt(bb / c);
  for (int w = 1; w <= 2000; w++) {
    double t = stage_time(&p, &L, 0, 1, w, 0, 0, 0);
    double want = a + bb / w + c * w;
    double rel = fabs(t - want) / want;
    if (rel > worst) worst = rel;
    if (w <= floor(w_star) && !(t < prev)) fell = 0;
    if (w > ceil(w_star) && !(t > prev)) rose = 0;
    prev = t;
  }
  CHECK(worst <= 1e-12,
        "one layer's time on w columns: %.3g from a + b/w + c w", worst);
  CHECK(fell, "the time falls up to w* = %.1f columns", w_star);
  CHECK(rose, "the time rises past w* = %.1f columns: hops dominate", w_star);
  int64_t fast = units_fastest(&p, &L, 0, 1);
  CHECK(fast == (int64_t)floor(w_star) || fast == (int64_t)ceil(w_star),
        "the fastest region: %lld columns, closed form %.2f", (long long)fast,
        w_star);
  problem_free(&p);

  /* a plan on the whole mesh keeps the layer's region near its best size
   * instead of spreading it over the wafer */
  st_plan_options opt = {
      .stages = 1, .samples_in_flight = 1, .weight_versions = 1};
  st_plan *plan;
  CHECK(st_plan_build(&plan, &b, 1, &f, &opt, &err) == 0, "%s", err.msg);
  if (plan) {
    double best = INFINITY;
    int64_t best_pes = 0;
    /* every region the layout allows: a w x h for h a divisor of 40 */
    for (int h = 1; h <= 40; h++) {
      if (40 % h) continue;
      for (int w = 1; w <= 2000; w++) {
        double t = 2 * (b.region_in / (h * bw) + b.region_out / (w * bw) +
                        (w + h) * lat + f.pe_overhead) +
                   (b.flops_fwd + b.flops_bwd) / ((double)w * h * f.pe_flops);
        if (t < best) best = t, best_pes = (int64_t)w * h;
      }
    }
    CHECK(fabs(plan->bottleneck_time - best) <= best * 1e-12,
          "the plan's time %.6g s, the best region's %.6g s",
          plan->bottleneck_time, best);
    CHECK(plan->stages[0].pes < f.pes / 10,
          "the region stops growing: %lld of %lld PEs (the best region has "
          "%lld)",
          (long long)plan->stages[0].pes, (long long)f.pes,
          (long long)best_pes);
    st_plan_destroy(plan);
  }
}

/* Four equal layers, four stages, a mesh with room to spare: equal
 * regions. */
static void test_equal_layers(void) {
  st_fabric f = mesh(400, 100);
  st_block_cost b[4];
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof name, "l%d", i);
    b[i] = linear_block(name, 512, 512);
  }
  st_plan_options opt = {
      .stages = 4, .samples_in_flight = 1, .weight_versions = 1};
  st_plan *p;
  st_error err = {0};
  CHECK(st_plan_build(&p, b, 4, &f, &opt, &err) == 0, "%s", err.msg);
  if (!p) return;
  int same = 1;
  for (int s = 1; s < 4; s++)
    same &=
        p->stages[s].w == p->stages[0].w && p->stages[s].h == p->stages[0].h;
  CHECK(same, "equal layers, equal regions: %dx%d %dx%d %dx%d %dx%d",
        p->stages[0].w, p->stages[0].h, p->stages[1].w, p->stages[1].h,
        p->stages[2].w, p->stages[2].h, p->stages[3].w, p->stages[3].h);
  CHECK(p->stages[0].time == p->stages[3].time, "and equal times");
  st_plan_destroy(p);
}

/* A layer whose weights, gradient and state need more PEs than its time
 * would: its region holds them, and it is named memory-bound. */
static void test_memory_region(void) {
  st_fabric f = mesh(600, 60);
  st_block_cost b[2] = {linear_block("small", 256, 256),
                        linear_block("wide", 4096, 4096)};
  b[1].flops_fwd = b[1].flops_bwd = 1e3; /* cheap to run, big to hold */
  st_plan_options opt = {
      .stages = 2, .samples_in_flight = 2, .weight_versions = 1};
  st_plan *p;
  st_error err = {0};
  CHECK(st_plan_build(&p, b, 2, &f, &opt, &err) == 0, "%s", err.msg);
  if (!p) return;
  const st_plan_stage *w = &p->stages[1];
  double need = b[1].param_bytes + b[1].state_bytes +
                2 * (b[1].in_bytes + b[1].act_bytes);
  CHECK(fabs(w->mem_total - need) <= need * 1e-12, "held %.6g, want %.6g",
        w->mem_total, need);
  CHECK((double)w->pes * f.pe_memory >= need,
        "the wide layer's region holds it: %lld PEs x %g B >= %.6g B",
        (long long)w->pes, f.pe_memory, need);
  CHECK(w->pes_for_memory >= (int64_t)ceil(need / f.pe_memory),
        "no smaller region is counted as holding it");
  CHECK(!strcmp(w->bound, "memory"), "its bound: %s", w->bound);
  st_plan_destroy(p);
}

/* Compute far faster than I/O: the plan runs at the I/O's rate. */
static void test_io_bound(void) {
  st_fabric f = mesh(200, 100);
  f.pe_flops = 1e15;
  f.hop_latency = 1e-15;
  f.pe_overhead = 1e-15;
  f.link_bandwidth = 1e15;
  f.io_bandwidth = 1e9;
  st_block_cost b[2] = {linear_block("a", 784, 256),
                        linear_block("b", 256, 10)};
  st_plan_options opt = {
      .stages = 0, .samples_in_flight = 1, .weight_versions = 1};
  st_plan *p;
  st_error err = {0};
  CHECK(st_plan_build(&p, b, 2, &f, &opt, &err) == 0, "%s", err.msg);
  if (!p) return;
  double want = 1e9 / (4.0 * 784 + 4);
  CHECK(fabs(p->throughput - want) <= want * 1e-12,
        "throughput %.6g samples/s, the I/O carries %.6g", p->throughput, want);
  CHECK(p->bottleneck_time < 1 / want, "the stages alone would be faster");
  int all = 1;
  for (int s = 0; s < p->n_stages; s++)
    all &= !strcmp(p->stages[s].bound, "I/O");
  CHECK(all, "every stage is bound by I/O");
  /* the rate a schedule gets: the stages' own through the bubble, then
   * the I/O's cap (not the cap through the bubble) */
  double sum = 0;
  for (int s = 0; s < p->n_stages; s++) sum += p->stages[s].time;
  double drained = 1 / sum; /* one micro-batch: through every stage */
  CHECK(drained > want && st_plan_rate(p, 0) == want &&
            st_plan_rate(p, 1) == want,
        "rates %.6g and %.6g, the I/O's %.6g (drained %.6g)",
        st_plan_rate(p, 0), st_plan_rate(p, 1), want, drained);
  st_plan_destroy(p);
  /* a slower fabric, below the I/O: the bubble's rate, uncapped */
  f.pe_flops = 1e6;
  CHECK(st_plan_build(&p, b, 2, &f, &opt, &err) == 0, "%s", err.msg);
  if (!p) return;
  sum = 0;
  for (int s = 0; s < p->n_stages; s++) sum += p->stages[s].time;
  CHECK(fabs(st_plan_rate(p, 0) - 1 / sum) <= 1e-12 / sum && 1 / sum < want,
        "below the I/O: %.9g samples/s, one micro-batch through %d stages "
        "%.9g",
        st_plan_rate(p, 0), p->n_stages, 1 / sum);
  st_plan_destroy(p);
}

/* Weight streaming of L equal blocks in M micro-batches of m against
 *   T = L (M max(m t_f, W / bw) + max(m t_b, W / bw)
 *          + (M - 1) max(m t_b, 2 W / bw)),  rate M m / T:
 * the link carries each way at once; into the fabric the weights for each
 * pass and, after the first micro-batch, the partial gradient W back for
 * the backward to add to; out of it the gradient W. */
static void test_streaming_closed_form(void) {
  enum { L_BLOCKS = 6 };
  st_block_cost b[L_BLOCKS];
  for (int i = 0; i < L_BLOCKS; i++) {
    char name[16];
    snprintf(name, sizeof name, "h.%d", i);
    b[i] = linear_block(name, 2048, 2048);
  }
  for (int regime = 0; regime < 2; regime++) {
    st_fabric f = mesh(100, 80);
    f.io_bandwidth = 1e15;                    /* samples never bound it */
    f.stream_bandwidth = regime ? 1e15 : 1e8; /* streaming, then compute */
    int m = 4;
    st_plan *p;
    st_error err = {0};
    CHECK(st_plan_streaming(&p, b, L_BLOCKS, &f, 16, m, 2, 1, NULL, &err) == 0,
          "%s", err.msg);
    if (!p) continue;
    double tf, tb, in;
    whole_fabric_pass(&b[0], &f, &tf, &tb, &in);
    double T = L_BLOCKS * (4 * fmax(m * tf, in) + fmax(m * tb, in) +
                           3 * fmax(m * tb, 2 * in));
    double want = 16 / T;
    CHECK(fabs(p->throughput - want) <= want * 1e-12,
          "%s-bound: %.9g samples/s, closed form %.9g",
          regime ? "compute" : "stream", p->throughput, want);
    CHECK(!strcmp(p->stages[0].bound, regime ? "communication" : "I/O") ||
              (regime && !strcmp(p->stages[0].bound, "compute")),
          "%s-bound: named %s", regime ? "compute" : "stream",
          p->stages[0].bound);
    CHECK(p->micro_batches == 4 && p->micro_batch == 4,
          "16 / 4 = %d micro-batches of %d", p->micro_batches, p->micro_batch);
    double need =
        m * L_BLOCKS * (b[0].act_bytes + b[0].in_bytes) + 3 * b[0].param_bytes;
    CHECK(fabs(p->stages[0].mem_total - need) <= need * 1e-12,
          "the fabric holds %.6g, want %.6g", p->stages[0].mem_total, need);
    st_plan_destroy(p);
  }
  /* recomputing (keep_activations: false): each backward runs its
   * forward again, and the fabric holds every block's input and one
   * block's activations a sample */
  {
    st_fabric f = mesh(100, 80);
    f.io_bandwidth = f.stream_bandwidth = 1e15;
    int m = 4;
    st_plan *p;
    st_error err = {0};
    CHECK(st_plan_streaming(&p, b, L_BLOCKS, &f, 16, m, 2, 0, NULL, &err) == 0,
          "%s", err.msg);
    if (p) {
      double tf, tb, in;
      whole_fabric_pass(&b[0], &f, &tf, &tb, &in);
      double T = L_BLOCKS * (4 * fmax(m * tf, in) + fmax(m * (tb + tf), in) +
                             3 * fmax(m * (tb + tf), 2 * in));
      CHECK(fabs(p->throughput - 16 / T) <= 16 / T * 1e-12,
            "recomputing: %.9g samples/s, closed form %.9g", p->throughput,
            16 / T);
      double need = m * (L_BLOCKS * b[0].in_bytes + b[0].act_bytes) +
                    3 * b[0].param_bytes;
      CHECK(fabs(p->stages[0].mem_total - need) <= need * 1e-12,
            "recomputing, the fabric holds %.6g, want %.6g",
            p->stages[0].mem_total, need);
      st_plan_destroy(p);
    }
  }
  /* too small a fabric is refused, naming what it needs */
  st_fabric tiny = mesh(10, 10);
  st_plan *p;
  st_error err = {0};
  CHECK(st_plan_streaming(&p, b, L_BLOCKS, &tiny, 16, 4, 2, 1, NULL, &err) ==
                ST_EUNSUPPORTED &&
            strstr(err.msg, "weight streaming does not fit mesh:10x10"),
        "refused: %s", err.msg);
}

static void set(st_config *c, const char *kv) {
  st_error err = {0};
  CHECK(st_config_set(c, kv, &err) == 0, "--set %s: %s", kv, err.msg);
}

/* fc_mnist (3 blocks) in 3 stages at batch 8 in micro-batches of 2. */
static void test_in_flight(void) {
  struct {
    const char *mode, *schedule, *mitigation;
    double flight[3], versions[3];
  } cases[] = {
      {"pipeline", "1f1b", "none", {6, 4, 2}, {1, 1, 1}},
      {"pipeline", "gpipe", "none", {8, 8, 8}, {1, 1, 1}},
      {"pipelined_backprop", "1f1b", "none", {10, 6, 2}, {1, 1, 1}},
      {"pipelined_backprop", "1f1b", "stash", {10, 6, 2}, {5, 3, 1}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    st_config cfg;
    st_error err = {0};
    st_config_defaults(&cfg);
    CHECK(st_config_load(&cfg, "configs/fc_mnist.yaml", &err) == 0, "%s",
          err.msg);
    char kv[96];
    snprintf(kv, sizeof kv, "execution.mode=%s", cases[k].mode);
    set(&cfg, kv);
    snprintf(kv, sizeof kv, "execution.schedule=%s", cases[k].schedule);
    set(&cfg, kv);
    snprintf(kv, sizeof kv, "execution.mitigation=%s", cases[k].mitigation);
    set(&cfg, kv);
    set(&cfg, "train.batch=8");
    set(&cfg, "execution.micro_batch=2");
    set(&cfg, "execution.stages=3");
    set(&cfg, "fabric.cores=3");
    st_plan *p;
    CHECK(st_plan_compile(&p, &cfg, 0, &err) == 0, "%s", err.msg);
    if (!p) continue;
    for (int s = 0; s < 3 && s < p->n_stages; s++) {
      const st_plan_stage *st = &p->stages[s];
      double acts = p->blocks[st->first].in_bytes;
      for (int b = st->first; b < st->first + st->count; b++)
        acts += p->blocks[b].act_bytes;
      CHECK(st->in_flight == cases[k].flight[s] &&
                st->versions == cases[k].versions[s] &&
                fabs(st->mem_acts - st->in_flight * acts) <=
                    1e-9 * st->mem_acts,
            "%s %s %s stage %d: %g in flight, %g versions (want %g, %g)",
            cases[k].mode, cases[k].schedule, cases[k].mitigation, s,
            st->in_flight, st->versions, cases[k].flight[s],
            cases[k].versions[s]);
    }
    st_plan_destroy(p);
  }
}

/* The links two consecutive regions share, by hand from their
 * rectangles: side by side, the rows both span; one above the other (a
 * band turn), the columns both cover. */
static double shared_links(const st_plan_stage *a, const st_plan_stage *b) {
  int side = a->x + a->w == b->x || b->x + b->w == a->x;
  int lo = side ? (a->y > b->y ? a->y : b->y) : (a->x > b->x ? a->x : b->x);
  int hi = side ? (a->y + a->h < b->y + b->h ? a->y + a->h : b->y + b->h)
                : (a->x + a->w < b->x + b->w ? a->x + a->w : b->x + b->w);
  return hi - lo;
}

/* A stage hands its output on and its input's gradient back over the
 * links its region shares with its neighbour's, no more: fc_mnist at one
 * sample in 3 stages on a 2 x 8 mesh of 1 MB/s links (the reviewer's
 * case). Its stages had been laid out in bands of 4 rows with stage 1
 * below stage 0 at a band turn sharing one column, each 1,024-byte
 * hand-off charged 4 links (256 us where one link takes 1,024); every
 * stage's communication is, by hand, its region's traffic (2 passes of
 * its layers' inputs over its height, outputs over its width, w + h hops
 * each) plus each hand-off over the links it shares. */
static void test_band_turn(void) {
  st_config cfg;
  st_error err = {0};
  st_config_defaults(&cfg);
  CHECK(st_config_load(&cfg, "configs/fc_mnist.yaml", &err) == 0, "%s",
        err.msg);
  const char *sets[] = {
      "execution.mode=pipeline",  "execution.micro_batch=1",
      "fabric.kind=mesh",         "fabric.width=2",
      "fabric.height=8",          "fabric.pe_memory=100000000",
      "fabric.link_bandwidth=1e6"};
  for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) set(&cfg, sets[k]);
  st_plan *p = NULL;
  CHECK(st_plan_compile(&p, &cfg, 3, &err) == 0, "%s", err.msg);
  if (!p) return;
  const st_fabric *f = &p->fabric;
  double bw = f->link_bandwidth;
  for (int s = 0; s < p->n_stages; s++) {
    const st_plan_stage *st = &p->stages[s];
    double want = 0;
    for (int b = st->first; b < st->first + st->count; b++) {
      const st_block_cost *c = &p->blocks[b];
      want += 2 * (c->region_in / (st->h * bw) + c->region_out / (st->w * bw) +
                   c->region_layers * (st->w + st->h) * f->hop_latency);
    }
    if (s > 0)
      want += p->blocks[st->first].in_bytes / (shared_links(st - 1, st) * bw);
    if (s + 1 < p->n_stages)
      want += p->blocks[st->first + st->count - 1].out_bytes /
              (shared_links(st, st + 1) * bw);
    /* 1e-12: the same few terms in another order */
    CHECK(fabs(st->time_comm - want) <= 1e-12 * want,
          "stage %d at %dx%d@%d,%d: %.9g s communicating, by hand %.9g", s,
          st->w, st->h, st->x, st->y, st->time_comm, want);
  }
  st_plan_destroy(p);
}

/* A PE's SRAM bounds it as a cpu's DRAM does (docs/compiler.md, "Memory
 * bandwidth"): pb_mlp_fmnist at one sample (pipelined backprop) on a
 * 64 x 64 mesh whose compute and links are made near free reads each
 * weight at least once a sample, so no plan passes the fabric's memory
 * bandwidth over the weights' bytes, 4 x its parameters, samples a second.
 * The SRAM's bandwidth was recorded and never used: that plan ran at
 * 1e18 FLOP/s a PE. At half the bandwidth the rate halves (the bound
 * binds, and the stages say so); at a WSE-2 PE's 2.2 GFLOP/s, compute
 * binds as before. */
static void test_sram_bandwidth(void) {
  double rate[2] = {0, 0}, had[2] = {0, 0};
  for (int k = 0; k < 3; k++) {
    st_config cfg;
    st_error err = {0};
    st_config_defaults(&cfg);
    CHECK(st_config_load(&cfg, "configs/pb_mlp_fmnist.yaml", &err) == 0, "%s",
          err.msg);
    CHECK(st_fabric_parse(&cfg, "mesh:64x64", &err) == 0, "%s", err.msg);
    if (k < 2) {
      const char *fast[] = {
          "fabric.pe_flops=1e18", "fabric.link_bandwidth=1e18",
          "fabric.hop_latency=1e-18", "fabric.pe_overhead=1e-18",
          "fabric.io_bandwidth=1e18"};
      for (size_t i = 0; i < sizeof fast / sizeof *fast; i++)
        set(&cfg, fast[i]);
    }
    /* a WSE-2 PE's share of 20 PB/s, all 4,096 PEs together; then half */
    double bw = 20e15 / 850000 * 4096 / (k == 1 ? 2 : 1);
    if (k == 1) {
      char b[64];
      snprintf(b, sizeof b, "fabric.memory_bandwidth=%.17g", bw);
      set(&cfg, b);
    }
    st_plan *p = NULL;
    int rc = st_plan_compile(&p, &cfg, 0, &err);
    CHECK(rc == 0, "sram %d: %s", k, err.msg);
    if (rc) continue;
    double params = 0;
    for (int b = 0; b < p->n_blocks; b++) params += p->blocks[b].param_bytes;
    /* 1e-7: the key is a float */
    CHECK(fabs(p->fabric.memory_bandwidth - bw) <= 1e-7 * bw,
          "sram %d: memory bandwidth %g, want %g", k,
          p->fabric.memory_bandwidth, bw);
    if (k < 2) {
      rate[k] = p->throughput;
      had[k] = p->fabric.memory_bandwidth;
      CHECK(p->throughput <= p->fabric.memory_bandwidth / params,
            "sram %d: %.4g samples/s past the SRAM's %.4g B/s over %.4g B of "
            "weights a sample",
            k, p->throughput, p->fabric.memory_bandwidth, params);
      CHECK(!strcmp(p->stages[p->bottleneck].bound, "memory bandwidth"),
            "sram %d: the bottleneck bound by '%s'", k,
            p->stages[p->bottleneck].bound);
    } else {
      for (int s = 0; s < p->n_stages; s++)
        CHECK(strcmp(p->stages[s].bound, "memory bandwidth") != 0,
              "a WSE-2 PE's rate: stage %d bound by its memory bandwidth", s);
    }
    st_plan_destroy(p);
  }
  double want = rate[0] * had[1] / (had[0] > 0 ? had[0] : 1);
  /* 1e-6: the near-free links' and overheads' femtoseconds beside it */
  CHECK(fabs(rate[1] - want) <= 1e-6 * want,
        "at half the SRAM's bandwidth %.9g samples/s, want %.9g (half of "
        "%.9g)",
        rate[1], want, rate[0]);
}

/* The band heights a mesh is tried at are every divisor of its height,
 * largest first (docs/compiler.md): against a loop over every height up to
 * 3000, and, for heights too large to loop over, against the divisor count
 * from the factorisation (720720 has 240 divisors, 2095133040 the most an
 * int has, 1600), each a divisor and strictly falling. */
static void test_band_heights(void) {
  static int got[ST_MAX_BAND_HEIGHTS];
  for (int h = 1; h <= 3000; h++) {
    int n = st_band_heights(h, got), k = 0, ok = 1;
    for (int d = h; d >= 1; d--)
      if (h % d == 0) ok &= k < n && got[k++] == d;
    CHECK(ok && k == n, "height %d: %d band heights, not its divisors", h, n);
  }
  static const int big[] = {720720, 1000000000, 2095133040, 2147483647,
                            2147483646};
  for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
    int h = big[i], n = st_band_heights(h, got), want = 1, ok = 1;
    for (int64_t q = h, p = 2; q > 1; p++) {
      if (p * p > q) p = q; /* what is left is prime */
      int e = 0;
      while (q % p == 0) q /= p, e++;
      want *= e + 1;
    }
    for (int k = 0; k < n; k++)
      ok &= h % got[k] == 0 && (k == 0 || got[k] < got[k - 1]);
    CHECK(ok && n == want && got[0] == h && got[n - 1] == 1,
          "height %d: %d band heights, want its %d divisors", h, n, want);
  }
}

/* Every published config at its published batch on four fabrics: a plan
 * that fits, by a mode the chooser names. The cpu's memory is fixed here
 * (24 GB in all) so that the answer does not depend on the test machine. */
static void test_published(void) {
  static const char *const configs[] = {
      "configs/gpt2_124m.yaml", "configs/gpt3_xl_1.3b.yaml",
      "configs/gptj_6b.yaml", "configs/gpt3_13b.yaml",
      "configs/gpt_neox_20b.yaml"};
  static const char *const fabrics[] = {"cpu:16", "cpu:64", "mesh:757x996",
                                        "wse2"};
  for (int c = 0; c < 5; c++)
    for (int k = 0; k < 4; k++) {
      st_config cfg;
      st_error err = {0};
      st_config_defaults(&cfg);
      CHECK(st_config_load(&cfg, configs[c], &err) == 0, "%s", err.msg);
      CHECK(st_fabric_parse(&cfg, fabrics[k], &err) == 0, "%s", err.msg);
      if (k < 2)
        set(&cfg,
            k ? "fabric.pe_memory=375000000" : "fabric.pe_memory=1500000000");
      int batch = cfg.train.batch;
      st_plan *p = NULL;
      int rc = st_plan_choose(&p, &cfg, 0, NULL, NULL, &err);
      CHECK(rc == 0, "%s on %s: %s", configs[c], fabrics[k], err.msg);
      if (!p) continue;
      int fits = 1;
      for (int s = 0; s < p->n_stages; s++)
        fits &= p->stages[s].mem_total <= p->stages[s].mem_capacity;
      double held = 0;
      for (int s = 0; s < p->n_stages; s++) held += p->stages[s].mem_total;
      CHECK(fits && held <= (double)p->fabric.pes * p->fabric.pe_memory,
            "%s on %s: the plan holds %.4g B", configs[c], fabrics[k], held);
      CHECK(p->batch == batch && p->micro_batch * p->micro_batches == batch,
            "%s on %s: batch %d as %d x %d", configs[c], fabrics[k], p->batch,
            p->micro_batches, p->micro_batch);
      CHECK(strstr(p->mode_why, "it fits") != NULL, "%s on %s: why: %s",
            configs[c], fabrics[k], p->mode_why);
      CHECK(p->throughput > 0 && isfinite(p->throughput),
            "%s on %s: throughput %g", configs[c], fabrics[k], p->throughput);
      /* on the meshes, the published line: layer-pipelined below about a
       * billion parameters, weight streaming above (seeds/004) */
      if (k >= 2)
        CHECK(!strcmp(p->mode, c ? "weight_streaming" : "pipeline"),
              "%s on %s: mode %s", configs[c], fabrics[k], p->mode);
      st_plan_destroy(p);
    }
  /* either side of the line at GPT-3's context: Large (760M: XL's shape at
   * width 1536) layer-pipelined, XL (1.3B) by weight streaming */
  for (int w = 0; w < 2; w++) {
    st_config cfg;
    st_error err = {0};
    st_config_defaults(&cfg);
    CHECK(st_config_load(&cfg, "configs/gpt3_xl_1.3b.yaml", &err) == 0, "%s",
          err.msg);
    CHECK(st_fabric_parse(&cfg, "wse2", &err) == 0, "%s", err.msg);
    if (!w) set(&cfg, "model.width=1536");
    st_plan *p = NULL;
    CHECK(st_plan_choose(&p, &cfg, 0, NULL, NULL, &err) == 0, "%s", err.msg);
    CHECK(p && !strcmp(p->mode, w ? "weight_streaming" : "pipeline"),
          "GPT-3 %s on wse2: mode %s", w ? "XL" : "Large", p ? p->mode : "-");
    st_plan_destroy(p);
    if (!w) continue;
    /* XL forced layer-pipelined: refused, with the mode that fits named */
    p = NULL;
    int rc = st_plan_choose(&p, &cfg, 0, "pipeline", NULL, &err);
    CHECK(rc == ST_EUNSUPPORTED && !p &&
              strstr(err.msg, "the forced mode does not fit wse2 (without "
                              "--mode it fits by weight streaming") &&
              strstr(err.msg, "short by"),
          "XL forced to a pipeline on wse2: rc %d %s", rc, err.msg);
    st_plan_destroy(p);
  }
  /* a mesh too small for any mode: refused, the smallest square mesh that
   * holds the model by weight streaming named, and that one does */
  st_config cfg;
  st_error err = {0};
  st_config_defaults(&cfg);
  CHECK(st_config_load(&cfg, "configs/gpt_neox_20b.yaml", &err) == 0, "%s",
        err.msg);
  CHECK(st_fabric_parse(&cfg, "mesh:300x300", &err) == 0, "%s", err.msg);
  st_plan *p = NULL;
  int rc = st_plan_choose(&p, &cfg, 0, NULL, NULL, &err);
  const char *named = strstr(err.msg, "would hold it is mesh:");
  CHECK(rc == ST_EUNSUPPORTED && named, "refused: %s", err.msg);
  int side = 0;
  if (named && sscanf(named, "would hold it is mesh:%d", &side) == 1) {
    char spec[48];
    snprintf(spec, sizeof spec, "mesh:%dx%d", side, side);
    st_fabric_parse(&cfg, spec, &err);
    CHECK(st_plan_choose(&p, &cfg, 0, NULL, NULL, &err) == 0, "%s holds it: %s",
          spec, err.msg);
    st_plan_destroy(p);
    snprintf(spec, sizeof spec, "mesh:%dx%d", side - 1, side - 1);
    st_fabric_parse(&cfg, spec, &err);
    p = NULL;
    CHECK(st_plan_choose(&p, &cfg, 0, NULL, NULL, &err) == ST_EUNSUPPORTED,
          "%s is too small", spec);
    st_plan_destroy(p);
  }
}

int main(void) {
  setenv("STRATA_CALIBRATION", "none", 1);
  test_region_grows();
  test_equal_layers();
  test_memory_region();
  test_io_bound();
  test_streaming_closed_form();
  test_in_flight();
  test_band_turn();
  test_band_heights();
  test_sram_bandwidth();
  test_published();
  TH_DONE();
}
