/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the work the core hands the spill engine's lanes
 * (engine.h knows nothing of buffers): explicit spills and background spilling on the down
 * lane, prefetches on the up lane. */
#ifndef SPILLWAY_CORE_JOBS_H
#define SPILLWAY_CORE_JOBS_H

#include "runtime.h"

/* The work functions for spw__engine_start, bound to `rt`. */
spw_engine_work_t spw__jobs_work(spw_runtime_t *rt);
/* Records a wish to spill n buffers to `tier` / to prefetch them, and queues those not
 * queued yet (see hint_set.h: one pending wish per buffer, the newest wins). Errors:
 * SPW_ERR_SYSTEM (out of memory: the buffers before the failing one stay queued). */
int spw__jobs_spill(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_tier_t tier);
int spw__jobs_prefetch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n);
/* A hint that finds its buffer already where it asks (spw_spill of a buffer at or below
 * `tier`, spw_prefetch of one on the device: tier DEVICE) needs no move, but it is still
 * the newest wish: a different one pending for the buffer is cancelled. */
void spw__jobs_fulfilled(spw_runtime_t *rt, spw_buf_t h, spw_tier_t tier);
/* Buffers with a pending wish (statistics). */
size_t spw__jobs_pending(spw_runtime_t *rt);

#endif /* SPILLWAY_CORE_JOBS_H */
