/* test_params.c — the parameter table: offsets aligned and disjoint, lookup by name,
 * initial values keyed by logical index (a slice draws the same values as the whole). */
#include <check.h>
#include <math.h>
#include <stdlib.h>

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

int main(void)
{
    Suite *s = suite_create("params");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_layout);
    tcase_add_test(tc, test_init_keyed_by_logical_index);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
