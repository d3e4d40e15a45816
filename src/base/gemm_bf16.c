/*
 * gemm_bf16.c — the products of train.precision: bf16: op(A) and op(B)
 * rounded to bfloat16, multiplied, and summed in fp32.
 *
 * The definition (what every path here computes, bit for bit): each input
 * is rounded to bf16 to nearest, ties to even, a subnormal input to a zero
 * of its sign; the inner dimension is taken in pairs (k = 2p, 2p + 1; an
 * odd K's last pair padded with zeros), and element (i, j) starts from
 * beta * C (from 0 when beta is 0) and takes, pair by pair in order of p,
 *     c = fma(a(i,2p+1), b(2p+1,j), c);  c = fma(a(i,2p), b(2p,j), c)
 * — the odd product first — then c * alpha at the end where alpha is not 1
 * (beta 0; with both, the sum starts from 0 and C = alpha c + beta C); with
 * a bias (st_gemm_bf16_bias) it starts from bias(j), as from C filled with
 * the bias at beta 1. That is
 * what one AVX512-BF16 VDPBF16PS lane does per pair (Intel SDM; checked on Zen
 * 4 against 3.2 million random lanes, and VCVTNEPS2BF16 against every fp32 bit
 * pattern: subnormal inputs become zeros, the rest matches st_bf16_from), each
 * product of two bf16 values being exact in fp32. The instruction flushes as
 * FTZ/DAZ do, so the emulated path equals it where train.flush_subnormals is on
 * (the default); with subnormals kept the two may differ on products near
 * FLT_MIN.
 *
 * Every element is one chain in a fixed order, whatever the tiling, so the
 * result depends on the values and K alone: not on the thread count, nor on
 * how many rows or columns one call has (a micro-batch split gives the same
 * rows as the whole batch).
 *
 * Where the CPU has AVX512-BF16 (the target's __AVX512BF16__), a
 * register block's step is one VDPBF16PS per 16 outputs; elsewhere the
 * same packed bf16 pairs are widened (a mask and a shift) and fed to two
 * fp32 FMAs, which halves op(B)'s packed memory but computes at fp32 speed
 * at best; with AVX-512 op(A) is packed already widened (WIDE_A), which
 * took the emulation from 105-119 to 170 GFLOP/s on one thread at 512 x
 * 768 x 1536 on the Intel Xeon VM below (fp32's packed kernel 175-190).
 * st_bf16_support names which. A CPU may run the instruction at half
 * the FMAs' rate (the Intel Xeon VM of docs/bench.md, family 6 model 207:
 * 24 independent VDPBF16PS at 101-103 GFLOP/s against 212-214 for FMAs),
 * where the emulation is faster: a calibration profile that measured so
 * makes the trainer emulate while subnormals are flushed
 * (st_bf16_prefer_emulated), the same bits.
 *
 * AMX's tiles, where the build targets them and the kernel grants them
 * (amx_on), run instead, and are the exception to the definition: each
 * element starts from beta C, takes its K block's pairs 16 at a time (one
 * TDPBF16PS, zeros padding the block's last 16), and is scaled by alpha as
 * above, but a tile step's sum is the hardware's own: on the Intel Xeon VM
 * of docs/bf16.md it matched neither fmaf chain order nor the exact sum
 * rounded once, in about half of 512,000 random elements, while erring no
 * more than the chain (docs/bf16.md). An element's step still reads only its
 * own row, column and sum, so its bits depend on the values and K alone, as
 * above (tests/base/test_gemm_bf16.c: every pool, rows or columns split); they
 * are not the definition's bits, so the tiles are chosen by the CPU alone,
 * never by a timing. Their packing: op(A) in panels of 16 rows whose
 * 16 x 16-pair blocks are each one tile, rows of pairs (the [p][row] pack
 * transposed, tile_panels); op(B) in panels of 16 columns, [p][16], each
 * 16 pairs one tile; 2 x 2 tiles of C a block (amx_block_run).
 *
 * Layout: K is cut into blocks of KC pairs. For each block, op(A) is packed
 * in blocks of MR rows ([p][MR] 32-bit pairs: bf16(a(i,2p)) in the low
 * half, bf16(a(i,2p+1)) in the high one; wide, [p][2][MR] floats, WIDE_A)
 * and op(B) in panels of NR = 32
 * columns ([p][32]), both zero-padded, by the pool's threads; then the
 * output tiles (choose_tiles) run MR x 32 register blocks over them, each
 * block's 2 MR accumulators loaded from C and stored back once per K block.
 * The packed block lives in the calling thread's scratch, which grows to the
 * largest (M + N) x KC pairs it has seen, (2 M + N) x KC words with op(A)
 * wide (products are cut into chunks of at most CHUNK rows and columns, so
 * at most 16 MB, 24 MB wide) and is kept: no allocation in the steady
 * state.
 */
#include "strata.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define HAVE_TILES 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define HAVE_TILES 0
#endif

/* 16 lanes everywhere, so that the packed layout and the register blocks
 * are one code; without AVX-512 GCC splits them into halves. Its note that
 * passing such a vector changes the ABI there does not apply: every
 * function that takes or returns one is static and inlined. */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef uint32_t u16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef float f32_alias __attribute__((may_alias)); /* a packed word's float */

/* MR rows a register block: 2 MR accumulators of 16 floats, which with
 * AVX-512's 32 registers leaves room for the two B vectors and a
 * broadcast; with 16 registers of 8 floats, 3 rows (12 halves). */
#if defined(__AVX512F__)
enum { MR = 12 };
#else
enum { MR = 3 };
#endif
/* KC: 512 pairs (K = 1024) a K block. Each K block loads and stores every
 * register block's C once and costs the pool two hand-offs, and the
 * products of GPT-2's layers have K = 768, 1024 or 3072: at 256 pairs they
 * took 2, 2 and 6 blocks, at 512 one, one and 3. The whole product on the
 * Zen 5 VM of docs/bench.md (2026-12-02, 2 threads, GFLOP/s, 256 against
 * 512, alternating, twice each): 1024 x 3072 x 768 624-654 against
 * 699-711, 768 x 3072 x 1024 660-673 against 697-717, 1024 x 768 x 3072
 * 661-688 against 694-699, 3072 x 768 x 1024 678-681 against 693-714
 * (one thread likewise, +3-11%); 768 and 1024 pairs no faster than 512.
 * op(B)'s 32-column panel (64 KB) no longer fits L1 beside op(A)'s block,
 * but the register block reads it at 11 bytes a cycle, which L2 serves.
 * The bits do not depend on KC (header). AMX's tiles keep blocks of
 * AMX_KC = 256 pairs, as measured on the Intel Xeon VM of docs/bf16.md:
 * their two 16-row panels of op(A) a K block, 32 KB, stay in L1 there,
 * and no CPU with the tiles has timed 512; their K steps of 16 pairs start
 * at the same pairs either way, so their bits are those of any KC. */
enum { NR = 32, KC = 512, AMX_KC = 256, CHUNK = 4096 };

#define INLINE static inline __attribute__((always_inline))

static atomic_int bf16_on, emulate_forced, emulate_preferred, plain_forced,
    tiles_off;

void st_gemm_set_bf16(int on) { atomic_store(&bf16_on, on != 0); }
int st_gemm_bf16_on(void) {
  return atomic_load_explicit(&bf16_on, memory_order_relaxed);
}
void st_bf16_set_emulated(int on) { atomic_store(&emulate_forced, on != 0); }
void st_bf16_prefer_emulated(int on) {
  atomic_store(&emulate_preferred, on != 0);
}
void st_bf16_set_plain(int on) { atomic_store(&plain_forced, on != 0); }
void st_bf16_set_tiles(int on) { atomic_store(&tiles_off, on == 0); }

#if HAVE_TILES
static int tiles_granted;
/* Linux gives a thread AMX's 8 KB of tile data only once its process has
 * asked (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18); a
 * kernel or VM that refuses leaves the products to VDPBF16PS, as does
 * STRATA_BF16_TILES=0 (the definition's bits, as on a CPU without AMX). */
static void ask_for_tiles(void) {
  const char *env = getenv("STRATA_BF16_TILES");
  tiles_granted = !(env && strcmp(env, "0") == 0) &&
                  syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif

/* AMX's tiles: wherever the build and the kernel have them, unless turned
 * off or emulation is forced; never by a timing, since their bits are not
 * the definition's (header). */
static int amx_on(void) {
#if HAVE_TILES
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, ask_for_tiles);
  return tiles_granted &&
         !atomic_load_explicit(&tiles_off, memory_order_relaxed) &&
         !atomic_load_explicit(&emulate_forced, memory_order_relaxed);
#else
  return 0;
#endif
}

int st_bf16_tiles(void) { return amx_on(); }

/* The instruction, unless forced off or measured slower while subnormals
 * are flushed: only then is the emulation's every bit the instruction's
 * (header), so that the choice, made from a timing, changes no result. */
static int native(void) {
#if defined(__AVX512BF16__)
  return !atomic_load_explicit(&emulate_forced, memory_order_relaxed) &&
         !(atomic_load_explicit(&emulate_preferred, memory_order_relaxed) &&
           st_fp_flush());
#else
  return 0;
#endif
}

int st_bf16_native(void) { return amx_on() || native(); }

const char *st_bf16_support(void) {
  if (amx_on()) return "AMX tiles (tdpbf16ps)";
#if defined(__AVX512BF16__)
  if (native()) return "AVX512-BF16 (vdpbf16ps)";
  if (!atomic_load_explicit(&emulate_forced, memory_order_relaxed))
    return "emulated (bf16 inputs, fp32 FMAs: the calibration profile "
           "measured them faster than this CPU's vdpbf16ps)";
#endif
  return "emulated (bf16 inputs, fp32 FMAs: no bf16 instructions in this "
         "build's target)";
}

/* ------------------------------------------------------------- rounding */

/* bf16 of x to nearest, ties to even, subnormals to a signed zero, NaN
 * quiet: the 16 bits, in the low half of the result. */
static uint32_t round_one(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0) return (u >> 16) & 0x8000u;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

INLINE u16 splat_u(uint32_t x) {
  return (u16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

/* round_one on 16 lanes. */
INLINE u16 round16(v16 x, int native) {
#if defined(__AVX512BF16__)
  if (native) /* the instruction: the same bits (header) */
    return (u16)_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh((__m512)x));
#else
  (void)native;
#endif
  u16 u = (u16)x;
  u16 mag = u & splat_u(0x7FFFFFFFu);
  u16 sub = (u & splat_u(0x7F800000u)) == 0; /* -1 where subnormal */
  u16 nan = mag > splat_u(0x7F800000u);
  u16 near = (u + splat_u(0x7FFFu) + ((u >> 16) & splat_u(1u))) >> 16;
  u16 r = (nan & ((u >> 16) | splat_u(0x40u))) | (~nan & near);
  return (sub & ((u >> 16) & splat_u(0x8000u))) | (~sub & r);
}

/* ---------------------------------------------------------------- packing */

/* One packed operand: `rows` rows (of op(A), or columns of op(B)) of
 * `pairs` pairs, element (r, k) at x[r * sr + k * sk], into panels of W
 * rows: out[(panel * stride + p) * W + r % W], or wide (WIDE_A) 2 W words a
 * pair. Rows past `rows` and k past `K` are zeros. */
typedef struct pack_job {
  const float *x;
  size_t sr, sk;
  int rows, K, k0, pairs, W, panels_per_task, panels;
  int stride; /* pairs a panel holds (>= pairs; the rest zeros) */
  uint32_t *out;
  int along_r; /* elements along r contiguous (sr 1), else along k */
  int native;  /* round with the instruction */
  int wide;    /* each pair as two floats (WIDE_A) */
  int rows_k;  /* AMX's A: each 16 x 16 block transposed, rows of pairs */
} pack_job;

/* The first n (<= 16) lanes of v to p, or from p (the rest zeros). (A
 * memcpy of a variable length became `rep movsl`: 39% of the packing's
 * time at 12 lanes.) */
INLINE void store_lanes(uint32_t *p, u16 v, int n) {
  if (n == 16) {
    *(u16 *)p = v;
    return;
  }
#if defined(__AVX512F__)
  _mm512_mask_storeu_epi32(p, (__mmask16)((1u << n) - 1), (__m512i)v);
#else
  for (int l = 0; l < n; l++) p[l] = v[l];
#endif
}

INLINE v16 load_lanes(const float *p, int n) {
  if (n == 16) return *(const v16 *)p;
#if defined(__AVX512F__)
  return (v16)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
#else
  v16 v = {0};
  for (int l = 0; l < n; l++) v[l] = p[l];
  return v;
#endif
}

/* With AVX-512 the emulation takes op(A) packed wide: for each pair, the W
 * rows' odd elements widened to fp32 (the bf16 bits in the high half), then
 * their even ones, 2 W floats, so that the kernel broadcasts each from
 * memory instead of widening it in a register: one integer operation less
 * per FMA on the ports the FMAs use (below). The values, and so the bits,
 * are the same. */
#if defined(__AVX512F__)
enum { WIDE_A = 1 };
#else
enum { WIDE_A = 0 };
#endif

/* 16 pairs t (lanes = rows) to a packed pair row at o: as they are, or
 * wide (o then holds 2 W floats: the odd ones, then the even ones). */
INLINE void put_pairs(const pack_job *j, uint32_t *o, int r, u16 t, int n) {
  if (!j->wide) {
    store_lanes(o + r, t, n);
    return;
  }
  store_lanes(o + r, t & splat_u(0xFFFF0000u), n);
  store_lanes(o + j->W + r, t << 16, n);
}

/* uint32s a packed pair row takes */
INLINE size_t row_words(const pack_job *j) {
  return (size_t)j->W * (j->wide ? 2 : 1);
}

#if defined(__AVX512F__)
/* Panels of 12 rows (op(A) transposed: a weight gradient's dY^T) four at a
 * time, 48 rows, three whole vectors a k row, over every pair before the
 * next four; returns the first panel left (pack_panels_r does the rest).
 * Pair by pair over all the task's panels (below), each pair's 48-byte
 * runs went to every panel at once, a few hundred partly written lines in
 * flight, and the masked loads straddled lines: 2.5-3.0 G elements/s on one
 * thread from a 2304 x 1024 operand in L3 on the Zen 5 VM of docs/bench.md,
 * 3.8 from L2, against 6-9 for the 32-column panels; four at a time 10.1
 * and 12.8 (this step pair by pair over all the panels: 2.0-2.2). The same
 * words. */
_Static_assert(MR == 12, "four 12-row panels are three vectors");

/* lanes shift .. shift + 15 of lo's 16 then hi's (VALIGND): a macro, as
 * the shift must be an immediate (without optimisation GCC's intrinsic is
 * itself a macro over the builtin) */
#define LANES_FROM(hi, lo, shift)                                              \
  ((u16)_mm512_alignr_epi32((__m512i)(hi), (__m512i)(lo), (shift)))

static int fours_r12(const pack_job *j, int first, int last) {
  size_t words = row_words(j), step = (size_t)j->stride * words;
  int four = first;
  for (; four + 4 <= last && (four + 4) * 12 <= j->rows; four += 4) {
    for (int p = 0; p < j->pairs; p++) {
      int k = j->k0 + 2 * p;
      const float *e = j->x + (size_t)k * j->sk + four * 12;
      const float *d = k + 1 < j->K ? e + j->sk : NULL;
      u16 t[3];
      for (int v = 0; v < 3; v++) {
        t[v] = round16(*(const v16 *)(e + 16 * v), j->native);
        if (d) t[v] |= round16(*(const v16 *)(d + 16 * v), j->native) << 16;
      }
      uint32_t *o = j->out + ((size_t)four * j->stride + p) * words;
      put_pairs(j, o, 0, t[0], 12);
      put_pairs(j, o + step, 0, LANES_FROM(t[1], t[0], 12), 12);
      put_pairs(j, o + 2 * step, 0, LANES_FROM(t[2], t[1], 8), 12);
      put_pairs(j, o + 3 * step, 0, LANES_FROM(t[2], t[2], 4), 12);
    }
  }
  return four;
}
#endif

/* Elements along r contiguous (sr == 1): two k rows interleaved, 16 r at a
 * time, for panels [first, last) row pair by row pair, so that the rows are
 * read in order (one 32-row panel at a time walked K rows apart, a page
 * apart at GPT-2's widths, and stalled on the loads); 12-row panels go
 * four at a time first (fours_r12), the rest as here. */
static void pack_panels_r(const pack_job *j, int first, int last) {
#if defined(__AVX512F__)
  if (j->W == 12) first = fours_r12(j, first, last);
#endif
  for (int p = 0; p < j->pairs; p++) {
    int k = j->k0 + 2 * p;
    const float *e = j->x + (size_t)k * j->sk;
    const float *d = k + 1 < j->K ? e + j->sk : NULL;
    for (int panel = first; panel < last; panel++) {
      uint32_t *op = j->out + ((size_t)panel * j->stride + p) * row_words(j);
      int r0 = panel * j->W, w = j->rows - r0 < j->W ? j->rows - r0 : j->W;
      for (int r = 0; r < j->W; r += 16) {
        int n = w - r < 16 ? (w - r > 0 ? w - r : 0) : 16;
        int lanes = j->W - r < 16 ? j->W - r : 16;
        u16 t = splat_u(0);
        if (n > 0) {
          t = round16(load_lanes(e + r0 + r, n), j->native);
          if (d) t |= round16(load_lanes(d + r0 + r, n), j->native) << 16;
        }
        put_pairs(j, op, r, t, lanes);
      }
    }
  }
}

/* The 16 x 16 transpose of r[0 .. 16): off-diagonal blocks of h x h
 * swapped for h = 8, 4, 2, 1 (each step two-source shuffles, VPERMT2D). */
#define LO(l, h) ((l) & (h) ? 16 + (l) - (h) : (l))
#define HI(l, h) ((l) & (h) ? 16 + (l) : (l) + (h))
#define LANES(F, h)                                                            \
  (u16) {                                                                      \
    F(0, h), F(1, h), F(2, h), F(3, h), F(4, h), F(5, h), F(6, h), F(7, h),    \
        F(8, h), F(9, h), F(10, h), F(11, h), F(12, h), F(13, h), F(14, h),    \
        F(15, h)                                                               \
  }

#define SWAP_STEP(h)                                                           \
  do {                                                                         \
    const u16 lo = LANES(LO, h), hi = LANES(HI, h);                            \
    for (int i = 0; i < 16; i++)                                               \
      if (!(i & (h))) {                                                        \
        u16 x = __builtin_shuffle(r[i], r[i + (h)], lo);                       \
        r[i + (h)] = __builtin_shuffle(r[i], r[i + (h)], hi);                  \
        r[i] = x;                                                              \
      }                                                                        \
  } while (0)

INLINE void transpose16(u16 r[16]) {
  SWAP_STEP(8);
  SWAP_STEP(4);
  SWAP_STEP(2);
  SWAP_STEP(1);
}

/* 16 floats from row e at pairs p .. p + 16 (32 floats) rounded into 16
 * pairs. */
INLINE u16 pairs16(const float *e, int native) {
  u16 a = round16(*(const v16 *)e, native);
  u16 b = round16(*(const v16 *)(e + 16), native);
  u16 even = __builtin_shuffle(
      a, b, (u16){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30});
  u16 odd = __builtin_shuffle(
      a, b, (u16){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
  return even | odd << 16;
}

/* Elements along k contiguous (sk == 1): a row's pairs are adjacent, so 16
 * rows' 16 pairs each are rounded in place order and transposed into 16
 * rows of the panel. */
static void pack_panel_k(const pack_job *j, int panel) {
  size_t words = row_words(j);
  uint32_t *o = j->out + (size_t)panel * j->stride * words;
  int r0 = panel * j->W, w = j->rows - r0 < j->W ? j->rows - r0 : j->W;
  int kn = j->K - j->k0 < 2 * j->pairs ? j->K - j->k0 : 2 * j->pairs;
  int vp = kn / 32 * 16; /* pairs done 16 at a time */
  for (int g = 0; g < j->W; g += 16) {
    int gw = j->W - g < 16 ? j->W - g : 16; /* panel rows in this group */
    for (int p = 0; p < vp; p += 16) {
      u16 r[16];
      for (int i = 0; i < 16; i++)
        r[i] =
            g + i < w
                ? pairs16(j->x + (size_t)(r0 + g + i) * j->sr + j->k0 + 2 * p,
                          j->native)
                : splat_u(0);
      transpose16(r);
      for (int q = 0; q < 16; q++)
        put_pairs(j, o + (size_t)(p + q) * words, g, r[q], gw);
    }
  }
  for (int r = 0; r < j->W; r++) {
    const float *e = j->x + (size_t)(r0 + r) * j->sr + j->k0;
    for (int p = vp; p < j->pairs; p++) {
      int k = 2 * p;
      uint32_t lo = r < w && k < kn ? round_one(e[k]) : 0;
      uint32_t hi = r < w && k + 1 < kn ? round_one(e[k + 1]) : 0;
      if (j->wide) {
        o[(size_t)p * words + r] = hi << 16;
        o[(size_t)p * words + j->W + r] = lo << 16;
      } else {
        o[(size_t)p * words + r] = lo | hi << 16;
      }
    }
  }
}

/* For AMX (W 16, not wide): the pairs past `pairs` zeroed up to the
 * stride, and for op(A) each 16 x 16 block, [p][row] as packed,
 * transposed to [row][p], the rows of pairs a tile of A takes. */
static void tile_panels(const pack_job *j, int first, int last) {
  for (int panel = first; panel < last; panel++) {
    uint32_t *o = j->out + (size_t)panel * j->stride * 16;
    memset(o + (size_t)j->pairs * 16, 0,
           (size_t)(j->stride - j->pairs) * 16 * sizeof *o);
    if (!j->rows_k) continue;
    for (int p = 0; p < j->stride; p += 16) {
      u16 r[16];
      for (int i = 0; i < 16; i++) r[i] = *(const u16 *)(o + (p + i) * 16);
      transpose16(r);
      for (int i = 0; i < 16; i++) *(u16 *)(o + (p + i) * 16) = r[i];
    }
  }
}

static void pack_task(void *arg, int task) {
  const pack_job *j = arg;
  int first = task * j->panels_per_task, last = first + j->panels_per_task;
  if (last > j->panels) last = j->panels;
  if (j->along_r)
    pack_panels_r(j, first, last);
  else
    for (int panel = first; panel < last; panel++) pack_panel_k(j, panel);
  if (j->stride > j->pairs || j->rows_k) tile_panels(j, first, last);
}

/* ---------------------------------------------------------------- kernel */

INLINE v16 fma16(v16 a, v16 b, v16 c) {
#if defined(__AVX512F__)
  return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__) /* two 8-lane halves (AVX2 + FMA: Zen 3, Haswell) */
  v16 r;
  __m256 *h = (__m256 *)&r;
  const __m256 *x = (const __m256 *)&a, *y = (const __m256 *)&b,
               *z = (const __m256 *)&c;
  h[0] = _mm256_fmadd_ps(x[0], y[0], z[0]);
  h[1] = _mm256_fmadd_ps(x[1], y[1], z[1]);
  return r;
#else
  v16 r;
  for (int l = 0; l < 16; l++) r[l] = fmaf(a[l], b[l], c[l]);
  return r;
#endif
}

/* c += the pair a (one 32-bit pair, broadcast) times the 16 pairs b: the
 * odd product first (header). */
INLINE v16 step_emulated(v16 c, u16 a, u16 b) {
  u16 hi = splat_u(0xFFFF0000u);
  c = fma16((v16)(a & hi), (v16)(b & hi), c);
  return fma16((v16)(a << 16), (v16)(b << 16), c);
}

typedef struct block_args {
  const uint32_t *a, *b; /* MR-row block and 32-column panel, `pairs` long */
  int pairs, rows, cols; /* the valid part of the MR x 32 block */
  float *c, *next;       /* next: the C block that follows, to prefetch */
  const float *bias;     /* the block's first column's, or NULL */
  int ldc;
  int first, last; /* of the K blocks */
  float alpha, beta;
} block_args;

/* Loads the block's accumulators: beta C on the first K block (none at
 * beta 0), the partial sums in C on later ones. */
INLINE void load_block(const block_args *g, v16 acc[MR][2]) {
  /* the next block's C, read or written by its kernel ~6,000 cycles from
   * now: left to the hardware, those misses were a tenth of the time */
  if (g->next)
    for (int i = 0; i < MR; i++) {
      __builtin_prefetch(g->next + (size_t)i * g->ldc, 1);
      __builtin_prefetch(g->next + (size_t)i * g->ldc + 16, 1);
    }
  for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = (v16){0};
  /* C = bias + op(A) op(B): the sums start from the bias */
  if (g->first && g->bias) {
    for (int i = 0; i < g->rows; i++) {
      if (g->cols == NR) {
        acc[i][0] = *(const v16 *)g->bias;
        acc[i][1] = *(const v16 *)(g->bias + 16);
      } else {
        for (int l = 0; l < g->cols; l++) acc[i][l / 16][l % 16] = g->bias[l];
      }
    }
    return;
  }
  if (g->first && g->beta == 0.0f) return;
  float scale = g->first ? g->beta : 1.0f;
  for (int i = 0; i < g->rows; i++) {
    const float *c = g->c + (size_t)i * g->ldc;
    if (g->cols == NR) {
      acc[i][0] = *(const v16 *)c;
      acc[i][1] = *(const v16 *)(c + 16);
    } else {
      for (int l = 0; l < g->cols; l++) acc[i][l / 16][l % 16] = c[l];
    }
    if (scale != 1.0f) {
      acc[i][0] *= scale;
      acc[i][1] *= scale;
    }
  }
}

INLINE void store_block(const block_args *g, v16 acc[MR][2]) {
  for (int i = 0; i < g->rows; i++) {
    float *c = g->c + (size_t)i * g->ldc;
    if (g->last && g->alpha != 1.0f) {
      acc[i][0] *= g->alpha;
      acc[i][1] *= g->alpha;
    }
    if (g->cols == NR) {
      *(v16 *)c = acc[i][0];
      *(v16 *)(c + 16) = acc[i][1];
    } else {
      for (int l = 0; l < g->cols; l++) c[l] = acc[i][l / 16][l % 16];
    }
  }
}

/* The register block, its loop over pairs written once per step kind. */
#define BLOCK_LOOP(STEP)                                                       \
  do {                                                                         \
    const uint32_t *a = g->a;                                                  \
    const u16 *b = (const u16 *)g->b;                                          \
    for (int p = 0; p < g->pairs; p++, a += MR, b += 2) {                      \
      u16 b0 = b[0], b1 = b[1];                                                \
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {                  \
        u16 ai = splat_u(a[i]);                                                \
        acc[i][0] = STEP(acc[i][0], ai, b0);                                   \
        acc[i][1] = STEP(acc[i][1], ai, b1);                                   \
      }                                                                        \
    }                                                                          \
  } while (0)

#if defined(__AVX512BF16__)
INLINE v16 step_native(v16 c, u16 a, u16 b) {
  return (v16)_mm512_dpbf16_ps((__m512)c, (__m512bh)a, (__m512bh)b);
}
static void block_native(const block_args *g) {
  v16 acc[MR][2];
  load_block(g, acc);
  BLOCK_LOOP(step_native);
  store_block(g, acc);
}
#endif

static void block_emulated(const block_args *g) {
  v16 acc[MR][2];
  load_block(g, acc);
  if (WIDE_A) { /* op(A) wide: a pair's odd floats, then its even ones */
    const f32_alias *a = (const f32_alias *)g->a;
    const u16 *b = (const u16 *)g->b;
    const u16 hi = splat_u(0xFFFF0000u);
    for (int p = 0; p < g->pairs; p++, a += 2 * MR, b += 2) {
      v16 b0o = (v16)(b[0] & hi), b0e = (v16)(b[0] << 16);
      v16 b1o = (v16)(b[1] & hi), b1e = (v16)(b[1] << 16);
      _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
        float o = a[i], e = a[MR + i];
        v16 ao = {o, o, o, o, o, o, o, o, o, o, o, o, o, o, o, o};
        v16 ae = {e, e, e, e, e, e, e, e, e, e, e, e, e, e, e, e};
        acc[i][0] = fma16(ae, b0e, fma16(ao, b0o, acc[i][0]));
        acc[i][1] = fma16(ae, b1e, fma16(ao, b1o, acc[i][1]));
      }
    }
  } else {
    BLOCK_LOOP(step_emulated);
  }
  store_block(g, acc);
}

/* ------------------------------------------------------------------ tiles */

/* Output tiles: rows in multiples of MR, columns of NR, so that register
 * blocks never straddle two tiles. The bits do not depend on the tiling
 * (header); it only spreads the work. choose_tiles sets how many tiles
 * and their largest size, halving the longer edge while there are fewer
 * than TILES tiles and a tile would keep at least MIN_TILE_FLOPS per K
 * block; share then cuts the edges evenly (no tile larger). A tile's rows
 * stay at most TILE_ROWS, so that its packed A
 * (TILE_ROWS x KC pairs, 384 KB; 768 KB wide) stays in L2 while it passes over
 * each 32-column panel (at 512 pairs, 96 rows measured no faster than 192,
 * 384 no faster either). */
enum { TILES = 16, MIN_TILE_FLOPS = 1 << 18, TILE_ROWS = 16 * MR };
/* Under AMX's tiles a tile of work keeps 32 times as many FLOPs: they run
 * about 15 times the FMAs' rate (docs/bf16.md), so a task of
 * MIN_TILE_FLOPS took a fraction of a microsecond, less than the pool's
 * hand-off. On the Intel Xeon VM of docs/bench.md (2026-12-02, 2
 * threads, a layer's three products, GFLOP/s, 2^18 against 2^23):
 * 64 x 256 x 256 309-311 against 433-451 (one thread alone: 485), 64 x
 * 128 x 128 155-163 against 341-373, 64 x 10 x 256 39 against 79-85,
 * 64 x 256 x 3136 unchanged (522-538 against 533-537); `bench_mlp 32 2`
 * in bf16 102-108k samples/s against 131-138k (fp32 117k), at 256
 * unchanged; fc_mnist trained in bf16 133-180k against 201-206k
 * samples/s; `bench_gpt 124m 4 2` bf16 and gpt_tiny unchanged. */
enum { AMX_MIN_TILE_FLOPS = 1 << 23 };

static int round_to(int x, int m) { return (x + m - 1) / m * m; }
static int count(int total, int tile) { return (total + tile - 1) / tile; }

/* mr x nr: the register block (MR x NR), or AMX's 32 x 32 block of tiles
 * with at most 256 rows a tile (their packed A, 256 KB, in L2). */
static void choose_tiles(int M, int N, int kc, int mr, int nr, int max_rows,
                         double min_flops, int *tm, int *tn) {
  *tm = round_to(M, mr), *tn = round_to(N, nr);
  while (*tm > max_rows) *tm = round_to((*tm + 1) / 2, mr);
  while (count(M, *tm) * count(N, *tn) < TILES) {
    int rows = *tm >= 2 * mr && (*tm >= *tn || *tn < 2 * nr);
    int h = rows ? round_to((*tm + 1) / 2, mr) : round_to((*tn + 1) / 2, nr);
    if ((!rows && *tn < 2 * nr) ||
        4.0 * kc * h * (rows ? *tn : *tm) < min_flops)
      return;
    *(rows ? tm : tn) = h;
  }
}

typedef struct bf16_job {
  int M, N, pairs, first, last, native, wide;
  int tiles_m, tiles_n; /* output tiles: rows, columns */
  int gm, gn;  /* tile edges in multiples of gm rows (MR, or 32 under AMX)
                  and gn columns (NR, or 32): share */
  int stride;  /* AMX: pairs a packed panel holds, a multiple of 16 */
  int bstride; /* pairs from one packed 32-column panel of op(B) to the next */
  float alpha, beta;
  const uint32_t *a, *b; /* this K block, packed */
  const float *bias;     /* NULL, or the sums start from it (beta 1) */
  float *C;
  int ldc;
} bf16_job;

/* Piece i of n of `total` in whole granules of g: the granules shared out
 * so that pieces differ by one at most. The pool gives each thread a run of
 * consecutive tiles (pool.c), so tiles of choose_tiles's fixed size left the
 * short last row of tiles to one of them: at 1024 rows, 7 tiles of 11 rows
 * of register blocks and one of 9, each thread's half 88 rows of blocks
 * against 84, the other waiting on the difference (docs/bench.md,
 * 2026-12-02, forty-first session). */
static void share(int i, int n, int total, int g, int *lo, int *hi) {
  long long units = count(total, g);
  *lo = (int)(i * units / n) * g;
  *hi = (int)((i + 1) * units / n) * g;
  if (*hi > total) *hi = total;
}

static void tile_span(const bf16_job *j, int t, int *i0, int *i1, int *j0,
                      int *j1) {
  share(t / j->tiles_n, j->tiles_m, j->M, j->gm, i0, i1);
  share(t % j->tiles_n, j->tiles_n, j->N, j->gn, j0, j1);
}

static void tile_task(void *arg, int t) {
  const bf16_job *j = arg;
  int i0, i1, j0, j1;
  tile_span(j, t, &i0, &i1, &j0, &j1);
  block_args g = {0};
  g.pairs = j->pairs, g.ldc = j->ldc, g.first = j->first, g.last = j->last;
  g.alpha = j->alpha, g.beta = j->beta;
  for (int c0 = j0; c0 < j1; c0 += NR) {
    g.b = j->b + (size_t)(c0 / NR) * j->bstride * NR;
    g.cols = j1 - c0 < NR ? j1 - c0 : NR;
    g.bias = j->bias ? j->bias + c0 : NULL;
    for (int r0 = i0; r0 < i1; r0 += MR) {
      g.a = j->a + (size_t)(r0 / MR) * j->pairs * MR * (j->wide ? 2 : 1);
      g.rows = i1 - r0 < MR ? i1 - r0 : MR;
      g.c = j->C + (size_t)r0 * j->ldc + c0;
      g.next = r0 + 2 * MR <= i1 ? g.c + (size_t)MR * j->ldc : NULL;
#if defined(__AVX512BF16__)
      if (j->native) {
        block_native(&g);
        continue;
      }
#endif
      block_emulated(&g);
    }
  }
}

/* ------------------------------------------------------------ AMX tiles */

#if HAVE_TILES
/* A block of up to 2 x 2 tiles of 16 x 16 outputs: C in tiles 0-3 (row
 * tile ti, column tile tj at 2 ti + tj), op(A)'s two row tiles in 4 and
 * 5, op(B)'s two column tiles in 6 and 7. A K step is 16 pairs: one
 * TDPBF16PS per C tile, 16 x 16 x 32 products. Tile numbers are
 * immediates, hence the macros. */
typedef struct tile_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_cfg;

typedef struct amx_block {
  const uint32_t *a, *b;   /* the block's first row and column panels */
  size_t panel_a, panel_b; /* words to the next panel */
  int steps, rows, cols;   /* K steps; the valid rows and columns (<= 32) */
  float *c;
  int ldc, first, last;
  float alpha, beta;
  float tmp[4][16 * 16]; /* a partial C tile, or one scaled */
} amx_block;

/* The valid rows of row tile ti, and columns of column tile tj (<= 16). */
static int tile_rows(const amx_block *g, int ti) {
  return g->rows - 16 * ti < 16 ? g->rows - 16 * ti : 16;
}
static int tile_cols(const amx_block *g, int tj) {
  return g->cols - 16 * tj < 16 ? g->cols - 16 * tj : 16;
}

/* Where C tile (ti, tj) is loaded from: C itself where whole and not to
 * be scaled, else tmp holding it (zero-padded, times beta on the first K
 * block); NULL for zeros (beta 0, first block). *ld: its stride, bytes. */
static const float *c_source(amx_block *g, int ti, int tj, size_t *ld) {
  if (g->first && g->beta == 0.0f) return NULL;
  int r = tile_rows(g, ti), n = tile_cols(g, tj);
  float scale = g->first ? g->beta : 1.0f;
  const float *c = g->c + (size_t)16 * ti * g->ldc + 16 * tj;
  if (r == 16 && n == 16 && scale == 1.0f) {
    *ld = (size_t)g->ldc * sizeof(float);
    return c;
  }
  float *t = g->tmp[2 * ti + tj];
  memset(t, 0, sizeof g->tmp[0]);
  for (int i = 0; i < r; i++)
    for (int l = 0; l < n; l++)
      t[16 * i + l] = c[(size_t)i * g->ldc + l] * scale;
  *ld = 16 * sizeof(float);
  return t;
}

/* Where C tile (ti, tj) is stored to: C where whole and not to be scaled,
 * else tmp, copied out by c_finish. */
static float *c_target(amx_block *g, int ti, int tj, size_t *ld) {
  int r = tile_rows(g, ti), n = tile_cols(g, tj);
  if (r == 16 && n == 16 && !(g->last && g->alpha != 1.0f)) {
    *ld = (size_t)g->ldc * sizeof(float);
    return g->c + (size_t)16 * ti * g->ldc + 16 * tj;
  }
  *ld = 16 * sizeof(float);
  return g->tmp[2 * ti + tj];
}

static void c_finish(amx_block *g, int ti, int tj, const float *t) {
  if (t != g->tmp[2 * ti + tj]) return;
  int r = tile_rows(g, ti), n = tile_cols(g, tj);
  float scale = g->last ? g->alpha : 1.0f;
  float *c = g->c + (size_t)16 * ti * g->ldc + 16 * tj;
  for (int i = 0; i < r; i++)
    for (int l = 0; l < n; l++)
      c[(size_t)i * g->ldc + l] =
          scale == 1.0f ? t[16 * i + l] : t[16 * i + l] * scale;
}

/* GCC 12's _tile_loadd is an asm that names no memory, so stores before
 * it (tmp, C, the packed panels) could legally move past it: a compiler
 * barrier before the loads of memory just written. */
#define WRITTEN() __asm__ volatile("" ::: "memory")

#define C_LOAD(T, ti, tj)                                                      \
  do {                                                                         \
    size_t ld = 0;                                                             \
    const float *src = c_source(g, ti, tj, &ld);                               \
    WRITTEN();                                                                 \
    if (src)                                                                   \
      _tile_loadd(T, src, ld);                                                 \
    else                                                                       \
      _tile_zero(T);                                                           \
  } while (0)

#define C_STORE(T, ti, tj)                                                     \
  do {                                                                         \
    size_t ld = 0;                                                             \
    float *dst = c_target(g, ti, tj, &ld);                                     \
    _tile_stored(T, dst, ld);                                                  \
    c_finish(g, ti, tj, dst);                                                  \
  } while (0)

static void amx_block_run(amx_block *g) {
  int two_r = g->rows > 16, two_c = g->cols > 16;
  WRITTEN(); /* the packed panels, C */
  C_LOAD(0, 0, 0);
  if (two_c) C_LOAD(1, 0, 1);
  if (two_r) C_LOAD(2, 1, 0);
  if (two_r && two_c) C_LOAD(3, 1, 1);
  const uint32_t *a = g->a, *b = g->b;
  for (int s = 0; s < g->steps; s++, a += 256, b += 256) {
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (two_c) {
      _tile_loadd(7, b + g->panel_b, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (two_r) {
      _tile_loadd(5, a + g->panel_a, 64);
      _tile_dpbf16ps(2, 5, 6);
      if (two_c) _tile_dpbf16ps(3, 5, 7);
    }
  }
  C_STORE(0, 0, 0);
  if (two_c) C_STORE(1, 0, 1);
  if (two_r) C_STORE(2, 1, 0);
  if (two_r && two_c) C_STORE(3, 1, 1);
}

/* The calling thread's 8 tiles, each 16 rows of 64 bytes (palette 1);
 * _tile_release after. A constant object: GCC 12's _tile_loadconfig tells
 * the compiler that LDTILECFG reads 8 bytes of its 64, and a build of one
 * on the stack lost its stores past them once the function was inlined
 * (the tiles unconfigured: SIGILL at the first TILEZERO). */
static const tile_cfg tiles_16x64
    __attribute__((aligned(64))) = {.palette = 1,
                                    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                    .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

static void configure_tiles(void) { _tile_loadconfig(&tiles_16x64); }

/* One output tile of the job: its rows 32 at a time (their 2 panels of A,
 * 32 KB per 256 pairs, stay in L1) over its columns 32 at a time. */
static void amx_task(void *arg, int t) {
  const struct bf16_job *j = arg;
  int i0, i1, j0, j1;
  tile_span(j, t, &i0, &i1, &j0, &j1);
  configure_tiles();
  amx_block g;
  g.panel_a = g.panel_b = (size_t)j->stride * 16;
  g.steps = j->stride / 16, g.ldc = j->ldc, g.first = j->first;
  g.last = j->last, g.alpha = j->alpha, g.beta = j->beta;
  for (int r0 = i0; r0 < i1; r0 += 32)
    for (int c0 = j0; c0 < j1; c0 += 32) {
      g.a = j->a + (size_t)(r0 / 16) * g.panel_a;
      g.b = j->b + (size_t)(c0 / 16) * g.panel_b;
      g.rows = i1 - r0 < 32 ? i1 - r0 : 32;
      g.cols = j1 - c0 < 32 ? j1 - c0 : 32;
      g.c = j->C + (size_t)r0 * j->ldc + c0;
      amx_block_run(&g);
    }
  _tile_release(); /* the thread's tile state back to its initial one */
}
#endif

/* ------------------------------------------------------------------ entry */

#if HAVE_TILES
/* The tiles' product without the scratch: one 16 x 16 tile of C at a time,
 * its panels of op(A) and op(B) packed on the stack (16 KB each) for each K
 * block, the K blocks those of st_gemm_bf16. Each element takes the same
 * tile steps from the same sums as there, so the same bits, slowly. */
static void gemm_tiles_alone(int trans_a, int trans_b, int M, int N, int K,
                             float alpha, const float *A, int lda,
                             const float *B, int ldb, float beta, float *C,
                             int ldc) {
  _Static_assert(AMX_KC % 16 == 0, "a K block is whole tile steps");
  uint32_t pa[16 * AMX_KC], pb[16 * AMX_KC];
  configure_tiles();
  amx_block g;
  g.ldc = ldc, g.alpha = alpha, g.beta = beta, g.panel_a = g.panel_b = 0;
  for (int i0 = 0; i0 < M; i0 += 16)
    for (int j0 = 0; j0 < N; j0 += 16)
      for (int k0 = 0; k0 < K; k0 += 2 * AMX_KC) {
        int pairs = (K - k0 + 1) / 2 < AMX_KC ? (K - k0 + 1) / 2 : AMX_KC;
        int stride = round_to(pairs, 16);
        pack_job a = {.x = trans_a ? A + i0 : A + (size_t)i0 * lda,
                      .sr = trans_a ? 1 : (size_t)lda,
                      .sk = trans_a ? (size_t)lda : 1,
                      .rows = M - i0,
                      .K = K,
                      .k0 = k0,
                      .pairs = pairs,
                      .W = 16,
                      .panels_per_task = 1,
                      .panels = 1,
                      .stride = stride,
                      .out = pa,
                      .along_r = trans_a,
                      .native = native(),
                      .rows_k = 1};
        pack_job b = a;
        b.x = trans_b ? B + (size_t)j0 * ldb : B + j0;
        b.sr = trans_b ? (size_t)ldb : 1, b.sk = trans_b ? 1 : (size_t)ldb;
        b.rows = N - j0, b.out = pb, b.along_r = !trans_b, b.rows_k = 0;
        pack_task(&a, 0);
        pack_task(&b, 0);
        g.a = pa, g.b = pb, g.steps = stride / 16;
        g.rows = M - i0 < 16 ? M - i0 : 16, g.cols = N - j0 < 16 ? N - j0 : 16;
        g.c = C + (size_t)i0 * ldc + j0;
        g.first = k0 == 0, g.last = k0 + 2 * AMX_KC >= K;
        amx_block_run(&g);
      }
  _tile_release();
}
#endif

/* The definition, one element at a time: where the scratch cannot be had. */
static void gemm_plain(int trans_a, int trans_b, int M, int N, int K,
                       float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int n = 0; n < N; n++) {
      float *c = C + (size_t)i * ldc + n;
      /* alpha 1: the chain starts from beta C; else from 0, and beta C is
       * added to alpha times it */
      float s = beta == 0.0f || alpha != 1.0f ? 0.0f : beta * *c;
      for (int k = 0; k < K; k += 2) {
        float a[2] = {0, 0}, b[2] = {0, 0};
        for (int h = 0; h < 2 && k + h < K; h++) {
          int kk = k + h;
          a[h] = st_bf16_to((uint16_t)round_one(
              trans_a ? A[(size_t)kk * lda + i] : A[(size_t)i * lda + kk]));
          b[h] = st_bf16_to((uint16_t)round_one(
              trans_b ? B[(size_t)n * ldb + kk] : B[(size_t)kk * ldb + n]));
        }
        s = fmaf(a[1], b[1], s);
        s = fmaf(a[0], b[0], s);
      }
      if (alpha != 1.0f) s = beta == 0.0f ? s * alpha : s * alpha + beta * *c;
      *c = s;
    }
}

typedef struct pack_both {
  pack_job a, b;
  int tasks_a;
} pack_both;

static void pack_both_task(void *arg, int task) {
  pack_both *pb = arg;
  if (task < pb->tasks_a)
    pack_task(&pb->a, task);
  else
    pack_task(&pb->b, task - pb->tasks_a);
}

/* Splits `panels` panels into about `parts` tasks. */
static int tasks_for(pack_job *j, int parts) {
  j->panels_per_task = count(j->panels, parts);
  return count(j->panels, j->panels_per_task);
}

/* C's rows set to the bias (the start of st_gemm_bias's sums where the
 * kernel does not start from it itself). */
static void fill_bias(const float *bias, int M, int N, float *C, int ldc) {
  for (int i = 0; i < M; i++)
    memcpy(C + (size_t)i * ldc, bias, (size_t)N * sizeof *C);
}

/* st_gemm_bf16, or with bias (alpha 1, beta 1) C = bias + op(A) op(B):
 * each sum starting from the bias, the bits of C filled with it and beta 1
 * (header), without the pass over C that filling it took: on the main
 * thread alone, about a twentieth of a GPT-2 bf16 layer's time. */
static void gemm_run(st_pool *pool, int trans_a, int trans_b, int M, int N,
                     int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc,
                     const float *bias) {
  if (M <= 0 || N <= 0) return;
  if (bias && (K <= 0 || (alpha != 1.0f || beta != 1.0f))) {
    fill_bias(bias, M, N, C, ldc);
    bias = NULL;
  }
  if (K <= 0 || alpha == 0.0f) { /* C = beta C */
    for (int i = 0; i < M; i++)
      for (int n = 0; n < N; n++) {
        float *c = C + (size_t)i * ldc + n;
        *c = beta == 0.0f ? 0.0f : beta * *c;
      }
    return;
  }
  if (alpha != 1.0f && beta != 0.0f) {
    /* alpha (op(A) op(B)) + beta C: no caller asks it of the kernel, which
     * scales only a sum that starts from 0; a product aside, then added */
    float *t = st_alloc((size_t)M * N * sizeof *t);
    if (t) {
      st_gemm_bf16(pool, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f,
                   t, N);
      for (int i = 0; i < M; i++)
        for (int n = 0; n < N; n++)
          C[(size_t)i * ldc + n] =
              t[(size_t)i * N + n] + beta * C[(size_t)i * ldc + n];
      st_free(t);
      return;
    }
  }
  /* chunks of at most CHUNK rows and columns, so that the packing buffer
   * stays under (2 CHUNK) x KC pairs (16 MB; 24 MB with op(A) wide)
   * whatever the shape: GPT-2's
   * output head (50,257 columns) in one piece would pack 51 MB */
  if (M > CHUNK || N > CHUNK) {
    for (int i0 = 0; i0 < M; i0 += CHUNK)
      for (int j0 = 0; j0 < N; j0 += CHUNK)
        gemm_run(pool, trans_a, trans_b, M - i0 < CHUNK ? M - i0 : CHUNK,
                 N - j0 < CHUNK ? N - j0 : CHUNK, K, alpha,
                 trans_a ? A + i0 : A + (size_t)i0 * lda, lda,
                 trans_b ? B + (size_t)j0 * ldb : B + j0, ldb, beta,
                 C + (size_t)i0 * ldc + j0, ldc, bias ? bias + j0 : NULL);
    return;
  }
  /* AMX: panels of 16 rows or columns, each K block's pairs padded with
   * zeros to whole K steps of 16 */
  int amx = 0;
#if HAVE_TILES
  amx = amx_on();
#endif
  int kcap = amx ? AMX_KC : KC;
  int pairs_all = (K + 1) / 2, kc = pairs_all < kcap ? pairs_all : kcap;
  int mr = amx ? 16 : MR, nr = amx ? 16 : NR, kcs = amx ? round_to(kc, 16) : kc;
  int panels_a = count(M, mr), panels_b = count(N, nr);
  int nat = native(), wide = WIDE_A && !nat && !amx;
  size_t words_a = (size_t)panels_a * mr * kcs * (wide ? 2 : 1);
  uint32_t *buf = st_thread_scratch(ST_SCRATCH_BF16,
                                    (words_a + (size_t)panels_b * nr * kcs) *
                                        sizeof(uint32_t));
  int plain = atomic_load_explicit(&plain_forced, memory_order_relaxed);
  if (bias && (amx || !buf || plain)) {
    fill_bias(bias, M, N, C, ldc); /* the tiles load C; the paths below too */
    bias = NULL;
  }
  if (!buf || (alpha != 1.0f && beta != 0.0f) || plain) {
#if HAVE_TILES
    if (amx && !(alpha != 1.0f && beta != 0.0f)) { /* the tiles' bits */
      gemm_tiles_alone(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                       C, ldc);
      return;
    }
#endif
    gemm_plain(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int threads = st_pool_threads(pool) > 0 ? st_pool_threads(pool) : 1;
  bf16_job j = {0};
  j.M = M, j.N = N, j.alpha = alpha, j.beta = beta, j.C = C, j.ldc = ldc;
  j.native = nat, j.wide = wide, j.bias = bias;
  int tm, tn;
  j.gm = amx ? 32 : MR, j.gn = amx ? 32 : NR;
  choose_tiles(M, N, kc, j.gm, j.gn, amx ? 256 : TILE_ROWS,
               amx ? AMX_MIN_TILE_FLOPS : MIN_TILE_FLOPS, &tm, &tn);
  j.tiles_m = count(M, tm), j.tiles_n = count(N, tn);
  int tiles = j.tiles_m * j.tiles_n;
  pack_both pb;
  pb.a = (pack_job){.x = A,
                    .rows = M,
                    .K = K,
                    .W = mr,
                    .panels = panels_a,
                    .out = buf,
                    .along_r = trans_a,
                    .native = nat,
                    .wide = wide,
                    .rows_k = amx};
  pb.a.sr = trans_a ? 1 : (size_t)lda, pb.a.sk = trans_a ? (size_t)lda : 1;
  pb.b = (pack_job){.x = B,
                    .rows = N,
                    .K = K,
                    .W = nr,
                    .panels = panels_b,
                    .out = buf + words_a,
                    .along_r = !trans_b,
                    .native = nat};
  pb.b.sr = trans_b ? (size_t)ldb : 1, pb.b.sk = trans_b ? 1 : (size_t)ldb;
  if (tiles == 1 || threads == 1) pool = NULL;
  for (int k0 = 0; k0 < K; k0 += 2 * kc) {
    int pairs = (K - k0 + 1) / 2 < kc ? (K - k0 + 1) / 2 : kc;
    pb.a.k0 = pb.b.k0 = k0;
    pb.a.pairs = pb.b.pairs = pairs;
    pb.a.stride = pb.b.stride = j.stride = amx ? round_to(pairs, 16) : pairs;
    j.bstride = pairs;
    pb.tasks_a = tasks_for(&pb.a, 2 * threads);
    int tasks_b = tasks_for(&pb.b, 2 * threads);
    st_pool_for(pool, pb.tasks_a + tasks_b, pack_both_task, &pb);
    j.pairs = pairs;
    j.a = pb.a.out, j.b = pb.b.out;
    j.first = k0 == 0, j.last = k0 + 2 * kc >= K;
#if HAVE_TILES
    if (amx) {
      st_pool_for(pool, tiles, amx_task, &j);
      continue;
    }
#endif
    st_pool_for(pool, tiles, tile_task, &j);
  }
}

void st_gemm_bf16(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
                  float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc) {
  gemm_run(pool, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
           NULL);
}

void st_gemm_bf16_bias(st_pool *pool, int trans_a, int trans_b, int M, int N,
                       int K, const float *A, int lda, const float *B, int ldb,
                       const float *bias, float *C, int ldc) {
  gemm_run(pool, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc,
           bias);
}

/* ------------------------------------- op(B) packed once, taken often */

/* Attention multiplies each head's keys and values into every row block's
 * products, as op(B) of a prefix [0, i1): packed again each time, at T = 256
 * 4.5 times each, the packing took more than a third of a bf16 attention
 * on the Zen 5 VM of docs/bench.md. Packed once (st_bf16_pack_panels), a
 * product takes their first N columns and K rows as they lie. One K block,
 * so K at most 2 KC, and not under AMX's tiles (their own panels): there
 * st_bf16_panels_words is 0 and the products pack as usual. */
size_t st_bf16_panels_words(int N, int K) {
  if (N <= 0 || K <= 0 || (K + 1) / 2 > KC || amx_on()) return 0;
  return (size_t)count(N, NR) * NR * (size_t)((K + 1) / 2);
}

/* All of an operand's rows (of op(A), or columns of op(B)) and K in one
 * K block, on the calling thread: element (r, k) at x[r * ld + k], or with
 * along_r at x[k * ld + r]. */
static void pack_whole(const float *x, int ld, int along_r, int rows, int K,
                       int W, int wide, uint32_t *out) {
  int pairs = (K + 1) / 2;
  pack_job j = {.x = x,
                .sr = along_r ? 1 : (size_t)ld,
                .sk = along_r ? (size_t)ld : 1,
                .rows = rows,
                .K = K,
                .pairs = pairs,
                .stride = pairs,
                .W = W,
                .panels = count(rows, W),
                .out = out,
                .along_r = along_r,
                .native = native(),
                .wide = wide};
  j.panels_per_task = j.panels;
  pack_task(&j, 0);
}

void st_bf16_pack_panels(int trans_b, int N, int K, const float *B, int ldb,
                         uint32_t *panels) {
  pack_whole(B, ldb, !trans_b, N, K, NR, 0, panels);
}

void st_gemm_bf16_panels(int trans_a, int trans_b, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B,
                         int ldb, const uint32_t *panels, int panels_K,
                         float beta, float *C, int ldc) {
  int pairs = (K + 1) / 2;
  /* the panels hold K's rows and zeros past panels_K: a prefix of odd K
   * would take row K where the product pads with a zero */
  int fits = panels && M > 0 && N > 0 && K > 0 && K <= panels_K &&
             (K % 2 == 0 || K == panels_K) && (panels_K + 1) / 2 <= KC &&
             alpha != 0.0f && !(alpha != 1.0f && beta != 0.0f) && M <= CHUNK &&
             !amx_on() &&
             !atomic_load_explicit(&plain_forced, memory_order_relaxed);
  int nat = native(), wide = WIDE_A && !nat;
  size_t words_a = (size_t)count(M, MR) * MR * pairs * (wide ? 2 : 1);
  uint32_t *buf =
      fits ? st_thread_scratch(ST_SCRATCH_BF16, words_a * sizeof *buf) : NULL;
  if (!buf) {
    st_gemm_bf16(NULL, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                 C, ldc);
    return;
  }
  pack_whole(A, lda, trans_a, M, K, MR, wide, buf);
  bf16_job j = {0};
  j.M = M, j.N = N, j.alpha = alpha, j.beta = beta, j.C = C, j.ldc = ldc;
  j.native = nat, j.wide = wide;
  j.tiles_m = j.tiles_n = 1, j.gm = MR, j.gn = NR;
  j.pairs = j.stride = pairs, j.bstride = (panels_K + 1) / 2;
  j.a = buf, j.b = panels, j.first = j.last = 1;
  tile_task(&j, 0);
}

/* ----------------------------------------- activations kept as bf16 */

/* Chunks of 16K elements (a multiple of 16) by length alone, on the pool;
 * every element is converted alone, so the chunking changes no bit. */
enum { CONVERT_CHUNK = 1 << 14 };

typedef struct keep_job {
  const float *x;
  const uint16_t *hin;
  uint16_t *h;
  float *out;
  size_t n;
  int native;
} keep_job;

static void keep_task(void *arg, int task) {
  const keep_job *j = arg;
  size_t lo = (size_t)task * CONVERT_CHUNK,
         hi = j->n - lo < CONVERT_CHUNK ? j->n : lo + CONVERT_CHUNK, i = lo;
  for (; i + 16 <= hi; i += 16) {
    u16 r = round16(*(const v16 *)(j->x + i), j->native);
    for (int l = 0; l < 16; l++) j->h[i + l] = (uint16_t)r[l];
  }
  for (; i < hi; i++) j->h[i] = (uint16_t)round_one(j->x[i]);
}

/* (Through the job's pointers the loop reloaded j->out each element and
 * ran one at a time: 0.9% of a GPT-2 bf16 step. Restrict locals let it
 * widen 16 at a time.) */
static void unkeep_task(void *arg, int task) {
  const keep_job *j = arg;
  size_t lo = (size_t)task * CONVERT_CHUNK,
         hi = j->n - lo < CONVERT_CHUNK ? j->n : lo + CONVERT_CHUNK;
  const uint16_t *restrict h = j->hin;
  float *restrict out = j->out;
  for (size_t i = lo; i < hi; i++) {
    uint32_t u = (uint32_t)h[i] << 16;
    memcpy(out + i, &u, sizeof u);
  }
}

static int convert_tasks(size_t n) {
  return (int)((n + CONVERT_CHUNK - 1) / CONVERT_CHUNK);
}

void st_bf16_pack_as_gemm(st_pool *pool, const float *x, uint16_t *h,
                          size_t n) {
  keep_job j = {x, NULL, h, NULL, n, native()};
  st_pool_for(pool, convert_tasks(n), keep_task, &j);
}

void st_bf16_round_as_gemm(const float *x, float *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = round_one(x[i]) << 16;
    memcpy(out + i, &u, sizeof u);
  }
}

void st_bf16_unpack_pool(st_pool *pool, const uint16_t *h, float *x, size_t n) {
  keep_job j = {NULL, h, NULL, x, n, 0};
  st_pool_for(pool, convert_tasks(n), unkeep_task, &j);
}
