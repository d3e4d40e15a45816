/*
 * test_split.c — the backward split in two (st_block_backward_input, the
 * B half, then st_block_backward_weights, the W half; what zb1p defers)
 * against the whole backward (st_block_backward), block by block, for the
 * three test models (an MLP with dropout; a CNN with convolutions, group
 * norm, pooling, a residual and dropout; a GPT with embeddings, layer norm,
 * attention, a tied head and dropout), training on, at batch 1, 3 and 8
 * (the convolution's tiled and grouped weight-gradient paths), on a pool
 * of 2 threads:
 *  - B writes the same input gradient bits and no weight gradient;
 *  - W then adds the same weight-gradient bits as the whole backward;
 *  - the first block without an input gradient (din NULL) as stage 0 runs it.
 * Bit for bit, as the schedules' contract needs: the same kernels on the
 * same operands in the same order.
 */
#include "harness.h"
#include "strata.h"

#include <stdlib.h>
#include <string.h>

static float *floats(size_t n) {
  float *p = st_alloc((n ? n : 1) * sizeof *p);
  memset(p, 0, (n ? n : 1) * sizeof *p);
  return p;
}

static void set_all(st_config *c, const char *const *sets, int n) {
  st_error err = {0};
  for (int i = 0; i < n; i++)
    CHECK(st_config_set(c, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
}

static uint32_t rnd = 12345u;
static float uniform(void) {
  rnd = rnd * 1664525u + 1013904223u;
  return (float)(rnd >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static void check_model(const char *what, const st_config *c, st_shape in,
                        int vocab) {
  st_model *m = NULL;
  st_error err = {0};
  if (st_model_create(&m, c, in, &err)) {
    CHECK(0, "%s: %s", what, err.msg);
    return;
  }
  st_pool *pool = st_pool_create(2);
  float *params = floats(m->n_params);
  st_model_init(m, params, 7);
  const int Bs[] = {1, 3, 8};
  /* a GPT's fused head reads the labels: 8 samples' worth */
  int *labels = calloc((size_t)8 * m->label_rows, sizeof *labels);
  for (int j = 0; j < 8 * m->label_rows; j++)
    labels[j] = vocab ? j * 7 % vocab : 0;
  for (int bi = 0; bi < 3; bi++) {
    int B = Bs[bi];
    /* training: dropout on */
    st_ctx ctx = {pool, 1, 99, 0, NULL, vocab ? labels : NULL};
    for (int i = 0; i < m->n_blocks; i++) {
      const st_block *b = &m->blocks[i];
      size_t nin = (size_t)B * st_shape_numel(b->in);
      size_t nout = (size_t)B * st_shape_numel(b->out);
      float *x = floats(nin), *dout = floats(nout);
      for (size_t j = 0; j < nin; j++)
        x[j] = i == 0 && vocab ? (float)(j * 7 % (size_t)vocab) : uniform();
      for (size_t j = 0; j < nout; j++) dout[j] = uniform();
      float *acts = floats((size_t)B * b->act_per_sample);
      float *scratch = floats((size_t)B * m->max_scratch_per_sample);
      float *work = floats(3 * (size_t)B * b->max_numel);
      float *dys = floats((size_t)B * st_block_dys_floats(b));
      float *g_whole = floats(m->n_params), *g_split = floats(m->n_params);
      float *d_whole = floats(nin), *d_split = floats(nin);
      st_block_forward(b, &ctx, params + b->param_off, x, acts, scratch, B);
      for (int with_din = 1; with_din >= 0; with_din--) {
        memset(g_whole, 0, m->n_params * sizeof(float));
        memset(g_split, 0, m->n_params * sizeof(float));
        memset(d_whole, 0, nin * sizeof(float));
        memset(d_split, 0, nin * sizeof(float));
        st_block_backward(b, &ctx, params + b->param_off,
                          g_whole + b->param_off, x, acts, dout,
                          with_din ? d_whole : NULL, work, scratch, B);
        st_block_backward_input(b, &ctx, params + b->param_off, x, acts, dout,
                                with_din ? d_split : NULL, work, scratch, dys,
                                B);
        int untouched = 1;
        for (size_t j = 0; j < m->n_params; j++) untouched &= g_split[j] == 0;
        CHECK(untouched, "%s block %d B=%d: the B half wrote a weight gradient",
              what, i, B);
        CHECK(memcmp(d_whole, d_split, nin * sizeof(float)) == 0,
              "%s block %d B=%d: input gradients differ", what, i, B);
        st_block_backward_weights(b, &ctx, params + b->param_off,
                                  g_split + b->param_off, x, acts, dys, scratch,
                                  B);
        int nonzero = 0;
        for (size_t j = 0; j < b->n_params; j++)
          nonzero |= g_whole[b->param_off + j] != 0;
        CHECK(nonzero || b->n_params == 0,
              "%s block %d B=%d: no weight gradient at all", what, i, B);
        CHECK(memcmp(g_whole, g_split, m->n_params * sizeof(float)) == 0,
              "%s block %d B=%d din=%d: weight gradients differ", what, i, B,
              with_din);
      }
      st_free(x);
      st_free(dout);
      st_free(acts);
      st_free(scratch);
      st_free(work);
      st_free(dys);
      st_free(g_whole);
      st_free(g_split);
      st_free(d_whole);
      st_free(d_split);
    }
  }
  free(labels);
  st_free(params);
  st_pool_destroy(pool);
  st_model_destroy(m);
}

int main(void) {
  st_blas_init();
  st_config c;
  st_config_defaults(&c);
  set_all(&c, (const char *[]){"model.hidden=[24,16]", "model.dropout=0.1"}, 2);
  check_model("mlp", &c, (st_shape){1, 28, 28}, 0);
  st_config_defaults(&c);
  set_all(&c,
          (const char *[]){"model.kind=cnn", "model.channels=[4,8]",
                           "model.residual_blocks=1", "model.norm=groupnorm",
                           "model.groups=2", "model.dense=[16]",
                           "model.dropout=0.1"},
          7);
  check_model("cnn", &c, (st_shape){1, 28, 28}, 0);
  st_config_defaults(&c);
  set_all(&c,
          (const char *[]){"model.kind=gpt", "model.context=8",
                           "model.layers=2", "model.heads=2", "model.width=16",
                           "model.vocab=40", "model.dropout=0.1",
                           "model.activation=gelu_tanh"},
          8);
  check_model("gpt", &c, (st_shape){1, 8, 1}, 40);
  TH_DONE();
}
