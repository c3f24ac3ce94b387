/* SPDX-License-Identifier: Apache-2.0 */
/* The kernels of test_launch_kernel, as one table for either backend: host functions
 * (spw_host_kernel_fn) on the host backend, CUDA kernels (test_launch_kernels.cu) on the
 * CUDA backend. Each does the same thing on both:
 *   fill_u32(uint32_t *dst, uint32_t value, uint64_t n)      dst[0..n) = value
 *   add_u32(uint32_t *dst, const uint32_t *src, uint64_t n)  dst[i] += src[i]
 *   hold(uint32_t *dst, uint64_t ns)                         runs ns nanoseconds, then dst[0] = 1
 *   mixed(uint64_t *out, uint8_t x, double y, test_pair_t p) out[0..4) = x, bits of y, p.a, p.b
 * Launch fill_u32 and add_u32 on at least n threads (any grid). */
#ifndef SPILLWAY_TESTS_TEST_LAUNCH_KERNELS_H
#define SPILLWAY_TESTS_TEST_LAUNCH_KERNELS_H

#include <stdint.h>

typedef struct test_pair {
  uint64_t a;
  uint16_t b;
} test_pair_t;

typedef struct test_kernels {
  const void *fill_u32, *add_u32, *hold, *mixed;
} test_kernels_t;

#ifdef __cplusplus
extern "C" {
#endif
/* The CUDA kernels: cudaKernel_t handles from cudaGetKernel (as_handles), which any CUDA
 * runtime in the process accepts, or the host stubs, which only the runtime the test is
 * linked with knows. Returns 0, or the cudaError_t of cudaGetKernel. */
int test_cuda_kernels(test_kernels_t *k, int as_handles);
#ifdef __cplusplus
}
#endif

#ifndef __CUDACC__
/* The host backend's kernels, and the table for the runtime's backend (C tests only). */
#include <string.h>
#include <time.h>

#include "test_util.h"

static inline void tlk_h_fill_u32(void **args) {
  uint32_t *dst = *(uint32_t **)args[0];
  uint32_t value = *(uint32_t *)args[1];
  uint64_t n = *(uint64_t *)args[2];
  for (uint64_t i = 0; i < n; i++) dst[i] = value;
}

static inline void tlk_h_add_u32(void **args) {
  uint32_t *dst = *(uint32_t **)args[0];
  const uint32_t *src = *(const uint32_t **)args[1];
  uint64_t n = *(uint64_t *)args[2];
  for (uint64_t i = 0; i < n; i++) dst[i] += src[i];
}

static inline void tlk_h_hold(void **args) {
  uint32_t *dst = *(uint32_t **)args[0];
  uint64_t ns = *(uint64_t *)args[1];
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  nanosleep(&ts, NULL);
  dst[0] = 1;
}

static inline void tlk_h_mixed(void **args) {
  uint64_t *out = *(uint64_t **)args[0];
  double y = *(double *)args[2];
  test_pair_t p = *(test_pair_t *)args[3];
  out[0] = *(uint8_t *)args[1];
  memcpy(&out[1], &y, sizeof y);
  out[2] = p.a;
  out[3] = p.b;
}

/* The kernels of the runtime's backend; on CUDA as cudaKernel_t handles unless `stubs`. */
static inline test_kernels_t test_kernels_of(spw_runtime_t *rt, int stubs) {
  spw_backend_kind_t kind;
  ASSERT_OK(spw_runtime_backend(rt, &kind));
  test_kernels_t k = {NULL, NULL, NULL, NULL};
  if (kind == SPW_BACKEND_HOST) {
    k.fill_u32 = spw_host_kernel(tlk_h_fill_u32);
    k.add_u32 = spw_host_kernel(tlk_h_add_u32);
    k.hold = spw_host_kernel(tlk_h_hold);
    k.mixed = spw_host_kernel(tlk_h_mixed);
    return k;
  }
#ifdef TEST_HAVE_CUDA
  ASSERT_EQ(test_cuda_kernels(&k, !stubs), 0);
#else
  (void)stubs;
  ASSERT_TRUE(!"a CUDA runtime in a build without CUDA kernels");
#endif
  return k;
}

#endif /* !__CUDACC__ */

#endif /* SPILLWAY_TESTS_TEST_LAUNCH_KERNELS_H */
