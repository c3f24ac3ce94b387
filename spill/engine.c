/* SPDX-License-Identifier: Apache-2.0 */
/* The spill engine's workers, one per direction like the copy streams, because the link is
 * full duplex: the down lane runs spills (explicit ones, and the background spiller that
 * keeps device usage under the high watermark, down to the low one), the up lane runs
 * prefetches. Each lane takes its queued jobs in bulk, so requests queued together move as
 * one batch. Background spilling is triggered by a kick from the reservation path, so that
 * allocations and prefetches usually find room without spilling on demand. */
#include <stdlib.h>

#include "disk_tier.h"
#include "engine.h"

typedef enum { JOB_SPILL, JOB_PREFETCH } job_kind_t;

/* One request: a single buffer (stored in `one`) or many (spw_spill_n / spw_prefetch_n). */
typedef struct job {
  job_kind_t kind;
  spw_tier_t tier;
  spw_stream_t bstream;
  size_t n;
  spw_buf_t *hs; /* points at `one` for a single buffer */
  spw_buf_t one;
  struct job *next;
} job_t;

typedef struct lane {
  spw_runtime_t *rt;
  pthread_t thread;
  pthread_cond_t cv; /* its worker: jobs, a kick (down lane) or stop */
  job_t *head, *tail;
  int busy, started, down;
} lane_t;

struct spw_engine {
  pthread_mutex_t mu;     /* guards both lanes' queues and flags */
  pthread_cond_t idle_cv; /* waiters: both lanes empty and idle */
  lane_t down, up;
  int kicked, stop;
  spw_stream_t d2h, h2d;
};

spw_stream_t spw__engine_d2h(spw_runtime_t *rt) { return rt->engine->d2h; }
spw_stream_t spw__engine_h2d(spw_runtime_t *rt) { return rt->engine->h2d; }

/* One buffer of a spill request: demotions and direct disk spills run at once, host spills
 * are claimed into the batch. */
static void spill_one(spw_runtime_t *rt, spw_buf_t h, spw_tier_t tier, spw_victim_t *v, size_t *nv) {
  spw_slot_t *s;
  uint64_t w;
  if (spw__handles_lookup(&rt->handles, h, &s, &w) != SPW_OK) return;
  uint32_t state = spw__w_state(w);
  if (state == SPW_STATE_HOST && tier == SPW_TIER_DISK) {
    int st = spw__demote(rt, h);
    if (st != SPW_OK && st != SPW_ERR_BUSY && st != SPW_ERR_FREED) spw__set_async_error(rt, st);
    return;
  }
  if (state != SPW_STATE_RESIDENT) return; /* moved meanwhile: nothing to do */
  spw_victim_t one;
  if (!spw__victim_claim(rt, h, s, &one)) {
    /* Locked again since the request: report it, the buffer stays resident. */
    spw_state_event_t ev = {h, SPW_STATE_RESIDENT, SPW_STATE_RESIDENT, 0, 0, SPW_ERR_LOCKED};
    spw__notify_state(rt, &ev);
    return;
  }
  if (tier == SPW_TIER_DISK) {
    int st = spw__spill_to_disk(rt, &one);
    if (st != SPW_OK && st != SPW_ERR_BUSY) spw__set_async_error(rt, st);
  } else {
    v[(*nv)++] = one;
  }
}

static void run_spills(spw_runtime_t *rt, job_t *jobs) {
  size_t n = 0;
  for (job_t *j = jobs; j; j = j->next)
    if (j->kind == JOB_SPILL) n += j->n;
  if (n == 0) return;
  spw_victim_t *v = malloc(n * sizeof *v);
  if (!v) {
    spw__set_async_error(rt, SPW_ERR_SYSTEM);
    return;
  }
  size_t nv = 0;
  for (job_t *j = jobs; j; j = j->next)
    if (j->kind == JOB_SPILL)
      for (size_t i = 0; i < j->n; i++) spill_one(rt, j->hs[i], j->tier, v, &nv);
  if (nv > 0) spw__spill_batch(rt, v, nv, 0);
  free(v);
}

/* Prefetches: buffers on host go back as one batch; buffers on disk one by one through the
 * staging pipeline. */
static void run_prefetches(spw_runtime_t *rt, job_t *jobs) {
  if (!jobs) return;
  /* Every queued request's host buffers in one batch. */
  size_t n = 0;
  for (job_t *j = jobs; j; j = j->next) n += j->n;
  spw_buf_t *all = jobs && !jobs->next ? jobs->hs : malloc(n * sizeof *all);
  if (all) {
    if (all != jobs->hs) {
      size_t k = 0;
      for (job_t *j = jobs; j; j = j->next)
        for (size_t i = 0; i < j->n; i++) all[k++] = j->hs[i];
    }
    spw__unspill_host_batch(rt, all, n);
    if (all != jobs->hs) free(all);
  } else {
    for (job_t *j = jobs; j; j = j->next) spw__unspill_host_batch(rt, j->hs, j->n);
  }
  for (job_t *j = jobs; j; j = j->next) {
    for (size_t i = 0; i < j->n; i++) {
      spw_slot_t *s;
      uint64_t w;
      if (spw__handles_lookup(&rt->handles, j->hs[i], &s, &w) != SPW_OK) continue;
      if (spw__w_state(w) != SPW_STATE_DISK) continue;
      spw_state_event_t ev = {0};
      void *d;
      int st = SPW_OK;
      pthread_mutex_lock(&s->mu);
      w = atomic_load(&s->word);
      if (spw__w_gen(w) == spw__handle_gen(j->hs[i]) && !(w & SPW_W_FREE_PENDING) &&
          spw__w_state(w) == SPW_STATE_DISK)
        st = spw__unspill_disk(rt, s, j->hs[i], j->bstream, 0, 0, &d, &ev);
      pthread_mutex_unlock(&s->mu);
      if (ev.buf) spw__notify_state(rt, &ev);
      if (st != SPW_OK && st != SPW_ERR_FREED) spw__set_async_error(rt, st);
    }
  }
}

static void free_jobs(job_t *jobs) {
  while (jobs) {
    job_t *n = jobs->next;
    if (jobs->hs != &jobs->one) free(jobs->hs);
    free(jobs);
    jobs = n;
  }
}

static void run_background(spw_runtime_t *rt) {
  for (;;) {
    uint64_t used = atomic_load(&rt->device_used);
    uint64_t out = atomic_load(&rt->spilling_bytes);
    if (used <= out || used - out <= rt->high_bytes) return;
    if (spw__spill_lru(rt, used - out - rt->low_bytes, 1) == 0) return;
  }
}

static int lane_has_work(const spw_engine_t *e, const lane_t *l) {
  return l->head || (l->down && e->kicked);
}

static void *worker(void *arg) {
  lane_t *l = arg;
  spw_runtime_t *rt = l->rt;
  spw_engine_t *e = rt->engine;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (!lane_has_work(e, l) && !e->stop) pthread_cond_wait(&l->cv, &e->mu);
    if (!lane_has_work(e, l) && e->stop) break;
    job_t *jobs = l->head;
    l->head = l->tail = NULL;
    if (l->down) e->kicked = 0;
    l->busy = 1;
    pthread_mutex_unlock(&e->mu);

    if (l->down) {
      run_spills(rt, jobs);
      free_jobs(jobs);
      run_background(rt);
    } else {
      run_prefetches(rt, jobs);
      free_jobs(jobs);
    }

    pthread_mutex_lock(&e->mu);
    l->busy = 0;
    pthread_cond_broadcast(&e->idle_cv);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

static int start_lane(spw_runtime_t *rt, lane_t *l, int down) {
  l->rt = rt;
  l->down = down;
  pthread_cond_init(&l->cv, NULL);
  if (pthread_create(&l->thread, NULL, worker, l) != 0) return SPW_ERR_SYSTEM;
  l->started = 1;
  return SPW_OK;
}

int spw__engine_start(spw_runtime_t *rt) {
  spw_engine_t *e = calloc(1, sizeof *e);
  if (!e) return SPW_ERR_SYSTEM;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->idle_cv, NULL);
  rt->engine = e;
  int st = rt->ops->stream_create(rt->be, &e->d2h);
  if (st == SPW_OK) st = rt->ops->stream_create(rt->be, &e->h2d);
  if (st == SPW_OK) st = start_lane(rt, &e->down, 1);
  if (st == SPW_OK) st = start_lane(rt, &e->up, 0);
  return st; /* on error the caller runs spw__engine_stop */
}

void spw__engine_stop(spw_runtime_t *rt) {
  spw_engine_t *e = rt->engine;
  if (!e) return;
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  pthread_cond_signal(&e->down.cv);
  pthread_cond_signal(&e->up.cv);
  pthread_mutex_unlock(&e->mu);
  lane_t *lanes[2] = {&e->down, &e->up};
  for (int i = 0; i < 2; i++) {
    if (lanes[i]->started) pthread_join(lanes[i]->thread, NULL);
    if (lanes[i]->rt) pthread_cond_destroy(&lanes[i]->cv);
  }
  if (e->d2h) rt->ops->stream_destroy(rt->be, e->d2h);
  if (e->h2d) rt->ops->stream_destroy(rt->be, e->h2d);
  pthread_cond_destroy(&e->idle_cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
  rt->engine = NULL;
}

void spw__engine_kick(spw_runtime_t *rt) {
  spw_engine_t *e = rt->engine;
  pthread_mutex_lock(&e->mu);
  if (!e->kicked) {
    e->kicked = 1;
    pthread_cond_signal(&e->down.cv);
  }
  pthread_mutex_unlock(&e->mu);
}

static int submit(spw_runtime_t *rt, job_t *j) {
  spw_engine_t *e = rt->engine;
  lane_t *l = j->kind == JOB_SPILL ? &e->down : &e->up;
  pthread_mutex_lock(&e->mu);
  j->next = NULL;
  if (l->tail) l->tail->next = j;
  else l->head = j;
  l->tail = j;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&e->mu);
  return SPW_OK;
}

/* A job for n handles (copied: the caller's array is not kept). */
static job_t *new_job(job_kind_t kind, const spw_buf_t *hs, size_t n) {
  job_t *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->kind = kind;
  j->n = n;
  if (n == 1) {
    j->one = hs[0];
    j->hs = &j->one;
    return j;
  }
  j->hs = malloc(n * sizeof *j->hs);
  if (!j->hs) {
    free(j);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) j->hs[i] = hs[i];
  return j;
}

int spw__engine_submit_spill(spw_runtime_t *rt, const spw_buf_t *hs, size_t n, spw_tier_t tier) {
  job_t *j = new_job(JOB_SPILL, hs, n);
  if (!j) return SPW_ERR_SYSTEM;
  j->tier = tier;
  return submit(rt, j);
}

int spw__engine_submit_prefetch(spw_runtime_t *rt, const spw_buf_t *hs, size_t n,
                                spw_stream_t bstream) {
  job_t *j = new_job(JOB_PREFETCH, hs, n);
  if (!j) return SPW_ERR_SYSTEM;
  j->bstream = bstream;
  return submit(rt, j);
}

void spw__engine_wait_idle(spw_runtime_t *rt) {
  spw_engine_t *e = rt->engine;
  pthread_mutex_lock(&e->mu);
  while (e->down.head || e->down.busy || e->kicked || e->up.head || e->up.busy)
    pthread_cond_wait(&e->idle_cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
}
