/* dp.c — loom-strategy-dp: data parallelism by bucketed all-reduce, overlapped with
 * backward (PyTorch DDP's scheme, Li et al. 2020).
 *
 * What it does: during the last micro-batch of a step the core reports each finished
 * range of the flat gradient buffer (grads_ready, in backward order: ln_f, blocks top
 * down, embeddings). Ranges are contiguous and descending, so a bucket is one span
 * [lo, hi) of the buffer; when it reaches bucket_mb it is all-reduced (SUM) in place,
 * asynchronously, while backward continues. before_step flushes the last bucket and waits
 * for all of them. SUM, not AVG: the core scales the loss gradient by 1/(global token
 * count), so the sum over ranks is the global gradient.
 * Progress: a communicator may advance queued work only inside test()/wait() (shm has no
 * progress thread), so each grads_ready also polls the buckets in flight: communication
 * advances at every layer boundary of backward, overlapping it at that granularity.
 * reduce = "bf16" (set by the core for precision = { "bf16", reduce = "bf16" }): each
 * bucket is rounded to bf16 (to nearest even) into a staging buffer and all-reduced as
 * bf16 — half the bytes on the wire; the communicator sums in fp32 and rounds once — and
 * widened back into the fp32 gradient when before_step has waited for it. Where the
 * gradients are a device backend's memory (loom_host.device_backend) the staging is that
 * backend's too, rounded and widened by its convert ops (plugin/backend.h: the same
 * rounding, to nearest even, NaN quiet), so the host never reads the buffer.
 * What it does not: canonical mode's fixed-order reduction (the core's grad_sync does
 * that), sharding (zero), or anything outside the dp group.
 * Invariants: at most MAX_INFLIGHT buckets outstanding; buffers are the core's; the only
 * exported symbol is loom_plugin_entry.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/plugin/backend.h"
#include "loom/plugin/comm.h"
#include "loom/plugin/strategy.h"

#define MAX_INFLIGHT 256

enum { K_BUCKET_MB, K_REDUCE, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_BUCKET_MB] = {"bucket_mb", LOOM_CFG_NUMBER, "25",
                     "gradient bucket size in MiB: smaller starts communication sooner, larger "
                     "sends fewer messages (PyTorch DDP's default is 25)"},
    [K_REDUCE] = {"reduce", LOOM_CFG_STRING, "\"f32\"",
                  "dtype on the wire: \"f32\", or \"bf16\" (rounded, half the bytes; the core "
                  "sets it from precision = { \"bf16\", reduce = \"bf16\" })"},
};

typedef struct dp {
    const loom_host *host;
    const loom_comm_ops *comm;
    void *group;
    size_t bucket_elems;
    float *grads;
    size_t lo, hi;  /* the open bucket, elements [lo, hi); empty when lo == hi */
    loom_comm_request *inflight[MAX_INFLIGHT];
    size_t span[MAX_INFLIGHT][2]; /* reduce = bf16: each bucket's [lo, hi), to widen back */
    int n_inflight;
    int bf16;        /* reduce = "bf16" */
    uint16_t *stage; /* bf16: the buckets on the wire, indexed as the gradient buffer */
    size_t stage_n;
    const loom_backend_ops *be; /* bf16 over a device's memory: its convert ops and alloc */
    void *be_self;
} dp;

static uint16_t to_bf16(float f) /* to nearest even; NaN stays a (quiet) NaN */
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static loom_status dp_create(const loom_host *host, const loom_config *cfg, void **self)
{
    double mb = cfg->values[K_BUCKET_MB].number;
    if (!(mb > 0 && mb <= 4096))
        return host->fail(LOOM_ERR_INVALID, "dp: bucket_mb=%g must be in (0, 4096]", mb);
    const char *reduce = cfg->values[K_REDUCE].string;
    if (!reduce || (strcmp(reduce, "f32") && strcmp(reduce, "bf16")))
        return host->fail(LOOM_ERR_INVALID, "dp: reduce=\"%s\" must be \"f32\" or \"bf16\"",
                          reduce ? reduce : "");
    const struct loom_comm_ops *ops;
    void *group;
    int size;
    /* the gradient buffer is the backend's memory: a device backend's buckets go to the
     * device communicator (nccl) or a staged host one, never straight to shm */
    loom_status st = host->size > offsetof(loom_host, device_group) && host->device_group
                         ? host->device_group(LOOM_GROUP_DP, &ops, &group, &size)
                         : host->group(LOOM_GROUP_DP, &ops, &group, &size);
    if (st != LOOM_OK)
        return st;
    dp *d = host->alloc(sizeof *d);
    if (!d)
        return host->fail(LOOM_ERR_NOMEM, "dp: out of memory");
    d->host = host;
    d->comm = ops;
    d->group = group;
    d->bf16 = strcmp(reduce, "bf16") == 0;
    if (d->bf16 && host->size > offsetof(loom_host, device_backend) && host->device_backend)
        d->be = host->device_backend(&d->be_self);
    if (d->be && (d->be->size < offsetof(loom_backend_ops, convert_to_f32) +
                                    sizeof d->be->convert_to_f32 ||
                  !d->be->convert_from_f32 || !d->be->convert_to_f32)) {
        host->free(d);
        return host->fail(LOOM_ERR_UNSUPPORTED, "dp: reduce=\"bf16\" over a device backend's "
                          "memory needs its convert_from_f32 and convert_to_f32 ops "
                          "(plugin/backend.h); use reduce = \"f32\"");
    }
    d->bucket_elems = (size_t)(mb * 1024 * 1024 / sizeof(float));
    if (d->bucket_elems == 0)
        d->bucket_elems = 1;
    *self = d;
    return LOOM_OK;
}

static void dp_destroy(void *self)
{
    dp *d = self;
    if (d) {
        if (d->be)
            d->be->free(d->be_self, d->stage);
        else
            d->host->free(d->stage);
        d->host->free(d);
    }
}

static loom_status flush(dp *d)
{
    if (d->lo == d->hi || !d->comm)
        return LOOM_OK;
    if (d->n_inflight == MAX_INFLIGHT)
        return d->host->fail(LOOM_ERR_INTERNAL, "dp: more than %d buckets in flight; raise bucket_mb",
                             MAX_INFLIGHT);
    float *p = d->grads + d->lo;
    void *wire = p;
    if (d->bf16) {
        if (d->hi > d->stage_n) { /* the first bucket ends at the buffer's end: one growth */
            size_t bytes = d->hi * sizeof *d->stage;
            if (d->be)
                d->be->free(d->be_self, d->stage);
            else
                d->host->free(d->stage);
            d->stage = d->be ? d->be->alloc(d->be_self, bytes) : d->host->alloc(bytes);
            d->stage_n = d->stage ? d->hi : 0;
            if (!d->stage)
                return d->host->fail(LOOM_ERR_NOMEM, "dp: out of memory for the bf16 buckets");
        }
        if (d->be)
            d->be->convert_from_f32(d->stage + d->lo, d->grads + d->lo, d->hi - d->lo,
                                    LOOM_DTYPE_BF16);
        else
            for (size_t i = d->lo; i < d->hi; i++)
                d->stage[i] = to_bf16(d->grads[i]);
        wire = d->stage + d->lo;
    }
    loom_status st = d->comm->allreduce_start(d->group, wire, wire, d->hi - d->lo,
                                              d->bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32,
                                              LOOM_REDUCE_SUM, &d->inflight[d->n_inflight]);
    if (st != LOOM_OK)
        return st;
    d->span[d->n_inflight][0] = d->lo;
    d->span[d->n_inflight][1] = d->hi;
    d->n_inflight++;
    d->lo = d->hi = 0;
    return LOOM_OK;
}

/* Let queued buckets advance without blocking (see the opening comment). */
static void poll(dp *d)
{
    for (int i = 0; i < d->n_inflight; i++)
        if (!d->comm->test(d->group, d->inflight[i]))
            break; /* buckets complete in order: later ones cannot be done either */
}

static loom_status dp_grads_ready(void *self, float *grads, size_t offset, size_t n)
{
    dp *d = self;
    d->grads = grads;
    poll(d);
    if (d->lo != d->hi && offset + n != d->lo) {
        /* not adjacent to the open bucket: send that one first */
        loom_status st = flush(d);
        if (st != LOOM_OK)
            return st;
    }
    if (d->lo == d->hi) {
        d->lo = offset;
        d->hi = offset + n;
    } else {
        d->lo = offset;
    }
    if (d->hi - d->lo >= d->bucket_elems)
        return flush(d);
    return LOOM_OK;
}

static loom_status dp_before_step(void *self)
{
    dp *d = self;
    loom_status st = flush(d);
    for (int i = 0; i < d->n_inflight; i++) {
        loom_status w = d->comm->wait(d->group, d->inflight[i]);
        if (st == LOOM_OK)
            st = w;
        size_t lo = d->span[i][0], hi = d->span[i][1];
        if (d->bf16 && w == LOOM_OK && d->be)
            d->be->convert_to_f32(d->grads + lo, d->stage + lo, hi - lo, LOOM_DTYPE_BF16);
        for (size_t j = lo; d->bf16 && w == LOOM_OK && !d->be && j < hi; j++)
            d->grads[j] = from_bf16(d->stage[j]);
    }
    d->n_inflight = 0;
    return st;
}

static int dp_pending(void *self) { return ((dp *)self)->n_inflight; }

static const loom_strategy_ops ops = {
    .size = sizeof(loom_strategy_ops),
    .create = dp_create,
    .destroy = dp_destroy,
    .grads_ready = dp_grads_ready,
    .before_step = dp_before_step,
    .pending = dp_pending,
};

static const loom_plugin_desc desc = {
    LOOM_PLUGIN_ABI, sizeof(loom_plugin_desc), LOOM_KIND_STRATEGY, "dp", "0.1.0",
    "data parallel: bucketed all-reduce of gradients overlapped with backward",
    keys, N_KEYS, NULL, &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
