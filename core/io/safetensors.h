/* safetensors.h — writing and strictly reading the safetensors format (Hugging Face,
 * https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N
 * bytes of JSON {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}},
 * then the data section, every tensor a contiguous little-endian row-major run.
 *
 * What: write named tensors + a string metadata map (fsynced, XXH64 checksum of every
 * byte computed on the way, see checksum.h); parse a file held in memory and refuse anything malformed:
 * header length over 100 MB or past the end, invalid JSON, unknown dtype or member, shape
 * product * dtype size != the data_offsets span, offsets out of the data section,
 * overlapping, out of order or leaving holes, data section not exactly the file's rest.
 * What not: no mmap, no lazy loading, no dtype conversion but BF16 -> F32.
 * Invariants: written headers are padded with spaces to a multiple of 8 (as the reference
 * implementation does), tensors are laid out in the order given; a parsed file borrows the
 * caller's bytes, which must outlive it. Every refusal reads
 * "<what> '<path>': <field>: <problem>", e.g.
 * checkpoint 'ckpt/step_00000020/model.safetensors': tensor 'h.0.ln_1.weight' data_offsets
 * [1024, 2048] run past the end of the file (1500 bytes of data).
 */
#ifndef LOOM_CORE_SAFETENSORS_H
#define LOOM_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

#define LOOM_ST_MAX_DIMS 8
#define LOOM_ST_MAX_HEADER ((uint64_t)100 << 20) /* 100 MB, the reference limit */

typedef struct loom_st_tensor {
    const char *name;
    loom_dtype dtype;            /* F32, BF16, F16, I32, U8 or U16 */
    int ndim;                    /* 0..LOOM_ST_MAX_DIMS */
    const int64_t *shape;
    const void *data;            /* product(shape) * dtype size bytes, host memory */
} loom_st_tensor;

typedef struct loom_st_meta {
    const char *key, *value;
} loom_st_meta;

/* Write path (created or truncated), fsync it, and report its size and XXH64. */
loom_status loom_safetensors_write(const char *path, const loom_st_tensor *tensors, int n,
                                   const loom_st_meta *meta, int n_meta, uint64_t *bytes,
                                   uint64_t *checksum);

/* One tensor of a parsed file. */
typedef struct loom_st_entry {
    const char *name;
    const char *dtype;           /* the file's dtype name: "F32", "BF16", "I64", ... */
    size_t dtype_size;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;         /* byte range in the data section */
} loom_st_entry;

typedef struct loom_st_file loom_st_file;

/* Validate bytes[0..size) as a safetensors file. what and path only name it in messages.
 * LOOM_ERR_CORRUPT on any malformation. */
loom_status loom_safetensors_parse(const char *what, const char *path, const unsigned char *bytes,
                                   size_t size, loom_st_file **out);
void loom_safetensors_free(loom_st_file *f); /* NULL is fine */

int loom_safetensors_count(const loom_st_file *f);
const loom_st_entry *loom_safetensors_entry(const loom_st_file *f, int i); /* in file order */
const loom_st_entry *loom_safetensors_find(const loom_st_file *f, const char *name);
/* Value of a __metadata__ key, or NULL. */
const char *loom_safetensors_meta(const loom_st_file *f, const char *key);
/* Copy a tensor as n floats: F32 as is, BF16 widened; n must equal its numel; any other
 * dtype is refused naming the tensor. */
loom_status loom_safetensors_copy_f32(const loom_st_file *f, const loom_st_entry *e, float *dst,
                                      size_t n);

#endif
