/* pipeline_split.c — the cost-balanced split (pipeline_split.h).
 *
 * Two exact dynamic programmes over (stage k, first block j) for the stages k..V-1 that
 * hold blocks j..L-1: the smallest possible costliest stage M, then the smallest sum of
 * squares with every stage within M. A tolerance of a few ulps of the total keeps rounding
 * from choosing between equal splits: ties go to the earlier stage holding more blocks.
 */
#include "pipeline_split.h"

#include <math.h>
#include <stdlib.h>

#include "base/status.h"

typedef struct split_ctx {
    int L, V;
    const double *pre; /* pre[j]: the cost of blocks 0..j-1 */
    double first, last, tol;
} split_ctx;

/* The cost of virtual stage k holding blocks [j, j + n). */
static double stage_cost(const split_ctx *x, int k, int j, int n)
{
    return x->pre[j + n] - x->pre[j] + (k == 0 ? x->first : 0.0) + (k == x->V - 1 ? x->last : 0.0);
}

/* Blocks stage k may take from block j on: at least 1, leaving 1 for each later stage. */
static int most(const split_ctx *x, int k, int j) { return x->L - j - (x->V - 1 - k); }

loom_status loom_pipeline_balance(int L, int V, const double *layer, double first, double last,
                                  int *counts)
{
    if (V < 1 || L < V)
        LOOM_FAIL(LOOM_ERR_INVALID, "cannot split %d blocks into %d pipeline stages of at least "
                  "one block each", L, V);
    size_t cells = (size_t)(V + 1) * (size_t)(L + 1);
    double *pre = malloc((size_t)(L + 1) * sizeof *pre);
    double *mx = malloc(cells * sizeof *mx), *sq = malloc(cells * sizeof *sq);
    if (!pre || !mx || !sq) {
        free(pre), free(mx), free(sq);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory splitting %d blocks into %d stages", L, V);
    }
    pre[0] = 0.0;
    for (int l = 0; l < L; l++)
        pre[l + 1] = pre[l] + (layer ? layer[l] : 1.0);
    split_ctx x = {L, V, pre, first, last, 0.0};
    x.tol = 1e-12 * (fabs(pre[L]) + fabs(first) + fabs(last));
#define AT(t, k, j) (t)[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    /* mx[k][j]: the smallest costliest stage of stages k.. over blocks j.. */
    for (int k = V - 1; k >= 0; k--)
        for (int j = k; j <= L - (V - k); j++) {
            double best = INFINITY;
            for (int n = 1; n <= most(&x, k, j); n++) {
                if (k == V - 1 && n != L - j)
                    continue;
                double c = stage_cost(&x, k, j, n);
                double rest = k == V - 1 ? c : AT(mx, k + 1, j + n);
                double m = c > rest ? c : rest;
                best = m < best ? m : best;
            }
            AT(mx, k, j) = best;
        }
    double M = AT(mx, 0, 0) + x.tol;
    /* sq[k][j]: the smallest sum of squares of stages k.. over blocks j.., each within M */
    for (int k = V - 1; k >= 0; k--)
        for (int j = k; j <= L - (V - k); j++) {
            double best = INFINITY;
            for (int n = 1; n <= most(&x, k, j); n++) {
                if (k == V - 1 && n != L - j)
                    continue;
                double c = stage_cost(&x, k, j, n);
                if (c > M)
                    continue;
                double rest = k == V - 1 ? 0.0 : AT(sq, k + 1, j + n);
                if (c * c + rest < best)
                    best = c * c + rest;
            }
            AT(sq, k, j) = best;
        }
    /* Walk from the front: the most blocks that keep the optimum (within rounding). */
    double qtol = 1e-12 * (AT(sq, 0, 0) + 1.0);
    for (int k = 0, j = 0; k < V; k++) {
        int take = L - j;
        if (k < V - 1)
            for (int n = most(&x, k, j); n >= 1; n--) {
                double c = stage_cost(&x, k, j, n);
                if (c <= M && c * c + AT(sq, k + 1, j + n) <= AT(sq, k, j) + qtol) {
                    take = n;
                    break;
                }
            }
        counts[k] = take;
        j += take;
    }
#undef AT
    free(pre), free(mx), free(sq);
    return LOOM_OK;
}
