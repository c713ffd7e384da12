/* plugin/backend.h — the kernel backend: one table of forward/backward ops per device
 * type. kernels/cpu builds loom-backend-cpu.so (the reference); kernels/cuda builds
 * loom-backend-cuda.so where nvcc is found.
 *
 * Conventions (llm.c's): activations are (B,T,C) row-major fp32; a linear layer's weight
 * is (OC,C) (out features by in features) and computes out = inp @ w^T + bias.
 * Backward semantics: parameter gradients ACCUMULATE (+=) so micro-batches add up;
 * input gradients OVERWRITE. Every pointer is device memory of this backend. Kernels do
 * not allocate; the caller passes scratch where one is needed.
 */
#ifndef LOOM_PLUGIN_BACKEND_H
#define LOOM_PLUGIN_BACKEND_H

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW step's per-element constants, computed once per step on the host by the
 * optimizer plugin (plugins/optim/adamw/adamw.c has the math): g = gs * grad; m and v
 * updated with lerp weight w (1 - b1) and b2; p = p * decay - step_size * m / (sqrt(v) /
 * bc2_sqrt + eps). */
typedef struct loom_adamw_consts {
    float gs, decay, b2, one_minus_b2, step_size, bc2_sqrt, eps;
    float w, one_minus_w; /* lerp weight 1 - b1, and 1 - w as float, as ATen's lerp has it */
} loom_adamw_consts;

/* One SGD step's constants (plugins/optim/sgd/sgd.c): g = gs * grad + wd * p; with
 * momentum mu > 0, b = mu * b + g and d = nesterov ? g + mu * b : b; p -= lr * d. */
typedef struct loom_sgd_consts {
    float lr, gs, wd, mu;
    int nesterov;
} loom_sgd_consts;

typedef struct loom_backend_ops {
    size_t size;
    /* Start the backend (threads, BLAS, device). One instance per process. */
    loom_status (*create)(const loom_host *host, const loom_config *cfg, void **self);
    void (*destroy)(void *self);
    /* One line for the start-up banner, e.g. "cpu: OpenBLAS 0.3.21 SkylakeX, 2 threads". */
    const char *(*describe)(void *self);

    /* Memory. alloc returns zeroed memory or NULL. */
    void *(*alloc)(void *self, size_t bytes);
    void (*free)(void *self, void *p);
    void (*copy_to_device)(void *self, void *dst, const void *src, size_t bytes);
    void (*copy_to_host)(void *self, void *dst, const void *src, size_t bytes);
    void (*zero)(void *self, void *p, size_t bytes);
    /* Wait for all queued work (no-op on CPU). */
    void (*synchronize)(void *self);

    /* Token embedding over a vocabulary slice: wte holds rows [v0, v0+Vl) of the
     * (padded) table. out (rows,C) = the row of inp[i] where held, 0 elsewhere (so the
     * slices' outputs sum to the full lookup). One rank: v0 = 0, Vl = Vp. */
    void (*embedding_forward)(float *out, const int *inp, const float *wte, int v0, int Vl,
                              size_t rows, int C);
    /* dwte (Vl,C) += dout rows of the held tokens, in row order. */
    void (*embedding_backward)(float *dwte, const float *dout, const int *inp, int v0, int Vl,
                               size_t rows, int C);
    /* out (rows,C) += wpe[(row0 + i) % T] for row i: positions of rows [row0, row0+rows)
     * of a (B,T) micro-batch (a sequence-parallel shard or all of it). */
    void (*position_forward)(float *out, const float *wpe, size_t row0, size_t rows, int T, int C);
    /* dwpe (T,C) += sum over b of dout[b,t] (B,T,C), b in order. */
    void (*position_backward)(float *dwpe, const float *dout, int B, int T, int C);
    /* out (B,T,C), mean and rstd (B,T) saved for backward. eps = 1e-5. */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int B, int T, int C);
    /* dinp (B,T,C) overwritten; dweight, dbias (C) accumulate. */
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int B, int T, int C);
    /* out (B,T,OC) = inp (B,T,C) @ weight(OC,C)^T + bias(OC); bias may be NULL. */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int B, int T, int C, int OC);
    /* dinp (B,T,C) overwritten (skipped if NULL); dweight (OC,C), dbias (OC) accumulate
     * (dbias skipped if NULL). */
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int B, int T, int C, int OC);
    /* Row-major C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, with leading
     * dimensions (cblas_sgemm's contract): for products over a slice of a dimension, such
     * as canonical mode's fixed chunks of a row-parallel layer's input features. */
    void (*gemm)(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc);
    /* Causal multi-head self-attention. qkv (B,T,3C) holds q,k,v side by side; out (B,T,C);
     * att (B,NH,T,T) softmax probabilities saved for backward. */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    /* dqkv (B,T,3C) overwritten. scratch: 2*B*NH*T*T floats. */
    void (*attention_backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);
    /* GELU, tanh approximation (Hendrycks & Gimpel 2016), over n values. */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    /* dinp overwritten = gelu'(inp) * dout. */
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    /* out = a + b over n values (a residual connection). */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    /* acc += x over n values: a residual's gradient joining the main path. */
    void (*accumulate)(float *acc, const float *x, size_t n);
    /* Cross-entropy over the vocabulary, in passes, so that ranks each holding a slice of
     * the vocabulary's columns (tensor parallelism's vocabulary-parallel head) can combine
     * the row statistics between passes and never gather full logits. logits (BT,Vl) are
     * this rank's columns [col0, col0+Vl) of the padded vocabulary; a column is real if its
     * global index is < V, padding otherwise (never predicted: no probability, gradient 0).
     * With one rank col0 = 0, Vl = Vp.
     * 1. row_max[i] = max of row i over real columns (-INFINITY if this slice has none). */
    void (*ce_row_max)(float *row_max, const float *logits, int BT, int Vl, int col0, int V);
    /* 2. sumexp[i] = sum over real columns j in [c0, c1) (local indices) of
     *    exp(logits[i,j] - row_max[i]), walked in order (overwrites). Canonical mode sums
     *    fixed column chunks separately and adds the chunk sums in a fixed tree. */
    void (*ce_row_sumexp)(float *sumexp, const float *logits, const float *row_max, int BT,
                          int Vl, int col0, int V, int c0, int c1);
    /*    tlogit[i] = logits[i, targets[i] - col0] if this slice holds the target, else 0
     *    (overwrites; summed over ranks, exactly one contributes). */
    void (*ce_target_logit)(float *tlogit, const float *logits, const int *targets, int BT,
                            int Vl, int col0);
    /* 3. losses[i] = log(sumexp[i]) + row_max[i] - tlogit[i] (the combined statistics).
     *    If dloss != 0, logits is overwritten with dloss * (softmax - onehot) over real
     *    columns and 0 over padding; otherwise left intact. A target outside [0,V) is
     *    ignored (loss 0, gradient 0). */
    void (*ce_finish)(float *logits, float *losses, const float *row_max, const float *sumexp,
                      const float *tlogit, const int *targets, float dloss, int BT, int Vl,
                      int col0, int V);
    /* out (rows,cols) += bias (cols) on every row: a row-parallel layer's bias, added once
     * after its partial sums are combined. */
    void (*bias_add)(float *out, const float *bias, size_t rows, int cols);
    /* dbias (cols) += column sums of dout (rows,cols), each column summed over rows in
     * order (the same bits for any thread count). */
    void (*bias_backward)(float *dbias, const float *dout, size_t rows, int cols);
    /* Sum of squares, accumulated in double, of `rows` rows of `cols` values, row r at
     * x + r*stride (a contiguous buffer: rows 1, cols = stride = n). The bits depend only
     * on the values and (rows, cols), not on the stride, alignment or thread count. */
    double (*sum_squares)(const float *x, size_t rows, size_t cols, size_t stride);
    /* 1 if any of n values is inf or nan. */
    int (*has_nonfinite)(const float *x, size_t n);
    /* x *= s over n values. */
    void (*scale)(float *x, float s, size_t n);
    /* Canonical mode (on != 0): every matmul computes each output element as the same
     * sequence of operations whatever M, N and the thread count are (only K and the data
     * decide it), so a layer split by columns across ranks gives the bits of the unsplit
     * one. Off: the fastest GEMM available. on == 2 (generation with a key/value cache):
     * row-stable — each element of matmul_forward and of gemm's A @ B^T products (the ones
     * a forward runs) depends only on K and the rows it reads, not on M, so a one-row
     * product gives the bits of that row in a larger one;
     * a backend without a faster way treats it as 1, which has that property too. */
    void (*set_deterministic)(void *self, int on);
    /* Added for generation with a key/value cache (members from here on may be absent: check
     * size). Causal attention of query row t over rows 0..t of qkv (t+1, 3C), one sequence:
     * out (C) and each head h's probabilities, t+1 floats at att + h*att_stride. Must give
     * the bits attention_forward gives row t of a (1, t+1) sequence (incremental decoding
     * is then bitwise the full recompute). */
    void (*attention_decode)(float *out, float *att, size_t att_stride, const float *qkv, int t,
                             int C, int NH);
    /* The backend's compute stream as an opaque handle (a cudaStream_t for CUDA), for a comm
     * plugin's create(device): its communication stream waits on it with events. NULL or
     * absent (check size) for a host-memory backend. */
    void *(*stream)(void *self);
    /* Added for mixture-of-experts layers (core/model/moe.c; absent: check size). idx[i]
     * is a row of the (rows, C) side; scale may be NULL (1).
     * out (n,C) = scale[i] * inp[idx[i]] (overwrites). */
    void (*rows_gather)(float *out, const float *inp, const int *idx, const float *scale,
                        size_t n, int C);
    /* out[idx[i]] += scale[i] * inp[i] (rows,C), rows added in i order (fixed bits). */
    void (*rows_scatter_add)(float *out, const float *inp, const int *idx, const float *scale,
                             size_t n, int C);
    /* out[i] = a[idx[i]] . b[i] over C, summed in column order (overwrites). */
    void (*rows_dot)(float *out, const float *a, const int *idx, const float *b, size_t n, int C);
    /* Added for Llama-style blocks (members from here on may be absent: check size; the
     * model refuses the llama family on a backend without them).
     * RMSNorm (Zhang & Sennrich 2019): out (rows,C) = x * rstd * weight with
     * rstd = 1 / sqrt(mean(x^2) + eps) per row, saved (rows) for backward. */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                            size_t rows, int C, float eps);
    /* dinp (rows,C) overwritten (may alias dout); dweight (C) accumulates, each column
     * summed over rows in order. */
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, size_t rows, int C);
    /* SwiGLU (Shazeer 2020): inp (rows,2F) = [gate | up] per row; out (rows,F) =
     * silu(gate) * up. */
    void (*swiglu_forward)(float *out, const float *inp, size_t rows, int F);
    /* dinp (rows,2F) overwritten from dout (rows,F). */
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, size_t rows, int F);
    /* Rotary position embedding (Su et al. 2021) in Hugging Face Llama's rotate_half layout
     * (element i of a head pairs with i + hs/2), in place over the first `heads` heads of hs
     * values of each row of `stride` floats; row i is at position (row0 + i) % T; cos, sin
     * (positions, hs/2) the angle cache, p * theta^(-2i/hs). backward applies the inverse
     * rotation to a gradient, in place. */
    void (*rope_forward)(float *x, const float *cos, const float *sin, size_t row0, size_t rows,
                         int T, int stride, int heads, int hs);
    void (*rope_backward)(float *dx, const float *cos, const float *sin, size_t row0,
                          size_t rows, int T, int stride, int heads, int hs);
    /* Grouped-query attention (Ainslie et al. 2023): as attention_forward/backward/decode
     * with KVH key/value heads (KVH divides NH; KVH = NH is multi-head attention, with its
     * bits). qkv rows are C + 2 KC wide, KC = KVH * (C / NH): q (C), k (KC), v (KC); q head
     * h reads kv head h / (NH / KVH). dqkv overwritten; scratch 2*B*NH*T*T floats. */
    void (*attention_gqa_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                                  int NH, int KVH);
    void (*attention_gqa_backward)(float *dqkv, float *scratch, const float *dout,
                                   const float *qkv, const float *att, int B, int T, int C,
                                   int NH, int KVH);
    void (*attention_gqa_decode)(float *out, float *att, size_t att_stride, const float *qkv,
                                 int t, int C, int NH, int KVH);
    /* Added for mixed precision (may be absent: check size). dt is LOOM_DTYPE_BF16 or
     * LOOM_DTYPE_F16; rounding is to nearest, ties to even; overflow gives inf, NaN stays a
     * (quiet) NaN; widening is exact. dst (n 16-bit values) = src narrowed to dt. */
    void (*convert_from_f32)(void *dst, const float *src, size_t n, loom_dtype dt);
    /* dst (n floats) = src (n values of dt) widened. */
    void (*convert_to_f32)(float *dst, const void *src, size_t n, loom_dtype dt);
    /* dst (n) = src narrowed to dt and widened again (dst may be src: in place): the value
     * a dt store keeps, so a kernel reading it computes on what a 16-bit activation or
     * weight would hold. */
    void (*round_to)(float *dst, const float *src, size_t n, loom_dtype dt);
    /* Added for optimizers over device memory (may be absent: check size; plugin/optim.h's
     * step_backend calls them). One segment's update in place, element by element, in the
     * optimizer plugin's own float expressions with its host-computed constants: each
     * operation rounded once, as IEEE fp32 (no fused multiply-add), so the bits equal the
     * plugin's host step. A host-memory backend leaves both NULL (the core calls the
     * plugin's own step there). AdamW: m, v the two state slots (n each). */
    void (*adamw_update)(float *param, const float *grad, float *m, float *v, size_t n,
                         const loom_adamw_consts *c);
    /* SGD: buf the momentum buffer (n; unused, may be NULL, when c->mu == 0). */
    void (*sgd_update)(float *param, const float *grad, float *buf, size_t n,
                       const loom_sgd_consts *c);
    /* Added for 16-bit products (may be absent: check size, or NULL: use matmul_forward).
     * matmul_forward's contract, with the caller's promise that inp and weight hold only
     * values of dt (LOOM_DTYPE_BF16 or F16; the model rounded them, so narrowing is exact):
     * the backend may multiply dt operands with fp32 accumulation (out stays fp32). A
     * value outside dt would be rounded, so the promise is the caller's to keep. */
    void (*matmul_forward_dt)(float *out, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C, int OC, loom_dtype dt);
    /* Causal attention as attention_forward/backward computes it, without the (B,NH,T,T)
     * matrices (a fused online-softmax kernel; may be absent: check size, or NULL). qkv
     * (B,T,3C) holds fp32 values (dt LOOM_DTYPE_F32) or 16-bit ones (BF16, F16); the
     * arithmetic is fp32. out (B,T,C) fp32; lse (B,NH,T) each query row's log-sum-exp of
     * its scaled scores, saved for backward. backward: dqkv (B,T,3C) overwritten, fp32;
     * out and lse as forward wrote them; scratch B*NH*T floats. */
    void (*attention_flash_forward)(float *out, float *lse, const void *qkv, int B, int T, int C,
                                    int NH, loom_dtype dt);
    void (*attention_flash_backward)(float *dqkv, float *scratch, const float *dout,
                                     const void *qkv, const float *out, const float *lse, int B,
                                     int T, int C, int NH, loom_dtype dt);
    /* Added for canonical mode's chunk trees (may be absent: check size; the core then
     * makes the gemm and accumulate calls this stands for, which give the same bits).
     * C (M,N; leading dim ldc) = op(A) (M,K) @ op(B) (K,N) summed in `chunks` parts (a
     * power of two), added pairwise as a binary counter (older += newer): part c is, for
     * segment s = 0 .. segs-1 in order, gemm(alpha 1, beta s ? 1 : 0) over the K indices
     * [start[s] + c*width[s], + width[s]) (the fused QKV's q, k, v parts of chunk c), into
     * tree level popcount(c): C itself, then levels[0 ..] (log2(chunks) scratch buffers
     * of M*N floats, leading dim N). Bits: those of that sequence in canonical mode. */
    void (*gemm_chunk_tree)(int transa, int transb, int M, int N, int chunks, int segs,
                            const int *start, const int *width, const float *A, int lda,
                            const float *B, int ldb, float *C, int ldc, float *const *levels);
    /* Added for 16-bit weights read as stored (may be absent: check size, or NULL). C (M,N,
     * leading dimension ldc) = A (M,K, lda, holding only dt values) @ W^T, W (N,K, ldw) the
     * dt bits themselves; beta 0. Returns 0, or -1 (C untouched) where the backend has no
     * such product for dt now (the CPU's: bf16 on AVX512_BF16 in fast mode): widen and gemm. */
    int (*gemm_w16)(int M, int N, int K, const float *A, int lda, const void *W, int ldw,
                    float *C, int ldc, loom_dtype dt);
    /* Added for distillation's attention terms (may be absent: check size, or NULL: those
     * terms are refused on the backend). attention_backward with datt_extra (B,NH,T,T), a
     * further gradient of the probabilities att, added to dout's datt = dO V^T before the
     * softmax backward; entries above the diagonal meet att = 0 and change nothing. */
    void (*attention_backward_datt)(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, const float *datt_extra,
                                    int B, int T, int C, int NH);
    /* Added for 16-bit backward products (may be absent: check size, or NULL).
     * matmul_backward's contract, dinp and dweight each may be NULL (skipped), where inp and
     * weight hold only dt values (dout: any fp32); weight is fp32 holding them or, with
     * weight_bits, the dt bits themselves. Returns 0, or -1 (nothing written) where the
     * backend has no such product for dt now (the CPU's: bf16 on AVX512_BF16 in fast mode,
     * each fp32 gradient split into two bf16 so the products stay fp32-accurate): then call
     * matmul_backward or gemm. */
    int (*matmul_backward_dt)(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const void *weight, int weight_bits, int B,
                              int T, int C, int OC, loom_dtype dt);
    /* Added for canonical mode's replicated gradients (may be absent: check size, or NULL;
     * the core then makes the calls this stands for, which give the same bits). part (n
     * floats: kind 0 [dweight | dbias], n = 2C; kind 1 [dbias], n = C) = the sum over
     * `chunks` chunks of rc = rows/chunks rows (chunk c: rows [c rc, (c+1) rc)) added as a
     * binary counter (older += newer), chunk c being layernorm_backward (kind 0, also
     * writing dinp's rows; B = 1, T = rc) or bias_backward (kind 1) over its rows into zeroed
     * floats. scratch: (chunks - 1) n floats. Bits: those of that sequence. */
    void (*rep_chunk_tree)(int kind, float *part, float *scratch, int chunks, float *dinp,
                           const float *dout, const float *inp, const float *weight,
                           const float *mean, const float *rstd, size_t rows, int C);
    /* Added for the offloaded optimizer (may be absent: check size, or NULL: malloc and
     * free). Zeroed host memory the backend copies to and from at full speed (CUDA: pinned,
     * cudaHostAlloc), for buffers that move every step; NULL if it cannot be had. */
    void *(*host_alloc)(void *self, size_t bytes);
    void (*host_free)(void *self, void *p);
    /* Added for distillation in device memory (may be absent: check size, or NULL: a teacher
     * is refused on the backend; a host-memory backend leaves it NULL, the core computes the
     * term itself). core/model/gpt_distill.h's loom_kd_rows over device arrays: R rows of zs
     * (stride s_stride) and zt (t_stride), V columns; loss (R doubles) = T^2 KL(p_t || p_s)
     * per row, p = softmax(z / T); grad (may be NULL; stride s_stride) = scale * T (p_s - p_t)
     * in columns < V, 0 in [V, s_stride). Each row in the core's order of operations (double,
     * column order, no contraction), so the bits are the core's where exp and log are. */
    void (*kd_rows)(const float *zs, size_t s_stride, const float *zt, size_t t_stride,
                    size_t R, int V, float T, float scale, double *loss, float *grad);
    /* Added for ZeRO stages 2 and 3 in device memory (may be absent: check size, or NULL:
     * not supported, and the model's buffers stay whole allocations). A sparse buffer, as
     * PyTorch's expandable segments: vm_reserve returns `bytes` (rounded up to the granule)
     * of address space with no memory behind it, or NULL; vm_commit backs [off, off+len)
     * with memory (its contents undefined: the caller writes before it reads), returning 0,
     * or nonzero when it cannot (out of memory; the range left as it was); vm_decommit hands
     * [off, off+len) back (a later access faults); vm_release frees the range and whatever
     * of it is committed. off and len are multiples of vm_granule (bytes; 0: not available
     * on this machine, the others not to be called); the caller
     * commits a granule once and decommits it once (zero_sparse.c counts who holds it).
     * CUDA: the driver's virtual memory management (kernels/cuda/vmm.c); cudaemu: mmap,
     * mprotect and madvise(MADV_DONTNEED), so the emulated run's RSS drops. */
    size_t (*vm_granule)(void *self);
    void *(*vm_reserve)(void *self, size_t bytes);
    int (*vm_commit)(void *self, void *base, size_t off, size_t len);
    void (*vm_decommit)(void *self, void *base, size_t off, size_t len);
    void (*vm_release)(void *self, void *base);
    /* Added for 16-bit attention (may be absent: check size, or NULL: attention_forward /
     * _backward). Their contracts (att as attention_forward sizes it, read only by this
     * backward), with the caller's promise that qkv holds only values of dt (LOOM_DTYPE_BF16
     * or F16; the model rounded it): the backend may multiply dt operands with fp32
     * accumulation, and round P, dO and dS to dt (the CUDA backend's tensor-core fused
     * attention does, with LOOM_CUDA_ATTENTION=flash in fast mode). */
    void (*attention_forward_dt)(float *out, float *att, const float *qkv, int B, int T, int C,
                                 int NH, loom_dtype dt);
    void (*attention_backward_dt)(float *dqkv, float *scratch, const float *dout,
                                  const float *qkv, const float *att, int B, int T, int C,
                                  int NH, loom_dtype dt);
    /* Added for 16-bit grouped-query attention (may be absent: check size, or NULL: the
     * _gqa ops). attention_flash_gqa_forward / _backward: attention_flash_forward /
     * _backward with KVH key/value heads in attention_gqa_forward's qkv layout (rows
     * C + 2 KVH C/NH wide; dqkv so too), for bf16 and fp16 q, k, v (the CUDA backend: heads
     * of 16 to 64 values, a multiple of 16, on its tensor-core kernels; other shapes are an
     * error it records, KVH = NH excepted: the multi-head op); each kv head's dK, dV sums its
     * query heads' terms in a fixed order (the same bits every run). attention_gqa_forward_dt /
     * _backward_dt: attention_forward_dt / _backward_dt's contract for the _gqa ops. */
    void (*attention_flash_gqa_forward)(float *out, float *lse, const void *qkv, int B, int T,
                                        int C, int NH, int KVH, loom_dtype dt);
    void (*attention_flash_gqa_backward)(float *dqkv, float *scratch, const float *dout,
                                         const void *qkv, const float *out, const float *lse,
                                         int B, int T, int C, int NH, int KVH, loom_dtype dt);
    void (*attention_gqa_forward_dt)(float *out, float *att, const float *qkv, int B, int T,
                                     int C, int NH, int KVH, loom_dtype dt);
    void (*attention_gqa_backward_dt)(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *att, int B, int T, int C,
                                      int NH, int KVH, loom_dtype dt);
    /* Added for sizing att by the path the attention takes (may be absent: check size, or
     * NULL: the batched path's, att (B,NH,T,T) and the backward's scratch (2,B,NH,T,T)).
     * The floats att and the backward's scratch need for attention_forward(_dt) /
     * attention_gqa_forward(_dt) (KVH = NH: the multi-head ops; dt F32: the fp32 ones) of
     * this shape in the backend's current mode (set_deterministic): the CUDA backend's fused
     * kernels (LOOM_CUDA_ATTENTION=flash) keep lse (B,NH,T) and out's copy (B,T,C) and their
     * backward (B,NH,T) floats of scratch. Neither op's att is then probabilities. */
    void (*attention_sizes)(void *self, int B, int T, int C, int NH, int KVH, loom_dtype dt,
                            size_t *att, size_t *scratch);
    /* Added for distillation's attention term beside the fused kernels (may be absent: check
     * size, or NULL: the backend's attention never leaves the batched path, or a term that
     * reads probabilities is refused where att holds fused state). allow 0: until allow 1,
     * every attention op above (attention_forward / _backward and their _dt and _gqa forms)
     * and attention_sizes take the batched path, att the (B,NH,T,T) probabilities, as
     * without LOOM_CUDA_ATTENTION=flash; allow 1 (the state create leaves): the backend
     * picks the path. The model turns it off around the calls of the blocks whose
     * probabilities a term reads (gpt_internal.h gpt_attention_fwd), the rest stay fused. */
    void (*attention_allow_fused)(void *self, int allow);
} loom_backend_ops;

#ifdef __cplusplus
}
#endif
#endif
