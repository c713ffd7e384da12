/* rendezvous_wire.h — the rendezvous protocol, shared by the client (rendezvous.c) and the
 * server (rendezvous_server.c). Private to those two files and their tests.
 *
 * Every integer is big-endian. A request is a 16-byte header then key then value:
 *   u8 op, u8 version, u16 zero, u32 arg, u32 key_len, u32 value_len
 * and is answered by an 8-byte header then a payload:
 *   u8 status, u8 zero[3], u32 len
 * Ops: HELLO (first on every connection; key = LOOM_RDV_MAGIC, arg = rank, value = u32 world),
 * SET (key, value), GET (key; arg = timeout in ms: answered when the key exists, or TIMEOUT).
 * Status OK carries the value (GET) or nothing; ERROR carries a message and the server then
 * closes the connection. One request in flight per connection.
 */
#ifndef LOOM_CORE_RENDEZVOUS_WIRE_H
#define LOOM_CORE_RENDEZVOUS_WIRE_H

#include <stdint.h>

#include "loom/loom.h"

#define LOOM_RDV_MAGIC "loom-rendezvous"
#define LOOM_RDV_VERSION 1
#define LOOM_RDV_REQ_HDR 16
#define LOOM_RDV_REP_HDR 8

enum { LOOM_RDV_HELLO = 'H', LOOM_RDV_SET = 'S', LOOM_RDV_GET = 'G' };
enum { LOOM_RDV_OK = 0, LOOM_RDV_TIMEOUT = 1, LOOM_RDV_ERROR = 2 };

static inline void loom_rdv_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline uint32_t loom_rdv_get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Milliseconds on a monotonic clock. */
int64_t loom_rdv_now_ms(void);

typedef struct loom_rdv_server loom_rdv_server;

/* Listen on addr:port (loopback: that address only; otherwise every interface of the
 * family) and serve a world of `world` ranks from a new thread. */
loom_status loom_rdv_server_start(const char *addr, int port, int world, loom_rdv_server **out);
/* Keep serving until no ranked client is connected or linger_ms passed, then stop. */
void loom_rdv_server_stop(loom_rdv_server *s, int linger_ms);

#endif
