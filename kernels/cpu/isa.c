/* isa.c — which instruction set the CPU kernels run: the best cpuid reports, or a lower
 * one forced with LOOM_CPU_ISA.
 *
 * Levels (x86-64 psABI micro-architecture levels, as GCC's target("arch=...") compiles
 * them): avx512 = x86-64-v4 (AVX-512 F/BW/CD/DQ/VL), avx2 = x86-64-v3 (AVX2, FMA, BMI2,
 * ...), sse2 = the x86-64 baseline. Elsewhere than x86-64 there is one level, "base".
 * Every ISA-dispatched kernel (gemm.c's micro-kernel and packing, and every function
 * defined with LOOM_CPU_VARIANTS in cpu_common.h) asks loom_cpu_isa(), so a forced level
 * reaches all of them; blas.c picks OpenBLAS's core type from it too.
 *
 * LOOM_CPU_ISA=avx512|avx2|sse2 (unset or empty: the best this CPU has). A level the CPU
 * lacks, or an unknown word, is refused by loom_cpu_isa_init with a message naming what
 * would be accepted; the backend's create() and loom_cpu_blas_init fail with it. Kernels
 * cannot fail, so until then (or when a caller ignores the refusal) loom_cpu_isa() runs
 * the best level the CPU has — correct, just not the one asked for.
 *
 * Invariants: decided once per process (pthread_once), before any kernel's first call
 * returns; the environment is read then and never again.
 */
#include "cpu_kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    pthread_once_t once;
    int level;       /* the level in use */
    int best;        /* the best the CPU has */
    int forced;      /* LOOM_CPU_ISA chose level */
    char error[200]; /* why LOOM_CPU_ISA was refused; "" if it was not */
    char what[64];   /* "avx2", or "sse2 (LOOM_CPU_ISA; cpu has avx2)" */
} g = {PTHREAD_ONCE_INIT, LOOM_CPU_ISA_SSE2, LOOM_CPU_ISA_SSE2, 0, "", ""};

#if defined(__x86_64__)
static const char *const names[] = {"sse2", "avx2", "avx512"};
#else
static const char *const names[] = {"base", "base", "base"};
#endif

const char *loom_cpu_isa_name(int isa)
{
    return isa >= 0 && isa <= LOOM_CPU_ISA_AVX512 ? names[isa] : "?";
}

static int detect(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
        return LOOM_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("x86-64-v3"))
        return LOOM_CPU_ISA_AVX2;
#endif
    return LOOM_CPU_ISA_SSE2;
}

static void choose(void)
{
    g.best = g.level = detect();
    const char *env = getenv("LOOM_CPU_ISA");
    if (!env || !*env)
        return;
    int want = -1;
#if defined(__x86_64__)
    for (int i = 0; i <= LOOM_CPU_ISA_AVX512; i++)
        if (strcmp(env, names[i]) == 0)
            want = i;
    if (want < 0) {
        snprintf(g.error, sizeof g.error,
                 "LOOM_CPU_ISA=%s is not an instruction set loom knows; use avx512, avx2 or "
                 "sse2, or unset it for the best this CPU has (%s)",
                 env, names[g.best]);
        return;
    }
    if (want > g.best) {
        snprintf(g.error, sizeof g.error,
                 "LOOM_CPU_ISA=%s, but this CPU lacks %s (the best it has is %s); use %s or "
                 "lower, or unset LOOM_CPU_ISA",
                 env, env, names[g.best], names[g.best]);
        return;
    }
#else
    if (strcmp(env, "base") == 0)
        want = LOOM_CPU_ISA_SSE2;
    else {
        snprintf(g.error, sizeof g.error,
                 "LOOM_CPU_ISA=%s: this is not an x86-64 build, whose only level is base; "
                 "unset LOOM_CPU_ISA", env);
        return;
    }
#endif
    g.level = want;
    g.forced = 1;
}

static void init_once(void)
{
    choose();
    if (g.forced)
        snprintf(g.what, sizeof g.what, "%s (LOOM_CPU_ISA; cpu has %s)", names[g.level],
                 names[g.best]);
    else
        snprintf(g.what, sizeof g.what, "%s", names[g.level]);
}

int loom_cpu_isa(void)
{
    pthread_once(&g.once, init_once);
    return g.level;
}

int loom_cpu_isa_best(void)
{
    pthread_once(&g.once, init_once);
    return g.best;
}

int loom_cpu_isa_init(char *err, size_t len)
{
    pthread_once(&g.once, init_once);
    if (g.error[0]) {
        if (err && len)
            snprintf(err, len, "%s", g.error);
        return -1;
    }
    return 0;
}

const char *loom_cpu_isa_describe(void)
{
    pthread_once(&g.once, init_once);
    return g.what;
}
