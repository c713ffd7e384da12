/* safetensors.c — the safetensors writer and strict reader (see safetensors.h).
 *
 * The reader trusts nothing: every number in the header is checked against the file's
 * real size before it is used as an offset, sums and products are overflow-checked, and
 * the tensors must tile the data section exactly (sorted by offset, no gap, no overlap),
 * which is what the reference implementation requires too.
 */
#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checksum.h"
#include "json.h"
#include "base/status.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

static const struct { const char *name; size_t size; } dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},
    {"F64", 8},  {"I64", 8}, {"U64", 8},
};

static const char *dtype_file_name(loom_dtype dt)
{
    switch (dt) {
    case LOOM_DTYPE_F32: return "F32";
    case LOOM_DTYPE_BF16: return "BF16";
    case LOOM_DTYPE_F16: return "F16";
    case LOOM_DTYPE_I32: return "I32";
    case LOOM_DTYPE_U8: return "U8";
    case LOOM_DTYPE_U16: return "U16";
    }
    return NULL;
}

/* --- writing ------------------------------------------------------------------------ */

typedef struct out_file {
    FILE *f;
    const char *path;
    uint64_t bytes;
    loom_xxh64_state sum;
} out_file;

static loom_status put(out_file *o, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, o->f) != n)
        return loom_fail(LOOM_ERR_IO, "cannot write '%s': %s", o->path, strerror(errno));
    loom_xxh64_update(&o->sum, p, n);
    o->bytes += n;
    return LOOM_OK;
}

static loom_status make_header(const loom_st_tensor *t, int n, const loom_st_meta *meta, int n_meta,
                               loom_strbuf *h)
{
    loom_strbuf_puts(h, "{");
    if (n_meta > 0) {
        loom_strbuf_puts(h, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            loom_strbuf_puts(h, i ? "," : "");
            loom_json_write_string(h, meta[i].key);
            loom_strbuf_puts(h, ":");
            loom_json_write_string(h, meta[i].value);
        }
        loom_strbuf_puts(h, "}");
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *dt = dtype_file_name(t[i].dtype);
        if (!dt || t[i].ndim < 0 || t[i].ndim > LOOM_ST_MAX_DIMS || !t[i].name[0] ||
            strcmp(t[i].name, "__metadata__") == 0)
            return loom_fail(LOOM_ERR_INVALID, "safetensors: cannot write tensor '%s' (dtype %d, "
                             "%d dims)", t[i].name, (int)t[i].dtype, t[i].ndim);
        uint64_t bytes = loom_dtype_size(t[i].dtype);
        loom_strbuf_puts(h, n_meta > 0 || i ? "," : "");
        loom_json_write_string(h, t[i].name);
        loom_strbuf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", dt);
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0)
                return loom_fail(LOOM_ERR_INVALID, "safetensors: tensor '%s' has a negative dim",
                                 t[i].name);
            loom_strbuf_printf(h, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
            bytes *= (uint64_t)t[i].shape[d];
        }
        loom_strbuf_printf(h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + bytes);
        off += bytes;
    }
    loom_strbuf_puts(h, "}");
    while (!h->failed && h->len % 8)
        loom_strbuf_puts(h, " ");
    if (h->failed)
        return loom_fail(LOOM_ERR_INVALID, "safetensors: out of memory or a name is not UTF-8");
    return LOOM_OK;
}

static loom_status write_body(out_file *o, const loom_st_tensor *t, int n, const loom_strbuf *h)
{
    unsigned char len8[8];
    uint64_t hl = h->len;
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(hl >> (8 * i));
    LOOM_TRY(put(o, len8, 8));
    LOOM_TRY(put(o, h->data, h->len));
    for (int i = 0; i < n; i++) {
        size_t bytes = loom_dtype_size(t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            bytes *= (size_t)t[i].shape[d];
        LOOM_TRY(put(o, t[i].data, bytes));
    }
    if (fflush(o->f) != 0)
        return loom_fail(LOOM_ERR_IO, "cannot write '%s': %s", o->path, strerror(errno));
    if (fsync(fileno(o->f)) != 0)
        return loom_fail(LOOM_ERR_IO, "cannot sync '%s' to disk: %s", o->path, strerror(errno));
    return LOOM_OK;
}

loom_status loom_safetensors_write(const char *path, const loom_st_tensor *tensors, int n,
                                   const loom_st_meta *meta, int n_meta, uint64_t *bytes,
                                   uint64_t *checksum)
{
    loom_strbuf h;
    loom_strbuf_init(&h);
    loom_status st = make_header(tensors, n, meta, n_meta, &h);
    if (st != LOOM_OK) {
        loom_strbuf_free(&h);
        return st;
    }
    out_file o = {.f = fopen(path, "wb"), .path = path};
    loom_xxh64_init(&o.sum);
    if (!o.f) {
        loom_strbuf_free(&h);
        return loom_fail(LOOM_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    }
    st = write_body(&o, tensors, n, &h);
    loom_strbuf_free(&h);
    if (fclose(o.f) != 0 && st == LOOM_OK)
        st = loom_fail(LOOM_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    *bytes = o.bytes;
    *checksum = loom_xxh64_digest(&o.sum);
    return st;
}

/* --- reading ------------------------------------------------------------------------ */

struct loom_st_file {
    loom_json_doc *doc;
    const unsigned char *data;   /* the data section */
    uint64_t data_size;
    loom_st_entry *entries;      /* file (header) order */
    int count;
    const loom_st_entry **by_name; /* entries sorted by name */
    const loom_json *meta;       /* the __metadata__ object or NULL */
};

typedef struct reader {
    const char *what, *path;
    loom_st_file *f;
} reader;

static loom_status bad(const reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static loom_status bad(const reader *r, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_CORRUPT, "%s '%s': %s", r->what, r->path, msg);
}

static loom_status parse_meta(const reader *r, const loom_json *m)
{
    if (m->type != LOOM_JSON_OBJECT)
        return bad(r, "__metadata__ is a JSON %s (an object of strings expected)",
                   loom_json_type_name(m->type));
    for (size_t i = 0; i < m->count; i++)
        if (m->items[i].type != LOOM_JSON_STRING)
            return bad(r, "__metadata__ key '%.64s' is a JSON %s (a string expected)",
                       m->items[i].key, loom_json_type_name(m->items[i].type));
    r->f->meta = m;
    return LOOM_OK;
}

static loom_status parse_shape(const reader *r, const char *name, const loom_json *v, loom_st_entry *e)
{
    if (!v || v->type != LOOM_JSON_ARRAY)
        return bad(r, "tensor '%.64s' has no shape array", name);
    if (v->count > LOOM_ST_MAX_DIMS)
        return bad(r, "tensor '%.64s' has %zu dims (at most %d)", name, v->count, LOOM_ST_MAX_DIMS);
    e->ndim = (int)v->count;
    e->numel = 1;
    for (size_t d = 0; d < v->count; d++) {
        int64_t x;
        if (!loom_json_int64(&v->items[d], &x) || x < 0)
            return bad(r, "tensor '%.64s' shape[%zu] is not an integer >= 0", name, d);
        e->shape[d] = x;
        if (x && e->numel > UINT64_MAX / (uint64_t)x / 8)
            return bad(r, "tensor '%.64s' shape overflows 64 bits", name);
        e->numel *= (uint64_t)x;
    }
    return LOOM_OK;
}

static loom_status parse_tensor(const reader *r, const loom_json *t, loom_st_entry *e)
{
    const char *name = t->key;
    if (t->key_len == 0 || strlen(t->key) != t->key_len)
        return bad(r, "a tensor name is empty or holds a NUL byte");
    if (t->type != LOOM_JSON_OBJECT)
        return bad(r, "tensor '%.64s' is a JSON %s (an object expected)", name,
                   loom_json_type_name(t->type));
    for (size_t i = 0; i < t->count; i++) {
        const char *k = t->items[i].key;
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return bad(r, "tensor '%.64s' has an unknown member '%.32s' (dtype, shape and "
                       "data_offsets expected)", name, k);
    }
    e->name = name;
    const loom_json *dt = loom_json_get(t, "dtype");
    if (!dt || dt->type != LOOM_JSON_STRING)
        return bad(r, "tensor '%.64s' has no dtype string", name);
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0] && !e->dtype; i++)
        if (strcmp(dt->text, dtypes[i].name) == 0) {
            e->dtype = dtypes[i].name;
            e->dtype_size = dtypes[i].size;
        }
    if (!e->dtype)
        return bad(r, "tensor '%.64s' dtype '%.16s' is unknown (F32, BF16, F16, F64, I64, ... "
                   "expected)", name, dt->text);
    LOOM_TRY(parse_shape(r, name, loom_json_get(t, "shape"), e));
    const loom_json *off = loom_json_get(t, "data_offsets");
    if (!off || off->type != LOOM_JSON_ARRAY || off->count != 2 ||
        !loom_json_uint64(&off->items[0], &e->begin) || !loom_json_uint64(&off->items[1], &e->end))
        return bad(r, "tensor '%.64s' data_offsets is not a pair of integers >= 0", name);
    if (e->begin > e->end)
        return bad(r, "tensor '%.64s' data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                   name, e->begin, e->end);
    if (e->end > r->f->data_size)
        return bad(r, "tensor '%.64s' data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of "
                   "the file (%" PRIu64 " bytes of data)", name, e->begin, e->end, r->f->data_size);
    if (e->numel * e->dtype_size != e->end - e->begin)
        return bad(r, "tensor '%.64s' of %" PRIu64 " %s values needs %" PRIu64 " bytes but "
                   "data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64, name, e->numel,
                   e->dtype, e->numel * e->dtype_size, e->begin, e->end, e->end - e->begin);
    return LOOM_OK;
}

static int cmp_offset(const void *a, const void *b)
{
    const loom_st_entry *x = *(const loom_st_entry *const *)a, *y = *(const loom_st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const loom_st_entry *const *)a)->name, (*(const loom_st_entry *const *)b)->name);
}

/* The tensors must tile [0, data_size) exactly. Sorts f->by_name by offset to check,
 * then by name for loom_safetensors_find. */
static loom_status check_tiling(const reader *r)
{
    loom_st_file *f = r->f;
    for (int i = 0; i < f->count; i++)
        f->by_name[i] = &f->entries[i];
    qsort(f->by_name, (size_t)f->count, sizeof *f->by_name, cmp_offset);
    uint64_t at = 0;
    for (int i = 0; i < f->count; i++) {
        const loom_st_entry *e = f->by_name[i];
        if (e->begin > at)
            return bad(r, "bytes [%" PRIu64 ", %" PRIu64 ") of the data section belong to no "
                       "tensor (before tensor '%.64s')", at, e->begin, e->name);
        if (e->begin < at)
            return bad(r, "tensor '%.64s' data_offsets [%" PRIu64 ", %" PRIu64 "] overlap the "
                       "tensor before it (which ends at %" PRIu64 ")", e->name, e->begin, e->end, at);
        at = e->end;
    }
    if (at != f->data_size)
        return bad(r, "the data section is %" PRIu64 " bytes but the tensors cover %" PRIu64
                   " (trailing bytes)", f->data_size, at);
    qsort(f->by_name, (size_t)f->count, sizeof *f->by_name, cmp_name);
    return LOOM_OK;
}

static loom_status parse_header(reader *r, const unsigned char *bytes, size_t size)
{
    if (size < 8)
        return bad(r, "the file is %zu bytes, too short for the 8-byte header length", size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | bytes[i];
    if (n > LOOM_ST_MAX_HEADER)
        return bad(r, "header length %" PRIu64 " is over the limit of %" PRIu64 " bytes", n,
                   LOOM_ST_MAX_HEADER);
    if (n > size - 8)
        return bad(r, "header length %" PRIu64 " runs past the end of the file (%zu bytes)", n, size);
    r->f->data = bytes + 8 + n;
    r->f->data_size = size - 8 - n;
    loom_json_error err;
    loom_json_limits lim = {(size_t)n, 8};
    loom_status st = loom_json_parse((const char *)bytes + 8, (size_t)n, &lim, &r->f->doc, &err);
    if (st == LOOM_ERR_NOMEM)
        return st;
    if (st != LOOM_OK)
        return bad(r, "header is not valid JSON at byte %zu of the file: %s", (size_t)8 + err.offset,
                   err.msg);
    const loom_json *root = loom_json_root(r->f->doc);
    if (root->type != LOOM_JSON_OBJECT)
        return bad(r, "header is a JSON %s (an object expected)", loom_json_type_name(root->type));
    r->f->entries = calloc(root->count ? root->count : 1, sizeof *r->f->entries);
    r->f->by_name = calloc(root->count ? root->count : 1, sizeof *r->f->by_name);
    if (!r->f->entries || !r->f->by_name)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading '%s'", r->path);
    for (size_t i = 0; i < root->count; i++) {
        const loom_json *m = &root->items[i];
        if (strcmp(m->key, "__metadata__") == 0 && m->key_len == 12)
            LOOM_TRY(parse_meta(r, m));
        else
            LOOM_TRY(parse_tensor(r, m, &r->f->entries[r->f->count++]));
    }
    return check_tiling(r);
}

loom_status loom_safetensors_parse(const char *what, const char *path, const unsigned char *bytes,
                                   size_t size, loom_st_file **out)
{
    *out = NULL;
    reader r = {what, path, calloc(1, sizeof(loom_st_file))};
    if (!r.f)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading '%s'", path);
    loom_status st = parse_header(&r, bytes, size);
    if (st != LOOM_OK) {
        loom_safetensors_free(r.f);
        return st;
    }
    *out = r.f;
    return LOOM_OK;
}

void loom_safetensors_free(loom_st_file *f)
{
    if (!f)
        return;
    loom_json_free(f->doc);
    free(f->entries);
    free(f->by_name);
    free(f);
}

int loom_safetensors_count(const loom_st_file *f) { return f->count; }

const loom_st_entry *loom_safetensors_entry(const loom_st_file *f, int i)
{
    return i >= 0 && i < f->count ? &f->entries[i] : NULL;
}

const loom_st_entry *loom_safetensors_find(const loom_st_file *f, const char *name)
{
    int lo = 0, hi = f->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0)
            return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

const char *loom_safetensors_meta(const loom_st_file *f, const char *key)
{
    const loom_json *v = loom_json_get(f->meta, key);
    return v ? v->text : NULL;
}

loom_status loom_safetensors_copy_f32(const loom_st_file *f, const loom_st_entry *e, float *dst,
                                      size_t n)
{
    if (e->numel != n)
        return loom_fail(LOOM_ERR_INVALID, "tensor '%s' has %" PRIu64 " values, %zu expected",
                         e->name, e->numel, n);
    const unsigned char *src = f->data + e->begin;
    if (strcmp(e->dtype, "F32") == 0) {
        memcpy(dst, src, n * sizeof(float));
        return LOOM_OK;
    }
    if (strcmp(e->dtype, "BF16") == 0) {
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &bits, sizeof bits);
        }
        return LOOM_OK;
    }
    return loom_fail(LOOM_ERR_UNSUPPORTED, "tensor '%s' is %s; loom loads F32 or BF16 tensors",
                     e->name, e->dtype);
}
