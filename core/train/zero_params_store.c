/* zero_params_store.c — ZeRO stage 3 with the parameter partition offloaded
 * (strategy.offload.params = true; ZeRO-Infinity's parameter offload; see zero.h).
 *
 * No partition is kept in this process: the offload (offload.h: the host pool or the file
 * under path) holds it beside the optimizer state, and the optimizer steps it there chunk
 * by chunk. A unit's gather (zero_params.c start_unit) first reads the unit's sub-blocks
 * out of the offload into a staging buffer of the unit's partition size, sends from it,
 * and frees it when the gather completes: what is resident of the parameters is the model's
 * transient full-size buffer (pages released after use, as without offload) and the
 * staging of the units in flight (at most the unit in use and the one prefetched, or every
 * unit while sampling pins them, plus the unit read ahead). The reads run on a thread
 * of their own (zero_params_read.c): while a unit computes, the next one's all-gather is
 * in flight and the one after it is read (zero_params.c need), so reading overlaps compute.
 * On a device backend the staging stays host memory: start_unit copies each bucket's part
 * into this rank's block of the device receive buffer, gathers in place, and frees the
 * staging at once; the offloaded step copies only the gradients over (offload_device.c).
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/status.h"
#include "offload.h"

const size_t *loom_zero_param_offsets(const loom_zero *z) { return z->seg_pos; }

size_t loom_zero_part_floats(const loom_zero *z) { return z->part; }

/* Bucket k's sub-block of this rank: its [a, e) in the model's buffer, clipped to total. */
static size_t own_range(const loom_zero *z, int k, size_t *a)
{
    const zero_bucket *b = &z->buckets[k];
    *a = b->lo + (size_t)z->rank * b->sub;
    if (*a >= z->total)
        return 0;
    size_t e = *a + b->sub;
    return (e < z->total ? e : z->total) - *a;
}

/* This rank's partition of the initial values into the offload: from the model's buffer,
 * or (partitioned construction) drawn a bucket's sub-block at a time; on a device from the
 * host copy zero_device_params took before the buffer could go sparse, then freed (the
 * offload holds the partition, no mirror is kept). */
static loom_status store_params(loom_zero *z)
{
    if (z->device) {
        if (!z->host_part)
            LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3 on a device: the initial partition was not "
                      "copied to the host before the offload took it");
        loom_status st = loom_offload_write_params(z->store, 0, z->part, z->host_part);
        free(z->host_part);
        z->host_part = NULL;
        LOOM_TRY(st);
        loom_zero_params_stale(z);
        return LOOM_OK;
    }
    const float *params = loom_gpt_param_data(z->model);
    float *drawn = NULL;
    if (z->undrawn && !(drawn = malloc(z->max_len / (size_t)z->n * sizeof(float) + 1)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory drawing the ZeRO-3 parameter partition");
    loom_status st = LOOM_OK;
    for (int k = 0; k < z->n_buckets && st == LOOM_OK; k++) {
        size_t a, n = own_range(z, k, &a);
        if (n && drawn)
            loom_params_init_range(loom_gpt_params(z->model), z->draw_seed, a, a + n, drawn);
        if (n)
            st = loom_offload_write_params(z->store, z->buckets[k].part_off, n,
                                           drawn ? drawn : params + a);
    }
    free(drawn);
    LOOM_TRY(st);
    loom_zero_params_stale(z);
    return LOOM_OK;
}

loom_status loom_zero_attach_params(loom_zero *z, struct loom_offload *o)
{
    if (!z->params_offloaded || z->stage != 3)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO: parameters attached to an offload without "
                  "zero = 3 and params offloaded");
    z->store = o;
    LOOM_TRY(store_params(z)); /* the initial values every rank drew alike */
    for (int u = 0; !z->device && u < z->n_units; u++) /* until first needed, as zero_params_init
                                                        * does (a device's: done there) */
        if (!z->units[u].empty)
            zero_drop_pages(z, z->units[u].inner_lo, z->units[u].inner_hi);
    return LOOM_OK;
}

loom_status zero_bring_submit(loom_zero *z, int u)
{
    zero_unit *un = &z->units[u];
    if (!z->store)
        return LOOM_OK;
    if (un->bring)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3: unit %d gathered twice at once", u);
    size_t floats = 0;
    for (int k = un->first_bucket; k <= un->last_bucket; k++)
        floats += z->buckets[k].sub;
    /* mapped, not malloc'd: unmapped on release, its pages go back to the OS at once
     * (glibc would keep a freed block of this size in its heap, resident) */
    void *map = mmap(NULL, floats * sizeof(float), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    un->bring = map == MAP_FAILED ? NULL : map;
    if (!un->bring)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for unit %d's parameters (%zu bytes)", u,
                  floats * sizeof(float));
    un->bring_floats = floats;
    z->bring_now += floats;
    if (z->bring_now > z->bring_peak)
        z->bring_peak = z->bring_now;
    loom_status st = zero_read_submit(z, u); /* zero_params_read.c's thread reads it */
    if (st != LOOM_OK)
        zero_release_bring(z, u);
    return st;
}

loom_status zero_bring_wait(loom_zero *z, int u)
{
    if (!z->store)
        return LOOM_OK;
    loom_status st = zero_read_wait(z, u);
    if (st != LOOM_OK)
        zero_release_bring(z, u);
    return st;
}

loom_status zero_bring_unit(loom_zero *z, int u)
{
    LOOM_TRY(zero_bring_submit(z, u));
    return zero_bring_wait(z, u);
}

void zero_release_bring(loom_zero *z, int u)
{
    zero_unit *un = &z->units[u];
    if (!un->bring)
        return;
    munmap(un->bring, un->bring_floats * sizeof(float));
    un->bring = NULL;
    z->bring_now -= un->bring_floats;
    un->bring_floats = 0;
}

loom_status loom_zero_read_part_params(loom_zero *z, const float **out, float **owned)
{
    *owned = NULL;
    *out = z->device ? z->host_part : z->part_params; /* device: the mirror (to_host) */
    if (!z->store)
        return LOOM_OK;
    if (!(*owned = malloc(z->part * sizeof(float) + 1)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for a copy of the offloaded parameter "
                  "partition (%zu MiB)", z->part * sizeof(float) >> 20);
    loom_status st = loom_offload_read_params(z->store, 0, z->part, *owned);
    if (st != LOOM_OK) {
        free(*owned);
        *owned = NULL;
        return st;
    }
    *out = *owned;
    return LOOM_OK;
}
