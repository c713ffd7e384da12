/* moe.c — the mixture-of-experts MLP (moe.h): the parameter entries, the per-block
 * buffers, and forward and backward over the backend's kernels, the routing decisions
 * from moe_route.c. */
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "moe_route.h"

typedef struct moe_block {
    moe_route rt;
    float *logits_h;            /* host (R,E) */
    float *logits;              /* device (R,E) router logits */
    int *tok;                   /* device (A) token row of each assignment */
    float *gate;                /* device (A) */
    float *xin, *h, *hg, *y;    /* device (A,C) (A,F) (A,F) (A,C): expert inputs, fc out,
                                 * GELU out, proj out, expert-major */
} moe_block;

struct gpt_moe {
    loom_moe_config cfg;
    int n;                      /* MoE blocks */
    int *index;                 /* [layers]: the block's index in blk, -1 for dense */
    moe_block *blk;
    int max_R, A;               /* rows, assignments (k x rows) the buffers hold */
    uint64_t seed, key;
    float dloss;                /* of the forward in progress */
    /* backward scratch shared by every block */
    float *dlogits, *dgate, *dy, *dhg, *dh, *dxin, *dxr;  /* device */
    float *dlogits_h, *dgate_h;                            /* host */
    size_t bytes;
    /* statistics since the last reset */
    double *load, assigned, dropped, aux, z;
    int forwards, load_stale;   /* load_stale: zero load at the next counted forward */
};

int gpt_moe_block(const loom_gpt_config *c, int l)
{
    return c->moe.experts > 0 && (l + 1) % c->moe.every == 0;
}

loom_status gpt_moe_check(const loom_gpt_config *c)
{
    const loom_moe_config *e = &c->moe;
    if (e->experts == 0 && e->top_k == 0 && e->every == 0)
        return LOOM_OK; /* dense */
    if (e->experts < 1 || e->experts > 1024)
        LOOM_FAIL(LOOM_ERR_INVALID, "moe experts=%d: 1 to 1024 experts", e->experts);
    if (e->top_k < 1 || e->top_k > e->experts || e->top_k > 64)
        LOOM_FAIL(LOOM_ERR_INVALID, "moe top_k=%d must be 1 to experts=%d (and at most 64)",
                  e->top_k, e->experts);
    if (e->every < 1 || e->every > c->layers)
        LOOM_FAIL(LOOM_ERR_INVALID, "moe every=%d must be 1 to layers=%d (every n-th block, "
                  "blocks l with (l + 1) %% every == 0, is an MoE block)", e->every, c->layers);
    if (!(e->capacity_factor >= 0.0) || e->capacity_factor > 1e6)
        LOOM_FAIL(LOOM_ERR_INVALID, "moe capacity_factor=%g must be >= 0 (0: dropless)",
                  e->capacity_factor);
    if (!(e->aux_loss >= 0.0) || !(e->z_loss >= 0.0) || !(e->noise_std >= 0.0))
        LOOM_FAIL(LOOM_ERR_INVALID, "moe aux_loss=%g, z_loss=%g and noise_std=%g must be >= 0",
                  e->aux_loss, e->z_loss, e->noise_std);
    return LOOM_OK;
}

loom_status gpt_moe_add_entries(loom_param_table *t, const loom_gpt_config *c, int l, float std,
                                float proj_std)
{
    int64_t C = c->dim, sh[2];
    char name[LOOM_PARAM_NAME_MAX];
#define ENTRY(nd, a, b, init, sd, ...)                                              \
    do {                                                                            \
        snprintf(name, sizeof name, __VA_ARGS__);                                   \
        sh[0] = (a), sh[1] = (b);                                                   \
        LOOM_TRY(loom_params_add(t, name, nd, sh, l, init, sd));                    \
    } while (0)
    ENTRY(2, c->moe.experts, C, LOOM_INIT_NORMAL, std, "h.%d.moe.router.weight", l);
    for (int e = 0; e < c->moe.experts; e++) {
        ENTRY(2, 4 * C, C, LOOM_INIT_NORMAL, std, "h.%d.moe.expert.%d.fc.weight", l, e);
        ENTRY(1, 4 * C, 0, LOOM_INIT_ZEROS, 0.0f, "h.%d.moe.expert.%d.fc.bias", l, e);
        ENTRY(2, C, 4 * C, LOOM_INIT_NORMAL, proj_std, "h.%d.moe.expert.%d.proj.weight", l, e);
        ENTRY(1, C, 0, LOOM_INIT_ZEROS, 0.0f, "h.%d.moe.expert.%d.proj.bias", l, e);
    }
#undef ENTRY
    return LOOM_OK;
}

/* Block l's parameter (or gradient, base = m->grads) at table index i. */
static float *at(loom_gpt *m, float *base, int i) { return base + m->table.entries[i].offset; }

loom_status gpt_moe_create(loom_gpt *m, uint64_t seed)
{
    const loom_gpt_config *c = &m->cfg;
    if (!c->moe.experts)
        return LOOM_OK;
    if (m->tp > 1)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "moe with tensor parallelism (tp=%d) does not compose "
                  "yet: experts are not split by tp; use tp=1 (mesh.dp / mesh.ep)", m->tp);
    if (m->staged)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "moe with pipeline parallelism does not compose yet; "
                  "use pp=1");
    for (int l = 0; l < c->layers; l++)
        if (m->rc[l] != RC_KEEP)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "moe with activation recomputation does not "
                      "compose yet; use recompute = \"none\"");
    const loom_backend_ops *k = m->be->ops;
    if (k->size <= offsetof(loom_backend_ops, rows_dot) || !k->rows_gather ||
        !k->rows_scatter_add || !k->rows_dot)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "moe needs a backend with rows_gather, rows_scatter_add "
                  "and rows_dot (the cpu backend has them)");
    gpt_moe *g = calloc(1, sizeof *g);
    if (!g)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    m->moe = g;
    g->cfg = c->moe;
    if (g->cfg.noise_std == 0.0)
        g->cfg.noise_std = 1.0;
    g->seed = seed;
    int E = c->moe.experts, K = c->moe.top_k;
    size_t C = (size_t)c->dim, F = 4 * C, R = (size_t)m->max_B * (size_t)c->ctx, A = R * K;
    g->max_R = (int)R;
    g->A = (int)A;
    g->index = malloc((size_t)c->layers * sizeof(int));
    if (!g->index)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->layers; l++)
        g->index[l] = gpt_moe_block(c, l) ? g->n++ : -1;
    g->blk = calloc((size_t)g->n, sizeof *g->blk);
    g->load = calloc((size_t)g->n * E, sizeof(double));
    g->dlogits_h = malloc(R * E * sizeof(float));
    g->dgate_h = malloc(A * sizeof(float));
    if (!g->blk || !g->load || !g->dlogits_h || !g->dgate_h)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    int ok = 1;
#define DEV(n) (g->bytes += (n) * sizeof(float), k->alloc(m->be->self, (n) * sizeof(float)))
    for (int b = 0; b < g->n; b++) {
        moe_block *x = &g->blk[b];
        ok &= moe_route_alloc(&x->rt, (int)R, E, K) == 0;
        x->logits_h = malloc(R * E * sizeof(float));
        x->logits = DEV(R * E);
        x->tok = (int *)DEV(A);
        x->gate = DEV(A);
        x->xin = DEV(A * C);
        x->h = DEV(A * F);
        x->hg = DEV(A * F);
        x->y = DEV(A * C);
        ok &= x->logits_h && x->logits && x->tok && x->gate && x->xin && x->h && x->hg && x->y;
    }
    g->dlogits = DEV(R * E);
    g->dgate = DEV(A);
    g->dy = DEV(A * C);
    g->dhg = DEV(A * F);
    g->dh = DEV(A * F);
    g->dxin = DEV(A * C);
    g->dxr = DEV(R * C);
#undef DEV
    ok &= g->dlogits && g->dgate && g->dy && g->dhg && g->dh && g->dxin && g->dxr;
    if (!ok)
        LOOM_FAIL(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB for the mixture-of-experts buffers",
                  (double)g->bytes / (1 << 20));
    return LOOM_OK;
}

void gpt_moe_destroy(loom_gpt *m)
{
    gpt_moe *g = m->moe;
    if (!g)
        return;
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    for (int b = 0; g->blk && b < g->n; b++) {
        moe_block *x = &g->blk[b];
        moe_route_free(&x->rt);
        free(x->logits_h);
        float *dev[] = {x->logits, (float *)x->tok, x->gate, x->xin, x->h, x->hg, x->y};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            k->free(bs, dev[i]);
    }
    float *dev[] = {g->dlogits, g->dgate, g->dy, g->dhg, g->dh, g->dxin, g->dxr};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        k->free(bs, dev[i]);
    free(g->blk);
    free(g->index);
    free(g->load);
    free(g->dlogits_h);
    free(g->dgate_h);
    free(g);
    m->moe = NULL;
}

size_t gpt_moe_bytes(const loom_gpt *m) { return m->moe ? m->moe->bytes : 0; }

void gpt_moe_begin(loom_gpt *m, float dloss)
{
    if (m->moe)
        m->moe->dloss = dloss;
}

void loom_gpt_set_moe_key(loom_gpt *m, uint64_t key)
{
    if (m->moe)
        m->moe->key = key;
}

void loom_gpt_moe_stats(loom_gpt *m, loom_moe_stats *out, int reset)
{
    memset(out, 0, sizeof *out);
    gpt_moe *g = m->moe;
    if (!g)
        return;
    out->layers = g->n;
    out->experts = g->cfg.experts;
    out->load = g->load;
    out->assigned = g->assigned;
    out->dropped = g->dropped;
    out->forwards = g->forwards;
    out->aux = g->forwards ? g->aux / g->forwards : 0.0;
    out->z = g->forwards ? g->z / g->forwards : 0.0;
    if (reset) { /* the next period starts; load stays readable until its first forward */
        g->assigned = g->dropped = g->aux = g->z = 0.0;
        g->forwards = 0;
        g->load_stale = 1;
    }
}

/* Expert e's four entries after the router at e0. */
#define FCW(base) at(m, base, e0 + 1 + 4 * e)
#define FCB(base) at(m, base, e0 + 2 + 4 * e)
#define PJW(base) at(m, base, e0 + 3 + 4 * e)
#define PJB(base) at(m, base, e0 + 4 + 4 * e)

loom_status gpt_moe_forward(loom_gpt *m, int l, int e0, const float *x, float *out, size_t R)
{
    gpt_moe *g = m->moe;
    moe_block *b = &g->blk[g->index[l]];
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int E = g->cfg.experts, K = g->cfg.top_k, C = m->cfg.dim, F = 4 * C;
    k->matmul_forward(b->logits, x, at(m, m->params, e0), NULL, 1, (int)R, C, E);
    k->copy_to_host(bs, b->logits_h, b->logits, R * E * sizeof(float));
    if (g->cfg.noisy && g->dloss != 0.0f) { /* training forwards only (Shazeer et al. 2017) */
        char sname[48];
        snprintf(sname, sizeof sname, "moe.noise.%d", l);
        uint64_t stream = loom_rng_stream(sname), row0 = g->key * (uint64_t)R;
        for (size_t t = 0; t < R; t++)
            for (int e = 0; e < E; e++)
                b->logits_h[t * E + e] += (float)(g->cfg.noise_std *
                    loom_rng_normal(g->seed, stream, (row0 + t) * (uint64_t)E + (uint64_t)e));
    }
    moe_route *rt = &b->rt;
    moe_route_compute(rt, b->logits_h, (int)R, moe_capacity(K, (int)R, E, g->cfg.capacity_factor));
    size_t A = (size_t)rt->kept;
    k->copy_to_device(bs, b->tok, rt->tok, A * sizeof(int));
    k->copy_to_device(bs, b->gate, rt->agate, A * sizeof(float));
    k->rows_gather(b->xin, x, b->tok, NULL, A, C);
    for (int e = 0; e < E; e++) { /* one GEMM per expert over the rows it received */
        size_t o = (size_t)rt->offset[e], n = (size_t)rt->count[e];
        if (!n)
            continue;
        k->matmul_forward(b->h + o * F, b->xin + o * C, FCW(m->params), FCB(m->params), 1,
                          (int)n, C, F);
    }
    k->gelu_forward(b->hg, b->h, A * F);
    for (int e = 0; e < E; e++) {
        size_t o = (size_t)rt->offset[e], n = (size_t)rt->count[e];
        if (n)
            k->matmul_forward(b->y + o * C, b->hg + o * F, PJW(m->params), PJB(m->params), 1,
                              (int)n, F, C);
    }
    k->zero(bs, out, R * C * sizeof(float));
    k->rows_scatter_add(out, b->y, b->tok, b->gate, A, C);
    if (g->dloss != 0.0f) {
        if (g->load_stale)
            memset(g->load, 0, (size_t)g->n * E * sizeof(double));
        g->load_stale = 0;
        double *load = g->load + (size_t)g->index[l] * E;
        for (int e = 0; e < E; e++)
            load[e] += rt->count[e];
        g->assigned += (double)R * K;
        g->dropped += rt->dropped;
        g->aux += g->cfg.aux_loss * E * rt->fp;
        g->z += g->cfg.z_loss * rt->z;
        if (g->index[l] == g->n - 1)
            g->forwards++;
    }
    return LOOM_OK;
}

loom_status gpt_moe_backward(loom_gpt *m, int l, int e0, const float *dout, float *dx, size_t R)
{
    gpt_moe *g = m->moe;
    moe_block *b = &g->blk[g->index[l]];
    moe_route *rt = &b->rt;
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int E = g->cfg.experts, C = m->cfg.dim, F = 4 * C;
    size_t A = (size_t)rt->kept;
    if ((size_t)rt->R != R)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "moe backward over %zu rows after a forward over %d", R,
                  rt->R);
    /* out = sum_a gate_a y_a at row tok_a: d(y_a) = gate_a dout[tok_a], d(gate_a) =
     * dout[tok_a] . y_a */
    k->rows_gather(g->dy, dout, b->tok, b->gate, A, C);
    k->rows_dot(g->dgate, dout, b->tok, b->y, A, C);
    for (int e = 0; e < E; e++) {
        size_t o = (size_t)rt->offset[e], n = (size_t)rt->count[e];
        if (n)
            k->matmul_backward(g->dhg + o * F, PJW(m->grads), PJB(m->grads), g->dy + o * C,
                               b->hg + o * F, PJW(m->params), 1, (int)n, F, C);
    }
    k->gelu_backward(g->dh, b->h, g->dhg, A * F);
    for (int e = 0; e < E; e++) {
        size_t o = (size_t)rt->offset[e], n = (size_t)rt->count[e];
        if (n)
            k->matmul_backward(g->dxin + o * C, FCW(m->grads), FCB(m->grads), g->dh + o * F,
                               b->xin + o * C, FCW(m->params), 1, (int)n, C, F);
    }
    k->zero(bs, dx, R * C * sizeof(float));
    k->rows_scatter_add(dx, g->dxin, b->tok, NULL, A, C);
    /* the router: the gates' gradient, and the aux and z losses', each weighted by the
     * forward's dloss * R (the micro-batch's share of the step's token mean) */
    k->copy_to_host(bs, g->dgate_h, g->dgate, A * sizeof(float));
    double w = (double)g->dloss * (double)R;
    moe_route_backward(rt, g->dgate_h, w * g->cfg.aux_loss, w * g->cfg.z_loss, g->dlogits_h);
    k->copy_to_device(bs, g->dlogits, g->dlogits_h, R * E * sizeof(float));
    const float *x = m->acts[l].ln2_full;
    k->matmul_backward(g->dxr, at(m, m->grads, e0), NULL, g->dlogits, x, at(m, m->params, e0), 1,
                       (int)R, C, E);
    k->accumulate(dx, g->dxr, R * C);
    return LOOM_OK;
}
