/*
 * bf16_ref.h — the tests' own bf16 rounding, written apart from
 * src/tensor/bf16.c's add-and-shift: of x's two bf16 neighbours, the nearer
 * by distances in double, a tie to the even one (test_bf16.c,
 * test_gemm_bf16.c).
 */
#ifndef STRATA_TESTS_BF16_REF_H
#define STRATA_TESTS_BF16_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* To nearest, ties to even, by comparing distances in double (exact for
 * these: both neighbours and x have at most 24 significant bits). */
static inline uint16_t nearest_reference(float x) {
  uint32_t u = bits(x);
  if (isnan(x)) return 0xFFFF; /* any NaN: the caller checks NaN-ness */
  uint16_t down = (uint16_t)(u >> 16), up = (uint16_t)(down + 1);
  if ((u & 0xFFFF) == 0) return down;
  double dx = x, dd = from_bits((uint32_t)down << 16);
  /* the neighbour away from zero; past the largest finite value it is
   * infinity, which rounding reaches at half an ulp beyond it */
  double du = (up & 0x7FFF) == 0x7F80 ? copysign(ldexp(1.0, 128), dx)
                                      : (double)from_bits((uint32_t)up << 16);
  double a = fabs(dx - dd), b = fabs(du - dx);
  if (a < b) return down;
  if (b < a) return up;
  return (down & 1) ? up : down;
}

#endif
