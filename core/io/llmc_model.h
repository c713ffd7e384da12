/* llmc_model.h — llm.c model files (gpt2_124M.bin and friends) in and out of a loom GPT.
 *
 * Format (llm.c train_gpt2.c / train_gpt2.py write_model): a header of 256 little-endian
 * int32 — [0] magic 20240326, [1] version (3: fp32 parameters, 5: bf16 parameters),
 * [2] maxT, [3] vocab V, [4] layers L, [5] heads NH, [6] channels C, [7] padded vocab Vp —
 * then the parameters grouped by type across layers (fill_in_parameter_sizes):
 *   wte (Vp,C) wpe (maxT,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C)
 *   attprojw (L,C,C) attprojb (L,C) ln2w (L,C) ln2b (L,C) fcw (L,4C,C) fcb (L,4C)
 *   fcprojw (L,C,4C) fcprojb (L,C) lnfw (C) lnfb (C)
 * loom's table is per layer ("h.{l}.attn.qkv.weight", core/gpt.c build_table), so each
 * llm.c block is scattered to / gathered from the entries by name. Both sides store
 * weights as (out, in) row-major, so no transposes.
 *
 * Not here: llm.c's training-state files (optimizer state, data position), other
 * versions, reshaping (the session's model must have the file's exact shape).
 */
#ifndef LOOM_CORE_LLMC_MODEL_H
#define LOOM_CORE_LLMC_MODEL_H

#include "model/gpt.h"

#define LOOM_LLMC_MAGIC 20240326

/* The model shape a file holds (vocab_padded set from the file). Checks the header. */
loom_status loom_llmc_read_config(const char *path, loom_gpt_config *out);
/* Replace m's parameters with the file's; the shapes must match field by field. Under
 * tensor parallelism each rank takes the slice of every tensor it holds (so a GPT-2 file
 * from the wild loads under any tp layout); a pipeline stage takes only the tensors it
 * holds (loom_gpt_held_elsewhere), skipping the rest. A version 5 file's bf16 values are
 * widened exactly to fp32. */
loom_status loom_llmc_load(loom_gpt *m, const char *path);
/* Write m's parameters as a version 3 (fp32) file; written to path.tmp, then renamed.
 * Refused for a session that holds slices or one pipeline stage (export a checkpoint
 * instead). */
loom_status loom_llmc_save(loom_gpt *m, const char *path);

#endif
