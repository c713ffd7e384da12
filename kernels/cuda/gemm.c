/* gemm.c — the GEMMs of the CUDA backend, in fp32 with fp32 accumulation (cuBLAS compute
 * type 32F, never TF32): matmul_forward through cuBLASLt with the bias epilogue, the other
 * products through cuBLAS. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
 * so every row-major call passes B before A with M and N swapped. In canonical and
 * row-stable modes (set_deterministic 1, 2) every product runs the ordered GEMM instead
 * (gemm_ordered.cu: each element's bits depend on K and the data alone) and the bias is a
 * separate add, as on the CPU.
 * Gradients: dinp OVERWRITTEN, dweight and dbias ACCUMULATE (beta 1, bias_backward adds).
 * The 16-bit products (bf16 / fp16 operands, fp32 accumulation, fast mode only): the blocks'
 * forward (matmul_forward_dt), the LM head's forward on its 16-bit copy (gemm_w16), and in
 * bf16 the backward products with the fp32 gradient split into hi + lo (matmul_backward_dt;
 * LOOM_CUDA_BF16_BWD=0 leaves them to the SGEMMs). None of it has run on a GPU.
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
    loom_cuda_profile_begin("gemm", M, N, K, batch);
#ifndef LOOM_CUDA_EMU
    if (loom_cuda.deterministic) {
#else /* tests/cuda/emu has no cuBLAS: every product is the ordered one */
    {
#endif
        loom_cuda_sgemm_ordered(transa, transb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C,
                                ldc, sC, batch);
        loom_cuda_profile_end();
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
    loom_cuda_profile_end();
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

/* out (R,OC; leading dimension ldo) = inp (R,C; ldi) @ W(OC,C; ldw)^T (+ bias) as cuBLASLt's
 * column-major D (OC,R) = op_T(W: C x OC, ld ldw) * inp (C x R, ld ldi), epilogue BIAS over
 * D's rows. */
static int lt_forward(float *out, int ldo, const void *inp, int ldi, const void *weight,
                      int ldw, const float *bias, int R, int C, int OC, loom_dtype dt)
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
    ok = ok && blas_ok(cublasLtMatrixLayoutCreate(&la, ab, C, OC, ldw), "matmul_forward (A)");
    ok = ok && blas_ok(cublasLtMatrixLayoutCreate(&lb, ab, C, R, ldi), "matmul_forward (B)");
    ok = ok && blas_ok(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, OC, R, ldo),
                       "matmul_forward (D)");
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
static int lt_forward(float *out, int ldo, const void *inp, int ldi, const void *weight,
                      int ldw, const float *bias, int R, int C, int OC, loom_dtype dt)
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
    loom_cuda_profile_begin("matmul_forward", R, OC, C, 1);
    if (loom_cuda.deterministic ||
        !lt_forward(out, OC, inp, C, weight, C, bias, R, C, OC, LOOM_DTYPE_F32)) {
        /* canonical mode, or no cuBLASLt algorithm for this shape: the plain path */
        loom_cuda_sgemm(0, 1, R, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
        if (bias)
            loom_cuda_bias_add(out, bias, (size_t)R, OC);
    }
    loom_cuda_profile_end();
}

/* matmul_forward on 16-bit operands (backend.h's matmul_forward_dt): inp and weight hold
 * only values of dt (the model rounded them), so narrowing them into the workspace is
 * exact; the product then reads 2 bytes an operand, multiplies in fp32 (a product of two
 * bf16 or two fp16 values is exact in fp32) and accumulates in fp32: cuBLASLt with A, B in
 * dt and compute, C and D in 32F (bias epilogue) outside canonical mode (cublasGemmEx with the
 * same types where cuBLASLt has no algorithm), the ordered GEMM's 16-bit variant (the fp32
 * kernel's bits on these values) in it. */
static void forward_dt(float *out, const float *inp, const float *weight, const float *bias,
                       int R, int C, int OC, loom_dtype dt)
{
    /* the workspace: weight (OC,C) then inp (R,C), 16 bits each, the second 256-aligned */
    const size_t nw = (size_t)OC * C, nx = (size_t)R * C, w_bytes = (nw * 2 + 255) & ~(size_t)255;
    unsigned char *ws = loom_cuda_workspace(w_bytes + nx * 2);
    if (!ws)
        return; /* recorded as a sticky error, reported at synchronize */
    void *w16 = ws, *x16 = ws + w_bytes;
    loom_cuda_convert_from_f32(w16, weight, nw, dt);
    loom_cuda_convert_from_f32(x16, inp, nx, dt);
    if (!loom_cuda.deterministic && lt_forward(out, OC, x16, C, w16, C, bias, R, C, OC, dt))
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
    loom_cuda_profile_begin("matmul_forward_dt", R, OC, C, 1);
    forward_dt(out, inp, weight, bias, R, C, OC, dt);
    loom_cuda_profile_end();
}

void loom_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int B, int T, int C, int OC)
{
    const int R = B * T;
    if (R <= 0)
        return;
    /* the shape of the forward product, batch 2 for its two products (1: no dinp) */
    loom_cuda_profile_begin("matmul_backward", R, OC, C, dinp ? 2 : 1);
    if (dinp) /* dinp (R,C) = dout (R,OC) @ W (OC,C) */
        loom_cuda_sgemm(0, 0, R, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    /* dW (OC,C) += dout^T @ inp */
    loom_cuda_sgemm(1, 0, OC, C, R, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias)
        loom_cuda_bias_backward(dbias, dout, (size_t)R, OC);
    loom_cuda_profile_end();
}

/* Row-major C (M,N) = op(A) op(B) + beta C on 16-bit A and B (dt), fp32 C, accumulation in
 * fp32: cublasGemmEx with A, B in 16BF / 16F and compute and C in 32F (cuBLAS runs it on the
 * tensor cores and picks the algorithm for the operands' actual alignment); in the
 * emulation (no cuBLAS) the ordered GEMM's 16-bit variant, which stands for it there. */
static void gemm16(int transa, int transb, int M, int N, int K, const void *A, int lda,
                   const void *B, int ldb, float beta, float *C, int ldc, loom_dtype dt,
                   const char *what)
{
    if (M <= 0 || N <= 0)
        return;
#ifndef LOOM_CUDA_EMU
    const cudaDataType_t ab = dt == LOOM_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t oa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t ob = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float one = 1.0f;
    blas_ok(cublasGemmEx((cublasHandle_t)loom_cuda.blas, ob, oa, N, M, K, &one, B, ab, ldb, A,
                         ab, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            what);
#else
    (void)what;
    loom_cuda_gemm_ordered16(transa, transb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, dt);
#endif
}

static size_t align256(size_t bytes)
{
    return (bytes + 255) & ~(size_t)255;
}

/* backend.h's gemm_w16: C (M,N) = A (M,K) @ W (N,K)^T with W the 16-bit bits as stored (the
 * LM head's 16-bit copy, gpt_precision.c) and A fp32 holding dt values, narrowed into the
 * workspace (exact). Products of two bf16 or two fp16 values are exact in fp32; the sum is
 * fp32 (cuBLASLt as matmul_forward_dt, cublasGemmEx where it has no algorithm). Canonical
 * and row-stable modes: -1, the model's banded fp32 products keep their bits. */
int loom_cuda_gemm_w16(int M, int N, int K, const float *A, int lda, const void *W, int ldw,
                       float *C, int ldc, loom_dtype dt)
{
    if ((dt != LOOM_DTYPE_BF16 && dt != LOOM_DTYPE_F16) || loom_cuda.deterministic)
        return -1;
    if (M <= 0 || N <= 0)
        return 0;
    void *a16 = loom_cuda_workspace((size_t)M * K * 2);
    if (!a16)
        return -1; /* recorded as a sticky error, reported at synchronize */
    loom_cuda_profile_begin("gemm_w16", M, N, K, 1);
    if (lda == K)
        loom_cuda_convert_from_f32(a16, A, (size_t)M * K, dt);
    else
        for (int i = 0; i < M; i++)
            loom_cuda_convert_from_f32((uint16_t *)a16 + (size_t)i * K, A + (size_t)i * lda,
                                       (size_t)K, dt);
    if (!lt_forward(C, ldc, a16, K, W, ldw, NULL, M, K, N, dt))
        gemm16(0, 1, M, N, K, a16, K, W, ldw, 0.0f, C, ldc, dt, "gemm_w16 (cublasGemmEx)");
    loom_cuda_profile_end();
    return 0;
}

/* backend.h's matmul_backward_dt for bf16 in fast mode (LOOM_CUDA_BF16_BWD, default on): the
 * CPU's contract (kernels/cpu/gemm_bf16.c's header). dout, an fp32 gradient, is split into
 * hi = bf16(x) and lo = bf16(x - hi) (split16.cu); inp and the weight hold bf16 values, so
 * narrowing them is exact (or the weight is given as its bits). Then
 *   dinp  = hi W + lo W           (two products, the second with beta 1),
 *   dW   += hi^T inp + lo^T inp   (beta 1 both),
 * each product of two bf16 values exact in fp32 and summed in fp32: fp32-accurate (within
 * 2^-18 sum |x b| plus the sums' rounding), at twice the products of one bf16 GEMM, on the
 * tensor cores instead of SGEMM. The workspace holds hi and lo (4 bytes an element of dout),
 * inp and the weight in bf16 where needed.
 * Past LOOM_CUDA_SPLIT_CHUNK elements of dout (cuda_common.h; the LM head's d(logits) is
 * R x 50304 at GPT-2) the split goes in pieces that keep every output element one product
 * over its whole sum: dinp by blocks of dout's rows (each dinp row sums over all OC), dW by
 * blocks of dout's columns (each dW row sums over all R rows). The operands of each element's
 * product are the unchunked ones, so the emulation gives the unchunked bits (cuda_ops_emu);
 * on a GPU cuBLAS may pick another kernel for the smaller shapes: fp32 accuracy either way.
 * -1, nothing written: fp16 (its range, 2^-24 to 65504, cannot hold an fp32 gradient's hi and
 * lo without a scale), canonical and row-stable modes (their bits are the ordered fp32
 * chain's over x b, which a sum over hi b and lo b cannot give), LOOM_CUDA_BF16_BWD=0. */
int loom_cuda_matmul_backward_dt(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const void *weight, int weight_bits, int B,
                                 int T, int C, int OC, loom_dtype dt)
{
    if (dt != LOOM_DTYPE_BF16 || loom_cuda.deterministic || !loom_cuda.bf16_bwd)
        return -1;
    const int R = B * T;
    if (R <= 0)
        return 0;
    size_t chunk = loom_cuda_split_chunk_env();
    if (!chunk) { /* create refused it; a test's setenv between calls: say so, use the default */
        loom_cuda_note_error("LOOM_CUDA_SPLIT_CHUNK", "must be a positive integer (elements)");
        chunk = (size_t)1 << 26;
    }
    const size_t nd = (size_t)R * OC;
    /* rows of dout for dinp, columns for dW, per piece: all of them where dout fits */
    const size_t rows = nd <= chunk ? (size_t)R : chunk / OC ? chunk / OC : 1;
    const size_t cols = nd <= chunk ? (size_t)OC : chunk / R ? chunk / R : 1;
    const size_t piece = rows * OC > cols * R ? rows * OC : cols * R;
    const size_t nx = dweight ? (size_t)R * C : 0, half = align256(piece * 2);
    const size_t nw = dinp && !weight_bits ? (size_t)OC * C : 0;
    unsigned char *ws = loom_cuda_workspace(2 * half + align256(nx * 2) + nw * 2);
    if (!ws)
        return -1; /* recorded as a sticky error, reported at synchronize */
    /* the forward product's shape, batch 2 for dinp and dW (1: one of them); its four
     * tensor-core products count as the two the model asks for */
    loom_cuda_profile_begin("matmul_backward_dt", R, OC, C, dinp && dweight ? 2 : 1);
    void *hi = ws, *lo = ws + half, *x16 = ws + 2 * half, *w16 = ws + 2 * half + align256(nx * 2);
    if (nd <= chunk) /* one split serves both: hi and lo are dout's rows and its columns */
        loom_cuda_split_bf16(hi, lo, dout, nd);
    if (dinp) { /* dinp (R,C) = dout (R,OC) @ W (OC,C), by blocks of rows */
        if (weight_bits)
            w16 = (void *)weight;
        else
            loom_cuda_convert_from_f32(w16, weight, nw, dt);
        for (size_t r0 = 0; r0 < (size_t)R; r0 += rows) {
            const int m = (int)((size_t)R - r0 < rows ? (size_t)R - r0 : rows);
            float *dx = dinp + r0 * C;
            if (nd > chunk)
                loom_cuda_split_bf16(hi, lo, dout + r0 * OC, (size_t)m * OC);
            gemm16(0, 0, m, C, OC, hi, OC, w16, C, 0.0f, dx, C, dt, "matmul_backward_dt (dinp)");
            gemm16(0, 0, m, C, OC, lo, OC, w16, C, 1.0f, dx, C, dt, "matmul_backward_dt (dinp)");
        }
    }
    if (dweight) { /* dW (OC,C) += dout^T @ inp, by blocks of dout's columns (dW's rows) */
        loom_cuda_convert_from_f32(x16, inp, nx, dt);
        for (size_t o0 = 0; o0 < (size_t)OC; o0 += cols) {
            const int n = (int)((size_t)OC - o0 < cols ? (size_t)OC - o0 : cols);
            float *dw = dweight + o0 * C;
            if (nd > chunk)
                loom_cuda_split_bf16_cols(hi, lo, dout + o0, (size_t)R, (size_t)n, (size_t)OC);
            gemm16(1, 0, n, C, R, hi, n, x16, C, 1.0f, dw, C, dt, "matmul_backward_dt (dW)");
            gemm16(1, 0, n, C, R, lo, n, x16, C, 1.0f, dw, C, dt, "matmul_backward_dt (dW)");
        }
    }
    if (dbias)
        loom_cuda_bias_backward(dbias, dout, (size_t)R, OC);
    loom_cuda_profile_end();
    return 0;
}
