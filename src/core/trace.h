/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the spill trace (SPILLWAY_TRACE, config.trace_path).
 *
 * Every move's outcome, every lock that had to wait, and every spill made to free room go
 * into a bounded lock-free ring (a few stores and one CAS per event, no lock, no
 * allocation, no system call); a writer thread of the trace drains it every 2 ms into a
 * Chrome trace-event JSON file (Perfetto, chrome://tracing) and samples the bytes in each
 * tier. A full ring drops the event and counts it; the file never grows past its cap.
 *
 * Tracks: one per thread that ran the work, named for the engine's lanes ("engine down
 * lane", "engine up lane") and numbered for application threads, which is where spills on
 * demand and unspills for an acquire run. The stream of a lock wait is in its arguments, and
 * the owner of a buffer (SPW_ALLOC_OWNER, by its spw_owner_name or as "owner <id>") in the
 * arguments of its move and lock wait. Counters: the bytes per tier, and for each owner that
 * allocated, its bytes on the device ("device (<owner>)"), found by a scan of the slots on
 * the writer's thread, so that nothing on the application's paths counts them.
 *
 * When tracing is off, rt->trace is NULL and each hook is one predictable branch in its
 * caller. Every function below is safe from any thread while the trace is open. */
#ifndef SPILLWAY_CORE_TRACE_H
#define SPILLWAY_CORE_TRACE_H

#include <stdint.h>

#include "spillway/spillway.h"

typedef struct spw_trace spw_trace_t;
struct spw_runtime;

/* Opens rt->settings.trace_path and starts the writer. Returns SPW_OK with *out NULL when
 * no trace is asked for; SPW_ERR_SYSTEM when the file cannot be created or the writer cannot
 * start (the caller decides whether that is fatal). */
int spw__trace_open(struct spw_runtime *rt, spw_trace_t **out);
/* Drains what is left, writes the closing event (with the drop counts) and closes the file.
 * Call once no thread can add events. NULL does nothing. */
void spw__trace_close(spw_trace_t *t);

/* A move ended (spw__report_move's arguments): `from == to` marks a failure. `owner` is the
 * buffer's owner id (0: none). */
void spw__trace_move(spw_trace_t *t, spw_buf_t h, uint32_t owner, spw_state_t from,
                     spw_state_t to, uint64_t bytes, uint64_t duration_ns, int status);
/* An acquire that had to bring its buffer back or wait for another thread's move, from
 * `t0_ns` (spw__now_ns) to now. */
void spw__trace_lock_wait(spw_trace_t *t, spw_buf_t h, uint32_t owner, spw_stream_t stream,
                          uint64_t bytes, uint64_t t0_ns, int status);
/* Spills made to free room (`background` 0: on demand, for an allocation, an acquire or a
 * prefetch; 1: above the high watermark), from `t0_ns` to now. */
void spw__trace_spill_for_room(spw_trace_t *t, int background, uint64_t wanted, uint64_t moved,
                               uint64_t t0_ns);
/* Names the calling thread's track after an engine lane (0 down, 1 up). */
void spw__trace_lane(spw_trace_t *t, int lane);

#endif /* SPILLWAY_CORE_TRACE_H */
