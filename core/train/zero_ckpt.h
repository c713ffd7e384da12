/* zero_ckpt.h — moving ZeRO's partitions to and from whole-tensor buffers for checkpoints.
 *
 * A checkpoint holds the optimizer state (and the parameters) by logical tensor, as a run
 * without ZeRO holds them (checkpoint.h), so it loads into any layout. Under ZeRO the state
 * lives in partitions (zero.h): saving first assembles the whole state on every dp rank
 * (one all-gather of the partitions over dp), loading copies each rank's own ranges out of
 * the whole state the loader assembled. Both cost slots * table total floats of transient
 * host memory per rank (released when the save or load returns).
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

/* Collective over dp: the whole optimizer state (slots * total floats, laid out as
 * session.c lays it out without ZeRO: entry e's slot k at slots*e.offset + k*e.numel)
 * into full on every rank. Stage 3 also gathers every parameter into the model's buffer
 * (pinned until loom_zero_ckpt_done). */
loom_status loom_zero_ckpt_gather(loom_zero *z, uint32_t slots, float *full);
loom_status loom_zero_ckpt_done(loom_zero *z);
/* Local: this rank's ranges of the whole state (and, stage 3, of the model's parameter
 * buffer) into its partitions; p, n: loom_zero_pieces of this rank (taken beforehand, so
 * that this cannot fail). */
int loom_zero_rank(const loom_zero *z);
void loom_zero_ckpt_scatter(loom_zero *z, uint32_t slots, const float *full,
                            const loom_zero_piece *p, size_t n);

#endif
