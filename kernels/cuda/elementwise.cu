/* elementwise.cu — GELU (tanh approximation, computed as x * sigmoid(2u) like
 * kernels/cpu/gelu.c), residual, accumulate, scale, and the bias add and its gradient.
 * GELU backward, residual and scale OVERWRITE; accumulate, bias_add and bias_backward add.
 * Subnormal GELU results are flushed to 0 as on the CPU. bias_backward sums rows in a fixed
 * order (colsum.cuh).
 */
#include "colsum.cuh"

#define GELU_K 0.7978845608028654f
#define GELU_A 0.044715f

__global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n) {
        const float x = inp[i], u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = loom_flush(x / (1.0f + expf(-2.0f * u)));
    }
}

__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    GRID_STRIDE(i, n) {
        const float x = inp[i], u = GELU_K * (x + GELU_A * x * x * x);
        const float s = 1.0f / (1.0f + expf(-2.0f * u));
        const float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = loom_flush((s + x * 2.0f * s * (1.0f - s) * du) * dout[i]);
    }
}

__global__ void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float *acc, const float *x, size_t n)
{
    GRID_STRIDE(i, n) acc[i] += x[i];
}

__global__ void scale_kernel(float *x, float s, size_t n)
{
    GRID_STRIDE(i, n) x[i] *= s;
}

__global__ void bias_add_kernel(float *out, const float *bias, size_t rows, int cols)
{
    GRID_STRIDE(i, rows * (size_t)cols) out[i] += bias[i % cols];
}

__global__ void bias_backward_kernel(float *dbias, const float *dout, size_t rows, int cols)
{
    colsum2(rows, cols,
            [=] __device__(size_t r, int c, float *a, float *b) {
                *a = dout[r * cols + c];
                *b = 0.0f;
            },
            dbias, (float *)0);
}

extern "C" void loom_cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    if (n)
        LOOM_CUDA_LAUNCH("gelu_forward", gelu_forward_kernel, loom_cuda_blocks(n),
                         LOOM_CUDA_THREADS, 0, out, inp, n);
}

extern "C" void loom_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (n)
        LOOM_CUDA_LAUNCH("gelu_backward", gelu_backward_kernel, loom_cuda_blocks(n),
                         LOOM_CUDA_THREADS, 0, dinp, inp, dout, n);
}

extern "C" void loom_cuda_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    if (n)
        LOOM_CUDA_LAUNCH("residual_forward", residual_kernel, loom_cuda_blocks(n),
                         LOOM_CUDA_THREADS, 0, out, a, b, n);
}

extern "C" void loom_cuda_accumulate(float *acc, const float *x, size_t n)
{
    if (n)
        LOOM_CUDA_LAUNCH("accumulate", accumulate_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS,
                         0, acc, x, n);
}

extern "C" void loom_cuda_scale(float *x, float s, size_t n)
{
    if (n)
        LOOM_CUDA_LAUNCH("scale", scale_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS, 0, x, s,
                         n);
}

extern "C" void loom_cuda_bias_add(float *out, const float *bias, size_t rows, int cols)
{
    if (rows && cols > 0)
        LOOM_CUDA_LAUNCH("bias_add", bias_add_kernel, loom_cuda_blocks(rows * (size_t)cols),
                         LOOM_CUDA_THREADS, 0, out, bias, rows, cols);
}

extern "C" void loom_cuda_bias_backward(float *dbias, const float *dout, size_t rows, int cols)
{
    if (rows && cols > 0)
        LOOM_CUDA_LAUNCH("bias_backward", bias_backward_kernel,
                         (cols + COLSUM_COLS - 1) / COLSUM_COLS, dim3(COLSUM_COLS, COLSUM_LANES), 0,
                         dbias, dout, rows, cols);
}
