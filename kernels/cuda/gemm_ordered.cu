/* gemm_ordered.cu — the fixed-order GEMM of canonical mode (cuda_common.h). 16x16 tiles
 * through shared memory; each thread owns one element and adds its products one k at a
 * time, in k order, with fmaf from +0: acc = fma(a_k, b_k, acc). Tiles change where operands
 * come from, never that order, so an element's bits depend on K and its row and column
 * alone (a row computed in a one-row product equals it inside a larger one). Trailing zero
 * terms leave the chain unchanged (fma(0, b, acc) = acc for finite b), which the causal
 * attention relies on (its att rows are zero past the diagonal). Slow, and meant to be:
 * the fast path is cuBLAS.
 * The 16-bit variant (loom_cuda_gemm_ordered16) reads bf16 or fp16 operands and widens each
 * as it loads the tile (exact), then runs the same chain: on operands that hold the same
 * values its bits are the fp32 kernel's, which keeps canonical mode's layout invariance
 * when the model's bf16 products read 16-bit operands.
 */
#include "kernels.cuh"
#include "widen16.cuh"

enum { OT = 16 };

/* E: float, or loom_bf16 / loom_f16 (widen16.cuh), widened by loom_widen as loaded. */
template <typename E>
__global__ void ordered_kernel(int transa, int transb, int M, int N, int K, float alpha,
                               const E *A, int lda, long long sA, const E *B, int ldb,
                               long long sB, float beta, float *C, int ldc, long long sC)
{
    __shared__ float as[OT][OT + 1], bs[OT][OT + 1];
    A += sA * blockIdx.z;
    B += sB * blockIdx.z;
    C += sC * blockIdx.z;
    const int row = blockIdx.y * OT + threadIdx.y, col = blockIdx.x * OT + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += OT) {
        /* as[y][x] = op(A)[row, k0+x]; bs[y][x] = op(B)[k0+y, col] */
        const int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        float a = 0.0f, b = 0.0f;
        if (row < M && ka < K)
            a = loom_widen(transa ? A[(size_t)ka * lda + row] : A[(size_t)row * lda + ka]);
        if (col < N && kb < K)
            b = loom_widen(transb ? B[(size_t)col * ldb + kb] : B[(size_t)kb * ldb + col]);
        as[threadIdx.y][threadIdx.x] = a;
        bs[threadIdx.y][threadIdx.x] = b;
        __syncthreads();
        const int kn = K - k0 < OT ? K - k0 : OT;
        for (int kk = 0; kk < kn; kk++)
            acc = fmaf(as[threadIdx.y][kk], bs[kk][threadIdx.x], acc);
        __syncthreads();
    }
    if (row < M && col < N) {
        float *c = C + (size_t)row * ldc + col;
        *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
    }
}

extern "C" void loom_cuda_sgemm_ordered(int transa, int transb, int M, int N, int K, float alpha,
                                        const float *A, int lda, long long sA, const float *B,
                                        int ldb, long long sB, float beta, float *C, int ldc,
                                        long long sC, int batch)
{
    if (M <= 0 || N <= 0 || batch <= 0)
        return;
    dim3 grid((N + OT - 1) / OT, (M + OT - 1) / OT, batch), block(OT, OT);
    LOOM_CUDA_LAUNCH("gemm (ordered)", ordered_kernel<float>, grid, block, 0, transa, transb, M,
                     N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC);
}

extern "C" void loom_cuda_gemm_ordered16(int transa, int transb, int M, int N, int K, float alpha,
                                         const void *A, int lda, const void *B, int ldb,
                                         float beta, float *C, int ldc, loom_dtype dt)
{
    if (M <= 0 || N <= 0)
        return;
    dim3 grid((N + OT - 1) / OT, (M + OT - 1) / OT, 1), block(OT, OT);
    if (dt == LOOM_DTYPE_F16)
        LOOM_CUDA_LAUNCH("gemm (ordered, fp16)", ordered_kernel<loom_f16>, grid, block, 0,
                         transa, transb, M, N, K, alpha, (const loom_f16 *)A, lda, 0LL,
                         (const loom_f16 *)B, ldb, 0LL, beta, C, ldc, 0LL);
    else
        LOOM_CUDA_LAUNCH("gemm (ordered, bf16)", ordered_kernel<loom_bf16>, grid, block, 0,
                         transa, transb, M, N, K, alpha, (const loom_bf16 *)A, lda, 0LL,
                         (const loom_bf16 *)B, ldb, 0LL, beta, C, ldc, 0LL);
}
