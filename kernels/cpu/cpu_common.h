/* cpu_common.h — what the CPU kernels share besides cpu_kernels.h: a vectorisable expf,
 * the per-ISA copies of hot loops, and the size below which a loop stays serial.
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
 * LOOM_CPU_VARIANTS(name, params, args) compiles a hot loop three times — AVX-512
 * (x86-64-v4), AVX2+FMA (x86-64-v3) and the baseline (SSE2) — from an always_inline
 * name##_body (LOOM_CPU_BODY), and defines `static void name params` that runs the copy
 * loom_cpu_isa() chose (isa.c: cpuid, or LOOM_CPU_ISA), so one distribution build is fast
 * on every machine and a lower ISA can be forced for testing. (GCC's target_clones would
 * pick by cpuid alone, in an ifunc resolver where the environment cannot be read.) Put it
 * on a static worker that the OpenMP loop calls, not on the OpenMP function itself. The
 * copies differ only in instruction selection: the kernels have no reassociation, and
 * -ffp-contract=fast fuses a*b+c where the ISA has FMA (not in the SSE2 copy), so results
 * may differ between the SSE2 copy and the others, never with the thread count. (The
 * "SSE2" copy, like gemm.c's SSE2 micro-kernel, is compiled for the build's own target:
 * SSE2 in a default x86-64 build; a build with -march=native would make it that CPU's.)
 * The kernels build with -fno-trapping-math (meson.build): without it GCC does not
 * if-convert loom_cpu_expf's selects, and every loop calling it stays scalar (on every ISA
 * but AVX-512, whose masked moves do not trap). It changes no result: only which
 * operations may be executed speculatively.
 */
#ifndef LOOM_CPU_COMMON_H
#define LOOM_CPU_COMMON_H

#include "cpu_kernels.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LOOM_CPU_PAR_MIN 32768

/* attention.c's causal row softmax (row[0..t] of a T-wide row, zeros after), shared with
 * attention_decode.c. */
void loom_cpu_causal_softmax_row(float *row, int t, int T);

#define LOOM_CPU_BODY static inline __attribute__((always_inline)) void

#if defined(__x86_64__)
#define LOOM_CPU_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define LOOM_CPU_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#define LOOM_CPU_VARIANTS(name, params, args)                                                \
    LOOM_CPU_TARGET_AVX512 static void name##_avx512 params { name##_body args; }            \
    LOOM_CPU_TARGET_AVX2 static void name##_avx2 params { name##_body args; }                \
    static void name##_sse2 params { name##_body args; }                                     \
    static void name params                                                                  \
    {                                                                                        \
        const int isa_ = loom_cpu_isa();                                                     \
        (isa_ == LOOM_CPU_ISA_AVX512 ? name##_avx512                                         \
         : isa_ == LOOM_CPU_ISA_AVX2 ? name##_avx2                                           \
                                     : name##_sse2) args;                                    \
    }
#else
#define LOOM_CPU_VARIANTS(name, params, args)                                                \
    static void name params { name##_body args; }
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
