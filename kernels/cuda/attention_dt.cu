/* attention_dt.cu — backend.h attention_forward_dt / _backward_dt: attention_forward /
 * _backward where the caller promises that qkv holds only 16-bit values (the model rounded
 * its activations to bf16 or fp16). Where attention.cu would run the fused kernels
 * (LOOM_CUDA_ATTENTION=flash, fast mode, att with room: loom_cuda_attention_flash_takes) and
 * the tensor-core ones take the head size (flash_attention_tc.cu: 16 to 64, a multiple of
 * 16), qkv is narrowed into the workspace (exact, by the promise) and those run, att
 * holding what attention.cu's fused path keeps there (lse, then out's copy); elsewhere
 * exactly attention_forward / _backward (the same bits as without the dtype).
 *
 * attention_gqa_forward_dt / _backward_dt: KVH = NH is the multi-head pair above; fewer kv
 * heads take the tensor-core kernels' grouped-query form on the same condition (qkv rows
 * W = C + 2 KVH hs wide), elsewhere exactly attention_gqa_forward / _backward.
 */
#include "flash_attention_tc.h"
#include "kernels.cuh"

static int adt_takes(int B, int T, int C, int NH, loom_dtype dt)
{
    return loom_cuda_attention_flash_takes(B, T, C, NH) && loom_cuda_flash_tc_takes(C, NH, dt);
}

/* qkv (B,T,3C or W) narrowed to dt in the workspace; NULL (an error recorded) without memory. */
static const void *adt_narrow(const float *qkv, size_t n, loom_dtype dt)
{
    void *q16 = loom_cuda_workspace(n * 2);
    if (q16)
        loom_cuda_convert_from_f32(q16, qkv, n, dt);
    return q16;
}

extern "C" void loom_cuda_attention_forward_dt(float *out, float *att, const float *qkv, int B,
                                               int T, int C, int NH, loom_dtype dt)
{
    if (!adt_takes(B, T, C, NH, dt)) {
        loom_cuda_attention_forward(out, att, qkv, B, T, C, NH);
        return;
    }
    const void *q16 = adt_narrow(qkv, (size_t)B * T * 3 * C, dt);
    if (!q16)
        return;
    loom_cuda_attention_flash_fwd(out, att, q16, B, T, C, NH, NH, dt);
}

extern "C" void loom_cuda_attention_backward_dt(float *dqkv, float *scratch, const float *dout,
                                                const float *qkv, const float *att, int B, int T,
                                                int C, int NH, loom_dtype dt)
{
    if (!adt_takes(B, T, C, NH, dt)) {
        loom_cuda_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
        return;
    }
    const void *q16 = adt_narrow(qkv, (size_t)B * T * 3 * C, dt);
    if (!q16)
        return;
    loom_cuda_attention_flash_bwd(dqkv, scratch, dout, q16, att, B, T, C, NH, NH, dt);
}

extern "C" void loom_cuda_attention_gqa_forward_dt(float *out, float *att, const float *qkv, int B,
                                                   int T, int C, int NH, int KVH, loom_dtype dt)
{
    if (KVH == NH) {
        loom_cuda_attention_forward_dt(out, att, qkv, B, T, C, NH, dt);
        return;
    }
    if (!adt_takes(B, T, C, NH, dt)) {
        loom_cuda_attention_gqa_forward(out, att, qkv, B, T, C, NH, KVH);
        return;
    }
    const void *q16 = adt_narrow(qkv, (size_t)B * T * (C + 2 * KVH * (C / NH)), dt);
    if (!q16)
        return;
    loom_cuda_attention_flash_fwd(out, att, q16, B, T, C, NH, KVH, dt);
}

extern "C" void loom_cuda_attention_gqa_backward_dt(float *dqkv, float *scratch,
                                                    const float *dout, const float *qkv,
                                                    const float *att, int B, int T, int C, int NH,
                                                    int KVH, loom_dtype dt)
{
    if (KVH == NH) {
        loom_cuda_attention_backward_dt(dqkv, scratch, dout, qkv, att, B, T, C, NH, dt);
        return;
    }
    if (!adt_takes(B, T, C, NH, dt)) {
        loom_cuda_attention_gqa_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH, KVH);
        return;
    }
    const void *q16 = adt_narrow(qkv, (size_t)B * T * (C + 2 * KVH * (C / NH)), dt);
    if (!q16)
        return;
    loom_cuda_attention_flash_bwd(dqkv, scratch, dout, q16, att, B, T, C, NH, KVH, dt);
}

/* backend.h attention_sizes: loom/plugin/cuda_attention.h's rule in the backend's mode now
 * (the one each op above and attention.cu's take on adt_takes' or flash_takes' condition):
 * the fused path keeps lse (B,NH,T) then out's copy (B,T,C) in att and its backward B*NH*T
 * floats of scratch (dO . O per query row); the batched path the probabilities (B,NH,T,T)
 * and two (B,NH,T,T) gradients; fp32 with fewer kv heads always the batched path. loom
 * plan's footprint sizes a flash run by the same rule (core/model/gpt_att.c). */
extern "C" void loom_cuda_attention_sizes(void *self, int B, int T, int C, int NH, int KVH,
                                          loom_dtype dt, size_t *att, size_t *scratch)
{
    (void)self;
    const loom_cuda_attention_mode mo = loom_cuda_attention_mode_now();
    loom_cuda_attention_sizes_of(&mo, B, T, C, NH, KVH, dt, att, scratch);
}
