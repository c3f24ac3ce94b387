/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the pinned host arena.
 *
 * Spilled buffers live in large slabs of host memory: anonymous mmap, touched page by page,
 * then pinned through the backend's host_register (registering touched memory runs at about
 * 26 GB/s on an H200, cudaMallocHost at 1.5 GB/s). Anonymous mmap rather than cudaHostAlloc
 * so that the disk tier can use the same memory for O_DIRECT I/O. Slabs are grown on demand
 * up to the host byte limit; emptied slabs are unmapped, except the two kept for reuse and
 * those a reservation keeps (spw__arena_reserve).
 *
 * Invariants: every extent is 4096-byte aligned and its length rounded up to 4096 (so it can
 * be written to an O_DIRECT file as is); extents never cross slabs; in_use <= mapped <= limit
 * (a single buffer larger than slab_bytes gets a slab of its own size).
 * Thread-safe: one mutex guards the slab list and free lists; no backend call is made while
 * it is held except host_register / host_unregister of a slab being added or removed (a
 * slab mapped ahead, spw__arena_grow_ahead, is registered without it).
 */
#ifndef SPILLWAY_SPILL_HOST_ARENA_H
#define SPILLWAY_SPILL_HOST_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#define SPW_ARENA_ALIGN 4096u

typedef struct spw_host_arena spw_host_arena_t;

typedef struct spw_host_extent {
  void *ptr;     /* NULL when the extent is empty */
  size_t bytes;  /* rounded up to SPW_ARENA_ALIGN */
  uint32_t slab; /* index of the owning slab (internal) */
  uint32_t peer; /* 1: in memory another GPU lent (a borrowed arena, the peer tier) */
} spw_host_extent_t;

typedef struct spw_arena_stats {
  uint64_t in_use;     /* bytes handed out */
  uint64_t mapped;     /* bytes of slabs mapped and pinned */
  uint64_t slabs;      /* number of slabs */
  uint64_t limit;
} spw_arena_stats_t;

/* `limit` bytes at most (0 = none); slabs of `slab_bytes` (rounded to pages; 0 = 256 MiB).
 * The arena calls ops->host_register / host_unregister on b for each slab. */
int spw__arena_create(const spw_backend_ops_t *ops, spw_backend_t *b, uint64_t limit,
                      size_t slab_bytes, spw_host_arena_t **out);
/* An arena over memory someone else owns: [base, base + bytes), 4096-aligned, already usable
 * by the copies (a peer GPU's memory lent to this runtime, the peer tier). It never grows,
 * maps, registers or unmaps anything; its extents are marked `peer`. Destroy it only once
 * every extent has come back (its in_use is 0) and before the memory goes. */
int spw__arena_create_borrowed(void *base, size_t bytes, spw_host_arena_t **out);
/* Unregisters and unmaps every slab, whether or not extents are still out. */
void spw__arena_destroy(spw_host_arena_t *a);

/* Returns SPW_ERR_HOST_OUT_OF_MEMORY when the limit would be passed (nothing changes),
 * SPW_ERR_SYSTEM when mmap fails, the backend's error when registration fails (the slab is
 * unmapped again). `bytes` > 0. */
int spw__arena_alloc(spw_host_arena_t *a, size_t bytes, spw_host_extent_t *out);
/* n allocations under one lock, as spw__arena_alloc each, stopping at the first that fails
 * (*status: its status, or SPW_OK); returns how many succeeded. A batch of small spills
 * pays one lock instead of one per buffer. */
size_t spw__arena_alloc_n(spw_host_arena_t *a, const size_t *bytes, size_t n,
                          spw_host_extent_t *out, int *status);
/* Returns an extent; an empty extent (ptr NULL) is ignored. A slab whose extents have all
 * come back is unregistered and unmapped. */
void spw__arena_free(spw_host_arena_t *a, spw_host_extent_t *e);
/* spw__arena_free of e[0..n) under one lock: a batch's threads do not queue on the arena's
 * mutex once per buffer. */
void spw__arena_free_n(spw_host_arena_t *a, spw_host_extent_t *e, size_t n);

void spw__arena_get_stats(spw_host_arena_t *a, spw_arena_stats_t *out);

/* Maps and pins one more slab ahead of need, if less than half a slab would be free with
 * only the `held` bytes in use, no empty slab is kept, and the limit leaves room for at
 * least a quarter slab. `held`: the bytes of extents the caller cannot give back (data with
 * no other copy, and copies on their way in), as opposed to copies kept for convenience or
 * frees already on their way: those come and go, and a slab pinned for them is a guess (a
 * larger `held` than the bytes in use counts as the bytes in use). Mapping and pinning (a
 * third of a second per GiB) happen outside the arena's mutex: allocations go on
 * meanwhile, and one that finds no room waits for this slab rather than map another.
 * Returns 1 if it added a slab. For a background thread: it blocks while it maps. */
int spw__arena_grow_ahead(spw_host_arena_t *a, uint64_t held);
/* Maps and pins ordinary slabs until at least `bytes` of them are mapped, and from then on
 * keeps them: an empty one past the kept ones goes back only while `bytes` stay mapped.
 * Dedicated slabs (sized for one request) do not count and still go back at once, and one
 * that finds no other room under the limit still takes that of empty reserved slabs, as it
 * takes that of the kept ones. A later call replaces
 * the floor; 0 drops it, and slabs above it then go back as they empty. Blocks while it
 * maps, outside the mutex (allocations go on meanwhile, as for growing ahead). Errors:
 * SPW_ERR_HOST_OUT_OF_MEMORY (bytes above the limit: nothing changes; on a borrowed arena,
 * above its size; or the rest of the limit held by dedicated slabs), SPW_ERR_SYSTEM (mmap
 * failed), the backend's (registration refused): then the slabs mapped before the failure
 * stay, and the floor is what is mapped. */
int spw__arena_reserve(spw_host_arena_t *a, uint64_t bytes);

#endif /* SPILLWAY_SPILL_HOST_ARENA_H */
