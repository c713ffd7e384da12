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

/* Split the dp group for ep (which must divide dp; a power of two in canonical mode,
 * par->canonical); fills par's ep fields. be: canonical mode's sums live on it. */
loom_status loom_ep_create(int ep, loom_backend *be, loom_gpt_parallel *par, loom_ep **out);
void loom_ep_destroy(loom_ep *x);
/* Canonical mode, after each micro-batch's backward: its per-source expert gradients
 * (loom_gpt_moe_source_grads) into the sources' trees. Nothing in fast mode. */
loom_status loom_ep_end_micro(loom_ep *x, loom_gpt *m);
/* The same with an interleaved pipeline stage's chunks (pl: chunks > 1), after the
 * backward of `chunk` of a micro-batch: that chunk's experts (its blocks'), each chunk's
 * in trees of their own (the chunks' backwards interleave, each in micro-batch order). */
struct loom_pipeline;
loom_status loom_ep_end_chunk(loom_ep *x, loom_gpt *m, const struct loom_pipeline *pl, int chunk);
/* Sum the expert entries' gradients over the edp group (after the step's backwards). In
 * canonical mode in the fixed tree over the global micro-batch index (the tree ep=1 sums
 * every gradient in): per source rank over its micro-batches, over the ep group's
 * sources in rank order, then over the edp group's blocks. */
loom_status loom_ep_reduce(loom_ep *x, loom_gpt *m, double *comm_ms);
/* The global squared gradient norm from grad_norm's per-entry chunk sums (slots, n of
 * them, in table order: loom_grad_norm_slots): the dense entries' (the same on every rank)
 * and every ep rank's expert entries' (gathered), added in ep=1's table order, so every
 * rank and every ep gets ep=1's bits; *nonfinite is set if any ep rank's expert gradients
 * have an inf or nan. */
loom_status loom_ep_norm(loom_ep *x, loom_gpt *m, const double *slots, size_t n, double *norm_sq,
                         int *nonfinite, double *comm_ms);

/* The same slots in ep=1's order (the dense ones as they are, each run of expert slots as
 * every ep rank's runs in rank order; *n_order of them, held by x until the next call),
 * for a norm summed across pipeline stages in one rank's order (loom_pipeline_norm_order). */
loom_status loom_ep_norm_order(loom_ep *x, loom_gpt *m, const double *slots, size_t n,
                               int *nonfinite, double *comm_ms, const double **order,
                               size_t *n_order);

/* loom_ep_norm_order's slots rearranged chunk by chunk for an interleaved stage (pl), each
 * chunk's in that order; chunk_slots[c]: chunk c's count (loom_pipeline_norm_order). */
loom_status loom_ep_norm_chunks(loom_ep *x, loom_gpt *m, const struct loom_pipeline *pl,
                                const double *slots, size_t n, int *nonfinite, double *comm_ms,
                                const double **order, size_t *n_order, const size_t **chunk_slots);
/* A checkpoint under ep: the whole model as an ep=1 run holds it — ft the ep=1 table
 * (every expert, by logical name, in global order), *params and *full_state (slots x
 * ft->total, NULL without state) host copies of every rank's parameters and optimizer
 * state, gathered over the host ep group (collective: every rank calls it), from this
 * rank's host copies host_params and state (a device backend's mirrors). The caller frees
 * them and ft (loom_params_free). */
loom_status loom_ep_gather_full(loom_ep *x, loom_gpt *m, const float *host_params,
                                const float *state, uint32_t slots, loom_param_table *ft,
                                float **params, float **full_state);
/* The expert-data-parallel group (the dp ranks holding this rank's experts; size 1 when
 * ep = dp), for ZeRO's expert partitions (zero_ep.c). */
void loom_ep_edp_group(const loom_ep *x, const struct loom_comm_ops **ops, void **group,
                       int *size);
/* The same group for the backend's memory (a device backend's: split from
 * loom_host.device_group's dp group; host memory: loom_ep_edp_group's), for ZeRO's expert
 * buckets in device memory (zero_ep.c). */
void loom_ep_edp_device_group(const loom_ep *x, const struct loom_comm_ops **ops, void **group,
                              int *size);
/* The session's ep groups (NULL without expert parallelism). */
struct loom_session;
loom_ep *loom_session_ep(struct loom_session *s);

#endif
