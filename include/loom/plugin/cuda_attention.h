/* loom/plugin/cuda_attention.h — which attention calls the CUDA backend runs on its fused
 * kernels (LOOM_CUDA_ATTENTION=flash) and what att and the backward's scratch then hold: a
 * pure rule of the call's shape and the backend's mode, so that the backend
 * (kernels/cuda: attention.cu's flash_takes, flash_attention_tc.cu's tc_takes,
 * attention_dt.cu's attention_sizes) and loom plan's footprint (core/model/gpt_att.c, with
 * no backend to ask) decide by the same code.
 *
 * The fused path (multi-head: flash mode, fast mode, heads up to 128 wide, B*NH up to
 * 65535, and room in att for what it saves: NH*T >= NH + C, i.e. T longer than a head)
 * keeps lse (B,NH,T) then out's copy (B,T,C) in att, and its backward B*NH*T floats of
 * scratch (dO . O per query row); the batched path the probabilities (B,NH,T,T) and two
 * (B,NH,T,T) gradients. With fewer kv heads only the tensor-core kernels are fused (16-bit
 * activations, heads 16 to 64 wide, a multiple of 16, LOOM_CUDA_FLASH_TC not "0"): fp32
 * grouped-query attention is always the batched path. */
#ifndef LOOM_PLUGIN_CUDA_ATTENTION_H
#define LOOM_PLUGIN_CUDA_ATTENTION_H

#include <stddef.h>

#include "loom/plugin/backend.h" /* loom_dtype */

#ifdef __cplusplus
extern "C" {
#endif

/* What the path depends on besides the call's shape. */
typedef struct loom_cuda_attention_mode {
    int flash;         /* LOOM_CUDA_ATTENTION=flash */
    int deterministic; /* set_deterministic's mode: 0 fast; canonical and row-stable (1, 2)
                        * keep the batched path, whose bits define them */
    int tc;            /* the tensor-core kernels allowed (LOOM_CUDA_FLASH_TC is not "0") */
} loom_cuda_attention_mode;

enum {
    LOOM_CUDA_FLASH_MAX_HS = 128,   /* the fused kernels' widest head */
    LOOM_CUDA_FLASH_MAX_BNH = 65535, /* their most B*NH (one grid dimension) */
    LOOM_CUDA_FLASH_TC_MAX_HS = 64  /* the tensor-core kernels' widest head (TC_HS) */
};

/* The multi-head fused kernels take attention_forward/_backward of this shape. */
static inline int loom_cuda_attention_fused(const loom_cuda_attention_mode *mo, int B, int T,
                                            int C, int NH)
{
    return mo->flash && !mo->deterministic && C / NH <= LOOM_CUDA_FLASH_MAX_HS &&
           (long long)B * NH <= LOOM_CUDA_FLASH_MAX_BNH && (size_t)NH * T >= (size_t)NH + C;
}

/* The tensor-core kernels take the head size and dtype (where the fused path runs). */
static inline int loom_cuda_attention_tc(const loom_cuda_attention_mode *mo, int C, int NH,
                                         loom_dtype dt)
{
    const int hs = C / NH;
    return mo->tc && (dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16) && hs % 16 == 0 &&
           hs >= 16 && hs <= LOOM_CUDA_FLASH_TC_MAX_HS;
}

/* backend.h attention_sizes under mode mo: the floats att and the backward's scratch need
 * for a call of this shape (KVH = NH: the multi-head ops; dt: the _dt ops' dtype, F32 the
 * fp32 ops). */
static inline void loom_cuda_attention_sizes_of(const loom_cuda_attention_mode *mo, int B, int T,
                                                int C, int NH, int KVH, loom_dtype dt,
                                                size_t *att, size_t *scratch)
{
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T;
    const int fused = KVH == NH ? loom_cuda_attention_fused(mo, B, T, C, NH)
                                : dt != LOOM_DTYPE_F32 && loom_cuda_attention_fused(mo, B, T, C, NH) &&
                                      loom_cuda_attention_tc(mo, C, NH, dt);
    *att = fused ? rows + (size_t)B * (size_t)T * (size_t)C : rows * (size_t)T;
    *scratch = fused ? rows : 2 * rows * (size_t)T;
}

#ifdef __cplusplus
}
#endif
#endif
