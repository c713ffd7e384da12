/* profile.c — LOOM_CUDA_PROFILE (profile.h): pairs of events around the backend's launches
 * and products, summed by (name, shape) when the pending pairs fill up or the backend
 * closes. */
#include "profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"

int loom_cuda_profiling;

enum { PENDING = 4096 }; /* event pairs in flight before they are read back (2 x 4096 events) */

typedef struct prof_entry {
    const char *what;
    int m, n, k, batch;
    long long calls;
    double ms;
} prof_entry;

typedef struct prof_span {
    int entry;
    cudaEvent_t start, end;
} prof_span;

static struct {
    const loom_host *host;
    FILE *out;               /* NULL: the log's table */
    prof_entry *entries;
    int n_entries, cap_entries;
    prof_span pending[PENDING];
    int n_pending, n_events; /* pairs waiting; pairs of events created so far (reused) */
    int depth, open_entry;   /* nesting; the entry of the outermost open span */
    cudaEvent_t first, last; /* the first span's start; the latest span's end */
    int have_first;
    double first_to_last_ms;
    long long spans;
    int failed;              /* an event call failed: the profile is incomplete, and says so */
} P;

static int file_opened_before; /* a second backend in this process appends to the same file */

int loom_cuda_profile_setup(const loom_host *host, char *err, size_t err_size)
{
    memset(&P, 0, sizeof P);
    loom_cuda_profiling = 0;
    const char *v = getenv("LOOM_CUDA_PROFILE");
    if (!v || !*v || !strcmp(v, "0"))
        return 0;
    P.host = host;
    if (strcmp(v, "1") != 0) {
        char path[4096];
        const char *r = strstr(v, "%r");
        if (r)
            snprintf(path, sizeof path, "%.*s%d%s", (int)(r - v), v, host ? host->rank : 0, r + 2);
        else
            snprintf(path, sizeof path, "%s", v);
        P.out = fopen(path, file_opened_before ? "a" : "w");
        if (!P.out) {
            snprintf(err, err_size, "LOOM_CUDA_PROFILE=%s: cannot open %s for writing; use 1 "
                     "(a table in the log) or a writable path", v, path);
            return -1;
        }
        file_opened_before = 1;
    }
    loom_cuda_profiling = 1;
    return 0;
}

static void note(const char *what, cudaError_t e)
{
    if (e != cudaSuccess && !P.failed) {
        P.failed = 1;
        if (P.host)
            P.host->log(LOOM_LOG_WARN, "backend cuda: LOOM_CUDA_PROFILE: %s: %s; the profile "
                        "is incomplete", what, cudaGetErrorString(e));
    }
}

static int entry_of(const char *what, int m, int n, int k, int batch)
{
    for (int i = 0; i < P.n_entries; i++) {
        const prof_entry *e = &P.entries[i];
        if ((e->what == what || !strcmp(e->what, what)) && e->m == m && e->n == n && e->k == k &&
            e->batch == batch)
            return i;
    }
    if (P.n_entries == P.cap_entries) {
        int cap = P.cap_entries ? 2 * P.cap_entries : 64;
        prof_entry *g = realloc(P.entries, (size_t)cap * sizeof *g);
        if (!g)
            return -1;
        P.entries = g;
        P.cap_entries = cap;
    }
    P.entries[P.n_entries] = (prof_entry){what, m, n, k, batch, 0, 0.0};
    return P.n_entries++;
}

/* Reads back every pending pair (the stream has passed their end events once the last one
 * has completed) into their entries. */
static void drain(void)
{
    if (!P.n_pending)
        return;
    note("cudaEventSynchronize", cudaEventSynchronize(P.pending[P.n_pending - 1].end));
    for (int i = 0; i < P.n_pending; i++) {
        float ms = 0.0f;
        cudaError_t e = cudaEventElapsedTime(&ms, P.pending[i].start, P.pending[i].end);
        note("cudaEventElapsedTime", e);
        if (e == cudaSuccess && P.pending[i].entry >= 0)
            P.entries[P.pending[i].entry].ms += ms;
    }
    float total = 0.0f;
    if (P.have_first && cudaEventElapsedTime(&total, P.first, P.last) == cudaSuccess)
        P.first_to_last_ms = total;
    P.n_pending = 0;
}

void loom_cuda_profile_span_begin(const char *what, int m, int n, int k, int batch)
{
    if (P.depth++ > 0)
        return;
    if (P.n_pending == PENDING)
        drain();
    prof_span *s = &P.pending[P.n_pending];
    if (P.n_pending == P.n_events) { /* the first pass over this slot: its events */
        cudaError_t e = cudaEventCreate(&s->start);
        if (e == cudaSuccess && (e = cudaEventCreate(&s->end)) != cudaSuccess)
            cudaEventDestroy(s->start);
        note("cudaEventCreate", e);
        if (e != cudaSuccess) {
            P.open_entry = -2; /* this span is not timed */
            return;
        }
        P.n_events++;
    }
    if (!P.have_first) {
        note("cudaEventCreate", cudaEventCreate(&P.first));
        note("cudaEventRecord", cudaEventRecord(P.first, loom_cuda.stream));
        P.have_first = 1;
    }
    P.open_entry = entry_of(what, m, n, k, batch);
    note("cudaEventRecord", cudaEventRecord(s->start, loom_cuda.stream));
}

void loom_cuda_profile_span_end(void)
{
    if (P.depth == 0 || --P.depth > 0)
        return;
    if (P.open_entry == -2)
        return;
    prof_span *s = &P.pending[P.n_pending++];
    s->entry = P.open_entry;
    note("cudaEventRecord", cudaEventRecord(s->end, loom_cuda.stream));
    P.last = s->end;
    P.spans++;
    if (s->entry >= 0)
        P.entries[s->entry].calls++;
}

static int by_time(const void *a, const void *b)
{
    const prof_entry *x = a, *y = b;
    return x->ms < y->ms ? 1 : x->ms > y->ms ? -1 : 0;
}

/* JSON string body: the names are the backend's literals, but a quote or backslash would
 * still break the file. */
static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

void loom_cuda_profile_report(void)
{
    if (!loom_cuda_profiling)
        return;
    drain(); /* the last pair's end is now complete, and every pair before it */
    qsort(P.entries, (size_t)P.n_entries, sizeof *P.entries, by_time);
    double device_ms = 0.0;
    for (int i = 0; i < P.n_entries; i++)
        device_ms += P.entries[i].ms;
    const double span_ms = P.first_to_last_ms;
    for (int i = 0; i < P.n_entries; i++) {
        const prof_entry *e = &P.entries[i];
        /* a product's rate: 2 M N K flops per batch entry per call */
        const double flops = 2.0 * e->m * (double)e->n * e->k * (e->batch ? e->batch : 1);
        const double tflops = e->k && e->ms > 0 ? flops * e->calls / (e->ms * 1e9) : 0.0;
        if (P.out) {
            fputs("{\"op\":", P.out);
            put_json_string(P.out, e->what);
            fprintf(P.out, ",\"m\":%d,\"n\":%d,\"k\":%d,\"batch\":%d,\"calls\":%lld,\"ms\":%.6f,"
                    "\"share\":%.6f", e->m, e->n, e->k, e->batch, e->calls, e->ms,
                    device_ms > 0 ? e->ms / device_ms : 0.0);
            if (e->k)
                fprintf(P.out, ",\"tflops\":%.4f", tflops);
            fputs("}\n", P.out);
        } else if (P.host && i < 40) {
            char shape[80] = "", batch[24] = "";
            if (e->batch > 1)
                snprintf(batch, sizeof batch, " x %d", e->batch);
            if (e->k)
                snprintf(shape, sizeof shape, " %dx%dx%d%s  %.2f TFLOP/s", e->m, e->n, e->k,
                         batch, tflops);
            P.host->log(LOOM_LOG_INFO, "cuda profile: %6.2f%% %10.3f ms %8lld calls  %s%s",
                        device_ms > 0 ? 100.0 * e->ms / device_ms : 0.0, e->ms, e->calls,
                        e->what, shape);
        }
    }
    if (P.out) {
        fprintf(P.out, "{\"total\":true,\"device_ms\":%.6f,\"first_to_last_ms\":%.6f,\"busy\":%.6f,"
                "\"spans\":%lld,\"entries\":%d,\"complete\":%s}\n", device_ms, span_ms,
                span_ms > 0 ? device_ms / span_ms : 0.0, P.spans, P.n_entries,
                P.failed ? "false" : "true");
        fclose(P.out);
    } else if (P.host) {
        P.host->log(LOOM_LOG_INFO, "cuda profile: %.3f ms on the device in %lld spans (%d "
                    "entries), %.3f ms from the first to the last: busy %.1f%%%s",
                    device_ms, P.spans, P.n_entries, span_ms,
                    span_ms > 0 ? 100.0 * device_ms / span_ms : 0.0,
                    P.failed ? " (incomplete: an event call failed)" : "");
    }
    for (int i = 0; i < P.n_events; i++) {
        cudaEventDestroy(P.pending[i].start);
        cudaEventDestroy(P.pending[i].end);
    }
    if (P.have_first)
        cudaEventDestroy(P.first);
    free(P.entries);
    memset(&P, 0, sizeof P);
    loom_cuda_profiling = 0;
}
