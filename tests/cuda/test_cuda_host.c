/* test_cuda_host.c — the CUDA backend's host-side bookkeeping, without a GPU: the memory
 * pool over fake address ranges (size classes, splitting, coalescing, reuse with no new
 * reserve, trimming, failure and retry), device selection (LOCAL_RANK % devices, the recipe
 * key, refusals), and the handle pool behind loom-comm-nccl's event reuse. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_select.h"
#include "handle_pool.h"
#include "pool.h"

/* A fake device: hands out disjoint ranges from a counter, refuses past a limit, and
 * remembers what is outstanding so the test can see every range come back. */
typedef struct fake_dev {
    uintptr_t next;
    size_t limit, outstanding;
    int reserves, releases;
} fake_dev;

static int fake_reserve(void *ctx, size_t bytes, uintptr_t *base)
{
    fake_dev *d = ctx;
    if (d->outstanding + bytes > d->limit)
        return -1;
    *base = d->next;
    d->next += bytes + 4096; /* a gap: segments are never adjacent, so never merged */
    d->outstanding += bytes;
    d->reserves++;
    return 0;
}

static void fake_release(void *ctx, uintptr_t base, size_t bytes)
{
    fake_dev *d = ctx;
    d->outstanding -= bytes;
    d->releases++;
}

START_TEST(test_size_classes)
{
    ck_assert_uint_eq(loom_pool_round(0), LOOM_POOL_ALIGN);
    ck_assert_uint_eq(loom_pool_round(1), 512);
    ck_assert_uint_eq(loom_pool_round(512), 512);
    ck_assert_uint_eq(loom_pool_round(513), 1024);
    ck_assert_uint_eq(loom_pool_round(LOOM_POOL_SMALL - 1), LOOM_POOL_SMALL);
    ck_assert_uint_eq(loom_pool_round(LOOM_POOL_SMALL), LOOM_POOL_LARGE_ALIGN);
    ck_assert_uint_eq(loom_pool_round(LOOM_POOL_LARGE_ALIGN + 1), 2 * LOOM_POOL_LARGE_ALIGN);
    ck_assert_uint_eq(loom_pool_round(SIZE_MAX - 10), 0); /* overflow refused */
}
END_TEST

START_TEST(test_small_blocks_share_a_segment)
{
    fake_dev d = {.next = 0x10000, .limit = (size_t)1 << 30};
    loom_pool *p = loom_pool_create(fake_reserve, fake_release, &d);
    uintptr_t a = loom_pool_alloc(p, 100), b = loom_pool_alloc(p, 1000), c = loom_pool_alloc(p, 4);
    ck_assert(a && b && c);
    ck_assert_int_eq(d.reserves, 1); /* one 2 MiB segment for all three */
    ck_assert_uint_eq(b, a + 512);    /* carved in address order */
    ck_assert_uint_eq(c, b + 1024);
    ck_assert_uint_eq(a % LOOM_POOL_ALIGN, 0);
    ck_assert_uint_eq(loom_pool_block_size(p, b), 1024);
    loom_pool_stats st;
    loom_pool_get_stats(p, &st);
    ck_assert_uint_eq(st.in_use, 512 + 1024 + 512);
    ck_assert_uint_eq(st.reserved, LOOM_POOL_SMALL_SEGMENT);
    ck_assert_uint_eq(st.blocks, 4); /* three used and the free tail */
    /* free the middle, then its neighbours: everything coalesces back into one block */
    ck_assert_int_eq(loom_pool_free(p, b), 0);
    loom_pool_get_stats(p, &st);
    ck_assert_uint_eq(st.blocks, 4);
    ck_assert_int_eq(loom_pool_free(p, a), 0);
    loom_pool_get_stats(p, &st);
    ck_assert_uint_eq(st.blocks, 3); /* a+b merged */
    ck_assert_int_eq(loom_pool_free(p, c), 0);
    loom_pool_get_stats(p, &st);
    ck_assert_uint_eq(st.blocks, 1);
    ck_assert_uint_eq(st.in_use, 0);
    ck_assert_int_eq(d.releases, 0); /* cached, not released */
    loom_pool_destroy(p);
    ck_assert_int_eq(d.releases, 1);
    ck_assert_uint_eq(d.outstanding, 0);
}
END_TEST

START_TEST(test_steady_state_reuses)
{
    /* A "training step": the same sizes freed and allocated again must not reserve. */
    fake_dev d = {.next = 0x100000, .limit = (size_t)1 << 34};
    loom_pool *p = loom_pool_create(fake_reserve, fake_release, &d);
    const size_t sizes[] = {123, 5000, (size_t)3 << 20, (size_t)37 << 20, 777, (size_t)1 << 20};
    enum { N = sizeof sizes / sizeof sizes[0] };
    uintptr_t got[N];
    for (int i = 0; i < N; i++)
        ck_assert((got[i] = loom_pool_alloc(p, sizes[i])) != 0);
    const int reserves = d.reserves;
    for (int step = 0; step < 50; step++) {
        for (int i = 0; i < N; i++)
            ck_assert_int_eq(loom_pool_free(p, got[(i * 7 + step) % N]), 0);
        for (int i = 0; i < N; i++)
            ck_assert((got[(i * 7 + step) % N] = loom_pool_alloc(p, sizes[(i * 7 + step) % N])) != 0);
    }
    ck_assert_int_eq(d.reserves, reserves);
    /* no two live blocks overlap */
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            if (i != j) {
                size_t si = loom_pool_block_size(p, got[i]);
                ck_assert(got[i] + si <= got[j] || got[j] + loom_pool_block_size(p, got[j]) <= got[i]);
            }
    loom_pool_destroy(p);
    ck_assert_uint_eq(d.outstanding, 0);
}
END_TEST

START_TEST(test_large_split_and_kinds_apart)
{
    fake_dev d = {.next = 0x100000, .limit = (size_t)1 << 34};
    loom_pool *p = loom_pool_create(fake_reserve, fake_release, &d);
    uintptr_t big = loom_pool_alloc(p, (size_t)10 << 20);
    ck_assert_int_eq(loom_pool_free(p, big), 0);
    /* 4 MiB from the free 10 MiB block: split, the rest stays free for 6 MiB */
    uintptr_t x = loom_pool_alloc(p, (size_t)4 << 20), y = loom_pool_alloc(p, (size_t)6 << 20);
    ck_assert_uint_eq(x, big);
    ck_assert_uint_eq(y, big + ((size_t)4 << 20));
    ck_assert_int_eq(d.reserves, 1);
    /* a small request never takes from a large segment */
    ck_assert_int_eq(loom_pool_free(p, y), 0);
    uintptr_t s = loom_pool_alloc(p, 64);
    ck_assert(s < big || s >= big + ((size_t)10 << 20));
    ck_assert_int_eq(d.reserves, 2);
    loom_pool_destroy(p);
}
END_TEST

START_TEST(test_unknown_and_double_free)
{
    fake_dev d = {.next = 0x100000, .limit = (size_t)1 << 30};
    loom_pool *p = loom_pool_create(fake_reserve, fake_release, &d);
    uintptr_t a = loom_pool_alloc(p, 4096);
    ck_assert_int_eq(loom_pool_free(p, a + 512), -1); /* inside a block: not a block */
    ck_assert_int_eq(loom_pool_free(p, 0xdead000), -1);
    ck_assert_int_eq(loom_pool_free(p, a), 0);
    ck_assert_int_eq(loom_pool_free(p, a), -1); /* twice */
    ck_assert_uint_eq(loom_pool_block_size(p, a), 0);
    loom_pool_destroy(p);
}
END_TEST

START_TEST(test_out_of_memory_trims_and_retries)
{
    fake_dev d = {.next = 0x100000, .limit = (size_t)24 << 20};
    loom_pool *p = loom_pool_create(fake_reserve, fake_release, &d);
    uintptr_t a = loom_pool_alloc(p, (size_t)8 << 20), b = loom_pool_alloc(p, (size_t)8 << 20);
    ck_assert(a && b);
    ck_assert_int_eq(loom_pool_free(p, a), 0);
    ck_assert_int_eq(loom_pool_free(p, b), 0);
    /* 20 MiB fits only after the two cached 8 MiB segments go back */
    uintptr_t c = loom_pool_alloc(p, (size_t)20 << 20);
    ck_assert(c != 0);
    ck_assert_int_eq(d.releases, 2);
    /* and past the limit the answer is 0, with the pool intact */
    ck_assert(loom_pool_alloc(p, (size_t)8 << 20) == 0);
    ck_assert_uint_eq(loom_pool_block_size(p, c), (size_t)20 << 20);
    ck_assert_int_eq(loom_pool_free(p, c), 0);
    ck_assert_uint_eq(loom_pool_trim(p), (size_t)20 << 20);
    ck_assert_uint_eq(d.outstanding, 0);
    loom_pool_destroy(p);
}
END_TEST

START_TEST(test_device_selection)
{
    char why[200];
    ck_assert_int_eq(loom_cuda_pick_device(-1, NULL, 4, why, sizeof why), 0);
    ck_assert_int_eq(loom_cuda_pick_device(-1, "", 4, why, sizeof why), 0);
    ck_assert_int_eq(loom_cuda_pick_device(-1, "3", 4, why, sizeof why), 3);
    ck_assert_int_eq(loom_cuda_pick_device(-1, "6", 4, why, sizeof why), 2); /* 2 nodes' worth */
    ck_assert_int_eq(loom_cuda_pick_device(-1, "5", 1, why, sizeof why), 0);
    ck_assert_int_eq(loom_cuda_pick_device(2, "0", 4, why, sizeof why), 2); /* the key wins */
    ck_assert_int_eq(loom_cuda_pick_device(4, NULL, 4, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "0 to 3"), "%s", why);
    ck_assert_int_eq(loom_cuda_pick_device(-2, NULL, 4, why, sizeof why), -1);
    ck_assert_int_eq(loom_cuda_pick_device(-1, "x1", 4, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "LOCAL_RANK"), "%s", why);
    ck_assert_int_eq(loom_cuda_pick_device(-1, "-1", 4, why, sizeof why), -1);
    ck_assert_int_eq(loom_cuda_pick_device(-1, "0", 0, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "no CUDA device"), "%s", why);
}
END_TEST

static int fake_made, fake_destroyed, fake_fail;
static int make_handle(void *ctx, void **out)
{
    if (fake_fail)
        return -1;
    *out = (void *)(uintptr_t)(0x1000 + 16 * ++fake_made);
    return 0;
}
static void drop_handle(void *ctx, void *h)
{
    fake_destroyed++;
}

START_TEST(test_handle_pool)
{
    loom_handle_pool hp;
    fake_made = fake_destroyed = fake_fail = 0;
    loom_handle_pool_init(&hp, make_handle, drop_handle, NULL);
    void *h[40];
    for (int i = 0; i < 40; i++)
        ck_assert_int_eq(loom_handle_pool_acquire(&hp, &h[i]), 0);
    ck_assert_int_eq(fake_made, 40);
    ck_assert_uint_eq(hp.live, 40);
    for (int i = 0; i < 40; i++)
        ck_assert_int_eq(loom_handle_pool_release(&hp, h[i]), 0);
    /* the steady state: a thousand requests, one at a time or four in flight, make none */
    for (int r = 0; r < 1000; r++) {
        void *a, *b, *c, *d;
        ck_assert_int_eq(loom_handle_pool_acquire(&hp, &a), 0);
        ck_assert_int_eq(loom_handle_pool_acquire(&hp, &b), 0);
        ck_assert_int_eq(loom_handle_pool_acquire(&hp, &c), 0);
        ck_assert_int_eq(loom_handle_pool_acquire(&hp, &d), 0);
        ck_assert(a != b && b != c && c != d && a != d);
        loom_handle_pool_release(&hp, c);
        loom_handle_pool_release(&hp, a);
        loom_handle_pool_release(&hp, d);
        loom_handle_pool_release(&hp, b);
    }
    ck_assert_int_eq(fake_made, 40);
    ck_assert_uint_eq(hp.created, 40);
    ck_assert_uint_eq(hp.live, 0);
    /* a failing create is reported, with the pool unchanged */
    for (int i = 0; i < 40; i++)
        loom_handle_pool_acquire(&hp, &h[i]);
    fake_fail = 1;
    void *x;
    ck_assert_int_eq(loom_handle_pool_acquire(&hp, &x), -1);
    ck_assert_uint_eq(hp.live, 40);
    for (int i = 0; i < 40; i++)
        loom_handle_pool_release(&hp, h[i]);
    loom_handle_pool_destroy(&hp);
    ck_assert_int_eq(fake_destroyed, 40);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda_host");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_size_classes);
    tcase_add_test(tc, test_small_blocks_share_a_segment);
    tcase_add_test(tc, test_steady_state_reuses);
    tcase_add_test(tc, test_large_split_and_kinds_apart);
    tcase_add_test(tc, test_unknown_and_double_free);
    tcase_add_test(tc, test_out_of_memory_trims_and_retries);
    tcase_add_test(tc, test_device_selection);
    tcase_add_test(tc, test_handle_pool);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
