/* compress_ckpt.c — a pipeline stage's residual files in a checkpoint (compress_ckpt.h). */
#include "compress_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/plugin_loader.h"
#include "loom/plugin/comm.h"

loom_status loom_ckpt_residual_stage(const char *mpath, const loom_session *s, int tp, int pp,
                                     int *first, int *parts)
{
    int stages = loom_session_pipeline_stages(s);
    if (stages != pp)
        LOOM_FAIL(LOOM_ERR_INVALID, "checkpoint '%s' holds the error-feedback residuals of %d "
                  "pipeline stages; this run has %d, and each stage's residuals are its own "
                  "(the tied wte's differ between the first and the last): resume with "
                  "mesh.pp=%d, or without compress", mpath, pp, stages, pp);
    const struct loom_comm_ops *ops = NULL;
    void *group = NULL;
    int size = 1;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_PP, &ops, &group, &size));
    int stage = ops && group ? ops->rank(group) : 0;
    *first = stage * tp;
    *parts = tp;
    return LOOM_OK;
}

/* An expert entry's name, "h.L.moe.expert.E.kind": its layer, expert E and where kind starts. */
static int expert_name(const char *name, int *layer, int *e, int *kind_at)
{
    int n = 0;
    if (sscanf(name, "h.%d.moe.expert.%d.%n", layer, e, &n) != 2 || n == 0)
        return 0;
    *kind_at = n;
    return 1;
}

loom_status loom_ckpt_residual_ep(const loom_gpt *m, const loom_param_table *t, const float *slots,
                                  uint32_t n, int ep, const loom_param_table *ft, float **out)
{
    int E = loom_gpt_get_config(m)->moe.experts, El = E / ep, mine = -1;
    for (int i = 0; i < t->count && mine < 0; i++) { /* this rank's ep rank: its first expert's */
        int l, e, k;
        if (loom_gpt_is_expert_entry(m, i) && expert_name(t->entries[i].name, &l, &e, &k))
            mine = e / El;
    }
    if (mine < 0 || mine >= ep)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "checkpoint: no expert entry of this rank's ep=%d table", ep);
    float *r = calloc((size_t)n * ft->total + 1, sizeof(float));
    if (!r)
        LOOM_FAIL(LOOM_ERR_NOMEM, "checkpoint: out of memory for the compression residuals "
                  "(%zu MiB)", (size_t)n * ft->total * sizeof(float) >> 20);
    for (int f = 0; f < ft->count; f++) {
        const loom_param_entry *fe = &ft->entries[f];
        int l, e, k, owner = -1;
        char local[LOOM_PARAM_NAME_MAX];
        snprintf(local, sizeof local, "%s", fe->name);
        if (strstr(fe->name, ".moe.expert.") && expert_name(fe->name, &l, &e, &k)) {
            /* every rank's table holds its experts at the same offsets: this rank's entry of
             * the same local index stands for rank k's */
            owner = e / El;
            snprintf(local, sizeof local, "h.%d.moe.expert.%d.%s", l, mine * El + e % El,
                     fe->name + k);
        }
        const loom_param_entry *le = loom_params_find(t, local);
        if (!le || le->numel != fe->numel) {
            free(r);
            LOOM_FAIL(LOOM_ERR_INTERNAL, "checkpoint: %s has no residual entry %s under ep=%d",
                      fe->name, local, ep);
        }
        for (uint32_t s = 0; s < n; s++)
            if (owner < 0 || (int)(s % (uint32_t)ep) == owner)
                memcpy(r + (size_t)n * fe->offset + (size_t)s * fe->numel,
                       slots + (size_t)n * le->offset + (size_t)s * le->numel,
                       fe->numel * sizeof(float));
    }
    *out = r;
    return LOOM_OK;
}
