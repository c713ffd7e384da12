/* compress_powersgd.c — rank-r PowerSGD with error feedback (compress.h; Vogels, Karimireddy
 * and Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression", Algorithm 1 without
 * the warm start: Q is drawn afresh each step, so no state but the residual exists).
 *
 * Per matrix M = G + E (rows x cols, row-major as the tensor lies in the buffer):
 *   P = M Q; exchange; P <- orthonormal(sum of P); Q = M^T P; exchange; G <- P (sum Q)^T;
 *   E <- M - P Q^T (this rank's Q: the error of its own approximation).
 * Sums run over the ranks' messages in rank order, the products in index order, in double:
 * every rank computes the same bits. Raw tensors ride along in the first message.
 */
#include "compress_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "model/gpt_stage.h"

loom_status powersgd_plan(loom_compress *c, loom_gpt *m)
{
    const loom_param_table *t = loom_gpt_params(m);
    size_t r = (size_t)c->cfg.rank;
    if (!(c->b = calloc((size_t)t->count + 1, sizeof *c->b)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for compression buckets");
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        if (!compress_takes(c, m, i) || !e->numel)
            continue;
        bucket *b = &c->b[c->nb++];
        size_t cols = (size_t)e->slice_len[e->ndim - 1], rows = e->numel / cols;
        b->lo = e->offset;
        b->n = e->numel;
        b->k = e->ndim >= 2 && r * (rows + cols) < e->numel ? cols : 0;
        if (b->k) {
            b->at = c->sum_p;
            b->q_at = c->sum_q;
            c->sum_p += rows * r;
            c->sum_q += cols * r;
        } else {
            b->at = c->sum_raw;
            c->sum_raw += b->n;
        }
        c->elems += b->n;
        if (b->n > c->max_n)
            c->max_n = b->n;
    }
    c->msg_bytes = (c->sum_p + c->sum_raw + c->sum_q) * sizeof(float);
    c->p_sum = malloc((c->sum_p + 1) * sizeof(float));
    c->q_mine = malloc((c->sum_q + 1) * sizeof(float));
    c->q_sum = malloc((c->sum_q + 1) * sizeof(float));
    if (!c->p_sum || !c->q_mine || !c->q_sum)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for PowerSGD's factors");
    return LOOM_OK;
}

/* out (rows x r) = M (rows x cols) Q (cols x r). */
void powersgd_mul(const float *M, const float *Q, size_t rows, size_t cols, size_t r, float *out)
{
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < r; j++) {
            double s = 0.0;
            for (size_t k = 0; k < cols; k++)
                s += (double)M[i * cols + k] * Q[k * r + j];
            out[i * r + j] = (float)s;
        }
}

/* out (cols x r) = M^T (cols x rows) P (rows x r). */
void powersgd_mul_t(const float *M, const float *P, size_t rows, size_t cols, size_t r, float *out)
{
    for (size_t k = 0; k < cols; k++)
        for (size_t j = 0; j < r; j++) {
            double s = 0.0;
            for (size_t i = 0; i < rows; i++)
                s += (double)M[i * cols + k] * P[i * r + j];
            out[k * r + j] = (float)s;
        }
}

/* Modified Gram-Schmidt over P's r columns, in order; a column that vanishes stays 0. */
void powersgd_orthonormalize(float *P, size_t rows, size_t r)
{
    for (size_t j = 0; j < r; j++) {
        for (size_t k = 0; k < j; k++) {
            double d = 0.0;
            for (size_t i = 0; i < rows; i++)
                d += (double)P[i * r + k] * P[i * r + j];
            for (size_t i = 0; i < rows; i++)
                P[i * r + j] = (float)(P[i * r + j] - d * P[i * r + k]);
        }
        double n = 0.0;
        for (size_t i = 0; i < rows; i++)
            n += (double)P[i * r + j] * P[i * r + j];
        n = sqrt(n);
        for (size_t i = 0; i < rows; i++)
            P[i * r + j] = n > 1e-30 ? (float)(P[i * r + j] / n) : 0.0f;
    }
}

/* All-gather `floats` of c->msg and sum the ranks' copies, in rank order, into out. */
static loom_status gather_sum(loom_compress *c, size_t floats, float *out)
{
    loom_comm_request *req = NULL;
    size_t bytes = floats * sizeof(float);
    LOOM_TRY(c->comm->allgather_start(c->dp, c->msg, c->gathered, bytes, LOOM_DTYPE_U8, &req));
    LOOM_TRY(c->comm->wait(c->dp, req));
    memset(out, 0, bytes);
    for (int r = 0; r < c->dp_size; r++) {
        const float *m = (const float *)(const void *)(c->gathered + (size_t)r * bytes);
        for (size_t i = 0; i < floats; i++)
            out[i] += m[i];
    }
    return LOOM_OK;
}

loom_status powersgd_exchange(loom_compress *c, float *grads)
{
    size_t r = (size_t)c->cfg.rank;
    int finite = 1;
    for (int i = 0; i < c->nb && finite; i++)
        for (size_t j = 0; j < c->b[i].n && finite; j++)
            finite = isfinite(grads[c->b[i].lo + j]);
    float *m1 = (float *)(void *)c->msg, *raw = m1 + c->sum_p;
    /* the expert part's buckets count from 0 too: their Q's from a stream of their own */
    uint64_t stream = loom_rng_stream(c->cfg.experts ? "powersgd.experts" : "powersgd");
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        float *e = c->residual + b->lo;
        const float *g = grads + b->lo;
        if (!b->k) {
            memcpy(raw + b->at, g, b->n * sizeof(float));
            continue;
        }
        size_t cols = b->k, rows = b->n / cols;
        for (size_t j = 0; finite && j < b->n; j++)
            e[j] += g[j]; /* e holds M = G + E */
        float *Q = c->q_mine + b->q_at;
        for (size_t j = 0; j < cols * r; j++)
            Q[j] = (float)(loom_rng_uniform((uint64_t)c->step, stream, ((uint64_t)i << 40) | j) - 0.5);
        powersgd_mul(e, Q, rows, cols, r, m1 + b->at);
    }
    if (!finite) /* every rank's sum turns nan: the step's non-finite check finds it */
        for (size_t j = 0; j < c->sum_p + c->sum_raw; j++)
            m1[j] = NAN;
    /* first exchange: P's and the raw tensors */
    float *sum1 = malloc((c->sum_p + c->sum_raw + 1) * sizeof(float));
    if (!sum1)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for PowerSGD's sums");
    loom_status st = gather_sum(c, c->sum_p + c->sum_raw, sum1);
    if (st == LOOM_OK)
        memcpy(c->p_sum, sum1, c->sum_p * sizeof(float));
    for (int i = 0; st == LOOM_OK && i < c->nb; i++) {
        const bucket *b = &c->b[i];
        if (!b->k) {
            memcpy(grads + b->lo, sum1 + c->sum_p + b->at, b->n * sizeof(float));
            continue;
        }
        size_t cols = b->k, rows = b->n / cols;
        float *P = c->p_sum + b->at;
        powersgd_orthonormalize(P, rows, r);
        powersgd_mul_t(c->residual + b->lo, P, rows, cols, r, c->q_mine + b->q_at);
    }
    free(sum1);
    LOOM_TRY(st);
    /* second exchange: the Q's */
    memcpy(c->msg, c->q_mine, c->sum_q * sizeof(float));
    LOOM_TRY(gather_sum(c, c->sum_q, c->q_sum));
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        if (!b->k)
            continue;
        size_t cols = b->k, rows = b->n / cols;
        const float *P = c->p_sum + b->at, *Qs = c->q_sum + b->q_at, *Qm = c->q_mine + b->q_at;
        float *g = grads + b->lo, *e = c->residual + b->lo;
        for (size_t a = 0; a < rows; a++)
            for (size_t k = 0; k < cols; k++) {
                double s = 0.0, mine = 0.0;
                for (size_t j = 0; j < r; j++) {
                    s += (double)P[a * r + j] * Qs[k * r + j];
                    mine += (double)P[a * r + j] * Qm[k * r + j];
                }
                g[a * cols + k] = (float)s;
                if (finite)
                    e[a * cols + k] = (float)(e[a * cols + k] - mine);
            }
    }
    return LOOM_OK;
}
