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

typedef struct loom_mesh {
    int dp, tp, pp;
    int dp_rank, tp_rank, pp_rank;
} loom_mesh;

/* Coordinates of rank in a dp x tp x pp mesh; refuses a mesh whose product is not world,
 * naming the values. */
loom_status loom_mesh_make(int rank, int world, int dp, int tp, int pp, loom_mesh *out);

/* Join the world through store with comm plugin comm_name, split the groups, register
 * them with the host. timeout_ms bounds every wait (a dead peer becomes an error).
 * p2p_bytes: the largest point-to-point message the run sends often (a pipeline stage's
 * activation; 0: none). A communicator with a `mailbox_bytes` key (shm) gets a mailbox
 * that holds two of them, so such a send completes when it starts rather than when the
 * sender's next call pushes its rest (the receiver idle meanwhile); never smaller than
 * the plugin's default; all world x world of them together at most 64 MiB (dist.c). */
loom_status loom_dist_init(const char *comm_name, const loom_store *store, int rank, int world,
                           const loom_mesh *mesh, int timeout_ms, size_t p2p_bytes);
/* The world communicator (NULL before init or with one rank) and its ops. */
void *loom_dist_world(const loom_comm_ops **ops);
void loom_dist_shutdown(void);

#endif
