/* compress_ckpt.h — where a pipeline stage's compression residuals are in a checkpoint.
 *
 * Under pp every stage compresses its own tensors over its dp group, the last stage its
 * copy of the tied wte too, so each stage's residual file (residual.pp<S>[.tp<T>]) holds that
 * stage's tensors, wte in stage 0's and the last stage's both. A resume reads only its own
 * stage's files, which needs the checkpoint's pp to be this run's. */
#ifndef LOOM_COMPRESS_CKPT_H
#define LOOM_COMPRESS_CKPT_H

#include "base/status.h"
#include "session.h"

/* This rank's stage's residual parts of a layout tp x pp (pp > 1): *first = stage * tp,
 * *parts = tp. Refuses (naming both) a run whose pipeline stages are not pp. */
loom_status loom_ckpt_residual_stage(const char *mpath, const loom_session *s, int tp, int pp,
                                     int *first, int *parts);

#endif
