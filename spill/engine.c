/* SPDX-License-Identifier: Apache-2.0 */
/* The spill engine's lanes (see engine.h): a thread, a stream and a job queue per
 * direction, under one engine mutex. */
#include "engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "clock.h"

/* Device staging per lane stream: a part of 2048 buffers of 4 KiB is 8 MiB; larger runs
 * cross in several transfers. A slice stream's stage holds one such part: a lane's slices
 * together have about as much as before they had streams of their own. */
#define SPW_ENGINE_STAGE_BYTES ((size_t)16 << 20)
#define SPW_ENGINE_SLICE_STAGE_BYTES ((size_t)8 << 20)

typedef struct lane {
  spw_engine_t *e;
  spw_lane_t which;
  pthread_t thread;
  pthread_cond_t cv; /* its worker: jobs, a kick (down lane) or stop */
  spw_job_t *head, *tail;
  spw_stream_t stream;
  /* The slices' streams: [0] is `stream`; slice i of a sliced request copies on [i], so
   * that one slice's gather or scatter on the device runs beside another's transfer instead
   * of taking turns with it on one stream. Fixed from start to stop. */
  spw_stream_t slice[SPW_ENGINE_MAX_SLICES];
  unsigned nslices;
  int busy, started;
  /* Submissions are numbered: `queued` is the last one queued, `done` the last one whose
   * run has ended, so that a waiter waits for what was queued before it and no more. */
  uint64_t queued, taken, done;
} lane_t;

struct spw_engine {
  const spw_backend_ops_t *ops;
  spw_backend_t *be;
  spw_engine_work_t work;
  pthread_mutex_t mu;     /* guards both lanes' queues and flags */
  pthread_cond_t idle_cv; /* waiters: both lanes empty and idle */
  lane_t lanes[2];
  int kicked, untidy, stop;
  int tidy_later;           /* a tidy step asked to run again at tidy_at */
  struct timespec tidy_at;  /* CLOCK_REALTIME, for the down lane's timed wait */
  uint64_t kicks, kick_taken, kick_done; /* numbered as submissions are */
  uint64_t followups; /* jobs queued and kicks made by the lanes' own threads */
};

/* Tidy steps count only while the engine runs: a stopping one leaves them. */
static int has_work(const spw_engine_t *e, const lane_t *l) {
  return l->head || (l->which == SPW_LANE_DOWN && (e->kicked || (e->untidy && !e->stop)));
}

static void *worker(void *arg) {
  lane_t *l = arg;
  spw_engine_t *e = l->e;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (!has_work(e, l) && !e->stop) {
      if (l->which != SPW_LANE_DOWN || !e->tidy_later) {
        pthread_cond_wait(&l->cv, &e->mu);
      } else if (pthread_cond_timedwait(&l->cv, &e->mu, &e->tidy_at) == ETIMEDOUT) {
        e->tidy_later = 0;
        e->untidy = 1;
      }
    }
    if (!has_work(e, l)) break; /* stopped, and nothing is queued */
    spw_job_t *jobs = l->head;
    l->head = l->tail = NULL;
    l->taken = l->queued;
    int background = l->which == SPW_LANE_DOWN && e->kicked;
    if (background) {
      e->kicked = 0;
      e->kick_taken = e->kicks;
    }
    /* One tidy step per round, after the round's work: a step at a time, never ahead of it. */
    int tidy = l->which == SPW_LANE_DOWN && e->untidy;
    if (tidy) e->untidy = 0;
    l->busy = 1;
    pthread_mutex_unlock(&e->mu);

    if (jobs) e->work.run(e->work.ctx, l->which, jobs);
    if (background) e->work.background(e->work.ctx);
    uint64_t next = tidy && e->work.tidy ? e->work.tidy(e->work.ctx) : SPW_TIDY_DONE;

    pthread_mutex_lock(&e->mu);
    l->busy = 0;
    l->done = l->taken;
    if (background) e->kick_done = e->kick_taken;
    if (tidy) { /* the step's answer replaces any later step asked for before */
      e->untidy = e->untidy || next == SPW_TIDY_NOW;
      e->tidy_later = next > SPW_TIDY_NOW;
      if (e->tidy_later) e->tidy_at = spw__deadline_in(next);
    }
    pthread_cond_broadcast(&e->idle_cv);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int spw__engine_start(const spw_backend_ops_t *ops, spw_backend_t *be,
                      const spw_engine_work_t *work, unsigned slices, spw_engine_t **out) {
  if (slices < 1 || slices > SPW_ENGINE_MAX_SLICES) return SPW_ERR_INVALID_ARG;
  spw_engine_t *e = calloc(1, sizeof *e);
  if (!e) return SPW_ERR_SYSTEM;
  e->ops = ops;
  e->be = be;
  e->work = *work;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->idle_cv, NULL);
  int st = SPW_OK;
  for (int i = 0; i < 2; i++) {
    lane_t *l = &e->lanes[i];
    l->e = e;
    l->which = (spw_lane_t)i;
    pthread_cond_init(&l->cv, NULL);
    if (st == SPW_OK) st = ops->stream_create(be, &l->stream);
    /* Staging for the lane's batches of small buffers; without it they go slower. */
    if (st == SPW_OK && ops->stream_stage)
      (void)ops->stream_stage(be, l->stream, SPW_ENGINE_STAGE_BYTES);
    if (st == SPW_OK) {
      l->slice[0] = l->stream;
      l->nslices = 1;
    }
    for (unsigned k = 1; st == SPW_OK && k < slices; k++) {
      if ((st = ops->stream_create(be, &l->slice[k])) != SPW_OK) break;
      l->nslices = k + 1;
      if (ops->stream_stage)
        (void)ops->stream_stage(be, l->slice[k], SPW_ENGINE_SLICE_STAGE_BYTES);
    }
  }
  for (int i = 0; i < 2 && st == SPW_OK; i++) {
    if (pthread_create(&e->lanes[i].thread, NULL, worker, &e->lanes[i]) != 0) st = SPW_ERR_SYSTEM;
    else e->lanes[i].started = 1;
  }
  if (st != SPW_OK) {
    spw__engine_stop(e);
    return st;
  }
  *out = e;
  return SPW_OK;
}

void spw__engine_stop(spw_engine_t *e) {
  if (!e) return;
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  for (int i = 0; i < 2; i++) pthread_cond_signal(&e->lanes[i].cv);
  pthread_mutex_unlock(&e->mu);
  /* Both lanes are joined before anything is destroyed: one lane's last run may still queue
   * on the other (a controller callback), signalling its condition variable. */
  for (int i = 0; i < 2; i++)
    if (e->lanes[i].started) pthread_join(e->lanes[i].thread, NULL);
  for (int i = 0; i < 2; i++) {
    lane_t *l = &e->lanes[i];
    if (l->head && e->work.discard) e->work.discard(e->work.ctx, l->head); /* queued too late */
    for (unsigned k = 1; k < l->nslices; k++) e->ops->stream_destroy(e->be, l->slice[k]);
    if (l->stream) e->ops->stream_destroy(e->be, l->stream);
    pthread_cond_destroy(&l->cv);
  }
  pthread_cond_destroy(&e->idle_cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

spw_stream_t spw__engine_stream(const spw_engine_t *e, spw_lane_t lane) {
  return e->lanes[lane].stream;
}

unsigned spw__engine_slices(const spw_engine_t *e, spw_lane_t lane) {
  return e->lanes[lane].nslices;
}

spw_stream_t spw__engine_slice_stream(const spw_engine_t *e, spw_lane_t lane, unsigned i) {
  const lane_t *l = &e->lanes[lane];
  return l->slice[i % l->nslices];
}

int spw__engine_on_lane(const spw_engine_t *e, spw_lane_t lane) {
  return e && e->lanes[lane].started && pthread_equal(pthread_self(), e->lanes[lane].thread);
}

static int on_lane_thread(const spw_engine_t *e) {
  return spw__engine_on_lane(e, SPW_LANE_DOWN) || spw__engine_on_lane(e, SPW_LANE_UP);
}

void spw__engine_submit(spw_engine_t *e, spw_lane_t lane, spw_job_t *job) {
  lane_t *l = &e->lanes[lane];
  job->next = NULL;
  int followup = on_lane_thread(e);
  pthread_mutex_lock(&e->mu);
  e->followups += (uint64_t)followup;
  if (l->tail) l->tail->next = job;
  else l->head = job;
  l->tail = job;
  l->queued++;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&e->mu);
}

void spw__engine_kick(spw_engine_t *e) {
  if (!e) return; /* before the engine starts or after it stopped: nothing would run it */
  /* A kick from a lane's own thread is the running work's (a prefetch on the up lane asking
   * for headroom, or a spill on demand there for the next host slab): a waiter waits for it
   * as for a job such work queues, or it returns before the pass that work asked for, and
   * the pass moves data after spw_wait_idle (spw_stress in CI). */
  int followup = on_lane_thread(e);
  pthread_mutex_lock(&e->mu);
  e->followups += (uint64_t)followup;
  if (!e->kicked) {
    e->kicked = 1;
    e->kicks++;
    pthread_cond_signal(&e->lanes[SPW_LANE_DOWN].cv);
  }
  pthread_mutex_unlock(&e->mu);
}

void spw__engine_tidy(spw_engine_t *e) {
  if (!e) return;
  pthread_mutex_lock(&e->mu);
  if (!e->untidy) {
    e->untidy = 1;
    pthread_cond_signal(&e->lanes[SPW_LANE_DOWN].cv);
  }
  pthread_mutex_unlock(&e->mu);
}

void spw__engine_wait_idle(spw_engine_t *e) {
  pthread_mutex_lock(&e->mu);
  /* What other threads queue after this point is not waited for: threads that keep sending
   * work cannot hold a waiter for ever. What the awaited work queues itself (a controller
   * callback on a lane ordering a spill) is part of it, and is waited for too. */
  for (;;) {
    uint64_t lane_mark[2] = {e->lanes[0].queued, e->lanes[1].queued}, kick_mark = e->kicks;
    uint64_t followups = e->followups;
    while (e->lanes[0].done < lane_mark[0] || e->lanes[1].done < lane_mark[1] ||
           e->kick_done < kick_mark)
      pthread_cond_wait(&e->idle_cv, &e->mu);
    if (e->followups == followups) break;
  }
  pthread_mutex_unlock(&e->mu);
}
