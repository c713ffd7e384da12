/* gpt_distill_attn.c — distillation's attention-probability term (TinyBERT, Jiao et al.
 * 2020), per query row: gamma/NH * sum over heads h, keys j of (P_s - P_t)^2, with P the
 * causal softmax probabilities attention_forward saves (B,NH,T,T; zero above the
 * diagonal in both, so those entries add nothing). The mean over rows the trainer takes
 * of per-token losses makes it gamma * mean over heads and queries of sum_keys (P_s-P_t)^2.
 * Its gradient with respect to P_s goes to backend.h's attention_backward_datt.
 * Sums in double in fixed order: the same bits whatever the thread count or layout.
 */
#include "gpt_distill.h"

void loom_kd_attention_rows(const float *ps, const float *pt, int B, int NH, int T, float gamma,
                            float scale, double *loss, float *dp)
{
    const double w = (double)gamma / NH, g = 2.0 * w * scale;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double sq = 0.0;
            for (int h = 0; h < NH; h++) {
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                for (int j = 0; j < T; j++) {
                    double d = (double)ps[row + j] - pt[row + j];
                    sq += d * d;
                    if (dp)
                        dp[row + j] = (float)(g * d);
                }
            }
            loss[(size_t)b * T + t] += w * sq;
        }
}
