/* launch.h — `loom launch -n N RECIPE [key=value ...]`: run N local ranks of a recipe.
 *
 * Forks N children that exec this same program as `loom run RECIPE ...` with RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port) and LOOM_JOB_ID
 * set; prefixes every line they print with "[rank k] " (rank 0's stdout is passed through
 * untouched, so its progress line redraws as in a one-rank run); forwards SIGINT/SIGTERM/
 * SIGHUP; when a rank fails, stops the others (SIGTERM, SIGKILL after 2 s) and says which:
 *   loom launch: rank 2 was killed by signal 9 (SIGKILL); stopped the other 3 ranks
 * Afterwards it removes any /dev/shm/loom-<LOOM_JOB_ID>* left behind (LOOM_JOB_ID is 16 hex
 * digits, so one job's prefix never matches another's).
 * A top-level command: it prints its verdicts and returns the program's exit status.
 */
#ifndef LOOM_CORE_LAUNCH_H
#define LOOM_CORE_LAUNCH_H

/* argv: the arguments after "launch". Returns 0 when every rank exited 0; otherwise the
 * failed rank's exit status, or 128 + the signal that killed it (or that stopped the job). */
int loom_launch_main(int argc, char **argv);

#endif
