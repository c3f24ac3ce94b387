/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the spill engine and the moves between tiers.
 *
 * The engine owns two non-blocking copy streams and two worker threads ("lanes"), one per
 * direction (the link is full duplex), each with its own job queue. The down lane runs
 * explicit spills and spills least-recently-used buffers in the background whenever device
 * usage passes the high watermark, down to the low one; the up lane runs prefetches. Spills on demand (an
 * allocation or unspill that needs room) run on the thread that needs the room, on the same
 * streams, so they never wait for the worker: progress is guaranteed without it.
 *
 * Moves (one file each): spill.c device -> host, unspill.c host/disk -> device, demote.c
 * host -> disk. A move first puts the buffer in a transient state under its slot mutex,
 * works without the mutex, then commits under it again only if the buffer is still in that
 * transient state with the same move_seq (an acquire abandons a spill by moving it back to
 * RESIDENT and bumping move_seq). A failed move leaves the buffer in its last good tier.
 */
#ifndef SPILLWAY_SPILL_ENGINE_H
#define SPILLWAY_SPILL_ENGINE_H

#include "../src/runtime.h"

int spw__engine_start(spw_runtime_t *rt);
/* Finishes queued jobs, stops both workers, destroys the copy streams. NULL-safe. */
void spw__engine_stop(spw_runtime_t *rt);
spw_stream_t spw__engine_d2h(spw_runtime_t *rt);
spw_stream_t spw__engine_h2d(spw_runtime_t *rt);
/* Tells the worker that usage passed the high watermark. Cheap; callable anywhere. */
void spw__engine_kick(spw_runtime_t *rt);
/* Queue a spill / prefetch of n buffers (the array is copied). */
int spw__engine_submit_spill(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_tier_t tier);
int spw__engine_submit_prefetch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n,
                                spw_stream_t bstream);
/* Waits until both lanes' queues are empty and their workers idle. */
void spw__engine_wait_idle(spw_runtime_t *rt);

/* A buffer chosen to be spilled: already SPILLING (moved there by spw__victim_claim). */
typedef struct spw_victim {
  spw_buf_t h;
  spw_slot_t *s;
  size_t size;
  uint32_t seq;  /* move_seq when claimed */
  int clean;     /* it had a clean host copy: nothing to copy */
  int landing;   /* an unspill copy into it may still be in flight (WAIT when claimed) */
  int to_disk;   /* no host memory for it: it goes straight to disk instead */
  spw_host_extent_t ext;
  int status;
} spw_victim_t;

/* Moves a RESIDENT, unlocked buffer to SPILLING if its mutex is free (never waits, so a
 * thread holding another slot's mutex may call it). Returns 1 and fills *v on success. */
int spw__victim_claim(spw_runtime_t *rt, spw_buf_t h, spw_slot_t *s, spw_victim_t *v);

/* spill.c: copies the victims to host memory in one batch, waits for the copy, commits.
 * `reason`: 0 explicit, 1 on demand, 2 background. Returns how many moved. */
size_t spw__spill_batch(spw_runtime_t *rt, spw_victim_t *v, size_t n, int reason);

/* unspill.c: with slot->mu held and the buffer in HOST (or, for unspill_disk, DISK): brings
 * it back to the device, ordered before what is enqueued on bstream afterwards, and takes
 * `lock` locks (0 for a prefetch). On success the slot is RESIDENT and *dptr set; on error it
 * is where it was. unspill_disk drops and retakes slot->mu around the read. `ev` receives
 * the state change for the controller (delivered by the caller after unlocking). */
int spw__unspill_host(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, spw_stream_t bstream,
                      unsigned flags, uint32_t lock, void **dptr, spw_state_event_t *ev);
int spw__unspill_disk(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, spw_stream_t bstream,
                      unsigned flags, uint32_t lock, void **dptr, spw_state_event_t *ev);

/* unspill.c: brings the HOST buffers among hs back as one batch (one copy launch, one
 * event), waits for it, and marks them RESIDENT with their host copy kept as a clean copy.
 * Buffers not on host are skipped. Returns how many moved. */
size_t spw__unspill_host_batch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n);

/* demote.c: writes a HOST buffer to disk (it must be HOST and unlocked; slot->mu not held
 * by the caller). Returns SPW_OK if it moved, else an error (the buffer stays on host). */
int spw__demote(spw_runtime_t *rt, spw_buf_t h);
/* demote.c: a claimed victim straight to disk through the staging pipeline (spw_spill with
 * tier DISK on a resident buffer). SPW_ERR_BUSY if an acquire took it back. */
int spw__spill_to_disk(spw_runtime_t *rt, spw_victim_t *v);
/* Demotes least-recently-used host buffers until `bytes` of host memory came free. Returns
 * the bytes freed. */
uint64_t spw__demote_lru(spw_runtime_t *rt, uint64_t bytes);

/* A host extent for `bytes`, making room by demoting to disk when the arena is full. */
int spw__host_extent_alloc(spw_runtime_t *rt, size_t bytes, spw_host_extent_t *out);
/* Returns a host extent once the work enqueued so far on `stream` has completed (it may
 * still be the source or target of a copy). */
void spw__host_extent_free_after(spw_runtime_t *rt, spw_host_extent_t *e, spw_stream_t stream);

#endif /* SPILLWAY_SPILL_ENGINE_H */
