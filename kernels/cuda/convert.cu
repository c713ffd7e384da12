/* convert.cu — fp32 <-> bf16 and fp16, and rounding fp32 in place to what a 16-bit store
 * keeps (backend.h: convert_from_f32, convert_to_f32, round_to), for the precision
 * plugins. The same integer arithmetic as kernels/cpu/convert.c, function for function
 * (see its comment: round to nearest even by add-and-truncate, overflow to inf, NaN made
 * quiet keeping sign and payload top bits, fp16 subnormals by an fp32 add of 0.5 that the
 * adder rounds), so the bits equal the CPU backend's on every input — CUDA's own
 * __float2bfloat16_rn differs on NaN payloads. Widening a signalling fp16 NaN quiets it,
 * as both of the CPU backend's paths (F16C and portable) and IEEE 754 do. The one float
 * operation is an explicitly rounded add (denormals are kept: nvcc's default -ftz=false).
 */
#include "kernels.cuh"
#include "widen16.cuh" /* the element conversions */


__global__ void from_f32_kernel(uint16_t *dst, const float *src, size_t n, int f16)
{
    GRID_STRIDE(i, n) dst[i] = f16 ? f16_from_f32(src[i]) : bf16_from_f32(src[i]);
}

__global__ void to_f32_kernel(float *dst, const uint16_t *src, size_t n, int f16)
{
    GRID_STRIDE(i, n) dst[i] = f16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
}

__global__ void round_kernel(float *dst, const float *src, size_t n, int f16)
{
    GRID_STRIDE(i, n) dst[i] = f16 ? f16_to_f32(f16_from_f32(src[i]))
                                   : bf16_to_f32(bf16_from_f32(src[i]));
}

extern "C" void loom_cuda_convert_from_f32(void *dst, const float *src, size_t n, loom_dtype dt)
{
    if (n)
        LOOM_CUDA_LAUNCH("convert_from_f32", from_f32_kernel, loom_cuda_blocks(n),
                         LOOM_CUDA_THREADS, 0, (uint16_t *)dst, src, n, dt == LOOM_DTYPE_F16);
}

extern "C" void loom_cuda_convert_to_f32(float *dst, const void *src, size_t n, loom_dtype dt)
{
    if (n)
        LOOM_CUDA_LAUNCH("convert_to_f32", to_f32_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS,
                         0, dst, (const uint16_t *)src, n, dt == LOOM_DTYPE_F16);
}

extern "C" void loom_cuda_round_to(float *dst, const float *src, size_t n, loom_dtype dt)
{
    if (n)
        LOOM_CUDA_LAUNCH("round_to", round_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS, 0,
                         dst, src, n, dt == LOOM_DTYPE_F16);
}
