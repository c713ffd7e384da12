/* test_cuda_ops_bf16.h — test_cuda_ops_bf16.c's cases, added to test_cuda_ops' TCase. */
#ifndef LOOM_TEST_CUDA_OPS_BF16_H
#define LOOM_TEST_CUDA_OPS_BF16_H

#include <check.h>

void ops_bf16_tests(TCase *tc);

#endif
