/* gpt_backward_split.c — a pipeline chunk's backward in two passes (gpt_stage.h), for
 * zero-bubble schedules (Qi et al. 2024): B, the input gradient, which the previous stage
 * waits for, and W, the weight gradients, which only the optimizer step needs.
 *
 * B runs gpt.c's fused block backward without the weight products dW = dY^T X (and
 * without the bias sums): each linear's input gradient dX = dY W through the same GEMM
 * call matmul_backward makes, GELU, attention, the layer norms (their gamma and beta
 * gradients come out of the same kernel as their input gradient, so B computes them) and
 * the residual joins. What W needs is kept in the slot: every linear's input X is an
 * activation forward already stored (ln_1, atty, ln_2, fch_gelu, ln_f); its dY goes where
 * B no longer needs the buffer, written there by the kernel that makes it, not copied:
 *   d(res3) of block l: over res3 of block l (the next block's ln_1 input, read already by
 *     then); the chunk's top block: the incoming gradient, m->dres;
 *   d(res2): over res2 (ln_2's input, read just before);
 *   d(qkv): over fch (GELU's input, read earlier in the same block); with selective
 *     recomputation its own buffer (a->dqkv), as W recomputes the GELU output from fch;
 *   d(fch): its own buffer per block (a->dfch, the only extra activation memory);
 *   the LM head's d(logits): the logits, as in the fused backward.
 * The residual joins use residual_forward(out, a, b) = a + b where the fused pass runs
 * accumulate(a, b): the same IEEE sum. So B then W computes every value with the same
 * calls on the same operands as the fused backward: with W's in the same micro-batch order
 * every gradient gets the same bits (tests/unit/test_gpt_split.c).
 * Canonical mode (and sequence parallelism) compute replicated gradients into parts that
 * are added to the gradient later (gpt_parallel.c); B leaves the layer norms' parts in the
 * slot (a->ln_part, m->lnf_part) and W adds them, so B writes no parameter gradient and
 * the engine may zero the gradients before each W (one micro-batch's gradients on their
 * own). In fast mode the kernels accumulate straight into the gradient, in B.
 * The llama family's blocks have their own B and W (gpt_llama_split.c, the same scheme);
 * the chunk's ends here serve both (its untied LM head is m->p.head, its final norm an
 * RMSNorm with one weight).
 * MoE blocks (moe.h): their MLP branch's B and W are the router's and experts'
 * (gpt_moe_backward_input, _weight), with what W reads kept per slot by moe.c.
 * What not: sequence parallelism (gpt.c's check_split refuses split_backward with it).
 */
#include "gpt_stage.h"

#include "gpt_internal.h"
#include "moe.h"
#include "base/status.h"

float *loom_gpt_stage_grad_out(loom_gpt *m) { return m->split ? m->dx_out : m->dres; }

static loom_status check_split(const loom_gpt *m, int lo, int hi)
{
    LOOM_TRY(gpt_check_chunk(m, lo, hi));
    LOOM_TRY(gpt_att_check_backward(m));
    if (!m->split)
        LOOM_FAIL(LOOM_ERR_INVALID, "a split backward (B, then W) needs the model created with "
                  "loom_gpt_parallel.split_backward = 1 (the buffers W reads)");
    return LOOM_OK;
}

/* Where block l's output gradient d(res3) is during B and W of chunk [lo, hi). */
static float *block_dy(loom_gpt *m, int l, int hi)
{
    return l == hi - 1 ? m->dres : m->acts[l].res3;
}

/* B of block l: reads dy = d(res3), writes dx = d(residual). The replicated gradients go
 * through pk (canonical: into a->ln_part, not the gradient). */
static loom_status block_input(loom_gpt *m, int l, const float *residual, float *dy, float *dx,
                               int B, int T, size_t Rl)
{
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    const size_t R = (size_t)B * T;
    gpt_widen_block(m, l);
    layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
    layer_acts *a = &m->acts[l];
    rep_pack pk = {.n = 0, .base = a->ln_part};
    /* MLP branch (dres_full is dres without sequence parallelism: dy itself) */
    LOOM_TRY(B_LEAVE(LOOM_REGION_MLP, l, dy, dy, R, C));
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* the experts' B, into dsummed (moe.h) */
        LOOM_TRY(gpt_moe_split_input(m, l, dy, R));
    } else {
        if (!gpt_matmul_backward16(m, m->dbuf_4a, NULL, NULL, dy, NULL, w->fcprojw, 0, 1,
                                   (int)R, Fl, C))
            k->gemm(0, 0, (int)R, Fl, C, 1.0f, dy, C, w->fcprojw, Fl, 0.0f, m->dbuf_4a, Fl);
        k->gelu_backward(a->dfch, a->fch, m->dbuf_4a, R * Fl);
        LOOM_TRY(gpt_column_parallel_backward_input(m, LOOM_REGION_MLP, l, a->dfch, w->fcw, B,
                                                    T, Fl, 1));
    }
    rep_args ln2 = {m->dtmp, m->dsummed, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd};
    gpt_replicated_grads(m, &pk, 0, &ln2, g->ln2w, g->ln2b, Rl);
    float *dy2 = a->res2; /* read by ln_2's backward just now: d(res2) goes there */
    k->residual_forward(dy2, dy, m->dtmp, Rl * C);
    /* Attention branch */
    LOOM_TRY(B_LEAVE(LOOM_REGION_ATTENTION, l, dy2, dy2, R, C));
    float *datty = m->dpartial;
    if (!gpt_matmul_backward16(m, datty, NULL, NULL, dy2, NULL, w->attprojw, 0, 1, (int)R, Cl,
                               C))
        k->gemm(0, 0, (int)R, Cl, C, 1.0f, dy2, C, w->attprojw, Cl, 0.0f, datty, Cl);
    /* GELU's input, read above: d(qkv) goes there, unless W recomputes GELU from it */
    float *dqkv = a->dqkv ? a->dqkv : a->fch;
    if (m->rc[l] == RC_SELECTIVE) /* the probabilities again (gpt.c); dbuf_4b: unused in B */
        gpt_attention_fwd(m, l, m->dbuf_4b, a->att, a->qkv, B, T);
    gpt_attention_backward(m, l, dqkv, datty, B, T); /* + a distillation term's */
    LOOM_TRY(gpt_column_parallel_backward_input(m, LOOM_REGION_ATTENTION, l, dqkv, w->qkvw, B,
                                                T, 3 * Cl, 3));
    rep_args ln1 = {m->dtmp, m->dsummed, residual, w->ln1w, a->ln1_mean, a->ln1_rstd};
    gpt_replicated_grads(m, &pk, 0, &ln1, g->ln1w, g->ln1b, Rl);
    k->residual_forward(dx, dy2, m->dtmp, Rl * C); /* dx may be residual: read just now */
    return LOOM_OK;
}

/* W of block l, from what its B kept. */
static loom_status block_weight(loom_gpt *m, int l, const float *dy, int B, int T, size_t Rl)
{
    const loom_backend_ops *k = m->be->ops;
    const int C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    gpt_widen_block(m, l);
    layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
    layer_acts *a = &m->acts[l];
    rep_pack pk = {.n = 0};
    if (m->moe && gpt_moe_block(&m->cfg, l)) { /* the router's and experts' W (moe.h) */
        LOOM_TRY(gpt_moe_backward_weight(m, l, gpt_moe_router(m, l), (size_t)B * T));
    } else {
        if (m->rc[l] == RC_SELECTIVE) { /* the GELU output again, into the shared scratch */
            k->gelu_forward(a->fch_gelu, a->fch, (size_t)B * T * Fl);
            gpt_round(m, a->fch_gelu, (size_t)B * T * Fl); /* as the forward stored it */
        }
        gpt_matmul_backward(m, NULL, g->fcprojw, NULL, dy, a->fch_gelu, w->fcprojw, B, T, Fl, C);
        rep_args pb = {.dout = dy};
        gpt_replicated_grads(m, &pk, 1, &pb, NULL, g->fcprojb, Rl);
        gpt_matmul_backward(m, NULL, g->fcw, g->fcb, a->dfch, a->ln2_full, w->fcw, B, T, C, Fl);
    }
    gpt_matmul_backward(m, NULL, g->attprojw, NULL, a->res2, a->atty, w->attprojw, B, T, Cl, C);
    rep_args ab = {.dout = a->res2};
    gpt_replicated_grads(m, &pk, 1, &ab, NULL, g->attprojb, Rl);
    gpt_matmul_backward(m, NULL, g->qkvw, g->qkvb, a->dqkv ? a->dqkv : a->fch, a->ln1_full,
                        w->qkvw, B, T, C, 3 * Cl);
    LOOM_TRY(gpt_rep_flush(m, &pk));
    if (m->canonical || m->sp) { /* the layer norms' parts B left (see gpt_replicated_grads) */
        rep_pack ln = {{g->ln2w, g->ln2b, g->ln1w, g->ln1b}, 4, a->ln_part};
        LOOM_TRY(gpt_rep_flush(m, &ln));
    }
    return LOOM_OK;
}

loom_status loom_gpt_stage_backward_input(loom_gpt *m, int lo, int hi, float *head_dw)
{
    LOOM_TRY(check_split(m, lo, hi));
    const loom_backend_ops *k = m->be->ops;
    int B = m->last_B, T = m->last_T, C = m->cfg.dim;
    size_t R = (size_t)B * T;
    if (hi == m->cfg.layers) {
        /* LM head (GPT-2's: wte): d(ln_f out) into dsummed; then ln_f: dres = d(last block) */
        gpt_stage_head_loss_grad(m, R);
        LOOM_TRY(gpt_stage_head_units(m, hi, 1));
        LOOM_TRY(gpt_column_parallel_backward_input(m, LOOM_REGION_HEAD, -1, m->logits,
                                                    m->p.head, B, T, m->Vl, 1));
        if (head_dw) { /* one micro-batch's head half, on its own (canonical mode's tied wte) */
            k->zero(m->be->self, head_dw, (size_t)m->Vl * C * sizeof(float));
            gpt_matmul_backward(m, NULL, head_dw, NULL, m->logits, m->lnf_full, m->p.head, B, T,
                                C, m->Vl);
        }
        rep_pack pk = {.n = 0, .base = m->lnf_part};
        rep_args lnf = {m->dres, m->dsummed, m->acts[hi - 1].res3, m->p.lnfw, m->lnf_mean,
                        m->lnf_rstd};
        gpt_replicated_grads(m, &pk, gpt_norm_kind(m), &lnf, m->g.lnfw, m->g.lnfb, R);
        LOOM_TRY(gpt_stage_head_units(m, hi, 0));
    }
    for (int l = hi - 1; l >= lo; l--) {
        float *residual = l == lo ? m->encoded : m->acts[l - 1].res3;
        float *dx = l == lo ? m->dx_out : m->acts[l - 1].res3;
        LOOM_TRY(gpt_stage_block_unit(m, l, lo, 0));
        gpt_distill_hidden_dy(m, l, block_dy(m, l, hi), R); /* + the hidden-state term's */
        if (m->llama)
            LOOM_TRY(gpt_llama_block_input(m, l, residual, block_dy(m, l, hi), dx, B, T, R));
        else
            LOOM_TRY(block_input(m, l, residual, block_dy(m, l, hi), dx, B, T, R));
        LOOM_TRY(gpt_stage_block_unit(m, l, lo, 1));
    }
    return LOOM_OK;
}

loom_status loom_gpt_stage_backward_weight(loom_gpt *m, int lo, int hi, int head_done)
{
    LOOM_TRY(check_split(m, lo, hi));
    const loom_backend_ops *k = m->be->ops;
    int B = m->last_B, T = m->last_T, C = m->cfg.dim;
    size_t R = (size_t)B * T;
    if (hi == m->cfg.layers) {
        if (!head_done)
            gpt_matmul_backward(m, NULL, m->g.head, NULL, m->logits, m->lnf_full, m->p.head, B,
                                T, C, m->Vl);
        if (m->canonical || m->sp) { /* RMSNorm (llama): a weight, no bias */
            rep_pack ln = {{m->g.lnfw, m->g.lnfb}, m->llama ? 1 : 2, m->lnf_part};
            LOOM_TRY(gpt_rep_flush(m, &ln));
        }
        gpt_distill_hidden_head(m); /* the projections' gradients (gpt_distill.h) */
        LOOM_TRY(gpt_stage_ready(m, -1, 0)); /* the data-parallel overlap (gpt_stage.h) */
    }
    for (int l = hi - 1; l >= lo; l--) {
        LOOM_TRY(m->llama ? gpt_llama_block_weight(m, l, block_dy(m, l, hi), B, T)
                          : block_weight(m, l, block_dy(m, l, hi), B, T, R));
        LOOM_TRY(gpt_stage_ready(m, l, 0));
    }
    if (lo == 0) {
        LOOM_TRY(B_LEAVE(LOOM_REGION_EMBEDDING, -1, m->dx_out, m->dx_out, R, C));
        gpt_embedding_grad(m, m->dx_out, R);
        if (m->g.wpe) /* learned positions (GPT-2); the llama family's are rotary */
            k->position_backward(m->g.wpe, m->dx_out, B, T, C);
    }
    if (lo == 0 || hi == m->cfg.layers)
        LOOM_TRY(gpt_stage_ready(m, -1, 1));
    return LOOM_OK;
}
