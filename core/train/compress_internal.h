/* compress_internal.h — what compress.c and compress_powersgd.c share (compress.h). */
#ifndef LOOM_CORE_COMPRESS_INTERNAL_H
#define LOOM_CORE_COMPRESS_INTERNAL_H

#include "compress.h"

typedef struct bucket {
    size_t lo, n; /* [lo, lo + n) of the gradient buffer; strided (width > 0): n elements
                   * from lo, below */
    /* Canonical mode (compress_canon.c): a bucket is elements [first, first + n) of a box of
     * the logical tensor (a chunk along its split dim), row-major in the box, which lies in
     * the buffer as rows of `width` floats `stride` apart from lo; width 0: contiguous. */
    size_t width, stride, first;
    uint64_t id;  /* canonical powersgd: the box's layout-independent id (seeds its Q) */
    size_t k;     /* topk: elements sent; powersgd: the matrix's columns, 0: sent raw */
    size_t at;    /* onebit: byte offset of its bits; topk: its first value / index slot;
                   * powersgd: its P's first float (raw: its first float after every P) */
    size_t q_at;  /* powersgd: its Q's first float */
} bucket;

struct loom_compress {
    loom_compress_config cfg;
    const loom_comm_ops *comm;
    void *dp;
    int dp_size, dp_rank;
    size_t total, elems, max_n, sum_k;
    bucket *b;
    int nb;
    float *residual;              /* total floats */
    unsigned char *msg, *gathered; /* msg_bytes, dp_size * msg_bytes */
    size_t msg_bytes;
    float *scratch;               /* topk: |v| of one bucket */
    uint32_t *pick;               /* topk: the chosen indices of one bucket */
    /* powersgd (compress_powersgd.c) */
    int64_t step;                 /* the step being exchanged: seeds the random Q */
    size_t sum_p, sum_q, sum_raw; /* floats of all P (n r), all Q (m r), raw tensors */
    float *p_sum, *q_mine, *q_sum; /* sum_p, sum_q, sum_q floats */
    /* 1-bit Adam (compress_momentum.c): each bucket's first moment in AdamW's state */
    const float **bucket_m;        /* nb pointers, NULL: off */
    /* a device backend's AdamW state: m_host holds each segment's m at its gradient offset
     * (the gradient buffer's layout), copied in by loom_compress_momentum_pull */
    struct loom_backend *m_be;     /* NULL: bucket_m points into the (host) state itself */
    float *m_host;
    struct m_seg { const float *state; size_t lo, n; } *m_segs;
    int n_m_segs;
    /* canonical mode */
    float *strided_g;             /* 2 max_n floats: a strided bucket's gradient and residual,
                                   * gathered */
    unsigned char *leaf_bad;      /* leaves: leaf a's gradient held an inf or nan */
    int held_leaves;              /* powersgd: leaves packed this step */
    /* expert parallelism (loom_compress_add_experts) */
    int dense_only;               /* under ep, this one takes the dense entries */
    struct loom_compress *experts; /* the expert entries' over the edp group; NULL: none */
    int borrowed;                 /* residual is the dense compressor's: not freed here */
};

/* Whether table entry i is one this compressor packs: held by this rank and, under ep, of
 * its part (the dense entries over dp, or the expert entries over edp). */
int compress_takes(const loom_compress *c, loom_gpt *m, int i);

/* A strided bucket's element j: its offset from b->lo. */
static inline size_t bucket_at(const bucket *b, size_t j)
{
    if (!b->width)
        return j;
    size_t x = b->first + j;
    return (x / b->width) * b->stride + x % b->width;
}
/* The elements of bucket b one after another: from base = buf + b->lo into out, and back. */
void bucket_gather(const bucket *b, const float *base, float *out);
void bucket_scatter(const bucket *b, const float *in, float *base);
/* One past the bucket's last element, from b->lo. */
size_t bucket_extent(const bucket *b);

/* Canonical mode's buckets (compress_canon.c): each held tensor's canonical chunks (the
 * LOOM_CANONICAL_CHUNKS boxes along its split dim, as grad_norm.h; a tensor never split,
 * or whose split dim does not divide, whole), the same elements in the same order at any
 * tp; onebit and topk cut each box into pieces of at most bucket_mb, powersgd takes each
 * box as a matrix (cols: the box's last dim). */
loom_status canon_plan(loom_compress *c, loom_gpt *m);
/* canonical powersgd (compress_powersgd_leaves.c): leaf a's P from its gradient (the buckets
 * starting in [lo, hi)), and after
 * the step's leaves the two all-gathers and trees; grads gets the decompressed sum. */
loom_status powersgd_leaf(loom_compress *c, int a, float *grads, size_t lo, size_t hi);
struct loom_backend;
loom_status powersgd_finish_leaves(loom_compress *c, struct loom_backend *be, float *grads);
/* onebit and topk (compress.c): bucket b's k and message slot, the running bit and value
 * counts advanced; after the last bucket, the message's size from them. */
void code_bucket_place(loom_compress *c, bucket *b, size_t *bits_at, size_t *k_at);
void code_message_size(loom_compress *c, size_t bits_at, size_t k_at);
/* The first `bytes` of c->msg all-gathered over dp into c->gathered (one rank: copied). */
loom_status compress_gather(loom_compress *c, size_t bytes);
/* powersgd's products and Gram-Schmidt (compress_powersgd.c), in double, index order. */
void powersgd_mul(const float *M, const float *Q, size_t rows, size_t cols, size_t r, float *out);
void powersgd_mul_t(const float *M, const float *P, size_t rows, size_t cols, size_t r, float *out);
void powersgd_orthonormalize(float *P, size_t rows, size_t r);

/* 1-bit Adam around the exchange: the local gradient of bucket i into this rank's share of
 * the momentum, before packing; the summed momentum back into the gradient AdamW's
 * update turns into it, after. No-ops without set_momentum. */
void momentum_before(loom_compress *c, int i, float *g);
void momentum_after(loom_compress *c, int i, float *g);


/* powersgd: buckets (b->n = rows x cols, b->k = cols, 0: sent raw), message sizes. */
loom_status powersgd_plan(loom_compress *c, loom_gpt *m);
loom_status powersgd_exchange(loom_compress *c, float *grads);

#endif
