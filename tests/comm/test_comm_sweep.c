/* test_comm_sweep.c — the slow sweep of loom-comm-shm: every op x dtype (x sum/avg/max)
 * at 1 MiB + 3 elements on world sizes 1..8 and on their even/odd groups (reverse key
 * order), and allreduces of tens of MiB. Same checks as test_comm.c (comm_check: bitwise
 * against a reference summed in rank order), just bigger.
 * The blocked ops (reduce_scatter, alltoall, alltoallv) move n blocks a rank in rounds of
 * chunk_bytes / n: they run four rounds a block, the last ragged (cc_run_sweep), the same
 * classes as 1 MiB + 3 blocks (4n + 1 rounds of f32 at n ranks) at a fraction of the cost,
 * which grows as n^2 x count; the tens of MiB cases keep the long messages. The expected
 * outputs that every rank shares (allreduce, allgather) are computed 1/n by each rank into
 * memory they all see (cc_share), not n times over.
 * `test_comm_sweep --full` runs every world size 1..8 (and groups of 2..8); meson test runs
 * a fixed sample that keeps each class — one rank, powers of two, odd sizes, the largest
 * world, odd and even groups of an odd world — at under half the time. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "comm_check.h"
#include "comm_harness.h"
#include "base/status.h"

static th_env env;
static const size_t mib3 = (1u << 20) + 3;
static const size_t chunk = 1u << 20; /* loom-comm-shm's default chunk_bytes */
/* Two halves (cc_share) of the largest shared output, the bf16 allreduce of 20 Mi + 5
 * elements of tens_of_mib (as u32s); the group sweep gives each of its two groups half.
 * Mapped shared before any fork; only the pages used are ever touched. */
static const size_t share_bytes = 2 * 4 * ((20u << 20) + 64);
static void *share_mem;

static void run_ok(int world, th_fn fn, void *arg)
{
    th_opts o = {.world = world, .timeout_ms = 30000, .limit_s = 900};
    th_result res;
    ck_assert_msg(th_run(&env, &o, fn, arg, &res), "world %d:\n%s", world, th_summary(&res));
    ck_assert_msg(th_leftovers(&res)[0] == '\0', "left in /dev/shm: %s", th_leftovers(&res));
    fprintf(stderr, "world %d: %.1f s\n", world, res.seconds);
}

static int world_sweep(th_rank *t)
{
    cc_share share = {share_mem, share_bytes, 0};
    return cc_run_sweep(t->ops, t->comm, mib3, chunk, 11u * (unsigned)t->world, &share, "world",
                        t->err, t->cap);
}

static int group_sweep(th_rank *t)
{
    void *g = NULL;
    if (t->ops->split(t->comm, t->rank % 2, -t->rank, &g))
        return th_fail(t, "split: %s", loom_last_error());
    cc_share share = {(char *)share_mem + (size_t)(t->rank % 2) * (share_bytes / 2),
                      share_bytes / 2, 0};
    int bad = cc_run_sweep(t->ops, g, mib3, chunk, 3u + (unsigned)(t->rank % 2), &share,
                           t->rank % 2 ? "odd group" : "even group", t->err, t->cap);
    t->ops->destroy(g);
    return bad;
}

static int tens_of_mib(th_rank *t)
{
    const cc_case cases[] = {
        {CC_ALLREDUCE, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, (40u << 20) / 4 + 5, 1},
        {CC_ALLREDUCE_INPLACE, LOOM_DTYPE_BF16, LOOM_REDUCE_AVG, (40u << 20) / 2 + 5, 2},
        {CC_REDUCE_SCATTER, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, (16u << 20) / 4 / (size_t)t->world + 1, 3},
        {CC_ALLGATHER, LOOM_DTYPE_F32, 0, (16u << 20) / 4 / (size_t)t->world + 1, 4},
    };
    cc_share share = {share_mem, share_bytes, 0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (cc_run_shared(t->ops, t->comm, &cases[i], &share, t->err, t->cap))
            return 1;
    return 0;
}

/* The worlds of the default sample (index _i); --full runs _i as the world itself. */
/* World 4 was in all three and is left out: it is of 2's and 8's class (powers of two), and
 * test_comm.c runs it (every world 1..8) at smaller sizes; 11 s of the test's 46 s wall. */
static const int sample_worlds[] = {1, 2, 3, 8};
static const int sample_groups[] = {3, 8};
static int full;

START_TEST(sweep_world) { run_ok(full ? _i : sample_worlds[_i], world_sweep, NULL); }
END_TEST
START_TEST(sweep_groups) { run_ok(full ? _i : sample_groups[_i], group_sweep, NULL); }
END_TEST
START_TEST(large_messages) { run_ok((int[]){2, 8}[_i], tens_of_mib, NULL); }
END_TEST

int main(int argc, char **argv)
{
    full = argc > 1 && strcmp(argv[1], "--full") == 0;
    unsetenv("LOOM_PLUGIN_PATH");
    char err[1024];
    if (!th_load(&env, "shm", err, sizeof err)) {
        fprintf(stderr, "cannot load the shm plugin: %s\n", err);
        return 1;
    }
    share_mem = mmap(NULL, share_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (share_mem == MAP_FAILED) {
        perror("mmap of the shared references");
        return 1;
    }
    Suite *s = suite_create("comm_shm_sweep");
    TCase *tc = tcase_create("sweep");
    tcase_set_timeout(tc, 1200);
    if (full) {
        tcase_add_loop_test(tc, sweep_world, 1, 9);
        tcase_add_loop_test(tc, sweep_groups, 2, 9);
    } else {
        tcase_add_loop_test(tc, sweep_world, 0, (int)(sizeof sample_worlds / sizeof(int)));
        tcase_add_loop_test(tc, sweep_groups, 0, (int)(sizeof sample_groups / sizeof(int)));
    }
    tcase_add_loop_test(tc, large_messages, 0, 2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
