/* dist_staged.c — device buffers over a host communicator, staged (see dist_staged.h). */
#include "dist_staged.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

typedef struct staged {
    const loom_comm_ops *inner;
    void *self;
    loom_backend *be;
    int owns;    /* self is a split child of a mesh group, destroyed with this wrapper */
} staged;

struct loom_comm_request {
    loom_comm_request *inner;
    void *send_host, *recv_host; /* staging; recv_host may be send_host */
    void *recv_dev;              /* where wait() copies recv_host back; NULL: nothing */
    size_t recv_bytes;
};

static loom_status make_request(size_t send_bytes, size_t recv_bytes, int in_place,
                                loom_comm_request **out)
{
    loom_comm_request *r = calloc(1, sizeof *r);
    if (r && send_bytes)
        r->send_host = malloc(send_bytes);
    if (r && recv_bytes)
        r->recv_host = in_place ? r->send_host : malloc(recv_bytes);
    if (!r || (send_bytes && !r->send_host) || (recv_bytes && !r->recv_host)) {
        if (r && r->recv_host != r->send_host)
            free(r->recv_host);
        if (r)
            free(r->send_host);
        free(r);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for a staged collective's host buffers "
                  "(%zu + %zu bytes)", send_bytes, recv_bytes);
    }
    r->recv_bytes = recv_bytes;
    *out = r;
    return LOOM_OK;
}

static void free_request(loom_comm_request *r)
{
    if (r->recv_host != r->send_host)
        free(r->recv_host);
    free(r->send_host);
    free(r);
}

/* The send buffer's bytes to the host: copy_to_host runs on the backend's stream after the
 * kernels queued before it, and returns once the bytes are here. */
static void stage_in(staged *s, loom_comm_request *r, const void *send, size_t bytes)
{
    if (bytes)
        s->be->ops->copy_to_host(s->be->self, r->send_host, send, bytes);
}

/* Started: keep the inner request, or free everything on a failed start. */
static loom_status started(loom_status st, loom_comm_request *r, void *recv_dev,
                           loom_comm_request **out)
{
    if (st != LOOM_OK) {
        free_request(r);
        return st;
    }
    r->recv_dev = recv_dev;
    *out = r;
    return LOOM_OK;
}

static loom_status st_create(const loom_host *host, const loom_config *cfg, const loom_store *store,
                             int rank, int world, int timeout_ms, void *device, void **self)
{
    return loom_fail(LOOM_ERR_INTERNAL, "the staged communicator wraps dist's host groups "
                     "(loom_dist_staged_wrap); it is not created from the store");
}

static void st_destroy(void *self)
{
    staged *s = self;
    if (s->owns) /* a split's host child; a mesh group is dist's */
        s->inner->destroy(s->self);
    free(s);
}

static int st_rank(void *self) { return ((staged *)self)->inner->rank(((staged *)self)->self); }

static int st_world(void *self) { return ((staged *)self)->inner->world(((staged *)self)->self); }

/* The host group split alike (a collective over its members, as the host split is), its
 * child staged through the same backend and owned by the new wrapper: expert
 * parallelism's ep and edp groups of the dp group (session_ep.c). */
static loom_status st_split(void *self, int color, int key, void **out)
{
    staged *s = self;
    void *child = NULL;
    LOOM_TRY(s->inner->split(s->self, color, key, &child));
    staged *c = calloc(1, sizeof *c);
    if (!c) {
        s->inner->destroy(child);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    *c = (staged){s->inner, child, s->be, 1};
    *out = c;
    return LOOM_OK;
}

static loom_status st_allreduce(void *self, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_reduce_op op, loom_comm_request **req)
{
    staged *s = self;
    size_t bytes = count * loom_dtype_size(dt);
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(bytes, bytes, 1, &r));
    stage_in(s, r, send, bytes);
    return started(s->inner->allreduce_start(s->self, r->send_host, r->recv_host, count, dt, op,
                                             &r->inner), r, recv, req);
}

static loom_status st_reduce_scatter(void *self, const void *send, void *recv, size_t count,
                                     loom_dtype dt, loom_reduce_op op, loom_comm_request **req)
{
    staged *s = self;
    size_t bytes = count * loom_dtype_size(dt), n = (size_t)st_world(self);
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(n * bytes, bytes, 0, &r));
    stage_in(s, r, send, n * bytes);
    return started(s->inner->reduce_scatter_start(s->self, r->send_host, r->recv_host, count, dt,
                                                  op, &r->inner), r, recv, req);
}

static loom_status st_allgather(void *self, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_comm_request **req)
{
    staged *s = self;
    size_t bytes = count * loom_dtype_size(dt), n = (size_t)st_world(self);
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(bytes, n * bytes, 0, &r));
    stage_in(s, r, send, bytes);
    return started(s->inner->allgather_start(s->self, r->send_host, r->recv_host, count, dt,
                                             &r->inner), r, recv, req);
}

static loom_status st_broadcast(void *self, void *buf, size_t count, loom_dtype dt, int root,
                                loom_comm_request **req)
{
    staged *s = self;
    size_t bytes = count * loom_dtype_size(dt);
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(bytes, bytes, 1, &r));
    if (st_rank(self) == root)
        stage_in(s, r, buf, bytes);
    return started(s->inner->broadcast_start(s->self, r->send_host, count, dt, root, &r->inner),
                   r, buf, req);
}

static loom_status st_alltoall(void *self, const void *send, void *recv, size_t count,
                               loom_dtype dt, loom_comm_request **req)
{
    staged *s = self;
    size_t bytes = count * loom_dtype_size(dt) * (size_t)st_world(self);
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(bytes, bytes, 0, &r));
    stage_in(s, r, send, bytes);
    return started(s->inner->alltoall_start(s->self, r->send_host, r->recv_host, count, dt,
                                            &r->inner), r, recv, req);
}

/* The elements a counts/displacements pair spans: the end of its furthest block. */
static size_t extent(const size_t *counts, const size_t *displs, int n)
{
    size_t end = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] && displs[i] + counts[i] > end)
            end = displs[i] + counts[i];
    return end;
}

static loom_status st_alltoallv(void *self, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs, loom_dtype dt, loom_comm_request **req)
{
    staged *s = self;
    int n = st_world(self);
    size_t es = loom_dtype_size(dt);
    size_t sb = extent(send_counts, send_displs, n) * es, rb = extent(recv_counts, recv_displs, n) * es;
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(sb, rb, 0, &r));
    stage_in(s, r, send, sb);
    return started(s->inner->alltoallv_start(s->self, r->send_host, send_counts, send_displs,
                                             r->recv_host, recv_counts, recv_displs, dt,
                                             &r->inner), r, recv, req);
}

static loom_status st_send(void *self, const void *buf, size_t count, loom_dtype dt, int peer,
                           loom_comm_request **req)
{
    staged *s = self;
    size_t bytes = count * loom_dtype_size(dt);
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(bytes, 0, 0, &r));
    stage_in(s, r, buf, bytes);
    return started(s->inner->send_start(s->self, r->send_host, count, dt, peer, &r->inner), r,
                   NULL, req);
}

static loom_status st_recv(void *self, void *buf, size_t count, loom_dtype dt, int peer,
                           loom_comm_request **req)
{
    staged *s = self;
    size_t bytes = count * loom_dtype_size(dt);
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(0, bytes, 0, &r));
    return started(s->inner->recv_start(s->self, r->recv_host, count, dt, peer, &r->inner), r,
                   buf, req);
}

static loom_status st_barrier(void *self, loom_comm_request **req)
{
    staged *s = self;
    loom_comm_request *r = NULL;
    LOOM_TRY(make_request(0, 0, 0, &r));
    return started(s->inner->barrier_start(s->self, &r->inner), r, NULL, req);
}

static loom_status st_wait(void *self, loom_comm_request *r)
{
    staged *s = self;
    loom_status st = s->inner->wait(s->self, r->inner);
    if (st == LOOM_OK && r->recv_dev && r->recv_bytes)
        s->be->ops->copy_to_device(s->be->self, r->recv_dev, r->recv_host, r->recv_bytes);
    free_request(r);
    return st;
}

static int st_test(void *self, loom_comm_request *r)
{
    staged *s = self;
    return s->inner->test(s->self, r->inner);
}

static const loom_comm_ops staged_ops = {
    .size = sizeof(loom_comm_ops),
    .create = st_create,
    .destroy = st_destroy,
    .rank = st_rank,
    .world = st_world,
    .split = st_split,
    .allreduce_start = st_allreduce,
    .reduce_scatter_start = st_reduce_scatter,
    .allgather_start = st_allgather,
    .broadcast_start = st_broadcast,
    .alltoall_start = st_alltoall,
    .alltoallv_start = st_alltoallv,
    .send_start = st_send,
    .recv_start = st_recv,
    .barrier_start = st_barrier,
    .wait = st_wait,
    .test = st_test,
};

const loom_comm_ops *loom_dist_staged_ops(void) { return &staged_ops; }

loom_status loom_dist_staged_wrap(const loom_comm_ops *ops, void *const host[4], loom_backend *be,
                                  void *out[4])
{
    for (int i = 0; i < 4; i++)
        out[i] = NULL;
    for (int i = 0; i < 4; i++) {
        if (!host[i])
            continue;
        staged *s = calloc(1, sizeof *s);
        if (!s) {
            for (int j = 0; j < i; j++)
                free(out[j]);
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
        }
        s->inner = ops;
        s->self = host[i];
        s->be = be;
        out[i] = s;
    }
    return LOOM_OK;
}
