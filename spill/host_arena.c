/* SPDX-License-Identifier: Apache-2.0 */
/* The pinned host arena (see host_arena.h): slabs of anonymous memory, populated at mmap
 * time and registered with the backend, sub-allocated first fit in 4096-byte units.
 *
 * Each slab keeps its free space as a sorted array of ranges with no two adjacent (freeing
 * coalesces with both neighbours). The array always has room for one more range than the
 * slab has live extents: free ranges are the gaps between extents, so there are never more
 * than extents + 1 of them, and spw__arena_free (which cannot fail) never allocates. The
 * room is made in spw__arena_alloc, before anything is changed.
 *
 * Slab sizes: slab_bytes, or less when only less fits under the limit (so the last part of
 * the limit is usable), or a dedicated slab of the request's own size when the request is
 * larger than slab_bytes. mapped <= limit at every moment.
 *
 * Empty slabs: a dedicated slab is given back as soon as its extent is. At most KEEP_EMPTY
 * empty ordinary slabs are kept mapped and registered, so that a buffer spilled and unspilled over
 * and over does not pay a 256 MiB mmap + populate + register each time; a second slab
 * that empties is given back, and the kept one is given back when a new slab needs its
 * room under the limit. Allocation prefers slabs in use, so the kept one stays empty when
 * it can. A reservation (spw__arena_reserve, spw_host_reserve) keeps more: empty slabs go
 * back only while its floor stays mapped, so that a program that pinned its working set
 * before its first spill does not pin it again, slab by slab, in the middle of a sweep.
 *
 * Locking: one mutex guards everything. mmap, populate and registration of a new slab run
 * under it (header contract: only host_register / host_unregister of a slab being added or
 * removed are called with it held). That serializes allocation for the few milliseconds a
 * slab takes to map, which is rare (once per slab_bytes) and keeps the limit exact.
 */
#include "host_arena.h"

#include "grow.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEFAULT_SLAB_BYTES ((size_t)256 << 20)
#define INITIAL_RANGES 16

typedef struct free_range {
  size_t off, len;
} free_range_t;

typedef struct slab {
  uint8_t *base;
  size_t bytes;
  size_t in_use;
  size_t extents;     /* live extents */
  int dedicated;      /* mapped for one request larger than slab_bytes */
  int borrowed;       /* someone else's memory (spw__arena_create_borrowed): never unmapped */
  free_range_t *free; /* sorted by off, coalesced */
  size_t nfree, cap;  /* cap >= extents + 1 */
} slab_t;

struct spw_host_arena {
  const spw_backend_ops_t *ops;
  spw_backend_t *b;
  uint64_t limit; /* 0 = none */
  size_t slab_bytes;
  size_t page; /* slab sizes are multiples of this: max(system page, SPW_ARENA_ALIGN) */
  pthread_mutex_t mu;
  pthread_cond_t grown; /* a slab mapped ahead was added (or its mapping failed) */
  slab_t **slots; /* slot i holds the slab of extents with .slab == i; NULL = unused */
  uint32_t nslots;
  uint64_t in_use, mapped, nslabs;
  uint64_t growing; /* bytes of a slab being mapped ahead, outside the mutex */
  uint64_t floor;   /* empty ordinary slabs go back only while this much of them stays */
  uint64_t dedicated_mapped; /* the part of `mapped` in dedicated slabs */
  int borrowed;     /* one borrowed slab, no growth (spw__arena_create_borrowed) */
};

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

int spw__arena_create(const spw_backend_ops_t *ops, spw_backend_t *b, uint64_t limit,
                      size_t slab_bytes, spw_host_arena_t **out) {
  if (!ops || !ops->host_register || !ops->host_unregister || !out) return SPW_ERR_INVALID_ARG;
  long sys_page = sysconf(_SC_PAGESIZE);
  size_t page = sys_page > (long)SPW_ARENA_ALIGN ? (size_t)sys_page : SPW_ARENA_ALIGN;
  if (slab_bytes == 0) slab_bytes = DEFAULT_SLAB_BYTES;
  if (slab_bytes > SIZE_MAX - page) return SPW_ERR_INVALID_ARG;
  slab_bytes = round_up(slab_bytes, page);

  spw_host_arena_t *a = calloc(1, sizeof *a);
  if (!a) return SPW_ERR_SYSTEM;
  if (pthread_mutex_init(&a->mu, NULL) != 0) {
    free(a);
    return SPW_ERR_SYSTEM;
  }
  pthread_cond_init(&a->grown, NULL);
  a->ops = ops;
  a->b = b;
  a->limit = limit;
  a->slab_bytes = slab_bytes;
  a->page = page;
  *out = a;
  return SPW_OK;
}

int spw__arena_create_borrowed(void *base, size_t bytes, spw_host_arena_t **out) {
  if (!base || bytes < SPW_ARENA_ALIGN || (uintptr_t)base % SPW_ARENA_ALIGN || !out)
    return SPW_ERR_INVALID_ARG;
  bytes -= bytes % SPW_ARENA_ALIGN;
  spw_host_arena_t *a = calloc(1, sizeof *a);
  slab_t *s = calloc(1, sizeof *s);
  free_range_t *f = malloc(INITIAL_RANGES * sizeof *f);
  slab_t **slots = calloc(1, sizeof *slots);
  if (!a || !s || !f || !slots || pthread_mutex_init(&a->mu, NULL) != 0) {
    free(a);
    free(s);
    free(f);
    free(slots);
    return SPW_ERR_SYSTEM;
  }
  pthread_cond_init(&a->grown, NULL);
  *s = (slab_t){.base = base, .bytes = bytes, .borrowed = 1, .free = f,
                .cap = INITIAL_RANGES, .nfree = 1};
  f[0] = (free_range_t){0, bytes};
  slots[0] = s;
  a->slots = slots;
  a->nslots = 1;
  a->mapped = bytes;
  a->nslabs = 1;
  a->limit = bytes;
  a->slab_bytes = bytes;
  a->page = SPW_ARENA_ALIGN;
  a->borrowed = 1;
  *out = a;
  return SPW_OK;
}

/* Unregisters, unmaps and forgets slot i. Called with the mutex held. */
static void release_slab(spw_host_arena_t *a, uint32_t i) {
  slab_t *s = a->slots[i];
  /* An unregister failure cannot be reported from here (free and destroy cannot fail);
   * unmapping anyway at worst leaves the pages pinned by the driver until exit, which is
   * better than keeping an unusable slab counted against the limit. */
  if (!s->borrowed) {
    (void)a->ops->host_unregister(a->b, s->base);
    munmap(s->base, s->bytes);
  }
  a->mapped -= s->bytes;
  if (s->dedicated) a->dedicated_mapped -= s->bytes;
  a->nslabs--;
  free(s->free);
  free(s);
  a->slots[i] = NULL;
}

void spw__arena_destroy(spw_host_arena_t *a) {
  if (!a) return;
  for (uint32_t i = 0; i < a->nslots; i++)
    if (a->slots[i]) release_slab(a, i);
  free(a->slots);
  pthread_cond_destroy(&a->grown);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

/* The free range where `need` bytes fit first, or -1. */
static long find_fit(const slab_t *s, size_t need) {
  for (size_t r = 0; r < s->nfree; r++)
    if (s->free[r].len >= need) return (long)r;
  return -1;
}

/* Makes room for extents + 2 ranges, so the invariant holds after one more extent. */
static int reserve_ranges(slab_t *s) {
  free_range_t *f = spw__grow(s->free, &s->cap, s->extents + 2, sizeof *f, INITIAL_RANGES);
  if (!f) return SPW_ERR_SYSTEM;
  s->free = f;
  return SPW_OK;
}

/* Carves `need` bytes from the front of range r. Cannot fail. */
static size_t take(spw_host_arena_t *a, slab_t *s, size_t r, size_t need) {
  size_t off = s->free[r].off;
  s->free[r].off += need;
  s->free[r].len -= need;
  if (s->free[r].len == 0) {
    memmove(&s->free[r], &s->free[r + 1], (s->nfree - r - 1) * sizeof s->free[0]);
    s->nfree--;
  }
  s->in_use += need;
  s->extents++;
  a->in_use += need;
  return off;
}

/* Empty ordinary slabs kept mapped and pinned: spilling again after an unspill then costs no
 * mmap + populate + register (about 0.3 s per 256 MiB on a small VM). */
#define KEEP_EMPTY 2

/* Whether an empty slab goes back: a dedicated one always (sized for one request), an
 * ordinary one past the KEEP_EMPTY kept, and then only while the floor stays mapped. */
static int give_back(const spw_host_arena_t *a, uint32_t slot);

/* Empty ordinary slabs other than slot `except`. */
static unsigned count_spares(const spw_host_arena_t *a, long except) {
  unsigned n = 0;
  for (uint32_t i = 0; i < a->nslots; i++)
    if ((long)i != except && a->slots[i] && a->slots[i]->extents == 0 && !a->slots[i]->dedicated)
      n++;
  return n;
}

/* An empty ordinary slab other than slot `except` (the kept one), or -1. */
static long find_spare(const spw_host_arena_t *a, long except) {
  for (uint32_t i = 0; i < a->nslots; i++)
    if ((long)i != except && a->slots[i] && a->slots[i]->extents == 0 &&
        !a->slots[i]->dedicated)
      return (long)i;
  return -1;
}

/* What a reservation counts: dedicated slabs go back whatever the floor. */
static uint64_t ordinary_mapped(const spw_host_arena_t *a) {
  return a->mapped - a->dedicated_mapped;
}

static int give_back(const spw_host_arena_t *a, uint32_t slot) {
  const slab_t *s = a->slots[slot];
  if (s->dedicated) return 1;
  return count_spares(a, (long)slot) >= KEEP_EMPTY && ordinary_mapped(a) - s->bytes >= a->floor;
}

/* A free slot index (growing the slot array if needed), or -1. Called with the mutex held. */
static long free_slot(spw_host_arena_t *a) {
  uint32_t i = 0;
  while (i < a->nslots && a->slots[i]) i++;
  if (i == a->nslots) {
    if (a->nslots >= UINT32_MAX / 2) return -1;
    size_t n = a->nslots;
    slab_t **t = spw__grow(a->slots, &n, (size_t)a->nslots + 1, sizeof *t, 8);
    if (!t) return -1;
    memset(t + a->nslots, 0, (n - a->nslots) * sizeof *t);
    a->slots = t;
    a->nslots = (uint32_t)n;
  }
  return (long)i;
}

/* Maps, populates and registers `size` bytes as a slab (no arena lock needed). MAP_POPULATE
 * faults every page in now: registering memory already present is fast, and the faults are
 * not paid later inside a copy. */
static int map_slab(spw_host_arena_t *a, size_t size, int dedicated, slab_t **out) {
  slab_t *s = calloc(1, sizeof *s);
  free_range_t *f = malloc(INITIAL_RANGES * sizeof *f);
  if (!s || !f) {
    free(s);
    free(f);
    return SPW_ERR_SYSTEM;
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    free(s);
    free(f);
    return SPW_ERR_SYSTEM;
  }
  int st = a->ops->host_register(a->b, p, size);
  if (st != SPW_OK) {
    munmap(p, size);
    free(s);
    free(f);
    return st;
  }
  *s = (slab_t){.base = p, .bytes = size, .dedicated = dedicated, .free = f,
                .cap = INITIAL_RANGES, .nfree = 1};
  f[0].off = 0;
  f[0].len = size;
  *out = s;
  return SPW_OK;
}

static void insert_slab(spw_host_arena_t *a, slab_t *s, uint32_t i) {
  a->slots[i] = s;
  a->mapped += s->bytes;
  if (s->dedicated) a->dedicated_mapped += s->bytes;
  a->nslabs++;
}

/* Room under the limit for a new slab, counting one being mapped ahead. */
static uint64_t room_left(const spw_host_arena_t *a) {
  uint64_t taken = a->mapped + a->growing;
  return a->limit > taken ? a->limit - taken : 0;
}

/* Maps, populates and registers a slab for a request of `need` bytes (already rounded) into
 * a free slot. Called with the mutex held. */
static int add_slab(spw_host_arena_t *a, size_t need, uint32_t *slot) {
  if (a->borrowed) return SPW_ERR_HOST_OUT_OF_MEMORY;
  int dedicated = need > a->slab_bytes;
  size_t size = a->slab_bytes;
  if (dedicated) {
    if (need > SIZE_MAX - a->page) return SPW_ERR_HOST_OUT_OF_MEMORY;
    size = round_up(need, a->page);
  }

  if (a->limit) {
    uint64_t room = room_left(a);
    /* Kept empty slabs make way for the new one (they only save mapping time). */
    for (long spare; room < size && (spare = find_spare(a, -1)) >= 0;) {
      room += a->slots[spare]->bytes;
      release_slab(a, (uint32_t)spare);
    }
    if (room < size && !dedicated) size = (size_t)(room / a->page * a->page);
    if (room < size || size < need) return SPW_ERR_HOST_OUT_OF_MEMORY;
  }

  /* Find (or grow to) a free slot before mapping, so no failure follows registration. */
  long i = free_slot(a);
  if (i < 0) return SPW_ERR_SYSTEM;
  slab_t *s;
  int st = map_slab(a, size, dedicated, &s);
  if (st != SPW_OK) return st;
  insert_slab(a, s, (uint32_t)i);
  *slot = (uint32_t)i;
  return SPW_OK;
}

/* Maps an ordinary slab of `size` bytes outside the mutex, announced in `growing` so that
 * allocations that find no room wait for it rather than map another. Called and returns
 * with the mutex held, nothing growing. */
static int grow_outside(spw_host_arena_t *a, size_t size) {
  a->growing = size;
  pthread_mutex_unlock(&a->mu);
  slab_t *s = NULL;
  int st = map_slab(a, size, 0, &s);
  pthread_mutex_lock(&a->mu);
  long i = st == SPW_OK ? free_slot(a) : -1;
  if (i >= 0) insert_slab(a, s, (uint32_t)i);
  a->growing = 0;
  pthread_cond_broadcast(&a->grown);
  if (st == SPW_OK && i < 0) {
    (void)a->ops->host_unregister(a->b, s->base); /* a slab being removed: allowed here */
    munmap(s->base, s->bytes);
    free(s->free);
    free(s);
    st = SPW_ERR_SYSTEM;
  }
  return st;
}

int spw__arena_grow_ahead(spw_host_arena_t *a, uint64_t held) {
  if (a->borrowed) return 0;
  pthread_mutex_lock(&a->mu);
  uint64_t free_bytes = a->mapped - (held < a->in_use ? held : a->in_use);
  size_t size = a->slab_bytes;
  if (a->limit && room_left(a) < size) size = (size_t)(room_left(a) / a->page * a->page);
  int wanted = !a->growing && free_bytes < a->slab_bytes / 2 && find_spare(a, -1) < 0 &&
               size >= a->slab_bytes / 4;
  int added = wanted && grow_outside(a, size) == SPW_OK;
  pthread_mutex_unlock(&a->mu);
  return added;
}

int spw__arena_reserve(spw_host_arena_t *a, uint64_t bytes) {
  if (!a) return SPW_ERR_INVALID_ARG;
  pthread_mutex_lock(&a->mu);
  /* A borrowed arena's limit is its size, all mapped: it is refused or met here. */
  if ((a->limit && bytes > a->limit) || bytes > UINT64_MAX - a->page) {
    pthread_mutex_unlock(&a->mu);
    return SPW_ERR_HOST_OUT_OF_MEMORY;
  }
  a->floor = bytes;
  /* Whole pages, and under a limit that is no page multiple its last part page is out of
   * reach: that much counts as all of it. */
  uint64_t target = round_up(bytes, a->page);
  if (a->limit && target > a->limit / a->page * a->page) target = a->limit / a->page * a->page;
  int st = SPW_OK;
  while (st == SPW_OK && ordinary_mapped(a) < target) {
    if (a->growing) { /* mapped ahead meanwhile: counts once it lands */
      pthread_cond_wait(&a->grown, &a->mu);
      continue;
    }
    size_t size = a->slab_bytes;
    if (a->limit && room_left(a) < size) size = (size_t)(room_left(a) / a->page * a->page);
    /* The rest of the limit is held by slabs of single big buffers, which come and go. */
    if (size == 0) st = SPW_ERR_HOST_OUT_OF_MEMORY;
    else st = grow_outside(a, size);
  }
  /* What could be mapped stays, and so much is kept. */
  if (st != SPW_OK && a->floor > ordinary_mapped(a)) a->floor = ordinary_mapped(a);
  pthread_mutex_unlock(&a->mu);
  return st;
}

/* One allocation, the mutex held (it may be dropped while a slab mapped ahead lands). */
static int alloc_locked(spw_host_arena_t *a, size_t bytes, spw_host_extent_t *out) {
  if (bytes == 0 || bytes > SIZE_MAX - SPW_ARENA_ALIGN) return SPW_ERR_INVALID_ARG;
  size_t need = round_up(bytes, SPW_ARENA_ALIGN);
  int st = SPW_OK;
  uint32_t slot = 0;
  long r = -1;
  /* Pass 0: slabs in use; pass 1: the kept empty slab. */
  for (int pass = 0; pass < 2 && r < 0; pass++) {
    for (slot = 0; slot < a->nslots; slot++) {
      slab_t *s = a->slots[slot];
      if (!s || (s->extents == 0) != (pass == 1)) continue;
      if ((r = find_fit(s, need)) >= 0) break;
    }
  }
  if (r < 0 && a->growing && need <= a->growing) {
    /* A slab is being mapped ahead: wait for it rather than map a second one now. */
    while (a->growing) pthread_cond_wait(&a->grown, &a->mu);
    for (slot = 0; slot < a->nslots && r < 0; slot++)
      if (a->slots[slot] && (r = find_fit(a->slots[slot], need)) >= 0) break;
  }
  if (r < 0) {
    st = add_slab(a, need, &slot);
    if (st == SPW_OK) r = 0;
  }
  if (st == SPW_OK) st = reserve_ranges(a->slots[slot]);
  if (st != SPW_OK) {
    /* A slab just added for this request is empty again: apply the empty-slab policy. */
    if (r >= 0 && a->slots[slot]->extents == 0 && give_back(a, slot)) release_slab(a, slot);
    return st;
  }
  slab_t *s = a->slots[slot];
  size_t off = take(a, s, (size_t)r, need);
  out->ptr = s->base + off;
  out->bytes = need;
  out->slab = slot;
  out->peer = (uint32_t)a->borrowed;
  return SPW_OK;
}

int spw__arena_alloc(spw_host_arena_t *a, size_t bytes, spw_host_extent_t *out) {
  if (!a || !out) return SPW_ERR_INVALID_ARG;
  pthread_mutex_lock(&a->mu);
  int st = alloc_locked(a, bytes, out);
  pthread_mutex_unlock(&a->mu);
  return st;
}

size_t spw__arena_alloc_n(spw_host_arena_t *a, const size_t *bytes, size_t n,
                          spw_host_extent_t *out, int *status) {
  size_t i = 0;
  int st = SPW_OK;
  pthread_mutex_lock(&a->mu);
  for (; i < n && (st = alloc_locked(a, bytes[i], &out[i])) == SPW_OK; i++) {
  }
  pthread_mutex_unlock(&a->mu);
  if (status) *status = st;
  return i;
}

/* Index of the first free range starting after `off`. */
static size_t upper_bound(const slab_t *s, size_t off) {
  size_t lo = 0, hi = s->nfree;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->free[mid].off <= off) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Caller holds a->mu. */
static void free_locked(spw_host_arena_t *a, spw_host_extent_t *e) {
  if (!e->ptr) return;
  /* An extent that is not a live one of this arena (forged, or freed twice from a copy of
   * the struct) is ignored rather than corrupting the free lists. */
  slab_t *s = e->slab < a->nslots ? a->slots[e->slab] : NULL;
  uintptr_t p = (uintptr_t)e->ptr, base = s ? (uintptr_t)s->base : 0;
  if (!s || p < base || p - base >= s->bytes) return;
  size_t off = (size_t)(p - base), len = e->bytes;
  if (off % SPW_ARENA_ALIGN || len == 0 || len % SPW_ARENA_ALIGN || len > s->bytes - off)
    return;
  size_t i = upper_bound(s, off);
  free_range_t *prev = i > 0 ? &s->free[i - 1] : NULL;
  free_range_t *next = i < s->nfree ? &s->free[i] : NULL;
  if ((prev && prev->off + prev->len > off) || (next && next->off < off + len)) return;

  int join_prev = prev && prev->off + prev->len == off;
  int join_next = next && off + len == next->off;
  if (join_prev && join_next) {
    prev->len += len + next->len;
    memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof s->free[0]);
    s->nfree--;
  } else if (join_prev) {
    prev->len += len;
  } else if (join_next) {
    next->off = off;
    next->len += len;
  } else {
    /* Room is guaranteed: cap >= extents + 1 > nfree. */
    memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof s->free[0]);
    s->free[i].off = off;
    s->free[i].len = len;
    s->nfree++;
  }
  s->in_use -= len;
  s->extents--;
  a->in_use -= len;

  if (s->extents == 0 && give_back(a, e->slab)) release_slab(a, e->slab);
  e->ptr = NULL;
  e->bytes = 0;
}

void spw__arena_free(spw_host_arena_t *a, spw_host_extent_t *e) {
  if (!a || !e || !e->ptr) return;
  pthread_mutex_lock(&a->mu);
  free_locked(a, e);
  pthread_mutex_unlock(&a->mu);
}

void spw__arena_free_n(spw_host_arena_t *a, spw_host_extent_t *e, size_t n) {
  if (!a || !e || n == 0) return;
  pthread_mutex_lock(&a->mu);
  for (size_t i = 0; i < n; i++) free_locked(a, &e[i]);
  pthread_mutex_unlock(&a->mu);
}

void spw__arena_get_stats(spw_host_arena_t *a, spw_arena_stats_t *out) {
  if (!a || !out) return;
  pthread_mutex_lock(&a->mu);
  out->in_use = a->in_use;
  out->mapped = a->mapped;
  out->slabs = a->nslabs;
  out->limit = a->limit;
  pthread_mutex_unlock(&a->mu);
}
