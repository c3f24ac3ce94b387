/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of the kernel launcher, spw_launch_kernel (public API only): buffer
 * arguments are acquired all or nothing and replaced by their device pointer + offset in a
 * copy of the argument array, value arguments reach the kernel as they were at the call,
 * and the locks go once the kernel has completed. The kernels (test_launch_kernels.h) are
 * real CUDA kernels on the CUDA backend and host functions on the host backend, where the
 * stream's worker runs them: the launcher's logic runs for real on both. */
#include <stdint.h>

#include "test_main.h"
#include "test_util.h"
#include "test_launch_kernels.h"

#define N 4096u /* elements of the test buffers */

/* The fixture every test starts from (open_fixture / close_fixture): a runtime on the test's backend, its
 * kernels, a stream and b, a buffer of N zeroes. The runtime's destruction frees what a test
 * left allocated. */
static spw_runtime_t *rt;
static test_kernels_t k;
static spw_stream_t s;
static spw_buf_t b;

static uint32_t locks_of(spw_buf_t buf) {
  uint32_t n = 0xFFFFFFFFu;
  ASSERT_OK(spw_buf_lock_count(rt, buf, &n));
  return n;
}

static spw_dim3_t grid_for(uint64_t n) { return spw_dim3((unsigned)((n + 255) / 256), 1, 1); }

/* A launch of `fn` over N elements on s, with 256 threads a block. */
static int launch_n(const void *fn, spw_kernel_arg_t *a, unsigned n_args, unsigned flags) {
  return spw_launch_kernel(rt, fn, grid_for(N), spw_dim3(256, 1, 1), a, n_args, 0, s, flags);
}

static int fill(spw_buf_t buf, uint64_t first, uint32_t value, unsigned flags) {
  uint64_t n = N - first;
  spw_kernel_arg_t a[3] = {spw_karg_buf(buf, first * sizeof(uint32_t), 0), SPW_KARG(value),
                           SPW_KARG(n)};
  return spw_launch_kernel(rt, k.fill_u32, grid_for(n), spw_dim3(256, 1, 1), a, 3, 0, s, flags);
}

/* dst[i] += src[i] over N elements, src read-only. */
static int add(spw_buf_t dst, spw_buf_t src, unsigned flags) {
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(dst, 0, 0), spw_karg_buf(src, 0, SPW_ACQUIRE_READ),
                           SPW_KARG(n)};
  return launch_n(k.add_u32, a, 3, flags);
}

static int hold(spw_buf_t buf, uint64_t ns, unsigned flags) {
  spw_kernel_arg_t a[2] = {spw_karg_buf(buf, 0, 0), SPW_KARG(ns)};
  return spw_launch_kernel(rt, k.hold, spw_dim3(1, 1, 1), spw_dim3(1, 1, 1), a, 2, 0, s, flags);
}

/* Checks buf's N elements, read on s: 0 below `first`, `value` from there. */
static void expect_contents(spw_buf_t buf, uint32_t first, uint32_t value) {
  uint32_t *h = calloc(N, sizeof *h);
  ASSERT_TRUE(h != NULL);
  test_read(rt, buf, s, h, N * sizeof *h);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], i < first ? 0 : value);
  free(h);
}

/* Waits for the engine; then buf holds no lock. */
static void expect_idle_and_unlocked(spw_buf_t buf) {
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(buf), 0);
}

static spw_buf_t alloc_zeroed(void) {
  spw_buf_t buf;
  ASSERT_OK(spw_alloc(rt, N * sizeof(uint32_t), s, &buf));
  uint32_t *z = calloc(N, sizeof *z);
  ASSERT_TRUE(z != NULL);
  test_write(rt, buf, s, z, N * sizeof *z);
  free(z);
  return buf;
}

static void open_fixture(void) {
  rt = test_runtime(NULL);
  k = test_kernels_of(rt, 0);
  ASSERT_OK(spw_stream_create(rt, &s));
  b = alloc_zeroed();
}

static void close_fixture(void) {
  if (rt) ASSERT_OK(spw_runtime_destroy(rt));
  rt = NULL;
}

/* ---- tests ---- */

static void kernel_gets_device_pointer_plus_offset_and_values(void) {
  ASSERT_OK(fill(b, 16, 0xC0FFEEu, 0));
  expect_contents(b, 16, 0xC0FFEEu);
  expect_idle_and_unlocked(b);
  ASSERT_OK(spw_free(rt, b));
}

static void values_of_every_size_reach_the_kernel(void) {
  spw_buf_t out;
  ASSERT_OK(spw_alloc(rt, 4 * sizeof(uint64_t), s, &out));
  uint8_t x = 0xA5;
  double y = -1.25e-3;
  test_pair_t p = {0x0123456789ABCDEFull, 0xBEEF};
  spw_kernel_arg_t a[4] = {spw_karg_buf(out, 0, 0), SPW_KARG(x), SPW_KARG(y), SPW_KARG(p)};
  ASSERT_OK(spw_launch_kernel(rt, k.mixed, spw_dim3(1, 1, 1), spw_dim3(1, 1, 1), a, 4, 0, s,
                              SPW_LAUNCH_BLOCK));
  ASSERT_EQ(locks_of(out), 0);
  uint64_t got[4], ybits;
  test_read(rt, out, s, got, sizeof got);
  memcpy(&ybits, &y, sizeof y);
  ASSERT_UEQ(got[0], 0xA5);
  ASSERT_UEQ(got[1], ybits);
  ASSERT_UEQ(got[2], p.a);
  ASSERT_UEQ(got[3], p.b);
}

static void values_are_copied_at_launch(void) {
  spw_buf_t t = alloc_zeroed();
  /* The fill cannot start before the hold ends, long after its arguments changed. */
  ASSERT_OK(hold(t, 100 * 1000 * 1000, 0));
  uint32_t value = 7;
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(b, 0, 0), SPW_KARG(value), SPW_KARG(n)};
  ASSERT_OK(launch_n(k.fill_u32, a, 3, 0));
  value = 8;
  n = 1;
  a[0] = spw_karg_buf(t, 0, 0); /* the argument array itself may be reused at once too */
  expect_contents(b, 0, 7);
  ASSERT_OK(spw_wait_idle(rt));
}

static void release_waits_for_the_kernel(void) {
  ASSERT_OK(hold(b, 300ull * 1000 * 1000, 0));
  /* The launch returned at once; the kernel runs for 300 ms and keeps its buffer. */
  ASSERT_EQ(locks_of(b), 1);
  ASSERT_STATUS(spw_spill(rt, b, SPW_TIER_HOST), SPW_ERR_LOCKED);
  expect_idle_and_unlocked(b);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  uint32_t first;
  test_read(rt, b, s, &first, sizeof first);
  ASSERT_UEQ(first, 1); /* the kernel's write came back from host */
}

static void blocking_and_kept_locks(void) {
  ASSERT_OK(hold(b, 50ull * 1000 * 1000, SPW_LAUNCH_BLOCK));
  ASSERT_EQ(locks_of(b), 0); /* no wait_idle: the call itself waited and released */
  ASSERT_OK(fill(b, 0, 3, SPW_LAUNCH_KEEP_LOCKS));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(b), 1);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(b), 0);
}

static void failing_buffer_argument_is_named_and_nothing_stays_locked(void) {
  spw_buf_t dead;
  ASSERT_OK(spw_alloc(rt, 64, s, &dead));
  ASSERT_OK(spw_free(rt, dead));
  ASSERT_STATUS(add(b, dead, 0), SPW_ERR_FREED);
  ASSERT_TRUE(strstr(spw_last_error(rt), "kernel argument 1") != NULL);
  ASSERT_EQ(locks_of(b), 0);
  /* An offset past the end, counted in kernel arguments (values included). */
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {SPW_KARG(n), spw_karg_buf(b, 0, 0),
                           spw_karg_buf(b, N * sizeof(uint32_t) + 1, 0)};
  ASSERT_STATUS(launch_n(k.add_u32, a, 3, 0), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "kernel argument 2") != NULL);
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  expect_contents(b, 0, 0); /* no kernel ran */
}

static void bad_launch_arguments_are_refused(void) {
  uint32_t v = 1;
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(b, 0, 0), SPW_KARG(v), SPW_KARG(n)};
  spw_dim3_t g = grid_for(N), blk = spw_dim3(256, 1, 1);
#define REFUSED(call) ASSERT_STATUS(call, SPW_ERR_INVALID_ARG)
  REFUSED(spw_launch_kernel(rt, NULL, g, blk, a, 3, 0, s, 0));
  REFUSED(spw_launch_kernel(rt, k.fill_u32, spw_dim3(0, 1, 1), blk, a, 3, 0, s, 0));
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, spw_dim3(256, 0, 1), a, 3, 0, s, 0));
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, NULL, 3, 0, s, 0));
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, SPW_KERNEL_ARGS_MAX + 1, 0, s, 0));
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s, 0x10));
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s,
                            SPW_LAUNCH_BLOCK | SPW_LAUNCH_KEEP_LOCKS));
  REFUSED(spw_launch_kernel(NULL, k.fill_u32, g, blk, a, 3, 0, s, 0));
  spw_kernel_arg_t bad = a[1];
  a[1] = spw_karg_value(NULL, 4);
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s, 0));
  ASSERT_TRUE(strstr(spw_last_error(rt), "kernel argument 1") != NULL);
  a[1] = spw_karg_value(&v, 0);
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s, 0));
  a[1] = bad;
  a[1].kind = 0;
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s, 0));
  a[1] = bad;
  a[1].reserved = 1;
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s, 0));
  a[1] = bad;
  a[0].buf.flags = 0x100;
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s, 0));
  a[0] = spw_karg_buf(b, 0, 0);
  static uint8_t big[SPW_KERNEL_ARG_BYTES_MAX];
  spw_kernel_arg_t over[2] = {spw_karg_value(big, sizeof big), spw_karg_value(&n, sizeof n)};
  REFUSED(spw_launch_kernel(rt, k.fill_u32, g, blk, over, 2, 0, s, 0));
#undef REFUSED
  ASSERT_STATUS(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0,
                                  (spw_stream_t)(uintptr_t)0x1234, 0),
                SPW_ERR_INVALID_STREAM);
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_OK(launch_n(k.fill_u32, a, 3, SPW_LAUNCH_BLOCK));
  expect_contents(b, 0, 1);
}

static void read_only_argument_keeps_its_clean_copy(void) {
  spw_buf_t src = alloc_zeroed();
  ASSERT_OK(fill(src, 0, 5, 0));
  ASSERT_OK(fill(b, 0, 1, 0));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  spw_buf_t both[2] = {b, src};
  ASSERT_OK(spw_spill_n(rt, both, 2, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(add(b, src, 0));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  test_spilled_t d = test_spill_counted(rt, both, 2, SPW_TIER_HOST);
  ASSERT_UEQ(d.clean_respills, 1);
  ASSERT_UEQ(d.spill_bytes, N * sizeof(uint32_t));
  expect_contents(b, 0, 6);
}

static void same_buffer_twice_in_one_kernel(void) {
  ASSERT_OK(fill(b, 0, 21, 0));
  ASSERT_OK(add(b, b, 0));
  expect_contents(b, 0, 42);
  expect_idle_and_unlocked(b);
}

/* CUDA only: a launch CUDA refuses (too many threads per block) fails with CUDA's text and
 * leaves nothing locked; and a host stub works where the test shares Spillway's runtime. */
static void cuda_refused_launch_and_host_stubs(void) {
  spw_backend_kind_t kind;
  ASSERT_OK(spw_runtime_backend(rt, &kind));
  TEST_SKIP_IF(kind != SPW_BACKEND_CUDA, "CUDA backend only");
  uint32_t v = 9;
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(b, 0, 0), SPW_KARG(v), SPW_KARG(n)};
  ASSERT_STATUS(spw_launch_kernel(rt, k.fill_u32, grid_for(N), spw_dim3(4096, 1, 1), a, 3, 0, s,
                                  0),
                SPW_ERR_CUDA);
  ASSERT_TRUE(strstr(spw_last_error(rt), "kernel launch: cudaError") != NULL);
  ASSERT_EQ(locks_of(b), 0);
#ifdef TEST_SAME_CUDA_RUNTIME
  test_kernels_t stubs = test_kernels_of(rt, 1);
  ASSERT_OK(launch_n(stubs.fill_u32, a, 3, SPW_LAUNCH_BLOCK));
  expect_contents(b, 0, 9);
#endif
}

static const spw_test_t tests[] = {
    TEST(kernel_gets_device_pointer_plus_offset_and_values),
    TEST(values_of_every_size_reach_the_kernel),
    TEST(values_are_copied_at_launch),
    TEST(release_waits_for_the_kernel),
    TEST(blocking_and_kept_locks),
    TEST(failing_buffer_argument_is_named_and_nothing_stays_locked),
    TEST(bad_launch_arguments_are_refused),
    TEST(read_only_argument_keeps_its_clean_copy),
    TEST(same_buffer_twice_in_one_kernel),
    TEST(cuda_refused_launch_and_host_stubs),
};
TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
