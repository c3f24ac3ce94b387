/* SPDX-License-Identifier: Apache-2.0 */
/* Hints have a bounded cost, however often they are sent (issue 17: a burst of prefetch and
 * spill hints queued without bound, and the engine then thrashed for minutes carrying out
 * each one in turn, every prefetch pushing out what the one before brought in).
 *
 * The rules under test (docs/design.md, "Hints"): one pending wish per buffer (a repeat
 * merges, a different one replaces it); a prefetch brings in only what can stay and never
 * pushes out buffers that a prefetch brought in and nobody has acquired yet; the rest of a
 * request that does not fit is dropped and counted; spw_wait_idle waits for the work queued
 * before it and not for work other threads keep sending.
 *
 * To make hints pile up deterministically, a gate holds one of the engine's streams: the
 * lane blocks on its first job, and every hint sent meanwhile queues behind it. */
#include <pthread.h>
#include <stdatomic.h>

#include "gate.h"
#include "moves.h"
#include "test_main.h"
#include "test_util.h"

#define MIB ((size_t)1 << 20)
enum { NB = 16 };

typedef struct fixture {
  spw_runtime_t *rt;
  spw_stream_t s;
  spw_buf_t b[NB];
} fixture_t;

/* An 8 MiB budget (high watermark 95%: seven 1 MiB buffers stay) and NB buffers of 1 MiB,
 * all spilled to host. */
static fixture_t fixture_on_host(void) {
  fixture_t f;
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 8 * MIB;
  f.rt = test_runtime(&cfg);
  ASSERT_OK(spw_stream_create(f.rt, &f.s));
  for (int i = 0; i < NB; i++) {
    f.b[i] = test_filled(f.rt, f.s, MIB, 100 + (uint64_t)i);
    ASSERT_OK(spw_spill(f.rt, f.b[i], SPW_TIER_HOST));
  }
  ASSERT_OK(spw_wait_idle(f.rt));
  for (int i = 0; i < NB; i++) ASSERT_EQ(state_of(f.rt, f.b[i]), SPW_STATE_HOST);
  return f;
}

static void fixture_close(fixture_t *f) {
  for (int i = 0; i < NB; i++) test_expect_fill(f->rt, f->b[i], f->s, MIB, 100 + (uint64_t)i);
  for (int i = 0; i < NB; i++) ASSERT_OK(spw_free(f->rt, f->b[i]));
  ASSERT_OK(spw_runtime_destroy(f->rt));
}

/* Waits (with a deadline) until buffer b is in state st. */
static void await_state(spw_runtime_t *rt, spw_buf_t b, spw_state_t st) {
  for (uint64_t t0 = test_now_ms(); state_of(rt, b) != st && test_now_ms() - t0 < 5000;)
    test_sleep_ms(1);
  ASSERT_EQ(state_of(rt, b), st);
}

/* Closes the gate on one of the engine's streams (spw__d2h: the download lane's copies,
 * spw__h2d: the upload lane's) and returns once the stream waits at it: what a lane enqueues
 * there from now on waits until gate_open. */
static void hold_stream(fixture_t *f, gate_t *g, spw_stream_t lane) {
  gate_init(g);
  ASSERT_OK(f->rt->ops->launch_host_func(f->rt->be, lane, gate_wait, g));
  gate_await_entered(g);
}

/* Holds the upload lane: prefetches b, whose copy waits behind the gate on the upload
 * stream, and returns once the lane has taken it. */
static void hold_upload_lane(fixture_t *f, gate_t *g, spw_buf_t b) {
  hold_stream(f, g, spw__h2d(f->rt));
  ASSERT_OK(spw_prefetch(f->rt, b, f->s));
  await_state(f->rt, b, SPW_STATE_UNSPILLING);
}

static void duplicate_handles_in_one_request_move_once(void) {
  fixture_t f = fixture_on_host();
  spw_buf_t many[4 * 100];
  for (int i = 0; i < 4 * 100; i++) many[i] = f.b[i % 4];
  const spw_stats_t before = stats_of(f.rt);
  ASSERT_OK(spw_prefetch_n(f.rt, many, 4 * 100, f.s));
  ASSERT_OK(spw_wait_idle(f.rt));
  const spw_stats_t after = stats_of(f.rt);
  ASSERT_EQ(test_count_in(f.rt, f.b, 4, SPW_STATE_RESIDENT), 4);
  ASSERT_UEQ(after.unspills - before.unspills, 4);
  ASSERT_UEQ(after.hints_merged - before.hints_merged, 4 * 100 - 4);
  ASSERT_UEQ(after.hints_pending, 0);
  fixture_close(&f);
}

/* The burst of the issue, held still: 50 prefetches of every buffer queue while the upload
 * lane is busy. They are one request of NB buffers; what fits comes in, once; nothing is
 * pushed out to make room for more, and the rest is dropped. */
static void a_burst_of_prefetches_moves_each_buffer_at_most_once(void) {
  fixture_t f = fixture_on_host();
  gate_t g;
  hold_upload_lane(&f, &g, f.b[0]);
  const spw_stats_t before = stats_of(f.rt);
  for (int round = 0; round < 50; round++) ASSERT_OK(spw_prefetch_n(f.rt, f.b, NB, f.s));
  ASSERT_UEQ(stats_of(f.rt).hints_pending, NB);
  gate_open(&g);
  ASSERT_OK(spw_wait_idle(f.rt));
  const spw_stats_t after = stats_of(f.rt);
  const int resident = (int)test_count_in(f.rt, f.b, NB, SPW_STATE_RESIDENT);
  printf("  %d resident, %llu unspills, %llu dropped, %llu merged\n", resident,
         (unsigned long long)(after.unspills - before.unspills),
         (unsigned long long)(after.prefetch_dropped - before.prefetch_dropped),
         (unsigned long long)(after.hints_merged - before.hints_merged));
  ASSERT_UEQ(after.unspills - before.unspills, (uint64_t)resident); /* each once, b[0] too */
  ASSERT_UEQ(after.spills, before.spills);                  /* no prefetch evicted another */
  ASSERT_LE((uint64_t)resident * MIB, after.device_limit * 95 / 100); /* what can stay */
  ASSERT_UEQ(after.prefetch_dropped - before.prefetch_dropped, NB - (uint64_t)resident);
  /* b[0], taken by the lane, is queued again by the first round (the next run finds it
   * resident): every later round merges. */
  ASSERT_UEQ(after.hints_merged - before.hints_merged, 49 * NB);
  ASSERT_UEQ(after.failures, 0);
  ASSERT_UEQ(after.hints_pending, 0);
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_fini(&g);
  fixture_close(&f);
}

/* Spill hints merge the same way: a buffer asked to spill 200 times spills once. */
static void repeated_spill_hints_spill_once(void) {
  fixture_t f = fixture_on_host();
  ASSERT_OK(spw_acquire(f.rt, f.b[1], f.s, 0, &(void *){NULL}));
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  /* Holds the download lane: the spill of b[2] waits behind the gate. */
  ASSERT_OK(spw_acquire(f.rt, f.b[2], f.s, 0, &(void *){NULL}));
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  gate_t g;
  hold_stream(&f, &g, spw__d2h(f.rt));
  ASSERT_OK(spw_spill(f.rt, f.b[2], SPW_TIER_HOST));
  await_state(f.rt, f.b[2], SPW_STATE_SPILLING);
  const spw_stats_t before = stats_of(f.rt);
  spw_buf_t same[100];
  for (int i = 0; i < 100; i++) same[i] = f.b[1];
  for (int i = 0; i < 100; i++) ASSERT_OK(spw_spill(f.rt, f.b[1], SPW_TIER_HOST));
  ASSERT_OK(spw_spill_n(f.rt, same, 100, SPW_TIER_HOST));
  gate_open(&g);
  ASSERT_OK(spw_wait_idle(f.rt));
  const spw_stats_t after = stats_of(f.rt);
  ASSERT_EQ(state_of(f.rt, f.b[1]), SPW_STATE_HOST);
  ASSERT_UEQ(after.spills - before.spills, 2); /* b[2] and b[1], once each */
  ASSERT_UEQ(after.hints_merged - before.hints_merged, 199);
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_fini(&g);
  fixture_close(&f);
}

/* The newest wish wins: a spill to disk of b[1] queued behind the busy download lane, then
 * a prefetch of it (in one of two forms), and b[1] stays on the device. */
static void newer_prefetch_replaces_a_queued_spill(int (*prefetch)(fixture_t *, spw_buf_t)) {
  fixture_t f = fixture_on_host();
  ASSERT_OK(spw_acquire(f.rt, f.b[1], f.s, 0, &(void *){NULL}));
  ASSERT_OK(spw_acquire(f.rt, f.b[2], f.s, 0, &(void *){NULL}));
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  gate_t g;
  hold_stream(&f, &g, spw__d2h(f.rt));
  ASSERT_OK(spw_spill(f.rt, f.b[2], SPW_TIER_HOST)); /* holds the download lane */
  await_state(f.rt, f.b[2], SPW_STATE_SPILLING);
  const spw_stats_t before = stats_of(f.rt);
  ASSERT_OK(spw_spill_n(f.rt, &f.b[1], 1, SPW_TIER_DISK));
  ASSERT_OK(prefetch(&f, f.b[1])); /* replaces the spill */
  gate_open(&g);
  ASSERT_OK(spw_wait_idle(f.rt));
  const spw_stats_t after = stats_of(f.rt);
  ASSERT_EQ(state_of(f.rt, f.b[1]), SPW_STATE_RESIDENT);
  ASSERT_UEQ(after.hints_replaced - before.hints_replaced, 1);
  ASSERT_UEQ(after.spills - before.spills, 1); /* b[2] only */
  ASSERT_UEQ(after.hints_pending, 0);
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_fini(&g);
  fixture_close(&f);
}

static int prefetch_n_of_one(fixture_t *f, spw_buf_t b) { return spw_prefetch_n(f->rt, &b, 1, f->s); }
static int prefetch_one(fixture_t *f, spw_buf_t b) { return spw_prefetch(f->rt, b, f->s); }

/* The newest wish wins: the buffer stays on the device. */
static void a_newer_hint_replaces_an_older_one(void) {
  newer_prefetch_replaces_a_queued_spill(prefetch_n_of_one);
}

/* The same when the prefetch finds the buffer already resident and has nothing to move: it
 * is still the newest wish, and the pending spill is cancelled. */
static void a_prefetch_of_a_resident_buffer_cancels_its_pending_spill(void) {
  newer_prefetch_replaces_a_queued_spill(prefetch_one);
}

/* The upload lane takes b[0] (its copy waits behind a gate) with b[1] (resident: nothing
 * to do); `meanwhile` moves b[1] off the device and prefetches it again. Both must end on
 * the device, with nothing pending. */
static void lane_passes_b1_then(void (*meanwhile)(fixture_t *)) {
  fixture_t f = fixture_on_host();
  ASSERT_OK(spw_acquire(f.rt, f.b[1], f.s, 0, &(void *){NULL}));
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  gate_t g;
  hold_stream(&f, &g, spw__h2d(f.rt));
  const spw_buf_t two[2] = {f.b[0], f.b[1]};
  ASSERT_OK(spw_prefetch_n(f.rt, two, 2, f.s));
  await_state(f.rt, f.b[0], SPW_STATE_UNSPILLING); /* the lane took both, and waits */
  meanwhile(&f);
  gate_open(&g);
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_EQ(state_of(f.rt, f.b[0]), SPW_STATE_RESIDENT);
  ASSERT_EQ(state_of(f.rt, f.b[1]), SPW_STATE_RESIDENT);
  ASSERT_UEQ(stats_of(f.rt).hints_pending, 0);
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_fini(&g);
  fixture_close(&f);
}

static void spill_b1_and_prefetch_it(fixture_t *f) {
  ASSERT_OK(spw_spill(f->rt, f->b[1], SPW_TIER_HOST)); /* the download lane is free */
  await_state(f->rt, f->b[1], SPW_STATE_HOST);
  ASSERT_OK(spw_prefetch(f->rt, f->b[1], f->s)); /* the newest wish: back on the device */
}

/* A wish that comes back while a lane still works on an equal, older one is a new wish: the
 * lane that finishes the older one must not settle it. The upload lane takes b[0] (its copy
 * waits behind a gate) with b[1] (resident: nothing to do); meanwhile b[1] is spilled to host
 * on the download lane and prefetched again, which queues it for the upload lane's next run.
 * The older prefetch's end used to clear the newer one (their wishes compared equal), and
 * b[1] stayed on host. */
static void a_wish_renewed_while_its_lane_works_is_carried_out(void) {
  lane_passes_b1_then(spill_b1_and_prefetch_it);
}

static void push_b1_out_and_prefetch_it(fixture_t *f) {
  spw_buf_t big;
  ASSERT_OK(spw_alloc(f->rt, 7 * MIB, f->s, &big)); /* b[1] is the one victim */
  ASSERT_OK(spw_free(f->rt, big));
  ASSERT_EQ(state_of(f->rt, f->b[1]), SPW_STATE_HOST);
  ASSERT_OK(spw_prefetch(f->rt, f->b[1], f->s));
}

/* A hint equal to one whose lane has already taken the buffer may come after the lane has
 * passed it: it is queued again, not merged. The upload lane takes b[0] (its copy waits
 * behind a gate) with b[1] (resident: nothing to do); then an allocation pushes b[1] out on
 * demand, and b[1] is prefetched. Merged with the taken wish, that prefetch was lost when the
 * run ended, and b[1] stayed on host. */
static void a_hint_after_its_lane_passed_the_buffer_is_carried_out(void) {
  lane_passes_b1_then(push_b1_out_and_prefetch_it);
}

/* Prefetches b[0..k) and waits: all of them come back (k at most 7 fits below the high
 * watermark). */
static void prefetch_first(fixture_t *f, int k) {
  ASSERT_OK(spw_prefetch_n(f->rt, f->b, (size_t)k, f->s));
  ASSERT_OK(spw_wait_idle(f->rt));
  ASSERT_EQ(test_count_in(f->rt, f->b, k, SPW_STATE_RESIDENT), k);
}

/* A prefetch makes room only from buffers nobody said they would use next: what an earlier
 * prefetch brought in stays until it is acquired; once acquired, it is an ordinary victim. */
static void a_prefetch_never_pushes_out_an_unconsumed_prefetch(void) {
  fixture_t f = fixture_on_host();
  prefetch_first(&f, 6);
  const spw_stats_t before = stats_of(f.rt);
  ASSERT_OK(spw_prefetch_n(f.rt, f.b + 6, 6, f.s));
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_EQ(test_count_in(f.rt, f.b, 6, SPW_STATE_RESIDENT), 6);   /* all still there */
  ASSERT_EQ(test_count_in(f.rt, f.b + 6, 6, SPW_STATE_RESIDENT), 1); /* 7 MiB stay below 7.6 */
  ASSERT_UEQ(stats_of(f.rt).prefetch_dropped - before.prefetch_dropped, 5);
  ASSERT_UEQ(stats_of(f.rt).spills, before.spills);
  /* b[0] is used: consumed, it may now make room for the next prefetch. */
  void *d;
  ASSERT_OK(spw_acquire(f.rt, f.b[0], f.s, SPW_ACQUIRE_READ, &d));
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  ASSERT_OK(spw_prefetch_n(f.rt, f.b + 6, 6, f.s));
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_TRUE(state_of(f.rt, f.b[0]) != SPW_STATE_RESIDENT);
  ASSERT_EQ(test_count_in(f.rt, f.b + 1, 5, SPW_STATE_RESIDENT), 5);
  ASSERT_EQ(test_count_in(f.rt, f.b + 6, 6, SPW_STATE_RESIDENT), 2);
  fixture_close(&f);
}

/* Prefetched buffers are protected from prefetches only: an allocation that needs their
 * room gets it. */
static void an_allocation_may_push_out_prefetched_buffers(void) {
  fixture_t f = fixture_on_host();
  prefetch_first(&f, 7);
  spw_buf_t big;
  ASSERT_OK(spw_alloc(f.rt, 4 * MIB, f.s, &big));
  ASSERT_LE(test_count_in(f.rt, f.b, 7, SPW_STATE_RESIDENT), 4);
  ASSERT_OK(spw_free(f.rt, big));
  fixture_close(&f);
}

/* Room made ahead in the background is a guess, and never undoes a prefetch: with only
 * prefetched buffers to take, a background pass above the high watermark leaves them (an
 * allocation that needs their room still takes it, above). */
static void the_background_never_spills_an_unconsumed_prefetch(void) {
  fixture_t f = fixture_on_host();
  prefetch_first(&f, 7);
  const spw_stats_t before = stats_of(f.rt);
  spw_buf_t x; /* 8 MiB in use, past the high watermark (7.6): the background pass runs */
  void *d;
  ASSERT_OK(spw_alloc(f.rt, MIB, f.s, &x));
  ASSERT_OK(spw_acquire(f.rt, x, f.s, 0, &d)); /* locked: no victim either */
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_EQ(test_count_in(f.rt, f.b, 7, SPW_STATE_RESIDENT), 7);
  ASSERT_UEQ(stats_of(f.rt).spills, before.spills);
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  ASSERT_OK(spw_free(f.rt, x));
  fixture_close(&f);
}

/* Past the low watermark, prefetches have the download lane make room ahead of them, so that
 * the next prefetch's copy in need not wait for its own room's copy out; it takes buffers
 * that no prefetch brought back, and only down to the low watermark. */
static void prefetches_past_the_low_watermark_get_room_made_in_the_background(void) {
  fixture_t f = fixture_on_host();
  for (int i = 0; i < 6; i++) { /* 6 MiB acquired back: under the low watermark (6.8) */
    void *d;
    ASSERT_OK(spw_acquire(f.rt, f.b[i], f.s, 0, &d));
  }
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  const spw_stats_t before = stats_of(f.rt);
  ASSERT_OK(spw_prefetch(f.rt, f.b[6], f.s)); /* 7 MiB: past it, under the high one */
  ASSERT_OK(spw_wait_idle(f.rt));
  for (uint64_t t0 = test_now_ms();
       stats_of(f.rt).spills_background == before.spills_background && test_now_ms() - t0 < 5000;)
    test_sleep_ms(1);
  ASSERT_OK(spw_wait_idle(f.rt));
  const spw_stats_t after = stats_of(f.rt);
  ASSERT_UEQ(after.spills_background - before.spills_background, 1);
  ASSERT_UEQ(after.spills_on_demand, before.spills_on_demand);
  ASSERT_EQ(state_of(f.rt, f.b[6]), SPW_STATE_RESIDENT); /* the prefetched one stays */
  ASSERT_EQ(test_count_in(f.rt, f.b, 6, SPW_STATE_RESIDENT), 5);
  ASSERT_LE(after.device_bytes, after.device_limit * 85 / 100);
  fixture_close(&f);
}

/* Host memory is pinned ahead for spilled data, not for the clean copies that prefetched
 * buffers keep (or extents freed behind copies still landing): those come and go as
 * buffers move, and a slab pinned for them is a guess that costs the transfers running
 * meanwhile (docs/design.md, "Pinned host arena"). 34 MiB spilled into the host backend's
 * first 64 MiB slab; 6 prefetched back, three at a time, keep their copies there: 30 MiB
 * free, less than half a slab, but at most 31 MiB of data when the step looks (the first
 * three are out of the spilled data by then). */
static void host_memory_is_pinned_ahead_for_spilled_data_not_clean_copies(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST, "sized for the host backend's 64 MiB slabs");
  enum { N = 34, BACK = 6 };
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 8 * MIB;
  spw_runtime_t *rt = test_runtime(&cfg);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[N];
  for (int i = 0; i < N; i++) {
    b[i] = test_filled(rt, s, MIB, 300 + (uint64_t)i);
    ASSERT_OK(spw_spill(rt, b[i], SPW_TIER_HOST));
  }
  spw_buf_t stays = test_filled(rt, s, MIB, 299); /* resident, for the room to be made from */
  ASSERT_OK(spw_wait_idle(rt));
  const spw_stats_t before = stats_of(rt);
  ASSERT_UEQ(before.host_pinned_bytes, 64 * MIB);
  /* 4 MiB on the device, half the limit: the down lane's background step pins ahead only
   * past it. Then 7 MiB: past it and past the low watermark (the step runs to make room). */
  ASSERT_OK(spw_prefetch_n(rt, b, BACK / 2, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_prefetch_n(rt, b + BACK / 2, BACK / 2, s));
  for (uint64_t t0 = test_now_ms();
       stats_of(rt).spills_background == before.spills_background && test_now_ms() - t0 < 5000;)
    test_sleep_ms(1);
  ASSERT_OK(spw_wait_idle(rt));
  const spw_stats_t after = stats_of(rt);
  ASSERT_UEQ(after.spills_background - before.spills_background, 1); /* the step ran */
  ASSERT_EQ(state_of(rt, stays), SPW_STATE_HOST);
  ASSERT_EQ(test_count_in(rt, b, BACK, SPW_STATE_RESIDENT), BACK);
  ASSERT_UEQ(after.host_pinned_bytes, before.host_pinned_bytes);
  test_expect_fill(rt, stays, s, MIB, 299);
  for (int i = 0; i < N; i++) test_expect_fill(rt, b[i], s, MIB, 300 + (uint64_t)i);
  ASSERT_OK(spw_free(rt, stays));
  for (int i = 0; i < N; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* Hints sent by other threads without pause cannot hold spw_wait_idle back: it waits for
 * what was queued before it. */
typedef struct sender {
  fixture_t *f;
  atomic_int stop;
  uint64_t seed;
} sender_t;

static void *send_hints(void *arg) {
  sender_t *s = arg;
  uint64_t x = s->seed;
  spw_buf_t pick[4];
  while (!atomic_load(&s->stop)) {
    for (int i = 0; i < 4; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      pick[i] = s->f->b[(x >> 33) % NB];
    }
    if ((x >> 20) & 1) ASSERT_OK(spw_prefetch_n(s->f->rt, pick, 4, s->f->s));
    else ASSERT_OK(spw_spill_n(s->f->rt, pick, 4, SPW_TIER_HOST));
  }
  return NULL;
}

typedef struct waiter {
  spw_runtime_t *rt;
  atomic_int done;
  int status;
} waiter_t;

static void *wait_idle_main(void *arg) {
  waiter_t *w = arg;
  w->status = spw_wait_idle(w->rt);
  atomic_store(&w->done, 1);
  return NULL;
}

static void wait_idle_returns_while_other_threads_keep_sending_hints(void) {
  fixture_t f = fixture_on_host();
  sender_t s[2] = {{&f, 0, 1}, {&f, 0, 2}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_create(&t[i], NULL, send_hints, &s[i]), 0);
  for (int round = 0; round < 20; round++) {
    waiter_t w = {f.rt, 0, -1};
    pthread_t wt;
    ASSERT_EQ(pthread_create(&wt, NULL, wait_idle_main, &w), 0);
    /* A deadline for liveness only: the wait is one run of each lane. */
    for (uint64_t t0 = test_now_ms(); !atomic_load(&w.done) && test_now_ms() - t0 < 30000;)
      test_sleep_ms(1);
    ASSERT_EQ(atomic_load(&w.done), 1);
    ASSERT_EQ(pthread_join(wt, NULL), 0);
    ASSERT_OK(w.status);
  }
  for (int i = 0; i < 2; i++) atomic_store(&s[i].stop, 1);
  for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  ASSERT_OK(spw_wait_idle(f.rt));
  /* Once idle, nothing moves any more. */
  const spw_stats_t a = stats_of(f.rt);
  test_sleep_ms(50);
  const spw_stats_t b = stats_of(f.rt);
  ASSERT_UEQ(a.spill_bytes, b.spill_bytes);
  ASSERT_UEQ(a.unspill_bytes, b.unspill_bytes);
  ASSERT_UEQ(b.hints_pending, 0);
  fixture_close(&f);
}

static const spw_test_t tests[] = {
    TEST(duplicate_handles_in_one_request_move_once),
    TEST(a_burst_of_prefetches_moves_each_buffer_at_most_once),
    TEST(repeated_spill_hints_spill_once),
    TEST(a_newer_hint_replaces_an_older_one),
    TEST(a_prefetch_of_a_resident_buffer_cancels_its_pending_spill),
    TEST(a_wish_renewed_while_its_lane_works_is_carried_out),
    TEST(a_hint_after_its_lane_passed_the_buffer_is_carried_out),
    TEST(a_prefetch_never_pushes_out_an_unconsumed_prefetch),
    TEST(an_allocation_may_push_out_prefetched_buffers),
    TEST(the_background_never_spills_an_unconsumed_prefetch),
    TEST(prefetches_past_the_low_watermark_get_room_made_in_the_background),
    TEST(host_memory_is_pinned_ahead_for_spilled_data_not_clean_copies),
    TEST(wait_idle_returns_while_other_threads_keep_sending_hints),
};

TEST_MAIN(tests)
