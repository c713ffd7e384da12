/* gpt_distill_hidden.c — distillation's hidden-state terms (gpt_distill.h): per mapped
 * student block l, beta * MSE(W_l h_s, h_t) over the rows of a training forward, h the
 * block's output residual stream (res3) and W_l the learned projection
 * "distill.proj.<l>.weight" (kd_proj_dim, dim), a parameter of the student's table.
 * Invariant: the forward computes the whole term at once — the loss rows, W_l's gradient
 * (added into grads, as backward adds every other one) and d term / d h_s (kd_dh[l]) —
 * and loom_gpt_backward adds kd_dh[l] to d(res3 of l) just before block l's backward.
 * Sums in double, in fixed row and column order: the same bits whatever the thread count.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_distill.h"
#include "gpt_internal.h"
#include "base/status.h"

static const loom_param_entry *proj_entry(const loom_gpt *m, int l)
{
    char name[LOOM_PARAM_NAME_MAX];
    snprintf(name, sizeof name, "distill.proj.%d.weight", l);
    return loom_params_find(&m->table, name);
}

void loom_kd_hidden_rows(const float *hs, const float *ht, const float *w, size_t R, int C,
                         int Ct, float beta, float scale, double *loss, float *y, float *dh,
                         float *dw)
{
    double k = 2.0 * (double)beta / Ct; /* d (beta/Ct sum d^2) / d y = k d */
    for (size_t r = 0; r < R; r++) {
        const float *h = hs + r * (size_t)C, *t = ht + r * (size_t)Ct;
        float *yr = y + r * (size_t)Ct;
        double sq = 0.0;
        for (int i = 0; i < Ct; i++) {
            double acc = 0.0;
            for (int j = 0; j < C; j++)
                acc += (double)w[(size_t)i * C + j] * h[j];
            double d = acc - t[i];
            sq += d * d;
            yr[i] = (float)(scale * k * d); /* y now holds d loss / d y */
        }
        loss[r] += (double)beta / Ct * sq;
    }
    for (size_t r = 0; dh && r < R; r++) { /* dh = dy W */
        const float *g = y + r * (size_t)Ct;
        for (int j = 0; j < C; j++) {
            double acc = 0.0;
            for (int i = 0; i < Ct; i++)
                acc += (double)g[i] * w[(size_t)i * C + j];
            dh[r * (size_t)C + j] = (float)acc;
        }
    }
    for (int i = 0; dw && i < Ct; i++) /* dw += dy^T h, rows in order */
        for (int j = 0; j < C; j++) {
            double acc = 0.0;
            for (size_t r = 0; r < R; r++)
                acc += (double)y[r * (size_t)Ct + i] * hs[r * (size_t)C + j];
            dw[(size_t)i * C + j] += (float)acc;
        }
}

loom_status loom_gpt_set_distill_hidden(loom_gpt *m, const float *const *teacher_h, float beta)
{
    if (teacher_h && (m->tp_ops || m->staged))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "distillation's hidden-state terms with %s are not built "
                  "yet; use tp = 1 and pp = 1 (one rank or dp)",
                  m->tp_ops ? "tensor parallelism" : "a pipeline");
    if (teacher_h && !(beta >= 0.0f && isfinite(beta)))
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.hidden=%g must be a finite weight >= 0", beta);
    int L = m->cfg.layers;
    size_t R = (size_t)m->max_B * (size_t)m->cfg.ctx, C = (size_t)m->cfg.dim;
    for (int l = 0; teacher_h && l < L; l++)
        if (teacher_h[l] && !proj_entry(m, l))
            LOOM_FAIL(LOOM_ERR_INVALID, "student block %d has a teacher block but no projection "
                      "(kd_proj_layers lacks bit %d)", l, l);
    if (teacher_h && !m->kd_dh) {
        m->kd_dh = calloc((size_t)L, sizeof *m->kd_dh);
        m->kd_hloss = malloc(R * sizeof(double));
        m->kd_y = malloc(R * (size_t)(m->cfg.kd_proj_dim > 0 ? m->cfg.kd_proj_dim : 1) * sizeof(float));
        if (!m->kd_dh || !m->kd_hloss || !m->kd_y)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the hidden-state terms");
    }
    for (int l = 0; teacher_h && l < L; l++)
        if (teacher_h[l] && !m->kd_dh[l] && !(m->kd_dh[l] = malloc(R * C * sizeof(float))))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the hidden-state terms");
    m->kd_h = teacher_h;
    m->kd_beta = beta;
    return LOOM_OK;
}

const float *loom_gpt_block_output(const loom_gpt *m, int l)
{
    return l >= 0 && l < m->cfg.layers && m->own[l] ? m->acts[l].res3 : NULL;
}

loom_status gpt_distill_hidden(loom_gpt *m, size_t R, float dloss)
{
    m->kd_h_live = 0;
    if (!m->kd_h && !m->kd_a_live)
        return LOOM_OK;
    int C = m->cfg.dim, Ct = m->cfg.kd_proj_dim;
    for (size_t r = 0; m->kd_h && r < R; r++)
        m->kd_hloss[r] = 0.0;
    for (int l = 0; m->kd_h && l < m->cfg.layers; l++) {
        if (!m->kd_h[l])
            continue;
        const loom_param_entry *e = proj_entry(m, l);
        loom_kd_hidden_rows(m->acts[l].res3, m->kd_h[l], m->params + e->offset, R, C, Ct,
                            m->kd_beta, dloss, m->kd_hloss, m->kd_y, m->kd_dh[l],
                            m->grads + e->offset);
    }
    for (size_t r = 0; r < R; r++) { /* and the attention term's rows (gpt_distill_attn.c) */
        double extra = m->kd_h ? m->kd_hloss[r] : m->kd_aloss[r];
        if (m->kd_h && m->kd_a_live)
            extra += m->kd_aloss[r];
        m->losses[r] = (float)((double)m->losses[r] + extra);
    }
    m->kd_h_live = m->kd_h != NULL;
    return LOOM_OK;
}

void gpt_distill_hidden_backward(loom_gpt *m, int l, size_t Rl)
{
    if (!m->kd_h_live || !m->kd_h[l])
        return;
    m->be->ops->accumulate(m->dres, m->kd_dh[l], Rl * (size_t)m->cfg.dim);
    if (l == 0)
        m->kd_h_live = 0;
}

void gpt_distill_hidden_free(loom_gpt *m)
{
    for (int l = 0; m->kd_dh && l < m->cfg.layers; l++)
        free(m->kd_dh[l]);
    free(m->kd_dh);
    free(m->kd_hloss);
    free(m->kd_y);
}
