/* SPDX-License-Identifier: Apache-2.0 */
/* The demo's GPU side: the three kernels (fill, one transform round, checksum), the small
 * results array the checksums land in, and the link-ceiling measurement.
 *
 * Every kernel is a grid-stride loop over the word functions of demo_kernels.h, so it
 * covers any buffer size with a bounded grid. Every CUDA call is checked and its error
 * returned, never printed here; the caller names it with demo_cuda_error_text. Nothing here
 * keeps state between calls.
 */
#include <cuda_runtime.h>

#include "demo_kernels.h"

#define THREADS 256
#define MAX_BLOCKS 4096u

static unsigned grid_for(size_t words) {
  size_t blocks = (words + THREADS - 1) / THREADS;
  if (blocks == 0) blocks = 1;
  return blocks > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)blocks;
}

__global__ void fill_kernel(uint32_t *p, size_t n, uint32_t seed) {
  size_t step = (size_t)gridDim.x * blockDim.x;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step)
    p[j] = demo_fill_word(seed, j);
}

__global__ void transform_kernel(uint32_t *p, size_t n, uint32_t key) {
  size_t step = (size_t)gridDim.x * blockDim.x;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step)
    p[j] = demo_transform_word(p[j], j, key);
}

/* Per-thread partial sums, reduced within each warp by shuffles, then one atomic per warp:
 * the sum is order-independent, so the result is exact whatever the schedule. */
__global__ void checksum_kernel(const uint32_t *p, size_t n, unsigned long long *out) {
  size_t step = (size_t)gridDim.x * blockDim.x;
  unsigned long long acc = 0;
  for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step)
    acc += demo_checksum_term(p[j], j);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xFFFFFFFFu, acc, off);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

/* A launch reports bad configurations at once and faults later, at the stream's next
 * synchronization (which Spillway checks); cudaGetLastError catches the first kind. */
extern "C" int demo_cuda_fill(uint32_t *p, size_t words, uint32_t seed, spw_stream_t stream) {
  fill_kernel<<<grid_for(words), THREADS, 0, stream>>>(p, words, seed);
  return (int)cudaGetLastError();
}

extern "C" int demo_cuda_transform(uint32_t *p, size_t words, uint32_t key, spw_stream_t stream) {
  transform_kernel<<<grid_for(words), THREADS, 0, stream>>>(p, words, key);
  return (int)cudaGetLastError();
}

extern "C" int demo_cuda_checksum(const uint32_t *p, size_t words, uint64_t *out,
                                  spw_stream_t stream) {
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "atomicAdd on 64-bit words");
  checksum_kernel<<<grid_for(words), THREADS, 0, stream>>>(p, words,
                                                           (unsigned long long *)out);
  return (int)cudaGetLastError();
}

extern "C" int demo_cuda_results_alloc(size_t n, uint64_t **out) {
  void *d = NULL;
  cudaError_t e = cudaMalloc(&d, n * sizeof(uint64_t));
  /* Spillway's streams are non-blocking: they do not wait for the legacy stream, so the
   * zeroing must be complete before any checksum kernel can run. */
  if (e == cudaSuccess) e = cudaMemsetAsync(d, 0, n * sizeof(uint64_t), 0);
  if (e == cudaSuccess) e = cudaStreamSynchronize(0);
  if (e != cudaSuccess) {
    if (d) cudaFree(d);
    return (int)e;
  }
  *out = (uint64_t *)d;
  return 0;
}

extern "C" int demo_cuda_results_fetch(const uint64_t *dev, uint64_t *host, size_t n) {
  return (int)cudaMemcpy(host, dev, n * sizeof(uint64_t), cudaMemcpyDeviceToHost);
}

extern "C" void demo_cuda_results_free(uint64_t *dev) {
  if (dev) cudaFree(dev);
}

/* Times one copy of `bytes` in seconds, on `s`, between two events. */
static cudaError_t timed_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                              cudaStream_t s, cudaEvent_t a, cudaEvent_t b, double *secs) {
  float ms = 0.0f;
  cudaError_t e = cudaEventRecord(a, s);
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, s);
  if (e == cudaSuccess) e = cudaEventRecord(b, s);
  if (e == cudaSuccess) e = cudaEventSynchronize(b);
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
  if (e == cudaSuccess) *secs = ms / 1e3;
  return e;
}

extern "C" int demo_cuda_link_ceiling(size_t bytes, double *d2h_gbs, double *h2d_gbs) {
  void *dev = NULL, *host = NULL;
  cudaStream_t s = NULL;
  cudaEvent_t a = NULL, b = NULL;
  double best_d2h = 0.0, best_h2d = 0.0;
  cudaError_t e = cudaMalloc(&dev, bytes);
  if (e == cudaSuccess) e = cudaMallocHost(&host, bytes);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreate(&a);
  if (e == cudaSuccess) e = cudaEventCreate(&b);
  /* The first copy each way pays for lazy mappings; best of two keeps it out. */
  for (int rep = 0; rep < 2 && e == cudaSuccess; rep++) {
    double t = 0.0;
    e = timed_copy(host, dev, bytes, cudaMemcpyDeviceToHost, s, a, b, &t);
    if (e == cudaSuccess && t > 0 && bytes / t / 1e9 > best_d2h) best_d2h = bytes / t / 1e9;
    if (e == cudaSuccess) e = timed_copy(dev, host, bytes, cudaMemcpyHostToDevice, s, a, b, &t);
    if (e == cudaSuccess && t > 0 && bytes / t / 1e9 > best_h2d) best_h2d = bytes / t / 1e9;
  }
  /* Clean up whatever was made, keeping the first error. */
  cudaError_t c = cudaSuccess;
  if (s) c = cudaStreamSynchronize(s);
  if (b) cudaEventDestroy(b);
  if (a) cudaEventDestroy(a);
  if (s) cudaStreamDestroy(s);
  if (host) cudaFreeHost(host);
  if (dev) cudaFree(dev);
  if (e == cudaSuccess) e = c;
  if (e != cudaSuccess) return (int)e;
  *d2h_gbs = best_d2h;
  *h2d_gbs = best_h2d;
  return 0;
}

extern "C" const char *demo_cuda_error_text(int err) {
  return cudaGetErrorString((cudaError_t)err);
}
