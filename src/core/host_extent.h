/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: host extents as the moves use them. The arena hands out
 * pinned memory; these two add what a move needs on top: making room by demoting buffers
 * to disk when the arena is full, and returning an extent only once a stream has passed
 * the copies that may still use it. */
#ifndef SPILLWAY_CORE_HOST_EXTENT_H
#define SPILLWAY_CORE_HOST_EXTENT_H

#include "runtime.h"

/* An extent for a spill of `bytes`: in lent peer memory when there is a peer tier with room
 * (the extent is marked `peer`), else in the host arena, demoting least-recently-used host
 * buffers to disk when it is full. Errors: SPW_ERR_HOST_OUT_OF_MEMORY (full, and demotion
 * freed nothing), the arena's others. */
int spw__host_extent_alloc(spw_runtime_t *rt, size_t bytes, spw_host_extent_t *out);
/* The same in the host arena only (a buffer moving out of peer memory). */
int spw__host_extent_alloc_host(spw_runtime_t *rt, size_t bytes, spw_host_extent_t *out);
/* Returns an extent to the arena it came from, at once; an empty one is ignored. */
void spw__host_extent_free(spw_runtime_t *rt, spw_host_extent_t *e);
/* spw__host_extent_free of e[0..n), the host arena's under one lock. */
void spw__host_extent_free_n(spw_runtime_t *rt, spw_host_extent_t *e, size_t n);
/* Extents for n requests (peer memory first, as above) under one lock per arena, as far as
 * they have room without demoting anything; returns how many, from the first, and in *status why it stopped
 * (SPW_ERR_HOST_OUT_OF_MEMORY: the rest go through spw__host_extent_alloc one by one, which
 * demotes; another error is the failure of the request it stopped at). */
size_t spw__host_extent_alloc_n(spw_runtime_t *rt, const size_t *bytes, size_t n,
                                spw_host_extent_t *out, int *status);
/* Returns `e` once the work enqueued so far on `stream` has completed; empties it. */
void spw__host_extent_free_after(spw_runtime_t *rt, spw_host_extent_t *e, spw_stream_t stream);
/* Returns `e` once `ev` has completed, as spw__host_extent_free_after_event, joining the
 * open item of `cell` (the stream's) when there is one: the frees behind one stream's
 * consecutive copies (single acquires of spilled buffers) share one completion item, so the
 * completion poller queries one event per round instead of one per copy, beside the thread
 * that enqueues them. `ev`: a slot's `ready`, recorded on `stream` after the copy that reads
 * `e`; the item waits for the newest one it was given and records no event of its own (a
 * slot's `ready` is recorded again only by the buffer's next unspill, which needs it
 * unlocked, so after the stream has run the copies it covers). Empties `e`. */
void spw__host_extent_free_behind(spw_runtime_t *rt, spw_host_extent_t *e, spw_stream_t stream,
                                  spw_completion_cell_t *cell, spw_bevent_t *ev);
/* Returns `e` once `ev` (already recorded; it outlives the wait) has completed; empties it. */
void spw__host_extent_free_after_event(spw_runtime_t *rt, spw_host_extent_t *e, spw_bevent_t *ev);

#endif /* SPILLWAY_CORE_HOST_EXTENT_H */
