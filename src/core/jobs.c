/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's work (see jobs.h).
 *
 * Hints go through the pending-hint set first (hint_set.h): a buffer is queued on a lane at
 * most once, whatever the number of calls, and the newest wish for a buffer replaces an
 * older one. So the work a burst of hints leaves behind is at most one move per buffer, and
 * spw_wait_idle, which waits for what was queued before it, waits for no more than that.
 *
 * Each lane takes its whole queue at once: the down lane spills every queued buffer as one
 * batch per tier (demotions go one by one), its slices taking the wishes out of the set and
 * claiming them a part at a time as the batch goes, then spills in the background
 * if usage is above the high watermark, and as housekeeping sweeps freed disk space a little
 * at a time; the up lane brings the host buffers of every queued prefetch back as one
 * batch, then the buffers on disk as another, into room that does not push out earlier
 * prefetches (see spw__device_get_hint in budget.h). */
#include "jobs.h"

#include <stdlib.h>
#include <string.h>

#include "moves.h"

/* Punches per sweep step: a step holds the spill file's mutex, which a read back waits for
 * when it frees its extent, so it stays short; the lane kicks itself for the next step. */
#define SWEEP_PUNCHES_PER_STEP 8

typedef struct job {
  spw_job_t link; /* first: the engine's list runs through it */
  size_t n;
  spw_buf_t *hs; /* points at `one` for a single buffer */
  spw_buf_t one;
} job_t;

/* What a lane took from the set: a buffer and the wish it acts on. */
typedef struct taken {
  spw_buf_t h;
  spw_wish_t wish;
} taken_t;

static spw_lane_t lane_of(spw_wish_t w) { return w == SPW_WISH_PREFETCH ? SPW_LANE_UP : SPW_LANE_DOWN; }

static void free_jobs(spw_job_t *list) {
  while (list) {
    job_t *j = (job_t *)(void *)list;
    list = list->next;
    if (j->hs != &j->one) free(j->hs);
    free(j);
  }
}

/* Records the wish for each buffer and queues on the wish's lane those not queued there
 * yet. A wish equal to the pending one merges only while the buffer is still queued: once
 * its lane has taken it, the lane may have passed it already (skipped it as not where the
 * wish applies, dropped it for want of room), so the wish is queued again, once, and the
 * next run carries it out or finds nothing to do. */
static int submit(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_wish_t wish) {
  spw_lane_t lane = lane_of(wish);
  job_t *j = calloc(1, sizeof *j);
  if (!j) return SPW_ERR_SYSTEM;
  j->hs = &j->one;
  if (n > 1 && !(j->hs = malloc(n * sizeof *j->hs))) {
    free(j);
    return SPW_ERR_SYSTEM;
  }
  int st = SPW_OK;
  uint64_t merged = 0, replaced = 0;
  pthread_mutex_lock(&rt->hints_mu);
  for (size_t i = 0; i < n; i++) {
    spw_hint_t *e = spw__hints_add(&rt->hints, hs[i]);
    if (!e) {
      st = SPW_ERR_SYSTEM; /* what was recorded before stays queued */
      break;
    }
    if (e->wish == (uint8_t)wish && (e->queued & (1u << lane))) {
      merged++;
      continue;
    }
    if (e->wish != SPW_WISH_NONE && e->wish != (uint8_t)wish) replaced++;
    e->wish = (uint8_t)wish;
    if (e->queued & (1u << lane)) continue; /* queued there already for an older wish */
    e->queued |= (uint8_t)(1u << lane);
    j->hs[j->n++] = hs[i];
  }
  /* Queued before hints_mu goes: a thread whose equal hint merges with these must find the
   * job queued, or its spw_wait_idle could return before the job exists. */
  const size_t queued = j->n; /* once queued, the job is the lane's: never read it again */
  if (queued > 0) spw__engine_submit(rt->engine, lane, &j->link);
  pthread_mutex_unlock(&rt->hints_mu);
  if (merged) atomic_fetch_add_explicit(&rt->c.hints_merged, merged, memory_order_relaxed);
  if (replaced) atomic_fetch_add_explicit(&rt->c.hints_replaced, replaced, memory_order_relaxed);
  if (queued == 0) free_jobs(&j->link);
  return st;
}

/* Takes hs[0..n)'s wishes for `lane` out of the set: those whose wish is this lane's go to
 * out[] (returns how many), the others are left to the lane their wish names. A taken wish
 * leaves the set at once (one pass over the buffers, not a second one to settle them when
 * the run ends): from now on it is the lane's work, no longer a pending hint, so an equal
 * hint sent while the lane works is queued again, once (the lane may have passed the buffer
 * already), and a different one is a new wish, not a replacement. With out NULL (no memory
 * for the list) the wishes are dropped, as a hint may be. */
static size_t take_some(spw_runtime_t *rt, spw_lane_t lane, const spw_buf_t *hs, size_t n,
                        taken_t *out) {
  size_t got = 0, dropped = 0;
  pthread_mutex_lock(&rt->hints_mu);
  for (size_t i = 0; i < n; i++) {
    spw_hint_t *e = spw__hints_find(&rt->hints, hs[i]);
    if (!e) continue;
    /* Read once, written once: a byte store then a wider load of the same cell stalls. */
    uint8_t wish = e->wish, queued = (uint8_t)(e->queued & ~(1u << lane));
    if (wish != SPW_WISH_NONE && lane_of((spw_wish_t)wish) == lane) {
      if (out) out[got++] = (taken_t){hs[i], (spw_wish_t)wish};
      wish = SPW_WISH_NONE;
    }
    if (wish == SPW_WISH_NONE && queued == 0) {
      *e = (spw_hint_t){0};
      dropped++;
    } else {
      e->wish = wish;
      e->queued = queued;
    }
  }
  spw__hints_count(&rt->hints, -(ptrdiff_t)dropped);
  pthread_mutex_unlock(&rt->hints_mu);
  return got;
}

/* Takes every queued buffer of `jobs` for `lane` at once (take_some): returned malloc'd, *n
 * of them; NULL when there is no memory for the list (the wishes dropped). */
static taken_t *take(spw_runtime_t *rt, spw_lane_t lane, spw_job_t *jobs, size_t *n) {
  size_t cap = 0;
  for (spw_job_t *l = jobs; l; l = l->next) cap += ((job_t *)(void *)l)->n;
  taken_t *t = malloc((cap ? cap : 1) * sizeof *t);
  *n = 0;
  for (spw_job_t *l = jobs; l; l = l->next) {
    job_t *j = (job_t *)(void *)l;
    *n += take_some(rt, lane, j->hs, j->n, t ? t + *n : NULL);
  }
  if (!t) spw__set_async_error(rt, SPW_ERR_SYSTEM);
  return t;
}

/* One buffer of a spill request: a demotion runs at once, a spill is claimed into the batch
 * of its tier. A buffer moved meanwhile is left alone. */
static void spill_one(spw_runtime_t *rt, spw_buf_t h, spw_tier_t tier, spw_victim_t *v,
                      size_t *nv, spw_victim_t **vd, size_t *nvd, uint64_t *begun) {
  spw_slot_t *s;
  uint64_t w;
  if (spw__handles_lookup(&rt->handles, h, &s, &w) != SPW_OK) return;
  if (spw__w_state(w) == SPW_STATE_HOST && tier == SPW_TIER_DISK) {
    spw__demote(rt, h, SPW_CLAIM_WAIT, 1); /* a failure is reported by the move */
    return;
  }
  if (spw__w_state(w) != SPW_STATE_RESIDENT) return;
  spw_victim_t one;
  if (!spw__victim_begin(rt, h, s, SPW_CLAIM_WAIT, &one)) {
    /* Locked again since the request: say so; the buffer stays resident. */
    w = atomic_load(&s->word);
    if (spw__w_gen(w) == spw__handle_gen(h) && spw__w_count(w) > 0)
      spw__report_move(rt, h, atomic_load(&s->owner), SPW_STATE_RESIDENT, SPW_STATE_RESIDENT, 0, 0, SPW_ERR_LOCKED);
    return;
  }
  *begun += one.m.size;
  if (tier == SPW_TIER_DISK) *vd[(*nvd)++] = one;
  else v[(*nv)++] = one;
}

/* Wishes taken from the set at a time by a slice of the down lane's run. */
#define TAKE_CHUNK 256

/* The buffers of a slice of the down lane's run, taken from the set and claimed as its
 * batch's parts need them (the take and the claims of a part run while the previous part
 * copies, on the slice's thread, not all on the lane's before the first copy): host victims
 * go where the batch says, disk victims fill the slice's array from the back (vd[k] points
 * at v[n - 1 - k]): together they never hold more than n. */
typedef struct spill_source {
  spw_runtime_t *rt;
  const spw_buf_t *hs;
  size_t n, next; /* the next buffer to take */
  spw_victim_t **vd;
  size_t nvd;
  taken_t taken[TAKE_CHUNK];
  size_t have, used;
} spill_source_t;

static size_t claim_spills(void *ctx, spw_victim_t *v, size_t max) {
  spill_source_t *c = ctx;
  size_t nv = 0;
  uint64_t begun = 0;
  while (nv < max) {
    if (c->used == c->have) {
      if (c->next == c->n) break;
      size_t k = c->n - c->next < TAKE_CHUNK ? c->n - c->next : TAKE_CHUNK;
      c->have = take_some(c->rt, SPW_LANE_DOWN, c->hs + c->next, k, c->taken);
      c->used = 0;
      c->next += k;
      continue;
    }
    const taken_t *t = &c->taken[c->used++];
    spill_one(c->rt, t->h, t->wish == SPW_WISH_DISK ? SPW_TIER_DISK : SPW_TIER_HOST, v, &nv,
              c->vd, &c->nvd, &begun);
  }
  /* One add for every spill begun above (each part's end subtracts its own), before any
   * of them can end. */
  if (begun) spw__budget_spill_started(c->rt, begun);
  return nv;
}

/* Spills what hs[0..n) wish: the host tier's as one batch that takes and claims its
 * victims a part at a time, copying on `d2h`, then the disk tier's. */
static void spill_some(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_victim_t *v,
                       spw_victim_t **vd, spw_stream_t d2h) {
  for (size_t k = 0; k < n; k++) vd[k] = &v[n - 1 - k];
  spill_source_t c = {.rt = rt, .hs = hs, .n = n, .vd = vd};
  spw_victim_source_t src = {claim_spills, &c};
  spw__spill_claiming(rt, v, n, &src, SPW_SPILL_EXPLICIT, d2h);
  /* A batch that failed to start took none: their wishes must not stay queued in the set,
   * where an equal hint would merge with them and never be queued again. */
  if (c.next < n) take_some(rt, SPW_LANE_DOWN, hs + c.next, n - c.next, NULL);
  if (c.nvd > 0) spw__spill_to_disk_n(rt, vd, c.nvd, SPW_SPILL_EXPLICIT);
}

typedef struct slices {
  spw_runtime_t *rt;
  const spw_buf_t *hs;
  size_t n;
  unsigned count;
  spw_victim_t *v;
  spw_victim_t **vd;
} slices_t;

/* Slice i copies on a stream of its own, so that its gathers on the device run beside the
 * other slices' transfers instead of taking turns with them on one stream. */
static void spill_slice(void *ctx, unsigned i) {
  const slices_t *c = ctx;
  size_t lo = c->n * i / c->count, hi = c->n * (i + 1) / c->count;
  spill_some(c->rt, c->hs + lo, hi - lo, c->v + lo, c->vd + lo,
             spw__engine_slice_stream(c->rt->engine, SPW_LANE_DOWN, i));
}

static void run_spills(spw_runtime_t *rt, const spw_buf_t *hs, size_t n) {
  if (n == 0) return;
  spw_victim_t *v = malloc(n * sizeof *v);
  spw_victim_t **vd = malloc(n * sizeof *vd);
  if (!v || !vd) {
    free(v);
    free(vd);
    take_some(rt, SPW_LANE_DOWN, hs, n, NULL); /* dropped, as a hint may be (spill_some) */
    spw__set_async_error(rt, SPW_ERR_SYSTEM);
    return;
  }
  /* Spill batches already run side by side (a spill on demand beside the lane's): the
   * slices are disjoint, and each is one as the whole was. */
  slices_t c = {rt, hs, n, spw__slice_count(rt, SPW_LANE_DOWN, n), v, vd};
  spw__workers_run(rt->workers[SPW_LANE_DOWN], spill_slice, &c, c.count);
  free(v);
  free(vd);
}

static void run_prefetches(spw_runtime_t *rt, const taken_t *t, size_t n) {
  if (n == 0) return;
  spw_buf_t *all = malloc(n * sizeof *all);
  if (!all) {
    spw__set_async_error(rt, SPW_ERR_SYSTEM);
    return;
  }
  for (size_t i = 0; i < n; i++) all[i] = t[i].h;
  /* The host tier's part in slices, as run_spills does; the disk's after it, on this
   * thread (one staging pipeline: slices would only take turns), unless the slices found
   * every buffer on host or on the device: then its look at each would find nothing. */
  size_t elsewhere = 0;
  const spw_up_how_t how = {.hint = 1, .keep = 1};
  spw__prefetch_sliced(rt, all, n, &how, &elsewhere);
  if (elsewhere) spw__prefetch_from_disk(rt, all, n, 1);
  free(all);
}

/* Spilling has begun or is coming: pin the next host slab now, off the path of whoever will
 * need it (mapping and pinning cost a third of a second per GiB, and the transfers running
 * meanwhile lose about as much). Judged by the spilled data and the spills on their way, not
 * by the bytes in use: clean copies of prefetched buffers and extents freed behind copies
 * still landing come and go in a steady state of prefetches, and every slab pinned for them
 * was a guess no spill needed (bench/oversubscribe on an H100: each sweep that pinned one ran
 * at 1.22-1.37x the duplex floor, the others at about 1). */
static void pin_ahead(spw_runtime_t *rt) {
  spw_budget_t *b = &rt->budget;
  if (atomic_load(&b->used) > b->limit / 2)
    spw__arena_grow_ahead(rt->arena, atomic_load(&rt->c.host_bytes) + atomic_load(&b->spilling));
}

static void background(void *ctx) {
  spw_runtime_t *rt = ctx;
  if (rt->trace) spw__trace_lane(rt->trace, SPW_LANE_DOWN);
  spw_budget_t *b = &rt->budget;
  pin_ahead(rt);
  /* Down to the low watermark once above the high one; and once above the low one when
   * prefetches want headroom (budget.c, reserve_for_hint), then among the buffers a
   * prefetch may push out only: never one that a prefetch brought back. */
  const int for_hints = atomic_exchange(&b->hint_headroom, 0);
  int spilled = 0;
  for (;;) {
    uint64_t used = atomic_load(&b->used), out = atomic_load(&b->spilling);
    uint64_t on = used > out ? used - out : 0;
    uint64_t gone = 0;
    if (on > b->high) {
      gone = spw__spill_lru(rt, on - b->low, SPW_SPILL_BACKGROUND, NULL);
    } else if (for_hints && on > b->low) {
      gone = spw__spill_for_hint(rt, on - b->low, SPW_SPILL_BACKGROUND);
    }
    if (gone == 0) break;
    spilled = 1;
  }
  /* A spill batch kicks the down lane to pin ahead for the host memory it took
   * (spill_move.c), but not on this thread: here the pass does it. A pass that kicked the
   * next one would hold spw_wait_idle for as long as other threads keep usage high. */
  if (spilled) pin_ahead(rt);
}

/* Freed disk space goes back to the file system here, a step at a time, never on the path
 * that brings buffers back (issue 17: a whole sweep there stalled every read), and only while
 * the disk tier is quiet (a punch beside a transfer stalls it: disk_tier.c). It moves no
 * data, so spw_wait_idle does not wait for it (engine.h). */
static uint64_t tidy(void *ctx) {
  spw_runtime_t *rt = ctx;
  pthread_mutex_lock(&rt->disk_mu);
  spw_disk_t *disk = rt->disk; /* not opened for this: nothing to sweep if it is not open */
  pthread_mutex_unlock(&rt->disk_mu);
  uint64_t later = 0;
  if (disk && spw__disk_sweep(disk, SWEEP_PUNCHES_PER_STEP, &later)) return SPW_TIDY_NOW;
  return later ? later : SPW_TIDY_DONE; /* later: the disk was busy, try once it is quiet */
}

static void run(void *ctx, spw_lane_t lane, spw_job_t *jobs) {
  spw_runtime_t *rt = ctx;
  if (rt->trace) spw__trace_lane(rt->trace, (int)lane);
  size_t n = 0;
  if (lane == SPW_LANE_DOWN) {
    /* The slices take the wishes themselves, a part at a time. */
    for (spw_job_t *l = jobs; l; l = l->next) n += ((job_t *)(void *)l)->n;
    spw_buf_t *hs = malloc((n ? n : 1) * sizeof *hs);
    if (hs) {
      size_t at = 0;
      for (spw_job_t *l = jobs; l; l = l->next) {
        job_t *j = (job_t *)(void *)l;
        memcpy(hs + at, j->hs, j->n * sizeof *hs);
        at += j->n;
      }
      free_jobs(jobs);
      run_spills(rt, hs, n);
    } else {
      /* No memory for the list: the wishes are dropped, as a hint may be. */
      for (spw_job_t *l = jobs; l; l = l->next)
        take_some(rt, lane, ((job_t *)(void *)l)->hs, ((job_t *)(void *)l)->n, NULL);
      spw__set_async_error(rt, SPW_ERR_SYSTEM);
      free_jobs(jobs);
    }
    free(hs);
  } else {
    taken_t *t = take(rt, lane, jobs, &n);
    free_jobs(jobs);
    run_prefetches(rt, t, n);
    free(t);
  }
  if (lane == SPW_LANE_DOWN) background(rt); /* locks released since the last kick may have left usage high */
}

static void discard(void *ctx, spw_job_t *jobs) {
  (void)ctx;
  free_jobs(jobs);
}

spw_engine_work_t spw__jobs_work(spw_runtime_t *rt) {
  return (spw_engine_work_t){
      .run = run, .background = background, .tidy = tidy, .discard = discard, .ctx = rt};
}

int spw__jobs_spill(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_tier_t tier) {
  return submit(rt, hs, n, tier == SPW_TIER_DISK ? SPW_WISH_DISK : SPW_WISH_HOST);
}

int spw__jobs_prefetch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n) {
  return submit(rt, hs, n, SPW_WISH_PREFETCH);
}

void spw__jobs_fulfilled(spw_runtime_t *rt, spw_buf_t h, spw_tier_t tier) {
  spw_wish_t wish = tier == SPW_TIER_DEVICE ? SPW_WISH_PREFETCH
                    : tier == SPW_TIER_DISK ? SPW_WISH_DISK
                                            : SPW_WISH_HOST;
  /* The common case (no hint pending anywhere: a program that prefetches what it is about
   * to use, or never hints at all) takes no lock. A hint sent before this call by this
   * thread, or by one this call is ordered after, was counted before it was let go. */
  if (atomic_load(&rt->hints.n) == 0) return;
  int replaced = 0;
  pthread_mutex_lock(&rt->hints_mu);
  spw_hint_t *e = spw__hints_find(&rt->hints, h);
  if (e && e->wish != SPW_WISH_NONE && e->wish != (uint8_t)wish) {
    /* The newest wish is that the buffer stay where it is: the lane that finds the older
     * one's handle in its queue now skips it. */
    e->wish = SPW_WISH_NONE;
    replaced = 1;
    if (e->queued == 0) spw__hints_drop(&rt->hints, e);
  }
  pthread_mutex_unlock(&rt->hints_mu);
  if (replaced) atomic_fetch_add_explicit(&rt->c.hints_replaced, 1, memory_order_relaxed);
}

size_t spw__jobs_pending(spw_runtime_t *rt) { return atomic_load(&rt->hints.n); }
