/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: run a function once a stream's work so far completes,
 * without blocking anyone. An event is recorded on the stream; one poller thread per runtime
 * watches the pending events and runs each function on its own thread once its event has
 * completed. That thread may call the backend (a CUDA host function may not), which is why
 * the lock release of spw_stream_release_async goes through here rather than
 * cudaLaunchHostFunc. Functions run outside every lock, in no guaranteed order between
 * streams. */
#ifndef SPILLWAY_SRC_COMPLETIONS_H
#define SPILLWAY_SRC_COMPLETIONS_H

#include <stdint.h>

#include "spillway/spillway.h"

typedef void (*spw_completion_fn)(spw_runtime_t *rt, void *arg);

int spw__completions_start(spw_runtime_t *rt);
/* Runs what is pending (waiting for its events), then stops the poller. */
void spw__completions_stop(spw_runtime_t *rt);
/* fn(rt, arg) runs once the work enqueued on bstream so far has completed. On error fn is
 * never called. */
int spw__after_stream(spw_runtime_t *rt, spw_stream_t bstream, spw_completion_fn fn, void *arg);
/* Runs now what is pending for `bstream`, which the caller has just synchronized (so its
 * events are complete): a synchronize releases the locks of an earlier release_async too. */
void spw__completions_flush_stream(spw_runtime_t *rt, spw_stream_t bstream);
/* Blocks until everything submitted before the call has run. */
void spw__completions_drain(spw_runtime_t *rt);
/* The same, giving up after timeout_ns; returns 1 if everything ran. */
int spw__completions_drain_for(spw_runtime_t *rt, uint64_t timeout_ns);

#endif /* SPILLWAY_SRC_COMPLETIONS_H */
