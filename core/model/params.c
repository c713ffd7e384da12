/* params.c — building the parameter table and drawing initial values. */
#include "params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

#define ALIGN_ELEMS 16

loom_status loom_params_add(loom_param_table *t, const char *name, int ndim, const int64_t *shape,
                            int layer, loom_param_init init, float init_std)
{
    if (ndim < 1 || ndim > LOOM_PARAM_MAX_DIMS)
        LOOM_FAIL(LOOM_ERR_INVALID, "parameter '%s': %d dims (1 to %d supported)", name, ndim,
                  LOOM_PARAM_MAX_DIMS);
    if (strlen(name) >= LOOM_PARAM_NAME_MAX)
        LOOM_FAIL(LOOM_ERR_INVALID, "parameter name '%s' longer than %d", name,
                  LOOM_PARAM_NAME_MAX - 1);
    if (t->count == t->capacity) {
        int cap = t->capacity ? 2 * t->capacity : 64;
        loom_param_entry *e = realloc(t->entries, (size_t)cap * sizeof *e);
        if (!e)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the parameter table");
        t->entries = e;
        t->capacity = cap;
    }
    loom_param_entry *e = &t->entries[t->count++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = ndim;
    e->numel = 1;
    for (int d = 0; d < ndim; d++) {
        e->shape[d] = shape[d];
        e->slice_start[d] = 0;
        e->slice_len[d] = shape[d];
        e->numel *= (size_t)shape[d];
    }
    e->offset = (t->total + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    t->total = e->offset + e->numel;
    e->layer = layer;
    e->split_dim = -1;
    e->is_matrix = ndim >= 2;
    e->init = init;
    e->init_std = init_std;
    return LOOM_OK;
}

loom_status loom_params_slice_last(loom_param_table *t, int dim, int parts, int part)
{
    if (t->count == 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "no parameter to slice");
    loom_param_entry *e = &t->entries[t->count - 1];
    if (dim < 0 || dim >= e->ndim || parts < 1 || part < 0 || part >= parts)
        LOOM_FAIL(LOOM_ERR_INVALID, "parameter '%s': cannot take part %d of %d along dim %d",
                  e->name, part, parts, dim);
    if (e->shape[dim] % parts != 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "parameter '%s': dim %d of size %lld does not divide into %d "
                  "parts", e->name, dim, (long long)e->shape[dim], parts);
    int64_t len = e->shape[dim] / parts;
    e->slice_start[dim] = len * part;
    e->slice_len[dim] = len;
    e->numel = 1;
    for (int d = 0; d < e->ndim; d++)
        e->numel *= (size_t)e->slice_len[d];
    t->total = e->offset + e->numel;
    return LOOM_OK;
}

const loom_param_entry *loom_params_find(const loom_param_table *t, const char *name)
{
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->entries[i].name, name) == 0)
            return &t->entries[i];
    return NULL;
}

void loom_params_free(loom_param_table *t)
{
    free(t->entries);
    memset(t, 0, sizeof *t);
}

size_t loom_params_count(const loom_param_table *t)
{
    size_t n = 0;
    for (int i = 0; i < t->count; i++)
        n += t->entries[i].numel;
    return n;
}

size_t loom_params_count_logical(const loom_param_table *t)
{
    size_t n = 0;
    for (int i = 0; i < t->count; i++) {
        size_t e = 1;
        for (int d = 0; d < t->entries[i].ndim; d++)
            e *= (size_t)t->entries[i].shape[d];
        n += e;
    }
    return n;
}

/* Logical index of element j of a held slice, so values do not depend on the slicing. */
static uint64_t logical_index(const loom_param_entry *e, size_t j, int64_t *row)
{
    int64_t idx[LOOM_PARAM_MAX_DIMS];
    for (int d = e->ndim - 1; d >= 0; d--) {
        idx[d] = e->slice_start[d] + (int64_t)(j % (size_t)e->slice_len[d]);
        j /= (size_t)e->slice_len[d];
    }
    uint64_t li = 0;
    for (int d = 0; d < e->ndim; d++)
        li = li * (uint64_t)e->shape[d] + (uint64_t)idx[d];
    *row = idx[0];
    return li;
}

static float init_value(const loom_param_entry *e, uint64_t seed, uint64_t stream, size_t j)
{
    int64_t row;
    uint64_t li = logical_index(e, j, &row);
    switch (e->init) {
    case LOOM_INIT_ZEROS: return 0.0f;
    case LOOM_INIT_ONES: return 1.0f;
    case LOOM_INIT_NORMAL:
        if (e->init_rows && row >= e->init_rows)
            return 0.0f;
        return (float)(e->init_std * loom_rng_normal(seed, stream, li));
    }
    return 0.0f;
}

/* The generator is counter-based (keyed by seed, the entry's name and the element's
 * logical index), so any range gets the bits the whole draw gives it. */
void loom_params_init_range(const loom_param_table *t, uint64_t seed, size_t lo, size_t hi,
                            float *dst)
{
    if (hi <= lo)
        return;
    memset(dst, 0, (hi - lo) * sizeof *dst); /* alignment padding, and past the table's end */
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        size_t a = e->offset > lo ? e->offset : lo, b = e->offset + e->numel;
        if (b > hi)
            b = hi;
        if (a >= b)
            continue;
        uint64_t stream = loom_rng_stream(e->name);
        for (size_t x = a; x < b; x++)
            dst[x - lo] = init_value(e, seed, stream, x - e->offset);
    }
}

void loom_params_init_values(const loom_param_table *t, uint64_t seed, float *host)
{
    loom_params_init_range(t, seed, 0, t->total, host);
}

/* (checkpoint loads and llm.c model loads under tensor parallelism both fill held slices
 * from stored boxes through this one copy) */
void loom_params_copy_box(float *dst, const int64_t *ds, const int64_t *dl, const void *src_bytes,
                          int bf16, const int64_t *ss, const int64_t *sl, int nd)
{
    const unsigned char *src = src_bytes;
    int64_t lo[LOOM_PARAM_MAX_DIMS], hi[LOOM_PARAM_MAX_DIMS], idx[LOOM_PARAM_MAX_DIMS];
    int64_t dstr[LOOM_PARAM_MAX_DIMS], sstr[LOOM_PARAM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        lo[d] = ds[d] > ss[d] ? ds[d] : ss[d];
        hi[d] = ds[d] + dl[d] < ss[d] + sl[d] ? ds[d] + dl[d] : ss[d] + sl[d];
        if (hi[d] <= lo[d])
            return;
        idx[d] = lo[d];
    }
    dstr[nd - 1] = sstr[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) {
        dstr[d] = dstr[d + 1] * dl[d + 1];
        sstr[d] = sstr[d + 1] * sl[d + 1];
    }
    int64_t run = hi[nd - 1] - lo[nd - 1];
    for (;;) {
        int64_t doff = 0, soff = 0;
        for (int d = 0; d < nd; d++) {
            doff += (idx[d] - ds[d]) * dstr[d];
            soff += (idx[d] - ss[d]) * sstr[d];
        }
        if (!bf16) {
            memcpy(dst + doff, src + soff * 4, (size_t)run * 4);
        } else {
            for (int64_t i = 0; i < run; i++) {
                uint16_t h;
                memcpy(&h, src + (soff + i) * 2, 2);
                uint32_t bits = (uint32_t)h << 16;
                memcpy(dst + doff + i, &bits, 4);
            }
        }
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == hi[d])
            idx[d] = lo[d], d--;
        if (d < 0)
            break;
    }
}
