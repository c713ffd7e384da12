/* bench_bf16dot.c — the bf16 forward product two ways, at the small config's shapes
 * (BT = 1024 rows, C = 384; qkv, attention projection, MLP up and down, the LM head):
 *   widen+sgemm: the 16-bit weight widened into fp32, then loom_cpu_sgemm (OpenBLAS, or
 *                loom's own GEMM), what gpt_precision.c runs today;
 *   dpbf16:      gemm_bf16.c's vdpbf16ps kernel reading the 16-bit weight directly.
 * A registered meson benchmark, not a test: `build/tests/kernels/bench_bf16dot [threads]`.
 * Each line: shape M x K x N, ms per call (best of the rounds, wall) and process CPU ms per
 * call (the mean; on shared cores the wall time counts others' load), GFLOP/s from the wall,
 * and each path's worst error against a double reference (loom_cpu_sgemm_check's scale:
 * |got - ref| / sum |a b|). Exits 1 if either path is off by more than 1e-5 on that scale.
 */
#include "cpu_kernels.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *mem(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "bench_bf16dot: out of memory\n");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    char desc[256];
    if (loom_cpu_blas_init(argc > 1 ? atoi(argv[1]) : 0, desc, sizeof desc) != 0) {
        fprintf(stderr, "bench_bf16dot: %s\n", desc);
        return 1;
    }
    printf("gemm: %s\n", desc);
    printf("dpbf16: %s\n", loom_cpu_gemm_bf16_available()
                               ? "avx512_bf16 (vdpbf16ps)"
                               : "unavailable (no avx512_bf16, or isa below avx512)");
    static const int shapes[][3] = {{1024, 384, 1152}, {1024, 384, 384}, {1024, 384, 1536},
                                    {1024, 1536, 384}, {1024, 384, 50304}};
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        float *A = mem((size_t)M * K * 4), *Wf = mem((size_t)N * K * 4);
        float *C1 = mem((size_t)M * N * 4), *C2 = mem((size_t)M * N * 4);
        uint16_t *W = mem((size_t)N * K * 2);
        for (size_t i = 0; i < (size_t)M * K; i++)
            A[i] = loom_cpu_bf16_to_f32(loom_cpu_bf16_from_f32(
                (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f));
        for (size_t i = 0; i < (size_t)N * K; i++)
            W[i] = loom_cpu_bf16_from_f32((float)((i * 40503u + 7) % 997) / 9970.0f - 0.05f);
        const double flop = 2.0 * M * N * K;
        for (int path = 0; path < 2; path++) {
            if (path == 1 && !loom_cpu_gemm_bf16_available())
                break;
            double best = 1e30, cpu = 0;
            int calls = 0;
            for (int round = 0; round < 7; round++) {
                const double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
                for (int r = 0; r < 5; r++) {
                    if (path == 0) {
                        loom_cpu_bf16_to_f32_n(Wf, W, (size_t)N * K);
                        loom_cpu_sgemm(0, 1, M, N, K, 1.0f, A, K, Wf, K, 0.0f, C1, N);
                    } else if (loom_cpu_gemm_bf16(M, N, K, A, K, W, K, C2, N) != 0) {
                        fprintf(stderr, "bench_bf16dot: loom_cpu_gemm_bf16 failed\n");
                        return 1;
                    }
                }
                const double t = (now(CLOCK_MONOTONIC) - t0) / 5;
                cpu += now(CLOCK_PROCESS_CPUTIME_ID) - c0;
                calls += 5;
                best = t < best ? t : best;
            }
            loom_cpu_bf16_to_f32_n(Wf, W, (size_t)N * K);
            const double err = loom_cpu_sgemm_check(0, 1, M, N, K, 1.0f, A, K, Wf, K, 0.0f, NULL,
                                                    path ? C2 : C1, N);
            bad |= !(err <= 1e-5);
            printf("%-12s %4dx%4dx%4d  %7.3f ms  cpu %7.3f ms  %6.1f GFLOP/s  err %.2e\n",
                   path ? "dpbf16" : "widen+sgemm", M, K, N, best * 1e3, cpu / calls * 1e3,
                   flop / best * 1e-9, err);
        }
        free(A), free(Wf), free(C1), free(C2), free(W);
    }
    /* The backward products at the same shapes (M = BT rows, K = C in, N = OC out):
     * dinp = dout W (BT x C x OC) and dW += dout^T inp (OC x C x BT), dout any fp32:
     * matmul_backward (sgemm on the widened weight) against matmul_backward_bf16 (each
     * dout split into hi + lo bf16, vdpbf16ps). */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int BT = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        float *dout = mem((size_t)BT * OC * 4), *inp = mem((size_t)BT * C * 4);
        float *w = mem((size_t)OC * C * 4), *dx = mem((size_t)BT * C * 4);
        float *dw = mem((size_t)OC * C * 4);
        uint16_t *wh = mem((size_t)OC * C * 2);
        for (size_t i = 0; i < (size_t)BT * OC; i++)
            dout[i] = (float)((i * 2654435761u) % 100003) * 1e-8f - 5e-4f;
        for (size_t i = 0; i < (size_t)BT * C; i++)
            inp[i] = loom_cpu_bf16_to_f32(loom_cpu_bf16_from_f32(
                (float)((i * 40503u + 3) % 1000) / 500.0f - 1.0f));
        for (size_t i = 0; i < (size_t)OC * C; i++)
            wh[i] = loom_cpu_bf16_from_f32((float)((i * 40503u + 7) % 997) / 9970.0f - 0.05f);
        const double flop = 4.0 * BT * C * OC;
        for (int path = 0; path < 2; path++) {
            if (path == 1 && !loom_cpu_gemm_bf16_available())
                break;
            double best = 1e30, cpu = 0;
            int calls = 0;
            for (int round = 0; round < 5; round++) {
                memset(dw, 0, (size_t)OC * C * 4);
                const double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
                for (int r = 0; r < 3; r++) {
                    loom_cpu_bf16_to_f32_n(w, wh, (size_t)OC * C); /* the block's widening */
                    if (path == 0)
                        loom_cpu_matmul_backward(dx, dw, NULL, dout, inp, w, 1, BT, C, OC);
                    else if (loom_cpu_matmul_backward_bf16(dx, dw, NULL, dout, inp, w, 0, 1,
                                                           BT, C, OC) != 0) {
                        fprintf(stderr, "bench_bf16dot: matmul_backward_bf16 failed\n");
                        return 1;
                    }
                }
                const double t = (now(CLOCK_MONOTONIC) - t0) / 3;
                cpu += now(CLOCK_PROCESS_CPUTIME_ID) - c0;
                calls += 3;
                best = t < best ? t : best;
            }
            const double err = loom_cpu_sgemm_check(0, 0, BT, C, OC, 1.0f, dout, OC, w, C, 0.0f,
                                                    NULL, dx, C);
            bad |= !(err <= 1e-5);
            printf("bwd %-12s %4dx%4dx%5d  %7.3f ms  cpu %7.3f ms  %6.1f GFLOP/s  err %.2e\n",
                   path ? "dpbf16-split" : "sgemm", BT, C, OC, best * 1e3, cpu / calls * 1e3,
                   flop / best * 1e-9, err);
        }
        free(dout), free(inp), free(w), free(dx), free(dw), free(wh);
    }
    return bad;
}
