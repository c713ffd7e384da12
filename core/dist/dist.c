/* dist.c — the mesh and its communicators (see dist.h). Process-wide: one mesh per run. */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/config.h"
#include "base/plugin_loader.h"
#include "base/status.h"
#include "flight.h"

static const loom_comm_ops *comm_ops;
static void *groups[4]; /* world, dp, tp, pp */

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

loom_status loom_dist_init(const char *comm_name, const loom_store *store, int rank, int world,
                           const loom_mesh *m, int timeout_ms, size_t p2p_bytes)
{
    const loom_plugin *p;
    LOOM_TRY(loom_plugin_load(LOOM_KIND_COMM, comm_name, &p));
    if (p->desc->probe) {
        char reason[256] = "";
        if (!p->desc->probe(reason, sizeof reason))
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "comm '%s' is not usable here: %s", comm_name, reason);
    }
    loom_plugin_config cfg;
    LOOM_TRY(loom_config_init(&cfg, p->desc));
    LOOM_TRY(size_mailbox(&cfg, p2p_bytes, world));
    LOOM_TRY(loom_config_finish(&cfg));
    loom_config view = loom_config_view(&cfg);
    const loom_comm_ops *ops = p->desc->ops;
    void *world_comm = NULL;
    LOOM_TRY(ops->create(loom_core_host(), &view, store, rank, world, timeout_ms, NULL, &world_comm));
    void *g[4] = {world_comm, NULL, NULL, NULL};
    /* Same color = same group; keys order the ranks within it. */
    loom_status st = ops->split(world_comm, m->pp_rank * m->tp + m->tp_rank, m->dp_rank, &g[1]);
    if (st == LOOM_OK)
        st = ops->split(world_comm, m->pp_rank * m->dp + m->dp_rank, m->tp_rank, &g[2]);
    if (st == LOOM_OK)
        st = ops->split(world_comm, m->dp_rank * m->tp + m->tp_rank, m->pp_rank, &g[3]);
    if (st != LOOM_OK) {
        for (int i = 3; i >= 0; i--)
            if (g[i])
                ops->destroy(g[i]);
        return st;
    }
    /* Every group goes out through the flight recorder, so whoever communicates (core or
     * plugin) is recorded, whatever the comm plugin. */
    int sizes[4] = {world, m->dp, m->tp, m->pp};
    static const char *const names[4] = {"world", "dp", "tp", "pp"};
    int *members = malloc((size_t)world * sizeof *members);
    if (!members)
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    int wrapped = 0;
    for (; wrapped < 4 && st == LOOM_OK; wrapped++) {
        /* Group member k's world rank: the mesh coordinate of this group set to k. */
        for (int k = 0; k < sizes[wrapped]; k++) {
            int pp = wrapped == 3 ? k : m->pp_rank, dp = wrapped == 1 ? k : m->dp_rank,
                tp = wrapped == 2 ? k : m->tp_rank;
            members[k] = wrapped == 0 ? k : (pp * m->dp + dp) * m->tp + tp;
        }
        void *inner = g[wrapped];
        if (!inner)
            continue;
        g[wrapped] = NULL; /* the wrapper owns it now, and destroys it if wrapping fails */
        st = loom_flight_wrap(ops, inner, names[wrapped], members, sizes[wrapped], &g[wrapped]);
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

void loom_dist_shutdown(void)
{
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
