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

void st_dropout_forward(float *out, float *mask, const float *in, int B,
                        size_t n, float p, uint64_t seed, uint32_t layer_id,
                        uint64_t first_sample) {
  size_t total = (size_t)B * n;
  if (p <= 0.0f) {
    memmove(out, in, sizeof(float) * total);
    for (size_t i = 0; i < total; i++) mask[i] = 1.0f;
    return;
  }
  if (p >= 1.0f) { /* PyTorch: everything dropped, nothing scaled */
    memset(out, 0, sizeof(float) * total);
    memset(mask, 0, sizeof(float) * total);
    return;
  }
  float scale = 1.0f / (1.0f - p);
  /* Drop when the 32-bit word is below p * 2^32: probability p to 2^-32. */
  uint64_t threshold = (uint64_t)((double)p * 4294967296.0);
  uint64_t key = dropout_key(seed, layer_id);
  for (int s = 0; s < B; s++) {
    float *y = out + (size_t)s * n, *k = mask + (size_t)s * n;
    const float *x = in + (size_t)s * n;
    for (size_t j = 0; j < n; j += 4) {
      uint32_t r[4];
      st_philox(key, first_sample + (uint64_t)s, j / 4, r);
      for (size_t t = 0; t < 4 && j + t < n; t++) {
        k[j + t] = r[t] >= threshold ? scale : 0.0f;
        y[j + t] = x[j + t] * k[j + t];
      }
    }
  }
}

void st_dropout_backward(float *din, const float *dout, const float *mask,
                         size_t total) {
  for (size_t i = 0; i < total; i++) din[i] = dout[i] * mask[i];
}

/* Per element: one multiply each way; the mask is kept beside the output. */
st_cost st_dropout_cost(size_t numel) {
  st_cost c;
  c.flops_fwd = (double)numel;
  c.flops_bwd = (double)numel;
  c.param_bytes = 0;
  c.act_bytes = 8.0 * (double)numel;
  return c;
}
