/* test_moe.c — the mixture-of-experts layer (core/model/moe.h, moe_route.h):
 * - routing, capacity and dropping against a reference written here, independently of
 *   moe_route.c (per-expert token lists, gates, drop counts), on random logits;
 * - a skewed router (every token to one expert) drops exactly the overflow; dropless
 *   (capacity_factor 0) drops none;
 * - the router's gradient (gates through the top-k softmax, the aux loss, the z-loss)
 *   against central finite differences;
 * - the whole MoE GPT against PyTorch (tests/fixtures/make_moe_fixture.py, float64):
 *   logits, cross-entropy, aux and z losses, every gradient, each expert's token count;
 * - the noisy router: keyed by (seed, micro-batch key, row), the same for the same key;
 * - the llama family's SwiGLU experts: one expert (top-1, dropless) carrying the dense
 *   llama's MLP weights gives the dense model's loss and gradients;
 * - 16-bit weights (bf16, f16; both families): the router and the experts read the 16-bit
 *   copy, so the loss and gradients are bitwise an fp32 model's on the rounded weights.
 * Tolerances (fp32 vs float64): logits and losses 2e-6, gradients 1e-6 absolute (measured
 * figures are printed); finite differences 1e-4 absolute on gradients up to ~0.3 (central, steps of 2e-3 on fp32
 * logits; the gates are fp32, so the differences carry ~1e-5 of roundoff: measured 1.5e-5).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "model/gpt.h"
#include "model/moe_route.h"

#ifndef FIXTURE_DIR
#error "FIXTURE_DIR must point at tests/fixtures"
#endif

static uint64_t lcg = 12345;
static float urand(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* The reference: top-k by value (ties to the lower index) and choice-rank-major slots. */
static void reference(const float *z, int R, int E, int k, int cap, int *kept, int *tok,
                      int *dropped)
{
    int *ch = malloc((size_t)R * k * sizeof(int));
    for (int t = 0; t < R; t++)
        for (int j = 0; j < k; j++) { /* j-th best: count experts strictly better */
            for (int e = 0; e < E; e++) {
                int better = 0;
                for (int f = 0; f < E; f++)
                    better += z[t * E + f] > z[t * E + e] || (z[t * E + f] == z[t * E + e] && f < e);
                if (better == j)
                    ch[t * k + j] = e;
            }
        }
    memset(kept, 0, (size_t)E * sizeof(int));
    *dropped = 0;
    for (int j = 0; j < k; j++)
        for (int t = 0; t < R; t++) {
            int e = ch[t * k + j];
            if (kept[e] < cap)
                tok[e * R + kept[e]++] = t;
            else
                ++*dropped;
        }
    free(ch);
}

START_TEST(test_routing_reference)
{
    const int R = 40, E = 5;
    float z[40 * 5];
    for (int k = 1; k <= 3; k++)
        for (int ci = 0; ci < 4; ci++) {
            double c = (double[]){0.0, 0.5, 1.0, 1.5}[ci];
            for (int i = 0; i < R * E; i++)
                z[i] = 2.0f * urand();
            moe_route r;
            ck_assert_int_eq(moe_route_alloc(&r, R, E, k), 0);
            int cap = moe_capacity(k, R, E, c), kept[5], tok[5 * 40], dropped;
            ck_assert_int_eq(cap, c == 0.0 ? R : (int)ceil(k * R / (double)E * c - 1e-9));
            moe_route_compute(&r, z, R, cap);
            reference(z, R, E, k, cap, kept, tok, &dropped);
            ck_assert_int_eq(r.dropped, dropped);
            ck_assert_int_eq(r.kept, R * k - dropped);
            if (c == 0.0)
                ck_assert_int_eq(dropped, 0);
            for (int e = 0; e < E; e++) {
                ck_assert_int_eq(r.count[e], kept[e]);
                for (int i = 0; i < kept[e]; i++)
                    ck_assert_int_eq(r.tok[r.offset[e] + i], tok[e * R + i]);
            }
            /* gates: raw p for k = 1, renormalised over the chosen for k > 1 */
            for (int a = 0; a < r.kept; a++) {
                int t = r.tok[a], q = r.pair[a], e = r.choice[q];
                double mx = -1e30, s = 0.0, chosen = 0.0;
                for (int f = 0; f < E; f++)
                    mx = fmax(mx, z[t * E + f]);
                for (int f = 0; f < E; f++)
                    s += exp(z[t * E + f] - mx);
                for (int j = 0; j < k; j++)
                    chosen += exp(z[t * E + r.choice[t * k + j]] - mx) / s;
                double p = exp(z[t * E + e] - mx) / s, want = k == 1 ? p : p / chosen;
                ck_assert_msg(fabs(r.agate[a] - want) < 1e-6, "gate %g vs %g", r.agate[a], want);
            }
            moe_route_free(&r);
        }
}
END_TEST

START_TEST(test_skewed_and_dropless)
{
    const int R = 16, E = 4;
    float z[16 * 4];
    for (int t = 0; t < R; t++)
        for (int e = 0; e < E; e++)
            z[t * E + e] = e == 0 ? 5.0f : e == 1 ? 2.0f : 0.1f * urand(); /* all to 0, then 1 */
    for (int k = 1; k <= 2; k++) {
        moe_route r;
        ck_assert_int_eq(moe_route_alloc(&r, R, E, k), 0);
        int cap = moe_capacity(k, R, E, 1.0); /* k R / E */
        moe_route_compute(&r, z, R, cap);
        ck_assert_int_eq(cap, k * R / E);
        /* each of the k favoured experts keeps cap tokens, the first cap rows; the rest drop */
        ck_assert_int_eq(r.dropped, k * (R - cap));
        for (int e = 0; e < k; e++) {
            ck_assert_int_eq(r.count[e], cap);
            for (int i = 0; i < cap; i++)
                ck_assert_int_eq(r.tok[r.offset[e] + i], i);
        }
        moe_route_compute(&r, z, R, moe_capacity(k, R, E, 0.0)); /* dropless */
        ck_assert_int_eq(r.dropped, 0);
        ck_assert_int_eq(r.count[0], R);
        moe_route_free(&r);
    }
}
END_TEST

/* objective(z) = sum_a c_a gate_a + w_aux E fp + w_z z (the forward's assignments fixed) */
static double objective(moe_route *r, const float *z, int R, int cap, const float *c, double wa,
                        double wz)
{
    moe_route_compute(r, z, R, cap);
    double sum = wa * r->E * r->fp + wz * r->z;
    for (int a = 0; a < r->kept; a++)
        sum += (double)c[a] * r->agate[a];
    return sum;
}

START_TEST(test_router_gradient_fd)
{
    const int R = 12, E = 6;
    float z[12 * 6], dz[12 * 6], cst[12 * 3];
    for (int k = 1; k <= 3; k += 2) {
        for (int i = 0; i < R * E; i++)
            z[i] = 1.5f * urand();
        for (int i = 0; i < R * k; i++)
            cst[i] = urand();
        moe_route r;
        ck_assert_int_eq(moe_route_alloc(&r, R, E, k), 0);
        int cap = moe_capacity(k, R, E, 1.0);
        double wa = 0.7, wz = 0.3;
        objective(&r, z, R, cap, cst, wa, wz);
        moe_route_backward(&r, cst, wa, wz, dz);
        double worst = 0.0, worst_abs = 0.0, gmax = 0.0;
        for (int i = 0; i < R * E; i++) {
            float keep = z[i], hi = keep + 2e-3f, lo = keep - 2e-3f; /* the float steps taken */
            z[i] = hi;
            double up = objective(&r, z, R, cap, cst, wa, wz);
            z[i] = lo;
            double dn = objective(&r, z, R, cap, cst, wa, wz);
            z[i] = keep;
            double fd = (up - dn) / ((double)hi - lo), d = fabs(fd - dz[i]) / fmax(1e-2, fabs(fd));
            worst = fmax(worst, d);
            worst_abs = fmax(worst_abs, fabs(fd - dz[i]));
            gmax = fmax(gmax, fabs(fd));
        }
        printf("router gradient k=%d vs finite differences: max rel diff %.3g, abs %.3g "
               "(largest gradient %.3g)\n", k, worst, worst_abs, gmax);
        ck_assert_msg(worst_abs < 1e-4, "router gradient k=%d off by %g", k, worst_abs);
        /* the aux loss alone, gradient nonzero: the check sees it */
        memset(cst, 0, sizeof cst);
        objective(&r, z, R, cap, cst, 1.0, 0.0);
        moe_route_backward(&r, cst, 1.0, 0.0, dz);
        double norm = 0.0;
        for (int i = 0; i < R * E; i++)
            norm += fabs(dz[i]);
        ck_assert_msg(norm > 1e-4, "aux gradient vanished (%g)", norm);
        moe_route_free(&r);
    }
}
END_TEST

/* --- the whole model against PyTorch --------------------------------------------------- */

typedef struct fixture {
    int h[16];
    float hp[4];
    float *params, *logits, *grads, losses[3];
    int *tokens, *targets, *kept;
} fixture;

static void read_exact(FILE *f, void *dst, size_t n, const char *path)
{
    if (fread(dst, 1, n, f) != n) {
        fprintf(stderr, "%s is truncated\n", path);
        exit(1);
    }
}

static void load(const char *name, fixture *fx)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", FIXTURE_DIR, name);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    read_exact(f, fx->h, sizeof fx->h, path);
    read_exact(f, fx->hp, sizeof fx->hp, path);
    ck_assert_int_eq(fx->h[0], 20261201);
    size_t n = (size_t)fx->h[10], bt = (size_t)fx->h[8] * fx->h[9], Vp = (size_t)fx->h[3];
    size_t nk = (size_t)fx->h[14] * fx->h[11];
    fx->params = malloc(n * 4); fx->grads = malloc(n * 4); fx->logits = malloc(bt * Vp * 4);
    fx->tokens = malloc(bt * 4); fx->targets = malloc(bt * 4); fx->kept = malloc(nk * 4);
    read_exact(f, fx->params, n * 4, path);
    read_exact(f, fx->tokens, bt * 4, path);
    read_exact(f, fx->targets, bt * 4, path);
    read_exact(f, fx->logits, bt * Vp * 4, path);
    read_exact(f, fx->losses, 12, path);
    read_exact(f, fx->grads, n * 4, path);
    read_exact(f, fx->kept, nk * 4, path);
    fclose(f);
}

static loom_backend be;
static int be_open;

static loom_gpt *make_model(const fixture *fx, uint64_t seed, int noisy)
{
    if (!be_open)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
    be_open = 1;
    const int *h = fx->h;
    loom_gpt_config c = {.vocab = h[2], .vocab_padded = h[3], .ctx = h[4], .layers = h[5],
                         .heads = h[6], .dim = h[7],
                         .moe = {.experts = h[11], .top_k = h[12], .every = h[13],
                                 .capacity_factor = fx->hp[0], .aux_loss = fx->hp[1],
                                 .z_loss = fx->hp[2], .noisy = noisy}};
    loom_gpt *m = NULL;
    ck_assert_msg(loom_gpt_create(&c, &be, h[8], seed, NULL, &m) == LOOM_OK, "%s",
                  loom_last_error());
    const loom_param_table *t = loom_gpt_params(m);
    ck_assert_uint_eq(loom_params_count(t), (size_t)h[10]);
    size_t src = 0;
    for (int i = 0; i < t->count; i++) { /* the fixture is packed, loom aligns each entry */
        memcpy(loom_gpt_param_data(m) + t->entries[i].offset, fx->params + src,
               t->entries[i].numel * sizeof(float));
        src += t->entries[i].numel;
    }
    return m;
}

static void check_fixture(const char *name)
{
    fixture fx;
    load(name, &fx);
    loom_gpt *m = make_model(&fx, 1, 0);
    int B = fx.h[8], T = fx.h[9], Vp = fx.h[3], E = fx.h[11];
    size_t R = (size_t)B * T;
    double loss = 0.0, d = 0.0;
    ck_assert_int_eq(loom_gpt_forward(m, fx.tokens, fx.targets, B, T, 0.0f, &loss), LOOM_OK);
    const float *lg = loom_gpt_logits(m);
    for (size_t i = 0; i < R * Vp; i++)
        d = fmax(d, fabs((double)lg[i] - fx.logits[i]));
    double dl = fabs(loss / R - fx.losses[0]);
    ck_assert_int_eq(loom_gpt_forward(m, fx.tokens, fx.targets, B, T, 1.0f / R, &loss), LOOM_OK);
    loom_moe_stats st;
    loom_gpt_moe_stats(m, &st, 0);
    ck_assert_int_eq(st.layers, fx.h[14]);
    ck_assert_int_eq(st.forwards, 1);
    for (int i = 0; i < st.layers * E; i++)
        ck_assert_msg(st.load[i] == fx.kept[i], "%s: expert %d of MoE block %d computed %g "
                      "tokens, PyTorch %d", name, i % E, i / E, st.load[i], fx.kept[i]);
    ck_assert_msg(st.dropped == fx.h[15], "%s dropped %g, PyTorch %d", name, st.dropped, fx.h[15]);
    double da = fabs(st.aux - fx.losses[1]), dz = fabs(st.z - fx.losses[2]);
    loom_gpt_zero_grad(m);
    ck_assert_int_eq(loom_gpt_backward(m), LOOM_OK);
    const loom_param_table *t = loom_gpt_params(m);
    const float *g = loom_gpt_grad_data(m);
    double dg = 0.0;
    char worst[96] = "";
    size_t src = 0;
    for (int i = 0; i < t->count; i++) {
        for (size_t j = 0; j < t->entries[i].numel; j++) {
            double x = fabs((double)g[t->entries[i].offset + j] - fx.grads[src + j]);
            if (x > dg) {
                dg = x;
                snprintf(worst, sizeof worst, "%s[%zu]", t->entries[i].name, j);
            }
        }
        src += t->entries[i].numel;
    }
    printf("%s vs PyTorch: logits %.3g, ce %.3g, aux %.3g, z %.3g, grads %.3g (at %s); "
           "dropped %g of %g\n", name, d, dl, da, dz, dg, worst, st.dropped, st.assigned);
    ck_assert_msg(d < 2e-6 && dl < 2e-6, "%s logits %g, loss %g off", name, d, dl);
    ck_assert_msg(da < 2e-6 && dz < 2e-6, "%s aux %g, z %g off", name, da, dz);
    ck_assert_msg(dg < 1e-6, "%s gradient %s off by %g", name, worst, dg);
    loom_gpt_destroy(m);
}

START_TEST(test_fixture_k2) { check_fixture("moe_k2.bin"); }
END_TEST
START_TEST(test_fixture_k1) { check_fixture("moe_k1.bin"); }
END_TEST

/* The noisy router: the same key, the same routing; another key, other noise. */
START_TEST(test_noisy_keyed)
{
    fixture fx;
    load("moe_k2.bin", &fx);
    int B = fx.h[8], T = fx.h[9], E = fx.h[11];
    double loads[3][8];
    for (int run = 0; run < 3; run++) {
        loom_gpt *m = make_model(&fx, 5, 1);
        double loss;
        loom_gpt_set_moe_key(m, run == 2 ? 8 : 3);
        ck_assert_int_eq(loom_gpt_forward(m, fx.tokens, fx.targets, B, T, 1.0f, &loss), LOOM_OK);
        loom_moe_stats st;
        loom_gpt_moe_stats(m, &st, 1);
        memcpy(loads[run], st.load, (size_t)E * sizeof(double));
        loom_gpt_destroy(m);
    }
    ck_assert_mem_eq(loads[0], loads[1], (size_t)E * sizeof(double));
    ck_assert_msg(memcmp(loads[0], loads[2], (size_t)E * sizeof(double)) != 0,
                  "noise keyed 3 and 8 routed alike");
}
END_TEST

/* The llama family's SwiGLU experts: one expert, top-1, dropless, no aux or z loss routes
 * every token to expert 0 with gate softmax(one logit) = 1, so with the dense llama's
 * mlp.gate/up/proj weights copied into it (everything else by name) the MoE model is the
 * dense one: the same loss and gradients (the dense llama matches PyTorch: test_llama.c),
 * and the router's gradient is zero. Tolerance 1e-6 (fp32; measured figures printed). */
static loom_gpt *llama(int moe)
{
    if (!be_open)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
    be_open = 1;
    loom_gpt_config c = {.vocab = 61, .ctx = 8, .layers = 2, .heads = 4, .dim = 32,
                         .family = LOOM_FAMILY_LLAMA, .kv_heads = 2, .ffn_dim = 48};
    if (moe)
        c.moe = (loom_moe_config){.experts = 1, .top_k = 1, .every = 1};
    loom_gpt *m = NULL;
    ck_assert_msg(loom_gpt_create(&c, &be, 2, 7, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    return m;
}

/* The dense model's name for MoE entry `name` (expert 0's gate, up, proj), or name. */
static const char *dense_name(const char *name, char *buf, size_t n)
{
    int l;
    char what[32];
    if (sscanf(name, "h.%d.moe.expert.0.%31s", &l, what) == 2) {
        snprintf(buf, n, "h.%d.mlp.%s", l, what);
        return buf;
    }
    return name;
}

START_TEST(test_llama_one_expert)
{
    loom_gpt *d = llama(0), *m = llama(1);
    const loom_param_table *td = loom_gpt_params(d), *tm = loom_gpt_params(m);
    int routers = 0;
    for (int i = 0; i < tm->count; i++) {
        char buf[96];
        const loom_param_entry *e = &tm->entries[i];
        if (strstr(e->name, ".moe.router.")) {
            routers++;
            continue;
        }
        const loom_param_entry *f = loom_params_find(td, dense_name(e->name, buf, sizeof buf));
        ck_assert_msg(f && f->numel == e->numel, "%s has no dense twin", e->name);
        memcpy(loom_gpt_param_data(m) + e->offset, loom_gpt_param_data(d) + f->offset,
               e->numel * sizeof(float));
    }
    ck_assert_int_eq(routers, 2);
    int B = 2, T = 8, tok[16], tgt[16];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 17 + 3) % 61;
        tgt[i] = (i * 29 + 5) % 61;
    }
    double ld = 0.0, lm = 0.0;
    loom_gpt_zero_grad(d);
    loom_gpt_zero_grad(m);
    ck_assert_int_eq(loom_gpt_forward(d, tok, tgt, B, T, 1.0f / (B * T), &ld), LOOM_OK);
    ck_assert_int_eq(loom_gpt_backward(d), LOOM_OK);
    ck_assert_int_eq(loom_gpt_forward(m, tok, tgt, B, T, 1.0f / (B * T), &lm), LOOM_OK);
    ck_assert_int_eq(loom_gpt_backward(m), LOOM_OK);
    ck_assert_msg(isfinite(lm) && lm > 0.0, "loss %g", lm);
    double dg = 0.0, dr = 0.0, gmax = 0.0;
    char worst[96] = "";
    for (int i = 0; i < tm->count; i++) {
        char buf[96];
        const loom_param_entry *e = &tm->entries[i];
        const float *gm = loom_gpt_grad_data(m) + e->offset;
        if (strstr(e->name, ".moe.router.")) {
            for (size_t j = 0; j < e->numel; j++)
                dr = fmax(dr, fabs(gm[j]));
            continue;
        }
        const loom_param_entry *f = loom_params_find(td, dense_name(e->name, buf, sizeof buf));
        const float *gd = loom_gpt_grad_data(d) + f->offset;
        for (size_t j = 0; j < e->numel; j++) {
            double x = fabs((double)gm[j] - gd[j]);
            gmax = fmax(gmax, fabs(gd[j]));
            if (!(x <= dg)) {
                dg = x;
                snprintf(worst, sizeof worst, "%s[%zu]", e->name, j);
            }
        }
    }
    double dl = fabs(lm - ld) / (B * T);
    printf("llama, one SwiGLU expert vs the dense llama: loss %.3g, grads %.3g (at %s, of up "
           "to %.3g), router grad %.3g\n", dl, dg, worst[0] ? worst : "-", gmax, dr);
    ck_assert_msg(dl < 1e-6 && dg < 1e-6 && dr < 1e-6, "one expert differs from the dense "
                  "llama: loss %g, grads %g at %s, router %g", dl, dg, worst, dr);
    ck_assert_msg(gmax > 1e-4, "the dense gradients are all ~0: the comparison shows nothing");
    loom_gpt_destroy(d);
    loom_gpt_destroy(m);
}
END_TEST

/* 16-bit weights (loom_gpt_set_precision with fp32 activations): every MoE block reads the
 * 16-bit copy, widened (router and experts alike), so the loss and every gradient are
 * bitwise those of an fp32 model whose weights are that copy (the master rounded); a block
 * reading the master instead differs. Both families, bf16 and f16. */
static loom_gpt *small_moe(int llama_family)
{
    if (!be_open)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
    be_open = 1;
    loom_gpt_config c = {.vocab = 61, .ctx = 8, .layers = 2, .heads = 4, .dim = 32,
                         .moe = {.experts = 4, .top_k = 2, .every = 1, .capacity_factor = 1,
                                 .aux_loss = 0.01, .z_loss = 0.001}};
    if (llama_family) {
        c.family = LOOM_FAMILY_LLAMA;
        c.kv_heads = 2;
        c.ffn_dim = 48;
    }
    loom_gpt *m = NULL;
    ck_assert_msg(loom_gpt_create(&c, &be, 2, 9, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    return m;
}

START_TEST(test_w16_reads_the_copy)
{
    const loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int fam = 0; fam < 2; fam++)
        for (int d = 0; d < 2; d++) {
            loom_gpt *m = small_moe(fam), *ref = small_moe(fam);
            ck_assert_msg(loom_gpt_set_precision(m, dts[d], LOOM_DTYPE_F32) == LOOM_OK, "%s",
                          loom_last_error());
            size_t np = loom_gpt_params(m)->total;
            be.ops->round_to(loom_gpt_param_data(ref), loom_gpt_param_data(m), np, dts[d]);
            size_t rounded = 0; /* the master is not the copy: the check can tell them apart */
            for (size_t i = 0; i < np; i++)
                rounded += loom_gpt_param_data(ref)[i] != loom_gpt_param_data(m)[i];
            ck_assert_msg(rounded > np / 2, "only %zu of %zu weights changed by rounding",
                          rounded, np);
            int B = 2, T = 8, tok[16], tgt[16];
            for (int i = 0; i < B * T; i++) {
                tok[i] = (i * 17 + 3) % 61;
                tgt[i] = (i * 29 + 5) % 61;
            }
            double lm = 0.0, lr = 0.0;
            loom_gpt *both[2] = {m, ref};
            double *loss[2] = {&lm, &lr};
            for (int q = 0; q < 2; q++) {
                loom_gpt_zero_grad(both[q]);
                ck_assert_int_eq(loom_gpt_forward(both[q], tok, tgt, B, T, 1.0f / (B * T), loss[q]),
                                 LOOM_OK);
                ck_assert_int_eq(loom_gpt_backward(both[q]), LOOM_OK);
            }
            const float *g = loom_gpt_grad_data(m), *gr = loom_gpt_grad_data(ref);
            size_t off = 0, nonzero = 0;
            for (size_t i = 0; i < np; i++) {
                off += g[i] != gr[i];
                nonzero += gr[i] != 0.0f;
            }
            ck_assert_msg(isfinite(lm) && lm == lr && off == 0,
                          "%s %s weights: loss %.9g vs %.9g, %zu of %zu gradients differ from "
                          "the fp32 model on the rounded weights", fam ? "llama" : "gpt",
                          loom_dtype_name(dts[d]), lm, lr, off, np);
            ck_assert_msg(nonzero > np / 2, "only %zu of %zu gradients nonzero", nonzero, np);
            loom_gpt_destroy(m);
            loom_gpt_destroy(ref);
        }
}
END_TEST

/* Recipe validation: each bad key is refused with its name. */
START_TEST(test_config_errors)
{
    loom_gpt_config base = {.vocab = 61, .ctx = 8, .layers = 2, .heads = 2, .dim = 16,
                            .moe = {.experts = 4, .top_k = 2, .every = 1, .capacity_factor = 1}};
    ck_assert_int_eq(loom_gpt_config_check(&base), LOOM_OK);
    struct { loom_moe_config moe; const char *word; } bad[] = {
        {{.experts = 4, .top_k = 5, .every = 1}, "top_k=5"},
        {{.experts = 4, .top_k = 0, .every = 1}, "top_k=0"},
        {{.experts = 4, .top_k = 1, .every = 0}, "every=0"},
        {{.experts = 4, .top_k = 1, .every = 3}, "every=3"},
        {{.experts = 4, .top_k = 1, .every = 1, .capacity_factor = -1}, "capacity_factor"},
        {{.experts = 4, .top_k = 1, .every = 1, .aux_loss = -1}, "aux_loss"},
        {{.experts = 0, .top_k = 1, .every = 1}, "experts=0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_gpt_config c = base;
        c.moe = bad[i].moe;
        ck_assert_int_eq(loom_gpt_config_check(&c), LOOM_ERR_INVALID);
        ck_assert_msg(strstr(loom_last_error(), bad[i].word), "'%s' lacks '%s'",
                      loom_last_error(), bad[i].word);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("moe");
    TCase *tc = tcase_create("moe");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_routing_reference);
    tcase_add_test(tc, test_skewed_and_dropless);
    tcase_add_test(tc, test_router_gradient_fd);
    tcase_add_test(tc, test_fixture_k2);
    tcase_add_test(tc, test_fixture_k1);
    tcase_add_test(tc, test_noisy_keyed);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_llama_one_expert);
    tcase_add_test(tc, test_w16_reads_the_copy);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_set_fork_status(r, CK_NOFORK);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
