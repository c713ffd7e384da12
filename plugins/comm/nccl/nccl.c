/* nccl.c — loom-comm-nccl: the communicator for CUDA device buffers, over NCCL.
 *
 * Plain C against the CUDA runtime and NCCL; no kernels of its own. Every communicator is
 * non-blocking (ncclConfig_t.blocking = 0) so that nothing here can hang: create, split and
 * wait all poll ncclCommGetAsyncError with short sleeps against a deadline, and on a
 * timeout or an asynchronous error the communicator is aborted (ncclCommAbort) and the
 * failure is reported with NCCL's own error string — NCCL alone would wait forever.
 *
 * Device: create() picks the GPU before any other CUDA or NCCL call (the `device` key, or
 * LOCAL_RANK modulo the visible devices: kernels/cuda/device_select.c, the backend's rule,
 * so both land on the same GPU; given the backend's stream and no `device` key, the GPU the
 * backend made current, whatever rule it used) and every later entry sets it again for its
 * thread.
 *
 * Streams: each communicator owns a non-blocking communication stream. If create() is
 * given the backend's stream (device != NULL), every *_start first makes the communication
 * stream wait for the work already queued on the backend stream (an event), so buffers a
 * kernel is still writing are ready before NCCL reads them, and compute and communication
 * still overlap. wait() blocks the host until the completion event (with the timeout);
 * with device_wait = true it instead makes the backend stream wait on that event and
 * returns (the host does not block, so compute and communication overlap on the device, at
 * the price of a stuck peer showing at the backend's next synchronize, which has no
 * timeout). With device == NULL the caller's buffers must already be ready.
 * Each *_start enqueues the NCCL call(s) on the communication stream and records an event
 * (taken from a pool: none is created per request in a steady state); wait() and test()
 * look at that event. An enqueue NCCL reports as still in progress is settled lazily — by
 * wait(), test() or the next start — not by a host sleep loop in every start. One stream
 * per communicator: operations complete in start order. Split children get their own
 * stream (groups are independent); a failed split leaves the parent usable.
 * Bootstrap: rank 0 publishes the unique id under "nccl/id/<n>", n counting this process's
 * create() calls, so a second communicator never reads the first one's id.
 *
 * Data movement (allgather, broadcast, alltoall(v), send/recv) is done in bytes, so every
 * loom dtype moves; reductions need an NCCL type: f32, bf16, f16, i32, u8 (not u16).
 * Reproducibility: NCCL picks the same algorithm and order for the same sizes, topology and
 * environment, so results repeat run to run on one machine; that is all NCCL promises.
 * Point to point: send/recv enqueue one operation each; p2p_group_start puts several in one
 * ncclGroupStart/End (LOOM_COMM_P2P_RENDEZVOUS: a send waits for its receiver, so transfers
 * that must progress together are grouped by the caller: the pipeline engine's).
 * What not: no send/recv to oneself (NCCL needs the pair in one group; copy instead).
 * Invariants: only loom_plugin_entry is exported; every failure goes through host->fail;
 * nothing prints or exits; after an abort every call on that communicator fails.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <stdlib.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "device_select.h"
#include "handle_pool.h"
#include "loom/plugin/comm.h"

#define HAVE_SPLIT (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))

enum { K_POLL_US, K_DEVICE, K_DEVICE_WAIT, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_POLL_US] = {"poll_us", LOOM_CFG_INTEGER, "20",
                   "sleep between polls of a pending operation in wait(), microseconds; "
                   "0 to 100000 (0 spins)"},
    [K_DEVICE] = {"device", LOOM_CFG_INTEGER, "-1",
                  "GPU index; -1: LOCAL_RANK modulo the visible devices (the CUDA backend's "
                  "rule)"},
    [K_DEVICE_WAIT] = {"device_wait", LOOM_CFG_BOOLEAN, "false",
                       "with the backend's stream: wait() only makes that stream wait on the "
                       "operation (the host does not block; compute and communication overlap "
                       "on the device), and a stuck peer shows at the backend's next "
                       "synchronize instead of as a timeout here"},
};

typedef struct nccl_comm {
    const loom_host *host;
    ncclComm_t comm;
    cudaStream_t stream;       /* ours, non-blocking */
    cudaStream_t user_stream;  /* the backend's, or NULL */
    cudaEvent_t ready;         /* recorded on user_stream before each op */
    float *scratch;            /* one float for barrier */
    int rank, world, timeout_ms, poll_us, device;
    int aborted, device_wait;
    loom_handle_pool events;   /* completion events, reused across requests */
    struct loom_comm_request *pending; /* enqueue still in progress (NCCL said so), or NULL */
} nccl_comm;

struct loom_comm_request {
    cudaEvent_t done;
    const char *what;
    int peer;     /* the peer of send/recv, -1 for collectives */
    int recorded; /* done is recorded: the enqueue has settled */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void nap(int us)
{
    if (us <= 0)
        return;
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static size_t dt_size(loom_dtype dt)
{
    switch (dt) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_I32: return 4;
    case LOOM_DTYPE_BF16: case LOOM_DTYPE_F16: case LOOM_DTYPE_U16: return 2;
    case LOOM_DTYPE_U8: return 1;
    }
    return 0;
}

static int nccl_dtype(loom_dtype dt, ncclDataType_t *out)
{
    switch (dt) {
    case LOOM_DTYPE_F32: *out = ncclFloat32; return 1;
#ifdef LOOM_NCCL_HAVE_BF16 /* meson checks nccl.h declares it for C (some declare it for C++ only) */
    case LOOM_DTYPE_BF16: *out = ncclBfloat16; return 1;
#else
    case LOOM_DTYPE_BF16: return 0;
#endif
    case LOOM_DTYPE_F16: *out = ncclFloat16; return 1;
    case LOOM_DTYPE_I32: *out = ncclInt32; return 1;
    case LOOM_DTYPE_U8: *out = ncclUint8; return 1;
    case LOOM_DTYPE_U16: return 0;
    }
    return 0;
}

static int nccl_op(loom_reduce_op op, ncclRedOp_t *out)
{
    switch (op) {
    case LOOM_REDUCE_SUM: *out = ncclSum; return 1;
    case LOOM_REDUCE_AVG: *out = ncclAvg; return 1;
    case LOOM_REDUCE_MAX: *out = ncclMax; return 1;
    }
    return 0;
}

/* ---- failure paths ------------------------------------------------------------------ */

/* Abort the communicator (after taking NCCL's last error) and report. */
static loom_status fail_abort(nccl_comm *c, loom_status st, const char *what, int peer,
                              const char *why)
{
    const char *last = c->comm ? ncclGetLastError(c->comm) : NULL;
    char detail[512];
    snprintf(detail, sizeof detail, "%s", last && last[0] ? last : "no further detail");
    if (c->comm && !c->aborted)
        ncclCommAbort(c->comm);
    c->aborted = 1;
    if (peer >= 0)
        return c->host->fail(st, "nccl %s with peer rank %d (rank %d of %d): %s (%s); "
                             "communicator aborted", what, peer, c->rank, c->world, why, detail);
    return c->host->fail(st, "nccl %s (rank %d of %d; NCCL does not say which peer rank): "
                         "%s (%s); communicator aborted", what, c->rank, c->world, why, detail);
}

/* Poll c->comm until its pending non-blocking call settles; at the deadline or on an error
 * abort it (abort = 1) or only report (abort = 0: a split's failure, polled on the parent,
 * must not cost the parent). */
static loom_status settle_or(nccl_comm *c, ncclResult_t res, const char *what, int abort)
{
    double deadline = now_ms() + c->timeout_ms;
    char why[128];
    while (res == ncclInProgress) {
        if (now_ms() > deadline) {
            snprintf(why, sizeof why, "still in progress after timeout_ms=%d", c->timeout_ms);
            if (abort)
                return fail_abort(c, LOOM_ERR_TIMEOUT, what, -1, why);
            return c->host->fail(LOOM_ERR_TIMEOUT, "nccl %s (rank %d of %d): %s", what, c->rank,
                                 c->world, why);
        }
        nap(c->poll_us > 0 ? c->poll_us : 10);
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &res);
        if (q != ncclSuccess)
            res = q;
    }
    if (res == ncclSuccess)
        return LOOM_OK;
    if (abort)
        return fail_abort(c, LOOM_ERR_COMM, what, -1, ncclGetErrorString(res));
    return c->host->fail(LOOM_ERR_COMM, "nccl %s (rank %d of %d): %s", what, c->rank, c->world,
                         ncclGetErrorString(res));
}

static loom_status settle(nccl_comm *c, ncclResult_t res, const char *what)
{
    return settle_or(c, res, what, 1);
}

/* Settle the enqueue NCCL left in progress (at most one: every start settles the one before
 * it first), then record its completion event where the operation now sits. */
static loom_status settle_pending(nccl_comm *c)
{
    struct loom_comm_request *r = c->pending;
    if (r == NULL)
        return LOOM_OK;
    c->pending = NULL;
    ncclResult_t res = ncclInProgress, q = ncclCommGetAsyncError(c->comm, &res);
    loom_status st = settle(c, q != ncclSuccess ? q : res, r->what);
    if (st != LOOM_OK)
        return st;
    cudaError_t e = cudaEventRecord(r->done, c->stream);
    if (e != cudaSuccess)
        return c->host->fail(LOOM_ERR_COMM, "nccl %s: recording the completion event: %s",
                             r->what, cudaGetErrorString(e));
    r->recorded = 1;
    return LOOM_OK;
}

static int event_create(void *ctx, void **out)
{
    cudaEvent_t e;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
        return -1;
    *out = (void *)e;
    return 0;
}

static void event_destroy(void *ctx, void *h)
{
    cudaEventDestroy((cudaEvent_t)h);
}

#define CUDA_TRY(c, call, what)                                                             \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess)                                                              \
            return (c)->host->fail(LOOM_ERR_COMM, "nccl %s: %s failed: %s", (what), #call, \
                                   cudaGetErrorString(e_));                                 \
    } while (0)

/* ---- create, split, destroy --------------------------------------------------------- */

static void comm_free(nccl_comm *c)
{
    if (c == NULL)
        return;
    cudaSetDevice(c->device);
    if (c->pending && !c->aborted)
        (void)settle_pending(c); /* a failure aborts: the handle is then gone, as below */
    if (c->comm) {
        if (c->aborted) {
            /* already aborted: the handle is gone */
        } else {
            ncclResult_t r = ncclCommFinalize(c->comm);
            if (r == ncclSuccess || r == ncclInProgress) {
                double deadline = now_ms() + c->timeout_ms;
                while (r == ncclInProgress && now_ms() < deadline) {
                    nap(100);
                    if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess)
                        break;
                }
            }
            if (r == ncclSuccess)
                ncclCommDestroy(c->comm);
            else
                ncclCommAbort(c->comm);
        }
    }
    if (c->stream) {
        cudaStreamSynchronize(c->stream);
        cudaStreamDestroy(c->stream);
    }
    if (c->ready)
        cudaEventDestroy(c->ready);
    loom_handle_pool_destroy(&c->events); /* the free ones; requests not waited for leak theirs */
    if (c->scratch)
        cudaFree(c->scratch);
    c->host->free(c);
}

static void nccl_destroy(void *self) { comm_free(self); }

/* The per-communicator CUDA resources; c->comm is set by the caller afterwards. */
static loom_status comm_alloc(const loom_host *host, int rank, int world, int timeout_ms,
                              int poll_us, int device, cudaStream_t user, nccl_comm **out)
{
    nccl_comm *c = host->alloc(sizeof *c);
    if (c == NULL)
        return host->fail(LOOM_ERR_NOMEM, "nccl create: out of memory");
    c->host = host;
    c->rank = rank;
    c->world = world;
    c->timeout_ms = timeout_ms;
    c->poll_us = poll_us;
    c->user_stream = user;
    c->device = device;
    loom_handle_pool_init(&c->events, event_create, event_destroy, NULL);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&c->scratch, sizeof(float));
    if (e != cudaSuccess) {
        comm_free(c);
        return host->fail(LOOM_ERR_COMM, "nccl create: CUDA setup failed on rank %d: %s",
                          rank, cudaGetErrorString(e));
    }
    *out = c;
    return LOOM_OK;
}

static loom_status nccl_create(const loom_host *host, const loom_config *cfg,
                               const loom_store *store, int rank, int world, int timeout_ms,
                               void *device, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID;
    *self = NULL;
    if (cfg == NULL || cfg->count < N_KEYS || cfg->values == NULL ||
        cfg->values[K_POLL_US].type != LOOM_CFG_INTEGER)
        return host->fail(LOOM_ERR_INVALID, "nccl: expected %d resolved config value(s) "
                          "(poll_us, device, device_wait), got %d", N_KEYS,
                          cfg ? cfg->count : 0);
    double poll = cfg->values[K_POLL_US].number;
    int device_wait = cfg->values[K_DEVICE_WAIT].number != 0;
    if (!(poll >= 0 && poll <= 100000))
        return host->fail(LOOM_ERR_INVALID, "nccl: poll_us must be 0 to 100000, got %.0f",
                          poll);
    if (world < 1)
        return host->fail(LOOM_ERR_INVALID, "nccl: world must be >= 1, got %d", world);
    if (rank < 0 || rank >= world)
        return host->fail(LOOM_ERR_INVALID, "nccl: rank must be 0 to %d for world %d, got %d",
                          world - 1, world, rank);
    if (timeout_ms <= 0)
        return host->fail(LOOM_ERR_INVALID, "nccl: timeout_ms must be > 0, got %d", timeout_ms);
    if (store == NULL || store->set == NULL || store->get == NULL)
        return host->fail(LOOM_ERR_INVALID, "nccl: create needs the rendezvous store");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
        return host->fail(LOOM_ERR_UNSUPPORTED, "nccl: no CUDA device visible on rank %d "
                          "(use the shm communicator for host memory)", rank);
    char why[200];
    int dev = -1, requested = (int)cfg->values[K_DEVICE].number;
    /* Given the backend's stream and no `device` of its own: the GPU the backend chose (its
     * `device` key may differ from the LOCAL_RANK rule), current on this thread since the
     * backend's create set it; the stream lives there. */
    if (device != NULL && requested < 0 && cudaGetDevice(&dev) != cudaSuccess)
        dev = -1;
    if (dev < 0)
        dev = loom_cuda_pick_device(requested, getenv("LOCAL_RANK"), ndev, why, sizeof why);
    if (dev < 0)
        return host->fail(LOOM_ERR_INVALID, "nccl (rank %d): %s", rank, why);
    cudaError_t de = cudaSetDevice(dev); /* before any other CUDA or NCCL call */
    if (de != cudaSuccess)
        return host->fail(LOOM_ERR_COMM, "nccl create (rank %d): cudaSetDevice(%d): %s", rank,
                          dev, cudaGetErrorString(de));
    /* Every rank creates its communicators in the same order, so the count agrees. */
    static int generation;
    char key[32];
    snprintf(key, sizeof key, "nccl/id/%d", generation++);

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            return host->fail(LOOM_ERR_COMM, "nccl create: ncclGetUniqueId failed: %s (%s)",
                              ncclGetErrorString(r), ncclGetLastError(NULL));
        loom_status st = store->set(store->self, key, &id, sizeof id);
        if (st != LOOM_OK)
            return st;
    } else {
        size_t len = sizeof id;
        loom_status st = store->get(store->self, key, &id, &len, timeout_ms);
        if (st != LOOM_OK)
            return st;
        if (len != sizeof id)
            return host->fail(LOOM_ERR_COMM, "nccl create: rank %d got a %zu-byte '%s' "
                              "from rank 0, expected %zu (loom builds with different NCCL?)",
                              rank, len, key, sizeof id);
    }

    nccl_comm *c = NULL;
    loom_status st = comm_alloc(host, rank, world, timeout_ms, (int)poll, dev, device, &c);
    if (st != LOOM_OK)
        return st;
    c->device_wait = device_wait && device != NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
    if (comm == NULL) {
        comm_free(c);
        return host->fail(LOOM_ERR_COMM, "nccl create: ncclCommInitRankConfig failed on rank "
                          "%d of %d: %s (%s)", rank, world, ncclGetErrorString(r),
                          ncclGetLastError(NULL));
    }
    c->comm = comm;
    st = settle(c, r, "create (ncclCommInitRankConfig)");
    if (st != LOOM_OK) {
        comm_free(c);
        return st;
    }
    *self = c;
    return LOOM_OK;
}

static loom_status nccl_split(void *self, int color, int key, void **out)
{
    nccl_comm *c = self;
    if (c == NULL || out == NULL)
        return LOOM_ERR_INVALID;
    *out = NULL;
    if (c->aborted)
        return c->host->fail(LOOM_ERR_COMM, "nccl split: communicator was aborted after an "
                             "earlier failure");
    if (color < 0)
        return c->host->fail(LOOM_ERR_INVALID, "nccl split: color must be >= 0, got %d", color);
#if HAVE_SPLIT
    cudaSetDevice(c->device);
    loom_status st = settle_pending(c); /* NCCL takes no new call while one is in progress */
    if (st != LOOM_OK)
        return st;
    nccl_comm *n = NULL;
    st = comm_alloc(c->host, 0, 0, c->timeout_ms, c->poll_us, c->device, c->user_stream, &n);
    if (st != LOOM_OK)
        return st;
    n->device_wait = c->device_wait;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommSplit(c->comm, color, key, &comm, &config);
    if (r != ncclSuccess && r != ncclInProgress) { /* the parent stays usable */
        comm_free(n);
        return c->host->fail(LOOM_ERR_COMM, "nccl split (ncclCommSplit, color %d, rank %d of "
                             "%d): %s (%s); the parent communicator is kept", color, c->rank,
                             c->world, ncclGetErrorString(r), ncclGetLastError(c->comm));
    }
    n->comm = comm;
    if (comm != NULL) /* a non-blocking split is polled (and aborted) on the new communicator */
        st = settle(n, r, "split (ncclCommSplit)");
    else if (r == ncclInProgress) /* polled on the parent, which a failure must not abort */
        st = settle_or(c, r, "split (ncclCommSplit)", 0);
    if (st == LOOM_OK && comm == NULL)
        st = c->host->fail(LOOM_ERR_COMM, "nccl split: ncclCommSplit gave no communicator for "
                           "color %d on rank %d", color, c->rank);
    if (st == LOOM_OK && (ncclCommUserRank(comm, &n->rank) != ncclSuccess ||
                          ncclCommCount(comm, &n->world) != ncclSuccess))
        st = c->host->fail(LOOM_ERR_COMM, "nccl split: could not read the new rank/size");
    if (st != LOOM_OK) {
        comm_free(n);
        return st;
    }
    *out = n;
    return LOOM_OK;
#else
    (void)key;
    return c->host->fail(LOOM_ERR_UNSUPPORTED, "nccl split: loom was built against NCCL "
                         "%d.%d.%d, which has no ncclCommSplit (needs NCCL >= 2.18)",
                         NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#endif
}

static int nccl_rank(void *self) { return self ? ((nccl_comm *)self)->rank : -1; }
static int nccl_world(void *self) { return self ? ((nccl_comm *)self)->world : 0; }

/* ---- starting requests -------------------------------------------------------------- */

/* Checks common to every op, and the ordering after the backend's stream. */
static loom_status begin(nccl_comm *c, const char *what, loom_comm_request **req)
{
    if (c == NULL)
        return LOOM_ERR_INVALID;
    if (req == NULL)
        return c->host->fail(LOOM_ERR_INVALID, "nccl %s: req is NULL", what);
    *req = NULL;
    if (c->aborted)
        return c->host->fail(LOOM_ERR_COMM, "nccl %s: communicator was aborted after an "
                             "earlier failure", what);
    cudaSetDevice(c->device); /* this thread may not have set it */
    loom_status st = settle_pending(c);
    if (st != LOOM_OK)
        return st;
    if (c->user_stream != NULL) {
        CUDA_TRY(c, cudaEventRecord(c->ready, c->user_stream), what);
        CUDA_TRY(c, cudaStreamWaitEvent(c->stream, c->ready, 0), what);
    }
    return LOOM_OK;
}

/* After the NCCL call(s): settle a non-blocking enqueue, then the completion event. */
static loom_status finish(nccl_comm *c, ncclResult_t res, const char *what, int peer,
                          loom_comm_request **req)
{
    if (res != ncclSuccess && res != ncclInProgress)
        return fail_abort(c, LOOM_ERR_COMM, what, peer, ncclGetErrorString(res));
    loom_comm_request *r = c->host->alloc(sizeof *r);
    void *ev = NULL;
    if (r == NULL || loom_handle_pool_acquire(&c->events, &ev) != 0) {
        c->host->free(r);
        /* the operation is queued: settle it so that the communicator stays consistent */
        loom_status st = settle(c, res, what);
        return st != LOOM_OK ? st : c->host->fail(LOOM_ERR_NOMEM, "nccl %s: out of memory "
                                                  "(request or CUDA event)", what);
    }
    r->what = what;
    r->peer = peer;
    r->done = (cudaEvent_t)ev;
    r->recorded = 0;
    if (res == ncclInProgress) { /* settled later: by wait, test or the next start */
        c->pending = r;
        *req = r;
        return LOOM_OK;
    }
    cudaError_t e = cudaEventRecord(r->done, c->stream);
    if (e != cudaSuccess) {
        loom_handle_pool_release(&c->events, ev);
        c->host->free(r);
        return c->host->fail(LOOM_ERR_COMM, "nccl %s: recording the completion event: %s",
                             what, cudaGetErrorString(e));
    }
    r->recorded = 1;
    *req = r;
    return LOOM_OK;
}

static loom_status bad(nccl_comm *c, const char *what, const char *why)
{
    return c->host->fail(LOOM_ERR_INVALID, "nccl %s: %s", what, why);
}

/* Host memory handed to NCCL fails deep inside it and would cost the communicator; refuse
 * it up front. NULL (with count 0) passes. */
static loom_status on_device(nccl_comm *c, const char *what, const void *p)
{
    if (p == NULL)
        return LOOM_OK;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* clear it: not sticky */
        a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged)
        return LOOM_OK;
    return c->host->fail(LOOM_ERR_INVALID, "nccl %s: buffer %p is not CUDA device memory (the "
                         "shm communicator handles host buffers)", what, p);
}

#define ON_DEVICE(c, what, p)                                       \
    do {                                                            \
        loom_status s_ = on_device((c), (what), (p));               \
        if (s_ != LOOM_OK)                                          \
            return s_;                                              \
    } while (0)

static loom_status reduce_start(nccl_comm *c, const char *what, int scatter, const void *send,
                                void *recv, size_t count, loom_dtype dt, loom_reduce_op op,
                                loom_comm_request **req)
{
    loom_status st = begin(c, what, req);
    if (st != LOOM_OK)
        return st;
    ncclDataType_t ndt;
    ncclRedOp_t nop;
    if (!nccl_dtype(dt, &ndt))
        return c->host->fail(dt_size(dt) ? LOOM_ERR_UNSUPPORTED : LOOM_ERR_INVALID,
                             "nccl %s: dtype %d cannot be reduced (f32, %sf16, i32, u8 can)",
                             what, (int)dt,
#ifdef LOOM_NCCL_HAVE_BF16
                             "bf16, "
#else
                             "" /* this nccl.h has no ncclBfloat16 for C */
#endif
                             );
    if (!nccl_op(op, &nop))
        return bad(c, what, "reduce op is not sum (0), avg (1) or max (2)");
    if (count > 0 && (send == NULL || recv == NULL))
        return bad(c, what, "send and recv must not be NULL");
    if (count > 0) {
        ON_DEVICE(c, what, send);
        ON_DEVICE(c, what, recv);
    }
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = scatter ? ncclReduceScatter(send, recv, count, ndt, nop, c->comm, c->stream)
                    : ncclAllReduce(send, recv, count, ndt, nop, c->comm, c->stream);
    return finish(c, r, what, -1, req);
}

static loom_status nccl_allreduce_start(void *self, const void *send, void *recv, size_t count,
                                        loom_dtype dt, loom_reduce_op op,
                                        loom_comm_request **req)
{
    return reduce_start(self, "allreduce", 0, send, recv, count, dt, op, req);
}

static loom_status nccl_reduce_scatter_start(void *self, const void *send, void *recv,
                                             size_t count, loom_dtype dt, loom_reduce_op op,
                                             loom_comm_request **req)
{
    return reduce_start(self, "reduce_scatter", 1, send, recv, count, dt, op, req);
}

static loom_status nccl_allgather_start(void *self, const void *send, void *recv, size_t count,
                                        loom_dtype dt, loom_comm_request **req)
{
    nccl_comm *c = self;
    loom_status st = begin(c, "allgather", req);
    if (st != LOOM_OK)
        return st;
    size_t es = dt_size(dt);
    if (es == 0)
        return bad(c, "allgather", "unknown dtype");
    if (count > 0 && (send == NULL || recv == NULL))
        return bad(c, "allgather", "send and recv must not be NULL");
    if (count > 0) {
        ON_DEVICE(c, "allgather", send);
        ON_DEVICE(c, "allgather", recv);
    }
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = ncclAllGather(send, recv, count * es, ncclUint8, c->comm, c->stream);
    return finish(c, r, "allgather", -1, req);
}

static loom_status nccl_broadcast_start(void *self, void *buf, size_t count, loom_dtype dt,
                                        int root, loom_comm_request **req)
{
    nccl_comm *c = self;
    loom_status st = begin(c, "broadcast", req);
    if (st != LOOM_OK)
        return st;
    size_t es = dt_size(dt);
    if (es == 0)
        return bad(c, "broadcast", "unknown dtype");
    if (count > 0 && buf == NULL)
        return bad(c, "broadcast", "buf must not be NULL");
    if (root < 0 || root >= c->world)
        return bad(c, "broadcast", "root is not a rank of this communicator");
    if (count > 0)
        ON_DEVICE(c, "broadcast", buf);
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = ncclBroadcast(buf, buf, count * es, ncclUint8, root, c->comm, c->stream);
    return finish(c, r, "broadcast", root == c->rank ? -1 : root, req);
}

/* Grouped send/recv of byte blocks; counts/displs in elements (NULL: fixed count). */
static loom_status exchange(nccl_comm *c, const char *what, const char *send, const size_t *sc,
                            const size_t *sd, char *recv, const size_t *rc, const size_t *rd,
                            size_t count, size_t es, loom_comm_request **req)
{
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < c->world && r == ncclSuccess; p++) {
        size_t sn = sc ? sc[p] : count, so = sd ? sd[p] : (size_t)p * count;
        size_t rn = rc ? rc[p] : count, ro = rd ? rd[p] : (size_t)p * count;
        if (sn > 0)
            r = ncclSend(send + so * es, sn * es, ncclUint8, p, c->comm, c->stream);
        if (rn > 0 && (r == ncclSuccess || r == ncclInProgress))
            r = ncclRecv(recv + ro * es, rn * es, ncclUint8, p, c->comm, c->stream);
        if (r == ncclInProgress)
            r = ncclSuccess;
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess)
        r = e;
    return finish(c, r, what, -1, req);
}

static loom_status nccl_alltoall_start(void *self, const void *send, void *recv, size_t count,
                                       loom_dtype dt, loom_comm_request **req)
{
    nccl_comm *c = self;
    loom_status st = begin(c, "alltoall", req);
    if (st != LOOM_OK)
        return st;
    size_t es = dt_size(dt);
    if (es == 0)
        return bad(c, "alltoall", "unknown dtype");
    if (count > 0 && (send == NULL || recv == NULL))
        return bad(c, "alltoall", "send and recv must not be NULL");
    if (count > 0) {
        ON_DEVICE(c, "alltoall", send);
        ON_DEVICE(c, "alltoall", recv);
    }
    return exchange(c, "alltoall", send, NULL, NULL, recv, NULL, NULL, count, es, req);
}

static loom_status nccl_alltoallv_start(void *self, const void *send, const size_t *send_counts,
                                        const size_t *send_displs, void *recv,
                                        const size_t *recv_counts, const size_t *recv_displs,
                                        loom_dtype dt, loom_comm_request **req)
{
    nccl_comm *c = self;
    loom_status st = begin(c, "alltoallv", req);
    if (st != LOOM_OK)
        return st;
    size_t es = dt_size(dt);
    if (es == 0)
        return bad(c, "alltoallv", "unknown dtype");
    if (!send_counts || !send_displs || !recv_counts || !recv_displs)
        return bad(c, "alltoallv", "counts and displacements must not be NULL");
    int sends = 0, recvs = 0;
    for (int p = 0; p < c->world; p++) {
        sends |= send_counts[p] > 0;
        recvs |= recv_counts[p] > 0;
    }
    if ((sends && send == NULL) || (recvs && recv == NULL))
        return bad(c, "alltoallv", "send and recv must not be NULL");
    if (sends)
        ON_DEVICE(c, "alltoallv", send);
    if (recvs)
        ON_DEVICE(c, "alltoallv", recv);
    return exchange(c, "alltoallv", send, send_counts, send_displs, recv, recv_counts,
                    recv_displs, 0, es, req);
}

static loom_status p2p_start(nccl_comm *c, const char *what, int is_send, void *buf,
                             size_t count, loom_dtype dt, int peer, loom_comm_request **req)
{
    loom_status st = begin(c, what, req);
    if (st != LOOM_OK)
        return st;
    size_t es = dt_size(dt);
    if (es == 0)
        return bad(c, what, "unknown dtype");
    if (count > 0 && buf == NULL)
        return bad(c, what, "buf must not be NULL");
    if (peer < 0 || peer >= c->world)
        return bad(c, what, "peer is not a rank of this communicator");
    if (peer == c->rank)
        return c->host->fail(LOOM_ERR_UNSUPPORTED, "nccl %s: peer is this rank (%d); NCCL "
                             "needs a send to oneself paired in one group, copy instead",
                             what, peer);
    if (count > 0)
        ON_DEVICE(c, what, buf);
    ncclResult_t r = ncclSuccess;
    if (count > 0)
        r = is_send ? ncclSend(buf, count * es, ncclUint8, peer, c->comm, c->stream)
                    : ncclRecv(buf, count * es, ncclUint8, peer, c->comm, c->stream);
    return finish(c, r, what, peer, req);
}

static loom_status nccl_send_start(void *self, const void *buf, size_t count, loom_dtype dt,
                                   int peer, loom_comm_request **req)
{
    return p2p_start(self, "send", 1, (void *)buf, count, dt, peer, req);
}

static loom_status nccl_recv_start(void *self, void *buf, size_t count, loom_dtype dt, int peer,
                                   loom_comm_request **req)
{
    return p2p_start(self, "recv", 0, buf, count, dt, peer, req);
}

/* Sends and receives as one NCCL group: NCCL's send waits for its receiver (one stream per
 * communicator runs them in order), so transfers that must progress together, such as a
 * pipeline stage's send to the next stage and its receive from it, go in one group. */
static loom_status nccl_p2p_group_start(void *self, const loom_p2p *items, int n,
                                        loom_comm_request **req)
{
    nccl_comm *c = self;
    loom_status st = begin(c, "p2p group", req);
    if (st != LOOM_OK)
        return st;
    if (n < 0 || (n > 0 && items == NULL))
        return bad(c, "p2p group", "items must hold n >= 0 sends and receives");
    for (int i = 0; i < n; i++) {
        const loom_p2p *it = &items[i];
        const char *what = it->send ? "p2p group send" : "p2p group recv";
        if (dt_size(it->dt) == 0)
            return bad(c, what, "unknown dtype");
        if (it->count > 0 && it->buf == NULL)
            return bad(c, what, "buf must not be NULL");
        if (it->peer < 0 || it->peer >= c->world)
            return bad(c, what, "peer is not a rank of this communicator");
        if (it->peer == c->rank)
            return c->host->fail(LOOM_ERR_UNSUPPORTED, "nccl %s: peer is this rank (%d); copy "
                                 "instead", what, it->peer);
        if (it->count > 0)
            ON_DEVICE(c, what, it->buf);
    }
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        const loom_p2p *it = &items[i];
        size_t bytes = it->count * dt_size(it->dt);
        if (bytes == 0)
            continue;
        r = it->send ? ncclSend(it->buf, bytes, ncclUint8, it->peer, c->comm, c->stream)
                     : ncclRecv(it->buf, bytes, ncclUint8, it->peer, c->comm, c->stream);
        if (r == ncclInProgress)
            r = ncclSuccess;
    }
    ncclResult_t e = ncclGroupEnd(); /* ends the group even after a failed item */
    if (r == ncclSuccess)
        r = e;
    return finish(c, r, "p2p group", n == 1 ? items[0].peer : -1, req);
}

static loom_status nccl_barrier_start(void *self, loom_comm_request **req)
{
    nccl_comm *c = self;
    loom_status st = begin(c, "barrier", req);
    if (st != LOOM_OK)
        return st;
    ncclResult_t r = ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->comm,
                                   c->stream);
    return finish(c, r, "barrier", -1, req);
}

/* ---- completion --------------------------------------------------------------------- */

/* The event goes back to the pool: a later record on it replaces this one, so reuse is
 * fine even when an abort left it pending. */
static void req_free(nccl_comm *c, loom_comm_request *r)
{
    if (c->pending == r)
        c->pending = NULL;
    loom_handle_pool_release(&c->events, (void *)r->done);
    c->host->free(r);
}

static loom_status nccl_wait(void *self, loom_comm_request *r)
{
    nccl_comm *c = self;
    if (c == NULL)
        return LOOM_ERR_INVALID;
    if (r == NULL)
        return c->host->fail(LOOM_ERR_INVALID, "nccl wait: request is NULL");
    const char *what = r->what;
    int peer = r->peer;
    cudaSetDevice(c->device);
    loom_status st = LOOM_OK;
    if (!r->recorded && !c->aborted)
        st = settle_pending(c);
    if (st != LOOM_OK || c->aborted) {
        if (st == LOOM_OK)
            st = c->host->fail(LOOM_ERR_COMM, "nccl %s: communicator was aborted after an "
                               "earlier failure", what);
        req_free(c, r);
        return st;
    }
    /* device_wait: the backend's kernels queued from now on wait for the result on the
     * device, and the host goes on. The event may go back to the pool at once: a stream
     * wait takes the record current at the call. (Without device_wait the host waits for
     * the event below, which orders every later kernel as well, and a stuck peer costs only
     * the communication stream: the backend's stream is never made to wait on it.) */
    if (c->user_stream != NULL && c->device_wait) {
        cudaError_t we = cudaStreamWaitEvent(c->user_stream, r->done, 0);
        ncclResult_t a = ncclSuccess, q = ncclCommGetAsyncError(c->comm, &a);
        req_free(c, r);
        if (we != cudaSuccess)
            return c->host->fail(LOOM_ERR_COMM, "nccl %s: making the backend stream wait: %s",
                                 what, cudaGetErrorString(we));
        if (q != ncclSuccess || (a != ncclSuccess && a != ncclInProgress))
            return fail_abort(c, LOOM_ERR_COMM, what, peer,
                              ncclGetErrorString(q != ncclSuccess ? q : a));
        return LOOM_OK;
    }
    double deadline = now_ms() + c->timeout_ms;
    for (;;) {
        cudaError_t e = cudaEventQuery(r->done);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady) {
            st = fail_abort(c, LOOM_ERR_COMM, what, peer, cudaGetErrorString(e));
            break;
        }
        if (c->aborted) {
            st = c->host->fail(LOOM_ERR_COMM, "nccl %s: communicator was aborted after an "
                               "earlier failure", what);
            break;
        }
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &a);
        if (q != ncclSuccess || (a != ncclSuccess && a != ncclInProgress)) {
            st = fail_abort(c, LOOM_ERR_COMM, what, peer,
                            ncclGetErrorString(q != ncclSuccess ? q : a));
            break;
        }
        if (now_ms() > deadline) {
            char why[160];
            snprintf(why, sizeof why, "not complete after timeout_ms=%d (a peer rank may have "
                     "stopped or not started the same operation)", c->timeout_ms);
            st = fail_abort(c, LOOM_ERR_TIMEOUT, what, peer, why);
            break;
        }
        nap(c->poll_us);
    }
    req_free(c, r);
    return st;
}

static int nccl_test(void *self, loom_comm_request *r)
{
    nccl_comm *c = self;
    if (c == NULL || r == NULL)
        return 1;
    cudaSetDevice(c->device);
    if (!r->recorded && !c->aborted) { /* one look at the enqueue, no sleep */
        ncclResult_t a = ncclInProgress;
        if (ncclCommGetAsyncError(c->comm, &a) != ncclSuccess ||
            (a != ncclSuccess && a != ncclInProgress))
            return 1; /* failed: wait reports it at once */
        if (a == ncclInProgress)
            return 0;
        if (settle_pending(c) != LOOM_OK) /* settled: record the event, no poll left */
            return 1;
    }
    if (c->aborted || cudaEventQuery(r->done) != cudaErrorNotReady)
        return 1;
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(c->comm, &a) != ncclSuccess ||
        (a != ncclSuccess && a != ncclInProgress))
        return 1; /* wait reports it at once */
    return 0;
}

/* ---- descriptor --------------------------------------------------------------------- */

static int nccl_probe(char *reason, size_t reason_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return 1;
    if (reason && reason_len)
        snprintf(reason, reason_len, "no CUDA device visible (cudaGetDeviceCount = %d%s%s)",
                 e == cudaSuccess ? n : 0, e == cudaSuccess ? "" : ": ",
                 e == cudaSuccess ? "" : cudaGetErrorString(e));
    return 0;
}

static const loom_comm_ops ops = {
    .size = sizeof(loom_comm_ops),
    .create = nccl_create,
    .destroy = nccl_destroy,
    .rank = nccl_rank,
    .world = nccl_world,
    .split = nccl_split,
    .allreduce_start = nccl_allreduce_start,
    .reduce_scatter_start = nccl_reduce_scatter_start,
    .allgather_start = nccl_allgather_start,
    .broadcast_start = nccl_broadcast_start,
    .alltoall_start = nccl_alltoall_start,
    .alltoallv_start = nccl_alltoallv_start,
    .send_start = nccl_send_start,
    .recv_start = nccl_recv_start,
    .barrier_start = nccl_barrier_start,
    .wait = nccl_wait,
    .test = nccl_test,
    .flags = LOOM_COMM_DEVICE_MEMORY | LOOM_COMM_P2P_RENDEZVOUS,
    .p2p_group_start = nccl_p2p_group_start,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_COMM,
    .name = "nccl",
    .version = "0.1.0",
    .summary = "CUDA device buffers over NCCL (non-blocking communicators, abort on timeout)",
    .config_keys = keys,
    .n_config_keys = N_KEYS,
    .probe = nccl_probe,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
