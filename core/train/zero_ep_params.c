/* zero_ep_params.c — ZeRO stage 3 under expert parallelism: the parameters partitioned as
 * the optimizer state is (zero_ep.c): the dense entries over dp, this rank's experts over
 * their edp group, each packed, in buckets that follow the model's units (zero_ep.c
 * make_cuts). The optimizer steps the partition; the model's full-size buffer is address
 * space, as without ep (zero_params.c): before a unit is used, each of its buckets of each
 * kind is all-gathered over the kind's group into a staging buffer (packed order differs
 * from the buffer's, so not in place) and the unit's pieces are unpacked into the buffer;
 * when the pass is done with the unit its whole pages go back to the OS (a device with vm
 * ops: the unit's span committed before its gathers and decommitted here, zero_sparse.c).
 * An edp group of one (ep = dp) holds its experts whole: they are unpacked straight from
 * the partition.
 * With moe.zero_prefetch the pass's next unit is gathered ahead, as in zero_params.c
 * (without: each unit when needed); zero_ep_gather.c holds the gathers in flight. The
 * values are the partition's, whoever gathers them and whenever, so the forward and
 * backward read exactly what stage 1's gathered buffer would hold.
 */
#include "zero_ep_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/status.h"
#include "model/gpt.h"
#include "model/gpt_stage.h"
#include "zero_ckpt.h"

enum { STALE = 0, RESIDENT = 3 }; /* zero_params.c's states; the others are not used here */

/* Unit u into the model's buffer: its gathers (started ahead, or now) finished. */
static loom_status gather_unit(loom_zero *z, int u)
{
    if (!zero_ep_slot_of(z, u))
        LOOM_TRY(zero_ep_start_unit(z, u));
    LOOM_TRY(zero_ep_finish_unit(z, u));
    z->units[u].state = RESIDENT;
    zero_measure_params(z);
    return LOOM_OK;
}

/* Unit u is needed now: its gathers started (if not yet), then the pass's next unit's
 * (zero_params.c's rule: up in forward, down in backward; going down the embeddings are
 * next needed after the optimizer step, so not ahead), then u's waited for. The next
 * unit's run over their groups while u computes, as far as the communicators move them
 * (shm: inside test and wait, which the next unit's gathers and the tp / ep exchanges
 * call). */
static loom_status need(loom_zero *z, int u)
{
    int resident = z->units[u].state == RESIDENT;
    if (!resident && !zero_ep_slot_of(z, u))
        LOOM_TRY(zero_ep_start_unit(z, u));
    int next = u > z->last_unit ? u + 1 : u - 1;
    z->last_unit = u;
    if (z->ep->prefetch && next >= 1 && next < z->n_units && !z->units[next].empty &&
        z->units[next].state != RESIDENT && !zero_ep_slot_of(z, next)) {
        for (int i = 0; i < 2; i++) { /* a unit gathered ahead that the pass turned from */
            int v = z->ep->slot[i].unit;
            if (v >= 0 && v != u)
                LOOM_TRY(gather_unit(z, v));
        }
        LOOM_TRY(zero_ep_start_unit(z, next));
    }
    return resident ? LOOM_OK : gather_unit(z, u);
}

static void release_unit(loom_zero *z, int u)
{
    if (!zero_device_unit_drop(z, u)) /* sparse (zero_sparse.c): decommitted there */
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
    if (needed)
        st = need(z, u);
    else if (!z->pinned && un->state == RESIDENT)
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
    /* this rank's partition from the initial values (every rank of a group drew its
     * kind's entries alike); a device's through the host once, at start (zero_device.c's
     * zero_device_params) */
    float *params = loom_gpt_param_data(z->model), *whole = NULL, *part = z->part_params;
    if (z->device) {
        if (!(whole = malloc(z->total * sizeof(float) + 1)))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO-3's initial parameters under ep");
        z->be->ops->copy_to_host(z->be->self, whole, params, z->total * sizeof(float));
        params = whole;
        part = z->host_part;
    }
    loom_zero_piece *pc;
    size_t n_pc;
    loom_status st = zero_ep_pieces(z, &pc, &n_pc);
    for (size_t i = 0; st == LOOM_OK && i < n_pc; i++)
        memcpy(part + pc[i].pos, params + pc[i].lo, pc[i].n * sizeof(float));
    if (st == LOOM_OK && z->device)
        z->be->ops->copy_to_device(z->be->self, z->part_params, part, z->part * sizeof(float));
    free(whole);
    if (st != LOOM_OK)
        return st;
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
    if (z->device) /* device memory stays allocated (zero_params.c's zero_drop_pages) */
        z->params_peak = z->total * sizeof(float); /* the whole buffer */
    z->last_unit = -1;
    LOOM_TRY(zero_ep_slots_init(z));
    z->staging_floats += 2 * x->slot_floats;
    x->prefetch = loom_gpt_get_config(z->model)->moe.zero_prefetch && !loom_gpt_is_stage(z->model);
    loom_gpt_set_param_hook(z->model, param_use, z);
    return LOOM_OK;
}

loom_status zero_ep_params_drain(loom_zero *z)
{
    loom_status st = LOOM_OK;
    for (int i = 0; z->ep && i < 2; i++)
        if (z->ep->slot[i].unit >= 0) {
            int u = z->ep->slot[i].unit;
            loom_status w = zero_ep_finish_unit(z, u);
            z->units[u].state = RESIDENT; /* until the caller marks every unit stale */
            if (st == LOOM_OK)
                st = w;
        }
    z->last_unit = -1; /* the next pass (after the step: a forward) goes up */
    return st;
}

loom_status zero_ep_pin_params(loom_zero *z, int pin)
{
    z->pinned = pin;
    loom_status st = zero_ep_params_drain(z);
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
