/* fp16.c — loom-precision-fp16: weights and activations stored in fp16, fp32 master weights,
 * with dynamic loss scaling.
 *
 * What: storage as bf16.c's (the model rounds its weight copy and activations to fp16,
 * everything else fp32), and since fp16's range ends at 65504 and its normals at 2^-14,
 * the loss gradient is multiplied by a scale before backward (the core divides the
 * gradients by it before the optimizer). The scaler is PyTorch's GradScaler
 * (https://pytorch.org/docs/stable/amp.html#gradient-scaling) with Megatron-LM's hysteresis
 * (megatron/core/optimizer/grad_scaler.py, DynamicGradScaler):
 *   a step with an inf/nan gradient (on any rank: the core agrees on it) is skipped, the
 *     run of good steps restarts, and once `hysteresis` such steps have come since the
 *     last growth (or the start), it and every further one multiply the scale by
 *     backoff_factor (not below min_scale);
 *   after growth_interval good steps in a row the scale is multiplied by growth_factor
 *     and the hysteresis budget refills.
 * An overflow while the scale is already at min_scale with the budget spent means the
 * model overflows even there: stop_reason() says so, and the core stops the run.
 * State (the checkpoint's 4 floats): scale, good steps in a row, hysteresis left, whether
 * the last step overflowed at min_scale; each exact in a float (counts below 2^24).
 * Invariants: the scale is always in [min_scale, FLT_MAX]; update() skips exactly when
 * found_nonfinite; the only exported symbol is loom_plugin_entry.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "loom/plugin.h"
#include "loom/plugin/precision.h"

enum { K_INITIAL, K_GROWTH, K_BACKOFF, K_INTERVAL, K_HYSTERESIS, K_MIN, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_INITIAL] = {"initial_scale", LOOM_CFG_NUMBER, "65536", "loss scale of the first step (2^16)"},
    [K_GROWTH] = {"growth_factor", LOOM_CFG_NUMBER, "2", "scale x this after growth_interval good steps (> 1)"},
    [K_BACKOFF] = {"backoff_factor", LOOM_CFG_NUMBER, "0.5", "scale x this on overflow (in (0, 1))"},
    [K_INTERVAL] = {"growth_interval", LOOM_CFG_INTEGER, "2000", "good steps in a row before the scale grows (>= 1)"},
    [K_HYSTERESIS] = {"hysteresis", LOOM_CFG_INTEGER, "1", "overflowing steps before the scale backs off (>= 1; Megatron uses 2)"},
    [K_MIN] = {"min_scale", LOOM_CFG_NUMBER, "1", "the scale never goes below this (> 0); an overflow there stops the run"},
};

typedef struct fp16 {
    const loom_host *host;
    float growth, backoff, min_scale;
    int interval, hysteresis;
    float scale;      /* state[0] */
    int good;         /* state[1]: good steps since the last overflow or growth */
    int budget;       /* state[2]: overflows left before a back-off */
    int stuck;        /* state[3]: the last step overflowed at min_scale */
    char why[320];
} fp16;

static loom_status fp16_create(const loom_host *host, const loom_config *cfg, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID; /* no host, no way to say more */
    if (cfg == NULL || cfg->count < N_KEYS || cfg->values == NULL)
        return host->fail(LOOM_ERR_INVALID, "fp16: expected %d resolved config values, got %d",
                          N_KEYS, cfg ? cfg->count : 0);
    const loom_config_value *v = cfg->values;
    double init = v[K_INITIAL].number, growth = v[K_GROWTH].number, back = v[K_BACKOFF].number;
    double min = v[K_MIN].number, interval = v[K_INTERVAL].number, hyst = v[K_HYSTERESIS].number;
    if (!(min > 0) || !(min <= FLT_MAX))
        return host->fail(LOOM_ERR_INVALID, "fp16: min_scale must be a finite number > 0, got %g", min);
    if (!(init >= min) || !(init <= FLT_MAX))
        return host->fail(LOOM_ERR_INVALID, "fp16: initial_scale must be finite and >= min_scale "
                          "(%g), got %g (e.g. 65536)", min, init);
    if (!(growth > 1) || !isfinite(growth))
        return host->fail(LOOM_ERR_INVALID, "fp16: growth_factor must be > 1, got %g (e.g. 2)", growth);
    if (!(back > 0 && back < 1))
        return host->fail(LOOM_ERR_INVALID, "fp16: backoff_factor must be in (0, 1), got %g (e.g. 0.5)", back);
    if (!(interval >= 1 && interval < 16777216))
        return host->fail(LOOM_ERR_INVALID, "fp16: growth_interval must be in [1, 2^24), got %g (e.g. 2000)", interval);
    if (!(hyst >= 1 && hyst < 16777216))
        return host->fail(LOOM_ERR_INVALID, "fp16: hysteresis must be in [1, 2^24), got %g (1: back off on every overflow)", hyst);
    fp16 *f = host->alloc(sizeof *f);
    if (f == NULL)
        return host->fail(LOOM_ERR_NOMEM, "fp16: out of memory");
    *f = (fp16){.host = host, .growth = (float)growth, .backoff = (float)back,
                .min_scale = (float)min, .interval = (int)interval, .hysteresis = (int)hyst,
                .scale = (float)init, .good = 0, .budget = (int)hyst, .stuck = 0};
    *self = f;
    return LOOM_OK;
}

static void fp16_destroy(void *self)
{
    if (self != NULL)
        ((fp16 *)self)->host->free(self);
}

static void fp16_dtypes(void *self, loom_precision_dtypes *out)
{
    (void)self;
    out->param = LOOM_DTYPE_F16;
    out->compute = LOOM_DTYPE_F16;
    out->grad = LOOM_DTYPE_F32;
    out->master_weights = 1;
}

static float fp16_loss_scale(void *self) { return ((fp16 *)self)->scale; }

static int fp16_update(void *self, int found_nonfinite)
{
    fp16 *f = self;
    f->stuck = 0;
    if (!found_nonfinite) {
        if (++f->good >= f->interval) {
            float grown = f->scale * f->growth;
            f->scale = grown <= FLT_MAX ? grown : f->scale; /* never inf */
            f->good = 0;
            f->budget = f->hysteresis;
        }
        return 0;
    }
    f->good = 0;
    if (f->budget > 0)
        f->budget--;
    if (f->budget > 0)
        return 1; /* hysteresis: skip, keep the scale */
    /* spent (it refills only with growth, as Megatron's): every overflow backs off now */
    if (f->scale <= f->min_scale) {
        f->stuck = 1;
        return 1;
    }
    float lower = f->scale * f->backoff;
    f->scale = lower > f->min_scale ? lower : f->min_scale;
    return 1;
}

static const char *fp16_stop_reason(void *self)
{
    fp16 *f = self;
    if (!f->stuck)
        return NULL;
    snprintf(f->why, sizeof f->why,
             "fp16: the gradients overflow even at the minimum loss scale (min_scale = %g); try "
             "precision = \"bf16\" (fp32's exponent range, no scaling), a lower lr or grad_clip, "
             "or a smaller min_scale", (double)f->min_scale);
    return f->why;
}

static void fp16_get_state(void *self, float *state, int *n)
{
    fp16 *f = self;
    state[0] = f->scale;
    state[1] = (float)f->good;
    state[2] = (float)f->budget;
    state[3] = (float)f->stuck;
    *n = 4;
}

/* A checkpoint of another precision has no state (n = 0): keep the recipe's start. */
static void fp16_set_state(void *self, const float *state, int n)
{
    fp16 *f = self;
    if (n < 4)
        return;
    if (state[0] > 0 && state[0] <= FLT_MAX)
        f->scale = state[0];
    f->good = (int)state[1];
    f->budget = (int)state[2];
    f->stuck = state[3] != 0;
}

static const loom_precision_ops ops = {
    .size = sizeof(loom_precision_ops),
    .create = fp16_create,
    .destroy = fp16_destroy,
    .dtypes = fp16_dtypes,
    .loss_scale = fp16_loss_scale,
    .update = fp16_update,
    .get_state = fp16_get_state,
    .set_state = fp16_set_state,
    .stop_reason = fp16_stop_reason,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_PRECISION,
    .name = "fp16",
    .version = "0.1.0",
    .summary = "fp16 weights and activations, fp32 master weights, dynamic loss scaling",
    .config_keys = keys,
    .n_config_keys = N_KEYS,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
