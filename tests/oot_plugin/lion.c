/* lion.c — loom-optim-lion: the Lion optimizer, built OUT of the loom tree.
 *
 * This folder is the example a third party copies: one C file, built with nothing but
 * the installed headers,
 *     cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags loom) lion.c -o loom-optim-lion.so
 * and used by putting the .so on LOOM_PLUGIN_PATH and writing optimizer = { "lion", ... }.
 *
 * Math: Lion, "Symbolic Discovery of Optimization Algorithms" (Chen et al., 2023,
 * arXiv:2302.06675), Algorithm 2, per element with g = grad_scale * grad:
 *     u = sign(b1 m + (1 - b1) g)          sign(0) = 0, as torch.sign
 *     p = p - lr (u + wd p)                decoupled decay, as in AdamW
 *     m = b2 m + (1 - b2) g                the momentum is updated AFTER the step
 * What not: no bias correction (Lion has none); which parameters decay is the core's call
 * (segment.weight_decay), the schedule owns lr.
 * Invariants: one state slot (m); step allocates nothing; the only exported symbol is
 * loom_plugin_entry; the core is reached only through the loom_host given to create.
 */
#include <math.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/plugin/optim.h"

enum { K_LR, K_BETAS, K_WEIGHT_DECAY, K_DECAY, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_LR] = {"lr", LOOM_CFG_NUMBER, NULL,
              "learning rate (> 0); Lion wants ~3-10x smaller than AdamW's"},
    [K_BETAS] = {"betas", LOOM_CFG_NUMBERS, "{0.9, 0.99}",
                 "{b1, b2}: b1 mixes the update direction, b2 the momentum; each in [0, 1)"},
    [K_WEIGHT_DECAY] = {"weight_decay", LOOM_CFG_NUMBER, "0",
                        "decoupled weight decay (>= 0): p -= lr * weight_decay * p"},
    [K_DECAY] = {"decay", LOOM_CFG_STRING, "\"matrices\"",
                 "which parameters decay: \"matrices\" (not biases or norms) or \"all\""},
};

typedef struct lion {
    const loom_host *host;
    float beta1, beta2;
    float weight_decay;
    int decay_all;
} lion;

static loom_status lion_create(const loom_host *host, const loom_config *cfg, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID;
    if (cfg == NULL || cfg->count < N_KEYS || cfg->values == NULL)
        return host->fail(LOOM_ERR_INVALID, "lion: expected %d resolved config values, got %d",
                          N_KEYS, cfg ? cfg->count : 0);
    const loom_config_value *v = cfg->values;
    double lr = v[K_LR].number, wd = v[K_WEIGHT_DECAY].number;
    const char *decay = v[K_DECAY].string ? v[K_DECAY].string : "";
    if (!(lr > 0) || !isfinite(lr))
        return host->fail(LOOM_ERR_INVALID, "lion: lr must be a finite number > 0, got %g", lr);
    if (v[K_BETAS].n_numbers != 2)
        return host->fail(LOOM_ERR_INVALID, "lion: betas must be two numbers {b1, b2}, got %d",
                          v[K_BETAS].n_numbers);
    double b1 = v[K_BETAS].numbers[0], b2 = v[K_BETAS].numbers[1];
    if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
        return host->fail(LOOM_ERR_INVALID, "lion: betas must each be in [0, 1), got {%g, %g}",
                          b1, b2);
    if (!(wd >= 0) || !isfinite(wd))
        return host->fail(LOOM_ERR_INVALID,
                          "lion: weight_decay must be a finite number >= 0, got %g", wd);
    if (strcmp(decay, "matrices") != 0 && strcmp(decay, "all") != 0)
        return host->fail(LOOM_ERR_INVALID,
                          "lion: decay must be \"matrices\" or \"all\", got \"%s\"", decay);
    lion *l = host->alloc(sizeof *l);
    if (l == NULL)
        return host->fail(LOOM_ERR_NOMEM, "lion: out of memory");
    l->host = host;
    l->beta1 = (float)b1;
    l->beta2 = (float)b2;
    l->weight_decay = (float)wd;
    l->decay_all = strcmp(decay, "all") == 0;
    *self = l;
    return LOOM_OK;
}

static void lion_destroy(void *self)
{
    if (self != NULL)
        ((lion *)self)->host->free(self);
}

static uint32_t lion_state_per_param(void *self) { return 1; }

static void lion_decay_rule(void *self, float *weight_decay, int *decay_all)
{
    const lion *l = self;
    *weight_decay = l->weight_decay;
    *decay_all = l->decay_all;
}

static loom_status lion_step(void *self, const loom_optim_step_args *args)
{
    const lion *l = self;
    if (args == NULL || (args->n_segments > 0 && args->segments == NULL))
        return l->host->fail(LOOM_ERR_INVALID, "lion: step needs segments");
    const float lr = args->lr, gs = args->grad_scale, b1 = l->beta1, b2 = l->beta2;
    for (size_t k = 0; k < args->n_segments; k++) {
        const loom_optim_segment *seg = &args->segments[k];
        if (seg->n > 0 && (seg->param == NULL || seg->grad == NULL || seg->state == NULL))
            return l->host->fail(LOOM_ERR_INVALID,
                                 "lion: segment %zu has a NULL param, grad or state buffer", k);
        float *restrict p = seg->param, *restrict m = seg->state;
        const float *restrict grad = seg->grad;
        const float wd = seg->weight_decay;
        for (size_t i = 0; i < seg->n; i++) {
            float g = gs * grad[i];
            float c = b1 * m[i] + (1 - b1) * g;
            float u = (float)(c > 0) - (float)(c < 0); /* branch-free sign, sign(0) = 0 */
            p[i] -= lr * (u + wd * p[i]);
            m[i] = b2 * m[i] + (1 - b2) * g;
        }
    }
    return LOOM_OK;
}

static const loom_optim_ops ops = {
    .size = sizeof(loom_optim_ops),
    .create = lion_create,
    .destroy = lion_destroy,
    .state_per_param = lion_state_per_param,
    .decay_rule = lion_decay_rule,
    .step = lion_step,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_OPTIM,
    .name = "lion",
    .version = "0.1.0",
    .summary = "Lion: sign of interpolated momentum (Chen et al. 2023); out-of-tree example",
    .config_keys = keys,
    .n_config_keys = N_KEYS,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
