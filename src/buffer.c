/* SPDX-License-Identifier: Apache-2.0 */
/* Buffers: allocation, free (immediate or deferred to the last lock), and queries.
 *
 * A free never releases memory that running work can still touch: a locked buffer is only
 * marked (FREE_PENDING; its handle is dead from that moment), and the last spw__unlock
 * finishes the job. A buffer in the middle of a move is marked the same way and the mover
 * finishes it at commit. */
#include <stdlib.h>

#include "../spill/disk_tier.h"
#include "../spill/engine.h"
#include "runtime.h"

int spw_alloc(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, spw_buf_t *out) {
  if (!rt || !out || bytes == 0 || (uint64_t)bytes > SPW_MAX_BUFFER_BYTES) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  st = spw__budget_reserve(rt, bytes);
  if (st != SPW_OK) return st;
  void *d = NULL;
  st = spw__device_alloc(rt, bytes, e->bstream, &d);
  if (st != SPW_OK) {
    spw__budget_unreserve(rt, bytes);
    return st;
  }
  spw_buf_t h;
  spw_slot_t *s;
  st = spw__handles_alloc(&rt->handles, &h, &s);
  if (st != SPW_OK) {
    spw__dpool_free(rt, d, bytes, e->bstream);
    spw__budget_unreserve(rt, bytes);
    return st;
  }
  s->size = bytes;
  s->dptr = d;
  atomic_store_explicit(&s->last_use, spw__coarse_now_ns(), memory_order_relaxed);
  spw__handles_publish(s, SPW_STATE_RESIDENT);
  *out = h;
  spw__notify_allocated(rt, h, bytes);
  return SPW_OK;
}

void spw__buffer_finish_free(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h) {
  uint64_t w = atomic_load(&s->word);
  uint32_t state = spw__w_state(w);
  if (s->dptr) {
    /* An unspill copy may still be landing: free behind it on the upload stream. */
    if (w & SPW_W_WAIT) spw__dpool_free_after(rt, s->dptr, s->size, spw__engine_h2d(rt));
    else spw__dpool_free(rt, s->dptr, s->size, spw__engine_d2h(rt));
    spw__budget_unreserve(rt, s->size);
    s->dptr = NULL;
  }
  if (s->host.ptr) {
    if (state == SPW_STATE_HOST || state == SPW_STATE_DEMOTING)
      atomic_fetch_sub(&rt->c.host_bytes, s->size);
    if (w & SPW_W_WAIT) spw__host_extent_free_after(rt, &s->host, spw__engine_h2d(rt));
    else spw__arena_free(rt->arena, &s->host);
  }
  if (s->disk.bytes) {
    atomic_fetch_sub(&rt->c.disk_bytes, s->size);
    spw__disk_free(rt, &s->disk);
  }
  spw__handles_release(&rt->handles, s, spw__handle_index(h));
  pthread_mutex_unlock(&s->mu);
}

int spw_free(spw_runtime_t *rt, spw_buf_t buf) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, buf, &s, &w);
  if (st != SPW_OK) return st;
  pthread_mutex_lock(&s->mu);
  w = atomic_load(&s->word);
  if (spw__w_gen(w) != spw__handle_gen(buf) || spw__w_state(w) == SPW_SLOT_UNUSED ||
      (w & SPW_W_FREE_PENDING)) {
    pthread_mutex_unlock(&s->mu);
    return SPW_ERR_FREED;
  }
  size_t size = s->size;
  uint32_t state = spw__w_state(w);
  int transient = state == SPW_STATE_SPILLING || state == SPW_STATE_DEMOTING ||
                  state == SPW_STATE_UNSPILLING;
  /* Setting the flag atomically closes the lock-free fast path (it requires no flags), so
   * the count seen by this CAS is final unless it is > 0, in which case the last release
   * sees the flag and finishes the free. A mover in a transient state finishes it at
   * commit. */
  uint64_t cur = w;
  while (!atomic_compare_exchange_weak(&s->word, &cur, cur | SPW_W_FREE_PENDING)) {
  }
  if (spw__w_count(cur) == 0 && !transient) spw__buffer_finish_free(rt, s, buf);
  else pthread_mutex_unlock(&s->mu);
  spw__notify_freed(rt, buf, size);
  return SPW_OK;
}

/* Looks up a live (not freed) buffer for a query. */
static int live_word(spw_runtime_t *rt, spw_buf_t buf, spw_slot_t **s, uint64_t *w) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  int st = spw__handles_lookup(&rt->handles, buf, s, w);
  if (st != SPW_OK) return st;
  return (*w & SPW_W_FREE_PENDING) ? SPW_ERR_FREED : SPW_OK;
}

int spw_buf_size(spw_runtime_t *rt, spw_buf_t buf, size_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (!out) return SPW_ERR_INVALID_ARG;
  *out = s->size;
  return SPW_OK;
}

int spw_buf_state(spw_runtime_t *rt, spw_buf_t buf, spw_state_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (!out) return SPW_ERR_INVALID_ARG;
  *out = (spw_state_t)spw__w_state(w);
  return SPW_OK;
}

int spw_buf_tier(spw_runtime_t *rt, spw_buf_t buf, spw_tier_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (!out) return SPW_ERR_INVALID_ARG;
  switch (spw__w_state(w)) {
  case SPW_STATE_HOST:
  case SPW_STATE_DEMOTING: *out = SPW_TIER_HOST; break;
  case SPW_STATE_DISK: *out = SPW_TIER_DISK; break;
  case SPW_STATE_UNSPILLING: *out = s->host.ptr ? SPW_TIER_HOST : SPW_TIER_DISK; break;
  default: *out = SPW_TIER_DEVICE; break;
  }
  return SPW_OK;
}

int spw_buf_lock_count(spw_runtime_t *rt, spw_buf_t buf, uint32_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (!out) return SPW_ERR_INVALID_ARG;
  *out = spw__w_count(w);
  return SPW_OK;
}
