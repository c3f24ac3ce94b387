/* SPDX-License-Identifier: Apache-2.0 */
/* A spill request whose batch cannot get host memory for its own bookkeeping is dropped
 * whole: its buffers stay resident with their bytes, the failure reaches spw_wait_idle as
 * SPW_ERR_SYSTEM, and the same request sent again is carried out. The wishes of a dropped
 * request must leave the pending-hint set: one left there would absorb the repeat (a repeat
 * merges with a pending wish, docs/design.md "Hints") and nothing would ever spill it.
 *
 * The failures are real malloc failures: the test links with -Wl,--wrap=malloc
 * (tests.cmake), and __wrap_malloc below fails the first allocation of one exact size, the
 * size of the array the down lane's run or its batch asks for (NB victims, or NB copy
 * descriptors). Each test checks that the failure did happen, so it cannot pass by missing
 * it. Both backends. */
#include <stdatomic.h>
#include <stdlib.h>

#include "backend.h"
#include "moves.h"
#include "test_main.h"
#include "test_util.h"
#include "fixture.h" /* last: see its header */

/* Few enough for one slice (no helper splits the request), and an odd count, so that no
 * other allocation of the run has the size the seam fails. */
enum { NB = 777, BYTES = 4096 };

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);

static _Atomic size_t fail_size; /* the next malloc of exactly this many bytes fails; 0: none */
static atomic_int failures;

void *__wrap_malloc(size_t n) {
  size_t want = atomic_load_explicit(&fail_size, memory_order_relaxed);
  if (want != 0 && n == want &&
      atomic_compare_exchange_strong(&fail_size, &want, (size_t)0)) {
    atomic_fetch_add(&failures, 1);
    return NULL;
  }
  return __real_malloc(n);
}

static void fail_next_malloc_of(size_t bytes) {
  atomic_store(&failures, 0);
  atomic_store(&fail_size, bytes);
}

static spw_buf_t *filled_buffers(void) {
  spw_buf_t *b = malloc(NB * sizeof *b);
  ASSERT_TRUE(b != NULL);
  for (size_t i = 0; i < NB; i++) b[i] = test_filled(rt, s, BYTES, 500 + i);
  return b;
}

static void expect_and_free(spw_buf_t *b) {
  for (size_t i = 0; i < NB; i++) test_expect_fill(rt, b[i], s, BYTES, 500 + i);
  for (size_t i = 0; i < NB; i++) ASSERT_OK(spw_free(rt, b[i]));
  free(b);
}

/* The request fails once, where `bytes` says, and is then sent again. */
static void spill_fails_once_then_lands(size_t bytes) {
  spw_buf_t *b = filled_buffers();
  fail_next_malloc_of(bytes);
  ASSERT_OK(spw_spill_n(rt, b, NB, SPW_TIER_HOST));
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_SYSTEM);
  atomic_store(&fail_size, 0); /* in case it was not reached: the next line says so */
  ASSERT_EQ(atomic_load(&failures), 1);
  ASSERT_EQ(test_count_in(rt, b, NB, SPW_STATE_RESIDENT), NB);

  ASSERT_OK(spw_spill_n(rt, b, NB, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(test_count_in(rt, b, NB, SPW_STATE_HOST), NB);
  expect_and_free(b);
}

/* The lane's run cannot hold its victims (jobs.c, run_spills). */
static void spill_sent_again_after_its_run_had_no_memory_is_carried_out(void) {
  spill_fails_once_then_lands(NB * sizeof(spw_victim_t));
}

/* The run holds them, but its batch cannot start (spill_move.c, spw__spill_claiming: no
 * memory for the copy descriptors); its source has taken none of the wishes yet. */
static void spill_sent_again_after_its_batch_could_not_start_is_carried_out(void) {
  spill_fails_once_then_lands(NB * sizeof(spw_copy_desc_t));
}

static const spw_test_t tests[] = {
    TEST(spill_sent_again_after_its_run_had_no_memory_is_carried_out),
    TEST(spill_sent_again_after_its_batch_could_not_start_is_carried_out),
};

TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
