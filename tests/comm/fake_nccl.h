/* fake_nccl.h — a host-only stand-in for the CUDA runtime and NCCL calls that
 * plugins/comm/nccl/nccl.c makes, so that its host-side logic (device selection, the
 * store key, split failures, the event pool, lazy settling, device_wait) is tested on a
 * machine without a GPU: test_nccl_host compiles nccl.c against the real cuda_runtime_api.h
 * and nccl.h and links these definitions instead of libcudart and libnccl.
 *
 * What: "device memory" is host memory that fake cudaMalloc registered (cudaPointerGetAttributes
 * says cudaMemoryTypeDevice for it, unregistered for anything else); every collective is a
 * world-1 copy (send to recv), done at once; events and streams are small structs. Knobs
 * make the next enqueue report ncclInProgress for a number of polls, make a split fail
 * (at once, or after an in-progress poll on the new communicator), or make an event never
 * complete. Counters say what nccl.c called, in what order and on which device.
 * What not: no communication between ranks, no asynchrony (completion is a counter), none
 * of NCCL's or CUDA's own behaviour: the plugin against them is tested on a GPU only.
 */
#ifndef LOOM_TESTS_FAKE_NCCL_H
#define LOOM_TESTS_FAKE_NCCL_H

#include <stddef.h>

enum { FAKE_LOG = 64 };

typedef struct fake_state {
    /* knobs */
    int devices;            /* cudaGetDeviceCount */
    int current;            /* the device current on "this thread" */
    int inprogress_polls;   /* next enqueue: ncclInProgress, then this many polls in progress */
    int split_fail;         /* 1: ncclCommSplit fails at once; 2: in progress, then an error */
    int event_never_done;   /* cudaEventQuery says not ready */
    /* counters */
    int events_created, events_destroyed, streams_created;
    int async_polls;        /* ncclCommGetAsyncError calls */
    int aborts, inits, splits;
    int event_queries;
    int waits_on_user;      /* cudaStreamWaitEvent(user stream, a completion event) */
    void *user_stream;      /* the stream the test handed to create, for the count above */
    int enqueue_device;     /* the current device at the last NCCL enqueue */
    int last_dtype;         /* the ncclDataType_t of the last reduction */
    char first_calls[FAKE_LOG][32]; /* the first CUDA/NCCL calls, in order */
    int n_calls;
    void *aborted[8];       /* the communicators ncclCommAbort was called on */
} fake_state;

extern fake_state fake;

/* Forget everything (counters, knobs, registered memory stays valid). */
void fake_reset(int devices);
/* A fresh stream (to stand for the backend's). */
void *fake_stream(void);
/* 1 when ncclCommAbort was called on comm. */
int fake_was_aborted(const void *comm);

#endif
