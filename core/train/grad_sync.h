/* grad_sync.h — gradients and losses across micro-batches and data-parallel ranks.
 *
 * Fast mode (default): parameter gradients accumulate in place over a rank's micro-batches;
 * with dp > 1 the `dp` strategy plugin all-reduces them in buckets as backward finishes
 * each layer of the last micro-batch, overlapping the rest of backward.
 *
 * Canonical mode (deterministic = "canonical"): every micro-batch's gradient is computed
 * on its own and the global gradient is the pairwise sum, in a fixed tree over the global
 * micro-batch index, of those gradients (the binary-counter tree: element i joins the
 * stack and equal levels merge, older + newer). A rank's contiguous block of 2^k
 * micro-batches is one complete subtree, so ranks sum their block locally, exchange block
 * sums with an all-gather and finish the same tree: dp = 1, 2, 4 give the same bits.
 * The loss is summed in the same tree in double precision in both modes' cross-rank part.
 * Canonical mode with compression (compress.h): each micro-batch's gradient is packed as
 * its own message instead of pushed; finish gathers every rank's and pushes each
 * decompressed micro-batch, in global order, into one tree on every rank.
 */
#ifndef LOOM_CORE_GRAD_SYNC_H
#define LOOM_CORE_GRAD_SYNC_H

#include "base/config.h"
#include "model/gpt.h"

typedef struct loom_grad_sync loom_grad_sync;

/* A reducer that replaces the dp strategy in fast mode (ZeRO-2, zero.h): begin before
 * each micro-batch, ready as backward finishes each range (every micro-batch, not only the
 * last), end after each backward. It keeps the model's gradient buffer zero between
 * micro-batches itself, so grad_sync does not zero it. */
typedef struct loom_grad_reducer {
    loom_status (*begin)(void *self, int a);
    loom_status (*ready)(void *self, size_t offset, size_t n);
    loom_status (*end)(void *self);
    void *self;
} loom_grad_reducer;

/* accum: micro-batches this rank runs per step. strategy: the resolved `dp` plugin config
 * (NULL when dp = 1). reducer: NULL, or the dp strategy's replacement in fast mode. */
loom_status loom_grad_sync_create(loom_gpt *m, loom_backend *be, int canonical, int accum,
                                  const loom_plugin_config *strategy,
                                  const loom_grad_reducer *reducer, loom_grad_sync **out);
/* Bytes of the buffers grad_sync holds now (canonical mode's sums and gathered blocks). */
size_t loom_grad_sync_buffer_bytes(const loom_grad_sync *gs);
void loom_grad_sync_destroy(loom_grad_sync *gs);

/* This rank's place in the data-parallel group. */
int loom_grad_sync_dp_size(const loom_grad_sync *gs);
int loom_grad_sync_dp_rank(const loom_grad_sync *gs);

/* Around this rank's micro-batch a (0-based) of a step. end gets the micro-batch's summed
 * token loss. */
loom_status loom_grad_sync_begin_micro(loom_grad_sync *gs, int a);
loom_status loom_grad_sync_end_micro(loom_grad_sync *gs, int a, double loss_sum);
/* Canonical mode in parts (a pipeline rank's interleaved chunks: disjoint parameters, each
 * backwarded in micro-batch order, but chunks interleaved): part p is ranges of the
 * gradient buffer, added in part order, and each range is summed over the micro-batch
 * index in a tree of its own, the same tree a whole-buffer push builds. begin zeroes the
 * part's ranges; end pushes them (with_loss: also the micro-batch's loss, once per
 * micro-batch, in order). A step then uses only these for its micro-batches. */
loom_status loom_grad_sync_add_range(loom_grad_sync *gs, int part, size_t off, size_t n);
loom_status loom_grad_sync_begin_part(loom_grad_sync *gs, int a, int part);
loom_status loom_grad_sync_end_part(loom_grad_sync *gs, int a, int part, int with_loss,
                                    double loss_sum);
/* After the last micro-batch: the global gradient in the model's grad buffer on every
 * rank, and the global token-loss sum in *loss_sum. */
loom_status loom_grad_sync_finish(loom_grad_sync *gs, double *loss_sum);

/* Gradient compression (compress.h; fast mode only): c is the caller's, on = 1 makes this
 * step's micro-batches accumulate locally (no dp buckets, no ZeRO reducer) and finish
 * exchange the compressed sum instead; call before the step's first micro-batch. */
struct loom_compress;
void loom_grad_sync_set_compress(loom_grad_sync *gs, struct loom_compress *c, int on);

/* Hand the whole gradient buffer to the dp strategy at once, unless the backwards did it
 * range by range (below: then it checks every gradient was handed over); before
 * loom_grad_sync_finish. */
loom_status loom_grad_sync_all_ready(loom_grad_sync *gs);
/* The pipeline's overlap (fast mode with the dp strategy, not compressed, no ZeRO
 * reducer: can_overlap): on = 1 around each chunk's last backward (or W) of the step, so
 * the model hands each range it finishes there to the strategy, which starts its buckets'
 * all-reduces while the rest of the step's backwards run; on = 0 after. */
int loom_grad_sync_can_overlap(const loom_grad_sync *gs);
void loom_grad_sync_final_hook(loom_grad_sync *gs, int on);
/* When the step's first data-parallel reduction was under way (loom_now_ms), or < 0 if
 * none started before loom_grad_sync_finish (a strategy without `pending` says nothing). */
double loom_grad_sync_first_ms(const loom_grad_sync *gs);

/* The same binary-counter tree on its own, over vectors of n floats (expert parallelism's
 * per-source sums, session_ep.h): push in index order; finish writes the sum to out and
 * empties the tree for the next use. */
typedef struct loom_grad_tree loom_grad_tree;
loom_status loom_grad_tree_create(loom_backend *be, size_t n, loom_grad_tree **out);
loom_status loom_grad_tree_push(loom_grad_tree *t, const float *v);
void loom_grad_tree_finish(loom_grad_tree *t, float *out);
void loom_grad_tree_destroy(loom_grad_tree *t);

#endif
