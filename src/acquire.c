/* SPDX-License-Identifier: Apache-2.0 */
/* Retrieve-and-lock: spw_acquire, spw_acquire_n, spw_release and the lock drop shared with
 * the stream paths.
 *
 * The fast path (a RESIDENT buffer with no pending unspill) is lock-free: one CAS on the
 * slot word takes the lock, then the handle is appended to the stream's lock map. Anything
 * else takes the slot mutex: waiting on an unspill copy still in flight, abandoning a spill
 * in progress, bringing the buffer back from host or disk, or waiting out a demotion. */
#include <stdlib.h>
#include <time.h>

#include "../spill/engine.h"
#include "runtime.h"

#define LOCK_COUNT_MAX 0x7FFFFFFFu
#define ACQUIRE_FLAGS (SPW_ACQUIRE_READ | SPW_ACQUIRE_TRY)

/* The fast path takes a lock only on a RESIDENT buffer without flags, or with just CLEAN
 * for a read-only acquire (the clean host copy stays valid). */
static inline int fast_ok(uint64_t w, unsigned flags) {
  uint64_t f = w & SPW_W_FLAGS_MASK;
  return spw__w_state(w) == SPW_STATE_RESIDENT && spw__w_count(w) < LOCK_COUNT_MAX &&
         (f == 0 || (f == SPW_W_CLEAN && (flags & SPW_ACQUIRE_READ)));
}

static inline void touch(spw_slot_t *s) {
  /* Coarse clock: LRU needs order at millisecond grain, and the store is skipped when the
   * value would not change, so concurrent acquirers do not bounce the cache line. */
  uint64_t now = spw__coarse_now_ns();
  if (atomic_load_explicit(&s->last_use, memory_order_relaxed) != now)
    atomic_store_explicit(&s->last_use, now, memory_order_relaxed);
}

static void sleep_briefly(void) {
  struct timespec ts = {0, 100000};
  nanosleep(&ts, NULL);
}

/* What a buffer on the device needs before this acquire may use it, slot->mu held: the
 * caller's stream waits for an unspill copy that may still be landing, and a writable
 * acquire drops the clean host copy (it is about to go stale; a later spill that trusted it
 * would lose the writes). Returns the word flags to clear. */
static int prepare_use(spw_runtime_t *rt, spw_slot_t *s, uint64_t w, spw_stream_t bstream,
                       unsigned flags, uint64_t *clear) {
  if (w & SPW_W_WAIT) {
    int q = rt->ops->event_query(rt->be, s->ready);
    if (q == SPW_OK) {
      *clear |= SPW_W_WAIT;
    } else if (q == SPW_ERR_NOT_READY) {
      int st = rt->ops->stream_wait_event(rt->be, bstream, s->ready);
      if (st != SPW_OK) return st;
    } else {
      return q;
    }
  }
  if ((w & SPW_W_CLEAN) && !(flags & SPW_ACQUIRE_READ)) {
    /* While an unspill copy may still read it, it is returned only after the engine's
     * upload stream passes this point; otherwise at once, so the arena has it back for the
     * next spill. */
    if ((w & SPW_W_WAIT) && !(*clear & SPW_W_WAIT))
      spw__host_extent_free_after(rt, &s->host, spw__engine_h2d(rt));
    else
      spw__arena_free(rt->arena, &s->host);
    *clear |= SPW_W_CLEAN;
  }
  return SPW_OK;
}

/* Slow path, slot->mu held on entry and on return. */
static int lock_slow(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, spw_stream_t bstream,
                     unsigned flags, void **dptr, spw_state_event_t *ev, int *retry) {
  uint64_t w = atomic_load(&s->word);
  if (spw__w_gen(w) != spw__handle_gen(h) || spw__w_state(w) == SPW_SLOT_UNUSED ||
      (w & SPW_W_FREE_PENDING))
    return SPW_ERR_FREED;
  switch (spw__w_state(w)) {
  case SPW_STATE_RESIDENT:
  case SPW_STATE_SPILLING: {
    if (spw__w_count(w) >= LOCK_COUNT_MAX) return SPW_ERR_BUSY;
    uint64_t clear = 0;
    int st = prepare_use(rt, s, w, bstream, flags, &clear);
    if (st != SPW_OK) return st;
    if (spw__w_state(w) == SPW_STATE_SPILLING) {
      /* The device copy is intact: cancel the spill instead of waiting for it. The spiller
       * sees the bumped move_seq at commit and throws its host copy away. Nothing but this
       * thread changes a SPILLING word while mu is held (the count is 0, so no fast path). */
      s->move_seq++;
      atomic_store(&s->word, spw__w_with_state(w & ~clear, SPW_STATE_RESIDENT) + 1);
      atomic_fetch_add(&rt->c.spills_abandoned, 1);
    } else {
      /* Fast-path acquirers may race on the count; the state cannot change under mu. */
      uint64_t cur = atomic_load(&s->word);
      while (!atomic_compare_exchange_weak(&s->word, &cur, (cur & ~clear) + 1)) {
      }
    }
    *dptr = s->dptr;
    return SPW_OK;
  }
  case SPW_STATE_HOST:
    if (flags & SPW_ACQUIRE_TRY) return SPW_ERR_NOT_READY; /* moved since the first look */
    return spw__unspill_host(rt, s, h, bstream, flags, 1, dptr, ev);
  case SPW_STATE_DISK:
    if (flags & SPW_ACQUIRE_TRY) return SPW_ERR_NOT_READY;
    return spw__unspill_disk(rt, s, h, bstream, flags, 1, dptr, ev);
  default: /* DEMOTING or UNSPILLING: another thread is moving it; wait for that move */
    if (flags & SPW_ACQUIRE_TRY) return SPW_ERR_NOT_READY;
    *retry = 1;
    return SPW_OK;
  }
}

/* Takes one lock on h; the caller records it in a lock map. */
static int lock_one(spw_runtime_t *rt, spw_buf_t h, spw_stream_t bstream, unsigned flags,
                    void **dptr) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, h, &s, &w);
  if (st != SPW_OK) return st;
  while (fast_ok(w, flags)) {
    if (atomic_compare_exchange_weak_explicit(&s->word, &w, w + 1, memory_order_acq_rel,
                                              memory_order_acquire)) {
      *dptr = s->dptr;
      touch(s);
      return SPW_OK;
    }
    if (spw__w_gen(w) != spw__handle_gen(h)) return SPW_ERR_FREED;
  }
  if (w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  int on_device = spw__w_state(w) == SPW_STATE_RESIDENT || spw__w_state(w) == SPW_STATE_SPILLING;
  if (!on_device && (flags & SPW_ACQUIRE_TRY)) return SPW_ERR_NOT_READY;
  if (!on_device && spw__in_callback(rt))
    return SPW_ERR_WOULD_DEADLOCK; /* bringing it back may need to wait on the engine */

  for (;;) {
    spw_state_event_t ev = {0};
    int retry = 0;
    pthread_mutex_lock(&s->mu);
    st = lock_slow(rt, s, h, bstream, flags, dptr, &ev, &retry);
    pthread_mutex_unlock(&s->mu);
    if (ev.buf) spw__notify_state(rt, &ev);
    if (st != SPW_OK) return st;
    if (!retry) break;
    sleep_briefly();
  }
  touch(s);
  return SPW_OK;
}

void spw__unlock(spw_runtime_t *rt, spw_buf_t h) {
  spw_slot_t *s = spw__handles_slot_at(&rt->handles, spw__handle_index(h));
  uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
  for (;;) {
    if (spw__w_count(w) == 0 || spw__w_gen(w) != spw__handle_gen(h)) return; /* cannot happen */
    if (spw__w_count(w) == 1 && (w & SPW_W_FREE_PENDING)) break; /* last lock of a freed buffer */
    if (atomic_compare_exchange_weak_explicit(&s->word, &w, w - 1, memory_order_acq_rel,
                                              memory_order_acquire))
      return;
  }
  /* Finish the free that spw_free deferred. Under mu: nobody else can lock a freed buffer,
   * and the count can only go down, so the word is stable once we hold it at count 1. */
  pthread_mutex_lock(&s->mu);
  atomic_fetch_sub(&s->word, 1);
  spw__buffer_finish_free(rt, s, h);
}

int spw_acquire(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream, unsigned flags,
                void **dptr) {
  if (!rt || !dptr || (flags & ~ACQUIRE_FLAGS)) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  void *p;
  st = lock_one(rt, buf, e->bstream, flags, &p);
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
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  void *stack_ptrs[16];
  void **ptrs = n <= 16 ? stack_ptrs : malloc(n * sizeof *ptrs);
  if (!ptrs) return SPW_ERR_SYSTEM;
  size_t locked = 0, pushed = 0;
  for (; locked < n; locked++) {
    st = lock_one(rt, bufs[locked], e->bstream, flags, &ptrs[locked]);
    if (st != SPW_OK) break;
  }
  if (st == SPW_OK) {
    for (; pushed < n; pushed++) {
      st = spw__lockmap_push(e, bufs[pushed]);
      if (st != SPW_OK) break;
    }
  }
  if (st != SPW_OK) { /* all or nothing: undo what was taken */
    for (size_t i = 0; i < pushed; i++) spw__lockmap_remove(e, bufs[i]);
    for (size_t i = 0; i < locked; i++) spw__unlock(rt, bufs[i]);
  } else {
    for (size_t i = 0; i < n; i++) dptrs[i] = ptrs[i];
  }
  if (ptrs != stack_ptrs) free(ptrs);
  return st;
}

int spw_release(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_lookup(rt, stream, &e);
  if (st != SPW_OK) return st;
  spw_slot_t *s;
  uint64_t w;
  st = spw__handles_lookup(&rt->handles, buf, &s, &w);
  /* A freed buffer whose free waits on its locks still accepts their release. */
  if (st != SPW_OK) return st;
  if (!spw__lockmap_remove(e, buf)) return SPW_ERR_NOT_LOCKED;
  spw__unlock(rt, buf);
  return SPW_OK;
}
