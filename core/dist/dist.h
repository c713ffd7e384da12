/* dist.h — the device mesh and its communicators.
 *
 * The mesh is pp x dp x tp with tp innermost, so tensor-parallel peers are neighbouring
 * ranks: rank = (pp_rank * dp + dp_rank) * tp + tp_rank. The world communicator comes
 * from a comm plugin joined through the rendezvous store; the dp, tp and pp groups are
 * split from it, and registered so plugins reach them through loom_host.group.
 */
#ifndef LOOM_CORE_DIST_H
#define LOOM_CORE_DIST_H

#include "loom/plugin/comm.h"
#include "base/backend.h"

typedef struct loom_mesh {
    int dp, tp, pp;
    int dp_rank, tp_rank, pp_rank;
} loom_mesh;

/* Coordinates of rank in a dp x tp x pp mesh; refuses a mesh whose product is not world,
 * naming the values. */
loom_status loom_mesh_make(int rank, int world, int dp, int tp, int pp, loom_mesh *out);

/* Join the world through store with comm plugin comm_name, split the groups, register
 * them with the host. timeout_ms bounds every wait (a dead peer becomes an error).
 * A comm that takes device memory only (LOOM_COMM_DEVICE_MEMORY: nccl) is not joined here:
 * the groups for host memory (the losses, the skip agreement, checkpoints, the pipeline's
 * host messages) are host_comm's ("shm" when NULL; "mpi" across nodes), and comm_name's own
 * world and groups are made by loom_dist_device_open, once the backend has picked its GPU and
 * made its stream. With a host comm, host_comm must be NULL or the same name.
 * p2p_bytes: the largest point-to-point message the run sends often (a pipeline stage's
 * activation; 0: none). A communicator with a `mailbox_bytes` key (shm) gets a mailbox
 * that holds two of them, so such a send completes when it starts rather than when the
 * sender's next call pushes its rest (the receiver idle meanwhile); never smaller than
 * the plugin's default; all world x world of them together at most 64 MiB (dist.c). */
loom_status loom_dist_init(const char *comm_name, const char *host_comm, const loom_store *store,
                           int rank, int world, const loom_mesh *mesh, int timeout_ms,
                           size_t p2p_bytes);
/* The recipe's device_wait, for the next loom_dist_init: -1 (not given: the device comm's
 * default), 0 or 1, handed to the device comm's `device_wait` key (nccl: wait() makes the
 * backend's stream wait on the operation instead of blocking the host). init refuses 1
 * beside a comm that carries host memory, whose waits always block the host. */
void loom_dist_set_device_wait(int device_wait);
/* The groups for a device backend's memory (loom_host.device_group), while its session
 * lives: with a device comm (nccl), its world joined through the store on the backend's
 * stream (be->ops->stream) and split like the mesh — collective, every rank calls it; with
 * a host comm, the host groups staged through the backend's copies (dist_staged.h). Nothing
 * to do with one rank or a host-memory backend. One device session at a time. */
loom_status loom_dist_device_open(loom_backend *be);
/* Before the backend closes (the device communicator's events live on its stream). */
void loom_dist_device_close(void);
/* The device groups' world communicator and its ops (NULL when none is open): for tests
 * of a world of one, whose groups loom_host.device_group gives as NULL. */
void *loom_dist_device_world(const loom_comm_ops **ops);
/* The device comm's name (nccl) when init joined the host groups beside one, else NULL. */
const char *loom_dist_device_comm(void);
/* What carries the device groups, for the banner ("nccl on the backend's stream, host
 * buffers over shm"), or NULL when none is open. */
const char *loom_dist_device_kind(void);
/* The world communicator (NULL before init or with one rank) and its ops. */
void *loom_dist_world(const loom_comm_ops **ops);
void loom_dist_shutdown(void);

#endif
