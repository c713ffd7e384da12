/* test_checkpoint.c — checkpoints: exact round trip and resume, the `latest` marker and
 * find() around crashed saves, retention, replacing a step, refusal of a mismatched
 * model, savers killed at random moments, and a corruption fuzz (truncate / flip a byte at 200 positions of each of the
 * three files: every load must fail cleanly, name the file and leave the session as it
 * was). Also built with AddressSanitizer + UBSan (unit_checkpoint_asan).
 *
 * With LOOM_CKPT_WRITE=<dir> in the environment it only writes one checkpoint there
 * (step_00000002) plus <dir>/expect.bin (the raw floats of h.0.attn.qkv.weight, then of
 * its optimizer slot 1) for tests/unit/check_safetensors.py.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "base/plugin_loader.h"
#include "io/safetensors.h"

enum { V = 64, CTX = 16, L = 2, H = 2, C = 16, B = 2, T = 8 };
#define DEAD_PID "2147483600" /* above any pid_max: kill() says ESRCH */

static loom_plugin_config optim_cfg, precision_cfg;
static char root[256];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static loom_session *make_session(int dim, uint64_t seed)
{
    const loom_plugin *adamw, *fp32;
    ck_assert_msg(loom_plugin_load(LOOM_KIND_OPTIM, "adamw", &adamw) == LOOM_OK, "%s", loom_last_error());
    ck_assert_msg(loom_plugin_load(LOOM_KIND_PRECISION, "fp32", &fp32) == LOOM_OK, "%s", loom_last_error());
    ck_assert_int_eq(loom_config_init(&optim_cfg, adamw->desc), LOOM_OK);
    ck_assert_int_eq(loom_config_set_number(&optim_cfg, "lr", 1e-3), LOOM_OK);
    ck_assert_int_eq(loom_config_init(&precision_cfg, fp32->desc), LOOM_OK);
    loom_session_config cfg = {
        .model = {V, 0, CTX, L, H, dim}, .micro_batch = B, .seq = T, .accum = 1, .seed = seed,
        .grad_clip = 1.0f, .backend = "cpu", .threads = 1, .optim = &optim_cfg,
        .precision = &precision_cfg};
    loom_session *s = NULL;
    ck_assert_msg(loom_session_create(&cfg, &s) == LOOM_OK, "%s", loom_last_error());
    return s;
}

static double train(loom_session *s, loom_data *d, int steps)
{
    loom_data_cursor cur = {d, LOOM_SPLIT_TRAIN};
    loom_step_stats st = {0};
    for (int i = 0; i < steps; i++)
        ck_assert_msg(loom_session_step(s, loom_data_batch, &cur, 1e-3f, &st) == LOOM_OK, "%s",
                      loom_last_error());
    return st.loss;
}

/* Everything a load restores, copied out for comparison. */
typedef struct snap {
    float *params, *state;
    size_t n_params, n_state;
    loom_session_state ss;
} snap;

static snap take(loom_session *s)
{
    snap p;
    uint32_t slots;
    const float *state = loom_session_optim_state(s, &slots);
    loom_gpt *m = loom_session_model(s);
    p.n_params = loom_gpt_params(m)->total;
    p.n_state = p.n_params * slots;
    p.params = malloc(p.n_params * sizeof(float));
    p.state = malloc(p.n_state * sizeof(float) + 1);
    memcpy(p.params, loom_gpt_param_data(m), p.n_params * sizeof(float));
    memcpy(p.state, state, p.n_state * sizeof(float));
    loom_session_get_state(s, &p.ss);
    return p;
}

static int same(loom_session *s, const snap *p)
{
    uint32_t slots;
    const float *state = loom_session_optim_state(s, &slots);
    loom_session_state ss;
    loom_session_get_state(s, &ss);
    return memcmp(p->params, loom_gpt_param_data(loom_session_model(s)), p->n_params * 4) == 0 &&
           memcmp(p->state, state, p->n_state * 4) == 0 && ss.steps == p->ss.steps &&
           memcmp(&ss, &p->ss, sizeof ss) == 0;
}

static void drop(snap *p)
{
    free(p->params);
    free(p->state);
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

static loom_checkpoint_extra extra_at(int64_t step, loom_data *d, int keep)
{
    loom_checkpoint_extra x;
    memset(&x, 0, sizeof x);
    x.step = step;
    x.keep = keep;
    if (d) {
        snprintf(x.data_kind, sizeof x.data_kind, "%s", d->ops->kind);
        x.n_data_state = d->ops->get_state(d->self, x.data_state);
    }
    return x;
}

static void save(loom_session *s, const char *dir, int64_t step, loom_data *d, int keep, char *path)
{
    loom_checkpoint_extra x = extra_at(step, d, keep);
    char buf[4096];
    ck_assert_msg(loom_checkpoint_save(s, dir, &x, path ? path : buf, 4096) == LOOM_OK, "%s",
                  loom_last_error());
}

static int exists(const char *dir, const char *name)
{
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

static void write_text(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}

START_TEST(test_round_trip_and_exact_resume)
{
    char dir[512], path[4096];
    fresh_dir(dir, sizeof dir, "rt");
    loom_session *a = make_session(C, 1), *b = make_session(C, 2);
    loom_data da, db;
    ck_assert_int_eq(loom_data_open_random(V, 7, &da), LOOM_OK);
    ck_assert_int_eq(loom_data_open_random(V, 7, &db), LOOM_OK);
    train(a, &da, 3);
    const char *config = " {\"lr\": 0.001, \"name\": \"t\\u00e9st\", \"big\": 18446744073709551615} ";
    loom_checkpoint_extra x = extra_at(3, &da, 0);
    x.config_json = config;
    double t0 = now_ms();
    ck_assert_msg(loom_checkpoint_save(a, dir, &x, path, sizeof path) == LOOM_OK, "%s", loom_last_error());
    double t1 = now_ms();
    ck_assert_str_eq(strrchr(path, '/') + 1, "step_00000003");
    snap sa = take(a);
    ck_assert(!same(b, &sa));
    loom_checkpoint_extra got;
    double t2 = now_ms();
    ck_assert_msg(loom_checkpoint_load_data(b, path, &db, &got) == LOOM_OK, "%s", loom_last_error());
    printf("save %.2f ms, load %.2f ms (V=%d ctx=%d L=%d H=%d C=%d, AdamW)\n", t1 - t0,
           now_ms() - t2, V, CTX, L, H, C);
    ck_assert(same(b, &sa));
    ck_assert_int_eq(got.step, 3);
    ck_assert_str_eq(got.config_json, "{\"lr\": 0.001, \"name\": \"t\\u00e9st\", \"big\": 18446744073709551615}");
    ck_assert_str_eq(got.data_kind, "random");
    uint64_t wa[LOOM_DATA_STATE_MAX], wb[LOOM_DATA_STATE_MAX];
    int na = da.ops->get_state(da.self, wa), nb = db.ops->get_state(db.self, wb);
    ck_assert_int_eq(na, nb);
    ck_assert(memcmp(wa, wb, (size_t)na * 8) == 0);
    loom_checkpoint_extra_free(&got);
    /* resume is exact: both continue bit for bit */
    for (int i = 0; i < 2; i++) {
        double la = train(a, &da, 1), lb = train(b, &db, 1);
        ck_assert_msg(la == lb, "step %d after resume: loss %.17g vs %.17g", i + 1, la, lb);
    }
    snap sa2 = take(a);
    ck_assert(same(b, &sa2));
    drop(&sa);
    drop(&sa2);
    loom_data_close(&da);
    loom_data_close(&db);
    loom_session_destroy(a);
    loom_session_destroy(b);
}
END_TEST

START_TEST(test_latest_and_find)
{
    char dir[512], out[4096], p[4096];
    fresh_dir(dir, sizeof dir, "find");
    ck_assert_int_eq(loom_checkpoint_find(dir, out, sizeof out), LOOM_ERR_IO);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), dir));
    loom_session *s = make_session(C, 1);
    save(s, dir, 1, NULL, 0, NULL);
    save(s, dir, 2, NULL, 0, NULL);
    ck_assert_int_eq(loom_checkpoint_find(dir, out, sizeof out), LOOM_OK);
    ck_assert_str_eq(strrchr(out, '/') + 1, "step_00000002");
    /* a crashed save: half-written temp dir, and an incomplete step dir */
    snprintf(p, sizeof p, "%s/.tmp-step_00000003." DEAD_PID, dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/.tmp-step_00000003." DEAD_PID "/model.safetensors", dir);
    write_text(p, "\x10\0\0\0\0\0\0\0{\"a\":", 13);
    snprintf(p, sizeof p, "%s/step_00000007", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    ck_assert_int_eq(loom_checkpoint_find(dir, out, sizeof out), LOOM_OK);
    ck_assert_str_eq(strrchr(out, '/') + 1, "step_00000002");
    /* latest names a deleted checkpoint (or garbage): the newest complete one wins */
    snprintf(p, sizeof p, "%s/latest", dir);
    write_text(p, "step_00000009\n", 14);
    ck_assert_int_eq(loom_checkpoint_find(dir, out, sizeof out), LOOM_OK);
    ck_assert_str_eq(strrchr(out, '/') + 1, "step_00000002");
    write_text(p, "../../etc\n", 10);
    ck_assert_int_eq(loom_checkpoint_find(dir, out, sizeof out), LOOM_OK);
    ck_assert_str_eq(strrchr(out, '/') + 1, "step_00000002");
    /* latest names an older complete one: it is chosen */
    write_text(p, "step_00000001\n", 14);
    ck_assert_int_eq(loom_checkpoint_find(dir, out, sizeof out), LOOM_OK);
    ck_assert_str_eq(strrchr(out, '/') + 1, "step_00000001");
    /* the next save removes the dead writer's temp dir */
    save(s, dir, 3, NULL, 0, NULL);
    ck_assert(!exists(dir, ".tmp-step_00000003." DEAD_PID));
    ck_assert(exists(dir, "step_00000007")); /* not ours to judge: left alone */
    ck_assert_int_eq(loom_checkpoint_find(dir, out, sizeof out), LOOM_OK);
    ck_assert_str_eq(strrchr(out, '/') + 1, "step_00000003");
    loom_session_destroy(s);
}
END_TEST

START_TEST(test_retention_and_replace)
{
    char dir[512], p[4096];
    fresh_dir(dir, sizeof dir, "keep");
    loom_session *s = make_session(C, 1);
    loom_data d;
    ck_assert_int_eq(loom_data_open_random(V, 3, &d), LOOM_OK);
    for (int step = 1; step <= 4; step++) {
        train(s, &d, 1);
        save(s, dir, step, &d, 2, NULL);
    }
    ck_assert(!exists(dir, "step_00000001") && !exists(dir, "step_00000002"));
    ck_assert(exists(dir, "step_00000003") && exists(dir, "step_00000004"));
    /* saving an existing step replaces it */
    train(s, &d, 1);
    snap now = take(s);
    save(s, dir, 4, &d, 2, p);
    ck_assert(exists(dir, "step_00000003"));
    loom_session *r = make_session(C, 9);
    ck_assert_msg(loom_checkpoint_load(r, p, NULL) == LOOM_OK, "%s", loom_last_error());
    ck_assert(same(r, &now));
    drop(&now);
    loom_data_close(&d);
    loom_session_destroy(r);
    loom_session_destroy(s);
}
END_TEST

START_TEST(test_mismatch_refused)
{
    char dir[512], path[4096];
    fresh_dir(dir, sizeof dir, "mismatch");
    loom_session *s = make_session(C, 1), *wide = make_session(2 * C, 1);
    save(s, dir, 1, NULL, 0, path);
    snap before = take(wide);
    ck_assert_int_eq(loom_checkpoint_load(wide, path, NULL), LOOM_ERR_INVALID);
    printf("refusal: %s\n", loom_last_error());
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "manifest model.dim=16 but this run's model has dim=32"));
    ck_assert(same(wide, &before));
    /* a data source but no saved position, or the wrong kind */
    loom_data d;
    ck_assert_int_eq(loom_data_open_random(V, 3, &d), LOOM_OK);
    ck_assert_int_eq(loom_checkpoint_load_data(s, path, &d, NULL), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "holds no data position"));
    loom_data_close(&d);
    drop(&before);
    loom_session_destroy(s);
    loom_session_destroy(wide);
}
END_TEST

/* A saver killed (SIGKILL) at arbitrary moments: after each kill, find() must name a
 * checkpoint that loads, and the next save must clear what the dead one left. */
START_TEST(test_killed_saves)
{
    char dir[512], out[4096];
    fresh_dir(dir, sizeof dir, "killed");
    loom_session *s = make_session(C, 1), *r = make_session(C, 2);
    save(s, dir, 1, NULL, 2, NULL);
    int picked_new = 0;
    for (int i = 0; i < 24; i++) {
        fflush(NULL);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) { /* no compute in the child: the saves only read the buffers */
            for (int k = 0;; k++) {
                loom_checkpoint_extra x = extra_at(2 + k % 3, NULL, 2);
                loom_checkpoint_save(s, dir, &x, NULL, 0);
            }
        }
        usleep((useconds_t)(200 + 400 * i));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        ck_assert_msg(loom_checkpoint_find(dir, out, sizeof out) == LOOM_OK, "%s", loom_last_error());
        ck_assert_msg(loom_checkpoint_load(r, out, NULL) == LOOM_OK, "after kill %d: %s", i,
                      loom_last_error());
        picked_new += strcmp(strrchr(out, '/') + 1, "step_00000001") != 0;
    }
    save(s, dir, 9, NULL, 2, NULL); /* clears the dead savers' leftovers */
    DIR *d = opendir(dir);
    struct dirent *e;
    int entries = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")))
            entries++, ck_assert_msg(strncmp(e->d_name, ".tmp-", 5) != 0, "%s left behind", e->d_name);
    closedir(d);
    ck_assert_int_eq(entries, 3); /* latest, step_00000009 and the one before it */
    printf("killed savers: %d of 24 left a newer checkpoint selected\n", picked_new);
    loom_session_destroy(r);
    loom_session_destroy(s);
}
END_TEST

static int fuzz_one(loom_session *s, loom_data *d, const snap *before, const char *ckpt,
                    const char *file, const char *what, size_t pos)
{
    loom_status st = loom_checkpoint_load_data(s, ckpt, d, NULL);
    ck_assert_msg(st != LOOM_OK, "%s of %s at byte %zu was accepted", what, file, pos);
    ck_assert_msg(strstr(loom_last_error(), file), "%s of %s at %zu: message does not name the "
                  "file: %s", what, file, pos, loom_last_error());
    ck_assert_msg(same(s, before), "%s of %s at %zu changed the session", what, file, pos);
    return 1;
}

START_TEST(test_corruption_fuzz)
{
    char dir[512], ckpt[4096], p[4200];
    fresh_dir(dir, sizeof dir, "fuzz");
    loom_session *s = make_session(C, 1);
    loom_data d;
    ck_assert_int_eq(loom_data_open_random(V, 3, &d), LOOM_OK);
    train(s, &d, 2);
    save(s, dir, 2, &d, 0, ckpt);
    train(s, &d, 1); /* so a wrongly accepted load would show */
    snap before = take(s);
    uint64_t dstate[LOOM_DATA_STATE_MAX];
    int dn = d.ops->get_state(d.self, dstate);
    const char *files[3] = {LOOM_CKPT_MODEL_FILE, LOOM_CKPT_OPTIM_FILE, LOOM_CKPT_MANIFEST_FILE};
    int loads = 0;
    double t0 = now_ms();
    for (int fi = 0; fi < 3; fi++) {
        snprintf(p, sizeof p, "%s/%s", ckpt, files[fi]);
        unsigned char *orig;
        size_t n;
        ck_assert_int_eq(loom_ckpt_read_file(p, 1 << 30, &orig, &n), LOOM_OK);
        for (int i = 0; i < 200; i++) {
            size_t pos = i < 40 ? (size_t)i * 3 % n : (size_t)((double)(i - 40) / 160 * n);
            write_text(p, (const char *)orig, pos); /* truncated */
            loads += fuzz_one(s, &d, &before, ckpt, files[fi], "truncation", pos);
            unsigned char *bad = malloc(n);
            memcpy(bad, orig, n);
            bad[pos] ^= (unsigned char)(1u << (i % 8));
            write_text(p, (const char *)bad, n);
            free(bad);
            loads += fuzz_one(s, &d, &before, ckpt, files[fi], "flip", pos);
        }
        write_text(p, (const char *)orig, n);
        free(orig);
    }
    printf("corruption fuzz: %d refused loads in %.0f ms\n", loads, now_ms() - t0);
    uint64_t dnow[LOOM_DATA_STATE_MAX];
    ck_assert_int_eq(d.ops->get_state(d.self, dnow), dn);
    ck_assert(memcmp(dnow, dstate, (size_t)dn * 8) == 0);
    ck_assert_msg(loom_checkpoint_load_data(s, ckpt, &d, NULL) == LOOM_OK, "%s", loom_last_error());
    drop(&before);
    loom_data_close(&d);
    loom_session_destroy(s);
}
END_TEST

/* LOOM_CKPT_WRITE=<dir>: one checkpoint (dir/step_00000002) + dir/expect.bin for
 * check_safetensors.py, run as the only test. */
START_TEST(test_write_for_python)
{
    const char *dir = getenv("LOOM_CKPT_WRITE");
    loom_session *s = make_session(C, 1);
    loom_data d;
    ck_assert_int_eq(loom_data_open_random(V, 3, &d), LOOM_OK);
    train(s, &d, 2);
    char path[4096], p[4200];
    loom_checkpoint_extra x = extra_at(2, &d, 0);
    x.config_json = "{\"recipe\": \"check_safetensors\"}";
    ck_assert_msg(loom_checkpoint_save(s, dir, &x, path, sizeof path) == LOOM_OK, "%s", loom_last_error());
    const loom_param_entry *e = loom_params_find(loom_gpt_params(loom_session_model(s)), "h.0.attn.qkv.weight");
    uint32_t slots;
    const float *state = loom_session_optim_state(s, &slots);
    snprintf(p, sizeof p, "%s/expect.bin", dir);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(loom_gpt_param_data(loom_session_model(s)) + e->offset, 4, e->numel, f), e->numel);
    ck_assert_uint_eq(fwrite(state + (size_t)slots * e->offset + e->numel, 4, e->numel, f), e->numel);
    fclose(f);
    loom_data_close(&d);
    loom_session_destroy(s);
}
END_TEST

int main(void)
{
    snprintf(root, sizeof root, "/tmp/loom-test-ckpt-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    Suite *su = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 60);
    if (getenv("LOOM_CKPT_WRITE")) {
        tcase_add_test(tc, test_write_for_python);
    } else {
        tcase_add_test(tc, test_round_trip_and_exact_resume);
        tcase_add_test(tc, test_latest_and_find);
        tcase_add_test(tc, test_retention_and_replace);
        tcase_add_test(tc, test_mismatch_refused);
        tcase_add_test(tc, test_killed_saves);
        tcase_add_test(tc, test_corruption_fuzz);
    }
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed ? 1 : 0;
}
