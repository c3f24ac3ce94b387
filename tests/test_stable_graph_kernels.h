/* SPDX-License-Identifier: Apache-2.0 */
/* test_stable_graph's CUDA helpers (test_stable_graph_kernels.cu): each returns 0 or a
 * cudaError_t; streams and graphs are passed as opaque pointers (cudaStream_t,
 * cudaGraphExec_t). */
#ifndef SPILLWAY_TESTS_TEST_STABLE_GRAPH_KERNELS_H
#define SPILLWAY_TESTS_TEST_STABLE_GRAPH_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Captures dst[i] += src[i], i < n, on `stream` and instantiates it into *exec. */
int test_graph_capture_add(void *stream, uint32_t *dst, const uint32_t *src, uint64_t n,
                           void **exec);
int test_graph_launch(void *exec, void *stream);
void test_graph_destroy(void *exec);
const char *test_graph_error(int e);
#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_TESTS_TEST_STABLE_GRAPH_KERNELS_H */
