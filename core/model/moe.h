/* moe.h — the mixture-of-experts MLP of a GPT block (gpt.h's loom_moe_config): a linear
 * router (h.L.moe.router.weight, E x C, no bias) and E GPT-2 MLPs
 * (h.L.moe.expert.E.{fc,proj}.{weight,bias}), in place of the block's mlp.* entries; in
 * the llama family E SwiGLU MLPs (h.L.moe.expert.E.{gate,up,proj}.weight, gate and up
 * back to back: one 2F x C product; silu(gate) * up; no biases), Mixtral's layout.
 *
 * Forward over R token rows x (the ln_2 output): router logits on the device, the routing
 * decisions on the host (moe_route.h: softmax, top-k, gates, capacity, drops), the kept
 * (token, expert) pairs gathered expert-major, then per expert one GEMM over the rows it
 * received (fc, GELU, proj: a grouped GEMM, never one per token), and the outputs scaled by
 * their gates and added back to their tokens' rows in assignment order. Backward runs the
 * same steps reversed; the router's gradient adds the aux and z losses' (weighted by
 * dloss * R, so that over a step's micro-batches the objective is
 * CE mean + sum over MoE blocks of the token-weighted mean aux and z losses).
 * Not a public interface: gpt.c calls it at the block's MLP.
 */
#ifndef LOOM_CORE_MOE_H
#define LOOM_CORE_MOE_H

#include "gpt_internal.h"

/* The recipe's MoE keys against the model; the message names the key and what works. */
loom_status gpt_moe_check(const loom_gpt_config *c);
/* 1 if block l is an MoE block of config c. */
int gpt_moe_block(const loom_gpt_config *c, int l);
/* MoE block l's router entry (table index): after ln_1 .. ln_2 (8 GPT-2 entries, 6 llama),
 * its experts' entries after it. */
int gpt_moe_router(const loom_gpt *m, int l);
/* Append block l's router and experts to the table (instead of its mlp.* entries); under
 * expert parallelism only this ep rank's E/ep experts (named by their global index);
 * under tensor parallelism each expert split as the dense MLP is (fc by output features,
 * proj by input features; the router and proj.bias replicated). */
loom_status gpt_moe_add_entries(loom_gpt *m, int l, float std, float proj_std);
/* After the table and the parameters exist: the MoE state and buffers (m->moe); refuses
 * what does not compose yet (a backend without rows_gather; ep not dividing the experts). */
loom_status gpt_moe_create(loom_gpt *m, uint64_t seed);
void gpt_moe_destroy(loom_gpt *m);
size_t gpt_moe_bytes(const loom_gpt *m);
/* What gpt_moe_create would allocate for the set-up model m: device bytes (returned, what
 * gpt_moe_bytes then reports) and host bytes (*host: the routing's own arrays). */
size_t gpt_moe_size(const loom_gpt *m, size_t *host);
/* Parameters of the experts other ep ranks hold (0 without expert parallelism). */
size_t gpt_moe_params_elsewhere(const loom_gpt *m);
/* 1 if name is an expert parameter another ep rank holds (a checkpoint's tensor this rank
 * skips when loading), 0 otherwise. */
int gpt_moe_held_elsewhere(const loom_gpt *m, const char *name);
/* Activation recomputation (gpt.h): a fully recomputed MoE block's forward runs again
 * before its backward for what the scratch set held (ln_1 .. ln_2); the routing, the
 * experts' inputs and activations are per block and kept, so between gpt_moe_rerun(m, 1)
 * and (m, 0) the block skips its MoE forward: the choices are the saved ones, not made
 * again (no second exchange, no stats counted twice). */
void gpt_moe_rerun(loom_gpt *m, int on);
/* A pipeline stage's activation set `slot` (gpt_bind_slot): each micro-batch in flight
 * has its own routing and expert buffers, bound with the rest of its activations. */
void gpt_moe_bind_slot(loom_gpt *m, int slot);
int gpt_moe_rerunning(const loom_gpt *m);
/* Called at the start of each forward: dloss (0: no backward follows, no noise, no stats). */
void gpt_moe_begin(loom_gpt *m, float dloss);
/* out (R,C) = MoE(x) over all R rows (x: ln_2's output, gathered under sequence
 * parallelism); under tp in fast mode out is this rank's partial (in canonical mode whole),
 * which the caller passes to gpt_moe_leave. Block l's entries start at table index e0. */
loom_status gpt_moe_forward(loom_gpt *m, int l, int e0, const float *x, float *out, size_t R);
/* dx (R,C) overwritten from dout (R,C) = d(out), all rows; under tp in fast mode dx is this
 * rank's partial (canonical: whole), for gpt_moe_leave; parameter gradients accumulate. The router
 * reads ln_2's gathered output again (the caller regathers it under sp). */
loom_status gpt_moe_backward(loom_gpt *m, int l, int e0, const float *dout, float *dx, size_t R);

/* The split backward (zero-bubble schedules, gpt_backward_split.c): B, the input gradient
 * as gpt_moe_backward computes it, with every linear's input product through the GEMM
 * matmul_backward makes and no weight gradient, keeping in the bound slot what W reads
 * (the experts' output and fc-output gradients, the router logits' gradient); W, the
 * router's and experts' weight and bias gradients from those, in the fused order. So B
 * then W gives the fused backward's bits. */
loom_status gpt_moe_backward_input(loom_gpt *m, int l, int e0, const float *dout, float *dx,
                                   size_t R);
loom_status gpt_moe_backward_weight(loom_gpt *m, int l, int e0, size_t R);
/* The MLP region's leave after MoE block l's forward (backward = 0: in = gpt_moe_forward's
 * out, out = m->summed) or backward (1: gpt_moe_backward's dx into m->dsummed): in fast
 * mode in is this tp rank's partial, summed over the group (F_LEAVE / B_ENTER); in
 * canonical mode it is whole on every rank (moe.c finishes the experts' sums over the
 * group in the fixed tree before the gates and the scatter), so out is in, or under
 * sequence parallelism this rank's rows of it, with no exchange. */
loom_status gpt_moe_leave(loom_gpt *m, int l, int backward, float *in, float *out, size_t R);
/* A split B's MLP branch of MoE block l (both families): the input gradient from dy into
 * m->dsummed, summed over tp. */
loom_status gpt_moe_split_input(loom_gpt *m, int l, const float *dy, size_t R);

#endif
