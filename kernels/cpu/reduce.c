/* reduce.c — whole-buffer reductions and scaling for the training loop: the sum of
 * squares behind the gradient norm, the inf/nan check behind loss-scale skipping, and
 * x *= s (gradient clipping, averaging).
 *
 * sum_squares accumulates in double. The buffer is cut into RED_CHUNKS fixed pieces (by
 * index, not by thread), each piece is summed on its own and the piece sums are added in
 * index order, so the result is bitwise the same for any thread count (an OpenMP
 * reduction clause would add the per-thread sums in arrival order).
 * None of these functions has a gradient; scale changes x in place.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <stdint.h>
#include <string.h>

enum { RED_CHUNKS = 64 };

double loom_cpu_sum_squares(const float *x, size_t n)
{
    /* x (n) */
    double part[RED_CHUNKS];
#pragma omp parallel for schedule(static) if (n > LOOM_CPU_PAR_MIN)
    for (int c = 0; c < RED_CHUNKS; c++) {
        const size_t i0 = n * c / RED_CHUNKS, i1 = n * (c + 1) / RED_CHUNKS;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++)
            s += (double)x[i] * x[i];
        part[c] = s;
    }
    double total = 0.0;
    for (int c = 0; c < RED_CHUNKS; c++)
        total += part[c];
    return total;
}

int loom_cpu_has_nonfinite(const float *x, size_t n)
{
    /* x (n). A float is inf or nan exactly when its exponent bits are all ones. */
    int found = 0;
#pragma omp parallel for schedule(static) reduction(| : found) if (n > LOOM_CPU_PAR_MIN)
    for (int c = 0; c < RED_CHUNKS; c++) {
        const size_t i0 = n * c / RED_CHUNKS, i1 = n * (c + 1) / RED_CHUNKS;
        uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
        for (size_t i = i0; i < i1; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        found |= bad != 0;
    }
    return found;
}

void loom_cpu_scale(float *x, float s, size_t n)
{
    /* x (n) *= s */
#pragma omp parallel for simd schedule(static) if (n > LOOM_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}
