/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA kernels of test_launch_kernel (test_launch_kernels.h says what each does). */
#include <cuda_runtime.h>
#include <string.h>

#include "test_launch_kernels.h"

__global__ void tlk_fill_u32(uint32_t *dst, uint32_t value, uint64_t n) {
  uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  if (i < n) dst[i] = value;
}

__global__ void tlk_add_u32(uint32_t *dst, const uint32_t *src, uint64_t n) {
  uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

__global__ void tlk_hold(uint32_t *dst, uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (threadIdx.x == 0 && blockIdx.x == 0) dst[0] = 1;
}

__global__ void tlk_mixed(uint64_t *out, uint8_t x, double y, test_pair_t p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  uint64_t bits;
  memcpy(&bits, &y, sizeof bits);
  out[0] = x;
  out[1] = bits;
  out[2] = p.a;
  out[3] = p.b;
}

static int get(const void **out, const void *stub, int as_handle) {
  if (!as_handle) {
    *out = stub;
    return 0;
  }
  cudaKernel_t k;
  cudaError_t e = cudaGetKernel(&k, stub);
  *out = (const void *)k;
  return (int)e;
}

extern "C" int test_cuda_kernels(test_kernels_t *k, int as_handles) {
  int e = get(&k->fill_u32, (const void *)tlk_fill_u32, as_handles);
  if (!e) e = get(&k->add_u32, (const void *)tlk_add_u32, as_handles);
  if (!e) e = get(&k->hold, (const void *)tlk_hold, as_handles);
  if (!e) e = get(&k->mixed, (const void *)tlk_mixed, as_handles);
  return e;
}
