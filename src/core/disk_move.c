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
#include <stdlib.h>

#include "clock.h"
#include "moves.h"
#include "peer.h"

static int still_spilling(void *ctx) { return spw__move_wanted(ctx); }

void spw__spill_to_disk_n(spw_runtime_t *rt, spw_victim_t *const *v, size_t n,
                          spw_spill_reason_t why) {
  uint64_t t0 = spw__now_ns();
  int st;
  spw_disk_t *disk = spw__disk(rt, &st);
  spw_disk_item_t *items = malloc(n * sizeof *items);
  if (!items && disk) st = SPW_ERR_SYSTEM;
  for (size_t i = 0; items && i < n; i++) {
    /* Claimed as a spill to host (same source and transient state): it now ends on disk. */
    spw_move_t *m = &v[i]->m;
    m->kind = SPW_MOVE_SPILL_DISK;
    items[i] = (spw_disk_item_t){.dptr = m->from.dptr, .bytes = m->size, .guard_ctx = m,
                                 .status = disk ? SPW_OK : st};
    /* A landing unspill copy must be in before the device memory is read. The mover owns
     * `ready` while the buffer is SPILLING. */
    if (disk && (m->flags & SPW_W_WAIT))
      items[i].status = rt->ops->event_sync(rt->be, m->s->ready);
  }
  if (disk && items) {
    spw_copy_guard_t guard = {&rt->d2h_gate, still_spilling};
    spw__disk_write_device_n(disk, items, n, spw__d2h(rt), &guard);
  }
  uint64_t dt = spw__now_ns() - t0, freed = 0, ended = 0;
  size_t moved = 0;
  for (size_t i = 0; i < n; i++) {
    spw_victim_t *vi = v[i];
    const spw_move_t *m = &vi->m;
    vi->status = items ? items[i].status : st;
    ended += m->size;
    if (vi->status == SPW_OK) {
      spw_place_t to = {.disk = items[i].ext}, release = {0};
      vi->end = spw__move_commit(rt, m, &to, 0, 0, &release);
      /* The staging copies have completed, and the landing copy too (waited for above). */
      freed += spw__place_release(rt, &release, m->size, NULL);
    } else {
      vi->end = spw__move_abort(rt, m, 0); /* a stop by the guard: abandoned */
    }
    switch (vi->end) {
    case SPW_MOVE_DONE:
      moved++;
      atomic_fetch_add(&rt->c.spill_bytes, m->size);
      atomic_fetch_add(&rt->c.disk_write_bytes, m->size);
      spw__report_move(rt, m->h, m->owner, SPW_STATE_RESIDENT, SPW_STATE_DISK, m->size, dt, SPW_OK);
      break;
    case SPW_MOVE_BACK:
      spw__report_move(rt, m->h, m->owner, SPW_STATE_RESIDENT, SPW_STATE_RESIDENT, 0, dt, vi->status);
      break;
    case SPW_MOVE_FREED:
      vi->status = SPW_ERR_FREED;
      break;
    default:
      vi->status = SPW_ERR_BUSY;
    }
  }
  free(items);
  spw__budget_spill_ended(rt, freed, ended);
  atomic_fetch_add(&rt->c.spills, moved);
  atomic_fetch_add(&rt->c.spill_ns, dt);
  atomic_fetch_add(&rt->c.disk_writes, moved);
  if (why == SPW_SPILL_ON_DEMAND) atomic_fetch_add(&rt->c.spills_on_demand, moved);
  if (why == SPW_SPILL_BACKGROUND) atomic_fetch_add(&rt->c.spills_background, moved);
}

/* Writes a demoted buffer's copy to disk: from the host arena as it is, from lent peer
 * memory (which the CPU cannot read) through the device staging path. */
static int write_demoted(spw_runtime_t *rt, spw_disk_t *disk, const spw_move_t *m,
                         spw_disk_extent_t *out) {
  if (!m->from.host.peer) return spw__disk_write_host(disk, m->from.host.ptr, m->size, out);
  spw_disk_item_t item = {.dptr = m->from.host.ptr, .bytes = m->size, .status = SPW_OK};
  int st = spw__disk_write_device_n(disk, &item, 1, spw__d2h(rt), NULL);
  if (st == SPW_OK) st = item.status;
  if (st == SPW_OK) *out = item.ext;
  return st;
}

int spw__demote(spw_runtime_t *rt, spw_buf_t h, spw_claim_t claim, int peer_too) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, h, &s, &w);
  if (st != SPW_OK) return st;
  spw_disk_t *disk = spw__disk(rt, &st);
  if (!disk) return st;
  spw_move_t m;
  if (!spw__move_begin(rt, SPW_MOVE_DEMOTE, h, s, claim, &m)) return SPW_ERR_BUSY;
  if (m.from.host.peer && !peer_too) {
    spw__move_abort(rt, &m, 0); /* it holds no host memory: demoting it frees none */
    return SPW_ERR_BUSY;
  }
  spw_state_t from = spw__host_state(&m.from.host);
  uint64_t t0 = spw__now_ns();
  spw_disk_extent_t de = {0};
  st = write_demoted(rt, disk, &m, &de);
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
    spw__report_move(rt, h, m.owner, from, from, 0, dt, st);
    return st;
  }
  atomic_fetch_add(&rt->c.demotions, 1);
  atomic_fetch_add(&rt->c.demote_bytes, m.size);
  atomic_fetch_add(&rt->c.demote_ns, dt);
  atomic_fetch_add(&rt->c.disk_writes, 1);
  atomic_fetch_add(&rt->c.disk_write_bytes, m.size);
  spw__report_move(rt, h, m.owner, from, SPW_STATE_DISK, m.size, dt, SPW_OK);
  return SPW_OK;
}

/* Reads the moves' buffers back, reserving device memory for as many as the budget gives
 * this call at once (room that only what it holds could give waits for the next round).
 * With `hint` (a prefetch), room is a hint's (spw__device_get_hint), and once there is none
 * the rest are dropped: left on disk, unreported, counted; *full is then set. With `own`
 * the caller receives each failure (an acquire), so it is no error of background work. */
static size_t read_back(spw_runtime_t *rt, const spw_move_t *m, size_t n, uint32_t locks,
                        void **dptr, int *status, int hint, int own, int *full) {
  spw_stream_t h2d = spw__h2d(rt);
  spw_disk_item_t *items = malloc(n * sizeof *items);
  size_t moved = 0;
  uint64_t dropped = 0;
  int no_room = 0;
  for (size_t i = 0; i < n;) {
    uint64_t t0 = spw__now_ns(), held = 0;
    /* Room is made and the read done without the slot mutex: the read blocks this thread
     * only; other threads acquiring these buffers wait for the UNSPILLING state to end. */
    size_t j = i;
    for (; items && j < n; j++) {
      void *d = NULL;
      int st = SPW_ERR_OUT_OF_MEMORY;
      void *va = spw__slot_va(m[j].s);
      if (!no_room)
        st = hint ? spw__device_get_hint(rt, m[j].size, h2d, held, va, &d)
                  : spw__device_get(rt, m[j].size, h2d, held, va, &d);
      if (st == SPW_ERR_NOT_READY) break; /* only with room held: read what it holds first */
      if (hint && st == SPW_ERR_OUT_OF_MEMORY) no_room = 1;
      items[j] = (spw_disk_item_t){.dptr = d, .bytes = m[j].size, .ext = m[j].from.disk,
                                   .status = st};
      if (st == SPW_OK) held += m[j].size;
    }
    if (items) spw__disk_read_device_n(rt->disk, items + i, j - i, h2d);
    else j = n;
    uint64_t dt = spw__now_ns() - t0;
    for (; i < j; i++) {
      int st = items ? items[i].status : SPW_ERR_SYSTEM;
      void *d = items ? items[i].dptr : NULL;
      /* Every upload of the batch has completed (the read waited for them). */
      if (st != SPW_OK && d) spw__device_put(rt, d, m[i].size, NULL);
      spw_move_end_t end;
      int drop = hint && st == SPW_ERR_OUT_OF_MEMORY;
      if (st == SPW_OK) {
        spw_place_t to = {.dptr = d}, release;
        /* The data is on the device already: no WAIT. */
        end = spw__move_commit(rt, &m[i], &to, hint ? SPW_COMMIT_PREFETCHED : 0, locks, &release);
        uint64_t device = spw__place_release(rt, &release, m[i].size, NULL);
        if (device) spw__budget_credit(rt, device);
      } else {
        end = spw__move_abort(rt, &m[i], 0);
      }
      if (end == SPW_MOVE_FREED) st = SPW_ERR_FREED;
      if (end == SPW_MOVE_BACK && drop) dropped++;
      else if (end == SPW_MOVE_BACK && own)
        spw__report_own_move(rt, m[i].h, m[i].owner, SPW_STATE_DISK, SPW_STATE_DISK, 0, dt, st);
      else if (end == SPW_MOVE_BACK)
        spw__report_move(rt, m[i].h, m[i].owner, SPW_STATE_DISK, SPW_STATE_DISK, 0, dt, st);
      if (end == SPW_MOVE_DONE) {
        moved++;
        atomic_fetch_add(&rt->c.disk_reads, 1);
        atomic_fetch_add(&rt->c.disk_read_bytes, m[i].size);
        spw__report_move(rt, m[i].h, m[i].owner, SPW_STATE_DISK, SPW_STATE_RESIDENT, m[i].size, dt, SPW_OK);
      }
      if (dptr) dptr[i] = end == SPW_MOVE_DONE ? d : NULL;
      if (status) status[i] = st;
    }
    atomic_fetch_add(&rt->c.disk_read_ns, dt);
  }
  free(items);
  if (dropped) atomic_fetch_add_explicit(&rt->c.prefetch_dropped, dropped, memory_order_relaxed);
  if (full) *full = no_room;
  return moved;
}

int spw__read_back(spw_runtime_t *rt, const spw_move_t *m, uint32_t locks, void **dptr) {
  int st;
  read_back(rt, m, 1, locks, dptr, &st, 0, 1, NULL); /* an acquire's: it returns st */
  return st;
}

/* A prefetch's moves are begun a group at a time, so that an acquirer of one of them waits
 * for its group's read, not for the whole prefetch. The disk's queue drains at the end of
 * each group: a group is four times what the staging slots hold in flight (64 MiB). */
#define READ_GROUP_ITEMS 8192
#define READ_GROUP_BYTES ((uint64_t)256 << 20)

size_t spw__prefetch_from_disk(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, int hint) {
  size_t cap = n < READ_GROUP_ITEMS ? n : READ_GROUP_ITEMS, moved = 0, i = 0;
  spw_move_t *m = malloc(cap * sizeof *m);
  if (!m) {
    spw__set_async_error(rt, SPW_ERR_SYSTEM);
    return 0;
  }
  int full = 0;
  while (i < n && !full) {
    size_t k = 0;
    uint64_t bytes = 0;
    for (; i < n && k < cap && bytes < READ_GROUP_BYTES; i++) {
      spw_slot_t *s;
      uint64_t w;
      if (spw__handles_lookup(&rt->handles, hs[i], &s, &w) != SPW_OK) continue;
      if (spw__w_state(w) != SPW_STATE_DISK) continue; /* moved meanwhile */
      if (spw__move_begin(rt, SPW_MOVE_READ, hs[i], s, SPW_CLAIM_WAIT, &m[k])) bytes += m[k++].size;
    }
    if (k) moved += read_back(rt, m, k, 0, NULL, NULL, hint, 0, &full); /* failures are reported */
  }
  /* The groups never begun stay on disk: dropped as well. */
  uint64_t left = 0;
  for (; i < n; i++) {
    spw_slot_t *s;
    uint64_t w;
    left += spw__handles_lookup(&rt->handles, hs[i], &s, &w) == SPW_OK &&
            spw__w_state(w) == SPW_STATE_DISK;
  }
  if (left) atomic_fetch_add_explicit(&rt->c.prefetch_dropped, left, memory_order_relaxed);
  free(m);
  return moved;
}
