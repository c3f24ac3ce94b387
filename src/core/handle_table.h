/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the handle table and the buffer slot.
 *
 * A handle is 64 bits: [63..48] runtime tag, [47..24] generation, [23..0] slot index.
 * Generations start at 1, so no handle is 0. Slots live in chunks of 4096 that are
 * allocated on demand and never move or go away before the runtime does, so a lookup is a
 * few loads and no lock: the chunk pointer array is published with release stores.
 *
 * Each slot's `word` packs what the lock-free fast paths need in one atomic:
 *   [63..40] generation  [39..36] flags  [35..32] state  [31..0] lock count
 * acquire of a RESIDENT buffer with no flags (or only CLEAN, for a read-only acquire) is one
 * CAS (count + 1), release one CAS (count - 1); everything else (moves between tiers, frees,
 * unspill waits) takes the slot's mutex and then updates `word`, so a slow path never races
 * with another slow path, and the fast paths only ever touch the count of a RESIDENT,
 * flag-free slot. Which transitions exist and who makes them: buffer_state.h.
 * The fields below `word` are owned by whoever holds `mu`, or by the mover that holds the
 * slot's MOVING flag, for the fields its move reads (see buffer_state.h); `owner` and `va`
 * are written once, before the slot is published.
 *
 * Beside each chunk of slots, a dense array holds each slot's live generation: the
 * generation of its buffer from creation until spw_free is called on it, else 0. It is what
 * a batch request checks for every buffer before it queues any (spw__handles_check). It
 * changes only when a buffer is created or freed, so the lines a caller reads stay in its
 * cache, where each slot's `word` changes with every lock and move, on another thread's
 * core: on the H100 machine a check of 65536 buffers through their words took 0.4-1.4 ms
 * of a 4 KiB x 65536 prefetch's 7.5, before any of its copies could start.
 */
#ifndef SPILLWAY_CORE_HANDLE_TABLE_H
#define SPILLWAY_CORE_HANDLE_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"
#include "host_arena.h"
#include "spill_file.h"

#define SPW_SLOT_CHUNK_BITS 12u
#define SPW_SLOT_CHUNK (1u << SPW_SLOT_CHUNK_BITS)
#define SPW_SLOT_INDEX_BITS 24u
#define SPW_MAX_SLOTS (1u << SPW_SLOT_INDEX_BITS)
#define SPW_MAX_CHUNKS (SPW_MAX_SLOTS / SPW_SLOT_CHUNK)

#define SPW_GEN_MASK 0xFFFFFFu

/* Slot state values live in word bits 32..35; 0 is an unused slot. */
#define SPW_SLOT_UNUSED 0u

#define SPW_W_COUNT_MASK 0xFFFFFFFFull
#define SPW_W_STATE_SHIFT 32
#define SPW_W_STATE_MASK (0xFull << SPW_W_STATE_SHIFT)
#define SPW_W_FREE_PENDING (1ull << 36) /* spw_free was called; the last holder finishes it */
#define SPW_W_WAIT (1ull << 37)         /* an unspill copy may still be in flight: acquirers
                                           must make their stream wait on `ready` */
#define SPW_W_CLEAN (1ull << 38)        /* host extent holds a clean copy of a RESIDENT
                                           buffer: a read-only acquire keeps it, a writable
                                           one drops it, a re-spill moves no bytes */
#define SPW_W_MOVING (1ull << 39)       /* a move owns the buffer until it commits or aborts,
                                           also after an acquire abandoned it (state back to
                                           RESIDENT): no second move may begin, and a free is
                                           finished by the mover */
#define SPW_W_FLAGS_MASK (0xFull << 36)
#define SPW_W_GEN_SHIFT 40

static inline uint32_t spw__w_count(uint64_t w) { return (uint32_t)(w & SPW_W_COUNT_MASK); }
static inline uint32_t spw__w_state(uint64_t w) {
  return (uint32_t)((w & SPW_W_STATE_MASK) >> SPW_W_STATE_SHIFT);
}
static inline uint32_t spw__w_gen(uint64_t w) { return (uint32_t)(w >> SPW_W_GEN_SHIFT); }
static inline uint64_t spw__w_make(uint32_t gen, uint32_t state, uint64_t flags, uint32_t count) {
  return ((uint64_t)gen << SPW_W_GEN_SHIFT) | ((uint64_t)state << SPW_W_STATE_SHIFT) | flags |
         count;
}
static inline uint64_t spw__w_with_state(uint64_t w, uint32_t state) {
  return (w & ~SPW_W_STATE_MASK) | ((uint64_t)state << SPW_W_STATE_SHIFT);
}

typedef struct spw_slot {
  _Atomic uint64_t word;
  _Atomic uint64_t last_use; /* coarse monotonic ns of the last acquire: LRU order */
  _Atomic uint32_t prefetched; /* brought back by a prefetch and not acquired since: a later
                                  prefetch may not push it out (victims.c) */
  _Atomic uint8_t owner;     /* SPW_ALLOC_OWNER's id, 0 for none (owners.h): set before the
                                slot is published, constant until it is released; in what
                                was padding before the mutex. Atomic: scans read it lock-free */
  pthread_mutex_t mu;
  _Atomic size_t size;       /* atomic: the victim scans read it without the mutex */
  void *dptr;                /* device memory while RESIDENT or SPILLING */
  void *_Atomic va;          /* an address-stable buffer's reserved range, for its whole
                                life (dptr is va whenever it is not NULL); NULL for others.
                                Set before the slot is published, read lock-free */
  spw_host_extent_t host;    /* authoritative in HOST / DEMOTING; a clean copy when the
                                word has SPW_W_CLEAN and the buffer is RESIDENT */
  spw_disk_extent_t disk;    /* authoritative in DISK */
  spw_bevent_t *ready;       /* completes when the last unspill copy has landed */
  uint32_t move_seq;         /* bumped when a move is abandoned, so its commit notices */
  uint32_t next_free;        /* free list link (index + 1; 0 = end) */
} spw_slot_t;

typedef struct spw_handle_table {
  _Atomic(spw_slot_t *) chunks[SPW_MAX_CHUNKS];
  _Atomic(_Atomic uint32_t *) live_gens[SPW_MAX_CHUNKS]; /* per chunk of slots */
  _Atomic uint32_t nslots;   /* slots [0, nslots) exist */
  pthread_mutex_t mu;        /* guards the free list and growth */
  uint32_t free_head, free_tail; /* FIFO of free slot indices (+1; 0 = empty): the oldest
                                    freed slot is reused first, so generations wrap slowly */
  uint16_t tag;
  _Atomic uint64_t live;
} spw_handle_table_t;

int spw__handles_init(spw_handle_table_t *t, uint16_t tag);
/* Destroys the slots' mutexes and frees the chunks. */
void spw__handles_destroy(spw_handle_table_t *t);

/* Takes a free slot and returns its future handle. The slot stays UNUSED, invisible to
 * lookups, until the caller has filled it and calls spw__handles_publish. */
int spw__handles_alloc(spw_handle_table_t *t, spw_buf_t *out, spw_slot_t **slot_out);
static inline _Atomic uint32_t *spw__handles_live_at(const spw_handle_table_t *t, uint32_t index) {
  _Atomic uint32_t *chunk = atomic_load_explicit(
      &((spw_handle_table_t *)t)->live_gens[index >> SPW_SLOT_CHUNK_BITS], memory_order_acquire);
  return chunk + (index & (SPW_SLOT_CHUNK - 1));
}
/* Makes the slot of `h` live in `state` (release store: its fields become visible with
 * it). */
static inline void spw__handles_publish(spw_handle_table_t *t, spw_buf_t h, spw_slot_t *s,
                                        uint32_t state) {
  uint32_t gen = spw__w_gen(atomic_load_explicit(&s->word, memory_order_relaxed));
  atomic_store_explicit(&s->word, spw__w_make(gen, state, 0, 0), memory_order_release);
  atomic_store_explicit(spw__handles_live_at(t, (uint32_t)(h & (SPW_MAX_SLOTS - 1))), gen,
                        memory_order_release);
}
/* spw_free was called on `h`: its slot's live generation goes to 0 (checks fail from now). */
static inline void spw__handles_unlive(spw_handle_table_t *t, spw_buf_t h) {
  atomic_store_explicit(spw__handles_live_at(t, (uint32_t)(h & (SPW_MAX_SLOTS - 1))), 0,
                        memory_order_release);
}
/* Returns a slot to the free list, bumping its generation. Caller holds slot->mu. */
void spw__handles_release(spw_handle_table_t *t, spw_slot_t *slot, uint32_t index);

/* The stable range of the slot's buffer, or NULL (set at creation, constant for its life). */
static inline void *spw__slot_va(spw_slot_t *s) {
  return atomic_load_explicit(&s->va, memory_order_relaxed);
}

static inline uint32_t spw__handle_index(spw_buf_t h) { return (uint32_t)(h & (SPW_MAX_SLOTS - 1)); }
static inline uint32_t spw__handle_gen(spw_buf_t h) { return (uint32_t)((h >> 24) & SPW_GEN_MASK); }
/* The handle of slot `index` at generation `gen` in table `t`. */
static inline spw_buf_t spw__handle_make(const spw_handle_table_t *t, uint32_t gen, uint32_t index) {
  return ((uint64_t)t->tag << 48) | ((uint64_t)gen << 24) | index;
}

static inline spw_slot_t *spw__handles_slot_at(const spw_handle_table_t *t, uint32_t index) {
  spw_slot_t *chunk = atomic_load_explicit(
      &((spw_handle_table_t *)t)->chunks[index >> SPW_SLOT_CHUNK_BITS], memory_order_acquire);
  return chunk + (index & (SPW_SLOT_CHUNK - 1));
}

/* Finds the slot of `h`, checking tag, index and generation. On success *word holds the word
 * read. Errors: SPW_ERR_INVALID_HANDLE, SPW_ERR_FREED. Lock-free. */
static inline int spw__handles_lookup(const spw_handle_table_t *t, spw_buf_t h, spw_slot_t **out,
                                      uint64_t *word) {
  uint32_t gen = spw__handle_gen(h), idx = spw__handle_index(h);
  if (h == SPW_BUF_NULL || (uint16_t)(h >> 48) != t->tag || gen == 0) return SPW_ERR_INVALID_HANDLE;
  if (idx >= atomic_load_explicit(&((spw_handle_table_t *)t)->nslots, memory_order_acquire))
    return SPW_ERR_INVALID_HANDLE;
  spw_slot_t *s = spw__handles_slot_at(t, idx);
  uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
  if (spw__w_gen(w) != gen || spw__w_state(w) == SPW_SLOT_UNUSED) {
    /* A generation the slot has not reached yet was never issued: forged. */
    uint32_t cur = spw__w_gen(w);
    if (gen > cur && !(cur < 0x1000 && gen > SPW_GEN_MASK - 0x1000)) return SPW_ERR_INVALID_HANDLE;
    return SPW_ERR_FREED;
  }
  *out = s;
  *word = w;
  return SPW_OK;
}

/* Whether `h` names a buffer that spw_free has not been called on: SPW_OK, or the error
 * spw__handles_lookup gives (SPW_ERR_FREED also when spw_free was called and the buffer is
 * still held). Reads the live generations only, and the slot when they do not match, to
 * say which error. A buffer freed on another thread meanwhile may pass, as it could have an
 * instant before: whoever acts on it later looks it up again. Lock-free. */
static inline int spw__handles_check(const spw_handle_table_t *t, spw_buf_t h) {
  uint32_t gen = spw__handle_gen(h), idx = spw__handle_index(h);
  if (gen != 0 && (uint16_t)(h >> 48) == t->tag &&
      idx < atomic_load_explicit(&((spw_handle_table_t *)t)->nslots, memory_order_acquire) &&
      atomic_load_explicit(spw__handles_live_at(t, idx), memory_order_acquire) == gen)
    return SPW_OK;
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(t, h, &s, &w);
  if (st == SPW_OK && (w & SPW_W_FREE_PENDING)) st = SPW_ERR_FREED;
  return st;
}

#endif /* SPILLWAY_CORE_HANDLE_TABLE_H */
