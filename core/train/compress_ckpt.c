/* compress_ckpt.c — a pipeline stage's residual files in a checkpoint (compress_ckpt.h). */
#include "compress_ckpt.h"

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
