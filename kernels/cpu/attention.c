/* attention.c — causal multi-head self-attention (Vaswani et al. 2017, GPT-2's masked form).
 *
 * qkv (B,T,3C) holds q, k, v side by side: for token (b,t), q = qkv[b,t,0:C],
 * k = qkv[b,t,C:2C], v = qkv[b,t,2C:3C]; head h owns columns h*hs .. (h+1)*hs of each
 * third (hs = C/NH). Per (b,h), with Q, K, V the (T,hs) slices:
 *   preatt = Q K^T / sqrt(hs),  att[t,:] = softmax over t2 <= t (t2 > t masked: att = 0),
 *   out[b,:,h*hs:(h+1)*hs] = att V.
 * att (B,NH,T,T) keeps the probabilities (upper triangle exactly zero) for backward.
 *
 * Backward: dqkv OVERWRITTEN (no parameters). With dout's (T,hs) slice dO:
 *   dV = att^T dO,  datt = dO V^T,
 *   dpreatt[t,t2] = att[t,t2] (datt[t,t2] - sum_t3 att[t,t3] datt[t,t3])  (softmax backward),
 *   dQ = dpreatt K / sqrt(hs),  dK = dpreatt^T Q / sqrt(hs).
 * scratch (2*B*NH*T*T floats) holds datt and dpreatt. Probabilities and dpreatt below
 * FLT_MIN are flushed to 0 (cpu_common.h says why).
 *
 * The products are GEMMs on strided slices of qkv (leading dimension 3C), run per (b,h)
 * inside an OpenMP loop over (b,h) with loom_cpu_sgemm, each on the calling thread alone
 * (inside a parallel region both OpenBLAS and loom's own GEMM stay on one thread): in fast
 * mode OpenBLAS (1.2-1.6x faster per head than loom's own GEMM on the 2-core EPYC, AVX2;
 * docs/BENCHMARKS.md), in canonical mode loom's own GEMM, whose fixed order makes a head's
 * bits independent of which other heads share the call. Causality is exploited in row
 * blocks of ATT_RB queries: block [r0,r1) only meets keys [0,r1), so about 5/8 of the full
 * T x T work is done at T = 256 instead of all of it. Inside a block, entries above the
 * diagonal are computed and then masked. Different (b,h) write disjoint columns of out and
 * dqkv.
 *
 * Grouped-query attention (Ainslie et al. 2023; Llama 2/3, Qwen): the _gqa entry points take
 * KVH key/value heads (KVH divides NH); qkv rows are then C + 2 KC wide, KC = KVH hs: q (C),
 * k (KC), v (KC), and q head h reads kv head h / (NH/KVH). Backward runs one work item per
 * (b, kv head), its group's q heads in order adding into the shared dK, dV. With KVH = NH
 * the calls are exactly the multi-head ones: the GPT-2 entry points are these with KVH = NH
 * (the same GEMM calls on the same operands in the same order, so the same bits as before).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <math.h>
#include <string.h>

enum { ATT_RB = 64 }; /* query rows per causal block */

/* Row t of a (T,T) block: softmax of row[0..t], zeros after. */
LOOM_CPU_BODY causal_softmax_row_body(float *row, int t, int T)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j <= t; j++)
        m = row[j] > m ? row[j] : m;
    /* the exponentials vectorised, their sum in order: before -fno-trapping-math the fused
     * loop stayed scalar on AVX2 and SSE2, so this keeps its bits there (a vectorised sum
     * would be a different one) */
#pragma omp simd
    for (int j = 0; j <= t; j++)
        row[j] = loom_cpu_expf(row[j] - m);
    float s = 0.0f;
    for (int j = 0; j <= t; j++)
        s += row[j];
    const float inv = 1.0f / s;
#pragma omp simd
    for (int j = 0; j <= t; j++)
        row[j] = loom_cpu_flush(row[j] * inv);
    memset(row + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
}
LOOM_CPU_VARIANTS(causal_softmax_row, (float *row, int t, int T), (row, t, T))

/* The same row softmax for attention_decode.c, so a decoded row has attention_forward's
 * bits by construction rather than by a copy kept in step. */
void loom_cpu_causal_softmax_row(float *row, int t, int T)
{
    causal_softmax_row(row, t, T);
}

/* dpre[j] = att[j] (datt[j] - sum_k att[k] datt[k]) over n columns (att is 0 above the
 * diagonal, so dpre is too). */
LOOM_CPU_BODY softmax_backward_row_body(float *dpre, const float *att, const float *datt, int n)
{
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < n; j++)
        dot += att[j] * datt[j];
#pragma omp simd
    for (int j = 0; j < n; j++)
        dpre[j] = loom_cpu_flush(att[j] * (datt[j] - dot));
}
LOOM_CPU_VARIANTS(softmax_backward_row, (float *dpre, const float *att, const float *datt, int n),
                  (dpre, att, datt, n))

void loom_cpu_attention_gqa_forward(float *out, float *att, const float *qkv, int B, int T,
                                    int C, int NH, int KVH)
{
    /* out (B,T,C), att (B,NH,T,T), qkv (B,T,C+2KC), KC = KVH*hs */
    const int hs = C / NH, KC = KVH * hs, W = C + 2 * KC, group = NH / KVH;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t work = (size_t)B * NH * T * T * hs;
#pragma omp parallel for schedule(dynamic, 1) if (work > LOOM_CPU_PAR_MIN)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * T * W + h * hs;
        const float *k = qkv + (size_t)b * T * W + C + (h / group) * hs, *v = k + KC;
        float *a = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * C + h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_RB) {
            const int r1 = r0 + ATT_RB < T ? r0 + ATT_RB : T, nr = r1 - r0;
            float *ab = a + (size_t)r0 * T;
            /* preatt[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T */
            loom_cpu_sgemm(0, 1, nr, r1, hs, scale, q + (size_t)r0 * W, W, k, W, 0.0f, ab, T);
            for (int t = r0; t < r1; t++)
                causal_softmax_row(a + (size_t)t * T, t, T);
            /* out[r0:r1] = att[r0:r1, 0:r1] V[0:r1] */
            loom_cpu_sgemm(0, 0, nr, hs, r1, 1.0f, ab, T, v, W, 0.0f, o + (size_t)r0 * C, C);
        }
    }
}

void loom_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH)
{
    loom_cpu_attention_gqa_forward(out, att, qkv, B, T, C, NH, NH);
}

/* The backward of attention_gqa_backward; datt_extra (B,NH,T,T; NULL: none) is a further
 * gradient of the probabilities, added to dO V^T before the softmax backward (distillation's
 * attention terms). NULL makes exactly the calls the plain backward always made. */
static void attention_backward_impl(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, const float *datt_extra,
                                    int B, int T, int C, int NH, int KVH)
{
    /* dqkv (B,T,C+2KC) =, scratch (2,B,NH,T,T), dout (B,T,C), qkv (B,T,C+2KC),
     * att (B,NH,T,T) */
    const int hs = C / NH, KC = KVH * hs, W = C + 2 * KC, group = NH / KVH;
    const float scale = 1.0f / sqrtf((float)hs);
    float *datt_all = scratch, *dpre_all = scratch + (size_t)B * NH * T * T;
    const size_t work = (size_t)B * NH * T * T * hs;
    /* One work item per (b, kv head): its q heads, in order, add into the shared dK, dV. */
#pragma omp parallel for schedule(dynamic, 1) if (work > LOOM_CPU_PAR_MIN)
    for (int bkv = 0; bkv < B * KVH; bkv++) {
        const int b = bkv / KVH, kvh = bkv % KVH;
        const float *k = qkv + (size_t)b * T * W + C + kvh * hs, *v = k + KC;
        float *dk = dqkv + (size_t)b * T * W + C + kvh * hs, *dv = dk + KC;
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            const int bh = b * NH + h;
            const float *q = qkv + (size_t)b * T * W + h * hs;
            float *dq = dqkv + (size_t)b * T * W + h * hs;
            const float *a = att + (size_t)bh * T * T;
            const float *dO = dout + (size_t)b * T * C + h * hs;
            float *datt = datt_all + (size_t)bh * T * T, *dpre = dpre_all + (size_t)bh * T * T;
            /* Last block first: for the group's first head it covers keys [0,T), so its dK,
             * dV products overwrite (beta 0) every row; everything after adds (beta 1). */
            const int nblk = (T + ATT_RB - 1) / ATT_RB;
            for (int blk = nblk - 1; blk >= 0; blk--) {
                const int r0 = blk * ATT_RB, r1 = r0 + ATT_RB < T ? r0 + ATT_RB : T, nr = r1 - r0;
                const float beta = blk == nblk - 1 && h == kvh * group ? 0.0f : 1.0f;
                const float *ab = a + (size_t)r0 * T;
                const float *dOb = dO + (size_t)r0 * C;
                float *db = datt + (size_t)r0 * T, *pb = dpre + (size_t)r0 * T;
                /* dV[0:r1] (+)= att[r0:r1, 0:r1]^T dO[r0:r1];  datt = dO[r0:r1] V[0:r1]^T */
                loom_cpu_sgemm(1, 0, r1, hs, nr, 1.0f, ab, T, dOb, C, beta, dv, W);
                loom_cpu_sgemm(0, 1, nr, r1, hs, 1.0f, dOb, C, v, W, 0.0f, db, T);
                if (datt_extra) {
                    const float *xb = datt_extra + (size_t)bh * T * T + (size_t)r0 * T;
                    for (int i = 0; i < nr; i++)
                        for (int j = 0; j < r1; j++)
                            db[(size_t)i * T + j] += xb[(size_t)i * T + j];
                }
                for (int i = 0; i < nr; i++)
                    softmax_backward_row(pb + (size_t)i * T, ab + (size_t)i * T,
                                         db + (size_t)i * T, r1);
                /* dQ[r0:r1] = scale dpre K[0:r1];  dK[0:r1] (+)= scale dpre^T Q[r0:r1] */
                loom_cpu_sgemm(0, 0, nr, hs, r1, scale, pb, T, k, W, 0.0f, dq + (size_t)r0 * W, W);
                loom_cpu_sgemm(1, 0, r1, hs, nr, scale, pb, T, q + (size_t)r0 * W, W, beta, dk, W);
            }
        }
    }
}

void loom_cpu_attention_gqa_backward(float *dqkv, float *scratch, const float *dout,
                                     const float *qkv, const float *att, int B, int T, int C,
                                     int NH, int KVH)
{
    attention_backward_impl(dqkv, scratch, dout, qkv, att, NULL, B, T, C, NH, KVH);
}

void loom_cpu_attention_backward_datt(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *att,
                                      const float *datt_extra, int B, int T, int C, int NH)
{
    attention_backward_impl(dqkv, scratch, dout, qkv, att, datt_extra, B, T, C, NH, NH);
}

void loom_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH)
{
    loom_cpu_attention_gqa_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH, NH);
}
