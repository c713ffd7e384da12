/* zero_params_device.c — ZeRO stage 3 with offloaded parameters on a device backend: each
 * unit's partition staged into the backend's memory for its all-gathers (zero_internal.h).
 *
 * The offload (host pool or file) holds the partition; zero_params_read.c's thread reads a
 * unit's part into host staging (un->bring) as on the CPU backend. The device dp group's
 * all-gathers send device memory (NCCL on the backend's stream; dist_staged.c copies it to
 * the host itself), so on the caller's thread — where every backend call is made (a CUDA
 * device is current per thread) — the part is copied host -> device into a staging buffer
 * of the backend's (un->dbring) and the host staging unmapped at once (the copy returns
 * once done, backend.h). The device buffers are kept for the next unit rather than freed
 * (a device allocation is slow): there are as many as units were in flight at once (two
 * in training, every unit while sampling pins them), each the largest unit's size. What
 * is sent is the bytes read, unchanged, so the gathers give the bits the partition holds.
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <sys/mman.h>

#include "base/status.h"

/* The largest unit's partition, the size of every staging buffer. */
static size_t largest_unit(const loom_zero *z)
{
    size_t most = 0;
    for (int u = 0; u < z->n_units; u++) {
        const zero_unit *un = &z->units[u];
        size_t floats = 0;
        for (int k = un->first_bucket; !un->empty && k <= un->last_bucket; k++)
            floats += z->buckets[k].sub;
        most = floats > most ? floats : most;
    }
    return most;
}

loom_status zero_bring_device(loom_zero *z, int u)
{
    zero_unit *un = &z->units[u];
    if (!z->device || !un->bring)
        return LOOM_OK;
    if (!z->dstage) {
        z->dstage = calloc((size_t)z->n_units, sizeof *z->dstage);
        z->dstage_floats = largest_unit(z);
        if (!z->dstage)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO-3's device staging list");
    }
    if (un->bring_floats > z->dstage_floats)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3: unit %d's partition (%zu floats) is larger than "
                  "the largest unit's (%zu)", u, un->bring_floats, z->dstage_floats);
    float *buf;
    if (z->n_dstage) {
        buf = z->dstage[--z->n_dstage];
    } else { /* every one made is in flight: one more */
        if (!(buf = zero_buf_alloc(z, z->dstage_floats)))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of device memory for unit %d's offloaded "
                      "parameters (%zu bytes of staging)", u, z->dstage_floats * sizeof(float));
        z->dstage_made++;
    }
    z->be->ops->copy_to_device(z->be->self, buf, un->bring, un->bring_floats * sizeof(float));
    /* the host staging is done with: the device buffer is what the gathers send */
    munmap(un->bring, un->bring_floats * sizeof(float));
    un->bring = NULL;
    z->bring_now -= un->bring_floats;
    un->dbring = buf;
    return LOOM_OK;
}

void zero_stage_put(loom_zero *z, int u)
{
    zero_unit *un = &z->units[u];
    if (!un->dbring)
        return;
    z->dstage[z->n_dstage++] = un->dbring; /* at most dstage_made <= n_units of them */
    un->dbring = NULL;
    un->bring_floats = 0;
}

void zero_stage_free(loom_zero *z)
{
    for (int i = 0; i < z->n_dstage; i++)
        zero_buf_free(z, z->dstage[i]);
    free(z->dstage);
    z->dstage = NULL;
    z->n_dstage = 0;
}
