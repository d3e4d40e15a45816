/*
 * bf16.c — bfloat16 conversions: a bf16 is the upper 16 bits of an fp32,
 * so widening is a shift and narrowing is a rounding of the low 16 bits.
 * Weight streaming's file store keeps its weights in bf16 when asked
 * (halving the weights' share of the file and of the bytes streamed); the
 * update runs in fp32 on the widened weights and fp32 optimizer state and
 * rounds its result back, to nearest or stochastically (Gupta et al. 2015;
 * Zamirai et al. 2020: stochastic rounding keeps updates far below the
 * weights' precision from being lost, in expectation).
 */
#include "strata.h"

#include <string.h>

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The upper half after adding `add` to the low half (carrying into the
 * exponent where it overflows, as rounding up across a binade must).
 * NaN keeps its sign and becomes quiet, never infinity. */
static uint16_t narrow(uint32_t u, uint32_t add) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + add) >> 16);
}

uint16_t st_bf16_from(float x) {
  uint32_t u = bits_of(x);
  /* ties to even: 0x7FFF, plus one when the kept part is odd */
  return narrow(u, 0x7FFFu + ((u >> 16) & 1));
}

float st_bf16_to(uint16_t h) { return float_of((uint32_t)h << 16); }

void st_bf16_round(float *x, size_t n, int stochastic, uint64_t seed,
                   uint64_t step, uint64_t first) {
  if (!stochastic) {
    for (size_t i = 0; i < n; i++) x[i] = st_bf16_to(st_bf16_from(x[i]));
    return;
  }
  /* the key as st_rng_init makes one (seed, purpose); a Philox block per
   * eight elements of the whole slab, 16 random bits each */
  st_rng rng;
  st_rng_init(&rng, seed, ST_RNG_ROUND, 0);
  uint32_t r[4];
  uint64_t block = UINT64_MAX;
  for (size_t i = 0; i < n; i++) {
    uint64_t at = first + i;
    if (at / 8 != block) {
      block = at / 8;
      st_philox(rng.key, step, block, r);
    }
    uint32_t add = (r[(at % 8) / 2] >> (16 * (at % 2))) & 0xFFFFu;
    /* adding a uniform 16-bit value to the dropped half carries into the
     * kept half with probability (dropped half) / 2^16 */
    x[i] = st_bf16_to(narrow(bits_of(x[i]), add));
  }
}

void st_bf16_pack(const float *x, uint16_t *h, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] = st_bf16_from(x[i]);
}

void st_bf16_unpack(const uint16_t *h, float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = st_bf16_to(h[i]);
}
