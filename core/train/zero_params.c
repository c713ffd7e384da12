/* zero_params.c — ZeRO stage 3: parameters partitioned (see zero.h).
 *
 * Each rank keeps its partition of the parameters (P/N floats, what the optimizer
 * updates). The model's full-size parameter buffer is address space: before a unit
 * (gpt.h: embeddings, each block, ln_f) is used its buckets are all-gathered into place
 * from every rank's partition, and when the pass is done with it its pages are handed
 * back to the OS (madvise MADV_DONTNEED). The next unit in the direction of the pass
 * (up in forward, down in backward) is started ahead (prefetch), so its gather runs while
 * this unit computes — as far as the communicator advances it (shm: inside test/wait).
 * A unit's values are those of the last optimizer step once gathered; after each step
 * every unit is stale and is gathered again before its next use. Pages that a unit shares
 * with a neighbour are never released (they may be in use by it); they hold stale values
 * until the next gather overwrites them, which is harmless because a unit is always
 * gathered whole before it is read.
 */
#define _DEFAULT_SOURCE /* madvise, mincore */
#include "zero_ep_internal.h" /* the pin under expert parallelism */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/status.h"
#include "base/clock.h"
#include "model/gpt_stage.h"

/* READING: params offloaded, the unit's partition being read out of the offload (its
 * all-gather not started); a unit not yet started is STALE or READING */
enum { STALE = 0, READING, GATHERING, RESIDENT };

static size_t page_size(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

/* Return the whole pages inside [lo, hi) of the parameter buffer to the OS. */
void zero_drop_pages(loom_zero *z, size_t lo, size_t hi)
{
    if (z->device) { /* device memory stays allocated: cleared, so a stale read is loud */
        if (hi > lo)
            zero_buf_clear(z, loom_gpt_param_data(z->model) + lo, hi - lo);
        return;
    }
    size_t page = page_size();
    uintptr_t a = (uintptr_t)(loom_gpt_param_data(z->model) + lo);
    uintptr_t b = (uintptr_t)(loom_gpt_param_data(z->model) + hi);
    uintptr_t pa = (a + page - 1) / page * page, pb = b / page * page;
    if (pb > pa)
        (void)madvise((void *)pa, pb - pa, MADV_DONTNEED); /* a failure only keeps them */
}

/* Resident bytes of the parameter buffer now, kept as a peak. */
void zero_measure_params(loom_zero *z)
{
    if (z->device) /* resident all along (zero_params_init) */
        return;
    size_t page = page_size();
    uintptr_t a = (uintptr_t)loom_gpt_param_data(z->model);
    uintptr_t lo = a / page * page, hi = a + z->total * sizeof(float);
    size_t n = (hi - lo + page - 1) / page;
    if (n > z->n_param_pages || mincore((void *)lo, hi - lo, z->param_pages) != 0)
        return;
    size_t resident = 0;
    for (size_t i = 0; i < n; i++)
        resident += z->param_pages[i] & 1;
    resident *= page;
    if (resident > z->total * sizeof(float))
        resident = z->total * sizeof(float);
    if (resident > z->params_peak)
        z->params_peak = resident;
}

/* Start the all-gathers of unit u's buckets: every rank's partition into the buffer. */
static loom_status start_unit(loom_zero *z, int u)
{
    zero_unit *un = &z->units[u];
    float *params = loom_gpt_param_data(z->model);
    /* params offloaded: the partition out of the offload (read ahead, or now) */
    LOOM_TRY(un->state == READING ? zero_bring_wait(z, u) : zero_bring_unit(z, u));
    LOOM_TRY(zero_device_unit_hold(z, u)); /* a sparse device buffer: its range committed */
    un->n_req = 0;
    size_t at = 0; /* in the staging: the buckets' sub-blocks one after another */
    for (int k = un->first_bucket; k <= un->last_bucket; k++) {
        const zero_bucket *b = &z->buckets[k];
        float *recv = b->lo + b->len > z->total ? z->tail3 : params + b->lo;
        const float *send = un->bring ? un->bring + at : z->part_params + b->part_off;
        if (z->device && un->bring) { /* params offloaded on a device: the device dp group
                                       * sends device memory, so the part goes host ->
                                       * device into this rank's own block of recv and is
                                       * gathered in place (as zero.c's gather_range) */
            float *mine = recv + (size_t)z->rank * b->sub;
            z->be->ops->copy_to_device(z->be->self, mine, send, b->sub * sizeof(float));
            send = mine;
        }
        at += b->sub;
        LOOM_TRY(z->comm->allgather_start(z->dp, send, recv, b->sub, LOOM_DTYPE_F32,
                                          &un->req[un->n_req]));
        un->n_req++;
    }
    if (z->device) /* copied in above (the copies return once done): the host staging's
                    * pages go back now, not when the gathers complete */
        zero_release_bring(z, u);
    un->state = GATHERING;
    return LOOM_OK;
}

static loom_status finish_unit(loom_zero *z, int u)
{
    zero_unit *un = &z->units[u];
    loom_status st = LOOM_OK;
    for (int i = 0; i < un->n_req; i++) {
        loom_status w = z->comm->wait(z->dp, un->req[i]);
        if (st == LOOM_OK)
            st = w;
    }
    un->n_req = 0;
    zero_release_bring(z, u);
    const zero_bucket *b = &z->buckets[un->last_bucket];
    if (st == LOOM_OK && b->lo + b->len > z->total) /* the tail: staged, copy what exists */
        st = zero_buf_copy(z, loom_gpt_param_data(z->model) + b->lo, z->tail3, z->total - b->lo);
    un->state = RESIDENT;
    return st;
}

/* Params offloaded: start reading unit u out of the offload, if nothing of it has started. */
static loom_status read_ahead(loom_zero *z, int u)
{
    if (!z->store || u < 1 || u >= z->n_units || z->units[u].empty || z->units[u].state != STALE)
        return LOOM_OK;
    LOOM_TRY(zero_bring_submit(z, u));
    z->units[u].state = READING;
    return LOOM_OK;
}

/* A unit being read ahead that will not be gathered now: its read done, its staging freed. */
static loom_status drop_read(loom_zero *z, int u)
{
    loom_status st = zero_bring_wait(z, u);
    zero_release_bring(z, u);
    z->units[u].state = STALE;
    return st;
}

static loom_status need(loom_zero *z, int u)
{
    if (z->units[u].state < GATHERING)
        LOOM_TRY(start_unit(z, u));
    /* prefetch the next unit of this pass before waiting for this one; a pipeline stage
     * says what comes next itself (LOOM_PARAM_SOON: its passes interleave micro-batches,
     * so the direction of the last two calls says nothing) */
    int next = u > z->last_unit ? u + 1 : u - 1;
    z->last_unit = u;
    /* going down, the embeddings are next needed after the optimizer step: not now */
    int ahead = 0;
    if (!z->staged && next >= 1 && next < z->n_units && !z->units[next].empty &&
        z->units[next].state < GATHERING) {
        LOOM_TRY(start_unit(z, next));
        ahead = 1;
    }
    if (z->units[u].state == GATHERING)
        LOOM_TRY(finish_unit(z, u));
    /* params offloaded: the unit after the next one is read while this one computes and
     * the next gathers; after this unit's staging is freed, so that no more than two
     * units' staging is held (the reads are local: no order to keep across ranks) */
    if (ahead)
        LOOM_TRY(read_ahead(z, next + (next - u)));
    else if (!z->staged && next == z->n_units) /* ln_f, going up: the LM head computes next,
                                                * then backward needs the last block first */
        LOOM_TRY(read_ahead(z, u - 1));
    zero_measure_params(z);
    return LOOM_OK;
}

static loom_status param_use(void *ctx, int u, int needed)
{
    loom_zero *z = ctx;
    double t0 = loom_now_ms();
    loom_status st = LOOM_OK;
    if (u < 0 || u >= z->n_units)
        return loom_fail(LOOM_ERR_INTERNAL, "ZeRO-3: unit %d outside 0..%d", u, z->n_units - 1);
    if (z->units[u].empty) /* a pipeline stage's: another stage holds it */
        return LOOM_OK;
    if (needed == LOOM_PARAM_SOON) {
        if (z->units[u].state < GATHERING)
            st = start_unit(z, u);
    } else if (needed) {
        st = need(z, u);
    } else if (!z->pinned && z->units[u].state == RESIDENT) {
        if (!zero_device_unit_drop(z, u)) /* sparse: decommitted there */
            zero_drop_pages(z, z->units[u].inner_lo, z->units[u].inner_hi);
        z->units[u].state = STALE;
    }
    z->comm_ms += loom_now_ms() - t0;
    return st;
}

void zero_unit_pages(const loom_zero *z, zero_unit *un, size_t lo, size_t hi)
{
    /* the pages this unit alone owns: not the ones it shares with a neighbour */
    size_t page = page_size();
    uintptr_t base = (uintptr_t)loom_gpt_param_data(z->model);
    uintptr_t pa = (base + lo * sizeof(float) + page - 1) / page * page;
    uintptr_t pb = (base + hi * sizeof(float)) / page * page;
    un->inner_lo = lo, un->inner_hi = lo;
    if (pb > pa) {
        un->inner_lo = (pa - base) / sizeof(float);
        un->inner_hi = (pb - base) / sizeof(float);
    }
}

loom_status zero_params_init(loom_zero *z)
{
    const loom_param_table *t = loom_gpt_params(z->model);
    z->n_units = loom_gpt_get_config(z->model)->layers + 2;
    z->units = calloc((size_t)z->n_units, sizeof *z->units);
    /* params offloaded: the offload holds the partition (loom_zero_attach_params) */
    z->part_params = z->params_offloaded || z->device ? NULL : calloc(z->part, sizeof(float));
    z->tail3 = zero_buf_alloc(z, (size_t)ZERO_ALIGN * (size_t)z->n);
    if (z->device && z->tail3) { /* the partition and its mirror (zero_device.c); params
                                  * offloaded: the mirror alone, for attach to store */
        LOOM_TRY(zero_device_params(z));
        z->params_peak = z->total * sizeof(float); /* the whole buffer stays allocated */
    }
    z->n_param_pages = (z->total * sizeof(float) + 2 * page_size()) / page_size();
    z->param_pages = malloc(z->n_param_pages);
    if (!z->units || (!z->part_params && !z->params_offloaded) || !z->tail3 || !z->param_pages)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the ZeRO-3 parameter partition");
    float *params = loom_gpt_param_data(z->model);
    /* this rank's partition of the initial values: drawn here alone (partitioned
     * construction: the rest of the buffer is never written before its first gather), or
     * taken from the whole model every rank drew alike */
    if (z->part_params && z->undrawn)
        zero_draw_partition(z, z->part_params);
    else if (z->part_params && !z->device) /* device: zero_device_params did */
        zero_copy_partition(z, params, z->part_params);
    for (int u = 0; u < z->n_units; u++) {
        int first, last;
        loom_gpt_unit_entries(z->model, u, &first, &last);
        zero_unit *un = &z->units[u];
        un->first_bucket = un->last_bucket = -1;
        if (first > last) { /* not on this pipeline stage: never gathered */
            un->empty = 1;
            continue;
        }
        size_t lo = t->entries[first].offset, hi = t->entries[last].offset + t->entries[last].numel;
        for (int k = 0; k < z->n_buckets; k++) {
            const zero_bucket *b = &z->buckets[k];
            if (b->lo < hi && b->lo + b->len > lo) {
                if (un->first_bucket < 0)
                    un->first_bucket = k;
                un->last_bucket = k;
            }
        }
        int n = un->last_bucket - un->first_bucket + 1;
        if (un->first_bucket < 0 || n > ZERO_UNIT_BUCKETS)
            LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3: unit %d spans %d buckets (1 to %d expected)", u,
                      n, ZERO_UNIT_BUCKETS);
        zero_unit_pages(z, un, lo, hi);
        /* offloaded: once attach has read the initial values (a device's: copied above) */
        if (!z->params_offloaded || z->device)
            zero_drop_pages(z, un->inner_lo, un->inner_hi); /* until first needed */
    }
    z->last_unit = -1;
    z->staged = loom_gpt_is_stage(z->model);
    loom_gpt_set_param_hook(z->model, param_use, z);
    return LOOM_OK;
}

void zero_draw_partition(const loom_zero *z, float *part)
{
    const loom_param_table *t = loom_gpt_params(z->model);
    for (int k = 0; k < z->n_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        size_t a = b->lo + (size_t)z->rank * b->sub;
        loom_params_init_range(t, z->draw_seed, a, a + b->sub, part + b->part_off);
    }
}

void zero_params_free(loom_zero *z)
{
    if (z->units)
        loom_gpt_set_param_hook(z->model, NULL, NULL);
    zero_read_stop(z); /* reads queued finish into their staging before it is unmapped */
    for (int u = 0; z->units && u < z->n_units; u++)
        zero_release_bring(z, u); /* a gather left in flight by a failure */
    free(z->units);
    zero_buf_free(z, z->part_params);
    free(z->host_part);
    zero_buf_free(z, z->tail3);
    free(z->param_pages);
}

loom_status loom_zero_settle(loom_zero *z)
{
    loom_status st = LOOM_OK;
    for (int u = 0; z->units && u < z->n_units; u++)
        if (z->units[u].state == GATHERING || z->units[u].state == READING) {
            /* a read ahead also reads the partition the step rewrites */
            loom_status w = z->units[u].state == READING ? drop_read(z, u) : finish_unit(z, u);
            if (st == LOOM_OK)
                st = w;
        }
    return st;
}

void loom_zero_params_stale(loom_zero *z)
{
    if (z->ep) /* expert parallelism: a gather still in flight finished first */
        (void)zero_ep_params_drain(z);
    for (int u = 0; z->units && u < z->n_units; u++) {
        if (z->units[u].state == READING) /* old values: a failure is of no consequence */
            (void)drop_read(z, u);
        z->units[u].state = STALE; /* resident pages keep the old values until regathered */
    }
}

loom_status loom_zero_pin_params(loom_zero *z, int pin)
{
    if (!z->units)
        return LOOM_OK;
    if (z->ep) /* expert parallelism: its own gathers (zero_ep_params.c) */
        return zero_ep_pin_params(z, pin);
    loom_status st = LOOM_OK;
    if (pin) {
        z->pinned = 1;
        for (int u = 0; u < z->n_units && st == LOOM_OK; u++)
            if (!z->units[u].empty && z->units[u].state < GATHERING)
                st = start_unit(z, u);
        for (int u = 0; u < z->n_units; u++)
            if (z->units[u].state == GATHERING) {
                loom_status w = finish_unit(z, u);
                if (st == LOOM_OK)
                    st = w;
            }
        zero_measure_params(z);
        return st;
    }
    z->pinned = 0;
    for (int u = 0; u < z->n_units; u++)
        if (z->units[u].state == RESIDENT) {
            if (!zero_device_unit_drop(z, u))
                zero_drop_pages(z, z->units[u].inner_lo, z->units[u].inner_hi);
            z->units[u].state = STALE;
        }
    return LOOM_OK;
}

double loom_zero_take_comm_ms(loom_zero *z)
{
    double ms = z->comm_ms;
    z->comm_ms = 0.0;
    return ms;
}
