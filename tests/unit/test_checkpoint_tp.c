/* test_checkpoint_tp.c — checkpoints across tensor-parallel layouts, below the session:
 * parameter tables built by hand (loom_params_add + loom_params_slice_last, a GPT block's
 * shapes with qkv as (3, C, C) split on dim 1), values a function of (parameter, logical
 * index, optimizer slot), saved by the collective loom_ckpt_save_source from threads that
 * play the ranks of a dp x tp mesh over an in-process communicator, and loaded with
 * loom_ckpt_load_tensors into other layouts: every element checked. Also the refusals
 * (a missing piece, another logical shape, pieces that overlap inconsistently, an unknown
 * tensor, a damaged tp file) and a writer that fails (every rank reports it, nothing is
 * left behind; a tp rank 0 that cannot make the directory). Pipeline stages (a dp x tp x
 * pp mesh, each stage holding part of the table, the shared wte written by stage 0 only)
 * save one file pair per (stage, tp rank) that loads into every tp layout, and a failing
 * writer on the last stage is named on stage 0. Loads are ranged: a tp=2 (tp=4) rank reads
 * half (a quarter) of a tp=1 checkpoint, row and column splits, a damaged tile stops only the
 * rank that reads it, and an older manifest without header checksums is read whole. Also
 * built with AddressSanitizer + UBSan (unit_checkpoint_tp_asan).
 */
#include <check.h>
#include <dirent.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "io/checksum.h"
#include "io/json.h"
#include "loom/plugin/comm.h"

enum { C = 8, V = 12, SLOTS = 2, MAX_RANKS = 16 };

static char root[256];

/* --- an in-process communicator: one group of threads, collectives over a barrier ---- */

typedef struct fworld {
    pthread_barrier_t bar;
    int size;
    const void *buf[MAX_RANKS];
} fworld;

typedef struct fcomm {
    fworld *w;
    int rank;
} fcomm;

static int f_rank(void *self) { return ((fcomm *)self)->rank; }
static int f_world(void *self) { return ((fcomm *)self)->w->size; }

static loom_status f_allgather(void *self, const void *send, void *recv, size_t count,
                               loom_dtype dt, loom_comm_request **req)
{
    fcomm *c = self;
    ck_assert_int_eq(dt, LOOM_DTYPE_U8);
    c->w->buf[c->rank] = send;
    pthread_barrier_wait(&c->w->bar);
    for (int r = 0; r < c->w->size; r++)
        memcpy((char *)recv + (size_t)r * count, c->w->buf[r], count);
    pthread_barrier_wait(&c->w->bar);
    *req = NULL;
    return LOOM_OK;
}

static loom_status f_broadcast(void *self, void *buf, size_t count, loom_dtype dt, int root_rank,
                               loom_comm_request **req)
{
    fcomm *c = self;
    ck_assert_int_eq(dt, LOOM_DTYPE_U8);
    if (c->rank == root_rank)
        c->w->buf[root_rank] = buf;
    pthread_barrier_wait(&c->w->bar);
    if (c->rank != root_rank)
        memcpy(buf, c->w->buf[root_rank], count);
    pthread_barrier_wait(&c->w->bar);
    *req = NULL;
    return LOOM_OK;
}

static loom_status f_barrier(void *self, loom_comm_request **req)
{
    pthread_barrier_wait(&((fcomm *)self)->w->bar);
    *req = NULL;
    return LOOM_OK;
}

static loom_status f_wait(void *self, loom_comm_request *req) { return LOOM_OK; }

static const loom_comm_ops fake_ops = {
    .size = sizeof(loom_comm_ops), .rank = f_rank, .world = f_world,
    .allgather_start = f_allgather, .broadcast_start = f_broadcast,
    .barrier_start = f_barrier, .wait = f_wait};

/* --- hand-built tables ------------------------------------------------------------- */

typedef enum variant {
    NORMAL = 0,
    NO_FC,         /* lacks fc.weight */
    WIDE_PROJ,     /* proj.weight is (C, 2C) */
    PROJ_BY_COL,   /* proj.weight split on dim 1 instead of 0 */
    BAD_DIM,       /* tp rank 1's ln.weight claims a negative length: writing it fails */
    BIG            /* tensors of many 16 KiB chunks, for ranged reads (see build_big) */
} variant;

/* A row split (1024, 256), a column split with rows of four tiles (16, 16384), one with
 * 1 KiB rows (512, 256) and a replicated vector: about 2.5 MiB of weights, so what a load
 * reads shows in whole tiles. */
static void build_big(loom_param_table *t, int tp, int part)
{
    int64_t row[2] = {1024, 256}, col[2] = {16, 16384}, narrow[2] = {512, 256}, ln[1] = {256};
    ck_assert_int_eq(loom_params_add(t, "row.weight", 2, row, 0, LOOM_INIT_ZEROS, 0), LOOM_OK);
    ck_assert_int_eq(loom_params_slice_last(t, 0, tp, part), LOOM_OK);
    ck_assert_int_eq(loom_params_add(t, "col.weight", 2, col, 0, LOOM_INIT_ZEROS, 0), LOOM_OK);
    ck_assert_int_eq(loom_params_slice_last(t, 1, tp, part), LOOM_OK);
    ck_assert_int_eq(loom_params_add(t, "narrow.weight", 2, narrow, 0, LOOM_INIT_ZEROS, 0), LOOM_OK);
    ck_assert_int_eq(loom_params_slice_last(t, 1, tp, part), LOOM_OK);
    ck_assert_int_eq(loom_params_add(t, "ln.weight", 1, ln, 0, LOOM_INIT_ZEROS, 0), LOOM_OK);
}

/* A GPT block's worth of parameters as tp rank `part` of `tp` holds them; with pp = 2
 * stage 0 holds wte, ln and qkv, stage 1 wte (tied), proj and fc. */
static void build(loom_param_table *t, int tp, int part, variant v, int stage, int pp)
{
    memset(t, 0, sizeof *t);
    if (v == BIG) {
        build_big(t, tp, part);
        return;
    }
    int64_t wte[2] = {V, C}, ln[1] = {C}, qkv[3] = {3, C, C}, qkvb[2] = {3, C},
            proj[2] = {C, v == WIDE_PROJ ? 2 * C : C}, fc[2] = {4 * C, C};
#define ADD(name, nd, shape, dim)                                                            \
    do {                                                                                     \
        int first_half = strncmp(name, "ln", 2) == 0 || strncmp(name, "qkv", 3) == 0;       \
        if (pp == 2 && strcmp(name, "wte") != 0 && first_half != (stage == 0))               \
            break;                                                                           \
        ck_assert_int_eq(loom_params_add(t, name, nd, shape, 0, LOOM_INIT_ZEROS, 0), LOOM_OK); \
        if ((dim) >= 0)                                                                      \
            ck_assert_int_eq(loom_params_slice_last(t, dim, tp, part), LOOM_OK);             \
    } while (0)
    ADD("wte", 2, wte, -1);           /* replicated */
    ADD("ln.weight", 1, ln, -1);
    ADD("qkv.weight", 3, qkv, 1);     /* column parallel: heads split */
    ADD("qkv.bias", 2, qkvb, 1);
    ADD("proj.weight", 2, proj, v == PROJ_BY_COL && part == 1 ? 1 : 0);
    ADD("proj.bias", 1, ln, -1);
    if (v != NO_FC || part != 1)
        ADD("fc.weight", 2, fc, 0);
#undef ADD
}

/* Logical (row-major in the full shape) index of held element j of e. */
static uint64_t logical(const loom_param_entry *e, size_t j)
{
    int64_t idx[LOOM_PARAM_MAX_DIMS];
    for (int d = e->ndim - 1; d >= 0; d--) {
        idx[d] = e->slice_start[d] + (int64_t)(j % (size_t)e->slice_len[d]);
        j /= (size_t)e->slice_len[d];
    }
    uint64_t li = 0;
    for (int d = 0; d < e->ndim; d++)
        li = li * (uint64_t)e->shape[d] + (uint64_t)idx[d];
    return li;
}

static float value(const char *name, uint64_t li, int slot)
{
    unsigned h = 0;
    for (const char *p = name; *p; p++)
        h = h * 31 + (unsigned char)*p;
    return (float)(h % 97) * 1000.0f + (float)li + (float)slot * 0.25f + (slot ? 100000.0f : 0.0f);
}

typedef struct held {
    loom_param_table t;
    float *params, *state;
} held;

static void held_make_stage(held *h, int tp, int part, variant v, int fill, int stage, int pp)
{
    build(&h->t, tp, part, v, stage, pp);
    h->params = calloc(h->t.total + 1, sizeof(float));
    h->state = calloc((size_t)SLOTS * h->t.total + 1, sizeof(float));
    for (int i = 0; i < h->t.count; i++) {
        const loom_param_entry *e = &h->t.entries[i];
        for (size_t j = 0; j < e->numel; j++) {
            uint64_t li = logical(e, j);
            h->params[e->offset + j] = fill ? value(e->name, li, 0) : -1.0f;
            for (int k = 0; k < SLOTS; k++)
                h->state[SLOTS * e->offset + (size_t)k * e->numel + j] =
                    fill ? value(e->name, li, k + 1) : -1.0f;
        }
    }
}

static void held_make(held *h, int tp, int part, variant v, int fill)
{
    held_make_stage(h, tp, part, v, fill, 0, 1);
}

/* Elements that differ from the expected values. */
static size_t held_wrong(const held *h)
{
    size_t bad = 0;
    for (int i = 0; i < h->t.count; i++) {
        const loom_param_entry *e = &h->t.entries[i];
        for (size_t j = 0; j < e->numel; j++) {
            uint64_t li = logical(e, j);
            bad += h->params[e->offset + j] != value(e->name, li, 0);
            for (int k = 0; k < SLOTS; k++)
                bad += h->state[SLOTS * e->offset + (size_t)k * e->numel + j] != value(e->name, li, k + 1);
        }
    }
    return bad;
}

static void held_free(held *h)
{
    loom_params_free(&h->t);
    free(h->params);
    free(h->state);
}

/* --- a dp x tp mesh of threads saving together --------------------------------------- */

typedef struct rank_arg {
    int dp, tp, dp_rank, tp_rank, pp, stage;
    fworld *world, *dp_w, *tp_w, *pp_w;
    const char *dir;
    variant v;
    int64_t step;
    loom_status st;
    char msg[1024], path[1024];
} rank_arg;

static void group_of(loom_ckpt_group *g, fworld *w, int rank, fcomm *c)
{
    c->w = w;
    c->rank = rank;
    g->ops = w->size > 1 ? &fake_ops : NULL;
    g->comm = w->size > 1 ? c : NULL;
    g->size = w->size;
    g->rank = w->size > 1 ? rank : 0;
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    held h;
    held_make_stage(&h, a->tp, a->tp_rank, a->v, 1, a->stage, a->pp);
    if (a->v == BAD_DIM && a->tp_rank == 1 && a->stage == a->pp - 1)
        h.t.entries[1].slice_len[0] = -1;
    fcomm cw, cd, ct, cp;
    loom_ckpt_groups g;
    memset(&g, 0, sizeof g); /* no pp group unless pp > 1 */
    group_of(&g.world, a->world, (a->stage * a->dp + a->dp_rank) * a->tp + a->tp_rank, &cw);
    group_of(&g.dp, a->dp_w, a->dp_rank, &cd);
    group_of(&g.tp, a->tp_w, a->tp_rank, &ct);
    if (a->pp > 1)
        group_of(&g.pp, a->pp_w, a->stage, &cp);
    static const int split[3] = {0, 1, 2}; /* one block per stage, for the manifest */
    loom_ckpt_source src = {&h.t, h.params, h.state, SLOTS, "adamw", {V, V, 16, 1, 2, C},
                            {a->step, {0}, 0}, a->stage == 1 ? "wte" : NULL, split, a->pp};
    loom_checkpoint_extra x;
    memset(&x, 0, sizeof x);
    x.step = a->step;
    x.keep = 2;
    a->st = loom_ckpt_save_source(&src, &g, a->dir, &x, a->path, sizeof a->path);
    snprintf(a->msg, sizeof a->msg, "%s", a->st == LOOM_OK ? "" : loom_last_error());
    held_free(&h);
    return NULL;
}

/* Save step `step` into dir from a dp x tp x pp mesh (pp 1 or 2; world rank r is stage
 * r / (dp tp), dp rank r / tp % dp, tp rank r % tp); the statuses of all ranks in st. */
static void mesh_save_pp(const char *dir, int dp, int tp, int pp, int64_t step, variant v,
                         rank_arg *args)
{
    int n = dp * tp * pp;
    ck_assert_int_le(n, MAX_RANKS);
    fworld world = {.size = n}, dpw[MAX_RANKS], tpw[MAX_RANKS], ppw[MAX_RANKS];
    pthread_barrier_init(&world.bar, NULL, (unsigned)n);
    for (int i = 0; i < tp * pp; i++) { /* dp group i: stage i / tp, tp rank i % tp */
        dpw[i].size = dp;
        pthread_barrier_init(&dpw[i].bar, NULL, (unsigned)dp);
    }
    for (int i = 0; i < dp * pp; i++) { /* tp group i: stage i / dp, dp rank i % dp */
        tpw[i].size = tp;
        pthread_barrier_init(&tpw[i].bar, NULL, (unsigned)tp);
    }
    for (int i = 0; i < dp * tp; i++) { /* pp group i: dp rank i / tp, tp rank i % tp */
        ppw[i].size = pp;
        pthread_barrier_init(&ppw[i].bar, NULL, (unsigned)pp);
    }
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        rank_arg *a = &args[r];
        memset(a, 0, sizeof *a);
        a->dp = dp;
        a->tp = tp;
        a->pp = pp;
        a->stage = r / (dp * tp);
        a->dp_rank = r / tp % dp;
        a->tp_rank = r % tp;
        a->world = &world;
        a->dp_w = &dpw[a->stage * tp + a->tp_rank];
        a->tp_w = &tpw[a->stage * dp + a->dp_rank];
        a->pp_w = &ppw[a->dp_rank * tp + a->tp_rank];
        a->dir = dir;
        a->v = v;
        a->step = step;
        ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, a), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&world.bar);
    for (int i = 0; i < tp * pp; i++)
        pthread_barrier_destroy(&dpw[i].bar);
    for (int i = 0; i < dp * pp; i++)
        pthread_barrier_destroy(&tpw[i].bar);
    for (int i = 0; i < dp * tp; i++)
        pthread_barrier_destroy(&ppw[i].bar);
}

static void mesh_save(const char *dir, int dp, int tp, int64_t step, variant v, rank_arg *args)
{
    mesh_save_pp(dir, dp, tp, 1, step, v, args);
}

static void mesh_save_ok(const char *dir, int dp, int tp, int64_t step, variant v, char *path)
{
    rank_arg args[MAX_RANKS];
    mesh_save(dir, dp, tp, step, v, args);
    for (int r = 0; r < dp * tp; r++) {
        ck_assert_msg(args[r].st == LOOM_OK, "rank %d: %s", r, args[r].msg);
        ck_assert_str_eq(args[r].path, args[0].path);
    }
    snprintf(path, 1024, "%s", args[0].path);
}

/* Load the checkpoint into tp rank `part` of `tp`'s table; the status. */
static loom_status load_into(const char *ckpt, int tp, int part, variant v, size_t *wrong)
{
    held h;
    held_make(&h, tp, part, v, 0);
    held before;
    held_make(&before, tp, part, v, 0);
    loom_status st = loom_ckpt_load_tensors(ckpt, &h.t, SLOTS, h.params, h.state);
    if (st == LOOM_OK) {
        *wrong = held_wrong(&h);
    } else { /* nothing written on failure */
        ck_assert(memcmp(h.params, before.params, h.t.total * sizeof(float)) == 0);
        ck_assert(memcmp(h.state, before.state, SLOTS * h.t.total * sizeof(float)) == 0);
    }
    held_free(&h);
    held_free(&before);
    return st;
}

static void load_all_parts(const char *ckpt, int tp)
{
    for (int part = 0; part < tp; part++) {
        size_t wrong = 1;
        ck_assert_msg(load_into(ckpt, tp, part, NORMAL, &wrong) == LOOM_OK, "into tp=%d part %d: %s",
                      tp, part, loom_last_error());
        ck_assert_msg(wrong == 0, "into tp=%d part %d: %zu elements wrong", tp, part, wrong);
    }
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void fresh_dir(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", root, name);
    nftw(out, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int exists(const char *dir, const char *name)
{
    char p[2048];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* Entries of dir (not . and ..). */
static int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

/* --- tests ------------------------------------------------------------------------- */

START_TEST(test_tp2_saves_and_reshards)
{
    char dir[512], ckpt[1024];
    fresh_dir(dir, sizeof dir, "tp2");
    mesh_save_ok(dir, 1, 2, 5, NORMAL, ckpt);
    ck_assert_str_eq(strrchr(ckpt, '/') + 1, "step_00000005");
    const char *files[] = {"model.tp0.safetensors", "model.tp1.safetensors", "optim.tp0.safetensors",
                           "optim.tp1.safetensors", "manifest.json"};
    for (int i = 0; i < 5; i++)
        ck_assert_msg(exists(ckpt, files[i]), "%s missing", files[i]);
    ck_assert(!exists(ckpt, "model.safetensors"));
    ck_assert_int_eq(count_entries(ckpt, ""), 5);
    ck_assert_int_eq(count_entries(dir, ".tmp-"), 0);
    ck_assert(loom_ckpt_is_complete(ckpt));
    /* the manifest records the layout and every file */
    loom_json_doc *doc;
    char *text;
    ck_assert_int_eq(loom_ckpt_manifest_open(ckpt, &doc, &text), LOOM_OK);
    int64_t tp = 0;
    ck_assert(loom_json_int64(loom_json_get(loom_json_get(loom_json_root(doc), "layout"), "tp"), &tp));
    ck_assert_int_eq(tp, 2);
    ck_assert_uint_eq(loom_json_get(loom_json_root(doc), "files")->count, 4);
    loom_json_free(doc);
    free(text);
    char found[1024];
    ck_assert_int_eq(loom_checkpoint_find(dir, found, sizeof found), LOOM_OK);
    ck_assert_str_eq(found, ckpt);
    load_all_parts(ckpt, 1);
    load_all_parts(ckpt, 2);
    load_all_parts(ckpt, 4);
}
END_TEST

START_TEST(test_tp1_reshards_up)
{
    char dir[512], ckpt[1024];
    fresh_dir(dir, sizeof dir, "tp1");
    mesh_save_ok(dir, 1, 1, 3, NORMAL, ckpt);
    ck_assert(exists(ckpt, LOOM_CKPT_MODEL_FILE) && exists(ckpt, LOOM_CKPT_OPTIM_FILE));
    ck_assert_int_eq(count_entries(ckpt, ""), 3);
    load_all_parts(ckpt, 1);
    load_all_parts(ckpt, 2);
    load_all_parts(ckpt, 4);
}
END_TEST

START_TEST(test_tp4_reshards_down_and_dp_ranks_only_wait)
{
    char dir[512], ckpt[1024];
    fresh_dir(dir, sizeof dir, "dp2tp4");
    mesh_save_ok(dir, 2, 4, 7, NORMAL, ckpt); /* 8 ranks: dp rank 1 writes nothing */
    ck_assert_int_eq(count_entries(ckpt, "model.tp"), 4);
    ck_assert_int_eq(count_entries(ckpt, ""), 9);
    load_all_parts(ckpt, 1);
    load_all_parts(ckpt, 2);
    load_all_parts(ckpt, 4);
    /* saving again replaces the step; retention (keep=2) applies as before */
    mesh_save_ok(dir, 2, 4, 7, NORMAL, ckpt);
    mesh_save_ok(dir, 1, 2, 8, NORMAL, ckpt);
    mesh_save_ok(dir, 2, 1, 9, NORMAL, ckpt);
    ck_assert(!exists(dir, "step_00000007") && exists(dir, "step_00000008") &&
              exists(dir, "step_00000009"));
    ck_assert_int_eq(count_entries(dir, ".tmp-"), 0);
    load_all_parts(ckpt, 4);
}
END_TEST

START_TEST(test_refusals)
{
    char dir[512], ckpt[1024], p[2048];
    size_t wrong;
    fresh_dir(dir, sizeof dir, "refuse");
    /* tp rank 1 lacks fc.weight: its half of the rows is missing */
    mesh_save_ok(dir, 1, 2, 1, NO_FC, ckpt);
    ck_assert_int_eq(load_into(ckpt, 1, 0, NORMAL, &wrong), LOOM_ERR_INVALID);
    printf("missing piece: %s\n", loom_last_error());
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "model.tp0.safetensors"));
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "'fc.weight' cover 128 of the 256 elements"));
    /* ... which tp=2 part 0 does not need, but part 1 does */
    ck_assert_int_eq(load_into(ckpt, 2, 0, NORMAL, &wrong), LOOM_OK);
    ck_assert_int_eq(wrong, 0);
    ck_assert_int_eq(load_into(ckpt, 2, 1, NORMAL, &wrong), LOOM_ERR_INVALID);
    /* another logical shape */
    mesh_save_ok(dir, 1, 2, 2, NORMAL, ckpt);
    ck_assert_int_eq(load_into(ckpt, 1, 0, WIDE_PROJ, &wrong), LOOM_ERR_INVALID);
    printf("shape: %s\n", loom_last_error());
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "model.tp0.safetensors': tensor 'proj.weight' "
                                 "has logical shape [8, 8] but this run's model has [8, 16]"));
    /* a tensor the run does not have */
    ck_assert_int_eq(load_into(ckpt, 2, 0, NO_FC, &wrong), LOOM_OK); /* part 0 has it */
    ck_assert_int_eq(load_into(ckpt, 2, 1, NO_FC, &wrong), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "tensor 'fc.weight' is not part of this run's model"));
    /* pieces that overlap without being the same slice */
    mesh_save_ok(dir, 1, 2, 3, PROJ_BY_COL, ckpt);
    ck_assert_int_eq(load_into(ckpt, 1, 0, NORMAL, &wrong), LOOM_ERR_INVALID);
    printf("overlap: %s\n", loom_last_error());
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "model.tp1.safetensors': tensor 'proj.weight'"));
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "inconsistent"));
    /* a damaged tp file: refused naming it, by checksum, for every layout */
    mesh_save_ok(dir, 1, 2, 4, NORMAL, ckpt);
    snprintf(p, sizeof p, "%s/optim.tp1.safetensors", ckpt);
    FILE *f = fopen(p, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 200, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    for (int tp = 1; tp <= 4; tp *= 2) {
        ck_assert_int_eq(load_into(ckpt, tp, 0, NORMAL, &wrong), LOOM_ERR_CORRUPT);
        ck_assert_ptr_nonnull(strstr(loom_last_error(), "optim.tp1.safetensors"));
    }
    /* a missing tp file: incomplete, so find() skips it */
    snprintf(p, sizeof p, "%s/model.tp1.safetensors", ckpt);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert(!loom_ckpt_is_complete(ckpt));
    char found[1024];
    ck_assert_int_eq(loom_checkpoint_find(dir, found, sizeof found), LOOM_OK);
    ck_assert_str_eq(strrchr(found, '/') + 1, "step_00000003");
}
END_TEST

START_TEST(test_failing_writer)
{
    char dir[512], ckpt[1024];
    fresh_dir(dir, sizeof dir, "fail");
    mesh_save_ok(dir, 1, 2, 1, NORMAL, ckpt);
    rank_arg args[MAX_RANKS];
    mesh_save(dir, 2, 2, 2, BAD_DIM, args); /* tp rank 1 cannot write its files */
    for (int r = 0; r < 4; r++) {
        ck_assert_msg(args[r].st != LOOM_OK, "rank %d succeeded", r);
        printf("rank %d: %s\n", r, args[r].msg);
    }
    ck_assert_ptr_nonnull(strstr(args[0].msg, "tp rank 1 could not write its files"));
    ck_assert_ptr_nonnull(strstr(args[0].msg, "negative dim"));
    ck_assert_ptr_nonnull(strstr(args[1].msg, "negative dim"));
    ck_assert_ptr_nonnull(strstr(args[2].msg, "the save failed on world rank 1"));
    ck_assert(!exists(dir, "step_00000002"));
    ck_assert_int_eq(count_entries(dir, ".tmp-"), 0);
    char found[1024];
    ck_assert_int_eq(loom_checkpoint_find(dir, found, sizeof found), LOOM_OK);
    ck_assert_str_eq(found, ckpt);
    /* tp rank 0 cannot even make the directory: every rank fails, none waits forever */
    char file[600], sub[700];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    snprintf(sub, sizeof sub, "%s/ck", file);
    mesh_save(sub, 1, 2, 3, NORMAL, args);
    ck_assert_int_eq(args[0].st, LOOM_ERR_IO);
    ck_assert_ptr_nonnull(strstr(args[0].msg, "cannot create checkpoint directory"));
    ck_assert_ptr_nonnull(strstr(args[1].msg, "tp rank 0 could not create"));
}
END_TEST

/* Whether the safetensors file's header names tensor `name`. */
static int header_has(const char *dir, const char *file, const char *name)
{
    char p[2048], want[128];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    snprintf(want, sizeof want, "\"%s\"", name);
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    unsigned char len8[8];
    ck_assert_int_eq(fread(len8, 1, 8, f), 8);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | len8[k];
    char *h = calloc(n + 1, 1);
    ck_assert_int_eq(fread(h, 1, n, f), n);
    fclose(f);
    int has = strstr(h, want) != NULL;
    free(h);
    return has;
}

START_TEST(test_pp2_stages_save_their_part)
{
    char dir[512], ckpt[1024];
    fresh_dir(dir, sizeof dir, "pp2");
    rank_arg args[MAX_RANKS];
    mesh_save_pp(dir, 2, 2, 2, 6, NORMAL, args); /* 8 ranks; dp rank 1 writes nothing */
    for (int r = 0; r < 8; r++)
        ck_assert_msg(args[r].st == LOOM_OK, "rank %d: %s", r, args[r].msg);
    snprintf(ckpt, sizeof ckpt, "%s", args[0].path);
    const char *files[] = {"model.pp0.tp0.safetensors", "model.pp0.tp1.safetensors",
                           "model.pp1.tp0.safetensors", "model.pp1.tp1.safetensors",
                           "optim.pp0.tp0.safetensors", "optim.pp0.tp1.safetensors",
                           "optim.pp1.tp0.safetensors", "optim.pp1.tp1.safetensors"};
    for (int i = 0; i < 8; i++)
        ck_assert_msg(exists(ckpt, files[i]), "%s missing", files[i]);
    ck_assert_int_eq(count_entries(ckpt, ""), 9);
    ck_assert(loom_ckpt_is_complete(ckpt));
    /* the tied wte: stage 0's files only */
    ck_assert(header_has(ckpt, files[0], "wte") && header_has(ckpt, files[4], "wte.state0"));
    ck_assert(!header_has(ckpt, files[2], "wte") && !header_has(ckpt, files[6], "wte.state0"));
    ck_assert(header_has(ckpt, files[3], "fc.weight") && !header_has(ckpt, files[3], "qkv.weight"));
    loom_json_doc *doc;
    char *text;
    ck_assert_int_eq(loom_ckpt_manifest_open(ckpt, &doc, &text), LOOM_OK);
    const loom_json *lay = loom_json_get(loom_json_root(doc), "layout");
    int64_t tp = 0, pp = 0;
    ck_assert(loom_json_int64(loom_json_get(lay, "tp"), &tp) && loom_json_int64(loom_json_get(lay, "pp"), &pp));
    ck_assert(tp == 2 && pp == 2);
    ck_assert_uint_eq(loom_json_get(lay, "pp_layers")->count, 2);
    ck_assert_uint_eq(loom_json_get(loom_json_root(doc), "files")->count, 8);
    loom_json_free(doc);
    free(text);
    /* a whole table (pp = 1) at every tp gets every element, wte from stage 0 */
    load_all_parts(ckpt, 1);
    load_all_parts(ckpt, 2);
    load_all_parts(ckpt, 4);
    /* the last stage's tp rank 1 cannot write: stage 0 names it, all fail, nothing left */
    mesh_save_pp(dir, 1, 2, 2, 7, BAD_DIM, args);
    for (int r = 0; r < 4; r++)
        ck_assert_msg(args[r].st != LOOM_OK, "rank %d succeeded", r);
    printf("pp writer: %s\n", args[0].msg);
    ck_assert_ptr_nonnull(strstr(args[0].msg, "stage 1 tp rank 1 could not write its files"));
    ck_assert_ptr_nonnull(strstr(args[0].msg, "negative dim"));
    ck_assert(!exists(dir, "step_00000007"));
    ck_assert_int_eq(count_entries(dir, ".tmp-"), 0);
    /* a missing stage file: incomplete */
    char p[2048];
    snprintf(p, sizeof p, "%s/optim.pp1.tp0.safetensors", ckpt);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert(!loom_ckpt_is_complete(ckpt));
}
END_TEST

/* Rewrite ckpt's manifest as a loom before ranged loads wrote it: no header_xxh64
 * members, its own checksum recomputed. */
static void drop_header_sums(const char *ckpt)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/manifest.json", ckpt);
    unsigned char *text;
    size_t n;
    ck_assert_int_eq(loom_ckpt_read_file(p, 1 << 24, &text, &n), LOOM_OK);
    char *out = calloc(n + 1, 1), *at = out, *from = (char *)text, *hit;
    const char *key = ", \"header_xxh64\": \"";
    while ((hit = strstr(from, key))) {
        memcpy(at, from, (size_t)(hit - from));
        at += hit - from;
        from = hit + strlen(key) + 17; /* 16 digits and the closing quote */
    }
    strcpy(at, from);
    char *digits = strstr(out, "\"checksum\": \"xxh64:") + strlen("\"checksum\": \"xxh64:");
    memset(digits, '0', 16);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)loom_xxh64(out, strlen(out)));
    memcpy(digits, hex, 16);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(out, f);
    fclose(f);
    free(out);
    free(text);
}

/* A load reads the chunks of the slices it holds, not the files: a tp=2 rank loading a
 * tp=1 checkpoint reads about half of it, a tp=4 rank a quarter, tp=1 all of it (the
 * replicated vector and the headers are the "about"). A checkpoint whose manifest has no
 * header checksums (older) is read whole. */
START_TEST(test_ranged_reads)
{
    char dir[1024], ckpt[1024];
    fresh_dir(dir, sizeof dir, "ranged");
    mesh_save_ok(dir, 1, 1, 1, BIG, ckpt);
    for (int tp = 1; tp <= 4; tp *= 2)
        for (int part = 0; part < tp; part++) {
            size_t wrong = 1;
            ck_assert_msg(load_into(ckpt, tp, part, BIG, &wrong) == LOOM_OK, "%s", loom_last_error());
            ck_assert_int_eq(wrong, 0);
            uint64_t got, total;
            loom_ckpt_read_stats(&got, &total);
            double frac = (double)got / (double)total;
            printf("ranged: tp=%d rank %d read %llu of %llu bytes (%.3f)\n", tp, part,
                   (unsigned long long)got, (unsigned long long)total, frac);
            ck_assert_msg(frac > 1.0 / tp - 0.02 && frac < 1.0 / tp + 0.02,
                          "tp=%d rank %d read %.3f of the checkpoint, %.3f expected", tp, part,
                          frac, 1.0 / tp);
        }
    /* the other way: tp=2 saved, tp=1 loads everything, a tp=2 rank reads only its file */
    mesh_save_ok(dir, 1, 2, 2, BIG, ckpt);
    size_t wrong = 1;
    uint64_t got, total;
    ck_assert_int_eq(load_into(ckpt, 2, 1, BIG, &wrong), LOOM_OK);
    ck_assert_int_eq(wrong, 0);
    loom_ckpt_read_stats(&got, &total);
    ck_assert_msg(got < total * 0.52, "tp=2 rank 1 read %llu of %llu", (unsigned long long)got,
                  (unsigned long long)total);
    /* a damaged tile that a rank does not read does not stop it (rank 0 reads only the
     * header of tp rank 1's file); one it reads does */
    char p[2048];
    snprintf(p, sizeof p, "%s/model.tp1.safetensors", ckpt);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    FILE *f = fopen(p, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, sb.st_size / 2, SEEK_SET); /* in the weights, not the header */
    fputc(0x5a, f);
    fclose(f);
    ck_assert_int_eq(load_into(ckpt, 2, 0, BIG, &wrong), LOOM_OK);
    ck_assert_int_eq(load_into(ckpt, 2, 1, BIG, &wrong), LOOM_ERR_CORRUPT);
    printf("damaged tile: %s\n", loom_last_error());
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "model.tp1.safetensors"));
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "the header records"));
    ck_assert_int_eq(loom_ckpt_verify(ckpt, NULL), LOOM_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "model.tp1.safetensors"));
    /* a manifest without header checksums (a checkpoint from before): read whole, still
     * checked by the files' xxh64 */
    mesh_save_ok(dir, 1, 1, 5, BIG, ckpt);
    drop_header_sums(ckpt);
    ck_assert_msg(load_into(ckpt, 2, 1, BIG, &wrong) == LOOM_OK, "%s", loom_last_error());
    ck_assert_int_eq(wrong, 0);
    loom_ckpt_read_stats(&got, &total);
    ck_assert(got == total && total > 0);
    ck_assert_int_eq(loom_ckpt_verify(ckpt, NULL), LOOM_OK);
}
END_TEST

int main(void)
{
    snprintf(root, sizeof root, "/tmp/loom-test-ckpt-tp-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    Suite *su = suite_create("checkpoint_tp");
    TCase *tc = tcase_create("checkpoint_tp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tp2_saves_and_reshards);
    tcase_add_test(tc, test_tp1_reshards_up);
    tcase_add_test(tc, test_tp4_reshards_down_and_dp_ranks_only_wait);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_failing_writer);
    tcase_add_test(tc, test_pp2_stages_save_their_part);
    tcase_add_test(tc, test_ranged_reads);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed ? 1 : 0;
}
