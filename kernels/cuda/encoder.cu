/* encoder.cu — token and position embedding (kernels/cpu/encoder.c's contract): the lookup
 * over a vocabulary slice (zeros for tokens outside it), positions added to a row shard.
 * Backward: dwte and dwpe ACCUMULATE. No atomics: the token gradient is scatter_sorted.cu's
 * scatter-add (the rows sorted stably by token on the device, then one thread per (token,
 * column) adding its rows in increasing row index: the CPU's order and bits); the position
 * gradient gives each thread one (t, c) and adds the B rows in order (T*C-way parallel
 * already, so it keeps its shape).
 */
#include "kernels.cuh"

__global__ void embedding_forward_kernel(float *out, const int *inp, const float *wte, int v0,
                                         int Vl, size_t rows, int C)
{
    const size_t n = rows * (size_t)C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / C;
        const int c = (int)(i % C), v = inp[r] - v0;
        out[i] = v >= 0 && v < Vl ? wte[(size_t)v * C + c] : 0.0f;
    }
}

__global__ void position_forward_kernel(float *out, const float *wpe, size_t row0, size_t rows,
                                        int T, int C)
{
    const size_t n = rows * (size_t)C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / C;
        out[i] += wpe[((row0 + r) % (size_t)T) * C + i % C];
    }
}

__global__ void position_backward_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    const size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = dwpe[i];
        for (int b = 0; b < B; b++)
            s += dout[(size_t)b * n + i];
        dwpe[i] = s;
    }
}

extern "C" void loom_cuda_embedding_forward(float *out, const int *inp, const float *wte, int v0,
                                            int Vl, size_t rows, int C)
{
    LOOM_CUDA_LAUNCH("embedding_forward", embedding_forward_kernel,
                     loom_cuda_blocks(rows * (size_t)C), LOOM_CUDA_THREADS, 0, out, inp, wte, v0,
                     Vl, rows, C);
}

extern "C" void loom_cuda_embedding_backward(float *dwte, const float *dout, const int *inp,
                                             int v0, int Vl, size_t rows, int C)
{
    /* dwte (Vl,C) +=, dout (rows,C): tokens outside [v0, v0 + Vl) add nowhere */
    loom_cuda_scatter_add_rows(dwte, dout, inp, v0, Vl, NULL, rows, C);
}

extern "C" void loom_cuda_position_forward(float *out, const float *wpe, size_t row0, size_t rows,
                                           int T, int C)
{
    LOOM_CUDA_LAUNCH("position_forward", position_forward_kernel,
                     loom_cuda_blocks(rows * (size_t)C), LOOM_CUDA_THREADS, 0, out, wpe, row0,
                     rows, T, C);
}

extern "C" void loom_cuda_position_backward(float *dwpe, const float *dout, int B, int T, int C)
{
    LOOM_CUDA_LAUNCH("position_backward", position_backward_kernel,
                     loom_cuda_blocks((size_t)T * C), LOOM_CUDA_THREADS, 0, dwpe, dout, B, T, C);
}
