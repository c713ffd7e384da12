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
 * zero.c's segments); *n gets the count. malloc'd; the caller frees. Under expert
 * parallelism r must be this rank: its dense pieces, then its expert pieces (zero_ep.c). */
loom_status loom_zero_pieces(const loom_zero *z, int r, loom_zero_piece **out, size_t *n);
int loom_zero_ranks(const loom_zero *z);

/* Stage 3: this rank's parameter partition (P/N floats at the pieces' pos), else NULL. */
const float *loom_zero_part_params(const loom_zero *z);
/* Local: this rank's ranges of the whole state (and, stage 3, of the model's parameter
 * buffer) into its partitions (the state into `state` when not NULL: an offloaded run's
 * copy, offload.h); p, n: loom_zero_pieces of this rank (taken beforehand, so
 * that this cannot fail). */
int loom_zero_rank(const loom_zero *z);
void loom_zero_ckpt_scatter(loom_zero *z, uint32_t slots, const float *full,
                            const loom_zero_piece *p, size_t n, float *state);

/* Under expert parallelism (zero_ep.c): this rank's whole optimizer state (slots x the
 * table's total, entry-major as without ZeRO) assembled from the dense partitions over dp
 * and the expert ones over the edp group, for a checkpoint that then gathers it over ep
 * (session_ep.h); collective. *out NULL without state; the caller frees it. */
loom_status loom_zero_full_state(loom_zero *z, uint32_t slots, float **out);

#endif
