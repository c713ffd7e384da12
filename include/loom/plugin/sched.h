/* plugin/sched.h — pipeline schedules as data.
 *
 * Given (pp size, stage, micro-batches, virtual chunks) a schedule emits the ordered
 * instructions for one rank. The core's pipeline engine executes any valid list and a
 * validator checks it first (every micro-batch forwarded then backwarded once, sends
 * match receives across stages, no deadlock). Implemented in later work: gpipe, 1f1b,
 * interleaved.
 */
#ifndef LOOM_PLUGIN_SCHED_H
#define LOOM_PLUGIN_SCHED_H

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_sched_op {
    LOOM_SCHED_FWD = 1,
    LOOM_SCHED_BWD,
    LOOM_SCHED_SEND_ACT,   /* send activations to the next stage */
    LOOM_SCHED_RECV_ACT,   /* receive activations from the previous stage */
    LOOM_SCHED_SEND_GRAD,  /* send activation gradients to the previous stage */
    LOOM_SCHED_RECV_GRAD   /* receive activation gradients from the next stage */
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

typedef struct loom_sched_ops {
    size_t size;
    /* Writes at most cap instructions; *n gets the count. LOOM_ERR_INVALID with a message
     * if the shape is unsupported (e.g. interleaving needs microbatches % stages == 0). */
    loom_status (*build)(const loom_sched_shape *shape, loom_sched_instr *out, size_t cap,
                         size_t *n);
} loom_sched_ops;

#ifdef __cplusplus
}
#endif
#endif
