/* kernel_test.h — what the kernel tests share: deterministic random data, the scalar loss
 * L = sum(out * R) they differentiate, central finite differences, and tolerance checks.
 *
 * Finite differences are taken in float inputs but the loss is summed in double:
 *   dL/dx_i ~ (L(x + h e_i) - L(x - h e_i)) / 2h,
 * with truncation error O(h^2 f''') and rounding error O(eps_float |L| / h). With h ~ 1e-2
 * and O(1) data both stay near 1e-4, so a gradient passes when
 *   |fd - analytic| <= tol * max(1, |analytic|)   with tol ~ 1e-3 .. 5e-3.
 * Every check fails through Check's ck_assert_msg with the element and both values.
 */
#ifndef LOOM_KERNEL_TEST_H
#define LOOM_KERNEL_TEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* n floats, 64-byte aligned, zeroed; aborts the test on failure. Free with free(). */
float *kt_alloc(size_t n);
/* Fill x with uniform values in [lo, hi) from a fixed-seed generator. */
void kt_fill(float *x, size_t n, uint32_t seed, float lo, float hi);
/* sum_i a_i b_i in double: the test loss L = sum(out * R). */
double kt_dot(const float *a, const float *b, size_t n);

/* Evaluates the loss at the current inputs (runs the forward pass on ctx). */
typedef double (*kt_loss_fn)(void *ctx);
/* Compares grad[i] with the central difference of loss() in x[i], for i = 0, stride,
 * 2*stride, ... < n. x is restored afterwards. */
void kt_check_grad(const char *what, float *x, const float *grad, size_t n, size_t stride,
                   kt_loss_fn loss, void *ctx, float h, double tol);
/* |got_i - want_i| <= tol * max(1, |want_i|) for every i. */
void kt_assert_close(const char *what, const float *got, const double *want, size_t n,
                     double tol);
/* got_i == factor * ref_i within tol * max(1, |factor ref_i|): used for "called twice,
 * parameter gradients doubled (factor 2), input gradients unchanged (factor 1)". */
void kt_assert_scaled(const char *what, const float *got, const float *ref, float factor,
                      size_t n, double tol);
/* Every element exactly equal to v. */
void kt_assert_all(const char *what, const float *x, size_t n, float v);

/* Runs fn(ctx, out) — a kernel call that leaves n floats of results in out — once on one
 * thread and once on two, and asserts both gave the same bits: the CPU kernels' results
 * do not depend on the thread count (sizes must be above LOOM_CPU_PAR_MIN to test it). */
typedef void (*kt_kernel_fn)(void *ctx, float *out);
void kt_assert_thread_independent(const char *what, kt_kernel_fn fn, void *ctx, size_t n);

/* Runs the suite (Check's default fork mode; CK_VERBOSITY=verbose lists each test), prints
 * the summary, returns the exit code. */
int kt_run(Suite *s);

#endif
