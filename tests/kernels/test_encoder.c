/* test_encoder.c — token + position embedding (encoder.c): forward values, backward
 * against finite differences of L = sum(out * R), repeated tokens, accumulation (+=) of
 * dwte/dwpe, the same bits on one thread and two (the scatter is split by columns, not
 * rows); vocabulary slices whose outputs sum to the full lookup, each slice's gradient
 * the matching rows of the full one; positions of a row shard (sequence parallelism).
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 5, C = 20, V = 7, MAXT = 6 };

typedef struct {
    int inp[B * T];
    float *wte, *wpe, *out, *R;
} ctx_t;

/* The whole embedding as one rank computes it: every vocabulary row, every token row. */
static void encode(float *out, const int *inp, const float *wte, int Vrows, const float *wpe, int b,
                   int t, int c)
{
    loom_cpu_embedding_forward(out, inp, wte, 0, Vrows, (size_t)b * t, c);
    loom_cpu_position_forward(out, wpe, 0, (size_t)b * t, t, c);
}

static void encode_backward(float *dwte, int Vrows, float *dwpe, const float *dout, const int *inp,
                            int b, int t, int c)
{
    loom_cpu_embedding_backward(dwte, dout, inp, 0, Vrows, (size_t)b * t, c);
    loom_cpu_position_backward(dwpe, dout, b, t, c);
}

static double loss(void *p)
{
    ctx_t *c = p;
    encode(c->out, c->inp, c->wte, V, c->wpe, B, T, C);
    return kt_dot(c->out, c->R, (size_t)B * T * C);
}

static void setup(ctx_t *c)
{
    for (int i = 0; i < B * T; i++)
        c->inp[i] = (i * 3) % V; /* tokens repeat across b and t */
    c->wte = kt_alloc((size_t)V * C), c->wpe = kt_alloc((size_t)MAXT * C);
    c->out = kt_alloc((size_t)B * T * C), c->R = kt_alloc((size_t)B * T * C);
    kt_fill(c->wte, (size_t)V * C, 1, -1, 1);
    kt_fill(c->wpe, (size_t)MAXT * C, 2, -1, 1);
    kt_fill(c->R, (size_t)B * T * C, 3, -1, 1);
}

static void teardown(ctx_t *c)
{
    free(c->wte), free(c->wpe), free(c->out), free(c->R);
}

START_TEST(test_forward)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    for (int bt = 0; bt < B * T; bt++)
        for (int i = 0; i < C; i++)
            ck_assert_float_eq(c.out[bt * C + i],
                               c.wte[c.inp[bt] * C + i] + c.wpe[(bt % T) * C + i]);
    teardown(&c);
}
END_TEST

START_TEST(test_backward_fd_and_accumulate)
{
    ctx_t c;
    setup(&c);
    float *dwte = kt_alloc((size_t)V * C), *dwpe = kt_alloc((size_t)MAXT * C);
    encode_backward(dwte, V, dwpe, c.R, c.inp, B, T, C);
    kt_check_grad("dwte", c.wte, dwte, (size_t)V * C, 1, loss, &c, 1e-2f, 1e-3);
    kt_check_grad("dwpe", c.wpe, dwpe, (size_t)MAXT * C, 1, loss, &c, 1e-2f, 1e-3);
    kt_assert_all("dwpe beyond T", dwpe + T * C, (size_t)(MAXT - T) * C, 0.0f);
    float *once_te = kt_alloc((size_t)V * C), *once_pe = kt_alloc((size_t)MAXT * C);
    memcpy(once_te, dwte, sizeof(float) * V * C);
    memcpy(once_pe, dwpe, sizeof(float) * MAXT * C);
    encode_backward(dwte, V, dwpe, c.R, c.inp, B, T, C);
    kt_assert_scaled("dwte twice", dwte, once_te, 2.0f, (size_t)V * C, 1e-6);
    kt_assert_scaled("dwpe twice", dwpe, once_pe, 2.0f, (size_t)MAXT * C, 1e-6);
    free(dwte), free(dwpe), free(once_te), free(once_pe);
    teardown(&c);
}
END_TEST

/* A size that takes the parallel path: (4,64,160) with 50 tokens, many repeats. */
enum { PB = 4, PT = 64, PC = 160, PV = 50 };

static void backward_big(void *unused, float *out)
{
    static int inp[PB * PT];
    float *dout = kt_alloc((size_t)PB * PT * PC);
    for (int i = 0; i < PB * PT; i++)
        inp[i] = (i * 7) % PV;
    kt_fill(dout, (size_t)PB * PT * PC, 5, -1, 1);
    /* out = dwte (PV,PC) then dwpe (PT,PC), accumulated twice */
    encode_backward(out, PV, out + PV * PC, dout, inp, PB, PT, PC);
    encode_backward(out, PV, out + PV * PC, dout, inp, PB, PT, PC);
    free(dout);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("dwte|dwpe", backward_big, NULL, (size_t)(PV + PT) * PC);
}
END_TEST

/* Vocabulary slices [v0, v0+Vl): the slices' lookups sum to the full one exactly (one
 * slice holds each token, the others give 0), and each slice's gradient is the full
 * gradient's rows. A row shard's positions are those of its rows in the full batch. */
START_TEST(test_vocab_slices_and_row_shard)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    const size_t n = (size_t)B * T * C;
    float *sum = kt_alloc(n), *part = kt_alloc(n);
    float *full_dwte = kt_alloc((size_t)V * C), *slice_dwte = kt_alloc((size_t)V * C);
    loom_cpu_embedding_backward(full_dwte, c.R, c.inp, 0, V, (size_t)B * T, C);
    const int cuts[] = {0, 3, 4, 7}; /* uneven slices, one of a single row */
    for (int s = 0; s < 3; s++) {
        int v0 = cuts[s], vl = cuts[s + 1] - cuts[s];
        loom_cpu_embedding_forward(part, c.inp, c.wte + (size_t)v0 * C, v0, vl, (size_t)B * T, C);
        for (size_t i = 0; i < n; i++)
            sum[i] += part[i];
        loom_cpu_embedding_backward(slice_dwte + (size_t)v0 * C, c.R, c.inp, v0, vl, (size_t)B * T, C);
    }
    loom_cpu_position_forward(sum, c.wpe, 0, (size_t)B * T, T, C);
    for (size_t i = 0; i < n; i++)
        ck_assert_float_eq(sum[i], c.out[i]);
    for (size_t i = 0; i < (size_t)V * C; i++)
        ck_assert_float_eq(slice_dwte[i], full_dwte[i]);
    /* rows [3, 8) of the batch on their own: positions (3..7) mod T */
    memset(part, 0, n * sizeof(float));
    loom_cpu_embedding_forward(part, c.inp + 3, c.wte, 0, V, 5, C);
    loom_cpu_position_forward(part, c.wpe, 3, 5, T, C);
    for (size_t i = 0; i < 5 * (size_t)C; i++)
        ck_assert_float_eq(part[i], c.out[3 * C + i]);
    free(sum), free(part), free(full_dwte), free(slice_dwte);
    teardown(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("encoder");
    TCase *tc = tcase_create("encoder");
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward_fd_and_accumulate);
    tcase_add_test(tc, test_thread_independent);
    tcase_add_test(tc, test_vocab_slices_and_row_shard);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
