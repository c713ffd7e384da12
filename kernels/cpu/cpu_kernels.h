/* cpu_kernels.h — the CPU reference kernels, one op per file in kernels/cpu/.
 *
 * Same parameter order and semantics as loom_backend_ops (include/loom/plugin/backend.h):
 * shapes in (B,T,C) legends, linear weights (OC,C), parameter gradients accumulate (+=),
 * input gradients overwrite. OpenMP parallelises over rows where it pays. GEMMs go
 * through loom_cpu_sgemm (blas.c), which uses OpenBLAS when it loads and checks out and a
 * blocked fallback otherwise.
 */
#ifndef LOOM_CPU_KERNELS_H
#define LOOM_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* isa.c: the instruction set the kernels run (isa.c's header) -------------------------- */
enum { LOOM_CPU_ISA_SSE2 = 0, LOOM_CPU_ISA_AVX2 = 1, LOOM_CPU_ISA_AVX512 = 2 };
/* Reads LOOM_CPU_ISA (once per process). Returns 0, or -1 with a one-line reason in err
 * (len bytes) when it names an unknown ISA or one this CPU lacks. */
int loom_cpu_isa_init(char *err, size_t len);
/* The level in use, LOOM_CPU_ISA_*: LOOM_CPU_ISA if accepted, else the best cpuid reports. */
int loom_cpu_isa(void);
/* The best level this CPU has (cpuid), whatever LOOM_CPU_ISA says. */
int loom_cpu_isa_best(void);
/* "sse2", "avx2", "avx512" ("base" off x86-64). */
const char *loom_cpu_isa_name(int isa);
/* The level in use for a banner: "avx2", or "sse2 (LOOM_CPU_ISA; cpu has avx2)". */
const char *loom_cpu_isa_describe(void);

/* blas.c ------------------------------------------------------------------------------ */
/* Load and check the GEMM path once per process. threads <= 0 means "all cores". Writes a
 * one-line description (e.g. "OpenBLAS 0.3.21 (openmp) core=SkylakeX threads=2 isa=avx512")
 * into desc. Returns 0 on success (a fallback GEMM is a success too; the description says
 * so), -1 if LOOM_CPU_ISA is refused (desc is then the reason) or the GEMM failed its check. */
int loom_cpu_blas_init(int threads, char *desc, size_t desc_len);
/* Row-major C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, as cblas_sgemm with
 * CblasRowMajor. transa/transb: 0 = as stored, 1 = transposed. */
void loom_cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* Canonical mode on (on != 0) or off, for the whole process: on, loom_cpu_sgemm always runs
 * loom_cpu_sgemm_fallback, whose every output element is the same sequence of operations
 * whatever M, N, the leading dimensions and the thread count (only K, alpha, beta and the
 * data decide it; gemm.c's header gives the order), so a matmul split by output columns
 * (or dweight by rows) across ranks gives the bits of the unsplit one. Off (the default):
 * OpenBLAS when it loaded, the fastest path. */
void loom_cpu_set_deterministic(int on);
int loom_cpu_deterministic(void);

/* gemm.c ------------------------------------------------------------------------------ */
/* loom's own blocked, OpenMP-parallel GEMM (same contract as loom_cpu_sgemm): what
 * loom_cpu_sgemm runs when OpenBLAS is missing or fails its check. */
void loom_cpu_sgemm_fallback(int transa, int transb, int M, int N, int K, float alpha,
                             const float *A, int lda, const float *B, int ldb, float beta,
                             float *C, int ldc);
/* loom_cpu_sgemm_fallback on the micro-kernel of ISA level isa (LOOM_CPU_ISA_*), for tests
 * that compare the ISAs in one process; a level above loom_cpu_isa_best() runs SSE2's. */
void loom_cpu_sgemm_on(int isa, int transa, int transb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc);
/* The fallback's micro-kernel here: "avx512 8x32", "avx2 6x16", "sse2 6x8" (ISA, tile). */
const char *loom_cpu_sgemm_fallback_isa(void);

/* gemm_chunks.c: canonical mode's chunk tree of products in one call (backend.h's
 * gemm_chunk_tree; on loom's GEMM, the ISA of loom_cpu_isa()). */
void loom_cpu_gemm_chunk_tree(int transa, int transb, int M, int N, int chunks, int segs,
                              const int *start, const int *width, const float *A, int lda,
                              const float *B, int ldb, float *C, int ldc, float *const *levels);
/* rep_tree.c: canonical mode's chunk tree of a layer norm's (kind 0) or a bias's (kind 1)
 * gradient in one call (backend.h's rep_chunk_tree) */
void loom_cpu_rep_chunk_tree(int kind, float *part, float *scratch, int chunks, float *dinp,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, size_t rows, int C);
/* Checks C = alpha op(A) op(B) + beta C0 against a double-precision reference. Returns the
 * worst |C - ref| / (|alpha| sum_k |a_ik b_kj| + |beta c0_ij|) over all elements (infinity
 * for a non-finite element); a correct float GEMM stays below LOOM_CPU_SGEMM_TOL. C0 and
 * C share ldc. */
double loom_cpu_sgemm_check(int transa, int transb, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta,
                            const float *C0, const float *C, int ldc);
#define LOOM_CPU_SGEMM_TOL 1e-4

/* encoder.c: the vocabulary-sliced embedding and the positions (backend.h). */
void loom_cpu_embedding_forward(float *out, const int *inp, const float *wte, int v0, int Vl,
                                size_t rows, int C);
void loom_cpu_embedding_backward(float *dwte, const float *dout, const int *inp, int v0, int Vl,
                                 size_t rows, int C);
void loom_cpu_position_forward(float *out, const float *wpe, size_t row0, size_t rows, int T, int C);
void loom_cpu_position_backward(float *dwpe, const float *dout, int B, int T, int C);

/* layernorm.c */
void loom_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int B, int T, int C);
void loom_cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int B, int T, int C);
/* matmul.c */
void loom_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                             int B, int T, int C, int OC);
void loom_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int B, int T, int C, int OC);
/* attention.c */
void loom_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH);
void loom_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                 const float *att, int B, int T, int C, int NH);
/* attention_decode.c */
void loom_cpu_attention_decode(float *out, float *att, size_t att_stride, const float *qkv, int t,
                               int C, int NH);
/* attention.c, attention_decode.c: grouped-query attention (KVH kv heads; backend.h) */
void loom_cpu_attention_gqa_forward(float *out, float *att, const float *qkv, int B, int T,
                                    int C, int NH, int KVH);
/* attention_backward plus datt_extra (B,NH,T,T), a gradient of the probabilities added
 * before the softmax backward (backend.h's attention_backward_datt). */
void loom_cpu_attention_backward_datt(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *att,
                                      const float *datt_extra, int B, int T, int C, int NH);
void loom_cpu_attention_gqa_backward(float *dqkv, float *scratch, const float *dout,
                                     const float *qkv, const float *att, int B, int T, int C,
                                     int NH, int KVH);
void loom_cpu_attention_gqa_decode(float *out, float *att, size_t att_stride, const float *qkv,
                                   int t, int C, int NH, int KVH);
/* rmsnorm.c */
void loom_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                              size_t rows, int C, float eps);
void loom_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, size_t rows, int C);
/* swiglu.c */
void loom_cpu_swiglu_forward(float *out, const float *inp, size_t rows, int F);
void loom_cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, size_t rows, int F);
/* rope.c */
void loom_cpu_rope_forward(float *x, const float *cos, const float *sin, size_t row0, size_t rows,
                           int T, int stride, int heads, int hs);
void loom_cpu_rope_backward(float *dx, const float *cos, const float *sin, size_t row0,
                            size_t rows, int T, int stride, int heads, int hs);
/* gelu.c */
void loom_cpu_gelu_forward(float *out, const float *inp, size_t n);
void loom_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* residual.c */
void loom_cpu_residual_forward(float *out, const float *a, const float *b, size_t n);
void loom_cpu_accumulate(float *acc, const float *x, size_t n);
/* bias.c: matmul_backward's dbias is loom_cpu_bias_backward */
void loom_cpu_bias_add(float *out, const float *bias, size_t rows, int cols);
void loom_cpu_bias_backward(float *dbias, const float *dout, size_t rows, int cols);
/* crossentropy.c: the vocabulary-parallel passes (the file's header gives the math and
 * ce_row_sumexp's summation order) */
void loom_cpu_ce_row_max(float *row_max, const float *logits, int BT, int Vl, int col0, int V);
void loom_cpu_ce_row_sumexp(float *sumexp, const float *logits, const float *row_max, int BT,
                            int Vl, int col0, int V, int c0, int c1);
void loom_cpu_ce_target_logit(float *tlogit, const float *logits, const int *targets, int BT,
                              int Vl, int col0);
void loom_cpu_ce_finish(float *logits, float *losses, const float *row_max, const float *sumexp,
                        const float *tlogit, const int *targets, float dloss, int BT, int Vl,
                        int col0, int V);
/* reduce.c */
double loom_cpu_sum_squares(const float *x, size_t rows, size_t cols, size_t stride);
int loom_cpu_has_nonfinite(const float *x, size_t n);
void loom_cpu_scale(float *x, float s, size_t n);
/* gemm_bf16.c: C (M,N) = A (M,K, fp32 holding bf16 values) @ W^T (W: N,K bf16 bits) on
 * AVX512_BF16's vdpbf16ps, fp32 accumulation; the file's header gives the order and how its
 * bits differ from widening + sgemm. Returns -1 (C untouched) where unavailable. */
int loom_cpu_gemm_bf16_available(void);
/* available, and LOOM_CPU_BF16DOT=all: the backend's backward products go through it too */
int loom_cpu_gemm_bf16_backward_wanted(void);
int loom_cpu_gemm_bf16(int M, int N, int K, const float *A, int lda, const uint16_t *W,
                       int ldw, float *C, int ldc);
/* the same with W fp32 holding bf16 values (narrowed exactly as packed) */
int loom_cpu_gemm_bf16_f32w(int M, int N, int K, const float *A, int lda, const float *W,
                            int ldw, float *C, int ldc);
/* C (M,N) = (beta ? C : 0) + op(A) (M,K) @ op(B) (K,N), cblas_sgemm's transposes and
 * leading dimensions; A any fp32 (each value split into two bf16, hi + lo: the header),
 * B holding bf16 values, as fp32 (Bf) or bits (Bh); beta 0 or 1. */
int loom_cpu_gemm_bf16_split(int transa, int transb, int M, int N, int K, const float *A,
                             int lda, const float *Bf, const uint16_t *Bh, int ldb, int beta,
                             float *C, int ldc);
/* matmul_backward (dinp, dweight may be NULL) with inp and weight holding bf16 values, weight
 * fp32 or (weight_bits) bf16 bits: the product above in fast mode where available; returns
 * -1, nothing written, in canonical mode or where unavailable */
int loom_cpu_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const void *weight, int weight_bits, int B,
                                  int T, int C, int OC);
/* matmul_forward with inp and weight holding bf16 values: the product above in fast mode
 * where available, else loom_cpu_matmul_forward (canonical mode: always) */
void loom_cpu_matmul_forward_bf16(float *out, const float *inp, const float *weight,
                                  const float *bias, int B, int T, int C, int OC);
/* rows.c: a mixture-of-experts layer's row moves (plugin/backend.h: rows_gather ...) */
void loom_cpu_rows_gather(float *out, const float *inp, const int *idx, const float *scale,
                          size_t n, int C);
void loom_cpu_rows_scatter_add(float *out, const float *inp, const int *idx, const float *scale,
                               size_t n, int C);
void loom_cpu_rows_dot(float *out, const float *a, const int *idx, const float *b, size_t n, int C);
/* convert.c: fp32 <-> bf16 / fp16, round to nearest even (the file's header: the edges) */
uint16_t loom_cpu_bf16_from_f32(float f);
float loom_cpu_bf16_to_f32(uint16_t h);
uint16_t loom_cpu_f16_from_f32(float f);
float loom_cpu_f16_to_f32(uint16_t h);
void loom_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void loom_cpu_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void loom_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void loom_cpu_f16_to_f32_n(float *dst, const uint16_t *src, size_t n);
/* dst = the value a bf16 / fp16 store of src keeps (dst may be src) */
void loom_cpu_round_bf16(float *dst, const float *src, size_t n);
void loom_cpu_round_f16(float *dst, const float *src, size_t n);

#endif
