/*
 * fabric.c — what a plan runs on, as numbers the cost model can use.
 *
 *   cpu        this machine: cores from sysconf (or fabric.cores / cpu:N),
 *              memory = physical RAM (or a lower cgroup v2 memory.max)
 *              split evenly over the cores, a built-in per-core rate and
 *              parallel efficiency, a stage-to-stage copy rate and a
 *              memory bandwidth: estimates until `strata bench
 *              --calibrate` measures this machine (the disk's, under a
 *              file store, stays one; docs/compiler.md).
 *   mesh:WxH   a W x H grid of PEs, each with one WSE-2 PE's compute, memory
 *              (two thirds of it for the model's tensors) and link
 *              bandwidth.
 *   wse2       Cerebras WSE-2 from its published figures (850,000 cores,
 *              40 GB on-chip SRAM, 20 PB/s memory and 220 Pb/s fabric
 *              bandwidth); the per-PE FLOP rate is our stated assumption.
 * A fabric.pe_flops, fabric.pe_memory or fabric.link_bandwidth above 0 (its
 * default is 0) overrides the built-in figure of every kind.
 */
#include "strata.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cpu: one core's sustained fp32 rate on GEMM-heavy blocks. An estimate
 * (about two thirds of a recent x86 core's AVX2/AVX-512 sgemm peak; see
 * BACKGROUND.md §7 for what PyTorch reaches here), not a measurement. */
#define CPU_CORE_FLOPS 90e9
/* cpu: e(c) = 1 / (1 + slope (c - 1)): each extra core in a stage loses 5%
 * to synchronisation, smaller GEMM tiles and shared memory bandwidth. */
#define CPU_EFFICIENCY_SLOPE 0.05
/* cpu: handing an activation to the next stage is one memcpy between
 * threads; ~10 GB/s is a single-threaded copy of buffers beyond the L2. */
#define CPU_COPY_BANDWIDTH 10e9
/* cpu: the machine's DRAM bandwidth, every core together: an estimate of
 * what a STREAM-like sum sustains on a server socket of 4 to 8 memory
 * channels (DDR4-3200 / DDR5-4800: 100-300 GB/s in theory, 60-70% of it
 * sustained; a desktop's two channels reach about 60). A calibration
 * profile's triad replaces it (st_calibration.memory_bandwidth), and
 * fabric.memory_bandwidth replaces both. */
#define CPU_MEMORY_BANDWIDTH 100e9
/* cpu: the last-level cache of all the cores together, an estimate (a
 * server socket's shared L3 is 32-256 MB, a desktop's 16-64 MB). A stage
 * whose step touches more than its share of it (its cores over all) is
 * bounded by its share of CPU_MEMORY_BANDWIDTH. */
#define CPU_CACHE_BYTES (32.0 * 1048576)
/* cpu: the disk under weight streaming's file store, bytes/s each way
 * (reads and writes share it): an estimate of one NVMe SSD's sustained
 * sequential transfer (PCIe 3.0 x4 drives read about 3 GB/s and write
 * 1.5-3; the 2-core machine of docs/results/stream.md has a virtio disk
 * of 1.3 GB/s by dd). Not measured; fabric.io_bandwidth gives this
 * machine's figure. */
#define CPU_DISK_BANDWIDTH 2e9

/* WSE-2, published (Cerebras, 2021; AnandTech "Cerebras Unveils Wafer Scale
 * Engine Two (WSE2)", 2021-04-20): 850,000 cores, 40 GB SRAM, 20 PB/s memory
 * bandwidth, 220 Pb/s fabric bandwidth. The grid is 1000 x 850 so that it
 * holds exactly the published 850,000 PEs (the Cerebras SDK addresses a
 * 757 x 996 fabric on a CS-2; use mesh:757x996 for that). */
#define WSE2_WIDTH 1000
#define WSE2_HEIGHT 850
#define WSE2_CORES 850000.0
#define WSE2_MEMORY 40e9
#define WSE2_MEMORY_BANDWIDTH 20e15
#define WSE2_FABRIC_BITS 220e15
/* Assumption, not a published figure: one fp32 fused multiply-add (2 FLOP)
 * per PE per cycle at about 1.1 GHz = 2.2 GFLOP/s per PE, 1.87 PFLOP/s for
 * the wafer. Override with fabric.pe_flops. */
#define WSE2_PE_FLOPS 2.2e9
/* Assumption, not a published figure: the model's tensors (weights,
 * gradients, optimizer state, activations) get two thirds of a PE's SRAM,
 * 31.4 of its 47.1 KB; the other third holds the PE's program, its fabric
 * queues and the kernels' working buffers, which share the same memory.
 * Checked against the one published bound on it: Cerebras runs models
 * "below 1 billion parameters" layer-pipelined and larger ones by weight
 * streaming (seeds/004; the CS-2 glossary: "up to about a billion"). With
 * two thirds (26.7 GB of 40), GPT-3 Large (760M, 17.4 GB at one stage and
 * one sample in flight, the least it can need) is planned layer-pipelined
 * and GPT-3 XL (1.3B, 28.0 GB) by weight streaming: the line falls near
 * 1.25B at GPT-3's context, where all of the 40 GB would have put it near
 * 2B and half of it near 0.9B (docs/compiler.md, "Memory a PE gives the
 * model"). */
#define WSE2_TENSOR_SHARE (2.0 / 3.0)
/* One link, one way: 220 Pb/s = 27.5 PB/s spread over 850,000 PEs and the
 * 8 one-way links of each (4 neighbours, in and out) = 4.04 GB/s. */
#define WSE2_LINK_BANDWIDTH (WSE2_FABRIC_BITS / 8 / WSE2_CORES / 8)
/* Assumptions, not published figures: a hop between neighbouring PEs takes
 * one cycle (the router forwards a word a cycle), and each PE spends about
 * 20 cycles of fixed work per layer, sample and pass (starting the task,
 * its first and last words), both at the assumed 1.1 GHz. */
#define WSE2_HOP_LATENCY (1.0 / 1.1e9)
#define WSE2_PE_OVERHEAD (20.0 / 1.1e9)
/* Published: a CS-2 system's I/O is 12 x 100 Gigabit Ethernet, 1.2 Tb/s =
 * 150 GB/s each way; weights stream from a MemoryX store over it too. */
#define CS2_IO_BANDWIDTH (12 * 100e9 / 8)

/* Applies the fabric.pe_* keys given a figure (> 0) over the built-in ones;
 * a value, not where it came from, decides, so a run's written config.yaml
 * plans as the run did. */
static void apply_overrides(st_fabric *f, const st_config *cfg) {
  char note[128] = "";
  if (cfg->fabric.pe_flops > 0) {
    f->pe_flops = cfg->fabric.pe_flops;
    f->calibrated = 0; /* one given rate for every FLOP, as uncalibrated */
    strcat(note, " pe_flops");
  }
  if (cfg->fabric.pe_memory > 0) {
    f->pe_memory = (double)cfg->fabric.pe_memory;
    f->pe_reserved = 0; /* the figure given is what tensors may use */
    strcat(note, " pe_memory");
  }
  if (cfg->fabric.link_bandwidth > 0) {
    f->link_bandwidth = cfg->fabric.link_bandwidth;
    strcat(note, " link_bandwidth");
  }
  if (cfg->fabric.memory_bandwidth > 0) {
    f->memory_bandwidth = cfg->fabric.memory_bandwidth;
    snprintf(f->memory_bandwidth_source, sizeof f->memory_bandwidth_source,
             "config");
    strcat(note, " memory_bandwidth");
  }
  if (f->kind == ST_FABRIC_MESH) {
    if (cfg->fabric.hop_latency > 0) {
      f->hop_latency = cfg->fabric.hop_latency;
      strcat(note, " hop_latency");
    }
    if (cfg->fabric.pe_overhead > 0) {
      f->pe_overhead = cfg->fabric.pe_overhead;
      strcat(note, " pe_overhead");
    }
    if (cfg->fabric.io_bandwidth > 0) {
      f->io_bandwidth = f->stream_bandwidth = cfg->fabric.io_bandwidth;
      strcat(note, " io_bandwidth");
    }
  } else {
    f->stream_bandwidth = f->link_bandwidth; /* a copy from the store */
    if (cfg->fabric.io_bandwidth > 0) {      /* a cpu's I/O: its disk */
      f->disk_bandwidth = cfg->fabric.io_bandwidth;
      strcat(note, " io_bandwidth");
    }
  }
  if (note[0]) {
    size_t used = strlen(f->source);
    snprintf(f->source + used, sizeof f->source - used,
             "; overridden by fabric keys:%s", note);
  }
}

static int positive(const st_config *cfg, const char *key, double v,
                    st_error *err) {
  if (v > 0 && isfinite(v)) return 0;
  return st_error_set(err, ST_ECONFIG, "%s: %s: must be > 0 (got %g)",
                      st_config_where(cfg, key), key, v);
}

static int resolve_cpu(st_fabric *f, const st_config *cfg, st_error *err) {
  long detected = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = cfg->fabric.cores > 0 ? cfg->fabric.cores
                                    : (int)(detected > 0 ? detected : 1);
  double ram = st_usable_memory(); /* a container's limit counts */
  if (ram <= 0) ram = 8e9;
  f->kind = ST_FABRIC_CPU;
  snprintf(f->name, sizeof f->name, "cpu:%d", cores);
  f->width = cores;
  f->height = 1;
  f->pes = cores;
  f->pe_flops = CPU_CORE_FLOPS;
  f->pe_memory = ram / cores;
  f->link_bandwidth = CPU_COPY_BANDWIDTH;
  f->memory_bandwidth = CPU_MEMORY_BANDWIDTH;
  snprintf(f->memory_bandwidth_source, sizeof f->memory_bandwidth_source,
           "default");
  f->cache_bytes = CPU_CACHE_BYTES;
  f->disk_bandwidth = CPU_DISK_BANDWIDTH;
  f->efficiency_slope = CPU_EFFICIENCY_SLOPE;
  f->estimated = 1;
  /* A calibration profile, when there is one, replaces the rates (and the
   * memory bandwidth, where it measured one). A
   * profile that exists but does not read is an error, not a silent
   * fallback: the user asked for it by calibrating. */
  char path[ST_PATH_MAX];
  st_calibration_path(path, sizeof path);
  if (path[0] && access(path, F_OK) == 0) {
    st_calibration c;
    int rc = st_calibration_read(&c, path, err);
    if (rc) return rc;
    snprintf(f->source, sizeof f->source,
             "%s cores; RAM %.3g GB (sysconf, or the cgroup limit) split "
             "over them",
             cfg->fabric.cores > 0 ? "given" : "detected", ram / 1e9);
    st_calibration_apply(&c, f, path);
    return 0;
  }
  snprintf(f->source, sizeof f->source,
           "%s cores; RAM %.3g GB (sysconf, or the cgroup limit) split "
           "over them; 90 GFLOP/s "
           "per core, e(c) = 1/(1 + 0.05 (c - 1)), 10 GB/s stage copies "
           "and 100 GB/s of memory past a 32 MiB cache (a file store's "
           "disk: 2 GB/s) are built-in estimates, not calibrated "
           "(%s%.100s)",
           cfg->fabric.cores > 0 ? "given" : "detected", ram / 1e9,
           path[0] ? "no profile at " : "",
           path[0] ? path : "STRATA_CALIBRATION=none: no profile read");
  return 0;
}

/* The per-PE and I/O figures every mesh starts from (a WSE-2 PE's, a
 * CS-2's I/O); the fabric.* keys override them. */
static void mesh_figures(st_fabric *f) {
  f->hop_latency = WSE2_HOP_LATENCY;
  f->pe_overhead = WSE2_PE_OVERHEAD;
  f->io_bandwidth = CS2_IO_BANDWIDTH;
  f->stream_bandwidth = CS2_IO_BANDWIDTH;
}

static void resolve_wse2(st_fabric *f) {
  f->kind = ST_FABRIC_MESH;
  snprintf(f->name, sizeof f->name, "wse2");
  f->width = WSE2_WIDTH;
  f->height = WSE2_HEIGHT;
  f->pes = (int64_t)WSE2_WIDTH * WSE2_HEIGHT;
  f->pe_flops = WSE2_PE_FLOPS;
  f->pe_memory = WSE2_MEMORY / WSE2_CORES * WSE2_TENSOR_SHARE;
  f->pe_reserved = WSE2_MEMORY / WSE2_CORES * (1 - WSE2_TENSOR_SHARE);
  f->link_bandwidth = WSE2_LINK_BANDWIDTH;
  f->efficiency_slope = 0;
  mesh_figures(f);
  f->memory_bandwidth = WSE2_MEMORY_BANDWIDTH;
  snprintf(f->memory_bandwidth_source, sizeof f->memory_bandwidth_source,
           "published");
  f->fabric_bandwidth = WSE2_FABRIC_BITS / 8;
  f->estimated = 1;
  snprintf(f->source, sizeof f->source,
           "Cerebras WSE-2 as published (850,000 cores, 40 GB SRAM, 20 PB/s "
           "memory, 220 Pb/s fabric; a CS-2's I/O 12 x 100 GbE), as a 1000 x "
           "850 grid; 2.2 GFLOP/s fp32 per PE, a hop of 1 cycle and 20 cycles "
           "a layer per PE (~1.1 GHz), and 2/3 of a PE's SRAM for the "
           "model's tensors are assumptions, not published");
}

/* The most PEs a mesh may have: past it a plan's PE counts (doubles in
 * places) no longer add up exactly. */
#define MAX_MESH_PES ((int64_t)1 << 40)

static int resolve_mesh(st_fabric *f, const st_config *cfg, st_error *err) {
  int w = cfg->fabric.width, h = cfg->fabric.height;
  if (w <= 0 || h <= 0)
    return st_error_set(
        err, ST_ECONFIG,
        "%s: fabric.width, fabric.height: a mesh needs both "
        "> 0 (got %d x %d); give --fabric mesh:WxH",
        st_config_where(cfg, w <= 0 ? "fabric.width" : "fabric.height"), w, h);
  if ((int64_t)w * h > MAX_MESH_PES) /* as --fabric mesh:WxH refuses */
    return st_error_set(
        err, ST_ECONFIG,
        "%s: fabric.width, fabric.height: %d x %d PEs, more than a mesh "
        "takes (2^40)",
        st_config_where(cfg, "fabric.width"), w, h);
  f->kind = ST_FABRIC_MESH;
  snprintf(f->name, sizeof f->name, "mesh:%dx%d", w, h);
  f->width = w;
  f->height = h;
  f->pes = (int64_t)w * h;
  f->pe_flops = WSE2_PE_FLOPS;
  f->pe_memory = WSE2_MEMORY / WSE2_CORES * WSE2_TENSOR_SHARE;
  f->pe_reserved = WSE2_MEMORY / WSE2_CORES * (1 - WSE2_TENSOR_SHARE);
  f->link_bandwidth = WSE2_LINK_BANDWIDTH;
  f->efficiency_slope = 0;
  mesh_figures(f);
  /* each PE its SRAM's share of the WSE-2's 20 PB/s */
  f->memory_bandwidth = WSE2_MEMORY_BANDWIDTH / WSE2_CORES * (double)f->pes;
  snprintf(f->memory_bandwidth_source, sizeof f->memory_bandwidth_source,
           "published");
  f->estimated = 0;
  snprintf(f->source, sizeof f->source,
           "per-PE figures of one WSE-2 PE and a CS-2's I/O unless the "
           "fabric.* keys give others");
  return 0;
}

/* How a run of cfg's precision has its products timed (st_fabric.bf16).
 * bf16 on a calibrated cpu with the profile's bf16 rates: its products —
 * linear layers', conv2d's and attention's, all st_gemm's — at those
 * rates, each class's conv2d and attention rates scaled as its GEMM's; the
 * rest (the pointwise ops, the optimizer, memory, the narrow and one-row
 * terms) as fp32's. Here, so that the runtime's cut (st_cut_fabric) and
 * `strata compile` time a run alike. */
static void fabric_precision(st_fabric *f, const st_config *cfg) {
  f->bf16 = ST_PRODUCTS_FP32;
  if (strcmp(cfg->train.precision, "bf16")) return;
  if (f->kind == ST_FABRIC_CPU &&
      !strcmp(cfg->execution.block_costs, "measured")) {
    f->bf16 = ST_PRODUCTS_BF16_MEASURED; /* timed in bf16 (measure.c) */
    return;
  }
  if (f->kind != ST_FABRIC_CPU || cfg->fabric.pe_flops > 0) {
    f->bf16 = ST_PRODUCTS_BF16_PE_FLOPS; /* a what-if's one rate */
    return;
  }
  int have = f->calibrated;
  for (int k = 0; k < ST_GEMM_CLASSES; k++)
    have = have && f->gemm_rate_bf16[k] > 0 && f->gemm_rate[k] > 0;
  if (!have) {
    f->bf16 = ST_PRODUCTS_BF16_AS_FP32;
    return;
  }
  for (int k = 0; k < ST_GEMM_CLASSES; k++) {
    double r = f->gemm_rate_bf16[k] / f->gemm_rate[k];
    f->gemm_rate[k] = f->gemm_rate_bf16[k];
    for (int i = 0; i < 2; i++) {
      f->conv_rate[i][k] *= r;
      f->attention_rate[i][k] *= r;
    }
  }
  f->pe_flops = f->gemm_rate[ST_GEMM_CLASSES - 1];
  f->bf16 = ST_PRODUCTS_BF16;
}

const char *st_fabric_products(const st_fabric *f) {
  switch (f->bf16) {
  case ST_PRODUCTS_BF16:
    return "bf16";
  case ST_PRODUCTS_BF16_AS_FP32:
    return "bf16 at fp32's rates";
  case ST_PRODUCTS_BF16_PE_FLOPS:
    return "bf16 at the fabric's pe_flops";
  case ST_PRODUCTS_BF16_MEASURED:
    return "bf16, blocks measured";
  default:
    return "fp32";
  }
}

int st_fabric_resolve(st_fabric *f, const st_config *cfg, st_error *err) {
  memset(f, 0, sizeof *f);
  int rc;
  if (strcmp(cfg->fabric.kind, "cpu") == 0) {
    rc = resolve_cpu(f, cfg, err);
  } else if (strcmp(cfg->fabric.kind, "wse2") == 0) {
    resolve_wse2(f);
    rc = 0;
  } else if (strcmp(cfg->fabric.kind, "mesh") == 0) {
    rc = resolve_mesh(f, cfg, err);
  } else {
    return st_error_set(err, ST_ECONFIG, "%s: fabric.kind: unknown fabric '%s'",
                        st_config_where(cfg, "fabric.kind"), cfg->fabric.kind);
  }
  if (rc) return rc;
  apply_overrides(f, cfg);
  if ((rc = positive(cfg, "fabric.pe_flops", f->pe_flops, err)) ||
      (rc = positive(cfg, "fabric.pe_memory", f->pe_memory, err)) ||
      (rc = positive(cfg, "fabric.link_bandwidth", f->link_bandwidth, err)))
    return rc;
  if (f->kind == ST_FABRIC_MESH &&
      ((rc = positive(cfg, "fabric.io_bandwidth", f->io_bandwidth, err)) ||
       (rc = positive(cfg, "fabric.hop_latency", f->hop_latency, err)) ||
       (rc = positive(cfg, "fabric.pe_overhead", f->pe_overhead, err))))
    return rc;
  fabric_precision(f, cfg);
  return 0;
}

/* A positive decimal int that fills the whole of [s, end). */
static int parse_count(const char *s, const char *end, int *out) {
  if (s == end) return -1;
  long v = 0;
  for (const char *c = s; c < end; c++) {
    if (!isdigit((unsigned char)*c)) return -1;
    v = v * 10 + (*c - '0');
    if (v > 1000000000L) return -1;
  }
  if (v <= 0) return -1;
  *out = (int)v;
  return 0;
}

enum { MAX_CORES = 1 << 20 }; /* fabric.cores' bound (config.c) */

int st_fabric_parse(st_config *cfg, const char *spec, st_error *err) {
  char set[96];
  int rc;
  const char *colon = strchr(spec, ':');
  size_t kind_len = colon ? (size_t)(colon - spec) : strlen(spec);
  const char *arg = colon ? colon + 1 : NULL;
  if (kind_len == 3 && strncmp(spec, "cpu", 3) == 0) {
    int cores = 0;
    if (arg &&
        (parse_count(arg, arg + strlen(arg), &cores) || cores > MAX_CORES))
      return st_error_set(err, ST_EARG,
                          "--fabric %s: cpu:N takes a core count from 1 to %d",
                          spec, MAX_CORES);
    if ((rc = st_config_set(cfg, "fabric.kind=cpu", err))) return rc;
    snprintf(set, sizeof set, "fabric.cores=%d", cores);
    return st_config_set(cfg, set, err);
  }
  if (kind_len == 4 && strncmp(spec, "mesh", 4) == 0) {
    const char *x = arg ? strchr(arg, 'x') : NULL;
    int w, h;
    if (!x || parse_count(arg, x, &w) || parse_count(x + 1, x + strlen(x), &h))
      return st_error_set(err, ST_EARG,
                          "--fabric %s: a mesh is mesh:WxH, e.g. mesh:64x64",
                          spec);
    if ((int64_t)w * h > MAX_MESH_PES)
      return st_error_set(err, ST_EARG, "--fabric %s: too many PEs", spec);
    if ((rc = st_config_set(cfg, "fabric.kind=mesh", err))) return rc;
    snprintf(set, sizeof set, "fabric.width=%d", w);
    if ((rc = st_config_set(cfg, set, err))) return rc;
    snprintf(set, sizeof set, "fabric.height=%d", h);
    return st_config_set(cfg, set, err);
  }
  if (strcmp(spec, "wse2") == 0)
    return st_config_set(cfg, "fabric.kind=wse2", err);
  return st_error_set(err, ST_EARG,
                      "--fabric %s: unknown fabric; one of cpu, cpu:N, "
                      "mesh:WxH, wse2",
                      spec);
}
