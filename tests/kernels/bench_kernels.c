/* bench_kernels.c — GEMM GFLOP/s and kernel timings on the GPT configs loom must be fast at
 * (registered as a meson benchmark, not a test; `meson test --benchmark -C build` or run
 * build/tests/kernels/bench_kernels directly).
 *
 *   bench_kernels [threads [sections]]   threads 0 = all cores; sections, any of
 *       "square canonical attention tiny small kernels tinystep canonicalstep smallstep" (default: all of them;
 *       canonical: a 768x768 -> 3072 forward with OpenBLAS and in canonical mode)
 * Environment knobs blas.c reads: OPENBLAS_CORETYPE (e.g. Prescott, to see the mis-detected
 * speed), LOOM_OPENBLAS (library path, or "none" for loom's own GEMM); isa.c reads
 * LOOM_CPU_ISA (avx512, avx2 or sse2: the ISA of loom's own kernels, at most the CPU's).
 * The first lines name the CPU model and the ISA in use.
 *
 * Each line: what, shape, ms per call (best of several rounds), GFLOP/s for GEMMs. The
 * "mixed" lines alternate an OpenMP kernel with a GEMM, as a training step does, which is
 * where OpenMP and a pthread OpenBLAS fight for the cores.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *buf(size_t n)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

/* Cross-entropy as one rank runs the passes (col0 = 0, Vl = Vp): over blocks of rows of
 * about 4 MiB of logits, so a block stays in cache between passes, as core/gpt_parallel.c
 * does; stats: 3 * BT floats. */
static void ce_one_rank(float *logits, float *losses, const int *targets, float dloss, int BT,
                        int V, int Vp, float *stats)
{
    int block = (int)(((size_t)4 << 20) / ((size_t)Vp * sizeof(float)));
    block = block < 16 ? 16 : block;
    for (int r0 = 0; r0 < BT; r0 += block) {
        const int n = BT - r0 < block ? BT - r0 : block;
        float *x = logits + (size_t)r0 * Vp, *m = stats + r0, *s = stats + BT + r0;
        float *t = stats + 2 * BT + r0;
        loom_cpu_ce_row_max(m, x, n, Vp, 0, V);
        loom_cpu_ce_row_sumexp(s, x, m, n, Vp, 0, V, 0, Vp);
        loom_cpu_ce_target_logit(t, x, targets + r0, n, Vp, 0);
        loom_cpu_ce_finish(x, losses + r0, m, s, t, targets + r0, dloss, n, Vp, 0, V);
    }
}

typedef struct {
    int ta, tb, M, N, K;
} shape;

/* Best time in ms of one call of the gemm over a few rounds. */
static double time_gemm(int fallback, shape s, float *A, float *B, float *C)
{
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const double flop = 2.0 * s.M * s.N * s.K;
    const int reps = flop > 1e10 ? 2 : flop > 1e8 ? 10 : 100;
    double best = 1e30;
    for (int round = 0; round < 3; round++) {
        double t0 = omp_get_wtime();
        for (int r = 0; r < reps; r++)
            (fallback ? loom_cpu_sgemm_fallback : loom_cpu_sgemm)(s.ta, s.tb, s.M, s.N, s.K, 1.0f,
                                                                   A, lda, B, ldb, 0.0f, C, s.N);
        double ms = (omp_get_wtime() - t0) * 1e3 / reps;
        best = ms < best ? ms : best;
    }
    return best;
}

/* One GPT config's per-layer GEMMs, forward (NT) and backward (NN, TN), plus the LM head. */
static void bench_config(const char *name, int BT, int C, int Vp, float *A, float *B, float *C_)
{
    const shape shapes[] = {
        {0, 1, BT, 3 * C, C}, {0, 1, BT, C, C},     {0, 1, BT, 4 * C, C},  {0, 1, BT, C, 4 * C},
        {0, 0, BT, C, 3 * C}, {1, 0, 3 * C, C, BT}, {0, 0, BT, 4 * C, C},  {1, 0, C, 4 * C, BT},
        {0, 1, BT, Vp, C},    {0, 0, BT, C, Vp},    {1, 0, Vp, C, BT},
    };
    for (int fb = 0; fb < 2; fb++) {
        double tot_ms = 0, tot_flop = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            shape s = shapes[i];
            double ms = time_gemm(fb, s, A, B, C_), flop = 2.0 * s.M * s.N * s.K;
            tot_ms += ms;
            tot_flop += flop;
            printf("%-6s %-8s %c%c %6d x %6d x %6d  %8.3f ms  %6.1f GFLOP/s\n", name,
                   fb ? "fallback" : "sgemm", s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K,
                   ms, flop / ms * 1e-6);
        }
        printf("%-6s %-8s all shapes once: %.2f ms, %.1f GFLOP/s\n\n", name,
               fb ? "fallback" : "sgemm", tot_ms, tot_flop / tot_ms * 1e-6);
    }
}

/* best_ = the fastest of `rounds` rounds of `reps` runs of stmt, in ms per run */
#define BEST_MS(best_, rounds, reps, stmt)                                                   \
    do {                                                                                     \
        best_ = 1e30;                                                                        \
        for (int round_ = 0; round_ < (rounds); round_++) {                                  \
            double t0_ = omp_get_wtime();                                                    \
            for (int r_ = 0; r_ < (reps); r_++) {                                            \
                stmt;                                                                        \
            }                                                                                \
            double ms_ = (omp_get_wtime() - t0_) * 1e3 / (reps);                             \
            best_ = ms_ < best_ ? ms_ : best_;                                               \
        }                                                                                    \
    } while (0)

#define TIME(label, reps, stmt)                                                              \
    do {                                                                                     \
        double best_;                                                                        \
        BEST_MS(best_, 3, reps, stmt);                                                       \
        printf("%-44s %8.3f ms\n", label, best_);                                            \
    } while (0)

/* TIME over 7 rounds, and ns per element of n elements */
#define TIME_PER(label, reps, n, stmt)                                                       \
    do {                                                                                     \
        double best_;                                                                        \
        BEST_MS(best_, 7, reps, stmt);                                                       \
        printf("%-44s %8.3f ms  %6.3f ns/element\n", label, best_, best_ * 1e6 / (double)(n)); \
    } while (0)

static void bench_kernels(const char *name, int B, int T, int C, int NH, int V, int Vp)
{
    const size_t BT = (size_t)B * T;
    float *qkv = buf(BT * 3 * C), *out = buf(BT * C), *att = buf((size_t)B * NH * T * T);
    float *dqkv = buf(BT * 3 * C), *scratch = buf(2 * (size_t)B * NH * T * T);
    float *h = buf(BT * 4 * C), *g = buf(BT * 4 * C), *logits = buf(BT * Vp);
    float *losses = buf(BT), *W = buf((size_t)4 * C * C);
    int *targets = malloc(BT * sizeof(int));
    for (size_t i = 0; i < BT; i++)
        targets[i] = (int)(i * 7 % V);
    char label[64];
    snprintf(label, sizeof label, "%s attention fwd", name);
    TIME(label, 5, loom_cpu_attention_forward(out, att, qkv, B, T, C, NH));
    snprintf(label, sizeof label, "%s attention bwd", name);
    TIME(label, 5, loom_cpu_attention_backward(dqkv, scratch, out, qkv, att, B, T, C, NH));
    const size_t ng = BT * 4 * C, nl = BT * Vp;
    snprintf(label, sizeof label, "%s gelu fwd (BT x 4C)", name);
    TIME_PER(label, 10, ng, loom_cpu_gelu_forward(g, h, ng));
    snprintf(label, sizeof label, "%s gelu bwd (BT x 4C)", name);
    TIME_PER(label, 10, ng, loom_cpu_gelu_backward(g, h, g, ng));
    snprintf(label, sizeof label, "%s crossentropy passes, 1 rank (BT x Vp)", name);
    float *stats = buf(3 * BT);
    TIME_PER(label, 3, nl, ce_one_rank(logits, losses, targets, 1.0f, (int)BT, V, Vp, stats));
    /* the passes one by one, over the whole (BT, Vp) (finish overwrites the logits with
     * the gradient, which the next round exponentiates again: the same work) */
    float *lg = buf(nl);
    snprintf(label, sizeof label, "%s   ce_row_max", name);
    TIME_PER(label, 3, nl, loom_cpu_ce_row_max(stats, lg, (int)BT, Vp, 0, V));
    snprintf(label, sizeof label, "%s   ce_row_sumexp", name);
    TIME_PER(label, 3, nl,
             loom_cpu_ce_row_sumexp(stats + BT, lg, stats, (int)BT, Vp, 0, V, 0, Vp));
    loom_cpu_ce_target_logit(stats + 2 * BT, lg, targets, (int)BT, Vp, 0);
    snprintf(label, sizeof label, "%s   ce_finish (loss + gradient)", name);
    TIME_PER(label, 3, nl,
             loom_cpu_ce_finish(lg, losses, stats, stats + BT, stats + 2 * BT, targets, 1.0f,
                                (int)BT, Vp, 0, V));
    free(stats), free(lg);
    snprintf(label, sizeof label, "%s layernorm fwd+bwd", name);
    TIME(label, 10, loom_cpu_layernorm_forward(out, losses, losses + BT / 2, qkv, W, W, 1,
                                               (int)BT / 2, C);
         loom_cpu_layernorm_backward(dqkv, W, W + C, out, qkv, W, losses, losses + BT / 2, 1,
                                     (int)BT / 2, C));
    snprintf(label, sizeof label, "%s mixed: gelu + fc GEMM, x10", name);
    TIME(label, 2, for (int i = 0; i < 10; i++) {
        loom_cpu_gelu_forward(g, h, BT * 4 * C);
        loom_cpu_sgemm(0, 1, (int)BT, C, 4 * C, 1.0f, g, 4 * C, W, 4 * C, 0.0f, out, C);
    });
    free(qkv), free(out), free(att), free(dqkv), free(scratch), free(h), free(g);
    free(logits), free(losses), free(W), free(targets);
}

/* Attention forward and backward in fast mode (the per-head products on loom_cpu_sgemm:
 * OpenBLAS) and in canonical mode (loom's own GEMM), alternately, best single call of 20. */
static void bench_attention(const char *name, int B, int T, int C, int NH)
{
    const size_t BT = (size_t)B * T, natt = (size_t)B * NH * T * T;
    float *qkv = buf(BT * 3 * C), *out = buf(BT * C), *att = buf(natt);
    float *dqkv = buf(BT * 3 * C), *scratch = buf(2 * natt);
    double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};
    for (int round = 0; round < 20; round++)
        for (int canon = 0; canon < 2; canon++) {
            loom_cpu_set_deterministic(canon);
            double t0 = omp_get_wtime();
            loom_cpu_attention_forward(out, att, qkv, B, T, C, NH);
            double t1 = omp_get_wtime();
            loom_cpu_attention_backward(dqkv, scratch, out, qkv, att, B, T, C, NH);
            double t2 = omp_get_wtime();
            best[canon][0] = t1 - t0 < best[canon][0] ? t1 - t0 : best[canon][0];
            best[canon][1] = t2 - t1 < best[canon][1] ? t2 - t1 : best[canon][1];
        }
    loom_cpu_set_deterministic(0);
    for (int canon = 0; canon < 2; canon++)
        printf("%-6s attention %-9s fwd %8.3f ms  bwd %8.3f ms\n", name,
               canon ? "canonical" : "fast", best[canon][0] * 1e3, best[canon][1] * 1e3);
    free(qkv), free(out), free(att), free(dqkv), free(scratch);
}

/* One GPT-2 training step (forward, backward; no optimizer) over L layers, as the core
 * runs it: the end-to-end number the choice of GEMM library and threading must improve. */
/* Adds the time of one kernel call to part[category]. */
#define TIMED(category, call)                                                                \
    do {                                                                                     \
        const double t_ = omp_get_wtime();                                                   \
        call;                                                                                \
        part[category] += omp_get_wtime() - t_;                                              \
    } while (0)

static void bench_step(const char *name, int B, int T, int C, int NH, int L, int V, int Vp)
{
    const size_t BT = (size_t)B * T, Cs = (size_t)C;
    /* weights shared by all layers (timing only); activations per layer */
    float *wte = buf((size_t)Vp * C), *wqkv = buf(3 * Cs * C), *wproj = buf(Cs * C);
    float *wfc = buf(4 * Cs * C), *wfcp = buf(4 * Cs * C), *bias = buf(4 * Cs), *lnw = buf(Cs);
    /* GPT-2's initial scale (weights ~ 0.02, LayerNorm weight 1, bias 0, embeddings ~ 0.02):
     * activations of realistic size, not ones that overflow GELU into subnormals */
    loom_cpu_scale(wte, 0.07f, (size_t)Vp * C);
    loom_cpu_scale(wqkv, 0.07f, 3 * Cs * C);
    loom_cpu_scale(wproj, 0.07f / sqrtf(2.0f * L), Cs * C);
    loom_cpu_scale(wfc, 0.07f, 4 * Cs * C);
    loom_cpu_scale(wfcp, 0.07f / sqrtf(2.0f * L), 4 * Cs * C);
    loom_cpu_scale(bias, 0.0f, 4 * Cs);
    for (int i = 0; i < C; i++)
        lnw[i] = 1.0f;
    float *dw = buf(4 * Cs * C), *dwte = buf((size_t)Vp * C), *db = buf(4 * Cs);
    float *x = buf(BT * C * (L + 1)), *ln = buf(BT * C * 2 * L), *stats = buf(BT * 4 * L);
    const size_t natt = (size_t)B * NH * T * T;
    float *qkv = buf(BT * 3 * C * L), *aty = buf(BT * C * L), *att = buf(natt * L);
    float *x2 = buf(BT * C * L), *fc = buf(BT * 4 * C * L), *ge = buf(BT * 4 * C * L);
    float *logits = buf(BT * Vp), *losses = buf(BT), *scratch = buf(2 * (size_t)B * NH * T * T);
    float *ce_stats = buf(3 * BT);
    float *dx = buf(BT * C), *dx2 = buf(BT * C), *dln = buf(BT * C), *dqkv = buf(BT * 3 * C);
    float *dbig = buf(BT * 4 * C), *dge = buf(BT * 4 * C), *tmp = buf(BT * C);
    loom_cpu_scale(x, 0.07f, BT * C);
    int *targets = malloc(BT * sizeof(int));
    for (size_t i = 0; i < BT; i++)
        targets[i] = (int)(i * 7 % V);
    double best = 1e30, best_part[7] = {0}, part[7];
    for (int round = 0; round < 3; round++) {
        memset(part, 0, sizeof part);
        const double t0 = omp_get_wtime();
        for (int l = 0; l < L; l++) {
            float *xl = x + l * BT * C, *l1 = ln + 2 * l * BT * C, *l2 = l1 + BT * C;
            float *s = stats + 4 * l * BT, *q = qkv + l * BT * 3 * C, *a = aty + l * BT * C;
            float *r = x2 + l * BT * C, *f = fc + l * BT * 4 * C, *g = ge + l * BT * 4 * C;
            TIMED(2, loom_cpu_layernorm_forward(l1, s, s + BT, xl, lnw, bias, B, T, C));
            TIMED(0, loom_cpu_matmul_forward(q, l1, wqkv, bias, B, T, C, 3 * C));
            TIMED(1, loom_cpu_attention_forward(a, att + l * natt, q, B, T, C, NH));
            TIMED(0, loom_cpu_matmul_forward(tmp, a, wproj, bias, B, T, C, C));
            TIMED(4, loom_cpu_residual_forward(r, xl, tmp, BT * C));
            TIMED(2, loom_cpu_layernorm_forward(l2, s + 2 * BT, s + 3 * BT, r, lnw, bias, B, T, C));
            TIMED(0, loom_cpu_matmul_forward(f, l2, wfc, bias, B, T, C, 4 * C));
            TIMED(3, loom_cpu_gelu_forward(g, f, BT * 4 * C));
            TIMED(0, loom_cpu_matmul_forward(tmp, g, wfcp, bias, B, T, 4 * C, C));
            TIMED(4, loom_cpu_residual_forward(xl + BT * C, r, tmp, BT * C));
        }
        TIMED(6, loom_cpu_matmul_forward(logits, x + L * BT * C, wte, NULL, B, T, C, Vp));
        TIMED(5, ce_one_rank(logits, losses, targets, 1.0f / BT, (int)BT, V, Vp, ce_stats));
        TIMED(6, loom_cpu_matmul_backward(dx, dwte, NULL, logits, x + L * BT * C, wte, B, T, C,
                                          Vp));
        for (int l = L - 1; l >= 0; l--) {
            float *xl = x + l * BT * C, *l1 = ln + 2 * l * BT * C, *l2 = l1 + BT * C;
            float *s = stats + 4 * l * BT, *q = qkv + l * BT * 3 * C, *a = aty + l * BT * C;
            float *r = x2 + l * BT * C, *f = fc + l * BT * 4 * C, *g = ge + l * BT * 4 * C;
            TIMED(0, loom_cpu_matmul_backward(dge, dw, db, dx, g, wfcp, B, T, 4 * C, C));
            TIMED(3, loom_cpu_gelu_backward(dbig, f, dge, BT * 4 * C));
            TIMED(0, loom_cpu_matmul_backward(dln, dw, db, dbig, l2, wfc, B, T, C, 4 * C));
            TIMED(2, loom_cpu_layernorm_backward(dx2, dw, db, dln, r, lnw, s + 2 * BT, s + 3 * BT,
                                                 B, T, C));
            TIMED(4, loom_cpu_accumulate(dx2, dx, BT * C));
            TIMED(0, loom_cpu_matmul_backward(dln, dw, db, dx2, a, wproj, B, T, C, C));
            TIMED(1, loom_cpu_attention_backward(dqkv, scratch, dln, q, att + l * natt, B, T, C,
                                                 NH));
            TIMED(0, loom_cpu_matmul_backward(dln, dw, db, dqkv, l1, wqkv, B, T, C, 3 * C));
            TIMED(2, loom_cpu_layernorm_backward(dx, dw, db, dln, xl, lnw, s, s + BT, B, T, C));
            TIMED(4, loom_cpu_accumulate(dx, dx2, BT * C));
        }
        const double ms = (omp_get_wtime() - t0) * 1e3;
        if (ms < best) {
            best = ms;
            memcpy(best_part, part, sizeof part);
        }
    }
    printf("%-6s step (fwd+bwd, L=%d): %8.2f ms  %8.0f tokens/s\n", name, L, best,
           BT / best * 1e3);
    static const char *const part_name[7] = {"matmul", "attention", "layernorm", "gelu",
                                             "residual", "crossentropy", "lm head"};
    for (int p = 0; p < 7; p++)
        printf("       %-13s %8.2f ms  %5.1f%%\n", part_name[p], best_part[p] * 1e3,
               100.0 * best_part[p] * 1e3 / best);
    free(wte), free(wqkv), free(wproj), free(wfc), free(wfcp), free(bias), free(lnw), free(dw);
    free(dwte), free(db), free(x), free(ln), free(stats), free(qkv), free(aty), free(att);
    free(x2), free(fc), free(ge), free(logits), free(losses), free(scratch), free(dx), free(dx2);
    free(ce_stats);
    free(dln), free(dqkv), free(dbig), free(dge), free(tmp), free(targets);
}

/* The CPU's brand string (cpuid leaves 0x80000002-4), for the benchmark rows. */
static const char *cpu_model(void)
{
    static char name[49];
#if defined(__x86_64__)
    unsigned r[12];
    for (unsigned i = 0; i < 3; i++)
        __cpuid(0x80000002u + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
    memcpy(name, r, 48);
    char *p = name;
    while (*p == ' ')
        p++;
    for (char *e = p + strlen(p); e > p && e[-1] == ' ';)
        *--e = '\0';
    return p;
#else
    return "?";
#endif
}

/* Is word one of the space-separated words of list? */
static int has(const char *list, const char *word)
{
    const size_t n = strlen(word);
    for (const char *p = strstr(list, word); p; p = strstr(p + 1, word))
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    char desc[400];
    const int threads = argc > 1 ? atoi(argv[1]) : 0;
    const char *want =
        argc > 2 ? argv[2] : "square canonical attention tiny small kernels tinystep canonicalstep smallstep";
    const int rc = loom_cpu_blas_init(threads, desc, sizeof desc);
    printf("%s (init rc %d; fallback %s)\ncpu: %s, kernels isa %s\n\n", desc, rc,
           loom_cpu_sgemm_fallback_isa(), cpu_model(), loom_cpu_isa_describe());
    if (rc != 0)
        return 1;
    const int gemms = has(want, "square") || has(want, "tiny") || has(want, "small");
    const size_t big = gemms ? (size_t)50304 * 1536 : 1;
    float *A = buf(big), *B = buf(big), *C = buf(gemms ? (size_t)50304 * 1024 : 1);
    if (has(want, "square")) {
        /* OpenBLAS and loom's own GEMM alternately, one call each per round, best of 15:
         * on shared cores the best round is the one least disturbed, and alternating puts
         * both paths under the same load */
        const shape sq = {0, 0, 1024, 1024, 1024};
        double best[2] = {1e30, 1e30};
        for (int round = 0; round < 15; round++)
            for (int fb = 0; fb < 2; fb++) {
                double t0 = omp_get_wtime();
                (fb ? loom_cpu_sgemm_fallback : loom_cpu_sgemm)(0, 0, sq.M, sq.N, sq.K, 1.0f, A,
                                                                 sq.K, B, sq.N, 0.0f, C, sq.N);
                double ms = (omp_get_wtime() - t0) * 1e3;
                best[fb] = ms < best[fb] ? ms : best[fb];
            }
        for (int fb = 0; fb < 2; fb++)
            printf("square %-8s NN 1024^3 %8.3f ms  %6.1f GFLOP/s\n", fb ? "fallback" : "sgemm",
                   best[fb], 2e-6 * 1024 * 1024 * 1024 / best[fb]);
        printf("square fallback GFLOP/s / sgemm GFLOP/s: %.2f (%s, %s, threads=%d)\n\n",
               best[0] / best[1],
               cpu_model(), loom_cpu_sgemm_fallback_isa(), omp_get_max_threads());
    }
    if (has(want, "canonical")) { /* matmul_forward 768 x 768 -> 4*768: OpenBLAS vs canonical */
        const int BT = 768, Cc = 768, OC = 4 * 768;
        float *in = buf((size_t)BT * Cc), *w = buf((size_t)OC * Cc), *b = buf(OC);
        float *out = buf((size_t)BT * OC);
        for (int canon = 0; canon < 2; canon++) {
            loom_cpu_set_deterministic(canon);
            double best_ = 1e30;
            for (int round_ = 0; round_ < 5; round_++) {
                double t0_ = omp_get_wtime();
                for (int r_ = 0; r_ < 10; r_++)
                    loom_cpu_matmul_forward(out, in, w, b, 1, BT, Cc, OC);
                double ms_ = (omp_get_wtime() - t0_) * 1e3 / 10;
                best_ = ms_ < best_ ? ms_ : best_;
            }
            printf("matmul fwd %dx%d -> %d %-10s %8.3f ms  %6.1f GFLOP/s\n", BT, Cc, OC,
                   canon ? "canonical" : "default", best_, 2e-6 * BT * Cc * OC / best_);
        }
        loom_cpu_set_deterministic(0);
        free(in), free(w), free(b), free(out);
        printf("\n");
    }
    if (has(want, "tiny"))
        bench_config("tiny", 8 * 64, 128, 256, A, B, C);
    if (has(want, "small"))
        bench_config("small", 4 * 256, 384, 50304, A, B, C);
    if (has(want, "tinystep"))
        bench_step("tiny", 8, 64, 128, 4, 4, 256, 256);
    if (has(want, "canonicalstep")) { /* the same step with every GEMM on loom's own */
        loom_cpu_set_deterministic(1);
        bench_step("tiny canonical", 8, 64, 128, 4, 4, 256, 256);
        loom_cpu_set_deterministic(0);
    }
    if (has(want, "smallstep"))
        bench_step("small", 4, 256, 384, 6, 6, 50257, 50304);
    if (has(want, "attention")) {
        bench_attention("tiny", 8, 64, 128, 4);
        bench_attention("small", 4, 256, 384, 6);
        printf("\n");
    }
    if (has(want, "kernels")) {
        bench_kernels("tiny", 8, 64, 128, 4, 256, 256);
        bench_kernels("small", 4, 256, 384, 6, 50257, 50304);
    }
    free(A), free(B), free(C);
    return 0;
}
