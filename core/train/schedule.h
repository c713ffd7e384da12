/* schedule.h — pipeline schedules as data: every stage's instruction list for one shape,
 * the validator that checks them together, and a simulator that runs them together.
 *
 * A loom_schedule holds the lists of all stages (a sched plugin builds one stage's list
 * per call; a Lua function does the same through core/lua/lua_sched.c). The validator
 * refuses, naming the stage, the position and the instruction, a list in which
 *  - an instruction is unknown or its micro-batch / chunk is out of range;
 *  - a (micro-batch, chunk) is not forwarded then backwarded exactly once (B before W
 *    when split; a fused BWD counts as both);
 *  - a FWD on a non-first virtual stage is not preceded by its RECV_ACT, a backward on a
 *    non-last one by its RECV_GRAD, or the results are not sent on after the compute;
 *  - a SEND has no matching RECV on the neighbour (same micro-batch, the neighbour's
 *    chunk, the right direction; the virtual stage order wraps across ranks), or a RECV
 *    no SEND.
 * The simulator then runs all stages at once (each op costs what loom_sched_costs says,
 * SEND never blocks, a RECV waits for its SEND plus the latency) and refuses a cycle of
 * waits ("deadlock: stage 0 waits at instruction 5 (RECV_GRAD mb 0 chunk 0) and stage 1
 * at instruction 4 (RECV_ACT mb 1 chunk 0)"). It reports each op's start and end, the
 * bubble fraction 1 - compute / (stages x makespan), and each stage's peak number of
 * (micro-batch, chunk) pairs in flight: forwarded but not yet fully backwarded.
 * What not: this does not execute anything; the pipeline engine will consume these lists.
 * Stage numbers in messages are 0-based, as ranks are.
 */
#ifndef LOOM_CORE_TRAIN_SCHEDULE_H
#define LOOM_CORE_TRAIN_SCHEDULE_H

#include <stddef.h>

#include "loom/plugin.h"
#include "loom/plugin/sched.h"

typedef struct loom_schedule {
    int stages, microbatches, chunks;
    size_t *n;               /* [stages] instructions in each list */
    size_t *cap;             /* [stages] allocated */
    loom_sched_instr **list; /* [stages][n[s]] */
} loom_schedule;

/* Empty lists for the shape (stages, microbatches, chunks >= 1, not absurdly large). */
loom_status loom_schedule_new(int stages, int microbatches, int chunks, loom_schedule **out);
void loom_schedule_free(loom_schedule *s);
/* Append one instruction to stage's list. Nothing is checked here: validate does that. */
loom_status loom_schedule_push(loom_schedule *s, int stage, loom_sched_instr in);

/* Every stage's list from a sched plugin: check() first (its reason becomes the error),
 * then build() once per stage. */
loom_status loom_schedule_from_plugin(const loom_plugin_desc *desc, int stages,
                                      int microbatches, int chunks, loom_schedule **out);

/* The structural checks above (all but deadlock); LOOM_ERR_INVALID with the message. */
loom_status loom_schedule_validate(const loom_schedule *s);

typedef struct loom_sched_costs {
    double fwd, bwd_input, bwd_weight; /* a fused BWD costs bwd_input + bwd_weight */
    double latency;                    /* from a SEND to its RECV being satisfied */
    /* 0: SEND never blocks (plugin/sched.h's contract). 1: the stricter model of a
     * transport whose send waits for its receiver (NCCL): each run of consecutive
     * transfers is posted together as one group (ncclGroupStart/End, batch_isend_irecv)
     * and completes when every transfer in it has its partner's group posted. A list that
     * passes this too runs on such a transport with one group call per run. */
    int rendezvous;
    /* NULL, or [stages][n[s]]: each instruction's own cost (a compute op's; a transfer's
     * is ignored), in place of its op's above: a run's traced F/B/W times replayed
     * (scripts/pp_replay.py through `loom schedule --costs`). */
    const double *const *each;
} loom_sched_costs;
/* The costs the bubble formulas assume: F = B = W = 1 (fused BWD = 2), no latency. */
#define LOOM_SCHED_COSTS_UNIT ((loom_sched_costs){1.0, 1.0, 1.0, 0.0, 0, NULL})

typedef struct loom_sched_span { double start, end; } loom_sched_span;

typedef struct loom_sched_sim {
    int stages;
    double makespan;      /* when the last stage finishes */
    double bubble;        /* 1 - sum(busy) / (stages * makespan) */
    double *busy;         /* [stages] compute time */
    int *peak_inflight;   /* [stages] */
    loom_sched_span **span; /* [stages][n[s]]: per instruction (SEND/RECV: start == end) */
} loom_sched_sim;

/* Validate, then simulate with costs (NULL: LOOM_SCHED_COSTS_UNIT). */
loom_status loom_schedule_simulate(const loom_schedule *s, const loom_sched_costs *costs,
                                   loom_sched_sim **out);
/* The same for a schedule loom_schedule_validate passed and nothing changed since (a plan
 * search simulates one prepared schedule many times): the costs checked, the lists not. */
loom_status loom_schedule_simulate_valid(const loom_schedule *s, const loom_sched_costs *costs,
                                         loom_sched_sim **out);
void loom_sched_sim_free(loom_sched_sim *sim);

/* "FWD", "BWD_INPUT", ...; NULL for an unknown value. And back (0 for an unknown name). */
const char *loom_sched_op_name(loom_sched_op op);
loom_sched_op loom_sched_op_from_name(const char *name);

#endif
