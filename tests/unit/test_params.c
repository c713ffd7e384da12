/* test_params.c — the parameter table: offsets aligned and disjoint, lookup by name,
 * initial values keyed by logical index (a slice draws the same values as the whole). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/params.h"

START_TEST(test_layout)
{
    loom_param_table t = {0};
    int64_t a[2] = {5, 3}, b[1] = {7};
    ck_assert_int_eq(loom_params_add(&t, "a", 2, a, 0, LOOM_INIT_NORMAL, 0.02f), LOOM_OK);
    ck_assert_int_eq(loom_params_add(&t, "b", 1, b, 0, LOOM_INIT_ONES, 0), LOOM_OK);
    ck_assert_uint_eq(t.entries[0].offset, 0);
    ck_assert_uint_eq(t.entries[1].offset % 16, 0);
    ck_assert_uint_ge(t.entries[1].offset, 15);
    ck_assert_uint_eq(loom_params_count(&t), 22);
    ck_assert_ptr_eq(loom_params_find(&t, "b"), &t.entries[1]);
    ck_assert_ptr_null(loom_params_find(&t, "c"));
    ck_assert_int_eq(t.entries[0].is_matrix, 1);
    ck_assert_int_eq(t.entries[1].is_matrix, 0);
    int64_t bad[5] = {1, 1, 1, 1, 1};
    ck_assert_int_eq(loom_params_add(&t, "bad", 5, bad, 0, LOOM_INIT_ZEROS, 0), LOOM_ERR_INVALID);
    loom_params_free(&t);
}
END_TEST

START_TEST(test_init_keyed_by_logical_index)
{
    loom_param_table whole = {0}, slice = {0};
    int64_t s[2] = {8, 4};
    loom_params_add(&whole, "w", 2, s, 0, LOOM_INIT_NORMAL, 1.0f);
    loom_params_add(&slice, "w", 2, s, 0, LOOM_INIT_NORMAL, 1.0f);
    /* this "rank" holds rows 4..7 only */
    slice.entries[0].slice_start[0] = 4;
    slice.entries[0].slice_len[0] = 4;
    slice.entries[0].numel = 16;
    slice.total = 16;
    float *a = malloc(whole.total * sizeof(float)), *b = malloc(whole.total * sizeof(float));
    loom_params_init_values(&whole, 42, a);
    loom_params_init_values(&slice, 42, b);
    for (int i = 0; i < 16; i++)
        ck_assert_float_eq(a[16 + i], b[i]);
    double mean = 0;
    for (int i = 0; i < 32; i++)
        mean += a[i];
    ck_assert(fabs(mean / 32) < 0.6);
    loom_params_init_values(&whole, 43, b);
    ck_assert_float_ne(a[0], b[0]);
    free(a);
    free(b);
    loom_params_free(&whole);
    loom_params_free(&slice);
}
END_TEST

/* Any range of the flat buffer drawn alone gives the whole draw's bits (ZeRO-3's
 * partitioned construction), padding and the buffer's end included. */
START_TEST(test_init_range_matches_whole)
{
    loom_param_table t = {0};
    int64_t s1[2] = {5, 7}, s2[1] = {9}, s3[2] = {6, 3};
    loom_params_add(&t, "a", 2, s1, 0, LOOM_INIT_NORMAL, 0.02f);
    loom_params_add(&t, "b", 1, s2, 0, LOOM_INIT_ONES, 0);
    loom_params_add(&t, "c", 2, s3, 1, LOOM_INIT_NORMAL, 1.0f);
    t.entries[2].init_rows = 4;
    size_t n = t.total;
    float *whole = malloc(n * sizeof(float)), *part = malloc((n + 8) * sizeof(float));
    loom_params_init_values(&t, 7, whole);
    size_t cuts[][2] = {{0, n}, {3, 40}, {35, 36}, {17, n + 8}, {60, 61}, {20, 20}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        memset(part, 0x7f, (n + 8) * sizeof(float));
        loom_params_init_range(&t, 7, cuts[c][0], cuts[c][1], part);
        for (size_t i = cuts[c][0]; i < cuts[c][1]; i++)
            ck_assert_msg(memcmp(&part[i - cuts[c][0]], i < n ? &whole[i] : &(float){0.0f},
                                 sizeof(float)) == 0, "cut %zu element %zu", c, i);
        ck_assert(cuts[c][1] > cuts[c][0] || memcmp(part, &(int){0x7f7f7f7f}, 4) == 0);
    }
    free(whole);
    free(part);
    loom_params_free(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("params");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_layout);
    tcase_add_test(tc, test_init_keyed_by_logical_index);
    tcase_add_test(tc, test_init_range_matches_whole);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
