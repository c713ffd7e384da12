/* layernorm.cu — LayerNorm over the last dim, eps = 1e-5 (kernels/cpu/layernorm.c has the
 * math): forward saves mean and rstd; backward OVERWRITES dinp and ACCUMULATES dweight,
 * dbias. One block per row; two-pass variance. The parameter gradients (colsum.cuh, fixed
 * order) run before dinp, so dinp may alias dout as on the CPU.
 */
#include "colsum.cuh"

#define LN_EPS 1e-5f
enum { LN_THREADS = 256 };

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int C)
{
    const size_t row = blockIdx.x;
    const float *x = inp + row * C;
    float s = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        s += x[i];
    const float m = loom_block_sum(s) / C;
    float v = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        v += (x[i] - m) * (x[i] - m);
    const float r = 1.0f / sqrtf(loom_block_sum(v) / C + LN_EPS);
    float *o = out + row * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = (x[i] - m) * r * w[i] + b[i];
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

__global__ void layernorm_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                      const float *w, const float *mean, const float *rstd, int C)
{
    const size_t row = blockIdx.x;
    const float *x = inp + row * C, *d = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgn = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        const float g = w[i] * d[i];
        sg += g;
        sgn += g * (x[i] - m) * r;
    }
    sg = loom_block_sum(sg) / C;
    sgn = loom_block_sum(sgn) / C;
    float *dx = dinp + row * C; /* each thread reads d[i] before it writes dx[i] */
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        dx[i] = r * (w[i] * d[i] - sg - (x[i] - m) * r * sgn);
}

__global__ void layernorm_params_kernel(float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *mean, const float *rstd,
                                        size_t rows, int C)
{
    colsum2(rows, C,
            [=] __device__(size_t r, int c, float *dw, float *db) {
                const float d = dout[r * C + c];
                *dw = (inp[r * C + c] - mean[r]) * rstd[r] * d;
                *db = d;
            },
            dweight, dbias);
}

extern "C" void loom_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                            const float *weight, const float *bias, int B, int T,
                                            int C)
{
    const unsigned rows = (unsigned)B * T;
    if (rows == 0)
        return;
    LOOM_CUDA_LAUNCH("layernorm_forward", layernorm_forward_kernel, rows, LN_THREADS, 0, out,
                     mean, rstd, inp, weight, bias, C);
}

extern "C" void loom_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                             const float *dout, const float *inp,
                                             const float *weight, const float *mean,
                                             const float *rstd, int B, int T, int C)
{
    const unsigned rows = (unsigned)B * T;
    if (rows == 0)
        return;
    dim3 block(COLSUM_COLS, COLSUM_LANES);
    LOOM_CUDA_LAUNCH("layernorm_backward (parameters)", layernorm_params_kernel,
                     (C + COLSUM_COLS - 1) / COLSUM_COLS, block, 0, dweight, dbias, dout, inp,
                     mean, rstd, (size_t)rows, C);
    LOOM_CUDA_LAUNCH("layernorm_backward (input)", layernorm_dinp_kernel, rows, LN_THREADS, 0, dinp,
                     dout, inp, weight, mean, rstd, C);
}
