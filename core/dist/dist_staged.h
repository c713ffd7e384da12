/* dist_staged.h — a host communicator's groups carrying device buffers through host memory.
 *
 * What: for a device backend run over a host communicator (shm, mpi) — no NCCL — each
 * operation copies its send buffer to a host staging buffer with the backend's
 * copy_to_host (ordered after the kernels that wrote it: the copy is on the backend's
 * stream and waits for it), runs the host communicator's operation on the staging
 * buffers, and wait() copies the result back with copy_to_device. So a device gradient
 * bucket is all-reduced correctly, at the price of two copies and no device-side overlap.
 * What not: a communicator of its own (it wraps the host groups dist.c made, so its
 * operations are ordered with theirs and recorded by the flight recorder), create().
 * Invariants: a request owns its staging buffers until wait() frees them; every host
 * communicator call gets host memory only.
 */
#ifndef LOOM_CORE_DIST_STAGED_H
#define LOOM_CORE_DIST_STAGED_H

#include "loom/plugin/comm.h"
#include "base/backend.h"

/* Wrap each non-NULL host[i] (ops: the host groups' table, loom_dist_world's) as out[i]. */
loom_status loom_dist_staged_wrap(const loom_comm_ops *ops, void *const host[4], loom_backend *be,
                                  void *out[4]);
const loom_comm_ops *loom_dist_staged_ops(void);

#endif
