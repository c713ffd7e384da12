/* zero_ckpt.h — moving ZeRO's partitions to and from whole-tensor buffers for checkpoints.
 *
 * A checkpoint holds the optimizer state (and the parameters) by logical tensor
 * (checkpoint.h), so it loads into any layout. Under ZeRO the state lives in partitions
 * (zero.h): a save writes each dp rank's pieces from its partition as they are (slice
 * files, checkpoint.h), a load copies each rank's own ranges out of the whole state the
 * loader assembled (slots * table total floats of transient host memory per rank).
 */
#ifndef LOOM_CORE_ZERO_CKPT_H
#define LOOM_CORE_ZERO_CKPT_H

#include "zero.h"

/* One piece of a partition: table entry `entry`, flat elements [lo, lo + n) of the
 * buffer, held at `pos` of the owning rank's partition (its state at slots * pos,
 * slot-major within the piece). */
typedef struct loom_zero_piece {
    int entry;
    size_t lo, n, pos;
} loom_zero_piece;

/* The pieces of rank r's partition, in the optimizer's segment order (the same walk as
 * zero.c's segments); *n gets the count. malloc'd; the caller frees. */
loom_status loom_zero_pieces(const loom_zero *z, int r, loom_zero_piece **out, size_t *n);
int loom_zero_ranks(const loom_zero *z);

/* Stage 3's parameter partition (P/N floats at the pieces' pos) for a save:
 * loom_zero_read_part_params (zero.h). */
/* Local: this rank's ranges of the whole state (and, stage 3, of the model's parameter
 * buffer) into its partitions (the state into `state` when not NULL: an offloaded run's
 * copy, offload.h); p, n: loom_zero_pieces of this rank (taken beforehand, so
 * that this cannot fail). */
int loom_zero_rank(const loom_zero *z);
void loom_zero_ckpt_scatter(loom_zero *z, uint32_t slots, const float *full,
                            const loom_zero_piece *p, size_t n, float *state);

#endif
