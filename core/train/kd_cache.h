/* kd_cache.h — cached teacher logits for distillation (`loom distill-cache`, docs/DISTILL.md).
 *
 * The teacher runs forward once over the training data stream — the micro-batches a run of
 * the same recipe draws, in order — and each token's k largest logits are written with
 * their columns. A run with teacher = { cache = FILE } then reads micro-batch g's record
 * instead of running the teacher, where g = (step - 1) * micro-batches-per-step + i counts
 * the stream's micro-batches (every dp rank draws every one), so one file serves any dp,
 * accumulation and resume. Each record carries the XXH64 of the input tokens it was made
 * from: a run whose data, seed, shuffle or tokenizer differ is refused at its first step.
 *
 * File format, version 1 (little-endian, checksum.h's XXH64 with seed 0):
 *   header, LOOM_KD_HEADER_BYTES:
 *     0   char[8]  magic "LOOMKDC1"
 *     8   u32      version (1)
 *     12  u32      header bytes (LOOM_KD_HEADER_BYTES)
 *     16  i32      vocab V (the columns are in [0, V))
 *     20  i32      k, entries per token, 1 <= k <= V
 *     24  i32      micro-batch rows B (batch.micro)
 *     28  i32      sequence length T (batch.seq)
 *     32  i64      records (micro-batches)
 *     40  char[256] the data source as the recipe gave it (NUL-padded; for messages)
 *     296 char[256] the teacher (NUL-padded; for messages)
 *     552 u64      XXH64 of bytes 0..551
 *   then `records` records of 16 + 8 B T k bytes each:
 *     u64      XXH64 of the B*T input tokens (i32) the teacher read
 *     f32[B*T][k] each token's k largest raw logits (no temperature), in ascending column
 *              order (ties: the lower column is the larger)
 *     u32[B*T][k] their columns, ascending
 *     u64      XXH64 of the record's bytes before it
 * The file is written to FILE.tmp and renamed when complete.
 *
 * Training from a record: the teacher's row is its k logits, -inf elsewhere, so p_t is the
 * softmax over the top k (renormalised) and zero outside; with k = V it is the full row in
 * column order, and the distillation term is bitwise the in-process teacher's.
 */
#ifndef LOOM_CORE_KD_CACHE_H
#define LOOM_CORE_KD_CACHE_H

#include <stdint.h>

#include "model/gpt.h"
#include "session.h"

#define LOOM_KD_HEADER_BYTES 560

/* What a cache is written for: the shape a reader checks against its own. */
typedef struct loom_kd_cache_shape {
    int vocab, k, micro, seq;
    int64_t records;
    const char *source, *teacher; /* descriptions (truncated to 255 bytes) */
} loom_kd_cache_shape;

/* Draw shape->records micro-batches of (micro, seq) from next, run teacher forward on each
 * and write the file at path (atomically: path.tmp, then rename). teacher's vocab must be
 * shape->vocab and its micro-batch capacity at least shape->micro. */
loom_status loom_kd_cache_write(const char *path, const loom_kd_cache_shape *shape,
                                loom_gpt *teacher, loom_batch_fn next, void *ctx);

typedef struct loom_kd_cache loom_kd_cache;

/* Open and check a cache for a run of this vocab and (micro, seq): the magic, version,
 * header checksum, file size and shape; a mismatch is refused naming it. */
loom_status loom_kd_cache_open(const char *path, int vocab, int micro, int seq,
                               loom_kd_cache **out);
/* Micro-batch g's teacher rows, dense (micro*seq rows of vocab floats, -inf outside each
 * token's top k), valid until the next call; tokens (micro*seq) must be the ones the
 * record was written from. Refused: g past the end, a checksum or a token mismatch. */
loom_status loom_kd_cache_rows(loom_kd_cache *c, int64_t g, const int *tokens,
                               const float **rows);
const loom_kd_cache_shape *loom_kd_cache_info(const loom_kd_cache *c);
void loom_kd_cache_close(loom_kd_cache *c);
/* Bytes it holds: one record as read and the micro-batch's dense rows (loom_session_memory). */
size_t loom_kd_cache_bytes(const loom_kd_cache *c);

#endif
