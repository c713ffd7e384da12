/* zero.c — partitions, the sharded optimizer's segments and state, and the parameter
 * all-gather after the step (see zero.h). Stage 2's reduction is zero_reduce.c.
 */
#include "zero_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/plugin_loader.h"
#include "base/status.h"
#include "base/clock.h"

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

size_t loom_zero_padded(size_t total, int n) { return round_up(total, (size_t)ZERO_ALIGN * (size_t)n); }

/* Buckets tile [0, P) at cut points, all multiples of U*N: every `want` elements up to
 * the last multiple of U*N inside the buffer (body), body itself, and P (the tail bucket
 * [body, P) when the buffer ends inside it). Stage 3 cuts at every unit boundary too
 * (rounded down and up: the U*N cell around an unaligned boundary is a bucket of its
 * own, gathered with either unit), so that a unit is gathered without its neighbours. */
static loom_status make_buckets(loom_zero *z, size_t want)
{
    size_t unit = (size_t)ZERO_ALIGN * (size_t)z->n;
    size_t body = z->total / unit * unit;
    z->padded = loom_zero_padded(z->total, z->n);
    want = want < unit ? unit : want / unit * unit;
    if (z->stage == 3)
        want = body + unit; /* buckets are the units: one gather each */
    int units = z->stage == 3 ? loom_gpt_get_config(z->model)->layers + 2 : 0;
    size_t cap = body / want + 3 + 2 * (size_t)units, n = 0;
    size_t *cut = malloc(cap * sizeof *cut);
    z->buckets = calloc(cap, sizeof *z->buckets);
    if (!cut || !z->buckets) {
        free(cut);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO buckets");
    }
    for (size_t x = 0; x < body; x += want)
        cut[n++] = x;
    cut[n++] = body;
    cut[n++] = z->padded;
    const loom_param_table *t = loom_gpt_params(z->model);
    for (int u = 1; u < units; u++) {
        int first, last;
        loom_gpt_unit_entries(z->model, u, &first, &last);
        if (first > last)
            continue; /* not on this pipeline stage */
        size_t b = t->entries[first].offset;
        cut[n++] = b / unit * unit;
        cut[n++] = round_up(b, unit);
    }
    qsort(cut, n, sizeof *cut, cmp_size);
    int k = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (cut[i + 1] == cut[i])
            continue;
        zero_bucket *b = &z->buckets[k++];
        b->lo = cut[i];
        b->len = cut[i + 1] - cut[i];
        b->sub = b->len / (size_t)z->n;
        b->part_off = b->lo / (size_t)z->n;
        if (b->len > z->max_len)
            z->max_len = b->len;
    }
    free(cut);
    z->n_buckets = k;
    return LOOM_OK;
}

/* One segment per (parameter, sub-block) piece: the parameter's decay rule, its state
 * packed at the piece's place in the partition (slot-major within the piece). */
static loom_status make_segments(loom_zero *z, const loom_zero_config *c)
{
    const loom_param_table *t = loom_gpt_params(z->model);
    size_t cap = (size_t)t->count + (size_t)z->n_buckets;
    z->segments = calloc(cap, sizeof *z->segments);
    z->seg_entry = calloc(cap, sizeof *z->seg_entry);
    z->seg_state_off = calloc(cap, sizeof *z->seg_state_off);
    z->seg_pos = calloc(cap, sizeof *z->seg_pos);
    if (!z->segments || !z->seg_entry || !z->seg_state_off || !z->seg_pos)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO segments");
    float *params = loom_gpt_param_data(z->model), *grads = loom_gpt_grad_data(z->model);
    for (int k = 0; k < z->n_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        size_t a = b->lo + (size_t)z->rank * b->sub, e_ = a + b->sub;
        for (int i = 0; i < t->count; i++) {
            const loom_param_entry *e = &t->entries[i];
            size_t lo = e->offset > a ? e->offset : a;
            size_t hi = e->offset + e->numel < e_ ? e->offset + e->numel : e_;
            if (lo >= hi)
                continue;
            if ((size_t)z->n_segments == cap)
                LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO: more segments than parameters + buckets");
            size_t pos = b->part_off + (lo - a); /* place in the partition */
            loom_optim_segment *s = &z->segments[z->n_segments++];
            s->param = z->part_params ? z->part_params + pos
                       : z->params_offloaded ? NULL : params + lo; /* offloaded: the offload's */
            s->grad = z->part_grads ? z->part_grads + pos : grads + lo;
            s->state = z->state ? z->state + (size_t)c->state_slots * pos : NULL;
            s->n = hi - lo;
            s->weight_decay = (c->decay_all || e->is_matrix) ? c->weight_decay : 0.0f;
            z->seg_entry[z->n_segments - 1] = i;
            z->seg_state_off[z->n_segments - 1] = (size_t)c->state_slots * pos;
            z->seg_pos[z->n_segments - 1] = pos;
        }
    }
    return LOOM_OK;
}

loom_status loom_zero_create(const loom_zero_config *c, loom_gpt *m, loom_backend *be,
                             loom_zero **out)
{
    *out = NULL;
    if (c->stage < 1 || c->stage > 3)
        LOOM_FAIL(LOOM_ERR_INVALID, "strategy zero=%d: the stages are 1, 2 and 3", c->stage);
    if (!(c->bucket_mb > 0 && c->bucket_mb <= 4096))
        LOOM_FAIL(LOOM_ERR_INVALID, "zero bucket_mb=%g must be in (0, 4096]", c->bucket_mb);
    /* expert parallelism: two partitions (zero_ep.c); with 16-bit weights under stage 1
     * or 2 every rank keeps the whole fp32 master there (docs/MOE.md): zero_master.c's
     * partition follows one kind's buckets, not the dense and expert ones */
    if (c->ep)
        return zero_ep_create(c, m, be, out);
    loom_zero *z = calloc(1, sizeof *z);
    if (!z)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    z->stage = c->stage;
    z->model = m;
    z->be = be;
    z->total = loom_gpt_params(m)->total;
    z->reduces = c->stage >= 2 && !c->canonical;
    z->accum = c->accum;
    z->skip_entry = -1;
    z->params_offloaded = c->params_offloaded && c->stage == 3;
    z->undrawn = c->undrawn && c->stage == 3;
    z->whole_grads = c->whole_grads;
    z->draw_seed = c->seed;
    const loom_host *host = loom_core_host();
    loom_status st = host->group(LOOM_GROUP_DP, &z->comm, &z->dp, &z->n);
    if (st == LOOM_OK && (!z->comm || z->n < 2))
        st = loom_fail(LOOM_ERR_INTERNAL, "ZeRO needs a data-parallel group of 2 or more ranks");
    z->hcomm = z->comm;
    z->hdp = z->dp;
    if (st == LOOM_OK && loom_backend_device_memory(be)) /* the buckets over the device group */
        st = zero_device_init(z, c);
    if (st == LOOM_OK)
        st = host->group(LOOM_GROUP_TP, &z->tp_comm, &z->tp, &z->tp_size);
    if (st == LOOM_OK) {
        z->rank = z->comm->rank(z->dp);
        z->tp_rank = z->tp_comm ? z->tp_comm->rank(z->tp) : 0;
        st = make_buckets(z, (size_t)(c->bucket_mb * 1024 * 1024 / sizeof(float)));
    }
    if (st == LOOM_OK) {
        z->part = z->padded / (size_t)z->n;
        z->state_floats = (size_t)c->state_slots * z->part;
        if (z->device)
            st = zero_device_state(z, c->offloaded);
        else if (z->state_floats && !c->offloaded &&
                 !(z->state = malloc(z->state_floats * sizeof(float))))
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for the ZeRO optimizer state partition");
        else if (z->state) /* zeroed by touching every page now, not calloc's lazy zero pages
            * that step 1's optimizer would fault in (as session.c's whole state) */
            memset(z->state, 0, z->state_floats * sizeof(float));
    }
    size_t unit = (size_t)ZERO_ALIGN * (size_t)z->n;
    if (st == LOOM_OK && !(z->tail = zero_buf_alloc(z, unit)))
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK && z->reduces)
        st = zero_reduce_init(z);
    if (st == LOOM_OK && z->stage == 3)
        st = zero_params_init(z);
    else if (st == LOOM_OK && c->master16 && !zero_master_whole())
        st = zero_master_init(z); /* the fp32 master: this rank's partition only */
    if (st == LOOM_OK) /* a device's buffers as sparse ranges, where the backend can */
        st = zero_device_sparse(z);
    if (st == LOOM_OK)
        st = make_segments(z, c);
    if (st != LOOM_OK) {
        loom_zero_destroy(z);
        return st;
    }
    *out = z;
    return LOOM_OK;
}

void loom_zero_destroy(loom_zero *z)
{
    if (!z)
        return;
    zero_reduce_free(z);
    zero_params_free(z);
    zero_device_sparse_free(z);
    zero_ep_free(z);
    zero_buf_free(z, z->tail);
    zero_buf_free(z, z->state);
    free(z->host_state);
    free(z->buckets);
    free(z->segments);
    free(z->seg_entry);
    free(z->seg_state_off);
    free(z->seg_pos);
    free(z);
}

const loom_optim_segment *loom_zero_segments(const loom_zero *z, size_t *n)
{
    *n = (size_t)z->n_segments;
    return z->segments;
}

float *loom_zero_state(loom_zero *z, size_t *floats)
{
    *floats = z->state_floats;
    return z->device ? z->host_state : z->state; /* the host's view: zero.h */
}

const size_t *loom_zero_state_offsets(const loom_zero *z) { return z->seg_state_off; }

int loom_zero_reduces(const loom_zero *z) { return z->reduces; }
int loom_zero_stage(const loom_zero *z) { return z->stage; }

/* A bucket's send/recv range in the buffer (es bytes an element), or the tail staging
 * when it runs past total. */
static char *bucket_base(loom_zero *z, const zero_bucket *b, char *buf, size_t es)
{
    return b->lo + b->len > z->total ? (char *)z->tail : buf + b->lo * es;
}

/* Every bucket all-gathered in place in buf (es-byte elements of dtype dt): rank r's
 * sub-block already sits at r*sub of the bucket (comm.h's allgather allows send inside
 * recv at the rank's own block). narrow: the master is the partition (master16), so this
 * rank's sub-block is first rounded into the 16-bit buf from it; rounding is element-wise,
 * so buf ends with the bits rounding the gathered fp32 buffer would give. */
static loom_status gather_range(loom_zero *z, char *buf, size_t es, loom_dtype dt, int narrow,
                                int k0, int k1)
{
    loom_comm_request *req[ZERO_MAX_INFLIGHT];
    int n_req = 0;
    loom_status st = LOOM_OK;
    for (int k = k0; k <= k1 && st == LOOM_OK; k++) {
        const zero_bucket *b = &z->buckets[k];
        char *base = bucket_base(z, b, buf, es), *mine = base + (size_t)z->rank * b->sub * es;
        if (base == (char *)z->tail && !narrow) { /* past total: zeros, as allocated */
            if (!z->device)
                memset(z->tail, 0, b->len * es);
            st = zero_buf_copy(z, z->tail, (float *)(buf + b->lo * es), z->total - b->lo);
            if (st != LOOM_OK)
                break;
        }
        if (narrow)
            z->be->ops->convert_from_f32(mine, z->part_params + b->part_off, b->sub, dt);
        if (n_req == ZERO_MAX_INFLIGHT) { /* complete those queued before queueing more */
            for (int i = 0; i < n_req && st == LOOM_OK; i++)
                st = z->comm->wait(z->dp, req[i]);
            n_req = 0;
            if (st != LOOM_OK)
                break;
        }
        st = z->comm->allgather_start(z->dp, mine, base, b->sub,
                                      es == sizeof(float) ? LOOM_DTYPE_F32 : LOOM_DTYPE_U16,
                                      &req[n_req]);
        if (st == LOOM_OK)
            n_req++;
    }
    for (int i = 0; i < n_req; i++) {
        loom_status w = z->comm->wait(z->dp, req[i]);
        if (st == LOOM_OK)
            st = w;
    }
    const zero_bucket *last = &z->buckets[k1];
    if (st == LOOM_OK && bucket_base(z, last, buf, es) == (char *)z->tail) {
        if (narrow) /* the 16-bit elements that exist (a device's: through the host) */
            st = zero_buf_copy_bytes(z, buf + last->lo * es, z->tail, (z->total - last->lo) * es);
        else
            st = zero_buf_copy(z, (float *)(buf + last->lo * es), z->tail, z->total - last->lo);
    }
    return st;
}

static loom_status gather_buckets(loom_zero *z, char *buf, size_t es, loom_dtype dt, int narrow)
{
    return gather_range(z, buf, es, dt, narrow, 0, z->n_buckets - 1);
}

/* zero_master.c's whole-master gather: the fp32 buckets k0 .. k1 in place in the model's
 * buffer. */
loom_status zero_gather_f32(loom_zero *z, int k0, int k1)
{
    return gather_range(z, (char *)loom_gpt_param_data(z->model), sizeof(float), LOOM_DTYPE_F32,
                        0, k0, k1);
}

/* master16: the compute copy's dtype and its buffer (2 bytes an element). */
static loom_status gather_narrowed(loom_zero *z)
{
    loom_dtype dt;
    char *c16 = loom_gpt_param16_data(z->model, &dt);
    return gather_buckets(z, c16, sizeof(uint16_t), dt, 1);
}

/* master16 after a step or a load: the compute copy, then the fp32 buckets a reader keeps
 * whole (loom_zero_keep_master: the distillation projections). */
static loom_status gather_master16(loom_zero *z)
{
    LOOM_TRY(gather_narrowed(z));
    return zero_master_gather_kept(z);
}

loom_status loom_zero_gather_params(loom_zero *z, double *comm_ms)
{
    if (z->stage == 3) { /* gathered unit by unit when next used */
        loom_zero_params_stale(z);
        return LOOM_OK;
    }
    double t0 = loom_now_ms();
    loom_status st = z->ep ? zero_ep_gather(z) /* each kind over its own group (zero_ep.c) */
                     : z->master16 ? gather_master16(z)
                     : gather_buckets(z, (char *)loom_gpt_param_data(z->model), sizeof(float),
                                      LOOM_DTYPE_F32, 0);
    *comm_ms += loom_now_ms() - t0;
    return st;
}

int loom_zero_params_parted(const loom_zero *z) { return z->stage == 3 || z->master16; }

loom_status loom_zero_params_loaded(loom_zero *z)
{
    if (z->stage == 3) {
        loom_zero_params_stale(z);
        return LOOM_OK;
    }
    return z->master16 ? gather_master16(z) : LOOM_OK;
}

void loom_zero_memory(const loom_zero *z, loom_memory *out)
{
    memset(out, 0, sizeof *out);
    out->optimizer = z->state ? z->state_floats * sizeof(float) : 0;
    out->grads = z->reduces ? z->part * sizeof(float) : 0;
    out->grads_peak_resident = z->gsparse ? zero_device_grads_peak(z) : z->resident_peak;
    /* master16 on a device without the vm ops: the model's fp32 buffer stays allocated
     * beside the partition (cleared, not handed back: zero_drop_pages), so it is counted
     * whole; with them (zero_sparse.c) only the kept span is committed between readers */
    size_t whole = z->master16 && z->device && !z->psparse ? z->total : zero_master_kept_floats(z);
    out->params = z->part_params ? (z->part + whole) * sizeof(float) : 0;
    out->params_offloaded = z->store ? z->part * sizeof(float) : 0;
    out->params_peak_resident = z->psparse ? zero_device_params_peak(z) : z->params_peak;
    out->comm = ((size_t)ZERO_ALIGN * (size_t)z->n * (z->tail3 ? 2 : 1) + z->staging_floats +
                 z->bring_peak) * sizeof(float); /* bring: offloaded params' staging, peak */
}
