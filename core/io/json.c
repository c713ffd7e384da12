/* json.c — the strict JSON reader and writing helpers (see json.h).
 *
 * Recursive descent, depth-limited. Children of an array or object are collected on one
 * scratch stack and copied into the arena when their container closes, so each container
 * gets one contiguous items array and the arena only grows. Duplicate keys are found by
 * sorting a scratch array of member pointers (n log n, since a safetensors header may
 * have tens of thousands of members). Writing is json_write.c.
 */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

#define DEFAULT_MAX_BYTES ((size_t)64 << 20)
#define DEFAULT_MAX_DEPTH 64
#define CHUNK_MIN 4096

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
} chunk;

struct loom_json_doc {
    chunk *chunks;
    loom_json root;
};

typedef struct parser {
    const char *s;
    size_t n, pos;
    int max_depth;
    loom_json_doc *doc;
    loom_json *stack; /* scratch: children of open containers */
    size_t top, cap;
    loom_json_error *err;
    loom_status st;   /* first failure */
} parser;

static void *arena_alloc(loom_json_doc *d, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    chunk *c = d->chunks;
    if (!c || c->cap - c->used < bytes) {
        /* chunks double up to 16 MiB, and are never smaller than the request */
        size_t cap = c ? 2 * c->cap : CHUNK_MIN;
        if (cap > ((size_t)1 << 24))
            cap = (size_t)1 << 24;
        if (cap < bytes)
            cap = bytes;
        c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->next = d->chunks;
        c->used = 0;
        c->cap = cap;
        d->chunks = c;
    }
    void *p = c->mem + c->used;
    c->used += bytes;
    return p;
}

static int fail_at(parser *p, size_t at, loom_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_at(parser *p, size_t at, loom_status st, const char *fmt, ...)
{
    if (p->st != LOOM_OK)
        return 0;
    p->st = st;
    p->err->offset = at;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err->msg, sizeof p->err->msg, fmt, ap);
    va_end(ap);
    return 0;
}

static int nomem(parser *p) { return fail_at(p, p->pos, LOOM_ERR_NOMEM, "out of memory"); }

static void skip_ws(parser *p)
{
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int push(parser *p, const loom_json *v)
{
    if (p->top == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        loom_json *s = realloc(p->stack, cap * sizeof *s);
        if (!s)
            return nomem(p);
        p->stack = s;
        p->cap = cap;
    }
    p->stack[p->top++] = *v;
    return 1;
}

static const char *describe(parser *p)
{
    if (p->pos >= p->n)
        return "the end of the text";
    static _Thread_local char buf[32];
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, sizeof buf, "'%c'", c);
    else
        snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
}

static int parse_value(parser *p, loom_json *v, int depth);

static int hex4(parser *p, unsigned *out)
{
    if (p->n - p->pos < 4)
        return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "\\u escape needs 4 hex digits");
    unsigned u = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos + i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d == 16)
            return fail_at(p, p->pos + i, LOOM_ERR_CORRUPT, "\\u escape needs 4 hex digits");
        u = u * 16 + d;
    }
    p->pos += 4;
    *out = u;
    return 1;
}

size_t loom_utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* At the opening quote. Decodes into the arena (decoded length <= raw length). */
static int parse_string(parser *p, const char **text, size_t *len)
{
    size_t start = ++p->pos, end = start;
    while (end < p->n && p->s[end] != '"')
        end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n)
        return fail_at(p, start - 1, LOOM_ERR_CORRUPT, "string never closed");
    char *o = arena_alloc(p->doc, end - start + 1);
    if (!o)
        return nomem(p);
    size_t k = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20)
            return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "control byte 0x%02x inside a string", c);
        if (c != '\\') {
            size_t l = loom_utf8_len((const unsigned char *)p->s + p->pos, end - p->pos);
            if (!l)
                return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "invalid UTF-8 inside a string");
            memcpy(o + k, p->s + p->pos, l);
            k += l;
            p->pos += l;
            continue;
        }
        char e = p->s[++p->pos];
        p->pos++;
        switch (e) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            size_t at = p->pos - 2;
            if (!hex4(p, &cp))
                return 0;
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return fail_at(p, at, LOOM_ERR_CORRUPT, "lone low surrogate \\u%04x", cp);
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (p->pos + 2 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return fail_at(p, at, LOOM_ERR_CORRUPT, "high surrogate \\u%04x without a low one", cp);
                p->pos += 2;
                if (!hex4(p, &lo))
                    return 0;
                if (lo < 0xdc00 || lo > 0xdfff)
                    return fail_at(p, at, LOOM_ERR_CORRUPT, "high surrogate \\u%04x without a low one", cp);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            k += put_utf8(o + k, cp);
            break;
        }
        default:
            return fail_at(p, p->pos - 2, LOOM_ERR_CORRUPT, "unknown escape '\\%c'", e);
        }
    }
    o[k] = '\0';
    p->pos = end + 1;
    *text = o;
    *len = k;
    return 1;
}

static int parse_number(parser *p, loom_json *v)
{
    size_t i = p->pos, start = p->pos;
    const char *s = p->s;
#define DIGIT(j) ((j) < p->n && s[j] >= '0' && s[j] <= '9')
    if (i < p->n && s[i] == '-')
        i++;
    if (!DIGIT(i))
        return fail_at(p, i, LOOM_ERR_CORRUPT, "expected a digit");
    if (s[i] == '0') {
        i++;
        if (DIGIT(i))
            return fail_at(p, start, LOOM_ERR_CORRUPT, "number with a leading zero");
    } else {
        while (DIGIT(i))
            i++;
    }
    if (i < p->n && s[i] == '.') {
        if (!DIGIT(i + 1))
            return fail_at(p, i + 1, LOOM_ERR_CORRUPT, "expected a digit after '.'");
        for (i++; DIGIT(i); i++) {}
    }
    if (i < p->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (!DIGIT(i))
            return fail_at(p, i, LOOM_ERR_CORRUPT, "expected a digit in the exponent");
        while (DIGIT(i))
            i++;
    }
#undef DIGIT
    char *lit = arena_alloc(p->doc, i - start + 1);
    if (!lit)
        return nomem(p);
    memcpy(lit, s + start, i - start);
    lit[i - start] = '\0';
    v->type = LOOM_JSON_NUMBER;
    v->text = lit;
    v->len = i - start;
    v->number = strtod(lit, NULL); /* grammar checked above; out of range gives +-HUGE_VAL */
    p->pos = i;
    return 1;
}

static int literal(parser *p, const char *word, size_t n)
{
    if (p->n - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "unexpected %s (expected a value)", describe(p));
    p->pos += n;
    return 1;
}

static int cmp_member(const void *a, const void *b)
{
    const loom_json *x = *(const loom_json *const *)a, *y = *(const loom_json *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* Move the children stack[base..top) into the arena as v's items. */
static int close_container(parser *p, loom_json *v, size_t base)
{
    size_t n = p->top - base;
    v->count = n;
    v->items = NULL;
    if (n) {
        loom_json *items = arena_alloc(p->doc, n * sizeof *items);
        if (!items)
            return nomem(p);
        memcpy(items, p->stack + base, n * sizeof *items);
        v->items = items;
    }
    p->top = base;
    if (v->type == LOOM_JSON_OBJECT && n > 1) {
        const loom_json **order = malloc(n * sizeof *order);
        if (!order)
            return nomem(p);
        for (size_t i = 0; i < n; i++)
            order[i] = &v->items[i];
        qsort(order, n, sizeof *order, cmp_member);
        for (size_t i = 1; i < n; i++) {
            if (cmp_member(&order[i - 1], &order[i]) == 0) {
                const loom_json *later = order[i]->begin > order[i - 1]->begin ? order[i] : order[i - 1];
                fail_at(p, later->begin, LOOM_ERR_CORRUPT, "duplicate object key \"%.60s\"", later->key);
                free(order);
                return 0;
            }
        }
        free(order);
    }
    return 1;
}

static int parse_container(parser *p, loom_json *v, int depth, int is_object)
{
    char close = is_object ? '}' : ']';
    if (depth >= p->max_depth)
        return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "nesting deeper than %d", p->max_depth);
    v->type = is_object ? LOOM_JSON_OBJECT : LOOM_JSON_ARRAY;
    p->pos++;
    size_t base = p->top;
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
        return close_container(p, v, base);
    }
    for (;;) {
        loom_json child;
        memset(&child, 0, sizeof child);
        skip_ws(p);
        if (is_object) {
            if (p->pos >= p->n || p->s[p->pos] != '"')
                return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "expected a string key, found %s", describe(p));
            if (!parse_string(p, &child.key, &child.key_len))
                return 0;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':')
                return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "expected ':' after an object key, found %s", describe(p));
            p->pos++;
            skip_ws(p);
        }
        if (!parse_value(p, &child, depth + 1) || !push(p, &child))
            return 0;
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->n && p->s[p->pos] == close) {
            p->pos++;
            return close_container(p, v, base);
        }
        return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "expected ',' or '%c', found %s", close, describe(p));
    }
}

/* At the first byte of a value (whitespace skipped); fills v except key. */
static int parse_value(parser *p, loom_json *v, int depth)
{
    v->begin = p->pos;
    int ok;
    if (p->pos >= p->n)
        return fail_at(p, p->pos, LOOM_ERR_CORRUPT, "expected a value, found the end of the text");
    switch (p->s[p->pos]) {
    case '{': ok = parse_container(p, v, depth, 1); break;
    case '[': ok = parse_container(p, v, depth, 0); break;
    case '"':
        v->type = LOOM_JSON_STRING;
        ok = parse_string(p, &v->text, &v->len);
        break;
    case 't': v->type = LOOM_JSON_BOOL; v->boolean = 1; ok = literal(p, "true", 4); break;
    case 'f': v->type = LOOM_JSON_BOOL; v->boolean = 0; ok = literal(p, "false", 5); break;
    case 'n': v->type = LOOM_JSON_NULL; ok = literal(p, "null", 4); break;
    default:
        if (p->s[p->pos] == '-' || (p->s[p->pos] >= '0' && p->s[p->pos] <= '9'))
            ok = parse_number(p, v);
        else
            ok = fail_at(p, p->pos, LOOM_ERR_CORRUPT, "unexpected %s (expected a value)", describe(p));
    }
    v->end = p->pos;
    return ok;
}

loom_status loom_json_parse(const char *text, size_t len, const loom_json_limits *lim,
                            loom_json_doc **out, loom_json_error *err)
{
    loom_json_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    *out = NULL;
    size_t max_bytes = lim && lim->max_bytes ? lim->max_bytes : DEFAULT_MAX_BYTES;
    parser p = {.s = text, .n = len, .max_depth = lim && lim->max_depth ? lim->max_depth : DEFAULT_MAX_DEPTH,
                .err = err, .st = LOOM_OK};
    if (len > max_bytes) {
        fail_at(&p, max_bytes, LOOM_ERR_CORRUPT, "text is %zu bytes, more than the limit of %zu", len,
                max_bytes);
        return loom_fail(p.st, "JSON error at byte %zu: %s", err->offset, err->msg);
    }
    p.doc = calloc(1, sizeof *p.doc);
    if (!p.doc)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory");
    skip_ws(&p);
    if (parse_value(&p, &p.doc->root, 0)) {
        skip_ws(&p);
        if (p.pos < p.n)
            fail_at(&p, p.pos, LOOM_ERR_CORRUPT, "unexpected %s after the value", describe(&p));
    }
    free(p.stack);
    if (p.st != LOOM_OK) {
        loom_json_free(p.doc);
        return loom_fail(p.st, "JSON error at byte %zu: %s", err->offset, err->msg);
    }
    *out = p.doc;
    return LOOM_OK;
}

const loom_json *loom_json_root(const loom_json_doc *d) { return &d->root; }

void loom_json_free(loom_json_doc *d)
{
    if (!d)
        return;
    for (chunk *c = d->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(d);
}

const loom_json *loom_json_get(const loom_json *obj, const char *key)
{
    if (!obj || obj->type != LOOM_JSON_OBJECT)
        return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < obj->count; i++)
        if (obj->items[i].key_len == n && memcmp(obj->items[i].key, key, n) == 0)
            return &obj->items[i];
    return NULL;
}

const loom_json *loom_json_get_type(const loom_json *obj, const char *key, loom_json_type t)
{
    const loom_json *v = loom_json_get(obj, key);
    return v && v->type == t ? v : NULL;
}

/* Magnitude of an integer literal (digits only after an optional '-'); 0 if not one. */
static int literal_magnitude(const loom_json *v, int *negative, uint64_t *mag)
{
    if (!v || v->type != LOOM_JSON_NUMBER)
        return 0;
    const char *s = v->text;
    *negative = *s == '-';
    s += *negative;
    uint64_t m = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        unsigned d = (unsigned)(*s - '0');
        if (m > (UINT64_MAX - d) / 10)
            return 0;
        m = m * 10 + d;
    }
    *mag = m;
    return 1;
}

int loom_json_uint64(const loom_json *v, uint64_t *out)
{
    int neg;
    uint64_t m;
    if (!literal_magnitude(v, &neg, &m) || (neg && m != 0))
        return 0;
    *out = m;
    return 1;
}

int loom_json_int64(const loom_json *v, int64_t *out)
{
    int neg;
    uint64_t m;
    if (!literal_magnitude(v, &neg, &m) || m > (uint64_t)INT64_MAX + (neg ? 1u : 0u))
        return 0;
    *out = neg ? (int64_t)(0 - m) : (int64_t)m;
    return 1;
}

const char *loom_json_type_name(loom_json_type t)
{
    static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
    return (unsigned)t < 6 ? names[t] : "?";
}
