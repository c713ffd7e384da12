/* gpt_llama.c — the llama family's block (gpt.h: LOOM_FAMILY_LLAMA), on the GPT model's
 * machinery: the same parameter table, activation slots, tensor-parallel regions, canonical
 * chunk trees, vocabulary-parallel loss and recomputation; only the block's math differs.
 *
 *   h   = RMSNorm_1(x);  q|k|v = h Wqkv^T  (one product over the q, k, v weights, which lie
 *         back to back);  q, k rotated by RoPE at their positions (in place in qkv);
 *   x  += GQA(q, k, v) Wo^T
 *   h   = RMSNorm_2(x);  g|u = h Wgu^T (gate and up, back to back);  x += (silu(g) u) Wd^T
 *
 * Tensor parallelism (Megatron's layout): q and kv heads split by tp (tp divides kv_heads,
 * so a rank's q heads read only its own kv heads), gate and up column-parallel (each rank
 * its Fl columns of both), Wo and Wd row-parallel; RMSNorm weights replicated (their
 * gradients through gpt_parallel.c's replicated-gradient packs, kind 2). Under sequence
 * parallelism q, k, v cover all R rows after the all-gather, so RoPE's positions are
 * row % T as without it.
 * Backward mirrors forward; RoPE's backward rotates d(q), d(k) back (the transpose) before
 * the qkv product's backward. Selective recomputation reruns the attention probabilities
 * and the SwiGLU output, full recomputation the block's forward (the same calls: the same
 * bits).
 * Mixed precision as gpt_block_forward's: every stored activation rounded to the 16-bit
 * type where it is written (q and k once more after RoPE), what backward reads kept in 16
 * bits (gpt_precision.c), the RMSNorm statistics, softmax and gradients in fp32.
 */
#include "gpt_internal.h"
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

int gpt_norm_kind(const loom_gpt *m) { return m->llama ? 2 : 0; }

loom_status gpt_llama_config_check(const loom_gpt_config *c)
{
    int kv = c->kv_heads ? c->kv_heads : c->heads, hs = c->dim / c->heads;
    if (kv < 1 || c->heads % kv != 0) {
        char ok[256] = "";
        size_t used = 0;
        for (int h = 1; h <= c->heads && used < sizeof ok; h++)
            if (c->heads % h == 0)
                used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", used ? ", " : "", h);
        LOOM_FAIL(LOOM_ERR_INVALID, "model kv_heads=%d does not divide heads=%d (kv_heads may be "
                  "%s)", c->kv_heads, c->heads, ok);
    }
    if (hs % 2 != 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "model dim=%d / heads=%d = head size %d: rotary embeddings "
                  "rotate pairs, so it must be even", c->dim, c->heads, hs);
    if (c->ffn_dim < 0 || c->rope_theta < 0.0f || c->norm_eps < 0.0f)
        LOOM_FAIL(LOOM_ERR_INVALID, "model ffn_dim=%d, rope_theta=%g and norm_eps=%g must not be "
                  "negative", c->ffn_dim, (double)c->rope_theta, (double)c->norm_eps);
    return LOOM_OK;
}

void gpt_llama_widths(loom_gpt *m)
{
    loom_gpt_config *c = &m->cfg;
    if (!c->kv_heads)
        c->kv_heads = c->heads;
    if (!c->ffn_dim)
        c->ffn_dim = 4 * c->dim;
    if (c->rope_theta == 0.0f)
        c->rope_theta = 10000.0f;
    if (c->norm_eps == 0.0f)
        c->norm_eps = 1e-5f;
    int hs = c->dim / c->heads;
    m->llama = 1;
    m->KVHl = c->kv_heads / m->tp;
    m->KVl = m->KVHl * hs;
    m->Fl = c->ffn_dim / m->tp;
    m->qkv_w = m->Cl + 2 * m->KVl;
    m->fc_w = 2 * m->Fl;
    /* a pipeline stage holds wte on the first stage, ln_f and lm_head on the last */
    m->pre = m->has_embed || (m->has_head && c->tie_embeddings) ? 1 : 0;
    m->per_layer = 9;
    m->post = !m->has_head ? 0 : c->tie_embeddings ? 1 : 2;
}

loom_status gpt_llama_check_split(const loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    const loom_backend_ops *k = m->be ? m->be->ops : NULL; /* none: loom_gpt_footprint */
    if (k && (k->size <= offsetof(loom_backend_ops, attention_gqa_decode) || !k->rmsnorm_forward ||
        !k->rmsnorm_backward || !k->swiglu_forward || !k->swiglu_backward || !k->rope_forward ||
        !k->rope_backward || !k->attention_gqa_forward || !k->attention_gqa_backward))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "the backend has no kernels for llama blocks (RMSNorm, "
                  "SwiGLU, RoPE, grouped-query attention): use backend = \"cpu\"");
    int tp = m->tp;
    if (tp > 1 && c->kv_heads % tp != 0) {
        char ok[256] = "";
        size_t used = 0;
        for (int t = 1; t <= c->kv_heads && used < sizeof ok; t++)
            if (c->kv_heads % t == 0)
                used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", used ? ", " : "", t);
        LOOM_FAIL(LOOM_ERR_INVALID, "tensor parallelism tp=%d must divide kv_heads=%d (each rank "
                  "holds whole key/value heads): tp may be %s, or raise kv_heads", tp,
                  c->kv_heads, ok);
    }
    if (tp > 1 && c->ffn_dim % tp != 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "tensor parallelism tp=%d must divide ffn_dim=%d", tp,
                  c->ffn_dim);
    const int chunks = LOOM_CANONICAL_CHUNKS, kv = c->kv_heads * (c->dim / c->heads);
    if (m->canonical && (kv % chunks || c->ffn_dim % chunks))
        LOOM_FAIL(LOOM_ERR_INVALID, "canonical mode sums in %d fixed chunks: the key/value width "
                  "kv_heads x head size = %d and ffn_dim=%d must divide by %d", chunks, kv,
                  c->ffn_dim, chunks);
    return LOOM_OK;
}

/* cos and sin of p * theta^(-2i/hs) for positions p < ctx, i < hs/2 (computed in double,
 * rounded once). */
loom_status gpt_llama_rope_cache(loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    size_t half = (size_t)(c->dim / c->heads) / 2, n = (size_t)c->ctx * half;
    float *host = malloc(2 * n * sizeof(float));
    m->rope_cos = m->be->ops->alloc(m->be->self, n * sizeof(float));
    m->rope_sin = m->be->ops->alloc(m->be->self, n * sizeof(float));
    if (!host || !m->rope_cos || !m->rope_sin) {
        free(host);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the rotary angle cache");
    }
    for (size_t p = 0; p < (size_t)c->ctx; p++)
        for (size_t i = 0; i < half; i++) {
            double a = (double)p * pow((double)c->rope_theta, -(double)i / (double)half);
            host[p * half + i] = (float)cos(a);
            host[n + p * half + i] = (float)sin(a);
        }
    m->be->ops->copy_to_device(m->be->self, m->rope_cos, host, n * sizeof(float));
    m->be->ops->copy_to_device(m->be->self, m->rope_sin, host + n, n * sizeof(float));
    free(host);
    return LOOM_OK;
}

void gpt_final_norm_forward(loom_gpt *m, const float *residual, size_t r0, size_t rows)
{
    const loom_backend_ops *k = m->be->ops;
    size_t C = (size_t)m->cfg.dim;
    if (m->llama)
        k->rmsnorm_forward(m->lnf + r0 * C, m->lnf_rstd + r0, residual, m->p.lnfw, rows, (int)C,
                           m->cfg.norm_eps);
    else
        k->layernorm_forward(m->lnf + r0 * C, m->lnf_mean + r0, m->lnf_rstd + r0, residual,
                             m->p.lnfw, m->p.lnfb, 1, (int)rows, (int)C);
}

/* Rotate the q and k heads of R qkv rows (positions row % T). */
static void rope(loom_gpt *m, float *qkv, size_t row0, size_t rows, int T, int backward)
{
    const loom_backend_ops *k = m->be->ops;
    int hs = m->cfg.dim / m->cfg.heads, heads = m->NHl + m->KVHl;
    (backward ? k->rope_backward : k->rope_forward)(qkv, m->rope_cos, m->rope_sin, row0, rows, T,
                                                    m->qkv_w, heads, hs);
}

loom_status gpt_llama_block_forward(loom_gpt *m, int l, const float *residual, int B, int T,
                                    size_t Rl)
{
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    const size_t R = (size_t)B * T;
    const float eps = m->cfg.norm_eps;
    layer_params *w = &m->p.layer[l];
    layer_acts *a = &m->acts[l];
    /* gpt_round (mixed precision): each stored activation rounded where it is written, at
     * gpt_block_forward's points; q and k again after their rotation (a GPU's RoPE kernel
     * reads the 16-bit product and stores 16 bits) */
    k->rmsnorm_forward(a->ln1, a->ln1_rstd, residual, w->ln1w, Rl, C, eps);
    gpt_round(m, a->ln1, Rl * C);
    LOOM_TRY(F_ENTER(LOOM_REGION_ATTENTION, l, a->ln1, a->ln1_full, R, C));
    k->matmul_forward(a->qkv, a->ln1_full, w->qkvw, NULL, B, T, C, m->qkv_w);
    gpt_round(m, a->qkv, R * (size_t)m->qkv_w);
    rope(m, a->qkv, 0, R, T, 0);
    gpt_round(m, a->qkv, R * (size_t)m->qkv_w);
    gpt_gqa_fwd(m, l, a->atty, a->att, a->qkv, B, T);
    gpt_round(m, a->atty, R * Cl);
    gpt_row_parallel_forward(m, m->partial, a->atty, w->attprojw, B, T, Cl);
    LOOM_TRY(F_LEAVE(LOOM_REGION_ATTENTION, l, m->partial, m->summed, R, C));
    gpt_round(m, m->summed, Rl * C);
    k->residual_forward(a->res2, residual, m->summed, Rl * C);
    gpt_round(m, a->res2, Rl * C);
    k->rmsnorm_forward(a->ln2, a->ln2_rstd, a->res2, w->ln2w, Rl, C, eps);
    gpt_round(m, a->ln2, Rl * C);
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* SwiGLU experts behind a router (moe.h) */
        if (gpt_moe_rerunning(m))
            return LOOM_OK; /* recomputation: the experts' part is kept, res3 too */
        LOOM_TRY(F_ENTER(LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R, C));
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
    k->matmul_forward(a->fch, a->ln2_full, w->fcw, NULL, B, T, C, m->fc_w);
    gpt_round(m, a->fch, R * (size_t)m->fc_w);
    k->swiglu_forward(a->fch_gelu, a->fch, R, Fl);
    gpt_round(m, a->fch_gelu, R * Fl);
    gpt_row_parallel_forward(m, m->partial, a->fch_gelu, w->fcprojw, B, T, Fl);
    LOOM_TRY(F_LEAVE(LOOM_REGION_MLP, l, m->partial, m->summed, R, C));
    gpt_round(m, m->summed, Rl * C);
    k->residual_forward(a->res3, a->res2, m->summed, Rl * C);
    gpt_round(m, a->res3, Rl * C);
    if (m->rc[l] != RC_FULL)
        gpt_acts_store(m, l, R); /* 16-bit activations: what backward reads, kept */
    return LOOM_OK;
}

loom_status gpt_llama_block_backward(loom_gpt *m, int l, const float *residual, rep_pack *pk,
                                     int B, int T, size_t Rl)
{
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    const size_t R = (size_t)B * T;
    layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
    layer_acts *a = &m->acts[l];
    if (m->rc[l] == RC_FULL) { /* an MoE block's experts are kept, not rerun (moe.h) */
        gpt_moe_rerun(m, 1);
        loom_status rs = gpt_llama_block_forward(m, l, residual, B, T, Rl);
        gpt_moe_rerun(m, 0);
        LOOM_TRY(rs);
    } else {
        gpt_acts_load(m, l, R); /* 16-bit activations: the kept ones back into fp32 */
    }
    /* MLP branch: res3 = res2 + g(down(swiglu(gate|up(f(rms2(res2)))))) */
    LOOM_TRY(B_LEAVE(LOOM_REGION_MLP, l, m->dres, m->dres_full, R, C));
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* the router's and experts' (moe.h) */
        LOOM_TRY(gpt_regather(m, LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R));
        LOOM_TRY(gpt_moe_backward(m, l, gpt_moe_router(m, l), m->dres_full, m->dpartial, R));
        LOOM_TRY(gpt_moe_leave(m, l, 1, m->dpartial, m->dsummed, R)); /* sum over tp */
        goto mlp_done;
    }
    if (m->rc[l] == RC_SELECTIVE) {
        k->swiglu_forward(a->fch_gelu, a->fch, R, Fl);
        gpt_round(m, a->fch_gelu, R * Fl); /* as the forward stored it */
    }
    gpt_matmul_backward(m, m->dbuf_4a, g->fcprojw, NULL, m->dres_full, a->fch_gelu,
                        w->fcprojw, B, T, Fl, C);
    k->swiglu_backward(m->dbuf_4b, a->fch, m->dbuf_4a, R, Fl);
    LOOM_TRY(gpt_regather(m, LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R));
    LOOM_TRY(gpt_column_parallel_backward(m, LOOM_REGION_MLP, l, g->fcw, NULL, m->dbuf_4b,
                                          a->ln2_full, w->fcw, B, T, m->fc_w, 2));
mlp_done:;
    rep_args ln2 = {m->dtmp, m->dsummed, a->res2, w->ln2w, NULL, a->ln2_rstd};
    gpt_replicated_grads(m, pk, 2, &ln2, g->ln2w, NULL, Rl);
    k->accumulate(m->dres, m->dtmp, Rl * C);
    /* Attention branch: res2 = residual + g(o(gqa(rope(qkv(f(rms1(residual))))))) */
    LOOM_TRY(B_LEAVE(LOOM_REGION_ATTENTION, l, m->dres, m->dres_full, R, C));
    float *datty = m->dpartial; /* free until the qkv backward below */
    gpt_matmul_backward(m, datty, g->attprojw, NULL, m->dres_full, a->atty, w->attprojw, B,
                        T, Cl, C);
    if (m->rc[l] == RC_SELECTIVE) /* the probabilities again; the output to dbuf_4b (free) */
        gpt_gqa_fwd(m, l, m->dbuf_4b, a->att, a->qkv, B, T);
    gpt_gqa_bwd(m, l, m->dbuf_4a, m->datt_scratch, datty, a->qkv, a->att, B, T);
    rope(m, m->dbuf_4a, 0, R, T, 1);
    LOOM_TRY(gpt_regather(m, LOOM_REGION_ATTENTION, l, a->ln1, a->ln1_full, R));
    LOOM_TRY(gpt_column_parallel_backward(m, LOOM_REGION_ATTENTION, l, g->qkvw, NULL,
                                          m->dbuf_4a, a->ln1_full, w->qkvw, B, T, m->qkv_w, 3));
    rep_args ln1 = {m->dtmp, m->dsummed, residual, w->ln1w, NULL, a->ln1_rstd};
    gpt_replicated_grads(m, pk, 2, &ln1, g->ln1w, NULL, Rl);
    k->accumulate(m->dres, m->dtmp, Rl * C);
    return LOOM_OK;
}

/* Row r of block l for incremental decoding: gpt_llama_block_forward's ops restricted to
 * that row (gpt_decode.c says why the bits are the full forward's). */
loom_status gpt_llama_block_decode(loom_gpt *m, int l, const float *residual, size_t r)
{
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    const size_t rC = r * (size_t)C;
    const float eps = m->cfg.norm_eps;
    layer_params *w = &m->p.layer[l];
    layer_acts *a = &m->acts[l];
#define ROW(buf, width) ((buf) + r * (size_t)(width))
    size_t QKV = (size_t)m->qkv_w;
    if (m->a16) /* 16-bit activations: the cached rows' q, k, v back into fp32 */
        k->convert_to_f32(a->qkv, a->s16[1], r * QKV, m->act_dt);
    k->rmsnorm_forward(a->ln1 + rC, a->ln1_rstd + r, residual, w->ln1w, 1, C, eps);
    gpt_round(m, a->ln1 + rC, (size_t)C);
    LOOM_TRY(F_ENTER(LOOM_REGION_ATTENTION, l, a->ln1 + rC, a->ln1_full + rC, 1, C));
    k->matmul_forward(ROW(a->qkv, QKV), a->ln1_full + rC, w->qkvw, NULL, 1, 1, C, m->qkv_w);
    gpt_round(m, ROW(a->qkv, QKV), QKV);
    rope(m, ROW(a->qkv, QKV), r, 1, m->cfg.ctx, 0); /* position r (< ctx) */
    gpt_round(m, ROW(a->qkv, QKV), QKV);
    if (m->a16) /* and row r's, kept for the next positions */
        k->convert_from_f32((uint16_t *)a->s16[1] + r * QKV, ROW(a->qkv, QKV), QKV, m->act_dt);
    size_t n = r + 1; /* where the forward over r+1 tokens keeps row r of head h */
    k->attention_gqa_decode(ROW(a->atty, Cl), gpt_att_at(m, a->att) + r * n, n * n, a->qkv,
                            (int)r, Cl, m->NHl, m->KVHl);
    gpt_round(m, ROW(a->atty, Cl), (size_t)Cl);
    gpt_row_parallel_forward(m, m->partial + rC, ROW(a->atty, Cl), w->attprojw, 1, 1, Cl);
    LOOM_TRY(F_LEAVE(LOOM_REGION_ATTENTION, l, m->partial + rC, m->summed + rC, 1, C));
    gpt_round(m, m->summed + rC, (size_t)C);
    k->residual_forward(a->res2 + rC, residual, m->summed + rC, (size_t)C);
    gpt_round(m, a->res2 + rC, (size_t)C);
    k->rmsnorm_forward(a->ln2 + rC, a->ln2_rstd + r, a->res2 + rC, w->ln2w, 1, C, eps);
    gpt_round(m, a->ln2 + rC, (size_t)C);
    LOOM_TRY(F_ENTER(LOOM_REGION_MLP, l, a->ln2 + rC, a->ln2_full + rC, 1, C));
    k->matmul_forward(ROW(a->fch, m->fc_w), a->ln2_full + rC, w->fcw, NULL, 1, 1, C, m->fc_w);
    gpt_round(m, ROW(a->fch, m->fc_w), (size_t)m->fc_w);
    k->swiglu_forward(ROW(a->fch_gelu, Fl), ROW(a->fch, m->fc_w), 1, Fl);
    gpt_round(m, ROW(a->fch_gelu, Fl), (size_t)Fl);
    gpt_row_parallel_forward(m, m->partial + rC, ROW(a->fch_gelu, Fl), w->fcprojw, 1, 1, Fl);
    LOOM_TRY(F_LEAVE(LOOM_REGION_MLP, l, m->partial + rC, m->summed + rC, 1, C));
    gpt_round(m, m->summed + rC, (size_t)C);
    k->residual_forward(a->res3 + rC, a->res2 + rC, m->summed + rC, (size_t)C);
    gpt_round(m, a->res3 + rC, (size_t)C);
#undef ROW
    return LOOM_OK;
}
