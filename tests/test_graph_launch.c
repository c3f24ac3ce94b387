/* SPDX-License-Identifier: Apache-2.0 */
/* spw_graph_launch (issue 21, item 3): a graph over address-stable buffers launched with
 * their locks held, and every way it refuses. The launches themselves use the host
 * backend's stand-in for a graph (spw_host_graph_t: a function run on the stream's worker
 * over pointers taken once, as a captured graph keeps them), so those tests run on the host
 * backend only and skip on CUDA, where test_stable_graph replays a real graph. The refusals
 * that stop before the launch run on both backends. A seam test only for the fault shim: a
 * launch the device refuses, and a buffer whose copy back fails. */
#include <stdatomic.h>
#include <stdint.h>

#include "gate.h"
#include "runtime.h"
#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define N 4096u /* words per buffer */

static spw_runtime_t *rt;
static spw_stream_t s;
static spw_buf_t dst, src; /* address-stable: dst starts at 0, src holds src_word(i) */
static char dir[512];

static uint32_t src_word(uint32_t i) { return (i * 2654435761u) & 0xFFFF; }

static void before(void) {
  test_tmpdir(dir, sizeof dir, "graph");
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.spill_dir = dir;
  rt = test_runtime(&cfg);
  size_t g = 0;
  int st = spw_stable_granularity(rt, &g);
  TEST_SKIP_IF(st == SPW_ERR_UNSUPPORTED, "no virtual memory management on this device");
  ASSERT_OK(st);
  ASSERT_OK(spw_stream_create(rt, &s));
  static uint32_t h[N];
  ASSERT_OK(spw_alloc_ex(rt, sizeof h, s, SPW_ALLOC_STABLE, &dst));
  ASSERT_OK(spw_alloc_ex(rt, sizeof h, s, SPW_ALLOC_STABLE, &src));
  memset(h, 0, sizeof h);
  test_write(rt, dst, s, h, sizeof h);
  for (uint32_t i = 0; i < N; i++) h[i] = src_word(i);
  test_write(rt, src, s, h, sizeof h);
}

static void after(void) {
  if (rt) ASSERT_OK(spw_runtime_destroy(rt));
  rt = NULL;
  if (dir[0]) test_tmpdir_remove(dir);
  dir[0] = '\0';
}

static void host_only(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST,
               "launches the host backend's graph stand-in (CUDA: test_stable_graph)");
}

/* ---- the host graph: dst[i] += src[i] over pointers taken at "capture" ---- */

typedef struct add_graph {
  uint32_t *dst;
  const uint32_t *src;
  atomic_int runs;
  gate_t *gate; /* if set, each run waits for it first, standing for a long kernel */
} add_graph_t;

static void add_run(void *user) {
  add_graph_t *g = user;
  if (g->gate) gate_wait(g->gate);
  for (uint32_t i = 0; i < N; i++) g->dst[i] += g->src[i];
  atomic_fetch_add(&g->runs, 1);
}

/* "Captures" the graph: the buffers' addresses, taken once under a lock, as a stream
 * capture takes them from the kernels' arguments. */
static spw_host_graph_t capture(add_graph_t *g) {
  spw_buf_t b[2] = {dst, src};
  void *p[2];
  ASSERT_OK(spw_acquire_n(rt, b, 2, s, 0, p));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  g->dst = p[0];
  g->src = p[1];
  atomic_init(&g->runs, 0);
  g->gate = NULL;
  spw_host_graph_t hg = {add_run, g};
  return hg;
}

static void expect_dst(uint32_t times) {
  static uint32_t h[N];
  test_read(rt, dst, s, h, sizeof h);
  for (uint32_t i = 0; i < N; i++)
    if (h[i] != src_word(i) * times) {
      fprintf(stderr, "word %u: %u, expected %u\n", i, h[i], src_word(i) * times);
      ASSERT_TRUE(!"a launch was lost, doubled, or ran over memory that was not there");
    }
}

static void expect_unlocked(void) {
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(test_locks_of(rt, dst), 0);
  ASSERT_EQ(test_locks_of(rt, src), 0);
}

static int has(const char *needle) {
  if (strstr(spw_last_error(rt), needle)) return 1;
  fprintf(stderr, "spw_last_error: \"%s\" lacks \"%s\"\n", spw_last_error(rt), needle);
  return 0;
}

/* ---- launches ---- */

static void replays_over_buffers_spilled_between_launches(void) {
  host_only();
  add_graph_t g;
  spw_host_graph_t hg = capture(&g);
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, SPW_ACQUIRE_READ)};
  spw_buf_t both[2] = {dst, src};
  const uint32_t launches = 12;
  for (uint32_t r = 0; r < launches; r++) {
    if (r > 0) { /* every launch after the first finds both buffers moved away */
      ASSERT_OK(spw_spill_n(rt, both, 2, r % 3 == 2 ? SPW_TIER_DISK : SPW_TIER_HOST));
      ASSERT_OK(spw_wait_idle(rt));
      ASSERT_TRUE(state_of(rt, dst) != SPW_STATE_RESIDENT);
      ASSERT_TRUE(state_of(rt, src) != SPW_STATE_RESIDENT);
    }
    /* The three ways of releasing, in turn. */
    unsigned flags = r % 3 == 0 ? 0 : r % 3 == 1 ? SPW_LAUNCH_BLOCK : SPW_LAUNCH_KEEP_LOCKS;
    ASSERT_OK(spw_graph_launch(rt, &hg, a, 2, s, flags));
    if (flags == SPW_LAUNCH_BLOCK) ASSERT_EQ(atomic_load(&g.runs), (int)r + 1);
    if (flags == SPW_LAUNCH_KEEP_LOCKS) {
      ASSERT_EQ(test_locks_of(rt, dst), 1); /* in the stream's lock map until synchronize */
      ASSERT_OK(spw_stream_synchronize(rt, s));
    }
    expect_unlocked();
  }
  ASSERT_EQ(atomic_load(&g.runs), (int)launches);
  expect_dst(launches);
}

static void holds_its_locks_while_the_graph_runs_and_only_those(void) {
  host_only();
  add_graph_t g;
  spw_host_graph_t hg = capture(&g);
  gate_t gate;
  gate_init(&gate);
  g.gate = &gate;
  void *p = NULL;
  ASSERT_OK(spw_acquire(rt, src, s, SPW_ACQUIRE_READ, &p)); /* someone else's lock */
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, SPW_ACQUIRE_READ)};
  ASSERT_OK(spw_graph_launch(rt, &hg, a, 2, s, 0));
  gate_await_entered(&gate);
  ASSERT_EQ(test_locks_of(rt, dst), 1);
  ASSERT_EQ(test_locks_of(rt, src), 2);
  ASSERT_STATUS(spw_spill(rt, dst, SPW_TIER_HOST), SPW_ERR_LOCKED);
  gate_open(&gate);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(test_locks_of(rt, dst), 0);
  ASSERT_EQ(test_locks_of(rt, src), 1); /* the launch released its own lock, not this one */
  ASSERT_OK(spw_release(rt, src, s));
  ASSERT_TRUE(!gate_timed_out(&gate));
  gate_fini(&gate);
  expect_dst(1);
}

static void a_buffer_listed_twice_is_locked_twice(void) {
  host_only();
  add_graph_t g;
  spw_host_graph_t hg = capture(&g);
  gate_t gate;
  gate_init(&gate);
  g.gate = &gate;
  spw_buf_arg_t a[3] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, 0), spw_buf_arg(src, 0, 0)};
  ASSERT_OK(spw_graph_launch(rt, &hg, a, 3, s, 0));
  gate_await_entered(&gate);
  ASSERT_EQ(test_locks_of(rt, src), 2);
  gate_open(&gate);
  expect_unlocked();
  gate_fini(&gate);
}

/* ---- refusals: nothing runs, nothing stays locked ---- */

static int never_runs_count;
static void never_run(void *user) {
  (void)user;
  never_runs_count++;
}
static const spw_host_graph_t never = {never_run, NULL};

static void refuses_bad_arguments(void) {
  /* Each stops before anything reaches the backend, so a dummy graph serves on CUDA too. */
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, 0)};
  ASSERT_STATUS(spw_graph_launch(NULL, &never, a, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_graph_launch(rt, NULL, a, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("graph_exec is NULL"));
  ASSERT_STATUS(spw_graph_launch(rt, &never, NULL, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, 0, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("n is 0"));
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, SPW_GRAPH_BUFS_MAX + 1, s, 0),
                SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, SIZE_MAX, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("SPW_GRAPH_BUFS_MAX"));
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, 2, s, SPW_LAUNCH_BLOCK | SPW_LAUNCH_KEEP_LOCKS),
                SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, 2, s, 0x10), SPW_ERR_INVALID_ARG);
  /* Per buffer: unknown flag bits, reserved not 0, an offset. */
  spw_buf_arg_t bad = spw_buf_arg(src, 0, 0x100);
  spw_buf_arg_t b2[2] = {a[0], bad};
  ASSERT_STATUS(spw_graph_launch(rt, &never, b2, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  b2[1] = a[1];
  b2[1].reserved = 1;
  ASSERT_STATUS(spw_graph_launch(rt, &never, b2, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  b2[1] = spw_buf_arg(src, 4, 0);
  ASSERT_STATUS(spw_graph_launch(rt, &never, b2, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  ASSERT_TRUE(has("offset not 0"));
  /* Handles that are no buffer. */
  b2[1] = spw_buf_arg(SPW_BUF_NULL, 0, 0);
  ASSERT_STATUS(spw_graph_launch(rt, &never, b2, 2, s, 0), SPW_ERR_INVALID_HANDLE);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  b2[1] = spw_buf_arg(0x0123456789abcdefull, 0, 0);
  ASSERT_STATUS(spw_graph_launch(rt, &never, b2, 2, s, 0), SPW_ERR_INVALID_HANDLE);
  expect_unlocked();
  ASSERT_EQ(never_runs_count, 0);
}

static void refuses_a_buffer_that_is_not_address_stable(void) {
  spw_buf_t movable;
  ASSERT_OK(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_MOVABLE, &movable));
  spw_buf_arg_t a[3] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, 0),
                        spw_buf_arg(movable, 0, 0)};
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, 3, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("graph argument 2 (buffer"));
  ASSERT_TRUE(has("not address-stable"));
  expect_unlocked();
  ASSERT_EQ(test_locks_of(rt, movable), 0);
  ASSERT_EQ(never_runs_count, 0);
  ASSERT_OK(spw_free(rt, movable));
}

static void refuses_a_freed_buffer(void) {
  spw_buf_t gone;
  ASSERT_OK(spw_alloc_ex(rt, 4096, s, SPW_ALLOC_STABLE, &gone));
  ASSERT_OK(spw_free(rt, gone));
  spw_buf_arg_t a[3] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(gone, 0, 0),
                        spw_buf_arg(src, 0, 0)};
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, 3, s, 0), SPW_ERR_FREED);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  expect_unlocked();
  ASSERT_EQ(never_runs_count, 0);
}

static void refuses_a_buffer_or_a_stream_of_another_runtime(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  spw_runtime_t *other = test_runtime(&cfg);
  spw_stream_t os;
  ASSERT_OK(spw_stream_create(other, &os));
  spw_buf_t ob;
  ASSERT_OK(spw_alloc_ex(other, 4096, os, SPW_ALLOC_STABLE, &ob));
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, 0)};
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, 2, os, 0), SPW_ERR_INVALID_STREAM);
  spw_buf_arg_t b[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(ob, 0, 0)};
  ASSERT_STATUS(spw_graph_launch(rt, &never, b, 2, s, 0), SPW_ERR_INVALID_HANDLE);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  expect_unlocked();
  ASSERT_EQ(test_locks_of(other, ob), 0);
  ASSERT_EQ(never_runs_count, 0);
  ASSERT_OK(spw_runtime_destroy(other));
}

static void refuses_a_host_graph_without_a_function(void) {
  host_only();
  spw_host_graph_t empty = {NULL, NULL};
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, 0)};
  ASSERT_STATUS(spw_graph_launch(rt, &empty, a, 2, s, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(has("graph launch: "));
  expect_unlocked();
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* nothing was left in the lock map */
}

static void try_flag_refuses_a_spilled_buffer(void) {
  host_only();
  ASSERT_OK(spw_spill(rt, src, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, SPW_ACQUIRE_TRY),
                        spw_buf_arg(src, 0, SPW_ACQUIRE_TRY)};
  ASSERT_STATUS(spw_graph_launch(rt, &never, a, 2, s, 0), SPW_ERR_NOT_READY);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  expect_unlocked();
  ASSERT_EQ(never_runs_count, 0);
}

static void refused_launch_locks_nothing_and_runs_nothing(void) {
  host_only();
  add_graph_t g;
  spw_host_graph_t hg = capture(&g);
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, SPW_ACQUIRE_READ)};
  spw__inject_fault(rt, SPW_FAULT_LAUNCH, 1);
  ASSERT_STATUS(spw_graph_launch(rt, &hg, a, 2, s, SPW_LAUNCH_KEEP_LOCKS), SPW_ERR_CUDA);
  ASSERT_TRUE(has("graph launch: injected"));
  expect_unlocked();
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* nothing was left in the lock map either */
  ASSERT_EQ(atomic_load(&g.runs), 0);
  /* The fault was one launch: the next runs. */
  ASSERT_OK(spw_graph_launch(rt, &hg, a, 2, s, SPW_LAUNCH_BLOCK));
  expect_unlocked();
  expect_dst(1);
}

static void failed_copy_back_of_a_buffer_is_named(void) {
  host_only();
  add_graph_t g;
  spw_host_graph_t hg = capture(&g);
  ASSERT_OK(spw_spill(rt, src, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  spw_buf_arg_t a[2] = {spw_buf_arg(dst, 0, 0), spw_buf_arg(src, 0, SPW_ACQUIRE_READ)};
  spw__inject_fault(rt, SPW_FAULT_COPY, 1);
  ASSERT_STATUS(spw_graph_launch(rt, &hg, a, 2, s, 0), SPW_ERR_CUDA);
  ASSERT_TRUE(has("graph argument 1 (buffer"));
  ASSERT_TRUE(has("SPW_ERR_CUDA: injected"));
  expect_unlocked();
  ASSERT_EQ(state_of(rt, src), SPW_STATE_HOST); /* readable in its last good tier */
  ASSERT_EQ(atomic_load(&g.runs), 0);
  ASSERT_OK(spw_graph_launch(rt, &hg, a, 2, s, 0));
  expect_unlocked();
  expect_dst(1);
}

static const spw_test_t tests[] = {
    TEST(replays_over_buffers_spilled_between_launches),
    TEST(holds_its_locks_while_the_graph_runs_and_only_those),
    TEST(a_buffer_listed_twice_is_locked_twice),
    TEST(refuses_bad_arguments),
    TEST(refuses_a_buffer_that_is_not_address_stable),
    TEST(refuses_a_freed_buffer),
    TEST(refuses_a_buffer_or_a_stream_of_another_runtime),
    TEST(refuses_a_host_graph_without_a_function),
    TEST(try_flag_refuses_a_spilled_buffer),
    TEST(refused_launch_locks_nothing_and_runs_nothing),
    TEST(failed_copy_back_of_a_buffer_is_named),
};

TEST_MAIN_FIXTURE(tests, before, after)
