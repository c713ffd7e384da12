/* offload.c — the offloaded optimizer state's pieces and chunks, the host pool, and the
 * chunked step (see offload.h). The disk's file and I/O thread are offload_disk.c. */
#include "offload_internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

const char *loom_offload_mode_name(loom_offload_mode m)
{
    return m == LOOM_OFFLOAD_HOST ? "host" : m == LOOM_OFFLOAD_DISK ? "disk" : "none";
}

static int pinned(const loom_offload *o)
{
    return o->dev && o->dev->size > offsetof(loom_backend_ops, host_free) && o->dev->host_alloc &&
           o->dev->host_free;
}

void *offload_host_alloc(loom_offload *o, size_t bytes)
{
    return pinned(o) ? o->dev->host_alloc(o->dev_self, bytes) : calloc(1, bytes ? bytes : 1);
}

void offload_host_free(loom_offload *o, void *p)
{
    if (pinned(o))
        o->dev->host_free(o->dev_self, p);
    else
        free(p);
}

/* Cut the segments into pieces and group them into chunks of at most cap buffer floats.
 * o->split = 0 (host on the CPU backend): a piece is a whole segment, so a chunk of one
 * long segment may exceed cap; 1 (disk, and any place on a device): a segment is cut
 * where a chunk fills, and in the host pool each piece's state is slot-major over the
 * piece (pool_off), as the optimizer's step reads it. */
static loom_status make_chunks(loom_offload *o, const loom_optim_segment *segs,
                               const size_t *state_off, const size_t *param_off, size_t n,
                               size_t cap)
{
    int split = o->split;
    size_t pooled = 0; /* split: the pool's floats placed so far */
    size_t per = cap / o->per_elem ? cap / o->per_elem : 1; /* elements per full chunk */
    size_t max_pieces = n;
    for (size_t i = 0; split && i < n; i++)
        max_pieces += segs[i].n / per + 1;
    o->pieces = calloc(max_pieces, sizeof *o->pieces);
    o->chunks = calloc(max_pieces, sizeof *o->chunks);
    if (!o->pieces || !o->chunks)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the offloaded optimizer's chunks");
    size_t room = 0; /* elements left in the open chunk */
    for (size_t i = 0; i < n; i++) {
        const loom_optim_segment *s = &segs[i];
        if (state_off[i] > o->floats || o->slots * s->n > o->floats - state_off[i])
            LOOM_FAIL(LOOM_ERR_INTERNAL, "offload: segment %zu's state lies outside the state", i);
        if (param_off && (param_off[i] > o->param_floats || s->n > o->param_floats - param_off[i]))
            LOOM_FAIL(LOOM_ERR_INTERNAL, "offload: segment %zu's parameters lie outside them", i);
        for (size_t i0 = 0; i0 < s->n;) {
            size_t m = s->n - i0;
            if (o->n_chunks == 0 || room == 0 || (!split && m > room)) {
                offload_chunk *c = &o->chunks[o->n_chunks++];
                c->first = o->n_pieces;
                room = per;
            }
            if (split && m > room)
                m = room;
            offload_chunk *c = &o->chunks[o->n_chunks - 1];
            offload_piece *p = &o->pieces[o->n_pieces++];
            p->seg = *s;
            p->seg.param = s->param ? s->param + i0 : NULL; /* params: set per chunk */
            p->param_pos = param_off ? param_off[i] + i0 : 0;
            p->seg.grad = s->grad + i0;
            p->seg.n = m;
            p->seg_off = state_off[i];
            p->seg_n = s->n;
            p->i0 = i0;
            p->pool_off = split ? pooled : state_off[i];
            pooled += (size_t)o->slots * m;
            p->buf_off = c->floats;
            c->count++;
            c->floats += o->per_elem * m;
            room = m >= room ? 0 : room - m;
            if (c->count > o->max_count)
                o->max_count = c->count;
            if (c->floats > o->buf_floats)
                o->buf_floats = c->floats;
            i0 += m;
        }
    }
    o->scratch = calloc(o->max_count ? o->max_count : 1, sizeof *o->scratch);
    if (!o->scratch)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the offloaded optimizer's chunks");
    return LOOM_OK;
}

loom_status loom_offload_create(const loom_offload_config *c, const loom_optim_segment *segs,
                                const size_t *state_off, size_t n, size_t floats, uint32_t slots,
                                loom_offload **out)
{
    *out = NULL;
    if (c->mode != LOOM_OFFLOAD_HOST && c->mode != LOOM_OFFLOAD_DISK)
        LOOM_FAIL(LOOM_ERR_INVALID, "offload optimizer: \"host\" or \"disk\"");
    double mb = c->chunk_mb > 0 ? c->chunk_mb : 64.0;
    if (!(mb <= 4096))
        LOOM_FAIL(LOOM_ERR_INVALID, "strategy.offload.chunk_mb=%g must be in (0, 4096]", mb);
    if (slots == 0 || floats == 0)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy.offload: this optimizer keeps no state "
                  "(state_per_param = 0), so there is nothing to offload: leave offload out");
    loom_offload *o = calloc(1, sizeof *o);
    if (!o)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    o->mode = c->mode;
    o->slots = slots;
    o->floats = floats;
    o->param_floats = c->param_off ? c->param_floats : 0;
    o->dev = c->backend;
    o->dev_self = c->backend_self;
    o->buf_state = c->mode == LOOM_OFFLOAD_DISK ? slots : 0;
    o->split = c->mode == LOOM_OFFLOAD_DISK || o->dev;
    /* on a device the buffers also stage each element's parameter and gradient (with
     * params = true the parameter's place is where the disk's chunk reads it, after the
     * state; the host pool's are stepped in the pool, their place left unused) */
    o->per_elem = o->dev ? o->buf_state + 2u : slots + (c->param_off ? 1u : 0u);
    o->fd = -1;
    size_t cap = (size_t)(mb * 1024 * 1024 / sizeof(float));
    cap = cap < o->per_elem ? o->per_elem : cap;
    loom_status st = make_chunks(o, segs, state_off, c->param_off, n, cap);
    if (st == LOOM_OK && c->mode == LOOM_OFFLOAD_HOST) {
        /* A pool of its own: on a device backend its host_alloc's (CUDA: pinned), stepped
         * on a host thread (offload_device.c); on the CPU backend, a separate allocation.
         * The parameters (params = true) follow the state. */
        if (!(o->pool = offload_host_alloc(o, (floats + o->param_floats) * sizeof(float))))
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for the host pool of %zu bytes of "
                           "optimizer state and parameters",
                           (floats + o->param_floats) * sizeof(float));
    }
    if (st == LOOM_OK && c->mode == LOOM_OFFLOAD_DISK)
        st = offload_disk_open(o, c);
    if (st == LOOM_OK && o->dev)
        st = offload_device_open(o);
    if (st != LOOM_OK) {
        loom_offload_destroy(o);
        return st;
    }
    *out = o;
    return LOOM_OK;
}

void loom_offload_destroy(loom_offload *o)
{
    if (!o)
        return;
    if (o->dev)
        offload_device_close(o);
    if (o->mode == LOOM_OFFLOAD_DISK)
        offload_disk_close(o);
    if (o->pool)
        offload_host_free(o, o->pool);
    free(o->pieces);
    free(o->chunks);
    free(o->scratch);
    free(o);
}

loom_status loom_offload_step(loom_offload *o, const loom_optim_ops *ops, void *self,
                              const loom_optim_step_args *args)
{
    if (o->dev)
        return offload_device_step(o, ops, self, args);
    if (o->mode == LOOM_OFFLOAD_DISK)
        return offload_disk_step(o, ops, self, args);
    for (size_t k = 0; k < o->n_chunks; k++) { /* host: in place in the pool */
        const offload_chunk *c = &o->chunks[k];
        for (size_t j = 0; j < c->count; j++) {
            const offload_piece *p = &o->pieces[c->first + j];
            o->scratch[j] = p->seg;
            o->scratch[j].state = o->pool + p->pool_off;
            if (o->param_floats)
                o->scratch[j].param = o->pool + o->floats + p->param_pos;
        }
        loom_optim_step_args a = *args;
        a.segments = o->scratch;
        a.n_segments = c->count;
        LOOM_TRY(ops->step(self, &a));
    }
    return LOOM_OK;
}

void loom_offload_memory(const loom_offload *o, size_t *resident, size_t *offloaded)
{
    *offloaded = o->floats * sizeof(float);
    /* the chunk buffers' state (disk): in the process's memory; on a device backend that is
     * host memory, not the device's, and its parameter and gradient staging holds no
     * state, so nothing of the optimizer is resident on the device */
    *resident = o->dev ? 0 : (size_t)o->n_bufs * o->buf_floats * sizeof(float);
}

size_t loom_offload_param_bytes(const loom_offload *o) { return o->param_floats * sizeof(float); }

size_t loom_offload_floats(const loom_offload *o) { return o->floats; }

/* n floats at float `at` of the pool or file, out to buf (write = 0) or in from it. */
static loom_status copy_floats(loom_offload *o, int write, float *buf, size_t at, size_t n)
{
    if (o->mode == LOOM_OFFLOAD_DISK)
        return offload_disk_copy(o, write, buf, at, n);
    if (write)
        memcpy(o->pool + at, buf, n * sizeof(float));
    else
        memcpy(buf, o->pool + at, n * sizeof(float));
    return LOOM_OK;
}

/* The host pool with pieces cut (on a device): each piece's slots between the caller's
 * layout (slot k of element i at seg_off + k seg_n + i) and the pool's (pool_off + k n). */
static void pool_pieces(loom_offload *o, int write, float *buf)
{
    if (!write)
        memset(buf, 0, o->floats * sizeof(float)); /* any float between the segments */
    for (size_t j = 0; j < o->n_pieces; j++) {
        const offload_piece *p = &o->pieces[j];
        for (uint32_t k = 0; k < o->slots; k++) {
            float *pool = o->pool + p->pool_off + (size_t)k * p->seg.n;
            float *at = buf + p->seg_off + (size_t)k * p->seg_n + p->i0;
            memcpy(write ? pool : at, write ? at : pool, p->seg.n * sizeof(float));
        }
    }
}

loom_status loom_offload_read_state(loom_offload *o, float *dst)
{
    if (o->pool && o->split) {
        pool_pieces(o, 0, dst);
        return LOOM_OK;
    }
    return copy_floats(o, 0, dst, 0, o->floats);
}

loom_status loom_offload_write_state(loom_offload *o, const float *src)
{
    if (o->pool && o->split) {
        pool_pieces(o, 1, (float *)src);
        return LOOM_OK;
    }
    return copy_floats(o, 1, (float *)src, 0, o->floats);
}

static loom_status param_range(const loom_offload *o, size_t pos, size_t n)
{
    if (pos > o->param_floats || n > o->param_floats - pos)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "offload: parameters [%zu, %zu) outside the %zu held", pos,
                  pos + n, o->param_floats);
    return LOOM_OK;
}

loom_status loom_offload_read_params(loom_offload *o, size_t pos, size_t n, float *dst)
{
    LOOM_TRY(param_range(o, pos, n));
    return copy_floats(o, 0, dst, o->floats + pos, n);
}

loom_status loom_offload_write_params(loom_offload *o, size_t pos, size_t n, const float *src)
{
    LOOM_TRY(param_range(o, pos, n));
    return copy_floats(o, 1, (float *)src, o->floats + pos, n);
}
