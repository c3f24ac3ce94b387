/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: device memory for buffers (see device_pool.c). Small
 * buffers come from per-size-class slabs, large ones straight from the backend's
 * stream-ordered allocator. Thread-safe. */
#ifndef SPILLWAY_SRC_DEVICE_POOL_H
#define SPILLWAY_SRC_DEVICE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "spillway/spillway.h"

#define SPW_DPOOL_SMALL ((size_t)512 << 10) /* buffers below this come from slabs */
#define SPW_DPOOL_SLAB ((size_t)32 << 20)   /* slab size, smaller for small budgets */

typedef struct spw_dpool spw_dpool_t;

int spw__dpool_create(spw_runtime_t *rt, spw_dpool_t **out);
void spw__dpool_destroy(spw_runtime_t *rt, spw_dpool_t *p);
/* Device memory for `bytes`, usable by work enqueued on bstream after the call (large: the
 * backend's alloc_async on bstream; small: any stream). SPW_ERR_OUT_OF_MEMORY if refused. */
int spw__dpool_alloc(spw_runtime_t *rt, size_t bytes, spw_stream_t bstream, void **out);
/* Returns memory no work can touch any more (large: free_async on bstream). */
void spw__dpool_free(spw_runtime_t *rt, void *ptr, size_t bytes, spw_stream_t bstream);
/* Returns memory once the work enqueued so far on bstream has completed. */
void spw__dpool_free_after(spw_runtime_t *rt, void *ptr, size_t bytes, spw_stream_t bstream);
/* Gives entirely free slabs back to the device; returns the bytes released. */
uint64_t spw__dpool_trim(spw_runtime_t *rt);

#endif /* SPILLWAY_SRC_DEVICE_POOL_H */
