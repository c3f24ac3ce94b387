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
struct spw_completion_item;

/* Where one stream's open item is kept, so that consecutive releases behind that stream share
 * one item and one event (launches back to back: a record and an item each cost more than
 * the launch). The caller owns one per stream and zeroes it once; this module reads and
 * writes it only under its own lock. */
typedef struct spw_completion_cell {
  struct spw_completion_item *open; /* the item new work may join, or NULL */
} spw_completion_cell_t;

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
/* As spw__completions_after, but when the stream's work so far has already completed, fn
 * runs now, on the calling thread (a free behind an idle stream needs no poller round). */
int spw__completions_after_or_now(spw_completions_t *c, spw_stream_t stream,
                                  spw_completion_fn fn, void *arg);
/* fn(arg, status) runs once `ev`, already recorded by the caller, has completed. The event
 * stays the caller's and must outlive the item; recording it again before then only makes
 * fn run later. On error fn is never called. */
int spw__completions_after_event(spw_completions_t *c, spw_bevent_t *ev, spw_completion_fn fn,
                                 void *arg);
/* Folds `add` into the argument of an open item. Runs under the module's lock: it must not
 * block or call into this module. Returns SPW_OK, or an error with nothing folded. */
typedef int (*spw_completion_join_fn)(void *open_arg, const void *add);
/* Joins new work to the stream's open item (see spw_completion_cell_t): if `cell` holds an
 * item on `stream` that the poller has not yet picked up, its event is recorded again on
 * `stream`, so that it now also covers the work enqueued since, and join(its arg, add)
 * folds the new work into what its function will run on. Both happen under the module's
 * lock, so the poller never sees the item between the two. Returns SPW_OK when joined;
 * SPW_ERR_NOT_READY when there is no open item (then the caller starts one with
 * spw__completions_after_open); the record's or join's error (nothing joined, the item
 * unchanged but for a later event, which only makes it run later).
 * An item stays open from its start until the poller first picks it up (at most one
 * polling round, 20 us to 1 ms), or until spw__completions_mark seals it: so the work that
 * joins an item is bounded, and its function runs at most one round after the work would
 * have completed without joining. */
int spw__completions_join(spw_completions_t *c, spw_stream_t stream, spw_completion_cell_t *cell,
                          spw_completion_join_fn join, const void *add);
/* As spw__completions_after (with `or_now`, spw__completions_after_or_now), and the new
 * item, if one is made, becomes the cell's open item. */
int spw__completions_after_open(spw_completions_t *c, spw_stream_t stream,
                                spw_completion_cell_t *cell, int or_now, spw_completion_fn fn,
                                void *arg);
/* As spw__completions_after_event (`ev` already recorded by the caller, on `stream`, and
 * outliving the item), and the new item becomes the cell's open item, which
 * spw__completions_join_event may join. */
int spw__completions_after_event_open(spw_completions_t *c, spw_stream_t stream,
                                      spw_completion_cell_t *cell, spw_bevent_t *ev,
                                      spw_completion_fn fn, void *arg);
/* Joins new work to the open item of `cell` that spw__completions_after_event_open started
 * on `stream`, recording nothing: join(its arg, add) folds the work in, then the item waits
 * for `ev` instead of the event it waited for. `ev` must have been recorded on `stream` after
 * the new work (the stream runs in order: its completion covers every earlier event of the
 * item) and outlive the item, and it may be recorded again, before the item runs, only after
 * that work has completed. Returns as spw__completions_join (SPW_ERR_NOT_READY: no such open
 * item; join's error: nothing joined, the item unchanged). */
int spw__completions_join_event(spw_completions_t *c, spw_stream_t stream,
                                spw_completion_cell_t *cell, spw_bevent_t *ev,
                                spw_completion_join_fn join, const void *add);
/* The same with fn's argument copied into the item (`size` bytes of `data`; fn gets the
 * copy, which lives until fn returns): one allocation per item instead of two, for the
 * deferred frees that one acquire of a spilled buffer costs. */
int spw__completions_after_event_with(spw_completions_t *c, spw_bevent_t *ev, spw_completion_fn fn,
                                      const void *data, size_t size);
/* A mark of what has been submitted so far, for spw__completions_flush_stream. `cells[0..n)`
 * (n may be 0): the stream's cells, whose open items are sealed in the same hold of the
 * lock, so that no work enqueued after the mark joins an item the flush would run. */
uint64_t spw__completions_mark(spw_completions_t *c, spw_completion_cell_t *cells, size_t n);
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
