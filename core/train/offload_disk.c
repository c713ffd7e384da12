/* offload_disk.c — the optimizer state in a file, streamed through chunk buffers by a
 * background I/O thread (offload.h; ZeRO-Infinity's NVMe offload, on any filesystem).
 *
 * The file: <path>/loom-optim-rank<R>-<pid>.bin, created (O_EXCL) and reserved at start
 * with posix_fallocate (so a full disk is reported before training, naming the bytes),
 * removed when the session closes. It is scratch, not a checkpoint.
 * The step, for chunks 0..K-1 through three buffers (chunk k in buffer k mod 3): read
 * chunk 0; then for each k queue the read of k+1, wait for k's read, step k, queue k's
 * write. The I/O thread works the queue in order, so the read of k+1 into buffer
 * (k+1) mod 3 comes after the write of k-2 from that buffer, and while chunk k is updated
 * the thread writes k-1 and reads k+1.
 */
#include "offload_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"

static void io_fail(loom_offload *o, const char *what, size_t off, size_t bytes, ssize_t got,
                    int err)
{
    if (o->io_status != LOOM_OK)
        return;
    o->io_status = LOOM_ERR_IO;
    if (got >= 0)
        snprintf(o->io_msg, sizeof o->io_msg, "offloaded optimizer state %s: short %s at byte "
                 "%zu: got %zd of %zu bytes (was the file truncated or removed while training?)",
                 o->file, what, off, got, bytes);
    else
        snprintf(o->io_msg, sizeof o->io_msg, "offloaded optimizer state %s: %s of %zu bytes at "
                 "byte %zu failed: %s%s", o->file, what, bytes, off, strerror(err),
                 err == ENOSPC ? " (the disk is full)" : "");
}

/* All of [off, off + bytes) or a failure noted in o->io_status. */
static int io_all(loom_offload *o, int write, char *buf, size_t bytes, size_t off)
{
    size_t done = 0;
    while (done < bytes) {
        ssize_t r = write ? pwrite(o->fd, buf + done, bytes - done, (off_t)(off + done))
                          : pread(o->fd, buf + done, bytes - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            io_fail(o, write ? "write" : "read", off, bytes, r < 0 ? -1 : (ssize_t)done,
                    r < 0 ? errno : 0);
            return 0;
        }
        done += (size_t)r;
    }
    return 1;
}

/* One chunk between its buffer and the file: each piece is slots runs of n floats. */
static void io_chunk(loom_offload *o, const offload_op *op)
{
    const offload_chunk *c = &o->chunks[op->chunk];
    for (size_t j = 0; j < c->count; j++) {
        const offload_piece *p = &o->pieces[c->first + j];
        size_t m = p->seg.n;
        for (uint32_t k = 0; k < o->slots; k++) {
            size_t at = (p->seg_off + (size_t)k * p->seg_n + p->i0) * sizeof(float);
            if (!io_all(o, op->write, (char *)(op->buf + p->buf_off + (size_t)k * m),
                        m * sizeof(float), at))
                return;
        }
        if (o->param_floats && /* params: the piece's parameters after its state */
            !io_all(o, op->write, (char *)(op->buf + p->buf_off + (size_t)o->slots * m),
                    m * sizeof(float), (o->floats + p->param_pos) * sizeof(float)))
            return;
    }
}

static void *io_thread(void *arg)
{
    loom_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->completed == o->submitted && !o->quit)
            pthread_cond_wait(&o->cv, &o->mu);
        if (o->completed == o->submitted)
            break; /* quit, queue drained */
        offload_op op = o->queue[o->completed % OFFLOAD_QUEUE];
        int failed = o->io_status != LOOM_OK;
        pthread_mutex_unlock(&o->mu);
        if (!failed) /* after a failure the rest of the queue is skipped */
            io_chunk(o, &op);
        pthread_mutex_lock(&o->mu);
        o->completed++;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

static uint64_t submit(loom_offload *o, int write, size_t chunk)
{
    pthread_mutex_lock(&o->mu);
    while (o->submitted - o->completed >= OFFLOAD_QUEUE)
        pthread_cond_wait(&o->cv, &o->mu);
    offload_op *op = &o->queue[o->submitted % OFFLOAD_QUEUE];
    op->write = write;
    op->chunk = chunk;
    op->buf = o->bufs[chunk % (size_t)o->n_bufs];
    uint64_t seq = ++o->submitted;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return seq;
}

static loom_status wait_done(loom_offload *o, uint64_t seq)
{
    pthread_mutex_lock(&o->mu);
    while (o->completed < seq)
        pthread_cond_wait(&o->cv, &o->mu);
    loom_status st = o->io_status;
    pthread_mutex_unlock(&o->mu);
    return st == LOOM_OK ? LOOM_OK : loom_fail(st, "%s", o->io_msg);
}

loom_status offload_disk_open(loom_offload *o, const loom_offload_config *c)
{
    if (!c->path || !c->path[0])
        LOOM_FAIL(LOOM_ERR_INVALID, "strategy.offload.optimizer = \"disk\" needs path = \"DIR\" "
                  "(a writable directory for the optimizer state)");
    int n = snprintf(o->file, sizeof o->file, "%s/loom-optim-rank%d-%ld.bin", c->path, c->rank,
                     (long)getpid());
    if (n < 0 || (size_t)n >= sizeof o->file)
        LOOM_FAIL(LOOM_ERR_INVALID, "strategy.offload.path is too long (%zu bytes)",
                  strlen(c->path));
    o->fd = open(o->file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (o->fd < 0)
        LOOM_FAIL(LOOM_ERR_IO, "strategy.offload.path \"%s\": cannot create %s: %s (the path "
                  "must be an existing directory this process can write)", c->path, o->file,
                  strerror(errno));
    size_t bytes = (o->floats + o->param_floats) * sizeof(float); /* params after the state */
    int e = posix_fallocate(o->fd, 0, (off_t)bytes); /* reads back as zeros */
    if (e) {
        close(o->fd);
        o->fd = -1;
        unlink(o->file);
        LOOM_FAIL(LOOM_ERR_IO, "strategy.offload: %s needs %zu bytes for this rank's optimizer "
                  "state and cannot have them: %s%s", o->file, bytes, strerror(e),
                  e == ENOSPC ? " (the disk is full: free space or choose another path)"
                  : e == EFBIG ? " (over the file size limit: ulimit -f)" : "");
    }
    if (o->dev) /* the device loop's buffers and worker take the I/O thread's place */
        return LOOM_OK;
    o->n_bufs = o->n_chunks < OFFLOAD_BUFS ? (int)o->n_chunks : OFFLOAD_BUFS;
    for (int i = 0; i < o->n_bufs; i++)
        if (!(o->bufs[i] = malloc(o->buf_floats * sizeof(float))))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the offload's chunk buffers");
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, io_thread, o) != 0)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "offload: cannot start the I/O thread");
    o->thread_started = 1;
    /* named, so that its own CPU time can be read (/proc/PID/task/TID/comm and schedstat:
     * tests/e2e/recipes/plan_probe.lua holds the plan's file I/O term to it) */
    pthread_setname_np(o->thread, "loom-offload-io");
    return LOOM_OK;
}

void offload_stop_thread(loom_offload *o)
{
    if (!o->thread_started)
        return;
    pthread_mutex_lock(&o->mu);
    o->quit = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    o->thread_started = 0;
}

void offload_disk_close(loom_offload *o)
{
    offload_stop_thread(o);
    if (o->fd >= 0) {
        close(o->fd);
        unlink(o->file);
    }
    for (int i = 0; i < o->n_bufs; i++)
        free(o->bufs[i]);
}

loom_status offload_disk_step(loom_offload *o, const loom_optim_ops *ops, void *self,
                              const loom_optim_step_args *args)
{
    loom_status st = LOOM_OK;
    uint64_t next_read = submit(o, 0, 0), last = next_read;
    for (size_t k = 0; k < o->n_chunks && st == LOOM_OK; k++) {
        uint64_t this_read = next_read;
        if (k + 1 < o->n_chunks)
            last = next_read = submit(o, 0, k + 1);
        st = wait_done(o, this_read);
        if (st != LOOM_OK)
            break;
        const offload_chunk *c = &o->chunks[k];
        float *buf = o->bufs[k % (size_t)o->n_bufs];
        for (size_t j = 0; j < c->count; j++) {
            const offload_piece *p = &o->pieces[c->first + j];
            o->scratch[j] = p->seg;
            o->scratch[j].state = buf + p->buf_off;
            if (o->param_floats)
                o->scratch[j].param = buf + p->buf_off + (size_t)o->slots * p->seg.n;
        }
        loom_optim_step_args a = *args;
        a.segments = o->scratch;
        a.n_segments = c->count;
        st = ops->step(self, &a);
        if (st == LOOM_OK)
            last = submit(o, 1, k);
    }
    loom_status w = wait_done(o, last); /* the queue drained: no buffer still in use */
    return st != LOOM_OK ? st : w;
}

loom_status offload_disk_chunk(loom_offload *o, int write, size_t chunk, float *buf)
{
    offload_op op = {write, chunk, buf};
    io_chunk(o, &op);
    return o->io_status == LOOM_OK ? LOOM_OK : loom_fail(o->io_status, "%s", o->io_msg);
}

loom_status offload_disk_copy(loom_offload *o, int write, float *buf, size_t at, size_t n)
{
    pthread_mutex_lock(&o->mu); /* the thread is idle between steps; this only orders io_msg */
    int ok = o->io_status == LOOM_OK &&
             io_all(o, write, (char *)buf, n * sizeof(float), at * sizeof(float));
    loom_status st = o->io_status;
    pthread_mutex_unlock(&o->mu);
    if (ok)
        return LOOM_OK;
    return loom_fail(st, "%s", o->io_msg);
}
