/* pool.c — the caching allocator's bookkeeping (pool.h). Blocks are nodes in one list per
 * segment, in address order (prev/next), so freeing coalesces with the neighbours in O(1);
 * finding a block by address and best-fit search walk all blocks, O(blocks): the backend's
 * callers allocate at set-up (parameters, activations, scratch), a few hundred blocks. */
#include "pool.h"

#include <stdlib.h>

typedef struct block {
    uintptr_t base;
    size_t size;
    int used, large;
    struct block *prev, *next; /* neighbours in the same segment, by address */
    struct block *all_next;    /* every block of the pool */
    struct segment *seg;
} block;

typedef struct segment {
    uintptr_t base;
    size_t size;
    struct segment *next;
} segment;

struct loom_pool {
    loom_pool_reserve_fn reserve;
    loom_pool_release_fn release;
    void *ctx;
    block *blocks;
    segment *segments;
    loom_pool_stats st;
};

loom_pool *loom_pool_create(loom_pool_reserve_fn reserve, loom_pool_release_fn release, void *ctx)
{
    loom_pool *p = calloc(1, sizeof *p);
    if (p) {
        p->reserve = reserve;
        p->release = release;
        p->ctx = ctx;
    }
    return p;
}

static size_t round_up(size_t n, size_t a)
{
    return n > SIZE_MAX - (a - 1) ? 0 : (n + a - 1) / a * a;
}

size_t loom_pool_round(size_t bytes)
{
    if (bytes == 0)
        return LOOM_POOL_ALIGN;
    if (bytes < LOOM_POOL_SMALL)
        return round_up(bytes, LOOM_POOL_ALIGN);
    return round_up(bytes, LOOM_POOL_LARGE_ALIGN);
}

static block *new_block(loom_pool *p, segment *s, uintptr_t base, size_t size, int large)
{
    block *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->base = base;
    b->size = size;
    b->large = large;
    b->seg = s;
    b->all_next = p->blocks;
    p->blocks = b;
    p->st.blocks++;
    return b;
}

static void unlink_block(loom_pool *p, block *b)
{
    for (block **at = &p->blocks; *at; at = &(*at)->all_next)
        if (*at == b) {
            *at = b->all_next;
            break;
        }
    p->st.blocks--;
    free(b);
}

/* A new segment holding one free block of its whole size. */
static block *grow(loom_pool *p, size_t bytes, int large)
{
    uintptr_t base = 0;
    if (p->reserve(p->ctx, bytes, &base) != 0) {
        loom_pool_trim(p);
        if (p->reserve(p->ctx, bytes, &base) != 0)
            return NULL;
    }
    segment *s = calloc(1, sizeof *s);
    block *b = s ? new_block(p, s, base, bytes, large) : NULL;
    if (!b) {
        free(s);
        p->release(p->ctx, base, bytes);
        p->st.release_calls++;
        return NULL;
    }
    s->base = base;
    s->size = bytes;
    s->next = p->segments;
    p->segments = s;
    p->st.segments++;
    p->st.reserved += bytes;
    p->st.reserve_calls++;
    return b;
}

uintptr_t loom_pool_alloc(loom_pool *p, size_t bytes)
{
    size_t need = loom_pool_round(bytes);
    if (need == 0)
        return 0;
    int large = need >= LOOM_POOL_SMALL;
    block *best = NULL;
    for (block *b = p->blocks; b; b = b->all_next)
        if (!b->used && b->large == large && b->size >= need && (!best || b->size < best->size))
            best = b;
    if (!best)
        best = grow(p, large ? need : LOOM_POOL_SMALL_SEGMENT, large);
    if (!best)
        return 0;
    /* Split off the tail when what is left is worth a block of this kind. */
    size_t rest = best->size - need;
    if (rest >= (large ? LOOM_POOL_SMALL : LOOM_POOL_ALIGN)) {
        block *t = new_block(p, best->seg, best->base + need, rest, large);
        if (t) { /* without it the whole block is handed out: wasteful, still correct */
            t->prev = best;
            t->next = best->next;
            if (best->next)
                best->next->prev = t;
            best->next = t;
            best->size = need;
        }
    }
    best->used = 1;
    p->st.in_use += best->size;
    return best->base;
}

static block *find(const loom_pool *p, uintptr_t ptr)
{
    for (block *b = p->blocks; b; b = b->all_next)
        if (b->base == ptr && b->used)
            return b;
    return NULL;
}

size_t loom_pool_block_size(const loom_pool *p, uintptr_t ptr)
{
    const block *b = find(p, ptr);
    return b ? b->size : 0;
}

/* Merge b's successor into b (both free, same segment). */
static void absorb_next(loom_pool *p, block *b)
{
    block *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    unlink_block(p, n);
}

int loom_pool_free(loom_pool *p, uintptr_t ptr)
{
    block *b = find(p, ptr);
    if (!b)
        return -1;
    b->used = 0;
    p->st.in_use -= b->size;
    if (b->next && !b->next->used)
        absorb_next(p, b);
    if (b->prev && !b->prev->used)
        absorb_next(p, b->prev);
    return 0;
}

size_t loom_pool_trim(loom_pool *p)
{
    size_t freed = 0;
    for (segment **at = &p->segments; *at;) {
        segment *s = *at;
        block *whole = NULL;
        for (block *b = p->blocks; b; b = b->all_next)
            if (b->seg == s && !b->used && b->size == s->size)
                whole = b;
        if (!whole) {
            at = &s->next;
            continue;
        }
        unlink_block(p, whole);
        p->release(p->ctx, s->base, s->size);
        p->st.release_calls++;
        p->st.reserved -= s->size;
        p->st.segments--;
        freed += s->size;
        *at = s->next;
        free(s);
    }
    return freed;
}

void loom_pool_destroy(loom_pool *p)
{
    if (!p)
        return;
    while (p->blocks) {
        block *b = p->blocks;
        p->blocks = b->all_next;
        free(b);
    }
    while (p->segments) {
        segment *s = p->segments;
        p->segments = s->next;
        p->release(p->ctx, s->base, s->size);
        free(s);
    }
    free(p);
}

void loom_pool_get_stats(const loom_pool *p, loom_pool_stats *out)
{
    *out = p->st;
}
