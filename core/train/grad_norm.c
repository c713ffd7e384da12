/* grad_norm.c — the global gradient norm, the same bits on every rank and for every
 * tensor-parallel split (see grad_norm.h).
 */
#include "grad_norm.h"

#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "loom/plugin/strategy.h"
#include "base/plugin_loader.h"
#include "base/status.h"
#include "base/clock.h"

struct loom_grad_norm {
    const loom_backend_ops *k;
    const struct loom_comm_ops *ops;   /* the tp group; NULL with one rank */
    void *group;
    int tp, tp_rank;
    int per_entry;      /* chunk slots a parameter: max(LOOM_CANONICAL_CHUNKS, tp) */
    size_t slots;       /* entries * per_entry + 1 (the non-finite flag) */
    double *mine;       /* this rank's chunk sums */
    double *gathered;   /* the tp group's */
    int skip;           /* an entry counted elsewhere, or -1 */
    int first_bad;      /* the last compute's first entry with inf or nan, or -1 */
    const double *last; /* the slots the last compute summed */
};

loom_status loom_grad_norm_create(const loom_backend *be, const loom_param_table *t,
                                  loom_grad_norm **out)
{
    *out = NULL;
    loom_grad_norm *gn = calloc(1, sizeof *gn);
    if (!gn)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    gn->k = be->ops;
    gn->skip = -1;
    gn->first_bad = -1;
    loom_status st = loom_core_host()->group(LOOM_GROUP_TP, &gn->ops, &gn->group, &gn->tp);
    if (st != LOOM_OK) {
        free(gn);
        return st;
    }
    gn->tp_rank = gn->ops ? gn->ops->rank(gn->group) : 0;
    gn->per_entry = gn->tp > LOOM_CANONICAL_CHUNKS ? gn->tp : LOOM_CANONICAL_CHUNKS;
    gn->slots = (size_t)t->count * (size_t)gn->per_entry + 1;
    gn->mine = calloc(gn->slots, sizeof(double));
    gn->gathered = calloc(gn->slots * (size_t)gn->tp, sizeof(double));
    if (!gn->mine || !gn->gathered) {
        loom_grad_norm_destroy(gn);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the gradient norm's chunk sums");
    }
    *out = gn;
    return LOOM_OK;
}

void loom_grad_norm_skip(loom_grad_norm *gn, int i) { gn->skip = i; }

int loom_grad_norm_first_nonfinite(const loom_grad_norm *gn) { return gn->first_bad; }

const double *loom_grad_norm_slots(const loom_grad_norm *gn, size_t *n)
{
    *n = gn->slots - 1;
    return gn->last ? gn->last : gn->mine;
}

void loom_grad_norm_destroy(loom_grad_norm *gn)
{
    if (!gn)
        return;
    free(gn->mine);
    free(gn->gathered);
    free(gn);
}

/* Sum of squares of a held slice's canonical chunk c along dim d (c counted from the
 * slice's first chunk; chunk length cs along d): `outer` rows of cs*inner values, which
 * the backend sums with the same bits in every layout. */
static double chunk_sum_squares(const loom_backend_ops *k, const float *g, const loom_param_entry *e,
                                int d, int64_t c, int64_t cs)
{
    size_t outer = 1, inner = 1;
    for (int i = 0; i < d; i++)
        outer *= (size_t)e->slice_len[i];
    for (int i = d + 1; i < e->ndim; i++)
        inner *= (size_t)e->slice_len[i];
    return k->sum_squares(g + (size_t)(c * cs) * inner, outer, (size_t)cs * inner,
                          (size_t)e->slice_len[d] * inner);
}

loom_status loom_grad_norm_compute(loom_grad_norm *gn, const loom_param_table *t,
                                   const float *grads, double *norm_sq, int *nonfinite,
                                   double *comm_ms)
{
    const loom_backend_ops *k = gn->k;
    const struct loom_comm_ops *ops = gn->ops;
    void *group = gn->group;
    int tp = gn->tp, tp_rank = gn->tp_rank;
    size_t slots = gn->slots;
    double *mine = gn->mine;
    memset(mine, 0, slots * sizeof(double));
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        const float *g = grads + e->offset;
        if (i == gn->skip)
            continue;
        int d = e->split_dim; /* chunked whether or not this run splits it */
        double *slot = mine + (size_t)i * (size_t)gn->per_entry;
        if (d < 0) {
            if (tp_rank == 0)
                slot[0] = k->sum_squares(g, 1, e->numel, e->numel);
            continue;
        }
        /* Chunks of the logical dim; a split that does not line up with them (fast mode,
         * odd sizes, tp > 8) falls back to one chunk per held slice (tp <= norm_per_entry
         * of them). */
        int64_t n = e->shape[d] % LOOM_CANONICAL_CHUNKS == 0 &&
                            e->slice_len[d] % (e->shape[d] / LOOM_CANONICAL_CHUNKS) == 0
                        ? LOOM_CANONICAL_CHUNKS
                        : e->shape[d] / e->slice_len[d];
        int64_t cs = e->shape[d] / n, first = e->slice_start[d] / cs;
        for (int64_t c = 0; c < e->slice_len[d] / cs; c++)
            slot[first + c] = chunk_sum_squares(k, g, e, d, c, cs);
    }
    int bad = -1; /* the first entry in table order: what a non-finite report names */
    for (int i = 0; i < t->count && bad < 0; i++)
        if (i != gn->skip && k->has_nonfinite(grads + t->entries[i].offset, t->entries[i].numel))
            bad = i;
    gn->first_bad = bad;
    mine[slots - 1] = bad >= 0 ? 1.0 : 0.0;
    const double *all = mine;
    if (ops) {
        loom_comm_request *req = NULL;
        double t0 = loom_now_ms();
        LOOM_TRY(ops->allgather_start(group, mine, gn->gathered, slots * sizeof(double),
                                      LOOM_DTYPE_U8, &req));
        LOOM_TRY(ops->wait(group, req));
        *comm_ms += loom_now_ms() - t0;
        for (size_t j = 0; j < slots; j++) {
            double v = 0.0;
            for (int r = 0; r < tp; r++)
                v += gn->gathered[(size_t)r * slots + j];
            gn->gathered[j] = v; /* row 0 is consumed in order: safe in place */
        }
        all = gn->gathered;
    }
    gn->last = all;
    double sum = 0.0;
    for (size_t j = 0; j + 1 < slots; j++)
        sum += all[j];
    *norm_sq = sum;
    *nonfinite = all[slots - 1] != 0.0;
    return LOOM_OK;
}

