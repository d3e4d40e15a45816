/*
 * noise_scale.c — the gradient noise scale B_simple = tr(S) / |G|^2
 * (BACKGROUND.md 5; McCandlish, Kaplan, Amodei et al., "An Empirical Model
 * of Large-Batch Training", 2018, appendix A). Each training step yields the
 * squared norms of two gradient estimates, one on B_s samples and one on
 * B_b > B_s; since E|G_B|^2 = |G|^2 + tr(S)/B, two sizes give unbiased
 * estimates of |G|^2 and tr(S) when the samples are drawn with replacement.
 * Training draws them without, an epoch at a time from N: then a random
 * B-subset's E|G_B|^2 = |G|^2 + tr(S) (1/B - 1/N), with G the training set's
 * gradient and S its per-sample covariance (divisor N - 1, Cochran,
 * "Sampling Techniques", the variance of a mean without replacement), and
 * the first B_s of the B_b are a random B_s-subset too. The difference of
 * the two sizes still gives tr(S); the |G|^2 estimate above has mean
 * |G|^2 - tr(S)/N, so tr(S)/N is added back. (Late in a run on a small set
 * |G|^2 falls under tr(S)/N and the uncorrected estimate went negative: no
 * B_simple at all.) Both are noisy, so they are averaged separately —
 * exponential moving averages with Adam-style bias correction — and divided
 * only at the end.
 */
#include "strata.h"

#include <math.h>

void st_noise_scale_init(st_noise_scale *ns, double beta) {
  ns->beta = beta;
  ns->g2 = ns->trace = 0;
  ns->weight = 0;
  ns->n = 0;
  ns->population = 0;
}

void st_noise_scale_add(st_noise_scale *ns, double gs2, int bs, double gb2,
                        int bb) {
  double g2 = ((double)bb * gb2 - (double)bs * gs2) / (double)(bb - bs);
  double trace = (gs2 - gb2) / (1.0 / bs - 1.0 / bb);
  if (ns->population > 0) g2 += trace / (double)ns->population;
  ns->g2 = ns->beta * ns->g2 + (1 - ns->beta) * g2;
  ns->trace = ns->beta * ns->trace + (1 - ns->beta) * trace;
  ns->weight = ns->beta * ns->weight + (1 - ns->beta);
  ns->n++;
}

double st_noise_scale_value(const st_noise_scale *ns, double *g2,
                            double *trace) {
  double G = ns->weight > 0 ? ns->g2 / ns->weight : NAN;
  double S = ns->weight > 0 ? ns->trace / ns->weight : NAN;
  if (g2) *g2 = G;
  if (trace) *trace = S;
  /* a negative tr(S) estimate (the small batch's norm below the large
   * one's) is noise, not a scale: no estimate, as for |G|^2 <= 0 */
  return ns->n > 0 && G > 0 && S >= 0 ? S / G : NAN;
}
