/* test_cuda_model.c — the whole GPT-2 model (and a llama one, loss and gradients) on the CUDA
 * backend against the CPU backend:
 * the same config, seed and batches on both (loom_gpt_create through loom_backend_open, as
 * a session does).
 *   loss and gradients: one forward + backward; the losses within 1e-5 relative, every
 *     gradient element within 1e-5 + 2e-3 |cpu| (a 3-block model: fp32 sums in other orders
 *     compound through the blocks), and the gradient norms within 1e-4 relative.
 *   20 steps: both models trained 20 steps on the same batches, each with the same host
 *     AdamW (this test's own, so that the kernels are the only difference: the optimizer
 *     plugins update host memory, optim.h); the losses tracked within 2e-3 absolute every
 *     step and the loss must fall.
 * Check in no-fork mode; exit 77 (skip) where no GPU is visible. argv[1] names the backend
 * (default cuda); cuda_model_emu runs the "grads" case (CK_RUN_CASE) on cudaemu, the CUDA
 * kernels emulated on the CPU (the 20 steps there cost over a minute of CPU: run by hand,
 * `LOOM_PLUGIN_PATH=build/tests/cuda build/tests/cuda/test_cuda_model cudaemu`).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/status.h"
#include "model/gpt.h"

enum { B_ = 4, T_ = 32, V_ = 131 };

static loom_backend cpu, gpu;

static const loom_gpt_config gpt2_cfg = {.vocab = V_, .ctx = T_, .layers = 3, .heads = 4,
                                          .dim = 64};
/* The llama family (RMSNorm, SwiGLU, RoPE, grouped-query attention: 4 q heads over 2 kv
 * heads), 2 blocks. */
static const loom_gpt_config llama_cfg = {.vocab = V_, .ctx = T_, .layers = 2, .heads = 4,
                                          .dim = 64, .family = LOOM_FAMILY_LLAMA,
                                          .kv_heads = 2, .ffn_dim = 96};

static loom_gpt *make_cfg(loom_backend *be, const loom_gpt_config *cfg)
{
    loom_gpt_config c = *cfg;
    loom_gpt *m = NULL;
    ck_assert_msg(loom_gpt_create(&c, be, B_, 7, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    return m;
}

static loom_gpt *make(loom_backend *be)
{
    return make_cfg(be, &gpt2_cfg);
}

static void batch(int step, int *tok, int *tgt)
{
    unsigned s = 99u + 31u * (unsigned)step;
    for (int i = 0; i < B_ * T_; i++) { /* a learnable pattern: next = (tok * 3 + 1) % V */
        s = s * 1664525u + 1013904223u;
        tok[i] = (i % T_ == 0) ? (int)((s >> 8) % V_) : (tok[i - 1] * 3 + 1) % V_;
    }
    for (int i = 0; i < B_ * T_; i++)
        tgt[i] = (tok[i] * 3 + 1) % V_;
}

static double fwd_bwd(loom_gpt *m, const int *tok, const int *tgt)
{
    double loss = 0.0;
    loom_gpt_zero_grad(m);
    ck_assert_msg(loom_gpt_forward(m, tok, tgt, B_, T_, 1.0f / (B_ * T_), &loss) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    return loss / (B_ * T_);
}

static float *to_host(loom_backend *be, const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    be->ops->copy_to_host(be->self, h, d, n * sizeof(float));
    return h;
}

static void loss_and_grads(const char *what, const loom_gpt_config *cfg)
{
    loom_gpt *mc = make_cfg(&cpu, cfg), *mg = make_cfg(&gpu, cfg);
    int tok[B_ * T_], tgt[B_ * T_];
    batch(0, tok, tgt);
    double lc = fwd_bwd(mc, tok, tgt), lg = fwd_bwd(mg, tok, tgt);
    printf("%s loss: cpu %.9g gpu %.9g\n", what, lc, lg);
    ck_assert_msg(fabs(lc - lg) <= 1e-5 * fabs(lc), "loss: cpu %.9g gpu %.9g", lc, lg);
    size_t n = loom_gpt_params(mc)->total;
    ck_assert_uint_eq(n, loom_gpt_params(mg)->total);
    float *gc = to_host(&cpu, loom_gpt_grad_data(mc), n), *gg = to_host(&gpu, loom_gpt_grad_data(mg), n);
    double nc = 0, ng = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        nc += (double)gc[i] * gc[i];
        ng += (double)gg[i] * gg[i];
        double r = fabs((double)gg[i] - gc[i]) / (1e-5 + 2e-3 * fabs((double)gc[i]));
        if (!(r <= worst)) {
            worst = r;
            at = i;
        }
    }
    printf("%s grad norm: cpu %.9g gpu %.9g; worst element %zu: cpu %.9g gpu %.9g (%.3g of "
           "the tolerance)\n", what, sqrt(nc), sqrt(ng), at, gc[at], gg[at], worst);
    ck_assert_msg(worst <= 1.0, "%s: gradient %zu: cpu %.9g gpu %.9g", what, at, gc[at], gg[at]);
    ck_assert_msg(fabs(sqrt(nc) - sqrt(ng)) <= 1e-4 * sqrt(nc), "%s: gradient norm", what);
    free(gc), free(gg);
    loom_gpt_destroy(mc), loom_gpt_destroy(mg);
}

START_TEST(test_loss_and_grads)
{
    loss_and_grads("gpt2", &gpt2_cfg);
}
END_TEST

START_TEST(test_llama_loss_and_grads)
{
    loss_and_grads("llama", &llama_cfg);
}
END_TEST

/* AdamW over the flat buffer (lr 1e-3, betas 0.9/0.999, eps 1e-8, decay 0), on the host. */
static void adamw(float *p, const float *g, float *mv, size_t n, int step)
{
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
    for (size_t i = 0; i < n; i++) {
        float *m = &mv[i], *v = &mv[n + i];
        *m = b1 * *m + (1 - b1) * g[i];
        *v = b2 * *v + (1 - b2) * g[i] * g[i];
        p[i] -= lr * (*m / c1) / (sqrtf(*v / c2) + eps);
    }
}

static void host_step(loom_backend *be, loom_gpt *m, float *state, int step)
{
    size_t n = loom_gpt_params(m)->total;
    float *p = to_host(be, loom_gpt_param_data(m), n), *g = to_host(be, loom_gpt_grad_data(m), n);
    adamw(p, g, state, n, step);
    be->ops->copy_to_device(be->self, loom_gpt_param_data(m), p, n * sizeof(float));
    free(p), free(g);
}

START_TEST(test_twenty_steps_track_cpu)
{
    loom_gpt *mc = make(&cpu), *mg = make(&gpu);
    size_t n = loom_gpt_params(mc)->total;
    float *sc = calloc(2 * n, sizeof(float)), *sg = calloc(2 * n, sizeof(float));
    int tok[B_ * T_], tgt[B_ * T_];
    double first = 0, last = 0, worst = 0;
    for (int step = 1; step <= 20; step++) {
        batch(step, tok, tgt);
        double lc = fwd_bwd(mc, tok, tgt), lg = fwd_bwd(mg, tok, tgt);
        host_step(&cpu, mc, sc, step);
        host_step(&gpu, mg, sg, step);
        printf("step %2d loss cpu %.6f gpu %.6f diff %.2e\n", step, lc, lg, fabs(lc - lg));
        ck_assert_msg(isfinite(lg) && fabs(lc - lg) <= 2e-3, "step %d: cpu %.9g gpu %.9g", step,
                      lc, lg);
        worst = fabs(lc - lg) > worst ? fabs(lc - lg) : worst;
        if (step == 1)
            first = lg;
        last = lg;
    }
    printf("20 steps: loss %.4f -> %.4f, max |gpu - cpu| %.2e\n", first, last, worst);
    ck_assert_msg(last < first - 0.5, "the GPU model did not learn: %.4f -> %.4f", first, last);
    free(sc), free(sg);
    loom_gpt_destroy(mc), loom_gpt_destroy(mg);
}
END_TEST

/* argv[1]: the backend to test against the CPU (default "cuda"; tests/cuda also runs
 * "cudaemu", the CUDA kernels emulated on the CPU). */
int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "cuda";
    if (loom_backend_open(name, 0, &gpu) != LOOM_OK) {
        const char *why = loom_last_error();
        if (strstr(why, "not usable here") || strstr(why, "no CUDA device")) {
            printf("SKIP: no GPU here, the CUDA model tests did not run: %s\n", why);
            return 77;
        }
        fprintf(stderr, "the CUDA backend did not start: %s\n", why);
        return 1;
    }
    if (loom_backend_open("cpu", 0, &cpu) != LOOM_OK) {
        fprintf(stderr, "the CPU backend did not start: %s\n", loom_last_error());
        return 1;
    }
    printf("%s\n%s\n", cpu.ops->describe(cpu.self), gpu.ops->describe(gpu.self));
    Suite *su = suite_create("cuda_model");
    TCase *tc = tcase_create("grads"), *steps = tcase_create("steps"); /* CK_RUN_CASE picks */
    tcase_set_timeout(tc, 300);
    tcase_set_timeout(steps, 900);
    tcase_add_test(tc, test_loss_and_grads);
    tcase_add_test(tc, test_llama_loss_and_grads);
    tcase_add_test(steps, test_twenty_steps_track_cpu);
    suite_add_tcase(su, tc);
    suite_add_tcase(su, steps);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    loom_backend_close(&gpu);
    loom_backend_close(&cpu);
    return failed ? 1 : 0;
}
