/* moe_route.h — a mixture-of-experts router's decisions on the host: softmax over the
 * router logits, top-k, the gates, each expert's capacity and who is dropped, and the two
 * router losses (Switch's load balancing, ST-MoE's z-loss) with their gradients.
 *
 * Rules (stated here once; tests/unit/test_moe_route.c checks them against a reference
 * written in the test):
 * - p = softmax(logits) per token; the top k experts by logit, ties to the lower index.
 * - Gates: k = 1 keeps the raw probability p_s (Switch Transformer, Fedus et al. 2021);
 *   k > 1 renormalises over the chosen, g_i = p_i / sum_chosen p (Mixtral, Jiang et al.
 *   2024) — the softmax of the chosen logits.
 * - Capacity: cap = ceil(k * R / E * c) slots per expert for R tokens (c = 0: R, dropless).
 *   Slots are filled choice-rank major (every token's first choice, in row order, before
 *   any second choice; GShard's priority), so overflow drops the lowest-ranked choices
 *   first. A dropped choice contributes nothing; a token with every choice dropped passes
 *   through the residual alone. Kept gates are not renormalised again.
 * - aux = alpha * E * sum_i f_i P_i, f_i = (tokens choosing i, before capacity) / (k R),
 *   P_i = mean over tokens of p_i: gradient through P only (f counts).
 * - z = beta * mean over tokens of logsumexp(logits)^2.
 * Assignments (kept choices) are laid out expert-major: expert e's in offset[e] ..
 * offset[e+1], in slot order — the rows its GEMMs run over.
 */
#ifndef LOOM_CORE_MOE_ROUTE_H
#define LOOM_CORE_MOE_ROUTE_H

#include <stddef.h>

typedef struct moe_route {
    int R, E, k, cap;
    float *probs;    /* (R,E) */
    float *lse;      /* (R) logsumexp of each row */
    int *choice;     /* (R,k) chosen experts, best first */
    float *gate;     /* (R,k) */
    int *slot;       /* (R,k) the choice's assignment index, -1 if dropped */
    int *routed;     /* (E) choices before capacity */
    int *count;      /* (E) kept */
    int *offset;     /* (E+1) */
    int *tok;        /* (A) token row of assignment a */
    float *agate;    /* (A) its gate */
    int *pair;       /* (A) t*k + j of assignment a */
    int kept, dropped;
    double *psum;    /* (E) scratch: sum of p_i over tokens */
    double fp;       /* sum_i f_i P_i */
    double z;        /* mean logsumexp^2 */
} moe_route;

/* Buffers for up to max_R tokens; 0 or -1 (out of memory). */
int moe_route_alloc(moe_route *r, int max_R, int E, int k);
void moe_route_free(moe_route *r);
/* Slots per expert: ceil(k * R / E * c), c = 0 meaning R (no token is dropped). */
int moe_capacity(int k, int R, int E, double c);
/* Route R tokens from logits (R,E) with capacity cap. */
void moe_route_compute(moe_route *r, const float *logits, int R, int cap);
/* dlogits (R,E) = the gradient of the last route's logits from dgate (A) (d objective /
 * d gate of each assignment) plus w_aux * d(aux)/d logits and w_z * d(z)/d logits, where
 * aux = E * fp and z as above (w_* carry alpha, beta and the loss scale). */
void moe_route_backward(const moe_route *r, const float *dgate, double w_aux, double w_z,
                        float *dlogits);

#endif
