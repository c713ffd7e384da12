/* test_cuda_flash_tc.c — the tensor-core fused attention (kernels/cuda/flash_attention_tc.cu,
 * which attention_flash_forward/_backward run for bf16 and fp16 q, k, v with heads of 16 to
 * 64, a multiple of 16), part of test_cuda_ops (cuda_ops_emu; cuda_ops on a GPU).
 *
 * Against this backend's batched path in fp32 on the same values (qkv rounded to the dtype
 * first, so both see the same inputs): the TC kernels round P, dO and dS to the dtype, so
 * the measure is each tensor's max |tc - ref| over its max |ref| (out, and dq, dk, dv apart),
 * within TOL_BF16 / TOL_F16. Also: two runs give the same bits (no atomics), the scalar
 * kernels (LOOM_CUDA_FLASH_TC=0) give other bits (the TC path ran) and the same lse within
 * the same tolerance; a dout 2^-26 as large gives gradients exactly 2^-26 as large (dO's
 * per-head power-of-two scaling, without which fp16 flushes such values). The grouped-query
 * form (attention_flash_gqa_*) has its own test below. Shapes: T 80 (two query blocks, the second partial; key tiles of 32,
 * the last partial), 40 and 24, NH 2, heads of 64, 32 and 16.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_test.h"

/* bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3), fp16 11 (2.4e-4): a few
 * roundings' worth over the sums; measured (emulated) at most 6.4e-3 and 4.5e-4. */
#define TOL_BF16 2e-2
#define TOL_F16 1.5e-3

/* max |a - ref| / max |ref| over n values at stride `stride` (rows of `w` values). */
static double norm_err(const float *a, const float *ref, size_t rows, int w, size_t stride)
{
    double e = 0.0, m = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < w; c++) {
            const double x = a[r * stride + c], y = ref[r * stride + c];
            e = isnan(x) ? INFINITY : fmax(e, fabs(x - y));
            m = fmax(m, fabs(y));
        }
    return m > 0.0 ? e / m : e;
}

typedef struct tc_run {
    float *out, *lse, *dqkv; /* host copies */
} tc_run;

static void run_flash(const loom_backend_ops *k, void *s, tc_run *r, const void *d_src,
                      const float *d_dout, float *d_out, float *d_lse, float *d_dq, float *d_scr,
                      int b, int t, int c, int nh, loom_dtype dt)
{
    const size_t rc = (size_t)b * t * c, nq = 3 * rc, nl = (size_t)b * nh * t;
    k->attention_flash_forward(d_out, d_lse, d_src, b, t, c, nh, dt);
    k->attention_flash_backward(d_dq, d_scr, d_dout, d_src, d_out, d_lse, b, t, c, nh, dt);
    k->synchronize(s);
    r->out = malloc(rc * 4), r->lse = malloc(nl * 4), r->dqkv = malloc(nq * 4);
    k->copy_to_host(s, r->out, d_out, rc * 4);
    k->copy_to_host(s, r->lse, d_lse, nl * 4);
    k->copy_to_host(s, r->dqkv, d_dq, nq * 4);
}

static void free_run(tc_run *r)
{
    free(r->out), free(r->lse), free(r->dqkv);
}

START_TEST(test_attention_flash_tc)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    ck_assert(k->size > offsetof(loom_backend_ops, attention_flash_backward) &&
              k->attention_flash_forward && k->attention_flash_backward);
    const clock_t c0 = clock();
    static const int shapes[3][4] = {{1, 80, 128, 2}, {2, 40, 64, 2}, {1, 24, 32, 2}};
    static const loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int si = 0; si < 3; si++)
        for (int di = 0; di < 2; di++) {
            const int b = shapes[si][0], t = shapes[si][1], c = shapes[si][2], nh = shapes[si][3];
            const loom_dtype dt = dts[di];
            const char *dn = dt == LOOM_DTYPE_BF16 ? "bf16" : "fp16";
            const double tol = dt == LOOM_DTYPE_BF16 ? TOL_BF16 : TOL_F16;
            const size_t r = (size_t)b * t, rc = r * c, nq = 3 * rc, na = (size_t)b * nh * t * t;
            const size_t nl = (size_t)b * nh * t;
            float *qkv = ct_floats(nq, 21 + si, -1.5f, 1.5f), *dout = ct_floats(rc, 23, -1, 1);
            ct_cpu.k->round_to(qkv, qkv, nq, dt);
            float *d_qkv = k->alloc(s, nq * 4), *d_dout = k->alloc(s, rc * 4);
            void *d_q16 = k->alloc(s, nq * 2);
            float *d_att = k->alloc(s, na * 4), *d_scr = k->alloc(s, 2 * na * 4);
            float *d_ref = k->alloc(s, rc * 4), *d_dref = k->alloc(s, nq * 4);
            float *d_out = k->alloc(s, rc * 4), *d_dq = k->alloc(s, nq * 4);
            float *d_lse = k->alloc(s, nl * 4);
            k->copy_to_device(s, d_qkv, qkv, nq * 4);
            k->copy_to_device(s, d_dout, dout, rc * 4);
            k->attention_forward(d_ref, d_att, d_qkv, b, t, c, nh);
            k->attention_backward(d_dref, d_scr, d_dout, d_qkv, d_att, b, t, c, nh);
            k->convert_from_f32(d_q16, d_qkv, nq, dt);
            float *ref = malloc(rc * 4), *dref = malloc(nq * 4);
            k->synchronize(s);
            k->copy_to_host(s, ref, d_ref, rc * 4);
            k->copy_to_host(s, dref, d_dref, nq * 4);

            tc_run a, a2, sc;
            run_flash(k, s, &a, d_q16, d_dout, d_out, d_lse, d_dq, d_scr, b, t, c, nh, dt);
            run_flash(k, s, &a2, d_q16, d_dout, d_out, d_lse, d_dq, d_scr, b, t, c, nh, dt);
            /* dout 2^-26 as large (1.5e-8 at most: fp16 subnormals end at 6e-8): the kernels'
             * per-head power-of-two scaling of dO makes the gradients exactly 2^-26 times */
            float *tiny = malloc(rc * 4);
            for (size_t i = 0; i < rc; i++)
                tiny[i] = ldexpf(dout[i], -26);
            k->copy_to_device(s, d_dout, tiny, rc * 4);
            tc_run sm;
            run_flash(k, s, &sm, d_q16, d_dout, d_out, d_lse, d_dq, d_scr, b, t, c, nh, dt);
            k->copy_to_device(s, d_dout, dout, rc * 4);
            size_t off_scale = 0;
            for (size_t i = 0; i < nq; i++)
                off_scale += ldexpf(sm.dqkv[i], 26) != a.dqkv[i];
            ck_assert_msg(!off_scale, "flash tc %s T%d: %zu gradients of a 2^-26 dout are not "
                          "2^-26 times those of dout", dn, t, off_scale);
            free_run(&sm), free(tiny);
            setenv("LOOM_CUDA_FLASH_TC", "0", 1);
            run_flash(k, s, &sc, d_q16, d_dout, d_out, d_lse, d_dq, d_scr, b, t, c, nh, dt);
            unsetenv("LOOM_CUDA_FLASH_TC");

            const double eo = norm_err(a.out, ref, r, c, c);
            const double eq = norm_err(a.dqkv, dref, r, c, 3 * c);
            const double ek = norm_err(a.dqkv + c, dref + c, r, c, 3 * c);
            const double ev = norm_err(a.dqkv + 2 * c, dref + 2 * c, r, c, 3 * c);
            const double el = norm_err(a.lse, sc.lse, nl, 1, 1);
            printf("attention_flash_tc %s B%d T%d C%d NH%d: |err|/max|batched| out %.3g, dq %.3g, "
                   "dk %.3g, dv %.3g; lse vs the scalar kernels %.3g (tolerance %g)\n",
                   dn, b, t, c, nh, eo, eq, ek, ev, el, tol);
            ck_assert_msg(eo <= tol && eq <= tol && ek <= tol && ev <= tol && el <= tol,
                          "flash tc %s T%d hs%d: off the batched path", dn, t, c / nh);
            ck_assert_msg(!memcmp(a.out, a2.out, rc * 4) && !memcmp(a.lse, a2.lse, nl * 4) &&
                              !memcmp(a.dqkv, a2.dqkv, nq * 4),
                          "flash tc %s T%d: two runs differ in their bits", dn, t);
            ck_assert_msg(memcmp(a.out, sc.out, rc * 4) && memcmp(a.dqkv, sc.dqkv, nq * 4),
                          "flash tc %s T%d: the scalar kernels' bits (did the TC path run?)", dn,
                          t);
            free_run(&a), free_run(&a2), free_run(&sc);
            k->free(s, d_qkv), k->free(s, d_dout), k->free(s, d_q16), k->free(s, d_att);
            k->free(s, d_scr), k->free(s, d_ref), k->free(s, d_dref), k->free(s, d_out);
            k->free(s, d_dq), k->free(s, d_lse);
            free(qkv), free(dout), free(ref), free(dref);
        }
    printf("attention_flash_tc: %.2f s of CPU\n", (double)(clock() - c0) / CLOCKS_PER_SEC);
}
END_TEST

/* Grouped-query attention on the tensor-core kernels (backend.h attention_flash_gqa_forward
 * / _backward: qkv rows C + 2 KVH hs wide, q head h reading kv head h / rep) against the
 * batched fp32 _gqa path on the same rounded values, within the tolerances above; two runs
 * the same bits (each kv head's dK, dV sums its rep query heads in a fixed order); out and
 * dq bitwise the multi-head kernels' on qkv with the kv heads repeated (the same per-head
 * work: a wrong kv head or stride shows there). NH 4 over KVH 2 and 1, heads of 16. */
START_TEST(test_attention_flash_tc_gqa)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    ck_assert(k->size > offsetof(loom_backend_ops, attention_flash_gqa_backward) &&
              k->attention_flash_gqa_forward && k->attention_flash_gqa_backward);
    const clock_t c0 = clock();
    static const int shapes[2][5] = {{1, 80, 64, 4, 2}, {2, 40, 64, 4, 1}};
    static const loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int si = 0; si < 2; si++) {
        const int b = shapes[si][0], t = shapes[si][1], c = shapes[si][2], nh = shapes[si][3];
        const int kvh = shapes[si][4], hs = c / nh, rep = nh / kvh, w = c + 2 * kvh * hs;
        const loom_dtype dt = dts[si];
        const char *dn = dt == LOOM_DTYPE_BF16 ? "bf16" : "fp16";
        const double tol = dt == LOOM_DTYPE_BF16 ? TOL_BF16 : TOL_F16;
        const size_t r = (size_t)b * t, rc = r * c, nq = r * w, n3 = 3 * rc;
        const size_t na = (size_t)b * nh * t * t, nl = (size_t)b * nh * t;
        float *qkv = ct_floats(nq, 31 + si, -1.5f, 1.5f), *dout = ct_floats(rc, 33, -1, 1);
        ct_cpu.k->round_to(qkv, qkv, nq, dt);
        /* the multi-head layout: kv head h / rep repeated for each q head h */
        float *mha = malloc(n3 * 4);
        for (size_t i = 0; i < r; i++)
            for (int h = 0; h < nh; h++)
                for (int x = 0; x < hs; x++) {
                    const float *src = qkv + i * w;
                    float *dst = mha + i * 3 * c;
                    dst[h * hs + x] = src[h * hs + x];
                    dst[c + h * hs + x] = src[c + (h / rep) * hs + x];
                    dst[2 * c + h * hs + x] = src[c + (kvh + h / rep) * hs + x];
                }
        float *d_qkv = k->alloc(s, nq * 4), *d_dout = k->alloc(s, rc * 4);
        void *d_q16 = k->alloc(s, nq * 2), *d_m16 = k->alloc(s, n3 * 2);
        float *d_mha = k->alloc(s, n3 * 4), *d_att = k->alloc(s, na * 4);
        float *d_scr = k->alloc(s, 2 * na * 4), *d_ref = k->alloc(s, rc * 4);
        float *d_dref = k->alloc(s, nq * 4), *d_out = k->alloc(s, rc * 4);
        float *d_dq = k->alloc(s, n3 * 4), *d_lse = k->alloc(s, nl * 4);
        k->copy_to_device(s, d_qkv, qkv, nq * 4);
        k->copy_to_device(s, d_mha, mha, n3 * 4);
        k->copy_to_device(s, d_dout, dout, rc * 4);
        k->attention_gqa_forward(d_ref, d_att, d_qkv, b, t, c, nh, kvh);
        k->attention_gqa_backward(d_dref, d_scr, d_dout, d_qkv, d_att, b, t, c, nh, kvh);
        k->convert_from_f32(d_q16, d_qkv, nq, dt);
        k->convert_from_f32(d_m16, d_mha, n3, dt);
        float *ref = malloc(rc * 4), *dref = malloc(nq * 4);
        float *out[2], *lse[2], *dqkv[2];
        for (int run = 0; run < 2; run++) {
            out[run] = malloc(rc * 4), lse[run] = malloc(nl * 4), dqkv[run] = malloc(nq * 4);
            k->attention_flash_gqa_forward(d_out, d_lse, d_q16, b, t, c, nh, kvh, dt);
            k->attention_flash_gqa_backward(d_dq, d_scr, d_dout, d_q16, d_out, d_lse, b, t, c, nh,
                                            kvh, dt);
            k->synchronize(s);
            k->copy_to_host(s, out[run], d_out, rc * 4);
            k->copy_to_host(s, lse[run], d_lse, nl * 4);
            k->copy_to_host(s, dqkv[run], d_dq, nq * 4);
        }
        k->synchronize(s);
        k->copy_to_host(s, ref, d_ref, rc * 4);
        k->copy_to_host(s, dref, d_dref, nq * 4);
        tc_run m;
        run_flash(k, s, &m, d_m16, d_dout, d_out, d_lse, d_dq, d_scr, b, t, c, nh, dt);

        const double eo = norm_err(out[0], ref, r, c, c);
        const double eq = norm_err(dqkv[0], dref, r, c, w);
        const double ek = norm_err(dqkv[0] + c, dref + c, r, kvh * hs, w);
        const double ev = norm_err(dqkv[0] + c + kvh * hs, dref + c + kvh * hs, r, kvh * hs, w);
        printf("attention_flash_tc gqa %s B%d T%d C%d NH%d KVH%d: |err|/max|batched| out %.3g, "
               "dq %.3g, dk %.3g, dv %.3g (tolerance %g)\n", dn, b, t, c, nh, kvh, eo, eq, ek, ev,
               tol);
        ck_assert_msg(eo <= tol && eq <= tol && ek <= tol && ev <= tol,
                      "flash tc gqa %s KVH%d: off the batched _gqa path", dn, kvh);
        ck_assert_msg(!memcmp(out[0], out[1], rc * 4) && !memcmp(lse[0], lse[1], nl * 4) &&
                          !memcmp(dqkv[0], dqkv[1], nq * 4),
                      "flash tc gqa %s KVH%d: two runs differ in their bits", dn, kvh);
        size_t off = 0;
        for (size_t i = 0; i < r; i++)
            off += memcmp(dqkv[0] + i * w, m.dqkv + i * 3 * c, (size_t)c * 4) != 0;
        ck_assert_msg(!memcmp(out[0], m.out, rc * 4) && !memcmp(lse[0], m.lse, nl * 4) && !off,
                      "flash tc gqa %s KVH%d: out, lse or dq (%zu rows) not the multi-head "
                      "kernels' bits on the repeated kv heads", dn, kvh, off);
        free_run(&m);
        for (int run = 0; run < 2; run++)
            free(out[run]), free(lse[run]), free(dqkv[run]);
        k->free(s, d_qkv), k->free(s, d_dout), k->free(s, d_q16), k->free(s, d_m16);
        k->free(s, d_mha), k->free(s, d_att), k->free(s, d_scr), k->free(s, d_ref);
        k->free(s, d_dref), k->free(s, d_out), k->free(s, d_dq), k->free(s, d_lse);
        free(qkv), free(dout), free(mha), free(ref), free(dref);
    }
    printf("attention_flash_tc gqa: %.2f s of CPU\n", (double)(clock() - c0) / CLOCKS_PER_SEC);
}
END_TEST

void ct_add_flash_tc(TCase *tc);
void ct_add_flash_tc(TCase *tc)
{
    tcase_add_test(tc, test_attention_flash_tc);
    tcase_add_test(tc, test_attention_flash_tc_gqa);
}
