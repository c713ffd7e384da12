/* zero_ep.c — ZeRO under expert parallelism (zero.h, session_ep.h): the partitions, the
 * parameter gather, checkpoints; stage 2's reduction is zero_ep_reduce.c, stage 3's
 * per-unit gathers zero_ep_params.c (its buckets follow the units: make_cuts).
 *
 * Under ep the ranks' flat buffers have one layout but different contents at the expert
 * entries: dp rank r = g ep + p holds ep rank p's experts, as do the other dp ranks of its
 * edp group (the same p). So the optimizer state has two partitions, each over one kind of
 * entry, packed (the kind's entries end to end, in table order):
 *  - dense: the non-expert entries, D floats, over the dp group;
 *  - experts: this rank's expert entries, X floats, over the edp group.
 * Each packed range is padded to U x n (U = 16, n the group's ranks) and tiled by buckets
 * (multiples of U x n, about bucket_mb) cut into n equal sub-blocks; rank q's partition is
 * its sub-block of every bucket. So every rank holds slots x (pad(D)/dp + pad(X)/edp)
 * floats of optimizer state (the formula tests/e2e/moe.sh holds the MEM lines to), and
 * steps that many parameters.
 * Stage 1: the gradients arrive whole (dp's reduction for the dense entries, loom_ep_reduce's
 * over edp for the experts'), the norm is stage 1's unchanged full-buffer one with ep's
 * part. Stage 2 (fast mode): the gradients are reduce-scattered into a partition laid out
 * as the state (zero_ep_reduce.c), the norm is loom_zero_norm's over the pieces.
 * After the step each bucket is packed from this rank's sub-block, all-gathered over its
 * group into a staging buffer and unpacked into the parameters: each kind writes only its
 * own entries, so neither gather disturbs the other's.
 * On a device backend (zero_device.c) the state, the staging and stage 2's and 3's
 * partitions and slots are the backend's memory; pieces move by zero_buf_move (its ops),
 * the buckets go over the device dp and edp groups, and what is host memory (the norm's
 * doubles, a checkpoint's whole state from the mirrors) over the host ones (ep_part); the
 * model's gradient and parameter buffers are sparse where the backend can (zero_sparse.c).
 */
#include "zero_ep_internal.h"
#include "zero_ckpt.h"
#include "session_ep.h"

#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/plugin_loader.h"
#include "base/status.h"

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

void zero_ep_each_piece(const ep_part *p, size_t a, size_t e, ep_piece_fn *fn, void *ctx)
{
    e = e < p->K ? e : p->K;
    int lo = 0, hi = p->n_runs; /* the first run ending after a */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (p->runs[mid].packed + p->runs[mid].n <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int i = lo; i < p->n_runs && p->runs[i].packed < e; i++) {
        const ep_run *r = &p->runs[i];
        size_t x = a > r->packed ? a : r->packed, y = e < r->packed + r->n ? e : r->packed + r->n;
        if (x < y)
            fn(ctx, r, r->flat + (x - r->packed), y - x, x);
    }
}

/* Rank q's sub-block of bucket [lo, lo + len) (packed), and where it sits in q's
 * partition of the kind. */
static void sub_block(const ep_part *p, size_t lo, size_t len, int q, size_t *a, size_t *e,
                      size_t *part_off)
{
    size_t sub = len / (size_t)p->n;
    *a = lo + (size_t)q * sub;
    *e = *a + sub;
    *part_off = lo / (size_t)p->n;
}

size_t zero_ep_bucket_len(const ep_part *p, size_t lo)
{
    if (!p->cuts)
        return p->Kp - lo < p->want ? p->Kp - lo : p->want;
    int a = 0, b = p->n_cuts - 1; /* the first cut above lo */
    while (a < b) {
        int mid = (a + b) / 2;
        if (p->cuts[mid] <= lo)
            a = mid + 1;
        else
            b = mid;
    }
    return p->cuts[a] - lo;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Stage 3: buckets follow the units, as without ep (zero.c make_buckets): a cut at each
 * unit's first packed float of this kind, rounded down and up to U x n (the cell around an
 * unaligned boundary a bucket of its own, gathered with either unit), so that a unit is
 * gathered without its neighbours, one all-gather a bucket. */
static loom_status make_cuts(ep_part *p, const loom_gpt *m)
{
    int units = loom_gpt_get_config(m)->layers + 2;
    size_t unit = (size_t)ZERO_ALIGN * (size_t)p->n, n = 0;
    if (!(p->cuts = malloc((2 * (size_t)units + 2) * sizeof *p->cuts)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO-3's buckets under ep");
    p->cuts[n++] = 0;
    p->cuts[n++] = p->Kp;
    for (int u = 1; u < units; u++) {
        int first, last;
        loom_gpt_unit_entries(m, u, &first, &last);
        for (int i = 0; i < p->n_runs; i++) /* the unit's first run of this kind */
            if (p->runs[i].entry >= first && p->runs[i].entry <= last) {
                size_t b = p->runs[i].packed;
                p->cuts[n++] = b / unit * unit;
                p->cuts[n++] = round_up(b, unit);
                break;
            }
    }
    qsort(p->cuts, n, sizeof *p->cuts, cmp_size);
    int k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || p->cuts[i] != p->cuts[k - 1])
            p->cuts[k++] = p->cuts[i];
    p->n_cuts = k;
    return LOOM_OK;
}

static loom_status make_part(ep_part *p, const loom_param_table *t, const loom_gpt *m, int experts,
                             double bucket_mb, int stage)
{
    p->runs = calloc((size_t)t->count + 1, sizeof *p->runs);
    if (!p->runs)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO under ep");
    for (int i = 0; i < t->count; i++)
        if (loom_gpt_is_expert_entry(m, i) == experts) {
            p->runs[p->n_runs++] = (ep_run){i, t->entries[i].offset, p->K, t->entries[i].numel};
            p->K += t->entries[i].numel;
        }
    size_t unit = (size_t)ZERO_ALIGN * (size_t)p->n;
    p->Kp = round_up(p->K ? p->K : 1, unit);
    size_t want = (size_t)(bucket_mb * 1024 * 1024 / sizeof(float));
    p->want = want < unit ? unit : want / unit * unit;
    return stage == 3 ? make_cuts(p, m) : LOOM_OK;
}

/* The walk every use shares: rank q's pieces of part p, bucket by bucket, each with its
 * place in q's partition (pos0 + part_off + its offset in the sub-block). */
typedef struct walk_ctx {
    void (*emit)(struct walk_ctx *w, const ep_run *r, size_t flat, size_t n, size_t pos);
    size_t base;         /* pos of the sub-block's first packed float */
    size_t a;            /* its packed start */
    void *out;
    size_t k;
} walk_ctx;

static void walk_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    walk_ctx *w = ctx;
    w->emit(w, r, flat, n, w->base + (packed - w->a));
}

static void walk(const ep_part *p, int q, walk_ctx *w)
{
    for (size_t lo = 0, len; lo < p->Kp; lo += len) {
        size_t a, e, off;
        len = zero_ep_bucket_len(p, lo);
        sub_block(p, lo, len, q, &a, &e, &off);
        w->base = p->pos0 + off;
        w->a = a;
        zero_ep_each_piece(p, a, e, walk_piece, w);
    }
}

typedef struct seg_out {
    loom_zero *z;
    const loom_zero_config *c;
    const loom_param_table *t;
} seg_out;

static void emit_segment(walk_ctx *w, const ep_run *r, size_t flat, size_t n, size_t pos)
{
    seg_out *o = w->out;
    loom_zero *z = o->z;
    const loom_param_entry *e = &o->t->entries[r->entry];
    loom_optim_segment *s = &z->segments[z->n_segments];
    /* stage 3: the partition's parameters; below it the model's */
    s->param = z->part_params ? z->part_params + pos : loom_gpt_param_data(z->model) + flat;
    s->grad = z->part_grads ? z->part_grads + pos : loom_gpt_grad_data(z->model) + flat;
    s->n = n;
    s->weight_decay = (o->c->decay_all || e->is_matrix) ? o->c->weight_decay : 0.0f;
    z->seg_entry[z->n_segments] = r->entry;
    z->seg_state_off[z->n_segments] = (size_t)o->c->state_slots * pos;
    s->state = z->state ? z->state + z->seg_state_off[z->n_segments] : NULL;
    z->n_segments++;
}

static void emit_piece(walk_ctx *w, const ep_run *r, size_t flat, size_t n, size_t pos)
{
    loom_zero_piece *p = w->out;
    p[w->k++] = (loom_zero_piece){r->entry, flat, n, pos};
}

static void count_piece(walk_ctx *w, const ep_run *r, size_t flat, size_t n, size_t pos)
{
    (void)r, (void)flat, (void)n, (void)pos;
    w->k++;
}

static size_t count_pieces(const loom_zero *z)
{
    walk_ctx w = {count_piece, 0, 0, NULL, 0};
    for (int k = 0; k < 2; k++)
        walk(&z->ep->part[k], z->ep->part[k].rank, &w);
    return w.k;
}

loom_status zero_ep_create(const loom_zero_config *c, loom_gpt *m, loom_backend *be,
                           loom_zero **out)
{
    *out = NULL;
    if (c->offloaded || c->params_offloaded)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "mesh ep with offload does not compose yet (ZeRO "
                  "partitions the experts over their edp group in this process; the offload's "
                  "chunks are not laid out for it); drop strategy.offload");
    loom_zero *z = calloc(1, sizeof *z);
    struct zero_ep *x = calloc(1, sizeof *x);
    if (!z || !x) {
        free(z);
        free(x);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    z->ep = x;
    z->stage = c->stage;
    z->reduces = c->stage >= 2 && !c->canonical; /* canonical: stage 1's reduction */
    z->model = m;
    z->be = be;
    z->total = loom_gpt_params(m)->total;
    z->accum = c->accum;
    z->whole_grads = c->whole_grads;
    z->skip_entry = -1;
    z->first_bad = -1;
    /* a device backend (zero_device.c): the state, the staging and stage 2's partition are
     * its memory, the buckets go over the device groups, the host groups carry what is
     * host memory (the norm's doubles, a checkpoint's whole state); with 16-bit weights
     * every rank keeps the whole fp32 master in the model's buffer, as on the CPU (zero.c),
     * and the backend rounds the compute copy from it after each step (session.c) */
    z->device = loom_backend_device_memory(be);
    const loom_param_table *t = loom_gpt_params(m);
    ep_part *d = &x->part[0], *e = &x->part[1];
    loom_status st = loom_core_host()->group(LOOM_GROUP_DP, &d->hcomm, &d->hgroup, &d->n);
    int dn = d->n;
    if (st == LOOM_OK && z->device)
        st = loom_core_host()->device_group(LOOM_GROUP_DP, &d->comm, &d->group, &dn);
    else if (st == LOOM_OK) {
        d->comm = d->hcomm;
        d->group = d->hgroup;
    }
    if (st == LOOM_OK && (!d->comm || dn != d->n))
        st = loom_fail(LOOM_ERR_INTERNAL, "ZeRO under ep in device memory: the device dp group "
                       "has %d ranks, the host one %d (loom_dist_device_open)", dn, d->n);
    if (st == LOOM_OK) {
        d->rank = d->hcomm->rank(d->hgroup);
        z->comm = d->comm;
        z->dp = d->group;
        z->hcomm = d->hcomm; /* the norm's host doubles (loom_zero_norm) */
        z->hdp = d->hgroup;
        z->n = d->n;
        z->rank = d->rank;
        st = loom_core_host()->group(LOOM_GROUP_TP, &z->tp_comm, &z->tp, &z->tp_size);
        z->tp_rank = z->tp_comm ? z->tp_comm->rank(z->tp) : 0;
        loom_ep_edp_group(c->ep, &e->hcomm, &e->hgroup, &e->n);
        loom_ep_edp_device_group(c->ep, &e->comm, &e->group, &e->n);
        e->rank = e->n > 1 ? e->hcomm->rank(e->hgroup) : 0;
    }
    if (st == LOOM_OK)
        st = make_part(d, t, m, 0, c->bucket_mb, c->stage);
    if (st == LOOM_OK)
        st = make_part(e, t, m, 1, c->bucket_mb, c->stage);
    if (st == LOOM_OK) {
        e->pos0 = d->Kp / (size_t)d->n;
        z->part = e->pos0 + e->Kp / (size_t)e->n;
        z->state_floats = (size_t)c->state_slots * z->part;
        /* the gather's staging: one bucket, which is at most the padded kind */
        size_t stage = 0;
        for (int k = 0; k < 2; k++)
            for (size_t lo = 0, len; lo < x->part[k].Kp; lo += len)
                if ((len = zero_ep_bucket_len(&x->part[k], lo)) > stage)
                    stage = len;
        if (c->stage == 3 && (!(z->part_params = zero_buf_alloc(z, z->part)) ||
                              (z->device && !(z->host_part = calloc(z->part + 1, sizeof(float))))))
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for ZeRO-3's parameter partition");
        if (z->reduces) /* the gradient partition and the page accounting (zero_reduce.c) */
            st = zero_reduce_init(z);
        z->staging_floats = stage; /* the gather's; stage 2 adds its slots */
        size_t n = count_pieces(z);
        z->segments = calloc(n + 1, sizeof *z->segments);
        z->seg_entry = calloc(n + 1, sizeof *z->seg_entry);
        z->seg_state_off = calloc(n + 1, sizeof *z->seg_state_off);
        x->staging = zero_buf_alloc(z, stage);
        if (z->device) {
            if (st == LOOM_OK)
                st = zero_device_state(z, 0); /* zeroed, with its host mirror (offload is refused above) */
        } else if (z->state_floats && (z->state = malloc(z->state_floats * sizeof(float))))
            memset(z->state, 0, z->state_floats * sizeof(float)); /* touched now, as zero.c's */
        if (st == LOOM_OK && (!z->segments || !z->seg_entry || !z->seg_state_off ||
                              !x->staging || (z->state_floats && !z->state)))
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for the ZeRO partitions under ep");
    }
    if (st == LOOM_OK && z->reduces)
        st = zero_ep_reduce_init(z);
    if (st == LOOM_OK) {
        seg_out o = {z, c, t};
        walk_ctx w = {emit_segment, 0, 0, &o, 0};
        for (int k = 0; k < 2; k++)
            walk(&x->part[k], x->part[k].rank, &w);
    }
    if (st == LOOM_OK && c->stage == 3)
        st = zero_ep_params_init(z); /* the partition from the initial values, first */
    /* a device's gradient (stages 2, 3 reducing) and parameter (stage 3) buffers as sparse
     * ranges, where the backend can (zero_sparse.c); the segments above point into the
     * partitions, not into these buffers */
    if (st == LOOM_OK)
        st = zero_device_sparse(z);
    if (st != LOOM_OK) {
        loom_zero_destroy(z);
        return st;
    }
    *out = z;
    return LOOM_OK;
}

void zero_ep_free(loom_zero *z)
{
    if (!z->ep)
        return;
    for (int k = 0; k < 2; k++) {
        free(z->ep->part[k].runs);
        free(z->ep->part[k].cuts);
    }
    free(z->ep->ulo);
    free(z->ep->uhi);
    zero_buf_free(z, z->ep->staging);
    zero_ep_slots_free(z);
    zero_ep_reduce_free(z);
    free(z->ep);
    z->ep = NULL;
}

loom_status zero_ep_pieces(const loom_zero *z, loom_zero_piece **out, size_t *n)
{
    size_t cap = count_pieces(z);
    loom_zero_piece *p = malloc((cap + 1) * sizeof *p);
    if (!p)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for ZeRO checkpoint pieces");
    walk_ctx w = {emit_piece, 0, 0, p, 0};
    for (int k = 0; k < 2; k++)
        walk(&z->ep->part[k], z->ep->part[k].rank, &w);
    *out = p;
    *n = w.k;
    return LOOM_OK;
}

typedef struct copy_ctx {
    loom_zero *z;
    float *params, *buf;
    size_t a;            /* the packed float at buf[0] */
    int to_buf;
} copy_ctx;

static void copy_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    (void)r;
    copy_ctx *c = ctx;
    float *b = c->buf + (packed - c->a);
    if (c->to_buf)
        zero_buf_move(c->z, b, c->params + flat, n);
    else
        zero_buf_move(c->z, c->params + flat, b, n);
}

loom_status zero_ep_gather(loom_zero *z)
{
    float *params = loom_gpt_param_data(z->model), *buf = z->ep->staging;
    for (int k = 0; k < 2; k++) {
        const ep_part *p = &z->ep->part[k];
        if (p->n < 2 || !p->K)
            continue; /* an edp group of one (ep = dp): its experts are its own */
        for (size_t lo = 0, len; lo < p->Kp; lo += len) {
            size_t a, e, off;
            len = zero_ep_bucket_len(p, lo);
            sub_block(p, lo, len, p->rank, &a, &e, &off);
            size_t sub = e - a;
            zero_buf_clear(z, buf + (a - lo), sub); /* the padding past K */
            copy_ctx out = {z, params, buf + (a - lo), a, 1};
            zero_ep_each_piece(p, a, e, copy_piece, &out);
            loom_comm_request *r;
            LOOM_TRY(p->comm->allgather_start(p->group, buf + (a - lo), buf, sub, LOOM_DTYPE_F32, &r));
            LOOM_TRY(p->comm->wait(p->group, r));
            copy_ctx in = {z, params, buf, lo, 0};
            zero_ep_each_piece(p, lo, lo + len, copy_piece, &in);
        }
    }
    return LOOM_OK;
}

/* The state of pieces p (n of them, at slots x pos of part) into the entry-major whole
 * state full (entry i's slot k at slots x offset + k x numel). */
static void pieces_to_full(const loom_param_table *t, const loom_zero_piece *p, size_t n,
                           uint32_t slots, const float *part, float *full)
{
    for (size_t i = 0; i < n; i++) {
        const loom_param_entry *e = &t->entries[p[i].entry];
        for (uint32_t k = 0; k < slots; k++)
            memcpy(full + (size_t)slots * e->offset + (size_t)k * e->numel + (p[i].lo - e->offset),
                   part + (size_t)slots * p[i].pos + (size_t)k * p[i].n, p[i].n * sizeof(float));
    }
}

/* buf is host memory (the whole state): over the kind's host group. */
static loom_status sum_over(const ep_part *g, float *buf, size_t n)
{
    if (g->n < 2 || !n)
        return LOOM_OK;
    loom_comm_request *r;
    LOOM_TRY(g->hcomm->allreduce_start(g->hgroup, buf, buf, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r));
    return g->hcomm->wait(g->hgroup, r);
}

loom_status loom_zero_full_state(loom_zero *z, uint32_t slots, float **out)
{
    *out = NULL;
    if (!z->ep)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "loom_zero_full_state: only under expert parallelism");
    /* a device's state through its host mirror (loom_zero_to_host, before the save) */
    const float *state = z->device ? z->host_state : z->state;
    if (!slots || !state)
        return LOOM_OK;
    const loom_param_table *t = loom_gpt_params(z->model);
    loom_zero_piece *p;
    size_t n;
    LOOM_TRY(zero_ep_pieces(z, &p, &n));
    size_t nd = 0; /* the dense pieces come first */
    while (nd < n && !loom_gpt_is_expert_entry(z->model, p[nd].entry))
        nd++;
    float *full = calloc((size_t)slots * t->total + 1, sizeof(float));
    if (!full) {
        free(p);
        LOOM_FAIL(LOOM_ERR_NOMEM, "checkpoint under ep: out of memory for the whole optimizer "
                  "state (%zu MiB)", (size_t)slots * t->total * 4 >> 20);
    }
    /* every float has one owner and zeros elsewhere, so the sums are exact: the dense
     * entries over dp (the expert entries are zero on every rank there), then each run of
     * expert entries over the edp group */
    pieces_to_full(t, p, nd, slots, state, full);
    loom_status st = sum_over(&z->ep->part[0], full, (size_t)slots * t->total);
    pieces_to_full(t, p + nd, n - nd, slots, state, full);
    for (int i = 0; st == LOOM_OK && i < t->count; i++) {
        if (!loom_gpt_is_expert_entry(z->model, i))
            continue;
        int j = i;
        while (j + 1 < t->count && loom_gpt_is_expert_entry(z->model, j + 1))
            j++;
        size_t lo = t->entries[i].offset, hi = t->entries[j].offset + t->entries[j].numel;
        st = sum_over(&z->ep->part[1], full + (size_t)slots * lo, (size_t)slots * (hi - lo));
        i = j;
    }
    free(p);
    if (st != LOOM_OK) {
        free(full);
        return st;
    }
    *out = full;
    return LOOM_OK;
}
