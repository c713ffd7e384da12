/* checkpoint_slices.c — ZeRO's per-dp-rank slice files (checkpoint.h, "Slice files"): the
 * file names of a layout, and writing one rank's partition pieces as boxes.
 *
 * A partition piece is a flat element range of one table entry's held slice (zero.h: a
 * bucket's sub-block cuts parameters anywhere). The stored format knows boxes (a logical
 * start and a shape per tensor, checkpoint.h), so a range is written as the few boxes that
 * tile it in row-major order: at each point the coarsest dimension the range is aligned to
 * and still covers, as many of its rows as fit (at most 2 x ndim boxes). Each such box is
 * contiguous in the partition, so the writer points at the partition itself: no copy of
 * the state is made. Box tensors are named "<name>#<first element>" (the loader drops
 * the suffix and assembles boxes like any other pieces).
 */
#include "checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "io/json.h"
#include "io/safetensors.h"

int loom_ckpt_kind_count(const loom_ckpt_layout *l, int kind)
{
    return l->tp * l->pp * (l->sliced[kind] ? l->dp : 1);
}

void loom_ckpt_kind_name(char *out, size_t len, const loom_ckpt_layout *l, int kind, int i)
{
    static const char *const names[3] = {"model", "optim", "residual"};
    int per = l->sliced[kind] ? l->dp : 1;
    loom_ckpt_file_name(out, len, names[kind], i / per, l->tp, l->pp);
    if (!l->sliced[kind])
        return;
    char *dot = strstr(out, ".safetensors");
    if (dot)
        snprintf(dot, len - (size_t)(dot - out), ".dp%d.safetensors", i % per);
}

typedef loom_ckpt_box box;

int loom_ckpt_range_boxes(const int64_t *s, int nd, uint64_t a, uint64_t b, loom_ckpt_box *out)
{
    uint64_t st[LOOM_PARAM_MAX_DIMS];
    st[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--)
        st[d] = st[d + 1] * (uint64_t)s[d + 1];
    int n = 0;
    for (uint64_t x = a; x < b;) {
        int j = nd - 1;
        for (int d = 0; d < nd - 1; d++)
            if (x % st[d] == 0 && x + st[d] <= b) {
                j = d;
                break;
            }
        box *o = &out[n++];
        uint64_t rest = x;
        for (int d = 0; d < nd; d++) {
            o->start[d] = (int64_t)(rest / st[d]);
            rest %= st[d];
            o->len[d] = d < j ? 1 : (int64_t)s[d];
        }
        uint64_t c = (b - x) / st[j], room = (uint64_t)s[j] - (uint64_t)o->start[j];
        c = c < room ? c : room;
        o->len[j] = (int64_t)c;
        for (int d = j + 1; d < nd; d++)
            o->start[d] = 0;
        o->at = x - a;
        x += c * st[j];
    }
    return n;
}

static char *box_json(const loom_param_entry *e, const box *bx)
{
    loom_strbuf b;
    loom_strbuf_init(&b);
    loom_strbuf_puts(&b, "{\"shape\":[");
    for (int d = 0; d < e->ndim; d++)
        loom_strbuf_printf(&b, "%s%" PRId64, d ? "," : "", e->shape[d]);
    loom_strbuf_puts(&b, "],\"slice_start\":[");
    for (int d = 0; d < e->ndim; d++)
        loom_strbuf_printf(&b, "%s%" PRId64, d ? "," : "", e->slice_start[d] + bx->start[d]);
    loom_strbuf_puts(&b, "]}");
    if (b.failed) {
        loom_strbuf_free(&b);
        return NULL;
    }
    return b.data;
}

loom_status loom_ckpt_write_slices(const char *path, const loom_param_table *t,
                                   const loom_zero_piece *p, size_t n_pieces, const float *part,
                                   uint32_t slots, int is_optim, const char *optim_name,
                                   const char *skip, uint64_t *bytes, uint64_t *sum, uint64_t *head)
{
    uint32_t per = is_optim ? slots : 1;
    size_t cap = n_pieces * per * 2 * LOOM_PARAM_MAX_DIMS + 1;
    loom_st_tensor *ts = calloc(cap, sizeof *ts);
    loom_st_meta *meta = calloc(cap + 5, sizeof *meta);
    char (*names)[LOOM_PARAM_NAME_MAX + 40] = calloc(cap, sizeof *names);
    int64_t (*shapes)[LOOM_PARAM_MAX_DIMS] = calloc(cap, sizeof *shapes);
    char **layouts = calloc(cap, sizeof *layouts);
    char slots_text[16];
    int n = 0, n_meta = 0;
    loom_status st = ts && meta && names && shapes && layouts
                         ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "out of memory writing '%s'", path);
    if (st == LOOM_OK) {
        meta[n_meta++] = (loom_st_meta){"format", "pt"};
        meta[n_meta++] = (loom_st_meta){"loom.format", LOOM_CHECKPOINT_FORMAT};
        if (is_optim) {
            snprintf(slots_text, sizeof slots_text, "%u", slots);
            meta[n_meta++] = (loom_st_meta){"loom.optimizer", optim_name};
            meta[n_meta++] = (loom_st_meta){"loom.slots", slots_text};
        }
    }
    for (size_t i = 0; st == LOOM_OK && i < n_pieces; i++) {
        const loom_param_entry *e = &t->entries[p[i].entry];
        if (skip && strcmp(e->name, skip) == 0)
            continue; /* another stage writes it */
        box bx[2 * LOOM_PARAM_MAX_DIMS];
        uint64_t first = p[i].lo - e->offset;
        int nb = loom_ckpt_range_boxes(e->slice_len, e->ndim, first, first + p[i].n, bx);
        for (uint32_t k = 0; st == LOOM_OK && k < per; k++)
            for (int q = 0; st == LOOM_OK && q < nb; q++) {
                int j = n++;
                if (is_optim)
                    snprintf(names[j], sizeof names[j], "%s.state%u#%" PRIu64, e->name, k,
                             first + bx[q].at);
                else
                    snprintf(names[j], sizeof names[j], "%s#%" PRIu64, e->name, first + bx[q].at);
                memcpy(shapes[j], bx[q].len, sizeof shapes[j]);
                const float *src = is_optim ? part + (size_t)slots * p[i].pos + (size_t)k * p[i].n
                                            : part + p[i].pos;
                ts[j] = (loom_st_tensor){names[j], LOOM_DTYPE_F32, e->ndim, shapes[j],
                                         src + bx[q].at};
                if (!(layouts[j] = box_json(e, &bx[q])))
                    st = loom_fail(LOOM_ERR_NOMEM, "out of memory writing '%s'", path);
                meta[n_meta++] = (loom_st_meta){names[j], layouts[j]};
            }
    }
    if (st == LOOM_OK)
        st = loom_ckpt_write_tiled(path, ts, n, meta, n_meta, bytes, sum, head);
    for (size_t i = 0; layouts && i < cap; i++)
        free(layouts[i]);
    free(layouts);
    free(shapes);
    free(names);
    free(meta);
    free(ts);
    return st;
}
