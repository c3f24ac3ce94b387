/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of the peer tier (spw_peer_lend, spw_peer_reclaim), public API only: a
 * borrower spills into lent memory first and falls back to host memory when it is full;
 * buffers come back from it intact; the lender takes its memory back, by a call or when
 * its own work needs the room, and the borrower's buffers move on to host memory, or to
 * disk when host memory is full, or stay where they are, intact, when there is neither;
 * destroying either runtime first loses nothing; controller events and statistics name the
 * tier; bad arguments are refused.
 *
 * On the CUDA backend the lender runs on device 1 when there is one (a real peer link),
 * else on device 0 beside the borrower. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define MIB ((size_t)1 << 20)
#define BUF (2 * MIB)

static spw_runtime_t *lender, *borrower;
static spw_stream_t ls, bs;
static char spill_dir[512];

static spw_runtime_t *make_runtime(int device, uint64_t limit, uint64_t host_limit,
                                   const char *dir) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device = device;
  cfg.device_limit = limit;
  cfg.host_limit = host_limit;
  cfg.host_device_bytes = 256 * MIB;
  cfg.spill_dir = dir;
  cfg.log_level = SPW_LOG_WARN;
  return test_runtime(&cfg);
}

/* A lender on another device when the backend has one. */
static spw_runtime_t *make_lender(uint64_t limit) {
  if (test_backend() == SPW_BACKEND_CUDA) {
    spw_config_t cfg = SPW_CONFIG_INIT;
    cfg.backend = SPW_BACKEND_CUDA;
    cfg.device = 1;
    cfg.device_limit = limit;
    cfg.log_level = SPW_LOG_OFF;
    spw_runtime_t *r = NULL;
    if (spw_runtime_create(&cfg, &r) == SPW_OK) return r;
  }
  return make_runtime(0, limit, 0, spill_dir);
}

/* Borrower: 16 MiB of device, `host_limit` of host, the disk in `dir`; lender: 64 MiB. */
static void open_pair(uint64_t host_limit, const char *dir) {
  lender = make_lender(64 * MIB);
  borrower = make_runtime(0, 16 * MIB, host_limit, dir);
  ASSERT_OK(spw_stream_create(lender, &ls));
  ASSERT_OK(spw_stream_create(borrower, &bs));
}

static void before(void) {
  test_tmpdir(spill_dir, sizeof spill_dir, "peer");
  open_pair(64 * MIB, spill_dir);
}

static void after(void) {
  if (borrower) ASSERT_OK(spw_runtime_destroy(borrower));
  if (lender) ASSERT_OK(spw_runtime_destroy(lender));
  borrower = lender = NULL;
  test_tmpdir_remove(spill_dir);
}

static spw_buf_t filled(size_t n, uint64_t seed) { return test_filled(borrower, bs, n, seed); }

static void expect_intact(const spw_buf_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) test_expect_fill(borrower, b[i], bs, BUF, 100 + i);
}

/* n buffers of BUF bytes, written, then all spilled to the borrower's HOST tier target. */
static void fill_and_spill(spw_buf_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) b[i] = filled(BUF, 100 + i);
  ASSERT_OK(spw_spill_n(borrower, b, n, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(borrower));
}

static void spills_go_to_lent_memory_first(void) {
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[4];
  fill_and_spill(b, 4);
  ASSERT_EQ(test_count_in(borrower, b, 4, SPW_STATE_PEER), 4);
  spw_tier_t tier;
  ASSERT_OK(spw_buf_tier(borrower, b[0], &tier));
  ASSERT_EQ(tier, SPW_TIER_PEER);
  spw_stats_t st = stats_of(borrower);
  ASSERT_EQ(st.peer_bytes, 4 * BUF);
  ASSERT_EQ(st.host_bytes, 0);
  ASSERT_EQ(st.peer_spills, 4);
  ASSERT_EQ(st.peer_limit, 16 * MIB);
  ASSERT_EQ(stats_of(lender).lent_bytes, 16 * MIB);
  char line[512];
  ASSERT_OK(spw_stats_summary(borrower, line, sizeof line));
  ASSERT_TRUE(strstr(line, "; peer 8.0 MiB of 16.0 MiB (4 spills") != NULL);
  ASSERT_OK(spw_stats_summary(lender, line, sizeof line));
  ASSERT_TRUE(strstr(line, "; lent 16.0 MiB") != NULL);
  expect_intact(b, 4); /* each comes back from the peer */
  st = stats_of(borrower);
  ASSERT_EQ(st.peer_unspills, 4);
  ASSERT_EQ(st.peer_bytes, 0);
}

static void full_lent_memory_falls_back_to_host(void) {
  ASSERT_OK(spw_peer_lend(lender, borrower, 4 * MIB));
  spw_buf_t b[5];
  fill_and_spill(b, 5);
  ASSERT_EQ(test_count_in(borrower, b, 5, SPW_STATE_PEER), 2);
  ASSERT_EQ(test_count_in(borrower, b, 5, SPW_STATE_HOST), 3);
  spw_stats_t st = stats_of(borrower);
  ASSERT_EQ(st.peer_bytes, 2 * BUF);
  ASSERT_EQ(st.host_bytes, 3 * BUF);
  expect_intact(b, 5);
}

static void buffers_spilled_on_demand_land_in_lent_memory(void) {
  ASSERT_OK(spw_peer_lend(lender, borrower, 32 * MIB));
  spw_buf_t b[14]; /* 28 MiB through a 16 MiB budget */
  for (size_t i = 0; i < 14; i++) b[i] = filled(BUF, 100 + i);
  ASSERT_OK(spw_wait_idle(borrower));
  ASSERT_TRUE(stats_of(borrower).peer_spills > 0);
  ASSERT_EQ(stats_of(borrower).host_bytes, 0);
  expect_intact(b, 14);
}

static void reclaim_moves_buffers_on_to_host(void) {
  uint64_t lender_used = stats_of(lender).device_bytes;
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  ASSERT_EQ(stats_of(lender).device_bytes, lender_used + 16 * MIB);
  spw_buf_t b[4];
  fill_and_spill(b, 4);
  ASSERT_OK(spw_peer_reclaim(lender, borrower));
  ASSERT_EQ(test_count_in(borrower, b, 4, SPW_STATE_HOST), 4);
  spw_stats_t st = stats_of(borrower);
  ASSERT_EQ(st.peer_returns, 4);
  ASSERT_EQ(st.peer_return_bytes, 4 * BUF);
  ASSERT_EQ(st.peer_bytes, 0);
  ASSERT_EQ(st.host_bytes, 4 * BUF);
  ASSERT_EQ(st.peer_limit, 0);
  ASSERT_EQ(stats_of(lender).lent_bytes, 0);
  ASSERT_EQ(stats_of(lender).device_bytes, lender_used);
  expect_intact(b, 4);
  /* Spills go to host now, and the borrower can borrow again. */
  fill_and_spill(b, 1);
  ASSERT_EQ(state_of(borrower, b[0]), SPW_STATE_HOST);
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
}

static void reclaim_with_host_memory_full_moves_buffers_to_disk(void) {
  ASSERT_OK(spw_runtime_destroy(borrower));
  borrower = make_runtime(0, 16 * MIB, 4 * MIB, spill_dir); /* host: two buffers */
  ASSERT_OK(spw_stream_create(borrower, &bs));
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[6];
  fill_and_spill(b, 6);
  ASSERT_EQ(test_count_in(borrower, b, 6, SPW_STATE_PEER), 6);
  ASSERT_OK(spw_peer_reclaim(lender, borrower));
  ASSERT_EQ(test_count_in(borrower, b, 6, SPW_STATE_PEER), 0);
  ASSERT_TRUE(test_count_in(borrower, b, 6, SPW_STATE_DISK) >= 4);
  ASSERT_EQ(stats_of(borrower).peer_returns, 6);
  expect_intact(b, 6);
}

static void reclaim_with_nowhere_to_go_fails_and_keeps_every_byte(void) {
  ASSERT_OK(spw_runtime_destroy(borrower));
  borrower = make_runtime(0, 16 * MIB, 4 * MIB, "/nonexistent/spillway-peer-test");
  ASSERT_OK(spw_stream_create(borrower, &bs));
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[6];
  fill_and_spill(b, 6);
  int st = spw_peer_reclaim(lender, borrower);
  ASSERT_EQ(st, SPW_ERR_HOST_OUT_OF_MEMORY);
  ASSERT_EQ(test_count_in(borrower, b, 6, SPW_STATE_PEER), 4); /* two moved on; the rest stayed */
  ASSERT_EQ(stats_of(lender).lent_bytes, 16 * MIB);
  expect_intact(b, 6);
}

static void explicit_spill_to_disk_of_a_peer_buffer_goes_through_the_device(void) {
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[2];
  fill_and_spill(b, 2);
  ASSERT_OK(spw_spill_n(borrower, b, 2, SPW_TIER_DISK));
  ASSERT_OK(spw_wait_idle(borrower));
  ASSERT_EQ(test_count_in(borrower, b, 2, SPW_STATE_DISK), 2);
  ASSERT_EQ(stats_of(borrower).peer_bytes, 0);
  expect_intact(b, 2);
}

static void lender_takes_its_memory_back_when_its_own_work_needs_it(void) {
  ASSERT_OK(spw_peer_lend(lender, borrower, 48 * MIB));
  spw_buf_t b[4];
  fill_and_spill(b, 4);
  /* 40 MiB locked on a 64 MiB lender that lent 48: only taking it back makes room. */
  spw_buf_t big;
  void *d;
  ASSERT_OK(spw_alloc(lender, 40 * MIB, ls, &big));
  ASSERT_OK(spw_acquire(lender, big, ls, 0, &d));
  ASSERT_EQ(stats_of(lender).lent_bytes, 0);
  ASSERT_EQ(test_count_in(borrower, b, 4, SPW_STATE_HOST), 4);
  ASSERT_OK(spw_stream_synchronize(lender, ls));
  ASSERT_OK(spw_free(lender, big));
  expect_intact(b, 4);
}

typedef struct events {
  pthread_mutex_t mu;
  int to_peer, from_peer, peer_to_host;
} events_t;

static void on_state(void *user, const spw_state_event_t *e) {
  events_t *ev = user;
  pthread_mutex_lock(&ev->mu);
  ev->to_peer += e->from == SPW_STATE_RESIDENT && e->to == SPW_STATE_PEER;
  ev->from_peer += e->from == SPW_STATE_PEER && e->to == SPW_STATE_RESIDENT;
  ev->peer_to_host += e->from == SPW_STATE_PEER && e->to == SPW_STATE_HOST;
  pthread_mutex_unlock(&ev->mu);
}

static void lending_more_than_is_free_takes_back_an_earlier_loan(void) {
  ASSERT_OK(spw_peer_lend(lender, borrower, 48 * MIB));
  spw_buf_t b[3];
  fill_and_spill(b, 3);
  spw_runtime_t *third = make_runtime(0, 16 * MIB, 16 * MIB, spill_dir);
  ASSERT_OK(spw_peer_lend(lender, third, 32 * MIB)); /* 48 + 32 > 64: the first loan goes */
  ASSERT_EQ(stats_of(lender).lent_bytes, 32 * MIB);
  ASSERT_EQ(stats_of(borrower).peer_limit, 0);
  ASSERT_EQ(test_count_in(borrower, b, 3, SPW_STATE_HOST), 3);
  ASSERT_OK(spw_runtime_destroy(third));
  expect_intact(b, 3);
}

static void controller_events_name_the_peer_tier(void) {
  events_t ev = {.mu = PTHREAD_MUTEX_INITIALIZER};
  spw_controller_t c = {.struct_size = sizeof c, .state_changed = on_state};
  ASSERT_OK(spw_set_controller(borrower, &c, &ev));
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[3];
  fill_and_spill(b, 3);
  test_expect_fill(borrower, b[0], bs, BUF, 100);
  ASSERT_OK(spw_peer_reclaim(lender, borrower));
  ASSERT_OK(spw_set_controller(borrower, NULL, NULL));
  ASSERT_EQ(ev.to_peer, 3);
  ASSERT_EQ(ev.from_peer, 1);
  ASSERT_EQ(ev.peer_to_host, 2);
}

static void destroying_the_lender_first_moves_the_buffers_on(void) {
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[3];
  fill_and_spill(b, 3);
  ASSERT_OK(spw_runtime_destroy(lender));
  lender = NULL;
  ASSERT_EQ(test_count_in(borrower, b, 3, SPW_STATE_HOST), 3);
  ASSERT_EQ(stats_of(borrower).peer_limit, 0);
  expect_intact(b, 3);
}

static void destroying_the_borrower_first_gives_the_memory_back(void) {
  uint64_t used = stats_of(lender).device_bytes;
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[3];
  fill_and_spill(b, 3);
  ASSERT_OK(spw_runtime_destroy(borrower));
  borrower = NULL;
  ASSERT_EQ(stats_of(lender).lent_bytes, 0);
  ASSERT_EQ(stats_of(lender).device_bytes, used);
}

/* Reads the trace file written so far into `text` (NUL-terminated). */
static void read_trace(const char *path, char *text, size_t cap) {
  FILE *f = fopen(path, "r");
  ASSERT_TRUE(f != NULL);
  size_t n = fread(text, 1, cap - 1, f);
  fclose(f);
  text[n] = 0;
}

/* The tier counters are sampled every writer period (2 ms) and flushed at each: a tier that
 * fills and empties between two samples leaves no counter, so the buffers stay in lent
 * memory until the file shows it (a CI run once brought them back first). */
static void the_trace_counts_bytes_in_lent_memory(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/trace.json", spill_dir);
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 16 * MIB;
  cfg.host_device_bytes = 256 * MIB;
  cfg.spill_dir = spill_dir;
  cfg.trace_path = path;
  cfg.log_level = SPW_LOG_WARN;
  ASSERT_OK(spw_runtime_destroy(borrower));
  borrower = test_runtime(&cfg);
  ASSERT_OK(spw_stream_create(borrower, &bs));
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  spw_buf_t b[2];
  fill_and_spill(b, 2);
  static char text[1 << 20];
  const char *const counter = "\"name\":\"peer\""; /* the tier counter */
  read_trace(path, text, sizeof text);
  for (uint64_t t0 = test_now_ms(); !strstr(text, counter) && test_now_ms() - t0 < 10000;) {
    test_sleep_ms(2);
    read_trace(path, text, sizeof text);
  }
  ASSERT_TRUE(strstr(text, counter) != NULL);
  expect_intact(b, 2);
  ASSERT_OK(spw_runtime_destroy(borrower)); /* writes the rest of the trace */
  borrower = NULL;
  read_trace(path, text, sizeof text);
  ASSERT_TRUE(strstr(text, "\"name\":\"spill to peer\"") != NULL); /* the moves */
  ASSERT_TRUE(strstr(text, "\"name\":\"unspill from peer\"") != NULL);
}

static void bad_arguments_are_refused(void) {
  ASSERT_EQ(spw_peer_lend(NULL, borrower, 16 * MIB), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw_peer_lend(lender, NULL, 16 * MIB), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw_peer_lend(lender, lender, 16 * MIB), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw_peer_lend(lender, borrower, 4096), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw_peer_lend(lender, borrower, 1ull << 40), SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw_peer_reclaim(lender, borrower), SPW_ERR_INVALID_ARG); /* nothing lent */
  ASSERT_EQ(spw_peer_reclaim(NULL, borrower), SPW_ERR_INVALID_ARG);
  spw_buf_t one = filled(BUF, 7); /* a spill names HOST; lent memory is part of it */
  ASSERT_EQ(spw_spill(borrower, one, SPW_TIER_PEER), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(borrower), "SPW_TIER_HOST") != NULL);
  ASSERT_EQ(spw_spill_n(borrower, &one, 1, SPW_TIER_PEER), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_peer_lend(lender, borrower, 16 * MIB));
  ASSERT_EQ(spw_peer_lend(lender, borrower, 16 * MIB), SPW_ERR_BUSY);  /* one lender each */
  ASSERT_EQ(spw_peer_lend(borrower, lender, 2 * MIB), SPW_ERR_BUSY);   /* no lending back */
  ASSERT_EQ(stats_of(lender).lent_bytes, 16 * MIB);
}

static void lending_in_a_cycle_is_refused(void) {
  spw_runtime_t *third = make_runtime(0, 16 * MIB, 16 * MIB, spill_dir);
  ASSERT_OK(spw_peer_lend(lender, borrower, 4 * MIB));
  ASSERT_OK(spw_peer_lend(borrower, third, 4 * MIB));
  ASSERT_EQ(spw_peer_lend(third, lender, 4 * MIB), SPW_ERR_BUSY); /* lender -> borrower -> third */
  ASSERT_OK(spw_runtime_destroy(third));
  ASSERT_EQ(stats_of(borrower).lent_bytes, 0);
}

/* Two threads write, spill and check their buffers on the borrower while a third takes the
 * lent memory back and lends it again, over and over: every byte survives. */
typedef struct churn {
  spw_runtime_t *rt;
  size_t first;
  atomic_int *stop;
} churn_t;

#define CHURN_BUFS 6

static void *churn_worker(void *arg) {
  churn_t *c = arg;
  spw_stream_t st;
  ASSERT_OK(spw_stream_create(c->rt, &st));
  spw_buf_t b[CHURN_BUFS];
  uint64_t version[CHURN_BUFS];
  for (size_t i = 0; i < CHURN_BUFS; i++) {
    version[i] = c->first + i;
    b[i] = test_filled(c->rt, st, BUF, version[i]);
  }
  for (unsigned round = 0; !atomic_load(c->stop); round++) {
    size_t i = round % CHURN_BUFS;
    test_expect_fill(c->rt, b[i], st, BUF, version[i]);
    version[i] += 1000;
    uint8_t *src = malloc(BUF);
    ASSERT_TRUE(src != NULL);
    test_fill(src, BUF, version[i]);
    test_write(c->rt, b[i], st, src, BUF);
    free(src);
    ASSERT_OK(spw_spill(c->rt, b[i], round % 5 == 0 ? SPW_TIER_DISK : SPW_TIER_HOST));
  }
  ASSERT_OK(spw_wait_idle(c->rt));
  for (size_t i = 0; i < CHURN_BUFS; i++) {
    test_expect_fill(c->rt, b[i], st, BUF, version[i]);
    ASSERT_OK(spw_free(c->rt, b[i]));
  }
  ASSERT_OK(spw_stream_destroy(c->rt, st));
  return NULL;
}

static void buffers_survive_memory_taken_back_and_lent_again_under_traffic(void) {
  atomic_int stop = 0;
  churn_t c[2] = {{borrower, 1000, &stop}, {borrower, 5000, &stop}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_create(&t[i], NULL, churn_worker, &c[i]), 0);
  uint64_t end = test_now_ms() + 3000;
  unsigned cycles = 0;
  while (test_now_ms() < end) {
    ASSERT_OK(spw_peer_lend(lender, borrower, 8 * MIB));
    test_sleep_ms(20);
    ASSERT_OK(spw_peer_reclaim(lender, borrower));
    cycles++;
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  ASSERT_TRUE(cycles > 5);
  ASSERT_EQ(stats_of(borrower).peer_bytes, 0);
  ASSERT_EQ(stats_of(lender).lent_bytes, 0);
}

/* Borrowers come and go (lend, spill, destroy) while the lender keeps needing its memory
 * back for its own work: a take-back and a borrower's destruction never meet halfway. */
static void *lender_under_pressure(void *arg) {
  atomic_int *stop = arg;
  while (!atomic_load(stop)) {
    spw_buf_t big;
    void *d;
    ASSERT_OK(spw_alloc(lender, 40 * MIB, ls, &big));
    ASSERT_OK(spw_acquire(lender, big, ls, 0, &d));
    ASSERT_OK(spw_stream_synchronize(lender, ls));
    ASSERT_OK(spw_free(lender, big));
  }
  return NULL;
}

static void borrowers_destroyed_while_the_lender_takes_memory_back(void) {
  ASSERT_OK(spw_runtime_destroy(borrower));
  borrower = NULL;
  atomic_int stop = 0;
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, lender_under_pressure, &stop), 0);
  uint64_t end = test_now_ms() + 2000;
  /* A lend that finds the big buffer locked waits up to 2 s for releases: count rounds too. */
  for (unsigned rounds = 0; rounds < 4 || test_now_ms() < end; rounds++) {
    spw_runtime_t *b = make_runtime(0, 16 * MIB, 16 * MIB, spill_dir);
    spw_stream_t st;
    ASSERT_OK(spw_stream_create(b, &st));
    int lent = spw_peer_lend(lender, b, 32 * MIB);
    ASSERT_TRUE(lent == SPW_OK || lent == SPW_ERR_OUT_OF_MEMORY); /* the big buffer holds it */
    spw_buf_t x[3];
    for (int i = 0; i < 3; i++) x[i] = test_filled(b, st, BUF, 900 + (uint64_t)i);
    ASSERT_OK(spw_spill_n(b, x, 3, SPW_TIER_HOST));
    for (int i = 0; i < 3; i++) test_expect_fill(b, x[i], st, BUF, 900 + (uint64_t)i);
    ASSERT_OK(spw_runtime_destroy(b));
  }
  atomic_store(&stop, 1);
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_EQ(stats_of(lender).lent_bytes, 0);
}

static const spw_test_t tests[] = {
    TEST(spills_go_to_lent_memory_first),
    TEST(full_lent_memory_falls_back_to_host),
    TEST(buffers_spilled_on_demand_land_in_lent_memory),
    TEST(reclaim_moves_buffers_on_to_host),
    TEST(reclaim_with_host_memory_full_moves_buffers_to_disk),
    TEST(reclaim_with_nowhere_to_go_fails_and_keeps_every_byte),
    TEST(explicit_spill_to_disk_of_a_peer_buffer_goes_through_the_device),
    TEST(lender_takes_its_memory_back_when_its_own_work_needs_it),
    TEST(lending_more_than_is_free_takes_back_an_earlier_loan),
    TEST(controller_events_name_the_peer_tier),
    TEST(destroying_the_lender_first_moves_the_buffers_on),
    TEST(destroying_the_borrower_first_gives_the_memory_back),
    TEST(the_trace_counts_bytes_in_lent_memory),
    TEST(bad_arguments_are_refused),
    TEST(lending_in_a_cycle_is_refused),
    TEST(buffers_survive_memory_taken_back_and_lent_again_under_traffic),
    TEST(borrowers_destroyed_while_the_lender_takes_memory_back),
};

TEST_MAIN_FIXTURE(tests, before, after)
