/* checkpoint_load.c — validating a checkpoint completely and then restoring it into a
 * session (see checkpoint.h).
 *
 * What: read the manifest (its own checksum, format, version), compare what it records
 * with the session (model config, optimizer, precision state size, data kind), read both
 * safetensors files whole and check size and checksum, parse them strictly, check every
 * tensor against the parameter table; only then change anything.
 * What not: no resharding (a slice other than the one this rank holds is refused), no
 * streaming (peak memory is the size of the two files).
 * Invariants: on any failure the session and the data source are as they were; every
 * message names the file (and the field) it is about.
 */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checksum.h"
#include "json.h"
#include "safetensors.h"
#include "status.h"

#define MAX_MANIFEST ((size_t)64 << 20)
#define CHECKSUM_PREFIX "xxh64:"
#define PREFIX_LEN 6

loom_status loom_ckpt_read_file(const char *path, size_t max, unsigned char **bytes, size_t *size)
{
    *bytes = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return loom_fail(LOOM_ERR_IO, "cannot read checkpoint '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
        close(fd);
        return loom_fail(LOOM_ERR_IO, "checkpoint '%s' is not a regular file of at most %zu bytes",
                         path, max);
    }
    size_t n = (size_t)sb.st_size, done = 0;
    unsigned char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading '%s' (%zu bytes)", path, n);
    }
    while (done < n) {
        ssize_t r = read(fd, buf + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            free(buf);
            return loom_fail(LOOM_ERR_IO, "cannot read checkpoint '%s': %s", path,
                             e ? strerror(e) : "the file shrank while being read");
        }
        done += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *bytes = buf;
    *size = n;
    return LOOM_OK;
}

static loom_status bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static loom_status bad(const char *path, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_CORRUPT, "checkpoint '%s': %s", path, msg);
}

static loom_status verify_checksum(const char *path, char *text, size_t n, const loom_json *root)
{
    const loom_json *c = loom_json_get(root, "checksum");
    if (!c || c->type != LOOM_JSON_STRING || c->len != PREFIX_LEN + 16 ||
        c->end - c->begin != PREFIX_LEN + 18 || memcmp(c->text, CHECKSUM_PREFIX, PREFIX_LEN) != 0 ||
        strspn(c->text + PREFIX_LEN, "0123456789abcdef") != 16)
        return bad(path, "manifest has no checksum \"xxh64:<16 hex digits>\"");
    char recorded[17];
    char *digits = text + c->begin + 1 + PREFIX_LEN;
    memcpy(recorded, digits, 16);
    recorded[16] = '\0';
    memset(digits, '0', 16);
    uint64_t h = loom_xxh64(text, n);
    memcpy(digits, recorded, 16);
    char actual[17];
    snprintf(actual, sizeof actual, "%016" PRIx64, h);
    if (strcmp(actual, recorded) != 0)
        return bad(path, "manifest checksum is xxh64:%s but the text hashes to xxh64:%s (the "
                   "file was changed or damaged)", recorded, actual);
    return LOOM_OK;
}

loom_status loom_ckpt_manifest_open(const char *ckpt_dir, loom_json_doc **doc, char **text)
{
    char path[PATH_MAX];
    *doc = NULL;
    *text = NULL;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", ckpt_dir, LOOM_CKPT_MANIFEST_FILE) >= sizeof path)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ckpt_dir);
    unsigned char *bytes;
    size_t n;
    LOOM_TRY(loom_ckpt_read_file(path, MAX_MANIFEST, &bytes, &n));
    loom_json_error err;
    loom_status st = loom_json_parse((const char *)bytes, n, NULL, doc, &err);
    if (st != LOOM_OK) {
        free(bytes);
        return st == LOOM_ERR_NOMEM ? st : bad(path, "not valid JSON at byte %zu: %s", err.offset, err.msg);
    }
    const loom_json *root = loom_json_root(*doc), *f = loom_json_get(root, "format");
    int64_t version = 0;
    if (root->type != LOOM_JSON_OBJECT)
        st = bad(path, "the manifest is a JSON %s (an object expected)", loom_json_type_name(root->type));
    else if (!f || f->type != LOOM_JSON_STRING || strcmp(f->text, LOOM_CHECKPOINT_FORMAT) != 0)
        st = bad(path, "manifest format is %s%.40s%s (\"%s\" expected)", f && f->text ? "'" : "",
                 f && f->text ? f->text : "missing", f && f->text ? "'" : "", LOOM_CHECKPOINT_FORMAT);
    else if (!loom_json_int64(loom_json_get(root, "version"), &version) || version != LOOM_CHECKPOINT_VERSION)
        st = bad(path, "manifest version is not %d, the one this loom %s reads", LOOM_CHECKPOINT_VERSION,
                 LOOM_VERSION_STRING);
    else
        st = verify_checksum(path, (char *)bytes, n, root);
    if (st != LOOM_OK) {
        loom_json_free(*doc);
        *doc = NULL;
        free(bytes);
        return st;
    }
    *text = (char *)bytes;
    return LOOM_OK;
}

/* files.<name> of the manifest: its recorded size and checksum. */
static loom_status file_record(const char *mpath, const loom_json *root, const char *name,
                               uint64_t *bytes, uint64_t *sum)
{
    const loom_json *r = loom_json_get(loom_json_get_type(root, "files", LOOM_JSON_OBJECT), name);
    const loom_json *c = loom_json_get_type(r, "xxh64", LOOM_JSON_STRING);
    char *end;
    if (!loom_json_uint64(loom_json_get(r, "bytes"), bytes) || !c || c->len != 16 ||
        strspn(c->text, "0123456789abcdef") != 16)
        return bad(mpath, "manifest files.%s needs {\"bytes\": <integer>, \"xxh64\": \"<16 hex "
                   "digits>\"}", name);
    *sum = strtoull(c->text, &end, 16);
    return LOOM_OK;
}

int loom_ckpt_is_complete(const char *ckpt_dir)
{
    loom_json_doc *doc;
    char *text, path[PATH_MAX];
    if (loom_ckpt_manifest_open(ckpt_dir, &doc, &text) != LOOM_OK)
        return 0;
    int ok = 1;
    const char *names[2] = {LOOM_CKPT_MODEL_FILE, LOOM_CKPT_OPTIM_FILE};
    for (int i = 0; i < 2 && ok; i++) {
        uint64_t bytes, sum;
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", ckpt_dir, names[i]);
        ok = file_record(path, loom_json_root(doc), names[i], &bytes, &sum) == LOOM_OK &&
             stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == bytes;
    }
    loom_json_free(doc);
    free(text);
    return ok;
}

/* --- one load ---------------------------------------------------------------------- */

typedef struct loaded {
    const char *dir;
    char mpath[PATH_MAX], model_path[PATH_MAX], optim_path[PATH_MAX];
    loom_json_doc *doc;
    char *manifest;
    unsigned char *model_bytes, *optim_bytes;
    loom_st_file *model, *optim;
    loom_checkpoint_extra x;
    char *config;
    loom_session_state state;
} loaded;

static void loaded_free(loaded *ld)
{
    loom_json_free(ld->doc);
    free(ld->manifest);
    loom_safetensors_free(ld->model);
    loom_safetensors_free(ld->optim);
    free(ld->model_bytes);
    free(ld->optim_bytes);
    free(ld->config);
}

static loom_status check_int(const loaded *ld, const loom_json *obj, const char *group,
                             const char *key, int64_t want, const char *what)
{
    int64_t v;
    if (!loom_json_int64(loom_json_get(obj, key), &v))
        return bad(ld->mpath, "manifest has no integer %s.%s", group, key);
    if (v != want)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': manifest %s.%s=%" PRId64 " but this "
                         "run's %s has %s=%" PRId64, ld->mpath, group, key, v, what, key, want);
    return LOOM_OK;
}

static loom_status check_model_config(const loaded *ld, const loom_json *root, loom_session *s)
{
    const loom_gpt_config *c = loom_gpt_get_config(loom_session_model(s));
    const loom_json *m = loom_json_get_type(root, "model", LOOM_JSON_OBJECT);
    if (!m)
        return bad(ld->mpath, "manifest has no model object");
    LOOM_TRY(check_int(ld, m, "model", "vocab", c->vocab, "model"));
    LOOM_TRY(check_int(ld, m, "model", "vocab_padded", c->vocab_padded, "model"));
    LOOM_TRY(check_int(ld, m, "model", "ctx", c->ctx, "model"));
    LOOM_TRY(check_int(ld, m, "model", "layers", c->layers, "model"));
    LOOM_TRY(check_int(ld, m, "model", "heads", c->heads, "model"));
    return check_int(ld, m, "model", "dim", c->dim, "model");
}

static loom_status check_optimizer(const loaded *ld, const loom_json *root, loom_session *s)
{
    uint32_t slots;
    loom_session_optim_state(s, &slots);
    const char *name = loom_session_optim_config(s)->desc->name;
    const loom_json *o = loom_json_get_type(root, "optimizer", LOOM_JSON_OBJECT);
    const loom_json *n = loom_json_get_type(o, "name", LOOM_JSON_STRING);
    if (!n)
        return bad(ld->mpath, "manifest has no optimizer.name string");
    if (strcmp(n->text, name) != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': manifest optimizer.name='%.40s' but "
                         "this run's optimizer is '%s'", ld->mpath, n->text, name);
    return check_int(ld, o, "optimizer", "slots", slots, "optimizer");
}

/* step, steps_taken, precision state, data position, config. */
static loom_status read_state(loaded *ld, const loom_json *root, loom_session *s, const loom_data *data)
{
    if (!loom_json_int64(loom_json_get(root, "step"), &ld->x.step) || ld->x.step < 0 ||
        !loom_json_int64(loom_json_get(root, "steps_taken"), &ld->state.steps) || ld->state.steps < 0)
        return bad(ld->mpath, "manifest step and steps_taken must be integers >= 0");
    loom_session_state now;
    loom_session_get_state(s, &now);
    const loom_json *bits = loom_json_get_type(loom_json_get_type(root, "precision", LOOM_JSON_OBJECT),
                                               "state_bits", LOOM_JSON_ARRAY);
    if (!bits || bits->count > 4)
        return bad(ld->mpath, "manifest has no precision.state_bits list (at most 4 values)");
    if ((int)bits->count != now.n_precision_state)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': manifest precision state has %zu "
                         "values but this run's precision keeps %d", ld->mpath, bits->count,
                         now.n_precision_state);
    ld->state.n_precision_state = (int)bits->count;
    for (size_t i = 0; i < bits->count; i++) {
        uint64_t b;
        if (!loom_json_uint64(&bits->items[i], &b) || b > UINT32_MAX)
            return bad(ld->mpath, "manifest precision.state_bits[%zu] is not a 32-bit integer", i);
        uint32_t b32 = (uint32_t)b;
        memcpy(&ld->state.precision_state[i], &b32, sizeof b32);
    }
    const loom_json *d = loom_json_get(root, "data");
    if (!d || (d->type != LOOM_JSON_NULL && d->type != LOOM_JSON_OBJECT))
        return bad(ld->mpath, "manifest data must be null or {\"kind\": ..., \"state\": [...]}");
    if (d->type == LOOM_JSON_OBJECT) {
        const loom_json *k = loom_json_get_type(d, "kind", LOOM_JSON_STRING);
        const loom_json *w = loom_json_get_type(d, "state", LOOM_JSON_ARRAY);
        if (!k || !k->len || k->len >= LOOM_CHECKPOINT_KIND_MAX || strlen(k->text) != k->len || !w ||
            w->count > LOOM_DATA_STATE_MAX)
            return bad(ld->mpath, "manifest data needs a kind (1 to %d bytes) and at most %d state "
                       "words", LOOM_CHECKPOINT_KIND_MAX - 1, LOOM_DATA_STATE_MAX);
        memcpy(ld->x.data_kind, k->text, k->len + 1);
        ld->x.n_data_state = (int)w->count;
        for (size_t i = 0; i < w->count; i++)
            if (!loom_json_uint64(&w->items[i], &ld->x.data_state[i]))
                return bad(ld->mpath, "manifest data.state[%zu] is not a 64-bit integer >= 0", i);
    }
    if (data && !ld->x.data_kind[0])
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' holds no data position; load it without "
                         "a data source", ld->mpath);
    if (data && strcmp(ld->x.data_kind, data->ops->kind) != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': the data position is from a '%s' "
                         "source but this run reads '%s'", ld->mpath, ld->x.data_kind, data->ops->kind);
    const loom_json *c = loom_json_get(root, "config");
    if (!c || (c->type != LOOM_JSON_NULL && c->type != LOOM_JSON_OBJECT))
        return bad(ld->mpath, "manifest config must be null or an object");
    if (c->type == LOOM_JSON_OBJECT) {
        if (!(ld->config = malloc(c->end - c->begin + 1)))
            return loom_fail(LOOM_ERR_NOMEM, "out of memory");
        memcpy(ld->config, ld->manifest + c->begin, c->end - c->begin);
        ld->config[c->end - c->begin] = '\0';
    }
    return LOOM_OK;
}

static loom_status read_tensors(loaded *ld, const char *name, const char *path,
                                unsigned char **bytes, loom_st_file **f)
{
    uint64_t want_bytes, want_sum;
    size_t n;
    LOOM_TRY(file_record(ld->mpath, loom_json_root(ld->doc), name, &want_bytes, &want_sum));
    LOOM_TRY(loom_ckpt_read_file(path, SIZE_MAX - 1, bytes, &n));
    if (n != want_bytes)
        return bad(path, "the file is %zu bytes but the manifest records %" PRIu64, n, want_bytes);
    uint64_t h = loom_xxh64(*bytes, n);
    if (h != want_sum)
        return bad(path, "checksum xxh64 %016" PRIx64 " but the manifest records %016" PRIx64
                   " (the file was changed or damaged)", h, want_sum);
    return loom_safetensors_parse("checkpoint", path, *bytes, n, f);
}

static void format_dims(char *buf, size_t len, const int64_t *d, int n)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, i ? ", " : "", d[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* Tensor `tname` of f must be the held slice of e; its metadata the logical layout. */
static loom_status check_tensor(const char *path, const loom_st_file *f, const char *tname,
                                const loom_param_entry *e)
{
    const loom_st_entry *t = loom_safetensors_find(f, tname);
    char have[128], want[128];
    if (!t)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' is missing (this run's "
                         "model has it)", path, tname);
    if (strcmp(t->dtype, "F32") != 0 && strcmp(t->dtype, "BF16") != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' is %s (F32 or BF16 "
                         "expected)", path, tname, t->dtype);
    int same = t->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++)
        same = t->shape[d] == e->slice_len[d];
    if (!same) {
        format_dims(have, sizeof have, t->shape, t->ndim);
        format_dims(want, sizeof want, e->slice_len, e->ndim);
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' has shape %s but this "
                         "run's model holds %s", path, tname, have, want);
    }
    const char *meta = loom_safetensors_meta(f, tname);
    loom_json_doc *doc = NULL;
    if (!meta || loom_json_parse(meta, strlen(meta), NULL, &doc, NULL) != LOOM_OK) {
        loom_json_free(doc);
        return bad(path, "__metadata__ has no valid layout {\"shape\", \"slice_start\"} for '%s'", tname);
    }
    const loom_json *shape = loom_json_get_type(loom_json_root(doc), "shape", LOOM_JSON_ARRAY);
    const loom_json *start = loom_json_get_type(loom_json_root(doc), "slice_start", LOOM_JSON_ARRAY);
    same = shape && start && shape->count == (size_t)e->ndim && start->count == (size_t)e->ndim;
    for (int d = 0; same && d < e->ndim; d++) {
        int64_t a, b;
        same = loom_json_int64(&shape->items[d], &a) && loom_json_int64(&start->items[d], &b) &&
               a == e->shape[d] && b == e->slice_start[d];
    }
    loom_json_free(doc);
    if (!same)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' was saved as layout %s; "
                         "this run holds another slice or logical shape (resharding is not "
                         "supported yet)", path, tname, meta);
    return LOOM_OK;
}

/* Every expected tensor present and right, and nothing else. */
static loom_status check_file(const char *path, const loom_st_file *f, const loom_param_table *t,
                              uint32_t per, int is_optim)
{
    char name[LOOM_PARAM_NAME_MAX + 16];
    for (int i = 0; i < t->count; i++)
        for (uint32_t k = 0; k < per; k++) {
            if (is_optim)
                snprintf(name, sizeof name, "%s.state%u", t->entries[i].name, k);
            else
                snprintf(name, sizeof name, "%s", t->entries[i].name);
            LOOM_TRY(check_tensor(path, f, name, &t->entries[i]));
        }
    if ((size_t)loom_safetensors_count(f) != (size_t)t->count * per) {
        /* all expected ones are there, so some other name is not */
        for (int j = 0; j < loom_safetensors_count(f); j++) {
            const char *tn = loom_safetensors_entry(f, j)->name;
            char base[LOOM_PARAM_NAME_MAX + 16];
            snprintf(base, sizeof base, "%s", tn);
            char *dot = is_optim ? strrchr(base, '.') : NULL;
            unsigned long k = 0;
            if (dot && strncmp(dot, ".state", 6) == 0) {
                k = strtoul(dot + 6, NULL, 10);
                *dot = '\0';
            }
            if (!loom_params_find(t, base) || (is_optim && (!dot || k >= per)))
                return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' is not part of "
                                 "this run's %s", path, tn, is_optim ? "optimizer state" : "model");
        }
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %d tensors, %zu expected", path,
                         loom_safetensors_count(f), (size_t)t->count * per);
    }
    return LOOM_OK;
}

static loom_status validate(loaded *ld, loom_session *s, const loom_data *data)
{
    snprintf(ld->model_path, sizeof ld->model_path, "%s/%s", ld->dir, LOOM_CKPT_MODEL_FILE);
    snprintf(ld->optim_path, sizeof ld->optim_path, "%s/%s", ld->dir, LOOM_CKPT_OPTIM_FILE);
    LOOM_TRY(loom_ckpt_manifest_open(ld->dir, &ld->doc, &ld->manifest));
    const loom_json *root = loom_json_root(ld->doc);
    LOOM_TRY(check_model_config(ld, root, s));
    LOOM_TRY(check_optimizer(ld, root, s));
    LOOM_TRY(read_state(ld, root, s, data));
    LOOM_TRY(read_tensors(ld, LOOM_CKPT_MODEL_FILE, ld->model_path, &ld->model_bytes, &ld->model));
    LOOM_TRY(read_tensors(ld, LOOM_CKPT_OPTIM_FILE, ld->optim_path, &ld->optim_bytes, &ld->optim));
    uint32_t slots;
    loom_session_optim_state(s, &slots);
    const loom_param_table *t = loom_gpt_params(loom_session_model(s));
    LOOM_TRY(check_file(ld->model_path, ld->model, t, 1, 0));
    return check_file(ld->optim_path, ld->optim, t, slots, 1);
}

/* Everything is validated: the copies cannot fail. */
static void copy_in(const loaded *ld, loom_session *s)
{
    uint32_t slots;
    float *state = loom_session_optim_state(s, &slots);
    loom_gpt *m = loom_session_model(s);
    float *params = loom_gpt_param_data(m);
    const loom_param_table *t = loom_gpt_params(m);
    char name[LOOM_PARAM_NAME_MAX + 16];
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        loom_safetensors_copy_f32(ld->model, loom_safetensors_find(ld->model, e->name),
                                  params + e->offset, e->numel);
        for (uint32_t k = 0; k < slots; k++) {
            snprintf(name, sizeof name, "%s.state%u", e->name, k);
            loom_safetensors_copy_f32(ld->optim, loom_safetensors_find(ld->optim, name),
                                      state + (size_t)slots * e->offset + (size_t)k * e->numel,
                                      e->numel);
        }
    }
}

loom_status loom_checkpoint_load_data(loom_session *s, const char *ckpt_path, loom_data *data,
                                      loom_checkpoint_extra *out)
{
    loaded ld;
    memset(&ld, 0, sizeof ld);
    ld.dir = ckpt_path;
    if ((size_t)snprintf(ld.mpath, sizeof ld.mpath, "%s/%s", ckpt_path, LOOM_CKPT_MANIFEST_FILE) >=
        sizeof ld.mpath)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ckpt_path);
    loom_status st = validate(&ld, s, data);
    uint64_t old[LOOM_DATA_STATE_MAX];
    int n_old = 0;
    if (st == LOOM_OK && data) {
        n_old = data->ops->get_state(data->self, old);
        st = data->ops->set_state(data->self, ld.x.data_state, ld.x.n_data_state);
        if (st != LOOM_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", loom_last_error());
            st = loom_fail(st, "checkpoint '%s': data position refused: %s", ld.mpath, msg);
        }
    }
    if (st == LOOM_OK) {
        st = loom_session_set_state(s, &ld.state);
        if (st != LOOM_OK && data)
            data->ops->set_state(data->self, old, n_old);
    }
    if (st == LOOM_OK) {
        copy_in(&ld, s);
        if (out) {
            *out = ld.x;
            out->config_json = ld.config;
            ld.config = NULL;
        }
    }
    loaded_free(&ld);
    return st;
}

loom_status loom_checkpoint_load(loom_session *s, const char *ckpt_path, loom_checkpoint_extra *out)
{
    return loom_checkpoint_load_data(s, ckpt_path, NULL, out);
}

void loom_checkpoint_extra_free(loom_checkpoint_extra *e)
{
    if (!e)
        return;
    free((char *)e->config_json);
    e->config_json = NULL;
}
