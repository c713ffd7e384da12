/* gpt_internal.h — the GPT model's state, shared by gpt.c (table, buffers, forward,
 * backward) and gpt_parallel.c (what tensor parallelism and canonical mode add: region
 * crossings, chunk trees, row/column-parallel products, replicated-parameter gradients,
 * the vocabulary-parallel loss). Not a public interface.
 */
#ifndef LOOM_CORE_GPT_INTERNAL_H
#define LOOM_CORE_GPT_INTERNAL_H

#include <stddef.h> /* offsetof */

#include "gpt.h"

typedef struct layer_params {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} layer_params;

typedef struct model_params {
    float *wte, *wpe, *lnfw, *lnfb;
    float *head;         /* the LM head's weight: wte (tied) or the llama family's lm_head */
    layer_params *layer; /* [L] */
} model_params;

/* Saved per layer for backward. R = max_B*max_T token rows (max_T: ctx unless gpt.h's
 * max_T); Rl = this rank's rows of the
 * residual stream (R, or R/tp with sequence parallelism); Cl, Fl = this rank's attention
 * and MLP widths. The *_full buffers are the layernorm outputs over all R rows: aliases of
 * the local ones without sequence parallelism; with it, one shared buffer (m->gathered)
 * that forward fills by all-gather just before use and backward fills again just before
 * the weight gradient needs it (Korthikanti et al.: only the 1/tp shard is kept).
 * Recomputation (gpt.h): a fully recomputed block's pointers but res3, and a selective
 * one's att and fch_gelu, point into the scratch set all blocks share (gpt.c). */
typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (Rl,C) (Rl) (Rl) */
    float *ln1_full;                  /* (R,C) */
    float *qkv;                       /* (R,3Cl) */
    float *atty;                      /* (R,Cl) attention output before projection */
    float *att;                       /* (B,NH/tp,T,T) */
    float *res2;                      /* (Rl,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd, *ln2_full;
    float *fch, *fch_gelu;            /* (R,Fl) */
    float *res3;                      /* (Rl,C) block output */
    /* Split backward only (gpt_backward_split.c): d(fch) (R,Fl) for W, and the layer norms'
     * canonical gradient parts (4C: ln_2 weight, bias, ln_1 weight, bias) B leaves for W. */
    float *dfch, *ln_part;
    /* Split backward with selective recomputation: d(qkv) (R,3Cl), which otherwise goes over
     * fch; W needs fch to recompute the GELU output. */
    float *dqkv;
    /* 16-bit activations (m->a16): the 16-bit copies of what backward reads, GPT_A16_N of
     * them in gpt_act16_sizes' order (NULL: not kept); the float pointers above then
     * point into the shared scratch set, one block at a time (gpt_acts_store / _load). */
    void *s16[7];
} layer_acts;

struct loom_gpt {
    loom_gpt_config cfg;
    loom_backend *be;
    loom_param_table table;
    float *params, *grads;
    /* 1: the buffer is an anonymous mapping of table.total floats (loom_gpt_parallel's
     * undrawn on host memory), unmapped rather than handed back to the backend */
    int params_mapped, grads_mapped;
    model_params p, g;
    /* mixed precision (gpt.h): c16 the 16-bit compute copy of the weights (NULL: p points
     * into params); p then points into wide (the blocks, one widened at a time: wide_unit)
     * and edge (wpe, ln_f), and has no wte or head (gpt_precision.c reads them from c16) */
    void *c16;
    float *wide, *edge;
    size_t wide_cap, edge_n, *edge_of; /* floats of wide and edge; edge_of[entry]: where */
    size_t *span_lo, *span_hi;         /* gpt_w16_layout: each block's flat span [lo, hi)
                                        * (one pass over the table, not one per lookup) */
    size_t head_off, wte_off;          /* flat offsets of the head and wte ((size_t)-1: none) */
    int wide_unit;                     /* the block wide holds, -1: none */
    int master_elsewhere;              /* ZeRO-1/2: the fp32 master is ZeRO's partition, c16
                                        * is written by its gather (gpt.h) */
    int a16;                           /* kept blocks' activations stored in act_dt: the
                                        * per-block float pointers share one scratch set */
    int *host_tok;                     /* (R) host copy of the tokens the lookup reads */
    loom_dtype param_dt, act_dt;
    int max_B;
    int max_T;                         /* the longest forward (gpt.h max_T; ctx by default) */
    /* tensor parallelism (gpt.h): tp_ops NULL for one rank */
    const loom_strategy_ops *tp_ops;
    void *tp_self;
    int tp, tp_rank, sp, canonical;
    int Cl, NHl, Fl, Vl, v0;  /* this rank's widths and first vocabulary row */
    /* Block family (gpt.h): llama = 1 for LOOM_FAMILY_LLAMA. KVl, KVHl: this rank's key/
     * value width and heads (Cl, NHl for GPT-2); qkv_w: a qkv row (3Cl, or Cl + 2KVl);
     * fc_w: the MLP's first product's row (Fl, or 2Fl: gate and up); pre, per_layer, post:
     * parameter-table entries before the blocks, per block and after them. */
    int llama, KVl, KVHl, qkv_w, fc_w, pre, per_layer, post;
    float *rope_cos, *rope_sin;        /* llama: (ctx, hs/2) angle cache, device memory */
    /* activations */
    void *act_mem;
    size_t act_bytes;
    layer_acts *acts;
    float *encoded, *lnf, *lnf_mean, *lnf_rstd, *lnf_full, *logits, *losses;
    float *gathered;                   /* (R,C) under sequence parallelism: see layer_acts */
    float *ce_max, *ce_stats;          /* (R) row maxima; (2R) sum of exps, target logits */
    float *partial, *summed;           /* (R,C) row-parallel partials; (Rl,C) their sum */
    int *tokens, *targets;
    /* backward scratch */
    float *dres, *dres_full, *dtmp, *dpartial, *dsummed, *dbuf_4a, *dbuf_4b, *datt_scratch;
    float *rep_grad;                   /* (6C) replicated parameters' gradient partials */
    float *tree[3];                    /* canonical: levels of the chunk tree, (R,C) each */
    float *emb_grad;                   /* canonical: (Vl,C) one micro-batch's lookup gradient */
    float *dx_out, *lnf_part;          /* split backward: (Rl,C) the chunk input's gradient B
                                        * sends and W reads; (2C) ln_f's canonical parts */
    float *host_losses, *row_gather;   /* (R) host; (Vp) the backend's: a gathered logits row */
    int last_B, last_T, have_dlogits;
    /* att's and datt_scratch's floats (gpt_att.c: what the backend's attention keeps on its
     * path); att_fused: att holds the fused kernels' state, not probabilities; att_spill
     * (att_spill_n floats): where a forward whose att outgrows them writes every block's
     * (generation's row-stable mode), att_spilled: the last forward or decode did */
    size_t att_n, att_scratch_n, att_spill_n;
    int att_fused, att_spilled;
    /* loom_gpt_footprint of a run on the CUDA backend (no backend to ask): att sized by its
     * rule (loom/plugin/cuda_attention.h) in this mode; plan_cuda 0: the batched path's */
    int plan_cuda;
    loom_cuda_attention_mode plan_att;
    float *att_spill;
    /* att_keep[l] (NULL: none): block l keeps its probabilities where the others' att is the
     * fused kernels' state (a distillation term reads them: loom_gpt_keep_block_attention):
     * its att att_keep_n floats, its calls on the batched path (backend.h
     * attention_allow_fused, turned off around them); att_keep_scratch_n: that backward's */
    unsigned char *att_keep;
    size_t att_keep_n, att_keep_scratch_n;
    float *ce_dloss;                   /* (slots) a pipeline stage's head: the dloss whose
                                        * logits gradient the slot's backward still owes
                                        * (gpt_stage.c), 0 when none */
    /* pipeline stage (gpt_stage.c): own[l] = block l is held here; the embedding lives with
     * block 0, ln_f and the LM head with the last block; staged = some block is not. */
    unsigned char *own;
    int has_embed, has_head, staged, slots;
    int split;                         /* loom_gpt_parallel.split_backward: the buffers above */
    size_t slot_bytes;                 /* one activation set */
    /* Recomputation (gpt.h): rc[l] = RC_KEEP, RC_FULL or RC_SELECTIVE for block l. What is
     * recomputed lives in one scratch set (shared_bytes, ahead of the slots in act_mem)
     * that every block and slot shares: act_bytes = shared_bytes + slots x slot_bytes. */
    unsigned char *rc;
    size_t shared_bytes;
    /* loom_gpt_parallel.frozen: forward only (every rc[l] RC_FULL, no grads, no backward
     * scratch); keep_out[l] (NULL: none): block l's output in a buffer of its own */
    int frozen;
    unsigned char *keep_out;
    int cache_len;                     /* rows of a one-sequence forward kept as a key/value
                                        * cache (gpt_decode.c); 0: none */
    double comm_ms;                    /* time inside tensor-parallel exchanges */
    loom_grad_ready_fn grad_ready;
    void *grad_ready_ctx;
    loom_param_use_fn param_use;       /* ZeRO-3's gather and release, or NULL */
    void *param_use_ctx;
    loom_grad_write_fn grad_write;     /* ZeRO-2/3 on a sparse device buffer: commits, or NULL */
    void *grad_write_ctx;
    int params_sparse, grads_sparse;   /* the buffer is a backend vm_reserve range (destroy:
                                        * vm_release, not free) */
    /* distillation (gpt_distill.h): the teacher's logits for the next training forward */
    const float *kd_teacher;
    size_t kd_stride;
    const int *kd_targets;             /* a pipeline stage: the step's targets array (kd_rows */
    const float *kd_step_rows;         /* rows), and the teacher's rows in the same order */
    size_t kd_rows;
    float kd_T, kd_alpha;
    size_t kd_bytes;                   /* what the distillation terms allocated below (the
                                        * buffers sized by R, C, the vocabulary or the heads;
                                        * not the pointer arrays): loom_gpt_distill_bytes */
    float *kd_grad;                    /* (R,Vl) alpha dloss d kd / d z_s: host, or the
                                        * backend's on a device backend (kd_rows op) */
    double *kd_loss;                   /* (R) host */
    double *kd_dev_loss;               /* (R) the backend's: kd_rows' rows on a device, else NULL */
    int *kd_tp_idx;                    /* a device under tp: rows_gather's indices, the backend's:
                                        * (R * tp) blocks -> whole rows, then (R) whole rows ->
                                        * this rank's columns (gpt_distill_tp_device.c) */
    size_t kd_tp_idx_R;                /* the R the first part was written for; 0: none */
    /* hidden-state terms (gpt_distill.h): the teacher's block outputs per student block
     * (kd_h[l], NULL: unmapped; a pipeline stage: the step's rows, chosen by the targets
     * as gpt_distill_select does), beta, and what the forward left in its activation slot
     * for the backward: kd_dh[slot * layers + l] = d(term) / d(res3 of l) (R,C) and
     * kd_dw[slot * layers + l] = d(term) / d(projection l), added at the head's backward */
    const float *const *kd_h;
    float kd_beta;
    float **kd_dh, **kd_dw;
    double *kd_hloss;                  /* (R) */
    float *kd_y;                       /* (R, kd_proj_dim) the projection's output */
    float *kd_hall;                    /* sequence parallelism: (R,C) h's rows gathered (the
                                        * backend's memory on a device: the tp group's) */
    /* a device backend: the terms run on the host over copies (gpt_distill_hidden.c's
     * gpt_kd_host_view): h's rows (R,C), the projection (Ct,C), and the results (R,C),
     * (Ct,C) before they are copied into kd_dh / kd_dw (the backend's there); the
     * student's probabilities (R,NHl,T) and their gradient in the backend's memory */
    float *kd_hs_host, *kd_w_host, *kd_dh_host, *kd_dw_host, *kd_ps_host, *kd_datt_dev;
    int kd_h_first;                    /* the lowest mapped block */
    /* the attention-probability term (gpt_distill_attn.c): the teacher's probabilities per
     * student block (kd_att[l], NULL: unmapped; a stage: the step's micro-batches, each
     * (B,NH,T,T)), gamma; the forward's loss rows (kd_aloss); kd_datt (B,NHl,T,T) the
     * backward's d(probabilities); kd_a_first the lowest mapped block */
    const float *const *kd_att;
    float kd_gamma;
    float *kd_datt;
    double *kd_aloss;
    double *kd_hsum; /* (tp + 1, R, NHl): this rank's per-head row sums, then all ranks' */
    double *kd_hsum_dev; /* a device under tp: kd_hsum's layout in the backend's memory, where
                          * the tp group gathers (the sums go there and back) */
    int kd_att_h0, kd_att_nh; /* the teacher's heads: this rank's first, and how many a
                               * (B,NH,T,T) of its buffer holds (NH replicated, NHl split) */
    int kd_a_first;
    /* per activation slot, what a training forward of the terms left for its backward */
    struct gpt_kd_slot {
        size_t r0;                     /* the micro-batch's first row in the step's */
        float a_scale;                 /* its dloss */
        int h_live, a_live;            /* 1 until the lowest mapped block's backward */
        int w_live;                    /* 1 until the head's backward added kd_dw */
    } *kd_slot;
    int cur_slot;                      /* the slot gpt_bind_slot chose */
    /* Mixture of experts (moe.h): NULL for a dense model; then block l's table entries are
     * 2 + 12 l .. +11, else ent0[l] .. ent0[l + 1] - 1 (an MoE block has 9 + 4 E). */
    struct gpt_moe *moe;
    int *ent0;                         /* [layers + 1], with moe */
    int ep, ep_rank;                   /* loom_gpt_parallel's expert parallelism (1, 0: none) */
    const struct loom_comm_ops *ep_ops;
    void *ep_comm;
    const struct loom_comm_ops *ep_dops; /* the rows' group: ep_comm's for host memory */
    void *ep_dcomm;
};

/* gpt_distill.c: around the training forward's cross-entropy when a teacher is set. */
loom_status gpt_distill_before(loom_gpt *m, size_t R, float dloss);
void gpt_distill_after(loom_gpt *m, size_t R);
void gpt_distill_free(loom_gpt *m);
/* The logit term under tp in a device backend's memory (gpt_distill_tp_device.c): the
 * check that its ops are there; the term's rows and this rank's gradient columns; free. */
loom_status gpt_kd_tp_device_check(const loom_gpt *m);
loom_status gpt_kd_tp_device_rows(loom_gpt *m, size_t R, float scale);
/* loom_gpt_gather_logits in the backend's memory (blocks, full: the backend's). */
loom_status gpt_gather_logits_device(loom_gpt *m, size_t R, float *blocks, float *full);
void gpt_kd_tp_device_free(loom_gpt *m);
/* A training forward's hidden-state terms (after the CE and kd; targets choose a stage's
 * teacher rows), the projections' gradients added at the head's backward (head) and the
 * d(res3) before block l's backward; all nothing when none are set. */
loom_status gpt_distill_hidden(loom_gpt *m, const int *targets, size_t R, float dloss);
void gpt_distill_hidden_head(loom_gpt *m);
void gpt_distill_hidden_backward(loom_gpt *m, int l, size_t Rl);
/* The split backward's B: the term's d(res3 of l) added to dy (block l's output gradient). */
void gpt_distill_hidden_dy(loom_gpt *m, int l, float *dy, size_t Rl);
/* The first row of this forward's micro-batch in the step's rows (a stage), or 0; 0 if
 * targets are not the step's (an eval batch): then no term. */
int gpt_distill_row0(const loom_gpt *m, const int *targets, size_t R, size_t *r0);
/* Intermediate terms on a pipeline stage: every mapped block l must be in the head's chunk
 * (blocks l .. layers-1 held here); and the per-slot state. */
loom_status gpt_distill_terms_check(loom_gpt *m, const float *const *map, const char *what);
void gpt_distill_hidden_free(loom_gpt *m);
/* A device backend runs the intermediate terms on the host: src (n floats, the backend's)
 * copied into scratch, which is returned; on host memory src itself. */
const float *gpt_kd_host_view(loom_gpt *m, const float *src, size_t n, float *scratch);
/* losses[r] += extra[r] (+ extra2[r], may be NULL), in double: on a device through
 * host_losses. */
void gpt_kd_add_loss_rows(loom_gpt *m, const double *extra, const double *extra2, size_t R);
/* The attention term (gpt_distill_attn.c): after block l's training forward, its loss rows;
 * block l's attention backward (the term's d(probabilities) joined when it has one). */
loom_status gpt_distill_attn_forward(loom_gpt *m, int l, const int *targets, int B, int T,
                                     float dloss);
void gpt_attention_backward(loom_gpt *m, int l, float *dqkv, const float *datty, int B, int T);
void gpt_distill_attn_free(loom_gpt *m);
/* A stage's forward with these targets: point kd_teacher at their rows of the step's
 * teacher rows (loom_gpt_set_distill_step); 1 if this forward distils. */
int gpt_distill_select(loom_gpt *m, const int *targets, size_t R);

enum { RC_KEEP, RC_FULL, RC_SELECTIVE };

/* A frozen model's block l whose probabilities outlive the forward (att_keep: its att in a
 * buffer of its own, not the scratch set's). */
static inline int gpt_frozen_att(const loom_gpt *m, int l)
{
    return m->frozen && m->att_keep && m->att_keep[l];
}

typedef struct gpt_moe gpt_moe; /* moe.c's state: the mixture-of-experts blocks */

/* An activation just written, rounded to what a store in the activation dtype keeps
 * (gpt.h: loom_gpt_set_precision); nothing in fp32. */
static inline void gpt_round(loom_gpt *m, float *x, size_t n)
{
    if (m->act_dt != LOOM_DTYPE_F32)
        m->be->ops->round_to(x, x, n, m->act_dt);
}

/* matmul_forward of an activation the model rounded to act_dt by a block weight: through
 * the backend's 16-bit product (backend.h matmul_forward_dt) when the weights are a
 * compute copy of the same dtype (then both operands hold only act_dt values), else the
 * fp32 one. The head reads its 16-bit copy in bands through gemm (gpt_precision.c). */
static inline void gpt_matmul_forward(loom_gpt *m, float *out, const float *inp, const float *w,
                                      const float *bias, int B, int T, int C, int OC)
{
    const loom_backend_ops *k = m->be->ops;
    if (m->act_dt != LOOM_DTYPE_F32 && m->c16 && m->param_dt == m->act_dt &&
        k->size > offsetof(loom_backend_ops, matmul_forward_dt) && k->matmul_forward_dt)
        k->matmul_forward_dt(out, inp, w, bias, B, T, C, OC, m->act_dt);
    else
        k->matmul_forward(out, inp, w, bias, B, T, C, OC);
}

/* gpt_att.c: att's and datt_scratch's sizes (gpt_att_size; the batched path's without the
 * backend's attention_sizes), the dt the model's attention calls pass, the spill buffer a
 * forward or decode whose att outgrows them writes into (gpt_att_prepare / _decode, before
 * the blocks; gpt_att_at: the buffer a block's attention writes), the refusals of a backward
 * after such a forward and of the terms that read probabilities where att holds the fused
 * kernels' state. */
loom_dtype gpt_attention_dt(const loom_gpt *m);
void gpt_att_size(const loom_gpt *m, size_t *att, size_t *scratch, int *fused);
/* A block keeping its probabilities (att_keep): the batched path's att and scratch, with
 * the backend's fused kernels turned off (its attention_allow_fused; without it, gpt_att_size's). */
void gpt_att_size_kept(loom_gpt *m, size_t *att, size_t *scratch);
/* 1 if block l's att holds probabilities after its forward: not the fused kernels' state,
 * or kept (att_keep) on a backend that can turn them off. */
int gpt_att_probabilities(const loom_gpt *m, int l);
/* block l's att floats in the layout (att_keep_n or att_n), and whether its calls turn the
 * fused kernels off (l < 0: a call of no block, never) */
size_t gpt_att_block_n(const loom_gpt *m, int l);
int gpt_att_forced(const loom_gpt *m, int l);
loom_status gpt_att_prepare(loom_gpt *m, int B, int T);
loom_status gpt_att_prepare_decode(loom_gpt *m, int n);
loom_status gpt_att_check_backward(const loom_gpt *m);
loom_status gpt_att_check_probabilities(const loom_gpt *m, int l, const char *what);
void gpt_att_free(loom_gpt *m);
static inline float *gpt_att_at(const loom_gpt *m, float *att)
{
    return m->att_spilled ? m->att_spill : att;
}

/* Block l's attention calls with the backend's fused kernels off (on = 0) and on again
 * (on = 1) where it keeps its probabilities (gpt_att_forced); else nothing. */
static inline void gpt_att_fuse(loom_gpt *m, int l, int on)
{
    if (gpt_att_forced(m, l))
        m->be->ops->attention_allow_fused(m->be->self, on);
}

/* attention_forward / _backward of block l (-1: none's) over qkv the model rounded to
 * act_dt: through the backend's 16-bit attention (backend.h attention_forward_dt) where the
 * activations are 16-bit and the backend has it, else the fp32 op; a block keeping its
 * probabilities (att_keep) with the fused kernels off. Forward, its recomputation and
 * backward all come here, so att always holds what the backward that reads it expects. */
static inline void gpt_attention_fwd(loom_gpt *m, int l, float *out, float *att,
                                     const float *qkv, int B, int T)
{
    const loom_backend_ops *k = m->be->ops;
    att = gpt_att_at(m, att);
    gpt_att_fuse(m, l, 0);
    if (m->act_dt != LOOM_DTYPE_F32 &&
        k->size > offsetof(loom_backend_ops, attention_forward_dt) && k->attention_forward_dt)
        k->attention_forward_dt(out, att, qkv, B, T, m->Cl, m->NHl, m->act_dt);
    else
        k->attention_forward(out, att, qkv, B, T, m->Cl, m->NHl);
    gpt_att_fuse(m, l, 1);
}

static inline void gpt_attention_bwd(loom_gpt *m, int l, float *dqkv, float *scratch,
                                     const float *dout, const float *qkv, const float *att,
                                     int B, int T)
{
    const loom_backend_ops *k = m->be->ops;
    gpt_att_fuse(m, l, 0);
    if (m->act_dt != LOOM_DTYPE_F32 &&
        k->size > offsetof(loom_backend_ops, attention_backward_dt) && k->attention_backward_dt)
        k->attention_backward_dt(dqkv, scratch, dout, qkv, att, B, T, m->Cl, m->NHl, m->act_dt);
    else
        k->attention_backward(dqkv, scratch, dout, qkv, att, B, T, m->Cl, m->NHl);
    gpt_att_fuse(m, l, 1);
}

/* The llama family's grouped-query attention (backend.h attention_gqa_*, KVH = m->KVHl kv
 * heads) of qkv the model rounded to act_dt, where the activations are 16-bit: with
 * KVH = NH (multi-head attention, with its bits: backend.h) through the backend's
 * attention_forward_dt / _backward_dt as GPT-2's (gpt_attention_fwd / _bwd), with fewer kv
 * heads through attention_gqa_forward_dt / _backward_dt (the CUDA backend's tensor-core
 * kernels, on the multi-head ones' condition); where the backend has them (both members).
 * Every other call is the fp32 _gqa op. Forward, its recomputation and backward take the
 * same branch, so att holds what the backward expects. */
static inline int gpt_gqa_dt(const loom_gpt *m)
{
    const loom_backend_ops *k = m->be->ops;
    if (m->act_dt == LOOM_DTYPE_F32)
        return 0;
    if (m->KVHl == m->NHl)
        return k->size > offsetof(loom_backend_ops, attention_backward_dt) &&
               k->attention_forward_dt && k->attention_backward_dt;
    return k->size > offsetof(loom_backend_ops, attention_gqa_backward_dt) &&
           k->attention_gqa_forward_dt && k->attention_gqa_backward_dt;
}

static inline void gpt_gqa_fwd(loom_gpt *m, int l, float *out, float *att, const float *qkv,
                               int B, int T)
{
    const loom_backend_ops *k = m->be->ops;
    const int dt = gpt_gqa_dt(m);
    att = gpt_att_at(m, att);
    if (dt && m->KVHl == m->NHl) {
        gpt_attention_fwd(m, l, out, att, qkv, B, T);
        return;
    }
    gpt_att_fuse(m, l, 0);
    if (dt)
        k->attention_gqa_forward_dt(out, att, qkv, B, T, m->Cl, m->NHl, m->KVHl, m->act_dt);
    else
        k->attention_gqa_forward(out, att, qkv, B, T, m->Cl, m->NHl, m->KVHl);
    gpt_att_fuse(m, l, 1);
}

static inline void gpt_gqa_bwd(loom_gpt *m, int l, float *dqkv, float *scratch,
                               const float *dout, const float *qkv, const float *att, int B,
                               int T)
{
    const loom_backend_ops *k = m->be->ops;
    const int dt = gpt_gqa_dt(m);
    if (dt && m->KVHl == m->NHl) {
        gpt_attention_bwd(m, l, dqkv, scratch, dout, qkv, att, B, T);
        return;
    }
    gpt_att_fuse(m, l, 0);
    if (dt)
        k->attention_gqa_backward_dt(dqkv, scratch, dout, qkv, att, B, T, m->Cl, m->NHl,
                                     m->KVHl, m->act_dt);
    else
        k->attention_gqa_backward(dqkv, scratch, dout, qkv, att, B, T, m->Cl, m->NHl, m->KVHl);
    gpt_att_fuse(m, l, 1);
}

/* The backward of a product gpt_matmul_forward sends to the 16-bit op (same condition):
 * the backend's matmul_backward_dt (dinp or dw may be NULL; w fp32 holding act_dt values,
 * or with bits the 16-bit copy itself). 1 when it ran; 0, nothing written: the caller makes
 * its fp32 call (gpt_matmul_backward does). */
static inline int gpt_matmul_backward16(loom_gpt *m, float *dinp, float *dw, float *db,
                                        const float *dout, const float *inp, const void *w,
                                        int bits, int B, int T, int C, int OC)
{
    const loom_backend_ops *k = m->be->ops;
    return m->act_dt != LOOM_DTYPE_F32 && m->c16 && m->param_dt == m->act_dt &&
           k->size > offsetof(loom_backend_ops, matmul_backward_dt) && k->matmul_backward_dt &&
           k->matmul_backward_dt(dinp, dw, db, dout, inp, w, bits, B, T, C, OC, m->act_dt) == 0;
}

static inline void gpt_matmul_backward(loom_gpt *m, float *dinp, float *dw, float *db,
                                       const float *dout, const float *inp, const float *w,
                                       int B, int T, int C, int OC)
{
    if (!gpt_matmul_backward16(m, dinp, dw, db, dout, inp, w, 0, B, T, C, OC))
        m->be->ops->matmul_backward(dinp, dw, db, dout, inp, w, B, T, C, OC);
}

/* 16-bit weights (gpt_precision.c). setup: allocate c16, wide and edge and move m->p
 * (bound to params) onto them; refresh: c16 from params and edge from c16. */
/* The 16-bit copy's layout, without allocating: head_off, wte_off, wide_cap, edge_n, and
 * edge_of[entry] where given (gpt_w16_setup; loom_gpt_footprint sizes with NULL). */
loom_status gpt_w16_layout(loom_gpt *m, size_t *edge_of);
loom_status gpt_w16_setup(loom_gpt *m);
/* The parameter pointers (bound to m->params) moved onto the 16-bit copy's views. */
void gpt_w16_bind(loom_gpt *m);
void gpt_w16_free(loom_gpt *m);
void gpt_w16_refresh(loom_gpt *m);
/* ZeRO-3: unit u (gpt.h's units) was just gathered into params: its span narrowed into
 * c16, its edge entries widened again (nothing in fp32). */
void gpt_w16_unit(loom_gpt *m, int u);
size_t gpt_w16_bytes(const loom_gpt *m);
size_t gpt_w16_scratch_bytes(const loom_gpt *m);
/* Before reading m->p.layer[l]: its weights widened into wide (nothing in fp32). */
void gpt_widen_block(loom_gpt *m, int l);
/* Block l's first flat offset: its entry at offset o is wide[o - this] once widened. */
size_t gpt_w16_block_lo(const loom_gpt *m, int l);
/* 16-bit activations (gpt_precision.c): what a kept block saves for backward, in this
 * order: ln1, qkv, atty, res2, ln2, fch, fch_gelu (element counts for R token rows; 0:
 * not saved, fch_gelu under selective recomputation). store: after block l's forward, its
 * values (already rounded to act_dt: exact) into a->s16; load: before its backward, back
 * into the scratch set. saved_bytes: those tensors' bytes at max_B, in their storage. */
enum { GPT_A16_N = 7 };
void gpt_act16_sizes(const loom_gpt *m, int l, size_t R, size_t n[GPT_A16_N]);
void gpt_acts_store(loom_gpt *m, int l, size_t R);
void gpt_acts_load(loom_gpt *m, int l, size_t R);
size_t gpt_saved_activation_bytes(const loom_gpt *m);

/* The token embedding's lookup (embedding_forward's contract) of R tokens, given on the
 * device and on the host. */
void gpt_embed_lookup(loom_gpt *m, float *out, const int *dev_tokens, const int *host_tokens,
                      size_t R);
/* logits (R,Vl) = inp (R,C) @ head^T (no bias). */
void gpt_head_forward(loom_gpt *m, float *logits, const float *inp, int B, int T);
/* 16-bit weights: dinp (R,C) = dout (R,Vl) @ head; the head's rows [row0, row0+rows)
 * widened (into wide: valid until the next widening). */
void gpt_head_dinp(loom_gpt *m, float *dinp, const float *dout, int R);
const float *gpt_head_rows(loom_gpt *m, size_t row0, size_t rows);

/* A region boundary: the strategy's hook, or nothing with one rank (then out == in).
 * The macros name Megatron's points; they expect the model in `m`. */
typedef loom_status (*region_hook)(void *, loom_region, int, const loom_region_io *);
#define GPT_HOOK(member) (m->tp_ops ? m->tp_ops->member : NULL)
#define F_ENTER(r, l, in, out, rows, w) \
    gpt_cross(m, GPT_HOOK(region_forward_enter), r, l, in, out, rows, w)
#define F_LEAVE(r, l, in, out, rows, w) \
    gpt_cross(m, GPT_HOOK(region_forward_leave), r, l, in, out, rows, w)
#define B_LEAVE(r, l, in, out, rows, w) \
    gpt_cross(m, GPT_HOOK(region_backward_leave), r, l, in, out, rows, w)
#define B_ENTER(r, l, in, out, rows, w) \
    gpt_cross(m, GPT_HOOK(region_backward_enter), r, l, in, out, rows, w)

/* The token embedding's gradient into g.wte (rows [v0, v0+Vl)) from dout. Canonical
 * mode sums it on its own first and adds it to the LM head's part in one add (head + emb),
 * so a pipeline that holds the two halves on different stages gets the same bits. */
void gpt_embedding_grad(loom_gpt *m, const float *dout, size_t R);

/* Ask the tp strategy where the table entry added last lives; split_dim: the dim the model
 * lets it cut (-1: replicated). gpt.c's table and moe.c's experts. */
loom_status gpt_place_last(loom_gpt *m, int split_dim);

/* A pipeline chunk [lo, hi) this model can run (gpt_stage.c). */
loom_status gpt_check_chunk(const loom_gpt *m, int lo, int hi);
/* A forward's B x T within what the activations were sized for (max_B x max_T). */
loom_status gpt_check_batch(const loom_gpt *m, int B, int T);
/* A stage's backward (fused or B) around the head, head = 1 before and 0 after, and
 * around block l (done = 0 before, 1 after): ZeRO-3's units (gpt_stage.h). */
loom_status gpt_stage_head_units(loom_gpt *m, int hi, int head);
/* The logits' gradient the bound slot's forward deferred (none: nothing), R rows. */
void gpt_stage_head_loss_grad(loom_gpt *m, size_t R);
loom_status gpt_stage_block_unit(loom_gpt *m, int l, int lo, int done);
/* A stage's finished gradients to the gradient-ready hook (gpt_stage.c, gpt_stage.h's
 * loom_gpt_stage_reports_ready): block `layer`'s, or (layer < 0) the entries outside
 * blocks before (lead = 1) or after (lead = 0) them. */
loom_status gpt_stage_ready(loom_gpt *m, int layer, int lead);

/* Point the activation buffers at activation set `slot` (0 .. slots-1). */
void gpt_bind_slot(loom_gpt *m, int slot);

loom_status gpt_cross(loom_gpt *m, region_hook hook, loom_region r, int layer, const float *in,
                      float *out, size_t rows, size_t width);
loom_status gpt_region_wait(loom_gpt *m);
loom_status gpt_tensor_allreduce(loom_gpt *m, float *x, size_t n, loom_reduce_op op);
/* Under sequence parallelism, gather a layernorm output's rows again for backward. */
loom_status gpt_regather(loom_gpt *m, loom_region r, int layer, const float *local, float *full,
                         size_t R);
/* out (R,C) = this rank's partial of a row-parallel layer (no bias). */
void gpt_row_parallel_forward(loom_gpt *m, float *out, const float *inp, const float *w, int B,
                              int T, int K);
/* dinp (R,C) = this rank's partial input gradient of a column-parallel layer, dout (R,OC)
 * @ w (OC,C), its OC output features in `segs` equal segments (3: the fused qkv's q, k,
 * v); in canonical mode over this rank's chunks in the fixed tree (moe.c's experts too). */
void gpt_column_parallel_dinp(loom_gpt *m, float *dinp, const float *dout, const float *w, int R,
                              int OC, int segs);
/* Weight, bias and (summed over the group into m->dsummed) input gradients of a
 * column-parallel layer whose output features form `segs` equal segments. */
loom_status gpt_column_parallel_backward(loom_gpt *m, loom_region r, int layer, float *dw,
                                         float *db, const float *dout, const float *inp,
                                         const float *w, int B, int T, int OC, int segs);
/* Its input gradient alone (into m->dsummed), for the split backward's B; the weight and
 * bias gradients are then matmul_backward(NULL, dw, db, ...) in W: the same bits. */
loom_status gpt_column_parallel_backward_input(loom_gpt *m, loom_region r, int layer,
                                               const float *dout, const float *w, int B, int T,
                                               int OC, int segs);

typedef struct rep_args {
    float *dinp;
    const float *dout, *inp, *w, *mean, *rstd;
} rep_args;

typedef struct rep_pack {
    float *dst[6];   /* the gradient each slot is added to */
    int n;
    float *base;     /* where the slots are (C floats each); NULL: m->rep_grad */
} rep_pack;

/* One transformer block forward / backward (gpt.c), shared by the whole-model passes and
 * the pipeline stages: R = B*T rows, of which this rank keeps Rl. */
loom_status gpt_block_forward(loom_gpt *m, int l, const float *residual, int B, int T, size_t Rl);
loom_status gpt_block_backward(loom_gpt *m, int l, const float *residual, rep_pack *pk, int B,
                               int T, size_t Rl);
/* The llama family's block (gpt_llama.c), which gpt_block_forward/backward run for it. */
loom_status gpt_llama_block_forward(loom_gpt *m, int l, const float *residual, int B, int T,
                                    size_t Rl);
loom_status gpt_llama_block_backward(loom_gpt *m, int l, const float *residual, rep_pack *pk,
                                     int B, int T, size_t Rl);
/* Its split backward (gpt_llama_split.c): B reads dy = d(block output), writes dx =
 * d(residual); W adds the weight gradients from what B kept (gpt_backward_split.c). */
loom_status gpt_llama_block_input(loom_gpt *m, int l, const float *residual, float *dy,
                                  float *dx, int B, int T, size_t Rl);
loom_status gpt_llama_block_weight(loom_gpt *m, int l, const float *dy, int B, int T);
/* gpt_llama.c: the family's config checks, widths (m->llama and the fields after it),
 * split checks and the rotary angle cache. */
loom_status gpt_llama_config_check(const loom_gpt_config *c);
void gpt_llama_widths(loom_gpt *m);
loom_status gpt_llama_check_split(const loom_gpt *m);
loom_status gpt_llama_rope_cache(loom_gpt *m);
/* One row t of a llama block for incremental decoding (gpt_decode.c). */
loom_status gpt_llama_block_decode(loom_gpt *m, int l, const float *residual, size_t r);
/* The final norm's forward over Rl rows (layer norm or RMSNorm by family) and its backward
 * through the replicated-gradient pack (the kind gpt_replicated_grads takes). */
void gpt_final_norm_forward(loom_gpt *m, const float *residual, size_t r0, size_t Rl);
int gpt_norm_kind(const loom_gpt *m);

void gpt_replicated_grads(loom_gpt *m, rep_pack *pk, int kind, const rep_args *a, float *dw,
                          float *db, size_t Rl);
loom_status gpt_rep_flush(loom_gpt *m, rep_pack *pk);
/* Losses (and, with dloss != 0, the logits' gradient) of the last forward's R rows. */
loom_status gpt_vocab_cross_entropy(loom_gpt *m, int R, float dloss);
/* The gradient of a cross-entropy run with dloss = 0, from the statistics it kept. */
void gpt_vocab_cross_entropy_grad(loom_gpt *m, int R, float dloss);

#endif
