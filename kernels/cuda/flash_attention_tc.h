/* flash_attention_tc.h — the tensor-core fused attention (flash_attention_tc.cu), which
 * flash_attention.cu's entry points call for the shapes it takes. */
#ifndef LOOM_CUDA_FLASH_ATTENTION_TC_H
#define LOOM_CUDA_FLASH_ATTENTION_TC_H

#include "cuda_common.h"

/* 1 where the tensor-core kernels take q, k, v of dt with C / NH wide heads: bf16 or fp16,
 * heads of 16 to 64 values, a multiple of 16 (and LOOM_CUDA_FLASH_TC is not "0"). */
int loom_cuda_flash_tc_takes(int C, int NH, loom_dtype dt);
/* attention_flash_forward's contract with KVH key/value heads (KVH = NH: that op itself;
 * fewer: backend.h attention_flash_gqa_forward's qkv rows, C + 2 KVH C/NH wide). */
void loom_cuda_flash_tc_forward(float *out, float *lse, const void *qkv, int B, int T, int C,
                                int NH, int KVH, loom_dtype dt);
/* attention_flash_backward's (or _gqa_backward's), with dsum (B*NH*T) = each row's dO . O
 * already computed. */
void loom_cuda_flash_tc_backward(float *dqkv, const float *dout, const void *qkv,
                                 const float *lse, const float *dsum, int B, int T, int C, int NH,
                                 int KVH, loom_dtype dt);

/* attention.cu: 1 where attention_forward/_backward run the fused kernels (its opening
 * comment: flash mode, fast mode, att's room). */
int loom_cuda_attention_flash_takes(int B, int T, int C, int NH);
/* attention.cu: that fused path over qkv of dt with KVH kv heads (KVH < NH: the tensor-core
 * kernels only), att holding its state (lse, out's copy). */
void loom_cuda_attention_flash_fwd(float *out, float *att, const void *qkv, int B, int T, int C,
                                   int NH, int KVH, loom_dtype dt);
void loom_cuda_attention_flash_bwd(float *dqkv, float *scratch, const float *dout,
                                   const void *qkv, const float *att, int B, int T, int C, int NH,
                                   int KVH, loom_dtype dt);

#endif
