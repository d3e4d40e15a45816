/*
 * embedding.c — the input layer of a GPT: token embedding plus learned
 * positional embedding, out (B, T, C) = wte[tokens[b, t]] + wpe[t], with wte
 * (V, C) and wpe (T_max, C), T <= T_max (GPT-2; Radford et al. 2019). A model
 * with rotary positions (rotary in attention.c) passes wpe = NULL.
 *
 * The backward is a scatter-add: each (b, t) adds its dout row into the row of
 * its token. Rows are visited in the fixed order b, then t, so a token that
 * repeats accumulates its contributions in the same order every run and the
 * result is bitwise deterministic (no threads here: the op moves B*T*C floats,
 * far less than the layers around it).
 *
 * Tokens must lie in [0, V); the data layer checks them before they get here.
 */
#include "strata.h"

void st_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *restrict y = out + ((size_t)b * T + t) * C;
      const float *restrict e = wte + (size_t)tokens[(size_t)b * T + t] * C;
      if (wpe) {
        const float *restrict p = wpe + (size_t)t * C;
        for (int i = 0; i < C; i++) y[i] = e[i] + p[i];
      } else {
        for (int i = 0; i < C; i++) y[i] = e[i];
      }
    }
}

void st_embedding_backward(float *dwte, float *dwpe, const float *dout,
                           const int32_t *tokens, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *restrict g = dout + ((size_t)b * T + t) * C;
      if (dwte) {
        float *restrict d = dwte + (size_t)tokens[(size_t)b * T + t] * C;
        for (int i = 0; i < C; i++) d[i] += g[i];
      }
      if (dwpe) {
        float *restrict d = dwpe + (size_t)t * C;
        for (int i = 0; i < C; i++) d[i] += g[i];
      }
    }
}

/* Per sample of T tokens, with the positional table of T rows (T = the
 * context length). Forward: one add per output element; backward: two
 * scatter-adds. Saved for the backward: the tokens (int32); the output is
 * counted as this op's activation, as for every op. A model without learned
 * positions holds 4*T*C fewer parameter bytes and does T*C fewer adds each
 * way. */
st_cost st_embedding_cost(int T, int C, int V) {
  st_cost c;
  c.flops_fwd = (double)T * C;
  c.flops_bwd = 2.0 * T * C;
  c.param_bytes = 4.0 * ((double)V * C + (double)T * C);
  c.act_bytes = 4.0 * ((double)T * C + T);
  return c;
}
