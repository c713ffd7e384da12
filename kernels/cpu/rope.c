/* rope.c — rotary position embeddings (Su et al. 2021), in Hugging Face Llama's
 * "rotate_half" layout: within each head of hs values, element i pairs with i + hs/2
 * (i < hs/2), rotated by angle p * theta^(-2i/hs) at position p:
 *   x'[i]        = x[i] cos - x[i + hs/2] sin
 *   x'[i + hs/2] = x[i + hs/2] cos + x[i] sin
 * cos and sin (positions, hs/2) are the caller's cache (the model computes it once).
 * In place over `heads` heads at the start of each row of `stride` floats (the q and k
 * parts of a fused qkv row); row i of the call is at position (row0 + i) % T of its
 * (B,T) sequence, so a shard of rows gets its own positions.
 *
 * Backward: the transposed rotation (angle -p), in place on the gradient:
 *   d[i] = d'[i] cos + d'[i + hs/2] sin,  d[i + hs/2] = d'[i + hs/2] cos - d'[i] sin.
 * Rows are independent: the same bits for any thread count.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

LOOM_CPU_BODY rope_row_body(float *restrict x, const float *restrict c, const float *restrict s,
                            int heads, int hs, float sign)
{
    const int half = hs / 2;
    for (int h = 0; h < heads; h++) {
        float *a = x + (size_t)h * hs, *b = a + half;
        for (int i = 0; i < half; i++) {
            const float sn = sign * s[i], x0 = a[i], x1 = b[i];
            a[i] = x0 * c[i] - x1 * sn;
            b[i] = x1 * c[i] + x0 * sn;
        }
    }
}
LOOM_CPU_VARIANTS(rope_row,
                  (float *restrict x, const float *restrict c, const float *restrict s, int heads,
                   int hs, float sign),
                  (x, c, s, heads, hs, sign))

static void rope_rows(float *x, const float *cos, const float *sin, size_t row0, size_t rows,
                      int T, int stride, int heads, int hs, float sign)
{
    const size_t half = (size_t)hs / 2;
#pragma omp parallel for schedule(static) if (rows * heads * hs > LOOM_CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++) {
        const size_t p = (row0 + r) % (size_t)T;
        rope_row(x + r * stride, cos + p * half, sin + p * half, heads, hs, sign);
    }
}

void loom_cpu_rope_forward(float *x, const float *cos, const float *sin, size_t row0, size_t rows,
                           int T, int stride, int heads, int hs)
{
    rope_rows(x, cos, sin, row0, rows, T, stride, heads, hs, 1.0f);
}

void loom_cpu_rope_backward(float *dx, const float *cos, const float *sin, size_t row0,
                            size_t rows, int T, int stride, int heads, int hs)
{
    rope_rows(dx, cos, sin, row0, rows, T, stride, heads, hs, -1.0f);
}
