/* cpu_common.h — what the CPU kernels share besides cpu_kernels.h: a vectorisable expf,
 * the ISA-cloning attribute for hot loops, and the size below which a loop stays serial.
 *
 * LOOM_CPU_PAR_MIN: a loop with less work than this many elements runs on one thread
 * (OpenMP's `if` clause). Starting a team and the barrier at its end cost microseconds
 * (and a full scheduler time slice when the cores are shared), which dwarfs the work of
 * a small layer: the tiny config's rows are 128 floats.
 *
 * loom_cpu_expf: e^x for float, Cephes' expf (Moshier): x = n ln2 + r with |r| <= ln2/2,
 * e^r by a degree-6 polynomial, 2^n by writing the exponent bits. Relative error below
 * 2 ulp; e^x is exactly 0 below -87.3 (log of the smallest normal), +inf above 88.7, NaN
 * stays NaN. No calls, no float->int conversions, only selects — so loops that call it
 * vectorise (glibc's expf is a call, and its vector variants need -ffast-math).
 *
 * loom_cpu_flush: x, or 0 where |x| is below FLT_MIN (a subnormal). Kernels whose outputs
 * can underflow (softmax probabilities and their gradients, GELU's far negative tail) pass
 * them through it: subnormal operands make x86 FMAs take microcode assists, and a GEMM
 * fed a matrix sprinkled with them ran 2x slower end to end. Values that small are zero
 * for training purposes; this is what the FTZ/DAZ modes of other frameworks do, kept
 * local to the kernels instead of changing the process's MXCSR.
 *
 * LOOM_CPU_CLONES compiles a hot loop three times — AVX-512 (x86-64-v4), AVX2+FMA
 * (x86-64-v3) and the baseline — and picks one when the library loads (GCC/Clang
 * target_clones, an ifunc), so a distribution build is fast on every machine. Put it on a
 * static worker that the OpenMP loop calls, not on the OpenMP function itself: the
 * outlined parallel body would not be cloned. (The baseline cannot vectorise expf's
 * selects at all; SSE2 has no blend.)
 */
#ifndef LOOM_CPU_COMMON_H
#define LOOM_CPU_COMMON_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LOOM_CPU_PAR_MIN 32768

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define LOOM_CPU_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef LOOM_CPU_CLONES
#define LOOM_CPU_CLONES
#endif

#define LOOM_CPU_EXP_LO (-87.33654f) /* log(FLT_MIN): below it, returns 0 */
#define LOOM_CPU_EXP_HI 88.72283f    /* log(FLT_MAX): above it, returns +inf */

static inline float loom_cpu_expf(float x)
{
    float xc = x < LOOM_CPU_EXP_LO ? LOOM_CPU_EXP_LO : x;
    xc = xc > LOOM_CPU_EXP_HI ? LOOM_CPU_EXP_HI : xc;
    /* n = round(x / ln2) with the 1.5*2^23 trick: adding it rounds to an integer and leaves
     * n in the low mantissa bits of t. */
    const float shifter = 12582912.0f;
    const float t = xc * 1.44269504088896341f + shifter;
    const float n = t - shifter;
    /* r = x - n ln2, with ln2 split in two so the product is exact (Cody-Waite). */
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    const float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    /* 2^n: the low bits of t hold n (mod 2^9 is enough), shifted into the exponent field.
     * n = 128 (x within 0.35 of the top) has no float 2^n: use 2 p 2^127 instead. */
    uint32_t tb, sb;
    memcpy(&tb, &t, sizeof tb);
    const int top = n > 127.5f;
    p = top ? p + p : p;
    tb = top ? tb - 1u : tb;
    sb = (tb << 23) + (127u << 23);
    float scale;
    memcpy(&scale, &sb, sizeof scale);
    float y = p * scale;
    y = x < LOOM_CPU_EXP_LO ? 0.0f : y;
    y = x > LOOM_CPU_EXP_HI ? INFINITY : y;
    return y;
}

static inline float loom_cpu_flush(float x)
{
    return fabsf(x) < FLT_MIN ? 0.0f : x;
}

#endif
