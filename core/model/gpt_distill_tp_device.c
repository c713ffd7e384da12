/* gpt_distill_tp_device.c — the logit term under tensor parallelism in a device backend's
 * memory. The host path (gpt_distill.c) gathers every rank's vocabulary columns, lays them
 * out as whole rows with memcpys, runs the term on the whole rows and keeps this rank's
 * columns of the gradient; here the same steps stay in the backend's memory: the gather
 * over the tp strategy's group (its buffers are the backend's), the two relayouts as
 * rows_gather over rows of Vl floats (no scale: each value copied, its bits kept), the term
 * on kd_rows. So every rank computes the rows one rank would, as on the host. The same
 * gather serves loom_gpt_gather_logits on a device (a teacher split by teacher.tp =
 * mesh.tp: its whole rows for the student's term). */
#include <stddef.h>
#include <stdlib.h>

#include "gpt_internal.h"
#include "base/backend.h"
#include "base/status.h"

loom_status gpt_kd_tp_device_check(const loom_gpt *m)
{
    const loom_backend_ops *k = m->be->ops;
    if (k->size <= offsetof(loom_backend_ops, rows_gather) || !k->rows_gather)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "distillation under mesh.tp > 1 in the device memory of "
                  "backend %s needs its rows_gather op (plugin/backend.h) to lay the gathered "
                  "vocabulary columns out as whole rows; use backend = \"cpu\"",
                  k->describe(m->be->self));
    return LOOM_OK;
}

/* The indices for R rows: whole row r's block p (Vl floats) is rank p's row r in the
 * gathered blocks, so idx[r * tp + p] = p * R + r; this rank's columns of whole row r are
 * its block tp_rank, idx[R * tp + r] = r * tp + tp_rank. Written once per R. */
static loom_status tp_indices(loom_gpt *m, size_t R)
{
    if (m->kd_tp_idx && m->kd_tp_idx_R == R)
        return LOOM_OK;
    const loom_backend_ops *k = m->be->ops;
    size_t tp = (size_t)m->tp, cap = (size_t)m->max_B * (size_t)m->max_T;
    if (!m->kd_tp_idx) {
        if (!(m->kd_tp_idx = k->alloc(m->be->self, cap * (tp + 1) * sizeof(int))))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of device memory for distillation's tp row indices");
        m->kd_bytes += cap * (tp + 1) * sizeof(int);
    }
    int *idx = malloc(R * (tp + 1) * sizeof(int));
    if (!idx)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for distillation's tp row indices");
    for (size_t r = 0; r < R; r++) {
        for (size_t p = 0; p < tp; p++)
            idx[r * tp + p] = (int)(p * R + r);
        idx[R * tp + r] = (int)(r * tp + (size_t)m->tp_rank);
    }
    k->copy_to_device(m->be->self, m->kd_tp_idx, idx, R * (tp + 1) * sizeof(int));
    free(idx);
    m->kd_tp_idx_R = R;
    return LOOM_OK;
}

loom_status gpt_gather_logits_device(loom_gpt *m, size_t R, float *blocks, float *full)
{
    LOOM_TRY(gpt_kd_tp_device_check(m));
    LOOM_TRY(tp_indices(m, R));
    LOOM_TRY(m->tp_ops->tensor_allgather(m->tp_self, m->logits, blocks, R * (size_t)m->Vl));
    m->be->ops->rows_gather(full, blocks, m->kd_tp_idx, NULL, R * (size_t)m->tp, m->Vl);
    return LOOM_OK;
}

loom_status gpt_kd_tp_device_rows(loom_gpt *m, size_t R, float scale)
{
    const loom_backend_ops *k = m->be->ops;
    size_t Vl = (size_t)m->Vl, Vp = (size_t)m->cfg.vocab_padded, tp = (size_t)m->tp;
    size_t cap = (size_t)m->max_B * (size_t)m->max_T;
    float *blocks = m->kd_grad + cap * Vl, *full = blocks + cap * Vp; /* kd_prepare's layout */
    LOOM_TRY(gpt_gather_logits_device(m, R, blocks, full));
    k->kd_rows(full, Vp, m->kd_teacher, m->kd_stride, R, m->cfg.vocab, m->kd_T, scale,
               m->kd_dev_loss, blocks); /* blocks now: the whole rows' gradient */
    k->rows_gather(m->kd_grad, blocks, m->kd_tp_idx + R * tp, NULL, R, (int)Vl);
    return LOOM_OK;
}

void gpt_kd_tp_device_free(loom_gpt *m)
{
    if (m->kd_tp_idx)
        m->be->ops->free(m->be->self, m->kd_tp_idx);
    m->kd_tp_idx = NULL;
    m->kd_tp_idx_R = 0;
}
