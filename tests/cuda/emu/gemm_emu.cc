// gemm_emu.cc — the ordered GEMM (kernels/cuda/gemm_ordered.cu) in the emulation. Every
// product of the emulated backend is the ordered one (no cuBLAS on the CPU), and run as the
// kernel (a coroutine per element, two barriers per 16-wide k tile) it was a third of an
// emulated training run's time. Its contract fixes each element's bits: one fmaf chain
// over k = 0..K-1 from +0 in k order, then alpha * acc (+ beta * C), the 16-bit operands
// widened exactly. LOOM_CUDAEMU_GEMM selects how it runs:
//   unset or "direct": that chain computed here, element by element (the same bits);
//   "kernel": the kernel, emulated;
//   "check": both, and any element whose bits differ stops the program, named (cuda_ops_emu
//            runs so: each of its products checks the kernel and this code against each
//            other, and against the CPU backend as before).
#include "cuda_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda_common.h"
#include "widen16.cuh"

extern "C" void loom_emu_kernel_sgemm_ordered(int transa, int transb, int M, int N, int K,
                                              float alpha, const float *A, int lda, long long sA,
                                              const float *B, int ldb, long long sB, float beta,
                                              float *C, int ldc, long long sC, int batch);
extern "C" void loom_emu_kernel_gemm_ordered16(int transa, int transb, int M, int N, int K,
                                               float alpha, const void *A, int lda,
                                               const void *B, int ldb, float beta, float *C,
                                               int ldc, loom_dtype dt);

namespace {
enum mode { DIRECT, KERNEL, CHECK };

mode gemm_mode()
{
    static int m = -1;
    if (m < 0) {
        const char *v = getenv("LOOM_CUDAEMU_GEMM");
        if (!v || !*v || !strcmp(v, "direct"))
            m = DIRECT;
        else if (!strcmp(v, "kernel"))
            m = KERNEL;
        else if (!strcmp(v, "check"))
            m = CHECK;
        else {
            fprintf(stderr, "cuda emu: LOOM_CUDAEMU_GEMM=%s; use direct (the default), kernel "
                    "or check\n", v);
            exit(2);
        }
    }
    return (mode)m;
}

// One product, as ordered_kernel computes each element.
template <typename E>
void direct(int transa, int transb, int M, int N, int K, float alpha, const E *A, int lda,
            const E *B, int ldb, float beta, float *C, int ldc)
{
    for (int row = 0; row < M; row++)
        for (int col = 0; col < N; col++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                float a = loom_widen(transa ? A[(size_t)k * lda + row] : A[(size_t)row * lda + k]);
                float b = loom_widen(transb ? B[(size_t)col * ldb + k] : B[(size_t)k * ldb + col]);
                acc = fmaf(a, b, acc);
            }
            float *c = C + (size_t)row * ldc + col;
            *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
        }
}

// Every element the products wrote, the kernel's (want) against the direct chain's (got).
void compare(const float *want, const float *got, int M, int N, int K, int ldc, long long sC,
             int batch, const char *what)
{
    for (int p = 0; p < batch; p++)
        for (int r = 0; r < M; r++)
            for (int c = 0; c < N; c++) {
                size_t i = (size_t)p * sC + (size_t)r * ldc + c;
                if (memcmp(want + i, got + i, sizeof(float))) {
                    fprintf(stderr, "cuda emu: LOOM_CUDAEMU_GEMM=check: %s (%dx%dx%d) element "
                            "[%d][%d][%d]: kernel %a, direct %a\n", what, M, N, K, p, r, c,
                            (double)want[i], (double)got[i]);
                    abort();
                }
            }
}

size_t c_extent(int M, int ldc, long long sC, int batch)
{
    return (size_t)(batch - 1) * (size_t)sC + (size_t)(M - 1) * ldc + (size_t)ldc;
}
} // namespace

extern "C" void loom_cuda_sgemm_ordered(int transa, int transb, int M, int N, int K, float alpha,
                                        const float *A, int lda, long long sA, const float *B,
                                        int ldb, long long sB, float beta, float *C, int ldc,
                                        long long sC, int batch)
{
    if (M <= 0 || N <= 0 || batch <= 0)
        return;
    const mode m = gemm_mode();
    std::vector<float> before;
    if (m == CHECK) /* C as it was, for the direct run (beta != 0 reads it) */
        before.assign(C, C + c_extent(M, ldc, sC, batch));
    if (m != DIRECT)
        loom_emu_kernel_sgemm_ordered(transa, transb, M, N, K, alpha, A, lda, sA, B, ldb, sB,
                                      beta, C, ldc, sC, batch);
    if (m == KERNEL)
        return;
    float *out = m == CHECK ? before.data() : C;
    for (int p = 0; p < batch; p++)
        direct(transa, transb, M, N, K, alpha, A + sA * p, lda, B + sB * p, ldb, beta,
               out + sC * p, ldc);
    if (m == CHECK)
        compare(C, out, M, N, K, ldc, sC, batch, "sgemm_ordered");
}

extern "C" void loom_cuda_gemm_ordered16(int transa, int transb, int M, int N, int K, float alpha,
                                         const void *A, int lda, const void *B, int ldb,
                                         float beta, float *C, int ldc, loom_dtype dt)
{
    if (M <= 0 || N <= 0)
        return;
    const mode m = gemm_mode();
    std::vector<float> before;
    if (m == CHECK)
        before.assign(C, C + c_extent(M, ldc, 0, 1));
    if (m != DIRECT)
        loom_emu_kernel_gemm_ordered16(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                       ldc, dt);
    if (m == KERNEL)
        return;
    float *out = m == CHECK ? before.data() : C;
    if (dt == LOOM_DTYPE_F16)
        direct(transa, transb, M, N, K, alpha, (const loom_f16 *)A, lda, (const loom_f16 *)B, ldb,
               beta, out, ldc);
    else
        direct(transa, transb, M, N, K, alpha, (const loom_bf16 *)A, lda, (const loom_bf16 *)B,
               ldb, beta, out, ldc);
    if (m == CHECK)
        compare(C, out, M, N, K, ldc, 0, 1, "gemm_ordered16");
}
