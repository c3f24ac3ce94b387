/* SPDX-License-Identifier: Apache-2.0 */
/* The device budget and the victim policy.
 *
 * device_used counts the device bytes buffers hold (reserved before the memory is asked
 * for, given back after it is freed); spilling_bytes is the part of it already on its way
 * out. A reservation that would pass the limit first counts on the spills in flight (it
 * waits for them), then spills more itself: the controller names victims if it wants to,
 * least-recently-used unlocked buffers make up the rest. It fails only when nothing is left
 * to spill and nothing is in flight, that is when what remains is locked.
 *
 * Victims are claimed with a trylock on their slot, so a thread that holds its own slot's
 * mutex (an unspill making room) can never deadlock against another doing the same. */
#include <stdlib.h>
#include <time.h>

#include "../spill/engine.h"
#include "completions.h"
#include "runtime.h"

/* Largest batch of victims committed at once when making room. */
#define SPW_SPILL_CHUNK_BYTES ((uint64_t)128 << 20)

/* How long an allocation that finds everything locked waits for pending async releases. */
#define SPW_PENDING_RELEASE_WAIT_NS 2000000000ull

void spw__budget_unreserve(spw_runtime_t *rt, uint64_t bytes) {
  atomic_fetch_sub(&rt->device_used, bytes);
  pthread_mutex_lock(&rt->budget_mu);
  pthread_cond_broadcast(&rt->budget_cv);
  pthread_mutex_unlock(&rt->budget_mu);
}

uint64_t spw__locked_device_bytes(spw_runtime_t *rt) {
  uint64_t locked = 0;
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    if (spw__w_state(w) == SPW_STATE_RESIDENT && spw__w_count(w) > 0) locked += s->size;
  }
  return locked;
}

/* Waits up to 5 ms for device bytes to come back (spills in flight commit and broadcast). */
static void wait_for_room(spw_runtime_t *rt) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += 5000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&rt->budget_mu);
  pthread_cond_timedwait(&rt->budget_cv, &rt->budget_mu, &ts);
  pthread_mutex_unlock(&rt->budget_mu);
}

int spw__budget_reserve(spw_runtime_t *rt, uint64_t bytes) {
  if (bytes > rt->device_limit)
    return spw__set_error(rt, SPW_ERR_OUT_OF_MEMORY,
                          "%llu bytes asked for, more than the device limit of %llu bytes",
                          (unsigned long long)bytes, (unsigned long long)rt->device_limit);
  int drained = spw__in_callback(rt); /* a callback must not wait on the poller */
  for (;;) {
    uint64_t used = atomic_load(&rt->device_used);
    if (used + bytes <= rt->device_limit) {
      if (!atomic_compare_exchange_weak(&rt->device_used, &used, used + bytes)) continue;
      if (used + bytes > rt->high_bytes) spw__engine_kick(rt);
      return SPW_OK;
    }
    uint64_t shortfall = used + bytes - rt->device_limit;
    uint64_t inflight = atomic_load(&rt->spilling_bytes);
    if (inflight >= shortfall) {
      wait_for_room(rt);
      continue;
    }
    uint64_t started = spw__spill_lru(rt, shortfall - inflight, 0);
    if (started > 0) continue;
    if (atomic_load(&rt->spilling_bytes) > 0 || atomic_load(&rt->device_used) != used) {
      wait_for_room(rt); /* others are making room, or a spill of ours was abandoned */
      continue;
    }
    if (!drained) {
      /* Locks handed to spw_stream_release_async are released as soon as their work
       * completes: give that work a moment (bounded: the caller itself may be what holds
       * a stream back) before calling the device full. */
      drained = 1;
      spw__completions_drain_for(rt, SPW_PENDING_RELEASE_WAIT_NS);
      continue;
    }
    uint64_t locked = spw__locked_device_bytes(rt);
    return spw__set_error(rt, SPW_ERR_OUT_OF_MEMORY,
                          "device limit %llu bytes: %llu in use, %llu of them locked, %llu "
                          "asked for",
                          (unsigned long long)rt->device_limit, (unsigned long long)used,
                          (unsigned long long)locked, (unsigned long long)bytes);
  }
}

int spw__device_alloc(spw_runtime_t *rt, size_t bytes, spw_stream_t bstream, void **out) {
  for (int attempt = 0;; attempt++) {
    int st = spw__dpool_alloc(rt, bytes, bstream, out);
    if (st != SPW_ERR_OUT_OF_MEMORY) return st;
    /* The device refused although the budget allowed it (fragmentation, another process,
     * cached pool memory, frees still queued on the engine's streams): let the queued frees
     * land, make room, give cached memory back, then retry. */
    rt->ops->stream_sync(rt->be, spw__engine_d2h(rt));
    rt->ops->stream_sync(rt->be, spw__engine_h2d(rt));
    uint64_t started = attempt == 0 ? 0 : spw__spill_lru(rt, bytes, 0);
    spw__dpool_trim(rt);
    rt->ops->trim(rt->be);
    if (attempt == 0) continue;
    if (started == 0 && attempt >= 2)
      return spw__set_error(rt, SPW_ERR_OUT_OF_MEMORY,
                            "the device refused %zu bytes and nothing unlocked is left to spill",
                            bytes);
    if (started == 0) wait_for_room(rt);
  }
}

typedef struct candidate {
  uint64_t last_use;
  uint32_t index;
} candidate_t;

static int by_age(const void *a, const void *b) {
  const candidate_t *x = a, *y = b;
  if (x->last_use != y->last_use) return x->last_use < y->last_use ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static int claimable(uint64_t w) {
  return spw__w_state(w) == SPW_STATE_RESIDENT && spw__w_count(w) == 0 &&
         !(w & SPW_W_FREE_PENDING);
}

/* Claims the controller's choices first. */
static size_t claim_controller_victims(spw_runtime_t *rt, uint64_t bytes, spw_victim_t *v,
                                       size_t max, uint64_t *claimed) {
  spw_buf_t named[64];
  size_t k = spw__ask_pressure(rt, bytes, named, max < 64 ? max : 64);
  size_t n = 0;
  for (size_t i = 0; i < k && n < max && *claimed < bytes; i++) {
    spw_slot_t *s;
    uint64_t w;
    if (spw__handles_lookup(&rt->handles, named[i], &s, &w) != SPW_OK || !claimable(w)) continue;
    if (spw__victim_claim(rt, named[i], s, &v[n])) {
      *claimed += v[n].size;
      n++;
    }
  }
  return n;
}

uint64_t spw__spill_lru(spw_runtime_t *rt, uint64_t bytes, int background) {
  uint32_t nslots = atomic_load(&rt->handles.nslots);
  candidate_t *c = malloc((size_t)nslots * sizeof *c + 1);
  spw_victim_t *v = malloc(((size_t)nslots + 64) * sizeof *v);
  if (!c || !v) {
    free(c);
    free(v);
    return 0;
  }
  uint64_t claimed = 0;
  size_t nv = claim_controller_victims(rt, bytes, v, (size_t)nslots + 64, &claimed);

  size_t nc = 0;
  if (claimed < bytes) {
    for (uint32_t i = 0; i < nslots; i++) {
      spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
      uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
      if (!claimable(w)) continue;
      c[nc].last_use = atomic_load_explicit(&s->last_use, memory_order_relaxed);
      c[nc].index = i;
      nc++;
    }
    qsort(c, nc, sizeof *c, by_age);
  }
  for (size_t i = 0; i < nc && claimed < bytes; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, c[i].index);
    uint64_t w = atomic_load(&s->word);
    if (!claimable(w)) continue;
    spw_buf_t h = ((uint64_t)rt->handles.tag << 48) | ((uint64_t)spw__w_gen(w) << 24) | c[i].index;
    if (spw__victim_claim(rt, h, s, &v[nv])) {
      claimed += v[nv].size;
      nv++;
    }
  }
  free(c);
  uint64_t moved = 0;
  /* Commit in chunks: whoever waits for room (an unspill on the upload worker) can go on as
   * soon as the first chunk is out instead of after the whole batch, so the two directions
   * overlap. Small buffers still go many to a chunk. */
  for (size_t first = 0; first < nv;) {
    size_t last = first;
    uint64_t chunk = 0;
    while (last < nv && (last == first || chunk + v[last].size <= SPW_SPILL_CHUNK_BYTES))
      chunk += v[last++].size;
    spw__spill_batch(rt, v + first, last - first, background ? 2 : 1);
    first = last;
  }
  /* Only bytes that really left count: failed or abandoned spills freed nothing, and a
   * caller that keeps asking must see that to stop. */
  for (size_t i = 0; i < nv; i++)
    if (v[i].status == SPW_OK) moved += v[i].size;
  free(v);
  return moved;
}
