/* test_gpt_fixture.c — the whole GPT against PyTorch: logits, loss, every gradient, and
 * the parameters after two AdamW steps, from tests/fixtures/gpt_tiny.bin (made by
 * tests/fixtures/make_gpt_fixture.py in float64; see its README for the layout).
 * Built a second time on tests/fixtures/llama_tiny.bin (make_llama_fixture.py: Hugging
 * Face Llama's math, grouped-query attention, untied head): the same checks on the llama
 * family, whose header adds kv_heads, ffn_dim, rope_theta and norm_eps.
 *
 * Tolerances (fp32 loom vs float64 PyTorch): logits and loss 1e-6 absolute, gradients
 * 5e-7 absolute (measured: 4.5e-8), parameters after two AdamW steps 2e-5 absolute (9e-6) (the key biases, whose
 * true gradient is zero, move by AdamW-normalised roundoff; see the fixture README).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/optim.h"
#include "base/plugin_loader.h"
#include "train/checkpoint.h"
#include "train/session.h"

#ifndef FIXTURE_PATH
#error "FIXTURE_PATH must point at tests/fixtures/gpt_tiny.bin"
#endif

typedef struct fixture {
    int V, Vp, maxT, L, NH, C, B, T, n_params;
    int llama, KVH, F;
    float lr, beta1, beta2, eps, wd, theta, norm_eps;
    float *params, *logits, *grads, *final_params;
    int *tokens, *targets;
    float loss, step_losses[2];
} fixture;

static fixture fx;

static void read_exact(FILE *f, void *dst, size_t bytes)
{
    if (fread(dst, 1, bytes, f) != bytes) {
        fprintf(stderr, "fixture %s is truncated\n", FIXTURE_PATH);
        exit(1);
    }
}

static void load_fixture(void)
{
    FILE *f = fopen(FIXTURE_PATH, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", FIXTURE_PATH);
        exit(1);
    }
    int32_t h[16];
    float hp[8];
    read_exact(f, h, sizeof h);
    read_exact(f, hp, sizeof hp);
    fx.llama = h[0] == 20261201;
    if ((h[0] != 20261129 && !fx.llama) || h[1] != 1) {
        fprintf(stderr, "%s: bad magic %d or version %d\n", FIXTURE_PATH, h[0], h[1]);
        exit(1);
    }
    fx.V = h[2]; fx.Vp = h[3]; fx.maxT = h[4]; fx.L = h[5]; fx.NH = h[6]; fx.C = h[7];
    fx.B = h[8]; fx.T = h[9]; fx.n_params = h[10];
    fx.lr = hp[0]; fx.beta1 = hp[1]; fx.beta2 = hp[2]; fx.eps = hp[3]; fx.wd = hp[4];
    fx.KVH = h[12]; fx.F = h[13]; fx.theta = hp[5]; fx.norm_eps = hp[6];
    size_t n = (size_t)fx.n_params, bt = (size_t)fx.B * fx.T;
    fx.params = malloc(n * 4); fx.grads = malloc(n * 4); fx.final_params = malloc(n * 4);
    fx.tokens = malloc(bt * 4); fx.targets = malloc(bt * 4); fx.logits = malloc(bt * fx.Vp * 4);
    read_exact(f, fx.params, n * 4);
    read_exact(f, fx.tokens, bt * 4);
    read_exact(f, fx.targets, bt * 4);
    read_exact(f, fx.logits, bt * fx.Vp * 4);
    read_exact(f, &fx.loss, 4);
    read_exact(f, fx.grads, n * 4);
    read_exact(f, fx.step_losses, 8);
    read_exact(f, fx.final_params, n * 4);
    fclose(f);
}

static loom_status fixture_batch(void *ctx, int *tokens, int *targets, int B, int T)
{
    (void)ctx;
    memcpy(tokens, fx.tokens, (size_t)B * T * sizeof(int));
    memcpy(targets, fx.targets, (size_t)B * T * sizeof(int));
    return LOOM_OK;
}

static loom_plugin_config optim_cfg, precision_cfg;

static loom_session *make_session(void)
{
    const loom_plugin *adamw, *fp32;
    ck_assert_msg(loom_plugin_load(LOOM_KIND_OPTIM, "adamw", &adamw) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_msg(loom_plugin_load(LOOM_KIND_PRECISION, "fp32", &fp32) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_int_eq(loom_config_init(&optim_cfg, adamw->desc), LOOM_OK);
    ck_assert_int_eq(loom_config_set_number(&optim_cfg, "lr", fx.lr), LOOM_OK);
    double betas[2] = {fx.beta1, fx.beta2};
    ck_assert_int_eq(loom_config_set_numbers(&optim_cfg, "betas", betas, 2), LOOM_OK);
    ck_assert_int_eq(loom_config_set_number(&optim_cfg, "eps", fx.eps), LOOM_OK);
    ck_assert_int_eq(loom_config_set_number(&optim_cfg, "weight_decay", fx.wd), LOOM_OK);
    ck_assert_int_eq(loom_config_init(&precision_cfg, fp32->desc), LOOM_OK);
    loom_session_config cfg = {
        .model = {fx.V, fx.Vp, fx.maxT, fx.L, fx.NH, fx.C},
        .micro_batch = fx.B, .seq = fx.T, .accum = 1, .seed = 1, .grad_clip = 0.0f,
        .backend = "cpu", .threads = 0, .optim = &optim_cfg, .precision = &precision_cfg};
    if (fx.llama) {
        cfg.model.family = LOOM_FAMILY_LLAMA;
        cfg.model.kv_heads = fx.KVH;
        cfg.model.ffn_dim = fx.F;
        cfg.model.rope_theta = fx.theta;
        cfg.model.norm_eps = fx.norm_eps;
    }
    loom_session *s = NULL;
    ck_assert_msg(loom_session_create(&cfg, &s) == LOOM_OK, "%s", loom_last_error());
    loom_gpt *m = loom_session_model(s);
    ck_assert_uint_eq(loom_params_count(loom_gpt_params(m)), (size_t)fx.n_params);
    /* The fixture is packed; loom's buffer aligns each entry: copy entry by entry. */
    const loom_param_table *t = loom_gpt_params(m);
    size_t src = 0;
    for (int i = 0; i < t->count; i++) {
        memcpy(loom_gpt_param_data(m) + t->entries[i].offset, fx.params + src,
               t->entries[i].numel * sizeof(float));
        src += t->entries[i].numel;
    }
    return s;
}

/* max |a[i] - b[i]| over the model's entries (b packed as the fixture is). */
static double max_param_diff(loom_gpt *m, const float *a_flat, const float *b_packed, char *worst,
                             size_t worst_len)
{
    const loom_param_table *t = loom_gpt_params(m);
    double max = 0.0;
    size_t src = 0;
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        for (size_t j = 0; j < e->numel; j++) {
            double d = fabs((double)a_flat[e->offset + j] - b_packed[src + j]);
            if (d > max) {
                max = d;
                snprintf(worst, worst_len, "%s[%zu]", e->name, j);
            }
        }
        src += e->numel;
    }
    return max;
}

START_TEST(test_logits_loss_grads)
{
    loom_session *s = make_session();
    loom_gpt *m = loom_session_model(s);
    size_t bt = (size_t)fx.B * fx.T;
    double loss_sum = 0.0;
    ck_assert_int_eq(loom_gpt_forward(m, fx.tokens, fx.targets, fx.B, fx.T, 0.0f, &loss_sum), LOOM_OK);
    const float *logits = loom_gpt_logits(m);
    double max = 0.0;
    for (size_t i = 0; i < bt * fx.Vp; i++)
        max = fmax(max, fabs((double)logits[i] - fx.logits[i]));
    printf("logits max |diff| %.3g, loss %.3g\n", max, fabs(loss_sum / bt - fx.loss));
    ck_assert_msg(max < 1e-6, "logits differ from PyTorch by %g", max);
    ck_assert_msg(fabs(loss_sum / bt - fx.loss) < 1e-6, "loss %g vs PyTorch %g", loss_sum / bt, fx.loss);

    loom_gpt_zero_grad(m);
    ck_assert_int_eq(loom_gpt_forward(m, fx.tokens, fx.targets, fx.B, fx.T, 1.0f / bt, &loss_sum), LOOM_OK);
    ck_assert_int_eq(loom_gpt_backward(m), LOOM_OK);
    char worst[96] = "";
    double gmax = max_param_diff(m, loom_gpt_grad_data(m), fx.grads, worst, sizeof worst);
    printf("gradients max |diff| %.3g at %s\n", gmax, worst);
    ck_assert_msg(gmax < 5e-7, "gradients differ from PyTorch by %g at %s", gmax, worst);
    /* the padding rows of wte get no gradient at all */
    const char *padded[2] = {"wte", fx.llama ? "lm_head.weight" : "wte"};
    for (int k = 0; k < 2; k++) {
        const loom_param_entry *e = loom_params_find(loom_gpt_params(m), padded[k]);
        ck_assert_ptr_nonnull(e);
        for (size_t i = (size_t)fx.V * fx.C; i < e->numel; i++)
            ck_assert_float_eq(loom_gpt_grad_data(m)[e->offset + i], 0.0f);
    }
    loom_session_destroy(s);
}
END_TEST

START_TEST(test_two_adamw_steps)
{
    loom_session *s = make_session();
    for (int k = 0; k < 2; k++) {
        loom_step_stats st;
        ck_assert_msg(loom_session_step(s, fixture_batch, NULL, fx.lr, &st) == LOOM_OK, "%s",
                      loom_last_error());
        ck_assert_msg(fabs(st.loss - fx.step_losses[k]) < 2e-5, "step %d loss %g vs PyTorch %g",
                      k + 1, st.loss, fx.step_losses[k]);
    }
    char worst[96] = "";
    loom_gpt *m = loom_session_model(s);
    double pmax = max_param_diff(m, loom_gpt_param_data(m), fx.final_params, worst, sizeof worst);
    printf("params after 2 AdamW steps max |diff| %.3g at %s\n", pmax, worst);
    ck_assert_msg(pmax < 2e-5, "params after 2 AdamW steps differ by %g at %s", pmax, worst);
    loom_session_destroy(s);
}
END_TEST

/* test_llama_fixture --save-checkpoint DIR: the fixture's initial parameters as a loom
 * checkpoint (step 0) in DIR, for test_llama_export.sh to export and compare (a Check test
 * of its own: the session helpers assert). */
static const char *save_dir;

START_TEST(test_save_checkpoint)
{
    loom_session *s = make_session();
    loom_checkpoint_extra x;
    memset(&x, 0, sizeof x);
    ck_assert_msg(loom_checkpoint_save(s, save_dir, &x, NULL, 0) == LOOM_OK, "%s",
                  loom_last_error());
    loom_session_destroy(s);
}
END_TEST

int main(int argc, char **argv)
{
    load_fixture();
    save_dir = argc == 3 && strcmp(argv[1], "--save-checkpoint") == 0 ? argv[2] : NULL;
    Suite *su = suite_create("gpt_fixture");
    TCase *tc = tcase_create("pytorch");
    tcase_set_timeout(tc, 60);
    if (save_dir) {
        tcase_add_test(tc, test_save_checkpoint);
    } else {
        tcase_add_test(tc, test_logits_loss_grads);
        tcase_add_test(tc, test_two_adamw_steps);
    }
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
