/* SPDX-License-Identifier: Apache-2.0 */
/* The device budget (see budget.h) and device memory for buffers.
 *
 * A reservation that would pass the limit first counts on the spills already in flight
 * (it waits for them), then spills more itself: the controller names victims if it wants
 * to, least-recently-used unlocked buffers make up the rest. When nothing can be spilled
 * and nothing is in flight, it looks at why before it gives up:
 *  - the spills it tried failed (host tier full and no disk, disk full, I/O error): that
 *    error, with the device figures, so the caller learns where the bytes could not go;
 *  - locks handed to spw_stream_release_async are still pending: it waits for them, once,
 *    up to 2 s (the caller itself may hold a stream back, so not for ever);
 *  - it lends memory to other runtimes (the peer tier): it takes that back;
 *  - the locked bytes plus the request exceed the limit: SPW_ERR_OUT_OF_MEMORY, the one
 *    case where no amount of waiting or spilling could help;
 *  - otherwise room is on its way (a free, a prefetch landing, a buffer whose slot mutex
 *    was busy at the trylock, a move ending): it waits and tries again.
 * Counting reservations still on their way to becoming buffers as if they were locked
 * made allocations fail while prefetches were in flight (issue 7). */
#include "budget.h"

#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "moves.h"
#include "peer.h"
#include "runtime.h"

/* How long an allocation that finds everything locked waits for pending async releases. */
#define PENDING_RELEASE_WAIT_NS 2000000000ull
/* How long a reservation waits for room that is on its way before calling the device full:
 * a safety net only, since every transient state ends. */
#define NO_PROGRESS_WAIT_NS 10000000000ull
/* How long an allocation the device refused waits for deferred frees to land. */
#define FREES_LAND_NS 100000000ull
/* One wait for room: spills in flight commit and broadcast. */
#define ROOM_WAIT_NS 5000000ull
/* How many such waits a prefetch's room may take before the prefetch gives up on it: a hint
 * has a bounded cost even while other threads keep spills in flight without pause. */
#define HINT_ROOM_WAITS 20

void spw__budget_credit(spw_runtime_t *rt, uint64_t bytes) {
  spw_budget_t *b = &rt->budget;
  atomic_fetch_sub(&b->used, bytes);
  pthread_mutex_lock(&b->mu);
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

void spw__budget_spill_started(spw_runtime_t *rt, uint64_t bytes) {
  atomic_fetch_add(&rt->budget.spilling, bytes);
}

void spw__budget_spill_ended(spw_runtime_t *rt, uint64_t freed, uint64_t ended) {
  /* Both before the broadcast, so a waiter never sees the spill over but its bytes used. */
  atomic_fetch_sub(&rt->budget.spilling, ended);
  spw__budget_credit(rt, freed);
}

uint64_t spw__locked_device_bytes(spw_runtime_t *rt) {
  uint64_t locked = 0;
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    if (spw__w_state(w) == SPW_STATE_RESIDENT && spw__w_count(w) > 0)
      locked += atomic_load_explicit(&s->size, memory_order_relaxed);
  }
  return locked;
}

void spw__owner_device_bytes(spw_runtime_t *rt, uint64_t out[SPW_OWNERS]) {
  memset(out, 0, SPW_OWNERS * sizeof *out);
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    uint32_t st = spw__w_state(w);
    if (st == SPW_STATE_RESIDENT || st == SPW_STATE_SPILLING)
      out[atomic_load_explicit(&s->owner, memory_order_relaxed)] +=
          atomic_load_explicit(&s->size, memory_order_relaxed);
  }
}

static void wait_for_room(spw_runtime_t *rt) {
  spw_budget_t *b = &rt->budget;
  struct timespec ts = spw__deadline_in(ROOM_WAIT_NS);
  pthread_mutex_lock(&b->mu);
  pthread_cond_timedwait(&b->cv, &b->mu, &ts);
  pthread_mutex_unlock(&b->mu);
}

static int out_of_memory(spw_runtime_t *rt, uint64_t used, uint64_t locked, uint64_t bytes,
                         const char *why) {
  return spw__set_error(rt, SPW_ERR_OUT_OF_MEMORY,
                        "device limit %llu bytes: %llu in use, %llu of them locked, %llu asked "
                        "for%s",
                        (unsigned long long)rt->budget.limit, (unsigned long long)used,
                        (unsigned long long)locked, (unsigned long long)bytes, why);
}

/* Room could not be made because the spills failed: say where the bytes could not go. */
static int spill_failed(spw_runtime_t *rt, int why, uint64_t used, uint64_t bytes) {
  char cause[256];
  spw_arena_stats_t as;
  spw__arena_get_stats(rt->arena, &as);
  int open_st;
  spw_disk_t *disk = why == SPW_ERR_HOST_OUT_OF_MEMORY || why == SPW_ERR_DISK_FULL
                         ? spw__disk(rt, &open_st) : NULL;
  if (why == SPW_ERR_HOST_OUT_OF_MEMORY && !disk)
    snprintf(cause, sizeof cause, "host tier full (%llu of %llu bytes) and no disk tier (%s)",
             (unsigned long long)as.in_use, (unsigned long long)as.limit, spw_err_name(open_st));
  else if (rt->settings.disk_limit)
    snprintf(cause, sizeof cause, "host tier full (%llu of %llu bytes), disk tier full (%llu of %llu bytes)",
             (unsigned long long)as.in_use, (unsigned long long)as.limit,
             (unsigned long long)spw__disk_in_use(disk),
             (unsigned long long)rt->settings.disk_limit);
  else if (disk)
    snprintf(cause, sizeof cause,
             "host tier full (%llu of %llu bytes), disk tier full (%llu bytes in use: the file "
             "system in %.64s is full)",
             (unsigned long long)as.in_use, (unsigned long long)as.limit,
             (unsigned long long)spw__disk_in_use(disk), rt->settings.spill_dir);
  else
    snprintf(cause, sizeof cause, "%.200s", spw__tls(rt) ? spw__tls(rt)->last_error : "");
  return spw__set_error(rt, why,
                        "device limit %llu bytes: %llu in use, %llu asked for; spilling to make "
                        "room failed with %s: %s",
                        (unsigned long long)rt->budget.limit, (unsigned long long)used,
                        (unsigned long long)bytes, spw_err_name(why), cause);
}

int spw__budget_reserve(spw_runtime_t *rt, uint64_t bytes, uint64_t own) {
  spw_budget_t *b = &rt->budget;
  if (bytes > b->limit)
    return spw__set_error(rt, SPW_ERR_OUT_OF_MEMORY,
                          "%llu bytes asked for, more than the device limit of %llu bytes",
                          (unsigned long long)bytes, (unsigned long long)b->limit);
  int drained = spw__in_callback(rt); /* a callback must not wait on the poller */
  uint64_t stalled_since = 0;
  for (;;) {
    uint64_t used = atomic_load(&b->used);
    if (used + bytes <= b->limit) {
      if (!atomic_compare_exchange_weak(&b->used, &used, used + bytes)) continue;
      /* Above the high watermark the engine spills in the background; past half the limit
       * it pins host memory ahead of the first spill. */
      if (used + bytes > b->high || (used <= b->limit / 2 && used + bytes > b->limit / 2))
        spw__engine_kick(rt->engine);
      return SPW_OK;
    }
    uint64_t shortfall = used + bytes - b->limit;
    uint64_t inflight = atomic_load(&b->spilling);
    if (inflight >= shortfall) {
      wait_for_room(rt);
      continue;
    }
    int why = SPW_OK;
    if (spw__spill_lru(rt, shortfall - inflight, SPW_SPILL_ON_DEMAND, &why) > 0) {
      stalled_since = 0;
      continue;
    }
    if (atomic_load(&b->spilling) > 0 || atomic_load(&b->used) != used) {
      wait_for_room(rt); /* others are making room, or a spill of ours was abandoned */
      continue;
    }
    if (why != SPW_OK) {
      /* The lower tiers are full, or failing: buffers with a clean host copy need neither. */
      if (spw__spill_clean(rt, shortfall - inflight) > 0) continue;
      return spill_failed(rt, why, used, bytes);
    }
    if (!drained) {
      /* Locks handed to spw_stream_release_async go as soon as their work completes. */
      drained = 1;
      spw__completions_drain_for(rt->completions, PENDING_RELEASE_WAIT_NS);
      continue;
    }
    uint64_t locked = spw__locked_device_bytes(rt);
    /* Memory lent to other runtimes is this one's to take back (their buffers in it move on
     * to their host tiers) before its own work fails: not from a callback, which must not
     * wait on the borrowers' moves. */
    if (locked + bytes <= b->limit && atomic_load(&rt->lent_bytes) > 0 && !spw__in_callback(rt) &&
        spw__peer_take_back(rt) > 0)
      continue;
    if (locked + bytes > b->limit) return out_of_memory(rt, used, locked, bytes, "");
    if (own > 0) return SPW_ERR_NOT_READY; /* the room is the caller's own: it goes first */
    uint64_t now = spw__now_ns();
    if (!stalled_since) stalled_since = now;
    if (now - stalled_since > NO_PROGRESS_WAIT_NS)
      return out_of_memory(rt, used, locked, bytes,
                           " (no room came free in 10 s, though not all of it is locked)");
    wait_for_room(rt);
  }
}

/* A prefetch's room (see spw__device_get_hint): up to the high watermark only, since above
 * it the background spiller would push the buffer straight out again, and made only from
 * buffers that no prefetch brought back. It waits for spills in flight (HINT_ROOM_WAITS at
 * most), never for locks or frees: what cannot be placed now is dropped, so a hint costs at
 * most one move per buffer however crowded the device is. */
static int reserve_for_hint(spw_runtime_t *rt, uint64_t bytes, uint64_t own) {
  spw_budget_t *b = &rt->budget;
  if (bytes > b->high) return SPW_ERR_OUT_OF_MEMORY;
  for (int waits = 0; waits < HINT_ROOM_WAITS;) {
    uint64_t used = atomic_load(&b->used);
    if (used + bytes <= b->high) {
      if (!atomic_compare_exchange_weak(&b->used, &used, used + bytes)) continue;
      /* Past half the limit, pin host memory ahead of the first spill, as for any
       * reservation. Past the low watermark, have the down lane spill back to it in the
       * background: a hint only reserves up to the high watermark, so without this the
       * background worker never runs under prefetches alone, and every prefetch spills its
       * own room on the up lane first, its copy out and its copy in one after the other
       * (bench/oversubscribe: 286 spills on demand per sweep, none in the background). With
       * the headroom made on the down lane, the next prefetch's copy in overlaps the copies
       * out, and a hint still costs about one move: one spill per buffer brought in. */
      if (used <= b->limit / 2 && used + bytes > b->limit / 2) spw__engine_kick(rt->engine);
      /* The load first: once the flag is up, a prefetch leaves its line unwritten. */
      if (used + bytes > b->low && !atomic_load(&b->hint_headroom) &&
          !atomic_exchange(&b->hint_headroom, 1))
        spw__engine_kick(rt->engine);
      return SPW_OK;
    }
    uint64_t shortfall = used + bytes - b->high, inflight = atomic_load(&b->spilling);
    if (inflight >= shortfall) {
      wait_for_room(rt);
      waits++;
      continue;
    }
    if (spw__spill_for_hint(rt, shortfall - inflight, SPW_SPILL_ON_DEMAND) > 0) continue;
    if (own > 0) return SPW_ERR_NOT_READY; /* what it holds may land and make it fit */
    if (inflight > 0) {
      wait_for_room(rt); /* the others' spills may leave enough */
      waits++;
      continue;
    }
    break;
  }
  return SPW_ERR_OUT_OF_MEMORY;
}

/* Memory behind a reservation: mapped at a stable buffer's range, else from the pool (its
 * arenas with `arena`). */
static int device_alloc(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, void *va,
                        int arena, void **out) {
  if (arena) return spw__dpool_alloc_arena(rt->dpool, bytes, out);
  if (!va) return spw__dpool_alloc(rt->dpool, bytes, stream, out);
  int st = spw__stable_map(rt->stable, va);
  if (st == SPW_OK) *out = va;
  return st;
}

int spw__device_reserve(spw_runtime_t *rt, size_t bytes, uint64_t own, int hint) {
  return hint ? reserve_for_hint(rt, bytes, own) : spw__budget_reserve(rt, bytes, own);
}

static int alloc_reserved(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, int hint,
                          void *va, int arena, void **out) {
  int st;
  for (int attempt = 0;; attempt++) {
    st = device_alloc(rt, bytes, stream, va, arena, out);
    if (st != SPW_ERR_OUT_OF_MEMORY) break;
    if (hint) break; /* no retries that wait: the hint is dropped */
    /* The device refused although the budget allowed it (fragmentation, another process,
     * cached pool memory, frees still queued behind streams or events): let the queued
     * frees land, make room, give cached memory back, then retry. */
    (void)spw__lane_sync(rt, SPW_LANE_DOWN);
    (void)spw__lane_sync(rt, SPW_LANE_UP);
    spw__completions_drain_for(rt->completions, FREES_LAND_NS);
    uint64_t moved = attempt == 0 ? 0 : spw__spill_lru(rt, bytes, SPW_SPILL_ON_DEMAND, NULL);
    spw__dpool_trim(rt->dpool);
    spw__stable_trim(rt->stable);
    rt->ops->trim(rt->be);
    if (attempt == 0) continue;
    if (moved == 0 && attempt >= 2) {
      st = spw__set_error(rt, SPW_ERR_OUT_OF_MEMORY,
                          "the device refused %zu bytes and nothing unlocked is left to spill",
                          bytes);
      break;
    }
    if (moved == 0) wait_for_room(rt);
  }
  if (st != SPW_OK) {
    spw__budget_credit(rt, bytes);
    if (hint) st = SPW_ERR_OUT_OF_MEMORY;
  }
  return st;
}

int spw__device_alloc_reserved(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, int hint,
                               void *va, void **out) {
  return alloc_reserved(rt, bytes, stream, hint, va, 0, out);
}

int spw__device_get_arena(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, void **out) {
  int st = spw__budget_reserve(rt, bytes, 0);
  return st != SPW_OK ? st : alloc_reserved(rt, bytes, stream, 0, NULL, 1, out);
}

int spw__device_get_hint(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, uint64_t own,
                         void *va, void **out) {
  int st = reserve_for_hint(rt, bytes, own);
  return st != SPW_OK ? st : spw__device_alloc_reserved(rt, bytes, stream, 1, va, out);
}

int spw__device_get(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, uint64_t own,
                    void *va, void **out) {
  int st = spw__budget_reserve(rt, bytes, own);
  return st != SPW_OK ? st : spw__device_alloc_reserved(rt, bytes, stream, 0, va, out);
}

void spw__device_free(spw_runtime_t *rt, void *ptr, size_t bytes, spw_bevent_t *after) {
  if (spw__stable_owns(rt->stable, ptr)) {
    /* An unmap is not stream-ordered: wait for the copy that may still write the memory. A
     * failed wait means a broken device; the memory goes all the same. */
    if (after) (void)rt->ops->event_sync(rt->be, after);
    (void)spw__stable_unmap(rt->stable, ptr);
    return;
  }
  if (after) spw__dpool_free_after_event(rt->dpool, ptr, bytes, after);
  else spw__dpool_free(rt->dpool, ptr, bytes, spw__d2h(rt));
}

void spw__device_put(spw_runtime_t *rt, void *ptr, size_t bytes, spw_bevent_t *after) {
  spw__device_free(rt, ptr, bytes, after);
  spw__budget_credit(rt, bytes);
}
