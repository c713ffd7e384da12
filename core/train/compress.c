/* compress.c — onebit and topk gradient compression with error feedback (compress.h).
 *
 * Invariants: the residual is finite (a non-finite bucket leaves it untouched); every
 * rank's message has the same size (buckets and k are fixed at create), so one
 * all-gather of bytes carries them; messages are added in rank order 0..dp-1 into a
 * zeroed bucket, so every rank computes the same bits.
 */
#include "compress_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/gpt_stage.h"

int loom_compress_method_of(const char *name)
{
    if (!strcmp(name, "onebit"))
        return LOOM_COMPRESS_ONEBIT;
    if (!strcmp(name, "topk"))
        return LOOM_COMPRESS_TOPK;
    if (!strcmp(name, "powersgd"))
        return LOOM_COMPRESS_POWERSGD;
    return -1;
}

const char *loom_compress_method_name(int method)
{
    return method == LOOM_COMPRESS_ONEBIT     ? "onebit"
           : method == LOOM_COMPRESS_TOPK     ? "topk"
           : method == LOOM_COMPRESS_POWERSGD ? "powersgd"
                                              : "none";
}

int compress_takes(const loom_compress *c, loom_gpt *m, int i)
{
    const loom_param_entry *e = &loom_gpt_params(m)->entries[i];
    if (loom_gpt_held_elsewhere(m, e->name))
        return 0;
    if (c->cfg.experts)
        return loom_gpt_is_expert_entry(m, i);
    return !c->dense_only || !loom_gpt_is_expert_entry(m, i);
}

static loom_status make_buckets(loom_compress *c, loom_gpt *m)
{
    const loom_param_table *t = loom_gpt_params(m);
    size_t cap = c->cfg.bucket_mb > 0 ? (size_t)(c->cfg.bucket_mb * 1024 * 1024 / sizeof(float)) : 1u << 20;
    if (cap < 1)
        cap = 1;
    size_t nb = 0;
    for (int i = 0; i < t->count; i++)
        nb += (t->entries[i].numel + cap - 1) / cap;
    if (!(c->b = calloc(nb ? nb : 1, sizeof *c->b)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for compression buckets");
    size_t bits_at = 0, k_at = 0;
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        if (!compress_takes(c, m, i))
            continue;
        for (size_t lo = 0; lo < e->numel; lo += cap) {
            bucket *b = &c->b[c->nb++];
            b->lo = e->offset + lo;
            b->n = e->numel - lo < cap ? e->numel - lo : cap;
            code_bucket_place(c, b, &bits_at, &k_at);
        }
    }
    code_message_size(c, bits_at, k_at);
    return LOOM_OK;
}

void code_bucket_place(loom_compress *c, bucket *b, size_t *bits_at, size_t *k_at)
{
    b->k = (size_t)ceil(c->cfg.ratio * (double)b->n);
    b->k = b->k < 1 ? 1 : b->k > b->n ? b->n : b->k;
    b->at = c->cfg.method == LOOM_COMPRESS_ONEBIT ? *bits_at : *k_at;
    *bits_at += (b->n + 7) / 8;
    *k_at += b->k;
    c->elems += b->n;
    if (b->n > c->max_n)
        c->max_n = b->n;
}

void code_message_size(loom_compress *c, size_t bits_at, size_t k_at)
{
    c->sum_k = k_at;
    c->msg_bytes = c->cfg.method == LOOM_COMPRESS_ONEBIT ? (size_t)c->nb * sizeof(float) + bits_at
                                                         : k_at * (sizeof(float) + sizeof(uint32_t));
}

loom_status loom_compress_create(const loom_compress_config *cfg, loom_gpt *m,
                                 const loom_comm_ops *comm, void *dp, int dp_size,
                                 loom_compress **out)
{
    *out = NULL;
    if (cfg->method < LOOM_COMPRESS_ONEBIT || cfg->method > LOOM_COMPRESS_POWERSGD)
        LOOM_FAIL(LOOM_ERR_INVALID, "compress method %d: \"onebit\", \"topk\" or \"powersgd\"",
                  cfg->method);
    if (cfg->method == LOOM_COMPRESS_POWERSGD && !(cfg->rank >= 1 && cfg->rank <= 1024))
        LOOM_FAIL(LOOM_ERR_INVALID, "compress powersgd rank=%d must be in [1, 1024] (the rank of "
                  "each matrix's approximation, e.g. 2)", cfg->rank);
    if (cfg->method == LOOM_COMPRESS_TOPK && !(cfg->ratio > 0 && cfg->ratio <= 1))
        LOOM_FAIL(LOOM_ERR_INVALID, "compress topk ratio=%g must be in (0, 1] (the fraction of "
                  "each bucket sent, e.g. 0.01)", cfg->ratio);
    if (cfg->warmup < 0 || !(cfg->bucket_mb >= 0 && cfg->bucket_mb <= 4096))
        LOOM_FAIL(LOOM_ERR_INVALID, "compress warmup=%lld must be >= 0 and bucket_mb=%g in (0, 4096]",
                  (long long)cfg->warmup, cfg->bucket_mb);
    if (cfg->momentum != 0 && cfg->method == LOOM_COMPRESS_POWERSGD)
        LOOM_FAIL(LOOM_ERR_INVALID, "compress momentum = true (1-bit Adam) exchanges the momentum "
                  "with onebit or topk, not powersgd (whose low-rank factors are of the gradient)");
    if (cfg->momentum != 0 && (!(cfg->momentum > 0 && cfg->momentum < 1) || cfg->warmup < 1))
        LOOM_FAIL(LOOM_ERR_INVALID, "compress momentum = true (1-bit Adam) needs adamw's beta1 in "
                  "(0, 1) (got %g) and warmup >= 1: the uncompressed steps that set Adam's "
                  "variance before it is frozen (got %lld; Tang et al. warm up for 15-25%% of "
                  "the run)", cfg->momentum, (long long)cfg->warmup);
    if (cfg->leaves <= 0 && (!comm || dp_size < 2))
        LOOM_FAIL(LOOM_ERR_INVALID, "compress needs a data-parallel group of 2 or more ranks "
                  "(mesh.dp >= 2); with dp=1 there is no gradient exchange to compress");
    loom_compress *c = calloc(1, sizeof *c);
    if (!c)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    c->cfg = *cfg;
    c->comm = comm;
    c->dp = dp;
    c->dp_size = dp_size;
    c->dp_rank = comm ? comm->rank(dp) : 0;
    c->total = loom_gpt_params(m)->total;
    /* under ep the experts' gradients are the edp group's (loom_compress_add_experts) */
    c->dense_only = !cfg->experts && loom_gpt_expert_parallel(m) > 1;
    if ((cfg->experts || c->dense_only) && cfg->leaves > 0) {
        free(c);
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "compress: canonical mode under ep is not built (compress.h)");
    }
    loom_status st = cfg->leaves > 0                         ? canon_plan(c, m)
                     : cfg->method == LOOM_COMPRESS_POWERSGD ? powersgd_plan(c, m)
                                                             : make_buckets(c, m);
    size_t slots = cfg->leaves > 0 ? (size_t)cfg->leaves : 1; /* residuals and messages */
    if (st == LOOM_OK) {
        c->residual = calloc(slots * c->total + 1, sizeof(float));
        c->msg = malloc(slots * c->msg_bytes + 1);
        c->gathered = malloc(slots * c->msg_bytes * (size_t)dp_size + 1);
        c->scratch = malloc((c->max_n + 1) * sizeof(float));
        c->pick = malloc((c->max_n + 1) * sizeof(uint32_t));
        if (!c->residual || !c->msg || !c->gathered || !c->scratch || !c->pick)
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for compression buffers");
    }
    if (st != LOOM_OK) {
        loom_compress_destroy(c);
        return st;
    }
    *out = c;
    return LOOM_OK;
}

void loom_compress_destroy(loom_compress *c)
{
    if (!c)
        return;
    loom_compress_destroy(c->experts);
    free(c->b);
    if (!c->borrowed)
        free(c->residual);
    free(c->msg);
    free(c->gathered);
    free(c->scratch);
    free(c->pick);
    free(c->p_sum);
    free(c->q_mine);
    free(c->q_sum);
    free(c->bucket_m);
    free(c->m_host);
    free(c->m_segs);
    free(c->strided_g);
    free(c->leaf_bad);
    free(c);
}

loom_status loom_compress_add_experts(loom_compress *c, loom_gpt *m, const loom_comm_ops *comm,
                                      void *edp, int edp_size)
{
    if (!c->dense_only || c->experts)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "compress: experts added %s", c->experts ? "twice"
                  : "to a compressor without ep");
    if (edp_size < 2)
        return LOOM_OK; /* ep = dp: each expert's gradient is whole on its owner already */
    loom_compress_config cfg = c->cfg;
    cfg.experts = 1;
    loom_compress *x;
    LOOM_TRY(loom_compress_create(&cfg, m, comm, edp, edp_size, &x));
    free(x->residual); /* the dense compressor's: disjoint buckets of the same layout */
    x->residual = c->residual;
    x->borrowed = 1;
    c->experts = x;
    return LOOM_OK;
}

int loom_compress_active(const loom_compress *c, int64_t step) { return c && step > c->cfg.warmup; }
void loom_compress_begin_step(loom_compress *c, int64_t step)
{
    if (c->experts)
        loom_compress_begin_step(c->experts, step);
    c->step = step;
    loom_compress_momentum_pull(c); /* 1-bit Adam on a device: this step's m to the host */
    if (c->leaf_bad)
        memset(c->leaf_bad, 0, (size_t)c->cfg.leaves);
}
size_t loom_compress_message_bytes(const loom_compress *c)
{
    return c->msg_bytes * (size_t)loom_compress_residual_slots(c) +
           loom_compress_expert_message_bytes(c);
}
size_t loom_compress_expert_message_bytes(const loom_compress *c)
{
    return c->experts ? loom_compress_message_bytes(c->experts) : 0;
}
size_t loom_compress_expert_raw_bytes(const loom_compress *c)
{
    return c->experts ? loom_compress_raw_bytes(c->experts) : 0;
}
int loom_compress_residual_slots(const loom_compress *c) { return c->cfg.leaves > 0 ? c->cfg.leaves : 1; }
int loom_compress_canonical(const loom_compress *c) { return c->cfg.leaves > 0; }
size_t loom_compress_raw_bytes(const loom_compress *c)
{
    return c->elems * sizeof(float) + loom_compress_expert_raw_bytes(c);
}
int loom_compress_method_in_use(const loom_compress *c) { return c->cfg.method; }
int loom_compress_dp_size(const loom_compress *c) { return c->dp_size; }
int loom_compress_dp_rank(const loom_compress *c) { return c->dp_rank; }

float *loom_compress_residual(loom_compress *c, size_t *floats)
{
    *floats = c->total * (size_t)loom_compress_residual_slots(c);
    return c->residual;
}

size_t loom_compress_buffer_bytes(const loom_compress *c)
{
    size_t slots = (size_t)loom_compress_residual_slots(c);
    size_t experts = c->experts ? loom_compress_buffer_bytes(c->experts) : 0;
    return experts + slots * ((c->borrowed ? 0 : c->total * sizeof(float)) +
                              c->msg_bytes * (size_t)(1 + c->dp_size)) +
           c->max_n * (sizeof(float) + sizeof(uint32_t)) +
           (c->sum_p + 2 * c->sum_q) * sizeof(float) +
           (c->cfg.leaves > 0 /* canonical: strided scratch, each leaf's Q, the raw sums */
                ? 2 * c->max_n * sizeof(float) + (size_t)c->cfg.leaves +
                      ((size_t)(c->cfg.leaves - 1) * c->sum_q + c->sum_raw) * sizeof(float)
                : 0);
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* --- onebit ---------------------------------------------------------------------------- */

static void onebit_pack(float *residual, const bucket *b, const float *g, float *scale_out,
                        unsigned char *bits)
{
    float *e = residual + b->lo;
    memset(bits, 0, (b->n + 7) / 8);
    if (!all_finite(g, b->n)) {
        *scale_out = NAN;
        return;
    }
    double sum = 0.0;
    for (size_t i = 0; i < b->n; i++) {
        e[i] += g[i]; /* e holds v = g + e */
        sum += fabs((double)e[i]);
    }
    float s = (float)(sum / (double)b->n);
    for (size_t i = 0; i < b->n; i++) {
        int pos = e[i] >= 0.0f;
        bits[i >> 3] |= (unsigned char)(pos << (i & 7));
        e[i] -= pos ? s : -s;
    }
    memcpy(scale_out, &s, sizeof s);
}

/* --- topk ------------------------------------------------------------------------------ */

/* The k-th largest of a[0..n) (1 <= k <= n), by quickselect with a three-way partition
 * around a median-of-three pivot (deterministic: no random pivot). a is reordered. */
static float kth_largest(float *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n, want = k - 1; /* position in descending order */
    while (hi - lo > 1) {
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi - 1];
        float p = (x > y) == (y > z) ? y : (x > y) == (z > x) ? x : z;
        size_t lt = lo, i = lo, gt = hi; /* [lo, lt) > p, [lt, gt) == p, [gt, hi) < p */
        while (i < gt) {
            float t = a[i];
            if (t > p) {
                a[i++] = a[lt];
                a[lt++] = t;
            } else if (t < p) {
                a[i] = a[--gt];
                a[gt] = t;
            } else {
                i++;
            }
        }
        if (want < lt)
            hi = lt;
        else if (want >= gt)
            lo = gt;
        else
            return p;
    }
    return a[lo];
}

static void topk_pack(loom_compress *c, float *residual, const bucket *b, const float *g,
                      float *vals, uint32_t *idx)
{
    float *e = residual + b->lo;
    if (!all_finite(g, b->n)) {
        for (size_t j = 0; j < b->k; j++) {
            vals[j] = NAN;
            idx[j] = (uint32_t)j;
        }
        return;
    }
    for (size_t i = 0; i < b->n; i++) {
        e[i] += g[i];
        c->scratch[i] = fabsf(e[i]);
    }
    float thr = kth_largest(c->scratch, b->n, b->k);
    size_t above = 0;
    for (size_t i = 0; i < b->n; i++)
        above += fabsf(e[i]) > thr;
    size_t ties = b->k - above, j = 0;
    for (size_t i = 0; i < b->n && j < b->k; i++) {
        float a = fabsf(e[i]);
        if (a > thr || (a == thr && ties > 0)) {
            if (!(a > thr))
                ties--;
            vals[j] = e[i];
            idx[j++] = (uint32_t)i;
            e[i] = 0.0f; /* sent whole: nothing left over */
        }
    }
}

/* --- the exchange ---------------------------------------------------------------------- */

/* Every bucket of g (the gradient buffer's layout) into one message, the residual at
 * residual (the same layout) updated. */
static void pack(loom_compress *c, float *g, float *residual, unsigned char *msg, size_t lo,
                 size_t hi)
{
    size_t scales = (size_t)c->nb * sizeof(float), vals = c->sum_k * sizeof(float);
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        if (b->lo < lo || b->lo >= hi)
            continue; /* another part's (canonical mode under an interleaved pipeline) */
        momentum_before(c, i, g + b->lo);
        /* a strided bucket (canonical mode) packed from its elements gathered in box order;
         * its residual gathered into the slot the contiguous code reads, and put back */
        const float *gv = g + b->lo;
        float *ev = residual, *e_at = residual + b->lo;
        bucket flat = *b;
        if (b->width) {
            bucket_gather(b, g + b->lo, c->strided_g);
            gv = c->strided_g;
            ev = c->strided_g + c->max_n;
            bucket_gather(b, e_at, ev);
            flat.lo = 0;
            flat.width = 0;
        }
        if (c->cfg.method == LOOM_COMPRESS_ONEBIT)
            onebit_pack(ev, &flat, gv, (float *)(void *)(msg + (size_t)i * sizeof(float)),
                        msg + scales + b->at);
        else
            topk_pack(c, ev, &flat, gv, (float *)(void *)(msg + b->at * sizeof(float)),
                      (uint32_t *)(void *)(msg + vals + b->at * sizeof(uint32_t)));
        if (b->width)
            bucket_scatter(b, ev, e_at);
    }
}

/* One message decompressed and added into g's buckets. */
static void add_message(const loom_compress *c, const unsigned char *m, float *grads)
{
    size_t scales = (size_t)c->nb * sizeof(float), vals = c->sum_k * sizeof(float);
    for (int i = 0; i < c->nb; i++) {
        const bucket *b = &c->b[i];
        float *g = grads + b->lo;
        if (c->cfg.method == LOOM_COMPRESS_ONEBIT) {
            float s;
            memcpy(&s, m + (size_t)i * sizeof(float), sizeof s);
            const unsigned char *bits = m + scales + b->at;
            for (size_t j = 0; j < b->n; j++) /* strided (canonical): into its place */
                g[bucket_at(b, j)] += (bits[j >> 3] >> (j & 7)) & 1 ? s : -s;
        } else {
            for (size_t j = 0; j < b->k; j++) {
                float v;
                uint32_t at;
                memcpy(&v, m + (b->at + j) * sizeof(float), sizeof v);
                memcpy(&at, m + vals + (b->at + j) * sizeof(uint32_t), sizeof at);
                g[bucket_at(b, at < b->n ? at : 0)] += v;
            }
        }
    }
}

loom_status compress_gather(loom_compress *c, size_t bytes)
{
    if (!c->comm) { /* one rank: its messages are all there are */
        memcpy(c->gathered, c->msg, bytes);
        return LOOM_OK;
    }
    loom_comm_request *req = NULL;
    LOOM_TRY(c->comm->allgather_start(c->dp, c->msg, c->gathered, bytes, LOOM_DTYPE_U8, &req));
    return c->comm->wait(c->dp, req);
}

static loom_status exchange_own(loom_compress *c, float *grads);

loom_status loom_compress_exchange(loom_compress *c, float *grads)
{
    LOOM_TRY(exchange_own(c, grads)); /* under ep: the dense entries over dp */
    return c->experts ? exchange_own(c->experts, grads) : LOOM_OK; /* the experts over edp */
}

static loom_status exchange_own(loom_compress *c, float *grads)
{
    if (c->cfg.method == LOOM_COMPRESS_POWERSGD)
        return powersgd_exchange(c, grads);
    if (c->cfg.leaves > 0)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "compress: canonical mode exchanges leaf by leaf");
    pack(c, grads, c->residual, c->msg, 0, c->total);
    LOOM_TRY(compress_gather(c, c->msg_bytes));
    for (int i = 0; i < c->nb; i++)
        memset(grads + c->b[i].lo, 0, c->b[i].n * sizeof(float));
    for (int r = 0; r < c->dp_size; r++) /* rank order: every rank adds the same way */
        add_message(c, c->gathered + (size_t)r * c->msg_bytes, grads);
    for (int i = 0; i < c->nb; i++)
        momentum_after(c, i, grads + c->b[i].lo);
    return LOOM_OK;
}

/* --- canonical mode: a message and a residual per leaf (compress.h) -------------------- */

loom_status loom_compress_leaf(loom_compress *c, int a, float *grads)
{
    return loom_compress_leaf_range(c, a, grads, 0, c->total);
}

loom_status loom_compress_leaf_range(loom_compress *c, int a, float *grads, size_t off, size_t n)
{
    if (c->cfg.leaves <= 0 || a < 0 || a >= c->cfg.leaves)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "compress: leaf %d of %d", a, c->cfg.leaves);
    if (c->cfg.method == LOOM_COMPRESS_POWERSGD)
        return powersgd_leaf(c, a, grads, off, off + n);
    pack(c, grads, c->residual + (size_t)a * c->total, c->msg + (size_t)a * c->msg_bytes, off,
         off + n);
    return LOOM_OK;
}

loom_status loom_compress_gather_leaves(loom_compress *c)
{
    return compress_gather(c, (size_t)c->cfg.leaves * c->msg_bytes);
}

void loom_compress_decode_leaf(const loom_compress *c, int j, float *out)
{
    memset(out, 0, c->total * sizeof(float));
    add_message(c, c->gathered + (size_t)j * c->msg_bytes, out);
}

int loom_compress_sums_leaves(const loom_compress *c)
{
    return c->cfg.leaves > 0 && c->cfg.method == LOOM_COMPRESS_POWERSGD;
}

loom_status loom_compress_sum_leaves(loom_compress *c, struct loom_backend *be, float *grads)
{
    if (!loom_compress_sums_leaves(c))
        LOOM_FAIL(LOOM_ERR_INTERNAL, "compress: only canonical powersgd sums its own leaves");
    return powersgd_finish_leaves(c, be, grads);
}

void loom_compress_after_sum(loom_compress *c, float *grads)
{
    for (int i = 0; c->bucket_m && i < c->nb; i++)
        momentum_after(c, i, grads + c->b[i].lo);
}
