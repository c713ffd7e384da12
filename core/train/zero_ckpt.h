/* zero_ckpt.h — moving ZeRO's partitions to and from whole-tensor buffers for checkpoints.
 *
 * A checkpoint holds the optimizer state (and the parameters) by logical tensor
 * (checkpoint.h), so it loads into any layout. Under ZeRO the state lives in partitions
 * (zero.h): a save writes each dp rank's pieces from its partition as they are (slice
 * files, checkpoint.h); a load copies the stored boxes' intersections with each rank's own
 * pieces straight into its partitions (checkpoint_load.c: the state, and under stage 3 the
 * parameters), with no whole-state buffer and, under stage 3, no full parameter copy.
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

/* Stage 3's parameter partition (P/N floats at the pieces' pos) for a save:
 * loom_zero_read_part_params (zero.h). */
/* Stage 3, a load: where this rank's parameter partition is written (the loader copies
 * its pieces there, then marks the units stale: loom_zero_params_stale), or NULL when the
 * offload holds it: the loader fills a partition-sized copy (loom_zero_part_floats) and
 * hands it to loom_zero_store_part, which writes it into the offload (a failed write
 * names the file). */
int loom_zero_rank(const loom_zero *z);
float *loom_zero_load_params_dst(loom_zero *z);
loom_status loom_zero_store_part(loom_zero *z, const float *part);

/* Under expert parallelism (zero_ep.c): this rank's whole optimizer state (slots x the
 * table's total, entry-major as without ZeRO) assembled from the dense partitions over dp
 * and the expert ones over the edp group, for a checkpoint that then gathers it over ep
 * (session_ep.h); collective. *out NULL without state; the caller frees it. */
loom_status loom_zero_full_state(loom_zero *z, uint32_t slots, float **out);

#endif
