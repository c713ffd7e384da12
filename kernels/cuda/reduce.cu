/* reduce.cu — sum_squares and has_nonfinite, whose answers the host needs at once (both
 * synchronize the compute stream).
 *
 * sum_squares follows kernels/cpu/reduce.c's order exactly: each row cut into units of
 * SQ_UNIT values, each unit summed in double over eight lanes (element j in lane j % 8)
 * then its tail; the units, in row order, cut into RED_CHUNKS pieces by index, each piece
 * summed in order, the pieces added in order on the host. One thread per unit, then one per
 * piece. So the result depends on the values and (rows, cols) alone — as the gradient norm's
 * canonical claim needs — and agrees with the CPU's to rounding of the FMA contraction.
 */
#include "kernels.cuh"

enum { RED_CHUNKS = 64, SQ_UNIT = 512 };

__global__ void unit_squares_kernel(double *parts, const float *x, size_t units, size_t per_row,
                                    size_t cols, size_t stride)
{
    for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units;
         u += (size_t)gridDim.x * blockDim.x) {
        const size_t r = u / per_row, p = (u % per_row) * SQ_UNIT;
        const size_t n = cols - p < SQ_UNIT ? cols - p : SQ_UNIT;
        const float *v = x + r * stride + p;
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        size_t j = 0;
        for (; j + 8 <= n; j += 8)
#pragma unroll
            for (int l = 0; l < 8; l++)
                lane[l] += (double)v[j + l] * v[j + l];
        double s = 0.0;
#pragma unroll
        for (int l = 0; l < 8; l++)
            s += lane[l];
        for (; j < n; j++)
            s += (double)v[j] * v[j];
        parts[u] = s;
    }
}

__global__ void chunk_sums_kernel(double *chunks, const double *parts, size_t units)
{
    const int c = threadIdx.x;
    if (c >= RED_CHUNKS)
        return;
    const size_t u0 = units * c / RED_CHUNKS, u1 = units * (c + 1) / RED_CHUNKS;
    double s = 0.0;
    for (size_t u = u0; u < u1; u++)
        s += parts[u];
    chunks[c] = s;
}

__global__ void nonfinite_kernel(int *flag, const float *x, size_t n)
{
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        *flag = 1; /* every writer writes 1: no atomic needed */
}

extern "C" double loom_cuda_sum_squares(const float *x, size_t rows, size_t cols, size_t stride)
{
    const size_t per_row = (cols + SQ_UNIT - 1) / SQ_UNIT, units = rows * per_row;
    if (units == 0)
        return 0.0;
    double *parts = (double *)loom_cuda_workspace((units + RED_CHUNKS) * sizeof(double));
    if (!parts)
        return NAN; /* the sticky error says why; NAN stops the step */
    double *chunks = parts + units;
    LOOM_CUDA_LAUNCH("sum_squares (units)", unit_squares_kernel, loom_cuda_blocks(units),
                     LOOM_CUDA_THREADS, 0, parts, x, units, per_row, cols, stride);
    LOOM_CUDA_LAUNCH("sum_squares (pieces)", chunk_sums_kernel, 1, RED_CHUNKS, 0, chunks, parts,
                     units);
    cudaMemcpyAsync(loom_cuda.h_parts, chunks, RED_CHUNKS * sizeof(double),
                    cudaMemcpyDeviceToHost, loom_cuda.stream);
    if (cudaStreamSynchronize(loom_cuda.stream) != cudaSuccess) {
        loom_cuda_check_launch("sum_squares (synchronize)");
        return NAN;
    }
    double total = 0.0;
    for (int c = 0; c < RED_CHUNKS; c++)
        total += loom_cuda.h_parts[c];
    return total;
}

extern "C" int loom_cuda_has_nonfinite(const float *x, size_t n)
{
    if (n == 0)
        return 0;
    cudaMemsetAsync(loom_cuda.d_flag, 0, sizeof(int), loom_cuda.stream);
    LOOM_CUDA_LAUNCH("has_nonfinite", nonfinite_kernel, loom_cuda_blocks(n) > 4096 ? 4096 : loom_cuda_blocks(n),
                     LOOM_CUDA_THREADS, 0, loom_cuda.d_flag, x, n);
    cudaMemcpyAsync(loom_cuda.h_flag, loom_cuda.d_flag, sizeof(int), cudaMemcpyDeviceToHost,
                    loom_cuda.stream);
    if (cudaStreamSynchronize(loom_cuda.stream) != cudaSuccess) {
        loom_cuda_check_launch("has_nonfinite (synchronize)");
        return 1; /* a failed check must not pass as finite */
    }
    return *loom_cuda.h_flag != 0;
}
