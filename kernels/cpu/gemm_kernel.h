/* gemm_kernel.h — gemm.c's micro-kernel, written once and included once per ISA (a
 * template: no include guard). Before including, gemm.c defines
 *   UK_NAME   the function's name          UK_TARGET  its target attribute (or nothing)
 *   UK_V      a vector of UK_VL floats     UK_VU      the same, aligned(4), for C
 *   UK_MR     tile rows                    UK_NV      vectors per tile row (NR = UK_NV UK_VL)
 *   UK_BODY   the shared loop's name       UK_DIRECT  the in-place-A kernel's name
 * and it #undefs them after. The tile is sized to the ISA's vector registers: UK_MR x UK_NV
 * accumulators + UK_NV B vectors + one broadcast must fit, or GCC keeps the accumulators
 * on the stack (AVX-512: 8x2 of 32 zmm; AVX2 and SSE2: 6x2 of 16 ymm/xmm).
 *
 * C (m x n valid part of a UK_MR x NR tile, leading dim ldc) += A sliver (kc x UK_MR,
 * packed k-major) @ B sliver (kc x NR, packed k-major); with store set, = instead of +=
 * (the first K-slice of a beta-0 product: C is never read, so it needs no zeroing pass and
 * NaNs in it do not leak). Each C element is acc = +0, then acc += a_ip * b_pj for p in
 * order (one FMA where the ISA has it), then stored or added to C once: gemm.c's
 * "Order of operations", whatever the tile shape.
 */
UK_TARGET static inline __attribute__((always_inline)) void
UK_BODY(int kc, const float *restrict a, int sap, int sar, const float *restrict b,
        float *restrict c, int ldc, int m, int n, int store)
{
    enum { NR_ = UK_NV * UK_VL };
    UK_V acc[UK_MR][UK_NV];
#pragma GCC unroll 8
    for (int i = 0; i < UK_MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < UK_NV; v++)
            acc[i][v] = (UK_V){0};
    for (int p = 0; p < kc; p++) {
        UK_V bv[UK_NV];
#pragma GCC unroll 2
        for (int v = 0; v < UK_NV; v++)
            bv[v] = *(const UK_V *)(b + (size_t)p * NR_ + v * UK_VL);
#pragma GCC unroll 8
        for (int i = 0; i < UK_MR; i++) {
            /* a scalar times a vector broadcasts it (not (V){0} + x: adding 0 is an add to
             * keep, since -0 + 0 = +0) */
            const float x = a[(size_t)p * sap + (size_t)i * sar];
#pragma GCC unroll 2
            for (int v = 0; v < UK_NV; v++)
                acc[i][v] += x * bv[v];
        }
    }
    if (m == UK_MR && n == NR_ && store) {
#pragma GCC unroll 8
        for (int i = 0; i < UK_MR; i++)
#pragma GCC unroll 2
            for (int v = 0; v < UK_NV; v++)
                *(UK_VU *)(c + (size_t)i * ldc + v * UK_VL) = acc[i][v];
    } else if (m == UK_MR && n == NR_) {
#pragma GCC unroll 8
        for (int i = 0; i < UK_MR; i++)
#pragma GCC unroll 2
            for (int v = 0; v < UK_NV; v++)
                *(UK_VU *)(c + (size_t)i * ldc + v * UK_VL) += acc[i][v];
    } else {
        /* an edge tile: through a buffer, so that acc is never indexed by a variable (which
         * would keep it in memory for the whole loop above) */
        float t[UK_MR][NR_] __attribute__((aligned(64)));
#pragma GCC unroll 8
        for (int i = 0; i < UK_MR; i++)
#pragma GCC unroll 2
            for (int v = 0; v < UK_NV; v++)
                *(UK_V *)&t[i][v * UK_VL] = acc[i][v];
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * ldc + j] = store ? t[i][j] : c[(size_t)i * ldc + j] + t[i][j];
    }
}

/* The packed sliver (a[p UK_MR + i]): the strides are constants, so this is the loop it
 * always was. */
UK_TARGET static void UK_NAME(int kc, const float *restrict a, const float *restrict b,
                              float *restrict c, int ldc, int m, int n, int store)
{
    UK_BODY(kc, a, UK_MR, 1, b, c, ldc, m, n, store);
}

/* A read in place: x_ip = a[p sap + i sar] (op(A) row-major: sap 1, sar lda; transposed:
 * sap lda, sar 1), all UK_MR rows valid (m = UK_MR). The same x values in the same order as
 * the packed sliver alpha = 1 would hold (1 * x is x), so the same bits, without the copy. */
UK_TARGET static void UK_DIRECT(int kc, const float *restrict a, int sap, int sar,
                                const float *restrict b, float *restrict c, int ldc, int n,
                                int store)
{
    UK_BODY(kc, a, sap, sar, b, c, ldc, UK_MR, n, store);
}

#undef UK_NAME
#undef UK_BODY
#undef UK_DIRECT
#undef UK_TARGET
#undef UK_V
#undef UK_VU
#undef UK_VL
#undef UK_MR
#undef UK_NV
