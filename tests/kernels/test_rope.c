/* test_rope.c — rotary embeddings: forward against Hugging Face Llama's formula in double
 * (x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]), the row offset (rows of a shard
 * get their own positions: (row0 + i) % T), columns past the rotated heads untouched,
 * backward against finite differences of L = sum(out * R), and backward(forward(x)) = x.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { T = 5, B = 2, ROWS = B * T, HS = 8, HEADS = 3, STRIDE = HEADS * HS + 7, N = ROWS * STRIDE };
#define THETA 10000.0

static float cosv[T * HS / 2], sinv[T * HS / 2];

static void make_cache(void)
{
    for (int p = 0; p < T; p++)
        for (int i = 0; i < HS / 2; i++) {
            double a = p * pow(THETA, -2.0 * i / HS);
            cosv[p * HS / 2 + i] = (float)cos(a);
            sinv[p * HS / 2 + i] = (float)sin(a);
        }
}

typedef struct {
    float *x, *out, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    memcpy(c->out, c->x, N * sizeof(float));
    loom_cpu_rope_forward(c->out, cosv, sinv, 0, ROWS, T, STRIDE, HEADS, HS);
    return kt_dot(c->out, c->R, N);
}

START_TEST(test_forward)
{
    make_cache();
    ctx_t c = {kt_alloc(N), kt_alloc(N), kt_alloc(N)};
    kt_fill(c.x, N, 1, -2, 2);
    loss(&c);
    double want[N];
    for (int r = 0; r < ROWS; r++) {
        int p = r % T;
        for (int j = 0; j < STRIDE; j++)
            want[r * STRIDE + j] = c.x[r * STRIDE + j];
        for (int h = 0; h < HEADS; h++)
            for (int i = 0; i < HS; i++) {
                double a = p * pow(THETA, -2.0 * (i % (HS / 2)) / HS);
                const float *x = c.x + r * STRIDE + h * HS;
                double rot = i < HS / 2 ? -x[i + HS / 2] : x[i - HS / 2];
                want[r * STRIDE + h * HS + i] = x[i] * cos(a) + rot * sin(a);
            }
    }
    kt_assert_close("rope", c.out, want, N, 1e-6);
    for (int r = 0; r < ROWS; r++) /* columns past the heads: untouched, bitwise */
        ck_assert(memcmp(c.out + r * STRIDE + HEADS * HS, c.x + r * STRIDE + HEADS * HS,
                         7 * sizeof(float)) == 0);
    /* a shard: rows [3, 8) of the (B,T) batch, called with row0 = 3 */
    float *shard = kt_alloc(5 * STRIDE);
    memcpy(shard, c.x + 3 * STRIDE, 5 * STRIDE * sizeof(float));
    loom_cpu_rope_forward(shard, cosv, sinv, 3, 5, T, STRIDE, HEADS, HS);
    ck_assert_msg(memcmp(shard, c.out + 3 * STRIDE, 5 * STRIDE * sizeof(float)) == 0,
                  "a shard's rows differ from the same rows of the whole batch");
    /* backward(forward(x)) = x: the rotation's transpose is its inverse */
    loom_cpu_rope_backward(c.out, cosv, sinv, 0, ROWS, T, STRIDE, HEADS, HS);
    double xs[N];
    for (int i = 0; i < N; i++)
        xs[i] = c.x[i];
    kt_assert_close("inverse", c.out, xs, N, 1e-6);
    free(shard), free(c.x), free(c.out), free(c.R);
}
END_TEST

START_TEST(test_backward)
{
    make_cache();
    ctx_t c = {kt_alloc(N), kt_alloc(N), kt_alloc(N)};
    kt_fill(c.x, N, 1, -2, 2);
    kt_fill(c.R, N, 2, -1, 1);
    float *d = kt_alloc(N);
    memcpy(d, c.R, N * sizeof(float));
    loom_cpu_rope_backward(d, cosv, sinv, 0, ROWS, T, STRIDE, HEADS, HS);
    kt_check_grad("dx", c.x, d, N, 1, loss, &c, 1e-2f, 2e-3);
    free(d), free(c.x), free(c.out), free(c.R);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rope");
    TCase *tc = tcase_create("rope");
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
