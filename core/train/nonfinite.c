/* nonfinite.c — the world's agreement on where a non-finite value first appears, and the
 * injection that tests it (see nonfinite.h).
 */
#include "nonfinite.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "base/plugin_loader.h"
#include "base/clock.h"
#include "base/stop_signal.h"

#define MAX_INJECT 8

/* One rank's finding, as it travels: plain int32s and the name, no padding. */
typedef struct finding {
    int32_t grad_bad, loss_bad, stage, index, rank, stop_signal, spike, pad;
    char param[LOOM_PARAM_NAME_MAX];
} finding;

struct loom_nonfinite {
    const struct loom_comm_ops *ops; /* the world; NULL with one rank */
    void *world;
    int size, rank, stage, stages;
    finding *all;
    /* this rank's injections */
    struct {
        int64_t step;
        int entry;
        float value;
        char name[LOOM_PARAM_NAME_MAX];
    } inject[MAX_INJECT];
    int n_inject;
};

#define INJECT_ENV "LOOM_INJECT_NONFINITE"
#define INJECT_FORM INJECT_ENV " must be STEP:RANK:PARAM[:inf|nan], up to 8 of them joined by \",\" " \
                    "(e.g. 3:1:h.0.attn.qkv.weight)"

static loom_status parse_int(const char *s, const char *what, const char *spec, long long min,
                             long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (s[0] == '\0' || *end != '\0' || errno || v < min)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": %s \"%s\" is not an integer >= %lld; " INJECT_FORM,
                  INJECT_ENV, spec, what, s, min);
    *out = v;
    return LOOM_OK;
}

/* One STEP:RANK:PARAM[:inf|nan]: armed when this rank is the one named; the form is
 * checked on every rank. */
static loom_status parse_injection(loom_nonfinite *nf, const loom_param_table *t, const char *spec)
{
    char buf[256];
    if (strlen(spec) >= sizeof buf)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s is %zu characters long; " INJECT_FORM, INJECT_ENV,
                  strlen(spec));
    strcpy(buf, spec);
    char *field[5] = {0};
    int n = 0;
    for (char *p = buf, *tok; n < 5 && (tok = strsep(&p, ":")) != NULL;)
        field[n++] = tok;
    if (n < 3 || n > 4)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\" has %d field%s; " INJECT_FORM, INJECT_ENV, spec,
                  n, n == 1 ? "" : "s");
    long long step = 0, rank = 0;
    LOOM_TRY(parse_int(field[0], "STEP", spec, 1, &step));
    LOOM_TRY(parse_int(field[1], "RANK", spec, 0, &rank));
    if (rank >= nf->size)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": rank %lld, but the run has %d rank%s (0..%d)",
                  INJECT_ENV, spec, rank, nf->size, nf->size == 1 ? "" : "s", nf->size - 1);
    float value = INFINITY;
    if (n == 4 && strcmp(field[3], "nan") == 0)
        value = NAN;
    else if (n == 4 && strcmp(field[3], "inf") != 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": value \"%s\" is neither inf nor nan", INJECT_ENV,
                  spec, field[3]);
    if (rank != nf->rank)
        return LOOM_OK;
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->entries[i].name, field[2]) == 0 && t->entries[i].numel > 0) {
            nf->inject[nf->n_inject].step = step;
            nf->inject[nf->n_inject].entry = i;
            snprintf(nf->inject[nf->n_inject].name, LOOM_PARAM_NAME_MAX, "%s", field[2]);
            nf->inject[nf->n_inject++].value = value;
            return LOOM_OK;
        }
    char names[640];
    size_t used = 0;
    names[0] = '\0';
    for (int i = 0; i < t->count && used + 4 < sizeof names; i++) {
        int w = snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", t->entries[i].name);
        used += w > 0 ? (size_t)w : 0;
    }
    if (used >= sizeof names - 1)
        strcpy(names + sizeof names - 5, " ...");
    LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": rank %lld (pipeline stage %d) holds no parameter '%s'; "
              "it holds: %s", INJECT_ENV, spec, rank, nf->stage, field[2], names);
}

loom_status loom_nonfinite_create(const loom_param_table *t, int stage, int stages,
                                  loom_nonfinite **out)
{
    *out = NULL;
    loom_nonfinite *nf = calloc(1, sizeof *nf);
    if (!nf)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    nf->stage = stage;
    nf->stages = stages;
    loom_status st = loom_core_host()->group(LOOM_GROUP_WORLD, &nf->ops, &nf->world, &nf->size);
    if (st == LOOM_OK) {
        if (nf->size < 1)
            nf->size = 1;
        nf->rank = nf->ops ? nf->ops->rank(nf->world) : 0;
        nf->all = calloc((size_t)nf->size, sizeof *nf->all);
        if (!nf->all)
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    }
    const char *spec = getenv(INJECT_ENV);
    if (st == LOOM_OK && spec && spec[0]) {
        char list[1024];
        snprintf(list, sizeof list, "%s", spec);
        int n = 0;
        for (char *p = list, *one; st == LOOM_OK && (one = strsep(&p, ",")) != NULL; n++)
            st = n < MAX_INJECT ? parse_injection(nf, t, one)
                                : loom_fail(LOOM_ERR_INVALID, "%s=\"%s\" has more than %d injections",
                                            INJECT_ENV, spec, MAX_INJECT);
    }
    if (st != LOOM_OK) {
        loom_nonfinite_destroy(nf);
        return st;
    }
    *out = nf;
    return LOOM_OK;
}

void loom_nonfinite_destroy(loom_nonfinite *nf)
{
    if (!nf)
        return;
    free(nf->all);
    free(nf);
}

void loom_nonfinite_inject(const loom_nonfinite *nf, int64_t step, const loom_param_table *t,
                           float *grads, const loom_backend *be)
{
    for (int i = 0; i < nf->n_inject; i++)
        if (step == nf->inject[i].step) /* a copy: the gradient may be in device memory */
            be->ops->copy_to_device(be->self, grads + t->entries[nf->inject[i].entry].offset,
                                    &nf->inject[i].value, sizeof(float));
}

loom_status loom_nonfinite_inject_segments(const loom_nonfinite *nf, int64_t step,
                                           const loom_optim_segment *seg, size_t n,
                                           const int *entry, const loom_backend *be)
{
    for (int i = 0; i < nf->n_inject; i++) {
        if (step != nf->inject[i].step)
            continue;
        size_t j = 0;
        while (j < n && (entry[j] != nf->inject[i].entry || seg[j].n == 0))
            j++;
        if (j == n)
            LOOM_FAIL(LOOM_ERR_INVALID, "%s: rank %d's ZeRO partition holds no piece of '%s''s "
                      "gradient; name a parameter this rank's partition holds", INJECT_ENV,
                      nf->rank, nf->inject[i].name);
        /* the partition's own buffer, by a copy: it may be in device memory */
        be->ops->copy_to_device(be->self, (float *)seg[j].grad, &nf->inject[i].value,
                                sizeof(float));
    }
    return LOOM_OK;
}

/* a before b in the order the report names the first of */
static int comes_first(const finding *a, const finding *b)
{
    if (a->loss_bad != b->loss_bad)
        return a->loss_bad;
    if (a->loss_bad) /* the loss: by rank alone */
        return a->rank < b->rank;
    if (a->stage != b->stage)
        return a->stage < b->stage;
    if (a->index != b->index)
        return a->index < b->index;
    return a->rank < b->rank;
}

loom_status loom_nonfinite_agree(loom_nonfinite *nf, const loom_param_table *t, int first_bad,
                                 int loss_bad, int spike, loom_nonfinite_report *out,
                                 double *comm_ms)
{
    finding mine;
    memset(&mine, 0, sizeof mine);
    mine.grad_bad = first_bad >= 0;
    mine.loss_bad = loss_bad != 0;
    mine.stage = nf->stage;
    mine.index = first_bad;
    mine.rank = nf->rank;
    mine.stop_signal = loom_stop_signal();
    mine.spike = spike != 0;
    if (first_bad >= 0 && first_bad < t->count)
        snprintf(mine.param, sizeof mine.param, "%s", t->entries[first_bad].name);
    if (nf->ops) {
        loom_comm_request *req = NULL;
        double t0 = loom_now_ms();
        LOOM_TRY(nf->ops->allgather_start(nf->world, &mine, nf->all, sizeof mine, LOOM_DTYPE_U8,
                                          &req));
        LOOM_TRY(nf->ops->wait(nf->world, req));
        *comm_ms += loom_now_ms() - t0;
    } else {
        nf->all[0] = mine;
    }
    const finding *best = NULL;
    int stop = 0, any_spike = 0;
    for (int r = 0; r < nf->size; r++) {
        const finding *f = &nf->all[r];
        stop = f->stop_signal > stop ? f->stop_signal : stop;
        any_spike |= f->spike;
        if ((f->grad_bad || f->loss_bad) && (!best || comes_first(f, best)))
            best = f;
    }
    memset(out, 0, sizeof *out);
    out->index = -1;
    out->stages = nf->stages;
    out->stop_signal = stop;
    out->spike = any_spike;
    if (!best)
        return LOOM_OK;
    out->found = 1;
    out->loss = best->loss_bad;
    out->rank = best->rank;
    out->stage = best->stage;
    out->index = best->loss_bad ? -1 : best->index;
    if (!best->loss_bad)
        memcpy(out->param, best->param, sizeof out->param);
    out->param[sizeof out->param - 1] = '\0';
    return LOOM_OK;
}

void loom_nonfinite_describe(const loom_nonfinite_report *r, char *buf, size_t n)
{
    if (r->loss)
        snprintf(buf, n, "non-finite loss on rank %d", r->rank);
    else if (r->stages > 1)
        snprintf(buf, n, "non-finite gradient on rank %d (pipeline stage %d), first in parameter '%s'",
                 r->rank, r->stage, r->param);
    else
        snprintf(buf, n, "non-finite gradient on rank %d, first in parameter '%s'", r->rank, r->param);
}
