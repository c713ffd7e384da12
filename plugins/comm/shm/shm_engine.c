/* shm_engine.c — requests and the progress engine: the queue behind every *_start, the
 * barriers between collective steps, wait() with its deadline and test().
 *
 * What: *_start only validates and enqueues. The work happens when the process calls
 * wait() or test() (single-threaded progress, like a non-threaded MPI): one pass of the
 * engine advances, without blocking, every live communicator of the family (the world and
 * all groups split from it):
 *   - the oldest unfinished collective of each communicator runs its steps until a
 *     barrier is not yet complete (collectives of one communicator run one at a time, in
 *     start order, the same order on every rank);
 *   - every point-to-point request moves whatever its ring buffer allows (ordered per
 *     peer and direction by tickets, independent of collectives: other resources).
 * So waiting on one group also moves every other group's operations: waiting on groups in
 * different orders on different ranks cannot deadlock, and test() in a loop completes.
 * When a pass moves nothing, wait() sleeps on this rank's doorbell (see shm.h) until
 * someone rings or the deadline passes.
 * What not: no progress thread; nothing moves between calls into the plugin, so a caller
 * that wants communication to overlap compute calls test() now and then (e.g. per layer).
 * A request reports "done" when its own work is done. Collectives of a communicator
 * therefore complete in start order (they run one at a time); a send or receive completes
 * on its own, in order only with the earlier ones to or from the same peer (as in MPI).
 * It must not wait behind earlier requests: a send larger than the mailbox finishes only
 * once the peer posts its receive, and a peer that posts it only after its own receive
 * returns would deadlock with us if that receive also waited for its earlier send (the
 * interleaved pp=2 deadlock: test_comm's large_messages_stream_both_ways).
 * A request is freed by its wait(); waiting for it twice, or testing it after, is
 * undefined (as in MPI).
 * Invariants: the deadline is timeout_ms of no progress on the waited communicator; it
 * fails the oldest request the waited one is queued behind (itself, an earlier collective,
 * or an earlier send/recv with the same peer and direction) with a message naming the
 * rank(s) that did not arrive, and marks the communicator broken (every pending and later
 * request fails with the same message: the ranks no longer agree where they are).
 * Sequence numbers: barriers are numbered per communicator (shm.h), and every collective
 * that has a barrier gets opseq, the count of such collectives before it (count-0 calls
 * have no barrier and take no number, identically on every rank). Its descriptor
 * (op, count, dtype, reduce op, root, opseq) is written before its first barrier and
 * compared by every rank after it, so ranks that called different collectives fail with a
 * message naming both instead of exchanging garbage. It lives in desc[opseq & 1]: a rank
 * rewrites that entry two collectives later, after a barrier of the next collective that
 * the reader must reach first, so a reader never sees it change under it.
 */
#include <stdio.h>
#include <string.h>

#include "shm.h"

const char *shm_kind_name(shm_kind k)
{
    switch (k) {
    case SHM_ALLREDUCE: return "allreduce";
    case SHM_REDUCE_SCATTER: return "reduce_scatter";
    case SHM_ALLGATHER: return "allgather";
    case SHM_BROADCAST: return "broadcast";
    case SHM_ALLTOALL: return "alltoall";
    case SHM_ALLTOALLV: return "alltoallv";
    case SHM_BARRIER: return "barrier";
    case SHM_SEND: return "send";
    case SHM_RECV: return "recv";
    }
    return "?";
}

static int is_coll(shm_kind k) { return k != SHM_SEND && k != SHM_RECV; }

/* Mark c broken: every unfinished request fails with this message. */
static void break_comm(shm_comm *c, loom_status st, const char *msg)
{
    if (!c->broken) {
        c->broken = 1;
        c->broken_st = st;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
    }
    for (loom_comm_request *r = c->head; r != NULL; r = r->next)
        if (!r->done) {
            r->done = 1;
            r->st = st;
            snprintf(r->msg, sizeof r->msg, "%s", msg);
        }
}

loom_status shm_enqueue(shm_comm *c, loom_comm_request *r, loom_comm_request **out)
{
    pthread_mutex_lock(&c->fam->lock);
    if (c->broken) {
        loom_status st = c->broken_st;
        char msg[SHM_MSG];
        snprintf(msg, sizeof msg, "%s", c->broken_msg);
        pthread_mutex_unlock(&c->fam->lock);
        shm_kind kind = r->kind;
        c->host->free(r->v);
        c->host->free(r);
        return c->host->fail(st, "shm %s: communicator unusable after an earlier failure: %s",
                             shm_kind_name(kind), msg);
    }
    r->c = c;
    if (r->kind == SHM_SEND)
        r->ticket = c->send_next[r->peer]++;
    else if (r->kind == SHM_RECV)
        r->ticket = c->recv_next[r->peer]++;
    if (c->tail != NULL)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    pthread_mutex_unlock(&c->fam->lock);
    *out = r;
    return LOOM_OK;
}

void shm_arrive(shm_comm *c)
{
    c->bar++;
    atomic_store_explicit(&shm_ctl_of(c, c->rank)->seq, c->bar, memory_order_release);
    /* seq_cst RMW: releases this rank's staging writes to whoever sees the count. */
    uint32_t v = atomic_fetch_add(&c->hdr->arrived, 1) + 1;
    if (v == (uint32_t)c->n * c->bar) /* the last one in wakes the others */
        for (int q = 0; q < c->n; q++)
            if (q != c->rank)
                shm_ring(c, q);
}

static int barrier_done(shm_comm *c, uint32_t k)
{
    uint32_t target = (uint32_t)c->n * k;
    uint32_t a = atomic_load_explicit(&c->hdr->arrived, memory_order_acquire);
    return (int32_t)(a - target) >= 0;
}

static const char *dtype_name(uint32_t dt)
{
    static const char *const names[] = {"f32", "bf16", "f16", "i32", "u8", "u16"};
    return dt < sizeof names / sizeof names[0] ? names[dt] : "?";
}

static void describe(const shm_desc *d, char *out, size_t cap)
{
    static const char *const ops[] = {"sum", "avg", "max"};
    const char *name = shm_kind_name((shm_kind)d->kind);
    if (d->kind == SHM_BARRIER)
        snprintf(out, cap, "barrier");
    else if (d->kind == SHM_ALLREDUCE || d->kind == SHM_REDUCE_SCATTER)
        snprintf(out, cap, "%s(count %llu, %s, %s)", name, (unsigned long long)d->count,
                 dtype_name(d->dtype), d->redop < 3 ? ops[d->redop] : "?");
    else if (d->kind == SHM_BROADCAST)
        snprintf(out, cap, "%s(count %llu, %s, root %d)", name, (unsigned long long)d->count,
                 dtype_name(d->dtype), (int)d->root);
    else if (d->kind == SHM_ALLTOALLV)
        snprintf(out, cap, "%s(%s)", name, dtype_name(d->dtype));
    else
        snprintf(out, cap, "%s(count %llu, %s)", name, (unsigned long long)d->count,
                 dtype_name(d->dtype));
}

static void publish_desc(shm_comm *c, loom_comm_request *r)
{
    shm_desc *d = &shm_ctl_of(c, c->rank)->desc[r->opseq & 1];
    memset(d, 0, sizeof *d);
    d->opseq = r->opseq;
    d->kind = (uint32_t)r->kind;
    d->count = r->kind == SHM_ALLTOALLV || r->kind == SHM_BARRIER ? 0 : r->count;
    d->dtype = r->kind == SHM_BARRIER ? 0 : (uint32_t)r->dt;
    d->redop = r->kind == SHM_ALLREDUCE || r->kind == SHM_REDUCE_SCATTER ? (uint32_t)r->op : 0;
    d->root = r->kind == SHM_BROADCAST ? r->peer : -1;
}

/* After the first barrier: did every rank start the same collective? */
static loom_status check_descs(shm_comm *c, loom_comm_request *r)
{
    const shm_desc *mine = &shm_ctl_of(c, c->rank)->desc[r->opseq & 1];
    for (int q = 0; q < c->n; q++) {
        const shm_desc *d = &shm_ctl_of(c, q)->desc[r->opseq & 1];
        if (memcmp(d, mine, sizeof *d) == 0)
            continue;
        char theirs[96], ours[96];
        describe(d, theirs, sizeof theirs);
        describe(mine, ours, sizeof ours);
        snprintf(r->msg, sizeof r->msg,
                 "shm %s: rank %d called %s as collective #%u where this rank called %s as "
                 "#%u; every rank of a communicator must call the same collectives in the "
                 "same order with the same counts", shm_kind_name(r->kind), q, theirs,
                 d->opseq, ours, mine->opseq);
        return LOOM_ERR_INVALID;
    }
    return LOOM_OK;
}

/* Advance the oldest unfinished collective as far as it goes without blocking. */
static int coll_advance(shm_comm *c, loom_comm_request *r)
{
    int moved = 0;
    if (!r->begun) {
        r->begun = 1;
        r->round0 = c->round;
        shm_coll_begin(c, r);
        if (r->nsteps > 1) { /* a collective with a barrier: agree on what it is */
            r->opseq = c->opseq++;
            publish_desc(c, r);
        }
        moved = 1;
    }
    for (;;) {
        if (r->in_barrier) {
            if (!barrier_done(c, r->bar))
                return moved;
            r->in_barrier = 0;
            moved = 1;
            if (r->step == 1 && check_descs(c, r) != LOOM_OK) {
                char msg[SHM_MSG];
                snprintf(msg, sizeof msg, "%s", r->msg);
                break_comm(c, LOOM_ERR_INVALID, msg);
                return 1;
            }
        }
        if (r->step >= r->nsteps) {
            c->round = r->round0 + r->rounds;
            r->done = 1;
            r->st = LOOM_OK;
            return 1;
        }
        loom_status st = shm_coll_step(c, r, r->step);
        if (st != LOOM_OK) {
            char msg[SHM_MSG];
            snprintf(msg, sizeof msg, "%s", r->msg);
            break_comm(c, st, msg);
            return 1;
        }
        r->step++;
        if (r->step < r->nsteps) {
            shm_arrive(c);
            r->bar = c->bar;
            r->in_barrier = 1;
        }
        moved = 1;
    }
}

static int progress_comm(shm_comm *c)
{
    int moved = 0, coll_blocked = 0;
    for (loom_comm_request *r = c->head; r != NULL && !c->broken; r = r->next) {
        if (r->done)
            continue;
        if (!is_coll(r->kind))
            moved |= shm_p2p_advance(c, r);
        else if (!coll_blocked) {
            moved |= coll_advance(c, r);
            coll_blocked = !r->done; /* later collectives wait their turn */
        }
    }
    return moved;
}

/* One non-blocking pass over the family; returns whether anything on c moved. */
static int progress_family(shm_family *f, shm_comm *c)
{
    int moved_c = 0;
    for (shm_comm *x = f->comms; x != NULL; x = x->fam_next) {
        int m = progress_comm(x);
        if (x == c)
            moved_c = m;
    }
    return moved_c;
}

/* The oldest unfinished request that req is queued behind: for a collective, the oldest
 * unfinished collective; for a send or recv, the oldest unfinished one of the same kind
 * and peer (tickets); req itself when nothing before it holds it up. */
static loom_comm_request *blocker(shm_comm *c, loom_comm_request *req)
{
    for (loom_comm_request *r = c->head; r != NULL && r != req; r = r->next)
        if (!r->done && (is_coll(req->kind) ? is_coll(r->kind)
                                            : r->kind == req->kind && r->peer == req->peer))
            return r;
    return req;
}

/* The deadline passed waiting for req: name who we are waiting for, and break the
 * communicator. */
static void fail_timeout(shm_comm *c, loom_comm_request *req)
{
    loom_comm_request *r = blocker(c, req);
    if (r->done)
        return;
    char who[160] = "", msg[SHM_MSG];
    int missing = 0;
    size_t used = 0;
    for (int q = 0; q < c->n; q++) {
        int late;
        if (is_coll(r->kind))
            late = r->in_barrier &&
                   (int32_t)(atomic_load(&shm_ctl_of(c, q)->seq) - r->bar) < 0;
        else
            late = q == r->peer;
        if (!late)
            continue;
        char one[40];
        if (c->world_of[q] != q)
            snprintf(one, sizeof one, "%s%d (world rank %d)", missing ? ", " : "", q,
                     c->world_of[q]);
        else
            snprintf(one, sizeof one, "%s%d", missing ? ", " : "", q);
        if (used + strlen(one) + 8 < sizeof who) {
            memcpy(who + used, one, strlen(one) + 1);
            used += strlen(one);
        } else if (used + 5 < sizeof who) {
            memcpy(who + used, ", ...", 6);
            used = sizeof who;
        }
        missing++;
    }
    const char *what = r->kind == SHM_SEND ? "did not receive"
                     : r->kind == SHM_RECV ? "did not send"
                                           : "did not arrive";
    if (missing == 0)
        snprintf(msg, sizeof msg, "shm %s: no progress within %d ms (a peer is dead or stuck)",
                 shm_kind_name(r->kind), c->timeout_ms);
    else
        snprintf(msg, sizeof msg, "shm %s: rank%s %s %s within %d ms (dead or stuck?)",
                 shm_kind_name(r->kind), missing > 1 ? "s" : "", who, what, c->timeout_ms);
    break_comm(c, LOOM_ERR_TIMEOUT, msg);
}

static void unlink_request(shm_comm *c, loom_comm_request *req)
{
    loom_comm_request *prev = NULL;
    for (loom_comm_request *r = c->head; r != NULL; prev = r, r = r->next)
        if (r == req) {
            if (prev != NULL)
                prev->next = r->next;
            else
                c->head = r->next;
            if (c->tail == r)
                c->tail = prev;
            return;
        }
}

loom_status shm_wait(void *self, loom_comm_request *req)
{
    shm_comm *c = self;
    if (c == NULL || req == NULL)
        return c ? c->host->fail(LOOM_ERR_INVALID, "shm wait: request is NULL")
                 : LOOM_ERR_INVALID;
    if (req->c != c)
        return c->host->fail(LOOM_ERR_INVALID,
                             "shm wait: the request belongs to another communicator");
    shm_family *f = c->fam;
    shm_bell *bell = &f->bells[f->world_rank];
    const double timeout = c->timeout_ms / 1000.0;
    double deadline = shm_now() + timeout;
    pthread_mutex_lock(&f->lock);
    for (;;) {
        /* Sample the bell BEFORE looking: a ring after this read changes it. */
        uint32_t seen = atomic_load(&bell->ring);
        int moved = progress_family(f, c);
        if (req->done)
            break;
        double now = shm_now();
        if (moved) {
            deadline = now + timeout;
            continue;
        }
        if (now >= deadline) {
            fail_timeout(c, req);
            continue;
        }
        pthread_mutex_unlock(&f->lock);
        atomic_fetch_add(&bell->sleepers, 1);
        if (atomic_load(&bell->ring) == seen)
            shm_futex_wait(&bell->ring, seen, deadline - now);
        atomic_fetch_sub(&bell->sleepers, 1);
        pthread_mutex_lock(&f->lock);
    }
    loom_status st = req->st;
    char msg[SHM_MSG];
    snprintf(msg, sizeof msg, "%s", req->msg);
    unlink_request(c, req);
    pthread_mutex_unlock(&f->lock);
    c->host->free(req->v);
    c->host->free(req);
    return st == LOOM_OK ? LOOM_OK : c->host->fail(st, "%s", msg);
}

int shm_test(void *self, loom_comm_request *req)
{
    shm_comm *c = self;
    if (c == NULL || req == NULL || req->c != c)
        return 1; /* wait() will say what is wrong, at once */
    pthread_mutex_lock(&c->fam->lock);
    progress_family(c->fam, c);
    int done = req->done;
    pthread_mutex_unlock(&c->fam->lock);
    return done;
}

void shm_drop_requests(shm_comm *c)
{
    loom_comm_request *r = c->head;
    while (r != NULL) {
        loom_comm_request *next = r->next;
        c->host->free(r->v);
        c->host->free(r);
        r = next;
    }
    c->head = c->tail = NULL;
}
