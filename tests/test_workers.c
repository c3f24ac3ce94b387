/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the lanes' helper threads (src/util/workers.h): a run does every part once,
 * on the caller and the helpers at once, also more parts than threads; runs of one pool take
 * turns; a pool of no helpers runs everything on the caller; stopping joins the helpers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "test_main.h"
#include "test_util.h"
#include "workers.h"

enum { MAX_PARTS = 32 };

typedef struct job {
  atomic_int done[MAX_PARTS];
  atomic_int running, most_at_once;
  pthread_t who[MAX_PARTS];
  int sleep_ms;
} job_t;

static void part(void *ctx, unsigned i) {
  job_t *j = ctx;
  int now = atomic_fetch_add(&j->running, 1) + 1;
  for (int m = atomic_load(&j->most_at_once); now > m;)
    if (atomic_compare_exchange_weak(&j->most_at_once, &m, now)) break;
  j->who[i] = pthread_self();
  if (j->sleep_ms) test_sleep_ms(j->sleep_ms);
  atomic_fetch_add(&j->done[i], 1);
  atomic_fetch_sub(&j->running, 1);
}

static spw_workers_t *pool(unsigned helpers) {
  spw_workers_t *w = NULL;
  ASSERT_EQ(spw__workers_start(helpers, &w), 0);
  ASSERT_TRUE(w != NULL);
  ASSERT_EQ(spw__workers_width(w), helpers + 1);
  return w;
}

static void a_run_does_every_part_once_and_part_zero_on_the_caller(void) {
  spw_workers_t *w = pool(3);
  static job_t j;
  j = (job_t){.sleep_ms = 20};
  spw__workers_run(w, part, &j, 4);
  for (unsigned i = 0; i < 4; i++) ASSERT_EQ(atomic_load(&j.done[i]), 1);
  ASSERT_TRUE(pthread_equal(j.who[0], pthread_self()));
  for (unsigned i = 1; i < 4; i++) ASSERT_TRUE(!pthread_equal(j.who[i], pthread_self()));
  /* Each part sleeps 20 ms: run one after the other they could not overlap. */
  ASSERT_TRUE(atomic_load(&j.most_at_once) >= 2);
  spw__workers_stop(w);
}

static void more_parts_than_threads_are_all_done(void) {
  spw_workers_t *w = pool(2);
  static job_t j;
  j = (job_t){0};
  spw__workers_run(w, part, &j, 11);
  for (unsigned i = 0; i < 11; i++) ASSERT_EQ(atomic_load(&j.done[i]), 1);
  ASSERT_TRUE(atomic_load(&j.most_at_once) <= 3);
  spw__workers_stop(w);
}

static void fewer_parts_than_threads_leave_the_rest_idle(void) {
  spw_workers_t *w = pool(7);
  static job_t j;
  for (int r = 0; r < 50; r++) { /* also: helpers with no part in a run stay in step */
    j = (job_t){0};
    spw__workers_run(w, part, &j, 1 + (unsigned)(r % 8));
    for (unsigned i = 0; i < 1 + (unsigned)(r % 8); i++) ASSERT_EQ(atomic_load(&j.done[i]), 1);
    ASSERT_EQ(atomic_load(&j.done[1 + (r % 8)]), 0);
  }
  spw__workers_stop(w);
}

static void a_pool_of_no_helpers_runs_everything_on_the_caller(void) {
  spw_workers_t *w = pool(0);
  static job_t j;
  j = (job_t){0};
  spw__workers_run(w, part, &j, 5);
  for (unsigned i = 0; i < 5; i++) {
    ASSERT_EQ(atomic_load(&j.done[i]), 1);
    ASSERT_TRUE(pthread_equal(j.who[i], pthread_self()));
  }
  ASSERT_EQ(spw__workers_width(NULL), 1);
  spw__workers_run(NULL, part, &j, 1); /* NULL: the caller alone */
  ASSERT_EQ(atomic_load(&j.done[0]), 2);
  spw__workers_stop(w);
  spw__workers_stop(NULL);
}

typedef struct runner {
  spw_workers_t *w;
  job_t *j;
} runner_t;

static void *run_from_a_thread(void *arg) {
  runner_t *r = arg;
  spw__workers_run(r->w, part, r->j, 4);
  return NULL;
}

/* Two lanes' worth of callers on one pool: each run gets all its parts, one run at a time. */
static void runs_from_two_threads_take_turns(void) {
  spw_workers_t *w = pool(3);
  static job_t a, b;
  a = (job_t){.sleep_ms = 10};
  b = (job_t){.sleep_ms = 10};
  runner_t ra = {w, &a}, rb = {w, &b};
  pthread_t ta, tb;
  ASSERT_EQ(pthread_create(&ta, NULL, run_from_a_thread, &ra), 0);
  ASSERT_EQ(pthread_create(&tb, NULL, run_from_a_thread, &rb), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  for (unsigned i = 0; i < 4; i++) {
    ASSERT_EQ(atomic_load(&a.done[i]), 1);
    ASSERT_EQ(atomic_load(&b.done[i]), 1);
  }
  ASSERT_TRUE(atomic_load(&a.most_at_once) <= 4);
  ASSERT_TRUE(atomic_load(&b.most_at_once) <= 4);
  spw__workers_stop(w);
}

static const spw_test_t tests[] = {
    TEST(a_run_does_every_part_once_and_part_zero_on_the_caller),
    TEST(more_parts_than_threads_are_all_done),
    TEST(fewer_parts_than_threads_leave_the_rest_idle),
    TEST(a_pool_of_no_helpers_runs_everything_on_the_caller),
    TEST(runs_from_two_threads_take_turns),
};
TEST_MAIN(tests)
