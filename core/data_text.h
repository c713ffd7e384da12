/* data_text.h — a text file as training data: bytes are tokens (vocab 256).
 *
 * The file is split once: the first (1 - val_fraction) of its bytes are the train split,
 * the rest the val split. Batches are read as llm.c's loader reads them: B*T+1
 * consecutive tokens from the current position, targets = inputs shifted by one, the
 * position advancing by B*T and wrapping to the start when the next batch would not fit.
 */
#ifndef LOOM_CORE_DATA_TEXT_H
#define LOOM_CORE_DATA_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

typedef enum loom_split { LOOM_SPLIT_TRAIN = 0, LOOM_SPLIT_VAL = 1 } loom_split;

typedef struct loom_text_data loom_text_data;

loom_status loom_text_open(const char *path, double val_fraction, loom_text_data **out);
void loom_text_close(loom_text_data *d);

size_t loom_text_size(const loom_text_data *d, loom_split split);
/* Next (B,T) batch of split into tokens/targets. Fails if the split is shorter than B*T+1. */
loom_status loom_text_next(loom_text_data *d, loom_split split, int *tokens, int *targets, int B,
                           int T);
/* Reading position of a split, for resume and for restarting evaluation. */
size_t loom_text_position(const loom_text_data *d, loom_split split);
void loom_text_seek(loom_text_data *d, loom_split split, size_t position);

#endif
