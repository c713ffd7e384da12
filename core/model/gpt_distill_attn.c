/* gpt_distill_attn.c — distillation's attention-probability term (TinyBERT, Jiao et al.
 * 2020), per query row: gamma/NH * sum over heads h, keys j of (P_s - P_t)^2, with P the
 * causal softmax probabilities attention_forward saves (B,NH,T,T; zero above the
 * diagonal in both, so those entries add nothing). The mean over rows the trainer takes
 * of per-token losses makes it gamma * mean over heads and queries of sum_keys (P_s-P_t)^2.
 * Its gradient with respect to P_s goes to backend.h's attention_backward_datt.
 * Sums in double in fixed order: the same bits whatever the thread count or layout; under
 * tp each rank's heads' sums are gathered and added in head order, one rank's order.
 */
#include "gpt_distill.h"

void loom_kd_attention_rows(const float *ps, const float *pt, int B, int NH, int T, float gamma,
                            float scale, double *loss, float *dp)
{
    const double w = (double)gamma / NH, g = 2.0 * w * scale;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double sq = 0.0;
            for (int h = 0; h < NH; h++) { /* each head's sum, then heads in order: tp's order */
                size_t row = (((size_t)b * NH + h) * T + t) * T;
                double sh = 0.0;
                for (int j = 0; j < T; j++) {
                    double d = (double)ps[row + j] - pt[row + j];
                    sh += d * d;
                    if (dp)
                        dp[row + j] = (float)(g * d);
                }
                sq += sh;
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
#include <string.h>

#include "gpt_internal.h"
#include "base/backend.h"
#include "base/status.h"

loom_status loom_gpt_set_distill_attention(loom_gpt *m, const float *const *teacher_att,
                                           float gamma)
{
    const loom_backend_ops *k = m->be->ops;
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
    for (int l = 0; teacher_att && l < m->cfg.layers; l++) /* where att is the fused kernels'
        * state (gpt_att.c), the mapped blocks keep probabilities on the batched path */
        if (teacher_att[l]) {
            LOOM_TRY(loom_gpt_keep_block_attention(m, l));
            LOOM_TRY(gpt_att_check_probabilities(m, l, "distillation's attention term"));
        }
    if (teacher_att)
        LOOM_TRY(gpt_distill_terms_check(m, teacher_att, "distillation's attention term"));
    m->kd_a_first = -1;
    for (int l = m->cfg.layers - 1; teacher_att && l >= 0; l--)
        if (teacher_att[l])
            m->kd_a_first = l;
    if (teacher_att && m->kd_a_first < 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "distillation's attention term: no student block is mapped");
    size_t R = (size_t)m->max_B * (size_t)m->max_T;
    if (teacher_att && !m->kd_datt) {
        m->kd_datt = malloc(R * (size_t)m->NHl * (size_t)m->max_T * sizeof(float));
        m->kd_aloss = malloc(R * sizeof(double));
        m->kd_hsum = malloc((size_t)(m->tp + 1) * R * (size_t)m->NHl * sizeof(double));
        m->kd_bytes += R * (size_t)m->NHl * (size_t)m->max_T * sizeof(float) + R * sizeof(double) +
                       (size_t)(m->tp + 1) * R * (size_t)m->NHl * sizeof(double);
        if (!m->kd_datt || !m->kd_aloss || !m->kd_hsum)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the attention-probability term");
    }
    if (teacher_att && loom_backend_device_memory(m->be) && !m->kd_ps_host) {
        /* on a device: the probabilities copied to the host, the gradient back */
        size_t n = R * (size_t)m->NHl * (size_t)m->max_T;
        m->kd_ps_host = malloc(n * sizeof(float));
        m->kd_datt_dev = k->alloc(m->be->self, n * sizeof(float));
        m->kd_bytes += 2 * n * sizeof(float);
        if (!m->kd_ps_host || !m->kd_datt_dev)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the attention-probability term's copies");
    }
    if (teacher_att && loom_backend_device_memory(m->be) && m->tp_ops && !m->kd_hsum_dev) {
        /* the per-head row sums gathered over the tp group on the device */
        size_t bytes = (size_t)(m->tp + 1) * R * (size_t)m->NHl * sizeof(double);
        if (!(m->kd_hsum_dev = k->alloc(m->be->self, bytes)))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of device memory for the attention term's tp gather");
        m->kd_bytes += bytes;
    }
    m->kd_att = teacher_att;
    m->kd_gamma = gamma;
    m->kd_att_h0 = 0; /* the teacher split as the student: its heads are this rank's */
    m->kd_att_nh = m->NHl;
    for (int sl = 0; m->kd_slot && sl < m->slots; sl++)
        m->kd_slot[sl].a_live = 0;
    return LOOM_OK;
}

loom_status loom_gpt_set_distill_attention_whole(loom_gpt *m, int whole)
{
    if (!m->kd_att)
        LOOM_FAIL(LOOM_ERR_INVALID, "distillation's attention term is not set");
    m->kd_att_nh = whole ? m->cfg.heads : m->NHl;
    m->kd_att_h0 = whole ? m->tp_rank * m->NHl : 0; /* rank p holds heads p*NHl .. */
    return LOOM_OK;
}

const float *loom_gpt_block_attention(const loom_gpt *m, int l)
{
    if (l < 0 || l >= m->cfg.layers || !m->own[l] || (m->rc[l] != RC_KEEP && !gpt_frozen_att(m, l)) ||
        !gpt_att_probabilities(m, l))
        return NULL; /* not held, not kept past its block, or not probabilities (gpt_att.c:
                      * the fused kernels' state; loom_gpt_keep_block_attention first) */
    return m->acts[l].att; /* under tp: this rank's NHl heads */
}

loom_status loom_gpt_gather_block_attention(loom_gpt *m, int l, int B, int T, float *blocks,
                                            float *whole)
{
    const float *mine = loom_gpt_block_attention(m, l);
    if (!mine)
        LOOM_FAIL(LOOM_ERR_INVALID, "block %d's attention probabilities are not kept here", l);
    size_t tt = (size_t)T * T, per = (size_t)B * m->NHl * tt; /* one rank's (B,NHl,T,T) */
    if (!m->tp_ops) {
        memcpy(whole, mine, per * sizeof(float));
        return LOOM_OK;
    }
    LOOM_TRY(m->tp_ops->tensor_allgather(m->tp_self, mine, blocks, per));
    size_t NH = (size_t)m->cfg.heads, NHl = (size_t)m->NHl;
    for (size_t p = 0; p < (size_t)m->tp; p++) /* rank p's heads p*NHl .. of every batch row */
        for (size_t b = 0; b < (size_t)B; b++)
            memcpy(whole + (b * NH + p * NHl) * tt, blocks + p * per + b * NHl * tt,
                   NHl * tt * sizeof(float));
    return LOOM_OK;
}

/* The teacher's (T,T) probabilities of batch row b and this rank's head h for block l of
 * the micro-batch whose first step row is r0 (a stage's step buffer holds each
 * micro-batch's (B,nh,T,T) in turn; elsewhere r0 = 0). nh: the heads the buffer holds
 * (all of a whole teacher's, of which this rank's start at h0, or this rank's). */
static const float *teacher_probs(const loom_gpt *m, int l, size_t r0, int B, int T, int b,
                                  int h)
{
    size_t R = (size_t)B * T, nh = (size_t)m->kd_att_nh, A = R * nh * (size_t)T;
    return m->kd_att[l] + r0 / R * A + ((size_t)b * nh + (size_t)(m->kd_att_h0 + h)) * T * T;
}

loom_status gpt_distill_attn_forward(loom_gpt *m, int l, const int *targets, int B, int T,
                                     float dloss)
{
    if (!m->kd_att)
        return LOOM_OK;
    struct gpt_kd_slot *ks = &m->kd_slot[m->cur_slot];
    size_t R = (size_t)B * T;
    if (l == m->kd_a_first) {
        for (size_t r = 0; r < R; r++)
            m->kd_aloss[r] = 0.0;
        ks->a_live = gpt_distill_row0(m, targets, R, &ks->r0); /* 0: not the step's rows */
        ks->a_scale = dloss;
    }
    if (!m->kd_att[l] || !ks->a_live)
        return LOOM_OK;
    /* each of this rank's heads' sum per row (loom_kd_attention_rows' order), gathered over
     * tp and added in head order: rank p holds heads p*NHl ..; the same bits at any tp */
    int NHl = m->NHl, P = m->tp_ops ? m->tp : 1;
    const float *ps = gpt_kd_host_view(m, m->acts[l].att, R * (size_t)NHl * (size_t)T,
                                       m->kd_ps_host);
    double *mine = m->kd_hsum, *all = m->tp_ops ? m->kd_hsum + R * (size_t)NHl : mine;
    for (size_t r = 0; r < R; r++)
        for (int h = 0; h < NHl; h++) {
            size_t b = r / (size_t)T, t = r % (size_t)T;
            size_t row = ((b * (size_t)NHl + (size_t)h) * (size_t)T + t) * (size_t)T;
            const float *pt = teacher_probs(m, l, ks->r0, B, T, (int)b, h) + t * (size_t)T;
            double sh = 0.0;
            for (int j = 0; j < T; j++) {
                double d = (double)ps[row + j] - pt[j];
                sh += d * d;
            }
            mine[r * (size_t)NHl + (size_t)h] = sh;
        }
    if (m->tp_ops) { /* doubles moved as pairs of floats: a gather copies, it does not add.
        * On a device the tp group gathers in the backend's memory: the sums (R NHl doubles,
        * a (T NHl)-th of the probabilities this rank already copied) go there and all
        * ranks' come back; the term stays on the host, in the host path's order and bits */
        size_t n = 2 * R * (size_t)NHl;
        if (m->kd_hsum_dev) {
            double *dmine = m->kd_hsum_dev, *dall = m->kd_hsum_dev + R * (size_t)NHl;
            m->be->ops->copy_to_device(m->be->self, dmine, mine, n * sizeof(float));
            LOOM_TRY(m->tp_ops->tensor_allgather(m->tp_self, (const float *)dmine, (float *)dall, n));
            m->be->ops->copy_to_host(m->be->self, all, dall, (size_t)P * n * sizeof(float));
        } else
            LOOM_TRY(m->tp_ops->tensor_allgather(m->tp_self, (const float *)mine, (float *)all, n));
    }
    const double w = (double)m->kd_gamma / m->cfg.heads;
    for (size_t r = 0; r < R; r++) {
        double sq = 0.0;
        for (int p = 0; p < P; p++)
            for (int h = 0; h < NHl; h++)
                sq += all[((size_t)p * R + r) * (size_t)NHl + (size_t)h];
        m->kd_aloss[r] += w * sq;
    }
    return LOOM_OK;
}

void gpt_attention_backward(loom_gpt *m, int l, float *dqkv, const float *datty, int B, int T)
{
    const loom_backend_ops *k = m->be->ops;
    const layer_acts *a = &m->acts[l];
    struct gpt_kd_slot *ks = m->kd_att && m->kd_slot ? &m->kd_slot[m->cur_slot] : NULL;
    if (!ks || !ks->a_live || !m->kd_att[l]) {
        gpt_attention_bwd(m, l, dqkv, m->datt_scratch, datty, a->qkv, a->att, B, T);
        return;
    }
    /* d(probabilities) from the saved ones; the loss rows it also adds land in kd_aloss,
     * already added to the losses and cleared by the next forward */
    {   /* this rank's heads: 2 gamma/NH (P_s - P_t), NH the model's head count */
        const double g = 2.0 * ((double)m->kd_gamma / m->cfg.heads) * ks->a_scale;
        size_t tt = (size_t)T * (size_t)T, n = (size_t)B * m->NHl * tt;
        const float *att = gpt_kd_host_view(m, a->att, n, m->kd_ps_host); /* a device's: copied */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < m->NHl; h++) {
                size_t at = ((size_t)b * m->NHl + (size_t)h) * tt;
                const float *ps = att + at, *pt = teacher_probs(m, l, ks->r0, B, T, b, h);
                for (size_t i = 0; i < tt; i++)
                    m->kd_datt[at + i] = (float)(g * ((double)ps[i] - pt[i]));
            }
        if (m->kd_datt_dev)
            k->copy_to_device(m->be->self, m->kd_datt_dev, m->kd_datt, n * sizeof(float));
    }
    k->attention_backward_datt(dqkv, m->datt_scratch, datty, a->qkv, a->att,
                               m->kd_datt_dev ? m->kd_datt_dev : m->kd_datt, B, T, m->Cl, m->NHl);
    if (l == m->kd_a_first)
        ks->a_live = 0;
}

void gpt_distill_attn_free(loom_gpt *m)
{
    if (m->kd_datt_dev)
        m->be->ops->free(m->be->self, m->kd_datt_dev);
    if (m->kd_hsum_dev)
        m->be->ops->free(m->be->self, m->kd_hsum_dev);
    free(m->kd_ps_host);
    free(m->kd_datt);
    free(m->kd_aloss);
    free(m->kd_hsum);
}
