/* gpt.c — GPT-2 forward and backward over the backend's kernels.
 *
 * Activation buffers are sized once for (max_B, ctx) and reused; a forward with smaller
 * B or T uses a prefix of each. Backward keeps one residual-gradient buffer and walks the
 * blocks top-down; every input gradient is produced fresh (kernels overwrite) and the
 * residual branches join it with `accumulate`.
 */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

typedef struct layer_params {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} layer_params;

typedef struct model_params {
    float *wte, *wpe, *lnfw, *lnfb;
    layer_params *layer; /* [L] */
} model_params;

/* Saved per layer for backward. R = max_B*ctx token rows; Rl = this rank's rows of the
 * residual stream (R, or R/tp with sequence parallelism); Cl, Fl = this rank's attention
 * and MLP widths. The *_full buffers are the layernorm outputs over all R rows: aliases of
 * the local ones without sequence parallelism; with it, one shared buffer (m->gathered)
 * that forward fills by all-gather just before use and backward fills again just before
 * the weight gradient needs it (Korthikanti et al.: only the 1/tp shard is kept). */
typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (Rl,C) (Rl) (Rl) */
    float *ln1_full;                  /* (R,C) */
    float *qkv;                       /* (R,3Cl) */
    float *atty;                      /* (R,Cl) attention output before projection */
    float *att;                       /* (B,NH/tp,T,T) */
    float *res2;                      /* (Rl,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd, *ln2_full;
    float *fch, *fch_gelu;            /* (R,Fl) */
    float *res3;                      /* (Rl,C) block output */
} layer_acts;

struct loom_gpt {
    loom_gpt_config cfg;
    loom_backend *be;
    loom_param_table table;
    float *params, *grads;
    model_params p, g;
    int max_B;
    /* tensor parallelism (gpt.h): tp_ops NULL for one rank */
    const loom_strategy_ops *tp_ops;
    void *tp_self;
    int tp, tp_rank, sp, canonical;
    int Cl, NHl, Fl, Vl, v0;  /* this rank's widths and first vocabulary row */
    /* activations */
    void *act_mem;
    size_t act_bytes;
    layer_acts *acts;
    float *encoded, *lnf, *lnf_mean, *lnf_rstd, *lnf_full, *logits, *losses;
    float *gathered;                   /* (R,C) under sequence parallelism: see layer_acts */
    float *ce_max, *ce_stats;          /* (R) row maxima; (2R) sum of exps, target logits */
    float *partial, *summed;           /* (R,C) row-parallel partials; (Rl,C) their sum */
    int *tokens, *targets;
    /* backward scratch */
    float *dres, *dres_full, *dtmp, *dpartial, *dsummed, *dbuf_4a, *dbuf_4b, *datt_scratch;
    float *rep_grad;                   /* (6C) replicated parameters' gradient partials */
    float *tree[3];                    /* canonical: levels of the chunk tree, (R,C) each */
    float *host_losses, *row_gather;   /* (R) host; (Vp) host */
    int last_B, last_T, have_dlogits;
    double comm_ms;                    /* time inside tensor-parallel exchanges */
    loom_grad_ready_fn grad_ready;
    void *grad_ready_ctx;
};

void loom_gpt_set_grad_hook(loom_gpt *m, loom_grad_ready_fn fn, void *ctx)
{
    m->grad_ready = fn;
    m->grad_ready_ctx = ctx;
}

/* Report entries [first, last] (table indices) as final. They are contiguous in the
 * flat buffer because build_table adds them in that order. */
static loom_status entries_ready(loom_gpt *m, int first, int last)
{
    if (!m->grad_ready)
        return LOOM_OK;
    const loom_param_entry *a = &m->table.entries[first], *b = &m->table.entries[last];
    return m->grad_ready(m->grad_ready_ctx, a->offset, b->offset + b->numel - a->offset);
}

loom_status loom_gpt_config_check(const loom_gpt_config *c)
{
    if (c->vocab < 2)
        LOOM_FAIL(LOOM_ERR_INVALID, "model vocab=%d must be at least 2", c->vocab);
    if (c->vocab_padded && c->vocab_padded < c->vocab)
        LOOM_FAIL(LOOM_ERR_INVALID, "model vocab_padded=%d is smaller than vocab=%d",
                  c->vocab_padded, c->vocab);
    if (c->ctx < 1 || c->layers < 1 || c->heads < 1 || c->dim < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "model ctx, layers, heads and dim must be positive "
                  "(got ctx=%d layers=%d heads=%d dim=%d)", c->ctx, c->layers, c->heads, c->dim);
    if (c->dim % c->heads != 0) {
        char ok[256] = "";
        size_t used = 0;
        for (int h = 1; h <= c->dim && used < sizeof ok; h++)
            if (c->dim % h == 0 && h <= 64)
                used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", used ? ", " : "", h);
        LOOM_FAIL(LOOM_ERR_INVALID, "model heads=%d does not divide dim=%d (heads may be %s)",
                  c->heads, c->dim, ok);
    }
    return LOOM_OK;
}

/* Ask the tp strategy where the entry added last lives; split_dim is the dim the model
 * allows it to cut (-1: replicated). */
static loom_status place_last(loom_gpt *m, int split_dim)
{
    loom_param_table *t = &m->table;
    t->entries[t->count - 1].split_dim = split_dim;
    if (!m->tp_ops || !m->tp_ops->partition)
        return LOOM_OK;
    const loom_param_entry *e = &t->entries[t->count - 1];
    loom_param_info info = {.name = e->name, .ndim = e->ndim, .offset = e->offset,
                            .numel = e->numel, .layer = e->layer, .split_dim = split_dim};
    for (int d = 0; d < e->ndim; d++) {
        info.shape[d] = e->shape[d];
        info.slice_start[d] = e->slice_start[d];
        info.slice_len[d] = e->slice_len[d];
    }
    loom_partition part = {-1, 1, 0};
    LOOM_TRY(m->tp_ops->partition(m->tp_self, &info, &part));
    if (part.dim < 0 || part.parts == 1)
        return LOOM_OK;
    if (part.dim != split_dim || part.parts != m->tp || part.index != m->tp_rank)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy asks to split %s along dim %d into %d parts; the "
                  "GPT model splits it only along dim %d into tp=%d", e->name, part.dim, part.parts,
                  split_dim, m->tp);
    return loom_params_slice_last(t, part.dim, part.parts, part.index);
}

/* The parameters, in the order bind_params expects. The fused QKV weight has logical shape
 * (3, C, C): q, k and v blocks, each split along dim 1 by heads, so a rank's slice is its
 * heads' q, k and v rows (the same bytes as llm.c's (3C, C)). Column-parallel layers (qkv,
 * fc) split output features; row-parallel ones (attn.proj, mlp.proj) input features; wte
 * its vocabulary rows (Vp/tp each; the rows >= vocab are padding). */
static loom_status build_table(loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    int64_t C = c->dim, L = c->layers;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L); /* GPT-2's residual scaling */
    loom_param_table *t = &m->table;
    int64_t sh[3];
    char name[LOOM_PARAM_NAME_MAX];
#define ADD(nm, nd, layer, init, sd, split)                                  \
    do {                                                                     \
        LOOM_TRY(loom_params_add(t, nm, nd, sh, layer, init, sd));           \
        LOOM_TRY(place_last(m, split));                                      \
    } while (0)
#define SHAPE(a, b, c3) (sh[0] = (a), sh[1] = (b), sh[2] = (c3))
    SHAPE(c->vocab_padded, C, 0);
    ADD("wte", 2, -1, LOOM_INIT_NORMAL, std, 0);
    t->entries[t->count - 1].init_rows = c->vocab; /* padding rows start at zero */
    SHAPE(c->ctx, C, 0); ADD("wpe", 2, -1, LOOM_INIT_NORMAL, 0.01f, -1);
    for (int l = 0; l < L; l++) {
#define LAYER(suffix, nd, a, b, c3, init, sd, split)                 \
    snprintf(name, sizeof name, "h.%d.%s", l, suffix);              \
    SHAPE(a, b, c3);                                                \
    ADD(name, nd, l, init, sd, split)
        LAYER("ln_1.weight", 1, C, 0, 0, LOOM_INIT_ONES, 0, -1);
        LAYER("ln_1.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
        LAYER("attn.qkv.weight", 3, 3, C, C, LOOM_INIT_NORMAL, std, 1);
        LAYER("attn.qkv.bias", 2, 3, C, 0, LOOM_INIT_ZEROS, 0, 1);
        t->entries[t->count - 1].is_matrix = 0; /* a bias: no weight decay by default */
        LAYER("attn.proj.weight", 2, C, C, 0, LOOM_INIT_NORMAL, proj_std, 1);
        LAYER("attn.proj.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
        LAYER("ln_2.weight", 1, C, 0, 0, LOOM_INIT_ONES, 0, -1);
        LAYER("ln_2.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
        LAYER("mlp.fc.weight", 2, 4 * C, C, 0, LOOM_INIT_NORMAL, std, 0);
        LAYER("mlp.fc.bias", 1, 4 * C, 0, 0, LOOM_INIT_ZEROS, 0, 0);
        LAYER("mlp.proj.weight", 2, C, 4 * C, 0, LOOM_INIT_NORMAL, proj_std, 1);
        LAYER("mlp.proj.bias", 1, C, 0, 0, LOOM_INIT_ZEROS, 0, -1);
#undef LAYER
    }
    SHAPE(C, 0, 0); ADD("ln_f.weight", 1, -1, LOOM_INIT_ONES, 0, -1);
    ADD("ln_f.bias", 1, -1, LOOM_INIT_ZEROS, 0, -1);
#undef ADD
#undef SHAPE
    return LOOM_OK;
}

/* Point p at the entries of base, in table order (the order build_table added them). */
static void bind_params(loom_gpt *m, float *base, model_params *p)
{
    const loom_param_entry *e = m->table.entries;
    p->wte = base + e[0].offset;
    p->wpe = base + e[1].offset;
    int i = 2;
    for (int l = 0; l < m->cfg.layers; l++) {
        /* layer_params is 12 float pointers, declared in table order */
        float **f = (float **)&p->layer[l];
        for (int k = 0; k < 12; k++)
            f[k] = base + e[i++].offset;
    }
    p->lnfw = base + e[i++].offset;
    p->lnfb = base + e[i].offset;
}

/* Lay the activation buffers out from base and return how many floats they take. Called
 * twice: with base NULL to measure (pointers are left NULL), then to assign, so the size
 * and the layout cannot disagree. */
static size_t lay_out_activations(loom_gpt *m, float *base)
{
    size_t B = (size_t)m->max_B, T = (size_t)m->cfg.ctx, C = (size_t)m->cfg.dim;
    size_t NHl = (size_t)m->NHl, Cl = (size_t)m->Cl, Fl = (size_t)m->Fl, Vl = (size_t)m->Vl;
    size_t L = (size_t)m->cfg.layers, R = B * T, Rl = m->sp ? R / (size_t)m->tp : R;
    size_t wide = 3 * Cl > Fl ? 3 * Cl : Fl, att = B * NHl * T * T, off = 0;
#define TAKE(n) (off += (n), base ? base + off - (n) : NULL)
#define TAKE_FULL(local) (m->sp ? TAKE(R * C) : (local)) /* all rows: its own buffer under sp */
    m->gathered = m->sp ? TAKE(R * C) : NULL;
#define GATHERED(local) (m->sp ? m->gathered : (local))
    for (size_t l = 0; l < L; l++) {
        layer_acts *a = &m->acts[l];
        a->ln1 = TAKE(Rl * C); a->ln1_mean = TAKE(Rl); a->ln1_rstd = TAKE(Rl);
        a->ln1_full = GATHERED(a->ln1);
        a->qkv = TAKE(R * 3 * Cl); a->atty = TAKE(R * Cl); a->att = TAKE(att);
        a->res2 = TAKE(Rl * C); a->ln2 = TAKE(Rl * C); a->ln2_mean = TAKE(Rl);
        a->ln2_rstd = TAKE(Rl); a->ln2_full = GATHERED(a->ln2);
        a->fch = TAKE(R * Fl); a->fch_gelu = TAKE(R * Fl); a->res3 = TAKE(Rl * C);
    }
    m->encoded = TAKE(Rl * C); m->lnf = TAKE(Rl * C); m->lnf_mean = TAKE(Rl);
    m->lnf_rstd = TAKE(Rl); m->lnf_full = GATHERED(m->lnf);
    m->logits = TAKE(R * Vl); m->losses = TAKE(R); m->ce_max = TAKE(R); m->ce_stats = TAKE(2 * R);
    m->partial = TAKE(R * C); m->summed = m->sp ? TAKE(Rl * C) : m->partial;
    m->dres = TAKE(Rl * C); m->dres_full = TAKE_FULL(m->dres); m->dtmp = TAKE(Rl * C);
    m->dpartial = TAKE(R * C); m->dsummed = m->sp ? TAKE(Rl * C) : m->dpartial;
    m->dbuf_4a = TAKE(R * wide); m->dbuf_4b = TAKE(R * wide);
    m->datt_scratch = TAKE(2 * att); m->rep_grad = TAKE(6 * C);
    for (int i = 0; i < 3; i++)
        m->tree[i] = m->canonical ? TAKE(R * C) : NULL;
#undef GATHERED
#undef TAKE_FULL
#undef TAKE
    return off;
}

static loom_status alloc_activations(loom_gpt *m)
{
    size_t R = (size_t)m->max_B * (size_t)m->cfg.ctx, total = lay_out_activations(m, NULL);
    m->act_bytes = total * sizeof(float) + 2 * R * sizeof(int) + 64;
    m->act_mem = m->be->ops->alloc(m->be->self, m->act_bytes);
    if (!m->act_mem)
        LOOM_FAIL(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB of activations for batch %d x %d",
                  (double)(total * 4) / (1 << 20), m->max_B, m->cfg.ctx);
    float *f = m->act_mem;
    lay_out_activations(m, f);
    m->tokens = (int *)(f + total);
    m->targets = m->tokens + R;
    m->host_losses = malloc(R * sizeof(float));
    m->row_gather = malloc((size_t)m->cfg.vocab_padded * sizeof(float));
    return m->host_losses && m->row_gather ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "out of memory");
}

/* Divisibility the split needs, named in the message with what would work. */
static loom_status check_split(const loom_gpt *m)
{
    const loom_gpt_config *c = &m->cfg;
    int tp = m->tp;
    if (tp > 1 && (c->heads % tp != 0 || c->vocab_padded % tp != 0))
        LOOM_FAIL(LOOM_ERR_INVALID, "tensor parallelism tp=%d must divide heads=%d and the padded "
                  "vocabulary %d", tp, c->heads, c->vocab_padded);
    if (m->canonical && (c->dim % LOOM_CANONICAL_CHUNKS || c->vocab_padded % LOOM_CANONICAL_CHUNKS ||
                         LOOM_CANONICAL_CHUNKS % tp))
        LOOM_FAIL(LOOM_ERR_INVALID, "canonical mode sums in %d fixed chunks: dim=%d and the padded "
                  "vocabulary %d must divide by %d, and tp=%d must divide %d",
                  LOOM_CANONICAL_CHUNKS, c->dim, c->vocab_padded, LOOM_CANONICAL_CHUNKS, tp,
                  LOOM_CANONICAL_CHUNKS);
    return LOOM_OK;
}

loom_status loom_gpt_create(const loom_gpt_config *cfg, loom_backend *be, int max_B, uint64_t seed,
                            const loom_gpt_parallel *par, loom_gpt **out)
{
    *out = NULL;
    LOOM_TRY(loom_gpt_config_check(cfg));
    if (max_B < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "micro-batch size must be at least 1, got %d", max_B);
    loom_gpt *m = calloc(1, sizeof *m);
    if (!m)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    m->cfg = *cfg;
    if (!m->cfg.vocab_padded)
        m->cfg.vocab_padded = (cfg->vocab + 127) / 128 * 128;
    m->be = be;
    m->max_B = max_B;
    m->tp = 1;
    loom_status st = LOOM_OK;
    if (par) {
        m->canonical = par->canonical;
        m->tp_ops = par->tp_ops;
        m->tp_self = par->tp_self;
    }
    if (m->tp_ops && m->tp_ops->layout) {
        loom_parallel_layout lay;
        st = m->tp_ops->layout(m->tp_self, &lay);
        m->tp = lay.parts;
        m->tp_rank = lay.index;
        m->sp = lay.sequence_parallel && lay.parts > 1;
    }
    m->Cl = cfg->dim / m->tp;
    m->NHl = cfg->heads / m->tp;
    m->Fl = 4 * cfg->dim / m->tp;
    m->Vl = m->cfg.vocab_padded / m->tp;
    m->v0 = m->tp_rank * m->Vl;
    if (be->ops->set_deterministic)
        be->ops->set_deterministic(be->self, m->canonical);
    m->p.layer = calloc((size_t)cfg->layers, sizeof(layer_params));
    m->g.layer = calloc((size_t)cfg->layers, sizeof(layer_params));
    m->acts = calloc((size_t)cfg->layers, sizeof(layer_acts));
    if (st == LOOM_OK)
        st = check_split(m);
    if (st == LOOM_OK)
        st = (m->p.layer && m->g.layer && m->acts) ? build_table(m)
                                                   : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK) {
        size_t bytes = m->table.total * sizeof(float);
        m->params = be->ops->alloc(be->self, bytes);
        m->grads = be->ops->alloc(be->self, bytes);
        float *host = malloc(bytes);
        if (!m->params || !m->grads || !host) {
            st = loom_fail(LOOM_ERR_NOMEM, "cannot allocate %.1f MiB for parameters",
                           2.0 * (double)bytes / (1 << 20));
        } else {
            loom_params_init_values(&m->table, seed, host);
            be->ops->copy_to_device(be->self, m->params, host, bytes);
            bind_params(m, m->params, &m->p);
            bind_params(m, m->grads, &m->g);
            st = alloc_activations(m);
        }
        free(host);
    }
    if (st != LOOM_OK) {
        loom_gpt_destroy(m);
        return st;
    }
    *out = m;
    return LOOM_OK;
}

void loom_gpt_destroy(loom_gpt *m)
{
    if (!m)
        return;
    const loom_backend_ops *ops = m->be->ops;
    ops->free(m->be->self, m->params);
    ops->free(m->be->self, m->grads);
    ops->free(m->be->self, m->act_mem);
    free(m->host_losses);
    free(m->row_gather);
    free(m->p.layer);
    free(m->g.layer);
    free(m->acts);
    loom_params_free(&m->table);
    free(m);
}

const loom_gpt_config *loom_gpt_get_config(const loom_gpt *m) { return &m->cfg; }
const loom_param_table *loom_gpt_params(const loom_gpt *m) { return &m->table; }
float *loom_gpt_param_data(loom_gpt *m) { return m->params; }
float *loom_gpt_grad_data(loom_gpt *m) { return m->grads; }
const float *loom_gpt_logits(const loom_gpt *m) { return m->logits; }
size_t loom_gpt_activation_bytes(const loom_gpt *m) { return m->act_bytes; }

size_t loom_gpt_num_params(const loom_gpt *m)
{
    return loom_params_count_logical(&m->table) -
           (size_t)(m->cfg.vocab_padded - m->cfg.vocab) * (size_t)m->cfg.dim;
}

void loom_gpt_zero_grad(loom_gpt *m)
{
    m->be->ops->zero(m->be->self, m->grads, m->table.total * sizeof(float));
}

/* --- the parallel pieces ------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double loom_gpt_take_comm_ms(loom_gpt *m)
{
    double ms = m->comm_ms;
    m->comm_ms = 0.0;
    return ms;
}

/* A region boundary: the strategy's hook, or nothing with one rank (then out == in). */
typedef loom_status (*region_hook)(void *, loom_region, int, const loom_region_io *);

static loom_status cross(loom_gpt *m, region_hook hook, loom_region r, int layer, const float *in,
                         float *out, size_t rows, size_t width)
{
    if (!m->tp_ops)
        return LOOM_OK;
    loom_region_io io = {in, out, rows, width};
    double t0 = now_ms();
    loom_status st = hook(m->tp_self, r, layer, &io);
    m->comm_ms += now_ms() - t0;
    return st;
}
#define F_ENTER(r, l, in, out, rows, w) cross(m, m->tp_ops ? m->tp_ops->region_forward_enter : NULL, r, l, in, out, rows, w)
#define F_LEAVE(r, l, in, out, rows, w) cross(m, m->tp_ops ? m->tp_ops->region_forward_leave : NULL, r, l, in, out, rows, w)
#define B_LEAVE(r, l, in, out, rows, w) cross(m, m->tp_ops ? m->tp_ops->region_backward_leave : NULL, r, l, in, out, rows, w)
#define B_ENTER(r, l, in, out, rows, w) cross(m, m->tp_ops ? m->tp_ops->region_backward_enter : NULL, r, l, in, out, rows, w)

static loom_status region_wait(loom_gpt *m)
{
    if (!m->tp_ops || !m->tp_ops->region_wait)
        return LOOM_OK;
    double t0 = now_ms();
    loom_status st = m->tp_ops->region_wait(m->tp_self);
    m->comm_ms += now_ms() - t0;
    return st;
}

static loom_status tensor_allreduce(loom_gpt *m, float *x, size_t n, loom_reduce_op op)
{
    if (!m->tp_ops)
        return LOOM_OK;
    double t0 = now_ms();
    loom_status st = m->tp_ops->tensor_allreduce(m->tp_self, x, n, op);
    m->comm_ms += now_ms() - t0;
    return st;
}

/* Canonical mode's chunk tree: chunks pushed in order, equal levels merged older + newer
 * (the binary-counter tree; for a power-of-two count, the balanced pairwise tree). The
 * root lands in dest, the bottom level. */
typedef struct chunk_tree {
    float *level[4];
    int depth, pushed;
    size_t n;
} chunk_tree;

static chunk_tree tree_start(loom_gpt *m, float *dest, size_t n)
{
    chunk_tree t = {{dest, m->tree[0], m->tree[1], m->tree[2]}, 0, 0, n};
    return t;
}

/* Where the next chunk goes. */
static float *tree_slot(chunk_tree *t) { return t->level[t->depth]; }

static void tree_push(loom_gpt *m, chunk_tree *t)
{
    t->depth++;
    for (int c = ++t->pushed; !(c & 1); c >>= 1, t->depth--)
        m->be->ops->accumulate(t->level[t->depth - 2], t->level[t->depth - 1], t->n);
}

/* Chunks this rank holds of a dim split over the tp group. */
static int local_chunks(const loom_gpt *m) { return LOOM_CANONICAL_CHUNKS / m->tp; }

/* out (R,C) = this rank's partial of a row-parallel layer: inp (R,K) @ W (C,K)^T over
 * its K input features (no bias: it is added once, after the sum). */
static void row_parallel_forward(loom_gpt *m, float *out, const float *inp, const float *w,
                                 int B, int T, int K)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim, R = B * T;
    if (!m->canonical) {
        k->matmul_forward(out, inp, w, NULL, B, T, K, C);
        return;
    }
    int n = local_chunks(m), kc = K / n;
    chunk_tree t = tree_start(m, out, (size_t)R * C);
    for (int c = 0; c < n; c++) {
        k->gemm(0, 1, R, C, kc, 1.0f, inp + (size_t)c * kc, K, w + (size_t)c * kc, K, 0.0f,
                tree_slot(&t), C);
        tree_push(m, &t);
    }
}

/* dinp (R,C) = this rank's partial input gradient of a column-parallel layer: dout (R,OC)
 * @ W (OC,C) over its OC output features, which form `segs` equal segments (q, k, v for
 * the fused QKV; one otherwise). Canonical chunk c holds part c of every segment. */
static void column_parallel_dinp(loom_gpt *m, float *dinp, const float *dout, const float *w,
                                 int R, int OC, int segs)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim;
    if (!m->canonical) {
        k->gemm(0, 0, R, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
        return;
    }
    int n = local_chunks(m), seg = OC / segs, wc = seg / n;
    chunk_tree t = tree_start(m, dinp, (size_t)R * C);
    for (int c = 0; c < n; c++) {
        for (int s = 0; s < segs; s++) {
            size_t o = (size_t)s * seg + (size_t)c * wc;
            k->gemm(0, 0, R, C, wc, 1.0f, dout + o, OC, w + o * C, C, s ? 1.0f : 0.0f,
                    tree_slot(&t), C);
        }
        tree_push(m, &t);
    }
}

/* Gradients of replicated parameters that are sums over this rank's token rows (layer
 * norms, row-parallel biases). In fast mode without sequence parallelism every rank sees
 * all rows and the kernels accumulate straight into the gradient. Otherwise each gradient
 * is first computed on its own into a slot of the layer's pack (m->rep_grad, C floats a
 * slot): in canonical mode over fixed chunks of R/8 rows (R = B*T) added in the tree; with
 * sequence parallelism each rank's pack is a partial, and rep_flush sums the whole pack
 * over the tp group in one exchange per layer before adding it to the gradients.
 * kind 0: layernorm backward (also writes dinp; two slots, weight then bias), 1: bias. */
typedef struct rep_args {
    float *dinp;
    const float *dout, *inp, *w, *mean, *rstd;
} rep_args;

typedef struct rep_pack {
    float *dst[6];   /* the gradient each slot is added to */
    int n;
} rep_pack;

static void rep_rows(loom_gpt *m, int kind, const rep_args *a, float *dw, float *db, size_t r0,
                     size_t rows)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim;
    size_t off = r0 * (size_t)C;
    if (kind == 0)
        k->layernorm_backward(a->dinp + off, dw, db, a->dout + off, a->inp + off, a->w,
                              a->mean + r0, a->rstd + r0, 1, (int)rows, C);
    else
        k->bias_backward(db, a->dout + off, rows, C);
}

static void replicated_grads(loom_gpt *m, rep_pack *pk, int kind, const rep_args *a, float *dw,
                             float *db, size_t Rl)
{
    const loom_backend_ops *k = m->be->ops;
    size_t C = (size_t)m->cfg.dim, n = kind == 0 ? 2 * C : C;
    if (!m->canonical && !m->sp) {
        rep_rows(m, kind, a, dw, db, 0, Rl);
        return;
    }
    float *part = m->rep_grad + (size_t)pk->n * C; /* [dw | db] or [db] */
    if (kind == 0)
        pk->dst[pk->n++] = dw;
    pk->dst[pk->n++] = db;
    if (!m->canonical) {
        k->zero(m->be->self, part, n * sizeof(float));
        rep_rows(m, kind, a, kind == 0 ? part : NULL, kind == 0 ? part + C : part, 0, Rl);
        return;
    }
    int chunks = m->sp ? local_chunks(m) : LOOM_CANONICAL_CHUNKS;
    size_t rc = Rl / (size_t)chunks;
    chunk_tree t = tree_start(m, part, n);
    for (int c = 0; c < chunks; c++) {
        float *slot = tree_slot(&t);
        k->zero(m->be->self, slot, n * sizeof(float));
        rep_rows(m, kind, a, kind == 0 ? slot : NULL, kind == 0 ? slot + C : slot, (size_t)c * rc,
                 rc);
        tree_push(m, &t);
    }
}

static loom_status rep_flush(loom_gpt *m, rep_pack *pk)
{
    size_t C = (size_t)m->cfg.dim;
    if (pk->n && m->sp)
        LOOM_TRY(tensor_allreduce(m, m->rep_grad, (size_t)pk->n * C, LOOM_REDUCE_SUM));
    for (int i = 0; i < pk->n; i++)
        m->be->ops->accumulate(pk->dst[i], m->rep_grad + (size_t)i * C, C);
    pk->n = 0;
    return LOOM_OK;
}

/* Vocabulary-parallel cross-entropy over this rank's Vl columns (backend.h's passes) for
 * rows [r0, r0+n): row maxima combined by MAX, the sums of exponentials and the target
 * logits by SUM (the target is in one rank's slice, so that sum is exact). */
static loom_status cross_entropy_rows(loom_gpt *m, size_t r0, int n, float dloss)
{
    const loom_backend_ops *k = m->be->ops;
    int V = m->cfg.vocab, Vl = m->Vl, v0 = m->v0;
    float *logits = m->logits + r0 * (size_t)Vl, *row_max = m->ce_max + r0;
    float *sumexp = m->ce_stats + 2 * r0, *tlogit = sumexp + n; /* one exchange for both */
    const int *targets = m->targets + r0;
    k->ce_row_max(row_max, logits, n, Vl, v0, V);
    LOOM_TRY(tensor_allreduce(m, row_max, (size_t)n, LOOM_REDUCE_MAX));
    if (!m->canonical) {
        k->ce_row_sumexp(sumexp, logits, row_max, n, Vl, v0, V, 0, Vl);
    } else {
        int chunks = local_chunks(m), wc = Vl / chunks;
        chunk_tree t = tree_start(m, sumexp, (size_t)n);
        for (int c = 0; c < chunks; c++) {
            k->ce_row_sumexp(tree_slot(&t), logits, row_max, n, Vl, v0, V, c * wc, (c + 1) * wc);
            tree_push(m, &t);
        }
    }
    k->ce_target_logit(tlogit, logits, targets, n, Vl, v0);
    LOOM_TRY(tensor_allreduce(m, sumexp, 2 * (size_t)n, LOOM_REDUCE_SUM));
    k->ce_finish(logits, m->losses + r0, row_max, sumexp, tlogit, targets, dloss, n, Vl, v0, V);
    return LOOM_OK;
}

/* The passes read the (R, Vl) logits three times. With one rank they run over blocks of
 * rows small enough to stay in cache between passes (about 4 MiB of logits: 20 rows of
 * GPT-2's vocabulary, all rows of a byte-level one), the same operations row by row, so the
 * same bits; with tensor parallelism over all rows at once, so each pass's statistics
 * cross the group in one exchange. */
static loom_status vocab_cross_entropy(loom_gpt *m, int R, float dloss)
{
    size_t block = (size_t)R;
    if (!m->tp_ops) {
        block = ((size_t)4 << 20) / ((size_t)m->Vl * sizeof(float));
        block = block < 16 ? 16 : block;
    }
    for (size_t r0 = 0; r0 < (size_t)R; r0 += block) {
        size_t n = (size_t)R - r0 < block ? (size_t)R - r0 : block;
        LOOM_TRY(cross_entropy_rows(m, r0, (int)n, dloss));
    }
    return LOOM_OK;
}

/* --- forward and backward ------------------------------------------------------------ */

loom_status loom_gpt_forward(loom_gpt *m, const int *tokens, const int *targets, int B, int T,
                             float dloss, double *loss_sum)
{
    const loom_backend_ops *k = m->be->ops;
    void *bs = m->be->self;
    int C = m->cfg.dim, V = m->cfg.vocab, Cl = m->Cl, Fl = m->Fl;
    if (B < 1 || B > m->max_B || T < 1 || T > m->cfg.ctx)
        LOOM_FAIL(LOOM_ERR_INVALID, "batch %dx%d outside the model's %dx%d", B, T, m->max_B,
                  m->cfg.ctx);
    if (dloss != 0.0f && !targets)
        LOOM_FAIL(LOOM_ERR_INVALID, "a training forward needs targets");
    size_t R = (size_t)B * T;
    if (m->sp && R % (size_t)m->tp)
        LOOM_FAIL(LOOM_ERR_INVALID, "sequence parallelism splits the %d x %d = %zu token rows over "
                  "tp=%d ranks: they must divide", B, T, R, m->tp);
    if (m->canonical && dloss != 0.0f && R % LOOM_CANONICAL_CHUNKS)
        LOOM_FAIL(LOOM_ERR_INVALID, "canonical mode sums token rows in %d chunks: batch %d x %d = "
                  "%zu rows must divide by %d", LOOM_CANONICAL_CHUNKS, B, T, R, LOOM_CANONICAL_CHUNKS);
    size_t Rl = m->sp ? R / (size_t)m->tp : R, row0 = m->sp ? (size_t)m->tp_rank * Rl : 0;
    for (size_t i = 0; i < R; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            LOOM_FAIL(LOOM_ERR_INVALID, "token %d at position %zu is outside the vocabulary [0, %d)",
                      tokens[i], i, V);
    k->copy_to_device(bs, m->tokens, tokens, R * sizeof(int));
    if (targets)
        k->copy_to_device(bs, m->targets, targets, R * sizeof(int));

    /* Embedding: each rank looks up its vocabulary rows (zeros elsewhere); the sum over the
     * group is the lookup. Positions are added once, to the rows this rank keeps. */
    float *embedded = m->tp_ops ? m->partial : m->encoded;
    k->embedding_forward(embedded, m->tokens, m->p.wte, m->v0, m->Vl, R, C);
    LOOM_TRY(F_LEAVE(LOOM_REGION_EMBEDDING, -1, embedded, m->encoded, R, C));
    k->position_forward(m->encoded, m->p.wpe, row0, Rl, T, C);
    const float *residual = m->encoded;
    for (int l = 0; l < m->cfg.layers; l++) {
        layer_params *w = &m->p.layer[l];
        layer_acts *a = &m->acts[l];
        k->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, residual, w->ln1w, w->ln1b, 1,
                             (int)Rl, C);
        LOOM_TRY(F_ENTER(LOOM_REGION_ATTENTION, l, a->ln1, a->ln1_full, R, C));
        k->matmul_forward(a->qkv, a->ln1_full, w->qkvw, w->qkvb, B, T, C, 3 * Cl);
        k->attention_forward(a->atty, a->att, a->qkv, B, T, Cl, m->NHl);
        row_parallel_forward(m, m->partial, a->atty, w->attprojw, B, T, Cl);
        LOOM_TRY(F_LEAVE(LOOM_REGION_ATTENTION, l, m->partial, m->summed, R, C));
        k->bias_add(m->summed, w->attprojb, Rl, C);
        k->residual_forward(a->res2, residual, m->summed, Rl * C);
        k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w, w->ln2b, 1,
                             (int)Rl, C);
        LOOM_TRY(F_ENTER(LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R, C));
        k->matmul_forward(a->fch, a->ln2_full, w->fcw, w->fcb, B, T, C, Fl);
        k->gelu_forward(a->fch_gelu, a->fch, R * Fl);
        row_parallel_forward(m, m->partial, a->fch_gelu, w->fcprojw, B, T, Fl);
        LOOM_TRY(F_LEAVE(LOOM_REGION_MLP, l, m->partial, m->summed, R, C));
        k->bias_add(m->summed, w->fcprojb, Rl, C);
        k->residual_forward(a->res3, a->res2, m->summed, Rl * C);
        residual = a->res3;
    }
    k->layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, residual, m->p.lnfw, m->p.lnfb, 1,
                         (int)Rl, C);
    LOOM_TRY(F_ENTER(LOOM_REGION_HEAD, -1, m->lnf, m->lnf_full, R, C));
    k->matmul_forward(m->logits, m->lnf_full, m->p.wte, NULL, B, T, C, m->Vl);
    m->last_B = B;
    m->last_T = T;
    m->have_dlogits = 0;
    if (targets) {
        LOOM_TRY(vocab_cross_entropy(m, (int)R, dloss));
        m->have_dlogits = dloss != 0.0f;
        k->copy_to_host(bs, m->host_losses, m->losses, R * sizeof(float));
        double sum = 0.0;
        for (size_t i = 0; i < R; i++)
            sum += m->host_losses[i];
        if (loss_sum)
            *loss_sum = sum;
    }
    return LOOM_OK;
}

/* Under sequence parallelism, all-gather a layernorm output again for the weight gradient
 * of the column-parallel layer it feeds (forward kept only this rank's shard). */
static loom_status regather(loom_gpt *m, loom_region r, int layer, const float *local, float *full,
                            size_t R)
{
    return m->sp ? F_ENTER(r, layer, local, full, R, (size_t)m->cfg.dim) : LOOM_OK;
}

/* Backward of a column-parallel layer (its input `inp`, all R rows): weight and bias
 * gradients, and the partial input gradient into m->dpartial, summed over the group by
 * the region's f backward into m->dsummed. The sum runs while the weight gradient is
 * computed where the communicator can overlap. */
static loom_status column_parallel_backward(loom_gpt *m, loom_region r, int layer, float *dw,
                                            float *db, const float *dout, const float *inp,
                                            const float *w, int B, int T, int OC, int segs)
{
    const loom_backend_ops *k = m->be->ops;
    int C = m->cfg.dim, R = B * T;
    column_parallel_dinp(m, m->dpartial, dout, w, R, OC, segs);
    LOOM_TRY(B_ENTER(r, layer, m->dpartial, m->dsummed, (size_t)R, (size_t)C));
    k->matmul_backward(NULL, dw, db, dout, inp, w, B, T, C, OC);
    return region_wait(m);
}

loom_status loom_gpt_backward(loom_gpt *m)
{
    if (!m->have_dlogits)
        LOOM_FAIL(LOOM_ERR_INVALID, "backward needs a forward with targets and dloss != 0 first");
    const loom_backend_ops *k = m->be->ops;
    int B = m->last_B, T = m->last_T, C = m->cfg.dim, Cl = m->Cl, Fl = m->Fl;
    int L = m->cfg.layers;
    size_t R = (size_t)B * T, Rl = m->sp ? R / (size_t)m->tp : R;
    const float *last = m->acts[L - 1].res3;

    /* LM head (tied to wte, vocabulary-parallel) and the final layernorm; dres starts as
     * d(last block output). */
    LOOM_TRY(regather(m, LOOM_REGION_HEAD, -1, m->lnf, m->lnf_full, R));
    LOOM_TRY(column_parallel_backward(m, LOOM_REGION_HEAD, -1, m->g.wte, NULL, m->logits,
                                      m->lnf_full, m->p.wte, B, T, m->Vl, 1));
    rep_pack pk = {.n = 0};
    rep_args lnf = {m->dres, m->dsummed, last, m->p.lnfw, m->lnf_mean, m->lnf_rstd};
    replicated_grads(m, &pk, 0, &lnf, m->g.lnfw, m->g.lnfb, Rl);
    LOOM_TRY(rep_flush(m, &pk));
    int n_entries = m->table.count;
    LOOM_TRY(entries_ready(m, n_entries - 2, n_entries - 1));
    for (int l = L - 1; l >= 0; l--) {
        layer_params *w = &m->p.layer[l], *g = &m->g.layer[l];
        layer_acts *a = &m->acts[l];
        const float *residual = l == 0 ? m->encoded : m->acts[l - 1].res3;
        /* MLP branch: res3 = res2 + g(proj(gelu(fc(f(ln2(res2)))))) + bias */
        rep_args pb = {.dout = m->dres};
        replicated_grads(m, &pk, 1, &pb, NULL, g->fcprojb, Rl);
        LOOM_TRY(B_LEAVE(LOOM_REGION_MLP, l, m->dres, m->dres_full, R, C));
        k->matmul_backward(m->dbuf_4a, g->fcprojw, NULL, m->dres_full, a->fch_gelu, w->fcprojw,
                           B, T, Fl, C);
        k->gelu_backward(m->dbuf_4b, a->fch, m->dbuf_4a, R * Fl);
        LOOM_TRY(regather(m, LOOM_REGION_MLP, l, a->ln2, a->ln2_full, R));
        LOOM_TRY(column_parallel_backward(m, LOOM_REGION_MLP, l, g->fcw, g->fcb, m->dbuf_4b,
                                          a->ln2_full, w->fcw, B, T, Fl, 1));
        rep_args ln2 = {m->dtmp, m->dsummed, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd};
        replicated_grads(m, &pk, 0, &ln2, g->ln2w, g->ln2b, Rl);
        k->accumulate(m->dres, m->dtmp, Rl * C);
        /* Attention branch: res2 = residual + g(proj(attn(qkv(f(ln1(residual)))))) + bias */
        rep_args ab = {.dout = m->dres};
        replicated_grads(m, &pk, 1, &ab, NULL, g->attprojb, Rl);
        LOOM_TRY(B_LEAVE(LOOM_REGION_ATTENTION, l, m->dres, m->dres_full, R, C));
        float *datty = m->dpartial; /* free until the qkv backward below */
        k->matmul_backward(datty, g->attprojw, NULL, m->dres_full, a->atty, w->attprojw, B, T,
                           Cl, C);
        k->attention_backward(m->dbuf_4a, m->datt_scratch, datty, a->qkv, a->att, B, T, Cl,
                              m->NHl);
        LOOM_TRY(regather(m, LOOM_REGION_ATTENTION, l, a->ln1, a->ln1_full, R));
        LOOM_TRY(column_parallel_backward(m, LOOM_REGION_ATTENTION, l, g->qkvw, g->qkvb,
                                          m->dbuf_4a, a->ln1_full, w->qkvw, B, T, 3 * Cl, 3));
        rep_args ln1 = {m->dtmp, m->dsummed, residual, w->ln1w, a->ln1_mean, a->ln1_rstd};
        replicated_grads(m, &pk, 0, &ln1, g->ln1w, g->ln1b, Rl);
        k->accumulate(m->dres, m->dtmp, Rl * C);
        LOOM_TRY(rep_flush(m, &pk));
        LOOM_TRY(entries_ready(m, 2 + 12 * l, 2 + 12 * l + 11));
    }
    /* Embedding: every rank needs the gradient of all rows for its vocabulary slice; the
     * position gradient is then computed the same way on every rank. */
    LOOM_TRY(B_LEAVE(LOOM_REGION_EMBEDDING, -1, m->dres, m->dres_full, R, C));
    k->embedding_backward(m->g.wte, m->dres_full, m->tokens, m->v0, m->Vl, R, C);
    k->position_backward(m->g.wpe, m->dres_full, B, T, C);
    m->have_dlogits = 0;
    LOOM_TRY(entries_ready(m, 0, 1));
    return LOOM_OK;
}

int loom_gpt_row_multiple(const loom_gpt *m) { return m->sp ? m->tp : 1; }

loom_status loom_gpt_logits_row(loom_gpt *m, size_t row, float *host_out)
{
    const loom_backend_ops *k = m->be->ops;
    const float *src = m->logits + row * (size_t)m->Vl;
    if (!m->tp_ops) {
        k->copy_to_host(m->be->self, host_out, src, (size_t)m->Vl * sizeof(float));
        return LOOM_OK;
    }
    k->copy_to_host(m->be->self, m->row_gather, src, (size_t)m->Vl * sizeof(float));
    return m->tp_ops->tensor_allgather(m->tp_self, m->row_gather, host_out, (size_t)m->Vl);
}
