/* SPDX-License-Identifier: Apache-2.0 */
/* spw_host_reserve: host memory pinned before the first spill, and kept as buffers come and
 * go, so that a program that knows how much it will spill does not pin it slab by slab in
 * the middle of its work (docs/api.md, `spw_host_reserve`). */
#include <string.h>

#include "test_main.h"
#include "test_util.h"

#define MIB ((uint64_t)1 << 20)

static spw_runtime_t *runtime_with_host_limit(uint64_t host_limit) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 64 * MIB;
  cfg.host_limit = host_limit;
  return test_runtime(&cfg);
}

static void a_reservation_is_pinned_before_the_first_spill(void) {
  spw_runtime_t *rt = runtime_with_host_limit(1024 * MIB);
  ASSERT_UEQ(stats_of(rt).host_pinned_bytes, 0);
  ASSERT_OK(spw_host_reserve(rt, 256 * MIB));
  const spw_stats_t st = stats_of(rt);
  ASSERT_GE(st.host_pinned_bytes, 256 * MIB);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.spills, 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* Buffers spilled into the reserved memory and brought back leave it pinned: without the
 * reservation the arena keeps two empty slabs and gives back the rest (four of the host
 * backend's 64 MiB slabs here; one 1 GiB slab on a GPU, where this holds trivially). */
static void reserved_memory_stays_pinned_after_the_buffers_come_back(void) {
  spw_runtime_t *rt = runtime_with_host_limit(1024 * MIB);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_host_reserve(rt, 256 * MIB));
  const uint64_t pinned = stats_of(rt).host_pinned_bytes;
  enum { N = 8 };
  spw_buf_t b[N];
  for (int i = 0; i < N; i++) {
    b[i] = test_filled(rt, s, 4 * MIB, 7 + (uint64_t)i);
    ASSERT_OK(spw_spill(rt, b[i], SPW_TIER_HOST));
  }
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_UEQ(stats_of(rt).host_bytes, N * 4 * MIB);
  for (int i = 0; i < N; i++) {
    void *d;
    ASSERT_OK(spw_acquire(rt, b[i], s, 0, &d)); /* writable: the host copy goes */
  }
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  const spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.host_pinned_bytes, pinned);
  for (int i = 0; i < N; i++) test_expect_fill(rt, b[i], s, 4 * MIB, 7 + (uint64_t)i);
  for (int i = 0; i < N; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void a_reservation_above_the_host_limit_is_refused_and_pins_nothing(void) {
  spw_runtime_t *rt = runtime_with_host_limit(128 * MIB);
  ASSERT_STATUS(spw_host_reserve(rt, 128 * MIB + 1), SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_TRUE(strstr(spw_last_error(rt), "host limit") != NULL);
  ASSERT_UEQ(stats_of(rt).host_pinned_bytes, 0);
  ASSERT_STATUS(spw_host_reserve(rt, UINT64_MAX), SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_UEQ(stats_of(rt).host_pinned_bytes, 0);
  ASSERT_OK(spw_host_reserve(rt, 0)); /* nothing to pin */
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(a_reservation_is_pinned_before_the_first_spill),
    TEST(reserved_memory_stays_pinned_after_the_buffers_come_back),
    TEST(a_reservation_above_the_host_limit_is_refused_and_pins_nothing),
};

TEST_MAIN(tests)
