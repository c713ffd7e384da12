/* gpt.h — the GPT-2 model: parameters, activations, forward and backward.
 *
 * Pre-LN transformer blocks, tanh-GELU MLP, fused QKV, tied LM head (Radford et al. 2019;
 * the layout of llm.c's train_gpt2.c). The vocabulary is padded to vocab_padded for GEMM
 * speed; logits are computed for every padded column but softmax and the loss see only
 * the first `vocab` (padding rows of wte start at zero and never get a loss gradient).
 * Parameters live in one flat buffer described by a loom_param_table; gradients in a
 * second buffer with the same layout. All compute goes through the backend's ops table.
 */
#ifndef LOOM_CORE_GPT_H
#define LOOM_CORE_GPT_H

#include "base/backend.h"
#include "loom/plugin/cuda_attention.h"
#include "loom/plugin/strategy.h"
#include "params.h"

/* A mixture-of-experts MLP (moe.h): experts = 0 for none (the dense GPT-2). */
typedef struct loom_moe_config {
    int experts;             /* E: GPT-2 MLPs (llama: SwiGLU) behind a linear router */
    int top_k;               /* k <= E experts per token */
    int every;               /* blocks l with (l + 1) % every == 0 are MoE blocks */
    double capacity_factor;  /* c: each expert takes ceil(k * tokens / E * c); 0: dropless */
    double aux_loss;         /* alpha of the Switch load-balancing loss */
    double z_loss;           /* beta of the router z-loss */
    int noisy;               /* router "noisy_topk": N(0, noise_std) on the router logits */
    double noise_std;        /* (training forwards only; 0: 1.0) */
    /* How the run executes, not the model (checkpoints do not record them): */
    int overlap;             /* ep: exchange each half of the local experts' rows while the
                              * other half computes (moe_overlap in moe.c); 0: one blocking
                              * exchange each way */
    int zero_prefetch;       /* ZeRO-3 under ep: gather the pass's next unit ahead */
} loom_moe_config;

typedef struct loom_gpt_config {
    int vocab;         /* true vocabulary size V */
    int vocab_padded;  /* Vp >= V; 0 means "round V up to a multiple of 128" */
    int ctx;           /* maximum sequence length (wpe rows) */
    int layers, heads, dim;
    loom_moe_config moe;
    /* The block family (zero: GPT-2, and the fields below unused). LOOM_FAMILY_LLAMA
     * (gpt_llama.c): pre-norm RMSNorm, SwiGLU MLP of ffn_dim, rotary positions (no wpe),
     * grouped-query attention with kv_heads, no biases, LM head untied unless
     * tie_embeddings (Touvron et al. 2023; Hugging Face's LlamaForCausalLM). */
    int family;
    int kv_heads;        /* dividing heads; 0 = heads */
    int ffn_dim;         /* SwiGLU hidden width; 0 = 4 * dim */
    int tie_embeddings;  /* 1: the LM head is wte */
    float rope_theta;    /* 0 = 10000 */
    float norm_eps;      /* RMSNorm's epsilon; 0 = 1e-5 */
    /* Distillation's hidden-state terms (gpt_distill.h): kd_proj_dim > 0 adds, for each
     * block l with bit l of kd_proj_layers, a learned (kd_proj_dim, dim) projection
     * "distill.proj.<l>.weight" after ln_f (a student parameter; no model weight). */
    int kd_proj_dim;
    unsigned long long kd_proj_layers;
} loom_gpt_config;

enum { LOOM_FAMILY_GPT2 = 0, LOOM_FAMILY_LLAMA = 1 };

typedef struct loom_gpt loom_gpt;

/* Check a config; the message names the field and what would be valid. */
loom_status loom_gpt_config_check(const loom_gpt_config *cfg);

/* How the model is split and summed (NULL: one rank, fast mode).
 * tp: a tensor-parallel strategy (DESIGN.md; plugins/strategy/tp): it partitions the
 * parameters the model marks splittable and moves activations at the region boundaries.
 * With it each rank holds heads/tp attention heads, 4*dim/tp MLP columns and Vp/tp
 * vocabulary rows (Megatron-LM's layout, Shoeybi et al. 2019), and with sequence
 * parallelism B*T/tp token rows of the residual stream.
 * canonical: every sum a tensor split could reassociate (row-parallel outputs, column-
 * parallel input gradients, the softmax denominator, replicated parameters' gradients over
 * token rows) is done over LOOM_CANONICAL_CHUNKS fixed chunks added in a fixed binary tree,
 * so tp = 1, 2, 4, 8 give the same bits. It needs dim, Vp and B*T divisible by the chunk
 * count and the backend's deterministic GEMM. */
typedef struct loom_gpt_parallel {
    const loom_strategy_ops *tp_ops;  /* NULL: no tensor parallelism */
    void *tp_self;
    int canonical;
    /* Pipeline parallelism (gpt_stage.h): stage_layers[l] = 1 for the blocks this rank
     * holds (NULL: all); the embedding comes with block 0, ln_f and the tied LM head with
     * the last block. slots: activation sets kept at once (micro-batches in flight; 0 = 1). */
    const unsigned char *stage_layers;
    int slots;
    /* 1: also keep what a split backward (gpt_stage.h: B, then W) needs between its two
     * passes: per block d(fch), the layer norms' canonical parts, the chunk input's
     * gradient (about R x (4C/tp) floats per block per slot more). */
    int split_backward;
    /* Activation recomputation (memory traded for compute; docs/RECIPES.md, gpt.c's
     * lay_out_shared and gpt_block_backward):
     * FULL keeps only each block's output (the next block's input) and reruns the block's
     * forward just before its backward, into one scratch set of block activations every
     * block shares; SELECTIVE keeps the GEMM outputs but not the attention probabilities
     * (B x heads x T x T) nor the GELU output, recomputed in backward (Korthikanti et al.
     * 2022); LAYERS: the blocks with recompute_layers[l] = 1 as FULL, the rest kept. The
     * recomputation makes the same kernel calls on the same operands: the same bits. With
     * split_backward only SELECTIVE (W reruns the GELU; FULL and LAYERS are refused). */
    int recompute;                          /* LOOM_RECOMPUTE_*; 0 = none */
    const unsigned char *recompute_layers;  /* [layers], with LOOM_RECOMPUTE_LAYERS */
    /* Expert parallelism (moe.h): each MoE block's experts split over the ep ranks of
     * ep_comm (experts ep_rank*E/ep ..), tokens dispatched to them and back by
     * all-to-all-v. ep <= 1: every expert on this rank. */
    int ep, ep_rank;
    const struct loom_comm_ops *ep_ops;
    void *ep_comm;
    /* The same ep group for the backend's memory (a device backend: loom_host.device_group's
     * dp group split alike), which carries the token rows; ep_comm then carries only the
     * host counts. NULL: ep_comm carries both (host memory). */
    const struct loom_comm_ops *ep_dops;
    void *ep_dcomm;
    /* ZeRO-3 on a host-memory backend (ignored on a device): undrawn = 1, the parameters
     * are not drawn (each rank draws its own partition: loom_params_init_range,
     * partitioned construction) and their buffer is mapped untouched (anonymous zero
     * pages, none resident until written); lazy_grads = 1, the gradient buffer mapped
     * untouched too (stage 3 releases its pages as they are reduced, so backward faults
     * them in each step anyway). */
    int undrawn, lazy_grads;
    /* A frozen model (distillation's teacher: docs/DISTILL.md), forward only: no gradient
     * buffer (loom_gpt_grad_data is NULL; the backward passes are refused), and only what a
     * forward reads: every block's activations in the one scratch set full recomputation
     * uses (recompute is ignored), the blocks' outputs alternating between two buffers
     * (each block reads the one the block below wrote), no backward scratch. Kept past the
     * forward: the logits, the outputs of the blocks with keep_outputs[l] = 1 (NULL: none;
     * loom_gpt_block_output of another block is NULL) and the probabilities of the blocks
     * loom_gpt_keep_block_attention was called for, each in a buffer of its own. The same
     * kernel calls on the same operands as a trainable model's forward: the same bits. */
    int frozen;
    const unsigned char *keep_outputs;
    /* The longest sequence a forward will be given (0: cfg->ctx): activations are sized for
     * max_B x max_T token rows, and a longer forward is refused. A distillation teacher only
     * ever sees the run's batch.seq (session.c make_teacher), so it is built at that; the
     * position table (wpe, rope) stays ctx long, so the weights and every result are the
     * same. A model that samples (windows up to ctx) keeps 0. */
    int max_T;
} loom_gpt_parallel;


enum { LOOM_RECOMPUTE_NONE, LOOM_RECOMPUTE_FULL, LOOM_RECOMPUTE_SELECTIVE, LOOM_RECOMPUTE_LAYERS };

/* Build the table (partitioned by par->tp_ops) and allocate params + grads on the backend,
 * initialised from seed (values keyed by logical index: the same model for any split;
 * not with par->undrawn).
 * Activations are sized for micro-batches up to max_B x cfg->ctx (par->max_T: shorter). */
loom_status loom_gpt_create(const loom_gpt_config *cfg, loom_backend *be, int max_B, uint64_t seed,
                            const loom_gpt_parallel *par, loom_gpt **out);
void loom_gpt_destroy(loom_gpt *m);

const loom_gpt_config *loom_gpt_get_config(const loom_gpt *m);
/* The longest sequence a forward may be given: loom_gpt_parallel.max_T, else ctx. */
int loom_gpt_max_seq(const loom_gpt *m);
const loom_param_table *loom_gpt_params(const loom_gpt *m);
/* Flat device buffers (table->total floats each). */
float *loom_gpt_param_data(loom_gpt *m);
/* The backend the model's buffers live on (their memory may be a device's). */
loom_backend *loom_gpt_backend(loom_gpt *m);
/* The gradient buffer: NULL for a frozen model (loom_gpt_parallel.frozen). */
float *loom_gpt_grad_data(loom_gpt *m);

/* Forward over tokens (B,T) on the host. With targets, *loss_sum gets the sum of the
 * per-token losses (double). If dloss != 0 the logits are replaced by their gradient,
 * dloss * dL/dlogits, ready for loom_gpt_backward. targets may be NULL (sampling). */
loom_status loom_gpt_forward(loom_gpt *m, const int *tokens, const int *targets, int B, int T,
                             float dloss, double *loss_sum);
/* Accumulate parameter gradients of the last forward (which must have had dloss != 0). */
loom_status loom_gpt_backward(loom_gpt *m);
/* Called during backward each time a contiguous range of the gradient buffer is final
 * for this backward pass (elements [offset, offset+n)), in backward order: ln_f, then
 * blocks L-1..0, then wte and wpe. Data parallelism starts reducing a bucket here while
 * the rest of backward runs. NULL fn removes the hook. */
typedef loom_status (*loom_grad_ready_fn)(void *ctx, size_t offset, size_t n);
void loom_gpt_set_grad_hook(loom_gpt *m, loom_grad_ready_fn fn, void *ctx);
/* ZeRO-3 (zero.h): called with needed = 1 before a unit's parameters are read and with 0
 * when the pass is done with them. Units: 0 = the embeddings (wte, wpe; the tied LM head
 * reads wte), 1 + l = block l, layers + 1 = ln_f. Forward: 0, 1..L, L+1 needed; blocks
 * done after each; with dloss == 0 units L+1 and 0 done at the end, else they stay for
 * backward, which marks L+1 and 0 done after the head, then each block needed and done,
 * top down. Decoding calls no hook (the caller keeps every unit in place). */
typedef loom_status (*loom_param_use_fn)(void *ctx, int unit, int needed);
/* needed = LOOM_PARAM_SOON: a hint that the unit is needed next (start its gather, do not
 * wait); a pipeline stage (gpt_stage.h) gives it, since its passes interleave. */
#define LOOM_PARAM_SOON 2
void loom_gpt_set_param_hook(loom_gpt *m, loom_param_use_fn fn, void *ctx);
/* ZeRO-2/3 on a sparse device buffer (zero_sparse.c): called before loom_gpt_backward first
 * writes a unit's gradients (units as for the param hook): L+1 and 0 at its start (the
 * head writes ln_f's and the tied wte's), then each block before its backward, top down.
 * Pipeline stages' passes (gpt_stage.c) do not call it; no sparse buffer is made there. */
typedef loom_status (*loom_grad_write_fn)(void *ctx, int unit);
void loom_gpt_set_grad_write_hook(loom_gpt *m, loom_grad_write_fn fn, void *ctx);
/* Replace the parameter (which = 0) or gradient (1) buffer by `sparse`, a range from the
 * backend's vm_reserve of table->total floats or more: the model's views rebound to it,
 * the old allocation freed (its values are the caller's to have copied first), and
 * vm_release frees it with the model. */
void loom_gpt_use_sparse_buffer(loom_gpt *m, int which, float *sparse);
/* A unit's first and last parameter-table entries; first > last when this model holds
 * none of it (a pipeline stage: another stage's block, or no embedding/ln_f here). On a
 * stage, unit 0 is the leading wte/wpe it holds (the last stage: the tied head's wte) and
 * layers + 1 its trailing ln_f (and lm_head). */
void loom_gpt_unit_entries(const loom_gpt *m, int unit, int *first, int *last);

/* The (B,T,Vp) logits of the last forward with dloss == 0 (device memory); with tensor
 * parallelism this rank's (B,T,Vp/tp) vocabulary columns. */
const float *loom_gpt_logits(const loom_gpt *m);
/* Row `row` (b*T + t) of the last forward's logits, all Vp columns, into host memory
 * (gathered over the tensor-parallel group: every rank calls it). */
loom_status loom_gpt_logits_row(loom_gpt *m, size_t row, float *host_out);
/* Incremental decoding (gpt_decode.c). A forward with B = 1 keeps its T rows' activations
 * (each layer's q, k, v among them: the key/value cache); loom_gpt_decode appends one
 * token at position t = the rows kept so far and computes only its row, attention reading
 * the cached keys and values. Row t of the logits is then bitwise what a full forward over
 * the t+1 tokens gives it, provided the backend's products are row-independent (the caller
 * sets the backend's set_deterministic to 2, row-stable, or 1, canonical) —
 * tests/unit/test_kv_cache.c checks it.
 * Every tensor-parallel rank calls it (its own heads are cached; the same exchanges run,
 * over one row). Refused (LOOM_ERR_UNSUPPORTED) under sequence parallelism, and when the
 * backend has no attention_decode; LOOM_ERR_INVALID when t is not the cached length or
 * reaches ctx. loom_gpt_can_decode says whether the first two hold. */
int loom_gpt_can_decode(const loom_gpt *m);
/* Rows the next loom_gpt_decode continues from (0: no cache). */
int loom_gpt_cached_rows(const loom_gpt *m);
loom_status loom_gpt_decode(loom_gpt *m, int token, int t);
/* Bytes of the activation and backward scratch buffers (sized for max_B x max_T: ctx
 * unless loom_gpt_parallel.max_T). */
size_t loom_gpt_activation_bytes(const loom_gpt *m);
/* What loom_gpt_create would allocate for (cfg, max_B, par) on one rank of a tp group of
 * `tp` (par->tp_ops must be NULL: the slices are the tp plugin's), computed by the same
 * table and layout code without allocating the buffers (loom plan: docs/PLAN.md). */
typedef struct loom_gpt_footprint_bytes {
    size_t param_floats; /* this rank's parameter table (params and grads: 4 bytes each) */
    size_t activations;  /* = loom_gpt_activation_bytes of that model */
    size_t slot, shared; /* one activation set; the recomputation scratch set */
    size_t host;         /* the host loss and logits-row buffers */
    size_t num_params;   /* = loom_gpt_num_params of that model (the whole model's count,
                          * what MFU counts as N; right for ep = 1: under ep the experts
                          * held elsewhere are counted by the created model only) */
    size_t entries;      /* tensors in this rank's table (an optimizer's segments) */
    size_t compute_params; /* 16-bit weights: = loom_gpt_compute_param_bytes (else 0) */
    size_t widen;          /* 16-bit weights: = loom_gpt_widen_bytes (else 0) */
    size_t att_floats;     /* one block's att (gpt_att.c: by the attention's path) */
    int att_fused;         /* att holds the fused kernels' state, not probabilities */
} loom_gpt_footprint_bytes;
/* param_dt, act_dt: as loom_gpt_set_precision's (f32, bf16 or f16); the activations are
 * then laid out as that call lays them out (16-bit saved copies). cuda_att: the model on
 * the CUDA backend with this attention mode (flash: LOOM_CUDA_ATTENTION=flash, tc: the
 * tensor-core kernels allowed; deterministic is taken from par->canonical, the mode
 * training sets), att and the backward's scratch sized by that backend's rule
 * (loom/plugin/cuda_attention.h, which its attention_sizes op computes) and its 16-bit
 * attention ops; NULL: a backend without attention_sizes (the batched path's (B,NH,T,T)).
 * keep_att[layers] (NULL: none): the blocks loom_gpt_keep_block_attention was called for (a
 * distillation term reads their probabilities: the student's and the teacher's mapped
 * blocks), sized as the run sizes them (on the CUDA backend's fused path, the batched
 * path's att and scratch for those blocks). */
loom_status loom_gpt_footprint(const loom_gpt_config *cfg, int max_B, const loom_gpt_parallel *par,
                               int tp, int sequence_parallel, loom_dtype param_dt,
                               loom_dtype act_dt, const loom_cuda_attention_mode *cuda_att,
                               const unsigned char *keep_att, loom_gpt_footprint_bytes *out);
/* Milliseconds spent inside tensor-parallel exchanges since the last call. */
double loom_gpt_take_comm_ms(loom_gpt *m);
/* B*T of a forward must be a multiple of this (tp under sequence parallelism, else 1). */
int loom_gpt_row_multiple(const loom_gpt *m);
void loom_gpt_zero_grad(loom_gpt *m);

/* Mixture of experts (moe.h). The noisy router's noise for the next forward is keyed by
 * (seed, block, key * B*T + row, expert): the caller passes the micro-batch's global index
 * (step x micro-batches per step + its index), so a token's noise never depends on the
 * rank that computes it. */
void loom_gpt_set_moe_key(loom_gpt *m, uint64_t key);
/* Under pp the session sets the key of this rank's first micro-batch of the step and the
 * pipeline, before each forward, the micro-batch's index among them (added to the key). */
void loom_gpt_set_moe_micro(loom_gpt *m, int micro);
typedef struct loom_moe_stats {
    int layers, experts;   /* MoE blocks, experts per block (0, 0: a dense model) */
    const double *load;    /* [layers x experts] tokens each expert computed (kept) */
    double assigned;       /* token choices made (k per token per MoE block) */
    double dropped;        /* of which dropped by capacity */
    double aux, z;         /* per training forward, summed over MoE blocks: the aux loss
                            * alpha E sum f P and the z-loss beta mean lse^2, as added */
    int forwards;          /* training forwards counted */
    int counts_forwards;   /* a pipeline stage: 1 on the one holding the first MoE block
                            * (load rows of other stages' blocks are 0 here) */
} loom_moe_stats;
/* What the training forwards since the last reset routed (this rank's tokens); aux and z
 * are means over those forwards. reset: start counting again. */
void loom_gpt_moe_stats(loom_gpt *m, loom_moe_stats *out, int reset);
/* Under ep: the (start, end) loom_now_ms pairs of every call into the MoE exchanges since
 * the last call (at most 1024 kept), *t valid until the next forward; 0 without ep. */
size_t loom_gpt_moe_take_spans(loom_gpt *m, const double **t);
/* Expert parallelism: the ep group's size (1 without), and whether table entry i is an
 * expert's (held by this ep rank only; its gradient is not the dp group's to reduce). */
int loom_gpt_expert_parallel(const loom_gpt *m);
/* The entries of each expert, in table order, by their name after "h.L.moe.expert.E.":
 * GPT-2's fc.weight, fc.bias, proj.weight, proj.bias; the llama family's SwiGLU
 * gate.weight, up.weight, proj.weight. Returns their count. */
int loom_gpt_moe_expert_kinds(const loom_gpt *m, const char *const **names);
int loom_gpt_is_expert_entry(const loom_gpt *m, int i);
/* Canonical mode under ep: the experts' gradients of the last backward, one copy per
 * source ep rank (what that rank's micro-batch gave, computed by GEMMs over its rows alone,
 * as ep=1 computes them): ep vectors of *n floats, source-major, each this rank's expert
 * entries in table order (the runs of loom_gpt_is_expert_entry entries, concatenated).
 * The model's own expert gradients stay zero. NULL (and *n = 0) otherwise. */
const float *loom_gpt_moe_source_grads(const loom_gpt *m, size_t *n);
/* 1 when the LM head is wte (GPT-2; loom.llama with tie_embeddings), 0 for its own weight. */
int loom_gpt_tied_head(const loom_gpt *m);
/* Mixed precision (the precision plugin's dtypes; session.c sets them once, after create).
 * param != F32: forward and backward read a compute copy of the weights, each value the
 * fp32 parameter (the master copy, what optimizers, checkpoints and ZeRO see) rounded to
 * param; loom_gpt_refresh_params makes it from the master, and must run after anything
 * writes the master and before the next pass. act != F32: every activation a GPU run would
 * store in act (the outputs of the embedding, the layer norms, the matmuls, attention,
 * GELU and the residual adds, and the logits) is rounded to act where it is written;
 * arithmetic, the layer-norm statistics, softmax probabilities, the loss and all gradients
 * stay fp32. Both are elementwise, so every layout rounds the same values alike (canonical
 * mode stays bitwise across layouts). F32/F32 (the default) changes nothing. Needs the
 * backend's round_to. */
loom_status loom_gpt_set_precision(loom_gpt *m, loom_dtype param, loom_dtype act);
/* Under a parameter hook (ZeRO-3: the master is partitioned, the buffer holds only the
 * gathered units) refresh makes nothing at once: each unit is narrowed when the hook says
 * it is gathered (needed = 1). refresh_all narrows the whole buffer: for when every unit
 * is in place (ZeRO-3 pinned, as decoding needs). */
void loom_gpt_refresh_params(loom_gpt *m);
void loom_gpt_refresh_all_params(loom_gpt *m);
/* ZeRO-1/2 with 16-bit weights (zero_master.c): on = 1, the fp32 master is ZeRO's
 * partition, not the model's buffer (whose pages ZeRO hands back to the OS); ZeRO writes
 * the compute copy itself (each rank rounds its partition into it, then all-gathers the
 * 16-bit values), and refresh only widens the small entries again from it. Needs 16-bit
 * weights. param16_data: the compute copy (c16) and its dtype, NULL in fp32. */
loom_status loom_gpt_set_master_elsewhere(loom_gpt *m, int on);
void *loom_gpt_param16_data(loom_gpt *m, loom_dtype *dt);
/* Bytes of the weights the passes read: the compute copy, or the parameters themselves. */
size_t loom_gpt_compute_param_bytes(const loom_gpt *m);
/* 16-bit weights: bytes of the fp32 scratch they are widened into before use (one block's
 * weights, a slice of the LM head's) and of the small entries kept widened; 0 in fp32. */
size_t loom_gpt_widen_bytes(const loom_gpt *m);
/* Of the activation bytes: what the kept blocks save for backward and 16-bit activations
 * store in 16 bits (ln_1, qkv, attention output, res2, ln_2, fc, GELU: 4 bytes each in
 * fp32, 2 with act bf16/f16 but under a split backward); a part of activation_bytes. */
size_t loom_gpt_saved_activation_bytes(const loom_gpt *m);

/* Parameters of the whole model (all slices) excluding padding rows of wte: what llm.c
 * and MFU count as N. */
size_t loom_gpt_num_params(const loom_gpt *m);

#endif
