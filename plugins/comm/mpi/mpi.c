/* mpi.c — loom-comm-mpi: the communicator over MPI (built and tested with Open MPI).
 *
 * What: the full loom_comm_ops over an MPI communicator. Ranks must be started by MPI's own
 * launcher (mpirun/mpiexec): create() takes MPI_COMM_WORLD when its rank/size match the
 * rank/world it is given, else it fails ("start ranks with mpirun for comm=\"mpi\"");
 * `loom launch` cannot start MPI ranks. The rendezvous store is not used.
 *
 * Reproducibility (the interface contract: fixed reduction order, bitwise results):
 * reductions do NOT use MPI_Iallreduce/MPI_Ireduce_scatter_block. Open MPI's reductions
 * are deterministic only for a fixed world size, process placement and algorithm
 * selection (coll/tuned picks recursive doubling, ring, Rabenseifner... by size and
 * world, and MCA settings or an Open MPI upgrade change that); their order is not rank
 * order, so results differ from shm's and between world sizes. Instead every reduction
 * is done as: MPI_Ialltoallv (rank r receives every rank's block r) -> reduce locally in
 * rank order 0..n-1 (f32 for f32/bf16/f16, rounded once to nearest-even; int64 for the
 * integer types, wrapping; avg = sum / n, truncating toward zero for integers) ->
 * MPI_Iallgatherv (allreduce only). The traffic is that of a ring allreduce
 * (2(n-1)/n x size per rank) and the result is bitwise identical to shm's and
 * independent of Open MPI's algorithm choice, for any world size. bf16/f16 therefore
 * need no user-defined MPI_Op: MPI only moves 1/2/4-byte words (MPI_UINT8_T/16/32).
 *
 * Asynchrony: every collective of one communicator goes through a FIFO: its MPI calls
 * are issued only once all earlier collectives of that communicator completed, so the
 * MPI issue order is the start order on every rank (MPI matches collectives by issue
 * order) even when the second stage of an allreduce is issued later from wait/test.
 * wait()/test() advance the FIFO. send/recv use a duplicate communicator and are issued
 * at once (MPI's non-overtaking rule keeps per-pair order).
 * Timeouts: wait() polls MPI_Test, yielding the core for the first 0.2 ms, then with a
 * nanosleep backoff (20 us until 50 ms, then doubling to 2 ms; never a hot spin; see
 * mpi_wait) until the deadline, then returns LOOM_ERR_TIMEOUT. MPI cannot tell which peer
 * is missing. After a timeout the communicator is broken: every later call fails, and
 * destroy() calls MPI_Abort (the only way to not hang on the stuck operation: MPI
 * has no way to cancel a collective), which ends every rank of the job.
 * MPI_Finalize: called by destroy() of the last live communicator (world or group) if
 * this plugin called MPI_Init_thread (MPI cannot be initialised again in the same process).
 * Errors: MPI_ERRORS_RETURN on every communicator; codes become messages with
 * MPI_Error_string. Host memory only (device must be NULL). Single-threaded use
 * (MPI_THREAD_FUNNELED).
 * Invariants: only loom_plugin_entry is exported; every failure goes through host->fail.
 */
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/plugin/comm.h"

#if !defined(__FLT16_MANT_DIG__)
#error "f16 reductions use the compiler's _Float16 (GCC >= 12 or Clang)"
#endif

typedef enum mk {
    MK_ALLREDUCE, MK_REDUCE_SCATTER, MK_ALLGATHER, MK_BROADCAST, MK_ALLTOALL, MK_ALLTOALLV,
    MK_SEND, MK_RECV, MK_BARRIER
} mk;
static const char *const mk_names[] = {"allreduce", "reduce_scatter", "allgather",
                                       "broadcast", "alltoall", "alltoallv", "send", "recv",
                                       "barrier"};

typedef struct mpi_comm mpi_comm;

struct loom_comm_request {
    mk kind;
    loom_dtype dt;
    loom_reduce_op op;
    size_t es, count;
    const void *send;
    void *recv;
    int peer;
    int stage;     /* 0: not issued, 1: first MPI call in flight, 2: second, 3: done */
    int in_queue;
    MPI_Request mreq;
    loom_status st;
    void *tmp;     /* reductions: n blocks of this rank's segment */
    int *v;        /* 4n ints: counts/displs for the v-collectives */
    loom_comm_request *next;
};

struct mpi_comm {
    const loom_host *host;
    MPI_Comm coll, p2p;
    int rank, n, timeout_ms;
    int is_world, broken;
    loom_comm_request *head, *tail; /* collectives, in start order */
};

static int g_we_initialised, g_live; /* g_live: communicators not yet destroyed */

static size_t dt_size(loom_dtype dt)
{
    switch (dt) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_I32: return 4;
    case LOOM_DTYPE_BF16: case LOOM_DTYPE_F16: case LOOM_DTYPE_U16: return 2;
    case LOOM_DTYPE_U8: return 1;
    }
    return 0;
}

static MPI_Datatype word(size_t es)
{
    return es == 4 ? MPI_UINT32_T : es == 2 ? MPI_UINT16_T : MPI_UINT8_T;
}

static loom_status mfail(const loom_host *h, int code, const char *what)
{
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, s, &len);
    return h->fail(LOOM_ERR_COMM, "mpi %s: %s", what, s);
}

/* ---- reductions in rank order ------------------------------------------------------- */

static float to_f32(loom_dtype dt, const uint8_t *p)
{
    if (dt == LOOM_DTYPE_F32) { float f; memcpy(&f, p, 4); return f; }
    uint16_t h;
    memcpy(&h, p, 2);
    if (dt == LOOM_DTYPE_BF16) { uint32_t b = (uint32_t)h << 16; float f; memcpy(&f, &b, 4); return f; }
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

static void from_f32(loom_dtype dt, float f, uint8_t *p)
{
    if (dt == LOOM_DTYPE_F32) { memcpy(p, &f, 4); return; }
    uint16_t h;
    if (dt == LOOM_DTYPE_BF16) {
        uint32_t b;
        memcpy(&b, &f, 4);
        if ((b & 0x7fffffffu) > 0x7f800000u)
            h = (uint16_t)((b >> 16) | 0x40); /* NaN stays NaN */
        else
            h = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16); /* nearest, ties to even */
    } else {
        _Float16 x = (_Float16)f;
        memcpy(&h, &x, 2);
    }
    memcpy(p, &h, 2);
}

/* out[i] = reduce over p = 0..n-1 of blk[p*len + i]. */
static void reduce_blocks(loom_dtype dt, loom_reduce_op op, int n, const uint8_t *blk,
                          size_t len, uint8_t *out)
{
    size_t es = dt_size(dt);
    for (size_t i = 0; i < len; i++) {
        if (dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16) {
            float acc = to_f32(dt, blk + i * es);
            for (int p = 1; p < n; p++) {
                float x = to_f32(dt, blk + ((size_t)p * len + i) * es);
                acc = op == LOOM_REDUCE_MAX ? (x > acc ? x : acc) : acc + x;
            }
            if (op == LOOM_REDUCE_AVG)
                acc = acc / (float)n;
            from_f32(dt, acc, out + i * es);
        } else {
            int64_t acc = 0;
            for (int p = 0; p < n; p++) {
                const uint8_t *q = blk + ((size_t)p * len + i) * es;
                int64_t x;
                if (dt == LOOM_DTYPE_I32) { int32_t v; memcpy(&v, q, 4); x = v; }
                else if (dt == LOOM_DTYPE_U16) { uint16_t v; memcpy(&v, q, 2); x = v; }
                else x = *q;
                acc = p == 0 ? x : op == LOOM_REDUCE_MAX ? (x > acc ? x : acc) : acc + x;
            }
            if (op == LOOM_REDUCE_AVG)
                acc /= n;
            uint64_t u = (uint64_t)acc;
            if (es == 4) { uint32_t v = (uint32_t)u; memcpy(out + i * es, &v, 4); }
            else if (es == 2) { uint16_t v = (uint16_t)u; memcpy(out + i * es, &v, 2); }
            else out[i] = (uint8_t)u;
        }
    }
}

/* Allreduce segments: block b has count/n (+1 for the first count%n blocks) elements. */
static size_t seg_len(size_t count, int n, int b)
{
    return count / (size_t)n + ((size_t)b < count % (size_t)n ? 1 : 0);
}
static size_t seg_off(size_t count, int n, int b)
{
    size_t r = count % (size_t)n, q = count / (size_t)n;
    return (size_t)b * q + ((size_t)b < r ? (size_t)b : r);
}

/* ---- the progress engine ------------------------------------------------------------ */

/* Issue the next MPI call of r (stage 0 -> 1, or 1 -> 2 for allreduce). */
static loom_status issue(mpi_comm *c, loom_comm_request *r)
{
    int n = c->n, me = c->rank, e = MPI_SUCCESS;
    MPI_Datatype w = word(r->es);
    const char *name = mk_names[r->kind];
    if (r->stage == 0) {
        switch (r->kind) {
        case MK_ALLREDUCE:
        case MK_REDUCE_SCATTER: {
            /* every rank's block `me` into tmp, rank p's at p*len */
            size_t len = r->kind == MK_ALLREDUCE ? seg_len(r->count, n, me) : r->count;
            int *sc = r->v, *sd = r->v + n, *rc = r->v + 2 * n, *rd = r->v + 3 * n;
            for (int p = 0; p < n; p++) {
                size_t l = r->kind == MK_ALLREDUCE ? seg_len(r->count, n, p) : r->count;
                size_t o = r->kind == MK_ALLREDUCE ? seg_off(r->count, n, p) : (size_t)p * r->count;
                sc[p] = (int)l, sd[p] = (int)o, rc[p] = (int)len, rd[p] = (int)((size_t)p * len);
            }
            e = MPI_Ialltoallv(r->send, sc, sd, w, r->tmp, rc, rd, w, c->coll, &r->mreq);
            break;
        }
        case MK_ALLGATHER: {
            const void *s = (const uint8_t *)r->recv + (size_t)me * r->count * r->es == r->send
                                ? MPI_IN_PLACE : r->send;
            e = MPI_Iallgather(s, (int)r->count, w, r->recv, (int)r->count, w, c->coll, &r->mreq);
            break;
        }
        case MK_BROADCAST:
            e = MPI_Ibcast(r->recv, (int)r->count, w, r->peer, c->coll, &r->mreq);
            break;
        case MK_ALLTOALL:
            e = MPI_Ialltoall(r->send, (int)r->count, w, r->recv, (int)r->count, w, c->coll,
                              &r->mreq);
            break;
        case MK_ALLTOALLV:
            e = MPI_Ialltoallv(r->send, r->v, r->v + n, w, r->recv, r->v + 2 * n, r->v + 3 * n,
                               w, c->coll, &r->mreq);
            break;
        case MK_BARRIER:
            e = MPI_Ibarrier(c->coll, &r->mreq);
            break;
        case MK_SEND:
            e = MPI_Isend(r->send, (int)r->count, w, r->peer, 0, c->p2p, &r->mreq);
            break;
        case MK_RECV:
            e = MPI_Irecv(r->recv, (int)r->count, w, r->peer, 0, c->p2p, &r->mreq);
            break;
        }
        r->stage = 1;
    } else { /* allreduce, stage 2: reduce my segment into recv, then gather the segments */
        size_t len = seg_len(r->count, n, me);
        reduce_blocks(r->dt, r->op, n, r->tmp, len, (uint8_t *)r->recv + seg_off(r->count, n, me) * r->es);
        int *rc = r->v, *rd = r->v + n;
        for (int p = 0; p < n; p++)
            rc[p] = (int)seg_len(r->count, n, p), rd[p] = (int)seg_off(r->count, n, p);
        e = MPI_Iallgatherv(MPI_IN_PLACE, 0, w, r->recv, rc, rd, w, c->coll, &r->mreq);
        r->stage = 2;
    }
    if (e != MPI_SUCCESS) {
        r->stage = 3;
        r->st = mfail(c->host, e, name);
    }
    return r->st;
}

/* Test r's MPI request; on completion advance r (issue its next stage or finish it). */
static void step(mpi_comm *c, loom_comm_request *r)
{
    if (r->stage == 3)
        return;
    if (r->stage == 0) {
        issue(c, r);
        return;
    }
    int flag = 0, e = MPI_Test(&r->mreq, &flag, MPI_STATUS_IGNORE);
    if (e != MPI_SUCCESS) {
        r->stage = 3;
        r->st = mfail(c->host, e, mk_names[r->kind]);
        return;
    }
    if (!flag)
        return;
    if (r->kind == MK_ALLREDUCE && r->stage == 1) {
        issue(c, r);
        return;
    }
    if (r->kind == MK_REDUCE_SCATTER)
        reduce_blocks(r->dt, r->op, c->n, r->tmp, r->count, r->recv);
    r->stage = 3;
}

/* Advance the collective FIFO as far as it goes without blocking. */
static void progress(mpi_comm *c)
{
    while (c->head) {
        loom_comm_request *r = c->head;
        step(c, r);
        if (r->stage != 3)
            return;
        c->head = r->next;
        if (c->head == NULL)
            c->tail = NULL;
        r->in_queue = 0;
    }
}

static void advance(mpi_comm *c, loom_comm_request *r)
{
    progress(c);
    if (!r->in_queue)
        step(c, r);
}

static void req_free(mpi_comm *c, loom_comm_request *r)
{
    c->host->free(r->tmp);
    c->host->free(r->v);
    c->host->free(r);
}

static loom_status mpi_wait(void *self, loom_comm_request *r)
{
    mpi_comm *c = self;
    if (c == NULL || r == NULL)
        return LOOM_ERR_INVALID;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long sleep_ns = 0;
    for (;;) {
        if (c->broken && r->stage != 3) {
            /* keep r alive: MPI may still write into it */
            return c->host->fail(LOOM_ERR_COMM, "mpi %s: the communicator is broken by an "
                                 "earlier timeout", mk_names[r->kind]);
        }
        advance(c, r);
        if (r->stage == 3)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double ms = (double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6;
        if (ms >= c->timeout_ms) {
            c->broken = 1;
            return c->host->fail(LOOM_ERR_TIMEOUT, "mpi %s did not complete within %d ms (a "
                                 "peer is dead or stuck; MPI cannot say which) on rank %d of %d",
                                 mk_names[r->kind], c->timeout_ms, c->rank, c->n);
        }
        /* Open MPI moves large messages only inside MPI calls (no progress thread), so
         * poll often while an operation is young: 20 us sleeps for the first 50 ms, then
         * back off, doubling to 2 ms. The first 0.2 ms only yield the core (a sleep
         * costs ~60 us of timer slack, which dominates small messages). Never a hot
         * spin: every poll either yields or sleeps. */
        if (ms < 0.2) {
            sched_yield();
            continue;
        }
        if (ms < 50)
            sleep_ns = 20000;
        else if (sleep_ns < 2000000)
            sleep_ns = sleep_ns < 50000 ? 50000 : sleep_ns * 2;
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
    }
    loom_status st = r->st;
    req_free(c, r);
    return st;
}

static int mpi_test(void *self, loom_comm_request *r)
{
    mpi_comm *c = self;
    if (c == NULL || r == NULL)
        return 1;
    if (c->broken)
        return r->stage == 3;
    advance(c, r);
    return r->stage == 3;
}

/* ---- create / split / destroy ------------------------------------------------------- */

static loom_status wrap(const loom_host *host, MPI_Comm base, int is_world, mpi_comm **out)
{
    mpi_comm *c = host->alloc(sizeof *c);
    if (c == NULL)
        return host->fail(LOOM_ERR_NOMEM, "mpi: out of memory");
    c->host = host;
    c->coll = c->p2p = MPI_COMM_NULL;
    int e = MPI_Comm_dup(base, &c->coll);
    if (e == MPI_SUCCESS)
        e = MPI_Comm_dup(base, &c->p2p);
    if (e != MPI_SUCCESS) {
        if (c->coll != MPI_COMM_NULL)
            MPI_Comm_free(&c->coll);
        host->free(c);
        return mfail(host, e, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(c->coll, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(c->p2p, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->coll, &c->rank);
    MPI_Comm_size(c->coll, &c->n);
    c->is_world = is_world;
    g_live++;
    *out = c;
    return LOOM_OK;
}

static loom_status mpi_create(const loom_host *host, const loom_config *cfg,
                              const loom_store *store, int rank, int world, int timeout_ms,
                              void *device, void **self)
{
    (void)cfg, (void)store;
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID;
    *self = NULL;
    if (device != NULL)
        return host->fail(LOOM_ERR_UNSUPPORTED, "mpi: host memory only, device must be NULL "
                          "(the nccl communicator handles device buffers)");
    if (timeout_ms <= 0)
        return host->fail(LOOM_ERR_INVALID, "mpi: timeout_ms must be > 0, got %d", timeout_ms);
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized)
        return host->fail(LOOM_ERR_UNSUPPORTED, "mpi: MPI was already finalised in this "
                          "process and cannot be started again");
    if (!inited && world > 1 && getenv("OMPI_COMM_WORLD_SIZE") == NULL &&
        getenv("PMI_SIZE") == NULL && getenv("PMIX_RANK") == NULL)
        return host->fail(LOOM_ERR_INVALID, "mpi: rank %d of %d was not started by an MPI "
                          "launcher: start ranks with mpirun for comm=\"mpi\" (mpirun -np %d "
                          "...; `loom launch` cannot start MPI ranks)", rank, world, world);
    if (!inited) {
        int provided = 0, e = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (e != MPI_SUCCESS)
            return host->fail(LOOM_ERR_COMM, "mpi: MPI_Init_thread failed (error %d)", e);
        g_we_initialised = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int wr = -1, wn = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm_size(MPI_COMM_WORLD, &wn);
    if (wr != rank || wn != world)
        return host->fail(LOOM_ERR_INVALID, "mpi: asked for rank %d of %d but MPI_COMM_WORLD "
                          "is rank %d of %d: start ranks with mpirun for comm=\"mpi\" (mpirun "
                          "-np %d ...; `loom launch` cannot start MPI ranks)", rank, world, wr,
                          wn, world);
    mpi_comm *c = NULL;
    loom_status st = wrap(host, MPI_COMM_WORLD, 1, &c);
    if (st != LOOM_OK)
        return st;
    c->timeout_ms = timeout_ms;
    *self = c;
    return LOOM_OK;
}

/* Complete every queued collective, within the timeout (then the comm is broken). */
static loom_status drain(mpi_comm *c, const char *why)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (c->head && !c->broken) {
        progress(c);
        if (c->head == NULL)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6 >=
            c->timeout_ms) {
            c->broken = 1;
            return c->host->fail(LOOM_ERR_TIMEOUT, "mpi %s: the pending %s did not complete "
                                 "within %d ms (a peer is dead or stuck)", why,
                                 mk_names[c->head->kind], c->timeout_ms);
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return c->broken ? c->host->fail(LOOM_ERR_COMM, "mpi %s: the communicator is broken by an "
                                     "earlier timeout", why) : LOOM_OK;
}

static loom_status mpi_split(void *self, int color, int key, void **out)
{
    mpi_comm *c = self;
    if (c == NULL || out == NULL)
        return LOOM_ERR_INVALID;
    *out = NULL;
    if (c->broken)
        return c->host->fail(LOOM_ERR_COMM, "mpi split: the communicator is broken by an "
                             "earlier timeout");
    if (color < 0)
        return c->host->fail(LOOM_ERR_INVALID, "mpi split: color must be >= 0, got %d", color);
    /* MPI_Comm_split is a collective: issue it after every earlier one. It blocks without
     * a timeout of its own (MPI has none): a dead peer makes it hang. */
    loom_status dst = drain(c, "split");
    if (dst != LOOM_OK)
        return dst;
    MPI_Comm part = MPI_COMM_NULL;
    int e = MPI_Comm_split(c->coll, color, key, &part);
    if (e != MPI_SUCCESS)
        return mfail(c->host, e, "split");
    mpi_comm *s = NULL;
    loom_status st = wrap(c->host, part, 0, &s);
    MPI_Comm_free(&part);
    if (st != LOOM_OK)
        return st;
    s->timeout_ms = c->timeout_ms;
    *out = s;
    return LOOM_OK;
}

static void mpi_destroy(void *self)
{
    mpi_comm *c = self;
    if (c == NULL)
        return;
    if (c->broken) /* a collective is stuck in MPI: nothing can free it or finalise */
        MPI_Abort(MPI_COMM_WORLD, 70);
    if (drain(c, "destroy") != LOOM_OK) /* timed out now: same as above */
        MPI_Abort(MPI_COMM_WORLD, 70);
    MPI_Comm_free(&c->coll);
    MPI_Comm_free(&c->p2p);
    c->host->free(c);
    if (--g_live == 0 && g_we_initialised) { /* the last communicator, world or group */
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin)
            MPI_Finalize();
    }
}

static int mpi_rank(void *self) { return self ? ((mpi_comm *)self)->rank : -1; }
static int mpi_world(void *self) { return self ? ((mpi_comm *)self)->n : 0; }

/* ---- starting requests -------------------------------------------------------------- */

static loom_status prep(mpi_comm *c, mk kind, loom_comm_request **req, loom_dtype dt,
                        size_t count, size_t mult, loom_comm_request **out)
{
    const char *name = mk_names[kind];
    if (c == NULL)
        return LOOM_ERR_INVALID;
    if (req == NULL)
        return c->host->fail(LOOM_ERR_INVALID, "mpi %s: req is NULL", name);
    *req = NULL;
    if (c->broken)
        return c->host->fail(LOOM_ERR_COMM, "mpi %s: the communicator is broken by an "
                             "earlier timeout", name);
    size_t es = kind == MK_BARRIER ? 1 : dt_size(dt);
    if (es == 0)
        return c->host->fail(LOOM_ERR_INVALID, "mpi %s: unknown dtype %d", name, (int)dt);
    if (count > (size_t)INT32_MAX / mult)
        return c->host->fail(LOOM_ERR_INVALID, "mpi %s: count %zu (x%zu blocks) does not fit "
                             "MPI's int counts (at most %d elements)", name, count, mult,
                             INT32_MAX);
    loom_comm_request *r = c->host->alloc(sizeof *r);
    if (r == NULL)
        return c->host->fail(LOOM_ERR_NOMEM, "mpi %s: out of memory", name);
    r->kind = kind;
    r->dt = dt;
    r->es = es;
    r->count = count;
    r->mreq = MPI_REQUEST_NULL;
    *out = r;
    return LOOM_OK;
}

static loom_status need(mpi_comm *c, loom_comm_request *r, int ok, const char *what)
{
    if (ok)
        return LOOM_OK;
    req_free(c, r);
    return c->host->fail(LOOM_ERR_INVALID, "mpi %s: %s", mk_names[r->kind], what);
}

/* Collectives join the FIFO (issued now if it is empty); p2p is issued now. */
static loom_status enqueue(mpi_comm *c, loom_comm_request *r, loom_comm_request **req)
{
    if (r->kind == MK_SEND || r->kind == MK_RECV) {
        loom_status st = issue(c, r);
        if (st != LOOM_OK) {
            req_free(c, r);
            return st;
        }
        *req = r;
        return LOOM_OK;
    }
    r->in_queue = 1;
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    if (c->head == r && issue(c, r) != LOOM_OK) {
        loom_status st = r->st;
        c->head = c->tail = NULL;
        req_free(c, r);
        return st;
    }
    *req = r;
    return LOOM_OK;
}

#define PREP(kind, dt, count, mult)                                   \
    mpi_comm *c = self;                                               \
    loom_comm_request *r = NULL;                                      \
    loom_status st = prep(c, (kind), req, (dt), (count), (mult), &r); \
    if (st != LOOM_OK)                                                \
        return st
#define NEED(cond, what)                              \
    if ((st = need(c, r, (cond), (what))) != LOOM_OK) \
        return st

static loom_status reduce_prep(mpi_comm *c, loom_comm_request *r, loom_reduce_op op,
                               size_t tmp_elems)
{
    loom_status st;
    if ((st = need(c, r, op == LOOM_REDUCE_SUM || op == LOOM_REDUCE_AVG || op == LOOM_REDUCE_MAX,
                   "reduce op is not sum (0), avg (1) or max (2)")) != LOOM_OK)
        return st;
    r->op = op;
    r->tmp = c->host->alloc(tmp_elems * r->es + 1);
    r->v = c->host->alloc(4 * (size_t)c->n * sizeof(int));
    return need(c, r, r->tmp && r->v, "out of memory");
}

static loom_status mpi_allreduce_start(void *self, const void *send, void *recv, size_t count,
                                       loom_dtype dt, loom_reduce_op op, loom_comm_request **req)
{
    PREP(MK_ALLREDUCE, dt, count, 1);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    if ((st = reduce_prep(c, r, op, seg_len(count, c->n, 0) * (size_t)c->n)) != LOOM_OK)
        return st;
    r->send = send;
    r->recv = recv;
    return enqueue(c, r, req);
}

static loom_status mpi_reduce_scatter_start(void *self, const void *send, void *recv,
                                            size_t count, loom_dtype dt, loom_reduce_op op,
                                            loom_comm_request **req)
{
    PREP(MK_REDUCE_SCATTER, dt, count, (size_t)c->n);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    if ((st = reduce_prep(c, r, op, count * (size_t)c->n)) != LOOM_OK)
        return st;
    r->send = send;
    r->recv = recv;
    return enqueue(c, r, req);
}

static loom_status mpi_allgather_start(void *self, const void *send, void *recv, size_t count,
                                       loom_dtype dt, loom_comm_request **req)
{
    PREP(MK_ALLGATHER, dt, count, (size_t)c->n);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    r->send = send;
    r->recv = recv;
    return enqueue(c, r, req);
}

static loom_status mpi_broadcast_start(void *self, void *buf, size_t count, loom_dtype dt,
                                       int root, loom_comm_request **req)
{
    PREP(MK_BROADCAST, dt, count, 1);
    NEED(count == 0 || buf, "buf must not be NULL");
    NEED(root >= 0 && root < c->n, "root is not a rank of this communicator");
    r->recv = buf;
    r->peer = root;
    return enqueue(c, r, req);
}

static loom_status mpi_alltoall_start(void *self, const void *send, void *recv, size_t count,
                                      loom_dtype dt, loom_comm_request **req)
{
    PREP(MK_ALLTOALL, dt, count, (size_t)c->n);
    NEED(count == 0 || (send && recv), "send and recv must not be NULL");
    r->send = send;
    r->recv = recv;
    return enqueue(c, r, req);
}

static loom_status mpi_alltoallv_start(void *self, const void *send, const size_t *send_counts,
                                       const size_t *send_displs, void *recv,
                                       const size_t *recv_counts, const size_t *recv_displs,
                                       loom_dtype dt, loom_comm_request **req)
{
    PREP(MK_ALLTOALLV, dt, 0, 1);
    NEED(send_counts && send_displs && recv_counts && recv_displs,
         "counts and displacements must not be NULL");
    const int n = c->n;
    int sends = 0, recvs = 0, fits = 1;
    for (int p = 0; p < n; p++) {
        sends |= send_counts[p] > 0;
        recvs |= recv_counts[p] > 0;
        fits &= send_counts[p] <= INT32_MAX && send_displs[p] <= INT32_MAX &&
                recv_counts[p] <= INT32_MAX && recv_displs[p] <= INT32_MAX;
    }
    NEED(fits, "a count or displacement does not fit MPI's int (at most 2147483647 "
               "elements)");
    NEED((!sends || send) && (!recvs || recv), "send and recv must not be NULL");
    r->v = c->host->alloc(4 * (size_t)n * sizeof(int));
    NEED(r->v != NULL, "out of memory");
    for (int p = 0; p < n; p++) {
        r->v[p] = (int)send_counts[p];
        r->v[n + p] = (int)send_displs[p];
        r->v[2 * n + p] = (int)recv_counts[p];
        r->v[3 * n + p] = (int)recv_displs[p];
    }
    r->send = send;
    r->recv = recv;
    return enqueue(c, r, req);
}

static loom_status mpi_send_start(void *self, const void *buf, size_t count, loom_dtype dt,
                                  int peer, loom_comm_request **req)
{
    PREP(MK_SEND, dt, count, 1);
    NEED(count == 0 || buf, "buf must not be NULL");
    NEED(peer >= 0 && peer < c->n, "peer is not a rank of this communicator");
    r->send = buf;
    r->peer = peer;
    return enqueue(c, r, req);
}

static loom_status mpi_recv_start(void *self, void *buf, size_t count, loom_dtype dt, int peer,
                                  loom_comm_request **req)
{
    PREP(MK_RECV, dt, count, 1);
    NEED(count == 0 || buf, "buf must not be NULL");
    NEED(peer >= 0 && peer < c->n, "peer is not a rank of this communicator");
    r->recv = buf;
    r->peer = peer;
    return enqueue(c, r, req);
}

static loom_status mpi_barrier_start(void *self, loom_comm_request **req)
{
    PREP(MK_BARRIER, LOOM_DTYPE_U8, 0, 1);
    return enqueue(c, r, req);
}

static int mpi_probe(char *reason, size_t reason_len)
{
    (void)reason, (void)reason_len;
    return 1;
}

static const loom_comm_ops ops = {
    .size = sizeof(loom_comm_ops),
    .create = mpi_create,
    .destroy = mpi_destroy,
    .rank = mpi_rank,
    .world = mpi_world,
    .split = mpi_split,
    .allreduce_start = mpi_allreduce_start,
    .reduce_scatter_start = mpi_reduce_scatter_start,
    .allgather_start = mpi_allgather_start,
    .broadcast_start = mpi_broadcast_start,
    .alltoall_start = mpi_alltoall_start,
    .alltoallv_start = mpi_alltoallv_start,
    .send_start = mpi_send_start,
    .recv_start = mpi_recv_start,
    .barrier_start = mpi_barrier_start,
    .wait = mpi_wait,
    .test = mpi_test,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_COMM,
    .name = "mpi",
    .version = "0.1.0",
    .summary = "ranks started by mpirun, over MPI (Open MPI); rank-order, reproducible "
               "reductions",
    .config_keys = NULL,
    .n_config_keys = 0,
    .probe = mpi_probe,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
