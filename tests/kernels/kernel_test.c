/* kernel_test.c — the helpers declared in kernel_test.h. */
#include "kernel_test.h"
#include "cpu_kernels.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float *kt_alloc(size_t n)
{
    float *p = aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63);
    ck_assert_msg(p != NULL, "out of memory for %zu floats", n);
    memset(p, 0, n * sizeof(float));
    return p;
}

void kt_fill(float *x, size_t n, uint32_t seed, float lo, float hi)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17; /* xorshift64 */
        x[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / 16777216.0));
    }
}

double kt_dot(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

void kt_check_grad(const char *what, float *x, const float *grad, size_t n, size_t stride,
                   kt_loss_fn loss, void *ctx, float h, double tol)
{
    for (size_t i = 0; i < n; i += stride) {
        const float x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss(ctx);
        x[i] = x0 - h;
        const double lm = loss(ctx);
        x[i] = x0;
        /* the step actually taken, after rounding x0 +- h to float */
        const double fd = (lp - lm) / ((double)(x0 + h) - (double)(x0 - h));
        const double bound = tol * fmax(1.0, fabs((double)grad[i]));
        ck_assert_msg(fabs(fd - grad[i]) <= bound,
                      "%s[%zu]: analytic %.7g, finite difference %.7g (|diff| %.3g > %.3g)",
                      what, i, grad[i], fd, fabs(fd - grad[i]), bound);
    }
}

void kt_assert_close(const char *what, const float *got, const double *want, size_t n,
                     double tol)
{
    for (size_t i = 0; i < n; i++) {
        const double bound = tol * fmax(1.0, fabs(want[i]));
        ck_assert_msg(fabs(got[i] - want[i]) <= bound, "%s[%zu]: got %.7g, want %.7g", what, i,
                      got[i], want[i]);
    }
}

void kt_assert_scaled(const char *what, const float *got, const float *ref, float factor,
                      size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        const double want = (double)factor * ref[i];
        ck_assert_msg(fabs(got[i] - want) <= tol * fmax(1.0, fabs(want)),
                      "%s[%zu]: got %.7g, want %g x %.7g", what, i, got[i], factor, ref[i]);
    }
}

void kt_assert_all(const char *what, const float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(x[i] == v, "%s[%zu] = %.7g, want %g", what, i, x[i], v);
}

void kt_assert_thread_independent(const char *what, kt_kernel_fn fn, void *ctx, size_t n)
{
    float *one = kt_alloc(n), *two = kt_alloc(n);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    fn(ctx, one);
    omp_set_num_threads(2);
    fn(ctx, two);
    omp_set_num_threads(saved);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&one[i], &two[i], sizeof(float)) == 0,
                      "%s[%zu]: %.9g on 1 thread, %.9g on 2", what, i, one[i], two[i]);
    free(one), free(two);
}

int kt_run(Suite *s)
{
    /* meson runs each kernel test once per ISA (LOOM_CPU_ISA=avx512|avx2|sse2): one this
     * CPU lacks is a skip (77); any other refusal is a failure */
    char why[256];
    if (loom_cpu_isa_init(why, sizeof why) != 0) {
        const char *isa = getenv("LOOM_CPU_ISA");
        const int known = strcmp(isa, "avx512") == 0 || strcmp(isa, "avx2") == 0 ||
                          strcmp(isa, "sse2") == 0;
        fprintf(stderr, "%s: %s\n", known ? "skipped" : "error", why);
        return known ? 77 : 1;
    }
    printf("kernels isa: %s\n", loom_cpu_isa_describe());
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists each test */
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
