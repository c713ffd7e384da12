/* shm.h — private to loom-comm-shm: the shared segment's layout, the process-local
 * communicator and request, and the functions the plugin's files share.
 *
 * What: one segment per communicator (the world's from create, one per group from split),
 * laid out as
 *     header page | ctl[n] | bells[n] (world segment only) | box_ctl[n*n]
 *     | staging[n][SHM_SLOTS][chunk_bytes] | mailbox data[n*n][mailbox_bytes]
 * Every offset is computed by shm_layout_for(n, chunk, mailbox, bells), so the creator
 * and the openers agree without trusting pointers in shared memory.
 * What not: no process-global state: a world communicator and every group split from it
 * form a "family" (one world segment holds every rank's doorbell) owned by its members.
 *
 * Invariants (the synchronisation story, shared by every file):
 *  - Each rank sleeps on exactly one futex word, its doorbell bells[world_rank]. Anyone who
 *    changes something another rank may be waiting for (the last arrival at a barrier, a
 *    mailbox head or tail) first publishes the change, then rings the doorbell
 *    (seq_cst fetch_add + wake if that rank said it sleeps). A sleeper samples its bell
 *    BEFORE looking for work and futex-waits on that sample, so a ring between its look
 *    and its sleep makes FUTEX_WAIT return at once: no lost wake-up, no spinning.
 *  - A barrier is a per-communicator counter `arrived` that only grows: barrier k (k>=1)
 *    is complete when arrived >= n*k (32-bit, compared wrap-safe). No rank arrives at k+1
 *    before k completes, so the count is exact. Data written before a seq_cst fetch_add on
 *    `arrived` is visible to any rank whose acquire load sees the completed count
 *    (the RMWs form one release sequence). The same edge orders reads before rewrites: a
 *    rank's reads of a peer's slot precede its next arrival, and the peer rewrites the slot
 *    only after seeing that arrival counted.
 *  - Staging slots rotate over SHM_SLOTS=3 per rank by a per-communicator round number;
 *    a slot is rewritten only after a barrier that every reader of its previous content has
 *    passed (the argument is spelled out in shm_coll.c).
 *  - Collectives on one communicator run one at a time, in start order; point-to-point
 *    requests move independently through per-pair ring buffers, ordered per (peer, way).
 */
#ifndef LOOM_SHM_H
#define LOOM_SHM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin/comm.h"

enum {
    SHM_MAX_WORLD = 256,
    SHM_SLOTS = 3,     /* staging slots per rank: the pipeline depth of allreduce */
    SHM_LINE = 128,    /* two cache lines: no false sharing with the adjacent-line prefetcher */
    SHM_NAME_MAX = 80, /* "/loom-<job id>-<pid>-<random>" */
    SHM_MSG = 512,     /* an error message kept for wait() */
};

#define SHM_MAGIC 0x6c6f6f6d73686d31ull /* "loomshm1" */
#define SHM_VERSION 1u

/* ---- shared memory ------------------------------------------------------------------ */

/* What a rank says it is doing in a collective, for the cross-rank consistency check. */
typedef struct shm_desc {
    uint32_t opseq; /* collectives started on this communicator before this one */
    uint32_t kind;  /* shm_kind */
    uint64_t count;
    uint32_t dtype, redop;
    int32_t root;
    uint32_t pad;
} shm_desc;

typedef struct shm_ctl {           /* one per rank, written only by that rank */
    _Atomic uint32_t seq;          /* the last barrier this rank arrived at */
    _Atomic uint32_t mapped;       /* start-up: 1 once mapped and checked */
    int32_t pid;
    uint32_t pad;
    shm_desc desc[2];              /* by opseq parity; see shm_engine.c */
    char fill[SHM_LINE - 16 - 2 * sizeof(shm_desc)];
} shm_ctl;

typedef struct shm_bell {          /* one per world rank, in the world segment */
    _Atomic uint32_t ring;         /* the futex word: bumped by anyone with news */
    _Atomic uint32_t sleepers;     /* threads of this rank inside FUTEX_WAIT */
    char fill[SHM_LINE - 8];
} shm_bell;

typedef struct shm_box_ctl {       /* one ring buffer per ordered pair (src, dst) */
    _Atomic uint64_t head;         /* bytes written by src */
    char fill0[SHM_LINE - 8];
    _Atomic uint64_t tail;         /* bytes consumed by dst */
    char fill1[SHM_LINE - 8];
} shm_box_ctl;

typedef struct shm_header {
    uint64_t magic;                /* written last by the creator (release) */
    uint32_t version, n;
    uint64_t size, chunk, small, mailbox;
    uint32_t has_bells, pad;
    char fill0[SHM_LINE - 56];
    _Atomic uint32_t n_mapped;     /* start-up count, futex word */
    _Atomic uint32_t ready;        /* 0 starting, 1 ready, 2 the creator gave up; futex */
    char fill1[SHM_LINE - 8];
    _Atomic uint32_t arrived;      /* barrier arrivals, see above */
    char fill2[SHM_LINE - 4];
} shm_header;

_Static_assert(sizeof(shm_ctl) == SHM_LINE, "shm_ctl is one line pair");
_Static_assert(sizeof(shm_bell) == SHM_LINE, "shm_bell is one line pair");
_Static_assert(sizeof(shm_header) == 3 * SHM_LINE, "shm_header layout");

typedef struct shm_layout {
    size_t ctl, bells, box_ctl, stage, box, size;
} shm_layout;

/* ---- process-local ------------------------------------------------------------------ */

typedef enum shm_kind {
    SHM_ALLREDUCE = 1,
    SHM_REDUCE_SCATTER,
    SHM_ALLGATHER,
    SHM_BROADCAST,
    SHM_ALLTOALL,
    SHM_ALLTOALLV,
    SHM_BARRIER,
    SHM_SEND,
    SHM_RECV,
} shm_kind;

typedef struct shm_comm shm_comm;

/* A world communicator and the groups split from it (transitively). The world segment
 * stays mapped while any member lives, because it holds the doorbells. The mutex makes
 * the family safe to drive from several threads; nobody sleeps holding it. */
typedef struct shm_family {
    pthread_mutex_t lock;
    int refs;
    uint8_t *world_base;
    size_t world_size;
    shm_bell *bells;
    shm_comm *comms; /* live communicators, for family-wide progress */
    int world_rank;
} shm_family;

struct loom_comm_request {
    shm_comm *c;
    loom_comm_request *next;
    shm_kind kind;
    const void *send;
    void *recv;
    size_t count, es;
    loom_dtype dt;
    loom_reduce_op op;
    int peer; /* root (broadcast) or peer (send/recv) */
    size_t *v; /* alltoallv: send counts, send displs, recv counts, recv displs (4*n) */
    /* collective progress */
    int begun, in_barrier, internal;
    uint32_t opseq, round0, rounds, step, nsteps, bar;
    size_t per_round; /* elements per round (per block for the blocked ops) */
    /* point-to-point progress */
    uint64_t ticket;
    size_t moved, total; /* payload bytes moved, and the peer's size (recv) */
    int hdr_done;
    /* outcome */
    int done;
    loom_status st;
    char msg[SHM_MSG];
};

struct shm_comm {
    const loom_host *host;
    shm_family *fam;
    shm_comm *fam_next;
    uint8_t *base;
    size_t size;
    int owns_mapping; /* splits: 1; the world's mapping belongs to the family */
    shm_header *hdr;
    shm_layout lay;
    int rank, n, timeout_ms;
    size_t chunk, small, mailbox;
    int *world_of; /* comm rank -> world rank (doorbells) */
    uint32_t bar, round, opseq;
    loom_comm_request *head, *tail; /* every request not yet waited for, in start order */
    uint64_t *send_next, *send_done, *recv_next, *recv_done; /* tickets per peer */
    int broken;
    loom_status broken_st;
    char broken_msg[SHM_MSG];
    char name[SHM_NAME_MAX];
};

/* ---- shm_seg.c: segments, futexes, doorbells --------------------------------------- */
shm_layout shm_layout_for(int n, size_t chunk, size_t mailbox, int bells);
/* Create + size + map a fresh segment named into name; LOOM_OK or a host->fail status. */
loom_status shm_seg_create(const loom_host *host, const char *what, int n, size_t chunk,
                           size_t small, size_t mailbox, int bells, char name[SHM_NAME_MAX],
                           uint8_t **base, size_t *size);
/* Open + map + check an existing one. */
loom_status shm_seg_open(const loom_host *host, const char *what, const char *name, int n,
                         size_t chunk, size_t small, size_t mailbox, int bells,
                         uint8_t **base, size_t *size);
double shm_now(void); /* seconds, CLOCK_MONOTONIC */
/* FUTEX_WAIT on a shared word while it holds val, at most timeout_s. Returns on a wake, a
 * change, a signal or the timeout: callers re-check their condition and loop. */
void shm_futex_wait(_Atomic uint32_t *word, uint32_t val, double timeout_s);
void shm_futex_wake(_Atomic uint32_t *word);
void shm_ring(shm_comm *c, int comm_rank);

/* ---- shm_engine.c: requests, progress, barriers ------------------------------------ */
static inline shm_ctl *shm_ctl_of(shm_comm *c, int r)
{
    return (shm_ctl *)(c->base + c->lay.ctl) + r;
}
static inline uint8_t *shm_slot(shm_comm *c, int r, uint32_t round)
{
    return c->base + c->lay.stage + ((size_t)r * SHM_SLOTS + round % SHM_SLOTS) * c->chunk;
}
const char *shm_kind_name(shm_kind k);
loom_status shm_enqueue(shm_comm *c, loom_comm_request *r, loom_comm_request **out);
loom_status shm_wait(void *self, loom_comm_request *req);
int shm_test(void *self, loom_comm_request *req);
void shm_arrive(shm_comm *c);
/* Free every request of c (destroy). */
void shm_drop_requests(shm_comm *c);

/* ---- shm_coll.c: collective algorithms as steps between barriers -------------------- */
/* Set nsteps/rounds for a request reaching the head of its communicator's queue. */
void shm_coll_begin(shm_comm *c, loom_comm_request *r);
/* The local work of step i (after barrier i-1, before barrier i). */
loom_status shm_coll_step(shm_comm *c, loom_comm_request *r, uint32_t i);

/* ---- shm_p2p.c: mailboxes ----------------------------------------------------------- */
/* Move what can move without blocking; 1 if anything moved. Sets r->done / r->st. */
int shm_p2p_advance(shm_comm *c, loom_comm_request *r);

/* ---- shm_group.c: making communicators (create's handshake, split) ----------------- */
loom_status shm_world_create(const loom_host *host, const loom_store *store, int rank,
                             int world, int timeout_ms, size_t chunk, size_t small,
                             size_t mailbox, shm_comm **out);
loom_status shm_split(void *self, int color, int key, void **out);
void shm_destroy(void *self);

/* ---- shm.c: the ops (split needs an allgather) --------------------------------------- */
loom_status shm_allgather_start(void *self, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_comm_request **req);

/* ---- shm_reduce.c ------------------------------------------------------------------- */
int shm_reduce_supported(loom_dtype dt, loom_reduce_op op);
/* out[i] = in[0][i] (op) in[1][i] (op) ... in[n-1][i], always in that order; out may
 * alias any in[r]. AVG divides the sum by n once. See shm_reduce.c for dtype rules. */
void shm_reduce(loom_dtype dt, loom_reduce_op op, int n, const void *const *in, void *out,
                size_t count);

#endif
