/* profile.h — the CUDA backend's device-time profile: `LOOM_CUDA_PROFILE=1` (a table in
 * the log when the backend closes) or `LOOM_CUDA_PROFILE=path.jsonl` (one JSON row per
 * entry; "%r" in the path becomes the rank). Every kernel launch (kernels.cuh's
 * LOOM_CUDA_LAUNCH) and every product (gemm.c, with its M, N, K and batch) is bracketed by
 * two events on the compute stream; their elapsed times are summed by (name, shape). The
 * outermost span wins: a product's conversions and the ordered GEMM's launch inside it
 * count as the product. Beside the sums, the time from the first span's start to the last
 * one's end: where the device time is much less, the device waited for the host (launch
 * overhead, synchronous reads), which is what CUDA graphs would remove.
 *
 * Why events and not a profiler: the lent GPU machine may have no Nsight, and these need
 * only the runtime. Off (the default), each hook is one test of a global int.
 */
#ifndef LOOM_CUDA_PROFILE_H
#define LOOM_CUDA_PROFILE_H

#include "loom/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

extern int loom_cuda_profiling; /* nonzero while LOOM_CUDA_PROFILE is on */

/* Reads LOOM_CUDA_PROFILE: unset, empty or "0" off, "1" the log's table, anything else a
 * path to write. Returns 0, or -1 for a path that cannot be opened for writing (err says
 * why). host is kept for the report's log lines. */
int loom_cuda_profile_setup(const loom_host *host, char *err, size_t err_size);
/* Opens a span named what (a string literal: compared by address first) of the given
 * product shape (0s for a plain kernel); spans nest, the outermost is the one timed. */
void loom_cuda_profile_span_begin(const char *what, int m, int n, int k, int batch);
void loom_cuda_profile_span_end(void);
/* Waits for the stream, sums what is pending, writes the table or the file, frees
 * everything and turns profiling off. Called by the backend's destroy. */
void loom_cuda_profile_report(void);

static inline void loom_cuda_profile_begin(const char *what, int m, int n, int k, int batch)
{
    if (loom_cuda_profiling)
        loom_cuda_profile_span_begin(what, m, n, k, batch);
}
static inline void loom_cuda_profile_end(void)
{
    if (loom_cuda_profiling)
        loom_cuda_profile_span_end();
}

#ifdef __cplusplus
}
#endif

#endif
