/* gpt.c — GPT-2 forward and backward over the backend's kernels.
 *
 * Activation buffers are sized once for (max_B, ctx) and reused; a forward with smaller
 * B or T uses a prefix of each. Backward keeps one residual-gradient buffer and walks the
 * blocks top-down; every input gradient is produced fresh (kernels overwrite) and the
 * residual branches join it with `accumulate`.
 */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

typedef struct layer_params {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} layer_params;

typedef struct model_params {
    float *wte, *wpe, *lnfw, *lnfb;
    layer_params *layer; /* [L] */
} model_params;

/* Saved per layer for backward. Sizes for (B,T) = (max_B, ctx). */
typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C) (B,T) (B,T) */
    float *qkv;                       /* (B,T,3C) */
    float *atty;                      /* (B,T,C) attention output before projection */
    float *att;                       /* (B,NH,T,T) */
    float *res2;                      /* (B,T,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* (B,T,4C) */
    float *res3;                      /* (B,T,C) block output */
} layer_acts;

struct loom_gpt {
    loom_gpt_config cfg;
    loom_backend *be;
    loom_param_table table;
    float *params, *grads;
    model_params p, g;
    int max_B;
    /* activations */
    void *act_mem;
    layer_acts *acts;
    float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *scratch_c;
    int *tokens, *targets;
    /* backward scratch */
    float *dres, *dtmp, *dbuf_c, *dbuf_4a, *dbuf_4b, *datt_scratch;
    float *host_losses;
    int last_B, last_T, have_dlogits;
    loom_grad_ready_fn grad_ready;
    void *grad_ready_ctx;
};

void loom_gpt_set_grad_hook(loom_gpt *m, loom_grad_ready_fn fn, void *ctx)
{
    m->grad_ready = fn;
    m->grad_ready_ctx = ctx;
}

/* Report entries [first, last] (table indices) as final. They are contiguous in the
 * flat buffer because build_table adds them in that order. */
static loom_status entries_ready(loom_gpt *m, int first, int last)
{
    if (!m->grad_ready)
        return LOOM_OK;
    const loom_param_entry *a = &m->table.entries[first], *b = &m->table.entries[last];
    return m->grad_ready(m->grad_ready_ctx, a->offset, b->offset + b->numel - a->offset);
}

loom_status loom_gpt_config_check(const loom_gpt_config *c)
{
    if (c->vocab < 2)
        LOOM_FAIL(LOOM_ERR_INVALID, "model vocab=%d must be at least 2", c->vocab);
    if (c->vocab_padded && c->vocab_padded < c->vocab)
        LOOM_FAIL(LOOM_ERR_INVALID, "model vocab_padded=%d is smaller than vocab=%d",
                  c->vocab_padded, c->vocab);
    if (c->ctx < 1 || c->layers < 1 || c->heads < 1 || c->dim < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "model ctx, layers, heads and dim must be positive "
                  "(got ctx=%d layers=%d heads=%d dim=%d)", c->ctx, c->layers, c->heads, c->dim);
    if (c->dim % c->heads != 0) {
        char ok[256] = "";
        size_t used = 0;
        for (int h = 1; h <= c->dim && used < sizeof ok; h++)
            if (c->dim % h == 0 && h <= 64)
                used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", used ? ", " : "", h);
        LOOM_FAIL(LOOM_ERR_INVALID, "model heads=%d does not divide dim=%d (heads may be %s)",
                  c->heads, c->dim, ok);
    }
    return LOOM_OK;
}

static loom_status build_table(loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    int64_t C = c->dim, L = c->layers;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L); /* GPT-2's residual scaling */
    loom_param_table *t = &m->table;
    int64_t s2[2];
    char name[LOOM_PARAM_NAME_MAX];
#define ADD(nm, nd, layer, init, sd) LOOM_TRY(loom_params_add(t, nm, nd, s2, layer, init, sd))
#define SHAPE(a, b) (s2[0] = (a), s2[1] = (b))
    SHAPE(c->vocab_padded, C); ADD("wte", 2, -1, LOOM_INIT_NORMAL, std);
    t->entries[t->count - 1].init_rows = c->vocab; /* padding rows start at zero */
    SHAPE(c->ctx, C); ADD("wpe", 2, -1, LOOM_INIT_NORMAL, 0.01f);
    for (int l = 0; l < L; l++) {
#define LAYER(suffix, nd, a, b, init, sd)                           \
    snprintf(name, sizeof name, "h.%d.%s", l, suffix);              \
    SHAPE(a, b);                                                    \
    ADD(name, nd, l, init, sd)
        LAYER("ln_1.weight", 1, C, 0, LOOM_INIT_ONES, 0);
        LAYER("ln_1.bias", 1, C, 0, LOOM_INIT_ZEROS, 0);
        LAYER("attn.qkv.weight", 2, 3 * C, C, LOOM_INIT_NORMAL, std);
        LAYER("attn.qkv.bias", 1, 3 * C, 0, LOOM_INIT_ZEROS, 0);
        LAYER("attn.proj.weight", 2, C, C, LOOM_INIT_NORMAL, proj_std);
        LAYER("attn.proj.bias", 1, C, 0, LOOM_INIT_ZEROS, 0);
        LAYER("ln_2.weight", 1, C, 0, LOOM_INIT_ONES, 0);
        LAYER("ln_2.bias", 1, C, 0, LOOM_INIT_ZEROS, 0);
        LAYER("mlp.fc.weight", 2, 4 * C, C, LOOM_INIT_NORMAL, std);
        LAYER("mlp.fc.bias", 1, 4 * C, 0, LOOM_INIT_ZEROS, 0);
        LAYER("mlp.proj.weight", 2, C, 4 * C, LOOM_INIT_NORMAL, proj_std);
        LAYER("mlp.proj.bias", 1, C, 0, LOOM_INIT_ZEROS, 0);
#undef LAYER
    }
    SHAPE(C, 0); ADD("ln_f.weight", 1, -1, LOOM_INIT_ONES, 0);
    ADD("ln_f.bias", 1, -1, LOOM_INIT_ZEROS, 0);
#undef ADD
#undef SHAPE
    return LOOM_OK;
}

/* Point p at the entries of base, in table order (the order build_table added them). */
static void bind_params(loom_gpt *m, float *base, model_params *p)
{
    const loom_param_entry *e = m->table.entries;
    p->wte = base + e[0].offset;
    p->wpe = base + e[1].offset;
    int i = 2;
    for (int l = 0; l < m->cfg.layers; l++) {
        /* layer_params is 12 float pointers, declared in table order */
        float **f = (float **)&p->layer[l];
        for (int k = 0; k < 12; k++)
            f[k] = base + e[i++].offset;
    }
    p->lnfw = base + e[i++].offset;
    p->lnfb = base + e[i].offset;
}

static loom_status alloc_activations(loom_gpt *m)
{
    size_t B = (size_t)m->max_B, T = (size_t)m->cfg.ctx, C = (size_t)m->cfg.dim;
    size_t NH = (size_t)m->cfg.heads, Vp = (size_t)m->cfg.vocab_padded, L = (size_t)m->cfg.layers;
    size_t BT = B * T;
    size_t per_layer = BT * C * 6 + BT * 4 + BT * 3 * C + B * NH * T * T + BT * 4 * C * 2;
    size_t total = L * per_layer + BT * C * 3 + BT * 2 + BT * Vp + BT /* losses */
                   + BT * C * 3 + BT * 4 * C * 2 + 2 * B * NH * T * T;
    size_t ints = 2 * BT;
    m->act_mem = m->be->ops->alloc(m->be->self, total * sizeof(float) + ints * sizeof(int) + 64);
    if (!m->act_mem)
        LOOM_FAIL(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB of activations for batch %zu x %zu",
                  (double)(total * 4) / (1 << 20), B, T);
    float *f = m->act_mem;
#define TAKE(n) (f += (n), f - (n))
    for (size_t l = 0; l < L; l++) {
        layer_acts *a = &m->acts[l];
        a->ln1 = TAKE(BT * C); a->ln1_mean = TAKE(BT); a->ln1_rstd = TAKE(BT);
        a->qkv = TAKE(BT * 3 * C); a->atty = TAKE(BT * C); a->att = TAKE(B * NH * T * T);
        a->res2 = TAKE(BT * C); a->ln2 = TAKE(BT * C); a->ln2_mean = TAKE(BT);
        a->ln2_rstd = TAKE(BT); a->fch = TAKE(BT * 4 * C); a->fch_gelu = TAKE(BT * 4 * C);
        a->res3 = TAKE(BT * C);
    }
    m->encoded = TAKE(BT * C); m->lnf = TAKE(BT * C); m->lnf_mean = TAKE(BT);
    m->lnf_rstd = TAKE(BT); m->logits = TAKE(BT * Vp); m->losses = TAKE(BT);
    m->scratch_c = TAKE(BT * C);
    m->dres = TAKE(BT * C); m->dtmp = TAKE(BT * C); m->dbuf_c = TAKE(BT * C);
    m->dbuf_4a = TAKE(BT * 4 * C); m->dbuf_4b = TAKE(BT * 4 * C);
    m->datt_scratch = TAKE(2 * B * NH * T * T);
#undef TAKE
    m->tokens = (int *)f;
    m->targets = m->tokens + BT;
    m->host_losses = malloc(BT * sizeof(float));
    return m->host_losses ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "out of memory");
}

loom_status loom_gpt_create(const loom_gpt_config *cfg, loom_backend *be, int max_B, uint64_t seed,
                            loom_gpt **out)
{
    *out = NULL;
    LOOM_TRY(loom_gpt_config_check(cfg));
    if (max_B < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "micro-batch size must be at least 1, got %d", max_B);
    loom_gpt *m = calloc(1, sizeof *m);
    if (!m)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    m->cfg = *cfg;
    if (!m->cfg.vocab_padded)
        m->cfg.vocab_padded = (cfg->vocab + 127) / 128 * 128;
    m->be = be;
    m->max_B = max_B;
    m->p.layer = calloc((size_t)cfg->layers, sizeof(layer_params));
    m->g.layer = calloc((size_t)cfg->layers, sizeof(layer_params));
    m->acts = calloc((size_t)cfg->layers, sizeof(layer_acts));
    loom_status st = (m->p.layer && m->g.layer && m->acts) ? build_table(m)
                                                           : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK) {
        size_t bytes = m->table.total * sizeof(float);
        m->params = be->ops->alloc(be->self, bytes);
        m->grads = be->ops->alloc(be->self, bytes);
        float *host = malloc(bytes);
        if (!m->params || !m->grads || !host) {
            st = loom_fail(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB for parameters",
                           2.0 * (double)bytes / (1 << 20));
        } else {
            loom_params_init_values(&m->table, seed, host);
            be->ops->copy_to_device(be->self, m->params, host, bytes);
            bind_params(m, m->params, &m->p);
            bind_params(m, m->grads, &m->g);
            st = alloc_activations(m);
        }
        free(host);
    }
    if (st != LOOM_OK) {
        loom_gpt_destroy(m);
        return st;
    }
    *out = m;
    return LOOM_OK;
}

void loom_gpt_destroy(loom_gpt *m)
{
    if (!m)
        return;
    const loom_backend_ops *ops = m->be->ops;
    ops->free(m->be->self, m->params);
    ops->free(m->be->self, m->grads);
    ops->free(m->be->self, m->act_mem);
    free(m->host_losses);
    free(m->p.layer);
    free(m->g.layer);
    free(m->acts);
    loom_params_free(&m->table);
    free(m);
}

const loom_gpt_config *loom_gpt_get_config(const loom_gpt *m) { return &m->cfg; }
const loom_param_table *loom_gpt_params(const loom_gpt *m) { return &m->table; }
float *loom_gpt_param_data(loom_gpt *m) { return m->params; }
float *loom_gpt_grad_data(loom_gpt *m) { return m->grads; }
const float *loom_gpt_logits(const loom_gpt *m) { return m->logits; }

size_t loom_gpt_num_params(const loom_gpt *m)
{
    return loom_params_count(&m->table) -
           (size_t)(m->cfg.vocab_padded - m->cfg.vocab) * (size_t)m->cfg.dim;
}

void loom_gpt_zero_grad(loom_gpt *m)
{
    m->be->ops->zero(m->be->self, m->grads, m->table.total * sizeof(float));
}

loom_status loom_gpt_forward(loom_gpt *m, const int *tokens, const int *targets, int B, int T,
                             float dloss, double *loss_sum)
{
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int C = m->cfg.dim, NH = m->cfg.heads, V = m->cfg.vocab, Vp = m->cfg.vocab_padded;
    if (B < 1 || B > m->max_B || T < 1 || T > m->cfg.ctx)
        LOOM_FAIL(LOOM_ERR_INVALID, "batch %dx%d outside the model's %dx%d", B, T, m->max_B,
                  m->cfg.ctx);
    if (dloss != 0.0f && !targets)
        LOOM_FAIL(LOOM_ERR_INVALID, "a training forward needs targets");
    size_t BT = (size_t)B * T;
    for (size_t i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            LOOM_FAIL(LOOM_ERR_INVALID, "token %d at position %zu is outside the vocabulary [0, %d)",
                      tokens[i], i, V);
    k->copy_to_device(bs, m->tokens, tokens, BT * sizeof(int));
    if (targets)
        k->copy_to_device(bs, m->targets, targets, BT * sizeof(int));

    k->encoder_forward(m->encoded, m->tokens, m->p.wte, m->p.wpe, B, T, C);
    const float *residual = m->encoded;
    for (int l = 0; l < m->cfg.layers; l++) {
        layer_params *w = &m->p.layer[l];
        layer_acts *a = &m->acts[l];
        k->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, residual, w->ln1w, w->ln1b, B, T, C);
        k->matmul_forward(a->qkv, a->ln1, w->qkvw, w->qkvb, B, T, C, 3 * C);
        k->attention_forward(a->atty, a->att, a->qkv, B, T, C, NH);
        k->matmul_forward(m->scratch_c, a->atty, w->attprojw, w->attprojb, B, T, C, C);
        k->residual_forward(a->res2, residual, m->scratch_c, BT * C);
        k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, B, T, C);
        k->matmul_forward(a->fch, a->ln2, w->fcw, w->fcb, B, T, C, 4 * C);
        k->gelu_forward(a->fch_gelu, a->fch, BT * 4 * C);
        k->matmul_forward(m->scratch_c, a->fch_gelu, w->fcprojw, w->fcprojb, B, T, 4 * C, C);
        k->residual_forward(a->res3, a->res2, m->scratch_c, BT * C);
        residual = a->res3;
    }
    k->layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, residual, m->p.lnfw, m->p.lnfb, B, T, C);
    k->matmul_forward(m->logits, m->lnf, m->p.wte, NULL, B, T, C, Vp);
    m->last_B = B;
    m->last_T = T;
    m->have_dlogits = 0;
    if (targets) {
        k->crossentropy_forward_backward(m->logits, m->losses, m->targets, dloss, (int)BT, V, Vp);
        m->have_dlogits = dloss != 0.0f;
        k->copy_to_host(bs, m->host_losses, m->losses, BT * sizeof(float));
        double sum = 0.0;
        for (size_t i = 0; i < BT; i++)
            sum += m->host_losses[i];
        if (loss_sum)
            *loss_sum = sum;
    }
    return LOOM_OK;
}

loom_status loom_gpt_backward(loom_gpt *m)
{
    if (!m->have_dlogits)
        LOOM_FAIL(LOOM_ERR_INVALID, "backward needs a forward with targets and dloss != 0 first");
    const loom_backend_ops *k = m->be->ops;
    int B = m->last_B, T = m->last_T, C = m->cfg.dim, NH = m->cfg.heads, Vp = m->cfg.vocab_padded;
    int L = m->cfg.layers;
    size_t BT = (size_t)B * T;
    const float *last = m->acts[L - 1].res3;

    /* LM head (tied to wte) and the final layernorm; dres starts as d(last block output). */
    k->matmul_backward(m->dbuf_c, m->g.wte, NULL, m->logits, m->lnf, m->p.wte, B, T, C, Vp);
    k->layernorm_backward(m->dres, m->g.lnfw, m->g.lnfb, m->dbuf_c, last, m->p.lnfw, m->lnf_mean,
                          m->lnf_rstd, B, T, C);
    int n_entries = m->table.count;
    LOOM_TRY(entries_ready(m, n_entries - 2, n_entries - 1));
    for (int l = L - 1; l >= 0; l--) {
        layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
        layer_acts *a = &m->acts[l];
        const float *residual = l == 0 ? m->encoded : m->acts[l - 1].res3;
        /* MLP branch: res3 = res2 + proj(gelu(fc(ln2(res2)))) */
        k->matmul_backward(m->dbuf_4a, g->fcprojw, g->fcprojb, m->dres, a->fch_gelu, w->fcprojw,
                           B, T, 4 * C, C);
        k->gelu_backward(m->dbuf_4b, a->fch, m->dbuf_4a, BT * 4 * C);
        k->matmul_backward(m->dbuf_c, g->fcw, g->fcb, m->dbuf_4b, a->ln2, w->fcw, B, T, C, 4 * C);
        k->layernorm_backward(m->dtmp, g->ln2w, g->ln2b, m->dbuf_c, a->res2, w->ln2w, a->ln2_mean,
                              a->ln2_rstd, B, T, C);
        k->accumulate(m->dres, m->dtmp, BT * C);
        /* Attention branch: res2 = residual + proj(attn(qkv(ln1(residual)))) */
        k->matmul_backward(m->dbuf_c, g->attprojw, g->attprojb, m->dres, a->atty, w->attprojw,
                           B, T, C, C);
        k->attention_backward(m->dbuf_4a, m->datt_scratch, m->dbuf_c, a->qkv, a->att, B, T, C, NH);
        k->matmul_backward(m->dbuf_c, g->qkvw, g->qkvb, m->dbuf_4a, a->ln1, w->qkvw, B, T, C,
                           3 * C);
        k->layernorm_backward(m->dtmp, g->ln1w, g->ln1b, m->dbuf_c, residual, w->ln1w,
                              a->ln1_mean, a->ln1_rstd, B, T, C);
        k->accumulate(m->dres, m->dtmp, BT * C);
        LOOM_TRY(entries_ready(m, 2 + 12 * l, 2 + 12 * l + 11));
    }
    k->encoder_backward(m->g.wte, m->g.wpe, m->dres, m->tokens, B, T, C);
    m->have_dlogits = 0;
    LOOM_TRY(entries_ready(m, 0, 1));
    return LOOM_OK;
}
