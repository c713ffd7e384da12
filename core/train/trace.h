/* trace.h — one rank's timeline as a Chrome trace (Trace Event Format, the JSON object
 * form that Perfetto and chrome://tracing open): `log = { trace = "run/trace" }`.
 *
 * Every span is a complete event ("ph":"X") with ts and dur in microseconds of
 * CLOCK_MONOTONIC, so the files of the ranks of one node line up when opened together;
 * pid is the rank, tid a lane:
 *   0 "compute": forward, backward (fused), backward_input (B), backward_weight (W),
 *                optimizer, and idle (the gaps between compute spans inside the pipeline
 *                phase of a step: the bubble);
 *   1 "comm":    recv_act, recv_grad (posting and waiting), send_act, send_grad (starting
 *                them: sends are asynchronous), send_wait (the sends still pending at the
 *                end of the pipeline phase), grad_sync (the data-parallel reduction),
 *                tied_sync (the tied wte's two halves), norm (the gradient-norm exchange);
 *   2 "step":    one span per optimizer step;
 *   3 "dp":      allreduce: the data-parallel reduction in flight, from its first bucket
 *                started (during the backwards where they hand buckets over) to the last
 *                one completed (fast mode with the dp strategy); reduce_scatter: ZeRO
 *                stage 2/3's (fast mode), one span from the first bucket a backward
 *                started to the wait for its last (args buckets: how many; during: how
 *                many the backward's own reports started, before it ended; wait_ms: the
 *                final wait's time, what the overlap left exposed; under pp
 *                that wait is at the next
 *                backward, B or W, or before the step: zero.h), and one for the buckets
 *                held for the tied wte's exchange;
 *   4 "ep":      a2a: inside the mixture of experts' all-to-all(-v) exchanges under ep
 *                (starting, testing between expert GEMMs, waiting; moe.c), so the lane's
 *                sum is the time a step spent in them rather than computing.
 * args hold the step and, for pipeline instructions, the micro-batch and chunk; a span
 * begun with loom_trace_cost_begin also holds what it cost the process: cpu_ms (CPU time,
 * every thread), faults (minor page faults: a first touch of fresh memory) and preempt
 * (involuntary context switches) — so a slow instruction says whether it computed longer,
 * faulted, or waited for a core (wall > cpu_ms with none of those: the host took the
 * vCPU). Spans of
 * one lane never overlap (timestamps are whole nanoseconds, so ts + dur of a span equals
 * the ts of whatever it ends on).
 *
 * Events are written to the file as they happen (buffered, flushed at each step's end):
 * memory stays constant however long the run; `steps` bounds the file. A NULL trace is
 * off: every call returns at once.
 */
#ifndef LOOM_CORE_TRAIN_TRACE_H
#define LOOM_CORE_TRAIN_TRACE_H

#include <stdint.h>

#include "loom/plugin/sched.h"
#include "base/status.h"

typedef enum loom_trace_kind {
    LOOM_TRACE_FORWARD,
    LOOM_TRACE_BACKWARD,
    LOOM_TRACE_BACKWARD_INPUT,
    LOOM_TRACE_BACKWARD_WEIGHT,
    LOOM_TRACE_OPTIMIZER,
    LOOM_TRACE_IDLE,
    LOOM_TRACE_RECV_ACT,
    LOOM_TRACE_RECV_GRAD,
    LOOM_TRACE_SEND_ACT,
    LOOM_TRACE_SEND_GRAD,
    LOOM_TRACE_SEND_WAIT,
    LOOM_TRACE_GRAD_SYNC,
    LOOM_TRACE_TIED_SYNC,
    LOOM_TRACE_NORM,
    LOOM_TRACE_STEP,
    LOOM_TRACE_ALLREDUCE,
    LOOM_TRACE_EP_A2A,
    LOOM_TRACE_REDUCE_SCATTER,
    LOOM_TRACE_KINDS
} loom_trace_kind;

typedef struct loom_trace loom_trace;

/* Opens (truncates) path and writes the header. rank: pid and the process's name;
 * stage: its pipeline stage (-1 without one); steps: trace this many steps from the
 * first, 0 = every step. */
loom_status loom_trace_open(const char *path, int rank, int stage, int64_t steps,
                            loom_trace **out);
/* Ends the JSON and closes the file; NULL is fine. */
void loom_trace_close(loom_trace *tr);

/* A step begins: spans belong to it until the next call. The first call gives the step's
 * number (the steps already taken + 1); each later call counts one on, whether or not the
 * optimizer skipped an update. Past the `steps` window the trace records nothing. */
void loom_trace_step(loom_trace *tr, int64_t first);
/* A span from t0_ms to t1_ms (loom_now_ms); mb and chunk < 0: none. */
void loom_trace_span(loom_trace *tr, loom_trace_kind kind, double t0_ms, double t1_ms, int mb,
                     int chunk);
/* The same with more args: `args` a JSON fragment of members ("\"k\":1,\"j\":2"), appended
 * as given; not for compute spans (lane 0). It may be emitted inside a costed span and
 * takes none of its cost (loom_trace_cost_begin). */
void loom_trace_span_args(loom_trace *tr, loom_trace_kind kind, double t0_ms, double t1_ms,
                          int mb, int chunk, const char *args);
/* Samples the process's CPU time, page faults and preemptions: the next span emitted
 * carries their growth since (args cpu_ms, faults, preempt). Off: nothing. */
void loom_trace_cost_begin(loom_trace *tr);
/* The pipeline phase of a step: between these, the gaps in the compute lane become idle
 * spans. */
void loom_trace_phase_begin(loom_trace *tr, double t_ms);
void loom_trace_phase_end(loom_trace *tr, double t_ms);
/* Writes what is buffered (each step's end); a failed write (a full disk) is an error
 * naming the file. */
loom_status loom_trace_flush(loom_trace *tr);

/* The span kind of a pipeline instruction, and whether it is compute (F, B or W: what
 * the measured bubble counts as busy). */
loom_trace_kind loom_trace_kind_of(loom_sched_op op);
int loom_trace_is_compute(loom_sched_op op);

#endif
