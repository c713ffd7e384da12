/* gpt_stage.c — forward and backward of one pipeline chunk (see gpt_stage.h).
 *
 * The blocks [lo, hi) run through gpt.c's own gpt_block_forward / gpt_block_backward, so
 * a stage run chunk after chunk computes what one rank computes, and fast mode differs
 * from one rank only where the engine's sums reassociate (the tied wte's two gradient
 * halves, the loss and norm totals). Here: the chunk's ends (embedding on the first
 * stage, final layernorm, tied head and loss on the last) and the checks.
 */
#include "gpt_stage.h"
#include "moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "base/status.h"


void loom_gpt_stage_select(loom_gpt *m, int slot) { gpt_bind_slot(m, slot); }
int loom_gpt_is_stage(const loom_gpt *m) { return m->staged; }

/* The parameter hook (gpt.h); unit -1: none (the chunk ends). */
static loom_status use(loom_gpt *m, int unit, int needed)
{
    if (!m->param_use || unit < 0)
        return LOOM_OK;
    LOOM_TRY(m->param_use(m->param_use_ctx, unit, needed));
    if (needed == 1)
        gpt_w16_unit(m, unit); /* 16-bit weights: the gathered unit's compute copy */
    return LOOM_OK;
}

loom_status loom_gpt_stage_prefetch(loom_gpt *m, int lo, int hi, int backward)
{
    int L = m->cfg.layers;
    if (!backward)
        return use(m, lo == 0 ? 0 : 1 + lo, LOOM_PARAM_SOON);
    if (hi < L)
        return use(m, hi, LOOM_PARAM_SOON); /* block hi - 1 */
    LOOM_TRY(use(m, L + 1, LOOM_PARAM_SOON)); /* the head: ln_f and the tied wte */
    return use(m, 0, LOOM_PARAM_SOON);
}

float *loom_gpt_stage_input(loom_gpt *m) { return m->encoded; }
float *loom_gpt_stage_output(loom_gpt *m, int hi) { return m->acts[hi - 1].res3; }
float *loom_gpt_stage_grad(loom_gpt *m) { return m->dres; }

void gpt_embedding_grad(loom_gpt *m, const float *dout, size_t R)
{
    const loom_backend_ops *k = m->be->ops;
    size_t C = (size_t)m->cfg.dim;
    if (!m->emb_grad) {
        k->embedding_backward(m->g.wte, dout, m->tokens, m->v0, m->Vl, R, (int)C);
        return;
    }
    k->zero(m->be->self, m->emb_grad, (size_t)m->Vl * C * sizeof(float));
    k->embedding_backward(m->emb_grad, dout, m->tokens, m->v0, m->Vl, R, (int)C);
    k->accumulate(m->g.wte, m->emb_grad, (size_t)m->Vl * C);
}

loom_status gpt_check_chunk(const loom_gpt *m, int lo, int hi)
{
    if (lo < 0 || hi > m->cfg.layers || lo >= hi)
        LOOM_FAIL(LOOM_ERR_INVALID, "stage chunk [%d, %d) is not a run of blocks of 0..%d", lo, hi,
                  m->cfg.layers);
    for (int l = lo; l < hi; l++)
        if (!m->own[l])
            LOOM_FAIL(LOOM_ERR_INVALID, "block %d is not held by this pipeline stage", l);
    return LOOM_OK;
}

/* (gpt_internal.h) Hand the gradient-ready hook (gpt.h; set only around a chunk's last
 * backward of a step) table entries whose gradients are now final: block `layer`'s, or with layer < 0 the
 * entries outside blocks before the first block's (lead = 1: wte, wpe) or after the last
 * block's (lead = 0: ln_f and an untied head). Each is one contiguous range of the buffer;
 * a chunk reports its head's, its blocks top down, then its embedding's: descending. */
loom_status gpt_stage_ready(loom_gpt *m, int layer, int lead)
{
    if (!m->grad_ready)
        return LOOM_OK;
    const loom_param_table *t = &m->table;
    int first = -1, last = -1, blocks = 0;
    for (int i = 0; i < t->count; i++) {
        int in_block = t->entries[i].layer >= 0;
        blocks |= in_block;
        int want = layer >= 0 ? t->entries[i].layer == layer
                              : !in_block && (lead ? !blocks : blocks);
        if (want) {
            if (first < 0)
                first = i;
            last = i;
        }
    }
    if (first < 0)
        return LOOM_OK;
    const loom_param_entry *a = &t->entries[first], *b = &t->entries[last];
    return m->grad_ready(m->grad_ready_ctx, a->offset, b->offset + b->numel - a->offset);
}

int loom_gpt_stage_reports_ready(const loom_gpt *m) { return !m->moe; }

size_t loom_gpt_stage_rows(const loom_gpt *m, int B, int T)
{
    size_t R = (size_t)B * T;
    return m->sp ? R / (size_t)m->tp : R;
}

loom_status loom_gpt_stage_forward(loom_gpt *m, int lo, int hi, const int *tokens,
                                   const int *targets, int B, int T, float dloss,
                                   double *loss_sum)
{
    LOOM_TRY(gpt_check_chunk(m, lo, hi));
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int C = m->cfg.dim, V = m->cfg.vocab;
    int head = hi == m->cfg.layers;
    LOOM_TRY(gpt_check_batch(m, B, T));
    if (head && dloss != 0.0f && !targets)
        LOOM_FAIL(LOOM_ERR_INVALID, "a training forward needs targets");
    size_t R = (size_t)B * T;
    if (m->sp && R % (size_t)m->tp)
        LOOM_FAIL(LOOM_ERR_INVALID, "sequence parallelism splits the %d x %d = %zu token rows over "
                  "tp=%d ranks: they must divide", B, T, R, m->tp);
    /* under sequence parallelism this rank keeps rows [row0, row0 + Rl) of the residual
     * stream, and that shard is what crosses to the next stage */
    size_t Rl = loom_gpt_stage_rows(m, B, T), row0 = m->sp ? (size_t)m->tp_rank * Rl : 0;
    LOOM_TRY(gpt_att_prepare(m, B, T)); /* gpt_att.c: the spill, where att is too small */
    if (lo == 0) {
        for (size_t i = 0; i < R; i++)
            if (tokens[i] < 0 || tokens[i] >= V)
                LOOM_FAIL(LOOM_ERR_INVALID, "token %d at position %zu is outside the vocabulary "
                          "[0, %d)", tokens[i], i, V);
        k->copy_to_device(bs, m->tokens, tokens, R * sizeof(int));
        float *embedded = m->tp_ops ? m->partial : m->encoded;
        LOOM_TRY(use(m, 0, 1));
        LOOM_TRY(use(m, 1 + lo, LOOM_PARAM_SOON));
        gpt_embed_lookup(m, embedded, m->tokens, tokens, R);
        LOOM_TRY(F_LEAVE(LOOM_REGION_EMBEDDING, -1, embedded, m->encoded, R, C));
        if (m->p.wpe)
            k->position_forward(m->encoded, m->p.wpe, row0, Rl, T, C);
        gpt_round(m, m->encoded, Rl * (size_t)C);
        LOOM_TRY(use(m, 0, 0));
    }
    const float *residual = m->encoded;
    gpt_moe_begin(m, dloss); /* the MoE blocks' stats, and their aux/z losses' weight */
    for (int l = lo; l < hi; l++) {
        LOOM_TRY(use(m, 1 + l, 1));
        LOOM_TRY(use(m, l + 1 < hi ? 2 + l : head ? m->cfg.layers + 1 : -1, LOOM_PARAM_SOON));
        LOOM_TRY(gpt_block_forward(m, l, residual, B, T, Rl));
        if (head && targets && dloss != 0.0f)
            LOOM_TRY(gpt_distill_attn_forward(m, l, targets, B, T, dloss)); /* gpt_distill.h */
        LOOM_TRY(use(m, 1 + l, 0));
        residual = m->acts[l].res3;
    }
    m->last_B = B;
    m->last_T = T;
    m->cache_len = B == 1 && !m->sp ? T : 0; /* the rows loom_gpt_stage_decode continues from */
    if (!head)
        return LOOM_OK;
    LOOM_TRY(use(m, m->cfg.layers + 1, 1)); /* ln_f */
    LOOM_TRY(use(m, 0, 1));                 /* the tied head's wte */
    gpt_final_norm_forward(m, residual, 0, Rl);
    gpt_round(m, m->lnf, Rl * (size_t)C);
    LOOM_TRY(F_ENTER(LOOM_REGION_HEAD, -1, m->lnf, m->lnf_full, R, C));
    gpt_head_forward(m, m->logits, m->lnf_full, B, T);
    gpt_round(m, m->logits, R * (size_t)m->Vl);
    if (targets) {
        k->copy_to_device(bs, m->targets, targets, R * sizeof(int));
        int distill = dloss != 0.0f && gpt_distill_select(m, targets, R); /* gpt_distill.h */
        if (distill)
            LOOM_TRY(gpt_distill_before(m, R, dloss));
        /* The logits' gradient (softmax - one-hot, scaled) is the backward's work, as in
         * Megatron: here only the losses, the logits and row statistics kept in the slot
         * for head_loss_grad. Distillation blends the two gradients here, so it keeps the
         * fused pass. */
        int defer = dloss != 0.0f && !distill;
        LOOM_TRY(gpt_vocab_cross_entropy(m, (int)R, defer ? 0.0f : dloss));
        m->ce_dloss[m->cur_slot] = defer ? dloss : 0.0f;
        if (distill)
            gpt_distill_after(m, R);
        if (dloss != 0.0f) /* the intermediate terms (gpt_distill.h): nothing unless set */
            LOOM_TRY(gpt_distill_hidden(m, targets, R, dloss));
        k->copy_to_host(bs, m->host_losses, m->losses, R * sizeof(float));
        double sum = 0.0;
        for (size_t i = 0; i < R; i++)
            sum += m->host_losses[i];
        if (loss_sum)
            *loss_sum = sum;
    }
    LOOM_TRY(use(m, m->cfg.layers + 1, 0));
    return use(m, 0, 0);
}

/* (gpt_internal.h) The logits' gradient the slot's forward left to the backward, in place
 * over its logits, before the head's input gradient reads it: the same ce_finish on the
 * same kept statistics, so the same bits as computing it in the forward. The forward
 * keeps nothing it did not keep before (the logits, the gradient's buffer, and the row
 * statistics were per slot already), so the activation accounting is unchanged. */
void gpt_stage_head_loss_grad(loom_gpt *m, size_t R)
{
    float dloss = m->ce_dloss[m->cur_slot];
    if (dloss == 0.0f)
        return;
    gpt_vocab_cross_entropy_grad(m, (int)R, dloss);
    m->ce_dloss[m->cur_slot] = 0.0f;
}

/* Gather what the head's backward reads (ln_f, the tied wte) before it runs (head = 1),
 * release them after (head = 0); hint block hi - 1 meanwhile. */
loom_status gpt_stage_head_units(loom_gpt *m, int hi, int head)
{
    int L = m->cfg.layers;
    if (!head) {
        LOOM_TRY(use(m, L + 1, 0));
        return use(m, 0, 0);
    }
    LOOM_TRY(use(m, L + 1, 1));
    LOOM_TRY(use(m, 0, 1));
    return use(m, hi, LOOM_PARAM_SOON);
}

/* Block l's unit around its backward: needed before (done = 0), done after (1); the next
 * block down hinted once this one is in place. */
loom_status gpt_stage_block_unit(loom_gpt *m, int l, int lo, int done)
{
    if (done)
        return use(m, 1 + l, 0);
    LOOM_TRY(use(m, 1 + l, 1));
    return use(m, l > lo ? l : -1, LOOM_PARAM_SOON);
}

loom_status loom_gpt_stage_backward(loom_gpt *m, int lo, int hi)
{
    if (m->frozen)
        LOOM_FAIL(LOOM_ERR_INVALID, "a frozen model (a distillation teacher's stage) runs "
                  "forward only: it has no gradients to compute");
    LOOM_TRY(gpt_check_chunk(m, lo, hi));
    LOOM_TRY(gpt_att_check_backward(m));
    const loom_backend_ops *k = m->be->ops;
    int B = m->last_B, T = m->last_T, C = m->cfg.dim;
    size_t R = (size_t)B * T, Rl = loom_gpt_stage_rows(m, B, T);
    rep_pack pk = {.n = 0};
    if (hi == m->cfg.layers) {
        /* LM head (tied to wte) and the final layernorm: dres = d(last block output). Under
         * sequence parallelism ln_f's rows are gathered again, as loom_gpt_backward does:
         * every layer's gather shares the slot's one gathered buffer. */
        gpt_stage_head_loss_grad(m, R);
        LOOM_TRY(gpt_stage_head_units(m, hi, 1));
        LOOM_TRY(gpt_regather(m, LOOM_REGION_HEAD, -1, m->lnf, m->lnf_full, R));
        LOOM_TRY(gpt_column_parallel_backward(m, LOOM_REGION_HEAD, -1, m->g.head, NULL,
                                              m->logits, m->lnf_full, m->p.head, B, T, m->Vl, 1));
        rep_args lnf = {m->dres, m->dsummed, m->acts[hi - 1].res3, m->p.lnfw, m->lnf_mean,
                        m->lnf_rstd};
        gpt_replicated_grads(m, &pk, gpt_norm_kind(m), &lnf, m->g.lnfw, m->g.lnfb, Rl);
        LOOM_TRY(gpt_rep_flush(m, &pk));
        gpt_distill_hidden_head(m); /* the projections' gradients (gpt_distill.h) */
        LOOM_TRY(gpt_stage_head_units(m, hi, 0));
        LOOM_TRY(gpt_stage_ready(m, -1, 0));
    }
    for (int l = hi - 1; l >= lo; l--) {
        const float *residual = l == lo ? m->encoded : m->acts[l - 1].res3;
        LOOM_TRY(gpt_stage_block_unit(m, l, lo, 0));
        gpt_distill_hidden_backward(m, l, Rl); /* d(res3) += the hidden-state term's */
        LOOM_TRY(gpt_block_backward(m, l, residual, &pk, B, T, Rl));
        LOOM_TRY(gpt_rep_flush(m, &pk));
        LOOM_TRY(gpt_stage_block_unit(m, l, lo, 1));
        LOOM_TRY(gpt_stage_ready(m, l, 0));
    }
    if (lo == 0) {
        LOOM_TRY(B_LEAVE(LOOM_REGION_EMBEDDING, -1, m->dres, m->dres_full, R, C));
        gpt_embedding_grad(m, m->dres_full, R);
        if (m->g.wpe)
            k->position_backward(m->g.wpe, m->dres_full, B, T, C);
    }
    if (lo == 0 || hi == m->cfg.layers) /* wte (and wpe): the embedding's, or the head's half */
        LOOM_TRY(gpt_stage_ready(m, -1, 1));
    return LOOM_OK;
}

int loom_gpt_held_elsewhere(const loom_gpt *m, const char *name)
{
    if (gpt_moe_held_elsewhere(m, name))
        return 1; /* another ep rank's expert (moe.h) */
    if (!m->staged || loom_params_find(&m->table, name))
        return 0;
    if (strcmp(name, "wte") == 0)
        return 1; /* not held: a middle stage */
    if (strcmp(name, "wpe") == 0)
        return !m->has_embed;
    if (strcmp(name, "ln_f.weight") == 0 || strcmp(name, "ln_f.bias") == 0 ||
        (m->llama && strcmp(name, "lm_head.weight") == 0))
        return !m->has_head;
    /* h.<l>.<suffix>: a block another stage holds, with a suffix a block of ours has
     * (every stage holds at least one block, so its table lists every suffix) */
    char *end;
    if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9')
        return 0;
    long l = strtol(name + 2, &end, 10);
    if (*end != '.' || l < 0 || l >= m->cfg.layers || m->own[l])
        return 0;
    for (int k = 0; k < m->cfg.layers; k++) {
        char mine[LOOM_PARAM_NAME_MAX];
        if (!m->own[k])
            continue;
        if ((size_t)snprintf(mine, sizeof mine, "h.%d%s", k, end) >= sizeof mine)
            return 0;
        return loom_params_find(&m->table, mine) != NULL;
    }
    return 0;
}
