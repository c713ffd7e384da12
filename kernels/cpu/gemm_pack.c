/* gemm_pack.c — the full-sliver cases of gemm_pack.h's packing, vectorised, one copy per
 * ISA (LOOM_CPU_VARIANTS).
 *
 * A sliver whose lanes are X's columns is a copy of rows: pack_rows moves each as 8-float
 * vectors times scale (the scalar loop's products); W a multiple of 8, or 6.
 *
 * A full sliver packed from a row-major X whose rows are the sliver's lanes (op(A) with A
 * not transposed; op(B) with B transposed: the layer forward's weights) is a transpose:
 * dst[p*W + r] = scale * X[(r0 + r)*ld + c0 + p]. Written element by element it was 8-25%
 * of a canonical tiny step (one 4-byte store every 32-128 bytes). Here it runs in 8x8
 * blocks: 8 rows' next 8 values loaded as vectors, transposed in registers, stored as 8
 * runs of the sliver. Every value is the same single product scale * x, so the packs —
 * and every GEMM bit — are those of the scalar loop.
 *
 * W is a tile width or height: a multiple of 8 (the AVX-512 tile's 8 rows and its 32,
 * AVX2's 16 and SSE2's 8 columns) or 6 (the AVX2 and SSE2 tiles' rows; the block is then
 * transposed with two dummy rows and its lanes 6 and 7 are not kept).
 */
#include "cpu_common.h"
#include "gemm_pack.h"

#include <string.h>

typedef float v4 __attribute__((vector_size(16)));
typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

/* Lanes of a and b (0-7: a's, 8-15: b's), in GCC's and clang's spellings. */
#if defined(__clang__)
#define SHUF8(a, b, i0, i1, i2, i3, i4, i5, i6, i7)                                          \
    __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
#define SHUF8(a, b, i0, i1, i2, i3, i4, i5, i6, i7)                                          \
    __builtin_shuffle(a, b, (v8i){i0, i1, i2, i3, i4, i5, i6, i7})
#endif

/* The 8x8 block in[r][q] -> out[q][r] (unpack pairs, then quads, then halves). */
LOOM_CPU_BODY transpose8_body(v8 *out, const v8 *in)
{
    v8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = SHUF8(in[i], in[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = SHUF8(in[i], in[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = SHUF8(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);         /* columns 0, 4 */
        u[i + 1] = SHUF8(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);   /* 1, 5 */
        u[i + 2] = SHUF8(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13); /* 2, 6 */
        u[i + 3] = SHUF8(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15); /* 3, 7 */
    }
    for (int q = 0; q < 4; q++) {
        out[q] = SHUF8(u[q], u[q + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        out[q + 4] = SHUF8(u[q], u[q + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

LOOM_CPU_BODY pack_transpose_body(float *restrict dst, const float *X, int ld, int r0, int c0,
                                  int kc, int W, float scale)
{
    for (int g = 0; g < W; g += 8) {
        const int rows = W - g < 8 ? W - g : 8; /* 8, or 6 */
        const float *src[8];
        for (int r = 0; r < 8; r++)
            src[r] = X + (size_t)(r0 + g + (r < rows ? r : 0)) * ld + c0;
        int p = 0;
        for (; p + 8 <= kc; p += 8) {
            v8 in[8], out[8];
            for (int r = 0; r < 8; r++)
                memcpy(&in[r], src[r] + p, sizeof(v8));
            transpose8_body(out, in);
            for (int q = 0; q < 8; q++)
                out[q] = scale * out[q];
            if (rows == 8) {
                for (int q = 0; q < 8; q++)
                    memcpy(dst + (size_t)(p + q) * W + g, &out[q], sizeof(v8));
            } else { /* W == 6: each run's 2 extra lanes land where the next run is stored
                      * after it; the last run is stored lane by lane */
                for (int q = 0; q < 7; q++)
                    memcpy(dst + (size_t)(p + q) * W, &out[q], sizeof(v8));
                for (int r = 0; r < 6; r++)
                    dst[(size_t)(p + 7) * W + r] = out[7][r];
            }
        }
        for (; p < kc; p++)
            for (int r = 0; r < rows; r++)
                dst[(size_t)p * W + g + r] = scale * src[r][p];
    }
}
LOOM_CPU_VARIANTS(pack_transpose,
                  (float *restrict dst, const float *X, int ld, int r0, int c0, int kc, int W,
                   float scale),
                  (dst, X, ld, r0, c0, kc, W, scale))

void loom_cpu_pack_transpose(float *restrict dst, const float *X, int ld, int r0, int c0, int kc,
                             int W, float scale)
{
    pack_transpose(dst, X, ld, r0, c0, kc, W, scale);
}

LOOM_CPU_BODY pack_rows_body(float *restrict dst, const float *X, int ld, int r0, int c0, int kc,
                             int W, float scale)
{
    if (W == 6) { /* the AVX2 and SSE2 tiles' rows: 4 + 2 (8 would read past X's end) */
        for (int p = 0; p < kc; p++) {
            const float *src = X + (size_t)(c0 + p) * ld + r0;
            v4 x;
            memcpy(&x, src, sizeof x);
            x = scale * x;
            memcpy(dst + (size_t)p * 6, &x, sizeof x);
            dst[(size_t)p * 6 + 4] = scale * src[4];
            dst[(size_t)p * 6 + 5] = scale * src[5];
        }
        return;
    }
    for (int p = 0; p < kc; p++) {
        const float *src = X + (size_t)(c0 + p) * ld + r0;
        for (int r = 0; r < W; r += 8) {
            v8 x;
            memcpy(&x, src + r, sizeof x);
            x = scale * x;
            memcpy(dst + (size_t)p * W + r, &x, sizeof x);
        }
    }
}
LOOM_CPU_VARIANTS(pack_rows,
                  (float *restrict dst, const float *X, int ld, int r0, int c0, int kc, int W,
                   float scale),
                  (dst, X, ld, r0, c0, kc, W, scale))

void loom_cpu_pack_rows(float *restrict dst, const float *X, int ld, int r0, int c0, int kc,
                        int W, float scale)
{
    pack_rows(dst, X, ld, r0, c0, kc, W, scale);
}
