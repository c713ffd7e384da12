/* gpt_parallel.c — what tensor parallelism and canonical mode add to the GPT model
 * (gpt.h): crossing region boundaries through the tp strategy (timed as communication),
 * canonical mode's fixed chunk trees, row- and column-parallel products, the gradients of
 * parameters every tp rank holds, and the vocabulary-parallel cross-entropy.
 */
#include "gpt_internal.h"

#include <stddef.h>
#include <string.h>

#include "base/clock.h"
#include "base/status.h"

double loom_gpt_take_comm_ms(loom_gpt *m)
{
    double ms = m->comm_ms;
    m->comm_ms = 0.0;
    return ms;
}

loom_status gpt_cross(loom_gpt *m, region_hook hook, loom_region r, int layer, const float *in,
                      float *out, size_t rows, size_t width)
{
    if (!m->tp_ops)
        return LOOM_OK;
    loom_region_io io = {in, out, rows, width};
    double t0 = loom_now_ms();
    loom_status st = hook(m->tp_self, r, layer, &io);
    m->comm_ms += loom_now_ms() - t0;
    return st;
}

loom_status gpt_region_wait(loom_gpt *m)
{
    if (!m->tp_ops || !m->tp_ops->region_wait)
        return LOOM_OK;
    double t0 = loom_now_ms();
    loom_status st = m->tp_ops->region_wait(m->tp_self);
    m->comm_ms += loom_now_ms() - t0;
    return st;
}

loom_status gpt_tensor_allreduce(loom_gpt *m, float *x, size_t n, loom_reduce_op op)
{
    if (!m->tp_ops)
        return LOOM_OK;
    double t0 = loom_now_ms();
    loom_status st = m->tp_ops->tensor_allreduce(m->tp_self, x, n, op);
    m->comm_ms += loom_now_ms() - t0;
    return st;
}

/* Canonical mode's chunk tree: chunks pushed in order, equal levels merged older + newer
 * (the binary-counter tree; for a power-of-two count, the balanced pairwise tree). The
 * root lands in dest, the bottom level. */
typedef struct chunk_tree {
    float *level[4];
    int depth, pushed;
    size_t n;
} chunk_tree;

static chunk_tree tree_start(loom_gpt *m, float *dest, size_t n)
{
    chunk_tree t = {{dest, m->tree[0], m->tree[1], m->tree[2]}, 0, 0, n};
    return t;
}

/* Where the next chunk goes. */
static float *tree_slot(chunk_tree *t) { return t->level[t->depth]; }

static void tree_push(loom_gpt *m, chunk_tree *t)
{
    t->depth++;
    for (int c = ++t->pushed; !(c & 1); c >>= 1, t->depth--)
        m->be->ops->accumulate(t->level[t->depth - 2], t->level[t->depth - 1], t->n);
}

/* Chunks this rank holds of a dim split over the tp group. */
static int local_chunks(const loom_gpt *m) { return LOOM_CANONICAL_CHUNKS / m->tp; }

/* Whether the backend has the one-call chunk tree (backend.h's gemm_chunk_tree: the bits
 * of the gemm and accumulate calls below, without a fork and join per chunk). */
static int fused_chunk_tree(const loom_gpt *m)
{
    const loom_backend_ops *k = m->be->ops;
    return k->size > offsetof(loom_backend_ops, gemm_chunk_tree) && k->gemm_chunk_tree;
}

/* out (R,C) = this rank's partial of a row-parallel layer: inp (R,K) @ W (C,K)^T over
 * its K input features (no bias: it is added once, after the sum). */
void gpt_row_parallel_forward(loom_gpt *m, float *out, const float *inp, const float *w,
                              int B, int T, int K)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim, R = B * T;
    if (!m->canonical) {
        gpt_matmul_forward(m, out, inp, w, NULL, B, T, K, C);
        return;
    }
    int n = local_chunks(m), kc = K / n;
    if (fused_chunk_tree(m)) {
        int start = 0;
        k->gemm_chunk_tree(0, 1, R, C, n, 1, &start, &kc, inp, K, w, K, out, C, m->tree);
        return;
    }
    chunk_tree t = tree_start(m, out, (size_t)R * C);
    for (int c = 0; c < n; c++) {
        k->gemm(0, 1, R, C, kc, 1.0f, inp + (size_t)c * kc, K, w + (size_t)c * kc, K, 0.0f,
                tree_slot(&t), C);
        tree_push(m, &t);
    }
}

/* dinp (R,C) = this rank's partial input gradient of a column-parallel layer: dout (R,OC)
 * @ W (OC,C) over its OC output features, which form `segs` equal segments (q, k, v for
 * the fused QKV; one otherwise). Canonical chunk c holds part c of every segment. */
void gpt_column_parallel_dinp(loom_gpt *m, float *dinp, const float *dout, const float *w, int R,
                              int OC, int segs)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim;
    if (!w && !m->canonical) { /* the head, 16-bit (gpt_precision.c) */
        gpt_head_dinp(m, dinp, dout, R);
        return;
    }
    if (!m->canonical) {
        if (!gpt_matmul_backward16(m, dinp, NULL, NULL, dout, NULL, w, 0, 1, R, C, OC))
            k->gemm(0, 0, R, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
        return;
    }
    /* segment widths: the fused qkv's q, k, v (k and v narrower under grouped-query
     * attention), else equal parts */
    int n = local_chunks(m), seg[3], start[3];
    for (int s = 0, at = 0; s < segs; s++) {
        seg[s] = segs == 3 ? (s ? m->KVl : m->Cl) : OC / segs;
        start[s] = at;
        at += seg[s];
    }
    if (w && fused_chunk_tree(m)) {
        int width[3];
        for (int s = 0; s < segs; s++)
            width[s] = seg[s] / n;
        k->gemm_chunk_tree(0, 0, R, C, n, segs, start, width, dout, OC, w, C, dinp, C, m->tree);
        return;
    }
    chunk_tree t = tree_start(m, dinp, (size_t)R * C);
    for (int c = 0; c < n; c++) {
        for (int s = 0; s < segs; s++) {
            int wc = seg[s] / n;
            size_t o = (size_t)start[s] + (size_t)c * wc;
            const float *wo = w ? w + o * C : gpt_head_rows(m, o, (size_t)wc); /* NULL: 16-bit */
            k->gemm(0, 0, R, C, wc, 1.0f, dout + o, OC, wo, C, s ? 1.0f : 0.0f,
                    tree_slot(&t), C);
        }
        tree_push(m, &t);
    }
}

/* Gradients of replicated parameters that are sums over this rank's token rows (layer
 * norms, row-parallel biases). In fast mode without sequence parallelism every rank sees
 * all rows and the kernels accumulate straight into the gradient. Otherwise each gradient
 * is first computed on its own into a slot of the layer's pack (m->rep_grad, C floats a
 * slot): in canonical mode over fixed chunks of R/8 rows (R = B*T) added in the tree; with
 * sequence parallelism each rank's pack is a partial, and rep_flush sums the whole pack
 * over the tp group in one exchange per layer before adding it to the gradients.
 * kind 0: layernorm backward (also writes dinp; two slots, weight then bias), 1: bias,
 * 2: RMSNorm backward (writes dinp; one slot, weight). */
static void rep_rows(loom_gpt *m, int kind, const rep_args *a, float *dw, float *db, size_t r0,
                     size_t rows)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim;
    size_t off = r0 * (size_t)C;
    if (kind == 0)
        k->layernorm_backward(a->dinp + off, dw, db, a->dout + off, a->inp + off, a->w,
                              a->mean + r0, a->rstd + r0, 1, (int)rows, C);
    else if (kind == 2)
        k->rmsnorm_backward(a->dinp + off, dw, a->dout + off, a->inp + off, a->w, a->rstd + r0,
                            rows, C);
    else
        k->bias_backward(db, a->dout + off, rows, C);
}

void gpt_replicated_grads(loom_gpt *m, rep_pack *pk, int kind, const rep_args *a, float *dw,
                          float *db, size_t Rl)
{
    const loom_backend_ops *k = m->be->ops;
    size_t C = (size_t)m->cfg.dim, n = kind == 0 ? 2 * C : C;
    if (!m->canonical && !m->sp) {
        rep_rows(m, kind, a, dw, db, 0, Rl);
        return;
    }
    /* [dw | db], [db] or [dw] */
    float *part = (pk->base ? pk->base : m->rep_grad) + (size_t)pk->n * C;
    if (kind != 1)
        pk->dst[pk->n++] = dw;
    if (kind != 2)
        pk->dst[pk->n++] = db;
#define DW_SLOT(p) (kind != 1 ? (p) : NULL)
#define DB_SLOT(p) (kind == 0 ? (p) + C : kind == 1 ? (p) : NULL)
    if (!m->canonical) {
        k->zero(m->be->self, part, n * sizeof(float));
        rep_rows(m, kind, a, DW_SLOT(part), DB_SLOT(part), 0, Rl);
        return;
    }
    int chunks = m->sp ? local_chunks(m) : LOOM_CANONICAL_CHUNKS;
    size_t rc = Rl / (size_t)chunks;
    /* the backend's one call (its chunks on its threads at once), scratch in a tree level */
    if (kind != 2 && k->size > offsetof(loom_backend_ops, rep_chunk_tree) && k->rep_chunk_tree &&
        (size_t)(chunks - 1) * n <= (size_t)m->max_B * (size_t)m->max_T * C) {
        k->rep_chunk_tree(kind, part, m->tree[0], chunks, a->dinp, a->dout, a->inp, a->w,
                          a->mean, a->rstd, Rl, (int)C);
        return;
    }
    chunk_tree t = tree_start(m, part, n);
    for (int c = 0; c < chunks; c++) {
        float *slot = tree_slot(&t);
        k->zero(m->be->self, slot, n * sizeof(float));
        rep_rows(m, kind, a, DW_SLOT(slot), DB_SLOT(slot), (size_t)c * rc, rc);
        tree_push(m, &t);
    }
#undef DW_SLOT
#undef DB_SLOT
}

loom_status gpt_rep_flush(loom_gpt *m, rep_pack *pk)
{
    size_t C = (size_t)m->cfg.dim;
    float *base = pk->base ? pk->base : m->rep_grad;
    if (pk->n && m->sp)
        LOOM_TRY(gpt_tensor_allreduce(m, base, (size_t)pk->n * C, LOOM_REDUCE_SUM));
    for (int i = 0; i < pk->n; i++)
        m->be->ops->accumulate(pk->dst[i], base + (size_t)i * C, C);
    pk->n = 0;
    return LOOM_OK;
}

/* Vocabulary-parallel cross-entropy over this rank's Vl columns (backend.h's passes) for
 * rows [r0, r0+n): row maxima combined by MAX, the sums of exponentials and the target
 * logits by SUM (the target is in one rank's slice, so that sum is exact). */
static loom_status cross_entropy_rows(loom_gpt *m, size_t r0, int n, float dloss)
{
    const loom_backend_ops *k = m->be->ops;
    int V = m->cfg.vocab, Vl = m->Vl, v0 = m->v0;
    float *logits = m->logits + r0 * (size_t)Vl, *row_max = m->ce_max + r0;
    float *sumexp = m->ce_stats + 2 * r0, *tlogit = sumexp + n; /* one exchange for both */
    const int *targets = m->targets + r0;
    k->ce_row_max(row_max, logits, n, Vl, v0, V);
    LOOM_TRY(gpt_tensor_allreduce(m, row_max, (size_t)n, LOOM_REDUCE_MAX));
    if (!m->canonical) {
        k->ce_row_sumexp(sumexp, logits, row_max, n, Vl, v0, V, 0, Vl);
    } else {
        int chunks = local_chunks(m), wc = Vl / chunks;
        chunk_tree t = tree_start(m, sumexp, (size_t)n);
        for (int c = 0; c < chunks; c++) {
            k->ce_row_sumexp(tree_slot(&t), logits, row_max, n, Vl, v0, V, c * wc, (c + 1) * wc);
            tree_push(m, &t);
        }
    }
    k->ce_target_logit(tlogit, logits, targets, n, Vl, v0);
    LOOM_TRY(gpt_tensor_allreduce(m, sumexp, 2 * (size_t)n, LOOM_REDUCE_SUM));
    k->ce_finish(logits, m->losses + r0, row_max, sumexp, tlogit, targets, dloss, n, Vl, v0, V);
    return LOOM_OK;
}

/* The passes read the (R, Vl) logits three times. With one rank they run over blocks of
 * rows small enough to stay in cache between passes (about 4 MiB of logits, all rows of a
 * byte-level vocabulary; at least 32 rows, 6.4 MiB of GPT-2's), the same operations row by
 * row, so the same bits; with tensor parallelism over all rows at once, so each pass's
 * statistics cross the group in one exchange. A multiple of 32 rows: the sum-of-exponentials
 * pass works in blocks of 8 rows over the threads, and 20 rows (8, 8, 4) left one of 2
 * threads idle for half of it. */
static size_t ce_block_rows(const loom_gpt *m, int R)
{
    if (m->tp_ops)
        return (size_t)R;
    size_t block = ((size_t)4 << 20) / ((size_t)m->Vl * sizeof(float)) / 32 * 32;
    return block < 32 ? 32 : block;
}

loom_status gpt_vocab_cross_entropy(loom_gpt *m, int R, float dloss)
{
    size_t block = ce_block_rows(m, R);
    for (size_t r0 = 0; r0 < (size_t)R; r0 += block) {
        size_t n = (size_t)R - r0 < block ? (size_t)R - r0 : block;
        LOOM_TRY(cross_entropy_rows(m, r0, (int)n, dloss));
    }
    return LOOM_OK;
}

/* The gradient half of a cross-entropy run earlier with dloss = 0 (the logits left intact,
 * the row statistics kept in the slot's ce_max / ce_stats): ce_finish again over the same
 * blocks, so each row reads the same maximum, sum and target logit at the same place and
 * computes the same bits it would have in the fused run (its loss is written again, the
 * same value). No exchange: the statistics were combined in the forward. */
void gpt_vocab_cross_entropy_grad(loom_gpt *m, int R, float dloss)
{
    const loom_backend_ops *k = m->be->ops;
    int V = m->cfg.vocab, Vl = m->Vl, v0 = m->v0;
    size_t block = ce_block_rows(m, R);
    for (size_t r0 = 0; r0 < (size_t)R; r0 += block) {
        size_t n = (size_t)R - r0 < block ? (size_t)R - r0 : block;
        float *sumexp = m->ce_stats + 2 * r0, *tlogit = sumexp + n; /* cross_entropy_rows' */
        k->ce_finish(m->logits + r0 * (size_t)Vl, m->losses + r0, m->ce_max + r0, sumexp,
                     tlogit, m->targets + r0, dloss, (int)n, Vl, v0, V);
    }
}

/* Under sequence parallelism, all-gather a layernorm output again for the weight gradient
 * of the column-parallel layer it feeds (forward kept only this rank's shard). */
loom_status gpt_regather(loom_gpt *m, loom_region r, int layer, const float *local, float *full,
                         size_t R)
{
    return m->sp ? F_ENTER(r, layer, local, full, R, (size_t)m->cfg.dim) : LOOM_OK;
}

/* Backward of a column-parallel layer (its input `inp`, all R rows): weight and bias
 * gradients, and the partial input gradient into m->dpartial, summed over the group by
 * the region's f backward into m->dsummed. The sum runs while the weight gradient is
 * computed where the communicator can overlap. */
loom_status gpt_column_parallel_backward(loom_gpt *m, loom_region r, int layer, float *dw,
                                         float *db, const float *dout, const float *inp,
                                         const float *w, int B, int T, int OC, int segs)
{
    int C = m->cfg.dim, R = B * T;
    gpt_column_parallel_dinp(m, m->dpartial, dout, w, R, OC, segs);
    LOOM_TRY(B_ENTER(r, layer, m->dpartial, m->dsummed, (size_t)R, (size_t)C));
    gpt_matmul_backward(m, NULL, dw, db, dout, inp, w, B, T, C, OC);
    return gpt_region_wait(m);
}

loom_status gpt_column_parallel_backward_input(loom_gpt *m, loom_region r, int layer,
                                               const float *dout, const float *w, int B, int T,
                                               int OC, int segs)
{
    int C = m->cfg.dim, R = B * T;
    gpt_column_parallel_dinp(m, m->dpartial, dout, w, R, OC, segs);
    LOOM_TRY(B_ENTER(r, layer, m->dpartial, m->dsummed, (size_t)R, (size_t)C));
    return gpt_region_wait(m);
}

int loom_gpt_row_multiple(const loom_gpt *m) { return m->sp ? m->tp : 1; }

loom_status loom_gpt_logits_row(loom_gpt *m, size_t row, float *host_out)
{
    const loom_backend_ops *k = m->be->ops;
    const float *src = m->logits + row * (size_t)m->Vl;
    if (!m->tp_ops) {
        k->copy_to_host(m->be->self, host_out, src, (size_t)m->Vl * sizeof(float));
        return LOOM_OK;
    }
    /* every rank's columns gathered in the backend's memory (the strategy's buffers are
     * the backend's: a device one's group carries device memory), then the row to the host */
    LOOM_TRY(m->tp_ops->tensor_allgather(m->tp_self, src, m->row_gather, (size_t)m->Vl));
    k->copy_to_host(m->be->self, host_out, m->row_gather,
                    (size_t)m->cfg.vocab_padded * sizeof(float));
    return LOOM_OK;
}
