/* SPDX-License-Identifier: Apache-2.0 */
/* The fixture most behaviour tests start from: a runtime on the test's backend (test_runtime:
 * the test skips without a GPU on the CUDA backend) and two streams. A test file includes
 * this header once and passes the hooks to the driver:
 *
 *   TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
 *
 * or calls open_fixture from a hook of its own that sets up more. close_fixture destroys the
 * runtime, which frees every buffer a test left and fails if one is still locked. A test
 * that needs another configuration calls reopen_fixture(&cfg) first. Include it after every
 * other header: its globals (rt, s, s2) would shadow the parameters of inline functions
 * declared after it. */
#ifndef SPILLWAY_TESTS_FIXTURE_H
#define SPILLWAY_TESTS_FIXTURE_H

#include "test_util.h"

static spw_runtime_t *rt;
static spw_stream_t s, s2;

static inline void open_fixture_with(spw_config_t *cfg) {
  rt = test_runtime(cfg);
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_stream_create(rt, &s2));
}

static inline void open_fixture(void) { open_fixture_with(NULL); }

static inline void close_fixture(void) {
  if (rt) ASSERT_OK(spw_runtime_destroy(rt));
  rt = NULL;
}

/* Replaces the fixture's runtime with one made from `cfg` (new streams too). */
static inline void reopen_fixture(spw_config_t *cfg) {
  close_fixture();
  open_fixture_with(cfg);
}

#endif /* SPILLWAY_TESTS_FIXTURE_H */
