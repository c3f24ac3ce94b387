/* SPDX-License-Identifier: Apache-2.0 */
/* Device memory for buffers: small ones from slabs, large ones from the backend.
 *
 * Spilling and bringing back tens of thousands of small buffers would otherwise pay one
 * cudaMallocAsync / cudaFreeAsync each (about a microsecond), which caps 4 KiB buffers at a
 * few GB/s however fast the copies are. Buffers under SPW_DPOOL_SMALL come from slabs cut
 * into blocks of one power-of-two size class (a slab is at most 1/32 of the device limit
 * and at most SPW_DPOOL_SLAB); a block costs a push or pop on its class's free list.
 *
 * Stream order: a slab is allocated on the null stream and synchronized once, so its blocks
 * are usable from any stream. A block goes back to its free list only when no work can
 * still touch it: callers free at once when the work is known complete, or through
 * spw__dpool_free_after behind the stream that may still use it. Entirely free slabs are
 * returned by spw__dpool_trim (called when the device refuses an allocation).
 *
 * Exportable pools (config.ipc): CUDA IPC exports only memory from cudaMalloc, not from a
 * stream-ordered pool, so every region comes from the backend's ipc_alloc: the slabs, and
 * for large blocks arenas (the host arena's free-list allocator over memory it does not
 * own). The backend cannot order an arena block's free on a stream, so a large free waits
 * for the stream through the completions before the block is reused. A pool that is not
 * exportable has arenas too once a buffer asks for one (SPW_ALLOC_ARENA: library
 * allocations, which cost two driver calls each from the stream-ordered pool); its frees
 * tell an arena's block by its address. */
#include "device_pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "grow.h"
#include "host_arena.h"

#define MIN_SHIFT 8u /* 256 B: cudaMallocAsync's alignment */
#define NCLASSES 12u /* 256 B .. 512 KiB */
#define ARENA_GRAIN ((size_t)2 << 20) /* arena sizes: multiples of a large page */

typedef struct slab {
  uint8_t *base;
  size_t bytes;
  uint32_t cls;
  uint32_t free_blocks, blocks;
} slab_t;

typedef struct arena {
  uint8_t *base;
  size_t bytes;
  spw_host_arena_t *alloc; /* a borrowed arena over [base, base + bytes) */
} arena_t;

struct spw_dpool {
  spw_dpool_params_t p;
  pthread_mutex_t mu; /* one lock: a pop/push is a few instructions */
  void **free[NCLASSES];
  size_t nfree[NCLASSES], cap[NCLASSES];
  slab_t *slabs; /* sorted by base, for block -> slab lookup */
  size_t nslabs, slab_cap;
  size_t slab_max; /* the largest slab: a small fraction of the budget */
  uint64_t slab_total;
  arena_t *arenas; /* large blocks of exportable pools and of SPW_ALLOC_ARENA; by base */
  size_t narenas, arena_cap;
  atomic_int had_arenas; /* set with the first arena: until then no free looks for one */
  size_t arena_min; /* an arena's size unless one block needs more */
};

static uint32_t class_of(size_t bytes) {
  uint32_t c = 0;
  while (((size_t)1 << (MIN_SHIFT + c)) < bytes) c++;
  return c;
}

int spw__dpool_create(const spw_dpool_params_t *params, spw_dpool_t **out) {
  spw_dpool_t *p = calloc(1, sizeof *p);
  if (!p) return SPW_ERR_SYSTEM;
  p->p = *params;
  pthread_mutex_init(&p->mu, NULL);
  /* The pool holds memory the budget does not see (free blocks of partly used slabs), so a
   * slab is a small fraction of the budget: at most 1/32 of it, 16 blocks when that fits. */
  p->slab_max = SPW_DPOOL_SLAB;
  while (p->slab_max > ((size_t)64 << 10) && p->slab_max * 32 > params->device_limit) p->slab_max /= 2;
  /* An arena's free space is invisible to the budget as well: an eighth of it at most. */
  p->arena_min = (size_t)256 << 20;
  while (p->arena_min > ARENA_GRAIN && p->arena_min * 8 > params->device_limit) p->arena_min /= 2;
  *out = p;
  return SPW_OK;
}

/* A slab or an arena: synchronous, exportable memory in an exportable pool; else the
 * backend's pool, synchronized once so that every stream may use it. */
static int region_alloc(spw_dpool_t *p, size_t bytes, void **out) {
  if (p->p.exportable) return p->p.ops->ipc_alloc(p->p.be, bytes, out);
  int st = p->p.ops->alloc_async(p->p.be, bytes, p->p.null_stream, out);
  if (st == SPW_OK) st = p->p.ops->stream_sync(p->p.be, p->p.null_stream);
  return st;
}

static void region_free(spw_dpool_t *p, void *base) {
  if (p->p.exportable) (void)p->p.ops->ipc_free(p->p.be, base);
  else (void)p->p.ops->free_async(p->p.be, base, p->p.null_stream);
}

void spw__dpool_destroy(spw_dpool_t *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nslabs; i++) region_free(p, p->slabs[i].base);
  for (size_t i = 0; i < p->narenas; i++) {
    spw__arena_destroy(p->arenas[i].alloc);
    region_free(p, p->arenas[i].base);
  }
  for (uint32_t c = 0; c < NCLASSES; c++) free(p->free[c]);
  free(p->slabs);
  free(p->arenas);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

static slab_t *slab_of(spw_dpool_t *p, const void *ptr) {
  size_t lo = 0, hi = p->nslabs;
  const uint8_t *b = ptr;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->slabs[mid].base <= b) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return NULL;
  slab_t *s = &p->slabs[lo - 1];
  return b < s->base + s->bytes ? s : NULL;
}

static int push_free(spw_dpool_t *p, uint32_t c, void *ptr) {
  void **grown = spw__grow(p->free[c], &p->cap[c], p->nfree[c] + 1, sizeof *grown, 256);
  if (!grown) return SPW_ERR_SYSTEM;
  p->free[c] = grown;
  p->free[c][p->nfree[c]++] = ptr;
  return SPW_OK;
}

/* A new slab for class c; called without p->mu (it synchronizes a stream). */
static int grow(spw_dpool_t *p, uint32_t c) {
  size_t block = (size_t)1 << (MIN_SHIFT + c);
  size_t bytes = block * 16 < p->slab_max ? p->slab_max : block * 16;
  while (bytes > p->slab_max && bytes > block) bytes /= 2; /* a small budget: fewer blocks */
  void *base;
  int st = region_alloc(p, bytes, &base);
  if (st != SPW_OK) return st;
  uint32_t blocks = (uint32_t)(bytes / block);
  pthread_mutex_lock(&p->mu);
  slab_t *slabs = spw__grow(p->slabs, &p->slab_cap, p->nslabs + 1, sizeof *slabs, 16);
  if (!slabs) {
    pthread_mutex_unlock(&p->mu);
    region_free(p, base);
    return SPW_ERR_SYSTEM;
  }
  p->slabs = slabs;
  size_t at = 0;
  while (at < p->nslabs && p->slabs[at].base < (uint8_t *)base) at++;
  memmove(&p->slabs[at + 1], &p->slabs[at], (p->nslabs - at) * sizeof *p->slabs);
  p->slabs[at] = (slab_t){base, bytes, c, blocks, blocks};
  p->nslabs++;
  p->slab_total += bytes;
  for (uint32_t i = blocks; i-- > 0;) {
    if (push_free(p, c, (uint8_t *)base + (size_t)i * block) != SPW_OK) {
      /* Blocks not listed are simply never handed out; the slab is still freed at destroy. */
      p->slabs[at].blocks = p->slabs[at].free_blocks = blocks - i - 1;
      break;
    }
  }
  pthread_mutex_unlock(&p->mu);
  return SPW_OK;
}

/* ---- arenas: large blocks of an exportable pool ---------------------------------------- */

static arena_t *arena_of(spw_dpool_t *p, const void *ptr) {
  size_t lo = 0, hi = p->narenas;
  const uint8_t *b = ptr;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->arenas[mid].base <= b) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return NULL;
  arena_t *a = &p->arenas[lo - 1];
  return b < a->base + a->bytes ? a : NULL;
}

static int arena_take(spw_dpool_t *p, size_t bytes, void **out) {
  for (size_t i = 0; i < p->narenas; i++) {
    spw_host_extent_t e;
    if (spw__arena_alloc(p->arenas[i].alloc, bytes, &e) == SPW_OK) {
      *out = e.ptr;
      return SPW_OK;
    }
  }
  return SPW_ERR_OUT_OF_MEMORY;
}

/* Adds an arena of at least `bytes`; called without p->mu (the allocation is synchronous). */
static int arena_grow(spw_dpool_t *p, size_t bytes) {
  size_t size = (bytes + ARENA_GRAIN - 1) / ARENA_GRAIN * ARENA_GRAIN;
  if (size < p->arena_min) size = p->arena_min;
  /* One page more: the free-list allocator wants its memory 4096-aligned, and neither the
   * stream-ordered pool nor cudaMalloc promises that (the host backend gives 256 bytes). */
  void *base;
  int st = region_alloc(p, size + SPW_ARENA_ALIGN, &base);
  if (st != SPW_OK) return st;
  uintptr_t first = ((uintptr_t)base + SPW_ARENA_ALIGN - 1) / SPW_ARENA_ALIGN * SPW_ARENA_ALIGN;
  spw_host_arena_t *alloc = NULL;
  st = spw__arena_create_borrowed((void *)first, size, &alloc);
  size += SPW_ARENA_ALIGN; /* the region, as allocated: what an export names */
  pthread_mutex_lock(&p->mu);
  arena_t *grown = st == SPW_OK ? spw__grow(p->arenas, &p->arena_cap, p->narenas + 1,
                                            sizeof *grown, 4)
                                : NULL;
  if (!grown) {
    pthread_mutex_unlock(&p->mu);
    spw__arena_destroy(alloc);
    region_free(p, base);
    return st == SPW_OK ? SPW_ERR_SYSTEM : st;
  }
  p->arenas = grown;
  size_t at = 0;
  while (at < p->narenas && p->arenas[at].base < (uint8_t *)base) at++;
  memmove(&p->arenas[at + 1], &p->arenas[at], (p->narenas - at) * sizeof *p->arenas);
  p->arenas[at] = (arena_t){base, size, alloc};
  p->narenas++;
  atomic_store_explicit(&p->had_arenas, 1, memory_order_relaxed);
  pthread_mutex_unlock(&p->mu);
  return SPW_OK;
}

static int arena_alloc(spw_dpool_t *p, size_t bytes, void **out) {
  for (int attempt = 0; attempt < 2; attempt++) {
    pthread_mutex_lock(&p->mu);
    int st = arena_take(p, bytes, out);
    pthread_mutex_unlock(&p->mu);
    if (st == SPW_OK || attempt == 1) return st; /* lost the new arena to others: retry */
    if ((st = arena_grow(p, bytes)) != SPW_OK) return st;
  }
  return SPW_ERR_OUT_OF_MEMORY;
}

static void arena_release(spw_dpool_t *p, void *ptr, size_t bytes) {
  pthread_mutex_lock(&p->mu);
  arena_t *a = arena_of(p, ptr);
  /* The extent as the arena handed it out: one slab, lengths rounded to its alignment. */
  spw_host_extent_t e = {ptr, (bytes + SPW_ARENA_ALIGN - 1) / SPW_ARENA_ALIGN * SPW_ARENA_ALIGN,
                         0, 1};
  if (a) spw__arena_free(a->alloc, &e);
  pthread_mutex_unlock(&p->mu);
}

/* Whether a large block came from an arena: always in an exportable pool; else looked up,
 * once any arena exists. */
static int in_arena(spw_dpool_t *p, const void *ptr) {
  if (p->p.exportable) return 1;
  if (!atomic_load_explicit(&p->had_arenas, memory_order_relaxed)) return 0;
  pthread_mutex_lock(&p->mu);
  int in = arena_of(p, ptr) != NULL;
  pthread_mutex_unlock(&p->mu);
  return in;
}

int spw__dpool_alloc_arena(spw_dpool_t *p, size_t bytes, void **out) {
  if (bytes >= SPW_DPOOL_SMALL) return arena_alloc(p, bytes, out);
  return spw__dpool_alloc(p, bytes, p->p.null_stream, out);
}

int spw__dpool_alloc(spw_dpool_t *p, size_t bytes, spw_stream_t stream, void **out) {
  if (bytes >= SPW_DPOOL_SMALL)
    return p->p.exportable ? arena_alloc(p, bytes, out)
                           : p->p.ops->alloc_async(p->p.be, bytes, stream, out);
  uint32_t c = class_of(bytes);
  for (int attempt = 0; attempt < 2; attempt++) {
    pthread_mutex_lock(&p->mu);
    if (p->nfree[c] > 0) {
      void *ptr = p->free[c][--p->nfree[c]];
      slab_of(p, ptr)->free_blocks--;
      pthread_mutex_unlock(&p->mu);
      *out = ptr;
      return SPW_OK;
    }
    pthread_mutex_unlock(&p->mu);
    if (attempt == 0) {
      int st = grow(p, c);
      if (st != SPW_OK) return st;
    }
  }
  return SPW_ERR_OUT_OF_MEMORY; /* another thread took the whole new slab: caller retries */
}

/* slab_of, trying first the slab of the previous block of a batch (*last): a batch's blocks
 * mostly come from, and go back to, a few slabs. */
static slab_t *slab_of_near(spw_dpool_t *p, const void *ptr, slab_t **last) {
  const uint8_t *b = ptr;
  slab_t *s = *last;
  if (s && b >= s->base && b < s->base + s->bytes) return s;
  s = slab_of(p, ptr);
  if (s) *last = s;
  return s;
}

size_t spw__dpool_alloc_n(spw_dpool_t *p, const size_t *bytes, size_t n, void **out) {
  size_t k = 0;
  slab_t *last = NULL;
  pthread_mutex_lock(&p->mu);
  for (; k < n && bytes[k] < SPW_DPOOL_SMALL; k++) {
    uint32_t c = class_of(bytes[k]);
    if (p->nfree[c] == 0) break;
    out[k] = p->free[c][--p->nfree[c]];
    slab_of_near(p, out[k], &last)->free_blocks--;
  }
  pthread_mutex_unlock(&p->mu);
  return k;
}

static void slab_release(spw_dpool_t *p, void *ptr) {
  pthread_mutex_lock(&p->mu);
  slab_t *s = slab_of(p, ptr);
  if (s && push_free(p, s->cls, ptr) == SPW_OK) s->free_blocks++;
  pthread_mutex_unlock(&p->mu);
}

/* Returns a block no work can touch any more. */
static void release_now(spw_dpool_t *p, void *ptr, size_t bytes) {
  if (bytes < SPW_DPOOL_SMALL) slab_release(p, ptr);
  else if (in_arena(p, ptr)) arena_release(p, ptr, bytes);
  else p->p.ops->free_async(p->p.be, ptr, p->p.null_stream);
}

typedef struct deferred {
  spw_dpool_t *p;
  void *ptr;
  size_t bytes;
} deferred_t;

static void free_deferred(void *arg, int status) {
  deferred_t *d = arg;
  (void)status; /* a failed stream still no longer runs: the block is free either way */
  release_now(d->p, d->ptr, d->bytes);
  free(d);
}

/* Returns the block once the work enqueued so far on `stream` has completed: at once when
 * it has (a library allocator's free, most often), so that the next allocation finds the
 * block rather than growing another arena while the free waits for a poller round. */
static void release_behind(spw_dpool_t *p, void *ptr, size_t bytes, spw_stream_t stream) {
  deferred_t *d = malloc(sizeof *d);
  if (d) {
    *d = (deferred_t){p, ptr, bytes};
    if (spw__completions_after_or_now(p->p.completions, stream, free_deferred, d) == SPW_OK)
      return;
    free(d);
  }
  p->p.ops->stream_sync(p->p.be, stream); /* cannot defer: wait, then free */
  release_now(p, ptr, bytes);
}

/* A large block: the backend's pool orders its free on the stream itself; an arena's block
 * waits for the stream first. */
static void large_free(spw_dpool_t *p, void *ptr, size_t bytes, spw_stream_t stream) {
  if (in_arena(p, ptr)) release_behind(p, ptr, bytes, stream);
  else p->p.ops->free_async(p->p.be, ptr, stream);
}

void spw__dpool_free_now(spw_dpool_t *p, void *ptr, size_t bytes) {
  if (ptr) release_now(p, ptr, bytes);
}

void spw__dpool_free(spw_dpool_t *p, void *ptr, size_t bytes, spw_stream_t stream) {
  if (!ptr) return;
  if (bytes >= SPW_DPOOL_SMALL) large_free(p, ptr, bytes, stream);
  else slab_release(p, ptr);
}

void spw__dpool_free_n(spw_dpool_t *p, void *const *ptrs, const size_t *bytes, size_t n,
                       spw_stream_t stream) {
  slab_t *last = NULL;
  pthread_mutex_lock(&p->mu);
  for (size_t i = 0; i < n; i++) {
    if (!ptrs[i] || bytes[i] >= SPW_DPOOL_SMALL) continue;
    slab_t *s = slab_of_near(p, ptrs[i], &last);
    if (s && push_free(p, s->cls, ptrs[i]) == SPW_OK) s->free_blocks++;
  }
  pthread_mutex_unlock(&p->mu);
  for (size_t i = 0; i < n; i++)
    if (ptrs[i] && bytes[i] >= SPW_DPOOL_SMALL) large_free(p, ptrs[i], bytes[i], stream);
}

void spw__dpool_free_after(spw_dpool_t *p, void *ptr, size_t bytes, spw_stream_t stream) {
  if (!ptr) return;
  if (bytes >= SPW_DPOOL_SMALL && !in_arena(p, ptr)) {
    p->p.ops->free_async(p->p.be, ptr, stream); /* the backend orders it on the stream */
    return;
  }
  release_behind(p, ptr, bytes, stream);
}

void spw__dpool_free_after_event(spw_dpool_t *p, void *ptr, size_t bytes, spw_bevent_t *ev) {
  if (!ptr) return;
  deferred_t *d = malloc(sizeof *d);
  if (d) {
    *d = (deferred_t){p, ptr, bytes};
    if (spw__completions_after_event(p->p.completions, ev, free_deferred, d) == SPW_OK) return;
    free(d);
  }
  p->p.ops->event_sync(p->p.be, ev); /* cannot defer: wait, then free */
  release_now(p, ptr, bytes);
}

uint64_t spw__dpool_trim(spw_dpool_t *p) {
  uint64_t released = 0;
  pthread_mutex_lock(&p->mu);
  for (size_t i = 0; i < p->nslabs;) {
    slab_t s = p->slabs[i];
    if (s.free_blocks != s.blocks) {
      i++;
      continue;
    }
    /* Drop this slab's blocks from its free list, then the slab. */
    size_t k = 0;
    for (size_t j = 0; j < p->nfree[s.cls]; j++) {
      uint8_t *b = p->free[s.cls][j];
      if (b < s.base || b >= s.base + s.bytes) p->free[s.cls][k++] = b;
    }
    p->nfree[s.cls] = k;
    memmove(&p->slabs[i], &p->slabs[i + 1], (p->nslabs - i - 1) * sizeof *p->slabs);
    p->nslabs--;
    p->slab_total -= s.bytes;
    region_free(p, s.base);
    released += s.bytes;
  }
  for (size_t i = 0; i < p->narenas;) {
    spw_arena_stats_t st;
    spw__arena_get_stats(p->arenas[i].alloc, &st);
    if (st.in_use != 0) {
      i++;
      continue;
    }
    arena_t a = p->arenas[i];
    memmove(&p->arenas[i], &p->arenas[i + 1], (p->narenas - i - 1) * sizeof *p->arenas);
    p->narenas--;
    spw__arena_destroy(a.alloc);
    region_free(p, a.base);
    released += a.bytes;
  }
  pthread_mutex_unlock(&p->mu);
  return released;
}

int spw__dpool_region_of(spw_dpool_t *p, const void *ptr, size_t bytes, void **base) {
  if (!p->p.exportable) return SPW_ERR_UNSUPPORTED;
  const uint8_t *b = ptr;
  int st = SPW_ERR_INVALID_ARG;
  pthread_mutex_lock(&p->mu);
  slab_t *s = slab_of(p, ptr);
  arena_t *a = s ? NULL : arena_of(p, ptr);
  uint8_t *rbase = s ? s->base : a ? a->base : NULL;
  size_t rbytes = s ? s->bytes : a ? a->bytes : 0;
  if (rbase && bytes <= rbytes - (size_t)(b - rbase)) {
    *base = rbase;
    st = SPW_OK;
  }
  pthread_mutex_unlock(&p->mu);
  return st;
}
