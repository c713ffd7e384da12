/* test_safetensors.c — the XXH64 checksum (published vectors, streaming splits), and the
 * safetensors writer and strict reader: a round trip with
 * metadata, F32 and BF16, the exact refusal messages for each kind of malformed header,
 * and a fuzz of every header byte (flip and truncate) that must never crash — the reader
 * is exercised without the checkpoint's checksums in front of it. Also run under
 * AddressSanitizer + UBSan (unit_safetensors_asan). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "io/checksum.h"
#include "io/safetensors.h"

static char path[256];

static unsigned char *slurp(size_t *n)
{
    unsigned char *b;
    ck_assert_msg(loom_ckpt_read_file(path, 1 << 30, &b, n) == LOOM_OK, "%s", loom_last_error());
    return b;
}

START_TEST(test_round_trip)
{
    float w[6] = {1, -2, 3.5f, 0, 1e-30f, -7};
    uint16_t h[4] = {0x3f80, 0xc000, 0x0000, 0x7f80}; /* bf16 1, -2, 0, inf */
    float scalar = 42;
    int64_t s_w[2] = {2, 3}, s_h[1] = {4};
    loom_st_tensor t[3] = {{"w", LOOM_DTYPE_F32, 2, s_w, w}, {"h", LOOM_DTYPE_BF16, 1, s_h, h},
                           {"scalar", LOOM_DTYPE_F32, 0, NULL, &scalar}};
    loom_st_meta m[2] = {{"format", "pt"}, {"w", "{\"shape\":[2,3]}"}};
    uint64_t bytes, sum;
    ck_assert_int_eq(loom_safetensors_write(path, t, 3, m, 2, &bytes, &sum), LOOM_OK);
    size_t n;
    unsigned char *b = slurp(&n);
    ck_assert_uint_eq(n, bytes);
    ck_assert_uint_eq(loom_xxh64(b, n), sum);
    ck_assert_uint_eq((8 + (b[0] | b[1] << 8)) % 8, 0); /* header padded to 8 */
    loom_st_file *f;
    ck_assert_msg(loom_safetensors_parse("test", path, b, n, &f) == LOOM_OK, "%s", loom_last_error());
    ck_assert_int_eq(loom_safetensors_count(f), 3);
    ck_assert_str_eq(loom_safetensors_entry(f, 0)->name, "w");
    const loom_st_entry *e = loom_safetensors_find(f, "h");
    ck_assert_str_eq(e->dtype, "BF16");
    ck_assert_uint_eq(e->end - e->begin, 8);
    ck_assert_ptr_null(loom_safetensors_find(f, "nope"));
    ck_assert_str_eq(loom_safetensors_meta(f, "w"), "{\"shape\":[2,3]}");
    float out[6];
    ck_assert_int_eq(loom_safetensors_copy_f32(f, loom_safetensors_find(f, "w"), out, 6), LOOM_OK);
    ck_assert(memcmp(out, w, sizeof w) == 0);
    ck_assert_int_eq(loom_safetensors_copy_f32(f, e, out, 4), LOOM_OK);
    ck_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.0f && out[3] > 1e38f);
    e = loom_safetensors_find(f, "scalar");
    ck_assert_int_eq(e->ndim, 0);
    ck_assert_int_eq(loom_safetensors_copy_f32(f, e, out, 1), LOOM_OK);
    ck_assert(out[0] == 42.0f);
    ck_assert_int_eq(loom_safetensors_copy_f32(f, e, out, 2), LOOM_ERR_INVALID);
    loom_safetensors_free(f);
    free(b);
}
END_TEST

START_TEST(test_xxh64)
{
    /* the published XXH64 vectors, seed 0 */
    ck_assert_uint_eq(loom_xxh64("", 0), 0xEF46DB3751D8E999ull);
    ck_assert_uint_eq(loom_xxh64("a", 1), 0xD24EC4F1A98C6E5Bull);
    ck_assert_uint_eq(loom_xxh64("abc", 3), 0x44BC2CF5AD770999ull);
    ck_assert_uint_eq(loom_xxh64("hello", 5), 0x26C7827D889F6DA3ull);
    /* streaming in any split equals one shot, across the 32-byte stripe and the tails */
    unsigned char buf[300];
    for (int i = 0; i < 300; i++)
        buf[i] = (unsigned char)(i * 7 + 3);
    for (size_t n = 0; n <= 300; n += 13)
        for (size_t cut = 0; cut <= n; cut += 5) {
            loom_xxh64_state s;
            loom_xxh64_init(&s);
            loom_xxh64_update(&s, buf, cut);
            loom_xxh64_update(&s, buf + cut, 0);
            loom_xxh64_update(&s, buf + cut, n - cut);
            ck_assert_uint_eq(loom_xxh64_digest(&s), loom_xxh64(buf, n));
        }
}
END_TEST

/* Parse "<8-byte len><header><data_len bytes>" and return the status and message. */
static loom_status try_header(const char *header, size_t data_len, uint64_t fake_len)
{
    size_t hl = strlen(header), n = 8 + hl + data_len;
    unsigned char *b = calloc(1, n);
    uint64_t len = fake_len ? fake_len : hl;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(len >> (8 * i));
    memcpy(b + 8, header, hl);
    loom_st_file *f = NULL;
    loom_status st = loom_safetensors_parse("checkpoint", "ckpt/step_00000020/model.safetensors", b, n, &f);
    loom_safetensors_free(f);
    free(b);
    return st;
}

#define T1(dt, shape, a, b) "{\"h.0.ln_1.weight\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #a "," #b "]}}"

static const struct { const char *header; size_t data; uint64_t fake; const char *msg; } bad[] = {
    {T1("F32", "[256]", 1024, 2048), 1500, 0,
     "checkpoint 'ckpt/step_00000020/model.safetensors': tensor 'h.0.ln_1.weight' data_offsets "
     "[1024, 2048] run past the end of the file (1500 bytes of data)"},
    {"{}", 0, (uint64_t)200 << 20, "header length 209715200 is over the limit of 104857600 bytes"},
    {"{}", 0, 3, "header length 3 runs past the end of the file (10 bytes)"},
    {"{\"a\":", 0, 0, "header is not valid JSON at byte 13 of the file: expected a value"},
    {"[]", 0, 0, "header is a JSON array (an object expected)"},
    {T1("Q4", "[4]", 0, 16), 16, 0, "dtype 'Q4' is unknown"},
    {T1("F32", "[4]", 0, 12), 12, 0, "of 4 F32 values needs 16 bytes but data_offsets [0, 12] span 12"},
    {T1("F32", "[-4]", 0, 16), 16, 0, "shape[0] is not an integer >= 0"},
    {T1("F32", "[4]", 8, 4), 16, 0, "data_offsets [8, 4] end before they begin"},
    {T1("F32", "[4]", 0, 16), 20, 0, "the data section is 20 bytes but the tensors cover 16 (trailing bytes)"},
    {T1("F32", "[4]", 4, 20), 20, 0, "bytes [0, 4) of the data section belong to no tensor"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0, "overlap the tensor before it"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, 0,
     "unknown member 'x'"},
    {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, 0, "tensor 'a' has no shape array"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, 0, "not a pair of integers"},
    {"{\"__metadata__\":{\"k\":1}}", 0, 0, "__metadata__ key 'k' is a JSON number"},
    {"{\"__metadata__\":[]}", 0, 0, "__metadata__ is a JSON array"},
    {"{\"a\":[]}", 0, 0, "tensor 'a' is a JSON array"},
    {"{\"\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0, "a tensor name is empty"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, 0,
     "shape overflows 64 bits"},
};

START_TEST(test_refusals)
{
    ck_assert_int_eq(loom_safetensors_parse("checkpoint", "x", (const unsigned char *)"abc", 3,
                                            &(loom_st_file *){NULL}), LOOM_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "the file is 3 bytes, too short"));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(try_header(bad[i].header, bad[i].data, bad[i].fake), LOOM_ERR_CORRUPT);
        ck_assert_msg(strstr(loom_last_error(), bad[i].msg), "case %zu: '%s' lacks '%s'", i,
                      loom_last_error(), bad[i].msg);
        ck_assert_ptr_nonnull(strstr(loom_last_error(), "ckpt/step_00000020/model.safetensors"));
    }
    if (getenv("LOOM_TEST_VERBOSE"))
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
            try_header(bad[i].header, bad[i].data, bad[i].fake), printf("%s\n", loom_last_error());
    /* other dtypes are recognised, but not loaded */
    int64_t s[1] = {2};
    int32_t v[2] = {1, 2};
    loom_st_tensor t = {"i", LOOM_DTYPE_I32, 1, s, v};
    uint64_t bytes, sum;
    ck_assert_int_eq(loom_safetensors_write(path, &t, 1, NULL, 0, &bytes, &sum), LOOM_OK);
    size_t n;
    unsigned char *b = slurp(&n);
    loom_st_file *f;
    ck_assert_int_eq(loom_safetensors_parse("test", path, b, n, &f), LOOM_OK);
    float out[2];
    ck_assert_int_eq(loom_safetensors_copy_f32(f, loom_safetensors_entry(f, 0), out, 2), LOOM_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "tensor 'i' is I32; loom loads F32 or BF16"));
    loom_safetensors_free(f);
    free(b);
}
END_TEST

START_TEST(test_header_fuzz)
{
    float w[64];
    for (int i = 0; i < 64; i++)
        w[i] = (float)i;
    int64_t s1[2] = {4, 8}, s2[1] = {32};
    loom_st_tensor t[2] = {{"h.0.attn.qkv.weight", LOOM_DTYPE_F32, 2, s1, w},
                           {"h.0.attn.qkv.bias", LOOM_DTYPE_F32, 1, s2, w + 32}};
    loom_st_meta m[1] = {{"h.0.attn.qkv.weight", "{\"shape\":[4,8],\"slice_start\":[0,0]}"}};
    uint64_t bytes, sum;
    ck_assert_int_eq(loom_safetensors_write(path, t, 2, m, 1, &bytes, &sum), LOOM_OK);
    size_t n;
    unsigned char *orig = slurp(&n);
    size_t header_end = 8 + (orig[0] | orig[1] << 8);
    int ok = 0, refused = 0;
    for (size_t pos = 0; pos < n; pos += pos < header_end ? 1 : 37) {
        for (int k = 0; k < 3; k++) {
            /* k = 0: flip a bit, 1: set 0xff, 2: truncate here (in an exact-size copy) */
            size_t len = k == 2 ? pos : n;
            unsigned char *b = malloc(len ? len : 1);
            memcpy(b, orig, len);
            if (k == 0)
                b[pos] ^= (unsigned char)(1u << (pos % 8));
            else if (k == 1)
                b[pos] = 0xff;
            loom_st_file *f = NULL;
            loom_status st = loom_safetensors_parse("test", path, b, len, &f);
            ck_assert(st == LOOM_OK || st == LOOM_ERR_CORRUPT);
            if (st == LOOM_OK) { /* then it must be safe to read every tensor */
                float out[64];
                for (int i = 0; i < loom_safetensors_count(f); i++) {
                    const loom_st_entry *e = loom_safetensors_entry(f, i);
                    ck_assert(e->end <= len);
                    if (e->numel <= 64)
                        loom_safetensors_copy_f32(f, e, out, (size_t)e->numel);
                }
            }
            ok += st == LOOM_OK;
            refused += st != LOOM_OK;
            loom_safetensors_free(f);
            free(b);
        }
    }
    printf("safetensors header fuzz: %d refused, %d still valid (data bytes or harmless spaces)\n",
           refused, ok);
    ck_assert_int_gt(refused, 3 * (int)header_end / 2);
    free(orig);
}
END_TEST

int main(void)
{
    snprintf(path, sizeof path, "/tmp/loom-test-st-%ld.safetensors", (long)getpid());
    Suite *su = suite_create("safetensors");
    TCase *tc = tcase_create("safetensors");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_xxh64);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_header_fuzz);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    unlink(path);
    return failed ? 1 : 0;
}
