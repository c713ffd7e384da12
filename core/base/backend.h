/* backend.h — one loaded kernel backend: its ops table and instance. */
#ifndef LOOM_CORE_BACKEND_H
#define LOOM_CORE_BACKEND_H

#include "loom/plugin/backend.h"

typedef struct loom_backend {
    const loom_backend_ops *ops;
    void *self;
} loom_backend;

/* Load loom-backend-<name>.so and start it with `threads` compute threads (0: all). */
loom_status loom_backend_open(const char *name, int threads, loom_backend *out);
void loom_backend_close(loom_backend *b);
/* 1 when the backend's buffers are device memory (its ops table has a stream and gives
 * one: the host cannot read them directly), 0 for host memory (the CPU backend). */
int loom_backend_device_memory(const loom_backend *b);
/* dst = src (n floats, both the backend's memory), bit for bit: memcpy on host memory; on a
 * device, which has no device-to-device copy op, dst filled with -0 (zero, then times -1)
 * and src accumulated onto it (-0 + x is x for every x, signed zeros included). */
void loom_backend_copy_bits(const loom_backend *b, float *dst, const float *src, size_t n);

#endif
