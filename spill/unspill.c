/* SPDX-License-Identifier: Apache-2.0 */
/* The unspill moves: host -> device (stream-ordered, the caller's host thread does not wait
 * for the copy) and disk -> device (the calling thread waits for the read only).
 *
 * From host: device memory is allocated on the engine's upload stream, the copy enqueued
 * there, the slot's `ready` event recorded after it, and the caller's stream made to wait on
 * it. The slot is RESIDENT at once with the WAIT flag: later acquirers on other streams wait
 * on `ready` too until it has been seen complete. The host copy is kept as a clean copy for
 * read-only acquires, else returned once the upload stream has passed the copy. */
#include "disk_tier.h"
#include "engine.h"

int spw__unspill_host(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, spw_stream_t bstream,
                      unsigned flags, uint32_t lock, void **dptr, spw_state_event_t *ev) {
  uint64_t t0 = spw__now_ns();
  size_t size = s->size;
  spw_stream_t h2d = spw__engine_h2d(rt);
  int st = spw__budget_reserve(rt, size);
  if (st != SPW_OK) return st;
  void *d = NULL;
  st = spw__device_alloc(rt, size, h2d, &d);
  if (st != SPW_OK) {
    spw__budget_unreserve(rt, size);
    return st;
  }
  spw_copy_desc_t desc = {d, s->host.ptr, size};
  st = rt->ops->copy_batch_async(rt->be, &desc, 1, SPW_COPY_H2D, h2d);
  if (st == SPW_OK && !s->ready) st = rt->ops->event_create(rt->be, &s->ready);
  if (st == SPW_OK) st = rt->ops->event_record(rt->be, s->ready, h2d);
  if (st == SPW_OK && bstream != h2d) st = rt->ops->stream_wait_event(rt->be, bstream, s->ready);
  if (st != SPW_OK) {
    rt->ops->free_async(rt->be, d, h2d);
    spw__budget_unreserve(rt, size);
    atomic_fetch_add(&rt->c.failures, 1);
    return st;
  }
  s->dptr = d;
  uint64_t keep = (flags & SPW_ACQUIRE_READ) ? SPW_W_CLEAN : 0;
  if (!keep) spw__host_extent_free_after(rt, &s->host, h2d);
  atomic_fetch_sub(&rt->c.host_bytes, size);
  uint64_t w = atomic_load(&s->word);
  atomic_store(&s->word, spw__w_make(spw__w_gen(w), SPW_STATE_RESIDENT, SPW_W_WAIT | keep, lock));
  uint64_t dt = spw__now_ns() - t0;
  atomic_fetch_add(&rt->c.unspills, 1);
  atomic_fetch_add(&rt->c.unspill_bytes, size);
  atomic_fetch_add(&rt->c.unspill_ns, dt);
  *dptr = d;
  *ev = (spw_state_event_t){h, SPW_STATE_HOST, SPW_STATE_RESIDENT, size, dt, SPW_OK};
  return SPW_OK;
}

int spw__unspill_disk(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, spw_stream_t bstream,
                      unsigned flags, uint32_t lock, void **dptr, spw_state_event_t *ev) {
  uint64_t t0 = spw__now_ns();
  size_t size = s->size;
  spw_stream_t h2d = spw__engine_h2d(rt);
  int st = spw__budget_reserve(rt, size);
  if (st != SPW_OK) return st;
  void *d = NULL;
  st = spw__device_alloc(rt, size, h2d, &d);
  if (st != SPW_OK) {
    spw__budget_unreserve(rt, size);
    return st;
  }
  uint64_t w = atomic_load(&s->word);
  atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_UNSPILLING));
  spw_disk_extent_t src = s->disk;
  pthread_mutex_unlock(&s->mu);

  /* The read blocks this thread only; other threads acquiring this buffer wait for the
   * UNSPILLING state to end, the rest of the runtime carries on. */
  st = spw__disk_read_device(rt, &src, d, size);

  pthread_mutex_lock(&s->mu);
  w = atomic_load(&s->word);
  if (w & SPW_W_FREE_PENDING) {
    rt->ops->free_async(rt->be, d, h2d);
    spw__budget_unreserve(rt, size);
    spw__buffer_finish_free(rt, s, h); /* unlocks */
    pthread_mutex_lock(&s->mu);        /* the caller unlocks; the slot mutex outlives it */
    return SPW_ERR_FREED;
  }
  if (st != SPW_OK) {
    atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_DISK));
    rt->ops->free_async(rt->be, d, h2d);
    spw__budget_unreserve(rt, size);
    atomic_fetch_add(&rt->c.failures, 1);
    return st;
  }
  spw__disk_free(rt, &s->disk);
  atomic_fetch_sub(&rt->c.disk_bytes, size);
  s->dptr = d;
  /* The data is on the device already (the read waited for its copies), so no WAIT. */
  atomic_store(&s->word, spw__w_make(spw__w_gen(w), SPW_STATE_RESIDENT, 0, lock));
  uint64_t dt = spw__now_ns() - t0;
  atomic_fetch_add(&rt->c.disk_reads, 1);
  atomic_fetch_add(&rt->c.disk_read_bytes, size);
  atomic_fetch_add(&rt->c.disk_read_ns, dt);
  *dptr = d;
  *ev = (spw_state_event_t){h, SPW_STATE_DISK, SPW_STATE_RESIDENT, size, dt, SPW_OK};
  (void)flags;
  (void)bstream;
  return SPW_OK;
}
