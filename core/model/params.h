/* params.h — the parameter table: one contiguous buffer per dtype, and a table of
 * entries saying what lives where.
 *
 * Each entry has a logical name ("h.3.mlp.fc.weight"), its logical (global) shape, the
 * slice of it this rank holds, and its element offset in the flat buffer. The same table
 * serves gradient buckets, ZeRO partitioning by offset ranges, checkpoints by name + slice
 * and resharding to another layout. Entries are laid out in insertion order, each offset
 * aligned to 16 elements (64 bytes) so kernels may vectorise per entry.
 */
#ifndef LOOM_CORE_PARAMS_H
#define LOOM_CORE_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

#define LOOM_PARAM_NAME_MAX 64
#define LOOM_PARAM_MAX_DIMS 4

typedef enum loom_param_init {
    LOOM_INIT_ZEROS = 0,
    LOOM_INIT_ONES,
    LOOM_INIT_NORMAL   /* normal(0, init_std), keyed by (seed, name, logical index) */
} loom_param_init;

typedef struct loom_param_entry {
    char name[LOOM_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[LOOM_PARAM_MAX_DIMS];        /* logical shape */
    int64_t slice_start[LOOM_PARAM_MAX_DIMS];  /* slice held by this rank */
    int64_t slice_len[LOOM_PARAM_MAX_DIMS];
    size_t offset;     /* element offset in the flat buffer */
    size_t numel;      /* elements held (product of slice_len) */
    int layer;         /* block index, -1 outside blocks */
    int split_dim;     /* the dim a tensor-parallel split may cut, -1: always whole */
    int is_matrix;     /* 2-D weight: weight decay applies by default */
    loom_param_init init;
    float init_std;
    int64_t init_rows; /* NORMAL: rows [init_rows, shape[0]) are zero (vocab padding); 0 = all */
} loom_param_entry;

typedef struct loom_param_table {
    loom_param_entry *entries;
    int count;
    int capacity;
    size_t total;      /* elements in the flat buffer, padding included */
} loom_param_table;

/* Append a fully held (unsliced) entry. */
loom_status loom_params_add(loom_param_table *t, const char *name, int ndim, const int64_t *shape,
                            int layer, loom_param_init init, float init_std);
/* Make the entry added last hold only part `part` of `parts` equal slices along dim `dim`
 * (tensor parallelism: Megatron's column / row split). The logical shape is unchanged;
 * slice_start/slice_len, numel and the table's total follow. Refuses a dim that does not
 * divide by parts, naming the parameter. */
loom_status loom_params_slice_last(loom_param_table *t, int dim, int parts, int part);
const loom_param_entry *loom_params_find(const loom_param_table *t, const char *name);
void loom_params_free(loom_param_table *t);

/* Fill a host buffer (t->total floats) with the initial values for seed. */
void loom_params_init_values(const loom_param_table *t, uint64_t seed, float *host);
/* The initial values of flat elements [lo, hi) (hi may pass t->total: zeros there) into
 * dst[0 .. hi-lo): bitwise what loom_params_init_values puts at those places (ZeRO-3's
 * partitioned construction draws only its partition with it). */
void loom_params_init_range(const loom_param_table *t, uint64_t seed, size_t lo, size_t hi,
                            float *dst);

/* Copy the intersection of a source box (start ss, lengths sl: its data at src, F32 or,
 * with bf16 set, BF16 little-endian, row-major in its box) into a destination box (start
 * ds, lengths dl: dst, row-major in its box), both boxes of one nd-dim logical tensor.
 * Elements of dst outside the intersection are untouched; disjoint boxes copy nothing.
 * BF16 widens exactly (its bits are the high half of the F32). */
void loom_params_copy_box(float *dst, const int64_t *ds, const int64_t *dl, const void *src,
                          int bf16, const int64_t *ss, const int64_t *sl, int nd);

/* Total elements this rank holds, without alignment padding. */
size_t loom_params_count(const loom_param_table *t);
/* Total elements of the logical (unsliced) parameters: the whole model's size. */
size_t loom_params_count_logical(const loom_param_table *t);

#endif
