/* gpt_distill_hidden.c — distillation's hidden-state terms (gpt_distill.h): per mapped
 * student block l, beta * MSE(W_l h_s, h_t) over the rows of a training forward, h the
 * block's output residual stream (res3) and W_l the learned projection
 * "distill.proj.<l>.weight" (kd_proj_dim, dim), a parameter of the student's table.
 * Invariant: the forward computes the whole term at once — the loss rows, W_l's gradient
 * and d term / d h_s, both kept in the forward's activation slot (a pipeline stage has
 * several micro-batches in flight) — and the backward adds W_l's to grads at the head
 * (while the projection's unit is in use, before its gradients are reported ready) and
 * d term / d h_s to d(res3 of l) just before block l's backward.
 * Sums in double, in fixed row and column order: the same bits whatever the thread count
 * and, under tp (h whole on every rank, or its rows gathered under sequence parallelism;
 * the projection replicated), the same bits on every tp rank. On a device backend the
 * term runs on the host over copies (gpt_kd_host_view), its results copied back; under tp
 * the same, the gather of sequence parallelism's rows done in the backend's memory first.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_distill.h"
#include "gpt_internal.h"
#include "base/backend.h"
#include "base/status.h"

const float *gpt_kd_host_view(loom_gpt *m, const float *src, size_t n, float *scratch)
{
    if (!loom_backend_device_memory(m->be))
        return src;
    m->be->ops->copy_to_host(m->be->self, scratch, src, n * sizeof(float));
    return scratch;
}

void gpt_kd_add_loss_rows(loom_gpt *m, const double *extra, const double *extra2, size_t R)
{
    int dev = loom_backend_device_memory(m->be);
    float *losses = dev ? m->host_losses : m->losses;
    if (dev)
        m->be->ops->copy_to_host(m->be->self, losses, m->losses, R * sizeof(float));
    for (size_t r = 0; r < R; r++) {
        double e = extra[r];
        if (extra2)
            e += extra2[r];
        losses[r] = (float)((double)losses[r] + e);
    }
    if (dev)
        m->be->ops->copy_to_device(m->be->self, m->losses, losses, R * sizeof(float));
}

/* Memory for one of the terms' buffers the backward reads: the backend's on a device. */
static void *term_alloc(loom_gpt *m, size_t bytes)
{
    return loom_backend_device_memory(m->be) ? m->be->ops->alloc(m->be->self, bytes) : malloc(bytes);
}

static void term_free(loom_gpt *m, void *p)
{
    if (p && loom_backend_device_memory(m->be))
        m->be->ops->free(m->be->self, p);
    else
        free(p);
}

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

int gpt_distill_row0(const loom_gpt *m, const int *targets, size_t R, size_t *r0)
{
    *r0 = 0;
    if (!m->staged)
        return 1;
    /* addresses as integers: targets may lie outside the step's array (an eval batch) */
    uintptr_t at = (uintptr_t)targets, base = (uintptr_t)m->kd_targets;
    if (!m->kd_targets || !targets || at < base || (at - base) % sizeof(int) ||
        (at - base) / sizeof(int) + R > m->kd_rows)
        return 0;
    *r0 = (at - base) / sizeof(int);
    return 1;
}

loom_status gpt_distill_terms_check(loom_gpt *m, const float *const *map, const char *what)
{
    int L = m->cfg.layers;
    for (int l = 0; m->staged && l < L; l++) {
        if (!map[l])
            continue;
        int tail = m->has_head;
        for (int j = l; j < L; j++)
            tail &= m->own[j] != 0;
        if (!tail)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "%s under pp: student block %d is not in the last "
                      "stage's last chunk (with the head and the teacher); the terms are built "
                      "for blocks there only: map later blocks or move the split (pp_layers)",
                      what, l);
    }
    if (!m->kd_slot && !(m->kd_slot = calloc((size_t)m->slots, sizeof *m->kd_slot)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the distillation terms");
    return LOOM_OK;
}

loom_status loom_gpt_set_distill_hidden(loom_gpt *m, const float *const *teacher_h, float beta)
{
    /* Under tp res3's gradient and the projection are whole per rank (the projection is
     * replicated, split_dim -1): each rank computes the same term and the same projection
     * gradient from all rows, which the tp layout neither sums nor counts twice
     * (replicated gradients are whole per rank; the norm takes tp rank 0's). Without
     * sequence parallelism h is whole on every rank too; with it each rank holds R/tp rows
     * of h, gathered for the term (kd_hall), and adds its rows of d term / d h. */
    if (teacher_h && !(beta >= 0.0f && isfinite(beta)))
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.hidden=%g must be a finite weight >= 0", beta);
    int L = m->cfg.layers, S = m->slots;
    size_t R = (size_t)m->max_B * (size_t)m->max_T, C = (size_t)m->cfg.dim;
    size_t Ct = (size_t)(m->cfg.kd_proj_dim > 0 ? m->cfg.kd_proj_dim : 1);
    for (int l = 0; teacher_h && l < L; l++)
        if (teacher_h[l] && !proj_entry(m, l))
            LOOM_FAIL(LOOM_ERR_INVALID, "student block %d has a teacher block but no projection "
                      "(kd_proj_layers lacks bit %d)", l, l);
    if (teacher_h)
        LOOM_TRY(gpt_distill_terms_check(m, teacher_h, "distillation's hidden-state terms"));
    if (teacher_h && loom_backend_device_memory(m->be) && !m->kd_hs_host) {
        m->kd_hs_host = malloc(R * C * sizeof(float));
        m->kd_dh_host = malloc(R * C * sizeof(float));
        m->kd_w_host = malloc(Ct * C * sizeof(float));
        m->kd_dw_host = malloc(Ct * C * sizeof(float));
        m->kd_bytes += 2 * (R * C + Ct * C) * sizeof(float);
        if (!m->kd_hs_host || !m->kd_dh_host || !m->kd_w_host || !m->kd_dw_host)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the hidden-state terms' host copies");
    }
    if (teacher_h && !m->kd_dh) {
        m->kd_dh = calloc((size_t)L * S, sizeof *m->kd_dh);
        m->kd_dw = calloc((size_t)L * S, sizeof *m->kd_dw);
        m->kd_hloss = malloc(R * sizeof(double));
        m->kd_y = malloc(R * Ct * sizeof(float));
        /* the gather's destination: the tp group's buffers are the backend's on a device */
        m->kd_hall = m->sp ? term_alloc(m, R * C * sizeof(float)) : NULL;
        m->kd_bytes += R * sizeof(double) + (R * Ct + (m->sp ? R * C : 0)) * sizeof(float);
        if (!m->kd_dh || !m->kd_dw || !m->kd_hloss || !m->kd_y || (m->sp && !m->kd_hall))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the hidden-state terms");
    }
    m->kd_h_first = -1;
    for (int l = L - 1; teacher_h && l >= 0; l--) {
        if (!teacher_h[l])
            continue;
        m->kd_h_first = l;
        for (int sl = 0; sl < S; sl++) {
            size_t i = (size_t)sl * L + l;
            if (!m->kd_dh[i])
                m->kd_bytes += R * C * sizeof(float);
            if (!m->kd_dw[i])
                m->kd_bytes += Ct * C * sizeof(float);
            if ((!m->kd_dh[i] && !(m->kd_dh[i] = term_alloc(m, R * C * sizeof(float)))) ||
                (!m->kd_dw[i] && !(m->kd_dw[i] = term_alloc(m, Ct * C * sizeof(float)))))
                LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the hidden-state terms");
        }
    }
    for (int sl = 0; m->kd_slot && sl < S; sl++)
        m->kd_slot[sl].h_live = 0;
    m->kd_h = teacher_h;
    m->kd_beta = beta;
    return LOOM_OK;
}

const float *loom_gpt_block_output(const loom_gpt *m, int l)
{
    /* not under sequence parallelism: res3 is then this rank's rows only (a teacher's
     * layout keeps it off where its block outputs are read: session.c) */
    if (m->frozen && !(m->keep_out && l >= 0 && l < m->cfg.layers && m->keep_out[l]))
        return NULL; /* a frozen model's other block outputs share two buffers (gpt.h) */
    return l >= 0 && l < m->cfg.layers && m->own[l] && !m->sp ? m->acts[l].res3 : NULL;
}

loom_status gpt_distill_hidden(loom_gpt *m, const int *targets, size_t R, float dloss)
{
    if (!m->kd_slot)
        return LOOM_OK; /* no intermediate term was ever set */
    struct gpt_kd_slot *ks = &m->kd_slot[m->cur_slot];
    ks->h_live = 0;
    size_t r0 = 0;
    int h = m->kd_h && gpt_distill_row0(m, targets, R, &r0);
    if (!h && !ks->a_live)
        return LOOM_OK;
    int C = m->cfg.dim, Ct = m->cfg.kd_proj_dim, L = m->cfg.layers;
    for (size_t r = 0; h && r < R; r++)
        m->kd_hloss[r] = 0.0;
    for (int l = 0; h && l < L; l++) {
        if (!m->kd_h[l])
            continue;
        const loom_param_entry *e = proj_entry(m, l);
        size_t i = (size_t)m->cur_slot * L + l;
        int dev = loom_backend_device_memory(m->be); /* on the host over copies, then back */
        float *dw = dev ? m->kd_dw_host : m->kd_dw[i], *dh = dev ? m->kd_dh_host : m->kd_dh[i];
        memset(dw, 0, (size_t)Ct * C * sizeof(float));
        const float *hsrc = m->acts[l].res3;
        if (m->sp) { /* each rank's R/tp rows, in rank order: all R (a gather copies). On a
            * device the gather runs in the backend's memory over the device tp group, then
            * one copy of the R rows: the host has no tp group of its own to gather over */
            LOOM_TRY(m->tp_ops->tensor_allgather(m->tp_self, hsrc, m->kd_hall,
                                                 R / (size_t)m->tp * (size_t)C));
            hsrc = m->kd_hall;
        }
        const float *hs = gpt_kd_host_view(m, hsrc, R * (size_t)C, m->kd_hs_host);
        const float *w = gpt_kd_host_view(m, m->params + e->offset, (size_t)Ct * C, m->kd_w_host);
        loom_kd_hidden_rows(hs, m->kd_h[l] + r0 * (size_t)Ct, w, R, C, Ct, m->kd_beta, dloss,
                            m->kd_hloss, m->kd_y, dh, dw);
        if (dev) {
            m->be->ops->copy_to_device(m->be->self, m->kd_dh[i], dh, R * (size_t)C * sizeof(float));
            m->be->ops->copy_to_device(m->be->self, m->kd_dw[i], dw, (size_t)Ct * C * sizeof(float));
        }
    }
    /* and the attention term's rows (gpt_distill_attn.c) */
    gpt_kd_add_loss_rows(m, h ? m->kd_hloss : m->kd_aloss, h && ks->a_live ? m->kd_aloss : NULL, R);
    ks->h_live = ks->w_live = h;
    return LOOM_OK;
}

void gpt_distill_hidden_head(loom_gpt *m)
{
    if (!m->kd_slot || !m->kd_slot[m->cur_slot].w_live)
        return;
    m->kd_slot[m->cur_slot].w_live = 0;
    size_t n = (size_t)m->cfg.kd_proj_dim * (size_t)m->cfg.dim;
    for (int l = 0; l < m->cfg.layers; l++)
        if (m->kd_h[l]) /* 0 + x is x: the bits of adding in the forward */
            m->be->ops->accumulate(m->grads + proj_entry(m, l)->offset,
                                   m->kd_dw[(size_t)m->cur_slot * m->cfg.layers + l], n);
}

void gpt_distill_hidden_dy(loom_gpt *m, int l, float *dy, size_t Rl)
{
    if (!m->kd_slot || !m->kd_slot[m->cur_slot].h_live || !m->kd_h[l])
        return;
    size_t row0 = m->sp ? (size_t)m->tp_rank * Rl : 0; /* sp: this rank's rows of all R */
    m->be->ops->accumulate(dy, m->kd_dh[(size_t)m->cur_slot * m->cfg.layers + l] +
                               row0 * (size_t)m->cfg.dim, Rl * (size_t)m->cfg.dim);
    if (l == m->kd_h_first)
        m->kd_slot[m->cur_slot].h_live = 0;
}

void gpt_distill_hidden_backward(loom_gpt *m, int l, size_t Rl)
{
    gpt_distill_hidden_dy(m, l, m->dres, Rl);
}

void gpt_distill_hidden_free(loom_gpt *m)
{
    for (size_t i = 0; m->kd_dh && i < (size_t)m->cfg.layers * m->slots; i++) {
        term_free(m, m->kd_dh[i]);
        term_free(m, m->kd_dw[i]);
    }
    free(m->kd_hs_host);
    free(m->kd_dh_host);
    free(m->kd_w_host);
    free(m->kd_dw_host);
    free(m->kd_dh);
    free(m->kd_dw);
    free(m->kd_hloss);
    free(m->kd_y);
    term_free(m, m->kd_hall);
    free(m->kd_slot);
}
