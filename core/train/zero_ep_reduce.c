/* zero_ep_reduce.c — ZeRO stage 2 under expert parallelism, fast mode (zero.h, zero_ep.c).
 *
 * Each kind's packed range (the dense entries over dp, this rank's experts over their edp
 * group) is tiled by the buckets stage 1 steps and gathers; stage 2 reduce-scatters each
 * bucket over its kind's group into this rank's gradient partition (the same place its
 * optimizer state has: pos0 + the sub-block's offset), so every rank keeps
 * 4 (D/dp + X/edp) bytes of gradients. A bucket's pieces lie apart in the flat buffer (the
 * dense entries run around each block's experts), so it is packed into a send slot first.
 *
 * Order: backward reports final ranges top down (gpt.h; under ep a MoE block's report ends
 * at its router, and its experts sit above it, so they are final with it). A bucket is
 * final once the watermark (the lowest offset reported) is at or below its lowest flat
 * offset; the buckets are sorted by that offset, highest first, which is the order they
 * become final and the order every rank of a group starts them (the dense buckets' order
 * is the same on every dp rank, the experts' on every edp rank: the layouts match). At most
 * ZERO_SLOTS are in flight, polled at every report; a completed bucket's pieces are zeroed
 * for the next backward, their whole pages handed back to the OS (zero_clear_grads), so
 * the full-size buffer is resident only where backward has written and not yet reduced (a
 * device with vm ops: each piece's granules committed before backward writes it and
 * decommitted here, zero_sparse.c).
 * Micro-batch a = 0 receives into the partition; later ones into a slot that is added.
 * Under pp the buckets reading below hold_hi (the tied wte) wait for the wte exchange
 * (zero_ep_reduce_held), as without ep.
 */
#include "zero_ep_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

typedef struct low_ctx {
    size_t flat;
} low_ctx;

static void lowest_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    (void)r, (void)n, (void)packed;
    low_ctx *c = ctx;
    if (flat < c->flat)
        c->flat = flat;
}

static int by_final_order(const void *pa, const void *pb)
{
    const ep_bucket *a = pa, *b = pb;
    if (a->flat_lo != b->flat_lo)
        return a->flat_lo > b->flat_lo ? -1 : 1;
    if (a->kind != b->kind)
        return a->kind < b->kind ? -1 : 1;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

loom_status zero_ep_reduce_init(loom_zero *z)
{
    struct zero_ep *x = z->ep;
    size_t cap = 0;
    for (int k = 0; k < 2; k++)
        cap += x->part[k].cuts ? (size_t)x->part[k].n_cuts : x->part[k].Kp / x->part[k].want + 1;
    if (!(x->bk = calloc(cap, sizeof *x->bk)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO-2's buckets under ep");
    size_t most = 0;
    for (int k = 0; k < 2; k++) {
        const ep_part *p = &x->part[k];
        /* buckets wholly in the padding past K hold nothing: the partition stays zero there */
        for (size_t lo = 0, len; lo < p->K; lo += len) {
            len = zero_ep_bucket_len(p, lo); /* stage 3's follow the units (zero_ep.c) */
            low_ctx c = {z->total};
            zero_ep_each_piece(p, lo, lo + len, lowest_piece, &c);
            x->bk[x->n_bk++] = (ep_bucket){k, lo, len, c.flat};
            most = len > most ? len : most;
        }
    }
    qsort(x->bk, (size_t)x->n_bk, sizeof *x->bk, by_final_order);
    x->send_len = most;
    x->recv_len = z->accum > 1 ? most : 0; /* a sub-block is at most a whole bucket (n = 1) */
    x->send = zero_buf_alloc(z, (ZERO_SLOTS + 1) * most + 1); /* a device's memory there */
    x->recv = x->recv_len ? zero_buf_alloc(z, ZERO_SLOTS * most) : NULL;
    if (!x->send || (x->recv_len && !x->recv))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO-2's staging under ep");
    z->staging_floats += (ZERO_SLOTS + 1) * x->send_len + ZERO_SLOTS * x->recv_len;
    return LOOM_OK;
}

void zero_ep_reduce_free(loom_zero *z)
{
    free(z->ep->bk);
    zero_buf_free(z, z->ep->send);
    zero_buf_free(z, z->ep->recv);
}

typedef struct pack_ctx {
    float *grads, *buf;
    size_t lo;           /* the packed float at buf[0] */
    loom_zero *z;
    size_t run_lo, run_hi; /* release: the flat range gathered so far */
} pack_ctx;

static void pack_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    (void)r;
    pack_ctx *c = ctx;
    zero_buf_move(c->z, c->buf + (packed - c->lo), c->grads + flat, n);
}

/* Release the bucket's pieces, adjacent ones as one range (fewer partial pages). */
static void release_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    (void)r, (void)packed;
    pack_ctx *c = ctx;
    if (c->run_hi == flat) {
        c->run_hi += n;
        return;
    }
    if (c->run_hi > c->run_lo)
        zero_clear_grads(c->z, c->run_lo, c->run_hi);
    c->run_lo = flat;
    c->run_hi = flat + n;
}

static float *part_dst(loom_zero *z, const ep_bucket *b)
{
    const ep_part *p = &z->ep->part[b->kind];
    return z->part_grads + p->pos0 + b->lo / (size_t)p->n;
}

static void finish_bucket(loom_zero *z, int k, const float *slot)
{
    const ep_bucket *b = &z->ep->bk[k];
    const ep_part *p = &z->ep->part[b->kind];
    if (slot)
        z->be->ops->accumulate(part_dst(z, b), slot, b->len / (size_t)p->n);
    if (zero_device_bucket_done(z, k)) /* sparse (zero_sparse.c): zeroed and decommitted */
        return;
    pack_ctx c = {NULL, NULL, 0, z, 0, 0};
    zero_ep_each_piece(p, b->lo, b->lo + b->len, release_piece, &c);
    if (c.run_hi > c.run_lo)
        zero_clear_grads(z, c.run_lo, c.run_hi);
}

static loom_status complete_oldest(loom_zero *z)
{
    struct zero_ep *x = z->ep;
    ep_flight f = x->flight[0];
    memmove(x->flight, x->flight + 1, (size_t)(x->n_flight - 1) * sizeof *x->flight);
    x->n_flight--;
    const ep_bucket *b = &x->bk[f.bucket];
    const ep_part *p = &x->part[b->kind];
    LOOM_TRY(p->comm->wait(p->group, f.req));
    finish_bucket(z, f.bucket, f.slot);
    return LOOM_OK;
}

static loom_status start_bucket(loom_zero *z, int k)
{
    struct zero_ep *x = z->ep;
    if (x->n_flight == ZERO_SLOTS)
        LOOM_TRY(complete_oldest(z));
    const ep_bucket *b = &x->bk[k];
    const ep_part *p = &x->part[b->kind];
    LOOM_TRY(zero_device_bucket_hold(z, k)); /* sparse: a bucket backward did not write */
    /* in flight: the slots in turn (completed oldest first, so the next is free); a
     * group of one reduces at once, in the spare slot past them */
    int slot = p->n < 2 ? ZERO_SLOTS : x->next_slot;
    if (p->n >= 2)
        x->next_slot = (x->next_slot + 1) % ZERO_SLOTS;
    float *send = x->send + (size_t)slot * x->send_len;
    zero_buf_clear(z, send, b->len); /* the padding past K, and nothing stale */
    pack_ctx c = {loom_gpt_grad_data(z->model), send, b->lo, z, 0, 0};
    zero_ep_each_piece(p, b->lo, b->lo + b->len, pack_piece, &c);
    size_t sub = b->len / (size_t)p->n;
    if (p->n < 2) { /* an edp group of one (ep = dp): the whole bucket is this rank's */
        float *dst = part_dst(z, b);
        if (z->micro == 0)
            zero_buf_move(z, dst, send, sub);
        finish_bucket(z, k, z->micro == 0 ? NULL : send);
        return LOOM_OK;
    }
    float *recv = z->micro > 0 ? x->recv + (size_t)slot * x->recv_len : part_dst(z, b);
    ep_flight *f = &x->flight[x->n_flight];
    LOOM_TRY(p->comm->reduce_scatter_start(p->group, send, recv, sub, LOOM_DTYPE_F32,
                                           LOOM_REDUCE_SUM, &f->req));
    f->bucket = k;
    f->send = send;
    f->slot = z->micro > 0 ? recv : NULL;
    x->n_flight++;
    return LOOM_OK;
}

/* Start every bucket the watermark has passed (not the held ones). */
static loom_status advance(loom_zero *z)
{
    struct zero_ep *x = z->ep;
    while (x->next < x->n_bk && x->bk[x->next].flat_lo >= z->watermark &&
           x->bk[x->next].flat_lo >= z->hold_hi)
        LOOM_TRY(start_bucket(z, x->next++));
    return LOOM_OK;
}

loom_status zero_ep_begin_micro(loom_zero *z, int a)
{
    z->micro = a;
    z->ep->next = 0;
    z->watermark = z->total; /* nothing final yet */
    if (a == 0)
        zero_buf_clear(z, z->part_grads, z->part);
    return LOOM_OK;
}

loom_status zero_ep_grads_ready(loom_zero *z, size_t offset)
{
    struct zero_ep *x = z->ep;
    zero_measure_grads(z);
    if (x->n_flight > 0) {
        const ep_part *p = &x->part[x->bk[x->flight[0].bucket].kind];
        if (p->comm->test(p->group, x->flight[0].req))
            LOOM_TRY(complete_oldest(z));
    }
    if (offset < z->watermark)
        z->watermark = offset;
    return advance(z);
}

loom_status zero_ep_finish_micro(loom_zero *z)
{
    zero_measure_grads(z);
    z->watermark = 0; /* whatever backward did not report is final too */
    LOOM_TRY(advance(z));
    while (z->ep->n_flight > 0)
        LOOM_TRY(complete_oldest(z));
    return LOOM_OK;
}

/* The held buckets (reading below the tied wte's end), received straight into the
 * partition: none of them was received this step. */
loom_status zero_ep_reduce_held(loom_zero *z)
{
    struct zero_ep *x = z->ep;
    int micro = z->micro;
    z->micro = 0;
    loom_status st = LOOM_OK;
    for (int k = 0; k < x->n_bk && st == LOOM_OK; k++)
        if (x->bk[k].flat_lo < z->hold_hi)
            st = start_bucket(z, k);
    while (x->n_flight > 0) {
        loom_status w = complete_oldest(z);
        if (st == LOOM_OK)
            st = w;
    }
    z->micro = micro;
    return st;
}
