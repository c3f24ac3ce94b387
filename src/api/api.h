/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: what the public entry points share. The API layer
 * validates what the application hands in (runtime, handles, streams, sizes, flags) and
 * calls the core; nothing below it sees unchecked input. */
#ifndef SPILLWAY_API_API_H
#define SPILLWAY_API_API_H

#include "runtime.h"

/* The live entry of a stream the application passed, or SPW_ERR_INVALID_STREAM. The table
 * holds only streams of the runtime's device (created by it, or checked when registered), so
 * finding the entry is the whole device check: it costs nothing per call. */
static inline int spw__stream_entry(spw_runtime_t *rt, spw_stream_t s, spw_stream_entry_t **out) {
  spw_stream_entry_t *e = spw__streams_find(&rt->streams, s);
  if (!e) {
    *out = NULL; /* never read: callers stop at the error; the compiler cannot see that */
    return SPW_ERR_INVALID_STREAM;
  }
  *out = e;
  return SPW_OK;
}

/* The prologue of the calls that name a stream and a buffer: the stream's live entry, and
 * the buffer's slot word as found (generation checked; a buffer whose free waits on its
 * locks is still found: the caller decides what FREE_PENDING means for it). */
static inline int spw__stream_and_buffer(spw_runtime_t *rt, spw_stream_t stream, spw_buf_t buf,
                                         spw_stream_entry_t **e, uint64_t *w) {
  int st = spw__stream_entry(rt, stream, e);
  if (st != SPW_OK) return st;
  spw_slot_t *s;
  return spw__handles_lookup(&rt->handles, buf, &s, w);
}

/* spw_release_n_async once its arguments are checked: takes one lock of each of bufs[0..n)
 * out of e's lock map, all or nothing (else SPW_ERR_NOT_LOCKED), and drops them once the
 * work enqueued on the stream so far has completed. `maybe_idle` as for spw__unlock_after.
 * On error the map is as it was. */
int spw__release_n_after(spw_runtime_t *rt, spw_stream_entry_t *e, const spw_buf_t *bufs,
                         size_t n, int maybe_idle);

#endif /* SPILLWAY_API_API_H */
