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

__device__ inline float bits_f32(uint32_t u)
{
    return __uint_as_float(u);
}

__device__ inline uint16_t bf16_from_f32(float f)
{
    uint32_t u = __float_as_uint(f);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    return (uint16_t)(nan ? quiet : rounded);
}

__device__ inline float bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

__device__ inline uint16_t f16_from_f32(float f)
{
    uint32_t u = __float_as_uint(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    float t = __fadd_rn(bits_f32(a), 0.5f);
    uint32_t sub = __float_as_uint(t) - 0x3f000000u;
    uint32_t norm = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t r = a > 0x7f800000u   ? nan
                 : a >= 0x477ff000u ? 0x7c00u
                 : a < 0x38800000u  ? sub
                                    : norm;
    return (uint16_t)(sign | r);
}

__device__ inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) /* inf; NaN made quiet, payload kept (F16C's vcvtph2ps, IEEE 754) */
        return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
    if (e == 0) /* m x 2^-24: exact in fp32 (m < 2^10) */
        return bits_f32(sign | __float_as_uint(__fmul_rn((float)m, 0x1p-24f)));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

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
