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
 * What not: sequence parallelism (the residual stream between stages is whole); canonical
 * mode; a split backward (input and weight gradients are one pass).
 */
#ifndef LOOM_CORE_GPT_STAGE_H
#define LOOM_CORE_GPT_STAGE_H

#include "gpt.h"

/* Activation sets this model holds (loom_gpt_parallel.slots). */
int loom_gpt_stage_slots(const loom_gpt *m);
void loom_gpt_stage_select(loom_gpt *m, int slot);
/* (B*T, dim) device buffers of the selected slot: the chunk input, the output of block
 * hi-1, and the residual gradient (output gradient in, input gradient out). */
float *loom_gpt_stage_input(loom_gpt *m);
float *loom_gpt_stage_output(loom_gpt *m, int hi);
float *loom_gpt_stage_grad(loom_gpt *m);

loom_status loom_gpt_stage_forward(loom_gpt *m, int lo, int hi, const int *tokens,
                                   const int *targets, int B, int T, float dloss,
                                   double *loss_sum);
loom_status loom_gpt_stage_backward(loom_gpt *m, int lo, int hi);

/* 1 if `name` is a parameter of the whole model that this pipeline stage does not hold
 * (another stage's block, wpe or ln_f; wte on a middle stage): loaders that read a whole
 * model (checkpoints, llm.c files) skip it here and its own stage takes it. 0 for a name
 * this stage holds, for a name no stage has, and for a model that is not a stage. */
int loom_gpt_held_elsewhere(const loom_gpt *m, const char *name);

#endif
