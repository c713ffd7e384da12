/* plugin/strategy.h — parallel strategies: how parameters, gradients and optimizer state
 * are placed and synchronised.
 *
 * A strategy never owns the training loop. The core calls its hooks at fixed points, in
 * a fixed order, and a strategy that does not care about a point leaves the member NULL.
 * Strategies compose (tp + zero + ep in one run) because each acts only at these points.
 * Implemented: dp, tp. ZeRO stages 1-3 are built in the core (core/train/zero*.c), since
 * they own the optimizer state and the partitions (optim.h: the core owns every buffer);
 * the model calls its gather/release hook directly (gpt.h loom_gpt_set_param_hook), so
 * params_needed/params_done are not called yet. Later: offload, ep.
 */
#ifndef LOOM_PLUGIN_STRATEGY_H
#define LOOM_PLUGIN_STRATEGY_H

#include "loom/plugin.h"
#include "loom/plugin/backend.h"
#include "loom/plugin/comm.h"

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
    /* The dim a tensor-parallel split may cut (the model's choice: output features of a
     * column-parallel layer, input features of a row-parallel one, vocabulary rows of the
     * embedding); -1: the parameter must be replicated. */
    int split_dim;
} loom_param_info;

/* The partitioning a strategy asks for: split dim `dim` of a parameter across `parts`. */
typedef struct loom_partition {
    int dim;     /* -1: replicated */
    int parts;
    int index;   /* which part this rank holds */
} loom_partition;

/* How a tensor-parallel strategy lays out activations. */
typedef struct loom_parallel_layout {
    int parts;                /* tensor-parallel group size (1: none) */
    int index;                /* this rank's place in it */
    int sequence_parallel;    /* 1: outside parallel regions each rank holds rows/parts token
                               * rows (Korthikanti et al. 2022) */
} loom_parallel_layout;

/* A model region whose boundaries carry communication (Megatron's f and g). */
typedef enum loom_region {
    LOOM_REGION_ATTENTION = 0,  /* qkv (column) .. attention .. proj (row) */
    LOOM_REGION_MLP,            /* fc (column) .. gelu .. proj (row) */
    LOOM_REGION_EMBEDDING,      /* vocabulary-parallel token embedding: only leaves */
    LOOM_REGION_HEAD            /* vocabulary-parallel LM head: only enters */
} loom_region;

/* Activations crossing a region boundary: row-major rows of `width` floats. `rows` is the
 * micro-batch's token count (B*T); "this rank's rows" are all of them, or the rank's
 * contiguous rows/parts block under sequence parallelism. */
typedef struct loom_region_io {
    const float *in;
    float *out;               /* may equal in where the sizes match */
    size_t rows, width;
} loom_region_io;

typedef struct loom_strategy_ops {
    size_t size;
    loom_status (*create)(const loom_host *host, const loom_config *cfg, void **self);
    void (*destroy)(void *self);
    /* Where a parameter lives; NULL member: everything replicated. */
    loom_status (*partition)(void *self, const loom_param_info *p, loom_partition *out);
    /* Tensor-parallel strategies: the activation layout. NULL member: no tensor split. */
    loom_status (*layout)(void *self, loom_parallel_layout *out);
    /* Region boundaries, in the order the core crosses them:
     *  forward_enter  (f): in = this rank's rows of the input; out = all rows.
     *  forward_leave  (g): in = this rank's partial sums over all rows; out = the summed
     *                      rows this rank keeps.
     *  backward_leave (g's backward): in = gradient of this rank's rows; out = all rows.
     *  backward_enter (f's backward): in = partial input gradients over all rows; out = the
     *                      summed rows this rank keeps.
     * In canonical mode each partial is the sum of a complete subtree of a fixed binary
     * tree of chunks (LOOM_CANONICAL_CHUNKS of them, each rank holding a contiguous run),
     * and the strategy finishes the same tree over the ranks in rank order.
     * A hook may return with its communication in flight; region_wait completes it before
     * the core reads out (used where other work can run meanwhile). */
    loom_status (*region_forward_enter)(void *self, loom_region r, int layer, const loom_region_io *io);
    loom_status (*region_forward_leave)(void *self, loom_region r, int layer, const loom_region_io *io);
    loom_status (*region_backward_leave)(void *self, loom_region r, int layer, const loom_region_io *io);
    loom_status (*region_backward_enter)(void *self, loom_region r, int layer, const loom_region_io *io);
    loom_status (*region_wait)(void *self);
    /* Combine n values across the tensor-parallel group in place: SUM (canonical mode:
     * the fixed tree over ranks, as above) or MAX. */
    loom_status (*tensor_allreduce)(void *self, float *x, size_t n, loom_reduce_op op);
    /* out (parts*n) = every rank's n values of in, in rank order. */
    loom_status (*tensor_allgather)(void *self, const float *in, float *out, size_t n);
    /* Gradients of [offset, offset+n) of the flat buffer are final for this micro-batch
     * window (called in backward order). */
    loom_status (*grads_ready)(void *self, float *grads, size_t offset, size_t n);
    /* A layer's parameters are about to be used / are done (ZeRO-3 gather and release). */
    loom_status (*params_needed)(void *self, int layer);
    loom_status (*params_done)(void *self, int layer);
    /* Around the optimizer step. before_step waits for outstanding reductions. */
    loom_status (*before_step)(void *self);
    loom_status (*after_step)(void *self);
    /* Optional (read only if size covers it): how many reductions grads_ready has started
     * that before_step has not completed yet; the core's trace marks when the first one
     * started (the data-parallel all-reduce span). */
    int (*pending)(void *self);
    /* Optional (read only if size covers it): the backend whose memory the region and
     * tensor buffers are, where that is not host memory (a device backend: CUDA). The core
     * calls it once, after create and before any hook; the strategy then does what it does
     * to those buffers besides communicating (canonical mode's tree over ranks, its
     * scratch) through the backend's ops, and takes its groups from device_group (which
     * it should do anyway: with a host-memory backend that is group). Not called: host
     * memory, and a strategy without the member is refused on a device backend. */
    loom_status (*set_backend)(void *self, const loom_backend_ops *ops, void *backend_self);
} loom_strategy_ops;

/* Canonical mode's fixed chunk count for sums a tensor split could reassociate: sized for
 * the largest tensor-parallel group it supports. */
#define LOOM_CANONICAL_CHUNKS 8

#ifdef __cplusplus
}
#endif
#endif
