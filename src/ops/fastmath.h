/*
 * fastmath.h — private to src/ops/: elementary functions written so that
 * loops over them vectorise (a libm call per element does not), shared by
 * the softmaxes (attention, cross-entropy) and GELU. Deterministic: the same
 * input gives the same bits on any thread count.
 */
#ifndef STRATA_OPS_FASTMATH_H
#define STRATA_OPS_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0, branch-free so that loops over it vectorise (libm's
 * expf is a call per element, which made attention's softmax half its
 * forward time). Cephes expf: x = n ln2 + r with ln 2 split in two
 * (Cody-Waite) so r is exact, exp(r) by a degree-6 minimax polynomial on |r| <=
 * ln2/2, then scaled by 2^n built in the exponent bits; relative error within 2
 * ulp. Inputs below -87 are taken as -87 (exp ~ 1.6e-38, 2^-126 keeps the scale
 * normal): a probability that small is zero next to the row's 1. A NaN stays
 * NaN. n = round(x log2 e) by adding and subtracting 1.5 * 2^23. */
static inline float exp_nonpositive(float x) {
  const float rounder = 12582912.0f, log2e = 1.44269504088896341f;
  const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  x = x < -87.0f ? -87.0f : x;
  float t = x * log2e + rounder, n = t - rounder;
  uint32_t bits;
  memcpy(&bits, &t, sizeof bits); /* low mantissa bits hold n */
  uint32_t exponent = (bits - 0x4B400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &exponent, sizeof scale);
  float r = x - n * ln2_hi - n * ln2_lo, z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return (p * z + r + 1.0f) * scale;
}

#endif
