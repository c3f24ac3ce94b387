/* SPDX-License-Identifier: Apache-2.0 */
/* The spill move, device -> host, for a batch of victims at once.
 *
 * The victims' copies go out as one copy_batch per part on one of the down lane's streams
 * (the lane's own, or a slice's: a lane cuts a large request into slices, each copying on
 * a stream of its own) (one kernel for the small ones, copy engines for the large ones),
 * then one event; device
 * memory is freed only after that event has completed. A victim with a clean host copy
 * (read-only since its last unspill) moves no bytes. A victim whose host extent cannot be
 * had goes straight to disk instead (disk_move.c), so that the device gets its room even
 * when host memory is full.
 *
 * Abandons: an acquire may take a victim back at any time before its commit. Copies are
 * enqueued under the runtime's d2h_gate, and only for victims still SPILLING at that
 * moment; the abandoning acquire takes the same gate to record the events its stream waits
 * on, one on each down stream. So the acquirer's later writes never race with a copy of the
 * buffer, and a victim
 * abandoned before its copy was enqueued is never copied at all. */
#include <stdlib.h>

#include "clock.h"
#include "host_extent.h"
#include "moves.h"
#include "peer.h"
#include "pipeline.h"

/* Victims per part: enough to amortize a launch and an event, few enough that the CPU work
 * of one part hides behind the copy of the previous one. Bytes per part (big victims go
 * one per part): what finishing a part costs after its copy, above all unmapping a stable
 * buffer's chunks (about 20 us per 2 MiB, against about 38 us to copy them), then runs
 * while the next part copies, not after the whole batch's copy; and the room of the first
 * part goes back without waiting for the rest. */
#define PART_VICTIMS 2048
#define PART_BYTES ((uint64_t)64 << 20)

int spw__victim_begin(spw_runtime_t *rt, spw_buf_t h, spw_slot_t *s, spw_claim_t claim,
                      spw_victim_t *v) {
  if (!spw__move_begin(rt, SPW_MOVE_SPILL, h, s, claim, &v->m)) return 0;
  v->ext = (spw_host_extent_t){0};
  v->to_disk = 0;
  v->status = SPW_OK;
  v->end = SPW_MOVE_BACK;
  return 1;
}

int spw__victim_claim(spw_runtime_t *rt, spw_buf_t h, spw_slot_t *s, spw_claim_t claim,
                      spw_victim_t *v) {
  if (!spw__victim_begin(rt, h, s, claim, v)) return 0;
  spw__budget_spill_started(rt, v->m.size);
  return 1;
}

static int is_clean(const spw_victim_t *v) { return (v->m.flags & SPW_W_CLEAN) != 0; }
static int is_landing(const spw_victim_t *v) { return (v->m.flags & SPW_W_WAIT) != 0; }

/* Per-part scratch, so that the batch's allocations and frees take one lock per part. */
typedef struct part_scratch {
  size_t idx[PART_VICTIMS];
  size_t bytes[PART_VICTIMS];
  spw_host_extent_t ext[PART_VICTIMS];
  void *dptr[PART_VICTIMS];
  spw_victim_t *to_disk[PART_VICTIMS];
} part_scratch_t;

typedef struct spill_run {
  spw_runtime_t *rt;
  spw_victim_t *v;
  size_t n, cap;                  /* victims claimed, and room for them in v */
  const spw_victim_source_t *src; /* claims more as the parts need them; NULL once dry */
  spw_copy_desc_t *descs;
  part_scratch_t *scratch;
  spw_stream_t d2h;
  spw_spill_reason_t why;
  spw_tally_t tally; /* the tier counters' changes of the part being committed */
  uint64_t freed;  /* device bytes that left */
  uint64_t copied; /* bytes copied (a clean victim copies none) */
  size_t moved, clean;
} spill_run_t;

/* Gets host memory for a victim to copy, one at a time (demoting to make room), or sends
 * it to disk when there is none. */
static void prepare_one(spw_runtime_t *rt, spw_victim_t *v) {
  v->status = spw__host_extent_alloc(rt, v->m.size, &v->ext);
  int open_st;
  if (v->status == SPW_ERR_HOST_OUT_OF_MEMORY && spw__disk(rt, &open_st)) {
    /* Host memory is full and demotion could not free enough: the device still needs the
     * room, so this one skips the host tier. */
    v->to_disk = 1;
    v->status = SPW_OK;
  }
}

/* Host memory for the part's victims to copy: as many as the arena holds under one lock,
 * the rest one by one. */
static void prepare(spill_run_t *r, spw_victim_t *v, size_t count) {
  part_scratch_t *sc = r->scratch;
  size_t k = 0;
  for (size_t i = 0; i < count; i++)
    if (!is_clean(&v[i]) && v[i].status == SPW_OK) {
      sc->idx[k] = i;
      sc->bytes[k++] = v[i].m.size;
    }
  int why = SPW_OK;
  size_t got = spw__host_extent_alloc_n(r->rt, sc->bytes, k, sc->ext, &why);
  for (size_t j = 0; j < got; j++) v[sc->idx[j]].ext = sc->ext[j];
  /* A failure other than a full arena (a refused registration) is the failure of the spill
   * it happened in; after a full arena the rest go one by one, demoting to make room. */
  if (got < k && why != SPW_ERR_HOST_OUT_OF_MEMORY) v[sc->idx[got++]].status = why;
  for (size_t j = got; j < k; j++) prepare_one(r->rt, &v[sc->idx[j]]);
}

/* Copies back from earlier unspills may still be landing in a victim's memory: the
 * download stream waits for each one not yet seen complete (each ran on its acquirer's
 * stream and recorded its slot's `ready`) before the part's copy. Victims that landed long
 * ago cost a query. When a wait cannot be had, the part's victims stay where they are. */
static void wait_for_landing(spill_run_t *r, spw_victim_t *v, size_t count) {
  spw_runtime_t *rt = r->rt;
  int st = SPW_OK;
  for (size_t i = 0; st == SPW_OK && i < count; i++) {
    if (is_clean(&v[i]) || !is_landing(&v[i])) continue;
    spw_bevent_t *ready = v[i].m.s->ready; /* the mover's while the buffer is SPILLING */
    int q = rt->ops->event_query(rt->be, ready);
    st = q == SPW_ERR_NOT_READY ? rt->ops->stream_wait_event(rt->be, r->d2h, ready) : q;
  }
  if (st != SPW_OK)
    for (size_t i = 0; i < count; i++) v[i].status = st;
}

static void spill_start(void *ctx, spw_part_t *p) {
  spill_run_t *r = ctx;
  /* The part's victims are claimed now, while the previous part copies. */
  const size_t most = spw__part_limit(p->first, r->cap, PART_VICTIMS);
  size_t want = p->first + most < r->cap ? p->first + most : r->cap;
  if (r->src && r->n < want) {
    size_t got = r->src->claim(r->src->ctx, r->v + r->n, want - r->n);
    if (got < want - r->n) r->src = NULL;
    r->n += got;
  }
  spw_victim_t *v = r->v + p->first;
  size_t left = r->n - p->first, count = 0;
  uint64_t bytes = 0;
  for (; count < left && count < most; count++) {
    if (count > 0 && bytes + v[count].m.size > PART_BYTES) break;
    bytes += v[count].m.size;
  }
  p->count = count;
  if (count == 0) return;
  wait_for_landing(r, v, count);
  prepare(r, v, count);
  size_t nd = 0;
  pthread_mutex_lock(&r->rt->d2h_gate);
  for (size_t i = 0; i < count; i++)
    if (v[i].ext.ptr && spw__move_wanted(&v[i].m))
      r->descs[nd++] = (spw_copy_desc_t){v[i].ext.ptr, v[i].m.from.dptr, v[i].m.size};
  spw__part_copy(r->rt, p, r->descs, nd, SPW_COPY_D2H, r->d2h);
  pthread_mutex_unlock(&r->rt->d2h_gate);
}

/* Commits one victim whose copy has completed (or failed: then it stays RESIDENT). Device
 * memory that can go at once is collected in `nfree` for one free per part. */
static void settle(spill_run_t *r, spw_victim_t *v, int copy_status, size_t *nfree) {
  spw_runtime_t *rt = r->rt;
  if (v->status == SPW_OK && !is_clean(v)) v->status = copy_status;
  spw_place_t release = {0};
  if (v->status != SPW_OK) {
    v->end = spw__move_abort(rt, &v->m, 0);
    spw__host_extent_free(rt, &v->ext); /* nothing still writes it */
    return;
  }
  /* A clean victim moved nothing, so an unspill copy may still be landing in its device
   * memory, reading the host copy that now becomes authoritative: the memory goes back
   * behind its `ready`, and HOST keeps WAIT for the host copy. */
  int landing = is_clean(v) && is_landing(v);
  spw_place_t to = {.host = v->ext};
  v->end = spw__move_commit_tally(rt, &v->m, &to, landing ? SPW_W_WAIT : 0, 0, &release,
                                  &r->tally);
  /* Pool memory goes back in one call per part; a stable buffer's is unmapped instead. */
  if (v->end == SPW_MOVE_DONE && !landing && release.dptr && !spw__slot_va(v->m.s)) {
    r->scratch->dptr[*nfree] = release.dptr;
    r->scratch->bytes[(*nfree)++] = v->m.size;
    release.dptr = NULL;
  }
  if (!spw__place_empty(&release))
    r->freed += spw__place_release(rt, &release, v->m.size, landing ? v->m.s->ready : NULL);
  if (v->end != SPW_MOVE_DONE) return;
  r->moved++;
  if (is_clean(v)) r->clean++;
  else r->copied += v->m.size;
}

static void spill_finish(void *ctx, spw_part_t *p) {
  spill_run_t *r = ctx;
  int st = spw__part_wait(r->rt, p, r->d2h);
  uint64_t ended = 0;
  size_t nfree = 0, ndisk = 0;
  /* Every victim that may commit here lands in HOST: host_bytes grows for the whole part
   * at once, before any of them shows HOST, and the flush takes back what did not. */
  for (size_t i = p->first; i < p->first + p->count; i++)
    if (!r->v[i].to_disk) ended += r->v[i].m.size;
  spw__tally_prepay_host(r->rt, &r->tally, ended);
  for (size_t i = p->first; i < p->first + p->count; i++) {
    spw_victim_t *v = &r->v[i];
    if (v->to_disk) {
      r->scratch->to_disk[ndisk++] = v;
      continue;
    }
    settle(r, v, st, &nfree);
  }
  spw__tally_flush(r->rt, &r->tally);
  /* The copies have completed: the memory is free now, in one go. */
  spw__dpool_free_n(r->rt->dpool, r->scratch->dptr, r->scratch->bytes, nfree, r->d2h);
  for (size_t i = 0; i < nfree; i++) r->freed += r->scratch->bytes[i];
  /* The room goes back now, not at the end of the batch: whoever waits for it goes on
   * while the next part is still copying. */
  spw__budget_spill_ended(r->rt, r->freed, ended);
  r->freed = 0;
  /* Commits, accounts and reports them itself. */
  if (ndisk) spw__spill_to_disk_n(r->rt, r->scratch->to_disk, ndisk, r->why);
}

uint64_t spw__spill_claiming(spw_runtime_t *rt, spw_victim_t *v, size_t cap,
                             const spw_victim_source_t *src, spw_spill_reason_t why,
                             spw_stream_t d2h) {
  uint64_t t0 = spw__now_ns();
  spill_run_t r = {.rt = rt, .v = v, .n = src ? 0 : cap, .cap = cap, .src = src,
                   .d2h = d2h, .why = why};
  r.descs = malloc((cap < PART_VICTIMS ? cap : PART_VICTIMS) * sizeof *r.descs);
  r.scratch = malloc(sizeof *r.scratch);
  if (r.descs && r.scratch) {
    spw_pipeline_t pl = {.start = spill_start, .finish = spill_finish, .ctx = &r};
    spw__pipeline_run(&pl);
  } else if (src) {
    spw__set_async_error(rt, SPW_ERR_SYSTEM); /* nothing was claimed: the request is lost */
  } else {
    /* Nothing can be copied: every victim stays where it is. */
    uint64_t ended = 0;
    for (size_t i = 0; i < r.n; i++) {
      v[i].status = SPW_ERR_SYSTEM;
      v[i].end = spw__move_abort(rt, &v[i].m, 0);
      ended += v[i].m.size;
    }
    spw__budget_spill_ended(rt, 0, ended);
  }
  const size_t n = r.n;
  free(r.descs);
  free(r.scratch);

  /* The down lane pins the next host slab if this batch left the arena short: kicked from
   * any other thread; on its own, its pass does so when it ends (jobs.c). */
  if (r.copied && !spw__engine_on_lane(rt->engine, SPW_LANE_DOWN)) spw__engine_kick(rt->engine);
  uint64_t dt = spw__now_ns() - t0;
  atomic_fetch_add(&rt->c.spills, r.moved);
  atomic_fetch_add(&rt->c.spill_bytes, r.copied);
  atomic_fetch_add(&rt->c.spill_ns, dt);
  atomic_fetch_add(&rt->c.clean_respills, r.clean);
  if (why == SPW_SPILL_ON_DEMAND) atomic_fetch_add(&rt->c.spills_on_demand, r.moved);
  if (why == SPW_SPILL_BACKGROUND) atomic_fetch_add(&rt->c.spills_background, r.moved);
  uint64_t left = 0;
  /* With no controller and no trace, a move that went well has no one to tell. */
  const int tell = spw__reporting(rt);
  for (size_t i = 0; i < n; i++) {
    if (v[i].to_disk) { /* reported by spw__spill_to_disk_n */
      if (v[i].status == SPW_OK) left += v[i].m.size;
      continue;
    }
    if (v[i].end == SPW_MOVE_DONE) {
      left += v[i].m.size;
      /* A clean victim keeps its host copy, which is never in peer memory. */
      spw_state_t to = is_clean(&v[i]) ? SPW_STATE_HOST : spw__host_state(&v[i].ext);
      if (to == SPW_STATE_PEER) {
        atomic_fetch_add(&rt->c.peer_spills, 1);
        atomic_fetch_add(&rt->c.peer_spill_bytes, v[i].m.size);
      }
      if (tell)
        spw__report_move(rt, v[i].m.h, v[i].m.owner, SPW_STATE_RESIDENT, to,
                         is_clean(&v[i]) ? 0 : v[i].m.size, dt, SPW_OK);
    } else if (v[i].end == SPW_MOVE_BACK) {
      if (!tell && v[i].status == SPW_OK) continue;
      spw__report_move(rt, v[i].m.h, v[i].m.owner, SPW_STATE_RESIDENT, SPW_STATE_RESIDENT, 0, dt, v[i].status);
    } else {
      v[i].status = v[i].end == SPW_MOVE_FREED ? SPW_ERR_FREED : SPW_ERR_BUSY; /* never left */
    }
  }
  return left;
}

uint64_t spw__spill_batch(spw_runtime_t *rt, spw_victim_t *v, size_t n, spw_spill_reason_t why) {
  return spw__spill_claiming(rt, v, n, NULL, why, spw__d2h(rt));
}
