/* checksum.c — XXH64 with seed 0 (see checksum.h): four lanes over 32-byte stripes,
 * merged, then the tail in 8-, 4- and 1-byte steps, then the avalanche. The constants
 * and steps are the spec's. */
#include "checksum.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t read64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint64_t round64(uint64_t acc, uint64_t input)
{
    acc += input * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static uint64_t merge(uint64_t h, uint64_t v)
{
    h ^= round64(0, v);
    return h * P1 + P4;
}

static void stripe(uint64_t *v, const unsigned char *p)
{
    v[0] = round64(v[0], read64(p));
    v[1] = round64(v[1], read64(p + 8));
    v[2] = round64(v[2], read64(p + 16));
    v[3] = round64(v[3], read64(p + 24));
}

void loom_xxh64_init(loom_xxh64_state *s)
{
    memset(s, 0, sizeof *s);
    s->v[0] = P1 + P2;
    s->v[1] = P2;
    s->v[2] = 0;
    s->v[3] = 0 - P1;
}

void loom_xxh64_update(loom_xxh64_state *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    if (!n)
        return; /* data may be NULL then */
    s->total += n;
    if (s->buffered) {
        size_t take = 32 - s->buffered < n ? 32 - s->buffered : n;
        memcpy(s->buf + s->buffered, p, take);
        s->buffered += take;
        p += take;
        n -= take;
        if (s->buffered < 32)
            return;
        stripe(s->v, s->buf);
        s->buffered = 0;
    }
    uint64_t v[4] = {s->v[0], s->v[1], s->v[2], s->v[3]}; /* in registers */
    for (; n >= 32; p += 32, n -= 32)
        stripe(v, p);
    memcpy(s->v, v, sizeof v);
    memcpy(s->buf, p, n);
    s->buffered = n;
}

uint64_t loom_xxh64_digest(const loom_xxh64_state *s)
{
    uint64_t h;
    if (s->total >= 32) {
        h = rotl(s->v[0], 1) + rotl(s->v[1], 7) + rotl(s->v[2], 12) + rotl(s->v[3], 18);
        for (int i = 0; i < 4; i++)
            h = merge(h, s->v[i]);
    } else {
        h = P5;
    }
    h += s->total;
    const unsigned char *p = s->buf;
    size_t n = s->buffered;
    for (; n >= 8; p += 8, n -= 8)
        h = rotl(h ^ round64(0, read64(p)), 27) * P1 + P4;
    if (n >= 4) {
        uint32_t w;
        memcpy(&w, p, 4);
        h = rotl(h ^ (uint64_t)w * P1, 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n; p++, n--)
        h = rotl(h ^ *p * P5, 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    return h ^ (h >> 32);
}

uint64_t loom_xxh64(const void *data, size_t n)
{
    loom_xxh64_state s;
    loom_xxh64_init(&s);
    loom_xxh64_update(&s, data, n);
    return loom_xxh64_digest(&s);
}
