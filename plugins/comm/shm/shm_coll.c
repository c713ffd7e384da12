/* shm_coll.c — the collective algorithms, each written as a list of local steps separated
 * by barriers (the engine in shm_engine.c runs them: step, barrier, step, ...).
 *
 * Allreduce — the "direct shared-memory" scheme (reduce-scatter + all-gather in place):
 *   chunk c of the message (chunk_bytes) goes through three phases, one barrier apart:
 *     in(c)     each rank copies its chunk into its own staging slot;
 *     reduce(c) rank r sums slice r (1/n of the chunk) over ALL ranks' slots, in rank order
 *               0..n-1, and writes the result over slice r of its own slot;
 *     out(c)    every rank copies slice q from rank q's slot, for every q.
 *   Pipelined over 3 slots: step k does out(k-2) + reduce(k-1) + in(k), so a chunk of n
 *   ranks costs ONE barrier, and C chunks take C+2 steps.
 *   Why not a ring: in shared memory every rank reads every peer's staging at the same
 *   cost, so a ring's n-1 neighbour hops only add n-1 synchronisations per chunk and
 *   2(n-1) partial copies; the direct scheme reads each input exactly once, moves
 *   ~5 bytes per payload byte per rank whatever n is (copy in, n slices read, 1/n written,
 *   copy out), and every element's sum has the same association ((x0+x1)+x2)+... on every
 *   rank and for every chunking. See bench_comm (tests/comm) for numbers.
 *   Small messages (<= small_bytes): one barrier instead of two phases: copy in, barrier,
 *   every rank reduces the whole message from all slots in rank order. The same sum, bit
 *   for bit, as the large path (same order, same arithmetic), so the threshold never
 *   changes a result.
 * Other collectives take one barrier per round; a round moves one slot's worth:
 *   allgather, broadcast: round j = elements [j*E, (j+1)*E) of the message (E = chunk
 *   elements); blocked ops (reduce_scatter, alltoall, alltoallv): the slot is cut into n
 *   sub-slots of S = chunk/n elements, sub-slot p holding this round's piece for rank p;
 *   step i does out(i-1) + in(i).
 * Slot safety (3 slots, global round number g, slot g % 3): a slot written in step s is
 * read only in steps s+1 (and s+2 for allreduce). It is rewritten for round g+3, at the
 * earliest two steps after its last read, i.e. after a barrier that every reader has
 * passed; across collectives the next one's first write goes to the slot not read by the
 * previous one's final step (the previous final step reads only the latest round).
 * What not: no rank-0 funnel, no reordering by arrival time; in-place calls (recv ==
 * send, or recv inside send for reduce_scatter/allgather) work because each round reads
 * its input before anything of that range is written.
 */
#include <stdio.h>
#include <string.h>

#include "shm.h"

typedef unsigned char u8;

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

static int ar_small(const shm_comm *c, const loom_comm_request *r)
{
    return r->count * r->es <= c->small;
}

void shm_coll_begin(shm_comm *c, loom_comm_request *r)
{
    size_t E = c->chunk / r->es, S = c->chunk / (size_t)c->n / r->es;
    r->step = 0;
    r->rounds = 0;
    r->nsteps = 0;
    switch (r->kind) {
    case SHM_BARRIER:
        r->nsteps = 2;
        return;
    case SHM_ALLTOALLV:
        r->per_round = S;
        r->rounds = 1;       /* the counts exchange; data rounds are added at step 1 */
        r->nsteps = 2;
        return;
    case SHM_ALLREDUCE:
        if (r->count == 0)
            return;
        if (ar_small(c, r)) {
            r->per_round = r->count;
            r->rounds = 1;
            r->nsteps = 2;
        } else {
            r->per_round = E;
            r->rounds = (uint32_t)ceil_div(r->count, E);
            r->nsteps = r->rounds + 2;
        }
        return;
    case SHM_ALLGATHER:
    case SHM_BROADCAST:
        r->per_round = E;
        break;
    case SHM_REDUCE_SCATTER:
    case SHM_ALLTOALL:
        r->per_round = S;
        break;
    case SHM_SEND:
    case SHM_RECV:
        return;
    }
    if (r->count == 0)
        return;
    r->rounds = (uint32_t)ceil_div(r->count, r->per_round);
    r->nsteps = r->rounds + 1;
}

/* ---- allreduce ---------------------------------------------------------------------- */

static void slice(size_t len, int n, int q, size_t *lo, size_t *hi)
{
    *lo = len * (size_t)q / (size_t)n;
    *hi = len * (size_t)(q + 1) / (size_t)n;
}

static void ar_in(shm_comm *c, loom_comm_request *r, uint32_t k)
{
    size_t first = (size_t)k * r->per_round, len = min_sz(r->per_round, r->count - first);
    memcpy(shm_slot(c, c->rank, r->round0 + k), (const u8 *)r->send + first * r->es, len * r->es);
}

static void ar_reduce(shm_comm *c, loom_comm_request *r, uint32_t k)
{
    size_t first = (size_t)k * r->per_round, len = min_sz(r->per_round, r->count - first);
    size_t lo, hi;
    slice(len, c->n, c->rank, &lo, &hi);
    const void *in[SHM_MAX_WORLD];
    for (int q = 0; q < c->n; q++)
        in[q] = shm_slot(c, q, r->round0 + k) + lo * r->es;
    shm_reduce(r->dt, r->op, c->n, in, shm_slot(c, c->rank, r->round0 + k) + lo * r->es, hi - lo);
}

static void ar_out(shm_comm *c, loom_comm_request *r, uint32_t k)
{
    size_t first = (size_t)k * r->per_round, len = min_sz(r->per_round, r->count - first);
    for (int q = 0; q < c->n; q++) {
        size_t lo, hi;
        slice(len, c->n, q, &lo, &hi);
        memcpy((u8 *)r->recv + (first + lo) * r->es, shm_slot(c, q, r->round0 + k) + lo * r->es,
               (hi - lo) * r->es);
    }
}

static void allreduce_step(shm_comm *c, loom_comm_request *r, uint32_t i)
{
    if (ar_small(c, r)) {
        if (i == 0) {
            ar_in(c, r, 0);
        } else {
            const void *in[SHM_MAX_WORLD];
            for (int q = 0; q < c->n; q++)
                in[q] = shm_slot(c, q, r->round0);
            shm_reduce(r->dt, r->op, c->n, in, r->recv, r->count);
        }
        return;
    }
    uint32_t C = r->rounds;
    if (i >= 2)
        ar_out(c, r, i - 2);
    if (i >= 1 && i <= C)
        ar_reduce(c, r, i - 1);
    if (i < C)
        ar_in(c, r, i);
}

/* ---- one barrier per round ---------------------------------------------------------- */

static void round_in(shm_comm *c, loom_comm_request *r, uint32_t j, uint32_t g)
{
    const size_t es = r->es, S = r->per_round, first = (size_t)j * S;
    u8 *slot = shm_slot(c, c->rank, g);
    size_t len = r->kind == SHM_ALLTOALLV ? 0 : min_sz(S, r->count - first);
    switch (r->kind) {
    case SHM_ALLGATHER:
        memcpy(slot, (const u8 *)r->send + first * es, len * es);
        break;
    case SHM_BROADCAST:
        if (c->rank == r->peer)
            memcpy(slot, (const u8 *)r->recv + first * es, len * es);
        break;
    case SHM_REDUCE_SCATTER:
    case SHM_ALLTOALL:
        for (int p = 0; p < c->n; p++)
            memcpy(slot + (size_t)p * S * es, (const u8 *)r->send + ((size_t)p * r->count + first) * es,
                   len * es);
        break;
    case SHM_ALLTOALLV: {
        const size_t *sc = r->v, *sd = r->v + c->n;
        for (int p = 0; p < c->n; p++)
            if (first < sc[p])
                memcpy(slot + (size_t)p * S * es, (const u8 *)r->send + (sd[p] + first) * es,
                       min_sz(S, sc[p] - first) * es);
        break;
    }
    default:
        break;
    }
}

static void round_out(shm_comm *c, loom_comm_request *r, uint32_t j, uint32_t g)
{
    const size_t es = r->es, S = r->per_round, first = (size_t)j * S;
    size_t len = r->kind == SHM_ALLTOALLV ? 0 : min_sz(S, r->count - first);
    const size_t mine = (size_t)c->rank * S * es; /* my sub-slot in the blocked ops */
    switch (r->kind) {
    case SHM_ALLGATHER:
        for (int q = 0; q < c->n; q++)
            memcpy((u8 *)r->recv + ((size_t)q * r->count + first) * es, shm_slot(c, q, g), len * es);
        break;
    case SHM_BROADCAST:
        if (c->rank != r->peer)
            memcpy((u8 *)r->recv + first * es, shm_slot(c, r->peer, g), len * es);
        break;
    case SHM_REDUCE_SCATTER: {
        const void *in[SHM_MAX_WORLD];
        for (int q = 0; q < c->n; q++)
            in[q] = shm_slot(c, q, g) + mine;
        shm_reduce(r->dt, r->op, c->n, in, (u8 *)r->recv + first * es, len);
        break;
    }
    case SHM_ALLTOALL:
        for (int q = 0; q < c->n; q++)
            memcpy((u8 *)r->recv + ((size_t)q * r->count + first) * es, shm_slot(c, q, g) + mine,
                   len * es);
        break;
    case SHM_ALLTOALLV: {
        const size_t *rc = r->v + 2 * c->n, *rd = r->v + 3 * c->n;
        for (int q = 0; q < c->n; q++)
            if (first < rc[q])
                memcpy((u8 *)r->recv + (rd[q] + first) * es, shm_slot(c, q, g) + mine,
                       min_sz(S, rc[q] - first) * es);
        break;
    }
    default:
        break;
    }
}

/* ---- alltoallv: agree on the counts first ------------------------------------------- */

/* Step 0 publishes this rank's send and receive counts; step 1 checks every pair on every
 * rank (so all ranks reach the same verdict) and sizes the data rounds. */
static loom_status a2av_counts(shm_comm *c, loom_comm_request *r, uint32_t i)
{
    const int n = c->n;
    if (i == 0) {
        uint64_t *h = (uint64_t *)shm_slot(c, c->rank, r->round0);
        for (int p = 0; p < n; p++) {
            h[p] = r->v[p];              /* what I send to p */
            h[n + p] = r->v[2 * n + p];  /* what I expect from p */
        }
        return LOOM_OK;
    }
    uint64_t most = 0;
    for (int q = 0; q < n; q++) {
        const uint64_t *hq = (const uint64_t *)shm_slot(c, q, r->round0);
        for (int p = 0; p < n; p++) {
            const uint64_t *hp = (const uint64_t *)shm_slot(c, p, r->round0);
            if (hq[p] != hp[n + q]) {
                snprintf(r->msg, sizeof r->msg,
                         "shm alltoallv: rank %d sends %llu elements to rank %d, which expects "
                         "%llu from it; send_counts[p] on rank q must equal recv_counts[q] on "
                         "rank p", q, (unsigned long long)hq[p], p,
                         (unsigned long long)hp[n + q]);
                return LOOM_ERR_INVALID;
            }
            if (hq[p] > most)
                most = hq[p];
        }
    }
    uint32_t R = (uint32_t)ceil_div((size_t)most, r->per_round);
    r->rounds = 1 + R;
    r->nsteps = R + 2;
    return LOOM_OK;
}

loom_status shm_coll_step(shm_comm *c, loom_comm_request *r, uint32_t i)
{
    switch (r->kind) {
    case SHM_BARRIER:
        return LOOM_OK;
    case SHM_ALLREDUCE:
        allreduce_step(c, r, i);
        return LOOM_OK;
    case SHM_ALLTOALLV: {
        if (i <= 1) {
            loom_status st = a2av_counts(c, r, i);
            if (st != LOOM_OK || i == 0)
                return st;
        }
        uint32_t R = r->rounds - 1; /* data round j runs in at step j+1, out at step j+2 */
        if (i >= 2)
            round_out(c, r, i - 2, r->round0 + 1 + (i - 2));
        if (i - 1 < R)
            round_in(c, r, i - 1, r->round0 + 1 + (i - 1));
        return LOOM_OK;
    }
    default:
        if (i >= 1)
            round_out(c, r, i - 1, r->round0 + i - 1);
        if (i < r->rounds)
            round_in(c, r, i, r->round0 + i);
        return LOOM_OK;
    }
}
