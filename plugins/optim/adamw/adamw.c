/* adamw.c — loom-optim-adamw: Adam with decoupled weight decay.
 *
 * Math: exactly PyTorch's torch.optim.AdamW (amsgrad off, maximize off;
 * https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html; Loshchilov & Hutter,
 * "Decoupled Weight Decay Regularization", 2019), per element, t = args->step:
 *     g  = grad_scale * grad
 *     p  = p * (1 - lr * wd)                  decoupled: decay never enters m or v
 *     m  = b1 m + (1 - b1) g
 *     v  = b2 v + (1 - b2) g^2
 *     p  = p - lr * mhat / (sqrt(vhat) + eps), mhat = m / (1 - b1^t), vhat = v / (1 - b2^t)
 * The last line is evaluated as PyTorch does: step_size = lr / (1 - b1^t),
 * denom = sqrt(v) / sqrt(1 - b2^t) + eps, p -= step_size * m / denom (bias corrections in
 * double, once per step).
 * freeze_variance = N > 0 (1-bit Adam's frozen variance, Tang et al. 2021; docs/COMPRESS.md):
 * steps t > N leave v as step N left it (b2 = 1, 1 - b2 = 0: v * 1 + 0 is v exactly) and
 * divide by that step's bias correction sqrt(1 - b2^N); m goes on as above.
 * What not: no amsgrad, no per-group betas; the core decides which segments decay by
 * setting segment.weight_decay (0 for biases and norms when decay = "matrices").
 * Invariants: 2 state slots, slot-major: m at state[0..n), v at state[n..2n); t >= 1;
 * step allocates nothing; step_backend (device memory) has step's constants and, through
 * the backend's adamw_update, its bits; the only exported symbol is loom_plugin_entry.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/plugin/optim.h"
#include "../optim_common.h"

enum { K_LR, K_BETAS, K_EPS, K_WEIGHT_DECAY, K_DECAY, K_FREEZE, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_LR] = {"lr", LOOM_CFG_NUMBER, NULL, "learning rate (> 0); a schedule scales it per step"},
    [K_BETAS] = {"betas", LOOM_CFG_NUMBERS, "{0.9, 0.999}",
                 "decay rates {b1, b2} of the first and second moment, each in [0, 1)"},
    [K_EPS] = {"eps", LOOM_CFG_NUMBER, "1e-8", "added to the denominator for stability (> 0)"},
    [K_WEIGHT_DECAY] = {"weight_decay", LOOM_CFG_NUMBER, "0.01",
                        "decoupled weight decay (>= 0): p *= 1 - lr * weight_decay"},
    [K_DECAY] = {"decay", LOOM_CFG_STRING, "\"matrices\"",
                 "which parameters decay: \"matrices\" (not biases or norms) or \"all\""},
    [K_FREEZE] = {"freeze_variance", LOOM_CFG_NUMBER, "0",
                  "after this many steps v stays as it is (1-bit Adam, with strategy.compress "
                  "momentum = true); 0: never"},
};

typedef struct adamw {
    const loom_host *host;
    double beta1, beta2;
    float eps;
    float weight_decay;
    int decay_all;
    double freeze; /* freeze_variance: v is frozen after this step; 0: never */
} adamw;

static loom_status adamw_create(const loom_host *host, const loom_config *cfg, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID; /* no host, no way to say more */
    loom_status st = optim_check_config(host, "adamw", cfg, keys, N_KEYS);
    if (st != LOOM_OK)
        return st;
    const loom_config_value *v = cfg->values;
    double lr = v[K_LR].number, eps = v[K_EPS].number, wd = v[K_WEIGHT_DECAY].number;
    const char *decay = v[K_DECAY].string;
    int decay_all = 0;
    st = optim_check_common(host, "adamw", lr, wd, decay, &decay_all);
    if (st != LOOM_OK)
        return st;
    if (v[K_BETAS].n_numbers != 2)
        return host->fail(LOOM_ERR_INVALID,
                          "adamw: betas must be two numbers {b1, b2}, got %d numbers",
                          v[K_BETAS].n_numbers);
    double b1 = v[K_BETAS].numbers[0], b2 = v[K_BETAS].numbers[1];
    if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
        return host->fail(LOOM_ERR_INVALID,
                          "adamw: betas must each be in [0, 1), got {%g, %g}", b1, b2);
    if (!(eps > 0) || !isfinite(eps))
        return host->fail(LOOM_ERR_INVALID, "adamw: eps must be a finite number > 0, got %g", eps);
    double freeze = v[K_FREEZE].number;
    if (!(freeze >= 0 && freeze <= 1e15 && freeze == floor(freeze)))
        return host->fail(LOOM_ERR_INVALID, "adamw: freeze_variance must be a whole number of "
                          "steps >= 0 (0: never), got %g", freeze);
    adamw *a = host->alloc(sizeof *a);
    if (a == NULL)
        return host->fail(LOOM_ERR_NOMEM, "adamw: out of memory");
    a->host = host;
    a->beta1 = b1;
    a->beta2 = b2;
    a->eps = (float)eps;
    a->weight_decay = (float)wd;
    a->decay_all = decay_all;
    a->freeze = freeze;
    *self = a;
    return LOOM_OK;
}

static void adamw_destroy(void *self)
{
    if (self != NULL)
        ((adamw *)self)->host->free(self);
}

static uint32_t adamw_state_per_param(void *self) { return 2; }

static void adamw_decay_rule(void *self, float *weight_decay, int *decay_all)
{
    const adamw *a = self;
    *weight_decay = a->weight_decay;
    *decay_all = a->decay_all;
}

/* Elements [0, n) of one segment. The float expressions follow PyTorch's kernels op for op
 * (lerp_ for m, mul_/addcmul_ for v, sqrt/div/add for denom, addcdiv_ for p) so a PyTorch
 * fixture matches closely; restrict and a loop-invariant branch let the compiler vectorise
 * (sqrtf too: built with -fno-math-errno; the vector square root rounds as the scalar one
 * does, and no FMA is contracted, so every element has the scalar loop's bits).
 * kernels/cuda/optim.cu's adamw kernel is this loop, operation for operation. */
static void adamw_range(const loom_adamw_consts *c, float *restrict p, const float *restrict grad,
                        float *restrict m, float *restrict v, size_t n)
{
    const float decay = c->decay;
    const int small_w = c->w < 0.5f; /* ATen lerp's two forms */
    for (size_t i = 0; i < n; i++) {
        float g = c->gs * grad[i];
        float mi = small_w ? m[i] + c->w * (g - m[i]) : g - (g - m[i]) * c->one_minus_w;
        float vi = v[i] * c->b2 + c->one_minus_b2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
        p[i] = p[i] * decay - c->step_size * mi / denom;
    }
}

/* One segment, in chunks over the OpenMP threads the backend set (elements are
 * independent, so any split gives the same bits). A single-threaded scalar step was 7% of
 * a 2-thread training step of the small GPT config on a 2-core AVX2 EPYC. */
static void adamw_segment(const loom_adamw_consts *c, const loom_optim_segment *seg)
{
    enum { CHUNK = 1 << 14 }; /* elements per work item: 64 KiB of each array */
    const size_t n = seg->n, chunks = (n + CHUNK - 1) / CHUNK;
    float *p = seg->param, *m = seg->state, *v = seg->state + n;
    const float *grad = seg->grad;
#pragma omp parallel for schedule(static) if (chunks > 2)
    for (size_t k = 0; k < chunks; k++) {
        const size_t i0 = k * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        adamw_range(c, p + i0, grad + i0, m + i0, v + i0, len);
    }
}

/* The checks and the per-step constants both paths share; c->decay is per segment. */
static loom_status adamw_prepare(const adamw *a, const loom_optim_step_args *args,
                                 loom_adamw_consts *c)
{
    if (args == NULL || (args->n_segments > 0 && args->segments == NULL))
        return a->host->fail(LOOM_ERR_INVALID, "adamw: step needs segments");
    if (args->step < 1)
        return a->host->fail(LOOM_ERR_INVALID,
                             "adamw: step count must be >= 1 (1-based), got %lld",
                             (long long)args->step);
    for (size_t k = 0; k < args->n_segments; k++) {
        const loom_optim_segment *seg = &args->segments[k];
        if (seg->n > 0 && (seg->param == NULL || seg->grad == NULL || seg->state == NULL))
            return a->host->fail(LOOM_ERR_INVALID,
                                 "adamw: segment %zu has a NULL param, grad or state buffer", k);
    }
    /* Bias corrections once per step, in double (1 - b2^t is tiny early on). */
    double t = (double)args->step;
    int frozen = a->freeze > 0 && t > a->freeze; /* v stays: b2 = 1, 1 - b2 = 0 */
    double bc1 = 1.0 - pow(a->beta1, t), bc2 = 1.0 - pow(a->beta2, frozen ? a->freeze : t);
    float w = (float)(1.0 - a->beta1);
    *c = (loom_adamw_consts){
        .gs = args->grad_scale,
        .decay = 1.0f, /* per segment: segment_decay */
        .b2 = frozen ? 1.0f : (float)a->beta2,
        .one_minus_b2 = frozen ? 0.0f : (float)(1.0 - a->beta2),
        .step_size = (float)((double)args->lr / bc1),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = a->eps,
        .w = w,
        .one_minus_w = 1.0f - w,
    };
    return LOOM_OK;
}

/* 1 - lr * wd in double, as PyTorch computes the Python-float factor. */
static float segment_decay(const loom_optim_step_args *args, size_t k)
{
    return (float)(1.0 - (double)args->lr * args->segments[k].weight_decay);
}

static loom_status adamw_step(void *self, const loom_optim_step_args *args)
{
    const adamw *a = self;
    loom_adamw_consts c;
    loom_status st = adamw_prepare(a, args, &c);
    if (st != LOOM_OK)
        return st;
    for (size_t k = 0; k < args->n_segments; k++) {
        c.decay = segment_decay(args, k);
        adamw_segment(&c, &args->segments[k]);
    }
    return LOOM_OK;
}

/* Device memory: the same constants, the element loop as the backend's adamw_update. */
static loom_status adamw_step_backend(void *self, const loom_optim_step_args *args,
                                      const loom_backend_ops *be, void *be_self)
{
    (void)be_self;
    const adamw *a = self;
    if (be == NULL || be->size <= offsetof(loom_backend_ops, adamw_update) ||
        be->adamw_update == NULL)
        return a->host->fail(LOOM_ERR_UNSUPPORTED, "adamw: this backend has no adamw_update op, "
                             "so the update cannot run in its memory; use a backend that has "
                             "it (cuda) or host memory (cpu)");
    loom_adamw_consts c;
    loom_status st = adamw_prepare(a, args, &c);
    if (st != LOOM_OK)
        return st;
    for (size_t k = 0; k < args->n_segments; k++) {
        const loom_optim_segment *seg = &args->segments[k];
        c.decay = segment_decay(args, k);
        if (seg->n > 0)
            be->adamw_update(seg->param, seg->grad, seg->state, seg->state + seg->n, seg->n, &c);
    }
    return LOOM_OK;
}

static const loom_optim_ops ops = {
    .size = sizeof(loom_optim_ops),
    .create = adamw_create,
    .destroy = adamw_destroy,
    .state_per_param = adamw_state_per_param,
    .decay_rule = adamw_decay_rule,
    .step = adamw_step,
    .step_backend = adamw_step_backend,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_OPTIM,
    .name = "adamw",
    .version = "0.1.0",
    .summary = "Adam with decoupled weight decay (PyTorch AdamW semantics)",
    .config_keys = keys,
    .n_config_keys = N_KEYS,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
