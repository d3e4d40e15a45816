/*
 * step.c — the part of a micro-batch's step every mode runs the same way:
 * the loss at the last block (softmax cross-entropy over the micro-batch's
 * label rows), its gradient, and the noise scale's first-micro-batch norm.
 * The sequential mode, weight streaming, the pipelines' last stage and
 * pipelined backprop's all call these, so the loss a mode reports and the
 * gradient it starts its backward from are one piece of code.
 */
#include "runtime.h"

#include <math.h>

void st_rt_loss(const st_trainer_view *v, st_pool *pool, int64_t k, int mb,
                const float *logits, float *probs) {
  const st_model *m = v->model;
  size_t rows = (size_t)mb * m->label_rows; /* R labels per sample */
  st_model_loss(m, pool, v->losses + (size_t)k * rows, probs, logits,
                v->y + (size_t)k * rows, (int)rows);
}

void st_rt_loss_grad(const st_trainer_view *v, st_pool *pool, int64_t k, int mb,
                     int over, const float *probs, float *dlogits) {
  const st_model *m = v->model;
  int R = m->label_rows;
  size_t rows = (size_t)mb * R;
  st_model_loss_grad(m, pool, dlogits, probs, v->y + (size_t)k * rows,
                     (int)rows, 1.0f / ((float)over * (float)R));
}

void st_rt_noise_first(const st_trainer_view *v, int mb) {
  if (!v->gs2) return;
  /* the gradient so far is the first micro-batch's sum scaled by
   * 1/loss_batch; its mean over the micro-batch is loss_batch/mb times
   * that */
  double scale = (double)v->loss_batch / mb;
  *v->gs2 = st_trainer_grad_sq(v) * scale * scale;
}

double st_sum_squares(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

double st_trainer_grad_sq(const st_trainer_view *v) {
  const st_model *m = v->model;
  double s = st_sum_squares(v->grads, m->n_params);
  /* a tied pair is one weight: its gradient is the sum of the two */
  for (int i = 0; m->n_ties && i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++) {
      const st_tensor_info *ti = &m->blocks[i].tensors[t];
      if (ti->tie < 0) continue;
      const float *a = v->grads + m->blocks[i].param_off + ti->offset;
      const float *b = v->grads + ti->tie;
      for (size_t k = 0; k < ti->numel; k++) {
        double sum = (double)a[k] + b[k];
        s += sum * sum - (double)a[k] * a[k] - (double)b[k] * b[k];
      }
    }
  return s;
}

int st_trainer_check_loss(const st_trainer_view *v, double *loss,
                          st_error *err) {
  double sum = 0;
  size_t n = (size_t)v->batch * (size_t)v->model->label_rows;
  for (size_t s = 0; s < n; s++) sum += v->losses[s];
  *loss = sum / (double)n;
  if (isfinite(*loss)) return 0;
  return st_error_set(err, ST_ENONFINITE,
                      "step %lld: training loss is %s (samples %lld..%lld); "
                      "stopped before updating, no checkpoint written — "
                      "lower optimizer.lr",
                      (long long)v->step + 1, isnan(*loss) ? "NaN" : "infinite",
                      (long long)v->first_sample,
                      (long long)v->first_sample + v->batch - 1);
}
