/* compress_ckpt.h — where a pipeline stage's compression residuals are in a checkpoint.
 *
 * Under pp every stage compresses its own tensors over its dp group, the last stage its
 * copy of the tied wte too, so each stage's residual file (residual.pp<S>[.tp<T>]) holds that
 * stage's tensors, wte in stage 0's and the last stage's both. A resume reads only its own
 * stage's files, which needs the checkpoint's pp to be this run's. */
#ifndef LOOM_COMPRESS_CKPT_H
#define LOOM_COMPRESS_CKPT_H

#include "base/status.h"
#include "model/gpt.h"
#include "session.h"

/* This rank's stage's residual parts of a layout tp x pp (pp > 1): *first = stage * tp,
 * *parts = tp. Refuses (naming both) a run whose pipeline stages are not pp. */
loom_status loom_ckpt_residual_stage(const char *mpath, const loom_session *s, int tp, int pp,
                                     int *first, int *parts);

/* Under expert parallelism (fast mode), for the save: every dp rank's residual as gathered
 * (slots: n per entry of this rank's table t, slot-major per entry, slot k = dp rank k)
 * laid out for ft, the ep=1 table loom_ep_gather_full made (every expert by logical name):
 * a dense entry's n slots as they are; expert X's slot k dp rank k's residual of X when that
 * rank holds X (k % ep is X's ep rank: ep groups are consecutive dp ranks), else 0 (an
 * expert's residual lives on its edp group only). *out: n x ft->total floats, the caller's. */
loom_status loom_ckpt_residual_ep(const loom_gpt *m, const loom_param_table *t, const float *slots,
                                  uint32_t n, int ep, const loom_param_table *ft, float **out);

#endif
