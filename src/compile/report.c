/*
 * report.c — pass 5: the plan for people and for programs.
 *
 *   st_plan_print       the text report: the fabric and where its figures
 *                       come from, why this many stages, one row per stage
 *                       (blocks, PEs, predicted forward/backward/comm time per
 *                       sample, memory held / capacity) with its cause, and
 *                       the plan-wide throughput, bottleneck and utilization
 *   st_plan_write_json  the same, machine-readable (DIR/plan.json)
 *   st_plan_write_svg   the map (DIR/plan.svg): the fabric with each stage's
 *                       region coloured and labelled in pipeline order
 * Files are written atomically (st_write_file_atomic).
 */
#include "compile.h"
#include "../io/svg.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------- formatting */

const char *st_plan_fmt_count(char *buf, size_t cap, double v) {
  char digits[48];
  snprintf(digits, sizeof digits, "%.0f", v);
  size_t n = strlen(digits), o = 0;
  for (size_t i = 0; i < n && o + 2 < cap; i++) {
    if (i && digits[i - 1] != '-' && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = '\0';
  return buf;
}

/* A rate (samples/s) as a count, or to three significant digits below 100:
 * a 20B-parameter model on a cpu trains well under one sample a second. */
const char *st_plan_fmt_rate(char *buf, size_t cap, double v) {
  if (v < 99.5 && v > -99.5)
    snprintf(buf, cap, "%.3g", v);
  else
    st_plan_fmt_count(buf, cap, v);
  return buf;
}

const char *st_plan_fmt_bytes(char *buf, size_t cap, double b) {
  static const char *unit[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (b >= 999.5 && u < 6) b /= 1000, u++;
  snprintf(buf, cap, u ? "%.3g %s" : "%.0f %s", b, unit[u]);
  return buf;
}

const char *st_plan_fmt_time(char *buf, size_t cap, double s) {
  if (!(s < INFINITY))
    snprintf(buf, cap, "inf");
  else if (s == 0)
    snprintf(buf, cap, "0");
  /* the next unit from where %.3g rounds to 1000 of this one (0.9997 s
   * is "1 s", not "1e+03 ms"); past 999.5 s whole seconds */
  else if (s >= 999.5)
    snprintf(buf, cap, "%.0f s", s);
  else if (s >= 0.9995)
    snprintf(buf, cap, "%.3g s", s);
  else if (s >= 0.9995e-3)
    snprintf(buf, cap, "%.3g ms", s * 1e3);
  else if (s >= 0.9995e-6)
    snprintf(buf, cap, "%.3g us", s * 1e6);
  else
    snprintf(buf, cap, "%.3g ns", s * 1e9);
  return buf;
}

/* v with an SI prefix, to three significant digits ("51.2 k", "90 G"):
 * the unit follows. A figure that rounds to 1000 takes the next prefix. */
static const char *rate_text(char *buf, size_t cap, double v) {
  static const char *prefix[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (v >= 999.5 && u < 5) v /= 1000, u++;
  snprintf(buf, cap, "%.3g %s", v, prefix[u]);
  return buf;
}

/* "blocks.0-2" for blocks.0 .. blocks.2 (names sharing a prefix), else the
 * first and last names. */
static const char *blocks_text(char *buf, size_t cap, const st_plan *p,
                               const st_plan_stage *s) {
  const char *a = p->blocks[s->first].name;
  const char *b = p->blocks[s->first + s->count - 1].name;
  if (s->count == 1) {
    snprintf(buf, cap, "%s", a);
    return buf;
  }
  const char *dot_a = strrchr(a, '.'), *dot_b = strrchr(b, '.');
  if (dot_a && dot_b && dot_a - a == dot_b - b &&
      strncmp(a, b, (size_t)(dot_a - a)) == 0)
    snprintf(buf, cap, "%s-%s", a, dot_b + 1);
  else
    snprintf(buf, cap, "%s..%s", a, b);
  return buf;
}

/* Where a stage sits: "cores 0-5" on a cpu, "425x850 at (0,0)" on a mesh. */
static const char *where_text(char *buf, size_t cap, const st_plan *p,
                              const st_plan_stage *s) {
  if (p->fabric.kind == ST_FABRIC_CPU) {
    if (s->w == 1)
      snprintf(buf, cap, "%d", s->x);
    else
      snprintf(buf, cap, "%d-%d", s->x, s->x + s->w - 1);
  } else {
    snprintf(buf, cap, "%dx%d@%d,%d", s->w, s->h, s->x, s->y);
  }
  return buf;
}

static double total_flops(const st_plan *p) {
  double f = 0;
  for (int i = 0; i < p->n_blocks; i++)
    f += p->blocks[i].flops_fwd + p->blocks[i].flops_bwd;
  return f;
}

/* ------------------------------------------------------------- text */

void st_plan_print(const st_plan *p, FILE *f) {
  const st_fabric *fb = &p->fabric;
  int cpu = fb->kind == ST_FABRIC_CPU;
  const char *word = cpu ? "cores" : "PEs";
  char a[48], b[48], c[48], d[48], e[48];
  fprintf(f, "plan: %s on %s: %d blocks in %d stage%s\n",
          p->model[0] ? p->model : "(model)", fb->name, p->n_blocks,
          p->n_stages, p->n_stages == 1 ? "" : "s");
  fprintf(f, "fabric: %dx%d = %s %s; %sFLOP/s, %s each", fb->width, fb->height,
          st_plan_fmt_count(a, sizeof a, (double)fb->pes), word,
          rate_text(b, sizeof b, fb->pe_flops),
          st_plan_fmt_bytes(c, sizeof c, fb->pe_memory));
  if (fb->pe_reserved > 0)
    fprintf(f, " for tensors (of %s)",
            st_plan_fmt_bytes(d, sizeof d, fb->pe_memory + fb->pe_reserved));
  fprintf(f, "; ");
  if (cpu)
    fprintf(f,
            "stage copy %s/s; e(c) = 1/(1 + %g (c - 1)); memory %s/s (%s) "
            "past a %s cache, shared by the cores\n",
            st_plan_fmt_bytes(d, sizeof d, fb->link_bandwidth),
            fb->efficiency_slope,
            st_plan_fmt_bytes(e, sizeof e, fb->memory_bandwidth),
            fb->memory_bandwidth_source[0] ? fb->memory_bandwidth_source
                                           : "default",
            st_plan_fmt_bytes(a, sizeof a, fb->cache_bytes));
  else
    fprintf(
        f, "link %s/s one way; memory %s/s each (%s); e(c) = 1\n",
        st_plan_fmt_bytes(d, sizeof d, fb->link_bandwidth),
        st_plan_fmt_bytes(e, sizeof e, fb->memory_bandwidth / (double)fb->pes),
        fb->memory_bandwidth_source[0] ? fb->memory_bandwidth_source
                                       : "default");
  fprintf(f, "  figures: %s\n", fb->source);
  if (fb->bf16 == ST_PRODUCTS_BF16_AS_FP32)
    fprintf(f,
            "  train.precision bf16: %s, so its products are timed at "
            "fp32's rates (`strata bench --calibrate` measures bf16's)\n",
            fb->calibrated ? "the calibration profile has no bf16 rates"
                           : "no calibration profile");
  if (fb->calibrated) {
    fprintf(f,
            "  calibrated %s: GEMM %.3g/%.3g/%.3g/%.3g GFLOP/s per core (tiny/"
            "small/medium/large%s); one-thread ops %.3g/%.3g/%.3g/%.3g/%.3g "
            "GB/s (pointwise/norm/pool/optimizer/gelu)\n",
            fb->calibrated_at, fb->gemm_rate[0] / 1e9, fb->gemm_rate[1] / 1e9,
            fb->gemm_rate[2] / 1e9, fb->gemm_rate[3] / 1e9,
            fb->bf16 == ST_PRODUCTS_BF16 ? "; bf16" : "",
            fb->op_bandwidth[0] / 1e9, fb->op_bandwidth[1] / 1e9,
            fb->op_bandwidth[2] / 1e9, fb->op_bandwidth[3] / 1e9,
            fb->op_bandwidth[4] / 1e9);
    if (fb->bf16 == ST_PRODUCTS_BF16 &&
        fb->gemm_slope_bf16[ST_GEMM_CLASSES - 1] >= 0)
      fprintf(f,
              "    bf16's linear products over c cores: e(c) = 1/(1 + s (c - "
              "1)), s = "
              "%.3g/%.3g/%.3g/%.3g by class as measured (fp32's %.3g where "
              "that is more)\n",
              fb->gemm_slope_bf16[0], fb->gemm_slope_bf16[1],
              fb->gemm_slope_bf16[2], fb->gemm_slope_bf16[3],
              fb->efficiency_slope);
    if (fb->conv_rate[0][0] > 0)
      fprintf(f,
              "    conv2d %.3g/%.3g/%.3g/%.3g forward, %.3g/%.3g/%.3g/%.3g "
              "backward; attention %.3g/%.3g/%.3g/%.3g forward, "
              "%.3g/%.3g/%.3g/%.3g backward GFLOP/s per core\n",
              fb->conv_rate[0][0] / 1e9, fb->conv_rate[0][1] / 1e9,
              fb->conv_rate[0][2] / 1e9, fb->conv_rate[0][3] / 1e9,
              fb->conv_rate[1][0] / 1e9, fb->conv_rate[1][1] / 1e9,
              fb->conv_rate[1][2] / 1e9, fb->conv_rate[1][3] / 1e9,
              fb->attention_rate[0][0] / 1e9, fb->attention_rate[0][1] / 1e9,
              fb->attention_rate[0][2] / 1e9, fb->attention_rate[0][3] / 1e9,
              fb->attention_rate[1][0] / 1e9, fb->attention_rate[1][1] / 1e9,
              fb->attention_rate[1][2] / 1e9, fb->attention_rate[1][3] / 1e9);
    if (fb->narrow_cost > 0 || fb->n_spill > 0)
      fprintf(
          f,
          "    linear layers, per layer step: narrow (r < %3$g rows) "
          "(1 - r/%3$g) x %1$.3g us per MB of weights past L2 (%2$s); "
          "from memory %4$.3g us per MB of weights, the share by "
          "working set calibrated up to %5$s\n",
          fb->narrow_cost * 1048576.0 * 1e6,
          st_plan_fmt_bytes(a, sizeof a, fb->l2_bytes),
          (double)ST_GEMM_REF_ROWS, fb->spill_cost * 1048576.0 * 1e6,
          st_plan_fmt_bytes(b, sizeof b,
                            fb->n_spill ? fb->spill_ws[fb->n_spill - 1] : 0));
    if (fb->narrow_flop_cost > 0)
      fprintf(f,
              "    linear layers at r < %g rows, from L2 too: (1 - r/%g) x "
              "%.3g us per MFLOP beside the class rate\n",
              (double)ST_GEMM_REF_ROWS, (double)ST_GEMM_REF_ROWS,
              fb->narrow_flop_cost * 1e12);
    if (fb->n_row_step >= 2) {
      char a[32], b[32];
      fprintf(
          f,
          "    linear layers at one row (the layer step): %.3g GB/s of "
          "weights streamed per core with %s touched a step, down to "
          "%.3g at %s\n",
          fb->row_step_rate[0] / 1e9,
          st_plan_fmt_bytes(a, sizeof a, fb->row_step_ws[0]),
          fb->row_step_rate[fb->n_row_step - 1] / 1e9,
          st_plan_fmt_bytes(b, sizeof b, fb->row_step_ws[fb->n_row_step - 1]));
      if (fb->n_rank_one >= 2)
        fprintf(f,
                "    and where their gradient accumulates (rank one): %.3g "
                "GB/s with %s touched, down to %.3g at %s\n",
                fb->rank_one_rate[0] / 1e9,
                st_plan_fmt_bytes(a, sizeof a, fb->rank_one_ws[0]),
                fb->rank_one_rate[fb->n_rank_one - 1] / 1e9,
                st_plan_fmt_bytes(b, sizeof b,
                                  fb->rank_one_ws[fb->n_rank_one - 1]));
    } else if (fb->row_bandwidth > 0)
      fprintf(f,
              "    linear layers at one row (matrix-vector, rank one): "
              "%.3g GB/s of weights streamed per core\n",
              fb->row_bandwidth / 1e9);
  } else if (fb->estimated && cpu)
    fprintf(f, "  uncalibrated: predictions are built-in estimates; run "
               "`strata bench --calibrate` to measure this machine\n");
  if (p->n_blocks > 0 &&
      (p->blocks[0].measured_fwd > 0 || p->blocks[0].measured_bwd > 0))
    fprintf(f, "  block costs: measured (execution.block_costs): each "
               "block's forward and backward with its update timed here on "
               "one core, in place of the modelled terms\n");
  double lwp_bytes = 0, lwp_s = 0;
  for (int i = 0; i < p->n_blocks; i++)
    lwp_bytes += p->blocks[i].lwp_bytes, lwp_s += p->blocks[i].measured_lwp;
  if (lwp_bytes > 0 || lwp_s > 0)
    fprintf(f,
            "  weight prediction (execution.mitigation): every stage "
            "but the last also writes its forward's predicted weights, "
            "%s a sample over all the blocks%s\n",
            lwp_s > 0 ? st_plan_fmt_time(a, sizeof a, lwp_s)
                      : st_plan_fmt_bytes(a, sizeof a, lwp_bytes),
            lwp_s > 0              ? " (measured)"
            : p->fabric.calibrated ? ", at the update's bandwidth"
                                   : " (not priced: uncalibrated)");
  if (!cpu)
    fprintf(f,
            "  mesh: a hop %s, %s a layer per PE and pass; I/O %s/s each "
            "way%s\n",
            st_plan_fmt_time(a, sizeof a, fb->hop_latency),
            st_plan_fmt_time(b, sizeof b, fb->pe_overhead),
            st_plan_fmt_bytes(c, sizeof c, fb->io_bandwidth),
            strcmp(p->mode, "weight_streaming") ? ""
                                                : ", weights streamed over it");
  if (p->mode_why[0]) fprintf(f, "mode: %s\n", p->mode_why);
  int varies =
      p->n_stages > 1 &&
      (p->stages[0].in_flight != p->stages[p->n_stages - 1].in_flight ||
       p->stages[0].versions != p->stages[p->n_stages - 1].versions);
  if (varies)
    fprintf(f,
            "model: %sFLOP per sample (fwd+bwd); stage s holds its weights x "
            "its versions + gradient and optimizer state + (input + "
            "activations) x its samples in flight, as %s keeps them (stage "
            "0: %g, last: %g; weight versions %g, last %g)\n",
            rate_text(a, sizeof a, total_flops(p)),
            !strcmp(p->mode, "pipelined_backprop") ? "pipelined backprop"
                                                   : p->schedule,
            p->stages[0].in_flight, p->stages[p->n_stages - 1].in_flight,
            p->stages[0].versions, p->stages[p->n_stages - 1].versions);
  else
    fprintf(f,
            "model: %sFLOP per sample (fwd+bwd); every stage holds its "
            "weights x %g + gradient and optimizer state + (input + "
            "activations) x %g samples in flight\n",
            rate_text(a, sizeof a, total_flops(p)),
            p->n_stages ? p->stages[0].versions : 1,
            p->n_stages ? p->stages[0].in_flight : 0);
  fprintf(f, "why %d stage%s: %s\n\n", p->n_stages, p->n_stages == 1 ? "" : "s",
          p->cause);
  fprintf(f, "%5s  %-16s %-18s %9s %9s %9s %9s  %-16s %s\n", "stage", "blocks",
          cpu ? "cores" : "PEs (WxH@x,y)", "fwd", "bwd", "comm", "total",
          "bound", "memory held / capacity");
  for (int s = 0; s < p->n_stages; s++) {
    const st_plan_stage *st = &p->stages[s];
    char bl[64], wh[48], t[4][24];
    fprintf(f, "%5d  %-16s %-18s %9s %9s %9s %9s  %-16s %s / %s%s\n", s,
            blocks_text(bl, sizeof bl, p, st), where_text(wh, sizeof wh, p, st),
            st_plan_fmt_time(t[0], 24, st->time_fwd),
            st_plan_fmt_time(t[1], 24, st->time_bwd),
            st_plan_fmt_time(t[2], 24, st->time_comm),
            st_plan_fmt_time(t[3], 24, st->time), st->bound,
            st_plan_fmt_bytes(a, sizeof a, st->mem_total),
            st_plan_fmt_bytes(b, sizeof b, st->mem_capacity),
            s == p->bottleneck ? "  <- bottleneck" : "");
    fprintf(f, "       why: %s\n", st->cause);
    if (st->spill > 0)
      fprintf(f,
              "       cache: a micro-batch touches %s here; its weights "
              "pay %.0f%% of their calibrated time from memory\n",
              st_plan_fmt_bytes(a, sizeof a, st->working_set), 100 * st->spill);
  }
  fprintf(f,
          "\nthroughput: %s samples/s in steady state; bottleneck stage "
          "%d at %s per sample; balance %.2f (mean stage time / "
          "bottleneck)\n",
          st_plan_fmt_rate(a, sizeof a, p->throughput), p->bottleneck,
          st_plan_fmt_time(b, sizeof b, p->bottleneck_time), p->balance);
  if (p->replicas > 1) {
    double w = 0;
    for (int i = 0; i < p->n_blocks; i++) w += p->blocks[i].param_bytes;
    fprintf(f,
            "replicas: %d at once (execution.replicas), each on %s %s of "
            "its own with %d of the batch's %d samples a step: the stages "
            "above are one replica's, their memory all %d copies' %s%s; "
            "the slabs' sum a step moves %s at %s/s%s, %s a sample -> %s "
            "samples/s\n",
            p->replicas, st_plan_fmt_count(c, sizeof c, (double)p->replica_pes),
            word, p->batch, p->global_batch, p->replicas,
            cpu ? "(each its own gradient slab, activations and workspace; the "
                  "weights and optimizer state shared) as one process holds "
                  "them"
                : "(each strip its own weights, optimizer state, gradient "
                  "slab, activations and workspace, in its PEs' memory)",
            p->ranks > 1 ? " (over ranks each rank holds its own: below)" : "",
            st_plan_fmt_bytes(
                a, sizeof a, 2.0 * (cpu ? p->replicas : p->replicas - 1.0) * w),
            st_plan_fmt_bytes(b, sizeof b,
                              cpu ? fb->memory_bandwidth
                                  : fb->height * fb->link_bandwidth),
            cpu ? " of memory"
                : " across the strips' edges and the sum back to each",
            st_plan_fmt_time(d, sizeof d, p->reduce_time),
            st_plan_fmt_rate(
                e, sizeof e,
                st_plan_rate(p, !strcmp(p->mode, "pipelined_backprop"))));
  }
  if (p->io_rate > 0)
    fprintf(f, "I/O: the fabric carries %s samples/s in (input and labels)%s\n",
            st_plan_fmt_rate(a, sizeof a, p->io_rate),
            p->io_rate <= p->throughput ? ": it bounds the throughput"
                                        : ", above the stages' rate");
  if (!strcmp(p->mode, "weight_streaming") && p->n_stages == 1) {
    int cpu_ws = p->fabric.kind == ST_FABRIC_CPU;
    fprintf(f,
            "weight streaming: %s a sample computing, %s a sample on the "
            "store's %s (weights in, gradients out%s%s)",
            st_plan_fmt_time(a, sizeof a, p->ws_compute),
            st_plan_fmt_time(b, sizeof b, p->ws_stream),
            cpu_ws ? "channel, one way at a time" : "link, each way at once",
            p->micro_batches > 1 ? " and back" : "",
            cpu_ws ? ", the update" : "; the update in the store");
    if (p->ws_disk > 0)
      fprintf(f, "; its disk %s a sample at %s/s (%s)",
              st_plan_fmt_time(c, sizeof c, p->ws_disk),
              st_plan_fmt_bytes(d, sizeof d, p->fabric.disk_bandwidth),
              p->ws_cached ? "the page cache holds the file: the writes a "
                             "commit syncs"
                           : "the file is larger than the page cache: every "
                             "read and write");
    fprintf(f, "; the step: %s a sample; %d micro-batch%s of %d a batch\n",
            st_plan_fmt_time(e, sizeof e, p->bottleneck_time), p->micro_batches,
            p->micro_batches == 1 ? "" : "es", p->micro_batch);
  }
  if (p->ranks > 0 && p->rank_allowed > 0) {
    char many[48] = "one rank a machine";
    if (p->rank_per_machine > 1)
      snprintf(many, sizeof many, "%d ranks a machine", p->rank_per_machine);
    fprintf(f, "each rank may hold %s (%s%s)\n",
            st_plan_fmt_bytes(a, sizeof a, p->rank_allowed),
            p->rank_per_machine ? "its machine's memory, " : "",
            p->rank_per_machine ? many : "execution.rank_memory_limit");
  }
  if (p->ranks > 0 && p->mem_batch > 0) {
    if (p->mem_data >= 0)
      fprintf(f,
              "each rank also holds the data, %s as loaded, and the "
              "trainer's batch buffers, %s (in its memory below)\n",
              st_plan_fmt_bytes(a, sizeof a, p->mem_data),
              st_plan_fmt_bytes(b, sizeof b, p->mem_batch));
    else
      fprintf(f,
              "each rank also holds the trainer's batch buffers, %s (in its "
              "memory below), and the data, not counted: %s\n",
              st_plan_fmt_bytes(b, sizeof b, p->mem_batch), p->data_note);
  }
  for (int r = 0; r < p->ranks; r++) {
    char st[48] = "no stage", mem[32];
    int lo = p->rank_stages[r], hi = p->rank_stages_end[r];
    if (!strcmp(p->mode, "weight_streaming"))
      snprintf(st, sizeof st, "%s", r ? "a compute rank" : "the weight store");
    else if (hi - lo == 1)
      snprintf(st, sizeof st, "stage %d", lo);
    else if (hi > lo)
      snprintf(st, sizeof st, "stages %d-%d", lo, hi - 1);
    fprintf(f, "rank %d: %s, %s by the plan's memory\n", r, st,
            st_plan_fmt_bytes(mem, sizeof mem, p->rank_memory[r]));
  }
  fprintf(f, "%s in use: %s, idle: %s\n", word,
          st_plan_fmt_count(c, sizeof c, (double)p->pes_used),
          st_plan_fmt_count(d, sizeof d, (double)(fb->pes - p->pes_used)));
  if (p->n_stages > 1 && strcmp(p->mode, "pipelined_backprop") != 0) {
    /* block_sequential runs gpipe's order inside its segment */
    const char *as =
        !strcmp(p->mode, "pipeline") || !strcmp(p->mode, "block_sequential")
            ? "as configured"
            : "if run as gpipe";
    char extra[96] = "", t[32];
    if (p->virtual_stages > 1)
      snprintf(extra, sizeof extra,
               ", %d chunks a worker: +%s a sample of extra hand-offs",
               p->virtual_stages,
               st_plan_fmt_time(t, sizeof t, p->handoff_time));
    fprintf(f,
            "utilization: mode %s; %s with M = %d micro-batch%s (%sbatch "
            "%d / micro-batch %d): %s's bubble = %.3f%s -> %s "
            "samples/s; as pipelined backprop: %.2f in steady state -> %s "
            "samples/s\n",
            p->mode[0] ? p->mode : "-", as, p->micro_batches,
            p->micro_batches == 1 ? "" : "es",
            p->replicas > 1 ? "a replica's " : "", p->batch, p->micro_batch,
            p->schedule[0] ? p->schedule : "gpipe", p->util_fill_drain, extra,
            st_plan_fmt_rate(e, sizeof e, st_plan_rate(p, 0)),
            p->util_pipelined,
            st_plan_fmt_rate(a, sizeof a, st_plan_rate(p, 1)));
  } else if (p->n_stages == 1) {
    fprintf(f, "utilization: one stage, no pipeline bubble (1.00)\n");
  }
  if (p->host_time > 0)
    fprintf(f,
            "between steps: %s per sample on the caller (the next batch's "
            "input and the step hand-off), included in the rates above\n",
            st_plan_fmt_time(e, sizeof e, p->host_time));
  if (!cpu)
    fprintf(f, "note: a mesh plan is a what-if estimate; only cpu plans run\n");
}

/* ------------------------------------------------------------- JSON */

/* JSON is UTF-8: a byte that starts no valid sequence (a path that is not
 * UTF-8, or one cut short mid-character in fabric.source) is written as
 * U+FFFD, so that the file still parses. */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  while (*s) {
    int n = st_utf8_len(s);
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch == '\n')
      fputs("\\n", f);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else if (!n)
      fputs("\\ufffd", f);
    else
      fwrite(s, 1, (size_t)n, f);
    s += n ? n : 1;
  }
  fputc('"', f);
}

static void json_number(FILE *f, double v) {
  if (v < INFINITY && v > -INFINITY)
    fprintf(f, "%.10g", v);
  else
    fputs("null", f);
}

/* "key": number */
static void jnum(FILE *f, const char *key, double v, int last) {
  fprintf(f, "\"%s\": ", key);
  json_number(f, v);
  fputs(last ? "" : ", ", f);
}

static void write_json(const st_plan *p, FILE *f) {
  const st_fabric *fb = &p->fabric;
  fprintf(f,
          "{\n  \"format\": \"strata-plan\", \"version\": 1,\n  \"config\": ");
  json_string(f, p->model);
  fprintf(f, ",\n  \"fabric\": {\"kind\": \"%s\", \"name\": ",
          fb->kind == ST_FABRIC_CPU ? "cpu" : "mesh");
  json_string(f, fb->name);
  fprintf(f, ", \"width\": %d, \"height\": %d, \"pes\": %lld, ", fb->width,
          fb->height, (long long)fb->pes);
  jnum(f, "pe_flops", fb->pe_flops, 0);
  jnum(f, "pe_memory", fb->pe_memory, 0);
  jnum(f, "pe_reserved", fb->pe_reserved, 0);
  jnum(f, "link_bandwidth", fb->link_bandwidth, 0);
  jnum(f, "efficiency_slope", fb->efficiency_slope, 0);
  jnum(f, "memory_bandwidth", fb->memory_bandwidth, 0);
  fputs("\"memory_bandwidth_source\": ", f);
  json_string(f, fb->memory_bandwidth_source);
  fputs(", ", f);
  jnum(f, "fabric_bandwidth", fb->fabric_bandwidth, 0);
  jnum(f, "hop_latency", fb->hop_latency, 0);
  jnum(f, "pe_overhead", fb->pe_overhead, 0);
  jnum(f, "io_bandwidth", fb->io_bandwidth, 0);
  jnum(f, "stream_bandwidth", fb->stream_bandwidth, 0);
  jnum(f, "disk_bandwidth", fb->disk_bandwidth, 0);
  jnum(f, "input_bandwidth", fb->input_bandwidth, 0);
  jnum(f, "step_latency", fb->step_latency, 0);
  jnum(f, "hosted_latency", fb->hosted_latency, 0);
  fprintf(f, "\"estimated\": %s, \"calibrated\": ",
          fb->estimated ? "true" : "false");
  if (fb->calibrated)
    json_string(f, fb->calibrated_at);
  else
    fputs("null", f);
  fprintf(f, ", \"products\": \"%s\"", st_fabric_products(fb));
  fputs(", \"source\": ", f);
  json_string(f, fb->source);
  fprintf(f, "},\n  \"options\": {\"stages_requested\": %d, ",
          p->options.n_stage_blocks > 0 ? p->n_stages : p->options.stages);
  fprintf(f, "\"stages_pinned\": %s, ",
          p->options.n_stage_blocks > 0 ? "true" : "false");
  jnum(f, "samples_in_flight", p->options.samples_in_flight, 0);
  jnum(f, "weight_versions", p->options.weight_versions, 1);
  fprintf(f,
          "},\n  \"layout\": {\"band_height\": %d, \"bands\": %d, "
          "\"order\": \"snake\"},\n  \"blocks\": [",
          p->band_height, p->bands);
  for (int i = 0; i < p->n_blocks; i++) {
    const st_block_cost *b = &p->blocks[i];
    fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
    json_string(f, b->name);
    fputs(", ", f);
    jnum(f, "flops_fwd", b->flops_fwd, 0);
    jnum(f, "flops_bwd", b->flops_bwd, 0);
    jnum(f, "param_bytes", b->param_bytes, 0);
    jnum(f, "state_bytes", b->state_bytes, 0);
    jnum(f, "act_bytes", b->act_bytes, 0);
    jnum(f, "in_bytes", b->in_bytes, 0);
    int measured = b->measured_fwd > 0 || b->measured_bwd > 0;
    int lwp = b->lwp_bytes > 0 || b->measured_lwp > 0;
    jnum(f, "out_bytes", b->out_bytes, !measured && !lwp);
    if (measured) {
      jnum(f, "measured_fwd", b->measured_fwd, 0);
      jnum(f, "measured_bwd", b->measured_bwd, !lwp);
    }
    if (lwp) { /* weight prediction, paid by every stage but the last */
      jnum(f, "lwp_bytes", b->lwp_bytes, !measured);
      if (measured) jnum(f, "measured_lwp", b->measured_lwp, 1);
    }
    fputc('}', f);
  }
  fprintf(f, "\n  ],\n  \"stages\": [");
  for (int s = 0; s < p->n_stages; s++) {
    const st_plan_stage *st = &p->stages[s];
    fprintf(f, "%s\n    {\"index\": %d, \"blocks\": [", s ? "," : "", s);
    for (int b = 0; b < st->count; b++) {
      if (b) fputs(", ", f);
      json_string(f, p->blocks[st->first + b].name);
    }
    fprintf(f,
            "], \"first\": %d, \"count\": %d,\n     \"pes\": %lld, "
            "\"rect\": {\"x\": %d, \"y\": %d, \"w\": %d, \"h\": %d}, "
            "\"pes_for_time\": %lld, \"pes_for_memory\": %lld,\n     ",
            st->first, st->count, (long long)st->pes, st->x, st->y, st->w,
            st->h, (long long)st->pes_for_time, (long long)st->pes_for_memory);
    jnum(f, "flops_fwd", st->flops_fwd, 0);
    jnum(f, "flops_bwd", st->flops_bwd, 0);
    fputs("\"time\": {", f);
    jnum(f, "fwd", st->time_fwd, 0);
    jnum(f, "bwd", st->time_bwd, 0);
    jnum(f, "comm", st->time_comm, 0);
    jnum(f, "total", st->time, 1);
    fputs("},\n     \"memory\": {", f);
    jnum(f, "weights", st->mem_weights, 0);
    jnum(f, "state", st->mem_state, 0);
    jnum(f, "activations", st->mem_acts, 0);
    jnum(f, "workspace", st->mem_work, 0);
    jnum(f, "replicas", st->mem_replicas, 0);
    jnum(f, "total", st->mem_total, 0);
    jnum(f, "capacity", st->mem_capacity, 0);
    jnum(f, "working_set", st->working_set, 0);
    jnum(f, "spill", st->spill, 1);
    fprintf(f, "},\n     ");
    jnum(f, "in_flight", st->in_flight, 0);
    jnum(f, "versions", st->versions, 0);
    fputs("\"bound\": ", f);
    json_string(f, st->bound);
    fprintf(f, ", \"bottleneck\": %s, \"cause\": ",
            s == p->bottleneck ? "true" : "false");
    json_string(f, st->cause);
    fputc('}', f);
  }
  fprintf(f, "\n  ],\n  \"ranks\": [");
  for (int r = 0; r < p->ranks; r++) {
    fprintf(f, "%s{\"rank\": %d, \"stages\": [%d, %d], ", r ? ", " : "", r,
            p->rank_stages[r], p->rank_stages_end[r]);
    jnum(f, "memory", p->rank_memory[r], 1);
    fputc('}', f);
  }
  fprintf(f, "],\n  ");
  jnum(f, "rank_allowed", p->rank_allowed, 0);
  fprintf(f, "\"rank_per_machine\": %d, ", p->rank_per_machine);
  jnum(f, "rank_data", p->mem_data, 0);
  jnum(f, "rank_batch_buffers", p->mem_batch, 0);
  jnum(f, "throughput", p->throughput, 0);
  fprintf(f, "\"bottleneck_stage\": %d, ", p->bottleneck);
  jnum(f, "bottleneck_time", p->bottleneck_time, 0);
  jnum(f, "balance", p->balance, 0);
  jnum(f, "io_rate", p->io_rate, 0);
  fprintf(f, "\"replicas\": %d, \"replica_pes\": %lld, ",
          p->replicas > 1 ? p->replicas : 1,
          (long long)(p->replicas > 1 ? p->replica_pes : p->pes_used));
  jnum(f, "reduce_time", p->reduce_time, 0);
  fputs("\"mode_why\": ", f);
  json_string(f, p->mode_why);
  fputs(",\n  \"weight_streaming\": {", f);
  jnum(f, "compute", p->ws_compute, 0);
  jnum(f, "stream", p->ws_stream, 0);
  jnum(f, "disk", p->ws_disk, 0);
  jnum(f, "time", p->bottleneck_time, 1);
  fputs("}, ", f);
  fprintf(f, "\"pes_used\": %lld,\n  \"utilization\": {\"mode\": ",
          (long long)p->pes_used);
  json_string(f, p->mode);
  fprintf(f,
          ", \"batch\": %d, \"micro_batch\": %d, \"micro_batches\": %d,\n"
          "    \"gpipe\": {",
          p->batch, p->micro_batch, p->micro_batches);
  jnum(f, "bubble_utilization", p->util_fill_drain, 0);
  fprintf(f, "\"schedule\": \"%s\", \"virtual_stages\": %d, ",
          p->schedule[0] ? p->schedule : "gpipe", p->virtual_stages);
  jnum(f, "handoff_time", p->handoff_time, 0);
  jnum(f, "throughput", st_plan_rate(p, 0), 1);
  fputs("},\n    \"pipelined_backprop\": {", f);
  jnum(f, "utilization", p->util_pipelined, 0);
  jnum(f, "throughput", st_plan_rate(p, 1), 1);
  fputs("},\n    ", f);
  jnum(f, "host_time", p->host_time, 1);
  fputs("},\n  \"throughput_by_stages\": ", f);
  if (p->throughput_by_k) {
    fputc('[', f);
    for (int k = 0; k < p->n_tried; k++) {
      if (k) fputs(", ", f);
      json_number(f, p->throughput_by_k[k]);
    }
    fputc(']', f);
  } else {
    fputs("null", f);
  }
  fputs(",\n  \"cause\": ", f);
  json_string(f, p->cause);
  fputs("\n}\n", f);
}

/* Renders with `emit` into memory and writes the file atomically. */
static int write_atomic(const st_plan *p, const char *path,
                        void (*emit)(const st_plan *, FILE *), st_error *err) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  emit(p, f);
  if (fclose(f) != 0) {
    free(buf);
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  }
  int rc = st_write_file_atomic(path, buf, len, err);
  free(buf);
  return rc;
}

int st_plan_write_json(const st_plan *p, const char *path, st_error *err) {
  return write_atomic(p, path, write_json, err);
}

/* -------------------------------------------------------------- SVG */

/* Tableau 10: distinct, readable with a light or dark label. */
static const char *const palette[] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
static const int palette_dark_text[] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
#define N_COLOURS 10
#define IDLE "#e6e6e6"

static const char *label_colour(int s) {
  return palette_dark_text[s % N_COLOURS] ? "#1a1a1a" : "#ffffff";
}

/* The scale of a mesh map: pixels per PE so the grid fits max_w x max_h. */
static double mesh_scale(const st_fabric *fb, double max_w, double max_h) {
  double sx = max_w / fb->width, sy = max_h / fb->height;
  double k = sx < sy ? sx : sy;
  return k > 48 ? 48 : k;
}

/* Whether a stage's rectangle, at scale k, is big enough to carry its own
 * label; the others get a callout above the map. */
static int labelled_inside(const st_plan_stage *st, double k) {
  return st->w * k >= 30 && st->h * k >= 18;
}

static int needs_callouts(const st_plan *p, double k) {
  for (int s = 0; s < p->n_stages; s++)
    if (!labelled_inside(&p->stages[s], k)) return 1;
  return 0;
}

#define CALLOUT_ROWS 3
#define CALLOUT_ROW_H 15.0

/* Map of a mesh: the whole grid scaled into max_w x max_h at (x0, y0);
 * y0 already leaves room for callouts when needs_callouts. */
static void draw_mesh(const st_plan *p, FILE *f, double x0, double y0,
                      double max_w, double max_h) {
  const st_fabric *fb = &p->fabric;
  double k = mesh_scale(fb, max_w, max_h);
  double W = fb->width * k, H = fb->height * k;
  fprintf(f,
          "<rect x='%.2f' y='%.2f' width='%.2f' height='%.2f' fill='" IDLE
          "' stroke='#888' stroke-width='1'/>\n",
          x0, y0, W, H);
  /* Stages thinner than 3 px are drawn 3 px wide (over their neighbour's
   * edge) and last, so that every stage can be seen. */
  for (int pass = 0; pass < 2; pass++)
    for (int s = 0; s < p->n_stages; s++) {
      const st_plan_stage *st = &p->stages[s];
      double rx = x0 + st->x * k, ry = y0 + st->y * k, rw = st->w * k,
             rh = st->h * k;
      int thin = rw < 3 || rh < 3;
      if (thin != pass) continue;
      if (rw < 3) rx -= (3 - rw) / 2, rw = 3;
      if (rh < 3) ry -= (3 - rh) / 2, rh = 3;
      double edge = rw < rh ? rw : rh, stroke = edge / 6 < 1.5 ? edge / 6 : 1.5;
      fprintf(f,
              "<rect x='%.2f' y='%.2f' width='%.2f' height='%.2f' "
              "fill='%s' stroke='#ffffff' stroke-width='%.2f'><title>S%d: "
              "%dx%d PEs, %s-bound</title></rect>\n",
              rx, ry, rw, rh, palette[s % N_COLOURS], thin ? 0 : stroke, s,
              st->w, st->h, st->bound);
    }
  if (k >= 6) { /* one cell per PE when they are big enough to see */
    fprintf(f, "<g stroke='#ffffff' stroke-width='0.6' opacity='0.6'>\n");
    for (int x = 1; x < fb->width; x++)
      fprintf(f, "<line x1='%.2f' y1='%.2f' x2='%.2f' y2='%.2f'/>\n",
              x0 + x * k, y0, x0 + x * k, y0 + H);
    for (int y = 1; y < fb->height; y++)
      fprintf(f, "<line x1='%.2f' y1='%.2f' x2='%.2f' y2='%.2f'/>\n", x0,
              y0 + y * k, x0 + W, y0 + y * k);
    fprintf(f, "</g>\n");
  }
  /* The pipeline's path, centre to centre, with an arrowhead halfway,
   * where it crosses from one stage into the next. */
  for (int s = 1; s < p->n_stages; s++) {
    const st_plan_stage *a = &p->stages[s - 1], *b = &p->stages[s];
    double ax = x0 + (a->x + a->w / 2.0) * k, ay = y0 + (a->y + a->h / 2.0) * k;
    double bx = x0 + (b->x + b->w / 2.0) * k, by = y0 + (b->y + b->h / 2.0) * k;
    fprintf(f,
            "<path fill='none' stroke='#222' stroke-width='1.6' "
            "stroke-opacity='0.8' marker-mid='url(#arrow)' d='M%.2f %.2f "
            "L%.2f %.2f L%.2f %.2f'/>\n",
            ax, ay, (ax + bx) / 2, (ay + by) / 2, bx, by);
  }
  /* Labels last, over everything; a dark or light halo keeps them legible
   * on any colour and over the path. */
  double last_x[CALLOUT_ROWS];
  for (int r = 0; r < CALLOUT_ROWS; r++) last_x[r] = -1e9;
  for (int s = 0; s < p->n_stages; s++) {
    const st_plan_stage *st = &p->stages[s];
    double rx = x0 + st->x * k, ry = y0 + st->y * k, rw = st->w * k,
           rh = st->h * k, cx = rx + rw / 2;
    const char *ink = label_colour(s);
    const char *halo = ink[1] == 'f' ? "#1a1a1a" : "#ffffff";
    if (labelled_inside(st, k)) {
      int full = rw >= 120 && rh >= 80;
      double font = rh < 40 ? rh * 0.45 : 17;
      fprintf(f,
              "<g fill='%s' stroke='%s' stroke-width='3' "
              "stroke-opacity='0.35' paint-order='stroke' "
              "text-anchor='middle'>\n<text x='%.2f' y='%.2f' "
              "font-size='%.1f' font-weight='bold'>S%d</text>\n",
              ink, halo, cx, ry + rh / 2 - (full ? 16 : -font / 3), font, s);
      if (full) {
        char bl[64];
        fprintf(f, "<text x='%.2f' y='%.2f' font-size='12'>", cx,
                ry + rh / 2 + 22);
        st_svg_escape(f, blocks_text(bl, sizeof bl, p, st));
        fprintf(f,
                "</text>\n<text x='%.2f' y='%.2f' font-size='12'>%dx%d "
                "PEs, %s</text>\n",
                cx, ry + rh / 2 + 37, st->w, st->h, st->bound);
      }
      fprintf(f, "</g>\n");
      continue;
    }
    /* a callout above the map, on the first row where it does not collide */
    int row = 0;
    while (row < CALLOUT_ROWS - 1 && cx - last_x[row] < 26) row++;
    last_x[row] = cx;
    double ty = y0 - 6 - row * CALLOUT_ROW_H;
    fprintf(f,
            "<line x1='%.2f' y1='%.2f' x2='%.2f' y2='%.2f' stroke='%s' "
            "stroke-width='1.2'/>\n",
            cx, ty + 2, cx, ry + (rh < 6 ? rh / 2 : 3), palette[s % N_COLOURS]);
    fprintf(f,
            "<text x='%.2f' y='%.2f' font-size='12' font-weight='bold' "
            "fill='#222' text-anchor='middle'>S%d</text>\n",
            cx, ty, s);
  }
  fprintf(f,
          "<text x='%.2f' y='%.2f' font-size='12' fill='#555'>%d x %d "
          "PEs%s; stages in bands of %d row%s, in snake order%s</text>\n",
          x0, y0 + H + 16, fb->width, fb->height, k < 1 ? " (scaled down)" : "",
          p->band_height, p->band_height == 1 ? "" : "s",
          p->n_stages > 1 ? " (arrows: the pipeline)" : "");
}

/* Map of a cpu: its cores as squares, rows of at most 32. */
static double draw_cpu(const st_plan *p, FILE *f, double x0, double y0,
                       double max_w) {
  int cores = p->fabric.width, per_row = cores < 32 ? cores : 32;
  double gap = 4, cell = (max_w - gap * (per_row - 1)) / per_row;
  if (cell > 56) cell = 56;
  int rows = (cores + per_row - 1) / per_row;
  double label_h = 22, row_h = label_h + cell + 10;
  for (int c = 0; c < cores; c++) {
    int row = c / per_row, col = c % per_row, s = -1;
    for (int t = 0; t < p->n_stages; t++)
      if (c >= p->stages[t].x && c < p->stages[t].x + p->stages[t].w) s = t;
    double x = x0 + col * (cell + gap), y = y0 + row * row_h + label_h;
    fprintf(f,
            "<rect x='%.2f' y='%.2f' width='%.2f' height='%.2f' rx='3' "
            "fill='%s' stroke='#666' stroke-width='0.8'><title>core %d%s"
            "</title></rect>\n",
            x, y, cell, cell, s >= 0 ? palette[s % N_COLOURS] : IDLE, c,
            s >= 0 ? "" : " (idle)");
    if (cell >= 18)
      fprintf(f,
              "<text x='%.2f' y='%.2f' font-size='%.1f' fill='%s' "
              "text-anchor='middle'>%d</text>\n",
              x + cell / 2, y + cell / 2 + 4, cell >= 30 ? 12.0 : 9.0,
              s >= 0 ? label_colour(s) : "#555", c);
  }
  /* One bracket and label over each stage's run of cores, per row. */
  for (int s = 0; s < p->n_stages; s++) {
    const st_plan_stage *st = &p->stages[s];
    for (int c = st->x; c < st->x + st->w;) {
      int row = c / per_row, end = (row + 1) * per_row;
      if (end > st->x + st->w) end = st->x + st->w;
      double xa = x0 + (c % per_row) * (cell + gap);
      double xb = x0 + ((end - 1) % per_row) * (cell + gap) + cell;
      double y = y0 + row * row_h + label_h - 5;
      fprintf(f,
              "<path d='M%.2f %.2f V%.2f H%.2f V%.2f' fill='none' "
              "stroke='%s' stroke-width='2'/>\n",
              xa, y + 3, y - 2, xb, y + 3, palette[s % N_COLOURS]);
      if (xb - xa >= 20)
        fprintf(f,
                "<text x='%.2f' y='%.2f' font-size='13' font-weight='bold' "
                "fill='#222' text-anchor='middle'>S%d</text>\n",
                (xa + xb) / 2, y - 6, s);
      c = end;
    }
  }
  fprintf(f,
          "<text x='%.2f' y='%.2f' font-size='12' fill='#555'>%d cores; "
          "consecutive stages on consecutive cores</text>\n",
          x0, y0 + rows * row_h + 8, cores);
  return rows * row_h + 14;
}

/* Legend columns, pixels from the left margin. */
static const double col_x[] = {0, 24, 76, 200, 290, 420, 590, 800};

static void write_svg(const st_plan *p, FILE *f) {
  const double width = 1040, margin = 24, map_w = width - 2 * margin;
  const double mesh_h = 620;
  int cpu = p->fabric.kind == ST_FABRIC_CPU;
  /* the map's height decides where the legend goes: measure first */
  double map_h, top = 82;
  if (cpu) {
    int per_row = p->fabric.width < 32 ? p->fabric.width : 32;
    double gap = 4, cell = (map_w - gap * (per_row - 1)) / per_row;
    if (cell > 56) cell = 56;
    int rows = (p->fabric.width + per_row - 1) / per_row;
    map_h = rows * (22 + cell + 10) + 14;
  } else {
    double k = mesh_scale(&p->fabric, map_w, mesh_h);
    if (needs_callouts(p, k)) top += CALLOUT_ROWS * CALLOUT_ROW_H;
    map_h = p->fabric.height * k + 22;
  }
  double legend_y = top + map_h + 20;
  double height = legend_y + 24 + 22.0 * p->n_stages + 62;
  char a[48], b[48], c[48], d[48], e[48];
  st_svg_begin(f, width, height, "DejaVu Sans, Helvetica, Arial, sans-serif",
               0);
  fprintf(f, "<defs><marker id='arrow' viewBox='0 0 10 10' refX='5' refY='5' "
             "markerWidth='8' markerHeight='8' orient='auto'><path d='M0 0 "
             "L10 5 L0 10 z' fill='#222'/></marker></defs>\n");
  fprintf(f,
          "<text x='%.0f' y='32' font-size='20' font-weight='bold' "
          "fill='#111'>",
          margin);
  st_svg_escape(f, p->model[0] ? p->model : "plan");
  fprintf(f, " on %s: %d blocks in %d stage%s</text>\n", p->fabric.name,
          p->n_blocks, p->n_stages, p->n_stages == 1 ? "" : "s");
  /* where the prediction comes from, as the text report says it */
  if (!cpu)
    snprintf(c, sizeof c, "what-if estimate");
  else if (p->fabric.calibrated)
    snprintf(c, sizeof c, "calibrated %s", p->fabric.calibrated_at);
  else
    snprintf(c, sizeof c, "uncalibrated estimate");
  fprintf(f,
          "<text x='%.0f' y='56' font-size='14' fill='#333'>predicted %s "
          "samples/s in steady state; bottleneck S%d at %s per sample; ",
          margin, st_plan_fmt_rate(a, sizeof a, p->throughput), p->bottleneck,
          st_plan_fmt_time(b, sizeof b, p->bottleneck_time));
  st_svg_escape(f, c); /* the profile's date, as its file gives it */
  fprintf(f, "</text>\n");
  if (cpu)
    draw_cpu(p, f, margin, top, map_w);
  else
    draw_mesh(p, f, margin, top, map_w, mesh_h);

  static const char *const head[] = {
      "",      "stage",       "blocks",           "",
      "where", "time, bound", "fwd / bwd / comm", "memory held / capacity"};
  for (int col = 1; col < 8; col++)
    fprintf(f,
            "<text x='%.0f' y='%.2f' font-size='12' font-weight='bold' "
            "fill='#555'>%s</text>\n",
            margin + col_x[col], legend_y,
            col == 3 ? (cpu ? "cores" : "PEs") : head[col]);
  for (int s = 0; s < p->n_stages; s++) {
    const st_plan_stage *st = &p->stages[s];
    double y = legend_y + 22 + 22.0 * s;
    char cell[8][128];
    snprintf(cell[1], 128, "S%d", s);
    blocks_text(cell[2], 128, p, st);
    st_plan_fmt_count(cell[3], 128, (double)st->pes);
    where_text(cell[4], 128, p, st);
    snprintf(cell[5], 128, "%s, %s", st_plan_fmt_time(a, sizeof a, st->time),
             st->bound);
    snprintf(cell[6], 128, "%s / %s / %s",
             st_plan_fmt_time(a, sizeof a, st->time_fwd),
             st_plan_fmt_time(b, sizeof b, st->time_bwd),
             st_plan_fmt_time(c, sizeof c, st->time_comm));
    snprintf(cell[7], 128, "%s / %s",
             st_plan_fmt_bytes(d, sizeof d, st->mem_total),
             st_plan_fmt_bytes(e, sizeof e, st->mem_capacity));
    fprintf(f,
            "<rect x='%.0f' y='%.2f' width='16' height='16' rx='2' "
            "fill='%s'/>\n",
            margin, y - 13, palette[s % N_COLOURS]);
    fprintf(f, "<g font-size='13' fill='#111'%s>\n",
            s == p->bottleneck ? " font-weight='bold'" : "");
    for (int col = 1; col < 8; col++) {
      fprintf(f, "<text x='%.0f' y='%.2f'>", margin + col_x[col], y);
      st_svg_escape(f, cell[col]);
      fprintf(f, "</text>\n");
    }
    if (s == p->bottleneck)
      fprintf(f, "<text x='%.0f' y='%.2f'>◀ bottleneck</text>\n", margin + 900,
              y);
    fprintf(f, "</g>\n");
  }
  double y = legend_y + 22 + 22.0 * p->n_stages + 16;
  if (p->n_stages > 1)
    fprintf(f,
            "<text x='%.0f' y='%.2f' font-size='12' fill='#444'>%s with "
            "M = %d: fill-and-drain utilization %.3f (%s "
            "samples/s); pipelined backprop: %.2f in steady state</text>\n",
            margin, y,
            !strcmp(p->mode, "pipeline") || !strcmp(p->mode, "block_sequential")
                ? "gpipe"
                : "if run as gpipe",
            p->micro_batches, p->util_fill_drain,
            st_plan_fmt_rate(e, sizeof e, st_plan_rate(p, 0)),
            p->util_pipelined);
  fprintf(
      f,
      "<text x='%.0f' y='%.2f' font-size='12' fill='#444'>%s: %sFLOP/s "
      "and %s for tensors per %s; %s in use, %s idle (grey)</text>\n",
      margin, y + 18, p->fabric.name,
      rate_text(a, sizeof a, p->fabric.pe_flops),
      st_plan_fmt_bytes(b, sizeof b, p->fabric.pe_memory), cpu ? "core" : "PE",
      st_plan_fmt_count(c, sizeof c, (double)p->pes_used),
      st_plan_fmt_count(d, sizeof d, (double)(p->fabric.pes - p->pes_used)));
  st_svg_end(f);
}

int st_plan_write_svg(const st_plan *p, const char *path, st_error *err) {
  return write_atomic(p, path, write_svg, err);
}
