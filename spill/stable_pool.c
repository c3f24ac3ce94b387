/* SPDX-License-Identifier: Apache-2.0 */
/* Address ranges and physical chunks for address-stable buffers (contract in
 * stable_pool.h; the design and its costs in docs/design.md, "Address-stable buffers").
 *
 * A region is one reserved range: a buffer's own (`large`: at least a granule, rounded up
 * to whole granules, one chunk of the range's size while mapped) or a shared page of one
 * granule cut into blocks of one power-of-two size class (`small`), whose single chunk is
 * mapped while any of its blocks is. Regions are kept sorted by address for lookup by
 * pointer.
 *
 * Why one chunk per large buffer, not one per granule: making a mapping accessible
 * (cuMemSetAccess) costs about 20 us per physical allocation behind the range, whatever its
 * size (2 MiB or 512 MiB), and about 1 ms per call while a device-to-host copy runs
 * (bench/vmm_chunks on an H100, docs/benchmarks.md). Per 2 MiB granule that is as long as
 * the granule's copy, and an unspill paid it before its copy could start. Pooled chunks are
 * therefore reused by exact size: a workload's buffers mostly repeat a few sizes, and a
 * chunk of another size is created (about 10 us) rather than assembled.
 *
 * Why a page whose last block left may stay mapped ("idle"): a small buffer's map or unmap
 * costs its page's whole cuMemSetAccess or cuMemUnmap when it is the page's first or last,
 * about 1 us per 64 KiB block when a page's 32 blocks come and go together, as long as the
 * blocks' copies. An idle page is kept as the device pool keeps the free blocks of its
 * slabs for ordinary small buffers: outside the budget and the chunk pool's cap, until the
 * device refuses memory (the retry path trims both) or its last owned block is freed. Until
 * then a block of it comes back with no driver call. Under the chunk pool's cap instead (one
 * eighth of the limit), a 64 KiB spill_bw row keeps 128 of its 512 pages and gains nothing
 * (docs/benchmarks.md).
 *
 * Why small buffers share pages: a granule is 2 MiB on current GPUs, so a 64 KiB buffer
 * with its own range would pin 32 times its size whenever resident. Sharing costs what a
 * page's other blocks keep mapped: a spilled small buffer frees device memory only when the
 * last resident block of its page leaves. The budget counts buffers by their size, as for
 * every buffer; the rounding of large ranges, the mapped part of pages and the pooled
 * chunks are outside it, like the free blocks of the device pool's slabs.
 *
 * Invariants (under mu):
 *  - a block is in exactly one of: free (on its page's free stack or past `next`), owned
 *    (reserved, not dead), dead (unreserved while still mapped: freed by its last unmap);
 *  - maps are counted, per block and per large region: a buffer's memory is mapped while
 *    its count is above 0. A spill commits before it unmaps (the unmap follows the commit,
 *    outside the slot's mutex), so an unspill may map the buffer again before the spill's
 *    unmap came: the count keeps the memory mapped for it, and the late unmap only lowers
 *    the count. The core pairs every map with one unmap, as it pairs allocations and frees;
 *  - page->resident == number of blocks with maps > 0; the page's chunk is mapped iff
 *    resident > 0 or the page is idle (resident == 0, live > 0, counted in nidle); a large
 *    region's chunk is mapped iff lmaps > 0;
 *  - pooled chunks are mapped nowhere; pooled_bytes (their sizes) <= pool_cap; idle_bytes
 *    is the idle pages' span.
 */
#include "stable_pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "grow.h"

#define MIN_SHIFT 8u /* 256 B: the alignment every device allocation has */

typedef struct region {
  uint8_t *va;
  size_t span;  /* bytes reserved: whole granules */
  int small;
  /* large */
  uint32_t lmaps;   /* outstanding maps: mapped iff > 0 */
  int dead;
  /* small page */
  uint32_t cls, block, blocks; /* class, block size, blocks per page */
  uint32_t next;               /* blocks [next, blocks) were never handed out */
  uint32_t live;               /* owned or dead blocks */
  uint32_t resident;           /* mapped blocks (maps[b] > 0) */
  int idle;                    /* resident == 0 and the chunk still mapped (see above) */
  uint32_t *free_stack;        /* blocks given back, reused first */
  uint32_t nfree;
  uint8_t *state;              /* per block: BLOCK_* bits */
  uint16_t *bmaps;             /* per block: outstanding maps */
  /* both: the chunk behind the range (span bytes) while mapped (large: lmaps > 0; small:
   * resident > 0) */
  uint64_t chunk;
} region_t;

typedef struct pooled {
  uint64_t chunk;
  size_t bytes;
} pooled_t;

#define BLOCK_OWNED 0x1u
#define BLOCK_DEAD 0x4u

struct spw_stable {
  spw_stable_params_t p;
  pthread_mutex_t mu;
  int gran_status; /* 1: not asked yet */
  size_t gran;
  uint32_t nclasses;
  region_t **regions; /* sorted by va */
  size_t nregions, rcap;
  _Atomic size_t live_regions; /* read without mu: no regions, no lookup */
  pooled_t *pool; /* unmapped chunks, newest last */
  size_t npool, pcap;
  size_t nidle; /* idle pages, idle_bytes in all */
  uint64_t idle_bytes;
  uint64_t pooled_bytes, mapped_bytes, reserved_bytes;
};

int spw__stable_create(const spw_stable_params_t *p, spw_stable_t **out) {
  spw_stable_t *sp = calloc(1, sizeof *sp);
  if (!sp) return SPW_ERR_SYSTEM;
  sp->p = *p;
  sp->gran_status = 1;
  pthread_mutex_init(&sp->mu, NULL);
  *out = sp;
  return SPW_OK;
}

static int granularity_locked(spw_stable_t *sp) {
  if (sp->gran_status == 1) {
    sp->gran_status = sp->p.ops->vm_granularity
                          ? sp->p.ops->vm_granularity(sp->p.be, &sp->gran)
                          : SPW_ERR_UNSUPPORTED;
    if (sp->gran_status == SPW_OK && (sp->gran < ((size_t)1 << (MIN_SHIFT + 1)) ||
                                      (sp->gran & (sp->gran - 1))))
      sp->gran_status = SPW_ERR_UNSUPPORTED; /* not a power of two we can cut into blocks */
    if (sp->gran_status == SPW_OK) {
      while (((size_t)1 << (MIN_SHIFT + sp->nclasses)) < sp->gran) sp->nclasses++;
    }
  }
  return sp->gran_status;
}

int spw__stable_granularity(spw_stable_t *sp, size_t *out) {
  pthread_mutex_lock(&sp->mu);
  int st = granularity_locked(sp);
  if (st == SPW_OK) *out = sp->gran;
  pthread_mutex_unlock(&sp->mu);
  return st;
}

/* The region whose range holds ptr, or NULL; its index in *at when found. */
static region_t *find(spw_stable_t *sp, const void *ptr, size_t *at) {
  const uint8_t *b = ptr;
  size_t lo = 0, hi = sp->nregions;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (sp->regions[mid]->va <= b) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return NULL;
  region_t *r = sp->regions[lo - 1];
  if (b >= r->va + r->span) return NULL;
  if (at) *at = lo - 1;
  return r;
}

static int insert(spw_stable_t *sp, region_t *r) {
  region_t **g = spw__grow(sp->regions, &sp->rcap, sp->nregions + 1, sizeof *g, 64);
  if (!g) return SPW_ERR_SYSTEM;
  sp->regions = g;
  size_t lo = 0, hi = sp->nregions;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (sp->regions[mid]->va < r->va) lo = mid + 1;
    else hi = mid;
  }
  memmove(&sp->regions[lo + 1], &sp->regions[lo], (sp->nregions - lo) * sizeof *sp->regions);
  sp->regions[lo] = r;
  sp->nregions++;
  atomic_store_explicit(&sp->live_regions, sp->nregions, memory_order_release);
  return SPW_OK;
}

/* Unmaps an idle page and gives its chunk back to the device, not to the pool: an idle page
 * goes when the device wants its memory back (a trim) or with its last owned block. */
static void drop_idle(spw_stable_t *sp, region_t *r) {
  r->idle = 0;
  sp->nidle--;
  sp->idle_bytes -= r->span;
  if (sp->p.ops->chunk_unmap(sp->p.be, r->va, r->span) == SPW_OK)
    sp->p.ops->chunk_release(sp->p.be, r->chunk, r->span);
}

/* Removes r (nothing mapped in it but an idle page's chunk) and gives its range back. */
static void drop(spw_stable_t *sp, region_t *r) {
  if (r->idle) drop_idle(sp, r);
  size_t at;
  if (find(sp, r->va, &at) == r) {
    memmove(&sp->regions[at], &sp->regions[at + 1], (sp->nregions - at - 1) * sizeof *sp->regions);
    sp->nregions--;
    atomic_store_explicit(&sp->live_regions, sp->nregions, memory_order_release);
  }
  (void)sp->p.ops->vm_free(sp->p.be, r->va, r->span);
  sp->reserved_bytes -= r->span;
  free(r->free_stack);
  free(r->state);
  free(r->bmaps);
  free(r);
}

static region_t *new_region(spw_stable_t *sp, size_t span, int *st) {
  region_t *r = calloc(1, sizeof *r);
  if (!r) {
    *st = SPW_ERR_SYSTEM;
    return NULL;
  }
  void *va = NULL;
  *st = sp->p.ops->vm_reserve(sp->p.be, span, &va);
  if (*st != SPW_OK) {
    free(r);
    return NULL;
  }
  r->va = va;
  r->span = span;
  sp->reserved_bytes += span;
  return r;
}

static int reserve_large(spw_stable_t *sp, size_t bytes, void **out) {
  size_t span = (bytes + sp->gran - 1) & ~(sp->gran - 1);
  int st;
  region_t *r = new_region(sp, span, &st);
  if (!r) return st;
  if (insert(sp, r) != SPW_OK) {
    drop(sp, r); /* not inserted: drop only frees it */
    return SPW_ERR_SYSTEM;
  }
  *out = r->va;
  return SPW_OK;
}

static int reserve_small(spw_stable_t *sp, size_t bytes, void **out) {
  uint32_t cls = 0;
  while (((size_t)1 << (MIN_SHIFT + cls)) < bytes) cls++;
  /* A page of this class with a free block: the lowest address first, which keeps the
   * live blocks packed into few pages. */
  region_t *page = NULL;
  for (size_t i = 0; i < sp->nregions && !page; i++) {
    region_t *r = sp->regions[i];
    if (r->small && r->cls == cls && (r->nfree > 0 || r->next < r->blocks)) page = r;
  }
  if (!page) {
    int st;
    page = new_region(sp, sp->gran, &st);
    if (!page) return st;
    page->small = 1;
    page->cls = cls;
    page->block = 1u << (MIN_SHIFT + cls);
    page->blocks = (uint32_t)(sp->gran / page->block);
    page->free_stack = malloc(page->blocks * sizeof *page->free_stack);
    page->state = calloc(page->blocks, 1);
    page->bmaps = calloc(page->blocks, sizeof *page->bmaps);
    if (!page->free_stack || !page->state || !page->bmaps || insert(sp, page) != SPW_OK) {
      drop(sp, page);
      return SPW_ERR_SYSTEM;
    }
  }
  uint32_t b = page->nfree > 0 ? page->free_stack[--page->nfree] : page->next++;
  page->state[b] = BLOCK_OWNED;
  page->live++;
  *out = page->va + (size_t)b * page->block;
  return SPW_OK;
}

int spw__stable_reserve(spw_stable_t *sp, size_t bytes, void **va) {
  pthread_mutex_lock(&sp->mu);
  int st = granularity_locked(sp);
  if (st == SPW_OK) st = bytes >= sp->gran ? reserve_large(sp, bytes, va) : reserve_small(sp, bytes, va);
  pthread_mutex_unlock(&sp->mu);
  return st;
}

/* A block's address, or UINT32_MAX when ptr is not the start of one. */
static uint32_t block_of(const region_t *page, const void *ptr) {
  size_t off = (size_t)((const uint8_t *)ptr - page->va);
  if (off % page->block) return UINT32_MAX;
  return (uint32_t)(off / page->block);
}

static void free_block(spw_stable_t *sp, region_t *page, uint32_t b) {
  page->state[b] = 0;
  page->free_stack[page->nfree++] = b;
  if (--page->live == 0) drop(sp, page); /* nothing mapped: resident counts mapped blocks */
}

void spw__stable_unreserve(spw_stable_t *sp, void *va) {
  pthread_mutex_lock(&sp->mu);
  region_t *r = find(sp, va, NULL);
  if (r && !r->small && r->va == va && !r->dead) {
    if (r->lmaps > 0) r->dead = 1; /* the last unmap frees it */
    else drop(sp, r);
  } else if (r && r->small) {
    uint32_t b = block_of(r, va);
    if (b != UINT32_MAX && b < r->next && r->state[b] == BLOCK_OWNED) {
      if (r->bmaps[b] > 0) r->state[b] = BLOCK_DEAD;
      else free_block(sp, r, b);
    }
  }
  pthread_mutex_unlock(&sp->mu);
}

/* A chunk of `bytes`: the newest pooled one of that size, else a new one. */
static int chunk_get(spw_stable_t *sp, size_t bytes, uint64_t *out) {
  for (size_t i = sp->npool; i-- > 0;) {
    if (sp->pool[i].bytes != bytes) continue;
    *out = sp->pool[i].chunk;
    sp->pool[i] = sp->pool[--sp->npool];
    sp->pooled_bytes -= bytes;
    return SPW_OK;
  }
  return sp->p.ops->chunk_create(sp->p.be, bytes, out);
}

/* Makes `bytes` of room under the cap by giving the oldest pooled chunks back (sizes in use
 * change, and the newest chunk is the likeliest to fit the next unspill). False if `bytes`
 * exceeds the cap. */
static int make_room(spw_stable_t *sp, size_t bytes) {
  if (bytes > sp->p.pool_cap) return 0;
  while (sp->pooled_bytes + bytes > sp->p.pool_cap && sp->npool > 0) {
    pooled_t old = sp->pool[0];
    memmove(&sp->pool[0], &sp->pool[1], (sp->npool - 1) * sizeof *sp->pool);
    sp->npool--;
    sp->pooled_bytes -= old.bytes;
    sp->p.ops->chunk_release(sp->p.be, old.chunk, old.bytes);
  }
  return 1;
}

/* Back to the pool, room made for it under the cap; a chunk larger than the cap goes back to
 * the device. */
static void chunk_put(spw_stable_t *sp, uint64_t c, size_t bytes) {
  if (make_room(sp, bytes)) {
    pooled_t *g = spw__grow(sp->pool, &sp->pcap, sp->npool + 1, sizeof *g, 64);
    if (g) {
      sp->pool = g;
      sp->pool[sp->npool++] = (pooled_t){c, bytes};
      sp->pooled_bytes += bytes;
      return;
    }
  }
  sp->p.ops->chunk_release(sp->p.be, c, bytes);
}

/* The region's chunk, all `span` bytes of it, at its address. */
static int map_region(spw_stable_t *sp, region_t *r) {
  int st = chunk_get(sp, r->span, &r->chunk);
  if (st != SPW_OK) return st;
  st = sp->p.ops->chunk_map(sp->p.be, r->va, r->span, r->chunk);
  if (st != SPW_OK) chunk_put(sp, r->chunk, r->span);
  else sp->mapped_bytes += r->span;
  return st;
}

static void unmap_region(spw_stable_t *sp, region_t *r) {
  /* A failed unmap leaves the chunk mapped: it cannot be reused, so it is not pooled. */
  if (sp->p.ops->chunk_unmap(sp->p.be, r->va, r->span) == SPW_OK) chunk_put(sp, r->chunk, r->span);
  sp->mapped_bytes -= r->span;
}

/* A page whose last mapped block left: kept mapped and idle while it still has owned blocks,
 * else unmapped (it is about to be dropped). */
static void rest_or_unmap(spw_stable_t *sp, region_t *page, uint32_t live_after) {
  if (live_after == 0) {
    unmap_region(sp, page);
    return;
  }
  page->idle = 1;
  sp->nidle++;
  sp->mapped_bytes -= page->span;
  sp->idle_bytes += page->span;
}

/* An idle page's first block is mapped again: nothing to call. */
static int wake(spw_stable_t *sp, region_t *page) {
  page->idle = 0;
  sp->nidle--;
  sp->idle_bytes -= page->span;
  sp->mapped_bytes += page->span;
  return SPW_OK;
}

int spw__stable_map(spw_stable_t *sp, void *va) {
  pthread_mutex_lock(&sp->mu);
  int st = SPW_ERR_INTERNAL;
  region_t *r = find(sp, va, NULL);
  if (r && !r->small && r->va == va && !r->dead && r->lmaps > 0) {
    r->lmaps++; /* still mapped: an unmap is on its way (see the invariants) */
    st = SPW_OK;
  } else if (r && !r->small && r->va == va && !r->dead) {
    st = map_region(sp, r);
    if (st == SPW_OK) r->lmaps = 1;
  } else if (r && r->small) {
    uint32_t b = block_of(r, va);
    if (b != UINT32_MAX && b < r->next && r->state[b] == BLOCK_OWNED && r->bmaps[b] < UINT16_MAX) {
      st = r->resident > 0 ? SPW_OK : r->idle ? wake(sp, r) : map_region(sp, r);
      if (st == SPW_OK && r->bmaps[b]++ == 0) r->resident++;
    }
  }
  pthread_mutex_unlock(&sp->mu);
  return st;
}

int spw__stable_unmap(spw_stable_t *sp, void *va) {
  pthread_mutex_lock(&sp->mu);
  int st = SPW_ERR_INTERNAL;
  region_t *r = find(sp, va, NULL);
  if (r && !r->small && r->va == va && r->lmaps > 0) {
    if (--r->lmaps == 0) {
      unmap_region(sp, r);
      if (r->dead) drop(sp, r);
    }
    st = SPW_OK;
  } else if (r && r->small) {
    uint32_t b = block_of(r, va);
    if (b != UINT32_MAX && b < r->next && r->bmaps[b] > 0) {
      if (--r->bmaps[b] == 0) {
        if (--r->resident == 0) rest_or_unmap(sp, r, r->live - !!(r->state[b] & BLOCK_DEAD));
        if (r->state[b] & BLOCK_DEAD) free_block(sp, r, b);
      }
      st = SPW_OK;
    }
  }
  pthread_mutex_unlock(&sp->mu);
  return st;
}

int spw__stable_share(spw_stable_t *sp, const void *va, int *fd, uint64_t *fd_offset,
                      size_t *chunk_bytes, size_t *offset) {
  pthread_mutex_lock(&sp->mu);
  region_t *r = find(sp, va, NULL);
  int st = SPW_ERR_INVALID_ARG;
  if (r && !r->small && r->va == va && !r->dead) {
    st = r->lmaps > 0 ? SPW_OK : SPW_ERR_NOT_LOCKED;
  } else if (r && r->small) {
    uint32_t b = block_of(r, va);
    if (b != UINT32_MAX && b < r->next && r->state[b] == BLOCK_OWNED)
      st = r->bmaps[b] > 0 ? SPW_OK : SPW_ERR_NOT_LOCKED;
  }
  /* Under mu: the chunk stays where it is while its descriptor is made. */
  if (st == SPW_OK) st = sp->p.ops->chunk_export(sp->p.be, r->chunk, fd, fd_offset);
  if (st == SPW_OK) {
    *chunk_bytes = r->span;
    *offset = (size_t)((const uint8_t *)va - r->va);
  }
  pthread_mutex_unlock(&sp->mu);
  return st;
}

int spw__stable_owns(spw_stable_t *sp, const void *ptr) {
  if (!sp || !ptr || atomic_load_explicit(&sp->live_regions, memory_order_acquire) == 0) return 0;
  pthread_mutex_lock(&sp->mu);
  int owns = find(sp, ptr, NULL) != NULL;
  pthread_mutex_unlock(&sp->mu);
  return owns;
}

uint64_t spw__stable_trim(spw_stable_t *sp) {
  pthread_mutex_lock(&sp->mu);
  uint64_t released = sp->pooled_bytes + sp->idle_bytes;
  for (size_t i = 0; sp->nidle > 0 && i < sp->nregions; i++)
    if (sp->regions[i]->idle) drop_idle(sp, sp->regions[i]);
  for (size_t i = 0; i < sp->npool; i++)
    sp->p.ops->chunk_release(sp->p.be, sp->pool[i].chunk, sp->pool[i].bytes);
  sp->npool = 0;
  sp->pooled_bytes = 0;
  pthread_mutex_unlock(&sp->mu);
  return released;
}

void spw__stable_usage(spw_stable_t *sp, uint64_t *mapped, uint64_t *pooled, uint64_t *reserved) {
  pthread_mutex_lock(&sp->mu);
  if (mapped) *mapped = sp->mapped_bytes;
  if (pooled) *pooled = sp->pooled_bytes + sp->idle_bytes;
  if (reserved) *reserved = sp->reserved_bytes;
  pthread_mutex_unlock(&sp->mu);
}

void spw__stable_destroy(spw_stable_t *sp) {
  if (!sp) return;
  /* Whatever is left (a runtime closed with buffers): unmap, then give the ranges back. */
  while (sp->nregions > 0) {
    region_t *r = sp->regions[sp->nregions - 1];
    if (r->small ? r->resident > 0 : r->lmaps > 0) unmap_region(sp, r);
    drop(sp, r);
  }
  spw__stable_trim(sp);
  free(sp->regions);
  free(sp->pool);
  pthread_mutex_destroy(&sp->mu);
  free(sp);
}
