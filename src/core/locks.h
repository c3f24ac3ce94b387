/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: taking and dropping a buffer's locks (the retrieve part
 * of retrieve-and-lock). Lock maps are the caller's: these only change the count. */
#ifndef SPILLWAY_CORE_LOCKS_H
#define SPILLWAY_CORE_LOCKS_H

#include "runtime.h"

/* Takes one lock on h, bringing it back to the device first if it is not there (ordered
 * before what is enqueued on stream `e` afterwards). `flags`: SPW_ACQUIRE_*. Errors as
 * spw_acquire. */
int spw__lock(spw_runtime_t *rt, spw_buf_t h, spw_stream_entry_t *e, unsigned flags,
              void **dptr);
/* Before n locks are taken one by one: brings the buffers among bufs that are on host back
 * as one batch (one copy for the small ones, in slices), and those on disk as another (many
 * requests in flight), so that the locks then find them on the device. The host batch
 * takes a lock (`flags`) on each buffer it brings back and sets locked[i] (n entries, NULL
 * on entry) to its device pointer: those need no lock call. Does nothing for fewer than two
 * such buffers of a tier, for SPW_ACQUIRE_TRY, and inside a controller callback. A buffer
 * it cannot bring back is left for the lock to report. */
void spw__lock_n_prepare(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n, unsigned flags,
                         void **locked);
/* Drops one lock of h (its lock map entry is gone already). The last lock of a freed
 * buffer finishes its free. */
void spw__unlock(spw_runtime_t *rt, spw_buf_t h);
/* The same, when the lock's stream is known to have completed everything enqueued before
 * the release (it was synchronized, or an event recorded after the release completed). An
 * unspill copy into the buffer came before that point, or the stream waited for it before
 * taking the lock: it has landed, so the buffer loses WAIT, and later locks and spills need
 * not query its `ready` event. */
void spw__unlock_done(spw_runtime_t *rt, spw_buf_t h);
/* Drops one lock of each buffer in `list` (malloc'd; freed here) now; `done` as for
 * spw__unlock_done. */
void spw__unlock_list(spw_runtime_t *rt, spw_buf_t *list, size_t n, int done);
/* Drops one lock of each of bufs[0..n) (out of the stream's lock map already) once the work
 * enqueued on e's stream so far has completed, without blocking; bufs stays the caller's.
 * Releases behind one stream back to back share one completion item and one event, which
 * is recorded again at each: so each release happens once the latest work joined to its
 * item has completed, at most one polling round later than alone (completions.h).
 * `maybe_idle`: the stream may have nothing left to run, so a new item looks first and
 * releases at once if so; 0 where the caller has just enqueued work there (a launch),
 * which the look would never find done. On error nothing is scheduled. */
int spw__unlock_after(spw_runtime_t *rt, spw_stream_entry_t *e, const spw_buf_t *bufs,
                      size_t n, int maybe_idle);

#endif /* SPILLWAY_CORE_LOCKS_H */
