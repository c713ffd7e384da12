/* cuda_runtime_api.h (emulation) — the few CUDA runtime names the backend's kernel files
 * use, over host memory, for tests/cuda/emu: the kernels compiled as C++ and run on the CPU
 * (cuda_emu.cc) so their indexing and reductions are tested where no GPU is. Not CUDA: no
 * streams (everything is synchronous), no device memory (host memory). */
#ifndef LOOM_CUDA_EMU_RUNTIME_API_H
#define LOOM_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOOM_CUDA_EMU 1

typedef void *cudaStream_t;
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotReady = 600
} cudaError_t;
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
/* Events: the work is done when a call returns, so an event's record is the host's clock
 * then, and the time between two is the CPU time the emulated work between them took
 * (LOOM_CUDA_PROFILE's figures on cudaemu: the emulation's cost, not a GPU's). */
typedef struct loom_emu_event {
    double ms;
} *cudaEvent_t;
static inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = (cudaEvent_t)calloc(1, sizeof **e);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    struct timespec t;
    (void)s;
    clock_gettime(CLOCK_MONOTONIC, &t);
    e->ms = t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
    return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
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
