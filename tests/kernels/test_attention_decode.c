/* test_attention_decode.c — loom_cpu_attention_decode (one query row over cached keys and
 * values) against loom_cpu_attention_forward: for sequences of t+1 tokens, the decoded row t
 * must have the bits the full forward gives its last row, output and probabilities, at
 * lengths inside, at and past attention.c's 64-row blocks and with head sizes whose rows
 * are not 64-byte aligned. A perturbed key must change the bits (the check can fail).
 * Both run in canonical (row-stable) mode, as generation does: in fast mode the full
 * forward's products go to OpenBLAS, whose bits depend on the shape.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

static float lcg(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) * (2.0 / 16777216.0) - 1.0);
}

static void check(int T, int C, int NH)
{
    const int t = T - 1;
    float *qkv = malloc(sizeof(float) * T * 3 * C), *out = malloc(sizeof(float) * T * C);
    float *att = malloc(sizeof(float) * NH * T * T);
    float *dout = malloc(sizeof(float) * C), *datt = malloc(sizeof(float) * NH * T * T);
    unsigned seed = 7u + (unsigned)T;
    for (int i = 0; i < T * 3 * C; i++)
        qkv[i] = 2.0f * lcg(&seed);
    loom_cpu_set_deterministic(1);
    loom_cpu_attention_forward(out, att, qkv, 1, T, C, NH);
    /* probabilities where the full forward keeps them: head h's row t at h T^2 + t T */
    memset(datt, 0, sizeof(float) * NH * T * T);
    loom_cpu_attention_decode(dout, datt + (size_t)t * T, (size_t)T * T, qkv, t, C, NH);
    ck_assert_msg(memcmp(dout, out + (size_t)t * C, sizeof(float) * C) == 0,
                  "T=%d C=%d NH=%d: decoded row differs", T, C, NH);
    for (int h = 0; h < NH; h++)
        ck_assert_msg(memcmp(datt + (size_t)h * T * T + (size_t)t * T,
                             att + (size_t)h * T * T + (size_t)t * T, sizeof(float) * T) == 0,
                      "T=%d head %d: probabilities differ", T, h);
    /* a perturbed value of position 0: other bits */
    qkv[2 * C] = qkv[2 * C] * 1.01f + 0.01f;
    loom_cpu_attention_decode(dout, datt + (size_t)t * T, (size_t)T * T, qkv, t, C, NH);
    ck_assert(memcmp(dout, out + (size_t)t * C, sizeof(float) * C) != 0);
    free(qkv);
    free(out);
    free(att);
    free(dout);
    free(datt);
}

START_TEST(rows_match_forward)
{
    static const int Ts[] = {1, 2, 7, 63, 64, 65, 100, 128, 129, 200};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        check(Ts[i], 36, 3);  /* hs 12 */
        check(Ts[i], 64, 2);  /* hs 32 */
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention_decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, rows_match_forward);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
