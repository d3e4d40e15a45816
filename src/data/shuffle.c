/*
 * shuffle.c — the per-epoch sample order. Fisher-Yates driven by the
 * counter-based RNG stream (seed, ST_RNG_SHUFFLE, epoch), so the order of an
 * epoch is a pure function of (seed, epoch, n): a resumed run replays the
 * same batches, and no thread or earlier epoch can change it.
 */
#include "strata.h"

void st_shuffle(int32_t *perm, int n, uint64_t seed, int64_t epoch) {
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_SHUFFLE, (uint64_t)epoch);
  for (int i = 0; i < n; i++) perm[i] = i;
  /* Walking down and drawing j in [0, i] gives every permutation with equal
   * probability (Knuth, TAOCP vol. 2, Algorithm 3.4.2P). */
  for (int i = n - 1; i > 0; i--) {
    int j = (int)st_rng_below(&rng, (uint32_t)i + 1);
    int32_t held = perm[i];
    perm[i] = perm[j];
    perm[j] = held;
  }
}
