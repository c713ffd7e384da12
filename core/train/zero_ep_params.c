/* zero_ep_params.c — ZeRO stage 3 under expert parallelism: the parameters partitioned as
 * the optimizer state is (zero_ep.c): the dense entries over dp, this rank's experts over
 * their edp group, each packed, in buckets that follow the model's units (zero_ep.c
 * make_cuts). The optimizer steps the partition; the model's full-size buffer is address
 * space, as without ep (zero_params.c): before a unit is used, each of its buckets of each
 * kind is all-gathered over the kind's group into a staging buffer (packed order differs
 * from the buffer's, so not in place) and the unit's pieces are unpacked into the buffer;
 * when the pass is done with the unit its whole pages go back to the OS. An edp group of
 * one (ep = dp) holds its experts whole: they are unpacked straight from the partition.
 * Unlike zero_params.c the gathers are not started ahead (no prefetch): each is waited for
 * when the unit is needed. The values are the partition's, whoever gathers them, so the
 * forward and backward read exactly what stage 1's gathered buffer would hold.
 */
#include "zero_ep_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/status.h"
#include "model/gpt.h"
#include "zero_ckpt.h"

enum { STALE = 0, RESIDENT = 3 }; /* zero_params.c's states; the others are not used here */

typedef struct unpack_ctx {
    float *params;
    const float *src;    /* packed float lo at src[0] */
    size_t lo;
} unpack_ctx;

static void unpack_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    (void)r;
    unpack_ctx *c = ctx;
    memcpy(c->params + flat, c->src + (packed - c->lo), n * sizeof(float));
}

/* Unit u's pieces of kind k into the model's buffer, bucket by bucket. */
static loom_status gather_kind(loom_zero *z, int u, int k)
{
    struct zero_ep *x = z->ep;
    const ep_part *p = &x->part[k];
    size_t ulo = x->ulo[2 * u + k], uhi = x->uhi[2 * u + k];
    for (size_t lo = 0, len; lo < p->Kp && lo < uhi; lo += len) {
        len = zero_ep_bucket_len(p, lo);
        if (lo + len <= ulo)
            continue;
        size_t sub = len / (size_t)p->n;
        const float *mine = z->part_params + p->pos0 + lo / (size_t)p->n, *src = mine;
        if (p->n > 1) {
            loom_comm_request *r;
            LOOM_TRY(p->comm->allgather_start(p->group, mine, x->staging, sub, LOOM_DTYPE_F32, &r));
            LOOM_TRY(p->comm->wait(p->group, r));
            src = x->staging;
        }
        unpack_ctx c = {loom_gpt_param_data(z->model), src, lo};
        zero_ep_each_piece(p, lo > ulo ? lo : ulo, lo + len < uhi ? lo + len : uhi, unpack_piece, &c);
    }
    return LOOM_OK;
}

static loom_status gather_unit(loom_zero *z, int u)
{
    for (int k = 0; k < 2; k++)
        LOOM_TRY(gather_kind(z, u, k));
    z->units[u].state = RESIDENT;
    zero_measure_params(z);
    return LOOM_OK;
}

static void release_unit(loom_zero *z, int u)
{
    zero_drop_pages(z, z->units[u].inner_lo, z->units[u].inner_hi);
    z->units[u].state = STALE;
}

static loom_status param_use(void *ctx, int u, int needed)
{
    loom_zero *z = ctx;
    if (u < 0 || u >= z->n_units)
        return loom_fail(LOOM_ERR_INTERNAL, "ZeRO-3 under ep: unit %d outside 0..%d", u,
                         z->n_units - 1);
    zero_unit *un = &z->units[u];
    if (un->empty || needed == LOOM_PARAM_SOON) /* SOON: a pipeline stage's hint (no pp here) */
        return LOOM_OK;
    double t0 = loom_now_ms();
    loom_status st = LOOM_OK;
    if (needed && un->state != RESIDENT)
        st = gather_unit(z, u);
    else if (!needed && !z->pinned && un->state == RESIDENT)
        release_unit(z, u);
    z->comm_ms += loom_now_ms() - t0;
    return st;
}

loom_status zero_ep_params_init(loom_zero *z)
{
    struct zero_ep *x = z->ep;
    const loom_param_table *t = loom_gpt_params(z->model);
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    z->n_units = loom_gpt_get_config(z->model)->layers + 2;
    z->units = calloc((size_t)z->n_units, sizeof *z->units);
    x->ulo = calloc(2 * (size_t)z->n_units, sizeof *x->ulo);
    x->uhi = calloc(2 * (size_t)z->n_units, sizeof *x->uhi);
    z->n_param_pages = (z->total * sizeof(float) + 2 * page) / page;
    z->param_pages = malloc(z->n_param_pages);
    if (!z->units || !x->ulo || !x->uhi || !z->param_pages)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO-3's units under ep");
    float *params = loom_gpt_param_data(z->model);
    /* this rank's partition from the initial values (every rank of a group drew its
     * kind's entries alike) */
    loom_zero_piece *pc;
    size_t n_pc;
    LOOM_TRY(zero_ep_pieces(z, &pc, &n_pc));
    for (size_t i = 0; i < n_pc; i++)
        memcpy(z->part_params + pc[i].pos, params + pc[i].lo, pc[i].n * sizeof(float));
    free(pc);
    for (int u = 0; u < z->n_units; u++) {
        int first, last;
        loom_gpt_unit_entries(z->model, u, &first, &last);
        zero_unit *un = &z->units[u];
        if (first > last) {
            un->empty = 1;
            continue;
        }
        for (int k = 0; k < 2; k++) { /* the unit's packed range of each kind */
            const ep_part *p = &x->part[k];
            size_t lo = SIZE_MAX, hi = 0;
            for (int i = 0; i < p->n_runs; i++)
                if (p->runs[i].entry >= first && p->runs[i].entry <= last) {
                    lo = p->runs[i].packed < lo ? p->runs[i].packed : lo;
                    hi = p->runs[i].packed + p->runs[i].n > hi ? p->runs[i].packed + p->runs[i].n : hi;
                }
            x->ulo[2 * u + k] = lo < hi ? lo : 0;
            x->uhi[2 * u + k] = lo < hi ? hi : 0;
        }
        zero_unit_pages(z, un, t->entries[first].offset,
                        t->entries[last].offset + t->entries[last].numel);
        zero_drop_pages(z, un->inner_lo, un->inner_hi); /* until first needed */
    }
    z->last_unit = -1;
    loom_gpt_set_param_hook(z->model, param_use, z);
    return LOOM_OK;
}

loom_status zero_ep_pin_params(loom_zero *z, int pin)
{
    z->pinned = pin;
    loom_status st = LOOM_OK;
    for (int u = 0; u < z->n_units && st == LOOM_OK; u++) {
        if (z->units[u].empty)
            continue;
        if (pin && z->units[u].state != RESIDENT)
            st = gather_unit(z, u);
        else if (!pin && z->units[u].state == RESIDENT)
            release_unit(z, u);
    }
    return st;
}
