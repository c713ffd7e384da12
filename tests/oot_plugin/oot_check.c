/* oot_check.c — load one plugin the way the core does and show that it works, for the
 * out-of-tree test (run_test.sh) until `loom plugins` / a recipe run can do the same.
 *
 *   loom-oot-check <kind> <name> [key=value ...]
 *
 * Loads <kind>/<name> from the search path (LOOM_PLUGIN_PATH first), prints
 *   plugin <kind> <name> <version> <path>
 * and, for an optimizer, creates it from its defaults plus the key=value overrides
 * (written as in a recipe), runs three fixed steps on four values in one decaying segment
 * with grad_scale 1 and lr from the config, and prints
 *   state_per_param <n>
 *   step <t> <p0> <p1> <p2> <p3>
 * Exit status 0 on success; 1 with loom's message on stderr otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/optim.h"
#include "base/plugin_loader.h"
#include "plugin_test_util.h"
#include "base/status.h"

static int fail(const char *what)
{
    fprintf(stderr, "loom-oot-check: %s: %s\n", what, loom_last_error());
    return 1;
}

static int run_optim(const loom_plugin *p, const char *const *overrides)
{
    const loom_optim_ops *o = p->desc->ops;
    tcfg t;
    if (!tcfg_build(&t, p->desc, overrides, 0)) {
        fprintf(stderr, "loom-oot-check: config: %s\n", t.err);
        return 1;
    }
    double lr = 0;
    for (int i = 0; i < t.cfg.count; i++)
        if (strcmp(t.vals[i].name, "lr") == 0)
            lr = t.vals[i].number;
    void *self = NULL;
    if (o->create(loom_core_host(), &t.cfg, &self) != LOOM_OK)
        return fail("create");
    uint32_t slots = o->state_per_param(self);
    float wd;
    int decay_all;
    o->decay_rule(self, &wd, &decay_all); /* the one segment is a matrix: it decays */
    printf("state_per_param %u\n", slots);

    static const float grads[3][4] = {{0.5f, -0.5f, 0, 1}, {-0.25f, -0.5f, 0.1f, -1}, {-1, 0.2f, 0, 0.5f}};
    float param[4] = {1, -1, 0.5f, 0}, grad[4];
    float *state = calloc(4 * (slots ? slots : 1), sizeof *state);
    if (state == NULL)
        return 1;
    loom_optim_segment seg = {param, grad, state, 4, wd};
    loom_optim_step_args args = {&seg, 1, (float)lr, 0, 1.0f};
    for (int s = 0; s < 3; s++) {
        memcpy(grad, grads[s], sizeof grad);
        args.step = s + 1;
        if (o->step(self, &args) != LOOM_OK)
            return fail("step");
        printf("step %d %.9g %.9g %.9g %.9g\n", s + 1, param[0], param[1], param[2], param[3]);
    }
    free(state);
    o->destroy(self);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: loom-oot-check <kind> <name> [key=value ...]\n");
        return 2;
    }
    loom_kind kind = 0;
    for (int k = LOOM_KIND_COMM; k <= LOOM_KIND_BACKEND; k++)
        if (strcmp(argv[1], loom_kind_name((loom_kind)k)) == 0)
            kind = (loom_kind)k;
    const loom_plugin *p = NULL;
    if (loom_plugin_load(kind, argv[2], &p) != LOOM_OK)
        return fail("load");
    printf("plugin %s %s %s %s\n", loom_kind_name(p->desc->kind), p->desc->name,
           p->desc->version, p->path);
    if (kind == LOOM_KIND_OPTIM)
        return run_optim(p, (const char *const *)argv + 3);
    return 0;
}
