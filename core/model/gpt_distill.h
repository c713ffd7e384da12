/* gpt_distill.h — knowledge distillation's loss term on the LM head (Hinton et al. 2015).
 *
 * Per token, with p = softmax(z / T) over the first V columns (the vocabulary padding
 * excluded) of the student's logits z_s and the teacher's z_t:
 *     kd = T^2 KL(p_t || p_s) = T^2 sum_j p_t,j (log p_t,j - log p_s,j)
 * (what PyTorch's kl_div(log_softmax(z_s/T), softmax(z_t/T), reduction="sum") * T^2
 * computes per row), d kd / d z_s = T (p_s - p_t). A training forward with a teacher set
 * (loom_gpt_set_distill) reports and backpropagates (1 - alpha) CE + alpha kd per token.
 * A pipeline's last stage distils through loom_gpt_set_distill_step. Hidden-state terms
 * through learned projections: loom_gpt_set_distill_hidden (below). Under tensor
 * parallelism the student's vocabulary-parallel rows are all-gathered and the term computed
 * on whole rows, as one rank would (the same bits where the logits are: canonical mode);
 * each rank keeps its columns of the gradient; the hidden-state terms run replicated on
 * every tp rank (h whole, or its rows gathered under sequence parallelism; the projection
 * replicated), the attention term on each rank's heads (gpt_distill_attn.c). What it does
 * not: the intermediate terms under pp for blocks off the last stage's last chunk.
 * Memory: on a host-memory backend (the CPU's) every buffer here is host memory. On a device
 * backend (CUDA) the logit term runs on the backend's kd_rows op and teacher_logits are the
 * backend's memory (the teacher's logits, or a cache's rows copied there); the intermediate
 * terms run on the host over copies of the student's buffers, their teacher rows host
 * memory, their gradients copied back; under tp the logit term's whole rows are gathered
 * and laid out there (gpt_distill_tp_device.c), the intermediate terms refused.
 */
#ifndef LOOM_CORE_GPT_DISTILL_H
#define LOOM_CORE_GPT_DISTILL_H

#include <stddef.h>

#include "gpt.h"

/* R rows: zs (stride s_stride) and zt (stride t_stride), V columns used. loss[r] = kd of
 * row r; grad (may be NULL; stride s_stride) = scale * d kd / d zs in columns < V and 0 in
 * [V, s_stride). Row sums in double, in column order: equal logits give exactly 0. */
void loom_kd_rows(const float *zs, size_t s_stride, const float *zt, size_t t_stride, size_t R,
                  int V, float T, float scale, double *loss, float *grad);

/* The next training forwards (targets and dloss != 0) of m distil from teacher_logits: R
 * rows of stride t_stride (the teacher's vocab_padded), host memory (a device backend's
 * memory on a device backend), valid until that forward returns; the loss becomes (1 - alpha) CE + alpha kd. teacher_logits NULL: off.
 * Whole rows also under tensor parallelism. Refused on a pipeline stage (use _step). */
loom_status loom_gpt_set_distill(loom_gpt *m, const float *teacher_logits, size_t t_stride,
                                 float T, float alpha);

/* A pipeline's last stage (gpt_stage.h), whose forwards run a step's micro-batches in the
 * schedule's order: a training forward whose targets are rows [r, r + R) of the step's
 * targets array (rows of them) distils from teacher rows [r, r + R) (stride t_stride, host
 * memory, valid until the step ends). teacher_rows NULL: off. */
loom_status loom_gpt_set_distill_step(loom_gpt *m, const int *targets, size_t rows,
                                      const float *teacher_rows, size_t t_stride, float T,
                                      float alpha);

/* The last forward's first R logit rows whole, into full (R, vocab_padded), the model's
 * memory (host, or a device backend's: blocks and full its allocations too): under tensor
 * parallelism all-gathered over the group (blocks: (R, vocab_padded) scratch) and laid out
 * in column order (on a device by rows_gather, gpt_distill_tp_device.c), a copy bit for bit
 * otherwise. A teacher split by tp gives its whole rows this way. */
loom_status loom_gpt_gather_logits(loom_gpt *m, size_t R, float *blocks, float *full);

/* The attention-probability term (gpt_distill_attn.c): for mapped blocks with equal head
 * counts, ps, pt (B,NH,T,T) the student's and teacher's probabilities; loss (B*T rows)
 * row (b,t) += gamma/NH sum_h sum_j (ps - pt)^2; dp (B,NH,T,T; may be NULL) =
 * scale * d row / d ps (for attention_backward_datt). */
void loom_kd_attention_rows(const float *ps, const float *pt, int B, int NH, int T, float gamma,
                            float scale, double *loss, float *dp);

/* The next training forwards of m add the term for each student block l with
 * teacher_att[l] != NULL (cfg.layers pointers): the teacher's probabilities (B,NH,T,T) of
 * that forward's B, T, host memory, valid until its backward returns (the backward reads
 * them again). The caller checks that the teacher's head count equals the student's.
 * teacher_att NULL: off. A pipeline stage: teacher_att[l] holds the step's micro-batches'
 * in turn, picked by targets as loom_gpt_set_distill_step's rows (which must be set).
 * Under tp: this rank's NHl heads of the student and of the teacher (split the same way),
 * each head's row sums gathered over tp and added in head order. Refused under pp off the
 * last chunk, llama, MoE and a backend without attention_backward_datt. */
loom_status loom_gpt_set_distill_attention(loom_gpt *m, const float *const *teacher_att,
                                           float gamma);

/* After loom_gpt_set_distill_attention: whole = 1, the teacher's probabilities hold all NH
 * heads (a replicated teacher under tp: each rank reads its own heads' slice, rank p's
 * from head p * NH/tp); 0 (the default): this rank's heads only (split the same way). */
loom_status loom_gpt_set_distill_attention_whole(loom_gpt *m, int whole);

/* Block l's attention probabilities of the last forward (B,NH,T,T; host memory on the CPU
 * backend), NULL if l is not held or is recomputed (not kept; a frozen model's, unless
 * loom_gpt_keep_block_attention was called for it): a teacher's. Under tp this
 * rank's heads only, (B,NHl,T,T). */
const float *loom_gpt_block_attention(const loom_gpt *m, int l);

/* Block l keeps its attention probabilities in att after each forward where the backend's
 * fused attention would keep its own state there (LOOM_CUDA_ATTENTION=flash): its att
 * (B,NH,T,T) and its calls on the batched path (backend.h attention_allow_fused), every
 * other block still fused. A teacher's mapped blocks (session.c), a student's
 * (loom_gpt_set_distill_attention). A frozen model's block (gpt.h) also gets an att of its
 * own, kept past the forward, on every backend. Elsewhere a flag only; where it changes the layout the
 * activations are laid out again, so call it before taking pointers into them. */
loom_status loom_gpt_keep_block_attention(loom_gpt *m, int l);
/* Bytes the distillation terms allocated in this model (the logit term's gradient rows and
 * loss, the hidden and attention terms' rows, scratch and copies; not their pointer arrays):
 * loom_session_memory's distill. */
size_t loom_gpt_distill_bytes(const loom_gpt *m);

/* Block l's probabilities of the last forward (B, T as it ran) with all heads, into whole
 * (B,NH,T,T), host memory: under tensor parallelism every rank's heads all-gathered
 * (blocks: (B,NH,T,T) scratch) and laid out in head order, a copy otherwise. A teacher
 * split by tp across dp ranks gives its probabilities this way (kd_group.h). */
loom_status loom_gpt_gather_block_attention(loom_gpt *m, int l, int B, int T, float *blocks,
                                            float *whole);

/* Hidden-state terms (gpt_distill_hidden.c): per student block l with a projection
 * (loom_gpt_config.kd_proj_layers), the loss row r adds beta/Ct |W_l h_s,r - h_t,r|^2 (an
 * MSE over the Ct = kd_proj_dim teacher columns; its mean over rows is beta MSE), h the
 * block's output (its residual stream). loom_kd_hidden_rows: R rows of hs (R,C) and ht
 * (R,Ct), w (Ct,C); loss[r] += the term; y (R,Ct) scratch, left holding scale * d/dy;
 * dh (R,C; may be NULL) = scale * d/dhs; dw (Ct,C; may be NULL) += scale * d/dw. */
void loom_kd_hidden_rows(const float *hs, const float *ht, const float *w, size_t R, int C,
                         int Ct, float beta, float scale, double *loss, float *y, float *dh,
                         float *dw);

/* The next training forwards of m add the terms against teacher_h[l] (cfg.layers pointers;
 * NULL: block l unmapped), R rows of kd_proj_dim each, host memory, valid until that
 * forward returns (a pipeline stage: the step's rows, picked by the forward's targets as
 * loom_gpt_set_distill_step's, which must be set). teacher_h NULL: off. Under sequence
 * parallelism this rank's rows of h are all-gathered for the term (the teacher's rows are
 * whole). Refused under pp for a block off the last stage's last chunk. */
loom_status loom_gpt_set_distill_hidden(loom_gpt *m, const float *const *teacher_h, float beta);

/* Block l's output rows of the last forward (host memory on the CPU backend), NULL if l is
 * not held or holds some rows only (sequence parallelism) or, in a frozen model, is not
 * among loom_gpt_parallel.keep_outputs: a teacher's hidden states. */
const float *loom_gpt_block_output(const loom_gpt *m, int l);

#endif
