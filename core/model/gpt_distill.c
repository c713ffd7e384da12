/* gpt_distill.c — the distillation term and its place in the training forward (see
 * gpt_distill.h). Invariant: with a teacher set, gpt_distill_before runs on the raw logits
 * before the cross-entropy overwrites them with their gradient, gpt_distill_after blends
 * the two gradients and per-token losses after it. */
#include "gpt_distill.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"
#include "base/backend.h"
#include "base/status.h"

/* log softmax(z / T) of one row into out (double), V columns. */
static void log_softmax_t(const float *z, int V, double T, double *out)
{
    double max = -INFINITY;
    for (int j = 0; j < V; j++)
        max = z[j] / T > max ? z[j] / T : max;
    double sum = 0.0;
    for (int j = 0; j < V; j++)
        sum += exp(z[j] / T - max);
    double lse = max + log(sum);
    for (int j = 0; j < V; j++)
        out[j] = z[j] / T - lse;
}

void loom_kd_rows(const float *zs, size_t s_stride, const float *zt, size_t t_stride, size_t R,
                  int V, float T, float scale, double *loss, float *grad)
{
    double *ls = malloc(2 * (size_t)V * sizeof(double)), *lt = ls + V;
    if (!ls) { /* a row of doubles per side: V is at most a few hundred thousand */
        for (size_t r = 0; r < R; r++)
            loss[r] = NAN;
        return;
    }
    for (size_t r = 0; r < R; r++) {
        const float *s = zs + r * s_stride, *t = zt + r * t_stride;
        log_softmax_t(s, V, T, ls);
        log_softmax_t(t, V, T, lt);
        double kl = 0.0;
        for (int j = 0; j < V; j++) { /* a cached top-k teacher row is -inf elsewhere: p_t = 0 */
            double pt = exp(lt[j]);
            if (pt > 0.0) /* adds the same bits a full row's underflowed 0 * (...) would */
                kl += pt * (lt[j] - ls[j]);
        }
        loss[r] = (double)T * T * kl;
        if (!grad)
            continue;
        float *g = grad + r * s_stride;
        for (int j = 0; j < V; j++)
            g[j] = (float)(scale * (double)T * (exp(ls[j]) - exp(lt[j])));
        for (size_t j = (size_t)V; j < s_stride; j++)
            g[j] = 0.0f;
    }
    free(ls);
}

/* A device backend (its memory is not the host's): the logit term runs on the backend's
 * kd_rows op, over one rank's rows or (tp) the whole rows gathered there. */
static loom_status kd_device_check(const loom_gpt *m)
{
    const loom_backend_ops *k = m->be->ops;
    const char *be = k->describe(m->be->self);
    if (k->size <= offsetof(loom_backend_ops, kd_rows) || !k->kd_rows)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "backend %s has no kd_rows op (plugin/backend.h), so "
                  "distillation cannot run in its device memory; use backend = \"cpu\"", be);
    return m->tp_ops ? gpt_kd_tp_device_check(m) : LOOM_OK; /* tp: whole rows there too */
}

/* The checks and buffers both forms share; sets the term's constants. Under tensor
 * parallelism kd_grad is one block: this rank's (R, Vl) gradient, then two (R, Vp) rows
 * buffers for the whole rows (gather_vocab_rows). */
static loom_status kd_prepare(loom_gpt *m, size_t t_stride, float T, float alpha)
{
    if (!(T > 0.0f) || !(alpha >= 0.0f && alpha <= 1.0f) || t_stride < (size_t)m->cfg.vocab)
        LOOM_FAIL(LOOM_ERR_INVALID, "distillation temperature=%g must be > 0, alpha=%g in [0, 1], "
                  "the teacher's rows at least vocab=%d wide (%zu)", T, alpha, m->cfg.vocab, t_stride);
    size_t R = (size_t)m->max_B * (size_t)m->max_T;
    size_t per_row = (size_t)m->Vl + (m->tp_ops ? 2 * (size_t)m->cfg.vocab_padded : 0);
    if (loom_backend_device_memory(m->be))
        LOOM_TRY(kd_device_check(m));
    if (!m->kd_grad) {
        const loom_backend_ops *k = m->be->ops;
        if (loom_backend_device_memory(m->be)) { /* the rows and the gradient on the device */
            m->kd_grad = k->alloc(m->be->self, R * per_row * sizeof(float));
            m->kd_dev_loss = k->alloc(m->be->self, R * sizeof(double));
        } else {
            m->kd_grad = malloc(R * per_row * sizeof(float));
        }
        m->kd_loss = malloc(R * sizeof(double));
        m->kd_bytes += R * per_row * sizeof(float) +
                       (loom_backend_device_memory(m->be) ? 2 : 1) * R * sizeof(double);
        if (!m->kd_grad || !m->kd_loss || (loom_backend_device_memory(m->be) && !m->kd_dev_loss))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the distillation buffers (%zu MiB)",
                      R * per_row * sizeof(float) >> 20);
    }
    m->kd_stride = t_stride;
    m->kd_T = T;
    m->kd_alpha = alpha;
    return LOOM_OK;
}

loom_status loom_gpt_set_distill(loom_gpt *m, const float *teacher_logits, size_t t_stride,
                                 float T, float alpha)
{
    if (teacher_logits && m->staged)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "distillation on a pipeline stage goes through "
                  "loom_gpt_set_distill_step (the logits live on the last stage only)");
    if (teacher_logits)
        LOOM_TRY(kd_prepare(m, t_stride, T, alpha));
    m->kd_teacher = teacher_logits;
    return LOOM_OK;
}

loom_status loom_gpt_set_distill_step(loom_gpt *m, const int *targets, size_t rows,
                                      const float *teacher_rows, size_t t_stride, float T,
                                      float alpha)
{
    if (teacher_rows)
        LOOM_TRY(kd_prepare(m, t_stride, T, alpha));
    m->kd_teacher = NULL; /* chosen per forward by gpt_distill_select */
    m->kd_targets = teacher_rows ? targets : NULL;
    m->kd_step_rows = teacher_rows;
    m->kd_rows = rows;
    return LOOM_OK;
}

loom_status loom_gpt_gather_logits(loom_gpt *m, size_t R, float *blocks, float *full)
{
    size_t Vl = (size_t)m->Vl, Vp = (size_t)m->cfg.vocab_padded;
    if (!m->tp_ops) { /* bit for bit: a memcpy, or the backend's copy on a device */
        loom_backend_copy_bits(m->be, full, m->logits, R * Vp);
        return LOOM_OK;
    }
    if (loom_backend_device_memory(m->be)) /* blocks and full the backend's too */
        return gpt_gather_logits_device(m, R, blocks, full);
    LOOM_TRY(m->tp_ops->tensor_allgather(m->tp_self, m->logits, blocks, R * Vl));
    for (size_t p = 0; p < (size_t)m->tp; p++) /* rank p's block: its columns of every row */
        for (size_t r = 0; r < R; r++)
            memcpy(full + r * Vp + p * Vl, blocks + (p * R + r) * Vl, Vl * sizeof(float));
    return LOOM_OK;
}

int gpt_distill_select(loom_gpt *m, const int *targets, size_t R)
{
    /* addresses as integers: targets may lie outside the step's array (an eval batch) */
    uintptr_t at = (uintptr_t)targets, base = (uintptr_t)m->kd_targets;
    if (!m->kd_targets || !targets || at < base || (at - base) % sizeof(int) ||
        (at - base) / sizeof(int) + R > m->kd_rows)
        return 0;
    m->kd_teacher = m->kd_step_rows + (at - base) / sizeof(int) * m->kd_stride;
    return 1;
}

/* Under tensor parallelism the term needs whole rows: the student's are gathered (every
 * rank then computes the rows one rank would, the same bits where the logits are) and each
 * rank keeps its own columns of the gradient. */
loom_status gpt_distill_before(loom_gpt *m, size_t R, float dloss)
{
    float scale = m->kd_alpha * dloss;
    if (m->kd_dev_loss && m->tp_ops) /* a device backend under tp: whole rows there */
        return gpt_kd_tp_device_rows(m, R, scale);
    if (m->kd_dev_loss) { /* a device backend: the teacher's rows are its memory too */
        m->be->ops->kd_rows(m->logits, (size_t)m->Vl, m->kd_teacher, m->kd_stride, R,
                            m->cfg.vocab, m->kd_T, scale, m->kd_dev_loss, m->kd_grad);
        return LOOM_OK;
    }
    if (!m->tp_ops) {
        loom_kd_rows(m->logits, (size_t)m->Vl, m->kd_teacher, m->kd_stride, R, m->cfg.vocab,
                     m->kd_T, scale, m->kd_loss, m->kd_grad);
        return LOOM_OK;
    }
    size_t Vl = (size_t)m->Vl, Vp = (size_t)m->cfg.vocab_padded;
    size_t cap = (size_t)m->max_B * (size_t)m->max_T;
    float *blocks = m->kd_grad + cap * Vl, *full = blocks + cap * Vp;
    LOOM_TRY(loom_gpt_gather_logits(m, R, blocks, full));
    loom_kd_rows(full, Vp, m->kd_teacher, m->kd_stride, R, m->cfg.vocab, m->kd_T, scale,
                 m->kd_loss, blocks); /* blocks now: the whole rows' gradient */
    for (size_t r = 0; r < R; r++)
        memcpy(m->kd_grad + r * Vl, blocks + r * Vp + (size_t)m->v0, Vl * sizeof(float));
    return LOOM_OK;
}

void gpt_distill_after(loom_gpt *m, size_t R)
{
    float a = m->kd_alpha, keep = 1.0f - a;
    size_t n = R * (size_t)m->Vl;
    if (m->kd_dev_loss) { /* a device backend: the gradient blended there, in the loop's two
                           * roundings (scale, then add); the R losses through the host */
        const loom_backend_ops *k = m->be->ops;
        void *bs = m->be->self;
        k->scale(m->logits, keep, n);
        k->accumulate(m->logits, m->kd_grad, n);
        k->copy_to_host(bs, m->host_losses, m->losses, R * sizeof(float));
        k->copy_to_host(bs, m->kd_loss, m->kd_dev_loss, R * sizeof(double));
        for (size_t r = 0; r < R; r++)
            m->host_losses[r] = (float)((double)keep * m->host_losses[r] + (double)a * m->kd_loss[r]);
        k->copy_to_device(bs, m->losses, m->host_losses, R * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++)
        m->logits[i] = keep * m->logits[i] + m->kd_grad[i];
    for (size_t r = 0; r < R; r++)
        m->losses[r] = (float)((double)keep * m->losses[r] + (double)a * m->kd_loss[r]);
}

void gpt_distill_free(loom_gpt *m)
{
    gpt_kd_tp_device_free(m);
    if (m->kd_dev_loss) { /* the backend's (kd_prepare) */
        m->be->ops->free(m->be->self, m->kd_grad);
        m->be->ops->free(m->be->self, m->kd_dev_loss);
    } else {
        free(m->kd_grad);
    }
    free(m->kd_loss);
    gpt_distill_hidden_free(m);
    gpt_distill_attn_free(m);
    m->kd_bytes = 0;
}

size_t loom_gpt_distill_bytes(const loom_gpt *m) { return m->kd_bytes; }
