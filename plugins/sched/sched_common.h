/* sched_common.h — what the built-in sched plugins share: checking a shape, and writing a
 * compute instruction together with the transfers around it.
 *
 * fwd() writes RECV_ACT (except on the first virtual stage), FWD, SEND_ACT (except on the
 * last); bwd()/bwd_input() write RECV_GRAD (except on the last virtual stage), the backward,
 * SEND_GRAD (except on the first). A receive sits right before the compute that needs it
 * and a send right after the compute that produced it: with asynchronous sends that order
 * cannot deadlock for any compute order that respects the data dependencies (each RECV
 * waits only for a send its peer makes as soon as the producing compute is done), which
 * is what Megatron's p2p pairs (send_forward_recv_backward, ...) guarantee too.
 * Virtual stage of (stage s, chunk c) is c * stages + s (plugin/sched.h).
 * Static inline functions only: each plugin .so still exports nothing but loom_plugin_entry.
 */
#ifndef LOOM_PLUGINS_SCHED_COMMON_H
#define LOOM_PLUGINS_SCHED_COMMON_H

#include <stdio.h>

#include "loom/plugin.h"
#include "loom/plugin/sched.h"

typedef struct sched_writer {
    loom_sched_instr *out;
    size_t cap, n; /* n counts past cap too, so a caller learns the size needed */
    const loom_sched_shape *shape;
} sched_writer;

/* The checks every schedule makes; 1 if fine, else 0 with reason. */
static inline int sched_check_common(const char *name, const loom_sched_shape *s, char *reason,
                              size_t len)
{
    if (s == NULL) {
        snprintf(reason, len, "%s: no shape given", name);
        return 0;
    }
    if (s->stages < 1 || s->microbatches < 1 || s->chunks < 1) {
        snprintf(reason, len,
                 "%s: stages, microbatches and chunks must each be >= 1 (got %d, %d, %d)",
                 name, s->stages, s->microbatches, s->chunks);
        return 0;
    }
    if (s->stage < 0 || s->stage >= s->stages) {
        snprintf(reason, len, "%s: stage %d is not one of 0..%d", name, s->stage, s->stages - 1);
        return 0;
    }
    return 1;
}

/* Schedules without virtual stages accept only chunks = 1. */
static inline int sched_check_one_chunk(const char *name, const loom_sched_shape *s, char *reason,
                                 size_t len)
{
    if (!sched_check_common(name, s, reason, len))
        return 0;
    if (s->chunks != 1) {
        snprintf(reason, len,
                 "%s: chunks = %d, but %s has no virtual stages (use chunks = 1, or the "
                 "interleaved schedule for chunks >= 2)", name, s->chunks, name);
        return 0;
    }
    return 1;
}

static inline void sched_put(sched_writer *w, loom_sched_op op, int mb, int chunk)
{
    if (w->n < w->cap)
        w->out[w->n] = (loom_sched_instr){op, mb, chunk};
    w->n++; /* counted even past cap, so the caller learns the size needed */
}

static inline int sched_first(const sched_writer *w, int chunk) { return chunk == 0 && w->shape->stage == 0; }
static inline int sched_last(const sched_writer *w, int chunk)
{
    return chunk == w->shape->chunks - 1 && w->shape->stage == w->shape->stages - 1;
}

static inline void sched_fwd(sched_writer *w, int mb, int chunk)
{
    if (!sched_first(w, chunk))
        sched_put(w, LOOM_SCHED_RECV_ACT, mb, chunk);
    sched_put(w, LOOM_SCHED_FWD, mb, chunk);
    if (!sched_last(w, chunk))
        sched_put(w, LOOM_SCHED_SEND_ACT, mb, chunk);
}

/* op: LOOM_SCHED_BWD (fused) or LOOM_SCHED_BWD_INPUT (then a BWD_WEIGHT later). */
static inline void sched_bwd(sched_writer *w, loom_sched_op op, int mb, int chunk)
{
    if (!sched_last(w, chunk))
        sched_put(w, LOOM_SCHED_RECV_GRAD, mb, chunk);
    sched_put(w, op, mb, chunk);
    if (!sched_first(w, chunk))
        sched_put(w, LOOM_SCHED_SEND_GRAD, mb, chunk);
}

static inline void sched_weight(sched_writer *w, int mb, int chunk)
{
    sched_put(w, LOOM_SCHED_BWD_WEIGHT, mb, chunk);
}

static inline sched_writer sched_writer_new(const loom_sched_shape *shape, loom_sched_instr *out,
                                     size_t cap)
{
    return (sched_writer){out, out ? cap : 0, 0, shape};
}

/* The end of every build(): the count, and whether it fitted. */
static inline loom_status sched_finish(const sched_writer *w, size_t *n)
{
    if (n)
        *n = w->n;
    return w->n <= w->cap ? LOOM_OK : LOOM_ERR_INVALID;
}

#endif
