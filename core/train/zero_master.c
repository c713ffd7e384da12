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
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* This rank's sub-block of every bucket between the model's flat buffer and the
 * partition: into the partition (to_part = 1) or back where it belongs in the buffer; the
 * padding past the buffer's end only in the partition. */
static void copy_sub_blocks(const loom_zero *z, float *params, float *part, int to_part)
{
    for (int k = 0; k < z->n_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        size_t a = b->lo + (size_t)z->rank * b->sub, e = a + b->sub;
        if (a >= z->total)
            continue;
        size_t bytes = ((e < z->total ? e : z->total) - a) * sizeof(float);
        if (to_part)
            memcpy(part + b->part_off, params + a, bytes);
        else
            memcpy(params + a, part + b->part_off, bytes);
    }
}

void zero_copy_partition(const loom_zero *z, const float *params, float *part)
{
    copy_sub_blocks(z, (float *)params, part, 1);
}

int zero_master_whole(void)
{
    const char *v = getenv("LOOM_ZERO_MASTER");
    return v && !strcmp(v, "whole");
}

loom_status zero_master_init(loom_zero *z)
{
    if (!(z->part_params = calloc(z->part + 1, sizeof(float))))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the fp32 master partition (%zu MiB)",
                  z->part * sizeof(float) >> 20);
    /* from the initial values every rank drew alike (the compute copy was rounded from
     * them when the precision was set) */
    zero_copy_partition(z, loom_gpt_param_data(z->model), z->part_params);
    LOOM_TRY(loom_gpt_set_master_elsewhere(z->model, 1));
    z->master16 = 1;
    zero_drop_pages(z, 0, z->total);
    return LOOM_OK;
}

loom_status loom_zero_params_written(loom_zero *z)
{
    if (!z->master16)
        return LOOM_OK;
    zero_copy_partition(z, loom_gpt_param_data(z->model), z->part_params);
    LOOM_TRY(loom_gpt_set_master_elsewhere(z->model, 0)); /* the compute copy from it */
    loom_gpt_refresh_all_params(z->model);
    LOOM_TRY(loom_gpt_set_master_elsewhere(z->model, 1));
    zero_drop_pages(z, 0, z->total);
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
    copy_sub_blocks(z, loom_gpt_param_data(z->model), z->part_params, 0);
    return zero_gather_f32(z);
}

void loom_zero_master_release(loom_zero *z)
{
    if (z->master16)
        zero_drop_pages(z, 0, z->total);
}
