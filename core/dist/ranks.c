/* ranks.c — rank/world from the environment, and the process's one joined rendezvous
 * (see ranks.h).
 *
 * What not: choosing a launcher's conventions beyond the three below; talking to Slurm/MPI.
 * Invariants: numbers are parsed whole (no trailing junk, no overflow); the first convention
 * whose rank variable is set decides, and its size variable must then be set too; after
 * loom_ranks_join, LOCAL_RANK holds the deciding convention's local rank.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/plugin_loader.h"
#include "ranks.h"
#include "base/status.h"

static loom_ranks joined = {.rank = 0, .world = 1, .addr = LOOM_RANKS_DEFAULT_ADDR,
                            .port = LOOM_RANKS_DEFAULT_PORT, .addr_defaulted = 1,
                            .timeout_ms = LOOM_RANKS_DEFAULT_TIMEOUT_MS, .source = "none"};
static loom_rendezvous *joined_rdv;

/* Parse env var `name` as a whole number in [lo, hi]; `what` says what it should be. */
static loom_status env_int(const char *name, int lo, int hi, const char *what, int *out)
{
    const char *s = getenv(name);
    char *end;
    errno = 0;
    long v = s && *s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end != '\0' || errno == ERANGE || v < lo || v > hi)
        return loom_fail(LOOM_ERR_INVALID, "%s='%s' is not %s", name, s ? s : "", what);
    *out = (int)v;
    return LOOM_OK;
}

typedef struct convention {
    const char *source, *rank, *size, *local;
} convention;

static const convention conventions[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

loom_status loom_ranks_from_env(loom_ranks *out)
{
    loom_ranks r = {.rank = 0, .world = 1, .local_rank = 0, .port = LOOM_RANKS_DEFAULT_PORT,
                    .addr_defaulted = 1, .timeout_ms = LOOM_RANKS_DEFAULT_TIMEOUT_MS,
                    .source = "none"};
    snprintf(r.addr, sizeof r.addr, "%s", LOOM_RANKS_DEFAULT_ADDR);
    for (size_t i = 0; i < sizeof conventions / sizeof conventions[0]; i++) {
        const convention *c = &conventions[i];
        int has_rank = getenv(c->rank) != NULL, has_size = getenv(c->size) != NULL;
        if (!has_rank && !has_size)
            continue;
        if (has_rank != has_size)
            return loom_fail(LOOM_ERR_INVALID, "%s is set but %s is not (%s sets both)",
                             has_rank ? c->rank : c->size, has_rank ? c->size : c->rank,
                             c->source);
        r.source = c->source;
        LOOM_TRY(env_int(c->size, 1, 1 << 20, "a world size (a whole number >= 1)", &r.world));
        LOOM_TRY(env_int(c->rank, 0, INT_MAX, "a rank (a whole number >= 0)", &r.rank));
        if (r.rank >= r.world)
            return loom_fail(LOOM_ERR_INVALID, "%s=%d is not below %s=%d (ranks count from 0)",
                             c->rank, r.rank, c->size, r.world);
        r.local_rank = r.rank;
        if (getenv(c->local)) {
            LOOM_TRY(env_int(c->local, 0, INT_MAX, "a local rank (a whole number >= 0)",
                             &r.local_rank));
            if (r.local_rank >= r.world)
                return loom_fail(LOOM_ERR_INVALID, "%s=%d is not below %s=%d", c->local,
                                 r.local_rank, c->size, r.world);
        }
        break;
    }
    const char *addr = getenv("MASTER_ADDR");
    if (addr) {
        if (!*addr || strlen(addr) >= sizeof r.addr || strpbrk(addr, " \t\n"))
            return loom_fail(LOOM_ERR_INVALID, "MASTER_ADDR='%.300s' is not a host name or "
                             "address (give rank 0's host, e.g. 127.0.0.1)", addr);
        snprintf(r.addr, sizeof r.addr, "%s", addr);
        r.addr_defaulted = 0;
    }
    if (getenv("MASTER_PORT"))
        LOOM_TRY(env_int("MASTER_PORT", 1, 65535, "a port number (1..65535)", &r.port));
    if (getenv("LOOM_RENDEZVOUS_TIMEOUT_MS"))
        LOOM_TRY(env_int("LOOM_RENDEZVOUS_TIMEOUT_MS", 1, INT_MAX / 2,
                         "a timeout in milliseconds (a whole number >= 1)", &r.timeout_ms));
    *out = r;
    return LOOM_OK;
}

loom_status loom_ranks_join(void)
{
    loom_ranks r;
    LOOM_TRY(loom_ranks_from_env(&r));
    loom_core_host_set_rank(r.rank, r.world);
    joined = r;
    /* The device rule (LOCAL_RANK % devices: the CUDA backend and nccl, device_select.c)
     * reads LOCAL_RANK; under mpirun or srun it is the launcher's own variable's value, so
     * ranks of one node land on different GPUs there too. */
    char local[16];
    snprintf(local, sizeof local, "%d", r.local_rank);
    if (strcmp(r.source, "none") != 0 && setenv("LOCAL_RANK", local, 1) != 0)
        return loom_fail(LOOM_ERR_INTERNAL, "setenv LOCAL_RANK=%s failed", local);
    return LOOM_OK;
}

/* The rendezvous opens when first needed (the recipe's first collective: the config check
 * or the communicator), so that the recipe's own comm_timeout can bound the wait for ranks
 * that never arrive. LOOM_RENDEZVOUS_TIMEOUT_MS (or comm_timeout= on the command line, which
 * sets it) wins over the recipe; with neither, the 300 s default, for ranks started by hand. */
loom_status loom_cli_rendezvous_open(int recipe_timeout_ms, loom_rendezvous **out)
{
    *out = joined_rdv;
    if (joined_rdv != NULL || joined.world <= 1)
        return LOOM_OK;
    if (recipe_timeout_ms > 0 && !getenv("LOOM_RENDEZVOUS_TIMEOUT_MS"))
        joined.timeout_ms = recipe_timeout_ms;
    loom_status st = loom_rendezvous_open(joined.addr, joined.port, joined.rank, joined.world,
                                          joined.timeout_ms, &joined_rdv);
    if (st != LOOM_OK && joined.addr_defaulted && joined.rank != 0 && st == LOOM_ERR_TIMEOUT) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        return loom_fail(st, "%s; MASTER_ADDR is not set, so %s is assumed, which only "
                         "reaches rank 0 on this machine", msg, LOOM_RANKS_DEFAULT_ADDR);
    }
    LOOM_TRY(st);
    *out = joined_rdv;
    return LOOM_OK;
}

void loom_ranks_leave(int ok)
{
    /* On failure a short linger only: long enough for the others to read a verdict rank 0
     * has just published (a config mismatch), short enough not to hold up the exit. */
    if (joined_rdv != NULL)
        loom_rendezvous_close(joined_rdv, ok ? joined.timeout_ms
                                             : joined.timeout_ms < 1000 ? joined.timeout_ms : 1000);
    joined_rdv = NULL;
}

const loom_ranks *loom_cli_ranks(void) { return &joined; }

loom_rendezvous *loom_cli_rendezvous(void) { return joined_rdv; }
