/* nonfinite.h — where a non-finite loss or gradient first appears, agreed by every rank,
 * and the test aid that puts one there.
 *
 * Each rank knows the first entry of its own parameter table whose gradient holds an inf
 * or nan (grad_norm's check, in table order) and whether one of its own micro-batches'
 * losses was non-finite. One small all-gather over the world group gives every rank every
 * rank's finding, and every rank picks the same one: the loss before any gradient (it
 * comes first in the computation), then the lowest (pipeline stage, table index, world
 * rank). So every rank skips or stops alike, even when only one rank's gradient holds the
 * value (after the data-parallel reduction the replicas hold the same gradient, so a
 * value born in backward is found on every dp rank and reported at the lowest of them).
 *
 * Fault injection (testing aid): LOOM_INJECT_NONFINITE="STEP:RANK:PARAM[:inf|nan]" makes world
 * rank RANK write +inf (or nan) into the first element of parameter PARAM's gradient at
 * training step STEP, after the gradient is reduced and before the norm and the check; up
 * to 8 such, joined by ",", to show which of several the report names.
 * A malformed value, or a parameter that rank does not hold, is refused at session start.
 */
#ifndef LOOM_CORE_NONFINITE_H
#define LOOM_CORE_NONFINITE_H

#include <stdint.h>

#include "base/backend.h"
#include "base/status.h"
#include "loom/plugin/optim.h"
#include "model/params.h"

typedef struct loom_nonfinite loom_nonfinite;

typedef struct loom_nonfinite_report {
    int found;       /* 1: a non-finite loss or gradient somewhere this step */
    int loss;        /* 1: it is the loss (param is then empty) */
    int rank;        /* the world rank it was found on */
    int stage;       /* that rank's pipeline stage (0 without pp) */
    int stages;      /* the pipeline's stages (1 without pp) */
    int index;       /* the entry of that stage's parameter table, -1 for the loss */
    int stop_signal; /* a stop signal (stop_signal.h) any rank had received by this step's
                      * exchange, the highest number; 0: none. Rides on the same exchange so
                      * that every rank stops after the same step. */
    int spike;       /* some rank found a loss spike (loom_nonfinite_agree's spike) */
    char param[LOOM_PARAM_NAME_MAX];
} loom_nonfinite_report;

/* stage of stages: this rank's place in the pipeline (0 of 1 without pp). Reads
 * LOOM_INJECT_NONFINITE. */
loom_status loom_nonfinite_create(const loom_param_table *t, int stage, int stages,
                                  loom_nonfinite **out);
void loom_nonfinite_destroy(loom_nonfinite *nf);

/* The injection, when armed for this rank and step (grads laid out as t says, in be's
 * memory). */
void loom_nonfinite_inject(const loom_nonfinite *nf, int64_t step, const loom_param_table *t,
                           float *grads, const loom_backend *be);

/* The same where the gradient lives in ZeRO partitions: n segments (optim.h, in be's
 * memory), entry[i] segment i's table entry; fails when this rank holds no piece of a
 * parameter it is to inject into. */
loom_status loom_nonfinite_inject_segments(const loom_nonfinite *nf, int64_t step,
                                           const loom_optim_segment *seg, size_t n,
                                           const int *entry, const loom_backend *be);

/* Every rank calls it once per step. first_bad: this rank's first table entry with a
 * non-finite gradient, or -1; loss_bad: one of this rank's own losses was non-finite;
 * spike: this rank found the step's loss or norm above the loop's limits (out->spike: any
 * rank did).
 * The exchange's wall time is added to *comm_ms. */
loom_status loom_nonfinite_agree(loom_nonfinite *nf, const loom_param_table *t, int first_bad,
                                 int loss_bad, int spike, loom_nonfinite_report *out,
                                 double *comm_ms);

/* "non-finite gradient on rank 1 (pipeline stage 1), first in parameter 'h.1.mlp.fc.w'"
 * or "non-finite loss on rank 0" into buf. */
void loom_nonfinite_describe(const loom_nonfinite_report *r, char *buf, size_t n);

#endif
