/* matmul.c — the linear layer: out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC).
 *
 * All products go through loom_cpu_sgemm (OpenBLAS, or gemm.c's fallback), row-major:
 *   forward   out   = inp  @ W^T           GEMM  NT  (BT x OC x C)
 *   backward  dinp  = dout @ W             GEMM  NN  (BT x C x OC)    OVERWRITTEN
 *             dW   += dout^T @ inp         GEMM  TN  (OC x C x BT)    ACCUMULATES (beta 1)
 *             dbias += sum over rows of dout                          ACCUMULATES
 * Input gradients overwrite (dinp skipped if NULL); parameter gradients accumulate
 * (dbias skipped if NULL). The bias is written into out before the GEMM and the GEMM adds
 * onto it (beta 1), saving a pass over out. dbias is bias.c's loom_cpu_bias_backward
 * (each column summed over the rows in order: same result for any thread count).
 * In canonical mode (loom_cpu_set_deterministic, blas.c) every product here gives each
 * output element bits that depend only on K and the data, so splitting OC (forward's
 * columns, dweight's rows) across ranks reproduces the unsplit layer's bits.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <string.h>

void loom_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                             int B, int T, int C, int OC)
{
    /* out (B,T,OC), inp (B,T,C), weight (OC,C), bias (OC) or NULL */
    const int BT = B * T;
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)BT * OC > LOOM_CPU_PAR_MIN)
        for (int bt = 0; bt < BT; bt++)
            memcpy(out + (size_t)bt * OC, bias, (size_t)OC * sizeof(float));
    }
    loom_cpu_sgemm(0, 1, BT, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

void loom_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int B, int T, int C, int OC)
{
    /* dinp (B,T,C) = or NULL, dweight (OC,C) +=, dbias (OC) += or NULL, dout (B,T,OC),
     * inp (B,T,C), weight (OC,C) */
    const int BT = B * T;
    if (dinp)
        loom_cpu_sgemm(0, 0, BT, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    loom_cpu_sgemm(1, 0, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias)
        loom_cpu_bias_backward(dbias, dout, (size_t)BT, OC);
}
