/* session_ep.c — expert parallelism's groups, reduction and norm (session_ep.h). */
#include "session_ep.h"

#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "base/clock.h"
#include "base/plugin_loader.h"
#include "base/status.h"

struct loom_ep {
    const struct loom_comm_ops *ops;
    void *ep, *edp;    /* split from the dp group */
    int size, rank, edp_size;
    double *gathered;  /* ep doubles x 2 */
};

loom_status loom_ep_create(int ep, loom_gpt_parallel *par, loom_ep **out)
{
    *out = NULL;
    const struct loom_comm_ops *ops;
    void *dp;
    int dp_size = 1;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_DP, &ops, &dp, &dp_size));
    if (ep < 2)
        return LOOM_OK;
    if (!ops || dp_size % ep)
        LOOM_FAIL(LOOM_ERR_INVALID, "mesh ep=%d must divide dp=%d (experts are split over ep of "
                  "the dp ranks)", ep, dp_size);
    loom_ep *x = calloc(1, sizeof *x);
    if (!x)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    x->ops = ops;
    int r = ops->rank(dp);
    x->size = ep;
    x->rank = r % ep;
    x->edp_size = dp_size / ep;
    x->gathered = calloc((size_t)ep * 2, sizeof(double));
    loom_status st = x->gathered ? ops->split(dp, r / ep, r, &x->ep)
                                 : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK)
        st = ops->split(dp, r % ep, r, &x->edp);
    if (st != LOOM_OK) {
        loom_ep_destroy(x);
        return st;
    }
    par->ep = ep;
    par->ep_rank = x->rank;
    par->ep_ops = ops;
    par->ep_comm = x->ep;
    *out = x;
    return LOOM_OK;
}

void loom_ep_destroy(loom_ep *x)
{
    if (!x)
        return;
    if (x->ep)
        x->ops->destroy(x->ep);
    if (x->edp)
        x->ops->destroy(x->edp);
    free(x->gathered);
    free(x);
}

loom_status loom_ep_reduce(loom_ep *x, loom_gpt *m, double *comm_ms)
{
    if (!x || x->edp_size < 2)
        return LOOM_OK;
    const loom_param_table *t = loom_gpt_params(m);
    float *g = loom_gpt_grad_data(m);
    double t0 = loom_now_ms();
    for (int i = 0; i < t->count; i++) { /* one exchange per run of expert entries */
        if (!loom_gpt_is_expert_entry(m, i))
            continue;
        int j = i;
        while (j + 1 < t->count && loom_gpt_is_expert_entry(m, j + 1))
            j++;
        size_t off = t->entries[i].offset, n = t->entries[j].offset + t->entries[j].numel - off;
        loom_comm_request *r;
        LOOM_TRY(x->ops->allreduce_start(x->edp, g + off, g + off, n, LOOM_DTYPE_F32,
                                         LOOM_REDUCE_SUM, &r));
        LOOM_TRY(x->ops->wait(x->edp, r));
        i = j;
    }
    *comm_ms += loom_now_ms() - t0;
    return LOOM_OK;
}

loom_status loom_ep_norm(loom_ep *x, loom_gpt *m, const double *slots, size_t n, double *norm_sq,
                         int *nonfinite, double *comm_ms)
{
    if (!x)
        return LOOM_OK;
    const loom_param_table *t = loom_gpt_params(m);
    size_t per = n / (size_t)t->count;
    double dense = 0.0, mine[2] = {0.0, *nonfinite ? 1.0 : 0.0};
    for (size_t j = 0; j < n; j++) /* grad_norm's order, the experts set aside */
        if (loom_gpt_is_expert_entry(m, (int)(j / per)))
            mine[0] += slots[j];
        else
            dense += slots[j];
    double t0 = loom_now_ms();
    loom_comm_request *r;
    LOOM_TRY(x->ops->allgather_start(x->ep, mine, x->gathered, sizeof mine, LOOM_DTYPE_U8, &r));
    LOOM_TRY(x->ops->wait(x->ep, r));
    *comm_ms += loom_now_ms() - t0;
    for (int p = 0; p < x->size; p++) { /* in rank order: the same bits everywhere */
        dense += x->gathered[2 * p];
        *nonfinite |= x->gathered[2 * p + 1] != 0.0;
    }
    *norm_sq = dense;
    return LOOM_OK;
}
