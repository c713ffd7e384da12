/* zero_master.c — ZeRO stages 1 and 2 with 16-bit weights: the fp32 master partitioned
 * (zero.h, docs/ZERO.md "With bf16 or fp16 weights").
 *
 * The model computes on a 16-bit copy of the weights (gpt_precision.c) and its fp32
 * buffer is the master the optimizer updates. Below stage 3 every rank used to keep that
 * buffer whole (4 bytes a parameter) although it steps only its partition. Here each rank
 * keeps the fp32 master of its partition only (part_params: P/N floats, the ranges of its
 * optimizer-state partition, so each segment's parameter, gradient and state share one
 * place), the optimizer updates it there, and the post-step all-gather moves 16-bit values:
 * each rank rounds its sub-block of every bucket into the compute copy and the buckets are
 * all-gathered in place (zero.c). Rounding is element-wise, so the compute copy ends with
 * the bits rounding the whole gathered fp32 buffer gave, and the losses are unchanged bit
 * for bit. The model's fp32 buffer is then address space: its pages are handed back to the
 * OS here and never read again (the model is told the master lives elsewhere, gpt.h).
 * Checkpoints write and read the master as stage 3's parameter slices (zero_ckpt.h).
 * On a device backend (zero_device.c) the partition is the backend's memory with a host
 * mirror, the rounding the backend's convert_from_f32, the copies between the partition
 * and the model's buffer go through the host a sub-block at a time; with the backend's vm
 * ops the fp32 buffer is a sparse range (zero_sparse.c) committed only where kept, or
 * whole while a reader or writer of the whole master has it; without them the "released"
 * buffer is cleared, not handed back (a device allocation stays resident).
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* This rank's sub-block of buckets k0 .. k1 between the model's flat buffer and the
 * partition: into the partition (to_part = 1) or back where it belongs in the buffer; the
 * padding past the buffer's end only in the partition. dev: both are a device backend's
 * memory (zero_buf_copy_bytes: through the host, a sub-block at a time), else host memory. */
static loom_status copy_sub_blocks(loom_zero *z, float *params, float *part, int to_part,
                                   int k0, int k1, int dev)
{
    for (int k = k0; k <= k1; k++) {
        const zero_bucket *b = &z->buckets[k];
        size_t a = b->lo + (size_t)z->rank * b->sub, e = a + b->sub;
        if (a >= z->total)
            continue;
        size_t bytes = ((e < z->total ? e : z->total) - a) * sizeof(float);
        void *dst = to_part ? (void *)(part + b->part_off) : (void *)(params + a);
        const void *src = to_part ? (const void *)(params + a) : (const void *)(part + b->part_off);
        if (dev)
            LOOM_TRY(zero_buf_copy_bytes(z, dst, src, bytes));
        else
            memcpy(dst, src, bytes);
    }
    return LOOM_OK;
}

/* The elements [lo, hi) of the model's buffer the kept buckets span (lo = hi = total: none). */
static void kept_span(const loom_zero *z, size_t *lo, size_t *hi)
{
    *lo = *hi = z->total;
    if (!z->kept)
        return;
    const zero_bucket *f = &z->buckets[z->kept_first], *l = &z->buckets[z->kept_last];
    *lo = f->lo;
    *hi = l->lo + l->len < z->total ? l->lo + l->len : z->total;
}

/* The fp32 buffer's pages handed back to the OS, but for the kept buckets' (a page they
 * share with a neighbour stays too: zero_drop_pages drops whole pages only). A sparse
 * device buffer: the whole buffer's hold let go, the kept span's own hold stays. */
static void drop_unkept(loom_zero *z)
{
    if (z->psparse) {
        if (z->held_whole)
            zero_device_range_drop(z, 0, z->total);
        z->held_whole = 0;
        return;
    }
    size_t lo, hi;
    kept_span(z, &lo, &hi);
    zero_drop_pages(z, 0, lo);
    zero_drop_pages(z, hi, z->total);
}

/* A sparse device buffer (zero_sparse.c): the whole of it committed, for a reader or a
 * writer of the whole master (drop_unkept lets go); a no-op otherwise. */
static loom_status hold_whole(loom_zero *z)
{
    if (!z->psparse || z->held_whole)
        return LOOM_OK;
    LOOM_TRY(zero_device_range_hold(z, 0, z->total));
    z->held_whole = 1;
    return LOOM_OK;
}

/* A sparse device buffer: the kept buckets' span committed (the new span held before the
 * old is let go, so what both cover keeps its values); a no-op otherwise. */
static loom_status hold_kept(loom_zero *z)
{
    size_t lo, hi;
    kept_span(z, &lo, &hi);
    if (!z->psparse || (lo == z->held_lo && hi == z->held_hi))
        return LOOM_OK;
    LOOM_TRY(zero_device_range_hold(z, lo, hi));
    zero_device_range_drop(z, z->held_lo, z->held_hi);
    z->held_lo = lo;
    z->held_hi = hi;
    return LOOM_OK;
}

void zero_copy_partition(const loom_zero *z, const float *params, float *part)
{
    (void)copy_sub_blocks((loom_zero *)z, (float *)params, part, 1, 0, z->n_buckets - 1, 0);
}

int zero_master_whole(void)
{
    const char *v = getenv("LOOM_ZERO_MASTER");
    return v && !strcmp(v, "whole");
}

loom_status zero_master_init(loom_zero *z)
{
    /* from the initial values every rank drew alike (the compute copy was rounded from
     * them when the precision was set); a device: the partition in its memory beside a host
     * mirror for checkpoints (zero_device.c, as stage 3's parameter partition) */
    if (z->device)
        LOOM_TRY(zero_device_params(z));
    else if (!(z->part_params = calloc(z->part + 1, sizeof(float))))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the fp32 master partition (%zu MiB)",
                  z->part * sizeof(float) >> 20);
    else
        zero_copy_partition(z, loom_gpt_param_data(z->model), z->part_params);
    LOOM_TRY(loom_gpt_set_master_elsewhere(z->model, 1));
    z->master16 = 1;
    drop_unkept(z);
    return LOOM_OK;
}

loom_status loom_zero_params_will_write(loom_zero *z)
{
    return z->master16 ? hold_whole(z) : LOOM_OK;
}

loom_status loom_zero_params_written(loom_zero *z)
{
    if (!z->master16)
        return LOOM_OK;
    if (z->psparse && !z->held_whole)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO with 16-bit weights: the fp32 buffer was written "
                  "without loom_zero_params_will_write (it is committed only where kept)");
    LOOM_TRY(copy_sub_blocks(z, loom_gpt_param_data(z->model), z->part_params, 1, 0,
                             z->n_buckets - 1, z->device));
    LOOM_TRY(loom_gpt_set_master_elsewhere(z->model, 0)); /* the compute copy from it */
    loom_gpt_refresh_all_params(z->model);
    LOOM_TRY(loom_gpt_set_master_elsewhere(z->model, 1));
    drop_unkept(z); /* the kept buckets hold the values written, as every rank's */
    return LOOM_OK;
}

/* The fp32 master whole for a reader of it: this rank's sub-blocks back in the model's
 * buffer, then the fp32 all-gather of a step without master16. The values are the
 * partitions' own, so the buffer ends bitwise what every rank holds with
 * LOOM_ZERO_MASTER=whole. */
loom_status loom_zero_master_gather(loom_zero *z)
{
    if (!z->master16)
        return LOOM_OK;
    LOOM_TRY(hold_whole(z));
    LOOM_TRY(copy_sub_blocks(z, loom_gpt_param_data(z->model), z->part_params, 0, 0,
                             z->n_buckets - 1, z->device));
    return zero_gather_f32(z, 0, z->n_buckets - 1);
}

void loom_zero_master_release(loom_zero *z)
{
    if (z->master16)
        drop_unkept(z);
}

/* The kept buckets whole: each rank's sub-blocks from its partition into the buffer, then
 * those buckets all-gathered in fp32 (the values the partitions hold, so the range ends
 * bitwise what LOOM_ZERO_MASTER=whole's buffer holds there). */
loom_status zero_master_gather_kept(loom_zero *z)
{
    if (!z->kept)
        return LOOM_OK;
    LOOM_TRY(copy_sub_blocks(z, loom_gpt_param_data(z->model), z->part_params, 0, z->kept_first,
                             z->kept_last, z->device));
    return zero_gather_f32(z, z->kept_first, z->kept_last);
}

loom_status loom_zero_keep_master(loom_zero *z, size_t lo, size_t hi)
{
    if (!z->master16 || hi <= lo)
        return LOOM_OK;
    if (hi > z->total)
        LOOM_FAIL(LOOM_ERR_INVALID, "loom_zero_keep_master: [%zu, %zu) runs past the %zu "
                  "parameters", lo, hi, z->total);
    for (int k = 0; k < z->n_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        if (b->lo >= hi || b->lo + b->len <= lo)
            continue;
        if (!z->kept || k < z->kept_first) /* several ranges: the buckets spanning them all */
            z->kept_first = k;
        if (!z->kept || k > z->kept_last)
            z->kept_last = k;
        z->kept = 1;
    }
    LOOM_TRY(hold_kept(z)); /* a sparse device buffer: committed where kept */
    return zero_master_gather_kept(z); /* the pages were dropped at start-up */
}

size_t zero_master_kept_floats(const loom_zero *z)
{
    size_t lo, hi;
    kept_span(z, &lo, &hi);
    return hi - lo;
}
