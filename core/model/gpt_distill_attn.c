/* gpt_distill_attn.c — distillation's attention-probability term (TinyBERT, Jiao et al.
 * 2020), per query row: gamma/NH * sum over heads h, keys j of (P_s - P_t)^2, with P the
 * causal softmax probabilities attention_forward saves (B,NH,T,T; zero above the
 * diagonal in both, so those entries add nothing). The mean over rows the trainer takes
 * of per-token losses makes it gamma * mean over heads and queries of sum_keys (P_s-P_t)^2.
 * Its gradient with respect to P_s goes to backend.h's attention_backward_datt.
 * Sums in double in fixed order: the same bits whatever the thread count or layout.
 */
#include "gpt_distill.h"

void loom_kd_attention_rows(const float *ps, const float *pt, int B, int NH, int T, float gamma,
                            float scale, double *loss, float *dp)
{
    const double w = (double)gamma / NH, g = 2.0 * w * scale;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double sq = 0.0;
            for (int h = 0; h < NH; h++) {
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                for (int j = 0; j < T; j++) {
                    double d = (double)ps[row + j] - pt[row + j];
                    sq += d * d;
                    if (dp)
                        dp[row + j] = (float)(g * d);
                }
            }
            loss[(size_t)b * T + t] += w * sq;
        }
}

/* --- through the model ----------------------------------------------------------------
 * Invariant: the forward adds each mapped block's loss rows to kd_aloss right after that
 * block (its probabilities are then in a->att, also when recomputation shares the buffer),
 * and gpt_distill_hidden adds them to the losses after the CE; the backward computes the
 * term's d(probabilities) again from a->att (kept, or recomputed with the same bits) and the
 * teacher's, which stay valid until that micro-batch's backward (the next teacher forward;
 * a pipeline stage: the step), so no (B,NH,T,T) gradient is kept per block or slot. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "gpt_internal.h"
#include "base/status.h"

loom_status loom_gpt_set_distill_attention(loom_gpt *m, const float *const *teacher_att,
                                           float gamma)
{
    const loom_backend_ops *k = m->be->ops;
    if (teacher_att && m->tp_ops)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "distillation's attention-probability term with tensor "
                  "parallelism (each rank holds some heads) is not built yet; use tp = 1");
    if (teacher_att && m->llama)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "distillation's attention-probability term is built for "
                  "the GPT-2 block, not the llama family's (grouped-query attention)");
    if (teacher_att && m->moe)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "distillation's attention-probability term with "
                  "mixture-of-experts blocks is not built yet");
    if (teacher_att && (k->size <= offsetof(loom_backend_ops, attention_backward_datt) ||
                        !k->attention_backward_datt))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "this backend has no attention_backward_datt "
                  "(plugin/backend.h), which the attention-probability term's gradient needs; "
                  "use backend = \"cpu\" or leave teacher.attention out");
    if (teacher_att && !(gamma >= 0.0f && isfinite(gamma)))
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.attention=%g must be true or a finite weight >= 0",
                  gamma);
    if (teacher_att)
        LOOM_TRY(gpt_distill_terms_check(m, teacher_att, "distillation's attention term"));
    m->kd_a_first = -1;
    for (int l = m->cfg.layers - 1; teacher_att && l >= 0; l--)
        if (teacher_att[l])
            m->kd_a_first = l;
    if (teacher_att && m->kd_a_first < 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "distillation's attention term: no student block is mapped");
    size_t R = (size_t)m->max_B * (size_t)m->cfg.ctx;
    if (teacher_att && !m->kd_datt) {
        m->kd_datt = malloc(R * (size_t)m->NHl * (size_t)m->cfg.ctx * sizeof(float));
        m->kd_aloss = malloc(R * sizeof(double));
        if (!m->kd_datt || !m->kd_aloss)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the attention-probability term");
    }
    m->kd_att = teacher_att;
    m->kd_gamma = gamma;
    for (int sl = 0; m->kd_slot && sl < m->slots; sl++)
        m->kd_slot[sl].a_live = 0;
    return LOOM_OK;
}

const float *loom_gpt_block_attention(const loom_gpt *m, int l)
{
    if (l < 0 || l >= m->cfg.layers || !m->own[l] || m->rc[l] != RC_KEEP || m->tp_ops)
        return NULL; /* not held, not kept past its block, or some heads only */
    return m->acts[l].att;
}

/* The teacher's probabilities for block l of the micro-batch whose first step row is r0
 * (a stage's step buffer holds each micro-batch's (B,NH,T,T) in turn; elsewhere r0 = 0). */
static const float *teacher_probs(const loom_gpt *m, int l, size_t r0, int B, int T)
{
    size_t R = (size_t)B * T, A = R * (size_t)m->NHl * (size_t)T;
    return m->kd_att[l] + r0 / R * A;
}

void gpt_distill_attn_forward(loom_gpt *m, int l, const int *targets, int B, int T, float dloss)
{
    if (!m->kd_att)
        return;
    struct gpt_kd_slot *ks = &m->kd_slot[m->cur_slot];
    size_t R = (size_t)B * T;
    if (l == m->kd_a_first) {
        for (size_t r = 0; r < R; r++)
            m->kd_aloss[r] = 0.0;
        ks->a_live = gpt_distill_row0(m, targets, R, &ks->r0); /* 0: not the step's rows */
        ks->a_scale = dloss;
    }
    if (!m->kd_att[l] || !ks->a_live)
        return;
    loom_kd_attention_rows(m->acts[l].att, teacher_probs(m, l, ks->r0, B, T), B, m->NHl, T,
                           m->kd_gamma, dloss, m->kd_aloss, NULL);
}

void gpt_attention_backward(loom_gpt *m, int l, float *dqkv, const float *datty, int B, int T)
{
    const loom_backend_ops *k = m->be->ops;
    const layer_acts *a = &m->acts[l];
    struct gpt_kd_slot *ks = m->kd_att && m->kd_slot ? &m->kd_slot[m->cur_slot] : NULL;
    if (!ks || !ks->a_live || !m->kd_att[l]) {
        k->attention_backward(dqkv, m->datt_scratch, datty, a->qkv, a->att, B, T, m->Cl, m->NHl);
        return;
    }
    /* d(probabilities) from the saved ones; the loss rows it also adds land in kd_aloss,
     * already added to the losses and cleared by the next forward */
    loom_kd_attention_rows(a->att, teacher_probs(m, l, ks->r0, B, T), B, m->NHl, T, m->kd_gamma,
                           ks->a_scale, m->kd_aloss, m->kd_datt);
    k->attention_backward_datt(dqkv, m->datt_scratch, datty, a->qkv, a->att, m->kd_datt, B, T,
                               m->Cl, m->NHl);
    if (l == m->kd_a_first)
        ks->a_live = 0;
}

void gpt_distill_attn_free(loom_gpt *m)
{
    free(m->kd_datt);
    free(m->kd_aloss);
}
