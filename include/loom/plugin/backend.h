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

    /* out (B,T,C) = wte[inp[b,t]] + wpe[t]. */
    void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe,
                            int B, int T, int C);
    /* dwte, dwpe += scatter of dout (B,T,C). */
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp,
                             int B, int T, int C);
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
    /* Fused softmax + cross-entropy over logits (B*T rows of Vp, only the first V real).
     * losses[i] = -log softmax(logits[i,:V])[targets[i]]. If dloss != 0, logits is
     * overwritten with its gradient dloss * (softmax - onehot), zero in the padded
     * columns V..Vp-1 (llm.c's fused classifier); otherwise logits are left intact.
     * A target outside [0,V) is ignored (loss 0, gradient 0). */
    void (*crossentropy_forward_backward)(float *logits, float *losses, const int *targets,
                                          float dloss, int BT, int V, int Vp);
    /* Sum of squares of n values, accumulated in double (for the grad norm). */
    double (*sum_squares)(const float *x, size_t n);
    /* 1 if any of n values is inf or nan. */
    int (*has_nonfinite)(const float *x, size_t n);
    /* x *= s over n values. */
    void (*scale)(float *x, float s, size_t n);
} loom_backend_ops;

#ifdef __cplusplus
}
#endif
#endif
