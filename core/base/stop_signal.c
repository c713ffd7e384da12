/* stop_signal.c — the flag a stop signal sets, and its handlers (see stop_signal.h).
 *
 * Invariants: the handler is async-signal-safe — it stores to a volatile sig_atomic_t, or
 * (second signal, or LOOM_STOP_NOW) restores the default action and re-raises, both on
 * POSIX's list of safe calls. Nothing here allocates or locks.
 */
#include "stop_signal.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t pending;
static const int stop_signals[] = {SIGTERM, SIGINT, SIGUSR1};

static void on_stop_signal(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    int now = info && info->si_code == SI_QUEUE && info->si_value.sival_int == LOOM_STOP_NOW;
    if (pending || now) { /* a second signal: the default action, at once */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    pending = sig;
}

void loom_stop_arm(int armed)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (armed) {
        sa.sa_sigaction = on_stop_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
    } else {
        sa.sa_handler = SIG_DFL;
    }
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        sigaction(stop_signals[i], &sa, NULL);
}

int loom_stop_signal(void) { return pending; }

const char *loom_stop_signal_name(int sig)
{
    static char other[32];
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: snprintf(other, sizeof other, "signal %d", sig); return other;
    }
}
