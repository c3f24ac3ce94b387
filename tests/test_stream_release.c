/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of stream-ordered lock release, the key RMMEP-1 behaviour (public API
 * only). A host func that blocks on a gate stands for a long kernel: on the CUDA backend it
 * blocks the stream exactly as one would. While the stream is blocked, release_async must
 * not block the caller nor release anything, synchronize must wait, a lock taken after
 * release_async must survive it, a freed locked buffer must keep its memory, and the runtime
 * must refuse to be destroyed. Every gate opens by itself after GATE_TIMEOUT_S, so a library
 * that waits where it must not fails the test instead of hanging it. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "gate.h"
#include "test_main.h"
#include "test_util.h"
#include "fixture.h" /* last: see its header */

#define POLL_TIMEOUT_MS 5000

/* Every test starts from the fixture (fixture.h) and a closed gate g, which must not have
 * opened by itself by the end of the test. */
static gate_t g;

static void open_gate_fixture(void) {
  gate_init(&g);
  open_fixture();
}

static void close_gate_fixture(void) {
  gate_open(&g); /* nothing may stay queued behind it */
  close_fixture();
  ASSERT_TRUE(!gate_timed_out(&g));
}

static uint32_t locks_of(spw_buf_t b) { return test_locks_of(rt, b); }

/* Polls until `b` holds `want` locks; returns false after POLL_TIMEOUT_MS. */
static bool await_locks(spw_buf_t b, uint32_t want) {
  for (int waited = 0; waited < POLL_TIMEOUT_MS; waited++) {
    if (locks_of(b) == want) return true;
    test_sleep_ms(1);
  }
  return locks_of(b) == want;
}

/* A single acquire frees the buffer's host copy behind its copy back, in a completion that
 * the acquires after it on the stream join: until the stream has run their copies, spills
 * made meanwhile must not be given that memory (they would overwrite what the copies read). */
static void host_copies_of_acquires_behind_a_blocked_stream_are_not_reused(void) {
  enum { N = 16, SIZE = 4096 };
  spw_buf_t a[N], other[N];
  void *d[N];
  for (int i = 0; i < N; i++) a[i] = test_filled(rt, s2, SIZE, 100 + (uint64_t)i);
  ASSERT_OK(spw_spill_n(rt, a, N, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  /* The first copy runs at once; the others join its completion behind the gate. */
  ASSERT_OK(spw_acquire(rt, a[0], s, 0, &d[0]));
  ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &g));
  for (int i = 1; i < N; i++) ASSERT_OK(spw_acquire(rt, a[i], s, 0, &d[i]));
  gate_await_entered(&g);
  test_sleep_ms(20); /* poller rounds: a free made too early has run by now */
  for (int i = 0; i < N; i++) other[i] = test_filled(rt, s2, SIZE, 200 + (uint64_t)i);
  ASSERT_OK(spw_spill_n(rt, other, N, SPW_TIER_HOST));
  /* Not spw_wait_idle: it waits for the completions behind the gate too. */
  for (int i = 0; i < N; i++) {
    uint64_t t0 = test_now_ms();
    while (state_of(rt, other[i]) != SPW_STATE_HOST && test_now_ms() - t0 < POLL_TIMEOUT_MS)
      test_sleep_ms(1);
    ASSERT_EQ(state_of(rt, other[i]), SPW_STATE_HOST);
  }
  gate_open(&g);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  for (int i = 0; i < N; i++) {
    test_expect_fill(rt, a[i], s, SIZE, 100 + (uint64_t)i);
    test_expect_fill(rt, other[i], s, SIZE, 200 + (uint64_t)i);
    ASSERT_OK(spw_free(rt, a[i]));
    ASSERT_OK(spw_free(rt, other[i]));
  }
}

static void release_async_does_not_block_and_releases_when_work_completes(void) {
  spw_buf_t b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &g));
  ASSERT_OK(spw_stream_release_async(rt, s));
  /* Returning before the gate opened by itself proves it did not wait for the stream. */
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_await_entered(&g);
  ASSERT_EQ(locks_of(b), 1);
  test_sleep_ms(100);
  ASSERT_EQ(locks_of(b), 1);
  ASSERT_UEQ(stats_of(rt).locked_bytes, 4096);
  gate_open(&g);
  ASSERT_TRUE(await_locks(b, 0));
  ASSERT_TRUE(!gate_timed_out(&g));
  ASSERT_UEQ(stats_of(rt).locked_bytes, 0);
  ASSERT_STATUS(spw_release(rt, b, s), SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_stream_synchronize(rt, s));
}

typedef struct sync_call {
  int status;
  atomic_bool done;
} sync_call_t;

static void *sync_thread(void *arg) {
  sync_call_t *c = arg;
  c->status = spw_stream_synchronize(rt, s);
  atomic_store(&c->done, true);
  return NULL;
}

static void synchronize_waits_for_a_blocked_stream_then_releases(void) {
  spw_buf_t b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &g));
  gate_await_entered(&g);
  sync_call_t c = {1, false};
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, sync_thread, &c), 0);
  test_sleep_ms(200);
  ASSERT_TRUE(!atomic_load(&c.done));
  ASSERT_EQ(locks_of(b), 1);
  gate_open(&g);
  for (int waited = 0; waited < POLL_TIMEOUT_MS && !atomic_load(&c.done); waited++) test_sleep_ms(1);
  ASSERT_TRUE(atomic_load(&c.done));
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_OK(c.status);
  ASSERT_TRUE(!gate_timed_out(&g));
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_UEQ(stats_of(rt).locked_bytes, 0);
}

static void lock_taken_after_release_async_is_kept(void) {
  spw_buf_t a, b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 4096, s, &a));
  ASSERT_OK(spw_alloc(rt, 8192, s, &b));
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &g));
  ASSERT_OK(spw_stream_release_async(rt, s));
  /* Both a second lock on the buffer already scheduled for release and a first lock on
   * another buffer, on the same stream, after the call. */
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_EQ(locks_of(a), 2);
  ASSERT_EQ(locks_of(b), 1);
  gate_open(&g);
  ASSERT_TRUE(await_locks(a, 1));
  test_sleep_ms(100); /* a late second pass of the release would show now */
  ASSERT_EQ(locks_of(a), 1);
  ASSERT_EQ(locks_of(b), 1);
  ASSERT_UEQ(stats_of(rt).locked_bytes, 4096 + 8192);
  ASSERT_OK(spw_release(rt, a, s));
  ASSERT_OK(spw_release(rt, b, s));
  ASSERT_STATUS(spw_release(rt, a, s), SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_TRUE(!gate_timed_out(&g));
}

/* Locks handed to release_async are still the stream's until released: a synchronize that
 * begins before they are released must release them before it returns. */
static void synchronize_after_release_async_leaves_no_lock(void) {
  spw_buf_t b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  for (int round = 0; round < 20; round++) {
    gate_t rg; /* a gate per round */
    gate_init(&rg);
    ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
    ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &rg));
    ASSERT_OK(spw_stream_release_async(rt, s));
    gate_open(&rg);
    ASSERT_OK(spw_stream_synchronize(rt, s));
    ASSERT_EQ(locks_of(b), 0);
    ASSERT_UEQ(stats_of(rt).locked_bytes, 0);
    ASSERT_TRUE(!gate_timed_out(&rg));
    gate_fini(&rg);
  }
}

typedef struct writer {
  void *dptr;
  size_t bytes;
  uint64_t seed;
} writer_t;

/* Host backend only: device memory is host memory, written by the stream's own thread. */
static void write_pattern(void *arg) {
  writer_t *w = arg;
  test_fill(w->dptr, w->bytes, w->seed);
}

static void free_of_a_locked_buffer_keeps_memory_until_release(void) {
  enum { BYTES = 1 << 20 };
  spw_backend_kind_t kind;
  spw_buf_t b;
  void *d = NULL;
  uint8_t *in = malloc(BYTES), *out = malloc(BYTES);
  ASSERT_TRUE(in != NULL && out != NULL);
  test_fill(in, BYTES, 1);
  memset(out, 0, BYTES);
  ASSERT_OK(spw_runtime_backend(rt, &kind));
  const spw_stats_t before = stats_of(rt);
  ASSERT_OK(spw_alloc(rt, BYTES, s, &b));
  ASSERT_UEQ(stats_of(rt).device_bytes, before.device_bytes + BYTES);
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  /* Work queued behind the gate touches the buffer after spw_free has returned: a copy in,
   * on the host backend a host func writing it directly, and a copy out to check. */
  writer_t w = {d, BYTES, 2};
  ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &g));
  /* On CUDA a copy from pageable host memory blocks the calling thread until the stream
   * reaches it, and the stream is held by the gate: the copies run on the host backend only,
   * the deferred free is checked on both. */
  if (kind == SPW_BACKEND_HOST) {
    ASSERT_OK(spw_memcpy_async(rt, d, in, BYTES, s));
    ASSERT_OK(spw_launch_host_func(rt, s, write_pattern, &w));
    ASSERT_OK(spw_memcpy_async(rt, out, d, BYTES, s));
  }
  ASSERT_OK(spw_free(rt, b));
  /* The handle is dead at once... */
  size_t size;
  uint32_t locks;
  ASSERT_STATUS(spw_buf_size(rt, b, &size), SPW_ERR_FREED);
  ASSERT_STATUS(spw_buf_lock_count(rt, b, &locks), SPW_ERR_FREED);
  ASSERT_STATUS(spw_acquire(rt, b, s, 0, &d), SPW_ERR_FREED);
  ASSERT_STATUS(spw_free(rt, b), SPW_ERR_FREED);
  /* ...but its memory is not. */
  ASSERT_UEQ(stats_of(rt).device_bytes, before.device_bytes + BYTES);
  test_sleep_ms(50);
  ASSERT_UEQ(stats_of(rt).device_bytes, before.device_bytes + BYTES);
  gate_open(&g);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_TRUE(!gate_timed_out(&g));
  if (kind == SPW_BACKEND_HOST) ASSERT_EQ(test_first_mismatch(out, BYTES, 2), (size_t)-1);
  const spw_stats_t after = stats_of(rt);
  ASSERT_UEQ(after.device_bytes, before.device_bytes);
  ASSERT_UEQ(after.locked_bytes, 0);
  ASSERT_UEQ(after.buffers, before.buffers);
  free(in);
  free(out);
}

static void destroy_with_a_locked_buffer_is_busy(void) {
  spw_buf_t a, b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 4096, s, &a));
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  ASSERT_STATUS(spw_runtime_destroy(rt), SPW_ERR_BUSY);
  /* Nothing was destroyed: the buffer, its lock, the stream and allocation all still work. */
  size_t size = 0;
  ASSERT_OK(spw_buf_size(rt, a, &size));
  ASSERT_EQ(size, 4096);
  ASSERT_EQ(locks_of(a), 1);
  ASSERT_OK(spw_alloc(rt, 1024, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_release(rt, b, s));
  ASSERT_UEQ(stats_of(rt).buffers, 2);
  ASSERT_STATUS(spw_runtime_destroy(rt), SPW_ERR_BUSY);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(a), 0);
  /* Unlocked buffers (and the created stream) are the runtime's to clean up. */
}

/* A runtime with a 4 MiB budget, filled with buffers locked on s behind the closed gate,
 * whose locks are then handed to release_async. */
static void budget_locked_behind(spw_buf_t b[4]) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 4 << 20;
  reopen_fixture(&cfg);
  void *d;
  for (int i = 0; i < 4; i++) {
    ASSERT_OK(spw_alloc(rt, 1 << 20, s, &b[i]));
    ASSERT_OK(spw_acquire(rt, b[i], s, 0, &d));
  }
  ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &g));
  ASSERT_OK(spw_stream_release_async(rt, s));
}

/* Everything on the device is locked, but by work already handed to release_async: an
 * allocation waits for those locks to go (then spills one of them) instead of failing. */
static void alloc_waits_for_locks_that_release_async_will_release(void) {
  spw_buf_t b[4], extra;
  budget_locked_behind(b);
  pthread_t t;
  gate_open_later(&g, 200, &t);
  ASSERT_OK(spw_alloc(rt, 1 << 20, NULL, &extra));
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_TRUE(!gate_timed_out(&g));
  ASSERT_GE(stats_of(rt).spills, 1);
  ASSERT_OK(spw_stream_synchronize(rt, s));
}

/* The wait is bounded: work that does not complete (here, a gate that stays shut) ends in
 * SPW_ERR_OUT_OF_MEMORY after about two seconds, not in a hang. */
static void alloc_wait_for_pending_releases_is_bounded(void) {
  spw_buf_t b[4], extra;
  budget_locked_behind(b);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ASSERT_STATUS(spw_alloc(rt, 1 << 20, NULL, &extra), SPW_ERR_OUT_OF_MEMORY);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  ASSERT_TRUE(waited >= 1.5 && waited < GATE_TIMEOUT_S);
  gate_open(&g);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_TRUE(!gate_timed_out(&g));
}

/* spw_release_n_async releases only the listed locks, once the stream passes this point;
 * other locks on the same stream stay, and a later release_async does not see them. */
static void release_n_async_releases_only_its_buffers_when_work_completes(void) {
  spw_buf_t b[3];
  void *d[3];
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_alloc(rt, 4096, s, &b[i]));
  ASSERT_OK(spw_acquire(rt, b[0], s, 0, &d[0]));
  ASSERT_OK(spw_acquire(rt, b[1], s, 0, &d[1]));
  ASSERT_OK(spw_acquire(rt, b[1], s, 0, &d[1]));
  ASSERT_OK(spw_acquire(rt, b[2], s, 0, &d[2]));
  ASSERT_OK(spw_launch_host_func(rt, s, gate_wait, &g));
  spw_buf_t mine[3] = {b[0], b[1], b[1]};
  ASSERT_OK(spw_release_n_async(rt, mine, 3, s));
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_await_entered(&g);
  test_sleep_ms(50);
  ASSERT_EQ(locks_of(b[0]), 1);
  ASSERT_EQ(locks_of(b[1]), 2);
  /* The listed locks left the map: releasing them again by hand is refused. */
  ASSERT_STATUS(spw_release(rt, b[0], s), SPW_ERR_NOT_LOCKED);
  gate_open(&g);
  ASSERT_TRUE(await_locks(b[0], 0));
  ASSERT_TRUE(await_locks(b[1], 0));
  ASSERT_EQ(locks_of(b[2]), 1);
  ASSERT_OK(spw_release(rt, b[2], s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
}

/* All or nothing: one buffer listed more often than it is locked changes nothing. */
static void release_n_async_with_a_missing_lock_changes_nothing(void) {
  spw_stream_t other;
  spw_buf_t a, b;
  void *d;
  ASSERT_OK(spw_stream_create(rt, &other));
  ASSERT_OK(spw_alloc(rt, 4096, s, &a));
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  ASSERT_OK(spw_acquire(rt, b, other, 0, &d));
  spw_buf_t twice[2] = {a, a};
  ASSERT_STATUS(spw_release_n_async(rt, twice, 2, s), SPW_ERR_NOT_LOCKED);
  spw_buf_t wrong_stream[2] = {a, b};
  ASSERT_STATUS(spw_release_n_async(rt, wrong_stream, 2, s), SPW_ERR_NOT_LOCKED);
  ASSERT_STATUS(spw_release_n_async(rt, NULL, 1, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_release_n_async(rt, &a, 0, s), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(locks_of(a), 1);
  /* Still in s's map: synchronize releases it. */
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(a), 0);
  ASSERT_OK(spw_stream_synchronize(rt, other));
}

/* A synchronize of the stream releases pending per-launch releases at once. */
static void synchronize_runs_pending_release_n_async(void) {
  spw_buf_t b;
  void *d;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_release_n_async(rt, &b, 1, s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(b), 0);
}

static const spw_test_t tests[] = {
    TEST(release_async_does_not_block_and_releases_when_work_completes),
    TEST(synchronize_waits_for_a_blocked_stream_then_releases),
    TEST(lock_taken_after_release_async_is_kept),
    TEST(synchronize_after_release_async_leaves_no_lock),
    TEST(free_of_a_locked_buffer_keeps_memory_until_release),
    TEST(destroy_with_a_locked_buffer_is_busy),
    TEST(alloc_waits_for_locks_that_release_async_will_release),
    TEST(alloc_wait_for_pending_releases_is_bounded),
    TEST(release_n_async_releases_only_its_buffers_when_work_completes),
    TEST(release_n_async_with_a_missing_lock_changes_nothing),
    TEST(synchronize_runs_pending_release_n_async),
    TEST(host_copies_of_acquires_behind_a_blocked_stream_are_not_reused),
};
TEST_MAIN_FIXTURE(tests, open_gate_fixture, close_gate_fixture)
