/* flash_attention.cu — causal multi-head self-attention without the T x T matrices
 * (FlashAttention's online softmax: Dao et al. 2022; its backward's split into a query pass
 * and a key pass: Dao 2023), forward and backward, over fp32 or 16-bit q, k, v (bf16, fp16:
 * widened as loaded) with fp32 arithmetic throughout. backend.h: attention_flash_forward /
 * _backward. attention.cu's batched-GEMM path is the simple reference these are tested
 * against (tests/cuda/test_cuda_ops.c: test_attention_flash).
 *
 * The layout is attention.cu's: qkv (B,T,3C) with q, k, v side by side, head h at h*hs of
 * each; out (B,T,C). What forward saves for backward is lse (B,NH,T), each query row's
 * log-sum-exp of its scaled scores (B*NH*T floats instead of att's B*NH*T*T).
 *
 * The mapping is the simplest one that never holds a score matrix: one thread per row
 * (forward and the dq pass: a query row; the dk/dv pass: a key row), its row and its
 * accumulators in registers (spilled to local memory for large heads), and the block's
 * threads loading tiles of the other side's rows into shared memory together. No atomics:
 * every output element is one thread's sum in key (or query) order, so the bits are the
 * same on every run. Not a tensor-core kernel: 16-bit q, k, v with heads of 16 to 64 (a
 * multiple of 16) go to flash_attention_tc.cu's WMMA kernels instead
 * (loom_cuda_flash_tc_takes; LOOM_CUDA_FLASH_TC=0 keeps them here). Neither's speed
 * against the batched path has been measured on a GPU.
 */
#include <stdio.h>

#include "flash_attention_tc.h"
#include "kernels.cuh"
#include "widen16.cuh"

enum { FA_ROWS = 64, FA_TILE = 32, FA_HS_MAX = 128 };

struct fa_shape {
    int B, T, C, NH, hs;
    float scale;
};

/* Row j of the q (part 0), k (1) or v (2) slice of head h in sequence b, widened. */
template <typename E>
__device__ inline void fa_load_row(float *dst, const E *qkv, const fa_shape &s, int b, int h,
                                   int part, int j)
{
    const E *p = qkv + ((size_t)b * s.T + j) * 3 * s.C + (size_t)part * s.C + (size_t)h * s.hs;
    for (int c = 0; c < s.hs; c++)
        dst[c] = loom_widen(p[c]);
}

/* The block's threads together: tile[r][0..hs) = the part's row r0 + r (zeros past T). */
template <typename E>
__device__ inline void fa_load_tile(float (*tile)[FA_HS_MAX], const E *qkv, const fa_shape &s,
                                    int b, int h, int part, int r0)
{
    for (int i = threadIdx.x; i < FA_TILE * s.hs; i += blockDim.x) {
        const int r = i / s.hs, c = i % s.hs, j = r0 + r;
        tile[r][c] = j < s.T ? loom_widen(qkv[((size_t)b * s.T + j) * 3 * s.C + (size_t)part * s.C +
                                              (size_t)h * s.hs + c])
                             : 0.0f;
    }
}

/* As fa_load_tile for a (B,T,C) fp32 tensor (dout). */
__device__ inline void fa_load_tile_btc(float (*tile)[FA_HS_MAX], const float *x, const fa_shape &s,
                                        int b, int h, int r0)
{
    for (int i = threadIdx.x; i < FA_TILE * s.hs; i += blockDim.x) {
        const int r = i / s.hs, c = i % s.hs, j = r0 + r;
        tile[r][c] = j < s.T ? x[((size_t)b * s.T + j) * s.C + (size_t)h * s.hs + c] : 0.0f;
    }
}

__device__ inline float fa_dot(const float *a, const float *b, int n)
{
    float d = 0.0f;
    for (int c = 0; c < n; c++)
        d += a[c] * b[c];
    return d;
}

/* grid (query blocks, B*NH), FA_ROWS threads: thread = query row t. For each tile of keys
 * the scores, the tile's max, one rescale of the running sum and output, then the tile's
 * terms added in key order. */
template <typename E>
__global__ void fa_forward_kernel(float *out, float *lse, const E *qkv, fa_shape s)
{
    __shared__ float ks[FA_TILE][FA_HS_MAX], vs[FA_TILE][FA_HS_MAX];
    const int bh = blockIdx.y, b = bh / s.NH, h = bh % s.NH;
    const int t0 = blockIdx.x * FA_ROWS, t = t0 + threadIdx.x;
    const int last = t0 + FA_ROWS - 1 < s.T - 1 ? t0 + FA_ROWS - 1 : s.T - 1; /* block-uniform */
    float q[FA_HS_MAX], acc[FA_HS_MAX], sc[FA_TILE];
    if (t < s.T)
        fa_load_row(q, qkv, s, b, h, 0, t);
    for (int c = 0; c < s.hs; c++)
        acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int k0 = 0; k0 <= last; k0 += FA_TILE) {
        __syncthreads(); /* the previous tile's readers are done */
        fa_load_tile(ks, qkv, s, b, h, 1, k0);
        fa_load_tile(vs, qkv, s, b, h, 2, k0);
        __syncthreads();
        const int n = t < s.T ? (t - k0 + 1 < FA_TILE ? t - k0 + 1 : FA_TILE) : 0;
        if (n <= 0)
            continue;
        float mt = -INFINITY;
        for (int j = 0; j < n; j++) {
            sc[j] = s.scale * fa_dot(q, ks[j], s.hs);
            mt = fmaxf(mt, sc[j]);
        }
        const float mn = fmaxf(m, mt), corr = expf(m - mn); /* m = -inf at first: corr 0 */
        l *= corr;
        for (int c = 0; c < s.hs; c++)
            acc[c] *= corr;
        for (int j = 0; j < n; j++) {
            const float p = expf(sc[j] - mn);
            l += p;
            for (int c = 0; c < s.hs; c++)
                acc[c] += p * vs[j][c];
        }
        m = mn;
    }
    if (t >= s.T)
        return;
    float *o = out + ((size_t)b * s.T + t) * s.C + (size_t)h * s.hs;
    const float inv = 1.0f / l;
    for (int c = 0; c < s.hs; c++)
        o[c] = acc[c] * inv;
    lse[(size_t)bh * s.T + t] = m + logf(l);
}

/* dsum[bh*T + t] = dout row . out row over head h: softmax's backward term
 * sum_j P_tj dP_tj, which equals dO_t . O_t. */
__global__ void fa_dsum_kernel(float *dsum, const float *dout, const float *out, fa_shape s)
{
    GRID_STRIDE(i, (size_t)s.B * s.NH * s.T)
    {
        const int t = (int)(i % s.T), bh = (int)(i / s.T), b = bh / s.NH, h = bh % s.NH;
        const size_t o = ((size_t)b * s.T + t) * s.C + (size_t)h * s.hs;
        dsum[i] = fa_dot(dout + o, out + o, s.hs);
    }
}

/* dq pass: thread = query row t; dq_t = scale * sum_{j<=t} P_tj (dO_t.v_j - dsum_t) k_j,
 * P_tj = exp(scale q_t.k_j - lse_t), keys in order. */
template <typename E>
__global__ void fa_dq_kernel(float *dqkv, const float *dout, const E *qkv, const float *lse,
                             const float *dsum, fa_shape s)
{
    __shared__ float ks[FA_TILE][FA_HS_MAX], vs[FA_TILE][FA_HS_MAX];
    const int bh = blockIdx.y, b = bh / s.NH, h = bh % s.NH;
    const int t0 = blockIdx.x * FA_ROWS, t = t0 + threadIdx.x;
    const int last = t0 + FA_ROWS - 1 < s.T - 1 ? t0 + FA_ROWS - 1 : s.T - 1;
    float q[FA_HS_MAX], dO[FA_HS_MAX], dq[FA_HS_MAX];
    float L = 0.0f, D = 0.0f;
    if (t < s.T) {
        fa_load_row(q, qkv, s, b, h, 0, t);
        const float *g = dout + ((size_t)b * s.T + t) * s.C + (size_t)h * s.hs;
        for (int c = 0; c < s.hs; c++)
            dO[c] = g[c];
        L = lse[(size_t)bh * s.T + t];
        D = dsum[(size_t)bh * s.T + t];
    }
    for (int c = 0; c < s.hs; c++)
        dq[c] = 0.0f;
    for (int k0 = 0; k0 <= last; k0 += FA_TILE) {
        __syncthreads();
        fa_load_tile(ks, qkv, s, b, h, 1, k0);
        fa_load_tile(vs, qkv, s, b, h, 2, k0);
        __syncthreads();
        const int n = t < s.T ? (t - k0 + 1 < FA_TILE ? t - k0 + 1 : FA_TILE) : 0;
        for (int j = 0; j < n; j++) {
            const float p = expf(s.scale * fa_dot(q, ks[j], s.hs) - L);
            const float ds = p * (fa_dot(dO, vs[j], s.hs) - D);
            for (int c = 0; c < s.hs; c++)
                dq[c] += ds * ks[j][c];
        }
    }
    if (t >= s.T)
        return;
    float *o = dqkv + ((size_t)b * s.T + t) * 3 * s.C + (size_t)h * s.hs;
    for (int c = 0; c < s.hs; c++)
        o[c] = s.scale * dq[c];
}

/* dk/dv pass: thread = key row j; over queries i >= j in order,
 * dv_j += P_ij dO_i, dk_j += P_ij (dO_i.v_j - dsum_i) q_i, dk scaled at the end. */
template <typename E>
__global__ void fa_dkv_kernel(float *dqkv, const float *dout, const E *qkv, const float *lse,
                              const float *dsum, fa_shape s)
{
    __shared__ float qs[FA_TILE][FA_HS_MAX], gs[FA_TILE][FA_HS_MAX], ls[FA_TILE], dsm[FA_TILE];
    const int bh = blockIdx.y, b = bh / s.NH, h = bh % s.NH;
    const int j0 = blockIdx.x * FA_ROWS, j = j0 + threadIdx.x;
    float k[FA_HS_MAX], v[FA_HS_MAX], dk[FA_HS_MAX], dv[FA_HS_MAX];
    if (j < s.T) {
        fa_load_row(k, qkv, s, b, h, 1, j);
        fa_load_row(v, qkv, s, b, h, 2, j);
    }
    for (int c = 0; c < s.hs; c++)
        dk[c] = dv[c] = 0.0f;
    for (int i0 = j0; i0 < s.T; i0 += FA_TILE) { /* queries before j0 see none of these keys */
        __syncthreads();
        fa_load_tile(qs, qkv, s, b, h, 0, i0);
        fa_load_tile_btc(gs, dout, s, b, h, i0);
        for (int r = threadIdx.x; r < FA_TILE; r += blockDim.x) {
            const int i = i0 + r;
            ls[r] = i < s.T ? lse[(size_t)bh * s.T + i] : 0.0f;
            dsm[r] = i < s.T ? dsum[(size_t)bh * s.T + i] : 0.0f;
        }
        __syncthreads();
        if (j >= s.T)
            continue;
        for (int r = 0; r < FA_TILE; r++) {
            const int i = i0 + r;
            if (i < j || i >= s.T)
                continue;
            const float p = expf(s.scale * fa_dot(qs[r], k, s.hs) - ls[r]);
            const float ds = p * (fa_dot(gs[r], v, s.hs) - dsm[r]);
            for (int c = 0; c < s.hs; c++) {
                dv[c] += p * gs[r][c];
                dk[c] += ds * qs[r][c];
            }
        }
    }
    if (j >= s.T)
        return;
    float *o = dqkv + ((size_t)b * s.T + j) * 3 * s.C + (size_t)h * s.hs;
    for (int c = 0; c < s.hs; c++) {
        o[s.C + c] = s.scale * dk[c];
        o[2 * s.C + c] = dv[c];
    }
}

/* The shape, or 0 (an error recorded) where a head is wider than the kernels hold or the
 * grid's y (one block row per sequence and head) would pass CUDA's 65535. */
static int fa_shape_of(fa_shape *s, int B, int T, int C, int NH, const char *what)
{
    *s = fa_shape{B, T, C, NH, C / NH, 1.0f / sqrtf((float)(C / NH))};
    if (s->hs > FA_HS_MAX || s->hs < 1) {
        char d[96];
        snprintf(d, sizeof d, "head size %d: the flash kernels hold heads of 1 to %d values",
                 s->hs, (int)FA_HS_MAX);
        loom_cuda_note_error(what, d);
        return 0;
    }
    if ((long long)B * NH > 65535) {
        char d[96];
        snprintf(d, sizeof d, "B x NH = %lld sequence-heads: the grid holds 65535",
                 (long long)B * NH);
        loom_cuda_note_error(what, d);
        return 0;
    }
    return B > 0 && T > 0;
}

extern "C" void loom_cuda_flash_attention_forward(float *out, float *lse, const void *qkv, int B,
                                                  int T, int C, int NH, loom_dtype dt)
{
    fa_shape s;
    if (!fa_shape_of(&s, B, T, C, NH, "attention_flash_forward"))
        return;
    if (loom_cuda_flash_tc_takes(C, NH, dt)) {
        loom_cuda_flash_tc_forward(out, lse, qkv, B, T, C, NH, NH, dt);
        return;
    }
    dim3 grid((unsigned)((T + FA_ROWS - 1) / FA_ROWS), (unsigned)(B * NH));
    if (dt == LOOM_DTYPE_BF16)
        LOOM_CUDA_LAUNCH("attention_flash_forward", fa_forward_kernel<loom_bf16>, grid, FA_ROWS, 0,
                         out, lse, (const loom_bf16 *)qkv, s);
    else if (dt == LOOM_DTYPE_F16)
        LOOM_CUDA_LAUNCH("attention_flash_forward", fa_forward_kernel<loom_f16>, grid, FA_ROWS, 0,
                         out, lse, (const loom_f16 *)qkv, s);
    else
        LOOM_CUDA_LAUNCH("attention_flash_forward", fa_forward_kernel<float>, grid, FA_ROWS, 0, out,
                         lse, (const float *)qkv, s);
}

template <typename E>
static void fa_backward(float *dqkv, const float *dout, const E *qkv, const float *lse,
                        const float *dsum, const fa_shape &s)
{
    dim3 grid((unsigned)((s.T + FA_ROWS - 1) / FA_ROWS), (unsigned)(s.B * s.NH));
    LOOM_CUDA_LAUNCH("attention_flash_backward (dq)", fa_dq_kernel<E>, grid, FA_ROWS, 0, dqkv,
                     dout, qkv, lse, dsum, s);
    LOOM_CUDA_LAUNCH("attention_flash_backward (dk, dv)", fa_dkv_kernel<E>, grid, FA_ROWS, 0,
                     dqkv, dout, qkv, lse, dsum, s);
}

extern "C" void loom_cuda_flash_attention_backward(float *dqkv, float *scratch, const float *dout,
                                                   const void *qkv, const float *out,
                                                   const float *lse, int B, int T, int C, int NH,
                                                   loom_dtype dt)
{
    fa_shape s;
    if (!fa_shape_of(&s, B, T, C, NH, "attention_flash_backward"))
        return;
    const size_t rows = (size_t)B * NH * T;
    LOOM_CUDA_LAUNCH("attention_flash_backward (dsum)", fa_dsum_kernel, loom_cuda_blocks(rows),
                     LOOM_CUDA_THREADS, 0, scratch, dout, out, s);
    if (loom_cuda_flash_tc_takes(C, NH, dt))
        loom_cuda_flash_tc_backward(dqkv, dout, qkv, lse, scratch, B, T, C, NH, NH, dt);
    else if (dt == LOOM_DTYPE_BF16)
        fa_backward(dqkv, dout, (const loom_bf16 *)qkv, lse, scratch, s);
    else if (dt == LOOM_DTYPE_F16)
        fa_backward(dqkv, dout, (const loom_f16 *)qkv, lse, scratch, s);
    else
        fa_backward(dqkv, dout, (const float *)qkv, lse, scratch, s);
}

/* backend.h attention_flash_gqa_forward / _backward: KVH = NH is the multi-head ops above;
 * fewer kv heads only on the tensor-core kernels (the scalar ones read one kv head per q
 * head), any other call an error recorded with what would take it. */
static int fa_gqa_takes(int C, int NH, int KVH, loom_dtype dt, const char *what)
{
    if (KVH > 0 && NH % KVH == 0 && loom_cuda_flash_tc_takes(C, NH, dt))
        return 1;
    char d[320];
    snprintf(d, sizeof d, "NH %d, KVH %d, head size %d, dtype %d: grouped-query flash attention "
             "runs on the tensor-core kernels only (bf16 or fp16, heads of 16 to 64 values, a "
             "multiple of 16, KVH dividing NH, LOOM_CUDA_FLASH_TC not 0)", NH, KVH,
             NH ? C / NH : 0, (int)dt);
    loom_cuda_note_error(what, d);
    return 0;
}

extern "C" void loom_cuda_flash_attention_gqa_forward(float *out, float *lse, const void *qkv,
                                                      int B, int T, int C, int NH, int KVH,
                                                      loom_dtype dt)
{
    if (KVH == NH) {
        loom_cuda_flash_attention_forward(out, lse, qkv, B, T, C, NH, dt);
        return;
    }
    fa_shape s;
    if (!fa_shape_of(&s, B, T, C, NH, "attention_flash_gqa_forward") ||
        !fa_gqa_takes(C, NH, KVH, dt, "attention_flash_gqa_forward"))
        return;
    loom_cuda_flash_tc_forward(out, lse, qkv, B, T, C, NH, KVH, dt);
}

extern "C" void loom_cuda_flash_attention_gqa_backward(float *dqkv, float *scratch,
                                                       const float *dout, const void *qkv,
                                                       const float *out, const float *lse, int B,
                                                       int T, int C, int NH, int KVH,
                                                       loom_dtype dt)
{
    if (KVH == NH) {
        loom_cuda_flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, dt);
        return;
    }
    fa_shape s;
    if (!fa_shape_of(&s, B, T, C, NH, "attention_flash_gqa_backward") ||
        !fa_gqa_takes(C, NH, KVH, dt, "attention_flash_gqa_backward"))
        return;
    /* dsum per query head: dout and out are (B,T,C) whatever the kv heads */
    LOOM_CUDA_LAUNCH("attention_flash_gqa_backward (dsum)", fa_dsum_kernel,
                     loom_cuda_blocks((size_t)B * NH * T), LOOM_CUDA_THREADS, 0, scratch, dout,
                     out, s);
    loom_cuda_flash_tc_backward(dqkv, dout, qkv, lse, scratch, B, T, C, NH, KVH, dt);
}
