/* test_cuda_ops.c — every op of loom-backend-cuda.so against loom-backend-cpu.so on the
 * same inputs (argv: the CPU plugin, the CUDA plugin), fp32. Tolerances, elementwise
 * |gpu - cpu| <= atol + rtol |cpu|: 1e-6 + 1e-5 for elementwise ops (exp and the FMA
 * contraction differ by an ulp or so), 1e-5 + 1e-4 for reductions and products of O(1)
 * data over up to a few hundred terms (a different summation order), and exact equality
 * where the op is exact (lookups, copies, max, masks, the non-finite check). Also: zeroed
 * alloc, the accumulate-vs-overwrite contract on the GPU (called twice), canonical mode's
 * ordered GEMM (a one-row product has the bits of that row of a larger one; a column split
 * has the unsplit bits), and attention_decode giving attention_forward's last row bitwise
 * in row-stable mode; the llama family's ops (grouped-query attention with 2 and 1 kv heads,
 * its decode bitwise its forward's last row in row-stable mode, RMSNorm, SwiGLU, RoPE: fp32
 * only, as the CPU's are); the MoE layer's row moves (rows_gather, rows_scatter_add,
 * rows_dot), bitwise the CPU's; distillation's attention_backward_datt; the 16-bit backward
 * products and gemm_w16 (test_cuda_ops_bf16.c, its own tolerance against sum |a b|).
 * Check in no-fork mode (CUDA after fork() is undefined). No GPU visible: exit 77 (skip).
 */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "test_cuda_ops_bf16.h" /* matmul_backward_dt, gemm_w16 */

void ct_add_flash_tc(TCase *tc); /* test_cuda_flash_tc.c: the tensor-core attention */

#define EW 1e-6, 1e-5  /* elementwise */
#define RED 1e-5, 1e-4 /* reductions, products */
#define EXACT 0.0, 0.0

enum { B = 2, T = 48, C = 96, NH = 4, OC = 160, V = 1000, VP = 1024 };
static const size_t R = (size_t)B * T;

static ct_buf in(const char *name, void *host, size_t bytes)
{
    return (ct_buf){name, host, bytes, 0, 0, 0};
}

static ct_buf out(const char *name, void *host, size_t bytes, double atol, double rtol)
{
    return (ct_buf){name, host, bytes, 1, atol, rtol};
}

static int *tokens(size_t n, int lo, int hi, unsigned seed)
{
    int *t = malloc(n * sizeof(int));
    unsigned s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        t[i] = lo + (int)((s >> 8) % (unsigned)(hi - lo));
    }
    return t;
}

/* --- encoder ------------------------------------------------------------------------- */
static void op_embedding(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    /* a slice of the vocabulary: rows [100, 600) held, other tokens give zeros */
    k->embedding_forward(d[0], d[1], d[2], 100, 500, R, C);
    k->embedding_backward(d[3], d[4], d[1], 100, 500, R, C);
    k->embedding_backward(d[3], d[4], d[1], 100, 500, R, C); /* accumulates */
}

START_TEST(test_embedding)
{
    float *o = ct_floats(R * C, 1, -1, 1), *wte = ct_floats(500 * C, 2, -1, 1);
    float *dwte = ct_floats(500 * C, 3, -1, 1), *dout = ct_floats(R * C, 4, -1, 1);
    int *tok = tokens(R, 0, V, 5);
    tok[0] = tok[7] = tok[9] = 150; /* repeated tokens add into one row */
    ct_buf b[] = {out("out", o, R * C * 4, EXACT), in("tokens", tok, R * 4),
                  in("wte", wte, 500 * C * 4), out("dwte", dwte, 500 * C * 4, EXACT),
                  in("dout", dout, R * C * 4)};
    ct_compare_op("embedding fwd/bwd", b, 5, op_embedding, NULL);
    free(o), free(wte), free(dwte), free(dout), free(tok);
}
END_TEST

static void op_position(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    k->position_forward(d[0], d[1], 5, R - 5, T, C); /* a shard starting at row 5 */
    k->position_backward(d[2], d[3], B, T, C);
}

START_TEST(test_position)
{
    float *o = ct_floats(R * C, 1, -1, 1), *wpe = ct_floats(T * C, 2, -1, 1);
    float *dwpe = ct_floats(T * C, 3, -1, 1), *dout = ct_floats(R * C, 4, -1, 1);
    ct_buf b[] = {out("out", o, R * C * 4, EW), in("wpe", wpe, T * C * 4),
                  out("dwpe", dwpe, T * C * 4, EW), in("dout", dout, R * C * 4)};
    ct_compare_op("position fwd/bwd", b, 4, op_position, NULL);
    free(o), free(wpe), free(dwpe), free(dout);
}
END_TEST

/* --- layernorm ----------------------------------------------------------------------- */
static void op_layernorm(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    k->layernorm_forward(d[0], d[1], d[2], d[3], d[4], d[5], B, T, C);
    k->layernorm_backward(d[6], d[7], d[8], d[9], d[3], d[4], d[1], d[2], B, T, C);
}

START_TEST(test_layernorm)
{
    float *x = ct_floats(R * C, 1, -2, 3), *w = ct_floats(C, 2, 0.5, 1.5), *bb = ct_floats(C, 3, -1, 1);
    float *o = ct_floats(R * C, 4, 0, 0), *mean = ct_floats(R, 5, 0, 0), *rstd = ct_floats(R, 6, 0, 0);
    float *dx = ct_floats(R * C, 7, -9, 9), *dw = ct_floats(C, 8, -1, 1), *db = ct_floats(C, 9, -1, 1);
    float *dout = ct_floats(R * C, 10, -1, 1);
    ct_buf b[] = {out("out", o, R * C * 4, RED), out("mean", mean, R * 4, RED),
                  out("rstd", rstd, R * 4, RED), in("inp", x, R * C * 4), in("w", w, C * 4),
                  in("b", bb, C * 4), out("dinp", dx, R * C * 4, RED),
                  out("dweight", dw, C * 4, RED), out("dbias", db, C * 4, RED),
                  in("dout", dout, R * C * 4)};
    ct_compare_op("layernorm fwd/bwd", b, 10, op_layernorm, NULL);
    free(x), free(w), free(bb), free(o), free(mean), free(rstd), free(dx), free(dw), free(db),
        free(dout);
}
END_TEST

/* --- matmul and gemm ----------------------------------------------------------------- */
/* mode 0: no bias; 1: bias; 2: bias, every pointer one float past an aligned one (the
 * model's tensors are slices of one buffer: cuBLASLt must not assume 256-byte alignment) */
static void op_matmul(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const int mode = *(int *)ctx, o = mode == 2;
    float *p[8];
    for (int i = 0; i < 8; i++)
        p[i] = (float *)d[i] + o;
    k->matmul_forward(p[0], p[1], p[2], mode ? p[3] : NULL, B, T, C, OC);
    k->matmul_backward(p[4], p[5], mode ? p[6] : NULL, p[7], p[1], p[2], B, T, C, OC);
    k->matmul_backward(NULL, p[5], mode ? p[6] : NULL, p[7], p[1], p[2], B, T, C, OC);
}

START_TEST(test_matmul)
{
    static const char *names[] = {"matmul fwd/bwd (no bias)", "matmul fwd/bwd (bias)",
                                  "matmul fwd/bwd (unaligned)"};
    for (int mode = 0; mode < 3; mode++) {
        const size_t x1 = 1; /* room for the unaligned case's offset */
        float *o = ct_floats(R * OC + x1, 1, 0, 0), *x = ct_floats(R * C + x1, 2, -1, 1);
        float *w = ct_floats((size_t)OC * C + x1, 3, -0.3f, 0.3f), *bias = ct_floats(OC + x1, 4, -1, 1);
        float *dx = ct_floats(R * C + x1, 5, -9, 9), *dw = ct_floats((size_t)OC * C + x1, 6, -1, 1);
        float *db = ct_floats(OC + x1, 7, -1, 1), *dout = ct_floats(R * OC + x1, 8, -1, 1);
        ct_buf b[] = {out("out", o, (R * OC + x1) * 4, RED), in("inp", x, (R * C + x1) * 4),
                      in("weight", w, ((size_t)OC * C + x1) * 4), in("bias", bias, (OC + x1) * 4),
                      out("dinp", dx, (R * C + x1) * 4, RED),
                      out("dweight", dw, ((size_t)OC * C + x1) * 4, RED),
                      out("dbias", db, (OC + x1) * 4, RED), in("dout", dout, (R * OC + x1) * 4)};
        ct_compare_op(names[mode], b, 8, op_matmul, &mode);
        free(o), free(x), free(w), free(bias), free(dx), free(dw), free(db), free(dout);
    }
}
END_TEST

/* --- 16-bit products (matmul_forward_dt) -------------------------------------------- */
typedef struct dt_case {
    loom_dtype dt;
    int bias;
} dt_case;

static int has_dt(const loom_backend_ops *k)
{
    return k->size > offsetof(loom_backend_ops, matmul_forward_dt) && k->matmul_forward_dt;
}

/* The GPU's 16-bit product; the CPU (no such op) the fp32 one on the same rounded values. */
static void op_matmul_dt(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const dt_case *c = ctx;
    if (has_dt(k))
        k->matmul_forward_dt(d[0], d[1], d[2], c->bias ? d[3] : NULL, B, T, C, OC, c->dt);
    else
        k->matmul_forward(d[0], d[1], d[2], c->bias ? d[3] : NULL, B, T, C, OC);
}

/* inp and weight rounded to dt (what the model passes): the GPU's 16-bit product against
 * the CPU's fp32 product of those values. Then, on the GPU alone, the same op on values
 * NOT rounded: it must give the fp32 product of the rounded values (the operands really
 * are narrowed to dt), which differs from the fp32 product of the unrounded ones (so an
 * op that fell back to fp32 fails here). */
START_TEST(test_matmul_dt)
{
    ck_assert_msg(has_dt(ct_gpu.k), "the CUDA backend has no matmul_forward_dt");
    for (int ci = 0; ci < 4; ci++) {
        dt_case c = {ci < 2 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F16, ci & 1};
        float *o = ct_floats(R * OC, 1, 0, 0), *x = ct_floats(R * C, 2, -1, 1);
        float *w = ct_floats((size_t)OC * C, 3, -0.3f, 0.3f), *bias = ct_floats(OC, 4, -1, 1);
        float *xr = malloc(R * C * 4), *wr = malloc((size_t)OC * C * 4);
        ct_cpu.k->round_to(xr, x, R * C, c.dt); /* CPU memory is host memory */
        ct_cpu.k->round_to(wr, w, (size_t)OC * C, c.dt);
        ct_buf b[] = {out("out", o, R * OC * 4, RED), in("inp", xr, R * C * 4),
                      in("weight", wr, (size_t)OC * C * 4), in("bias", bias, OC * 4)};
        char name[64];
        snprintf(name, sizeof name, "matmul_forward_dt %s%s", c.dt == LOOM_DTYPE_F16 ? "f16" : "bf16",
                 c.bias ? " bias" : "");
        ct_compare_op(name, b, 4, op_matmul_dt, &c);
        const loom_backend_ops *k = ct_gpu.k;
        void *s = ct_gpu.self;
        float *dx = k->alloc(s, R * C * 4), *dw = k->alloc(s, (size_t)OC * C * 4);
        float *dxr = k->alloc(s, R * C * 4), *dwr = k->alloc(s, (size_t)OC * C * 4);
        float *d16 = k->alloc(s, R * OC * 4), *d32 = k->alloc(s, R * OC * 4);
        k->copy_to_device(s, dx, x, R * C * 4);
        k->copy_to_device(s, dw, w, (size_t)OC * C * 4);
        k->copy_to_device(s, dxr, xr, R * C * 4);
        k->copy_to_device(s, dwr, wr, (size_t)OC * C * 4);
        float *r16 = malloc(R * OC * 4), *rr = malloc(R * OC * 4), *r32 = malloc(R * OC * 4);
        k->matmul_forward_dt(d16, dx, dw, NULL, B, T, C, OC, c.dt);
        k->copy_to_host(s, r16, d16, R * OC * 4);
        k->matmul_forward(d32, dxr, dwr, NULL, B, T, C, OC);
        k->copy_to_host(s, rr, d32, R * OC * 4);
        k->matmul_forward(d32, dx, dw, NULL, B, T, C, OC);
        k->copy_to_host(s, r32, d32, R * OC * 4);
        double e_rounded = 0, e_unrounded = 0;
        for (size_t i = 0; i < R * OC; i++) {
            e_rounded = fmax(e_rounded, fabs((double)r16[i] - rr[i]) / (1e-5 + 1e-4 * fabs(rr[i])));
            e_unrounded = fmax(e_unrounded, fabs((double)r16[i] - r32[i]));
        }
        printf("%-28s narrowed in the op: %.3g of the tolerance from the rounded fp32 product, "
               "%.3g from the unrounded one\n", name, e_rounded, e_unrounded);
        ck_assert_msg(e_rounded <= 1.0, "%s: the op's product is not that of the rounded operands",
                      name);
        ck_assert_msg(e_unrounded > 1e-4, "%s: the op's product is the fp32 one of the unrounded "
                      "operands (not 16-bit)", name);
        k->free(s, dx), k->free(s, dw), k->free(s, dxr), k->free(s, dwr), k->free(s, d16),
            k->free(s, d32);
        free(o), free(x), free(w), free(bias), free(xr), free(wr), free(r16), free(rr), free(r32);
    }
}
END_TEST

typedef struct gemm_case {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
} gemm_case;

static void op_gemm(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const gemm_case *g = ctx;
    k->gemm(g->ta, g->tb, g->M, g->N, g->K, g->alpha, d[0], g->lda, d[1], g->ldb, g->beta, d[2],
            g->ldc);
}

static void run_gemm_cases(const char *what)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case g = {ta, tb, 37, 53, 70, 0, 0, 60, 0.75f, ta ? 0.5f : 0.0f};
            g.lda = (ta ? g.M : g.K) + 3; /* leading dimensions wider than the slice */
            g.ldb = (tb ? g.K : g.N) + 5;
            size_t na = (size_t)(ta ? g.K : g.M) * g.lda, nb = (size_t)(tb ? g.N : g.K) * g.ldb;
            size_t nc = (size_t)g.M * g.ldc;
            float *a = ct_floats(na, 1 + ta, -1, 1), *bm = ct_floats(nb, 3 + tb, -1, 1);
            float *c = ct_floats(nc, 5, -1, 1);
            ct_buf b[] = {in("A", a, na * 4), in("B", bm, nb * 4), out("C", c, nc * 4, RED)};
            char name[64];
            snprintf(name, sizeof name, "%s gemm %c%c", what, ta ? 'T' : 'N', tb ? 'T' : 'N');
            ct_compare_op(name, b, 3, op_gemm, &g);
            free(a), free(bm), free(c);
        }
}

START_TEST(test_gemm)
{
    run_gemm_cases("fast");
    ct_gpu.k->set_deterministic(ct_gpu.self, 1);
    ct_cpu.k->set_deterministic(ct_cpu.self, 1);
    run_gemm_cases("canonical");
    ct_gpu.k->set_deterministic(ct_gpu.self, 0);
    ct_cpu.k->set_deterministic(ct_cpu.self, 0);
}
END_TEST

/* Canonical mode on the GPU: row i of a one-row product, and columns [16, 53) of a product
 * split by columns, have the bits of the full product. */
START_TEST(test_ordered_gemm_layout_free)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    enum { M = 40, N = 53, K = 300 };
    float *a = ct_floats(M * K, 1, -1, 1), *bm = ct_floats(K * N, 2, -1, 1);
    float *full = malloc(M * N * 4), *row = malloc(N * 4), *cols = malloc(M * N * 4);
    float *da = k->alloc(s, M * K * 4), *db = k->alloc(s, K * N * 4), *dc = k->alloc(s, M * N * 4);
    k->copy_to_device(s, da, a, M * K * 4);
    k->copy_to_device(s, db, bm, K * N * 4);
    k->set_deterministic(s, 1);
    k->gemm(0, 0, M, N, K, 1.0f, da, K, db, N, 0.0f, dc, N);
    k->copy_to_host(s, full, dc, M * N * 4);
    k->gemm(0, 0, 1, N, K, 1.0f, da + 17 * K, K, db, N, 0.0f, dc, N);
    k->copy_to_host(s, row, dc, N * 4);
    ck_assert_msg(memcmp(row, full + 17 * N, N * 4) == 0, "a one-row product differs from its row");
    k->zero(s, dc, M * N * 4);
    k->gemm(0, 0, M, N - 16, K, 1.0f, da, K, db + 16, N, 0.0f, dc + 16, N);
    k->copy_to_host(s, cols, dc, M * N * 4);
    for (int i = 0; i < M; i++)
        ck_assert_msg(memcmp(cols + i * N + 16, full + i * N + 16, (N - 16) * 4) == 0,
                      "row %d: a column-split product differs from the unsplit one", i);
    k->set_deterministic(s, 0);
    k->free(s, da), k->free(s, db), k->free(s, dc);
    free(a), free(bm), free(full), free(row), free(cols);
}
END_TEST

/* --- attention ----------------------------------------------------------------------- */
static void op_attention(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    k->attention_forward(d[0], d[1], d[2], B, T, C, NH);
    k->attention_backward(d[3], d[4], d[5], d[2], d[1], B, T, C, NH);
}

START_TEST(test_attention)
{
    const size_t na = (size_t)B * NH * T * T;
    float *o = ct_floats(R * C, 1, 0, 0), *att = ct_floats(na, 2, 0, 0);
    float *qkv = ct_floats(R * 3 * C, 3, -1.5f, 1.5f), *dqkv = ct_floats(R * 3 * C, 4, -9, 9);
    float *scratch = ct_floats(2 * na, 5, 0, 0), *dout = ct_floats(R * C, 6, -1, 1);
    ct_buf b[] = {out("out", o, R * C * 4, RED), out("att", att, na * 4, RED),
                  in("qkv", qkv, R * 3 * C * 4), out("dqkv", dqkv, R * 3 * C * 4, RED),
                  in("scratch", scratch, 2 * na * 4), in("dout", dout, R * C * 4)};
    ct_compare_op("attention fwd/bwd", b, 6, op_attention, NULL);
    const float *ga = ct_gpu_result(1); /* the upper triangle exactly 0 */
    for (size_t bh = 0; bh < (size_t)B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int j = t + 1; j < T; j++)
                ck_assert_msg(ga[(bh * T + t) * T + j] == 0.0f, "att above the diagonal");
    free(o), free(att), free(qkv), free(dqkv), free(scratch), free(dout);
}
END_TEST

/* Distillation's attention term's backward: attention_backward with a further gradient of
 * the probabilities (datt_extra, of the size of dO V^T's entries), RED; a backend that
 * dropped it is off by far more. */
static void op_attention_datt(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    k->attention_forward(d[0], d[1], d[2], B, T, C, NH);
    k->attention_backward_datt(d[3], d[4], d[5], d[2], d[1], d[6], B, T, C, NH);
}

START_TEST(test_attention_datt)
{
    const size_t na = (size_t)B * NH * T * T;
    float *o = ct_floats(R * C, 1, 0, 0), *att = ct_floats(na, 2, 0, 0);
    float *qkv = ct_floats(R * 3 * C, 3, -1.5f, 1.5f), *dqkv = ct_floats(R * 3 * C, 4, -9, 9);
    float *scratch = ct_floats(2 * na, 5, 0, 0), *dout = ct_floats(R * C, 6, -1, 1);
    float *extra = ct_floats(na, 7, -2, 2);
    ct_buf b[] = {out("out", o, R * C * 4, RED), out("att", att, na * 4, RED),
                  in("qkv", qkv, R * 3 * C * 4), out("dqkv", dqkv, R * 3 * C * 4, RED),
                  in("scratch", scratch, 2 * na * 4), in("dout", dout, R * C * 4),
                  in("datt_extra", extra, na * 4)};
    ct_compare_op("attention_backward_datt", b, 7, op_attention_datt, NULL);
    free(o), free(att), free(qkv), free(dqkv), free(scratch), free(dout), free(extra);
}
END_TEST

/* The fused kernels against this backend's batched-GEMM path (the simple reference) on the
 * same values: fp32 q, k, v, and bf16 / fp16 ones (rounded on the host; the flash kernels
 * read them as 16-bit values narrowed on the device, the reference their fp32 widening).
 * Shapes: T = 48 (a partial tile), and T = 100 over two query blocks with a 128-wide head
 * (the widest the kernels hold). Tolerance RED (another order of the same sums). */
static const char *dt_name(loom_dtype dt)
{
    return dt == LOOM_DTYPE_BF16 ? "bf16" : dt == LOOM_DTYPE_F16 ? "f16" : "fp32";
}

static double max_rel(const float *a, const float *ref, size_t n, double atol, double rtol)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / (atol + rtol * fabs((double)ref[i]));
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    return worst;
}

START_TEST(test_attention_flash)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    ck_assert_msg(k->size > offsetof(loom_backend_ops, attention_flash_backward) &&
                  k->attention_flash_forward && k->attention_flash_backward,
                  "the CUDA backend has no attention_flash_forward/_backward");
    static const int shapes[2][4] = {{B, T, C, NH}, {1, 100, 128, 1}};
    static const loom_dtype dts[3] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int si = 0; si < 2; si++)
        for (int di = 0; di < 3; di++) {
            const int b = shapes[si][0], t = shapes[si][1], c = shapes[si][2], nh = shapes[si][3];
            const loom_dtype dt = dts[di];
            const size_t r = (size_t)b * t, na = (size_t)b * nh * t * t, nq = r * 3 * c;
            float *qkv = ct_floats(nq, 11 + si, -1.5f, 1.5f), *dout = ct_floats(r * c, 13, -1, 1);
            if (dt != LOOM_DTYPE_F32)
                ct_cpu.k->round_to(qkv, qkv, nq, dt);
            float *d_qkv = k->alloc(s, nq * 4), *d_dout = k->alloc(s, r * c * 4);
            void *d_q16 = k->alloc(s, nq * 2);
            float *d_att = k->alloc(s, na * 4), *d_scr = k->alloc(s, 2 * na * 4);
            float *d_ref = k->alloc(s, r * c * 4), *d_dref = k->alloc(s, nq * 4);
            float *d_out = k->alloc(s, r * c * 4), *d_dq = k->alloc(s, nq * 4);
            float *d_lse = k->alloc(s, (size_t)b * nh * t * 4);
            k->copy_to_device(s, d_qkv, qkv, nq * 4);
            k->copy_to_device(s, d_dout, dout, r * c * 4);
            k->attention_forward(d_ref, d_att, d_qkv, b, t, c, nh);
            k->attention_backward(d_dref, d_scr, d_dout, d_qkv, d_att, b, t, c, nh);
            const void *src = d_qkv;
            if (dt != LOOM_DTYPE_F32) {
                k->convert_from_f32(d_q16, d_qkv, nq, dt);
                src = d_q16;
            }
            k->attention_flash_forward(d_out, d_lse, src, b, t, c, nh, dt);
            k->attention_flash_backward(d_dq, d_scr, d_dout, src, d_out, d_lse, b, t, c, nh, dt);
            k->synchronize(s);
            float *ref = malloc(r * c * 4), *o = malloc(r * c * 4);
            float *dref = malloc(nq * 4), *dq = malloc(nq * 4);
            k->copy_to_host(s, ref, d_ref, r * c * 4);
            k->copy_to_host(s, o, d_out, r * c * 4);
            k->copy_to_host(s, dref, d_dref, nq * 4);
            k->copy_to_host(s, dq, d_dq, nq * 4);
            const double eo = max_rel(o, ref, r * c, RED), ed = max_rel(dq, dref, nq, RED);
            printf("attention_flash %s B%d T%d C%d NH%d: out %.3g, dqkv %.3g of the tolerance "
                   "(1e-5 + 1e-4 |batched|)\n", dt_name(dt), b, t, c, nh, eo, ed);
            ck_assert_msg(eo <= 1.0, "flash %s T%d: out differs from the batched path",
                          dt_name(dt), t);
            ck_assert_msg(ed <= 1.0, "flash %s T%d: dqkv differs from the batched path",
                          dt_name(dt), t);
            k->free(s, d_qkv), k->free(s, d_dout), k->free(s, d_q16), k->free(s, d_att);
            k->free(s, d_scr), k->free(s, d_ref), k->free(s, d_dref), k->free(s, d_out);
            k->free(s, d_dq), k->free(s, d_lse);
            free(qkv), free(dout), free(ref), free(o), free(dref), free(dq);
        }
}
END_TEST

START_TEST(test_attention_decode_bitwise)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    enum { TT = 29 };
    float *qkv = ct_floats((size_t)TT * 3 * C, 7, -1.5f, 1.5f);
    float *full = malloc((size_t)TT * C * 4), *row = malloc(C * 4);
    float *dq = k->alloc(s, (size_t)TT * 3 * C * 4), *dout = k->alloc(s, (size_t)TT * C * 4);
    float *datt = k->alloc(s, (size_t)NH * TT * TT * 4), *drow = k->alloc(s, C * 4);
    float *drow_att = k->alloc(s, (size_t)NH * TT * 4);
    k->copy_to_device(s, dq, qkv, (size_t)TT * 3 * C * 4);
    k->set_deterministic(s, 2);
    k->attention_forward(dout, datt, dq, 1, TT, C, NH);
    k->attention_decode(drow, drow_att, TT, dq, TT - 1, C, NH);
    k->copy_to_host(s, full, dout, (size_t)TT * C * 4);
    k->copy_to_host(s, row, drow, C * 4);
    k->set_deterministic(s, 0);
    ck_assert_msg(memcmp(row, full + (size_t)(TT - 1) * C, C * 4) == 0,
                  "attention_decode's row differs from attention_forward's last row");
    k->free(s, dq), k->free(s, dout), k->free(s, datt), k->free(s, drow), k->free(s, drow_att);
    free(qkv), free(full), free(row);
}
END_TEST

/* --- the llama family: grouped-query attention, RMSNorm, SwiGLU, RoPE ------------------ */
/* KVH = 2 (two q heads per kv head) and 1 (all four on one): qkv rows C + 2 KVH hs wide.
 * KVH = NH is attention_forward/_backward itself (test_attention). Tolerance RED; decode
 * against the CPU's decode (RED) and, in row-stable mode, bitwise the forward's last row. */
static void op_attention_gqa(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const int kvh = *(const int *)ctx;
    k->attention_gqa_forward(d[0], d[1], d[2], B, T, C, NH, kvh);
    k->attention_gqa_backward(d[3], d[4], d[5], d[2], d[1], B, T, C, NH, kvh);
    /* decode row T-1 of sequence 0 (its first T rows of qkv) */
    k->attention_gqa_decode(d[6], d[7], T, d[2], T - 1, C, NH, kvh);
}

START_TEST(test_attention_gqa)
{
    const loom_backend_ops *k = ct_gpu.k;
    ck_assert_msg(k->size > offsetof(loom_backend_ops, attention_gqa_decode) &&
                      k->attention_gqa_forward && k->attention_gqa_backward &&
                      k->attention_gqa_decode,
                  "the CUDA backend has no attention_gqa_forward/_backward/_decode");
    static const int kvhs[] = {2, 1};
    for (int c = 0; c < 2; c++) {
        int kvh = kvhs[c];
        const size_t na = (size_t)B * NH * T * T, W = C + 2 * (size_t)kvh * (C / NH);
        float *o = ct_floats(R * C, 1, 0, 0), *att = ct_floats(na, 2, 0, 0);
        float *qkv = ct_floats(R * W, 3, -1.5f, 1.5f), *dqkv = ct_floats(R * W, 4, -9, 9);
        float *scratch = ct_floats(2 * na, 5, 0, 0), *dout = ct_floats(R * C, 6, -1, 1);
        float *orow = ct_floats(C, 7, 0, 0), *arow = ct_floats((size_t)NH * T, 8, 0, 0);
        ct_buf b[] = {out("out", o, R * C * 4, RED), out("att", att, na * 4, RED),
                      in("qkv", qkv, R * W * 4), out("dqkv", dqkv, R * W * 4, RED),
                      in("scratch", scratch, 2 * na * 4), in("dout", dout, R * C * 4),
                      out("decode out", orow, C * 4, RED),
                      out("decode att", arow, (size_t)NH * T * 4, RED)};
        ct_compare_op(kvh == 2 ? "attention_gqa fwd/bwd/decode (KVH 2)"
                               : "attention_gqa fwd/bwd/decode (KVH 1)",
                      b, 8, op_attention_gqa, &kvh);

        /* row-stable mode: decode's row is the forward's last row, bit for bit */
        void *s = ct_gpu.self;
        float *full = malloc(R * C * 4), *row = malloc(C * 4);
        float *dq = k->alloc(s, R * W * 4), *dfull = k->alloc(s, R * C * 4);
        float *datt = k->alloc(s, na * 4), *drow = k->alloc(s, C * 4);
        float *drow_att = k->alloc(s, (size_t)NH * T * 4);
        k->copy_to_device(s, dq, qkv, R * W * 4);
        k->set_deterministic(s, 2);
        k->attention_gqa_forward(dfull, datt, dq, 1, T, C, NH, kvh);
        k->attention_gqa_decode(drow, drow_att, T, dq, T - 1, C, NH, kvh);
        k->copy_to_host(s, full, dfull, (size_t)T * C * 4);
        k->copy_to_host(s, row, drow, C * 4);
        k->set_deterministic(s, 0);
        ck_assert_msg(memcmp(row, full + (size_t)(T - 1) * C, C * 4) == 0,
                      "KVH %d: attention_gqa_decode's row differs from the forward's last row",
                      kvh);
        k->free(s, dq), k->free(s, dfull), k->free(s, datt), k->free(s, drow),
            k->free(s, drow_att);
        free(full), free(row);
        free(o), free(att), free(qkv), free(dqkv), free(scratch), free(dout), free(orow),
            free(arow);
    }
}
END_TEST

/* eps 1e-6 (Llama's; layernorm's is 1e-5), with the first 8 rows scaled to about 1e-3 so
 * that their mean square (~1e-6) is eps's size: a wrong eps moves those rows by far more
 * than RED. Backward twice (dweight accumulates), then once more in place (dinp = dout). */
static void op_rmsnorm(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    k->rmsnorm_forward(d[0], d[1], d[2], d[3], R, C, 1e-6f);
    k->rmsnorm_backward(d[4], d[5], d[6], d[2], d[3], d[1], R, C);
    k->rmsnorm_backward(d[4], d[5], d[6], d[2], d[3], d[1], R, C);
    k->rmsnorm_backward(d[7], d[5], d[7], d[2], d[3], d[1], R, C);
}

START_TEST(test_rmsnorm)
{
    const loom_backend_ops *k = ct_gpu.k;
    ck_assert_msg(k->size > offsetof(loom_backend_ops, rope_backward) && k->rmsnorm_forward &&
                      k->rmsnorm_backward,
                  "the CUDA backend has no rmsnorm_forward/_backward");
    float *x = ct_floats(R * C, 1, -2, 3), *w = ct_floats(C, 2, 0.5, 1.5);
    for (size_t i = 0; i < 8 * (size_t)C; i++)
        x[i] *= 1e-3f;
    float *o = ct_floats(R * C, 4, 0, 0), *rstd = ct_floats(R, 5, 0, 0);
    float *dx = ct_floats(R * C, 7, -9, 9), *dw = ct_floats(C, 8, -1, 1);
    float *dout = ct_floats(R * C, 10, -1, 1), *dio = ct_floats(R * C, 11, -1, 1);
    ct_buf b[] = {out("out", o, R * C * 4, RED),      out("rstd", rstd, R * 4, RED),
                  in("inp", x, R * C * 4),             in("w", w, C * 4),
                  out("dinp", dx, R * C * 4, RED),     out("dweight", dw, C * 4, RED),
                  in("dout", dout, R * C * 4),         out("dinp in place", dio, R * C * 4, RED)};
    ct_compare_op("rmsnorm fwd/bwd", b, 8, op_rmsnorm, NULL);
    free(x), free(w), free(o), free(rstd), free(dx), free(dw), free(dout), free(dio);
}
END_TEST

/* F = 80 (not a multiple of the block); gates in [-6, 6] plus -100 (sigmoid 0) and 100. */
enum { FF = 80 };
static void op_swiglu(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    k->swiglu_forward(d[0], d[1], R, FF);
    k->swiglu_backward(d[2], d[1], d[3], R, FF);
}

START_TEST(test_swiglu)
{
    const loom_backend_ops *k = ct_gpu.k;
    ck_assert_msg(k->size > offsetof(loom_backend_ops, rope_backward) && k->swiglu_forward &&
                      k->swiglu_backward,
                  "the CUDA backend has no swiglu_forward/_backward");
    const size_t n = R * FF;
    float *o = ct_floats(n, 1, 0, 0), *x = ct_floats(2 * n, 2, -6, 6);
    float *dx = ct_floats(2 * n, 3, -9, 9), *dout = ct_floats(n, 4, -1, 1);
    x[0] = -100.0f, x[1] = 100.0f, x[2 * FF + 5] = -100.0f;
    ct_buf b[] = {out("out", o, n * 4, EW), in("inp", x, 2 * n * 4),
                  out("dinp", dx, 2 * n * 4, EW), in("dout", dout, n * 4)};
    ct_compare_op("swiglu fwd/bwd", b, 4, op_swiglu, NULL);
    free(o), free(x), free(dx), free(dout);
}
END_TEST

/* The MoE layer's row moves (moe.c): A = 2R assignments of token rows (repeats, in no
 * order, as a top-2 routing's expert-major list), gates in (0, 1). Gather with and without
 * a scale, scatter-add onto a non-zero out twice (rows sharing a destination add in i
 * order; the second call without a scale), the gates' dot products. The CUDA ops give the
 * CPU's bits (rows.cu's first comment), so the tolerance is EXACT. */
static void op_rows(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const size_t A = 2 * R;
    k->rows_gather(d[0], d[4], d[6], d[7], A, C);
    k->rows_gather(d[1], d[4], d[6], NULL, A, C);
    k->rows_scatter_add(d[2], d[5], d[6], d[7], A, C);
    k->rows_scatter_add(d[2], d[5], d[6], NULL, A, C);
    k->rows_dot(d[3], d[4], d[6], d[5], A, C);
}

START_TEST(test_rows)
{
    const loom_backend_ops *k = ct_gpu.k;
    ck_assert_msg(k->size > offsetof(loom_backend_ops, rows_dot) && k->rows_gather &&
                      k->rows_scatter_add && k->rows_dot,
                  "the CUDA backend has no rows_gather/_scatter_add/rows_dot");
    const size_t A = 2 * R;
    float *g1 = ct_floats(A * C, 1, 0, 0), *g2 = ct_floats(A * C, 2, 0, 0);
    float *acc = ct_floats(R * C, 3, -1, 1), *dot = ct_floats(A, 4, 0, 0);
    float *x = ct_floats(R * C, 5, -2, 2), *y = ct_floats(A * C, 6, -2, 2);
    float *gate = ct_floats(A, 7, 0.01f, 1);
    int *idx = tokens(A, 0, (int)R, 8);
    idx[1] = idx[0], idx[A - 1] = idx[0]; /* one row three times, far apart */
    ct_buf b[] = {out("gather (scaled)", g1, A * C * 4, EXACT),
                  out("gather", g2, A * C * 4, EXACT),
                  out("scatter_add", acc, R * C * 4, EXACT), out("dot", dot, A * 4, EXACT),
                  in("rows", x, R * C * 4), in("per assignment", y, A * C * 4),
                  in("idx", idx, A * sizeof(int)), in("scale", gate, A * 4)};
    ct_compare_op("rows gather/scatter_add/dot", b, 8, op_rows, NULL);
    free(g1), free(g2), free(acc), free(dot), free(x), free(y), free(gate), free(idx);
}
END_TEST

/* --- the sorted scatter-add (kernels/cuda/scatter_sorted.cu) -------------------------- */
/* embedding_backward and rows_scatter_add on row lists where the order of a destination's
 * adds changes fp32 bits: few destinations, each with dozens of rows whose values span
 * 2^-12 .. 2^12 (so a reordering is visible: the host checks that reversing one
 * destination's rows changes a sum), destination numbers that share low bytes across radix
 * passes (and, for the MoE op, a third byte), rows outside the vocabulary slice, and
 * untouched destinations that must keep their value, and more than 1024 (digit, tile)
 * counts (the scan's threads then sum chunks of them). Each case runs with LOOM_CUDA_SCATTER
 * = sort, = walk and unset (by size): all bitwise the CPU backend's (EXACT), and the sort's
 * result bitwise the walk's (memcmp). */
typedef struct scatter_case {
    const char *name;
    int embedding;     /* 1: embedding_backward, 0: rows_scatter_add (with scale) */
    size_t n;          /* rows */
    int C, v0, Vl;     /* Vl: dwte's / out's rows */
    const int *dests;  /* destination numbers the rows draw from (tokens or idx) */
    int ndest;
} scatter_case;

static void op_scatter(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const scatter_case *sc = ctx;
    if (sc->embedding)
        k->embedding_backward(d[0], d[1], d[2], sc->v0, sc->Vl, sc->n, sc->C);
    else
        k->rows_scatter_add(d[0], d[1], d[2], d[3], sc->n, sc->C);
}

/* Values x * 2^e, e in [-12, 12]: sums of these round differently in another order. */
static float *spread_floats(size_t n, unsigned seed)
{
    float *x = ct_floats(n, seed, -1, 1);
    unsigned r = seed * 7919u + 1u;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = ldexpf(x[i], (int)((r >> 9) % 25u) - 12);
    }
    return x;
}

static void scatter_check(const scatter_case *sc)
{
    const size_t n = sc->n, C = (size_t)sc->C, out_n = (size_t)sc->Vl * C;
    float *acc = ct_floats(out_n, 11, -1, 1), *src = spread_floats(n * C, 12);
    float *scale = spread_floats(n, 13);
    int *idx = tokens(n, 0, sc->ndest, 14);
    for (size_t i = 0; i < n; i++)
        idx[i] = sc->dests[idx[i]];
    /* the order matters: the first row's destination (dests[0] is in range), its first
     * column summed forwards and backwards */
    const int d0 = sc->dests[0];
    float fw = acc[(size_t)(d0 - sc->v0) * C], bw = fw;
    int hits = 0;
    for (size_t i = 0; i < n; i++)
        if (idx[i] == d0)
            hits++, fw += sc->embedding ? src[i * C] : scale[i] * src[i * C];
    for (size_t i = n; i-- > 0;)
        if (idx[i] == d0)
            bw += sc->embedding ? src[i * C] : scale[i] * src[i * C];
    ck_assert_msg(fw != bw, "%s: %d rows of destination %d sum to the same bits in either "
                  "order: the case cannot see a reordering", sc->name, hits, d0);
    ct_buf b[] = {out("out", acc, out_n * 4, EXACT), in("src", src, n * C * 4),
                  in("idx", idx, n * sizeof(int)), in("scale", scale, n * 4)};
    float *sorted = malloc(out_n * 4);
    setenv("LOOM_CUDA_SCATTER", "sort", 1);
    ct_compare_op(sc->name, b, 4, op_scatter, (void *)sc);
    memcpy(sorted, ct_gpu_result(0), out_n * 4);
    setenv("LOOM_CUDA_SCATTER", "walk", 1);
    ct_compare_op(sc->name, b, 4, op_scatter, (void *)sc);
    ck_assert_msg(memcmp(sorted, ct_gpu_result(0), out_n * 4) == 0,
                  "%s: the sorted and the walked scatter-add differ", sc->name);
    unsetenv("LOOM_CUDA_SCATTER"); /* by size: the walk below 64 rows, else the sort */
    ct_compare_op(sc->name, b, 4, op_scatter, (void *)sc);
    free(sorted), free(acc), free(src), free(scale), free(idx);
}

START_TEST(test_scatter_sorted)
{
    /* tokens of a 50000-row slice from 300: low bytes shared (0x12c, 0x22c, 0xc12c), one
     * token outside the slice on each side; 700 rows = 3 tiles, the last partial */
    static const int tok[] = {300 + 0x12c, 300 + 0x22c, 300 + 0xc12c, 300 + 0xc12d, 299,
                              300 + 50000, 300 + 49999};
    static const int one[] = {300 + 777};
    /* MoE destinations among 70000 rows: the third byte too (5, 5 + 65536) */
    static const int rows[] = {5, 5 + 256, 5 + 65536, 69999, 260, 4};
    static const int few[] = {3, 3 + 256};
    const scatter_case cases[] = {
        {"scatter: tokens, V 50000 vs 700 rows", 1, 700, 40, 300, 50000, tok, 7},
        {"scatter: all rows one token", 1, 300, 33, 300, 1000, one, 1},
        /* 6 tiles: 1536 (digit, tile) counts, so the scan's threads take chunks of 2 */
        {"scatter: tokens, 1300 rows", 1, 1300, 8, 300, 50000, tok, 7},
        {"scatter: moe rows, 70000 destinations", 0, 600, 8, 0, 70000, rows, 6},
        {"scatter: moe, 40 rows (auto: the walk)", 0, 40, 16, 0, 300, few, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        scatter_check(&cases[i]);
}
END_TEST

/* In place over the q and k heads (NH + KVH 2 = 6 heads of 24) of rows of a fused qkv
 * (stride C + 2 * 48), a shard from row 5 (positions (5 + i) % T); theta 10000. The
 * backward on a gradient buffer. Tolerance EW. */
static void op_rope(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    enum { HS = C / NH, W = C + 2 * 2 * HS };
    k->rope_forward(d[0], d[2], d[3], 5, R - 5, T, W, NH + 2, HS);
    k->rope_backward(d[1], d[2], d[3], 5, R - 5, T, W, NH + 2, HS);
}

START_TEST(test_rope)
{
    const loom_backend_ops *k = ct_gpu.k;
    ck_assert_msg(k->size > offsetof(loom_backend_ops, rope_backward) && k->rope_forward &&
                      k->rope_backward,
                  "the CUDA backend has no rope_forward/_backward");
    enum { HS = C / NH, W = C + 2 * 2 * HS, HALF = HS / 2 };
    float *x = ct_floats(R * W, 1, -2, 2), *dx = ct_floats(R * W, 2, -1, 1);
    float *cs = malloc((size_t)T * HALF * 4), *sn = malloc((size_t)T * HALF * 4);
    for (int p = 0; p < T; p++)
        for (int i = 0; i < HALF; i++) {
            const double a = p * pow(10000.0, -2.0 * i / HS);
            cs[p * HALF + i] = (float)cos(a), sn[p * HALF + i] = (float)sin(a);
        }
    ct_buf b[] = {out("x", x, R * W * 4, EW), out("dx", dx, R * W * 4, EW),
                  in("cos", cs, (size_t)T * HALF * 4), in("sin", sn, (size_t)T * HALF * 4)};
    ct_compare_op("rope fwd/bwd", b, 4, op_rope, NULL);
    free(x), free(dx), free(cs), free(sn);
}
END_TEST

/* --- elementwise ---------------------------------------------------------------------- */
static void op_elementwise(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const size_t n = R * C;
    k->gelu_forward(d[0], d[1], n);
    k->gelu_backward(d[2], d[1], d[3], n);
    k->residual_forward(d[4], d[1], d[3], n);
    k->accumulate(d[5], d[3], n);
    k->scale(d[6], -0.37f, n);
    k->bias_add(d[7], d[8], R, C);
    k->bias_backward(d[9], d[3], R, C);
    k->bias_backward(d[9], d[3], R, C);
}

START_TEST(test_elementwise)
{
    const size_t n = R * C;
    float *g = ct_floats(n, 1, 0, 0), *x = ct_floats(n, 2, -6, 6), *dg = ct_floats(n, 3, 0, 0);
    float *dout = ct_floats(n, 4, -1, 1), *r = ct_floats(n, 5, 0, 0), *acc = ct_floats(n, 6, -1, 1);
    float *sc = ct_floats(n, 7, -1, 1), *ba = ct_floats(n, 8, -1, 1), *bias = ct_floats(C, 9, -1, 1);
    float *db = ct_floats(C, 10, -1, 1);
    x[0] = -20.0f; /* gelu underflows there: flushed to 0 on both */
    ct_buf b[] = {out("gelu", g, n * 4, EW), in("x", x, n * 4), out("dgelu", dg, n * 4, EW),
                  in("dout", dout, n * 4), out("residual", r, n * 4, EXACT),
                  out("accumulate", acc, n * 4, EXACT), out("scale", sc, n * 4, EXACT),
                  out("bias_add", ba, n * 4, EXACT), in("bias", bias, C * 4),
                  out("dbias", db, C * 4, RED)};
    ct_compare_op("gelu, residual, bias, scale", b, 10, op_elementwise, NULL);
    free(g), free(x), free(dg), free(dout), free(r), free(acc), free(sc), free(ba), free(bias),
        free(db);
}
END_TEST

/* --- cross-entropy -------------------------------------------------------------------- */
typedef struct ce_case {
    int Vl, col0;
    float dloss;
} ce_case;

static void op_ce(const loom_backend_ops *k, void *s, void **d, void *ctx)
{
    const ce_case *c = ctx;
    k->ce_row_max(d[1], d[0], (int)R, c->Vl, c->col0, V);
    k->ce_row_sumexp(d[2], d[0], d[1], (int)R, c->Vl, c->col0, V, 0, c->Vl);
    k->ce_target_logit(d[3], d[0], d[5], (int)R, c->Vl, c->col0);
    k->ce_finish(d[0], d[4], d[1], d[2], d[3], d[5], c->dloss, (int)R, c->Vl, c->col0, V);
}

START_TEST(test_crossentropy)
{
    /* one rank (col0 0, Vl = Vp, padding past V); the last of two slices (col0 512, so
     * columns 1000..1023 are padding there); dloss 0 leaves the logits intact */
    const ce_case cases[] = {{VP, 0, 1.0f / 96}, {VP / 2, VP / 2, 0.5f}, {VP, 0, 0.0f}};
    for (int ci = 0; ci < 3; ci++) {
        const ce_case *c = &cases[ci];
        float *logits = ct_floats(R * c->Vl, 11 + ci, -4, 4), *mx = ct_floats(R, 1, 0, 0);
        float *se = ct_floats(R, 2, 0, 0), *tl = ct_floats(R, 3, 0, 0), *loss = ct_floats(R, 4, 0, 0);
        int *tg = tokens(R, 0, V, 21 + ci);
        tg[3] = -1; /* ignored: loss 0, gradient 0 */
        tg[4] = V;  /* a padding column: ignored too */
        ct_buf b[] = {out("logits", logits, R * c->Vl * 4, EW), out("row_max", mx, R * 4, EXACT),
                      out("sumexp", se, R * 4, RED), out("tlogit", tl, R * 4, EXACT),
                      out("losses", loss, R * 4, RED), in("targets", tg, R * 4)};
        char name[64];
        snprintf(name, sizeof name, "cross-entropy Vl %d col0 %d dloss %g", c->Vl, c->col0,
                 (double)c->dloss);
        ct_compare_op(name, b, 6, op_ce, (void *)c);
        free(logits), free(mx), free(se), free(tl), free(loss), free(tg);
    }
}
END_TEST

/* --- reductions ------------------------------------------------------------------------ */
/* --- casts: bf16 and fp16, bit for bit the CPU's (kernels/cpu/convert.c) ---------------- */
/* One conversion op on both backends over the same host bytes; the outputs' bytes must be
 * equal (NaN payloads included, so no float comparison). */
static void same_bits(const char *what, const void *in, size_t in_bytes, size_t out_bytes,
                      void (*op)(const loom_backend_ops *, void *dst, const void *src, size_t n,
                                 loom_dtype), size_t n, loom_dtype dt, int in_place)
{
    unsigned char *res[2];
    ct_backend *be[2] = {&ct_cpu, &ct_gpu};
    for (int b = 0; b < 2; b++) {
        const loom_backend_ops *k = be[b]->k;
        void *s = be[b]->self, *src = k->alloc(s, in_bytes);
        void *dst = in_place ? src : k->alloc(s, out_bytes);
        k->copy_to_device(s, src, in, in_bytes);
        op(k, dst, src, n, dt);
        res[b] = malloc(out_bytes);
        k->copy_to_host(s, res[b], dst, out_bytes);
        k->free(s, src);
        if (!in_place)
            k->free(s, dst);
    }
    size_t w = out_bytes / n, bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(res[0] + i * w, res[1] + i * w, w) != 0 && bad++ == 0)
            first = i;
    printf("%s (%s): %zu values, %zu differ\n", what, dt == LOOM_DTYPE_F16 ? "f16" : "bf16", n,
           bad);
    ck_assert_msg(bad == 0, "%s: %zu of %zu values differ from the CPU's bits, first at %zu", what,
                  bad, n, first);
    free(res[0]), free(res[1]);
}

static void op_from(const loom_backend_ops *k, void *d, const void *s, size_t n, loom_dtype dt)
{
    k->convert_from_f32(d, s, n, dt);
}
static void op_to(const loom_backend_ops *k, void *d, const void *s, size_t n, loom_dtype dt)
{
    k->convert_to_f32(d, s, n, dt);
}
static void op_round(const loom_backend_ops *k, void *d, const void *s, size_t n, loom_dtype dt)
{
    k->round_to(d, s, n, dt);
}

START_TEST(test_convert_bitwise)
{
    ck_assert_msg(ct_gpu.k->size > offsetof(loom_backend_ops, round_to) && ct_gpu.k->round_to,
                  "the backend has no conversion ops");
    /* fp32 inputs: the edges (zeros, subnormals, the last finite values and the rounding
     * boundaries below inf, inf, signalling and quiet NaNs with payloads) and a hashed
     * sweep over all bit patterns */
    static const uint32_t edge[] = {0, 0x80000000u, 1, 0x807fffffu, 0x00800000u, 0x33000000u,
                                    0x33000001u, 0x387fc000u, 0x38800000u, 0x477fefffu,
                                    0x477ff000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu,
                                    0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u,
                                    0xffbfffffu, 0x3f808000u, 0x3f818000u, 0x3f800fffu};
    enum { N = 1 << 18 };
    size_t ne = sizeof edge / sizeof edge[0];
    uint32_t *f = malloc((N + ne) * 4);
    memcpy(f, edge, sizeof edge);
    for (uint32_t i = 0; i < N; i++)
        f[ne + i] = i * 0x9e3779b1u + (i >> 7);
    uint16_t *h = malloc(65536 * 2);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        same_bits("convert_from_f32", f, (N + ne) * 4, (N + ne) * 2, op_from, N + ne, dts[d], 0);
        same_bits("convert_to_f32, all 65536 patterns", h, 65536 * 2, 65536 * 4, op_to, 65536,
                  dts[d], 0);
        same_bits("round_to, in place", f, (N + ne) * 4, (N + ne) * 4, op_round, N + ne, dts[d], 1);
    }
    free(f), free(h);
}
END_TEST

START_TEST(test_reductions)
{
    const size_t rows = 37, cols = 1500, stride = 1531, n = rows * stride;
    float *x = ct_floats(n, 31, -2, 2);
    for (int w = 0; w < 2; w++) {
        ct_backend *be = w ? &ct_gpu : &ct_cpu;
        float *d = be->k->alloc(be->self, n * 4);
        be->k->copy_to_device(be->self, d, x, n * 4);
        double ss = be->k->sum_squares(d, rows, cols, stride);
        double whole = be->k->sum_squares(d, 1, n, n);
        static double ref_ss, ref_whole;
        if (!w) {
            ref_ss = ss, ref_whole = whole;
        } else {
            printf("sum_squares strided: gpu %.17g cpu %.17g; whole: gpu %.17g cpu %.17g\n", ss,
                   ref_ss, whole, ref_whole);
            ck_assert_msg(fabs(ss - ref_ss) <= 1e-12 * ref_ss, "sum_squares (strided)");
            ck_assert_msg(fabs(whole - ref_whole) <= 1e-12 * ref_whole, "sum_squares (whole)");
        }
        ck_assert_int_eq(be->k->has_nonfinite(d, n), 0);
        float bad[3] = {INFINITY, NAN, -INFINITY};
        size_t at[3] = {n - 1, n / 2, 0};
        for (int i = 0; i < 3; i++) {
            be->k->copy_to_device(be->self, d + at[i], &bad[i], 4);
            ck_assert_msg(be->k->has_nonfinite(d, n) == 1, "%s: missed %g at %zu", be->name,
                          (double)bad[i], at[i]);
            ck_assert_msg(be->k->has_nonfinite(d, at[i]) == 0, "%s: saw past n", be->name);
            be->k->copy_to_device(be->self, d + at[i], &x[at[i]], 4);
        }
        be->k->free(be->self, d);
    }
    free(x);
}
END_TEST

START_TEST(test_alloc_zeroed_and_reused)
{
    const loom_backend_ops *k = ct_gpu.k;
    void *s = ct_gpu.self;
    float *h = malloc((size_t)5 << 20);
    for (int round = 0; round < 3; round++) {
        float *d = k->alloc(s, (size_t)5 << 20);
        ck_assert(d != NULL);
        k->copy_to_host(s, h, d, (size_t)5 << 20);
        /* the first nonzero float, then one assertion: Check records every assertion's
         * place (a write to its log in no-fork mode), 1.3M of them a round here */
        size_t i = 0, nf = ((size_t)5 << 20) / 4;
        while (i < nf && h[i] == 0.0f)
            i++;
        ck_assert_msg(i == nf, "round %d: alloc not zeroed at %zu", round, i);
        k->scale(d, 2.0f, 16); /* dirty it before it goes back to the pool */
        float one = 1.0f;
        k->copy_to_device(s, d, &one, 4);
        k->free(s, d);
    }
    free(h);
}
END_TEST

static const char *paths[2];

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s loom-backend-cpu.so loom-backend-cuda.so\n", argv[0]);
        return 1;
    }
    paths[0] = argv[1], paths[1] = argv[2];
    ct_open(paths[0], paths[1]);
    Suite *su = suite_create("cuda_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_alloc_zeroed_and_reused);
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_position);
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_matmul);
    tcase_add_test(tc, test_matmul_dt);
    tcase_add_test(tc, test_gemm);
    tcase_add_test(tc, test_ordered_gemm_layout_free);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_attention_datt);
    tcase_add_test(tc, test_attention_flash);
    ct_add_flash_tc(tc); /* test_cuda_flash_tc.c */
    tcase_add_test(tc, test_attention_decode_bitwise);
    tcase_add_test(tc, test_attention_gqa);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_swiglu);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_rows);
    tcase_add_test(tc, test_scatter_sorted);
    tcase_add_test(tc, test_elementwise);
    tcase_add_test(tc, test_crossentropy);
    tcase_add_test(tc, test_reductions);
    tcase_add_test(tc, test_convert_bitwise);
    ops_bf16_tests(tc);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA after fork() is undefined */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    ct_close();
    return failed ? 1 : 0;
}
