/* plugin/precision.h — the precision policy: which dtypes parameters, compute and
 * gradients use, whether fp32 master weights are kept, and the loss scale.
 *
 * The core asks the policy for its dtypes once, multiplies the loss gradient by
 * loss_scale() before backward, divides gradients by it before the optimizer, checks the
 * gradients for inf/nan and reports that to update(), which says whether to skip the
 * step and adjusts the scale (fp16's dynamic loss scaling; a scale of 1 never changes).
 * Implemented: fp32 (scale 1, no master copy), bf16 (bf16 weights and activations, fp32
 * master weights, scale 1) and fp16 (f16 likewise, with dynamic loss scaling).
 */
#ifndef LOOM_PLUGIN_PRECISION_H
#define LOOM_PLUGIN_PRECISION_H

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_precision_dtypes {
    loom_dtype param;    /* dtype the forward/backward reads weights in */
    loom_dtype compute;  /* dtype of activations and matmul inputs */
    loom_dtype grad;     /* dtype gradients are produced and reduced in */
    int master_weights;  /* 1: keep an fp32 copy that the optimizer updates */
} loom_precision_dtypes;

typedef struct loom_precision_ops {
    size_t size;
    loom_status (*create)(const loom_host *host, const loom_config *cfg, void **self);
    void (*destroy)(void *self);
    void (*dtypes)(void *self, loom_precision_dtypes *out);
    /* The factor the loss gradient is multiplied by before backward. */
    float (*loss_scale)(void *self);
    /* After backward: found_nonfinite says whether any gradient or loss was inf or nan (on any
     * rank). Returns 1 if the optimizer step must be skipped. May change loss_scale(). */
    int (*update)(void *self, int found_nonfinite);
    /* The scale's internal state, for checkpoints: *n floats (at most 4). */
    void (*get_state)(void *self, float *state, int *n);
    void (*set_state)(void *self, const float *state, int n);
    /* Added with fp16 (may be absent: check size). After update(): NULL, or why the run
     * cannot go on (fp16: the scale is at its minimum and still overflows) with what to
     * try; the core stops the run with it, the step's update not applied. */
    const char *(*stop_reason)(void *self);
} loom_precision_ops;

#ifdef __cplusplus
}
#endif
#endif
