/* test_schedule.c — pipeline schedules (core/train/schedule.c, schedule_sim.c) and the
 * built-in sched plugins (plugins/sched/): on the grid p in {2,3,4,8}, m in {1,2,4,8,16}
 * (interleaved also m = 3, 6, 12 and v in {2,3}) every plugin's lists pass the validator
 * and simulate to the bubble of their formula with F = B = W = 1, exactly; gpipe, 1f1b
 * and interleaved hold the micro-batches in flight they are known for (interleaved:
 * Megatron's warm-up count, which the bubble alone does not see without latency); zb1
 * beats 1f1b within 1f1b's memory; hand-made wrong lists are refused with their exact
 * messages; and the default block split (pipeline_split.h) balances the stages by cost,
 * the even split when blocks cost the same, the costliest stage as small as exhaustive
 * search finds it.
 * The plugins come from the build tree (LOOM_PLUGIN_PATH is set by meson to its dirs).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/plugin_loader.h"
#include "base/status.h"
#include "model/gpt_cost.h"
#include "train/pipeline_check.h"
#include "train/pipeline_split.h"
#include "train/schedule.h"

static const int PS[] = {2, 3, 4, 8}, MS[] = {1, 2, 4, 8, 16};
#define N_PS 4
#define N_MS 5

static loom_schedule *build(const char *name, int p, int m, int v)
{
    const loom_plugin *pl;
    ck_assert_msg(loom_plugin_load(LOOM_KIND_SCHED, name, &pl) == LOOM_OK, "%s", loom_last_error());
    loom_schedule *s = NULL;
    loom_status st = loom_schedule_from_plugin(pl->desc, p, m, v, &s);
    ck_assert_msg(st == LOOM_OK, "%s p=%d m=%d v=%d: %s", name, p, m, v, loom_last_error());
    return s;
}

static loom_sched_sim *simulate(const loom_schedule *s, const char *name)
{
    ck_assert_msg(loom_schedule_validate(s) == LOOM_OK, "%s p=%d m=%d v=%d: %s", name,
                  s->stages, s->microbatches, s->chunks, loom_last_error());
    loom_sched_sim *sim = NULL;
    ck_assert_msg(loom_schedule_simulate(s, NULL, &sim) == LOOM_OK, "%s p=%d m=%d v=%d: %s",
                  name, s->stages, s->microbatches, s->chunks, loom_last_error());
    return sim;
}

START_TEST(gpipe_and_1f1b_match_the_formula)
{
    const char *names[] = {"gpipe", "1f1b"};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_PS; i++)
            for (int j = 0; j < N_MS; j++) {
                int p = PS[i], m = MS[j];
                loom_schedule *s = build(names[k], p, m, 1);
                loom_sched_sim *sim = simulate(s, names[k]);
                double formula = (double)(p - 1) / (m + p - 1);
                ck_assert_msg(sim->makespan == 3.0 * (m + p - 1), "%s p=%d m=%d: makespan %g, "
                              "expected 3(m+p-1) = %d", names[k], p, m, sim->makespan, 3 * (m + p - 1));
                ck_assert_msg(fabs(sim->bubble - formula) < 1e-12, "%s p=%d m=%d: bubble %.9f, "
                              "formula %.9f", names[k], p, m, sim->bubble, formula);
                for (int r = 0; r < p; r++) {
                    int want = k == 0 ? m : (p - r < m ? p - r : m); /* 1f1b: min(p - s, m) */
                    ck_assert_msg(sim->peak_inflight[r] == want, "%s p=%d m=%d stage %d: peak %d, "
                                  "expected %d", names[k], p, m, r, sim->peak_inflight[r], want);
                }
                loom_sched_sim_free(sim);
                loom_schedule_free(s);
            }
}
END_TEST

START_TEST(interleaved_matches_the_formula)
{
    const int ms[] = {1, 2, 3, 4, 6, 8, 12, 16};
    int served = 0;
    for (int v = 2; v <= 3; v++)
        for (int i = 0; i < N_PS; i++)
            for (int j = 0; j < 8; j++) {
                int p = PS[i], m = ms[j];
                const loom_plugin *pl;
                ck_assert_int_eq(loom_plugin_load(LOOM_KIND_SCHED, "interleaved", &pl), LOOM_OK);
                loom_schedule *s = NULL;
                loom_status st = loom_schedule_from_plugin(pl->desc, p, m, v, &s);
                if (m % p != 0) {
                    ck_assert_msg(st == LOOM_ERR_INVALID && s == NULL, "p=%d m=%d accepted", p, m);
                    ck_assert_ptr_nonnull(strstr(loom_last_error(), "is not a multiple of stages"));
                    continue;
                }
                loom_schedule_free(s);
                s = build("interleaved", p, m, v);
                loom_sched_sim *sim = simulate(s, "interleaved");
                double formula = (double)(p - 1) / (v * m + p - 1);
                ck_assert_msg(sim->makespan == 3.0 * (v * m + p - 1), "p=%d m=%d v=%d: makespan %g",
                              p, m, v, sim->makespan);
                ck_assert_msg(fabs(sim->bubble - formula) < 1e-12, "p=%d m=%d v=%d: bubble %.9f, "
                              "formula (p-1)/(vm+p-1) %.9f", p, m, v, sim->bubble, formula);
                for (int r = 0; r < p; r++) { /* Megatron's warm-up, plus the steady forward */
                    int want = (p - r - 1) * 2 + (v - 1) * p + 1;
                    if (m == p || want > m * v)
                        want = m * v;
                    ck_assert_msg(sim->peak_inflight[r] == want, "p=%d m=%d v=%d stage %d: peak "
                                  "%d, Megatron's warm-up gives %d", p, m, v, r,
                                  sim->peak_inflight[r], want);
                }
                served++;
                loom_sched_sim_free(sim);
                loom_schedule_free(s);
            }
    ck_assert_int_eq(served, 2 * (6 + 3 + 4 + 2)); /* the listed m that p = 2, 3, 4, 8 divide */
}
END_TEST

START_TEST(zb1_beats_1f1b_within_its_memory)
{
    for (int i = 0; i < N_PS; i++)
        for (int j = 0; j < N_MS; j++) {
            int p = PS[i], m = MS[j];
            loom_schedule *z = build("zb1", p, m, 1), *o = build("1f1b", p, m, 1);
            loom_sched_sim *zs = simulate(z, "zb1"), *os = simulate(o, "1f1b");
            for (int r = 0; r < p; r++)
                ck_assert_msg(zs->peak_inflight[r] <= p, "zb1 p=%d m=%d stage %d: peak %d > p",
                              p, m, r, zs->peak_inflight[r]);
            if (m >= p) {
                double formula = (double)(p - 1) / (3 * m + p - 1); /* (p-1)(F+B-W) bubble */
                ck_assert_msg(zs->bubble < os->bubble, "zb1 p=%d m=%d: bubble %.6f, 1f1b %.6f",
                              p, m, zs->bubble, os->bubble);
                ck_assert_msg(fabs(zs->bubble - formula) < 1e-12, "zb1 p=%d m=%d: bubble %.9f, "
                              "paper %.9f", p, m, zs->bubble, formula);
                ck_assert_int_le(zs->peak_inflight[0], p);
            }
            loom_sched_sim_free(zs);
            loom_sched_sim_free(os);
            loom_schedule_free(z);
            loom_schedule_free(o);
        }
}
END_TEST

/* The stricter model (a send waits for its receiver; consecutive transfers posted as one
 * group): gpipe, 1f1b and interleaved (Megatron's grouped exchanges) keep their bubble;
 * zb1 still completes, but its W's then wait behind lone SEND_GRADs, so its bubble is no
 * longer below 1f1b's (docs/PIPELINE.md). */
START_TEST(every_plugin_survives_rendezvous_sends)
{
    const char *names[] = {"gpipe", "1f1b", "zb1", "interleaved", "interleaved"};
    loom_sched_costs rdv = LOOM_SCHED_COSTS_UNIT;
    rdv.rendezvous = 1;
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < N_PS; i++)
            for (int j = 0; j < N_MS; j++) {
                int p = PS[i], m = MS[j], v = k < 3 ? 1 : k - 1;
                if (v > 1 && m % p != 0)
                    continue;
                loom_schedule *s = build(names[k], p, m, v);
                loom_sched_sim *a = simulate(s, names[k]), *b = NULL;
                ck_assert_msg(loom_schedule_simulate(s, &rdv, &b) == LOOM_OK, "%s p=%d m=%d v=%d "
                              "with rendezvous sends: %s", names[k], p, m, v, loom_last_error());
                if (k != 2)
                    ck_assert_msg(a->bubble == b->bubble, "%s p=%d m=%d v=%d: bubble %.6f, with "
                                  "rendezvous sends %.6f", names[k], p, m, v, a->bubble, b->bubble);
                loom_sched_sim_free(a);
                loom_sched_sim_free(b);
                loom_schedule_free(s);
            }
}
END_TEST

START_TEST(shapes_refused_with_what_would_work)
{
    const loom_plugin *pl;
    loom_schedule *s = NULL;
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_SCHED, "interleaved", &pl), LOOM_OK);
    ck_assert_int_eq(loom_schedule_from_plugin(pl->desc, 4, 6, 2, &s), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(),
                     "interleaved: microbatches = 6 is not a multiple of stages = 4 (Megatron's "
                     "interleaved order needs m % p == 0); use 4 or 8 micro-batches, or the "
                     "1f1b schedule, which takes any count");
    ck_assert_int_eq(loom_schedule_from_plugin(pl->desc, 4, 3, 2, &s), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "use 4 or 8 micro-batches"));
    ck_assert_int_eq(loom_schedule_from_plugin(pl->desc, 4, 8, 1, &s), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "interleaving needs chunks >= 2"));
    ck_assert_int_eq(loom_plugin_load(LOOM_KIND_SCHED, "1f1b", &pl), LOOM_OK);
    ck_assert_int_eq(loom_schedule_from_plugin(pl->desc, 4, 8, 2, &s), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "1f1b: chunks = 2, but 1f1b has no virtual stages (use "
                     "chunks = 1, or the interleaved schedule for chunks >= 2)");
    ck_assert_ptr_null(s);
    /* build() itself refuses too, without a message (it has no host) */
    const loom_sched_ops *ops = pl->desc->ops;
    loom_sched_shape bad = {4, 4, 8, 1};
    size_t n = 0;
    ck_assert_int_eq(ops->build(&bad, NULL, 0, &n), LOOM_ERR_INVALID);
    loom_sched_shape ok = {4, 0, 8, 1};
    ck_assert_int_eq(ops->build(&ok, NULL, 0, &n), LOOM_ERR_INVALID); /* no room: n says how much */
    ck_assert_uint_eq(n, 8 * 2 + 8 * 2);                              /* FWD+SEND_ACT, RECV_GRAD+BWD */
}
END_TEST

/* ---- hand-made lists --------------------------------------------------------------- */

#define F LOOM_SCHED_FWD
#define BWD LOOM_SCHED_BWD
#define BI LOOM_SCHED_BWD_INPUT
#define BW LOOM_SCHED_BWD_WEIGHT
#define SA LOOM_SCHED_SEND_ACT
#define RA LOOM_SCHED_RECV_ACT
#define SG LOOM_SCHED_SEND_GRAD
#define RG LOOM_SCHED_RECV_GRAD

static loom_schedule *lists(int p, int m, int v, const loom_sched_instr *const *l, const int *n)
{
    loom_schedule *s;
    ck_assert_int_eq(loom_schedule_new(p, m, v, &s), LOOM_OK);
    for (int r = 0; r < p; r++)
        for (int i = 0; i < n[r]; i++)
            ck_assert_int_eq(loom_schedule_push(s, r, l[r][i]), LOOM_OK);
    return s;
}

static void refused(loom_schedule *s, const char *msg)
{
    loom_sched_sim *sim = NULL;
    ck_assert_int_eq(loom_schedule_simulate(s, NULL, &sim), LOOM_ERR_INVALID);
    ck_assert_ptr_null(sim);
    ck_assert_str_eq(loom_last_error(), msg);
    loom_schedule_free(s);
}

/* GPipe for 2 stages and 2 micro-batches, to break in the cases below. */
static const loom_sched_instr good0[] = {{F, 0, 0}, {SA, 0, 0}, {F, 1, 0}, {SA, 1, 0},
                                         {RG, 0, 0}, {BWD, 0, 0}, {RG, 1, 0}, {BWD, 1, 0}};
static const loom_sched_instr good1[] = {{RA, 0, 0}, {F, 0, 0}, {RA, 1, 0}, {F, 1, 0},
                                         {BWD, 0, 0}, {SG, 0, 0}, {BWD, 1, 0}, {SG, 1, 0}};

START_TEST(a_good_hand_made_list_passes)
{
    const loom_sched_instr *l[] = {good0, good1};
    loom_schedule *s = lists(2, 2, 1, l, (int[]){8, 8});
    loom_sched_sim *sim = NULL;
    ck_assert_int_eq(loom_schedule_simulate(s, NULL, &sim), LOOM_OK);
    ck_assert_double_eq(sim->makespan, 9);
    ck_assert_double_eq(sim->span[1][1].start, 1); /* stage 1's FWD 0 waits for stage 0's */
    ck_assert_double_eq(sim->span[0][5].start, 5); /* stage 0 waits for the gradient of BWD 0 */
    loom_sched_sim_free(sim);
    /* a latency on every transfer: forward and backward each cross one link */
    loom_sched_costs c = {1, 1, 1, 0.5, 0, NULL};
    ck_assert_int_eq(loom_schedule_simulate(s, &c, &sim), LOOM_OK);
    ck_assert_double_eq(sim->makespan, 10);
    loom_sched_sim_free(sim);
    loom_schedule_free(s);
}
END_TEST

START_TEST(missing_backward_is_refused)
{
    const loom_sched_instr s1[] = {{RA, 0, 0}, {F, 0, 0}, {RA, 1, 0}, {F, 1, 0},
                                   {BWD, 0, 0}, {SG, 0, 0}};
    const loom_sched_instr s0[] = {{F, 0, 0}, {SA, 0, 0}, {F, 1, 0}, {SA, 1, 0},
                                   {RG, 0, 0}, {BWD, 0, 0}};
    const loom_sched_instr *l[] = {s0, s1};
    refused(lists(2, 2, 1, l, (int[]){6, 6}),
            "stage 0, instruction 2 (FWD mb 1 chunk 0): micro-batch 1 chunk 0 is forwarded but "
            "never backwarded (no BWD or BWD_INPUT)");
}
END_TEST

START_TEST(send_without_receive_is_refused)
{
    const loom_sched_instr s1[] = {{RA, 0, 0}, {F, 0, 0}, {F, 1, 0},
                                   {BWD, 0, 0}, {SG, 0, 0}, {BWD, 1, 0}, {SG, 1, 0}};
    const loom_sched_instr *l[] = {good0, s1};
    refused(lists(2, 2, 1, l, (int[]){8, 7}),
            "stage 0, instruction 3 (SEND_ACT mb 1 chunk 0): stage 1 never receives it (it has "
            "no RECV_ACT mb 1 chunk 0)");
}
END_TEST

START_TEST(cross_stage_deadlock_is_refused)
{
    const loom_sched_instr s0[] = {{F, 0, 0}, {SA, 0, 0}, {RG, 0, 0}, {BWD, 0, 0},
                                   {F, 1, 0}, {SA, 1, 0}, {RG, 1, 0}, {BWD, 1, 0}};
    const loom_sched_instr s1[] = {{RA, 1, 0}, {F, 1, 0}, {BWD, 1, 0}, {SG, 1, 0},
                                   {RA, 0, 0}, {F, 0, 0}, {BWD, 0, 0}, {SG, 0, 0}};
    const loom_sched_instr *l[] = {s0, s1};
    loom_schedule *s = lists(2, 2, 1, l, (int[]){8, 8});
    ck_assert_int_eq(loom_schedule_validate(s), LOOM_OK); /* every piece is there: only the order is wrong */
    refused(s, "deadlock: stage 0 waits at instruction 2 (RECV_GRAD mb 0 chunk 0) and stage 1 "
               "at instruction 0 (RECV_ACT mb 1 chunk 0)");
}
END_TEST

START_TEST(three_stage_deadlock_names_the_cycle)
{
    /* stage 0 waits for a gradient, stage 1 for an activation that stage 0 sends only
     * after it; stage 2 is stuck behind stage 1 but is not in the cycle. */
    const loom_sched_instr s0[] = {{F, 0, 0}, {SA, 0, 0}, {RG, 0, 0}, {BWD, 0, 0},
                                   {F, 1, 0}, {SA, 1, 0}, {RG, 1, 0}, {BWD, 1, 0}};
    const loom_sched_instr s1[] = {{RA, 1, 0}, {F, 1, 0}, {SA, 1, 0}, {RG, 1, 0}, {BWD, 1, 0},
                                   {SG, 1, 0}, {RA, 0, 0}, {F, 0, 0}, {SA, 0, 0}, {RG, 0, 0},
                                   {BWD, 0, 0}, {SG, 0, 0}};
    const loom_sched_instr s2[] = {{RA, 1, 0}, {F, 1, 0}, {BWD, 1, 0}, {SG, 1, 0},
                                   {RA, 0, 0}, {F, 0, 0}, {BWD, 0, 0}, {SG, 0, 0}};
    const loom_sched_instr *l[] = {s0, s1, s2};
    refused(lists(3, 2, 1, l, (int[]){8, 12, 8}),
            "deadlock: stage 0 waits at instruction 2 (RECV_GRAD mb 0 chunk 0) and stage 1 at "
            "instruction 0 (RECV_ACT mb 1 chunk 0)");
}
END_TEST

START_TEST(rendezvous_only_deadlock_is_refused)
{
    /* stage 0 sends micro-batch 1 before 0; stage 1 receives 0 first: fine when sends do
     * not block, a deadlock when a send waits for its receiver */
    const loom_sched_instr s0[] = {{F, 1, 0}, {SA, 1, 0}, {F, 0, 0}, {SA, 0, 0},
                                   {RG, 0, 0}, {BWD, 0, 0}, {RG, 1, 0}, {BWD, 1, 0}};
    const loom_sched_instr *l[] = {s0, good1};
    loom_schedule *s = lists(2, 2, 1, l, (int[]){8, 8});
    loom_sched_sim *sim = NULL;
    ck_assert_int_eq(loom_schedule_simulate(s, NULL, &sim), LOOM_OK);
    loom_sched_sim_free(sim);
    loom_sched_costs rdv = LOOM_SCHED_COSTS_UNIT;
    rdv.rendezvous = 1;
    ck_assert_int_eq(loom_schedule_simulate(s, &rdv, &sim), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "deadlock: stage 0 waits at instruction 1 (SEND_ACT mb 1 "
                                        "chunk 0) and stage 1 at instruction 0 (RECV_ACT mb 0 chunk 0)");
    /* good0/good1 group SEND_ACT 1 with RECV_GRAD 0 and pass */
    const loom_sched_instr *g[] = {good0, good1};
    loom_schedule *ok = lists(2, 2, 1, g, (int[]){8, 8});
    ck_assert_int_eq(loom_schedule_simulate(ok, &rdv, &sim), LOOM_OK);
    ck_assert_double_eq(sim->makespan, 9);
    loom_sched_sim_free(sim);
    loom_schedule_free(ok);
    loom_schedule_free(s);
}
END_TEST

START_TEST(other_wrong_lists_are_refused)
{
    /* activations received only after the FWD that needs them */
    const loom_sched_instr late[] = {{F, 0, 0}, {RA, 0, 0}, {RA, 1, 0}, {F, 1, 0},
                                     {BWD, 0, 0}, {SG, 0, 0}, {BWD, 1, 0}, {SG, 1, 0}};
    const loom_sched_instr *l1[] = {good0, late};
    refused(lists(2, 2, 1, l1, (int[]){8, 8}),
            "stage 1, instruction 0 (FWD mb 0 chunk 0): its activations are received only "
            "later, at instruction 1 (RECV_ACT must come before FWD)");
    /* a forward twice */
    const loom_sched_instr twice[] = {{F, 0, 0}, {SA, 0, 0}, {F, 1, 0}, {SA, 1, 0}, {F, 0, 0}};
    const loom_sched_instr *l2[] = {twice, good1};
    refused(lists(2, 2, 1, l2, (int[]){5, 8}),
            "stage 0, instruction 4 (FWD mb 0 chunk 0): a second FWD of micro-batch 0 chunk 0 "
            "(the first is instruction 0)");
    /* W before its B; a micro-batch out of range; a send past the last stage */
    const loom_sched_instr wb[] = {{F, 0, 0}, {BW, 0, 0}, {BI, 0, 0}};
    const loom_sched_instr *l3[] = {wb};
    refused(lists(1, 1, 1, l3, (int[]){3}),
            "stage 0, instruction 1 (BWD_WEIGHT mb 0 chunk 0): comes before its BWD_INPUT "
            "(BWD_WEIGHT needs its BWD_INPUT first)");
    const loom_sched_instr range[] = {{F, 0, 0}, {BWD, 0, 0}, {F, 2, 0}};
    const loom_sched_instr *l4[] = {range};
    refused(lists(1, 2, 1, l4, (int[]){3}),
            "stage 0, instruction 2 (FWD mb 2 chunk 0): micro-batch 2 is not one of 0..1");
    const loom_sched_instr past[] = {{F, 0, 0}, {SA, 0, 0}, {BWD, 0, 0}};
    const loom_sched_instr *l5[] = {past};
    refused(lists(1, 1, 1, l5, (int[]){3}),
            "stage 0, instruction 1 (SEND_ACT mb 0 chunk 0): stage 0 chunk 0 is the last virtual "
            "stage; there is no next stage to send activations to");
    /* one stage's list leaves a micro-batch out altogether */
    const loom_sched_instr none[] = {{F, 0, 0}, {BWD, 0, 0}};
    const loom_sched_instr *l6[] = {none};
    refused(lists(1, 2, 1, l6, (int[]){2}),
            "stage 0: micro-batch 1 chunk 0 is never forwarded (no FWD mb 1 chunk 0 in its 2 "
            "instructions)");
    /* interleaving wraps: stage 1 chunk 0 sends to stage 0 chunk 1, which must receive it */
    const loom_sched_instr w0[] = {{F, 0, 0}, {SA, 0, 0}, {F, 0, 1}, {BWD, 0, 1}, {SG, 0, 1},
                                   {RG, 0, 0}, {BWD, 0, 0}};
    const loom_sched_instr w1[] = {{RA, 0, 0}, {F, 0, 0}, {SA, 0, 0}, {RG, 0, 0}, {BWD, 0, 0},
                                   {SG, 0, 0}};
    const loom_sched_instr *l7[] = {w0, w1};
    refused(lists(2, 1, 2, l7, (int[]){7, 6}),
            "stage 1, instruction 2 (SEND_ACT mb 0 chunk 0): stage 0 never receives it (it has "
            "no RECV_ACT mb 0 chunk 1)");
}
END_TEST

/* The engine's own checks (train/pipeline_check.h): every plugin's lists keep the untagged
 * transport's order and backward each chunk's micro-batches in order (canonical mode); one
 * stage's list with micro-batches 0 and 1's W swapped is refused, and interleaved's
 * activations leave no place in the order for the tied wte's halves (which is why the
 * engine exchanges them after the list with chunks > 1). */
START_TEST(engine_checks)
{
    const char *names[] = {"gpipe", "1f1b", "zb1", "interleaved"};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < N_PS; i++)
            for (int j = 0; j < N_MS; j++) {
                int p = PS[i], m = MS[j], v = k == 3 ? 2 : 1;
                if (k == 3 && m % p)
                    continue;
                loom_schedule *s = build(names[k], p, m, v);
                ck_assert_msg(loom_pipeline_check_fifo(s, 0) == LOOM_OK, "%s p=%d m=%d: %s",
                              names[k], p, m, loom_last_error());
                ck_assert_msg(v > 1 || loom_pipeline_check_fifo(s, 1) == LOOM_OK, "%s p=%d m=%d "
                              "with the tied halves: %s", names[k], p, m, loom_last_error());
                ck_assert_msg(loom_pipeline_check_order(s, names[k]) == LOOM_OK, "%s p=%d m=%d: %s",
                              names[k], p, m, loom_last_error());
                loom_schedule_free(s);
            }
    loom_schedule *s = build("zb1", 2, 4, 1);
    int w[2] = {-1, -1};
    for (size_t i = 0; i < s->n[0]; i++)
        if (s->list[0][i].op == LOOM_SCHED_BWD_WEIGHT && s->list[0][i].microbatch < 2)
            w[s->list[0][i].microbatch] = (int)i;
    ck_assert(w[0] >= 0 && w[1] >= 0);
    s->list[0][w[0]].microbatch = 1;
    s->list[0][w[1]].microbatch = 0;
    ck_assert_int_eq(loom_pipeline_check_order(s, "zb1"), LOOM_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(loom_last_error(), "runs BWD_WEIGHT of micro-batch 1 before micro-batch "
                         "0's on stage 0 chunk 0"), "%s", loom_last_error());
    loom_schedule_free(s);
    s = build("interleaved", 2, 4, 2);
    ck_assert_int_eq(loom_pipeline_check_fifo(s, 1), LOOM_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(loom_last_error(), "stage 1 sends stage 0 its messages (with canonical "
                         "mode's tied wte halves) in another order"), "%s", loom_last_error());
    loom_schedule_free(s);
}
END_TEST

/* ---- the default block split ---------------------------------------------------------- */

static void split_is(int L, int V, const double *layer, double first, double last,
                     const int *want)
{
    int got[8];
    ck_assert_msg(loom_pipeline_balance(L, V, layer, first, last, got) == LOOM_OK, "%s",
                  loom_last_error());
    for (int k = 0; k < V; k++)
        ck_assert_msg(got[k] == want[k], "L=%d V=%d first=%g last=%g: stage %d holds %d blocks, "
                      "want %d", L, V, first, last, k, got[k], want[k]);
}

/* The costliest stage of every split of L blocks into V stages, by enumeration. */
static double best_by_search(int L, int V, const double *layer, double first, double last,
                             int k, int j, double worst)
{
    if (k == V)
        return j == L ? worst : INFINITY;
    double best = INFINITY;
    for (int n = 1; j + n <= L - (V - 1 - k); n++) {
        double c = (k == 0 ? first : 0.0) + (k == V - 1 ? last : 0.0);
        for (int l = j; l < j + n; l++)
            c += layer[l];
        double r = best_by_search(L, V, layer, first, last, k + 1, j + n, c > worst ? c : worst);
        best = r < best ? r : best;
    }
    return best;
}

START_TEST(split_balances_by_cost)
{
    /* equal blocks, no extras: the even split, the first stages one larger */
    split_is(5, 2, NULL, 0, 0, (int[]){3, 2});
    split_is(8, 3, NULL, 0, 0, (int[]){3, 3, 2});
    split_is(4, 4, NULL, 0, 0, (int[]){1, 1, 1, 1});
    /* a head of 2.2 blocks moves a block to the first stage; a heavy embedding the other way */
    split_is(4, 2, NULL, 0, 2.2, (int[]){3, 1});
    split_is(4, 2, NULL, 2.2, 0, (int[]){1, 3});
    /* a head of one block: 4 + 3 over 2 stages, 2 + 2 + 2 + 1 over 4 virtual stages */
    split_is(7, 2, NULL, 0, 1.0, (int[]){4, 3});
    split_is(7, 4, NULL, 0, 1.0, (int[]){2, 2, 2, 1});
    /* a head smaller than a block stays with an even split it cannot improve */
    split_is(4, 2, NULL, 0, 0.6, (int[]){2, 2});
    int c[2];
    ck_assert_int_eq(loom_pipeline_balance(3, 4, NULL, 0, 0, c), LOOM_ERR_INVALID);
    ck_assert_msg(strstr(loom_last_error(), "cannot split 3 blocks into 4 pipeline stages"), "%s",
                  loom_last_error());
    /* uneven blocks (a MoE-like pattern and pseudo-random costs): the costliest stage is
     * the smallest any split has */
    unsigned x = 12345;
    for (int trial = 0; trial < 200; trial++) {
        double layer[9];
        int L = 2 + trial % 8, V = 1 + trial % 4;
        if (V > L)
            continue;
        for (int l = 0; l < L; l++) {
            x = x * 1103515245u + 12345u;
            layer[l] = 0.5 + (double)(x >> 16 & 1023) / 256.0;
        }
        double first = (trial % 3) * 0.7, last = (trial % 5) * 0.9;
        int got[8];
        ck_assert(loom_pipeline_balance(L, V, layer, first, last, got) == LOOM_OK);
        double worst = 0.0;
        for (int k = 0, j = 0; k < V; j += got[k++]) {
            ck_assert(got[k] >= 1);
            double cst = (k == 0 ? first : 0.0) + (k == V - 1 ? last : 0.0);
            for (int l = j; l < j + got[k]; l++)
                cst += layer[l];
            worst = cst > worst ? cst : worst;
        }
        double best = best_by_search(L, V, layer, first, last, 0, 0, 0.0);
        ck_assert_msg(fabs(worst - best) <= 1e-9 * best, "trial %d: costliest stage %g, search "
                      "finds %g", trial, worst, best);
    }
}
END_TEST

/* The FLOPs the split weighs (gpt_cost.h): a GPT-2 block 3 x (24 C^2 + 4 T C) per token,
 * the head 3 x 2 C Vp; the bench model's head (C = 384, T = 64, Vp = 4096) is 0.865 of a
 * block, so its 7 blocks split 4 + 3. */
START_TEST(flop_costs_of_the_parts)
{
    loom_gpt_config cfg = {.vocab = 4096, .ctx = 64, .layers = 7, .heads = 6, .dim = 384};
    double layer[7], embed, head;
    loom_gpt_layer_costs(&cfg, 64, NULL, layer, &embed, &head);
    double C = 384, T = 64;
    ck_assert(layer[0] == 3 * (24 * C * C + 4 * T * C) && layer[6] == layer[0]);
    ck_assert(head == 3 * 2 * C * 4096);
    ck_assert(embed < 1e-3 * layer[0]);
    ck_assert_msg(fabs(head / layer[0] - 0.8649) < 1e-3, "head / block = %g", head / layer[0]);
    split_is(7, 2, layer, embed, head, (int[]){4, 3});
    unsigned char rc[7] = {1, 0, 0, 0, 0, 0, 0}; /* block 0 recomputed: a third more */
    loom_gpt_layer_costs(&cfg, 64, rc, layer, &embed, &head);
    ck_assert(layer[0] == 4 * (24 * C * C + 4 * T * C) && layer[1] == 3 * (24 * C * C + 4 * T * C));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("schedule");
    TCase *grid = tcase_create("plugins on the grid");
    tcase_set_timeout(grid, 60);
    tcase_add_test(grid, gpipe_and_1f1b_match_the_formula);
    tcase_add_test(grid, interleaved_matches_the_formula);
    tcase_add_test(grid, zb1_beats_1f1b_within_its_memory);
    tcase_add_test(grid, every_plugin_survives_rendezvous_sends);
    tcase_add_test(grid, shapes_refused_with_what_would_work);
    tcase_add_test(grid, engine_checks);
    suite_add_tcase(s, grid);
    TCase *hand = tcase_create("validator");
    tcase_add_test(hand, a_good_hand_made_list_passes);
    tcase_add_test(hand, missing_backward_is_refused);
    tcase_add_test(hand, send_without_receive_is_refused);
    tcase_add_test(hand, cross_stage_deadlock_is_refused);
    tcase_add_test(hand, three_stage_deadlock_names_the_cycle);
    tcase_add_test(hand, rendezvous_only_deadlock_is_refused);
    tcase_add_test(hand, other_wrong_lists_are_refused);
    suite_add_tcase(s, hand);
    TCase *split = tcase_create("split");
    tcase_add_test(split, split_balances_by_cost);
    tcase_add_test(split, flop_costs_of_the_parts);
    suite_add_tcase(s, split);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
