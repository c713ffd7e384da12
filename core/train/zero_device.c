/* zero_device.c — ZeRO stages 1, 2 and 3 in a device backend's memory (see zero.h).
 *
 * Where the backend's buffers are not host memory (CUDA), ZeRO's own buffers are the
 * backend's too: the optimizer state partition, stage 2's gradient partition and staging,
 * stage 3's parameter partition, and the tail buckets' staging. The bucket collectives go over dist's device groups
 * (loom_host.device_group: NCCL on the backend's stream, or dist_staged.c's copies through
 * host memory over shm or mpi); the norm's two doubles per rank stay on the host groups.
 * The host sees the state (and stage 3's parameter partition) only through mirrors
 * (checkpoints, the state hash), copied by loom_zero_to_host / loom_zero_from_host as the
 * session's own mirrors are. Stage 3 gathers each unit into the model's device buffer
 * before use as on the host. Where the backend has vm ops, zero_sparse.c makes the model's
 * gradient and parameter buffers sparse (committed where live); without them a "release"
 * clears the unit's own range instead (a device allocation stays resident), so a read of a
 * released unit reads zeros, not last step's values. With 16-bit weights below stage 3 the
 * fp32 master's partition is part_params here too (zero_master.c; zero_device_params takes
 * it); with the optimizer offloaded the state partition is the offload's (none here), and
 * with offload.params = true stage 3's parameter partition too (zero_params_store.c: each
 * unit's part copied host -> device into its own block of the receive buffer and
 * gathered in place: zero_params.c start_unit).
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/plugin_loader.h"
#include "base/status.h"

float *zero_buf_alloc(loom_zero *z, size_t floats)
{
    if (!z->device)
        return calloc(floats ? floats : 1, sizeof(float));
    return z->be->ops->alloc(z->be->self, (floats ? floats : 1) * sizeof(float)); /* zeroed */
}

void zero_buf_free(loom_zero *z, float *p)
{
    if (!p)
        return;
    if (z->device)
        z->be->ops->free(z->be->self, p);
    else
        free(p);
}

void zero_buf_clear(loom_zero *z, float *p, size_t floats)
{
    if (z->device)
        z->be->ops->zero(z->be->self, p, floats * sizeof(float));
    else
        memset(p, 0, floats * sizeof(float));
}

/* Buffer to buffer (both host, or both the device's), in bytes: for 2-byte elements (a
 * bucket's sub-block or the tail of the 16-bit compute copy), which loom_backend_copy_bits
 * (floats only) cannot move, so on a device through a host bounce: bits unchanged. */
loom_status zero_buf_copy_bytes(loom_zero *z, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return LOOM_OK;
    if (!z->device) {
        memcpy(dst, src, bytes);
        return LOOM_OK;
    }
    void *bounce = malloc(bytes);
    if (!bounce)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO's staging through the host");
    z->be->ops->copy_to_host(z->be->self, bounce, src, bytes);
    z->be->ops->copy_to_device(z->be->self, dst, bounce, bytes);
    free(bounce);
    return LOOM_OK;
}

void zero_buf_move(loom_zero *z, float *dst, const float *src, size_t floats)
{
    if (!floats)
        return;
    if (z->device)
        loom_backend_copy_bits(z->be, dst, src, floats);
    else
        memcpy(dst, src, floats * sizeof(float));
}

/* Floats: on a device by the backend's ops (loom_backend_copy_bits), no host bounce. */
loom_status zero_buf_copy(loom_zero *z, float *dst, const float *src, size_t floats)
{
    zero_buf_move(z, dst, src, floats);
    return LOOM_OK;
}

loom_status zero_device_init(loom_zero *z, const loom_zero_config *c)
{
    z->device = 1;
    if (c->ep)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO in device memory: ep takes zero_ep.c's own path");
    /* the buckets' collectives over the groups for the backend's memory; the norm's
     * exchange of host doubles over the host group (hcomm, set by the caller) */
    int n = 0;
    LOOM_TRY(loom_core_host()->device_group(LOOM_GROUP_DP, &z->comm, &z->dp, &n));
    if (!z->comm || n != z->n)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO in device memory: the device dp group has %d ranks, "
                  "the host one %d (loom_dist_device_open)", n, z->n);
    return LOOM_OK;
}

loom_status zero_device_state(loom_zero *z, int offloaded)
{
    if (!z->state_floats || offloaded) /* offloaded: the offload's host pool or file holds it,
                                        * stepped over these segments (offload_device.c) */
        return LOOM_OK;
    z->state = zero_buf_alloc(z, z->state_floats);
    z->host_state = calloc(z->state_floats, sizeof(float));
    if (!z->state || !z->host_state)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the ZeRO optimizer state partition and its "
                  "host mirror (%zu MiB each)", z->state_floats * sizeof(float) >> 20);
    return LOOM_OK;
}

loom_status zero_device_params(loom_zero *z)
{
    const loom_backend_ops *k = z->be->ops;
    /* params offloaded: only the host copy, until attach writes it into the offload */
    z->part_params = z->params_offloaded ? NULL : zero_buf_alloc(z, z->part);
    z->host_part = calloc(z->part + 1, sizeof(float));
    float *whole = malloc(z->total * sizeof(float) + 1);
    loom_status st = LOOM_OK;
    if ((!z->part_params && !z->params_offloaded) || !z->host_part || !whole)
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory for the ZeRO-3 parameter partition and "
                       "its host mirror (%zu MiB)", z->part * sizeof(float) >> 20);
    if (st == LOOM_OK) { /* once, at start: the whole initial buffer through the host */
        k->copy_to_host(z->be->self, whole, loom_gpt_param_data(z->model),
                        z->total * sizeof(float));
        zero_copy_partition(z, whole, z->host_part);
        if (z->part_params)
            k->copy_to_device(z->be->self, z->part_params, z->host_part, z->part * sizeof(float));
    }
    free(whole);
    return st;
}

void loom_zero_to_host(loom_zero *z)
{
    if (!z || !z->device)
        return;
    if (z->host_state)
        z->be->ops->copy_to_host(z->be->self, z->host_state, z->state,
                                 z->state_floats * sizeof(float));
    if (z->host_part)
        z->be->ops->copy_to_host(z->be->self, z->host_part, z->part_params,
                                 z->part * sizeof(float));
}

void loom_zero_from_host(loom_zero *z)
{
    if (!z || !z->device)
        return;
    if (z->host_state)
        z->be->ops->copy_to_device(z->be->self, z->state, z->host_state,
                                   z->state_floats * sizeof(float));
    if (z->host_part)
        z->be->ops->copy_to_device(z->be->self, z->part_params, z->host_part,
                                   z->part * sizeof(float));
}

int loom_zero_device(const loom_zero *z) { return z->device; }

