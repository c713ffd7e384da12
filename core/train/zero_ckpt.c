/* zero_ckpt.c — ZeRO's partitions to and from whole-tensor buffers (zero_ckpt.h). */
#include "zero_ckpt.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "offload.h"
#include "zero_internal.h"

int loom_zero_ranks(const loom_zero *z) { return z->n; }
int loom_zero_rank(const loom_zero *z) { return z->rank; }

loom_status loom_zero_pieces(const loom_zero *z, int r, loom_zero_piece **out, size_t *n)
{
    if (z->ep) /* this rank's dense and expert pieces (zero_ep.c) */
        return zero_ep_pieces(z, out, n);
    const loom_param_table *t = loom_gpt_params(z->model);
    size_t cap = (size_t)t->count + (size_t)z->n_buckets, k = 0;
    loom_zero_piece *p = malloc(cap * sizeof *p);
    if (!p)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO checkpoint pieces");
    for (int b = 0; b < z->n_buckets; b++) {
        const zero_bucket *bk = &z->buckets[b];
        size_t a = bk->lo + (size_t)r * bk->sub, e_ = a + bk->sub;
        for (int i = 0; i < t->count && k < cap; i++) {
            const loom_param_entry *e = &t->entries[i];
            size_t lo = e->offset > a ? e->offset : a;
            size_t hi = e->offset + e->numel < e_ ? e->offset + e->numel : e_;
            if (lo < hi)
                p[k++] = (loom_zero_piece){i, lo, hi - lo, bk->part_off + (lo - a)};
        }
    }
    *out = p;
    *n = k;
    return LOOM_OK;
}

/* device: the host mirror, which loom_zero_from_host copies in (zero_device.c) */
float *loom_zero_load_params_dst(loom_zero *z) { return z->device ? z->host_part : z->part_params; }

loom_status loom_zero_store_part(loom_zero *z, const float *part)
{
    if (!z->store)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO: a parameter partition stored without an offload");
    loom_zero_params_stale(z); /* no read ahead of the old values in flight */
    LOOM_TRY(loom_offload_write_params(z->store, 0, z->part, part));
    loom_zero_params_stale(z);
    return LOOM_OK;
}
