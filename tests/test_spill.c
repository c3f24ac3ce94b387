/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of explicit spilling (public API only): contents survive spill / unspill
 * cycles at any size, a locked buffer refuses to move, an acquire of a spilled buffer is
 * stream-ordered behind its copy back, a read-only acquire keeps a clean host copy (the next
 * spill moves no bytes) until a writable one drops it, an acquire during a spill abandons
 * it, prefetch brings a buffer back, and the statistics move as spillway.h documents.
 *
 * Device memory is touched only through spw_memcpy_async + spw_stream_synchronize, so
 * every test is valid on both backends. Expected contents come from test_fill; a readback
 * is compared with memcmp (fast under sanitizers) and test_first_mismatch names the first
 * bad byte. Sizes are drawn from a seeded generator: SPW_TEST_SEED=n replays a run. */
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "test_main.h"
#include "test_util.h"
#include "fixture.h" /* last: see its header */

#define MIB ((size_t)1 << 20)

/* Byte loops run ~10x slower under ThreadSanitizer: the host backend's budget shrinks with
 * it so that each test stays within seconds. */
#if defined(__SANITIZE_THREAD__)
#define HOST_MAX_BYTES (2 * MIB)
#elif defined(__SANITIZE_ADDRESS__)
#define HOST_MAX_BYTES (8 * MIB)
#else
#define HOST_MAX_BYTES (16 * MIB)
#endif

static uint64_t rng_state;

static uint64_t rng_next(void) {
  /* splitmix64: small, and good enough to spread sizes. */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Log-uniform in [1, max]: small and large sizes are equally likely per octave. */
static size_t random_size(size_t max) {
  unsigned bits = 0;
  while (((size_t)1 << (bits + 1)) <= max) bits++;
  size_t hi = (size_t)1 << (rng_next() % (bits + 1));
  size_t n = hi + (size_t)(rng_next() % hi);
  return n > max ? max : n;
}

/* Writes `n` bytes of `src` into the buffer (writable acquire) and releases it. */
static void upload(spw_buf_t b, const void *src, size_t n) { test_write(rt, b, s, src, n); }

/* Reads the buffer back (acquire with `flags`) and requires it to equal test_fill(seed). */
static void expect_contents(spw_buf_t b, unsigned flags, const void *expected, size_t n,
                            uint64_t seed) {
  uint8_t *got = malloc(n);
  ASSERT_TRUE(got != NULL);
  memset(got, 0xA5 ^ (int)(seed & 0xFF), n);
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b, s, flags, &d));
  ASSERT_OK(spw_memcpy_async(rt, got, d, n, s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  if (memcmp(got, expected, n) != 0) {
    fprintf(stderr, "buffer of %zu bytes, seed %" PRIu64 ": first bad byte at %zu\n", n, seed,
            test_first_mismatch(got, n, seed));
    ASSERT_TRUE(!"contents differ from the pattern written");
  }
  free(got);
}

static uint8_t *pattern(size_t n, uint64_t seed) {
  uint8_t *p = malloc(n);
  ASSERT_TRUE(p != NULL);
  test_fill(p, n, seed);
  return p;
}

/* A new buffer of n bytes holding pattern(n, seed), which *want receives (free it). */
static spw_buf_t uploaded(size_t n, uint64_t seed, uint8_t **want) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, n, s, &b));
  *want = pattern(n, seed);
  upload(b, *want, n);
  return b;
}

/* The end of a test's buffer from uploaded(): its contents checked (writable acquire), then
 * the buffer and its pattern freed. */
static void expect_and_free(spw_buf_t b, uint8_t *want, size_t n, uint64_t seed) {
  expect_contents(b, 0, want, n, seed);
  ASSERT_OK(spw_free(rt, b));
  free(want);
}

static void spill_and_wait(spw_buf_t b) {
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
}

/* uploaded(), spilled to host, and read back with a read-only acquire: the buffer is
 * resident again and its host copy is clean. */
static spw_buf_t spilled_and_read(size_t n, uint64_t seed, uint8_t **want) {
  spw_buf_t b = uploaded(n, seed, want);
  spill_and_wait(b);
  expect_contents(b, SPW_ACQUIRE_READ, *want, n, seed);
  return b;
}

static void contents_survive_spill_unspill_cycles(void) {
  const size_t max = test_backend() == SPW_BACKEND_CUDA ? 64 * MIB : HOST_MAX_BYTES;
  const int cycles = 3;
  /* Edge sizes around the 4 KiB host extent granule and the largest size, then random ones. */
  size_t sizes[16] = {1, 7, 4095, 4096, 4097, 65537, max};
  size_t nsizes = 7;
  while (nsizes < sizeof sizes / sizeof sizes[0]) sizes[nsizes++] = random_size(max);

  for (size_t i = 0; i < nsizes; i++) {
    const size_t n = sizes[i];
    spw_buf_t b;
    ASSERT_OK(spw_alloc(rt, n, s, &b));
    uint64_t seed = i * 100;
    uint8_t *want = pattern(n, seed);
    upload(b, want, n);
    for (int c = 0; c < cycles; c++) {
      spill_and_wait(b);
      expect_contents(b, 0, want, n, seed);
      ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
      /* A new pattern every cycle: a stale host copy from an earlier cycle would show. */
      free(want);
      seed++;
      want = pattern(n, seed);
      upload(b, want, n);
    }
    spill_and_wait(b);
    expect_contents(b, 0, want, n, seed);
    free(want);
    ASSERT_OK(spw_free(rt, b));
  }
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.buffers, 0);
}

static void spill_of_locked_buffer_is_refused(void) {
  void *d = NULL;
  uint8_t *want;
  spw_buf_t b = uploaded(8192, 1, &want);
  ASSERT_OK(spw_acquire(rt, b, s, SPW_ACQUIRE_READ, &d));
  ASSERT_STATUS(spw_spill(rt, b, SPW_TIER_HOST), SPW_ERR_LOCKED);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  ASSERT_UEQ(stats_of(rt).spills, 0);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  /* Unlocked, the same request goes through. */
  spill_and_wait(b);
  expect_contents(b, 0, want, 8192, 1);
  free(want);
}

static void acquire_of_host_buffer_is_right_after_stream_sync(void) {
  const size_t n = 3 * MIB + 5;
  uint8_t *want;
  spw_buf_t b = uploaded(n, 2, &want);
  spill_and_wait(b);
  /* The acquire only enqueues the copy back; the stream's next copy must run after it. */
  uint8_t *got = malloc(n);
  ASSERT_TRUE(got != NULL);
  memset(got, 0, n);
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b, s2, 0, &d));
  ASSERT_TRUE(d != NULL);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  ASSERT_OK(spw_memcpy_async(rt, got, d, n, s2));
  ASSERT_OK(spw_stream_synchronize(rt, s2));
  ASSERT_UEQ(test_first_mismatch(got, n, 2), (size_t)-1);
  free(got);
  free(want);
}

static void second_stream_waits_for_copy_back_too(void) {
  /* Stream 1 brings the buffer back; stream 2 acquires it at once, while the copy may
   * still be in flight, and must see the whole contents all the same. */
  const size_t n = 4 * MIB - 3;
  uint8_t *want;
  spw_buf_t b = uploaded(n, 3, &want);
  uint8_t *got = malloc(n);
  ASSERT_TRUE(got != NULL);
  for (int round = 0; round < 4; round++) {
    spill_and_wait(b);
    void *d1 = NULL, *d2 = NULL;
    memset(got, 0, n);
    ASSERT_OK(spw_acquire(rt, b, s, SPW_ACQUIRE_READ, &d1));
    ASSERT_OK(spw_acquire(rt, b, s2, SPW_ACQUIRE_READ, &d2));
    ASSERT_PTR_EQ(d1, d2);
    ASSERT_OK(spw_memcpy_async(rt, got, d2, n, s2));
    ASSERT_OK(spw_stream_synchronize(rt, s2));
    ASSERT_UEQ(test_first_mismatch(got, n, 3), (size_t)-1);
    ASSERT_OK(spw_stream_synchronize(rt, s));
  }
  free(got);
  free(want);
}

static void read_only_acquire_makes_next_spill_clean(void) {
  const size_t n = 1 * MIB + 17;
  uint8_t *want;
  spw_buf_t b = spilled_and_read(n, 4, &want);
  test_spilled_t d = test_spill_counted(rt, &b, 1, SPW_TIER_HOST);
  ASSERT_UEQ(d.spills, 1);
  ASSERT_UEQ(d.clean_respills, 1);
  ASSERT_UEQ(d.spill_bytes, 0);
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.host_bytes, n);
  ASSERT_UEQ(st.device_bytes, 0);
  /* The kept copy is the real contents, not just a claim. */
  expect_contents(b, 0, want, n, 4);
  free(want);
}

static void writable_acquire_makes_next_spill_move_bytes(void) {
  const size_t n = 1 * MIB + 17;
  uint8_t *first;
  spw_buf_t b = spilled_and_read(n, 5, &first);
  /* A writable acquire after the read-only one: the kept host copy is stale from here. */
  uint8_t *second = pattern(n, 6);
  upload(b, second, n);
  test_spilled_t d = test_spill_counted(rt, &b, 1, SPW_TIER_HOST);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  ASSERT_UEQ(d.spills, 1);
  ASSERT_UEQ(d.clean_respills, 0);
  ASSERT_UEQ(d.spill_bytes, n);
  expect_contents(b, 0, second, n, 6);
  free(first);
  free(second);
}

static void acquire_during_spill_abandons_it(void) {
  /* Whether the acquire lands while the copy is running (abandoned) or after it committed
   * (a real spill, then an unspill) depends on timing; either is right, each attempt must
   * end as exactly one of them, and the data must be intact either way. The test waits
   * until the engine has claimed the buffer: an acquire before that makes the request moot
   * (the engine then finds the buffer locked and leaves it), which is neither outcome. */
  const size_t n = 2 * MIB + 1;
#if defined(__SANITIZE_THREAD__)
  const int attempts = 40;
#else
  const int attempts = 150;
#endif
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, n, s, &b));
  uint8_t *want[2] = {pattern(n, 7), pattern(n, 8)};
  uint8_t *got = malloc(n);
  ASSERT_TRUE(got != NULL);
  upload(b, want[0], n);
  const spw_stats_t before = stats_of(rt);
  for (int a = 0; a < attempts; a++) {
    const uint64_t seed = 7 + (uint64_t)(a & 1);
    ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
    /* Yield while waiting: on a small machine a pure spin starves the engine (and a
     * sanitizer's report writer) for whole time slices. */
    while (state_of(rt, b) == SPW_STATE_RESIDENT) sched_yield();
    /* Vary how far into the copy the acquire lands. */
    for (uint64_t spin = rng_next() % 20000; spin > 0; spin--) __asm__ volatile("" ::: "memory");
    void *d = NULL;
    ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
    ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
    memset(got, 0, n);
    ASSERT_OK(spw_memcpy_async(rt, got, d, n, s));
    /* Overwrite with the other pattern so that a host copy of this attempt going stale
     * unnoticed would show in the next one. */
    ASSERT_OK(spw_memcpy_async(rt, d, want[(a + 1) & 1], n, s));
    ASSERT_OK(spw_stream_synchronize(rt, s));
    if (memcmp(got, want[a & 1], n) != 0) {
      fprintf(stderr, "attempt %d: first bad byte at %zu\n", a, test_first_mismatch(got, n, seed));
      ASSERT_TRUE(!"contents wrong after an acquire during a spill");
    }
    ASSERT_OK(spw_wait_idle(rt));
  }
  const spw_stats_t after = stats_of(rt);
  const uint64_t abandoned = after.spills_abandoned - before.spills_abandoned;
  const uint64_t spilled = after.spills - before.spills;
  printf("  %d attempts: %" PRIu64 " abandoned, %" PRIu64 " spilled\n", attempts, abandoned,
         spilled);
  ASSERT_UEQ(abandoned + spilled, (uint64_t)attempts);
  ASSERT_UEQ(after.failures, before.failures);
  ASSERT_UEQ(after.host_bytes, 0);
  expect_contents(b, 0, want[attempts & 1], n, 7 + (uint64_t)(attempts & 1));
  free(got);
  free(want[0]);
  free(want[1]);
}

static void prefetch_brings_host_buffer_back(void) {
  const size_t n = 2 * MIB + 4095;
  uint8_t *want;
  spw_buf_t b = uploaded(n, 9, &want);
  spill_and_wait(b);
  const spw_stats_t before = stats_of(rt);
  ASSERT_OK(spw_prefetch(rt, b, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  uint32_t locks = 99;
  ASSERT_OK(spw_buf_lock_count(rt, b, &locks));
  ASSERT_EQ(locks, 0); /* a prefetch takes no lock */
  const spw_stats_t mid = stats_of(rt);
  ASSERT_UEQ(mid.unspills, before.unspills + 1);
  ASSERT_UEQ(mid.device_bytes, n);
  /* The acquire finds it resident: no second copy back. */
  expect_contents(b, 0, want, n, 9);
  ASSERT_UEQ(stats_of(rt).unspills, mid.unspills);
  free(want);
}

static void stats_move_as_documented(void) {
  const size_t na = 1 * MIB + 100, nb = 300000;
  spw_buf_t a, b;
  uint64_t limit = 0;
  ASSERT_OK(spw_runtime_limits(rt, &limit, NULL, NULL));

  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.struct_size, sizeof st);
  ASSERT_UEQ(st.buffers, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.device_limit, limit);
  ASSERT_UEQ(st.spills, 0);
  ASSERT_UEQ(st.unspills, 0);
  ASSERT_UEQ(st.failures, 0);

  ASSERT_OK(spw_alloc(rt, na, s, &a));
  ASSERT_OK(spw_alloc(rt, nb, s, &b));
  st = stats_of(rt);
  ASSERT_UEQ(st.buffers, 2);
  ASSERT_UEQ(st.device_bytes, na + nb);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.locked_bytes, 0);

  uint8_t *want = pattern(na, 10);
  upload(a, want, na);
  spill_and_wait(a);
  st = stats_of(rt);
  ASSERT_UEQ(st.device_bytes, nb);
  ASSERT_UEQ(st.host_bytes, na);
  ASSERT_GE(st.host_pinned_bytes, na);
  ASSERT_UEQ(st.spills, 1);
  ASSERT_UEQ(st.spill_bytes, na);
  ASSERT_UEQ(st.spills_on_demand, 0); /* it was asked for, not forced */
  ASSERT_UEQ(st.spills_background, 0);
  ASSERT_UEQ(st.disk_bytes, 0);

  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  st = stats_of(rt);
  ASSERT_UEQ(st.unspills, 1);
  ASSERT_UEQ(st.unspill_bytes, na);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.device_bytes, na + nb);
  ASSERT_UEQ(st.locked_bytes, na);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_UEQ(stats_of(rt).locked_bytes, 0);

  ASSERT_OK(spw_free(rt, a));
  st = stats_of(rt);
  ASSERT_UEQ(st.buffers, 1);
  ASSERT_UEQ(st.device_bytes, nb);
  ASSERT_OK(spw_free(rt, b));
  st = stats_of(rt);
  ASSERT_UEQ(st.buffers, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  /* Cumulative counters stay. */
  ASSERT_UEQ(st.spills, 1);
  ASSERT_UEQ(st.unspills, 1);
  ASSERT_UEQ(st.failures, 0);
  /* A shorter struct: test_bad_input's get_stats_writes_only_struct_size_bytes. */
  free(want);
}

static void stats_summary_is_not_empty(void) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  char line[512];
  memset(line, 'x', sizeof line);
  ASSERT_OK(spw_stats_summary(rt, line, sizeof line));
  ASSERT_TRUE(memchr(line, '\0', sizeof line) != NULL);
  ASSERT_GT(strlen(line), 0);
  printf("  %s\n", line);
  /* Too small a buffer still gets a terminated (truncated) line. */
  char tiny[8];
  memset(tiny, 'x', sizeof tiny);
  ASSERT_OK(spw_stats_summary(rt, tiny, sizeof tiny));
  ASSERT_EQ(strlen(tiny), sizeof tiny - 1);
}

/* SPW_ACQUIRE_TRY takes a resident buffer like a plain acquire and refuses, changing
 * nothing, to bring back a spilled one. */
static void try_acquire_refuses_to_bring_a_buffer_back(void) {
  spw_buf_t b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 8192, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, SPW_ACQUIRE_TRY, &d));
  ASSERT_PTR_NE(d, NULL);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  spill_and_wait(b);
  d = NULL;
  ASSERT_STATUS(spw_acquire(rt, b, s, SPW_ACQUIRE_TRY | SPW_ACQUIRE_READ, &d), SPW_ERR_NOT_READY);
  ASSERT_STATUS(spw_acquire_n(rt, &b, 1, s, SPW_ACQUIRE_TRY, &d), SPW_ERR_NOT_READY);
  ASSERT_PTR_EQ(d, NULL);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  uint32_t locks = 1;
  ASSERT_OK(spw_buf_lock_count(rt, b, &locks));
  ASSERT_EQ(locks, 0);
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_stream_synchronize(rt, s));
}

/* A batch counts only what moved: spw_spill_n / spw_prefetch_n of many small buffers, some
 * locked (their claim fails), some freed while the batch may still run (the mover finishes
 * the free), some clean (no bytes move). The tier counters of a batch change once per part
 * (prepaid, then settled), so after the batch they must equal the sizes of the buffers that
 * are where they say, and contents must survive. */
static void batch_counts_only_what_moved(void) {
  enum { N = 96 };
  spw_buf_t b[N];
  size_t size[N];
  uint8_t *want[N];
  int gone[N] = {0};
  for (int i = 0; i < N; i++) {
    size[i] = 1 + (size_t)(rng_next() % 8192);
    b[i] = uploaded(size[i], 7000 + (uint64_t)i, &want[i]);
  }
  /* Every 6th read back once, so that its next spill is clean. */
  for (int i = 0; i < N; i += 6) {
    spill_and_wait(b[i]);
    expect_contents(b[i], SPW_ACQUIRE_READ, want[i], size[i], 7000 + (uint64_t)i);
  }
  /* Every 4th locked: it stays resident. */
  void *d = NULL;
  for (int i = 1; i < N; i += 4) ASSERT_OK(spw_acquire(rt, b[i], s, SPW_ACQUIRE_READ, &d));
  ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
  /* Every 7th freed while the batch may still run. */
  for (int i = 3; i < N; i += 7) {
    ASSERT_OK(spw_free(rt, b[i]));
    gone[i] = 1;
  }
  ASSERT_OK(spw_wait_idle(rt));
  uint64_t host = 0;
  for (int i = 0; i < N; i++) {
    if (gone[i]) continue;
    int locked = (i % 4) == 1;
    ASSERT_EQ(state_of(rt, b[i]), locked ? SPW_STATE_RESIDENT : SPW_STATE_HOST);
    if (!locked) host += size[i];
  }
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.host_bytes, host);
  for (int i = 1; i < N; i += 4) ASSERT_OK(spw_release(rt, b[i], s));

  /* Back: every HOST buffer becomes resident, and host_bytes goes to zero. */
  spw_buf_t live[N];
  size_t nlive = 0;
  for (int i = 0; i < N; i++)
    if (!gone[i]) live[nlive++] = b[i];
  ASSERT_OK(spw_prefetch_n(rt, live, nlive, s));
  ASSERT_OK(spw_wait_idle(rt));
  for (int i = 0; i < N; i++) {
    if (gone[i]) continue;
    ASSERT_EQ(state_of(rt, b[i]), SPW_STATE_RESIDENT);
  }
  st = stats_of(rt);
  ASSERT_UEQ(st.host_bytes, 0);
  for (int i = 0; i < N; i++) {
    if (!gone[i]) {
      expect_contents(b[i], 0, want[i], size[i], 7000 + (uint64_t)i);
      ASSERT_OK(spw_free(rt, b[i]));
    }
    free(want[i]);
  }
  st = stats_of(rt);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.buffers, 0);
}

/* A request of many buffers is cut into slices that the down lane and its helpers spill at
 * once (SPILLWAY_ENGINE_HELPERS, set for this file in seed()): the slices must come out as the
 * whole request would, with locked buffers left, frees and acquires during the run, and clean
 * victims moving no bytes. */
static void a_large_request_is_spilled_in_slices_and_nothing_is_lost(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 64 * MIB;
  reopen_fixture(&cfg);
  enum { N = 16384 + 4196 }; /* four slices of 3 helpers and the lane (SLICE_MIN 4096) */
  spw_buf_t *b = calloc(N, sizeof *b);
  size_t *size = calloc(N, sizeof *size);
  uint8_t **want = calloc(N, sizeof *want);
  int *gone = calloc(N, sizeof *gone);
  ASSERT_TRUE(b && size && want && gone);
  for (int i = 0; i < N; i++) {
    size[i] = 64 + (size_t)(rng_next() % 193);
    b[i] = uploaded(size[i], 9000 + (uint64_t)i, &want[i]);
  }
  for (int i = 0; i < N; i += 9) { /* clean: read back once */
    spill_and_wait(b[i]);
    void *d = NULL;
    ASSERT_OK(spw_acquire(rt, b[i], s, SPW_ACQUIRE_READ, &d));
    ASSERT_OK(spw_release(rt, b[i], s));
  }
  ASSERT_OK(spw_stream_synchronize(rt, s));
  void *d = NULL;
  for (int i = 1; i < N; i += 5) ASSERT_OK(spw_acquire(rt, b[i], s, SPW_ACQUIRE_READ, &d));
  ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
  /* While the slices run: frees, and writable acquires that abandon or undo their spills. */
  for (int i = 3; i < N; i += 7) {
    if (i % 5 == 1) continue;
    ASSERT_OK(spw_free(rt, b[i]));
    gone[i] = 1;
  }
  for (int i = 4; i < N; i += 11) {
    if (gone[i] || i % 5 == 1) continue;
    ASSERT_OK(spw_acquire(rt, b[i], s2, 0, &d));
    ASSERT_OK(spw_release(rt, b[i], s2));
  }
  ASSERT_OK(spw_stream_synchronize(rt, s2));
  ASSERT_OK(spw_wait_idle(rt));
  uint64_t host = 0;
  for (int i = 0; i < N; i++) {
    if (gone[i]) continue;
    spw_state_t at = state_of(rt, b[i]);
    if (i % 5 == 1) {
      ASSERT_EQ(at, SPW_STATE_RESIDENT); /* locked */
    } else if (i % 11 == 4) {
      /* Brought back by its acquire, or acquired before its slice came to it and spilled
       * once released. */
      ASSERT_TRUE(at == SPW_STATE_RESIDENT || at == SPW_STATE_HOST);
      if (at == SPW_STATE_HOST) host += size[i];
    } else {
      ASSERT_EQ(at, SPW_STATE_HOST);
      host += size[i];
    }
  }
  ASSERT_UEQ(stats_of(rt).host_bytes, host);
  for (int i = 1; i < N; i += 5) ASSERT_OK(spw_release(rt, b[i], s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  /* Back in one request: the up lane cuts it into slices too. */
  spw_buf_t *live = calloc(N, sizeof *live);
  ASSERT_TRUE(live != NULL);
  size_t nlive = 0;
  for (int i = 0; i < N; i++)
    if (!gone[i]) live[nlive++] = b[i];
  ASSERT_OK(spw_prefetch_n(rt, live, nlive, s));
  ASSERT_OK(spw_wait_idle(rt));
  for (size_t k = 0; k < nlive; k++) ASSERT_EQ(state_of(rt, live[k]), SPW_STATE_RESIDENT);
  ASSERT_UEQ(stats_of(rt).host_bytes, 0);
  free(live);
  for (int i = 0; i < N; i++) {
    if (!gone[i] && (i % 13 == 0 || i % 11 == 4)) expect_contents(b[i], 0, want[i], size[i], 9000 + (uint64_t)i);
    if (!gone[i]) ASSERT_OK(spw_free(rt, b[i]));
    free(want[i]);
  }
  ASSERT_UEQ(stats_of(rt).buffers, 0);
  ASSERT_UEQ(stats_of(rt).host_bytes, 0);
  free(b);
  free(size);
  free(want);
  free(gone);
}

/* An acquire_n of many spilled buffers brings them back in slices, the caller's thread with
 * the up lane's helpers, while the lane brings back a prefetch of others in slices too: the
 * two runs take turns, and every buffer comes back with its bytes. */
static void an_acquire_n_of_many_spilled_buffers_comes_back_in_slices_beside_a_prefetch(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 64 * MIB;
  reopen_fixture(&cfg);
  enum { N = 2 * 9000 }; /* halves of 9000: two slices each (SLICE_MIN 4096, runtime.c) */
  spw_buf_t *b = calloc(N, sizeof *b), *even = calloc(N / 2, sizeof *even),
            *odd = calloc(N / 2, sizeof *odd);
  size_t *size = calloc(N, sizeof *size);
  uint8_t **want = calloc(N, sizeof *want);
  void **ptrs = calloc(N / 2, sizeof *ptrs);
  ASSERT_TRUE(b && even && odd && size && want && ptrs);
  for (int i = 0; i < N; i++) {
    size[i] = 64 + (size_t)(rng_next() % 193);
    b[i] = uploaded(size[i], 7000 + (uint64_t)i, &want[i]);
    (i % 2 ? odd : even)[i / 2] = b[i];
  }
  ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_prefetch_n(rt, odd, N / 2, s2));
  ASSERT_OK(spw_acquire_n(rt, even, N / 2, s, 0, ptrs));
  for (int k = 0; k < N / 2; k++) {
    ASSERT_TRUE(ptrs[k] != NULL);
    ASSERT_EQ(state_of(rt, even[k]), SPW_STATE_RESIDENT);
  }
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* releases the acquire_n's locks */
  ASSERT_OK(spw_wait_idle(rt));
  for (int k = 0; k < N / 2; k++) ASSERT_EQ(state_of(rt, odd[k]), SPW_STATE_RESIDENT);
  ASSERT_UEQ(stats_of(rt).host_bytes, 0);
  for (int i = 0; i < N; i++) {
    if (i % 7 == 0 || i % 7 == 1) expect_contents(b[i], 0, want[i], size[i], 7000 + (uint64_t)i);
    ASSERT_OK(spw_free(rt, b[i]));
    free(want[i]);
  }
  ASSERT_UEQ(stats_of(rt).buffers, 0);
  free(b);
  free(even);
  free(odd);
  free(size);
  free(want);
  free(ptrs);
}

/* The batch an acquire_n brings back keeps the host copies as clean copies only for a
 * read-only acquire (the next spill then moves no byte): a writable one would make them
 * stale at once. */
static void an_acquire_n_keeps_clean_host_copies_only_when_read_only(void) {
  enum { N = 64 };
  spw_buf_t b[N];
  uint8_t *want[N];
  void *d[N];
  for (int i = 0; i < N; i++) b[i] = uploaded(4096 + 64 * (size_t)i, 500 + (uint64_t)i, &want[i]);
  for (int read_only = 1; read_only >= 0; read_only--) {
    ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
    ASSERT_OK(spw_wait_idle(rt));
    ASSERT_OK(spw_acquire_n(rt, b, N, s, read_only ? SPW_ACQUIRE_READ : 0, d));
    ASSERT_OK(spw_stream_synchronize(rt, s));
    for (int i = 0; i < N; i++) ASSERT_EQ(state_of(rt, b[i]), SPW_STATE_RESIDENT);
    const uint64_t clean = stats_of(rt).clean_respills;
    ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
    ASSERT_OK(spw_wait_idle(rt));
    ASSERT_UEQ(stats_of(rt).clean_respills - clean, (uint64_t)(read_only ? N : 0));
  }
  for (int i = 0; i < N; i++)
    expect_and_free(b[i], want[i], 4096 + 64 * (size_t)i, 500 + (uint64_t)i);
}

/* acquire_n is all or nothing: when a lock fails after its batch from host has brought
 * buffers back with their locks taken (on both sides of the failing one), every lock goes,
 * and the buffers stay resident and whole; in one batch, and in slices. */
static void an_acquire_n_that_fails_after_its_batch_leaves_no_lock_in(int sliced) {
  if (sliced) setenv("SPILLWAY_TEST_SLICE_MIN", "4", 1); /* read when the runtime is made */
  reopen_fixture(NULL);
  unsetenv("SPILLWAY_TEST_SLICE_MIN");
  enum { N = 64 };
  spw_buf_t b[N + 1];
  uint8_t *want[N];
  void *d[N + 1];
  for (int i = 0; i < N; i++) b[i] = uploaded(4096, 700 + (uint64_t)i, &want[i]);
  spw_buf_t gone;
  ASSERT_OK(spw_alloc(rt, 4096, s, &gone));
  ASSERT_OK(spw_free(rt, gone));
  b[N] = b[N / 2];
  b[N / 2] = gone; /* the failing lock, in the middle */
  for (int flags = 0; flags <= (int)SPW_ACQUIRE_READ; flags += (int)SPW_ACQUIRE_READ) {
    ASSERT_OK(spw_spill_n(rt, b, N / 2, SPW_TIER_HOST));
    ASSERT_OK(spw_spill_n(rt, b + N / 2 + 1, N / 2, SPW_TIER_HOST));
    ASSERT_OK(spw_wait_idle(rt));
    ASSERT_STATUS(spw_acquire_n(rt, b, N + 1, s, (unsigned)flags, d), SPW_ERR_FREED);
    for (int i = 0; i <= N; i++) {
      if (i == N / 2) continue;
      uint32_t locks = 1;
      ASSERT_OK(spw_buf_lock_count(rt, b[i], &locks));
      ASSERT_UEQ(locks, 0);
      ASSERT_EQ(state_of(rt, b[i]), SPW_STATE_RESIDENT);
    }
  }
  /* And when it succeeds, each pointer is its own buffer's. */
  b[N / 2] = b[N];
  ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_acquire_n(rt, b, N, s, 0, d));
  for (int i = 0; i < N; i++) {
    void *one = NULL;
    ASSERT_OK(spw_acquire(rt, b[i], s, SPW_ACQUIRE_READ, &one));
    ASSERT_UEQ((uintptr_t)one, (uintptr_t)d[i]);
  }
  ASSERT_OK(spw_stream_synchronize(rt, s));
  for (int i = 0; i < N; i++) expect_and_free(b[i], want[i], 4096, 700 + (uint64_t)i);
}

/* The host copies a writable acquire_n's batch gives back are free again: cycles of spill
 * and acquire_n of 256 KiB under a 1 MiB host limit keep every spill on host (a leak of
 * one cycle's copies would send the fourth cycle's to disk). */
static void a_writable_acquire_n_gives_its_host_memory_back(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.host_limit = 1 * MIB;
  reopen_fixture(&cfg);
  enum { N = 64 };
  spw_buf_t b[N];
  uint8_t *want[N];
  void *d[N];
  for (int i = 0; i < N; i++) b[i] = uploaded(4096, 900 + (uint64_t)i, &want[i]);
  for (int cycle = 0; cycle < 12; cycle++) {
    ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
    ASSERT_OK(spw_wait_idle(rt));
    for (int i = 0; i < N; i++) ASSERT_EQ(state_of(rt, b[i]), SPW_STATE_HOST);
    ASSERT_OK(spw_acquire_n(rt, b, N, s, 0, d));
    ASSERT_OK(spw_stream_synchronize(rt, s));
  }
  for (int i = 0; i < N; i++) expect_and_free(b[i], want[i], 4096, 900 + (uint64_t)i);
}

static void an_acquire_n_that_fails_after_its_batch_leaves_no_lock(void) {
  an_acquire_n_that_fails_after_its_batch_leaves_no_lock_in(0);
  an_acquire_n_that_fails_after_its_batch_leaves_no_lock_in(1);
}

static void seed(void) {
  rng_state = spw_test_seed();
  setenv("SPILLWAY_ENGINE_HELPERS", "3", 0); /* the slices of large requests, on any machine */
}

/* ---- SPW_ALLOC_ARENA: plain memory from the pool's arenas -------------------------------- */

static spw_buf_t arena_filled(size_t n, uint64_t seed) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc_ex(rt, n, s, SPW_ALLOC_ARENA, &b));
  uint8_t *src = malloc(n);
  test_fill(src, n, seed);
  upload(b, src, n);
  free(src);
  return b;
}

static void arena_buffers_keep_their_data_through_spills(void) {
  enum { N = 8 };
  spw_buf_t b[N];
  for (int i = 0; i < N; i++) b[i] = arena_filled(MIB + 4096 * (size_t)i, 70 + (uint64_t)i);
  for (int round = 0; round < 2; round++) {
    (void)test_spill_counted(rt, b, N, SPW_TIER_HOST);
    for (int i = 0; i < N; i++) test_expect_fill(rt, b[i], s, MIB + 4096 * (size_t)i, 70 + (uint64_t)i);
  }
  for (int i = 0; i < N; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_wait_idle(rt));
}

static void arena_memory_comes_back_for_the_next_allocation(void) {
  spw_buf_t a = arena_filled(2 * MIB, 1);
  void *first = NULL, *again = NULL;
  ASSERT_OK(spw_acquire(rt, a, s, 0, &first));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_free(rt, a));
  ASSERT_OK(spw_wait_idle(rt)); /* the free waited for the stream, then returned the block */
  spw_buf_t b = arena_filled(2 * MIB, 2);
  ASSERT_OK(spw_acquire(rt, b, s, 0, &again));
  ASSERT_PTR_EQ(again, first);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  test_expect_fill(rt, b, s, 2 * MIB, 2);
  ASSERT_OK(spw_free(rt, b));
}

/* With the engine idle, the free returns the block at once rather than one poller round
 * later: a library's allocate-free-allocate loop reuses it instead of growing arenas. */
static void arena_memory_freed_while_idle_comes_back_at_once(void) {
  spw_buf_t a = arena_filled(2 * MIB, 3);
  void *first = NULL, *again = NULL;
  ASSERT_OK(spw_acquire(rt, a, s, 0, &first));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_free(rt, a));
  spw_buf_t b = arena_filled(2 * MIB, 4);
  ASSERT_OK(spw_acquire(rt, b, s, 0, &again));
  ASSERT_PTR_EQ(again, first);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_free(rt, b));
}

static void arena_buffers_are_ordinary_and_refuse_stable(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.stable_addresses = SPW_STABLE_ON;
  reopen_fixture(&cfg);
  spw_buf_t b;
  int stable = -1;
  ASSERT_STATUS(spw_alloc_ex(rt, MIB, s, SPW_ALLOC_ARENA | SPW_ALLOC_STABLE, &b),
                SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_alloc_ex(rt, MIB, s, SPW_ALLOC_ARENA, &b));
  ASSERT_OK(spw_buf_is_stable(rt, b, &stable));
  ASSERT_EQ(stable, 0);
  ASSERT_OK(spw_free(rt, b));
}

static const spw_test_t tests[] = {
    TEST(contents_survive_spill_unspill_cycles),
    TEST(spill_of_locked_buffer_is_refused),
    TEST(acquire_of_host_buffer_is_right_after_stream_sync),
    TEST(second_stream_waits_for_copy_back_too),
    TEST(read_only_acquire_makes_next_spill_clean),
    TEST(writable_acquire_makes_next_spill_move_bytes),
    TEST(acquire_during_spill_abandons_it),
    TEST(prefetch_brings_host_buffer_back),
    TEST(stats_move_as_documented),
    TEST(stats_summary_is_not_empty),
    TEST(try_acquire_refuses_to_bring_a_buffer_back),
    TEST(batch_counts_only_what_moved),
    TEST(a_large_request_is_spilled_in_slices_and_nothing_is_lost),
    TEST(an_acquire_n_of_many_spilled_buffers_comes_back_in_slices_beside_a_prefetch),
    TEST(an_acquire_n_keeps_clean_host_copies_only_when_read_only),
    TEST(an_acquire_n_that_fails_after_its_batch_leaves_no_lock),
    TEST(a_writable_acquire_n_gives_its_host_memory_back),
    TEST(arena_buffers_keep_their_data_through_spills),
    TEST(arena_memory_comes_back_for_the_next_allocation),
    TEST(arena_memory_freed_while_idle_comes_back_at_once),
    TEST(arena_buffers_are_ordinary_and_refuse_stable),
};
TEST_MAIN_HOOKS(tests, seed, NULL, open_fixture, close_fixture)
