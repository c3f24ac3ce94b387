/* SPDX-License-Identifier: Apache-2.0 */
/* Streams over a runtime's life: many more streams than the table holds at once may be
 * created and destroyed one after another (a dead entry is taken over by a new stream), a
 * destroyed stream is rejected, and locks follow the stream that took them. Both backends. */
#include "test_main.h"
#include "test_util.h"

#define LIFETIME_STREAMS 5000 /* more than the 4096 live at once */

static void more_streams_over_a_lifetime_than_live_at_once(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, NULL, &b));
  for (int i = 0; i < LIFETIME_STREAMS; i++) {
    spw_stream_t s;
    void *d;
    ASSERT_OK(spw_stream_create(rt, &s));
    ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
    ASSERT_OK(spw_stream_destroy(rt, s)); /* synchronizes and releases the lock */
    uint32_t locks = 1;
    ASSERT_OK(spw_buf_lock_count(rt, b, &locks));
    ASSERT_EQ(locks, 0);
  }
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void destroyed_stream_is_rejected_while_another_takes_its_entry(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t a, b;
  spw_buf_t buf;
  void *d;
  ASSERT_OK(spw_alloc(rt, 4096, NULL, &buf));
  ASSERT_OK(spw_stream_create(rt, &a));
  ASSERT_OK(spw_stream_destroy(rt, a));
  ASSERT_OK(spw_stream_create(rt, &b));
  if (b != a) { /* the same value may come back (CUDA reuses addresses): then it is valid */
    ASSERT_STATUS(spw_acquire(rt, buf, a, 0, &d), SPW_ERR_INVALID_STREAM);
    ASSERT_STATUS(spw_stream_synchronize(rt, a), SPW_ERR_INVALID_STREAM);
  }
  ASSERT_OK(spw_acquire(rt, buf, b, 0, &d));
  ASSERT_OK(spw_stream_synchronize(rt, b));
  ASSERT_OK(spw_stream_destroy(rt, b));
  ASSERT_OK(spw_free(rt, buf));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(more_streams_over_a_lifetime_than_live_at_once),
    TEST(destroyed_stream_is_rejected_while_another_takes_its_entry),
};
TEST_MAIN(tests)
