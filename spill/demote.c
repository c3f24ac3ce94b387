/* SPDX-License-Identifier: Apache-2.0 */
/* The moves to disk: demotion (host -> disk, straight from the buffer's pinned extent, least
 * recently used first when the host arena is full) and the direct spill of a resident
 * buffer to disk (device -> disk through the staging pipeline). Also the host-extent helpers
 * the other moves share: allocation that demotes to make room, and a free deferred until a
 * stream has passed the copies that still use the extent.
 *
 * A buffer being demoted is DEMOTING, and acquirers wait for the write to finish rather
 * than abandon it, since the disk copy is then one commit away. A direct spill keeps the
 * buffer SPILLING, which an acquire abandons as for a spill to host (the device copy is
 * intact). A failed write leaves the buffer where it was. */
#include <stdlib.h>

#include "../src/completions.h"
#include "disk_tier.h"
#include "engine.h"

static void free_extent_fn(spw_runtime_t *rt, void *arg) {
  spw_host_extent_t *e = arg;
  uint64_t bytes = e->bytes;
  spw__arena_free(rt->arena, e);
  atomic_fetch_sub(&rt->c.host_deferred, bytes);
  free(e);
}

void spw__host_extent_free_after(spw_runtime_t *rt, spw_host_extent_t *e, spw_stream_t stream) {
  if (!e->ptr) return;
  spw_host_extent_t *copy = malloc(sizeof *copy);
  if (copy) {
    *copy = *e;
    atomic_fetch_add(&rt->c.host_deferred, e->bytes);
    if (spw__after_stream(rt, stream, free_extent_fn, copy) == SPW_OK) {
      *e = (spw_host_extent_t){0};
      return;
    }
    atomic_fetch_sub(&rt->c.host_deferred, e->bytes);
    free(copy);
  }
  /* No way to defer: wait for the stream, then free (correct, only slower). */
  rt->ops->stream_sync(rt->be, stream);
  spw__arena_free(rt->arena, e);
  *e = (spw_host_extent_t){0};
}

/* How long a spill waits for host extents on their way back before the arena grows. */
#define DEFERRED_WAIT_NS 100000000ull

int spw__host_extent_alloc(spw_runtime_t *rt, size_t bytes, spw_host_extent_t *out) {
  if (atomic_load_explicit(&rt->c.host_deferred, memory_order_relaxed) > 0) {
    /* Extents are on their way back (behind uploads that read them). If the arena would
     * have to map and pin a new slab (a third of a second per GiB) rather than wait a few
     * milliseconds for them, wait for them. */
    spw_arena_stats_t as;
    spw__arena_get_stats(rt->arena, &as);
    if (as.in_use + bytes > as.mapped) spw__completions_drain_for(rt, DEFERRED_WAIT_NS);
  }
  int st = spw__arena_alloc(rt->arena, bytes, out);
  for (int attempt = 0; st == SPW_ERR_HOST_OUT_OF_MEMORY && attempt < 3; attempt++) {
    if (spw__disk_open(rt) != SPW_OK) break;
    if (spw__demote_lru(rt, bytes) == 0) break;
    st = spw__arena_alloc(rt->arena, bytes, out);
  }
  return st;
}

/* Demotes h; with `try`, gives up rather than wait for its mutex (the caller may hold
 * another slot's mutex). */
static int demote(spw_runtime_t *rt, spw_buf_t h, int try) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, h, &s, &w);
  if (st != SPW_OK) return st;
  if (try) {
    if (pthread_mutex_trylock(&s->mu) != 0) return SPW_ERR_BUSY;
  } else {
    pthread_mutex_lock(&s->mu);
  }
  w = atomic_load(&s->word);
  if (spw__w_gen(w) != spw__handle_gen(h) || (w & SPW_W_FREE_PENDING) ||
      spw__w_state(w) != SPW_STATE_HOST) {
    pthread_mutex_unlock(&s->mu);
    return SPW_ERR_BUSY;
  }
  st = spw__disk_open(rt);
  if (st != SPW_OK) {
    pthread_mutex_unlock(&s->mu);
    return st;
  }
  atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_DEMOTING));
  spw_host_extent_t src = s->host;
  size_t size = s->size;
  pthread_mutex_unlock(&s->mu);

  uint64_t t0 = spw__now_ns();
  spw_disk_extent_t de = {0};
  st = spw__disk_write_host(rt, src.ptr, size, &de);
  uint64_t dt = spw__now_ns() - t0;

  pthread_mutex_lock(&s->mu);
  w = atomic_load(&s->word);
  if (w & SPW_W_FREE_PENDING) {
    if (st == SPW_OK) spw__disk_free(rt, &de);
    spw__buffer_finish_free(rt, s, h); /* unlocks */
    return SPW_ERR_FREED;
  }
  if (st != SPW_OK) {
    atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_HOST));
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&rt->c.failures, 1);
    spw_state_event_t ev = {h, SPW_STATE_HOST, SPW_STATE_HOST, 0, dt, st};
    spw__notify_state(rt, &ev);
    return st;
  }
  s->disk = de;
  spw__arena_free(rt->arena, &s->host);
  atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_DISK));
  pthread_mutex_unlock(&s->mu);
  atomic_fetch_sub(&rt->c.host_bytes, size);
  atomic_fetch_add(&rt->c.disk_bytes, size);
  atomic_fetch_add(&rt->c.demotions, 1);
  atomic_fetch_add(&rt->c.demote_bytes, size);
  atomic_fetch_add(&rt->c.demote_ns, dt);
  atomic_fetch_add(&rt->c.disk_writes, 1);
  atomic_fetch_add(&rt->c.disk_write_bytes, size);
  spw_state_event_t ev = {h, SPW_STATE_HOST, SPW_STATE_DISK, size, dt, SPW_OK};
  spw__notify_state(rt, &ev);
  return SPW_OK;
}

int spw__demote(spw_runtime_t *rt, spw_buf_t h) { return demote(rt, h, 0); }

typedef struct host_candidate {
  uint64_t last_use;
  spw_buf_t h;
  size_t size;
} host_candidate_t;

static int by_age(const void *a, const void *b) {
  const host_candidate_t *x = a, *y = b;
  return x->last_use < y->last_use ? -1 : x->last_use > y->last_use;
}

uint64_t spw__demote_lru(spw_runtime_t *rt, uint64_t bytes) {
  uint32_t n = atomic_load(&rt->handles.nslots);
  host_candidate_t *c = malloc((size_t)n * sizeof *c + 1);
  if (!c) return 0;
  size_t nc = 0;
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    if (spw__w_state(w) != SPW_STATE_HOST || (w & SPW_W_FREE_PENDING)) continue;
    c[nc].last_use = atomic_load_explicit(&s->last_use, memory_order_relaxed);
    c[nc].h = ((uint64_t)rt->handles.tag << 48) | ((uint64_t)spw__w_gen(w) << 24) | i;
    c[nc].size = s->size;
    nc++;
  }
  qsort(c, nc, sizeof *c, by_age);
  uint64_t freed = 0;
  for (size_t i = 0; i < nc && freed < bytes; i++)
    if (demote(rt, c[i].h, 1) == SPW_OK) freed += c[i].size;
  free(c);
  return freed;
}

int spw__spill_to_disk(spw_runtime_t *rt, spw_victim_t *v) {
  spw_slot_t *s = v->s;
  uint64_t t0 = spw__now_ns();
  int st = spw__disk_open(rt);
  spw_disk_extent_t de = {0};
  if (st == SPW_OK && (atomic_load(&s->word) & SPW_W_WAIT))
    st = rt->ops->event_sync(rt->be, s->ready);
  if (st == SPW_OK) st = spw__disk_write_device(rt, s->dptr, v->size, &de);
  uint64_t dt = spw__now_ns() - t0;

  pthread_mutex_lock(&s->mu);
  uint64_t w = atomic_load(&s->word);
  int abandoned = spw__w_state(w) != SPW_STATE_SPILLING || s->move_seq != v->seq;
  if (abandoned || (w & SPW_W_FREE_PENDING) || st != SPW_OK) {
    if (st == SPW_OK) spw__disk_free(rt, &de);
    if (!abandoned && (w & SPW_W_FREE_PENDING)) {
      spw__buffer_finish_free(rt, s, v->h); /* unlocks */
    } else {
      if (!abandoned) atomic_store(&s->word, spw__w_with_state(w, SPW_STATE_RESIDENT));
      pthread_mutex_unlock(&s->mu);
    }
    atomic_fetch_sub(&rt->spilling_bytes, v->size);
    if (st != SPW_OK) {
      atomic_fetch_add(&rt->c.failures, 1);
      spw_state_event_t ev = {v->h, SPW_STATE_RESIDENT, SPW_STATE_RESIDENT, 0, dt, st};
      spw__notify_state(rt, &ev);
    }
    return st != SPW_OK ? st : SPW_ERR_BUSY;
  }
  s->disk = de;
  if (w & SPW_W_CLEAN) spw__arena_free(rt->arena, &s->host);
  spw__dpool_free(rt, s->dptr, v->size, spw__engine_d2h(rt));
  s->dptr = NULL;
  atomic_store(&s->word, spw__w_with_state(w & ~(SPW_W_WAIT | SPW_W_CLEAN), SPW_STATE_DISK));
  pthread_mutex_unlock(&s->mu);
  atomic_fetch_sub(&rt->spilling_bytes, v->size);
  spw__budget_unreserve(rt, v->size);
  atomic_fetch_add(&rt->c.disk_bytes, v->size);
  atomic_fetch_add(&rt->c.spills, 1);
  atomic_fetch_add(&rt->c.spill_bytes, v->size);
  atomic_fetch_add(&rt->c.spill_ns, dt);
  atomic_fetch_add(&rt->c.disk_writes, 1);
  atomic_fetch_add(&rt->c.disk_write_bytes, v->size);
  spw_state_event_t ev = {v->h, SPW_STATE_RESIDENT, SPW_STATE_DISK, v->size, dt, SPW_OK};
  spw__notify_state(rt, &ev);
  return SPW_OK;
}
