/* pipeline_check.h — what the pipeline engine (pipeline.c) needs of a schedule beyond the
 * validator's rules (schedule.h), checked once at setup, each refusal naming what and where.
 */
#ifndef LOOM_CORE_TRAIN_PIPELINE_CHECK_H
#define LOOM_CORE_TRAIN_PIPELINE_CHECK_H

#include "schedule.h"

/* The transport has no tags: what rank a sends rank b, in a's list order, must be what b
 * receives from a, in b's list order. head: canonical mode's tied wte halves travel too
 * (from the last virtual stage after its BWD or B to virtual stage 0, received just
 * before its RECV_GRAD of the micro-batch). */
loom_status loom_pipeline_check_fifo(const loom_schedule *s, int head);
/* Canonical mode: every stage backwards each chunk's micro-batches in order 0..m-1, its
 * B's and its W's alike (name: the schedule's, for the message). */
loom_status loom_pipeline_check_order(const loom_schedule *s, const char *name);

#endif
