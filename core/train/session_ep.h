/* session_ep.h — expert parallelism's groups and the step's expert-gradient work
 * (docs/MOE.md). The mesh's dp ranks form ep groups of `ep` consecutive dp ranks (the
 * experts are split over one) and expert-data-parallel groups of the dp ranks with the
 * same place in their ep group (which hold the same experts). Dense gradients are reduced
 * over dp as without ep; an expert's over its edp group; the gradient norm adds every ep
 * rank's expert part in rank order, so every rank gets the same bits.
 */
#ifndef LOOM_CORE_SESSION_EP_H
#define LOOM_CORE_SESSION_EP_H

#include "model/gpt.h"

typedef struct loom_ep loom_ep;

/* Split the dp group for ep (which must divide dp); fills par's ep fields. */
loom_status loom_ep_create(int ep, loom_gpt_parallel *par, loom_ep **out);
void loom_ep_destroy(loom_ep *x);
/* Sum the expert entries' gradients over the edp group (after backward). */
loom_status loom_ep_reduce(loom_ep *x, loom_gpt *m, double *comm_ms);
/* The global squared gradient norm from grad_norm's per-entry chunk sums (slots, n of
 * them, in table order: loom_grad_norm_slots): the dense entries' (the same on every rank)
 * plus every ep rank's expert entries', added in rank order, so every rank gets the same
 * bits; *nonfinite is set if any ep rank's expert gradients have an inf or nan. */
loom_status loom_ep_norm(loom_ep *x, loom_gpt *m, const double *slots, size_t n, double *norm_sq,
                         int *nonfinite, double *comm_ms);

/* A checkpoint under ep: the whole model as an ep=1 run holds it — ft the ep=1 table
 * (every expert, by logical name, in global order), *params and *full_state (slots x
 * ft->total, NULL without state) host copies of every rank's parameters and optimizer
 * state, gathered over the ep group (collective: every rank calls it). The caller frees
 * them and ft (loom_params_free). */
loom_status loom_ep_gather_full(loom_ep *x, loom_gpt *m, const float *state, uint32_t slots,
                                loom_param_table *ft, float **params, float **full_state);
/* The session's ep groups (NULL without expert parallelism). */
struct loom_session;
loom_ep *loom_session_ep(struct loom_session *s);

#endif
