/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the peer tier (spw_peer_lend, spw_peer_reclaim).
 *
 * A link is one piece of a lender's device memory lent to one borrower. The borrower sees
 * it as a borrowed host arena (host_arena.h, extents marked `peer`): its spills take
 * extents there first, and everything that reads or frees a host extent works on them
 * unchanged, since the copies use unified addresses (a kernel or cudaMemcpyDefault reaches
 * the peer's memory once peer access is on). Two things differ from host memory: the CPU
 * cannot read it (so a demotion to disk goes through the device staging path), and the
 * lender may take it back (then its buffers move on to host, or disk, first).
 *
 * Lifetime: a link lives from spw_peer_lend until its memory is taken back (reclaim, the
 * lender's pressure, either runtime's destruction); it is on the lender's `lent` list and
 * is the borrower's `peer` for that whole time, both changed together under the lender's
 * lend_mu and the borrower's peer_rw (written). */
#ifndef SPILLWAY_CORE_PEER_H
#define SPILLWAY_CORE_PEER_H

#include "runtime.h"

struct spw_peer_link {
  spw_runtime_t *lender, *borrower;
  void *base;              /* the lender's device memory */
  uint64_t bytes;
  spw_host_arena_t *arena; /* the borrower's view of it */
  int closing;             /* no new extents: being taken back (under peer_rw, written) */
  spw_peer_link_t *next;   /* on the lender's `lent` list */
};

/* spw_peer_lend and spw_peer_reclaim, arguments checked (peer_api.c). */
int spw__peer_lend(spw_runtime_t *lender, spw_runtime_t *borrower, uint64_t bytes);
int spw__peer_reclaim(spw_runtime_t *lender, spw_runtime_t *borrower);

/* Set-up and tear-down of a runtime's peer state (runtime.c, runtime_api.c). At
 * destruction: spw__peer_take_back_all (what `rt` lends; it fails, leaving the rest lent,
 * when lent memory holds buffers that cannot move on), then spw__peer_give_back_begin
 * (what it borrows leaves its lender's list, so no take-back of the lender's works on `rt`
 * while it closes), and once every buffer of `rt` is freed spw__peer_give_back_end (the
 * memory goes back). A lender and its borrower must not be destroyed at the same time from
 * two threads; either may be destroyed while the other works. */
int spw__peer_init(spw_runtime_t *rt);
int spw__peer_take_back_all(spw_runtime_t *rt);
void spw__peer_give_back_begin(spw_runtime_t *rt);
void spw__peer_give_back_end(spw_runtime_t *rt);
void spw__peer_fini(spw_runtime_t *rt);

/* Extents in the borrowed peer memory for up to n requests, from the first, as far as it
 * has room (0 when there is no peer tier, or it is being taken back). */
size_t spw__peer_alloc_n(spw_runtime_t *rt, const size_t *bytes, size_t n, spw_host_extent_t *out);
/* Returns an extent of the peer memory. */
void spw__peer_free(spw_runtime_t *rt, spw_host_extent_t *e);

/* For a reservation of the lender's that found nothing to spill: takes back everything it
 * lends. Returns the bytes that came back to its budget. Call with no lock held. */
uint64_t spw__peer_take_back(spw_runtime_t *lender);

/* Bytes lent to `rt` now (0: no peer tier). */
uint64_t spw__peer_limit(spw_runtime_t *rt);

/* The state a HOST buffer reports, by where its extent is. */
static inline spw_state_t spw__host_state(const spw_host_extent_t *e) {
  return e->peer ? SPW_STATE_PEER : SPW_STATE_HOST;
}

#endif /* SPILLWAY_CORE_PEER_H */
