/* device_select.h — which GPU this process takes, in plain C (unit-tested without a GPU).
 *
 * A recipe's `device` key (>= 0) names one; otherwise (auto, -1) LOCAL_RANK, as the launcher
 * and torchrun set it, modulo the visible count, so the ranks of a node spread over its
 * GPUs (LOCAL_RANK unset: device 0). The CUDA backend and loom-comm-nccl call it before any
 * other CUDA or NCCL call, so every rank lands on its own GPU, not all on GPU 0.
 */
#ifndef LOOM_CUDA_DEVICE_SELECT_H
#define LOOM_CUDA_DEVICE_SELECT_H

#include <stddef.h>

/* The device index, or -1 with the reason in why (n bytes): no device visible, a requested
 * index out of range, or a LOCAL_RANK that is not a whole number >= 0. */
int loom_cuda_pick_device(int requested, const char *local_rank, int n_devices, char *why,
                          size_t n);

#endif
