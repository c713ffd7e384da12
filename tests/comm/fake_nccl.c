/* fake_nccl.c — the CUDA runtime and NCCL calls of plugins/comm/nccl/nccl.c, on the host
 * (see fake_nccl.h). Declared by the real headers, so a changed signature fails the build. */
#include "fake_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

fake_state fake;

struct CUstream_st { int id; };
struct CUevent_st { int recorded; };
struct ncclComm { int rank, world, pending_polls; ncclResult_t async; };

enum { MAX_MEM = 256 };
static void *mem[MAX_MEM];
static int n_mem;
static int uid;

static void note(const char *call)
{
    if (fake.n_calls < FAKE_LOG)
        strncpy(fake.first_calls[fake.n_calls++], call, 31);
}

void fake_reset(int devices)
{
    memset(&fake, 0, sizeof fake);
    fake.devices = devices;
    fake.last_dtype = -1;
}

void *fake_stream(void)
{
    static struct CUstream_st s = {99};
    return &s;
}

int fake_was_aborted(const void *comm)
{
    for (int i = 0; i < fake.aborts && i < 8; i++)
        if (fake.aborted[i] == comm)
            return 1;
    return 0;
}

/* ---- CUDA runtime ------------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *count)
{
    note("cudaGetDeviceCount");
    *count = fake.devices;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    note("cudaGetDevice");
    *device = fake.current;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    note("cudaSetDevice");
    if (device < 0 || device >= fake.devices)
        return cudaErrorInvalidDevice;
    fake.current = device;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
    return error == cudaSuccess ? "no error" : "fake CUDA error";
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    note("cudaStreamCreateWithFlags");
    *s = calloc(1, sizeof **s);
    fake.streams_created++;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    free(s);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    note("cudaEventCreateWithFlags");
    *e = calloc(1, sizeof **e);
    fake.events_created++;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    fake.events_destroyed++;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)s;
    e->recorded = 1;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    fake.event_queries++;
    return e->recorded && !fake.event_never_done ? cudaSuccess : cudaErrorNotReady;
}

/* nccl.c's completion events are the pool's; its `ready` event is recorded on the user
 * stream itself and waited for by the communication stream, so a wait of the user stream
 * is a wait on a completion event. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)e;
    (void)flags;
    if (fake.user_stream && (void *)s == fake.user_stream)
        fake.waits_on_user++;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    note("cudaMalloc");
    if (n_mem == MAX_MEM)
        return cudaErrorMemoryAllocation;
    *p = calloc(1, n ? n : 1);
    mem[n_mem++] = *p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    for (int i = 0; i < n_mem; i++)
        if (mem[i] == p) {
            mem[i] = mem[--n_mem];
            free(p);
            return cudaSuccess;
        }
    return cudaErrorInvalidValue;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    a->type = cudaMemoryTypeUnregistered;
    for (int i = 0; i < n_mem; i++)
        if (mem[i] == p)
            a->type = cudaMemoryTypeDevice;
    return cudaSuccess;
}

/* ---- NCCL ---------------------------------------------------------------------------- */

const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error" : r == ncclInProgress ? "in progress" : "fake NCCL error";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "fake detail";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    note("ncclGetUniqueId");
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "fake-id-%d", ++uid);
    return ncclSuccess;
}

static ncclComm_t comm_new(int rank, int world)
{
    ncclComm_t c = calloc(1, sizeof *c);
    c->rank = rank;
    c->world = world;
    c->async = ncclSuccess;
    return c;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    (void)id;
    (void)config;
    note("ncclCommInitRankConfig");
    fake.inits++;
    *comm = comm_new(rank, nranks);
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    (void)color;
    (void)key;
    (void)config;
    fake.splits++;
    if (fake.split_fail == 1) {
        *newcomm = NULL;
        return ncclInternalError;
    }
    *newcomm = comm_new(0, 1);
    (void)comm;
    if (fake.split_fail == 2) { /* polled on the new communicator, then an error */
        (*newcomm)->pending_polls = 2;
        (*newcomm)->async = ncclRemoteError;
        return ncclInProgress;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    fake.async_polls++;
    if (comm->pending_polls > 0) {
        comm->pending_polls--;
        *err = ncclInProgress;
        return ncclSuccess;
    }
    *err = comm->async;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (fake.aborts < 8)
        fake.aborted[fake.aborts] = comm;
    fake.aborts++;
    return ncclSuccess; /* kept (not freed), so fake_was_aborted can compare its address */
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { (void)comm; return ncclSuccess; }

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    *count = comm->world;
    return ncclSuccess;
}

/* Every enqueue: the copy, then in progress when the knob says so. */
static ncclResult_t enqueue(ncclComm_t comm, const void *send, void *recv, size_t bytes)
{
    fake.enqueue_device = fake.current;
    if (send != recv && bytes > 0)
        memmove(recv, send, bytes);
    if (fake.inprogress_polls > 0) {
        comm->pending_polls = fake.inprogress_polls;
        fake.inprogress_polls = 0;
        return ncclInProgress;
    }
    return ncclSuccess;
}

static size_t nccl_size(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclFloat64: case ncclInt64: case ncclUint64: return 8;
    default: return 4;
    }
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    (void)op;
    (void)s;
    fake.last_dtype = (int)dt;
    return enqueue(comm, send, recv, count * nccl_size(dt));
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    (void)op;
    (void)s;
    fake.last_dtype = (int)dt;
    return enqueue(comm, send, recv, count * nccl_size(dt));
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           ncclComm_t comm, cudaStream_t s)
{
    (void)s;
    return enqueue(comm, send, recv, count * nccl_size(dt));
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           int root, ncclComm_t comm, cudaStream_t s)
{
    (void)root;
    (void)s;
    return enqueue(comm, send, recv, count * nccl_size(dt));
}

/* Point-to-point: nothing moves (world 1 has no peer); only the enqueue's outcome. */
ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer,
                      ncclComm_t comm, cudaStream_t s)
{
    (void)dt, (void)peer, (void)s;
    return enqueue(comm, send, (void *)send, count);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                      cudaStream_t s)
{
    (void)dt, (void)peer, (void)s;
    return enqueue(comm, recv, recv, count);
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
