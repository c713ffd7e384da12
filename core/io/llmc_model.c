/* llmc_model.c — read and write llm.c model files (see llmc_model.h for the format).
 *
 * The header and the file size are checked before a single parameter is touched, so a
 * wrong or truncated file leaves the model as it was. Parameters are read straight into
 * the model's buffer, which is host memory on the CPU backend (as session.c assumes for
 * the optimizer); a device backend will stage through copy_to_device here.
 */
#include "llmc_model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gpt_stage.h"
#include "base/backend.h"
#include "base/status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c model files are little-endian; this reader takes them as they are"
#endif

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * 4)

/* llm.c's parameter tensors in file order; `layered` blocks hold L per-layer entries. */
static const struct {
    const char *name; /* loom entry name, or the suffix after "h.{l}." */
    int layered;
} blocks[16] = {
    {"wte", 0},          {"wpe", 0},
    {"ln_1.weight", 1},  {"ln_1.bias", 1},
    {"attn.qkv.weight", 1}, {"attn.qkv.bias", 1},
    {"attn.proj.weight", 1}, {"attn.proj.bias", 1},
    {"ln_2.weight", 1},  {"ln_2.bias", 1},
    {"mlp.fc.weight", 1}, {"mlp.fc.bias", 1},
    {"mlp.proj.weight", 1}, {"mlp.proj.bias", 1},
    {"ln_f.weight", 0},  {"ln_f.bias", 0},
};

/* Elements per entry of each block (per layer for layered blocks), as llm.c sizes them. */
static void block_sizes(const loom_gpt_config *c, size_t n[16])
{
    size_t C = (size_t)c->dim, Vp = (size_t)c->vocab_padded, T = (size_t)c->ctx;
    size_t s[16] = {Vp * C, T * C, C, C, 3 * C * C, 3 * C, C * C, C, C, C,
                    4 * C * C, 4 * C, C * 4 * C, C, C, C};
    memcpy(n, s, sizeof s);
}

static size_t total_params(const loom_gpt_config *c)
{
    size_t n[16], total = 0;
    block_sizes(c, n);
    for (int b = 0; b < 16; b++)
        total += n[b] * (blocks[b].layered ? (size_t)c->layers : 1);
    return total;
}

/* Open path and check its header against its size. *version gets 3 or 5. */
static loom_status open_model(const char *path, FILE **out, loom_gpt_config *cfg, int *version)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        LOOM_FAIL(LOOM_ERR_IO, "cannot open llm.c model '%s': %s", path, strerror(errno));
    struct stat st;
    int32_t h[HEADER_INTS];
    loom_status rc = LOOM_OK;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = loom_fail(LOOM_ERR_IO, "llm.c model '%s' is not a regular file", path);
    } else if (st.st_size < HEADER_BYTES || fread(h, sizeof h, 1, f) != 1) {
        rc = loom_fail(LOOM_ERR_CORRUPT, "llm.c model '%s' is %lld bytes, shorter than its %d-byte "
                       "header", path, (long long)st.st_size, HEADER_BYTES);
    } else if (h[0] != LOOM_LLMC_MAGIC) {
        rc = loom_fail(LOOM_ERR_CORRUPT, "llm.c model '%s' has magic %d in header[0]; an llm.c "
                       "model file has %d", path, h[0], LOOM_LLMC_MAGIC);
    } else if (h[1] != 3 && h[1] != 5) {
        rc = loom_fail(LOOM_ERR_UNSUPPORTED, "llm.c model '%s' has version %d; loom reads versions "
                       "3 (fp32) and 5 (bf16)", path, h[1]);
    } else {
        *version = h[1];
        memset(cfg, 0, sizeof *cfg);
        cfg->ctx = h[2];
        cfg->vocab = h[3];
        cfg->layers = h[4];
        cfg->heads = h[5];
        cfg->dim = h[6];
        cfg->vocab_padded = h[7];
        if (cfg->ctx < 1 || cfg->vocab < 2 || cfg->vocab_padded < cfg->vocab || cfg->layers < 1 ||
            cfg->heads < 1 || cfg->dim < 1 || cfg->dim % cfg->heads != 0) {
            rc = loom_fail(LOOM_ERR_CORRUPT, "llm.c model '%s' has an impossible shape in its "
                           "header: maxT=%d V=%d L=%d NH=%d C=%d Vp=%d", path, h[2], h[3], h[4],
                           h[5], h[6], h[7]);
        } else {
            size_t n = total_params(cfg);
            long long need = HEADER_BYTES + (long long)n * (*version == 3 ? 4 : 2);
            if ((long long)st.st_size < need)
                rc = loom_fail(LOOM_ERR_CORRUPT, "llm.c model '%s' is truncated: %lld bytes, but "
                               "its header (version %d, %zu %s parameters) needs %lld", path,
                               (long long)st.st_size, *version, n,
                               *version == 3 ? "fp32" : "bf16", need);
            else if ((long long)st.st_size > need)
                rc = loom_fail(LOOM_ERR_CORRUPT, "llm.c model '%s' is %lld bytes, more than its "
                               "header (version %d, %zu parameters) says: %lld", path,
                               (long long)st.st_size, *version, n, need);
        }
    }
    if (rc != LOOM_OK) {
        fclose(f);
        return rc;
    }
    *out = f;
    return LOOM_OK;
}

loom_status loom_llmc_read_config(const char *path, loom_gpt_config *out)
{
    FILE *f;
    int version;
    LOOM_TRY(open_model(path, &f, out, &version));
    fclose(f);
    return LOOM_OK;
}

/* Elements of the entry's logical (whole) tensor, whatever slice this rank holds. */
static size_t logical_numel(const loom_param_entry *e)
{
    size_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= (size_t)e->shape[d];
    return n;
}

/* The entry for block b, layer l; its logical size must be what llm.c says. A pipeline
 * stage (m given) has no entry for what another stage holds: *e = NULL, and OK. */
static loom_status find_entry(const loom_param_table *t, const loom_gpt *m, int b, int l,
                              size_t numel, const loom_param_entry **e)
{
    char name[LOOM_PARAM_NAME_MAX];
    if (blocks[b].layered)
        snprintf(name, sizeof name, "h.%d.%s", l, blocks[b].name);
    else
        snprintf(name, sizeof name, "%s", blocks[b].name);
    *e = loom_params_find(t, name);
    if (!*e && m && loom_gpt_held_elsewhere(m, name))
        return LOOM_OK;
    if (!*e || logical_numel(*e) != numel)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "loom's parameter '%s' %s (llm.c has %zu elements)", name,
                  *e ? "has another size" : "is missing", numel);
    return LOOM_OK;
}

/* bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32. */
static void widen_bf16(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

/* Read the next n values of the file into the entry's held slice at dst. A whole entry
 * is read straight into place; a slice (tensor parallelism) through a buffer holding the
 * whole logical tensor, from which loom_params_copy_box takes the rank's box. */
static loom_status read_sliced(FILE *f, const char *path, int version, const loom_param_entry *e,
                               float *dst, size_t n);

static loom_status read_entry(FILE *f, const char *path, int version, float *dst, size_t n)
{
    if (version == 3) {
        if (fread(dst, 4, n, f) != n)
            LOOM_FAIL(LOOM_ERR_IO, "reading llm.c model '%s' failed part-way; the model's "
                      "parameters are now partly overwritten", path);
        return LOOM_OK;
    }
    uint16_t buf[4096];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 4096 ? n - done : 4096;
        if (fread(buf, 2, k, f) != k)
            LOOM_FAIL(LOOM_ERR_IO, "reading llm.c model '%s' failed part-way; the model's "
                      "parameters are now partly overwritten", path);
        widen_bf16(buf, dst + done, k);
        done += k;
    }
    return LOOM_OK;
}

static loom_status read_sliced(FILE *f, const char *path, int version, const loom_param_entry *e,
                               float *dst, size_t n)
{
    if (e->numel == n)
        return read_entry(f, path, version, dst, n);
    size_t width = version == 3 ? 4 : 2;
    unsigned char *whole = malloc(n * width);
    if (!whole)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory reading '%s' of llm.c model '%s' (%zu bytes)",
                  e->name, path, n * width);
    if (fread(whole, width, n, f) != n) {
        free(whole);
        LOOM_FAIL(LOOM_ERR_IO, "reading llm.c model '%s' failed part-way; the model's "
                  "parameters are now partly overwritten", path);
    }
    const int64_t zero[LOOM_PARAM_MAX_DIMS] = {0};
    loom_params_copy_box(dst, e->slice_start, e->slice_len, whole, version == 5, zero, e->shape,
                         e->ndim);
    free(whole);
    return LOOM_OK;
}

static loom_status check_shape(const char *path, const loom_gpt_config *file,
                               const loom_gpt_config *model)
{
    const struct { const char *name; int f, m; } fields[] = {
        {"vocab", file->vocab, model->vocab},
        {"vocab_padded", file->vocab_padded, model->vocab_padded},
        {"ctx", file->ctx, model->ctx},
        {"layers", file->layers, model->layers},
        {"heads", file->heads, model->heads},
        {"dim", file->dim, model->dim},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].f != fields[i].m)
            LOOM_FAIL(LOOM_ERR_INVALID, "llm.c model '%s' has %s=%d; the session's model has %s=%d",
                      path, fields[i].name, fields[i].f, fields[i].name, fields[i].m);
    return LOOM_OK;
}

/* The parameters as host memory: the model's buffer, or on a device backend a copy
 * (filled from the device when fill); done_host_params writes it back (back) and frees it. */
static float *host_params(loom_gpt *m, int fill)
{
    loom_backend *be = loom_gpt_backend(m);
    if (!loom_backend_device_memory(be))
        return loom_gpt_param_data(m);
    size_t bytes = loom_gpt_params(m)->total * sizeof(float);
    float *h = malloc(bytes);
    if (h && fill)
        be->ops->copy_to_host(be->self, h, loom_gpt_param_data(m), bytes);
    return h;
}

static void done_host_params(loom_gpt *m, const float *h, int back)
{
    loom_backend *be = loom_gpt_backend(m);
    if (h == loom_gpt_param_data(m))
        return;
    if (back)
        be->ops->copy_to_device(be->self, loom_gpt_param_data(m), h,
                                loom_gpt_params(m)->total * sizeof(float));
    free((void *)h);
}

loom_status loom_llmc_load(loom_gpt *m, const char *path)
{
    FILE *f;
    loom_gpt_config fc;
    int version;
    LOOM_TRY(open_model(path, &f, &fc, &version));
    const loom_gpt_config *mc = loom_gpt_get_config(m);
    const loom_param_table *t = loom_gpt_params(m);
    float *params = host_params(m, 1);
    if (!params) {
        fclose(f);
        LOOM_FAIL(LOOM_ERR_NOMEM, "reading llm.c model '%s': out of memory for a host copy of "
                  "the parameters", path);
    }
    size_t n[16];
    block_sizes(mc, n);
    loom_status st = check_shape(path, &fc, mc);
    /* every entry first, so a table mismatch is found before anything is overwritten */
    for (int b = 0; st == LOOM_OK && b < 16; b++)
        for (int l = 0; st == LOOM_OK && l < (blocks[b].layered ? mc->layers : 1); l++) {
            const loom_param_entry *e;
            st = find_entry(t, m, b, l, n[b], &e);
        }
    long width = version == 3 ? 4 : 2;
    for (int b = 0; st == LOOM_OK && b < 16; b++)
        for (int l = 0; st == LOOM_OK && l < (blocks[b].layered ? mc->layers : 1); l++) {
            const loom_param_entry *e;
            st = find_entry(t, m, b, l, n[b], &e);
            if (st == LOOM_OK && !e && fseek(f, (long)n[b] * width, SEEK_CUR) != 0)
                st = loom_fail(LOOM_ERR_IO, "reading llm.c model '%s' failed part-way (skipping "
                               "another pipeline stage's tensor); the model's parameters are now "
                               "partly overwritten", path);
            else if (st == LOOM_OK && e)
                st = read_sliced(f, path, version, e, params + e->offset, n[b]);
        }
    fclose(f);
    done_host_params(m, params, 1);
    return st;
}

static loom_status save_from(loom_gpt *m, const char *path, const float *params)
{
    const loom_gpt_config *c = loom_gpt_get_config(m);
    const loom_param_table *t = loom_gpt_params(m);
    if (c->moe.experts)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "%s: llm.c's model file has dense GPT-2 blocks only; this "
                  "model has mixture-of-experts blocks (%d experts): keep it as a loom checkpoint "
                  "or export safetensors (loom ckpt export)", path, c->moe.experts);
    size_t n[16];
    block_sizes(c, n);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        loom_status rc = loom_fail(LOOM_ERR_IO, "cannot write llm.c model '%s': %s", tmp,
                                   strerror(errno));
        free(tmp);
        return rc;
    }
    int32_t h[HEADER_INTS] = {LOOM_LLMC_MAGIC, 3, c->ctx, c->vocab, c->layers, c->heads, c->dim,
                              c->vocab_padded};
    int ok = fwrite(h, sizeof h, 1, f) == 1;
    loom_status st = LOOM_OK;
    for (int b = 0; ok && st == LOOM_OK && b < 16; b++)
        for (int l = 0; ok && st == LOOM_OK && l < (blocks[b].layered ? c->layers : 1); l++) {
            const loom_param_entry *e;
            st = find_entry(t, m, b, l, n[b], &e);
            if (st == LOOM_OK && !e)
                st = loom_fail(LOOM_ERR_UNSUPPORTED, "cannot write llm.c model '%s' from a "
                               "pipeline stage (another stage holds part of the model): save a "
                               "checkpoint and run loom export --llmc on it", path);
            if (st == LOOM_OK && e->numel != n[b])
                st = loom_fail(LOOM_ERR_UNSUPPORTED, "cannot write llm.c model '%s' from a "
                               "tensor-parallel session (this rank holds a slice of '%s'): save "
                               "a checkpoint and run loom export --llmc on it", path, e->name);
            if (st == LOOM_OK)
                ok = fwrite(params + e->offset, 4, n[b], f) == n[b];
        }
    ok = (fclose(f) == 0) && ok;
    if (st == LOOM_OK && !ok)
        st = loom_fail(LOOM_ERR_IO, "writing llm.c model '%s' failed: %s", tmp, strerror(errno));
    if (st == LOOM_OK && rename(tmp, path) != 0)
        st = loom_fail(LOOM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (st != LOOM_OK)
        remove(tmp);
    free(tmp);
    return st;
}

loom_status loom_llmc_save(loom_gpt *m, const char *path)
{
    const float *params = host_params(m, 1);
    if (!params)
        LOOM_FAIL(LOOM_ERR_NOMEM, "writing llm.c model '%s': out of memory for a host copy of "
                  "the parameters", path);
    loom_status st = save_from(m, path, params);
    done_host_params(m, params, 0);
    return st;
}
