/* clock.h — the one monotonic clock the core times things with (steps, communication,
 * timeouts, benchmarks). */
#ifndef LOOM_CORE_CLOCK_H
#define LOOM_CORE_CLOCK_H

#include <time.h>

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
static inline double loom_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double loom_now_ms(void) { return loom_now_s() * 1e3; }

/* This process's CPU time in ms (every thread; CLOCK_PROCESS_CPUTIME_ID): what a piece of
 * work cost, whatever else shares the cores. */
static inline double loom_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#endif
