/* grad_norm.h — the global gradient norm (before clipping) and the non-finite check.
 *
 * The squared norm and whether any gradient is non-finite come out the same bits
 * on every rank and for every tensor-parallel split (DESIGN.md's canonical promise; the
 * fast mode gets it for free). Each parameter's sum of squares is taken, in double, over
 * LOOM_CANONICAL_CHUNKS fixed chunks along the dim a split may cut (the entry's
 * split_dim, whether or not this run splits it; one sum for a parameter that is always
 * whole); a chunk lives on exactly one rank of the tp group (a replicated parameter's on
 * tp rank 0), so after an all-gather every slot has one non-zero contribution, and the
 * slots are added in table order: each parameter counted once.
 * The tp group comes from the host; with one rank nothing is exchanged.
 */
#ifndef LOOM_CORE_GRAD_NORM_H
#define LOOM_CORE_GRAD_NORM_H

#include "base/backend.h"
#include "model/params.h"

typedef struct loom_grad_norm loom_grad_norm;

loom_status loom_grad_norm_create(const loom_backend *be, const loom_param_table *t,
                                  loom_grad_norm **out);
void loom_grad_norm_destroy(loom_grad_norm *gn);
/* The squared norm of grads (laid out as t says) and whether any value is inf or nan;
 * the exchange's wall time is added to *comm_ms. Every tp rank calls it. */
loom_status loom_grad_norm_compute(loom_grad_norm *gn, const loom_param_table *t,
                                   const float *grads, double *norm_sq, int *nonfinite,
                                   double *comm_ms);

/* Leave table entry i out of the norm and the non-finite check (a copy another rank
 * counts: the pipeline's tied wte on stage 0). */
void loom_grad_norm_skip(loom_grad_norm *gn, int i);
/* The last compute's first entry of this rank's table (in table order, the skipped one
 * left out) whose held gradient has an inf or nan, or -1. */
int loom_grad_norm_first_nonfinite(const loom_grad_norm *gn);
/* The last compute's per-chunk sums of squares over this rank's table, in table order
 * (after the tp exchange; a skipped entry's are 0), whose sum in this order is norm_sq:
 * the pipeline adds every stage's in stage order to get one rank's bits. */
const double *loom_grad_norm_slots(const loom_grad_norm *gn, size_t *n);

#endif
