/* SPDX-License-Identifier: Apache-2.0 */
/* A CUDA graph over address-stable buffers (issue 21, item 3): a graph captured once over
 * two stable buffers' device pointers is replayed many times while the buffers are spilled
 * to host or disk and brought back between replays, and the data is checked at the end. A
 * graph keeps the addresses it captured, so this is valid only because the buffers come
 * back at the same addresses; with ordinary buffers a replay would write freed memory. Two
 * tests: the replays launched through spw_graph_launch (the rule in docs/api.md, "CUDA
 * graphs": it takes the locks, launches, and releases them once the graph completes, in
 * each of its three release modes), and by hand, under locks taken by spw_acquire_n and
 * dropped by spw_stream_synchronize (what the call does, spelled out).
 *
 * GPU only (label gpu): it skips without a device. It links the static library, so that the
 * test's CUDA runtime and Spillway's are one, and the stream Spillway made can be captured. */
#include <stdint.h>
#include <stdlib.h>

#include "test_main.h"
#include "test_stable_graph_kernels.h"
#include "test_util.h"
#include "tmpdir.h"

static spw_runtime_t *rt;
static spw_stream_t s;
static char dir[512];

static void before(void) {
  test_tmpdir(dir, sizeof dir, "graph");
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = SPW_BACKEND_CUDA;
  cfg.device_limit = (uint64_t)256 << 20;
  cfg.host_limit = (uint64_t)256 << 20;
  cfg.spill_dir = dir;
  cfg.stable_addresses = SPW_STABLE_ON;
  int st = spw_runtime_create(&cfg, &rt);
  TEST_SKIP_IF(st == SPW_ERR_NO_DEVICE, "no CUDA device on this machine");
  ASSERT_OK(st);
  size_t g = 0;
  st = spw_stable_granularity(rt, &g);
  TEST_SKIP_IF(st == SPW_ERR_UNSUPPORTED, "no virtual memory management on this device");
  ASSERT_OK(st);
  ASSERT_OK(spw_stream_create(rt, &s));
}

static void after(void) {
  if (rt) ASSERT_OK(spw_runtime_destroy(rt));
  rt = NULL;
  if (dir[0]) test_tmpdir_remove(dir);
  dir[0] = '\0';
}

/* Replays, each by `launch_mode`: 0 by hand (spw_acquire_n, cudaGraphLaunch,
 * spw_stream_synchronize), 1 through spw_graph_launch. */
static void replays(int launch_mode) {
  /* 3 MiB + a bit: more than a granule, not a whole number of them; and a small one. */
  const uint64_t counts[2] = {((uint64_t)3 << 20) / 4 + 77, 1000};
  for (int k = 0; k < 2; k++) {
    const uint64_t n = counts[k];
    const size_t bytes = (size_t)n * 4;
    uint32_t *src = malloc(bytes), *got = malloc(bytes);
    ASSERT_TRUE(src && got);
    for (uint64_t i = 0; i < n; i++) src[i] = (uint32_t)(i * 2654435761u) & 0xFFFF;
    memset(got, 0, bytes);
    spw_buf_t b[2]; /* b[0] = dst, starts at 0; b[1] = src */
    void *p[2], *q[2];
    for (int i = 0; i < 2; i++) ASSERT_OK(spw_alloc(rt, bytes, s, &b[i]));
    ASSERT_OK(spw_acquire_n(rt, b, 2, s, 0, p));
    ASSERT_OK(spw_memcpy_async(rt, p[0], got, bytes, s));
    ASSERT_OK(spw_memcpy_async(rt, p[1], src, bytes, s));
    void *exec = NULL;
    int e = test_graph_capture_add(s, p[0], p[1], n, &exec);
    if (e) fprintf(stderr, "capture: %s\n", test_graph_error(e));
    ASSERT_EQ(e, 0);
    ASSERT_OK(spw_stream_synchronize(rt, s));

    const int replays = 12;
    for (int r = 0; r < replays; r++) {
      /* Every replay after the first finds both buffers moved away and back. */
      if (r > 0) {
        ASSERT_OK(spw_spill_n(rt, b, 2, r % 3 == 2 ? SPW_TIER_DISK : SPW_TIER_HOST));
        ASSERT_OK(spw_wait_idle(rt));
        ASSERT_TRUE(state_of(rt, b[0]) != SPW_STATE_RESIDENT);
      }
      if (launch_mode == 1) {
        spw_buf_arg_t a[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, SPW_ACQUIRE_READ)};
        unsigned flags = r % 3 == 0 ? 0 : r % 3 == 1 ? SPW_LAUNCH_BLOCK : SPW_LAUNCH_KEEP_LOCKS;
        ASSERT_OK(spw_graph_launch(rt, exec, a, 2, s, flags));
        if (flags == SPW_LAUNCH_KEEP_LOCKS) ASSERT_OK(spw_stream_synchronize(rt, s));
        /* The release of flags 0 happens once the graph has completed: wait for it, so
         * that the spill of the next replay finds the buffers unlocked. */
        ASSERT_OK(spw_wait_idle(rt));
        uint32_t locks = 1;
        ASSERT_OK(spw_buf_lock_count(rt, b[0], &locks));
        ASSERT_EQ(locks, 0);
        ASSERT_OK(spw_buf_lock_count(rt, b[1], &locks));
        ASSERT_EQ(locks, 0);
        continue;
      }
      ASSERT_OK(spw_acquire_n(rt, b, 2, s, 0, q));
      ASSERT_PTR_EQ(q[0], p[0]);
      ASSERT_PTR_EQ(q[1], p[1]);
      e = test_graph_launch(exec, s);
      if (e) fprintf(stderr, "launch: %s\n", test_graph_error(e));
      ASSERT_EQ(e, 0);
      ASSERT_OK(spw_stream_synchronize(rt, s));
    }
    test_graph_destroy(exec);
    void *d = NULL;
    ASSERT_OK(spw_acquire(rt, b[0], s, SPW_ACQUIRE_READ, &d));
    ASSERT_OK(spw_memcpy_async(rt, got, d, bytes, s));
    ASSERT_OK(spw_stream_synchronize(rt, s));
    for (uint64_t i = 0; i < n; i++)
      if (got[i] != src[i] * (uint32_t)replays) {
        fprintf(stderr, "element %llu: %u, expected %u\n", (unsigned long long)i, got[i],
                src[i] * (uint32_t)replays);
        ASSERT_TRUE(!"a replay lost or doubled its update");
      }
    for (int i = 0; i < 2; i++) ASSERT_OK(spw_free(rt, b[i]));
    free(src);
    free(got);
  }
}

static void graph_replays_over_buffers_spilled_between_replays(void) { replays(0); }

static void graph_launch_replays_over_buffers_spilled_between_replays(void) { replays(1); }

/* A graph over an ordinary buffer is refused before anything is locked or launched. */
static void graph_launch_refuses_a_movable_buffer(void) {
  spw_buf_t b[2];
  void *p[2];
  ASSERT_OK(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_STABLE, &b[0]));
  ASSERT_OK(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_MOVABLE, &b[1]));
  ASSERT_OK(spw_acquire_n(rt, b, 2, s, 0, p));
  void *exec = NULL;
  int e = test_graph_capture_add(s, p[0], p[1], 1024, &exec);
  ASSERT_EQ(e, 0);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  spw_buf_arg_t a[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, SPW_ACQUIRE_READ)};
  ASSERT_STATUS(spw_graph_launch(rt, exec, a, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "graph argument 1") != NULL);
  uint32_t locks = 1;
  ASSERT_OK(spw_buf_lock_count(rt, b[0], &locks));
  ASSERT_EQ(locks, 0);
  test_graph_destroy(exec);
  for (int i = 0; i < 2; i++) ASSERT_OK(spw_free(rt, b[i]));
}

static const spw_test_t tests[] = {
    {"graph_replays_over_buffers_spilled_between_replays",
     graph_replays_over_buffers_spilled_between_replays},
    {"graph_launch_replays_over_buffers_spilled_between_replays",
     graph_launch_replays_over_buffers_spilled_between_replays},
    {"graph_launch_refuses_a_movable_buffer", graph_launch_refuses_a_movable_buffer},
};

TEST_MAIN_FIXTURE(tests, before, after)
