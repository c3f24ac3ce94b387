/* SPDX-License-Identifier: Apache-2.0 */
/* Streams seen from the application: creation and registration, syncAndUnlock
 * (spw_stream_synchronize), the non-blocking release (spw_stream_release_async), and the
 * two stream-ordered helpers (host functions, copies).
 *
 * A stream is checked for the runtime's device once, when it first enters the stream table
 * (spw_stream_register; a created stream is the backend's own); the table then holds only
 * streams of this device, and a stream not in it is SPW_ERR_INVALID_STREAM (asking CUDA about
 * a handle the runtime does not know could read one the application destroyed).
 *
 * Both release paths detach the stream's lock map first and only then wait: a lock taken on
 * the stream by another thread while we wait belongs to work enqueued after our sync point
 * and must survive it. */
#include <stdlib.h>

#include "api.h"
#include "locks.h"

/* Puts detached locks back in the map; the few that no longer fit are released instead of
 * leaking (a synchronize that failed may then release a lock early: memory had run out). */
static void put_back(spw_runtime_t *rt, spw_stream_entry_t *e, spw_buf_t *list, size_t n) {
  for (size_t i = spw__lockmap_reattach(e, list, n); i < n; i++) spw__unlock(rt, list[i]);
  free(list);
}

/* Synchronizes and releases; shared by synchronize, destroy and unregister. */
static int sync_and_unlock(spw_runtime_t *rt, spw_stream_entry_t *e) {
  spw_buf_t *list;
  size_t n;
  spw__lockmap_detach(e, &list, &n);
  uint64_t mark = spw__completions_mark(rt->completions, e->cells, SPW_STREAM_CELLS);
  int st = rt->ops->stream_sync(rt->be, e->bstream);
  if (st != SPW_OK) {
    /* The work may still be running: keep every lock. */
    put_back(rt, e, list, n);
    return st;
  }
  spw__unlock_list(rt, list, n, 1);
  spw__completions_flush_stream(rt->completions, e->bstream, mark);
  return SPW_OK;
}

static int wrong_device(spw_runtime_t *rt, spw_stream_t s, int device) {
  return spw__set_error(rt, SPW_ERR_WRONG_DEVICE,
                        "stream %p belongs to device %d; this runtime runs on device %d",
                        (void *)s, device, rt->settings.device);
}

/* Refuses a stream of another device before it enters the table. Concurrent first uses of
 * one stream each ask (a read-only query) and agree; the table's insert lock then lets one
 * of them add it. */
static int check_device(spw_runtime_t *rt, spw_stream_t s) {
  int device = -1;
  int st = rt->ops->stream_device(rt->be, s, &device);
  if (st == SPW_ERR_UNSUPPORTED) return SPW_OK; /* CUDA < 12.8 cannot say: taken on trust */
  if (st != SPW_OK) return st;
  return device == rt->settings.device ? SPW_OK : wrong_device(rt, s, device);
}

int spw_stream_create(spw_runtime_t *rt, spw_stream_t *out) {
  if (!rt || !out) return SPW_ERR_INVALID_ARG;
  spw_stream_t s;
  int st = rt->ops->stream_create(rt->be, &s);
  if (st != SPW_OK) return st;
  spw_stream_entry_t *e;
  int existed;
  st = spw__streams_insert(&rt->streams, s, s, 1, &e, &existed);
  if (st != SPW_OK || existed) {
    rt->ops->stream_destroy(rt->be, s);
    return st != SPW_OK ? st : SPW_ERR_INTERNAL;
  }
  *out = s;
  return SPW_OK;
}

int spw_stream_destroy(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  if (!e->owned || stream == NULL) return SPW_ERR_INVALID_STREAM;
  st = sync_and_unlock(rt, e);
  if (st != SPW_OK) return st;
  atomic_store(&e->live, 0);
  return rt->ops->stream_destroy(rt->be, e->bstream);
}

int spw_stream_register(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (rt->kind != SPW_BACKEND_CUDA) return SPW_ERR_UNSUPPORTED;
  if (stream == NULL) return SPW_OK;
  /* Known already: its device was checked when it came in. */
  if (spw__streams_find(&rt->streams, stream)) return SPW_OK;
  int st = check_device(rt, stream);
  if (st != SPW_OK) return st;
  spw_stream_entry_t *e;
  int existed;
  return spw__streams_insert(&rt->streams, stream, stream, 0, &e, &existed);
}

int spw_stream_unregister(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  if (e->owned || stream == NULL) return SPW_ERR_INVALID_STREAM;
  st = sync_and_unlock(rt, e);
  if (st != SPW_OK) return st;
  atomic_store(&e->live, 0);
  return SPW_OK;
}

int spw_stream_synchronize(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  return sync_and_unlock(rt, e);
}

int spw_stream_release_async(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  spw_buf_t *list;
  size_t n;
  spw__lockmap_detach(e, &list, &n);
  if (n == 0) {
    free(list);
    return SPW_OK;
  }
  st = spw__unlock_after(rt, e, list, n, 1);
  if (st != SPW_OK) put_back(rt, e, list, n);
  else free(list);
  return st;
}

int spw_launch_host_func(spw_runtime_t *rt, spw_stream_t stream, void (*fn)(void *), void *arg) {
  if (!rt || !fn) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  return rt->ops->launch_host_func(rt->be, e->bstream, fn, arg);
}

int spw_memcpy_async(spw_runtime_t *rt, void *dst, const void *src, size_t bytes,
                     spw_stream_t stream) {
  if (!rt || !dst || !src || bytes == 0) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  return rt->ops->memcpy_async(rt->be, dst, src, bytes, e->bstream);
}
