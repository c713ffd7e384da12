/* moe_route.c — the router's host-side decisions and gradients (moe_route.h). Small
 * (tokens x experts): doubles throughout, written in a fixed order. */
#include "moe_route.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int moe_route_alloc(moe_route *r, int max_R, int E, int k)
{
    memset(r, 0, sizeof *r);
    size_t R = (size_t)max_R, A = R * (size_t)k;
    r->E = E;
    r->k = k;
    r->probs = malloc(R * (size_t)E * sizeof(float));
    r->lse = malloc(R * sizeof(float));
    r->choice = malloc(A * sizeof(int));
    r->gate = malloc(A * sizeof(float));
    r->slot = malloc(A * sizeof(int));
    r->routed = malloc((size_t)E * sizeof(int));
    r->count = malloc((size_t)E * sizeof(int));
    r->offset = malloc(((size_t)E + 1) * sizeof(int));
    r->tok = malloc(A * sizeof(int));
    r->agate = malloc(A * sizeof(float));
    r->pair = malloc(A * sizeof(int));
    r->psum = malloc((size_t)E * sizeof(double));
    return r->psum && r->probs && r->lse && r->choice && r->gate && r->slot && r->routed && r->count &&
                   r->offset && r->tok && r->agate && r->pair
               ? 0
               : -1;
}

void moe_route_free(moe_route *r)
{
    free(r->probs); free(r->lse); free(r->choice); free(r->gate); free(r->slot);
    free(r->routed); free(r->count); free(r->offset); free(r->tok); free(r->agate);
    free(r->pair); free(r->psum);
    memset(r, 0, sizeof *r);
}

int moe_capacity(int k, int R, int E, double c)
{
    if (c <= 0.0)
        return R;
    /* k R / E c, rounded up; the 1e-9 keeps an exact product (2*16/4*1.0 = 8) from
     * becoming 9 through roundoff */
    double cap = ceil((double)k * R / E * c - 1e-9);
    return cap > R ? R : cap < 1 ? 1 : (int)cap;
}

/* The top k of row z (E logits) into ch, best first, ties to the lower index. */
static void top_k(const float *z, int E, int k, int *ch)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= ch[i] == e;
            if (!taken && (best < 0 || z[e] > z[best]))
                best = e;
        }
        ch[j] = best;
    }
}

void moe_route_compute(moe_route *r, const float *logits, int R, int cap)
{
    int E = r->E, k = r->k;
    r->R = R;
    r->cap = cap;
    memset(r->routed, 0, (size_t)E * sizeof(int));
    memset(r->count, 0, (size_t)E * sizeof(int));
    double *P = r->psum, z2 = 0.0;
    memset(P, 0, (size_t)E * sizeof(double));
    for (int t = 0; t < R; t++) {
        const float *z = logits + (size_t)t * E;
        float *p = r->probs + (size_t)t * E;
        double mx = z[0], sum = 0.0;
        for (int e = 1; e < E; e++)
            mx = z[e] > mx ? z[e] : mx;
        for (int e = 0; e < E; e++)
            sum += exp((double)z[e] - mx);
        for (int e = 0; e < E; e++) {
            p[e] = (float)(exp((double)z[e] - mx) / sum);
            P[e] += p[e];
        }
        double lse = mx + log(sum);
        r->lse[t] = (float)lse;
        z2 += lse * lse;
        int *ch = r->choice + (size_t)t * k;
        top_k(z, E, k, ch);
        double chosen = 0.0;
        for (int j = 0; j < k; j++) {
            chosen += p[ch[j]];
            r->routed[ch[j]]++;
        }
        for (int j = 0; j < k; j++)
            r->gate[(size_t)t * k + j] = k == 1 ? p[ch[j]] : (float)(p[ch[j]] / chosen);
    }
    /* capacity, choice-rank major: first choices of every token, then second choices ... */
    for (int j = 0; j < k; j++)
        for (int t = 0; t < R; t++) {
            int e = r->choice[(size_t)t * k + j];
            r->slot[(size_t)t * k + j] = r->count[e] < cap ? r->count[e]++ : -1;
        }
    r->offset[0] = 0;
    for (int e = 0; e < E; e++)
        r->offset[e + 1] = r->offset[e] + r->count[e];
    r->kept = r->offset[E];
    r->dropped = R * k - r->kept;
    for (int t = 0; t < R; t++)
        for (int j = 0; j < k; j++) {
            size_t q = (size_t)t * k + j;
            if (r->slot[q] < 0)
                continue;
            int a = r->offset[r->choice[q]] + r->slot[q];
            r->slot[q] = a;
            r->tok[a] = t;
            r->agate[a] = r->gate[q];
            r->pair[a] = (int)q;
        }
    double fp = 0.0;
    for (int e = 0; e < E; e++)
        fp += (double)r->routed[e] / ((double)k * R) * (P[e] / R);
    r->fp = fp;
    r->z = z2 / R;
}

void moe_route_backward(const moe_route *r, const float *dgate, double w_aux, double w_z,
                        float *dlogits)
{
    int R = r->R, E = r->E, k = r->k;
    for (int t = 0; t < R; t++) {
        const float *p = r->probs + (size_t)t * E;
        const int *ch = r->choice + (size_t)t * k;
        const float *g = r->gate + (size_t)t * k;
        float *dz = dlogits + (size_t)t * E;
        /* d objective / d p over all experts: the aux loss's part ... */
        double dp_dot = 0.0;
        for (int e = 0; e < E; e++) {
            double dp = w_aux * E * ((double)r->routed[e] / ((double)k * R)) / R;
            dp_dot += p[e] * dp;
        }
        for (int e = 0; e < E; e++) {
            double dp = w_aux * E * ((double)r->routed[e] / ((double)k * R)) / R;
            /* softmax backward of the aux part, plus the z-loss: 2 beta lse p / R */
            dz[e] = (float)(p[e] * (dp - dp_dot) + w_z * 2.0 * r->lse[t] * p[e] / R);
        }
        /* ... and the gates' (dropped choices have dgate 0) */
        double dg[64], sum = 0.0;
        for (int j = 0; j < k; j++) {
            int a = r->slot[(size_t)t * k + j];
            dg[j] = a < 0 ? 0.0 : dgate[a];
        }
        if (k == 1) { /* g = p_s: dz_e = dg p_s (delta_se - p_e) */
            int s = ch[0];
            for (int e = 0; e < E; e++)
                dz[e] += (float)(dg[0] * p[s] * ((e == s) - p[e]));
            continue;
        }
        for (int j = 0; j < k; j++) /* g = softmax over the chosen logits */
            sum += g[j] * dg[j];
        for (int j = 0; j < k; j++)
            dz[ch[j]] += (float)(g[j] * (dg[j] - sum));
    }
}
