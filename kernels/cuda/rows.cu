/* rows.cu — a mixture-of-experts layer's row moves (backend.h's rows_gather,
 * rows_scatter_add, rows_dot; kernels/cpu/rows.c has the contracts): token rows to the
 * experts that received them and back, fp32. idx (and scale) are device arrays.
 *
 * Every op gives the CPU backend's bits:
 * - gather: one thread per value, out = s * x (one rounding, or none with no scale);
 * - scatter-add: scatter_sorted.cu's — the rows sorted stably by destination on the device,
 *   then one thread per (destination, column) adding its rows in increasing i, each step
 *   dst = dst + s * src rounded twice (__fmul_rn, __fadd_rn: nvcc may not contract them
 *   into an FMA, which the CPU's loop does not do), so a row receiving several rows sums
 *   them in the CPU's order. The op is not told out's row count, so the sort takes all 31
 *   bits of idx (four passes);
 * - dot: one thread per row, the C products summed in double in column order. A float
 *   product is exact in double, so an FMA contraction of sum + x * y rounds once, as the
 *   CPU's separate multiply and add do: the same bits either way.
 */
#include "kernels.cuh"

#include <limits.h>

__global__ void rows_gather_kernel(float *out, const float *inp, const int *idx,
                                   const float *scale, size_t n, int C)
{
    GRID_STRIDE(v, n * (size_t)C)
    {
        const size_t i = v / C, c = v % C;
        const float x = inp[(size_t)idx[i] * C + c];
        out[v] = scale ? __fmul_rn(scale[i], x) : x;
    }
}

__global__ void rows_dot_kernel(float *out, const float *a, const int *idx, const float *b,
                                size_t n, int C)
{
    GRID_STRIDE(i, n)
    {
        const float *x = a + (size_t)idx[i] * C, *y = b + i * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++)
            sum += (double)x[c] * y[c];
        out[i] = (float)sum;
    }
}

extern "C" void loom_cuda_rows_gather(float *out, const float *inp, const int *idx,
                                      const float *scale, size_t n, int C)
{
    if (n == 0 || C <= 0)
        return;
    LOOM_CUDA_LAUNCH("rows_gather", rows_gather_kernel, loom_cuda_blocks(n * (size_t)C),
                     LOOM_CUDA_THREADS, 0, out, inp, idx, scale, n, C);
}

extern "C" void loom_cuda_rows_scatter_add(float *out, const float *inp, const int *idx,
                                           const float *scale, size_t n, int C)
{
    if (n == 0 || C <= 0)
        return;
    loom_cuda_scatter_add_rows(out, inp, idx, 0, INT_MAX, scale, n, C);
}

extern "C" void loom_cuda_rows_dot(float *out, const float *a, const int *idx, const float *b,
                                   size_t n, int C)
{
    if (n == 0)
        return;
    LOOM_CUDA_LAUNCH("rows_dot", rows_dot_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS, 0,
                     out, a, idx, b, n, C);
}
