/* shm_p2p.c — send/recv through per-pair mailboxes.
 *
 * What: every ordered pair (src, dst) of a communicator owns a ring buffer of
 * mailbox_bytes in the segment, with two byte counters that only grow: head (written by
 * src) and tail (written by dst). A message is a 16-byte header {bytes, dtype, magic}
 * followed by its payload, streamed through the ring in as many pieces as it takes, so any
 * size passes through a fixed mailbox. Messages between one pair are received in the order
 * they were sent (tickets per peer and direction: a second send to the same peer waits for
 * the first to be fully written, a second recv for the first to be fully read).
 * A send completes when its last byte is in the mailbox (the buffer is reusable; the peer
 * may not have read it yet); a recv when its last byte is copied out.
 * What not: no tags, no wildcards (any-source), no rendezvous protocol; a message larger
 * than the mailbox simply needs the receiver to make progress (it does, in its own
 * wait/test). Exchanges (both sides send, then recv) work because the engine advances
 * every pending request of the communicator, not just the one waited for.
 * Invariants and ordering: src writes payload bytes, then stores head with release; dst
 * loads head with acquire before reading them, and stores tail with release after copying
 * them out; src loads tail with acquire before overwriting. Each side rings the other's
 * doorbell after publishing. A size or dtype mismatch fails only that recv (the message is
 * still consumed in full, so the stream stays in step).
 */
#include <stdio.h>
#include <string.h>

#include "shm.h"

#define MSG_MAGIC 0x4c4d5347u /* "LMSG" */

typedef struct msg_hdr {
    uint64_t bytes;
    uint32_t dtype, magic;
} msg_hdr;

static shm_box_ctl *box_ctl(shm_comm *c, int src, int dst)
{
    return (shm_box_ctl *)(c->base + c->lay.box_ctl) + ((size_t)src * (size_t)c->n + (size_t)dst);
}

static uint8_t *box_data(shm_comm *c, int src, int dst)
{
    return c->base + c->lay.box + ((size_t)src * (size_t)c->n + (size_t)dst) * c->mailbox;
}

static void ring_put(uint8_t *ring, size_t cap, uint64_t pos, const void *src, size_t len)
{
    size_t off = (size_t)(pos % cap), first = len < cap - off ? len : cap - off;
    memcpy(ring + off, src, first);
    memcpy(ring, (const uint8_t *)src + first, len - first);
}

/* Copy len bytes out of the ring; dst NULL discards them. */
static void ring_get(const uint8_t *ring, size_t cap, uint64_t pos, void *dst, size_t len)
{
    if (dst == NULL)
        return;
    size_t off = (size_t)(pos % cap), first = len < cap - off ? len : cap - off;
    memcpy(dst, ring + off, first);
    memcpy((uint8_t *)dst + first, ring, len - first);
}

static int send_advance(shm_comm *c, loom_comm_request *r)
{
    shm_box_ctl *b = box_ctl(c, c->rank, r->peer);
    uint8_t *data = box_data(c, c->rank, r->peer);
    uint64_t head = atomic_load_explicit(&b->head, memory_order_relaxed); /* ours */
    uint64_t tail = atomic_load_explicit(&b->tail, memory_order_acquire);
    size_t space = c->mailbox - (size_t)(head - tail), total = r->count * r->es;
    int moved = 0;
    if (!r->hdr_done) {
        if (space < sizeof(msg_hdr))
            return 0;
        msg_hdr h = {.bytes = total, .dtype = (uint32_t)r->dt, .magic = MSG_MAGIC};
        ring_put(data, c->mailbox, head, &h, sizeof h);
        head += sizeof h;
        space -= sizeof h;
        r->hdr_done = 1;
        moved = 1;
    }
    size_t len = total - r->moved < space ? total - r->moved : space;
    if (len > 0) {
        ring_put(data, c->mailbox, head, (const uint8_t *)r->send + r->moved, len);
        head += len;
        r->moved += len;
        moved = 1;
    }
    if (moved) {
        atomic_store_explicit(&b->head, head, memory_order_release);
        shm_ring(c, r->peer);
    }
    if (r->moved == total) {
        r->done = 1;
        r->st = LOOM_OK;
        c->send_done[r->peer]++;
    }
    return moved;
}

static const char *dt_name(uint32_t dt)
{
    static const char *const names[] = {"f32", "bf16", "f16", "i32", "u8", "u16"};
    return dt < sizeof names / sizeof names[0] ? names[dt] : "?";
}

static int recv_advance(shm_comm *c, loom_comm_request *r)
{
    shm_box_ctl *b = box_ctl(c, r->peer, c->rank);
    const uint8_t *data = box_data(c, r->peer, c->rank);
    uint64_t head = atomic_load_explicit(&b->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&b->tail, memory_order_relaxed); /* ours */
    size_t avail = (size_t)(head - tail), want = r->count * r->es;
    int moved = 0;
    if (!r->hdr_done) {
        if (avail < sizeof(msg_hdr))
            return 0;
        msg_hdr h;
        ring_get(data, c->mailbox, tail, &h, sizeof h);
        tail += sizeof h;
        avail -= sizeof h;
        r->hdr_done = 1;
        r->total = (size_t)h.bytes;
        moved = 1;
        if (h.magic != MSG_MAGIC) {
            r->st = LOOM_ERR_INTERNAL;
            snprintf(r->msg, sizeof r->msg, "shm recv from rank %d: corrupt message header "
                     "(the mailbox is out of step: a bug in loom-comm-shm)", r->peer);
            r->total = 0;
        } else if (h.bytes != want || h.dtype != (uint32_t)r->dt) {
            r->st = LOOM_ERR_INVALID;
            snprintf(r->msg, sizeof r->msg,
                     "shm recv from rank %d: rank %d sent %llu bytes of %s, this recv expects "
                     "%zu bytes (%zu x %s); a send and its recv must use the same count and dtype",
                     r->peer, r->peer, (unsigned long long)h.bytes, dt_name(h.dtype), want,
                     r->count, dt_name((uint32_t)r->dt));
        }
    }
    size_t len = r->total - r->moved < avail ? r->total - r->moved : avail;
    if (len > 0) {
        /* Copy what fits the caller's buffer; the rest of an oversized message is dropped. */
        size_t keep = r->moved < want ? (want - r->moved < len ? want - r->moved : len) : 0;
        ring_get(data, c->mailbox, tail, keep ? (uint8_t *)r->recv + r->moved : NULL, keep);
        tail += len;
        r->moved += len;
        moved = 1;
    }
    if (moved) {
        atomic_store_explicit(&b->tail, tail, memory_order_release);
        shm_ring(c, r->peer);
    }
    if (r->moved == r->total) {
        r->done = 1;
        c->recv_done[r->peer]++;
    }
    return moved;
}

int shm_p2p_advance(shm_comm *c, loom_comm_request *r)
{
    if (r->kind == SHM_SEND)
        return c->send_done[r->peer] == r->ticket ? send_advance(c, r) : 0;
    return c->recv_done[r->peer] == r->ticket ? recv_advance(c, r) : 0;
}
