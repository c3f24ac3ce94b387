/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of retrieve-and-lock (public API only): acquire gives a stable device
 * pointer and one more lock, locks nest and are released one at a time and only by the
 * stream that holds them, acquire_n is all or nothing, spw_stream_synchronize releases the
 * locks of its stream and of no other, and data survives release and re-acquire. Device
 * memory is touched only through spw_memcpy_async, so every test is valid on both
 * backends. */
#include <stdint.h>

#include "test_main.h"
#include "test_util.h"
#include "fixture.h" /* last: see its header */

static uint32_t locks_of(spw_buf_t b) { return test_locks_of(rt, b); }

static uint64_t locked_bytes(void) { return stats_of(rt).locked_bytes; }

static void acquire_returns_pointer_and_one_lock(void) {
  spw_buf_t b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_UEQ(locked_bytes(), 0);
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_TRUE(d != NULL);
  ASSERT_EQ(locks_of(b), 1);
  ASSERT_UEQ(locked_bytes(), 4096);
  ASSERT_OK(spw_release(rt, b, s));
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_UEQ(locked_bytes(), 0);
}

static void locks_nest_and_release_one_at_a_time(void) {
  spw_buf_t b;
  void *d[3] = {NULL, NULL, NULL};
  ASSERT_OK(spw_alloc(rt, 1024, s, &b));
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(spw_acquire(rt, b, s, i == 1 ? SPW_ACQUIRE_READ : 0, &d[i]));
    ASSERT_EQ(locks_of(b), i + 1);
  }
  ASSERT_TRUE(d[0] != NULL);
  ASSERT_UEQ((uintptr_t)d[1], (uintptr_t)d[0]);
  ASSERT_UEQ((uintptr_t)d[2], (uintptr_t)d[0]);
  /* Locked bytes count the buffer once, however many locks it holds. */
  ASSERT_UEQ(locked_bytes(), 1024);
  for (int i = 3; i > 0; i--) {
    ASSERT_OK(spw_release(rt, b, s));
    ASSERT_EQ(locks_of(b), i - 1);
  }
  ASSERT_UEQ(locked_bytes(), 0);
  ASSERT_STATUS(spw_release(rt, b, s), SPW_ERR_NOT_LOCKED);
  ASSERT_EQ(locks_of(b), 0);
}

static void release_without_lock_gives_not_locked(void) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 512, s, &b));
  ASSERT_STATUS(spw_release(rt, b, s), SPW_ERR_NOT_LOCKED);
  ASSERT_STATUS(spw_release(rt, b, NULL), SPW_ERR_NOT_LOCKED);
  ASSERT_EQ(locks_of(b), 0);
}

static void release_on_another_stream_gives_not_locked(void) {
  spw_buf_t b;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 512, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_STATUS(spw_release(rt, b, s2), SPW_ERR_NOT_LOCKED);
  ASSERT_STATUS(spw_release(rt, b, NULL), SPW_ERR_NOT_LOCKED);
  ASSERT_EQ(locks_of(b), 1);
  ASSERT_OK(spw_release(rt, b, s));
  ASSERT_EQ(locks_of(b), 0);
}

static void acquire_n_is_all_or_nothing(void) {
  spw_buf_t a, b, c, dead;
  void *da = NULL;
  ASSERT_OK(spw_alloc(rt, 256, s, &a));
  ASSERT_OK(spw_alloc(rt, 512, s, &b));
  ASSERT_OK(spw_alloc(rt, 1024, s, &c));
  ASSERT_OK(spw_alloc(rt, 2048, s, &dead));
  ASSERT_OK(spw_free(rt, dead));
  /* `a` holds a lock already, so "unchanged" is 1 for it, not just 0. */
  ASSERT_OK(spw_acquire(rt, a, s, 0, &da));
  const uint64_t locked_before = locked_bytes();
  ASSERT_UEQ(locked_before, 256);
  /* The dead handle first, in the middle and last: whatever was locked before it in the
   * list must be unlocked again. */
  const spw_buf_t lists[3][4] = {{dead, a, b, c}, {a, b, dead, c}, {a, b, c, dead}};
  void *sentinel = (void *)&da;
  for (int l = 0; l < 3; l++) {
    void *dptrs[4] = {sentinel, sentinel, sentinel, sentinel};
    ASSERT_STATUS(spw_acquire_n(rt, lists[l], 4, s, 0, dptrs), SPW_ERR_FREED);
    for (int i = 0; i < 4; i++) ASSERT_UEQ((uintptr_t)dptrs[i], (uintptr_t)sentinel);
    ASSERT_EQ(locks_of(a), 1);
    ASSERT_EQ(locks_of(b), 0);
    ASSERT_EQ(locks_of(c), 0);
    ASSERT_UEQ(locked_bytes(), locked_before);
  }
  /* A forged handle is refused the same way. */
  const spw_buf_t forged[3] = {b, c, ~(spw_buf_t)0};
  void *dptrs[3] = {sentinel, sentinel, sentinel};
  const int fs = spw_acquire_n(rt, forged, 3, s, 0, dptrs);
  ASSERT_TRUE(fs == SPW_ERR_INVALID_HANDLE || fs == SPW_ERR_FREED);
  for (int i = 0; i < 3; i++) ASSERT_UEQ((uintptr_t)dptrs[i], (uintptr_t)sentinel);
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_EQ(locks_of(c), 0);
  /* Nothing was left in the stream's lock map either: no stray lock to release. */
  ASSERT_STATUS(spw_release(rt, b, s), SPW_ERR_NOT_LOCKED);
  ASSERT_STATUS(spw_release(rt, c, s), SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_release(rt, a, s));
  ASSERT_STATUS(spw_release(rt, a, s), SPW_ERR_NOT_LOCKED);
  ASSERT_UEQ(locked_bytes(), 0);
}

static void acquire_n_with_duplicate_locks_it_twice(void) {
  spw_buf_t a, b;
  ASSERT_OK(spw_alloc(rt, 256, s, &a));
  ASSERT_OK(spw_alloc(rt, 512, s, &b));
  const spw_buf_t list[3] = {a, b, a};
  void *dptrs[3] = {NULL, NULL, NULL};
  ASSERT_OK(spw_acquire_n(rt, list, 3, s, 0, dptrs));
  ASSERT_TRUE(dptrs[0] != NULL);
  ASSERT_TRUE(dptrs[1] != NULL);
  ASSERT_UEQ((uintptr_t)dptrs[2], (uintptr_t)dptrs[0]);
  ASSERT_TRUE(dptrs[1] != dptrs[0]);
  ASSERT_EQ(locks_of(a), 2);
  ASSERT_EQ(locks_of(b), 1);
  ASSERT_UEQ(locked_bytes(), 256 + 512);
  ASSERT_OK(spw_release(rt, a, s));
  ASSERT_EQ(locks_of(a), 1);
  ASSERT_OK(spw_release(rt, a, s));
  ASSERT_EQ(locks_of(a), 0);
  ASSERT_STATUS(spw_release(rt, a, s), SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_release(rt, b, s));
  ASSERT_UEQ(locked_bytes(), 0);
}

static void synchronize_releases_locks_of_that_stream_only(void) {
  spw_buf_t a, b, c;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 256, s, &a));
  ASSERT_OK(spw_alloc(rt, 512, s, &b));
  ASSERT_OK(spw_alloc(rt, 1024, s, &c));
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_acquire(rt, a, s2, 0, &d));
  ASSERT_OK(spw_acquire(rt, c, s2, 0, &d));
  ASSERT_EQ(locks_of(a), 3);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(a), 1);
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_EQ(locks_of(c), 1);
  ASSERT_UEQ(locked_bytes(), 256 + 1024);
  ASSERT_STATUS(spw_release(rt, a, s), SPW_ERR_NOT_LOCKED);
  /* Synchronizing again with nothing locked is fine and changes nothing. */
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(a), 1);
  ASSERT_OK(spw_stream_synchronize(rt, s2));
  ASSERT_EQ(locks_of(a), 0);
  ASSERT_EQ(locks_of(c), 0);
  ASSERT_UEQ(locked_bytes(), 0);
}

static void null_stream_locks_are_released_by_synchronizing_null(void) {
  spw_buf_t a;
  void *d = NULL;
  ASSERT_OK(spw_alloc(rt, 256, NULL, &a));
  ASSERT_OK(spw_acquire(rt, a, NULL, 0, &d));
  ASSERT_OK(spw_acquire(rt, a, s, 0, &d));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(a), 1);
  ASSERT_OK(spw_stream_synchronize(rt, NULL));
  ASSERT_EQ(locks_of(a), 0);
}

static void data_survives_release_and_reacquire(void) {
  enum { BYTES = 256 * 1024 };
  spw_buf_t b, other;
  uint8_t *in = malloc(BYTES), *out = malloc(BYTES);
  ASSERT_TRUE(in != NULL && out != NULL);
  test_fill(in, BYTES, 99);
  memset(out, 0, BYTES);
  ASSERT_OK(spw_alloc(rt, BYTES, s, &b));
  test_write(rt, b, s, in, BYTES);
  ASSERT_EQ(locks_of(b), 0);
  /* Other traffic in between must not disturb an unlocked buffer. */
  ASSERT_OK(spw_alloc(rt, BYTES, s2, &other));
  test_write(rt, other, s2, out, BYTES);
  ASSERT_OK(spw_free(rt, other));
  /* Re-acquired on another stream, for reading. */
  test_read(rt, b, s2, out, BYTES);
  ASSERT_EQ(test_first_mismatch(out, BYTES, 99), (size_t)-1);
  ASSERT_EQ(locks_of(b), 0);
  ASSERT_OK(spw_free(rt, b));
  free(in);
  free(out);
}

static const spw_test_t tests[] = {
    TEST(acquire_returns_pointer_and_one_lock),
    TEST(locks_nest_and_release_one_at_a_time),
    TEST(release_without_lock_gives_not_locked),
    TEST(release_on_another_stream_gives_not_locked),
    TEST(acquire_n_is_all_or_nothing),
    TEST(acquire_n_with_duplicate_locks_it_twice),
    TEST(synchronize_releases_locks_of_that_stream_only),
    TEST(null_stream_locks_are_released_by_synchronizing_null),
    TEST(data_survives_release_and_reacquire),
};
TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
