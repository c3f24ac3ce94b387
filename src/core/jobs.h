/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the work the core hands the spill engine's lanes
 * (engine.h knows nothing of buffers): explicit spills and background spilling on the down
 * lane, prefetches on the up lane. */
#ifndef SPILLWAY_CORE_JOBS_H
#define SPILLWAY_CORE_JOBS_H

#include "runtime.h"

/* The work functions for spw__engine_start, bound to `rt`. */
spw_engine_work_t spw__jobs_work(spw_runtime_t *rt);
/* Queue a spill to `tier` / a prefetch of n buffers (the array is copied). Errors:
 * SPW_ERR_SYSTEM. */
int spw__jobs_spill(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_tier_t tier);
int spw__jobs_prefetch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n);

#endif /* SPILLWAY_CORE_JOBS_H */
