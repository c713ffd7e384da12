/* gemm_kernel.h — gemm.c's micro-kernel, written once and included once per ISA (a
 * template: no include guard). Before including, gemm.c defines
 *   UK_NAME   the function's name          UK_TARGET  its target attribute (or nothing)
 *   UK_V      a vector of UK_VL floats     UK_VU      the same, aligned(4), for C
 *   UK_MR     tile rows                    UK_NV      vectors per tile row (NR = UK_NV UK_VL)
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
UK_TARGET static void UK_NAME(int kc, const float *restrict a, const float *restrict b,
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
            const float x = a[p * UK_MR + i];
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

#undef UK_NAME
#undef UK_TARGET
#undef UK_V
#undef UK_VU
#undef UK_VL
#undef UK_MR
#undef UK_NV
