/* cuda_runtime_api.h (emulation) — the few CUDA runtime names the backend's kernel files
 * use, over host memory, for tests/cuda/emu: the kernels compiled as C++ and run on the CPU
 * (cuda_emu.cc) so their indexing and reductions are tested where no GPU is. Not CUDA: no
 * streams (everything is synchronous), no device memory (host memory). */
#ifndef LOOM_CUDA_EMU_RUNTIME_API_H
#define LOOM_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>
#include <string.h>

#define LOOM_CUDA_EMU 1

typedef void *cudaStream_t;
typedef enum cudaError { cudaSuccess = 0, cudaErrorNotReady = 600 } cudaError_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2
} cudaMemcpyKind;

static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k,
                                          cudaStream_t st)
{
    (void)k, (void)st;
    memcpy(d, s, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st)
{
    (void)st;
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
static inline cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}
static inline const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "emulated error";
}

#endif
