/* stop_signal.h — a graceful stop on SIGTERM, SIGINT or SIGUSR1 (preemption: Slurm and
 * Kubernetes send SIGTERM, Slurm's --signal SIGUSR1, a terminal SIGINT).
 *
 * While armed, the first of these signals only records its number (the handler sets a
 * flag, nothing else); the training loop reads it once per step — through the world's
 * per-step agreement (nonfinite.c), so every rank sees the same step's answer — finishes
 * that step, saves and exits with 128 + signo. A second signal while one is pending ends
 * the process at once, by the signal's default action. Disarmed (the default, and outside
 * loom.train's loop) the signals keep their default action: a recipe with a loop of its own
 * that never reads the flag would otherwise ignore them.
 *
 * A signal carrying LOOM_STOP_NOW in its sigqueue() value (loom launch sends one when
 * another rank failed: no collective save can follow) ends the process at once too.
 */
#ifndef LOOM_CORE_STOP_SIGNAL_H
#define LOOM_CORE_STOP_SIGNAL_H

#define LOOM_STOP_NOW 0x6c6f6f6d /* "loom" */

/* Install (armed = 1) or remove (0) the handlers; the pending signal is kept. */
void loom_stop_arm(int armed);

/* The first stop signal received while armed, or 0. */
int loom_stop_signal(void);

/* "SIGTERM", "SIGINT", "SIGUSR1" or "signal N". */
const char *loom_stop_signal_name(int sig);

#endif
