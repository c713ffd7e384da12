/* test_cuda_optim.c — the optimizer plugins' device path (plugin/optim.h step_backend, the
 * backend's adamw_update and sgd_update) against their host step: the same plugin
 * instance's constants, the same segments (a decayed matrix, an undecayed bias, an empty
 * segment), six steps with a changing lr and a clipping grad_scale, gradients redrawn each
 * step. The parameters and state must equal the host step's BITWISE after every step: the
 * kernels round each operation as the host does (kernels/cuda/optim.cu). Cases: AdamW
 * (betas 0.9/0.999, and b1 = 0.3, ATen lerp's other form), SGD plain, with momentum, with
 * Nesterov momentum and weight decay.
 * argv[1] names the backend (default cuda; tests/cuda runs cudaemu, the CUDA kernels
 * emulated on the CPU). Check in no-fork mode; exit 77 (skip) where no GPU is visible.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/optim.h"
#include "base/backend.h"
#include "base/config.h"
#include "base/plugin_loader.h"
#include "base/status.h"

static loom_backend dev;

enum { N_SEG = 3, STEPS = 6 };
static const size_t seg_n[N_SEG] = {3001, 517, 0};

static void fill(float *x, size_t n, unsigned seed, float lo, float hi)
{
    unsigned s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(s >> 8) / 16777216.0f;
    }
}

/* An optimizer plugin made as the session makes one (core/train/session.c make_plugin). */
static void make_optim(const char *name, const char *const *keys, const double *vals, int n,
                       const loom_optim_ops **ops, void **self)
{
    const loom_plugin *p;
    ck_assert_msg(loom_plugin_load(LOOM_KIND_OPTIM, name, &p) == LOOM_OK, "%s", loom_last_error());
    loom_plugin_config pc;
    ck_assert(loom_config_init(&pc, p->desc) == LOOM_OK);
    for (int i = 0; i < n; i++) {
        loom_status st = strcmp(keys[i], "betas") == 0
                             ? loom_config_set_numbers(&pc, "betas", &vals[i], 2)
                             : strcmp(keys[i], "nesterov") == 0
                                   ? loom_config_set_boolean(&pc, keys[i], vals[i] != 0)
                                   : loom_config_set_number(&pc, keys[i], vals[i]);
        ck_assert_msg(st == LOOM_OK, "%s", loom_last_error());
        if (strcmp(keys[i], "betas") == 0)
            i++; /* two numbers */
    }
    ck_assert(loom_config_finish(&pc) == LOOM_OK);
    loom_config view = loom_config_view(&pc);
    *ops = p->desc->ops;
    ck_assert_msg(*ops && (*ops)->size > offsetof(loom_optim_ops, step_backend) &&
                      (*ops)->step_backend, "optim '%s' has no step_backend", name);
    ck_assert_msg((*ops)->create(loom_core_host(), &view, self) == LOOM_OK, "%s",
                  loom_last_error());
}

/* The host step and the device step from the same start, compared bitwise each step. */
static void run(const char *name, const char *const *keys, const double *vals, int n_keys)
{
    const loom_optim_ops *ops;
    void *self;
    make_optim(name, keys, vals, n_keys, &ops, &self);
    const loom_backend_ops *k = dev.ops;
    uint32_t slots = ops->state_per_param(self);
    size_t total = 0;
    for (int i = 0; i < N_SEG; i++)
        total += seg_n[i];
    size_t pb = total * sizeof(float), sb = pb * slots;
    float *hp = malloc(pb), *hg = malloc(pb), *hs = calloc(slots ? total * slots : 1, 4);
    float *back = malloc(pb), *sback = malloc(sb ? sb : 4);
    fill(hp, total, 1, -1, 1);
    float *dp = k->alloc(dev.self, pb), *dg = k->alloc(dev.self, pb);
    float *ds = slots ? k->alloc(dev.self, sb) : NULL;
    k->copy_to_device(dev.self, dp, hp, pb);
    loom_optim_segment hseg[N_SEG], dseg[N_SEG];
    size_t off = 0;
    for (int i = 0; i < N_SEG; i++) {
        float wd = i == 0 ? 0.1f : 0.0f; /* a matrix decays, a bias does not */
        hseg[i] = (loom_optim_segment){hp + off, hg + off, slots ? hs + slots * off : NULL,
                                       seg_n[i], wd};
        dseg[i] = (loom_optim_segment){dp + off, dg + off, slots ? ds + slots * off : NULL,
                                       seg_n[i], wd};
        off += seg_n[i];
    }
    for (int step = 1; step <= STEPS; step++) {
        fill(hg, total, 100 + (unsigned)step, -0.5f, 0.5f);
        hg[step] = step == 3 ? 1e-30f : hg[step]; /* tiny values take the same path too */
        k->copy_to_device(dev.self, dg, hg, pb);
        float lr = 1e-2f / (float)step, gs = step % 2 ? 1.0f : 0.37f;
        loom_optim_step_args ha = {hseg, N_SEG, lr, step, gs}, da = {dseg, N_SEG, lr, step, gs};
        ck_assert_msg(ops->step(self, &ha) == LOOM_OK, "%s", loom_last_error());
        ck_assert_msg(ops->step_backend(self, &da, k, dev.self) == LOOM_OK, "%s",
                      loom_last_error());
        k->copy_to_host(dev.self, back, dp, pb);
        if (slots)
            k->copy_to_host(dev.self, sback, ds, sb);
        for (size_t i = 0; i < total; i++)
            ck_assert_msg(memcmp(&back[i], &hp[i], 4) == 0,
                          "%s step %d: param %zu host %.9g (%a) device %.9g (%a)", name, step, i,
                          hp[i], hp[i], back[i], back[i]);
        for (size_t i = 0; i < total * slots; i++)
            ck_assert_msg(memcmp(&sback[i], &hs[i], 4) == 0,
                          "%s step %d: state %zu host %.9g device %.9g", name, step, i, hs[i],
                          sback[i]);
    }
    printf("%s (%s): %d steps, %zu params, %u state slots: device bitwise the host step\n", name,
           n_keys ? keys[0] : "defaults", STEPS, total, slots);
    k->free(dev.self, dp), k->free(dev.self, dg);
    if (ds)
        k->free(dev.self, ds);
    free(hp), free(hg), free(hs), free(back), free(sback);
    ops->destroy(self);
}

START_TEST(test_adamw)
{
    const char *keys[] = {"lr", "weight_decay"};
    run("adamw", keys, (double[]){1e-2, 0.1}, 2);
    const char *keys2[] = {"betas", "", "eps", "lr"}; /* b1 = 0.3: lerp's w >= 0.5 form */
    run("adamw", keys2, (double[]){0.3, 0.95, 1e-6, 3e-3}, 4);
}
END_TEST

START_TEST(test_sgd)
{
    const char *plain[] = {"lr"};
    run("sgd", plain, (double[]){0.5}, 1);
    const char *mom[] = {"momentum", "lr", "weight_decay"};
    run("sgd", mom, (double[]){0.9, 0.1, 0.01}, 3);
    const char *nest[] = {"nesterov", "momentum", "lr", "weight_decay"};
    run("sgd", nest, (double[]){1, 0.8, 0.1, 0.05}, 4);
}
END_TEST

/* A backend without the ops (the CPU one: host memory takes step) is refused by name. */
START_TEST(test_refused_without_op)
{
    loom_backend cpu;
    ck_assert_msg(loom_backend_open("cpu", 1, &cpu) == LOOM_OK, "%s", loom_last_error());
    const loom_optim_ops *ops;
    void *self;
    const char *keys[] = {"lr"};
    make_optim("adamw", keys, (double[]){1e-3}, 1, &ops, &self);
    loom_optim_step_args a = {NULL, 0, 1e-3f, 1, 1.0f};
    ck_assert(ops->step_backend(self, &a, cpu.ops, cpu.self) != LOOM_OK);
    ck_assert_msg(strstr(loom_last_error(), "no adamw_update op") != NULL, "%s",
                  loom_last_error());
    ops->destroy(self);
    loom_backend_close(&cpu);
}
END_TEST

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "cuda";
    if (loom_backend_open(name, 0, &dev) != LOOM_OK) {
        const char *why = loom_last_error();
        if (strstr(why, "not usable here") || strstr(why, "no CUDA device")) {
            printf("SKIP: no GPU here, the CUDA optimizer tests did not run: %s\n", why);
            return 77;
        }
        fprintf(stderr, "backend '%s' did not start: %s\n", name, loom_last_error());
        return 1;
    }
    printf("%s\n", dev.ops->describe(dev.self));
    Suite *su = suite_create("cuda_optim");
    TCase *tc = tcase_create("optim");
    tcase_add_test(tc, test_adamw);
    tcase_add_test(tc, test_sgd);
    tcase_add_test(tc, test_refused_without_op);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA after fork() is undefined */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    loom_backend_close(&dev);
    return failed ? 1 : 0;
}
