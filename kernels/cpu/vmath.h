/* vmath.h — small math helpers the CPU kernels share, written so GCC vectorises loops that
 * call them (glibc's expf is a call, and its vector variants need -ffast-math).
 *
 * loom_cpu_expf: e^x for float, Cephes' expf (Moshier): x = n ln2 + r with |r| <= ln2/2,
 * e^r by a degree-6 polynomial, 2^n by writing the exponent bits. Relative error about
 * 2 ulp over the whole range; e^x underflows to exactly 0 below -87.3 (the smallest
 * normal), is +inf above 88.7, NaN stays NaN. No calls, no float->int conversions, no
 * branches the vectoriser cannot turn into blends.
 */
#ifndef LOOM_CPU_VMATH_H
#define LOOM_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LOOM_CPU_EXP_LO (-87.33654f) /* log(FLT_MIN): below it, returns 0 */
#define LOOM_CPU_EXP_HI 88.72283f    /* log(FLT_MAX): above it, returns +inf */

static inline float loom_cpu_expf(float x)
{
    const float xc = x < LOOM_CPU_EXP_LO ? LOOM_CPU_EXP_LO : x > LOOM_CPU_EXP_HI ? LOOM_CPU_EXP_HI : x;
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

#endif
