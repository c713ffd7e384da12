/* compress_canon.c — canonical mode's buckets: fixed boxes of each logical tensor, the same
 * elements in the same order whatever tp, pp or dp a run has (compress_internal.h).
 *
 * Why boxes: a compressor is nonlinear per bucket (onebit's scale is the bucket's mean |v|,
 * topk picks within the bucket, powersgd factors the bucket as a matrix), so canonical mode's
 * promise needs buckets defined on the logical tensor, not on what a rank holds. The boxes
 * are grad_norm.h's canonical chunks: LOOM_CANONICAL_CHUNKS equal boxes along the entry's
 * split dim (whether or not this run splits it), each held whole by exactly one tp rank at
 * any tp up to that many; an entry that is never split, or whose split dim does not divide
 * into the chunks, is one box (and then may not be split: refused, naming it). A box lies in
 * the buffer as `outer` rows of cs x inner floats, a row stride of the slice's dim apart:
 * contiguous when there is one row or the slice is the box.
 */
#include "compress_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "loom/plugin/strategy.h"
#include "model/gpt_stage.h"

void bucket_gather(const bucket *b, const float *base, float *out)
{
    for (size_t j = 0; j < b->n; j++)
        out[j] = base[bucket_at(b, j)];
}

void bucket_scatter(const bucket *b, const float *in, float *base)
{
    for (size_t j = 0; j < b->n; j++)
        base[bucket_at(b, j)] = in[j];
}

size_t bucket_extent(const bucket *b) { return b->n ? bucket_at(b, b->n - 1) + 1 : 0; }

/* One box of entry e: its first float, rows, width and stride in this rank's buffer, the
 * box's element count and its last dim (powersgd's cols). */
typedef struct box {
    size_t lo, rows, width, stride, n, cols;
    uint64_t id;
} box;

/* Entry e's boxes this rank holds into out (at most LOOM_CANONICAL_CHUNKS); how many, or -1
 * with the error set when a split does not fall on the chunks. */
static int entry_boxes(const loom_param_entry *e, box *out)
{
    int d = e->split_dim, nd = e->ndim;
    uint64_t id = loom_rng_stream(e->name);
    int split = d >= 0 && e->slice_len[d] != e->shape[d];
    if (d < 0 || e->shape[d] % LOOM_CANONICAL_CHUNKS != 0) {
        if (split) {
            loom_fail(LOOM_ERR_UNSUPPORTED, "canonical compression under tp splits each tensor "
                      "at fixed chunks: dim %d of %s (%lld) must divide by %d", d, e->name,
                      (long long)e->shape[d], LOOM_CANONICAL_CHUNKS);
            return -1;
        }
        out[0] = (box){e->offset, 1, 0, 0, e->numel, (size_t)e->slice_len[nd - 1], id};
        return 1;
    }
    int64_t cs = e->shape[d] / LOOM_CANONICAL_CHUNKS;
    if (e->slice_len[d] % cs != 0 || e->slice_start[d] % cs != 0) {
        loom_fail(LOOM_ERR_UNSUPPORTED, "canonical compression: this rank's slice of %s "
                  "(dim %d, %lld of %lld) is not whole chunks of %lld (tp > %d?)", e->name, d,
                  (long long)e->slice_len[d], (long long)e->shape[d], (long long)cs,
                  LOOM_CANONICAL_CHUNKS);
        return -1;
    }
    size_t outer = 1, inner = 1;
    for (int i = 0; i < d; i++)
        outer *= (size_t)e->slice_len[i];
    for (int i = d + 1; i < nd; i++)
        inner *= (size_t)e->slice_len[i];
    size_t width = (size_t)cs * inner, stride = (size_t)e->slice_len[d] * inner;
    size_t cols = d == nd - 1 ? (size_t)cs : (size_t)e->slice_len[nd - 1];
    int64_t first = e->slice_start[d] / cs, k = e->slice_len[d] / cs;
    for (int64_t c = 0; c < k; c++) {
        int strided = outer > 1 && width != stride;
        out[c] = (box){e->offset + (size_t)c * width, outer, strided ? width : 0, stride,
                       outer * width, cols, loom_rng_mix(id + (uint64_t)(first + c))};
    }
    return (int)k;
}

static int skipped(const loom_compress *c, const loom_gpt *m, const loom_param_entry *e)
{
    return loom_gpt_held_elsewhere(m, e->name) || !e->numel ||
           (c->cfg.skip_tied && !strcmp(e->name, "wte"));
}

/* Bucket b for box x, elements [first, first + n). */
static void set_bucket(bucket *b, const box *x, size_t first, size_t n)
{
    b->lo = x->lo;
    b->width = x->width;
    b->stride = x->stride;
    b->first = first;
    b->n = n;
    b->id = x->id;
    if (!b->width) { /* contiguous: start at the piece */
        b->lo += first;
        b->first = 0;
    }
}

loom_status canon_plan(loom_compress *c, loom_gpt *m)
{
    const loom_param_table *t = loom_gpt_params(m);
    int psgd = c->cfg.method == LOOM_COMPRESS_POWERSGD;
    size_t cap = c->cfg.bucket_mb > 0 ? (size_t)(c->cfg.bucket_mb * 1024 * 1024 / sizeof(float)) : 1u << 20;
    cap = psgd ? SIZE_MAX : cap < 1 ? 1 : cap;
    box bx[LOOM_CANONICAL_CHUNKS];
    size_t nb = 0;
    for (int i = 0; i < t->count; i++) {
        if (skipped(c, m, &t->entries[i]))
            continue;
        int k = entry_boxes(&t->entries[i], bx);
        if (k < 0)
            return LOOM_ERR_UNSUPPORTED;
        for (int j = 0; j < k; j++)
            nb += 1 + (bx[j].n - 1) / cap;
    }
    if (!(c->b = calloc(nb ? nb : 1, sizeof *c->b)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for compression buckets");
    size_t bits_at = 0, k_at = 0, r = (size_t)c->cfg.rank;
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        if (skipped(c, m, e))
            continue;
        int k = entry_boxes(e, bx);
        for (int j = 0; j < k; j++)
            for (size_t at = 0; at < bx[j].n; at += cap) {
                bucket *b = &c->b[c->nb++];
                set_bucket(b, &bx[j], at, bx[j].n - at < cap ? bx[j].n - at : cap);
                if (psgd) { /* a matrix where its factors are smaller, else raw */
                    size_t cols = bx[j].cols, rows = b->n / cols;
                    b->k = e->ndim >= 2 && r * (rows + cols) < b->n ? cols : 0;
                    b->at = b->k ? c->sum_p : c->sum_raw;
                    b->q_at = c->sum_q;
                    c->sum_p += b->k ? rows * r : 0;
                    c->sum_q += b->k ? cols * r : 0;
                    c->sum_raw += b->k ? 0 : b->n;
                    c->elems += b->n;
                    c->max_n = b->n > c->max_n ? b->n : c->max_n;
                } else {
                    code_bucket_place(c, b, &bits_at, &k_at);
                }
            }
    }
    if (psgd) {
        c->msg_bytes = (c->sum_p + c->sum_raw + c->sum_q) * sizeof(float);
        c->p_sum = malloc((c->sum_p + c->sum_raw + 1) * sizeof(float));
        c->q_mine = malloc(((size_t)c->cfg.leaves * c->sum_q + 1) * sizeof(float));
        c->q_sum = malloc((c->sum_q + 1) * sizeof(float));
        if (!c->p_sum || !c->q_mine || !c->q_sum)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for PowerSGD's factors");
    } else {
        code_message_size(c, bits_at, k_at);
    }
    if (!(c->strided_g = malloc((2 * c->max_n + 1) * sizeof(float))) ||
        !(c->leaf_bad = calloc((size_t)c->cfg.leaves + 1, 1)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for canonical compression's scratch");
    return LOOM_OK;
}
