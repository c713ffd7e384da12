/* host.c — the loom_host services table every plugin receives.
 *
 * What: one static table (log, fail, alloc, free, rank, world) shared by all plugins; the
 * only way a plugin reaches the core, so a plugin links against nothing of ours.
 * What not: no per-plugin state. log has no "who is calling" argument, so the prefix names
 * the rank, not the plugin; plugins name themselves in their messages when it matters.
 * Invariants: fail() writes the same thread-local message loom_last_error() reads; alloc()
 * returns 64-byte-aligned zeroed memory that free() releases; rank/world are set before
 * plugins are created (loom_core_host_set_rank at start-up), never during a step.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_loader.h"
#include "status.h"

enum { HOST_ALIGN = 64 }; /* a cache line: what vectorised loops over fp32 shards want */

static void host_log(loom_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static loom_status host_fail(loom_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void *host_alloc(size_t bytes);
static void host_free(void *p);
static loom_status host_group(loom_group g, const struct loom_comm_ops **ops, void **comm, int *size);
static loom_status host_device_group(loom_group g, const struct loom_comm_ops **ops, void **comm,
                                     int *size);
static const struct loom_backend_ops *host_device_backend(void **self);

static loom_host host = {
    .size = sizeof(loom_host),
    .abi = LOOM_PLUGIN_ABI,
    .log = host_log,
    .fail = host_fail,
    .alloc = host_alloc,
    .free = host_free,
    .rank = 0,
    .world = 1,
    .group = host_group,
    .device_group = host_device_group,
    .device_backend = host_device_backend,
};

/* The mesh's groups, set by the core once its communicators exist. */
static const struct loom_comm_ops *group_ops;
static void *group_comm[4];
static int group_size[4] = {1, 1, 1, 1};

void loom_core_host_set_groups(const struct loom_comm_ops *ops, void *const comms[4],
                               const int sizes[4])
{
    group_ops = ops;
    for (int g = 0; g < 4; g++) {
        group_comm[g] = comms[g];
        group_size[g] = sizes[g];
    }
}

/* The groups for device memory (dist.h's loom_dist_device_open), while a device backend's
 * session holds them; none: device_group() is group(). */
static const struct loom_comm_ops *device_ops;
static void *device_comm[4];

static const struct loom_backend_ops *device_be; /* whose memory they carry */
static void *device_be_self;

void loom_core_host_set_device_groups(const struct loom_comm_ops *ops, void *const comms[4],
                                      const struct loom_backend_ops *be, void *be_self)
{
    device_ops = ops;
    for (int g = 0; g < 4; g++)
        device_comm[g] = ops ? comms[g] : NULL;
    device_be = ops ? be : NULL;
    device_be_self = ops ? be_self : NULL;
}

static const struct loom_backend_ops *host_device_backend(void **self)
{
    *self = device_be_self;
    return device_be;
}

static loom_status pick_group(const struct loom_comm_ops *gops, void *const comms[4], loom_group g,
                              const struct loom_comm_ops **ops, void **comm, int *size)
{
    if ((unsigned)g > LOOM_GROUP_PP)
        return loom_fail(LOOM_ERR_INVALID, "no mesh group %d (world, dp, tp, pp are 0..3)", (int)g);
    int single = group_size[g] <= 1 || !comms[g];
    *ops = single ? NULL : gops;
    *comm = single ? NULL : comms[g];
    *size = group_size[g];
    return LOOM_OK;
}

static loom_status host_group(loom_group g, const struct loom_comm_ops **ops, void **comm, int *size)
{
    return pick_group(group_ops, group_comm, g, ops, comm, size);
}

static loom_status host_device_group(loom_group g, const struct loom_comm_ops **ops, void **comm,
                                     int *size)
{
    if (device_ops)
        return pick_group(device_ops, device_comm, g, ops, comm, size);
    return host_group(g, ops, comm, size);
}

/* Debug lines are noise in a normal run; LOOM_DEBUG=1 turns them on. */
static int debug_enabled(void)
{
    const char *v = getenv("LOOM_DEBUG");
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

static void host_log(loom_log_level level, const char *fmt, ...)
{
    if (level == LOOM_LOG_DEBUG && !debug_enabled())
        return;
    /* One fprintf per line so lines from concurrent ranks/threads do not interleave
     * mid-line (stderr is unbuffered; a single write is the unit). */
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    const char *tag = level == LOOM_LOG_ERROR ? "error: " : level == LOOM_LOG_WARN ? "warning: " : "";
    size_t len = strlen(line);
    const char *nl = (len > 0 && line[len - 1] == '\n') ? "" : "\n";
    if (host.world > 1)
        fprintf(stderr, "loom[%d]: %s%s%s", host.rank, tag, line, nl);
    else
        fprintf(stderr, "loom: %s%s%s", tag, line, nl);
}

static loom_status host_fail(loom_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    loom_failv(st, fmt, ap);
    va_end(ap);
    return st;
}

static void *host_alloc(size_t bytes)
{
    /* Round up so the zeroed tail is ours too; refuse sizes that would wrap. */
    if (bytes > SIZE_MAX - HOST_ALIGN)
        return NULL;
    size_t rounded = (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
    if (rounded == 0)
        rounded = HOST_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, HOST_ALIGN, rounded) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

static void host_free(void *p) { free(p); }

const loom_host *loom_core_host(void) { return &host; }

void loom_core_host_set_rank(int rank, int world)
{
    host.rank = rank;
    host.world = world > 0 ? world : 1;
}
