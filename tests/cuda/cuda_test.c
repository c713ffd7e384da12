/* cuda_test.c — see cuda_test.h. */
#include "cuda_test.h"

#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ct_backend ct_cpu, ct_gpu;
static void *res[2][CT_MAX_BUFS];

static void host_log(loom_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "backend: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static char last_fail[512];
static loom_status host_fail(loom_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_fail, sizeof last_fail, fmt, ap);
    va_end(ap);
    return st;
}

static void *host_alloc(size_t bytes)
{
    return calloc(1, bytes);
}

static const loom_host host = {.size = sizeof(loom_host), .abi = LOOM_PLUGIN_ABI,
                               .log = host_log, .fail = host_fail, .alloc = host_alloc,
                               .free = free, .rank = 0, .world = 1, .group = NULL};

static const loom_plugin_desc *load(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        exit(1);
    }
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(h, LOOM_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        fprintf(stderr, "no %s in %s\n", LOOM_PLUGIN_ENTRY_SYMBOL, path);
        exit(1);
    }
    return entry();
}

/* Every declared key at its default (numbers only: both backends' keys are integers). */
static void start(ct_backend *b, const loom_plugin_desc *d, const char *name)
{
    loom_config_value v[8];
    memset(v, 0, sizeof v);
    for (uint32_t i = 0; i < d->n_config_keys && i < 8; i++) {
        v[i].name = d->config_keys[i].name;
        v[i].type = d->config_keys[i].type;
        v[i].number = atof(d->config_keys[i].default_value);
    }
    loom_config cfg = {(int)d->n_config_keys, v};
    b->k = d->ops;
    b->name = name;
    if (b->k->create(&host, &cfg, &b->self) != LOOM_OK) {
        fprintf(stderr, "%s backend did not start: %s\n", name, last_fail);
        if (b == &ct_gpu && strstr(last_fail, "no CUDA device")) {
            fprintf(stderr, "SKIP: %s\n", last_fail);
            exit(77);
        }
        exit(1);
    }
}

void ct_open(const char *cpu_path, const char *cuda_path)
{
    const loom_plugin_desc *dg = load(cuda_path);
    char reason[256] = "";
    if (dg->probe && !dg->probe(reason, sizeof reason)) {
        printf("SKIP: no GPU here, the CUDA tests did not run: %s\n", reason);
        exit(77);
    }
    start(&ct_cpu, load(cpu_path), "cpu");
    start(&ct_gpu, dg, "cuda");
    printf("%s\n%s\n", ct_cpu.k->describe(ct_cpu.self), ct_gpu.k->describe(ct_gpu.self));
}

void ct_close(void)
{
    ct_gpu.k->destroy(ct_gpu.self);
    ct_cpu.k->destroy(ct_cpu.self);
}

static void run_on(ct_backend *b, int which, ct_buf *bufs, int n, ct_op_fn op, void *ctx)
{
    void *d[CT_MAX_BUFS] = {0};
    for (int i = 0; i < n; i++) {
        d[i] = b->k->alloc(b->self, bufs[i].bytes);
        ck_assert_msg(d[i] != NULL, "%s: alloc %zu bytes", b->name, bufs[i].bytes);
        b->k->copy_to_device(b->self, d[i], bufs[i].host, bufs[i].bytes);
    }
    op(b->k, b->self, d, ctx);
    b->k->synchronize(b->self);
    for (int i = 0; i < n; i++) {
        free(res[which][i]);
        res[which][i] = malloc(bufs[i].bytes ? bufs[i].bytes : 1);
        b->k->copy_to_host(b->self, res[which][i], d[i], bufs[i].bytes);
        b->k->free(b->self, d[i]);
    }
}

void ct_compare_op(const char *what, ct_buf *bufs, int n, ct_op_fn op, void *ctx)
{
    ck_assert(n <= CT_MAX_BUFS);
    run_on(&ct_cpu, 0, bufs, n, op, ctx);
    run_on(&ct_gpu, 1, bufs, n, op, ctx);
    for (int i = 0; i < n; i++) {
        if (!bufs[i].compare)
            continue;
        const float *c = res[0][i], *g = res[1][i];
        size_t m = bufs[i].bytes / sizeof(float), worst = 0;
        double worst_ratio = 0.0, max_abs = 0.0;
        for (size_t j = 0; j < m; j++) {
            double e = fabs((double)g[j] - c[j]);
            double lim = bufs[i].atol + bufs[i].rtol * fabs((double)c[j]);
            double r = isnan(e) ? INFINITY : e / lim;
            if (!isfinite(c[j]) && !isfinite(g[j]) && (isnan(c[j]) == isnan(g[j])) &&
                (isnan(c[j]) || c[j] == g[j]))
                r = 0.0; /* the same inf, or both nan */
            if (r > worst_ratio) {
                worst_ratio = r;
                worst = j;
            }
            if (e > max_abs)
                max_abs = e;
        }
        printf("%-28s %-8s max |gpu-cpu| %.3g (atol %.0e rtol %.0e)\n", what, bufs[i].name, max_abs,
               bufs[i].atol, bufs[i].rtol);
        ck_assert_msg(worst_ratio <= 1.0, "%s: %s[%zu]: gpu %.9g, cpu %.9g (atol %g, rtol %g)",
                      what, bufs[i].name, worst, g[worst], c[worst], bufs[i].atol, bufs[i].rtol);
    }
}

const void *ct_gpu_result(int i)
{
    return res[1][i];
}

const void *ct_cpu_result(int i)
{
    return res[0][i];
}

void ct_fill(float *x, size_t n, unsigned seed, float lo, float hi)
{
    unsigned s = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)((s >> 8) & 0xffffff) / 16777216.0f;
    }
}

float *ct_floats(size_t n, unsigned seed, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    ck_assert(x != NULL);
    ct_fill(x, n, seed, lo, hi);
    return x;
}
