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

static uint32_t locks_of(spw_runtime_t *rt, spw_buf_t b) {
  uint32_t n = 0xFFFFFFFFu;
  ASSERT_OK(spw_buf_lock_count(rt, b, &n));
  return n;
}

static spw_dim3_t grid_for(uint64_t n) { return spw_dim3((unsigned)((n + 255) / 256), 1, 1); }

static int fill(spw_runtime_t *rt, const test_kernels_t *k, spw_stream_t s, spw_buf_t b,
                uint64_t first, uint32_t value, unsigned flags) {
  uint64_t n = N - first;
  spw_kernel_arg_t a[3] = {spw_karg_buf(b, first * sizeof(uint32_t), 0), SPW_KARG(value),
                           SPW_KARG(n)};
  return spw_launch_kernel(rt, k->fill_u32, grid_for(n), spw_dim3(256, 1, 1), a, 3, 0, s, flags);
}

static int hold(spw_runtime_t *rt, const test_kernels_t *k, spw_stream_t s, spw_buf_t b,
                uint64_t ns, unsigned flags) {
  spw_kernel_arg_t a[2] = {spw_karg_buf(b, 0, 0), SPW_KARG(ns)};
  return spw_launch_kernel(rt, k->hold, spw_dim3(1, 1, 1), spw_dim3(1, 1, 1), a, 2, 0, s, flags);
}

/* The buffer's N elements, read on s. */
static uint32_t *contents(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s) {
  uint32_t *h = calloc(N, sizeof *h);
  ASSERT_TRUE(h != NULL);
  test_read(rt, b, s, h, N * sizeof *h);
  return h;
}

static spw_buf_t alloc_zeroed(spw_runtime_t *rt, spw_stream_t s) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, N * sizeof(uint32_t), s, &b));
  uint32_t *z = calloc(N, sizeof *z);
  ASSERT_TRUE(z != NULL);
  test_write(rt, b, s, z, N * sizeof *z);
  free(z);
  return b;
}

/* ---- tests ---- */

static void kernel_gets_device_pointer_plus_offset_and_values(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_zeroed(rt, s);
  ASSERT_OK(fill(rt, &k, s, b, 16, 0xC0FFEEu, 0));
  uint32_t *h = contents(rt, b, s);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], i < 16 ? 0 : 0xC0FFEEu);
  free(h);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void values_of_every_size_reach_the_kernel(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t out;
  ASSERT_OK(spw_alloc(rt, 4 * sizeof(uint64_t), s, &out));
  uint8_t x = 0xA5;
  double y = -1.25e-3;
  test_pair_t p = {0x0123456789ABCDEFull, 0xBEEF};
  spw_kernel_arg_t a[4] = {spw_karg_buf(out, 0, 0), SPW_KARG(x), SPW_KARG(y), SPW_KARG(p)};
  ASSERT_OK(spw_launch_kernel(rt, k.mixed, spw_dim3(1, 1, 1), spw_dim3(1, 1, 1), a, 4, 0, s,
                              SPW_LAUNCH_BLOCK));
  ASSERT_EQ(locks_of(rt, out), 0);
  uint64_t got[4], ybits;
  test_read(rt, out, s, got, sizeof got);
  memcpy(&ybits, &y, sizeof y);
  ASSERT_UEQ(got[0], 0xA5);
  ASSERT_UEQ(got[1], ybits);
  ASSERT_UEQ(got[2], p.a);
  ASSERT_UEQ(got[3], p.b);
  ASSERT_OK(spw_free(rt, out));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void values_are_copied_at_launch(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_zeroed(rt, s), t = alloc_zeroed(rt, s);
  /* The fill cannot start before the hold ends, long after its arguments changed. */
  ASSERT_OK(hold(rt, &k, s, t, 100 * 1000 * 1000, 0));
  uint32_t value = 7;
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(b, 0, 0), SPW_KARG(value), SPW_KARG(n)};
  ASSERT_OK(spw_launch_kernel(rt, k.fill_u32, grid_for(N), spw_dim3(256, 1, 1), a, 3, 0, s, 0));
  value = 8;
  n = 1;
  a[0] = spw_karg_buf(t, 0, 0); /* the argument array itself may be reused at once too */
  uint32_t *h = contents(rt, b, s);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], 7);
  free(h);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_free(rt, t));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void release_waits_for_the_kernel(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_zeroed(rt, s);
  ASSERT_OK(hold(rt, &k, s, b, 300ull * 1000 * 1000, 0));
  /* The launch returned at once; the kernel runs for 300 ms and keeps its buffer. */
  ASSERT_EQ(locks_of(rt, b), 1);
  ASSERT_STATUS(spw_spill(rt, b, SPW_TIER_HOST), SPW_ERR_LOCKED);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  uint32_t *h = contents(rt, b, s);
  ASSERT_UEQ(h[0], 1); /* the kernel's write came back from host */
  free(h);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void blocking_and_kept_locks(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_zeroed(rt, s);
  ASSERT_OK(hold(rt, &k, s, b, 50ull * 1000 * 1000, SPW_LAUNCH_BLOCK));
  ASSERT_EQ(locks_of(rt, b), 0); /* no wait_idle: the call itself waited and released */
  ASSERT_OK(fill(rt, &k, s, b, 0, 3, SPW_LAUNCH_KEEP_LOCKS));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b), 1);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void failing_buffer_argument_is_named_and_nothing_stays_locked(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t dst = alloc_zeroed(rt, s), dead;
  ASSERT_OK(spw_alloc(rt, 64, s, &dead));
  ASSERT_OK(spw_free(rt, dead));
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(dst, 0, 0), spw_karg_buf(dead, 0, SPW_ACQUIRE_READ),
                           SPW_KARG(n)};
  ASSERT_STATUS(spw_launch_kernel(rt, k.add_u32, grid_for(N), spw_dim3(256, 1, 1), a, 3, 0, s,
                                  0),
                SPW_ERR_FREED);
  ASSERT_TRUE(strstr(spw_last_error(rt), "kernel argument 1") != NULL);
  ASSERT_EQ(locks_of(rt, dst), 0);
  /* An offset past the end, counted in kernel arguments (values included). */
  spw_kernel_arg_t b[3] = {SPW_KARG(n), spw_karg_buf(dst, 0, 0),
                           spw_karg_buf(dst, N * sizeof(uint32_t) + 1, 0)};
  ASSERT_STATUS(spw_launch_kernel(rt, k.add_u32, grid_for(N), spw_dim3(256, 1, 1), b, 3, 0, s,
                                  0),
                SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "kernel argument 2") != NULL);
  ASSERT_EQ(locks_of(rt, dst), 0);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  uint32_t *h = contents(rt, dst, s);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], 0); /* no kernel ran */
  free(h);
  ASSERT_OK(spw_free(rt, dst));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void bad_launch_arguments_are_refused(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_zeroed(rt, s);
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
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_launch_kernel(rt, k.fill_u32, g, blk, a, 3, 0, s, SPW_LAUNCH_BLOCK));
  uint32_t *h = contents(rt, b, s);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], 1);
  free(h);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void read_only_argument_keeps_its_clean_copy(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t dst = alloc_zeroed(rt, s), src = alloc_zeroed(rt, s);
  ASSERT_OK(fill(rt, &k, s, src, 0, 5, 0));
  ASSERT_OK(fill(rt, &k, s, dst, 0, 1, 0));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  spw_buf_t both[2] = {dst, src};
  ASSERT_OK(spw_spill_n(rt, both, 2, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(dst, 0, 0), spw_karg_buf(src, 0, SPW_ACQUIRE_READ),
                           SPW_KARG(n)};
  ASSERT_OK(spw_launch_kernel(rt, k.add_u32, grid_for(N), spw_dim3(256, 1, 1), a, 3, 0, s, 0));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  spw_stats_t before = stats_of(rt);
  ASSERT_OK(spw_spill_n(rt, both, 2, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  spw_stats_t after = stats_of(rt);
  ASSERT_UEQ(after.clean_respills - before.clean_respills, 1);
  ASSERT_UEQ(after.spill_bytes - before.spill_bytes, N * sizeof(uint32_t));
  uint32_t *h = contents(rt, dst, s);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], 6);
  free(h);
  ASSERT_OK(spw_free(rt, dst));
  ASSERT_OK(spw_free(rt, src));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void same_buffer_twice_in_one_kernel(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_zeroed(rt, s);
  ASSERT_OK(fill(rt, &k, s, b, 0, 21, 0));
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(b, 0, 0), spw_karg_buf(b, 0, SPW_ACQUIRE_READ),
                           SPW_KARG(n)};
  ASSERT_OK(spw_launch_kernel(rt, k.add_u32, grid_for(N), spw_dim3(256, 1, 1), a, 3, 0, s, 0));
  uint32_t *h = contents(rt, b, s);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], 42);
  free(h);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* CUDA only: a launch CUDA refuses (too many threads per block) fails with CUDA's text and
 * leaves nothing locked; and a host stub works where the test shares Spillway's runtime. */
static void cuda_refused_launch_and_host_stubs(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_backend_kind_t kind;
  ASSERT_OK(spw_runtime_backend(rt, &kind));
  if (kind != SPW_BACKEND_CUDA) {
    printf("  (CUDA backend only)\n");
    ASSERT_OK(spw_runtime_destroy(rt));
    return;
  }
  test_kernels_t k = test_kernels_of(rt, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_zeroed(rt, s);
  uint32_t v = 9;
  uint64_t n = N;
  spw_kernel_arg_t a[3] = {spw_karg_buf(b, 0, 0), SPW_KARG(v), SPW_KARG(n)};
  ASSERT_STATUS(spw_launch_kernel(rt, k.fill_u32, grid_for(N), spw_dim3(4096, 1, 1), a, 3, 0, s,
                                  0),
                SPW_ERR_CUDA);
  ASSERT_TRUE(strstr(spw_last_error(rt), "kernel launch: cudaError") != NULL);
  ASSERT_EQ(locks_of(rt, b), 0);
#ifdef TEST_SAME_CUDA_RUNTIME
  test_kernels_t stubs = test_kernels_of(rt, 1);
  ASSERT_OK(spw_launch_kernel(rt, stubs.fill_u32, grid_for(N), spw_dim3(256, 1, 1), a, 3, 0, s,
                              SPW_LAUNCH_BLOCK));
  uint32_t *h = contents(rt, b, s);
  for (uint32_t i = 0; i < N; i++) ASSERT_UEQ(h[i], 9);
  free(h);
#endif
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
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
TEST_MAIN(tests)
