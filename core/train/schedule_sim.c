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
 * With costs->rendezvous, a send instead waits for its receiver: each run of consecutive
 * transfers is one group, posted when its stage reaches it and done when every partner's
 * group is posted too (NCCL group semantics), and a stuck stage waits at the first
 * transfer of its group whose partner has not posted.
 * Invariant: validate runs first, so every RECV has its SEND.
 */
#include <stdint.h>
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

static int is_transfer(loom_sched_op op)
{
    return op == LOOM_SCHED_SEND_ACT || op == LOOM_SCHED_RECV_ACT || op == LOOM_SCHED_SEND_GRAD ||
           op == LOOM_SCHED_RECV_GRAD;
}

/* The message for a deadlock: the cycle of waits that starts from the lowest stuck stage.
 * at[r] is the instruction stage r waits at (SIZE_MAX: not stuck). */
static loom_status deadlock(const sched_index *ix, const size_t *at)
{
    const loom_schedule *s = ix->s;
    int start = -1;
    for (int r = 0; r < s->stages && start < 0; r++)
        if (at[r] != SIZE_MAX)
            start = r;
    int *seen = calloc((size_t)s->stages, sizeof *seen), *waits = calloc((size_t)s->stages, sizeof *waits);
    if (!seen || !waits) {
        free(seen);
        free(waits);
        return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    }
    int r = start, step = 1;
    while (!seen[r]) { /* every stuck stage waits for exactly one other stuck stage */
        seen[r] = step++;
        long pp;
        sched_partner(ix, r, s->list[r][at[r]], &waits[r], &pp);
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
        sched_describe(d, sizeof d, s->list[q][at[q]]);
        const char *sep = printed == 0 ? " " : printed == in_cycle - 1 ? " and " : ", ";
        int w = snprintf(msg + used, sizeof msg - used, "%sstage %d %sat instruction %zu (%s)",
                         sep, q, printed == 0 ? "waits " : "", at[q], d);
        if (w > 0)
            used += (size_t)w;
        printed++;
    }
    if (in_cycle == 1 && used < sizeof msg) { /* a stage waiting for its own later transfer */
        int pr;
        long pp;
        sched_partner(ix, r, s->list[r][at[r]], &pr, &pp);
        snprintf(msg + used, sizeof msg - used, " for its own %s at instruction %ld",
                 loom_sched_op_name(s->list[r][pp].op), pp);
    }
    free(seen);
    free(waits);
    return loom_fail(LOOM_ERR_INVALID, "%s", msg);
}

/* The simulation's moving parts. */
typedef struct sim_state {
    const loom_schedule *s;
    const sched_index *ix;
    loom_sched_costs c;
    loom_sched_sim *sim;
    size_t *pc;       /* [stages] next instruction (rendezvous: the group's first while in it) */
    double *clock;    /* [stages] */
    int *posted;      /* [stages] rendezvous: the group at pc is posted */
    size_t **gstart;  /* [stages][n] rendezvous: first instruction of each one's group */
    double **gpost;   /* [stages][n] rendezvous: post time of the group starting there */
} sim_state;

/* Asynchronous sends: run stage r's instruction at pc, or return 0 if it must wait. */
static int step_async(sim_state *st, int r)
{
    const loom_schedule *s = st->s;
    loom_sched_instr in = s->list[r][st->pc[r]];
    double start = st->clock[r];
    if (in.op == LOOM_SCHED_RECV_ACT || in.op == LOOM_SCHED_RECV_GRAD) {
        int pr;
        long pp;
        sched_partner(st->ix, r, in, &pr, &pp);
        if ((long)st->pc[pr] <= pp)
            return 0; /* its SEND has not run yet */
        double ready = st->sim->span[pr][pp].start + st->c.latency;
        if (ready > start)
            start = ready;
    }
    double d = is_transfer(in.op) ? 0.0 : st->c.each ? st->c.each[r][st->pc[r]]
                                                     : cost_of(in.op, &st->c);
    st->sim->span[r][st->pc[r]] = (loom_sched_span){start, start + d};
    st->sim->busy[r] += d;
    st->clock[r] = start + d;
    st->pc[r]++;
    return 1;
}

/* Is the group holding instruction pp of stage pr posted? Its post time in *t. */
static int group_posted(const sim_state *st, int pr, long pp, double *t)
{
    size_t g = st->gstart[pr][pp];
    if (st->pc[pr] > (size_t)pp || (st->pc[pr] == g && st->posted[pr])) {
        *t = st->gpost[pr][g];
        return 1;
    }
    return 0;
}

/* Rendezvous: a run of consecutive transfers is one group, posted together (NCCL's group
 * calls, torch's batch_isend_irecv); it completes when every transfer in it has its
 * partner's group posted. Returns 1 if stage r moved; *wait_at gets the first unmatched
 * transfer otherwise. */
static int step_rendezvous(sim_state *st, int r, size_t *wait_at)
{
    const loom_schedule *s = st->s;
    size_t g0 = st->pc[r], g1 = g0;
    if (!is_transfer(s->list[r][g0].op))
        return step_async(st, r);
    while (g1 < s->n[r] && is_transfer(s->list[r][g1].op))
        g1++;
    if (!st->posted[r]) {
        st->posted[r] = 1;
        st->gpost[r][g0] = st->clock[r];
    }
    double done = st->clock[r];
    for (size_t i = g0; i < g1; i++) {
        int pr;
        long pp;
        double t;
        sched_partner(st->ix, r, s->list[r][i], &pr, &pp);
        if (!group_posted(st, pr, pp, &t)) {
            *wait_at = i;
            return 0;
        }
        if (t + st->c.latency > done)
            done = t + st->c.latency;
    }
    for (size_t i = g0; i < g1; i++)
        st->sim->span[r][i] = (loom_sched_span){st->gpost[r][g0], done};
    st->clock[r] = done;
    st->pc[r] = g1;
    st->posted[r] = 0;
    return 1;
}

static loom_status run(sim_state *st)
{
    const loom_schedule *s = st->s;
    const int p = s->stages;
    size_t *at = malloc((size_t)p * sizeof *at);
    if (at == NULL)
        return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    for (int r = 0; r < p; r++)
        at[r] = SIZE_MAX;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < p; r++)
            while (st->pc[r] < s->n[r]) {
                size_t w = st->pc[r];
                int ok = st->c.rendezvous ? step_rendezvous(st, r, &w) : step_async(st, r);
                at[r] = ok ? SIZE_MAX : w;
                if (!ok)
                    break;
                moved = 1;
            }
    }
    loom_status rc = LOOM_OK;
    for (int r = 0; r < p && rc == LOOM_OK; r++)
        if (st->pc[r] < s->n[r])
            rc = deadlock(st->ix, at);
    free(at);
    return rc;
}

static void *table_of(const loom_schedule *s, size_t elem)
{
    void **t = calloc((size_t)s->stages, sizeof *t);
    for (int r = 0; t && r < s->stages; r++)
        if ((t[r] = calloc(s->n[r] ? s->n[r] : 1, elem)) == NULL) {
            while (r-- > 0)
                free(t[r]);
            free(t);
            return NULL;
        }
    return t;
}

static void table_free(const loom_schedule *s, void *t)
{
    void **v = t;
    for (int r = 0; v && r < s->stages; r++)
        free(v[r]);
    free(v);
}

static loom_status simulate(const loom_schedule *s, const loom_sched_costs *costs, int checked,
                            loom_sched_sim **out)
{
    *out = NULL;
    loom_sched_costs c = costs ? *costs : LOOM_SCHED_COSTS_UNIT;
    if (!(c.fwd >= 0 && c.bwd_input >= 0 && c.bwd_weight >= 0 && c.latency >= 0))
        return loom_fail(LOOM_ERR_INVALID, "schedule: costs must be >= 0 (got fwd %g, "
                         "bwd_input %g, bwd_weight %g, latency %g)", c.fwd, c.bwd_input,
                         c.bwd_weight, c.latency);
    if (!checked)
        LOOM_TRY(loom_schedule_validate(s));
    for (int r = 0; c.each && r < s->stages; r++)
        for (size_t i = 0; i < s->n[r]; i++)
            if (!(c.each[r][i] >= 0 && c.each[r][i] < 1e300))
                return loom_fail(LOOM_ERR_INVALID, "schedule: stage %d instruction %zu (%s): its "
                                 "cost must be a finite number >= 0, got %g", r, i,
                                 loom_sched_op_name(s->list[r][i].op), c.each[r][i]);
    sched_index ix;
    LOOM_TRY(sched_index_build(s, &ix));
    const int p = s->stages;
    sim_state st = {s, &ix, c, calloc(1, sizeof(loom_sched_sim)), calloc((size_t)p, sizeof(size_t)),
                    calloc((size_t)p, sizeof(double)), calloc((size_t)p, sizeof(int)),
                    table_of(s, sizeof(size_t)),
                    table_of(s, sizeof(double))};
    loom_sched_sim *sim = st.sim;
    if (sim) {
        sim->stages = p;
        sim->busy = calloc((size_t)p, sizeof *sim->busy);
        sim->peak_inflight = calloc((size_t)p, sizeof *sim->peak_inflight);
        sim->span = table_of(s, sizeof(loom_sched_span));
    }
    loom_status rc = LOOM_OK;
    if (!sim || !st.pc || !st.clock || !st.posted || !st.gstart || !st.gpost ||
        !sim->busy || !sim->peak_inflight || !sim->span)
        rc = loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    for (int r = 0; rc == LOOM_OK && r < p; r++)
        for (size_t i = 0; i < s->n[r]; i++)
            st.gstart[r][i] = i > 0 && is_transfer(s->list[r][i].op) &&
                                      is_transfer(s->list[r][i - 1].op)
                                  ? st.gstart[r][i - 1]
                                  : i;
    if (rc == LOOM_OK)
        rc = run(&st);
    if (rc == LOOM_OK) {
        double total = 0;
        for (int r = 0; r < p; r++) {
            if (st.clock[r] > sim->makespan)
                sim->makespan = st.clock[r];
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
    free(st.pc);
    free(st.clock);
    free(st.posted);
    table_free(s, st.gstart);
    table_free(s, st.gpost);
    return rc;
}

loom_status loom_schedule_simulate(const loom_schedule *s, const loom_sched_costs *costs,
                                   loom_sched_sim **out)
{
    return simulate(s, costs, 0, out);
}

loom_status loom_schedule_simulate_valid(const loom_schedule *s, const loom_sched_costs *costs,
                                         loom_sched_sim **out)
{
    return simulate(s, costs, 1, out);
}
