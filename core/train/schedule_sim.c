/* schedule_sim.c — running every stage's list together, in simulated time.
 *
 * Each stage has a clock. A compute op starts at its stage's clock and takes its cost; a
 * SEND takes no time and never blocks (it is asynchronous: started, waited later); a RECV
 * starts when both its stage is there and its SEND has run, plus the latency. Stages are
 * advanced in turn, each as far as it can go; since every start time is the max of its
 * stage's clock and its SEND's time, the result does not depend on the turn order. When
 * no stage can move and some are not done, every such stage waits at a RECV whose SEND
 * lies ahead in another stage's list: following "waits for" from the lowest such stage
 * must come back to a stage already seen, and that cycle is the deadlock reported.
 * Invariant: validate runs first, so every RECV has its SEND.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "schedule_internal.h"
#include "base/status.h"

void loom_sched_sim_free(loom_sched_sim *sim)
{
    if (sim == NULL)
        return;
    for (int r = 0; sim->span && r < sim->stages; r++)
        free(sim->span[r]);
    free(sim->span);
    free(sim->busy);
    free(sim->peak_inflight);
    free(sim);
}

static double cost_of(loom_sched_op op, const loom_sched_costs *c)
{
    switch (op) {
    case LOOM_SCHED_FWD: return c->fwd;
    case LOOM_SCHED_BWD: return c->bwd_input + c->bwd_weight;
    case LOOM_SCHED_BWD_INPUT: return c->bwd_input;
    case LOOM_SCHED_BWD_WEIGHT: return c->bwd_weight;
    default: return 0;
    }
}

/* The message for a deadlock: the cycle of waits that starts from the lowest stuck stage. */
static loom_status deadlock(const sched_index *ix, const size_t *pc)
{
    const loom_schedule *s = ix->s;
    int start = -1;
    for (int r = 0; r < s->stages && start < 0; r++)
        if (pc[r] < s->n[r])
            start = r;
    int *seen = calloc((size_t)s->stages, sizeof *seen), *waits = calloc((size_t)s->stages, sizeof *waits);
    if (!seen || !waits) {
        free(seen);
        free(waits);
        return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    }
    int r = start, step = 1;
    while (!seen[r]) { /* every stuck stage waits for exactly one other stage */
        seen[r] = step++;
        long pp;
        sched_partner(ix, r, s->list[r][pc[r]], &waits[r], &pp);
        r = waits[r];
    }
    int cycle_from = seen[r];
    char msg[2048] = "deadlock:";
    size_t used = strlen(msg);
    int in_cycle = 0, printed = 0;
    for (int q = 0; q < s->stages; q++)
        in_cycle += seen[q] >= cycle_from;
    for (int q = 0; q < s->stages && used < sizeof msg; q++) {
        if (seen[q] < cycle_from)
            continue;
        char d[96];
        loom_sched_instr in = s->list[q][pc[q]];
        sched_describe(d, sizeof d, in);
        const char *sep = printed == 0 ? " " : printed == in_cycle - 1 ? " and " : ", ";
        int w = snprintf(msg + used, sizeof msg - used, "%sstage %d %sat instruction %zu (%s)",
                         sep, q, printed == 0 ? "waits " : "", pc[q], d);
        if (w > 0)
            used += (size_t)w;
        printed++;
    }
    if (in_cycle == 1 && used < sizeof msg) { /* a stage waiting for its own later send */
        int pr;
        long pp;
        sched_partner(ix, r, s->list[r][pc[r]], &pr, &pp);
        snprintf(msg + used, sizeof msg - used, " for its own %s at instruction %ld",
                 loom_sched_op_name(s->list[r][pp].op), pp);
    }
    free(seen);
    free(waits);
    return loom_fail(LOOM_ERR_INVALID, "%s", msg);
}

loom_status loom_schedule_simulate(const loom_schedule *s, const loom_sched_costs *costs,
                                   loom_sched_sim **out)
{
    *out = NULL;
    loom_sched_costs c = costs ? *costs : LOOM_SCHED_COSTS_UNIT;
    if (!(c.fwd >= 0 && c.bwd_input >= 0 && c.bwd_weight >= 0 && c.latency >= 0))
        return loom_fail(LOOM_ERR_INVALID, "schedule: costs must be >= 0 (got fwd %g, "
                         "bwd_input %g, bwd_weight %g, latency %g)", c.fwd, c.bwd_input,
                         c.bwd_weight, c.latency);
    LOOM_TRY(loom_schedule_validate(s));
    sched_index ix;
    LOOM_TRY(sched_index_build(s, &ix));
    const int p = s->stages;
    loom_sched_sim *sim = calloc(1, sizeof *sim);
    size_t *pc = calloc((size_t)p, sizeof *pc);
    double *clock = calloc((size_t)p, sizeof *clock);
    if (sim) {
        sim->stages = p;
        sim->busy = calloc((size_t)p, sizeof *sim->busy);
        sim->peak_inflight = calloc((size_t)p, sizeof *sim->peak_inflight);
        sim->span = calloc((size_t)p, sizeof *sim->span);
    }
    int ok = sim && pc && clock && sim->busy && sim->peak_inflight && sim->span;
    for (int r = 0; ok && r < p; r++)
        ok = (sim->span[r] = calloc(s->n[r] ? s->n[r] : 1, sizeof **sim->span)) != NULL;
    if (!ok) {
        free(ix.pos);
        free(pc);
        free(clock);
        loom_sched_sim_free(sim);
        return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    }
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < p; r++)
            while (pc[r] < s->n[r]) {
                loom_sched_instr in = s->list[r][pc[r]];
                double start = clock[r];
                if (in.op == LOOM_SCHED_RECV_ACT || in.op == LOOM_SCHED_RECV_GRAD) {
                    int pr;
                    long pp;
                    sched_partner(&ix, r, in, &pr, &pp);
                    if ((long)pc[pr] <= pp)
                        break; /* its SEND has not run yet */
                    double ready = sim->span[pr][pp].start + c.latency;
                    if (ready > start)
                        start = ready;
                }
                double d = cost_of(in.op, &c);
                sim->span[r][pc[r]] = (loom_sched_span){start, start + d};
                sim->busy[r] += d;
                clock[r] = start + d;
                pc[r]++;
                moved = 1;
            }
    }
    loom_status st = LOOM_OK;
    for (int r = 0; r < p && st == LOOM_OK; r++)
        if (pc[r] < s->n[r])
            st = deadlock(&ix, pc);
    if (st == LOOM_OK) {
        double total = 0;
        for (int r = 0; r < p; r++) {
            if (clock[r] > sim->makespan)
                sim->makespan = clock[r];
            total += sim->busy[r];
            int live = 0;
            for (size_t i = 0; i < s->n[r]; i++) {
                loom_sched_op op = s->list[r][i].op;
                live += op == LOOM_SCHED_FWD;
                live -= op == LOOM_SCHED_BWD || op == LOOM_SCHED_BWD_WEIGHT;
                if (live > sim->peak_inflight[r])
                    sim->peak_inflight[r] = live;
            }
        }
        sim->bubble = sim->makespan > 0 ? 1.0 - total / (p * sim->makespan) : 0.0;
        *out = sim;
    } else {
        loom_sched_sim_free(sim);
    }
    free(ix.pos);
    free(pc);
    free(clock);
    return st;
}
