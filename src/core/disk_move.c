/* SPDX-License-Identifier: Apache-2.0 */
/* The moves that touch the disk: a resident buffer straight to disk (device -> staging ->
 * disk), demotion (host -> disk, straight from the buffer's pinned extent) and the read
 * back (disk -> staging -> device).
 *
 * A direct spill keeps the buffer SPILLING, which an acquire abandons as it does a spill to
 * host (the device copy is intact): the write stops before its next chunk, and the chunks'
 * copies are enqueued under the d2h gate for the same reason as a spill batch's (see
 * spill_move.c). A buffer being demoted or read back is DEMOTING / UNSPILLING, and
 * acquirers wait for the move to end rather than abandon it: the other copy is then one
 * commit away. A failed move leaves the buffer where it was. */
#include "clock.h"
#include "moves.h"

static int still_spilling(void *ctx) { return spw__move_wanted(ctx); }

int spw__spill_to_disk(spw_runtime_t *rt, spw_victim_t *v, spw_spill_reason_t why) {
  /* Claimed as a spill to host (same source and transient state): it now ends on disk. */
  v->m.kind = SPW_MOVE_SPILL_DISK;
  const spw_move_t *m = &v->m;
  uint64_t t0 = spw__now_ns();
  int st;
  spw_disk_t *disk = spw__disk(rt, &st);
  spw_disk_extent_t de = {0};
  /* A landing unspill copy must be in before the device memory is read. The mover owns
   * `ready` while the buffer is SPILLING. */
  if (disk && (m->flags & SPW_W_WAIT)) st = rt->ops->event_sync(rt->be, m->s->ready);
  if (disk && st == SPW_OK) {
    spw_copy_guard_t guard = {&rt->d2h_gate, still_spilling, (void *)m};
    st = spw__disk_write_device(disk, m->from.dptr, m->size, spw__d2h(rt), &guard, &de);
  }
  uint64_t dt = spw__now_ns() - t0, freed = 0;
  spw_place_t release = {0};
  if (st == SPW_OK) {
    spw_place_t to = {.disk = de};
    v->end = spw__move_commit(rt, m, &to, 0, 0, &release);
    /* The chunks' copies have completed, and the landing copy too (waited for above). */
    freed = spw__place_release(rt, &release, m->size, NULL);
  } else {
    v->end = spw__move_abort(rt, m, 0); /* a stop by the guard: abandoned */
  }
  spw__budget_spill_ended(rt, freed, m->size);
  switch (v->end) {
  case SPW_MOVE_DONE:
    atomic_fetch_add(&rt->c.spills, 1);
    atomic_fetch_add(&rt->c.spill_bytes, m->size);
    atomic_fetch_add(&rt->c.spill_ns, dt);
    atomic_fetch_add(&rt->c.disk_writes, 1);
    atomic_fetch_add(&rt->c.disk_write_bytes, m->size);
    if (why == SPW_SPILL_ON_DEMAND) atomic_fetch_add(&rt->c.spills_on_demand, 1);
    if (why == SPW_SPILL_BACKGROUND) atomic_fetch_add(&rt->c.spills_background, 1);
    spw__report_move(rt, m->h, SPW_STATE_RESIDENT, SPW_STATE_DISK, m->size, dt, SPW_OK);
    return SPW_OK;
  case SPW_MOVE_BACK:
    spw__report_move(rt, m->h, SPW_STATE_RESIDENT, SPW_STATE_RESIDENT, 0, dt, st);
    return st;
  case SPW_MOVE_FREED:
    return SPW_ERR_FREED;
  default:
    return SPW_ERR_BUSY;
  }
}

int spw__demote(spw_runtime_t *rt, spw_buf_t h, spw_claim_t claim) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, h, &s, &w);
  if (st != SPW_OK) return st;
  spw_disk_t *disk = spw__disk(rt, &st);
  if (!disk) return st;
  spw_move_t m;
  if (!spw__move_begin(rt, SPW_MOVE_DEMOTE, h, s, claim, &m)) return SPW_ERR_BUSY;
  uint64_t t0 = spw__now_ns();
  spw_disk_extent_t de = {0};
  st = spw__disk_write_host(disk, m.from.host.ptr, m.size, &de);
  uint64_t dt = spw__now_ns() - t0;
  spw_move_end_t end;
  if (st == SPW_OK) {
    spw_place_t to = {.disk = de}, release;
    end = spw__move_commit(rt, &m, &to, 0, 0, &release);
    /* WAIT on a HOST buffer: a clean victim's landing copy may still read the extent. */
    spw__place_release(rt, &release, m.size, (m.flags & SPW_W_WAIT) ? s->ready : NULL);
  } else {
    end = spw__move_abort(rt, &m, 0);
  }
  if (end == SPW_MOVE_FREED) return SPW_ERR_FREED;
  if (end == SPW_MOVE_BACK) {
    spw__report_move(rt, h, SPW_STATE_HOST, SPW_STATE_HOST, 0, dt, st);
    return st;
  }
  atomic_fetch_add(&rt->c.demotions, 1);
  atomic_fetch_add(&rt->c.demote_bytes, m.size);
  atomic_fetch_add(&rt->c.demote_ns, dt);
  atomic_fetch_add(&rt->c.disk_writes, 1);
  atomic_fetch_add(&rt->c.disk_write_bytes, m.size);
  spw__report_move(rt, h, SPW_STATE_HOST, SPW_STATE_DISK, m.size, dt, SPW_OK);
  return SPW_OK;
}

int spw__read_back(spw_runtime_t *rt, const spw_move_t *m, uint32_t locks, void **dptr) {
  uint64_t t0 = spw__now_ns();
  spw_stream_t h2d = spw__h2d(rt);
  void *d = NULL;
  /* Room is made and the read done without the slot mutex: the read blocks this thread
   * only; other threads acquiring this buffer wait for the UNSPILLING state to end. */
  int st = spw__device_get(rt, m->size, h2d, 0, &d);
  if (st == SPW_OK) st = spw__disk_read_device(rt->disk, &m->from.disk, d, m->size, h2d);
  if (st != SPW_OK && d) spw__device_put(rt, d, m->size, NULL); /* the read waited for its copies */
  uint64_t dt = spw__now_ns() - t0;
  spw_move_end_t end;
  if (st == SPW_OK) {
    spw_place_t to = {.dptr = d}, release;
    /* The data is on the device already (the read waited for its copies): no WAIT. */
    end = spw__move_commit(rt, m, &to, 0, locks, &release);
    uint64_t device = spw__place_release(rt, &release, m->size, NULL);
    if (device) spw__budget_credit(rt, device);
  } else {
    end = spw__move_abort(rt, m, 0);
  }
  if (end == SPW_MOVE_FREED) return SPW_ERR_FREED;
  if (end == SPW_MOVE_BACK) {
    spw__report_move(rt, m->h, SPW_STATE_DISK, SPW_STATE_DISK, 0, dt, st);
    return st;
  }
  atomic_fetch_add(&rt->c.disk_reads, 1);
  atomic_fetch_add(&rt->c.disk_read_bytes, m->size);
  atomic_fetch_add(&rt->c.disk_read_ns, dt);
  spw__report_move(rt, m->h, SPW_STATE_DISK, SPW_STATE_RESIDENT, m->size, dt, SPW_OK);
  *dptr = d;
  return SPW_OK;
}
