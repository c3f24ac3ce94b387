/* SPDX-License-Identifier: Apache-2.0 */
/* The unspill moves: host -> device (stream-ordered, the caller's host thread does not wait
 * for the copy) and disk -> device (the calling thread waits for the read only).
 *
 * From host: device memory is allocated on the engine's upload stream, the copy enqueued
 * there, the slot's `ready` event recorded after it, and the caller's stream made to wait on
 * it. The slot is RESIDENT at once with the WAIT flag: later acquirers on other streams wait
 * on `ready` too until it has been seen complete. The host copy is kept as a clean copy for
 * read-only acquires, else returned once the upload stream has passed the copy. */
#include <stdlib.h>

#include "disk_tier.h"
#include "engine.h"

int spw__unspill_host(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, spw_stream_t bstream,
                      unsigned flags, uint32_t lock, void **dptr, spw_state_event_t *ev) {
  uint64_t t0 = spw__now_ns();
  size_t size = s->size;
  spw_stream_t h2d = spw__engine_h2d(rt);
  /* UNSPILLING while room is made: making room spills other buffers and must not run under
   * this slot's mutex (acquirers of this buffer wait for the state to end). */
  uint64_t w = atomic_load(&s->word);
  atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_UNSPILLING));
  const void *src = s->host.ptr;
  pthread_mutex_unlock(&s->mu);

  void *d = NULL;
  int st = spw__budget_reserve(rt, size);
  if (st == SPW_OK) {
    st = spw__device_alloc(rt, size, h2d, &d);
    if (st != SPW_OK) spw__budget_unreserve(rt, size);
  }
  int copied = 0;
  if (st == SPW_OK) {
    spw_copy_desc_t desc = {d, src, size};
    st = rt->ops->copy_batch_async(rt->be, &desc, 1, SPW_COPY_H2D, h2d);
    copied = st == SPW_OK;
    if (st == SPW_OK && !s->ready) st = rt->ops->event_create(rt->be, &s->ready);
    if (st == SPW_OK) st = rt->ops->event_record(rt->be, s->ready, h2d);
    if (st == SPW_OK && bstream != h2d) st = rt->ops->stream_wait_event(rt->be, bstream, s->ready);
  }

  pthread_mutex_lock(&s->mu);
  w = atomic_load(&s->word);
  if (st != SPW_OK || (w & SPW_W_FREE_PENDING)) {
    if (d) {
      spw__dpool_free_after(rt, d, size, h2d);
      spw__budget_unreserve(rt, size);
    }
    /* Back to HOST; WAIT makes a pending free return the host copy only after the upload
     * stream has passed a copy that may still read it. */
    atomic_store(&s->word, spw__w_with_state(w | (copied ? SPW_W_WAIT : 0), SPW_STATE_HOST));
    if (st != SPW_OK) atomic_fetch_add(&rt->c.failures, 1);
    if (w & SPW_W_FREE_PENDING) {
      spw__buffer_finish_free(rt, s, h); /* unlocks */
      pthread_mutex_lock(&s->mu);        /* the caller unlocks; the slot mutex outlives it */
      return SPW_ERR_FREED;
    }
    return st;
  }
  s->dptr = d;
  uint64_t keep = (flags & SPW_ACQUIRE_READ) ? SPW_W_CLEAN : 0;
  if (!keep) spw__host_extent_free_after(rt, &s->host, h2d);
  atomic_fetch_sub(&rt->c.host_bytes, size);
  atomic_store(&s->word, spw__w_make(spw__w_gen(w), SPW_STATE_RESIDENT, SPW_W_WAIT | keep, lock));
  /* Just brought back for use: the most recently used, not the first victim. */
  atomic_store_explicit(&s->last_use, spw__coarse_now_ns(), memory_order_relaxed);
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
  uint64_t w = atomic_load(&s->word);
  atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_UNSPILLING));
  spw_disk_extent_t src = s->disk;
  pthread_mutex_unlock(&s->mu);

  /* Room is made and the read done without this slot's mutex: the read blocks this thread
   * only; other threads acquiring this buffer wait for the UNSPILLING state to end. */
  void *d = NULL;
  int st = spw__budget_reserve(rt, size);
  if (st == SPW_OK) {
    st = spw__device_alloc(rt, size, h2d, &d);
    if (st != SPW_OK) spw__budget_unreserve(rt, size);
  }
  if (st == SPW_OK) st = spw__disk_read_device(rt, &src, d, size);
  if (st != SPW_OK && d) {
    spw__dpool_free(rt, d, size, h2d); /* the read waited for every copy it enqueued */
    spw__budget_unreserve(rt, size);
    d = NULL;
  }
  pthread_mutex_lock(&s->mu);
  w = atomic_load(&s->word);
  if (w & SPW_W_FREE_PENDING) {
    if (d) {
      spw__dpool_free(rt, d, size, h2d);
      spw__budget_unreserve(rt, size);
    }
    atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_DISK));
    spw__buffer_finish_free(rt, s, h); /* unlocks */
    pthread_mutex_lock(&s->mu);        /* the caller unlocks; the slot mutex outlives it */
    return SPW_ERR_FREED;
  }
  if (st != SPW_OK) {
    atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_DISK));
    atomic_fetch_add(&rt->c.failures, 1);
    return st;
  }
  spw__disk_free(rt, &s->disk);
  atomic_fetch_sub(&rt->c.disk_bytes, size);
  s->dptr = d;
  /* The data is on the device already (the read waited for its copies), so no WAIT. */
  atomic_store(&s->word, spw__w_make(spw__w_gen(w), SPW_STATE_RESIDENT, 0, lock));
  atomic_store_explicit(&s->last_use, spw__coarse_now_ns(), memory_order_relaxed);
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

typedef struct up_item {
  spw_buf_t h;
  spw_slot_t *s;
  size_t size;
  void *d;
  int status;
} up_item_t;

/* Takes a HOST buffer into UNSPILLING for the batch; 0 if it is not (any more) on host. */
static int claim_host(spw_buf_t h, up_item_t *it) {
  spw_slot_t *s = it->s;
  pthread_mutex_lock(&s->mu);
  uint64_t w = atomic_load(&s->word);
  int ok = spw__w_gen(w) == spw__handle_gen(h) && !(w & SPW_W_FREE_PENDING) &&
           spw__w_state(w) == SPW_STATE_HOST;
  if (ok) {
    atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_UNSPILLING));
    it->size = s->size;
  }
  pthread_mutex_unlock(&s->mu);
  return ok;
}

/* Prefetch parts: a part's copy starts as soon as its own room is made, and its buffers are
 * marked resident as soon as it lands, while the next part is prepared. Big buffers go one
 * per part (an acquirer of the first waits for it alone); small ones many per part. */
#define UP_PART_ITEMS 2048
#define UP_PART_BYTES ((uint64_t)64 << 20)

typedef struct up_part {
  size_t first, count;
  int status, copied;
  spw_bevent_t *ev;
} up_part_t;

/* Room, memory and descriptors for the items of one part. */
static size_t up_prepare(spw_runtime_t *rt, up_item_t *it, const up_part_t *p,
                         spw_copy_desc_t *descs, spw_stream_t h2d) {
  size_t nd = 0;
  for (size_t i = p->first; i < p->first + p->count; i++) {
    it[i].status = spw__budget_reserve(rt, it[i].size);
    if (it[i].status != SPW_OK) continue;
    it[i].status = spw__device_alloc(rt, it[i].size, h2d, &it[i].d);
    if (it[i].status != SPW_OK) {
      spw__budget_unreserve(rt, it[i].size);
      continue;
    }
    /* The host extent is stable: the slot is UNSPILLING and only this thread moves it. */
    descs[nd++] = (spw_copy_desc_t){it[i].d, it[i].s->host.ptr, it[i].size};
  }
  return nd;
}

/* Waits for one part's copy and commits its items; returns the bytes that moved. */
static uint64_t up_finish(spw_runtime_t *rt, up_item_t *it, up_part_t *p, spw_stream_t h2d,
                          size_t *moved) {
  int st = p->status;
  if (p->ev) {
    if (st == SPW_OK) st = rt->ops->event_sync(rt->be, p->ev);
    spw__event_put(rt, p->ev);
    p->ev = NULL;
  }
  if (st != SPW_OK && p->copied) rt->ops->stream_sync(rt->be, h2d); /* nothing may still read */
  uint64_t moved_bytes = 0;
  for (size_t i = p->first; i < p->first + p->count; i++) {
    spw_slot_t *s = it[i].s;
    if (it[i].status == SPW_OK && st != SPW_OK) it[i].status = st;
    pthread_mutex_lock(&s->mu);
    uint64_t w = atomic_load(&s->word);
    if (it[i].status != SPW_OK || (w & SPW_W_FREE_PENDING)) {
      if (it[i].d) {
        spw__dpool_free(rt, it[i].d, it[i].size, h2d); /* the part has completed or failed */
        spw__budget_unreserve(rt, it[i].size);
        it[i].d = NULL;
      }
      atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_HOST));
      if (w & SPW_W_FREE_PENDING) spw__buffer_finish_free(rt, s, it[i].h); /* unlocks */
      else pthread_mutex_unlock(&s->mu);
      if (it[i].status != SPW_OK) {
        atomic_fetch_add(&rt->c.failures, 1);
        spw__set_async_error(rt, it[i].status);
      }
      continue;
    }
    /* The copy has landed: resident with no WAIT, and the host copy kept as a clean copy. */
    s->dptr = it[i].d;
    atomic_store(&s->word, spw__w_make(spw__w_gen(w), SPW_STATE_RESIDENT, SPW_W_CLEAN, 0));
    atomic_store_explicit(&s->last_use, spw__coarse_now_ns(), memory_order_relaxed);
    pthread_mutex_unlock(&s->mu);
    (*moved)++;
    moved_bytes += it[i].size;
  }
  atomic_fetch_sub(&rt->c.host_bytes, moved_bytes);
  return moved_bytes;
}

size_t spw__unspill_host_batch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n) {
  uint64_t t0 = spw__now_ns();
  spw_stream_t h2d = spw__engine_h2d(rt);
  up_item_t *it = malloc(n * sizeof *it);
  spw_copy_desc_t *descs = malloc((n < UP_PART_ITEMS ? n : UP_PART_ITEMS) * sizeof *descs);
  if (!it || !descs) {
    free(it);
    free(descs);
    return 0;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t w;
    it[k] = (up_item_t){.h = hs[i]};
    if (spw__handles_lookup(&rt->handles, hs[i], &it[k].s, &w) != SPW_OK) continue;
    if (claim_host(hs[i], &it[k])) k++;
  }
  size_t moved = 0;
  uint64_t moved_bytes = 0;
  up_part_t prev = {0}, cur;
  int have_prev = 0;
  for (size_t first = 0; first < k;) {
    size_t last = first;
    uint64_t bytes = 0;
    while (last < k && last - first < UP_PART_ITEMS &&
           (last == first || bytes + it[last].size <= UP_PART_BYTES))
      bytes += it[last++].size;
    cur = (up_part_t){.first = first, .count = last - first, .status = SPW_OK};
    size_t nd = up_prepare(rt, it, &cur, descs, h2d);
    if (nd > 0) {
      cur.status = rt->ops->copy_batch_async(rt->be, descs, nd, SPW_COPY_H2D, h2d);
      cur.copied = cur.status == SPW_OK;
      if (cur.status == SPW_OK) cur.status = spw__event_get(rt, &cur.ev);
      if (cur.status == SPW_OK) cur.status = rt->ops->event_record(rt->be, cur.ev, h2d);
    }
    if (have_prev) moved_bytes += up_finish(rt, it, &prev, h2d, &moved);
    prev = cur;
    have_prev = 1;
    first = last;
  }
  if (have_prev) moved_bytes += up_finish(rt, it, &prev, h2d, &moved);
  free(descs);
  uint64_t dt = spw__now_ns() - t0;
  atomic_fetch_add(&rt->c.unspills, moved);
  atomic_fetch_add(&rt->c.unspill_bytes, moved_bytes);
  atomic_fetch_add(&rt->c.unspill_ns, dt);
  for (size_t i = 0; i < k; i++) {
    if (it[i].status == SPW_OK && it[i].d) {
      spw_state_event_t ev = {it[i].h, SPW_STATE_HOST, SPW_STATE_RESIDENT, it[i].size, dt, SPW_OK};
      spw__notify_state(rt, &ev);
    }
  }
  free(it);
  return moved;
}
