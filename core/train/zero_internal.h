/* zero_internal.h — what zero.c and zero_reduce.c share (see zero.h). */
#ifndef LOOM_CORE_ZERO_INTERNAL_H
#define LOOM_CORE_ZERO_INTERNAL_H

#include "zero.h"

#include "loom/plugin/comm.h"

#define ZERO_ALIGN 16        /* floats: the parameter table's alignment (params.c) */
#define ZERO_MAX_INFLIGHT 64 /* parameter all-gathers queued at once */
#define ZERO_SLOTS 2         /* stage 2: reduce-scatters in flight, each with a staging slot */

typedef struct zero_bucket {
    size_t lo, len;      /* [lo, lo+len) of the padded buffer; len a multiple of U*N */
    size_t sub;          /* len / N: each rank's sub-block */
    size_t part_off;     /* lo / N: where this bucket's sub-block sits in the partition */
} zero_bucket;

#define ZERO_UNIT_BUCKETS 8 /* stage 3: buckets one unit spans at most */

typedef struct zero_unit {       /* stage 3: one unit of the model (gpt.h) */
    int state;                   /* zero_params.c: STALE, READING, GATHERING, RESIDENT */
    int empty;                   /* a pipeline stage holds none of it: never gathered */
    int first_bucket, last_bucket;
    loom_comm_request *req[ZERO_UNIT_BUCKETS];
    int n_req;
    size_t inner_lo, inner_hi;   /* the pages only this unit touches, as elements */
    float *bring;                /* params offloaded: this unit's partition, read out of the
                                  * offload for its all-gathers in flight, or NULL */
    size_t bring_floats;
    int held;                    /* a sparse device buffer: its range committed (zero_sparse.c) */
} zero_unit;

typedef struct zero_reader zero_reader;

typedef struct zero_flight {
    loom_comm_request *req;
    int bucket;
    float *slot;         /* staging to add into the partition, or NULL: received in place */
} zero_flight;

struct loom_zero {
    int stage, reduces, accum;
    loom_gpt *model;
    loom_backend *be;
    const struct loom_comm_ops *comm, *tp_comm;
    void *dp, *tp;
    int n, rank, tp_size, tp_rank;
    size_t total, padded, part, max_len;
    int whole_grads;     /* loom_zero_config.whole_grads: no sparse gradient buffer */
    int undrawn;         /* stage 3, partitioned construction: the initial values not in
                          * the model's buffer; draw_seed draws this rank's partition */
    uint64_t draw_seed;
    zero_bucket *buckets;
    int n_buckets;
    loom_optim_segment *segments;
    int *seg_entry;      /* the parameter-table entry of each segment */
    int first_bad;       /* the last norm's first entry with an inf or nan here, or -1 */
    int n_segments;
    float *state;        /* NULL when offloaded */
    size_t state_floats;
    size_t *seg_state_off; /* each segment's state offset in the state, in floats */
    float *tail;         /* U*N floats: the tail bucket's send/recv staging */
    /* stage 2 */
    float *part_grads;   /* P/N floats: this rank's gradient partition */
    float *staging;      /* slots * max sub-block, with accum > 1 only */
    size_t staging_floats;
    zero_flight flight[ZERO_SLOTS];
    int n_flight, next_slot, slots; /* slots: reduce-scatters in flight at most */
    int micro, next_bucket; /* buckets next_bucket..0 are still to reduce this backward */
    size_t watermark;    /* gradients at [watermark, total) are final */
    int deferred;        /* under pp: a backward's end leaves its buckets in flight
                          * (loom_zero_pipelined; zero_reduce.c's head comment) */
    struct loom_trace *trace; /* reduce_scatter spans (trace.h), or NULL */
    double rs_first;     /* when the reduce-scatters in flight began (loom_now_ms), < 0: none */
    int rs_mb, rs_chunk, tr_mb, tr_chunk; /* the span's labels, and those of the next one */
    int rs_buckets, rs_during; /* the span's buckets, and those its backward's reports started */
    size_t hold_hi;      /* under pp: buckets starting below it (the tied wte's) are reduced
                          * once, after the wte exchange (loom_zero_reduce_held) */
    int skip_entry;      /* under pp, the last stage: its wte copy, left out of the norm */
    size_t page;
    unsigned char *pages; /* mincore's vector over the gradient buffer */
    size_t n_pages;
    size_t resident_peak;
    /* stage 3 */
    zero_unit *units;
    int n_units, last_unit, pinned;
    int staged;          /* a pipeline stage: it hints the next unit itself */
    float *part_params;  /* P/N floats: this rank's partition of the parameters (NULL when
                          * params are offloaded: `store` holds them) */
    int params_offloaded;
    struct loom_offload *store; /* params offloaded: the offload holding the partition */
    struct zero_reader *reader; /* its reads' thread (zero_params_read.c), or NULL */
    size_t *seg_pos;     /* each segment's place in the partition, in floats */
    size_t bring_now, bring_peak; /* staging floats held now, and their peak */
    float *tail3;        /* U*N floats: the tail bucket's gather staging */
    unsigned char *param_pages;
    size_t n_param_pages, params_peak;
    double comm_ms;
    struct zero_ep *ep;  /* expert parallelism: stage 1's two packed partitions (zero_ep.c) */
    int master16;        /* stages 1, 2 with 16-bit weights: part_params is the fp32 master
                          * and the model's fp32 buffer is address space (zero_master.c) */
    int kept, kept_first, kept_last; /* master16: buckets kept_first .. kept_last of that
                          * buffer are kept whole in fp32 for a reader (loom_zero_keep_master) */
    /* a device backend (zero_device.c): state, part_grads, staging and tail are its
     * memory; comm/dp are the device dp group, hcomm/hdp the host one (the norm's
     * exchange); host_state the state's host mirror. Host memory: hcomm = comm. */
    int device;
    const struct loom_comm_ops *hcomm;
    void *hdp;
    float *host_state;
    float *host_part;    /* stage 3: the parameter partition's host mirror */
    /* with the backend's vm ops (zero_sparse.c): the model's gradient (reducing) and
     * parameter (stage 3) buffers as sparse ranges, and which buckets hold gradients */
    struct zero_sparse *gsparse, *psparse;
    unsigned char *bucket_held;
    /* master16 on a sparse parameter buffer: what of it is committed (zero_master.c): the
     * kept buckets' span [held_lo, held_hi), and the whole buffer while a reader or writer
     * of the whole master has it (held_whole) */
    size_t held_lo, held_hi;
    int held_whole;
};

loom_status zero_reduce_init(loom_zero *z);
/* zero_device.c: ZeRO's buffers in the backend's memory where it is a device's (zeroed
 * allocations, cleared, freed; copy: buffer to buffer, bits unchanged), host memory
 * otherwise; init takes the device dp group (ep takes zero_ep.c's path); state
 * allocates the state partition and its host mirror. */
float *zero_buf_alloc(loom_zero *z, size_t floats);
void zero_buf_free(loom_zero *z, float *p);
void zero_buf_clear(loom_zero *z, float *p, size_t floats);
loom_status zero_buf_copy(loom_zero *z, float *dst, const float *src, size_t floats);
loom_status zero_buf_copy_bytes(loom_zero *z, void *dst, const void *src, size_t bytes);
/* The same, many small runs (ep's packing and unpacking, zero_ep*.c): a device's by the
 * backend's ops (loom_backend_copy_bits: no host bounce), host memory by memcpy. */
void zero_buf_move(loom_zero *z, float *dst, const float *src, size_t floats);
loom_status zero_device_init(loom_zero *z, const loom_zero_config *c);
loom_status zero_device_state(loom_zero *z, int offloaded);
/* zero_device.c, stage 3 and master16: part_params and its host mirror in the backend's
 * memory, this rank's partition of the model's initial values copied in (through the host);
 * params offloaded: the host mirror alone, which loom_zero_attach_params stores and frees. */
loom_status zero_device_params(loom_zero *z);
/* zero_sparse.c, sparse model buffers (the backend's vm ops; none: no-ops, today's whole
 * allocations): sparse swaps the buffers in after the inits; bucket_hold commits bucket
 * k's gradient range (backward writes it: the model's grad-write hook, and before it is
 * sent), bucket_done zeroes and decommits it once reduced (0: not sparse, the caller
 * clears); unit_hold commits unit u's parameter range before its gather, unit_drop
 * decommits it at release (0: not sparse). The peaks are the committed bytes'. Under ep
 * (zero_ep*.c) k is a packed bucket (zero_ep_reduce.c's bk[k], its pieces one range each)
 * and a unit's range its entries' span. */
typedef struct zero_sparse zero_sparse;
loom_status zero_device_sparse(loom_zero *z);
void zero_device_sparse_free(loom_zero *z);
loom_status zero_device_bucket_hold(loom_zero *z, int k);
int zero_device_bucket_done(loom_zero *z, int k);
loom_status zero_device_unit_hold(loom_zero *z, int u);
int zero_device_unit_drop(loom_zero *z, int u);
/* master16 on a sparse parameter buffer (zero_master.c): [lo, hi) committed, or let go
 * (0: not sparse, the buffer is whole). */
loom_status zero_device_range_hold(loom_zero *z, size_t lo, size_t hi);
int zero_device_range_drop(loom_zero *z, size_t lo, size_t hi);
size_t zero_device_grads_peak(const loom_zero *z);
size_t zero_device_params_peak(const loom_zero *z);
void zero_reduce_free(loom_zero *z);
loom_status zero_params_init(loom_zero *z);
/* Partitioned construction: this rank's sub-block of every bucket of the initial values,
 * drawn into part (P/N floats; zeros past the buffer's end), bitwise the whole draw's. */
void zero_draw_partition(const loom_zero *z, float *part);
/* zero_master.c: this rank's partition of params (the model's flat buffer) into part: the
 * sub-block of every bucket, zeros past the buffer's end. */
void zero_copy_partition(const loom_zero *z, const float *params, float *part);
/* zero_master.c: stages 1 and 2 with 16-bit weights: part_params from the model's initial
 * values, the model told the master lives here, its fp32 buffer's pages released. */
loom_status zero_master_init(loom_zero *z);
/* LOOM_ZERO_MASTER=whole: every rank keeps the whole fp32 master as before this file (the
 * A/B the tests and scripts/bench-zero-layouts compare against); unset or "part": the
 * partition. */
int zero_master_whole(void);
/* zero.c: buckets k0 .. k1 all-gathered in fp32 in place in the model's buffer (each
 * rank's sub-blocks already written there): what stages 1 and 2 do after a step in fp32. */
loom_status zero_gather_f32(loom_zero *z, int k0, int k1);
/* zero_master.c, master16: the kept buckets (loom_zero_keep_master) whole again from the
 * partitions (a collective over dp; nothing when none is kept), after every step's and
 * load's gather of the compute copy; the floats they span in the model's buffer. */
loom_status zero_master_gather_kept(loom_zero *z);
size_t zero_master_kept_floats(const loom_zero *z);
void zero_params_free(loom_zero *z);
/* zero_ep.c: stage 1 under expert parallelism — the dense entries partitioned over dp,
 * the experts' over their edp group, each packed (zero.h). */
loom_status zero_ep_create(const loom_zero_config *c, loom_gpt *m, loom_backend *be,
                           loom_zero **out);
void zero_ep_free(loom_zero *z);
loom_status zero_ep_gather(loom_zero *z);
struct loom_zero_piece;
loom_status zero_ep_pieces(const loom_zero *z, struct loom_zero_piece **out, size_t *n);
/* zero_reduce.c: the gradient buffer's resident bytes now into the peak (mincore); zero
 * [lo, hi) of it, its whole pages handed back to the OS (the pages it shares with its
 * neighbours only zeroed: they may hold gradients still to reduce). */
void zero_measure_grads(loom_zero *z);
void zero_clear_grads(loom_zero *z, size_t lo, size_t hi);
/* zero_params.c: hand the whole pages of [lo, hi) of the parameter buffer back to the OS. */
void zero_drop_pages(loom_zero *z, size_t lo, size_t hi);
/* zero_params.c: the parameter buffer's resident bytes now into its peak (mincore); unit
 * un's inner pages (those of flat [lo, hi) it shares with no neighbour) as elements. */
void zero_measure_params(loom_zero *z);
void zero_unit_pages(const loom_zero *z, zero_unit *un, size_t lo, size_t hi);
/* zero_params_store.c: unit u's partition out of the offload into un->bring (a no-op
 * without params offloaded): submit maps the staging and hands the read to the reader
 * thread, wait returns when it is read (a failed read releases the staging), bring_unit
 * is both; the staging freed when its gathers are done. */
loom_status zero_bring_submit(loom_zero *z, int u);
loom_status zero_bring_wait(loom_zero *z, int u);
loom_status zero_bring_unit(loom_zero *z, int u);
void zero_release_bring(loom_zero *z, int u);
/* zero_params_read.c: the reader thread (started at the first submit, stopped at free,
 * after what is queued is read). */
loom_status zero_read_submit(loom_zero *z, int u);
loom_status zero_read_wait(loom_zero *z, int u);
void zero_read_stop(loom_zero *z);

#endif
