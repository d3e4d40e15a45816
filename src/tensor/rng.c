/*
 * rng.c — counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
 * A draw is a pure function of (seed, purpose, stream, counter), so
 * initialisation, shuffling and dropout give the same numbers whatever the
 * thread count or the order in which workers ask (DESIGN.md: determinism).
 */
#include "strata.h"

#include <math.h>

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

void st_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo,
               uint32_t out[4]) {
  uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
  uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* splitmix64 finaliser: spreads (seed, purpose) over the 64-bit key. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void st_rng_init(st_rng *rng, uint64_t seed, uint32_t purpose,
                 uint64_t stream) {
  rng->key = mix64(seed * 0x9E3779B97F4A7C15ull + purpose);
  rng->stream = stream;
  rng->counter = 0;
  rng->avail = 0;
}

uint32_t st_rng_u32(st_rng *rng) {
  if (rng->avail == 0) {
    st_philox(rng->key, rng->stream, rng->counter++, rng->buf);
    rng->avail = 4;
  }
  return rng->buf[4 - rng->avail--];
}

float st_rng_uniform(st_rng *rng) {
  return (float)(st_rng_u32(rng) >> 8) * (1.0f / 16777216.0f);
}

float st_rng_normal(st_rng *rng) {
  /* Box-Muller in double; u1 in (0, 1] so the log is finite. */
  double u1 = ((double)(st_rng_u32(rng) >> 8) + 1.0) / 16777216.0;
  double u2 = (double)(st_rng_u32(rng) >> 8) / 16777216.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint32_t st_rng_below(st_rng *rng, uint32_t n) {
  /* Lemire's multiply-shift with rejection: unbiased. */
  uint64_t m = (uint64_t)st_rng_u32(rng) * n;
  uint32_t low = (uint32_t)m;
  if (low < n) {
    uint32_t threshold = (uint32_t)(-n) % n;
    while (low < threshold) {
      m = (uint64_t)st_rng_u32(rng) * n;
      low = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}
