/* test_convert.c — fp32 <-> bf16 / fp16 (convert.c): the boundary values by their exact bits
 * (ties to even, subnormals, the largest finite value, overflow to inf, inf, NaN made quiet),
 * then a sweep over fp32 (every 4099th bit pattern, all exponents) checked against the
 * definition of round-to-nearest-even — no neighbour of the result is nearer, and a tie
 * keeps the even one — and the array kernels (F16C on AVX2, the portable loop elsewhere,
 * chunked by OpenMP) against the scalar ones bit for bit. Widening every fp16 and bf16
 * pattern and narrowing it again gives it back (NaNs quiet); widening all 65536 patterns
 * by the scalar (portable) code and by the array kernel (F16C on AVX2 and up) gives the bits
 * of the definition, a signalling fp16 NaN made quiet on both.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Check records every passing ck_assert through a pipe: 2M of them take a minute. */
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond))                                                                       \
            ck_abort_msg(__VA_ARGS__);                                                     \
    } while (0)

static float fb(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

typedef struct edge {
    uint32_t in;
    uint16_t out;
    const char *what;
} edge;

static const edge bf16_edges[] = {
    {0x3f800000u, 0x3f80, "1"},
    {0x3f808000u, 0x3f80, "tie 1+2^-8: to even (down)"},
    {0x3f818000u, 0x3f82, "tie: to even (up)"},
    {0x3f808001u, 0x3f81, "just above a tie: up"},
    {0x3f807fffu, 0x3f80, "just below a tie: down"},
    {0x7f7f0000u, 0x7f7f, "largest finite bf16"},
    {0x7f7f7fffu, 0x7f7f, "just below the tie above it"},
    {0x7f7f8000u, 0x7f80, "tie above the largest finite: inf (even)"},
    {0x7f7fffffu, 0x7f80, "FLT_MAX: inf"},
    {0x7f800000u, 0x7f80, "inf"},
    {0xff800000u, 0xff80, "-inf"},
    {0x7f800001u, 0x7fc0, "signalling NaN: quiet, not inf"},
    {0xffc00000u, 0xffc0, "-NaN"},
    {0x7fffffffu, 0x7fff, "NaN with a full payload"},
    {0x00000001u, 0x0000, "smallest fp32 subnormal: 0"},
    {0x00008000u, 0x0000, "subnormal tie: to even (0)"},
    {0x00018000u, 0x0002, "subnormal tie: to even (up)"},
    {0x00008001u, 0x0001, "smallest bf16 subnormal"},
    {0x007f8000u, 0x0080, "largest subnormals round into the normals"},
    {0x80000000u, 0x8000, "-0"},
};

static const edge f16_edges[] = {
    {0x3f800000u, 0x3c00, "1"},
    {0x3f801000u, 0x3c00, "tie 1+2^-11: to even (down)"},
    {0x3f803000u, 0x3c02, "tie: to even (up)"},
    {0x3f801001u, 0x3c01, "just above a tie"},
    {0x477fe000u, 0x7bff, "65504, the largest finite fp16"},
    {0x477fefffu, 0x7bff, "just below 65520"},
    {0x477ff000u, 0x7c00, "65520: the tie rounds to inf"},
    {0x7f7fffffu, 0x7c00, "FLT_MAX: inf"},
    {0x7f800000u, 0x7c00, "inf"},
    {0xff800000u, 0xfc00, "-inf"},
    {0x7f800001u, 0x7e00, "signalling NaN: quiet, not inf"},
    {0x7fc00000u, 0x7e00, "quiet NaN"},
    {0xffffffffu, 0xffff, "-NaN with a full payload"},
    {0x33800000u, 0x0001, "2^-24, the smallest fp16 subnormal"},
    {0x33000000u, 0x0000, "2^-25: tie to even (0)"},
    {0x33000001u, 0x0001, "just above 2^-25"},
    {0x33c00000u, 0x0002, "1.5 x 2^-24: tie to even (2)"},
    {0x387fc000u, 0x03ff, "the largest fp16 subnormal"},
    {0x387fe000u, 0x0400, "tie between it and 2^-14: to even (the normal)"},
    {0x38800000u, 0x0400, "2^-14, the smallest fp16 normal"},
    {0x38000000u, 0x0200, "2^-15 (a subnormal)"},
    {0x00000001u, 0x0000, "fp32 subnormal: 0"},
    {0x80000001u, 0x8000, "-fp32 subnormal: -0"},
    {0xc77fe000u, 0xfbff, "-65504"},
    {0x80000000u, 0x8000, "-0"},
};

START_TEST(test_edges)
{
    for (size_t i = 0; i < sizeof bf16_edges / sizeof bf16_edges[0]; i++) {
        const edge *e = &bf16_edges[i];
        uint16_t got = loom_cpu_bf16_from_f32(fb(e->in));
        CHECK(got == e->out, "bf16 of 0x%08x (%s): got 0x%04x, want 0x%04x", e->in,
                      e->what, got, e->out);
    }
    for (size_t i = 0; i < sizeof f16_edges / sizeof f16_edges[0]; i++) {
        const edge *e = &f16_edges[i];
        uint16_t got = loom_cpu_f16_from_f32(fb(e->in));
        CHECK(got == e->out, "fp16 of 0x%08x (%s): got 0x%04x, want 0x%04x", e->in,
                      e->what, got, e->out);
    }
    /* widening, exact */
    ck_assert(bf(loom_cpu_f16_to_f32(0x0001)) == 0x33800000u);
    ck_assert(loom_cpu_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(loom_cpu_f16_to_f32(0x03ff) == 1023.0f * 0x1p-24f);
    ck_assert(isinf(loom_cpu_f16_to_f32(0xfc00)) && loom_cpu_f16_to_f32(0xfc00) < 0);
    ck_assert(isnan(loom_cpu_f16_to_f32(0x7e00)) && isnan(loom_cpu_f16_to_f32(0x7c01)));
    ck_assert(bf(loom_cpu_f16_to_f32(0x8000)) == 0x80000000u);
    ck_assert(bf(loom_cpu_bf16_to_f32(0x7f7f)) == 0x7f7f0000u);
    ck_assert(isnan(loom_cpu_bf16_to_f32(0x7fc0)));
}
END_TEST

/* Round-to-nearest-even by definition: widen(h) is no farther from x than either
 * neighbour's value, and when a neighbour is as near, h is even. Finite, non-overflowing x. */
static void check_rne(float x, uint16_t h, float (*widen)(uint16_t), const char *fmt)
{
    double v = widen(h), d = fabs((double)x - v);
    CHECK(isfinite(v), "%s of %a: 0x%04x is not finite", fmt, (double)x, h);
    for (int s = -1; s <= 1; s += 2) {
        uint16_t nb = (uint16_t)(h + s);
        if ((h & 0x7fff) == 0 && s < 0)
            nb = (uint16_t)(h ^ 0x8000) + 1; /* across zero: the other sign's smallest */
        double w = widen(nb);
        if (!isfinite(w))
            continue;
        double dn = fabs((double)x - w);
        CHECK(d <= dn, "%s of %a: 0x%04x (%a) but 0x%04x (%a) is nearer", fmt, (double)x,
                      h, v, nb, w);
        if (d == dn && d != 0.0)
            CHECK((h & 1) == 0, "%s of %a: a tie kept odd 0x%04x", fmt, (double)x, h);
    }
}

START_TEST(test_sweep)
{
    const size_t n = 1u << 20;
    float *x = kt_alloc(n), *r = kt_alloc(n), *w = kt_alloc(n);
    uint16_t *h = malloc(n * sizeof *h);
    ck_assert(h != NULL);
    for (size_t i = 0; i < n; i++)
        x[i] = fb((uint32_t)(i * 4099u));
    for (int fmt = 0; fmt < 2; fmt++) {
        const char *name = fmt ? "fp16" : "bf16";
        float (*widen)(uint16_t) = fmt ? loom_cpu_f16_to_f32 : loom_cpu_bf16_to_f32;
        uint16_t (*narrow)(float) = fmt ? loom_cpu_f16_from_f32 : loom_cpu_bf16_from_f32;
        double edge = fmt ? 65520.0 : (double)fb(0x7f7f8000u); /* from here up: inf */
        (fmt ? loom_cpu_f32_to_f16 : loom_cpu_f32_to_bf16)(h, x, n);
        memcpy(r, x, n * sizeof *r);
        (fmt ? loom_cpu_round_f16 : loom_cpu_round_bf16)(r, r, n); /* in place */
        (fmt ? loom_cpu_f16_to_f32_n : loom_cpu_bf16_to_f32_n)(w, h, n);
        for (size_t i = 0; i < n; i++) {
            uint16_t s = narrow(x[i]);
            CHECK(h[i] == s, "%s array kernel of %a: 0x%04x, scalar 0x%04x", name,
                          (double)x[i], h[i], s);
            CHECK(bf(w[i]) == bf(widen(s)) && bf(r[i]) == bf(w[i]),
                          "%s widen/round of %a disagree", name, (double)x[i]);
            double a = fabs((double)x[i]);
            if (isnan(x[i]))
                CHECK(isnan(widen(s)), "%s of a NaN is not NaN", name);
            else if (a >= edge)
                CHECK(isinf(widen(s)), "%s of %a should overflow to inf", name,
                              (double)x[i]);
            else
                check_rne(x[i], s, widen, name);
        }
    }
    free(x), free(r), free(w), free(h);
}
END_TEST

START_TEST(test_roundtrip)
{
    for (uint32_t v = 0; v < 65536; v++) {
        uint16_t h = (uint16_t)v;
        int f16_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff), bf_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        uint16_t f = loom_cpu_f16_from_f32(loom_cpu_f16_to_f32(h));
        uint16_t b = loom_cpu_bf16_from_f32(loom_cpu_bf16_to_f32(h));
        CHECK(f == (f16_nan ? (h | 0x0200) : h), "fp16 0x%04x came back 0x%04x", h, f);
        CHECK(b == (bf_nan ? (h | 0x0040) : h), "bf16 0x%04x came back 0x%04x", h, b);
    }
}
END_TEST

/* Widening by definition: bf16 is fp32's top half; fp16's normals re-biased, subnormals
 * m x 2^-24, inf kept, and a NaN quiet (bit 22 set) with its 10 payload bits. */
static uint32_t f16_widened(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u);
    if (e == 0)
        return sign | bf((float)m * 0x1p-24f);
    return sign | ((e + 112u) << 23) | (m << 13);
}

START_TEST(test_widen_all)
{
    uint16_t *h = malloc(65536 * sizeof *h);
    float *w = kt_alloc(65536);
    ck_assert(h != NULL);
    for (uint32_t v = 0; v < 65536; v++)
        h[v] = (uint16_t)v;
    for (int fmt = 0; fmt < 2; fmt++) {
        /* one array call: 8-wide F16C over all but the tail where the ISA has it */
        (fmt ? loom_cpu_f16_to_f32_n : loom_cpu_bf16_to_f32_n)(w, h, 65536);
        for (uint32_t v = 0; v < 65536; v++) {
            uint32_t want = fmt ? f16_widened((uint16_t)v) : v << 16;
            uint32_t scalar = bf((fmt ? loom_cpu_f16_to_f32 : loom_cpu_bf16_to_f32)((uint16_t)v));
            CHECK(scalar == want, "%s 0x%04x widened (scalar) to 0x%08x, want 0x%08x",
                  fmt ? "fp16" : "bf16", v, scalar, want);
            CHECK(bf(w[v]) == want, "%s 0x%04x widened (array, %s) to 0x%08x, want 0x%08x",
                  fmt ? "fp16" : "bf16", v, loom_cpu_isa_name(loom_cpu_isa()), bf(w[v]), want);
        }
    }
    free(h), free(w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("convert");
    tcase_add_test(tc, test_edges);
    tcase_add_test(tc, test_sweep);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_widen_all);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
