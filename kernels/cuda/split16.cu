/* split16.cu — an fp32 array as two bf16 arrays, hi = bf16(x) and lo = bf16(x - hi), for the
 * bf16 backward products (gemm.c's loom_cuda_matmul_backward_dt): a gradient keeps fp32
 * accuracy as hi b + lo b, each product of two bf16 values exact in fp32 (kernels/cpu/
 * gemm_bf16.c's header: |x - hi - lo| <= 2^-18 |x|). x - hi is exact in fp32 (hi is x
 * rounded to 8 significant bits; the subtraction keeps denormals: nvcc's -ftz=false), and
 * the roundings are widen16.cuh's, the CPU's convert.c bit for bit. Where hi is not finite
 * lo is 0, so inf stays inf and NaN stays NaN (not inf - inf); a finite x that would round
 * up past bf16's largest finite value (|x| >= 2^128 (1 - 2^-9)) keeps hi truncated toward
 * zero instead, so it stays finite and lo holds the rest.
 */
#include "kernels.cuh"
#include "widen16.cuh"

/* not finite: an all-ones exponent (inf, NaN) */
__device__ inline int split_nonfinite(uint32_t u)
{
    return (u & 0x7f800000u) == 0x7f800000u;
}

/* hi, lo (rows, cols) packed from x's rows of ldx floats (cols of them read each) */
__global__ void split_bf16_kernel(uint16_t *hi, uint16_t *lo, const float *x, size_t n,
                                  size_t cols, size_t ldx)
{
    GRID_STRIDE(i, n)
    {
        const float v = cols == ldx ? x[i] : x[i / cols * ldx + i % cols];
        const uint32_t u = __float_as_uint(v);
        uint16_t h = bf16_from_f32(v);
        if (split_nonfinite((uint32_t)h << 16) && !split_nonfinite(u))
            h = (uint16_t)(u >> 16); /* rounded up to inf: toward zero instead, finite */
        hi[i] = h;
        lo[i] = split_nonfinite((uint32_t)h << 16) ? (uint16_t)0
                                              : bf16_from_f32(__fsub_rn(v, bf16_to_f32(h)));
    }
}

extern "C" void loom_cuda_split_bf16(void *hi, void *lo, const float *x, size_t n)
{
    if (n)
        LOOM_CUDA_LAUNCH("split_bf16", split_bf16_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS,
                         0, (uint16_t *)hi, (uint16_t *)lo, x, n, n, n);
}

/* A column block: x's rows of ldx floats, cols of each from x on, into packed (rows, cols)
 * hi and lo (gemm.c: the weight gradient's chunks of dout's columns). */
extern "C" void loom_cuda_split_bf16_cols(void *hi, void *lo, const float *x, size_t rows,
                                          size_t cols, size_t ldx)
{
    const size_t n = rows * cols;
    if (n)
        LOOM_CUDA_LAUNCH("split_bf16 (columns)", split_bf16_kernel, loom_cuda_blocks(n),
                         LOOM_CUDA_THREADS, 0, (uint16_t *)hi, (uint16_t *)lo, x, n, cols, ldx);
}
