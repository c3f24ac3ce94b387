/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the batched small-buffer copy kernel (copy_kernels.cu)
 * and its C-callable launcher, used by backend_cuda.c only.
 *
 * A group is up to SPW_COPY_GROUP_MAX copies passed by value as the kernel's one parameter
 * (__grid_constant__, CUDA 12.1+ allows 32764 bytes), so a launch needs no staging memory
 * and no descriptor upload. Each copy is cut into SPW_COPY_CHUNK_BYTES chunks and every
 * chunk is one thread block. Invariants the launcher relies on (backend_cuda.c keeps them):
 *  - 1 <= n <= SPW_COPY_GROUP_MAX; every item has 1 <= bytes < SPW_COPY_SMALL_MAX;
 *  - items[0].first_chunk == 0, and items[i + 1].first_chunk == items[i].first_chunk +
 *    ceil(items[i].bytes / SPW_COPY_CHUNK_BYTES); `chunks` is the total;
 *  - both pointers of an item are addressable by the device: device memory, or host memory
 *    registered mapped on a device that can use registered host pointers directly.
 * Items in a group may have any alignment: the kernel uses 16-byte accesses when source and
 * destination share their alignment modulo 16, narrower ones otherwise.
 */
#ifndef SPILLWAY_BACKEND_COPY_KERNELS_H
#define SPILLWAY_BACKEND_COPY_KERNELS_H

#include <stdint.h>

#include "spillway/spillway.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPW_COPY_CHUNK_BYTES (64u * 1024u)  /* bytes one thread block copies */
#define SPW_COPY_SMALL_MAX (1u << 20)       /* copies this size and up go to copy engines */
#define SPW_COPY_GROUP_MAX 1280u            /* 8 + 1280 * 24 = 30728 bytes of parameter */

typedef struct spw_copy_item {
  uint64_t dst;
  uint64_t src;
  uint32_t bytes;       /* < SPW_COPY_SMALL_MAX, so 32 bits suffice and the item is 24 B */
  uint32_t first_chunk; /* index of this item's first chunk in the group */
} spw_copy_item_t;

typedef struct spw_copy_group {
  uint32_t n;      /* items used */
  uint32_t chunks; /* total chunks = thread blocks of the launch */
  spw_copy_item_t items[SPW_COPY_GROUP_MAX];
} spw_copy_group_t;

/* Enqueues one kernel copying every item of `g` on stream `s` (NULL: the legacy default
 * stream of the calling thread's current device, which the caller has made the backend's).
 * Only the first g->n items are sent to the device, in a parameter block sized for them, so
 * small groups launch cheaply. `g` may be reused as soon as this returns. Returns SPW_OK, or
 * SPW_ERR_CUDA with the cudaError_t of the launch in *cuda_err (for the caller's error sink);
 * an invalid group (n == 0 or > SPW_COPY_GROUP_MAX) is SPW_ERR_INVALID_ARG. */
int spw__copy_kernel_launch(const spw_copy_group_t *g, spw_stream_t s, int *cuda_err);

/* Whether the kernel can run on the calling thread's current device: loads its code (so the
 * first batch pays no module load) and returns SPW_OK, or SPW_ERR_UNSUPPORTED with the
 * cudaError_t in *cuda_err (no machine code or PTX this build can give that device). Any
 * error state the attempt left on the thread is cleared. */
int spw__copy_kernel_probe(int *cuda_err);

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_BACKEND_COPY_KERNELS_H */
