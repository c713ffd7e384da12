/* compress_internal.h — what compress.c and compress_powersgd.c share (compress.h). */
#ifndef LOOM_CORE_COMPRESS_INTERNAL_H
#define LOOM_CORE_COMPRESS_INTERNAL_H

#include "compress.h"

typedef struct bucket {
    size_t lo, n; /* [lo, lo + n) of the gradient buffer */
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
};

/* 1-bit Adam around the exchange: the local gradient of bucket i into this rank's share of
 * the momentum, before packing; the summed momentum back into the gradient AdamW's
 * update turns into it, after. No-ops without set_momentum. */
void momentum_before(loom_compress *c, int i, float *g);
void momentum_after(loom_compress *c, int i, float *g);


/* powersgd: buckets (b->n = rows x cols, b->k = cols, 0: sent raw), message sizes. */
loom_status powersgd_plan(loom_compress *c, loom_gpt *m);
loom_status powersgd_exchange(loom_compress *c, float *grads);

#endif
