/* crossentropy.cu — the vocabulary-parallel cross-entropy passes (kernels/cpu/crossentropy.c
 * has the math and the contract; the padding columns are never read). One block per row.
 * ce_row_sumexp adds in double in a fixed tree over the columns [c0, c1): its bits depend on
 * the row's values in that range alone (not on BT, Vl or the launch), so canonical mode's
 * fixed column chunks give the same bits in every layout — though not the CPU's bits (the
 * CPU adds in column order). ce_finish writes the gradient in place: the probabilities are
 * formed once, from the combined statistics, never stored.
 */
#include "kernels.cuh"

enum { CE_THREADS = 512 };

static __device__ inline int real_cols(int Vl, int col0, int V)
{
    const long n = (long)V - col0;
    return n <= 0 ? 0 : n >= Vl ? Vl : (int)n;
}

__global__ void row_max_kernel(float *row_max, const float *logits, int Vl, int col0, int V)
{
    const float *x = logits + (size_t)blockIdx.x * Vl;
    const int n = real_cols(Vl, col0, V);
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        m = fmaxf(m, x[j]);
    m = loom_block_max(m);
    if (threadIdx.x == 0)
        row_max[blockIdx.x] = m;
}

__global__ void row_sumexp_kernel(float *sumexp, const float *logits, const float *row_max, int Vl,
                                  int c0, int c1)
{
    const float *x = logits + (size_t)blockIdx.x * Vl;
    const float m = row_max[blockIdx.x];
    double s = 0.0;
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x)
        s += (double)expf(x[j] - m);
    s = loom_block_sum(s);
    if (threadIdx.x == 0)
        sumexp[blockIdx.x] = (float)s;
}

__global__ void target_logit_kernel(float *tlogit, const float *logits, const int *targets, int BT,
                                    int Vl, int col0)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT)
        return;
    const long j = (long)targets[i] - col0;
    tlogit[i] = j >= 0 && j < Vl ? logits[(size_t)i * Vl + j] : 0.0f;
}

__global__ void finish_kernel(float *logits, float *losses, const float *row_max,
                              const float *sumexp, const float *tlogit, const int *targets,
                              float dloss, int Vl, int col0, int V)
{
    const int i = blockIdx.x, y = targets[i], n = real_cols(Vl, col0, V);
    float *x = logits + (size_t)i * Vl;
    if (y < 0 || y >= V) {
        if (threadIdx.x == 0)
            losses[i] = 0.0f;
        if (dloss != 0.0f)
            for (int j = threadIdx.x; j < Vl; j += blockDim.x)
                x[j] = 0.0f;
        return;
    }
    const float m = row_max[i], s = sumexp[i];
    if (threadIdx.x == 0)
        losses[i] = logf(s) + (m - tlogit[i]);
    if (dloss == 0.0f)
        return;
    const float k = dloss / s;
    const long jy = (long)y - col0;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        float g = j < n ? loom_flush(expf(x[j] - m) * k) : 0.0f;
        if (j == jy)
            g -= dloss;
        x[j] = g;
    }
}

extern "C" void loom_cuda_ce_row_max(float *row_max, const float *logits, int BT, int Vl, int col0,
                                     int V)
{
    if (BT > 0)
        LOOM_CUDA_LAUNCH("ce_row_max", row_max_kernel, BT, CE_THREADS, 0, row_max, logits, Vl,
                         col0, V);
}

extern "C" void loom_cuda_ce_row_sumexp(float *sumexp, const float *logits, const float *row_max,
                                        int BT, int Vl, int col0, int V, int c0, int c1)
{
    const long nl = (long)V - col0;
    const int n = nl <= 0 ? 0 : nl >= Vl ? Vl : (int)nl;
    if (c0 < 0)
        c0 = 0;
    if (c1 > n)
        c1 = n;
    if (c1 < c0)
        c1 = c0;
    if (BT > 0)
        LOOM_CUDA_LAUNCH("ce_row_sumexp", row_sumexp_kernel, BT, CE_THREADS, 0, sumexp, logits,
                         row_max, Vl, c0, c1);
}

extern "C" void loom_cuda_ce_target_logit(float *tlogit, const float *logits, const int *targets,
                                          int BT, int Vl, int col0)
{
    if (BT > 0)
        LOOM_CUDA_LAUNCH("ce_target_logit", target_logit_kernel, loom_cuda_blocks((size_t)BT),
                         LOOM_CUDA_THREADS, 0, tlogit, logits, targets, BT, Vl, col0);
}

extern "C" void loom_cuda_ce_finish(float *logits, float *losses, const float *row_max,
                                    const float *sumexp, const float *tlogit, const int *targets,
                                    float dloss, int BT, int Vl, int col0, int V)
{
    if (BT > 0)
        LOOM_CUDA_LAUNCH("ce_finish", finish_kernel, BT, CE_THREADS, 0, logits, losses, row_max,
                         sumexp, tlogit, targets, dloss, Vl, col0, V);
}
