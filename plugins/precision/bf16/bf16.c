/* bf16.c — loom-precision-bf16: weights and activations stored in bf16, everything else fp32.
 *
 * What: the model reads a bf16 compute copy of the weights, rounded (to nearest even) from
 * the fp32 master parameters the optimizer updates, and rounds every activation a GPU run
 * stores to bf16 where it is written (core/model/gpt.h: loom_gpt_set_precision); matmuls,
 * layer-norm statistics, softmax, the loss, gradients, their accumulation and reduction
 * and the optimizer state are fp32 (Megatron-LM's --bf16 with fp32 gradient accumulation
 * and all-reduce; PyTorch's torch.autocast(dtype=torch.bfloat16) keeps fp32 master weights
 * likewise). bf16 has fp32's exponent range, so no loss scaling: the scale is 1 and a step
 * whose gradients hold inf or nan is skipped, as fp32's plugin does.
 * reduce = "bf16": the data-parallel all-reduce sends the gradients as bf16 (half the
 * bytes; dtypes' grad says BF16, the core sets the dp strategy's wire dtype from it); they
 * are still accumulated in fp32 and widened back to fp32 after the reduction.
 * What not: no loss scale, no state.
 * Invariants: loss_scale() is always 1; update() skips exactly when found_nonfinite; the
 * only exported symbol is loom_plugin_entry.
 */
#include <string.h>

#include "loom/plugin.h"
#include "loom/plugin/precision.h"

enum { K_REDUCE, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_REDUCE] = {"reduce", LOOM_CFG_STRING, "\"f32\"",
                  "dtype of the data-parallel gradient all-reduce: \"f32\" or \"bf16\" (half "
                  "the bytes, the gradients rounded to bf16 before it)"},
};

typedef struct bf16 {
    const loom_host *host;
    int reduce_bf16;
} bf16;

static loom_status bf16_create(const loom_host *host, const loom_config *cfg, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID; /* no host, no way to say more */
    if (cfg == NULL || cfg->count < N_KEYS || cfg->values == NULL || !cfg->values[K_REDUCE].string)
        return host->fail(LOOM_ERR_INVALID, "bf16: expected %d resolved config values, got %d",
                          N_KEYS, cfg ? cfg->count : 0);
    const char *reduce = cfg->values[K_REDUCE].string;
    if (strcmp(reduce, "f32") && strcmp(reduce, "bf16"))
        return host->fail(LOOM_ERR_INVALID, "bf16: reduce = \"%s\" must be \"f32\" (the "
                          "default) or \"bf16\"", reduce);
    bf16 *b = host->alloc(sizeof *b);
    if (b == NULL)
        return host->fail(LOOM_ERR_NOMEM, "bf16: out of memory");
    b->host = host;
    b->reduce_bf16 = strcmp(reduce, "bf16") == 0;
    *self = b;
    return LOOM_OK;
}

static void bf16_destroy(void *self)
{
    if (self != NULL)
        ((bf16 *)self)->host->free(self);
}

static void bf16_dtypes(void *self, loom_precision_dtypes *out)
{
    out->param = LOOM_DTYPE_BF16;
    out->compute = LOOM_DTYPE_BF16;
    out->grad = ((bf16 *)self)->reduce_bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
    out->master_weights = 1;
}

static float bf16_loss_scale(void *self) { return (void)self, 1.0f; }

static int bf16_update(void *self, int found_nonfinite) { return (void)self, found_nonfinite != 0; }

static void bf16_get_state(void *self, float *state, int *n) { (void)self, (void)state, *n = 0; }

static void bf16_set_state(void *self, const float *state, int n) { (void)self, (void)state, (void)n; }

static const loom_precision_ops ops = {
    .size = sizeof(loom_precision_ops),
    .create = bf16_create,
    .destroy = bf16_destroy,
    .dtypes = bf16_dtypes,
    .loss_scale = bf16_loss_scale,
    .update = bf16_update,
    .get_state = bf16_get_state,
    .set_state = bf16_set_state,
    .stop_reason = NULL,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_PRECISION,
    .name = "bf16",
    .version = "0.1.0",
    .summary = "bf16 weights and activations, fp32 master weights, gradients and optimizer state",
    .config_keys = keys,
    .n_config_keys = N_KEYS,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
