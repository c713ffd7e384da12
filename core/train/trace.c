/* trace.c — the Chrome-trace writer (see trace.h).
 *
 * Invariants: the file is one JSON object {"traceEvents":[...]} whose array is open from
 * loom_trace_open to loom_trace_close; `n` events have been written (a comma precedes
 * every one after the first). Times become whole nanoseconds once (llround), and ts and
 * dur are printed from those integers as microseconds with three decimals: no rounding
 * can make two spans of a lane overlap.
 */
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/clock.h"

struct loom_trace {
    FILE *f;
    char *path;
    int rank;
    int64_t steps, step; /* the window (0: all) and the current step */
    int on;              /* the current step is inside the window */
    long long n;
    int in_phase;
    double busy_until;   /* inside the phase: the end of the last compute span */
    int costed;          /* loom_trace_cost_begin sampled these for the next span: */
    double cpu0;         /* process CPU ms */
    long faults0, preempt0;
};

static const struct {
    const char *name;
    int lane;
} kinds[LOOM_TRACE_KINDS] = {
    [LOOM_TRACE_FORWARD] = {"forward", 0},       [LOOM_TRACE_BACKWARD] = {"backward", 0},
    [LOOM_TRACE_BACKWARD_INPUT] = {"backward_input", 0},
    [LOOM_TRACE_BACKWARD_WEIGHT] = {"backward_weight", 0},
    [LOOM_TRACE_OPTIMIZER] = {"optimizer", 0},   [LOOM_TRACE_IDLE] = {"idle", 0},
    [LOOM_TRACE_RECV_ACT] = {"recv_act", 1},     [LOOM_TRACE_RECV_GRAD] = {"recv_grad", 1},
    [LOOM_TRACE_SEND_ACT] = {"send_act", 1},     [LOOM_TRACE_SEND_GRAD] = {"send_grad", 1},
    [LOOM_TRACE_SEND_WAIT] = {"send_wait", 1},   [LOOM_TRACE_GRAD_SYNC] = {"grad_sync", 1},
    [LOOM_TRACE_TIED_SYNC] = {"tied_sync", 1},   [LOOM_TRACE_NORM] = {"norm", 1},
    [LOOM_TRACE_STEP] = {"step", 2},            [LOOM_TRACE_ALLREDUCE] = {"allreduce", 3},
    [LOOM_TRACE_EP_A2A] = {"a2a", 4},            [LOOM_TRACE_REDUCE_SCATTER] = {"reduce_scatter", 3},
};
static const char *lanes[] = {"compute", "comm", "step", "dp", "ep"};

static void sep(loom_trace *tr) { fputs(tr->n++ ? ",\n" : "\n", tr->f); }

loom_status loom_trace_open(const char *path, int rank, int stage, int64_t steps,
                            loom_trace **out)
{
    *out = NULL;
    loom_trace *tr = calloc(1, sizeof *tr);
    if (!tr)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    tr->f = fopen(path, "w");
    if (!tr->f) {
        free(tr);
        LOOM_FAIL(LOOM_ERR_IO, "log.trace: cannot write '%s' (give a directory this process may "
                  "create files in)", path);
    }
    setvbuf(tr->f, NULL, _IOFBF, 1 << 16);
    tr->path = strdup(path);
    tr->rank = rank;
    tr->steps = steps;
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", tr->f);
    sep(tr);
    if (stage >= 0)
        fprintf(tr->f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
                "\"rank %d (stage %d)\"}}", rank, rank, stage);
    else
        fprintf(tr->f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
                "\"rank %d\"}}", rank, rank);
    for (int l = 0; l < (int)(sizeof lanes / sizeof *lanes); l++) {
        sep(tr);
        fprintf(tr->f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":"
                "{\"name\":\"%s\"}}", rank, l, lanes[l]);
    }
    *out = tr;
    return LOOM_OK;
}

void loom_trace_close(loom_trace *tr)
{
    if (!tr)
        return;
    fputs("\n]}\n", tr->f);
    fclose(tr->f);
    free(tr->path);
    free(tr);
}

void loom_trace_step(loom_trace *tr, int64_t first)
{
    if (!tr)
        return;
    if (tr->step == 0) {
        tr->step = first;
        tr->steps = tr->steps ? first + tr->steps - 1 : 0; /* the window's last step */
    } else {
        tr->step++; /* a skipped update is a step too */
    }
    tr->on = tr->steps == 0 || tr->step <= tr->steps;
}

static void emit(loom_trace *tr, loom_trace_kind kind, double t0, double t1, int mb, int chunk,
                 const char *args, int cost)
{
    long long a = llround(t0 * 1e6), b = llround(t1 * 1e6); /* ms -> ns */
    long long d = b > a ? b - a : 0;
    sep(tr);
    fprintf(tr->f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
            "\"ts\":%lld.%03lld,\"dur\":%lld.%03lld,\"args\":{\"step\":%lld",
            kinds[kind].name, lanes[kinds[kind].lane], tr->rank, kinds[kind].lane, a / 1000,
            a % 1000, d / 1000, d % 1000, (long long)tr->step);
    if (mb >= 0)
        fprintf(tr->f, ",\"mb\":%d,\"chunk\":%d", mb, chunk);
    if (args)
        fprintf(tr->f, ",%s", args);
    if (cost && tr->costed && kind != LOOM_TRACE_IDLE) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        fprintf(tr->f, ",\"cpu_ms\":%.3f,\"faults\":%ld,\"preempt\":%ld", loom_cpu_ms() - tr->cpu0,
                ru.ru_minflt + ru.ru_majflt - tr->faults0, ru.ru_nivcsw - tr->preempt0);
        tr->costed = 0;
    }
    fputs("}}", tr->f);
}

void loom_trace_span(loom_trace *tr, loom_trace_kind kind, double t0_ms, double t1_ms, int mb,
                     int chunk)
{
    if (!tr || !tr->on || kind < 0 || kind >= LOOM_TRACE_KINDS)
        return;
    if (tr->in_phase && kinds[kind].lane == 0) {
        if (t0_ms > tr->busy_until)
            emit(tr, LOOM_TRACE_IDLE, tr->busy_until, t0_ms, -1, -1, NULL, 1);
        tr->busy_until = t1_ms;
    }
    emit(tr, kind, t0_ms, t1_ms, mb, chunk, NULL, 1);
}

void loom_trace_span_args(loom_trace *tr, loom_trace_kind kind, double t0_ms, double t1_ms,
                          int mb, int chunk, const char *args)
{
    if (!tr || !tr->on || kind < 0 || kind >= LOOM_TRACE_KINDS || kinds[kind].lane == 0)
        return; /* compute spans go through loom_trace_span (the idle gaps) */
    emit(tr, kind, t0_ms, t1_ms, mb, chunk, args, 0); /* emitted inside an instruction (ZeRO's
                                                         * waits): its cost stays the instruction's */
}

void loom_trace_cost_begin(loom_trace *tr)
{
    if (!tr || !tr->on)
        return;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    tr->faults0 = ru.ru_minflt + ru.ru_majflt;
    tr->preempt0 = ru.ru_nivcsw;
    tr->cpu0 = loom_cpu_ms();
    tr->costed = 1;
}

void loom_trace_phase_begin(loom_trace *tr, double t_ms)
{
    if (!tr)
        return;
    tr->in_phase = 1;
    tr->busy_until = t_ms;
}

void loom_trace_phase_end(loom_trace *tr, double t_ms)
{
    if (!tr)
        return;
    if (tr->on && t_ms > tr->busy_until)
        emit(tr, LOOM_TRACE_IDLE, tr->busy_until, t_ms, -1, -1, NULL, 1);
    tr->in_phase = 0;
}

loom_status loom_trace_flush(loom_trace *tr)
{
    if (!tr || !tr->on)
        return LOOM_OK;
    errno = 0;
    if (fflush(tr->f) != 0 || ferror(tr->f))
        LOOM_FAIL(LOOM_ERR_IO, "log.trace: writing '%s' failed (%s): free some space or trace "
                  "fewer steps (log.trace_steps)", tr->path ? tr->path : "?",
                  errno ? strerror(errno) : "write error");
    return LOOM_OK;
}

loom_trace_kind loom_trace_kind_of(loom_sched_op op)
{
    switch (op) {
    case LOOM_SCHED_FWD: return LOOM_TRACE_FORWARD;
    case LOOM_SCHED_BWD: return LOOM_TRACE_BACKWARD;
    case LOOM_SCHED_BWD_INPUT: return LOOM_TRACE_BACKWARD_INPUT;
    case LOOM_SCHED_BWD_WEIGHT: return LOOM_TRACE_BACKWARD_WEIGHT;
    case LOOM_SCHED_RECV_ACT: return LOOM_TRACE_RECV_ACT;
    case LOOM_SCHED_RECV_GRAD: return LOOM_TRACE_RECV_GRAD;
    case LOOM_SCHED_SEND_ACT: return LOOM_TRACE_SEND_ACT;
    case LOOM_SCHED_SEND_GRAD: return LOOM_TRACE_SEND_GRAD;
    }
    return LOOM_TRACE_KINDS; /* not traced */
}

int loom_trace_is_compute(loom_sched_op op)
{
    return op == LOOM_SCHED_FWD || op == LOOM_SCHED_BWD || op == LOOM_SCHED_BWD_INPUT ||
           op == LOOM_SCHED_BWD_WEIGHT;
}
