/* SPDX-License-Identifier: Apache-2.0 */
/* One worker thread of spw_stress: draws operations by weight and runs each one against its
 * own buffers with the exact set of statuses the model allows (stress.h), until the stop
 * flag; then it checks every live buffer once more and frees it.
 *
 * Rules the worker follows so that its expectations are exact (they are the rules a correct
 * user follows):
 *  - work on a buffer is enqueued only under a lock, on the stream of that lock;
 *  - before a buffer is used on another stream than the one its last work went to, that
 *    stream is synchronized (the user's cross-stream ordering);
 *  - spw_release is called only after a fence on the stream proved the work done;
 *  - a worker holds at most lock_cap bytes locked (pending releases included), so that by
 *    default the threads together never lock more than the budget less one buffer, and an
 *    out-of-memory status is then never legitimate.
 * Everything else (which buffers, which stream, which release, when to free a buffer that is
 * still locked or being spilled) is random. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stress.h"

/* ---- model bookkeeping --------------------------------------------------------------- */

static unsigned held_total(const mbuf_t *b) {
  unsigned n = 0;
  for (int s = 0; s < STRESS_STREAMS; s++) n += b->held[s];
  return n;
}

static unsigned pending_total(const mbuf_t *b) {
  unsigned n = 0;
  for (int s = 0; s < STRESS_STREAMS; s++) n += b->pending[s];
  return n;
}

/* Counts b in the locked model before an acquire that may take its first lock. */
static void count_lock(worker_t *w, mbuf_t *b) {
  if (b->counted) return;
  stress_locked_add(w->st, b->size);
  b->counted = true;
  w->mine_locked += b->size;
}

/* Once no lock of b can be left, it leaves the locked model. */
static void settle(worker_t *w, mbuf_t *b) {
  if (held_total(b) == 0) b->dptr = NULL;
  if (held_total(b) + pending_total(b) > 0) return;
  b->work = -1; /* the work was done under locks that are all gone */
  if (b->counted) {
    stress_locked_sub(w->st, b->size);
    b->counted = false;
    w->mine_locked -= b->size;
  }
}

static void remember_dead(worker_t *w, spw_buf_t h) { w->dead[w->ndead++ % STRESS_LOCAL_DEAD] = h; }

/* Zombies whose locks are all gone are simply dead. */
static void bury_zombies(worker_t *w) {
  for (size_t i = 0; i < w->nzombies;) {
    mbuf_t *z = &w->zombies[i];
    settle(w, z);
    if (held_total(z) + pending_total(z) == 0) {
      remember_dead(w, z->h);
      w->zombies[i] = w->zombies[--w->nzombies];
    } else {
      i++;
    }
  }
}

static void grow(mbuf_t **a, size_t *cap, size_t need) {
  if (need <= *cap) return;
  size_t n = *cap ? *cap * 2 : 64;
  mbuf_t *p = realloc(*a, n * sizeof *p);
  if (!p) abort();
  *a = p;
  *cap = n;
}

static void publish(worker_t *w, mbuf_t *b) {
  b->pub = -1;
  if (w->npub_free == 0) return;
  b->pub = w->pub_free[--w->npub_free];
  atomic_store(&w->pub[b->pub], b->h);
  if (b->pub >= atomic_load(&w->pub_high)) atomic_store(&w->pub_high, b->pub + 1);
}

static void unpublish(worker_t *w, mbuf_t *b) {
  if (b->pub < 0) return;
  atomic_store(&w->pub[b->pub], SPW_BUF_NULL);
  w->pub_free[w->npub_free++] = b->pub;
  b->pub = -1;
}

static spw_stream_t stream_of(worker_t *w, int s) { return w->streams[s]; }

static int pick_stream(worker_t *w) { return (int)stress_below(&w->rng, (uint64_t)w->nstreams); }

static void note(worker_t *w, int op, int status, int s, unsigned flags, const mbuf_t *b,
                 unsigned n) {
  stress_note(&w->hist, op, status, s, flags, b ? b->h : 0, b ? b->id : 0, b ? b->version : 0,
              b ? b->size : 0, n);
}

/* ---- releases ---------------------------------------------------------------------- */

static void each_buffer(worker_t *w, void (*fn)(worker_t *, mbuf_t *, int), int s) {
  for (size_t i = 0; i < w->nlive; i++) fn(w, &w->live[i], s);
  for (size_t i = 0; i < w->nzombies; i++) fn(w, &w->zombies[i], s);
}

static void synced(worker_t *w, mbuf_t *b, int s) {
  b->held[s] = 0;
  b->pending[s] = 0;
  if (b->work == s) b->work = -1;
  settle(w, b);
}

static void fenced(worker_t *w, mbuf_t *b, int s) {
  (void)w;
  if (b->work == s && held_total(b) == 0 && pending_total(b) == 0) b->work = -1;
}

static void detached(worker_t *w, mbuf_t *b, int s) {
  (void)w;
  b->pending[s] += b->held[s];
  b->held[s] = 0;
  if (held_total(b) == 0) b->dptr = NULL;
}

/* spw_stream_synchronize: every lock of s, held or pending, is gone and its work done. */
static void do_sync(worker_t *w, int s) {
  int rc = spw_stream_synchronize(w->st->rt, stream_of(w, s));
  note(w, OP_SYNC, rc, s, 0, NULL, 0);
  stress_expect(w->st, w, "spw_stream_synchronize", rc, ACC(OK), NULL);
  each_buffer(w, synced, s);
  bury_zombies(w);
  stress_data_check(w, true);
}

static void do_release_async(worker_t *w, int s) {
  int rc = spw_stream_release_async(w->st->rt, stream_of(w, s));
  note(w, OP_RELEASE_ASYNC, rc, s, 0, NULL, 0);
  stress_expect(w->st, w, "spw_stream_release_async", rc, ACC(OK), NULL);
  each_buffer(w, detached, s);
}

/* spw_release_n_async of the given occurrences (each a held lock of stream s). */
static void do_release_n_async(worker_t *w, mbuf_t **bs, size_t n, int s) {
  spw_buf_t hs[STRESS_MAX_N];
  for (size_t i = 0; i < n; i++) hs[i] = bs[i]->h;
  int rc = spw_release_n_async(w->st->rt, hs, n, stream_of(w, s));
  note(w, OP_RELEASE_N_ASYNC, rc, s, 0, bs[0], (unsigned)n);
  stress_expect(w->st, w, "spw_release_n_async", rc, ACC(OK), bs[0]);
  for (size_t i = 0; i < n; i++) {
    bs[i]->held[s]--;
    bs[i]->pending[s]++;
    if (held_total(bs[i]) == 0) bs[i]->dptr = NULL;
  }
}

/* A fence on s, then spw_release of one held lock of b on s. */
static void do_release_one(worker_t *w, mbuf_t *b, int s, bool zombie) {
  stress_data_fence(w, s);
  each_buffer(w, fenced, s);
  stress_data_check(w, false);
  int rc = spw_release(w->st->rt, b->h, stream_of(w, s));
  note(w, OP_RELEASE, rc, s, 0, b, 0);
  stress_expect(w->st, w, zombie ? "spw_release (of a freed, locked buffer)" : "spw_release", rc,
                ACC(OK), b);
  b->held[s]--;
  settle(w, b);
  if (zombie) bury_zombies(w);
}

/* Reads the lock count of a live buffer: it must lie between the locks the owner holds and
 * those plus its pending ones; when it equals the held ones the pending ones have run.
 * `exact`: pending releases are known to have run (after spw_wait_idle). */
static void retire(worker_t *w, mbuf_t *b, bool exact) {
  uint32_t c = 0;
  int rc = spw_buf_lock_count(w->st->rt, b->h, &c);
  note(w, OP_RETIRE, rc, -1, 0, b, c);
  stress_expect(w->st, w, "spw_buf_lock_count", rc, ACC(OK), b);
  unsigned held = held_total(b), pend = pending_total(b);
  if (c < held || c > held + (exact ? 0 : pend))
    stress_fail(w->st, w,
                "spw_buf_lock_count of buf %#llx (id %llu) is %u; the owner holds %u lock(s) and "
                "has %u pending release(s)%s",
                (unsigned long long)b->h, (unsigned long long)b->id, c, held, pend,
                exact ? ", all of which spw_wait_idle must have run" : "");
  if (c == held && pend > 0) {
    memset(b->pending, 0, sizeof b->pending);
    settle(w, b);
  }
}

static void retire_all(worker_t *w, bool exact) {
  for (size_t i = 0; i < w->nlive; i++)
    if (pending_total(&w->live[i]) > 0 || exact) retire(w, &w->live[i], exact);
  if (exact) { /* zombies cannot be queried, but their pending releases have run too */
    for (size_t i = 0; i < w->nzombies; i++)
      memset(w->zombies[i].pending, 0, sizeof w->zombies[i].pending);
    bury_zombies(w);
  }
}

/* Brings the worker back under its lock cap: the pending releases that ran are retired,
 * then the stream with the most locked bytes is synchronized. */
static void make_lock_room(worker_t *w, uint64_t need) {
  retire_all(w, false);
  while (w->mine_locked + need > w->st->o.lock_cap && w->mine_locked > 0) {
    uint64_t per[STRESS_STREAMS] = {0};
    for (size_t i = 0; i < w->nlive; i++)
      for (int s = 0; s < w->nstreams; s++)
        if (w->live[i].held[s] + w->live[i].pending[s]) per[s] += w->live[i].size;
    for (size_t i = 0; i < w->nzombies; i++)
      for (int s = 0; s < w->nstreams; s++)
        if (w->zombies[i].held[s] + w->zombies[i].pending[s]) per[s] += w->zombies[i].size;
    int best = 0;
    for (int s = 1; s < w->nstreams; s++)
      if (per[s] > per[best]) best = s;
    if (per[best] == 0)
      stress_fail(w->st, w, "model: %llu bytes counted as locked, but no buffer holds a lock",
                  (unsigned long long)w->mine_locked);
    do_sync(w, best);
  }
}

/* ---- acquire ----------------------------------------------------------------------- */

/* The user's cross-stream ordering: work on b elsewhere must be done before s uses it. */
static void order_for(worker_t *w, mbuf_t *b, int s) {
  if (b->work >= 0 && b->work != s) do_sync(w, b->work);
}

/* The work of one acquire: a check of the current version, then (writable) a new one. */
static void launch(worker_t *w, mbuf_t *b, int s, bool write) {
  if (b->version > 0) stress_data_verify(w, s, b->dptr, b);
  if (write && b->version < (1u << 24) - 1) {
    b->version++;
    stress_data_write(w, s, b->dptr, b);
  }
  if (b->version > 0) b->work = s;
  w->groups++;
}

/* Acquires live[idx] on s; returns false if the call failed (acceptably). */
static bool acquire_one(worker_t *w, size_t idx, int s, unsigned flags) {
  stress_t *st = w->st;
  mbuf_t *b = &w->live[idx];
  order_for(w, b, s);
  unsigned held_before = held_total(b);
  count_lock(w, b);
  stress_tracker_begin(st, w->tracker_call);
  void *d = NULL;
  int rc = spw_acquire(st->rt, b->h, stream_of(w, s), flags, &d);
  uint64_t peak = stress_tracker_peak(st, w->tracker_call);
  unsigned acc = ACC(OK);
  if (held_before == 0 && !(flags & SPW_ACQUIRE_TRY) && peak > st->o.budget)
    acc |= ACC(ERR_OUT_OF_MEMORY);
  if (held_before == 0 && (flags & SPW_ACQUIRE_TRY)) acc |= ACC(ERR_NOT_READY);
  note(w,
       (flags & SPW_ACQUIRE_TRY)    ? OP_ACQUIRE_TRY
       : (flags & SPW_ACQUIRE_READ) ? OP_ACQUIRE_READ
                                    : OP_ACQUIRE,
       rc, s, flags, b, 0);
  stress_expect(st, w, "spw_acquire", rc, acc, b);
  if (rc != SPW_OK) {
    if (rc == SPW_ERR_OUT_OF_MEMORY) w->oom_accepted++;
    if (rc == SPW_ERR_NOT_READY) w->not_ready++;
    settle(w, b);
    return false;
  }
  if (!d)
    stress_fail(st, w, "spw_acquire of buf %#llx returned SPW_OK and a NULL pointer",
                (unsigned long long)b->h);
  if (held_before > 0 && d != b->dptr)
    stress_fail(st, w, "buf %#llx (id %llu) moved while locked: %p, then %p",
                (unsigned long long)b->h, (unsigned long long)b->id, b->dptr, d);
  b->dptr = d;
  b->held[s]++;
  launch(w, b, s, !(flags & SPW_ACQUIRE_READ));
  return true;
}

/* How a launch group ends: its locks stay, or go in one of the four ways. */
static void end_group(worker_t *w, mbuf_t **bs, size_t n, int s) {
  switch (stress_below(&w->rng, 8)) {
  case 0:
  case 1:
  case 2: do_release_n_async(w, bs, n, s); break;
  case 3: do_release_async(w, s); break;
  case 4: do_sync(w, s); break;
  case 5: do_release_one(w, bs[0], s, false); break;
  default: break; /* held, for a later release */
  }
}

static void op_acquire(worker_t *w, unsigned flags) {
  if (w->nlive == 0) return;
  size_t idx = stress_below(&w->rng, w->nlive);
  int s = pick_stream(w);
  if (!w->live[idx].counted) make_lock_room(w, w->live[idx].size);
  if (!acquire_one(w, idx, s, flags)) return;
  mbuf_t *b = &w->live[idx];
  end_group(w, &b, 1, s);
}

static void op_acquire_n(worker_t *w) {
  stress_t *st = w->st;
  if (w->nlive == 0) return;
  int s = pick_stream(w);
  unsigned flags = stress_below(&w->rng, 4) == 0 ? SPW_ACQUIRE_READ : 0;
  size_t want = 1 + stress_below(&w->rng, STRESS_MAX_N);
  size_t idx[STRESS_MAX_N], n = 0;
  uint64_t new_bytes = 0;
  for (size_t k = 0; k < want; k++) {
    size_t i = (n > 0 && stress_below(&w->rng, 4) == 0) ? idx[stress_below(&w->rng, n)]
                                                        : stress_below(&w->rng, w->nlive);
    bool seen = false;
    for (size_t j = 0; j < n; j++) seen |= idx[j] == i;
    uint64_t extra = (seen || w->live[i].counted) ? 0 : w->live[i].size;
    if (new_bytes + extra > st->o.lock_cap / 2) continue;
    new_bytes += extra;
    idx[n++] = i;
  }
  if (n == 0) return;
  make_lock_room(w, new_bytes);
  for (size_t k = 0; k < n; k++) order_for(w, &w->live[idx[k]], s);
  unsigned held_before[STRESS_MAX_N];
  bool may_need_room = false;
  spw_buf_t hs[STRESS_MAX_N];
  for (size_t k = 0; k < n; k++) {
    mbuf_t *b = &w->live[idx[k]];
    held_before[k] = held_total(b);
    may_need_room |= held_before[k] == 0;
    hs[k] = b->h;
  }
  for (size_t k = 0; k < n; k++) count_lock(w, &w->live[idx[k]]);
  stress_tracker_begin(st, w->tracker_call);
  void *d[STRESS_MAX_N] = {0};
  int rc = spw_acquire_n(st->rt, hs, n, stream_of(w, s), flags, d);
  uint64_t peak = stress_tracker_peak(st, w->tracker_call);
  unsigned acc = ACC(OK);
  if (may_need_room && peak > st->o.budget) acc |= ACC(ERR_OUT_OF_MEMORY);
  note(w, OP_ACQUIRE_N, rc, s, flags, &w->live[idx[0]], (unsigned)n);
  stress_expect(st, w, "spw_acquire_n", rc, acc, &w->live[idx[0]]);
  if (rc != SPW_OK) {
    w->oom_accepted++;
    for (size_t k = 0; k < n; k++) settle(w, &w->live[idx[k]]);
    return;
  }
  mbuf_t *bs[STRESS_MAX_N];
  for (size_t k = 0; k < n; k++) {
    mbuf_t *b = &w->live[idx[k]];
    bs[k] = b;
    if (!d[k]) stress_fail(st, w, "spw_acquire_n returned SPW_OK and a NULL pointer at %zu", k);
    for (size_t j = 0; j < k; j++)
      if (idx[j] == idx[k] && d[j] != d[k])
        stress_fail(st, w, "spw_acquire_n gave buf %#llx twice with two pointers: %p and %p",
                    (unsigned long long)b->h, d[j], d[k]);
    if (held_before[k] > 0 && d[k] != b->dptr)
      stress_fail(st, w, "buf %#llx (id %llu) moved while locked: %p, then %p (acquire_n)",
                  (unsigned long long)b->h, (unsigned long long)b->id, b->dptr, d[k]);
  }
  for (size_t k = 0; k < n; k++) {
    mbuf_t *b = bs[k];
    bool first = true;
    for (size_t j = 0; j < k; j++) first &= idx[j] != idx[k];
    b->dptr = d[k];
    b->held[s]++;
    if (first) launch(w, b, s, !(flags & SPW_ACQUIRE_READ));
  }
  end_group(w, bs, n, s);
}

/* ---- alloc and free ---------------------------------------------------------------- */

static size_t pick_size(worker_t *w) {
  const stress_options_t *o = &w->st->o;
  static const size_t odd[] = {1,     7,     8,     255,        4095,   4096,   4097,       12345,
                               65535, 65536, 65537, 262144 + 3, 524288, 524289, 1048576 - 1};
  uint64_t r = stress_below(&w->rng, 16), size;
  if (r < 4) {
    size = odd[stress_below(&w->rng, sizeof odd / sizeof odd[0])];
  } else {
    /* log-uniform between min and max, page multiples half the time */
    int lo = 0, hi = 0;
    while (((uint64_t)1 << lo) < o->min_buf) lo++;
    while (((uint64_t)1 << hi) < o->max_buf) hi++;
    int b = lo + (int)stress_below(&w->rng, (uint64_t)(hi - lo + 1));
    size = ((uint64_t)1 << b) + stress_below(&w->rng, (uint64_t)1 << b);
    if (r < 10) size = (size + 4095) / 4096 * 4096;
  }
  if (size < o->min_buf) size = o->min_buf;
  if (size > o->max_buf) size = o->max_buf;
  return (size_t)size;
}

static void free_at(worker_t *w, size_t idx, int op) {
  stress_t *st = w->st;
  mbuf_t b = w->live[idx];
  unpublish(w, &b);
  int rc = spw_free(st->rt, b.h);
  note(w, op, rc, -1, 0, &b, held_total(&b) + pending_total(&b));
  stress_expect(st, w, "spw_free", rc, ACC(OK), &b);
  w->live[idx] = w->live[--w->nlive];
  w->live_bytes -= b.size;
  uint64_t k = atomic_fetch_add(&st->dead_next, 1);
  atomic_store(&st->dead[k % STRESS_DEAD], b.h);
  if (held_total(&b) + pending_total(&b) > 0) {
    grow(&w->zombies, &w->zombie_cap, w->nzombies + 1);
    w->zombies[w->nzombies++] = b;
  } else {
    remember_dead(w, b.h);
  }
  spw_state_t state;
  rc = spw_buf_state(st->rt, b.h, &state); /* the handle is dead at once */
  stress_expect(st, w, "spw_buf_state right after spw_free", rc, ACC(ERR_FREED), &b);
}

static void op_free(worker_t *w) {
  if (w->nlive > 0) free_at(w, stress_below(&w->rng, w->nlive), OP_FREE);
}

static void op_alloc(worker_t *w) {
  stress_t *st = w->st;
  size_t size = pick_size(w);
  if (w->live_bytes + size > st->o.live) {
    op_free(w);
    return;
  }
  int s = pick_stream(w);
  /* Unlike an acquire's, an allocation's room is not counted as locked for the others while
   * it is made: the new buffer is unlocked, so the room it takes can be spilled again. */
  stress_tracker_begin(st, w->tracker_call);
  spw_buf_t h = SPW_BUF_NULL;
  int rc = spw_alloc(st->rt, size, stream_of(w, s), &h);
  uint64_t peak = stress_tracker_peak(st, w->tracker_call);
  unsigned acc = ACC(OK) | (peak + size > st->o.budget ? ACC(ERR_OUT_OF_MEMORY) : 0);
  stress_note(&w->hist, OP_ALLOC, rc, s, 0, h, 0, 0, size, 0);
  stress_expect(st, w, "spw_alloc", rc, acc, NULL);
  if (rc != SPW_OK) {
    w->oom_accepted++;
    return;
  }
  if (h == SPW_BUF_NULL) stress_fail(st, w, "spw_alloc returned SPW_OK and handle 0");
  grow(&w->live, &w->live_cap, w->nlive + 1);
  mbuf_t *b = &w->live[w->nlive++];
  *b = (mbuf_t){.h = h, .id = atomic_fetch_add(&st->next_id, 1), .size = size, .work = s};
  w->live_bytes += size;
  publish(w, b);
  if (stress_below(&w->rng, 2) == 0 && !b->counted) {
    make_lock_room(w, size);
    if (acquire_one(w, w->nlive - 1, s, 0)) {
      b = &w->live[w->nlive - 1];
      do_release_n_async(w, &b, 1, s);
    }
  }
}

/* free of a buffer that this thread holds locked (its locks stay on the stream) */
static void op_free_locked(worker_t *w) {
  if (w->nlive == 0) return;
  size_t idx = stress_below(&w->rng, w->nlive);
  int s = pick_stream(w);
  if (!w->live[idx].counted) make_lock_room(w, w->live[idx].size);
  acquire_one(w, idx, s, 0);
  free_at(w, idx, OP_FREE_LOCKED);
}

/* free right after the release was handed to the runtime, before it has run */
static void op_free_pending(worker_t *w) {
  if (w->nlive == 0) return;
  size_t idx = stress_below(&w->rng, w->nlive);
  int s = pick_stream(w);
  if (!w->live[idx].counted) make_lock_room(w, w->live[idx].size);
  if (acquire_one(w, idx, s, 0)) {
    mbuf_t *b = &w->live[idx];
    if (stress_below(&w->rng, 2))
      do_release_n_async(w, &b, 1, s);
    else
      do_release_async(w, s);
  }
  free_at(w, idx, OP_FREE_PENDING);
}

/* free of a buffer whose spill has just been queued (the engine may be moving it) */
static void op_free_spilling(worker_t *w) {
  stress_t *st = w->st;
  if (w->nlive == 0) return;
  size_t idx = stress_below(&w->rng, w->nlive);
  mbuf_t *b = &w->live[idx];
  if (held_total(b) + pending_total(b) == 0) {
    spw_tier_t tier = stress_below(&w->rng, 2) ? SPW_TIER_HOST : SPW_TIER_DISK;
    int rc = spw_spill(st->rt, b->h, tier);
    note(w, tier == SPW_TIER_HOST ? OP_SPILL_HOST : OP_SPILL_DISK, rc, -1, 0, b, 0);
    stress_expect(st, w, "spw_spill (of an unlocked buffer, before its free)", rc, ACC(OK), b);
  }
  free_at(w, idx, OP_FREE_SPILLING);
}

/* ---- explicit moves ---------------------------------------------------------------- */

static void op_spill(worker_t *w, spw_tier_t tier) {
  stress_t *st = w->st;
  if (w->nlive == 0) return;
  mbuf_t *b = &w->live[stress_below(&w->rng, w->nlive)];
  unsigned acc = held_total(b) > 0      ? ACC(ERR_LOCKED)
                 : pending_total(b) > 0 ? ACC(OK) | ACC(ERR_LOCKED)
                                        : ACC(OK);
  int rc = spw_spill(st->rt, b->h, tier);
  note(w, tier == SPW_TIER_HOST ? OP_SPILL_HOST : OP_SPILL_DISK, rc, -1, 0, b, 0);
  stress_expect(st, w, tier == SPW_TIER_HOST ? "spw_spill(HOST)" : "spw_spill(DISK)", rc, acc, b);
  if (rc == SPW_ERR_LOCKED) w->locked_refused++;
}

/* Up to STRESS_MAX_N of the worker's live handles, duplicates allowed. */
static size_t pick_handles(worker_t *w, spw_buf_t *hs, size_t max) {
  size_t n = 1 + stress_below(&w->rng, max);
  for (size_t k = 0; k < n; k++) hs[k] = w->live[stress_below(&w->rng, w->nlive)].h;
  return n;
}

static void op_spill_n(worker_t *w) {
  stress_t *st = w->st;
  if (w->nlive == 0) return;
  spw_buf_t hs[STRESS_MAX_N];
  size_t n = pick_handles(w, hs, STRESS_MAX_N);
  spw_tier_t tier = stress_below(&w->rng, 2) ? SPW_TIER_HOST : SPW_TIER_DISK;
  int rc = spw_spill_n(st->rt, hs, n, tier);
  stress_note(&w->hist, OP_SPILL_N, rc, -1, tier, hs[0], 0, 0, 0, (unsigned)n);
  stress_expect(st, w, "spw_spill_n (locked buffers among them are skipped)", rc, ACC(OK), NULL);
}

static void op_prefetch(worker_t *w) {
  stress_t *st = w->st;
  if (w->nlive == 0) return;
  mbuf_t *b = &w->live[stress_below(&w->rng, w->nlive)];
  int s = pick_stream(w);
  int rc = spw_prefetch(st->rt, b->h, stream_of(w, s));
  note(w, OP_PREFETCH, rc, s, 0, b, 0);
  stress_expect(st, w, "spw_prefetch", rc, ACC(OK), b);
}

static void op_prefetch_n(worker_t *w) {
  stress_t *st = w->st;
  if (w->nlive == 0) return;
  spw_buf_t hs[STRESS_MAX_N];
  size_t n = pick_handles(w, hs, STRESS_MAX_N);
  int s = pick_stream(w);
  int rc = spw_prefetch_n(st->rt, hs, n, stream_of(w, s));
  stress_note(&w->hist, OP_PREFETCH_N, rc, s, 0, hs[0], 0, 0, 0, (unsigned)n);
  stress_expect(st, w, "spw_prefetch_n", rc, ACC(OK), NULL);
}

static void op_wait_idle(worker_t *w, bool idle) {
  stress_t *st = w->st;
  int rc = idle ? spw_wait_idle(st->rt) : spw_async_error(st->rt);
  note(w, idle ? OP_WAIT_IDLE : OP_ASYNC_ERROR, rc, -1, 0, NULL, 0);
  stress_expect_async(st, w, idle ? "spw_wait_idle" : "spw_async_error", rc, w->tracker_async);
  if (rc == SPW_ERR_OUT_OF_MEMORY) w->oom_accepted++;
  stress_tracker_begin(st, w->tracker_async);
  if (idle) retire_all(w, true); /* it ran every pending release */
}

/* ---- queries ----------------------------------------------------------------------- */

static void op_query(worker_t *w) {
  stress_t *st = w->st;
  if (w->nzombies > 0 && stress_below(&w->rng, 4) == 0) {
    mbuf_t *z = &w->zombies[stress_below(&w->rng, w->nzombies)];
    size_t size;
    uint32_t c;
    int rc = spw_buf_size(st->rt, z->h, &size);
    note(w, OP_QUERY, rc, -1, 0, z, 0);
    stress_expect(st, w, "spw_buf_size (freed, still locked)", rc, ACC(ERR_FREED), z);
    rc = spw_buf_lock_count(st->rt, z->h, &c);
    stress_expect(st, w, "spw_buf_lock_count (freed, still locked)", rc, ACC(ERR_FREED), z);
    return;
  }
  if (w->nlive == 0) return;
  mbuf_t *b = &w->live[stress_below(&w->rng, w->nlive)];
  size_t size = 0;
  spw_state_t state = 0;
  spw_tier_t tier = 0;
  int rc = spw_buf_size(st->rt, b->h, &size);
  note(w, OP_QUERY, rc, -1, 0, b, 0);
  stress_expect(st, w, "spw_buf_size", rc, ACC(OK), b);
  if (size != b->size)
    stress_fail(st, w, "spw_buf_size of buf %#llx is %zu, allocated %zu", (unsigned long long)b->h,
                size, b->size);
  rc = spw_buf_state(st->rt, b->h, &state);
  stress_expect(st, w, "spw_buf_state", rc, ACC(OK), b);
  rc = spw_buf_tier(st->rt, b->h, &tier);
  stress_expect(st, w, "spw_buf_tier", rc, ACC(OK), b);
  /* The peer tier's state and tier exist only while a lender may have lent memory. */
  spw_state_t max_state = st->o.peer ? SPW_STATE_PEER : SPW_STATE_UNSPILLING;
  spw_tier_t max_tier = st->o.peer ? SPW_TIER_PEER : SPW_TIER_DISK;
  if (state < SPW_STATE_RESIDENT || state > max_state || tier > max_tier)
    stress_fail(st, w, "buf %#llx: state %d, tier %d out of range", (unsigned long long)b->h,
                (int)state, (int)tier);
  if (state == SPW_STATE_PEER) w->peer_seen++;
  if (held_total(b) > 0 && (state != SPW_STATE_RESIDENT || tier != SPW_TIER_DEVICE))
    stress_fail(st, w, "buf %#llx is locked (held %u) but in state %d, tier %d",
                (unsigned long long)b->h, held_total(b), (int)state, (int)tier);
  retire(w, b, false);
}

static void op_stats(worker_t *w) {
  stress_t *st = w->st;
  spw_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  int rc = spw_get_stats(st->rt, &s);
  note(w, OP_STATS, rc, -1, 0, NULL, 0);
  stress_expect(st, w, "spw_get_stats", rc, ACC(OK), NULL);
  if (s.device_limit != st->o.budget || s.device_bytes > s.device_limit)
    stress_fail(st, w, "spw_get_stats: device %llu bytes of a limit of %llu (budget %llu)",
                (unsigned long long)s.device_bytes, (unsigned long long)s.device_limit,
                (unsigned long long)st->o.budget);
  char line[512];
  rc = spw_stats_summary(st->rt, line, sizeof line);
  stress_expect(st, w, "spw_stats_summary", rc, ACC(OK), NULL);
  uint64_t dl = 0, hl = 0, kl = 1;
  rc = spw_runtime_limits(st->rt, &dl, &hl, &kl);
  stress_expect(st, w, "spw_runtime_limits", rc, ACC(OK), NULL);
  if (dl != st->o.budget || hl != st->o.host_limit || kl != 0)
    stress_fail(st, w, "spw_runtime_limits: %llu / %llu / %llu", (unsigned long long)dl,
                (unsigned long long)hl, (unsigned long long)kl);
}

/* ---- handles that are dead, and bad input ------------------------------------------ */

static void op_dead_handle(worker_t *w) {
  stress_t *st = w->st;
  size_t known = w->ndead < STRESS_LOCAL_DEAD ? w->ndead : STRESS_LOCAL_DEAD;
  bool zombie = w->nzombies > 0 && (known == 0 || stress_below(&w->rng, 2) == 0);
  if (!zombie && known == 0) return;
  mbuf_t zb = {0};
  if (zombie)
    zb = w->zombies[stress_below(&w->rng, w->nzombies)];
  else
    zb.h = w->dead[stress_below(&w->rng, known)];
  spw_buf_t h = zb.h;
  int s = pick_stream(w);
  int rc;
  void *d = NULL;
  switch (stress_below(&w->rng, 7)) {
  case 0:
    rc = spw_acquire(st->rt, h, stream_of(w, s), 0, &d);
    note(w, OP_DEAD_HANDLE, rc, s, 0, &zb, 0);
    stress_expect(st, w, "spw_acquire of a freed handle", rc, ACC(ERR_FREED), &zb);
    break;
  case 1:
    rc = spw_spill(st->rt, h, stress_below(&w->rng, 2) ? SPW_TIER_HOST : SPW_TIER_DISK);
    note(w, OP_DEAD_HANDLE, rc, -1, 1, &zb, 0);
    stress_expect(st, w, "spw_spill of a freed handle", rc, ACC(ERR_FREED), &zb);
    break;
  case 2:
    rc = spw_prefetch(st->rt, h, stream_of(w, s));
    note(w, OP_DEAD_HANDLE, rc, s, 2, &zb, 0);
    stress_expect(st, w, "spw_prefetch of a freed handle", rc, ACC(ERR_FREED), &zb);
    break;
  case 3:
    rc = spw_free(st->rt, h);
    note(w, OP_DEAD_HANDLE, rc, -1, 3, &zb, 0);
    stress_expect(st, w, "spw_free of a freed handle", rc, ACC(ERR_FREED), &zb);
    break;
  case 4:
    if (zombie && zb.held[s] > 0) break;
    /* A freed buffer lingers while it holds locks, or until a move it was in ends: its
     * handle still names it then, and a stream that holds no lock on it gets NOT_LOCKED.
     * Only a buffer with a held lock left is sure to linger. */
    rc = spw_release(st->rt, h, stream_of(w, s));
    note(w, OP_DEAD_HANDLE, rc, s, 4, &zb, 0);
    stress_expect(
        st, w, "spw_release of a freed handle by a stream without a lock on it", rc,
        zombie && held_total(&zb) > 0 ? ACC(ERR_NOT_LOCKED) : ACC(ERR_FREED) | ACC(ERR_NOT_LOCKED),
        &zb);
    break;
  case 5: { /* all or nothing: a dead handle among live ones takes no lock */
    if (w->nlive == 0) break;
    spw_buf_t hs[STRESS_MAX_N];
    size_t n = pick_handles(w, hs, 3);
    size_t at = stress_below(&w->rng, n + 1);
    hs[n] = hs[at];
    hs[at] = h;
    /* The live ones before the dead one may be locked for a moment. */
    uint64_t transient = 0;
    for (size_t i = 0; i < w->nlive; i++)
      for (size_t k = 0; k <= n; k++)
        if (hs[k] == w->live[i].h) {
          transient += w->live[i].size;
          break;
        }
    stress_locked_add(st, transient);
    void *ds[STRESS_MAX_N];
    rc = spw_acquire_n(st->rt, hs, n + 1, stream_of(w, s), 0, ds);
    stress_locked_sub(st, transient);
    note(w, OP_DEAD_HANDLE, rc, s, 5, &zb, (unsigned)n + 1);
    stress_expect(st, w, "spw_acquire_n with a freed handle among live ones", rc, ACC(ERR_FREED),
                  &zb);
    for (size_t i = 0; i < w->nlive; i++)
      if (pending_total(&w->live[i]) == 0) retire(w, &w->live[i], true);
    break;
  }
  default: {
    if (w->nlive == 0) break;
    spw_buf_t hs[STRESS_MAX_N];
    size_t n = pick_handles(w, hs, STRESS_MAX_N - 1);
    hs[n] = h;
    bool spill = stress_below(&w->rng, 2);
    rc = spill ? spw_spill_n(st->rt, hs, n + 1, SPW_TIER_HOST)
               : spw_prefetch_n(st->rt, hs, n + 1, stream_of(w, s));
    note(w, OP_DEAD_HANDLE, rc, s, spill ? 6 : 7, &zb, (unsigned)n + 1);
    stress_expect(st, w,
                  spill ? "spw_spill_n with a freed handle" : "spw_prefetch_n with a freed handle",
                  rc, ACC(ERR_FREED), &zb);
    break;
  }
  }
}

static void op_bad_input(worker_t *w) {
  stress_t *st = w->st;
  spw_buf_t h = SPW_BUF_NULL;
  int s = pick_stream(w);
  int rc;
  switch (stress_below(&w->rng, 6)) {
  case 0:
    rc = spw_alloc(st->rt, 0, stream_of(w, s), &h);
    note(w, OP_BAD_INPUT, rc, s, 0, NULL, 0);
    stress_expect(st, w, "spw_alloc of 0 bytes", rc, ACC(ERR_INVALID_ARG), NULL);
    rc = spw_alloc(st->rt, (size_t)SPW_MAX_BUFFER_BYTES + 1, stream_of(w, s), &h);
    stress_expect(st, w, "spw_alloc above SPW_MAX_BUFFER_BYTES", rc, ACC(ERR_INVALID_ARG), NULL);
    break;
  case 1:
    rc = spw_alloc(st->rt, st->o.budget + 1, stream_of(w, s), &h);
    note(w, OP_BAD_INPUT, rc, s, 1, NULL, 0);
    stress_expect(st, w, "spw_alloc of more than the device limit", rc, ACC(ERR_OUT_OF_MEMORY),
                  NULL);
    break;
  case 2: { /* a release by a stream that holds no lock on the buffer */
    if (w->nlive == 0) break;
    mbuf_t *b = &w->live[stress_below(&w->rng, w->nlive)];
    if (b->held[s] > 0) break;
    rc = spw_release(st->rt, b->h, stream_of(w, s));
    note(w, OP_BAD_INPUT, rc, s, 2, b, 0);
    stress_expect(st, w, "spw_release without a lock on this stream", rc, ACC(ERR_NOT_LOCKED), b);
    break;
  }
  case 3: { /* spw_release_n_async asking one lock more than the stream holds */
    mbuf_t *b = NULL;
    for (size_t i = 0; i < w->nlive && !b; i++)
      if (w->live[i].held[s] > 0 && w->live[i].held[s] < STRESS_MAX_N) b = &w->live[i];
    if (!b) break;
    spw_buf_t hs[STRESS_MAX_N];
    size_t n = b->held[s] + 1u;
    for (size_t k = 0; k < n; k++) hs[k] = b->h;
    rc = spw_release_n_async(st->rt, hs, n, stream_of(w, s));
    note(w, OP_BAD_INPUT, rc, s, 3, b, (unsigned)n);
    stress_expect(st, w, "spw_release_n_async of one lock more than held", rc, ACC(ERR_NOT_LOCKED),
                  b);
    retire(w, b, false); /* nothing changed: the held locks are still counted */
    break;
  }
  case 4: {
    if (w->nlive == 0) break;
    mbuf_t *b = &w->live[stress_below(&w->rng, w->nlive)];
    void *d = NULL;
    rc = spw_acquire(st->rt, b->h, stream_of(w, s), 0x80u, &d);
    note(w, OP_BAD_INPUT, rc, s, 4, b, 0);
    stress_expect(st, w, "spw_acquire with an unknown flag", rc, ACC(ERR_INVALID_ARG), b);
    rc = spw_spill(st->rt, b->h, SPW_TIER_DEVICE);
    stress_expect(st, w, "spw_spill to the DEVICE tier", rc, ACC(ERR_INVALID_ARG), b);
    break;
  }
  default: {
    void *d = NULL;
    spw_buf_t one = w->nlive ? w->live[0].h : SPW_BUF_NULL;
    rc = spw_acquire_n(st->rt, &one, 0, stream_of(w, s), 0, &d);
    note(w, OP_BAD_INPUT, rc, s, 5, NULL, 0);
    stress_expect(st, w, "spw_acquire_n of 0 buffers", rc, ACC(ERR_INVALID_ARG), NULL);
    rc = spw_stream_destroy(st->rt, NULL);
    stress_expect(st, w, "spw_stream_destroy(NULL)", rc, ACC(ERR_INVALID_STREAM), NULL);
    break;
  }
  }
}

/* Host memory reserved ahead (spw_host_reserve) and dropped again, at a size drawn among
 * none, a quarter and half of the host limit, and one byte past it, which is refused and
 * changes nothing. Below the limit the slabs of single big buffers may hold the room. */
static void op_host_reserve(worker_t *w) {
  stress_t *st = w->st;
  const uint64_t lim = st->o.host_limit;
  const uint64_t sizes[4] = {0, lim / 4, lim / 2, lim + 1};
  const uint64_t bytes = sizes[stress_below(&w->rng, 4)];
  int rc = spw_host_reserve(st->rt, bytes);
  note(w, OP_HOST_RESERVE, rc, -1, 0, NULL, 0);
  unsigned acc = ACC(ERR_HOST_OUT_OF_MEMORY);
  if (bytes <= lim) acc |= ACC(OK);
  stress_expect(st, w, "spw_host_reserve", rc, acc, NULL);
}

/* spw_stream_destroy (a synchronize, then the stream is gone) and a fresh stream. */
static void op_stream_recycle(worker_t *w) {
  stress_t *st = w->st;
  int s = pick_stream(w);
  if (s == w->null_stream) return;
  int rc = spw_stream_destroy(st->rt, stream_of(w, s));
  note(w, OP_STREAM_RECYCLE, rc, s, 0, NULL, 0);
  stress_expect(st, w, "spw_stream_destroy", rc, ACC(OK), NULL);
  each_buffer(w, synced, s);
  bury_zombies(w);
  stress_data_check(w, true);
  rc = spw_stream_create(st->rt, &w->streams[s]);
  note(w, OP_STREAM_CREATE, rc, s, 0, NULL, 0);
  stress_expect(st, w, "spw_stream_create", rc, ACC(OK), NULL);
}

/* ---- the loop ---------------------------------------------------------------------- */

static int draw(worker_t *w) {
  const unsigned *wt = w->st->o.weights;
  uint64_t total = 0;
  for (int i = 0; i < OP_NWEIGHTED; i++) total += wt[i];
  uint64_t r = stress_below(&w->rng, total);
  for (int i = 0; i < OP_NWEIGHTED; i++) {
    if (r < wt[i]) return i;
    r -= wt[i];
  }
  return OP_QUERY;
}

enum { OP_FREE_EARLY = OP_COUNT };

static void run_op(worker_t *w, int op) {
  /* The live data stays between 3/4 of --live and --live, so the tiers stay full: below,
   * a free becomes an allocation (above, op_alloc frees instead). */
  bool is_free =
      op == OP_FREE || op == OP_FREE_LOCKED || op == OP_FREE_PENDING || op == OP_FREE_SPILLING;
  if (is_free && w->live_bytes < w->st->o.live / 4 * 3) op = OP_FREE_EARLY;
  switch (op) {
  case OP_ALLOC: op_alloc(w); break;
  case OP_FREE: op_free(w); break;
  case OP_FREE_LOCKED: op_free_locked(w); break;
  case OP_FREE_PENDING: op_free_pending(w); break;
  case OP_FREE_SPILLING: op_free_spilling(w); break;
  case OP_FREE_EARLY: op_alloc(w); break;
  case OP_ACQUIRE: op_acquire(w, 0); break;
  case OP_ACQUIRE_READ: op_acquire(w, SPW_ACQUIRE_READ); break;
  case OP_ACQUIRE_TRY:
    op_acquire(w, SPW_ACQUIRE_TRY | (stress_below(&w->rng, 2) ? SPW_ACQUIRE_READ : 0));
    break;
  case OP_ACQUIRE_N: op_acquire_n(w); break;
  case OP_RELEASE: {
    /* one held lock, of a live buffer or of a freed one */
    size_t n = w->nlive + w->nzombies;
    for (size_t tries = 0; tries < 8 && n > 0; tries++) {
      size_t i = stress_below(&w->rng, n);
      bool zombie = i >= w->nlive;
      mbuf_t *b = zombie ? &w->zombies[i - w->nlive] : &w->live[i];
      int s = pick_stream(w);
      if (b->held[s] == 0) continue;
      do_release_one(w, b, s, zombie);
      break;
    }
    break;
  }
  case OP_SYNC: do_sync(w, pick_stream(w)); break;
  case OP_RELEASE_ASYNC: do_release_async(w, pick_stream(w)); break;
  case OP_RELEASE_N_ASYNC: {
    int s = pick_stream(w);
    mbuf_t *bs[STRESS_MAX_N];
    size_t n = 0;
    size_t total = w->nlive + w->nzombies;
    for (size_t tries = 0; tries < 4 * STRESS_MAX_N && n < STRESS_MAX_N && total > 0; tries++) {
      size_t i = stress_below(&w->rng, total);
      mbuf_t *b = i < w->nlive ? &w->live[i] : &w->zombies[i - w->nlive];
      unsigned taken = 0;
      for (size_t k = 0; k < n; k++) taken += bs[k] == b;
      if (b->held[s] > taken) bs[n++] = b;
    }
    if (n > 0) do_release_n_async(w, bs, n, s);
    break;
  }
  case OP_SPILL_HOST: op_spill(w, SPW_TIER_HOST); break;
  case OP_SPILL_DISK: op_spill(w, SPW_TIER_DISK); break;
  case OP_SPILL_N: op_spill_n(w); break;
  case OP_PREFETCH: op_prefetch(w); break;
  case OP_PREFETCH_N: op_prefetch_n(w); break;
  case OP_WAIT_IDLE: op_wait_idle(w, true); break;
  case OP_ASYNC_ERROR: op_wait_idle(w, false); break;
  case OP_QUERY: op_query(w); break;
  case OP_STATS: op_stats(w); break;
  case OP_CONTROLLER: {
    int kind = (int)stress_below(&w->rng, 3);
    stress_controller_set(w->st, w, kind);
    break;
  }
  case OP_DEAD_HANDLE: op_dead_handle(w); break;
  case OP_BAD_INPUT: op_bad_input(w); break;
  case OP_STREAM_RECYCLE: op_stream_recycle(w); break;
  case OP_HOST_RESERVE: op_host_reserve(w); break;
  default: break;
  }
}

/* The end of the run: every lock released, every buffer checked once more, then freed. */
static void finish(worker_t *w) {
  stress_t *st = w->st;
  atomic_store(&w->phase, 1);
  for (int s = 0; s < w->nstreams; s++) do_sync(w, s);
  size_t since_sync = 0;
  for (size_t i = 0; i < w->nlive; i++) {
    atomic_fetch_add(&w->heartbeat, 1);
    if (w->live[i].version == 0) continue;
    make_lock_room(w, w->live[i].size);
    /* Other workers may still be running their last operations: out of memory is accepted
     * under the same rule as always, and the check is tried again. */
    for (int tries = 0; !acquire_one(w, i, 0, SPW_ACQUIRE_READ); tries++) {
      if (tries > 1000)
        stress_fail(st, w, "the final check of buf %#llx never got a lock",
                    (unsigned long long)w->live[i].h);
      do_sync(w, 0);
      nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    if (++since_sync == 8) {
      do_sync(w, 0);
      since_sync = 0;
    }
  }
  for (int s = 0; s < w->nstreams; s++) do_sync(w, s);
  stress_data_check(w, true);
  if (w->nzombies > 0)
    stress_fail(st, w, "%zu freed buffers still hold locks after every stream was synchronized",
                w->nzombies);
  /* The main thread times spw_wait_idle with every buffer still alive, then lets go. */
  atomic_store(&w->phase, 2);
  while (!atomic_load(&st->may_free)) {
    atomic_fetch_add(&w->heartbeat, 1);
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  while (w->nlive > 0) free_at(w, w->nlive - 1, OP_FINISH);
  w->counts[OP_FINISH]++;
  atomic_store(&w->phase, 3);
}

void *stress_worker_main(void *arg) {
  worker_t *w = arg;
  stress_t *st = w->st;
  char name[32];
  snprintf(name, sizeof name, "worker %d", w->index);
  stress_set_thread(&w->hist, name);
  stress_tracker_begin(st, w->tracker_async);
  uint64_t n = 0;
  while (!atomic_load_explicit(&st->stop, memory_order_relaxed)) {
    int op = draw(w);
    w->counts[op]++;
    run_op(w, op);
    atomic_fetch_add_explicit(&w->heartbeat, 1, memory_order_relaxed);
    stress_data_check(w, (++n & 63) == 0);
    if ((n & 15) == 0) retire_all(w, false);
  }
  finish(w);
  return NULL;
}
