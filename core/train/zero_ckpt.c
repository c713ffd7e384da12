/* zero_ckpt.c — ZeRO's partitions to and from whole-tensor buffers (zero_ckpt.h). */
#include "zero_ckpt.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "zero_internal.h"

int loom_zero_ranks(const loom_zero *z) { return z->n; }
int loom_zero_rank(const loom_zero *z) { return z->rank; }

loom_status loom_zero_pieces(const loom_zero *z, int r, loom_zero_piece **out, size_t *n)
{
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

/* Copy between rank r's partition state `part` and the whole state `full`. */
static void move_state(const loom_param_table *t, const loom_zero_piece *p, size_t n, uint32_t slots,
                       float *part, float *full, int to_full)
{
    for (size_t i = 0; i < n; i++) {
        const loom_param_entry *e = &t->entries[p[i].entry];
        for (uint32_t k = 0; k < slots; k++) {
            float *w = full + (size_t)slots * e->offset + (size_t)k * e->numel + (p[i].lo - e->offset);
            float *q = part + (size_t)slots * p[i].pos + (size_t)k * p[i].n;
            if (to_full)
                memcpy(w, q, p[i].n * sizeof(float));
            else
                memcpy(q, w, p[i].n * sizeof(float));
        }
    }
}

loom_status loom_zero_ckpt_gather(loom_zero *z, uint32_t slots, float *full)
{
    const loom_param_table *t = loom_gpt_params(z->model);
    if (z->stage == 3)
        LOOM_TRY(loom_zero_pin_params(z, 1)); /* every unit gathered into the model's buffer */
    if (!slots)
        return LOOM_OK;
    if ((size_t)slots * z->part != z->state_floats)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO checkpoint: %u slots but the partition holds %zu floats",
                  slots, z->state_floats);
    float *all = malloc((size_t)z->n * z->state_floats * sizeof(float));
    if (!all)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory gathering the ZeRO optimizer state (%zu MiB)",
                  (size_t)z->n * z->state_floats * sizeof(float) >> 20);
    loom_comm_request *req = NULL;
    loom_status st = z->comm->allgather_start(z->dp, z->state, all, z->state_floats, LOOM_DTYPE_F32,
                                              &req);
    if (st == LOOM_OK)
        st = z->comm->wait(z->dp, req);
    for (int r = 0; r < z->n && st == LOOM_OK; r++) {
        loom_zero_piece *p = NULL;
        size_t n = 0;
        st = loom_zero_pieces(z, r, &p, &n);
        if (st == LOOM_OK)
            move_state(t, p, n, slots, all + (size_t)r * z->state_floats, full, 1);
        free(p);
    }
    free(all);
    return st;
}

loom_status loom_zero_ckpt_done(loom_zero *z)
{
    return z->stage == 3 ? loom_zero_pin_params(z, 0) : LOOM_OK;
}

void loom_zero_ckpt_scatter(loom_zero *z, uint32_t slots, const float *full,
                            const loom_zero_piece *p, size_t n)
{
    const loom_param_table *t = loom_gpt_params(z->model);
    const float *params = loom_gpt_param_data(z->model);
    if (slots && full)
        move_state(t, p, n, slots, z->state, (float *)full, 0);
    if (z->part_params) { /* stage 3: the partition is the parameters' home */
        for (size_t i = 0; i < n; i++)
            memcpy(z->part_params + p[i].pos, params + p[i].lo, p[i].n * sizeof(float));
        loom_zero_params_stale(z);
    }
}
