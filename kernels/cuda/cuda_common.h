/* cuda_common.h — what the CUDA backend's files share (private: CUDA types allowed here,
 * never in include/loom). One backend instance per process (backend.h), and the ops take no
 * instance pointer, so the compute stream, the cuBLAS handles and the workspace are one
 * process-wide context, set by create() and cleared by destroy().
 */
#ifndef LOOM_CUDA_COMMON_H
#define LOOM_CUDA_COMMON_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "loom/plugin/backend.h" /* loom_adamw_consts, loom_sgd_consts */
#include "loom/plugin/cuda_attention.h"

#include "profile.h" /* LOOM_CUDA_PROFILE: the launches and products timed by events */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_cuda_ctx {
    cudaStream_t stream;  /* the compute stream: every kernel and copy of the backend */
    void *blas;           /* cublasHandle_t, bound to stream */
    void *blaslt;         /* cublasLtHandle_t */
    void *lt_workspace;   /* cuBLASLt's workspace, lt_workspace_bytes */
    size_t lt_workspace_bytes;
    int *d_flag;          /* one int for has_nonfinite */
    int *h_flag;          /* pinned host mirror */
    double *h_parts;      /* pinned host copy of sum_squares' chunk sums */
    int deterministic;    /* set_deterministic's mode: 0 cuBLAS, 1/2 the ordered GEMM */
    int attention_flash;  /* LOOM_CUDA_ATTENTION=flash: attention_forward/_backward run the
                           * fused kernels where they can (attention.cu) */
    int fused_off;        /* attention_allow_fused(0): the batched path whatever
                           * attention_flash says, until allow 1 (attention.cu) */
    int bf16_bwd;         /* LOOM_CUDA_BF16_BWD (default 1): matmul_backward_dt runs the bf16
                           * split products (gemm.c); 0 leaves them to the fp32 SGEMMs */
    int sticky_error;     /* a launch or cuBLAS call failed: reported at synchronize */
    char error[256];
} loom_cuda_ctx;

extern loom_cuda_ctx loom_cuda;

/* LOOM_CUDA_ATTENTION: unset or "batched" 0, "flash" 1, anything else -1 (create refuses). */
static inline int loom_cuda_attention_env(void)
{
    const char *v = getenv("LOOM_CUDA_ATTENTION");
    return !v || !*v || !strcmp(v, "batched") ? 0 : !strcmp(v, "flash") ? 1 : -1;
}

/* The backend's attention mode now (loom/plugin/cuda_attention.h: the rule the fused path's
 * callers and attention_sizes decide by): LOOM_CUDA_FLASH_TC read at each call, so that a
 * test can switch it. */
static inline loom_cuda_attention_mode loom_cuda_attention_mode_now(void)
{
    const char *v = getenv("LOOM_CUDA_FLASH_TC"); /* "0": the scalar kernels (comparisons) */
    loom_cuda_attention_mode mo = {loom_cuda.attention_flash && !loom_cuda.fused_off,
                                   loom_cuda.deterministic,
                                   !(v && !strcmp(v, "0"))};
    return mo;
}

/* LOOM_CUDA_SCATTER (scatter_sorted.cu's path): unset 0 (by size), "walk" 1, "sort" 2,
 * anything else -1 (create refuses). Read at each scatter-add, so a test can switch it. */
static inline int loom_cuda_scatter_env(void)
{
    const char *v = getenv("LOOM_CUDA_SCATTER");
    return !v || !*v ? 0 : !strcmp(v, "walk") ? 1 : !strcmp(v, "sort") ? 2 : -1;
}

/* LOOM_CUDA_SPLIT_CHUNK (gemm.c's matmul_backward_dt): the most elements of dout split into
 * bf16 hi and lo at once (4 bytes each in the workspace); unset or empty 2^26 (256 MiB: the
 * LM head's d(logits) in chunks of 1334 rows at GPT-2's 50304 columns), a positive integer
 * that many, anything else 0 (create refuses). Read at each call, so a test can switch it. */
static inline size_t loom_cuda_split_chunk_env(void)
{
    const char *v = getenv("LOOM_CUDA_SPLIT_CHUNK");
    if (!v || !*v)
        return (size_t)1 << 26;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    return *end || *v == '-' ? 0 : (size_t)n;
}

/* LOOM_CUDA_BF16_BWD: unset, empty or "1" 1, "0" 0, anything else -1 (create refuses). */
static inline int loom_cuda_bf16_bwd_env(void)
{
    const char *v = getenv("LOOM_CUDA_BF16_BWD");
    return !v || !*v || !strcmp(v, "1") ? 1 : !strcmp(v, "0") ? 0 : -1;
}

/* Backend-owned device scratch of at least `bytes`, reused across ops (stream order makes
 * that safe); grown from the pool when a call needs more, so after the first step it is a
 * pointer read. NULL when device memory runs out (recorded as a sticky error). */
void *loom_cuda_workspace(size_t bytes);
/* Record the first failure (launch error, cuBLAS status) for synchronize to report. */
void loom_cuda_note_error(const char *what, const char *detail);
/* After a launch: record cudaGetLastError's failure, if any. */
void loom_cuda_check_launch(const char *what);

/* --- kernels (the .cu files); argument order and semantics as in plugin/backend.h ----- */
void loom_cuda_embedding_forward(float *out, const int *inp, const float *wte, int v0, int Vl,
                                 size_t rows, int C);
void loom_cuda_embedding_backward(float *dwte, const float *dout, const int *inp, int v0, int Vl,
                                  size_t rows, int C);
void loom_cuda_position_forward(float *out, const float *wpe, size_t row0, size_t rows, int T,
                                int C);
void loom_cuda_position_backward(float *dwpe, const float *dout, int B, int T, int C);
void loom_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int B, int T, int C);
void loom_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int B, int T, int C);
void loom_cuda_gelu_forward(float *out, const float *inp, size_t n);
void loom_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void loom_cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
void loom_cuda_accumulate(float *acc, const float *x, size_t n);
void loom_cuda_scale(float *x, float s, size_t n);
void loom_cuda_bias_add(float *out, const float *bias, size_t rows, int cols);
void loom_cuda_bias_backward(float *dbias, const float *dout, size_t rows, int cols);
void loom_cuda_ce_row_max(float *row_max, const float *logits, int BT, int Vl, int col0, int V);
void loom_cuda_ce_row_sumexp(float *sumexp, const float *logits, const float *row_max, int BT,
                             int Vl, int col0, int V, int c0, int c1);
void loom_cuda_ce_target_logit(float *tlogit, const float *logits, const int *targets, int BT,
                               int Vl, int col0);
void loom_cuda_ce_finish(float *logits, float *losses, const float *row_max, const float *sumexp,
                         const float *tlogit, const int *targets, float dloss, int BT, int Vl,
                         int col0, int V);
double loom_cuda_sum_squares(const float *x, size_t rows, size_t cols, size_t stride);
int loom_cuda_has_nonfinite(const float *x, size_t n);
void loom_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                 int NH);
void loom_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                  const float *qkv, const float *att, int B, int T, int C, int NH);
void loom_cuda_attention_decode(float *out, float *att, size_t att_stride, const float *qkv,
                                int t, int C, int NH);
void loom_cuda_attention_gqa_forward(float *out, float *att, const float *qkv, int B, int T,
                                     int C, int NH, int KVH);
void loom_cuda_attention_gqa_backward(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *att, int B, int T, int C,
                                      int NH, int KVH);
void loom_cuda_attention_gqa_decode(float *out, float *att, size_t att_stride, const float *qkv,
                                    int t, int C, int NH, int KVH);
/* llama.cu: backend.h rmsnorm_*, swiglu_*, rope_* (kernels/cpu's math). */
void loom_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                               size_t rows, int C, float eps);
void loom_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                const float *weight, const float *rstd, size_t rows, int C);
void loom_cuda_swiglu_forward(float *out, const float *inp, size_t rows, int F);
void loom_cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, size_t rows,
                               int F);
void loom_cuda_rope_forward(float *x, const float *cos, const float *sin, size_t row0,
                            size_t rows, int T, int stride, int heads, int hs);
void loom_cuda_rope_backward(float *dx, const float *cos, const float *sin, size_t row0,
                             size_t rows, int T, int stride, int heads, int hs);
/* scatter_sorted.cu: dst[idx[i] - offset] += (scale ? scale[i] : 1) * src[i] for the rows
 * with idx[i] - offset in [0, limit), rows sharing a destination in increasing i (the CPU's
 * bits), row-parallel through a stable sort by destination (workspace scratch). */
void loom_cuda_scatter_add_rows(float *dst, const float *src, const int *idx, int offset,
                                int limit, const float *scale, size_t n, int C);
/* rows.cu: backend.h rows_gather, rows_scatter_add, rows_dot (the MoE layer's row moves;
 * kernels/cpu/rows.c's bits). */
void loom_cuda_rows_gather(float *out, const float *inp, const int *idx, const float *scale,
                           size_t n, int C);
void loom_cuda_rows_scatter_add(float *out, const float *inp, const int *idx,
                                const float *scale, size_t n, int C);
void loom_cuda_rows_dot(float *out, const float *a, const int *idx, const float *b, size_t n,
                        int C);
/* attention.cu: backend.h attention_backward_datt (the batched path, datt_extra added). */
void loom_cuda_attention_backward_datt(float *dqkv, float *scratch, const float *dout,
                                       const float *qkv, const float *att,
                                       const float *datt_extra, int B, int T, int C, int NH);
/* attention.cu: backend.h attention_allow_fused (fused_off above). */
void loom_cuda_attention_allow_fused(void *self, int allow);
/* distill.cu: backend.h kd_rows (core/model/gpt_distill.c's loom_kd_rows, its order). */
void loom_cuda_kd_rows(const float *zs, size_t s_stride, const float *zt, size_t t_stride,
                       size_t R, int V, float T, float scale, double *loss, float *grad);
/* flash_attention.cu: backend.h attention_flash_forward / _backward. */
void loom_cuda_flash_attention_forward(float *out, float *lse, const void *qkv, int B, int T,
                                       int C, int NH, loom_dtype dt);
void loom_cuda_flash_attention_backward(float *dqkv, float *scratch, const float *dout,
                                        const void *qkv, const float *out, const float *lse,
                                        int B, int T, int C, int NH, loom_dtype dt);
/* flash_attention.cu: backend.h attention_flash_gqa_forward / _backward. */
void loom_cuda_flash_attention_gqa_forward(float *out, float *lse, const void *qkv, int B, int T,
                                           int C, int NH, int KVH, loom_dtype dt);
void loom_cuda_flash_attention_gqa_backward(float *dqkv, float *scratch, const float *dout,
                                            const void *qkv, const float *out, const float *lse,
                                            int B, int T, int C, int NH, int KVH, loom_dtype dt);
/* attention_dt.cu: backend.h attention_forward_dt / _backward_dt and the _gqa ones. */
void loom_cuda_attention_gqa_forward_dt(float *out, float *att, const float *qkv, int B, int T,
                                        int C, int NH, int KVH, loom_dtype dt);
void loom_cuda_attention_gqa_backward_dt(float *dqkv, float *scratch, const float *dout,
                                         const float *qkv, const float *att, int B, int T, int C,
                                         int NH, int KVH, loom_dtype dt);
void loom_cuda_attention_forward_dt(float *out, float *att, const float *qkv, int B, int T,
                                    int C, int NH, loom_dtype dt);
void loom_cuda_attention_backward_dt(float *dqkv, float *scratch, const float *dout,
                                     const float *qkv, const float *att, int B, int T, int C,
                                     int NH, loom_dtype dt);
/* attention_dt.cu: backend.h attention_sizes (what att and the backward's scratch hold on
 * the path the calls above take now). */
void loom_cuda_attention_sizes(void *self, int B, int T, int C, int NH, int KVH, loom_dtype dt,
                               size_t *att, size_t *scratch);
/* convert.cu: kernels/cpu/convert.c's rounding, bit for bit. */
void loom_cuda_convert_from_f32(void *dst, const float *src, size_t n, loom_dtype dt);
void loom_cuda_convert_to_f32(float *dst, const void *src, size_t n, loom_dtype dt);
void loom_cuda_round_to(float *dst, const float *src, size_t n, loom_dtype dt);
/* optim.cu: the optimizer plugins' element loops, every operation rounded as the host's. */
void loom_cuda_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                            const loom_adamw_consts *c);
void loom_cuda_sgd_update(float *param, const float *grad, float *buf, size_t n,
                          const loom_sgd_consts *c);
/* Row-major C = alpha op(A) op(B) + beta C in a fixed order, `batch` products at element
 * strides sA, sB, sC: each element one sequential fused multiply-add chain over k = 0..K-1
 * (gemm_ordered.cu), so its bits depend on K and the data alone, not on M, N or the launch
 * — the canonical and row-stable modes' GEMM. beta == 0 never reads C. */
void loom_cuda_sgemm_ordered(int transa, int transb, int M, int N, int K, float alpha,
                             const float *A, int lda, long long sA, const float *B, int ldb,
                             long long sB, float beta, float *C, int ldc, long long sC, int batch);
/* gemm.c: the same contract through cuBLAS (mode 0) or the ordered GEMM (modes 1, 2). */
void loom_cuda_gemm_batched(int transa, int transb, int M, int N, int K, float alpha,
                            const float *A, int lda, long long sA, const float *B, int ldb,
                            long long sB, float beta, float *C, int ldc, long long sC, int batch);
/* gemm.c: cuBLAS (mode 0) or the ordered GEMM. */
void loom_cuda_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc);
void loom_cuda_matmul_forward(float *out, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C, int OC);
/* matmul_forward with inp and weight holding only dt values (backend.h matmul_forward_dt):
 * 16-bit operands, fp32 accumulation, fp32 out. */
void loom_cuda_matmul_forward_dt(float *out, const float *inp, const float *weight,
                                 const float *bias, int B, int T, int C, int OC, loom_dtype dt);
/* gemm_ordered.cu: the ordered GEMM over bf16 / fp16 operands A, B (one product, fp32 C). */
void loom_cuda_gemm_ordered16(int transa, int transb, int M, int N, int K, float alpha,
                              const void *A, int lda, const void *B, int ldb, float beta,
                              float *C, int ldc, loom_dtype dt);
void loom_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int B, int T, int C,
                               int OC);
/* backend.h matmul_backward_dt: bf16 in fast mode with LOOM_CUDA_BF16_BWD on, dout split
 * into hi + lo bf16 (split16.cu), 16-bit products with fp32 accumulation; else -1. */
int loom_cuda_matmul_backward_dt(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const void *weight, int weight_bits, int B,
                                 int T, int C, int OC, loom_dtype dt);
/* backend.h gemm_w16: C = A W^T, W the bf16 / fp16 bits, A fp32 holding dt values; fast mode
 * only (else -1). */
int loom_cuda_gemm_w16(int M, int N, int K, const float *A, int lda, const void *W, int ldw,
                       float *C, int ldc, loom_dtype dt);
/* split16.cu: hi (n bf16) = bf16(x), lo (n bf16) = bf16(x - hi); lo 0 where hi is not finite. */
void loom_cuda_split_bf16(void *hi, void *lo, const float *x, size_t n);
/* The same of cols columns of x's rows (ldx floats apart), packed (rows, cols). */
void loom_cuda_split_bf16_cols(void *hi, void *lo, const float *x, size_t rows, size_t cols,
                               size_t ldx);

#ifdef __cplusplus
}
#endif
#endif
