/* plugin/strategy.h — parallel strategies: how parameters, gradients and optimizer state
 * are placed and synchronised.
 *
 * A strategy never owns the training loop. The core calls its hooks at fixed points, in
 * a fixed order, and a strategy that does not care about a point leaves the member NULL.
 * Strategies compose (tp + zero + ep in one run) because each acts only at these points.
 * Implemented in later work: dp, tp, zero, offload, ep.
 */
#ifndef LOOM_PLUGIN_STRATEGY_H
#define LOOM_PLUGIN_STRATEGY_H

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One parameter as the parameter table describes it. */
typedef struct loom_param_info {
    const char *name;         /* logical name, e.g. "h.3.mlp.fc.weight" */
    int ndim;
    int64_t shape[4];         /* logical (global) shape */
    int64_t slice_start[4];   /* the slice this rank holds */
    int64_t slice_len[4];
    size_t offset;            /* element offset in the rank's flat buffer */
    size_t numel;             /* elements held by this rank */
    int layer;                /* transformer block index, -1 outside blocks */
} loom_param_info;

/* The partitioning a strategy asks for: split dim `dim` of a parameter across `parts`. */
typedef struct loom_partition {
    int dim;     /* -1: replicated */
    int parts;
    int index;   /* which part this rank holds */
} loom_partition;

/* A model region whose boundaries carry communication (Megatron's f and g). */
typedef enum loom_region {
    LOOM_REGION_ATTENTION = 0,
    LOOM_REGION_MLP,
    LOOM_REGION_VOCAB
} loom_region;

typedef struct loom_strategy_ops {
    size_t size;
    loom_status (*create)(const loom_host *host, const loom_config *cfg, void **self);
    void (*destroy)(void *self);
    /* Where a parameter lives; NULL member: everything replicated. */
    loom_status (*partition)(void *self, const loom_param_info *p, loom_partition *out);
    /* Forward/backward region boundaries: enter (f) and leave (g). Buffers are activations. */
    loom_status (*region_forward_enter)(void *self, loom_region r, int layer, float *x, size_t n);
    loom_status (*region_forward_leave)(void *self, loom_region r, int layer, float *x, size_t n);
    loom_status (*region_backward_enter)(void *self, loom_region r, int layer, float *dx, size_t n);
    loom_status (*region_backward_leave)(void *self, loom_region r, int layer, float *dx, size_t n);
    /* Gradients of [offset, offset+n) of the flat buffer are final for this micro-batch
     * window (called in backward order). */
    loom_status (*grads_ready)(void *self, float *grads, size_t offset, size_t n);
    /* A layer's parameters are about to be used / are done (ZeRO-3 gather and release). */
    loom_status (*params_needed)(void *self, int layer);
    loom_status (*params_done)(void *self, int layer);
    /* Around the optimizer step. before_step waits for outstanding reductions. */
    loom_status (*before_step)(void *self);
    loom_status (*after_step)(void *self);
} loom_strategy_ops;

#ifdef __cplusplus
}
#endif
#endif
