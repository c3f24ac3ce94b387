/* SPDX-License-Identifier: Apache-2.0 */
/* An acquire that abandons a spill in progress: the buffer stays where it was and every
 * write made after the abandon survives the next spill. The spill is put in progress by
 * claiming the victim through the engine's seam (spw__victim_claim), so the interleaving
 * that is otherwise a matter of timing happens on every run. Both backends. */
#include "moves.h"
#include "test_main.h"
#include "test_util.h"

#define BYTES (256 * 1024)

static void write_pattern(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, uint64_t seed) {
  static uint8_t src[BYTES];
  test_fill(src, BYTES, seed);
  test_write(rt, b, s, src, BYTES);
}

static size_t mismatch(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, uint64_t seed) {
  static uint8_t got[BYTES];
  test_read(rt, b, s, got, BYTES);
  return test_first_mismatch(got, BYTES, seed);
}

static spw_victim_t claim(spw_runtime_t *rt, spw_buf_t b) {
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
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  spw_buf_t b;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_alloc(rt, BYTES, s, &b));
  write_pattern(rt, b, s, 1);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(mismatch(rt, b, s, 1), (size_t)-1); /* read-only: keeps a clean host copy */

  spw_victim_t v = claim(rt, b);
  ASSERT_TRUE(v.m.flags & SPW_W_CLEAN);
  write_pattern(rt, b, s, 2); /* abandons the spill, then writes */
  spw__spill_batch(rt, &v, 1, 0);
  ASSERT_EQ(v.status, SPW_ERR_BUSY); /* the abandoned spill committed nothing */

  spw_stats_t before = {.struct_size = sizeof before}, after = {.struct_size = sizeof after};
  ASSERT_OK(spw_get_stats(rt, &before));
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_get_stats(rt, &after));
  ASSERT_UEQ(after.spill_bytes - before.spill_bytes, BYTES); /* the writes were copied */
  ASSERT_UEQ(after.clean_respills, before.clean_respills);
  ASSERT_EQ(mismatch(rt, b, s, 2), (size_t)-1);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* A dirty spill abandoned by a writable acquire: the device copy stays authoritative. */
static void writes_after_abandoning_a_dirty_spill_survive(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  spw_buf_t b;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_alloc(rt, BYTES, s, &b));
  write_pattern(rt, b, s, 3);
  spw_victim_t v = claim(rt, b);
  ASSERT_TRUE(!(v.m.flags & SPW_W_CLEAN));
  write_pattern(rt, b, s, 4);
  spw__spill_batch(rt, &v, 1, 0);
  ASSERT_EQ(v.status, SPW_ERR_BUSY);
  spw_tier_t tier;
  ASSERT_OK(spw_buf_tier(rt, b, &tier));
  ASSERT_EQ(tier, SPW_TIER_DEVICE);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(mismatch(rt, b, s, 4), (size_t)-1);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(writes_after_abandoning_a_clean_spill_survive),
    TEST(writes_after_abandoning_a_dirty_spill_survive),
};
TEST_MAIN(tests)
