/* checkpoint.c — saving checkpoints atomically, the `latest` marker, retention and finding
 * the checkpoint to resume from (see checkpoint.h; loading is checkpoint_load.c).
 *
 * What not: no validation of data checksums when finding (that is load's job: find only
 * checks that a checkpoint is complete); no recursive deletion — a checkpoint directory
 * holds plain files only (three, or 2 x tp x pp + 1), and removal never descends into
 * subdirectories, so a wrong path can cost at most the plain files of one directory.
 * The collective part (loom_ckpt_save_source) exchanges small host buffers over the
 * mesh's communicators (a communicator that only takes device memory, nccl, cannot
 * carry it; checkpoints read the session's buffers as host memory anyway).
 * Invariants: nothing is visible under a step_* name before all its files and the
 * directory are fsynced; `latest` is written last; names in `latest` are checked to be
 * step_<digits> before use (no path traversal).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* renameat2 */
#endif
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checksum.h"
#include "loom/plugin/comm.h"
#include "base/plugin_loader.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "base/status.h"
#include "compress.h"
#include "compress_ckpt.h"
#include "zero_ckpt.h"
#include "offload.h"
#include "session_ep.h"

#define LATEST_FILE "latest"
#define MAX_LATEST 256

/* --- small file-system helpers ----------------------------------------------------- */

static loom_status join(char *out, size_t len, const char *a, const char *b)
{
    if ((size_t)snprintf(out, len, "%s/%s", a, b) >= len)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s/%s' is too long", a, b);
    return LOOM_OK;
}

static loom_status fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return loom_fail(LOOM_ERR_IO, "cannot sync directory '%s': %s", path, strerror(e));
    }
    close(fd);
    return LOOM_OK;
}

static loom_status write_synced(const char *path, const char *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return loom_fail(LOOM_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, data + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return loom_fail(LOOM_ERR_IO, "cannot write '%s': %s", path, strerror(e));
        }
        done += (size_t)w;
    }
    /* Closed whether or not the sync worked (a failed fsync must not leak the fd). */
    int sync_err = fsync(fd) != 0 ? errno : 0;
    int close_err = close(fd) != 0 ? errno : 0;
    if (sync_err)
        return loom_fail(LOOM_ERR_IO, "cannot sync '%s' to disk: %s", path, strerror(sync_err));
    if (close_err)
        return loom_fail(LOOM_ERR_IO, "cannot write '%s': %s", path, strerror(close_err));
    return LOOM_OK;
}

/* Delete the plain files of a directory, then the directory. Subdirectories are left
 * (and then rmdir fails, which is reported). */
static int remove_flat(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        unlinkat(dirfd(d), e->d_name, 0); /* fails (EISDIR) on subdirectories: kept */
    }
    closedir(d);
    return rmdir(path);
}

static loom_status mkdir_p(const char *dir)
{
    char buf[PATH_MAX];
    if ((size_t)snprintf(buf, sizeof buf, "%s", dir) >= sizeof buf)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint directory '%s' is too long", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return loom_fail(LOOM_ERR_IO, "cannot create checkpoint directory '%s': %s", buf,
                                 strerror(errno));
            *p = c;
            if (!c)
                break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return loom_fail(LOOM_ERR_IO, "checkpoint directory '%s' is not a directory", dir);
    return LOOM_OK;
}

/* "step_<digits>" -> its number; -1 for any other name. */
static int64_t step_of(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || !name[5])
        return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* The directory name `latest` holds, "" if absent or not a step_* name. */
static void read_latest(const char *dir, char *name, size_t len)
{
    char path[PATH_MAX];
    name[0] = '\0';
    if (join(path, sizeof path, dir, LATEST_FILE) != LOOM_OK)
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char buf[MAX_LATEST] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    if (step_of(buf) >= 0 && n < len)
        memcpy(name, buf, n + 1);
}

/* --- writing one checkpoint -------------------------------------------------------- */

static void json_int_list(loom_strbuf *b, const int64_t *v, int n)
{
    loom_strbuf_puts(b, "[");
    for (int i = 0; i < n; i++)
        loom_strbuf_printf(b, "%s%" PRId64, i ? "," : "", v[i]);
    loom_strbuf_puts(b, "]");
}

/* The per-tensor __metadata__ value: logical shape and slice start. */
static char *slice_json(const loom_param_entry *e)
{
    loom_strbuf b;
    loom_strbuf_init(&b);
    loom_strbuf_puts(&b, "{\"shape\":");
    json_int_list(&b, e->shape, e->ndim);
    loom_strbuf_puts(&b, ",\"slice_start\":");
    json_int_list(&b, e->slice_start, e->ndim);
    loom_strbuf_puts(&b, "}");
    if (b.failed) {
        loom_strbuf_free(&b);
        return NULL;
    }
    return b.data;
}

loom_ckpt_tiling loom_ckpt_tiling_of(int ndim, const int64_t *shape, uint64_t elem_size)
{
    loom_ckpt_tiling g = {1, 1, 1, 1, 0, 0};
    for (int d = 0; d < ndim; d++) {
        uint64_t x = shape[d] > 0 ? (uint64_t)shape[d] : 0; /* a negative dim: the writer refuses it */
        if (d == ndim - 1)
            g.K = x;
        else
            g.R *= x;
    }
    if (!g.R || !g.K)
        return g;
    g.cols = g.K;
    if (g.K * elem_size > LOOM_CKPT_TILE_BYTES) {
        while (g.cols % 2 == 0 && g.cols * elem_size > LOOM_CKPT_TILE_BYTES)
            g.cols /= 2;
    } else {
        if (g.K % 8 == 0)
            g.cols = g.K / 8;
        g.rows = LOOM_CKPT_TILE_BYTES / (g.cols * elem_size);
        g.rows = g.rows < 1 ? 1 : g.rows > g.R ? g.R : g.rows;
    }
    g.row_blocks = (g.R + g.rows - 1) / g.rows;
    g.col_blocks = (g.K + g.cols - 1) / g.cols;
    return g;
}

/* The header's "loom.tiles" for tensors ts[0..n): what lets a load check only the tiles it
 * reads. NULL when out of memory. */
static char *tile_sums(const loom_st_tensor *ts, int n)
{
    size_t total = 0, at = 0;
    for (int i = 0; i < n; i++) {
        loom_ckpt_tiling g = loom_ckpt_tiling_of(ts[i].ndim, ts[i].shape, loom_dtype_size(ts[i].dtype));
        total += (size_t)(g.row_blocks * g.col_blocks);
    }
    char *hex = malloc(total * 16 + 1);
    if (!hex)
        return NULL;
    hex[0] = '\0';
    for (int i = 0; i < n; i++) {
        uint64_t es = loom_dtype_size(ts[i].dtype);
        loom_ckpt_tiling g = loom_ckpt_tiling_of(ts[i].ndim, ts[i].shape, es);
        const unsigned char *p = ts[i].data;
        for (uint64_t bi = 0; bi < g.row_blocks; bi++)
            for (uint64_t bj = 0; bj < g.col_blocks; bj++) {
                uint64_t c0 = bj * g.cols, w = g.K - c0 < g.cols ? g.K - c0 : g.cols;
                loom_xxh64_state h;
                loom_xxh64_init(&h);
                for (uint64_t r = bi * g.rows; r < (bi + 1) * g.rows && r < g.R; r++)
                    loom_xxh64_update(&h, p + (r * g.K + c0) * es, (size_t)(w * es));
                snprintf(hex + 16 * at++, 17, "%016" PRIx64, loom_xxh64_digest(&h));
            }
    }
    return hex;
}

loom_status loom_ckpt_write_tiled(const char *path, const loom_st_tensor *ts, int n,
                                  loom_st_meta *meta, int n_meta, uint64_t *bytes,
                                  uint64_t *sum, uint64_t *head)
{
    char *tiles = tile_sums(ts, n);
    if (!tiles)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory writing '%s'", path);
    meta[n_meta++] = (loom_st_meta){"loom.tiles", tiles};
    loom_status st = loom_safetensors_write(path, ts, n, meta, n_meta, bytes, sum);
    if (st == LOOM_OK)
        st = loom_ckpt_header_sum(path, head, NULL);
    free(tiles);
    return st;
}

/* Write model.safetensors (slots == 0) or optim.safetensors (slot-major state). */
static loom_status write_tensors(const char *path, const loom_param_table *t, const float *buf,
                                 uint32_t slots, int is_optim, const char *optim_name,
                                 const char *skip, uint64_t *bytes, uint64_t *sum, uint64_t *head)
{
    int per = is_optim ? (int)slots : 1, n = t->count * per, n_meta = 0;
    loom_st_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    loom_st_meta *meta = calloc((size_t)n + 5, sizeof *meta);
    char (*names)[LOOM_PARAM_NAME_MAX + 16] = calloc((size_t)n + 1, sizeof *names);
    char **slices = calloc((size_t)t->count + 1, sizeof *slices);
    char slots_text[16];
    loom_status st = LOOM_OK;
    if (!ts || !meta || !names || !slices)
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory writing '%s'", path);
    if (st == LOOM_OK) {
        meta[n_meta++] = (loom_st_meta){"format", "pt"};
        meta[n_meta++] = (loom_st_meta){"loom.format", LOOM_CHECKPOINT_FORMAT};
        if (is_optim) {
            snprintf(slots_text, sizeof slots_text, "%u", slots);
            meta[n_meta++] = (loom_st_meta){"loom.optimizer", optim_name};
            meta[n_meta++] = (loom_st_meta){"loom.slots", slots_text};
        }
    }
    int at = 0; /* tensors written */
    for (int i = 0; st == LOOM_OK && i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        if (skip && strcmp(e->name, skip) == 0)
            continue; /* another stage writes it */
        if (!(slices[i] = slice_json(e)))
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory writing '%s'", path);
        for (int k = 0; st == LOOM_OK && k < per; k++) {
            int j = at++;
            if (is_optim)
                snprintf(names[j], sizeof names[j], "%s.state%d", e->name, k);
            else
                snprintf(names[j], sizeof names[j], "%s", e->name);
            const float *src = is_optim ? buf + (size_t)slots * e->offset + (size_t)k * e->numel
                                        : buf + e->offset;
            ts[j] = (loom_st_tensor){names[j], LOOM_DTYPE_F32, e->ndim, e->slice_len, src};
            meta[n_meta++] = (loom_st_meta){names[j], slices[i]};
        }
    }
    if (st == LOOM_OK)
        st = loom_ckpt_write_tiled(path, ts, at, meta, n_meta, bytes, sum, head);
    for (int i = 0; slices && i < t->count; i++)
        free(slices[i]);
    free(slices);
    free(names);
    free(meta);
    free(ts);
    return st;
}

/* A written tensor file: its size, the XXH64 of all of it and of its header. */
typedef struct file_sum { char name[64]; uint64_t bytes, sum, head; } file_sum;

static loom_status write_manifest(const loom_ckpt_source *src, const char *path,
                                  const loom_checkpoint_extra *x, const char *config,
                                  size_t config_len, const file_sum *files, int n_files, int tp,
                                  int pp)
{
    const loom_session_state ss = src->state_info;
    const loom_gpt_config *mc = &src->model;
    loom_strbuf b;
    loom_strbuf_init(&b);
    loom_strbuf_printf(&b, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"loom_version\": \"%s\",\n"
                       "  \"step\": %" PRId64 ",\n  \"steps_taken\": %" PRId64 ",\n",
                       LOOM_CHECKPOINT_FORMAT, LOOM_CHECKPOINT_VERSION, LOOM_VERSION_STRING, x->step,
                       ss.steps);
    loom_strbuf_puts(&b, "  \"precision\": {\"state\": [");
    for (int i = 0; i < ss.n_precision_state; i++)
        loom_strbuf_printf(&b, "%s%.9g", i ? ", " : "", (double)ss.precision_state[i]);
    loom_strbuf_puts(&b, "], \"state_bits\": [");
    for (int i = 0; i < ss.n_precision_state; i++) {
        uint32_t bits;
        memcpy(&bits, &ss.precision_state[i], sizeof bits);
        loom_strbuf_printf(&b, "%s%" PRIu32, i ? ", " : "", bits);
    }
    loom_strbuf_puts(&b, "]},\n  \"optimizer\": {\"name\": ");
    loom_json_write_string(&b, src->optim_name);
    loom_strbuf_printf(&b, ", \"slots\": %u},\n", src->slots);
    loom_strbuf_printf(&b, "  \"model\": {\"vocab\": %d, \"vocab_padded\": %d, \"ctx\": %d, "
                       "\"layers\": %d, \"heads\": %d, \"dim\": %d", mc->vocab,
                       mc->vocab_padded, mc->ctx, mc->layers, mc->heads, mc->dim);
    const loom_moe_config *mo = &mc->moe;
    if (mo->experts) /* what rebuilds the model from the manifest (loom sample) needs */
        loom_strbuf_printf(&b, ", \"moe\": {\"experts\": %d, \"top_k\": %d, \"every\": %d, "
                           "\"capacity_factor\": %.17g, \"aux_loss\": %.17g, \"z_loss\": %.17g, "
                           "\"router\": \"%s\", \"noise_std\": %.17g}", mo->experts, mo->top_k,
                           mo->every, mo->capacity_factor, mo->aux_loss, mo->z_loss,
                           mo->noisy ? "noisy_topk" : "topk", mo->noise_std);
    if (mc->family == LOOM_FAMILY_LLAMA) /* what loom.llama{...} takes, for open_checkpoint */
        loom_strbuf_printf(&b, ", \"family\": \"llama\", \"kv_heads\": %d, \"ffn_dim\": %d, "
                           "\"rope_theta\": %.9g, \"norm_eps\": %.9g, \"tie_embeddings\": %s",
                           mc->kv_heads, mc->ffn_dim, (double)mc->rope_theta,
                           (double)mc->norm_eps, mc->tie_embeddings ? "true" : "false");
    loom_strbuf_puts(&b, "},\n");
    loom_strbuf_printf(&b, "  \"layout\": {\"tp\": %d", tp);
    if (pp > 1) { /* the loader remaps by name; the split is for people and tools */
        loom_strbuf_printf(&b, ", \"pp\": %d, \"pp_layers\": [", pp);
        for (int k = 0; src->pp_first && k < src->pp_virtual; k++)
            loom_strbuf_printf(&b, "%s%d", k ? ", " : "", src->pp_first[k + 1] - src->pp_first[k]);
        loom_strbuf_puts(&b, "]");
    }
    if (src->zero_stage > 0)
        loom_strbuf_printf(&b, ", \"zero\": %d, \"dp\": %d", src->zero_stage, src->zero_dp);
    if (src->pieces) /* which kinds are one file per dp rank (checkpoint.h) */
        loom_strbuf_printf(&b, ", \"slices\": [%s\"optim\"]", src->part_params ? "\"model\", " : "");
    loom_strbuf_puts(&b, "},\n");
    if (src->residual) {
        loom_strbuf_puts(&b, "  \"compress\": {\"method\": ");
        loom_json_write_string(&b, src->compress_method);
        loom_strbuf_printf(&b, ", \"dp\": %u%s", src->residual_slots,
                           src->residual_leaves ? ", \"leaves\": true" : "");
        if (src->residual_ep > 1)
            loom_strbuf_printf(&b, ", \"ep\": %d", src->residual_ep);
        loom_strbuf_puts(&b, "},\n");
    }
    if (x->data_kind[0]) {
        loom_strbuf_puts(&b, "  \"data\": {\"kind\": ");
        loom_json_write_string(&b, x->data_kind);
        loom_strbuf_puts(&b, ", \"state\": [");
        for (int i = 0; i < x->n_data_state; i++)
            loom_strbuf_printf(&b, "%s%" PRIu64, i ? ", " : "", x->data_state[i]);
        loom_strbuf_puts(&b, "]},\n");
    } else {
        loom_strbuf_puts(&b, "  \"data\": null,\n");
    }
    loom_strbuf_puts(&b, "  \"files\": {\n");
    for (int i = 0; i < n_files; i++)
        loom_strbuf_printf(&b, "    \"%s\": {\"bytes\": %" PRIu64 ", \"xxh64\": \"%016" PRIx64
                           "\", \"header_xxh64\": \"%016" PRIx64 "\"}%s\n", files[i].name,
                           files[i].bytes, files[i].sum, files[i].head, i + 1 < n_files ? "," : "");
    loom_strbuf_puts(&b, "  },\n  \"config\": ");
    if (config)
        loom_strbuf_append(&b, config, config_len);
    else
        loom_strbuf_puts(&b, "null");
    loom_strbuf_puts(&b, ",\n  \"checksum\": \"xxh64:");
    size_t digits = b.len;
    loom_strbuf_puts(&b, "0000000000000000\"\n}\n");
    loom_status st = LOOM_OK;
    if (b.failed) {
        st = loom_fail(LOOM_ERR_INVALID, "checkpoint manifest: out of memory or a name is not UTF-8");
    } else {
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, loom_xxh64(b.data, b.len));
        memcpy(b.data + digits, hex, 16);
        st = write_synced(path, b.data, b.len);
    }
    loom_strbuf_free(&b);
    return st;
}

/* The layout a save writes (checkpoint.h: slice files under ZeRO). */
static loom_ckpt_layout save_layout(const loom_ckpt_source *src, int tp, int pp, int dp)
{
    loom_ckpt_layout l = {tp, pp, src->pieces ? dp : 1, {0, 0, 0}};
    l.sliced[0] = src->pieces && src->part_params;
    l.sliced[1] = src->pieces != NULL;
    return l;
}

/* This rank's tensor files (part `part` of a tp x pp layout, dp rank d) into tmp: model,
 * optim and, with gradient compression, residual; a kind this rank does not write keeps
 * an empty name (slice files: dp ranks > 0 write only their slices). */
static loom_status write_part(const loom_ckpt_source *src, const char *tmp, int part, int d,
                              const loom_ckpt_layout *l, file_sum files[3])
{
    char path[PATH_MAX];
    int tp = l->tp, pp = l->pp;
    const char *skip = pp > 1 ? src->skip : NULL;
    for (int k = 0; k < 3; k++) /* file i of kind k: part * per + d */
        loom_ckpt_kind_name(files[k].name, sizeof files[k].name, l, k,
                            part * (l->sliced[k] ? l->dp : 1) + (l->sliced[k] ? d : 0));
    if (l->sliced[0]) {
        LOOM_TRY(join(path, sizeof path, tmp, files[0].name));
        LOOM_TRY(loom_ckpt_write_slices(path, src->table, src->pieces, src->n_pieces,
                                        src->part_params, 0, 0, NULL, skip, &files[0].bytes,
                                        &files[0].sum, &files[0].head));
    } else if (d == 0) {
        LOOM_TRY(join(path, sizeof path, tmp, files[0].name));
        LOOM_TRY(write_tensors(path, src->table, src->params, 0, 0, NULL, skip, &files[0].bytes,
                               &files[0].sum, &files[0].head));
    } else
        files[0].name[0] = '\0';
    LOOM_TRY(join(path, sizeof path, tmp, files[1].name));
    if (l->sliced[1])
        LOOM_TRY(loom_ckpt_write_slices(path, src->table, src->pieces, src->n_pieces,
                                        src->part_state, src->slots, 1, src->optim_name, skip,
                                        &files[1].bytes, &files[1].sum, &files[1].head));
    else
        LOOM_TRY(write_tensors(path, src->table, src->state, src->slots, 1, src->optim_name, skip,
                               &files[1].bytes, &files[1].sum, &files[1].head));
    if (!src->residual || d != 0) {
        files[2].name[0] = '\0';
        return LOOM_OK;
    }
    loom_ckpt_file_name(files[2].name, sizeof files[2].name, "residual", part, tp, pp);
    LOOM_TRY(join(path, sizeof path, tmp, files[2].name));
    /* fast mode, no skip: the last stage's tied wte has its own residual (its own dp
     * exchange), which only its residual file holds; a resume reads each stage's own file
     * (checkpoint_load.c). Canonical mode: the last stage sends no wte (compress.h), so
     * the files are disjoint as the model's, and a resume reads them all at any pp. */
    return write_tensors(path, src->table, src->residual, src->residual_slots, 1,
                         src->compress_method, src->residual_leaves ? skip : NULL,
                         &files[2].bytes, &files[2].sum, &files[2].head);
}

/* Put tmp in place as final; an existing final is swapped out and deleted. */
static loom_status install(const char *dir, const char *tmp, const char *final, const char *aside)
{
    struct stat sb;
    if (lstat(final, &sb) != 0) {
        if (rename(tmp, final) != 0)
            return loom_fail(LOOM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
        return fsync_dir(dir);
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        LOOM_TRY(fsync_dir(dir));
        remove_flat(tmp); /* now the old checkpoint */
        return LOOM_OK;
    }
    /* No atomic exchange here: the old one goes aside first (a crash in between leaves it
     * under a .tmp- name and `latest` may name a missing directory: find then falls back
     * to the newest complete one). */
    if (rename(final, aside) != 0)
        return loom_fail(LOOM_ERR_IO, "cannot replace '%s': %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        rename(aside, final);
        return loom_fail(LOOM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, final, strerror(e));
    }
    LOOM_TRY(fsync_dir(dir));
    remove_flat(aside);
    return LOOM_OK;
}

static loom_status write_latest(const char *dir, const char *name)
{
    char tmp[PATH_MAX], path[PATH_MAX], line[MAX_LATEST];
    char tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-latest.%ld", (long)getpid());
    LOOM_TRY(join(tmp, sizeof tmp, dir, tmp_name));
    LOOM_TRY(join(path, sizeof path, dir, LATEST_FILE));
    int n = snprintf(line, sizeof line, "%s\n", name);
    LOOM_TRY(write_synced(tmp, line, (size_t)n));
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return loom_fail(LOOM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(e));
    }
    return fsync_dir(dir);
}

/* --- retention and finding --------------------------------------------------------- */

typedef struct found { int64_t step; char name[64]; } found;

static int newest_first(const void *a, const void *b)
{
    int64_t x = ((const found *)a)->step, y = ((const found *)b)->step;
    return (x < y) - (x > y);
}

/* Complete step_* checkpoints in dir, newest first; *n of them (malloc'd list). */
static loom_status list_complete(const char *dir, found **out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return loom_fail(LOOM_ERR_IO, "cannot read checkpoint directory '%s': %s", dir, strerror(errno));
    found *list = NULL;
    int count = 0, cap = 0;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d))) {
        int64_t step = step_of(e->d_name);
        if (step < 0 || strlen(e->d_name) >= sizeof list->name ||
            join(path, sizeof path, dir, e->d_name) != LOOM_OK || !loom_ckpt_is_complete(path))
            continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            found *l = realloc(list, (size_t)cap * sizeof *l);
            if (!l) {
                free(list);
                closedir(d);
                return loom_fail(LOOM_ERR_NOMEM, "out of memory listing '%s'", dir);
            }
            list = l;
        }
        list[count].step = step;
        snprintf(list[count].name, sizeof list[count].name, "%s", e->d_name);
        count++;
    }
    closedir(d);
    if (count > 1)
        qsort(list, (size_t)count, sizeof *list, newest_first);
    *out = list;
    *n = count;
    return LOOM_OK;
}

/* Remove .tmp-* entries whose writing process is gone (pid after the last '.'). */
static void remove_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d))) {
        const char *dot = strrchr(e->d_name, '.');
        if (strncmp(e->d_name, ".tmp-", 5) != 0 || !dot || !dot[1])
            continue;
        char *end;
        long pid = strtol(dot + 1, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* its writer is alive (or not ours to judge): leave it */
        if (join(path, sizeof path, dir, e->d_name) == LOOM_OK && remove_flat(path) != 0)
            unlink(path); /* a .tmp-latest file */
    }
    closedir(d);
}

static void apply_retention(const char *dir, int keep, const char *protect)
{
    remove_stale(dir);
    if (keep <= 0)
        return;
    found *list;
    int n;
    if (list_complete(dir, &list, &n) != LOOM_OK)
        return;
    char latest[64], path[PATH_MAX], gone[PATH_MAX], gone_name[96];
    read_latest(dir, latest, sizeof latest);
    for (int i = keep > 1 ? keep : 1; i < n; i++) { /* list[0], the newest, always stays */
        /* renamed out of the step_* names first: a crash while deleting leaves a .tmp-
         * entry for the next save to remove, never a half-deleted step_* */
        snprintf(gone_name, sizeof gone_name, ".tmp-del-%s.%ld", list[i].name, (long)getpid());
        if (strcmp(list[i].name, latest) != 0 && strcmp(list[i].name, protect) != 0 && join(path, sizeof path, dir, list[i].name) == LOOM_OK &&
            join(gone, sizeof gone, dir, gone_name) == LOOM_OK && rename(path, gone) == 0)
            remove_flat(gone);
    }
    free(list);
    fsync_dir(dir);
}

/* --- the collective save ---------------------------------------------------------- */

static loom_status g_bcast(const loom_ckpt_group *g, void *buf, size_t n, int root)
{
    if (!g->ops || g->size <= 1)
        return LOOM_OK;
    loom_comm_request *req = NULL;
    LOOM_TRY(g->ops->broadcast_start(g->comm, buf, n, LOOM_DTYPE_U8, root, &req));
    return g->ops->wait(g->comm, req);
}

static loom_status g_allgather(const loom_ckpt_group *g, const void *send, void *recv, size_t n)
{
    if (!g->ops || g->size <= 1) {
        memcpy(recv, send, n);
        return LOOM_OK;
    }
    loom_comm_request *req = NULL;
    LOOM_TRY(g->ops->allgather_start(g->comm, send, recv, n, LOOM_DTYPE_U8, &req));
    return g->ops->wait(g->comm, req);
}

/* What tp rank 0 tells the writers: the temp directory exists (and whose pid names it). */
typedef struct hello { int32_t ok, pad; int64_t pid; } hello;

/* What every writer tells tp rank 0 after writing its files. */
typedef struct report {
    int32_t status, pad;
    file_sum files[3];
    char msg[400];
} report;

/* Who wrote part `part` of a tp x pp layout, for messages. */
static void writer_name(char *out, size_t len, int part, int tp, int pp)
{
    if (pp > 1)
        snprintf(out, len, "stage %d tp rank %d", part / tp, part % tp);
    else
        snprintf(out, len, "tp rank %d", part);
}

static void report_status(report *r, loom_status st)
{
    r->status = (int32_t)st;
    if (st != LOOM_OK)
        snprintf(r->msg, sizeof r->msg, "%s", loom_last_error());
}

/* Stage 0's tp rank 0, all parts written: check they are there, write the manifest,
 * install. all[part * W + d], part = stage * tp + tp rank, d the dp rank (W = 1 without
 * slice files: dp rank 0 writes all). */
static loom_status finish(const loom_ckpt_source *src, const char *dir, const char *tmp,
                          const char *final, const char *aside, const char *name,
                          const loom_checkpoint_extra *x, const char *config, size_t config_len,
                          const report *all, const loom_ckpt_layout *l)
{
    char path[PATH_MAX];
    int tp = l->tp, pp = l->pp, kinds = src->residual ? 3 : 2, W = l->dp, n_files = 0;
    for (int k = 0; k < kinds; k++)
        n_files += loom_ckpt_kind_count(l, k);
    file_sum *files = calloc((size_t)n_files, sizeof *files);
    if (!files)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory saving '%s'", final);
    loom_status st = LOOM_OK;
    for (int k = 0, at = 0; k < kinds && st == LOOM_OK; k++)
        for (int i = 0; i < loom_ckpt_kind_count(l, k) && st == LOOM_OK; i++) {
            int per = l->sliced[k] ? W : 1, r = i / per, d = i % per;
            file_sum f = all[r * W + d].files[k];
            f.name[sizeof f.name - 1] = '\0';
            char want[64], who[64];
            loom_ckpt_kind_name(want, sizeof want, l, k, i);
            writer_name(who, sizeof who, r, tp, pp);
            if (W > 1)
                snprintf(who + strlen(who), sizeof who - strlen(who), " dp rank %d", d);
            struct stat sb;
            if (strcmp(f.name, want) != 0)
                st = loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %s reports file '%s', '%s' "
                               "expected (do all ranks agree on the tp and pp degrees?)", tmp, who,
                               f.name, want);
            else if ((st = join(path, sizeof path, tmp, f.name)) == LOOM_OK &&
                     (stat(path, &sb) != 0 || (uint64_t)sb.st_size != f.bytes))
                st = loom_fail(LOOM_ERR_IO, "checkpoint '%s': %s wrote %" PRIu64 " bytes but this "
                               "rank sees %s (is the directory on a file system all ranks "
                               "share?)", path, who, f.bytes, "another size or no file");
            files[at++] = f; /* manifest order: model files, then optim (then residual) */
        }
    if (st == LOOM_OK)
        st = join(path, sizeof path, tmp, LOOM_CKPT_MANIFEST_FILE);
    if (st == LOOM_OK)
        st = write_manifest(src, path, x, config, config_len, files, n_files, tp, pp);
    free(files);
    if (st == LOOM_OK)
        st = fsync_dir(tmp);
    if (st == LOOM_OK)
        st = install(dir, tmp, final, aside);
    if (st != LOOM_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        remove_flat(tmp);
        return loom_fail(st, "%s", msg);
    }
    LOOM_TRY(write_latest(dir, name));
    apply_retention(dir, x->keep, x->protect);
    return LOOM_OK;
}

loom_status loom_ckpt_save_source(const loom_ckpt_source *src, const loom_ckpt_groups *g,
                                  const char *dir, const loom_checkpoint_extra *x,
                                  char *out_path, size_t len)
{
    /* Argument checks: the same on every rank (same recipe), so all return here together. */
    if (x->step < 0 || x->keep < 0 || x->n_data_state < 0 || x->n_data_state > LOOM_DATA_STATE_MAX)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint step=%" PRId64 " keep=%d data words=%d: "
                         "step and keep must be >= 0, data words 0 to %d", x->step, x->keep,
                         x->n_data_state, LOOM_DATA_STATE_MAX);
    if (g->tp.size < 1 || g->tp.size > LOOM_CKPT_TP_MAX)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint: tp=%d (1 to %d supported)", g->tp.size,
                         LOOM_CKPT_TP_MAX);
    if (g->pp.size > 1 && (int64_t)g->pp.size * g->tp.size > LOOM_CKPT_TP_MAX)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint: tp=%d x pp=%d parts (1 to %d supported)",
                         g->tp.size, g->pp.size, LOOM_CKPT_TP_MAX);
    const char *config = NULL;
    size_t config_len = 0;
    if (x->config_json) {
        loom_json_doc *doc;
        loom_json_error err;
        loom_status parsed = loom_json_parse(x->config_json, strlen(x->config_json), NULL, &doc, &err);
        if (parsed == LOOM_ERR_NOMEM)
            return loom_fail(parsed, "checkpoint: out of memory parsing the recipe's config_json");
        if (parsed != LOOM_OK)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint config_json is not valid JSON at byte "
                             "%zu: %s", err.offset, err.msg);
        const loom_json *root = loom_json_root(doc);
        int is_object = root->type == LOOM_JSON_OBJECT;
        config = x->config_json + root->begin;
        config_len = root->end - root->begin;
        loom_json_free(doc);
        if (!is_object)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint config_json must be a JSON object");
    }
    char name[64], tmp_name[96], tmp[PATH_MAX], final[PATH_MAX], aside[PATH_MAX];
    snprintf(name, sizeof name, "step_%08" PRId64, x->step);
    LOOM_TRY(join(final, sizeof final, dir, name));
    int tp = g->tp.size, pp = g->pp.size > 1 ? g->pp.size : 1, stage = pp > 1 ? g->pp.rank : 0;
    int parts = tp * pp, creator = g->tp.rank == 0 && stage == 0;
    report *all = NULL;
    /* From here on every rank takes part in every exchange whatever happens locally; only a
     * failing exchange (the communicator's timeout or a dead peer) returns early. */
    loom_status st = LOOM_OK;
    int relayed = 0; /* st is another rank's failure passed on */
    /* Slice files (checkpoint.h): every dp rank writes its own; else dp rank 0 writes all. */
    loom_ckpt_layout lay = save_layout(src, tp, pp, g->dp.size > 1 ? g->dp.size : 1);
    int W = lay.dp, d = W > 1 ? g->dp.rank : 0;
    hello h = {0, 0, (int64_t)getpid()};
    if (g->dp.rank == 0) {
        if (creator) {
            st = mkdir_p(dir);
            if (st == LOOM_OK) {
                snprintf(tmp_name, sizeof tmp_name, ".tmp-%s.%ld", name, (long)getpid());
                st = join(tmp, sizeof tmp, dir, tmp_name);
            }
            if (st == LOOM_OK) {
                snprintf(tmp_name, sizeof tmp_name, ".tmp-old-%s.%ld", name, (long)getpid());
                st = join(aside, sizeof aside, dir, tmp_name);
            }
            if (st == LOOM_OK) {
                remove_flat(tmp);
                if (mkdir(tmp, 0755) != 0)
                    st = loom_fail(LOOM_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
            }
            h.ok = st == LOOM_OK;
        }
        if (pp > 1 && g->tp.rank == 0) /* stage 0 to every stage's tp rank 0 */
            LOOM_TRY(g_bcast(&g->pp, &h, sizeof h, 0));
        LOOM_TRY(g_bcast(&g->tp, &h, sizeof h, 0));
    }
    if (W > 1) /* dp rank 0 to the others of its dp group */
        LOOM_TRY(g_bcast(&g->dp, &h, sizeof h, 0));
    if (g->dp.rank == 0 || W > 1) {
        if (st == LOOM_OK && !h.ok)
            relayed = 1, st = loom_fail(LOOM_ERR_IO, "checkpoint '%s': %s could not create the "
                                        "temporary directory (its message says why)", final,
                                        pp > 1 ? "stage 0's tp rank 0" : "tp rank 0");
        snprintf(tmp_name, sizeof tmp_name, ".tmp-%s.%ld", name, (long)h.pid);
        if (st == LOOM_OK)
            st = join(tmp, sizeof tmp, dir, tmp_name);
        report mine;
        memset(&mine, 0, sizeof mine);
        if (st == LOOM_OK)
            st = write_part(src, tmp, stage * tp + g->tp.rank, d, &lay, mine.files);
        report_status(&mine, st);
        /* reports: over dp (slice files), then tp, then pp, stage-major */
        if (!(all = calloc((size_t)parts * W, sizeof *all)))
            return loom_fail(LOOM_ERR_NOMEM, "out of memory saving '%s'", final);
        report *dp_all = W > 1 ? calloc((size_t)W, sizeof *dp_all) : NULL;
        report *stage_all = pp > 1 ? calloc((size_t)tp * W, sizeof *stage_all) : all;
        if (!stage_all || (W > 1 && !dp_all)) {
            free(all), free(dp_all);
            if (stage_all != all)
                free(stage_all);
            return loom_fail(LOOM_ERR_NOMEM, "out of memory saving '%s'", final);
        }
        loom_status cst = W > 1 ? g_allgather(&g->dp, &mine, dp_all, sizeof mine) : LOOM_OK;
        if (cst == LOOM_OK && g->dp.rank == 0)
            cst = g_allgather(&g->tp, W > 1 ? dp_all : &mine, stage_all, (size_t)W * sizeof mine);
        if (cst == LOOM_OK && g->dp.rank == 0 && pp > 1 && g->tp.rank == 0)
            cst = g_allgather(&g->pp, stage_all, all, (size_t)tp * W * sizeof mine);
        free(dp_all);
        if (stage_all != all)
            free(stage_all);
        if (cst != LOOM_OK) {
            free(all);
            return cst;
        }
        if (creator && g->dp.rank == 0) {
            for (int r = 0; r < parts * W && st == LOOM_OK; r++)
                if (all[r].status != LOOM_OK) {
                    char who[64];
                    writer_name(who, sizeof who, r / W, tp, pp);
                    if (W > 1)
                        snprintf(who + strlen(who), sizeof who - strlen(who), " dp rank %d", r % W);
                    all[r].msg[sizeof all[r].msg - 1] = '\0';
                    relayed = 1;
                    st = loom_fail((loom_status)all[r].status, "checkpoint '%s': %s could not "
                                   "write its files: %s", final, who, all[r].msg);
                }
            if (st == LOOM_OK)
                st = finish(src, dir, tmp, final, aside, name, x, config, config_len, all, &lay);
            else
                remove_flat(tmp);
        }
        free(all);
    }
    /* Everyone learns everyone's outcome: no rank runs ahead, all fail if one did. */
    int n_world = g->world.size > 0 ? g->world.size : 1;
    int32_t mine_w[2] = {(int32_t)st, relayed}, (*outcome)[2] = calloc((size_t)n_world, sizeof *outcome);
    if (!outcome)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory saving '%s'", final);
    loom_status cst = g_allgather(&g->world, mine_w, outcome, sizeof mine_w);
    int failed = -1; /* the first rank that failed on its own, else the first that failed */
    for (int r = 0; cst == LOOM_OK && r < n_world; r++)
        if (outcome[r][0] != LOOM_OK && (failed < 0 || (outcome[failed][1] && !outcome[r][1])))
            failed = r;
    loom_status other = failed >= 0 ? (loom_status)outcome[failed][0] : LOOM_OK;
    free(outcome);
    if (cst != LOOM_OK || st != LOOM_OK)
        return cst != LOOM_OK ? cst : st;
    if (failed >= 0)
        return loom_fail(other, "checkpoint '%s': the save failed on world rank %d (its message "
                         "says why)", final, failed);
    if (out_path && (size_t)snprintf(out_path, len, "%s", final) >= len)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' does not fit the caller's buffer "
                         "(%zu bytes)", final, len);
    return LOOM_OK;
}

static loom_status host_group(loom_group which, loom_ckpt_group *out)
{
    memset(out, 0, sizeof *out);
    LOOM_TRY(loom_core_host()->group(which, &out->ops, &out->comm, &out->size));
    if (!out->ops || !out->comm) {
        out->ops = NULL;
        out->comm = NULL;
        out->size = 1;
    }
    out->rank = out->ops ? out->ops->rank(out->comm) : 0;
    return LOOM_OK;
}

/* Every dp rank's compression residual (collective over dp), laid out slot-major per
 * entry with slot k = dp rank k, as write_tensors takes optimizer state; in canonical
 * mode each rank holds its micro-batches' (compress.h), and slot k = global micro-batch k
 * (rank-major, the order they are gathered in). */
static loom_status gather_residuals(loom_compress *c, const loom_ckpt_group *dp,
                                    const loom_param_table *t, float **out)
{
    size_t floats, per = (size_t)loom_compress_residual_slots(c);
    const float *mine = loom_compress_residual(c, &floats);
    size_t n = (size_t)dp->size * per, total = floats / per;
    float *all = malloc(n * total * sizeof(float)), *slots = calloc(n * total, sizeof(float));
    loom_status st = all && slots ? g_allgather(dp, mine, all, floats * sizeof(float))
                                  : loom_fail(LOOM_ERR_NOMEM, "checkpoint: out of memory for the "
                                              "compression residuals (%zu MiB)",
                                              n * total * sizeof(float) >> 20);
    for (int i = 0; st == LOOM_OK && i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        for (size_t k = 0; k < n; k++)
            memcpy(slots + n * e->offset + k * e->numel, all + k * total + e->offset,
                   e->numel * sizeof(float));
    }
    free(all);
    if (st != LOOM_OK) {
        free(slots);
        return st;
    }
    *out = slots;
    return LOOM_OK;
}

static loom_status save_zero(loom_session *s, loom_ckpt_source *srcp, const loom_ckpt_groups *gp,
                             const char *dir, const loom_checkpoint_extra *x, char *out_path,
                             size_t len);

loom_status loom_checkpoint_save(loom_session *s, const char *dir, const loom_checkpoint_extra *x,
                                 char *out_path, size_t len)
{
    loom_ckpt_source src;
    memset(&src, 0, sizeof src);
    loom_gpt *m = loom_session_model(s);
    src.table = loom_gpt_params(m);
    loom_session_to_host(s); /* a device backend's parameters and state into host mirrors */
    src.params = loom_session_host_params(s);
    src.state = loom_session_optim_state(s, &src.slots);
    src.optim_name = loom_session_optim_config(s)->desc->name;
    src.model = *loom_gpt_get_config(m);
    loom_session_get_state(s, &src.state_info);
    loom_ckpt_groups g;
    LOOM_TRY(host_group(LOOM_GROUP_WORLD, &g.world));
    LOOM_TRY(host_group(LOOM_GROUP_DP, &g.dp));
    LOOM_TRY(host_group(LOOM_GROUP_TP, &g.tp));
    LOOM_TRY(host_group(LOOM_GROUP_PP, &g.pp));
    if (g.pp.size > 1) {
        if (g.pp.size != loom_session_pipeline_stages(s))
            return loom_fail(LOOM_ERR_INTERNAL, "checkpoint: the pp group has %d ranks but the "
                             "session %d stages", g.pp.size, loom_session_pipeline_stages(s));
        src.pp_first = loom_session_pipeline_split(s, &src.pp_virtual);
        /* the tied wte: stage 0 writes it, the last stage's copy has the same bits */
        if (g.pp.rank == g.pp.size - 1)
            src.skip = "wte";
    }
    float *residual = NULL;
    loom_compress *c = loom_session_compress(s);
    if (c)
        LOOM_TRY(gather_residuals(c, &g.dp, src.table, &residual));
    src.residual = residual;
    src.residual_slots = (uint32_t)g.dp.size * (uint32_t)(c ? loom_compress_residual_slots(c) : 1);
    src.residual_leaves = c && loom_compress_canonical(c);
    src.compress_method = c ? loom_compress_method_name(loom_compress_method_in_use(c)) : NULL;
    /* offload (offload.h): the state this rank steps is in the pool or file; a copy of it
     * in host memory for the save, released after */
    loom_offload *off = loom_session_offload_state(s);
    float *offloaded = NULL;
    loom_status st = LOOM_OK;
    if (off) {
        offloaded = malloc(loom_offload_floats(off) * sizeof(float) + 1);
        st = offloaded ? loom_offload_read_state(off, offloaded)
                       : loom_fail(LOOM_ERR_NOMEM, "checkpoint: out of memory for a copy of the "
                                   "offloaded optimizer state (%zu MiB)",
                                   loom_offload_floats(off) * sizeof(float) >> 20);
        src.state = offloaded; /* without ZeRO; ZeRO's partition: save_zero */
    }
    if (st == LOOM_OK)
        st = save_zero(s, &src, &g, dir, x, out_path, len);
    free(offloaded);
    free(residual);
    return st;
}

/* The rest of loom_checkpoint_save: ZeRO's partitions assembled first. */
static loom_status save_zero(loom_session *s, loom_ckpt_source *srcp, const loom_ckpt_groups *gp,
                             const char *dir, const loom_checkpoint_extra *x, char *out_path,
                             size_t len)
{
    loom_ckpt_source src = *srcp;
    const loom_ckpt_groups g = *gp;
    loom_ep *ep = loom_session_ep(s);
    if (ep) { /* expert parallelism: the whole model gathered, saved as ep=1 saves it (every
               * expert by logical name), so any ep loads it (session_ep.h) */
        loom_gpt *m = loom_session_model(s);
        loom_param_table full;
        float *params, *state, *zstate = NULL; /* ZeRO-1: this rank's state, whole first */
        if (loom_session_zero(s))
            LOOM_TRY(loom_zero_full_state(loom_session_zero(s), src.slots, &zstate));
        /* ZeRO-3: every unit gathered for the copy, released after (no-op below stage 3) */
        loom_status st = loom_session_zero(s) ? loom_zero_pin_params(loom_session_zero(s), 1)
                                              : LOOM_OK;
        if (st == LOOM_OK && loom_session_zero_stage(s) == 3)
            loom_session_to_host(s); /* a device's mirror again, now every unit is gathered */
        if (st == LOOM_OK)
            st = loom_ep_gather_full(ep, m, src.params, zstate ? zstate : src.state, src.slots,
                                     &full, &params, &state);
        if (loom_session_zero(s)) {
            loom_status u = loom_zero_pin_params(loom_session_zero(s), 0);
            st = st == LOOM_OK ? u : st;
        }
        free(zstate);
        LOOM_TRY(st);
        float *residual = NULL; /* compression: every dp rank's, laid out for the full table */
        if (src.residual)
            st = loom_ckpt_residual_ep(m, src.table, src.residual, src.residual_slots,
                                       loom_gpt_expert_parallel(m), &full, &residual);
        src.table = &full;
        src.params = params;
        src.state = state;
        src.residual = residual;
        src.residual_ep = loom_gpt_expert_parallel(m);
        if (st == LOOM_OK)
            st = loom_ckpt_save_source(&src, &g, dir, x, out_path, len);
        free(residual);
        free(params);
        free(state);
        loom_params_free(&full);
        return st;
    }
    loom_zero *z = loom_session_zero(s);
    if (!z)
        return loom_ckpt_save_source(&src, &g, dir, x, out_path, len);
    /* ZeRO: every dp rank writes its own partition (checkpoint.h "Slice files"), straight
     * from its buffers; nothing is gathered. */
    loom_zero_piece *p = NULL;
    size_t n = 0, floats;
    LOOM_TRY(loom_zero_pieces(z, loom_zero_rank(z), &p, &n));
    src.pieces = p;
    src.n_pieces = n;
    src.part_state = loom_zero_state(z, &floats);
    if (loom_session_offload_state(s)) /* the partition's state, copied out of the offload */
        src.part_state = src.state;
    float *params_copy = NULL; /* offload params: the partition read out of the offload */
    loom_status st = loom_zero_read_part_params(z, &src.part_params, &params_copy);
    src.state = NULL;
    src.zero_stage = loom_zero_stage(z);
    src.zero_dp = loom_zero_ranks(z);
    if (st == LOOM_OK)
        st = loom_ckpt_save_source(&src, &g, dir, x, out_path, len);
    free(params_copy);
    free(p);
    return st;
}

loom_status loom_checkpoint_find(const char *dir, char *out, size_t len)
{
    char latest[64], path[PATH_MAX];
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return loom_fail(LOOM_ERR_IO, "no checkpoint directory '%s'", dir);
    read_latest(dir, latest, sizeof latest);
    const char *pick = NULL;
    found *list = NULL;
    int n = 0;
    if (latest[0] && join(path, sizeof path, dir, latest) == LOOM_OK && loom_ckpt_is_complete(path)) {
        pick = latest;
    } else {
        LOOM_TRY(list_complete(dir, &list, &n));
        if (n > 0)
            pick = list[0].name;
    }
    loom_status st = LOOM_OK;
    if (!pick)
        st = loom_fail(LOOM_ERR_IO, "no complete checkpoint in '%s'%s%s%s", dir,
                       latest[0] ? " (latest names '" : "", latest, latest[0] ? "', which is "
                       "missing or incomplete)" : "");
    else if ((size_t)snprintf(out, len, "%s/%s", dir, pick) >= len)
        st = loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s/%s' does not fit the caller's buffer",
                       dir, pick);
    free(list);
    return st;
}
