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

size_t spw__spill_batch(spw_runtime_t *rt, spw_victim_t *v, size_t n, int reason) {
  uint64_t t0 = spw__now_ns();
  spw_stream_t d2h = spw__engine_d2h(rt);
  spw_copy_desc_t *descs = malloc(n * sizeof *descs);
  size_t nd = 0;
  int st = descs ? SPW_OK : SPW_ERR_SYSTEM, landing = 0;
  for (size_t i = 0; i < n && st == SPW_OK; i++) {
    if (v[i].clean) continue;
    v[i].status = spw__host_extent_alloc(rt, v[i].size, &v[i].ext);
    if (v[i].status != SPW_OK) continue;
    landing |= v[i].landing;
    descs[nd++] = (spw_copy_desc_t){v[i].ext.ptr, v[i].s->dptr, v[i].size};
  }
  if (st == SPW_OK && landing && nd > 0) {
    /* Copies back from earlier unspills may still be landing in some of this memory. They
     * all ran on the upload stream, in order, so one wait covers every victim (a wait per
     * victim costs a microsecond each). */
    spw_bevent_t *up = NULL;
    st = spw__event_get(rt, &up);
    if (st == SPW_OK) st = rt->ops->event_record(rt->be, up, spw__engine_h2d(rt));
    if (st == SPW_OK) st = rt->ops->stream_wait_event(rt->be, d2h, up);
    if (up) spw__event_put(rt, up); /* reusable once the wait is enqueued */
    if (st != SPW_OK)
      for (size_t i = 0; i < n; i++)
        if (!v[i].clean && v[i].status == SPW_OK) v[i].status = st;
  }
  if (!descs) {
    for (size_t i = 0; i < n; i++) v[i].status = st;
  } else if (nd > 0 && st == SPW_OK) {
    spw_bevent_t *ev = NULL;
    st = rt->ops->copy_batch_async(rt->be, descs, nd, SPW_COPY_D2H, d2h);
    if (st == SPW_OK) st = spw__event_get(rt, &ev);
    if (st == SPW_OK) st = rt->ops->event_record(rt->be, ev, d2h);
    if (st == SPW_OK) st = rt->ops->event_sync(rt->be, ev);
    if (ev) spw__event_put(rt, ev);
    if (st != SPW_OK)
      for (size_t i = 0; i < n; i++)
        if (!v[i].clean && v[i].status == SPW_OK) v[i].status = st;
  }
  free(descs);

  uint64_t dt = spw__now_ns() - t0;
  size_t moved = 0;
  uint64_t moved_bytes = 0, spilling_done = 0, released = 0;
  for (size_t i = 0; i < n; i++) {
    int ok = commit(rt, &v[i], d2h);
    spilling_done += v[i].size;
    if (ok) {
      moved++;
      released += v[i].size;
      if (!v[i].clean) moved_bytes += v[i].size;
      else atomic_fetch_add(&rt->c.clean_respills, 1);
    } else if (v[i].status != SPW_ERR_BUSY && v[i].status != SPW_ERR_FREED) {
      atomic_fetch_add(&rt->c.failures, 1);
      if (reason != 1) spw__set_async_error(rt, v[i].status);
    }
  }
  atomic_fetch_sub(&rt->device_used, released);
  atomic_fetch_sub(&rt->spilling_bytes, spilling_done);
  pthread_mutex_lock(&rt->budget_mu);
  pthread_cond_broadcast(&rt->budget_cv);
  pthread_mutex_unlock(&rt->budget_mu);

  atomic_fetch_add(&rt->c.spills, moved);
  atomic_fetch_add(&rt->c.spill_bytes, moved_bytes);
  atomic_fetch_add(&rt->c.spill_ns, dt);
  if (reason == 1) atomic_fetch_add(&rt->c.spills_on_demand, moved);
  if (reason == 2) atomic_fetch_add(&rt->c.spills_background, moved);

  for (size_t i = 0; i < n; i++) {
    if (v[i].status == SPW_ERR_FREED) continue;
    int ok = v[i].status == SPW_OK;
    spw_state_event_t ev = {.buf = v[i].h,
                            .from = SPW_STATE_RESIDENT,
                            .to = ok ? SPW_STATE_HOST : SPW_STATE_RESIDENT,
                            .bytes = ok && !v[i].clean ? v[i].size : 0,
                            .duration_ns = dt,
                            .status = v[i].status == SPW_ERR_BUSY ? SPW_OK : v[i].status};
    if (v[i].status == SPW_ERR_BUSY) continue; /* abandoned: it never left */
    spw__notify_state(rt, &ev);
  }
  return moved;
}
