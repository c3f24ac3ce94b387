/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the device budget (see budget.c).
 *
 * `used` counts the device bytes the runtime has reserved: buffers on the device, and
 * reservations on their way to becoming one (an allocation, an unspill, a prefetch).
 * `spilling` is the part of `used` already on its way out. A reservation that would pass
 * the limit makes room by spilling unlocked buffers on demand; it fails with
 * SPW_ERR_OUT_OF_MEMORY only when the buffers locked right now plus the request do not fit
 * in the limit, that is when no amount of spilling or waiting could make room. */
#ifndef SPILLWAY_CORE_BUDGET_H
#define SPILLWAY_CORE_BUDGET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "owners.h"
#include "spillway/spillway.h"

typedef struct spw_budget {
  uint64_t limit, high, low; /* bytes: the limit and its watermarks */
  _Atomic uint64_t used;
  _Atomic uint64_t spilling;
  /* A prefetch reserved past the low watermark: the next background step spills down to it
   * even below the high one (see reserve_for_hint). */
  atomic_int hint_headroom;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast whenever bytes come back or a spill ends */
} spw_budget_t;

/* Reserves `bytes` of the limit, spilling on demand (this thread does the spilling and
 * waits for it). `own` is what the caller has already reserved and not yet made into
 * spillable buffers (a prefetch's part in progress): when room could only come from that,
 * the call returns SPW_ERR_NOT_READY so the caller can finish what it holds first.
 * Errors: SPW_ERR_OUT_OF_MEMORY (locked + bytes > limit, or waited 10 s without progress;
 * spw_last_error says which), SPW_ERR_HOST_OUT_OF_MEMORY / SPW_ERR_DISK_FULL / SPW_ERR_IO
 * (nothing is locked enough to fail, but every spill that would make room failed for lack
 * of somewhere to put it), SPW_ERR_NOT_READY (see `own`). */
int spw__budget_reserve(spw_runtime_t *rt, uint64_t bytes, uint64_t own);
/* Gives back `bytes` that left the device (or were never used) and wakes the waiters. */
void spw__budget_credit(spw_runtime_t *rt, uint64_t bytes);
/* Spills in flight: `bytes` started on their way out; and a batch ended, `freed` of them
 * having left the device (credited) out of `ended` that were in flight. */
void spw__budget_spill_started(spw_runtime_t *rt, uint64_t bytes);
void spw__budget_spill_ended(spw_runtime_t *rt, uint64_t freed, uint64_t ended);

/* Reserves and allocates device memory for a buffer of `bytes` on `stream` (a reservation
 * that the device itself refuses retries after making more room), giving the reservation
 * back on failure. With `va` (an address-stable buffer's range) the memory is mapped there
 * and *out is va. Errors as spw__budget_reserve, plus the backend's. */
int spw__device_get(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, uint64_t own,
                    void *va, void **out);
/* spw__device_get (no `own`, no stable range) for memory from the device pool's arenas
 * (SPW_ALLOC_ARENA; spw__dpool_alloc_arena). */
int spw__device_get_arena(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, void **out);
/* The same for a prefetch, whose room must stay: it reserves only up to the high watermark,
 * spills only buffers that no prefetch brought back since their last acquire, and waits
 * for nothing but spills in flight. Errors: SPW_ERR_OUT_OF_MEMORY (no such room: the caller
 * drops the buffer from its prefetch, which is no failure), SPW_ERR_NOT_READY (see `own`). */
int spw__device_get_hint(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, uint64_t own,
                         void *va, void **out);
/* The two halves of spw__device_get (hint 0) and spw__device_get_hint (hint 1), for a batch
 * that reserves every buffer of a part first and then takes their memory at once (small
 * blocks under one pool lock, spw__dpool_alloc_n): the reservation, with the errors of the
 * whole call; and the allocation of memory already reserved (mapped at `va` for a stable
 * buffer), which gives the reservation back on failure (hint: SPW_ERR_OUT_OF_MEMORY at
 * once, no retries that wait). */
int spw__device_reserve(spw_runtime_t *rt, size_t bytes, uint64_t own, int hint);
int spw__device_alloc_reserved(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, int hint,
                               void *va, void **out);
/* Returns device memory: at once when no work can touch it, or, with `after` non-NULL,
 * once that event (recorded by the caller) has completed (a stable buffer's memory is
 * unmapped after waiting for the event here: its range must be free of mappings before the
 * next unspill maps it again). spw__device_put also credits its
 * reservation (at once: the memory is on its way back); spw__device_free leaves that to
 * the caller, who credits a whole batch with one spw__budget_credit. */
void spw__device_free(spw_runtime_t *rt, void *ptr, size_t bytes, spw_bevent_t *after);
void spw__device_put(spw_runtime_t *rt, void *ptr, size_t bytes, spw_bevent_t *after);

/* Bytes of device memory held by locked buffers (a scan of the slots). */
uint64_t spw__locked_device_bytes(spw_runtime_t *rt);
/* Each owner's bytes on the device (RESIDENT, or SPILLING: its device copy is still there)
 * into out[id] (out[0]: buffers without an owner), by a lock-free scan of the slots like
 * spw__locked_device_bytes': each buffer is counted as it was when its slot was read, not
 * all at one instant. */
void spw__owner_device_bytes(spw_runtime_t *rt, uint64_t out[SPW_OWNERS]);

#endif /* SPILLWAY_CORE_BUDGET_H */
