/* crossentropy.c — softmax + cross-entropy over the classifier's logits, in passes, so that
 * ranks holding slices of the vocabulary's columns (tensor parallelism's vocabulary-parallel
 * LM head) can combine the per-row statistics between passes and never gather full logits.
 *
 * logits (BT, Vl) are the columns [col0, col0+Vl) of the padded vocabulary (Vp columns, the
 * first V real); a column is real if its global index col0 + j < V. With one rank col0 = 0
 * and Vl = Vp. Per row i (target y):
 *   1. ce_row_max:      m = max over this slice's real columns (-INFINITY if none)
 *                       -> the caller combines the slices' m by max
 *   2. ce_row_sumexp:   S = sum over real columns j in [c0, c1) of e^{x_j - m} (m combined)
 *                       -> the caller adds the slices' (or chunks') S
 *      ce_target_logit: t = x_{y - col0} if this slice holds column y, else 0
 *                       -> the caller adds the slices' t (exactly one is nonzero)
 *   3. ce_finish:       loss = log S + m - t (computed as logf(S) + (m - t): m - t is small,
 *                       and exact when close), and if dloss != 0 the slice's logits become
 *                       the gradient  x_j <- dloss * (e^{x_j - m} / S - [col0 + j == y])
 *                       for real columns (evaluated as e^{x_j - m} * (dloss / S), then
 *                       dloss subtracted at the target, as the old fused kernel did), 0 for
 *                       padding. With dloss == 0 the logits are left intact.
 * A target outside [0, V) is ignored: loss 0, gradient row 0. Gradient entries below
 * FLT_MIN are flushed to 0 (they would slow the LM-head GEMMs that read them; cpu_common.h
 * says why). Padding columns are never read. e^x is cpu_common.h's vectorised expf.
 *
 * Summation order of ce_row_sumexp (the guarantee the canonical mode builds on): each
 * row's float terms are added in double, one at a time, in increasing column order,
 * starting from +0 — s = (((0 + e_c0) + e_c0+1) + ...) — and rounded to float once at the
 * end. Never reassociated: the exponentials are
 * computed vectorised into a small buffer, and the adds are interleaved across a block of
 * CE_RB rows (independent chains, so the latency of each add is hidden) but each row's
 * own chain is sequential. So a row's sum depends only on its values in [c0, c1) — not on
 * BT, Vl, the thread count, or how the rows are blocked.
 * Rows are independent and run in parallel (OpenMP over row blocks); every result is the
 * same bits for any thread count.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <math.h>
#include <string.h>

enum {
    CE_RB = 8,  /* rows whose in-order sums are interleaved (add_in_order has 8 chains) */
    CE_CH = 256 /* columns of exponentials buffered per row: CE_RB * CE_CH doubles = 16 KB */
};

/* Real columns of a slice: local indices [0, n) with n = clamp(V - col0, 0, Vl). */
static inline int real_cols(int Vl, int col0, int V)
{
    const long n = (long)V - col0;
    return n <= 0 ? 0 : n >= Vl ? Vl : (int)n;
}

LOOM_CPU_BODY row_max_of_body(float *max, const float *x, int n)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < n; j++)
        m = x[j] > m ? x[j] : m;
    *max = m;
}
LOOM_CPU_VARIANTS(row_max_of, (float *max, const float *x, int n), (max, x, n))

void loom_cpu_ce_row_max(float *row_max, const float *logits, int BT, int Vl, int col0, int V)
{
    /* row_max (BT) =, logits (BT,Vl) */
    const int n = real_cols(Vl, col0, V);
#pragma omp parallel for schedule(static) if ((size_t)BT * n > LOOM_CPU_PAR_MIN)
    for (int i = 0; i < BT; i++)
        row_max_of(&row_max[i], logits + (size_t)i * Vl, n);
}

/* s[r] += e[r][j] for j = 0 .. n-1 in order, the CE_RB rows' chains interleaved so that
 * each add's latency is hidden behind the other rows'. Kept scalar (GCC's SLP vectoriser
 * would otherwise build vectors out of single-element inserts, 3x slower); every add is
 * double, of a float the caller converted exactly (vectorised there: converting here cost
 * a scalar conversion and a dependency-breaking xor per element, twice the adds' work). */
__attribute__((noinline, optimize("no-tree-vectorize", "no-tree-slp-vectorize"))) static void
add_in_order(double *restrict s, const double (*restrict e)[CE_CH], int n)
{
    double s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3], s4 = s[4], s5 = s[5], s6 = s[6],
           s7 = s[7];
    for (int j = 0; j < n; j++) {
        s0 += e[0][j], s1 += e[1][j], s2 += e[2][j], s3 += e[3][j];
        s4 += e[4][j], s5 += e[5][j], s6 += e[6][j], s7 += e[7][j];
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3, s[4] = s4, s[5] = s5, s[6] = s6, s[7] = s7;
}

/* Rows [0, nr) (nr <= CE_RB) of a block: sumexp[r] = in-order sum over columns [c0, c1) of
 * e^{x[r][j] - m[r]}, CE_CH columns of exponentials at a time (vectorised along the row),
 * then added in order. A short block's unused rows are zeros, summed and dropped. */
LOOM_CPU_BODY sumexp_block_body(float *sumexp, const float *logits, const float *row_max, int nr,
                                int Vl, int c0, int c1)
{
    double e[CE_RB][CE_CH] __attribute__((aligned(64)));
    double s[CE_RB] = {0};
    for (int j0 = c0; j0 < c1; j0 += CE_CH) {
        const int n = c1 - j0 < CE_CH ? c1 - j0 : CE_CH;
        for (int r = 0; r < nr; r++) {
            const float *x = logits + (size_t)r * Vl + j0;
            const float m = row_max[r];
            double *er = e[r];
#pragma omp simd
            for (int j = 0; j < n; j++)
                er[j] = (double)loom_cpu_expf(x[j] - m); /* exact */
        }
        for (int r = nr; r < CE_RB; r++)
            memset(e[r], 0, (size_t)n * sizeof(double));
        add_in_order(s, (const double(*)[CE_CH])e, n);
    }
    for (int r = 0; r < nr; r++)
        sumexp[r] = (float)s[r];
}
LOOM_CPU_VARIANTS(sumexp_block,
                  (float *sumexp, const float *logits, const float *row_max, int nr, int Vl, int c0,
                   int c1),
                  (sumexp, logits, row_max, nr, Vl, c0, c1))

void loom_cpu_ce_row_sumexp(float *sumexp, const float *logits, const float *row_max, int BT,
                            int Vl, int col0, int V, int c0, int c1)
{
    /* sumexp (BT) =, logits (BT,Vl), row_max (BT); columns [c0,c1) local, real ones only */
    const int n = real_cols(Vl, col0, V);
    if (c0 < 0)
        c0 = 0;
    if (c1 > n)
        c1 = n;
    if (c1 < c0)
        c1 = c0;
    const int nblk = (BT + CE_RB - 1) / CE_RB;
#pragma omp parallel for schedule(static) if ((size_t)BT * (c1 - c0) > LOOM_CPU_PAR_MIN)
    for (int b = 0; b < nblk; b++) {
        const int i0 = b * CE_RB, nr = BT - i0 < CE_RB ? BT - i0 : CE_RB;
        sumexp_block(sumexp + i0, logits + (size_t)i0 * Vl, row_max + i0, nr, Vl, c0, c1);
    }
}

void loom_cpu_ce_target_logit(float *tlogit, const float *logits, const int *targets, int BT,
                              int Vl, int col0)
{
    /* tlogit (BT) =, logits (BT,Vl), targets (BT) global column indices */
    for (int i = 0; i < BT; i++) {
        const long j = (long)targets[i] - col0;
        tlogit[i] = j >= 0 && j < Vl ? logits[(size_t)i * Vl + j] : 0.0f;
    }
}

/* One valid row's gradient over its n real columns (of Vl): x <- e^{x - m} * k, flushed;
 * padding zeroed. */
LOOM_CPU_BODY grad_row_body(float *x, float m, float k, int n, int Vl)
{
#pragma omp simd
    for (int j = 0; j < n; j++)
        x[j] = loom_cpu_flush(loom_cpu_expf(x[j] - m) * k); /* no subnormals into the GEMMs */
    memset(x + n, 0, (size_t)(Vl - n) * sizeof(float));
}
LOOM_CPU_VARIANTS(grad_row, (float *x, float m, float k, int n, int Vl), (x, m, k, n, Vl))

void loom_cpu_ce_finish(float *logits, float *losses, const float *row_max, const float *sumexp,
                        const float *tlogit, const int *targets, float dloss, int BT, int Vl,
                        int col0, int V)
{
    /* logits (BT,Vl) -> gradient if dloss != 0; losses (BT) =; row_max, sumexp, tlogit (BT)
     * combined over the slices; targets (BT) global */
    const int n = real_cols(Vl, col0, V);
#pragma omp parallel for schedule(static) if ((size_t)BT * Vl > LOOM_CPU_PAR_MIN && dloss != 0.0f)
    for (int i = 0; i < BT; i++) {
        float *x = logits + (size_t)i * Vl;
        const int y = targets[i];
        if (y < 0 || y >= V) {
            losses[i] = 0.0f;
            if (dloss != 0.0f)
                memset(x, 0, (size_t)Vl * sizeof(float));
            continue;
        }
        const float m = row_max[i], s = sumexp[i];
        losses[i] = logf(s) + (m - tlogit[i]);
        if (dloss != 0.0f) {
            grad_row(x, m, dloss / s, n, Vl);
            const long jy = (long)y - col0;
            if (jy >= 0 && jy < Vl)
                x[jy] -= dloss;
        }
    }
}
