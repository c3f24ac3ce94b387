/* SPDX-License-Identifier: Apache-2.0 */
/* An acquire that abandons a spill in progress: the buffer stays where it was, every write
 * made after the abandon survives the next spill, and the spiller keeps the buffer (its
 * MOVING flag) until it lets go, so nobody else may spill or free it under its copy. The
 * spill is put in progress by claiming the victim through the state machine's seam
 * (spw__victim_claim), and the download stream is held still with a gate where a copy must
 * be in flight, so interleavings that are otherwise a matter of timing happen on every
 * run. Both backends. */
#include <pthread.h>
#include <stdatomic.h>

#include "gate.h"
#include "moves.h"
#include "test_main.h"
#include "test_util.h"
#include "fixture.h" /* last: see its header */

#define BYTES (256 * 1024)

static void write_pattern(spw_buf_t b, uint64_t seed) {
  static uint8_t src[BYTES];
  test_fill(src, BYTES, seed);
  test_write(rt, b, s, src, BYTES);
}

/* A new buffer of BYTES holding test_fill(seed), on the fixture's runtime (fixture.h). */
static spw_buf_t written(uint64_t seed) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, BYTES, s, &b));
  write_pattern(b, seed);
  return b;
}

static size_t mismatch(spw_buf_t b, uint64_t seed) {
  static uint8_t got[BYTES];
  test_read(rt, b, s, got, BYTES);
  return test_first_mismatch(got, BYTES, seed);
}

static spw_victim_t claim(spw_buf_t b) {
  spw_slot_t *slot;
  uint64_t w;
  spw_victim_t v;
  ASSERT_OK(spw__handles_lookup(&rt->handles, b, &slot, &w));
  ASSERT_TRUE(spw__victim_claim(rt, b, slot, SPW_CLAIM_WAIT, &v));
  spw_state_t st;
  ASSERT_OK(spw_buf_state(rt, b, &st));
  ASSERT_EQ(st, SPW_STATE_SPILLING);
  return v;
}

/* The lost update: a buffer with a clean host copy is being spilled (moving no bytes), a
 * writable acquire takes it back and writes; the next spill must copy those writes, not
 * trust the stale clean copy. */
static void writes_after_abandoning_a_clean_spill_survive(void) {
  spw_buf_t b = written(1);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(mismatch(b, 1), (size_t)-1); /* read-only: keeps a clean host copy */

  spw_victim_t v = claim(b);
  ASSERT_TRUE(v.m.flags & SPW_W_CLEAN);
  write_pattern(b, 2); /* abandons the spill, then writes */
  spw__spill_batch(rt, &v, 1, SPW_SPILL_EXPLICIT);
  ASSERT_EQ(v.status, SPW_ERR_BUSY); /* the abandoned spill committed nothing */

  spw_stats_t before = {.struct_size = sizeof before}, after = {.struct_size = sizeof after};
  ASSERT_OK(spw_get_stats(rt, &before));
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_get_stats(rt, &after));
  ASSERT_UEQ(after.spill_bytes - before.spill_bytes, BYTES); /* the writes were copied */
  ASSERT_UEQ(after.clean_respills, before.clean_respills);
  ASSERT_EQ(mismatch(b, 2), (size_t)-1);
}

/* A dirty spill abandoned by a writable acquire: the device copy stays authoritative. */
static void writes_after_abandoning_a_dirty_spill_survive(void) {
  spw_buf_t b = written(3);
  spw_victim_t v = claim(b);
  ASSERT_TRUE(!(v.m.flags & SPW_W_CLEAN));
  write_pattern(b, 4);
  spw__spill_batch(rt, &v, 1, SPW_SPILL_EXPLICIT);
  ASSERT_EQ(v.status, SPW_ERR_BUSY);
  spw_tier_t tier;
  ASSERT_OK(spw_buf_tier(rt, b, &tier));
  ASSERT_EQ(tier, SPW_TIER_DEVICE);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(mismatch(b, 4), (size_t)-1);
}

/* Issue 7: a victim abandoned, unlocked and claimed again by a second spiller, who
 * committed it (device memory freed, pointer NULL) while the first spiller had still to
 * copy from it. The first claim now holds the buffer until its spiller lets go. */
static void an_abandoned_victim_cannot_be_claimed_again_until_its_spiller_lets_go(void) {
  spw_buf_t b = written(5);
  spw_victim_t first = claim(b);
  ASSERT_EQ(mismatch(b, 5), (size_t)-1); /* abandons, reads, releases */
  spw_slot_t *slot;
  uint64_t w;
  spw_victim_t second;
  ASSERT_OK(spw__handles_lookup(&rt->handles, b, &slot, &w));
  ASSERT_TRUE(!spw__victim_claim(rt, b, slot, SPW_CLAIM_WAIT, &second));
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST)); /* queued: the engine finds it taken */
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  spw__spill_batch(rt, &first, 1, SPW_SPILL_EXPLICIT);
  ASSERT_EQ(first.status, SPW_ERR_BUSY);
  second = claim(b); /* let go: claimable again, and it spills */
  spw__spill_batch(rt, &second, 1, SPW_SPILL_EXPLICIT);
  ASSERT_OK(second.status);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  ASSERT_EQ(mismatch(b, 5), (size_t)-1);
}

/* Issue 7: a victim abandoned, unlocked and freed had its device memory returned at once
 * and reused by a prefetch while the spiller still read it. The free now waits for the
 * spiller: the handle is dead at once, the memory goes when the spiller lets go. */
static void free_of_an_abandoned_victim_waits_for_its_spiller(void) {
  spw_buf_t b = written(6);
  spw_victim_t v = claim(b);
  ASSERT_EQ(mismatch(b, 6), (size_t)-1);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_STATUS(spw_buf_size(rt, b, &(size_t){0}), SPW_ERR_FREED);
  spw_stats_t held = stats_of(rt);
  ASSERT_UEQ(held.device_bytes, BYTES); /* still the spiller's */
  spw__spill_batch(rt, &v, 1, SPW_SPILL_EXPLICIT);
  ASSERT_EQ(v.status, SPW_ERR_BUSY);
  spw_stats_t gone = stats_of(rt);
  ASSERT_UEQ(gone.device_bytes, 0);
  ASSERT_UEQ(gone.buffers, 0);
}

typedef struct spiller {
  spw_runtime_t *rt;
  spw_victim_t *v;
  spw_stream_t d2h; /* the down stream its copy goes on */
} spiller_t;

static void *spill_main(void *arg) {
  spiller_t *sp = arg;
  spw__spill_claiming(sp->rt, sp->v, 1, NULL, SPW_SPILL_EXPLICIT, sp->d2h);
  return NULL;
}

static void count_copy(void *arg, spw_fault_t op, spw_stream_t stream) {
  (void)op;
  (void)stream;
  atomic_fetch_add((atomic_int *)arg, 1);
}

static void set_flag(void *arg) { atomic_store((atomic_int *)arg, 1); }

/* A spill of b whose copy is enqueued on down stream `d2h` (the lane's, or a slice's) but
 * held there behind a gate, by a spiller thread that waits for it. */
typedef struct held_spill {
  gate_t g;
  atomic_int copies;
  spw_victim_t v;
  spiller_t sp;
  pthread_t t;
} held_spill_t;

static void held_spill_start_on(held_spill_t *h, spw_buf_t b, spw_stream_t d2h) {
  gate_init(&h->g);
  atomic_init(&h->copies, 0);
  ASSERT_OK(rt->ops->launch_host_func(rt->be, d2h, gate_wait, &h->g));
  spw__faults_hook(rt->be, SPW_FAULT_COPY, count_copy, &h->copies);
  h->v = claim(b);
  h->sp = (spiller_t){rt, &h->v, d2h};
  ASSERT_EQ(pthread_create(&h->t, NULL, spill_main, &h->sp), 0);
  for (uint64_t t0 = test_now_ms(); atomic_load(&h->copies) == 0 && test_now_ms() - t0 < 5000;)
    test_sleep_ms(1);
  spw__faults_hook(rt->be, SPW_FAULT_COPY, NULL, NULL);
  ASSERT_EQ(atomic_load(&h->copies), 1);
}

static void held_spill_start(held_spill_t *h, spw_buf_t b) {
  held_spill_start_on(h, b, spw__d2h(rt));
}

/* Work enqueued on `stream` now runs only once the held copy is let go; then the spill
 * ends abandoned. */
static void runs_behind_the_held_copy(held_spill_t *h, spw_stream_t stream) {
  atomic_int ran = 0;
  ASSERT_OK(spw_launch_host_func(rt, stream, set_flag, &ran));
  test_sleep_ms(100);
  ASSERT_EQ(atomic_load(&ran), 0); /* behind the spill copy */
  gate_open(&h->g);
  ASSERT_OK(spw_stream_synchronize(rt, stream));
  ASSERT_EQ(atomic_load(&ran), 1);
  ASSERT_EQ(pthread_join(h->t, NULL), 0);
  ASSERT_EQ(h->v.status, SPW_ERR_BUSY);
  ASSERT_TRUE(!gate_timed_out(&h->g));
  gate_fini(&h->g);
}

/* Issue 7: an acquire that abandoned a spill whose copy was already enqueued returned at
 * once, and the application's writes raced with the copy still reading the buffer. Now the
 * acquiring stream waits for that copy: with the download stream held behind a gate, work
 * enqueued after the acquire does not run until the gate opens. */
static void work_after_an_abandon_waits_for_the_spill_copy(void) {
  spw_buf_t b = written(7);
  held_spill_t h;
  held_spill_start(&h, b);
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d)); /* abandons; the copy is enqueued, held */
  runs_behind_the_held_copy(&h, s);
  ASSERT_EQ(mismatch(b, 7), (size_t)-1);
  ASSERT_OK(spw_free(rt, b));
}

/* The abandoning acquire's stream waits for the spill copy, but that lock may be gone
 * before the wait has run: here an all-or-nothing acquire abandons the spill of its first
 * buffer, then fails on the second (not on the device, and TRY) and lets the first go at
 * once. A lock on another stream, taken while the spiller still holds the buffer, must wait
 * for the copy too (TSan caught the stress test's writes racing with such a copy). */
static void a_lock_after_an_abandon_rolled_back_waits_for_the_spill_copy(void) {
  spw_buf_t b = written(8), away = written(9);
  ASSERT_OK(spw_spill(rt, away, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  spw_stream_t other;
  ASSERT_OK(spw_stream_create(rt, &other));
  held_spill_t h;
  held_spill_start(&h, b);
  void *d[2];
  ASSERT_STATUS(spw_acquire_n(rt, (spw_buf_t[]){b, away}, 2, s, SPW_ACQUIRE_TRY, d),
                SPW_ERR_NOT_READY);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT); /* taken back, then let go */
  ASSERT_OK(spw_acquire(rt, b, other, 0, &d[0]));
  runs_behind_the_held_copy(&h, other);
  ASSERT_EQ(mismatch(b, 8), (size_t)-1);
  ASSERT_EQ(mismatch(away, 9), (size_t)-1);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_free(rt, away));
  ASSERT_OK(spw_stream_destroy(rt, other));
}

/* A large request's slices copy on streams of their own: an abandon must follow a copy on
 * any of them, not only on the lane's stream. The copy is held on the last slice's stream
 * of a runtime with three helpers. */
static void work_after_an_abandon_waits_for_a_spill_copy_on_a_slices_stream(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.engine_helpers = 3;
  reopen_fixture(&cfg);
  ASSERT_EQ(spw__engine_slices(rt->engine, SPW_LANE_DOWN), 4u);
  spw_stream_t slice = spw__engine_slice_stream(rt->engine, SPW_LANE_DOWN, 3);
  ASSERT_TRUE(slice != spw__d2h(rt));
  spw_buf_t b = written(10);
  held_spill_t h;
  held_spill_start_on(&h, b, slice);
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d)); /* abandons; the copy is enqueued, held */
  runs_behind_the_held_copy(&h, s);
  ASSERT_EQ(mismatch(b, 10), (size_t)-1);
  ASSERT_OK(spw_free(rt, b));
}

static const spw_test_t tests[] = {
    TEST(writes_after_abandoning_a_clean_spill_survive),
    TEST(writes_after_abandoning_a_dirty_spill_survive),
    TEST(an_abandoned_victim_cannot_be_claimed_again_until_its_spiller_lets_go),
    TEST(free_of_an_abandoned_victim_waits_for_its_spiller),
    TEST(work_after_an_abandon_waits_for_the_spill_copy),
    TEST(a_lock_after_an_abandon_rolled_back_waits_for_the_spill_copy),
    TEST(work_after_an_abandon_waits_for_a_spill_copy_on_a_slices_stream),
};
TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
