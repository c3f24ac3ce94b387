/* SPDX-License-Identifier: Apache-2.0 */
/* Taking and dropping locks (see locks.h).
 *
 * The fast path (a RESIDENT buffer with no flags, or only CLEAN for a read-only lock) is
 * lock-free: one CAS on the slot word. Anything else takes the slot mutex: waiting on an
 * unspill copy still in flight, dropping a clean host copy, abandoning a spill in progress,
 * bringing the buffer back from host or disk (moves, see moves.h), or waiting out another
 * thread's move of it. */
#include "locks.h"

#include <stdlib.h>
#include <string.h>

#include "buffer_state.h"
#include "clock.h"
#include "grow.h"
#include "moves.h"

#define LOCK_COUNT_MAX 0x7FFFFFFFu

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
  /* A prefetched buffer is consumed by its first acquire: from now on it is an ordinary
   * victim again. */
  if (atomic_load_explicit(&s->prefetched, memory_order_relaxed))
    atomic_store_explicit(&s->prefetched, 0, memory_order_relaxed);
}

/* Makes `stream` wait for an unspill copy that may still be landing in the buffer (slot
 * mutex held). *landing: it may; *clear gets WAIT once the copy is seen complete. */
static int wait_landing(spw_runtime_t *rt, spw_slot_t *s, uint64_t w, spw_stream_t stream,
                        int *landing, uint64_t *clear) {
  *landing = 0;
  if (!(w & SPW_W_WAIT)) return SPW_OK;
  int q = rt->ops->event_query(rt->be, s->ready);
  if (q == SPW_OK) {
    *clear |= SPW_W_WAIT;
    return SPW_OK;
  }
  if (q != SPW_ERR_NOT_READY) return q;
  *landing = 1;
  return rt->ops->stream_wait_event(rt->be, stream, s->ready);
}

static void clear_flags(spw_slot_t *s, uint64_t clear) {
  uint64_t cur = atomic_load(&s->word);
  while (!atomic_compare_exchange_weak(&s->word, &cur, cur & ~clear)) {
  }
}

/* Takes the lock of a buffer on the device, slot mutex held. Nothing changes until every
 * step that can fail has succeeded: the stream's wait for a landing copy, the abandon of a
 * spill in progress. Then a writable lock drops the clean host copy (it is about to go
 * stale; a later spill that trusted it would lose the writes). */
static int lock_on_device(spw_runtime_t *rt, spw_slot_t *s, uint64_t w, spw_stream_t stream,
                          unsigned flags) {
  if (spw__w_count(w) >= LOCK_COUNT_MAX) return SPW_ERR_BUSY;
  uint64_t clear = 0;
  int landing;
  int st = wait_landing(rt, s, w, stream, &landing, &clear);
  if (st != SPW_OK) return st;
  if (spw__w_state(w) == SPW_STATE_SPILLING) {
    /* The device copy is intact: take it back instead of waiting for the spill. */
    st = spw__move_abandon(rt, s, stream);
    if (st != SPW_OK) return st;
  } else {
    /* MOVING on a RESIDENT buffer: an abandoned spill's copies may still be running. */
    if (w & SPW_W_MOVING) st = spw__move_follow_abandoned(rt, stream);
    if (st != SPW_OK) return st;
    atomic_fetch_add(&s->word, 1); /* lock-free acquirers may race on the count */
  }
  if ((w & SPW_W_CLEAN) && !(flags & SPW_ACQUIRE_READ)) {
    spw__slot_drop_clean(rt, s, landing);
    clear |= SPW_W_CLEAN;
  }
  if (clear) clear_flags(s, clear);
  return SPW_OK;
}

typedef enum { TAKEN, MOVE_UNSPILL, MOVE_READ, WAIT_FOR_MOVE } slow_outcome_t;

/* The slow path, slot->mu held on entry and on return: takes the lock of a buffer on the
 * device, or begins the move that brings it back (returned for the caller to run without
 * the mutex), or says another thread's move must end first. */
static int lock_slow(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, spw_stream_t stream,
                     unsigned flags, void **dptr, spw_move_t *m, slow_outcome_t *out) {
  uint64_t w = atomic_load(&s->word);
  if (spw__w_gen(w) != spw__handle_gen(h) || spw__w_state(w) == SPW_SLOT_UNUSED ||
      (w & SPW_W_FREE_PENDING))
    return SPW_ERR_FREED;
  *out = TAKEN;
  switch (spw__w_state(w)) {
  case SPW_STATE_RESIDENT:
  case SPW_STATE_SPILLING: {
    int st = lock_on_device(rt, s, w, stream, flags);
    if (st == SPW_OK) *dptr = s->dptr;
    return st;
  }
  case SPW_STATE_HOST:
  case SPW_STATE_DISK: {
    if (flags & SPW_ACQUIRE_TRY) return SPW_ERR_NOT_READY; /* moved since the first look */
    spw_move_kind_t kind = spw__w_state(w) == SPW_STATE_HOST ? SPW_MOVE_UNSPILL : SPW_MOVE_READ;
    if (!spw__move_begin(rt, kind, h, s, SPW_CLAIM_HELD, m)) {
      *out = WAIT_FOR_MOVE; /* a prefetch or a demotion holds it */
      return SPW_OK;
    }
    *out = kind == SPW_MOVE_UNSPILL ? MOVE_UNSPILL : MOVE_READ;
    return SPW_OK;
  }
  default: /* DEMOTING or UNSPILLING: another thread is moving it */
    if (flags & SPW_ACQUIRE_TRY) return SPW_ERR_NOT_READY;
    *out = WAIT_FOR_MOVE;
    return SPW_OK;
  }
}

int spw__lock(spw_runtime_t *rt, spw_buf_t h, spw_stream_entry_t *e, unsigned flags,
              void **dptr) {
  spw_stream_t stream = e->bstream;
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

  uint64_t t0 = rt->trace ? spw__now_ns() : 0; /* traced if it moves the buffer or waits */
  int waited = 0;
  for (;;) {
    spw_move_t m;
    slow_outcome_t out = TAKEN;
    pthread_mutex_lock(&s->mu);
    st = lock_slow(rt, s, h, stream, flags, dptr, &m, &out);
    pthread_mutex_unlock(&s->mu);
    if (st != SPW_OK) return st;
    if (out == MOVE_UNSPILL)
      st = spw__unspill(rt, &m, stream, &e->cells[SPW_CELL_FREES], flags, 1, dptr);
    else if (out == MOVE_READ) st = spw__read_back(rt, &m, 1, dptr);
    if (out != WAIT_FOR_MOVE) {
      if (st == SPW_OK) touch(s);
      if (t0 && (waited || out != TAKEN))
        spw__trace_lock_wait(rt->trace, h, atomic_load(&s->owner), stream, atomic_load(&s->size),
                             t0, st);
      return st;
    }
    waited = 1;
    spw__sleep_ns(100000); /* the other move ends soon: a demotion or a copy back */
  }
}

void spw__lock_n_prepare(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n, unsigned flags,
                         void **locked) {
  if (n < 2 || (flags & SPW_ACQUIRE_TRY) || spw__in_callback(rt)) return;
  const spw_up_how_t how = {.keep = (flags & SPW_ACQUIRE_READ) != 0, .locked = locked};
  if (spw__slice_count(rt, SPW_LANE_UP, n) > 1) {
    /* Large enough for slices: they look at every buffer themselves, at once, instead of
     * this thread first, one by one, reading words other cores have just written. */
    size_t elsewhere = 0;
    spw__prefetch_sliced(rt, bufs, n, &how, &elsewhere);
    if (elsewhere >= 2) spw__prefetch_from_disk(rt, bufs, n, 0);
    return;
  }
  size_t k = 0, kd = 0;
  for (size_t i = 0; i < n; i++) {
    spw_slot_t *s;
    uint64_t w;
    if (spw__handles_lookup(&rt->handles, bufs[i], &s, &w) != SPW_OK) continue;
    k += spw__w_state(w) == SPW_STATE_HOST;
    kd += spw__w_state(w) == SPW_STATE_DISK;
  }
  /* One at a time costs a copy launch and an event each (and from disk, a request in flight
   * alone): a batch is one copy per part, and many requests in flight. Each batch skips the
   * buffers of the other tiers itself. A writable acquire's batch keeps no clean copy (its
   * lock would drop it), and takes the locks itself. */
  if (k >= 2) spw__prefetch_batch(rt, bufs, n, &how, NULL);
  if (kd >= 2) spw__prefetch_from_disk(rt, bufs, n, 0);
}

static void unlock(spw_runtime_t *rt, spw_buf_t h, int done) {
  spw_slot_t *s = spw__handles_slot_at(&rt->handles, spw__handle_index(h));
  uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
  for (;;) {
    if (spw__w_count(w) == 0 || spw__w_gen(w) != spw__handle_gen(h)) return; /* cannot happen */
    if (spw__w_count(w) == 1 && (w & SPW_W_FREE_PENDING)) break; /* last lock of a freed buffer */
    uint64_t next = w - 1;
    /* WAIT of a resident buffer is the landing of its last unspill, which this lock's
     * completed work followed. (Not while a mover holds the word: it writes the flags.) */
    if (done && (w & SPW_W_WAIT) && !(w & SPW_W_MOVING) &&
        spw__w_state(w) == SPW_STATE_RESIDENT)
      next &= ~SPW_W_WAIT;
    if (atomic_compare_exchange_weak_explicit(&s->word, &w, next, memory_order_acq_rel,
                                              memory_order_acquire))
      return;
  }
  /* Under mu: nobody else can lock a freed buffer and the count only goes down, so the
   * word is stable once we hold it at count 1. A mover that still holds the buffer (an
   * abandoned spill) finishes the free when it lets go. */
  pthread_mutex_lock(&s->mu);
  w = atomic_fetch_sub(&s->word, 1) - 1;
  if (!(w & SPW_W_MOVING)) spw__slot_finish_free(rt, s, h, spw__w_state(w));
  else pthread_mutex_unlock(&s->mu);
}

void spw__unlock(spw_runtime_t *rt, spw_buf_t h) { unlock(rt, h, 0); }

void spw__unlock_done(spw_runtime_t *rt, spw_buf_t h) { unlock(rt, h, 1); }

void spw__unlock_list(spw_runtime_t *rt, spw_buf_t *list, size_t n, int done) {
  for (size_t i = 0; i < n; i++) unlock(rt, list[i], done);
  free(list);
}

/* The locks one completion item drops. Releases behind one stream back to back join the
 * stream's open item (its list grows and its event moves forward), so a launch costs an
 * append and an event record, not an item, an event and three allocations. */
typedef struct unlock_job {
  spw_runtime_t *rt;
  spw_buf_t *list;
  size_t n, cap;
} unlock_job_t;

typedef struct unlock_add {
  const spw_buf_t *bufs;
  size_t n;
} unlock_add_t;

static void unlock_job_run(void *arg, int status) {
  unlock_job_t *j = arg;
  /* A failed stream still releases (the locks must not leak); its error also reaches the
   * application through its own synchronize. */
  if (status != SPW_OK) spw__set_async_error(j->rt, status);
  spw__unlock_list(j->rt, j->list, j->n, status == SPW_OK);
  free(j);
}

/* Under the completion poller's lock: an allocation at most, nothing that waits. */
static int unlock_job_join(void *open_arg, const void *add) {
  unlock_job_t *j = open_arg;
  const unlock_add_t *a = add;
  spw_buf_t *grown = spw__grow(j->list, &j->cap, j->n + a->n, sizeof *grown, 16);
  if (!grown) return SPW_ERR_SYSTEM;
  j->list = grown;
  memcpy(j->list + j->n, a->bufs, a->n * sizeof *a->bufs);
  j->n += a->n;
  return SPW_OK;
}

int spw__unlock_after(spw_runtime_t *rt, spw_stream_entry_t *e, const spw_buf_t *bufs,
                      size_t n, int maybe_idle) {
  unlock_add_t add = {bufs, n};
  int st = spw__completions_join(rt->completions, e->bstream, &e->cells[SPW_CELL_RELEASE],
                                 unlock_job_join, &add);
  if (st != SPW_ERR_NOT_READY) return st;
  unlock_job_t *j = malloc(sizeof *j);
  spw_buf_t *list = malloc((n > 16 ? n : 16) * sizeof *list);
  if (!j || !list) {
    free(j);
    free(list);
    return SPW_ERR_SYSTEM;
  }
  memcpy(list, bufs, n * sizeof *list);
  *j = (unlock_job_t){rt, list, n, n > 16 ? n : 16};
  /* A stream with nothing left to run (a library's free, a release after a synchronize)
   * releases at once: no poller round during which the memory is held. */
  st = spw__completions_after_open(rt->completions, e->bstream, &e->cells[SPW_CELL_RELEASE],
                                   maybe_idle, unlock_job_run, j);
  if (st != SPW_OK) {
    free(list);
    free(j);
  }
  return st;
}
