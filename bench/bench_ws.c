/*
 * bench_ws.c — weight streaming's overhead against the sequential mode it
 * must equal (mode vs mode in one run; STYLE.md 13). A GPT-2-124M-shaped
 * model (12 layers of 768, 12 heads, vocab 50257, tied head; context 128,
 * batch 4, no dropout, AdamW) is trained by two trainers side by side, one
 * `sequential`, one `weight_streaming` with the memory store and prefetch
 * 1, on all the cores. The steps alternate in bursts, so a burst of load
 * elsewhere lowers one sample, not a ratio; each mode's figure is its
 * fastest burst. Both trainers take the same steps on the same data, so
 * their weights must stay identical: the last line says whether they did.
 *
 * Target (issue 7): streaming from the memory store at most 10% slower.
 *
 * Usage: bench_ws [STEPS [REPEATS]]   (steps per burst, default 2; bursts
 *        per mode, default 3; one warm-up step each first)
 */
#include "corpus.h"
#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CORPUS_BYTES = 1 << 20 };

static int make(st_trainer **t, const char *corpus, const char *mode,
                st_error *err) {
  char sets[24][ST_PATH_MAX + 32];
  int n = 0;
#define SET(...) snprintf(sets[n++], sizeof sets[0], __VA_ARGS__)
  SET("model.kind=gpt");
  SET("model.layers=12");
  SET("model.width=768");
  SET("model.heads=12");
  SET("model.context=128");
  SET("model.vocab=50257");
  SET("model.activation=gelu_tanh");
  SET("model.tied=true");
  SET("model.dropout=0");
  SET("data.dataset=text");
  SET("data.path=%s", corpus);
  SET("data.tokenizer=bytes");
  SET("optimizer.kind=adamw");
  SET("optimizer.lr=3e-4");
  SET("optimizer.weight_decay=0.1");
  SET("train.batch=4");
  SET("train.steps=1000000");
  SET("metrics.progress=off");
  SET("execution.mode=%s", mode);
#undef SET
  st_config cfg;
  st_config_defaults(&cfg);
  for (int i = 0; i < n; i++)
    if (st_config_set(&cfg, sets[i], err))
      return -1;
  if (st_config_validate(&cfg, err))
    return -1;
  return st_trainer_create(t, &cfg, NULL, err);
}

/* Seconds per step over a burst of `steps`. */
static double burst(st_trainer *t, int steps, st_error *err) {
  double loss, t0 = st_now();
  for (int i = 0; i < steps; i++)
    if (st_trainer_step(t, &loss, err))
      return -1;
  return (st_now() - t0) / steps;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 2;
  int repeats = argc > 2 ? atoi(argv[2]) : 3;
  if (argc > 3 || steps < 1 || repeats < 1) {
    fprintf(stderr, "usage: bench_ws [STEPS [REPEATS]]\n");
    return 2;
  }
  st_blas_init();
  char corpus[ST_PATH_MAX];
  if (bench_write_corpus(corpus, sizeof corpus, "ws", CORPUS_BYTES, 7)) {
    fprintf(stderr, "bench_ws: cannot write a corpus in TMPDIR or /tmp\n");
    return 1;
  }
  st_error err = {0};
  st_trainer *seq = NULL, *ws = NULL;
  int rc = 1;
  if (make(&seq, corpus, "sequential", &err) ||
      make(&ws, corpus, "weight_streaming", &err))
    goto out;
  double best[2] = {0, 0};
  st_trainer *t[2] = {seq, ws};
  for (int k = 0; k < 2; k++)
    if (burst(t[k], 1, &err) < 0)
      goto out; /* warm-up */
  for (int r = 0; r < repeats; r++)
    for (int k = 0; k < 2; k++) {
      double s = burst(t[k], steps, &err);
      if (s < 0)
        goto out;
      if (best[k] == 0 || s < best[k])
        best[k] = s;
    }
  st_stream_stats st;
  double wall = 0;
  st_trainer_stream_stats(ws, &st);
  st_trainer_stats(ws, NULL, 0, &wall);
  double over = best[1] / best[0] - 1;
  printf("GPT-2-124M shape (context 128, batch 4), %d cores: sequential "
         "%.3f s/step, weight streaming (memory store, prefetch 1) %.3f "
         "s/step: %+.1f%% (target <= +10%%: %s)\n",
         st_usable_cpus(NULL, 0), best[0], best[1], 100 * over,
         over <= 0.10 ? "meets target" : "ABOVE TARGET");
  printf("  streamed per step: %.0f MB in, %.0f MB out; of the time, "
         "waiting for weights %.1f%%, for the store's optimizer thread "
         "%.1f%%, its last update (on the compute cores) %.1f%%; at most %d "
         "blocks held, compute-side buffers %.0f MB\n",
         (double)st.bytes_in / st.steps / 1048576.0,
         (double)st.bytes_out / st.steps / 1048576.0,
         wall > 0 ? 100 * st.stall_s / wall : 0,
         wall > 0 ? 100 * st.wait_optimizer_s / wall : 0,
         wall > 0 ? 100 * st.last_update_s / wall : 0, st.max_blocks_held,
         (double)st.compute_bytes / 1048576.0);
  size_t n = st_trainer_model(seq)->n_params;
  int same = memcmp(st_trainer_params(seq), st_trainer_params(ws),
                    n * sizeof(float)) == 0;
  printf("  weights after %d steps each: %s\n", 1 + steps * repeats,
         same ? "identical" : "DIFFERENT (a bug)");
  rc = same ? 0 : 1;
out:
  if (rc && err.msg[0])
    fprintf(stderr, "bench_ws: %s\n", err.msg);
  st_trainer_destroy(seq);
  st_trainer_destroy(ws);
  unlink(corpus);
  return rc;
}
