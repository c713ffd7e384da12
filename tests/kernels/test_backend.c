/* test_backend.c — the plugin loom-backend-cpu.so as the core sees it: dlopen it (path as
 * argv[1]), take the descriptor from loom_plugin_entry, and check the contract of
 * include/loom/plugin/backend.h: descriptor fields and config keys, a complete ops table,
 * create/describe/destroy, 64-byte-aligned zeroed alloc, copies, zero, and kernels through
 * the table giving the same bits as the kernel library. Internal symbols must not be
 * visible (only loom_plugin_entry is exported).
 */
#include "cpu_kernels.h"
#include "kernel_test.h"
#include "loom/plugin/backend.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

static const char *plugin_path;

static void host_log(loom_log_level level, const char *fmt, ...)
{
}

static char last_fail[512]; /* the message of the last host->fail */

static loom_status host_fail(loom_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_fail, sizeof last_fail, fmt, ap);
    va_end(ap);
    return st;
}

static void *host_alloc(size_t bytes)
{
    return calloc(1, bytes);
}

static const loom_host host = {.size = sizeof(loom_host), .abi = LOOM_PLUGIN_ABI,
                               .log = host_log, .fail = host_fail, .alloc = host_alloc,
                               .free = free, .rank = 0, .world = 1, .group = NULL};

static const loom_plugin_desc *open_plugin(void **handle)
{
    *handle = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(*handle != NULL, "dlopen %s: %s", plugin_path, dlerror());
    loom_plugin_entry_fn entry = (loom_plugin_entry_fn)dlsym(*handle, LOOM_PLUGIN_ENTRY_SYMBOL);
    ck_assert_msg(entry != NULL, "no %s in %s", LOOM_PLUGIN_ENTRY_SYMBOL, plugin_path);
    return entry();
}

START_TEST(test_descriptor)
{
    void *h;
    const loom_plugin_desc *d = open_plugin(&h);
    ck_assert_uint_eq(d->abi, LOOM_PLUGIN_ABI);
    ck_assert_uint_eq(d->size, sizeof(loom_plugin_desc));
    ck_assert_int_eq(d->kind, LOOM_KIND_BACKEND);
    ck_assert_str_eq(d->name, "cpu");
    ck_assert_uint_eq(d->n_config_keys, 1);
    ck_assert_str_eq(d->config_keys[0].name, "threads");
    ck_assert_int_eq(d->config_keys[0].type, LOOM_CFG_INTEGER);
    ck_assert_str_eq(d->config_keys[0].default_value, "0");
    const loom_backend_ops *ops = d->ops;
    ck_assert_uint_eq(ops->size, sizeof(loom_backend_ops));
    /* every member after size is filled */
    const char *base = (const char *)ops;
    for (size_t off = sizeof(size_t); off < sizeof *ops; off += sizeof(void (*)(void))) {
        void (*fn)(void);
        memcpy(&fn, base + off, sizeof fn);
        if (off == offsetof(loom_backend_ops, stream) ||
            off == offsetof(loom_backend_ops, adamw_update) ||
            off == offsetof(loom_backend_ops, sgd_update) ||
            off == offsetof(loom_backend_ops, matmul_forward_dt) ||
            off == offsetof(loom_backend_ops, attention_flash_forward) ||
            off == offsetof(loom_backend_ops, attention_flash_backward) ||
            off == offsetof(loom_backend_ops, host_alloc) ||
            off == offsetof(loom_backend_ops, host_free) ||
            off == offsetof(loom_backend_ops, kd_rows) ||
            off == offsetof(loom_backend_ops, attention_forward_dt) ||
            off == offsetof(loom_backend_ops, attention_backward_dt) ||
            (off >= offsetof(loom_backend_ops, attention_flash_gqa_forward) &&
             off <= offsetof(loom_backend_ops, attention_gqa_backward_dt)) ||
            (off >= offsetof(loom_backend_ops, vm_granule) &&
             off <= offsetof(loom_backend_ops, vm_release)) ||
            off == offsetof(loom_backend_ops, attention_sizes) ||
            off == offsetof(loom_backend_ops, attention_allow_fused))
            continue; /* NULL by contract on a host-memory backend (plugin/backend.h): no
                       * stream, and the optimizer plugin's host step updates its memory;
                       * optional: 16-bit products (NULL: matmul_forward) and attention
                       * (NULL: attention_forward), the fused
                       * attention (the CUDA backend's), pinned host memory (NULL:
                       * malloc, which is what host memory is here) and sparse buffers
                       * (host ZeRO hands pages back with madvise itself), attention_sizes
                       * (NULL: the batched path's, what the CPU keeps), and
                       * attention_allow_fused (no fused path to turn off); kd_rows: the
                       * core computes distillation's term itself in host memory */
        ck_assert_msg(fn != NULL, "ops member at offset %zu is NULL", off);
    }
    /* optional in backend.h, but the CPU reference fills it: distillation's attention
     * terms are refused on a backend without it */
    ck_assert_uint_gt(ops->size, offsetof(loom_backend_ops, attention_backward_datt));
    ck_assert_ptr_nonnull(ops->attention_backward_datt);
    ck_assert_ptr_null(ops->kd_rows); /* NULL by contract on a host-memory backend */
    /* hidden: the kernels are not exported */
    ck_assert_ptr_null(dlsym(h, "loom_cpu_sgemm"));
    ck_assert_ptr_null(dlsym(h, "loom_cpu_matmul_forward"));
    ck_assert_ptr_null(dlsym(h, "loom_cpu_blas_init"));
}
END_TEST

START_TEST(test_instance)
{
    void *h;
    const loom_backend_ops *ops = open_plugin(&h)->ops;
    loom_config_value v = {"threads", LOOM_CFG_INTEGER, 2.0, NULL, {0}, 0};
    loom_config cfg = {1, &v};
    void *self = NULL;
    ck_assert_int_eq(ops->create(&host, &cfg, &self), LOOM_OK);
    ck_assert_ptr_nonnull(self);
    const char *desc = ops->describe(self);
    ck_assert_msg(strncmp(desc, "cpu: ", 5) == 0 && strstr(desc, "threads=2") &&
                      strstr(desc, " isa="),
                  "describe: %s", desc);

    const size_t n = 1000;
    float *a = ops->alloc(self, n * sizeof(float)), *b = ops->alloc(self, n * sizeof(float));
    ck_assert_msg(((uintptr_t)a & 63) == 0 && ((uintptr_t)b & 63) == 0,
                  "alloc is not 64-byte aligned");
    kt_assert_all("fresh alloc", a, n, 0.0f);
    float host_buf[1000], back[1000];
    kt_fill(host_buf, n, 1, -1, 1);
    ops->copy_to_device(self, a, host_buf, sizeof host_buf);
    ops->synchronize(self);
    ops->copy_to_host(self, back, a, sizeof back);
    ck_assert(memcmp(host_buf, back, sizeof back) == 0);

    /* a kernel through the table: same bits as the library */
    float direct[1000];
    ops->gelu_forward(b, a, n);
    loom_cpu_gelu_forward(direct, host_buf, n);
    ck_assert(memcmp(b, direct, sizeof direct) == 0);
    ck_assert(ops->sum_squares(a, 1, n, n) == loom_cpu_sum_squares(host_buf, 1, n, n));

    ops->zero(self, a, n * sizeof(float));
    kt_assert_all("zeroed", a, n, 0.0f);
    ops->free(self, a);
    ops->free(self, b);
    ops->free(self, NULL);
    ops->destroy(self);
    ops->destroy(NULL);
}
END_TEST

START_TEST(test_refuses_negative_threads)
{
    void *h;
    const loom_backend_ops *ops = open_plugin(&h)->ops;
    loom_config_value v = {"threads", LOOM_CFG_INTEGER, -3.0, NULL, {0}, 0};
    loom_config cfg = {1, &v};
    void *self = (void *)1;
    ck_assert_int_eq(ops->create(&host, &cfg, &self), LOOM_ERR_INVALID);
    ck_assert_ptr_null(self);
}
END_TEST

/* LOOM_CPU_ISA is read once per process, by the plugin's own copy of isa.c: these run in
 * Check's forked children (the default), where the plugin is loaded afresh. */
static void create_with_isa(const char *isa, loom_status want, const char *want_msg)
{
    if (getenv("CK_FORK") && strcmp(getenv("CK_FORK"), "no") == 0)
        return; /* one process for all tests: the ISA is already decided */
    setenv("LOOM_CPU_ISA", isa, 1);
    void *h;
    const loom_backend_ops *ops = open_plugin(&h)->ops;
    void *self = (void *)1;
    last_fail[0] = '\0';
    ck_assert_int_eq(ops->create(&host, NULL, &self), want);
    if (want == LOOM_OK) {
        ck_assert_msg(strstr(ops->describe(self), want_msg), "describe: %s", ops->describe(self));
        ops->destroy(self);
    } else {
        ck_assert_ptr_null(self);
        ck_assert_msg(strcmp(last_fail, want_msg) == 0, "refusal: \"%s\"\nwanted:  \"%s\"",
                      last_fail, want_msg);
    }
}

START_TEST(test_refuses_unknown_isa)
{
    char want[300];
    snprintf(want, sizeof want,
             "backend cpu: LOOM_CPU_ISA=avx3 is not an instruction set loom knows; use avx512, "
             "avx2 or sse2, or unset it for the best this CPU has (%s)",
             loom_cpu_isa_name(loom_cpu_isa_best()));
    create_with_isa("avx3", LOOM_ERR_INVALID, want);
}
END_TEST

START_TEST(test_refuses_missing_isa)
{
    if (loom_cpu_isa_best() == LOOM_CPU_ISA_AVX512)
        return; /* nothing this CPU lacks */
    char want[300];
    const char *best = loom_cpu_isa_name(loom_cpu_isa_best());
    snprintf(want, sizeof want,
             "backend cpu: LOOM_CPU_ISA=avx512, but this CPU lacks avx512 (the best it has is "
             "%s); use %s or lower, or unset LOOM_CPU_ISA", best, best);
    create_with_isa("avx512", LOOM_ERR_INVALID, want);
}
END_TEST

START_TEST(test_forced_isa_is_described)
{
    create_with_isa("sse2", LOOM_OK, "isa=sse2 (LOOM_CPU_ISA; cpu has ");
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/loom-backend-cpu.so\n", argv[0]);
        return 2;
    }
    plugin_path = argv[1];
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("backend");
    tcase_add_test(tc, test_descriptor);
    tcase_add_test(tc, test_instance);
    tcase_add_test(tc, test_refuses_negative_threads);
    tcase_add_test(tc, test_refuses_unknown_isa);
    tcase_add_test(tc, test_refuses_missing_isa);
    tcase_add_test(tc, test_forced_isa_is_described);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
