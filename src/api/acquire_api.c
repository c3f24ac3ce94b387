/* SPDX-License-Identifier: Apache-2.0 */
/* Retrieve-and-lock: spw_acquire, spw_acquire_n, spw_release, spw_release_n_async. A lock
 * is taken on the buffer (locks.h), then recorded in the stream's lock map; all or nothing. */
#include <stdlib.h>

#include "api.h"
#include "locks.h"

#define ACQUIRE_FLAGS (SPW_ACQUIRE_READ | SPW_ACQUIRE_TRY)

int spw_acquire(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream, unsigned flags,
                void **dptr) {
  if (!rt || !dptr || (flags & ~ACQUIRE_FLAGS)) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  void *p;
  st = spw__lock(rt, buf, e, flags, &p);
  if (st != SPW_OK) return st;
  st = spw__lockmap_push(e, buf);
  if (st != SPW_OK) {
    spw__unlock(rt, buf);
    return st;
  }
  *dptr = p;
  return SPW_OK;
}

int spw_acquire_n(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n, spw_stream_t stream,
                  unsigned flags, void **dptrs) {
  if (!rt || !bufs || !dptrs || n == 0 || (flags & ~ACQUIRE_FLAGS)) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  void *stack_ptrs[16];
  void **ptrs = n <= 16 ? stack_ptrs : malloc(n * sizeof *ptrs);
  if (!ptrs) return SPW_ERR_SYSTEM;
  /* A buffer the batch from host brought back is locked already (ptrs[i] set). */
  for (size_t i = 0; i < n; i++) ptrs[i] = NULL;
  spw__lock_n_prepare(rt, bufs, n, flags, ptrs);
  size_t locked = 0;
  for (; locked < n; locked++) {
    if (ptrs[locked]) continue;
    st = spw__lock(rt, bufs[locked], e, flags, &ptrs[locked]);
    if (st != SPW_OK) break;
  }
  if (st == SPW_OK) st = spw__lockmap_push_n(e, bufs, n);
  if (st != SPW_OK) { /* all or nothing: undo what was taken, the batch's locks included */
    for (size_t i = 0; i < n; i++)
      if (i < locked || (i > locked && ptrs[i])) spw__unlock(rt, bufs[i]);
  } else {
    for (size_t i = 0; i < n; i++) dptrs[i] = ptrs[i];
  }
  if (ptrs != stack_ptrs) free(ptrs);
  return st;
}

int spw_release(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  uint64_t w;
  /* A freed buffer whose free waits on its locks still accepts their release. */
  int st = spw__stream_and_buffer(rt, stream, buf, &e, &w);
  if (st != SPW_OK) return st;
  if (!spw__lockmap_remove(e, buf)) return SPW_ERR_NOT_LOCKED;
  spw__unlock(rt, buf);
  return SPW_OK;
}

int spw_release_n_async(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n,
                        spw_stream_t stream) {
  if (!rt || !bufs || n == 0) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  for (size_t i = 0; i < n; i++) {
    spw_slot_t *s;
    uint64_t w;
    st = spw__handles_lookup(&rt->handles, bufs[i], &s, &w);
    if (st != SPW_OK) return st;
  }
  return spw__release_n_after(rt, e, bufs, n, 1);
}

int spw__release_n_after(spw_runtime_t *rt, spw_stream_entry_t *e, const spw_buf_t *bufs,
                         size_t n, int maybe_idle) {
  /* Out of the lock map first, all or nothing: a later synchronize must not release these
   * locks a second time, and a missing one must leave the map as it was. */
  if (!spw__lockmap_remove_n(e, bufs, n)) return SPW_ERR_NOT_LOCKED;
  int st = spw__unlock_after(rt, e, bufs, n, maybe_idle);
  if (st != SPW_OK)
    for (size_t i = 0; i < n; i++)
      if (spw__lockmap_push(e, bufs[i]) != SPW_OK) spw__unlock(rt, bufs[i]);
  return st;
}
