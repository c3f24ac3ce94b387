/* SPDX-License-Identifier: Apache-2.0 */
/* The spill move, device -> host, for a batch of victims at once.
 *
 * All victims' copies go out as one copy_batch on the engine's download stream (one kernel
 * for the small ones, copy engines for the large ones), then one event; the device memory is
 * freed only after that event has completed, behind the copy on the same stream. A victim
 * with a clean host copy (read-only since its last unspill) moves no bytes. A victim an
 * acquire took back meanwhile (move_seq bumped) keeps its device copy and the host copy is
 * thrown away. On a failed copy every victim of the batch stays RESIDENT. */
#include <stdlib.h>

#include "disk_tier.h"
#include "engine.h"

int spw__victim_claim(spw_runtime_t *rt, spw_buf_t h, spw_slot_t *s, spw_victim_t *v) {
  if (pthread_mutex_trylock(&s->mu) != 0) return 0;
  uint64_t w = atomic_load(&s->word);
  int ok = spw__w_gen(w) == spw__handle_gen(h) && spw__w_state(w) == SPW_STATE_RESIDENT &&
           spw__w_count(w) == 0 && !(w & SPW_W_FREE_PENDING) &&
           atomic_compare_exchange_strong(&s->word, &w, spw__w_with_state(w, SPW_STATE_SPILLING));
  if (ok) {
    v->h = h;
    v->s = s;
    v->size = s->size;
    v->seq = s->move_seq;
    v->clean = (w & SPW_W_CLEAN) != 0;
    v->landing = (w & SPW_W_WAIT) != 0;
    v->to_disk = 0;
    v->ext = (spw_host_extent_t){0};
    v->status = SPW_OK;
    atomic_fetch_add(&rt->spilling_bytes, v->size);
  }
  pthread_mutex_unlock(&s->mu);
  return ok;
}

/* Commits one victim under its mutex; returns 1 if it reached HOST. */
static int commit(spw_runtime_t *rt, spw_victim_t *v, spw_stream_t d2h) {
  spw_slot_t *s = v->s;
  pthread_mutex_lock(&s->mu);
  uint64_t w = atomic_load(&s->word);
  if (spw__w_state(w) != SPW_STATE_SPILLING || s->move_seq != v->seq) {
    /* An acquire took it back; the copy (complete by now) is worthless. */
    pthread_mutex_unlock(&s->mu);
    if (!v->clean) spw__arena_free(rt->arena, &v->ext);
    if (v->status == SPW_OK) v->status = SPW_ERR_BUSY;
    return 0;
  }
  if (w & SPW_W_FREE_PENDING) {
    if (!v->clean) spw__arena_free(rt->arena, &v->ext);
    if (v->status == SPW_OK) v->status = SPW_ERR_FREED;
    spw__buffer_finish_free(rt, s, v->h); /* unlocks */
    return 0;
  }
  if (v->status != SPW_OK) {
    atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_RESIDENT));
    pthread_mutex_unlock(&s->mu);
    if (!v->clean) spw__arena_free(rt->arena, &v->ext);
    return 0;
  }
  if (!v->clean) s->host = v->ext;
  /* A dirty victim's copy waited for any unspill into it and has completed. A clean victim
   * moved nothing, so an unspill copy may still be landing in its memory: free behind it. */
  if (v->clean && v->landing) spw__dpool_free_after(rt, s->dptr, s->size, spw__engine_h2d(rt));
  else spw__dpool_free(rt, s->dptr, s->size, d2h);
  s->dptr = NULL;
  atomic_store(&s->word, spw__w_with_state(w & ~(SPW_W_WAIT | SPW_W_CLEAN), SPW_STATE_HOST));
  atomic_fetch_add(&rt->c.host_bytes, v->size);
  pthread_mutex_unlock(&s->mu);
  return 1; /* the caller gives the device bytes back, once for the whole batch */
}

/* A sub-batch: its victims, their descriptors and the event its copy completes. */
typedef struct part {
  size_t first, count;
  int status;
  int copied; /* its copy was enqueued */
  spw_bevent_t *ev;
} part_t;

/* Prepares victims [p->first, p->first + count): host extents and descriptors. */
static size_t prepare(spw_runtime_t *rt, spw_victim_t *v, const part_t *p, spw_copy_desc_t *descs) {
  size_t nd = 0;
  for (size_t i = p->first; i < p->first + p->count; i++) {
    if (v[i].clean || v[i].status != SPW_OK) continue;
    v[i].status = spw__host_extent_alloc(rt, v[i].size, &v[i].ext);
    if (v[i].status == SPW_ERR_HOST_OUT_OF_MEMORY && spw__disk_open(rt) == SPW_OK) {
      /* Host memory is full and demotion could not free enough: the device still needs the
       * room, so this one skips the host tier. */
      v[i].to_disk = 1;
      v[i].status = SPW_OK;
      continue;
    }
    if (v[i].status == SPW_OK) descs[nd++] = (spw_copy_desc_t){v[i].ext.ptr, v[i].s->dptr, v[i].size};
  }
  return nd;
}

/* Waits for a sub-batch's copy, then commits its victims; returns the device bytes freed. */
static uint64_t finish(spw_runtime_t *rt, spw_victim_t *v, part_t *p, spw_stream_t d2h,
                       uint64_t *moved_bytes, size_t *moved, int reason) {
  int st = p->status;
  if (p->ev) {
    if (st == SPW_OK) st = rt->ops->event_sync(rt->be, p->ev);
    spw__event_put(rt, p->ev);
    p->ev = NULL;
  }
  /* A copy enqueued without a usable event may still be writing the host extents that a
   * failed commit returns: let it finish first. */
  if (st != SPW_OK && p->copied) rt->ops->stream_sync(rt->be, d2h);
  uint64_t released = 0, out = 0;
  for (size_t i = p->first; i < p->first + p->count; i++) {
    if (v[i].to_disk) {
      /* Commits, accounts and reports itself (through the staging pipeline). */
      v[i].status = spw__spill_to_disk(rt, &v[i]);
      if (v[i].status != SPW_OK && v[i].status != SPW_ERR_BUSY && reason != 1)
        spw__set_async_error(rt, v[i].status);
      continue;
    }
    if (st != SPW_OK && !v[i].clean && v[i].status == SPW_OK) v[i].status = st;
    int ok = commit(rt, &v[i], d2h);
    out += v[i].size;
    if (ok) {
      (*moved)++;
      released += v[i].size;
      if (!v[i].clean) *moved_bytes += v[i].size;
      else atomic_fetch_add(&rt->c.clean_respills, 1);
    } else if (v[i].status != SPW_ERR_BUSY && v[i].status != SPW_ERR_FREED) {
      atomic_fetch_add(&rt->c.failures, 1);
      if (reason != 1) spw__set_async_error(rt, v[i].status);
    }
  }
  /* Give the room back now, not at the end of the whole batch: whoever waits for it goes on
   * while the next sub-batch is still copying. */
  atomic_fetch_sub(&rt->device_used, released);
  atomic_fetch_sub(&rt->spilling_bytes, out);
  pthread_mutex_lock(&rt->budget_mu);
  pthread_cond_broadcast(&rt->budget_cv);
  pthread_mutex_unlock(&rt->budget_mu);
  return released;
}

/* Victims per sub-batch: enough to amortize a launch and an event, few enough that the CPU
 * work of one sub-batch (extents, commits: a few hundred ns per victim) hides behind the
 * copy of the previous one. */
#define PART_VICTIMS 2048

size_t spw__spill_batch(spw_runtime_t *rt, spw_victim_t *v, size_t n, int reason) {
  uint64_t t0 = spw__now_ns();
  spw_stream_t d2h = spw__engine_d2h(rt);
  size_t cap = n < PART_VICTIMS ? n : PART_VICTIMS;
  spw_copy_desc_t *descs = malloc(cap * sizeof *descs);
  int st = descs ? SPW_OK : SPW_ERR_SYSTEM;
  int landing = 0;
  for (size_t i = 0; i < n; i++) landing |= !v[i].clean && v[i].landing;
  if (st == SPW_OK && landing) {
    /* Copies back from earlier unspills may still be landing in some of this memory. They
     * all ran on the upload stream, in order, so one wait covers every victim (a wait per
     * victim costs a microsecond each). */
    spw_bevent_t *up = NULL;
    st = spw__event_get(rt, &up);
    if (st == SPW_OK) st = rt->ops->event_record(rt->be, up, spw__engine_h2d(rt));
    if (st == SPW_OK) st = rt->ops->stream_wait_event(rt->be, d2h, up);
    if (up) spw__event_put(rt, up); /* reusable once the wait is enqueued */
  }
  if (st != SPW_OK)
    for (size_t i = 0; i < n; i++)
      if (!v[i].clean) v[i].status = st;

  size_t moved = 0;
  uint64_t moved_bytes = 0;
  part_t prev = {0}, cur = {0};
  int have_prev = 0;
  for (size_t first = 0; first < n; first += cap) {
    cur = (part_t){.first = first, .count = n - first < cap ? n - first : cap, .status = SPW_OK};
    size_t nd = descs ? prepare(rt, v, &cur, descs) : 0;
    if (nd > 0) {
      cur.status = rt->ops->copy_batch_async(rt->be, descs, nd, SPW_COPY_D2H, d2h);
      cur.copied = cur.status == SPW_OK;
      if (cur.status == SPW_OK) cur.status = spw__event_get(rt, &cur.ev);
      if (cur.status == SPW_OK) cur.status = rt->ops->event_record(rt->be, cur.ev, d2h);
    }
    if (have_prev) finish(rt, v, &prev, d2h, &moved_bytes, &moved, reason);
    prev = cur;
    have_prev = 1;
  }
  if (have_prev) finish(rt, v, &prev, d2h, &moved_bytes, &moved, reason);
  free(descs);

  uint64_t dt = spw__now_ns() - t0;
  atomic_fetch_add(&rt->c.spills, moved);
  atomic_fetch_add(&rt->c.spill_bytes, moved_bytes);
  atomic_fetch_add(&rt->c.spill_ns, dt);
  if (reason == 1) atomic_fetch_add(&rt->c.spills_on_demand, moved);
  if (reason == 2) atomic_fetch_add(&rt->c.spills_background, moved);

  for (size_t i = 0; i < n; i++) {
    if (v[i].status == SPW_ERR_FREED || v[i].status == SPW_ERR_BUSY) continue; /* never left */
    if (v[i].to_disk) continue; /* reported by spw__spill_to_disk */
    int ok = v[i].status == SPW_OK;
    spw_state_event_t ev = {.buf = v[i].h,
                            .from = SPW_STATE_RESIDENT,
                            .to = ok ? SPW_STATE_HOST : SPW_STATE_RESIDENT,
                            .bytes = ok && !v[i].clean ? v[i].size : 0,
                            .duration_ns = dt,
                            .status = v[i].status};
    spw__notify_state(rt, &ev);
  }
  return moved;
}
