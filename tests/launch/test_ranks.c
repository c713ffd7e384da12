/* test_ranks.c — rank/world from the environment: each launcher convention, their order of
 * precedence, the defaults, and every refusal naming its variable. Check forks each test, so
 * the environment changes stay inside it. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ranks.h"

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "LOOM_RENDEZVOUS_TIMEOUT_MS"};

static void clear(void)
{
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++)
        unsetenv(all_vars[i]);
}

static loom_ranks parse_ok(void)
{
    loom_ranks r;
    ck_assert_msg(loom_ranks_from_env(&r) == LOOM_OK, "%s", loom_last_error());
    return r;
}

static void refused(const char *msg)
{
    loom_ranks r;
    ck_assert_int_eq(loom_ranks_from_env(&r), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), msg);
}

START_TEST(test_none_set)
{
    clear();
    loom_ranks r = parse_ok();
    ck_assert_int_eq(r.rank, 0);
    ck_assert_int_eq(r.world, 1);
    ck_assert_int_eq(r.local_rank, 0);
    ck_assert_str_eq(r.addr, "127.0.0.1");
    ck_assert_int_eq(r.port, 29500);
    ck_assert_int_eq(r.addr_defaulted, 1);
    ck_assert_int_eq(r.timeout_ms, LOOM_RANKS_DEFAULT_TIMEOUT_MS);
    ck_assert_str_eq(r.source, "none");
}
END_TEST

START_TEST(test_torchrun)
{
    clear();
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("MASTER_ADDR", "node17", 1);
    setenv("MASTER_PORT", "12345", 1);
    setenv("SLURM_PROCID", "2", 1); /* torchrun's variables win */
    setenv("SLURM_NTASKS", "4", 1);
    setenv("LOOM_RENDEZVOUS_TIMEOUT_MS", "1500", 1);
    loom_ranks r = parse_ok();
    ck_assert_int_eq(r.rank, 5);
    ck_assert_int_eq(r.world, 8);
    ck_assert_int_eq(r.local_rank, 1);
    ck_assert_str_eq(r.addr, "node17");
    ck_assert_int_eq(r.port, 12345);
    ck_assert_int_eq(r.addr_defaulted, 0);
    ck_assert_int_eq(r.timeout_ms, 1500);
    ck_assert_str_eq(r.source, "torchrun");
}
END_TEST

START_TEST(test_open_mpi)
{
    clear();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("SLURM_PROCID", "0", 1); /* Open MPI's win over Slurm's */
    setenv("SLURM_NTASKS", "1", 1);
    loom_ranks r = parse_ok();
    ck_assert_int_eq(r.rank, 3);
    ck_assert_int_eq(r.world, 4);
    ck_assert_int_eq(r.local_rank, 1);
    ck_assert_str_eq(r.source, "Open MPI");
    ck_assert_str_eq(r.addr, "127.0.0.1");
}
END_TEST

START_TEST(test_slurm)
{
    clear();
    setenv("SLURM_PROCID", "2", 1);
    setenv("SLURM_NTASKS", "3", 1);
    loom_ranks r = parse_ok();
    ck_assert_int_eq(r.rank, 2);
    ck_assert_int_eq(r.world, 3);
    ck_assert_int_eq(r.local_rank, 2); /* no SLURM_LOCALID: the rank (one node) */
    ck_assert_str_eq(r.source, "Slurm");
    setenv("SLURM_LOCALID", "0", 1);
    ck_assert_int_eq(parse_ok().local_rank, 0);
}
END_TEST

/* The GPU choice (device_select.c) reads LOCAL_RANK: joining under mpirun or srun sets it
 * from their variables, so two ranks of a node do not both land on GPU 0. */
START_TEST(test_join_sets_local_rank)
{
    clear();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    ck_assert_msg(loom_ranks_join() == LOOM_OK, "%s", loom_last_error());
    ck_assert_str_eq(getenv("LOCAL_RANK"), "1");
    clear();
    setenv("SLURM_PROCID", "6", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "2", 1);
    setenv("LOCAL_RANK", "7", 1); /* a stale value from elsewhere: Slurm's decides */
    ck_assert_msg(loom_ranks_join() == LOOM_OK, "%s", loom_last_error());
    ck_assert_str_eq(getenv("LOCAL_RANK"), "2");
    clear();
    ck_assert_msg(loom_ranks_join() == LOOM_OK, "%s", loom_last_error());
    ck_assert_ptr_null(getenv("LOCAL_RANK")); /* no launcher: left alone */
}
END_TEST

START_TEST(test_bad_values)
{
    clear();
    setenv("RANK", "1", 1);
    refused("RANK is set but WORLD_SIZE is not (torchrun sets both)");
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "2", 1);
    refused("RANK=2 is not below WORLD_SIZE=2 (ranks count from 0)");
    setenv("RANK", "one", 1);
    refused("RANK='one' is not a rank (a whole number >= 0)");
    setenv("RANK", "-1", 1);
    refused("RANK='-1' is not a rank (a whole number >= 0)");
    setenv("RANK", "1x", 1);
    refused("RANK='1x' is not a rank (a whole number >= 0)");
    setenv("RANK", "", 1);
    refused("RANK='' is not a rank (a whole number >= 0)");
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "0", 1);
    refused("WORLD_SIZE='0' is not a world size (a whole number >= 1)");
    setenv("WORLD_SIZE", "99999999999999999999", 1);
    refused("WORLD_SIZE='99999999999999999999' is not a world size (a whole number >= 1)");
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "2", 1);
    refused("LOCAL_RANK=2 is not below WORLD_SIZE=2");
    unsetenv("LOCAL_RANK");
    setenv("MASTER_PORT", "70000", 1);
    refused("MASTER_PORT='70000' is not a port number (1..65535)");
    setenv("MASTER_PORT", "29501", 1);
    setenv("MASTER_ADDR", "", 1);
    refused("MASTER_ADDR='' is not a host name or address (give rank 0's host, e.g. 127.0.0.1)");
    unsetenv("MASTER_ADDR");
    setenv("LOOM_RENDEZVOUS_TIMEOUT_MS", "soon", 1);
    refused("LOOM_RENDEZVOUS_TIMEOUT_MS='soon' is not a timeout in milliseconds (a whole number >= 1)");
    unsetenv("LOOM_RENDEZVOUS_TIMEOUT_MS");
    ck_assert_int_eq(parse_ok().port, 29501);
    clear();
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    refused("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not (Open MPI sets both)");
    clear();
    setenv("SLURM_PROCID", "4", 1);
    setenv("SLURM_NTASKS", "4", 1);
    refused("SLURM_PROCID=4 is not below SLURM_NTASKS=4 (ranks count from 0)");
}
END_TEST

START_TEST(test_join_single_rank)
{
    clear();
    ck_assert_int_eq(loom_ranks_join(), LOOM_OK);
    ck_assert_ptr_null(loom_cli_rendezvous()); /* world 1: no rendezvous at all */
    ck_assert_int_eq(loom_cli_ranks()->world, 1);
    loom_ranks_leave(1);
}
END_TEST

START_TEST(test_join_refuses_bad_env)
{
    clear();
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "2", 1);
    ck_assert_int_eq(loom_ranks_join(), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "RANK=3 is not below WORLD_SIZE=2 (ranks count from 0)");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ranks");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, test_none_set);
    tcase_add_test(tc, test_torchrun);
    tcase_add_test(tc, test_open_mpi);
    tcase_add_test(tc, test_slurm);
    tcase_add_test(tc, test_bad_values);
    tcase_add_test(tc, test_join_single_rank);
    tcase_add_test(tc, test_join_sets_local_rank);
    tcase_add_test(tc, test_join_refuses_bad_env);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
