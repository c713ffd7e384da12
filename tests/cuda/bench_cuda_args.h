/* bench_cuda_args.h — the command line and backend opening the CUDA benchmarks share:
 *   bench [B [T [reps [backend]]]]     B >= 1, 1 <= T <= max_T, reps >= 1, backend "cuda"
 * Returns 0 with *be open, 2 after a usage line (bad numbers), or 77 after a "SKIP:" line
 * where the backend does not open (no GPU visible): the benchmark's exit status. */
#ifndef LOOM_BENCH_CUDA_ARGS_H
#define LOOM_BENCH_CUDA_ARGS_H

#include <stdio.h>
#include <stdlib.h>

#include "base/backend.h"
#include "base/status.h"

static inline int bench_cuda_args(int argc, char **argv, int reps_default, int max_T, int *B,
                                  int *T, int *reps, loom_backend *be)
{
    *B = argc > 1 ? atoi(argv[1]) : 8;
    *T = argc > 2 ? atoi(argv[2]) : 1024;
    *reps = argc > 3 ? atoi(argv[3]) : reps_default;
    if (*B < 1 || *T < 1 || *T > max_T || *reps < 1) {
        fprintf(stderr, "usage: %s [B >= 1 [T 1..%d [reps >= 1 [backend]]]]\n", argv[0], max_T);
        return 2;
    }
    const char *backend = argc > 4 ? argv[4] : "cuda";
    if (loom_backend_open(backend, 0, be) != LOOM_OK) {
        printf("SKIP: %s\n", loom_last_error());
        return 77;
    }
    return 0;
}

#endif
