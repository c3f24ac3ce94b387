/* SPDX-License-Identifier: Apache-2.0 */
/* The two sources of moves that the workers do not control: the meddler thread and the
 * controller.
 *
 * The meddler, every --meddle-us (200 us by default), spills to HOST or DISK, prefetches,
 * or spills / prefetches 16 at once, handles taken from ANY worker's published table, or
 * already freed; now and then it calls spw_wait_idle. It never locks, so for it a handle may
 * be locked (spill: SPW_ERR_LOCKED) or freed (SPW_ERR_FREED) at any moment, and nothing
 * else is acceptable.
 *
 * The controller (installed, replaced and removed by the workers) records every callback;
 * fails the run on a state event with an error other than the documented "skipped because
 * locked" report (and, with --peer on, "no room to move out of lent memory"), or on a move
 * the API does not document (documented_move); names victims in `pressure`, live, locked and stale alike; and from inside
 * callbacks spills and prefetches, and checks that the calls that would wait on the runtime
 * return SPW_ERR_WOULD_DEADLOCK. Callbacks run on any thread at once, so they draw their
 * random numbers from an atomic sequence. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "stress.h"

spw_buf_t stress_any_handle(stress_t *st, uint64_t *rng, unsigned dead_one_in) {
  if (dead_one_in > 0 && stress_below(rng, dead_one_in) == 0) {
    uint64_t n = atomic_load(&st->dead_next);
    if (n > 0) {
      uint64_t k = n <= STRESS_DEAD ? stress_below(rng, n) : stress_below(rng, STRESS_DEAD);
      return atomic_load(&st->dead[k]);
    }
  }
  for (int tries = 0; tries < 8; tries++) {
    worker_t *w = &st->workers[stress_below(rng, (uint64_t)st->nworkers)];
    int high = atomic_load(&w->pub_high);
    if (high == 0) continue;
    spw_buf_t h = atomic_load(&w->pub[stress_below(rng, (uint64_t)high)]);
    if (h != SPW_BUF_NULL) return h;
  }
  return SPW_BUF_NULL;
}

/* ---- the controller ---------------------------------------------------------------- */

static uint64_t cb_rng(stress_t *st) {
  uint64_t x = st->o.seed ^ (atomic_fetch_add(&st->cb_seq, 1) * 0xD1B54A32D192ED03ull);
  return stress_rand(&x);
}

static void cb_fail_status(stress_t *st, const char *call, int rc, unsigned acc) {
  if (rc <= 0 && rc > -32 && (acc & (1u << (unsigned)(-rc)))) return;
  stress_fail(st, NULL, "inside a controller callback, %s returned %s (%s)", call, spw_err_name(rc),
              spw_strerror(rc));
}

/* What a callback may do: spill and prefetch anything, and be refused a wait. */
static void cb_meddle(stress_t *st) {
  uint64_t r = cb_rng(st), rng = r;
  if (st->o.sanity && r % 16 < 2) return; /* --sanity: nothing may move */
  switch (r % 16) {
  case 0: {
    spw_buf_t h = stress_any_handle(st, &rng, 8);
    if (!h) break;
    atomic_fetch_add(&st->cb_calls, 1);
    cb_fail_status(st, "spw_spill",
                   spw_spill(st->rt, h, (r >> 8) & 1 ? SPW_TIER_HOST : SPW_TIER_DISK),
                   ACC(OK) | ACC(ERR_LOCKED) | ACC(ERR_FREED));
    break;
  }
  case 1: {
    spw_buf_t h = stress_any_handle(st, &rng, 8);
    if (!h) break;
    atomic_fetch_add(&st->cb_calls, 1);
    cb_fail_status(st, "spw_prefetch", spw_prefetch(st->rt, h, st->meddler_stream),
                   ACC(OK) | ACC(ERR_FREED));
    break;
  }
  case 2:
    atomic_fetch_add(&st->cb_deadlock_checks, 1);
    cb_fail_status(st, "spw_wait_idle", spw_wait_idle(st->rt), ACC(ERR_WOULD_DEADLOCK));
    break;
  case 3:
    atomic_fetch_add(&st->cb_deadlock_checks, 1);
    cb_fail_status(st, "spw_stream_synchronize", spw_stream_synchronize(st->rt, st->meddler_stream),
                   ACC(ERR_WOULD_DEADLOCK));
    break;
  case 4: {
    spw_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    cb_fail_status(st, "spw_get_stats", spw_get_stats(st->rt, &s), ACC(OK));
    break;
  }
  default: break;
  }
}

static void cb_allocated(void *user, spw_buf_t buf, size_t bytes) {
  stress_t *st = user;
  atomic_fetch_add(&st->cb_allocated, 1);
  size_t size = 0;
  /* It runs inside spw_alloc, before the owner has the handle: it is live. */
  int rc = spw_buf_size(st->rt, buf, &size);
  cb_fail_status(st, "spw_buf_size (allocated callback)", rc, ACC(OK));
  if (size != bytes)
    stress_fail(st, NULL, "allocated callback: %zu bytes, spw_buf_size says %zu", bytes, size);
  cb_meddle(st);
}

static void cb_freed(void *user, spw_buf_t buf, size_t bytes) {
  stress_t *st = user;
  (void)bytes;
  atomic_fetch_add(&st->cb_freed, 1);
  spw_state_t state;
  cb_fail_status(st, "spw_buf_state (freed callback: the handle is dead)",
                 spw_buf_state(st->rt, buf, &state), ACC(ERR_FREED));
  cb_meddle(st);
}

static int stable(spw_state_t s) {
  return s == SPW_STATE_RESIDENT || s == SPW_STATE_HOST || s == SPW_STATE_DISK;
}

/* The moves a state event may report (docs/api.md): between RESIDENT, HOST and DISK, save
 * DISK -> HOST; with --peer on also RESIDENT -> PEER (a spill into lent memory), PEER ->
 * RESIDENT (brought back), PEER -> HOST and PEER -> DISK (moved on: the lender took its
 * memory back, or a spill to disk). Nothing goes into lent memory but from the device. */
static int documented_move(const stress_t *st, spw_state_t from, spw_state_t to) {
  if (from == to) return 0;
  if (st->o.peer && from == SPW_STATE_PEER) return stable(to);
  if (st->o.peer && to == SPW_STATE_PEER) return from == SPW_STATE_RESIDENT;
  return stable(from) && stable(to) && !(from == SPW_STATE_DISK && to == SPW_STATE_HOST);
}

static void cb_state(void *user, const spw_state_event_t *e) {
  stress_t *st = user;
  atomic_fetch_add(&st->cb_events, 1);
  if (e->status == SPW_ERR_LOCKED && e->from == SPW_STATE_RESIDENT && e->to == SPW_STATE_RESIDENT) {
    atomic_fetch_add(&st->cb_locked_skips, 1);
  } else if (e->status == SPW_ERR_OUT_OF_MEMORY && e->from == e->to &&
             (stress_async_accept(st, st->run_tracker) & ACC(ERR_OUT_OF_MEMORY))) {
    /* a failed prefetch, reported like every failed move: legitimate only when the device
     * was locked to within less than the largest buffer at some moment of the run */
    atomic_fetch_add(&st->cb_oom_events, 1);
  } else if (st->o.peer && e->from == SPW_STATE_PEER && e->to == SPW_STATE_PEER &&
             (e->status == SPW_ERR_HOST_OUT_OF_MEMORY || e->status == SPW_ERR_DISK_FULL)) {
    /* taking lent memory back found no room for this buffer: it stays there, intact, and
     * spw_peer_reclaim returns the error (docs/api.md, "The peer tier") */
    atomic_fetch_add(&st->cb_peer_stuck, 1);
  } else if (e->status != SPW_OK && e->status > -32 && e->from == e->to &&
             (st->o.tolerate_async & (1u << (unsigned)(-e->status)))) {
    atomic_fetch_add(&st->tolerated, 1);
  } else if (e->status != SPW_OK) {
    stress_fail(st, NULL,
                "controller state event for buf %#llx: %d -> %d, status %s (%s); no move may fail "
                "in this configuration (no injected faults, disk unlimited)",
                (unsigned long long)e->buf, (int)e->from, (int)e->to, spw_err_name(e->status),
                spw_strerror(e->status));
  } else if (!documented_move(st, e->from, e->to)) {
    stress_fail(st, NULL, "controller state event for buf %#llx: %d -> %d is not a documented move",
                (unsigned long long)e->buf, (int)e->from, (int)e->to);
  } else {
    atomic_fetch_add(&st->cb_transitions[e->from][e->to], 1);
  }
  cb_meddle(st);
}

static size_t cb_pressure(void *user, uint64_t bytes_needed, spw_buf_t *victims, size_t max) {
  stress_t *st = user;
  (void)bytes_needed;
  atomic_fetch_add(&st->cb_pressure, 1);
  uint64_t r = cb_rng(st), rng = r;
  cb_meddle(st);
  if (r % 4 == 0) return 0; /* LRU alone */
  size_t n = 1 + (size_t)((r >> 4) % 8);
  if (n > max) n = max;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    /* now and then a forged handle, which the runtime must skip like a stale one */
    victims[k++] = (r >> 12) % 16 == i ? (spw_buf_t)0x1234 : stress_any_handle(st, &rng, 8);
  }
  atomic_fetch_add(&st->cb_victims, k);
  return k;
}

static const spw_controller_t full_controller = {sizeof(spw_controller_t), cb_allocated, cb_freed,
                                                 cb_state, cb_pressure};
static const spw_controller_t small_controller = {sizeof(spw_controller_t), NULL, NULL, cb_state,
                                                  cb_pressure};

void stress_controller_set(stress_t *st, worker_t *w, int kind) {
  if (!st->o.controller) kind = 0;
  const spw_controller_t *c = kind == 1 ? &full_controller : kind == 2 ? &small_controller : NULL;
  int rc = spw_set_controller(st->rt, c, st);
  if (w) stress_note(&w->hist, OP_CONTROLLER, rc, -1, (unsigned)kind, 0, 0, 0, 0, 0);
  if (rc != SPW_OK) stress_expect(st, w, "spw_set_controller", rc, ACC(OK), NULL);
  atomic_store(&st->controller_kind, kind);
}

/* ---- the meddler thread ------------------------------------------------------------ */

static void meddle_expect(stress_t *st, const char *call, int rc, unsigned acc, spw_buf_t h) {
  if (rc == SPW_ERR_FREED) st->meddle_freed++;
  if (rc == SPW_ERR_LOCKED) st->meddle_locked++;
  if (rc <= 0 && rc > -32 && (acc & (1u << (unsigned)(-rc)))) {
    if (rc != SPW_OK && (st->o.tolerate_async & (1u << (unsigned)(-rc))))
      atomic_fetch_add(&st->tolerated, 1);
    return;
  }
  char of[48] = "";
  if (h) snprintf(of, sizeof of, " of buf %#llx", (unsigned long long)h);
  stress_fail(st, NULL, "meddler: %s%s returned %s (%s); this thread's last error text: \"%s\"",
              call, of, spw_err_name(rc), spw_strerror(rc), spw_last_error(st->rt));
}

static void meddle_once(stress_t *st) {
  uint64_t *rng = &st->meddler_rng;
  uint64_t r = stress_below(rng, 64);
  int rc;
  st->meddles++;
  if (r < 20) { /* one buffer */
    spw_buf_t h = stress_any_handle(st, rng, 16);
    if (!h) return;
    if (r < 10) {
      spw_tier_t tier = r < 5 ? SPW_TIER_HOST : SPW_TIER_DISK;
      rc = spw_spill(st->rt, h, tier);
      stress_note(&st->meddler_hist, r < 5 ? OP_SPILL_HOST : OP_SPILL_DISK, rc, -1, 0, h, 0, 0, 0,
                  1);
      meddle_expect(st, tier == SPW_TIER_HOST ? "spw_spill(HOST)" : "spw_spill(DISK)", rc,
                    ACC(OK) | ACC(ERR_LOCKED) | ACC(ERR_FREED), h);
    } else {
      rc = spw_prefetch(st->rt, h, (r & 1) ? st->meddler_stream : NULL);
      stress_note(&st->meddler_hist, OP_PREFETCH, rc, -1, 0, h, 0, 0, 0, 1);
      meddle_expect(st, "spw_prefetch", rc, ACC(OK) | ACC(ERR_FREED), h);
    }
  } else if (r < 52) { /* 16 at once; a freed one among them fails the whole call */
    spw_buf_t hs[STRESS_MEDDLE_N];
    size_t n = 0;
    bool with_dead = stress_below(rng, 8) == 0;
    for (int tries = 0; tries < 4 * STRESS_MEDDLE_N && n < STRESS_MEDDLE_N; tries++) {
      spw_buf_t h = stress_any_handle(st, rng, 0);
      if (h) hs[n++] = h;
    }
    if (n == 0) return;
    if (with_dead) {
      spw_buf_t h = stress_any_handle(st, rng, 1);
      if (h) hs[stress_below(rng, n)] = h;
    }
    if (r < 36) {
      spw_tier_t tier = (r & 1) ? SPW_TIER_HOST : SPW_TIER_DISK;
      rc = spw_spill_n(st->rt, hs, n, tier);
      stress_note(&st->meddler_hist, OP_SPILL_N, rc, -1, tier, hs[0], 0, 0, 0, (unsigned)n);
      meddle_expect(st, "spw_spill_n", rc, ACC(OK) | ACC(ERR_FREED), hs[0]);
    } else {
      rc = spw_prefetch_n(st->rt, hs, n, (r & 1) ? st->meddler_stream : NULL);
      stress_note(&st->meddler_hist, OP_PREFETCH_N, rc, -1, 0, hs[0], 0, 0, 0, (unsigned)n);
      meddle_expect(st, "spw_prefetch_n", rc, ACC(OK) | ACC(ERR_FREED), hs[0]);
    }
  } else if (r < 54) {
    rc = spw_wait_idle(st->rt);
    stress_note(&st->meddler_hist, OP_WAIT_IDLE, rc, -1, 0, 0, 0, 0, 0, 0);
    if (rc == SPW_ERR_OUT_OF_MEMORY) st->meddle_oom++;
    stress_expect_async(st, NULL, "spw_wait_idle (meddler)", rc, st->meddler_tracker);
    stress_tracker_begin(st, st->meddler_tracker);
  } else {
    spw_buf_t h = stress_any_handle(st, rng, 4);
    if (!h) return;
    spw_state_t state;
    rc = spw_buf_state(st->rt, h, &state);
    stress_note(&st->meddler_hist, OP_QUERY, rc, -1, 0, h, 0, 0, 0, 0);
    meddle_expect(st, "spw_buf_state", rc, ACC(OK) | ACC(ERR_FREED), h);
    if (rc == SPW_OK && state == SPW_STATE_PEER) st->meddle_peer_seen++;
  }
}

void *stress_meddler_main(void *arg) {
  stress_t *st = arg;
  stress_set_thread(&st->meddler_hist, "the meddler");
  stress_tracker_begin(st, st->meddler_tracker);
  struct timespec period = {0, (long)st->o.meddle_us * 1000};
  while (!atomic_load_explicit(&st->stop, memory_order_relaxed)) {
    meddle_once(st);
    atomic_fetch_add_explicit(&st->meddler_heartbeat, 1, memory_order_relaxed);
    nanosleep(&period, NULL);
  }
  atomic_store(&st->meddler_phase, 2);
  return NULL;
}
