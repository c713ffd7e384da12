/* llama.cu — the llama family's row ops (kernels/cpu/rmsnorm.c, swiglu.c, rope.c have the
 * math and the contracts; backend.h's rmsnorm_*, swiglu_*, rope_*), fp32.
 *
 * RMSNorm: one block per row, the sum of squares in loom_block_sum's fixed tree; backward
 * runs the weight's column sums first (colsum.cuh: fixed order, no atomics), so dinp may
 * alias dout as on the CPU. SwiGLU and RoPE: one thread per output value (per rotated pair
 * for RoPE, in place), grid-stride; rows are independent, so the bits are the same for any
 * launch.
 */
#include "colsum.cuh"

enum { RMS_THREADS = 256 };

__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp, const float *w,
                                       int C, float eps)
{
    const size_t row = blockIdx.x;
    const float *x = inp + row * C;
    float s = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        s += x[i] * x[i];
    const float r = 1.0f / sqrtf(loom_block_sum(s) / C + eps);
    float *o = out + row * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = x[i] * r * w[i];
    if (threadIdx.x == 0)
        rstd[row] = r;
}

/* dinp_i = rstd (g_i - n_i mean_j(g_j n_j)), g = w dout, n = x rstd. */
__global__ void rmsnorm_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                    const float *w, const float *rstd, int C)
{
    const size_t row = blockIdx.x;
    const float *x = inp + row * C, *d = dout + row * C;
    const float r = rstd[row];
    float sgn = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        sgn += w[i] * d[i] * x[i] * r;
    sgn = loom_block_sum(sgn) / C;
    float *dx = dinp + row * C; /* each thread reads d[i] before it writes dx[i] */
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        dx[i] = r * (w[i] * d[i] - x[i] * r * sgn);
}

__global__ void rmsnorm_params_kernel(float *dweight, const float *dout, const float *inp,
                                      const float *rstd, size_t rows, int C)
{
    colsum2(rows, C,
            [=] __device__(size_t r, int c, float *dw, float *unused) {
                *dw = inp[r * C + c] * rstd[r] * dout[r * C + c];
                *unused = 0.0f;
            },
            dweight, (float *)NULL);
}

extern "C" void loom_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                          const float *weight, size_t rows, int C, float eps)
{
    if (rows == 0)
        return;
    LOOM_CUDA_LAUNCH("rmsnorm_forward", rmsnorm_forward_kernel, (unsigned)rows, RMS_THREADS, 0,
                     out, rstd, inp, weight, C, eps);
}

extern "C" void loom_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                           const float *inp, const float *weight,
                                           const float *rstd, size_t rows, int C)
{
    if (rows == 0)
        return;
    dim3 block(COLSUM_COLS, COLSUM_LANES);
    LOOM_CUDA_LAUNCH("rmsnorm_backward (weight)", rmsnorm_params_kernel,
                     (C + COLSUM_COLS - 1) / COLSUM_COLS, block, 0, dweight, dout, inp, rstd, rows,
                     C);
    LOOM_CUDA_LAUNCH("rmsnorm_backward (input)", rmsnorm_dinp_kernel, (unsigned)rows, RMS_THREADS,
                     0, dinp, dout, inp, weight, rstd, C);
}

/* sigmoid(g); e^{-g} overflows to inf for g < -88, giving exactly 0, the right limit. */
__device__ inline float swiglu_sigmoid(float g)
{
    return 1.0f / (1.0f + expf(-g));
}

__global__ void swiglu_forward_kernel(float *out, const float *inp, size_t rows, int F)
{
    GRID_STRIDE(i, rows * F)
    {
        const size_t r = i / F, j = i % F;
        const float g = inp[r * 2 * F + j], u = inp[r * 2 * F + F + j];
        out[i] = loom_flush(g * swiglu_sigmoid(g) * u);
    }
}

__global__ void swiglu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                       size_t rows, int F)
{
    GRID_STRIDE(i, rows * F)
    {
        const size_t r = i / F, j = i % F;
        const float g = inp[r * 2 * F + j], u = inp[r * 2 * F + F + j];
        const float s = swiglu_sigmoid(g), d = dout[i];
        dinp[r * 2 * F + j] = loom_flush(d * u * s * (1.0f + g * (1.0f - s)));
        dinp[r * 2 * F + F + j] = loom_flush(d * g * s);
    }
}

extern "C" void loom_cuda_swiglu_forward(float *out, const float *inp, size_t rows, int F)
{
    const size_t n = rows * F;
    if (n == 0)
        return;
    LOOM_CUDA_LAUNCH("swiglu_forward", swiglu_forward_kernel, loom_cuda_blocks(n),
                     LOOM_CUDA_THREADS, 0, out, inp, rows, F);
}

extern "C" void loom_cuda_swiglu_backward(float *dinp, const float *inp, const float *dout,
                                          size_t rows, int F)
{
    const size_t n = rows * F;
    if (n == 0)
        return;
    LOOM_CUDA_LAUNCH("swiglu_backward", swiglu_backward_kernel, loom_cuda_blocks(n),
                     LOOM_CUDA_THREADS, 0, dinp, inp, dout, rows, F);
}

/* One thread per pair (i, i + hs/2) of one head of one row; sign -1: the inverse rotation. */
__global__ void rope_kernel(float *x, const float *cos, const float *sin, size_t row0,
                            size_t rows, int T, int stride, int heads, int hs, float sign)
{
    const int half = hs / 2;
    const size_t per_row = (size_t)heads * half;
    GRID_STRIDE(n, rows * per_row)
    {
        const size_t r = n / per_row, h = (n % per_row) / half, i = n % half;
        const size_t p = (row0 + r) % (size_t)T;
        float *a = x + r * stride + h * hs;
        const float c = cos[p * half + i], sn = sign * sin[p * half + i];
        const float x0 = a[i], x1 = a[i + half];
        a[i] = x0 * c - x1 * sn;
        a[i + half] = x1 * c + x0 * sn;
    }
}

static void rope(const char *what, float *x, const float *cos, const float *sin, size_t row0,
                 size_t rows, int T, int stride, int heads, int hs, float sign)
{
    const size_t n = rows * heads * (size_t)(hs / 2);
    if (n == 0)
        return;
    LOOM_CUDA_LAUNCH(what, rope_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS, 0, x, cos, sin,
                     row0, rows, T, stride, heads, hs, sign);
}

extern "C" void loom_cuda_rope_forward(float *x, const float *cos, const float *sin, size_t row0,
                                       size_t rows, int T, int stride, int heads, int hs)
{
    rope("rope_forward", x, cos, sin, row0, rows, T, stride, heads, hs, 1.0f);
}

extern "C" void loom_cuda_rope_backward(float *dx, const float *cos, const float *sin,
                                        size_t row0, size_t rows, int T, int stride, int heads,
                                        int hs)
{
    rope("rope_backward", dx, cos, sin, row0, rows, T, stride, heads, hs, -1.0f);
}
