/* attention_decode.c — one new query row of causal self-attention over the rows already
 * computed: generation with a key/value cache (gpt_decode.c).
 *
 * qkv (t+1, C+2KC) holds rows 0..t of a sequence (attention.c's layout: q, k, v side by
 * side; plain multi-head attention has KC = C, grouped-query attention KC = KVH hs and q
 * head h reads kv head h / (NH/KVH)). For query row t and each head:
 *   preatt[j] = q_t . k_j / sqrt(hs) for j <= t,  att = softmax(preatt),
 *   out[h*hs:(h+1)*hs] = sum_j att[j] v_j.
 * att row of head h at att + h * att_stride (t+1 floats), out (C).
 *
 * Invariant (what the cache's bitwise test, tests/unit/test_kv_cache.c, checks): the bits
 * are those attention.c's attention forward gives row t of a (1, t+1) sequence —
 * the same products (loom_cpu_sgemm_fallback, whose element bits depend only on K and the
 * data, with the same alpha, K = hs for the scores and K = t+1 for att V, t+1 being the end
 * of the row's causal block there; attention.c uses it in canonical and row-stable mode,
 * which generation runs in), and the same row softmax (attention.c's, called).
 * Not parallel over heads below LOOM_CPU_PAR_MIN (one token's work is small).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <math.h>

void loom_cpu_attention_gqa_decode(float *out, float *att, size_t att_stride, const float *qkv,
                                   int t, int C, int NH, int KVH)
{
    /* out (C), att (NH rows of t+1 at att_stride), qkv (t+1, C+2KC) */
    const int hs = C / NH, KC = KVH * hs, W = C + 2 * KC, group = NH / KVH, n = t + 1;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t work = (size_t)NH * n * hs;
#pragma omp parallel for schedule(static) if (work > LOOM_CPU_PAR_MIN)
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + (size_t)t * W + h * hs;
        const float *k = qkv + C + (h / group) * hs, *v = k + KC;
        float *a = att + (size_t)h * att_stride;
        loom_cpu_sgemm_fallback(0, 1, 1, n, hs, scale, q, W, k, W, 0.0f, a, n);
        loom_cpu_causal_softmax_row(a, t, n); /* attention.c's, with T = t+1 */
        loom_cpu_sgemm_fallback(0, 0, 1, hs, n, 1.0f, a, n, v, W, 0.0f, out + h * hs, C);
    }
}

void loom_cpu_attention_decode(float *out, float *att, size_t att_stride, const float *qkv, int t,
                               int C, int NH)
{
    loom_cpu_attention_gqa_decode(out, att, att_stride, qkv, t, C, NH, NH);
}
