/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of failed moves: a copy that fails during a spill or an unspill, a host
 * registration the backend refuses, a full host arena with no disk tier behind it, and a
 * device allocation the backend refuses. Every failure must leave each buffer readable in
 * its last good tier, reach the caller (a status, spw_wait_idle / spw_async_error), count in
 * stats.failures, and leak nothing (the arena's in_use back to 0; LeakSanitizer in CI).
 *
 * Failures are injected through the runtime's fault shim (spw__inject_fault, src/core/runtime.h),
 * which makes the next backend operations of one kind fail exactly as a real failure would,
 * on both backends. Device memory is touched only through spw_memcpy_async +
 * spw_stream_synchronize; no copy is enqueued between an injection and the operation meant
 * to consume it. */
#include <limits.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define MIB ((size_t)1 << 20)

static uint64_t arena_in_use(spw_runtime_t *rt) {
  spw_arena_stats_t as;
  spw__arena_get_stats(rt->arena, &as);
  return as.in_use;
}

static void copy_failure_during_spill_keeps_buffer_resident(void) {
  const size_t n = 1 * MIB + 3;
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = test_filled(rt, s, n, 1);
  const spw_stats_t before = stats_of(rt);

  spw__inject_fault(rt, SPW_FAULT_COPY, 1);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST)); /* the request is fine; the work fails */
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_CUDA);
  ASSERT_OK(spw_async_error(rt)); /* reported once, then cleared */
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.failures, before.failures + 1);
  ASSERT_UEQ(st.spills, before.spills);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.device_bytes, n);
  ASSERT_UEQ(arena_in_use(rt), 0); /* the extent taken for the copy went back */
  test_expect_fill(rt, b, s, n, 1);

  /* The runtime is not left broken: the next spill works, and a free from the host tier
   * gives every byte back. */
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  ASSERT_UEQ(stats_of(rt).host_bytes, n);
  ASSERT_OK(spw_free(rt, b));
  st = stats_of(rt);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.buffers, 0);
  ASSERT_UEQ(arena_in_use(rt), 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* A spill batch copies in parts of at most 64 MiB (src/core/spill_move.c), each committed on
 * its own: a copy that fails in the second part leaves the first part spilled and only the
 * second part's buffers resident, every byte still readable. */
static void a_copy_failure_in_a_later_part_keeps_only_that_part_resident(void) {
  enum { N = 4 };
  const size_t n = 24 * MIB; /* two per part: a third would pass 64 MiB */
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[N];
  for (int i = 0; i < N; i++) b[i] = test_filled(rt, s, n, 40 + (uint64_t)i);
  spw__faults_arm(rt->be, SPW_FAULT_COPY, 1, 1); /* the second copy fails */
  ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_CUDA);
  ASSERT_OK(spw_async_error(rt));
  for (int i = 0; i < N; i++)
    ASSERT_EQ(state_of(rt, b[i]), i < 2 ? SPW_STATE_HOST : SPW_STATE_RESIDENT);
  ASSERT_UEQ(stats_of(rt).host_bytes, 2 * n);
  for (int i = 0; i < N; i++) test_expect_fill(rt, b[i], s, n, 40 + (uint64_t)i);
  for (int i = 0; i < N; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_UEQ(arena_in_use(rt), 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void async_error_reports_failed_spill(void) {
  /* Without spw_wait_idle: the error surfaces through spw_async_error on its own. */
  const size_t n = 64 * 1024;
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = test_filled(rt, s, n, 2);
  ASSERT_OK(spw_async_error(rt));
  spw__inject_fault(rt, SPW_FAULT_COPY, 1);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  int err = SPW_OK;
  for (int i = 0; i < 10000 && err == SPW_OK; i++) {
    err = spw_async_error(rt);
    if (err == SPW_OK) usleep(1000);
  }
  ASSERT_STATUS(err, SPW_ERR_CUDA);
  ASSERT_OK(spw_async_error(rt));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  test_expect_fill(rt, b, s, n, 2);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void copy_failure_during_unspill_fails_acquire(void) {
  const size_t n = 2 * MIB - 1;
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = test_filled(rt, s, n, 3);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  const spw_stats_t before = stats_of(rt);

  spw__inject_fault(rt, SPW_FAULT_COPY, 1);
  void *d = (void *)&d;
  ASSERT_STATUS(spw_acquire(rt, b, s, 0, &d), SPW_ERR_CUDA);
  ASSERT_PTR_EQ(d, (void *)&d); /* outputs are written only on success */
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  uint32_t locks = 99;
  ASSERT_OK(spw_buf_lock_count(rt, b, &locks));
  ASSERT_EQ(locks, 0);
  ASSERT_STATUS(spw_release(rt, b, s), SPW_ERR_NOT_LOCKED);
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.failures, before.failures + 1);
  ASSERT_UEQ(st.unspills, before.unspills);
  ASSERT_UEQ(st.device_bytes, before.device_bytes); /* the reservation was given back */
  ASSERT_UEQ(st.host_bytes, n);

  /* Later, without the fault, it comes back whole. */
  test_expect_fill(rt, b, s, n, 3);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_UEQ(stats_of(rt).host_bytes, 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void host_register_failure_with_empty_arena_fails_spill(void) {
  const size_t n = 512 * 1024 + 1;
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = test_filled(rt, s, n, 4);
  ASSERT_UEQ(stats_of(rt).host_pinned_bytes, 0); /* no slab yet: the spill must pin one */
  const uint64_t failures = stats_of(rt).failures;

  spw__inject_fault(rt, SPW_FAULT_HOST_REGISTER, 1);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_CUDA);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.failures, failures + 1);
  ASSERT_UEQ(st.host_pinned_bytes, 0); /* the slab that could not be pinned is gone */
  ASSERT_UEQ(st.host_bytes, 0);
  test_expect_fill(rt, b, s, n, 4);

  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  test_expect_fill(rt, b, s, n, 4);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void full_host_arena_without_disk_fails_allocation_cleanly(void) {
  /* Device 4 MiB, host 2 MiB, disk unusable: six 1 MiB buffers fit, the seventh cannot, and
   * the allocation says why: the host tier is full (not that the device is locked). No
   * background spilling (high watermark 1), so every spill is the allocations' own. */
  const size_t n = 1 * MIB;
  char dir[PATH_MAX];
  test_tmpdir(dir, sizeof dir, "nodisk");
  char gone[sizeof dir + 8];
  snprintf(gone, sizeof gone, "%s/gone", dir);
  test_tmpdir_remove(dir);
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 4 * n;
  cfg.host_limit = 2 * n;
  cfg.host_device_bytes = 16 * n;
  cfg.spill_dir = gone;
  cfg.high_watermark = 1.0;
  cfg.low_watermark = 0.9;
  spw_runtime_t *rt = test_runtime(&cfg);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));

  spw_buf_t b[8];
  int nb = 0;
  for (; nb < 8; nb++) {
    uint8_t *src = malloc(n);
    ASSERT_TRUE(src != NULL);
    test_fill(src, n, 100 + (uint64_t)nb);
    const int st = spw_alloc(rt, n, s, &b[nb]);
    if (st != SPW_OK) {
      ASSERT_STATUS(st, SPW_ERR_HOST_OUT_OF_MEMORY);
      ASSERT_TRUE(strstr(spw_last_error(rt), "spilling to make room failed") != NULL);
      free(src);
      break;
    }
    test_write(rt, b[nb], s, src, n);
    free(src);
  }
  ASSERT_EQ(nb, 6);
  /* The failed spills are reported as moves that failed, as every failed move is. */
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_HOST_OUT_OF_MEMORY);
  int resident = 0, host = 0;
  for (int i = 0; i < nb; i++) {
    spw_state_t stt = state_of(rt, b[i]);
    resident += stt == SPW_STATE_RESIDENT;
    host += stt == SPW_STATE_HOST;
  }
  ASSERT_EQ(resident, 4);
  ASSERT_EQ(host, 2);
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.buffers, 6);
  ASSERT_UEQ(st.device_bytes, 4 * n);
  ASSERT_UEQ(st.host_bytes, 2 * n);
  ASSERT_UEQ(st.disk_bytes, 0);
  ASSERT_UEQ(st.locked_bytes, 0);
  ASSERT_GT(st.failures, 0);

  /* Every buffer is intact: the resident ones first (no move needed), then, with room made
   * on the device by freeing two of them, the ones on the host. */
  int freed = 0;
  for (int i = 0; i < nb; i++)
    if (state_of(rt, b[i]) == SPW_STATE_RESIDENT) test_expect_fill(rt, b[i], s, n, 100 + (uint64_t)i);
  for (int i = 0; i < nb && freed < 2; i++)
    if (state_of(rt, b[i]) == SPW_STATE_RESIDENT) {
      ASSERT_OK(spw_free(rt, b[i]));
      b[i] = SPW_BUF_NULL;
      freed++;
    }
  for (int i = 0; i < nb; i++)
    if (b[i] != SPW_BUF_NULL) test_expect_fill(rt, b[i], s, n, 100 + (uint64_t)i);
  for (int i = 0; i < nb; i++)
    if (b[i] != SPW_BUF_NULL) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_UEQ(stats_of(rt).host_bytes, 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void alloc_failure_allocates_nothing(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t keep = test_filled(rt, s, 4096, 5);
  const spw_stats_t before = stats_of(rt);
  /* Refuse every attempt: the allocation's retries (after letting frees land and after
   * spilling) must all fail too. */
  spw__inject_fault(rt, SPW_FAULT_ALLOC, 1000);
  spw_buf_t out = (spw_buf_t)0x1234;
  ASSERT_STATUS(spw_alloc(rt, 1 * MIB, s, &out), SPW_ERR_OUT_OF_MEMORY);
  spw__inject_fault(rt, SPW_FAULT_ALLOC, 0);
  ASSERT_UEQ(out, 0x1234);
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.buffers, before.buffers);
  ASSERT_LE(st.device_bytes, before.device_bytes); /* a retry may have spilled `keep` */
  ASSERT_TRUE(strlen(spw_last_error(rt)) > 0);
  test_expect_fill(rt, keep, s, 4096, 5);

  ASSERT_OK(spw_alloc(rt, 1 * MIB, s, &out));
  ASSERT_UEQ(stats_of(rt).buffers, before.buffers + 1);
  ASSERT_OK(spw_free(rt, out));
  ASSERT_OK(spw_free(rt, keep));
  st = stats_of(rt);
  ASSERT_UEQ(st.buffers, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void alloc_refused_once_is_retried(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw__inject_fault(rt, SPW_FAULT_ALLOC, 1);
  spw_buf_t b = test_filled(rt, s, 1 * MIB, 6);
  ASSERT_UEQ(stats_of(rt).buffers, 1);
  test_expect_fill(rt, b, s, 1 * MIB, 6);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* Issue 7: a failed spill batch reached spw_wait_idle as SPW_ERR_INVALID_ARG, the code for
 * a caller's bad input. Background work takes no input from the caller: such a status from
 * below is recorded as SPW_ERR_INTERNAL; every other status keeps its meaning. */
static void background_failures_never_look_like_the_callers_mistake(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  const int mistakes[] = {SPW_ERR_INVALID_ARG, SPW_ERR_INVALID_HANDLE, SPW_ERR_FREED,
                          SPW_ERR_NOT_LOCKED, SPW_ERR_INVALID_STREAM};
  for (size_t i = 0; i < sizeof mistakes / sizeof mistakes[0]; i++) {
    spw__set_async_error(rt, mistakes[i]);
    ASSERT_STATUS(spw_async_error(rt), SPW_ERR_INTERNAL);
  }
  spw__set_async_error(rt, SPW_ERR_CUDA);
  spw__set_async_error(rt, SPW_ERR_IO); /* the first one is kept */
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_CUDA);
  ASSERT_OK(spw_async_error(rt));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(copy_failure_during_spill_keeps_buffer_resident),
    TEST(a_copy_failure_in_a_later_part_keeps_only_that_part_resident),
    TEST(async_error_reports_failed_spill),
    TEST(copy_failure_during_unspill_fails_acquire),
    TEST(host_register_failure_with_empty_arena_fails_spill),
    TEST(full_host_arena_without_disk_fails_allocation_cleanly),
    TEST(alloc_failure_allocates_nothing),
    TEST(alloc_refused_once_is_retried),
    TEST(background_failures_never_look_like_the_callers_mistake),
};
TEST_MAIN(tests)
