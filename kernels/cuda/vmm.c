/* vmm.c — the backend's sparse buffers (backend.h: vm_granule .. vm_release) through the
 * CUDA driver's virtual memory management, as PyTorch's expandable segments: an address
 * range reserved (cuMemAddressReserve), each granule committed as its own physical
 * allocation (cuMemCreate, cuMemMap, cuMemSetAccess; the handle released at once, so the
 * memory lives exactly as long as its mapping) and decommitted by cuMemUnmap, which frees
 * it (a mapping is unmapped whole: one per granule, hence granule by granule). Work queued
 * on the stream may still use a granule, so decommit and release synchronize first.
 * The driver's entry points are looked up in libcuda.so.1 at first use, not linked: linked
 * (even against the toolkit's stub) the plugin would not load on a machine without the
 * driver, where it must load to say "no CUDA device" (cudart does the same). No driver, or
 * one without these calls: vm_granule is 0 and ZeRO keeps whole allocations.
 * Compiled where the CUDA backend is; it has never run on a GPU (docs/CUDA.md). */
#include "vmm.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"

typedef struct vm_range {
    struct vm_range *next;
    CUdeviceptr base;
    size_t bytes, granule;
    unsigned char *on; /* per granule: mapped */
} vm_range;

/* the driver's calls, from libcuda.so.1 (cuda.h's prototypes give their types) */
#define DRIVER_CALLS(X) X(cuGetErrorName) X(cuMemGetAllocationGranularity) \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) \
    X(cuMemUnmap) X(cuMemSetAccess)
#define DECLARE(f) static __typeof__(f) *p_##f;
DRIVER_CALLS(DECLARE)

static int driver_loaded; /* 0: not tried, 1: every call found, -1: not available */

static int load_driver(void)
{
    if (driver_loaded)
        return driver_loaded > 0;
    driver_loaded = -1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
#define RESOLVE(f) if (!(p_##f = (__typeof__(f) *)dlsym(lib, #f))) return 0;
    DRIVER_CALLS(RESOLVE)
    driver_loaded = 1;
    return 1;
}

static vm_range *ranges;
static size_t granule_bytes; /* 0 until asked */
static int vm_device;

/* One CUresult checked: the call's name and the driver's error name, else 0. */
static int failed(CUresult r, const char *call)
{
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL;
    if (p_cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "unknown CUresult";
    char msg[128];
    snprintf(msg, sizeof msg, "%s: %s (%d)", call, name, (int)r);
    loom_cuda_note_error("vm", msg);
    return 1;
}

static CUmemAllocationProp device_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = vm_device;
    return p;
}

size_t loom_cuda_vm_granule(void *self)
{
    (void)self;
    if (granule_bytes)
        return granule_bytes;
    if (!load_driver())
        return 0;
    if (cudaGetDevice(&vm_device) != cudaSuccess) /* the backend's, set at create */
        return 0;
    CUmemAllocationProp p = device_prop();
    size_t g = 0;
    if (failed(p_cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               "cuMemGetAllocationGranularity"))
        return 0;
    granule_bytes = g;
    return g;
}

static vm_range *find(void *base)
{
    for (vm_range *r = ranges; r; r = r->next)
        if (r->base == (CUdeviceptr)base)
            return r;
    return NULL;
}

void *loom_cuda_vm_reserve(void *self, size_t bytes)
{
    size_t g = loom_cuda_vm_granule(self);
    if (!g)
        return NULL;
    size_t len = ((bytes ? bytes : 1) + g - 1) / g * g;
    vm_range *r = calloc(1, sizeof *r);
    if (r)
        r->on = calloc(len / g, 1);
    if (!r || !r->on) {
        free(r);
        return NULL;
    }
    if (failed(p_cuMemAddressReserve(&r->base, len, g, 0, 0), "cuMemAddressReserve")) {
        free(r->on);
        free(r);
        return NULL;
    }
    r->bytes = len;
    r->granule = g;
    r->next = ranges;
    ranges = r;
    return (void *)r->base;
}

static void unmap_one(vm_range *r, size_t i)
{
    if (!r->on[i])
        return;
    if (!failed(p_cuMemUnmap(r->base + i * r->granule, r->granule), "cuMemUnmap"))
        r->on[i] = 0;
}

static void sync_stream(void)
{
    cudaError_t e = cudaStreamSynchronize(loom_cuda.stream);
    if (e != cudaSuccess)
        loom_cuda_note_error("vm: cudaStreamSynchronize", cudaGetErrorString(e));
}

static vm_range *piece(void *base, size_t off, size_t len, const char *what)
{
    vm_range *r = find(base);
    if (!r || off % r->granule || len % r->granule || off + len > r->bytes) {
        loom_cuda_note_error(what, "not a granule-aligned piece of a vm_reserve range");
        return NULL;
    }
    return r;
}

int loom_cuda_vm_commit(void *self, void *base, size_t off, size_t len)
{
    (void)self;
    vm_range *r = piece(base, off, len, "vm_commit");
    if (!r)
        return -1;
    CUmemAllocationProp p = device_prop();
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = p.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t first = off / r->granule, end = (off + len) / r->granule;
    for (size_t i = first; i < end; i++) {
        if (r->on[i])
            continue;
        CUdeviceptr at = r->base + i * r->granule;
        CUmemGenericAllocationHandle h;
        if (failed(p_cuMemCreate(&h, r->granule, &p, 0), "cuMemCreate"))
            goto undo;
        int bad = failed(p_cuMemMap(at, r->granule, 0, h, 0), "cuMemMap");
        /* the mapping keeps the memory; the handle is not needed past it */
        bad |= failed(p_cuMemRelease(h), "cuMemRelease");
        if (bad)
            goto undo;
        r->on[i] = 1;
        if (failed(p_cuMemSetAccess(at, r->granule, &access, 1), "cuMemSetAccess"))
            goto undo;
        continue;
    undo: /* what this call mapped, unmapped: the range as it was */
        for (size_t j = first; j <= i; j++)
            unmap_one(r, j);
        return -1;
    }
    return 0;
}

void loom_cuda_vm_decommit(void *self, void *base, size_t off, size_t len)
{
    (void)self;
    vm_range *r = piece(base, off, len, "vm_decommit");
    if (!r)
        return;
    sync_stream(); /* kernels queued before may still read or write it */
    for (size_t i = off / r->granule; i < (off + len) / r->granule; i++)
        unmap_one(r, i);
}

void loom_cuda_vm_release(void *self, void *base)
{
    (void)self;
    vm_range **at = &ranges;
    while (*at && (*at)->base != (CUdeviceptr)base)
        at = &(*at)->next;
    vm_range *r = *at;
    if (!r) {
        loom_cuda_note_error("vm_release", "a pointer vm_reserve did not return");
        return;
    }
    sync_stream();
    for (size_t i = 0; i < r->bytes / r->granule; i++)
        unmap_one(r, i);
    failed(p_cuMemAddressFree(r->base, r->bytes), "cuMemAddressFree");
    *at = r->next;
    free(r->on);
    free(r);
}
