/* offload_device.c — the offloaded optimizer step where the model lives in a device
 * backend's memory (offload.h; ZeRO-Offload's arrangement: parameters and gradients on
 * the device, the optimizer state and its step on the host).
 *
 * Chunks 0..K-1 through three host buffers (chunk k in buffer k mod 3), each piece laid
 * out as [its state: disk only][its parameters][its gradients]. copy_in(k): the state
 * read from the file (disk; host: it stays in the pool), the parameters and gradients
 * copied device -> host; copy_out(k): the parameters host -> device, the state written
 * back (disk). The step:
 *
 *     copy_in(0)
 *     for k: hand chunk k to the worker thread (the optimizer's host step);
 *            copy_out(k - 1); copy_in(k + 1); wait for chunk k
 *     copy_out(K - 1)
 *
 * so the host step of chunk k runs while the caller's thread moves k - 1 and k + 1, and
 * the three chunks in flight are in three buffers. With params = true (ZeRO-3's partition
 * offloaded beside the state: zero_params_store.c) the parameters are not the device's:
 * only the gradients come over; the host pool's parameters are stepped in the pool, the
 * disk's are read and written with the chunk's state (offload_disk_chunk), so the updated
 * partition is back in the pool or file when the step returns. Every backend call is on the caller's
 * thread (a CUDA device is current per thread). The backend's copies return once done
 * (backend.h), so on a GPU the overlap is the host step against the transfers, not two
 * transfers against each other; on cudaemu a copy is a memcpy.
 *
 * Bits: the worker runs the plugin's host step on the chunk's pieces, whose arithmetic is
 * step_backend's bit for bit (tests/cuda's cuda_optim), and AdamW and SGD are elementwise,
 * so the offloaded step gives the device step's bits.
 */
#include "offload_internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static void *worker_main(void *arg)
{
    loom_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->job && !o->quit)
            pthread_cond_wait(&o->cv, &o->mu);
        if (!o->job)
            break; /* quit */
        pthread_mutex_unlock(&o->mu);
        loom_status st = o->job_ops->step(o->job_self, &o->job_args);
        pthread_mutex_lock(&o->mu);
        o->job_status = st;
        if (st != LOOM_OK) /* this thread's message, for the caller's */
            snprintf(o->job_msg, sizeof o->job_msg, "%s", loom_last_error());
        o->job = 0;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

loom_status offload_device_open(loom_offload *o)
{
    o->n_bufs = o->n_chunks < OFFLOAD_BUFS ? (int)o->n_chunks : OFFLOAD_BUFS;
    for (int i = 0; i < o->n_bufs; i++)
        if (!(o->bufs[i] = offload_host_alloc(o, o->buf_floats * sizeof(float))))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the offload's chunk buffers (%d of "
                      "%zu bytes)", o->n_bufs, o->buf_floats * sizeof(float));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, worker_main, o) != 0) {
        pthread_mutex_destroy(&o->mu);
        pthread_cond_destroy(&o->cv);
        LOOM_FAIL(LOOM_ERR_INTERNAL, "offload: cannot start the optimizer's host thread");
    }
    o->thread_started = 1;
    return LOOM_OK;
}

void offload_device_close(loom_offload *o)
{
    offload_stop_thread(o);
    for (int i = 0; i < o->n_bufs; i++)
        if (o->bufs[i])
            offload_host_free(o, o->bufs[i]);
    o->n_bufs = 0; /* freed here, not again by offload_disk_close */
}

static float *buf_of(const loom_offload *o, size_t k) { return o->bufs[k % (size_t)o->n_bufs]; }

/* A piece's parameters and gradients in its chunk's buffer, after its state. */
static float *piece_params(const loom_offload *o, float *buf, const offload_piece *p)
{
    return buf + p->buf_off + (size_t)o->buf_state * p->seg.n;
}

static loom_status copy_in(loom_offload *o, size_t k)
{
    float *buf = buf_of(o, k);
    if (o->mode == LOOM_OFFLOAD_DISK)
        LOOM_TRY(offload_disk_chunk(o, 0, k, buf));
    const offload_chunk *c = &o->chunks[k];
    for (size_t j = 0; j < c->count; j++) {
        const offload_piece *p = &o->pieces[c->first + j];
        float *params = piece_params(o, buf, p);
        size_t bytes = p->seg.n * sizeof(float);
        if (!o->param_floats) /* params = true: the pool's, or the file's (read above) */
            o->dev->copy_to_host(o->dev_self, params, p->seg.param, bytes);
        o->dev->copy_to_host(o->dev_self, params + p->seg.n, p->seg.grad, bytes);
    }
    return LOOM_OK;
}

static loom_status copy_out(loom_offload *o, size_t k)
{
    float *buf = buf_of(o, k);
    const offload_chunk *c = &o->chunks[k];
    for (size_t j = 0; !o->param_floats && j < c->count; j++) { /* params: none on the device */
        const offload_piece *p = &o->pieces[c->first + j];
        o->dev->copy_to_device(o->dev_self, p->seg.param, piece_params(o, buf, p),
                               p->seg.n * sizeof(float));
    }
    return o->mode == LOOM_OFFLOAD_DISK ? offload_disk_chunk(o, 1, k, buf) : LOOM_OK;
}

/* Chunk k's segments over its buffer (and the pool's state) to the worker. */
static void hand_over(loom_offload *o, const loom_optim_ops *ops, void *self,
                      const loom_optim_step_args *args, size_t k)
{
    const offload_chunk *c = &o->chunks[k];
    float *buf = buf_of(o, k);
    for (size_t j = 0; j < c->count; j++) {
        const offload_piece *p = &o->pieces[c->first + j];
        float *params = piece_params(o, buf, p);
        o->scratch[j] = p->seg;
        /* params = true in the host pool: stepped in place there, after the state */
        o->scratch[j].param = o->param_floats && o->pool ? o->pool + o->floats + p->param_pos
                                                         : params;
        o->scratch[j].grad = params + p->seg.n;
        o->scratch[j].state = o->mode == LOOM_OFFLOAD_DISK ? buf + p->buf_off
                                                           : o->pool + p->pool_off;
    }
    pthread_mutex_lock(&o->mu);
    o->job_args = *args;
    o->job_args.segments = o->scratch;
    o->job_args.n_segments = c->count;
    o->job_ops = ops;
    o->job_self = self;
    o->job = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static loom_status wait_step(loom_offload *o, size_t k)
{
    pthread_mutex_lock(&o->mu);
    while (o->job)
        pthread_cond_wait(&o->cv, &o->mu);
    loom_status st = o->job_status;
    pthread_mutex_unlock(&o->mu);
    if (st != LOOM_OK)
        return loom_fail(st, "offloaded optimizer step, chunk %zu of %zu: %s", k + 1,
                         o->n_chunks, o->job_msg);
    return LOOM_OK;
}

loom_status offload_device_step(loom_offload *o, const loom_optim_ops *ops, void *self,
                                const loom_optim_step_args *args)
{
    if (o->n_chunks == 0)
        return LOOM_OK;
    LOOM_TRY(copy_in(o, 0));
    for (size_t k = 0; k < o->n_chunks; k++) {
        hand_over(o, ops, self, args, k);
        /* the worker steps chunk k meanwhile; a failed copy still waits for it, so no
         * buffer is in use when this returns */
        loom_status st = k > 0 ? copy_out(o, k - 1) : LOOM_OK;
        if (st == LOOM_OK && k + 1 < o->n_chunks)
            st = copy_in(o, k + 1);
        loom_status w = wait_step(o, k);
        LOOM_TRY(st);
        LOOM_TRY(w);
    }
    return copy_out(o, o->n_chunks - 1);
}
