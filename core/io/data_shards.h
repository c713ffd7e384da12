/* data_shards.h — llm.c token shards as a data source.
 *
 * A shard is llm.c's format (dev/data/data_common.py): a header of 256 little-endian
 * int32 (magic 20240520, version 1, token count), then that many uint16 tokens. The train
 * split is the files a glob matches, in glob's (sorted) order; the val split another glob.
 *
 * Reading order is llm.c's DataLoader (llmc/dataloader.h), single process:
 *   unshuffled — a step reads B*T+1 tokens from the current position (targets are the
 *     inputs shifted by one) and advances by B*T; when the next batch would not fit in the
 *     current shard it moves to the next shard (wrapping to the first) at position 0.
 *   shuffled (train only) — each epoch visits the shards in a permuted order and, within a
 *     shard, its samples (sample k = tokens [k*B*T, k*B*T + B*T]) in a permuted order.
 *     Permutations are Fisher-Yates over core/rng.h keyed by (seed, epoch[, shard]), not
 *     llm.c's mt19937 stream, so a position is a few words and resume is exact. The sample
 *     order depends on B*T, as llm.c's does: resume with the same batch shape.
 * The val split is never shuffled; rewind() restarts a split from its first shard.
 *
 * Not here: splitting shards across data-parallel ranks (llm.c's process_rank offset),
 * big-endian hosts. Only the current shard of each split is memory-mapped; all headers
 * are checked once at open, so a bad file is refused before training starts.
 * Vocab is reported as 65536 (all a uint16 can hold); the model checks tokens < V itself.
 */
#ifndef LOOM_CORE_DATA_SHARDS_H
#define LOOM_CORE_DATA_SHARDS_H

#include "data.h"

#define LOOM_SHARD_MAGIC 20240520
#define LOOM_SHARD_VERSION 1
#define LOOM_SHARD_HEADER_INTS 256

/* val_glob may be NULL (no val split: reading it fails with a message saying so). */
loom_status loom_data_open_shards(const char *train_glob, const char *val_glob, int shuffle,
                                  uint64_t seed, loom_data *out);

extern const loom_data_ops loom_data_shards_ops;

#endif
