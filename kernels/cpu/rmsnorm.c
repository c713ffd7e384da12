/* rmsnorm.c — RMSNorm over the last dim (Zhang & Sennrich 2019; Llama's, as Hugging Face's
 * LlamaRMSNorm computes it):
 *   rstd = 1 / sqrt(sum_i x_i^2 / C + eps),  n_i = x_i * rstd,  out_i = n_i * w_i.
 * Forward saves rstd (rows) for backward. No mean, no bias.
 *
 * Backward: dinp OVERWRITTEN; dweight ACCUMULATES (+=). With g_i = w_i * dout_i,
 *   dinp_i = rstd * (g_i - n_i * mean_j(g_j n_j))
 * dweight_i += sum_rows n_i dout_i, column-wise (each thread owns columns and walks the rows
 * in order): no atomics, the same bits for any thread count (layernorm.c's scheme).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <math.h>

enum { RMS_COLS = 16 }; /* columns per work item in the parameter-gradient pass */

LOOM_CPU_BODY rms_row_forward_body(float *restrict o, float *rstd, const float *restrict x,
                                   const float *restrict w, int C, float eps)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; i++)
        s += x[i] * x[i];
    const float r = 1.0f / sqrtf(s / C + eps);
    for (int i = 0; i < C; i++)
        o[i] = x[i] * r * w[i];
    *rstd = r;
}
LOOM_CPU_VARIANTS(rms_row_forward,
                  (float *restrict o, float *rstd, const float *restrict x,
                   const float *restrict w, int C, float eps),
                  (o, rstd, x, w, C, eps))

LOOM_CPU_BODY rms_row_backward_body(float *dx, const float *d, const float *restrict x,
                                    const float *restrict w, float r, int C)
{
    float sgn = 0.0f;
#pragma omp simd reduction(+ : sgn)
    for (int i = 0; i < C; i++)
        sgn += w[i] * d[i] * x[i] * r;
    sgn /= C;
    for (int i = 0; i < C; i++)
        dx[i] = r * (w[i] * d[i] - x[i] * r * sgn);
}
LOOM_CPU_VARIANTS(rms_row_backward,
                  (float *dx, const float *d, const float *restrict x, const float *restrict w,
                   float r, int C),
                  (dx, d, x, w, r, C))

LOOM_CPU_BODY rms_param_block_body(float *dweight, const float *dout, const float *inp,
                                   const float *rstd, size_t rows, int C, int c0, int n)
{
    float dw[RMS_COLS] = {0};
    for (size_t r = 0; r < rows; r++) {
        const float *x = inp + r * C + c0, *d = dout + r * C + c0;
        for (int i = 0; i < n; i++)
            dw[i] += x[i] * rstd[r] * d[i];
    }
    for (int i = 0; i < n; i++)
        dweight[c0 + i] += dw[i];
}
LOOM_CPU_VARIANTS(rms_param_block,
                  (float *dweight, const float *dout, const float *inp, const float *rstd,
                   size_t rows, int C, int c0, int n),
                  (dweight, dout, inp, rstd, rows, C, c0, n))

void loom_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                              size_t rows, int C, float eps)
{
    /* out (rows,C), rstd (rows), inp (rows,C), weight (C) */
#pragma omp parallel for schedule(static) if (rows * C > LOOM_CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++)
        rms_row_forward(out + r * C, &rstd[r], inp + r * C, weight, C, eps);
}

void loom_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, size_t rows, int C)
{
    /* dinp (rows,C) =, dweight (C) +=, dout (rows,C), inp (rows,C), weight (C), rstd (rows) */
    const int nblk = (C + RMS_COLS - 1) / RMS_COLS;
    /* The parameter gradient first, so that dinp may alias dout. */
#pragma omp parallel for schedule(static) if (rows * C > LOOM_CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * RMS_COLS, n = C - c0 < RMS_COLS ? C - c0 : RMS_COLS;
        rms_param_block(dweight, dout, inp, rstd, rows, C, c0, n);
    }
#pragma omp parallel for schedule(static) if (rows * C > LOOM_CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++)
        rms_row_backward(dinp + r * C, dout + r * C, inp + r * C, weight, rstd[r], C);
}
