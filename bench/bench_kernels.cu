/* SPDX-License-Identifier: Apache-2.0 */
/* The benchmarks' CUDA kernels (contract in bench_kernels.h): fill with the check pattern,
 * and add a constant to every u32 word, both grid-stride loops over 32-bit words with a
 * grid capped at a few waves, so one launch serves any buffer size; and a copy of a list of
 * pieces (gather/scatter), one block per piece with 16-byte accesses; and one thread that
 * holds a stream for a given time. Nothing here is global or mutable; the launchers are
 * thread-safe. */
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

/* One block per piece, so a piece's reads and writes stay within one SM and the blocks of
 * small pieces retire quickly; the block loop covers lists longer than the grid. Four
 * 16-byte loads are issued before their stores so each thread keeps several in flight,
 * which a 64 KiB piece (16 vectors per thread) needs to approach copy bandwidth. */
__global__ void copy_desc_kernel(const bench_copy_desc_t *__restrict__ descs, size_t n) {
  const size_t bd = blockDim.x;
  for (size_t b = blockIdx.x; b < n; b += gridDim.x) {
    char *dst = static_cast<char *>(descs[b].dst);
    const char *src = static_cast<const char *>(descs[b].src);
    const size_t bytes = descs[b].bytes;
    size_t done = 0;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
      uint4 *d = reinterpret_cast<uint4 *>(dst);
      const uint4 *s = reinterpret_cast<const uint4 *>(src);
      const size_t vecs = bytes / sizeof(uint4);
      size_t i = threadIdx.x;
      for (; i + 3 * bd < vecs; i += 4 * bd) {
        const uint4 a = s[i], c = s[i + bd], e = s[i + 2 * bd], f = s[i + 3 * bd];
        d[i] = a;
        d[i + bd] = c;
        d[i + 2 * bd] = e;
        d[i + 3 * bd] = f;
      }
      for (; i < vecs; i += bd) d[i] = s[i];
      done = vecs * sizeof(uint4);
    }
    for (size_t i = done + threadIdx.x; i < bytes; i += bd) dst[i] = src[i];
  }
}

/* One thread that returns `ns` nanoseconds of the GPU's global timer after it started. */
__global__ void spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

constexpr size_t kMaxDescBlocks = 1u << 20;

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

extern "C" int bench_cuda_copy_desc(const bench_copy_desc_t *descs, size_t n, void *stream) {
  if (n == 0) return static_cast<int>(cudaSuccess);
  const size_t blocks = n < kMaxDescBlocks ? n : kMaxDescBlocks;
  copy_desc_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(descs, n);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int bench_cuda_spin(uint64_t ns, void *stream) {
  spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ns);
  return static_cast<int>(cudaGetLastError());
}
