/* test_recompute.c — activation recomputation (loom_gpt_parallel.recompute, gpt.c) at the
 * model: every mode's gradients against recompute none, bit for bit.
 *
 *   gradients:  two micro-batches in two activation slots, F0 F1 BWD0 BWD1 (gpipe's order:
 *               F1 overwrites the shared scratch set before BWD0 recomputes into it), fast
 *               and canonical: full, selective and blocks { 0, 2 } give the gradient
 *               buffer and the embedding's input gradient of none exactly; the activation
 *               bytes drop (full < selective < none, { 0, 2 } < none). A negative control
 *               (one backward of the two) differs, so the comparison can fail.
 *   decode:     the key/value cache is off after full recomputation (q, k, v are in the
 *               shared set), on with selective.
 *   split:      the split backward (B, then W) with selective recomputation gives none's
 *               gradients too.
 *   errors:     an unknown mode, blocks without their flags, and full recomputation (or by
 *               blocks) with the split backward are refused with a message.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/status.h"
#include "model/gpt.h"
#include "model/gpt_stage.h"

enum { B_ = 2, T_ = 16, L_ = 3 };

static loom_backend be;
static const unsigned char blocks02[L_] = {1, 0, 1};

static loom_status try_make(int canonical, int mode, const unsigned char *layers, int split,
                            loom_gpt **m)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_config c = {.vocab = 67, .ctx = T_, .layers = L_, .heads = 4, .dim = 32};
    loom_gpt_parallel par = {.canonical = canonical, .slots = 2, .split_backward = split,
                             .recompute = mode, .recompute_layers = layers};
    return loom_gpt_create(&c, &be, B_, 11, &par, m);
}

static loom_gpt *make(int canonical, int mode, const unsigned char *layers)
{
    loom_gpt *m;
    ck_assert_msg(try_make(canonical, mode, layers, 0, &m) == LOOM_OK, "%s", loom_last_error());
    return m;
}

static void forward(loom_gpt *m, int mb)
{
    int tok[B_ * T_], tgt[B_ * T_];
    unsigned s = 1234u + 77u * (unsigned)mb;
    for (int i = 0; i < B_ * T_; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int)((s >> 8) % 67u);
        tgt[i] = (int)((s >> 16) % 67u);
    }
    double loss = 0.0;
    loom_gpt_stage_select(m, mb);
    ck_assert_msg(loom_gpt_stage_forward(m, 0, L_, tok, tgt, B_, T_, 1.0f / (B_ * T_), &loss) ==
                  LOOM_OK, "%s", loom_last_error());
}

static void backward(loom_gpt *m, int mb)
{
    loom_gpt_stage_select(m, mb);
    ck_assert_msg(loom_gpt_stage_backward(m, 0, L_) == LOOM_OK, "%s", loom_last_error());
}

/* F0 F1 BWD0 BWD1 from zero; the gradients and micro-batch 1's input gradient out. */
static void run(loom_gpt *m, float *g, float *din)
{
    size_t n = loom_gpt_params(m)->total, rows = (size_t)B_ * T_ * 32;
    loom_gpt_zero_grad(m);
    forward(m, 0);
    forward(m, 1);
    backward(m, 0);
    backward(m, 1);
    memcpy(g, loom_gpt_grad_data(m), n * sizeof(float));
    memcpy(din, loom_gpt_stage_grad(m), rows * sizeof(float));
}

static void modes(int canonical)
{
    loom_gpt *none = make(canonical, LOOM_RECOMPUTE_NONE, NULL);
    size_t n = loom_gpt_params(none)->total, rows = (size_t)B_ * T_ * 32;
    float *g0 = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *d0 = malloc(rows * sizeof(float)), *d = malloc(rows * sizeof(float));
    run(none, g0, d0);
    size_t bytes[4] = {loom_gpt_activation_bytes(none)};
    const char *names[4] = {"none", "full", "selective", "blocks {0, 2}"};
    for (int mode = LOOM_RECOMPUTE_FULL; mode <= LOOM_RECOMPUTE_LAYERS; mode++) {
        loom_gpt *m = make(canonical, mode, mode == LOOM_RECOMPUTE_LAYERS ? blocks02 : NULL);
        ck_assert_uint_eq(loom_gpt_params(m)->total, n);
        run(m, g, d);
        ck_assert_msg(!memcmp(g, g0, n * sizeof(float)), "%s: gradients differ from none",
                      names[mode]);
        ck_assert_msg(!memcmp(d, d0, rows * sizeof(float)), "%s: input gradient differs",
                      names[mode]);
        bytes[mode] = loom_gpt_activation_bytes(m);
        if (mode == LOOM_RECOMPUTE_FULL) { /* negative control: without BWD0 it differs */
            loom_gpt_zero_grad(m);
            forward(m, 0);
            forward(m, 1);
            backward(m, 1);
            ck_assert_msg(memcmp(loom_gpt_grad_data(m), g0, n * sizeof(float)) != 0,
                          "negative control: one backward of two matched");
        }
        loom_gpt_destroy(m);
    }
    ck_assert_msg(bytes[1] < bytes[2] && bytes[2] < bytes[0] && bytes[3] < bytes[0],
                  "activation bytes: none %zu, full %zu, selective %zu, blocks %zu", bytes[0],
                  bytes[1], bytes[2], bytes[3]);
    free(g0); free(g); free(d0); free(d);
    loom_gpt_destroy(none);
}

START_TEST(fast) { modes(0); }
END_TEST

START_TEST(canonical) { modes(1); }
END_TEST

/* The split backward (B, then W) with selective recomputation: B reruns the attention
 * probabilities, W the GELU output; fast mode, F0 F1 B0 B1 W0 W1 gives the fused backward's
 * gradients (test_gpt_split.c), so those of recompute none. */
START_TEST(split_selective)
{
    loom_gpt *none = make(0, LOOM_RECOMPUTE_NONE, NULL), *s;
    ck_assert_msg(try_make(0, LOOM_RECOMPUTE_SELECTIVE, NULL, 1, &s) == LOOM_OK, "%s",
                  loom_last_error());
    size_t n = loom_gpt_params(none)->total, rows = (size_t)B_ * T_ * 32;
    float *g0 = malloc(n * sizeof(float)), *d0 = malloc(rows * sizeof(float));
    run(none, g0, d0);
    loom_gpt_zero_grad(s);
    forward(s, 0);
    forward(s, 1);
    for (int mb = 0; mb < 2; mb++) {
        loom_gpt_stage_select(s, mb);
        ck_assert_msg(loom_gpt_stage_backward_input(s, 0, L_, NULL) == LOOM_OK, "%s",
                      loom_last_error());
    }
    ck_assert_msg(!memcmp(loom_gpt_stage_grad_out(s), d0, rows * sizeof(float)),
                  "split selective: B's input gradient differs from none");
    for (int mb = 0; mb < 2; mb++) {
        loom_gpt_stage_select(s, mb);
        ck_assert_int_eq(loom_gpt_stage_backward_weight(s, 0, L_, 0), LOOM_OK);
    }
    ck_assert_msg(!memcmp(loom_gpt_grad_data(s), g0, n * sizeof(float)),
                  "split selective: gradients differ from none");
    free(g0); free(d0);
    loom_gpt_destroy(none);
    loom_gpt_destroy(s);
}
END_TEST

START_TEST(decode)
{
    loom_gpt *full = make(0, LOOM_RECOMPUTE_FULL, NULL), *sel = make(0, LOOM_RECOMPUTE_SELECTIVE, NULL);
    ck_assert_int_eq(loom_gpt_can_decode(full), 0);
    ck_assert_int_eq(loom_gpt_can_decode(sel), 1);
    loom_gpt_destroy(full);
    loom_gpt_destroy(sel);
}
END_TEST

START_TEST(errors)
{
    loom_gpt *m = NULL;
    ck_assert_int_eq(try_make(0, 9, NULL, 0, &m), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "recompute mode 9 is not one of"));
    ck_assert_int_eq(try_make(0, LOOM_RECOMPUTE_LAYERS, NULL, 0, &m), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "needs recompute_layers"));
    ck_assert_int_eq(try_make(0, LOOM_RECOMPUTE_FULL, NULL, 1, &m), LOOM_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "with a split backward (schedule = \"zb1\") "
                                 "not yet"));
    ck_assert_int_eq(try_make(0, LOOM_RECOMPUTE_LAYERS, blocks02, 1, &m), LOOM_ERR_UNSUPPORTED);
    ck_assert_ptr_null(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("recompute");
    TCase *tc = tcase_create("recompute");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fast);
    tcase_add_test(tc, canonical);
    tcase_add_test(tc, split_selective);
    tcase_add_test(tc, decode);
    tcase_add_test(tc, errors);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
