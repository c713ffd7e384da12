/* test_host.c — the loom_host services table plugins receive: version fields, fail()
 * feeding loom_last_error(), aligned zeroed alloc, rank/world, and the log prefix. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/plugin_loader.h"
#include "base/status.h"

START_TEST(host_identifies_itself)
{
    const loom_host *h = loom_core_host();
    ck_assert_uint_eq(h->size, sizeof(loom_host));
    ck_assert_int_eq(h->abi, LOOM_PLUGIN_ABI);
    ck_assert(h->log && h->fail && h->alloc && h->free);
    ck_assert_int_eq(h->rank, 0);
    ck_assert_int_eq(h->world, 1);
}
END_TEST

START_TEST(fail_sets_last_error)
{
    const loom_host *h = loom_core_host();
    loom_clear_error();
    ck_assert_int_eq((h->fail)(LOOM_ERR_INVALID, "lr must be > 0, got %g", -1.0), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "lr must be > 0, got -1");
}
END_TEST

START_TEST(alloc_is_aligned_and_zeroed)
{
    const loom_host *h = loom_core_host();
    size_t sizes[] = {0, 1, 63, 64, 65, 1000, 1 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        unsigned char *p = h->alloc(sizes[k]);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq((uintptr_t)p % 64, 0);
        size_t nonzero = 0;
        for (size_t i = 0; i < sizes[k]; i++)
            nonzero += p[i] != 0;
        ck_assert_uint_eq(nonzero, 0);
        h->free(p);
    }
    h->free(NULL);
    ck_assert_ptr_null(h->alloc(SIZE_MAX - 8)); /* fails cleanly, no wrap */
}
END_TEST

/* Run log() with stderr redirected to a temp file; return what it wrote. */
static const char *capture_log(loom_log_level level, const char *msg)
{
    static char out[512];
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    dup2(fileno(tmp), 2);
    loom_core_host()->log(level, "%s", msg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, sizeof out - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
    return out;
}

START_TEST(log_prefix_names_rank_only_when_several)
{
    unsetenv("LOOM_DEBUG");
    loom_core_host_set_rank(0, 1);
    ck_assert_str_eq(capture_log(LOOM_LOG_INFO, "hello"), "loom: hello\n");
    ck_assert_str_eq(capture_log(LOOM_LOG_WARN, "careful\n"), "loom: warning: careful\n");
    ck_assert_str_eq(capture_log(LOOM_LOG_DEBUG, "hidden"), "");
    loom_core_host_set_rank(3, 4);
    ck_assert_int_eq(loom_core_host()->rank, 3);
    ck_assert_int_eq(loom_core_host()->world, 4);
    ck_assert_str_eq(capture_log(LOOM_LOG_ERROR, "boom"), "loom[3]: error: boom\n");
    setenv("LOOM_DEBUG", "1", 1);
    ck_assert_str_eq(capture_log(LOOM_LOG_DEBUG, "shown"), "loom[3]: shown\n");
    unsetenv("LOOM_DEBUG");
    loom_core_host_set_rank(0, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("host");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, host_identifies_itself);
    tcase_add_test(tc, fail_sets_last_error);
    tcase_add_test(tc, alloc_is_aligned_and_zeroed);
    tcase_add_test(tc, log_prefix_names_rank_only_when_several);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
