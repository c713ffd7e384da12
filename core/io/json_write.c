/* json_write.c — the writing half of json.h: a growable string buffer and JSON string
 * escaping. Writers emit JSON text directly (no tree to serialize).
 *
 * What not: no number formatting policy (callers printf what they need: %.9g for floats,
 * integers exactly). Invariants: the buffer is always NUL-terminated once it holds
 * anything; after a failure (memory, invalid UTF-8) it keeps `failed` and ignores appends.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

void loom_strbuf_init(loom_strbuf *b) { memset(b, 0, sizeof *b); }

void loom_strbuf_free(loom_strbuf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static int reserve(loom_strbuf *b, size_t extra)
{
    if (b->failed)
        return 0;
    if (b->len + extra + 1 <= b->cap)
        return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = 1;
        return 0;
    }
    b->data = d;
    b->cap = cap;
    return 1;
}

void loom_strbuf_append(loom_strbuf *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void loom_strbuf_puts(loom_strbuf *b, const char *s) { loom_strbuf_append(b, s, strlen(s)); }

void loom_strbuf_printf(loom_strbuf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n >= 0 && reserve(b, (size_t)n)) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    } else if (n < 0) {
        b->failed = 1;
    }
    va_end(ap2);
}

void loom_json_write_string(loom_strbuf *b, const char *s)
{
    size_t n = strlen(s);
    loom_strbuf_append(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            loom_strbuf_append(b, e, 2);
            i++;
        } else if (c < 0x20) {
            if (c == '\n')
                loom_strbuf_append(b, "\\n", 2);
            else if (c == '\t')
                loom_strbuf_append(b, "\\t", 2);
            else
                loom_strbuf_printf(b, "\\u%04x", c);
            i++;
        } else {
            size_t l = loom_utf8_len((const unsigned char *)s + i, n - i);
            if (!l) {
                b->failed = 1;
                return;
            }
            loom_strbuf_append(b, s + i, l);
            i += l;
        }
    }
    loom_strbuf_append(b, "\"", 1);
}
