/* plugin/comm.h — the communicator interface: collectives and point-to-point within a
 * group of ranks.
 *
 * Every operation is asynchronous: *_start enqueues it and returns a request; wait()
 * completes it (and reports any failure, naming the peer rank). Buffers must stay valid
 * and untouched until wait returns; the count and displacement arrays of the v-collectives
 * are read at start (shm, mpi and nccl copy them), so they may be reused at once. Collectives on one communicator complete in the order
 * they were started; a send or receive completes on its own, ordered only with the earlier
 * sends (receives) to (from) the same peer, as in MPI: a caller must not count on a receive's
 * wait to have completed an earlier send. Operations on different communicators (groups)
 * are independent.
 * Reduction order is the plugin's to state. shm and mpi reduce every element in rank order
 * (mpi does the arithmetic itself rather than through MPI's reductions), so their results
 * are bitwise reproducible and equal to each other (tests/comm checks both); nccl reduces
 * as NCCL chooses, which NCCL does not promise is reproducible. Canonical mode never
 * depends on a communicator's reduction order: it exchanges partial sums whole
 * (allgather) and adds them itself in a fixed tree.
 * A communicator is created from the rendezvous store (bootstrap) or by split().
 * Plugins: shm (processes of one node), mpi (Open MPI), nccl (GPUs; built where the CUDA
 * toolkit is found). A device communicator (flags LOOM_COMM_DEVICE_MEMORY: nccl) takes only
 * the device memory of the backend whose stream create() was given; the core then runs a
 * host communicator beside it for host buffers (core/dist/dist.h).
 */
#ifndef LOOM_PLUGIN_COMM_H
#define LOOM_PLUGIN_COMM_H

#include <stddef.h>

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_reduce_op {
    LOOM_REDUCE_SUM = 0,
    LOOM_REDUCE_AVG,
    LOOM_REDUCE_MAX
} loom_reduce_op;

/* The rendezvous store served by rank 0: how communicators exchange what they need
 * (an NCCL unique id, shared-memory segment names). Blocking with a timeout. */
typedef struct loom_store {
    void *self;
    loom_status (*set)(void *self, const char *key, const void *value, size_t len);
    /* Waits until key exists or timeout_ms passes; *len in: capacity, out: size. */
    loom_status (*get)(void *self, const char *key, void *value, size_t *len, int timeout_ms);
} loom_store;

typedef struct loom_comm_request loom_comm_request; /* opaque, owned by the plugin */

/* One send or receive of a p2p_group_start. */
typedef struct loom_p2p {
    int send;        /* 1: buf to peer; 0: from peer into buf */
    void *buf;
    size_t count;
    loom_dtype dt;
    int peer;
} loom_p2p;

typedef struct loom_comm_ops {
    size_t size;
    /* Join the world: rank/world given, peers found through store. timeout_ms bounds every
     * later wait. device is a backend stream/device handle or NULL for host memory. */
    loom_status (*create)(const loom_host *host, const loom_config *cfg, const loom_store *store,
                          int rank, int world, int timeout_ms, void *device, void **self);
    void (*destroy)(void *self);
    int (*rank)(void *self);
    int (*world)(void *self);
    /* Collective over this communicator: ranks with the same color form a new group,
     * ordered by key. Blocking. */
    loom_status (*split)(void *self, int color, int key, void **out);

    loom_status (*allreduce_start)(void *self, const void *send, void *recv, size_t count,
                                   loom_dtype dt, loom_reduce_op op, loom_comm_request **req);
    /* recv holds count elements: this rank's block of the reduced send (world*count). */
    loom_status (*reduce_scatter_start)(void *self, const void *send, void *recv, size_t count,
                                        loom_dtype dt, loom_reduce_op op, loom_comm_request **req);
    /* recv holds world*count elements, rank r's send at r*count. */
    loom_status (*allgather_start)(void *self, const void *send, void *recv, size_t count,
                                   loom_dtype dt, loom_comm_request **req);
    loom_status (*broadcast_start)(void *self, void *buf, size_t count, loom_dtype dt, int root,
                                   loom_comm_request **req);
    /* Fixed-size blocks: count elements to and from each rank. */
    loom_status (*alltoall_start)(void *self, const void *send, void *recv, size_t count,
                                  loom_dtype dt, loom_comm_request **req);
    /* Variable blocks: counts and displacements in elements, world entries each. */
    loom_status (*alltoallv_start)(void *self, const void *send, const size_t *send_counts,
                                   const size_t *send_displs, void *recv, const size_t *recv_counts,
                                   const size_t *recv_displs, loom_dtype dt, loom_comm_request **req);
    loom_status (*send_start)(void *self, const void *buf, size_t count, loom_dtype dt, int peer,
                              loom_comm_request **req);
    loom_status (*recv_start)(void *self, void *buf, size_t count, loom_dtype dt, int peer,
                              loom_comm_request **req);
    loom_status (*barrier_start)(void *self, loom_comm_request **req);
    /* Complete a request and free it. A failure names the peer rank that caused it. */
    loom_status (*wait)(void *self, loom_comm_request *req);
    /* 1 if done (then wait returns at once), 0 if not; never blocks. */
    int (*test)(void *self, loom_comm_request *req);
    /* Optional (a table whose size ends before it has 0): what memory the buffers are. */
    unsigned flags;
    /* Optional (a table whose size ends before it, or NULL: none): start items[0..n) as one
     * group (NCCL's ncclGroupStart/End), one request completing when all of them have:
     * every send and receive in it progresses at once, so on a transport whose sends wait
     * for their receivers (LOOM_COMM_P2P_RENDEZVOUS) their order inside the group cannot
     * block them. */
    loom_status (*p2p_group_start)(void *self, const loom_p2p *items, int n,
                                   loom_comm_request **req);
} loom_comm_ops;


/* loom_comm_ops.flags: every buffer must be the device memory of the backend whose stream
 * create() was given (NCCL); host buffers go to a host communicator beside it. */
#define LOOM_COMM_DEVICE_MEMORY 1u
/* A send may not complete before its receiver has posted the receive, and the operations of
 * one communicator run in start order (NCCL: one stream): a send started before a receive
 * can hold that receive back. Transfers that must progress together go in one
 * p2p_group_start (the pipeline engine groups each run of consecutive transfers). */
#define LOOM_COMM_P2P_RENDEZVOUS 2u

/* The flags of a table, 0 for one built before the member existed. */
static inline unsigned loom_comm_flags(const loom_comm_ops *o)
{
    return o && o->size >= offsetof(loom_comm_ops, flags) + sizeof o->flags ? o->flags : 0u;
}

/* The table's p2p_group_start, NULL for one built before the member existed. */
typedef loom_status (*loom_p2p_group_fn)(void *self, const loom_p2p *items, int n,
                                         loom_comm_request **req);
static inline loom_p2p_group_fn loom_comm_p2p_group(const loom_comm_ops *o)
{
    return o && o->size >= offsetof(loom_comm_ops, p2p_group_start) + sizeof o->p2p_group_start
               ? o->p2p_group_start : NULL;
}

#ifdef __cplusplus
}
#endif
#endif
