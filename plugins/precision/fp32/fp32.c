/* fp32.c — loom-precision-fp32: everything in fp32, no loss scaling.
 *
 * What: parameters, activations and gradients are all F32, so there are no master
 * weights and the loss scale is 1 (PyTorch's default, no torch.autocast / GradScaler:
 * https://pytorch.org/docs/stable/amp.html). A step whose gradients hold inf or nan is
 * skipped rather than poisoning the weights; with no scale to lower, the next step simply
 * tries again.
 * What not: no scale state, nothing to checkpoint (get_state reports 0 floats), no keys.
 * Invariants: loss_scale() is always 1; update() skips exactly when found_nonfinite; the
 * only exported symbol is loom_plugin_entry.
 */
#include "loom/plugin.h"
#include "loom/plugin/precision.h"

typedef struct fp32 {
    const loom_host *host;
} fp32;

static loom_status fp32_create(const loom_host *host, const loom_config *cfg, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID; /* no host, no way to say more */
    /* An instance, though stateless, so create/destroy behave like every other plugin's. */
    fp32 *f = host->alloc(sizeof *f);
    if (f == NULL)
        return host->fail(LOOM_ERR_NOMEM, "fp32: out of memory");
    f->host = host;
    *self = f;
    return LOOM_OK;
}

static void fp32_destroy(void *self)
{
    if (self != NULL)
        ((fp32 *)self)->host->free(self);
}

static void fp32_dtypes(void *self, loom_precision_dtypes *out)
{
    out->param = LOOM_DTYPE_F32;
    out->compute = LOOM_DTYPE_F32;
    out->grad = LOOM_DTYPE_F32;
    out->master_weights = 0;
}

static float fp32_loss_scale(void *self) { return 1.0f; }

static int fp32_update(void *self, int found_nonfinite) { return found_nonfinite != 0; }

static void fp32_get_state(void *self, float *state, int *n) { *n = 0; }

static void fp32_set_state(void *self, const float *state, int n) {}

static const loom_precision_ops ops = {
    .size = sizeof(loom_precision_ops),
    .create = fp32_create,
    .destroy = fp32_destroy,
    .dtypes = fp32_dtypes,
    .loss_scale = fp32_loss_scale,
    .update = fp32_update,
    .get_state = fp32_get_state,
    .set_state = fp32_set_state,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_PRECISION,
    .name = "fp32",
    .version = "0.1.0",
    .summary = "fp32 parameters, activations and gradients; skips non-finite steps",
    .config_keys = NULL,
    .n_config_keys = 0,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
