/*
 * strata.h — the one public header of strata, a neural-network training engine.
 *
 * Data flow (DESIGN.md): config (YAML) -> model spec -> model (blocks, one
 * parameter slab each) -> executor (mode) -> metrics, checkpoints.
 * Sections below follow the modules under src/: base, tensor, config, ops,
 * model, optim, data, io, exec.
 *
 * Conventions: functions return 0 or a negative ST_E... code and fill an
 * st_error; creators are st_x_create / st_x_destroy pairs; kernels take raw
 * float pointers with explicit sizes (B = batch, C = channels, H/W = height and
 * width, IC/OC = input/output channels or features).
 */
#ifndef STRATA_H
#define STRATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ base */

/* One table for error codes and their text (X-macro, as libuv's errno map). */
#define ST_ERROR_MAP(X)                                                        \
  X(OK, 0, "ok")                                                               \
  X(NOMEM, -1, "out of memory")                                                \
  X(IO, -2, "i/o error")                                                       \
  X(CONFIG, -3, "invalid configuration")                                       \
  X(SHAPE, -4, "impossible shape")                                             \
  X(DATA, -5, "invalid data")                                                  \
  X(FORMAT, -6, "invalid file format")                                         \
  X(NONFINITE, -7, "non-finite value")                                         \
  X(ARG, -8, "invalid argument")                                               \
  X(UNSUPPORTED, -9, "unsupported")

typedef enum {
#define ST_ERROR_ENUM(name, value, text) ST_E##name = value,
  ST_ERROR_MAP(ST_ERROR_ENUM)
#undef ST_ERROR_ENUM
} st_error_code;

typedef struct st_error {
  int code;       /* ST_E... */
  char msg[1024]; /* one line: where (file:line:col, key, tensor) and why */
} st_error;

/* Fills err (may be NULL) with a printf-style message; returns code. */
int st_error_set(st_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The table's text for a code ("invalid configuration"). */
const char *st_error_text(int code);

/* Memory: 64-byte aligned, zero-filled. Every tensor-sized buffer (weights,
 * gradients, optimizer state, activations, data) comes from here, and a test
 * proves with st_alloc_count that steady-state training allocates nothing;
 * small descriptors (model layout, file headers) use malloc, never inside a
 * step. Returns NULL on failure. */
void *st_alloc(size_t bytes);
void st_free(void *p);
uint64_t st_alloc_count(void); /* number of st_alloc calls so far */
/* Bytes held now by st_alloc and committed slab ranges, and the most held
 * at once since the process started (or st_alloc_reset_peak): what a rank
 * of a run over MPI measures against its plan. */
size_t st_alloc_bytes(void);
/* What st_alloc_bytes counts for one st_alloc of `bytes`: the request
 * rounded up to 64 (a small buffer's usable size may add a few more). */
size_t st_alloc_counted(size_t bytes);
size_t st_alloc_peak(void);
void st_alloc_reset_peak(void);
/* The calling thread's buffer number `slot` (ST_SCRATCH_*), at least
 * `bytes` long: kept from call to call and grown when asked for more (so
 * a step allocates nothing once its shapes have run once), freed when the
 * thread ends; NULL if memory ran out. Its contents are the caller's until
 * the next call for the same slot on the same thread. The kernels' own. */
enum {
  ST_SCRATCH_GEMV,   /* gemm.c: one-row products' partials */
  ST_SCRATCH_COPY_A, /* narrow.c: op(A) copied out in panels */
  ST_SCRATCH_BF16,   /* gemm_bf16.c: the packed operands */
  ST_SCRATCH_HEADS,  /* attention.c: a head's keys and values packed */
  ST_SCRATCH_SLOTS
};
void *st_thread_scratch(int slot, size_t bytes);

/* A slab of which a process holds only some ranges: the weights, gradients
 * or optimizer state of a model whose blocks are spread over MPI ranks,
 * indexed by the model's slab offsets on every rank. The whole size is
 * reserved as address space and nothing is backed; st_slab_commit makes a
 * range readable and writable (zero-filled, counted, rounded out to whole
 * pages), and touching any other offset faults, so a rank that reached for
 * another rank's weights would crash, not read zeros. Commits must come in
 * increasing offset order. */
typedef struct st_slab {
  void *base;
  size_t bytes;     /* reserved */
  size_t committed; /* bytes backed (whole pages) */
  size_t end;       /* the end of the last committed page */
} st_slab;
int st_slab_reserve(st_slab *s, size_t bytes);
int st_slab_commit(st_slab *s, size_t off, size_t n);
void st_slab_release(st_slab *s);

/* Subnormal numbers (below FLT_MIN) flushed to zero or kept (fpmode.c):
 * one process-wide mode that every thread computing for a run applies when
 * it takes up work. st_fp_set_flush sets it (and applies it to the calling
 * thread); st_trainer_create sets it from train.flush_subnormals. The
 * process starts with IEEE subnormals kept. */
void st_fp_set_flush(int flush);
int st_fp_flush(void);
/* Applies the process-wide mode to the calling thread. */
void st_fp_apply(void);
/* Whether the calling thread flushes now (reads its mode register). */
int st_fp_thread_flushes(void);
/* How this CPU flushes ("x86 MXCSR FTZ+DAZ"), or "none (...)". */
const char *st_fp_flush_support(void);

/* Monotonic clock in seconds. */
double st_now(void);

/* A persistent thread pool; the calling thread takes part. st_pool_for runs
 * fn(arg, task) for task in [0, ntasks); which thread runs which task is not
 * fixed, so tasks must write disjoint memory. A NULL pool runs inline. */
typedef struct st_pool st_pool;
st_pool *st_pool_create(int nthreads); /* nthreads >= 1, includes caller */
/* The same, its workers spinning only briefly (20 us, not 1 ms) for the
 * next job before they sleep: for a pool that waits beside threads that
 * own the cores, as the trainer's does under a pipeline's stage threads,
 * where a spinning worker takes a core from a stage. */
st_pool *st_pool_create_brief(int nthreads);
void st_pool_destroy(st_pool *pool);
int st_pool_threads(const st_pool *pool);
/* dst[i] += src[i] and dst[i] = src[i] for i in [0, n), and acc[c] +=
 * x[r][c] for r in [0, rows) in order (x rows x cols, row-major): on the
 * pool in pieces by the size alone, so the bits are those of the plain
 * loops whatever the threads; small ones inline. The buffers must not
 * overlap. */
void st_pool_add(st_pool *pool, float *dst, const float *src, size_t n);
void st_pool_copy(st_pool *pool, float *dst, const float *src, size_t n);
void st_pool_sum_rows(st_pool *pool, float *acc, const float *x, int rows,
                      int cols);
/* Pins the pool's worker threads (not the caller's) to the cpus
 * cpus[0 .. n) (each may run on any of them); -1 if the system refused. */
int st_pool_pin(st_pool *pool, const int *cpus, int n);
/* The cpu ids this process may run on (affinity and cgroup cpusets
 * included), at most cap of them; returns how many there are. */
int st_usable_cpus(int *cpus, int cap);
/* Bytes of memory this process may use: physical memory, or the cgroup's
 * limit (cgroup v2 memory.max) where it sets a lower one; 0 if unknown. */
/* This process's peak resident memory (VmHWM), in bytes; -1 if unknown. */
double st_peak_resident(void);
double st_usable_memory(void);
void st_pool_for(st_pool *pool, int ntasks, void (*fn)(void *arg, int task),
                 void *arg);
/* Runs fn(arg) on `workers` threads at once — the calling thread and
 * workers - 1 new ones — and returns when all have returned. A thread that
 * cannot be started only means fewer workers (fn must take its work from
 * a shared queue). */
void st_run_workers(int workers, void *(*fn)(void *arg), void *arg);

/* GEMM wrapper over CBLAS, row-major: C = alpha * op(A) op(B) + beta * C with
 * op(A) M x K, op(B) K x N. The caller states its cores by passing its pool.
 * The output is cut into tiles that depend only on (M, N), each tile is one
 * single-threaded BLAS call, so results are identical for any thread count and
 * several workers calling at once never oversubscribe. A narrow op(A) (A
 * untransposed, at most ST_NARROW_ROWS rows: a linear layer's forward and
 * input gradient at a small batch) is not packed as sgemm would: one row
 * is the BLAS's matrix-vector product, a few rows strata's own kernels
 * where they are faster (src/base/narrow.c). So are products with a short
 * inner size (K <= 3072, past 1024 only with B transposed or from 512
 * rows; K <= 64 with A transposed, or K <= 512 with A's rows at most 128
 * floats apart; at most 1024 rows: a GPT's at a batch of a few sequences,
 * attention's blocks, a narrow layer's weight gradient), which copy
 * strips of op(B), and with AVX-512 most products up to 4096 rows and K =
 * 3072 (narrow.c says which), these copying op(A) too where it is large
 * or transposed with its rows far apart; all equally independent of the
 * thread count. */
#define ST_NARROW_ROWS 16
void st_gemm(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
             float alpha, const float *A, int lda, const float *B, int ldb,
             float beta, float *C, int ldc);
/* Rows per band when a (rows x len) weight is cut by rows for one-row
 * products and the batch-1 update (about 16K elements a band, at most 64
 * bands): the shape alone decides, so a band goes to the same thread in
 * each of them (gemm.c). */
int st_row_band(int rows, int len);
/* y (1 x N) = x (1 x K) B, B stored K x N, summed band by band of B's rows
 * (st_row_band(K, N)); after(arg, r0, r1), when not NULL, runs on each
 * band's rows [r0, r1) on the thread that read them, once their partial
 * sum is made, and may then write them. The bits of st_gemm(pool, 0, 0,
 * 1, N, K, 1, x, K, B, N, 0, y, N). Returns 0, touching nothing, where
 * st_gemm does not sum that product in bands (then call the two apart). */
int st_gemv_then(st_pool *pool, float *y, const float *x, const float *B, int K,
                 int N, void (*after)(void *arg, int r0, int r1), void *arg);
/* C = op(A) op(B) + bias, the bias (N floats, not NULL, not inside C)
 * added to every row; the same bits as C filled with the bias and then
 * st_gemm with alpha and beta 1, without the fill where narrow.c's kernels
 * run (they add the bias as they store). */
void st_gemm_bias(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
                  const float *A, int lda, const float *B, int ldb,
                  const float *bias, float *C, int ldc);
/* C = relu(op(A) op(B) + bias), bias NULL for none: the bits of
 * st_gemm_bias (or st_gemm with alpha 1, beta 0) and then st_relu_forward
 * on C, with the relu applied as narrow.c's kernels store C where they
 * take the product (a linear layer and the relu after it: model/block.c),
 * else in a pass over C on the pool. */
void st_gemm_bias_relu(st_pool *pool, int trans_a, int trans_b, int M, int N,
                       int K, const float *A, int lda, const float *B, int ldb,
                       const float *bias, float *C, int ldc);
/* Products on bf16 inputs with fp32 accumulation (train.precision: bf16;
 * src/base/gemm_bf16.c gives the exact definition): the same contract as
 * st_gemm, each input rounded to bf16, each element one fp32 chain over K
 * in a fixed order, so bits depend on neither threads nor tiling. */
void st_gemm_bf16(st_pool *pool, int trans_a, int trans_b, int M, int N, int K,
                  float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc);
/* C = bias + op(A) op(B) (bias: N floats, each row's start) on bf16
 * inputs: the bits of C filled with the bias and st_gemm_bf16 at alpha 1,
 * beta 1; st_gemm_bias runs it under bf16. */
void st_gemm_bf16_bias(st_pool *pool, int trans_a, int trans_b, int M, int N,
                       int K, const float *A, int lda, const float *B, int ldb,
                       const float *bias, float *C, int ldc);
/* op(B) of st_gemm_bf16 packed once (N columns, K rows, panels_K = K)
 * for products that take a prefix of it, as attention takes each head's
 * keys and values: st_gemm_bf16_panels multiplies op(A) by the first N
 * columns and K rows (K even, or panels_K), single-threaded, with the bits
 * of st_gemm_bf16(NULL, ...) on op(B), which it runs instead where the
 * panels do not serve (B and ldb say op(B) for that). Words the panels
 * take, 0 where they would not serve (past one K block, AMX's tiles). */
size_t st_bf16_panels_words(int N, int K);
void st_bf16_pack_panels(int trans_b, int N, int K, const float *B, int ldb,
                         uint32_t *panels);
void st_gemm_bf16_panels(int trans_a, int trans_b, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B,
                         int ldb, const uint32_t *panels, int panels_K,
                         float beta, float *C, int ldc);
/* One process-wide precision for st_gemm and st_gemm_bias, as the
 * subnormal mode: on, they run st_gemm_bf16. st_trainer_create sets it
 * from train.precision; the process starts in fp32. */
void st_gemm_set_bf16(int on);
int st_gemm_bf16_on(void);
/* x[0 .. n) rounded to bf16 exactly as st_gemm_bf16 rounds its inputs
 * (subnormals to signed zeros, NaN quiet), into h: a value kept this way
 * and widened back (st_bf16_unpack_pool, exact) rounds to the same bf16
 * again, so a product of it has the bits of a product of x. On the pool. */
void st_bf16_pack_as_gemm(st_pool *pool, const float *x, uint16_t *h, size_t n);
/* The same rounding, widened back: out[i] is the fp32 value of x[i]'s
 * bf16 as st_gemm_bf16 multiplies it (a product computed elsewhere, as the
 * fused batch-1 update's dy x^T, takes its operands so). */
void st_bf16_round_as_gemm(const float *x, float *out, size_t n);
void st_bf16_unpack_pool(st_pool *pool, const uint16_t *h, float *x, size_t n);
/* How this build multiplies bf16: "AVX512-BF16 (vdpbf16ps)" or
 * "emulated (...)", saying why. st_bf16_set_emulated(1) makes it emulate
 * even where the CPU has the instructions (tests, calibration; the bits
 * are the same where subnormals are flushed). st_bf16_prefer_emulated(1),
 * from a calibration profile that measured the emulation faster
 * (st_gemm_choose_profile), makes it emulate while subnormals are flushed
 * (st_fp_flush) only, where the bits are the same; st_bf16_native says
 * whether the instruction runs now. */
const char *st_bf16_support(void);
void st_bf16_set_emulated(int on);
void st_bf16_prefer_emulated(int on);
/* For tests: 1 runs every bf16 product as when the packing scratch cannot
 * be had, one element at a time (under AMX's tiles, one tile at a time):
 * the same bits; 0 as usual. */
void st_bf16_set_plain(int on);
/* Whether an instruction runs the products now: AMX's tiles or VDPBF16PS. */
int st_bf16_native(void);
/* AMX's tiles (TDPBF16PS) run the products wherever the build targets them
 * and the kernel grants them (st_bf16_tiles: whether they run now), ahead
 * of VDPBF16PS: an order of magnitude faster, but their sums are not the
 * definition's fmaf chain (gemm_bf16.c's header), so the choice is by the
 * CPU alone, never by a timing. st_bf16_set_tiles(0) turns them off (tests
 * of the definition), (1) on again. */
int st_bf16_tiles(void);
void st_bf16_set_tiles(int on);
/* Which kernel takes the products narrow.c's packed kernel could: by
 * class, A transposed or not (0, 3) plus the inner size K <= 512, <= 1536,
 * larger (0, 1, 2), each the packed kernel (0) or the BLAS's tiles (1).
 * Process-wide, as the precision: st_gemm_choose(NULL), or -1 for a
 * class, restores the rule built in (the BLAS for A transposed past K =
 * 1536 where it runs 16-lane kernels of its own, else packed); a
 * calibration profile measures both per class on this machine
 * (st_calibration.gemm_choice_rate) and the trainer sets what was faster,
 * once a process (st_gemm_choose_profile_once).
 * Products of up to ST_NARROW_ROWS rows keep the rule. The choice depends
 * on the shape and the table alone, so results stay the same for every
 * thread count. */
#define ST_GEMM_CHOICES 6
int st_gemm_choice_class(int trans_a, int K);
void st_gemm_choose(const int *blas);
int st_gemm_chosen(int cls);       /* 1: the BLAS's */
int st_gemm_choice_measured(void); /* 1: some class set, not the rule */
/* Called once at start-up: pins the BLAS library to one thread per call. */
void st_blas_init(void);
const char *st_blas_name(void);

/* ---------------------------------------------------------------- tensor */

/* Counter-based RNG (Philox4x32-10): a stream is (seed, purpose); draw i of a
 * stream is a pure function of (seed, purpose, i), so results never depend on
 * which thread draws or in which order. */
typedef enum {
  ST_RNG_INIT = 1,
  ST_RNG_SHUFFLE = 2,
  ST_RNG_DROPOUT = 3,
  ST_RNG_DATA = 4,
  ST_RNG_SAMPLE = 5, /* text generation */
  ST_RNG_ROUND = 6,  /* stochastic rounding to bf16 */
} st_rng_purpose;

void st_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]);

typedef struct st_rng {
  uint64_t key;     /* seed mixed with purpose and sub-stream */
  uint64_t stream;  /* high counter word */
  uint64_t counter; /* next block */
  uint32_t buf[4];
  int avail;
} st_rng;

void st_rng_init(st_rng *rng, uint64_t seed, uint32_t purpose, uint64_t stream);
uint32_t st_rng_u32(st_rng *rng);
float st_rng_uniform(st_rng *rng);              /* [0, 1) with 24 bits */
float st_rng_normal(st_rng *rng);               /* Box-Muller */
uint32_t st_rng_below(st_rng *rng, uint32_t n); /* uniform in [0, n) */

/* bfloat16: the upper half of an fp32 (8 exponent bits, 7 stored mantissa
 * bits). Weight streaming's file store can hold its weights so
 * (execution.store_weights: bf16); compute and optimizer state stay fp32. */
uint16_t st_bf16_from(float x); /* to nearest, ties to even; NaN stays NaN */
float st_bf16_to(uint16_t h);   /* exact */
/* Rounds x[0 .. n) in place to values bf16 holds. Stochastic rounding
 * goes up with probability (x - down) / (up - down), so it is unbiased;
 * its bits are a pure function of (seed, step, first + i), whatever the
 * chunking or thread. */
void st_bf16_round(float *x, size_t n, int stochastic, uint64_t seed,
                   uint64_t step, uint64_t first);
void st_bf16_pack(const float *x, uint16_t *h, size_t n);   /* st_bf16_from */
void st_bf16_unpack(const uint16_t *h, float *x, size_t n); /* st_bf16_to */

/* Per-sample shape of an activation: (c, h, w); vectors are (c, 1, 1). */
typedef struct st_shape {
  int c, h, w;
} st_shape;

static inline size_t st_shape_numel(st_shape s) {
  return (size_t)s.c * (size_t)s.h * (size_t)s.w;
}

/* ---------------------------------------------------------------- config */

#define ST_MAX_LIST 32
/* Blocks a model may stack (model.layers, a CNN's stages x residual
 * blocks): each is a few KB of layer and tensor tables, built before the
 * memory check (which needs the model) can refuse it; model.layers = 2e9
 * once filled the machine's RAM before any message. */
#define ST_MAX_BLOCKS 65536
#define ST_PATH_MAX 512
#define ST_CONFIG_MAX_KEYS 112 /* rows the schema table may grow to */
/* execution.stages: per_block (every block its own stage). */
#define ST_STAGES_PER_BLOCK 0x7fffffff

typedef struct st_int_list {
  int n;
  int v[ST_MAX_LIST];
} st_int_list;

/* The resolved configuration. Defaults live in one table (src/config/schema.c)
 * and are listed in docs/config.md. */
typedef struct st_config {
  char path[ST_PATH_MAX]; /* file it came from ("" if none) */
  /* Not keys (no file sets them; 0 after st_config_defaults): the
   * processes the run spans, as whoever starts it knows them — `strata
   * train` under mpirun from MPI, `strata compile --ranks N
   * --ranks-per-machine L` from its flags. ranks <= 1: one process, whose
   * replicas share its memory; more: each rank holds only its own share
   * (a replica, or its stages), against the memory its machine gives it,
   * the machine's split over the per_machine ranks on it (0 counts as 1),
   * as st_rank_memory_allowed splits it at run time
   * (st_plan_place_ranks). */
  struct {
    int ranks, per_machine;
  } launch;
  struct {
    char kind[16];        /* mlp | cnn | gpt */
    st_int_list hidden;   /* mlp: hidden widths, default [256, 256] */
    char activation[16];  /* relu | gelu | gelu_tanh */
    float dropout;        /* dropout after each hidden activation */
    char norm[16];        /* none | layernorm (mlp) | groupnorm (cnn) */
    int groups;           /* groupnorm groups */
    st_int_list channels; /* cnn: conv channels per stage */
    int kernel;           /* cnn: conv kernel size (odd, 'same' padding) */
    int residual_blocks;  /* cnn: residual blocks per stage */
    int residual;         /* mlp: hidden layers after the first add their
                             input back before the activation */
    char pool[8];         /* cnn: max | avg */
    st_int_list dense;    /* cnn: dense widths after the conv stages */
    int classes;          /* output classes, default 10 */
    int vocab;            /* gpt: vocabulary (0 = the tokenizer's) */
    int context;          /* gpt: tokens per sequence (context length) */
    int layers;           /* gpt: transformer layers */
    int heads;            /* gpt: attention heads */
    int width;            /* gpt: model width d_model */
    int mlp_ratio;        /* gpt: MLP hidden width / model width */
    int tied;             /* gpt: output head shares the token embedding */
    int fused_loss;       /* gpt: head and loss fused, no logits buffer */
    char positions[16];   /* gpt: learned | rotary */
    int rotary_dim;       /* gpt: rotated dims per head (0 = all) */
  } model;
  struct {
    char dataset[24];      /* fashion_mnist | synthetic | text */
    char dir[ST_PATH_MAX]; /* where the IDX .gz files are */
    int train_limit;       /* use only the first N training samples (0 = all) */
    int test_limit;        /* use only the first N test samples (0 = all) */
    int shuffle;           /* reshuffle every epoch */
    int normalize;         /* standardise pixels with the dataset mean/std */
    char path[ST_PATH_MAX];      /* text: the corpus file */
    char tokenizer[ST_PATH_MAX]; /* text: "bytes" or a strata-bpe file */
    char encoding[8];            /* text: bytes | utf8 (checked) */
    float val_fraction;          /* text: share of the tokens held out */
  } data;
  struct {
    char kind[16]; /* sgd | adamw */
    float lr, momentum;
    int nesterov;
    float weight_decay;
    float beta1, beta2, eps;
    char schedule[16]; /* constant | cosine | step | linear */
    int warmup_steps;
    float min_lr;        /* cosine/linear floor */
    int step_size;       /* step schedule: decay every step_size steps */
    float gamma;         /* step schedule factor */
    int reference_batch; /* batch lr/momentum were tuned for (0: none) */
  } optimizer;
  struct {
    int batch, epochs;
    int64_t steps; /* > 0 overrides epochs */
    uint64_t seed;
    int eval_every;            /* steps; 0 = only at the end of each epoch */
    int checkpoint_every;      /* steps; 0 = only at the end */
    int threads;               /* 0 = all cores */
    int keep_checkpoints;      /* how many step checkpoints to keep */
    char checkpoint_format[8]; /* single | shards (a directory, an index) */
    int flush_subnormals;      /* FTZ + DAZ on every computing thread */
    char precision[8];         /* fp32 | bf16 (the products; st_gemm_bf16) */
    int bf16_activations;      /* bf16: products' inputs kept as bf16 */
  } train;
  struct {
    char mode[24];             /* sequential, pipeline, block_sequential,
                                  pipelined_backprop, weight_streaming */
    int micro_batch;           /* 0 = whole batch */
    char schedule[16];         /* pipeline: gpipe | 1f1b | interleaved |
                                  zb1p */
    int virtual_stages;        /* interleaved: chunks a stage worker holds */
    int stages;                /* pipeline: stages (0 = the compiler's plan,
                                  ST_STAGES_PER_BLOCK = one per block) */
    st_int_list stage_blocks;  /* pipeline, pipelined_backprop: blocks of
                                  each stage, pinning the cut ([] = the
                                  compiler's) */
    int blocks_per_segment;    /* block_sequential (0 = from memory) */
    int replicas;              /* data-parallel copies, >= 1 */
    char placement[8];         /* threads | ranks: where a pipeline's stages
                                  run under mpirun */
    int deterministic;         /* over MPI ranks: gradients summed in rank
                                  order (else MPI_Allreduce's own order) */
    int64_t rank_memory_limit; /* under mpirun: bytes a rank may hold (0 =
                                  none) */
    float rank_timeout;        /* under mpirun: seconds one wait on the
                                  others may last (0 = forever) */
    int pin;                   /* pin stage threads to their cores */
    int fused_update;          /* batch 1: update weights inside the backward */
    char block_costs[12];      /* model | measured: what stages are cut by */
    char mitigation[16];       /* pipelined_backprop: none | stash | sc | lwp |
                                  sc+lwp | pipemare */
    int emulate;               /* pipelined_backprop: single-threaded ticks */
    int pipemare_warmup;       /* pipemare: T (updates) */
    float pipemare_gamma;      /* pipemare: gamma */
    char store[8];             /* weight_streaming: memory | file */
    char store_path[ST_PATH_MAX]; /* store file ("" = DIR/store.strata) */
    char store_weights[8];        /* store file: fp32 | bf16 */
    char store_rounding[16];      /* bf16 weights: nearest | stochastic */
    int prefetch;                 /* weight_streaming: blocks fetched ahead */
    int keep_activations;         /* weight_streaming: else recompute */
    int64_t compute_memory_limit; /* weight_streaming: bytes, 0 = none */
  } execution;
  struct {
    char kind[16];          /* cpu | mesh | wse2 */
    int cores;              /* cpu: 0 = detected */
    int width, height;      /* mesh: PEs across and down */
    float pe_flops;         /* FLOP/s of one PE (mesh; overrides when set) */
    int64_t pe_memory;      /* bytes of one PE (mesh; overrides when set) */
    float link_bandwidth;   /* bytes/s of one link, one way (mesh; ditto) */
    float hop_latency;      /* mesh: seconds a hop (0 = the fabric's own) */
    float pe_overhead;      /* mesh: seconds a layer, sample and pass */
    float io_bandwidth;     /* mesh: bytes/s of the fabric's I/O each way;
                               cpu: of a file store's disk */
    float memory_bandwidth; /* cpu: bytes/s of the machine's DRAM, all
                               cores together (0 = the fabric's own) */
  } fabric;
  struct {
    int log_every;    /* steps between metrics.jsonl lines */
    char progress[8]; /* auto | on | off */
    int noise_scale;  /* log B_simple (BACKGROUND.md 5) */
    float noise_ema;  /* EMA decay of its two estimates */
  } metrics;
  /* Hidden bookkeeping, read through st_config_where: where each key was last
   * set, one record per row of the schema table (src/config/schema.c).
   * line > 0: `path` at line:col; line == -1: --set; line == 0: default. */
  struct st_config_origin {
    int line, col;
  } origin[ST_CONFIG_MAX_KEYS];
} st_config;

/* Fills cfg with defaults. */
void st_config_defaults(st_config *cfg);
/* Parses a YAML file over the defaults. Errors name file:line:col and key. */
int st_config_load(st_config *cfg, const char *path, st_error *err);
/* Applies "section.key=value" (value in YAML syntax, lists as [a, b]). */
int st_config_set(st_config *cfg, const char *assignment, st_error *err);
/* Cross-field checks (batch > 0, known enums, ...). */
int st_config_validate(const st_config *cfg, st_error *err);
/* Writes the resolved config as YAML. */
int st_config_write(const st_config *cfg, FILE *f);
/* Writes the keys whose values differ from was to now, in the schema's
 * order, as "key old -> new" joined by ", " (values as st_config_write
 * gives them); returns how many differ (0: nothing written). */
int st_config_changes(const st_config *was, const st_config *now, FILE *f);
/* Where a key was set, for error messages: "file:line:col", "--set", or
 * "default". Returns one of four rotating thread-local buffers, so two calls
 * may share one printf; copy the text if it must live longer. */
const char *st_config_where(const st_config *cfg, const char *key);
/* The same origin said of a second key a message mentions: "set at
 * file:line:col", "set by --set" or "the default"; four rotating
 * thread-local buffers of its own, as st_config_where's. */
const char *st_config_set_at(const st_config *cfg, const char *key);
/* The keys set away from their defaults that cfg's setting does not read:
 * another execution.mode's (execution.stages under sequential), another
 * model.kind's (model.hidden with a cnn), optimizer.kind's
 * (optimizer.beta1 with sgd), optimizer.schedule's, data.dataset's, ...:
 * up to cap of them in keys, in the schema's order; returns how many. A
 * user switches a mode, a model or an optimizer by changing one word, so
 * these get a notice, not an error (train and compile print one line
 * each). */
int st_config_unused(const st_config *cfg, const char **keys, int cap);
/* Why cfg does not read key: the key and value that leave it unread,
 * "execution.mode sequential", "optimizer.kind sgd"; NULL if cfg reads it.
 * Four rotating thread-local buffers, as st_config_where's. */
const char *st_config_unused_why(const st_config *cfg, const char *key);
/* Prints the schema (every key, type, default, meaning) for --help. */
void st_config_print_schema(FILE *f);

/* ------------------------------------------------------------------- ops */

/* Cost of an op per sample: FLOPs of forward and backward, parameter bytes,
 * activation bytes kept for the backward pass. Used by the compiler. */
typedef struct st_cost {
  double flops_fwd, flops_bwd;
  double param_bytes, act_bytes;
} st_cost;

/* Kernels. Layout: activations are (B, C, H, W) or (B, C) row-major; weights
 * follow PyTorch (linear (OC, IC), conv (OC, IC, K, K)). Backward kernels ADD
 * into weight gradients (dw, db) so micro-batches accumulate, and WRITE the
 * input gradient din (din may be NULL when not needed; for linear, dw and db
 * may be NULL too). */

/* linear: out (B, OC) = in (B, IC) W^T + b */
void st_linear_forward(st_pool *pool, float *out, const float *in,
                       const float *w, const float *b, int B, int IC, int OC);
void st_linear_backward(st_pool *pool, float *din, float *dw, float *db,
                        const float *dout, const float *in, const float *w,
                        int B, int IC, int OC);
/* The same with W stored transposed, (IC, OC) — the layout of Hugging Face's
 * GPT-2 Conv1D, so checkpoints carry HF shapes: out = in W + b. */
void st_linear_t_forward(st_pool *pool, float *out, const float *in,
                         const float *w, const float *b, int B, int IC, int OC);
/* out = relu(in W^T + b) (wt 0) or relu(in W + b) (wt 1): the bits of
 * the linear forward and then st_relu_forward, without the pass over out
 * where the product runs in narrow.c's kernels (st_gemm_bias_relu). */
void st_linear_relu_forward(st_pool *pool, int wt, float *out, const float *in,
                            const float *w, const float *b, int B, int IC,
                            int OC);
void st_linear_t_backward(st_pool *pool, float *din, float *dw, float *db,
                          const float *dout, const float *in, const float *w,
                          int B, int IC, int OC);
st_cost st_linear_cost(int IC, int OC);

/* pointwise activations over n = B * numel elements */
void st_relu_forward(float *out, const float *in, size_t n);
void st_relu_backward(float *din, const float *dout, const float *out,
                      size_t n);
/* approximate: 0 = exact erf form (PyTorch default), 1 = tanh form (GPT-2) */
void st_gelu_forward(float *out, const float *in, size_t n, int approximate);
void st_gelu_backward(float *din, const float *dout, const float *in, size_t n,
                      int approximate);
st_cost st_pointwise_cost(size_t numel, double flops_fwd, double flops_bwd);

/* softmax cross-entropy over C classes. losses (B) per sample; probs (B, C)
 * saved for backward. dlogits = (probs - onehot(label)) * scale, where scale is
 * 1 / (samples in the whole batch) so micro-batches sum to the batch mean. */
void st_xent_forward(float *losses, float *probs, const float *logits,
                     const int *labels, int B, int C);
void st_xent_backward(float *dlogits, const float *probs, const int *labels,
                      int B, int C, float scale);
/* Per sample over C classes: max, exp, sum, log, normalise (~5C flops);
 * backward C subtractions and scalings; keeps the C probabilities. */
/* The same on a pool, in chunks of rows (same bits as the calls above). */
void st_xent_forward_pool(st_pool *pool, float *losses, float *probs,
                          const float *logits, const int *labels, int B, int C);
void st_xent_backward_pool(st_pool *pool, float *dlogits, const float *probs,
                           const int *labels, int B, int C, float scale);
st_cost st_xent_cost(int C);

/* The output head and its loss fused (a GPT's lm_head over a 50,257-word
 * vocabulary), so no rows x V logits buffer exists: the vocabulary is cut
 * into chunks of st_linear_xent_chunk(R, V) words (R: rows a sample, the
 * cut a function of shape alone: about 1M logits a sample, 256 to 3072
 * words), and each chunk's logits x W_c^T (+ b_c)
 * (W (V, D) as st_linear_forward's) live in scratch only while they are
 * used, but for the last `keep` chunks (st_linear_xent_keep(R, V): at most
 * 16M logits a sample; the layer's keep: 0 in a mode whose backward would
 * not find them), which the forward leaves there for the backward.
 * The forward folds chunks into a running max and sum per row (an online
 * softmax, the sum in double) and writes out[2 r] = the row's loss,
 * logsumexp - z[label], and out[2 r + 1] = 1 if the first index of the
 * row's largest logit is its label, else 0 (what the unfused argmax
 * counts); it keeps lse and the labels (int32) for the backward, and a
 * token naming this forward in saved_labels[rows .. rows + 2) and in the
 * scratch. The backward takes the kept chunks where the scratch still
 * holds that forward's (the tokens agree; another forward in between, as
 * under gpipe, replaces them) and makes every other chunk's logits again
 * (the same call, so the same bits either way); it forms g[2 r] (softmax -
 * onehot) in place and adds dW_c += d^T x, db_c += the column sums (row
 * order), and dx (+)= d W_c (the first chunk overwrites). The kept chunks
 * serve one backward: a second call (the weight half of a split backward)
 * makes them again. Both calls take the same chunk and keep (0: none
 * kept). dw, db, dx may each be NULL. scratch: 16 + rows x
 * (chunk x (1 + keep) + 2) floats, which B x
 * st_linear_xent_scratch_floats(R, V, keep) covers at the shape's own
 * chunk. Rows are independent and every product is st_gemm's, so the bits
 * do not depend on threads. */
int st_linear_xent_chunk(int R, int V);
int st_linear_xent_keep(int R, int V);
/* Ends any kept chunks in this scratch (their token): for a caller about
 * to write the scratch for something else (block.c does, for every block
 * without the head). */
void st_linear_xent_forget(float *scratch);
/* Per sample, with `keep` chunks kept (st_linear_xent_keep, or 0). */
size_t st_linear_xent_scratch_floats(int R, int V, int keep);
void st_linear_xent_forward(st_pool *pool, float *out, float *lse,
                            int32_t *saved_labels, const float *x,
                            const float *w, const float *b, const int *labels,
                            float *scratch, int rows, int D, int V, int chunk,
                            int keep);
void st_linear_xent_backward(st_pool *pool, float *dx, float *dw, float *db,
                             const float *g, const float *x, const float *w,
                             const float *b, const float *lse,
                             const int32_t *labels, float *scratch, int rows,
                             int D, int V, int chunk, int keep);
/* The share of the vocabulary whose logits the backward makes again, at R
 * rows a sample: the chunks the forward did not keep (all where keep is
 * 0), and, where the backward runs in two halves (split: zb1p), all of
 * them once more for the weight half. */
double st_linear_xent_again(int R, int V, int keep, int split);
/* Per row at R rows a sample: the head's products (2 D V forward; 4 D V
 * backward, and the forward's again: st_linear_xent_again) and the
 * softmax passes. */
st_cost st_linear_xent_cost(int R, int D, int V, int keep, int split);

/* conv2d, square kernel K, stride S, zero padding P; (B, IC, H, W) ->
 * (B, OC, OH, OW), OH = (H + 2P - K) / S + 1. col is scratch of
 * st_conv2d_scratch_floats(...) floats. */
size_t st_conv2d_scratch_floats(int B, int IC, int H, int W, int K, int S,
                                int P);
void st_conv2d_forward(st_pool *pool, float *out, const float *in,
                       const float *w, const float *b, float *col, int B,
                       int IC, int H, int W, int OC, int K, int S, int P);
void st_conv2d_backward(st_pool *pool, float *din, float *dw, float *db,
                        const float *dout, const float *in, const float *w,
                        float *col, int B, int IC, int H, int W, int OC, int K,
                        int S, int P);
st_cost st_conv2d_cost(int IC, int H, int W, int OC, int K, int S, int P);

/* pooling, window K, stride S, no padding. maxpool saves the argmax index
 * (as int32, one per output element) in idx. */
void st_maxpool_forward(float *out, int32_t *idx, const float *in, int B, int C,
                        int H, int W, int K, int S);
void st_maxpool_backward(float *din, const float *dout, const int32_t *idx,
                         int B, int C, int H, int W, int K, int S);
void st_avgpool_forward(float *out, const float *in, int B, int C, int H, int W,
                        int K, int S);
void st_avgpool_backward(float *din, const float *dout, int B, int C, int H,
                         int W, int K, int S);
st_cost st_maxpool_cost(int C, int H, int W, int K, int S);
st_cost st_avgpool_cost(int C, int H, int W, int K, int S);

/* layernorm over the last D features of (N, D) rows; saves mean and rstd (N).
 */
void st_layernorm_forward(float *out, float *mean, float *rstd, const float *in,
                          const float *w, const float *b, int N, int D,
                          float eps);
/* Backward on the pool, one task per block of 32 rows (results do not depend
 * on the threads); dw and db (either may be NULL) are added to. scratch:
 * st_layernorm_scratch_floats(N, D) floats, unless dw and db are NULL. */
void st_layernorm_backward(st_pool *pool, float *din, float *dw, float *db,
                           const float *dout, const float *in, const float *w,
                           const float *mean, const float *rstd, float *scratch,
                           int N, int D);
size_t st_layernorm_scratch_floats(int N, int D);

/* groupnorm: (B, C, HW) with G groups; saves mean and rstd (B, G). On
 * the pool (NULL: the caller), the same bits on any number of threads. */
void st_groupnorm_forward(st_pool *pool, float *out, float *mean, float *rstd,
                          const float *in, const float *w, const float *b,
                          int B, int C, int HW, int G, float eps);
void st_groupnorm_backward(st_pool *pool, float *din, float *dw, float *db,
                           const float *dout, const float *in, const float *w,
                           const float *mean, const float *rstd, int B, int C,
                           int HW, int G);
st_cost st_layernorm_cost(int D);
st_cost st_groupnorm_cost(int C, int HW, int G);

/* inverted dropout with probability p: the keep decision for element j of
 * sample s is a pure function of (seed, layer_id, sample_index s, j), so it
 * does not depend on batching or threads. mask: a bit per element, sample s
 * at word s * st_dropout_mask_words(n), element j at bit j % 32 of word
 * j / 32 (1: kept, scaled by 1/(1-p); p <= 0 keeps all, unscaled). The
 * backward is dout times that scale or 0, the same products as the
 * forward's. */
size_t st_dropout_mask_words(size_t n);
void st_dropout_forward(float *out, uint32_t *mask, const float *in, int B,
                        size_t n, float p, uint64_t seed, uint32_t layer_id,
                        uint64_t first_sample);
void st_dropout_backward(float *din, const float *dout, const uint32_t *mask,
                         int B, size_t n, float p);
st_cost st_dropout_cost(size_t numel);

/* GPT kernels. T = time (tokens of a sequence), C = model width, NH = heads
 * (head size hs = C / NH), V = vocabulary; all layouts row-major. */

/* embedding: out (B, T, C) = wte (V, C)[tokens (B, T)] + wpe (T_max, C)[t];
 * wpe NULL for none (rotary models). Tokens must be in [0, V). The backward
 * scatter-adds dout into dwte rows and dwpe in the fixed order b, t
 * (deterministic with repeated tokens); either gradient may be NULL. Cost per
 * sample with a wpe of T rows. */
void st_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C);
void st_embedding_backward(float *dwte, float *dwpe, const float *dout,
                           const int32_t *tokens, int B, int T, int C);
st_cost st_embedding_cost(int T, int C, int V);

/* causal self-attention core, between the QKV and output projections: qkv
 * (B, T, 3C) is [q | k | v], head h in columns h*hs .. (h+1)*hs of each;
 * out (B, T, C) = softmax(q k^T / sqrt(hs) + causal mask) v per head.
 * Nothing is saved between the two: the backward computes the
 * probabilities again, in blocks of rows, with the forward's bits. Both
 * need scratch of st_attention_scratch_floats(B, T, C, NH) floats (no T x T
 * buffer: a few rows x T per (b, h)); the backward WRITES dqkv (B, T, 3C).
 * One pool task per (b, h): bitwise independent of the thread count. */
size_t st_attention_scratch_floats(int B, int T, int C, int NH);
void st_attention_forward(st_pool *pool, float *out, float *scratch,
                          const float *qkv, int B, int T, int C, int NH);
void st_attention_backward(st_pool *pool, float *dqkv, const float *dout,
                           const float *qkv, float *scratch, int B, int T,
                           int C, int NH);
/* The probabilities the forward and backward compute, bit for bit, into att
 * (B, NH, T, T), zero above the diagonal: for tests and inspection. */
void st_attention_probs(st_pool *pool, float *att, float *scratch,
                        const float *qkv, int B, int T, int C, int NH);
st_cost st_attention_cost(int T, int C, int NH);

/* rotary position embedding (GPT-NeoX convention, base 10000), in place on
 * the q and k parts of qkv (B, T, 3C): the first rotary_dim (even, <= hs)
 * dims of each head, halves rotated as in rotate_half; positions 0 .. T-1.
 * The backward applies the inverse rotation to dqkv in place. */
void st_rotary_forward(float *qkv, int B, int T, int C, int NH, int rotary_dim);
void st_rotary_backward(float *dqkv, int B, int T, int C, int NH,
                        int rotary_dim);
st_cost st_rotary_cost(int T, int NH, int rotary_dim);

/* ---------------------------------------------------------------- model */

typedef enum {
  ST_OP_LINEAR,
  ST_OP_RELU,
  ST_OP_GELU,
  ST_OP_CONV2D,
  ST_OP_MAXPOOL,
  ST_OP_AVGPOOL,
  ST_OP_FLATTEN,
  ST_OP_LAYERNORM,
  ST_OP_GROUPNORM,
  ST_OP_RESIDUAL, /* out = in + (block input, or an earlier layer's output) */
  ST_OP_DROPOUT,
  ST_OP_EMBED,       /* token ids -> wte[token] + wpe[position] */
  ST_OP_ATTENTION,   /* causal self-attention core: qkv -> heads' outputs */
  ST_OP_ROTARY,      /* rotary positions applied to q and k of qkv */
  ST_OP_LINEAR_XENT, /* output head and loss fused: (rows, D) -> (rows, 2)
                        of loss and hit (st_linear_xent_forward) */
} st_op_kind;

const char *st_op_name(st_op_kind kind);

#define ST_NAME_MAX 64
#define ST_MAX_DIMS 4

/* A named view into a block's parameter slab. Names follow the checkpoint
 * naming: "<block>.<layer>.<weight|bias>", e.g. "blocks.1.conv0.weight". */
typedef struct st_tensor_info {
  char name[ST_NAME_MAX];
  int ndim;
  int64_t dims[ST_MAX_DIMS];
  size_t offset; /* floats from the start of the block's slab */
  size_t numel;
  /* A tied copy (a GPT's output head sharing the token embedding): the
   * global offset of the tensor it mirrors, else -1. Each block keeps its own
   * copy, as a pipeline stage must; the trainer adds the copy's gradient
   * into the source's, updates the source and copies its new weights over
   * (the copy's optimizer state is unused); checkpoints store the source. */
  int64_t tie;
} st_tensor_info;

typedef struct st_layer {
  st_op_kind kind;
  char name[24];          /* "linear0", "conv1", "gn0", ... */
  st_shape in, out;       /* per sample */
  int k, stride, pad;     /* conv / pool */
  int groups;             /* groupnorm */
  int approximate;        /* gelu */
  float eps, p;           /* norms / dropout */
  uint32_t id;            /* model-wide layer index (dropout stream) */
  int w_tensor, b_tensor; /* indices into the block's tensors, -1 if none */
  /* Sequence layers (gpt): a sample is `rows` positions of `in.c` features,
   * position-major; linear and layernorm act on each position. 1 elsewhere. */
  int rows;
  int wt;                /* linear: weight stored (IC, OC), as HF's Conv1D */
  int heads, rotary_dim; /* attention, rotary */
  int vocab;             /* embed: rows of the token table; linear_xent:
                            words it scores */
  int keep, split;       /* linear_xent: the chunks of logits its forward
                            keeps for its backward (st_linear_xent_keep; 0
                            where this mode's backward would never find
                            them: model.c, head_keeps), and whether its
                            backward runs in two halves (zb1p) */
  int skip;              /* residual: layer whose output is added, -1 = the
                            block's input */
  float init_std;        /* > 0: weights N(0, init_std), biases 0 (gpt, as
                            GPT-2); 0: PyTorch's default for the layer */
  size_t out_off;        /* floats per sample into the block's activations (or,
                            transient, into the stage's scratch) */
  size_t save_off, save_per_sample; /* extra saved state (stats, masks, idx) */
  /* An output no backward reads (the next layer's backward reads neither
   * its input nor, like relu, its own output; no residual adds it) is not
   * kept: ST_TRANSIENT, in the scratch until the next layer's forward has
   * read it. A gelu's output that only the next layer's backward reads is
   * made again there from its (kept) input: ST_RECOMPUTED. Under
   * train.precision bf16 (train.bf16_activations), a sequence layer's
   * output that only a product reads in the backward (the next layer is
   * linear, attention or the fused head) is kept as bf16 at half_off,
   * rounded as the product rounds it (st_bf16_pack_as_gemm), so the
   * backward's bits are the same: ST_HALF, its fp32 value in the scratch
   * slot until the next forward has read it, and widened into that slot
   * again for the next layer's backward. */
  int transient;
  size_t half_off; /* ST_HALF: floats per sample into the activations */
} st_layer;
enum { ST_KEPT = 0, ST_TRANSIENT = 1, ST_RECOMPUTED = 2, ST_HALF = 3 };

/* A block: one input and one output activation per sample, a list of layers
 * run in order (a residual add inside it refers to the block's input), and
 * one contiguous parameter slab of n_params floats. */
typedef struct st_block {
  char name[24]; /* "blocks.3" */
  int n_layers;
  st_layer *layers;
  int n_tensors;
  st_tensor_info *tensors;
  st_shape in, out;
  size_t n_params;       /* floats in the slab */
  size_t param_off;      /* floats from the start of the model's slab */
  size_t act_per_sample; /* floats of activations + saved state per sample */
  size_t scratch_floats_per_sample; /* im2col and the like, and the two
                                       slots of transient outputs */
  size_t max_numel;                 /* largest layer input/output per sample */
  int has_residual;
  st_cost cost; /* sum over the layers, per sample */
} st_block;

typedef struct st_model {
  char kind[16];
  int n_blocks;
  st_block *blocks;
  st_shape in; /* per-sample input */
  int classes;
  /* gpt: inputs are `in.h` token ids per sample (as floats, exact below
   * 2^24) and every position has a label; 1 for classifiers. */
  int label_rows;
  /* The last block's output per label row: `classes` logits, or, where
   * the head and its loss are fused (model.fused_loss, a GPT), 2 floats,
   * the row's loss and hit (ST_OP_LINEAR_XENT; it reads the labels from
   * st_ctx.labels). */
  int fused_loss;
  int out_cols;
  int n_ties;       /* tied tensor copies (st_tensor_info.tie) */
  size_t n_params;  /* floats over all blocks */
  size_t max_numel; /* over all blocks */
  size_t max_scratch_per_sample;
  int n_tensors; /* over all blocks */
} st_model;

/* Builds the model described by cfg->model for inputs of shape `in`.
 * Impossible shapes are errors naming the config key and where it was set. */
int st_model_create(st_model **out, const st_config *cfg, st_shape in,
                    st_error *err);
void st_model_destroy(st_model *m);
/* PyTorch-default initialisation (kaiming-uniform with a = sqrt(5), bias
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), norms 1/0) from the RNG stream
 * (seed, ST_RNG_INIT, tensor index). params has m->n_params floats. */
void st_model_init(const st_model *m, float *params, uint64_t seed);
/* The same for blocks [first, first + count) only (what st_model_init
 * writes there; a tied copy's source must already hold its values). */
void st_model_init_blocks(const st_model *m, float *params, uint64_t seed,
                          int first, int count);
/* Parameters counting each tied pair once (the published figure). */
size_t st_model_unique_params(const st_model *m);
/* Copies every tied tensor's source weights into the copy. */
void st_model_sync_ties(const st_model *m, float *params);
/* The same for the tied copies in blocks [first, first + count). */
void st_model_sync_ties_blocks(const st_model *m, float *params, int first,
                               int count);
/* Finds a tensor by name; returns its global offset in floats or -1. */
int64_t st_model_find(const st_model *m, const char *name,
                      const st_tensor_info **info);
/* Prints the blocks, layers, shapes, parameters and FLOPs: each block's
 * flops[i] (forward + backward per sample as they run: st_plan_costs, where
 * the first block computes no gradient for the model's input), or with
 * flops NULL each block's own cost wherever it sits. */
void st_model_print(const st_model *m, const double *flops, FILE *f);
/* The loss of `rows` label rows from the model's output `out` (rows x
 * out_cols): each row's loss into losses; unfused, the softmax into probs
 * (rows x classes) for the gradient (fused, probs is unused: the head kept
 * what its backward needs). */
void st_model_loss(const st_model *m, st_pool *pool, float *losses,
                   float *probs, const float *out, const int *labels, int rows);
/* The gradient of the loss times `scale` with respect to the output, into
 * dout (rows x out_cols). */
void st_model_loss_grad(const st_model *m, st_pool *pool, float *dout,
                        const float *probs, const int *labels, int rows,
                        float scale);
/* Whether row i of the output `out` scores its label: its largest logit's
 * first index is the label (fused: the head's hit). */
int st_model_hit(const st_model *m, const float *out, const int *labels,
                 size_t i);

typedef struct st_optim_rule st_optim_rule;

/* Folding the optimizer into the backward pass (st_ctx.fused): at batch 1 a
 * linear layer's weight gradient is the outer product dy x^T, and applying
 * the update while forming it saves writing, re-reading and clearing the
 * gradient. Pointers are the model-wide slabs. */
typedef struct st_fused_update {
  const st_optim_rule *rule;
  float *params;
  float *opt; /* slot k of parameter i at opt[k * slot_stride + i] */
  size_t slot_stride;
  /* Linear weight prediction folded in (pipelined backprop), else NULL:
   * parameter i's w - rule->pk v goes to predict[i - predict_base]. */
  float *predict;
  size_t predict_base;
} st_fused_update;

/* Execution context handed to block forward/backward. */
typedef struct st_ctx {
  st_pool *pool;
  int training;                 /* dropout on */
  uint64_t seed;                /* dropout stream seed */
  uint64_t first_sample;        /* global index of the batch's first sample */
  const st_fused_update *fused; /* NULL: gradients go to the gradient slab */
  /* The labels of the micro-batch's first sample on (label_rows each), for
   * a fused head's forward (st_model.fused_loss); it keeps them for its
   * backward. NULL elsewhere. */
  const int *labels;
} st_ctx;

/* Whether a layer's parameters are updated inside the backward when
 * ctx->fused is set (linear layers at batch 1). */
int st_layer_fuses_update(const st_layer *L, const st_ctx *ctx, int B);
/* Whether block b's layer l is a linear layer whose output only the relu
 * after it reads (ST_TRANSIENT): st_block_forward then runs the two as one
 * product that applies the relu as it stores C (st_linear_relu_forward),
 * into the relu's output, and the relu makes no pass of its own (the
 * compiler's cost model counts none). */
int st_layer_fuses_relu(const st_block *b, int l);

/* Runs a block's layers on B samples. acts holds B * act_per_sample floats;
 * the block's output is st_block_output(b, acts, B). */
void st_block_forward(const st_block *b, const st_ctx *ctx, const float *params,
                      const float *in, float *acts, float *scratch, int B);
const float *st_block_output(const st_block *b, const float *acts, int B);
/* Backward: adds parameter gradients into grads (the block's slab layout),
 * writes din (B * numel(in)) unless din is NULL. work holds
 * 3 * B * max_numel floats; scratch as for forward. */
void st_block_backward(const st_block *b, const st_ctx *ctx,
                       const float *params, float *grads, const float *in,
                       const float *acts, const float *dout, float *din,
                       float *work, float *scratch, int B);
/* The backward in two halves, for schedules that defer weight gradients
 * (zb1p): B, the input gradient alone, keeping each layer-with-weights'
 * output gradient in dys (B * st_block_dys_floats(b) floats); then W,
 * the weight gradients from those and the layers' inputs in acts. The two
 * add into grads exactly what st_block_backward adds. Not with a fused
 * update (ctx->fused). */
size_t st_block_dys_floats(const st_block *b);
void st_block_backward_input(const st_block *b, const st_ctx *ctx,
                             const float *params, const float *in,
                             const float *acts, const float *dout, float *din,
                             float *work, float *scratch, float *dys, int B);
void st_block_backward_weights(const st_block *b, const st_ctx *ctx,
                               const float *params, float *grads,
                               const float *in, const float *acts,
                               const float *dys, float *scratch, int B);

/* ---------------------------------------------------------------- optim */

typedef enum { ST_OPTIM_SGD, ST_OPTIM_ADAMW } st_optim_kind;

/* SGD as PyTorch: g += wd * w; v = m * v + g (v = g on the first step);
 * d = nesterov ? g + m * v : v; w -= lr * d. */
void st_sgd_update(float *w, float *v, const float *g, size_t n, float lr,
                   float momentum, int nesterov, float weight_decay,
                   int first_step);
/* AdamW as PyTorch: w *= 1 - lr * wd; m, v moments; bias-corrected by
 * step t (1-based). */
void st_adamw_update(float *w, float *m, float *v, const float *g, size_t n,
                     float lr, float beta1, float beta2, float eps,
                     float weight_decay, int64_t t);
/* One optimizer step over a whole slab of n parameters: the configured rule
 * (cfg->optimizer) at learning rate lr for (0-based) step `step`, run on the
 * pool in chunks fixed by n alone (bitwise equal to one st_sgd_update /
 * st_adamw_update call over the slab, for any thread count). Each gradient
 * chunk is zeroed right after its update, so the next step accumulates into
 * zeros without a separate pass. opt holds st_optim_state_per_param slots of
 * n floats each. */
void st_optim_step(st_pool *pool, const st_config *cfg, float *params,
                   float *grads, float *opt, size_t n, float lr, int64_t step);
/* The same on a range of a larger slab: optimizer slot k of this range is at
 * opt + k * slot_stride (slot_stride = the whole slab's parameter count). */
void st_optim_step_range(st_pool *pool, const st_config *cfg, float *params,
                         float *grads, float *opt, size_t slot_stride, size_t n,
                         float lr, int64_t step);
/* One step's update rule with everything per-step resolved (learning rate,
 * AdamW bias corrections), for the fused paths. */
struct st_optim_rule {
  int adamw, nesterov, first_step;
  int sc; /* sgd: spike compensation (st_optim_rule_pb), a v + b d */
  float sc_a, sc_b;
  float lr, momentum, weight_decay;
  float beta1, beta2, eps, decay, step_size, bc2_sqrt;
  float pk;    /* sgd: with a prediction array p, p = w - pk v
                * after the update (linear weight prediction; without
                * momentum, non-zero keeps v = d for it) */
  float gamma; /* st_pb_update with a pipemare delta: its decay */
};
void st_optim_rule_init(st_optim_rule *r, const st_config *cfg, float lr,
                        int64_t step);
/* Pipelined backprop's rule (BACKGROUND.md 2) for a stage with delay
 * `delay` that has made `updates` updates: heavy-ball SGD,
 * d = g + wd w;  v <- m v + d (v <- d on the first update);
 * w <- w - lr (a v + b d) with spike compensation (sc: a = m^D,
 * b = (1 - m^D) / (1 - m); D = 0 or m = 0 turns it off), else w <- w - lr v
 * (w - lr d without momentum). The same rule, bit for bit, as
 * st_optim_rule_init's SGD without Nesterov, with the correction on top. */
void st_optim_rule_pb(st_optim_rule *r, float lr, float momentum,
                      float weight_decay, int delay, int sc, int64_t updates);
/* Updates an (OC, IC) weight whose gradient is the outer product dy x^T of
 * one sample, never materialising it; bitwise equal to writing dy[o]*x[i]
 * into a zeroed gradient and running the rule (with st_gemm_bf16_on, dy
 * and x rounded as st_gemm_bf16 rounds them: the product's operands, as
 * the unfused backward's). s1 is NULL for SGD. p, when
 * not NULL (SGD only), gets w - r->pk s0 of the updated values: the same
 * bits as st_pb_predict after the update, without another pass. dx, when
 * not NULL, first gets the input gradient dy w (1 x IC) with the weights
 * before the update, the bits of st_linear_backward's; where st_gemv_then
 * takes the shape, each band of rows is read once for both. */
void st_optim_update_outer(st_pool *pool, const st_optim_rule *r, float *w,
                           float *s0, float *s1, const float *dy,
                           const float *x, int OC, int IC, float *p, float *dx);
/* Updates n parameters with gradient g (left as it is); p as above. */
void st_optim_update_vec(const st_optim_rule *r, float *w, float *s0, float *s1,
                         const float *g, size_t n, float *p);
/* Learning rate at (0-based) step of total_steps under cfg's schedule. */
float st_lr_at(const st_config *cfg, int64_t step, int64_t total_steps);
/* Pipelined backprop's update of one stage: an SGD rule r (st_optim_rule_pb)
 * on n parameters, on the pool; zeroes g. With a pipemare delta:
 * delta <- r->gamma delta + (1 - r->gamma) (w_new - w_old); with pred:
 * pred <- w_new - r->pk v_new (linear weight prediction). */
void st_pb_update(st_pool *pool, const st_optim_rule *r, float *w, float *g,
                  float *v, float *delta, float *pred, size_t n);
/* PipeMare's learning-rate rescheduling (BACKGROUND.md 2, T1): a stage with
 * delay D >= 1 that has made t updates uses lr D^-(1 - min(t / T, 1));
 * T <= 0 or D <= 1 leave lr as it is. */
float st_pb_pipemare_lr(float lr, int delay, int64_t updates, int warmup);
/* out = w - k v: linear weight prediction (k = lr D, v the velocity) and
 * pipemare's backward weights (k = D, v the delta). */
void st_pb_predict(st_pool *pool, float *out, const float *w, const float *v,
                   float k, size_t n);
/* optimizer.reference_batch (BACKGROUND.md 2): a heavy-ball recipe (lr,
 * momentum) tuned at batch `reference`, moved to `batch` keeping the
 * momentum horizon in samples and each sample's total contribution:
 * m' = m^(b/B), lr' = lr (b/B) (1 - m') / (1 - m). min_lr (may be NULL)
 * scales with lr. */
void st_optim_scale_batch(float *lr, float *momentum, float *min_lr,
                          int reference, int batch);
/* Floats of optimizer state per parameter (SGD: 1, AdamW: 2). */
int st_optim_state_per_param(const st_config *cfg);

/* Gradient noise scale (BACKGROUND.md 5, McCandlish et al. 2018): from
 * squared gradient norms measured at two batch sizes B_s < B_b, the unbiased
 * estimates |G|^2 = (B_b |G_b|^2 - B_s |G_s|^2) / (B_b - B_s) and
 * tr(S) = (|G_s|^2 - |G_b|^2) / (1/B_s - 1/B_b) are averaged separately
 * (bias-corrected EMAs) and only then divided: B_simple = tr(S) / |G|^2.
 * Those two hold for samples drawn with replacement. Drawn without, from a
 * training set of N (an epoch's shuffled order), E|G_B|^2 = |G|^2 +
 * tr(S) (1/B - 1/N), G the set's gradient and S its per-sample covariance
 * (divisor N - 1): the tr(S) estimate is unchanged and the |G|^2 one
 * falls short by tr(S)/N, which `population` N adds back (0: with
 * replacement, or N unknown). */
typedef struct st_noise_scale {
  double beta;        /* EMA decay */
  double g2, trace;   /* the EMAs, uncorrected */
  double weight;      /* 1 - beta^n: the correction */
  int64_t n;          /* pairs added */
  int64_t population; /* N samples drawn without replacement, or 0 */
} st_noise_scale;

void st_noise_scale_init(st_noise_scale *ns, double beta);
/* Adds one measurement: |G_s|^2 on bs samples and |G_b|^2 on bb > bs. */
void st_noise_scale_add(st_noise_scale *ns, double gs2, int bs, double gb2,
                        int bb);
/* B_simple, or NAN before the first measurement or while the |G|^2
 * estimate is not positive; g2 and trace (may be NULL) get the averages. */
double st_noise_scale_value(const st_noise_scale *ns, double *g2,
                            double *trace);

/* ----------------------------------------------------------------- data */

typedef struct st_dataset {
  char name[32];
  char labels_name[32]; /* the labels' file, where they have one of their own */
  int n;                /* samples */
  st_shape shape;       /* per sample */
  int classes;
  uint8_t *pixels; /* n * numel(shape), raw 0..255 */
  uint8_t *labels; /* n */
  float mean, std; /* for normalisation */
} st_dataset;

/* Reads gzip IDX images and labels (Fashion-MNIST layout). limit > 0 keeps
 * only the first `limit` samples. Errors name the file and what is wrong. */
int st_dataset_load_idx(st_dataset **out, const char *images_gz,
                        const char *labels_gz, int limit, st_error *err);
/* What st_dataset_load_idx or st_dataset_synthetic holds for n samples of
 * `shape`, as st_alloc_bytes counts it: the descriptor, the pixels and
 * the labels. */
size_t st_dataset_bytes(int n, st_shape shape);
/* The sample count and shape in the headers of a pair of gzip IDX files
 * (at most `limit` when limit > 0), checked as st_dataset_load_idx checks
 * them, without reading a sample. */
int st_dataset_idx_count(const char *images_gz, const char *labels_gz,
                         int limit, int *n, st_shape *shape, st_error *err);
/* Deterministic synthetic classification data (for tests and benches). */
/* Samples [first, first + n) of the same problem (same class prototypes):
 * a training set and a held-out test set are two disjoint ranges. */
int st_dataset_synthetic_range(st_dataset **out, int first, int n,
                               st_shape shape, int classes, uint64_t seed,
                               st_error *err);
int st_dataset_synthetic(st_dataset **out, int n, st_shape shape, int classes,
                         uint64_t seed, st_error *err);
void st_dataset_destroy(st_dataset *ds);
/* Writes samples idx[0..B) as floats (normalised if asked) and labels. */
void st_dataset_batch(const st_dataset *ds, const int32_t *idx, int B,
                      int normalize, float *x, int *y);
/* Permutation of [0, n) for an epoch: a pure function of (seed, epoch). */
void st_shuffle(int32_t *perm, int n, uint64_t seed, int64_t epoch);

/* Tokenizers for text (tokenizer.c). Token ids 0..255 are the bytes; a BPE
 * tokenizer adds token 256 + r for its merge r of (left, right), learned by
 * st_bpe_train. The byte tokenizer is a BPE tokenizer with no merges. Encode
 * applies the merges in rank order, leftmost first; decode is its exact
 * inverse for any byte string (no UTF-8 assumption). */
typedef struct st_tokenizer st_tokenizer;

/* The byte-level tokenizer (vocab 256, token = byte). */
int st_tokenizer_create_bytes(st_tokenizer **out, st_error *err);
/* Byte-level BPE on text[0..n): merges the most frequent adjacent pair
 * (ties: lowest left, then lowest right id) until the vocabulary has `vocab`
 * tokens, or earlier when no pair occurs twice. vocab >= 256. */
int st_bpe_train(st_tokenizer **out, const uint8_t *text, size_t n, int vocab,
                 st_error *err);
void st_tokenizer_destroy(st_tokenizer *tok);
int st_tokenizer_vocab(const st_tokenizer *tok);
/* Merge r as (left, right) ids; r in [0, vocab - 256). */
void st_tokenizer_merge(const st_tokenizer *tok, int r, int32_t *left,
                        int32_t *right);
/* CRC-32 of the vocabulary and the merges in rank order: two tokenizers
 * that give every text the same ids have the same one. */
uint32_t st_tokenizer_crc(const st_tokenizer *tok);
/* 0 when `had` (a checkpoint's record, st_checkpoint_tokenizer_crc) is
 * tok's CRC-32; else an error naming the checkpoint at path and cfg's
 * data.tokenizer: the checkpoint's token ids would name other text. */
int st_tokenizer_check(const st_tokenizer *tok, const st_config *cfg,
                       const char *path, uint32_t had, st_error *err);
/* Token ids of text[0..n) into ids (room for n: never more ids than bytes);
 * *n_ids gets the count. */
int st_tokenizer_encode(const st_tokenizer *tok, const uint8_t *text, size_t n,
                        int32_t *ids, size_t *n_ids, st_error *err);
/* Bytes of ids[0..n_ids) into out[0..cap); *n_out gets the byte count. With
 * out == NULL it only counts. Fails on an id outside the vocabulary or when
 * cap is too small. */
int st_tokenizer_decode(const st_tokenizer *tok, const int32_t *ids,
                        size_t n_ids, uint8_t *out, size_t cap, size_t *n_out,
                        st_error *err);
/* Text file "strata-bpe 1\nvocab N\n" then N - 256 lines "left right";
 * written atomically (temporary file, then rename). Load checks the magic,
 * version, every merge and the length; errors name the file. */
int st_tokenizer_save(const st_tokenizer *tok, const char *path, st_error *err);
int st_tokenizer_load(st_tokenizer **out, const char *path, st_error *err);

/* Reads a whole file into memory from st_alloc (the caller st_frees *data);
 * a zero-byte file gives *data == NULL, *n == 0. (text.c) */
int st_file_read(uint8_t **data, size_t *n, const char *path, st_error *err);
/* Opens path for reading if it is a regular file: its descriptor, or -1
 * with err set ("cannot open: ...", "not a regular file"). A FIFO or a
 * device is refused without waiting on it (the open does not block). */
int st_open_regular(const char *path, st_error *err);

/* A text corpus as token ids, split by position: the first tokens train, the
 * last floor(n_tokens * val_fraction) validate (deterministic, contiguous). */
typedef struct st_text_dataset {
  char path[ST_PATH_MAX];
  int vocab;       /* of the tokenizer used */
  size_t n_bytes;  /* of the file */
  size_t n_tokens; /* n_train + n_val */
  int32_t *tokens; /* (n_tokens), from st_alloc */
  int32_t *train;  /* view: tokens[0 .. n_train) */
  size_t n_train;
  int32_t *val; /* view: tokens[n_train .. n_tokens) */
  size_t n_val;
} st_text_dataset;

/* Reads and tokenizes a text file (tok NULL: bytes). val_fraction in [0, 1);
 * an empty file, or one too short to give both parts, is an error. */
int st_text_dataset_load(st_text_dataset **out, const char *path,
                         const st_tokenizer *tok, double val_fraction,
                         st_error *err);
void st_text_dataset_destroy(st_text_dataset *ds);
/* Offset of the first byte of data[0..n) that is not part of a valid UTF-8
 * sequence (overlongs, surrogates and code points above U+10FFFF are
 * invalid), or n when all of it is valid. */
size_t st_utf8_invalid(const uint8_t *data, size_t n);
/* The configured tokenizer (data.tokenizer: "bytes" or a strata-bpe file). */
int st_text_tokenizer(st_tokenizer **out, const st_config *cfg, st_error *err);
/* The corpus of cfg->data (path, tokenizer, encoding, val_fraction); *tok
 * gets the tokenizer. Errors name the file and, for encoding, line:col. */
int st_text_open(st_text_dataset **out, st_tokenizer **tok,
                 const st_config *cfg, st_error *err);
/* model.vocab, or when 0 the configured tokenizer's vocabulary. */
int st_text_vocab(const st_config *cfg, int *vocab, st_error *err);
/* The training sequences of `tokens` tokens at context T: windows of T + 1
 * starting every T tokens (each token but the last a label once), at most
 * limit when limit > 0. */
int st_text_windows(size_t tokens, int T, int limit);
/* Bytes the tokenizer holds from st_alloc (its tokens' spellings). */
size_t st_tokenizer_bytes(const st_tokenizer *tok);

/* What the trainer loads for data.dataset (trainer.c's load_data): the
 * synthetic sets' sizes (data.train_limit and data.test_limit, else these),
 * and the IDX files of data.dir, training (test = 0) or test (1). */
#define ST_SYNTHETIC_TRAIN 6000
#define ST_SYNTHETIC_TEST 1000
void st_data_idx_paths(const st_config *cfg, int test, char *images,
                       char *labels, size_t cap);
/* What the trainer's data holds once loaded, sized from the files'
 * headers and lengths without reading their samples (footprint.c): the
 * bytes as st_alloc_bytes counts them (the training and test sets; a text
 * corpus's token ids, st_alloc'd a token a byte, and its tokenizer), and
 * the training samples, *n_train (text: st_text_windows of the training
 * tokens, at most one a byte: exact for the byte tokenizer, a bound for a
 * BPE one). A file that cannot be read fails as loading it would. */
int st_data_footprint(const st_config *cfg, double *bytes, int *n_train,
                      st_error *err);

/* ------------------------------------------------------------------- io */

/* safetensors (https://huggingface.co/docs/safetensors): 8-byte little-endian
 * header length, a JSON header, then the raw data. strata writes F32 tensors
 * and string metadata; it reads any dtype of the specification. */
typedef struct st_st_tensor {
  char name[128];
  char dtype[8]; /* "F32", "I32", "I64", ... */
  int ndim;
  int64_t dims[8];
  size_t begin, end; /* byte offsets into the data section */
  int has_crc;       /* the file lists its bytes' CRC-32 (strata.crc32) */
  uint32_t crc;
} st_st_tensor;

typedef struct st_safetensors {
  char path[ST_PATH_MAX];
  int n_tensors;
  st_st_tensor *tensors;
  const st_st_tensor **by_name; /* the tensors in name order (find) */
  int n_meta;
  char (*meta_keys)[64];
  char (*meta_values)[256];
  uint8_t *data; /* the data section (NULL: st_safetensors_open) */
  size_t data_bytes;
  size_t data_start; /* the data section's offset in the file */
  int fd;            /* st_safetensors_open's file, else -1 */
  uint32_t *crcs;    /* strata.crc32 while the header is parsed; then NULL */
  int n_crcs;
} st_safetensors;

/* Reads and validates a whole file (header JSON, offsets inside the file,
 * sizes matching dtype x shape). Errors name the file and the tensor. */
int st_safetensors_read(st_safetensors **out, const char *path, st_error *err);
/* The same without reading the data section (data NULL): a tensor's bytes
 * are read with st_safetensors_pread when wanted, so a part of a large
 * file costs only that part. */
int st_safetensors_open(st_safetensors **out, const char *path, st_error *err);
/* bytes of tensor t from its byte off, into dst (either kind of handle).
 * A read of the whole tensor is checked against its CRC-32 where the file
 * lists one (every file st_st_writer writes does: metadata "strata.crc32",
 * one 8-digit hex CRC per tensor in header order); st_safetensors_read
 * checks every tensor. */
int st_safetensors_pread(const st_safetensors *st, const st_st_tensor *t,
                         size_t off, size_t bytes, void *dst, st_error *err);
/* A tensor read in pieces: crc is zlib's crc32 over all its bytes in
 * order; an error naming the file and the tensor if the file's differs. */
int st_safetensors_verify(const st_safetensors *st, const st_st_tensor *t,
                          uint32_t crc, st_error *err);
void st_safetensors_destroy(st_safetensors *st);
const st_st_tensor *st_safetensors_find(const st_safetensors *st,
                                        const char *name);
const char *st_safetensors_meta(const st_safetensors *st, const char *key);

/* A sharded checkpoint's model.safetensors.index.json (the form Hugging
 * Face tools read: {"metadata": {...}, "weight_map": {tensor: shard file}}):
 * the tensors and the file beside the index holding each. */
typedef struct st_st_index {
  char (*names)[128];
  char (*files)[128];
  int n, cap;
} st_st_index;
int st_safetensors_index_read(const char *path, st_st_index *out,
                              st_error *err);
void st_safetensors_index_free(st_st_index *x);

/* A writer collects (name, dtype, dims, pointer) then writes atomically:
 * temp file in the same directory, fsync, rename, fsync of the directory. The
 * data pointers must stay valid until st_safetensors_write returns. */
typedef struct st_st_writer st_st_writer;
st_st_writer *st_st_writer_create(void);
void st_st_writer_destroy(st_st_writer *w);
int st_st_writer_add(st_st_writer *w, const char *name, const char *dtype,
                     int ndim, const int64_t *dims, const void *data,
                     st_error *err);
int st_st_writer_meta(st_st_writer *w, const char *key, const char *value,
                      st_error *err);
int st_st_writer_write(st_st_writer *w, const char *path, st_error *err);
/* The same, streamed to the file tensor by tensor; a tensor added with data
 * NULL takes its bytes from fetch(arg, index of the tensor in the order
 * added), valid until the next call (NULL: failed, err set). Every fetch
 * is made even after a write failed. */
typedef const void *(*st_st_fetch)(void *arg, int index, st_error *err);
int st_st_writer_write_fetch(st_st_writer *w, const char *path,
                             st_st_fetch fetch, void *arg, st_error *err);

/* Prints each tensor: name, shape, dtype, min, max, mean, std. A directory
 * is a sharded checkpoint: each of its shards in turn, once its index (the
 * last file written) is there. */
int st_inspect(const char *path, FILE *f, st_error *err);
/* Compares two files tensor by tensor (the same names, dtypes and shapes,
 * else an error naming the first that differs): each tensor's largest
 * absolute difference and largest difference relative to the larger
 * magnitude of the pair, then the largest of all. */
int st_inspect_against(const char *path, const char *other, FILE *f,
                       st_error *err);

/* Makes a folder's entries durable (after a rename or a link into it, or
 * an unlink): a file system that cannot sync a folder (EINVAL, ENOTSUP),
 * or a folder this process may write but not read (EACCES), is taken at its
 * word; any other failure is an error naming the folder. */
int st_sync_dir(const char *dir, st_error *err);
/* Atomic small-file write (temp, fsync, rename). */
int st_write_file_atomic(const char *path, const void *data, size_t bytes,
                         st_error *err);
/* The same in pieces: a temp file beside path, written in order; close
 * with the writes' rc: 0 syncs it and renames it over path (then syncs the
 * directory), nonzero removes it and returns rc. */
typedef struct st_atomic_file {
  int fd;
  char path[ST_PATH_MAX], tmp[ST_PATH_MAX + 32];
} st_atomic_file;
int st_atomic_open(st_atomic_file *f, const char *path, st_error *err);
int st_atomic_write(st_atomic_file *f, const void *data, size_t bytes,
                    st_error *err);
int st_atomic_close(st_atomic_file *f, int rc, st_error *err);
/* The same for the text of a memory stream (open_memstream(text, len)):
 * closes f, writes *text to path atomically, frees *text. */
int st_write_stream_atomic(FILE *f, char **text, size_t *len, const char *path,
                           st_error *err);
/* The pipeline schedule `name` (gpipe, 1f1b, interleaved, zb1p) of S
 * stage workers, M micro-batches and V chunks a worker as an SVG at path
 * (atomically): one row per worker, a box per F, B, W or whole backward on
 * a clock where each takes one tick (a whole backward two), idle blank. */
int st_schedule_write_svg(const char *name, int S, int M, int V,
                          const char *path, st_error *err);
/* The utilization that schedule's bubble allows with F, B and W of one
 * cost (a chunk's 1/V of it): 3M / makespan on that clock, which is
 * M/(M+S-1) for gpipe and 1f1b, V M/(V M+S-1) for interleaved with M a
 * multiple of S, 3M/(3M+S-1) for zb1p with M >= S (Qi et al.: a bubble of
 * (S-1)(F+B-W)); 0 for no such schedule. */
double st_schedule_formula(const char *name, int S, int M, int V);
/* mkdir -p: every folder of path, the last component too when
 * include_last (else path names a file to come). */
int st_mkdir_p(const char *path, int include_last, st_error *err);

/* A run's directory (io/rundir.c). The step numbers of
 * DIR/checkpoints/step-*.safetensors, ascending, in a malloc'ed *steps;
 * returns how many (0: none, or no such folder), -1 on error. */
int st_run_checkpoints(const char *dir, int64_t **steps, st_error *err);
/* DIR/checkpoints/step-NNNNNNNN.safetensors, or the sharded checkpoint's
 * directory where that is the one there; -1 if it does not fit. */
int st_run_checkpoint_path(const char *dir, int64_t step, char *out,
                           size_t cap);
/* DIR/checkpoints/step-NNNNNNNN: where a sharded checkpoint is written. */
int st_run_checkpoint_dir(const char *dir, int64_t step, char *out, size_t cap);
/* Removes all but the newest `keep` checkpoints, whatever was left before. */
int st_run_prune(const char *dir, int keep, st_error *err);
/* Removes the temp files (NAME.tmp.PID) that writes of processes no longer
 * running left in DIR and DIR/checkpoints; returns how many. */
int st_run_clean_tmp(const char *dir);
/* 1 when DIR holds work of an earlier run that a new run would overwrite
 * (checkpoints, the store at `store` when given, logged metrics, a
 * summary), described in `what`; 0 for none (at most a config.yaml and a
 * plan: a run that never took a step). */
int st_run_describe(const char *dir, const char *store, char *what, size_t cap);
/* Removes the files of a run from DIR (--overwrite): its checkpoints,
 * config.yaml, metrics.jsonl, summary.json, plan.json, plan.svg and the
 * store at `store` when given. Other files are left alone. */
int st_run_remove(const char *dir, const char *store, st_error *err);
/* --overwrite without losing the earlier run to a new one that fails
 * before it starts: st_run_set_aside moves the run's files (those
 * st_run_remove names, and the store at `store`) into DIR/.overwritten;
 * st_run_put_back returns them (best effort: a failed start); and
 * st_run_drop_aside removes them once the new run has started. A store on
 * another file system than DIR cannot move: it is removed at once. */
int st_run_set_aside(const char *dir, const char *store, st_error *err);
void st_run_put_back(const char *dir, const char *store);
int st_run_drop_aside(const char *dir, st_error *err);
/* Makes DIR and holds an exclusive lock on it (flock on the folder) until
 * the process exits, so two runs never write one folder at once; another
 * process holding it is an error naming the folder. A filesystem without
 * locks is not refused. */
int st_run_lock(const char *dir, st_error *err);
/* Makes DIR/checkpoints (refusing a file in the way), checks both can be
 * written, and removes stale temp files: before the first step, not at the
 * first checkpoint. */
int st_run_prepare(const char *dir, st_error *err);

/* A trace of a run (`strata train --trace FILE`): timed spans on tracks,
 * one track per stage and replica, written as Chrome trace-event JSON
 * (opens in Perfetto or chrome://tracing). Each track has a fixed number
 * of events, allocated once; later events are dropped and counted. A track
 * is written by one thread only, so recording takes no lock. */
typedef enum {
  ST_TRACE_FORWARD,
  ST_TRACE_BACKWARD,
  ST_TRACE_UPDATE,
  ST_TRACE_SEND,
  ST_TRACE_RECV,   /* waiting for a message: the stage is idle */
  ST_TRACE_IDLE,   /* between steps: data loading, evaluation */
  ST_TRACE_REDUCE, /* replicas: all-reduce of the gradients */
  ST_TRACE_WEIGHT, /* zb1p: a deferred weight gradient (W) */
  ST_TRACE_KINDS
} st_trace_kind;

typedef struct st_trace st_trace;
int st_trace_create(st_trace **out, int tracks, int events_per_track,
                    st_error *err);
void st_trace_destroy(st_trace *t);
void st_trace_name(st_trace *t, int track, const char *name);
/* A span [t0, t1] in st_now() seconds; step and micro-batch (or block, for
 * updates) go into its args (-1: none). NULL t records nothing. */
void st_trace_add(st_trace *t, int track, st_trace_kind kind, int64_t step,
                  int index, double t0, double t1);
int64_t st_trace_dropped(const st_trace *t);
int st_trace_write(const st_trace *t, const char *path, st_error *err);

/* --------------------------------------------------------------- compile */

/* The compiler (docs/compiler.md) turns a model and a fabric into a plan:
 * which contiguous blocks form each stage, how many processing elements
 * (PEs; cores on a cpu) each stage gets, where it sits, and the predicted
 * time per sample, memory and pipeline utilization. It runs as numbered
 * passes — 1 cost, 2 partition, 3 allocate, 4 place, 5 report — and every
 * stage carries a cause string saying why it was cut and sized as it is. */

/* GEMM shape classes, by volume M*N*K of one st_gemm call: calibration
 * measures one representative shape per class (docs/compiler.md). conv2d
 * and attention, whose kernels do more than their GEMMs (im2col and
 * col2im; softmax), have rates of their own by the same classes. */
#define ST_GEMM_CLASSES 4
/* The single-threaded ops, timed by the bytes they move: 0 pointwise (relu,
 * dropout, residual, flatten, softmax-xent), 1 norm (groupnorm, layernorm),
 * 2 pool, 3 optimizer update, 4 gelu (its tanh or erf makes it compute
 * bound: it moved bytes 8x slower than relu). */
#define ST_OP_CLASSES 5
/* Rows (M) of the calibration's linear GEMM shapes: a linear layer's GEMMs
 * are classed by their weights at this many rows. Below it, weights larger
 * than a core's L2 are re-read from the next level once per call, which the
 * rate at this many rows amortises and a narrow call does not (the narrow
 * term of the calibrated model, docs/compiler.md). */
#define ST_GEMM_REF_ROWS 64
/* Points of the calibrated cache-spill curve (working set -> fraction). */
#define ST_SPILL_POINTS 10
/* Points of the calibrated one-row step's curve (working set -> rate). */
#define ST_ROW_POINTS 10

typedef enum { ST_FABRIC_CPU, ST_FABRIC_MESH } st_fabric_kind;

/* What a plan runs on: a width x height grid of PEs (a cpu is cores x 1). */
typedef struct st_fabric {
  st_fabric_kind kind;
  char name[32]; /* "cpu:16", "mesh:64x64", "wse2" */
  int width, height;
  int64_t pes;             /* width * height */
  double pe_flops;         /* sustained FLOP/s of one PE */
  double pe_memory;        /* bytes of one PE the model's tensors may use */
  double pe_reserved;      /* mesh: bytes of one PE's SRAM kept for its
                              program, fabric queues and kernel buffers
                              (0 when fabric.pe_memory is given) */
  double link_bandwidth;   /* bytes/s: mesh, one link one way; cpu, one
                              stage-to-stage copy */
  double efficiency_slope; /* e(c) = 1 / (1 + slope (c - 1)); 0 on a mesh */
  double sharing_slope;    /* cpu, calibrated: m(n) = 1/(1 + slope (n-1)),
                              the rate each of n busy cores keeps; 0 = cores
                              independent (see compile.h) */
  double memory_bandwidth; /* bytes/s, whole fabric: cpu, its DRAM shared by
                              every core (a stage's share bounds its time
                              past cache_bytes; replicas' gradient sum;
                              docs/compiler.md); mesh, reported only */
  char memory_bandwidth_source[12]; /* where that figure comes from:
                                       "default" (built in), "calibrated"
                                       (the profile's triad), "config"
                                       (fabric.memory_bandwidth),
                                       "published" (wse2); "" mesh */
  double cache_bytes;               /* cpu: the last-level cache, every core's
                                       together; a stage whose working set exceeds
                                       its share streams from memory */
  double fabric_bandwidth; /* bytes/s, whole fabric (reported, not modelled) */
  int estimated;           /* 1: built-in figures, not calibrated */
  char source[384];        /* where the figures come from */
  /* cpu with a calibration profile (st_calibration): GEMM work is timed at
   * gemm_rate[class] per core and the single-threaded ops at their measured
   * bandwidth, instead of every FLOP at pe_flops. */
  int calibrated;
  char calibrated_at[32]; /* the profile's date, "2026-11-22T23:40:00Z" */
  double gemm_rate[ST_GEMM_CLASSES]; /* FLOP/s of one core, by class */
  /* the same under train.precision: bf16 (st_calibration's
   * gemm_bf16_class_rate; 0: not measured) */
  double gemm_rate_bf16[ST_GEMM_CLASSES];
  /* and their parallel efficiency by class, e(c) = 1/(1 + slope (c - 1)),
   * fitted to gemm_bf16_class_rate_all (-1 from a profile that did not
   * measure it, 0 on a fabric not built from one: fp32's e(c) either way,
   * as where it is the better) */
  double gemm_slope_bf16[ST_GEMM_CLASSES];
  /* How the products are timed (st_fabric_resolve, by train.precision):
   * ST_PRODUCTS_FP32; ST_PRODUCTS_BF16, a bf16 run's at gemm_rate_bf16
   * (gemm_rate, conv_rate and attention_rate then hold bf16's); a bf16
   * run's at fp32's rates for want of bf16's (no calibration profile, or
   * an older one: ST_PRODUCTS_BF16_AS_FP32), at a what-if fabric's
   * pe_flops (a mesh, or fabric.pe_flops given), or by blocks measured in
   * bf16 (execution.block_costs: measured) */
  int bf16;
  double op_bandwidth[ST_OP_CLASSES]; /* bytes/s, one thread, by op class */
  /* FLOP/s of one core in the conv2d and attention kernels, [0] forward,
   * [1] backward, by the class of their GEMMs; 0: timed as GEMMs */
  double conv_rate[2][ST_GEMM_CLASSES];
  double attention_rate[2][ST_GEMM_CLASSES];
  /* the caller's serial work between steps (0: not modelled): filling the
   * next batch's input, bytes/s of model input written; and the hand-off
   * of a step to the stage threads and back, seconds */
  double input_bandwidth;
  double step_latency;
  /* the same hand-off where the caller runs the first stage itself (a
   * pipeline and block_sequential in one process), seconds; 0: not
   * modelled */
  double hosted_latency;
  /* The memory terms of linear layers' GEMMs (0: not modelled). A call of
   * r rows, 2 <= r < ST_GEMM_REF_ROWS = R, adds (1 - r / R) narrow_cost
   * max(0, W - l2_bytes) seconds, W its weight bytes; every call adds
   * spill(S) spill_cost W, S the bytes its stage touches per micro-batch and
   * spill() the fraction interpolated on (spill_ws, spill_fraction) — 0
   * below the first point, 1 past the last. Both per layer step of three
   * GEMMs; a stage's share on c cores shrinks as its GEMM time does.
   * A call of r rows also adds (1 - r / R) narrow_flop_cost seconds per
   * GEMM FLOP, whatever its weights: narrow kernels compute slower than
   * the class rate at R rows even from L2 (0: not modelled). */
  double l2_bytes, narrow_cost, spill_cost, narrow_flop_cost;
  int n_spill;
  double spill_ws[ST_SPILL_POINTS], spill_fraction[ST_SPILL_POINTS];
  /* bytes/s one core streams through a one-row linear product (weights
   * past L2, within the last-level cache); 0: those are timed as GEMMs */
  double row_bandwidth;
  /* where measured (n_row_step >= 2), one-row products instead stream at
   * st_row_rate(f, S), S the bytes their stage touches a step: the
   * trainer's one-row layer step, rate by bytes touched (st_calibration) */
  int n_row_step;
  double row_step_ws[ST_ROW_POINTS], row_step_rate[ST_ROW_POINTS];
  /* where measured (n_rank_one >= 2), the one-row products of layers
   * whose gradient accumulates (micro-batches of one row in a larger
   * batch) stream at st_rank_one_rate(f, S) instead of row_bandwidth */
  int n_rank_one;
  double rank_one_ws[ST_ROW_POINTS], rank_one_rate[ST_ROW_POINTS];
  /* and on c cores as e(c) = 1/(1 + s (c - 1)), measured on the same
   * step, not on the large GEMM's efficiency_slope: s = row_slope_small
   * for a stage touching at most row_step_ws[0] bytes a step (the small
   * shape's), row_slope from row_step_ws[1] (the larger's), interpolated
   * between (st_row_slope) */
  double row_slope, row_slope_small;
  /* Mesh: seconds per hop between neighbouring PEs, seconds of fixed work
   * each PE of a region spends per layer per sample per pass, and the
   * fabric's I/O: bytes/s each way between it and the host (the samples
   * entering, labels) and, for weight streaming, between it and the
   * weight store (0: not modelled; cpu: stream_bandwidth is the copy
   * rate). docs/compiler.md, "The mesh model". */
  double hop_latency, pe_overhead, io_bandwidth, stream_bandwidth;
  /* cpu: bytes/s of the disk a weight-streaming file store lives on (a
   * built-in estimate, or fabric.io_bandwidth); 0: not modelled (a mesh:
   * its store is beside it, reached at stream_bandwidth) */
  double disk_bandwidth;
} st_fabric;

/* Writes a --fabric spec — "cpu", "cpu:N", "mesh:WxH" or "wse2" — into
 * cfg's fabric keys, as --set would. */
int st_fabric_parse(st_config *cfg, const char *spec, st_error *err);
/* Resolves cfg->fabric into figures: a cpu's cores and memory are detected
 * (fabric.cores overrides the count), wse2 is the published preset, a mesh
 * takes fabric.width/height and the per-PE keys. A fabric.pe_* key that was
 * set explicitly overrides the built-in figure of every kind. */
int st_fabric_resolve(st_fabric *f, const st_config *cfg, st_error *err);
/* st_fabric.bf16's values, and its words ("fp32", "bf16", ...) as the
 * report and plan.json give them */
enum {
  ST_PRODUCTS_BF16_AS_FP32 = -1,
  ST_PRODUCTS_FP32 = 0,
  ST_PRODUCTS_BF16 = 1,
  ST_PRODUCTS_BF16_PE_FLOPS = 2,
  ST_PRODUCTS_BF16_MEASURED = 3
};
const char *st_fabric_products(const st_fabric *f);

int st_gemm_class(double M, double N, double K);
/* The calibrated share of spill_cost a stage touching ws bytes per
 * micro-batch pays (st_fabric; 0 without the measurement). */
double st_spill_fraction(const st_fabric *f, double ws);
/* Bytes/s a one-row linear layer streams in a stage touching ws bytes a
 * step: interpolated on (row_step_ws, row_step_rate), the first rate
 * below the first point and the last past the last; 0 without the
 * curve. */
double st_row_rate(const st_fabric *f, double ws);
/* The same for a one-row layer whose gradient accumulates (no update
 * fused), on (rank_one_ws, rank_one_rate); 0 without that curve. */
double st_rank_one_rate(const st_fabric *f, double ws);
/* The slope s of e(c) = 1/(1 + s (c - 1)) of one-row layers in a stage
 * touching ws bytes a step (st_fabric.row_slope); 0 without the curve. */
double st_row_slope(const st_fabric *f, double ws);
const char *st_gemm_class_name(int cls);
const char *st_op_class_name(int cls);

/* A calibration profile: this machine's kernel rates, measured by `strata
 * bench --calibrate` and stored as JSON (format "strata-calibration",
 * version 1) at $STRATA_CALIBRATION or ~/.cache/strata/calibration.json. */
#define ST_CALIBRATION_VERSION 1
#define ST_CALIBRATION_MAX_THREADS 8
typedef struct st_calibration {
  char date[32];                      /* UTC, ISO 8601 */
  int cores;                          /* usable cores when measured */
  int gemm_shape[ST_GEMM_CLASSES][3]; /* M, N, K measured per class */
  double gemm_rate[ST_GEMM_CLASSES];  /* FLOP/s, one thread */
  int n_threads;                      /* thread counts measured: 1, 2, 4, ... */
  int threads[ST_CALIBRATION_MAX_THREADS];
  double gemm_rate_threads[ST_CALIBRATION_MAX_THREADS]; /* largest class */
  double efficiency[ST_CALIBRATION_MAX_THREADS]; /* rate(c) / (c rate(1)) */
  double efficiency_slope; /* s of e(c) = 1/(1 + s (c - 1)), fitted */
  /* n one-thread GEMMs at once (independent stages), n = threads[i]:
   * their summed rate / (n rate(1)); the slope of m(n) = 1/(1 + s (n-1)).
   * Hyperthreads sharing a core, or a shared memory bus, show here. A
   * profile without them (older) reads as 1 and 0: independent cores. */
  double sharing[ST_CALIBRATION_MAX_THREADS];
  double sharing_slope;
  double op_bandwidth[ST_OP_CLASSES]; /* bytes/s, one thread */
  /* the conv2d and attention kernels, forward [0] and backward [1], FLOP/s
   * of one thread by class; shapes: conv (batch, in channels, height =
   * width, out channels), 3x3 same-padded; attention (batch, context,
   * width, heads). A profile without them (older) reads as 0: timed at
   * the GEMM rates; its gelu reads as pointwise. */
  int conv_shape[ST_GEMM_CLASSES][4];
  double conv_rate[2][ST_GEMM_CLASSES];
  int attention_shape[ST_GEMM_CLASSES][4];
  double attention_rate[2][ST_GEMM_CLASSES];
  double copy_bandwidth; /* bytes/s, memcpy of activation-sized buffers */
  /* The machine's sustained memory bandwidth on threads[i] threads, bytes/s:
   * a STREAM-like triad a[i] = b[i] + s c[i] over three float arrays
   * together at least four times the last-level cache, counted as STREAM
   * counts it (12 bytes an element: two reads, one write). A profile
   * without it (older) reads as 0: the built-in figure stands. Every value
   * within ST_MEMORY_BANDWIDTH_MIN .. _MAX (st_memory_bandwidth_plausible)
   * or none. */
  double memory_bandwidth[ST_CALIBRATION_MAX_THREADS];
  /* the caller's work between steps: a batch's input filled from a
   * dataset larger than the caches (bytes/s of fp32 input written), and a
   * step handed to a stage thread and back (seconds): step_latency as
   * threaded pipelined backprop hands it (the caller sleeps),
   * hosted_latency as a pipeline does in one process (the caller runs the
   * first stage and spins). A profile without them (older) reads as 0:
   * not modelled. */
  double input_bandwidth;
  double step_latency;
  double hosted_latency;
  /* The memory terms of linear GEMMs (st_fabric). narrow_rate: FLOP/s of
   * the large class's layer step at narrow_rows rows (hot), beside
   * gemm_rate at the class's own rows; l2_bytes: one core's L2 (sysfs).
   * spill_cost: seconds per weight byte the same narrow step adds when its
   * weights come from memory; spill_ws / spill_fraction: the share of that
   * it paid with spill_ws bytes touched between steps. A profile without
   * them (older) reads as 0: not modelled. */
  int narrow_rows;
  double narrow_rate, l2_bytes, spill_cost;
  int n_spill;
  double spill_ws[ST_SPILL_POINTS], spill_fraction[ST_SPILL_POINTS];
  /* FLOP/s of the medium class's layer step at narrow_rows rows, its
   * weights in L2: what few rows cost beside the class's own rate with no
   * memory behind it. A profile without it (older) reads as 0: narrow
   * rows then cost only the memory term. */
  double narrow_l2_rate;
  /* A linear layer's products at one row, forward and input gradient
   * (matrix-vector) and weight gradient (rank one), on weights past L2:
   * bytes of weights streamed per second (once, once, read and written).
   * A profile without it (older) reads as 0: timed as GEMMs. */
  double row_bandwidth;
  /* The trainer's own one-row layer step (its forward's matrix-vector
   * product, then the update fused with the input gradient: weights read,
   * read, read and written, momentum read and written, 6 bytes per weight
   * byte) as bytes of weights streamed per second, at rising bytes
   * touched a step: the weights and momentum alone, on two shapes, then
   * the larger with more written between steps, as other layers' work
   * does in training. Rates made not to rise with the bytes. A profile
   * without it (older) reads as n_row_step 0: row_bandwidth prices one
   * row. */
  int n_row_step;
  double row_step_ws[ST_ROW_POINTS], row_step_rate[ST_ROW_POINTS];
  /* The one-row step where the gradient accumulates (micro-batches of one
   * row in a batch of more: matrix-vector products, a rank-one weight
   * gradient added, no update; 4 bytes per weight byte), on the same
   * points. A profile without it (older) reads as n_rank_one 0:
   * row_bandwidth prices those. */
  int n_rank_one;
  double rank_one_ws[ST_ROW_POINTS], rank_one_rate[ST_ROW_POINTS];
  /* The same step (the larger shape, nothing written between) on the
   * profile's most threads, c, against one: e = rate(c) / (c rate(1)),
   * best of paired rounds (1 with one thread). Read with the curve. */
  double row_step_efficiency;
  /* The same at the curve's first shape (784 x 256, weights and momentum
   * 1.5 MB): a small layer's step is a few microseconds, in which the
   * pool's rounds weigh more (0.74 there against 0.85-0.93 at the larger
   * on the 2-vCPU Zen 4 VM). A profile without it (older) reads as 0:
   * the larger's efficiency at every size. */
  double row_step_efficiency_small;
  /* FLOP/s on one thread of each st_gemm_choose class's product (500 rows,
   * 768 columns, K at the class's top: 512, 1536, 3072) by the packed
   * kernel [0] and by the BLAS's tiles [1]; 0 where the packed kernel
   * cannot take it here (a profile without them, older, reads as 0). */
  double gemm_choice_rate[2][ST_GEMM_CHOICES];
  /* FLOP/s on one thread of class 1's product (A plain, K 1536) under
   * train.precision: bf16, by the AVX512-BF16 instruction [0] (0 where the
   * build has none) and by its emulation [1]; 0 0 in a profile without
   * them (older). */
  double gemm_bf16_rate[2];
  /* FLOP/s on one thread of each class's layer step (gemm_rate's shapes)
   * under train.precision: bf16, by the kernel such a run takes here with
   * subnormals flushed (AMX's tiles, the instruction, or the emulation
   * where gemm_bf16_rate measured it faster); the compiler times a bf16
   * run's products at these rates (0 in a profile without them, older: at
   * fp32's, and the plan says so). */
  double gemm_bf16_class_rate[ST_GEMM_CLASSES];
  /* The same on all the profile's cores (`cores` threads; 0 on one core or
   * in an older profile): how each class's bf16 products share out, which
   * fp32's e(c) does not tell (AMX's tiles finish a small product before
   * a second thread would pay for itself). */
  double gemm_bf16_class_rate_all[ST_GEMM_CLASSES];
  /* st_calibration_round_trip as the pass began and ended (0 on one
   * thread): in which state of a shared VM the pass was measured. Not
   * stored in the profile. */
  double round_trip[2];
} st_calibration;

/* The bounds a measured memory bandwidth must lie within to be believed,
 * bytes/s: below 100 MB/s no DRAM of this century streams (a broken timer
 * or a machine swapping), above 10 TB/s no CPU socket pair reaches (two
 * 12-channel DDR5-6400 sockets peak at 1.2 TB/s; HBM parts at a few
 * TB/s). */
#define ST_MEMORY_BANDWIDTH_MIN 1e8
#define ST_MEMORY_BANDWIDTH_MAX 1e13
/* 1 if bw (bytes/s) is finite and within those bounds. */
int st_memory_bandwidth_plausible(double bw);

/* Measures this machine (a few seconds); threads 1, 2, 4, ... up
 * to max_threads. progress (may be NULL) gets one line per measurement. */
int st_calibration_measure(st_calibration *c, int max_threads, FILE *progress,
                           st_error *err);
/* The machine's state now, in seconds: the median over 9 windows of one
 * round trip of an empty task handed to each of a pool's `threads`
 * threads and back (st_pool_for), the workers spinning. It is the cost of
 * moving a cache line between the cores, which a shared VM changes when
 * its host moves the vCPUs: on the 2-vCPU Zen 4 VM it reads 0.22-0.24 us
 * with both on one L3 and 0.77-0.80 with them on two, for tens of seconds
 * at a time, and every 2-thread rate falls meanwhile (docs/compiler.md,
 * "Prediction accuracy"). 0 on one thread; -1 when the pool could not be
 * made. */
double st_calibration_round_trip(int threads);
/* Seconds a step takes to go to `stages` stages and back. Not hosted, as
 * threaded pipelined backprop's caller hands it (st_calibration.
 * step_latency): the caller publishes it and sleeps, the stages spin
 * between steps (as many threads as there are cores, so the caller's
 * wake-up takes a core from one). Hosted, as a pipeline's caller does in
 * one process (hosted_latency): the caller is the first stage, the other
 * stages-1 are threads, and it spins for their counts. -1 when the
 * threads could not be started. */
double st_calibration_handoff(int stages, int hosted);
/* Writes the profile atomically / reads and checks one (format, version,
 * every figure present and positive); errors name the file. */
/* One profile from n passes of st_calibration_measure on one machine, so
 * that a burst of other load during one pass is outvoted: each figure the
 * median of its passes, the narrow steps' memory terms (spill cost and
 * curve) those of the pass with the median spill cost, e(c) and m(n)
 * refitted to the median efficiencies. ST_EARG when n is outside
 * 1..ST_CALIBRATION_MAX_PASSES or the passes measured different threads. */
#define ST_CALIBRATION_MAX_PASSES 9
/* Which of n passes were measured in the machine's usual state: keep[i] =
 * 1 where both of pass i's round trips are within ST_CALIBRATION_FAR of
 * the reference, either way: the round trip that most of the others are
 * within that factor of (ties: the least). Passes without round trips
 * (0: one thread) are kept. Returns how many are kept, possibly 0, and
 * the reference in *reference (0: none; may be NULL). */
#define ST_CALIBRATION_FAR 1.5
int st_calibration_near(const st_calibration *passes, int n, int *keep,
                        double *reference);
int st_calibration_merge(st_calibration *out, const st_calibration *passes,
                         int n);
/* The kernel per st_gemm_choose class the profile measured faster (1 the
 * BLAS's, 0 packed), -1 where it measured none; st_gemm_choose_profile
 * applies the profile in effect (st_calibration_path: none, missing or
 * unreadable leaves the rule built in) and returns 1 when it did. */
void st_calibration_gemm_choice(const st_calibration *c,
                                int blas[ST_GEMM_CHOICES]);
int st_gemm_choose_profile(void);
/* What the profile st_gemm_choose_profile applied measured on one thread
 * at class 1's product: bf16's rate by the kernel that runs now
 * (st_bf16_native) and fp32's by the faster of its two. Returns 0 where
 * it measured either as 0 or none was applied. */
int st_bf16_profile_rates(double *bf16, double *fp32);
/* st_gemm_choose_profile the first time a process calls it, and nothing
 * after: every trainer of a process (an experiment's parallel runs, a
 * resumed run) multiplies with the same kernels. */
void st_gemm_choose_profile_once(void);
int st_calibration_write(const st_calibration *c, const char *path,
                         st_error *err);
int st_calibration_read(st_calibration *c, const char *path, st_error *err);
/* The profile path: $STRATA_CALIBRATION, else
 * $HOME/.cache/strata/calibration.json. Returns 0 with buf "" when
 * STRATA_CALIBRATION is "none" (calibration off). */
int st_calibration_path(char *buf, size_t cap);
/* Applies a profile to a cpu fabric (rates, slope, copy bandwidth). */
void st_calibration_apply(const st_calibration *c, st_fabric *f,
                          const char *path);

/* Pass 1 (cost): what the compiler knows of one block. */
typedef struct st_block_cost {
  char name[24];
  double flops_fwd, flops_bwd; /* per sample */
  /* the same work split for a calibrated cost model, per sample: FLOPs
   * of linear layers' GEMMs, of conv2d and of attention by GEMM class, and
   * bytes moved by the other ops */
  double gemm_fwd[ST_GEMM_CLASSES], gemm_bwd[ST_GEMM_CLASSES];
  double conv_fwd[ST_GEMM_CLASSES], conv_bwd[ST_GEMM_CLASSES];
  double attn_fwd[ST_GEMM_CLASSES], attn_bwd[ST_GEMM_CLASSES];
  double bytes_fwd[ST_OP_CLASSES], bytes_bwd[ST_OP_CLASSES];
  double param_bytes;         /* weights */
  double state_bytes;         /* gradient + optimizer state */
  double act_bytes;           /* activations + saved state, per sample */
  double in_bytes, out_bytes; /* input and output activation, per sample */
  /* The stage workspace this block needs (runtime/stage.c): its largest
   * layer input or output and its scratch, bytes a sample of a call; a
   * stage holds, for its calls' samples, 5 x the largest of the first over
   * its blocks plus the largest of the second, once (its activation slots
   * share it). */
  double work_numel_bytes, work_scratch_bytes;
  /* Linear layers' weights for the calibrated memory terms (st_fabric):
   * per layer its weight bytes, the rows of its GEMM calls (micro-batch x
   * positions) and the GEMMs of its step (3, or 2 without an input
   * gradient); a block with more than ST_BLOCK_LINEARS folds the rest into
   * the last. A call covers call_samples samples. ws_bytes: what one
   * micro-batch's forward and another's backward touch in this block
   * (weights, gradients, activations and inputs). */
#define ST_BLOCK_LINEARS 8
  int n_linear;
  /* Linear layers at one row (a micro-batch of one sample at one
   * position): matrix-vector products and rank-one updates, which stream
   * the weights more than they compute. Their FLOPs by class, kept apart
   * from gemm_fwd/bwd (timed at the GEMM rates when the profile has no
   * row bandwidth), and the bytes they stream per sample: forward, the
   * weights once; backward, once more for the input gradient, and read and
   * written for the weight gradient, or, where the update is folded into
   * the backward (pipelined backprop at a micro-batch of one, the other
   * modes at a batch of one), the weights and optimizer state read and
   * written. */
  double row_gemm_fwd[ST_GEMM_CLASSES], row_gemm_bwd[ST_GEMM_CLASSES];
  double row_bytes_fwd, row_bytes_bwd;
  /* of which those of layers whose update is folded in: the step the
   * profile's one-row curve measures (the rest, a rank-one gradient
   * written, go at its row bandwidth) */
  double row_fused_fwd, row_fused_bwd;
  double linear_bytes[ST_BLOCK_LINEARS], linear_rows[ST_BLOCK_LINEARS];
  double linear_gemms[ST_BLOCK_LINEARS];
  double call_samples, ws_bytes;
  /* What a step touches beside ws_bytes: the optimizer state its update
   * reads and writes (slots floats a parameter, but for those a fused
   * update streams in place of a gradient, which ws_bytes counts). With
   * ws_bytes, what must pass through memory once a step when it is more
   * than the cache holds (stage_dram_time). */
  double state_touched;
  /* Measured (execution.block_costs: measured, st_plan_measure): this
   * block's forward, and backward with its update, timed here on one core
   * at the plan's micro-batch, seconds per sample; the partitioner takes
   * them in place of every modelled term above. 0: modelled. */
  double measured_fwd, measured_bwd;
  /* Of param_bytes, a tied copy's (a GPT head's copy of the embedding):
   * weight streaming's update reads its gradient and writes it from its
   * source's new weights, reading no weights or state of its own. */
  double tied_bytes;
  /* The optimizer step's FLOPs a sample (its updates per sample times the
   * rule's FLOPs a parameter; a tied copy has no update of its own):
   * uncalibrated, timed at pe_flops with the backward; calibrated, its
   * bytes (bytes_bwd[3]) time it. 0 under weight streaming, whose model
   * prices the update on its own. Not in flops_bwd. */
  double flops_update;
  /* Pipelined backprop with linear weight prediction (lwp, sc+lwp): what the
   * prediction adds to the block at a stage with D > 0, every stage but the
   * last, per sample. Modelled, the bytes it moves: where the update is folded
   * into the backward, each update writes the predicted weights (and each
   * step's first forward makes them in a pass); else every forward makes them
   * in a pass (a read of w and v, a write). Measured (execution.block_costs:
   * measured), the seconds: the block's forward on the prediction and backward
   * writing it, less its plain forward and backward. 0 in other configurations.
   */
  double lwp_bytes, measured_lwp;
  /* On a mesh, the data a block's layers move through the region that
   * holds it, per sample and pass (forward; the backward moves as much):
   * region_in the inputs of the layers whose weights or work spread over
   * the region (linear, conv2d, attention, embedding), entering along one
   * edge, region_out their outputs, partial sums crossing the other;
   * region_layers how many such layers (each pays the hops across the
   * region and a fixed per-PE overhead). label_bytes: the labels a sample
   * brings (last block only), which with the first block's input is what
   * the fabric's I/O carries. */
  double region_in, region_out, region_layers, label_bytes;
} st_block_cost;

/* Fills out[0 .. m->n_blocks) from the model's descriptors (no parameter
 * memory needed) and cfg's optimizer (its state per parameter). */
void st_plan_costs(st_block_cost *out, const st_model *m, const st_config *cfg);
/* Times every block of m on this machine and writes out[i].measured_fwd and
 * .measured_bwd: one thread, st_plan_micro_batch(cfg) samples, the forward,
 * then the backward with the optimizer's update as training runs it (fused
 * into the backward where the trainer fuses it), on freshly initialised
 * weights; the median over repeated runs (at least 5, about 0.25 s in all),
 * so that a burst of load elsewhere moves no block's figure. Allocates the
 * model's weights, gradients and optimizer state. */
int st_plan_measure(st_block_cost *out, const st_model *m, const st_config *cfg,
                    st_error *err);
/* st_plan_costs, then st_plan_measure when cfg's execution.block_costs is
 * measured: the costs every plan of cfg's model is cut by. */
int st_plan_block_costs(st_block_cost *out, const st_model *m,
                        const st_config *cfg, st_error *err);

typedef enum {
  ST_PARTITION_AUTO,   /* DP over cores on a cpu, bisection otherwise */
  ST_PARTITION_DP,     /* dynamic programming over (blocks, stages, PEs) */
  ST_PARTITION_BISECT, /* bisection on the bottleneck, exact DP feasibility */
} st_partition_algorithm;

typedef struct st_plan_options {
  int stages;               /* K; 0 = the K with the best throughput */
  double samples_in_flight; /* activations each stage holds, in samples */
  double weight_versions;   /* weight copies each stage holds (1) */
  st_partition_algorithm algorithm;
  const char *stages_key;   /* what asked for K, in messages (NULL:
                               "--stages"; "execution.stages") */
  const char *stages_where; /* and where, prefixed to its errors (NULL) */
  /* blocks of each stage, pinning the cut (execution.stage_blocks; K is
   * then their count); NULL for the partitioner's cut */
  const int *stage_blocks;
  int n_stage_blocks;
  /* In flight as the schedule keeps it: with in_flight_schedule set
   * ("gpipe", "1f1b", "interleaved", "zb1p" or "pb"), stage s of S holds
   * the activations of micro_batch x (the micro-batches its schedule keeps
   * between a forward and the op that frees it: st_schedule's slots; pb,
   * 2 (S - s) - 1) samples, of micro_batches M (V chunks a worker,
   * interleaved), instead of samples_in_flight at every stage; with "pb",
   * stage s's weight versions are its live weights and the copies its
   * delay 2 (S - 1 - s) makes mitigation keep (st_pb_weight_copies) */
  const char *in_flight_schedule;
  int micro_batch, micro_batches, virtual_stages;
  const char *mitigation; /* pipelined backprop's execution.mitigation
                             (NULL: none) */
} st_plan_options;

#define ST_CAUSE_MAX 320

typedef struct st_plan_stage {
  int first, count;            /* blocks [first, first + count) */
  int64_t pes;                 /* PEs (cores) it gets */
  int x, y, w, h;              /* its rectangle of PEs on the fabric */
  int64_t pes_for_time;        /* the fewest meeting the bottleneck time */
  int64_t pes_for_memory;      /* the fewest holding its memory */
  double flops_fwd, flops_bwd; /* per sample */
  double time_fwd, time_bwd, time_comm, time; /* seconds per sample */
  double mem_weights;                         /* weights x versions held */
  double mem_state;                           /* gradient + optimizer state */
  double mem_acts; /* (input + activations) x samples in flight */
  double mem_work; /* its workspace, once (st_block_cost.work_*) */
  double mem_total, mem_capacity; /* bytes: needed, and pes x pe_memory */
  double mem_replicas; /* within mem_total: what the other replicas' copies
                          of this stage hold (their gradient slabs,
                          activations and workspace; 0 for one replica) */
  double mem_eval;     /* an evaluation of its blocks: their activations and
                          workspace at the evaluation batch (st_plan_compile;
                          0 where not computed) */
  double in_flight;    /* samples whose activations it holds */
  double versions;     /* weight copies it holds */
  char bound[24];      /* what limits it: compute, communication, memory,
                          memory bandwidth or
                          I/O (docs/compiler.md) */
  double working_set;  /* bytes a micro-batch's step touches */
  double spill;        /* calibrated share of the weights' memory
                          time it pays (st_fabric), 0..1 */
  char cause[ST_CAUSE_MAX]; /* why cut here, why this many PEs */
} st_plan_stage;

typedef struct st_plan {
  st_fabric fabric;
  st_plan_options options;
  char model[ST_PATH_MAX];               /* config path or "" */
  char mode[24];                         /* execution.mode */
  int batch, micro_batch, micro_batches; /* M = batch / micro_batch */
  int n_blocks;
  st_block_cost *blocks;
  int n_stages;
  st_plan_stage *stages;
  int band_height, bands; /* mesh: stages sit in bands of rows, snake */
  int64_t pes_used;
  int bottleneck;         /* index of the slowest stage */
  double bottleneck_time; /* seconds per sample */
  double throughput;      /* samples/s in steady state, 1 / bottleneck */
  double balance;         /* mean stage time / bottleneck time */
  char schedule[16];      /* pipeline: execution.schedule, else gpipe */
  int virtual_stages;     /* interleaved: chunks a stage worker runs */
  double util_fill_drain; /* the schedule's bubble with ops of equal cost
                             (st_schedule_formula; gpipe, 1f1b: M / (M +
                             S - 1)) */
  double handoff_time;    /* interleaved: seconds per sample of the extra
                             hand-offs a worker of V chunks makes, (V - 1)
                             x the bottleneck stage's own */
  double util_pipelined;  /* steady state of pipelined backprop: 1 */
  double host_time;       /* seconds per sample the caller spends
                             between steps, serial with the stages
                             (batch input, step hand-off; 0 unless
                             calibrated) */
  /* Over MPI ranks (st_plan_place_ranks; 0: one process): the ranks,
   * each rank's bytes by the plan's stage memory and the stages it holds
   * (rank_stages[r] .. rank_stages_end[r] - 1; none for a weight store) */
  int ranks;
  double rank_allowed;   /* bytes each rank may hold (0: not checked) */
  int rank_per_machine;  /* ranks whose machine's memory gives them that
                            (0: execution.rank_memory_limit does) */
  double mem_eval_whole; /* an evaluation of the whole model, in one stage */
  int eval_batch;        /* samples an evaluation runs at once (0: unknown) */
  /* What every rank (or the one process) holds beside its stages, as the
   * trainer holds it, counted in rank_memory (st_plan_compile, where there
   * are ranks or a rank_memory_limit; 0 otherwise): the data as loaded
   * (st_data_footprint; -1 where its files could not be sized, data_note
   * then says why) and the trainer's batch buffers
   * (st_trainer_batch_bytes) */
  double mem_data, mem_batch;
  char data_note[160];
  double *rank_memory;
  int *rank_stages, *rank_stages_end;
  /* The fabric's I/O (st_fabric.io_bandwidth): samples/s it carries in
   * (input and labels); throughput is capped by it (0: not modelled) */
  double io_rate;
  /* Data parallelism in one process (execution.replicas R > 1, replicas.c):
   * the stages are one replica's, on replica_pes PEs of its own and its
   * share of the batch (batch, micro_batches: the replica's), their times
   * per sample of that replica; the R replicas run at once, then their
   * gradient slabs are summed (reduce_time: seconds per sample of the
   * whole batch, at the fabric's memory bandwidth). throughput is all R
   * replicas' together. replicas 1: none of this. */
  int replicas;
  int64_t replica_pes;
  int global_batch;
  double reduce_time;
  /* Weight streaming (mode "weight_streaming"): one block at a time on the
   * whole fabric, its weights from the store at stream_bandwidth. Seconds
   * per sample of the batch's compute and of its streaming, summed over
   * the blocks, forward and backward (the plan's one stage takes, block by
   * block, the larger of the two: bottleneck_time; micro_batches splits
   * the batch so that its activations fit). */
  double ws_compute, ws_stream;
  /* and of a file store's disk (0: none, or not modelled): the bytes each
   * step must cross it, over disk_bandwidth, a sample; ws_cached: the page
   * cache holds the store file (the disk then carries the synced writes
   * only, else every read too) */
  double ws_disk;
  int ws_cached;
  char mode_why[1024];      /* why this mode (st_plan_choose; "" when the plan
                               is the config's as `strata train` runs it) */
  int n_tried;              /* throughput_by_k[k - 1] for k in 1..n_tried */
  double *throughput_by_k;  /* (0 = infeasible); NULL if not computed */
  char cause[ST_CAUSE_MAX]; /* why this many stages */
} st_plan;

/* Passes 2-4 on given block costs: partition into stages, allocate PEs,
 * place them. Errors: more stages than blocks or PEs; a model that fits no
 * plan names the block that does not fit and by how many bytes. */
int st_plan_build(st_plan **out, const st_block_cost *blocks, int n_blocks,
                  const st_fabric *fabric, const st_plan_options *opt,
                  st_error *err);
/* Where weight streaming's store is (st_plan_streaming): store_on_fabric,
 * a cpu's memory store, whose weights and state the fabric holds; file, a
 * cpu's file store, on the disk at st_fabric.disk_bandwidth behind the
 * page cache; bf16, its weights stored as bf16 (execution.store_weights),
 * 2 bytes each where they cross. All 0: a fp32 store beside the fabric. */
typedef struct st_stream_store {
  int on_fabric, file, bf16;
} st_stream_store;

/* Weight streaming on a fabric (st_plan.ws_*), as src/exec/ws.c runs it:
 * one block at a time on all its PEs, the batch in micro-batches of
 * micro_batch samples whose activations stay on the fabric. What crosses
 * between the store and the compute side, a block of W weight bytes
 * (W' stored: W, or W / 2 bf16), G = W of gradient, s optimizer slots:
 * per micro-batch W' in for the forward and again for the backward (a
 * fetch thread brings it while the block before computes), its gradient G
 * out and, after the first micro-batch, the partial gradient G back (both
 * on the compute thread); per step the update reads W', G and s G of
 * state and writes W' and s G (a tied copy: reads its G, writes W'). A
 * cpu's store is one channel at stream_bandwidth (a memcpy, or pread and
 * pwrite through the page cache) that every byte takes in turn; the
 * updates of all blocks but the first overlap the compute side, the first
 * block's comes last:  T_step = max(C, B - U_0) + U_0, C the compute
 * side's time (its compute, a block's fetch where it is longer, and its
 * gradient copies), B all bytes over bw, U_0 the first block's update. A
 * file store's disk carries, each step, the writes its commit syncs (the
 * gradient, the update's weights and state) and, when the page cache
 * cannot hold the store beside what the fabric holds, every read too:
 * T_step >= those bytes / disk_bandwidth. A mesh's link carries both ways
 * at once, overlapping the compute: per block and micro-batch
 * max(m t_f, W' / bw) + max(m t_b, (W' + G back) / bw, G / bw); its update
 * runs in the store, beside the link. The rate is batch / T_step, capped
 * by the fabric's I/O. The fabric holds the micro-batch's activations of
 * every block (keep_activations; else each block's input and one
 * block's), slots blocks of weights and one gradient, and a memory store's
 * weights and state. ST_EUNSUPPORTED, naming what does not fit, when that
 * is more than the fabric holds. store NULL: all 0. */
int st_plan_streaming(st_plan **out, const st_block_cost *blocks, int n,
                      const st_fabric *fabric, int batch, int micro_batch,
                      int slots, int keep_activations,
                      const st_stream_store *store, st_error *err);
/* The bytes st_plan_streaming's fabric holds at micro-batches of m. */
double st_plan_streaming_need(const st_block_cost *blocks, int n, int m,
                              int slots, int keep_activations,
                              int store_on_fabric);
/* `strata compile`'s plan: the mode chosen by memory (docs/compiler.md,
 * "Choosing the mode"), or `force` (a mode name) with what it costs against
 * the chosen one; execution.micro_batch 0 picked by the compiler. NULL
 * force and a fitting config: what st_plan_compile gives. *applied (if not
 * NULL) gets cfg as planned: its mode, micro-batch, store and
 * keep_activations as chosen. A refusal names
 * what does not fit in each mode tried and the smallest fabric of the kind
 * that would hold the model. */
int st_plan_choose(st_plan **out, const st_config *cfg, int stages,
                   const char *force, st_config *applied, st_error *err);
/* All passes for cfg's model on cfg's fabric; stages as in options (0 =
 * the number a pipeline or pipelined_backprop config's execution.stages
 * gives, else automatic). Samples in flight follow execution.mode
 * (docs/compiler.md). */
int st_plan_compile(st_plan **out, const st_config *cfg, int stages,
                    st_error *err);
void st_plan_destroy(st_plan *p);
/* Pass 4b, over cfg->launch.ranks MPI ranks: which stages each rank holds
 * and the bytes that make (the stages' weights, state and activations as
 * the plan counts them): a stage per rank with execution.placement: ranks
 * (stage s of k on rank s P / k of each replica's P ranks), every stage on
 * every rank for data parallelism, the weights and state on rank 0 for
 * weight streaming (the activations and prefetch + 1 blocks on the
 * others). A rank over what it may hold — execution.rank_memory_limit, or
 * on a cpu its machine's memory over the launch's per_machine ranks,
 * whichever is less — is an error naming it, the binding limit, its
 * largest block and the shortfall. ranks <= 1: one process, checked
 * against the limit if one is set (its replicas were checked together by
 * st_plan_compile). */
int st_plan_place_ranks(st_plan *p, const st_config *cfg, st_error *err);
/* The plan's predicted training rate, samples/s: the steady-state
 * throughput at the schedule's utilization (pipelined != 0: pipelined
 * backprop's, else fill-and-drain's, with interleaving's extra hand-offs),
 * with the caller's serial time between steps (host_time) added to each
 * sample's. */
double st_plan_rate(const st_plan *p, int pipelined);
/* Pass 5 (report): the text report, DIR/plan.json and DIR/plan.svg. */
void st_plan_print(const st_plan *p, FILE *f);
int st_plan_write_json(const st_plan *p, const char *path, st_error *err);
int st_plan_write_svg(const st_plan *p, const char *path, st_error *err);
/* compile --validate-only: builds the model's descriptors and prints its
 * parameters, FLOPs per sample and memory. Allocates no model memory. */
int st_plan_validate(const st_config *cfg, FILE *f, st_error *err);

/* ------------------------------------------------------------ checkpoint */

/* Where training stands: enough to resume exactly, plus what the position is
 * relative to (a resume under another seed, batch, training set or shuffling
 * would not continue the same run, so it is refused). */
typedef struct st_train_pos {
  int64_t step;          /* optimizer steps done */
  int64_t epoch;         /* current epoch (0-based) */
  int64_t epoch_pos;     /* samples of this epoch already consumed */
  int64_t samples;       /* samples consumed in total (dropout stream) */
  uint64_t seed;         /* train.seed */
  int64_t batch;         /* train.batch */
  int64_t train_samples; /* training-set size */
  int64_t shuffle;       /* data.shuffle */
  /* metrics.noise_scale's averages after the step (st_noise_scale's g2,
   * trace, weight, n), so that a resumed run reports what the
   * uninterrupted one does; noise_n 0: none kept */
  double noise_g2, noise_trace, noise_weight;
  int64_t noise_n;
  /* CRC-32 of the training set as trained on (samples and labels, or the
   * tokens); has_train_crc 0: not recorded (an older checkpoint) */
  uint32_t train_crc, has_train_crc;
  /* CRC-32 of a text run's tokenizer (st_tokenizer_crc); has 0: none (an
   * image run, or an older checkpoint) */
  uint32_t tokenizer_crc, has_tokenizer_crc;
  /* data.normalize of an image run: 1 if its pixels were standardised;
   * has_normalize 0: not recorded (a text run, or an older checkpoint) */
  uint32_t normalize, has_normalize;
  /* pipelined backprop's micro-batch (execution.micro_batch, 0 taken as 1):
   * every micro-batch is an update, so it fixes the updates a step makes
   * (train.batch / it), which the optimizer's step count (AdamW's bias
   * correction, momentum's first step, PipeMare's warm-up) and a resume's
   * count of them rest on; 0: not recorded (another mode, or an older
   * checkpoint) */
  int64_t pb_micro_batch;
} st_train_pos;

/* Writes weights (by tensor name), optimizer state ("optim.<name>.<slot>")
 * and the position as metadata, atomically. opt_state and pos may be NULL. */
int st_checkpoint_save(const char *path, const st_model *m, const float *params,
                       const float *opt_state, const char *optim_kind,
                       const st_train_pos *pos, st_error *err);
/* The same with the weights in params_dtype: "F32" (floats) or "BF16"
 * (uint16_t bf16 values, as weight streaming's file store keeps them). */
int st_checkpoint_save_as(const char *path, const st_model *m,
                          const void *params, const char *params_dtype,
                          const float *opt_state, const char *optim_kind,
                          const st_train_pos *pos, st_error *err);
/* Reads a checkpoint written by st_checkpoint_save (or any safetensors with
 * the model's tensor names). Weights may be F32 or BF16 (widened exactly);
 * optimizer state is F32. Missing or mis-shaped tensors and out-of-range
 * positions are errors naming the tensor or key; everything is checked
 * before anything is copied, so on error the outputs are untouched.
 * opt_state / pos may be NULL to load weights only. */
int st_checkpoint_load(const char *path, const st_model *m, float *params,
                       float *opt_state, const char *optim_kind,
                       st_train_pos *pos, st_error *err);
/* The same, reading only the tensors of the blocks mine[i] marks (NULL:
 * all): a rank of a pipeline over ranks loads its own stages, touching no
 * other offset of params and opt_state. Every tensor is still checked.
 * params NULL: only checks (and reads *pos), copying nothing. */
int st_checkpoint_load_blocks(const char *path, const st_model *m,
                              float *params, float *opt_state,
                              const char *optim_kind, st_train_pos *pos,
                              const unsigned char *mine, st_error *err);
/* The training samples a strata checkpoint (file or sharded directory) was
 * written with: 1 and *n when its metadata has them, 0 otherwise (another
 * tool's file, or one that cannot be read: loading says why). */
int st_checkpoint_train_samples(const char *path, int64_t *n);
/* The same for the tokenizer's CRC-32 a text run's checkpoint records. */
int st_checkpoint_tokenizer_crc(const char *path, uint32_t *crc);
/* The same for the training set's CRC-32 (st_train_pos.train_crc). */
int st_checkpoint_train_crc(const char *path, uint32_t *crc);
/* The same for an image run's data.normalize (st_train_pos.normalize). */
int st_checkpoint_normalize(const char *path, int *normalize);
/* A sharded checkpoint (train.checkpoint_format: shards): a directory of
 * shards model-0000k-of-0000n.safetensors, each the tensors (weights and
 * optimizer state) of the blocks mine[i] marks, with the metadata of a
 * whole checkpoint, and model.safetensors.index.json, written last, mapping
 * every tensor to its shard (the form Hugging Face tools read). Loading
 * and st_checkpoint_load take the directory's path as they take a file's.
 * shard_of[i]: block i's shard (0-based). */
int st_checkpoint_save_shard(const char *path, const st_model *m,
                             const float *params, const float *opt_state,
                             const char *optim_kind, const st_train_pos *pos,
                             const unsigned char *mine, st_error *err);
void st_checkpoint_shard_name(char *out, size_t cap, int shard, int shards);
int st_checkpoint_write_index(const char *dir, const st_model *m,
                              const char *optim_kind, const int *shard_of,
                              int shards, const st_train_pos *pos,
                              st_error *err);
/* A sharded checkpoint of one shard, in directory dir. */
int st_checkpoint_save_sharded(const char *dir, const st_model *m,
                               const float *params, const float *opt_state,
                               const char *optim_kind, const st_train_pos *pos,
                               st_error *err);
/* A sharded checkpoint as one file, streamed tensor by tensor in
 * st_checkpoint_save's order: the file a single-file checkpoint of the same
 * state is, byte for byte. *pos (may be NULL): its position. */
int st_checkpoint_merge(const char *dir, const char *out, const st_model *m,
                        st_train_pos *pos, st_error *err);
/* A checkpoint's tensors in file order — the weights (slot -1), then each
 * optimizer slot's (none with optim_kind NULL) — as slab offsets:
 * fn(arg, slot, off, numel) until one returns nonzero. */
typedef int (*st_checkpoint_fn)(void *arg, int slot, size_t off, size_t numel,
                                st_error *err);
int st_checkpoint_each(const st_model *m, const char *optim_kind,
                       st_checkpoint_fn fn, void *arg, st_error *err);
/* st_checkpoint_save of weights and optimizer state held elsewhere: each
 * tensor's floats come from fetch(arg, slot, off, numel), called once per
 * tensor in st_checkpoint_each's order (even after a write failed) and
 * valid until the next call; NULL fails (err set). The file is streamed:
 * no more than one tensor at a time need be in memory. */
typedef const float *(*st_checkpoint_fetch)(void *arg, int slot, size_t off,
                                            size_t numel, st_error *err);
int st_checkpoint_save_fetch(const char *path, const st_model *m,
                             const char *optim_kind, const st_train_pos *pos,
                             st_checkpoint_fetch fetch, void *arg,
                             st_error *err);

/* ----------------------------------------------------------------- dist */

/* The processes of one run (src/dist/mpi.c). Started by mpirun, strata is
 * one MPI rank per process; otherwise a world of one. st_dist_init starts
 * MPI only when a launcher started this process (and refuses a world of
 * several in a build without MPI, saying so). */
int st_dist_init(int *argc, char ***argv, st_error *err);
void st_dist_finalize(void);
/* Ends every rank of the job (after this rank's error was printed). */
void st_dist_abort(int code);
/* From now on a wait on the other ranks that lasts `seconds` (0: forever;
 * execution.rank_timeout) prints one line naming it and ends the job. */
void st_dist_watch(double seconds);
int st_dist_rank(void);
int st_dist_size(void);
int st_dist_built(void); /* 1 when built with MPI */
/* Whether the last error is every rank's alike (a failed step, a mismatch
 * found at start): then only rank 0 need print it. */
int st_dist_error_shared(void);
void st_dist_share_error(void);
/* Refuses, naming the first rank that differs from rank 0, unless every
 * rank passes the same value (a collective: every rank must call it). */
int st_dist_check_same(uint64_t value, const char *what, st_error *err);
/* rc and err: this rank's result. Every rank learns whether any failed:
 * returns 0 when none did, else the first failure's code (in rank order)
 * with its message (naming the rank) in err, on every rank (the error is
 * then shared: rank 0 alone prints it). */
int st_dist_agree(int rc, st_error *err);

/* ----------------------------------------------------------------- exec */

/* A trainer owns everything one training run needs: the data, the model,
 * one slab each for weights, gradients and optimizer state, the executor of
 * the configured mode and its buffers — all sized and allocated in
 * st_trainer_create, so steps allocate nothing. */
typedef struct st_trainer st_trainer;

/* out_dir may be NULL (no files written). */
int st_trainer_create(st_trainer **out, const st_config *cfg,
                      const char *out_dir, st_error *err);
void st_trainer_destroy(st_trainer *t);
/* One optimizer step on the next batch; *loss is the batch mean loss. */
int st_trainer_step(st_trainer *t, double *loss, st_error *err);
/* The same; ahead = 1 promises that the caller's next call on t is another
 * step: an executor that can (pipelined backprop) then starts the next
 * batch before this step returns, so its workers do not wait at the step
 * boundary. The steps compute the bits st_trainer_step's would, and the
 * position reads the same after each call; but until the next step call
 * returns, the next step may be running: the weights, the stage counters
 * (st_trainer_stats) and the trace are moving. Evaluating, saving, loading,
 * gathering or finishing then is an error; call with ahead = 0 before
 * anything but logging the loss and position. */
int st_trainer_step_ahead(st_trainer *t, int ahead, double *loss,
                          st_error *err);
/* 1 while a step that st_trainer_step_ahead started ahead is running: the
 * next st_trainer_step_ahead call completes it. */
int st_trainer_in_flight(const st_trainer *t);
/* The whole run: steps, evaluation, metrics, checkpoints, progress, summary. */
int st_trainer_run(st_trainer *t, st_error *err);
/* Asks a running st_trainer_run to stop once its current step is done: it
 * writes a checkpoint (or commits the store) and summary.json (marked
 * "interrupted") and returns 0. Async-signal-safe, for a SIGINT or SIGTERM
 * handler; `signo` names the cause. Returns the signal asked for before
 * (0: none), so a second one can exit at once. Over MPI ranks, any rank
 * asked stops every rank at the same step. */
int st_run_request_stop(int signo);
/* The signal the last st_trainer_run stopped for (the largest number any
 * rank was asked with), or 0 if it ran to its end. */
int st_run_stopped_by(void);
/* Writes to stderr, async-signal-safely, one line naming the run's last
 * durable state (its newest complete checkpoint, or its store), for a
 * signal handler: a lost rank makes mpirun signal every other rank. Only
 * a process that writes the run's files (rank 0) has one to say. */
void st_run_say_durable(void);
/* Loss and accuracy over the test set. */
int st_trainer_evaluate(st_trainer *t, double *loss, double *accuracy,
                        st_error *err);
/* The last evaluation st_trainer_run made (at the final step) and the run's
 * training rate; returns 0 if there was one. samples_per_s may be NULL. */
int st_trainer_last_eval(const st_trainer *t, double *loss, double *accuracy,
                         double *samples_per_s);
/* Waits for anything the mode still writes in the background (weight
 * streaming's file store commits each step while the next one runs) and
 * reports its error; 0 when there is nothing. */
int st_trainer_sync(st_trainer *t, st_error *err);
/* The file that keeps the weights and optimizer state, committed every step
 * (weight streaming's file store), else NULL. */
const char *st_trainer_store(const st_trainer *t);
/* 1 when cfg keeps its weights in a file store, whose path (set when
 * empty) is then cfg->execution.store_path: DIR/store.strata by default. */
int st_store_resolve(st_config *cfg, const char *out_dir);
/* The step a weight store's last commit finished (its newer valid header),
 * read from the header alone: no model, no check of the values.
 * ST_EFORMAT when the file is no store at all, ST_EDATA when it is one
 * whose headers are damaged or of another format version. */
int st_store_committed_step(const char *path, int64_t *step, st_error *err);
int st_trainer_save(st_trainer *t, const char *path, st_error *err);
/* weights_only: load weights, keep optimizer state and position. Refused
 * by a pipelined_backprop trainer that has run steps (its pipeline is
 * full): load into a new one. */
int st_trainer_load(st_trainer *t, const char *path, int weights_only,
                    st_error *err);
/* What resuming from path checks before it reads any tensor's data (the
 * tokenizer, every tensor and the optimizer state in this model's shapes,
 * the position, the run): 0 where a resume from it would start, copying
 * nothing. */
int st_trainer_check_resume(const st_trainer *t, const char *path,
                            st_error *err);
const st_model *st_trainer_model(const st_trainer *t);
/* The configuration the trainer runs: the one it was given, with
 * optimizer.reference_batch's rescaled lr and momentum applied. */
const st_config *st_trainer_config(const st_trainer *t);
/* Stages the configured mode runs: 1 for sequential, S for a pipeline. */
int st_trainer_stages(const st_trainer *t);
/* The weights, as floats; NULL when a file store keeps them as bf16
 * (st_trainer_save writes them, as BF16). */
float *st_trainer_params(st_trainer *t);
const st_train_pos *st_trainer_pos(const st_trainer *t);
/* The samples (text: windows) of the training set the config selects. */
int64_t st_trainer_train_samples(const st_trainer *t);
/* Their CRC-32, as a checkpoint records it (st_train_pos.train_crc). */
uint32_t st_trainer_train_crc(const st_trainer *t);
/* The noise-scale estimator, or NULL unless metrics.noise_scale is on. */
const st_noise_scale *st_trainer_noise(const st_trainer *t);
int64_t st_trainer_total_steps(const st_trainer *t);
/* Samples the executor takes at once: execution.micro_batch, else
 * pipelined backprop's 1 or the batch (a replica or rank runs at most its
 * share of it). */
int st_trainer_micro_batch(const st_trainer *t);
/* Training samples (windows for text) one epoch passes over. */
int st_trainer_train_size(const st_trainer *t);
/* Where the mode's time went: one entry per stage (and replica), the
 * seconds each spent on forward, backward and update since the trainer was
 * made; *wall is the seconds spent inside steps. Returns the number of
 * tracks (at most cap are filled). busy / wall is a stage's busy fraction;
 * their mean is the measured pipeline utilization. */
typedef struct st_track_stats {
  char name[48];    /* "stage 2", "replica 1 stage 0" */
  int first, count; /* its blocks */
  double busy_s;
  /* pipelined backprop: the wall seconds its steps would have taken with
   * every hand-off between stages free, the busy times replayed through
   * the schedule's dependencies (the same for every stage); busy_s /
   * bound_s is the utilization those times allow, whatever the runtime.
   * 0 in other modes, and over replicas or ranks. */
  double bound_s;
} st_track_stats;
int st_trainer_stats(const st_trainer *t, st_track_stats *out, int cap,
                     double *wall);
/* Weight streaming's counters since the trainer was made (docs/modes.md). */
typedef struct st_stream_stats {
  int64_t steps;
  int64_t bytes_in;        /* weights (and partial gradients) fetched */
  int64_t bytes_out;       /* gradients sent to the store */
  double stall_s;          /* compute waiting for weights */
  double wait_optimizer_s; /* step ends waiting for the store's updates */
  double last_update_s;    /* the store's last update of each step (the
                            * first block's), run on the compute side's
                            * cores */
  int max_blocks_held;     /* most blocks of weights on the compute side */
  int64_t compute_bytes;   /* the compute side's buffers */
} st_stream_stats;
/* 0 and *out filled in execution.mode weight_streaming; -1 otherwise. */
int st_trainer_stream_stats(const st_trainer *t, st_stream_stats *out);
/* The measured pipeline utilization: the stages' busy seconds over the
 * seconds they could have worked (stages running at once x step time); 1
 * for sequential. *bubble gets the fill-and-drain formula M / (M + S - 1)
 * at this run's S and M. */
double st_trainer_utilization(const st_trainer *t, double *bubble);
/* The plan's predictions, for summary.json beside what was measured
 * (samples/s, utilization; 0 = no plan). */
void st_trainer_set_prediction(st_trainer *t, double samples_per_s,
                               double utilization);
/* Records every later step's spans (forward, backward, update, send,
 * receive, idle) until st_trainer_write_trace: `--trace FILE`. */
int st_trainer_trace(st_trainer *t, int events_per_track, st_error *err);
int st_trainer_write_trace(st_trainer *t, const char *path, st_error *err);

/* Sampling from a trained GPT (generate.c). */
typedef struct st_generate_options {
  int tokens;        /* new tokens to sample, >= 0 */
  float temperature; /* > 0 scales the logits; 0 = always the likeliest */
  int top_k;         /* sample among the k likeliest (0 = all) */
  uint64_t seed;     /* the sampling stream */
} st_generate_options;

/* Loads the weights of `checkpoint` into the gpt model of cfg (its
 * tokenizer from data.tokenizer; no corpus needed), encodes the prompt,
 * then samples o->tokens tokens one at a time, writing the prompt and each
 * token's bytes to out as they come. Past the context length the window
 * slides (the model sees the newest model.context tokens). A prompt longer
 * than the context, an empty one, or a checkpoint of another shape is an
 * error naming it. Same seed, same text. */
int st_generate(const st_config *cfg, const char *checkpoint,
                const uint8_t *prompt, size_t prompt_len,
                const st_generate_options *o, FILE *out, st_error *err);

/* Steps-to-result sweep (docs/sweep.md; BACKGROUND.md §5, Shallue et al.
 * 2018): for each batch size, a quasi-random search over the learning rate
 * (and momentum for sgd with momentum); the batch size's steps to result is
 * the fewest steps any trial needed to first meet the target on the test set.
 * Up to `jobs` trials run at once, each its own st_trainer. */
typedef enum { ST_TARGET_ACCURACY, ST_TARGET_LOSS } st_target_kind;

typedef struct st_sweep_target {
  st_target_kind kind; /* met when accuracy >= value, or loss <= value */
  double value;
} st_sweep_target;

/* Parses "accuracy=0.85" or "loss=0.4"; accuracy must lie in (0, 1]. */
int st_sweep_target_parse(st_sweep_target *t, const char *spec, st_error *err);

typedef struct st_sweep_options {
  st_int_list batch_sizes; /* strictly increasing, each >= 1 */
  int trials;              /* per batch size, >= 1 */
  int64_t budget_steps;    /* steps per trial, >= 1 */
  double budget_epochs;    /* > 0: a trial at batch B has at most
                            * ceil(budget_epochs x training samples / B)
                            * steps when that is fewer; 0: off */
  int eval_every;          /* evaluate every N steps and at the end */
  double eval_growth;      /* > 1: the evaluation after step s comes at
                            * max(s + eval_every, ceil(s x eval_growth)),
                            * steps known to a ratio; <= 1: every
                            * eval_every steps */
  int noise_batch;         /* > 0: one of batch_sizes, even; after the
                            * trials its best trial is run again with
                            * metrics.noise_scale, for B_simple beside the
                            * critical batch size (DIR/noise.csv) */
  double lr_min, lr_max;   /* log-scale search range, 0 < min <= max */
  st_sweep_target target;
  char out_dir[ST_PATH_MAX]; /* sweep.csv, steps.csv, steps.svg, report.md */
  FILE *progress;            /* one line per trial; may be NULL */
  int jobs;                  /* trials run at once, >= 1 (the CLI's default:
                              * st_usable_cpus). With jobs > 1 each trial
                              * runs on one thread unless train.threads is
                              * set (then jobs x threads threads run). */
} st_sweep_options;

/* Radical inverse of index in base (the Halton sequence), in [0, 1). */
double st_sweep_halton(int64_t index, int base);
/* Trial i's point: Halton index i + 1, base 2 for lr (log scale over
 * [lr_min, lr_max]), base 3 for momentum = 1 - 10^u over [0.5, 0.99].
 * *momentum is -1 when the optimizer has none (adamw, or sgd configured with
 * momentum 0). */
void st_sweep_point(const st_sweep_options *o, const st_config *base, int trial,
                    double *lr, double *momentum);
/* The regimes (docs/sweep.md, BACKGROUND.md §5). Between consecutive batch
 * sizes that reached the target, B1 < B2, the steps ratio per doubling of
 * the batch is r = (steps(B2) / steps(B1))^(1 / log2(B2 / B1));
 * r <= ST_SWEEP_PERFECT is perfect scaling, r >= ST_SWEEP_MAXIMAL maximal
 * data parallelism, in between diminishing returns. */
#define ST_SWEEP_PERFECT 0.6
#define ST_SWEEP_MAXIMAL 0.9

typedef enum {
  ST_REGIME_NONE = -1, /* no span ends at this batch size: the first that
                        * reached the target, or one that did not */
  ST_REGIME_PERFECT,
  ST_REGIME_DIMINISHING,
  ST_REGIME_MAXIMAL
} st_sweep_regime;

typedef struct st_sweep_scaling {
  int reached;       /* batch sizes that reached the target */
  int end_perfect;   /* index of the batch size where perfect scaling ends:
                      * where the first span that is not perfect starts, or
                      * the last one reached when every span is perfect;
                      * -1 when fewer than two reached */
  int start_maximal; /* index from which every later span is maximal data
                      * parallelism; -1 if the last span is not */
} st_sweep_scaling;

/* Classifies steps to result against batch size by the rule above, the one
 * report.md and steps.svg use. batch: n increasing sizes; steps: their
 * steps to result, < 1 for not reached. ratio[k] and regime[k] (each may
 * be NULL) describe the span ending at batch[k]: r, and an st_sweep_regime;
 * NaN and ST_REGIME_NONE where no span ends. */
st_sweep_scaling st_sweep_regimes(const int *batch, const int64_t *steps, int n,
                                  double *ratio, int *regime);

/* Fits McCandlish et al.'s S(B) = S_min (1 + B_crit / B) to the batch sizes
 * that reached the target (steps >= 1): least squares on the relative
 * error, sum ((S_min + E_min / B) / steps - 1)^2. Returns B_crit =
 * E_min / S_min and sets *s_min, *e_min (each may be NULL); NaN (and NaN
 * coefficients) with fewer than two points or when either coefficient
 * comes out <= 0 (steps that do not level off, or do not fall). */
double st_sweep_fit(const int *batch, const int64_t *steps, int n,
                    double *s_min, double *e_min);

/* Runs the sweep, writing DIR/sweep.csv after every finished trial
 * (atomically; only finished trials, in (batch, trial) order) and the other
 * three files at the end. Trials already in DIR/sweep.csv are read back and
 * not run again. Same options and config: same files, whatever jobs is and
 * in whatever order the trials finish. On an error no further trial
 * starts, the running ones finish (and are recorded), and the error of the
 * first failed trial in (batch, trial) order is returned. progress gets
 * one line per finished trial, in the order they finish. */
int st_sweep_run(const st_sweep_options *o, const st_config *base,
                 st_error *err);

/* Pipelined-backprop experiment (`strata experiment pb`; BACKGROUND.md 2):
 * one config's SGD recipe, tuned at its train.batch B, run as seven
 * variants for the same steps and samples — "baseline" (execution.mode
 * sequential at batch B, as configured) and pipelined_backprop under each
 * mitigation (heavy-ball momentum, optimizer.reference_batch = B, B
 * micro-batches per step) — each for several seeds, comparing test
 * accuracy against samples seen, final training loss and speed. */
#define ST_EXPERIMENT_PB_VARIANTS 7 /* baseline + the 6 mitigations */
#define ST_EXPERIMENT_MAX_DEPTHS 16

typedef struct st_experiment_options {
  int seeds;                 /* runs per variant: train.seed + 0 .. seeds-1 */
  int points;                /* test evaluations per run, evenly spaced in
                              * steps, the last at the final step, >= 1 */
  int jobs;                  /* runs at once, >= 1. With jobs > 1 each run
                              * gets one thread unless train.threads is set,
                              * and no run pins its threads. */
  char out_dir[ST_PATH_MAX]; /* results.md, results.csv, curves.svg */
  FILE *log;                 /* one line per finished run; may be NULL */
  /* --depths: stage counts (>= 2, rising). With any, the experiment is the
   * depth one instead: the baseline, then none, sc, lwp and sc+lwp with
   * execution.stages at each count; writes depth.md, depth.csv and
   * depth.svg (final accuracy against stages). */
  int depths[ST_EXPERIMENT_MAX_DEPTHS], n_depths;
} st_experiment_options;

/* Variant k's name: "baseline", then the mitigations none, stash, sc, lwp,
 * sc+lwp, pipemare; NULL outside [0, ST_EXPERIMENT_PB_VARIANTS). */
const char *st_experiment_pb_variant(int k);
/* The validated config run `seed` (0-based) of variant k trains: base with
 * train.seed + seed, metrics.progress off, one replica, no noise scale, and
 *   baseline  execution.mode sequential, whole-batch steps, no
 *             optimizer.reference_batch (base's where it names a batch
 *             other than train.batch: the recipe was tuned there), no
 *             emulation;
 *   others    execution.mode pipelined_backprop, execution.mitigation the
 *             variant's, optimizer.nesterov false, reference_batch base's
 *             where set, else train.batch B,
 *             execution.stages as configured (0 becomes per_block), and
 *             execution.emulate on for per_block or more stages than the
 *             run's threads (bit-identical to threaded), else as set.
 * Errors name the variant and the seed. */
int st_experiment_pb_config(st_config *out, const st_config *base,
                            const st_experiment_options *o, int variant,
                            int seed, st_error *err);
/* Runs every variant for o->seeds seeds, up to o->jobs at once, and writes
 * DIR/results.md (settings and the comparison table), DIR/results.csv (one
 * row per run) and DIR/curves.svg (mean test accuracy against samples
 * seen, one line per variant). Every config is checked before any run
 * starts. A run whose training loss turns non-finite, or whose test loss
 * is non-finite at an evaluation (an update after the last checked loss
 * diverged), is recorded as diverged; any other error starts no further run,
 * lets the running ones finish and returns the error of the first failed run in
 * (variant, seed) order. Every number but the measured speeds (samples/s,
 * seconds) depends only on the config, seeds and points: not on jobs or timing.
 */
int st_experiment_pb(const st_experiment_options *o, const st_config *base,
                     st_error *err);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_H */
