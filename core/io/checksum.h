/* checksum.h — XXH64, the checksum of checkpoint files: xxHash's 64-bit hash with seed 0
 * (Yann Collet; spec: github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md), written
 * out here so loom needs no library for it. Any xxh64 tool (xxhsum -H1, Python's
 * xxhash.xxh64) gives the same digest.
 *
 * What: one-shot and streaming forms (the streaming one lets a writer hash what it writes
 * in pieces of any size). What not: no XXH3, no seeds other than 0, not cryptographic.
 * Invariants: little-endian input words (the host is little-endian, see safetensors.c);
 * streaming any split of the same bytes gives the one-shot digest.
 */
#ifndef LOOM_CORE_CHECKSUM_H
#define LOOM_CORE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

typedef struct loom_xxh64 {
    uint64_t v[4];             /* the four lane accumulators */
    uint64_t total;            /* bytes hashed so far */
    unsigned char buf[32];     /* a partial 32-byte stripe */
    size_t buffered;
} loom_xxh64_state;

void loom_xxh64_init(loom_xxh64_state *s);
void loom_xxh64_update(loom_xxh64_state *s, const void *data, size_t n);
uint64_t loom_xxh64_digest(const loom_xxh64_state *s);
uint64_t loom_xxh64(const void *data, size_t n);

#endif
