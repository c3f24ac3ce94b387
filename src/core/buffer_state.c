/* SPDX-License-Identifier: Apache-2.0 */
/* The buffer state machine (see buffer_state.h): creation, moves (begin, commit, abort,
 * abandon), frees, and the tier byte counters. */
#include "buffer_state.h"

#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "host_extent.h"

typedef struct move_row {
  uint32_t from, transient, to;
} move_row_t;

static const move_row_t moves[SPW_MOVE_KINDS_] = {
    [SPW_MOVE_SPILL] = {SPW_STATE_RESIDENT, SPW_STATE_SPILLING, SPW_STATE_HOST},
    [SPW_MOVE_SPILL_DISK] = {SPW_STATE_RESIDENT, SPW_STATE_SPILLING, SPW_STATE_DISK},
    [SPW_MOVE_UNSPILL] = {SPW_STATE_HOST, SPW_STATE_UNSPILLING, SPW_STATE_RESIDENT},
    [SPW_MOVE_READ] = {SPW_STATE_DISK, SPW_STATE_UNSPILLING, SPW_STATE_RESIDENT},
    [SPW_MOVE_DEMOTE] = {SPW_STATE_HOST, SPW_STATE_DEMOTING, SPW_STATE_DISK},
    [SPW_MOVE_RETURN] = {SPW_STATE_HOST, SPW_STATE_DEMOTING, SPW_STATE_HOST},
};


#ifndef NDEBUG
/* The legal state changes, from row to column (states 0 = unused .. 6); a flag or count
 * change within one state is always legal. Checked on every state change in debug builds:
 * a change not listed is a bug in Spillway, and stops the process at once, where it
 * happened, rather than corrupting a buffer later. */
enum { U = 0, R = SPW_STATE_RESIDENT, S = SPW_STATE_SPILLING, H = SPW_STATE_HOST,
       D = SPW_STATE_DEMOTING, K = SPW_STATE_DISK, N = SPW_STATE_UNSPILLING };
static const unsigned char legal[7][7] = {
    [U] = {[R] = 1},                  /* alloc */
    [R] = {[S] = 1, [U] = 1},         /* spill begins; free */
    [S] = {[H] = 1, [K] = 1, [R] = 1, [U] = 1}, /* commit to host or disk; abandon or abort */
    [H] = {[N] = 1, [D] = 1, [U] = 1},          /* unspill or demote begins; free */
    [D] = {[K] = 1, [H] = 1, [U] = 1},          /* demote commits or aborts */
    [K] = {[N] = 1, [U] = 1},                   /* read back begins; free */
    [N] = {[R] = 1, [H] = 1, [K] = 1, [U] = 1}, /* unspill / read commits or aborts */
};

static void check_change(uint64_t old, uint64_t new_word) {
  uint32_t a = spw__w_state(old), b = spw__w_state(new_word);
  if (a != b && (a > 6 || b > 6 || !legal[a][b])) {
    fprintf(stderr, "spillway: illegal buffer state change %u -> %u (word %#llx -> %#llx)\n", a,
            b, (unsigned long long)old, (unsigned long long)new_word);
    abort();
  }
}
#else
#define check_change(old, new_word) ((void)(old), (void)(new_word))
#endif

/* Stores a new word whose state differs; nobody else may change it meanwhile. */
static void set_word(spw_slot_t *s, uint64_t old, uint64_t new_word) {
  check_change(old, new_word);
  atomic_store_explicit(&s->word, new_word, memory_order_release);
}

/* Applies `set` and `clear` to the word while lock-free releases may change the count. */
static uint64_t update_flags(spw_slot_t *s, uint64_t set, uint64_t clear) {
  uint64_t w = atomic_load(&s->word), n;
  do {
    n = (w | set) & ~clear;
  } while (!atomic_compare_exchange_weak(&s->word, &w, n));
  return n;
}

/* ---- tier counters ------------------------------------------------------------------ */

static _Atomic uint64_t *tier_counter(spw_runtime_t *rt, uint32_t state) {
  switch (state) {
  case SPW_STATE_HOST:
  case SPW_STATE_DEMOTING: return &rt->c.host_bytes;
  case SPW_STATE_DISK: return &rt->c.disk_bytes;
  default: return NULL; /* the device tier is the budget's */
  }
}

/* The tally's member for a counter. */
static uint64_t *tally_of(spw_runtime_t *rt, spw_tally_t *t, _Atomic uint64_t *c) {
  return c == &rt->c.host_bytes ? &t->host : c == &rt->c.disk_bytes ? &t->disk : &t->peer;
}

/* Moves `size` from counter a to counter b (either may be NULL). With a tally, a decrease
 * waits in it for the flush, and an increase of host_bytes comes out of what was prepaid;
 * any other increase is made at once. So a counter never reads below its true value (a
 * buffer committed here and moved on by another thread before the flush cannot take it
 * below zero). */
static void shift(spw_runtime_t *rt, _Atomic uint64_t *a, _Atomic uint64_t *b, uint64_t size,
                  spw_tally_t *t) {
  if (a) {
    if (t) *tally_of(rt, t, a) += size;
    else atomic_fetch_sub_explicit(a, size, memory_order_relaxed);
  }
  if (b) {
    if (t && b == &rt->c.host_bytes && t->host_prepaid >= size) t->host_prepaid -= size;
    else atomic_fetch_add_explicit(b, size, memory_order_relaxed);
  }
}

static void account_t(spw_runtime_t *rt, uint32_t from, uint32_t to, uint64_t size,
                      spw_tally_t *t) {
  _Atomic uint64_t *a = tier_counter(rt, from), *b = tier_counter(rt, to);
  if (a != b) shift(rt, a, b, size, t);
}

static void account(spw_runtime_t *rt, uint32_t from, uint32_t to, uint64_t size) {
  account_t(rt, from, to, size, NULL);
}

void spw__tally_prepay_host(spw_runtime_t *rt, spw_tally_t *t, uint64_t bytes) {
  if (!bytes) return;
  atomic_fetch_add_explicit(&rt->c.host_bytes, bytes, memory_order_relaxed);
  t->host_prepaid += bytes;
}

void spw__tally_flush(spw_runtime_t *rt, spw_tally_t *t) {
  uint64_t host = t->host + t->host_prepaid; /* what was prepaid and not used goes back */
  if (host) atomic_fetch_sub_explicit(&rt->c.host_bytes, host, memory_order_relaxed);
  if (t->disk) atomic_fetch_sub_explicit(&rt->c.disk_bytes, t->disk, memory_order_relaxed);
  if (t->peer) atomic_fetch_sub_explicit(&rt->c.peer_bytes, t->peer, memory_order_relaxed);
  *t = (spw_tally_t){0};
}

/* A HOST buffer whose extent is in lent peer memory counts in peer_bytes, not host_bytes:
 * after account() has counted it by state, `was` and `is` say whether its bytes were and
 * are in peer memory. */
static void account_peer_t(spw_runtime_t *rt, int was, int is, uint64_t size, spw_tally_t *t) {
  if (was == is) return;
  _Atomic uint64_t *from = was ? &rt->c.peer_bytes : &rt->c.host_bytes;
  _Atomic uint64_t *to = was ? &rt->c.host_bytes : &rt->c.peer_bytes;
  shift(rt, from, to, size, t);
}

static void account_peer(spw_runtime_t *rt, int was, int is, uint64_t size) {
  account_peer_t(rt, was, is, size, NULL);
}

static int on_peer(uint32_t state, const spw_host_extent_t *e) {
  return (state == SPW_STATE_HOST || state == SPW_STATE_DEMOTING) && e->ptr && e->peer;
}

/* ---- releasing placements -------------------------------------------------------------- */

uint64_t spw__place_release(spw_runtime_t *rt, spw_place_t *p, size_t size, spw_bevent_t *after) {
  uint64_t device = 0;
  if (p->dptr) {
    spw__device_free(rt, p->dptr, size, after);
    device = size;
  }
  if (p->host.ptr) {
    if (after) spw__host_extent_free_after_event(rt, &p->host, after);
    else spw__host_extent_free(rt, &p->host);
  }
  /* A sweep of freed disk space is the down lane's housekeeping (tidy steps), off this path. */
  if (p->disk.bytes && spw__disk_free(rt->disk, &p->disk)) spw__engine_tidy(rt->engine);
  *p = (spw_place_t){0};
  return device;
}

void spw__slot_drop_clean(spw_runtime_t *rt, spw_slot_t *s, int copy_may_read) {
  if (copy_may_read) spw__host_extent_free_after_event(rt, &s->host, s->ready);
  else spw__host_extent_free(rt, &s->host);
}

/* ---- creation and free ------------------------------------------------------------------ */

int spw__buffer_create(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, unsigned place,
                       uint32_t owner, spw_buf_t *out) {
  void *d = NULL, *va = NULL;
  int st = place == SPW__PLACE_STABLE ? spw__stable_reserve(rt->stable, bytes, &va) : SPW_OK;
  if (st != SPW_OK)
    return spw__set_error(rt, st, "no address range for a stable buffer of %zu bytes: %s", bytes,
                          spw_strerror(st));
  st = place == SPW__PLACE_ARENA ? spw__device_get_arena(rt, bytes, stream, &d)
                                 : spw__device_get(rt, bytes, stream, 0, va, &d);
  if (st != SPW_OK) {
    if (va) spw__stable_unreserve(rt->stable, va);
    return st;
  }
  spw_buf_t h;
  spw_slot_t *s;
  st = spw__handles_alloc(&rt->handles, &h, &s);
  if (st != SPW_OK) {
    spw__device_put(rt, d, bytes, NULL);
    if (va) spw__stable_unreserve(rt->stable, va);
    return st;
  }
  s->size = bytes;
  s->dptr = d;
  atomic_store_explicit(&s->va, va, memory_order_relaxed);
  atomic_store_explicit(&s->last_use, spw__coarse_now_ns(), memory_order_relaxed);
  atomic_store_explicit(&s->owner, (uint8_t)owner, memory_order_relaxed);
  /* Counted before it is published: a free (of a guessed handle) cannot come first. */
  if (owner) spw__owner_created(rt->owners, owner, bytes);
  spw__handles_publish(&rt->handles, h, s, SPW_STATE_RESIDENT);
  *out = h;
  return SPW_OK;
}

void spw__slot_finish_free(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, uint32_t tier_state) {
  uint64_t w = atomic_load(&s->word);
  spw_place_t p = {s->dptr, s->host, s->disk};
  size_t size = s->size;
  s->host = (spw_host_extent_t){0};
  s->disk = (spw_disk_extent_t){0};
  account_peer(rt, on_peer(tier_state, &p.host), 0, size);
  account(rt, tier_state, SPW_SLOT_UNUSED, size);
  check_change(w, spw__w_make(0, SPW_SLOT_UNUSED, 0, 0));
  /* An unspill copy may still be landing in the device memory and reading the host
   * extent: both go back behind it (`ready` stays with the slot, which outlives the wait). */
  spw_bevent_t *after = (w & SPW_W_WAIT) ? s->ready : NULL;
  void *va = spw__slot_va(s);
  uint32_t owner = atomic_load_explicit(&s->owner, memory_order_relaxed);
  if (owner) spw__owner_released(rt->owners, owner, size);
  spw__handles_release(&rt->handles, s, spw__handle_index(h));
  pthread_mutex_unlock(&s->mu);
  uint64_t device = spw__place_release(rt, &p, size, after);
  if (device) spw__budget_credit(rt, device);
  /* After its memory is unmapped; a mover that still holds memory mapped there (an unspill
   * that found the buffer freed) unmaps it later, and the range goes back then. */
  if (va) spw__stable_unreserve(rt->stable, va);
}

int spw__buffer_free(spw_runtime_t *rt, spw_buf_t h, size_t *size) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, h, &s, &w);
  if (st != SPW_OK) return st;
  pthread_mutex_lock(&s->mu);
  w = atomic_load(&s->word);
  if (spw__w_gen(w) != spw__handle_gen(h) || spw__w_state(w) == SPW_SLOT_UNUSED ||
      (w & SPW_W_FREE_PENDING)) {
    pthread_mutex_unlock(&s->mu);
    return SPW_ERR_FREED;
  }
  *size = s->size;
  /* Setting the flag atomically closes the lock-free fast path (it requires no flags), so
   * the count seen here is final unless it is > 0: then the last release finishes the
   * free. A mover (MOVING) finishes it when its move ends. */
  w = update_flags(s, SPW_W_FREE_PENDING, 0);
  spw__handles_unlive(&rt->handles, h);
  if (spw__w_count(w) == 0 && !(w & SPW_W_MOVING))
    spw__slot_finish_free(rt, s, h, spw__w_state(w));
  else
    pthread_mutex_unlock(&s->mu);
  return SPW_OK;
}

/* ---- moves ---------------------------------------------------------------------------- */

int spw__move_begin(spw_runtime_t *rt, spw_move_kind_t kind, spw_buf_t h, spw_slot_t *s,
                    spw_claim_t claim, spw_move_t *m) {
  (void)rt;
  if (claim == SPW_CLAIM_TRY) {
    if (pthread_mutex_trylock(&s->mu) != 0) return 0;
  } else if (claim == SPW_CLAIM_WAIT) {
    pthread_mutex_lock(&s->mu);
  }
  const move_row_t *r = &moves[kind];
  uint64_t w = atomic_load(&s->word);
  int ok = 0;
  /* A CAS, not a store: lock-free acquirers may take a RESIDENT buffer meanwhile. */
  while (spw__w_gen(w) == spw__handle_gen(h) && spw__w_state(w) == r->from &&
         spw__w_count(w) == 0 && !(w & (SPW_W_FREE_PENDING | SPW_W_MOVING))) {
    uint64_t n = spw__w_with_state(w, r->transient) | SPW_W_MOVING;
    check_change(w, n);
    if (atomic_compare_exchange_weak(&s->word, &w, n)) {
      ok = 1;
      break;
    }
  }
  if (ok) {
    *m = (spw_move_t){.kind = kind,
                      .h = h,
                      .s = s,
                      .size = s->size,
                      .seq = s->move_seq,
                      .flags = w & (SPW_W_WAIT | SPW_W_CLEAN),
                      .owner = atomic_load_explicit(&s->owner, memory_order_relaxed),
                      .from = {s->dptr, s->host, s->disk}};
  }
  if (claim != SPW_CLAIM_HELD) pthread_mutex_unlock(&s->mu);
  return ok;
}

int spw__move_wanted(const spw_move_t *m) {
  uint64_t w = atomic_load_explicit(&m->s->word, memory_order_acquire);
  return spw__w_state(w) == moves[m->kind].transient;
}

/* The end of a move that was abandoned or freed meanwhile; SPW_MOVE_DONE when it was
 * neither (mutex still held). Otherwise the mutex is released on return. */
static spw_move_end_t settle(spw_runtime_t *rt, const spw_move_t *m, uint64_t w,
                             const spw_place_t *theirs, spw_place_t *release) {
  spw_slot_t *s = m->s;
  const move_row_t *r = &moves[m->kind];
  if (spw__w_state(w) != r->transient || s->move_seq != m->seq) {
    /* An acquire took it back: it is RESIDENT and still carries our MOVING. */
    if (theirs) *release = *theirs;
    w = update_flags(s, 0, SPW_W_MOVING);
    if ((w & SPW_W_FREE_PENDING) && spw__w_count(w) == 0)
      spw__slot_finish_free(rt, s, m->h, spw__w_state(w));
    else
      pthread_mutex_unlock(&s->mu);
    return SPW_MOVE_ABANDONED;
  }
  if (w & SPW_W_FREE_PENDING) {
    /* Freed during the move (a transient state holds no locks): the free is ours. */
    if (theirs) *release = *theirs;
    spw__slot_finish_free(rt, s, m->h, r->from);
    return SPW_MOVE_FREED;
  }
  return SPW_MOVE_DONE;
}

spw_move_end_t spw__move_commit(spw_runtime_t *rt, const spw_move_t *m, const spw_place_t *to,
                                uint64_t flags, uint32_t locks, spw_place_t *release) {
  return spw__move_commit_tally(rt, m, to, flags, locks, release, NULL);
}

spw_move_end_t spw__move_commit_tally(spw_runtime_t *rt, const spw_move_t *m,
                                      const spw_place_t *to, uint64_t flags, uint32_t locks,
                                      spw_place_t *release, spw_tally_t *tally) {
  spw_slot_t *s = m->s;
  const move_row_t *r = &moves[m->kind];
  *release = (spw_place_t){0};
  pthread_mutex_lock(&s->mu);
  uint64_t w = atomic_load(&s->word);
  spw_move_end_t end = settle(rt, m, w, to, release);
  if (end != SPW_MOVE_DONE) return end;

  spw_place_t old = {s->dptr, s->host, s->disk}, now = {0};
  switch (r->to) {
  case SPW_STATE_RESIDENT:
    now.dptr = to->dptr;
    /* No clean copy is kept in lent peer memory: taking it back then has only HOST
     * buffers to move on. */
    if (old.host.peer) flags &= ~(uint64_t)SPW_W_CLEAN;
    if (flags & SPW_W_CLEAN) now.host = old.host;
    break;
  case SPW_STATE_HOST:
    now.host = to->host.ptr ? to->host : old.host;
    break;
  default: /* DISK */
    now.disk = to->disk;
    break;
  }
  if (old.dptr != now.dptr) release->dptr = old.dptr;
  if (old.host.ptr != now.host.ptr) release->host = old.host;
  if (old.disk.bytes && !(now.disk.bytes && now.disk.off == old.disk.off)) release->disk = old.disk;
  s->dptr = now.dptr;
  s->host = now.host;
  s->disk = now.disk;
  account_t(rt, r->from, r->to, m->size, tally);
  account_peer_t(rt, on_peer(r->from, &old.host), on_peer(r->to, &now.host), m->size, tally);
  if (r->to == SPW_STATE_RESIDENT) /* just brought back for use: the last victim, not the first */
    atomic_store_explicit(&s->last_use, spw__coarse_now_ns(), memory_order_relaxed);
  /* Before the word: an acquirer that sees the new word clears it after this store. */
  atomic_store_explicit(&s->prefetched,
                        r->to == SPW_STATE_RESIDENT && (flags & SPW_COMMIT_PREFETCHED),
                        memory_order_relaxed);
  set_word(s, w, spw__w_make(spw__w_gen(w), r->to, flags & (SPW_W_WAIT | SPW_W_CLEAN), locks));
  pthread_mutex_unlock(&s->mu);
  return SPW_MOVE_DONE;
}

spw_move_end_t spw__move_abort(spw_runtime_t *rt, const spw_move_t *m, uint64_t add_flags) {
  spw_slot_t *s = m->s;
  spw_place_t none;
  pthread_mutex_lock(&s->mu);
  uint64_t w = atomic_load(&s->word);
  spw_move_end_t end = settle(rt, m, w, NULL, &none);
  if (end != SPW_MOVE_DONE) return end;
  uint64_t n = spw__w_with_state(w | add_flags, moves[m->kind].from) & ~SPW_W_MOVING;
  set_word(s, w, n);
  pthread_mutex_unlock(&s->mu);
  return SPW_MOVE_BACK;
}

/* Events marking where each of the down lane's streams stands: a spill's copies are on
 * the lane's stream, or on a slice's when the lane cut its request into slices. */
typedef struct down_marks {
  spw_bevent_t *ev[SPW_ENGINE_MAX_SLICES];
  unsigned n;
} down_marks_t;

/* Takes an event for each of the down lane's streams; on failure none is kept. */
static int marks_get(spw_runtime_t *rt, down_marks_t *m) {
  const unsigned n = spw__engine_slices(rt->engine, SPW_LANE_DOWN);
  for (m->n = 0; m->n < n; m->n++) {
    int st = spw__event_get(&rt->events, &m->ev[m->n]);
    if (st != SPW_OK) {
      while (m->n > 0) spw__event_put(&rt->events, m->ev[--m->n]);
      return st;
    }
  }
  return SPW_OK;
}

static int marks_record(spw_runtime_t *rt, down_marks_t *m) {
  int st = SPW_OK;
  for (unsigned i = 0; i < m->n && st == SPW_OK; i++)
    st = rt->ops->event_record(rt->be, m->ev[i],
                               spw__engine_slice_stream(rt->engine, SPW_LANE_DOWN, i));
  return st;
}

/* Makes `stream` wait on the marks, recorded (`recorded` is the status of recording them),
 * and puts their events back. Without them (a failed record or wait), waiting for the down
 * lane's streams here orders just as well. */
static int follow_down(spw_runtime_t *rt, down_marks_t *m, int recorded, spw_stream_t stream) {
  int st = recorded;
  for (unsigned i = 0; i < m->n && st == SPW_OK; i++)
    st = rt->ops->stream_wait_event(rt->be, stream, m->ev[i]);
  if (st != SPW_OK) st = spw__lane_sync(rt, SPW_LANE_DOWN);
  while (m->n > 0) spw__event_put(&rt->events, m->ev[--m->n]);
  return st;
}

int spw__move_abandon(spw_runtime_t *rt, spw_slot_t *s, spw_stream_t stream) {
  down_marks_t m;
  int st = marks_get(rt, &m);
  if (st != SPW_OK) return st;
  uint64_t w = atomic_load(&s->word);
  /* Under the gate: the mover either enqueued its copies before (then the marks follow
   * them, on whichever down stream they went) or will see RESIDENT and enqueue none. */
  pthread_mutex_lock(&rt->d2h_gate);
  s->move_seq++;
  set_word(s, w, spw__w_with_state(w, SPW_STATE_RESIDENT) + 1);
  st = marks_record(rt, &m);
  pthread_mutex_unlock(&rt->d2h_gate);
  st = follow_down(rt, &m, st, stream);
  if (st != SPW_OK) {
    atomic_fetch_sub(&s->word, 1); /* no lock after all: RESIDENT, unlocked, still MOVING */
    return st;
  }
  atomic_fetch_add_explicit(&rt->c.spills_abandoned, 1, memory_order_relaxed);
  return SPW_OK;
}

int spw__move_follow_abandoned(spw_runtime_t *rt, spw_stream_t stream) {
  down_marks_t m;
  int st = marks_get(rt, &m);
  if (st != SPW_OK) return st;
  /* No gate: the mover's copies were enqueued before the abandon, which came before us
   * (the slot mutex orders the two), so the down streams' work so far includes them. */
  return follow_down(rt, &m, marks_record(rt, &m), stream);
}
