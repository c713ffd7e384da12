/* gpt.c — GPT-2 forward and backward over the backend's kernels: the parameter table,
 * the activation buffers, and the two passes (tensor parallelism's pieces are in
 * gpt_parallel.c, the shared state in gpt_internal.h).
 *
 * Activation buffers are sized once for (max_B, max_T: ctx unless gpt.h's max_T) and
 * reused; a forward with smaller B or T uses a prefix of each. Backward keeps one
 * residual-gradient buffer and walks the blocks top-down; every input gradient is produced
 * fresh (kernels overwrite) and the residual branches join it with `accumulate`.
 */
#define _DEFAULT_SOURCE /* mmap's MAP_ANONYMOUS */
#include "gpt_internal.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/status.h"
#include "moe.h"

void loom_gpt_set_grad_hook(loom_gpt *m, loom_grad_ready_fn fn, void *ctx)
{
    m->grad_ready = fn;
    m->grad_ready_ctx = ctx;
}

void loom_gpt_set_param_hook(loom_gpt *m, loom_param_use_fn fn, void *ctx)
{
    m->param_use = fn;
    m->param_use_ctx = ctx;
}

void loom_gpt_set_grad_write_hook(loom_gpt *m, loom_grad_write_fn fn, void *ctx)
{
    m->grad_write = fn;
    m->grad_write_ctx = ctx;
}

static loom_status grad_write(loom_gpt *m, int unit)
{
    return m->grad_write ? m->grad_write(m->grad_write_ctx, unit) : LOOM_OK;
}

/* A pipeline stage's table (build_table: its leading wte/wpe, its blocks, its trailing
 * ln_f/lm_head) is read by entry: block entries carry their layer, the others -1. */
static void stage_unit_entries(const loom_gpt *m, int unit, int *first, int *last)
{
    const loom_param_table *t = &m->table;
    int L = m->cfg.layers, lo = 0, hi = t->count; /* [lo, hi): the block entries */
    while (lo < t->count && t->entries[lo].layer < 0)
        lo++;
    while (hi > lo && t->entries[hi - 1].layer < 0)
        hi--;
    *first = 0, *last = -1; /* empty: not on this stage */
    if (unit == 0) {
        *last = lo - 1;
    } else if (unit == L + 1) {
        *first = hi, *last = t->count - 1;
    } else if (unit >= 1 && unit <= L && m->own[unit - 1]) {
        for (int i = lo; i < hi; i++)
            if (t->entries[i].layer == unit - 1) {
                if (*last < *first)
                    *first = i;
                *last = i;
            }
    }
}

void loom_gpt_unit_entries(const loom_gpt *m, int unit, int *first, int *last)
{
    if (m->staged) {
        stage_unit_entries(m, unit, first, last);
        return;
    }
    int L = m->cfg.layers, pre = m->pre, per = m->per_layer;
    *first = unit == 0 ? 0 : unit <= L ? pre + per * (unit - 1) : m->table.count - m->post;
    *last = unit == 0 ? pre - 1 : unit <= L ? pre + per * (unit - 1) + per - 1
                                            : m->table.count - 1;
    if (m->moe && unit >= 1 && unit <= L) { /* blocks of different sizes (gpt_internal.h) */
        *first = m->ent0[unit - 1];
        *last = m->ent0[unit] - 1;
    }
}

static loom_status use(loom_gpt *m, int unit, int needed)
{
    if (!m->param_use)
        return LOOM_OK;
    LOOM_TRY(m->param_use(m->param_use_ctx, unit, needed));
    if (needed == 1)
        gpt_w16_unit(m, unit); /* 16-bit weights: the gathered unit's compute copy */
    return LOOM_OK;
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
    if (c->kd_proj_dim < 0 || (c->kd_proj_dim > 0 && (c->family == LOOM_FAMILY_LLAMA ||
        !c->kd_proj_layers || (c->layers < 64 && c->kd_proj_layers >> c->layers))))
        LOOM_FAIL(LOOM_ERR_INVALID, "distillation projections (kd_proj_dim=%d) need a GPT-2 "
                  "model and student blocks in [0, %d)", c->kd_proj_dim,
                  c->layers < 64 ? c->layers : 64);
    if (c->ctx < 1 || c->layers < 1 || c->heads < 1 || c->dim < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "model ctx, layers, heads and dim must be positive "
                  "(got ctx=%d layers=%d heads=%d dim=%d)", c->ctx, c->layers, c->heads, c->dim);
    LOOM_TRY(gpt_moe_check(c));
    if (c->dim % c->heads != 0) {
        char ok[256] = "";
        size_t used = 0;
        for (int h = 1; h <= c->dim && used < sizeof ok; h++)
            if (c->dim % h == 0 && h <= 64)
                used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", used ? ", " : "", h);
        LOOM_FAIL(LOOM_ERR_INVALID, "model heads=%d does not divide dim=%d (heads may be %s)",
                  c->heads, c->dim, ok);
    }
    if (c->family == LOOM_FAMILY_LLAMA)
        return gpt_llama_config_check(c);
    if (c->family != LOOM_FAMILY_GPT2)
        LOOM_FAIL(LOOM_ERR_INVALID, "model family %d is not gpt2 (0) or llama (1)", c->family);
    return LOOM_OK;
}

/* Ask the tp strategy where the entry added last lives; split_dim is the dim the model
 * allows it to cut (-1: replicated). */
loom_status gpt_place_last(loom_gpt *m, int split_dim)
{
    loom_param_table *t = &m->table;
    t->entries[t->count - 1].split_dim = split_dim;
    if (!m->tp_ops || !m->tp_ops->partition) /* loom_gpt_footprint: the tp plugin's slices */
        return m->tp > 1 && split_dim >= 0 ? loom_params_slice_last(t, split_dim, m->tp, 0)
                                           : LOOM_OK;
    const loom_param_entry *e = &t->entries[t->count - 1];
    loom_param_info info = {.name = e->name, .ndim = e->ndim, .offset = e->offset,
                            .numel = e->numel, .layer = e->layer, .split_dim = split_dim};
    for (int d = 0; d < e->ndim; d++) {
        info.shape[d] = e->shape[d];
        info.slice_start[d] = e->slice_start[d];
        info.slice_len[d] = e->slice_len[d];
    }
    loom_partition part = {-1, 1, 0};
    LOOM_TRY(m->tp_ops->partition(m->tp_self, &info, &part));
    if (part.dim < 0 || part.parts == 1)
        return LOOM_OK;
    if (part.dim != split_dim || part.parts != m->tp || part.index != m->tp_rank)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy asks to split %s along dim %d into %d parts; the "
                  "GPT model splits it only along dim %d into tp=%d", e->name, part.dim, part.parts,
                  split_dim, m->tp);
    return loom_params_slice_last(t, part.dim, part.parts, part.index);
}

/* The parameters, in the order bind_params expects. The fused QKV weight has logical shape
 * (3, C, C): q, k and v blocks, each split along dim 1 by heads, so a rank's slice is its
 * heads' q, k and v rows (the same bytes as llm.c's (3C, C)). Column-parallel layers (qkv,
 * fc) split output features; row-parallel ones (attn.proj, mlp.proj) input features; wte
 * its vocabulary rows (Vp/tp each; the rows >= vocab are padding). */
static loom_status gpt_llama_build_table(loom_gpt *m);

static loom_status build_table(loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    int64_t C = c->dim, L = c->layers;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L); /* GPT-2's residual scaling */
    loom_param_table *t = &m->table;
    int64_t sh[3];
    char name[LOOM_PARAM_NAME_MAX];
#define ADD(nm, nd, layer, init, sd, split)                                  \
    do {                                                                     \
        LOOM_TRY(loom_params_add(t, nm, nd, sh, layer, init, sd));           \
        LOOM_TRY(gpt_place_last(m, split));                                      \
    } while (0)
#define SHAPE(a, b, c3) (sh[0] = (a), sh[1] = (b), sh[2] = (c3))
    /* A pipeline stage (gpt_stage.c) adds only what it holds: wte on the first and the last
     * stage (tied embedding / LM head), wpe on the first, its blocks, ln_f on the last. */
    if (m->llama)
        return gpt_llama_build_table(m);
    if (m->has_embed || m->has_head) {
        SHAPE(c->vocab_padded, C, 0);
        ADD("wte", 2, -1, LOOM_INIT_NORMAL, std, 0);
        t->entries[t->count - 1].init_rows = c->vocab; /* padding rows start at zero */
    }
    if (m->has_embed) {
        SHAPE(c->ctx, C, 0); ADD("wpe", 2, -1, LOOM_INIT_NORMAL, 0.01f, -1);
    }
    for (int l = 0; l < L; l++) {
        if (m->ent0)
            m->ent0[l] = t->count;
        if (!m->own[l])
            continue;
#define LAYER(suffix, nd, a, b, c3, init, sd, split)                 \
    snprintf(name, sizeof name, "h.%d.%s", l, suffix);              \
    SHAPE(a, b, c3);                                                \
    ADD(name, nd, l, init, sd, split)
        LAYER("ln_1.weight", 1, C, 0, 0, LOOM_INIT_ONES, 0, -1);
        LAYER("ln_1.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
        LAYER("attn.qkv.weight", 3, 3, C, C, LOOM_INIT_NORMAL, std, 1);
        LAYER("attn.qkv.bias", 2, 3, C, 0, LOOM_INIT_ZEROS, 0, 1);
        t->entries[t->count - 1].is_matrix = 0; /* a bias: no weight decay by default */
        LAYER("attn.proj.weight", 2, C, C, 0, LOOM_INIT_NORMAL, proj_std, 1);
        LAYER("attn.proj.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
        LAYER("ln_2.weight", 1, C, 0, 0, LOOM_INIT_ONES, 0, -1);
        LAYER("ln_2.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
        if (gpt_moe_block(c, l)) { /* a router and experts instead of mlp.* (moe.h) */
            LOOM_TRY(gpt_moe_add_entries(m, l, std, proj_std));
            continue;
        }
        LAYER("mlp.fc.weight", 2, 4 * C, C, 0, LOOM_INIT_NORMAL, std, 0);
        LAYER("mlp.fc.bias", 1, 4 * C, 0, 0, LOOM_INIT_ZEROS, 0, 0);
        LAYER("mlp.proj.weight", 2, C, 4 * C, 0, LOOM_INIT_NORMAL, proj_std, 1);
        LAYER("mlp.proj.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
#undef LAYER
    }
    if (m->ent0)
        m->ent0[L] = t->count;
    if (m->has_head) {
        SHAPE(C, 0, 0); ADD("ln_f.weight", 1, -1, LOOM_INIT_ONES, 0, -1);
        ADD("ln_f.bias", 1, -1, LOOM_INIT_ZEROS, 0, -1);
    }
    for (int l = 0; m->has_head && c->kd_proj_dim > 0 && l < L && l < 64; l++) {
        if (!(c->kd_proj_layers >> l & 1))
            continue; /* gpt_distill.h's projections, counted in post (the last unit) */
        snprintf(name, sizeof name, "distill.proj.%d.weight", l);
        SHAPE(c->kd_proj_dim, C, 0); ADD(name, 2, -1, LOOM_INIT_NORMAL, std, -1);
        m->post++;
    }
#undef ADD
#undef SHAPE
    return LOOM_OK;
}

/* The llama family's table (gpt.h): wte, per block ln_1 (RMSNorm), q, k, v, the output
 * projection, ln_2, the SwiGLU gate, up and down projections, then ln_f and (untied)
 * lm_head; no biases, no wpe. q, k, v are separate entries split along dim 0 by heads
 * (tp divides heads and kv_heads), added back to back so that a rank's slices of the
 * three are one (Cl + 2KVl, C) matrix in the flat buffer, the fused product's weight;
 * gate and up likewise one (2Fl, C). Initialisation: normal(0, 0.02), the two output
 * projections scaled by 1/sqrt(2L) as GPT-2's; RMSNorm weights one. */
static loom_status gpt_llama_build_table(loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    int64_t C = c->dim, L = c->layers, hs = C / c->heads, KV = (int64_t)c->kv_heads * hs;
    int64_t F = c->ffn_dim;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    loom_param_table *t = &m->table;
    int64_t sh[3] = {0, 0, 0};
    char name[LOOM_PARAM_NAME_MAX];
#define ADD2(nm, a, b, layer, init, sd, split)                          \
    do {                                                                \
        sh[0] = (a), sh[1] = (b);                                       \
        LOOM_TRY(loom_params_add(t, nm, (b) ? 2 : 1, sh, layer, init, sd)); \
        LOOM_TRY(gpt_place_last(m, split));                                 \
    } while (0)
    /* a pipeline stage (gpt_stage.c) adds only what it holds: wte on the first, its blocks,
     * ln_f and lm_head on the last (tied: wte there too, as GPT-2's) */
    if (m->has_embed || (m->has_head && c->tie_embeddings)) {
        ADD2("wte", c->vocab_padded, C, -1, LOOM_INIT_NORMAL, std, 0);
        t->entries[t->count - 1].init_rows = c->vocab; /* padding rows start at zero */
    }
    for (int l = 0; l < L; l++) {
        if (m->ent0)
            m->ent0[l] = t->count;
        if (!m->own[l])
            continue;
#define LAYER(suffix, a, b, init, sd, split)                \
    snprintf(name, sizeof name, "h.%d.%s", l, suffix);     \
    ADD2(name, a, b, l, init, sd, split)
        LAYER("ln_1.weight", C, 0, LOOM_INIT_ONES, 0, -1);
        LAYER("attn.q.weight", C, C, LOOM_INIT_NORMAL, std, 0);
        LAYER("attn.k.weight", KV, C, LOOM_INIT_NORMAL, std, 0);
        LAYER("attn.v.weight", KV, C, LOOM_INIT_NORMAL, std, 0);
        LAYER("attn.proj.weight", C, C, LOOM_INIT_NORMAL, proj_std, 1);
        LAYER("ln_2.weight", C, 0, LOOM_INIT_ONES, 0, -1);
        if (gpt_moe_block(c, l)) { /* a router and SwiGLU experts instead of mlp.* (moe.h) */
            LOOM_TRY(gpt_moe_add_entries(m, l, std, proj_std));
            continue;
        }
        LAYER("mlp.gate.weight", F, C, LOOM_INIT_NORMAL, std, 0);
        LAYER("mlp.up.weight", F, C, LOOM_INIT_NORMAL, std, 0);
        LAYER("mlp.proj.weight", C, F, LOOM_INIT_NORMAL, proj_std, 1);
#undef LAYER
    }
    if (m->ent0)
        m->ent0[L] = t->count;
    if (m->has_head)
        ADD2("ln_f.weight", C, 0, -1, LOOM_INIT_ONES, 0, -1);
    if (m->has_head && !c->tie_embeddings) {
        ADD2("lm_head.weight", c->vocab_padded, C, -1, LOOM_INIT_NORMAL, std, 0);
        t->entries[t->count - 1].init_rows = c->vocab;
    }
#undef ADD2
    return LOOM_OK;
}

/* Point p at the llama table's entries; the fused products' weights are their first part,
 * which needs the parts back to back (no alignment gap): checked in gpt_llama_check_fused. */
static void gpt_llama_bind_params(loom_gpt *m, float *base, model_params *p)
{
    const loom_param_entry *e = m->table.entries;
    int i = 0, tied = m->cfg.tie_embeddings;
    p->wte = m->has_embed || (m->has_head && tied) ? base + e[i++].offset : NULL;
    for (int l = 0; l < m->cfg.layers; l++) {
        if (!m->own[l])
            continue;
        layer_params *w = &p->layer[l];
        memset(w, 0, sizeof *w);
        w->ln1w = base + e[i].offset;
        w->qkvw = base + e[i + 1].offset; /* q, then k, v */
        w->attprojw = base + e[i + 4].offset;
        w->ln2w = base + e[i + 5].offset;
        if (gpt_moe_block(&m->cfg, l)) { /* ln_1 .. ln_2, then moe.c's router and experts */
            i = m->ent0[l + 1];
            continue;
        }
        w->fcw = base + e[i + 6].offset; /* gate, then up */
        w->fcprojw = base + e[i + 8].offset;
        i += 9;
    }
    p->lnfw = m->has_head ? base + e[i++].offset : NULL;
    p->head = !m->has_head ? NULL : tied ? p->wte : base + e[i].offset;
}

/* The fused products read q|k|v and gate|up as one matrix each. */
static loom_status gpt_llama_check_fused(const loom_gpt *m)
{
    const loom_param_entry *b = m->table.entries + m->pre;
    for (int l = 0; l < m->cfg.layers; l++) {
        if (!m->own[l])
            continue;
        int pairs[3][2] = {{1, 2}, {2, 3}, {6, 7}};
        int moe = gpt_moe_block(&m->cfg, l); /* its experts' gate|up: moe.c checks them */
        for (int k = 0; k < (moe ? 2 : 3); k++)
            if (b[pairs[k][0]].offset + b[pairs[k][0]].numel != b[pairs[k][1]].offset)
                LOOM_FAIL(LOOM_ERR_INVALID, "model dim=%d: %s and %s are not back to back in "
                          "the parameter buffer (their slices must be multiples of 16 floats: "
                          "use a dim, ffn_dim and head size that are multiples of 16)",
                          m->cfg.dim, b[pairs[k][0]].name, b[pairs[k][1]].name);
        b = moe ? m->table.entries + m->ent0[l + 1] : b + 9;
    }
    return LOOM_OK;
}

/* Point p at the entries of base, in table order (the order build_table added them). */
static void bind_params(loom_gpt *m, float *base, model_params *p)
{
    const loom_param_entry *e = m->table.entries;
    int i = 0;
    if (m->llama) {
        gpt_llama_bind_params(m, base, p);
        return;
    }
    p->wte = m->has_embed || m->has_head ? base + e[i++].offset : NULL;
    p->wpe = m->has_embed ? base + e[i++].offset : NULL;
    for (int l = 0; l < m->cfg.layers; l++) {
        if (!m->own[l])
            continue;
        /* layer_params is 12 float pointers, declared in table order */
        float **f = (float **)&p->layer[l];
        int dense = !gpt_moe_block(&m->cfg, l); /* an MoE block: ln_1 .. ln_2, then moe.c's */
        for (int k = 0; k < (dense ? 12 : 8); k++)
            f[k] = base + e[i++].offset;
        if (!dense)
            i = m->ent0[l + 1];
    }
    p->lnfw = m->has_head ? base + e[i++].offset : NULL;
    p->lnfb = m->has_head ? base + e[i].offset : NULL;
    p->head = p->wte;
}

/* The scratch set recomputation writes (gpt.h): all of one block's activations but its
 * output when some block is recomputed fully, else the attention probabilities and the
 * GELU output when some is selective, else nothing. Laid out from base like the slot. */
static size_t lay_out_shared(loom_gpt *m, float *base, layer_acts *s)
{
    size_t B = (size_t)m->max_B, T = (size_t)m->max_T, C = (size_t)m->cfg.dim;
    size_t Fl = (size_t)m->Fl, Cl = (size_t)m->Cl, R = B * T, Rl = m->sp ? R / (size_t)m->tp : R;
    size_t att = 0, off = 0, QKV = (size_t)m->qkv_w, FC = (size_t)m->fc_w;
    int full = 0, selective = 0, a16 = 0; /* a16: a kept block's floats are these too */
    for (int l = 0; l < m->cfg.layers; l++) {
        full |= m->own[l] && m->rc[l] == RC_FULL;
        selective |= m->own[l] && m->rc[l] == RC_SELECTIVE;
        a16 |= m->a16 && m->own[l] && m->rc[l] != RC_FULL;
        size_t n = gpt_att_block_n(m, l); /* the recomputed blocks' largest (gpt_att.c) */
        att = m->own[l] && m->rc[l] != RC_KEEP && !gpt_frozen_att(m, l) && n > att ? n : att;
    }
    memset(s, 0, sizeof *s);
#define TAKE(n) (off += (n), base ? base + off - (n) : NULL)
    if (full || a16) {
        s->ln1 = TAKE(Rl * C); s->ln1_mean = TAKE(Rl); s->ln1_rstd = TAKE(Rl);
        s->qkv = TAKE(R * QKV); s->atty = TAKE(R * Cl); s->res2 = TAKE(Rl * C);
        s->ln2 = TAKE(Rl * C); s->ln2_mean = TAKE(Rl); s->ln2_rstd = TAKE(Rl);
        s->fch = TAKE(R * FC);
    }
    if (full || selective)
        s->att = TAKE(att);
    if (full || selective || a16)
        s->fch_gelu = TAKE(R * Fl);
#undef TAKE
    return off;
}

/* Lay the activation buffers out from base (one slot) and the recomputation scratch set
 * s, and return how many floats the slot takes. Called twice: with base NULL to measure
 * (pointers are left NULL), then to assign, so the size and the layout cannot disagree. */
static size_t lay_out_activations(loom_gpt *m, float *base, const layer_acts *s)
{
    size_t B = (size_t)m->max_B, T = (size_t)m->max_T, C = (size_t)m->cfg.dim;
    size_t Cl = (size_t)m->Cl, Fl = (size_t)m->Fl, Vl = (size_t)m->Vl;
    size_t L = (size_t)m->cfg.layers, R = B * T, Rl = m->sp ? R / (size_t)m->tp : R;
    size_t QKV = (size_t)m->qkv_w, FC = (size_t)m->fc_w;
    size_t wide = QKV > FC ? QKV : FC, off = 0, scratch = m->att_scratch_n;
    for (size_t l = 0; l < L; l++) /* a block keeping its probabilities: the batched backward */
        if (m->own[l] && gpt_att_forced(m, (int)l) && m->att_keep_scratch_n > scratch)
            scratch = m->att_keep_scratch_n;
#define TAKE(n) (off += (n), base ? base + off - (n) : NULL)
#define TAKE_FULL(local) (m->sp ? TAKE(R * C) : (local)) /* all rows: its own buffer under sp */
    m->gathered = m->sp ? TAKE(R * C) : NULL;
#define GATHERED(local) (m->sp ? m->gathered : (local))
    float *pass[2] = {NULL, NULL}; /* a frozen model's block outputs not kept (gpt.h) */
    int turn = 0, taken[2] = {0, 0}; /* (pass stays NULL while measuring: base NULL) */
    for (size_t l = 0; l < L; l++) {
        layer_acts *a = &m->acts[l];
        if (!m->own[l])
            continue; /* another pipeline stage's block */
        if (m->rc[l] == RC_FULL) { /* only the output is kept: the rest is the scratch set */
            *a = *s;
            a->ln1_full = GATHERED(a->ln1);
            a->ln2_full = GATHERED(a->ln2);
            if (!m->frozen || (m->keep_out && m->keep_out[l])) {
                a->res3 = TAKE(Rl * C);
            } else { /* the other buffer than the one the block below wrote, which it reads */
                if (!taken[turn]) {
                    pass[turn] = TAKE(Rl * C);
                    taken[turn] = 1;
                }
                a->res3 = pass[turn];
                turn ^= 1;
            }
            if (gpt_frozen_att(m, (int)l)) /* read after the forward: not the scratch set's */
                a->att = TAKE(gpt_att_block_n(m, (int)l));
            continue;
        }
        int sel = m->rc[l] == RC_SELECTIVE;
        size_t att = gpt_att_block_n(m, (int)l); /* att_n, or a kept block's (gpt_att.c) */
        if (m->a16) { /* 16-bit copies here, the floats in the scratch set (gpt_internal.h) */
            size_t n[GPT_A16_N];
            gpt_act16_sizes(m, (int)l, R, n);
            for (int i = 0; i < GPT_A16_N; i++) /* n 16-bit values: n/2 floats, 64-byte aligned */
                a->s16[i] = n[i] ? (void *)TAKE((n[i] + 31) / 32 * 16) : NULL;
            a->ln1 = s->ln1; a->qkv = s->qkv; a->atty = s->atty; a->res2 = s->res2;
            a->ln2 = s->ln2; a->fch = s->fch; a->fch_gelu = s->fch_gelu;
            a->ln1_full = GATHERED(a->ln1); a->ln2_full = GATHERED(a->ln2);
            a->ln1_mean = TAKE(Rl); a->ln1_rstd = TAKE(Rl); a->ln2_mean = TAKE(Rl);
            a->ln2_rstd = TAKE(Rl); a->att = sel ? s->att : TAKE(att); a->res3 = TAKE(Rl * C);
            a->dfch = a->ln_part = a->dqkv = NULL; /* no split backward (set_precision) */
            continue;
        }
        a->ln1 = TAKE(Rl * C); a->ln1_mean = TAKE(Rl); a->ln1_rstd = TAKE(Rl);
        a->ln1_full = GATHERED(a->ln1);
        a->qkv = TAKE(R * QKV); a->atty = TAKE(R * Cl); a->att = sel ? s->att : TAKE(att);
        a->res2 = TAKE(Rl * C); a->ln2 = TAKE(Rl * C); a->ln2_mean = TAKE(Rl);
        a->ln2_rstd = TAKE(Rl); a->ln2_full = GATHERED(a->ln2);
        a->fch = TAKE(R * FC); a->fch_gelu = sel ? s->fch_gelu : TAKE(R * Fl);
        a->res3 = TAKE(Rl * C);
        a->dfch = m->split ? TAKE(R * FC) : NULL;
        a->ln_part = m->split ? TAKE(4 * C) : NULL;
        /* d(qkv) for W: over fch unless W reruns SwiGLU/GELU from fch or it does not fit */
        a->dqkv = m->split && (sel || QKV > FC) ? TAKE(R * QKV) : NULL;
    }
    m->encoded = TAKE(Rl * C); m->lnf = TAKE(Rl * C); m->lnf_mean = TAKE(Rl);
    m->lnf_rstd = TAKE(Rl); m->lnf_full = GATHERED(m->lnf);
    size_t head = m->has_head ? R : 0; /* only the last pipeline stage computes logits */
    m->logits = TAKE(head * Vl); m->losses = TAKE(head); m->ce_max = TAKE(head);
    m->ce_stats = TAKE(2 * head);
    m->partial = TAKE(R * C); m->summed = m->sp ? TAKE(Rl * C) : m->partial;
    for (int i = 0; i < 3; i++) /* canonical mode's row-parallel sums (a frozen model's too:
                                 * its forward sums through them) */
        m->tree[i] = m->canonical ? TAKE(R * C) : NULL;
    if (m->frozen) { /* no backward: none of its scratch */
        m->dres = m->dres_full = m->dtmp = m->dpartial = m->dsummed = NULL;
        m->dbuf_4a = m->dbuf_4b = m->datt_scratch = m->rep_grad = NULL;
        m->emb_grad = m->dx_out = m->lnf_part = NULL;
        goto done;
    }
    m->dres = TAKE(Rl * C); m->dres_full = TAKE_FULL(m->dres); m->dtmp = TAKE(Rl * C);
    m->dpartial = TAKE(R * C); m->dsummed = m->sp ? TAKE(Rl * C) : m->dpartial;
    m->dbuf_4a = TAKE(R * wide); m->dbuf_4b = TAKE(R * wide);
    m->datt_scratch = TAKE(scratch); m->rep_grad = TAKE(6 * C);
    m->emb_grad = m->canonical && m->has_embed ? TAKE((size_t)Vl * C) : NULL;
    m->dx_out = m->split ? TAKE(Rl * C) : NULL;
    m->lnf_part = m->split ? TAKE(2 * C) : NULL;
done:
#undef GATHERED
#undef TAKE_FULL
#undef TAKE
    return off;
}

/* Point the activation buffers at slot `slot` (of m->slots: a pipeline stage keeps one set
 * per micro-batch in flight; everything else has one). */
void gpt_bind_slot(loom_gpt *m, int slot)
{
    layer_acts s;
    lay_out_shared(m, (float *)m->act_mem, &s);
    size_t R = (size_t)m->max_B * (size_t)m->max_T, total = lay_out_activations(m, NULL, &s);
    float *f = (float *)((char *)m->act_mem + m->shared_bytes + (size_t)slot * m->slot_bytes);
    lay_out_activations(m, f, &s);
    m->tokens = (int *)(f + total);
    m->targets = m->tokens + R;
    gpt_moe_bind_slot(m, slot); /* its routing and expert buffers (moe.h) */
    m->cur_slot = slot;         /* distillation's per-slot state (gpt_distill.h) */
}

/* m->shared_bytes, slot_bytes and act_bytes from the layout (loom_gpt_footprint too). */
static void size_activations(loom_gpt *m)
{
    layer_acts s;
    gpt_att_size(m, &m->att_n, &m->att_scratch_n, &m->att_fused); /* gpt_att.c */
    gpt_att_size_kept(m, &m->att_keep_n, &m->att_keep_scratch_n); /* att_keep's blocks */
    size_t shared = lay_out_shared(m, NULL, &s);
    size_t R = (size_t)m->max_B * (size_t)m->max_T, total = lay_out_activations(m, NULL, &s);
    m->shared_bytes = (shared * sizeof(float) + 63) / 64 * 64;
    m->slot_bytes = (total * sizeof(float) + 2 * R * sizeof(int) + 64 + 63) / 64 * 64;
    m->act_bytes = m->shared_bytes + m->slot_bytes * (size_t)m->slots;
}

static loom_status alloc_activations(loom_gpt *m)
{
    size_t R = (size_t)m->max_B * (size_t)m->max_T;
    size_activations(m);
    m->act_mem = m->be->ops->alloc(m->be->self, m->act_bytes);
    if (!m->act_mem)
        LOOM_FAIL(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB of activations for %d x batch %d x %d",
                  (double)m->act_bytes / (1 << 20), m->slots, m->max_B, m->max_T);
    gpt_bind_slot(m, 0);
    m->host_losses = malloc(R * sizeof(float));
    free(m->ce_dloss);
    m->ce_dloss = calloc((size_t)m->slots, sizeof(float));
    m->row_gather = m->be->ops->alloc(m->be->self, (size_t)m->cfg.vocab_padded * sizeof(float));
    return m->host_losses && m->ce_dloss && m->row_gather ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "out of memory");
}

/* Divisibility the split needs, named in the message with what would work. */
static loom_status check_split(const loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    int tp = m->tp;
    if (m->llama)
        LOOM_TRY(gpt_llama_check_split(m));
    if (tp > 1 && (c->heads % tp != 0 || c->vocab_padded % tp != 0))
        LOOM_FAIL(LOOM_ERR_INVALID, "tensor parallelism tp=%d must divide heads=%d and the padded "
                  "vocabulary %d", tp, c->heads, c->vocab_padded);
    const int chunks = LOOM_CANONICAL_CHUNKS;
    if (m->canonical && (c->dim % chunks || c->vocab_padded % chunks || chunks % tp))
        LOOM_FAIL(LOOM_ERR_INVALID, "canonical mode sums in %d fixed chunks: dim=%d and the padded "
                  "vocabulary %d must divide by %d, and tp=%d must divide %d", chunks, c->dim,
                  c->vocab_padded, chunks, tp, chunks);
    /* B's output gradients would have to be gathered over the sequence and kept for W: a
     * full-rows buffer per linear per slot that gpt_backward_split.c does not have */
    if (m->split && m->sp)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "the split backward (schedule zb1, or a list with "
                  "BWD_INPUT / BWD_WEIGHT) does not run under sequence parallelism yet: use "
                  "gpipe, 1f1b or interleaved with tp_sequence_parallel, or leave it out");
    return LOOM_OK;
}

/* m->rc from loom_gpt_parallel.recompute (gpt.h). */
static loom_status recompute_modes(loom_gpt *m, const loom_gpt_parallel *par)
{
    int mode = par ? par->recompute : LOOM_RECOMPUTE_NONE, L = m->cfg.layers;
    if (mode < LOOM_RECOMPUTE_NONE || mode > LOOM_RECOMPUTE_LAYERS)
        LOOM_FAIL(LOOM_ERR_INVALID, "recompute mode %d is not one of none (0), full (1), "
                  "selective (2), layers (3)", mode);
    if (mode == LOOM_RECOMPUTE_LAYERS && !par->recompute_layers)
        LOOM_FAIL(LOOM_ERR_INVALID, "recompute by layers needs recompute_layers (one flag per "
                  "block)");
    for (int l = 0; l < L; l++)
        m->rc[l] = mode == LOOM_RECOMPUTE_FULL ? RC_FULL
                   : mode == LOOM_RECOMPUTE_SELECTIVE ? RC_SELECTIVE
                   : mode == LOOM_RECOMPUTE_LAYERS && par->recompute_layers[l] ? RC_FULL : RC_KEEP;
    /* The split backward's W reads activations its B overwrote with gradients (gpt_backward_
     * split.c) and runs after other micro-batches' passes: a block's forward cannot be rerun
     * there (its input is a gradient by then). Selective recomputation works: W reruns only
     * the GELU, from fch, which B then leaves alone (a->dqkv). */
    for (int l = 0; l < L; l++)
        if (m->split && m->rc[l] == RC_FULL)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "recompute = \"full\" (or a list of blocks) with a "
                      "split backward (schedule = \"zb1\") not yet: use recompute = "
                      "\"selective\" or \"none\" there, or schedule = \"1f1b\"");
    return LOOM_OK;
}

/* Everything loom_gpt_create decides before it allocates: widths, the stage's blocks,
 * recomputation, the parameter table. plan_tp > 0 (loom_gpt_footprint, no tp strategy):
 * the tp degree and sequence parallelism a tp plugin's layout would give. */
static loom_status gpt_setup(loom_gpt *m, const loom_gpt_config *cfg, int max_B,
                             const loom_gpt_parallel *par, int plan_tp, int plan_sp)
{
    m->cfg = *cfg;
    if (!m->cfg.vocab_padded)
        m->cfg.vocab_padded = (cfg->vocab + 127) / 128 * 128;
    m->max_B = max_B;
    m->max_T = par && par->max_T > 0 ? par->max_T : cfg->ctx;
    m->tp = 1;
    loom_status st = LOOM_OK;
    m->slots = 1;
    m->own = calloc((size_t)cfg->layers, 1);
    if (m->own)
        memset(m->own, 1, (size_t)cfg->layers);
    if (par) {
        m->canonical = par->canonical;
        m->tp_ops = par->tp_ops;
        m->tp_self = par->tp_self;
        if (par->stage_layers && m->own)
            memcpy(m->own, par->stage_layers, (size_t)cfg->layers);
        if (par->slots > 1)
            m->slots = par->slots;
        m->split = par->split_backward;
        m->frozen = par->frozen;
        m->ep_ops = par->ep_ops;
        m->ep_comm = par->ep_comm;
        m->ep_dops = par->ep_dops ? par->ep_dops : par->ep_ops;
        m->ep_dcomm = par->ep_dops ? par->ep_dcomm : par->ep_comm;
        m->ep = par->ep > 1 ? par->ep : 1;
        m->ep_rank = par->ep > 1 ? par->ep_rank : 0;
    }
    if (!par || par->ep <= 1)
        m->ep = 1;
    m->rc = calloc((size_t)cfg->layers, 1);
    if (st == LOOM_OK)
        st = m->rc ? recompute_modes(m, par) : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK && m->frozen) { /* forward only (gpt.h): every block in the scratch set */
        if (m->split)
            st = loom_fail(LOOM_ERR_INVALID, "a frozen model runs no backward: it takes no "
                           "split_backward");
        memset(m->rc, RC_FULL, (size_t)cfg->layers);
        if (st == LOOM_OK && par->keep_outputs) {
            if ((m->keep_out = malloc((size_t)cfg->layers)))
                memcpy(m->keep_out, par->keep_outputs, (size_t)cfg->layers);
            else
                st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
        }
    }
    m->has_embed = m->own && m->own[0];
    m->has_head = m->own && m->own[cfg->layers - 1];
    m->staged = 0;
    for (int l = 0; m->own && l < cfg->layers; l++)
        m->staged |= !m->own[l];
    if (m->tp_ops && m->tp_ops->layout) {
        loom_parallel_layout lay;
        st = m->tp_ops->layout(m->tp_self, &lay);
        m->tp = lay.parts;
        m->tp_rank = lay.index;
        m->sp = lay.sequence_parallel && lay.parts > 1;
    } else if (plan_tp > 0) {
        m->tp = plan_tp;
        m->sp = plan_sp && plan_tp > 1;
    }
    m->Cl = cfg->dim / m->tp;
    m->NHl = cfg->heads / m->tp;
    m->Fl = 4 * cfg->dim / m->tp;
    m->KVl = m->Cl;
    m->KVHl = m->NHl;
    m->qkv_w = 3 * m->Cl;
    m->fc_w = m->Fl;
    m->pre = 2; /* wte, wpe */
    m->per_layer = 12;
    m->post = 2; /* ln_f weight, bias */
    if (cfg->family == LOOM_FAMILY_LLAMA)
        gpt_llama_widths(m);
    m->Vl = m->cfg.vocab_padded / m->tp;
    m->v0 = m->tp_rank * m->Vl;
    if (m->be && m->be->ops->set_deterministic)
        m->be->ops->set_deterministic(m->be->self, m->canonical);
    m->p.layer = calloc((size_t)cfg->layers, sizeof(layer_params));
    m->g.layer = calloc((size_t)cfg->layers, sizeof(layer_params));
    m->acts = calloc((size_t)cfg->layers, sizeof(layer_acts));
    if (st == LOOM_OK && cfg->moe.experts && !(m->ent0 = calloc((size_t)cfg->layers + 1, sizeof(int))))
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK && (m->max_T < 1 || m->max_T > cfg->ctx))
        st = loom_fail(LOOM_ERR_INVALID, "activations sized for sequences of %d tokens, outside "
                       "the model's ctx=%d: give max_T in [1, ctx], or 0 for ctx", m->max_T, cfg->ctx);
    if (st == LOOM_OK)
        st = check_split(m);
    if (st == LOOM_OK)
        st = (m->p.layer && m->g.layer && m->acts && m->own) ? build_table(m)
                                                   : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK && m->llama)
        st = gpt_llama_check_fused(m);
    return st;
}

/* The model's flat buffers: from the backend (which zeroes them, so every page is resident
 * from the start), or on host memory mapped untouched, whose zero pages become resident
 * only where written: ZeRO-3's full-size buffers, of which a rank writes only the units in
 * use. Not calloc: under MALLOC_PERTURB_ (meson's test runner sets it) glibc's calloc
 * writes every byte. */
static float *model_buffer(loom_gpt *m, size_t bytes, int untouched, int *mapped)
{
    *mapped = 0;
    if (!untouched)
        return m->be->ops->alloc(m->be->self, bytes);
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    *mapped = 1;
    return p;
}

/* The model's parameter or gradient buffer, however it was had: the backend's alloc, an
 * untouched mmap (ZeRO-3's partitioned construction), or a vm_reserve range (ZeRO-2/3's
 * sparse device buffers, loom_gpt_use_sparse_buffer). */
static void free_model_buffer(loom_gpt *m, float *p, int mapped, int sparse)
{
    if (!p)
        return;
    if (sparse)
        m->be->ops->vm_release(m->be->self, p);
    else if (mapped)
        munmap(p, m->table.total ? m->table.total * sizeof(float) : 1);
    else
        m->be->ops->free(m->be->self, p);
}

loom_status loom_gpt_create(const loom_gpt_config *cfg, loom_backend *be, int max_B, uint64_t seed,
                            const loom_gpt_parallel *par, loom_gpt **out)
{
    *out = NULL;
    LOOM_TRY(loom_gpt_config_check(cfg));
    if (max_B < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "micro-batch size must be at least 1, got %d", max_B);
    loom_gpt *m = calloc(1, sizeof *m);
    if (!m)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    m->be = be;
    loom_status st = gpt_setup(m, cfg, max_B, par, 0, 0);
    if (st == LOOM_OK) {
        size_t bytes = m->table.total * sizeof(float);
        int device = loom_backend_device_memory(be);
        int undrawn = par && par->undrawn && !device; /* ZeRO-3 draws the partitions */
        m->params = model_buffer(m, bytes, undrawn, &m->params_mapped);
        if (!m->frozen) /* a frozen model has no gradients (gpt.h) */
            m->grads = model_buffer(m, bytes, par && par->lazy_grads && !device, &m->grads_mapped);
        /* host memory (the CPU backend): drawn in place, without a second full-size copy
         * (it set the start-up peak of the resident set, which ZeRO-3 runs are sized by) */
        float *host = device ? malloc(bytes) : NULL;
        if (!m->params || (!m->grads && !m->frozen) || (device && !host)) {
            st = loom_fail(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB for parameters",
                           (m->frozen ? 1.0 : 2.0) * (double)bytes / (1 << 20));
        } else {
            if (!undrawn)
                loom_params_init_values(&m->table, seed, host ? host : m->params);
            if (host)
                be->ops->copy_to_device(be->self, m->params, host, bytes);
            bind_params(m, m->params, &m->p);
            if (m->grads) /* (frozen: m->g stays NULL pointers) */
                bind_params(m, m->grads, &m->g);
            st = gpt_moe_create(m, seed);
            if (st == LOOM_OK)
                st = alloc_activations(m);
            if (st == LOOM_OK && m->llama)
                st = gpt_llama_rope_cache(m);
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

/* What gpt_setup allocated (the table and the per-layer bindings), and m itself: the end
 * of both a model and a footprint. */
static void gpt_free_setup(loom_gpt *m)
{
    free(m->p.layer);
    free(m->g.layer);
    free(m->acts);
    free(m->own);
    free(m->rc);
    free(m->att_keep);
    free(m->keep_out);
    free(m->span_lo); /* (span_hi: the same allocation) */
    loom_params_free(&m->table);
    free(m);
}

void loom_gpt_destroy(loom_gpt *m)
{
    if (!m)
        return;
    const loom_backend_ops *ops = m->be->ops;
    free_model_buffer(m, m->params, m->params_mapped, m->params_sparse);
    free_model_buffer(m, m->grads, m->grads_mapped, m->grads_sparse);
    gpt_w16_free(m);
    ops->free(m->be->self, m->act_mem);
    gpt_att_free(m);
    gpt_moe_destroy(m);
    free(m->ent0);
    ops->free(m->be->self, m->rope_cos);
    ops->free(m->be->self, m->rope_sin);
    free(m->host_losses);
    free(m->ce_dloss);
    ops->free(m->be->self, m->row_gather);
    gpt_distill_free(m);
    gpt_free_setup(m);
}

loom_status loom_gpt_footprint(const loom_gpt_config *cfg, int max_B, const loom_gpt_parallel *par,
                               int tp, int sequence_parallel, loom_dtype param_dt,
                               loom_dtype act_dt, const loom_cuda_attention_mode *cuda_att,
                               const unsigned char *keep_att, loom_gpt_footprint_bytes *out)
{
    memset(out, 0, sizeof *out);
    LOOM_TRY(loom_gpt_config_check(cfg));
    if (max_B < 1 || tp < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "footprint: micro-batch %d and tp %d must be at least 1", max_B, tp);
    if (par && par->tp_ops)
        LOOM_FAIL(LOOM_ERR_INVALID, "footprint: give tp as a number, not a strategy");
    loom_gpt *m = calloc(1, sizeof *m);
    if (!m)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    loom_status st = gpt_setup(m, cfg, max_B, par, tp, sequence_parallel);
    int w16 = param_dt != LOOM_DTYPE_F32, a16 = act_dt != LOOM_DTYPE_F32;
    if (st == LOOM_OK) {
        m->a16 = a16 && !m->split; /* loom_gpt_set_precision's condition */
        m->act_dt = act_dt;        /* (its attention calls' dtype: gpt_att.c) */
        if (cuda_att) {            /* the CUDA backend's attention in training's mode */
            m->plan_cuda = 1;
            m->plan_att = *cuda_att;
            m->plan_att.deterministic = m->canonical;
        }
        if (keep_att && !(m->att_keep = malloc((size_t)cfg->layers))) /* (gpt_free_setup frees it) */
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
        else if (keep_att)
            memcpy(m->att_keep, keep_att, (size_t)cfg->layers);
    }
    if (st == LOOM_OK) {
        size_activations(m);
        if (w16) /* gpt_precision.c: the 16-bit compute copy, the fp32 widening scratch */
            st = gpt_w16_layout(m, NULL);
    }
    if (st == LOOM_OK) {
        if (w16) {
            out->compute_params = m->table.total * sizeof(uint16_t);
            out->widen = (m->wide_cap + m->edge_n) * sizeof(float);
        }
        size_t moe_host, moe = gpt_moe_size(m, &moe_host); /* the MoE blocks' buffers */
        out->param_floats = m->table.total;
        out->activations = m->act_bytes + moe;
        out->host = ((size_t)max_B * (size_t)m->max_T * (w16 ? 2 : 1) + (size_t)m->cfg.vocab_padded) *
                        sizeof(float) + moe_host; /* (w16: gpt_w16_setup's host tokens) */
        out->slot = m->slot_bytes;
        out->shared = m->shared_bytes;
        out->num_params = loom_gpt_num_params(m);
        out->entries = (size_t)m->table.count;
        out->att_floats = m->att_n;
        out->att_fused = m->att_fused;
    }
    gpt_free_setup(m);
    return st;
}

const loom_gpt_config *loom_gpt_get_config(const loom_gpt *m) { return &m->cfg; }
const loom_param_table *loom_gpt_params(const loom_gpt *m) { return &m->table; }
float *loom_gpt_param_data(loom_gpt *m) { return m->params; }
float *loom_gpt_grad_data(loom_gpt *m) { return m->grads; }
loom_backend *loom_gpt_backend(loom_gpt *m) { return m->be; }
const float *loom_gpt_logits(const loom_gpt *m) { return m->logits; }
size_t loom_gpt_activation_bytes(const loom_gpt *m) /* the spill too: gpt_att.c */
{
    return m->act_bytes + gpt_moe_bytes(m) + m->att_spill_n * sizeof(float);
}
size_t loom_gpt_saved_activation_bytes(const loom_gpt *m) { return gpt_saved_activation_bytes(m); }

int loom_gpt_tied_head(const loom_gpt *m) { return !m->llama || m->cfg.tie_embeddings; }

size_t loom_gpt_num_params(const loom_gpt *m)
{
    if (m->staged && m->llama) { /* a pipeline stage: the whole model's count from its shape */
        const loom_gpt_config *c = &m->cfg;
        size_t C = (size_t)c->dim, KV = (size_t)c->kv_heads * (C / (size_t)c->heads);
        size_t F = (size_t)c->ffn_dim;
        return (size_t)c->vocab * C * (c->tie_embeddings ? 1 : 2) +
               (size_t)c->layers * (2 * C * C + 2 * KV * C + 3 * F * C + 2 * C) + C;
    }
    if (m->staged) { /* a pipeline stage: the whole model's count from its shape */
        size_t C = (size_t)m->cfg.dim;
        return ((size_t)m->cfg.vocab + (size_t)m->cfg.ctx) * C +
               (size_t)m->cfg.layers * (12 * C * C + 13 * C) + 2 * C;
    }
    size_t heads_padded = m->llama && !m->cfg.tie_embeddings ? 2 : 1; /* wte, lm_head */
    return loom_params_count_logical(&m->table) + gpt_moe_params_elsewhere(m) -
           heads_padded * (size_t)(m->cfg.vocab_padded - m->cfg.vocab) * (size_t)m->cfg.dim;
}

void loom_gpt_use_sparse_buffer(loom_gpt *m, int which, float *sparse)
{
    float **buf = which ? &m->grads : &m->params;
    int *mapped = which ? &m->grads_mapped : &m->params_mapped;
    free_model_buffer(m, *buf, *mapped, 0);
    *mapped = 0;
    *buf = sparse;
    bind_params(m, sparse, which ? &m->g : &m->p);
    if (!which && m->c16) /* 16-bit weights: the passes read the compute copy's views, not
                           * the fp32 buffer bind_params points at */
        gpt_w16_bind(m);
    if (which)
        m->grads_sparse = 1;
    else
        m->params_sparse = 1;
}

void loom_gpt_zero_grad(loom_gpt *m)
{
    if (!m->grads)
        return; /* frozen: none */
    m->be->ops->zero(m->be->self, m->grads, m->table.total * sizeof(float));
}

/* The activation buffers laid out again (what sizes them changed); the pointers into them
 * handed out before (loom_gpt_block_output, _block_attention, _logits) are stale. */
static loom_status relay_activations(loom_gpt *m)
{
    m->be->ops->free(m->be->self, m->act_mem);
    m->act_mem = NULL;
    free(m->host_losses);
    m->host_losses = NULL;
    m->be->ops->free(m->be->self, m->row_gather);
    m->row_gather = NULL;
    return alloc_activations(m);
}

loom_status loom_gpt_keep_block_attention(loom_gpt *m, int l)
{
    if (l < 0 || l >= m->cfg.layers)
        LOOM_FAIL(LOOM_ERR_INVALID, "keep block %d's attention probabilities: the model has "
                  "blocks 0 .. %d", l, m->cfg.layers - 1);
    if (!m->att_keep && !(m->att_keep = calloc((size_t)m->cfg.layers, 1)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    if (m->att_keep[l])
        return LOOM_OK;
    m->att_keep[l] = 1;
    /* att is probabilities already, or the backend cannot turn its fused kernels off (the
     * term is refused: gpt_att_check_probabilities): the layout stays; but a frozen model's
     * block gets an att of its own (its att was the scratch set's, rewritten by the next) */
    if ((!gpt_att_forced(m, l) && !m->frozen) || !m->own[l])
        return LOOM_OK;
    return relay_activations(m);
}

loom_status loom_gpt_set_precision(loom_gpt *m, loom_dtype param, loom_dtype act)
{
    const loom_backend_ops *k = m->be->ops;
    for (int i = 0; i < 2; i++) {
        loom_dtype dt = i ? act : param;
        if (dt != LOOM_DTYPE_F32 && dt != LOOM_DTYPE_BF16 && dt != LOOM_DTYPE_F16)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "the GPT model stores %s in f32, bf16 or f16, not %s",
                      i ? "activations" : "weights", loom_dtype_name(dt));
    }
    if ((param != LOOM_DTYPE_F32 || act != LOOM_DTYPE_F32) &&
        (k->size <= offsetof(loom_backend_ops, round_to) || !k->round_to))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "this backend has no round_to: it cannot store bf16 or "
                  "f16 values (use precision = \"fp32\")");
    if ((param != LOOM_DTYPE_F32 || act != LOOM_DTYPE_F32) &&
        (!k->convert_from_f32 || !k->convert_to_f32)) /* 16-bit storage (gpt_precision.c) */
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "this backend has no convert_from_f32/convert_to_f32: "
                  "it cannot keep 16-bit weights or activations (use precision = \"fp32\")");
    m->act_dt = act;
    size_t att, scratch; /* the attention calls' dt can change their path (gpt_att.c) */
    int fused;
    gpt_att_size(m, &att, &scratch, &fused);
    int relay = att != m->att_n || scratch != m->att_scratch_n || fused != m->att_fused;
    if ((act != LOOM_DTYPE_F32 && !m->a16 && !m->split) || relay) { /* store what backward
                                              * reads in 16 bits: the buffers laid out again */
        m->a16 = m->a16 || (act != LOOM_DTYPE_F32 && !m->split);
        LOOM_TRY(relay_activations(m));
    }
    if (param != LOOM_DTYPE_F32 && !m->c16) {
        m->param_dt = param;
        LOOM_TRY(gpt_w16_setup(m));
    }
    loom_gpt_refresh_params(m);
    return LOOM_OK;
}

void loom_gpt_refresh_params(loom_gpt *m)
{
    if (m->c16 && !m->param_use)
        gpt_w16_refresh(m);
    else if (m->c16)
        m->wide_unit = -1; /* ZeRO-3: narrowed unit by unit as gathered (use) */
}

void loom_gpt_refresh_all_params(loom_gpt *m)
{
    if (m->c16)
        gpt_w16_refresh(m);
}

size_t loom_gpt_compute_param_bytes(const loom_gpt *m)
{
    return m->c16 ? gpt_w16_bytes(m) : m->table.total * sizeof(float);
}

size_t loom_gpt_widen_bytes(const loom_gpt *m) { return gpt_w16_scratch_bytes(m); }

/* --- forward and backward ------------------------------------------------------------ */

/* One transformer block's forward, l: res3 = block(residual), over R = B*T rows, of which
 * this rank keeps Rl (R / tp under sequence parallelism, else R). loom_gpt_forward runs it
 * for every block, a pipeline stage (gpt_stage.c) for its own: one piece of block math. */
loom_status gpt_block_forward(loom_gpt *m, int l, const float *residual, int B, int T, size_t Rl)
{
    gpt_widen_block(m, l);
    if (m->llama)
        return gpt_llama_block_forward(m, l, residual, B, T, Rl);
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    const size_t R = (size_t)B * T;
    layer_params *w = &m->p.layer[l];
    layer_acts *a = &m->acts[l];
    /* gpt_round: each stored activation rounded where it is written (mixed precision);
     * the row-parallel outputs once summed over the group, with their bias */
    k->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, residual, w->ln1w, w->ln1b, 1,
                         (int)Rl, C);
    gpt_round(m, a->ln1, Rl * C);
    LOOM_TRY(F_ENTER(LOOM_REGION_ATTENTION, l, a->ln1, a->ln1_full, R, C));
    gpt_matmul_forward(m, a->qkv, a->ln1_full, w->qkvw, w->qkvb, B, T, C, 3 * Cl);
    gpt_round(m, a->qkv, R * 3 * Cl);
    gpt_attention_fwd(m, l, a->atty, a->att, a->qkv, B, T);
    gpt_round(m, a->atty, R * Cl);
    gpt_row_parallel_forward(m, m->partial, a->atty, w->attprojw, B, T, Cl);
    LOOM_TRY(F_LEAVE(LOOM_REGION_ATTENTION, l, m->partial, m->summed, R, C));
    k->bias_add(m->summed, w->attprojb, Rl, C);
    gpt_round(m, m->summed, Rl * C);
    k->residual_forward(a->res2, residual, m->summed, Rl * C);
    gpt_round(m, a->res2, Rl * C);
    k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, 1,
                         (int)Rl, C);
    gpt_round(m, a->ln2, Rl * C);
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* experts behind a router (moe.h) */
        if (gpt_moe_rerunning(m))
            return LOOM_OK; /* recomputation: the experts' part is kept, res3 too */
        LOOM_TRY(F_ENTER(LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R, C)); /* sp: all rows */
        LOOM_TRY(gpt_moe_forward(m, l, gpt_moe_router(m, l), a->ln2_full, m->partial, R));
        LOOM_TRY(gpt_moe_leave(m, l, 0, m->partial, m->summed, R)); /* sum over tp */
        gpt_round(m, m->summed, Rl * C);
        k->residual_forward(a->res3, a->res2, m->summed, Rl * C);
        gpt_round(m, a->res3, Rl * C);
        if (m->rc[l] != RC_FULL)
            gpt_acts_store(m, l, R); /* 16-bit activations: the attention's part, kept */
        return LOOM_OK;
    }
    LOOM_TRY(F_ENTER(LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R, C));
    gpt_matmul_forward(m, a->fch, a->ln2_full, w->fcw, w->fcb, B, T, C, Fl);
    gpt_round(m, a->fch, R * Fl);
    k->gelu_forward(a->fch_gelu, a->fch, R * Fl);
    gpt_round(m, a->fch_gelu, R * Fl);
    gpt_row_parallel_forward(m, m->partial, a->fch_gelu, w->fcprojw, B, T, Fl);
    LOOM_TRY(F_LEAVE(LOOM_REGION_MLP, l, m->partial, m->summed, R, C));
    k->bias_add(m->summed, w->fcprojb, Rl, C);
    gpt_round(m, m->summed, Rl * C);
    k->residual_forward(a->res3, a->res2, m->summed, Rl * C);
    gpt_round(m, a->res3, Rl * C);
    if (m->rc[l] != RC_FULL)
        gpt_acts_store(m, l, R); /* 16-bit activations: what backward reads, kept */
    return LOOM_OK;
}

/* One block's backward, l: m->dres in = d(res3), out = d(residual); parameter gradients
 * accumulate into m->g.layer[l], replicated ones through pk (flushed by the caller). */
loom_status gpt_block_backward(loom_gpt *m, int l, const float *residual, rep_pack *pk, int B,
                               int T, size_t Rl)
{
    gpt_widen_block(m, l);
    if (m->llama)
        return gpt_llama_block_backward(m, l, residual, pk, B, T, Rl);
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    const size_t R = (size_t)B * T;
    layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
    layer_acts *a = &m->acts[l];
    if (m->rc[l] == RC_FULL) { /* the same forward again, into the scratch set (its res3
                                * too: the same bits over the kept ones; moe.h's kept) */
        gpt_moe_rerun(m, 1);
        loom_status rs = gpt_block_forward(m, l, residual, B, T, Rl);
        gpt_moe_rerun(m, 0);
        LOOM_TRY(rs);
    } else {
        gpt_acts_load(m, l, R); /* 16-bit activations: the kept ones back into fp32 */
    }
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* res3 = res2 + moe(ln2(res2)) (moe.h) */
        LOOM_TRY(B_LEAVE(LOOM_REGION_MLP, l, m->dres, m->dres_full, R, C)); /* sp: all rows */
        LOOM_TRY(gpt_regather(m, LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R));
        LOOM_TRY(gpt_moe_backward(m, l, gpt_moe_router(m, l), m->dres_full, m->dpartial, R));
        LOOM_TRY(gpt_moe_leave(m, l, 1, m->dpartial, m->dsummed, R)); /* sum over tp */
        goto mlp_done;
    }
    /* MLP branch: res3 = res2 + g(proj(gelu(fc(f(ln2(res2)))))) + bias */
    rep_args pb = {.dout = m->dres};
    gpt_replicated_grads(m, pk, 1, &pb, NULL, g->fcprojb, Rl);
    LOOM_TRY(B_LEAVE(LOOM_REGION_MLP, l, m->dres, m->dres_full, R, C));
    if (m->rc[l] == RC_SELECTIVE) {
        k->gelu_forward(a->fch_gelu, a->fch, R * Fl);
        gpt_round(m, a->fch_gelu, R * Fl); /* as the forward stored it */
    }
    gpt_matmul_backward(m, m->dbuf_4a, g->fcprojw, NULL, m->dres_full, a->fch_gelu,
                        w->fcprojw, B, T, Fl, C);
    k->gelu_backward(m->dbuf_4b, a->fch, m->dbuf_4a, R * Fl);
    LOOM_TRY(gpt_regather(m, LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R));
    LOOM_TRY(gpt_column_parallel_backward(m, LOOM_REGION_MLP, l, g->fcw, g->fcb, m->dbuf_4b,
                                      a->ln2_full, w->fcw, B, T, Fl, 1));
mlp_done:;
    rep_args ln2 = {m->dtmp, m->dsummed, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd};
    gpt_replicated_grads(m, pk, 0, &ln2, g->ln2w, g->ln2b, Rl);
    k->accumulate(m->dres, m->dtmp, Rl * C);
    /* Attention branch: res2 = residual + g(proj(attn(qkv(f(ln1(residual)))))) + bias */
    rep_args ab = {.dout = m->dres};
    gpt_replicated_grads(m, pk, 1, &ab, NULL, g->attprojb, Rl);
    LOOM_TRY(B_LEAVE(LOOM_REGION_ATTENTION, l, m->dres, m->dres_full, R, C));
    float *datty = m->dpartial; /* free until the qkv backward below */
    gpt_matmul_backward(m, datty, g->attprojw, NULL, m->dres_full, a->atty, w->attprojw, B,
                        T, Cl, C);
    if (m->rc[l] == RC_SELECTIVE) /* the probabilities again; the output (kept) to dbuf_4b,
                                   * free until the MLP's next use */
        gpt_attention_fwd(m, l, m->dbuf_4b, a->att, a->qkv, B, T);
    gpt_attention_backward(m, l, m->dbuf_4a, datty, B, T); /* + a distillation term's */
    LOOM_TRY(gpt_regather(m, LOOM_REGION_ATTENTION, l, a->ln1, a->ln1_full, R));
    LOOM_TRY(gpt_column_parallel_backward(m, LOOM_REGION_ATTENTION, l, g->qkvw, g->qkvb,
                                      m->dbuf_4a, a->ln1_full, w->qkvw, B, T, 3 * Cl, 3));
    rep_args ln1 = {m->dtmp, m->dsummed, residual, w->ln1w, a->ln1_mean, a->ln1_rstd};
    gpt_replicated_grads(m, pk, 0, &ln1, g->ln1w, g->ln1b, Rl);
    k->accumulate(m->dres, m->dtmp, Rl * C);
    return LOOM_OK;
}

loom_status gpt_check_batch(const loom_gpt *m, int B, int T)
{
    if (B < 1 || B > m->max_B || T < 1 || T > m->cfg.ctx)
        LOOM_FAIL(LOOM_ERR_INVALID, "batch %dx%d outside the model's %dx%d", B, T, m->max_B,
                  m->cfg.ctx);
    if (T > m->max_T) /* gpt.h max_T: a distillation teacher is built at batch.seq */
        LOOM_FAIL(LOOM_ERR_INVALID, "a forward over %d tokens, but this model's activations were "
                  "built for sequences of at most %d (of its ctx=%d): build it with max_T >= %d",
                  T, m->max_T, m->cfg.ctx, T);
    return LOOM_OK;
}

int loom_gpt_max_seq(const loom_gpt *m) { return m->max_T; }

loom_status loom_gpt_forward(loom_gpt *m, const int *tokens, const int *targets, int B, int T,
                             float dloss, double *loss_sum)
{
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int C = m->cfg.dim, V = m->cfg.vocab;
    LOOM_TRY(gpt_check_batch(m, B, T));
    if (dloss != 0.0f && !targets)
        LOOM_FAIL(LOOM_ERR_INVALID, "a training forward needs targets");
    if (m->staged)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "this model is one pipeline stage: run it through the "
                  "pipeline engine (loom_gpt_stage_forward), not loom_gpt_forward");
    size_t R = (size_t)B * T;
    if (m->sp && R % (size_t)m->tp)
        LOOM_FAIL(LOOM_ERR_INVALID, "sequence parallelism splits the %d x %d = %zu token rows over "
                  "tp=%d ranks: they must divide", B, T, R, m->tp);
    if (m->canonical && dloss != 0.0f && R % LOOM_CANONICAL_CHUNKS)
        LOOM_FAIL(LOOM_ERR_INVALID, "canonical mode sums token rows in %d chunks: batch %d x %d = "
                  "%zu rows must divide by %d", LOOM_CANONICAL_CHUNKS, B, T, R,
                  LOOM_CANONICAL_CHUNKS);
    size_t Rl = m->sp ? R / (size_t)m->tp : R, row0 = m->sp ? (size_t)m->tp_rank * Rl : 0;
    for (size_t i = 0; i < R; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            LOOM_FAIL(LOOM_ERR_INVALID, "token %d at position %zu is outside the vocabulary "
                      "[0, %d)", tokens[i], i, V);
    LOOM_TRY(gpt_att_prepare(m, B, T)); /* gpt_att.c: the spill, where att is too small */
    k->copy_to_device(bs, m->tokens, tokens, R * sizeof(int));
    if (targets)
        k->copy_to_device(bs, m->targets, targets, R * sizeof(int));

    /* Embedding: each rank looks up its vocabulary rows (zeros elsewhere); the sum over the
     * group is the lookup. Positions are added once, to the rows this rank keeps. */
    float *embedded = m->tp_ops ? m->partial : m->encoded;
    LOOM_TRY(use(m, 0, 1));
    gpt_embed_lookup(m, embedded, m->tokens, tokens, R);
    LOOM_TRY(F_LEAVE(LOOM_REGION_EMBEDDING, -1, embedded, m->encoded, R, C));
    if (m->p.wpe) /* learned positions; the llama family's are rotary, in the blocks */
        k->position_forward(m->encoded, m->p.wpe, row0, Rl, T, C);
    gpt_round(m, m->encoded, Rl * C);
    const float *residual = m->encoded;
    gpt_moe_begin(m, dloss);
    for (int l = 0; l < m->cfg.layers; l++) {
        LOOM_TRY(use(m, 1 + l, 1));
        LOOM_TRY(gpt_block_forward(m, l, residual, B, T, Rl));
        if (targets && dloss != 0.0f)
            LOOM_TRY(gpt_distill_attn_forward(m, l, targets, B, T, dloss)); /* gpt_distill.h */
        LOOM_TRY(use(m, 1 + l, 0));
        residual = m->acts[l].res3;
    }
    LOOM_TRY(use(m, m->cfg.layers + 1, 1));
    gpt_final_norm_forward(m, residual, 0, Rl);
    gpt_round(m, m->lnf, Rl * C);
    LOOM_TRY(F_ENTER(LOOM_REGION_HEAD, -1, m->lnf, m->lnf_full, R, C));
    gpt_head_forward(m, m->logits, m->lnf_full, B, T);
    gpt_round(m, m->logits, R * (size_t)m->Vl);
    m->last_B = B;
    m->last_T = T;
    m->have_dlogits = 0;
    m->cache_len = B == 1 && !m->sp ? T : 0; /* the rows gpt_decode.c continues from */
    if (targets) {
        int distill = m->kd_teacher && dloss != 0.0f; /* gpt_distill.h: training only */
        if (distill)
            LOOM_TRY(gpt_distill_before(m, R, dloss));
        LOOM_TRY(gpt_vocab_cross_entropy(m, (int)R, dloss));
        if (distill)
            gpt_distill_after(m, R);
        if (dloss != 0.0f)
            LOOM_TRY(gpt_distill_hidden(m, targets, R, dloss)); /* gpt_distill.h: nothing unless set */
        m->have_dlogits = dloss != 0.0f;
        k->copy_to_host(bs, m->host_losses, m->losses, R * sizeof(float));
        double sum = 0.0;
        for (size_t i = 0; i < R; i++)
            sum += m->host_losses[i];
        if (loss_sum)
            *loss_sum = sum;
    }
    if (!m->have_dlogits) { /* no backward follows */
        LOOM_TRY(use(m, m->cfg.layers + 1, 0));
        LOOM_TRY(use(m, 0, 0));
    }
    return LOOM_OK;
}

loom_status loom_gpt_backward(loom_gpt *m)
{
    if (m->frozen)
        LOOM_FAIL(LOOM_ERR_INVALID, "a frozen model (a distillation teacher) runs forward only: "
                  "it has no gradients to compute");
    if (!m->have_dlogits || m->staged)
        LOOM_FAIL(LOOM_ERR_INVALID, "backward needs a forward with targets and dloss != 0 first");
    LOOM_TRY(gpt_att_check_backward(m));
    const loom_backend_ops *k = m->be->ops;
    int B = m->last_B, T = m->last_T, C = m->cfg.dim;
    int L = m->cfg.layers;
    size_t R = (size_t)B * T, Rl = m->sp ? R / (size_t)m->tp : R;
    const float *last = m->acts[L - 1].res3;
    LOOM_TRY(grad_write(m, L + 1)); /* the head writes ln_f's and wte's (tied) gradients */
    LOOM_TRY(grad_write(m, 0));

    /* LM head (tied to wte, vocabulary-parallel) and the final layernorm; dres starts as
     * d(last block output). */
    LOOM_TRY(gpt_regather(m, LOOM_REGION_HEAD, -1, m->lnf, m->lnf_full, R));
    LOOM_TRY(gpt_column_parallel_backward(m, LOOM_REGION_HEAD, -1, m->g.head, NULL, m->logits,
                                      m->lnf_full, m->p.head, B, T, m->Vl, 1));
    rep_pack pk = {.n = 0};
    rep_args lnf = {m->dres, m->dsummed, last, m->p.lnfw, m->lnf_mean, m->lnf_rstd};
    gpt_replicated_grads(m, &pk, gpt_norm_kind(m), &lnf, m->g.lnfw, m->g.lnfb, Rl);
    LOOM_TRY(gpt_rep_flush(m, &pk));
    gpt_distill_hidden_head(m); /* the projections' gradients (gpt_distill.h) */
    LOOM_TRY(use(m, L + 1, 0));
    LOOM_TRY(use(m, 0, 0)); /* the embedding's backward reads no weights */
    int n_entries = m->table.count;
    LOOM_TRY(entries_ready(m, n_entries - m->post, n_entries - 1));
    for (int l = L - 1; l >= 0; l--) {
        const float *residual = l == 0 ? m->encoded : m->acts[l - 1].res3;
        LOOM_TRY(use(m, 1 + l, 1));
        LOOM_TRY(grad_write(m, 1 + l));
        gpt_distill_hidden_backward(m, l, Rl); /* d(res3) += the hidden-state term's */
        LOOM_TRY(gpt_block_backward(m, l, residual, &pk, B, T, Rl));
        LOOM_TRY(gpt_rep_flush(m, &pk));
        LOOM_TRY(use(m, 1 + l, 0));
        int first, last;
        loom_gpt_unit_entries(m, 1 + l, &first, &last);
        if (m->ep > 1 && gpt_moe_block(&m->cfg, l))
            last = gpt_moe_router(m, l); /* up to the router: the experts are reduced over
                                          * their own group (the session's, after backward) */
        LOOM_TRY(entries_ready(m, first, last));
    }
    /* Embedding: every rank needs the gradient of all rows for its vocabulary slice; the
     * position gradient is then computed the same way on every rank. */
    LOOM_TRY(B_LEAVE(LOOM_REGION_EMBEDDING, -1, m->dres, m->dres_full, R, C));
    gpt_embedding_grad(m, m->dres_full, R);
    if (m->g.wpe)
        k->position_backward(m->g.wpe, m->dres_full, B, T, C);
    m->have_dlogits = 0;
    LOOM_TRY(entries_ready(m, 0, m->pre - 1));
    return LOOM_OK;
}

