/* kernels.cuh — launch helpers for the backend's .cu files. */
#ifndef LOOM_CUDA_KERNELS_CUH
#define LOOM_CUDA_KERNELS_CUH

#include "cuda_common.h"

#include <cuda_runtime.h>
#include <stdint.h>

enum { LOOM_CUDA_THREADS = 256 };

/* Blocks for n items at LOOM_CUDA_THREADS each, capped (grid-stride loops do the rest). */
static inline unsigned loom_cuda_blocks(size_t n)
{
    size_t b = (n + LOOM_CUDA_THREADS - 1) / LOOM_CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535u * 16 ? 65535u * 16 : b);
}

#ifndef LOOM_CUDA_EMU
#define LOOM_CUDA_LAUNCH(what, kernel, grid, block, shmem, ...)                                \
    do {                                                                                       \
        loom_cuda_profile_begin(what, 0, 0, 0, 0);                                             \
        kernel<<<(grid), (block), (shmem), loom_cuda.stream>>>(__VA_ARGS__);                   \
        loom_cuda_profile_end();                                                               \
        loom_cuda_check_launch(what);                                                          \
    } while (0)
#else /* tests/cuda/emu: the same kernels run on the CPU by a block scheduler */
#define LOOM_CUDA_LAUNCH(what, kernel, grid, block, shmem, ...)                                \
    do {                                                                                       \
        loom_cuda_profile_begin(what, 0, 0, 0, 0);                                             \
        loom_emu_launch(dim3(grid), dim3(block), [&]() { kernel(__VA_ARGS__); });             \
        loom_cuda_profile_end();                                                               \
        loom_cuda_check_launch(what);                                                          \
    } while (0)
#endif

/* for (i ...) over [0, n), each thread from its global index by the grid's size. */
#define GRID_STRIDE(i, n)                                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                     \
         i += (size_t)gridDim.x * blockDim.x)

/* A warp's xor-butterfly sum and max: every lane gets the result, in a fixed tree. The
 * emulation (tests/cuda/emu) runs the same tree in one exchange. */
template <typename F> __device__ inline F loom_warp_sum(F v)
{
#ifdef LOOM_CUDA_EMU
    return loom_emu_warp_reduce(v, [](F a, F b) { return a + b; });
#else
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
#endif
}

__device__ inline float loom_warp_max(float v)
{
#ifdef LOOM_CUDA_EMU
    return loom_emu_warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
#else
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
#endif
}

/* Sum over a block (blockDim.x a multiple of 32, at most 1024) in a fixed tree: the same
 * bits for the same inputs and block size. Every thread gets the total. */
template <typename F> __device__ inline F loom_block_sum(F v)
{
    __shared__ F part[32];
    v = loom_warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : (F)0;
    return loom_warp_sum(v);
}

__device__ inline float loom_block_max(float v)
{
    __shared__ float part[32];
    v = loom_warp_max(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return loom_warp_max(v);
}

/* x, or 0 where |x| is below FLT_MIN, as the CPU kernels flush (cpu_common.h). */
__device__ inline float loom_flush(float x)
{
    return fabsf(x) < 1.17549435e-38f ? 0.0f : x;
}

#endif
