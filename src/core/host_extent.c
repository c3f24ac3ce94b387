/* SPDX-License-Identifier: Apache-2.0 */
/* Host extents for the moves (see host_extent.h). */
#include "host_extent.h"

#include <stdlib.h>

#include "moves.h"
#include "peer.h"

typedef struct deferred_extent {
  spw_runtime_t *rt;
  spw_host_extent_t e;
} deferred_extent_t;

/* Frees `arg`, a deferred_extent_t: malloc'd (behind a stream), or in its completion item
 * (behind an event, `owned` 0: the item goes with it). */
static void free_extent(void *arg) {
  deferred_extent_t *d = arg;
  uint64_t bytes = d->e.bytes;
  spw__host_extent_free(d->rt, &d->e);
  atomic_fetch_sub(&d->rt->c.host_deferred, bytes);
}

static void free_deferred(void *arg, int status) {
  (void)status; /* the stream no longer runs either way */
  free_extent(arg);
  free(arg);
}

static void free_deferred_in_item(void *arg, int status) {
  (void)status;
  free_extent(arg);
}

/* Defers the free of `e` behind a stream or an event (one of them NULL). */
static void free_later(spw_runtime_t *rt, spw_host_extent_t *e, spw_stream_t stream,
                       spw_bevent_t *ev) {
  if (!e->ptr) return;
  deferred_extent_t one = {rt, *e};
  atomic_fetch_add(&rt->c.host_deferred, e->bytes);
  int st = SPW_ERR_SYSTEM;
  if (ev) {
    /* One allocation: the extent travels in the completion item (every acquire of a
     * spilled buffer defers one). */
    st = spw__completions_after_event_with(rt->completions, ev, free_deferred_in_item, &one,
                                           sizeof one);
  } else {
    deferred_extent_t *d = malloc(sizeof *d);
    if (d) {
      *d = one;
      st = spw__completions_after(rt->completions, stream, free_deferred, d);
      if (st != SPW_OK) free(d);
    }
  }
  if (st == SPW_OK) {
    *e = (spw_host_extent_t){0};
    return;
  }
  atomic_fetch_sub(&rt->c.host_deferred, e->bytes);
  /* No way to defer: wait, then free (correct, only slower). */
  if (ev) rt->ops->event_sync(rt->be, ev);
  else rt->ops->stream_sync(rt->be, stream);
  spw__host_extent_free(rt, e);
}

/* The extents one stream's completion item frees: its first, and those that joined it. */
#define BEHIND_CAP 256

typedef struct extent_batch {
  spw_runtime_t *rt;
  size_t n;
  spw_host_extent_t e[BEHIND_CAP];
} extent_batch_t;

static void free_batch(void *arg, int status) {
  (void)status; /* the stream no longer runs either way */
  extent_batch_t *b = arg;
  uint64_t bytes = 0;
  for (size_t i = 0; i < b->n; i++) bytes += b->e[i].bytes;
  spw__host_extent_free_n(b->rt, b->e, b->n);
  atomic_fetch_sub(&b->rt->c.host_deferred, bytes);
  free(b);
}

/* Under the poller's lock: no call out, no allocation. A full batch refuses, and the caller
 * starts the next. */
static int batch_join(void *open_arg, const void *add) {
  extent_batch_t *b = open_arg;
  if (b->n == BEHIND_CAP) return SPW_ERR_BUSY;
  b->e[b->n++] = *(const spw_host_extent_t *)add;
  return SPW_OK;
}

void spw__host_extent_free_behind(spw_runtime_t *rt, spw_host_extent_t *e, spw_stream_t stream,
                                  spw_completion_cell_t *cell, spw_bevent_t *ev) {
  if (!e->ptr) return;
  atomic_fetch_add(&rt->c.host_deferred, e->bytes);
  int st = spw__completions_join_event(rt->completions, stream, cell, ev, batch_join, e);
  if (st != SPW_OK) {
    extent_batch_t *b = malloc(sizeof *b);
    st = SPW_ERR_SYSTEM;
    if (b) {
      b->rt = rt;
      b->n = 1;
      b->e[0] = *e;
      st = spw__completions_after_event_open(rt->completions, stream, cell, ev, free_batch, b);
      if (st != SPW_OK) free(b);
    }
  }
  if (st == SPW_OK) {
    *e = (spw_host_extent_t){0};
    return;
  }
  atomic_fetch_sub(&rt->c.host_deferred, e->bytes);
  free_later(rt, e, NULL, ev); /* its own item, or a wait */
}

void spw__host_extent_free(spw_runtime_t *rt, spw_host_extent_t *e) {
  if (e->peer) spw__peer_free(rt, e);
  else spw__arena_free(rt->arena, e);
}

void spw__host_extent_free_n(spw_runtime_t *rt, spw_host_extent_t *e, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (e[i].peer) {
      spw__peer_free(rt, &e[i]);
      e[i].ptr = NULL; /* the host arena's pass skips it */
    }
  spw__arena_free_n(rt->arena, e, n);
}

void spw__host_extent_free_after(spw_runtime_t *rt, spw_host_extent_t *e, spw_stream_t stream) {
  free_later(rt, e, stream, NULL);
}

void spw__host_extent_free_after_event(spw_runtime_t *rt, spw_host_extent_t *e, spw_bevent_t *ev) {
  free_later(rt, e, NULL, ev);
}

/* How long a spill waits for host extents on their way back before the arena grows. */
#define DEFERRED_WAIT_NS 100000000ull

/* Waits (bounded) for extents on their way back when the arena cannot serve `bytes` from
 * what it has mapped: mapping and pinning a new slab costs a third of a second per GiB, and
 * under the host limit there may be no room for one at all. */
static void await_deferred(spw_runtime_t *rt, size_t bytes) {
  if (atomic_load_explicit(&rt->c.host_deferred, memory_order_relaxed) == 0) return;
  spw_arena_stats_t as;
  spw__arena_get_stats(rt->arena, &as);
  if (as.in_use + bytes > as.mapped) spw__completions_drain_for(rt->completions, DEFERRED_WAIT_NS);
}

size_t spw__host_extent_alloc_n(spw_runtime_t *rt, const size_t *bytes, size_t n,
                                spw_host_extent_t *out, int *status) {
  /* Lent peer memory first: the faster link, and host memory stays for what it cannot hold. */
  size_t k = spw__peer_alloc_n(rt, bytes, n, out);
  if (k == n) {
    if (status) *status = SPW_OK;
    return n;
  }
  size_t total = 0;
  for (size_t i = k; i < n; i++) total += bytes[i];
  await_deferred(rt, total);
  return k + spw__arena_alloc_n(rt->arena, bytes + k, n - k, out + k, status);
}

int spw__host_extent_alloc(spw_runtime_t *rt, size_t bytes, spw_host_extent_t *out) {
  if (spw__peer_alloc_n(rt, &bytes, 1, out) == 1) return SPW_OK;
  return spw__host_extent_alloc_host(rt, bytes, out);
}

int spw__host_extent_alloc_host(spw_runtime_t *rt, size_t bytes, spw_host_extent_t *out) {
  await_deferred(rt, bytes);
  int st = spw__arena_alloc(rt->arena, bytes, out);
  for (int attempt = 0; st == SPW_ERR_HOST_OUT_OF_MEMORY && attempt < 3; attempt++) {
    int open_st;
    if (!spw__disk(rt, &open_st)) break;
    if (spw__demote_lru(rt, bytes) == 0) break;
    await_deferred(rt, bytes); /* a demoted extent an upload may still read comes back later */
    st = spw__arena_alloc(rt->arena, bytes, out);
  }
  return st;
}
