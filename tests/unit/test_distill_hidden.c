/* test_distill_hidden.c — distillation's hidden-state terms (core/model/gpt_distill.h,
 * gpt_distill_hidden.c).
 *
 *   rows:     loom_kd_hidden_rows against a straightforward reference (beta times the mean
 *             of the squared differences over the teacher's columns, per row), and its
 *             gradients with respect to the student's activations and the projection
 *             against central finite differences of the reference;
 *   model:    through loom_gpt_forward/backward with a wider, deeper teacher: the loss is
 *             CE + the reference computed from the student's block outputs and projections,
 *             and parameter gradients (the projections' and the blocks') match finite
 *             differences of that loss; the projections are table entries;
 *   identity: a teacher equal to the student with identity projections: the term is 0,
 *             the loss is CE's bits and the projections' gradients are exactly 0;
 *   errors:   a mapping without a projection, a projection past the last block, a
 *             llama model with projections, a negative weight are refused;
 *   frozen:   a frozen model (loom_gpt_parallel.frozen, a distillation teacher's) gives a
 *             trainable one's bits after a forward: the logits, the outputs of the blocks
 *             in keep_outputs and the probabilities of those kept by
 *             loom_gpt_keep_block_attention (blocks on both sides of them unkept, so the
 *             shared buffers take turns), with no gradient buffer, backward refused, other
 *             blocks' outputs NULL, fewer activation bytes, and loom_gpt_footprint's;
 *             a frozen model with a split backward refused.
 *   frozen_short: the same frozen model built for the run's T_ = 8 of its ctx 16
 *             (loom_gpt_parallel.max_T, as session.c builds a teacher at batch.seq) gives
 *             the ctx-sized one's bits (logits, kept output and probabilities) in fewer
 *             activation bytes, loom_gpt_footprint's; a forward over T_ + 1 tokens and a
 *             max_T above ctx are refused.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/backend.h"
#include "base/status.h"
#include "model/gpt.h"
#include "model/gpt_distill.h"

/* beta/Ct sum_i ((w h_r)_i - t_r,i)^2 over the rows, in double */
static double reference(const float *hs, const float *ht, const float *w, size_t R, int C, int Ct,
                        double beta)
{
    double sum = 0.0;
    for (size_t r = 0; r < R; r++)
        for (int i = 0; i < Ct; i++) {
            double y = 0.0;
            for (int j = 0; j < C; j++)
                y += (double)w[i * C + j] * hs[r * C + j];
            double d = y - ht[r * Ct + i];
            sum += beta / Ct * d * d;
        }
    return sum;
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) % 2001u) / 1000.0f - 1.0f;
    }
}

enum { RR = 5, CS = 6, CT = 4 };

START_TEST(test_rows)
{
    float hs[RR * CS], ht[RR * CT], w[CT * CS], y[RR * CT], dh[RR * CS], dw[CT * CS] = {0};
    double loss[RR] = {0}, beta = (double)0.7f, sum = 0.0;
    fill(hs, RR * CS, 1);
    fill(ht, RR * CT, 2);
    fill(w, CT * CS, 3);
    loom_kd_hidden_rows(hs, ht, w, RR, CS, CT, (float)beta, 1.0f, loss, y, dh, dw);
    for (int r = 0; r < RR; r++)
        sum += loss[r];
    double want = reference(hs, ht, w, RR, CS, CT, beta);
    ck_assert_msg(fabs(sum - want) <= 1e-12 * want, "term %.15g, reference %.15g", sum, want);
    float *x[2] = {hs, w};
    float *g[2] = {dh, dw};
    int n[2] = {RR * CS, CT * CS};
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < n[v]; i++) {
            float x0 = x[v][i], h = 1e-2f;
            x[v][i] = x0 + h;
            double up = reference(hs, ht, w, RR, CS, CT, beta);
            x[v][i] = x0 - h;
            double down = reference(hs, ht, w, RR, CS, CT, beta);
            x[v][i] = x0;
            double fd = (up - down) / (2.0 * h); /* quadratic: exact up to rounding */
            ck_assert_msg(fabs(fd - g[v][i]) <= 1e-4 * fabs(fd) + 1e-6, "%s[%d]: grad %.9g, "
                          "finite differences %.9g", v ? "w" : "hs", i, g[v][i], fd);
        }
}
END_TEST

/* --- through the model ---------------------------------------------------------------- */

enum { B_ = 2, T_ = 8, V_ = 61, L_ = 2 };
static loom_backend be;

static loom_gpt *make(int layers, int dim, int proj_dim, unsigned long long proj_layers)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 1, &be) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_config c = {.vocab = V_, .ctx = 16, .layers = layers, .heads = 2, .dim = dim,
                         .kd_proj_dim = proj_dim, .kd_proj_layers = proj_layers};
    loom_gpt_parallel par = {0};
    loom_gpt *m;
    ck_assert_msg(loom_gpt_create(&c, &be, B_, 7, &par, &m) == LOOM_OK, "%s", loom_last_error());
    return m;
}

static double fwd(loom_gpt *m, float dloss)
{
    int tok[B_ * T_], tgt[B_ * T_];
    unsigned s = 99u;
    for (int i = 0; i < B_ * T_; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int)((s >> 8) % V_);
        tgt[i] = (int)((s >> 16) % V_);
    }
    double loss = 0.0;
    ck_assert_msg(loom_gpt_forward(m, tok, tgt, B_, T_, dloss, &loss) == LOOM_OK, "%s",
                  loom_last_error());
    return loss;
}

static float *proj(loom_gpt *m, int l, float **grad)
{
    char name[64];
    snprintf(name, sizeof name, "distill.proj.%d.weight", l);
    const loom_param_entry *e = loom_params_find(loom_gpt_params(m), name);
    ck_assert_msg(e != NULL, "no table entry %s", name);
    if (grad)
        *grad = loom_gpt_grad_data(m) + e->offset;
    return loom_gpt_param_data(m) + e->offset;
}

START_TEST(test_model)
{
    enum { C = 16, CT_ = 24 };
    size_t R = B_ * T_;
    loom_gpt *m = make(L_, C, CT_, 3ull), *teacher = make(3, CT_, 0, 0);
    fwd(teacher, 0.0f); /* the teacher's block outputs: blocks 2 and 0 for student 0 and 1 */
    float *th = malloc(2 * R * CT_ * sizeof(float));
    memcpy(th, loom_gpt_block_output(teacher, 2), R * CT_ * sizeof(float));
    memcpy(th + R * CT_, loom_gpt_block_output(teacher, 0), R * CT_ * sizeof(float));
    float *noise = malloc(2 * R * CT_ * sizeof(float));
    fill(noise, 2 * R * CT_, 4); /* a term that is not small beside CE */
    for (size_t i = 0; i < 2 * R * CT_; i++)
        th[i] += noise[i];
    free(noise);
    for (int l = 0; l < L_; l++)
        fill(proj(m, l, NULL), (size_t)CT_ * C, 5u + (unsigned)l);
    const float *map[L_] = {th, th + R * CT_};
    float beta = 0.8f, dloss = 1.0f / (float)R;
    double ce = fwd(m, 0.0f), want = ce;
    for (int l = 0; l < L_; l++)
        want += reference(loom_gpt_block_output(m, l), map[l], proj(m, l, NULL), R, C, CT_, beta);
    ck_assert_msg(loom_gpt_set_distill_hidden(m, map, beta) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_zero_grad(m);
    double loss = fwd(m, dloss);
    ck_assert_msg(fabs(loss - want) <= 1e-6 * want && loss > ce + 0.1, "loss %.9g, CE + "
                  "reference %.9g (CE %.9g)", loss, want, ce);
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    size_t n = loom_gpt_params(m)->total;
    float *g = malloc(n * sizeof(float)), *p = loom_gpt_param_data(m);
    memcpy(g, loom_gpt_grad_data(m), n * sizeof(float));
    const loom_param_table *t = loom_gpt_params(m);
    for (int e = 0; e < t->count; e++) {
        if (e % 3 && strncmp(t->entries[e].name, "distill.", 8))
            continue; /* every third tensor and every projection */
        for (size_t at = 1; at <= 3; at++) {
            size_t i = t->entries[e].offset + t->entries[e].numel * at / 4;
            float x0 = p[i];
            p[i] = x0 + 1e-2f;
            float hi = p[i];
            double up = fwd(m, dloss);
            p[i] = x0 - 1e-2f;
            float lo = p[i];
            double down = fwd(m, dloss);
            p[i] = x0;
            double fd = dloss * (up - down) / ((double)hi - (double)lo);
            ck_assert_msg(fabs(fd - g[i]) <= 2e-3 * fabs(fd) + 2e-5, "%s[%zu]: grad %.9g, "
                          "finite differences %.9g", t->entries[e].name,
                          i - t->entries[e].offset, g[i], fd);
        }
    }
    free(g);
    free(th);
    loom_gpt_destroy(teacher);
    loom_gpt_destroy(m);
}
END_TEST

START_TEST(test_identity)
{
    enum { C = 16 };
    size_t R = B_ * T_;
    loom_gpt *m = make(L_, C, C, 3ull);
    for (int l = 0; l < L_; l++) {
        float *w = proj(m, l, NULL);
        for (int i = 0; i < C * C; i++)
            w[i] = i / C == i % C ? 1.0f : 0.0f;
    }
    double ce = fwd(m, 0.0f); /* this model is its own teacher */
    float *th = malloc(L_ * R * C * sizeof(float));
    const float *map[L_];
    for (int l = 0; l < L_; l++) {
        memcpy(th + l * R * C, loom_gpt_block_output(m, l), R * C * sizeof(float));
        map[l] = th + l * R * C;
    }
    ck_assert_msg(loom_gpt_set_distill_hidden(m, map, 1.0f) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_zero_grad(m);
    double loss = fwd(m, 1.0f / (float)R);
    ck_assert_msg(loss == ce, "teacher = student, identity projections: loss %.17g, CE %.17g",
                  loss, ce);
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    for (int l = 0; l < L_; l++) {
        float *g;
        proj(m, l, &g);
        for (int i = 0; i < C * C; i++)
            ck_assert_msg(g[i] == 0.0f, "distill.proj.%d gradient %d is %g", l, i, g[i]);
    }
    free(th);
    loom_gpt_destroy(m);
}
END_TEST

/* --- the attention-probability term (gpt_distill_attn.c) -------------------------------- */

/* gamma/NH sum over rows, heads and keys of (ps - pt)^2, in double */
static double attn_reference(const float *ps, const float *pt, int NH, double gamma)
{
    double sum = 0.0;
    for (size_t i = 0; i < (size_t)B_ * NH * T_ * T_; i++) {
        double d = (double)ps[i] - pt[i];
        sum += gamma / NH * d * d;
    }
    return sum;
}

/* loss and parameter gradients (every third tensor) against finite differences, with a
 * wider, deeper teacher of the same head count: student blocks 0 and 1 against its 2, 0 */
START_TEST(test_attention_model)
{
    enum { C = 16, CT_ = 24, NH = 2 };
    size_t A = (size_t)B_ * NH * T_ * T_;
    loom_gpt *m = make(L_, C, 0, 0), *teacher = make(3, CT_, 0, 0);
    fwd(teacher, 0.0f);
    ck_assert_msg(loom_gpt_block_attention(teacher, 2) && loom_gpt_block_attention(teacher, 0),
                  "the teacher's probabilities are not held");
    /* a tiny random model's probabilities are near uniform, its teacher's too: random
     * causal rows instead, so that the term is not small beside CE */
    float *pt = malloc(2 * A * sizeof(float));
    fill(pt, 2 * A, 6);
    for (size_t row = 0; row < 2 * A / T_; row++) {
        float *r = pt + row * T_;
        int t = (int)(row % T_);
        double sum = 0.0;
        for (int j = 0; j < T_; j++) {
            r[j] = j <= t ? r[j] * r[j] * r[j] * r[j] : 0.0f;
            sum += r[j];
        }
        for (int j = 0; j <= t; j++)
            r[j] = (float)(r[j] / sum);
    }
    const float *map[L_] = {pt, pt + A};
    float gamma = 3.0f, dloss = 1.0f / (float)(B_ * T_);
    double ce = fwd(m, 0.0f), term = 0.0;
    for (int l = 0; l < L_; l++)
        term += attn_reference(loom_gpt_block_attention(m, l), map[l], NH, gamma);
    ck_assert_msg(loom_gpt_set_distill_attention(m, map, gamma) == LOOM_OK, "%s",
                  loom_last_error());
    loom_gpt_zero_grad(m);
    double loss = fwd(m, dloss);
    ck_assert_msg(fabs(loss - ce - term) <= 1e-5 * term && term > 1.0, "loss %.9g - CE %.9g, "
                  "reference term %.9g", loss, ce, term);
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    size_t n = loom_gpt_params(m)->total;
    float *g = malloc(n * sizeof(float)), *p = loom_gpt_param_data(m);
    memcpy(g, loom_gpt_grad_data(m), n * sizeof(float));
    const loom_param_table *t = loom_gpt_params(m);
    double worst = 0.0;
    for (int e = 0; e < t->count; e++) {
        if (e % 3 && !strstr(t->entries[e].name, "attn.c_attn"))
            continue; /* every third tensor and every qkv weight */
        for (size_t at = 1; at <= 3; at++) {
            size_t i = t->entries[e].offset + t->entries[e].numel * at / 4;
            float x0 = p[i];
            p[i] = x0 + 1e-2f;
            float hi = p[i];
            double up = fwd(m, dloss);
            p[i] = x0 - 1e-2f;
            float lo = p[i];
            double down = fwd(m, dloss);
            p[i] = x0;
            double fd = dloss * (up - down) / ((double)hi - (double)lo);
            double err = fabs(fd - g[i]) / (fabs(fd) + 1e-2);
            worst = err > worst ? err : worst;
            ck_assert_msg(fabs(fd - g[i]) <= 2e-3 * fabs(fd) + 2e-5, "%s[%zu]: grad %.9g, "
                          "finite differences %.9g", t->entries[e].name,
                          i - t->entries[e].offset, g[i], fd);
        }
    }
    printf("attention term: loss %.6f (CE %.6f), worst gradient error %.2e\n", loss, ce, worst);
    free(g);
    free(pt);
    loom_gpt_destroy(teacher);
    loom_gpt_destroy(m);
}
END_TEST

/* a teacher equal to the student: the term is 0, the loss and every gradient CE's bits */
START_TEST(test_attention_identity)
{
    enum { C = 16, NH = 2 };
    size_t A = (size_t)B_ * NH * T_ * T_, R = B_ * T_;
    loom_gpt *m = make(L_, C, 0, 0);
    float dloss = 1.0f / (float)R;
    loom_gpt_zero_grad(m);
    double ce = fwd(m, dloss);
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    size_t n = loom_gpt_params(m)->total;
    float *g = malloc(n * sizeof(float)), *th = malloc(L_ * A * sizeof(float));
    memcpy(g, loom_gpt_grad_data(m), n * sizeof(float));
    const float *map[L_];
    for (int l = 0; l < L_; l++) {
        memcpy(th + l * A, loom_gpt_block_attention(m, l), A * sizeof(float));
        map[l] = th + l * A;
    }
    ck_assert_msg(loom_gpt_set_distill_attention(m, map, 2.0f) == LOOM_OK, "%s",
                  loom_last_error());
    loom_gpt_zero_grad(m);
    double loss = fwd(m, dloss);
    ck_assert_msg(loss == ce, "teacher = student: loss %.17g, CE %.17g", loss, ce);
    ck_assert_msg(loom_gpt_backward(m) == LOOM_OK, "%s", loom_last_error());
    ck_assert_msg(!memcmp(g, loom_gpt_grad_data(m), n * sizeof(float)),
                  "teacher = student: the gradients differ from CE's");
    th[3 * T_ + 1] += 0.25f; /* a teacher that differs: the check can fail */
    loom_gpt_zero_grad(m);
    ck_assert_msg(fwd(m, dloss) > ce, "a different teacher adds nothing");
    free(th);
    free(g);
    ck_assert_int_eq(loom_gpt_set_distill_attention(m, map, -1.0f), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "teacher.attention=-1"));
    const float *none[L_] = {NULL, NULL};
    ck_assert_int_eq(loom_gpt_set_distill_attention(m, none, 1.0f), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "no student block is mapped"));
    loom_gpt_destroy(m);
}
END_TEST

START_TEST(test_errors)
{
    loom_gpt *m = make(L_, 16, 24, 1ull); /* block 0 only */
    float h[4];
    const float *map[L_] = {h, h};
    ck_assert_int_eq(loom_gpt_set_distill_hidden(m, map, 1.0f), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "student block 1 has a teacher block but no "
                                 "projection"));
    map[1] = NULL;
    ck_assert_int_eq(loom_gpt_set_distill_hidden(m, map, -1.0f), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "teacher.hidden=-1"));
    loom_gpt_destroy(m);
    loom_gpt_config c = {.vocab = V_, .ctx = 16, .layers = L_, .heads = 2, .dim = 16,
                         .kd_proj_dim = 24, .kd_proj_layers = 4ull}; /* block 2 of 2 */
    ck_assert_int_eq(loom_gpt_config_check(&c), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "student blocks in [0, 2)"));
    c.kd_proj_layers = 1ull;
    c.family = LOOM_FAMILY_LLAMA; /* the projections are built for the GPT-2 table */
    ck_assert_int_eq(loom_gpt_config_check(&c), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "need a GPT-2 model"));
}
END_TEST

START_TEST(test_frozen)
{
    enum { L = 4, C = 16 };
    size_t R = B_ * T_;
    loom_gpt *m = make(L, C, 0, 0), *f;
    loom_gpt_config c = *loom_gpt_get_config(m);
    unsigned char keep[L] = {0, 1, 0, 0}; /* block 1; 0, 2 and 3 share the two outputs */
    loom_gpt_parallel par = {0};
    par.frozen = 1;
    par.keep_outputs = keep;
    ck_assert_msg(loom_gpt_create(&c, &be, B_, 7, &par, &f) == LOOM_OK, "%s", loom_last_error());
    ck_assert_int_eq(loom_gpt_keep_block_attention(f, 1), LOOM_OK);
    ck_assert_int_eq(loom_gpt_keep_block_attention(m, 1), LOOM_OK);
    ck_assert_ptr_null(loom_gpt_grad_data(f));
    ck_assert_ptr_null(loom_gpt_block_output(f, 0));
    ck_assert_ptr_null(loom_gpt_block_output(f, 2));
    ck_assert_ptr_null(loom_gpt_block_attention(f, 2));
    double lm = fwd(m, 0.0f), lf = fwd(f, 0.0f);
    ck_assert_msg(lm == lf, "frozen loss %.17g, trainable %.17g", lf, lm);
    size_t V = (size_t)c.vocab_padded; /* (the created model's config: padded already) */
    ck_assert(memcmp(loom_gpt_logits(m), loom_gpt_logits(f), R * V * sizeof(float)) == 0);
    ck_assert(memcmp(loom_gpt_block_output(m, 1), loom_gpt_block_output(f, 1),
                     R * C * sizeof(float)) == 0);
    ck_assert(memcmp(loom_gpt_block_attention(m, 1), loom_gpt_block_attention(f, 1),
                     (size_t)B_ * 2 * T_ * T_ * sizeof(float)) == 0);
    ck_assert_int_eq(loom_gpt_backward(f), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "frozen"));
    ck_assert_uint_lt(loom_gpt_activation_bytes(f), loom_gpt_activation_bytes(m));
    loom_gpt_footprint_bytes fp;
    ck_assert_int_eq(loom_gpt_footprint(&c, B_, &par, 1, 0, LOOM_DTYPE_F32, LOOM_DTYPE_F32, NULL,
                                        (const unsigned char[L]){0, 1, 0, 0}, &fp), LOOM_OK);
    ck_assert_uint_eq(fp.activations, loom_gpt_activation_bytes(f));
    /* the unkept blocks' outputs take two buffers, however many blocks: keeping block 1
     * adds one block output (max_B x ctx x C floats) to them */
    loom_gpt_footprint_bytes none;
    par.keep_outputs = NULL;
    ck_assert_int_eq(loom_gpt_footprint(&c, B_, &par, 1, 0, LOOM_DTYPE_F32, LOOM_DTYPE_F32, NULL,
                                        (const unsigned char[L]){0, 1, 0, 0}, &none), LOOM_OK);
    ck_assert_uint_eq(fp.activations - none.activations, (size_t)B_ * c.ctx * C * sizeof(float));
    par.keep_outputs = keep;
    loom_gpt_zero_grad(f); /* no buffer: nothing to zero */
    loom_gpt_destroy(f);
    loom_gpt_destroy(m);
    par.split_backward = 1; /* a backward's layout: refused */
    ck_assert_int_eq(loom_gpt_create(&c, &be, B_, 7, &par, &f), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "frozen"));
}
END_TEST

START_TEST(test_frozen_short)
{
    enum { L = 4, C = 16 };
    size_t R = B_ * T_;
    loom_gpt *m = make(L, C, 0, 0), *f, *s;
    loom_gpt_config c = *loom_gpt_get_config(m);
    loom_gpt_destroy(m);
    unsigned char keep[L] = {0, 1, 0, 0};
    loom_gpt_parallel par = {0};
    par.frozen = 1;
    par.keep_outputs = keep;
    ck_assert_msg(loom_gpt_create(&c, &be, B_, 7, &par, &f) == LOOM_OK, "%s", loom_last_error());
    par.max_T = T_;
    ck_assert_msg(loom_gpt_create(&c, &be, B_, 7, &par, &s) == LOOM_OK, "%s", loom_last_error());
    ck_assert_int_eq(loom_gpt_max_seq(s), T_);
    ck_assert_int_eq(loom_gpt_max_seq(f), c.ctx);
    ck_assert_int_eq(loom_gpt_keep_block_attention(f, 1), LOOM_OK);
    ck_assert_int_eq(loom_gpt_keep_block_attention(s, 1), LOOM_OK);
    double lf = fwd(f, 0.0f), ls = fwd(s, 0.0f);
    ck_assert_msg(lf == ls, "max_T=%d loss %.17g, ctx-sized %.17g", T_, ls, lf);
    size_t V = (size_t)c.vocab_padded;
    ck_assert(memcmp(loom_gpt_logits(f), loom_gpt_logits(s), R * V * sizeof(float)) == 0);
    ck_assert(memcmp(loom_gpt_block_output(f, 1), loom_gpt_block_output(s, 1),
                     R * C * sizeof(float)) == 0);
    ck_assert(memcmp(loom_gpt_block_attention(f, 1), loom_gpt_block_attention(s, 1),
                     (size_t)B_ * 2 * T_ * T_ * sizeof(float)) == 0);
    ck_assert_uint_lt(loom_gpt_activation_bytes(s), loom_gpt_activation_bytes(f));
    loom_gpt_footprint_bytes fp;
    ck_assert_int_eq(loom_gpt_footprint(&c, B_, &par, 1, 0, LOOM_DTYPE_F32, LOOM_DTYPE_F32, NULL,
                                        keep, &fp), LOOM_OK);
    ck_assert_uint_eq(fp.activations, loom_gpt_activation_bytes(s));
    int tok[B_ * (T_ + 1)];
    memset(tok, 0, sizeof tok);
    ck_assert_int_eq(loom_gpt_forward(s, tok, NULL, B_, T_ + 1, 0.0f, NULL), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "built for sequences of at most 8"));
    ck_assert_int_eq(loom_gpt_forward(f, tok, NULL, B_, T_ + 1, 0.0f, NULL), LOOM_OK);
    loom_gpt_destroy(s);
    loom_gpt_destroy(f);
    par.max_T = c.ctx + 1;
    ck_assert_int_eq(loom_gpt_create(&c, &be, B_, 7, &par, &s), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "outside the model's ctx=16"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("distill_hidden");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_rows);
    tcase_add_test(tc, test_model);
    tcase_add_test(tc, test_identity);
    tcase_add_test(tc, test_attention_model);
    tcase_add_test(tc, test_attention_identity);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_frozen);
    tcase_add_test(tc, test_frozen_short);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (be.ops)
        loom_backend_close(&be);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
