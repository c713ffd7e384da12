/* rendezvous_server.c — rank 0's side of the rendezvous: one thread, one poll() loop,
 * every rank's connection (protocol in rendezvous_wire.h).
 *
 * What: a key-value table (chained hash), per-connection input/output buffers, GETs that
 * wait server-side until their key is SET or their deadline passes, and the hello that ties
 * a connection to a rank (so a second claim of a rank, or a different world size, is refused).
 * What not: persistence, deletion, authentication. It trusts ranks, not strangers: any
 * malformed or oversized request gets one ERROR reply and the connection is closed; nothing
 * a client sends can crash the thread or make it allocate more than one maximal message per
 * connection (a client is not read again until its reply has gone out).
 * Invariants: only this thread touches the table and the connections; the owner talks to it
 * through the wake pipe (a 4-byte linger in ms = "stop"). poll() always has a finite timeout
 * when a deadline is pending and none otherwise: the thread sleeps, never spins.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rendezvous.h"
#include "rendezvous_wire.h"
#include "base/status.h"

#define MAX_MSG (LOOM_RDV_REQ_HDR + LOOM_RENDEZVOUS_MAX_KEY + LOOM_RENDEZVOUS_MAX_VALUE)

typedef struct kv {
    struct kv *next;
    uint32_t klen, vlen;
    uint8_t *val;
    uint8_t key[]; /* klen bytes, then the value */
} kv;

typedef struct conn {
    int fd, rank; /* rank -1 until hello */
    int dead, waiting;
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    uint8_t wkey[LOOM_RENDEZVOUS_MAX_KEY]; /* the key a waiting GET wants */
    uint32_t wklen;
    int64_t wdeadline;
} conn;

struct loom_rdv_server {
    int lfd, wake[2], world;
    pthread_t thread;
    conn **conns;
    int nconns, cap_conns, ranked;
    unsigned char *rank_taken;
    kv **buckets;
    size_t nbuckets, nkeys;
    int64_t accept_pause_until, linger_deadline;
    int stopping;
};

static uint64_t hash_key(const uint8_t *k, size_t n) { return loom_rendezvous_hash(k, n); }

static kv *table_find(struct loom_rdv_server *s, const uint8_t *k, uint32_t n)
{
    for (kv *e = s->buckets[hash_key(k, n) & (s->nbuckets - 1)]; e; e = e->next)
        if (e->klen == n && memcmp(e->key, k, n) == 0)
            return e;
    return NULL;
}

/* Insert or replace; 0 when out of memory (the caller answers ERROR). */
static int table_set(struct loom_rdv_server *s, const uint8_t *k, uint32_t n, const uint8_t *v,
                     uint32_t vn)
{
    if (s->nkeys >= 2 * s->nbuckets) { /* grow: rehash into twice the buckets */
        kv **nb = calloc(2 * s->nbuckets, sizeof *nb);
        if (nb) {
            for (size_t i = 0; i < s->nbuckets; i++)
                for (kv *e = s->buckets[i], *next; e; e = next) {
                    next = e->next;
                    size_t b = hash_key(e->key, e->klen) & (2 * s->nbuckets - 1);
                    e->next = nb[b];
                    nb[b] = e;
                }
            free(s->buckets);
            s->buckets = nb;
            s->nbuckets *= 2;
        }
    }
    kv *e = malloc(sizeof *e + n + vn + 1);
    if (!e)
        return 0;
    e->klen = n;
    e->vlen = vn;
    memcpy(e->key, k, n);
    e->val = e->key + n;
    memcpy(e->val, v, vn);
    kv **pp = &s->buckets[hash_key(k, n) & (s->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->klen == n && memcmp((*pp)->key, k, n) == 0) {
            e->next = (*pp)->next;
            free(*pp);
            *pp = e;
            return 1;
        }
    e->next = NULL;
    *pp = e;
    s->nkeys++;
    return 1;
}

/* Queue a reply and try to send it now; the rest goes out on POLLOUT. */
static void reply(conn *c, int status, const void *payload, uint32_t len)
{
    size_t need = c->out_len + LOOM_RDV_REP_HDR + len;
    if (need > c->out_cap) {
        uint8_t *p = realloc(c->out, need);
        if (!p) {
            c->dead = 1;
            return;
        }
        c->out = p;
        c->out_cap = need;
    }
    uint8_t *h = c->out + c->out_len;
    memset(h, 0, LOOM_RDV_REP_HDR);
    h[0] = (uint8_t)status;
    loom_rdv_put32(h + 4, len);
    if (len)
        memcpy(h + LOOM_RDV_REP_HDR, payload, len);
    c->out_len = need;
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                c->dead = 1;
            return;
        }
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
}

/* Refuse: one ERROR reply, then the connection is closed. */
static void refuse(conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(conn *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply(c, LOOM_RDV_ERROR, msg, (uint32_t)(n < (int)sizeof msg ? n : (int)sizeof msg - 1));
    c->dead = 1;
}

static void handle_hello(struct loom_rdv_server *s, conn *c, uint32_t rank, const uint8_t *val)
{
    uint32_t world = loom_rdv_get32(val);
    if ((int64_t)world != s->world)
        refuse(c, "rendezvous: rank %u says the world has %u ranks, but rank 0 serves a world "
                  "of %d (every rank needs the same WORLD_SIZE)", rank, world, s->world);
    else if ((int64_t)rank >= s->world)
        refuse(c, "rendezvous: rank %u is not below the world size %d", rank, s->world);
    else if (s->rank_taken[rank])
        refuse(c, "rendezvous: rank %u is already connected: two processes claim rank %u "
                  "(check RANK in their environments)", rank, rank);
    else {
        s->rank_taken[rank] = 1;
        s->ranked++;
        c->rank = (int)rank;
        reply(c, LOOM_RDV_OK, NULL, 0);
    }
}

/* Process one complete request at the head of c->in, if there is one. 1 = consumed. */
static int process_one(struct loom_rdv_server *s, conn *c)
{
    if (c->dead || c->waiting || c->out_len || c->in_len < LOOM_RDV_REQ_HDR)
        return 0;
    const uint8_t *h = c->in;
    int op = h[0];
    uint32_t arg = loom_rdv_get32(h + 4), klen = loom_rdv_get32(h + 8), vlen = loom_rdv_get32(h + 12);
    if (h[1] != LOOM_RDV_VERSION || (op != LOOM_RDV_HELLO && op != LOOM_RDV_SET && op != LOOM_RDV_GET)) {
        refuse(c, "rendezvous: not a loom rendezvous request (protocol %d expected); closing "
                  "the connection", LOOM_RDV_VERSION);
        return 0;
    }
    if ((c->rank < 0) != (op == LOOM_RDV_HELLO)) {
        refuse(c, c->rank < 0 ? "rendezvous: a connection must start with a hello"
                              : "rendezvous: hello sent twice on one connection");
        return 0;
    }
    if (klen < 1 || klen > LOOM_RENDEZVOUS_MAX_KEY || vlen > LOOM_RENDEZVOUS_MAX_VALUE ||
        (op == LOOM_RDV_GET && vlen != 0) ||
        (op == LOOM_RDV_HELLO && (vlen != 4 || klen != strlen(LOOM_RDV_MAGIC)))) {
        refuse(c, "rendezvous: refused a request with a %u-byte key and a %u-byte value (keys "
                  "are 1..%d bytes, values at most %u)", klen, vlen, LOOM_RENDEZVOUS_MAX_KEY,
               LOOM_RENDEZVOUS_MAX_VALUE);
        return 0;
    }
    size_t total = LOOM_RDV_REQ_HDR + (size_t)klen + vlen;
    if (c->in_len < total)
        return 0;
    const uint8_t *key = c->in + LOOM_RDV_REQ_HDR, *val = key + klen;
    if (op == LOOM_RDV_HELLO) {
        if (memcmp(key, LOOM_RDV_MAGIC, klen) != 0)
            refuse(c, "rendezvous: not a loom rendezvous hello; closing the connection");
        else
            handle_hello(s, c, arg, val);
    } else if (op == LOOM_RDV_SET) {
        if (!table_set(s, key, klen, val, vlen)) {
            refuse(c, "rendezvous: rank 0's store is out of memory");
        } else {
            reply(c, LOOM_RDV_OK, NULL, 0);
            for (int i = 0; i < s->nconns; i++) { /* wake the GETs waiting for this key */
                conn *w = s->conns[i];
                if (w->waiting && w->wklen == klen && memcmp(w->wkey, key, klen) == 0) {
                    w->waiting = 0;
                    reply(w, LOOM_RDV_OK, val, vlen);
                }
            }
        }
    } else {
        kv *e = table_find(s, key, klen);
        if (e) {
            reply(c, LOOM_RDV_OK, e->val, e->vlen);
        } else if (arg == 0) {
            reply(c, LOOM_RDV_TIMEOUT, NULL, 0);
        } else {
            c->waiting = 1;
            memcpy(c->wkey, key, klen);
            c->wklen = klen;
            c->wdeadline = loom_rdv_now_ms() + arg;
        }
    }
    c->in_len -= total;
    memmove(c->in, c->in + total, c->in_len);
    return 1;
}

static void read_conn(conn *c)
{
    if (c->in_cap - c->in_len < 4096 && c->in_cap < 2 * MAX_MSG) {
        size_t cap = c->in_cap ? 2 * c->in_cap : 4096;
        uint8_t *p = realloc(c->in, cap > 2 * MAX_MSG ? 2 * MAX_MSG : cap);
        if (!p) {
            c->dead = 1;
            return;
        }
        c->in = p;
        c->in_cap = cap > 2 * MAX_MSG ? 2 * MAX_MSG : cap;
    }
    if (c->in_len == c->in_cap)
        return; /* full: not polled for input until it drains */
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n > 0)
        c->in_len += (size_t)n;
    else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        c->dead = 1;
}

static void flush_conn(conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                c->dead = 1;
            return;
        }
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
}

static void drop_conn(struct loom_rdv_server *s, int i)
{
    conn *c = s->conns[i];
    if (c->rank >= 0) {
        s->rank_taken[c->rank] = 0;
        s->ranked--;
    }
    close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
    s->conns[i] = s->conns[--s->nconns];
}

static void accept_conn(struct loom_rdv_server *s, int64_t now)
{
    int fd = accept(s->lfd, NULL, NULL);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
            s->accept_pause_until = now + 100; /* out of descriptors: do not spin on accept */
        return;
    }
    conn *c = s->nconns < s->cap_conns ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        close(fd);
        return;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->rank = -1;
    s->conns[s->nconns++] = c;
}

static void *serve(void *arg)
{
    struct loom_rdv_server *s = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the main thread */
    struct pollfd *pfd = malloc((size_t)(s->cap_conns + 2) * sizeof *pfd);
    if (!pfd)
        return NULL;
    for (;;) {
        int64_t now = loom_rdv_now_ms();
        for (int progress = 1; progress;) {
            progress = 0;
            for (int i = 0; i < s->nconns; i++)
                while (process_one(s, s->conns[i]))
                    progress = 1;
        }
        int64_t next = s->stopping ? s->linger_deadline : INT64_MAX;
        for (int i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            if (c->waiting && c->wdeadline <= now) {
                c->waiting = 0;
                reply(c, LOOM_RDV_TIMEOUT, NULL, 0);
            } else if (c->waiting && c->wdeadline < next) {
                next = c->wdeadline;
            }
        }
        for (int i = s->nconns - 1; i >= 0; i--)
            if (s->conns[i]->dead)
                drop_conn(s, i);
        if (s->stopping && (s->ranked == 0 || now >= s->linger_deadline))
            break;
        int n = 0, listening = s->accept_pause_until <= now;
        if (!listening && s->accept_pause_until < next)
            next = s->accept_pause_until;
        pfd[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = listening ? s->lfd : -1, .events = POLLIN};
        for (int i = 0; i < s->nconns; i++) {
            conn *c = s->conns[i];
            short ev = (short)((c->in_len < 2 * MAX_MSG ? POLLIN : 0) | (c->out_len ? POLLOUT : 0));
            pfd[n++] = (struct pollfd){.fd = c->fd, .events = ev};
        }
        int64_t wait = next - now < 0 ? 0 : next - now;
        int timeout = next == INT64_MAX ? -1 : (int)(wait < 60000 ? wait : 60000);
        if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR)
            break;
        now = loom_rdv_now_ms();
        if (pfd[0].revents) {
            int linger;
            if (read(s->wake[0], &linger, sizeof linger) == (ssize_t)sizeof linger) {
                s->stopping = 1;
                s->linger_deadline = now + (linger > 0 ? linger : 0);
            }
        }
        int nc = s->nconns; /* connections accepted below were not polled */
        for (int i = 0; i < nc; i++) {
            conn *c = s->conns[i];
            short re = pfd[i + 2].revents;
            if (re & POLLOUT)
                flush_conn(c);
            if (re & (POLLIN | POLLHUP | POLLERR))
                read_conn(c);
        }
        if (pfd[1].revents & POLLIN)
            accept_conn(s, now);
    }
    free(pfd);
    return NULL;
}

/* A loopback address binds to itself; any other to the family's wildcard, so that ranks on
 * other nodes reach it whatever interface the name resolved to. */
static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr, &in6addr_loopback,
                      sizeof in6addr_loopback) == 0;
    return 0;
}

static loom_status listen_on(const char *addr, int port, int *out)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    int gai = getaddrinfo(addr, ps, &hints, &res);
    if (gai != 0)
        return loom_fail(LOOM_ERR_COMM, "rendezvous: rank 0 cannot resolve MASTER_ADDR '%s': %s",
                         addr, gai_strerror(gai));
    int err = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        struct sockaddr_storage ss;
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        if (!is_loopback(ai->ai_addr)) {
            if (ss.ss_family == AF_INET)
                ((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_ANY);
            else if (ss.ss_family == AF_INET6)
                ((struct sockaddr_in6 *)&ss)->sin6_addr = in6addr_any;
        }
        int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            fcntl(fd, F_SETFD, FD_CLOEXEC);
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            freeaddrinfo(res);
            *out = fd;
            return LOOM_OK;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    return loom_fail(LOOM_ERR_COMM, "rendezvous: rank 0 cannot listen on %s:%d: %s%s", addr, port,
                     strerror(err), err == EADDRINUSE ? " (another job on this port? choose "
                                                        "another MASTER_PORT)" : "");
}

loom_status loom_rdv_server_start(const char *addr, int port, int world, loom_rdv_server **out)
{
    *out = NULL;
    struct loom_rdv_server *s = calloc(1, sizeof *s);
    if (!s)
        LOOM_FAIL(LOOM_ERR_NOMEM, "rendezvous: out of memory");
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->world = world;
    s->cap_conns = world + 64; /* every rank, plus room for strays being refused */
    s->nbuckets = 256;
    s->conns = calloc((size_t)s->cap_conns, sizeof *s->conns);
    s->rank_taken = calloc((size_t)world, 1);
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    loom_status st = LOOM_OK;
    if (!s->conns || !s->rank_taken || !s->buckets)
        st = loom_fail(LOOM_ERR_NOMEM, "rendezvous: out of memory");
    else if ((st = listen_on(addr, port, &s->lfd)) != LOOM_OK)
        ;
    else if (pipe(s->wake) != 0)
        st = loom_fail(LOOM_ERR_COMM, "rendezvous: pipe: %s", strerror(errno));
    else {
        fcntl(s->wake[0], F_SETFD, FD_CLOEXEC);
        fcntl(s->wake[1], F_SETFD, FD_CLOEXEC);
        int e = pthread_create(&s->thread, NULL, serve, s);
        if (e != 0)
            st = loom_fail(LOOM_ERR_COMM, "rendezvous: cannot start the server thread: %s",
                           strerror(e));
    }
    if (st != LOOM_OK) {
        if (s->wake[0] >= 0) {
            close(s->wake[0]);
            close(s->wake[1]);
        }
        s->wake[0] = -1;
        loom_rdv_server_stop(s, 0);
        return st;
    }
    *out = s;
    return LOOM_OK;
}

void loom_rdv_server_stop(loom_rdv_server *s, int linger_ms)
{
    if (!s)
        return;
    if (s->wake[0] >= 0) {
        ssize_t w;
        do
            w = write(s->wake[1], &linger_ms, sizeof linger_ms);
        while (w < 0 && errno == EINTR);
        pthread_join(s->thread, NULL);
        close(s->wake[0]);
        close(s->wake[1]);
    }
    while (s->nconns > 0)
        drop_conn(s, s->nconns - 1);
    if (s->lfd >= 0)
        close(s->lfd);
    for (size_t i = 0; s->buckets && i < s->nbuckets; i++)
        for (kv *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    free(s->buckets);
    free(s->conns);
    free(s->rank_taken);
    free(s);
}
