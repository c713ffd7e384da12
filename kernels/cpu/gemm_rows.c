/* gemm_rows.c — a row-stable product for generation with a key/value cache: out = inp @ W^T
 * (+ bias) where every output element's bits depend only on K and the two rows it reads,
 * never on how many rows the call has, the thread count or the blocking. A one-token
 * decode step (M = 1) then gives exactly the row a full forward (M = T) gives — what the
 * cache's bitwise test (tests/unit/test_kv_cache.c) needs — at the speed of a dot-product
 * kernel instead of gemm.c's 8-row micro-tile (7/8 of it padding at M = 1).
 *
 * Order of operations for C[i][j] = alpha * dot(A[i,:], W[j,:]) (+ beta C[i][j]): eight
 * partial sums, s[p mod 8] += a_p * w_p for p = 0, 1, ..., K-1 in order (a fused
 * multiply-add where the clone has FMA: -ffp-contract=fast), then
 * ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), times alpha, then beta 0: stored,
 * beta 1: added to C. The bias of a linear layer is that beta-1 C. The same on any machine
 * with the same ISA clone; a different sum from gemm.c's (so not canonical mode's bits).
 * It does not do the other transposes: loom_cpu_sgemm_rows falls back to loom_cpu_sgemm
 * for them (generation only runs NT products).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <string.h>

enum { RB = 2, CB = 4 }; /* rows of A x rows of W per block: 8 dot products at once */

/* The dot products of rows [i0, i0+ni) of A with rows [j0, j0+nj) of W (ni <= RB,
 * nj <= CB), each in the order of the opening comment. */
LOOM_CPU_CLONES static void dot_block(float *C, int ldc, const float *A, int lda, const float *W,
                                      int ldw, int i0, int ni, int j0, int nj, int K,
                                      float alpha, float beta)
{
    float s[RB][CB][8];
    memset(s, 0, sizeof s);
    const int K8 = K & ~7;
    for (int p = 0; p < K8; p += 8)
        for (int i = 0; i < RB; i++)
            for (int j = 0; j < CB; j++) {
                const float *a = A + (size_t)(i0 + (i < ni ? i : 0)) * lda + p;
                const float *w = W + (size_t)(j0 + (j < nj ? j : 0)) * ldw + p;
#pragma omp simd
                for (int l = 0; l < 8; l++)
                    s[i][j][l] += a[l] * w[l];
            }
    for (int p = K8; p < K; p++)
        for (int i = 0; i < RB; i++)
            for (int j = 0; j < CB; j++)
                s[i][j][p - K8] += A[(size_t)(i0 + (i < ni ? i : 0)) * lda + p] *
                                   W[(size_t)(j0 + (j < nj ? j : 0)) * ldw + p];
    for (int i = 0; i < ni; i++)
        for (int j = 0; j < nj; j++) {
            const float *v = s[i][j];
            const float d = alpha * (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])));
            float *c = C + (size_t)(i0 + i) * ldc + j0 + j;
            *c = beta == 0.0f ? d : *c + d;
        }
}

void loom_cpu_sgemm_rows(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (transa || !transb || (beta != 0.0f && beta != 1.0f) || K <= 0) {
        loom_cpu_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const int nib = (M + RB - 1) / RB, njb = (N + CB - 1) / CB;
#pragma omp parallel for schedule(static) if ((size_t)M * N * K > 8 * LOOM_CPU_PAR_MIN)
    for (int blk = 0; blk < nib * njb; blk++) {
        const int i0 = blk / njb * RB, j0 = blk % njb * CB;
        dot_block(C, ldc, A, lda, B, ldb, i0, M - i0 < RB ? M - i0 : RB, j0,
                  N - j0 < CB ? N - j0 : CB, K, alpha, beta);
    }
}

void loom_cpu_matmul_forward_rows(float *out, const float *inp, const float *weight,
                                  const float *bias, int B, int T, int C, int OC)
{
    /* out (B,T,OC), inp (B,T,C), weight (OC,C), bias (OC) or NULL */
    const int BT = B * T;
    if (bias)
        for (int bt = 0; bt < BT; bt++)
            memcpy(out + (size_t)bt * OC, bias, (size_t)OC * sizeof(float));
    loom_cpu_sgemm_rows(0, 1, BT, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}
