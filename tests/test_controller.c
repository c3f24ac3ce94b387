/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of the controller (public API only): the allocated, freed and
 * state_changed callbacks see every event with the right bytes; the pressure callback picks
 * the victims of a spill on demand (locked ones are skipped); a callback that would wait on
 * the runtime is refused with SPW_ERR_WOULD_DEADLOCK while spw_spill works from inside it;
 * and a removed controller hears nothing more.
 *
 * Callbacks run on the thread that caused the event, engine threads included, so the
 * recorder below takes a mutex. Device memory is touched only through spw_memcpy_async +
 * spw_stream_synchronize, so every test is valid on both backends. */
#include <pthread.h>
#include <stdint.h>

#include "test_main.h"
#include "test_util.h"

#define MIB ((size_t)1 << 20)

typedef enum { EV_ALLOC, EV_FREE, EV_STATE, EV_PRESSURE } ev_kind_t;

typedef struct event {
  ev_kind_t kind;
  spw_buf_t buf;
  uint64_t bytes;
  spw_state_t from, to;
  int status;
} event_t;

typedef struct recorder {
  pthread_mutex_t mu;
  event_t ev[256];
  size_t n;
  /* pressure: the victims to name */
  spw_buf_t victims[8];
  size_t nvictims;
  /* reentry test */
  spw_runtime_t *rt;
  spw_buf_t trigger, other;
  int wait_idle_status, sync_status, spill_status, reserve_status, reentered;
  spw_stream_t stream;
} recorder_t;

static void record(recorder_t *r, event_t e) {
  pthread_mutex_lock(&r->mu);
  ASSERT_LT(r->n, sizeof r->ev / sizeof r->ev[0]);
  r->ev[r->n++] = e;
  pthread_mutex_unlock(&r->mu);
}

static void on_alloc(void *u, spw_buf_t b, size_t bytes) {
  record(u, (event_t){EV_ALLOC, b, bytes, (spw_state_t)0, (spw_state_t)0, 0});
}
static void on_free(void *u, spw_buf_t b, size_t bytes) {
  record(u, (event_t){EV_FREE, b, bytes, (spw_state_t)0, (spw_state_t)0, 0});
}
static void on_state(void *u, const spw_state_event_t *e) {
  record(u, (event_t){EV_STATE, e->buf, e->bytes, e->from, e->to, e->status});
}
static size_t on_pressure(void *u, uint64_t needed, spw_buf_t *victims, size_t max) {
  recorder_t *r = u;
  record(r, (event_t){EV_PRESSURE, SPW_BUF_NULL, needed, (spw_state_t)0, (spw_state_t)0, 0});
  size_t k = r->nvictims < max ? r->nvictims : max;
  for (size_t i = 0; i < k; i++) victims[i] = r->victims[i];
  return k;
}

static const spw_controller_t recording = {sizeof(spw_controller_t), on_alloc, on_free, on_state,
                                           on_pressure};

static void recorder_init(recorder_t *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
}

static size_t count_of(recorder_t *r, ev_kind_t kind) {
  pthread_mutex_lock(&r->mu);
  size_t c = 0;
  for (size_t i = 0; i < r->n; i++) c += r->ev[i].kind == kind;
  pthread_mutex_unlock(&r->mu);
  return c;
}

static void expect_event(const recorder_t *r, size_t i, ev_kind_t kind, spw_buf_t b,
                         uint64_t bytes) {
  ASSERT_LT(i, r->n);
  ASSERT_EQ(r->ev[i].kind, kind);
  ASSERT_UEQ(r->ev[i].buf, b);
  ASSERT_UEQ(r->ev[i].bytes, bytes);
}

static void expect_move(const recorder_t *r, size_t i, spw_buf_t b, spw_state_t from,
                        spw_state_t to, uint64_t bytes) {
  expect_event(r, i, EV_STATE, b, bytes);
  ASSERT_EQ(r->ev[i].from, from);
  ASSERT_EQ(r->ev[i].to, to);
  ASSERT_STATUS(r->ev[i].status, SPW_OK);
}

static void fill(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, size_t n, uint64_t seed) {
  uint8_t *src = malloc(n);
  ASSERT_TRUE(src != NULL);
  test_fill(src, n, seed);
  test_write(rt, b, s, src, n);
  free(src);
}

static void callbacks_see_every_event_with_right_bytes(void) {
  const size_t na = 1000, nb = 70000;
  spw_runtime_t *rt = test_runtime(NULL);
  recorder_t r;
  recorder_init(&r);
  ASSERT_OK(spw_set_controller(rt, &recording, &r));
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t a, b;
  ASSERT_OK(spw_alloc(rt, na, s, &a));
  ASSERT_OK(spw_alloc(rt, nb, s, &b));
  fill(rt, a, s, na, 1);
  ASSERT_OK(spw_spill(rt, a, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  test_expect_fill(rt, a, s, na, 1); /* read-only: a clean host copy is kept */
  ASSERT_OK(spw_spill(rt, a, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  fill(rt, a, s, na, 2); /* writable: moves bytes again */
  ASSERT_OK(spw_free(rt, a));
  ASSERT_OK(spw_free(rt, b));

  pthread_mutex_lock(&r.mu);
  for (size_t i = 0; i < r.n; i++)
    printf("  %d buf %#" PRIx64 " bytes %" PRIu64 " %d->%d status %d\n", r.ev[i].kind,
           r.ev[i].buf, r.ev[i].bytes, r.ev[i].from, r.ev[i].to, r.ev[i].status);
  ASSERT_EQ(r.n, 8);
  expect_event(&r, 0, EV_ALLOC, a, na);
  expect_event(&r, 1, EV_ALLOC, b, nb);
  expect_move(&r, 2, a, SPW_STATE_RESIDENT, SPW_STATE_HOST, na);
  expect_move(&r, 3, a, SPW_STATE_HOST, SPW_STATE_RESIDENT, na);
  expect_move(&r, 4, a, SPW_STATE_RESIDENT, SPW_STATE_HOST, 0); /* clean re-spill */
  expect_move(&r, 5, a, SPW_STATE_HOST, SPW_STATE_RESIDENT, na);
  expect_event(&r, 6, EV_FREE, a, na);
  expect_event(&r, 7, EV_FREE, b, nb);
  pthread_mutex_unlock(&r.mu);
  ASSERT_OK(spw_runtime_destroy(rt));
  pthread_mutex_destroy(&r.mu);
}

/* Three 5 MiB buffers in a 16 MiB budget, then a fourth: 4 MiB must leave the device. The
 * default high watermark (95%) is not crossed once the room is made, so no background spill
 * muddies which buffer went. */
static spw_runtime_t *pressure_runtime(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 16 * MIB;
  cfg.host_device_bytes = 64 * MIB;
  cfg.high_watermark = 0.95;
  cfg.low_watermark = 0.85;
  return test_runtime(&cfg);
}

static void pressure_callback_victims_are_the_ones_spilled(void) {
  const size_t n = 5 * MIB;
  spw_runtime_t *rt = pressure_runtime();
  recorder_t r;
  recorder_init(&r);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[4];
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(spw_alloc(rt, n, s, &b[i]));
    fill(rt, b[i], s, n, 10 + (uint64_t)i);
  }
  /* LRU would pick b[0], the oldest; the controller names the newest. */
  r.victims[0] = b[2];
  r.nvictims = 1;
  ASSERT_OK(spw_set_controller(rt, &recording, &r));
  ASSERT_OK(spw_alloc(rt, n, s, &b[3]));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(count_of(&r, EV_PRESSURE), 1);
  pthread_mutex_lock(&r.mu);
  for (size_t i = 0; i < r.n; i++)
    if (r.ev[i].kind == EV_PRESSURE) ASSERT_UEQ(r.ev[i].bytes, 4 * MIB);
  pthread_mutex_unlock(&r.mu);
  ASSERT_EQ(state_of(rt, b[2]), SPW_STATE_HOST);
  ASSERT_EQ(state_of(rt, b[0]), SPW_STATE_RESIDENT);
  ASSERT_EQ(state_of(rt, b[1]), SPW_STATE_RESIDENT);
  ASSERT_EQ(state_of(rt, b[3]), SPW_STATE_RESIDENT);
  spw_stats_t st = {.struct_size = sizeof st};
  ASSERT_OK(spw_get_stats(rt, &st));
  ASSERT_UEQ(st.spills_on_demand, 1);
  ASSERT_OK(spw_set_controller(rt, NULL, NULL));
  test_expect_fill(rt, b[0], s, n, 10);
  test_expect_fill(rt, b[2], s, n, 12);
  for (int i = 0; i < 4; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
  pthread_mutex_destroy(&r.mu);
}

static void pressure_victims_that_are_locked_are_skipped(void) {
  const size_t n = 5 * MIB;
  spw_runtime_t *rt = pressure_runtime();
  recorder_t r;
  recorder_init(&r);
  spw_stream_t s, sl;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_stream_create(rt, &sl));
  spw_buf_t b[4];
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(spw_alloc(rt, n, s, &b[i]));
    fill(rt, b[i], s, n, 20 + (uint64_t)i);
  }
  /* b[2] is named but locked, and a stale handle is named too: the least recently used
   * unlocked buffer (b[0]) makes up the room. */
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b[2], sl, 0, &d));
  spw_buf_t dead;
  ASSERT_OK(spw_alloc(rt, 4096, s, &dead));
  ASSERT_OK(spw_free(rt, dead));
  r.victims[0] = dead;
  r.victims[1] = b[2];
  r.nvictims = 2;
  ASSERT_OK(spw_set_controller(rt, &recording, &r));
  ASSERT_OK(spw_alloc(rt, n, s, &b[3]));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(count_of(&r, EV_PRESSURE), 1);
  ASSERT_EQ(state_of(rt, b[2]), SPW_STATE_RESIDENT);
  ASSERT_EQ(state_of(rt, b[0]), SPW_STATE_HOST);
  ASSERT_EQ(state_of(rt, b[1]), SPW_STATE_RESIDENT);
  ASSERT_OK(spw_stream_synchronize(rt, sl));
  ASSERT_OK(spw_set_controller(rt, NULL, NULL));
  for (int i = 0; i < 3; i++) test_expect_fill(rt, b[i], s, n, 20 + (uint64_t)i);
  for (int i = 0; i < 4; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
  pthread_mutex_destroy(&r.mu);
}

/* When the trigger buffer's spill completes (on an engine thread), wait on the runtime
 * (refused) and order another spill (accepted). */
static void reentrant_state(void *u, const spw_state_event_t *e) {
  recorder_t *r = u;
  if (e->buf != r->trigger || e->to != SPW_STATE_HOST || r->reentered) return;
  r->reentered = 1;
  r->wait_idle_status = spw_wait_idle(r->rt);
  r->sync_status = spw_stream_synchronize(r->rt, r->stream);
  r->reserve_status = spw_host_reserve(r->rt, 1 << 20);
  r->spill_status = spw_spill(r->rt, r->other, SPW_TIER_HOST);
}

static void callback_wait_is_refused_and_spill_works(void) {
  const size_t n = 256 * 1024 + 5;
  spw_runtime_t *rt = test_runtime(NULL);
  recorder_t r;
  recorder_init(&r);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_alloc(rt, n, s, &r.trigger));
  ASSERT_OK(spw_alloc(rt, n, s, &r.other));
  fill(rt, r.trigger, s, n, 30);
  fill(rt, r.other, s, n, 31);
  r.rt = rt;
  r.stream = s;
  r.wait_idle_status = r.sync_status = r.spill_status = r.reserve_status = 1;
  const spw_controller_t c = {sizeof c, NULL, NULL, reentrant_state, NULL};
  ASSERT_OK(spw_set_controller(rt, &c, &r));
  ASSERT_OK(spw_spill(rt, r.trigger, SPW_TIER_HOST));
  /* The spill ordered from the callback is queued before the engine goes idle. */
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(r.reentered, 1);
  ASSERT_STATUS(r.wait_idle_status, SPW_ERR_WOULD_DEADLOCK);
  ASSERT_STATUS(r.sync_status, SPW_ERR_WOULD_DEADLOCK);
  ASSERT_STATUS(r.reserve_status, SPW_ERR_WOULD_DEADLOCK); /* it blocks while it pins */
  ASSERT_STATUS(r.spill_status, SPW_OK);
  ASSERT_EQ(state_of(rt, r.other), SPW_STATE_HOST);
  ASSERT_OK(spw_set_controller(rt, NULL, NULL));
  test_expect_fill(rt, r.trigger, s, n, 30);
  test_expect_fill(rt, r.other, s, n, 31);
  ASSERT_OK(spw_free(rt, r.trigger));
  ASSERT_OK(spw_free(rt, r.other));
  ASSERT_OK(spw_runtime_destroy(rt));
  pthread_mutex_destroy(&r.mu);
}

static void removing_controller_stops_callbacks(void) {
  const size_t n = 64 * 1024;
  spw_runtime_t *rt = pressure_runtime();
  recorder_t r;
  recorder_init(&r);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_set_controller(rt, &recording, &r));
  spw_buf_t a;
  ASSERT_OK(spw_alloc(rt, n, s, &a));
  ASSERT_EQ(r.n, 1);
  ASSERT_OK(spw_set_controller(rt, NULL, NULL));
  /* Everything that made an event before: allocation, spills explicit and on demand,
   * unspill, free. */
  spw_buf_t big[4];
  for (int i = 0; i < 4; i++) ASSERT_OK(spw_alloc(rt, 5 * MIB, s, &big[i]));
  ASSERT_OK(spw_spill(rt, a, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  fill(rt, a, s, n, 40);
  ASSERT_OK(spw_free(rt, a));
  for (int i = 0; i < 4; i++) ASSERT_OK(spw_free(rt, big[i]));
  ASSERT_OK(spw_wait_idle(rt));
  spw_stats_t st = {.struct_size = sizeof st};
  ASSERT_OK(spw_get_stats(rt, &st));
  ASSERT_GE(st.spills, 2); /* the events did happen */
  ASSERT_EQ(r.n, 1);
  ASSERT_OK(spw_runtime_destroy(rt));
  pthread_mutex_destroy(&r.mu);
}

static const spw_test_t tests[] = {
    TEST(callbacks_see_every_event_with_right_bytes),
    TEST(pressure_callback_victims_are_the_ones_spilled),
    TEST(pressure_victims_that_are_locked_are_skipped),
    TEST(callback_wait_is_refused_and_spill_works),
    TEST(removing_controller_stops_callbacks),
};
TEST_MAIN(tests)
