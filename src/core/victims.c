/* SPDX-License-Identifier: Apache-2.0 */
/* The victim policy: least recently used first, after the controller's own choices, and
 * buffers that a prefetch brought back and nobody has acquired yet last of all: they are
 * what the program said it will use next. Room for a prefetch never comes from them, so one
 * prefetch cannot push out what another brought in; nor does room made ahead in the
 * background, which is a guess and must not undo a prefetch for it: only a reservation that
 * needs the room now takes them (spills on demand).
 *
 * Candidates come from one scan of the slots without locks (a snapshot: a candidate may
 * be locked, moved or freed by the time it is claimed, and the claim, a trylock plus a CAS
 * in spw__move_begin, is what decides). Claims never wait for a slot mutex, so a thread
 * that holds its own slot's mutex can never deadlock against another doing the same. */
#include <stdlib.h>

#include "clock.h"
#include "controller.h"
#include "moves.h"

/* Largest batch of victims committed at once when making room: whoever waits for room (an
 * unspill on the upload lane) goes on as soon as the first chunk is out, so the two
 * directions overlap. Small buffers still go many to a chunk. */
#define SPILL_CHUNK_BYTES ((uint64_t)128 << 20)

typedef struct candidate {
  uint64_t last_use;
  uint32_t index, gen, prefetched;
} candidate_t;

static int by_age(const void *a, const void *b) {
  const candidate_t *x = a, *y = b;
  if (x->prefetched != y->prefetched) return x->prefetched ? 1 : -1;
  if (x->last_use != y->last_use) return x->last_use < y->last_use ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static int idle_in(uint64_t w, uint32_t state) {
  return spw__w_state(w) == state && spw__w_count(w) == 0 &&
         !(w & (SPW_W_FREE_PENDING | SPW_W_MOVING));
}

/* The idle buffers in `state` (with all of `flags`), oldest first, prefetched ones last or,
 * with `skip_prefetched`, not at all (malloc'd; NULL when memory runs out). */
static candidate_t *scan(spw_runtime_t *rt, uint32_t state, uint64_t flags, int skip_prefetched,
                         size_t *n) {
  uint32_t nslots = atomic_load(&rt->handles.nslots);
  candidate_t *c = malloc((size_t)nslots * sizeof *c + 1);
  *n = 0;
  if (!c) return NULL;
  for (uint32_t i = 0; i < nslots; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    if (!idle_in(w, state) || (w & flags) != flags) continue;
    uint32_t prefetched = atomic_load_explicit(&s->prefetched, memory_order_relaxed);
    if (prefetched && skip_prefetched) continue;
    c[*n] = (candidate_t){atomic_load_explicit(&s->last_use, memory_order_relaxed), i,
                          spw__w_gen(w), prefetched};
    (*n)++;
  }
  qsort(c, *n, sizeof *c, by_age);
  return c;
}

static int real_failure(int status) {
  return status != SPW_OK && status != SPW_ERR_BUSY && status != SPW_ERR_FREED &&
         status != SPW_ERR_LOCKED;
}

/* Claims the controller's choices first: up to 64 of them. */
static size_t claim_named(spw_runtime_t *rt, uint64_t bytes, spw_victim_t *v, uint64_t *claimed) {
  spw_buf_t named[64];
  size_t k = spw__controller_pressure(rt, bytes, named, 64), n = 0;
  for (size_t i = 0; i < k && *claimed < bytes; i++) {
    spw_slot_t *s;
    uint64_t w;
    if (spw__handles_lookup(&rt->handles, named[i], &s, &w) != SPW_OK) continue;
    if (idle_in(w, SPW_STATE_RESIDENT) && spw__victim_claim(rt, named[i], s, SPW_CLAIM_TRY, &v[n])) {
      *claimed += v[n].m.size;
      n++;
    }
  }
  return n;
}

/* The victims of spw__spill_lru or spw__spill_clean: the controller's first unless
 * `clean_only`, then the least recently used. For a hint, neither the controller's choices
 * (they may be prefetched buffers) nor prefetched buffers; in the background, no prefetched
 * buffers but those the controller names. */
static uint64_t spill_some(spw_runtime_t *rt, uint64_t bytes, spw_spill_reason_t reason,
                           int clean_only, int for_hint, int *why) {
  if (why) *why = SPW_OK;
  uint32_t nslots = atomic_load(&rt->handles.nslots);
  spw_victim_t *v = malloc(((size_t)nslots + 64) * sizeof *v);
  if (!v) return 0;
  uint64_t claimed = 0;
  size_t nv = clean_only || for_hint ? 0 : claim_named(rt, bytes, v, &claimed);
  if (claimed < bytes) {
    /* The background pass judged its need a moment ago and scans now: a prefetch that landed
     * between the two (with the memory that made the need freed meanwhile) was once its only
     * victim, and went back to host as soon as it arrived. */
    const int skip_prefetched = for_hint || reason == SPW_SPILL_BACKGROUND;
    size_t nc = 0;
    candidate_t *c =
        scan(rt, SPW_STATE_RESIDENT, clean_only ? SPW_W_CLEAN : 0, skip_prefetched, &nc);
    for (size_t i = 0; c && i < nc && claimed < bytes; i++) {
      spw_slot_t *s = spw__handles_slot_at(&rt->handles, c[i].index);
      spw_buf_t h = spw__handle_make(&rt->handles, c[i].gen, c[i].index);
      if (spw__victim_claim(rt, h, s, SPW_CLAIM_TRY, &v[nv])) {
        claimed += v[nv].m.size;
        nv++;
      }
    }
    free(c);
  }
  uint64_t moved = 0;
  for (size_t first = 0; first < nv;) {
    size_t last = first;
    uint64_t chunk = 0;
    while (last < nv && (last == first || chunk + v[last].m.size <= SPILL_CHUNK_BYTES))
      chunk += v[last++].m.size;
    moved += spw__spill_batch(rt, v + first, last - first, reason);
    first = last;
  }
  /* Why nothing moved, so that a caller that keeps asking can stop and say. */
  for (size_t i = 0; why && moved == 0 && i < nv; i++)
    if (real_failure(v[i].status)) *why = v[i].status;
  free(v);
  return moved;
}

uint64_t spw__spill_lru(spw_runtime_t *rt, uint64_t bytes, spw_spill_reason_t reason, int *why) {
  uint64_t t0 = rt->trace ? spw__now_ns() : 0;
  uint64_t moved = spill_some(rt, bytes, reason, 0, 0, why);
  if (t0) spw__trace_spill_for_room(rt->trace, reason == SPW_SPILL_BACKGROUND, bytes, moved, t0);
  return moved;
}

uint64_t spw__spill_for_hint(spw_runtime_t *rt, uint64_t bytes, spw_spill_reason_t reason) {
  uint64_t t0 = rt->trace ? spw__now_ns() : 0;
  uint64_t moved = spill_some(rt, bytes, reason, 0, 1, NULL);
  if (t0) spw__trace_spill_for_room(rt->trace, reason == SPW_SPILL_BACKGROUND, bytes, moved, t0);
  return moved;
}

uint64_t spw__spill_clean(spw_runtime_t *rt, uint64_t bytes) {
  return spill_some(rt, bytes, SPW_SPILL_ON_DEMAND, 1, 0, NULL);
}

uint64_t spw__demote_lru(spw_runtime_t *rt, uint64_t bytes) {
  size_t nc = 0;
  candidate_t *c = scan(rt, SPW_STATE_HOST, 0, 0, &nc);
  uint64_t freed = 0;
  for (size_t i = 0; c && i < nc && freed < bytes; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, c[i].index);
    size_t size = atomic_load_explicit(&s->size, memory_order_relaxed);
    spw_buf_t h = spw__handle_make(&rt->handles, c[i].gen, c[i].index);
    if (spw__demote(rt, h, SPW_CLAIM_TRY, 0) == SPW_OK) freed += size;
  }
  free(c);
  return freed;
}
