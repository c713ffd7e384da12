/* json.h — a small strict JSON reader (RFC 8259) and the writing helpers that go with it.
 *
 * What: parse a whole text into a read-only tree (objects, arrays, strings with every
 * escape, numbers, true/false/null); look members up; read integers exactly from their
 * literal (a uint64 data position survives, which a double would not). Write: a growable
 * string buffer and string escaping.
 * What not: no streaming, no comments, no trailing commas, no NaN/Infinity, no leading
 * '+' or zeros, no duplicate object keys, no bytes after the value but whitespace, no
 * invalid UTF-8. Not a serializer of trees: writers emit text directly.
 * Invariants: the tree lives in one arena owned by the loom_json_doc (loom_json_free frees
 * all of it, nothing else to free); strings are decoded UTF-8 and NUL-terminated (a
 * "\u0000" inside is kept, len says the true length); every value records its byte span
 * [begin, end) in the source text; errors carry the byte offset where parsing stopped.
 */
#ifndef LOOM_CORE_JSON_H
#define LOOM_CORE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

typedef enum loom_json_type {
    LOOM_JSON_NULL = 0,
    LOOM_JSON_BOOL,
    LOOM_JSON_NUMBER,
    LOOM_JSON_STRING,
    LOOM_JSON_ARRAY,
    LOOM_JSON_OBJECT
} loom_json_type;

typedef struct loom_json loom_json;
struct loom_json {
    loom_json_type type;
    size_t begin, end;     /* byte span of the value in the source text */
    const char *key;       /* member name when this is an object member, else NULL */
    size_t key_len;
    int boolean;           /* BOOL */
    double number;         /* NUMBER (nearest double; use loom_json_int64 for exact) */
    const char *text;      /* STRING: decoded, NUL-terminated; NUMBER: the literal */
    size_t len;            /* bytes of text */
    const loom_json *items; /* ARRAY elements / OBJECT members, in source order */
    size_t count;
};

typedef struct loom_json_limits {
    size_t max_bytes;      /* refuse longer texts; 0: 64 MiB */
    int max_depth;         /* nesting of arrays/objects; 0: 64 */
} loom_json_limits;

typedef struct loom_json_error {
    size_t offset;         /* byte offset in the text where the error was found */
    char msg[160];         /* what was wrong there, e.g. "expected ':' after an object key" */
} loom_json_error;

typedef struct loom_json_doc loom_json_doc;

/* Parse text[0..len). On failure *out is NULL, err says where and what, and the status is
 * LOOM_ERR_CORRUPT (LOOM_ERR_NOMEM if memory ran out); loom_last_error() gets
 * "JSON error at byte N: msg" too. lim may be NULL (defaults). */
loom_status loom_json_parse(const char *text, size_t len, const loom_json_limits *lim,
                            loom_json_doc **out, loom_json_error *err);
const loom_json *loom_json_root(const loom_json_doc *d);
void loom_json_free(loom_json_doc *d); /* NULL is fine */

/* Member `key` of an object, or NULL (also NULL if obj is not an object). Linear. */
const loom_json *loom_json_get(const loom_json *obj, const char *key);
/* The member only if it has type t. */
const loom_json *loom_json_get_type(const loom_json *obj, const char *key, loom_json_type t);
/* Exact integer value of a NUMBER written without fraction or exponent; 0 if v is not one
 * or it does not fit. */
int loom_json_int64(const loom_json *v, int64_t *out);
int loom_json_uint64(const loom_json *v, uint64_t *out);
/* "null", "boolean", "number", "string", "array", "object" */
const char *loom_json_type_name(loom_json_type t);
/* Length of the valid UTF-8 sequence at s[0..n), 0 if invalid (overlongs, surrogates and
 * code points above U+10FFFF are invalid). */
size_t loom_utf8_len(const unsigned char *s, size_t n);

/* --- writing (json_write.c) --------------------------------------------------------- */

/* A growable NUL-terminated text. After an allocation failure or bad input, failed is set
 * and further appends do nothing: check it once at the end. */
typedef struct loom_strbuf {
    char *data;
    size_t len, cap;
    int failed;
} loom_strbuf;

void loom_strbuf_init(loom_strbuf *b);
void loom_strbuf_free(loom_strbuf *b);
void loom_strbuf_append(loom_strbuf *b, const char *s, size_t n);
void loom_strbuf_puts(loom_strbuf *b, const char *s);
void loom_strbuf_printf(loom_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string literal, quotes included. Invalid UTF-8 in s sets failed. */
void loom_json_write_string(loom_strbuf *b, const char *s);

#endif
