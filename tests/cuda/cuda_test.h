/* cuda_test.h — what the GPU tests share: loading a backend plugin (dlopen, as the core
 * does), the skip rule (exit 77, meson's skip, with a message, where no GPU is visible —
 * never a failure for lack of one), and running one op on both backends over the same host
 * inputs: every buffer is uploaded to each backend, the op runs there, everything is
 * downloaded, and the outputs are compared with stated tolerances.
 */
#ifndef LOOM_CUDA_TEST_H
#define LOOM_CUDA_TEST_H

#include <stddef.h>

#include "loom/plugin/backend.h"

typedef struct ct_backend {
    const loom_backend_ops *k;
    void *self;
    const char *name;
} ct_backend;

extern ct_backend ct_cpu, ct_gpu;

/* Open the CPU and CUDA plugins at these paths and start both; exits 77 with a message
 * when the CUDA plugin's probe finds no device (or create says so). */
void ct_open(const char *cpu_path, const char *cuda_path);
void ct_close(void);

enum { CT_MAX_BUFS = 12 };

typedef struct ct_buf {
    const char *name;
    void *host;    /* input values (uploaded to each backend) */
    size_t bytes;
    int compare;   /* 1: an output to compare as floats */
    double atol, rtol;
} ct_buf;

/* The op on one backend: d[i] is buffer i in its memory. */
typedef void (*ct_op_fn)(const loom_backend_ops *k, void *self, void **d, void *ctx);

/* Runs op on both backends and asserts, for each compared buffer, that
 *   |gpu - cpu| <= atol + rtol * |cpu|   elementwise,
 * printing the worst element and the largest error seen. Returns nothing; fails via Check. */
void ct_compare_op(const char *what, ct_buf *bufs, int n, ct_op_fn op, void *ctx);
/* The GPU results of the last ct_compare_op (host copies), buffer i. */
const void *ct_gpu_result(int i);
const void *ct_cpu_result(int i);

/* Deterministic uniform floats in [lo, hi). */
void ct_fill(float *x, size_t n, unsigned seed, float lo, float hi);
float *ct_floats(size_t n, unsigned seed, float lo, float hi);

#endif
