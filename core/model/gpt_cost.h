/* gpt_cost.h — a model's compute by part, in FLOPs per token, for splitting it into
 * pipeline stages (pipeline_split.h) and for the planner's default split (core.pp_split).
 *
 * What: forward + backward FLOPs of one token through each block (its GEMMs, 2 per
 * multiply-add, and attention's QK^T and AV over `seq` positions, as the planner counts
 * them), through the embedding (the lookup and position add, and their gradients'
 * scatter-add) and through the LM head and loss (the logits GEMM over Vp rows; the
 * softmax and ln_f are per-element work, not counted). The backward of a GEMM is twice
 * its forward; a block recomputed in backward (recompute[l] = 1) does its forward again.
 * What not: a time model (that is scripts/loom/plan.lua, with a machine profile): these
 * are FLOPs, the same on every rank, so every rank derives the same split from them.
 */
#ifndef LOOM_GPT_COST_H
#define LOOM_GPT_COST_H

#include "gpt.h"

/* layer[0..layers): each block's FLOPs per token; *embed, *head: the embedding's and the
 * LM head + loss's. recompute: NULL, or one flag per block. */
void loom_gpt_layer_costs(const loom_gpt_config *cfg, int seq, const unsigned char *recompute,
                          double *layer, double *embed, double *head);

#endif
