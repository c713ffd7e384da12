/* bench_cuda_attention.c — causal attention on the CUDA backend at GPT-2 124M's shape
 * (C 768, 12 heads, T 1024): the batched-GEMM reference path (attention_forward/_backward,
 * fp32 storage) against the fused kernels (attention_flash_forward/_backward) over fp32 and
 * bf16 q, k, v, each forward + backward timed after a warm-up, as JSON lines; bf16 twice:
 * the scalar fused kernels (LOOM_CUDA_FLASH_TC=0) and the tensor-core ones
 * (flash_attention_tc.cu, which take bf16 at this head size). At this size the fused results
 * are checked against the reference: the scalar kernels' out and dqkv within 1e-5 + 1e-4
 * |ref|, as tests/cuda's test_attention_flash; the tensor-core kernels' (P, dO, dS rounded
 * to bf16) max |err| / max |ref| within 2e-2, as test_attention_flash_tc (out, dqkv whole):
 * a GPU-scale check the emulated tests are too small for. Exit 1 if they disagree. Not a
 * test: scripts/gpu-check runs it.
 *   bench_cuda_attention [B [T [reps [backend]]]]   defaults 8 1024 5 cuda
 * (backend cudaemu: scripts/gpu-check --dry-run's check of the program on the emulated
 * kernels, tiny sizes; its times are no GPU figure). Exit 77 where no GPU is visible.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "bench_cuda_args.h"
#include "base/clock.h"
#include "base/status.h"

enum { C = 768, NH = 12 };

static double worst(const float *a, const float *ref, size_t n)
{
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / (1e-5 + 1e-4 * fabs((double)ref[i]));
        w = isnan(e) ? INFINITY : fmax(w, e);
    }
    return w;
}

/* max |a - ref| / max |ref|: the tensor-core kernels' measure (their 16-bit rounding of P,
 * dO and dS is relative to a row's scale, not each element's). */
static double worst_rel_max(const float *a, const float *ref, size_t n)
{
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        e = isnan(a[i]) ? INFINITY : fmax(e, fabs((double)a[i] - ref[i]));
        m = fmax(m, fabs((double)ref[i]));
    }
    return m > 0.0 ? e / m : e;
}

int main(int argc, char **argv)
{
    int B, T, reps;
    loom_backend be;
    const int rc = bench_cuda_args(argc, argv, 5, 1 << 20, &B, &T, &reps, &be);
    if (rc)
        return rc;
    const loom_backend_ops *k = be.ops;
    void *s = be.self;
    if (k->size <= offsetof(loom_backend_ops, attention_flash_backward) ||
        !k->attention_flash_forward) {
        fprintf(stderr, "this backend has no attention_flash_forward\n");
        return 1;
    }
    const size_t r = (size_t)B * T, nq = r * 3 * C, na = (size_t)B * NH * T * T;
    float *h_qkv = malloc(nq * 4), *h_dout = malloc(r * C * 4);
    unsigned x = 12345;
    for (size_t i = 0; i < nq; i++) {
        x = x * 1664525u + 1013904223u;
        h_qkv[i] = 3.0f * ((float)(x >> 8) / 16777216.0f - 0.5f);
    }
    for (size_t i = 0; i < r * C; i++) {
        x = x * 1664525u + 1013904223u;
        h_dout[i] = 2.0f * ((float)(x >> 8) / 16777216.0f - 0.5f);
    }
    float *qkv = k->alloc(s, nq * 4), *dout = k->alloc(s, r * C * 4);
    void *q16 = k->alloc(s, nq * 2);
    float *att = k->alloc(s, na * 4), *scr = k->alloc(s, 2 * na * 4);
    float *ref = k->alloc(s, r * C * 4), *dref = k->alloc(s, nq * 4);
    float *out = k->alloc(s, r * C * 4), *dq = k->alloc(s, nq * 4), *lse = k->alloc(s, r * NH * 4);
    if (!qkv || !dout || !q16 || !att || !scr || !ref || !dref || !out || !dq || !lse) {
        fprintf(stderr, "out of device memory for B=%d T=%d\n", B, T);
        return 1;
    }
    float *a = malloc(nq * 4), *b = malloc(nq * 4);
    int bad = 0;
    for (int run = 0; run < 3; run++) { /* fp32, bf16 scalar, bf16 tensor cores */
        const loom_dtype dt = run ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
        const int tc = run == 2;
        if (tc)
            unsetenv("LOOM_CUDA_FLASH_TC");
        else
            setenv("LOOM_CUDA_FLASH_TC", "0", 1);
        k->copy_to_device(s, qkv, h_qkv, nq * 4);
        if (dt != LOOM_DTYPE_F32) /* the reference reads the rounded values, flash 16 bits */
            k->round_to(qkv, qkv, nq, dt), k->convert_from_f32(q16, qkv, nq, dt);
        k->copy_to_device(s, dout, h_dout, r * C * 4);
        const void *src = dt == LOOM_DTYPE_F32 ? (const void *)qkv : q16;
        double ms[2] = {0, 0};
        for (int path = 0; path < 2; path++)
            for (int i = 0; i < reps + 1; i++) {
                k->synchronize(s);
                double t0 = loom_now_ms();
                if (path == 0) {
                    k->attention_forward(ref, att, qkv, B, T, C, NH);
                    k->attention_backward(dref, scr, dout, qkv, att, B, T, C, NH);
                } else {
                    k->attention_flash_forward(out, lse, src, B, T, C, NH, dt);
                    k->attention_flash_backward(dq, scr, dout, src, out, lse, B, T, C, NH, dt);
                }
                k->synchronize(s);
                if (i > 0) /* the first is the warm-up */
                    ms[path] += (loom_now_ms() - t0) / reps;
            }
        k->copy_to_host(s, a, out, r * C * 4);
        k->copy_to_host(s, b, ref, r * C * 4);
        /* errors as fractions of the tolerance: 1e-5 + 1e-4 |ref| elementwise (scalar), or
         * 2e-2 of max |ref| (tensor cores) */
        double eo = tc ? worst_rel_max(a, b, r * C) / 2e-2 : worst(a, b, r * C);
        k->copy_to_host(s, a, dq, nq * 4);
        k->copy_to_host(s, b, dref, nq * 4);
        double ed = tc ? worst_rel_max(a, b, nq) / 2e-2 : worst(a, b, nq);
        const char *dn = dt == LOOM_DTYPE_F32 ? "fp32" : "bf16";
        printf("{\"impl\": \"loom attention\", \"dtype\": \"%s\", \"flash_kernels\": \"%s\", "
               "\"B\": %d, \"T\": %d, \"C\": %d, "
               "\"NH\": %d, \"batched_ms_fwd_bwd\": %.3f, \"flash_ms_fwd_bwd\": %.3f, "
               "\"flash_over_batched\": %.3f, \"out_err_of_tol\": %.3g, \"dqkv_err_of_tol\": %.3g, "
               "\"backend\": \"%s\"}\n",
               dn, tc ? "tensor cores" : "scalar", B, T, C, NH, ms[0], ms[1], ms[1] / ms[0], eo, ed,
               k->describe(s));
        if (!(eo <= 1.0 && ed <= 1.0)) {
            fprintf(stderr, "flash %s (%s) differs from the batched path: out %.3g, dqkv %.3g "
                    "of the tolerance\n", dn, tc ? "tensor cores" : "scalar", eo, ed);
            bad = 1;
        }
    }
    unsetenv("LOOM_CUDA_FLASH_TC");
    float *bufs[] = {qkv, dout, att, scr, ref, dref, out, dq, lse};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        k->free(s, bufs[i]);
    k->free(s, q16);
    loom_backend_close(&be);
    free(h_qkv), free(h_dout), free(a), free(b);
    return bad;
}
