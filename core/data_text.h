/* data_text.h — a text file as training data: bytes are tokens (vocab 256).
 *
 * The file is split once: the first (1 - val_fraction) of its bytes are the train split,
 * the rest the val split. Batches are read as llm.c's loader reads them: B*T+1
 * consecutive tokens from the current position, targets = inputs shifted by one, the
 * position advancing by B*T and wrapping to the start when the next batch would not fit.
 * Opened through loom_data_open_text (data.h).
 */
#ifndef LOOM_CORE_DATA_TEXT_H
#define LOOM_CORE_DATA_TEXT_H

#include "data.h"

extern const loom_data_ops loom_data_text_ops;

#endif
