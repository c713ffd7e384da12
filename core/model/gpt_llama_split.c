/* gpt_llama_split.c — the llama block's backward in two passes, B (input gradient) and W
 * (weight gradients), for zero-bubble schedules: gpt_backward_split.c's scheme (read its
 * comment first) applied to gpt_llama.c's block.
 *
 * B runs gpt_llama_block_backward without the weight products dW = dY^T X: each linear's
 * input gradient dX = dY W through the GEMM call matmul_backward makes, SwiGLU's backward,
 * grouped-query attention's backward, RoPE's backward on d(q), d(k) (so d(qkv) is the
 * gradient of the un-rotated product, what W needs), the RMSNorms (their weight gradient
 * comes out of the kernel that makes the input gradient, so B computes it) and the residual
 * joins. W's inputs: every linear's input X is an activation the forward stored (ln_1,
 * atty, ln_2, the SwiGLU output); the output gradients dY lie where B no longer needs the
 * buffer, written there by the kernel that makes them:
 *   d(res3): over res3 of this block (the next block's RMSNorm input), or m->dres;
 *   d(res2): over res2 (RMSNorm 2's input, read just before);
 *   d(gate|up): its own buffer per block (a->dfch);
 *   d(qkv): over fch (SwiGLU's input, read by its backward earlier in the same block) when
 *     it fits there and W does not rerun SwiGLU from fch; otherwise its own buffer a->dqkv
 *     (gpt.c allocates it for selective recomputation, or a q|k|v wider than gate|up).
 * So B then W makes every value with the same calls on the same operands as the fused
 * backward: the same bits (tests/unit/test_gpt_split.c, llama cases).
 */
#include "gpt_internal.h"
#include "moe.h"

#include "base/status.h"

/* Where B leaves d(qkv) for W. */
static float *dqkv_buffer(layer_acts *a) { return a->dqkv ? a->dqkv : a->fch; }

loom_status gpt_llama_block_input(loom_gpt *m, int l, const float *residual, float *dy,
                                  float *dx, int B, int T, size_t Rl)
{
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    const size_t R = (size_t)B * T;
    gpt_widen_block(m, l); /* 16-bit weights: this block's into fp32 (gpt_precision.c) */
    layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
    layer_acts *a = &m->acts[l];
    rep_pack pk = {.n = 0, .base = a->ln_part};
    /* MLP branch */
    LOOM_TRY(B_LEAVE(LOOM_REGION_MLP, l, dy, dy, R, C));
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* the experts' B, into dsummed (moe.h) */
        LOOM_TRY(gpt_moe_split_input(m, l, dy, R));
    } else {
        if (!gpt_matmul_backward16(m, m->dbuf_4a, NULL, NULL, dy, NULL, w->fcprojw, 0, 1,
                                   (int)R, Fl, C))
            k->gemm(0, 0, (int)R, Fl, C, 1.0f, dy, C, w->fcprojw, Fl, 0.0f, m->dbuf_4a, Fl);
        k->swiglu_backward(a->dfch, a->fch, m->dbuf_4a, R, Fl);
        LOOM_TRY(gpt_column_parallel_backward_input(m, LOOM_REGION_MLP, l, a->dfch, w->fcw, B,
                                                    T, m->fc_w, 2));
    }
    rep_args ln2 = {m->dtmp, m->dsummed, a->res2, w->ln2w, NULL, a->ln2_rstd};
    gpt_replicated_grads(m, &pk, 2, &ln2, g->ln2w, NULL, Rl);
    float *dy2 = a->res2; /* read by RMSNorm 2's backward just now: d(res2) goes there */
    k->residual_forward(dy2, dy, m->dtmp, Rl * C);
    /* Attention branch */
    LOOM_TRY(B_LEAVE(LOOM_REGION_ATTENTION, l, dy2, dy2, R, C));
    float *datty = m->dpartial;
    if (!gpt_matmul_backward16(m, datty, NULL, NULL, dy2, NULL, w->attprojw, 0, 1, (int)R, Cl,
                               C))
        k->gemm(0, 0, (int)R, Cl, C, 1.0f, dy2, C, w->attprojw, Cl, 0.0f, datty, Cl);
    float *dqkv = dqkv_buffer(a);
    if (m->rc[l] == RC_SELECTIVE) /* the probabilities again; dbuf_4b: unused in B */
        gpt_gqa_fwd(m, l, m->dbuf_4b, a->att, a->qkv, B, T);
    gpt_gqa_bwd(m, l, dqkv, m->datt_scratch, datty, a->qkv, a->att, B, T);
    k->rope_backward(dqkv, m->rope_cos, m->rope_sin, 0, R, T, m->qkv_w, m->NHl + m->KVHl,
                     C / m->cfg.heads);
    LOOM_TRY(gpt_column_parallel_backward_input(m, LOOM_REGION_ATTENTION, l, dqkv, w->qkvw, B,
                                                T, m->qkv_w, 3));
    rep_args ln1 = {m->dtmp, m->dsummed, residual, w->ln1w, NULL, a->ln1_rstd};
    gpt_replicated_grads(m, &pk, 2, &ln1, g->ln1w, NULL, Rl);
    k->residual_forward(dx, dy2, m->dtmp, Rl * C); /* dx may be residual: read just now */
    return LOOM_OK;
}

loom_status gpt_llama_block_weight(loom_gpt *m, int l, const float *dy, int B, int T)
{
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    gpt_widen_block(m, l);
    layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
    layer_acts *a = &m->acts[l];
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* the router's and experts' W (moe.h) */
        LOOM_TRY(gpt_moe_backward_weight(m, l, gpt_moe_router(m, l), (size_t)B * T));
    } else {
        if (m->rc[l] == RC_SELECTIVE) { /* the SwiGLU output again, into the shared scratch set */
            k->swiglu_forward(a->fch_gelu, a->fch, (size_t)B * T, Fl);
            gpt_round(m, a->fch_gelu, (size_t)B * T * Fl); /* as the forward stored it */
        }
        gpt_matmul_backward(m, NULL, g->fcprojw, NULL, dy, a->fch_gelu, w->fcprojw, B, T, Fl, C);
        gpt_matmul_backward(m, NULL, g->fcw, NULL, a->dfch, a->ln2_full, w->fcw, B, T, C,
                            m->fc_w);
    }
    gpt_matmul_backward(m, NULL, g->attprojw, NULL, a->res2, a->atty, w->attprojw, B, T, Cl, C);
    gpt_matmul_backward(m, NULL, g->qkvw, NULL, dqkv_buffer(a), a->ln1_full, w->qkvw, B, T, C,
                        m->qkv_w);
    if (m->canonical || m->sp) { /* the RMSNorms' parts B left (see gpt_replicated_grads) */
        rep_pack ln = {{g->ln2w, g->ln1w}, 2, a->ln_part};
        LOOM_TRY(gpt_rep_flush(m, &ln));
    }
    return LOOM_OK;
}
