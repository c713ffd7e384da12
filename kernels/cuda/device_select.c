/* device_select.c — see device_select.h. */
#include "device_select.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int loom_cuda_pick_device(int requested, const char *local_rank, int n_devices, char *why,
                          size_t n)
{
    if (n_devices <= 0) {
        snprintf(why, n, "no CUDA device visible (CUDA_VISIBLE_DEVICES, driver?); use "
                 "backend = \"cpu\"");
        return -1;
    }
    if (requested >= 0) {
        if (requested >= n_devices) {
            snprintf(why, n, "device = %d, but %d device%s visible (0 to %d); use -1 for "
                     "LOCAL_RANK %% devices", requested, n_devices, n_devices == 1 ? " is" : "s are",
                     n_devices - 1);
            return -1;
        }
        return requested;
    }
    if (requested != -1) {
        snprintf(why, n, "device = %d; use -1 (auto: LOCAL_RANK %% devices) or 0 to %d",
                 requested, n_devices - 1);
        return -1;
    }
    if (!local_rank || !*local_rank)
        return 0;
    char *end = NULL;
    errno = 0;
    long lr = strtol(local_rank, &end, 10);
    if (errno || *end || lr < 0 || lr > 1 << 20) {
        snprintf(why, n, "LOCAL_RANK = \"%s\" is not a whole number >= 0", local_rank);
        return -1;
    }
    return (int)(lr % n_devices);
}
