/* pipeline_split.h — the default split of a model's blocks into pipeline stages: contiguous
 * runs of whole blocks, one per virtual stage, balanced by cost.
 *
 * What: virtual stage k holds counts[k] >= 1 consecutive blocks; it costs the sum of its
 * blocks' costs, plus `first` on virtual stage 0 (the embedding) and `last` on virtual
 * stage V-1 (the final norm, LM head and loss). The split minimises the costliest stage
 * (the one that paces the pipeline); among the splits that reach that, it takes the one
 * with the smallest sum of squared stage costs, and then the one that gives earlier
 * stages more blocks. With equal block costs and no extras this is the even split with
 * the first L mod V stages one block larger.
 * What not: whole blocks only: a head that costs a fraction of a block leaves the stages
 * apart by up to that fraction (the run's bubble pays for it). O(V x L^2) time.
 */
#ifndef LOOM_PIPELINE_SPLIT_H
#define LOOM_PIPELINE_SPLIT_H

#include "loom/plugin.h"

/* counts[V]: blocks per virtual stage for L blocks of cost layer[L] (NULL: all 1). */
loom_status loom_pipeline_balance(int L, int V, const double *layer, double first, double last,
                                  int *counts);

#endif
