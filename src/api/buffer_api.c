/* SPDX-License-Identifier: Apache-2.0 */
/* Buffers: allocation, free and queries. A free never releases memory that running work can
 * still touch: a locked buffer is only marked, and the last lock's release finishes the
 * job (buffer_state.h). */
#include "api.h"
#include "buffer_state.h"
#include "controller.h"

#define ALLOC_FLAGS (SPW_ALLOC_STABLE | SPW_ALLOC_MOVABLE | SPW_ALLOC_ARENA)
#define PLACEMENT (SPW_ALLOC_STABLE | SPW_ALLOC_MOVABLE)

/* The owner bits must not overlap the flags, and must hold every id up to SPW_OWNER_MAX. */
_Static_assert((SPW_ALLOC_OWNER_MASK & ALLOC_FLAGS) == 0, "owner bits overlap a flag");
_Static_assert(SPW_ALLOC_OWNER(SPW_OWNER_MAX) == SPW_ALLOC_OWNER_MASK, "owner bits too narrow");

int spw_alloc_ex(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, unsigned flags,
                 spw_buf_t *out) {
  if (!rt || !out || bytes == 0 || (uint64_t)bytes > SPW_MAX_BUFFER_BYTES ||
      (flags & ~(ALLOC_FLAGS | SPW_ALLOC_OWNER_MASK)) || (flags & PLACEMENT) == PLACEMENT ||
      ((flags & SPW_ALLOC_ARENA) && (flags & SPW_ALLOC_STABLE)))
    return SPW_ERR_INVALID_ARG;
  uint32_t owner = (flags & SPW_ALLOC_OWNER_MASK) >> SPW_ALLOC_OWNER_SHIFT;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  /* An arena buffer is an ordinary one, whatever the runtime's stable_addresses. */
  unsigned place = (flags & SPW_ALLOC_STABLE) || (!(flags & (SPW_ALLOC_MOVABLE | SPW_ALLOC_ARENA)) &&
                                                  rt->settings.stable_addresses)
                       ? SPW__PLACE_STABLE
                       : (flags & SPW_ALLOC_ARENA) ? SPW__PLACE_ARENA : 0;
  spw_buf_t h;
  st = spw__buffer_create(rt, bytes, e->bstream, place, owner, &h);
  if (st != SPW_OK) return st;
  *out = h;
  spw__controller_allocated(rt, h, bytes);
  return SPW_OK;
}

int spw_alloc(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, spw_buf_t *out) {
  return spw_alloc_ex(rt, bytes, stream, 0, out);
}

int spw_buf_is_stable(spw_runtime_t *rt, spw_buf_t buf, int *out) {
  if (!rt || !out) return SPW_ERR_INVALID_ARG;
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  *out = spw__slot_va(s) != NULL;
  return SPW_OK;
}

int spw_stable_granularity(spw_runtime_t *rt, size_t *out) {
  if (!rt || !out) return SPW_ERR_INVALID_ARG;
  return spw__stable_granularity(rt->stable, out);
}

int spw_free(spw_runtime_t *rt, spw_buf_t buf) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  size_t size = 0;
  int st = spw__buffer_free(rt, buf, &size);
  if (st == SPW_OK) spw__controller_freed(rt, buf, size);
  return st;
}

/* Looks up a live (not freed) buffer for a query. */
static int live_word(spw_runtime_t *rt, spw_buf_t buf, void *out, spw_slot_t **s, uint64_t *w) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  int st = spw__handles_lookup(&rt->handles, buf, s, w);
  if (st != SPW_OK) return st;
  if (*w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  return out ? SPW_OK : SPW_ERR_INVALID_ARG;
}

int spw_buf_size(spw_runtime_t *rt, spw_buf_t buf, size_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, out, &s, &w);
  if (st == SPW_OK) *out = atomic_load_explicit(&s->size, memory_order_relaxed);
  return st;
}

/* Whether the buffer's host placement is in lent peer memory; the slot mutex makes it a
 * consistent read (a mover changes the placement only under it, at its commit). Without a
 * peer tier no buffer is there (peer_on is set before the first spill to it and cleared
 * after the last buffer left), and the query costs no lock. */
static int in_peer_memory(spw_runtime_t *rt, spw_slot_t *s) {
  if (!atomic_load_explicit(&rt->peer_on, memory_order_acquire)) return 0;
  pthread_mutex_lock(&s->mu);
  int peer = s->host.ptr && s->host.peer;
  pthread_mutex_unlock(&s->mu);
  return peer;
}

int spw_buf_state(spw_runtime_t *rt, spw_buf_t buf, spw_state_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, out, &s, &w);
  if (st != SPW_OK) return st;
  *out = (spw_state_t)spw__w_state(w);
  if (*out == SPW_STATE_HOST && in_peer_memory(rt, s)) *out = SPW_STATE_PEER;
  return SPW_OK;
}

int spw_buf_tier(spw_runtime_t *rt, spw_buf_t buf, spw_tier_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, out, &s, &w);
  if (st != SPW_OK) return st;
  switch (spw__w_state(w)) {
  case SPW_STATE_HOST:
  case SPW_STATE_DEMOTING: *out = in_peer_memory(rt, s) ? SPW_TIER_PEER : SPW_TIER_HOST; break;
  case SPW_STATE_DISK: *out = SPW_TIER_DISK; break;
  case SPW_STATE_UNSPILLING: {
    /* Where it comes from: the slot mutex makes the placement a consistent read. */
    pthread_mutex_lock(&s->mu);
    *out = !s->host.ptr ? SPW_TIER_DISK : s->host.peer ? SPW_TIER_PEER : SPW_TIER_HOST;
    pthread_mutex_unlock(&s->mu);
    break;
  }
  default: *out = SPW_TIER_DEVICE; break;
  }
  return SPW_OK;
}

int spw_buf_lock_count(spw_runtime_t *rt, spw_buf_t buf, uint32_t *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, out, &s, &w);
  if (st == SPW_OK) *out = spw__w_count(w);
  return st;
}

int spw_buf_owner(spw_runtime_t *rt, spw_buf_t buf, unsigned *out) {
  spw_slot_t *s;
  uint64_t w;
  int st = live_word(rt, buf, out, &s, &w);
  if (st == SPW_OK) *out = atomic_load_explicit(&s->owner, memory_order_relaxed);
  return st;
}
