/* sgd.c — loom-optim-sgd: stochastic gradient descent with optional (Nesterov) momentum.
 *
 * Math: PyTorch's torch.optim.SGD with dampening 0
 * (https://pytorch.org/docs/stable/generated/torch.optim.SGD.html), per element:
 *     g = grad_scale * grad + wd * p       L2 decay added to the gradient (coupled, the
 *                                          PyTorch SGD way; AdamW's decay is decoupled)
 *     b = momentum * b + g                 b starts at 0, so b_1 = g_1 as in PyTorch
 *     d = nesterov ? g + momentum * b : b  (momentum 0: d = g, no buffer)
 *     p = p - lr * d
 * What not: no dampening, no maximize; the schedule owns lr (args->lr), the core owns
 * every buffer, and which parameters decay is the core's call (segment.weight_decay).
 * Invariants: state_per_param is 1 (the momentum buffer) when momentum > 0, else 0; step
 * allocates nothing; the only exported symbol is loom_plugin_entry.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/plugin/optim.h"
#include "../optim_common.h"

enum { K_LR, K_MOMENTUM, K_NESTEROV, K_WEIGHT_DECAY, K_DECAY, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_LR] = {"lr", LOOM_CFG_NUMBER, NULL, "learning rate (> 0); a schedule scales it per step"},
    [K_MOMENTUM] = {"momentum", LOOM_CFG_NUMBER, "0", "momentum factor in [0, 1); 0 keeps no state"},
    [K_NESTEROV] = {"nesterov", LOOM_CFG_BOOLEAN, "false",
                    "use Nesterov momentum (needs momentum > 0)"},
    [K_WEIGHT_DECAY] = {"weight_decay", LOOM_CFG_NUMBER, "0",
                        "L2 penalty added to the gradient (>= 0)"},
    [K_DECAY] = {"decay", LOOM_CFG_STRING, "\"matrices\"",
                 "which parameters decay: \"matrices\" (not biases or norms) or \"all\""},
};

typedef struct sgd {
    const loom_host *host;
    float momentum;
    int nesterov;
    float weight_decay;
    int decay_all;
} sgd;

static loom_status sgd_create(const loom_host *host, const loom_config *cfg, void **self)
{
    if (host == NULL || self == NULL)
        return LOOM_ERR_INVALID; /* no host, no way to say more */
    loom_status st = optim_check_config(host, "sgd", cfg, keys, N_KEYS);
    if (st != LOOM_OK)
        return st;
    const loom_config_value *v = cfg->values;
    double lr = v[K_LR].number, mu = v[K_MOMENTUM].number, wd = v[K_WEIGHT_DECAY].number;
    const char *decay = v[K_DECAY].string;
    int decay_all = 0;
    st = optim_check_common(host, "sgd", lr, wd, decay, &decay_all);
    if (st != LOOM_OK)
        return st;
    if (!(mu >= 0 && mu < 1))
        return host->fail(LOOM_ERR_INVALID, "sgd: momentum must be in [0, 1), got %g", mu);
    if (v[K_NESTEROV].number != 0 && mu == 0)
        return host->fail(LOOM_ERR_INVALID,
                          "sgd: nesterov = true needs momentum > 0, got momentum = 0");
    sgd *s = host->alloc(sizeof *s);
    if (s == NULL)
        return host->fail(LOOM_ERR_NOMEM, "sgd: out of memory");
    s->host = host;
    s->momentum = (float)mu;
    s->nesterov = v[K_NESTEROV].number != 0;
    s->weight_decay = (float)wd;
    s->decay_all = decay_all;
    *self = s;
    return LOOM_OK;
}

static void sgd_destroy(void *self)
{
    if (self != NULL)
        ((sgd *)self)->host->free(self);
}

static uint32_t sgd_state_per_param(void *self) { return ((sgd *)self)->momentum > 0 ? 1 : 0; }

static void sgd_decay_rule(void *self, float *weight_decay, int *decay_all)
{
    const sgd *s = self;
    *weight_decay = s->weight_decay;
    *decay_all = s->decay_all;
}

/* One segment. restrict lets the compiler vectorise each branch's loop. */
static void sgd_segment(const sgd *s, const loom_optim_segment *seg, float lr, float gs)
{
    float *restrict p = seg->param;
    const float *restrict grad = seg->grad;
    const float wd = seg->weight_decay, mu = s->momentum;
    const size_t n = seg->n;
    if (mu == 0) {
        for (size_t i = 0; i < n; i++)
            p[i] -= lr * (gs * grad[i] + wd * p[i]);
        return;
    }
    float *restrict b = seg->state;
    if (s->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float g = gs * grad[i] + wd * p[i];
            b[i] = mu * b[i] + g;
            p[i] -= lr * (g + mu * b[i]);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float g = gs * grad[i] + wd * p[i];
            b[i] = mu * b[i] + g;
            p[i] -= lr * b[i];
        }
    }
}

static loom_status sgd_check(const sgd *s, const loom_optim_step_args *args)
{
    if (args == NULL || (args->n_segments > 0 && args->segments == NULL))
        return s->host->fail(LOOM_ERR_INVALID, "sgd: step needs segments");
    for (size_t k = 0; k < args->n_segments; k++) {
        const loom_optim_segment *seg = &args->segments[k];
        if (seg->n > 0 && (seg->param == NULL || seg->grad == NULL ||
                           (s->momentum > 0 && seg->state == NULL)))
            return s->host->fail(LOOM_ERR_INVALID,
                                 "sgd: segment %zu has a NULL param, grad or state buffer", k);
    }
    return LOOM_OK;
}

static loom_status sgd_step(void *self, const loom_optim_step_args *args)
{
    const sgd *s = self;
    loom_status st = sgd_check(s, args);
    if (st != LOOM_OK)
        return st;
    for (size_t k = 0; k < args->n_segments; k++)
        sgd_segment(s, &args->segments[k], args->lr, args->grad_scale);
    return LOOM_OK;
}

/* Device memory: sgd_segment's loops as the backend's sgd_update (kernels/cuda/optim.cu). */
static loom_status sgd_step_backend(void *self, const loom_optim_step_args *args,
                                    const loom_backend_ops *be, void *be_self)
{
    (void)be_self;
    const sgd *s = self;
    if (be == NULL || be->size <= offsetof(loom_backend_ops, sgd_update) || be->sgd_update == NULL)
        return s->host->fail(LOOM_ERR_UNSUPPORTED, "sgd: this backend has no sgd_update op, so "
                             "the update cannot run in its memory; use a backend that has it "
                             "(cuda) or host memory (cpu)");
    loom_status st = sgd_check(s, args);
    if (st != LOOM_OK)
        return st;
    for (size_t k = 0; k < args->n_segments; k++) {
        const loom_optim_segment *seg = &args->segments[k];
        loom_sgd_consts c = {args->lr, args->grad_scale, seg->weight_decay, s->momentum,
                             s->nesterov};
        if (seg->n > 0)
            be->sgd_update(seg->param, seg->grad, s->momentum > 0 ? seg->state : NULL, seg->n, &c);
    }
    return LOOM_OK;
}

static const loom_optim_ops ops = {
    .size = sizeof(loom_optim_ops),
    .create = sgd_create,
    .destroy = sgd_destroy,
    .state_per_param = sgd_state_per_param,
    .decay_rule = sgd_decay_rule,
    .step = sgd_step,
    .step_backend = sgd_step_backend,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_OPTIM,
    .name = "sgd",
    .version = "0.1.0",
    .summary = "SGD with optional momentum and Nesterov momentum (PyTorch semantics)",
    .config_keys = keys,
    .n_config_keys = N_KEYS,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
