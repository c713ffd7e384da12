/* gpt_precision.c — 16-bit weight storage (gpt.h: loom_gpt_set_precision with param bf16 or
 * f16): the compute copy the passes read is kept as 16-bit values (2 bytes a parameter),
 * and each use widens what it needs into fp32 right before its kernels:
 *   - a block's weights into `wide`, one block at a time (gpt_widen_block, at the top of
 *     every function that reads m->p.layer[l]; all blocks' pointers point into `wide`);
 *   - the small entries outside the blocks (wpe, ln_f) once per refresh, into `edge`;
 *   - the token embedding / LM head (wte, llama's lm_head) never whole: the lookup widens
 *     the rows it reads, the head's products widen a slice of rows (forward: a band of
 *     output columns) or of columns (backward's input gradient: a band of its columns),
 *     into `wide`, and run the backend's gemm on the slice.
 * Widening is exact, so every kernel sees the values the fp32 compute copy held before
 * this file existed; the products are split only along output rows or columns (never
 * along the summed dimension), whose bits do not depend on the split (gemm.c's "Order of
 * operations"), so the losses are bitwise those of the fp32 compute copy. (Except where a
 * block's forward product goes through the backend's matmul_forward_dt, bf16 activations
 * with bf16 weights: the CPU backend then runs vdpbf16ps in fast mode where the CPU has
 * AVX512_BF16, kernels/cpu/gemm_bf16.c, packing the widened weight back to bf16, exactly;
 * and the head's forward, which the backend's gemm_w16 then reads from the 16-bit copy
 * directly, unbanded; and, with LOOM_CPU_BF16DOT=all, the blocks' and head's backward
 * products through the backend's matmul_backward_dt, the fp32 gradient split into hi + lo
 * bf16 (gemm_bf16.c's header), the head's input gradient read from the 16-bit copy.
 * Their bits differ from sgemm's in the last places; canonical mode keeps sgemm's.)
 * 16-bit activations (m->a16): what a kept block saves for backward (gpt_act16_sizes) is
 * stored in 16 bits after its forward and widened back before its backward; the block's
 * float pointers share one scratch set (gpt.c's lay_out_shared), so the fp32 bytes are one
 * block's. The values were rounded to act_dt where written, so the round trip is exact.
 * Not here: the rounding of activations (gpt_round), the master weights (gpt.c).
 */
#include "gpt_internal.h"
#include "moe.h" /* gpt_moe_block */

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* The 16-bit value at flat offset off. */
static const void *c16_at(const loom_gpt *m, size_t off)
{
    return (const uint16_t *)m->c16 + off;
}

static void widen(loom_gpt *m, float *dst, size_t off, size_t n)
{
    m->be->ops->convert_to_f32(dst, c16_at(m, off), n, m->param_dt);
}

/* Flat span [*lo, *hi) of block l's entries (by their layer: a pipeline stage's table
 * holds only its blocks). */
static void block_span(const loom_gpt *m, int l, size_t *lo, size_t *hi)
{
    if (m->span_lo) { /* gpt_w16_layout's, every block's at once */
        *lo = m->span_lo[l];
        *hi = m->span_hi[l];
        return;
    }
    *lo = (size_t)-1;
    *hi = 0;
    for (int i = 0; i < m->table.count; i++) {
        const loom_param_entry *e = &m->table.entries[i];
        if (e->layer != l)
            continue;
        *lo = e->offset < *lo ? e->offset : *lo;
        *hi = e->offset + e->numel > *hi ? e->offset + e->numel : *hi;
    }
}

/* Entry i is read through `edge` (widened once per refresh): outside the blocks, and
 * neither the head nor wte (read slice by slice from the 16-bit copy). */
static int is_edge(const loom_gpt *m, int i)
{
    const loom_param_entry *e = &m->table.entries[i];
    if (e->offset == m->head_off || e->offset == m->wte_off)
        return 0;
    for (int l = 0; l < m->cfg.layers; l++) {
        size_t lo, hi;
        if (!m->own[l])
            continue;
        block_span(m, l, &lo, &hi);
        if (e->offset >= lo && e->offset < hi)
            return 0;
    }
    return 1;
}

/* Where a pointer of the master binding goes in the 16-bit one: NULL for wte and the head,
 * into `wide` for a block's entry, into `edge` for the rest. */
static float *relocate(loom_gpt *m, const float *p)
{
    if (!p)
        return NULL;
    size_t off = (size_t)(p - m->params);
    if (off == m->head_off || off == m->wte_off)
        return NULL;
    for (int l = 0; l < m->cfg.layers; l++) {
        size_t lo, hi;
        if (!m->own[l])
            continue;
        block_span(m, l, &lo, &hi);
        if (off >= lo && off < hi)
            return m->wide + (off - lo);
    }
    for (int i = 0; i < m->table.count; i++)
        if (m->table.entries[i].offset == off)
            return m->edge + m->edge_of[i];
    return NULL; /* not reached: every bound pointer is an entry's start */
}

/* The widening scratch: the largest block, and for the head a band of 64 of its columns
 * (backward) and canonical mode's chunk of its rows. */
static size_t wide_floats(const loom_gpt *m)
{
    size_t C = (size_t)m->cfg.dim, Vl = (size_t)m->Vl, cap = 0;
    for (int l = 0; l < m->cfg.layers; l++)
        if (m->own[l]) {
            size_t lo, hi;
            block_span(m, l, &lo, &hi);
            cap = hi - lo > cap ? hi - lo : cap;
        }
    if (m->has_head) {
        size_t band = Vl * (C < 64 ? C : 64);
        cap = band > cap ? band : cap;
        if (m->canonical) {
            size_t chunk = Vl / (size_t)(LOOM_CANONICAL_CHUNKS / m->tp) * C;
            cap = chunk > cap ? chunk : cap;
        }
    }
    return cap;
}

/* Offset of the table entry named `name`, (size_t)-1 when this rank holds none. */
static size_t entry_offset(const loom_gpt *m, const char *name)
{
    for (int i = 0; i < m->table.count; i++)
        if (!strcmp(m->table.entries[i].name, name))
            return m->table.entries[i].offset;
    return (size_t)-1;
}

loom_status gpt_w16_layout(loom_gpt *m, size_t *edge_of)
{
    const loom_param_table *t = &m->table;
    /* every block's span in one pass over the table: is_edge and relocate ask for each
     * block's span per entry (a scan of the table each time made this layout cubic in the
     * layers: 4.7 ms a 13B footprint, most of loom plan's search) */
    if (!m->span_lo) {
        size_t L = (size_t)m->cfg.layers;
        if (!(m->span_lo = malloc(2 * L * sizeof *m->span_lo)))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
        m->span_hi = m->span_lo + L;
        for (size_t l = 0; l < L; l++) {
            m->span_lo[l] = (size_t)-1;
            m->span_hi[l] = 0;
        }
        for (int i = 0; i < t->count; i++) {
            const loom_param_entry *e = &t->entries[i];
            if (e->layer < 0 || e->layer >= m->cfg.layers)
                continue;
            size_t *lo = &m->span_lo[e->layer], *hi = &m->span_hi[e->layer];
            *lo = e->offset < *lo ? e->offset : *lo;
            *hi = e->offset + e->numel > *hi ? e->offset + e->numel : *hi;
        }
    }
    /* by name, not by the bound pointers: loom_gpt_footprint has no buffer to bind. The
     * head is llama's untied lm_head, else wte (GPT-2's tied head, and a stage's wte) */
    m->wte_off = entry_offset(m, "wte");
    m->head_off = entry_offset(m, "lm_head.weight");
    if (m->head_off == (size_t)-1)
        m->head_off = m->wte_off;
    size_t n_edge = 0;
    for (int i = 0; i < t->count; i++)
        if (is_edge(m, i)) {
            if (edge_of)
                edge_of[i] = n_edge;
            n_edge += t->entries[i].numel;
        }
    m->wide_cap = wide_floats(m);
    m->edge_n = n_edge;
    return LOOM_OK;
}

/* The model's parameter pointers (bound to the fp32 master, m->params) moved to where
 * the passes read the 16-bit weights: the widened block scratch, the edge copies, or NULL
 * for the embeddings and the head (read through the compute copy). Again after the fp32
 * buffer is swapped for a sparse one (loom_gpt_use_sparse_buffer rebinds to it). */
void gpt_w16_bind(loom_gpt *m)
{
    model_params *p = &m->p;
    p->wte = relocate(m, p->wte);
    p->wpe = relocate(m, p->wpe);
    p->lnfw = relocate(m, p->lnfw);
    p->lnfb = relocate(m, p->lnfb);
    p->head = NULL;
    for (int l = 0; l < m->cfg.layers; l++) {
        if (!m->own[l])
            continue;
        float **f = (float **)&p->layer[l]; /* layer_params: float pointers only */
        for (size_t j = 0; j < sizeof(layer_params) / sizeof(float *); j++)
            f[j] = relocate(m, f[j]);
    }
}

loom_status gpt_w16_setup(loom_gpt *m)
{
    const loom_backend_ops *k = m->be->ops;
    const loom_param_table *t = &m->table;
    m->edge_of = calloc((size_t)t->count + 1, sizeof *m->edge_of);
    if (!m->edge_of)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    LOOM_TRY(gpt_w16_layout(m, m->edge_of));
    size_t n_edge = m->edge_n;
    m->c16 = k->alloc(m->be->self, t->total * sizeof(uint16_t));
    m->wide = m->wide_cap ? k->alloc(m->be->self, m->wide_cap * sizeof(float)) : NULL;
    m->edge = n_edge ? k->alloc(m->be->self, n_edge * sizeof(float)) : NULL;
    m->host_tok = malloc((size_t)m->max_B * (size_t)m->max_T * sizeof(int));
    if (!m->c16 || (m->wide_cap && !m->wide) || (n_edge && !m->edge) || !m->host_tok)
        LOOM_FAIL(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB for the %s compute copy of the "
                  "weights and %.1f MiB to widen it", (double)t->total * 2 / (1 << 20),
                  loom_dtype_name(m->param_dt), (double)(m->wide_cap + n_edge) * 4 / (1 << 20));
    gpt_w16_bind(m);
    m->wide_unit = -1;
    return LOOM_OK;
}

void gpt_w16_free(loom_gpt *m)
{
    const loom_backend_ops *k = m->be->ops;
    k->free(m->be->self, m->c16);
    k->free(m->be->self, m->wide);
    k->free(m->be->self, m->edge);
    free(m->host_tok);
    free(m->edge_of);
}

void gpt_w16_refresh(loom_gpt *m)
{
    if (!m->master_elsewhere) /* else ZeRO wrote c16 itself (loom_gpt_set_master_elsewhere) */
        m->be->ops->convert_from_f32(m->c16, m->params, m->table.total, m->param_dt);
    m->wide_unit = -1;
    for (int i = 0; i < m->table.count; i++)
        if (is_edge(m, i))
            widen(m, m->edge + m->edge_of[i], m->table.entries[i].offset,
                  m->table.entries[i].numel);
}

void gpt_w16_unit(loom_gpt *m, int u)
{
    const loom_param_table *t = &m->table;
    int first, last;
    if (!m->c16)
        return;
    loom_gpt_unit_entries(m, u, &first, &last);
    if (first > last)
        return;
    size_t lo = t->entries[first].offset, hi = t->entries[last].offset + t->entries[last].numel;
    m->be->ops->convert_from_f32((uint16_t *)m->c16 + lo, m->params + lo, hi - lo, m->param_dt);
    for (int i = first; i <= last; i++)
        if (is_edge(m, i))
            widen(m, m->edge + m->edge_of[i], t->entries[i].offset, t->entries[i].numel);
    m->wide_unit = -1;
}

size_t gpt_w16_block_lo(const loom_gpt *m, int l)
{
    size_t lo, hi;
    block_span(m, l, &lo, &hi);
    return lo;
}

void gpt_widen_block(loom_gpt *m, int l)
{
    if (!m->c16 || m->wide_unit == l)
        return;
    size_t lo, hi;
    block_span(m, l, &lo, &hi);
    widen(m, m->wide, lo, hi - lo);
    m->wide_unit = l;
}

void gpt_embed_lookup(loom_gpt *m, float *out, const int *dev_tokens, const int *host_tokens,
                      size_t R)
{
    const loom_backend_ops *k = m->be->ops;
    size_t C = (size_t)m->cfg.dim;
    if (!m->c16) {
        k->embedding_forward(out, dev_tokens, m->p.wte, m->v0, m->Vl, R, (int)C);
        return;
    }
    /* embedding_forward's contract: the row of a token this rank holds, zeros elsewhere */
    size_t wte = m->wte_off != (size_t)-1 ? m->wte_off : m->head_off;
    for (size_t r = 0; r < R; r++) {
        int v = host_tokens[r] - m->v0;
        if (v >= 0 && v < m->Vl)
            widen(m, out + r * C, wte + (size_t)v * C, C);
        else
            k->zero(m->be->self, out + r * C, C * sizeof(float));
    }
}

void gpt_head_forward(loom_gpt *m, float *logits, const float *inp, int B, int T)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim, Vl = m->Vl, R = B * T;
    if (!m->c16) {
        k->matmul_forward(logits, inp, m->p.head, NULL, B, T, C, Vl);
        return;
    }
    /* bf16 activations and weights: the backend's product on the 16-bit head as stored,
     * where it has one (the CPU's vdpbf16ps in fast mode; the header's exception) */
    if (m->act_dt != LOOM_DTYPE_F32 && m->param_dt == m->act_dt &&
        k->size > offsetof(loom_backend_ops, gemm_w16) && k->gemm_w16 &&
        k->gemm_w16(R, Vl, C, inp, C, c16_at(m, m->head_off), C, logits, Vl, m->act_dt) == 0)
        return;
    /* matmul_forward without bias is gemm(NT) with beta 0: here over bands of the output's
     * columns (the head's rows), each widened first */
    int rows = (int)(m->wide_cap / (size_t)C);
    for (int v = 0; v < Vl; v += rows) {
        int n = Vl - v < rows ? Vl - v : rows;
        widen(m, m->wide, m->head_off + (size_t)v * C, (size_t)n * C);
        k->gemm(0, 1, R, n, C, 1.0f, inp, C, m->wide, C, 0.0f, logits + v, Vl);
    }
    m->wide_unit = -1;
}

const float *gpt_head_rows(loom_gpt *m, size_t row0, size_t rows)
{
    size_t C = (size_t)m->cfg.dim;
    widen(m, m->wide, m->head_off + row0 * C, rows * C);
    m->wide_unit = -1;
    return m->wide;
}

void gpt_head_dinp(loom_gpt *m, float *dinp, const float *dout, int R)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim, Vl = m->Vl;
    /* the backend's 16-bit product on the head as stored, where it has one (the CPU's
     * vdpbf16ps in fast mode, unbanded) */
    if (gpt_matmul_backward16(m, dinp, NULL, NULL, dout, NULL, c16_at(m, m->head_off), 1, 1, R,
                              C, Vl))
        return;
    /* dinp (R,C) = dout (R,Vl) @ W (Vl,C), gemm(NN), over bands of dinp's columns: W's
     * columns [c, c+w) widened into a (Vl, w) matrix */
    int cols = (int)(m->wide_cap / (size_t)Vl);
    cols = cols > C ? C : cols;
    for (int c = 0; c < C; c += cols) {
        int w = C - c < cols ? C - c : cols;
        for (int v = 0; v < Vl; v++)
            widen(m, m->wide + (size_t)v * w, m->head_off + (size_t)v * C + c, (size_t)w);
        k->gemm(0, 0, R, w, Vl, 1.0f, dout, Vl, m->wide, w, 0.0f, dinp + c, C);
    }
    m->wide_unit = -1;
}

void gpt_act16_sizes(const loom_gpt *m, int l, size_t R, size_t n[GPT_A16_N])
{
    size_t C = (size_t)m->cfg.dim, Rl = m->sp ? R / (size_t)m->tp : R;
    size_t QKV = (size_t)m->qkv_w, FC = (size_t)m->fc_w;
    n[0] = Rl * C;              /* ln1 */
    n[1] = R * QKV;             /* qkv */
    n[2] = R * (size_t)m->Cl;   /* atty */
    n[3] = Rl * C;              /* res2 */
    n[4] = Rl * C;              /* ln2 */
    n[5] = R * FC;              /* fch */
    n[6] = m->rc[l] == RC_SELECTIVE ? 0 : R * (size_t)m->Fl; /* fch_gelu: recomputed */
    if (m->cfg.moe.experts && gpt_moe_block(&m->cfg, l))
        n[5] = n[6] = 0; /* an MoE block's experts keep their own (moe.c) */
    if (!m->own[l] || m->rc[l] == RC_FULL)
        memset(n, 0, GPT_A16_N * sizeof *n); /* another stage's, or only res3 kept */
}

/* The float buffer of saved tensor i (gpt_act16_sizes' order). */
static float *act_f32(layer_acts *a, int i)
{
    float *f[GPT_A16_N] = {a->ln1, a->qkv, a->atty, a->res2, a->ln2, a->fch, a->fch_gelu};
    return f[i];
}

void gpt_acts_store(loom_gpt *m, int l, size_t R)
{
    if (!m->a16)
        return;
    size_t n[GPT_A16_N];
    gpt_act16_sizes(m, l, R, n);
    layer_acts *a = &m->acts[l];
    for (int i = 0; i < GPT_A16_N; i++)
        if (n[i])
            m->be->ops->convert_from_f32(a->s16[i], act_f32(a, i), n[i], m->act_dt);
}

void gpt_acts_load(loom_gpt *m, int l, size_t R)
{
    if (!m->a16)
        return;
    size_t n[GPT_A16_N];
    gpt_act16_sizes(m, l, R, n);
    layer_acts *a = &m->acts[l];
    for (int i = 0; i < GPT_A16_N; i++)
        if (n[i])
            m->be->ops->convert_to_f32(act_f32(a, i), a->s16[i], n[i], m->act_dt);
}

size_t gpt_saved_activation_bytes(const loom_gpt *m)
{
    size_t R = (size_t)m->max_B * (size_t)m->max_T, total = 0, n[GPT_A16_N];
    for (int l = 0; l < m->cfg.layers; l++) {
        gpt_act16_sizes(m, l, R, n);
        for (int i = 0; i < GPT_A16_N; i++)
            total += n[i];
    }
    return total * (m->a16 ? sizeof(uint16_t) : sizeof(float)) * (size_t)m->slots;
}

loom_status loom_gpt_set_master_elsewhere(loom_gpt *m, int on)
{
    if (on && !m->c16)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "the fp32 master can live outside the model only beside a "
                  "16-bit compute copy");
    m->master_elsewhere = on;
    return LOOM_OK;
}

void *loom_gpt_param16_data(loom_gpt *m, loom_dtype *dt)
{
    *dt = m->param_dt;
    return m->c16;
}

size_t gpt_w16_bytes(const loom_gpt *m) { return m->c16 ? m->table.total * sizeof(uint16_t) : 0; }

size_t gpt_w16_scratch_bytes(const loom_gpt *m)
{
    return m->c16 ? (m->wide_cap + m->edge_n) * sizeof(float) : 0;
}
