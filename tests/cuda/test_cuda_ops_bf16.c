/* test_cuda_ops_bf16.c — cuda_ops' checks of the 16-bit products that read an fp32 gradient
 * or the 16-bit weights as stored (backend.h's matmul_backward_dt and gemm_w16), against the
 * CPU backend's fp32 matmul_backward and gemm on the same bf16-valued operands.
 * Tolerance (gemm_bf16.c's contract, the CPU's own split): |dev - cpu| <= 5e-6 S + 1e-30,
 * S the element's sum of |a b| over its terms (plus |dW| before, for dW's +=): the split
 * of dout leaves 2^-18 |x| and the fp32 sums K 2^-24 at most. That bound is tight enough
 * to fail a product that rounds dout to bf16 (checked here on the host: its error exceeds
 * the tolerance). Non-finite reference elements must match in kind (NaN, +inf, -inf).
 */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "test_cuda_ops_bf16.h"

enum { R = 96, C = 96, OC = 160 };
static const double TOL = 5e-6;

static int has_bwd_dt(const loom_backend_ops *k)
{
    return k->size > offsetof(loom_backend_ops, matmul_backward_dt) && k->matmul_backward_dt;
}

static int has_w16(const loom_backend_ops *k)
{
    return k->size > offsetof(loom_backend_ops, gemm_w16) && k->gemm_w16;
}

static float *rounded(size_t n, unsigned seed, float lo, float hi)
{
    float *x = ct_floats(n, seed, lo, hi);
    ct_cpu.k->round_to(x, x, n, LOOM_DTYPE_BF16); /* CPU memory is host memory */
    return x;
}

/* Worst |got - ref| / (tol s + 1e-30) over n elements (s[i] the element's sum of |a b|);
 * a non-finite ref must be matched in kind: then a mismatch counts as infinitely bad. */
static double tol = 5e-6; /* TOL, or twice it where check_backward's caller says why */

static double worst(const float *got, const float *ref, const double *s, size_t n, size_t *at)
{
    double w = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double e;
        if (isnan(ref[i]))
            e = isnan(got[i]) ? 0 : INFINITY;
        else if (isinf(ref[i]))
            e = got[i] == ref[i] ? 0 : INFINITY;
        else
            e = fabs((double)got[i] - ref[i]) / (tol * s[i] + 1e-30);
        if (e > w || isnan(e))
            w = e, *at = i;
    }
    return w;
}

/* The elements' sums of |a b|: dinp (R,C) over dout (R,OC) W (OC,C); dW (OC,C) over dout^T
 * inp plus |dW0|. */
static void abs_sums(double *sx, double *sw, const float *dout, const float *x, const float *w,
                     const float *dw0)
{
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            double a = 0;
            for (int o = 0; o < OC; o++)
                a += fabs((double)dout[r * OC + o] * w[o * C + c]);
            sx[r * C + c] = a;
        }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double a = fabs(dw0[o * C + c]);
            for (int r = 0; r < R; r++)
                a += fabs((double)dout[r * OC + o] * x[r * C + c]);
            sw[o * C + c] = a;
        }
}

typedef struct dev_bufs {
    float *dx, *dw, *db, *dout, *x, *w;
    uint16_t *wbits;
} dev_bufs;

static void *up(const void *h, size_t bytes)
{
    void *d = ct_gpu.k->alloc(ct_gpu.self, bytes);
    ct_gpu.k->copy_to_device(ct_gpu.self, d, h, bytes);
    return d;
}

static void down(void *h, const void *d, size_t bytes)
{
    ct_gpu.k->copy_to_host(ct_gpu.self, h, d, bytes);
}

/* One case: dout as given (finite or not), inp and W bf16 values; the device's
 * matmul_backward_dt (weight as fp32 values or as bits) against the CPU's fp32
 * matmul_backward, full and with dinp or dweight NULL (what the LM head asks: dinp with
 * neither inp nor dW; dW with neither dinp nor the weight). */
static void check_backward(const char *what, const float *dout, int bits, int finite)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    float *x = rounded((size_t)R * C, 11, -1, 1), *w = rounded((size_t)OC * C, 12, -0.3f, 0.3f);
    float *dw0 = ct_floats((size_t)OC * C, 13, -1, 1), *db0 = ct_floats(OC, 14, -1, 1);
    uint16_t *wb = malloc((size_t)OC * C * 2);
    ct_cpu.k->convert_from_f32(wb, w, (size_t)OC * C, LOOM_DTYPE_BF16);
    /* the reference: the CPU's fp32 product */
    float *rx = malloc((size_t)R * C * 4), *rw = malloc((size_t)OC * C * 4), *rb = malloc(OC * 4);
    memcpy(rw, dw0, (size_t)OC * C * 4);
    memcpy(rb, db0, OC * 4);
    ct_cpu.k->matmul_backward(rx, rw, rb, dout, x, w, 1, R, C, OC);
    double *sx = malloc((size_t)R * C * 8), *sw = malloc((size_t)OC * C * 8);
    abs_sums(sx, sw, dout, x, w, dw0);
    if (finite) { /* the tolerance can fail: dout rounded to bf16 (no lo) exceeds it */
        float *d16 = malloc((size_t)R * OC * 4), *hx = malloc((size_t)R * C * 4);
        ct_cpu.k->round_to(d16, dout, (size_t)R * OC, LOOM_DTYPE_BF16);
        ct_cpu.k->gemm(0, 0, R, C, OC, 1.0f, d16, OC, w, C, 0.0f, hx, C);
        size_t at;
        double e = worst(hx, rx, sx, (size_t)R * C, &at);
        ck_assert_msg(e > 1.0, "%s: dout rounded to bf16 stays within the tolerance (%.3g): the "
                      "check could not see a missing lo", what, e);
        free(d16), free(hx);
    }
    dev_bufs d = {up(dw0, (size_t)R * C * 4), /* garbage: dinp is overwritten */ up(dw0, (size_t)OC * C * 4), up(db0, OC * 4),
                  up(dout, (size_t)R * OC * 4), up(x, (size_t)R * C * 4),
                  up(w, (size_t)OC * C * 4), up(wb, (size_t)OC * C * 2)};
    const void *wt = bits ? (const void *)d.wbits : (const void *)d.w;
    float *gx = malloc((size_t)R * C * 4), *gw = malloc((size_t)OC * C * 4), *gb = malloc(OC * 4);
    ck_assert_msg(k->matmul_backward_dt(d.dx, d.dw, d.db, d.dout, d.x, wt, bits, 1, R, C, OC,
                                        LOOM_DTYPE_BF16) == 0,
                  "%s: matmul_backward_dt refused bf16 in fast mode", what);
    down(gx, d.dx, (size_t)R * C * 4), down(gw, d.dw, (size_t)OC * C * 4), down(gb, d.db, OC * 4);
    size_t ax, aw;
    double ex = worst(gx, rx, sx, (size_t)R * C, &ax), ew = worst(gw, rw, sw, (size_t)OC * C, &aw);
    printf("%-34s dinp %.3g, dW %.3g of the tolerance (worst dinp[%zu] %.9g vs %.9g)\n", what,
           ex, ew, ax, gx[ax], rx[ax]);
    ck_assert_msg(ex <= 1.0, "%s: dinp[%zu] = %.9g, fp32 %.9g (%.3g of the tolerance)", what, ax,
                  gx[ax], rx[ax], ex);
    ck_assert_msg(ew <= 1.0, "%s: dW[%zu] = %.9g, fp32 %.9g (%.3g of the tolerance)", what, aw,
                  gw[aw], rw[aw], ew);
    for (int o = 0; o < OC; o++) /* the same bias_backward: the same sums */
        ck_assert_msg(gb[o] == rb[o] || (isnan(gb[o]) && isnan(rb[o])) ||
                          fabs(gb[o] - rb[o]) <= 1e-5 + 1e-4 * fabs(rb[o]),
                      "%s: dbias[%d] = %.9g, fp32 %.9g", what, o, gb[o], rb[o]);
    if (finite) { /* it ran the 16-bit products: not the device's own fp32 bits */
        float *fx = malloc((size_t)R * C * 4);
        k->matmul_backward(d.dx, d.dw, NULL, d.dout, d.x, d.w, 1, R, C, OC);
        down(fx, d.dx, (size_t)R * C * 4);
        ck_assert_msg(memcmp(fx, gx, (size_t)R * C * 4) != 0,
                      "%s: dinp has the fp32 matmul_backward's bits (no 16-bit product ran)", what);
        free(fx);
    }
    /* dinp alone (no inp, no dW, no bias), over a dinp holding garbage: overwritten */
    k->copy_to_device(s, d.dx, dw0, (size_t)R * C * 4);
    ck_assert(k->matmul_backward_dt(d.dx, NULL, NULL, d.dout, NULL, wt, bits, 1, R, C, OC,
                                    LOOM_DTYPE_BF16) == 0);
    down(gx, d.dx, (size_t)R * C * 4);
    ex = worst(gx, rx, sx, (size_t)R * C, &ax);
    ck_assert_msg(ex <= 1.0, "%s, dweight NULL: dinp[%zu] = %.9g, fp32 %.9g", what, ax, gx[ax],
                  rx[ax]);
    /* dW alone (no dinp, no weight): accumulates onto dW0 */
    k->copy_to_device(s, d.dw, dw0, (size_t)OC * C * 4);
    ck_assert(k->matmul_backward_dt(NULL, d.dw, NULL, d.dout, d.x, NULL, bits, 1, R, C, OC,
                                    LOOM_DTYPE_BF16) == 0);
    down(gw, d.dw, (size_t)OC * C * 4);
    ew = worst(gw, rw, sw, (size_t)OC * C, &aw);
    ck_assert_msg(ew <= 1.0, "%s, dinp NULL: dW[%zu] = %.9g, fp32 %.9g", what, aw, gw[aw], rw[aw]);
    k->free(s, d.dx), k->free(s, d.dw), k->free(s, d.db), k->free(s, d.dout), k->free(s, d.x),
        k->free(s, d.w), k->free(s, d.wbits);
    free(x), free(w), free(dw0), free(db0), free(wb), free(rx), free(rw), free(rb), free(sx),
        free(sw), free(gx), free(gw), free(gb);
}

/* dout as a gradient looks: fp32 values over several decades (never bf16 values) */
static float *gradient(unsigned seed)
{
    float *g = ct_floats((size_t)R * OC, seed, -1, 1), *e = ct_floats((size_t)R * OC, seed + 1, -6, 0);
    for (size_t i = 0; i < (size_t)R * OC; i++)
        g[i] *= powf(10.0f, e[i]);
    free(e);
    return g;
}

START_TEST(test_matmul_backward_dt)
{
    ck_assert_msg(has_bwd_dt(ct_gpu.k), "the CUDA backend has no matmul_backward_dt");
    float *g = gradient(21);
    check_backward("matmul_backward_dt bf16", g, 0, 1);
    check_backward("matmul_backward_dt bf16 (bits)", g, 1, 1);
    /* inf, -inf and NaN in dout stay so (hi keeps them, lo is 0), and a finite value past
     * bf16's largest (it rounds up to inf) stays finite */
    g[5 * OC + 7] = INFINITY;
    g[9 * OC + 100] = -INFINITY;
    g[40 * OC + 3] = NAN;
    g[60 * OC + 50] = 3.4e38f;
    tol = 2 * TOL; /* that value's hi is truncated, not rounded: 2^-17 |x| left, not 2^-18 */
    check_backward("matmul_backward_dt bf16 inf/NaN", g, 1, 0);
    tol = TOL;
    free(g);
}
END_TEST

/* dinp and dW of matmul_backward_dt (bits: the weight as its bf16 bits) with dout split
 * at most `chunk` elements at a time (LOOM_CUDA_SPLIT_CHUNK; NULL: unset, one split). */
static void backward_with_chunk(const char *chunk, const dev_bufs *d, int bits, float *gx,
                                float *gw, const float *dw0)
{
    const loom_backend_ops *k = ct_gpu.k;
    if (chunk)
        setenv("LOOM_CUDA_SPLIT_CHUNK", chunk, 1);
    else
        unsetenv("LOOM_CUDA_SPLIT_CHUNK");
    k->copy_to_device(ct_gpu.self, d->dw, dw0, (size_t)OC * C * 4);
    ck_assert(k->matmul_backward_dt(d->dx, d->dw, NULL, d->dout, d->x,
                                    bits ? (const void *)d->wbits : (const void *)d->w, bits, 1,
                                    R, C, OC, LOOM_DTYPE_BF16) == 0);
    unsetenv("LOOM_CUDA_SPLIT_CHUNK");
    down(gx, d->dx, (size_t)R * C * 4), down(gw, d->dw, (size_t)OC * C * 4);
}

/* The split in pieces (gemm.c: dinp by blocks of dout's rows, dW by blocks of its columns)
 * gives the one split's bits: every output element is still one product over its whole
 * sum. Pieces of 6 rows / 10 columns (1000 elements), of one row / one column (7), and one
 * piece exactly the size of dout. */
START_TEST(test_matmul_backward_dt_chunked)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    float *g = gradient(41), *x = rounded((size_t)R * C, 42, -1, 1);
    float *w = rounded((size_t)OC * C, 43, -0.3f, 0.3f), *dw0 = ct_floats((size_t)OC * C, 44, -1, 1);
    uint16_t *wb = malloc((size_t)OC * C * 2);
    ct_cpu.k->convert_from_f32(wb, w, (size_t)OC * C, LOOM_DTYPE_BF16);
    dev_bufs d = {up(dw0, (size_t)R * C * 4), up(dw0, (size_t)OC * C * 4), NULL,
                  up(g, (size_t)R * OC * 4), up(x, (size_t)R * C * 4), up(w, (size_t)OC * C * 4),
                  up(wb, (size_t)OC * C * 2)};
    float *ox = malloc((size_t)R * C * 4), *ow = malloc((size_t)OC * C * 4);
    float *cx = malloc((size_t)R * C * 4), *cw = malloc((size_t)OC * C * 4);
    char whole[32];
    snprintf(whole, sizeof whole, "%d", R * OC);
    const char *chunks[3] = {"1000", "7", whole};
    const int bits = 1; /* the LM head's call (the weight as fp32 values only changes w16) */
    backward_with_chunk(NULL, &d, bits, ox, ow, dw0);
    for (int i = 0; i < 3; i++) {
        backward_with_chunk(chunks[i], &d, bits, cx, cw, dw0);
        ck_assert_msg(memcmp(cx, ox, (size_t)R * C * 4) == 0, "LOOM_CUDA_SPLIT_CHUNK=%s: dinp "
                      "is not the one split's bits", chunks[i]);
        ck_assert_msg(memcmp(cw, ow, (size_t)OC * C * 4) == 0, "LOOM_CUDA_SPLIT_CHUNK=%s: dW "
                      "is not the one split's bits", chunks[i]);
    }
    printf("matmul_backward_dt, dout split in pieces of 1000, 7 and %d elements: dinp and dW "
           "bitwise the one split's\n", R * OC);
    k->free(s, d.dx), k->free(s, d.dw), k->free(s, d.dout), k->free(s, d.x), k->free(s, d.w),
        k->free(s, d.wbits);
    free(g), free(x), free(w), free(dw0), free(wb), free(ox), free(ow), free(cx), free(cw);
}
END_TEST

/* Where it has no product -1 and nothing written: fp16, canonical mode. */
START_TEST(test_matmul_backward_dt_refusals)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    const size_t n = (size_t)R * OC > (size_t)OC * C ? (size_t)R * OC : (size_t)OC * C;
    float *h = ct_floats(n, 31, -1, 1), *back = malloc(n * 4);
    float *dx = up(h, n * 4), *dw = up(h, n * 4), *dout = up(h, n * 4);
    const int dts[2] = {LOOM_DTYPE_F16, LOOM_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        if (i == 1)
            k->set_deterministic(s, 1);
        ck_assert_msg(k->matmul_backward_dt(dx, dw, NULL, dout, dx, dw, 0, 1, R, C, OC,
                                            (loom_dtype)dts[i]) == -1,
                      "matmul_backward_dt ran %s", i ? "in canonical mode" : "fp16");
        down(back, dw, (size_t)OC * C * 4);
        ck_assert_msg(memcmp(back, h, (size_t)OC * C * 4) == 0, "a refused call wrote dW");
        down(back, dx, (size_t)R * C * 4);
        ck_assert_msg(memcmp(back, h, (size_t)R * C * 4) == 0, "a refused call wrote dinp");
    }
    k->set_deterministic(s, 0);
    k->free(s, dx), k->free(s, dw), k->free(s, dout);
    free(h), free(back);
}
END_TEST

/* gemm_w16: C (M,N) = A (M,K; bf16 or fp16 values) @ W^T, W (N,K) the 16-bit bits, with
 * leading dimensions wider than the slices; against the CPU's fp32 gemm on the widened W.
 * Canonical mode: -1, C untouched. */
START_TEST(test_gemm_w16)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    ck_assert_msg(has_w16(k), "the CUDA backend has no gemm_w16");
    enum { M = 37, N = 203, K = 70, LDA = K + 3, LDW = K + 1, LDC = N + 2 };
    for (int f = 0; f < 2; f++) {
        const loom_dtype dt = f ? LOOM_DTYPE_F16 : LOOM_DTYPE_BF16;
        float *a = ct_floats((size_t)M * LDA, 41, -1, 1), *w = ct_floats((size_t)N * LDW, 42, -1, 1);
        ct_cpu.k->round_to(a, a, (size_t)M * LDA, dt);
        ct_cpu.k->round_to(w, w, (size_t)N * LDW, dt);
        uint16_t *wb = malloc((size_t)N * LDW * 2);
        ct_cpu.k->convert_from_f32(wb, w, (size_t)N * LDW, dt);
        float *ref = ct_floats((size_t)M * LDC, 43, -1, 1), *got = malloc((size_t)M * LDC * 4);
        float *dc = up(ref, (size_t)M * LDC * 4), *da = up(a, (size_t)M * LDA * 4);
        uint16_t *dw = up(wb, (size_t)N * LDW * 2);
        ct_cpu.k->gemm(0, 1, M, N, K, 1.0f, a, LDA, w, LDW, 0.0f, ref, LDC);
        ck_assert_msg(k->gemm_w16(M, N, K, da, LDA, dw, LDW, dc, LDC, dt) == 0,
                      "gemm_w16 refused %s in fast mode", f ? "fp16" : "bf16");
        down(got, dc, (size_t)M * LDC * 4);
        double e = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < LDC; j++) {
                const size_t at = (size_t)i * LDC + j;
                if (j >= N) { /* past the slice: untouched */
                    ck_assert_msg(got[at] == ref[at], "gemm_w16 wrote C[%d][%d] past N", i, j);
                    continue;
                }
                double sab = 0;
                for (int q = 0; q < K; q++)
                    sab += fabs((double)a[i * LDA + q] * w[j * LDW + q]);
                e = fmax(e, fabs((double)got[at] - ref[at]) / (TOL * sab + 1e-30));
            }
        printf("%-34s %.3g of the tolerance\n", f ? "gemm_w16 fp16" : "gemm_w16 bf16", e);
        ck_assert_msg(e <= 1.0, "gemm_w16 %s: %.3g of the tolerance", f ? "fp16" : "bf16", e);
        /* canonical mode keeps the model's fp32 products */
        k->set_deterministic(s, 1);
        down(ref, dc, (size_t)M * LDC * 4);
        ck_assert(k->gemm_w16(M, N, K, da, LDA, dw, LDW, dc, LDC, dt) == -1);
        down(got, dc, (size_t)M * LDC * 4);
        ck_assert_msg(memcmp(got, ref, (size_t)M * LDC * 4) == 0, "a refused gemm_w16 wrote C");
        k->set_deterministic(s, 0);
        k->free(s, dc), k->free(s, da), k->free(s, dw);
        free(a), free(w), free(wb), free(ref), free(got);
    }
}
END_TEST

/* The harness (the CPU plugin on both sides, where the emulation cannot be built) has no
 * such products to check. */
void ops_bf16_tests(TCase *tc)
{
    if (ct_gpu.k == ct_cpu.k) {
        printf("16-bit backward products: not checked (the CPU plugin on both sides)\n");
        return;
    }
    tcase_add_test(tc, test_matmul_backward_dt);
    tcase_add_test(tc, test_matmul_backward_dt_chunked);
    tcase_add_test(tc, test_matmul_backward_dt_refusals);
    tcase_add_test(tc, test_gemm_w16);
}
