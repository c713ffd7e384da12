/* zero_reduce.c — ZeRO stage 2's gradient path (see zero.h): bucketed reduce-scatter
 * during backward into this rank's gradient partition, the model's full-size buffer
 * handed back to the OS bucket by bucket, and the global norm over the partitions.
 *
 * Order: backward reports final ranges in descending offsets (gpt.h), so everything at
 * or above the lowest offset reported so far (the watermark) is final and buckets are
 * started from the top down as the watermark passes their start. At most ZERO_SLOTS
 * reduce-scatters are in flight; the communicator advances them only inside test/wait,
 * so each report polls them (communication overlaps backward at layer granularity, as
 * the dp plugin's does). A finished bucket's gradient range is zeroed for the next
 * backward: whole pages by madvise(MADV_DONTNEED), which on host memory frees them
 * (anonymous memory reads back as zeros), the ragged ends by memset.
 * Micro-batch a = 0 receives straight into the partition; later ones receive into a
 * staging slot and add it (DeepSpeed's stage 2 also reduces every micro-batch, which
 * is what keeps the full-size buffer from filling up during gradient accumulation).
 * Under pp (loom_zero_pipelined) a backward's end starts what is left but waits for
 * nothing: its last buckets stay in flight over the instructions that write no gradient
 * (forwards, transfers, and after the list the loss sum and the wte exchange), and are
 * waited for when the next backward, B or W begins (it writes into the ranges they read
 * and release zeroes) or before the step (loom_zero_reduce_held). Each bucket still
 * completes in start order and adds into the partition in micro-batch order: the bits do
 * not change, only when the waits happen.
 */
#define _DEFAULT_SOURCE /* madvise, mincore */
#include "zero_ep_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/status.h"
#include "base/clock.h"
#include "trace.h"

/* Resident bytes of the model's gradient buffer now (mincore), kept as a peak. */
void zero_measure_grads(loom_zero *z)
{
    if (z->device) /* nothing to measure: device memory stays allocated (zero_reduce_init) */
        return;
    uintptr_t a = (uintptr_t)loom_gpt_grad_data(z->model);
    uintptr_t lo = a / z->page * z->page, hi = a + z->total * sizeof(float);
    size_t n = (hi - lo + z->page - 1) / z->page;
    if (n > z->n_pages || mincore((void *)lo, hi - lo, z->pages) != 0)
        return;
    size_t resident = 0;
    for (size_t i = 0; i < n; i++)
        resident += z->pages[i] & 1;
    resident *= z->page;
    if (resident > z->total * sizeof(float))
        resident = z->total * sizeof(float); /* the partial pages at both ends */
    if (resident > z->resident_peak)
        z->resident_peak = resident;
}

/* Zero [lo, hi) of the gradient buffer, returning its whole pages to the OS. Buckets
 * finish top down, so everything above hi is already zero: the page that straddles hi
 * goes too, except at the buffer's end (the rest of that page is not ours). */
static void release(loom_zero *z, size_t lo, size_t hi)
{
    float *g = loom_gpt_grad_data(z->model);
    if (z->device) { /* no pages to hand back: zeroed for the next backward */
        zero_buf_clear(z, g + lo, hi - lo);
        return;
    }
    uintptr_t a = (uintptr_t)(g + lo), b = (uintptr_t)(g + hi);
    uintptr_t pa = (a + z->page - 1) / z->page * z->page, pb = b / z->page * z->page;
    if (hi < z->total && b != pb) {
        uintptr_t up = pb + z->page, end = (uintptr_t)(g + z->total);
        if (up <= end) {
            pb = up;
            b = up; /* nothing between the old b and up needs the memset: madvise zeroes it */
        }
    }
    if (pb > pa && madvise((void *)pa, pb - pa, MADV_DONTNEED) == 0) {
        memset((void *)a, 0, pa - a);
        memset((void *)pb, 0, b - pb);
    } else {
        memset((void *)a, 0, b - a);
    }
}

void zero_clear_grads(loom_zero *z, size_t lo, size_t hi)
{
    float *g = loom_gpt_grad_data(z->model);
    if (z->device) { /* no pages to hand back (whole allocations): zeroed */
        zero_buf_clear(z, g + lo, hi - lo);
        return;
    }
    uintptr_t a = (uintptr_t)(g + lo), b = (uintptr_t)(g + hi);
    uintptr_t pa = (a + z->page - 1) / z->page * z->page, pb = b / z->page * z->page;
    if (pb > pa && madvise((void *)pa, pb - pa, MADV_DONTNEED) == 0) {
        memset((void *)a, 0, pa - a);
        memset((void *)pb, 0, b - pb);
    } else {
        memset((void *)a, 0, b - a);
    }
}

loom_status zero_reduce_init(loom_zero *z)
{
    /* Staging only where a later micro-batch adds into the partition: one slot per
     * reduce-scatter in flight. */
    size_t max_sub = z->max_len / (size_t)z->n;
    z->slots = z->n_buckets < ZERO_SLOTS ? z->n_buckets : ZERO_SLOTS;
    z->staging_floats = z->accum > 1 ? (size_t)z->slots * max_sub : 0;
    z->part_grads = zero_buf_alloc(z, z->part);
    z->staging = z->staging_floats ? zero_buf_alloc(z, z->staging_floats) : NULL;
    /* a device's gradient buffer is the backend's allocation, resident all along: stage 2
     * saves none of it there (the partition is beside it, not instead of it) */
    if (z->device)
        z->resident_peak = z->total * sizeof(float);
    long pg = sysconf(_SC_PAGESIZE);
    z->page = pg > 0 ? (size_t)pg : 4096;
    z->n_pages = (z->total * sizeof(float) + 2 * z->page) / z->page;
    z->pages = malloc(z->n_pages);
    if (!z->part_grads || (z->staging_floats && !z->staging) || !z->pages)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the ZeRO-2 gradient partition");
    release(z, 0, z->total); /* from the start: only backward brings pages back */
    z->rs_first = -1.0; /* no reduce-scatter under way */
    z->tr_mb = z->tr_chunk = -1;
    return LOOM_OK;
}

void zero_reduce_free(loom_zero *z)
{
    zero_buf_free(z, z->part_grads);
    zero_buf_free(z, z->staging);
    free(z->pages);
}

/* Complete the oldest reduce-scatter: add its staging into the partition, free its range. */
static loom_status complete_oldest(loom_zero *z)
{
    zero_flight f = z->flight[0];
    memmove(z->flight, z->flight + 1, (size_t)(z->n_flight - 1) * sizeof *z->flight);
    z->n_flight--;
    LOOM_TRY(z->comm->wait(z->dp, f.req));
    const zero_bucket *b = &z->buckets[f.bucket];
    if (f.slot)
        z->be->ops->accumulate(z->part_grads + b->part_off, f.slot, b->sub);
    size_t hi = b->lo + b->len < z->total ? b->lo + b->len : z->total;
    if (!zero_device_bucket_done(z, f.bucket)) /* sparse: zeroed and decommitted there */
        release(z, b->lo, hi);
    return LOOM_OK;
}

/* Complete every reduce-scatter in flight; the trace gets one reduce_scatter span from the
 * first of them started to the last waited for (trace.h), with the time this wait took
 * (wait_ms: what the overlap leaves exposed). */
static loom_status drain(loom_zero *z)
{
    double t0 = loom_now_ms();
    while (z->n_flight > 0)
        LOOM_TRY(complete_oldest(z));
    if (z->rs_first >= 0) {
        char args[96];
        snprintf(args, sizeof args, "\"buckets\":%d,\"during\":%d,\"wait_ms\":%.3f",
                 z->rs_buckets, z->rs_during, loom_now_ms() - t0);
        loom_trace_span_args(z->trace, LOOM_TRACE_REDUCE_SCATTER, z->rs_first, loom_now_ms(),
                             z->rs_mb, z->rs_chunk, args);
    }
    z->rs_first = -1.0;
    z->rs_buckets = z->rs_during = 0;
    return LOOM_OK;
}

loom_status loom_zero_wait_reduces(loom_zero *z)
{
    return z->ep ? LOOM_OK : drain(z); /* ep: each backward's end waits (zero_ep_reduce.c) */
}

void loom_zero_pipelined(loom_zero *z, int on) { z->deferred = on && !z->ep && !z->device; }

void loom_zero_set_trace(loom_zero *z, struct loom_trace *tr) { z->trace = tr; }

void loom_zero_trace_label(loom_zero *z, int mb, int chunk)
{
    z->tr_mb = mb;
    z->tr_chunk = chunk;
}

static loom_status start_bucket(loom_zero *z, int k)
{
    if (z->n_flight == z->slots)
        LOOM_TRY(complete_oldest(z));
    if (z->rs_first < 0) {
        z->rs_first = loom_now_ms();
        z->rs_mb = z->tr_mb;
        z->rs_chunk = z->tr_chunk;
    }
    z->rs_buckets++;
    LOOM_TRY(zero_device_bucket_hold(z, k)); /* sparse: a bucket backward did not write */
    const zero_bucket *b = &z->buckets[k];
    float *g = loom_gpt_grad_data(z->model), *send = g + b->lo;
    if (b->lo + b->len > z->total) { /* the tail bucket: the buffer ends inside it */
        if (!z->device) /* a device's tail holds zeros past total from its allocation on */
            memset(z->tail, 0, b->len * sizeof(float));
        LOOM_TRY(zero_buf_copy(z, z->tail, g + b->lo, z->total - b->lo));
        send = z->tail;
    }
    float *slot = NULL, *recv = z->part_grads + b->part_off;
    if (z->micro > 0) {
        slot = z->staging + (size_t)z->next_slot * (z->staging_floats / (size_t)z->slots);
        z->next_slot = (z->next_slot + 1) % z->slots;
        recv = slot;
    }
    zero_flight *f = &z->flight[z->n_flight];
    LOOM_TRY(z->comm->reduce_scatter_start(z->dp, send, recv, b->sub, LOOM_DTYPE_F32,
                                           LOOM_REDUCE_SUM, &f->req));
    f->bucket = k;
    f->slot = slot;
    z->n_flight++;
    return LOOM_OK;
}

/* Start every bucket the watermark has passed. */
static loom_status advance(loom_zero *z)
{
    while (z->next_bucket >= 0 && z->buckets[z->next_bucket].lo >= z->watermark &&
           z->buckets[z->next_bucket].lo >= z->hold_hi)
        LOOM_TRY(start_bucket(z, z->next_bucket--));
    return LOOM_OK;
}

loom_status loom_zero_begin_micro(void *self, int a)
{
    loom_zero *z = self;
    if (z->ep) /* two kinds over two groups (zero_ep_reduce.c) */
        return zero_ep_begin_micro(z, a);
    LOOM_TRY(drain(z)); /* under pp the last backward's may still be in flight */
    z->micro = a;
    z->tr_mb = a; /* the trace's label (under pp the engine's, loom_zero_trace_label) */
    z->tr_chunk = 0;
    z->next_bucket = z->n_buckets - 1;
    z->watermark = z->padded; /* nothing final yet */
    if (a == 0)
        zero_buf_clear(z, z->part_grads, z->part);
    return LOOM_OK;
}

loom_status loom_zero_grads_ready(void *self, size_t offset, size_t n)
{
    (void)n;
    loom_zero *z = self;
    if (z->ep)
        return zero_ep_grads_ready(z, offset);
    zero_measure_grads(z);
    if (z->n_flight > 0 && z->comm->test(z->dp, z->flight[0].req))
        LOOM_TRY(complete_oldest(z));
    if (offset < z->watermark)
        z->watermark = offset;
    int before = z->rs_buckets;
    LOOM_TRY(advance(z));
    z->rs_during += z->rs_buckets - before; /* started while backward runs (the trace's) */
    return LOOM_OK;
}

loom_status loom_zero_finish_micro(void *self)
{
    loom_zero *z = self;
    if (z->ep)
        return zero_ep_finish_micro(z);
    zero_measure_grads(z);
    z->watermark = 0; /* whatever backward did not report is final too (untouched: zero) */
    LOOM_TRY(advance(z));
    return z->deferred ? LOOM_OK : drain(z); /* pp: waited for later (the head comment) */
}

loom_status loom_zero_take_reduced(loom_zero *z)
{
    if (!z->reduces)
        return LOOM_OK;
    if (z->ep)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-2 under ep: compression is refused with ep");
    const float *g = loom_gpt_grad_data(z->model);
    for (int k = 0; k < z->n_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        size_t a = b->lo + (size_t)z->rank * b->sub;
        size_t n = a >= z->total ? 0 : a + b->sub > z->total ? z->total - a : b->sub;
        float *dst = z->part_grads + b->part_off; /* a device's memory: its ops (zero_device.c) */
        zero_buf_move(z, dst, g + a, n);
        zero_buf_clear(z, dst + n, b->sub - n); /* the padding past total */
    }
    return LOOM_OK;
}

void loom_zero_tied(loom_zero *z, int entry, int skip)
{
    const loom_param_entry *e = &loom_gpt_params(z->model)->entries[entry];
    z->hold_hi = z->reduces ? e->offset + e->numel : 0;
    z->skip_entry = skip ? entry : -1;
}

/* The last backward's buckets still in flight waited for, then the held buckets, top
 * down, received straight into the partition (nothing was received there this step:
 * begin_micro(0) zeroed it). */
loom_status loom_zero_reduce_held(loom_zero *z)
{
    if (!z->reduces)
        return LOOM_OK;
    if (z->ep)
        return z->hold_hi ? zero_ep_reduce_held(z) : LOOM_OK;
    LOOM_TRY(drain(z));
    if (!z->hold_hi)
        return LOOM_OK;
    int micro = z->micro;
    z->micro = 0;
    z->tr_mb = z->tr_chunk = -1; /* the step's, no micro-batch's */
    loom_status st = LOOM_OK;
    for (int k = z->n_buckets - 1; k >= 0 && st == LOOM_OK; k--)
        if (z->buckets[k].lo < z->hold_hi)
            st = start_bucket(z, k);
    loom_status w = drain(z);
    z->micro = micro;
    return st == LOOM_OK ? w : st;
}

/* Squared norm over this rank's pieces (replicated parameters counted on tp rank 0, as
 * grad_norm.c does), then summed over the dp ranks and the tp ranks in rank order. */
int loom_zero_first_nonfinite(const loom_zero *z) { return z->first_bad; }

const int *loom_zero_segment_entries(const loom_zero *z) { return z->seg_entry; }

loom_status loom_zero_norm(loom_zero *z, double *norm_sq, int *nonfinite, double *comm_ms)
{
    const loom_backend_ops *k = z->be->ops;
    const loom_param_table *t = loom_gpt_params(z->model);
    double mine[2] = {0.0, 0.0};
    z->first_bad = -1;
    for (int i = 0; i < z->n_segments; i++) {
        const loom_optim_segment *s = &z->segments[i];
        if (z->tp_rank != 0 && t->entries[z->seg_entry[i]].split_dim < 0)
            continue;
        if (z->seg_entry[i] == z->skip_entry) /* the tied wte: the first stage counts it */
            continue;
        mine[0] += k->sum_squares(s->grad, 1, s->n, s->n);
        if (k->has_nonfinite(s->grad, s->n)) {
            mine[1] = 1.0;
            if (z->first_bad < 0 || z->seg_entry[i] < z->first_bad)
                z->first_bad = z->seg_entry[i];
        }
    }
    double t0 = loom_now_ms();
    double gathered[2 * 64];
    const struct loom_comm_ops *ops[2] = {z->hcomm, z->tp_comm}; /* host doubles: host groups */
    void *groups[2] = {z->hdp, z->tp};
    int sizes[2] = {z->n, z->tp_size};
    for (int g = 0; g < 2; g++) {
        if (sizes[g] < 2)
            continue;
        if (!ops[g]) /* a group of several ranks must be summed over, never skipped */
            LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO's norm: the %s group of %d ranks has no host "
                      "communicator", g ? "tp" : "dp", sizes[g]);
        if (sizes[g] > 64)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "ZeRO-2's norm exchange supports groups of up to 64 "
                      "ranks, this one has %d", sizes[g]);
        loom_comm_request *req = NULL;
        LOOM_TRY(ops[g]->allgather_start(groups[g], mine, gathered, sizeof mine, LOOM_DTYPE_U8,
                                         &req));
        LOOM_TRY(ops[g]->wait(groups[g], req));
        mine[0] = mine[1] = 0.0;
        for (int r = 0; r < sizes[g]; r++) {
            mine[0] += gathered[2 * r];
            mine[1] = mine[1] != 0.0 || gathered[2 * r + 1] != 0.0 ? 1.0 : 0.0;
        }
    }
    *comm_ms += loom_now_ms() - t0;
    *norm_sq = mine[0];
    *nonfinite = mine[1] != 0.0;
    return LOOM_OK;
}
