/* widen16.cuh — the 16-bit element conversions of the CUDA backend (kernels/cpu/convert.c's
 * integer arithmetic, bit for bit: convert.cu's comment has the rules), and loom_widen, the
 * load a kernel templated on its element type uses: float as is, bf16 and fp16 widened
 * (exact). loom_bf16 / loom_f16 wrap the 16 bits so that the two types overload apart.
 */
#ifndef LOOM_CUDA_WIDEN16_CUH
#define LOOM_CUDA_WIDEN16_CUH

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

struct loom_bf16 {
    uint16_t bits;
};
struct loom_f16 {
    uint16_t bits;
};

__device__ inline float loom_widen(float x)
{
    return x;
}
__device__ inline float loom_widen(loom_bf16 x)
{
    return bf16_to_f32(x.bits);
}
__device__ inline float loom_widen(loom_f16 x)
{
    return f16_to_f32(x.bits);
}

#endif
