/* dist.c — the mesh and its communicators (see dist.h). Process-wide: one mesh per run. */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/plugin_loader.h"
#include "base/status.h"
#include "dist_staged.h"
#include "flight.h"

static const loom_comm_ops *comm_ops;
static void *groups[4]; /* world, dp, tp, pp */
static char host_comm_name[32]; /* the host groups' plugin */
static int device_wait = -1;    /* loom_dist_set_device_wait: -1 leaves the comm's default */

void loom_dist_set_device_wait(int on) { device_wait = on < 0 ? -1 : on != 0; }

loom_status loom_mesh_make(int rank, int world, int dp, int tp, int pp, loom_mesh *out)
{
    if (dp < 1 || tp < 1 || pp < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "mesh dp=%d tp=%d pp=%d: each must be at least 1", dp, tp, pp);
    if (dp * tp * pp != world)
        LOOM_FAIL(LOOM_ERR_INVALID, "mesh dp=%d x tp=%d x pp=%d = %d ranks, but the world has %d "
                  "(launch with loom launch -n %d, or change the mesh)", dp, tp, pp, dp * tp * pp,
                  world, dp * tp * pp);
    out->dp = dp;
    out->tp = tp;
    out->pp = pp;
    out->tp_rank = rank % tp;
    out->dp_rank = (rank / tp) % dp;
    out->pp_rank = rank / (tp * dp);
    return LOOM_OK;
}

/* dist.h: a mailbox for two messages of p2p_bytes (16-byte header each, shm_p2p.c), in
 * whole pages; the plugin's default when that is larger. shm reserves world x world
 * mailboxes in /dev/shm (shm_seg.c), so together they stay within 64 MiB past the default:
 * 16 MiB each at 2 ranks, 1 MiB at 8; a larger message still streams through. */
static loom_status size_mailbox(loom_plugin_config *cfg, size_t p2p_bytes, int world)
{
    const loom_config_value *v = loom_config_get(cfg, "mailbox_bytes");
    if (!v || !p2p_bytes || world < 2)
        return LOOM_OK;
    size_t cap = ((size_t)64 << 20) / ((size_t)world * (size_t)world) & ~(size_t)4095;
    size_t want = p2p_bytes > cap / 2 ? cap : (2 * (p2p_bytes + 64) + 4095) & ~(size_t)4095;
    if ((double)want <= v->number)
        return LOOM_OK;
    return loom_config_set_number(cfg, "mailbox_bytes", (double)want);
}

/* The recipe's settings, resolved into a config for plugin p. */
static loom_status plugin_view(const loom_plugin *p, size_t p2p_bytes, int world,
                               loom_plugin_config *cfg)
{
    LOOM_TRY(loom_config_init(cfg, p->desc));
    LOOM_TRY(size_mailbox(cfg, p2p_bytes, world));
    return loom_config_finish(cfg);
}

static loom_status load_comm(const char *name, const loom_plugin **out)
{
    LOOM_TRY(loom_plugin_load(LOOM_KIND_COMM, name, out));
    const loom_plugin *p = *out;
    if (p->desc->probe) {
        char reason[256] = "";
        if (!p->desc->probe(reason, sizeof reason))
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "comm '%s' is not usable here: %s", name, reason);
    }
    return LOOM_OK;
}

/* The world of plugin ops through store (device: a backend stream or NULL), split into the
 * mesh's dp, tp and pp groups: g = {world, dp, tp, pp}. On failure nothing is left. */
static loom_status join_and_split(const loom_comm_ops *ops, const loom_config *view,
                                  const loom_store *store, int rank, int world,
                                  const loom_mesh *m, int timeout_ms, void *device, void *g[4])
{
    for (int i = 0; i < 4; i++)
        g[i] = NULL;
    LOOM_TRY(ops->create(loom_core_host(), view, store, rank, world, timeout_ms, device, &g[0]));
    /* Same color = same group; keys order the ranks within it. */
    loom_status st = ops->split(g[0], m->pp_rank * m->tp + m->tp_rank, m->dp_rank, &g[1]);
    if (st == LOOM_OK)
        st = ops->split(g[0], m->pp_rank * m->dp + m->dp_rank, m->tp_rank, &g[2]);
    if (st == LOOM_OK)
        st = ops->split(g[0], m->dp_rank * m->tp + m->tp_rank, m->pp_rank, &g[3]);
    if (st != LOOM_OK)
        for (int i = 3; i >= 0; i--)
            if (g[i]) {
                ops->destroy(g[i]);
                g[i] = NULL;
            }
    return st;
}

static const char *const group_names[4] = {"world", "dp", "tp", "pp"};

/* The world ranks of this rank's group `which` (0 world, 1 dp, 2 tp, 3 pp), in group order:
 * member k is the mesh coordinate of that group set to k. Returns the group's size. */
static int group_members(const loom_mesh *m, int world, int which, int *members)
{
    int size = which == 0 ? world : which == 1 ? m->dp : which == 2 ? m->tp : m->pp;
    for (int k = 0; k < size; k++) {
        int pp = which == 3 ? k : m->pp_rank, dp = which == 1 ? k : m->dp_rank,
            tp = which == 2 ? k : m->tp_rank;
        members[k] = which == 0 ? k : (pp * m->dp + dp) * m->tp + tp;
    }
    return size;
}

/* A device communicator's (nccl) settings, kept from init for loom_dist_device_open. */
static struct {
    const loom_plugin *plugin; /* NULL: the comm is a host one */
    loom_plugin_config cfg;
    const loom_store *store;
    int rank, world, timeout_ms;
    loom_mesh mesh;
} later;

loom_status loom_dist_init(const char *comm_name, const char *host_comm, const loom_store *store,
                           int rank, int world, const loom_mesh *m, int timeout_ms,
                           size_t p2p_bytes)
{
    const loom_plugin *p;
    LOOM_TRY(load_comm(comm_name, &p));
    const loom_comm_ops *ops = p->desc->ops;
    if (loom_comm_flags(ops) & LOOM_COMM_DEVICE_MEMORY) {
        /* nccl takes device memory only: the host buffers get a communicator of their own */
        const char *host_name = host_comm ? host_comm : "shm";
        const loom_plugin *hp;
        LOOM_TRY(load_comm(host_name, &hp));
        if (loom_comm_flags(hp->desc->ops) & LOOM_COMM_DEVICE_MEMORY)
            LOOM_FAIL(LOOM_ERR_INVALID, "host_comm = \"%s\" takes device memory only; the host "
                      "communicator beside comm = \"%s\" must carry host memory (\"shm\" on "
                      "one node, \"mpi\" across nodes)", host_name, comm_name);
        LOOM_TRY(loom_config_init(&later.cfg, p->desc));
        if (device_wait >= 0)
            LOOM_TRY(loom_config_set_boolean(&later.cfg, "device_wait", device_wait));
        LOOM_TRY(loom_config_finish(&later.cfg));
        later.plugin = p;
        later.store = store;
        later.rank = rank;
        later.world = world;
        later.timeout_ms = timeout_ms;
        later.mesh = *m;
        p = hp;
        ops = hp->desc->ops;
    } else if (host_comm && strcmp(host_comm, comm_name) != 0) {
        LOOM_FAIL(LOOM_ERR_INVALID, "host_comm = \"%s\" goes beside a communicator that takes "
                  "device memory only (comm = \"nccl\"); comm = \"%s\" carries host memory "
                  "itself, so leave host_comm out", host_comm, comm_name);
    }
    if (device_wait == 1 && !later.plugin)
        LOOM_FAIL(LOOM_ERR_INVALID, "device_wait = true goes beside a communicator that takes "
                  "device memory (comm = \"nccl\": the backend's stream waits on each "
                  "operation); comm = \"%s\" carries host memory, whose waits always block the "
                  "host, so leave device_wait out", comm_name);
    snprintf(host_comm_name, sizeof host_comm_name, "%s", p->desc->name);
    loom_plugin_config cfg;
    LOOM_TRY(plugin_view(p, p2p_bytes, world, &cfg));
    loom_config view = loom_config_view(&cfg);
    void *g[4];
    loom_status st = join_and_split(ops, &view, store, rank, world, m, timeout_ms, NULL, g);
    if (st != LOOM_OK)
        return st;
    /* Every group goes out through the flight recorder, so whoever communicates (core or
     * plugin) is recorded, whatever the comm plugin. */
    int sizes[4] = {world, m->dp, m->tp, m->pp};
    int *members = malloc((size_t)world * sizeof *members);
    if (!members)
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    int wrapped = 0;
    for (; wrapped < 4 && st == LOOM_OK; wrapped++) {
        int n = group_members(m, world, wrapped, members);
        void *inner = g[wrapped];
        if (!inner)
            continue;
        g[wrapped] = NULL; /* the wrapper owns it now, and destroys it if wrapping fails */
        st = loom_flight_wrap(ops, inner, group_names[wrapped], members, n, &g[wrapped]);
    }
    free(members);
    const loom_comm_ops *fops = loom_flight_ops();
    if (st != LOOM_OK) {
        for (int i = 3; i >= 0; i--)
            if (g[i])
                (i < wrapped ? fops : ops)->destroy(g[i]);
        return st;
    }
    comm_ops = fops;
    for (int i = 0; i < 4; i++)
        groups[i] = g[i];
    loom_core_host_set_groups((const struct loom_comm_ops *)fops, groups, sizes);
    return LOOM_OK;
}

void *loom_dist_world(const loom_comm_ops **ops)
{
    *ops = comm_ops;
    return groups[0];
}

/* --- the groups for device memory (dist.h) ------------------------------------------ */

static struct {
    int open;
    const loom_comm_ops *ops; /* the device communicator's, or dist_staged's */
    void *g[4];
    const char *kind;
    char kind_buf[96];
} dev;

/* The device comm's groups g through the flight recorder, as "<comm>-world", "<comm>-dp", ...
 * beside the host groups of the same members (their plugin communicator carries debug
 * mode's descriptors, which NCCL cannot). On failure g is destroyed. */
static loom_status record_device_groups(const loom_comm_ops *ops, const char *comm, void *g[4])
{
    int *members = malloc((size_t)later.world * sizeof *members);
    loom_status st = members ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    int i = 0;
    for (; i < 4 && st == LOOM_OK; i++) {
        char name[16];
        snprintf(name, sizeof name, "%.4s-%s", comm, group_names[i]);
        int n = group_members(&later.mesh, later.world, i, members);
        void *inner = g[i];
        g[i] = NULL; /* the wrapper owns it now, and destroys it if wrapping fails */
        st = loom_flight_wrap_device(ops, inner, name, members, n, groups[i], &g[i]);
    }
    free(members);
    if (st != LOOM_OK)
        for (int k = 3; k >= 0; k--)
            if (g[k])
                (k < i ? loom_flight_ops() : ops)->destroy(g[k]);
    return st;
}

loom_status loom_dist_device_open(loom_backend *be)
{
    if (!comm_ops || !groups[0] || !loom_backend_device_memory(be))
        return LOOM_OK; /* one rank, or host memory: group() serves both */
    if (dev.open)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "a second session on a device backend while one holds "
                  "the device communicator: one device session at a time with more than one "
                  "rank (destroy the first)");
    void *g[4] = {NULL, NULL, NULL, NULL};
    const loom_comm_ops *ops;
    if (later.plugin) {
        /* After the backend picked the GPU (LOCAL_RANK % devices, device_select.c) and made
         * its stream: NCCL's communication stream waits on it, so every collective is
         * ordered after the kernels that wrote its buffers. */
        ops = later.plugin->desc->ops;
        loom_config view = loom_config_view(&later.cfg);
        LOOM_TRY(join_and_split(ops, &view, later.store, later.rank, later.world, &later.mesh,
                                later.timeout_ms, be->ops->stream(be->self), g));
        LOOM_TRY(record_device_groups(ops, later.plugin->desc->name, g));
        ops = loom_flight_ops();
        snprintf(dev.kind_buf, sizeof dev.kind_buf, "%s on the backend's stream, host buffers "
                 "over %s", later.plugin->desc->name, host_comm_name);
    } else {
        LOOM_TRY(loom_dist_staged_wrap(comm_ops, groups, be, g));
        ops = loom_dist_staged_ops();
        snprintf(dev.kind_buf, sizeof dev.kind_buf, "%s, staged through host memory",
                 host_comm_name);
    }
    dev.ops = ops;
    for (int i = 0; i < 4; i++)
        dev.g[i] = g[i];
    dev.kind = dev.kind_buf;
    dev.open = 1;
    loom_core_host_set_device_groups(ops, dev.g, be->ops, be->self);
    return LOOM_OK;
}

void loom_dist_device_close(void)
{
    if (!dev.open)
        return;
    loom_core_host_set_device_groups(NULL, dev.g, NULL, NULL);
    for (int i = 3; i >= 0; i--)
        if (dev.g[i])
            dev.ops->destroy(dev.g[i]);
    memset(&dev, 0, sizeof dev);
}

const char *loom_dist_device_kind(void) { return dev.open ? dev.kind : NULL; }

const char *loom_dist_device_comm(void) { return later.plugin ? later.plugin->desc->name : NULL; }

void *loom_dist_device_world(const loom_comm_ops **ops)
{
    *ops = dev.open ? dev.ops : NULL;
    return dev.open ? dev.g[0] : NULL;
}

void loom_dist_shutdown(void)
{
    loom_dist_device_close();
    later.plugin = NULL;
    device_wait = -1;
    void *none[4] = {NULL, NULL, NULL, NULL};
    int ones[4] = {1, 1, 1, 1};
    loom_core_host_set_groups(NULL, none, ones);
    for (int i = 3; i >= 0; i--)
        if (comm_ops && groups[i])
            comm_ops->destroy(groups[i]);
    for (int i = 0; i < 4; i++)
        groups[i] = NULL;
    comm_ops = NULL;
}
