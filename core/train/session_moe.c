/* session_moe.c — a step's mixture-of-experts statistics summed over the pipeline stages
 * (each holds its blocks' rows; the aux and z losses add over the stages' blocks) and the
 * data-parallel group (session.h: loom_session_moe_stats), so the report counts every
 * rank's tokens in every MoE block. */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "base/plugin_loader.h"
#include "base/status.h"

loom_status loom_session_moe_stats(loom_session *s, loom_moe_stats *out, double **load)
{
    *load = NULL;
    loom_gpt_moe_stats(loom_session_model(s), out, 1);
    if (!out->layers)
        return LOOM_OK;
    size_t n = (size_t)out->layers * out->experts;
    double *v = malloc((n + 5) * sizeof(double));
    float *f = malloc((n + 5) * sizeof(float));
    if (!v || !f) {
        free(v);
        free(f);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    memcpy(v, out->load, n * sizeof(double));
    v[n] = out->assigned;
    v[n + 1] = out->dropped;
    v[n + 2] = out->aux * out->forwards; /* sums, so the group's mean is one division */
    v[n + 3] = out->z * out->forwards;
    v[n + 4] = out->counts_forwards ? out->forwards : 0; /* once per forward of the model */
    loom_status st = LOOM_OK;
    for (int grp = 0; grp < 2 && st == LOOM_OK; grp++) { /* the stages, then dp */
        const struct loom_comm_ops *ops;
        void *group;
        int size = 1;
        st = loom_core_host()->group(grp ? LOOM_GROUP_DP : LOOM_GROUP_PP, &ops, &group, &size);
        if (st != LOOM_OK || size < 2)
            continue;
        /* fp32: counts exact to 2^24 per step, enough for a report (the communicators
         * have no f64) */
        loom_comm_request *r;
        for (size_t i = 0; i < n + 5; i++)
            f[i] = (float)v[i];
        st = ops->allreduce_start(group, f, f, n + 5, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
        if (st == LOOM_OK)
            st = ops->wait(group, r);
        for (size_t i = 0; i < n + 5; i++)
            v[i] = f[i];
    }
    free(f);
    if (st != LOOM_OK) {
        free(v);
        return st;
    }
    out->load = v;
    out->assigned = v[n];
    out->dropped = v[n + 1];
    out->forwards = (int)v[n + 4];
    out->aux = out->forwards ? v[n + 2] / v[n + 4] : 0.0;
    out->z = out->forwards ? v[n + 3] / v[n + 4] : 0.0;
    *load = v;
    return LOOM_OK;
}
