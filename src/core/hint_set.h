/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the pending hints, one entry per buffer.
 *
 * A hint (spw_spill, spw_spill_n, spw_prefetch, spw_prefetch_n) is a wish about where a
 * buffer should be, not a command to carry out once per call: the set keeps at most one
 * pending wish per buffer, so however often a hint is sent, what the engine has left to do
 * never exceeds one move per buffer and lane run. A hint equal to the pending one merges
 * with it while it is queued; a different one replaces it (the newest wish wins). A wish
 * leaves the set when the lane that acts on it takes it; a hint equal to a wish the lane has
 * taken is then a new one, queued again, once (the lane may have passed the buffer).
 *
 * Not thread-safe: the owner (jobs.c) holds its own mutex around every call; only the
 * count of entries may be read without it.
 */
#ifndef SPILLWAY_CORE_HINT_SET_H
#define SPILLWAY_CORE_HINT_SET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "handle_table.h"
#include "spillway/spillway.h"

typedef enum spw_wish {
  SPW_WISH_NONE = 0,
  SPW_WISH_PREFETCH,  /* up lane */
  SPW_WISH_HOST,      /* down lane: spill to host */
  SPW_WISH_DISK,      /* down lane: spill (or demote) to disk */
} spw_wish_t;

/* A cell is its buffer's generation (the index is the cell's own, the tag the runtime's:
 * every handle hinted was checked first), not the 64-bit handle: 8 bytes, not 16, since a
 * request's cells pass from the caller's core (submit) to the lane's (take) and back, one
 * cache line per eight of them. */
typedef struct spw_hint {
  uint32_t gen;   /* 0: an empty cell */
  uint8_t wish;   /* spw_wish_t */
  uint8_t queued; /* bit per lane (1 << spw_lane_t): the handle is in that lane's queue */
} spw_hint_t;

typedef struct spw_hint_set {
  spw_hint_t *cells; /* one per slot index, up to the highest hinted (hint_set.c) */
  size_t cap;
  /* Entries in the set. Written under the owner's mutex like the rest, but may be read
   * without it: a hint that finds 0 knows there is no pending wish to cancel and skips the
   * mutex (spw_prefetch of a resident buffer, spw_stats). */
  atomic_size_t n;
} spw_hint_set_t;

/* The entry of `buf`, or NULL. Inline: the lanes look up every buffer of a batch. */
static inline spw_hint_t *spw__hints_find(spw_hint_set_t *s, spw_buf_t buf) {
  size_t i = spw__handle_index(buf);
  return i < s->cap && s->cells[i].gen == spw__handle_gen(buf) ? &s->cells[i] : NULL;
}
/* The entry of `buf`, added empty (wish NONE, queued 0) if absent, taking over the cell of
 * a freed buffer that had the same slot; NULL when out of memory. Pointers from earlier
 * calls may move. */
spw_hint_t *spw__hints_add(spw_hint_set_t *s, spw_buf_t buf);
/* Adds `delta` to the count of entries. Every writer holds the owner's mutex, so a load
 * and a store do what a read-modify-write would, without its locked instruction (one per
 * buffer of a request otherwise); a reader without the mutex sees either value. */
static inline void spw__hints_count(spw_hint_set_t *s, ptrdiff_t delta) {
  size_t n = atomic_load_explicit(&s->n, memory_order_relaxed);
  atomic_store_explicit(&s->n, n + (size_t)delta, memory_order_release);
}
/* Removes the entry `e` (from spw__hints_find or spw__hints_add), without a second lookup. */
static inline void spw__hints_drop(spw_hint_set_t *s, spw_hint_t *e) {
  *e = (spw_hint_t){0};
  spw__hints_count(s, -1);
}
void spw__hints_destroy(spw_hint_set_t *s);

#endif /* SPILLWAY_CORE_HINT_SET_H */
