/* offload_internal.h — shared by offload.c (pieces, chunks, the host pool) and
 * offload_disk.c (the file and its I/O thread). */
#ifndef LOOM_CORE_OFFLOAD_INTERNAL_H
#define LOOM_CORE_OFFLOAD_INTERNAL_H

#include "offload.h"

#include <pthread.h>
#include <stdio.h>

/* A piece: elements [i0, i0 + n) of a segment of seg_n elements whose state starts at
 * float seg_off of the state (slot k of element i at seg_off + k * seg_n + i). In a chunk
 * buffer the piece is slot-major over its own n, at float buf_off. */
typedef struct offload_piece {
    loom_optim_segment seg; /* param, grad at the piece; state set per chunk */
    size_t seg_off, seg_n, i0, buf_off;
    size_t param_pos;     /* params: the piece's first parameter in the held parameters; in
                           * a chunk buffer its n parameters follow its state */
    size_t pool_off;      /* host: the piece's state in the pool, slot-major over its own n
                           * (seg_off where pieces are whole segments) */
} offload_piece;

typedef struct offload_chunk {
    size_t first, count;  /* pieces [first, first + count) */
    size_t floats;        /* state floats in the chunk */
} offload_chunk;

#define OFFLOAD_BUFS 3
#define OFFLOAD_QUEUE 8

typedef struct offload_op {
    int write;            /* 0: read the chunk into buf, 1: write buf back */
    size_t chunk;
    float *buf;
} offload_op;

struct loom_offload {
    loom_offload_mode mode;
    uint32_t slots;
    size_t floats;        /* state floats in all */
    size_t param_floats;  /* params: parameters held after the state (pool, file); else 0 */
    uint32_t per_elem;    /* floats a chunk buffer holds per element: buf_state (+1 with
                           * params; +2 on a device: the parameter and gradient staged) */
    uint32_t buf_state;   /* state slots a chunk buffer holds per element: disk slots, host 0 */
    int split;            /* pieces cut where a chunk fills (disk, any device); else whole */
    offload_piece *pieces;
    size_t n_pieces;
    offload_chunk *chunks;
    size_t n_chunks;
    loom_optim_segment *scratch; /* one chunk's segments for step */
    size_t max_count;
    float *pool;          /* host: the whole state */
    /* disk */
    char file[4096];
    int fd;
    float *bufs[OFFLOAD_BUFS];
    int n_bufs;
    size_t buf_floats;
    pthread_t thread;     /* disk: the I/O thread; on a device: the step's worker */
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    offload_op queue[OFFLOAD_QUEUE];
    uint64_t submitted, completed; /* ops queued and done, in order */
    int quit;
    loom_status io_status; /* the first I/O failure, with io_msg */
    char io_msg[4096 + 512];
    /* a device backend (offload_device.c): the model's parameters and gradients are its
     * memory; the step's worker thread steps chunk k while the caller's thread copies */
    const loom_backend_ops *dev;
    void *dev_self;
    int job;                 /* 1: job_args waits for the worker (or is being stepped) */
    loom_optim_step_args job_args;
    const loom_optim_ops *job_ops;
    void *job_self;
    loom_status job_status;
    char job_msg[2048];      /* the worker's failure message (status messages are per thread) */
};

/* Host memory for the pool and a device's chunk buffers: the backend's host_alloc where it
 * has one (CUDA: pinned), else calloc; zeroed. */
void *offload_host_alloc(loom_offload *o, size_t bytes);
void offload_host_free(loom_offload *o, void *p);
/* Stop the thread (the disk's I/O thread or a device's worker): quit, join, mu/cv gone. */
void offload_stop_thread(loom_offload *o);
loom_status offload_disk_open(loom_offload *o, const loom_offload_config *c);
void offload_disk_close(loom_offload *o);
/* n floats from float `at` of the file into buf (write = 0) or buf into the file (1), on
 * the caller's thread. */
loom_status offload_disk_copy(loom_offload *o, int write, float *buf, size_t at, size_t n);
loom_status offload_disk_step(loom_offload *o, const loom_optim_ops *ops, void *self,
                              const loom_optim_step_args *args);
/* One chunk's state between buf and the file, on the caller's thread (the device loop's). */
loom_status offload_disk_chunk(loom_offload *o, int write, size_t chunk, float *buf);
/* A device backend (offload_device.c): the chunk buffers and the worker thread; the step:
 * each chunk's parameters and gradients copied to the host, stepped there, the parameters
 * copied back, chunk k stepped on the worker while k-1 goes back and k+1 comes in. */
loom_status offload_device_open(loom_offload *o);
void offload_device_close(loom_offload *o);
loom_status offload_device_step(loom_offload *o, const loom_optim_ops *ops, void *self,
                                const loom_optim_step_args *args);

#endif
