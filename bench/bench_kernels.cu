/* SPDX-License-Identifier: Apache-2.0 */
/* The benchmarks' CUDA kernels (contract in bench_kernels.h): fill with the check pattern,
 * and add a constant to every u32 word. Both are grid-stride loops over 32-bit words with a
 * grid capped at a few waves, so one launch serves any buffer size. Nothing here is global
 * or mutable; the launchers are thread-safe. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "bench_kernels.h"

namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = 4096; /* enough to fill an H100/H200 several times over */

__global__ void fill_kernel(uint32_t *__restrict__ p, size_t words, uint32_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride)
    p[i] = bench_pattern(seed, i);
}

__global__ void add_kernel(uint32_t *__restrict__ p, size_t words, uint32_t add) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride)
    p[i] += add;
}

unsigned grid_for(size_t words) {
  size_t blocks = (words + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

}  // namespace

extern "C" int bench_cuda_fill_u32(void *dptr, size_t words, uint32_t seed, void *stream) {
  if (words == 0) return static_cast<int>(cudaSuccess);
  fill_kernel<<<grid_for(words), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint32_t *>(dptr), words, seed);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int bench_cuda_add_u32(void *dptr, size_t words, uint32_t add, void *stream) {
  if (words == 0) return static_cast<int>(cudaSuccess);
  add_kernel<<<grid_for(words), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint32_t *>(dptr), words, add);
  return static_cast<int>(cudaGetLastError());
}
