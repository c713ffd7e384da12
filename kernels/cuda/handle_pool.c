/* handle_pool.c — see handle_pool.h: a free stack over a growable array. */
#include "handle_pool.h"

#include <stdlib.h>
#include <string.h>

void loom_handle_pool_init(loom_handle_pool *p, loom_handle_create_fn create,
                           loom_handle_destroy_fn destroy, void *ctx)
{
    memset(p, 0, sizeof *p);
    p->create = create;
    p->destroy = destroy;
    p->ctx = ctx;
}

int loom_handle_pool_acquire(loom_handle_pool *p, void **out)
{
    if (p->n_free > 0) {
        *out = p->free_list[--p->n_free];
    } else {
        if (p->create(p->ctx, out) != 0)
            return -1;
        p->created++;
    }
    p->live++;
    return 0;
}

int loom_handle_pool_release(loom_handle_pool *p, void *h)
{
    p->live--;
    if (p->n_free == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        void **grown = realloc(p->free_list, cap * sizeof *grown);
        if (!grown) {
            p->destroy(p->ctx, h);
            p->created--;
            return -1;
        }
        p->free_list = grown;
        p->cap = cap;
    }
    p->free_list[p->n_free++] = h;
    return 0;
}

void loom_handle_pool_destroy(loom_handle_pool *p)
{
    for (size_t i = 0; i < p->n_free; i++)
        p->destroy(p->ctx, p->free_list[i]);
    free(p->free_list);
    memset(p, 0, sizeof *p);
}
