/*
 * noise_scale.c — the gradient noise scale B_simple = tr(S) / |G|^2
 * (BACKGROUND.md 5; McCandlish, Kaplan, Amodei et al., "An Empirical Model
 * of Large-Batch Training", 2018, appendix A). Each training step yields the
 * squared norms of two gradient estimates, one on B_s samples and one on
 * B_b > B_s; since E|G_B|^2 = |G|^2 + tr(S)/B, two sizes give unbiased
 * estimates of |G|^2 and tr(S). Both are noisy, so they are averaged
 * separately — exponential moving averages with Adam-style bias correction —
 * and divided only at the end.
 */
#include "strata.h"

#include <math.h>

void st_noise_scale_init(st_noise_scale *ns, double beta) {
  ns->beta = beta;
  ns->g2 = ns->trace = 0;
  ns->weight = 0;
  ns->n = 0;
}

void st_noise_scale_add(st_noise_scale *ns, double gs2, int bs, double gb2,
                        int bb) {
  double g2 = ((double)bb * gb2 - (double)bs * gs2) / (double)(bb - bs);
  double trace = (gs2 - gb2) / (1.0 / bs - 1.0 / bb);
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
