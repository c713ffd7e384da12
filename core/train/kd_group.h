/* kd_group.h — a distillation teacher split by tensor parallelism across the student's dp
 * ranks (teacher.tp = n with mesh.tp = 1, docs/DISTILL.md).
 *
 * The dp group is split into groups of n consecutive dp ranks; the teacher is built with
 * its own instance of the tp strategy over this rank's group (loom_kd_group_strategy). The group's ranks hold different micro-batches,
 * so a tp teacher cannot follow the student's loop: before a step's student work, every
 * rank reads the step's accum x dp micro-batches (every rank reads every one anyway), the
 * group runs the teacher forward on each of its members' micro-batches in dp-rank, then
 * accumulation order, gathers the rows whole (loom_gpt_gather_logits) and each rank keeps
 * its own (with teacher.layers also the mapped blocks' outputs and all heads'
 * probabilities: loom_kd_group_keep_terms). The student loop then takes its micro-batches
 * from here instead of the stream. Under pp the teacher is on the last stage only, so the
 * group is split from that stage's dp group, and the pipelined step takes this rank's
 * micro-batches and rows from here (session.c, distill_pipeline); with teacher.pp every
 * stage has a group over its dp ranks and each forward is that stage's part of the
 * teacher's pipeline (the members of every stage's group run the same micro-batch in the
 * same order, so each dp rank's pipeline carries one micro-batch at a time), the rows kept
 * on the last stage only. Under ep the dp ranks are the same processes and the (dense)
 * teacher runs before the experts' exchanges.
 * Invariant: nothing else is in flight on the group's communicator (it is the teacher's).
 * Memory: the rows are the model's memory, as gpt_distill.h needs: the host's on the CPU
 * backend, a device backend's (be) there, the group then split from the device dp group and
 * its tp strategy bound to the backend; the kept block outputs and probabilities
 * (teacher.layers) are host memory, and refused on a device (session.c).
 */
#ifndef LOOM_CORE_KD_GROUP_H
#define LOOM_CORE_KD_GROUP_H

#include <stddef.h>

#include "loom/plugin.h"
#include "loom/plugin/strategy.h"
#include "model/gpt.h"
#include "session.h"

typedef struct loom_kd_group loom_kd_group;

/* Collective over the dp group: n must divide its size (refused otherwise, naming both).
 * B*T rows a micro-batch, accum micro-batches a step per rank, vp the teacher's
 * vocab_padded (its row stride), or 0 on a pipeline stage without the teacher's head
 * (teacher.pp: no rows kept there); canonical: the strategy's canonical sums. */
loom_status loom_kd_group_open(int n, int B, int T, int accum, size_t vp, int canonical,
                               const struct loom_backend *be, loom_kd_group **out);
/* After the teacher built on its strategy is destroyed. */
void loom_kd_group_close(loom_kd_group *g);
/* Bytes it allocated: the step's tokens and targets, this rank's rows and the gather's
 * scratch (each + 1), and keep_terms' outputs and probabilities (loom_session_memory). */
size_t loom_kd_group_bytes(const loom_kd_group *g);

/* The teacher's tp strategy (for loom_gpt_parallel's tp_ops, tp_self). */
const loom_strategy_ops *loom_kd_group_strategy(loom_kd_group *g, void **self);

/* teacher.layers (and teacher.attention with heads > 0, the teacher's head count): after
 * each teacher forward the group keeps, for each student block l of L with map[l] >= 0,
 * the owner's copy of teacher block map[l]'s output (B*T x ct, whole on every member) and
 * of its probabilities, every member's heads gathered ((B,NH,T,T): one more gather of
 * B*T*NH*T/n floats per mapped block per teacher micro-batch). Before the first step. */
loom_status loom_kd_group_keep_terms(loom_kd_group *g, int L, const int *map, size_t ct,
                                     int heads);

/* One step's reads and teacher forwards (above): forward(fctx, tokens, B, T) runs the
 * teacher on a micro-batch (NULL: loom_gpt_forward; teacher.pp: this stage's part of its
 * pipeline); with vp = 0 its rows are neither gathered nor kept. */
typedef loom_status (*loom_kd_forward_fn)(void *fctx, const int *tokens, int B, int T);
loom_status loom_kd_group_step(loom_kd_group *g, loom_gpt *teacher, loom_kd_forward_fn forward,
                               void *fctx, loom_batch_fn next, void *ctx);

/* Micro-batch i of the step (0 .. accum x dp - 1, the stream's order): its tokens and
 * targets (B*T each); this rank's accumulation micro-batch a's teacher rows (B*T x vp). */
const int *loom_kd_group_tokens(const loom_kd_group *g, int i);
const int *loom_kd_group_targets(const loom_kd_group *g, int i);
const float *loom_kd_group_rows(const loom_kd_group *g, int a);
/* This rank's micro-batch a's teacher block output / probabilities for student block l
 * (loom_kd_group_keep_terms), NULL if l is unmapped or the attention term is off. */
const float *loom_kd_group_block_output(const loom_kd_group *g, int l, int a);
const float *loom_kd_group_block_attention(const loom_kd_group *g, int l, int a);

#endif
