/* gemm.c — the GEMMs of the CUDA backend, in fp32 with fp32 accumulation (cuBLAS compute
 * type 32F, never TF32): matmul_forward through cuBLASLt with the bias epilogue, the other
 * products through cuBLAS. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
 * so every row-major call passes B before A with M and N swapped. In canonical and
 * row-stable modes (set_deterministic 1, 2) every product runs the ordered GEMM instead
 * (gemm_ordered.cu: each element's bits depend on K and the data alone) and the bias is a
 * separate add, as on the CPU.
 * Gradients: dinp OVERWRITTEN, dweight and dbias ACCUMULATE (beta 1, bias_backward adds).
 */
#include "cuda_common.h"

#include <stdint.h>
#include <stdio.h>

#ifndef LOOM_CUDA_EMU
#include <cublasLt.h>
#include <cublas_v2.h>
#endif

#ifndef LOOM_CUDA_EMU
static int blas_ok(cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 1;
    char d[64];
    snprintf(d, sizeof d, "cuBLAS status %d (%s)", (int)st, cublasGetStatusString(st));
    loom_cuda_note_error(what, d);
    return 0;
}

#endif
void loom_cuda_gemm_batched(int transa, int transb, int M, int N, int K, float alpha,
                            const float *A, int lda, long long sA, const float *B, int ldb,
                            long long sB, float beta, float *C, int ldc, long long sC, int batch)
{
    if (M <= 0 || N <= 0 || batch <= 0)
        return;
#ifndef LOOM_CUDA_EMU
    if (loom_cuda.deterministic) {
#else /* tests/cuda/emu has no cuBLAS: every product is the ordered one */
    {
#endif
        loom_cuda_sgemm_ordered(transa, transb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C,
                                ldc, sC, batch);
        return;
    }
#ifndef LOOM_CUDA_EMU
    cublasHandle_t h = (cublasHandle_t)loom_cuda.blas;
    const cublasOperation_t oa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t ob = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        blas_ok(cublasSgemm(h, ob, oa, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
                "gemm (cublasSgemm)");
    else
        blas_ok(cublasSgemmStridedBatched(h, ob, oa, N, M, K, &alpha, B, ldb, sB, A, lda, sA,
                                          &beta, C, ldc, sC, batch),
                "gemm (cublasSgemmStridedBatched)");
#endif
}

void loom_cuda_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    loom_cuda_gemm_batched(transa, transb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0,
                           1);
}

#ifndef LOOM_CUDA_EMU
/* The alignment a pointer has, up to cuBLASLt's default assumption of 256 bytes: the
 * model's tensors are slices of one buffer, so most are far less aligned than that, and an
 * algorithm chosen for 256 would fault on them. */
static uint32_t alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 4 && (uintptr_t)p % a)
        a >>= 1;
    return a;
}

/* out (R,OC) = inp (R,C) @ W(OC,C)^T (+ bias) as cuBLASLt's column-major
 * D (OC,R) = op_T(W: C x OC, ld C) * inp (C x R, ld C), epilogue BIAS over D's rows. */
static int lt_forward(float *out, const void *inp, const void *weight, const float *bias,
                      int R, int C, int OC, loom_dtype dt)
{
    /* A, B: fp32, or bf16 / fp16 (the 16-bit products); compute, C and D: fp32 */
    const cudaDataType_t ab = dt == LOOM_DTYPE_BF16  ? CUDA_R_16BF
                              : dt == LOOM_DTYPE_F16 ? CUDA_R_16F
                                                     : CUDA_R_32F;
    cublasLtHandle_t lt = (cublasLtHandle_t)loom_cuda.blaslt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int ok = blas_ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                     "matmul_forward (descriptor)");
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    ok = ok && blas_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t),
                       "matmul_forward (transa)");
    ok = ok && blas_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n),
                       "matmul_forward (transb)");
    ok = ok && blas_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                      sizeof epi),
                       "matmul_forward (epilogue)");
    if (bias)
        ok = ok && blas_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &bias, sizeof bias),
                           "matmul_forward (bias)");
    ok = ok && blas_ok(cublasLtMatrixLayoutCreate(&la, ab, C, OC, C), "matmul_forward (A)");
    ok = ok && blas_ok(cublasLtMatrixLayoutCreate(&lb, ab, C, R, C), "matmul_forward (B)");
    ok = ok && blas_ok(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, OC, R, OC), "matmul_forward (D)");
    ok = ok && blas_ok(cublasLtMatmulPreferenceCreate(&pref), "matmul_forward (preference)");
    size_t ws = loom_cuda.lt_workspace_bytes;
    ok = ok && blas_ok(cublasLtMatmulPreferenceSetAttribute(
                           pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                       "matmul_forward (workspace)");
    const uint32_t al[3] = {alignment(weight), alignment(inp), alignment(out)};
    const cublasLtMatmulPreferenceAttributes_t which[3] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 3; i++)
        ok = ok && blas_ok(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i],
                                                                sizeof al[i]),
                           "matmul_forward (alignment)");
    ok = ok && blas_ok(cublasLtMatmulPreferenceSetAttribute(
                           pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]),
                       "matmul_forward (alignment)");
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    ok = ok && blas_ok(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heur, &found),
                       "matmul_forward (heuristic)");
    const float one = 1.0f, zero = 0.0f;
    if (ok && found > 0)
        ok = blas_ok(cublasLtMatmul(lt, op, &one, weight, la, inp, lb, &zero, out, ld, out, ld,
                                    &heur.algo, loom_cuda.lt_workspace, ws, loom_cuda.stream),
                     "matmul_forward (cublasLtMatmul)");
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return ok && found > 0;
}

#else
static int lt_forward(float *out, const void *inp, const void *weight, const float *bias,
                      int R, int C, int OC, loom_dtype dt)
{
    return 0; /* no cuBLASLt: the plain path */
}
#endif

void loom_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                              int B, int T, int C, int OC)
{
    const int R = B * T;
    if (R <= 0 || OC <= 0)
        return;
    if (!loom_cuda.deterministic && lt_forward(out, inp, weight, bias, R, C, OC, LOOM_DTYPE_F32))
        return;
    /* canonical mode, or no cuBLASLt algorithm for this shape: the plain path */
    loom_cuda_sgemm(0, 1, R, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias)
        loom_cuda_bias_add(out, bias, (size_t)R, OC);
}

/* matmul_forward on 16-bit operands (backend.h's matmul_forward_dt): inp and weight hold
 * only values of dt (the model rounded them), so narrowing them into the workspace is
 * exact; the product then reads 2 bytes an operand, multiplies in fp32 (a product of two
 * bf16 or two fp16 values is exact in fp32) and accumulates in fp32: cuBLASLt with A, B in
 * dt and compute, C and D in 32F (bias epilogue) outside canonical mode (cublasGemmEx with the
 * same types where cuBLASLt has no algorithm), the ordered GEMM's 16-bit variant (the fp32
 * kernel's bits on these values) in it. */
void loom_cuda_matmul_forward_dt(float *out, const float *inp, const float *weight,
                                 const float *bias, int B, int T, int C, int OC, loom_dtype dt)
{
    const int R = B * T;
    if (dt != LOOM_DTYPE_BF16 && dt != LOOM_DTYPE_F16) {
        loom_cuda_matmul_forward(out, inp, weight, bias, B, T, C, OC);
        return;
    }
    if (R <= 0 || OC <= 0)
        return;
    /* the workspace: weight (OC,C) then inp (R,C), 16 bits each, the second 256-aligned */
    const size_t nw = (size_t)OC * C, nx = (size_t)R * C, w_bytes = (nw * 2 + 255) & ~(size_t)255;
    unsigned char *ws = loom_cuda_workspace(w_bytes + nx * 2);
    if (!ws)
        return; /* recorded as a sticky error, reported at synchronize */
    void *w16 = ws, *x16 = ws + w_bytes;
    loom_cuda_convert_from_f32(w16, weight, nw, dt);
    loom_cuda_convert_from_f32(x16, inp, nx, dt);
    if (!loom_cuda.deterministic && lt_forward(out, x16, w16, bias, R, C, OC, dt))
        return;
#ifndef LOOM_CUDA_EMU
    if (!loom_cuda.deterministic) { /* no cuBLASLt algorithm for this shape: cuBLAS's */
        const cudaDataType_t ab = dt == LOOM_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        const float one = 1.0f, zero = 0.0f;
        blas_ok(cublasGemmEx((cublasHandle_t)loom_cuda.blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, R, C,
                             &one, w16, ab, C, x16, ab, C, &zero, out, CUDA_R_32F, OC,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "matmul_forward_dt (cublasGemmEx)");
        if (bias)
            loom_cuda_bias_add(out, bias, (size_t)R, OC);
        return;
    }
#endif
    loom_cuda_gemm_ordered16(0, 1, R, OC, C, 1.0f, x16, C, w16, C, 0.0f, out, OC, dt);
    if (bias)
        loom_cuda_bias_add(out, bias, (size_t)R, OC);
}

void loom_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int B, int T, int C, int OC)
{
    const int R = B * T;
    if (R <= 0)
        return;
    if (dinp) /* dinp (R,C) = dout (R,OC) @ W (OC,C) */
        loom_cuda_sgemm(0, 0, R, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    /* dW (OC,C) += dout^T @ inp */
    loom_cuda_sgemm(1, 0, OC, C, R, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias)
        loom_cuda_bias_backward(dbias, dout, (size_t)R, OC);
}
