/* rendezvous.h — the bootstrap store: a small TCP key-value store served by rank 0.
 *
 * What: rank 0 serves the store at MASTER_ADDR:MASTER_PORT from one poll()-driven thread;
 * every rank (rank 0 included) is a client with one connection. Communicators exchange what
 * they need through it (loom_store: set, and get that waits until the key exists); it also
 * gives barriers and the "every rank runs the same configuration" check.
 * What not: a collective library. Keys are never deleted; values are small (<= 1 MiB).
 *
 * Invariants:
 *  - open() returns only after every rank has connected (the start-up barrier); on a timeout
 *    every rank that got that far fails with the ranks that never arrived:
 *      rendezvous: ranks 2, 3 of 4 did not arrive at 127.0.0.1:29500 within 5000 ms
 *  - Clients retry connecting until the deadline (rank 0 may start later).
 *  - Keys are 1..256 bytes, values 0..1 MiB; anything else is refused (client side before
 *    sending, server side for a stray client, which is then disconnected; the server never
 *    crashes on bad input).
 *  - When rank 0's process dies, a waiting get fails at once naming rank 0; a dead peer that
 *    keeps its socket open is bounded by the timeout.
 *  - Barriers and check_same are collective: every rank calls them in the same order (SPMD);
 *    each call gets the next sequence number so names may repeat.
 *  - A handle may be used from several threads: one request at a time per handle.
 */
#ifndef LOOM_CORE_RENDEZVOUS_H
#define LOOM_CORE_RENDEZVOUS_H

#include <stdint.h>

#include "loom/plugin/comm.h"

#define LOOM_RENDEZVOUS_MAX_KEY 256
#define LOOM_RENDEZVOUS_MAX_VALUE (1u << 20)

typedef struct loom_rendezvous loom_rendezvous;

/* Join the job: rank 0 starts the server on addr:port (a loopback addr binds only to it,
 * any other binds every interface); every rank connects, says hello (rank, world: a world
 * that differs from rank 0's or a rank claimed twice is refused), and waits at the start-up
 * barrier. timeout_ms bounds all of it, and is the default bound of later requests. */
loom_status loom_rendezvous_open(const char *addr, int port, int rank, int world, int timeout_ms,
                                 loom_rendezvous **out);

/* The store view for communicators; lives as long as r. Thread-safe. */
const loom_store *loom_rendezvous_store(loom_rendezvous *r);

int loom_rendezvous_rank(const loom_rendezvous *r);
int loom_rendezvous_world(const loom_rendezvous *r);

/* Wait until every rank has reached the barrier `name`; a timeout names the missing ranks:
 *   rendezvous: ranks 2, 3 of 4 did not arrive at barrier 'init' within 5000 ms */
loom_status loom_rendezvous_barrier(loom_rendezvous *r, const char *name, int timeout_ms);

/* Every rank publishes hash; rank 0 compares them all and publishes a verdict; on a mismatch
 * every rank fails (LOOM_ERR_INVALID) with the same message naming the ranks that differ:
 *   ranks 1, 3 run a different recipe than rank 0 (config hash 5f2a3b10… vs 91c04e7d…)
 * (what = "recipe"; the first hash is the first differing rank's, the second rank 0's). */
loom_status loom_rendezvous_check_same(loom_rendezvous *r, const char *what, uint64_t hash,
                                       int timeout_ms);

/* Leave. On rank 0 the server keeps serving until every other rank has disconnected or
 * linger_ms has passed (0: stop at once). A failed open lingers 1 s on rank 0 so that the
 * ranks that did arrive can read its verdict. NULL is fine. */
void loom_rendezvous_close(loom_rendezvous *r, int linger_ms);

/* 64-bit FNV-1a of n bytes, finalised with MurmurHash3's fmix64 (so a printed prefix
 * changes with any byte): the hash check_same expects for a configuration string. */
uint64_t loom_rendezvous_hash(const void *data, size_t n);

#endif
