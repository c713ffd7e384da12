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
    if (m->sp)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "pipeline stages do not run under sequence parallelism");
    return LOOM_OK;
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
    if (B < 1 || B > m->max_B || T < 1 || T > m->cfg.ctx)
        LOOM_FAIL(LOOM_ERR_INVALID, "batch %dx%d outside the model's %dx%d", B, T, m->max_B,
                  m->cfg.ctx);
    if (head && dloss != 0.0f && !targets)
        LOOM_FAIL(LOOM_ERR_INVALID, "a training forward needs targets");
    size_t R = (size_t)B * T;
    if (lo == 0) {
        for (size_t i = 0; i < R; i++)
            if (tokens[i] < 0 || tokens[i] >= V)
                LOOM_FAIL(LOOM_ERR_INVALID, "token %d at position %zu is outside the vocabulary "
                          "[0, %d)", tokens[i], i, V);
        k->copy_to_device(bs, m->tokens, tokens, R * sizeof(int));
        float *embedded = m->tp_ops ? m->partial : m->encoded;
        gpt_embed_lookup(m, embedded, m->tokens, tokens, R);
        LOOM_TRY(F_LEAVE(LOOM_REGION_EMBEDDING, -1, embedded, m->encoded, R, C));
        if (m->p.wpe)
            k->position_forward(m->encoded, m->p.wpe, 0, R, T, C);
        gpt_round(m, m->encoded, R * (size_t)C);
    }
    const float *residual = m->encoded;
    for (int l = lo; l < hi; l++) {
        LOOM_TRY(gpt_block_forward(m, l, residual, B, T, R));
        residual = m->acts[l].res3;
    }
    m->last_B = B;
    m->last_T = T;
    if (!head)
        return LOOM_OK;
    gpt_final_norm_forward(m, residual, 0, R);
    gpt_round(m, m->lnf, R * (size_t)C);
    LOOM_TRY(F_ENTER(LOOM_REGION_HEAD, -1, m->lnf, m->lnf_full, R, C));
    gpt_head_forward(m, m->logits, m->lnf_full, B, T);
    gpt_round(m, m->logits, R * (size_t)m->Vl);
    if (targets) {
        k->copy_to_device(bs, m->targets, targets, R * sizeof(int));
        LOOM_TRY(gpt_vocab_cross_entropy(m, (int)R, dloss));
        k->copy_to_host(bs, m->host_losses, m->losses, R * sizeof(float));
        double sum = 0.0;
        for (size_t i = 0; i < R; i++)
            sum += m->host_losses[i];
        if (loss_sum)
            *loss_sum = sum;
    }
    return LOOM_OK;
}

loom_status loom_gpt_stage_backward(loom_gpt *m, int lo, int hi)
{
    LOOM_TRY(gpt_check_chunk(m, lo, hi));
    const loom_backend_ops *k = m->be->ops;
    int B = m->last_B, T = m->last_T, C = m->cfg.dim;
    size_t R = (size_t)B * T;
    rep_pack pk = {.n = 0};
    if (hi == m->cfg.layers) {
        /* LM head (tied to wte) and the final layernorm: dres = d(last block output). */
        LOOM_TRY(gpt_column_parallel_backward(m, LOOM_REGION_HEAD, -1, m->g.head, NULL,
                                              m->logits, m->lnf_full, m->p.head, B, T, m->Vl, 1));
        rep_args lnf = {m->dres, m->dsummed, m->acts[hi - 1].res3, m->p.lnfw, m->lnf_mean,
                        m->lnf_rstd};
        gpt_replicated_grads(m, &pk, gpt_norm_kind(m), &lnf, m->g.lnfw, m->g.lnfb, R);
        LOOM_TRY(gpt_rep_flush(m, &pk));
    }
    for (int l = hi - 1; l >= lo; l--) {
        const float *residual = l == lo ? m->encoded : m->acts[l - 1].res3;
        LOOM_TRY(gpt_block_backward(m, l, residual, &pk, B, T, R));
        LOOM_TRY(gpt_rep_flush(m, &pk));
    }
    if (lo == 0) {
        LOOM_TRY(B_LEAVE(LOOM_REGION_EMBEDDING, -1, m->dres, m->dres_full, R, C));
        gpt_embedding_grad(m, m->dres_full, R);
        if (m->g.wpe)
            k->position_backward(m->g.wpe, m->dres_full, B, T, C);
    }
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
