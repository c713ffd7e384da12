/* plugin/sched.h — pipeline schedules as data.
 *
 * Given (pp size, stage, micro-batches, virtual chunks) a schedule emits the ordered
 * instructions for one rank. Implemented: the built-in sched plugins gpipe, 1f1b,
 * interleaved and zb1 (plugins/sched/), a validator and simulator in the core
 * (core/train/schedule.h: every micro-batch forwarded then backwarded once per chunk,
 * sends matched by receives across stages, no cycle of waits; timeline, bubble, peak
 * micro-batches in flight), `loom schedule` to look at one, and schedules written as a Lua
 * function (docs/PIPELINE.md), and the engine that executes a list in training
 * (core/train/pipeline.c; BWD_INPUT / BWD_WEIGHT run the GPT model's split backward,
 * core/model/gpt_backward_split.c).
 *
 * What a list means, so that any engine runs any valid list without deadlock:
 *  - FWD / BWD / BWD_INPUT / BWD_WEIGHT are compute on this rank's chunk `chunk`.
 *    BWD is the fused backward (input and weight gradients); a list may instead split it
 *    into BWD_INPUT (B: the activation gradient, on the critical path) and a later
 *    BWD_WEIGHT (W: the weight gradient, which may be delayed to fill bubbles). A
 *    micro-batch's activations are held from its FWD until its BWD or BWD_WEIGHT.
 *  - SEND_* starts an asynchronous send and never blocks; the engine waits for it before
 *    reusing the buffer or at the end of the step, never before a later RECV of the list
 *    is posted (a send that waited for its receiver there could deadlock 1F1B's steady
 *    state, which is why Megatron pairs them: send_forward_recv_backward). RECV_* blocks
 *    until the data is there.
 *  - Virtual stages: chunk c of rank r is virtual stage c * stages + r. Activations go from
 *    virtual stage k to k + 1 (so from rank stages-1, chunk c to rank 0, chunk c+1) and
 *    gradients back. In SEND/RECV, `chunk` is the chunk on this rank the data belongs to:
 *    SEND_ACT(mb, c) sends the output of this rank's FWD(mb, c); RECV_ACT(mb, c) receives
 *    the input of this rank's FWD(mb, c); SEND_GRAD(mb, c) sends the input gradient of
 *    this rank's backward of (mb, c); RECV_GRAD(mb, c) receives its output gradient.
 */
#ifndef LOOM_PLUGIN_SCHED_H
#define LOOM_PLUGIN_SCHED_H

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values only ever append. */
typedef enum loom_sched_op {
    LOOM_SCHED_FWD = 1,
    LOOM_SCHED_BWD,        /* fused backward: BWD_INPUT and BWD_WEIGHT in one */
    LOOM_SCHED_SEND_ACT,   /* send activations to the next stage */
    LOOM_SCHED_RECV_ACT,   /* receive activations from the previous stage */
    LOOM_SCHED_SEND_GRAD,  /* send activation gradients to the previous stage */
    LOOM_SCHED_RECV_GRAD,  /* receive activation gradients from the next stage */
    LOOM_SCHED_BWD_INPUT,  /* B: gradient of the input only (then SEND_GRAD may follow) */
    LOOM_SCHED_BWD_WEIGHT  /* W: gradient of the weights, after the same (mb, chunk)'s B */
} loom_sched_op;

typedef struct loom_sched_instr {
    loom_sched_op op;
    int microbatch;
    int chunk;   /* virtual stage index on this rank (0 without interleaving) */
} loom_sched_instr;

typedef struct loom_sched_shape {
    int stages;        /* pp size */
    int stage;         /* this rank's stage */
    int microbatches;
    int chunks;        /* virtual chunks per rank */
} loom_sched_shape;

/* Room enough for any list the built-in plugins build: per (micro-batch, chunk) at most
 * FWD, BWD_INPUT, BWD_WEIGHT and four transfers. The core passes at least this cap. */
#define LOOM_SCHED_CAP(shape) ((size_t)8 * (size_t)(shape)->microbatches * (size_t)(shape)->chunks)

typedef struct loom_sched_ops {
    size_t size;
    /* Writes at most cap instructions; *n gets the count. LOOM_ERR_INVALID with a message
     * if the shape is unsupported (e.g. interleaving needs microbatches % stages == 0).
     * Pure: no allocation, no state; the same shape always gives the same list. A plugin
     * has no loom_host here, so the message comes from check() below. */
    loom_status (*build)(const loom_sched_shape *shape, loom_sched_instr *out, size_t cap,
                         size_t *n);
    /* Appended. Optional (NULL or past size: every shape with stages, microbatches and
     * chunks >= 1 is accepted). Can build() serve this shape? Returns 1, or 0 and writes
     * into reason what is wrong and what would work ("interleaved: microbatches = 6 is not
     * a multiple of stages = 4; use 4, 8 or 12, or the 1f1b schedule"). Cheap and free of
     * side effects, like the descriptor's probe; the core calls it before build(). */
    int (*check)(const loom_sched_shape *shape, char *reason, size_t reason_len);
} loom_sched_ops;

#ifdef __cplusplus
}
#endif
#endif
