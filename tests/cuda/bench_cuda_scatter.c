/* bench_cuda_scatter.c — the CUDA backend's scatter-adds at GPT-2 124M's shape: the token
 * embedding backward (R = B*T rows of C 768 into V 50304 rows) and the MoE scatter-add (top-2:
 * 2R assignment rows into R token rows, with gates), each through the column walk
 * (LOOM_CUDA_SCATTER=walk, the first kernels' way) and the sorted row-parallel path
 * (=sort), timed after a warm-up, as JSON lines. Tokens: spread over the vocabulary, and
 * "skewed" (every 8th row one token: one destination with R/8 rows, the sort's slow case).
 * The two paths' results are compared bitwise (memcmp, one call each from the same non-zero
 * start):
 * exit 1 if they differ. Not a test: scripts/gpu-check runs it.
 *   bench_cuda_scatter [B [T [reps [backend]]]]   defaults 8 1024 10 cuda
 * (backend cudaemu: gpu-check --dry-run's check of the program on the emulated kernels,
 * tiny sizes; its times are no GPU figure). Exit 77 where no GPU is visible.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "bench_cuda_args.h"
#include "base/clock.h"
#include "base/status.h"

enum { C = 768, V = 50304 };

typedef struct job {
    const char *what, *tokens;
    float *dst;
    const float *src, *scale;
    const int *idx;
    size_t n, dst_rows;
} job;

static void run_once(const loom_backend_ops *k, const job *j)
{
    if (j->scale)
        k->rows_scatter_add(j->dst, j->src, j->idx, j->scale, j->n, C);
    else
        k->embedding_backward(j->dst, j->src, j->idx, 0, V, j->n, C);
}

/* Mean ms of reps calls after one warm-up, on the given path. */
static double time_path(const loom_backend_ops *k, void *s, const job *j, const char *path,
                        int reps)
{
    setenv("LOOM_CUDA_SCATTER", path, 1);
    run_once(k, j);
    k->synchronize(s);
    double t0 = loom_now_ms();
    for (int i = 0; i < reps; i++)
        run_once(k, j);
    k->synchronize(s);
    return (loom_now_ms() - t0) / reps;
}

/* One call of each path from the same non-zero dst (start): the same bits? */
static int same_bits(const loom_backend_ops *k, void *s, const job *j, const float *start,
                     float *a, float *b)
{
    const size_t bytes = j->dst_rows * C * sizeof(float);
    float *out[2] = {a, b};
    const char *path[2] = {"walk", "sort"};
    for (int p = 0; p < 2; p++) {
        setenv("LOOM_CUDA_SCATTER", path[p], 1);
        k->copy_to_device(s, j->dst, start, bytes);
        run_once(k, j);
        k->copy_to_host(s, out[p], j->dst, bytes);
    }
    return memcmp(a, b, bytes) == 0;
}

int main(int argc, char **argv)
{
    int B, T, reps;
    loom_backend be;
    const int rc = bench_cuda_args(argc, argv, 10, 1 << 20, &B, &T, &reps, &be);
    if (rc)
        return rc;
    const loom_backend_ops *k = be.ops;
    void *s = be.self;
    if (k->size <= offsetof(loom_backend_ops, rows_scatter_add) || !k->rows_scatter_add) {
        fprintf(stderr, "this backend has no rows_scatter_add\n");
        return 1;
    }
    const size_t R = (size_t)B * T, A = 2 * R, big = (V > A ? V : A) * (size_t)C;
    float *h = malloc(A * C * sizeof(float)), *ha = malloc(big * 4), *hb = malloc(big * 4);
    float *start = malloc(big * 4);
    int *etok = malloc(R * sizeof(int)), *skewed = malloc(R * sizeof(int));
    int *moe = malloc(A * sizeof(int));
    unsigned x = 12345;
    for (size_t i = 0; i < A * C; i++) {
        x = x * 1664525u + 1013904223u;
        h[i] = 2.0f * ((float)(x >> 8) / 16777216.0f - 0.5f);
    }
    for (size_t i = 0; i < big; i++) {
        x = x * 1664525u + 1013904223u;
        start[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
    }
    for (size_t i = 0; i < R; i++) {
        etok[i] = (int)((i * 2654435761u) % 50257u); /* bench_cuda_gpt's tokens */
        skewed[i] = i % 8 == 0 ? 13 : etok[i];
    }
    for (size_t i = 0; i < A; i++) /* two lists of the R token rows (each token twice) */
        moe[i] = (int)((i % R) * (i < R ? 40503u : 2654435761u) % R);
    float *src = k->alloc(s, A * C * 4), *wte = k->alloc(s, (size_t)V * C * 4);
    float *acc = k->alloc(s, R * C * 4), *gate = k->alloc(s, A * 4);
    int *tok = k->alloc(s, R * 4), *tok2 = k->alloc(s, R * 4), *idx = k->alloc(s, A * 4);
    if (!src || !wte || !acc || !gate || !tok || !tok2 || !idx) {
        fprintf(stderr, "out of device memory for B=%d T=%d\n", B, T);
        return 1;
    }
    k->copy_to_device(s, src, h, A * C * 4);
    k->copy_to_device(s, gate, h, A * 4); /* gates: any floats will do for timing */
    k->copy_to_device(s, tok, etok, R * 4);
    k->copy_to_device(s, tok2, skewed, R * 4);
    k->copy_to_device(s, idx, moe, A * 4);
    const job jobs[] = {
        {"embedding_backward", "spread", wte, src, NULL, tok, R, V},
        {"embedding_backward", "skewed", wte, src, NULL, tok2, R, V},
        {"rows_scatter_add (moe top-2)", "spread", acc, src, gate, idx, A, R},
    };
    int bad = 0;
    for (size_t q = 0; q < sizeof jobs / sizeof *jobs; q++) {
        const job *j = &jobs[q];
        const double walk = time_path(k, s, j, "walk", reps), sort = time_path(k, s, j, "sort", reps);
        const int same = same_bits(k, s, j, start, ha, hb);
        printf("{\"impl\": \"loom scatter-add\", \"op\": \"%s\", \"tokens\": \"%s\", \"rows\": %zu, "
               "\"dst_rows\": %zu, \"C\": %d, \"walk_ms\": %.3f, \"sort_ms\": %.3f, "
               "\"walk_over_sort\": %.2f, \"bitwise\": %s, \"backend\": \"%s\"}\n",
               j->what, j->tokens, j->n, j->dst_rows, C, walk, sort, walk / sort,
               same ? "true" : "false", k->describe(s));
        if (!same) {
            fprintf(stderr, "%s (%s): the sorted and the walked scatter-add differ\n", j->what,
                    j->tokens);
            bad = 1;
        }
    }
    unsetenv("LOOM_CUDA_SCATTER");
    k->free(s, src), k->free(s, wte), k->free(s, acc), k->free(s, gate);
    k->free(s, tok), k->free(s, tok2), k->free(s, idx);
    loom_backend_close(&be);
    free(h), free(ha), free(hb), free(start), free(etok), free(skewed), free(moe);
    return bad;
}
