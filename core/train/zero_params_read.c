/* zero_params_read.c — ZeRO-3 with offloaded parameters: the reads of units' partitions
 * out of the offload, on a thread of their own (zero_params_store.c says what is read).
 *
 * A read is submitted with the unit's staging already allocated; the thread reads the
 * unit's sub-blocks into it, first come first served, and the caller waits for it (asleep
 * on a condition variable) before the unit's all-gather sends from the staging. zero_params.c
 * submits the read of the unit after the one it prefetches, so the read of a unit runs
 * while the units before it compute and gather. The bytes read are the same as a read on
 * the caller's thread; only when they are read changes. A failed read's message (a
 * thread-local one, status.h) is carried back to the waiter.
 */
#include "zero_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/status.h"
#include "offload.h"

struct zero_reader {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* a read submitted, a read done, or quit */
    int *queue;          /* units to read, in submission order: [head, tail) of n_units */
    int head, tail, n_units;
    int *pending;        /* per unit: submitted and not yet read */
    loom_status *st;     /* per unit: the last read's status */
    char (*msg)[256];    /* per unit: its message when it failed */
    int quit;
    /* LOOM_ZERO_STATS=1: what the reads cost and how much of it the compute thread waited */
    double read_ms, wait_ms;
    long reads, late; /* late: still being read when the unit was needed */
    size_t bytes;
};

/* On the reader's thread: unit u's sub-blocks, one after another, into its staging. */
static loom_status read_unit(loom_zero *z, int u)
{
    zero_unit *un = &z->units[u];
    size_t at = 0;
    for (int k = un->first_bucket; k <= un->last_bucket; k++) {
        const zero_bucket *b = &z->buckets[k];
        LOOM_TRY(loom_offload_read_params(z->store, b->part_off, b->sub, un->bring + at));
        at += b->sub;
    }
    return LOOM_OK;
}

static void *reader_main(void *arg)
{
    loom_zero *z = arg;
    zero_reader *r = z->reader;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->quit && r->head == r->tail)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->head == r->tail) /* quit with nothing left to read */
            break;
        int u = r->queue[r->head % r->n_units];
        pthread_mutex_unlock(&r->mu);
        double t0 = loom_now_ms();
        loom_status st = read_unit(z, u); /* the unit's staging is the caller's until done */
        double ms = loom_now_ms() - t0;
        pthread_mutex_lock(&r->mu);
        r->read_ms += ms;
        r->reads++;
        r->bytes += z->units[u].bring_floats * sizeof(float);
        r->st[u] = st;
        if (st != LOOM_OK)
            snprintf(r->msg[u], sizeof r->msg[u], "%s", loom_last_error());
        r->pending[u] = 0;
        r->head++;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static loom_status reader_start(loom_zero *z)
{
    zero_reader *r = calloc(1, sizeof *r);
    if (!r)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the ZeRO-3 parameter reader");
    r->n_units = z->n_units;
    r->queue = calloc((size_t)z->n_units, sizeof *r->queue);
    r->pending = calloc((size_t)z->n_units, sizeof *r->pending);
    r->st = calloc((size_t)z->n_units, sizeof *r->st);
    r->msg = calloc((size_t)z->n_units, sizeof *r->msg);
    if (!r->queue || !r->pending || !r->st || !r->msg) {
        free(r->queue), free(r->pending), free(r->st), free(r->msg), free(r);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the ZeRO-3 parameter reader");
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    z->reader = r;
    if (pthread_create(&r->thread, NULL, reader_main, z) != 0) {
        z->reader = NULL;
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r->queue), free(r->pending), free(r->st), free(r->msg), free(r);
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3: cannot start the thread that reads offloaded "
                  "parameters");
    }
    return LOOM_OK;
}

loom_status zero_read_submit(loom_zero *z, int u)
{
    if (!z->reader)
        LOOM_TRY(reader_start(z));
    zero_reader *r = z->reader;
    pthread_mutex_lock(&r->mu);
    int busy = r->pending[u];
    if (!busy) { /* the queue holds each unit at most once, so n_units slots suffice */
        r->pending[u] = 1;
        r->st[u] = LOOM_OK;
        r->queue[r->tail++ % r->n_units] = u;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    if (busy)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3: unit %d's parameters read twice at once", u);
    return LOOM_OK;
}

loom_status zero_read_wait(loom_zero *z, int u)
{
    zero_reader *r = z->reader;
    if (!r)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ZeRO-3: a wait for unit %d's read, none submitted", u);
    double t0 = loom_now_ms();
    pthread_mutex_lock(&r->mu);
    r->late += r->pending[u];
    while (r->pending[u])
        pthread_cond_wait(&r->cv, &r->mu);
    r->wait_ms += loom_now_ms() - t0;
    loom_status st = r->st[u];
    char msg[sizeof r->msg[u]];
    memcpy(msg, r->msg[u], sizeof msg);
    pthread_mutex_unlock(&r->mu);
    return st == LOOM_OK ? LOOM_OK : loom_fail(st, "%s", msg);
}

void zero_read_stop(loom_zero *z)
{
    zero_reader *r = z->reader;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->quit = 1; /* the thread finishes what is queued: its staging is still mapped */
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    const char *stats = getenv("LOOM_ZERO_STATS");
    if (stats && stats[0] == '1')
        fprintf(stderr, "zero-3 parameter reads (rank %d): %ld units, %.1f MiB, %.1f ms reading "
                "(reader thread), %.1f ms waited (compute thread), %ld still being read when "
                "needed\n", z->rank, r->reads, (double)r->bytes / 1048576.0, r->read_ms,
                r->wait_ms, r->late);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->queue), free(r->pending), free(r->st), free(r->msg), free(r);
    z->reader = NULL;
}
