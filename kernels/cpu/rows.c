/* rows.c — row gather, scatter-add and row dot products: how a mixture-of-experts layer
 * (core/model/moe.c) moves token rows to the experts that received them and back.
 *
 * idx[i] names a row of the (rows, C) side; scale (may be NULL: 1) weights row i. The
 * scatter adds rows in i order, so a token's contributions from several experts sum in a
 * fixed order whatever the thread count (threads split the columns, never the rows).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

void loom_cpu_rows_gather(float *out, const float *inp, const int *idx, const float *scale,
                          size_t n, int C)
{
    /* out (n,C) =, inp (rows,C) */
#pragma omp parallel for schedule(static) if (n * (size_t)C > LOOM_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float *src = inp + (size_t)idx[i] * C;
        float *dst = out + i * C, s = scale ? scale[i] : 1.0f;
        for (int c = 0; c < C; c++)
            dst[c] = s * src[c];
    }
}

void loom_cpu_rows_scatter_add(float *out, const float *inp, const int *idx, const float *scale,
                               size_t n, int C)
{
    /* out (rows,C) +=, inp (n,C); rows in i order, columns split over threads */
#pragma omp parallel for schedule(static) if (n * (size_t)C > LOOM_CPU_PAR_MIN && C >= 64)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        for (size_t i = 0; i < n; i++) {
            float *dst = out + (size_t)idx[i] * C;
            const float *src = inp + i * C;
            float s = scale ? scale[i] : 1.0f;
            for (int c = c0; c < c1; c++)
                dst[c] += s * src[c];
        }
    }
}

void loom_cpu_rows_dot(float *out, const float *a, const int *idx, const float *b, size_t n, int C)
{
    /* out (n) =, a (rows,C), b (n,C): out[i] = a[idx[i]] . b[i], summed over c in order */
#pragma omp parallel for schedule(static) if (n * (size_t)C > LOOM_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float *x = a + (size_t)idx[i] * C, *y = b + i * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++)
            sum += (double)x[c] * y[c];
        out[i] = (float)sum;
    }
}
