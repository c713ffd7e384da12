/* shm_reduce.c — the element-wise reductions and the bf16/f16 conversions behind them.
 *
 * What: out[i] = in[0][i] op in[1][i] op ... op in[n-1][i], evaluated strictly left to
 * right in rank order for every element, so a result never depends on timing, chunking
 * or which rank computed it: bitwise reproducible and identical on every rank.
 * Dtype rules (the documented contract, tested in tests/comm):
 *   f32        sum and max in f32, in rank order; avg = (f32 sum) / n, one f32 division.
 *   bf16, f16  every input converted exactly to f32, summed in f32 in rank order, and the
 *              f32 result (for avg, sum / n in f32) rounded ONCE to bf16/f16,
 *              round-to-nearest-even; overflow gives inf, NaN stays NaN (quiet). max is
 *              exact (the max of the f32 images converted back).
 *   float max  NaN wins (once an element is NaN it stays NaN); among equal values, e.g.
 *              -0 and +0, the lowest rank's wins.
 *   i32        sum wraps modulo 2^32 (two's complement); avg = exact sum / n truncated
 *              toward zero; max.
 *   u8, u16    sum wraps modulo 2^8 / 2^16; avg = exact sum / n rounded down; max.
 * What not: no min/product (the interface has none); no SIMD intrinsics: plain loops over
 * blocks that the compiler vectorises without changing any element's order of additions
 * (no -ffast-math; c11 mode keeps FP contraction off, and there is no multiply to fuse).
 * Invariants: the work goes through BLK-element blocks accumulated in a local array, so
 * out may alias any input (the in-place reduce of allreduce writes over its own slot).
 */
#include <string.h>

#include "shm.h"

enum { BLK = 512 };

static inline float bits_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* NaN: keep sign and payload top, quiet */
    x += 0x7fffu + ((x >> 16) & 1u);            /* round to nearest, ties to even */
    return (uint16_t)(x >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520: rounds to inf (65504 is the largest f16) */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: an f16 subnormal (or zero), unit 2^-24 */
        uint32_t e = a >> 23;
        if (e < 102)       /* < 2^-25: rounds to zero */
            return (uint16_t)sign;
        uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 126 - e;
        uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
        q += rem > half || (rem == half && (q & 1u));
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u; /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

int shm_reduce_supported(loom_dtype dt, loom_reduce_op op)
{
    int known_dt = dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16 ||
                   dt == LOOM_DTYPE_I32 || dt == LOOM_DTYPE_U8 || dt == LOOM_DTYPE_U16;
    return known_dt && (op == LOOM_REDUCE_SUM || op == LOOM_REDUCE_AVG || op == LOOM_REDUCE_MAX);
}

/* ---- float types: f32 accumulators ---------------------------------------------------- */

static void load_f(loom_dtype dt, const void *src, size_t b, size_t m, float *dst)
{
    if (dt == LOOM_DTYPE_F32) {
        memcpy(dst, (const float *)src + b, m * sizeof(float));
    } else if (dt == LOOM_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src + b;
        for (size_t i = 0; i < m; i++)
            dst[i] = bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src + b;
        for (size_t i = 0; i < m; i++)
            dst[i] = f16_to_f32(s[i]);
    }
}

static void store_f(loom_dtype dt, const float *src, void *out, size_t b, size_t m)
{
    if (dt == LOOM_DTYPE_F32) {
        memcpy((float *)out + b, src, m * sizeof(float));
    } else if (dt == LOOM_DTYPE_BF16) {
        uint16_t *d = (uint16_t *)out + b;
        for (size_t i = 0; i < m; i++)
            d[i] = f32_to_bf16(src[i]);
    } else {
        uint16_t *d = (uint16_t *)out + b;
        for (size_t i = 0; i < m; i++)
            d[i] = f32_to_f16(src[i]);
    }
}

static void reduce_float(loom_dtype dt, loom_reduce_op op, int n, const void *const *in,
                         void *out, size_t b, size_t m)
{
    float acc[BLK], tmp[BLK];
    load_f(dt, in[0], b, m, acc);
    for (int r = 1; r < n; r++) {
        const float *x = tmp;
        if (dt == LOOM_DTYPE_F32)
            x = (const float *)in[r] + b;
        else
            load_f(dt, in[r], b, m, tmp);
        if (op == LOOM_REDUCE_MAX) {
            for (size_t i = 0; i < m; i++)
                acc[i] = (x[i] > acc[i] || x[i] != x[i]) ? x[i] : acc[i];
        } else {
            for (size_t i = 0; i < m; i++)
                acc[i] += x[i];
        }
    }
    if (op == LOOM_REDUCE_AVG) {
        const float dn = (float)n;
        for (size_t i = 0; i < m; i++)
            acc[i] /= dn;
    }
    store_f(dt, acc, out, b, m);
}

/* ---- integer types: exact 64-bit accumulators ---------------------------------------- */

static int64_t get_i(loom_dtype dt, const void *p, size_t i)
{
    if (dt == LOOM_DTYPE_I32)
        return ((const int32_t *)p)[i];
    if (dt == LOOM_DTYPE_U16)
        return ((const uint16_t *)p)[i];
    return ((const uint8_t *)p)[i];
}

static void reduce_int(loom_dtype dt, loom_reduce_op op, int n, const void *const *in,
                       void *out, size_t b, size_t m)
{
    int64_t acc[BLK];
    for (size_t i = 0; i < m; i++)
        acc[i] = get_i(dt, in[0], b + i);
    for (int r = 1; r < n; r++)
        for (size_t i = 0; i < m; i++) {
            int64_t x = get_i(dt, in[r], b + i);
            acc[i] = op == LOOM_REDUCE_MAX ? (x > acc[i] ? x : acc[i]) : acc[i] + x;
        }
    if (op == LOOM_REDUCE_AVG)
        for (size_t i = 0; i < m; i++)
            acc[i] /= n; /* C division truncates toward zero; u8/u16 sums are >= 0 */
    for (size_t i = 0; i < m; i++) {
        uint64_t u = (uint64_t)acc[i]; /* sums wrap: keep the low bits */
        if (dt == LOOM_DTYPE_I32) {
            uint32_t w = (uint32_t)u;
            memcpy((int32_t *)out + b + i, &w, sizeof w);
        } else if (dt == LOOM_DTYPE_U16) {
            ((uint16_t *)out)[b + i] = (uint16_t)u;
        } else {
            ((uint8_t *)out)[b + i] = (uint8_t)u;
        }
    }
}

void shm_reduce(loom_dtype dt, loom_reduce_op op, int n, const void *const *in, void *out,
                size_t count)
{
    int is_float = dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16;
    for (size_t b = 0; b < count; b += BLK) {
        size_t m = count - b < BLK ? count - b : BLK;
        if (is_float)
            reduce_float(dt, op, n, in, out, b, m);
        else
            reduce_int(dt, op, n, in, out, b, m);
    }
}
