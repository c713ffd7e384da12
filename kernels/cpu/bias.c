/* bias.c — a linear layer's bias on its own: out += bias on every row (a row-parallel
 * layer adds it once, after its partial sums are combined) and the bias gradient, dbias +=
 * the column sums of dout. matmul_backward's dbias is this same bias_backward, so there is
 * one implementation of the column sum.
 *
 * bias_backward's order (the same bits for any thread count, and per column independent of
 * rows-but-not-cols blocking): each column o is summed in float from +0 over the rows in
 * increasing order, acc = ((0 + d_0o) + d_1o) + ..., and then dbias[o] += acc. Threads own
 * disjoint blocks of BIAS_COLS columns and walk all the rows; no atomics. Column o's
 * result depends only on column o's values, so a layer split by columns gives the bits of
 * the unsplit one.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

enum { BIAS_COLS = 64 }; /* bias-gradient columns per work item */

void loom_cpu_bias_add(float *out, const float *bias, size_t rows, int cols)
{
    /* out (rows,cols) +=, bias (cols) */
#pragma omp parallel for schedule(static) if (rows * (size_t)cols > LOOM_CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++) {
        float *o = out + r * (size_t)cols;
#pragma omp simd
        for (int c = 0; c < cols; c++)
            o[c] += bias[c];
    }
}

void loom_cpu_bias_backward(float *dbias, const float *dout, size_t rows, int cols)
{
    /* dbias (cols) +=, dout (rows,cols) */
    const int nblk = (cols + BIAS_COLS - 1) / BIAS_COLS;
#pragma omp parallel for schedule(static) if (rows * (size_t)cols > LOOM_CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int o0 = blk * BIAS_COLS, o1 = o0 + BIAS_COLS < cols ? o0 + BIAS_COLS : cols;
        float acc[BIAS_COLS] = {0};
        for (size_t r = 0; r < rows; r++) {
            const float *d = dout + r * (size_t)cols;
            for (int o = o0; o < o1; o++)
                acc[o - o0] += d[o];
        }
        for (int o = o0; o < o1; o++)
            dbias[o] += acc[o - o0];
    }
}
