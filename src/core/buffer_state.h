/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the buffer state machine. Every change of a buffer's
 * state or placement goes through here.
 *
 * A buffer's placement is where its bytes are: device memory, a host extent, a disk
 * extent. Its state says which of them is authoritative:
 *
 *   RESIDENT   device (plus a clean host copy when the word has CLEAN)
 *   HOST       host extent
 *   DISK       disk extent
 *   SPILLING, UNSPILLING, DEMOTING: a move in progress (see below); the source is still
 *              authoritative
 *
 * A move changes the tier of a buffer in three steps, each a function here:
 *
 *   spw__move_begin   under the slot mutex: checks the buffer is in the move's source state,
 *                     unlocked and not being freed or moved, puts it in the move's transient
 *                     state and sets MOVING; snapshots the placement. From then on the mover
 *                     owns the fields the move reads, without the mutex.
 *   (the work)        without the mutex: copies, I/O, making room.
 *   spw__move_commit  under the mutex: installs the new placement, sets the target state,
 *   spw__move_abort   or goes back to the source state; clears MOVING. Either one hands
 *                     back what the caller must release.
 *
 * The moves and their states (the table in buffer_state.c, checked in debug builds):
 *
 *   SPILL        RESIDENT -> SPILLING   -> HOST
 *   SPILL_DISK   RESIDENT -> SPILLING   -> DISK
 *   UNSPILL      HOST     -> UNSPILLING -> RESIDENT
 *   READ         DISK     -> UNSPILLING -> RESIDENT
 *   DEMOTE       HOST     -> DEMOTING   -> DISK
 *
 * Abandon: an acquire may take a SPILLING buffer back at once (the device copy is intact):
 * RESIDENT, locked, MOVING still set, and the move's commit then finds it abandoned and
 * changes nothing. MOVING is what keeps a second move (or a free) from reaching the buffer
 * before the first mover has let go of it: a spill victim that was abandoned, unlocked and
 * taken again by another spiller, or freed, while the first spiller still read its device
 * pointer, is the bug this flag closes (issue 7).
 *
 * Free: spw__buffer_free marks FREE_PENDING; whoever lets go of the buffer last (the free
 * itself, the last unlock, or the mover at commit/abort) finishes it with
 * spw__slot_finish_free, which releases every placement and the slot.
 *
 * The tier byte counters (stats host_bytes / disk_bytes) change only here.
 */
#ifndef SPILLWAY_CORE_BUFFER_STATE_H
#define SPILLWAY_CORE_BUFFER_STATE_H

#include "runtime.h"

typedef enum spw_move_kind {
  SPW_MOVE_SPILL = 0,
  SPW_MOVE_SPILL_DISK,
  SPW_MOVE_UNSPILL,
  SPW_MOVE_READ,
  SPW_MOVE_DEMOTE,
  SPW_MOVE_RETURN, /* out of lent peer memory into host memory (peer.c) */
  SPW_MOVE_KINDS_
} spw_move_kind_t;

/* Where a buffer's bytes are; empty members (NULL, zero bytes) are absent. */
typedef struct spw_place {
  void *dptr;
  spw_host_extent_t host;
  spw_disk_extent_t disk;
} spw_place_t;

/* A move in progress, from spw__move_begin to its commit or abort. */
typedef struct spw_move {
  spw_move_kind_t kind;
  spw_buf_t h;
  spw_slot_t *s;
  size_t size;
  uint32_t seq;   /* the slot's move_seq at begin: an abandon bumps it */
  uint64_t flags; /* WAIT and CLEAN as they were at begin */
  uint8_t owner;  /* the buffer's owner id, for its report (spw__report_move) */
  spw_place_t from;
} spw_move_t;

typedef enum spw_claim {
  SPW_CLAIM_TRY,  /* trylock the slot mutex: never waits (the caller may hold another) */
  SPW_CLAIM_WAIT, /* lock it */
  SPW_CLAIM_HELD, /* the caller holds it, and keeps it */
} spw_claim_t;

/* How a move ended. */
typedef enum spw_move_end {
  SPW_MOVE_DONE,      /* committed: the target state */
  SPW_MOVE_BACK,      /* aborted: the source state again */
  SPW_MOVE_ABANDONED, /* an acquire took it back while it was moving: nothing changed */
  SPW_MOVE_FREED,     /* it was freed meanwhile: the buffer is gone */
} spw_move_end_t;

/* Begins a move of `kind` on buffer h (slot s). Returns 1 and fills *m if the buffer was
 * in the move's source state, unlocked (for spills), and neither moving nor being freed;
 * else 0 and nothing changed. */
int spw__move_begin(spw_runtime_t *rt, spw_move_kind_t kind, spw_buf_t h, spw_slot_t *s,
                    spw_claim_t claim, spw_move_t *m);

/* Whether the move's buffer is still in its transient state (not abandoned). Lock-free: a
 * read of the word. Meaningful only to the mover. */
int spw__move_wanted(const spw_move_t *m);

/* Commit flag, never stored in the word: the move is a prefetch's, and the buffer counts as
 * prefetched until its next acquire (handle_table.h, `prefetched`). */
#define SPW_COMMIT_PREFETCHED (1ull << 62)

/* The tier byte counters' changes of a batch of commits, so that a part of a batch costs
 * one atomic add per counter instead of two per buffer. Decreases wait in the tally until
 * spw__tally_flush; increases of host_bytes come out of what spw__tally_prepay_host added
 * beforehand (others are made at once). So a counter may read high for the length of a
 * part, never low: a buffer committed here and moved on by another thread before the flush
 * never takes it below zero. The counters are statistics (spw_stats, the trace) and decide
 * nothing. */
typedef struct spw_tally {
  uint64_t host, disk, peer; /* decreases not yet made */
  uint64_t host_prepaid;     /* added to host_bytes already, for commits still to come */
} spw_tally_t;

/* Commits: the buffer takes the move's target state with `flags` (WAIT, CLEAN, and
 * SPW_COMMIT_PREFETCHED) and `locks`
 * locks (an unspill for an acquire), and `to`'s member for the target tier (for SPILL of a
 * clean buffer, `to` may be empty: the clean host copy becomes authoritative). The old
 * placement's other members, and on ABANDONED / FREED all of `to`, go to *release: the
 * caller frees them (spw__place_release) outside the mutex. A RESIDENT target keeps the
 * host extent only with CLEAN. */
spw_move_end_t spw__move_commit(spw_runtime_t *rt, const spw_move_t *m, const spw_place_t *to,
                                uint64_t flags, uint32_t locks, spw_place_t *release);
/* spw__move_commit whose tier counter changes go to *tally (the caller flushes it with
 * spw__tally_flush before the batch ends) rather than to the counters at once. */
spw_move_end_t spw__move_commit_tally(spw_runtime_t *rt, const spw_move_t *m,
                                      const spw_place_t *to, uint64_t flags, uint32_t locks,
                                      spw_place_t *release, spw_tally_t *tally);
/* Adds `bytes` to host_bytes now, for commits into HOST to come with this tally. */
void spw__tally_prepay_host(spw_runtime_t *rt, spw_tally_t *tally, uint64_t bytes);
/* Makes the tally's decreases, takes back what was prepaid and not used, empties it. */
void spw__tally_flush(spw_runtime_t *rt, spw_tally_t *tally);

/* Whether the place holds nothing (spw__place_release would have nothing to do). */
static inline int spw__place_empty(const spw_place_t *p) {
  return !p->dptr && !p->host.ptr && !p->disk.bytes;
}

/* Aborts: the source state again, with `add_flags` (WAIT: a copy that may still read the
 * source was enqueued). The caller keeps and frees whatever it had obtained. */
spw_move_end_t spw__move_abort(spw_runtime_t *rt, const spw_move_t *m, uint64_t add_flags);

/* Abandons a SPILLING buffer for an acquire (slot mutex held, count 0): RESIDENT with one
 * lock and MOVING kept, move_seq bumped; `stream` is made to wait for every copy the mover
 * may have enqueued from the buffer, so the acquirer's writes never race with them. */
int spw__move_abandon(spw_runtime_t *rt, spw_slot_t *s, spw_stream_t stream);

/* Makes `stream` wait for the copies of a spill abandoned earlier whose mover still holds
 * the buffer (RESIDENT with MOVING). The abandoning stream waited for them, but its lock
 * may be gone before that wait ran (an all-or-nothing acquire that failed further on, a
 * release of a lock that did no work), so every lock taken until the mover lets go waits
 * too; the copies' bytes are discarded, but they must not read while the new owner writes. */
int spw__move_follow_abandoned(spw_runtime_t *rt, spw_stream_t stream);

/* Frees what `place` holds: device memory and host extents at once, or once `after` (an
 * event already recorded, that outlives the wait: a slot's `ready`) has completed; disk
 * extents at once. Empties it and returns the device bytes released, which the caller
 * credits to the budget (spw__budget_credit, once for a whole batch). */
uint64_t spw__place_release(spw_runtime_t *rt, spw_place_t *place, size_t size,
                            spw_bevent_t *after);

/* Drops the clean host copy of a RESIDENT buffer (slot mutex held): a writable acquire
 * makes it stale. Behind the slot's `ready` if an unspill copy may still read it. */
void spw__slot_drop_clean(spw_runtime_t *rt, spw_slot_t *s, int copy_may_read);

/* Where spw__buffer_create puts a buffer's first device memory. */
#define SPW__PLACE_STABLE 1u /* at an address range reserved for its life */
#define SPW__PLACE_ARENA 2u  /* from the device pool's arenas (SPW_ALLOC_ARENA) */

/* spw_alloc: a new RESIDENT buffer of `bytes` on device memory from spw__device_get on
 * `stream` (reserved against the budget, spilling on demand), placed as `place` says (0:
 * the pool); tagged with `owner` (0: none), whose
 * counters it joins before it is published (owners.h). Errors: those of spw__device_get, of
 * the stable pool, and of the handle table. */
int spw__buffer_create(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, unsigned place,
                       uint32_t owner, spw_buf_t *out);
/* spw_free: marks the buffer FREE_PENDING and finishes the free at once if nobody holds it
 * (no lock, no move). Errors: handle errors, SPW_ERR_FREED. *size gets its size. */
int spw__buffer_free(spw_runtime_t *rt, spw_buf_t h, size_t *size);
/* Releases every placement of the slot, its `ready` event stays for reuse, takes the buffer
 * out of its owner's counters, and returns the slot to the table. Slot mutex held on entry, released on return. `tier_state`: the state
 * whose tier held the bytes (a move's source state when a mover finishes the free). */
void spw__slot_finish_free(spw_runtime_t *rt, spw_slot_t *s, spw_buf_t h, uint32_t tier_state);

#endif /* SPILLWAY_CORE_BUFFER_STATE_H */
