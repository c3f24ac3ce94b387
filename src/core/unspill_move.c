/* SPDX-License-Identifier: Apache-2.0 */
/* The unspill moves, host -> device: one buffer for an acquire (stream-ordered: the
 * caller's host thread does not wait for the copy), or a prefetch batch (pipelined parts,
 * each marked resident once its copy has completed), a large one in slices that the up
 * lane's helpers bring back beside the calling thread.
 *
 * For an acquire, the copy is the acquiring stream's own work: device memory is allocated
 * on that stream, one cudaMemcpyAsync enqueued there, and the slot's `ready` event recorded
 * after it.
 * Nothing else is needed for the acquirer: its later work follows the copy in stream order.
 * That is one copy and one event record, the least a stream-ordered unspill can cost (a copy
 * on the engine's upload stream needed a wait on the acquiring stream as well, and a second
 * event for the host extent's release). The buffer is RESIDENT at once with WAIT: acquirers
 * on other streams wait on `ready` until it has been seen complete, and whatever the copy
 * still reads or writes (the host extent; the device memory, if the buffer is freed) is
 * released behind `ready`. The host copy is kept as a clean copy for a read-only acquire. */
#include <stdint.h>
#include <stdlib.h>

#include "clock.h"
#include "host_extent.h"
#include "moves.h"
#include "peer.h"
#include "pipeline.h"

static void count_peer_unspill(spw_runtime_t *rt, const spw_move_t *m, uint64_t n) {
  if (!n || !m->from.host.peer) return;
  atomic_fetch_add(&rt->c.peer_unspills, 1);
  atomic_fetch_add(&rt->c.peer_unspill_bytes, m->size);
}

int spw__unspill(spw_runtime_t *rt, const spw_move_t *m, spw_stream_t stream,
                 spw_completion_cell_t *frees, unsigned flags, uint32_t locks, void **dptr) {
  uint64_t t0 = spw__now_ns();
  spw_slot_t *s = m->s;
  void *d = NULL;
  int copied = 0, recorded = 0;
  int st = spw__device_get(rt, m->size, stream, 0, spw__slot_va(s), &d);
  if (st == SPW_OK) {
    /* One copy on a copy engine, as a raw per-buffer copy would be: the batch kernel pays
     * off over many buffers, not one. */
    st = rt->ops->memcpy_async(rt->be, d, m->from.host.ptr, m->size, stream);
    copied = st == SPW_OK;
    /* `ready` is the mover's while the buffer is UNSPILLING. */
    if (st == SPW_OK && !s->ready) st = rt->ops->event_create(rt->be, &s->ready);
    if (st == SPW_OK) st = rt->ops->event_record(rt->be, s->ready, stream);
    recorded = st == SPW_OK;
  }
  uint64_t dt = spw__now_ns() - t0;
  spw_move_end_t end;
  if (st == SPW_OK) {
    uint64_t keep = (flags & SPW_ACQUIRE_READ) ? SPW_W_CLEAN : 0;
    spw_place_t to = {.dptr = d}, release;
    end = spw__move_commit(rt, m, &to, SPW_W_WAIT | keep, locks, &release);
    /* The copy may still read the host extent, and (freed meanwhile) write the memory. */
    spw__host_extent_free_behind(rt, &release.host, stream, frees, s->ready);
    uint64_t device = spw__place_release(rt, &release, m->size, s->ready);
    if (device) spw__budget_credit(rt, device);
  } else {
    /* A copy that was enqueued without its event still runs: wait for it, so that neither
     * the memory it writes nor the extent it reads is reused under it. */
    if (copied && !recorded) rt->ops->stream_sync(rt->be, stream);
    if (d) spw__device_put(rt, d, m->size, NULL);
    end = spw__move_abort(rt, m, 0);
  }
  spw_state_t from = spw__host_state(&m->from.host);
  if (end == SPW_MOVE_FREED) return SPW_ERR_FREED;
  if (end == SPW_MOVE_BACK) {
    spw__report_own_move(rt, m->h, m->owner, from, from, 0, dt, st); /* the acquire's */
    return st;
  }
  atomic_fetch_add(&rt->c.unspills, 1);
  atomic_fetch_add(&rt->c.unspill_bytes, m->size);
  atomic_fetch_add(&rt->c.unspill_ns, dt);
  count_peer_unspill(rt, m, 1);
  spw__report_move(rt, m->h, m->owner, from, SPW_STATE_RESIDENT, m->size, dt, SPW_OK);
  *dptr = d;
  return SPW_OK;
}

/* ---- prefetch batches -------------------------------------------------------------------- */

/* Parts: a part's copy starts as soon as its own room is made, and its buffers are marked
 * resident as soon as it lands, while the next part is prepared. Big buffers go one per
 * part (an acquirer of the first waits for it alone); small ones many per part. */
#define UP_PART_ITEMS 2048
#define UP_PART_BYTES ((uint64_t)64 << 20)

typedef struct up_item {
  spw_move_t m;
  size_t at; /* its index in the request */
  void *d;
  int status;
  int dropped; /* a hint's buffer that found no room that would stay: left where it is */
  spw_move_end_t end;
} up_item_t;

/* Per-part scratch for the part's memory, taken at once once every item is reserved. */
typedef struct up_scratch {
  size_t idx[UP_PART_ITEMS];
  size_t bytes[UP_PART_ITEMS];
  void *ptr[UP_PART_ITEMS];
  spw_host_extent_t freed[UP_PART_ITEMS]; /* host copies given back at the part's end */
} up_scratch_t;

typedef struct up_run {
  spw_runtime_t *rt;
  const spw_buf_t *hs; /* the request: its buffers are claimed as the parts need them */
  size_t nh, looked;
  size_t other; /* looked at and found neither on host nor on the device */
  up_item_t *it;
  size_t n; /* items claimed */
  spw_copy_desc_t *descs;
  up_scratch_t *scratch;
  spw_stream_t h2d;
  uint64_t held;  /* reserved for items not yet committed (this part and the one in flight) */
  spw_up_how_t how;
  int full;       /* (hint) no more room: the rest of the request is dropped */
  size_t moved;
  uint64_t moved_bytes;
} up_run_t;

/* An item reserved but given no memory: its reservation goes back, and a hint's item is
 * dropped with the rest of the request (the device refused what the budget allowed). */
static void up_unreserve(up_run_t *r, up_item_t *it, int st) {
  r->held -= it->m.size;
  it->status = st;
  if (r->how.hint) {
    r->full = 1;
    it->dropped = 1;
  }
}

/* Claims the request's HOST buffers as items until `want` are claimed or none is left: a
 * part at a time, so that the claims of a part run while the previous part copies. */
static void up_claim(up_run_t *r, size_t want) {
  for (; r->n < want && r->looked < r->nh; r->looked++) {
    spw_buf_t h = r->hs[r->looked];
    spw_slot_t *s;
    uint64_t w;
    if (spw__handles_lookup(&r->rt->handles, h, &s, &w) != SPW_OK) continue;
    if (spw__w_state(w) != SPW_STATE_HOST) { /* moved meanwhile, or on disk */
      r->other += spw__w_state(w) != SPW_STATE_RESIDENT;
      continue;
    }
    up_item_t *it = &r->it[r->n];
    *it = (up_item_t){.at = r->looked, .status = SPW_OK};
    if (spw__move_begin(r->rt, SPW_MOVE_UNSPILL, h, s, SPW_CLAIM_WAIT, &it->m)) r->n++;
    else r->other++;
  }
}

static void up_start(void *ctx, spw_part_t *p) {
  up_run_t *r = ctx;
  up_scratch_t *sc = r->scratch;
  const size_t most = spw__part_limit(p->first, r->nh, UP_PART_ITEMS);
  up_claim(r, p->first + most);
  size_t i = p->first, k = 0;
  uint64_t bytes = 0;
  /* Room first, item by item (making it may spill); then the memory of every item that got
   * room, small blocks under one pool lock rather than one each. */
  for (; i < r->n && i - p->first < most; i++) {
    up_item_t *it = &r->it[i];
    if (i > p->first && bytes + it->m.size > UP_PART_BYTES) break;
    if (r->full) {
      it->status = SPW_ERR_OUT_OF_MEMORY;
    } else {
      it->status = spw__device_reserve(r->rt, it->m.size, r->held, r->how.hint);
      if (r->how.hint) r->full = it->status == SPW_ERR_OUT_OF_MEMORY;
    }
    /* Room that only what this prefetch holds can give: finish what is in flight first. */
    if (it->status == SPW_ERR_NOT_READY) break;
    it->dropped = r->full;
    if (it->dropped) continue; /* takes no room, and no place in a copy */
    bytes += it->m.size;
    if (it->status != SPW_OK) continue;
    r->held += it->m.size;
    /* A stable buffer's memory is mapped at its own range, not taken from the pool: it goes
     * to the one-by-one path below (SIZE_MAX stops the pool's batch there). */
    sc->idx[k] = i;
    sc->bytes[k++] = spw__slot_va(it->m.s) ? SIZE_MAX : it->m.size;
  }
  p->count = i - p->first;
  size_t got = spw__dpool_alloc_n(r->rt->dpool, sc->bytes, k, sc->ptr), nd = 0;
  for (size_t j = 0; j < k; j++) {
    up_item_t *it = &r->it[sc->idx[j]];
    if (j < got) {
      it->d = sc->ptr[j];
    } else if (r->full) {
      spw__budget_credit(r->rt, it->m.size); /* a hint whose earlier item got no memory */
      up_unreserve(r, it, SPW_ERR_OUT_OF_MEMORY);
      continue;
    } else {
      int st = spw__device_alloc_reserved(r->rt, it->m.size, r->h2d, r->how.hint,
                                          spw__slot_va(it->m.s), &it->d);
      if (st != SPW_OK) { /* the reservation went back with the failure */
        it->d = NULL;
        up_unreserve(r, it, st);
        continue;
      }
    }
    /* The host extent is stable: the slot is UNSPILLING and only this thread moves it. */
    r->descs[nd++] = (spw_copy_desc_t){it->d, it->m.from.host.ptr, it->m.size};
  }
  spw__part_copy(r->rt, p, r->descs, nd, SPW_COPY_H2D, r->h2d);
}

static void up_finish(void *ctx, spw_part_t *p) {
  up_run_t *r = ctx;
  spw_runtime_t *rt = r->rt;
  int st = spw__part_wait(rt, p, r->h2d);
  spw_tally_t tally = {0};
  size_t nfreed = 0;
  for (size_t i = p->first; i < p->first + p->count; i++) {
    up_item_t *it = &r->it[i];
    if (it->d) r->held -= it->m.size;
    if (it->status == SPW_OK) it->status = st;
    if (it->status != SPW_OK) {
      if (it->d) spw__device_put(rt, it->d, it->m.size, NULL); /* the part is over */
      it->end = spw__move_abort(rt, &it->m, 0);
      continue;
    }
    /* Landed: resident with no WAIT, and the host copy kept as a clean copy, unless a
     * writable acquire_n asked: its locks would each drop the copy, one buffer at a time
     * under the slot's mutex and the arena's; here the part's copies go back under one
     * arena lock (freed one by one here instead, with the batch's threads queueing on the
     * arena's mutex, that acquire_n fell from 16 to 9 GB/s at 4 KiB x 65536 on an H100). */
    spw_place_t to = {.dptr = it->d}, release;
    uint64_t flags = (r->how.keep ? SPW_W_CLEAN : 0) | (r->how.hint ? SPW_COMMIT_PREFETCHED : 0);
    /* An acquire_n's lock is taken here, on this slice's thread, with the commit's own
     * write of the word, not in a second pass over every buffer on the caller's. */
    const uint32_t locks = r->how.locked ? 1 : 0;
    it->end = spw__move_commit_tally(rt, &it->m, &to, flags, locks, &release, &tally);
    if (locks && it->end == SPW_MOVE_DONE) r->how.locked[it->at] = it->d;
    if (release.host.ptr && !release.dptr && !release.disk.bytes) {
      r->scratch->freed[nfreed++] = release.host; /* nothing reads it: the copy is done */
    } else if (!spw__place_empty(&release)) {
      uint64_t device = spw__place_release(rt, &release, it->m.size, NULL);
      if (device) spw__budget_credit(rt, device);
    }
    if (it->end == SPW_MOVE_DONE) {
      r->moved++;
      r->moved_bytes += it->m.size;
    }
  }
  spw__tally_flush(rt, &tally);
  spw__host_extent_free_n(rt, r->scratch->freed, nfreed);
}

size_t spw__prefetch_batch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n,
                           const spw_up_how_t *how, size_t *elsewhere) {
  if (elsewhere) *elsewhere = n; /* until counted: a failure below leaves the rest to others */
  uint64_t t0 = spw__now_ns();
  up_run_t r = {.rt = rt, .hs = hs, .nh = n, .h2d = how->stream ? how->stream : spw__h2d(rt),
                .how = *how};
  r.it = malloc(n * sizeof *r.it);
  r.descs = malloc((n < UP_PART_ITEMS ? n : UP_PART_ITEMS) * sizeof *r.descs);
  r.scratch = malloc(sizeof *r.scratch);
  if (!r.it || !r.descs || !r.scratch) {
    free(r.it);
    free(r.descs);
    free(r.scratch);
    spw__set_async_error(rt, SPW_ERR_SYSTEM);
    return 0;
  }
  spw_pipeline_t pl = {.start = up_start, .finish = up_finish, .ctx = &r};
  spw__pipeline_run(&pl);
  if (elsewhere) *elsewhere = r.other;
  free(r.descs);
  free(r.scratch);
  uint64_t dt = spw__now_ns() - t0;
  atomic_fetch_add(&rt->c.unspills, r.moved);
  atomic_fetch_add(&rt->c.unspill_bytes, r.moved_bytes);
  atomic_fetch_add(&rt->c.unspill_ns, dt);
  uint64_t dropped = 0;
  const int tell = spw__reporting(rt); /* else a move that went well has no one to tell */
  for (size_t i = 0; i < r.n; i++) {
    up_item_t *it = &r.it[i];
    dropped += it->dropped;
    spw_state_t from = spw__host_state(&it->m.from.host);
    if (it->end == SPW_MOVE_DONE) {
      count_peer_unspill(rt, &it->m, 1);
      if (tell) spw__report_move(rt, it->m.h, it->m.owner, from, SPW_STATE_RESIDENT, it->m.size, dt, SPW_OK);
    } else if (it->end == SPW_MOVE_BACK && !it->dropped && (tell || it->status != SPW_OK)) {
      spw__report_move(rt, it->m.h, it->m.owner, from, from, 0, dt, it->status);
    }
  }
  if (dropped) atomic_fetch_add_explicit(&rt->c.prefetch_dropped, dropped, memory_order_relaxed);
  free(r.it);
  return r.moved;
}

/* ---- in slices ---- */

typedef struct up_slices {
  spw_runtime_t *rt;
  const spw_buf_t *hs;
  size_t n;
  unsigned count;
  const spw_up_how_t *how;
  atomic_size_t moved, elsewhere;
} up_slices_t;

/* Slice i copies on a stream of its own, so that its scatters on the device run beside the
 * other slices' transfers instead of taking turns with them on one stream. */
static void up_slice(void *ctx, unsigned i) {
  up_slices_t *c = ctx;
  size_t lo = c->n * i / c->count, hi = c->n * (i + 1) / c->count;
  size_t elsewhere = 0;
  spw_up_how_t how = *c->how;
  if (how.locked) how.locked += lo;
  how.stream = spw__engine_slice_stream(c->rt->engine, SPW_LANE_UP, i);
  atomic_fetch_add(&c->moved, spw__prefetch_batch(c->rt, c->hs + lo, hi - lo, &how, &elsewhere));
  atomic_fetch_add(&c->elsewhere, elsewhere);
}

size_t spw__prefetch_sliced(spw_runtime_t *rt, const spw_buf_t *hs, size_t n,
                            const spw_up_how_t *how, size_t *elsewhere) {
  unsigned count = spw__slice_count(rt, SPW_LANE_UP, n);
  if (count <= 1) return spw__prefetch_batch(rt, hs, n, how, elsewhere);
  up_slices_t c = {rt, hs, n, count, how, 0, 0};
  spw__workers_run(rt->workers[SPW_LANE_UP], up_slice, &c, count);
  if (elsewhere) *elsewhere = atomic_load(&c.elsewhere);
  return atomic_load(&c.moved);
}
