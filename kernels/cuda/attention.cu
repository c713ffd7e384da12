/* attention.cu — causal multi-head self-attention, the reference path: the products as
 * batched GEMMs over the heads of one sequence (loom_cuda_gemm_batched: cuBLAS, or the
 * ordered GEMM in canonical and row-stable modes) on strided slices of qkv (leading
 * dimension 3C, head stride hs), and the softmax and its backward as row kernels.
 * kernels/cpu/attention.c has the math and the layouts: att (B,NH,T,T) keeps the
 * probabilities with the upper triangle exactly 0; backward OVERWRITES dqkv, with scratch
 * holding datt and dpreatt (2*B*NH*T*T floats). The full T x T products are computed (the
 * causal half is masked, not skipped): simple, not fast; flash_attention.cu has the fused
 * kernels, tested against this path.
 *
 * attention_decode runs the same pieces on one row, so that under the row-stable mode (the
 * ordered GEMM, whose chains ignore the zeros past the diagonal) a decoded row has
 * attention_forward's bits: the same products, and the same softmax kernel over the same
 * t+1 values with the same thread mapping.
 *
 * With LOOM_CUDA_ATTENTION=flash, attention_forward/_backward run flash_attention.cu's fused
 * kernels instead, in fast mode (set_deterministic 0: canonical and row-stable modes keep
 * this path, whose bits they define) where att has room for what those save: each row's
 * log-sum-exp (B*NH*T floats) and a copy of out (B*T*C; backward's dO . O, from out before
 * the model rounds it), i.e. where NH*T >= NH + C (T > head size), with heads up to 128 wide
 * and B*NH up to 65535 (the fused kernels' limits); elsewhere this path. att
 * then holds that state, not probabilities: only attention_backward reads it (the model).
 * The memory of att itself is still (B,NH,T,T): the model sizes it. attention_dt.cu's
 * 16-bit entry points (backend.h attention_forward_dt) share this fused path
 * (loom_cuda_attention_flash_fwd/_bwd) on the tensor-core kernels.
 *
 * Grouped-query attention (the _gqa entry points, KVH key/value heads) runs the same batched
 * path, the q heads of a kv head as rep strided products (batched_forward's comment); its
 * 16-bit entry points (attention_dt.cu) take the tensor-core kernels' grouped-query form
 * where the fused path would run.
 */
#include "flash_attention_tc.h"
#include "kernels.cuh"

enum { SM_THREADS = 256 };

/* Row `row` of att: softmax of x[0..t], zeros in [t+1, len). t = the row's query index. */
__global__ void causal_softmax_kernel(float *att, size_t row_stride, int rows_per_head, int t_fixed,
                                      int len)
{
    float *x = att + (size_t)blockIdx.x * row_stride;
    const int t = t_fixed >= 0 ? t_fixed : (int)(blockIdx.x % rows_per_head);
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x)
        m = fmaxf(m, x[j]);
    m = loom_block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x)
        s += expf(x[j] - m);
    const float inv = 1.0f / loom_block_sum(s);
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        x[j] = j <= t ? loom_flush(expf(x[j] - m) * inv) : 0.0f;
}

/* dpre[j] = att[j] (datt[j] - sum_k att[k] datt[k]) over a row of T (0 past the diagonal,
 * where att is 0). */
__global__ void softmax_backward_kernel(float *dpre, const float *att, const float *datt, int T)
{
    const size_t o = (size_t)blockIdx.x * T;
    const int t = (int)(blockIdx.x % T);
    float dot = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x)
        dot += att[o + j] * datt[o + j];
    dot = loom_block_sum(dot);
    for (int j = threadIdx.x; j < T; j += blockDim.x)
        dpre[o + j] = j <= t ? loom_flush(att[o + j] * (datt[o + j] - dot)) : 0.0f;
}

/* The fused kernels take this call (see the opening comment): loom/plugin/cuda_attention.h's
 * rule, which loom plan's footprint sizes a flash run by (core/model/gpt_att.c); never while
 * the model has them turned off (attention_allow_fused(0): loom_cuda_attention_mode_now). */
static int flash_takes(int B, int T, int C, int NH)
{
    const loom_cuda_attention_mode mo = loom_cuda_attention_mode_now();
    return loom_cuda_attention_fused(&mo, B, T, C, NH);
}

int loom_cuda_attention_flash_takes(int B, int T, int C, int NH)
{
    return flash_takes(B, T, C, NH);
}

__global__ void copy_kernel(float *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n) dst[i] = src[i];
}

/* The batched path with KVH key/value heads (grouped-query attention, Ainslie et al. 2023;
 * KVH = NH is multi-head attention): qkv rows W = C + 2 KC wide, KC = KVH hs, q head h reads
 * kv head h / rep, rep = NH / KVH. The q heads sharing a kv head are h = g rep + r: one
 * batched product per r over the KVH groups (q, att and out strided by rep heads, k and v by
 * one), so with KVH = NH it is the one multi-head call per sequence. Backward adds the rep
 * contributions to the shared dK, dV (beta 1 after r = 0), in r order: fixed bits. */
static void batched_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH, int KVH)
{
    /* out (B,T,C), att (B,NH,T,T), qkv (B,T,W) */
    const int hs = C / NH, rep = NH / KVH, W = C + 2 * KVH * hs;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * W, *k = q + C;
        float *a = att + (size_t)b * NH * TT;
        /* preatt[h] = scale Q_h K_{h/rep}^T */
        for (int r = 0; r < rep; r++)
            loom_cuda_gemm_batched(0, 1, T, T, hs, scale, q + r * hs, W, (long long)rep * hs, k,
                                   W, hs, 0.0f, a + r * TT, T, rep * TT, KVH);
    }
    LOOM_CUDA_LAUNCH("attention_forward (softmax)", causal_softmax_kernel,
                     (unsigned)((size_t)B * NH * T), SM_THREADS, 0, att, (size_t)T, T, -1, T);
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * T * W + C + KVH * hs;
        const float *a = att + (size_t)b * NH * TT;
        /* out[b, :, h] = att[b,h] V_{h/rep} */
        for (int r = 0; r < rep; r++)
            loom_cuda_gemm_batched(0, 0, T, hs, T, 1.0f, a + r * TT, T, rep * TT, v, W, hs, 0.0f,
                                   out + (size_t)b * T * C + r * hs, C, (long long)rep * hs, KVH);
    }
}

static void batched_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, const float *datt_extra, int B, int T, int C,
                             int NH, int KVH)
{
    /* dqkv (B,T,W) =, scratch (2,B,NH,T,T), dout (B,T,C), qkv (B,T,W), att (B,NH,T,T) */
    const int hs = C / NH, rep = NH / KVH, KC = KVH * hs, W = C + 2 * KC;
    const long long TT = (long long)T * T, sh = (long long)rep * hs, st = rep * TT;
    const float scale = 1.0f / sqrtf((float)hs);
    float *datt = scratch, *dpre = scratch + (size_t)B * NH * TT;
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t)b * T * W + C + KC, *dO = dout + (size_t)b * T * C;
        const float *a = att + (size_t)b * NH * TT;
        float *dv = dqkv + (size_t)b * T * W + C + KC, *da = datt + (size_t)b * NH * TT;
        for (int r = 0; r < rep; r++) {
            loom_cuda_gemm_batched(1, 0, T, hs, T, 1.0f, a + r * TT, T, st, dO + r * hs, C, sh,
                                   r ? 1.0f : 0.0f, dv, W, hs, KVH);
            loom_cuda_gemm_batched(0, 1, T, T, hs, 1.0f, dO + r * hs, C, sh, v, W, hs, 0.0f,
                                   da + r * TT, T, st, KVH);
        }
    }
    if (datt_extra) /* a further gradient of the probabilities (distillation's term) */
        loom_cuda_accumulate(datt, datt_extra, (size_t)B * NH * TT);
    LOOM_CUDA_LAUNCH("attention_backward (softmax)", softmax_backward_kernel,
                     (unsigned)((size_t)B * NH * T), SM_THREADS, 0, dpre, att, datt, T);
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * W, *k = q + C;
        const float *p = dpre + (size_t)b * NH * TT;
        float *dq = dqkv + (size_t)b * T * W, *dk = dq + C;
        for (int r = 0; r < rep; r++) {
            loom_cuda_gemm_batched(0, 0, T, hs, T, scale, p + r * TT, T, st, k, W, hs, 0.0f,
                                   dq + r * hs, W, sh, KVH);
            loom_cuda_gemm_batched(1, 0, T, hs, T, scale, p + r * TT, T, st, q + r * hs, W, sh,
                                   r ? 1.0f : 0.0f, dk, W, hs, KVH);
        }
    }
}

static void batched_decode(float *out, float *att, size_t att_stride, const float *qkv, int t,
                           int C, int NH, int KVH)
{
    /* out (C), att NH rows of t+1 at att_stride, qkv (t+1, W) */
    const int hs = C / NH, rep = NH / KVH, W = C + 2 * KVH * hs;
    const long long sa = (long long)att_stride, sh = (long long)rep * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    const float *q = qkv + (size_t)t * W, *k = qkv + C, *v = k + KVH * hs;
    for (int r = 0; r < rep; r++)
        loom_cuda_gemm_batched(0, 1, 1, t + 1, hs, scale, q + r * hs, W, sh, k, W, hs, 0.0f,
                               att + r * att_stride, (int)att_stride, rep * sa, KVH);
    LOOM_CUDA_LAUNCH("attention_decode (softmax)", causal_softmax_kernel, (unsigned)NH, SM_THREADS,
                     0, att, att_stride, 1, t, t + 1);
    for (int r = 0; r < rep; r++)
        loom_cuda_gemm_batched(0, 0, 1, hs, t + 1, 1.0f, att + r * att_stride, (int)att_stride,
                               rep * sa, v, W, hs, 0.0f, out + r * hs, C, sh, KVH);
}

/* The fused path of attention_forward / _backward over qkv of dt with KVH kv heads
 * (attention_dt.cu's too; KVH < NH: the grouped-query kernels): att holds lse (B,NH,T), then
 * out's copy (B,T,C). */
void loom_cuda_attention_flash_fwd(float *out, float *att, const void *qkv, int B, int T, int C,
                                   int NH, int KVH, loom_dtype dt)
{
    const size_t n = (size_t)B * T * C;
    float *saved = att + (size_t)B * NH * T;
    loom_cuda_flash_attention_gqa_forward(out, att, qkv, B, T, C, NH, KVH, dt);
    LOOM_CUDA_LAUNCH("attention_forward (flash: out saved)", copy_kernel, loom_cuda_blocks(n),
                     LOOM_CUDA_THREADS, 0, saved, out, n);
}

void loom_cuda_attention_flash_bwd(float *dqkv, float *scratch, const float *dout,
                                   const void *qkv, const float *att, int B, int T, int C, int NH,
                                   int KVH, loom_dtype dt)
{
    loom_cuda_flash_attention_gqa_backward(dqkv, scratch, dout, qkv, att + (size_t)B * NH * T, att,
                                           B, T, C, NH, KVH, dt);
}

extern "C" void loom_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                            int C, int NH)
{
    if (flash_takes(B, T, C, NH)) {
        loom_cuda_attention_flash_fwd(out, att, qkv, B, T, C, NH, NH, LOOM_DTYPE_F32);
        return;
    }
    batched_forward(out, att, qkv, B, T, C, NH, NH);
}

extern "C" void loom_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                             const float *qkv, const float *att, int B, int T,
                                             int C, int NH)
{
    /* dqkv (B,T,3C) =, scratch (2,B,NH,T,T), dout (B,T,C), qkv (B,T,3C), att (B,NH,T,T) */
    if (flash_takes(B, T, C, NH)) {
        loom_cuda_attention_flash_bwd(dqkv, scratch, dout, qkv, att, B, T, C, NH, NH, LOOM_DTYPE_F32);
        return;
    }
    batched_backward(dqkv, scratch, dout, qkv, att, NULL, B, T, C, NH, NH);
}

/* backend.h attention_backward_datt: the batched path with datt_extra (B,NH,T,T) added to
 * dO V^T before the softmax backward (kernels/cpu/attention.c's order: the products, then
 * the extra, then the row's softmax backward). Always the batched path: att must hold the
 * probabilities, which the fused kernels do not save: with LOOM_CUDA_ATTENTION=flash the
 * model turns them off around the mapped blocks' calls (attention_allow_fused). */
extern "C" void loom_cuda_attention_backward_datt(float *dqkv, float *scratch, const float *dout,
                                                  const float *qkv, const float *att,
                                                  const float *datt_extra, int B, int T, int C,
                                                  int NH)
{
    batched_backward(dqkv, scratch, dout, qkv, att, datt_extra, B, T, C, NH, NH);
}

/* backend.h attention_allow_fused: flash_takes' fused_off. */
extern "C" void loom_cuda_attention_allow_fused(void *self, int allow)
{
    (void)self;
    loom_cuda.fused_off = !allow;
}

extern "C" void loom_cuda_attention_decode(float *out, float *att, size_t att_stride,
                                           const float *qkv, int t, int C, int NH)
{
    batched_decode(out, att, att_stride, qkv, t, C, NH, NH);
}

/* Grouped-query attention (backend.h attention_gqa_*): KVH = NH is exactly the multi-head
 * ops above (the fused kernels included, where they take the call); fewer kv heads take the
 * batched path (the fused kernels read one kv head per q head). */
extern "C" void loom_cuda_attention_gqa_forward(float *out, float *att, const float *qkv, int B,
                                                int T, int C, int NH, int KVH)
{
    if (KVH == NH)
        loom_cuda_attention_forward(out, att, qkv, B, T, C, NH);
    else
        batched_forward(out, att, qkv, B, T, C, NH, KVH);
}

extern "C" void loom_cuda_attention_gqa_backward(float *dqkv, float *scratch, const float *dout,
                                                 const float *qkv, const float *att, int B,
                                                 int T, int C, int NH, int KVH)
{
    if (KVH == NH)
        loom_cuda_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    else
        batched_backward(dqkv, scratch, dout, qkv, att, NULL, B, T, C, NH, KVH);
}

extern "C" void loom_cuda_attention_gqa_decode(float *out, float *att, size_t att_stride,
                                               const float *qkv, int t, int C, int NH, int KVH)
{
    batched_decode(out, att, att_stride, qkv, t, C, NH, KVH);
}
