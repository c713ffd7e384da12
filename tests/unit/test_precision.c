/* test_precision.c — mixed precision at the model (loom_gpt_set_precision, gpt.h):
 *
 *   activations: with bf16 (fp16) activations every logit and every value of the last
 *                block's output is a bf16 (fp16) number, and the fp32 model's are not;
 *   weights:     a model reading a bf16 (fp16) compute copy gives the logits, bit for bit,
 *                of an fp32 model whose parameters were rounded by hand, while its own fp32
 *                master parameters keep their bits; a write to the master shows in the
 *                next pass only after loom_gpt_refresh_params;
 *   storage:     the compute copy is 2 bytes a parameter; with a head wider than the widening
 *                scratch (read in bands: gpt_precision.c) the logits are still bitwise the
 *                hand-rounded fp32 model's in canonical mode, and so are the gradients (in
 *                fast mode within 1e-5 relative: OpenBLAS's products are not band-invariant);
 *   errors:      an integer dtype is refused with a message.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/status.h"
#include "model/gpt.h"
#include "model/gpt_stage.h"

enum { B_ = 2, T_ = 16, L_ = 2, V_ = 67, C_ = 32 };

static loom_backend be;

static loom_gpt *make(loom_dtype param, loom_dtype act)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_config c = {.vocab = V_, .ctx = T_, .layers = L_, .heads = 4, .dim = C_};
    loom_gpt *m = NULL;
    ck_assert_msg(loom_gpt_create(&c, &be, B_, 11, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    ck_assert_msg(loom_gpt_set_precision(m, param, act) == LOOM_OK, "%s", loom_last_error());
    return m;
}

static void forward(loom_gpt *m)
{
    int tok[B_ * T_], tgt[B_ * T_];
    unsigned s = 1234u;
    for (int i = 0; i < B_ * T_; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int)((s >> 8) % V_);
        tgt[i] = (int)((s >> 16) % V_);
    }
    double loss = 0.0;
    ck_assert_msg(loom_gpt_forward(m, tok, tgt, B_, T_, 0.0f, &loss) == LOOM_OK, "%s",
                  loom_last_error());
}

/* How many of x's n values a dt store would change. */
static size_t not_representable(const float *x, size_t n, loom_dtype dt)
{
    float *r = malloc(n * sizeof *r);
    ck_assert(r != NULL);
    be.ops->round_to(r, x, n, dt);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(&r[i], &x[i], sizeof r[i]) != 0;
    free(r);
    return bad;
}

static size_t logits_n(loom_gpt *m) { return (size_t)B_ * T_ * loom_gpt_get_config(m)->vocab_padded; }

START_TEST(activations_are_rounded)
{
    const loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        loom_gpt *m = make(LOOM_DTYPE_F32, dts[i]), *ref = make(LOOM_DTYPE_F32, LOOM_DTYPE_F32);
        forward(m);
        forward(ref);
        size_t n = logits_n(m), rows = (size_t)B_ * T_ * C_;
        ck_assert_msg(not_representable(loom_gpt_logits(m), n, dts[i]) == 0, "%s logits",
                      loom_dtype_name(dts[i]));
        ck_assert_msg(not_representable(loom_gpt_stage_output(m, L_), rows, dts[i]) == 0,
                      "%s block output", loom_dtype_name(dts[i]));
        /* the control: fp32's are mostly not (so the check can fail) */
        ck_assert(not_representable(loom_gpt_logits(ref), n, dts[i]) > n / 2);
        ck_assert(not_representable(loom_gpt_stage_output(ref, L_), rows, dts[i]) > rows / 2);
        loom_gpt_destroy(m);
        loom_gpt_destroy(ref);
    }
}
END_TEST

START_TEST(weights_are_a_rounded_copy)
{
    const loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        loom_gpt *m = make(dts[i], LOOM_DTYPE_F32), *ref = make(LOOM_DTYPE_F32, LOOM_DTYPE_F32);
        size_t np = loom_gpt_params(m)->total, n = logits_n(m);
        float *master = malloc(np * sizeof(float));
        memcpy(master, loom_gpt_param_data(ref), np * sizeof(float)); /* the same seed */
        ck_assert(memcmp(master, loom_gpt_param_data(m), np * sizeof(float)) == 0);
        ck_assert(not_representable(master, np, dts[i]) > np / 2);
        be.ops->round_to(loom_gpt_param_data(ref), master, np, dts[i]); /* by hand */
        forward(m);
        forward(ref);
        ck_assert_msg(memcmp(loom_gpt_logits(m), loom_gpt_logits(ref), n * sizeof(float)) == 0,
                      "%s: the compute copy is not the rounded master", loom_dtype_name(dts[i]));
        ck_assert_msg(memcmp(master, loom_gpt_param_data(m), np * sizeof(float)) == 0,
                      "the master lost bits");
        /* a write to the master: invisible until refreshed, then used */
        float *p = loom_gpt_param_data(m);
        for (size_t j = 0; j < np; j++)
            p[j] *= 1.5f;
        float *before = malloc(n * sizeof(float));
        memcpy(before, loom_gpt_logits(m), n * sizeof(float));
        forward(m);
        ck_assert(memcmp(before, loom_gpt_logits(m), n * sizeof(float)) == 0);
        loom_gpt_refresh_params(m);
        be.ops->round_to(loom_gpt_param_data(ref), p, np, dts[i]);
        forward(m);
        forward(ref);
        ck_assert(memcmp(before, loom_gpt_logits(m), n * sizeof(float)) != 0);
        ck_assert(memcmp(loom_gpt_logits(m), loom_gpt_logits(ref), n * sizeof(float)) == 0);
        free(master);
        free(before);
        loom_gpt_destroy(m);
        loom_gpt_destroy(ref);
    }
}
END_TEST

/* A model whose head (V 4096 x C 128) does not fit the widening scratch (one block: ~200K
 * floats), so both head products run in bands; canonical: the chunked product. */
static loom_gpt *make_wide(loom_dtype param, int canonical)
{
    loom_gpt_config c = {.vocab = 4096, .ctx = 16, .layers = 1, .heads = 4, .dim = 128};
    loom_gpt_parallel par = {.canonical = canonical};
    loom_gpt *m = NULL;
    ck_assert_msg(loom_gpt_create(&c, &be, 1, 11, &par, &m) == LOOM_OK, "%s", loom_last_error());
    ck_assert_msg(loom_gpt_set_precision(m, param, LOOM_DTYPE_F32) == LOOM_OK, "%s",
                  loom_last_error());
    return m;
}

static void train_pass(loom_gpt *m)
{
    int tok[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 977 + 5) % 4096;
        tgt[i] = (i * 613 + 11) % 4096;
    }
    double loss;
    loom_gpt_zero_grad(m);
    ck_assert_msg(loom_gpt_forward(m, tok, tgt, 1, 16, 1.0f / 16, &loss) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
}

START_TEST(head_in_bands)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
    for (int canonical = 0; canonical < 2; canonical++) {
        be.ops->set_deterministic(be.self, canonical);
        loom_gpt *m = make_wide(LOOM_DTYPE_BF16, canonical);
        loom_gpt *ref = make_wide(LOOM_DTYPE_F32, canonical);
        size_t np = loom_gpt_params(m)->total, n = (size_t)16 * 4096;
        ck_assert(loom_gpt_compute_param_bytes(m) * 2 == loom_gpt_compute_param_bytes(ref));
        ck_assert(loom_gpt_widen_bytes(m) < np * sizeof(float) / 2); /* not a full fp32 copy */
        ck_assert(loom_gpt_widen_bytes(ref) == 0);
        be.ops->round_to(loom_gpt_param_data(ref), loom_gpt_param_data(m), np, LOOM_DTYPE_BF16);
        train_pass(m);
        train_pass(ref);
        const float *z = loom_gpt_logits(m), *zr = loom_gpt_logits(ref);
        if (canonical)
            ck_assert_msg(memcmp(z, zr, n * sizeof(float)) == 0, "canonical logits differ");
        size_t off = 0;
        for (size_t i = 0; i < n; i++)
            off += !(fabsf(z[i] - zr[i]) <= 1e-5f * (1.0f + fabsf(zr[i])));
        ck_assert_msg(off == 0, "canonical %d: %zu logits off", canonical, off);
        const float *g = loom_gpt_grad_data(m), *gr = loom_gpt_grad_data(ref);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < np; i++) {
            double d = g[i] - gr[i];
            worst = d * d > worst ? d * d : worst;
            scale = gr[i] * gr[i] > scale ? gr[i] * gr[i] : scale;
        }
        if (canonical)
            ck_assert_msg(memcmp(g, gr, np * sizeof(float)) == 0, "canonical gradients differ");
        else
            ck_assert_msg(worst <= 1e-10 * scale, "fast gradients: %g of %g", worst, scale);
        ck_assert(scale > 0);
        loom_gpt_destroy(m);
        loom_gpt_destroy(ref);
    }
    be.ops->set_deterministic(be.self, 0);
}
END_TEST

START_TEST(integer_dtype_refused)
{
    loom_gpt *m = make(LOOM_DTYPE_F32, LOOM_DTYPE_F32);
    ck_assert(loom_gpt_set_precision(m, LOOM_DTYPE_I32, LOOM_DTYPE_F32) == LOOM_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(loom_last_error(), "stores weights in f32, bf16 or f16, not i32") != NULL,
                  "%s", loom_last_error());
    loom_gpt_destroy(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("precision");
    TCase *tc = tcase_create("model");
    tcase_add_test(tc, activations_are_rounded);
    tcase_add_test(tc, weights_are_a_rounded_copy);
    tcase_set_timeout(tc, 60); /* a shared 2-core machine */
    tcase_add_test(tc, head_in_bands);
    tcase_add_test(tc, integer_dtype_refused);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    if (be.ops)
        loom_backend_close(&be);
    return failed ? 1 : 0;
}
