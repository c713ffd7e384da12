/* moe.c — the mixture-of-experts MLP (moe.h): the parameter entries, the per-block
 * buffers, and forward and backward over the backend's kernels, the routing decisions
 * from moe_route.c. */
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "base/rng.h"
#include "base/clock.h"
#include "base/status.h"
#include "moe_route.h"

enum { MOE_CHUNKS_MAX = 4, MOE_SPANS = 1024 };

typedef struct moe_block {
    moe_route rt;
    float *logits_h;            /* host (R,E) */
    float *logits;              /* device (R,E) router logits */
    int *tok;                   /* device (A) token row of each assignment */
    float *gate;                /* device (A) */
    float *xin, *h, *hg, *y;    /* device (A,C) (Ar,F) (Ar,F) (A,C): expert inputs, fc out,
                                 * GELU out, proj out, expert-major */
    /* Expert parallelism: what this rank got from each ep rank, in rows (what it sent to p
     * is rt.offset's run of p's experts, p*El ..): recv_rows[p] at recv_off[p] of the
     * received, source-major layout; rcnt[p*El + j]
     * rows of local expert j from rank p; perm[i]: the received row that is row i of the
     * expert-major layout xe (and inv its inverse); ecount[j], eoff[j]: expert j's rows in
     * xe. Without ep: xe is xin, the counts are the route's. */
    float *xe;                  /* device (Ar,C) */
    int *perm, *inv;            /* device (Ar) */
    int *rcnt, *ecount, *eoff, *hperm, *hinv;  /* host */
    size_t *recv_rows, *recv_off, *sc, *sd, *rc, *rd; /* sc..rd: one exchange's counts */
    int Ar;                     /* rows received (this rank's experts' work) */
    size_t run_off, cbase;      /* canonical ep: the experts' first gradient offset, and
                                 * where their run starts in each source's copy */
    float *kdy, *kdh, *kdlogits; /* split backward: what B leaves for W (the experts'
                                 * output and fc-output gradients, expert-major, and the
                                 * router logits' gradient): this slot's own */
} moe_block;

struct gpt_moe {
    loom_moe_config cfg;
    int n;                      /* MoE blocks this rank holds (a pipeline stage: its own) */
    int total;                  /* MoE blocks of the whole model */
    int *index;                 /* [layers]: the block's index in blk, -1 for dense or
                                 * another stage's */
    int *global;                /* [layers]: the block's index among the model's MoE blocks */
    int slots;                  /* activation sets (a pipeline stage's micro-batches in
                                 * flight): each has its own routing and expert buffers */
    moe_block *blk, *blk_all;   /* the bound slot's n blocks, of slots x n */
    int max_R, A;               /* rows, assignments (k x rows) the buffers hold */
    int ep, ep_rank, El;        /* expert parallelism: ranks, this one, experts here */
    int per;                    /* table entries per expert: 4 (GPT-2), 3 (llama: SwiGLU) */
    int swiglu;                 /* llama: fc is gate|up (2F wide), silu(g) u, no biases */
    int hw;                     /* fc's output width: F, or 2F for SwiGLU */
    int Amax;                   /* rows an ep rank may receive: ep x A */
    int segs;                   /* GEMMs per expert: ep in canonical mode (one per source
                                 * rank's rows, ep=1's shapes), else 1 */
    int chunks;                 /* ep: the local experts cut in this many runs, each with its
                                 * own exchange, so one runs while another computes (1: off) */
    loom_comm_request *pend[2 * MOE_CHUNKS_MAX]; /* exchanges started, not yet waited for, */
    int n_pend;                 /* oldest first (one communicator: they complete in order) */
    double *spans;              /* ep: [2 n_spans] (start, end) ms of each call into the
                                 * exchanges since loom_gpt_moe_take_spans (MOE_SPANS kept) */
    int n_spans;
    float *cgrad;               /* canonical ep: (ep, nexp) per-source expert gradients */
    size_t nexp;
    uint64_t seed, key, micro; /* micro: under pp, the forward's micro-batch, added to key */
    float dloss;                /* of the forward in progress */
    size_t wlo;                 /* 16-bit weights: the widened block's first flat offset */
    int rerun;                  /* recomputation's forward: the routing and expert
                                 * activations are the block's own, kept (gpt_moe_rerun) */
    /* backward scratch shared by every block */
    float *dlogits, *dgate, *dy, *dhg, *dh, *dxin, *dxr;  /* device */
    float *xr, *ye, *dye, *dxe;                            /* device (Amax,C): ep exchanges */
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

int gpt_moe_router(const loom_gpt *m, int l) { return m->ent0[l] + (m->llama ? 6 : 8); }

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

/* Each expert's entries after the router, by kind: GPT-2's fc and proj with biases, the
 * llama family's SwiGLU gate, up (back to back: one 2F x C product) and proj, no biases. */
static const char *const gpt_kinds[] = {"fc.weight", "fc.bias", "proj.weight", "proj.bias"};
static const char *const llama_kinds[] = {"gate.weight", "up.weight", "proj.weight"};

int loom_gpt_moe_expert_kinds(const loom_gpt *m, const char *const **names)
{
    int llama = m->cfg.family == LOOM_FAMILY_LLAMA;
    *names = llama ? llama_kinds : gpt_kinds;
    return llama ? 3 : 4;
}

loom_status gpt_moe_add_entries(loom_gpt *m, int l, float std, float proj_std)
{
    const loom_gpt_config *c = &m->cfg;
    loom_param_table *t = &m->table;
    int ep = m->ep > 1 ? m->ep : 1;
    int El = c->moe.experts / ep, e_first = ep > 1 ? m->ep_rank * El : 0;
    int64_t C = c->dim, sh[2];
    int64_t F = c->family == LOOM_FAMILY_LLAMA ? c->ffn_dim : 4 * C;
    char name[LOOM_PARAM_NAME_MAX];
#define ENTRY(nd, a, b, init, sd, split, ...)                                       \
    do {                                                                            \
        snprintf(name, sizeof name, __VA_ARGS__);                                   \
        sh[0] = (a), sh[1] = (b);                                                   \
        LOOM_TRY(loom_params_add(t, name, nd, sh, l, init, sd));                    \
        LOOM_TRY(gpt_place_last(m, split));                                         \
    } while (0)
    ENTRY(2, c->moe.experts, C, LOOM_INIT_NORMAL, std, -1, "h.%d.moe.router.weight", l);
    for (int e = e_first; c->family == LOOM_FAMILY_LLAMA && e < e_first + El; e++) {
        ENTRY(2, F, C, LOOM_INIT_NORMAL, std, 0, "h.%d.moe.expert.%d.gate.weight", l, e);
        ENTRY(2, F, C, LOOM_INIT_NORMAL, std, 0, "h.%d.moe.expert.%d.up.weight", l, e);
        ENTRY(2, C, F, LOOM_INIT_NORMAL, proj_std, 1, "h.%d.moe.expert.%d.proj.weight", l, e);
    }
    for (int e = e_first; c->family != LOOM_FAMILY_LLAMA && e < e_first + El; e++) {
        ENTRY(2, 4 * C, C, LOOM_INIT_NORMAL, std, 0, "h.%d.moe.expert.%d.fc.weight", l, e);
        ENTRY(1, 4 * C, 0, LOOM_INIT_ZEROS, 0.0f, 0, "h.%d.moe.expert.%d.fc.bias", l, e);
        ENTRY(2, C, 4 * C, LOOM_INIT_NORMAL, proj_std, 1, "h.%d.moe.expert.%d.proj.weight", l, e);
        ENTRY(1, C, 0, LOOM_INIT_ZEROS, 0.0f, -1, "h.%d.moe.expert.%d.proj.bias", l, e);
    }
#undef ENTRY
    return LOOM_OK;
}

/* Block l's parameter (or gradient, base = m->grads) at table index i. With 16-bit weights
 * a parameter is read from the block's widened copy (gpt_widen_block, at the top of the
 * MoE block's forward and backward: the values of the 16-bit copy, as the dense blocks'). */
static float *at(loom_gpt *m, float *base, int i)
{
    size_t off = m->table.entries[i].offset;
    if (base == m->params && m->c16)
        return m->wide + (off - m->moe->wlo);
    return base + off;
}

/* Before reading block l's parameters through at(): with 16-bit weights, widen them. */
static void widen_block(loom_gpt *m, int l)
{
    if (!m->c16)
        return;
    gpt_widen_block(m, l);
    m->moe->wlo = gpt_w16_block_lo(m, l);
}

/* The bytes gpt_moe_create allocates for m (device: what it counts in g->bytes; host: its
 * mallocs), from the set-up model alone: loom_gpt_footprint (loom plan) sizes the MoE
 * buffers with this, and create checks its own count against it. */
size_t gpt_moe_size(const loom_gpt *m, size_t *host)
{
    const loom_gpt_config *c = &m->cfg;
    *host = 0;
    if (!c->moe.experts)
        return 0;
    size_t E = (size_t)c->moe.experts, P = m->ep > 1 ? (size_t)m->ep : 1, El = E / P;
    /* F as create's: the widest of fc's output and its activation's per row (fc_w: 4C/tp,
     * or a llama's gate|up 2F/tp) */
    size_t C = (size_t)c->dim, F = (size_t)m->fc_w, R = (size_t)m->max_B * (size_t)m->max_T;
    size_t A = R * (size_t)c->moe.top_k, Am = A * P;
    size_t n = 0, total = 0;
    for (int l = 0; l < c->layers; l++)
        if (gpt_moe_block(c, l)) {
            total++;
            n += m->own[l] ? 1 : 0;
        }
    size_t sets = (size_t)(m->slots > 1 ? m->slots : 1) * n;
    size_t per = R * E + 2 * A + 2 * A * C + 2 * Am * F + (P > 1 ? Am * C + 2 * Am : 0) +
                 (m->split ? (P > 1 ? Am : A) * C + Am * F + R * E : 0); /* B's for W */
    size_t dev = sets * per + R * E + A + 2 * A * C + 2 * Am * F + R * C + (P > 1 ? 4 * Am * C : 0);
    if (P > 1 && m->canonical) { /* (ep, nexp) per-source expert gradients */
        size_t nexp = 0;
        for (int i = 0; i < m->table.count; i++)
            if (loom_gpt_is_expert_entry(m, i))
                nexp += m->table.entries[i].numel;
        dev += P * nexp;
    }
    size_t route = 2 * R * E * sizeof(float) + R * sizeof(float) + 6 * A * sizeof(int) +
                   (2 * E + 1) * sizeof(int) + E * sizeof(double);
    size_t ep_host = P > 1 ? (E + 2 * El + 1 + 2 * Am) * sizeof(int) + 6 * P * sizeof(size_t) : 0;
    *host = sets * (route + ep_host) + total * E * sizeof(double) + R * E * sizeof(float) +
            A * sizeof(float) + (P > 1 ? 2 * (size_t)MOE_SPANS * sizeof(double) : 0);
    return dev * sizeof(float);
}

loom_status gpt_moe_create(loom_gpt *m, uint64_t seed)
{
    const loom_gpt_config *c = &m->cfg;
    if (!c->moe.experts)
        return LOOM_OK;
    if (m->ep > 1 && (c->moe.experts % m->ep || !m->ep_ops || !m->ep_comm))
        LOOM_FAIL(LOOM_ERR_INVALID, "expert parallelism ep=%d must divide experts=%d (and needs "
                  "its group's communicator)", m->ep, c->moe.experts);
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
    g->ep = m->ep;
    g->ep_rank = m->ep_rank;
    int E = c->moe.experts, K = c->moe.top_k, P = g->ep;
    g->El = E / P;
    g->swiglu = m->llama;
    g->per = m->llama ? 3 : 4;
    g->hw = m->fc_w;
    /* F: the widest of fc's output and its activation's, per row */
    size_t C = (size_t)c->dim, F = (size_t)g->hw, R = (size_t)m->max_B * (size_t)m->max_T, A = R * K;
    size_t Am = A * (size_t)P; /* every ep rank may send all its choices here */
    g->max_R = (int)R;
    g->A = (int)A;
    g->Amax = (int)Am;
    g->index = malloc((size_t)c->layers * sizeof(int));
    g->global = malloc((size_t)c->layers * sizeof(int));
    if (!g->index || !g->global)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->layers; l++) {
        g->global[l] = gpt_moe_block(c, l) ? g->total++ : -1;
        g->index[l] = gpt_moe_block(c, l) && m->own[l] ? g->n++ : -1;
    }
    g->slots = m->slots > 1 ? m->slots : 1;
    g->blk = g->blk_all = calloc((size_t)g->slots * g->n + 1, sizeof *g->blk);
    g->load = calloc((size_t)g->total * E, sizeof(double));
    g->dlogits_h = malloc(R * E * sizeof(float));
    g->dgate_h = malloc(A * sizeof(float));
    if (!g->blk || !g->load || !g->dlogits_h || !g->dgate_h)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    int ok = 1;
#define DEV(n) (g->bytes += (n) * sizeof(float), k->alloc(m->be->self, (n) * sizeof(float)))
#define HOST(p, n) (ok &= ((p) = calloc((n), sizeof *(p))) != NULL)
    for (int b = 0; b < g->slots * g->n; b++) {
        moe_block *x = &g->blk_all[b];
        ok &= moe_route_alloc(&x->rt, (int)R, E, K) == 0;
        x->logits_h = malloc(R * E * sizeof(float));
        x->logits = DEV(R * E);
        x->tok = (int *)DEV(A);
        x->gate = DEV(A);
        x->xin = DEV(A * C);
        x->h = DEV(Am * F);
        x->hg = DEV(Am * F);
        x->y = DEV(A * C);
        ok &= x->logits_h && x->logits && x->tok && x->gate && x->xin && x->h && x->hg && x->y;
        if (m->split) { /* B's gradients for W (moe.h: gpt_moe_backward_input) */
            x->kdy = DEV((P > 1 ? Am : A) * C);
            x->kdh = DEV(Am * F);
            x->kdlogits = DEV(R * E);
            ok &= x->kdy && x->kdh && x->kdlogits;
        }
        if (P > 1) {
            x->xe = DEV(Am * C);
            x->perm = (int *)DEV(Am);
            x->inv = (int *)DEV(Am);
            ok &= x->xe && x->perm && x->inv;
            HOST(x->rcnt, (size_t)E); HOST(x->ecount, (size_t)g->El); HOST(x->eoff, (size_t)g->El + 1);
            HOST(x->hperm, Am); HOST(x->hinv, Am);
            HOST(x->recv_rows, (size_t)P); HOST(x->recv_off, (size_t)P);
            HOST(x->sc, (size_t)P); HOST(x->sd, (size_t)P); HOST(x->rc, (size_t)P); HOST(x->rd, (size_t)P);
        }
    }
    for (int i = 0; g->swiglu && i < m->table.count; i++) /* gate|up: one product's weight */
        if (strstr(m->table.entries[i].name, ".gate.weight") && loom_gpt_is_expert_entry(m, i) &&
            m->table.entries[i].offset + m->table.entries[i].numel != m->table.entries[i + 1].offset)
            LOOM_FAIL(LOOM_ERR_INVALID, "moe with the llama family: %s and %s are not back to "
                      "back in the parameter buffer (use a dim and ffn_dim whose product is a "
                      "multiple of 16)", m->table.entries[i].name, m->table.entries[i + 1].name);
    g->segs = P > 1 && m->canonical ? P : 1;
    g->chunks = P > 1 && c->moe.overlap ? (g->El < 2 ? 1 : 2) : 1;
    if (P > 1)
        HOST(g->spans, 2 * (size_t)MOE_SPANS);
    if (g->segs > 1) { /* each block's run of local experts, in table order */
        int b = 0;
        for (int i = 0; i < m->table.count; i++)
            if (loom_gpt_is_expert_entry(m, i) && (i == 0 || !loom_gpt_is_expert_entry(m, i - 1))) {
                const loom_param_entry *last = &m->table.entries[i + g->per * g->El - 1];
                g->blk[b].run_off = m->table.entries[i].offset;
                g->blk[b++].cbase = g->nexp;
                g->nexp += last->offset + last->numel - m->table.entries[i].offset;
            }
        for (int q = 1; q < g->slots; q++) /* every slot's blocks (pp: micro-batches in flight) */
            for (int j = 0; j < g->n; j++) {
                g->blk_all[(size_t)q * g->n + j].run_off = g->blk_all[j].run_off;
                g->blk_all[(size_t)q * g->n + j].cbase = g->blk_all[j].cbase;
            }
        g->cgrad = DEV((size_t)P * g->nexp);
        ok &= g->cgrad != NULL;
    }
    g->dlogits = DEV(R * E);
    g->dgate = DEV(A);
    g->dy = DEV(A * C);
    g->dhg = DEV(Am * F);
    g->dh = DEV(Am * F);
    g->dxin = DEV(A * C);
    g->dxr = DEV(R * C);
    ok &= g->dlogits && g->dgate && g->dy && g->dhg && g->dh && g->dxin && g->dxr;
    if (P > 1) {
        g->xr = DEV(Am * C);
        g->ye = DEV(Am * C);
        g->dye = DEV(Am * C);
        g->dxe = DEV(Am * C);
        ok &= g->xr && g->ye && g->dye && g->dxe;
    }
#undef HOST
#undef DEV
    if (!ok)
        LOOM_FAIL(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB for the mixture-of-experts buffers",
                  (double)g->bytes / (1 << 20));
    size_t host;
    if (g->bytes != gpt_moe_size(m, &host)) /* what loom plan predicts must be what we take */
        LOOM_FAIL(LOOM_ERR_INTERNAL, "moe: allocated %zu bytes of buffers, gpt_moe_size says %zu",
                  g->bytes, gpt_moe_size(m, &host));
    return LOOM_OK;
}

void gpt_moe_destroy(loom_gpt *m)
{
    gpt_moe *g = m->moe;
    if (!g)
        return;
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    for (int b = 0; g->blk_all && b < g->slots * g->n; b++) {
        moe_block *x = &g->blk_all[b];
        moe_route_free(&x->rt);
        free(x->logits_h);
        float *dev[] = {x->logits, (float *)x->tok, x->gate, x->xin, x->h, x->hg, x->y, x->xe,
                        (float *)x->perm, (float *)x->inv, x->kdy, x->kdh, x->kdlogits};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            if (dev[i])
                k->free(bs, dev[i]);
        free(x->rcnt); free(x->ecount); free(x->eoff); free(x->hperm); free(x->hinv);
        free(x->recv_rows); free(x->recv_off);
        free(x->sc); free(x->sd); free(x->rc); free(x->rd);
    }
    float *dev[] = {g->dlogits, g->dgate, g->dy, g->dhg, g->dh, g->dxin, g->dxr, g->xr, g->ye,
                    g->dye, g->dxe, g->cgrad};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            k->free(bs, dev[i]);
    free(g->blk_all);
    free(g->index);
    free(g->global);
    free(g->load);
    free(g->dlogits_h);
    free(g->dgate_h);
    free(g->spans);
    free(g);
    m->moe = NULL;
}

size_t gpt_moe_bytes(const loom_gpt *m) { return m->moe ? m->moe->bytes : 0; }

void gpt_moe_bind_slot(loom_gpt *m, int slot)
{
    gpt_moe *g = m->moe;
    if (g && slot >= 0 && slot < g->slots)
        g->blk = g->blk_all + (size_t)slot * (size_t)g->n;
}

void gpt_moe_rerun(loom_gpt *m, int on)
{
    if (m->moe)
        m->moe->rerun = on;
}

int gpt_moe_rerunning(const loom_gpt *m) { return m->moe && m->moe->rerun; }

void gpt_moe_begin(loom_gpt *m, float dloss)
{
    if (m->moe)
        m->moe->dloss = dloss;
}

void loom_gpt_set_moe_key(loom_gpt *m, uint64_t key)
{
    if (m->moe) {
        m->moe->key = key;
        m->moe->micro = 0;
    }
}

void loom_gpt_set_moe_micro(loom_gpt *m, int micro)
{
    if (m->moe)
        m->moe->micro = (uint64_t)micro;
}

static int first_moe_layer(const loom_gpt *m)
{
    int l = 0;
    while (l < m->cfg.layers && !gpt_moe_block(&m->cfg, l))
        l++;
    return l;
}

void loom_gpt_moe_stats(loom_gpt *m, loom_moe_stats *out, int reset)
{
    memset(out, 0, sizeof *out);
    gpt_moe *g = m->moe;
    if (!g)
        return;
    out->layers = g->total;
    out->experts = g->cfg.experts;
    out->counts_forwards = g->n && g->index[first_moe_layer(m)] >= 0;
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

/* Local expert j's entries after the router at e0: fc's weight (SwiGLU: gate, then up, one
 * 2F x C matrix) and bias, proj's weight and bias; the llama family's have no biases
 * (table index -1). */
enum { X_FCW, X_FCB, X_PJW, X_PJB };
static int xent(const gpt_moe *g, int e0, int j, int kind)
{
    static const int gpt[4] = {0, 1, 2, 3}, llama[4] = {0, -1, 2, -1};
    int at_ = (g->swiglu ? llama : gpt)[kind];
    return at_ < 0 ? -1 : e0 + 1 + g->per * j + at_;
}
static float *xat(loom_gpt *m, float *base, int e0, int j, int kind)
{
    int i = xent(m->moe, e0, j, kind);
    return i < 0 ? NULL : at(m, base, i);
}
#define FCW(base) xat(m, base, e0, j, X_FCW)
#define FCB(base) xat(m, base, e0, j, X_FCB)
#define PJW(base) xat(m, base, e0, j, X_PJW)
#define PJB(base) xat(m, base, e0, j, X_PJB)

int gpt_moe_held_elsewhere(const loom_gpt *m, const char *name)
{
    const gpt_moe *g = m->moe;
    if (!g || g->ep < 2 || loom_params_find(&m->table, name))
        return 0;
    int l, e, n = 0;
    char what[32] = "";
    if (sscanf(name, "h.%d.moe.expert.%d.%31s%n", &l, &e, what, &n) != 3 || name[n] != '\0')
        return 0;
    const char *const *kinds;
    int known = 0, nk = loom_gpt_moe_expert_kinds(m, &kinds);
    for (int q = 0; q < nk; q++)
        known |= !strcmp(what, kinds[q]);
    return known && l >= 0 && l < m->cfg.layers && gpt_moe_block(&m->cfg, l) && e >= 0 &&
           e < g->cfg.experts && e / g->El != g->ep_rank;
}

size_t gpt_moe_params_elsewhere(const loom_gpt *m)
{
    const gpt_moe *g = m->moe;
    if (!g || g->ep < 2)
        return 0;
    size_t C = (size_t)m->cfg.dim, F = (size_t)m->cfg.ffn_dim;
    size_t per = g->swiglu ? 3 * F * C       /* gate, up (F x C), proj (C x F) */
                           : 8 * C * C + 5 * C; /* fc (4C x C, 4C), proj (C x 4C, C) */
    return (size_t)g->n * (size_t)(g->cfg.experts - g->El) * per;
}

int loom_gpt_expert_parallel(const loom_gpt *m) { return m->moe ? m->moe->ep : 1; }

const float *loom_gpt_moe_source_grads(const loom_gpt *m, size_t *n)
{
    const gpt_moe *g = m->moe;
    *n = g && g->cgrad ? g->nexp : 0;
    return *n ? g->cgrad : NULL;
}

/* Expert j's rows in xe for GEMM s of g->segs: all of them (o from the first local
 * expert's), or in canonical mode under ep those from source rank s (ep_plan lays each
 * expert's rows out source by source). */
/* Floats of the run of local experts after the router at table index e0. */
static size_t run_floats(const loom_gpt *m, int e0)
{
    const loom_param_entry *first = &m->table.entries[e0 + 1],
                           *last = &m->table.entries[e0 + m->moe->per * m->moe->El];
    return last->offset + last->numel - first->offset;
}

static size_t segment(const gpt_moe *g, const moe_block *b, const int *eoff, const int *ecount,
                      int j, int s, size_t *o)
{
    *o = (size_t)eoff[j] - (size_t)eoff[0];
    if (g->segs == 1)
        return (size_t)ecount[j];
    for (int q = 0; q < s; q++)
        *o += (size_t)b->rcnt[q * g->El + j];
    return (size_t)b->rcnt[s * g->El + j];
}

/* Where GEMM s's gradient of table entry i goes: the model's, or source s's copy. */
static float *grad_of(loom_gpt *m, const moe_block *b, int i, int s)
{
    const gpt_moe *g = m->moe;
    if (i < 0)
        return NULL; /* no such entry (the llama family's experts have no biases) */
    size_t off = m->table.entries[i].offset;
    if (g->segs == 1)
        return m->grads + off;
    return g->cgrad + (size_t)s * g->nexp + b->cbase + (off - b->run_off);
}

int loom_gpt_is_expert_entry(const loom_gpt *m, int i)
{
    return m->moe && strstr(m->table.entries[i].name, ".moe.expert.") != NULL;
}

/* A call into the ep exchanges ran from t0 until now: comm time, and a span for the trace. */
static void ep_time(loom_gpt *m, double t0)
{
    gpt_moe *g = m->moe;
    double t1 = loom_now_ms();
    m->comm_ms += t1 - t0;
    if (g->spans && g->n_spans < MOE_SPANS) {
        g->spans[2 * g->n_spans] = t0;
        g->spans[2 * g->n_spans++ + 1] = t1;
    }
}

size_t loom_gpt_moe_take_spans(loom_gpt *m, const double **t)
{
    gpt_moe *g = m->moe;
    *t = g ? g->spans : NULL;
    size_t n = g ? (size_t)g->n_spans : 0;
    if (g)
        g->n_spans = 0;
    return n;
}

static loom_status ep_wait(loom_gpt *m, loom_comm_request *r)
{
    return m->ep_ops->wait(m->ep_comm, r);
}

/* The ep exchanges, in chunks (g->chunks): chunk c of the local experts is [j0, j1), and
 * its rows travel in an all-to-all-v of their own, so that while one chunk's experts
 * compute another chunk's rows are on the way (DeepSpeed-MoE's and Tutel's pipelined
 * all-to-all, cut by experts rather than tokens: each expert's GEMMs are the same ones
 * over the same rows in either case, so the bits do not depend on the chunks). Every
 * rank starts the same exchanges in the same order; each is waited for oldest first. */
static void chunk_experts(const gpt_moe *g, int c, int *j0, int *j1)
{
    *j0 = c * g->El / g->chunks;
    *j1 = (c + 1) * g->El / g->chunks;
}

/* Chunk [j0, j1)'s rows, counted in floats: b->sc / sd what this rank's tokens send to (and
 * get back from) ep rank p, at their place in the expert-major layout of every expert;
 * b->rc / rd what the experts here get from (and return to) p, at their place in the
 * received, source-major layout (ep_plan's recv_off: p's rows expert by expert). */
static void chunk_counts(const gpt_moe *g, moe_block *b, int j0, int j1, size_t C)
{
    const int *off = b->rt.offset;
    for (int p = 0; p < g->ep; p++) {
        size_t skip = 0, n = 0;
        for (int q = 0; q < j1; q++)
            *(q < j0 ? &skip : &n) += (size_t)b->rcnt[p * g->El + q];
        b->sd[p] = (size_t)off[p * g->El + j0] * C;
        b->sc[p] = (size_t)(off[p * g->El + j1] - off[p * g->El + j0]) * C;
        b->rd[p] = (b->recv_off[p] + skip) * C;
        b->rc[p] = n * C;
    }
}

/* Start chunk [j0, j1)'s all-to-all-v: to the experts (tokens' src to the experts' dst),
 * or back (experts' src to the tokens' dst). The plugins read the counts at start. The
 * rows are the backend's memory: they go over ep_dcomm (a device backend's group; for
 * host memory ep_comm itself), the counts (ep_plan) over the host group ep_comm. */
static loom_status ep_start(loom_gpt *m, moe_block *b, int j0, int j1, int back, const float *src,
                            float *dst)
{
    gpt_moe *g = m->moe;
    if (g->n_pend == (int)(sizeof g->pend / sizeof g->pend[0]))
        LOOM_FAIL(LOOM_ERR_INTERNAL, "moe: more than %d exchanges in flight", g->n_pend);
    chunk_counts(g, b, j0, j1, (size_t)m->cfg.dim);
    double t0 = loom_now_ms();
    const loom_comm_ops *o = m->ep_dops;
    loom_comm_request **req = &g->pend[g->n_pend];
    loom_status st = back ? o->alltoallv_start(m->ep_dcomm, src, b->rc, b->rd, dst, b->sc, b->sd,
                                               LOOM_DTYPE_F32, req)
                          : o->alltoallv_start(m->ep_dcomm, src, b->sc, b->sd, dst, b->rc, b->rd,
                                               LOOM_DTYPE_F32, req);
    if (st == LOOM_OK)
        g->n_pend++;
    ep_time(m, t0);
    return st;
}

/* Wait for the oldest exchange in flight. */
static loom_status ep_wait_oldest(loom_gpt *m)
{
    gpt_moe *g = m->moe;
    if (g->n_pend == 0)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "moe: waiting for an exchange none started");
    double t0 = loom_now_ms();
    loom_status st = m->ep_dops->wait(m->ep_dcomm, g->pend[0]); /* rows: the device group */
    memmove(g->pend, g->pend + 1, (size_t)--g->n_pend * sizeof g->pend[0]);
    ep_time(m, t0);
    return st;
}

static loom_status ep_wait_all(loom_gpt *m)
{
    loom_status st = LOOM_OK;
    while (m->moe && m->moe->n_pend > 0) {
        loom_status w = ep_wait_oldest(m);
        if (st == LOOM_OK)
            st = w;
    }
    return st;
}

/* Between two GEMMs: let the exchanges in flight move (shm and mpi move data only inside
 * their calls). Never blocks. */
static void ep_progress(loom_gpt *m)
{
    gpt_moe *g = m->moe;
    if (g->n_pend == 0)
        return;
    double t0 = loom_now_ms();
    for (int i = 0; i < g->n_pend && m->ep_dops->test(m->ep_dcomm, g->pend[i]); i++)
        ;
    ep_time(m, t0);
}

/* Chunk [j0, j1)'s rows between the two layouts: the experts' xe (expert-major, from) the
 * received xr (source-major) by perm, or xr from xe by inv (each source's run on its own:
 * the chunk's rows of p lie together in xr). Copies only. */
static void chunk_to_experts(loom_gpt *m, moe_block *b, int j0, int j1, float *xe, const float *xr)
{
    size_t C = (size_t)m->cfg.dim, r0 = (size_t)b->eoff[j0];
    m->be->ops->rows_gather(xe + r0 * C, xr, b->perm + r0, NULL, (size_t)(b->eoff[j1] - b->eoff[j0]),
                            (int)C);
}

static void chunk_to_sources(loom_gpt *m, moe_block *b, int j0, int j1, float *xr, const float *xe)
{
    gpt_moe *g = m->moe;
    size_t C = (size_t)m->cfg.dim;
    chunk_counts(g, b, j0, j1, C);
    for (int p = 0; p < g->ep; p++)
        if (b->rc[p])
            m->be->ops->rows_gather(xr + b->rd[p], xe, b->inv + b->rd[p] / C, NULL, b->rc[p] / C,
                                    (int)C);
}

/* After routing: tell every ep rank how many rows of each of its experts come from here,
 * learn the same from them, and lay out the received rows expert-major (perm / inv). */
static loom_status ep_plan(loom_gpt *m, moe_block *b)
{
    gpt_moe *g = m->moe;
    int P = g->ep, El = g->El;
    const moe_route *rt = &b->rt;
    double t0 = loom_now_ms();
    loom_comm_request *r;
    LOOM_TRY(m->ep_ops->alltoall_start(m->ep_comm, rt->count, b->rcnt, (size_t)El, LOOM_DTYPE_I32,
                                       &r));
    loom_status st = ep_wait(m, r);
    ep_time(m, t0);
    LOOM_TRY(st);
    size_t at_ = 0;
    for (int p = 0; p < P; p++) {
        b->recv_off[p] = at_;
        b->recv_rows[p] = 0;
        for (int j = 0; j < El; j++)
            b->recv_rows[p] += (size_t)b->rcnt[p * El + j];
        at_ += b->recv_rows[p];
    }
    if (at_ > (size_t)g->Amax)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "moe: %zu rows received, buffers hold %d", at_, g->Amax);
    b->Ar = (int)at_;
    int i = 0;
    for (int j = 0; j < El; j++) { /* expert j: rank 0's rows, then rank 1's, ... */
        b->eoff[j] = i;
        for (int p = 0; p < P; p++) {
            int first = (int)b->recv_off[p];
            for (int q = 0; q < j; q++)
                first += b->rcnt[p * El + q];
            for (int n = 0; n < b->rcnt[p * El + j]; n++, i++) {
                b->hperm[i] = first + n;
                b->hinv[first + n] = i;
            }
        }
        b->ecount[j] = i - b->eoff[j];
    }
    b->eoff[El] = i;
    const loom_backend_ops *k = m->be->ops;
    k->copy_to_device(m->be->self, b->perm, b->hperm, (size_t)i * sizeof(int));
    k->copy_to_device(m->be->self, b->inv, b->hinv, (size_t)i * sizeof(int));
    return LOOM_OK;
}

/* Local experts [j0, j1) over the rows they received (xe, expert-major): one fc GEMM per
 * expert (per source in canonical mode), the activation over their rows, one proj GEMM
 * into ye; the exchanges in flight move between the GEMMs.
 * proj is row-parallel under tp (each rank its F/tp input features). Fast mode leaves ye
 * this rank's partial (the bias on tp rank 0) and the caller sums the gated combination
 * over the group. Canonical mode cannot: the gates and the top-k sum are not linear in the
 * bits, so the tp sum must come first. So proj runs in canonical mode's fixed chunk tree
 * (gpt_row_parallel_forward, this rank's chunks), the tree is finished over the tp group
 * on ye itself (the tp strategy's tree over ranks), and the bias is added after: the
 * dense row-parallel layer's order, the same bits for every tp (and tp = 1). */
static loom_status experts_forward(loom_gpt *m, moe_block *b, int e0, const float *xe,
                                   float *ye, const int *eoff, const int *ecount, int j0, int j1)
{
    gpt_moe *g = m->moe;
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim, F = m->Fl, H = g->hw;
    for (int j = j0; j < j1; j++) /* one GEMM per expert over the rows it received */
        for (int s = 0; s < g->segs; s++) {
            size_t o, n = segment(g, b, eoff, ecount, j, s, &o);
            if (n) /* 16-bit: the dense MLP's product (gpt_matmul_forward) */
                gpt_matmul_forward(m, b->h + o * H, xe + o * C, FCW(m->params), FCB(m->params),
                                   1, (int)n, C, H);
            ep_progress(m);
        }
    size_t o0 = (size_t)(eoff[j0] - eoff[0]), rows = (size_t)(eoff[j1] - eoff[j0]);
    /* 16-bit activations: each stored one rounded where it is written, as the dense MLP's
     * (elementwise, so rounding chunk by chunk gives the whole block's bits) */
    gpt_round(m, b->h + o0 * H, rows * (size_t)H);
    if (g->swiglu) /* silu(gate) * up, each row's gate|up halves */
        k->swiglu_forward(b->hg + o0 * F, b->h + o0 * H, rows, F);
    else
        k->gelu_forward(b->hg + o0 * F, b->h + o0 * F, rows * F);
    gpt_round(m, b->hg + o0 * F, rows * (size_t)F);
    for (int j = j0; j < j1; j++)
        for (int s = 0; s < g->segs; s++) {
            size_t o, n = segment(g, b, eoff, ecount, j, s, &o);
            if (n && m->canonical)
                gpt_row_parallel_forward(m, ye + o * C, b->hg + o * F, PJW(m->params), 1,
                                         (int)n, F);
            else if (n)
                gpt_matmul_forward(m, ye + o * C, b->hg + o * F, PJW(m->params),
                                   m->tp_rank == 0 ? PJB(m->params) : NULL, 1, (int)n, F, C);
            ep_progress(m);
        }
    if (m->canonical) { /* every tp rank holds the same rows (same tokens, same routes) */
        LOOM_TRY(gpt_tensor_allreduce(m, ye + o0 * C, rows * (size_t)C, LOOM_REDUCE_SUM));
        for (int j = j0; j < j1 && PJB(m->params); j++)
            k->bias_add(ye + (size_t)(eoff[j] - eoff[0]) * C, PJB(m->params),
                        (size_t)ecount[j], C);
    }
    gpt_round(m, ye + o0 * C, rows * (size_t)C);
    return LOOM_OK;
}

loom_status gpt_moe_forward(loom_gpt *m, int l, int e0, const float *x, float *out, size_t R)
{
    gpt_moe *g = m->moe;
    moe_block *b = &g->blk[g->index[l]];
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int E = g->cfg.experts, K = g->cfg.top_k, C = m->cfg.dim, El = g->El;
    widen_block(m, l);
    /* the router in fp32 (Switch's selective precision, Mixtral's fp32 softmax): its
     * logits from fp32 products and never rounded; the routing on the host in fp32 */
    k->matmul_forward(b->logits, x, at(m, m->params, e0), NULL, 1, (int)R, C, E);
    k->copy_to_host(bs, b->logits_h, b->logits, R * E * sizeof(float));
    if (g->cfg.noisy && g->dloss != 0.0f) { /* training forwards only (Shazeer et al. 2017) */
        char sname[48];
        snprintf(sname, sizeof sname, "moe.noise.%d", l);
        uint64_t stream = loom_rng_stream(sname), row0 = (g->key + g->micro) * (uint64_t)R;
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
    /* The experts' inputs xe, expert-major: here, or gathered from every ep rank chunk by
     * chunk (each chunk's outputs start back while the next computes) */
    float *xe = b->xin, *ye = b->y;
    const int *eoff = rt->offset + g->ep_rank * El, *ecount = rt->count + g->ep_rank * El;
    int nch = 1;
    if (g->ep > 1) {
        LOOM_TRY(ep_plan(m, b));
        xe = b->xe;
        ye = g->ye;
        eoff = b->eoff;
        ecount = b->ecount;
        nch = g->chunks;
        for (int c = 0, j0, j1; c < nch; c++) {
            chunk_experts(g, c, &j0, &j1);
            LOOM_TRY(ep_start(m, b, j0, j1, 0, b->xin, g->xr));
        }
    }
    for (int c = 0; c < nch; c++) {
        int j0 = 0, j1 = El;
        if (g->ep > 1) {
            chunk_experts(g, c, &j0, &j1);
            LOOM_TRY(ep_wait_oldest(m));
            chunk_to_experts(m, b, j0, j1, xe, g->xr);
        }
        LOOM_TRY(experts_forward(m, b, e0, xe, ye, eoff, ecount, j0, j1));
        if (g->ep > 1) { /* back to the ranks the rows came from, in their order */
            chunk_to_sources(m, b, j0, j1, g->xr, ye);
            LOOM_TRY(ep_start(m, b, j0, j1, 1, g->xr, b->y));
        }
    }
    LOOM_TRY(ep_wait_all(m));
    k->zero(bs, out, R * C * sizeof(float));
    k->rows_scatter_add(out, b->y, b->tok, b->gate, A, C);
    /* under tp in fast mode each rank's experts gave their slice's partial proj (the bias
     * on tp rank 0): the caller sums out over the group (Megatron's row-parallel g; gpt.c's
     * MLP region, gpt_moe_leave); in canonical mode out is whole on every rank */
    if (g->dloss != 0.0f) {
        if (g->load_stale)
            memset(g->load, 0, (size_t)g->total * E * sizeof(double));
        g->load_stale = 0;
        double *load = g->load + (size_t)g->global[l] * E;
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

enum { MOE_FUSED, MOE_INPUT, MOE_WEIGHT };

/* One linear's backward over n rows (matmul_backward's contract, inputs Cin, outputs OC):
 * fused, or split as gpt_backward_split.c splits it: B the input gradient through the GEMM
 * matmul_backward makes, W the weight and bias gradients. */
static void linear_back(loom_gpt *m, int mode, float *dinp, float *dw, float *db,
                        const float *dout, const float *inp, const float *w, size_t n, int Cin,
                        int OC)
{
    const loom_backend_ops *k = m->be->ops;
    if (mode == MOE_INPUT) { /* the dense split's B (gpt_backward_split.c) */
        if (!gpt_matmul_backward16(m, dinp, NULL, NULL, dout, NULL, w, 0, 1, (int)n, Cin, OC))
            k->gemm(0, 0, (int)n, Cin, OC, 1.0f, dout, OC, w, Cin, 0.0f, dinp, Cin);
    } else
        gpt_matmul_backward(m, mode == MOE_WEIGHT ? NULL : dinp, dw, db, dout, inp, w, 1, (int)n,
                            Cin, OC);
}

/* The router's backward in fp32 (its forward's products: never the 16-bit op). */
static void router_back(loom_gpt *m, int mode, float *dinp, float *dw, const float *dout,
                        const float *inp, const float *w, size_t n, int Cin, int OC)
{
    const loom_backend_ops *k = m->be->ops;
    if (mode == MOE_INPUT)
        k->gemm(0, 0, (int)n, Cin, OC, 1.0f, dout, OC, w, Cin, 0.0f, dinp, Cin);
    else
        k->matmul_backward(mode == MOE_WEIGHT ? NULL : dinp, dw, NULL, dout, inp, w, 1, (int)n,
                           Cin, OC);
}

/* Local experts [j0, j1)'s backward from dye (their outputs' gradients, expert-major):
 * proj, the activation, fc, each linear fused or split (mode); dxe the inputs' gradients.
 * The exchanges in flight move between the GEMMs.
 * fc is column-parallel under tp, so dxe is a sum over its output features. Fast mode
 * leaves dxe this rank's partial for the caller to sum after the scatter; canonical mode
 * (as experts_forward) computes it in the fixed chunk tree over this rank's chunks
 * (gpt_column_parallel_dinp: SwiGLU's gate|up as two segments, chunk c holding part c of
 * each) and finishes the tree over the tp group on dxe, before the scatter's sum. */
static loom_status experts_backward(loom_gpt *m, moe_block *b, int e0, int mode,
                                    const float *dye, float *dh, float *dxe, const float *xe,
                                    const int *eoff, const int *ecount, int j0, int j1)
{
    gpt_moe *g = m->moe;
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim, F = m->Fl, H = g->hw;
    for (int j = j0; j < j1; j++)
        for (int s = 0; s < g->segs; s++) {
            size_t o, n = segment(g, b, eoff, ecount, j, s, &o);
            if (n)
                linear_back(m, mode, g->dhg + o * F, grad_of(m, b, xent(g, e0, j, X_PJW), s),
                            grad_of(m, b, xent(g, e0, j, X_PJB), s), dye + o * C,
                            b->hg + o * F, PJW(m->params), n, F, C);
            ep_progress(m);
        }
    size_t o0 = (size_t)(eoff[j0] - eoff[0]), rows = (size_t)(eoff[j1] - eoff[j0]);
    if (g->swiglu)
        k->swiglu_backward(dh + o0 * H, b->h + o0 * H, g->dhg + o0 * F, rows, F);
    else
        k->gelu_backward(dh + o0 * F, b->h + o0 * F, g->dhg + o0 * F, rows * F);
    for (int j = j0; j < j1; j++)
        for (int s = 0; s < g->segs; s++) {
            size_t o, n = segment(g, b, eoff, ecount, j, s, &o);
            if (n && m->canonical) { /* the input gradient in the tree; the weight's apart */
                gpt_column_parallel_dinp(m, dxe + o * C, dh + o * H, FCW(m->params), (int)n, H,
                                         g->swiglu ? 2 : 1);
                if (mode == MOE_FUSED)
                    gpt_matmul_backward(m, NULL, grad_of(m, b, xent(g, e0, j, X_FCW), s),
                                        grad_of(m, b, xent(g, e0, j, X_FCB), s), dh + o * H,
                                        xe + o * C, FCW(m->params), 1, (int)n, C, H);
            } else if (n)
                linear_back(m, mode, dxe + o * C, grad_of(m, b, xent(g, e0, j, X_FCW), s),
                            grad_of(m, b, xent(g, e0, j, X_FCB), s), dh + o * H, xe + o * C,
                            FCW(m->params), n, C, H);
            ep_progress(m);
        }
    if (m->canonical)
        LOOM_TRY(gpt_tensor_allreduce(m, dxe + o0 * C, rows * (size_t)C, LOOM_REDUCE_SUM));
    return LOOM_OK;
}

/* The router's backward: the gates' gradient, and the aux and z losses', each weighted by
 * the forward's dloss * R (the micro-batch's share of the step's token mean), into
 * dlogits, the router's gradient and g->dxr (its input gradient). */
static void router_backward(loom_gpt *m, int l, int e0, size_t R, int mode, float *dlogits)
{
    gpt_moe *g = m->moe;
    moe_block *b = &g->blk[g->index[l]];
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int E = g->cfg.experts, C = m->cfg.dim;
    k->copy_to_host(bs, g->dgate_h, g->dgate, (size_t)b->rt.kept * sizeof(float));
    double w = (double)g->dloss * (double)R;
    moe_route_backward(&b->rt, g->dgate_h, w * g->cfg.aux_loss, w * g->cfg.z_loss, g->dlogits_h);
    k->copy_to_device(bs, dlogits, g->dlogits_h, R * E * sizeof(float));
    const float *x = m->acts[l].ln2_full;
    router_back(m, mode, g->dxr, at(m, m->grads, e0), dlogits, x, at(m, m->params, e0), R, C, E);
}

static loom_status moe_backward(loom_gpt *m, int l, int e0, const float *dout, float *dx,
                                size_t R, int mode)
{
    gpt_moe *g = m->moe;
    moe_block *b = &g->blk[g->index[l]];
    moe_route *rt = &b->rt;
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int E = g->cfg.experts, C = m->cfg.dim, F = m->Fl, El = g->El, H = g->hw;
    size_t A = (size_t)rt->kept;
    if ((size_t)rt->R != R)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "moe backward over %zu rows after a forward over %d", R,
                  rt->R);
    widen_block(m, l);
    int split = mode != MOE_FUSED;
    /* the gradients W reads: B's own per slot under a split backward, else scratch; under
     * ep the tokens' side dy only travels (W reads the experts' side, kdy), and a chunk's
     * send must not be overwritten by an earlier chunk's arrival: scratch */
    float *dy = split && g->ep == 1 ? b->kdy : g->dy, *dh = split ? b->kdh : g->dh;
    float *dlogits = split ? b->kdlogits : g->dlogits;
    float *dye = dy, *dxe = g->dxin, *xe = b->xin;
    const int *eoff = rt->offset + g->ep_rank * El, *ecount = rt->count + g->ep_rank * El;
    if (g->ep > 1) {
        dye = split ? b->kdy : g->dye;
        dxe = g->dxe;
        xe = b->xe;
        eoff = b->eoff;
        ecount = b->ecount;
    }
    if (mode != MOE_INPUT) /* this backward's canonical copies start at 0 */
        for (int s = 0; g->segs > 1 && s < g->segs; s++)
            k->zero(bs, g->cgrad + (size_t)s * g->nexp + b->cbase,
                    run_floats(m, e0) * sizeof(float));
    if (mode == MOE_WEIGHT) { /* W: the weight products from what B kept */
        for (int j = 0; j < El; j++)
            for (int s = 0; s < g->segs; s++) {
                size_t o, n = segment(g, b, eoff, ecount, j, s, &o);
                if (n)
                    linear_back(m, mode, NULL, grad_of(m, b, xent(g, e0, j, X_PJW), s),
                                grad_of(m, b, xent(g, e0, j, X_PJB), s), dye + o * C,
                                b->hg + o * F, PJW(m->params), n, F, C);
            }
        for (int j = 0; j < El; j++)
            for (int s = 0; s < g->segs; s++) {
                size_t o, n = segment(g, b, eoff, ecount, j, s, &o);
                if (n)
                    linear_back(m, mode, NULL, grad_of(m, b, xent(g, e0, j, X_FCW), s),
                                grad_of(m, b, xent(g, e0, j, X_FCB), s), dh + o * H,
                                xe + o * C, FCW(m->params), n, C, H);
            }
        router_back(m, mode, NULL, at(m, m->grads, e0), dlogits, m->acts[l].ln2_full,
                    at(m, m->params, e0), R, C, E);
        return LOOM_OK;
    }
    /* out = sum_a gate_a y_a at row tok_a: d(y_a) = gate_a dout[tok_a], d(gate_a) =
     * dout[tok_a] . y_a */
    k->rows_gather(dy, dout, b->tok, b->gate, A, C);
    k->rows_dot(g->dgate, dout, b->tok, b->y, A, C);
    /* fast mode: y is this tp rank's partial, so the gates' gradient is the sum over the
     * group; canonical mode: y is whole (experts_forward), and so is the dot */
    if (!m->canonical)
        LOOM_TRY(gpt_tensor_allreduce(m, g->dgate, A, LOOM_REDUCE_SUM));
    int nch = 1;
    if (g->ep > 1) { /* the outputs' gradients to the experts' ranks, as the inputs went */
        nch = g->chunks;
        for (int c = 0, j0, j1; c < nch; c++) {
            chunk_experts(g, c, &j0, &j1);
            LOOM_TRY(ep_start(m, b, j0, j1, 0, dy, g->xr));
        }
    }
    for (int c = 0; c < nch; c++) {
        int j0 = 0, j1 = El;
        if (g->ep > 1) {
            chunk_experts(g, c, &j0, &j1);
            LOOM_TRY(ep_wait_oldest(m));
            chunk_to_experts(m, b, j0, j1, dye, g->xr);
        }
        LOOM_TRY(experts_backward(m, b, e0, mode, dye, dh, dxe, xe, eoff, ecount, j0, j1));
        if (g->ep > 1) { /* the inputs' gradients back to the tokens' ranks */
            chunk_to_sources(m, b, j0, j1, g->xr, dxe);
            LOOM_TRY(ep_start(m, b, j0, j1, 1, g->xr, g->dxin));
        }
    }
    /* the router's backward needs none of the exchanges: with them overlapped it runs
     * while the last is in flight (it writes only dlogits, g->dxr and the router's
     * gradient, so the bits are the same) */
    if (g->chunks > 1)
        router_backward(m, l, e0, R, mode, dlogits);
    LOOM_TRY(ep_wait_all(m));
    k->zero(bs, dx, R * C * sizeof(float));
    k->rows_scatter_add(dx, g->dxin, b->tok, NULL, A, C);
    if (g->chunks == 1)
        router_backward(m, l, e0, R, mode, dlogits);
    /* The router is replicated. Fast mode: each tp rank's experts gave their slice's part
     * of the input gradient (column-parallel) and the caller sums dx over the group, so the
     * router's joins once; canonical mode: dx is whole on every rank (experts_backward) */
    if (m->tp_rank == 0 || m->canonical)
        k->accumulate(dx, g->dxr, R * C);
    return LOOM_OK;
}

loom_status gpt_moe_backward(loom_gpt *m, int l, int e0, const float *dout, float *dx, size_t R)
{
    return moe_backward(m, l, e0, dout, dx, R, MOE_FUSED);
}

loom_status gpt_moe_backward_input(loom_gpt *m, int l, int e0, const float *dout, float *dx,
                                   size_t R)
{
    return moe_backward(m, l, e0, dout, dx, R, MOE_INPUT);
}

loom_status gpt_moe_backward_weight(loom_gpt *m, int l, int e0, size_t R)
{
    return moe_backward(m, l, e0, NULL, NULL, R, MOE_WEIGHT);
}

loom_status gpt_moe_leave(loom_gpt *m, int l, int backward, float *in, float *out, size_t R)
{
    size_t C = (size_t)m->cfg.dim;
    if (!m->canonical || !m->tp_ops) { /* sum over tp (nothing with one rank: out == in) */
        if (backward) {
            LOOM_TRY(B_ENTER(LOOM_REGION_MLP, l, in, out, R, C));
            return gpt_region_wait(m);
        }
        return F_LEAVE(LOOM_REGION_MLP, l, in, out, R, C);
    }
    /* canonical: in is whole on every tp rank. Without sp out is in; with it this rank's
     * rows of it (what the reduce-scatter would leave here), as 0 + x: x's bits (the
     * backend has no copy within its memory; in holds no -0: a scatter into zeros) */
    if (!m->sp || out == in)
        return LOOM_OK;
    size_t Rl = R / (size_t)m->tp;
    m->be->ops->zero(m->be->self, out, Rl * C * sizeof(float));
    m->be->ops->accumulate(out, in + (size_t)m->tp_rank * Rl * C, Rl * C);
    return LOOM_OK;
}

loom_status gpt_moe_split_input(loom_gpt *m, int l, const float *dy, size_t R)
{
    LOOM_TRY(gpt_moe_backward_input(m, l, gpt_moe_router(m, l), dy, m->dpartial, R));
    return gpt_moe_leave(m, l, 1, m->dpartial, m->dsummed, R); /* sum over tp */
}
