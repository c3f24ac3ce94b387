/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's work (see jobs.h). Each lane takes its whole queue at once: the down lane
 * claims the spills of every queued request into one batch per tier (demotions go one by
 * one), then spills in the background if usage is above the high watermark; the up lane
 * brings the host buffers of every queued prefetch back as one batch, then the buffers on
 * disk as another. */
#include "jobs.h"

#include <stdlib.h>

#include "moves.h"

typedef struct job {
  spw_job_t link; /* first: the engine's list runs through it */
  spw_tier_t tier;
  size_t n;
  spw_buf_t *hs; /* points at `one` for a single buffer */
  spw_buf_t one;
} job_t;

static job_t *new_job(const spw_buf_t *hs, size_t n) {
  job_t *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->n = n;
  j->hs = &j->one;
  if (n > 1 && !(j->hs = malloc(n * sizeof *j->hs))) {
    free(j);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) j->hs[i] = hs[i];
  return j;
}

static void free_jobs(spw_job_t *list) {
  while (list) {
    job_t *j = (job_t *)(void *)list;
    list = list->next;
    if (j->hs != &j->one) free(j->hs);
    free(j);
  }
}

/* One buffer of a spill request: a demotion runs at once, a spill is claimed into the batch
 * of its tier. A buffer moved meanwhile is left alone. */
static void spill_one(spw_runtime_t *rt, spw_buf_t h, spw_tier_t tier, spw_victim_t *v,
                      size_t *nv, spw_victim_t **vd, size_t *nvd) {
  spw_slot_t *s;
  uint64_t w;
  if (spw__handles_lookup(&rt->handles, h, &s, &w) != SPW_OK) return;
  if (spw__w_state(w) == SPW_STATE_HOST && tier == SPW_TIER_DISK) {
    spw__demote(rt, h, SPW_CLAIM_WAIT); /* a failure is reported by the move */
    return;
  }
  if (spw__w_state(w) != SPW_STATE_RESIDENT) return;
  spw_victim_t one;
  if (!spw__victim_claim(rt, h, s, SPW_CLAIM_WAIT, &one)) {
    /* Locked again since the request: say so; the buffer stays resident. */
    w = atomic_load(&s->word);
    if (spw__w_gen(w) == spw__handle_gen(h) && spw__w_count(w) > 0)
      spw__report_move(rt, h, SPW_STATE_RESIDENT, SPW_STATE_RESIDENT, 0, 0, SPW_ERR_LOCKED);
    return;
  }
  if (tier == SPW_TIER_DISK) *vd[(*nvd)++] = one;
  else v[(*nv)++] = one;
}

static void run_spills(spw_runtime_t *rt, spw_job_t *jobs) {
  size_t n = 0;
  for (spw_job_t *l = jobs; l; l = l->next) n += ((job_t *)(void *)l)->n;
  if (n == 0) return;
  /* Host victims fill `v` from the front, disk victims from the back (vd[k] points at
   * v[n - 1 - k]): together they never hold more than n. */
  spw_victim_t *v = malloc(n * sizeof *v);
  spw_victim_t **vd = malloc(n * sizeof *vd);
  if (!v || !vd) {
    free(v);
    free(vd);
    spw__set_async_error(rt, SPW_ERR_SYSTEM);
    return;
  }
  for (size_t k = 0; k < n; k++) vd[k] = &v[n - 1 - k];
  size_t nv = 0, nvd = 0;
  for (spw_job_t *l = jobs; l; l = l->next) {
    job_t *j = (job_t *)(void *)l;
    for (size_t i = 0; i < j->n; i++) spill_one(rt, j->hs[i], j->tier, v, &nv, vd, &nvd);
  }
  if (nv > 0) spw__spill_batch(rt, v, nv, SPW_SPILL_EXPLICIT);
  if (nvd > 0) spw__spill_to_disk_n(rt, vd, nvd, SPW_SPILL_EXPLICIT);
  free(v);
  free(vd);
}

static void run_prefetches(spw_runtime_t *rt, spw_job_t *jobs) {
  size_t n = 0;
  for (spw_job_t *l = jobs; l; l = l->next) n += ((job_t *)(void *)l)->n;
  if (n == 0) return;
  spw_buf_t *all = malloc(n * sizeof *all);
  if (!all) {
    spw__set_async_error(rt, SPW_ERR_SYSTEM);
    return;
  }
  size_t k = 0;
  for (spw_job_t *l = jobs; l; l = l->next) {
    job_t *j = (job_t *)(void *)l;
    for (size_t i = 0; i < j->n; i++) all[k++] = j->hs[i];
  }
  spw__prefetch_batch(rt, all, n);
  spw__prefetch_from_disk(rt, all, n);
  free(all);
}

static void background(void *ctx) {
  spw_runtime_t *rt = ctx;
  if (rt->trace) spw__trace_lane(rt->trace, SPW_LANE_DOWN);
  spw_budget_t *b = &rt->budget;
  /* Spilling has begun or is coming: pin the next host slab now, off the path of whoever
   * will need it (mapping and pinning cost a third of a second per GiB). */
  if (atomic_load(&b->used) > b->limit / 2) spw__arena_grow_ahead(rt->arena);
  for (;;) {
    uint64_t used = atomic_load(&b->used), out = atomic_load(&b->spilling);
    if (used <= out || used - out <= b->high) return;
    if (spw__spill_lru(rt, used - out - b->low, SPW_SPILL_BACKGROUND, NULL) == 0) return;
  }
}

static void run(void *ctx, spw_lane_t lane, spw_job_t *jobs) {
  spw_runtime_t *rt = ctx;
  if (rt->trace) spw__trace_lane(rt->trace, (int)lane);
  if (lane == SPW_LANE_DOWN) {
    run_spills(rt, jobs);
    background(rt); /* locks released since the last kick may have left usage high */
  } else {
    run_prefetches(rt, jobs);
  }
  free_jobs(jobs);
}

spw_engine_work_t spw__jobs_work(spw_runtime_t *rt) {
  return (spw_engine_work_t){.run = run, .background = background, .ctx = rt};
}

int spw__jobs_spill(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_tier_t tier) {
  job_t *j = new_job(hs, n);
  if (!j) return SPW_ERR_SYSTEM;
  j->tier = tier;
  spw__engine_submit(rt->engine, SPW_LANE_DOWN, &j->link);
  return SPW_OK;
}

int spw__jobs_prefetch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n) {
  job_t *j = new_job(hs, n);
  if (!j) return SPW_ERR_SYSTEM;
  spw__engine_submit(rt->engine, SPW_LANE_UP, &j->link);
  return SPW_OK;
}
