/* gpt_decode.c — incremental decoding: one new token's row through the model, attention
 * reading the keys and values that earlier rows left in the activation buffers (gpt.h).
 *
 * The cache is no extra memory: a forward with B = 1 leaves row j of every layer's
 * activations at row j of its buffers (qkv among them), and decoding position t writes
 * row t of the same buffers, so the next token's attention finds rows 0..t. Every buffer
 * row sits where the full forward would put it (the same offsets, hence the same
 * alignment); the attention probabilities go where the full forward over t+1 tokens puts
 * row t of each head. Each op below is the full forward's op restricted to that row —
 * layer norms, bias, residual and GELU act per row or per element, the products are
 * row-independent under the backend's row-stable (or canonical) mode, the tensor-parallel sums are elementwise in a
 * fixed rank order (or canonical mode's tree), attention_decode reproduces
 * attention_forward's last row — so the logits row has the full recompute's bits.
 * A pipeline stage decodes its chunks the same way (loom_gpt_stage_decode): each stage's
 * blocks keep their own rows, the engine moves row t of the residual stream between
 * stages (pipeline.h, loom_pipeline_decode), and the rank's last chunk completes the row.
 * It does not: batch (B = 1 only), slide a window (positions are absolute: once t reaches
 * ctx the caller recomputes), or run under sequence parallelism (rows are sharded by tp).
 */
#include "gpt_internal.h"

#include "base/status.h"

int loom_gpt_can_decode(const loom_gpt *m)
{
    if (m->moe)
        return 0; /* routing and capacity see the whole window: recompute it */
    for (int l = 0; l < m->cfg.layers; l++)
        if (m->rc[l] == RC_FULL)
            return 0; /* its q, k, v are in the scratch set every block shares: no cache */
    if (m->llama) /* gpt_llama_check_split checked its kernels are there */
        return !m->sp && m->be->ops->attention_gqa_decode != NULL;
    return !m->sp && m->be->ops->size > offsetof(loom_backend_ops, attention_decode) &&
           m->be->ops->attention_decode != NULL;
}

int loom_gpt_cached_rows(const loom_gpt *m) { return m->cache_len; }

/* Row t of blocks [lo, hi): the embedding first when lo == 0 (the stage input row
 * otherwise: m->encoded's row t, where the pipeline engine receives it), the final norm and
 * the head's logits row after when hi == layers. */
static loom_status decode_rows(loom_gpt *m, int lo, int hi, int token, int t)
{
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    size_t r = (size_t)t, rC = r * (size_t)C;
#define ROW(buf, width) ((buf) + r * (size_t)(width))
    if (lo == 0) {
        k->copy_to_device(bs, m->tokens + t, &token, sizeof(int));
        float *embedded = m->tp_ops ? m->partial : m->encoded;
        gpt_embed_lookup(m, embedded + rC, m->tokens + t, &token, 1);
        LOOM_TRY(F_LEAVE(LOOM_REGION_EMBEDDING, -1, embedded + rC, m->encoded + rC, 1, C));
        if (m->p.wpe)
            k->position_forward(m->encoded + rC, m->p.wpe, r, 1, m->cfg.ctx, C);
        gpt_round(m, m->encoded + rC, (size_t)C); /* gpt_block_forward's points, row t's values */
    }
    const float *residual = m->encoded + rC;
    for (int l = lo; l < hi; l++) {
        gpt_widen_block(m, l);
        layer_params *w = &m->p.layer[l];
        layer_acts *a = &m->acts[l];
        if (m->llama) { /* gpt_llama.c */
            LOOM_TRY(gpt_llama_block_decode(m, l, residual, r));
            residual = a->res3 + rC;
            continue;
        }
        if (m->a16) /* 16-bit activations: the cached rows' q, k, v back into fp32 */
            k->convert_to_f32(a->qkv, a->s16[1], r * 3 * (size_t)Cl, m->act_dt);
        k->layernorm_forward(a->ln1 + rC, a->ln1_mean + r, a->ln1_rstd + r, residual, w->ln1w,
                             w->ln1b, 1, 1, C);
        gpt_round(m, a->ln1 + rC, (size_t)C);
        LOOM_TRY(F_ENTER(LOOM_REGION_ATTENTION, l, a->ln1 + rC, a->ln1_full + rC, 1, C));
        k->matmul_forward(ROW(a->qkv, 3 * Cl), a->ln1_full + rC, w->qkvw, w->qkvb, 1, 1, C,
                          3 * Cl);
        gpt_round(m, ROW(a->qkv, 3 * Cl), 3 * (size_t)Cl);
        if (m->a16) /* and row t's, kept for the next positions */
            k->convert_from_f32((uint16_t *)a->s16[1] + r * 3 * (size_t)Cl, ROW(a->qkv, 3 * Cl),
                                3 * (size_t)Cl, m->act_dt);
        /* where attention_forward over t+1 tokens keeps row t of head h: h(t+1)^2 + t(t+1) */
        size_t n = r + 1;
        k->attention_decode(ROW(a->atty, Cl), gpt_att_at(m, a->att) + r * n, n * n, a->qkv, t,
                            Cl, m->NHl);
        gpt_round(m, ROW(a->atty, Cl), (size_t)Cl);
        gpt_row_parallel_forward(m, m->partial + rC, ROW(a->atty, Cl), w->attprojw, 1, 1, Cl);
        LOOM_TRY(F_LEAVE(LOOM_REGION_ATTENTION, l, m->partial + rC, m->summed + rC, 1, C));
        k->bias_add(m->summed + rC, w->attprojb, 1, C);
        gpt_round(m, m->summed + rC, (size_t)C);
        k->residual_forward(a->res2 + rC, residual, m->summed + rC, (size_t)C);
        gpt_round(m, a->res2 + rC, (size_t)C);
        k->layernorm_forward(a->ln2 + rC, a->ln2_mean + r, a->ln2_rstd + r, a->res2 + rC,
                             w->ln2w, w->ln2b, 1, 1, C);
        gpt_round(m, a->ln2 + rC, (size_t)C);
        LOOM_TRY(F_ENTER(LOOM_REGION_MLP, l, a->ln2 + rC, a->ln2_full + rC, 1, C));
        k->matmul_forward(ROW(a->fch, Fl), a->ln2_full + rC, w->fcw, w->fcb, 1, 1, C, Fl);
        gpt_round(m, ROW(a->fch, Fl), (size_t)Fl);
        k->gelu_forward(ROW(a->fch_gelu, Fl), ROW(a->fch, Fl), (size_t)Fl);
        gpt_round(m, ROW(a->fch_gelu, Fl), (size_t)Fl);
        gpt_row_parallel_forward(m, m->partial + rC, ROW(a->fch_gelu, Fl), w->fcprojw, 1, 1, Fl);
        LOOM_TRY(F_LEAVE(LOOM_REGION_MLP, l, m->partial + rC, m->summed + rC, 1, C));
        k->bias_add(m->summed + rC, w->fcprojb, 1, C);
        gpt_round(m, m->summed + rC, (size_t)C);
        k->residual_forward(a->res3 + rC, a->res2 + rC, m->summed + rC, (size_t)C);
        gpt_round(m, a->res3 + rC, (size_t)C);
        residual = a->res3 + rC;
    }
    if (hi < m->cfg.layers)
        return LOOM_OK;
    gpt_final_norm_forward(m, residual, r, 1);
    gpt_round(m, m->lnf + rC, (size_t)C);
    LOOM_TRY(F_ENTER(LOOM_REGION_HEAD, -1, m->lnf + rC, m->lnf_full + rC, 1, C));
    gpt_head_forward(m, ROW(m->logits, m->Vl), m->lnf_full + rC, 1, 1);
    gpt_round(m, ROW(m->logits, m->Vl), (size_t)m->Vl);
#undef ROW
    return LOOM_OK;
}

static loom_status check_decode(const loom_gpt *m, int token, int t)
{
    if (!loom_gpt_can_decode(m))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "incremental decoding needs a backend with "
                  "attention_decode and no sequence parallelism");
    if (t != m->cache_len || t < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "decode at position %d, but the cache holds %d rows (run a "
                  "forward with B = 1 over the first tokens)", t, m->cache_len);
    if (t >= m->max_T) /* its rows are the activations' (max_T: ctx unless built shorter) */
        LOOM_FAIL(LOOM_ERR_INVALID, "decode at position %d: the model's ctx is %d (activations "
                  "built for %d)", t, m->cfg.ctx, m->max_T);
    if (token < 0 || token >= m->cfg.vocab)
        LOOM_FAIL(LOOM_ERR_INVALID, "token %d is outside the vocabulary [0, %d)", token,
                  m->cfg.vocab);
    return LOOM_OK;
}

/* The cache now holds rows 0..t; or, after a failure, nothing. */
static loom_status decoded(loom_gpt *m, loom_status st, int t)
{
    m->cache_len = st == LOOM_OK ? t + 1 : 0;
    if (st == LOOM_OK) {
        m->last_B = 1;
        m->last_T = t + 1;
        m->have_dlogits = 0;
    }
    return st;
}

loom_status loom_gpt_decode(loom_gpt *m, int token, int t)
{
    LOOM_TRY(check_decode(m, token, t));
    if (m->staged)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "this model is one pipeline stage: decode through the "
                  "pipeline engine (loom_gpt_stage_decode), not loom_gpt_decode");
    LOOM_TRY(gpt_att_prepare_decode(m, t + 1)); /* gpt_att.c: the spill, where att is too small */
    return decoded(m, decode_rows(m, 0, m->cfg.layers, token, t), t);
}

loom_status loom_gpt_stage_decode(loom_gpt *m, int lo, int hi, int token, int t)
{
    LOOM_TRY(gpt_check_chunk(m, lo, hi));
    LOOM_TRY(check_decode(m, lo == 0 ? token : 0, t));
    LOOM_TRY(gpt_att_prepare_decode(m, t + 1));
    int top = hi; /* the rank's last chunk ends its decode of row t */
    while (top < m->cfg.layers && !m->own[top])
        top++;
    loom_status st = decode_rows(m, lo, hi, token, t);
    return st != LOOM_OK || top == m->cfg.layers ? decoded(m, st, t) : LOOM_OK;
}
