/* gpt_stage.h — the GPT model cut into pipeline stages (Huang et al. 2019, GPipe;
 * Narayanan et al. 2021 for virtual stages).
 *
 * A model created with loom_gpt_parallel.stage_layers holds only those blocks' parameters
 * (plus wte and wpe with block 0, ln_f and the tied wte with the last block), and
 * `slots` activation sets. A chunk is a contiguous run of held blocks [lo, hi): its
 * forward reads the token embedding (lo == 0) or the activations placed in
 * loom_gpt_stage_input(); its output is loom_gpt_stage_output() unless hi == layers, where
 * the head computes the loss (and its gradient). Its backward reads the output gradient
 * from loom_gpt_stage_grad() (unless hi == layers) and leaves the input gradient there
 * (unless lo == 0, where the embedding's gradients are accumulated instead).
 * Every call acts on the slot chosen last by loom_gpt_stage_select. Parameter gradients
 * accumulate (+=); no gradient-ready hook is called (the engine syncs after the step).
 * The backward also comes split in two (gpt_backward_split.c, for zero-bubble schedules):
 * loom_gpt_stage_backward_input (B) computes the input gradient, which it leaves in
 * loom_gpt_stage_grad_out(), keeping in the slot what the weight gradients need, and
 * loom_gpt_stage_backward_weight (W), later, adds the weight gradients: B then W gives the
 * fused backward's bits. It needs a model created with loom_gpt_parallel.split_backward.
 * Under sequence parallelism (tp_sequence_parallel) each tp rank holds its shard of the
 * residual stream's rows, in and out of a chunk, as in the whole model (gpt.c); the split
 * backward does not run under it (refused at create).
 */
#ifndef LOOM_CORE_GPT_STAGE_H
#define LOOM_CORE_GPT_STAGE_H

#include "gpt.h"

/* Select one of the activation sets this model holds (loom_gpt_parallel.slots). */
void loom_gpt_stage_select(loom_gpt *m, int slot);
/* (B*T, dim) device buffers of the selected slot: the chunk input, the output of block
 * hi-1, and the residual gradient (output gradient in, input gradient out). */
float *loom_gpt_stage_input(loom_gpt *m);
float *loom_gpt_stage_output(loom_gpt *m, int hi);
float *loom_gpt_stage_grad(loom_gpt *m);

/* The data-parallel overlap under pp: with the gradient-ready hook set (gpt.h
 * loom_gpt_set_grad_hook; the engine's caller sets it only around a chunk's last backward
 * or W of a step), loom_gpt_stage_backward and loom_gpt_stage_backward_weight report each
 * range of the chunk's parameters as it becomes final: the head's, each block's top down,
 * then wte and wpe. 0 where a stage cannot (a mixture of experts' blocks: experts are
 * reduced over their own group); then nothing is reported. */
int loom_gpt_stage_reports_ready(const loom_gpt *m);

/* Rows of a B x T micro-batch's residual stream this rank holds: B*T, or B*T/tp under
 * sequence parallelism (its tp rank's run of rows). The chunk input, output and residual
 * gradient above are that many rows of dim; the engine sends them as they are, each tp
 * rank to the same tp rank of the next stage. */
size_t loom_gpt_stage_rows(const loom_gpt *m, int B, int T);

loom_status loom_gpt_stage_forward(loom_gpt *m, int lo, int hi, const int *tokens,
                                   const int *targets, int B, int T, float dloss,
                                   double *loss_sum);
loom_status loom_gpt_stage_backward(loom_gpt *m, int lo, int hi);

/* ZeRO-3 (gpt.h's parameter hook): a stage's forward and backward each need the units
 * they read (its blocks; the embeddings at lo == 0; ln_f and the tied wte at the head) and
 * say done after, since other micro-batches run between a micro-batch's forward and its
 * backward; inside a chunk the next unit is hinted (LOOM_PARAM_SOON) as each starts. The
 * weight half of a split backward (W) reads no parameter. loom_gpt_stage_prefetch hints
 * the first units of the chunk's next forward (backward = 0) or backward (1, B or fused):
 * the pipeline engine calls it for its next compute instruction. 1 from loom_gpt_is_stage:
 * this model is a pipeline stage (some block is held elsewhere). */
loom_status loom_gpt_stage_prefetch(loom_gpt *m, int lo, int hi, int backward);
int loom_gpt_is_stage(const loom_gpt *m);
/* Incremental decoding of one chunk (gpt_decode.c): row t of blocks [lo, hi), reading
 * the earlier rows' keys and values from the selected slot, which a forward with B = 1
 * over rows 0..t-1 left there (or earlier decodes). lo == 0: token is embedded; else row t
 * of loom_gpt_stage_input() is the input; the output is row t of
 * loom_gpt_stage_output(m, hi), or the logits row when hi == layers. The rank's chunks go
 * in order, and its last one marks row t cached. The same bits as the forward's row t
 * under the backend's row-stable mode (gpt.h, loom_gpt_decode). */
loom_status loom_gpt_stage_decode(loom_gpt *m, int lo, int hi, int token, int t);

/* 1 if `name` is a parameter of the whole model that this pipeline stage does not hold
 * (another stage's block, wpe or ln_f; wte on a middle stage): loaders that read a whole
 * model (checkpoints, llm.c files) skip it here and its own stage takes it. 0 for a name
 * this stage holds, for a name no stage has, and for a model that is not a stage. */
int loom_gpt_held_elsewhere(const loom_gpt *m, const char *name);
/* The split backward of the selected slot's chunk (see above). B reads the output gradient
 * from loom_gpt_stage_grad() and writes the input gradient to loom_gpt_stage_grad_out()
 * (read by W on the first stage, for the embedding). In fast mode B accumulates the layer
 * norms' gradients; in canonical mode it writes no parameter gradient (W adds them), except
 * that with head_dw != NULL on the last stage the LM head's wte gradient of this
 * micro-batch is written there (zeroed first), and W must then be told head_done = 1. */
float *loom_gpt_stage_grad_out(loom_gpt *m);
loom_status loom_gpt_stage_backward_input(loom_gpt *m, int lo, int hi, float *head_dw);
loom_status loom_gpt_stage_backward_weight(loom_gpt *m, int lo, int hi, int head_done);

#endif
