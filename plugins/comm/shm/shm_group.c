/* shm_group.c — making and unmaking communicators: the world's start-up handshake through
 * the rendezvous store, split() through the parent communicator, and destroy.
 *
 * World start-up: rank 0 creates the segment, publishes its name under the store key
 * "shm/segment" and waits (futex, timeout) until every rank has mapped it; then it
 * shm_unlinks the name at once, so nothing is left in /dev/shm even if a rank is killed
 * later, and says "ready". The other ranks get the name from the store, map and check the
 * segment, count themselves in and wait for "ready" (or "gave up"). One store serves one
 * shm world communicator: the key is fixed, so a second world through the same store
 * would find the first one's (already unlinked) name.
 * split(color, key): three allgathers on the parent — (color, key); the segment name
 * created by each group's first member; "mapped it?" — after which the first member
 * unlinks its group's name. Every rank of the parent takes part, so a failure anywhere in
 * a group is seen by the whole group and nobody is left waiting. color < 0 joins no group
 * (*out = NULL), like MPI_UNDEFINED. Group order: key, then parent rank.
 * What not: the store is used only in create (the interface gives split no store).
 * Invariants: a communicator is linked into its family's list (for progress) from init to
 * destroy; the world segment (the doorbells) stays mapped while any family member lives.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shm.h"

static const char *const store_key = "shm/segment";

static void comm_free(shm_comm *c)
{
    if (c == NULL)
        return;
    const loom_host *h = c->host;
    h->free(c->world_of);
    h->free(c->send_next);
    h->free(c->send_done);
    h->free(c->recv_next);
    h->free(c->recv_done);
    h->free(c);
}

/* The process-local side of a communicator over a mapped, checked segment. */
static loom_status comm_init(shm_comm **out, const loom_host *host, shm_family *fam,
                             uint8_t *base, size_t size, int owns_mapping, int rank, int n,
                             const int *world_of, int timeout_ms, const char *name)
{
    shm_comm *c = host->alloc(sizeof *c);
    size_t un = (size_t)n;
    if (c != NULL) {
        c->host = host;
        c->world_of = host->alloc(un * sizeof(int));
        c->send_next = host->alloc(un * sizeof(uint64_t));
        c->send_done = host->alloc(un * sizeof(uint64_t));
        c->recv_next = host->alloc(un * sizeof(uint64_t));
        c->recv_done = host->alloc(un * sizeof(uint64_t));
    }
    if (c == NULL || !c->world_of || !c->send_next || !c->send_done || !c->recv_next ||
        !c->recv_done) {
        comm_free(c);
        return host->fail(LOOM_ERR_NOMEM, "shm: out of memory for a communicator of %d ranks", n);
    }
    memcpy(c->world_of, world_of, un * sizeof(int));
    c->base = base;
    c->size = size;
    c->owns_mapping = owns_mapping;
    c->hdr = (shm_header *)base;
    c->rank = rank;
    c->n = n;
    c->timeout_ms = timeout_ms;
    c->chunk = c->hdr->chunk;
    c->small = c->hdr->small;
    c->mailbox = c->hdr->mailbox;
    c->lay = shm_layout_for(n, c->chunk, c->mailbox, (int)c->hdr->has_bells);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->fam = fam;
    pthread_mutex_lock(&fam->lock);
    c->fam_next = fam->comms;
    fam->comms = c;
    fam->refs++;
    pthread_mutex_unlock(&fam->lock);
    *out = c;
    return LOOM_OK;
}

void shm_destroy(void *self)
{
    shm_comm *c = self;
    if (c == NULL)
        return;
    shm_family *f = c->fam;
    pthread_mutex_lock(&f->lock);
    for (shm_comm **p = &f->comms; *p != NULL; p = &(*p)->fam_next)
        if (*p == c) {
            *p = c->fam_next;
            break;
        }
    shm_drop_requests(c);
    int last = --f->refs == 0;
    pthread_mutex_unlock(&f->lock);
    if (c->owns_mapping)
        munmap(c->base, c->size);
    const loom_host *h = c->host;
    comm_free(c);
    if (last) {
        munmap(f->world_base, f->world_size);
        pthread_mutex_destroy(&f->lock);
        h->free(f);
    }
}

/* Wait (futex, deadline) until *word != val; returns the value seen last. */
static uint32_t wait_change(_Atomic uint32_t *word, uint32_t val, double deadline)
{
    uint32_t v;
    while ((v = atomic_load(word)) == val && shm_now() < deadline)
        shm_futex_wait(word, val, deadline - shm_now());
    return v;
}

/* Rank 0: wait for everyone to map, then unlink. */
static loom_status world_gather(const loom_host *host, uint8_t *base, const char *name,
                                int world, int timeout_ms)
{
    shm_header *h = (shm_header *)base;
    double deadline = shm_now() + timeout_ms / 1000.0;
    uint32_t v;
    while ((v = atomic_load(&h->n_mapped)) < (uint32_t)world && shm_now() < deadline)
        wait_change(&h->n_mapped, v, deadline);
    shm_unlink(name);
    if (v >= (uint32_t)world) {
        atomic_store(&h->ready, 1);
        shm_futex_wake(&h->ready);
        return LOOM_OK;
    }
    atomic_store(&h->ready, 2);
    shm_futex_wake(&h->ready);
    shm_layout L = shm_layout_for(world, h->chunk, h->mailbox, 1);
    char who[160] = "";
    size_t used = 0;
    int missing = 0;
    for (int q = 0; q < world; q++) {
        shm_ctl *ctl = (shm_ctl *)(base + L.ctl) + q;
        if (atomic_load(&ctl->mapped))
            continue;
        int w = snprintf(who + used, sizeof who - used, "%s%d", missing++ ? ", " : "", q);
        if (w > 0 && used + (size_t)w < sizeof who - 8)
            used += (size_t)w;
    }
    return host->fail(LOOM_ERR_TIMEOUT, "shm create: rank%s %s did not join within %d ms (not "
                      "started, crashed, or given another store?)", missing > 1 ? "s" : "",
                      who, timeout_ms);
}

loom_status shm_world_create(const loom_host *host, const loom_store *store, int rank,
                             int world, int timeout_ms, size_t chunk, size_t small,
                             size_t mailbox, shm_comm **out)
{
    char name[SHM_NAME_MAX] = "";
    uint8_t *base = NULL;
    size_t size = 0;
    loom_status st;
    if (rank == 0) {
        st = shm_seg_create(host, "create", world, chunk, small, mailbox, 1, name, &base, &size);
        if (st != LOOM_OK)
            return st;
        shm_layout L = shm_layout_for(world, chunk, mailbox, 1);
        shm_ctl *me = (shm_ctl *)(base + L.ctl);
        me->pid = (int32_t)getpid();
        atomic_store(&me->mapped, 1);
        atomic_store(&((shm_header *)base)->n_mapped, 1);
        st = store->set(store->self, store_key, name, strlen(name) + 1);
        if (st != LOOM_OK) {
            shm_unlink(name);
            munmap(base, size);
            return host->fail(st, "shm create: rank 0 could not publish the segment name in "
                              "the store");
        }
        st = world_gather(host, base, name, world, timeout_ms);
    } else {
        size_t len = sizeof name - 1;
        st = store->get(store->self, store_key, name, &len, timeout_ms);
        if (st != LOOM_OK)
            return host->fail(st == LOOM_ERR_TIMEOUT ? LOOM_ERR_TIMEOUT : st,
                              "shm create: rank %d got no segment name from the store within "
                              "%d ms (is rank 0 running, with the same store?)", rank,
                              timeout_ms);
        name[len < sizeof name ? len : sizeof name - 1] = '\0';
        st = shm_seg_open(host, "create", name, world, chunk, small, mailbox, 1, &base, &size);
        if (st != LOOM_OK)
            return st;
        shm_header *h = (shm_header *)base;
        shm_ctl *me = (shm_ctl *)(base + shm_layout_for(world, chunk, mailbox, 1).ctl) + rank;
        me->pid = (int32_t)getpid();
        atomic_store(&me->mapped, 1);
        atomic_fetch_add(&h->n_mapped, 1);
        shm_futex_wake(&h->n_mapped);
        /* Rank 0 decides within its own timeout; give it a little longer than that to
         * say so, so a late rank hears "gave up" rather than guessing. */
        double grace = timeout_ms / 1000.0 * 1.25 + 0.1;
        uint32_t ready = wait_change(&h->ready, 0, shm_now() + grace);
        if (ready != 1)
            st = host->fail(LOOM_ERR_TIMEOUT, "shm create: rank 0 %s", ready == 2
                            ? "gave up start-up: another rank did not join in time"
                            : "did not finish start-up in time");
    }
    if (st != LOOM_OK) {
        munmap(base, size);
        return st;
    }
    shm_family *f = host->alloc(sizeof *f);
    int *ident = host->alloc((size_t)world * sizeof(int));
    if (f == NULL || ident == NULL) {
        host->free(f);
        host->free(ident);
        munmap(base, size);
        return host->fail(LOOM_ERR_NOMEM, "shm create: out of memory");
    }
    pthread_mutex_init(&f->lock, NULL);
    f->world_base = base;
    f->world_size = size;
    f->bells = (shm_bell *)(base + shm_layout_for(world, chunk, mailbox, 1).bells);
    f->world_rank = rank;
    for (int q = 0; q < world; q++)
        ident[q] = q;
    st = comm_init(out, host, f, base, size, 0, rank, world, ident, timeout_ms, name);
    host->free(ident);
    if (st != LOOM_OK) {
        pthread_mutex_destroy(&f->lock);
        host->free(f);
        munmap(base, size);
    }
    return st;
}

/* ---- split -------------------------------------------------------------------------- */

static loom_status allgather(shm_comm *c, const void *send, void *recv, size_t count,
                             loom_dtype dt)
{
    loom_comm_request *r = NULL;
    loom_status st = shm_allgather_start(c, send, recv, count, dt, &r);
    return st != LOOM_OK ? st : shm_wait(c, r);
}

static void free_all(const loom_host *h, void *a, void *b, void *c, void *d, void *e)
{
    h->free(a);
    h->free(b);
    h->free(c);
    h->free(d);
    h->free(e);
}

loom_status shm_split(void *self, int color, int key, void **out)
{
    shm_comm *c = self;
    if (c == NULL || out == NULL)
        return c ? c->host->fail(LOOM_ERR_INVALID, "shm split: out is NULL") : LOOM_ERR_INVALID;
    *out = NULL;
    const loom_host *h = c->host;
    const int n = c->n;
    int32_t mine[2] = {color, key};
    int32_t *ck = h->alloc((size_t)n * 2 * sizeof(int32_t));
    int *members = h->alloc((size_t)n * sizeof(int)), *world_of = h->alloc((size_t)n * sizeof(int));
    char (*names)[SHM_NAME_MAX] = h->alloc((size_t)n * SHM_NAME_MAX);
    uint8_t *oks = h->alloc((size_t)n);
    if (!ck || !members || !world_of || !names || !oks) {
        /* Everyone else would wait for us in the allgather: say so, loudly. */
        free_all(h, ck, members, world_of, names, oks);
        return h->fail(LOOM_ERR_NOMEM, "shm split: out of memory (the other ranks will time out)");
    }
    loom_status st = allgather(c, mine, ck, 2, LOOM_DTYPE_I32);
    int gn = 0, me = -1;
    if (st == LOOM_OK && color >= 0) {
        /* Members in (key, parent rank) order: insertion sort, n is small. */
        for (int q = 0; q < n; q++) {
            if (ck[2 * q] != color)
                continue;
            int at = gn++;
            while (at > 0 && ck[2 * members[at - 1] + 1] > ck[2 * q + 1]) {
                members[at] = members[at - 1];
                at--;
            }
            members[at] = q;
        }
        for (int i = 0; i < gn; i++) {
            world_of[i] = c->world_of[members[i]];
            if (members[i] == c->rank)
                me = i;
        }
    }
    char name[SHM_NAME_MAX] = "";
    uint8_t *base = NULL;
    size_t size = 0;
    loom_status mine_st = LOOM_OK; /* this rank's own failure, message already recorded */
    if (st == LOOM_OK) {
        if (me == 0 && (mine_st = shm_seg_create(h, "split", gn, c->chunk, c->small,
                                                 c->mailbox, 0, name, &base, &size)) != LOOM_OK)
            name[0] = '\0'; /* tells the group: no segment */
        st = allgather(c, name, names, SHM_NAME_MAX, LOOM_DTYPE_U8);
    }
    if (st == LOOM_OK) {
        if (me > 0) {
            const char *leader = names[members[0]];
            if (leader[0] == '\0')
                mine_st = h->fail(LOOM_ERR_COMM, "shm split: rank %d, the first of color %d, "
                                  "could not create the group's segment", members[0], color);
            else if ((mine_st = shm_seg_open(h, "split", leader, gn, c->chunk, c->small,
                                             c->mailbox, 0, &base, &size)) == LOOM_OK)
                snprintf(name, sizeof name, "%s", leader);
        }
        uint8_t ok = mine_st == LOOM_OK;
        st = allgather(c, &ok, oks, 1, LOOM_DTYPE_U8);
    }
    if (me == 0 && name[0] != '\0')
        shm_unlink(name); /* every member has mapped it (or given up) by now */
    int bad = -1;
    for (int i = 0; st == LOOM_OK && i < gn && bad < 0; i++)
        if (!oks[members[i]])
            bad = members[i];
    if (st == LOOM_OK && mine_st == LOOM_OK && bad >= 0)
        st = h->fail(LOOM_ERR_COMM, "shm split: rank %d of color %d could not join the group "
                     "(see its log)", bad, color);
    if (st == LOOM_OK && mine_st != LOOM_OK)
        st = mine_st; /* keep this rank's own message */
    if (st == LOOM_OK && me >= 0) {
        shm_comm *child = NULL;
        st = comm_init(&child, h, c->fam, base, size, 1, me, gn, world_of, c->timeout_ms, name);
        if (st == LOOM_OK) {
            shm_layout L = shm_layout_for(gn, c->chunk, c->mailbox, 0);
            ((shm_ctl *)(base + L.ctl) + me)->pid = (int32_t)getpid();
            *out = child;
            base = NULL;
        }
    }
    if (base != NULL)
        munmap(base, size);
    free_all(h, ck, members, world_of, names, oks);
    return st;
}
