/* compress_powersgd_leaves.c — canonical PowerSGD: the factorisation per global micro-batch
 * (compress_internal.h; docs/COMPRESS.md, "Canonical mode").
 *
 * Fast mode's PowerSGD factors each rank's M_r: P = (sum_r M_r) Q is formed as sum_r (M_r Q),
 * which depends on which micro-batches share a rank only through the association of sums, but
 * the residual e_r = M_r - P Q_r^T is per rank, so dp changes what is fed back. Here every
 * global micro-batch i is a leaf with its own residual e_i (whichever rank runs it), and
 *   M_i = G_i + e_i,  P_i = M_i Q,  P = tree_i P_i  (canonical mode's tree over i),
 *   P <- orthonormal(P),  Q_i = M_i^T P,  Q = tree_i Q_i,  G = P Q^T,  e_i <- M_i - P Q_i^T,
 * with Q drawn from (step, the box's id): every product is one leaf's, computed by the same
 * loops whatever rank runs it, and both sums run in the same tree over the global index, so
 * dp = 1, 2, 4 (and tp, pp: the boxes are the logical tensor's) give the same bits. The
 * matrices are canonical mode's boxes (compress_canon.c), so under tp a rank factors its
 * own boxes. Cost: accum messages a round per rank, as onebit's leaves.
 */
#include "compress_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/rng.h"
#include "base/status.h"
#include "grad_sync.h"

/* Bucket b's random Q (cols x r) for this step, into out. */
static void draw_q(const loom_compress *c, const bucket *b, float *out)
{
    size_t n = b->k * (size_t)c->cfg.rank;
    for (size_t j = 0; j < n; j++)
        out[j] = (float)(loom_rng_uniform((uint64_t)c->step, b->id, j) - 0.5);
}

/* Bucket b's elements of leaf residual e as one contiguous matrix: in place or gathered. */
static float *matrix_of(loom_compress *c, const bucket *b, float *e)
{
    if (!b->width)
        return e + b->lo;
    bucket_gather(b, e + b->lo, c->strided_g);
    return c->strided_g;
}

static int in_range(const bucket *b, size_t lo, size_t hi) { return b->lo >= lo && b->lo < hi; }

static int leaf_finite(const loom_compress *c, const float *grads, size_t lo, size_t hi)
{
    for (int i = 0; i < c->nb; i++)
        for (size_t j = 0; in_range(&c->b[i], lo, hi) && j < c->b[i].n; j++)
            if (!isfinite(grads[c->b[i].lo + bucket_at(&c->b[i], j)]))
                return 0;
    return 1;
}

loom_status powersgd_leaf(loom_compress *c, int a, float *grads, size_t lo, size_t hi)
{
    size_t r = (size_t)c->cfg.rank, n1 = c->sum_p + c->sum_raw;
    float *e = c->residual + (size_t)a * c->total;
    float *m1 = (float *)(void *)c->msg + (size_t)a * n1, *raw = m1 + c->sum_p;
    int finite = leaf_finite(c, grads, lo, hi);
    c->leaf_bad[a] |= !finite; /* reset by begin_step: a leaf may come in parts */
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        if (!in_range(b, lo, hi))
            continue;
        if (!b->k) {
            bucket_gather(b, grads + b->lo, raw + b->at);
            continue;
        }
        for (size_t j = 0; finite && j < b->n; j++) {
            size_t x = b->lo + bucket_at(b, j);
            e[x] += grads[x]; /* e holds M = G + e */
        }
        draw_q(c, b, c->q_sum + b->q_at);
        powersgd_mul(matrix_of(c, b, e), c->q_sum + b->q_at, b->n / b->k, b->k, r, m1 + b->at);
    }
    if (c->leaf_bad[a]) /* every rank's sums turn nan: the step's non-finite check finds it */
        for (size_t j = 0; j < n1; j++)
            m1[j] = NAN;
    return LOOM_OK;
}

/* All-gather this rank's leaves' messages (n floats each, at c->msg) and sum every rank's
 * leaves, in the global micro-batch order, in canonical mode's tree into out (host memory).
 * On a device backend the tree is the backend's (its buffers device memory): each gathered
 * leaf is copied to a device buffer to be pushed, and the sum copied back; an add is an
 * add, so the sums are the bits the same tree gives on the host. */
static loom_status gather_tree(loom_compress *c, loom_backend *be, size_t n, float *out)
{
    int leaves = c->cfg.leaves, all = leaves * c->dp_size;
    LOOM_TRY(compress_gather(c, (size_t)leaves * n * sizeof(float)));
    size_t bytes = n * sizeof(float);
    float *dev = NULL;
    if (loom_backend_device_memory(be) && !(dev = be->ops->alloc(be->self, bytes ? bytes : 1)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of device memory for PowerSGD's leaf sums (%zu bytes)", bytes);
    loom_grad_tree *t = NULL;
    loom_status st = loom_grad_tree_create(be, n, &t);
    for (int j = 0; j < all && st == LOOM_OK; j++) {
        const float *v = (const float *)(const void *)c->gathered + (size_t)j * n;
        if (dev) {
            be->ops->copy_to_device(be->self, dev, v, bytes);
            v = dev;
        }
        st = loom_grad_tree_push(t, v);
    }
    if (st == LOOM_OK) {
        loom_grad_tree_finish(t, dev ? dev : out);
        if (dev)
            be->ops->copy_to_host(be->self, out, dev, bytes);
    }
    loom_grad_tree_destroy(t);
    if (dev)
        be->ops->free(be->self, dev);
    return st;
}

loom_status powersgd_finish_leaves(loom_compress *c, loom_backend *be, float *grads)
{
    size_t r = (size_t)c->cfg.rank, n1 = c->sum_p + c->sum_raw, nq = c->sum_q;
    int leaves = c->cfg.leaves;
    memset(grads, 0, c->total * sizeof(float)); /* zero outside the buckets, as decode_leaf */
    /* first round: every leaf's P's and raw tensors */
    LOOM_TRY(gather_tree(c, be, n1, c->p_sum));
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        if (!b->k) {
            bucket_scatter(b, c->p_sum + c->sum_p + b->at, grads + b->lo);
            continue;
        }
        float *P = c->p_sum + b->at;
        powersgd_orthonormalize(P, b->n / b->k, r);
        for (int a = 0; a < leaves; a++)
            powersgd_mul_t(matrix_of(c, b, c->residual + (size_t)a * c->total), P, b->n / b->k,
                           b->k, r, c->q_mine + (size_t)a * nq + b->q_at);
    }
    /* second round: every leaf's Q's */
    memcpy(c->msg, c->q_mine, (size_t)leaves * nq * sizeof(float));
    LOOM_TRY(gather_tree(c, be, nq, c->q_sum));
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        if (!b->k)
            continue;
        size_t cols = b->k, rows = b->n / cols;
        const float *P = c->p_sum + b->at, *Qs = c->q_sum + b->q_at;
        for (size_t x = 0; x < rows; x++)
            for (size_t k = 0; k < cols; k++) {
                double s = 0.0;
                for (size_t j = 0; j < r; j++)
                    s += (double)P[x * r + j] * Qs[k * r + j];
                grads[b->lo + bucket_at(b, x * cols + k)] = (float)s;
            }
        for (int a = 0; a < leaves; a++) { /* each leaf's error: its own approximation's */
            if (c->leaf_bad[a])
                continue;
            float *e = c->residual + (size_t)a * c->total;
            const float *Qm = c->q_mine + (size_t)a * nq + b->q_at;
            for (size_t x = 0; x < rows; x++)
                for (size_t k = 0; k < cols; k++) {
                    double mine = 0.0;
                    for (size_t j = 0; j < r; j++)
                        mine += (double)P[x * r + j] * Qm[k * r + j];
                    size_t at = b->lo + bucket_at(b, x * cols + k);
                    e[at] = (float)(e[at] - mine);
                }
        }
    }
    return LOOM_OK;
}
