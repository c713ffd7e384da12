/* zero_ep_gather.c — ZeRO-3 under expert parallelism: a unit's gathers as requests that
 * can be in flight while another unit computes (zero_ep_params.c decides which unit and
 * when: the prefetch, as zero_params.c's).
 *
 * A unit's buckets of both kinds (dense over dp, experts over edp; zero_ep.c's cuts make
 * them the unit's own) are all-gathered into one of two staging slots, bucket after
 * bucket, each kind on its own group; finishing waits for them in start order and
 * unpacks the unit's pieces into the model's buffer (packed order is not the buffer's).
 * A group of one (edp = 1) gathers nothing: its bucket is unpacked from the partition.
 * The values unpacked are the partition's whoever gathers them and whenever, so a unit
 * gathered ahead holds the bits a unit gathered when needed holds. Two slots: the unit in
 * use and the one ahead; each is sized for the largest unit.
 */
#include "zero_ep_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/gpt.h"

typedef struct unpack_ctx {
    loom_zero *z;
    float *params;
    const float *src;    /* packed float lo at src[0] */
    size_t lo;
} unpack_ctx;

static void unpack_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    (void)r;
    unpack_ctx *c = ctx;
    zero_buf_move(c->z, c->params + flat, c->src + (packed - c->lo), n);
}

/* fn(ctx, kind, bucket lo, len) for each bucket of kind k that unit u's range touches. */
typedef loom_status bucket_fn(loom_zero *z, ep_slot *s, int k, size_t lo, size_t len);

static loom_status each_bucket(loom_zero *z, int u, ep_slot *s, bucket_fn *fn)
{
    struct zero_ep *x = z->ep;
    for (int k = 0; k < 2; k++) {
        const ep_part *p = &x->part[k];
        size_t ulo = x->ulo[2 * u + k], uhi = x->uhi[2 * u + k];
        for (size_t lo = 0, len; lo < p->Kp && lo < uhi; lo += len) {
            len = zero_ep_bucket_len(p, lo);
            if (lo + len > ulo)
                LOOM_TRY(fn(z, s, k, lo, len));
        }
    }
    return LOOM_OK;
}

static loom_status count_bucket(loom_zero *z, ep_slot *s, int k, size_t lo, size_t len)
{
    (void)lo;
    s->n_req++;
    if (z->ep->part[k].n > 1)
        s->floats += len;
    return LOOM_OK;
}

static loom_status start_bucket(loom_zero *z, ep_slot *s, int k, size_t lo, size_t len)
{
    const ep_part *p = &z->ep->part[k];
    ep_slot_bucket *b = &s->bk[s->n_req++];
    b->kind = k;
    b->lo = lo;
    b->len = len;
    b->req = NULL;
    b->src = z->part_params + p->pos0 + lo / (size_t)p->n; /* a group of one: its own */
    if (p->n > 1) {
        float *at = s->staging + s->used;
        s->used += len;
        LOOM_TRY(p->comm->allgather_start(p->group, b->src, at, len / (size_t)p->n,
                                          LOOM_DTYPE_F32, &b->req));
        b->src = at;
    }
    return LOOM_OK;
}

loom_status zero_ep_slots_init(loom_zero *z)
{
    struct zero_ep *x = z->ep;
    size_t floats = 0;
    int reqs = 0;
    for (int u = 0; u < z->n_units; u++) {
        ep_slot probe = {0};
        if (!z->units[u].empty)
            LOOM_TRY(each_bucket(z, u, &probe, count_bucket));
        floats = probe.floats > floats ? probe.floats : floats;
        reqs = probe.n_req > reqs ? probe.n_req : reqs;
    }
    for (int i = 0; i < 2; i++) {
        ep_slot *s = &x->slot[i];
        s->unit = -1;
        s->staging = floats ? zero_buf_alloc(z, floats) : NULL; /* a device's memory there */
        s->bk = calloc((size_t)reqs + 1, sizeof *s->bk);
        if ((floats && !s->staging) || !s->bk)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO-3's gather staging under ep "
                      "(%zu floats)", 2 * floats);
    }
    x->slot_floats = floats;
    return LOOM_OK;
}

void zero_ep_slots_free(loom_zero *z)
{
    struct zero_ep *x = z->ep;
    for (int i = 0; i < 2; i++) {
        zero_buf_free(z, x->slot[i].staging);
        free(x->slot[i].bk);
        x->slot[i].staging = NULL;
        x->slot[i].bk = NULL;
    }
}

ep_slot *zero_ep_slot_of(loom_zero *z, int u)
{
    for (int i = 0; i < 2; i++)
        if (z->ep->slot[i].unit == u)
            return &z->ep->slot[i];
    return NULL;
}

loom_status zero_ep_start_unit(loom_zero *z, int u)
{
    ep_slot *s = zero_ep_slot_of(z, -1);
    if (!s)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3 under ep: unit %d to gather with both slots in "
                  "flight (units %d and %d)", u, z->ep->slot[0].unit, z->ep->slot[1].unit);
    /* a sparse device buffer (zero_sparse.c): the unit's span committed before anything of
     * it is gathered */
    LOOM_TRY(zero_device_unit_hold(z, u));
    s->unit = u;
    s->n_req = 0;
    s->used = 0;
    return each_bucket(z, u, s, start_bucket);
}

loom_status zero_ep_finish_unit(loom_zero *z, int u)
{
    ep_slot *s = zero_ep_slot_of(z, u);
    if (!s)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3 under ep: unit %d finished without being started", u);
    loom_status st = LOOM_OK;
    for (int i = 0; i < s->n_req; i++) { /* each kind's in its start order */
        ep_slot_bucket *b = &s->bk[i];
        const ep_part *p = &z->ep->part[b->kind];
        if (b->req) {
            loom_status w = p->comm->wait(p->group, b->req);
            b->req = NULL;
            if (st == LOOM_OK)
                st = w;
        }
        if (st != LOOM_OK)
            continue; /* the rest are still waited for: the groups stay in step */
        size_t ulo = z->ep->ulo[2 * u + b->kind], uhi = z->ep->uhi[2 * u + b->kind];
        unpack_ctx c = {z, loom_gpt_param_data(z->model), b->src, b->lo};
        zero_ep_each_piece(p, b->lo > ulo ? b->lo : ulo, b->lo + b->len < uhi ? b->lo + b->len : uhi,
                           unpack_piece, &c);
    }
    s->unit = -1;
    s->n_req = 0;
    return st;
}
