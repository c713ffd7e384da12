/* bench_sgemm_check.c — the time of loom_cpu_sgemm_check (the double-precision reference
 * every loom process's start-up GEMM verification runs, kernels/cpu/blas.c) on its 256^3
 * case, best of 5, on the threads OMP_NUM_THREADS gives; LOOM_CPU_ISA picks its tiles as it
 * picks the kernels'. Prints "sgemm_check 256^3: X ms (isa NAME)". Not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu_kernels.h"

int main(void)
{
    const int n = 256;
    float *A = malloc(sizeof(float) * n * n), *B = malloc(sizeof(float) * n * n),
          *C = calloc((size_t)n * n, sizeof(float));
    if (!A || !B || !C)
        return 1;
    for (int i = 0; i < n * n; i++) {
        A[i] = (float)(i % 7) - 3.0f;
        B[i] = (float)(i % 5) - 2.0f;
    }
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        volatile double err = loom_cpu_sgemm_check(0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, NULL, C, n);
        (void)err;
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        best = ms < best ? ms : best;
    }
    printf("sgemm_check 256^3: %.1f ms (isa %s)\n", best, loom_cpu_isa_name(loom_cpu_isa()));
    free(A), free(B), free(C);
    return 0;
}
