/* SPDX-License-Identifier: Apache-2.0 */
/* The demo's arithmetic and its CUDA entry points, shared by spillway_demo.c and
 * demo_kernels.cu.
 *
 * The word functions are the single definition of the workload: the GPU kernels, the host
 * backend's host funcs and the host-side expectation all call them, so a checksum that
 * differs can only mean that the data did not survive its trips between tiers. Invariants:
 * demo_transform_word is a bijection on uint32_t for every (j, key) (an odd multiplier and
 * an addition, both invertible mod 2^32), so no round can hide a corrupted word; the
 * checksum is a sum, so the order in which a GPU reduction adds its terms does not matter.
 *
 * The demo_cuda_* functions exist only in builds with SPW_DEMO_HAVE_CUDA. They return a
 * cudaError_t as int (0 = cudaSuccess); demo_cuda_error_text names one.
 */
#ifndef SPILLWAY_DEMO_KERNELS_H
#define SPILLWAY_DEMO_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "spillway/spillway.h"

#ifdef __CUDACC__
#define DEMO_HD __host__ __device__
#else
#define DEMO_HD
#endif

/* Initial contents: a cheap integer hash of (seed, position), so every buffer and every
 * word in it differs. */
static inline DEMO_HD uint32_t demo_fill_word(uint32_t seed, uint64_t j) {
  uint32_t x = (uint32_t)j * 0x9E3779B1u ^ seed ^ (uint32_t)(j >> 32);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

/* One round: invertible and position-dependent, so a word moved to the wrong place, a
 * stale copy or a round applied twice all change the result. */
static inline DEMO_HD uint32_t demo_transform_word(uint32_t x, uint64_t j, uint32_t key) {
  return x * 2654435761u + ((uint32_t)j ^ key);
}

/* One word's term of the checksum; the buffer's checksum is the sum of the terms mod 2^64.
 * The odd weight (2j+1) makes swapped words count. */
static inline DEMO_HD uint64_t demo_checksum_term(uint32_t x, uint64_t j) {
  return (uint64_t)x * (2 * j + 1);
}

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel launches on `stream` over `words` 32-bit words at device pointer p. */
int demo_cuda_fill(uint32_t *p, size_t words, uint32_t seed, spw_stream_t stream);
int demo_cuda_transform(uint32_t *p, size_t words, uint32_t key, spw_stream_t stream);
/* Adds p's checksum to *out (device memory from demo_cuda_results_alloc). */
int demo_cuda_checksum(const uint32_t *p, size_t words, uint64_t *out, spw_stream_t stream);

/* n zeroed uint64_t in device memory (outside the Spillway budget: n * 8 bytes). */
int demo_cuda_results_alloc(size_t n, uint64_t **out);
/* Copies them to host; the caller has synchronized the streams that wrote them. */
int demo_cuda_results_fetch(const uint64_t *dev, uint64_t *host, size_t n);
void demo_cuda_results_free(uint64_t *dev);

/* The link ceiling: `bytes` copied once each way between pinned host memory and the current
 * device, on a stream of its own, timed with events; best of two, in GB/s (1e9 B/s). */
int demo_cuda_link_ceiling(size_t bytes, double *d2h_gbs, double *h2d_gbs);

const char *demo_cuda_error_text(int err);

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_DEMO_KERNELS_H */
