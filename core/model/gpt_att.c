/* gpt_att.c — how big each block's att and the backward's attention scratch are: what the
 * backend's attention keeps on the path it takes (backend.h attention_sizes; without it the
 * batched path's probabilities (B,NH,T,T) and two gradients of that size). The CUDA
 * backend's fused kernels (LOOM_CUDA_ATTENTION=flash, fast mode) keep lse and out's copy,
 * about T/(1 + C/NH) times less: at GPT-2 124M, T 1024, 0.8 M floats a sequence and block
 * rather than 12.6 M.
 *
 * A block whose probabilities a distillation term reads (att_keep: loom_gpt_keep_block_
 * attention, a teacher's mapped blocks and a student's) keeps the batched path's att
 * (B,NH,T,T) of its own, and its calls turn the fused kernels off around them (backend.h
 * attention_allow_fused; gpt_internal.h gpt_attention_fwd), recomputation's too; the shared
 * scratch the recomputed blocks use is the largest of theirs, datt_scratch the batched
 * backward's where a block keeps. Every other block stays fused, with the small att.
 *
 * The sizes hold every forward with B <= max_B, T <= max_T (ctx unless gpt.h's max_T) in
 * the mode the model was built in (training's: set_deterministic(canonical), gpt.c's gpt_setup). Generation switches the
 * backend to row-stable mode, where attention takes the batched path whatever the variable
 * says: a forward or decode whose att needs more than the blocks' buffers then writes every
 * block's att into one spill buffer (allocated at the first such call, kept for the next),
 * which is right because nothing reads a generation forward's att afterwards; a backward
 * after such a forward is refused (its blocks' att were not kept).
 *
 * loom plan's footprint (no backend) sizes a run on the CUDA backend by that backend's own
 * rule (loom/plugin/cuda_attention.h), in training's mode; without it the batched path's. */
#include "gpt_internal.h"

#include "base/status.h"

loom_dtype gpt_attention_dt(const loom_gpt *m)
{
    const loom_backend_ops *k = m->be->ops;
    if (m->llama)
        return gpt_gqa_dt(m) ? m->act_dt : LOOM_DTYPE_F32;
    return m->act_dt != LOOM_DTYPE_F32 &&
                   k->size > offsetof(loom_backend_ops, attention_forward_dt) &&
                   k->attention_forward_dt
               ? m->act_dt
               : LOOM_DTYPE_F32;
}

/* What one block's attention call over (B, T) needs now. loom_gpt_footprint (no backend)
 * of a run on the CUDA backend: that backend's rule itself (loom/plugin/cuda_attention.h,
 * what its attention_sizes computes), at the dtype its calls pass there (it has every 16-bit
 * attention op: gpt_attention_dt and gpt_gqa_dt give act_dt). */
static void att_need(const loom_gpt *m, int B, int T, size_t *att, size_t *scratch)
{
    const loom_backend_ops *k = m->be ? m->be->ops : NULL;
    if (k && k->size > offsetof(loom_backend_ops, attention_sizes) && k->attention_sizes) {
        k->attention_sizes(m->be->self, B, T, m->Cl, m->NHl, m->KVHl, gpt_attention_dt(m), att,
                           scratch);
        return;
    }
    if (!k && m->plan_cuda) {
        loom_cuda_attention_sizes_of(&m->plan_att, B, T, m->Cl, m->NHl, m->KVHl, m->act_dt, att,
                                     scratch);
        return;
    }
    *att = (size_t)B * (size_t)m->NHl * (size_t)T * (size_t)T;
    *scratch = 2 * *att;
}

void gpt_att_size(const loom_gpt *m, size_t *att, size_t *scratch, int *fused)
{
    *att = *scratch = 0;
    /* the largest over every T: the path can change with T (the fused kernels need T > hs) */
    for (int T = 1; T <= m->max_T; T++) {
        size_t a, s;
        att_need(m, m->max_B, T, &a, &s);
        *att = a > *att ? a : *att;
        *scratch = s > *scratch ? s : *scratch;
    }
    /* not the batched path's probabilities at the full shape: the fused kernels' state */
    size_t a, s, T = (size_t)m->max_T;
    att_need(m, m->max_B, m->max_T, &a, &s);
    *fused = a != (size_t)m->max_B * (size_t)m->NHl * T * T;
}

/* The backend's switch for its fused kernels (backend.h attention_allow_fused), or NULL. */
static void (*allow_op(const loom_gpt *m))(void *, int)
{
    const loom_backend_ops *k = m->be ? m->be->ops : NULL;
    return k && k->size > offsetof(loom_backend_ops, attention_allow_fused)
               ? k->attention_allow_fused
               : NULL;
}

/* loom_gpt_footprint of a run on the CUDA backend (no backend): that backend has the switch
 * (attention_allow_fused), so a kept block is sized as its batched path, as the run sizes it. */
static int can_force(const loom_gpt *m) { return allow_op(m) || (!m->be && m->plan_cuda); }

void gpt_att_size_kept(loom_gpt *m, size_t *att, size_t *scratch)
{
    void (*allow)(void *, int) = allow_op(m);
    int fused, flash = m->plan_att.flash;
    if (allow)
        allow(m->be->self, 0);
    if (!m->be) /* the footprint: the rule with the fused kernels off (fused_off's effect) */
        m->plan_att.flash = 0;
    gpt_att_size(m, att, scratch, &fused);
    if (allow)
        allow(m->be->self, 1);
    m->plan_att.flash = flash;
}

int gpt_att_forced(const loom_gpt *m, int l)
{
    return l >= 0 && m->att_keep && m->att_keep[l] && m->att_fused && can_force(m);
}

int gpt_att_probabilities(const loom_gpt *m, int l)
{
    return !m->att_fused || gpt_att_forced(m, l);
}

size_t gpt_att_block_n(const loom_gpt *m, int l)
{
    return gpt_att_forced(m, l) ? m->att_keep_n : m->att_n;
}

static loom_status att_spill(loom_gpt *m, size_t need, const char *what)
{
    m->att_spilled = need > m->att_n;
    if (!m->att_spilled || need <= m->att_spill_n)
        return LOOM_OK;
    m->be->ops->free(m->be->self, m->att_spill);
    m->att_spill_n = 0;
    m->att_spill = m->be->ops->alloc(m->be->self, need * sizeof(float));
    if (!m->att_spill)
        LOOM_FAIL(LOOM_ERR_NOMEM, "%s: attention on the batched path needs %.1f MiB of "
                  "probabilities, more than the blocks' att (%.1f MiB, sized for the fused "
                  "kernels), and that much more memory is not there", what,
                  (double)need * sizeof(float) / (1 << 20),
                  (double)m->att_n * sizeof(float) / (1 << 20));
    m->att_spill_n = need;
    return LOOM_OK;
}

loom_status gpt_att_prepare(loom_gpt *m, int B, int T)
{
    size_t att, scratch;
    att_need(m, B, T, &att, &scratch);
    return att_spill(m, att, "forward");
}

loom_status gpt_att_prepare_decode(loom_gpt *m, int n)
{
    /* attention_decode writes row n-1 where a (1, n) forward keeps it: NH n^2 floats */
    return att_spill(m, (size_t)m->NHl * (size_t)n * (size_t)n, "decode");
}

loom_status gpt_att_check_backward(const loom_gpt *m)
{
    if (m->att_spilled)
        LOOM_FAIL(LOOM_ERR_INVALID, "backward after a forward whose attention ran on the batched "
                  "path into one shared buffer (a generation's row-stable mode, with att sized "
                  "for the fused kernels): its blocks' probabilities were not kept; run the "
                  "training forward again in training's mode first");
    return LOOM_OK;
}

loom_status gpt_att_check_probabilities(const loom_gpt *m, int l, const char *what)
{
    if (!gpt_att_probabilities(m, l))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "%s reads block %d's attention probabilities, which "
                  "the backend's fused attention does not keep (att holds its log-sum-exp "
                  "and output: LOOM_CUDA_ATTENTION=flash), and the backend has no "
                  "attention_allow_fused (plugin/backend.h) to keep that block on the batched "
                  "path; leave the variable unset (the batched path) for this term", what, l);
    return LOOM_OK;
}

void gpt_att_free(loom_gpt *m)
{
    if (m->att_spill)
        m->be->ops->free(m->be->self, m->att_spill);
    m->att_spill = NULL;
    m->att_spill_n = 0;
}
