/* ranks.h — which rank this process is, and joining the job's rendezvous for `loom run`.
 *
 * What: rank/world/local rank and rank 0's address from the environment, in this order of
 * precedence:
 *   RANK, WORLD_SIZE, LOCAL_RANK                            (torchrun, loom launch)
 *   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK                (Open MPI's mpirun)
 *   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID               (srun)
 * plus MASTER_ADDR / MASTER_PORT for every convention (default 127.0.0.1:29500). None set:
 * rank 0 of 1. A missing local rank defaults to the rank (one node).
 * What not: device selection, communicators (they get the rendezvous from loom_cli_rendezvous).
 * Invariants: values are validated before use; a refusal names the variable and what would be
 * right (RANK=4 is not below WORLD_SIZE=4 ...). The joined state is process-global: one job
 * per process, joined once by cmd_run before the recipe runs (the rendezvous opened at the
 * recipe's first collective) and left after it.
 */
#ifndef LOOM_CORE_RANKS_H
#define LOOM_CORE_RANKS_H

#include "rendezvous.h"

#define LOOM_RANKS_DEFAULT_ADDR "127.0.0.1"
#define LOOM_RANKS_DEFAULT_PORT 29500
/* The start-up/rendezvous timeout when LOOM_RENDEZVOUS_TIMEOUT_MS is not set. */
#define LOOM_RANKS_DEFAULT_TIMEOUT_MS 300000

typedef struct loom_ranks {
    int rank, world, local_rank;
    char addr[256];
    int port;
    int addr_defaulted; /* MASTER_ADDR was not set */
    int timeout_ms;     /* LOOM_RENDEZVOUS_TIMEOUT_MS or the default */
    const char *source; /* "torchrun", "Open MPI", "Slurm" or "none" */
} loom_ranks;

/* Parse the environment (see above). LOOM_ERR_INVALID names the bad variable. */
loom_status loom_ranks_from_env(loom_ranks *out);

/* For `loom run`: parse the environment and tell the plugin host (loom_core_host_set_rank);
 * with a launcher's variables, set LOCAL_RANK to its local rank (OMPI_COMM_WORLD_LOCAL_RANK,
 * SLURM_LOCALID, or the rank where none is given), the variable the GPU choice reads.
 * The rendezvous itself opens later, at loom_cli_rendezvous_open. */
loom_status loom_ranks_join(void);
/* The joined rendezvous, opened on the first call when world > 1 (waits for every rank,
 * bounded by LOOM_RENDEZVOUS_TIMEOUT_MS if set, else recipe_timeout_ms if > 0, else the
 * default); *out is NULL when world == 1. Later calls return the same one. */
loom_status loom_cli_rendezvous_open(int recipe_timeout_ms, loom_rendezvous **out);
/* After the recipe: close the rendezvous. On rank 0 the server keeps serving until the other
 * ranks have left, bounded by the timeout when ok, by 1 s when not (long enough for them to
 * read a verdict it has just published, short enough not to hold up a failing job). */
void loom_ranks_leave(int ok);
/* What join found (rank 0 of 1 before join). */
const loom_ranks *loom_cli_ranks(void);
/* The rendezvous if it is open, else NULL (world == 1, or no collective yet). */
loom_rendezvous *loom_cli_rendezvous(void);

/* lua_ranks.c: set core.rank, core.world, core.local_rank and core.check_same_config into
 * the table on top of the stack (the loom.core module). */
struct lua_State;
void loom_lua_open_ranks(struct lua_State *L);

#endif
