/* test_rendezvous.c — the bootstrap store across real processes: set/get between forked
 * ranks, get with a timeout, the start-up and named barrier timeouts naming the missing
 * ranks, size limits, stray clients that must not hurt the server, rank 0 dying or never
 * coming, the configuration-mismatch check, and rank 0 lingering until the others leave.
 * Ranks other than the test's own are forked before the test process starts any thread
 * (rank 0's server is a thread). Every timeout is short: the suite runs in a few seconds. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/rendezvous.h"
#include "dist/rendezvous_wire.h"

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A forked rank: runs fn, exits with its result (0 = as expected). */
typedef int (*rank_fn)(int port, int rank, int world);
static pid_t spawn(rank_fn fn, int port, int rank, int world)
{
    pid_t p = fork();
    ck_assert(p >= 0);
    if (p == 0)
        _exit(fn(port, rank, world));
    return p;
}

static void expect_exit(pid_t p, int code)
{
    int st;
    ck_assert(waitpid(p, &st, 0) == p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == code, "child %d: status %d, expected exit %d",
                  (int)p, st, code);
}

/* In a child: fail loudly (the parent only sees the exit status). */
#define CHILD_CHECK(cond)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: %s failed; last error: %s\n", __FILE__, __LINE__, #cond, \
                    loom_last_error());                                                     \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

static char expected[1024];

static int exchange(int port, int rank, int world)
{
    loom_rendezvous *r;
    CHILD_CHECK(loom_rendezvous_open("127.0.0.1", port, rank, world, 5000, &r) == LOOM_OK);
    const loom_store *s = loom_rendezvous_store(r);
    char key[32], val[64];
    snprintf(key, sizeof key, "from/%d", rank);
    snprintf(val, sizeof val, "value of rank %d", rank);
    CHILD_CHECK(s->set(s->self, key, val, strlen(val) + 1) == LOOM_OK);
    if (rank == 1) { /* the largest value there may be, with every byte value in it */
        uint8_t *big = malloc(LOOM_RENDEZVOUS_MAX_VALUE);
        for (size_t i = 0; i < LOOM_RENDEZVOUS_MAX_VALUE; i++)
            big[i] = (uint8_t)(i * 7);
        CHILD_CHECK(s->set(s->self, "big", big, LOOM_RENDEZVOUS_MAX_VALUE) == LOOM_OK);
        free(big);
    }
    for (int k = 0; k < world; k++) {
        char got[64], want[64];
        size_t len = sizeof got;
        snprintf(key, sizeof key, "from/%d", k);
        snprintf(want, sizeof want, "value of rank %d", k);
        CHILD_CHECK(s->get(s->self, key, got, &len, 5000) == LOOM_OK);
        CHILD_CHECK(len == strlen(want) + 1 && strcmp(got, want) == 0);
    }
    uint8_t *big = malloc(LOOM_RENDEZVOUS_MAX_VALUE);
    size_t len = LOOM_RENDEZVOUS_MAX_VALUE;
    CHILD_CHECK(s->get(s->self, "big", big, &len, 5000) == LOOM_OK);
    CHILD_CHECK(len == LOOM_RENDEZVOUS_MAX_VALUE && big[12345] == (uint8_t)(12345 * 7));
    free(big);
    CHILD_CHECK(loom_rendezvous_barrier(r, "end", 5000) == LOOM_OK);
    CHILD_CHECK(loom_rendezvous_barrier(r, "end", 5000) == LOOM_OK); /* a name may repeat */
    loom_rendezvous_close(r, 5000);
    return 0;
}

START_TEST(test_set_get_across_processes)
{
    int port = free_port();
    pid_t a = spawn(exchange, port, 1, 3), b = spawn(exchange, port, 2, 3);
    ck_assert_int_eq(exchange(port, 0, 3), 0);
    expect_exit(a, 0);
    expect_exit(b, 0);
}
END_TEST

static int set_late(int port, int rank, int world)
{
    loom_rendezvous *r;
    CHILD_CHECK(loom_rendezvous_open("127.0.0.1", port, rank, world, 5000, &r) == LOOM_OK);
    poll(NULL, 0, 300);
    const loom_store *s = loom_rendezvous_store(r);
    CHILD_CHECK(s->set(s->self, "late", "12345678", 8) == LOOM_OK);
    loom_rendezvous_close(r, 0);
    return 0;
}

START_TEST(test_get_waits_and_times_out)
{
    int port = free_port();
    pid_t c = spawn(set_late, port, 1, 2);
    loom_rendezvous *r;
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", port, 0, 2, 5000, &r), LOOM_OK);
    const loom_store *s = loom_rendezvous_store(r);
    char buf[16];
    size_t len = sizeof buf;
    int64_t t0 = loom_rdv_now_ms();
    ck_assert_int_eq(s->get(s->self, "late", buf, &len, 5000), LOOM_OK); /* waits for the set */
    ck_assert_int_ge(loom_rdv_now_ms() - t0, 200);
    ck_assert_uint_eq(len, 8);
    len = 4; /* too small: the size is reported, the call refused */
    ck_assert_int_eq(s->get(s->self, "late", buf, &len, 0), LOOM_ERR_INVALID);
    ck_assert_uint_eq(len, 8);
    ck_assert_str_eq(loom_last_error(), "rendezvous: key 'late' holds 8 bytes but the buffer holds 4");
    t0 = loom_rdv_now_ms();
    len = sizeof buf;
    ck_assert_int_eq(s->get(s->self, "nope", buf, &len, 200), LOOM_ERR_TIMEOUT);
    int64_t took = loom_rdv_now_ms() - t0;
    ck_assert_msg(took >= 190 && took < 1500, "took %lld ms", (long long)took);
    ck_assert_str_eq(loom_last_error(), "rendezvous: key 'nope' was not set within 200 ms");
    ck_assert_int_eq(s->get(s->self, "nope", buf, &len, 0), LOOM_ERR_TIMEOUT);
    ck_assert_int_eq(s->get(s->self, "late", buf, &len, 0), LOOM_OK); /* still usable */
    expect_exit(c, 0);
    loom_rendezvous_close(r, 0);
}
END_TEST

static int open_expect_fail(int port, int rank, int world)
{
    loom_rendezvous *r;
    CHILD_CHECK(loom_rendezvous_open("127.0.0.1", port, rank, world, 600, &r) == LOOM_ERR_TIMEOUT);
    CHILD_CHECK(strcmp(loom_last_error(), expected) == 0);
    return 0;
}

START_TEST(test_startup_barrier_names_missing_ranks)
{
    int port = free_port();
    snprintf(expected, sizeof expected,
             "rendezvous: ranks 2, 3 of 4 did not arrive at 127.0.0.1:%d within 600 ms", port);
    pid_t c = spawn(open_expect_fail, port, 1, 4);
    int64_t t0 = loom_rdv_now_ms();
    loom_rendezvous *r = NULL;
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", port, 0, 4, 600, &r), LOOM_ERR_TIMEOUT);
    ck_assert_str_eq(loom_last_error(), expected);
    ck_assert_ptr_null(r);
    ck_assert_int_lt(loom_rdv_now_ms() - t0, 3000);
    expect_exit(c, 0);
}
END_TEST

START_TEST(test_rank0_never_arrives)
{
    int port = free_port();
    snprintf(expected, sizeof expected, "rendezvous: rank 0 of 2 did not arrive at 127.0.0.1:%d "
             "within 600 ms (nothing is listening there; rank 0 serves the rendezvous)", port);
    ck_assert_int_eq(open_expect_fail(port, 1, 2), 0);
}
END_TEST

static int skip_barrier(int port, int rank, int world)
{
    loom_rendezvous *r;
    CHILD_CHECK(loom_rendezvous_open("127.0.0.1", port, rank, world, 5000, &r) == LOOM_OK);
    const loom_store *s = loom_rendezvous_store(r);
    char buf[4];
    size_t len = sizeof buf;
    CHILD_CHECK(s->get(s->self, "done", buf, &len, 5000) == LOOM_OK);
    loom_rendezvous_close(r, 0);
    return 0;
}

START_TEST(test_named_barrier_timeout)
{
    int port = free_port();
    pid_t c = spawn(skip_barrier, port, 1, 2);
    loom_rendezvous *r;
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", port, 0, 2, 5000, &r), LOOM_OK);
    ck_assert_int_eq(loom_rendezvous_barrier(r, "init", 300), LOOM_ERR_TIMEOUT);
    ck_assert_str_eq(loom_last_error(), "rendezvous: rank 1 of 2 did not arrive at barrier 'init' "
                                        "within 300 ms");
    const loom_store *s = loom_rendezvous_store(r);
    ck_assert_int_eq(s->set(s->self, "done", "", 0), LOOM_OK);
    expect_exit(c, 0);
    loom_rendezvous_close(r, 2000);
}
END_TEST

/* A raw client: send bytes, return the reply status (or -1 if the server just closed). */
static int raw(int port, const void *msg, size_t n, char *text, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    ck_assert(send(fd, msg, n, MSG_NOSIGNAL) == (ssize_t)n);
    shutdown(fd, SHUT_WR); /* the server sees the end of a fragment too */
    uint8_t buf[1024];
    size_t got = 0;
    for (ssize_t k; got < sizeof buf && (k = recv(fd, buf + got, sizeof buf - got, 0)) > 0;)
        got += (size_t)k; /* until the server closes */
    close(fd);
    if (got < LOOM_RDV_REP_HDR)
        return -1;
    size_t len = loom_rdv_get32(buf + 4);
    len = len < cap - 1 ? len : cap - 1;
    memcpy(text, buf + LOOM_RDV_REP_HDR, len);
    text[len] = '\0';
    return buf[0];
}

static size_t header(uint8_t *h, int op, uint32_t arg, uint32_t klen, uint32_t vlen)
{
    memset(h, 0, LOOM_RDV_REQ_HDR);
    h[0] = (uint8_t)op;
    h[1] = LOOM_RDV_VERSION;
    loom_rdv_put32(h + 4, arg);
    loom_rdv_put32(h + 8, klen);
    loom_rdv_put32(h + 12, vlen);
    return LOOM_RDV_REQ_HDR;
}

START_TEST(test_limits_and_stray_clients)
{
    int port = free_port();
    loom_rendezvous *r;
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", port, 0, 1, 5000, &r), LOOM_OK);
    const loom_store *s = loom_rendezvous_store(r);
    char key[300];
    memset(key, 'k', sizeof key);
    key[257] = '\0';
    ck_assert_int_eq(s->set(s->self, key, "v", 1), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "rendezvous: key 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...' "
                                        "is 257 bytes; keys are 1..256 bytes");
    ck_assert_int_eq(s->set(s->self, "", "v", 1), LOOM_ERR_INVALID);
    key[256] = '\0';
    ck_assert_int_eq(s->set(s->self, key, "v", 1), LOOM_OK);
    static uint8_t big[LOOM_RENDEZVOUS_MAX_VALUE + 1];
    ck_assert_int_eq(s->set(s->self, "big", big, sizeof big), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "rendezvous: value for key 'big' is 1048577 bytes; values "
                                        "are at most 1048576 bytes (1 MiB)");
    char text[512];
    const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(raw(port, http, sizeof http - 1, text, sizeof text), LOOM_RDV_ERROR);
    ck_assert_str_eq(text, "rendezvous: not a loom rendezvous request (protocol 1 expected); "
                           "closing the connection");
    ck_assert_int_eq(raw(port, "ab", 2, text, sizeof text), -1); /* a fragment, then gone */
    uint8_t msg[64];
    size_t n = header(msg, LOOM_RDV_HELLO, 0, 100000, 4);
    ck_assert_int_eq(raw(port, msg, n, text, sizeof text), LOOM_RDV_ERROR);
    ck_assert_str_eq(text, "rendezvous: refused a request with a 100000-byte key and a 4-byte "
                           "value (keys are 1..256 bytes, values at most 1048576)");
    n = header(msg, LOOM_RDV_SET, 0, 1, 1);
    memcpy(msg + n, "kv", 2);
    ck_assert_int_eq(raw(port, msg, n + 2, text, sizeof text), LOOM_RDV_ERROR);
    ck_assert_str_eq(text, "rendezvous: a connection must start with a hello");
    /* a hello, then a set whose value is over the limit */
    n = header(msg, LOOM_RDV_HELLO, 0, 15, 4);
    memcpy(msg + n, LOOM_RDV_MAGIC, 15);
    loom_rdv_put32(msg + n + 15, 1);
    ck_assert_int_eq(raw(port, msg, n + 19, text, sizeof text), LOOM_RDV_ERROR);
    ck_assert_str_eq(text, "rendezvous: rank 0 is already connected: two processes claim rank 0 "
                           "(check RANK in their environments)");
    loom_rdv_put32(msg + 4, 1); /* rank 1 of a world of 1: wrong world size */
    loom_rdv_put32(msg + n + 15, 2);
    ck_assert_int_eq(raw(port, msg, n + 19, text, sizeof text), LOOM_RDV_ERROR);
    ck_assert_str_eq(text, "rendezvous: rank 1 says the world has 2 ranks, but rank 0 serves a "
                           "world of 1 (every rank needs the same WORLD_SIZE)");
    /* the real client still works after all that */
    char buf[8];
    size_t len = sizeof buf;
    ck_assert_int_eq(s->get(s->self, key, buf, &len, 1000), LOOM_OK);
    ck_assert_uint_eq(len, 1);
    loom_rendezvous_close(r, 0);
}
END_TEST

static int check_hash(int port, int rank, int world)
{
    loom_rendezvous *r;
    CHILD_CHECK(loom_rendezvous_open("127.0.0.1", port, rank, world, 5000, &r) == LOOM_OK);
    const char *cfg = rank == 1 || rank == 3 ? "lr=0.2" : "lr=0.1";
    CHILD_CHECK(loom_rendezvous_check_same(r, "recipe", loom_rendezvous_hash("x", 1), 5000) == LOOM_OK);
    loom_status st = loom_rendezvous_check_same(r, "recipe", loom_rendezvous_hash(cfg, 6), 5000);
    CHILD_CHECK(st == LOOM_ERR_INVALID && strcmp(loom_last_error(), expected) == 0);
    loom_rendezvous_close(r, 5000);
    return 0;
}

START_TEST(test_config_mismatch_names_ranks)
{
    int port = free_port();
    snprintf(expected, sizeof expected,
             "ranks 1, 3 run a different recipe than rank 0 (config hash %08x\xe2\x80\xa6 vs "
             "%08x\xe2\x80\xa6)", (unsigned)(loom_rendezvous_hash("lr=0.2", 6) >> 32),
             (unsigned)(loom_rendezvous_hash("lr=0.1", 6) >> 32));
    pid_t c[3];
    for (int k = 1; k < 4; k++)
        c[k - 1] = spawn(check_hash, port, k, 4);
    ck_assert_int_eq(check_hash(port, 0, 4), 0);
    for (int k = 0; k < 3; k++)
        expect_exit(c[k], 0);
}
END_TEST

static int rank0_exits(int port, int rank, int world)
{
    loom_rendezvous *r;
    CHILD_CHECK(loom_rendezvous_open("127.0.0.1", port, rank, world, 5000, &r) == LOOM_OK);
    poll(NULL, 0, 200);
    _exit(0); /* dies without closing: the kernel closes every socket */
}

START_TEST(test_rank0_dies)
{
    int port = free_port();
    pid_t c = spawn(rank0_exits, port, 0, 2);
    loom_rendezvous *r;
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", port, 1, 2, 5000, &r), LOOM_OK);
    const loom_store *s = loom_rendezvous_store(r);
    char buf[8];
    size_t len = sizeof buf;
    int64_t t0 = loom_rdv_now_ms();
    ck_assert_int_eq(s->get(s->self, "never", buf, &len, 10000), LOOM_ERR_COMM);
    ck_assert_int_lt(loom_rdv_now_ms() - t0, 3000);
    snprintf(expected, sizeof expected, "rendezvous: lost the connection to rank 0 at "
             "127.0.0.1:%d (closed by the peer; did rank 0 exit?)", port);
    ck_assert_str_eq(loom_last_error(), expected);
    ck_assert_int_eq(s->set(s->self, "k", "v", 1), LOOM_ERR_COMM); /* stays broken */
    ck_assert_str_eq(loom_last_error(), expected);
    expect_exit(c, 0);
    loom_rendezvous_close(r, 0);
}
END_TEST

static int use_late(int port, int rank, int world)
{
    loom_rendezvous *r;
    CHILD_CHECK(loom_rendezvous_open("127.0.0.1", port, rank, world, 5000, &r) == LOOM_OK);
    poll(NULL, 0, 300); /* rank 0 is closing by now */
    const loom_store *s = loom_rendezvous_store(r);
    char buf[8];
    size_t len = sizeof buf;
    CHILD_CHECK(s->set(s->self, "k", "v", 1) == LOOM_OK);
    CHILD_CHECK(s->get(s->self, "k", buf, &len, 1000) == LOOM_OK);
    loom_rendezvous_close(r, 0);
    return 0;
}

START_TEST(test_rank0_lingers_until_others_leave)
{
    int port = free_port();
    pid_t c = spawn(use_late, port, 1, 2);
    loom_rendezvous *r;
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", port, 0, 2, 5000, &r), LOOM_OK);
    int64_t t0 = loom_rdv_now_ms();
    loom_rendezvous_close(r, 5000);
    int64_t took = loom_rdv_now_ms() - t0;
    ck_assert_msg(took >= 250 && took < 3000, "close took %lld ms", (long long)took);
    expect_exit(c, 0);
}
END_TEST

START_TEST(test_port_in_use)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    ck_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&a, &alen) == 0);
    loom_rendezvous *r;
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", ntohs(a.sin_port), 0, 2, 300, &r),
                     LOOM_ERR_COMM);
    snprintf(expected, sizeof expected, "rendezvous: rank 0 cannot listen on 127.0.0.1:%d: "
             "Address already in use (another job on this port? choose another MASTER_PORT)",
             ntohs(a.sin_port));
    ck_assert_str_eq(loom_last_error(), expected);
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", 0, 0, 2, 300, &r), LOOM_ERR_INVALID);
    ck_assert_int_eq(loom_rendezvous_open("127.0.0.1", 1234, 2, 2, 300, &r), LOOM_ERR_INVALID);
    close(fd);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rendezvous");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_set_get_across_processes);
    tcase_add_test(tc, test_get_waits_and_times_out);
    tcase_add_test(tc, test_startup_barrier_names_missing_ranks);
    tcase_add_test(tc, test_rank0_never_arrives);
    tcase_add_test(tc, test_named_barrier_timeout);
    tcase_add_test(tc, test_limits_and_stray_clients);
    tcase_add_test(tc, test_config_mismatch_names_ranks);
    tcase_add_test(tc, test_rank0_dies);
    tcase_add_test(tc, test_rank0_lingers_until_others_leave);
    tcase_add_test(tc, test_port_in_use);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
