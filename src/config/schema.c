/*
 * schema.c — the one table of every config key: section, name, type, where
 * it lives in st_config, its default (in YAML syntax), the allowed values of
 * an enum and a one-line meaning. Defaults live only here; config.c parses
 * them with the same code that parses a file, --help prints this table and
 * docs/config.md is generated from it, so none of them can drift apart.
 *
 * Each row names its field once, as section.name: the macros below turn that
 * into the key text, the offset and size, and a compile-time check that the
 * field's C type matches the declared config type (_Generic with no default
 * branch fails to compile on a mismatch).
 */
#include "schema.h"

#include <stddef.h>
#include <string.h>

/* One row's parts read as one initializer; clang-format would scatter them. */
// clang-format off
#define FIELD_OF(sec, name) (((st_config *)0)->sec.name)
#define ROW(sec, nm, type, ctype, def, choices, meaning)                   \
  {#sec, #nm, type, offsetof(st_config, sec.nm),                           \
   sizeof(FIELD_OF(sec, nm)) * _Generic(FIELD_OF(sec, nm), ctype: 1),      \
   def, choices, meaning}
// clang-format on

#define INT(s, n, def, m) ROW(s, n, ST_CONFIG_INT, int, def, NULL, m)
#define INT64(s, n, def, m) ROW(s, n, ST_CONFIG_INT64, int64_t, def, NULL, m)
#define UINT64(s, n, def, m) ROW(s, n, ST_CONFIG_UINT64, uint64_t, def, NULL, m)
#define FLOAT(s, n, def, m) ROW(s, n, ST_CONFIG_FLOAT, float, def, NULL, m)
#define BOOL(s, n, def, m) ROW(s, n, ST_CONFIG_BOOL, int, def, NULL, m)
#define STRING(s, n, def, m) ROW(s, n, ST_CONFIG_STRING, char *, def, NULL, m)
#define ENUM(s, n, def, ch, m) ROW(s, n, ST_CONFIG_ENUM, char *, def, ch, m)
#define LIST(s, n, def, m)                                                     \
  ROW(s, n, ST_CONFIG_INT_LIST, st_int_list, def, NULL, m)

/* Allowed values of each enum, one per line so a new mode is one line. */
static const char *const model_kinds[] = {"mlp", "cnn", "gpt", NULL};
static const char *const positions[] = {"learned", "rotary", NULL};
static const char *const encodings[] = {"bytes", "utf8", NULL};
static const char *const activations[] = {"relu", "gelu", "gelu_tanh", NULL};
static const char *const precisions[] = {"fp32", "bf16", NULL};
static const char *const checkpoint_formats[] = {"single", "shards", NULL};
static const char *const norms[] = {"none", "layernorm", "groupnorm", NULL};
static const char *const pools[] = {"max", "avg", NULL};
static const char *const datasets[] = {"fashion_mnist", "synthetic", "text",
                                       NULL};
static const char *const optimizers[] = {"sgd", "adamw", NULL};
static const char *const schedules[] = {"constant", "cosine", "step", "linear",
                                        NULL};
static const char *const placements[] = {"threads", "ranks", NULL};
static const char *const modes[] = {
    "sequential",         "pipeline",         "block_sequential",
    "pipelined_backprop", "weight_streaming", NULL,
};
static const char *const stores[] = {"memory", "file", NULL};
static const char *const weight_dtypes[] = {"fp32", "bf16", NULL};
static const char *const roundings[] = {"nearest", "stochastic", NULL};
static const char *const mitigations[] = {
    "none", "stash", "sc", "lwp", "sc+lwp", "pipemare", NULL,
};
static const char *const schedules_pipe[] = {"gpipe", "1f1b", "interleaved",
                                             "zb1p", NULL};
static const char *const block_costs[] = {"model", "measured", NULL};
static const char *const fabrics[] = {
    "cpu",
    "mesh",
    "wse2",
    NULL,
};
static const char *const progress_modes[] = {"auto", "on", "off", NULL};

const st_config_key st_config_schema[] = {
    ENUM(model, kind, "mlp", model_kinds, "model family"),
    LIST(model, hidden, "[256, 256]", "mlp: widths of the hidden layers"),
    ENUM(model, activation, "relu", activations,
         "activation after each hidden layer; gelu_tanh is GPT-2's tanh form"),
    FLOAT(model, dropout, "0",
          "dropout probability after each hidden activation"),
    ENUM(model, norm, "none", norms,
         "normalisation: layernorm (mlp) or groupnorm (cnn)"),
    INT(model, groups, "8",
        "groupnorm: groups per layer (must divide channels)"),
    LIST(model, channels, "[32, 64]", "cnn: conv channels of each stage"),
    INT(model, kernel, "3", "cnn: conv kernel size, odd ('same' padding)"),
    INT(model, residual_blocks, "0", "cnn: residual blocks per stage"),
    BOOL(model, residual, "false",
         "mlp: each hidden layer after the first adds its input back "
         "before the activation, act(x + norm(W x + b)); widths must match"),
    ENUM(model, pool, "max", pools, "cnn: pooling between stages"),
    LIST(model, dense, "[128]",
         "cnn: widths of the dense layers after the convs"),
    INT(model, classes, "10", "number of output classes"),
    INT(model, vocab, "0",
        "gpt: vocabulary size (0 = the tokenizer's, with data.dataset text)"),
    INT(model, context, "128", "gpt: context length, tokens per sequence"),
    INT(model, layers, "4", "gpt: transformer layers (one block each)"),
    INT(model, heads, "4", "gpt: attention heads (must divide width)"),
    INT(model, width, "128", "gpt: model width d_model"),
    INT(model, mlp_ratio, "4", "gpt: MLP hidden width over model width"),
    BOOL(model, tied, "true",
         "gpt: the output head shares the token embedding's weights"),
    BOOL(model, fused_loss, "true",
         "gpt: the output head and the loss run fused, a chunk of the "
         "vocabulary at a time, so no logits buffer is kept (the backward "
         "makes the head's product again for all but the last chunks, "
         "which the forward leaves in the scratch, at most 16M logits a "
         "sample: up to +1/3 of its FLOPs)"),
    ENUM(model, positions, "learned", positions,
         "gpt: learned positional embeddings (GPT-2/3) or rotary (GPT-J, "
         "NeoX)"),
    INT(model, rotary_dim, "0",
        "gpt: rotary dims per head (0 = the whole head; even)"),

    ENUM(data, dataset, "fashion_mnist", datasets, "training data"),
    STRING(data, dir, "/usr/share/datasets/fashion-mnist",
           "folder holding the Fashion-MNIST IDX files under their .gz "
           "names (a file already unpacked is read as it is)"),
    INT(data, train_limit, "0",
        "use only the first N training samples (0 = all; the files are then "
        "read only that far, so their gzip CRC, which covers the whole "
        "file, goes unchecked)"),
    INT(data, test_limit, "0", "use only the first N test samples (0 = all)"),
    BOOL(data, shuffle, "true", "reshuffle the training set every epoch"),
    BOOL(data, normalize, "true",
         "standardise pixels with the mean/std of the training images the "
         "config selects (data.train_limit: evaluate with the run's "
         "config.yaml to see them as trained; eval says when the "
         "checkpoint's training set or data.normalize differs, a resume "
         "refuses another data.normalize)"),
    STRING(data, path, "/usr/share/games/fortunes/cookie",
           "text: the corpus, any file of bytes (default: Debian's fortunes "
           "package)"),
    STRING(data, tokenizer, "bytes",
           "text: 'bytes' (vocabulary 256) or a file from strata tokenize "
           "train"),
    ENUM(data, encoding, "bytes", encodings,
         "text: what the corpus must be; utf8 refuses invalid UTF-8, naming "
         "the line"),
    FLOAT(data, val_fraction, "0.1",
          "text: share of the corpus, from its end, held out for validation"),

    ENUM(optimizer, kind, "sgd", optimizers, "update rule"),
    FLOAT(optimizer, lr, "0.05", "peak learning rate"),
    FLOAT(optimizer, momentum, "0.9", "sgd: momentum"),
    BOOL(optimizer, nesterov, "false", "sgd: Nesterov momentum"),
    FLOAT(optimizer, weight_decay, "0",
          "weight decay, on every parameter (biases, norms, embeddings "
          "too; decoupled for adamw)"),
    FLOAT(optimizer, beta1, "0.9", "adamw: first-moment decay"),
    FLOAT(optimizer, beta2, "0.999", "adamw: second-moment decay"),
    FLOAT(optimizer, eps, "1e-8", "adamw: denominator epsilon"),
    ENUM(optimizer, schedule, "constant", schedules, "learning-rate schedule"),
    INT(optimizer, warmup_steps, "0",
        "linear warm-up over this many steps W: step k (from 0) uses lr x "
        "(k + 1) / W; the schedule counts its steps after it"),
    FLOAT(optimizer, min_lr, "0",
          "cosine/linear: the rate the schedule falls to at train's end (the "
          "last step's rate is one step above it)"),
    INT(optimizer, step_size, "1000",
        "step: decay every step_size steps (counted after the warm-up)"),
    FLOAT(optimizer, gamma, "0.1", "step: decay factor"),
    INT(optimizer, reference_batch, "0",
        "sgd: the batch lr and momentum were tuned for; strata rescales "
        "them to the batch each update sees (BACKGROUND.md 2; 0 = as "
        "given)"),

    INT(train, batch, "32", "samples per optimizer step"),
    INT(train, epochs, "1", "passes over the training set"),
    INT64(train, steps, "0", "optimizer steps; > 0 overrides epochs"),
    UINT64(train, seed, "42", "one seed for init, shuffling and dropout"),
    INT(train, eval_every, "0",
        "evaluate every N steps (0 = end of each epoch)"),
    INT(train, checkpoint_every, "0",
        "checkpoint every N steps (0 = at the end)"),
    INT(train, threads, "0", "worker threads (0 = all cores)"),
    ENUM(train, checkpoint_format, "single", checkpoint_formats,
         "single = one safetensors file per checkpoint (over MPI ranks "
         "assembled at rank 0 tensor by tensor); shards = a directory of "
         "one shard per rank (one in one process) and "
         "model.safetensors.index.json, as Hugging Face tools read"),
    INT(train, keep_checkpoints, "2",
        "newest step checkpoints to keep (0 = keep all)"),
    BOOL(train, flush_subnormals, "true",
         "flush subnormal numbers to zero (FTZ and DAZ) on every thread that "
         "computes; false keeps IEEE subnormals, 3x to 20x slower wherever "
         "values underflow"),
    ENUM(train, precision, "fp32", precisions,
         "bf16: every matrix product (linear, attention, convolution) on "
         "bf16-rounded inputs with fp32 sums, AVX512-BF16 where the CPU has "
         "it, else emulated; weights, optimizer state, the other ops and "
         "checkpoints stay fp32 (docs/bf16.md)"),
    BOOL(train, bf16_activations, "true",
         "bf16: a GPT keeps the inputs its products read in the backward "
         "(linear, attention, the fused head) as bf16, half the memory; "
         "exact, as the products round them to bf16 anyway"),

    ENUM(execution, mode, "sequential", modes, "execution mode (DESIGN.md)"),
    INT(execution, micro_batch, "0",
        "samples per micro-batch (0 = whole batch; pipelined_backprop: 1)"),
    ENUM(execution, schedule, "1f1b", schedules_pipe,
         "pipeline: fill and drain all micro-batches (gpipe), one forward, "
         "one backward (1f1b, at most S micro-batches in flight), "
         "interleaved virtual stages (interleaved: each stage worker holds "
         "execution.virtual_stages chunks; bubble over V) or zero-bubble "
         "(zb1p: each backward split into input and weight gradients, the "
         "latter deferred into 1f1b's idle slots; 1f1b's peak memory)"),
    INT(execution, virtual_stages, "2",
        "schedule interleaved: chunks of blocks each stage worker holds "
        "(chunk v of worker k is pipeline stage k + v S; the model needs "
        "S V blocks)"),
    INT(execution, stages, "0",
        "pipeline: stages, contiguous runs of blocks cut by the compiler's "
        "plan (0 = the plan's choice, at most one per core); "
        "block_sequential: stages inside each segment (0 = the plan's choice "
        "for the segment, at most one per core); "
        "per_block = every block its own stage"),
    LIST(execution, stage_blocks, "[]",
         "pipeline, pipelined_backprop: how many blocks each stage holds, "
         "in order (their sum the model's blocks; up to 32 stages), "
         "pinning the cut the plan prints (interleaved: each chunk's, "
         "stages x virtual_stages of them); [] = the compiler cuts"),
    INT(execution, blocks_per_segment, "0",
        "block_sequential: blocks in each segment (0 = the fewest segments "
        "whose weights, state and activations fit the cores' memory)"),
    INT(execution, replicas, "1",
        "data-parallel copies (sequential, pipeline), each on its share of "
        "the cores; gradients summed in a fixed order every step"),
    ENUM(execution, placement, "threads", placements,
         "under mpirun: threads = every rank a whole replica (data "
         "parallel); ranks = the pipeline's stages spread over the ranks, "
         "one stage or a group of stages each (with replicas R: a grid of "
         "R replicas x ranks/R stages)"),
    BOOL(execution, deterministic, "true",
         "over MPI ranks: sum the gradients in rank order, as the "
         "in-process replicas do (false: MPI_Allreduce, in the MPI "
         "library's order)"),
    INT64(execution, rank_memory_limit, "0",
          "under mpirun: bytes one rank may hold (its stages' weights, "
          "gradients and optimizer state, its buffers and the data; 0 = no "
          "limit); a rank whose share does not fit is refused at start, "
          "naming the rank, its largest block and the shortfall"),
    FLOAT(execution, rank_timeout, "600",
          "under mpirun: seconds a rank may wait on the others in one "
          "exchange (a collective, a pipeline's message, the last "
          "handshake) before it ends the job, naming what it waited for "
          "and the rank to blame (one that does not answer, or is busy); "
          "a stopped rank or a cut network would hang it (0 = wait "
          "forever)"),
    BOOL(execution, pin, "true",
         "pin each stage's threads to its own cores (when they fit the "
         "usable cores)"),
    BOOL(execution, fused_update, "true",
         "at batch 1, update weights inside the backward (same bits, "
         "less memory traffic)"),
    ENUM(execution, block_costs, "model", block_costs,
         "what the compiler cuts stages by: model (the blocks' FLOPs and "
         "bytes at the calibration profile's rates) or measured (each "
         "block's forward and backward timed on this machine before the "
         "run; the cut, and in pipelined_backprop the delays, then follow "
         "the timing)"),

    ENUM(execution, mitigation, "sc+lwp", mitigations,
         "pipelined_backprop: how stages correct delayed gradients and "
         "weight inconsistency (BACKGROUND.md 2)"),
    BOOL(execution, emulate, "false",
         "pipelined_backprop: one thread runs every stage tick by tick "
         "(same weights as the threaded runtime)"),
    INT(execution, pipemare_warmup, "1000",
        "pipemare: T, updates over which each stage's lr rises to the "
        "base"),
    FLOAT(execution, pipemare_gamma, "0.9",
          "pipemare: EMA decay of the weight-change estimate"),
    ENUM(execution, store, "memory", stores,
         "weight_streaming: where weights and optimizer state live (the "
         "parameter store; memory: this process's RAM; file: a file on "
         "disk, committed every step, that a run resumes from)"),
    STRING(execution, store_path, "\"\"",
           "weight_streaming, store file: the store's file (\"\": "
           "store.strata in the run's directory)"),
    ENUM(execution, store_weights, "fp32", weight_dtypes,
         "weight_streaming, store file: the stored weights' type (bf16 "
         "halves their bytes on disk and streamed; compute, gradients and "
         "optimizer state stay fp32)"),
    ENUM(execution, store_rounding, "nearest", roundings,
         "store_weights bf16: how each update's fp32 result is rounded "
         "(stochastic: unbiased, from the seed, the step and the index)"),
    INT(execution, prefetch, "1",
        "weight_streaming: blocks fetched ahead of the one computing (the "
        "compute side holds prefetch + 1 blocks of weights)"),
    BOOL(execution, keep_activations, "true",
         "weight_streaming: keep every block's activations for the backward "
         "(false: keep each block's input and recompute its forward)"),
    INT64(execution, compute_memory_limit, "0",
          "weight_streaming: bytes the compute side may hold (weights in "
          "flight, gradient, activations, workspace; 0 = no limit); a run "
          "that cannot fit is refused at start, naming the block"),

    ENUM(fabric, kind, "cpu", fabrics,
         "what the plan runs on: this machine's cores, a W x H mesh of PEs, "
         "or the WSE-2 preset (docs/compiler.md)"),
    INT(fabric, cores, "0", "cpu: cores to use (0 = detected)"),
    INT(fabric, width, "0", "mesh: PEs across"),
    INT(fabric, height, "0", "mesh: PEs down"),
    FLOAT(fabric, pe_flops, "0",
          "FLOP/s of one PE or core; 0 = the fabric's own figure (cpu: "
          "calibrated or estimated; mesh and wse2: a WSE-2 PE, 2.2e9 fp32, "
          "assumed); > 0 overrides it on every fabric"),
    INT64(fabric, pe_memory, "0",
          "bytes of one PE or core that the model's tensors may use; 0 = the "
          "fabric's own figure (cpu: RAM over the cores; mesh and wse2: two "
          "thirds of a WSE-2 PE's 40 GB / 850,000 = 47058, the rest kept for "
          "its program and buffers, docs/compiler.md); > 0 overrides it on "
          "every fabric (and keeps nothing back)"),
    FLOAT(fabric, link_bandwidth, "0",
          "bytes/s of one PE-to-PE link, one way (cpu: a stage-to-stage "
          "copy); 0 = the fabric's own figure (mesh and wse2: a WSE-2 link, "
          "220 Pb/s over 850,000 PEs x 8 = 4.04e9); > 0 overrides it on every "
          "fabric"),
    FLOAT(fabric, hop_latency, "0",
          "mesh: seconds for data to cross one PE-to-PE hop; 0 = the "
          "fabric's own figure (a WSE-2 PE: one cycle at 1.1 GHz, 9.1e-10, "
          "assumed)"),
    FLOAT(fabric, pe_overhead, "0",
          "mesh: seconds of fixed work each PE of a region spends per layer, "
          "sample and pass; 0 = the fabric's own figure (a WSE-2 PE: 20 "
          "cycles, 1.8e-8, assumed)"),
    FLOAT(fabric, io_bandwidth, "0",
          "mesh: bytes/s the fabric's I/O carries each way, to the host "
          "(samples) and to a weight store (weight streaming); cpu: bytes/s "
          "of the disk under a weight-streaming file store, reads and "
          "writes together; 0 = the fabric's own figure (a CS-2: 12 x 100 "
          "GbE = 1.5e11, published; a cpu: 2e9, an estimate of one NVMe "
          "SSD, docs/compiler.md)"),
    FLOAT(fabric, memory_bandwidth, "0",
          "bytes/s of the memory, all cores or PEs together: a cpu's DRAM, "
          "a mesh's SRAM; 0 = the fabric's own figure (cpu: the calibration "
          "profile's measured one, else 1e11, a built-in estimate; mesh and "
          "wse2: a WSE-2 PE's share of 20 PB/s, published, times the PEs; "
          "docs/compiler.md)"),

    INT(metrics, log_every, "50",
        "steps between metrics.jsonl train lines; each "
        "train.checkpoint_every checkpoint writes one too, so a run "
        "resumed from it averages the same steps in each line"),
    ENUM(metrics, progress, "auto", progress_modes,
         "progress line (auto = only on a terminal)"),
    BOOL(metrics, noise_scale, "false",
         "log the gradient noise scale B_simple (BACKGROUND.md 5); the "
         "batch is measured in two micro-batches"),
    FLOAT(metrics, noise_ema, "0.99",
          "noise scale: EMA decay of the |G|^2 and tr(Sigma) estimates"),
};

const int st_config_schema_count =
    (int)(sizeof st_config_schema / sizeof st_config_schema[0]);

/* The per-key origin records in st_config are indexed by row. */
_Static_assert(sizeof st_config_schema / sizeof st_config_schema[0] <=
                   ST_CONFIG_MAX_KEYS,
               "raise ST_CONFIG_MAX_KEYS in strata.h");

int st_config_key_find(const char *section, size_t section_len,
                       const char *name) {
  for (int i = 0; i < st_config_schema_count; i++) {
    const st_config_key *k = &st_config_schema[i];
    if (strlen(k->section) == section_len &&
        memcmp(k->section, section, section_len) == 0 &&
        strcmp(k->name, name) == 0)
      return i;
  }
  return -1;
}

int st_config_section_find(const char *section) {
  for (int i = 0; i < st_config_schema_count; i++)
    if (strcmp(st_config_schema[i].section, section) == 0) return i;
  return -1;
}

const char *st_config_type_name(st_config_type type) {
  switch (type) {
  case ST_CONFIG_INT:
    return "int";
  case ST_CONFIG_INT64:
    return "int64";
  case ST_CONFIG_UINT64:
    return "uint64";
  case ST_CONFIG_FLOAT:
    return "float";
  case ST_CONFIG_BOOL:
    return "bool";
  case ST_CONFIG_STRING:
    return "string";
  case ST_CONFIG_ENUM:
    return "enum";
  case ST_CONFIG_INT_LIST:
    return "int list";
  }
  return "?";
}

/* "relu, gelu, gelu_tanh" into buf. */
static const char *join_choices(const char *const *choices, char *buf,
                                size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; choices && choices[i]; i++) {
    int n = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", choices[i]);
    if (n < 0 || (size_t)n >= cap - used) break;
    used += (size_t)n;
  }
  return buf;
}

void st_config_print_schema(FILE *f) {
  const char *section = "";
  char choices[256];
  fprintf(
      f,
      "config keys (YAML sections; override with --set section.key=value):\n");
  int width = 0; /* the longest section.key */
  for (int i = 0; i < st_config_schema_count; i++) {
    int n = (int)(strlen(st_config_schema[i].section) + 1 +
                  strlen(st_config_schema[i].name));
    if (n > width) width = n;
  }
  for (int i = 0; i < st_config_schema_count; i++) {
    const st_config_key *k = &st_config_schema[i];
    if (strcmp(k->section, section) != 0) {
      section = k->section;
      fprintf(f, "\n%s:\n", section);
    }
    char full[64];
    snprintf(full, sizeof full, "%s.%s", k->section, k->name);
    fprintf(f, "  %-*s %-8s %-13s", width, full, st_config_type_name(k->type),
            k->def);
    /* A default wider than its column pushes the meaning to its own line
     * rather than knocking every other row out of alignment. */
    if (strlen(k->def) > 13) fprintf(f, "\n%*s", width + 25, "");
    fprintf(f, " %s", k->meaning);
    if (k->choices)
      fprintf(f, "; one of: %s",
              join_choices(k->choices, choices, sizeof choices));
    fputc('\n', f);
  }
}

void st_config_schema_markdown(FILE *f) {
  const char *section = "";
  char choices[256];
  for (int i = 0; i < st_config_schema_count; i++) {
    const st_config_key *k = &st_config_schema[i];
    if (strcmp(k->section, section) != 0) {
      section = k->section;
      fprintf(f, "%s### %s\n\n", i ? "\n" : "", section);
      fprintf(f, "| key | type | default | meaning |\n");
      fprintf(f, "|---|---|---|---|\n");
    }
    fprintf(f, "| `%s.%s` | %s | `%s` | %s", k->section, k->name,
            st_config_type_name(k->type), k->def, k->meaning);
    if (k->choices)
      fprintf(f, "; one of: %s",
              join_choices(k->choices, choices, sizeof choices));
    fprintf(f, " |\n");
  }
}
