/* shm_seg.c — the shared segments: naming, creating, opening and checking them, plus the
 * futex and doorbell primitives every wait in the plugin goes through.
 *
 * What: a segment is a POSIX shared-memory object "/loom-<job>-<pid>-<random hex>"
 * (see make_name: `loom launch` removes its job's leftovers by that prefix). The creator
 * sizes it with posix_fallocate so a too-small /dev/shm (docker's 64 MiB default) is a
 * clean error at create time instead of a SIGBUS in the middle of a collective.
 * What not: no unlinking policy here (create and split unlink once everyone has mapped),
 * no spinning: every wait is a FUTEX_WAIT on a shared (not PRIVATE) word with a timeout.
 * Invariants: an opener checks magic, version, world size, the configuration and the size
 * against its own before it trusts a single offset; the creator's fields are written
 * before the name is published (through the store or a parent collective, both of which
 * order the publication after the writes).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

shm_layout shm_layout_for(int n, size_t chunk, size_t mailbox, int bells)
{
    shm_layout L;
    size_t un = (size_t)n;
    L.ctl = align_up(sizeof(shm_header), 4096);
    L.bells = L.ctl + un * sizeof(shm_ctl);
    L.box_ctl = L.bells + (bells ? un * sizeof(shm_bell) : 0);
    L.stage = align_up(L.box_ctl + un * un * sizeof(shm_box_ctl), 4096);
    L.box = L.stage + un * SHM_SLOTS * chunk;
    L.size = align_up(L.box + un * un * mailbox, 4096);
    return L;
}

double shm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void shm_futex_wait(_Atomic uint32_t *word, uint32_t val, double timeout_s)
{
    if (!(timeout_s > 0))
        return;
    if (timeout_s > 3600)
        timeout_s = 3600;
    struct timespec ts;
    ts.tv_sec = (time_t)timeout_s;
    ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
    /* Not FUTEX_PRIVATE: the word lives in memory shared between processes. EAGAIN (the
     * word already changed), EINTR and ETIMEDOUT all mean "look again"; the caller loops. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

void shm_futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Publish-then-ring: the caller has already made its change visible (release or
 * seq_cst); the seq_cst bump and the seq_cst sleepers load pair with the sleeper's
 * seq_cst sleepers increment and bell re-read (shm_engine.c), so either the sleeper sees
 * the new bell value or we see it sleeping and wake it. */
void shm_ring(shm_comm *c, int comm_rank)
{
    shm_bell *b = &c->fam->bells[c->world_of[comm_rank]];
    atomic_fetch_add(&b->ring, 1);
    if (atomic_load(&b->sleepers) != 0)
        shm_futex_wake(&b->ring);
}

/* "/loom-<job>-<pid>-<random>": LOOM_JOB_ID is what `loom launch` exports (16 hex digits)
 * and what it sweeps from /dev/shm after a job ends, so a segment of a killed job never
 * outlives the job. Without a (sane) job id: "/loom-<pid>-<random>". O_EXCL makes a clash
 * a retry, never a shared segment. */
static void make_name(char name[SHM_NAME_MAX])
{
    uint32_t rnd[2] = {0, 0};
    if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        rnd[0] ^= (uint32_t)ts.tv_nsec * 2654435761u ^ (uint32_t)getpid();
        rnd[1] ^= (uint32_t)ts.tv_sec * 2246822519u + rnd[0];
    }
    const char *job = getenv("LOOM_JOB_ID");
    int sane = job != NULL && job[0] != '\0' && strlen(job) <= 32;
    for (const char *p = job; sane && *p; p++)
        sane = (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z');
    snprintf(name, SHM_NAME_MAX, "/loom-%s%s%d-%08x%08x", sane ? job : "", sane ? "-" : "",
             (int)getpid(), rnd[0], rnd[1]);
}

loom_status shm_seg_create(const loom_host *host, const char *what, int n, size_t chunk,
                           size_t small, size_t mailbox, int bells, char name[SHM_NAME_MAX],
                           uint8_t **base, size_t *size)
{
    shm_layout L = shm_layout_for(n, chunk, mailbox, bells);
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        make_name(name);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST)
            return host->fail(LOOM_ERR_IO, "shm %s: cannot create shared memory '%s': %s", what,
                              name, strerror(errno));
    }
    if (fd < 0)
        return host->fail(LOOM_ERR_IO, "shm %s: no free segment name after 8 tries", what);
    int err = ftruncate(fd, (off_t)L.size) == 0 ? 0 : errno;
    if (err == 0) {
        err = posix_fallocate(fd, 0, (off_t)L.size);
        if (err == EOPNOTSUPP || err == EINVAL)
            err = 0; /* a filesystem without fallocate: the ftruncate'd size must do */
    }
    if (err != 0) {
        close(fd);
        shm_unlink(name);
        return host->fail(LOOM_ERR_NOMEM,
                          "shm %s: cannot reserve %.1f MiB of shared memory in /dev/shm (%s); "
                          "give /dev/shm more room (docker: --shm-size) or lower chunk_bytes / "
                          "mailbox_bytes", what, (double)L.size / 1048576.0, strerror(err));
    }
    void *p = mmap(NULL, L.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return host->fail(LOOM_ERR_NOMEM, "shm %s: cannot map %zu bytes of shared memory: %s",
                          what, L.size, strerror(err));
    }
    /* A new object reads as zeros: every counter starts at 0. */
    shm_header *h = p;
    h->version = SHM_VERSION;
    h->n = (uint32_t)n;
    h->size = L.size;
    h->chunk = chunk;
    h->small = small;
    h->mailbox = mailbox;
    h->has_bells = (uint32_t)(bells != 0);
    atomic_thread_fence(memory_order_release);
    h->magic = SHM_MAGIC;
    *base = p;
    *size = L.size;
    return LOOM_OK;
}

loom_status shm_seg_open(const loom_host *host, const char *what, const char *name, int n,
                         size_t chunk, size_t small, size_t mailbox, int bells,
                         uint8_t **base, size_t *size)
{
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return host->fail(LOOM_ERR_COMM,
                          "shm %s: cannot open shared memory '%s' made by the group's first rank: "
                          "%s (ranks on different nodes, or a stale store entry?)",
                          what, name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(shm_header)) {
        close(fd);
        return host->fail(LOOM_ERR_COMM, "shm %s: shared memory '%s' is too small to be a loom "
                          "segment", what, name);
    }
    size_t sz = (size_t)st.st_size;
    void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED)
        return host->fail(LOOM_ERR_NOMEM, "shm %s: cannot map '%s' (%zu bytes): %s", what, name,
                          sz, strerror(err));
    const shm_header *h = p;
    shm_layout L = shm_layout_for(n, chunk, mailbox, bells);
    loom_status bad = LOOM_OK;
    atomic_thread_fence(memory_order_acquire);
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION)
        bad = host->fail(LOOM_ERR_COMM, "shm %s: '%s' is not a loom shm segment of version %u",
                         what, name, SHM_VERSION);
    else if (h->n != (uint32_t)n)
        bad = host->fail(LOOM_ERR_INVALID, "shm %s: the segment was made for %u ranks, this "
                         "rank was told world=%d; every rank must be given the same world size",
                         what, h->n, n);
    else if (h->chunk != chunk || h->small != small || h->mailbox != mailbox)
        bad = host->fail(LOOM_ERR_INVALID, "shm %s: rank 0 uses chunk_bytes=%llu small_bytes=%llu "
                         "mailbox_bytes=%llu, this rank %zu/%zu/%zu; every rank must use the "
                         "same comm config", what, (unsigned long long)h->chunk,
                         (unsigned long long)h->small, (unsigned long long)h->mailbox, chunk,
                         small, mailbox);
    else if (h->size != L.size || sz < L.size || h->has_bells != (uint32_t)(bells != 0))
        bad = host->fail(LOOM_ERR_INTERNAL, "shm %s: segment '%s' has %zu bytes, expected %zu",
                         what, name, sz, L.size);
    if (bad != LOOM_OK) {
        munmap(p, sz);
        return bad;
    }
    *base = p;
    *size = sz;
    return LOOM_OK;
}
