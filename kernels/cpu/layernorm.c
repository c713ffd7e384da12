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

/* One row: o = (x - mean) rstd w + b; writes mean and rstd. */
LOOM_CPU_BODY row_forward_body(float *restrict o, float *mean, float *rstd, const float *restrict x,
                               const float *restrict w, const float *restrict b, int C)
{
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
        o[i] = (x[i] - m) * r * w[i] + b[i];
    *mean = m;
    *rstd = r;
}
LOOM_CPU_VARIANTS(row_forward,
                  (float *restrict o, float *mean, float *rstd, const float *restrict x,
                   const float *restrict w, const float *restrict b, int C),
                  (o, mean, rstd, x, w, b, C))

/* One row of dinp, from the formula in the opening comment. */
LOOM_CPU_BODY row_backward_body(float *dx, const float *d, const float *restrict x,
                                const float *restrict w, float m, float r, int C)
{
    float sg = 0.0f, sgn = 0.0f;
#pragma omp simd reduction(+ : sg, sgn)
    for (int i = 0; i < C; i++) {
        const float g = w[i] * d[i];
        sg += g;
        sgn += g * (x[i] - m) * r;
    }
    sg /= C;
    sgn /= C;
    for (int i = 0; i < C; i++)
        dx[i] = r * (w[i] * d[i] - sg - (x[i] - m) * r * sgn);
}
LOOM_CPU_VARIANTS(row_backward,
                  (float *dx, const float *d, const float *restrict x, const float *restrict w,
                   float m, float r, int C),
                  (dx, d, x, w, m, r, C))

/* Columns c0 .. c0+n (n <= LN_COLS) of dweight and dbias: sums over all rows, in order. */
LOOM_CPU_BODY param_block_body(float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *mean, const float *rstd, int BT, int C, int c0, int n)
{
    float dw[LN_COLS] = {0}, db[LN_COLS] = {0};
    for (int bt = 0; bt < BT; bt++) {
        const float *x = inp + (size_t)bt * C + c0, *d = dout + (size_t)bt * C + c0;
        for (int i = 0; i < n; i++) {
            db[i] += d[i];
            dw[i] += (x[i] - mean[bt]) * rstd[bt] * d[i];
        }
    }
    for (int i = 0; i < n; i++) {
        dbias[c0 + i] += db[i];
        dweight[c0 + i] += dw[i];
    }
}
LOOM_CPU_VARIANTS(param_block,
                  (float *dweight, float *dbias, const float *dout, const float *inp,
                   const float *mean, const float *rstd, int BT, int C, int c0, int n),
                  (dweight, dbias, dout, inp, mean, rstd, BT, C, c0, n))

void loom_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int B, int T, int C)
{
    /* out (B,T,C), mean (B,T), rstd (B,T), inp (B,T,C), weight (C), bias (C) */
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > LOOM_CPU_PAR_MIN)
    for (int bt = 0; bt < B * T; bt++)
        row_forward(out + (size_t)bt * C, &mean[bt], &rstd[bt], inp + (size_t)bt * C, weight,
                    bias, C);
}

void loom_cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int B, int T, int C)
{
    /* dinp (B,T,C) =, dweight (C) +=, dbias (C) +=, dout (B,T,C), inp (B,T,C),
     * weight (C), mean (B,T), rstd (B,T) */
    const int BT = B * T, nblk = (C + LN_COLS - 1) / LN_COLS;
    /* Parameter gradients first, so that dinp may even alias dout. */
#pragma omp parallel for schedule(static) if ((size_t)BT * C > LOOM_CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * LN_COLS, n = C - c0 < LN_COLS ? C - c0 : LN_COLS;
        param_block(dweight, dbias, dout, inp, mean, rstd, BT, C, c0, n);
    }
#pragma omp parallel for schedule(static) if ((size_t)BT * C > LOOM_CPU_PAR_MIN)
    for (int bt = 0; bt < BT; bt++)
        row_backward(dinp + (size_t)bt * C, dout + (size_t)bt * C, inp + (size_t)bt * C, weight,
                     mean[bt], rstd[bt], C);
}
