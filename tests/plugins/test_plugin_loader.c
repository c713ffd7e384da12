/* test_plugin_loader.c — the plugin loader: exact refusal lines for broken plugins, the
 * search order (LOOM_PLUGIN_PATH, install dir, build tree; never the CWD implicitly), the
 * not-found message, caching, and scan's shadowing report.
 *
 * Each case runs in its own forked child (Check's default), but still restores the CWD
 * and LOOM_PLUGIN_PATH so CK_FORK=no runs stay meaningful.
 */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/plugin/optim.h"
#include "base/plugin_loader.h"
#include "plugin_test_util.h"
#include "base/status.h"

#define BROKEN LOOM_TEST_BROKEN_DIR
#define ELSEWHERE LOOM_TEST_ELSEWHERE_DIR

/* ---- helpers --------------------------------------------------------------------- */

static char tmpdir[PATH_MAX];

static void make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/loom-loader-XXXXXX", base && *base ? base : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

/* Copy the build tree's loom-<kind>-<name>.so into tmpdir; returns the copy's path. */
static const char *copy_to_tmp(const char *from, const char *file)
{
    static char to[PATH_MAX];
    ck_assert_int_lt(snprintf(to, sizeof to, "%s/%s", tmpdir, file), sizeof to);
    ck_assert_msg(test_copy_file(from, to) == 0, "cannot copy %s to %s", from, to);
    return to;
}

static void remove_tmpdir(const char *const *files)
{
    char path[PATH_MAX];
    for (; files && *files; files++) {
        if (snprintf(path, sizeof path, "%s/%s", tmpdir, *files) < (int)sizeof path)
            unlink(path);
    }
    rmdir(tmpdir);
}

static void setup(void) { unsetenv("LOOM_PLUGIN_PATH"); }

/* Open a fixture, expect a refusal, compare the line exactly, and check the file was
 * dlclose'd (RTLD_NOLOAD finds no trace of it). */
static void expect_refusal(const char *file, const char *why)
{
    char path[PATH_MAX], expected[2 * PATH_MAX];
    ck_assert_int_lt(snprintf(path, sizeof path, "%s/%s", BROKEN, file), sizeof path);
    ck_assert_int_lt(snprintf(expected, sizeof expected, "plugin '%s' rejected: %s", path, why),
                     sizeof expected);
    const loom_plugin *p = (const loom_plugin *)0x1;
    ck_assert_int_eq(loom_plugin_open(path, &p), LOOM_ERR_PLUGIN);
    ck_assert_str_eq(loom_last_error(), expected);
    ck_assert_ptr_eq(p, (const loom_plugin *)0x1); /* *out untouched on failure */
    ck_assert_msg(dlopen(path, RTLD_NOW | RTLD_NOLOAD) == NULL, "%s was not dlclose'd", path);
}

/* ---- refusals: one exact line each ----------------------------------------------- */

START_TEST(refuses_wrong_abi)
{
    char why[256];
    snprintf(why, sizeof why,
             "built for plugin ABI %d, this loom provides ABI %d; rebuild it against this "
             "loom's headers", LOOM_PLUGIN_ABI + 1, LOOM_PLUGIN_ABI);
    expect_refusal("loom-optim-wrongabi.so", why);
}
END_TEST

START_TEST(refuses_missing_entry)
{
    expect_refusal("loom-optim-noentry.so",
                   "no symbol 'loom_plugin_entry' (not a loom plugin, or built without "
                   "LOOM_PLUGIN_EXPORT)");
}
END_TEST

START_TEST(refuses_null_descriptor)
{
    expect_refusal("loom-optim-nulldesc.so",
                   "loom_plugin_entry returned NULL, expected a descriptor; the plugin is "
                   "broken, report it to its author");
}
END_TEST

START_TEST(refuses_name_mismatch)
{
    expect_refusal("loom-optim-mismatch.so",
                   "file name says optim 'mismatch' but the descriptor says precision 'fp32'; "
                   "rename the file or fix the descriptor");
}
END_TEST

START_TEST(refuses_unknown_kind)
{
    expect_refusal("loom-optim-unknownkind.so",
                   "descriptor says kind 42, expected one of comm, strategy, optim, precision, "
                   "sched, backend; rebuild it against this loom's headers");
}
END_TEST

START_TEST(refuses_null_ops)
{
    expect_refusal("loom-optim-nullops.so",
                   "descriptor has no ops table (ops is NULL), expected a loom_optim_ops; fix "
                   "the plugin's descriptor");
}
END_TEST

START_TEST(refuses_short_ops)
{
    char why[256];
    snprintf(why, sizeof why,
             "loom_optim_ops is %zu bytes, this loom needs at least %zu; rebuild it against "
             "this loom's headers", sizeof(size_t) + 2 * sizeof(void *),
             offsetof(loom_optim_ops, step) + sizeof(void *)); /* step_backend may be absent */
    expect_refusal("loom-optim-smallops.so", why);
}
END_TEST

START_TEST(refuses_short_descriptor)
{
    char why[256];
    snprintf(why, sizeof why,
             "descriptor is 12 bytes, this loom needs at least %zu; rebuild it against this "
             "loom's headers", sizeof(loom_plugin_desc));
    expect_refusal("loom-optim-smalldesc.so", why);
}
END_TEST

START_TEST(refuses_unnamed_config_key)
{
    expect_refusal("loom-optim-badkey.so",
                   "config key 1 is '(null)' of type 1, expected a name and a loom_cfg_type; "
                   "fix the plugin's key table");
}
END_TEST

START_TEST(refuses_non_elf_file)
{
    /* glibc's reason; the path dlerror repeats is trimmed from the line. */
    expect_refusal("loom-optim-garbage.so",
                   "expected a loadable shared object, dlopen says: invalid ELF header; check "
                   "that it was built for this machine and that the libraries it needs are "
                   "installed");
}
END_TEST

START_TEST(refuses_bad_file_name)
{
    /* Checked before dlopen: the file need not even exist. */
    expect_refusal("libsgd.so",
                   "file name 'libsgd.so' does not follow loom-<kind>-<name>.so with kind one "
                   "of comm, strategy, optim, precision, sched, backend; rename the file");
    expect_refusal("loom-frob-x.so",
                   "file name 'loom-frob-x.so' does not follow loom-<kind>-<name>.so with kind "
                   "one of comm, strategy, optim, precision, sched, backend; rename the file");
}
END_TEST

START_TEST(load_reports_refusal_without_fallback)
{
    /* wrongabi exists only in BROKEN; the refusal is reported, not "not found". */
    setenv("LOOM_PLUGIN_PATH", BROKEN, 1);
    const loom_plugin *p = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "wrongabi", &p), LOOM_ERR_PLUGIN);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "loom-optim-wrongabi.so' rejected: built for"));
    unsetenv("LOOM_PLUGIN_PATH");
}
END_TEST

/* ---- search order ---------------------------------------------------------------- */

START_TEST(search_dirs_in_order_skipping_empty_elements)
{
    setenv("LOOM_PLUGIN_PATH", ":/nonexistent/a::/nonexistent/b/:", 1);
    const char *dirs[64];
    int n = loom_plugin_search_dirs(dirs, 64);
    char build[32][1024];
    int nb = test_build_plugin_dirs(build, 32);
    ck_assert_int_eq(n, 3 + nb);
    ck_assert_str_eq(dirs[0], "/nonexistent/a");
    ck_assert_str_eq(dirs[1], "/nonexistent/b"); /* trailing slash dropped */
    ck_assert_str_eq(dirs[2], LOOM_TEST_INSTALL_PLUGIN_DIR);
    for (int i = 0; i < nb; i++)
        ck_assert_str_eq(dirs[3 + i], build[i]);
    unsetenv("LOOM_PLUGIN_PATH");
    ck_assert_int_eq(loom_plugin_search_dirs(dirs, 64), 1 + nb);
    ck_assert_str_eq(dirs[0], LOOM_TEST_INSTALL_PLUGIN_DIR);
}
END_TEST

START_TEST(plugin_path_wins_over_build_tree)
{
    const char *built = test_build_plugin_path("optim", "sgd");
    ck_assert_ptr_nonnull(built);
    char built_copy[PATH_MAX];
    snprintf(built_copy, sizeof built_copy, "%s", built);
    make_tmpdir();
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", copy_to_tmp(built_copy, "loom-optim-sgd.so"));

    setenv("LOOM_PLUGIN_PATH", tmpdir, 1);
    const loom_plugin *p = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "sgd", &p), LOOM_OK);
    ck_assert_str_eq(p->path, copy);
    ck_assert_str_eq(p->desc->name, "sgd");

    unsetenv("LOOM_PLUGIN_PATH");
    const loom_plugin *q = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "sgd", &q), LOOM_OK);
    ck_assert_str_eq(q->path, built_copy);
    remove_tmpdir((const char *const[]){"loom-optim-sgd.so", NULL});
}
END_TEST

static void expect_not_found_elsewhere(void)
{
    const loom_plugin *p = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "elsewhere", &p), LOOM_ERR_PLUGIN);
    ck_assert_msg(strncmp(loom_last_error(), "no optim plugin 'elsewhere' (searched: ", 39) == 0,
                  "got: %s", loom_last_error());
    ck_assert_ptr_null(strstr(loom_last_error(), ELSEWHERE));
}

START_TEST(cwd_is_never_searched_implicitly)
{
    char old[PATH_MAX];
    ck_assert_ptr_nonnull(getcwd(old, sizeof old));
    ck_assert_int_eq(chdir(ELSEWHERE), 0); /* loom-optim-elsewhere.so sits right here */

    unsetenv("LOOM_PLUGIN_PATH");
    expect_not_found_elsewhere();
    setenv("LOOM_PLUGIN_PATH", "", 1); /* empty: no dirs, not "." */
    expect_not_found_elsewhere();
    setenv("LOOM_PLUGIN_PATH", "::", 1);
    expect_not_found_elsewhere();

    /* Named explicitly, the same dir is searched; "." too, because the user wrote it. */
    const loom_plugin *p = NULL;
    setenv("LOOM_PLUGIN_PATH", ".", 1);
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "elsewhere", &p), LOOM_OK);
    ck_assert_str_eq(p->path, "./loom-optim-elsewhere.so");
    setenv("LOOM_PLUGIN_PATH", ELSEWHERE, 1);
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "elsewhere", &p), LOOM_OK);
    ck_assert_str_eq(p->desc->name, "elsewhere");

    unsetenv("LOOM_PLUGIN_PATH");
    ck_assert_int_eq(chdir(old), 0);
}
END_TEST

START_TEST(not_found_lists_dirs_and_available_names)
{
    const char *dirs[64];
    int n = loom_plugin_search_dirs(dirs, 64);
    char expected[4096] = "no optim plugin 'adamx' (searched: ";
    for (int i = 0; i < n; i++) {
        strcat(expected, i ? ", " : "");
        strcat(expected, dirs[i]);
    }
    strcat(expected, "); available: ");
    const loom_plugin *p = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "adamx", &p), LOOM_ERR_PLUGIN);
    const char *msg = loom_last_error();
    ck_assert_msg(strncmp(msg, expected, strlen(expected)) == 0, "got: %s\nwant prefix: %s", msg,
                  expected);
    /* Other engineers add optimizers; the built-ins must be listed, sorted. */
    const char *avail = msg + strlen(expected);
    const char *a = strstr(avail, "adamw"), *s = strstr(avail, "sgd");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(s);
    ck_assert(a < s);
    ck_assert_ptr_null(strchr(avail, '\n'));
}
END_TEST

START_TEST(load_rejects_bad_arguments)
{
    const loom_plugin *p = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "../sgd", &p), LOOM_ERR_INVALID);
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "", &p), LOOM_ERR_INVALID);
    ck_assert_int_eq(loom_plugin_load((loom_kind)99, "sgd", &p), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "plugin kind 99 is unknown; expected one of comm, "
                                        "strategy, optim, precision, sched, backend");
}
END_TEST

/* ---- caching --------------------------------------------------------------------- */

START_TEST(loads_are_cached_and_kept_loaded)
{
    const loom_plugin *a = NULL, *b = NULL, *c = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "adamw", &a), LOOM_OK);
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_OPTIM, "adamw", &b), LOOM_OK);
    ck_assert_ptr_eq(a, b);
    ck_assert_int_eq(loom_plugin_open(a->path, &c), LOOM_OK);
    ck_assert_ptr_eq(a, c);
    /* The same file by another spelling is the same plugin (dlopen's handle). */
    char alias[PATH_MAX];
    const char *slash = strrchr(a->path, '/');
    snprintf(alias, sizeof alias, "%.*s/./%s", (int)(slash - a->path), a->path, slash + 1);
    ck_assert_int_eq(loom_plugin_open(alias, &c), LOOM_OK);
    ck_assert_ptr_eq(a, c);
    void *h = dlopen(a->path, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(h); /* still loaded */
    dlclose(h);
}
END_TEST

/* Many threads loading at once get one plugin per file: the cache is behind a mutex. */
static void *load_many(void *arg)
{
    const loom_plugin **out = arg;
    for (int i = 0; i < 200; i++) {
        const char *name = (i % 2) ? "sgd" : "adamw";
        if (loom_plugin_load(LOOM_KIND_OPTIM, name, &out[i % 2]) != LOOM_OK)
            return (void *)1;
    }
    return NULL;
}

START_TEST(concurrent_loads_share_one_plugin)
{
    enum { THREADS = 4 };
    pthread_t th[THREADS];
    const loom_plugin *got[THREADS][2] = {{NULL}};
    for (int i = 0; i < THREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, load_many, got[i]), 0);
    for (int i = 0; i < THREADS; i++) {
        void *rc = NULL;
        pthread_join(th[i], &rc);
        ck_assert_ptr_null(rc);
    }
    for (int i = 1; i < THREADS; i++) {
        ck_assert_ptr_eq(got[i][0], got[0][0]);
        ck_assert_ptr_eq(got[i][1], got[0][1]);
    }
}
END_TEST

/* ---- scan ------------------------------------------------------------------------ */

typedef struct scan_log {
    int n;
    char path[64][PATH_MAX];
    int ok[64];
    char why[64][1024];
} scan_log;

static void record(void *ctx, const char *path, const loom_plugin *p, const char *refusal)
{
    scan_log *log = ctx;
    if (log->n == 64)
        return;
    snprintf(log->path[log->n], PATH_MAX, "%s", path);
    log->ok[log->n] = p != NULL;
    ck_assert((p == NULL) == (refusal != NULL));
    snprintf(log->why[log->n], 1024, "%s", refusal ? refusal : "");
    log->n++;
}

static int find(const scan_log *log, const char *path)
{
    for (int i = 0; i < log->n; i++)
        if (strcmp(log->path[i], path) == 0)
            return i;
    return -1;
}

START_TEST(scan_visits_in_order_and_reports_shadowed)
{
    char built[PATH_MAX];
    snprintf(built, sizeof built, "%s", test_build_plugin_path("optim", "sgd"));
    make_tmpdir();
    char copy[PATH_MAX], path_env[2 * PATH_MAX];
    snprintf(copy, sizeof copy, "%s", copy_to_tmp(built, "loom-optim-sgd.so"));
    snprintf(path_env, sizeof path_env, "%s:%s", tmpdir, BROKEN);
    setenv("LOOM_PLUGIN_PATH", path_env, 1);

    static scan_log log;
    loom_plugin_scan(record, &log);

    int i_copy = find(&log, copy), i_built = find(&log, built);
    ck_assert_int_ge(i_copy, 0);
    ck_assert_int_gt(i_built, i_copy);
    ck_assert(log.ok[i_copy]);
    ck_assert(!log.ok[i_built]);
    char expected[3 * PATH_MAX];
    snprintf(expected, sizeof expected,
             "plugin '%s' shadowed: optim 'sgd' is taken from '%s', which comes first on the "
             "search path; remove one of them or reorder LOOM_PLUGIN_PATH", built, copy);
    ck_assert_str_eq(log.why[i_built], expected);

    /* Every broken fixture is visited with its refusal; the rest of the tree is fine. */
    int refused = 0;
    for (int i = 0; i < log.n; i++) {
        if (strncmp(log.path[i], BROKEN "/", strlen(BROKEN) + 1) == 0) {
            ck_assert_msg(!log.ok[i], "%s accepted", log.path[i]);
            snprintf(expected, sizeof expected, "plugin '%s' rejected: ", log.path[i]);
            ck_assert_msg(strncmp(log.why[i], expected, strlen(expected)) == 0, "%s", log.why[i]);
            refused++;
        }
    }
    ck_assert_int_eq(refused, 10);
    ck_assert(log.ok[find(&log, test_build_plugin_path("optim", "adamw"))]);
    ck_assert(log.ok[find(&log, test_build_plugin_path("precision", "fp32"))]);

    unsetenv("LOOM_PLUGIN_PATH");
    remove_tmpdir((const char *const[]){"loom-optim-sgd.so", NULL});
}
END_TEST

static Suite *loader_suite(void)
{
    Suite *s = suite_create("plugin_loader");
    TCase *tc = tcase_create("refusals");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, refuses_wrong_abi);
    tcase_add_test(tc, refuses_missing_entry);
    tcase_add_test(tc, refuses_null_descriptor);
    tcase_add_test(tc, refuses_name_mismatch);
    tcase_add_test(tc, refuses_unknown_kind);
    tcase_add_test(tc, refuses_null_ops);
    tcase_add_test(tc, refuses_short_ops);
    tcase_add_test(tc, refuses_short_descriptor);
    tcase_add_test(tc, refuses_unnamed_config_key);
    tcase_add_test(tc, refuses_non_elf_file);
    tcase_add_test(tc, refuses_bad_file_name);
    tcase_add_test(tc, load_reports_refusal_without_fallback);
    suite_add_tcase(s, tc);

    tc = tcase_create("search");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, search_dirs_in_order_skipping_empty_elements);
    tcase_add_test(tc, plugin_path_wins_over_build_tree);
    tcase_add_test(tc, cwd_is_never_searched_implicitly);
    tcase_add_test(tc, not_found_lists_dirs_and_available_names);
    tcase_add_test(tc, load_rejects_bad_arguments);
    suite_add_tcase(s, tc);

    tc = tcase_create("cache_and_scan");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, loads_are_cached_and_kept_loaded);
    tcase_add_test(tc, concurrent_loads_share_one_plugin);
    tcase_add_test(tc, scan_visits_in_order_and_reports_shadowed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(loader_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
