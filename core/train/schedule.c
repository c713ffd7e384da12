/* schedule.c — the schedule container, building it from a sched plugin, and the
 * validator (schedule.h says what it refuses). The simulator is schedule_sim.c.
 *
 * The validator indexes every instruction by (stage, micro-batch, chunk, op) once, then
 * walks each stage's list in order, so the error it reports is the first in (stage,
 * position) order of the first kind that fails: ranges and duplicates, then SEND/RECV
 * pairs across stages, then each stage's own order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "schedule_internal.h"
#include "base/status.h"

static const char *const op_names[] = {NULL, "FWD", "BWD", "SEND_ACT", "RECV_ACT", "SEND_GRAD",
                                       "RECV_GRAD", "BWD_INPUT", "BWD_WEIGHT"};

const char *loom_sched_op_name(loom_sched_op op)
{
    return op >= LOOM_SCHED_FWD && op <= LOOM_SCHED_BWD_WEIGHT ? op_names[op] : NULL;
}

loom_sched_op loom_sched_op_from_name(const char *name)
{
    for (int k = LOOM_SCHED_FWD; k <= LOOM_SCHED_BWD_WEIGHT; k++)
        if (name && strcmp(name, op_names[k]) == 0)
            return (loom_sched_op)k;
    return (loom_sched_op)0;
}

loom_status loom_schedule_new(int stages, int microbatches, int chunks, loom_schedule **out)
{
    *out = NULL;
    if (stages < 1 || microbatches < 1 || chunks < 1)
        return loom_fail(LOOM_ERR_INVALID,
                         "schedule: stages, microbatches and chunks must each be >= 1 "
                         "(got %d, %d, %d)", stages, microbatches, chunks);
    if (stages > 4096 || (long long)stages * microbatches * chunks > (1LL << 22))
        return loom_fail(LOOM_ERR_INVALID,
                         "schedule: stages x microbatches x chunks = %lld is too large to "
                         "check (at most %lld, and stages <= 4096)",
                         (long long)stages * microbatches * chunks, 1LL << 22);
    loom_schedule *s = calloc(1, sizeof *s);
    if (s == NULL)
        return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    s->stages = stages;
    s->microbatches = microbatches;
    s->chunks = chunks;
    s->n = calloc((size_t)stages, sizeof *s->n);
    s->cap = calloc((size_t)stages, sizeof *s->cap);
    s->list = calloc((size_t)stages, sizeof *s->list);
    if (!s->n || !s->cap || !s->list) {
        loom_schedule_free(s);
        return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    }
    *out = s;
    return LOOM_OK;
}

void loom_schedule_free(loom_schedule *s)
{
    if (s == NULL)
        return;
    for (int r = 0; s->list && r < s->stages; r++)
        free(s->list[r]);
    free(s->list);
    free(s->n);
    free(s->cap);
    free(s);
}

loom_status loom_schedule_push(loom_schedule *s, int stage, loom_sched_instr in)
{
    if (stage < 0 || stage >= s->stages)
        return loom_fail(LOOM_ERR_INVALID, "schedule: stage %d is not one of 0..%d", stage,
                         s->stages - 1);
    if (s->n[stage] == s->cap[stage]) {
        size_t cap = s->cap[stage] ? 2 * s->cap[stage] : 64;
        loom_sched_instr *p = realloc(s->list[stage], cap * sizeof *p);
        if (p == NULL)
            return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
        s->list[stage] = p;
        s->cap[stage] = cap;
    }
    s->list[stage][s->n[stage]++] = in;
    return LOOM_OK;
}

loom_status loom_schedule_from_plugin(const loom_plugin_desc *desc, int stages,
                                      int microbatches, int chunks, loom_schedule **out)
{
    *out = NULL;
    if (desc == NULL || desc->kind != LOOM_KIND_SCHED || desc->ops == NULL)
        return loom_fail(LOOM_ERR_INVALID, "schedule: '%s' is not a sched plugin",
                         desc && desc->name ? desc->name : "?");
    const loom_sched_ops *ops = desc->ops;
    if (ops->size < offsetof(loom_sched_ops, build) + sizeof ops->build || ops->build == NULL)
        return loom_fail(LOOM_ERR_PLUGIN, "schedule: sched plugin '%s' has no build()",
                         desc->name);
    int has_check = ops->size >= offsetof(loom_sched_ops, check) + sizeof ops->check &&
                    ops->check != NULL;
    loom_schedule *s;
    LOOM_TRY(loom_schedule_new(stages, microbatches, chunks, &s));
    for (int r = 0; r < stages; r++) {
        loom_sched_shape shape = {stages, r, microbatches, chunks};
        char why[512] = "";
        if (has_check && !ops->check(&shape, why, sizeof why)) {
            loom_schedule_free(s);
            return loom_fail(LOOM_ERR_INVALID, "%s", why[0] ? why : "shape refused");
        }
        size_t cap = LOOM_SCHED_CAP(&shape), n = 0;
        loom_sched_instr *buf = malloc(cap * sizeof *buf);
        if (buf == NULL) {
            loom_schedule_free(s);
            return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
        }
        loom_status st = ops->build(&shape, buf, cap, &n);
        if (st == LOOM_OK && n > cap)
            st = LOOM_ERR_INTERNAL; /* a plugin that claims more than it could write */
        if (st != LOOM_OK) {
            free(buf);
            loom_schedule_free(s);
            return loom_fail(st, "schedule: sched plugin '%s' refused stages=%d stage=%d "
                             "microbatches=%d chunks=%d (%s, %zu instructions for room "
                             "for %zu)", desc->name, stages, r, microbatches, chunks,
                             loom_status_name(st), n, cap);
        }
        s->list[r] = buf;
        s->n[r] = s->cap[r] = n;
        if (n == 0) {
            free(buf);
            s->list[r] = NULL;
        }
    }
    *out = s;
    return LOOM_OK;
}

/* ---- the index ------------------------------------------------------------------- */

void sched_describe(char *buf, size_t len, loom_sched_instr in)
{
    const char *name = loom_sched_op_name(in.op);
    if (name)
        snprintf(buf, len, "%s mb %d chunk %d", name, in.microbatch, in.chunk);
    else
        snprintf(buf, len, "op %d mb %d chunk %d", (int)in.op, in.microbatch, in.chunk);
}

/* Instruction `in` described into d, for a message: only when one is made (every check
 * runs over every instruction, and a search simulates a schedule thousands of times) */
#define IN_DESC (sched_describe(d, sizeof d, in), d)

loom_status sched_index_build(const loom_schedule *s, sched_index *ix)
{
    size_t units = (size_t)s->stages * s->microbatches * s->chunks;
    ix->s = s;
    ix->pos = malloc(units * N_SLOTS * sizeof *ix->pos);
    if (ix->pos == NULL)
        return loom_fail(LOOM_ERR_NOMEM, "schedule: out of memory");
    for (size_t i = 0; i < units * N_SLOTS; i++)
        ix->pos[i] = -1;
    for (int r = 0; r < s->stages; r++) {
        for (size_t i = 0; i < s->n[r]; i++) {
            loom_sched_instr in = s->list[r][i];
            char d[96];
            if (loom_sched_op_name(in.op) == NULL)
                return loom_fail(LOOM_ERR_INVALID, "stage %d, instruction %zu (%s): unknown "
                                 "instruction (FWD, BWD, BWD_INPUT, BWD_WEIGHT, SEND_ACT, "
                                 "RECV_ACT, SEND_GRAD or RECV_GRAD)", r, i, IN_DESC);
            if (in.microbatch < 0 || in.microbatch >= s->microbatches)
                return loom_fail(LOOM_ERR_INVALID, "stage %d, instruction %zu (%s): "
                                 "micro-batch %d is not one of 0..%d", r, i, IN_DESC, in.microbatch,
                                 s->microbatches - 1);
            if (in.chunk < 0 || in.chunk >= s->chunks)
                return loom_fail(LOOM_ERR_INVALID, "stage %d, instruction %zu (%s): chunk "
                                 "%d is not one of 0..%d", r, i, IN_DESC, in.chunk, s->chunks - 1);
            long *slot = sched_pos(ix, r, in.microbatch, in.chunk, in.op);
            if (*slot >= 0)
                return loom_fail(LOOM_ERR_INVALID, "stage %d, instruction %zu (%s): a second "
                                 "%s of micro-batch %d chunk %d (the first is instruction %ld)",
                                 r, i, IN_DESC, loom_sched_op_name(in.op), in.microbatch, in.chunk,
                                 *slot);
            *slot = (long)i;
        }
    }
    return LOOM_OK;
}

/* The virtual stage after / before (stage, chunk); 0 where there is none. */
int sched_next(const loom_schedule *s, int stage, int chunk, int *ns, int *nc)
{
    int k = chunk * s->stages + stage + 1;
    if (k >= s->stages * s->chunks)
        return 0;
    *ns = k % s->stages;
    *nc = k / s->stages;
    return 1;
}

int sched_prev(const loom_schedule *s, int stage, int chunk, int *ps, int *pc)
{
    int k = chunk * s->stages + stage - 1;
    if (k < 0)
        return 0;
    *ps = k % s->stages;
    *pc = k / s->stages;
    return 1;
}

int sched_partner(const sched_index *ix, int r, loom_sched_instr in, int *pr, long *ppos)
{
    int ps, pc;
    loom_sched_op want;
    switch (in.op) {
    case LOOM_SCHED_SEND_ACT:  want = LOOM_SCHED_RECV_ACT;  if (!sched_next(ix->s, r, in.chunk, &ps, &pc)) return 0; break;
    case LOOM_SCHED_RECV_GRAD: want = LOOM_SCHED_SEND_GRAD; if (!sched_next(ix->s, r, in.chunk, &ps, &pc)) return 0; break;
    case LOOM_SCHED_RECV_ACT:  want = LOOM_SCHED_SEND_ACT;  if (!sched_prev(ix->s, r, in.chunk, &ps, &pc)) return 0; break;
    case LOOM_SCHED_SEND_GRAD: want = LOOM_SCHED_RECV_GRAD; if (!sched_prev(ix->s, r, in.chunk, &ps, &pc)) return 0; break;
    default: return 0;
    }
    *pr = ps;
    *ppos = *sched_pos(ix, ps, in.microbatch, pc, want);
    return 1;
}

/* ---- the checks ------------------------------------------------------------------ */

#define REFUSE(...) return loom_fail(LOOM_ERR_INVALID, __VA_ARGS__)

/* Every transfer goes the right way and has its partner on the neighbour. */
static loom_status check_pairs(const sched_index *ix)
{
    const loom_schedule *s = ix->s;
    for (int r = 0; r < s->stages; r++)
        for (size_t i = 0; i < s->n[r]; i++) {
            loom_sched_instr in = s->list[r][i];
            int send = in.op == LOOM_SCHED_SEND_ACT || in.op == LOOM_SCHED_SEND_GRAD;
            int act = in.op == LOOM_SCHED_SEND_ACT || in.op == LOOM_SCHED_RECV_ACT;
            if (!send && in.op != LOOM_SCHED_RECV_ACT && in.op != LOOM_SCHED_RECV_GRAD)
                continue;
            char d[96];
            int pr;
            long pp;
            if (!sched_partner(ix, r, in, &pr, &pp)) {
                int first = act != send; /* RECV_ACT and SEND_GRAD look backward */
                REFUSE("stage %d, instruction %zu (%s): stage %d chunk %d is the %s virtual "
                       "stage; there is no %s stage to %s %s %s", r, i, IN_DESC, r, in.chunk,
                       first ? "first" : "last", first ? "previous" : "next",
                       send ? "send" : "receive", act ? "activations" : "gradients",
                       send ? "to" : "from");
            }
            if (pp < 0) {
                int ns = 0, nc = 0;
                if (act == send)
                    sched_next(s, r, in.chunk, &ns, &nc);
                else
                    sched_prev(s, r, in.chunk, &ns, &nc);
                const char *want = loom_sched_op_name(
                    send ? (act ? LOOM_SCHED_RECV_ACT : LOOM_SCHED_RECV_GRAD)
                         : (act ? LOOM_SCHED_SEND_ACT : LOOM_SCHED_SEND_GRAD));
                REFUSE("stage %d, instruction %zu (%s): stage %d never %s it (it has no %s mb "
                       "%d chunk %d)", r, i, IN_DESC, pr, send ? "receives" : "sends", want,
                       in.microbatch, nc);
            }
        }
    return LOOM_OK;
}

static loom_status check_order(const sched_index *ix)
{
    const loom_schedule *s = ix->s;
    for (int r = 0; r < s->stages; r++)
        for (size_t i = 0; i < s->n[r]; i++) {
            loom_sched_instr in = s->list[r][i];
            int mb = in.microbatch, c = in.chunk, x, y;
            int first = !sched_prev(s, r, c, &x, &y), last = !sched_next(s, r, c, &x, &y);
            long at = (long)i;
            long f = *sched_pos(ix, r, mb, c, LOOM_SCHED_FWD);
            long bf = *sched_pos(ix, r, mb, c, LOOM_SCHED_BWD);
            long bi = *sched_pos(ix, r, mb, c, LOOM_SCHED_BWD_INPUT);
            long bw = *sched_pos(ix, r, mb, c, LOOM_SCHED_BWD_WEIGHT);
            long ra = *sched_pos(ix, r, mb, c, LOOM_SCHED_RECV_ACT);
            long sa = *sched_pos(ix, r, mb, c, LOOM_SCHED_SEND_ACT);
            long rg = *sched_pos(ix, r, mb, c, LOOM_SCHED_RECV_GRAD);
            long sg = *sched_pos(ix, r, mb, c, LOOM_SCHED_SEND_GRAD);
            long b = bf >= 0 ? bf : bi; /* the backward that makes the input gradient */
            char d[96];
            switch (in.op) {
            case LOOM_SCHED_FWD:
                if (!first && ra < 0)
                    REFUSE("stage %d, instruction %zu (%s): its activations were never "
                           "received (no RECV_ACT mb %d chunk %d on stage %d)", r, i, IN_DESC, mb, c, r);
                if (!first && ra > at)
                    REFUSE("stage %d, instruction %zu (%s): its activations are received only "
                           "later, at instruction %ld (RECV_ACT must come before FWD)", r, i, IN_DESC, ra);
                if (!last && sa < 0)
                    REFUSE("stage %d, instruction %zu (%s): its activations are never sent on "
                           "(no SEND_ACT mb %d chunk %d after it)", r, i, IN_DESC, mb, c);
                if (b < 0)
                    REFUSE("stage %d, instruction %zu (%s): micro-batch %d chunk %d is "
                           "forwarded but never backwarded (no BWD or BWD_INPUT)", r, i, IN_DESC, mb, c);
                break;
            case LOOM_SCHED_BWD:
            case LOOM_SCHED_BWD_INPUT:
                if (bf >= 0 && bi >= 0)
                    REFUSE("stage %d, instruction %zu (%s): micro-batch %d chunk %d has both a "
                           "fused BWD (instruction %ld) and a BWD_INPUT (instruction %ld); use "
                           "one or the other", r, i, IN_DESC, mb, c, bf, bi);
                if (f < 0 || f > at)
                    REFUSE("stage %d, instruction %zu (%s): backward %s its forward%s", r, i, IN_DESC,
                           f < 0 ? "without" : "before", f < 0 ? " (no FWD)" : "");
                if (!last && rg < 0)
                    REFUSE("stage %d, instruction %zu (%s): its output gradient was never "
                           "received (no RECV_GRAD mb %d chunk %d on stage %d)", r, i, IN_DESC, mb, c, r);
                if (!last && rg > at)
                    REFUSE("stage %d, instruction %zu (%s): its output gradient is received "
                           "only later, at instruction %ld (RECV_GRAD must come before the "
                           "backward)", r, i, IN_DESC, rg);
                if (!first && sg < 0)
                    REFUSE("stage %d, instruction %zu (%s): its input gradient is never sent "
                           "back (no SEND_GRAD mb %d chunk %d after it)", r, i, IN_DESC, mb, c);
                if (in.op == LOOM_SCHED_BWD_INPUT && bw < 0)
                    REFUSE("stage %d, instruction %zu (%s): its weight gradient is never "
                           "computed (no BWD_WEIGHT mb %d chunk %d)", r, i, IN_DESC, mb, c);
                break;
            case LOOM_SCHED_BWD_WEIGHT:
                if (bf >= 0)
                    REFUSE("stage %d, instruction %zu (%s): the fused BWD at instruction %ld "
                           "already computed it", r, i, IN_DESC, bf);
                if (bi < 0 || bi > at)
                    REFUSE("stage %d, instruction %zu (%s): comes %s (BWD_WEIGHT needs its "
                           "BWD_INPUT first)", r, i, IN_DESC,
                           bi < 0 ? "without a BWD_INPUT" : "before its BWD_INPUT");
                break;
            case LOOM_SCHED_SEND_ACT:
                if (f < 0 || f > at)
                    REFUSE("stage %d, instruction %zu (%s): sends activations %s", r, i, IN_DESC,
                           f < 0 ? "that no FWD computes" : "before the FWD that computes them");
                break;
            case LOOM_SCHED_SEND_GRAD:
                if (b < 0 || b > at)
                    REFUSE("stage %d, instruction %zu (%s): sends an input gradient %s", r, i, IN_DESC,
                           b < 0 ? "that no backward computes"
                                 : "before the backward that computes it");
                break;
            case LOOM_SCHED_RECV_ACT:
                if (f < 0)
                    REFUSE("stage %d, instruction %zu (%s): receives activations that no FWD "
                           "uses", r, i, IN_DESC);
                break;
            case LOOM_SCHED_RECV_GRAD:
                if (b < 0)
                    REFUSE("stage %d, instruction %zu (%s): receives a gradient that no "
                           "backward uses", r, i, IN_DESC);
                break;
            }
        }
    /* what is missing altogether */
    for (int r = 0; r < s->stages; r++)
        for (int mb = 0; mb < s->microbatches; mb++)
            for (int c = 0; c < s->chunks; c++)
                if (*sched_pos(ix, r, mb, c, LOOM_SCHED_FWD) < 0)
                    REFUSE("stage %d: micro-batch %d chunk %d is never forwarded (no FWD mb %d "
                           "chunk %d in its %zu instructions)", r, mb, c, mb, c, s->n[r]);
    return LOOM_OK;
}

#undef IN_DESC

loom_status loom_schedule_validate(const loom_schedule *s)
{
    sched_index ix;
    loom_status st = sched_index_build(s, &ix);
    if (st == LOOM_OK)
        st = check_pairs(&ix);
    if (st == LOOM_OK)
        st = check_order(&ix);
    free(ix.pos);
    return st;
}
