/* compress_momentum.c — 1-bit Adam's momentum exchange (Tang et al. 2021, "1-bit Adam:
 * Communication Efficient Large-Scale Training with Adam's Convergence Speed"), over the
 * onebit or topk codes of compress.c. docs/COMPRESS.md.
 *
 * After the warm-up (full AdamW, uncompressed) AdamW's variance is frozen (adamw's
 * freeze_variance, which the session sets to the warm-up) and what is compressed is the
 * momentum, not the gradient. With g = sum over ranks r of g_r (the buffer holds each rank's
 * share of the global gradient), the next momentum is
 *     m' = b1 m + (1 - b1) g = sum_r u_r,   u_r = b1 m / dp + (1 - b1) g_r,
 * so rank r compresses u_r (+ its residual, error feedback as for any code), and the
 * exchange's sum is m^ ~ m'. The gradient handed to AdamW is the one whose update makes
 * m^:  g^ = (m^ - b1 m) / (1 - b1), so AdamW's own m becomes m^ (to rounding), the
 * same bits on every rank; m is read from AdamW's state, so the checkpoint already holds
 * it and a resume continues bitwise. The step's grad_norm is the norm of g^.
 * What not: ZeRO (each rank holds only its partition of m), offload, pp, precisions other
 * than fp32 (a loss scale in g_r), gradient clipping (no global gradient is formed): the
 * session refuses them.
 */
#include "compress_internal.h"

#include <stdlib.h>

#include <string.h>

#include "base/backend.h"
#include "base/config.h"
#include "base/status.h"
#include "loom/plugin/optim.h"

loom_status loom_compress_set_momentum(loom_compress *c, const loom_optim_segment *seg,
                                       int n_seg, const float *grad_base, loom_backend *be)
{
    if (!(c->cfg.momentum > 0) || c->cfg.method == LOOM_COMPRESS_POWERSGD)
        LOOM_FAIL(LOOM_ERR_INVALID, "compress: momentum exchange needs momentum > 0 and onebit "
                  "or topk");
    free(c->bucket_m);
    if (!(c->bucket_m = calloc(c->nb ? (size_t)c->nb : 1, sizeof *c->bucket_m)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    c->m_be = be && loom_backend_device_memory(be) ? be : NULL;
    if (c->m_be) { /* the state is the device's: its m read through a host copy */
        free(c->m_host);
        free(c->m_segs);
        c->m_host = calloc(c->total ? c->total : 1, sizeof(float));
        c->m_segs = calloc(n_seg ? (size_t)n_seg : 1, sizeof *c->m_segs);
        if (!c->m_host || !c->m_segs)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for 1-bit Adam's host copy of the momentum");
        c->n_m_segs = 0;
        for (int k = 0; k < n_seg; k++)
            if (seg[k].state)
                c->m_segs[c->n_m_segs++] = (struct m_seg){seg[k].state,
                                                          (size_t)(seg[k].grad - grad_base), seg[k].n};
    }
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        for (int k = 0; k < n_seg && !c->bucket_m[i]; k++) {
            size_t lo = (size_t)(seg[k].grad - grad_base);
            if (seg[k].state && b->lo >= lo && b->lo + bucket_extent(b) <= lo + seg[k].n)
                c->bucket_m[i] = c->m_be ? c->m_host + b->lo /* slot 0: m */
                                         : seg[k].state + (b->lo - lo);
        }
        if (!c->bucket_m[i])
            LOOM_FAIL(LOOM_ERR_INTERNAL, "compress: bucket %d [%zu, +%zu) lies in no optimizer "
                      "segment with state", i, b->lo, b->n);
    }
    return LOOM_OK;
}

void loom_compress_momentum_pull(loom_compress *c)
{
    for (int k = 0; c->m_be && k < c->n_m_segs; k++)
        c->m_be->ops->copy_to_host(c->m_be->self, c->m_host + c->m_segs[k].lo, c->m_segs[k].state,
                                   c->m_segs[k].n * sizeof(float));
}

int loom_compress_momentum_on(const loom_compress *c) { return c && c->bucket_m; }

void momentum_before(loom_compress *c, int i, float *g)
{
    if (!c->bucket_m)
        return;
    const float *m = c->bucket_m[i];
    const bucket *b = &c->b[i];
    /* the momentum's share of each message: one of dp in fast mode, one of the step's global
     * micro-batches in canonical mode (each a leaf; their count does not depend on dp) */
    int shares = c->dp_size * (c->cfg.leaves > 0 ? c->cfg.leaves : 1);
    const float share = (float)(c->cfg.momentum / shares), w = (float)(1.0 - c->cfg.momentum);
    for (size_t j = 0; j < b->n; j++) {
        size_t x = bucket_at(b, j);
        g[x] = share * m[x] + w * g[x];
    }
}

void momentum_after(loom_compress *c, int i, float *g)
{
    if (!c->bucket_m)
        return;
    const float *m = c->bucket_m[i];
    const bucket *b = &c->b[i];
    const float b1 = (float)c->cfg.momentum, w = (float)(1.0 - c->cfg.momentum);
    for (size_t j = 0; j < b->n; j++) {
        size_t x = bucket_at(b, j);
        g[x] = (g[x] - b1 * m[x]) / w;
    }
}

loom_status loom_compress_momentum_prepare(loom_plugin_config *optim, const char *precision,
                                           int zero, int offload, int pp, float grad_clip,
                                           int64_t warmup)
{
    const char *name = optim->desc->name;
    if (strcmp(name, "adamw") != 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "strategy.compress momentum = true is 1-bit Adam: it needs "
                  "optimizer adamw (its first moment is what is exchanged), not '%s'", name);
    const char *what = zero ? "strategy.zero (each rank holds only its partition of the momentum)"
                     : offload ? "strategy.offload (the momentum is not in host memory)"
                     : pp > 1 ? "pp > 1 (the tied embedding's gradient is summed after the exchange)"
                     : strcmp(precision, "fp32") != 0 ? "a precision other than fp32 (a loss scale "
                                                        "in the gradient)" : NULL;
    if (grad_clip > 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "strategy.compress momentum = true (1-bit Adam) with grad_clip=%g: "
                  "the exchange forms the momentum, not the global gradient whose norm clipping "
                  "needs (the gradient AdamW is given is implied by the momentum, and clipping it "
                  "would shrink the momentum's steps); set grad_clip = 0", grad_clip);
    if (what)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy.compress momentum = true (1-bit Adam) with %s "
                  "is not built yet; leave one of them out", what);
    const loom_config_value *fz = loom_config_get(optim, "freeze_variance");
    const loom_config_value *betas = loom_config_get(optim, "betas");
    if (!fz || !betas)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "adamw has no freeze_variance or betas key");
    if (fz->number != 0 && fz->number != (double)warmup)
        LOOM_FAIL(LOOM_ERR_INVALID, "optimizer freeze_variance=%g and strategy.compress warmup=%lld "
                  "differ: 1-bit Adam freezes the variance when compression starts; leave "
                  "freeze_variance out (it follows warmup)", fz->number, (long long)warmup);
    return loom_config_set_number(optim, "freeze_variance", (double)warmup);
}
