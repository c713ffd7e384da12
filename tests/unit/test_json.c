/* test_json.c — the strict JSON reader and the string writer: values and escapes, exact
 * 64-bit integers, every refusal with its byte offset, limits, and a mutation fuzz that
 * must never crash (also run under AddressSanitizer + UBSan as unit_json_asan). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

static loom_json_doc *parse_ok(const char *text)
{
    loom_json_doc *d = NULL;
    loom_json_error err;
    ck_assert_msg(loom_json_parse(text, strlen(text), NULL, &d, &err) == LOOM_OK, "'%s': %s at %zu",
                  text, err.msg, err.offset);
    return d;
}

START_TEST(test_values)
{
    const char *text = " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\n\\\"\\u00e9\\ud83d\\ude00\\/\","
                       " \"n\": {}, \"e\": [], \"z\": \"nul\\u0000in\"} ";
    loom_json_doc *d = parse_ok(text);
    const loom_json *r = loom_json_root(d), *a = loom_json_get(r, "a");
    ck_assert_int_eq(r->type, LOOM_JSON_OBJECT);
    ck_assert_uint_eq(r->count, 5);
    ck_assert_uint_eq(r->begin, 1);
    ck_assert_uint_eq(r->end, strlen(text) - 1);
    ck_assert_uint_eq(a->count, 5);
    ck_assert_double_eq(a->items[1].number, -2500.0);
    ck_assert(a->items[2].type == LOOM_JSON_BOOL && a->items[2].boolean);
    ck_assert(a->items[3].type == LOOM_JSON_BOOL && !a->items[3].boolean);
    ck_assert_int_eq(a->items[4].type, LOOM_JSON_NULL);
    const loom_json *s = loom_json_get_type(r, "s", LOOM_JSON_STRING);
    ck_assert_str_eq(s->text, "x\n\"\xc3\xa9\xf0\x9f\x98\x80/");
    ck_assert_uint_eq(loom_json_get(r, "z")->len, 6);
    ck_assert_uint_eq(loom_json_get(r, "n")->count, 0);
    ck_assert_ptr_null(loom_json_get(r, "missing"));
    ck_assert_ptr_null(loom_json_get_type(r, "a", LOOM_JSON_OBJECT));
    loom_json_free(d);
}
END_TEST

START_TEST(test_exact_integers)
{
    loom_json_doc *d = parse_ok("[18446744073709551615, 18446744073709551616, -9223372036854775808, "
                                "9223372036854775808, 1.0, 1e3, -0, 0]");
    const loom_json *r = loom_json_root(d);
    uint64_t u;
    int64_t i;
    ck_assert(loom_json_uint64(&r->items[0], &u) && u == UINT64_MAX);
    ck_assert(!loom_json_uint64(&r->items[1], &u));
    ck_assert(loom_json_int64(&r->items[2], &i) && i == INT64_MIN);
    ck_assert(!loom_json_uint64(&r->items[2], &u));
    ck_assert(!loom_json_int64(&r->items[3], &i));
    ck_assert(!loom_json_int64(&r->items[4], &i));
    ck_assert(!loom_json_int64(&r->items[5], &i));
    ck_assert(loom_json_int64(&r->items[6], &i) && i == 0);
    ck_assert(loom_json_uint64(&r->items[6], &u) && u == 0);
    ck_assert(loom_json_uint64(&r->items[7], &u) && u == 0);
    loom_json_free(d);
}
END_TEST

static const struct { const char *text; size_t offset; const char *msg; } refusals[] = {
    {"", 0, "expected a value"},
    {"[1,]", 3, "unexpected ']'"},
    {"{\"a\":1,}", 7, "expected a string key"},
    {"{\"a\":1,\"a\":2}", 11, "duplicate object key \"a\""}, /* at its value */
    {"01", 0, "leading zero"},
    {"[1] x", 4, "after the value"},
    {"-", 1, "expected a digit"},
    {"1.", 2, "after '.'"},
    {".5", 0, "unexpected '.'"},
    {"+1", 0, "unexpected '+'"},
    {"1e", 2, "exponent"},
    {"NaN", 0, "unexpected 'N'"},
    {"tru", 0, "unexpected 't'"},
    {"\"a\x01\"", 2, "control byte 0x01"},
    {"\"\\ud800\"", 1, "high surrogate"},
    {"\"\\udc00\"", 1, "lone low surrogate"},
    {"\"\\x\"", 1, "unknown escape"},
    {"\"\\u12g4\"", 5, "4 hex digits"},
    {"\"\xc3\x28\"", 1, "invalid UTF-8"},
    {"\"\xed\xa0\x80\"", 1, "invalid UTF-8"},   /* an encoded surrogate */
    {"\"\xc0\xaf\"", 1, "invalid UTF-8"},       /* overlong '/' */
    {"\"abc", 0, "never closed"},
    {"{\"a\" 1}", 5, "expected ':'"},
    {"[1 2]", 3, "expected ',' or ']'"},
};

START_TEST(test_refusals)
{
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        loom_json_doc *d = (loom_json_doc *)1;
        loom_json_error err;
        const char *t = refusals[i].text;
        ck_assert_int_eq(loom_json_parse(t, strlen(t), NULL, &d, &err), LOOM_ERR_CORRUPT);
        ck_assert_ptr_null(d);
        ck_assert_msg(strstr(err.msg, refusals[i].msg) && err.offset == refusals[i].offset,
                      "'%s': got '%s' at %zu, want '%s' at %zu", t, err.msg, err.offset,
                      refusals[i].msg, refusals[i].offset);
        ck_assert_ptr_nonnull(strstr(loom_last_error(), "JSON error at byte"));
    }
}
END_TEST

START_TEST(test_limits)
{
    char deep[200];
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    deep[130] = '\0';
    loom_json_doc *d;
    loom_json_error err;
    ck_assert_int_eq(loom_json_parse(deep, strlen(deep), NULL, &d, &err), LOOM_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err.msg, "nesting deeper than 64"));
    ck_assert_uint_eq(err.offset, 64);
    loom_json_limits lim = {4, 0};
    ck_assert_int_eq(loom_json_parse("[1, 2]", 6, &lim, &d, &err), LOOM_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err.msg, "more than the limit of 4"));
    memset(deep, '[', 64); /* 64 deep: fine */
    memset(deep + 64, ']', 64);
    deep[128] = '\0';
    loom_json_free(parse_ok(deep));
    /* a big flat object: duplicate detection must stay fast */
    size_t n = 20000, cap = n * 24;
    char *big = malloc(cap);
    size_t at = (size_t)snprintf(big, cap, "{");
    for (size_t i = 0; i < n; i++)
        at += (size_t)snprintf(big + at, cap - at, "%s\"k%zu\":%zu", i ? "," : "", i, i);
    snprintf(big + at, cap - at, "}");
    d = parse_ok(big);
    ck_assert_uint_eq(loom_json_root(d)->count, n);
    loom_json_free(d);
    free(big);
}
END_TEST

START_TEST(test_writer)
{
    loom_strbuf b;
    loom_strbuf_init(&b);
    loom_json_write_string(&b, "a\"b\\c\n\t\x01\xc3\xa9");
    ck_assert(!b.failed);
    ck_assert_str_eq(b.data, "\"a\\\"b\\\\c\\n\\t\\u0001\xc3\xa9\"");
    loom_json_doc *d = parse_ok(b.data);
    ck_assert_str_eq(loom_json_root(d)->text, "a\"b\\c\n\t\x01\xc3\xa9");
    loom_json_free(d);
    loom_strbuf_printf(&b, " %d", 42);
    ck_assert_str_eq(b.data + b.len - 3, " 42");
    loom_json_write_string(&b, "\xff");
    ck_assert(b.failed);
    loom_strbuf_free(&b);
}
END_TEST

START_TEST(test_mutation_fuzz)
{
    const char *seed = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                       "\"data_offsets\":[0,24]},\"s\":\"\\u00e9\\n\",\"x\":[true,false,null,-1.5e-3]}";
    size_t n = strlen(seed);
    char *buf = malloc(n + 1);
    unsigned rng = 12345;
    int ok = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, seed, n + 1);
        int edits = 1 + it % 3;
        for (int e = 0; e < edits; e++) {
            rng = rng * 1103515245u + 12345u;
            size_t pos = (rng >> 8) % n;
            rng = rng * 1103515245u + 12345u;
            buf[pos] = (char)(rng >> 16);
        }
        rng = rng * 1103515245u + 12345u;
        size_t len = it % 5 == 0 ? (rng >> 8) % (n + 1) : n; /* sometimes truncated too */
        loom_json_doc *d;
        loom_json_error err;
        loom_status st = loom_json_parse(buf, len, NULL, &d, &err);
        ck_assert(st == LOOM_OK || st == LOOM_ERR_CORRUPT);
        ck_assert(st != LOOM_ERR_CORRUPT || err.offset <= len);
        ok += st == LOOM_OK;
        loom_json_free(st == LOOM_OK ? d : NULL);
    }
    printf("json mutation fuzz: %d of 20000 mutants still valid\n", ok);
    free(buf);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("json");
    TCase *tc = tcase_create("json");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_values);
    tcase_add_test(tc, test_exact_integers);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_writer);
    tcase_add_test(tc, test_mutation_fuzz);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
