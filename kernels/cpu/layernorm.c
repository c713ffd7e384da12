/* layernorm.c — LayerNorm over the last dim (Ba, Kiros & Hinton 2016), eps = 1e-5:
 *   mean = sum_i x_i / C,  var = sum_i (x_i - mean)^2 / C  (biased, as PyTorch),
 *   rstd = 1 / sqrt(var + eps),  n_i = (x_i - mean) * rstd,  out_i = n_i * w_i + b_i.
 * Forward saves mean and rstd (B,T) for backward.
 *
 * Backward: dinp OVERWRITTEN; dweight, dbias ACCUMULATE (+=). With g_i = w_i * dout_i,
 *   dinp_i = rstd * (g_i - mean_j(g_j) - n_i * mean_j(g_j n_j))
 * (the projection of g away from 1 and n, scaled — llm.c's layernorm_backward).
 * dweight_i += sum_rows n_i dout_i, dbias_i += sum_rows dout_i are computed column-wise
 * (each thread owns columns, walks the rows in order), so they need no atomics and do not
 * depend on the thread count. The variance is two-pass (no E[x^2] - E[x]^2 cancellation).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <math.h>

#define LN_EPS 1e-5f
enum { LN_COLS = 16 }; /* columns per work item in the parameter-gradient pass */

void loom_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int B, int T, int C)
{
    /* out (B,T,C), mean (B,T), rstd (B,T), inp (B,T,C), weight (C), bias (C) */
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > LOOM_CPU_PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        const float *x = inp + (size_t)bt * C;
        float *o = out + (size_t)bt * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++)
            s += x[i];
        const float m = s / C;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int i = 0; i < C; i++)
            v += (x[i] - m) * (x[i] - m);
        const float r = 1.0f / sqrtf(v / C + LN_EPS);
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * r * weight[i] + bias[i];
        mean[bt] = m;
        rstd[bt] = r;
    }
}

void loom_cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int B, int T, int C)
{
    /* dinp (B,T,C) =, dweight (C) +=, dbias (C) +=, dout (B,T,C), inp (B,T,C),
     * weight (C), mean (B,T), rstd (B,T) */
    const int BT = B * T, nblk = (C + LN_COLS - 1) / LN_COLS;
    /* Parameter gradients first, so that dinp may even alias dout. */
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > LOOM_CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * LN_COLS, c1 = c0 + LN_COLS < C ? c0 + LN_COLS : C;
        for (int bt = 0; bt < BT; bt++) {
            const float *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
            for (int i = c0; i < c1; i++) {
                dbias[i] += d[i];
                dweight[i] += (x[i] - mean[bt]) * rstd[bt] * d[i];
            }
        }
    }
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > LOOM_CPU_PAR_MIN)
    for (int bt = 0; bt < BT; bt++) {
        const float *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
        float *dx = dinp + (size_t)bt * C;
        const float m = mean[bt], r = rstd[bt];
        float sg = 0.0f, sgn = 0.0f;
#pragma omp simd reduction(+ : sg, sgn)
        for (int i = 0; i < C; i++) {
            const float g = weight[i] * d[i];
            sg += g;
            sgn += g * (x[i] - m) * r;
        }
        sg /= C;
        sgn /= C;
        for (int i = 0; i < C; i++)
            dx[i] = r * (weight[i] * d[i] - sg - (x[i] - m) * r * sgn);
    }
}
