/* SPDX-License-Identifier: Apache-2.0 */
/* A large request cut into slices (spw__slice_count) copies each slice on a stream of its
 * own (spw__engine_slice_stream), both ways, so that one slice's gathers or scatters on the
 * device run beside another's transfers; and its buffers come out whole. The streams are
 * seen through the fault shim's hook on the copies. Both backends. */
#include <pthread.h>
#include <stdlib.h>

#include "backend_faults.h"
#include "runtime.h"
#include "test_main.h"
#include "test_util.h"
#include "fixture.h" /* last: see its header */

enum { N = 64, BYTES = 4096 }; /* 64 / SLICE_MIN 4: as many slices as 3 helpers and a lane */

/* The streams the copies of one request went on, as the hook sees them. */
typedef struct copy_streams {
  pthread_mutex_t mu;
  spw_stream_t seen[2 * SPW_ENGINE_MAX_SLICES];
  unsigned n;
} copy_streams_t;

static void note_copy_stream(void *arg, spw_fault_t op, spw_stream_t stream) {
  (void)op;
  copy_streams_t *c = arg;
  pthread_mutex_lock(&c->mu);
  unsigned i = 0;
  while (i < c->n && c->seen[i] != stream) i++;
  if (i == c->n && c->n < 2 * SPW_ENGINE_MAX_SLICES) c->seen[c->n++] = stream;
  pthread_mutex_unlock(&c->mu);
}

/* Whether the copies went on the lane's slice streams, every one of them and no other. */
static int on_each_slice_stream(const copy_streams_t *c, spw_lane_t lane, unsigned slices) {
  if (c->n != slices) return 0;
  for (unsigned k = 0; k < slices; k++) {
    spw_stream_t want = spw__engine_slice_stream(rt->engine, lane, k);
    unsigned i = 0;
    while (i < c->n && c->seen[i] != want) i++;
    if (i == c->n) return 0;
  }
  return 1;
}

static void open_sliced(void) {
  setenv("SPILLWAY_TEST_SLICE_MIN", "4", 1); /* read when the runtime is made */
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.engine_helpers = 3;
  open_fixture_with(&cfg);
  unsetenv("SPILLWAY_TEST_SLICE_MIN");
}

static spw_buf_t written(uint64_t seed) {
  static uint8_t src[BYTES];
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, BYTES, s, &b));
  test_fill(src, BYTES, seed);
  test_write(rt, b, s, src, BYTES);
  return b;
}

/* Runs a spill (DOWN) or a prefetch (UP) of all of b and returns the streams its copies went
 * on. */
static copy_streams_t *moved(spw_buf_t *b, spw_lane_t lane) {
  static copy_streams_t c;
  c.n = 0;
  pthread_mutex_init(&c.mu, NULL);
  spw__faults_hook(rt->be, SPW_FAULT_COPY, note_copy_stream, &c);
  if (lane == SPW_LANE_DOWN)
    ASSERT_OK(spw_spill_n(rt, b, N, SPW_TIER_HOST));
  else
    ASSERT_OK(spw_prefetch_n(rt, b, N, s));
  ASSERT_OK(spw_wait_idle(rt));
  spw__faults_hook(rt->be, SPW_FAULT_COPY, NULL, NULL);
  pthread_mutex_destroy(&c.mu);
  for (int i = 0; i < N; i++)
    ASSERT_EQ(state_of(rt, b[i]), lane == SPW_LANE_DOWN ? SPW_STATE_HOST : SPW_STATE_RESIDENT);
  return &c;
}

static void each_slice_of_a_large_request_copies_on_a_stream_of_its_own(void) {
  const unsigned slices = spw__engine_slices(rt->engine, SPW_LANE_DOWN);
  ASSERT_EQ(slices, 4u);
  spw_buf_t b[N];
  for (int i = 0; i < N; i++) b[i] = written(900 + (uint64_t)i);
  ASSERT_TRUE(on_each_slice_stream(moved(b, SPW_LANE_DOWN), SPW_LANE_DOWN, slices));
  ASSERT_TRUE(on_each_slice_stream(moved(b, SPW_LANE_UP), SPW_LANE_UP, slices));
  static uint8_t got[BYTES];
  for (int i = 0; i < N; i++) {
    test_read(rt, b[i], s, got, BYTES);
    ASSERT_EQ(test_first_mismatch(got, BYTES, 900 + (uint64_t)i), (size_t)-1);
    ASSERT_OK(spw_free(rt, b[i]));
  }
}

static const spw_test_t tests[] = {
    TEST(each_slice_of_a_large_request_copies_on_a_stream_of_its_own),
};
TEST_MAIN_FIXTURE(tests, open_sliced, close_fixture)
