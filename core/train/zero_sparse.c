/* zero_sparse.c — ZeRO stages 2 and 3 on a device: the model's gradient and parameter
 * buffers as sparse ranges (the backend's vm ops, backend.h), backed by memory only where a
 * bucket or unit is live (zero_internal.h lists the entries; docs/ZERO.md "In device
 * memory"). Without the ops, every entry here is a no-op and the buffers stay whole.
 * Under expert parallelism (zero_ep*.c) the same entries serve: a bucket is then one of
 * zero_ep_reduce.c's packed buckets, whose pieces lie apart in the flat buffer, each piece
 * held and let go as a range of its own; a unit's range is its entries' span (its gathers
 * unpack only its own pieces, zero_ep_gather.c). */
#include "zero_ep_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/gpt_stage.h"

/* Sparse model buffers: with the backend's vm ops the model's
 * gradient buffer (stages 2 and 3, reducing) and parameter buffer (stage 3) become reserved
 * address ranges that kernels index as before, backed by memory only where a bucket or unit
 * is live. A granule can hold the ends of two neighbours: refs counts the buckets (or
 * units) holding each one, and the memory goes back when the last lets go. */
struct zero_sparse {
    float *base;
    size_t floats, granule, n; /* n granules */
    unsigned *refs;
    size_t held, peak;         /* committed bytes now, and their peak */
    int zero_new;              /* gradients: a newly committed granule is zeroed (backward
                                * adds into it); parameters are gathered over whole */
};

static int has_vm(const loom_backend_ops *k)
{
    return k->size >= offsetof(loom_backend_ops, vm_release) + sizeof k->vm_release &&
           k->vm_granule && k->vm_reserve && k->vm_commit && k->vm_decommit && k->vm_release;
}

/* Hold [lo, hi) (floats): each granule it touches counted once more, committed if new. */
static loom_status sparse_hold(loom_zero *z, zero_sparse *s, size_t lo, size_t hi)
{
    const loom_backend_ops *k = z->be->ops;
    if (hi <= lo)
        return LOOM_OK;
    size_t g0 = lo * sizeof(float) / s->granule, g1 = (hi * sizeof(float) - 1) / s->granule;
    for (size_t g = g0; g <= g1; g++) {
        if (s->refs[g]++)
            continue;
        if (k->vm_commit(z->be->self, s->base, g * s->granule, s->granule) != 0) {
            s->refs[g]--;
            for (size_t h = g0; h < g; h++) /* what this call took, given back */
                if (--s->refs[h] == 0) {
                    k->vm_decommit(z->be->self, s->base, h * s->granule, s->granule);
                    s->held -= s->granule;
                }
            LOOM_FAIL(LOOM_ERR_NOMEM, "ZeRO on a device: vm_commit of %zu KiB of the model's "
                      "%s buffer failed (out of device memory)", s->granule >> 10,
                      s->zero_new ? "gradient" : "parameter");
        }
        if (s->zero_new)
            k->zero(z->be->self, (char *)s->base + g * s->granule, s->granule);
        s->held += s->granule;
    }
    size_t cap = s->floats * sizeof(float); /* the last granule's tail is not the buffer's */
    size_t now = s->held < cap ? s->held : cap;
    if (now > s->peak)
        s->peak = now;
    return LOOM_OK;
}

/* Let go of [lo, hi): the granules no one else holds decommitted. Gradients: the part of
 * the range in granules a neighbour still holds is zeroed, ready for the next backward. */
static void sparse_drop(loom_zero *z, zero_sparse *s, size_t lo, size_t hi)
{
    const loom_backend_ops *k = z->be->ops;
    if (hi <= lo)
        return;
    size_t g0 = lo * sizeof(float) / s->granule, g1 = (hi * sizeof(float) - 1) / s->granule;
    for (size_t g = g0; g <= g1; g++) {
        if (--s->refs[g]) {
            if (s->zero_new) {
                size_t a = g * s->granule / sizeof(float), b = a + s->granule / sizeof(float);
                a = a > lo ? a : lo, b = b < hi ? b : hi;
                k->zero(z->be->self, s->base + a, (b - a) * sizeof(float));
            }
            continue;
        }
        k->vm_decommit(z->be->self, s->base, g * s->granule, s->granule);
        s->held -= s->granule;
    }
}

static loom_status sparse_make(loom_zero *z, int which, zero_sparse **out)
{
    const loom_backend_ops *k = z->be->ops;
    zero_sparse *s = calloc(1, sizeof *s);
    if (!s)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    *out = s;
    s->floats = z->total;
    s->granule = k->vm_granule(z->be->self);
    if (!s->granule || s->granule % sizeof(float))
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO on a device: the backend's vm_granule is %zu bytes",
                  s->granule);
    s->n = (z->total * sizeof(float) + s->granule - 1) / s->granule;
    s->refs = calloc(s->n ? s->n : 1, sizeof *s->refs);
    s->base = k->vm_reserve(z->be->self, s->n * s->granule);
    s->zero_new = which == 1;
    if (!s->refs || !s->base)
        LOOM_FAIL(LOOM_ERR_NOMEM, "ZeRO on a device: vm_reserve of %zu MiB of address space "
                  "for the model's %s buffer failed", (s->n * s->granule) >> 20,
                  which ? "gradient" : "parameter");
    loom_gpt_use_sparse_buffer(z->model, which, s->base); /* the model releases the range */
    return LOOM_OK;
}

static void sparse_free(zero_sparse *s)
{
    if (s)
        free(s->refs);
    free(s);
}

/* [lo, hi) of bucket k in the model's buffer (the tail bucket ends at the buffer's end). */
static void bucket_range(const loom_zero *z, int k, size_t *lo, size_t *hi)
{
    const zero_bucket *b = &z->buckets[k];
    *lo = b->lo;
    *hi = b->lo + b->len < z->total ? b->lo + b->len : z->total;
}

/* Under ep, what is done to each piece of bucket k (zero_ep_reduce.c's bk[k]) in the flat
 * buffer: held (the first `limit` pieces only: a failed hold gives back what it took),
 * dropped, or tested for meeting [lo, hi). */
typedef struct piece_ctx {
    loom_zero *z;
    int op;              /* 0 hold, 1 drop, 2 meets [lo, hi) */
    size_t lo, hi, seen, limit;
    int meets;
    loom_status st;
} piece_ctx;

static void each_piece(void *ctx, const ep_run *r, size_t flat, size_t n, size_t packed)
{
    (void)r, (void)packed;
    piece_ctx *c = ctx;
    if (c->st != LOOM_OK || c->seen >= c->limit)
        return;
    if (c->op == 0 && (c->st = sparse_hold(c->z, c->z->gsparse, flat, flat + n)) != LOOM_OK)
        return; /* this piece's hold gave back its own; the caller the earlier ones */
    if (c->op == 1)
        sparse_drop(c->z, c->z->gsparse, flat, flat + n);
    if (c->op == 2 && flat < c->hi && flat + n > c->lo)
        c->meets = 1;
    c->seen++;
}

static piece_ctx ep_pieces(loom_zero *z, int k, int op, size_t lo, size_t hi, size_t limit)
{
    const ep_bucket *b = &z->ep->bk[k];
    piece_ctx c = {z, op, lo, hi, 0, limit, 0, LOOM_OK};
    zero_ep_each_piece(&z->ep->part[b->kind], b->lo, b->lo + b->len, each_piece, &c);
    return c;
}

loom_status zero_device_bucket_hold(loom_zero *z, int k)
{
    if (!z->gsparse || z->bucket_held[k])
        return LOOM_OK;
    if (z->ep) {
        piece_ctx c = ep_pieces(z, k, 0, 0, 0, SIZE_MAX);
        if (c.st != LOOM_OK) {
            (void)ep_pieces(z, k, 1, 0, 0, c.seen); /* the pieces held before the failure */
            return c.st;
        }
    } else {
        size_t lo, hi;
        bucket_range(z, k, &lo, &hi);
        LOOM_TRY(sparse_hold(z, z->gsparse, lo, hi));
    }
    z->bucket_held[k] = 1;
    return LOOM_OK;
}

int zero_device_bucket_done(loom_zero *z, int k)
{
    if (!z->gsparse)
        return 0;
    if (z->bucket_held[k]) {
        if (z->ep) {
            (void)ep_pieces(z, k, 1, 0, 0, SIZE_MAX);
        } else {
            size_t lo, hi;
            bucket_range(z, k, &lo, &hi);
            sparse_drop(z, z->gsparse, lo, hi);
        }
        z->bucket_held[k] = 0;
    }
    return 1;
}

/* The flat range [lo, hi) of unit u's parameter entries; 0 for a unit with none. */
static int unit_entries_span(const loom_zero *z, int u, size_t *lo, size_t *hi)
{
    int first, last;
    loom_gpt_unit_entries(z->model, u, &first, &last);
    if (first > last)
        return 0;
    const loom_param_table *t = loom_gpt_params(z->model);
    *lo = t->entries[first].offset;
    *hi = t->entries[last].offset + t->entries[last].numel;
    return 1;
}

/* The model's hook: before backward writes unit u's gradients, every bucket they fall in
 * (under ep: every packed bucket with a piece in the unit's span). */
static loom_status grad_write(void *ctx, int u)
{
    loom_zero *z = ctx;
    size_t lo, hi;
    if (!unit_entries_span(z, u, &lo, &hi))
        return LOOM_OK;
    if (z->ep) {
        for (int k = 0; k < z->ep->n_bk; k++)
            if (!z->bucket_held[k] && ep_pieces(z, k, 2, lo, hi, SIZE_MAX).meets)
                LOOM_TRY(zero_device_bucket_hold(z, k));
        return LOOM_OK;
    }
    for (int k = 0; k < z->n_buckets; k++)
        if (z->buckets[k].lo < hi && z->buckets[k].lo + z->buckets[k].len > lo)
            LOOM_TRY(zero_device_bucket_hold(z, k));
    return LOOM_OK;
}

/* Stage 3: unit u's buckets' range, what its gathers write (under ep: its entries' span,
 * the only floats its gathers unpack). */
static void unit_range(const loom_zero *z, int u, size_t *lo, size_t *hi)
{
    if (z->ep) {
        if (!unit_entries_span(z, u, lo, hi))
            *lo = *hi = 0;
        return;
    }
    const zero_unit *un = &z->units[u];
    size_t l0, h0, l1, h1;
    bucket_range(z, un->first_bucket, &l0, &h0);
    bucket_range(z, un->last_bucket, &l1, &h1);
    *lo = l0, *hi = h1;
}

loom_status zero_device_unit_hold(loom_zero *z, int u)
{
    if (!z->psparse || z->units[u].held)
        return LOOM_OK;
    size_t lo, hi;
    unit_range(z, u, &lo, &hi);
    LOOM_TRY(sparse_hold(z, z->psparse, lo, hi));
    z->units[u].held = 1;
    return LOOM_OK;
}

int zero_device_unit_drop(loom_zero *z, int u)
{
    if (!z->psparse)
        return 0;
    if (z->units[u].held) {
        size_t lo, hi;
        unit_range(z, u, &lo, &hi);
        sparse_drop(z, z->psparse, lo, hi);
        z->units[u].held = 0;
    }
    return 1;
}

loom_status zero_device_range_hold(loom_zero *z, size_t lo, size_t hi)
{
    return z->psparse ? sparse_hold(z, z->psparse, lo, hi) : LOOM_OK;
}

int zero_device_range_drop(loom_zero *z, size_t lo, size_t hi)
{
    if (!z->psparse)
        return 0;
    sparse_drop(z, z->psparse, lo, hi);
    return 1;
}

loom_status zero_device_sparse(loom_zero *z)
{
    /* LOOM_ZERO_SPARSE=0: the whole allocations, as before the vm ops (the tests' A/B) */
    const char *env = getenv("LOOM_ZERO_SPARSE");
    if (env && strcmp(env, "0") && strcmp(env, "1"))
        LOOM_FAIL(LOOM_ERR_INVALID, "LOOM_ZERO_SPARSE is \"%s\": \"1\" (the default: the "
                  "model's gradient and parameter buffers backed only where live, where the "
                  "backend has vm ops) or \"0\" (whole allocations)", env);
    if (!z->device || !has_vm(z->be->ops) || loom_gpt_is_stage(z->model) ||
        (env && !strcmp(env, "0")) || !z->be->ops->vm_granule(z->be->self))
        return LOOM_OK; /* whole allocations: no vm ops, none here (granule 0: CUDA without
                         * the driver's calls), the A/B, or a pipeline stage (pp is refused
                         * on a device anyway) */
    if (z->reduces && !z->whole_grads) { /* a flag for each bucket (under ep: the packed) */
        z->bucket_held = calloc((size_t)(z->ep ? z->ep->n_bk : z->n_buckets) + 1, 1);
        if (!z->bucket_held)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
        LOOM_TRY(sparse_make(z, 1, &z->gsparse)); /* zeros in the old one: nothing to copy */
        loom_gpt_set_grad_write_hook(z->model, grad_write, z);
    }
    /* the partition holds the initial values (zero_device_params): stage 3's parameters,
     * or master16's fp32 master (its buffer then held only where a reader keeps it,
     * zero_master.c) */
    if (z->stage == 3 || z->master16)
        LOOM_TRY(sparse_make(z, 0, &z->psparse));
    return LOOM_OK;
}

void zero_device_sparse_free(loom_zero *z)
{
    if (z->gsparse)
        loom_gpt_set_grad_write_hook(z->model, NULL, NULL);
    sparse_free(z->gsparse);
    sparse_free(z->psparse);
    free(z->bucket_held);
    z->gsparse = z->psparse = NULL;
    z->bucket_held = NULL;
}

size_t zero_device_grads_peak(const loom_zero *z) { return z->gsparse ? z->gsparse->peak : 0; }
size_t zero_device_params_peak(const loom_zero *z) { return z->psparse ? z->psparse->peak : 0; }

/* [lo, hi) of the sparse parameter buffer to the host mirror or from it. */
static void mirror_range(loom_zero *z, float *host, int to_host, size_t lo, size_t hi)
{
    const loom_backend_ops *k = z->be->ops;
    if (hi <= lo)
        return;
    if (to_host)
        k->copy_to_host(z->be->self, host + lo, z->psparse->base + lo, (hi - lo) * sizeof(float));
    else
        k->copy_to_device(z->be->self, z->psparse->base + lo, host + lo, (hi - lo) * sizeof(float));
}

/* The session's host mirror of the parameter buffer under a sparse stage 3: the units held
 * copied, the rest zeros (what a released unit reads on the host, and read no further);
 * master16: what is held of the buffer (zero_master.c), the rest zeros likewise. */
int loom_zero_params_mirror(loom_zero *z, float *host, int to_host)
{
    if (!z || !z->psparse)
        return 0;
    if (to_host)
        memset(host, 0, z->total * sizeof(float));
    if (z->master16) {
        if (z->held_whole)
            mirror_range(z, host, to_host, 0, z->total);
        else
            mirror_range(z, host, to_host, z->held_lo, z->held_hi);
        return 1;
    }
    for (int u = 0; u < z->n_units; u++) {
        if (!z->units[u].held)
            continue;
        size_t lo, hi;
        unit_range(z, u, &lo, &hi);
        mirror_range(z, host, to_host, lo, hi);
    }
    return 1;
}
