/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the pinned host arena (spill/host_arena.c) over the real host backend.
 * The ops table given to the arena forwards host_register / host_unregister to
 * spw__backend_host_ops and records each call: the registrations are what several tests
 * observe (a slab given back is unregistered, a failed registration leaves nothing mapped),
 * and one switch makes the next registration fail the way cudaHostRegister would. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "host_arena.h"
#include "test_main.h"
#include "test_util.h"

/* Pointer checks use ASSERT_TRUE: ASSERT_PTR_EQ in test_util.h declares its second
 * operand as `const void` (one declaration, two declarators) and does not compile. */
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define SLAB MiB

/* ---- the recording ops table --------------------------------------------------------- */

#define MAX_REGIONS 4096

typedef struct region {
  uintptr_t base;
  size_t bytes;
} region_t;

static struct {
  pthread_mutex_t mu;
  region_t live[MAX_REGIONS]; /* registered now */
  size_t nlive;
  uint64_t attempts;              /* host_register calls */
  uint64_t registers, unregisters; /* successful ones */
  size_t last_register_bytes;
  void *last_register_ptr;
  void *last_unregister_ptr;
  int fail_next_register; /* status to return once, 0 = none */
  bool misuse;            /* a call the contract forbids was seen */
} rec = {.mu = PTHREAD_MUTEX_INITIALIZER};

static spw_backend_t *host_backend;
static spw_backend_ops_t rec_ops;

static int rec_register(spw_backend_t *b, void *ptr, size_t bytes) {
  pthread_mutex_lock(&rec.mu);
  long page = sysconf(_SC_PAGESIZE);
  if ((uintptr_t)ptr % (uintptr_t)page || bytes % (size_t)page || bytes == 0 ||
      rec.nlive == MAX_REGIONS)
    rec.misuse = true;
  rec.attempts++;
  rec.last_register_ptr = ptr;
  rec.last_register_bytes = bytes;
  int st = rec.fail_next_register;
  rec.fail_next_register = 0;
  if (st == SPW_OK) st = spw__backend_host_ops.host_register(b, ptr, bytes);
  if (st == SPW_OK) rec.registers++;
  if (st == SPW_OK && rec.nlive < MAX_REGIONS)
    rec.live[rec.nlive++] = (region_t){(uintptr_t)ptr, bytes};
  pthread_mutex_unlock(&rec.mu);
  return st;
}

static int rec_unregister(spw_backend_t *b, void *ptr) {
  pthread_mutex_lock(&rec.mu);
  rec.unregisters++;
  rec.last_unregister_ptr = ptr;
  size_t i = 0;
  while (i < rec.nlive && rec.live[i].base != (uintptr_t)ptr) i++;
  if (i == rec.nlive) rec.misuse = true; /* never registered, or unregistered twice */
  else rec.live[i] = rec.live[--rec.nlive];
  pthread_mutex_unlock(&rec.mu);
  return spw__backend_host_ops.host_unregister(b, ptr);
}

static void rec_reset(void) {
  pthread_mutex_lock(&rec.mu);
  rec.nlive = 0;
  rec.attempts = rec.registers = rec.unregisters = 0;
  rec.last_register_bytes = 0;
  rec.last_register_ptr = NULL;
  rec.last_unregister_ptr = NULL;
  rec.fail_next_register = 0;
  rec.misuse = false;
  pthread_mutex_unlock(&rec.mu);
}

static uint64_t registers(void) {
  pthread_mutex_lock(&rec.mu);
  uint64_t n = rec.registers;
  pthread_mutex_unlock(&rec.mu);
  return n;
}

static uint64_t unregisters(void) {
  pthread_mutex_lock(&rec.mu);
  uint64_t n = rec.unregisters;
  pthread_mutex_unlock(&rec.mu);
  return n;
}

/* The extent lies wholly inside one slab registered now. */
static bool in_registered_slab(const spw_host_extent_t *e) {
  pthread_mutex_lock(&rec.mu);
  bool ok = false;
  uintptr_t p = (uintptr_t)e->ptr;
  for (size_t i = 0; i < rec.nlive && !ok; i++)
    ok = p >= rec.live[i].base && p + e->bytes <= rec.live[i].base + rec.live[i].bytes;
  pthread_mutex_unlock(&rec.mu);
  return ok;
}

static spw_host_arena_t *new_arena(uint64_t limit, size_t slab_bytes) {
  rec_reset();
  spw_host_arena_t *a = NULL;
  ASSERT_OK(spw__arena_create(&rec_ops, host_backend, limit, slab_bytes, &a));
  return a;
}

/* Destroys the arena and checks that every slab was given back exactly once. */
static void end_arena(spw_host_arena_t *a) {
  spw__arena_destroy(a);
  ASSERT_UEQ(registers(), unregisters());
  ASSERT_TRUE(!rec.misuse);
  ASSERT_EQ(rec.nlive, 0);
}

static spw_arena_stats_t stats(spw_host_arena_t *a) {
  spw_arena_stats_t s;
  memset(&s, 0xFF, sizeof s);
  spw__arena_get_stats(a, &s);
  return s;
}

static bool is_mapped(const void *p) {
  unsigned char v;
  long page = sysconf(_SC_PAGESIZE);
  void *aligned = (void *)((uintptr_t)p & ~((uintptr_t)page - 1));
  return mincore(aligned, (size_t)page, &v) == 0 || errno != ENOMEM;
}

static size_t round4k(size_t n) { return (n + 4095) / 4096 * 4096; }

/* ---- tests --------------------------------------------------------------------------- */

static void extents_are_aligned_and_rounded(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  const size_t sizes[] = {1, 100, 4095, 4096, 4097, 64 * KiB + 1, 300 * KiB};
  spw_host_extent_t e[sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    ASSERT_OK(spw__arena_alloc(a, sizes[i], &e[i]));
    ASSERT_EQ((uintptr_t)e[i].ptr % SPW_ARENA_ALIGN, 0);
    ASSERT_UEQ(e[i].bytes, round4k(sizes[i]));
    ASSERT_TRUE(in_registered_slab(&e[i]));
  }
  spw_arena_stats_t s = stats(a);
  uint64_t total = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += e[i].bytes;
  ASSERT_UEQ(s.in_use, total);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) spw__arena_free(a, &e[i]);
  ASSERT_UEQ(stats(a).in_use, 0);
  end_arena(a);
}

static int by_ptr(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)((const spw_host_extent_t *)x)->ptr;
  uintptr_t b = (uintptr_t)((const spw_host_extent_t *)y)->ptr;
  return a < b ? -1 : a > b;
}

static void extents_never_overlap(void) {
  enum { N = 300 };
  spw_host_arena_t *a = new_arena(0, SLAB);
  static spw_host_extent_t e[N];
  uint64_t rng = 1;
  for (size_t i = 0; i < N; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    size_t bytes = 1 + (size_t)(rng >> 33) % (48 * KiB);
    ASSERT_OK(spw__arena_alloc(a, bytes, &e[i]));
    test_fill(e[i].ptr, e[i].bytes, i);
    /* Free every third at once, so later extents land in holes. */
    if (i % 3 == 2) spw__arena_free(a, &e[i - 1]);
  }
  for (size_t i = 0; i < N; i++)
    if (e[i].ptr) ASSERT_EQ(test_first_mismatch(e[i].ptr, e[i].bytes, i), (size_t)-1);
  qsort(e, N, sizeof e[0], by_ptr);
  for (size_t i = 0; i + 1 < N; i++)
    if (e[i].ptr) ASSERT_TRUE((uintptr_t)e[i].ptr + e[i].bytes <= (uintptr_t)e[i + 1].ptr);
  for (size_t i = 0; i < N; i++) spw__arena_free(a, &e[i]);
  ASSERT_UEQ(stats(a).in_use, 0);
  end_arena(a);
}

static void freed_extent_is_reused(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t x, y, z;
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &x));
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &y));
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &z));
  void *old = y.ptr;
  spw__arena_free(a, &y);
  ASSERT_TRUE(y.ptr == NULL); /* the freed extent is emptied */
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &y));
  ASSERT_TRUE(y.ptr == old);
  ASSERT_UEQ(registers(), 1);
  spw__arena_free(a, &x);
  spw__arena_free(a, &y);
  spw__arena_free(a, &z);
  end_arena(a);
}

static void adjacent_free_extents_coalesce(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t x, y, z, w;
  ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &x));
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &y));
  ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &z));
  ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &w));
  void *start = x.ptr;
  /* Free in an order that exercises join-next, join-prev and join-both. */
  spw__arena_free(a, &y);
  spw__arena_free(a, &x);
  spw__arena_free(a, &z);
  spw_host_extent_t big;
  ASSERT_OK(spw__arena_alloc(a, 16 * KiB, &big));
  ASSERT_TRUE(big.ptr == start);
  ASSERT_UEQ(stats(a).slabs, 1);
  spw__arena_free(a, &big);
  spw__arena_free(a, &w);
  /* Everything is back: the whole slab is one range again. */
  spw_host_extent_t all;
  ASSERT_OK(spw__arena_alloc(a, SLAB, &all));
  ASSERT_TRUE(all.ptr == start);
  ASSERT_UEQ(registers(), 1);
  spw__arena_free(a, &all);
  end_arena(a);
}

static void limit_gives_host_out_of_memory_and_changes_nothing(void) {
  spw_host_arena_t *a = new_arena(2 * SLAB, SLAB);
  spw_host_extent_t x, y, z;
  ASSERT_OK(spw__arena_alloc(a, SLAB, &x));
  ASSERT_OK(spw__arena_alloc(a, SLAB - 8 * KiB, &y));
  spw_arena_stats_t before = stats(a);
  uint64_t regs = registers();
  memset(&z, 0x5A, sizeof z);
  spw_host_extent_t sentinel = z;
  ASSERT_STATUS(spw__arena_alloc(a, 12 * KiB, &z), SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_STATUS(spw__arena_alloc(a, 3 * SLAB, &z), SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_TRUE(memcmp(&z, &sentinel, sizeof z) == 0);
  spw_arena_stats_t after = stats(a);
  ASSERT_TRUE(memcmp(&before, &after, sizeof before) == 0);
  ASSERT_UEQ(registers(), regs);
  ASSERT_UEQ(after.mapped, 2 * SLAB);
  ASSERT_UEQ(after.limit, 2 * SLAB);
  /* What still fits, fits. */
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &z));
  spw__arena_free(a, &x);
  spw__arena_free(a, &y);
  spw__arena_free(a, &z);
  end_arena(a);
}

static void last_room_under_the_limit_gets_a_smaller_slab(void) {
  spw_host_arena_t *a = new_arena(SLAB + SLAB / 2, SLAB);
  spw_host_extent_t x, y, z;
  ASSERT_OK(spw__arena_alloc(a, SLAB, &x));
  ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &y));
  ASSERT_UEQ(rec.last_register_bytes, SLAB / 2);
  ASSERT_UEQ(stats(a).mapped, SLAB + SLAB / 2);
  ASSERT_STATUS(spw__arena_alloc(a, SLAB / 2, &z), SPW_ERR_HOST_OUT_OF_MEMORY);
  spw__arena_free(a, &x);
  spw__arena_free(a, &y);
  end_arena(a);
}

static void empty_slab_is_unregistered_beyond_the_two_kept(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t e[4];
  for (int i = 0; i < 4; i++) ASSERT_OK(spw__arena_alloc(a, SLAB, &e[i]));
  ASSERT_UEQ(stats(a).slabs, 4);
  ASSERT_UEQ(registers(), 4);
  void *first = e[0].ptr, *second = e[1].ptr, *third = e[2].ptr;
  spw__arena_free(a, &e[0]); /* kept: the first empty slab */
  spw__arena_free(a, &e[1]); /* kept: the second */
  ASSERT_UEQ(unregisters(), 0);
  ASSERT_TRUE(is_mapped(first));
  ASSERT_TRUE(is_mapped(second));
  spw__arena_free(a, &e[2]); /* a third empty one: given back */
  ASSERT_UEQ(unregisters(), 1);
  ASSERT_TRUE(!is_mapped(third));
  spw__arena_free(a, &e[3]);
  ASSERT_UEQ(unregisters(), 2);
  spw_arena_stats_t s = stats(a);
  ASSERT_UEQ(s.slabs, 2);
  ASSERT_UEQ(s.mapped, 2 * SLAB);
  ASSERT_UEQ(s.in_use, 0);
  end_arena(a); /* the kept slabs go too */
  ASSERT_UEQ(unregisters(), 4);
}

static void kept_empty_slab_is_reused_without_registering(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t e;
  for (int i = 0; i < 10; i++) {
    ASSERT_OK(spw__arena_alloc(a, 256 * KiB, &e));
    spw__arena_free(a, &e);
  }
  ASSERT_UEQ(registers(), 1);
  ASSERT_UEQ(unregisters(), 0);
  end_arena(a);
}

static void kept_empty_slab_gives_way_under_the_limit(void) {
  spw_host_arena_t *a = new_arena(2 * SLAB, SLAB);
  spw_host_extent_t e;
  ASSERT_OK(spw__arena_alloc(a, SLAB, &e));
  void *kept = e.ptr;
  spw__arena_free(a, &e);
  ASSERT_UEQ(stats(a).mapped, SLAB);
  /* A dedicated 2 MiB slab fits only once the kept slab is given back. */
  ASSERT_OK(spw__arena_alloc(a, 2 * SLAB, &e));
  ASSERT_UEQ(unregisters(), 1);
  ASSERT_TRUE(rec.last_unregister_ptr == kept);
  spw_arena_stats_t s = stats(a);
  ASSERT_UEQ(s.mapped, 2 * SLAB);
  ASSERT_UEQ(s.slabs, 1);
  spw__arena_free(a, &e);
  end_arena(a);
}

/* Growing ahead maps one more slab once less than half a slab is free, and not before. */
static void growing_ahead_maps_a_slab_once_less_than_half_is_free(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t x, y;
  ASSERT_OK(spw__arena_alloc(a, SLAB / 2, &x)); /* half free: nothing yet */
  ASSERT_EQ(spw__arena_grow_ahead(a, SLAB / 2), 0);
  ASSERT_UEQ(stats(a).mapped, SLAB);
  ASSERT_OK(spw__arena_alloc(a, SLAB / 4, &y)); /* a quarter free */
  ASSERT_EQ(spw__arena_grow_ahead(a, 3 * SLAB / 4), 1);
  ASSERT_UEQ(stats(a).mapped, 2 * SLAB);
  ASSERT_UEQ(registers(), 2);
  spw__arena_free(a, &x);
  spw__arena_free(a, &y);
  end_arena(a);
}

/* Only the held bytes count: extents the caller could give back (clean copies, frees on
 * their way) come and go, and a slab pinned for them is a guess. More held than in use
 * counts as what is in use. */
static void growing_ahead_counts_only_the_held_bytes(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t x;
  ASSERT_OK(spw__arena_alloc(a, 3 * SLAB / 4, &x)); /* a quarter free */
  ASSERT_EQ(spw__arena_grow_ahead(a, SLAB / 2), 0);  /* half held: half free for it */
  ASSERT_UEQ(stats(a).mapped, SLAB);
  ASSERT_EQ(spw__arena_grow_ahead(a, 4 * SLAB), 1); /* counts as the three quarters */
  ASSERT_UEQ(stats(a).mapped, 2 * SLAB);
  spw__arena_free(a, &x);
  end_arena(a);
}

/* A reservation pins its slabs at once, before any allocation. */
static void a_reservation_maps_its_slabs_at_once(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  ASSERT_OK(spw__arena_reserve(a, 3 * SLAB - SLAB / 2)); /* rounded up to whole slabs */
  spw_arena_stats_t s = stats(a);
  ASSERT_UEQ(s.mapped, 3 * SLAB);
  ASSERT_UEQ(s.slabs, 3);
  ASSERT_UEQ(s.in_use, 0);
  ASSERT_UEQ(registers(), 3);
  ASSERT_OK(spw__arena_reserve(a, 2 * SLAB)); /* already there: nothing more */
  ASSERT_UEQ(registers(), 3);
  end_arena(a);
}

/* Reserved slabs stay pinned as they empty, past the two kept without a reservation; once
 * the reservation is dropped they go back as they empty again. */
static void reserved_slabs_stay_mapped_when_they_empty(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  ASSERT_OK(spw__arena_reserve(a, 4 * SLAB));
  spw_host_extent_t e[4];
  for (int i = 0; i < 4; i++) ASSERT_OK(spw__arena_alloc(a, SLAB, &e[i]));
  ASSERT_UEQ(registers(), 4); /* the reserved slabs took them */
  for (int i = 0; i < 4; i++) spw__arena_free(a, &e[i]);
  ASSERT_UEQ(unregisters(), 0);
  ASSERT_UEQ(stats(a).mapped, 4 * SLAB);
  ASSERT_OK(spw__arena_reserve(a, 0));
  for (int i = 0; i < 4; i++) ASSERT_OK(spw__arena_alloc(a, SLAB, &e[i]));
  for (int i = 0; i < 4; i++) spw__arena_free(a, &e[i]);
  ASSERT_UEQ(unregisters(), 2); /* two kept, as without a reservation */
  ASSERT_UEQ(stats(a).mapped, 2 * SLAB);
  end_arena(a);
}

static void a_reservation_above_the_limit_is_refused_and_changes_nothing(void) {
  spw_host_arena_t *a = new_arena(2 * SLAB, SLAB);
  ASSERT_STATUS(spw__arena_reserve(a, 2 * SLAB + 1), SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_UEQ(stats(a).mapped, 0);
  ASSERT_UEQ(rec.attempts, 0);
  ASSERT_OK(spw__arena_reserve(a, 2 * SLAB)); /* the whole limit is fine */
  ASSERT_UEQ(stats(a).mapped, 2 * SLAB);
  end_arena(a);
}

/* A registration refused half way: the slabs pinned before it stay, and the error is the
 * backend's. */
static void a_failed_reservation_keeps_what_it_pinned(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  ASSERT_OK(spw__arena_reserve(a, 2 * SLAB));
  rec.fail_next_register = SPW_ERR_CUDA;
  ASSERT_STATUS(spw__arena_reserve(a, 4 * SLAB), SPW_ERR_CUDA);
  ASSERT_UEQ(stats(a).mapped, 2 * SLAB);
  ASSERT_UEQ(registers(), 2);
  ASSERT_OK(spw__arena_reserve(a, 4 * SLAB)); /* and it can be asked again */
  ASSERT_UEQ(stats(a).mapped, 4 * SLAB);
  end_arena(a);
}

/* A borrowed arena (lent memory) never maps: a reservation within it is already met, one
 * past it is refused. */
static void a_borrowed_arena_reserves_only_what_it_has(void) {
  void *mem = aligned_alloc(4096, 4 * SLAB);
  ASSERT_TRUE(mem != NULL);
  spw_host_arena_t *a = NULL;
  ASSERT_OK(spw__arena_create_borrowed(mem, 4 * SLAB, &a));
  ASSERT_OK(spw__arena_reserve(a, 4 * SLAB));
  ASSERT_STATUS(spw__arena_reserve(a, 4 * SLAB + 1), SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_UEQ(stats(a).mapped, 4 * SLAB);
  spw__arena_destroy(a);
  free(mem);
}

static void big_request_gets_its_own_slab(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t small, big;
  ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &small));
  size_t want = 3 * SLAB + 1;
  long page = sysconf(_SC_PAGESIZE);
  size_t slab = (want + (size_t)page - 1) / (size_t)page * (size_t)page;
  ASSERT_OK(spw__arena_alloc(a, want, &big));
  ASSERT_UEQ(big.bytes, round4k(want));
  ASSERT_UEQ(rec.last_register_bytes, slab);
  ASSERT_TRUE(rec.last_register_ptr == big.ptr);
  ASSERT_TRUE(big.slab != small.slab);
  spw_arena_stats_t s = stats(a);
  ASSERT_UEQ(s.slabs, 2);
  ASSERT_UEQ(s.mapped, SLAB + slab);
  test_fill(big.ptr, big.bytes, 7);
  ASSERT_EQ(test_first_mismatch(big.ptr, big.bytes, 7), (size_t)-1);
  /* A dedicated slab is given back as soon as it empties, even as the only empty one. */
  void *p = big.ptr;
  spw__arena_free(a, &big);
  ASSERT_UEQ(unregisters(), 1);
  ASSERT_TRUE(!is_mapped(p));
  ASSERT_UEQ(stats(a).mapped, SLAB);
  spw__arena_free(a, &small);
  end_arena(a);
}

static void big_request_over_the_limit_is_refused(void) {
  spw_host_arena_t *a = new_arena(4 * SLAB, SLAB);
  spw_host_extent_t e;
  ASSERT_STATUS(spw__arena_alloc(a, 4 * SLAB + 1, &e), SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_UEQ(registers(), 0);
  ASSERT_OK(spw__arena_alloc(a, 4 * SLAB, &e)); /* exactly the limit fits */
  ASSERT_UEQ(stats(a).mapped, 4 * SLAB);
  spw__arena_free(a, &e);
  end_arena(a);
}

static void registration_failure_leaves_no_slab_mapped(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t e;
  rec.fail_next_register = SPW_ERR_CUDA;
  ASSERT_STATUS(spw__arena_alloc(a, 64 * KiB, &e), SPW_ERR_CUDA);
  ASSERT_UEQ(rec.attempts, 1);
  ASSERT_UEQ(registers(), 0);
  void *tried = rec.last_register_ptr;
  ASSERT_TRUE(tried != NULL);
  ASSERT_TRUE(!is_mapped(tried));
  spw_arena_stats_t s = stats(a);
  ASSERT_UEQ(s.mapped, 0);
  ASSERT_UEQ(s.slabs, 0);
  ASSERT_UEQ(s.in_use, 0);
  ASSERT_UEQ(unregisters(), 0); /* never registered, so never unregistered */
  /* The arena is still usable. */
  ASSERT_OK(spw__arena_alloc(a, 64 * KiB, &e));
  spw__arena_free(a, &e);
  end_arena(a);
}

static void destroy_gives_back_slabs_with_extents_out(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t e[3];
  ASSERT_OK(spw__arena_alloc(a, SLAB, &e[0]));
  ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &e[1]));
  ASSERT_OK(spw__arena_alloc(a, 5 * SLAB, &e[2]));
  ASSERT_UEQ(registers(), 3);
  end_arena(a);
  ASSERT_TRUE(!is_mapped(e[2].ptr));
}

static void bad_frees_are_ignored(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t x, y;
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &x));
  ASSERT_OK(spw__arena_alloc(a, 8 * KiB, &y));
  spw_host_extent_t copy = x, empty = {0};
  spw__arena_free(a, &x);
  spw_arena_stats_t before = stats(a);
  spw__arena_free(a, &copy); /* freed twice through a copy */
  spw__arena_free(a, &x);    /* emptied by the first free */
  spw__arena_free(a, &empty);
  spw_host_extent_t forged = y;
  forged.slab = 999;
  spw__arena_free(a, &forged);
  forged = y;
  forged.ptr = (char *)y.ptr + 1;
  spw__arena_free(a, &forged);
  forged = y;
  forged.bytes = 2 * SLAB;
  spw__arena_free(a, &forged);
  forged = y;
  forged.ptr = (char *)y.ptr - 64 * SLAB;
  spw__arena_free(a, &forged);
  spw__arena_free(a, NULL);
  spw__arena_free(NULL, &y);
  spw_arena_stats_t after = stats(a);
  ASSERT_TRUE(memcmp(&before, &after, sizeof before) == 0);
  ASSERT_UEQ(after.in_use, 8 * KiB);
  spw__arena_free(a, &y);
  ASSERT_UEQ(stats(a).in_use, 0);
  end_arena(a);
}

/* A batch's extents go back under one lock: each is emptied, the free ranges coalesce as
 * one by one would, and empty or already freed entries among them are ignored. */
static void extents_freed_together_come_back_as_one_by_one(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  enum { N = 6 };
  spw_host_extent_t e[N + 2], stale;
  for (int i = 0; i < N; i++) ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &e[i]));
  void *start = e[0].ptr;
  stale = e[1];
  spw__arena_free(a, &stale); /* e[1] is freed already; its copy in e[] is stale */
  e[N] = (spw_host_extent_t){0};
  e[N + 1] = e[1];
  ASSERT_UEQ(stats(a).in_use, (N - 1) * 4 * KiB);
  spw__arena_free_n(a, e, N + 2);
  for (int i = 0; i < N + 2; i++) ASSERT_TRUE(e[i].ptr == NULL || i == 1 || i == N + 1);
  ASSERT_UEQ(stats(a).in_use, 0);
  spw_host_extent_t all;
  ASSERT_OK(spw__arena_alloc(a, SLAB, &all)); /* one range again */
  ASSERT_TRUE(all.ptr == start);
  ASSERT_UEQ(registers(), 1);
  spw__arena_free(a, &all);
  spw__arena_free_n(a, NULL, 3);
  spw__arena_free_n(NULL, e, 1);
  end_arena(a);
}

static void bad_arguments_are_invalid_arg(void) {
  spw_host_arena_t *a = NULL;
  ASSERT_STATUS(spw__arena_create(NULL, host_backend, 0, 0, &a), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__arena_create(&rec_ops, host_backend, 0, 0, NULL), SPW_ERR_INVALID_ARG);
  spw_backend_ops_t no_register = rec_ops;
  no_register.host_register = NULL;
  ASSERT_STATUS(spw__arena_create(&no_register, host_backend, 0, 0, &a), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(a == NULL);
  a = new_arena(0, SLAB);
  spw_host_extent_t e;
  ASSERT_STATUS(spw__arena_alloc(a, 0, &e), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__arena_alloc(a, 4096, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__arena_alloc(a, SIZE_MAX, &e), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__arena_alloc(NULL, 4096, &e), SPW_ERR_INVALID_ARG);
  ASSERT_UEQ(registers(), 0);
  spw__arena_destroy(NULL);
  end_arena(a);
}

static void default_slab_size_is_256_mib(void) {
  spw_host_arena_t *a = new_arena(0, 0);
  spw_host_extent_t e;
  ASSERT_OK(spw__arena_alloc(a, 4 * KiB, &e));
  ASSERT_UEQ(rec.last_register_bytes, 256 * MiB);
  ASSERT_UEQ(stats(a).mapped, 256 * MiB);
  spw__arena_free(a, &e);
  end_arena(a);
}

static void extent_memory_round_trips_through_the_backend(void) {
  spw_host_arena_t *a = new_arena(0, SLAB);
  spw_host_extent_t src, dst;
  ASSERT_OK(spw__arena_alloc(a, 100 * KiB, &src));
  ASSERT_OK(spw__arena_alloc(a, 100 * KiB, &dst));
  test_fill(src.ptr, src.bytes, 3);
  memset(dst.ptr, 0, dst.bytes);
  const spw_backend_ops_t *ops = &spw__backend_host_ops;
  spw_stream_t s = ops->default_stream(host_backend);
  void *dev = NULL;
  ASSERT_OK(ops->alloc_async(host_backend, src.bytes, s, &dev));
  ASSERT_OK(ops->memcpy_async(host_backend, dev, src.ptr, src.bytes, s));
  ASSERT_OK(ops->memcpy_async(host_backend, dst.ptr, dev, dst.bytes, s));
  ASSERT_OK(ops->free_async(host_backend, dev, s));
  ASSERT_OK(ops->stream_sync(host_backend, s));
  ASSERT_EQ(test_first_mismatch(dst.ptr, dst.bytes, 3), (size_t)-1);
  spw__arena_free(a, &src);
  spw__arena_free(a, &dst);
  end_arena(a);
}

/* ---- concurrency --------------------------------------------------------------------- */

#define THREADS 8
#define ITERS 3000
#define LIVE 16
#define LIMIT (10 * SLAB) /* low enough that threads meet the limit now and then */

typedef struct worker {
  spw_host_arena_t *a;
  unsigned id;
  uint64_t ooms, allocs;
  bool limit_broken, outside_slab;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  spw_host_extent_t live[LIVE];
  uint64_t seed[LIVE];
  memset(live, 0, sizeof live);
  uint64_t rng = 0x1234567ull + w->id;
  for (unsigned it = 0; it < ITERS; it++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    unsigned k = (unsigned)(rng >> 40) % LIVE;
    if (live[k].ptr) {
      /* Verify only the first and last pages: enough to catch overlap, cheap enough to
       * keep the test quick under the sanitizers. */
      const uint8_t *p = live[k].ptr;
      size_t n = live[k].bytes;
      for (size_t i = 0; i < 4096; i++) {
        ASSERT_EQ(p[i], test_pattern_byte(seed[k], i));
        ASSERT_EQ(p[n - 4096 + i], test_pattern_byte(seed[k], n - 4096 + i));
      }
      spw__arena_free(w->a, &live[k]);
      continue;
    }
    size_t bytes = (rng >> 20) % 64 == 0 ? 3 * SLAB / 2 : 1 + (size_t)(rng >> 33) % (96 * KiB);
    int st = spw__arena_alloc(w->a, bytes, &live[k]);
    if (st == SPW_ERR_HOST_OUT_OF_MEMORY) {
      w->ooms++;
      continue;
    }
    ASSERT_OK(st);
    w->allocs++;
    if (!in_registered_slab(&live[k])) w->outside_slab = true;
    seed[k] = ((uint64_t)w->id << 32) | it;
    uint8_t *p = live[k].ptr;
    size_t n = live[k].bytes;
    for (size_t i = 0; i < 4096; i++) {
      p[i] = test_pattern_byte(seed[k], i);
      p[n - 4096 + i] = test_pattern_byte(seed[k], n - 4096 + i);
    }
    spw_arena_stats_t s;
    spw__arena_get_stats(w->a, &s);
    if (s.mapped > LIMIT || s.in_use > s.mapped) w->limit_broken = true;
  }
  for (unsigned k = 0; k < LIVE; k++) spw__arena_free(w->a, &live[k]);
  return NULL;
}

typedef struct crew {
  pthread_t t[THREADS];
  worker_t w[THREADS];
} crew_t;

static void crew_start(crew_t *c, spw_host_arena_t *a) {
  for (unsigned i = 0; i < THREADS; i++) {
    c->w[i] = (worker_t){.a = a, .id = i};
    ASSERT_EQ(pthread_create(&c->t[i], NULL, worker_main, &c->w[i]), 0);
  }
}

/* Joins the workers, checks what each saw, and returns their allocations. */
static uint64_t crew_join(crew_t *c) {
  uint64_t allocs = 0;
  for (unsigned i = 0; i < THREADS; i++) {
    ASSERT_EQ(pthread_join(c->t[i], NULL), 0);
    ASSERT_TRUE(!c->w[i].limit_broken);
    ASSERT_TRUE(!c->w[i].outside_slab);
    allocs += c->w[i].allocs;
  }
  return allocs;
}

static void eight_threads_allocate_and_free_concurrently(void) {
  spw_host_arena_t *a = new_arena(LIMIT, SLAB);
  crew_t c;
  crew_start(&c, a);
  ASSERT_GT(crew_join(&c), THREADS * ITERS / 4);
  spw_arena_stats_t s = stats(a);
  ASSERT_UEQ(s.in_use, 0);
  ASSERT_LE(s.slabs, 2); /* at most the two kept empty slabs */
  end_arena(a);
}

/* Reservations made and dropped while the threads allocate and free: the limit holds, no
 * extent lies outside a registered slab, and a reservation in force stays mapped. */
static void reservations_run_beside_allocations(void) {
  spw_host_arena_t *a = new_arena(LIMIT, SLAB);
  crew_t c;
  crew_start(&c, a);
  for (int round = 0; round < 20; round++) {
    uint64_t want = (uint64_t)(round % 4) * (LIMIT / 4); /* 0 drops it */
    int st = spw__arena_reserve(a, want);
    /* Dedicated slabs of the threads' big requests may hold the room a reservation wants. */
    ASSERT_TRUE(st == SPW_OK || st == SPW_ERR_HOST_OUT_OF_MEMORY);
    if (st == SPW_OK) ASSERT_GE(stats(a).mapped, want);
  }
  crew_join(&c);
  ASSERT_UEQ(stats(a).in_use, 0);
  end_arena(a);
}

static void open_backend(void) {
  spw_backend_params_t p = {.device = 0, .host_device_bytes = 64 * MiB};
  int st = spw__backend_host_ops.create(&p, &host_backend);
  TEST_SKIP_IF(st == SPW_ERR_NO_DEVICE, "host backend unavailable");
  ASSERT_OK(st);
  rec_ops = spw__backend_host_ops;
  rec_ops.host_register = rec_register;
  rec_ops.host_unregister = rec_unregister;
}

static void close_backend(void) { spw__backend_host_ops.destroy(host_backend); }

static const spw_test_t tests[] = {
    TEST(extents_are_aligned_and_rounded),
    TEST(extents_never_overlap),
    TEST(freed_extent_is_reused),
    TEST(adjacent_free_extents_coalesce),
    TEST(extents_freed_together_come_back_as_one_by_one),
    TEST(limit_gives_host_out_of_memory_and_changes_nothing),
    TEST(last_room_under_the_limit_gets_a_smaller_slab),
    TEST(empty_slab_is_unregistered_beyond_the_two_kept),
    TEST(kept_empty_slab_is_reused_without_registering),
    TEST(kept_empty_slab_gives_way_under_the_limit),
    TEST(growing_ahead_maps_a_slab_once_less_than_half_is_free),
    TEST(growing_ahead_counts_only_the_held_bytes),
    TEST(a_reservation_maps_its_slabs_at_once),
    TEST(reserved_slabs_stay_mapped_when_they_empty),
    TEST(a_reservation_above_the_limit_is_refused_and_changes_nothing),
    TEST(a_failed_reservation_keeps_what_it_pinned),
    TEST(a_borrowed_arena_reserves_only_what_it_has),
    TEST(big_request_gets_its_own_slab),
    TEST(big_request_over_the_limit_is_refused),
    TEST(registration_failure_leaves_no_slab_mapped),
    TEST(destroy_gives_back_slabs_with_extents_out),
    TEST(bad_frees_are_ignored),
    TEST(bad_arguments_are_invalid_arg),
    TEST(default_slab_size_is_256_mib),
    TEST(extent_memory_round_trips_through_the_backend),
    TEST(eight_threads_allocate_and_free_concurrently),
    TEST(reservations_run_beside_allocations),
};
TEST_MAIN_WITH(tests, open_backend, close_backend)
