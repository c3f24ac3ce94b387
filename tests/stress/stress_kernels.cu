/* SPDX-License-Identifier: Apache-2.0 */
/* The stress test's CUDA kernels (contract in stress_kernels.h): check every 8-byte word of
 * a buffer against its key and count the wrong ones, and write a key's pattern. Both are
 * grid-stride loops with a grid capped at a few waves, so one launch serves any size from
 * 1 byte to 64 MiB; the bytes past the last whole word are handled by the first thread.
 * A check kernel records the first wrong word it meets (index, value, expected key), so
 * the host can say whether it was stale, foreign or garbage. */
#include <cuda_runtime.h>
#include <stdint.h>

#include <new>

#include "stress_kernels.h"
#include "stress_pattern.h"

struct stress_cuda_check {
  stress_cuda_result_t *dev; /* cudaMalloc'd, zeroed */
  cudaStream_t copy;         /* a private stream for reading it back */
};

namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = 1024;

unsigned grid_for(size_t words) {
  size_t blocks = (words + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

__device__ void note_wrong(stress_cuda_result_t *r, uint64_t key, uint64_t index, uint64_t got) {
  if (atomicCAS(&r->first_set, 0ull, 2ull) == 0ull) {
    r->first_key = key;
    r->first_index = index;
    r->first_got = got;
    __threadfence();
    atomicExch(&r->first_set, 1ull);
  }
}

__global__ void verify_kernel(const uint64_t *__restrict__ p, size_t words, size_t tail,
                              uint64_t key, stress_cuda_result_t *r) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long wrong = 0;
  for (size_t i = first; i < words; i += stride) {
    const uint64_t got = p[i];
    if (got != stress_word(key, i)) {
      if (wrong == 0) note_wrong(r, key, i, got);
      wrong++;
    }
  }
  if (first == 0 && tail > 0) {
    const uint8_t *b = reinterpret_cast<const uint8_t *>(p + words);
    const uint64_t want = stress_word(key, words);
    uint64_t got = 0;
    for (size_t k = 0; k < tail; k++) got |= static_cast<uint64_t>(b[k]) << (8 * k);
    const uint64_t mask = (1ull << (8 * tail)) - 1; /* tail < 8 */
    if (got != (want & mask)) {
      note_wrong(r, key, words, got);
      wrong++;
    }
  }
  /* One atomic per warp that saw anything: a torn 64 MiB buffer must not take seconds. */
  for (int off = 16; off > 0; off /= 2) wrong += __shfl_down_sync(0xffffffffu, wrong, off);
  if ((threadIdx.x & 31) == 0 && wrong > 0) atomicAdd(&r->wrong_words, wrong);
}

__global__ void write_kernel(uint64_t *__restrict__ p, size_t words, size_t tail, uint64_t key) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = first; i < words; i += stride) p[i] = stress_word(key, i);
  if (first == 0 && tail > 0) {
    uint8_t *b = reinterpret_cast<uint8_t *>(p + words);
    const uint64_t w = stress_word(key, words);
    for (size_t k = 0; k < tail; k++) b[k] = static_cast<uint8_t>(w >> (8 * k));
  }
}

}  // namespace

extern "C" int stress_cuda_check_create(stress_cuda_check_t **out) {
  stress_cuda_check_t *c = new (std::nothrow) stress_cuda_check_t();
  if (!c) return static_cast<int>(cudaErrorMemoryAllocation);
  cudaError_t e = cudaMalloc(&c->dev, sizeof *c->dev);
  if (e == cudaSuccess) e = cudaMemset(c->dev, 0, sizeof *c->dev);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    if (c->dev) cudaFree(c->dev);
    delete c;
    return static_cast<int>(e);
  }
  *out = c;
  return 0;
}

extern "C" void stress_cuda_check_destroy(stress_cuda_check_t *c) {
  if (!c) return;
  cudaStreamDestroy(c->copy);
  cudaFree(c->dev);
  delete c;
}

extern "C" int stress_cuda_check_read(stress_cuda_check_t *c, stress_cuda_result_t *out) {
  cudaError_t e = cudaMemcpyAsync(out, c->dev, sizeof *out, cudaMemcpyDeviceToHost, c->copy);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->copy);
  return static_cast<int>(e);
}

extern "C" int stress_cuda_verify(const void *dptr, size_t bytes, uint64_t key,
                                  stress_cuda_check_t *c, void *stream) {
  const size_t words = bytes / 8;
  verify_kernel<<<grid_for(words), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint64_t *>(dptr), words, bytes % 8, key, c->dev);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int stress_cuda_write(void *dptr, size_t bytes, uint64_t key, void *stream) {
  const size_t words = bytes / 8;
  write_kernel<<<grid_for(words), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint64_t *>(dptr), words, bytes % 8, key);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int stress_cuda_finish(void) {
  cudaError_t e = cudaDeviceSynchronize();
  cudaError_t last = cudaGetLastError();
  return static_cast<int>(e != cudaSuccess ? e : last);
}

extern "C" const char *stress_cuda_error_name(int err) {
  return cudaGetErrorName(static_cast<cudaError_t>(err));
}
