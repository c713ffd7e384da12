/* vmm.h — the CUDA backend's sparse buffers (backend.h's vm ops; vmm.c). */
#ifndef LOOM_KERNELS_CUDA_VMM_H
#define LOOM_KERNELS_CUDA_VMM_H

#include <stddef.h>

size_t loom_cuda_vm_granule(void *self);
void *loom_cuda_vm_reserve(void *self, size_t bytes);
int loom_cuda_vm_commit(void *self, void *base, size_t off, size_t len);
void loom_cuda_vm_decommit(void *self, void *base, size_t off, size_t len);
void loom_cuda_vm_release(void *self, void *base);

#endif
