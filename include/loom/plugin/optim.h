/* plugin/optim.h — the optimizer interface: an update rule over flat fp32 shards.
 *
 * The core owns every buffer. Parameters, gradients and optimizer state are flat fp32
 * arrays laid out as the parameter table says; a ZeRO strategy hands the optimizer only
 * this rank's shard, so an optimizer never knows about layouts or ranks. State is
 * state_per_param() fp32 slots per parameter, stored slot-major within a segment:
 * slot k of element i is state[k * n + i]. It starts zeroed; it is checkpointed by
 * the core as raw floats. Where the model lives in device memory, step_backend runs the
 * same update through the backend's ops instead of on the host.
 */
#ifndef LOOM_PLUGIN_OPTIM_H
#define LOOM_PLUGIN_OPTIM_H

#include "loom/plugin.h"
#include "loom/plugin/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A contiguous run of parameters that share a weight-decay rule. */
typedef struct loom_optim_segment {
    float *param;           /* n values, updated in place */
    const float *grad;      /* n values, already averaged, unscaled and clipped by grad_scale */
    float *state;           /* state_per_param * n values, slot-major */
    size_t n;
    float weight_decay;     /* the decay to apply to this segment (0 for biases, norms) */
} loom_optim_segment;

typedef struct loom_optim_step_args {
    const loom_optim_segment *segments;
    size_t n_segments;
    float lr;               /* this step's learning rate, from the schedule */
    int64_t step;           /* 1-based count of updates taken, including this one */
    float grad_scale;       /* multiply every gradient by this before use (clipping) */
} loom_optim_step_args;

typedef struct loom_optim_ops {
    size_t size; /* sizeof(loom_optim_ops) as the plugin saw it */
    /* Make an instance from the resolved config. On failure return a status and a
     * message via host->fail; *self is untouched. */
    loom_status (*create)(const loom_host *host, const loom_config *cfg, void **self);
    /* Free an instance; destroy(NULL) does nothing. */
    void (*destroy)(void *self);
    /* fp32 state slots per parameter (AdamW: 2, SGD with momentum: 1, plain SGD: 0). */
    uint32_t (*state_per_param)(void *self);
    /* The weight decay the recipe asked for, before the per-segment rule; and whether it
     * applies to every parameter (1) or to matrices only (0). The core uses this to set
     * loom_optim_segment.weight_decay. */
    void (*decay_rule)(void *self, float *weight_decay, int *decay_all);
    /* One update over all segments. Blocking, host memory, no allocation. Segments are
     * independent, so the core may call step on parts of the model separately. */
    loom_status (*step)(void *self, const loom_optim_step_args *args);
    /* Added for device memory (may be absent: check size). The same update as step, with
     * every segment's param, grad and state pointers in the backend's memory (a GPU's):
     * the per-step constants are computed on the host as step computes them, and the
     * element loop runs as the backend's update op (backend.h: adamw_update, sgd_update),
     * queued on its stream, so the result has step's bits. A backend without the op: a
     * status and a message naming it. The core calls step for host memory (the CPU
     * backend), so the CPU path never goes through here. */
    loom_status (*step_backend)(void *self, const loom_optim_step_args *args,
                                const loom_backend_ops *backend, void *backend_self);
} loom_optim_ops;

#ifdef __cplusplus
}
#endif
#endif
