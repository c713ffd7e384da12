/* blas.c — the GEMM path: load OpenBLAS at run time with the right core type, check it,
 * and fall back to loom's own GEMM (gemm.c) when it is missing or wrong.
 *
 * Why dlopen instead of linking: Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) mis-detects
 * recent AVX-512 Xeons as "Prescott" and runs SSE3 kernels, 4-5x slower than its SkylakeX
 * kernels on the same machine. OpenBLAS reads OPENBLAS_CORETYPE once, in its load-time
 * constructor, so the choice has to be made before the library is loaded:
 *   1. detect the CPU with cpuid; unless the user set OPENBLAS_CORETYPE, set it to the best
 *      matching core (SkylakeX for AVX-512 F/BW/DQ/VL, Haswell for AVX2+FMA, else leave
 *      OpenBLAS to detect) — and unset it again once the library is loaded;
 *   2. dlopen the OpenMP build of OpenBLAS if installed (it shares libgomp's thread pool
 *      with our kernels: no second set of spinning threads fighting for the cores), else
 *      whatever libopenblas.so.0 is; LOOM_OPENBLAS=<path or soname> overrides the search,
 *      LOOM_OPENBLAS=none skips OpenBLAS;
 *   3. set the thread count (OpenBLAS and OpenMP alike) and verify a few GEMMs (all four
 *      transpose combinations, odd sizes, leading dimensions larger than the rows, beta 0
 *      over NaN) against a double-precision reference; a library that fails is not used.
 * The outcome is one line for the start-up banner, e.g.
 *   "OpenBLAS 0.3.21 (openmp) core=SkylakeX (auto: cpu has avx512) threads=2 isa=avx512"
 * (isa: what loom's own kernels run, isa.c). A LOOM_CPU_ISA that isa.c refuses makes
 * loom_cpu_blas_init fail with isa.c's message, before anything is loaded.
 *
 * Invariants: loading and checking happen once per process (pthread_once); later calls
 * only change the thread count. loom_cpu_sgemm initialises with default threads if
 * called before loom_cpu_blas_init. Nothing here prints; failures end up in the
 * description. The thread count is OpenMP's per-thread setting: call init from the thread
 * that runs the kernels.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 }; /* cblas.h ABI */

typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                               const float *A, int lda, const float *B, int ldb, float beta,
                               float *C, int ldc);
typedef char *(*str_fn)(void);
typedef int (*int_fn)(void);
typedef void (*set_threads_fn)(int);

#if defined(__x86_64__)
#define MULTIARCH_DIR "/usr/lib/x86_64-linux-gnu/"
#elif defined(__aarch64__)
#define MULTIARCH_DIR "/usr/lib/aarch64-linux-gnu/"
#else
#define MULTIARCH_DIR "/usr/lib/"
#endif

static const char *const openblas_candidates[] = {
    MULTIARCH_DIR "openblas-openmp/libopenblas.so.0",
    "libopenblas.so.0",
};

static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    int threads;                /* the last count loom_cpu_blas_init applied */
    cblas_sgemm_fn sgemm;       /* NULL: loom_cpu_sgemm_fallback */
    set_threads_fn set_threads; /* openblas_set_num_threads, if present */
    int split;                  /* OpenBLAS not built with OpenMP: it runs on one thread and
                                 * loom splits each product over its own OpenMP threads */
    int status;                 /* 0, or -1 if even the fallback failed its check */
    char what[160];             /* the GEMM in use: "OpenBLAS 0.3.21 (openmp) core=..." */
    char why[200];              /* why not OpenBLAS, when the fallback is in use */
} g = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, 0, NULL, NULL, 0, 0, "", ""};

/* The OPENBLAS_CORETYPE matching the ISA the kernels run (isa.c: the best cpuid reports,
 * or LOOM_CPU_ISA), or NULL to let OpenBLAS decide. */
static const char *pick_coretype(const char **why)
{
#if defined(__x86_64__)
    const int forced = getenv("LOOM_CPU_ISA") && *getenv("LOOM_CPU_ISA");
    switch (loom_cpu_isa()) {
    case LOOM_CPU_ISA_AVX512:
        *why = forced ? "LOOM_CPU_ISA=avx512" : "cpu has avx512";
        return "SkylakeX";
    case LOOM_CPU_ISA_AVX2:
        *why = forced ? "LOOM_CPU_ISA=avx2" : "cpu has avx2+fma";
        return "Haswell";
    default:
        if (forced) { /* the lowest core of OpenBLAS's x86-64 builds (SSE3) */
            *why = "LOOM_CPU_ISA=sse2";
            return "Prescott";
        }
    }
#endif
    *why = "left to OpenBLAS";
    return NULL;
}

static void cblas_call(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    g.sgemm(CBLAS_ROW_MAJOR, ta ? CBLAS_TRANS : CBLAS_NO_TRANS, tb ? CBLAS_TRANS : CBLAS_NO_TRANS,
            M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* A pthread OpenBLAS has its own threads, which spin after each call while our OpenMP
 * threads want the same cores (and the other way round): on 2 cores a training step ran
 * 1.3-1.7x slower than with the OpenMP build. So such a library is kept on one thread and
 * each product is cut into one slab of C per OpenMP thread, along the longer of M and N
 * (slab edges on multiples of 16); small products are split this way with any build. */
static void cblas_split(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc)
{
    const int nth = omp_get_max_threads(), by_rows = M >= N, len = by_rows ? M : N;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int p = 0; p < nth; p++) {
        const int s = (int)((long)len * p / nth) & ~15;
        const int e = p == nth - 1 ? len : (int)((long)len * (p + 1) / nth) & ~15;
        if (e <= s)
            continue;
        if (by_rows)
            cblas_call(ta, tb, e - s, N, K, alpha, ta ? A + s : A + (size_t)s * lda, lda, B, ldb,
                       beta, C + (size_t)s * ldc, ldc);
        else
            cblas_call(ta, tb, M, e - s, K, alpha, A, lda, tb ? B + (size_t)s * ldb : B + s, ldb,
                       beta, C + s, ldc);
    }
}

/* Below this many multiply-adds even an OpenMP OpenBLAS is faster split by loom (each
 * thread one single-threaded call, OpenBLAS sees it is inside a parallel region): the
 * tiny config's layer GEMMs (~25M) ran 12% faster that way, the small config's (~450M)
 * and its LM head did not. */
#define SPLIT_BELOW 134217728.0 /* 2^27 */

enum route { ROUTE_AUTO, ROUTE_WHOLE, ROUTE_SPLIT }; /* WHOLE, SPLIT: forced, for verify */

static void sgemm_dispatch(enum route route, int ta, int tb, int M, int N, int K, float alpha,
                           const float *A, int lda, const float *B, int ldb, float beta, float *C,
                           int ldc)
{
    const double work = (double)M * N * K;
    if (!g.sgemm)
        loom_cpu_sgemm_fallback(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else if (route == ROUTE_SPLIT ||
             (route == ROUTE_AUTO && (g.split || work < SPLIT_BELOW) &&
              work > 8.0 * LOOM_CPU_PAR_MIN && !omp_in_parallel() && omp_get_max_threads() > 1))
        cblas_split(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        cblas_call(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Runs the check cases through the current GEMM path. Returns 0, or -1 with why written. */
static int verify(char *why, size_t len)
{
    /* All four transposes at odd sizes; 256^3 (where blocking and threading start) both as
     * one library call and split over threads; beta 0 over NaN (C must not be read), beta 1
     * (accumulation). ~40 MFLOP of double reference: a few ms at start-up. */
    static const struct { enum route route; int ta, tb, M, N, K; float alpha, beta; } cases[] = {
        {ROUTE_AUTO, 0, 0, 37, 53, 29, 0.75f, 0.5f},
        {ROUTE_AUTO, 0, 1, 37, 53, 29, 0.75f, 0.5f},
        {ROUTE_AUTO, 1, 0, 37, 53, 29, 0.75f, 0.5f},
        {ROUTE_AUTO, 1, 1, 37, 53, 29, 0.75f, 0.5f},
        {ROUTE_AUTO, 0, 1, 1, 7, 3, 1.0f, 1.0f},
        {ROUTE_WHOLE, 0, 1, 256, 256, 256, 1.0f, 0.0f},
        {ROUTE_SPLIT, 0, 1, 256, 256, 256, 1.0f, 0.0f},
        {ROUTE_SPLIT, 1, 0, 96, 128, 160, 1.0f, 1.0f},
        {ROUTE_WHOLE, 0, 0, 128, 96, 160, 1.0f, 0.0f},
    };
    const int pad = 3, maxd = 256 + pad;
    float *A = malloc(sizeof(float) * maxd * maxd), *B = malloc(sizeof(float) * maxd * maxd);
    float *C0 = malloc(sizeof(float) * maxd * maxd), *C = malloc(sizeof(float) * maxd * maxd);
    int rc = 0;
    if (!A || !B || !C0 || !C) {
        snprintf(why, len, "no memory to check it");
        rc = -1;
    }
    uint32_t seed = 12345u;
    for (size_t c = 0; rc == 0 && c < sizeof cases / sizeof cases[0]; c++) {
        const int ta = cases[c].ta, tb = cases[c].tb, M = cases[c].M, N = cases[c].N,
                  K = cases[c].K;
        const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
        for (int i = 0; i < maxd * maxd; i++) {
            seed = seed * 1664525u + 1013904223u; /* Numerical Recipes LCG */
            A[i] = (float)((seed >> 8) * (2.0 / 16777216.0) - 1.0);
            B[i] = -A[i] * 0.5f + (float)(i % 7) * 0.125f;
            C0[i] = cases[c].beta == 0.0f ? NAN : A[i] * 0.25f; /* beta 0 must drop NaN */
        }
        memcpy(C, C0, sizeof(float) * maxd * maxd);
        sgemm_dispatch(cases[c].route, ta, tb, M, N, K, cases[c].alpha, A, lda, B, ldb,
                       cases[c].beta, C, ldc);
        double err = loom_cpu_sgemm_check(ta, tb, M, N, K, cases[c].alpha, A, lda, B, ldb,
                                          cases[c].beta, C0, C, ldc);
        if (!(err <= LOOM_CPU_SGEMM_TOL)) {
            snprintf(why, len, "wrong result for %dx%dx%d %c%c (relative error %.2g)", M, N, K,
                     ta ? 'T' : 'N', tb ? 'T' : 'N', err);
            rc = -1;
        }
    }
    free(A);
    free(B);
    free(C0);
    free(C);
    return rc;
}

static void apply_threads(int n)
{
    omp_set_num_threads(n);
    if (g.set_threads)
        g.set_threads(g.split ? 1 : n);
}

/* Loads OpenBLAS into g, or explains in why (len bytes) why not. Returns 0 on success. */
static int load_openblas(char *why, size_t len)
{
    const char *env = getenv("LOOM_OPENBLAS");
    if (env && (!*env || strcmp(env, "none") == 0)) {
        snprintf(why, len, "LOOM_OPENBLAS=none");
        return -1;
    }
    const char *why_core = "";
    const char *user_core = getenv("OPENBLAS_CORETYPE");
    const char *core = user_core && *user_core ? NULL : pick_coretype(&why_core);
    if (core)
        setenv("OPENBLAS_CORETYPE", core, 1);

    void *h = NULL;
    const char *path = env;
    if (env) {
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    } else {
        for (size_t i = 0; !h && i < sizeof openblas_candidates / sizeof *openblas_candidates;
             i++)
            h = dlopen(path = openblas_candidates[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (core)
        unsetenv("OPENBLAS_CORETYPE"); /* read by the constructor; do not leak to children */
    if (!h) {
        const char *err = dlerror(); /* names the file */
        snprintf(why, len, "%s", err ? err : "cannot load libopenblas.so.0");
        return -1;
    }
    cblas_sgemm_fn sgemm = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    str_fn corename = (str_fn)dlsym(h, "openblas_get_corename");
    str_fn config = (str_fn)dlsym(h, "openblas_get_config");
    int_fn parallel = (int_fn)dlsym(h, "openblas_get_parallel");
    g.set_threads = (set_threads_fn)dlsym(h, "openblas_set_num_threads");
    if (!sgemm) {
        snprintf(why, len, "%s has no cblas_sgemm", path);
        g.set_threads = NULL;
        return -1; /* the handle stays open: OpenBLAS does not like being unloaded */
    }
    g.sgemm = sgemm;

    /* "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64" -> first 2 words */
    char version[64] = "OpenBLAS";
    if (config) {
        const char *s = config(), *sp = s ? strchr(s, ' ') : NULL;
        int n = sp ? (int)(strcspn(sp + 1, " ") + (size_t)(sp - s) + 1) : 0;
        if (n > 0 && n < (int)sizeof version)
            snprintf(version, sizeof version, "%.*s", n, s);
    }
    const int par = parallel ? parallel() : -1;
    const char *variant = par == 2   ? "openmp"
                          : par == 1 ? "pthread, split by loom"
                          : par == 0 ? "serial, split by loom"
                                     : "?, split by loom";
    g.split = par != 2;
    const char *got = corename ? corename() : "?";
    char note[96];
    if (user_core && *user_core)
        snprintf(note, sizeof note, "user: OPENBLAS_CORETYPE=%s", user_core);
    else if (core && strcasecmp(got, core) != 0)
        snprintf(note, sizeof note, "auto: wanted %s for %s", core, why_core);
    else
        snprintf(note, sizeof note, "auto: %s", why_core);
    snprintf(g.what, sizeof g.what, "%s (%s) core=%s (%s)", version, variant, got, note);
    return 0;
}

/* Verification runs on the current OpenMP thread count; loom_cpu_blas_init applies its
 * own count after this returns. */
static void init_once(void)
{
    char why[sizeof g.why] = "";
    if (load_openblas(why, sizeof why) == 0) {
        apply_threads(omp_get_max_threads());
        if (verify(why, sizeof why) == 0)
            return;
        if (g.set_threads) /* loaded but wrong: park its threads and fall back */
            g.set_threads(1);
        g.sgemm = NULL;
        g.set_threads = NULL;
        g.split = 0;
    }
    char fail[120] = "";
    g.status = verify(fail, sizeof fail);
    snprintf(g.what, sizeof g.what, "loom blocked sgemm (%s)%s%s", loom_cpu_sgemm_fallback_isa(),
             g.status ? " FAILED ITS CHECK: " : "", fail);
    snprintf(g.why, sizeof g.why, "; OpenBLAS not used: %s", why);
}

int loom_cpu_blas_init(int threads, char *desc, size_t desc_len)
{
    char isa_err[200];
    if (loom_cpu_isa_init(isa_err, sizeof isa_err) != 0) {
        if (desc && desc_len)
            snprintf(desc, desc_len, "%s", isa_err);
        return -1;
    }
    pthread_mutex_lock(&g.lock);
    pthread_once(&g.once, init_once);
    g.threads = threads > 0 ? threads : omp_get_max_threads();
    apply_threads(g.threads);
    if (desc && desc_len)
        snprintf(desc, desc_len, "%s threads=%d isa=%s%s", g.what, g.threads,
                 loom_cpu_isa_describe(), g.why);
    const int rc = g.status;
    pthread_mutex_unlock(&g.lock);
    return rc;
}

/* Canonical mode. OpenBLAS gives no per-element order guarantee: its SkylakeX sgemm picks
 * small-matrix kernels by M*N*K, splits work by shape and thread count, and its kernels
 * for edge tiles differ from the full ones, so the bits of C[i][j] can change when the
 * product is split by columns. gemm.c's blocked GEMM computes every element in an order
 * fixed by K alone (its header's "Order of operations"), so canonical mode sends every
 * loom_cpu_sgemm there. One flag per process (the backend is one instance per process);
 * set it between kernels, not while one runs on another thread. */
static volatile int canonical;

void loom_cpu_set_deterministic(int on)
{
    canonical = on != 0;
}

int loom_cpu_deterministic(void)
{
    return canonical;
}

void loom_cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    pthread_once(&g.once, init_once);
    if (canonical)
        loom_cpu_sgemm_fallback(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        sgemm_dispatch(ROUTE_AUTO, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
