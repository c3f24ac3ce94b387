/* SPDX-License-Identifier: Apache-2.0 */
/* The batched small-buffer copy kernel and its launcher (contract in copy_kernels.h).
 *
 * Why a kernel: one cudaMemcpyAsync per small buffer costs a copy-engine command each (on an
 * H200, 64 KiB buffers reach 18.5 GB/s and 4 KiB buffers 2 GB/s), while SMs reading or
 * writing mapped pinned host memory directly reach ~52 GB/s at any buffer size. The
 * descriptors travel in the kernel parameter block, so a launch costs no allocation, no
 * upload and no synchronization. Each thread block copies one 64 KiB chunk; it finds its
 * copy by binary search over the per-copy chunk prefix the host computed. The parameter
 * block is sized for the group (three instantiations), so a batch of a few buffers does
 * not pay for pushing 30 KiB of parameters.
 *
 * Nothing here is global or mutable; the launcher is thread-safe.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "copy_kernels.h"

namespace {

constexpr unsigned kThreads = 256; /* 256 x 16 B = 4 KiB per block-wide pass */

template <unsigned CAP>
struct group_param {
  uint32_t n;
  uint32_t chunks;
  spw_copy_item_t items[CAP];
};

static_assert(sizeof(group_param<SPW_COPY_GROUP_MAX>) == sizeof(spw_copy_group_t),
              "the largest parameter block must be spw_copy_group_t byte for byte");
static_assert(offsetof(group_param<SPW_COPY_GROUP_MAX>, items) ==
                  offsetof(spw_copy_group_t, items),
              "the largest parameter block must be spw_copy_group_t byte for byte");
static_assert(sizeof(spw_copy_group_t) <= 32764, "kernel parameters are limited to 32764 B");
static_assert(SPW_COPY_CHUNK_BYTES % (kThreads * 16u) == 0, "a chunk is whole block passes");

/* Each thread moves V-sized words at a stride of the block; four loads are issued before
 * their stores so that several PCIe round trips to mapped host memory are in flight per
 * thread (the H2D direction is latency bound). Streaming hints keep the bulk data from
 * evicting the application's working set from L2. */
template <typename V>
__device__ __forceinline__ void copy_words(V *__restrict__ d, const V *__restrict__ s,
                                           uint32_t n) {
  const uint32_t nt = blockDim.x;
  uint32_t i = threadIdx.x;
  for (; i + 3 * nt < n; i += 4 * nt) {
    V a = __ldcs(s + i);
    V b = __ldcs(s + i + nt);
    V c = __ldcs(s + i + 2 * nt);
    V e = __ldcs(s + i + 3 * nt);
    __stcs(d + i, a);
    __stcs(d + i + nt, b);
    __stcs(d + i + 2 * nt, c);
    __stcs(d + i + 3 * nt, e);
  }
  for (; i < n; i += nt) __stcs(d + i, __ldcs(s + i));
}

/* Copies len bytes with the widest access both pointers allow: the bytes before the
 * destination reaches that alignment and the ragged end go one byte per thread (fewer than
 * 16 each, and blockDim > 16). */
__device__ __forceinline__ void copy_range(unsigned char *__restrict__ d,
                                           const unsigned char *__restrict__ s, uint32_t len) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s);
  const uint32_t w = (mis & 15u) == 0 ? 16u : (mis & 7u) == 0 ? 8u : (mis & 3u) == 0 ? 4u : 1u;
  uint32_t head = static_cast<uint32_t>((w - (reinterpret_cast<uintptr_t>(d) & (w - 1))) &
                                        (w - 1));
  if (head > len) head = len;
  const uint32_t words = (len - head) / w;
  const uint32_t body_end = head + words * w;
  const uint32_t t = threadIdx.x;
  if (t < head) d[t] = s[t];
  if (t < len - body_end) d[body_end + t] = s[body_end + t];
  d += head;
  s += head;
  switch (w) {
    case 16:
      copy_words(reinterpret_cast<uint4 *>(d), reinterpret_cast<const uint4 *>(s), words);
      break;
    case 8:
      copy_words(reinterpret_cast<uint2 *>(d), reinterpret_cast<const uint2 *>(s), words);
      break;
    case 4:
      copy_words(reinterpret_cast<unsigned *>(d), reinterpret_cast<const unsigned *>(s), words);
      break;
    default:
      copy_words(d, s, words);
      break;
  }
}

template <unsigned CAP>
__global__ void __launch_bounds__(kThreads)
    copy_kernel(const __grid_constant__ group_param<CAP> g) {
  const uint32_t c = blockIdx.x;
  /* Largest i with first_chunk <= c; the index is uniform across the block, so every
   * parameter read is a broadcast from the constant cache. */
  uint32_t lo = 0, hi = g.n - 1;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) >> 1;
    if (g.items[mid].first_chunk <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  const spw_copy_item_t &it = g.items[lo];
  const uint32_t off = (c - it.first_chunk) * SPW_COPY_CHUNK_BYTES;
  const uint32_t rest = it.bytes - off;
  const uint32_t len = rest < SPW_COPY_CHUNK_BYTES ? rest : SPW_COPY_CHUNK_BYTES;
  copy_range(reinterpret_cast<unsigned char *>(it.dst) + off,
             reinterpret_cast<const unsigned char *>(it.src) + off, len);
}

/* A group of at most CAP items: copied into a parameter block of that size. */
template <unsigned CAP>
cudaError_t launch_small(const spw_copy_group_t *g, cudaStream_t s) {
  group_param<CAP> p;
  p.n = g->n;
  p.chunks = g->chunks;
  memcpy(p.items, g->items, g->n * sizeof(spw_copy_item_t));
  /* The unused tail is sent too; zero it so no stale stack bytes reach the device. */
  memset(p.items + g->n, 0, (CAP - g->n) * sizeof(spw_copy_item_t));
  void *args[1] = {&p};
  return cudaLaunchKernel(reinterpret_cast<const void *>(copy_kernel<CAP>), dim3(g->chunks),
                          dim3(kThreads), args, 0, s);
}

/* A large group: the caller's block has the parameter's layout (asserted above), sent as is. */
cudaError_t launch_full(const spw_copy_group_t *g, cudaStream_t s) {
  void *args[1] = {const_cast<spw_copy_group_t *>(g)};
  return cudaLaunchKernel(reinterpret_cast<const void *>(copy_kernel<SPW_COPY_GROUP_MAX>),
                          dim3(g->chunks), dim3(kThreads), args, 0, s);
}

}  // namespace

extern "C" int spw__copy_kernel_launch(const spw_copy_group_t *g, spw_stream_t s,
                                       int *cuda_err) {
  *cuda_err = 0;
  if (!g || g->n == 0 || g->n > SPW_COPY_GROUP_MAX || g->chunks == 0) return SPW_ERR_INVALID_ARG;
  cudaError_t e;
  if (g->n <= 16)
    e = launch_small<16>(g, s);
  else if (g->n <= 128)
    e = launch_small<128>(g, s);
  else
    e = launch_full(g, s);
  if (e != cudaSuccess) {
    *cuda_err = static_cast<int>(e);
    return SPW_ERR_CUDA;
  }
  return SPW_OK;
}

extern "C" int spw__copy_kernel_probe(int *cuda_err) {
  *cuda_err = 0;
  const void *fns[] = {reinterpret_cast<const void *>(copy_kernel<16>),
                       reinterpret_cast<const void *>(copy_kernel<128>),
                       reinterpret_cast<const void *>(copy_kernel<SPW_COPY_GROUP_MAX>)};
  for (const void *fn : fns) {
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, fn);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      *cuda_err = static_cast<int>(e);
      return SPW_ERR_UNSUPPORTED;
    }
  }
  return SPW_OK;
}
