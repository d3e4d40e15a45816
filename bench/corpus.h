/*
 * corpus.h — the byte corpus the GPT benchmarks train on: deterministic
 * random bytes in a new temporary file (TMPDIR or /tmp), so a benchmark
 * needs no data set and reads the same bytes every run.
 */
#ifndef STRATA_BENCH_CORPUS_H
#define STRATA_BENCH_CORPUS_H

#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes `bytes` random bytes from `seed` to a new file named
 * TMPDIR/strata-bench-<tag>-XXXXXX; path gets its name. 0, or -1 with no
 * file left behind. */
static int bench_write_corpus(char *path, size_t cap, const char *tag,
                              int bytes, uint64_t seed) {
  const char *dir = getenv("TMPDIR");
  snprintf(path, cap, "%s/strata-bench-%s-XXXXXX", dir && *dir ? dir : "/tmp",
           tag);
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    close(fd);
    unlink(path);
    return -1;
  }
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_DATA, 0);
  int ok = 1;
  for (int i = 0; i < bytes && ok; i++)
    ok = fputc((int)(st_rng_u32(&rng) & 0xff), f) != EOF;
  if (fclose(f) != 0 || !ok) {
    unlink(path);
    return -1;
  }
  return 0;
}

#endif
