/* convert.c — fp32 <-> bf16 and fp32 <-> fp16, and rounding fp32 values in place to what a
 * 16-bit store would keep: the numerics of the bf16 and fp16 precision plugins.
 *
 * Rounding is to nearest, ties to even (IEEE 754's default, what CUDA's __float2bfloat16_rn
 * and __float2half_rn and x86's F16C with _MM_FROUND_TO_NEAREST_INT do). Exact on the edges:
 * a value past the largest finite one by half an ulp or more becomes inf (bf16: above
 * 0x1.fefp127 rounds to inf; fp16: 65520 and above), subnormals round to the subnormal grid
 * (fp16's 2^-24 steps; bf16 keeps fp32's exponent range, so fp32 subnormals round on
 * bf16's own grid), inf stays inf, and NaN stays NaN, made quiet, keeping its sign and the
 * top bits of its payload. Widening is exact, but for a signalling fp16 NaN, which comes out
 * quiet with its payload (IEEE 754's conversion, F16C's vcvtph2ps, kernels/cuda/convert.cu):
 * the portable loop and F16C give the same bits. bf16 widens by a shift, keeping every bit
 * (a signalling bf16 NaN stays signalling, as in CUDA and PyTorch).
 *
 * bf16 is fp32's top half: rounding adds 0x7fff plus the kept lowest bit and truncates
 * (a carry out of the mantissa moves the exponent, which is exactly overflow to inf).
 * fp16 from fp32 follows F. Giesen's float_to_half_fast3_rtne (public domain,
 * https://gist.github.com/rygorous/2156668): normals by re-biasing the exponent and the
 * same add-and-truncate rounding, subnormals by an fp32 add of 0.5 that lets the FPU's own
 * round-to-nearest-even place the bits. The loops are branch-free selects, so GCC
 * vectorises them; the fp16 ones use F16C (vcvtps2ph / vcvtph2ps, in x86-64-v3) in the
 * AVX2 and AVX-512 copies, which the test compares with the portable code bit for bit.
 *
 * Invariants: the same bits on every ISA and thread count; dst and src do not overlap,
 * except in round_*, where dst may be src (in place).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t loom_cpu_bf16_from_f32(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u; /* the top mantissa bit: a quiet NaN */
    return (uint16_t)(nan ? quiet : rounded);
}

float loom_cpu_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t loom_cpu_f16_from_f32(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    /* NaN: quiet, with the payload's top 10 bits (what F16C does) */
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    /* below 2^-14 (fp16's smallest normal): add 0.5f, whose ulp is 2^-24, fp16's
     * subnormal step; the FPU rounds (to nearest even) and the low bits are the result */
    float t = bits_f32(a) + 0.5f;
    uint32_t sub = f32_bits(t) - 0x3f000000u;
    /* normals: re-bias the exponent (127 - 15 = 112) and round to 10 mantissa bits */
    uint32_t norm = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t r = a > 0x7f800000u   ? nan
                 : a >= 0x477ff000u ? 0x7c00u /* 65520 or more (and inf): inf */
                 : a < 0x38800000u  ? sub
                                    : norm;
    return (uint16_t)(sign | r);
}

float loom_cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) /* inf; NaN made quiet, payload kept (what F16C's vcvtph2ps does) */
        return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
    if (e == 0) { /* zero and subnormals: m x 2^-24, exact in fp32 */
        float v = (float)m * 0x1p-24f;
        return bits_f32(sign | f32_bits(v));
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* --- loops ----------------------------------------------------------------------------- */

LOOM_CPU_BODY bf16_from_body(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = loom_cpu_bf16_from_f32(src[i]);
}
LOOM_CPU_VARIANTS(bf16_from, (uint16_t *restrict dst, const float *restrict src, size_t n),
                  (dst, src, n))

LOOM_CPU_BODY bf16_round_body(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = loom_cpu_bf16_to_f32(loom_cpu_bf16_from_f32(src[i]));
}
LOOM_CPU_VARIANTS(bf16_round, (float *dst, const float *src, size_t n), (dst, src, n))

LOOM_CPU_BODY f16_from_portable_body(uint16_t *restrict dst, const float *restrict src,
                                     size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = loom_cpu_f16_from_f32(src[i]);
}

LOOM_CPU_BODY f16_round_portable_body(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = loom_cpu_f16_to_f32(loom_cpu_f16_from_f32(src[i]));
}

static void f16_to_portable(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = loom_cpu_f16_to_f32(src[i]);
}

#if defined(__x86_64__)
/* F16C: 8 at a time, the tail by the portable code (the same bits: the test checks). */
LOOM_CPU_TARGET_AVX2 static void f16_from_f16c(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    f16_from_portable_body(dst + i, src + i, n - i);
}

LOOM_CPU_TARGET_AVX2 static void f16_to_f16c(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    f16_to_portable(dst + i, src + i, n - i);
}

LOOM_CPU_TARGET_AVX2 static void f16_round_f16c(float *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    f16_round_portable_body(dst + i, src + i, n - i);
}
#define F16C_OK() (loom_cpu_isa() >= LOOM_CPU_ISA_AVX2)
#else
#define F16C_OK() 0
#define f16_from_f16c(d, s, n) f16_from_portable_body(d, s, n)
#define f16_to_f16c(d, s, n) f16_to_portable(d, s, n)
#define f16_round_f16c(d, s, n) f16_round_portable_body(d, s, n)
#endif

/* Chunks of 64K values per OpenMP iteration: memory-bound, split only when large. A call
 * of one chunk never enters OpenMP: an `if (0)` parallel region still costs a GOMP call
 * (and an allocation) each time, which a 16-bit head widened 64 values a row paid 50K
 * times a band (gpt_precision.c). */
#define CHUNK ((size_t)65536)
#define FOR_CHUNKS(n, body)                                                                \
    do {                                                                                   \
        size_t chunks_ = ((n) + CHUNK - 1) / CHUNK;                                        \
        if (chunks_ <= 1) {                                                                \
            size_t o = 0, k = (n);                                                         \
            body;                                                                          \
            break;                                                                         \
        }                                                                                  \
        _Pragma("omp parallel for schedule(static)")                                       \
        for (size_t c_ = 0; c_ < chunks_; c_++) {                                          \
            size_t o = c_ * CHUNK, k = (n) - o < CHUNK ? (n) - o : CHUNK;                  \
            body;                                                                          \
        }                                                                                  \
    } while (0)

void loom_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    FOR_CHUNKS(n, bf16_from(dst + o, src + o, k));
}

LOOM_CPU_BODY bf16_to_body(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) /* a shift: vectorises as written */
        dst[i] = loom_cpu_bf16_to_f32(src[i]);
}
LOOM_CPU_VARIANTS(bf16_to, (float *restrict dst, const uint16_t *restrict src, size_t n),
                  (dst, src, n))

void loom_cpu_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    FOR_CHUNKS(n, bf16_to(dst + o, src + o, k));
}

void loom_cpu_round_bf16(float *dst, const float *src, size_t n)
{
    FOR_CHUNKS(n, bf16_round(dst + o, src + o, k));
}

void loom_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    int f16c = F16C_OK();
    FOR_CHUNKS(n, f16c ? f16_from_f16c(dst + o, src + o, k)
                       : f16_from_portable_body(dst + o, src + o, k));
}

void loom_cpu_f16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    int f16c = F16C_OK();
    FOR_CHUNKS(n, f16c ? f16_to_f16c(dst + o, src + o, k) : f16_to_portable(dst + o, src + o, k));
}

void loom_cpu_round_f16(float *dst, const float *src, size_t n)
{
    int f16c = F16C_OK();
    FOR_CHUNKS(n, f16c ? f16_round_f16c(dst + o, src + o, k)
                       : f16_round_portable_body(dst + o, src + o, k));
}
