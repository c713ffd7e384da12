/* schedule_internal.h — what schedule.c and schedule_sim.c share: the index of every
 * instruction by (stage, micro-batch, chunk, op), and the virtual-stage neighbours. */
#ifndef LOOM_CORE_TRAIN_SCHEDULE_INTERNAL_H
#define LOOM_CORE_TRAIN_SCHEDULE_INTERNAL_H

#include "schedule.h"

enum { N_SLOTS = LOOM_SCHED_BWD_WEIGHT }; /* one per op value 1..N_SLOTS */

typedef struct sched_index {
    const loom_schedule *s;
    long *pos; /* position in its stage's list, -1 if absent; free() it */
} sched_index;

static inline long *sched_pos(const sched_index *ix, int r, int mb, int c, loom_sched_op op)
{
    const loom_schedule *s = ix->s;
    return &ix->pos[(((size_t)r * s->microbatches + mb) * s->chunks + c) * N_SLOTS + (op - 1)];
}

/* Ranges and duplicates are refused here, so every slot is unique. */
loom_status sched_index_build(const loom_schedule *s, sched_index *ix);
int sched_next(const loom_schedule *s, int stage, int chunk, int *ns, int *nc);
int sched_prev(const loom_schedule *s, int stage, int chunk, int *ps, int *pc);
/* The stage and position of a transfer's partner (*ppos -1: missing); 0 if no neighbour. */
int sched_partner(const sched_index *ix, int r, loom_sched_instr in, int *pr, long *ppos);
void sched_describe(char *buf, size_t len, loom_sched_instr in);

#endif
