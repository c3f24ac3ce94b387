/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: address ranges and physical chunks for address-stable
 * buffers (see stable_pool.c and "Address-stable buffers" in docs/design.md).
 *
 * A stable buffer owns an address range from spw__stable_reserve to spw__stable_unreserve;
 * between them its memory is mapped (spw__stable_map) and unmapped (spw__stable_unmap) as it
 * comes to the device and leaves it, always at the same address. Buffers of at least one
 * granule get a range of their own, rounded up to whole granules, and one physical chunk of
 * that size while mapped; smaller ones get a block of a shared page (one granule), whose
 * chunk is mapped while any block of it is mapped (and, idle, after its last block left,
 * until a trim or until no block of it is owned). Chunks are pooled: an unmap gives its
 * chunk to the pool (the oldest pooled chunks go back to the device past a cap), a map
 * takes one of the same size from it before creating one.
 *
 * Order of calls per buffer: reserve, then maps and unmaps, each map paired with one unmap,
 * then unreserve. Maps are counted: a map while the memory is still mapped (a spill that
 * committed but has not unmapped yet) keeps it mapped, and the late unmap lowers the count.
 * Unreserve may come before the last unmap (a free that overtakes a move): the range is then
 * given back by that unmap, so that an address is never handed out again while mapped.
 * Thread-safe: one mutex, a leaf below every core lock; backend calls are made under it. */
#ifndef SPILLWAY_SPILL_STABLE_POOL_H
#define SPILLWAY_SPILL_STABLE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct spw_stable spw_stable_t;

typedef struct spw_stable_params {
  const spw_backend_ops_t *ops;
  spw_backend_t *be;
  uint64_t pool_cap; /* bytes of unmapped chunks kept for reuse; more go back at once */
} spw_stable_params_t;

int spw__stable_create(const spw_stable_params_t *p, spw_stable_t **out);
/* Releases the pooled chunks and whatever ranges are left (mapped ones are unmapped).
 * NULL-safe. */
void spw__stable_destroy(spw_stable_t *sp);

/* The granule (asked of the backend once). SPW_ERR_UNSUPPORTED when the device has no
 * virtual memory management, and the backend's errors. */
int spw__stable_granularity(spw_stable_t *sp, size_t *out);

/* An address range for a buffer of `bytes`, with nothing mapped. Errors: those of
 * spw__stable_granularity, SPW_ERR_SYSTEM, the backend's. */
int spw__stable_reserve(spw_stable_t *sp, size_t bytes, void **va);
/* Ends the range's life; see the order of calls above. */
void spw__stable_unreserve(spw_stable_t *sp, void *va);

/* Puts memory behind the buffer at `va` (chunks from the pool, else new ones; the memory
 * already there while an unmap is still to come), accessible to every stream on return.
 * Errors: SPW_ERR_OUT_OF_MEMORY (the device refused a chunk), SPW_ERR_INTERNAL (va is no
 * reserved buffer), the backend's; on error nothing changed. */
int spw__stable_map(spw_stable_t *sp, void *va);
/* Ends one map: the last one takes the memory away (precondition: no work on any stream
 * touches it) and its chunks go to the pool. SPW_ERR_INTERNAL if va is not mapped. */
int spw__stable_unmap(spw_stable_t *sp, void *va);

/* Whether `ptr` is the address of a stable buffer's range (lock-free when there are none). */
int spw__stable_owns(spw_stable_t *sp, const void *ptr);

/* What another process needs to map the mapped memory of the buffer at `va` (config.ipc):
 * the descriptor of the one chunk behind it (chunk_export: a large buffer's own chunk, a
 * small buffer's page chunk) and where the chunk starts in it, the chunk's size (a whole
 * number of granules), and the buffer's offset in the chunk. The caller closes *fd.
 * Errors: SPW_ERR_NOT_LOCKED (not mapped: not resident), SPW_ERR_INVALID_ARG (not a
 * buffer's range), the backend's (SPW_ERR_UNSUPPORTED: chunks not exportable). */
int spw__stable_share(spw_stable_t *sp, const void *va, int *fd, uint64_t *fd_offset,
                      size_t *chunk_bytes, size_t *offset);
/* Gives every pooled chunk and idle page back to the device; returns the bytes released. */
uint64_t spw__stable_trim(spw_stable_t *sp);

/* What the pool holds now, for tests and the design's numbers: bytes mapped behind buffers
 * (whole granules), bytes of chunks pooled and of idle pages, bytes of address space
 * reserved. */
void spw__stable_usage(spw_stable_t *sp, uint64_t *mapped, uint64_t *pooled, uint64_t *reserved);

#endif /* SPILLWAY_SPILL_STABLE_POOL_H */
