/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the moves between tiers, each built on the state
 * machine (buffer_state.h), and the victim policy that picks what to move.
 *
 *   spill_move.c    device -> host, a batch at a time (pipelined sub-batches)
 *   disk_move.c     device -> disk, host -> disk (demotion), disk -> device
 *   peer.c          peer -> host (lent memory taken back)
 *   unspill_move.c  host -> device: one buffer for an acquire, or a prefetch batch
 *   victims.c       least-recently-used victims, on the device and on host
 *
 * Every move ends with the buffer in its last good tier when it fails, and reports to the
 * controller (state_changed) and to spw_async_error through spw__report_move.
 */
#ifndef SPILLWAY_CORE_MOVES_H
#define SPILLWAY_CORE_MOVES_H

#include "buffer_state.h"

/* Why a spill happens (statistics, and whether its failures are the caller's). */
typedef enum spw_spill_reason {
  SPW_SPILL_EXPLICIT,   /* spw_spill / spw_spill_n */
  SPW_SPILL_ON_DEMAND,  /* a reservation needed room */
  SPW_SPILL_BACKGROUND, /* above the high watermark */
} spw_spill_reason_t;

/* A spill victim: a move begun (SPILLING), and what the spill gathers for it. */
typedef struct spw_victim {
  spw_move_t m;
  spw_host_extent_t ext; /* where its bytes go (empty for a clean victim) */
  int to_disk;           /* no host memory for it: straight to disk instead */
  int status;            /* SPW_OK, or why it did not move */
  spw_move_end_t end;
} spw_victim_t;

/* ---- spill_move.c ---- */
/* Begins a spill of h. Returns 1 and fills *v if it could. */
int spw__victim_claim(spw_runtime_t *rt, spw_buf_t h, spw_slot_t *s, spw_claim_t claim,
                      spw_victim_t *v);
/* spw__victim_claim without the budget's spw__budget_spill_started: a caller that claims
 * many adds their bytes with one call, before it spills them. */
int spw__victim_begin(spw_runtime_t *rt, spw_buf_t h, spw_slot_t *s, spw_claim_t claim,
                      spw_victim_t *v);
/* Copies the claimed victims to host memory in pipelined sub-batches, commits them and
 * reports them. Returns the device bytes that left the device. */
uint64_t spw__spill_batch(spw_runtime_t *rt, spw_victim_t *v, size_t n, spw_spill_reason_t why);
/* Where a batch's victims come from when they are claimed as its parts need them. */
typedef struct spw_victim_source {
  /* Claims up to `max` victims (begun, their bytes counted as spilling) into v[0..max) and
   * returns how many; fewer than `max` once it has none left. */
  size_t (*claim)(void *ctx, spw_victim_t *v, size_t max);
  void *ctx;
} spw_victim_source_t;
/* spw__spill_batch over victims that src claims a part at a time, at most `cap` of them,
 * into v: the claims of a part run while the previous part copies. The copies go on
 * `d2h`, one of the down lane's streams (spw__d2h, or a slice's: spw__engine_slice_stream),
 * which spw__move_abandon follows. */
uint64_t spw__spill_claiming(spw_runtime_t *rt, spw_victim_t *v, size_t cap,
                             const spw_victim_source_t *src, spw_spill_reason_t why,
                             spw_stream_t d2h);

/* ---- disk_move.c ---- */
/* Claimed victims straight to disk, together through the staging slots (small ones share a
 * slot and a disk request); commits, accounts and reports each. On return each victim's
 * status (SPW_OK when it is on disk) and end are set. */
void spw__spill_to_disk_n(spw_runtime_t *rt, spw_victim_t *const *v, size_t n,
                          spw_spill_reason_t why);
/* Demotes h (HOST -> DISK); with `claim` SPW_CLAIM_TRY it never waits for the slot mutex.
 * A buffer in lent peer memory goes too only with `peer_too` (an explicit spill to disk,
 * or peer memory taken back while host memory is full): under host pressure it would free
 * no host memory. SPW_ERR_BUSY if h is not (any more) an unlocked HOST buffer, or is left
 * in peer memory. */
int spw__demote(spw_runtime_t *rt, spw_buf_t h, spw_claim_t claim, int peer_too);
/* Reads a DISK buffer back for an acquire: `m` is a READ move begun by the caller, who holds
 * no lock. Back, the buffer takes `locks` locks and its data has landed; *dptr gets its
 * device memory. Returns SPW_OK, SPW_ERR_FREED, or why it stayed on disk (the caller's to
 * return: not recorded as an error of background work). */
int spw__read_back(spw_runtime_t *rt, const spw_move_t *m, uint32_t locks, void **dptr);
/* Reads back the DISK buffers among hs as batches (others are skipped); failures are
 * reported. `hint` as for spw__prefetch_batch. Returns how many came back. */
size_t spw__prefetch_from_disk(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, int hint);

/* ---- unspill_move.c ---- */
/* Brings a HOST buffer back for an acquire: `m` is an UNSPILL move begun by the caller, who
 * holds no lock. The copy is enqueued on `stream`; the host does not wait. Takes `locks`
 * locks; with SPW_ACQUIRE_READ in `flags` the host copy is kept as a clean copy, else it is
 * freed behind the copy, in the open completion item of `frees` (the stream's cell) that
 * the frees behind the stream's earlier copies share. */
int spw__unspill(spw_runtime_t *rt, const spw_move_t *m, spw_stream_t stream,
                 spw_completion_cell_t *frees, unsigned flags, uint32_t locks, void **dptr);
/* How a batch brings buffers back (spw__prefetch_batch). */
typedef struct spw_up_how {
  /* A prefetch hint, not an acquire's own batch: room comes from spw__device_get_hint, the
   * buffers brought back count as prefetched, and once no room is left the rest stay where
   * they are (stats.prefetch_dropped). */
  int hint;
  int keep; /* each host copy kept as a clean copy; else it goes back, a part at a time */
  /* An spw_acquire_n's batch: per buffer of hs, its device pointer when the batch committed
   * it RESIDENT with one lock already taken for the caller (else left as it is); NULL for
   * none. */
  void **locked;
  /* The stream its copies go on: one of the up lane's (a slice's, spw__engine_slice_stream);
   * NULL for the lane's own (spw__h2d). */
  spw_stream_t stream;
} spw_up_how_t;
/* Brings the HOST buffers among hs back as pipelined batches, marking each RESIDENT once
 * its copy has completed, as `how` says; others are skipped, and *elsewhere (may be NULL)
 * counts those found neither on host nor on the device (on disk, or moving). Returns how
 * many moved. */
size_t spw__prefetch_batch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n,
                           const spw_up_how_t *how, size_t *elsewhere);
/* spw__prefetch_batch over hs, a large request cut into slices that the up lane's helpers
 * bring back at once with the calling thread (spw__slice_count); it waits for a sliced run
 * of the up lane under way. Never call it from one of those helpers. Returns how many
 * moved. */
size_t spw__prefetch_sliced(spw_runtime_t *rt, const spw_buf_t *hs, size_t n,
                            const spw_up_how_t *how, size_t *elsewhere);

/* ---- victims.c ---- */
/* Spills least-recently-used unlocked buffers (the controller's choices first) until
 * `bytes` have left the device, on this thread, waiting for the copies; with `reason`
 * SPW_SPILL_BACKGROUND, none that a prefetch brought back since its last acquire unless the
 * controller names it (the room is made ahead, a guess: victims.c). Returns the bytes
 * that left; when 0, *why (may be NULL) is the status of the last failed spill, or SPW_OK
 * if there was nothing to spill. */
uint64_t spw__spill_lru(spw_runtime_t *rt, uint64_t bytes, spw_spill_reason_t reason, int *why);
/* The same for prefetches' room: among unlocked buffers that no prefetch brought back since
 * their last acquire, and without asking the controller. `reason`: SPW_SPILL_ON_DEMAND for
 * a prefetch's own room, SPW_SPILL_BACKGROUND for the headroom the down lane makes ahead of
 * them (budget.c, reserve_for_hint). */
uint64_t spw__spill_for_hint(spw_runtime_t *rt, uint64_t bytes, spw_spill_reason_t reason);
/* The same among buffers with a clean host copy only: they leave the device without a
 * copy and without needing room in a lower tier, so they are what is left to spill when
 * the lower tiers are full. */
uint64_t spw__spill_clean(spw_runtime_t *rt, uint64_t bytes);
/* Demotes least-recently-used host buffers until `bytes` of host memory came free. Returns
 * the bytes freed. */
uint64_t spw__demote_lru(spw_runtime_t *rt, uint64_t bytes);

/* ---- reporting (controller.c) ---- */
/* Delivers a move's event to the controller and the trace (which names `owner`, the
 * buffer's owner id as its move found it: spw_move_t.owner), counts a failure (status other
 * than SPW_OK, SPW_ERR_LOCKED) in stats.failures and records it for spw_async_error. Call
 * with no lock held. */
void spw__report_move(spw_runtime_t *rt, spw_buf_t h, uint32_t owner, spw_state_t from,
                      spw_state_t to, uint64_t bytes, uint64_t ns, int status);
/* Whether a move that went well has anyone to tell (a controller or a trace): when not,
 * spw__report_move of a successful move does nothing, and a batch skips the calls. A
 * failure is always reported (it is counted and recorded). */
int spw__reporting(spw_runtime_t *rt);
/* The same for a move whose caller receives its status (an acquire's own unspill or read
 * back): counted and delivered, but not an error of background work. */
void spw__report_own_move(spw_runtime_t *rt, spw_buf_t h, uint32_t owner, spw_state_t from,
                          spw_state_t to, uint64_t bytes, uint64_t ns, int status);

#endif /* SPILLWAY_CORE_MOVES_H */
