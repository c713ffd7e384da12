/* rendezvous.c — every rank's side of the rendezvous (see rendezvous.h): connect with
 * retries, hello, the loom_store (set/get), barriers and the same-configuration check.
 *
 * What not: the server (rendezvous_server.c, started here on rank 0).
 * Invariants: one connection per handle, one request in flight on it (a mutex); every wait
 * is a poll() with a deadline, never a spin. After a broken exchange (EOF, timeout mid-reply)
 * the handle is unusable and every later call fails with the first error, since the byte
 * stream can no longer be trusted.
 * Collectives (barrier, check_same) use keys "loom/<kind>/<seq>/<name>/..." where seq counts
 * this handle's collective calls; rank 0 gathers the others' keys and publishes a verdict, so
 * the cost is O(world) requests, and a failure is reported identically on every rank.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rendezvous.h"
#include "rendezvous_wire.h"
#include "base/status.h"
#include "base/clock.h"

#define ELLIPSIS "\xe2\x80\xa6" /* U+2026, in UTF-8 */
/* How long a rank waits for rank 0's verdict past its own deadline, and how long rank 0's
 * server stays up after a failed start so that the others can read that verdict. */
#define VERDICT_GRACE_MS 500
#define FAILED_LINGER_MS 1000

struct loom_rendezvous {
    loom_store store;
    loom_rdv_server *server; /* rank 0 only */
    int fd, rank, world, timeout_ms;
    unsigned seq;
    char where[300]; /* "addr:port", for messages */
    char broken[512]; /* the error that broke the connection, "" while healthy */
    pthread_mutex_t mu;
};

int64_t loom_rdv_now_ms(void)
{
    return (int64_t)loom_now_ms();
}

uint64_t loom_rendezvous_hash(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 33; /* MurmurHash3's fmix64: FNV's high bits barely move when a late byte does */
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static int remaining(int64_t deadline)
{
    int64_t left = deadline - loom_rdv_now_ms();
    return left <= 0 ? 0 : left > 600000 ? 600000 : (int)left;
}

/* Mark the handle broken with this message (and record it as the error). */
static loom_status broke(struct loom_rendezvous *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static loom_status broke(struct loom_rendezvous *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->broken, sizeof r->broken, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_COMM, "%s", r->broken);
}

/* Send or receive exactly n bytes before the deadline. */
static loom_status io_full(struct loom_rendezvous *r, int sending, void *buf, size_t n,
                           int64_t deadline)
{
    uint8_t *p = buf;
    while (n > 0) {
        struct pollfd pfd = {.fd = r->fd, .events = sending ? POLLOUT : POLLIN};
        int rc = poll(&pfd, 1, remaining(deadline));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc == 0)
            return broke(r, "rendezvous: rank 0 at %s did not answer in time (is rank 0 alive "
                            "and not stopped?)", r->where);
        ssize_t k = sending ? send(r->fd, p, n, MSG_NOSIGNAL) : recv(r->fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (k <= 0)
            return broke(r, "rendezvous: lost the connection to rank 0 at %s (%s; did rank 0 "
                            "exit?)", r->where, k == 0 ? "closed by the peer" : strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return LOOM_OK;
}

/* One request/reply. The reply payload goes to rbuf (up to rcap bytes; the rest is read and
 * dropped), its full size to *rlen, its status to *rstatus. wait_ms: how long the server may
 * hold the request (GET), on top of which the handle's timeout bounds the answer. */
static loom_status request(struct loom_rendezvous *r, int op, uint32_t arg, const char *key,
                           const void *val, uint32_t vlen, void *rbuf, size_t rcap, size_t *rlen,
                           int *rstatus, int wait_ms)
{
    size_t klen = strlen(key);
    if (klen < 1 || klen > LOOM_RENDEZVOUS_MAX_KEY)
        return loom_fail(LOOM_ERR_INVALID, "rendezvous: key '%.40s%s' is %zu bytes; keys are "
                         "1..%d bytes", key, klen > 40 ? "..." : "", klen, LOOM_RENDEZVOUS_MAX_KEY);
    if (vlen > LOOM_RENDEZVOUS_MAX_VALUE)
        return loom_fail(LOOM_ERR_INVALID, "rendezvous: value for key '%s' is %u bytes; values "
                         "are at most %u bytes (1 MiB)", key, vlen, LOOM_RENDEZVOUS_MAX_VALUE);
    pthread_mutex_lock(&r->mu);
    loom_status st = LOOM_OK;
    if (r->broken[0]) {
        st = loom_fail(LOOM_ERR_COMM, "%s", r->broken);
        goto out;
    }
    uint8_t h[LOOM_RDV_REQ_HDR] = {(uint8_t)op, LOOM_RDV_VERSION};
    loom_rdv_put32(h + 4, arg);
    loom_rdv_put32(h + 8, (uint32_t)klen);
    loom_rdv_put32(h + 12, vlen);
    int64_t deadline = loom_rdv_now_ms() + r->timeout_ms + wait_ms;
    if ((st = io_full(r, 1, h, sizeof h, deadline)) != LOOM_OK ||
        (st = io_full(r, 1, (void *)key, klen, deadline)) != LOOM_OK ||
        (vlen && (st = io_full(r, 1, (void *)val, vlen, deadline)) != LOOM_OK))
        goto out;
    uint8_t rh[LOOM_RDV_REP_HDR];
    if ((st = io_full(r, 0, rh, sizeof rh, deadline)) != LOOM_OK)
        goto out;
    uint32_t len = loom_rdv_get32(rh + 4);
    if (rh[0] > LOOM_RDV_ERROR || len > LOOM_RENDEZVOUS_MAX_VALUE) {
        st = broke(r, "rendezvous: %s answered with something that is not the loom rendezvous "
                      "protocol (is another program on that port?)", r->where);
        goto out;
    }
    size_t keep = len < rcap ? len : rcap;
    if ((st = io_full(r, 0, rbuf, keep, deadline)) != LOOM_OK)
        goto out;
    for (size_t left = len - keep; left > 0;) {
        uint8_t sink[4096];
        size_t k = left < sizeof sink ? left : sizeof sink;
        if ((st = io_full(r, 0, sink, k, deadline)) != LOOM_OK)
            goto out;
        left -= k;
    }
    *rlen = len;
    *rstatus = rh[0];
out:
    pthread_mutex_unlock(&r->mu);
    return st;
}

static loom_status store_set(void *self, const char *key, const void *value, size_t len)
{
    struct loom_rendezvous *r = self;
    char msg[512];
    size_t rlen = 0;
    int rs = LOOM_RDV_ERROR;
    if (len > LOOM_RENDEZVOUS_MAX_VALUE)
        return loom_fail(LOOM_ERR_INVALID, "rendezvous: value for key '%s' is %zu bytes; values "
                         "are at most %u bytes (1 MiB)", key, len, LOOM_RENDEZVOUS_MAX_VALUE);
    LOOM_TRY(request(r, LOOM_RDV_SET, 0, key, value, (uint32_t)len, msg, sizeof msg - 1, &rlen,
                     &rs, 0));
    if (rs != LOOM_RDV_OK) {
        msg[rlen < sizeof msg ? rlen : sizeof msg - 1] = '\0';
        return loom_fail(LOOM_ERR_COMM, "%s", msg);
    }
    return LOOM_OK;
}

static loom_status store_get(void *self, const char *key, void *value, size_t *len, int timeout_ms)
{
    struct loom_rendezvous *r = self;
    size_t cap = *len, rlen = 0;
    int rs = LOOM_RDV_ERROR;
    if (timeout_ms < 0)
        timeout_ms = r->timeout_ms;
    LOOM_TRY(request(r, LOOM_RDV_GET, (uint32_t)timeout_ms, key, NULL, 0, value, cap, &rlen, &rs,
                     timeout_ms));
    if (rs == LOOM_RDV_TIMEOUT)
        return loom_fail(LOOM_ERR_TIMEOUT, "rendezvous: key '%s' was not set within %d ms", key,
                         timeout_ms);
    if (rs == LOOM_RDV_ERROR) {
        char msg[512];
        size_t n = rlen < cap ? rlen : cap;
        n = n < sizeof msg - 1 ? n : sizeof msg - 1;
        memcpy(msg, value, n);
        msg[n] = '\0';
        return loom_fail(LOOM_ERR_COMM, "%s", msg);
    }
    *len = rlen;
    if (rlen > cap)
        return loom_fail(LOOM_ERR_INVALID, "rendezvous: key '%s' holds %zu bytes but the buffer "
                         "holds %zu", key, rlen, cap);
    return LOOM_OK;
}

/* "ranks 2, 3" / "rank 2" (long lists cut after 16). */
static void format_ranks(char *buf, size_t cap, const int *ranks, int n)
{
    size_t o = (size_t)snprintf(buf, cap, n == 1 ? "rank" : "ranks");
    for (int i = 0; i < n && i < 16 && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s %d", i ? "," : "", ranks[i]);
    if (n > 16 && o < cap)
        snprintf(buf + o, cap - o, " and %d more", n - 16);
}

/* Rank 0's gather: wait for key prefix<k> of every rank k != 0 until the deadline; missing
 * ranks go to miss (the caller's world-sized array). Values (8 bytes) into vals if given. */
static loom_status gather(struct loom_rendezvous *r, const char *prefix, int64_t deadline,
                          uint64_t *vals, int *miss, int *nmiss)
{
    char key[LOOM_RENDEZVOUS_MAX_KEY + 32];
    *nmiss = 0;
    for (int k = 0; k < r->world; k++) {
        if (k == r->rank)
            continue;
        snprintf(key, sizeof key, "%s%d", prefix, k);
        uint8_t v[8] = {0};
        size_t len = sizeof v;
        loom_status st = store_get(r, key, v, &len, remaining(deadline));
        if (st == LOOM_ERR_TIMEOUT)
            miss[(*nmiss)++] = k;
        else if (st != LOOM_OK)
            return st;
        else if (vals)
            memcpy(&vals[k], v, sizeof vals[k]);
    }
    return LOOM_OK;
}

/* The barrier; `where` ends the timeout message ("at 127.0.0.1:29500", "at barrier 'x'"),
 * shown_ms is the timeout it names. Every rank sets its arrival key; rank 0 gathers them and
 * publishes "done" = "" or the list of missing ranks. A rank whose deadline passes before
 * rank 0 decides (rank 0 started later, or never) looks at the arrival keys itself. */
static loom_status barrier(struct loom_rendezvous *r, const char *name, int timeout_ms,
                           const char *where, int shown_ms)
{
    int64_t deadline = loom_rdv_now_ms() + timeout_ms;
    char prefix[LOOM_RENDEZVOUS_MAX_KEY], key[LOOM_RENDEZVOUS_MAX_KEY + 32];
    char mine[LOOM_RENDEZVOUS_MAX_KEY + 32], verdict[2048] = "";
    snprintf(prefix, sizeof prefix, "loom/barrier/%u/%.200s/", r->seq++, name);
    snprintf(key, sizeof key, "%sdone", prefix);
    snprintf(mine, sizeof mine, "%s%d", prefix, r->rank);
    int *miss = calloc((size_t)r->world, sizeof *miss), nmiss = 0;
    if (!miss)
        LOOM_FAIL(LOOM_ERR_NOMEM, "rendezvous: out of memory");
    size_t vlen = sizeof verdict - 1;
    loom_status st = store_set(r, mine, "", 0);
    if (st == LOOM_OK && r->rank == 0) {
        st = gather(r, prefix, deadline, NULL, miss, &nmiss);
        if (st == LOOM_OK && nmiss > 0)
            format_ranks(verdict, sizeof verdict, miss, nmiss);
        if (st == LOOM_OK)
            st = store_set(r, key, verdict, strlen(verdict));
    } else if (st == LOOM_OK) { /* a moment's grace: rank 0's deadline may be a bit later */
        st = store_get(r, key, verdict, &vlen, remaining(deadline) + VERDICT_GRACE_MS);
        if (st == LOOM_ERR_TIMEOUT) { /* rank 0 has not decided: look for ourselves */
            for (int k = 0; k < r->world; k++) {
                char other[LOOM_RENDEZVOUS_MAX_KEY + 32];
                size_t n = 0;
                snprintf(other, sizeof other, "%s%d", prefix, k);
                if (k != r->rank && store_get(r, other, NULL, &n, 0) == LOOM_ERR_TIMEOUT)
                    miss[nmiss++] = k;
            }
            if (nmiss == 0) /* all here, but rank 0 has not said so in time */
                miss[nmiss++] = 0;
            format_ranks(verdict, sizeof verdict, miss, nmiss);
            st = LOOM_OK;
        } else if (st == LOOM_OK) {
            verdict[vlen] = '\0';
        }
    }
    free(miss);
    LOOM_TRY(st);
    if (verdict[0])
        return loom_fail(LOOM_ERR_TIMEOUT, "rendezvous: %s of %d did not arrive %s within %d ms",
                         verdict, r->world, where, shown_ms);
    return LOOM_OK;
}

loom_status loom_rendezvous_barrier(loom_rendezvous *r, const char *name, int timeout_ms)
{
    char where[300];
    snprintf(where, sizeof where, "at barrier '%.200s'", name);
    if (timeout_ms < 0)
        timeout_ms = r->timeout_ms;
    return barrier(r, name, timeout_ms, where, timeout_ms);
}

loom_status loom_rendezvous_check_same(loom_rendezvous *r, const char *what, uint64_t hash,
                                       int timeout_ms)
{
    if (timeout_ms < 0)
        timeout_ms = r->timeout_ms;
    int64_t deadline = loom_rdv_now_ms() + timeout_ms;
    char prefix[LOOM_RENDEZVOUS_MAX_KEY], key[LOOM_RENDEZVOUS_MAX_KEY + 32];
    snprintf(prefix, sizeof prefix, "loom/check/%u/%.200s/", r->seq++, what);
    snprintf(key, sizeof key, "%sverdict", prefix);
    char verdict[2048] = "";
    if (r->rank != 0) {
        char mine[LOOM_RENDEZVOUS_MAX_KEY + 32];
        snprintf(mine, sizeof mine, "%s%d", prefix, r->rank);
        LOOM_TRY(store_set(r, mine, &hash, sizeof hash));
        size_t vlen = sizeof verdict - 1;
        loom_status st = store_get(r, key, verdict, &vlen, remaining(deadline));
        if (st == LOOM_ERR_TIMEOUT)
            return loom_fail(st, "rendezvous: rank 0 did not confirm that every rank runs the "
                                 "same %s within %d ms", what, timeout_ms);
        LOOM_TRY(st);
        verdict[vlen] = '\0';
    } else {
        uint64_t *vals = calloc((size_t)r->world, sizeof *vals);
        int *miss = calloc((size_t)r->world, sizeof *miss), nmiss = 0, ndiff = 0;
        loom_status st = !vals || !miss ? loom_fail(LOOM_ERR_NOMEM, "rendezvous: out of memory")
                                        : gather(r, prefix, deadline, vals, miss, &nmiss);
        if (st == LOOM_OK && nmiss > 0) {
            char list[1024];
            format_ranks(list, sizeof list, miss, nmiss);
            snprintf(verdict, sizeof verdict, "rendezvous: %s of %d did not reach the %s check "
                     "within %d ms", list, r->world, what, timeout_ms);
        } else if (st == LOOM_OK) {
            int first = -1;
            for (int k = 1; k < r->world; k++)
                if (vals[k] != hash) {
                    miss[ndiff++] = k;
                    first = first < 0 ? k : first;
                }
            if (ndiff > 0) {
                char list[1024];
                format_ranks(list, sizeof list, miss, ndiff);
                snprintf(verdict, sizeof verdict, "%s %s a different %s than rank 0 (config hash "
                         "%08x" ELLIPSIS " vs %08x" ELLIPSIS ")", list, ndiff == 1 ? "runs" : "run", what,
                         (unsigned)(vals[first] >> 32), (unsigned)(hash >> 32));
            }
        }
        free(vals);
        free(miss);
        LOOM_TRY(st);
        LOOM_TRY(store_set(r, key, verdict, strlen(verdict)));
    }
    if (verdict[0])
        return loom_fail(strncmp(verdict, "rendezvous:", 11) == 0 ? LOOM_ERR_TIMEOUT
                                                                  : LOOM_ERR_INVALID,
                         "%s", verdict);
    return LOOM_OK;
}

/* A TCP connect to a local port nobody listens on can succeed: when the kernel happens to
 * choose the destination port as the socket's own source port (possible whenever MASTER_PORT
 * lies in the ephemeral range), the SYNs meet themselves (a "simultaneous open") and the
 * socket is connected to itself. Such a socket is not rank 0. */
static int connected_to_itself(int fd)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof me, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return 0;
    return ml == pl && memcmp(&me, &peer, ml) == 0;
}

/* Connect to addr:port, retrying until the deadline (rank 0 may not be listening yet). */
static loom_status connect_until(struct loom_rendezvous *r, const char *addr, int port,
                                 int64_t deadline, int timeout_ms)
{
    char ps[16], why[256] = "nothing is listening there";
    snprintf(ps, sizeof ps, "%d", port);
    for (;;) {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        int gai = getaddrinfo(addr, ps, &hints, &res);
        if (gai != 0)
            snprintf(why, sizeof why, "cannot resolve '%s': %s", addr, gai_strerror(gai));
        for (struct addrinfo *ai = res; ai && r->fd < 0; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0)
                continue;
            fcntl(fd, F_SETFD, FD_CLOEXEC);
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            int err = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
            if (err == EINPROGRESS) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                int left = remaining(deadline);
                socklen_t el = sizeof err;
                if (poll(&pfd, 1, left < 2000 ? left : 2000) == 1)
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                else
                    err = ETIMEDOUT;
            }
            if (err == 0 && connected_to_itself(fd))
                err = ECONNREFUSED; /* nobody listens: the kernel paired the socket with itself */
            if (err == 0) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                r->fd = fd;
            } else {
                if (err != ECONNREFUSED)
                    snprintf(why, sizeof why, "%s", strerror(err));
                close(fd);
            }
        }
        if (res)
            freeaddrinfo(res);
        if (r->fd >= 0)
            return LOOM_OK;
        int left = remaining(deadline);
        if (left == 0)
            return loom_fail(LOOM_ERR_TIMEOUT, "rendezvous: rank 0 of %d did not arrive at %s "
                             "within %d ms (%s; rank 0 serves the rendezvous)", r->world, r->where,
                             timeout_ms, why);
        poll(NULL, 0, left < 100 ? left : 100); /* rank 0 may not be up yet: sleep, retry */
    }
}

static loom_status hello(struct loom_rendezvous *r)
{
    uint8_t world[4];
    loom_rdv_put32(world, (uint32_t)r->world);
    char msg[512];
    size_t rlen = 0;
    int rs = LOOM_RDV_ERROR;
    LOOM_TRY(request(r, LOOM_RDV_HELLO, (uint32_t)r->rank, LOOM_RDV_MAGIC, world, 4, msg,
                     sizeof msg - 1, &rlen, &rs, 0));
    if (rs != LOOM_RDV_OK) {
        msg[rlen < sizeof msg ? rlen : sizeof msg - 1] = '\0';
        return loom_fail(LOOM_ERR_INVALID, "%s", msg);
    }
    return LOOM_OK;
}

loom_status loom_rendezvous_open(const char *addr, int port, int rank, int world, int timeout_ms,
                                 loom_rendezvous **out)
{
    *out = NULL;
    if (!addr || !*addr || port < 1 || port > 65535 || world < 1 || rank < 0 || rank >= world ||
        timeout_ms < 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "rendezvous: bad arguments (addr '%s', port %d, rank %d, "
                  "world %d, timeout %d ms): need 0 <= rank < world, 1 <= port <= 65535",
                  addr ? addr : "(null)", port, rank, world, timeout_ms);
    int64_t deadline = loom_rdv_now_ms() + timeout_ms;
    struct loom_rendezvous *r = calloc(1, sizeof *r);
    if (!r)
        LOOM_FAIL(LOOM_ERR_NOMEM, "rendezvous: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    r->fd = -1;
    r->rank = rank;
    r->world = world;
    r->timeout_ms = timeout_ms;
    r->store = (loom_store){.self = r, .set = store_set, .get = store_get};
    snprintf(r->where, sizeof r->where, strchr(addr, ':') ? "[%.250s]:%d" : "%.250s:%d", addr, port);
    loom_status st = LOOM_OK;
    if (rank == 0)
        st = loom_rdv_server_start(addr, port, world, &r->server);
    if (st == LOOM_OK)
        st = connect_until(r, addr, port, deadline, timeout_ms);
    if (st == LOOM_OK)
        st = hello(r);
    if (st == LOOM_OK) {
        char where[320];
        snprintf(where, sizeof where, "at %s", r->where);
        st = barrier(r, "start", remaining(deadline), where, timeout_ms);
    }
    if (st != LOOM_OK) {
        char msg[2048]; /* closing may not touch it, but keep the message whatever happens */
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        loom_rendezvous_close(r, FAILED_LINGER_MS);
        return loom_fail(st, "%s", msg);
    }
    *out = r;
    return LOOM_OK;
}

const loom_store *loom_rendezvous_store(loom_rendezvous *r) { return &r->store; }
int loom_rendezvous_rank(const loom_rendezvous *r) { return r->rank; }
int loom_rendezvous_world(const loom_rendezvous *r) { return r->world; }

void loom_rendezvous_close(loom_rendezvous *r, int linger_ms)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    loom_rdv_server_stop(r->server, linger_ms);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
