/* pool.h — a caching allocator over address ranges: the bookkeeping of the CUDA backend's
 * device memory pool, in plain C (no CUDA types), so that it is unit-tested on machines
 * without a GPU over fake address ranges (tests/unit/test_cuda_pool.c).
 *
 * The pool asks its `reserve` callback for segments (cudaMalloc on the device) and hands
 * out blocks carved from them; free() returns a block to the pool, coalescing it with free
 * neighbours of the same segment, and never calls `release`. Segments go back only through
 * loom_pool_trim() (or when a reserve fails: the pool trims and asks once more), so a
 * training step that frees and allocates the same sizes again reuses them and never reaches
 * cudaMalloc.
 *
 * Size classes: a request is rounded up to LOOM_POOL_ALIGN (512 bytes) when below
 * LOOM_POOL_SMALL (1 MiB), else to LOOM_POOL_LARGE_ALIGN (2 MiB). Small blocks come from
 * 2 MiB segments shared among them; a large block gets a segment of its own rounded size,
 * and is split when a later request fits in a free large block with at least 1 MiB to
 * spare. Small and large blocks never share a segment (fragmentation stays bounded).
 * Search is best fit over the free blocks of the request's kind.
 */
#ifndef LOOM_CUDA_POOL_H
#define LOOM_CUDA_POOL_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_POOL_ALIGN ((size_t)512)
#define LOOM_POOL_SMALL ((size_t)1 << 20)
#define LOOM_POOL_LARGE_ALIGN ((size_t)2 << 20)
#define LOOM_POOL_SMALL_SEGMENT ((size_t)2 << 20)

/* Reserve `bytes` of fresh address range: 0 and *base set, or -1 (out of memory). */
typedef int (*loom_pool_reserve_fn)(void *ctx, size_t bytes, uintptr_t *base);
typedef void (*loom_pool_release_fn)(void *ctx, uintptr_t base, size_t bytes);

typedef struct loom_pool loom_pool;

typedef struct loom_pool_stats {
    size_t reserved;      /* bytes held in segments */
    size_t in_use;        /* bytes in handed-out blocks (rounded sizes) */
    size_t segments;      /* segments held */
    size_t blocks;        /* blocks, free and used */
    size_t reserve_calls; /* successful reserve callbacks so far */
    size_t release_calls; /* release callbacks so far */
} loom_pool_stats;

/* NULL when out of host memory. */
loom_pool *loom_pool_create(loom_pool_reserve_fn reserve, loom_pool_release_fn release, void *ctx);
/* Releases every segment, used or not. */
void loom_pool_destroy(loom_pool *p);
/* The rounded size a request of `bytes` takes (its size class); 0 for 0 or on overflow. */
size_t loom_pool_round(size_t bytes);
/* A block of at least `bytes` (bytes == 0 gets the smallest class), or 0 when the reserve
 * callback fails even after a trim. */
uintptr_t loom_pool_alloc(loom_pool *p, size_t bytes);
/* 0, or -1 if ptr is not a block this pool handed out (and still holds): nothing changes. */
int loom_pool_free(loom_pool *p, uintptr_t ptr);
/* The rounded size of a live block, 0 for an unknown pointer. */
size_t loom_pool_block_size(const loom_pool *p, uintptr_t ptr);
/* Release every segment that is wholly free; returns the bytes released. */
size_t loom_pool_trim(loom_pool *p);
void loom_pool_get_stats(const loom_pool *p, loom_pool_stats *out);

#endif
