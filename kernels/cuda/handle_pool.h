/* handle_pool.h — a pool of reusable opaque handles (CUDA events, in practice), in plain C
 * so its bookkeeping is unit-tested without a GPU. acquire() takes a free handle or makes
 * one with the create callback; release() gives it back for the next acquire. Nothing is
 * destroyed until loom_handle_pool_destroy, so a steady state creates no handles at all
 * (loom-comm-nccl used to create and destroy a CUDA event per request).
 */
#ifndef LOOM_CUDA_HANDLE_POOL_H
#define LOOM_CUDA_HANDLE_POOL_H

#include <stddef.h>

/* Make one handle: 0 and *out set, or -1. */
typedef int (*loom_handle_create_fn)(void *ctx, void **out);
typedef void (*loom_handle_destroy_fn)(void *ctx, void *h);

typedef struct loom_handle_pool {
    loom_handle_create_fn create;
    loom_handle_destroy_fn destroy;
    void *ctx;
    void **free_list; /* handles ready for reuse */
    size_t n_free, cap;
    size_t created, live; /* live: acquired and not yet released */
} loom_handle_pool;

void loom_handle_pool_init(loom_handle_pool *p, loom_handle_create_fn create,
                           loom_handle_destroy_fn destroy, void *ctx);
/* 0 and *out, or -1 when create fails or host memory runs out. */
int loom_handle_pool_acquire(loom_handle_pool *p, void **out);
/* 0, or -1 (out of host memory: the handle is destroyed instead, nothing leaks). */
int loom_handle_pool_release(loom_handle_pool *p, void *h);
/* Destroys the free handles; handles still acquired are the caller's to destroy. */
void loom_handle_pool_destroy(loom_handle_pool *p);

#endif
