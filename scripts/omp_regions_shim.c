/* omp_regions_shim.c — an LD_PRELOAD shim for scripts/omp-regions: wraps libgomp's
 * GOMP_parallel (every `omp parallel` of the backend, the optimizer and OpenBLAS's OpenMP
 * build) and keeps, per region function: regions, wall ms, each thread's CPU ms inside
 * the function (threads 0 and 1; more are added to 1), the sum of the larger of the two,
 * the sum of their differences, the worker's start latency, the master's CPU since the
 * last region (a serial section, charged to the region that follows), and two counts
 * that a loaded machine does not change: "cold forks", multi-thread regions entered after
 * more than spin_ms of master CPU since the last multi-thread one (on a quiet machine the
 * worker has given up libgomp's bounded spin, GOMP_SPINCOUNT=1000 at ~28 ns a PAUSE on
 * Zen 5, and needs a futex wake-up), and "cold joins", regions whose threads' CPU differ
 * by more than that. Written at exit to $SHIM_OUT. Top-level regions only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*gp_t)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*tn_t)(void);
static gp_t real;
static tn_t tnum;
#define NF 1024
#define MT 4
static void *fns[NF];
static char names[NF][160];
static long cnt[NF];
static double wall[NF], w[NF][MT], wmax[NF], imb[NF], lat[NF], serial[NF];
static double last_exit_cpu = -1, last_multi_exit_cpu = -1;
static long coldfork[NF], coldjoin[NF];
static double spin_ms = 0.028;
static int depth;

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6; /* ms */
}

typedef struct {
    void (*fn)(void *);
    void *data;
    double t0;
    double cpu[MT], start[MT];
} tramp;

static void run(void *p)
{
    tramp *t = p;
    int id = tnum();
    double s = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    t->fn(t->data);
    double c1 = now(CLOCK_THREAD_CPUTIME_ID);
    if (id < MT) {
        t->cpu[id] = c1 - c0;
        t->start[id] = s;
    }
}

static void dump(void)
{
    FILE *f = fopen(getenv("SHIM_OUT") ? getenv("SHIM_OUT") : "omp_regions.txt", "w");
    for (int i = 0; i < NF; i++)
        if (fns[i])
            fprintf(f, "%ld %.4f %.4f %.4f %.4f %.4f %.4f %.4f %ld %ld %s\n", cnt[i], wall[i], w[i][0],
                    w[i][1], wmax[i], imb[i], lat[i], serial[i], coldfork[i], coldjoin[i], names[i]);
    fclose(f);
}

static int slot(void *fn)
{
    unsigned h = ((unsigned long)fn >> 4) % NF;
    while (fns[h] && fns[h] != fn)
        h = (h + 1) % NF;
    if (!fns[h]) {
        Dl_info d;
        if (dladdr(fn, &d))
            snprintf(names[h], sizeof names[h], "%s %lx", d.dli_fname,
                     (unsigned long)((char *)fn - (char *)d.dli_fbase));
        else
            strcpy(names[h], "?");
        fns[h] = fn;
    }
    return h;
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned n, unsigned flags)
{
    if (!real) {
        void *g = dlopen("libgomp.so.1", RTLD_LAZY);
        real = (gp_t)dlsym(RTLD_NEXT, "GOMP_parallel");
        if (!real)
            real = (gp_t)dlsym(g, "GOMP_parallel");
        tnum = (tn_t)dlsym(g, "omp_get_thread_num");
        atexit(dump);
    }
    if (depth) { /* nested (or from a worker): not measured */
        real(fn, data, n, flags);
        return;
    }
    depth = 1;
    double c = now(CLOCK_THREAD_CPUTIME_ID);
    int h = slot((void *)fn);
    if (last_exit_cpu >= 0)
        serial[h] += c - last_exit_cpu;
    int multi = n != 1;
    if (multi && last_multi_exit_cpu >= 0 && c - last_multi_exit_cpu > spin_ms)
        coldfork[h]++;
    tramp t = {fn, data, now(CLOCK_MONOTONIC), {0}, {0}};
    real(run, &t, n, flags);
    double e = now(CLOCK_MONOTONIC);
    cnt[h]++;
    wall[h] += e - t.t0;
    double mx = 0;
    for (int i = 0; i < MT; i++) {
        w[h][i < 2 ? i : 1] += t.cpu[i];
        mx = t.cpu[i] > mx ? t.cpu[i] : mx;
    }
    wmax[h] += mx;
    imb[h] += t.cpu[0] > t.cpu[1] ? t.cpu[0] - t.cpu[1] : t.cpu[1] - t.cpu[0];
    if (t.start[1] > 0)
        lat[h] += t.start[1] - t.t0;
    if (multi && t.start[1] > 0 && imb[h] >= 0 && (t.cpu[0] > t.cpu[1] ? t.cpu[0] - t.cpu[1] : t.cpu[1] - t.cpu[0]) > spin_ms)
        coldjoin[h]++;
    depth = 0;
    last_exit_cpu = now(CLOCK_THREAD_CPUTIME_ID);
    if (multi)
        last_multi_exit_cpu = last_exit_cpu;
}
