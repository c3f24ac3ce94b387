/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the host backend (src/backend/backend_host.c) through its ops table: stream
 * order, synchronize, events, cross-stream waits, copies, the emulated capacity, destroy
 * with work queued, and many threads on many streams. Streams are held still with gates (a
 * host func that blocks until the test opens it), so "not yet" is observed without racing
 * the worker.
 * Run with no argument for every test, or with a test's name for that one. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "backend.h"
#include "gate.h"
#include "test_main.h"
#include "test_util.h"

static const spw_backend_ops_t *ops = &spw__backend_host_ops;

#define MiB ((size_t)1 << 20)

/* The test's backend: made by make_backend, destroyed after the test (close_backend), which
 * waits for whatever work the test left queued; or by the test itself (destroy_backend). */
static spw_backend_t *fx_be;

static spw_backend_t *make_backend(uint64_t capacity) {
  spw_backend_params_t p = {0};
  p.host_device_bytes = capacity;
  ASSERT_OK(ops->create(&p, &fx_be));
  ASSERT_TRUE(fx_be != NULL);
  return fx_be;
}

static void destroy_backend(void) {
  if (fx_be) ops->destroy(fx_be);
  fx_be = NULL;
}

/* And a gate for the test to hold a stream with (closed at the start of every test). */
static gate_t g;

static void open_fixture(void) { gate_init(&g); }

static void close_fixture(void) {
  gate_open(&g); /* nothing the test left may wait behind it */
  destroy_backend();
  gate_fini(&g);
}

static spw_stream_t make_stream(spw_backend_t *b) {
  spw_stream_t s = NULL;
  ASSERT_OK(ops->stream_create(b, &s));
  ASSERT_TRUE(s != NULL);
  return s;
}

static spw_bevent_t *make_event(spw_backend_t *b) {
  spw_bevent_t *e = NULL;
  ASSERT_OK(ops->event_create(b, &e));
  ASSERT_TRUE(e != NULL);
  return e;
}

static void set_flag(void *arg) { atomic_store((atomic_int *)arg, 1); }

/* Whether everything enqueued on `s` so far completes within `ms`, polled (a stream that
 * waits for the wrong thing must fail the test, not hang it). */
static bool stream_done_within(spw_backend_t *b, spw_stream_t s, long ms) {
  spw_bevent_t *e = make_event(b);
  ASSERT_OK(ops->event_record(b, e, s));
  uint64_t deadline = test_now_ms() + (uint64_t)ms;
  int st;
  while ((st = ops->event_query(b, e)) == SPW_ERR_NOT_READY && test_now_ms() < deadline) test_sleep_ms(1);
  ops->event_destroy(b, e);
  return st == SPW_OK;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void test_default_stream_exists_and_runs_work(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = ops->default_stream(b);
  ASSERT_TRUE(s != NULL);
  atomic_int ran = 0;
  ASSERT_OK(ops->launch_host_func(b, s, set_flag, &ran));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_EQ(atomic_load(&ran), 1);
}

static void test_default_capacity_is_one_gib(void) {
  spw_backend_t *b = make_backend(0);
  size_t free_bytes = 0, total = 0;
  ASSERT_OK(ops->mem_info(b, &free_bytes, &total));
  ASSERT_UEQ(total, (uint64_t)1 << 30);
  ASSERT_UEQ(free_bytes, (uint64_t)1 << 30);
}

static void test_default_stream_cannot_be_destroyed(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = ops->default_stream(b);
  ASSERT_STATUS(ops->stream_destroy(b, s), SPW_ERR_INVALID_STREAM);
  atomic_int ran = 0;
  ASSERT_OK(ops->launch_host_func(b, s, set_flag, &ran));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_EQ(atomic_load(&ran), 1);
}

/* ---- stream order and synchronize ------------------------------------------------------- */

#define FIFO_OPS 2000

typedef struct fifo_log {
  int order[FIFO_OPS];
  int n; /* touched only by the stream's worker until the sync */
} fifo_log_t;

typedef struct fifo_item {
  fifo_log_t *log;
  int index;
} fifo_item_t;

static void fifo_append(void *arg) {
  fifo_item_t *it = arg;
  it->log->order[it->log->n++] = it->index;
}

static void test_ops_on_one_stream_run_in_fifo_order(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  static fifo_log_t log;
  static fifo_item_t items[FIFO_OPS];
  log.n = 0;
  for (int i = 0; i < FIFO_OPS; i++) {
    items[i] = (fifo_item_t){&log, i};
    ASSERT_OK(ops->launch_host_func(b, s, fifo_append, &items[i]));
  }
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_EQ(log.n, FIFO_OPS);
  for (int i = 0; i < FIFO_OPS; i++) ASSERT_EQ(log.order[i], i);
  ASSERT_OK(ops->stream_destroy(b, s));
}

/* Host funcs that take a while: one sets a flag after 200 ms, one counts after 10 ms. */
static void slow_set_flag(void *arg) {
  test_sleep_ms(200);
  atomic_store((atomic_int *)arg, 1);
}

static void slow_count(void *arg) {
  test_sleep_ms(10);
  atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_stream_sync_waits_for_slow_host_func(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  atomic_int done = 0;
  ASSERT_OK(ops->launch_host_func(b, s, slow_set_flag, &done));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_EQ(atomic_load(&done), 1);
  ASSERT_OK(ops->stream_destroy(b, s));
}

/* ---- events ------------------------------------------------------------------------------ */

static void test_event_not_ready_while_host_func_blocks_stream(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  spw_bevent_t *e = make_event(b);
  ASSERT_OK(ops->launch_host_func(b, s, gate_wait, &g));
  ASSERT_OK(ops->event_record(b, e, s));
  for (int i = 0; i < 20; i++) {
    ASSERT_STATUS(ops->event_query(b, e), SPW_ERR_NOT_READY);
    test_sleep_ms(2);
  }
  gate_open(&g);
  ASSERT_OK(ops->event_sync(b, e));
  ASSERT_OK(ops->event_query(b, e));
  ops->event_destroy(b, e);
  ASSERT_OK(ops->stream_destroy(b, s));
}

/* The event has completed (query and sync agree); then destroys it. */
static void expect_complete_and_destroy(spw_backend_t *b, spw_bevent_t *e) {
  ASSERT_OK(ops->event_query(b, e));
  ASSERT_OK(ops->event_sync(b, e));
  ops->event_destroy(b, e);
}

static void test_unrecorded_event_is_complete(void) {
  spw_backend_t *b = make_backend(0);
  expect_complete_and_destroy(b, make_event(b));
}

static void test_event_rerecord_overwrites_previous_record(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t blocked = make_stream(b), idle = make_stream(b);
  spw_bevent_t *e = make_event(b);
  ASSERT_OK(ops->launch_host_func(b, blocked, gate_wait, &g));
  ASSERT_OK(ops->event_record(b, e, blocked));
  ASSERT_STATUS(ops->event_query(b, e), SPW_ERR_NOT_READY);
  ASSERT_OK(ops->event_record(b, e, idle));
  ASSERT_OK(ops->event_query(b, e));
  ASSERT_OK(ops->event_sync(b, e)); /* must not wait for the gate */
  gate_open(&g);
  ops->event_destroy(b, e);
  ASSERT_OK(ops->stream_destroy(b, blocked));
  ASSERT_OK(ops->stream_destroy(b, idle));
}

static void test_event_outlives_its_stream(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  spw_bevent_t *e = make_event(b);
  atomic_int done = 0;
  ASSERT_OK(ops->launch_host_func(b, s, slow_set_flag, &done));
  ASSERT_OK(ops->event_record(b, e, s));
  ASSERT_OK(ops->stream_destroy(b, s));
  ASSERT_EQ(atomic_load(&done), 1);
  expect_complete_and_destroy(b, e);
}

/* ---- stream_wait_event ------------------------------------------------------------------- */

static void test_wait_event_makes_stream_wait_for_earlier_work(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t a = make_stream(b), bs = make_stream(b);
  spw_bevent_t *e = make_event(b);
  atomic_int b_ran = 0;
  ASSERT_OK(ops->launch_host_func(b, a, gate_wait, &g));
  ASSERT_OK(ops->event_record(b, e, a));
  ASSERT_OK(ops->stream_wait_event(b, bs, e));
  ASSERT_OK(ops->launch_host_func(b, bs, set_flag, &b_ran));
  test_sleep_ms(100);
  ASSERT_EQ(atomic_load(&b_ran), 0);
  gate_open(&g);
  ASSERT_TRUE(stream_done_within(b, bs, 10000));
  ASSERT_EQ(atomic_load(&b_ran), 1);
  ops->event_destroy(b, e);
  ASSERT_OK(ops->stream_destroy(b, a));
  ASSERT_OK(ops->stream_destroy(b, bs));
}

static void test_wait_event_does_not_wait_for_later_work(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t a = make_stream(b), bs = make_stream(b);
  spw_bevent_t *e = make_event(b);
  gate_t late; /* and the fixture's g, the early one */
  gate_init(&late);
  atomic_int b_ran = 0;
  ASSERT_OK(ops->launch_host_func(b, a, gate_wait, &g));
  ASSERT_OK(ops->event_record(b, e, a));
  ASSERT_OK(ops->launch_host_func(b, a, gate_wait, &late));
  ASSERT_OK(ops->stream_wait_event(b, bs, e));
  ASSERT_OK(ops->launch_host_func(b, bs, set_flag, &b_ran));
  gate_open(&g);
  ASSERT_TRUE(stream_done_within(b, bs, 10000));
  ASSERT_EQ(atomic_load(&b_ran), 1);
  gate_open(&late);
  ASSERT_OK(ops->stream_sync(b, a)); /* out of gate_wait before the gate goes */
  ops->event_destroy(b, e);
  gate_fini(&late);
}

static void test_wait_event_uses_the_record_in_force_at_the_call(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t a = make_stream(b), bs = make_stream(b);
  spw_bevent_t *e = make_event(b);
  gate_t early, late; /* and the fixture's g, which holds bs */
  gate_init(&early);
  gate_init(&late);
  /* bs reaches its wait only after the re-record, so a wait that read the event when it
   * runs, rather than when it was enqueued, would wait for `late`. */
  ASSERT_OK(ops->launch_host_func(b, bs, gate_wait, &g));
  ASSERT_OK(ops->launch_host_func(b, a, gate_wait, &early));
  ASSERT_OK(ops->event_record(b, e, a));
  ASSERT_OK(ops->stream_wait_event(b, bs, e));
  ASSERT_OK(ops->launch_host_func(b, a, gate_wait, &late));
  ASSERT_OK(ops->event_record(b, e, a)); /* now covers `late` */
  gate_open(&g);
  gate_open(&early);
  ASSERT_TRUE(stream_done_within(b, bs, 10000));
  ASSERT_STATUS(ops->event_query(b, e), SPW_ERR_NOT_READY);
  gate_open(&late);
  ops->event_destroy(b, e);
  ASSERT_OK(ops->stream_sync(b, a)); /* out of both gates before they go */
  gate_fini(&early);
  gate_fini(&late);
}

/* ---- copies ------------------------------------------------------------------------------- */

typedef struct fill_job {
  void *p;
  size_t n;
  uint64_t seed;
} fill_job_t;

static void fill_fn(void *arg) {
  fill_job_t *j = arg;
  test_fill(j->p, j->n, j->seed);
}

static void test_memcpy_async_copies_in_order_with_other_ops(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  const size_t n = 3 * MiB + 17;
  uint8_t *src = malloc(n), *dst = malloc(n);
  ASSERT_TRUE(src && dst);
  memset(src, 0, n);
  memset(dst, 0, n);
  void *dev = NULL, *dev2 = NULL;
  ASSERT_OK(ops->alloc_async(b, n, s, &dev));
  ASSERT_OK(ops->alloc_async(b, n, s, &dev2));
  fill_job_t before = {src, n, 1}, after = {src, n, 2}, clobber = {dev, n, 3};
  ASSERT_OK(ops->launch_host_func(b, s, fill_fn, &before));
  ASSERT_OK(ops->memcpy_async(b, dev, src, n, s));   /* sees seed 1 */
  ASSERT_OK(ops->launch_host_func(b, s, fill_fn, &after));
  ASSERT_OK(ops->memcpy_async(b, dev2, dev, n, s));  /* device to device, still seed 1 */
  ASSERT_OK(ops->launch_host_func(b, s, fill_fn, &clobber));
  ASSERT_OK(ops->memcpy_async(b, dst, dev2, n, s));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_UEQ(test_first_mismatch(dst, n, 1), (uint64_t)(size_t)-1);
  ASSERT_UEQ(test_first_mismatch(src, n, 2), (uint64_t)(size_t)-1);
  ASSERT_OK(ops->free_async(b, dev, s));
  ASSERT_OK(ops->free_async(b, dev2, s));
  ASSERT_OK(ops->stream_destroy(b, s));
  free(src);
  free(dst);
}

#define BATCH_N 9

static void test_copy_batch_async_copies_in_order_with_other_ops(void) {
  static const size_t sizes[BATCH_N] = {1, 255, 256, 257, 4096, 65536, MiB, MiB + 3, 0};
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  uint8_t *host[BATCH_N], *back[BATCH_N];
  void *dev[BATCH_N];
  fill_job_t fills[BATCH_N], clobbers[BATCH_N];
  spw_copy_desc_t descs[BATCH_N];
  for (int i = 0; i < BATCH_N; i++) {
    host[i] = malloc(sizes[i] + 1);
    back[i] = calloc(1, sizes[i] + 1);
    ASSERT_TRUE(host[i] && back[i]);
    ASSERT_OK(ops->alloc_async(b, sizes[i] + 1, s, &dev[i]));
    fills[i] = (fill_job_t){host[i], sizes[i], (uint64_t)i + 10};
    clobbers[i] = (fill_job_t){host[i], sizes[i], (uint64_t)i + 100};
  }
  /* Held at the gate, so the backend must copy `descs` before it is overwritten below. */
  ASSERT_OK(ops->launch_host_func(b, s, gate_wait, &g));
  for (int i = 0; i < BATCH_N; i++) ASSERT_OK(ops->launch_host_func(b, s, fill_fn, &fills[i]));
  for (int i = 0; i < BATCH_N; i++) descs[i] = (spw_copy_desc_t){dev[i], host[i], sizes[i]};
  ASSERT_OK(ops->copy_batch_async(b, descs, BATCH_N, SPW_COPY_H2D, s));
  memset(descs, 0, sizeof descs);
  for (int i = 0; i < BATCH_N; i++)
    ASSERT_OK(ops->launch_host_func(b, s, fill_fn, &clobbers[i]));
  for (int i = 0; i < BATCH_N; i++) descs[i] = (spw_copy_desc_t){back[i], dev[i], sizes[i]};
  ASSERT_OK(ops->copy_batch_async(b, descs, BATCH_N, SPW_COPY_D2H, s));
  memset(descs, 0, sizeof descs);
  gate_open(&g);
  ASSERT_OK(ops->stream_sync(b, s));
  for (int i = 0; i < BATCH_N; i++) {
    ASSERT_UEQ(test_first_mismatch(back[i], sizes[i], (uint64_t)i + 10), (uint64_t)(size_t)-1);
    ASSERT_EQ(back[i][sizes[i]], 0); /* nothing past the descriptor's length */
    ASSERT_OK(ops->free_async(b, dev[i], s));
    free(host[i]);
    free(back[i]);
  }
  ASSERT_OK(ops->stream_destroy(b, s));
}

static void test_copy_batch_async_rejects_bad_direction(void) {
  spw_backend_t *b = make_backend(0);
  uint8_t x = 0, y = 0;
  spw_copy_desc_t d = {&x, &y, 1};
  ASSERT_STATUS(ops->copy_batch_async(b, &d, 1, (spw_copy_dir_t)7, ops->default_stream(b)),
                SPW_ERR_INVALID_ARG);
}

/* ---- memory and capacity ------------------------------------------------------------------ */

static void test_alloc_is_256_byte_aligned(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = ops->default_stream(b);
  static const size_t sizes[] = {1, 3, 255, 256, 1000, 4097, MiB + 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *p = NULL;
    ASSERT_OK(ops->alloc_async(b, sizes[i], s, &p));
    ASSERT_EQ((uintptr_t)p % 256, 0);
    memset(p, 0xAB, sizes[i]); /* the whole size is usable */
    ASSERT_OK(ops->free_async(b, p, s));
  }
}

static void test_alloc_beyond_capacity_is_out_of_memory(void) {
  const size_t cap = 4 * MiB;
  spw_backend_t *b = make_backend(cap);
  spw_stream_t s = ops->default_stream(b);
  void *p1 = NULL, *p2 = NULL, *p3 = NULL;
  ASSERT_OK(ops->alloc_async(b, cap / 2, s, &p1));
  ASSERT_OK(ops->alloc_async(b, cap / 2, s, &p2));
  ASSERT_STATUS(ops->alloc_async(b, 1, s, &p3), SPW_ERR_OUT_OF_MEMORY);
  ASSERT_TRUE(p3 == NULL);
  ASSERT_STATUS(ops->alloc_async(b, cap + 1, s, &p3), SPW_ERR_OUT_OF_MEMORY);
  size_t free_bytes = 1, total = 0;
  ASSERT_OK(ops->mem_info(b, &free_bytes, &total));
  ASSERT_UEQ(free_bytes, 0);
  ASSERT_UEQ(total, cap);
  ASSERT_OK(ops->free_async(b, p1, s));
  ASSERT_OK(ops->free_async(b, p2, s));
}

typedef struct sink_log {
  int calls;
  char name[64];
} sink_log_t;

static void sink(void *ctx, const char *name, const char *text) {
  sink_log_t *l = ctx;
  l->calls++;
  snprintf(l->name, sizeof l->name, "%s", name);
  ASSERT_TRUE(text && text[0]);
}

static void test_out_of_memory_reaches_the_error_sink(void) {
  sink_log_t log = {0};
  spw_backend_params_t p = {0};
  p.host_device_bytes = MiB;
  p.on_error = sink;
  p.err_ctx = &log;
  ASSERT_OK(ops->create(&p, &fx_be));
  spw_backend_t *b = fx_be;
  void *x = NULL;
  ASSERT_STATUS(ops->alloc_async(b, 2 * MiB, ops->default_stream(b), &x), SPW_ERR_OUT_OF_MEMORY);
  ASSERT_EQ(log.calls, 1);
  ASSERT_EQ(strcmp(log.name, "cudaErrorMemoryAllocation"), 0);
}

static void test_capacity_returns_when_free_async_executes(void) {
  const size_t cap = 4 * MiB;
  spw_backend_t *b = make_backend(cap);
  spw_stream_t s = make_stream(b);
  void *p1 = NULL, *p2 = NULL;
  ASSERT_OK(ops->alloc_async(b, cap, s, &p1));
  ASSERT_OK(ops->launch_host_func(b, s, gate_wait, &g));
  ASSERT_OK(ops->free_async(b, p1, s));
  size_t free_bytes = 1;
  ASSERT_OK(ops->mem_info(b, &free_bytes, NULL));
  ASSERT_UEQ(free_bytes, 0); /* the free is queued behind the gate */
  ASSERT_STATUS(ops->alloc_async(b, cap, s, &p2), SPW_ERR_OUT_OF_MEMORY);
  gate_open(&g);
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_OK(ops->mem_info(b, &free_bytes, NULL));
  ASSERT_UEQ(free_bytes, cap);
  ASSERT_OK(ops->alloc_async(b, cap, s, &p2));
  ASSERT_OK(ops->free_async(b, p2, s));
  ASSERT_OK(ops->stream_destroy(b, s));
}

static void test_free_async_of_null_is_ok(void) {
  spw_backend_t *b = make_backend(0);
  ASSERT_OK(ops->free_async(b, NULL, ops->default_stream(b)));
}

static void test_alloc_of_zero_bytes_is_invalid_arg(void) {
  spw_backend_t *b = make_backend(0);
  void *p = NULL;
  ASSERT_STATUS(ops->alloc_async(b, 0, ops->default_stream(b), &p), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(ops->alloc_async(b, 16, ops->default_stream(b), NULL), SPW_ERR_INVALID_ARG);
}

static void test_host_register_validates_arguments(void) {
  spw_backend_t *b = make_backend(0);
  static uint8_t page[4096];
  ASSERT_STATUS(ops->host_register(b, NULL, 4096), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(ops->host_register(b, page, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(ops->host_unregister(b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_OK(ops->host_register(b, page, sizeof page));
  ASSERT_OK(ops->host_unregister(b, page));
  ASSERT_OK(ops->trim(b));
}

/* ---- destroy ------------------------------------------------------------------------------ */

static void test_destroy_with_work_queued_waits_for_it(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  atomic_int count = 0;
  void *p = NULL;
  ASSERT_OK(ops->alloc_async(b, MiB, s, &p));
  for (int i = 0; i < 10; i++) ASSERT_OK(ops->launch_host_func(b, s, slow_count, &count));
  ASSERT_OK(ops->free_async(b, p, s));
  for (int i = 0; i < 5; i++)
    ASSERT_OK(ops->launch_host_func(b, ops->default_stream(b), slow_count, &count));
  destroy_backend();
  ASSERT_EQ(atomic_load(&count), 15);
}

static void test_stream_destroy_with_work_queued_waits_for_it(void) {
  spw_backend_t *b = make_backend(0);
  spw_stream_t s = make_stream(b);
  atomic_int count = 0;
  for (int i = 0; i < 10; i++) ASSERT_OK(ops->launch_host_func(b, s, slow_count, &count));
  ASSERT_OK(ops->stream_destroy(b, s));
  ASSERT_EQ(atomic_load(&count), 10);
}

/* ---- many threads, many streams ------------------------------------------------------------ */

#define MT_THREADS 8
#define MT_STREAMS 4
#define MT_OPS 3000

typedef struct mt_shared {
  spw_backend_t *b;
  spw_stream_t streams[MT_STREAMS];
  spw_bevent_t *shared_event; /* recorded and queried by every thread at once */
  /* last[s][t]: the last op index of thread t that stream s ran; written by s's worker only */
  int last[MT_STREAMS][MT_THREADS];
  long count[MT_STREAMS];
  atomic_int out_of_order;
} mt_shared_t;

typedef struct mt_item {
  mt_shared_t *sh;
  int stream, thread, index;
} mt_item_t;

static void mt_op(void *arg) {
  mt_item_t *it = arg;
  mt_shared_t *sh = it->sh;
  if (sh->last[it->stream][it->thread] >= it->index) atomic_fetch_add(&sh->out_of_order, 1);
  sh->last[it->stream][it->thread] = it->index;
  sh->count[it->stream]++;
}

typedef struct mt_thread {
  mt_shared_t *sh;
  int id;
  mt_item_t items[MT_OPS];
  uint8_t src[512], dst[512];
} mt_thread_t;

static void *mt_main(void *arg) {
  mt_thread_t *t = arg;
  spw_backend_t *b = t->sh->b;
  spw_bevent_t *e = make_event(b);
  test_fill(t->src, sizeof t->src, (uint64_t)t->id);
  for (int i = 0; i < MT_OPS; i++) {
    int si = (t->id + i) % MT_STREAMS;
    spw_stream_t s = t->sh->streams[si];
    t->items[i] = (mt_item_t){t->sh, si, t->id, i};
    ASSERT_OK(ops->launch_host_func(b, s, mt_op, &t->items[i]));
    if (i % 16 == 0) {
      ASSERT_OK(ops->event_record(b, e, s));
      ASSERT_OK(ops->stream_wait_event(b, t->sh->streams[(si + 1) % MT_STREAMS], e));
      int st = ops->event_query(b, e);
      ASSERT_TRUE(st == SPW_OK || st == SPW_ERR_NOT_READY);
      ASSERT_OK(ops->event_record(b, t->sh->shared_event, s));
      st = ops->event_query(b, t->sh->shared_event);
      ASSERT_TRUE(st == SPW_OK || st == SPW_ERR_NOT_READY);
    }
    if (i % 64 == 0) {
      void *dev = NULL;
      ASSERT_OK(ops->alloc_async(b, sizeof t->src, s, &dev));
      ASSERT_OK(ops->memcpy_async(b, dev, t->src, sizeof t->src, s));
      ASSERT_OK(ops->memcpy_async(b, t->dst, dev, sizeof t->dst, s));
      ASSERT_OK(ops->free_async(b, dev, s));
      ASSERT_OK(ops->event_record(b, e, s));
      ASSERT_OK(ops->event_sync(b, e));
      ASSERT_UEQ(test_first_mismatch(t->dst, sizeof t->dst, (uint64_t)t->id),
                 (uint64_t)(size_t)-1);
    }
  }
  ops->event_destroy(b, e);
  return NULL;
}

static void test_eight_threads_enqueue_on_four_streams(void) {
  static mt_shared_t sh;
  static mt_thread_t threads[MT_THREADS];
  memset(&sh, 0, sizeof sh);
  const size_t cap = 64 * MiB;
  sh.b = make_backend(cap);
  for (int s = 0; s < MT_STREAMS; s++) {
    sh.streams[s] = make_stream(sh.b);
    for (int t = 0; t < MT_THREADS; t++) sh.last[s][t] = -1;
  }
  sh.shared_event = make_event(sh.b);
  pthread_t tid[MT_THREADS];
  for (int t = 0; t < MT_THREADS; t++) {
    threads[t].sh = &sh;
    threads[t].id = t;
    ASSERT_EQ(pthread_create(&tid[t], NULL, mt_main, &threads[t]), 0);
  }
  for (int t = 0; t < MT_THREADS; t++) ASSERT_EQ(pthread_join(tid[t], NULL), 0);
  for (int s = 0; s < MT_STREAMS; s++) ASSERT_OK(ops->stream_sync(sh.b, sh.streams[s]));

  long total = 0;
  for (int s = 0; s < MT_STREAMS; s++) total += sh.count[s];
  ASSERT_EQ(total, (long)MT_THREADS * MT_OPS);
  ASSERT_EQ(atomic_load(&sh.out_of_order), 0);
  ASSERT_OK(ops->event_query(sh.b, sh.shared_event));
  size_t free_bytes = 0;
  ASSERT_OK(ops->mem_info(sh.b, &free_bytes, NULL));
  ASSERT_UEQ(free_bytes, cap);

  ops->event_destroy(sh.b, sh.shared_event);
  for (int s = 0; s < MT_STREAMS; s++) ASSERT_OK(ops->stream_destroy(sh.b, sh.streams[s]));
  destroy_backend();
}

/* ---- runner ------------------------------------------------------------------------------- */

static const spw_test_t tests[] = {
    TEST(test_default_stream_exists_and_runs_work),
    TEST(test_default_capacity_is_one_gib),
    TEST(test_default_stream_cannot_be_destroyed),
    TEST(test_ops_on_one_stream_run_in_fifo_order),
    TEST(test_stream_sync_waits_for_slow_host_func),
    TEST(test_event_not_ready_while_host_func_blocks_stream),
    TEST(test_unrecorded_event_is_complete),
    TEST(test_event_rerecord_overwrites_previous_record),
    TEST(test_event_outlives_its_stream),
    TEST(test_wait_event_makes_stream_wait_for_earlier_work),
    TEST(test_wait_event_does_not_wait_for_later_work),
    TEST(test_wait_event_uses_the_record_in_force_at_the_call),
    TEST(test_memcpy_async_copies_in_order_with_other_ops),
    TEST(test_copy_batch_async_copies_in_order_with_other_ops),
    TEST(test_copy_batch_async_rejects_bad_direction),
    TEST(test_alloc_is_256_byte_aligned),
    TEST(test_alloc_beyond_capacity_is_out_of_memory),
    TEST(test_out_of_memory_reaches_the_error_sink),
    TEST(test_capacity_returns_when_free_async_executes),
    TEST(test_free_async_of_null_is_ok),
    TEST(test_alloc_of_zero_bytes_is_invalid_arg),
    TEST(test_host_register_validates_arguments),
    TEST(test_destroy_with_work_queued_waits_for_it),
    TEST(test_stream_destroy_with_work_queued_waits_for_it),
    TEST(test_eight_threads_enqueue_on_four_streams),
};
TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
