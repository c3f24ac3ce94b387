/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA side of the stress test (private to tests/stress/, built only with CUDA:
 * SPW_STRESS_HAVE_CUDA): a kernel that checks every 8-byte word of an acquired buffer
 * against its key (stress_pattern.h) and counts the wrong ones, a kernel that writes a new
 * key, and the per-worker result record the check kernel fills.
 *
 * The kernels are what a user's kernels are to Spillway: launched on the acquiring stream
 * between the acquire and the release, on a pointer that is valid only while the lock is
 * held. The launchers return a cudaError_t as an int (0 = success), enqueue on `stream` and
 * never synchronize, except stress_cuda_check_read, which waits for its own small copy. */
#ifndef SPILLWAY_TESTS_STRESS_KERNELS_H
#define SPILLWAY_TESTS_STRESS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the check kernels of one worker found, in device memory (outside the budget). */
typedef struct stress_cuda_result {
  unsigned long long wrong_words; /* words (or tail bytes) that differed */
  unsigned long long first_set;   /* 1 once the fields below describe the first wrong word */
  unsigned long long first_key, first_index, first_got;
} stress_cuda_result_t;

typedef struct stress_cuda_check stress_cuda_check_t; /* a result record and its copy stream */

int stress_cuda_check_create(stress_cuda_check_t **out);
void stress_cuda_check_destroy(stress_cuda_check_t *c);
/* Copies the record to *out; waits for that copy only (kernels still running may add). */
int stress_cuda_check_read(stress_cuda_check_t *c, stress_cuda_result_t *out);

/* Checks the `bytes` at dptr against `key`; wrong words are added to c's record. */
int stress_cuda_verify(const void *dptr, size_t bytes, uint64_t key, stress_cuda_check_t *c,
                       void *stream);
/* Writes the pattern of `key` over the `bytes` at dptr. */
int stress_cuda_write(void *dptr, size_t bytes, uint64_t key, void *stream);

/* Waits for the whole device and returns the first error any launch left behind. */
int stress_cuda_finish(void);
const char *stress_cuda_error_name(int err);

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_TESTS_STRESS_KERNELS_H */
