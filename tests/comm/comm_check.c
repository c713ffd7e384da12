/* comm_check.c — see comm_check.h. Test-only code: clarity over speed, and reference
 * arithmetic written independently of the plugin's (shm_reduce.c). */
#include "comm_check.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_harness.h"

#if !defined(__FLT16_MANT_DIG__)
#error "the f16 reference uses the compiler's _Float16 (GCC >= 12 or Clang on x86-64/arm64)"
#endif

static const char *const op_names[CC_N_OPS] = {
    "allreduce", "allreduce(in place)", "reduce_scatter", "allgather", "allgather(in place)",
    "broadcast", "alltoall", "alltoallv", "send/recv", "barrier"};

const char *cc_op_name(cc_op op) { return op < CC_N_OPS ? op_names[op] : "?"; }

static const char *dt_name(loom_dtype dt)
{
    static const char *const n[] = {"f32", "bf16", "f16", "i32", "u8", "u16"};
    return (unsigned)dt < 6 ? n[dt] : "?";
}

static size_t es_of(loom_dtype dt)
{
    return dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_I32 ? 4 : dt == LOOM_DTYPE_U8 ? 1 : 2;
}

/* ---- inputs ------------------------------------------------------------------------ */

static float f32_of(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t bits_of(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

/* 2^-6 .. 2^6: m * pow2[e] is exactly ldexpf(m, e - 6) for these normal m, without the
 * libm call (a fifth of the sweep's time went to scalbnf). */
static const float pow2[13] = {0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f, 1.0f,
                               0x1p1f, 0x1p2f, 0x1p3f, 0x1p4f, 0x1p5f, 0x1p6f};

/* Element i of rank's input, as raw bits (in a uint32). Floats have varied exponents so a
 * different summation order would almost surely change the bits. */
static uint32_t gen(loom_dtype dt, unsigned salt, int rank, size_t i)
{
    unsigned long long h = th_hash(salt, (unsigned long long)rank, i);
    switch (dt) {
    case LOOM_DTYPE_F32:
    case LOOM_DTYPE_BF16: {
        float m = (float)((h >> 8) & 0xffffff) / 16777216.0f + 0.5f;
        float v = m * pow2[h % 13];
        if ((h >> 40) & 1)
            v = -v;
        return dt == LOOM_DTYPE_F32 ? bits_of(v) : bits_of(v) >> 16;
    }
    case LOOM_DTYPE_F16: /* exponent 0..20: subnormals too */
        return (uint32_t)(((h >> 20) & 1) << 15 | (h % 21) << 10 | ((h >> 8) & 0x3ff));
    case LOOM_DTYPE_I32: return (uint32_t)(h >> 16);
    case LOOM_DTYPE_U8: return (uint32_t)(h >> 24) & 0xff;
    default: return (uint32_t)(h >> 24) & 0xffff;
    }
}

static void put(loom_dtype dt, void *buf, size_t i, uint32_t v)
{
    size_t es = es_of(dt);
    if (es == 4)
        memcpy((uint8_t *)buf + 4 * i, &v, 4);
    else if (es == 2)
        ((uint16_t *)buf)[i] = (uint16_t)v;
    else
        ((uint8_t *)buf)[i] = (uint8_t)v;
}

static uint32_t get(loom_dtype dt, const void *buf, size_t i)
{
    size_t es = es_of(dt);
    uint32_t v;
    if (es == 4)
        memcpy(&v, (const uint8_t *)buf + 4 * i, 4);
    else if (es == 2)
        v = ((const uint16_t *)buf)[i];
    else
        v = ((const uint8_t *)buf)[i];
    return v;
}

void cc_fill(loom_dtype dt, unsigned salt, int rank, size_t first, size_t count, void *dst)
{
    for (size_t i = 0; i < count; i++)
        put(dt, dst, i, gen(dt, salt, rank, first + i));
}

/* ---- the reference ------------------------------------------------------------------- */

static float to_f32(loom_dtype dt, uint32_t b)
{
    if (dt == LOOM_DTYPE_F32)
        return f32_of(b);
    if (dt == LOOM_DTYPE_BF16)
        return f32_of(b << 16);
    /* f16: a table of all 65536 conversions, built on first use in each rank (the
     * compiler's _Float16 -> float is a software call on plain x86-64) */
    static float f16[65536];
    static int have_f16;
    if (!have_f16) {
        for (uint32_t u = 0; u < 65536; u++) {
            uint16_t h = (uint16_t)u;
            _Float16 x;
            memcpy(&x, &h, 2);
            f16[u] = (float)x;
        }
        have_f16 = 1;
    }
    return f16[b & 0xffff];
}

/* Nearest bf16, ties to even, by looking at both neighbours (not by bit tricks). */
static uint32_t ref_bf16(float f)
{
    uint32_t b = bits_of(f), sign = b & 0x80000000u, lo = (b & 0x7fffffffu) & 0xffff0000u;
    uint32_t hi = lo + 0x10000u;
    double a = fabs((double)f), dlo = a - (double)f32_of(lo), dhi = (double)f32_of(hi) - a;
    uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1 ? hi : lo);
    return (sign | pick) >> 16;
}

static uint32_t from_f32(loom_dtype dt, float f)
{
    if (dt == LOOM_DTYPE_F32)
        return bits_of(f);
    if (dt == LOOM_DTYPE_BF16)
        return ref_bf16(f);
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

/* Reduce element idx_r of every rank r (idx given per rank by the caller's array). */
static uint32_t ref_reduce(loom_dtype dt, loom_reduce_op red, int n, unsigned salt, size_t idx)
{
    if (dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16) {
        float acc = to_f32(dt, gen(dt, salt, 0, idx));
        for (int r = 1; r < n; r++) {
            float x = to_f32(dt, gen(dt, salt, r, idx));
            acc = red == LOOM_REDUCE_MAX ? (x > acc ? x : acc) : acc + x;
        }
        if (red == LOOM_REDUCE_AVG)
            acc = acc / (float)n;
        return from_f32(dt, acc);
    }
    int64_t acc = 0;
    for (int r = 0; r < n; r++) {
        uint32_t b = gen(dt, salt, r, idx);
        int64_t x = dt == LOOM_DTYPE_I32 ? (int64_t)(int32_t)b : (int64_t)b;
        acc = r == 0 ? x : red == LOOM_REDUCE_MAX ? (x > acc ? x : acc) : acc + x;
    }
    if (red == LOOM_REDUCE_AVG)
        acc /= n;
    uint64_t u = (uint64_t)acc;
    return dt == LOOM_DTYPE_I32 ? (uint32_t)u : dt == LOOM_DTYPE_U8 ? (uint32_t)(u & 0xff)
                                                                    : (uint32_t)(u & 0xffff);
}

/* ---- running one case ---------------------------------------------------------------- */

typedef struct ctx {
    const loom_comm_ops *ops;
    void *comm;
    const cc_case *k;
    int me, n;
    cc_share *share;
    char *err;
    size_t cap;
} ctx;

static int failf(ctx *x, const char *what, size_t at, uint32_t got, uint32_t want)
{
    static const char *const reds[] = {"sum", "avg", "max"};
    int red = x->k->op == CC_ALLREDUCE || x->k->op == CC_ALLREDUCE_INPLACE ||
              x->k->op == CC_REDUCE_SCATTER;
    snprintf(x->err, x->cap, "%s %s%s%s count %zu salt %u (rank %d of %d): %s at element %zu: "
             "got 0x%x, want 0x%x", cc_op_name(x->k->op), dt_name(x->k->dt), red ? " " : "",
             red ? reds[x->k->red] : "", x->k->count, x->k->salt, x->me, x->n, what, at, got, want);
    return 1;
}

/* st: what the start returned; *rp: the request it made (read after the start ran). */
static int call(ctx *x, loom_status st, loom_comm_request **rp, const char *what)
{
    if (st == LOOM_OK)
        st = x->ops->wait(x->comm, *rp);
    if (st == LOOM_OK)
        return 0;
    snprintf(x->err, x->cap, "%s %s count %zu (rank %d of %d): %s failed: %s: %s",
             cc_op_name(x->k->op), dt_name(x->k->dt), x->k->count, x->me, x->n, what,
             loom_status_name(st), loom_last_error());
    return 1;
}

/* alltoallv's shape, computable on every rank for every pair. */
static size_t v_count(const cc_case *k, int src, int dst)
{
    return k->count * (size_t)((src * 3 + dst * 5 + (int)k->salt) % 4) / 3;
}
static size_t v_sdispl(const cc_case *k, int src, int dst)
{
    size_t d = 0;
    for (int p = 0; p < dst; p++)
        d += v_count(k, src, p) + 1;
    return d;
}
static size_t v_rdispl(const cc_case *k, int me, int src)
{
    size_t d = 0;
    for (int q = 0; q < src; q++)
        d += v_count(k, q, me) + 2;
    return d;
}

/* The expected output of n elements that is the same on every rank (allreduce: the
 * reduction; allgather: every rank's input in turn), through x->share: this rank fills
 * its 1/n, then a barrier. NULL when there is no share or it is too small (the caller
 * computes its own); *bad set when the barrier failed. */
static const uint32_t *shared_want(ctx *x, size_t n, int *bad)
{
    cc_share *sh = x->share;
    if (sh == NULL || n * 4 > sh->bytes / 2)
        return NULL;
    uint32_t *want = (uint32_t *)((uint8_t *)sh->mem + (sh->seq++ % 2) * (sh->bytes / 2));
    const cc_case *k = x->k;
    const size_t lo = n * (size_t)x->me / (size_t)x->n, hi = n * (size_t)(x->me + 1) / (size_t)x->n;
    const size_t c = k->count ? k->count : 1;
    for (size_t i = lo; i < hi; i++)
        want[i] = k->op == CC_ALLGATHER || k->op == CC_ALLGATHER_INPLACE
                      ? gen(k->dt, k->salt, (int)(i / c), i % c)
                      : ref_reduce(k->dt, k->red, x->n, k->salt, i);
    loom_comm_request *r = NULL;
    *bad = call(x, x->ops->barrier_start(x->comm, &r), &r, "barrier (shared reference)");
    return want;
}

#define SENTINEL 0xa5u

static int check_sentinels(ctx *x, const uint8_t *buf, size_t from, size_t to, const char *what)
{
    for (size_t b = from; b < to; b++)
        if (buf[b] != SENTINEL)
            return failf(x, what, b, buf[b], SENTINEL);
    return 0;
}

static int run(ctx *x)
{
    const cc_case *k = x->k;
    const loom_dtype dt = k->dt;
    const size_t c = k->count, es = es_of(dt), n = (size_t)x->n;
    const int me = x->me;
    size_t send_n = c, recv_n = c;
    switch (k->op) {
    case CC_REDUCE_SCATTER: send_n = n * c; break;
    case CC_ALLGATHER: case CC_ALLGATHER_INPLACE: recv_n = n * c; break;
    case CC_ALLTOALL: send_n = recv_n = n * c; break;
    case CC_ALLTOALLV:
        send_n = v_sdispl(k, me, x->n);
        recv_n = v_rdispl(k, me, x->n);
        break;
    default: break;
    }
    uint8_t *send = malloc(send_n * es + 1), *recv = malloc(recv_n * es + 1);
    if (send == NULL || recv == NULL) {
        free(send), free(recv);
        snprintf(x->err, x->cap, "%s: out of memory", cc_op_name(k->op));
        return 1;
    }
    cc_fill(dt, k->salt, me, 0, send_n, send);
    memset(recv, SENTINEL, recv_n * es + 1);
    loom_comm_request *r = NULL;
    const loom_comm_ops *o = x->ops;
    int bad = 0;
    switch (k->op) {
    case CC_ALLREDUCE:
    case CC_ALLREDUCE_INPLACE: {
        uint8_t *out = k->op == CC_ALLREDUCE ? recv : send;
        bad = call(x, o->allreduce_start(x->comm, send, out, c, dt, k->red, &r), &r, "allreduce");
        const uint32_t *shared = bad ? NULL : shared_want(x, c, &bad);
        for (size_t i = 0; !bad && i < c; i++) {
            uint32_t want = shared ? shared[i] : ref_reduce(dt, k->red, x->n, k->salt, i);
            if (get(dt, out, i) != want)
                bad = failf(x, "wrong value", i, get(dt, out, i), want);
        }
        break;
    }
    case CC_REDUCE_SCATTER:
        bad = call(x, o->reduce_scatter_start(x->comm, send, recv, c, dt, k->red, &r), &r,
                   "reduce_scatter");
        for (size_t i = 0; !bad && i < c; i++) {
            uint32_t want = ref_reduce(dt, k->red, x->n, k->salt, (size_t)me * c + i);
            if (get(dt, recv, i) != want)
                bad = failf(x, "wrong value", i, get(dt, recv, i), want);
        }
        break;
    case CC_ALLGATHER:
    case CC_ALLGATHER_INPLACE: {
        const void *src = send;
        if (k->op == CC_ALLGATHER_INPLACE) {
            memcpy(recv + (size_t)me * c * es, send, c * es);
            src = recv + (size_t)me * c * es;
        }
        bad = call(x, o->allgather_start(x->comm, src, recv, c, dt, &r), &r, "allgather");
        const uint32_t *shared = bad ? NULL : shared_want(x, n * c, &bad);
        for (size_t j = 0; !bad && j < n * c; j++) {
            uint32_t want = shared ? shared[j] : gen(dt, k->salt, (int)(j / (c ? c : 1)), j % (c ? c : 1));
            if (get(dt, recv, j) != want)
                bad = failf(x, "wrong value", j, get(dt, recv, j), want);
        }
        break;
    }
    case CC_BROADCAST: {
        int root = (int)(k->salt % n);
        bad = call(x, o->broadcast_start(x->comm, send, c, dt, root, &r), &r, "broadcast");
        for (size_t i = 0; !bad && i < c; i++)
            if (get(dt, send, i) != gen(dt, k->salt, root, i))
                bad = failf(x, "wrong value", i, get(dt, send, i), gen(dt, k->salt, root, i));
        break;
    }
    case CC_ALLTOALL:
        bad = call(x, o->alltoall_start(x->comm, send, recv, c, dt, &r), &r, "alltoall");
        for (size_t j = 0; !bad && j < n * c; j++) {
            size_t q = j / c, i = j % c;
            uint32_t want = gen(dt, k->salt, (int)q, (size_t)me * c + i);
            if (get(dt, recv, j) != want)
                bad = failf(x, "wrong value", j, get(dt, recv, j), want);
        }
        break;
    case CC_ALLTOALLV: {
        size_t sc[64], sd[64], rc[64], rd[64];
        for (int p = 0; p < x->n; p++) {
            sc[p] = v_count(k, me, p);
            sd[p] = v_sdispl(k, me, p);
            rc[p] = v_count(k, p, me);
            rd[p] = v_rdispl(k, me, p);
        }
        bad = call(x, o->alltoallv_start(x->comm, send, sc, sd, recv, rc, rd, dt, &r), &r,
                   "alltoallv");
        for (int q = 0; !bad && q < x->n; q++) {
            size_t from = v_sdispl(k, q, me);
            for (size_t i = 0; !bad && i < rc[q]; i++)
                if (get(dt, recv, rd[q] + i) != gen(dt, k->salt, q, from + i))
                    bad = failf(x, "wrong value", rd[q] + i, get(dt, recv, rd[q] + i),
                                gen(dt, k->salt, q, from + i));
            size_t gap = (rd[q] + rc[q]) * es;
            if (!bad)
                bad = check_sentinels(x, recv, gap, gap + 2 * es, "gap overwritten");
        }
        break;
    }
    case CC_SENDRECV: {
        /* A ring, two messages per pair (c, then c/2+1) to check per-pair order; even ranks
         * start the send first, odd ranks the recv, and everything is waited in start order. */
        int to = (me + 1) % x->n, from = (me + x->n - 1) % x->n;
        size_t c2 = c / 2 + 1;
        uint8_t *recv2 = malloc(c2 * es), *send2 = malloc(c2 * es);
        cc_fill(dt, k->salt + 1, me, 0, c2, send2);
        loom_comm_request *q[4] = {0};
        loom_status st = LOOM_OK;
        if (me % 2 == 0) {
            st = o->send_start(x->comm, send, c, dt, to, &q[0]);
            if (!st) st = o->send_start(x->comm, send2, c2, dt, to, &q[1]);
            if (!st) st = o->recv_start(x->comm, recv, c, dt, from, &q[2]);
            if (!st) st = o->recv_start(x->comm, recv2, c2, dt, from, &q[3]);
        } else {
            st = o->recv_start(x->comm, recv, c, dt, from, &q[0]);
            if (!st) st = o->recv_start(x->comm, recv2, c2, dt, from, &q[1]);
            if (!st) st = o->send_start(x->comm, send, c, dt, to, &q[2]);
            if (!st) st = o->send_start(x->comm, send2, c2, dt, to, &q[3]);
        }
        for (int i = 0; i < 4 && !bad; i++)
            bad = call(x, st, &q[i], "send/recv");
        for (size_t i = 0; !bad && i < c; i++)
            if (get(dt, recv, i) != gen(dt, k->salt, from, i))
                bad = failf(x, "wrong value (message 1)", i, get(dt, recv, i), gen(dt, k->salt, from, i));
        for (size_t i = 0; !bad && i < c2; i++)
            if (get(dt, recv2, i) != gen(dt, k->salt + 1, from, i))
                bad = failf(x, "wrong value (message 2)", i, get(dt, recv2, i),
                            gen(dt, k->salt + 1, from, i));
        free(recv2), free(send2);
        break;
    }
    case CC_BARRIER:
        bad = call(x, o->barrier_start(x->comm, &r), &r, "barrier");
        break;
    default:
        break;
    }
    if (!bad && (k->op == CC_ALLREDUCE || k->op == CC_REDUCE_SCATTER || k->op == CC_ALLGATHER ||
                 k->op == CC_ALLTOALL))
        bad = check_sentinels(x, recv, recv_n * es, recv_n * es + 1, "wrote past the end");
    free(send), free(recv);
    return bad;
}

int cc_run_shared(const loom_comm_ops *ops, void *comm, const cc_case *k, cc_share *share,
                  char *err, size_t cap)
{
    ctx x = {ops, comm, k, ops->rank(comm), ops->world(comm), share, err, cap};
    return run(&x);
}

int cc_run(const loom_comm_ops *ops, void *comm, const cc_case *k, char *err, size_t cap)
{
    return cc_run_shared(ops, comm, k, NULL, err, cap);
}

/* The count of op in a sweep of size over n ranks: size, but for the blocked ops with
 * chunk > 0 four rounds of chunk / n bytes, the last one ragged (see cc_run_sweep). */
static size_t count_of(int op, loom_dtype dt, size_t size, size_t n, size_t chunk)
{
    int blocked = op == CC_REDUCE_SCATTER || op == CC_ALLTOALL || op == CC_ALLTOALLV;
    size_t round = chunk / n / es_of(dt);
    return blocked && chunk ? 3 * round + 3 : size;
}

static int run_all(const loom_comm_ops *ops, void *comm, const size_t *sizes, int n_sizes,
                   unsigned salt, size_t chunk, cc_share *share, const char *where, char *err,
                   size_t cap)
{
    static const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F16,
                                     LOOM_DTYPE_I32, LOOM_DTYPE_U8, LOOM_DTYPE_U16};
    const size_t n = (size_t)ops->world(comm);
    for (int s = 0; s < n_sizes; s++)
        for (int op = 0; op < CC_N_OPS; op++)
            for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
                int reduces = op == CC_ALLREDUCE || op == CC_ALLREDUCE_INPLACE ||
                              op == CC_REDUCE_SCATTER;
                if (op == CC_BARRIER && d > 0)
                    continue;
                for (int red = 0; red < (reduces ? 3 : 1); red++) {
                    cc_case k = {(cc_op)op, dts[d], (loom_reduce_op)red,
                                 count_of(op, dts[d], sizes[s], n, chunk),
                                 salt + 7919u * (unsigned)(s * 97 + op * 13 + (int)d * 3 + red)};
                    if (cc_run_shared(ops, comm, &k, share, err, cap)) {
                        size_t len = strlen(err);
                        snprintf(err + len, cap - len, " [%s]", where);
                        return 1;
                    }
                }
            }
    return 0;
}

int cc_run_all(const loom_comm_ops *ops, void *comm, const size_t *sizes, int n_sizes,
               unsigned salt, const char *where, char *err, size_t cap)
{
    return run_all(ops, comm, sizes, n_sizes, salt, 0, NULL, where, err, cap);
}

int cc_run_sweep(const loom_comm_ops *ops, void *comm, size_t size, size_t chunk, unsigned salt,
                 cc_share *share, const char *where, char *err, size_t cap)
{
    return run_all(ops, comm, &size, 1, salt, chunk, share, where, err, cap);
}
