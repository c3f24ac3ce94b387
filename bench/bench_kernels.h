/* SPDX-License-Identifier: Apache-2.0 */
/* Benchmark-private header, never installed: the data pattern every benchmark writes and
 * checks, and the launchers of the CUDA kernels of bench_kernels.cu (fill a buffer with
 * the pattern; add a constant to every u32 word, the "light kernel" of oversubscribe; copy
 * a list of pieces, spill_bw's gather and scatter).
 *
 * The pattern is a function of (seed, word index) only, so a sample of any buffer can be
 * checked without keeping a copy; it is computed identically on host and device (the
 * function is shared through this header). The launchers exist only in builds with CUDA
 * (SPW_BENCH_HAVE_CUDA); they return the cudaError_t of the launch as an int (0 = success),
 * enqueue on `stream` (a cudaStream_t) and never synchronize.
 *
 * A third kernel copies a list of pieces described in device memory (bench_copy_desc_t):
 * spill_bw's gather of many small buffers into one staging buffer and the reverse scatter,
 * to compare one kernel plus one large copy with per-buffer and batched cudaMemcpy. A fourth
 * holds a stream for a while (spill_bw's enqueue costs without the GPU's back-pressure).
 */
#ifndef SPILLWAY_BENCH_KERNELS_H
#define SPILLWAY_BENCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define BENCH_HD __host__ __device__
#else
#define BENCH_HD
#endif

/* Word `i` of a buffer filled with `seed`. Mixed so that a shifted, truncated or swapped
 * copy does not pass for the right one. */
static inline BENCH_HD uint32_t bench_pattern(uint32_t seed, uint64_t i) {
  uint32_t x = seed * 0x9E3779B1u + (uint32_t)i * 0x85EBCA77u + (uint32_t)(i >> 32);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  return x ^ (x >> 12);
}

#ifdef __cplusplus
extern "C" {
#endif

#ifdef SPW_BENCH_HAVE_CUDA
/* Writes bench_pattern(seed, i) into word i of the `words` u32 words at `dptr`. */
int bench_cuda_fill_u32(void *dptr, size_t words, uint32_t seed, void *stream);
/* Adds `add` to each of the `words` u32 words at `dptr`. */
int bench_cuda_add_u32(void *dptr, size_t words, uint32_t add, void *stream);

/* One piece of a device-side batched copy: `bytes` from `src` to `dst`, both addresses the
 * device can access. Plain pointers, so an array built on the host is uploaded as is. */
typedef struct bench_copy_desc {
  void *dst;
  const void *src;
  size_t bytes;
} bench_copy_desc_t;

/* Performs the `n` copies described by `descs`, an array in device memory that must stay
 * valid until the kernel has run. One thread block per piece; 16-byte accesses where both
 * ends are 16-byte aligned, single bytes for the rest. Pieces must not overlap each other
 * (they run in no particular order). */
int bench_cuda_copy_desc(const bench_copy_desc_t *descs, size_t n, void *stream);

/* Holds `stream` for `ns` nanoseconds: one thread that waits on the GPU's global timer, so
 * that what is enqueued behind it meanwhile costs its caller the enqueue alone, with no
 * queue throttled by the GPU's pace. */
int bench_cuda_spin(uint64_t ns, void *stream);
#endif

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_BENCH_KERNELS_H */
