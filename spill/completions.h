/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: run a function once a stream's work so far completes,
 * without blocking anyone. An event is recorded on the stream; one poller thread watches
 * the pending events and runs each function on its own thread once its event has
 * completed. That thread may call the backend (a CUDA host function may not), which is why
 * the lock release of spw_stream_release_async goes through here rather than
 * cudaLaunchHostFunc. Functions run outside every lock of this module, in no guaranteed
 * order between streams; they must not call back into it except spw__completions_after. */
#ifndef SPILLWAY_SPILL_COMPLETIONS_H
#define SPILLWAY_SPILL_COMPLETIONS_H

#include <stdint.h>

#include "backend.h"
#include "event_pool.h"

typedef struct spw_completions spw_completions_t;

/* `status`: SPW_OK, or the error of the event query (the work may have failed: the function
 * still runs, so that what it releases does not leak). */
typedef void (*spw_completion_fn)(void *arg, int status);

/* Starts the poller. Events come from `events`, which must outlive the poller. */
int spw__completions_start(const spw_backend_ops_t *ops, spw_backend_t *be,
                           spw_event_pool_t *events, spw_completions_t **out);
/* Runs what is pending (waiting for its events), then stops the poller. NULL-safe. */
void spw__completions_stop(spw_completions_t *c);
/* fn(arg, status) runs once the work enqueued on `stream` so far has completed. On error fn
 * is never called. */
int spw__completions_after(spw_completions_t *c, spw_stream_t stream, spw_completion_fn fn,
                           void *arg);
/* fn(arg, status) runs once `ev`, already recorded by the caller, has completed. The event
 * stays the caller's and must outlive the item; recording it again before then only makes
 * fn run later. On error fn is never called. */
int spw__completions_after_event(spw_completions_t *c, spw_bevent_t *ev, spw_completion_fn fn,
                                 void *arg);
/* A mark of what has been submitted so far, for spw__completions_flush_stream. */
uint64_t spw__completions_mark(spw_completions_t *c);
/* Runs now what is pending for `stream` and was submitted up to `mark`, taken before the
 * caller synchronized the stream (so those events are complete): a synchronize releases the
 * locks of an earlier release_async too, but not those of one submitted by another thread
 * while it waited, whose work may still run. */
void spw__completions_flush_stream(spw_completions_t *c, spw_stream_t stream, uint64_t mark);
/* Blocks until everything submitted before the call has run. */
void spw__completions_drain(spw_completions_t *c);
/* The same, giving up after timeout_ns; returns 1 if everything ran. */
int spw__completions_drain_for(spw_completions_t *c, uint64_t timeout_ns);

#endif /* SPILLWAY_SPILL_COMPLETIONS_H */
