/* SPDX-License-Identifier: Apache-2.0 */
/* Streams seen from the application: creation and registration, syncAndUnlock
 * (spw_stream_synchronize), the non-blocking release (spw_stream_release_async), and the
 * two stream-ordered helpers (host functions, copies).
 *
 * Both release paths detach the stream's lock map first and only then wait: a lock taken on
 * the stream by another thread while we wait belongs to work enqueued after our sync point
 * and must survive it. */
#include <stdlib.h>

#include "completions.h"
#include "runtime.h"

int spw__stream_lookup(spw_runtime_t *rt, spw_stream_t s, spw_stream_entry_t **out) {
  spw_stream_entry_t *e = spw__streams_find(&rt->streams, s);
  if (!e) return SPW_ERR_INVALID_STREAM;
  *out = e;
  return SPW_OK;
}

static void unlock_all(spw_runtime_t *rt, spw_buf_t *list, size_t n) {
  for (size_t i = 0; i < n; i++) spw__unlock(rt, list[i]);
  free(list);
}

/* Synchronizes and releases; shared by synchronize, destroy and unregister. */
static int sync_and_unlock(spw_runtime_t *rt, spw_stream_entry_t *e) {
  spw_buf_t *list;
  size_t n;
  spw__lockmap_detach(e, &list, &n);
  int st = rt->ops->stream_sync(rt->be, e->bstream);
  if (st != SPW_OK) {
    /* The work may still be running: keep every lock. */
    if (spw__lockmap_reattach(e, list, n) != SPW_OK) unlock_all(rt, list, n);
    return st;
  }
  unlock_all(rt, list, n);
  spw__completions_flush_stream(rt, e->bstream);
  return SPW_OK;
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
  int st = spw__stream_lookup(rt, stream, &e);
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
  spw_stream_entry_t *e;
  int existed;
  return spw__streams_insert(&rt->streams, stream, stream, 0, &e, &existed);
}

int spw_stream_unregister(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
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
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  return sync_and_unlock(rt, e);
}

typedef struct release_job {
  spw_buf_t *list;
  size_t n;
} release_job_t;

static void release_job_run(spw_runtime_t *rt, void *arg) {
  release_job_t *j = arg;
  unlock_all(rt, j->list, j->n);
  free(j);
}

int spw_stream_release_async(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  release_job_t *j = malloc(sizeof *j);
  if (!j) return SPW_ERR_SYSTEM;
  spw__lockmap_detach(e, &j->list, &j->n);
  if (j->n == 0) {
    free(j->list);
    free(j);
    return SPW_OK;
  }
  st = spw__after_stream(rt, e->bstream, release_job_run, j);
  if (st != SPW_OK) {
    if (spw__lockmap_reattach(e, j->list, j->n) != SPW_OK) unlock_all(rt, j->list, j->n);
    free(j);
  }
  return st;
}

int spw_release_n_async(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n,
                        spw_stream_t stream) {
  if (!rt || !bufs || n == 0) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  for (size_t i = 0; i < n; i++) {
    spw_slot_t *s;
    uint64_t w;
    st = spw__handles_lookup(&rt->handles, bufs[i], &s, &w);
    if (st != SPW_OK) return st;
  }
  release_job_t *j = malloc(sizeof *j);
  spw_buf_t *list = malloc(n * sizeof *list);
  if (!j || !list) {
    free(j);
    free(list);
    return SPW_ERR_SYSTEM;
  }
  /* Out of the lock map first, all or nothing: a later synchronize must not release these
   * locks a second time, and a missing one must leave the map as it was. */
  size_t removed = 0;
  for (; removed < n; removed++) {
    if (!spw__lockmap_remove(e, bufs[removed])) break;
    list[removed] = bufs[removed];
  }
  st = removed == n ? SPW_OK : SPW_ERR_NOT_LOCKED;
  if (st == SPW_OK) {
    j->list = list;
    j->n = n;
    st = spw__after_stream(rt, e->bstream, release_job_run, j);
  }
  if (st != SPW_OK) {
    for (size_t i = 0; i < removed; i++)
      if (spw__lockmap_push(e, list[i]) != SPW_OK) spw__unlock(rt, list[i]);
    free(list);
    free(j);
  }
  return st;
}

int spw_launch_host_func(spw_runtime_t *rt, spw_stream_t stream, void (*fn)(void *), void *arg) {
  if (!rt || !fn) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  return rt->ops->launch_host_func(rt->be, e->bstream, fn, arg);
}

int spw_memcpy_async(spw_runtime_t *rt, void *dst, const void *src, size_t bytes,
                     spw_stream_t stream) {
  if (!rt || !dst || !src || bytes == 0) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  return rt->ops->memcpy_async(rt->be, dst, src, bytes, e->bstream);
}
