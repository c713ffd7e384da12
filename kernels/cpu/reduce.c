/* reduce.c — whole-buffer reductions and scaling for the training loop: the sum of
 * squares behind the gradient norm, the inf/nan check behind loss-scale skipping, and
 * x *= s (gradient clipping, averaging).
 *
 * sum_squares takes rows of a strided block (a parameter's chunk as one rank holds it:
 * the gradient norm sums fixed chunks so that every tensor-parallel split gives the same
 * bits) and accumulates in double. Each row is cut into units of SQ_UNIT values; the units,
 * in row order, are cut into RED_CHUNKS fixed pieces (by index, not by thread), each piece
 * is summed on its own and the piece sums are added in index order. So the result depends
 * only on the values and on (rows, cols): not on the stride, the alignment or the thread
 * count (an OpenMP reduction clause would add the per-thread sums in arrival order).
 * None of these functions has a gradient; scale changes x in place.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <stdint.h>
#include <string.h>

enum {
    RED_CHUNKS = 64, /* fixed pieces of a reduction, by index (not by thread) */
    SQ_UNIT = 512    /* values of a row summed as one unit by sum_squares: short, so that
                      * one large value swamps few small ones in its lane */
};

/* Sum of squares of one unit (at most SQ_UNIT values): eight explicit lanes (element j
 * goes to lane j % 8, so the compiler may vectorise without reassociating), the lanes
 * added in order, then the tail. Depends on the values and n only, not on alignment. */
static double unit_squares(const float *x, size_t n)
{
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += (double)x[j + l] * x[j + l];
    double s = 0.0;
    for (int l = 0; l < 8; l++)
        s += lane[l];
    for (; j < n; j++)
        s += (double)x[j] * x[j];
    return s;
}

double loom_cpu_sum_squares(const float *x, size_t rows, size_t cols, size_t stride)
{
    /* x rows of cols values, row r at x + r*stride */
    const size_t per_row = (cols + SQ_UNIT - 1) / SQ_UNIT, units = rows * per_row;
    double part[RED_CHUNKS];
#pragma omp parallel for schedule(static) if (rows * cols > LOOM_CPU_PAR_MIN)
    for (int c = 0; c < RED_CHUNKS; c++) {
        const size_t u0 = units * c / RED_CHUNKS, u1 = units * (c + 1) / RED_CHUNKS;
        double s = 0.0;
        for (size_t u = u0; u < u1; u++) {
            const size_t r = u / per_row, p = (u % per_row) * SQ_UNIT;
            s += unit_squares(x + r * stride + p, cols - p < SQ_UNIT ? cols - p : SQ_UNIT);
        }
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
