/* offload.h — the optimizer state off the compute device: a host pool or a file on disk
 * (strategy = { offload = { optimizer = "host" | "disk", path =, chunk_mb = } }).
 *
 * The state is the same slot-major floats the optimizer sees (plugin/optim.h), for the
 * segments this rank steps (all parameters, or its ZeRO partition). The step runs chunk
 * by chunk: the optimizer is elementwise and its segments independent, so calling step on
 * parts changes no bit.
 * - host: the state lives in a pool of its own (accounted as optimizer_offloaded); each
 *   chunk is a run of whole segments stepped in place (a segment longer than a chunk is a
 *   chunk of its own).
 * - disk (offload_disk.c): the state lives in one file per rank under path; segments are
 *   cut into pieces so that a chunk holds at most chunk_mb of state; a background I/O
 *   thread reads chunk k+1 and writes chunk k-1 back while chunk k is updated, through
 *   three chunk buffers: the resident state is those buffers, not the whole state.
 * - on a device backend (offload_device.c, either place): the parameters and gradients
 *   stay in device memory; segments are cut into pieces of at most chunk_mb of chunk
 *   buffer (state on disk, parameter, gradient); each chunk's parameters and gradients are
 *   copied into a host buffer, stepped there by the optimizer's host step (the arithmetic
 *   of its step_backend, bit for bit), and the parameters copied back, the step of chunk k
 *   on a worker thread while the caller's thread copies chunk k-1 back and k+1 in.
 */
#ifndef LOOM_CORE_OFFLOAD_H
#define LOOM_CORE_OFFLOAD_H

#include "loom/plugin/optim.h"

typedef enum { LOOM_OFFLOAD_NONE = 0, LOOM_OFFLOAD_HOST, LOOM_OFFLOAD_DISK } loom_offload_mode;

typedef struct loom_offload_config {
    loom_offload_mode mode;
    const char *path;      /* disk: an existing writable directory */
    double chunk_mb;       /* state per chunk in MiB; 0: 64 */
    int rank;              /* world rank, for the file's name */
    /* params = true (ZeRO-3 only): the offload also holds the parameters this rank steps,
     * param_floats of them (its partition), segment i's at float param_off[i] of them;
     * NULL: the parameters stay with the caller (the segments' param pointers). */
    const size_t *param_off;
    size_t param_floats;
    /* A device backend (its memory not the host's), else NULL: the segments' param and
     * grad pointers are its memory; each chunk's are copied to host buffers for the step
     * and the parameters copied back (offload_device.c); with params = true only the
     * gradients are (the parameters are the pool's or the file's, stepped there). */
    const loom_backend_ops *backend;
    void *backend_self;
} loom_offload_config;

typedef struct loom_offload loom_offload;

/* Holds the state of segs[0..n): segment i's is slots x segs[i].n slot-major floats from
 * float state_off[i] of a state of `floats` floats in all. The segments' own state
 * pointers are not read, so the caller allocates no state for an offloaded run (its pages
 * would be dead weight). Makes its own copy of the segment list; the state starts zeroed. */
loom_status loom_offload_create(const loom_offload_config *c, const loom_optim_segment *segs,
                                const size_t *state_off, size_t n, size_t floats, uint32_t slots,
                                loom_offload **out);
void loom_offload_destroy(loom_offload *o);
/* One optimizer step over every segment, chunk by chunk (args->segments is ignored). */
loom_status loom_offload_step(loom_offload *o, const loom_optim_ops *ops, void *self,
                              const loom_optim_step_args *args);
/* Bytes of state resident in the compute process's working set (disk: the chunk
 * buffers, with the parameters they carry; host: 0, the pool is counted as offloaded) and
 * bytes of optimizer state held off it; loom_offload_param_bytes: the parameters' (0
 * without params). */
void loom_offload_memory(const loom_offload *o, size_t *resident, size_t *offloaded);
size_t loom_offload_param_bytes(const loom_offload *o);
/* params = true: floats [pos, pos + n) of the held parameters out to dst or in from src,
 * on the caller's thread (ZeRO-3 brings a unit's partition in before its all-gather);
 * not during a step. A failed read or write names the file, the offset and the bytes. */
loom_status loom_offload_read_params(loom_offload *o, size_t pos, size_t n, float *dst);
loom_status loom_offload_write_params(loom_offload *o, size_t pos, size_t n, const float *src);
const char *loom_offload_mode_name(loom_offload_mode m);
/* Checkpoints (checkpoint.c, checkpoint_load.c): the whole state (`floats` floats, laid
 * out as the offsets given at create describe) copied out of the pool or file into dst,
 * or from src into it; between steps only (the disk's I/O thread is idle then). A failed
 * read or write names the file, the offset and the bytes. */
size_t loom_offload_floats(const loom_offload *o);
loom_status loom_offload_read_state(loom_offload *o, float *dst);
loom_status loom_offload_write_state(loom_offload *o, const float *src);

#endif
