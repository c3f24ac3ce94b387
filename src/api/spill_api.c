/* SPDX-License-Identifier: Apache-2.0 */
/* The explicit spill calls of the public API: spw_spill, spw_prefetch, spw_wait_idle. They
 * validate and hand the work to the engine; none of them waits on the engine except
 * spw_wait_idle, which is why only that one refuses to run inside a controller callback. */
#include "api.h"
#include "jobs.h"

/* A spill's target: host (lent peer memory first, where there is some) or disk. */
static int bad_target(spw_runtime_t *rt, spw_tier_t tier) {
  if (tier == SPW_TIER_PEER)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "a spill goes to SPW_TIER_HOST (lent peer "
                          "memory first, where there is some) or SPW_TIER_DISK");
  return SPW_ERR_INVALID_ARG;
}

int spw_spill(spw_runtime_t *rt, spw_buf_t buf, spw_tier_t tier) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (tier != SPW_TIER_HOST && tier != SPW_TIER_DISK) return bad_target(rt, tier);
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  switch (spw__w_state(w)) {
  case SPW_STATE_RESIDENT:
    if (spw__w_count(w) > 0) return SPW_ERR_LOCKED;
    break;
  case SPW_STATE_HOST:
  case SPW_STATE_DEMOTING:
    if (tier != SPW_TIER_HOST) break;
    spw__jobs_fulfilled(rt, buf, tier); /* already there: no move, but the newest wish */
    return SPW_OK;
  case SPW_STATE_DISK:
    spw__jobs_fulfilled(rt, buf, tier);
    return SPW_OK;
  default: /* SPILLING or UNSPILLING: the engine sorts it out when it gets there */
    break;
  }
  return spw__jobs_spill(rt, &buf, 1, tier);
}

int spw_prefetch(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  uint64_t w;
  int st = spw__stream_and_buffer(rt, stream, buf, &e, &w);
  if (st != SPW_OK) return st;
  if (w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  uint32_t state = spw__w_state(w);
  if (state != SPW_STATE_HOST && state != SPW_STATE_DISK) { /* there, or on its way */
    spw__jobs_fulfilled(rt, buf, SPW_TIER_DEVICE); /* the newest wish: a pending spill goes */
    return SPW_OK;
  }
  /* The engine's upload lane does the work, so making room never blocks the caller, and
   * prefetches queued together move as one batch. */
  return spw__jobs_prefetch(rt, &buf, 1);
}

/* Validates every handle of a batch request before anything is queued. */
static int check_all(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int st = spw__handles_check(&rt->handles, bufs[i]);
    if (st != SPW_OK) return st;
  }
  return SPW_OK;
}

int spw_spill_n(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n, spw_tier_t tier) {
  if (rt && tier != SPW_TIER_HOST && tier != SPW_TIER_DISK) return bad_target(rt, tier);
  if (!rt || !bufs || n == 0 || (tier != SPW_TIER_HOST && tier != SPW_TIER_DISK))
    return SPW_ERR_INVALID_ARG;
  int st = check_all(rt, bufs, n);
  return st != SPW_OK ? st : spw__jobs_spill(rt, bufs, n, tier);
}

int spw_prefetch_n(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n, spw_stream_t stream) {
  if (!rt || !bufs || n == 0) return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st == SPW_OK) st = check_all(rt, bufs, n);
  return st != SPW_OK ? st : spw__jobs_prefetch(rt, bufs, n);
}

int spw_wait_idle(spw_runtime_t *rt) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  /* Completions first as well as last: what they release (locks whose work has completed,
   * memory freed behind a stream) is then released before the last background pass the
   * call waits for, not found by a later pass after the call has returned. */
  spw__completions_drain(rt->completions);
  spw__engine_wait_idle(rt->engine);
  spw__completions_drain(rt->completions);
  return atomic_exchange(&rt->async_error, SPW_OK);
}
