/* shm.c — loom-comm-shm: the communicator for ranks that are processes on one node,
 * over POSIX shared memory. This file: the descriptor, the config keys, create, and the
 * *_start entry points (argument checks, then a request on the queue).
 *
 * The plugin, file by file:
 *   shm.h         segment layout and the synchronisation invariants (read it first)
 *   shm_seg.c     segments (create/open/check), futex waits, doorbells
 *   shm_group.c   the world's start-up handshake, split, destroy
 *   shm_engine.c  requests, the progress engine, barriers, wait/test, timeouts
 *   shm_coll.c    the collective algorithms (direct shared-memory allreduce, ...)
 *   shm_p2p.c     send/recv mailboxes
 *   shm_reduce.c  reductions in fixed rank order; bf16/f16 via f32
 * Asynchrony: *_start never blocks and never communicates; the work is done inside wait()
 * and test() (single-threaded progress, documented in shm_engine.c): collectives on one
 * communicator complete in start order, sends and receives on their own (in order per peer
 * and direction), and waiting on any communicator of a family also advances the others,
 * so groups are independent.
 * What not: host memory only (device must be NULL); processes on one node only; no
 * thread of its own. A communicator (and its family) may be driven from several threads
 * (a mutex guards the queues), but one request must be waited for by one thread.
 * Invariants: only loom_plugin_entry is exported; every failure goes through host->fail;
 * nothing prints or exits.
 */
#include <string.h>

#include "shm.h"

enum { K_CHUNK, K_SMALL, K_MAILBOX, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_CHUNK] = {"chunk_bytes", LOOM_CFG_INTEGER, "1048576",
                 "pipelining unit and staging slot size (each rank has 3 slots in shared "
                 "memory); 4096 to 1073741824, a multiple of 64"},
    [K_SMALL] = {"small_bytes", LOOM_CFG_INTEGER, "65536",
                 "allreduce of at most this many bytes takes the one-barrier direct path "
                 "(every rank reduces the whole message); 0 to chunk_bytes"},
    [K_MAILBOX] = {"mailbox_bytes", LOOM_CFG_INTEGER, "131072",
                   "ring buffer per ordered pair of ranks for send/recv; 4096 to 1073741824"},
};

static size_t dt_size(loom_dtype dt)
{
    switch (dt) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_I32: return 4;
    case LOOM_DTYPE_BF16: case LOOM_DTYPE_F16: case LOOM_DTYPE_U16: return 2;
    case LOOM_DTYPE_U8: return 1;
    }
    return 0;
}

static loom_status read_config(const loom_host *host, const loom_config *cfg, size_t *chunk,
                               size_t *small, size_t *mailbox)
{
    if (cfg == NULL || cfg->count < N_KEYS || cfg->values == NULL)
        return host->fail(LOOM_ERR_INVALID, "shm: expected %d resolved config values, got %d",
                          N_KEYS, cfg ? cfg->count : 0);
    for (int i = 0; i < N_KEYS; i++)
        if (cfg->values[i].type != keys[i].type)
            return host->fail(LOOM_ERR_INVALID, "shm: config value %d should be key '%s'", i,
                              keys[i].name);
    double c = cfg->values[K_CHUNK].number, s = cfg->values[K_SMALL].number,
           m = cfg->values[K_MAILBOX].number;
    if (!(c >= 4096 && c <= 1073741824.0) || (size_t)c % 64 != 0)
        return host->fail(LOOM_ERR_INVALID, "shm: chunk_bytes must be a multiple of 64 between "
                          "4096 and 1073741824 (1 GiB), got %.0f (try 1048576)", c);
    if (!(s >= 0 && s <= c))
        return host->fail(LOOM_ERR_INVALID, "shm: small_bytes must be between 0 and "
                          "chunk_bytes=%.0f, got %.0f", c, s);
    if (!(m >= 4096 && m <= 1073741824.0))
        return host->fail(LOOM_ERR_INVALID, "shm: mailbox_bytes must be between 4096 and "
                          "1073741824 (1 GiB), got %.0f", m);
    *chunk = (size_t)c;
    *small = (size_t)s;
    *mailbox = (size_t)m;
    return LOOM_OK;
}

static loom_status shm_create(const loom_host *host, const loom_config *cfg,
                              const loom_store *store, int rank, int world, int timeout_ms,
                              void *device, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID; /* no host, no way to say more */
    *self = NULL;
    size_t chunk = 0, small = 0, mailbox = 0;
    loom_status st = read_config(host, cfg, &chunk, &small, &mailbox);
    if (st != LOOM_OK)
        return st;
    if (device != NULL)
        return host->fail(LOOM_ERR_UNSUPPORTED, "shm: host memory only, device must be NULL "
                          "(the nccl communicator handles device buffers)");
    if (world < 1 || world > SHM_MAX_WORLD)
        return host->fail(LOOM_ERR_INVALID, "shm: world must be 1 to %d ranks, got %d",
                          SHM_MAX_WORLD, world);
    if (rank < 0 || rank >= world)
        return host->fail(LOOM_ERR_INVALID, "shm: rank must be 0 to %d for world %d, got %d",
                          world - 1, world, rank);
    if (timeout_ms <= 0)
        return host->fail(LOOM_ERR_INVALID, "shm: timeout_ms must be > 0, got %d", timeout_ms);
    if (store == NULL || store->set == NULL || store->get == NULL)
        return host->fail(LOOM_ERR_INVALID, "shm: create needs the rendezvous store");
    shm_comm *c = NULL;
    st = shm_world_create(host, store, rank, world, timeout_ms, chunk, small, mailbox, &c);
    if (st == LOOM_OK)
        *self = c;
    return st;
}

static int shm_rank(void *self) { return self ? ((shm_comm *)self)->rank : -1; }
static int shm_world(void *self) { return self ? ((shm_comm *)self)->n : 0; }

/* ---- starting requests -------------------------------------------------------------- */

/* Common checks; a zeroed request with the basics filled, or a failure. mult: how many
 * count-sized blocks the largest buffer holds (n for the blocked ops). */
static loom_status prep(shm_comm *c, shm_kind kind, loom_comm_request **req, loom_dtype dt,
                        size_t count, size_t mult, loom_comm_request **out)
{
    const char *name = shm_kind_name(kind);
    if (c == NULL)
        return LOOM_ERR_INVALID;
    if (req == NULL)
        return c->host->fail(LOOM_ERR_INVALID, "shm %s: req is NULL", name);
    *req = NULL;
    size_t es = kind == SHM_BARRIER ? 1 : dt_size(dt);
    if (es == 0)
        return c->host->fail(LOOM_ERR_INVALID, "shm %s: unknown dtype %d", name, (int)dt);
    if (count > SIZE_MAX / 4 / es / mult)
        return c->host->fail(LOOM_ERR_INVALID, "shm %s: count %zu is too large", name, count);
    loom_comm_request *r = c->host->alloc(sizeof *r);
    if (r == NULL)
        return c->host->fail(LOOM_ERR_NOMEM, "shm %s: out of memory", name);
    r->kind = kind;
    r->dt = dt;
    r->es = es;
    r->count = count;
    *out = r;
    return LOOM_OK;
}

static loom_status need(shm_comm *c, loom_comm_request *r, int ok, const char *what)
{
    if (ok)
        return LOOM_OK;
    c->host->free(r);
    return c->host->fail(LOOM_ERR_INVALID, "shm %s: %s", shm_kind_name(r->kind), what);
}

#define PREP(kind, dt, count, mult)                                    \
    shm_comm *c = self;                                                \
    loom_comm_request *r = NULL;                                       \
    loom_status st = prep(c, (kind), req, (dt), (count), (mult), &r);  \
    if (st != LOOM_OK)                                                 \
        return st
#define NEED(cond, what)                                               \
    if ((st = need(c, r, (cond), (what))) != LOOM_OK)                  \
        return st

static loom_status reduce_checks(shm_comm *c, loom_comm_request *r, loom_reduce_op op)
{
    if (shm_reduce_supported(r->dt, op)) {
        r->op = op;
        return LOOM_OK;
    }
    c->host->free(r);
    return c->host->fail(LOOM_ERR_INVALID, "shm %s: reduce op %d is not sum (0), avg (1) or "
                         "max (2)", shm_kind_name(r->kind), (int)op);
}

static loom_status shm_allreduce_start(void *self, const void *send, void *recv, size_t count,
                                       loom_dtype dt, loom_reduce_op op, loom_comm_request **req)
{
    PREP(SHM_ALLREDUCE, dt, count, 1);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    if ((st = reduce_checks(c, r, op)) != LOOM_OK)
        return st;
    r->send = send;
    r->recv = recv;
    return shm_enqueue(c, r, req);
}

static loom_status shm_reduce_scatter_start(void *self, const void *send, void *recv,
                                            size_t count, loom_dtype dt, loom_reduce_op op,
                                            loom_comm_request **req)
{
    PREP(SHM_REDUCE_SCATTER, dt, count, (size_t)c->n);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    if ((st = reduce_checks(c, r, op)) != LOOM_OK)
        return st;
    r->send = send;
    r->recv = recv;
    return shm_enqueue(c, r, req);
}

loom_status shm_allgather_start(void *self, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_comm_request **req)
{
    PREP(SHM_ALLGATHER, dt, count, (size_t)c->n);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    r->send = send;
    r->recv = recv;
    return shm_enqueue(c, r, req);
}

static loom_status shm_broadcast_start(void *self, void *buf, size_t count, loom_dtype dt,
                                       int root, loom_comm_request **req)
{
    PREP(SHM_BROADCAST, dt, count, 1);
    NEED(count == 0 || buf, "buf must not be NULL");
    NEED(root >= 0 && root < c->n, "root is not a rank of this communicator");
    r->recv = buf;
    r->peer = root;
    return shm_enqueue(c, r, req);
}

static loom_status shm_alltoall_start(void *self, const void *send, void *recv, size_t count,
                                      loom_dtype dt, loom_comm_request **req)
{
    PREP(SHM_ALLTOALL, dt, count, (size_t)c->n);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    r->send = send;
    r->recv = recv;
    return shm_enqueue(c, r, req);
}

static loom_status shm_alltoallv_start(void *self, const void *send, const size_t *send_counts,
                                       const size_t *send_displs, void *recv,
                                       const size_t *recv_counts, const size_t *recv_displs,
                                       loom_dtype dt, loom_comm_request **req)
{
    PREP(SHM_ALLTOALLV, dt, 0, 1);
    NEED(send_counts && send_displs && recv_counts && recv_displs,
         "counts and displacements must not be NULL");
    const size_t n = (size_t)c->n, lim = SIZE_MAX / 4 / r->es;
    int sends = 0, recvs = 0, sane = 1;
    for (size_t p = 0; p < n; p++) {
        sends |= send_counts[p] > 0;
        recvs |= recv_counts[p] > 0;
        sane &= send_counts[p] <= lim && send_displs[p] <= lim - send_counts[p] &&
                recv_counts[p] <= lim && recv_displs[p] <= lim - recv_counts[p];
    }
    NEED(sane, "a count or displacement is too large");
    NEED((!sends || send) && (!recvs || recv), "send and recv must not be NULL");
    r->v = c->host->alloc(4 * n * sizeof(size_t));
    NEED(r->v != NULL, "out of memory");
    memcpy(r->v, send_counts, n * sizeof(size_t));
    memcpy(r->v + n, send_displs, n * sizeof(size_t));
    memcpy(r->v + 2 * n, recv_counts, n * sizeof(size_t));
    memcpy(r->v + 3 * n, recv_displs, n * sizeof(size_t));
    r->send = send;
    r->recv = recv;
    return shm_enqueue(c, r, req);
}

static loom_status shm_send_start(void *self, const void *buf, size_t count, loom_dtype dt,
                                  int peer, loom_comm_request **req)
{
    PREP(SHM_SEND, dt, count, 1);
    NEED(count == 0 || buf, "buf must not be NULL");
    NEED(peer >= 0 && peer < c->n, "peer is not a rank of this communicator");
    r->send = buf;
    r->peer = peer;
    return shm_enqueue(c, r, req);
}

static loom_status shm_recv_start(void *self, void *buf, size_t count, loom_dtype dt, int peer,
                                  loom_comm_request **req)
{
    PREP(SHM_RECV, dt, count, 1);
    NEED(count == 0 || buf, "buf must not be NULL");
    NEED(peer >= 0 && peer < c->n, "peer is not a rank of this communicator");
    r->recv = buf;
    r->peer = peer;
    return shm_enqueue(c, r, req);
}

static loom_status shm_barrier_start(void *self, loom_comm_request **req)
{
    PREP(SHM_BARRIER, LOOM_DTYPE_U8, 0, 1);
    return shm_enqueue(c, r, req);
}

static const loom_comm_ops ops = {
    .size = sizeof(loom_comm_ops),
    .create = shm_create,
    .destroy = shm_destroy,
    .rank = shm_rank,
    .world = shm_world,
    .split = shm_split,
    .allreduce_start = shm_allreduce_start,
    .reduce_scatter_start = shm_reduce_scatter_start,
    .allgather_start = shm_allgather_start,
    .broadcast_start = shm_broadcast_start,
    .alltoall_start = shm_alltoall_start,
    .alltoallv_start = shm_alltoallv_start,
    .send_start = shm_send_start,
    .recv_start = shm_recv_start,
    .barrier_start = shm_barrier_start,
    .wait = shm_wait,
    .test = shm_test,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_COMM,
    .name = "shm",
    .version = "0.1.0",
    .summary = "processes on one node over POSIX shared memory (fixed-order, reproducible "
               "reductions)",
    .config_keys = keys,
    .n_config_keys = N_KEYS,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
