/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of address-stable buffers (issue 21): the device pointer an acquire
 * returns is the same for a buffer's whole life, after a spill to host, to disk, under
 * acquire_n batches and prefetches, with four threads under pressure, for sizes below and
 * above the granularity; spilled, a buffer holds no device memory (its range is unmapped)
 * and counts as other buffers do in the budget; the three opt-ins (the config field, the
 * environment variable, the allocation flag) and their bad values.
 *
 * A seam test: it reads the stable pool's usage (mapped, pooled, reserved bytes) to check
 * that a spill really takes the memory away and a free gives the range back. Device memory
 * is touched only through spw_memcpy_async, so every test runs on both backends, except
 * the one that checks that the host emulation faults on an unmapped range. Disk tests run
 * once per I/O path (CTest sets SPILLWAY_IO). */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime.h"
#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"
#include "fixture.h" /* last: see its header */

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static char spill_dir[512];

/* The fixture: a runtime whose buffers are ordinary by default (each test asks for stable
 * ones with SPW_ALLOC_STABLE, so the opt-in under test is the flag), a spill directory for
 * the disk tests, and a device limit of 64 MiB, or 8 granules where a granule is larger. */
static spw_runtime_t *stable_runtime(uint64_t device_limit, uint64_t host_limit) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = device_limit;
  cfg.host_limit = host_limit;
  cfg.spill_dir = spill_dir;
  cfg.stable_addresses = SPW_STABLE_OFF;
  return test_runtime(&cfg);
}

static void before(void) {
  test_tmpdir(spill_dir, sizeof spill_dir, "stable");
  rt = stable_runtime(64 * MIB, 64 * MIB);
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_stream_create(rt, &s2));
  size_t g = 0;
  int st = spw_stable_granularity(rt, &g);
  TEST_SKIP_IF(st == SPW_ERR_UNSUPPORTED, "no virtual memory management on this device");
  ASSERT_OK(st);
}

static void after(void) {
  close_fixture();
  if (spill_dir[0]) test_tmpdir_remove(spill_dir);
  spill_dir[0] = '\0';
}

static size_t granule(void) {
  size_t g = 0;
  ASSERT_OK(spw_stable_granularity(rt, &g));
  return g;
}

static spw_buf_t stable_alloc(size_t n) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc_ex(rt, n, s, SPW_ALLOC_STABLE, &b));
  return b;
}

/* A stable buffer of n bytes holding test_fill(seed); *addr gets its device pointer. */
static spw_buf_t stable_filled(size_t n, uint64_t seed, void **addr) {
  spw_buf_t b = stable_alloc(n);
  uint8_t *src = malloc(n);
  ASSERT_TRUE(src != NULL);
  test_fill(src, n, seed);
  ASSERT_OK(spw_acquire(rt, b, s, 0, addr));
  ASSERT_OK(spw_memcpy_async(rt, *addr, src, n, s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  free(src);
  return b;
}

/* Acquires b on `stream`, requires the pointer to be `addr` and the contents test_fill(seed),
 * and releases it. */
static void expect_at(spw_buf_t b, spw_stream_t stream, void *addr, size_t n, uint64_t seed) {
  void *d = NULL;
  uint8_t *got = malloc(n);
  ASSERT_TRUE(got != NULL);
  memset(got, 0, n);
  ASSERT_OK(spw_acquire(rt, b, stream, SPW_ACQUIRE_READ, &d));
  ASSERT_PTR_EQ(d, addr);
  ASSERT_OK(spw_memcpy_async(rt, got, d, n, stream));
  ASSERT_OK(spw_stream_synchronize(rt, stream));
  ASSERT_UEQ(test_first_mismatch(got, n, seed), (size_t)-1);
  free(got);
}

static void spill_to(spw_buf_t b, spw_tier_t tier, spw_state_t want) {
  ASSERT_OK(spw_spill(rt, b, tier));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), want);
}

static uint64_t mapped_bytes(void) {
  uint64_t m = 0;
  spw__stable_usage(rt->stable, &m, NULL, NULL);
  return m;
}

static uint64_t reserved_bytes(void) {
  uint64_t r = 0;
  spw__stable_usage(rt->stable, NULL, NULL, &r);
  return r;
}

/* ---- the address across moves ---------------------------------------------------------- */

static void same_address_after_spill_to_host_and_back(void) {
  const size_t n = 3 * granule() + 12345;
  void *addr = NULL;
  spw_buf_t b = stable_filled(n, 1, &addr);
  for (int round = 0; round < 3; round++) {
    spill_to(b, SPW_TIER_HOST, SPW_STATE_HOST);
    expect_at(b, round % 2 ? s2 : s, addr, n, 1);
  }
  ASSERT_OK(spw_free(rt, b));
}

static void same_address_after_disk_and_back(void) {
  const size_t n = 2 * granule() + 4097;
  void *addr = NULL;
  spw_buf_t b = stable_filled(n, 2, &addr);
  /* Straight to disk, and by way of the host tier (a demotion). */
  spill_to(b, SPW_TIER_DISK, SPW_STATE_DISK);
  expect_at(b, s, addr, n, 2);
  spill_to(b, SPW_TIER_HOST, SPW_STATE_HOST);
  spill_to(b, SPW_TIER_DISK, SPW_STATE_DISK);
  expect_at(b, s2, addr, n, 2);
  ASSERT_OK(spw_free(rt, b));
}

static void same_addresses_under_acquire_n_batches(void) {
  enum { N = 12 };
  const size_t g = granule();
  spw_buf_t b[N];
  void *addr[N], *got[N];
  size_t n[N];
  for (int i = 0; i < N; i++) {
    n[i] = i % 3 == 0 ? g / 8 + (size_t)i : i % 3 == 1 ? g + (size_t)i * 512 : 2 * g - 1;
    b[i] = stable_filled(n[i], 100 + (uint64_t)i, &addr[i]);
  }
  /* A third on host, a third on disk, a third left resident: one batch brings both back. */
  spw_buf_t host[N], disk[N];
  size_t nh = 0, nd = 0;
  for (int i = 0; i < N; i++) {
    if (i % 3 == 1) host[nh++] = b[i];
    if (i % 3 == 2) disk[nd++] = b[i];
  }
  ASSERT_OK(spw_spill_n(rt, host, nh, SPW_TIER_HOST));
  ASSERT_OK(spw_spill_n(rt, disk, nd, SPW_TIER_DISK));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_acquire_n(rt, b, N, s, 0, got));
  for (int i = 0; i < N; i++) ASSERT_PTR_EQ(got[i], addr[i]);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  for (int i = 0; i < N; i++) expect_at(b[i], s2, addr[i], n[i], 100 + (uint64_t)i);
}

static void prefetch_brings_buffers_back_at_their_addresses(void) {
  enum { N = 6 };
  const size_t g = granule();
  spw_buf_t b[N];
  void *addr[N];
  for (int i = 0; i < N; i++) b[i] = stable_filled(i % 2 ? g / 4 : g + 1, 200 + (uint64_t)i, &addr[i]);
  ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_prefetch_n(rt, b, N, s));
  ASSERT_OK(spw_wait_idle(rt));
  for (int i = 0; i < N; i++) {
    ASSERT_EQ(state_of(rt, b[i]), SPW_STATE_RESIDENT);
    expect_at(b[i], s, addr[i], i % 2 ? g / 4 : g + 1, 200 + (uint64_t)i);
  }
}

/* ---- sizes -------------------------------------------------------------------------------- */

static void sizes_below_and_above_the_granularity_keep_their_addresses(void) {
  const size_t g = granule();
  const size_t sizes[] = {1, 255, 256, 4097, g / 2, g - 1, g, g + 1, 3 * g + 5};
  enum { N = sizeof sizes / sizeof sizes[0] };
  spw_buf_t b[N];
  void *addr[N];
  for (size_t i = 0; i < N; i++) {
    b[i] = stable_filled(sizes[i], 300 + i, &addr[i]);
    int stable = 0;
    ASSERT_OK(spw_buf_is_stable(rt, b[i], &stable));
    ASSERT_EQ(stable, 1);
    /* Every buffer is at least 256-byte aligned, as device allocations are. */
    ASSERT_UEQ((uintptr_t)addr[i] % 256, 0);
  }
  for (int round = 0; round < 2; round++) {
    ASSERT_OK(spw_spill_n(rt, b, N, round ? SPW_TIER_DISK : SPW_TIER_HOST));
    ASSERT_OK(spw_wait_idle(rt));
    for (size_t i = 0; i < N; i++) expect_at(b[i], s, addr[i], sizes[i], 300 + i);
  }
}

static void small_buffers_share_a_page_that_is_unmapped_with_its_last_resident_block(void) {
  const size_t g = granule();
  void *a1, *a2;
  spw_buf_t b1 = stable_filled(g / 4, 401, &a1), b2 = stable_filled(g / 4, 402, &a2);
  /* Two blocks of one class come from one page. */
  ASSERT_UEQ((uintptr_t)a1 / g, (uintptr_t)a2 / g);
  uint64_t both = mapped_bytes();
  spill_to(b1, SPW_TIER_HOST, SPW_STATE_HOST);
  ASSERT_UEQ(mapped_bytes(), both); /* b2 keeps the page mapped */
  spill_to(b2, SPW_TIER_HOST, SPW_STATE_HOST);
  ASSERT_UEQ(mapped_bytes(), both - g);
  expect_at(b1, s, a1, g / 4, 401);
  expect_at(b2, s, a2, g / 4, 402);
}

/* ---- memory behind the range ---------------------------------------------------------- */

static void spilled_buffer_holds_no_device_memory(void) {
  const size_t g = granule();
  void *addr;
  spw_buf_t b = stable_filled(4 * g, 5, &addr);
  uint64_t resident = mapped_bytes();
  ASSERT_GE(resident, 4 * g);
  spill_to(b, SPW_TIER_HOST, SPW_STATE_HOST);
  ASSERT_UEQ(mapped_bytes(), resident - 4 * g);
  expect_at(b, s, addr, 4 * g, 5);
  ASSERT_UEQ(mapped_bytes(), resident);
}

static void freed_buffers_give_their_ranges_back(void) {
  const size_t g = granule();
  ASSERT_UEQ(reserved_bytes(), 0);
  void *a;
  spw_buf_t big = stable_filled(2 * g + 1, 6, &a), small = stable_filled(100, 7, &a);
  spw_buf_t spilled = stable_filled(g, 8, &a);
  spill_to(spilled, SPW_TIER_HOST, SPW_STATE_HOST);
  ASSERT_GT(reserved_bytes(), 0);
  ASSERT_OK(spw_free(rt, big));
  ASSERT_OK(spw_free(rt, small));
  ASSERT_OK(spw_free(rt, spilled));
  ASSERT_UEQ(reserved_bytes(), 0);
  ASSERT_UEQ(mapped_bytes(), 0);
}

static void buffer_freed_while_locked_goes_at_its_last_release(void) {
  const size_t g = granule();
  void *addr, *d;
  spw_buf_t b = stable_filled(g + 5, 9, &addr);
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_free(rt, b));
  /* The holder may still use the memory: it stays mapped until the lock goes. */
  ASSERT_GE(mapped_bytes(), 2 * g);
  uint8_t byte = 0x5A;
  ASSERT_OK(spw_memcpy_async(rt, d, &byte, 1, s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_UEQ(mapped_bytes(), 0);
  ASSERT_UEQ(reserved_bytes(), 0);
}

/* The host emulation keeps an unmapped range inaccessible, so a use of a spilled buffer's
 * address outside a lock faults instead of reading stale memory (on a GPU a kernel would
 * raise an illegal address). */
static void host_emulation_faults_on_an_unmapped_range(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST, "a host access faults only under emulation");
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  TEST_SKIP_IF(1, "the sanitizers' own SIGSEGV handlers report the fault as an error");
#endif
  const size_t g = granule();
  void *addr;
  spw_buf_t b = stable_filled(g, 10, &addr);
  spill_to(b, SPW_TIER_HOST, SPW_STATE_HOST);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    volatile uint8_t *p = addr;
    uint8_t v = p[0];
    _exit(v == 0xEE ? 3 : 2); /* reached only if the read did not fault */
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_EQ(WTERMSIG(status), SIGSEGV);
  expect_at(b, s, addr, g, 10);
}

/* ---- budget ------------------------------------------------------------------------------ */

static void budget_counts_stable_buffers_by_their_size(void) {
  const size_t g = granule();
  void *a1, *a2;
  spw_buf_t b1 = stable_filled(g + 3, 11, &a1), b2 = stable_filled(1000, 12, &a2);
  spw_buf_t plain;
  ASSERT_OK(spw_alloc_ex(rt, 5000, s, SPW_ALLOC_MOVABLE, &plain));
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.device_bytes, g + 3 + 1000 + 5000);
  ASSERT_UEQ(st.buffers, 3);
  spill_to(b1, SPW_TIER_HOST, SPW_STATE_HOST);
  st = stats_of(rt);
  ASSERT_UEQ(st.device_bytes, 1000 + 5000);
  ASSERT_UEQ(st.host_bytes, g + 3);
  spill_to(b2, SPW_TIER_DISK, SPW_STATE_DISK);
  st = stats_of(rt);
  ASSERT_UEQ(st.device_bytes, 5000);
  ASSERT_UEQ(st.disk_bytes, 1000);
  /* Back on the device, each counts by its size again. */
  expect_at(b1, s, a1, g + 3, 11);
  expect_at(b2, s, a2, 1000, 12);
  ASSERT_UEQ(stats_of(rt).device_bytes, g + 3 + 1000 + 5000);
}

static void pressure_spills_stable_buffers_and_they_come_back_in_place(void) {
  /* A limit of 6 granules and 12 buffers of one granule: allocating makes room by spilling. */
  const size_t g = granule();
  close_fixture();
  rt = stable_runtime(6 * g, 64 * g);
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_stream_create(rt, &s2));
  enum { N = 12 };
  spw_buf_t b[N];
  void *addr[N];
  for (int i = 0; i < N; i++) b[i] = stable_filled(g, 500 + (uint64_t)i, &addr[i]);
  /* Twelve granules through a limit of six: at least six left the device, on demand or in
   * the background (which of the two, and whether a background batch has been counted yet
   * when the last allocation returns, is a matter of timing: wait for it, then look). */
  ASSERT_OK(spw_wait_idle(rt));
  int away = 0;
  for (int i = 0; i < N; i++) away += state_of(rt, b[i]) != SPW_STATE_RESIDENT;
  ASSERT_GE(away, N - 6);
  ASSERT_LE(stats_of(rt).device_bytes, 6 * g);
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < N; i++) expect_at(b[i], s, addr[i], g, 500 + (uint64_t)i);
}

/* ---- four threads ---------------------------------------------------------------------- */

typedef struct worker {
  int id;
  size_t g;
  int failures;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  enum { N = 6, ROUNDS = 20 };
  spw_stream_t ws;
  if (spw_stream_create(rt, &ws) != SPW_OK) {
    w->failures++;
    return NULL;
  }
  spw_buf_t b[N];
  void *addr[N];
  size_t n[N];
  uint64_t seed[N];
  uint64_t rng = 1000 + (uint64_t)w->id;
  for (int i = 0; i < N; i++) {
    n[i] = i % 2 ? w->g / 8 + (size_t)w->id : w->g + (size_t)i * 100;
    seed[i] = (uint64_t)w->id * 100 + (uint64_t)i;
    uint8_t *src = malloc(n[i]);
    test_fill(src, n[i], seed[i]);
    if (spw_alloc_ex(rt, n[i], ws, SPW_ALLOC_STABLE, &b[i]) != SPW_OK ||
        spw_acquire(rt, b[i], ws, 0, &addr[i]) != SPW_OK ||
        spw_memcpy_async(rt, addr[i], src, n[i], ws) != SPW_OK ||
        spw_stream_synchronize(rt, ws) != SPW_OK)
      w->failures++;
    free(src);
  }
  for (int r = 0; r < ROUNDS && !w->failures; r++) {
    int i = (int)(test_splitmix(&rng) % N);
    switch (test_splitmix(&rng) % 3) {
    case 0: (void)spw_spill(rt, b[i], SPW_TIER_HOST); break;
    case 1: (void)spw_spill(rt, b[i], SPW_TIER_DISK); break;
    default: {
      void *d = NULL;
      uint8_t *got = malloc(n[i]);
      if (spw_acquire(rt, b[i], ws, SPW_ACQUIRE_READ, &d) != SPW_OK || d != addr[i] ||
          spw_memcpy_async(rt, got, d, n[i], ws) != SPW_OK ||
          spw_stream_synchronize(rt, ws) != SPW_OK ||
          test_first_mismatch(got, n[i], seed[i]) != (size_t)-1) {
        fprintf(stderr, "worker %d: buffer %d at %p came back at %p or changed\n", w->id, i,
                addr[i], d);
        w->failures++;
      }
      free(got);
    }
    }
  }
  for (int i = 0; i < N; i++) (void)spw_free(rt, b[i]);
  (void)spw_stream_destroy(rt, ws);
  return NULL;
}

static void four_threads_under_pressure_keep_addresses_and_contents(void) {
  const size_t g = granule();
  close_fixture();
  /* 4 threads x (3 buffers of a granule + 3 small ones) against a limit of 8 granules. */
  rt = stable_runtime(8 * g, 64 * g);
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_stream_create(rt, &s2));
  worker_t w[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker_t){.id = i, .g = g};
    ASSERT_EQ(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < 4; i++) ASSERT_EQ(w[i].failures, 0);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_UEQ(stats_of(rt).buffers, 0);
  ASSERT_UEQ(reserved_bytes(), 0);
}

/* ---- the opt-ins and bad input ---------------------------------------------------------- */

static void alloc_ex_rejects_unknown_and_conflicting_flags(void) {
  spw_buf_t b = SPW_BUF_NULL;
  ASSERT_STATUS(spw_alloc_ex(rt, 4096, s, 0x8, &b), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_STABLE | SPW_ALLOC_ARENA, &b),
                SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_STABLE | SPW_ALLOC_MOVABLE, &b),
                SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(rt, 0, s, SPW_ALLOC_STABLE, &b), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_STABLE, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(NULL, 4096, s, SPW_ALLOC_STABLE, &b), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(b == SPW_BUF_NULL);
  ASSERT_UEQ(stats_of(rt).buffers, 0);
  ASSERT_UEQ(reserved_bytes(), 0);
}

static void queries_reject_bad_handles_and_null_outputs(void) {
  int stable = -1;
  size_t g = 0;
  spw_buf_t b = stable_alloc(4096);
  ASSERT_STATUS(spw_buf_is_stable(rt, b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_is_stable(NULL, b, &stable), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_is_stable(rt, SPW_BUF_NULL, &stable), SPW_ERR_INVALID_HANDLE);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_STATUS(spw_buf_is_stable(rt, b, &stable), SPW_ERR_FREED);
  ASSERT_EQ(stable, -1);
  ASSERT_STATUS(spw_stable_granularity(rt, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stable_granularity(NULL, &g), SPW_ERR_INVALID_ARG);
}

static void movable_flag_overrides_a_stable_runtime(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.stable_addresses = SPW_STABLE_ON;
  reopen_fixture(&cfg);
  spw_buf_t a, b;
  int sa = 0, sb = 1;
  ASSERT_OK(spw_alloc(rt, 4096, s, &a));
  ASSERT_OK(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_MOVABLE, &b));
  ASSERT_OK(spw_buf_is_stable(rt, a, &sa));
  ASSERT_OK(spw_buf_is_stable(rt, b, &sb));
  ASSERT_EQ(sa, 1);
  ASSERT_EQ(sb, 0);
}

static void runtime_default_is_ordinary_buffers(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.flags = SPW_CONFIG_IGNORE_ENV; /* whatever the environment says, the default is off */
  reopen_fixture(&cfg);
  spw_buf_t a;
  int sa = 1;
  ASSERT_OK(spw_alloc(rt, 4096, s, &a));
  ASSERT_OK(spw_buf_is_stable(rt, a, &sa));
  ASSERT_EQ(sa, 0);
}

static void environment_variable_makes_spw_alloc_stable(void) {
  const char *old = getenv("SPILLWAY_STABLE_ADDRESSES");
  char *saved = old ? strdup(old) : NULL;
  ASSERT_EQ(setenv("SPILLWAY_STABLE_ADDRESSES", "on", 1), 0);
  reopen_fixture(NULL);
  spw_buf_t a;
  int sa = 0;
  ASSERT_OK(spw_alloc(rt, 4096, s, &a));
  ASSERT_OK(spw_buf_is_stable(rt, a, &sa));
  if (saved) setenv("SPILLWAY_STABLE_ADDRESSES", saved, 1);
  else unsetenv("SPILLWAY_STABLE_ADDRESSES");
  free(saved);
  ASSERT_EQ(sa, 1);
}

static void bad_stable_addresses_values_are_config_errors(void) {
  char msg[256];
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.stable_addresses = (spw_stable_mode_t)7;
  ASSERT_STATUS(spw_config_validate(&cfg, msg, sizeof msg), SPW_ERR_CONFIG);
  ASSERT_TRUE(strstr(msg, "config.stable_addresses") != NULL);
  const char *old = getenv("SPILLWAY_STABLE_ADDRESSES");
  char *saved = old ? strdup(old) : NULL;
  ASSERT_EQ(setenv("SPILLWAY_STABLE_ADDRESSES", "maybe", 1), 0);
  spw_config_t env = SPW_CONFIG_INIT;
  int st = spw_config_validate(&env, msg, sizeof msg);
  if (saved) setenv("SPILLWAY_STABLE_ADDRESSES", saved, 1);
  else unsetenv("SPILLWAY_STABLE_ADDRESSES");
  free(saved);
  ASSERT_STATUS(st, SPW_ERR_CONFIG);
  ASSERT_TRUE(strstr(msg, "SPILLWAY_STABLE_ADDRESSES='maybe'") != NULL);
}

static const spw_test_t tests[] = {
    {"same_address_after_spill_to_host_and_back", same_address_after_spill_to_host_and_back},
    {"same_address_after_disk_and_back", same_address_after_disk_and_back},
    {"same_addresses_under_acquire_n_batches", same_addresses_under_acquire_n_batches},
    {"prefetch_brings_buffers_back_at_their_addresses",
     prefetch_brings_buffers_back_at_their_addresses},
    {"sizes_below_and_above_the_granularity_keep_their_addresses",
     sizes_below_and_above_the_granularity_keep_their_addresses},
    {"small_buffers_share_a_page_that_is_unmapped_with_its_last_resident_block",
     small_buffers_share_a_page_that_is_unmapped_with_its_last_resident_block},
    {"spilled_buffer_holds_no_device_memory", spilled_buffer_holds_no_device_memory},
    {"freed_buffers_give_their_ranges_back", freed_buffers_give_their_ranges_back},
    {"buffer_freed_while_locked_goes_at_its_last_release",
     buffer_freed_while_locked_goes_at_its_last_release},
    {"host_emulation_faults_on_an_unmapped_range", host_emulation_faults_on_an_unmapped_range},
    {"budget_counts_stable_buffers_by_their_size", budget_counts_stable_buffers_by_their_size},
    {"pressure_spills_stable_buffers_and_they_come_back_in_place",
     pressure_spills_stable_buffers_and_they_come_back_in_place},
    {"four_threads_under_pressure_keep_addresses_and_contents",
     four_threads_under_pressure_keep_addresses_and_contents},
    {"alloc_ex_rejects_unknown_and_conflicting_flags",
     alloc_ex_rejects_unknown_and_conflicting_flags},
    {"queries_reject_bad_handles_and_null_outputs", queries_reject_bad_handles_and_null_outputs},
    {"movable_flag_overrides_a_stable_runtime", movable_flag_overrides_a_stable_runtime},
    {"runtime_default_is_ordinary_buffers", runtime_default_is_ordinary_buffers},
    {"environment_variable_makes_spw_alloc_stable", environment_variable_makes_spw_alloc_stable},
    {"bad_stable_addresses_values_are_config_errors",
     bad_stable_addresses_values_are_config_errors},
};

TEST_MAIN_FIXTURE(tests, before, after)
