/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: device memory for buffers (see device_pool.c). Small
 * buffers come from per-size-class slabs, large ones straight from the backend's
 * stream-ordered allocator, or, in an exportable pool, from arenas the pool divides itself.
 * Thread-safe. */
#ifndef SPILLWAY_SPILL_DEVICE_POOL_H
#define SPILLWAY_SPILL_DEVICE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "completions.h"

#define SPW_DPOOL_SMALL ((size_t)512 << 10) /* buffers below this come from slabs */
#define SPW_DPOOL_SLAB ((size_t)32 << 20)   /* slab size, smaller for small budgets */

typedef struct spw_dpool spw_dpool_t;

typedef struct spw_dpool_params {
  const spw_backend_ops_t *ops;
  spw_backend_t *be;
  spw_stream_t null_stream;     /* slabs are allocated and freed on it */
  uint64_t device_limit;        /* slabs stay a small fraction of it */
  spw_completions_t *completions; /* for spw__dpool_free_after */
  int exportable;               /* config.ipc: every block in a region from ops->ipc_alloc
                                   (slabs, and arenas for large blocks) so that CUDA IPC can
                                   export it; else large blocks from the backend's pool */
} spw_dpool_params_t;

int spw__dpool_create(const spw_dpool_params_t *p, spw_dpool_t **out);
/* Frees the slabs (every block must be back or abandoned). NULL-safe. */
void spw__dpool_destroy(spw_dpool_t *p);
/* Device memory for `bytes`, usable by work enqueued on `stream` after the call (large: the
 * backend's alloc_async on `stream`; small: any stream). SPW_ERR_OUT_OF_MEMORY if refused. */
int spw__dpool_alloc(spw_dpool_t *p, size_t bytes, spw_stream_t stream, void **out);
/* spw__dpool_alloc for a block that comes from an arena even in a pool that is not
 * exportable (SPW_ALLOC_ARENA): a free-list operation instead of the backend's allocator;
 * small blocks as spw__dpool_alloc. Usable by every stream. Every free of the pool knows an
 * arena's block by its address. */
int spw__dpool_alloc_arena(spw_dpool_t *p, size_t bytes, void **out);
/* Small blocks for bytes[0..n) from the free lists, under one hold of the lock (a batch of
 * small buffers pays one lock, not one per buffer). Stops at the first size that is not
 * small or whose free list is empty; returns how many, from the first, were served. The
 * rest go through spw__dpool_alloc, which grows a slab when it must. */
size_t spw__dpool_alloc_n(spw_dpool_t *p, const size_t *bytes, size_t n, void **out);
/* Returns memory no work can touch any more (large: free_async on `stream`). NULL is a
 * no-op. */
void spw__dpool_free(spw_dpool_t *p, void *ptr, size_t bytes, spw_stream_t stream);
/* spw__dpool_free for n blocks, small ones under one lock. */
void spw__dpool_free_n(spw_dpool_t *p, void *const *ptrs, const size_t *bytes, size_t n,
                       spw_stream_t stream);
/* Returns a block no work can touch any more, at once, without the completions (the
 * runtime's close, once they have stopped). */
void spw__dpool_free_now(spw_dpool_t *p, void *ptr, size_t bytes);
/* Returns memory once the work enqueued so far on `stream` has completed. */
void spw__dpool_free_after(spw_dpool_t *p, void *ptr, size_t bytes, spw_stream_t stream);
/* Returns memory once `ev` (recorded by the caller; it must outlive the wait) completes. */
void spw__dpool_free_after_event(spw_dpool_t *p, void *ptr, size_t bytes, spw_bevent_t *ev);
/* Gives entirely free slabs (and arenas) back to the device; returns the bytes released. */
uint64_t spw__dpool_trim(spw_dpool_t *p);
/* The region (slab or arena, as ops->ipc_alloc returned it) that holds [ptr, ptr + bytes)
 * of an exportable pool: its base in *base. SPW_ERR_UNSUPPORTED when the pool is not
 * exportable, SPW_ERR_INVALID_ARG when no one region holds the whole range. */
int spw__dpool_region_of(spw_dpool_t *p, const void *ptr, size_t bytes, void **base);

#endif /* SPILLWAY_SPILL_DEVICE_POOL_H */
