/* test_distill.c — the distillation term (core/model/gpt_distill.h).
 *
 *   torch:    loom_kd_rows against PyTorch's T^2 kl_div(log_softmax(zs/T), softmax(zt/T))
 *             and its autograd gradient (tests/fixtures/kd_fixture.h), with padded rows:
 *             the padding's values are ignored and its gradient is 0;
 *   fd:       the gradient against central finite differences of loom_kd_rows itself;
 *   zero:     equal logits give exactly 0 loss and 0 gradient;
 *   model:    through loom_gpt_forward/backward: a teacher equal to the model with T = 1,
 *             alpha = 1 gives loss 0 and every parameter gradient exactly 0; with another
 *             teacher the loss is (1 - alpha) CE + alpha kd, and parameter gradients
 *             match finite differences of that loss;
 *   errors:   a bad temperature or alpha is refused;
 *   cache:    train/kd_cache.h: a written cache gives each token's top k of the teacher's
 *             logits (bitwise, -inf elsewhere; k = V: the whole row) and a finite term;
 *             other vocab, batch shape, tokens, a record past the end, a flipped byte in
 *             a record or the header, a truncated file and a non-cache are refused.
 */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/backend.h"
#include "loom/plugin/backend.h"
#include "base/status.h"
#include "model/gpt.h"
#include "model/gpt_distill.h"
#include "train/kd_cache.h"

#include "../fixtures/kd_fixture.h"

enum { SS = 16, TS = 12 }; /* row strides: the student's padded to 16, the teacher's to 12 */

static void padded(float *zs, float *zt)
{
    for (int r = 0; r < KD_R; r++) {
        for (int j = 0; j < SS; j++)
            zs[r * SS + j] = j < KD_V ? kd_zs[r * KD_V + j] : 1e4f; /* padding: must not count */
        for (int j = 0; j < TS; j++)
            zt[r * TS + j] = j < KD_V ? kd_zt[r * KD_V + j] : -1e4f;
    }
}

START_TEST(test_torch)
{
    float zs[KD_R * SS], zt[KD_R * TS], g[KD_R * SS];
    double loss[KD_R];
    padded(zs, zt);
    loom_kd_rows(zs, SS, zt, TS, KD_R, KD_V, kd_T, 1.0f, loss, g);
    for (int r = 0; r < KD_R; r++) {
        ck_assert_msg(fabs(loss[r] - kd_loss[r]) <= 1e-9 * (1 + fabs(kd_loss[r])),
                      "row %d: kd %.12g, torch %.12g", r, loss[r], kd_loss[r]);
        for (int j = 0; j < SS; j++) {
            double want = j < KD_V ? kd_grad[r * KD_V + j] : 0.0;
            ck_assert_msg(fabs(g[r * SS + j] - want) <= 1e-6, "row %d col %d: grad %.9g, torch %.9g",
                          r, j, g[r * SS + j], want);
        }
    }
}
END_TEST

static double total(const float *zs, const float *zt)
{
    double loss[KD_R], s = 0.0;
    loom_kd_rows(zs, SS, zt, TS, KD_R, KD_V, kd_T, 1.0f, loss, NULL);
    for (int r = 0; r < KD_R; r++)
        s += loss[r];
    return s;
}

START_TEST(test_finite_differences)
{
    float zs[KD_R * SS], zt[KD_R * TS], g[KD_R * SS];
    double loss[KD_R], worst = 0.0;
    padded(zs, zt);
    loom_kd_rows(zs, SS, zt, TS, KD_R, KD_V, kd_T, 1.0f, loss, g);
    for (int r = 0; r < KD_R; r++)
        for (int j = 0; j < KD_V; j++) {
            float *x = &zs[r * SS + j], x0 = *x;
            *x = x0 + 1e-2f;
            float hi = *x;
            double up = total(zs, zt);
            *x = x0 - 1e-2f;
            float lo = *x;
            double down = total(zs, zt);
            *x = x0;
            double fd = (up - down) / ((double)hi - (double)lo), d = fabs(fd - g[r * SS + j]);
            worst = d > worst ? d : worst;
            ck_assert_msg(d < 1e-4, "row %d col %d: grad %.9g, finite differences %.9g", r, j,
                          g[r * SS + j], fd);
        }
    ck_assert(worst > 0.0); /* the comparison compared something */
}
END_TEST

START_TEST(test_equal_logits_zero)
{
    float zs[KD_R * SS], zt[KD_R * TS], g[KD_R * SS];
    double loss[KD_R];
    padded(zs, zt);
    loom_kd_rows(zs, SS, zs, SS, KD_R, KD_V, 1.0f, 1.0f, loss, g);
    for (int r = 0; r < KD_R; r++) {
        ck_assert_msg(loss[r] == 0.0, "row %d: kd %.17g with equal logits", r, loss[r]);
        for (int j = 0; j < SS; j++)
            ck_assert_msg(g[r * SS + j] == 0.0f, "row %d col %d: grad %g", r, j, g[r * SS + j]);
    }
    (void)zt;
}
END_TEST

/* --- through the model ---------------------------------------------------------------- */

enum { B_ = 2, T_ = 8, V_ = 61 };
static loom_backend be;

static loom_gpt *make(void)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 1, &be) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_config c = {.vocab = V_, .ctx = 16, .layers = 2, .heads = 2, .dim = 16};
    loom_gpt_parallel par = {NULL, NULL, 0, NULL, 0, 0, 0, NULL};
    loom_gpt *m;
    ck_assert_msg(loom_gpt_create(&c, &be, B_, 7, &par, &m) == LOOM_OK, "%s", loom_last_error());
    return m;
}

static void batch(int *tok, int *tgt)
{
    unsigned s = 99u;
    for (int i = 0; i < B_ * T_; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int)((s >> 8) % V_);
        tgt[i] = (int)((s >> 16) % V_);
    }
}

static double fwd(loom_gpt *m, float dloss)
{
    int tok[B_ * T_], tgt[B_ * T_];
    double loss = 0.0;
    batch(tok, tgt);
    ck_assert_msg(loom_gpt_forward(m, tok, tgt, B_, T_, dloss, &loss) == LOOM_OK, "%s",
                  loom_last_error());
    return loss;
}

START_TEST(test_model_teacher_is_student)
{
    loom_gpt *m = make();
    size_t Vp = (size_t)loom_gpt_get_config(m)->vocab_padded, R = B_ * T_;
    fwd(m, 0.0f); /* the raw logits: this model is its own teacher */
    float *zt = malloc(R * Vp * sizeof(float));
    memcpy(zt, loom_gpt_logits(m), R * Vp * sizeof(float));
    ck_assert_msg(loom_gpt_set_distill(m, zt, Vp, 1.0f, 1.0f) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_zero_grad(m);
    double loss = fwd(m, 1.0f / R);
    ck_assert_msg(loss == 0.0, "T = 1, alpha = 1, teacher = student: loss %.17g", loss);
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    const float *g = loom_gpt_grad_data(m);
    for (size_t i = 0; i < loom_gpt_params(m)->total; i++)
        ck_assert_msg(g[i] == 0.0f, "gradient %zu is %g", i, g[i]);
    free(zt);
    loom_gpt_destroy(m);
}
END_TEST

START_TEST(test_model_blend_and_gradient)
{
    loom_gpt *m = make();
    size_t Vp = (size_t)loom_gpt_get_config(m)->vocab_padded, R = B_ * T_;
    float dloss = 1.0f / R, alpha = 0.3f, T = 2.0f;
    double ce = fwd(m, 0.0f);
    float *zs = malloc(R * Vp * sizeof(float)), *zt = malloc(R * Vp * sizeof(float));
    memcpy(zs, loom_gpt_logits(m), R * Vp * sizeof(float));
    unsigned s = 5u;
    for (size_t i = 0; i < R * Vp; i++) { /* another teacher: random logits */
        s = s * 1664525u + 1013904223u;
        zt[i] = (float)((s >> 8) % 2001u) / 250.0f - 4.0f;
    }
    double kd[B_ * T_], kd_sum = 0.0;
    loom_kd_rows(zs, Vp, zt, Vp, R, V_, T, 1.0f, kd, NULL);
    for (size_t r = 0; r < R; r++)
        kd_sum += kd[r];
    ck_assert_msg(loom_gpt_set_distill(m, zt, Vp, T, alpha) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_zero_grad(m);
    double loss = fwd(m, dloss), want = (1 - alpha) * ce + alpha * kd_sum;
    ck_assert_msg(fabs(loss - want) <= 1e-5 * fabs(want), "loss %.9g, (1-a) CE + a kd %.9g", loss, want);
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    size_t n = loom_gpt_params(m)->total;
    float *g = malloc(n * sizeof(float)), *p = loom_gpt_param_data(m);
    memcpy(g, loom_gpt_grad_data(m), n * sizeof(float));
    const loom_param_table *t = loom_gpt_params(m);
    for (int e = 0; e < t->count; e += 3) { /* a parameter of every third tensor */
        size_t i = t->entries[e].offset + t->entries[e].numel / 2;
        float x0 = p[i];
        p[i] = x0 + 1e-2f;
        float hi = p[i];
        double up = fwd(m, dloss);
        p[i] = x0 - 1e-2f;
        float lo = p[i];
        double down = fwd(m, dloss);
        p[i] = x0;
        double fd = dloss * (up - down) / ((double)hi - (double)lo);
        ck_assert_msg(fabs(fd - g[i]) <= 2e-3 * fabs(fd) + 2e-5, "%s[%zu]: grad %.9g, finite "
                      "differences %.9g", t->entries[e].name, i - t->entries[e].offset, g[i], fd);
    }
    free(g);
    free(zs);
    free(zt);
    loom_gpt_destroy(m);
}
END_TEST

START_TEST(test_errors)
{
    loom_gpt *m = make();
    float zt[64];
    ck_assert_int_eq(loom_gpt_set_distill(m, zt, 64, 0.0f, 0.5f), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "temperature=0 must be > 0"));
    ck_assert_int_eq(loom_gpt_set_distill(m, zt, 64, 1.0f, 1.5f), LOOM_ERR_INVALID);
    ck_assert_int_eq(loom_gpt_set_distill(m, zt, 8, 1.0f, 0.5f), LOOM_ERR_INVALID);
    loom_gpt_destroy(m);
}
END_TEST

/* --- the distill-cache file ----------------------------------------------------------- */

typedef struct { int n; } counter;

static loom_status counted_batch(void *ctx, int *tok, int *tgt, int B, int T)
{
    unsigned s = 1000u + (unsigned)((counter *)ctx)->n++;
    for (int i = 0; i < B * T; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int)((s >> 8) % V_);
        tgt[i] = (int)((s >> 16) % V_);
    }
    return LOOM_OK;
}

static void expect_refused(loom_status st, const char *want)
{
    ck_assert_msg(st != LOOM_OK, "accepted; want a refusal naming \"%s\"", want);
    ck_assert_msg(strstr(loom_last_error(), want), "refusal \"%s\" does not name \"%s\"",
                  loom_last_error(), want);
}

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* Write a cache of 3 micro-batches with top k, read every one back against the teacher. */
static void check_cache(loom_gpt *m, const char *path, int k)
{
    loom_kd_cache_shape sh = {V_, k, B_, T_, 3, "counted batches", "test model"};
    counter ctr = {0};
    ck_assert_msg(loom_kd_cache_write(path, &sh, m, counted_batch, &ctr) == LOOM_OK, "%s",
                  loom_last_error());
    loom_kd_cache *c;
    ck_assert_msg(loom_kd_cache_open(path, V_, B_, T_, &c) == LOOM_OK, "%s", loom_last_error());
    size_t Vp = (size_t)loom_gpt_get_config(m)->vocab_padded, R = B_ * T_;
    ctr.n = 0;
    for (int g = 0; g < 3; g++) {
        int tok[B_ * T_], tgt[B_ * T_];
        counted_batch(&ctr, tok, tgt, B_, T_);
        ck_assert(loom_gpt_forward(m, tok, NULL, B_, T_, 0.0f, NULL) == LOOM_OK);
        const float *z = loom_gpt_logits(m), *rows;
        ck_assert_msg(loom_kd_cache_rows(c, g, tok, &rows) == LOOM_OK, "%s", loom_last_error());
        for (size_t r = 0; r < R; r++) {
            const float *want = z + r * Vp, *got = rows + r * V_;
            float least_kept = INFINITY, most_dropped = -INFINITY;
            int kept = 0;
            for (int j = 0; j < V_; j++) {
                if (got[j] == -INFINITY) {
                    most_dropped = fmaxf(most_dropped, want[j]);
                    continue;
                }
                ck_assert_msg(memcmp(&got[j], &want[j], sizeof(float)) == 0, "micro-batch %d "
                              "token %zu column %d: %a, the teacher's %a", g, r, j, got[j], want[j]);
                least_kept = fminf(least_kept, got[j]);
                kept++;
            }
            ck_assert_msg(kept == k && least_kept >= most_dropped, "token %zu: %d kept (want %d), "
                          "least kept %g < most dropped %g", r, kept, k, least_kept, most_dropped);
        }
        double kd[B_ * T_];
        float *grad = malloc(R * Vp * sizeof(float)); /* the student's stride */
        loom_kd_rows(z, Vp, rows, V_, R, V_, 2.0f, 1.0f, kd, grad);
        for (size_t r = 0; r < R; r++)
            ck_assert_msg(isfinite(kd[r]) && kd[r] >= 0.0 && isfinite(grad[r * Vp]),
                          "token %zu: kd against the cached row %g", r, kd[r]);
        free(grad);
    }
    loom_kd_cache_close(c);
}

START_TEST(test_cache)
{
    loom_gpt *m = make();
    char path[] = "/tmp/loom_kd_cache_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    check_cache(m, path, V_); /* the whole row */
    check_cache(m, path, 5);
    loom_kd_cache *c = NULL;
    expect_refused(loom_kd_cache_open(path, V_ + 1, B_, T_, &c), "holds logits over vocab=61");
    expect_refused(loom_kd_cache_open(path, V_, B_, T_ - 1, &c), "batch.seq=8; this run has");
    ck_assert(loom_kd_cache_open(path, V_, B_, T_, &c) == LOOM_OK);
    int tok[B_ * T_], tgt[B_ * T_];
    counter ctr = {0};
    counted_batch(&ctr, tok, tgt, B_, T_); /* micro-batch 0's tokens */
    const float *rows;
    expect_refused(loom_kd_cache_rows(c, 3, tok, &rows), "holds 3 micro-batches");
    expect_refused(loom_kd_cache_rows(c, 1, tok, &rows), "tokens differ");
    loom_kd_cache_close(c);
    long rec = 16 + 8L * B_ * T_ * 5;
    flip_byte(path, LOOM_KD_HEADER_BYTES + rec + 40); /* inside micro-batch 1's logits */
    ck_assert(loom_kd_cache_open(path, V_, B_, T_, &c) == LOOM_OK);
    ck_assert_msg(loom_kd_cache_rows(c, 0, tok, &rows) == LOOM_OK, "%s", loom_last_error());
    counted_batch(&ctr, tok, tgt, B_, T_);
    expect_refused(loom_kd_cache_rows(c, 1, tok, &rows), "micro-batch 1's checksum does not match");
    loom_kd_cache_close(c);
    flip_byte(path, 20); /* the header's k */
    expect_refused(loom_kd_cache_open(path, V_, B_, T_, &c), "header's checksum does not match");
    flip_byte(path, 20);
    ck_assert_int_eq(truncate(path, LOOM_KD_HEADER_BYTES + 3 * rec - 1), 0);
    expect_refused(loom_kd_cache_open(path, V_, B_, T_, &c), "truncated or corrupt");
    FILE *f = fopen(path, "wb");
    fputs("not a cache, but longer than a header", f);
    for (int i = 0; i < 600; i++)
        fputc('x', f);
    fclose(f);
    expect_refused(loom_kd_cache_open(path, V_, B_, T_, &c), "not a distill-cache file");
    unlink(path);
    expect_refused(loom_kd_cache_open(path, V_, B_, T_, &c), "cannot open");
    ck_assert_ptr_null(c);
    loom_gpt_destroy(m);
}
END_TEST

/* --- the attention-probability term (loom_kd_attention_rows, attention_backward_datt) --- */

enum { AB = 2, AT = 5, AC = 8, AH = 2 };

static void attn_qkv(float *qkv, unsigned seed)
{
    for (int i = 0; i < AB * AT * 3 * AC; i++) {
        seed = seed * 1103515245u + 12345u;
        qkv[i] = ((float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f) * 2.0f;
    }
}

/* L = sum(out * dout) + the term, in double where the test computes it */
static double attn_loss(const float *qkv, const float *pt, const float *dout, float gamma)
{
    static float out[AB * AT * AC], att[AB * AH * AT * AT];
    be.ops->attention_forward(out, att, qkv, AB, AT, AC, AH);
    double L = 0.0, rows[AB * AT] = {0};
    for (int i = 0; i < AB * AT * AC; i++)
        L += (double)out[i] * dout[i];
    loom_kd_attention_rows(att, pt, AB, AH, AT, gamma, 1.0f, rows, NULL);
    for (int r = 0; r < AB * AT; r++)
        L += rows[r];
    return L;
}

START_TEST(test_attention_term)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 1, &be) == LOOM_OK, "%s", loom_last_error());
    ck_assert(be.ops->size > offsetof(loom_backend_ops, attention_backward_datt));
    ck_assert_ptr_nonnull(be.ops->attention_backward_datt);
    enum { N = AB * AT * 3 * AC, P = AB * AH * AT * AT };
    static float qkv[N], qt[N], out[AB * AT * AC], ps[P], pt[P], dout[AB * AT * AC], dp[P];
    static float g0[N], g1[N], scratch[2 * P];
    attn_qkv(qkv, 1u);
    attn_qkv(qt, 2u);
    attn_qkv(dout, 3u); /* only its first B*T*C values */
    be.ops->attention_forward(out, ps, qkv, AB, AT, AC, AH);
    be.ops->attention_forward(out, pt, qt, AB, AT, AC, AH);
    const float gamma = 0.7f;
    /* the term against the test's own softmax of q k^T / sqrt(hs), in double */
    double rows[AB * AT] = {0};
    loom_kd_attention_rows(ps, pt, AB, AH, AT, gamma, 1.0f, rows, dp);
    const int hs = AC / AH;
    for (int b = 0; b < AB; b++)
        for (int t = 0; t < AT; t++) {
            double ref = 0.0;
            for (int h = 0; h < AH; h++) {
                double es[AT], et[AT], ss = 0, st = 0;
                for (int j = 0; j <= t; j++) {
                    double ds = 0, dt = 0;
                    for (int c = 0; c < hs; c++) {
                        size_t qi = ((size_t)b * AT + t) * 3 * AC + h * hs + c;
                        size_t ki = ((size_t)b * AT + j) * 3 * AC + AC + h * hs + c;
                        ds += (double)qkv[qi] * qkv[ki];
                        dt += (double)qt[qi] * qt[ki];
                    }
                    es[j] = exp(ds / sqrt(hs));
                    et[j] = exp(dt / sqrt(hs));
                    ss += es[j];
                    st += et[j];
                }
                for (int j = 0; j <= t; j++)
                    ref += (es[j] / ss - et[j] / st) * (es[j] / ss - et[j] / st);
            }
            ref *= gamma / AH; /* the row's gamma * mean over heads of sum over keys */
            ck_assert_msg(ref > 1e-6 || t == 0, "row %d,%d: no signal (%g)", b, t, ref);
            ck_assert_msg(fabs(rows[b * AT + t] - ref) <= 1e-6 * (1 + ref), "row %d,%d: %.9g vs %.9g",
                          b, t, rows[b * AT + t], ref);
        }
    /* gradients w.r.t. q, k, v: the backward with dp against central differences of L */
    be.ops->attention_backward_datt(g1, scratch, dout, qkv, ps, dp, AB, AT, AC, AH);
    const float eps = 4e-3f;
    double worst = 0.0;
    for (int i = 0; i < N; i++) {
        float x = qkv[i];
        qkv[i] = x + eps;
        double lp = attn_loss(qkv, pt, dout, gamma);
        qkv[i] = x - eps;
        double lm = attn_loss(qkv, pt, dout, gamma);
        qkv[i] = x;
        double fd = (lp - lm) / (2.0 * eps), err = fabs(fd - g1[i]) / (1e-2 + fabs(fd));
        worst = err > worst ? err : worst;
        ck_assert_msg(err < 5e-3, "d L / d qkv[%d]: backward %.7g, differences %.7g", i, g1[i], fd);
    }
    printf("attention term: worst gradient relative error %.2e over %d inputs\n", worst, N);
    /* the term's part alone is not nothing: without dp the gradient differs */
    be.ops->attention_backward(g0, scratch, dout, qkv, ps, AB, AT, AC, AH);
    ck_assert(memcmp(g0, g1, sizeof g0) != 0);
    /* teacher = student: exactly 0, dp exactly 0, and the plain backward's bits */
    double zr[AB * AT] = {0};
    loom_kd_attention_rows(ps, ps, AB, AH, AT, gamma, 1.0f, zr, dp);
    for (int r = 0; r < AB * AT; r++)
        ck_assert(zr[r] == 0.0);
    for (int i = 0; i < P; i++)
        ck_assert(dp[i] == 0.0f);
    be.ops->attention_backward_datt(g1, scratch, dout, qkv, ps, dp, AB, AT, AC, AH);
    ck_assert_msg(memcmp(g0, g1, sizeof g0) == 0, "a zero probability gradient changed the bits");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("distill");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_torch);
    tcase_add_test(tc, test_finite_differences);
    tcase_add_test(tc, test_equal_logits_zero);
    tcase_add_test(tc, test_model_teacher_is_student);
    tcase_add_test(tc, test_model_blend_and_gradient);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_cache);
    tcase_add_test(tc, test_attention_term);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (be.ops)
        loom_backend_close(&be);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
