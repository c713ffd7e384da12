/* zero_ep_internal.h — what zero_ep.c (stage 1's partitions, the gather, checkpoints) and
 * zero_ep_reduce.c (stage 2's reduce-scatters) share under expert parallelism (zero_ep.c
 * describes the layout). */
#ifndef LOOM_CORE_ZERO_EP_INTERNAL_H
#define LOOM_CORE_ZERO_EP_INTERNAL_H

#include "zero_internal.h"

typedef struct ep_run {  /* one entry of the kind: flat [flat, +n) at packed [packed, +n) */
    int entry;
    size_t flat, packed, n;
} ep_run;

typedef struct ep_part { /* one kind's partition over one group */
    const struct loom_comm_ops *comm; /* the group for the buffers' memory: a device */
    void *group;                      /* backend's device group (zero_device.c), else host */
    const struct loom_comm_ops *hcomm; /* the same ranks' host group: host memory's */
    void *hgroup;                      /* collectives (a checkpoint's whole state) */
    int n, rank;
    ep_run *runs;
    int n_runs;
    size_t K, Kp, want;  /* packed floats, padded to U x n, the bucket length */
    size_t pos0;         /* where this kind's partition starts in the rank's (state / slots) */
    size_t *cuts;        /* stage 3: the buckets' boundaries (0, each unit's start rounded
                          * down and up to U x n, Kp), n_cuts of them; NULL: every want */
    int n_cuts;
} ep_part;

/* The length of part p's bucket starting at packed lo (a bucket boundary below Kp). */
size_t zero_ep_bucket_len(const ep_part *p, size_t lo);

/* Stage 2: one bucket of one kind, in the order backward finishes them. */
typedef struct ep_bucket {
    int kind;            /* 0 dense (over dp), 1 experts (over edp) */
    size_t lo, len;      /* packed [lo, lo + len) of the kind */
    size_t flat_lo;      /* the lowest flat offset it reads (total: only padding): it is
                          * final once backward has reported everything from there up */
} ep_bucket;

typedef struct ep_flight {
    loom_comm_request *req; /* NULL: a group of one, nothing to wait for */
    int bucket;
    float *send;         /* the packed bucket */
    float *slot;         /* staging to add into the partition, or NULL: received in place */
} ep_flight;

/* Stage 3 (zero_ep_gather.c): one unit's all-gathers in flight, in a staging slot. */
typedef struct ep_slot_bucket {
    int kind;
    size_t lo, len;           /* packed [lo, lo + len) of the kind */
    loom_comm_request *req;   /* NULL: a group of one (src is the partition) or done */
    const float *src;         /* the bucket's floats once gathered: packed lo at src[0] */
} ep_slot_bucket;

typedef struct ep_slot {
    int unit;                 /* -1: free */
    float *staging;
    size_t used, floats;      /* floats of staging in use (floats: init's probe) */
    ep_slot_bucket *bk;
    int n_req;
} ep_slot;

struct zero_ep {
    ep_part part[2];     /* dense over dp, experts over edp */
    float *staging;      /* one bucket */
    /* stage 2 (zero_ep_reduce.c) */
    ep_bucket *bk;
    int n_bk, next;      /* next: the first bucket of bk not started this backward */
    float *send, *recv;  /* ZERO_SLOTS packed buckets; ZERO_SLOTS sub-blocks (accum > 1) */
    size_t send_len, recv_len; /* floats per slot */
    ep_flight flight[ZERO_SLOTS];
    int n_flight, next_slot;
    /* stage 3 (zero_ep_params.c): unit u's packed range of kind k, [ulo, uhi) at 2u + k */
    size_t *ulo, *uhi;
    ep_slot slot[2];     /* the unit in use and the one gathered ahead (zero_ep_gather.c) */
    size_t slot_floats;  /* each slot's staging */
    int prefetch;        /* moe.zero_prefetch: the pass's next unit gathered ahead */
};

/* fn for each piece of packed [a, e) of part p: its entry, flat offset, length and
 * packed offset. */
typedef void ep_piece_fn(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed);
void zero_ep_each_piece(const ep_part *p, size_t a, size_t e, ep_piece_fn *fn, void *ctx);

/* zero_ep_reduce.c: stage 2's buckets and buffers (after the partitions are made). */
loom_status zero_ep_reduce_init(loom_zero *z);
void zero_ep_reduce_free(loom_zero *z);
loom_status zero_ep_begin_micro(loom_zero *z, int a);
loom_status zero_ep_grads_ready(loom_zero *z, size_t offset);
loom_status zero_ep_finish_micro(loom_zero *z);
loom_status zero_ep_reduce_held(loom_zero *z);

/* zero_ep_params.c: stage 3's parameter partition (after the segments are made): this
 * rank's pieces copied in from the initial values, the units found, the hook installed;
 * pin as loom_zero_pin_params. */
loom_status zero_ep_params_init(loom_zero *z);
loom_status zero_ep_pin_params(loom_zero *z, int pin);
/* Under stage 3, before the partition changes (the optimizer step): every unit's gather
 * still in flight finished (its values are then stale, as every unit's); the next pass
 * counted as going up. */
loom_status zero_ep_params_drain(loom_zero *z);

/* zero_ep_gather.c: two staging slots sized for the largest unit (after the units' ranges
 * are known); start unit u's gathers into a free slot; finish them (wait, unpack into the
 * model's buffer, free the slot); the slot holding unit u, or a free one for u = -1. */
loom_status zero_ep_slots_init(loom_zero *z);
void zero_ep_slots_free(loom_zero *z);
loom_status zero_ep_start_unit(loom_zero *z, int u);
loom_status zero_ep_finish_unit(loom_zero *z, int u);
ep_slot *zero_ep_slot_of(loom_zero *z, int u);

#endif
