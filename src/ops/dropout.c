/*
 * dropout.c — inverted dropout (Srivastava et al. 2014): each element is kept
 * with probability 1 - p and scaled by 1/(1 - p), so evaluation needs no
 * rescaling.
 *
 * The keep decision is drawn from Philox (src/tensor/rng.c), counter-based:
 * the key is the dropout stream of the run's seed mixed with the layer id, the
 * counter is (global sample index, j / 4), and the block's four 32-bit words
 * decide elements j .. j+3. A decision is therefore a pure function of (seed,
 * layer, sample, element): the same whatever the batch or micro-batch split
 * and whatever thread runs it (STYLE.md 8).
 */
#include "strata.h"

#include <string.h>

/* splitmix64 finaliser, to spread the layer id over the key bits. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t dropout_key(uint64_t seed, uint32_t layer_id) {
  st_rng stream;
  st_rng_init(&stream, seed, ST_RNG_DROPOUT, 0);
  return mix64(stream.key ^ mix64((uint64_t)layer_id + 1));
}

size_t st_dropout_mask_words(size_t n) { return (n + 31) / 32; }

/* The scale a kept element takes: 1/(1 - p); 1 at p <= 0 (all kept). */
static float keep_scale(float p) {
  return p <= 0.0f ? 1.0f : 1.0f / (1.0f - p);
}

void st_dropout_forward(float *out, uint32_t *mask, const float *in, int B,
                        size_t n, float p, uint64_t seed, uint32_t layer_id,
                        uint64_t first_sample) {
  size_t words = st_dropout_mask_words(n);
  memset(mask, p <= 0.0f ? 0xff : 0, (size_t)B * words * sizeof *mask);
  if (p <= 0.0f) {
    memmove(out, in, sizeof(float) * (size_t)B * n);
    return;
  }
  if (p >= 1.0f) { /* PyTorch: everything dropped, nothing scaled */
    memset(out, 0, sizeof(float) * (size_t)B * n);
    return;
  }
  float scale = keep_scale(p);
  /* Drop when the 32-bit word is below p * 2^32: probability p to 2^-32. */
  uint64_t threshold = (uint64_t)((double)p * 4294967296.0);
  uint64_t key = dropout_key(seed, layer_id);
  for (int s = 0; s < B; s++) {
    float *y = out + (size_t)s * n;
    uint32_t *k = mask + (size_t)s * words;
    const float *x = in + (size_t)s * n;
    for (size_t j = 0; j < n; j += 4) {
      uint32_t r[4];
      st_philox(key, first_sample + (uint64_t)s, j / 4, r);
      for (size_t t = 0; t < 4 && j + t < n; t++) {
        int keep = r[t] >= threshold;
        k[(j + t) / 32] |= (uint32_t)keep << ((j + t) % 32);
        y[j + t] = x[j + t] * (keep ? scale : 0.0f);
      }
    }
  }
}

void st_dropout_backward(float *din, const float *dout, const uint32_t *mask,
                         int B, size_t n, float p) {
  size_t words = st_dropout_mask_words(n);
  float scale = p >= 1.0f ? 0.0f : keep_scale(p);
  for (int s = 0; s < B; s++) {
    const uint32_t *k = mask + (size_t)s * words;
    const float *g = dout + (size_t)s * n;
    float *d = din + (size_t)s * n;
    for (size_t j = 0; j < n; j++)
      d[j] = g[j] * (k[j / 32] >> (j % 32) & 1 ? scale : 0.0f);
  }
}

/* Per element: one multiply each way; the mask, a bit an element, is kept
 * beside the output. */
st_cost st_dropout_cost(size_t numel) {
  st_cost c;
  c.flops_fwd = (double)numel;
  c.flops_bwd = (double)numel;
  c.param_bytes = 0;
  c.act_bytes =
      4.0 * (double)numel + 4.0 * (double)st_dropout_mask_words(numel);
  return c;
}
