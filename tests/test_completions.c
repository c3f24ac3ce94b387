/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the completion poller (spill/completions.c) on the host backend: work that
 * joins a stream's open item (the release of launches back to back) runs only once the work
 * enqueued before the join has completed, never with the earlier work alone; a mark seals
 * the open item; an item that ran, or one of another stream, takes no more work; asked to,
 * an item behind an idle stream runs at once, and only when asked; an item that borrows the
 * caller's events waits for the newest one a join hands it. A gate (a host function that
 * blocks its stream until the test opens it) stands for a long kernel. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"
#include "completions.h"
#include "event_pool.h"
#include "gate.h"
#include "test_main.h"
#include "test_util.h"

static const spw_backend_ops_t *ops = &spw__backend_host_ops;

/* Made before every test, torn down after it: a host backend with two streams, its event
 * pool, a poller, a cell, and a closed gate. */
static spw_backend_t *be;
static spw_stream_t s1, s2;
static spw_event_pool_t events;
static spw_completions_t *comp;
static spw_completion_cell_t cell;
static gate_t g;

static void open_fixture(void) {
  spw_backend_params_t p = {0};
  ASSERT_OK(ops->create(&p, &be));
  ASSERT_OK(ops->stream_create(be, &s1));
  ASSERT_OK(ops->stream_create(be, &s2));
  spw__event_pool_init(&events, ops, be);
  ASSERT_OK(spw__completions_start(ops, be, &events, &comp));
  cell.open = NULL;
  gate_init(&g);
}

static void close_fixture(void) {
  gate_open(&g); /* nothing may stay queued behind it */
  spw__completions_stop(comp);
  spw__event_pool_fini(&events);
  ASSERT_OK(ops->stream_destroy(be, s1));
  ASSERT_OK(ops->stream_destroy(be, s2));
  ops->destroy(be);
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_fini(&g);
}

/* What an item runs on: how many pieces of work were folded in, and when it ran. */
typedef struct work {
  atomic_int ran;
  int status;
  int pieces;
  pthread_t by; /* the thread that ran it */
} work_t;

static void run_work(void *arg, int status) {
  work_t *w = arg;
  w->status = status;
  w->by = pthread_self();
  atomic_store(&w->ran, 1);
}

static int join_piece(void *open_arg, const void *add) {
  work_t *w = open_arg;
  w->pieces += *(const int *)add;
  return SPW_OK;
}

/* Starts an item on s1 and joins `pieces` more to it with a gate enqueued between: the join
 * must move the item's event past the gate. The poller may pick the item up between the two
 * calls (then the join is refused, correctly): tried again until a join lands, which takes
 * one try unless the machine is very busy. */
/* With events e1 and e2 (the caller's), the item borrows them instead: started on e1,
 * recorded before the gate, and joined with e2, recorded after it. */
static void start_and_join_across_gate_with(work_t *w, spw_bevent_t *e1, spw_bevent_t *e2) {
  for (int tries = 0; tries < 1000; tries++) {
    *w = (work_t){.pieces = 1};
    int one = 1, st;
    if (e1) {
      ASSERT_OK(ops->event_record(be, e1, s1));
      ASSERT_OK(spw__completions_after_event_open(comp, s1, &cell, e1, run_work, w));
      ASSERT_OK(ops->launch_host_func(be, s1, gate_wait, &g));
      ASSERT_OK(ops->event_record(be, e2, s1));
      st = spw__completions_join_event(comp, s1, &cell, e2, join_piece, &one);
    } else {
      ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 0, run_work, w));
      ASSERT_OK(ops->launch_host_func(be, s1, gate_wait, &g));
      st = spw__completions_join(comp, s1, &cell, join_piece, &one);
    }
    if (st == SPW_OK) return;
    ASSERT_STATUS(st, SPW_ERR_NOT_READY);
    /* Picked up first (its event is before the gate): start over behind a new gate, once
     * the stream has left this one. */
    gate_open(&g);
    ASSERT_OK(ops->stream_sync(be, s1));
    spw__completions_drain(comp);
    ASSERT_EQ(atomic_load(&w->ran), 1);
    gate_fini(&g);
    gate_init(&g);
  }
  ASSERT_TRUE(!"no join landed in 1000 tries");
}

static void start_and_join_across_gate(work_t *w) {
  start_and_join_across_gate_with(w, NULL, NULL);
}

/* The joined work of `w` does not run while the gate holds the stream, however many
 * polling rounds (20 us to 1 ms each) pass, and runs once, whole, after it opens. */
static void runs_only_once_the_gate_opens(work_t *w) {
  gate_await_entered(&g);
  test_sleep_ms(50);
  ASSERT_EQ(atomic_load(&w->ran), 0);
  ASSERT_EQ(w->pieces, 2);
  gate_open(&g);
  spw__completions_drain(comp);
  ASSERT_EQ(atomic_load(&w->ran), 1);
  ASSERT_OK(w->status);
  ASSERT_EQ(w->pieces, 2);
}

/* The stream was idle when the item started: without the join's new record, the item would
 * run within a polling round. */
static void joined_work_runs_only_after_the_work_enqueued_before_the_join(void) {
  work_t w;
  start_and_join_across_gate(&w);
  runs_only_once_the_gate_opens(&w);
}

/* An item that borrows the caller's events (a slot's `ready`) records none of its own: a
 * join hands it the newer event, and it waits for that one. */
static void work_joined_with_an_event_waits_for_that_event(void) {
  spw_bevent_t *e1, *e2;
  ASSERT_OK(ops->event_create(be, &e1));
  ASSERT_OK(ops->event_create(be, &e2));
  work_t w;
  start_and_join_across_gate_with(&w, e1, e2); /* e1 completed before the gate */
  runs_only_once_the_gate_opens(&w);
  ops->event_destroy(be, e1);
  ops->event_destroy(be, e2);
}

/* A synchronize runs the stream's items up to its mark at once, those that borrow events
 * too: the stream has run everything they wait for. */
static void a_flush_runs_an_item_of_borrowed_events(void) {
  spw_bevent_t *e1, *e2;
  ASSERT_OK(ops->event_create(be, &e1));
  ASSERT_OK(ops->event_create(be, &e2));
  work_t w;
  start_and_join_across_gate_with(&w, e1, e2);
  uint64_t mark = spw__completions_mark(comp, &cell, 1);
  gate_open(&g);
  ASSERT_OK(ops->stream_sync(be, s1));
  spw__completions_flush_stream(comp, s1, mark);
  ASSERT_EQ(atomic_load(&w.ran), 1);
  ASSERT_EQ(w.pieces, 2);
  ops->event_destroy(be, e1);
  ops->event_destroy(be, e2);
}

/* An item with its own event takes no borrowed one, and the reverse: each kind keeps the
 * event its joins rely on. */
static void an_item_joins_only_work_of_its_kind(void) {
  spw_bevent_t *e;
  ASSERT_OK(ops->event_create(be, &e));
  work_t a = {.pieces = 1}, b = {.pieces = 1};
  int one = 1;
  ASSERT_OK(ops->launch_host_func(be, s1, gate_wait, &g));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 0, run_work, &a));
  ASSERT_OK(ops->event_record(be, e, s1));
  ASSERT_STATUS(spw__completions_join_event(comp, s1, &cell, e, join_piece, &one),
                SPW_ERR_NOT_READY);
  ASSERT_OK(spw__completions_after_event_open(comp, s1, &cell, e, run_work, &b));
  ASSERT_STATUS(spw__completions_join(comp, s1, &cell, join_piece, &one), SPW_ERR_NOT_READY);
  ASSERT_STATUS(spw__completions_join_event(comp, s2, &cell, e, join_piece, &one),
                SPW_ERR_NOT_READY);
  ASSERT_EQ(a.pieces, 1);
  ASSERT_EQ(b.pieces, 1);
  gate_open(&g);
  spw__completions_drain(comp);
  ASSERT_EQ(atomic_load(&a.ran), 1);
  ASSERT_EQ(atomic_load(&b.ran), 1);
  ops->event_destroy(be, e);
}

static void a_mark_seals_the_open_item(void) {
  work_t w;
  start_and_join_across_gate(&w);
  uint64_t mark = spw__completions_mark(comp, &cell, 1);
  ASSERT_PTR_EQ(cell.open, NULL);
  int one = 1;
  /* Work enqueued after the mark starts a new item: the flush runs the sealed one only. */
  ASSERT_STATUS(spw__completions_join(comp, s1, &cell, join_piece, &one), SPW_ERR_NOT_READY);
  gate_open(&g);
  ASSERT_OK(ops->stream_sync(be, s1));
  spw__completions_flush_stream(comp, s1, mark);
  ASSERT_EQ(atomic_load(&w.ran), 1);
  ASSERT_EQ(w.pieces, 2);
}

/* A stream has a cell per kind of work (a launch's release, an acquire's host copy): a mark
 * seals the open item of each cell it is given, in one go. */
static void a_mark_seals_every_cell_it_is_given(void) {
  spw_completion_cell_t cells[2] = {{NULL}, {NULL}};
  work_t a = {.pieces = 1}, b = {.pieces = 1};
  ASSERT_OK(ops->launch_host_func(be, s1, gate_wait, &g));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cells[0], 0, run_work, &a));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cells[1], 0, run_work, &b));
  uint64_t mark = spw__completions_mark(comp, cells, 2);
  ASSERT_PTR_EQ(cells[0].open, NULL);
  ASSERT_PTR_EQ(cells[1].open, NULL);
  int one = 1;
  ASSERT_STATUS(spw__completions_join(comp, s1, &cells[0], join_piece, &one), SPW_ERR_NOT_READY);
  ASSERT_STATUS(spw__completions_join(comp, s1, &cells[1], join_piece, &one), SPW_ERR_NOT_READY);
  gate_open(&g);
  ASSERT_OK(ops->stream_sync(be, s1));
  spw__completions_flush_stream(comp, s1, mark);
  ASSERT_EQ(atomic_load(&a.ran), 1);
  ASSERT_EQ(atomic_load(&b.ran), 1);
  ASSERT_EQ(a.pieces + b.pieces, 2);
}

static void an_item_that_ran_takes_no_more_work(void) {
  work_t w = {.pieces = 1};
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 0, run_work, &w));
  spw__completions_drain(comp);
  ASSERT_EQ(atomic_load(&w.ran), 1);
  ASSERT_PTR_EQ(cell.open, NULL); /* sealed when picked up, before it ran and was freed */
  int one = 1;
  ASSERT_STATUS(spw__completions_join(comp, s1, &cell, join_piece, &one), SPW_ERR_NOT_READY);
  ASSERT_EQ(w.pieces, 1);
}

static void an_item_of_another_stream_takes_no_work(void) {
  work_t w = {.pieces = 1};
  ASSERT_OK(ops->launch_host_func(be, s1, gate_wait, &g));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 0, run_work, &w));
  int one = 1;
  /* The cell outlives a stream's incarnation: an entry reused by s2 must not join s1's. */
  ASSERT_STATUS(spw__completions_join(comp, s2, &cell, join_piece, &one), SPW_ERR_NOT_READY);
  ASSERT_EQ(w.pieces, 1);
  gate_open(&g);
  spw__completions_drain(comp);
  ASSERT_EQ(atomic_load(&w.ran), 1);
}

static void two_items_started_at_once_both_run(void) {
  work_t a = {.pieces = 1}, b = {.pieces = 1};
  ASSERT_OK(ops->launch_host_func(be, s1, gate_wait, &g));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 0, run_work, &a));
  /* A second start (another thread that found no open item) takes the cell over. */
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 0, run_work, &b));
  gate_open(&g);
  spw__completions_drain(comp);
  ASSERT_EQ(atomic_load(&a.ran), 1);
  ASSERT_EQ(atomic_load(&b.ran), 1);
  ASSERT_PTR_EQ(cell.open, NULL);
}

/* Asked to run now when it can: behind an idle stream the work runs before the call
 * returns, on the caller's thread, and no item is left open. */
static void work_behind_an_idle_stream_runs_at_once_when_asked(void) {
  work_t w = {.pieces = 1};
  ASSERT_OK(ops->stream_sync(be, s1));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 1, run_work, &w));
  ASSERT_EQ(atomic_load(&w.ran), 1);
  ASSERT_OK(w.status);
  ASSERT_PTR_EQ(cell.open, NULL);
  work_t v = {.pieces = 1};
  ASSERT_OK(spw__completions_after_or_now(comp, s1, run_work, &v));
  ASSERT_EQ(atomic_load(&v.ran), 1);
}

/* Not asked (a launch's release: the kernel was just enqueued, a look would only cost a
 * driver call): even behind an idle stream the work is left to the poller's thread. */
static void work_behind_an_idle_stream_is_left_to_the_poller_unless_asked(void) {
  work_t w = {.pieces = 1};
  ASSERT_OK(ops->stream_sync(be, s1));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 0, run_work, &w));
  spw__completions_drain(comp);
  ASSERT_EQ(atomic_load(&w.ran), 1);
  ASSERT_OK(w.status);
  ASSERT_TRUE(!pthread_equal(w.by, pthread_self()));
}

/* ... and behind a busy one it still waits for the stream. */
static void work_behind_a_busy_stream_waits_even_when_asked_to_run_now(void) {
  work_t w = {.pieces = 1}, v = {.pieces = 1};
  ASSERT_OK(ops->launch_host_func(be, s1, gate_wait, &g));
  ASSERT_OK(spw__completions_after_open(comp, s1, &cell, 1, run_work, &w));
  ASSERT_OK(spw__completions_after_or_now(comp, s1, run_work, &v));
  gate_await_entered(&g);
  test_sleep_ms(20);
  ASSERT_EQ(atomic_load(&w.ran), 0);
  ASSERT_EQ(atomic_load(&v.ran), 0);
  gate_open(&g);
  spw__completions_drain(comp);
  ASSERT_EQ(atomic_load(&w.ran), 1);
  ASSERT_EQ(atomic_load(&v.ran), 1);
}

static const spw_test_t tests[] = {
    TEST(joined_work_runs_only_after_the_work_enqueued_before_the_join),
    TEST(work_joined_with_an_event_waits_for_that_event),
    TEST(a_flush_runs_an_item_of_borrowed_events),
    TEST(an_item_joins_only_work_of_its_kind),
    TEST(a_mark_seals_the_open_item),
    TEST(a_mark_seals_every_cell_it_is_given),
    TEST(an_item_that_ran_takes_no_more_work),
    TEST(an_item_of_another_stream_takes_no_work),
    TEST(two_items_started_at_once_both_run),
    TEST(work_behind_an_idle_stream_runs_at_once_when_asked),
    TEST(work_behind_an_idle_stream_is_left_to_the_poller_unless_asked),
    TEST(work_behind_a_busy_stream_waits_even_when_asked_to_run_now),
};
TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
