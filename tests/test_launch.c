/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of the C launch wrappers (public API only): spw_acquire_args,
 * spw_lock_and_launch in its three release modes, spw_lock_and_launch_async and
 * spw_stream_wait. A launch locks its buffers all or nothing, hands fn each device pointer
 * plus offset, and releases exactly its own locks once the work fn enqueued has completed.
 * The work is device copies and host functions on the stream, so every test is valid on
 * both backends; a gate (a host function that blocks until the test opens it) stands for a
 * long kernel. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "test_main.h"
#include "test_util.h"

#define MiB ((size_t)1 << 20)

static uint32_t locks_of(spw_runtime_t *rt, spw_buf_t b) {
  uint32_t n = 0xFFFFFFFFu;
  ASSERT_OK(spw_buf_lock_count(rt, b, &n));
  return n;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static spw_buf_t alloc_filled(spw_runtime_t *rt, spw_stream_t s, size_t n, uint64_t seed) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, n, s, &b));
  uint8_t *src = malloc(n);
  ASSERT_TRUE(src != NULL);
  test_fill(src, n, seed);
  test_write(rt, b, s, src, n);
  free(src);
  return b;
}

/* ---- a gate: a host function on a stream that blocks until the test opens it ---- */

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int entered, open;
} gate_t;

static void gate_init(gate_t *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->entered = g->open = 0;
}

static void gate_destroy(gate_t *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

static void gate_pass(void *arg) { /* runs on the stream */
  gate_t *g = arg;
  pthread_mutex_lock(&g->mu);
  g->entered = 1;
  pthread_cond_broadcast(&g->cv);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_wait_entered(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  while (!g->entered) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

/* ---- launch functions ---- */

/* What fn saw: its pointers, its stream, and the lock counts while it ran. */
typedef struct seen {
  spw_runtime_t *rt;
  const spw_buf_t *bufs;
  size_t n;
  void *dptrs[8];
  uint32_t locks[8];
  spw_stream_t stream;
  int calls;
  gate_t *gate;   /* if set, fn enqueues gate_pass on the stream */
  int result;     /* what fn returns */
} seen_t;

static int record_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  seen_t *w = user;
  w->calls++;
  w->stream = stream;
  for (size_t i = 0; i < w->n; i++) {
    w->dptrs[i] = dptrs[i];
    w->locks[i] = locks_of(w->rt, w->bufs[i]);
  }
  if (w->gate) ASSERT_OK(spw_launch_host_func(w->rt, stream, gate_pass, w->gate));
  return w->result;
}

/* ---- tests ---- */

static void fn_gets_each_device_pointer_plus_its_offset(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[3];
  void *base[3];
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(spw_alloc(rt, 4096, s, &b[i]));
    ASSERT_OK(spw_acquire(rt, b[i], s, 0, &base[i]));
  }
  ASSERT_OK(spw_stream_synchronize(rt, s));
  spw_buf_arg_t args[3] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 100, SPW_ACQUIRE_READ),
                           spw_buf_arg(b[2], 4096, 0)};
  seen_t w = {.rt = rt, .bufs = b, .n = 3};
  ASSERT_OK(spw_lock_and_launch(rt, args, 3, s, SPW_LAUNCH_BLOCK, record_fn, &w));
  ASSERT_EQ(w.calls, 1);
  ASSERT_PTR_EQ(w.stream, s);
  ASSERT_PTR_EQ(w.dptrs[0], base[0]);
  ASSERT_PTR_EQ(w.dptrs[1], (char *)base[1] + 100);
  ASSERT_PTR_EQ(w.dptrs[2], (char *)base[2] + 4096); /* the end is a valid offset */
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(w.locks[i], 1);
    ASSERT_EQ(locks_of(rt, b[i]), 0);
    ASSERT_OK(spw_free(rt, b[i]));
  }
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void release_waits_for_the_work_fn_enqueued(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b = alloc_filled(rt, s, 64 * 1024, 1);
  gate_t g;
  gate_init(&g);
  spw_buf_arg_t arg = spw_buf_arg(b, 0, 0);
  seen_t w = {.rt = rt, .bufs = &b, .n = 1, .gate = &g};
  ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, 0, record_fn, &w));
  /* The wrapper returned, but the work it launched has not run: the buffer stays locked and
   * cannot be spilled, however long we wait. */
  gate_wait_entered(&g);
  ASSERT_EQ(locks_of(rt, b), 1);
  ASSERT_STATUS(spw_spill(rt, b, SPW_TIER_HOST), SPW_ERR_LOCKED);
  sleep_ms(50);
  ASSERT_EQ(locks_of(rt, b), 1);
  ASSERT_STATUS(spw_spill(rt, b, SPW_TIER_HOST), SPW_ERR_LOCKED);
  gate_open(&g);
  ASSERT_OK(spw_wait_idle(rt)); /* runs the pending release once the stream passed it */
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  test_expect_fill(rt, b, s, 64 * 1024, 1);
  ASSERT_OK(spw_free(rt, b));
  gate_destroy(&g);
  ASSERT_OK(spw_runtime_destroy(rt));
}

typedef struct late_flag {
  atomic_int done;
} late_flag_t;

static void set_late(void *arg) {
  sleep_ms(30);
  atomic_store(&((late_flag_t *)arg)->done, 1);
}

static int late_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  (void)dptrs;
  void **u = user;
  return spw_launch_host_func((spw_runtime_t *)u[0], stream, set_late, u[1]);
}

static void blocking_launch_returns_with_work_done_and_locks_gone(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  late_flag_t f;
  atomic_init(&f.done, 0);
  void *u[2] = {rt, &f};
  spw_buf_arg_t arg = spw_buf_arg(b, 0, 0);
  ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, SPW_LAUNCH_BLOCK, late_fn, u));
  ASSERT_EQ(atomic_load(&f.done), 1);
  ASSERT_EQ(locks_of(rt, b), 0);
  /* Without buffers too: the call still waits for fn's work. */
  atomic_store(&f.done, 0);
  ASSERT_OK(spw_lock_and_launch(rt, NULL, 0, s, SPW_LAUNCH_BLOCK, late_fn, u));
  ASSERT_EQ(atomic_load(&f.done), 1);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void async_launch_keeps_locks_until_stream_synchronize(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[2];
  ASSERT_OK(spw_alloc(rt, 4096, s, &b[0]));
  ASSERT_OK(spw_alloc(rt, 4096, s, &b[1]));
  spw_buf_arg_t args[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, SPW_ACQUIRE_READ)};
  seen_t w = {.rt = rt, .bufs = b, .n = 2};
  ASSERT_OK(spw_lock_and_launch_async(rt, args, 2, s, record_fn, &w));
  /* The work is done, and still the locks stay: they wait for syncAndUnlock. */
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b[0]), 1);
  ASSERT_EQ(locks_of(rt, b[1]), 1);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(rt, b[0]), 0);
  ASSERT_EQ(locks_of(rt, b[1]), 0);
  /* The same through the flag, released by spw_stream_release_async. */
  ASSERT_OK(spw_lock_and_launch(rt, args, 2, s, SPW_LAUNCH_KEEP_LOCKS, record_fn, &w));
  ASSERT_EQ(locks_of(rt, b[0]), 1);
  ASSERT_OK(spw_stream_release_async(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b[0]), 0);
  ASSERT_EQ(locks_of(rt, b[1]), 0);
  ASSERT_OK(spw_free(rt, b[0]));
  ASSERT_OK(spw_free(rt, b[1]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void one_bad_handle_locks_nothing(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[3];
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_alloc(rt, 4096, s, &b[i]));
  spw_buf_t dead;
  ASSERT_OK(spw_alloc(rt, 4096, s, &dead));
  ASSERT_OK(spw_free(rt, dead));
  seen_t w = {.rt = rt, .bufs = b, .n = 3};

  spw_buf_arg_t args[4] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, SPW_ACQUIRE_READ),
                           spw_buf_arg(dead, 0, 0), spw_buf_arg(b[2], 0, 0)};
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 4, s, 0, record_fn, &w), SPW_ERR_FREED);
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 2") != NULL);
  ASSERT_TRUE(strstr(spw_last_error(rt), "SPW_ERR_FREED") != NULL);
  /* A forged handle, first in the list. */
  args[2] = args[0];
  args[0] = spw_buf_arg(b[0] ^ 0x5A5A000000000000ull, 0, 0);
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 4, s, 0, record_fn, &w),
                SPW_ERR_INVALID_HANDLE);
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 0") != NULL);
  ASSERT_EQ(w.calls, 0);
  for (int i = 0; i < 3; i++) ASSERT_EQ(locks_of(rt, b[i]), 0);
  /* Nothing is left in the lock map either: a synchronize finds nothing to release. */
  ASSERT_OK(spw_stream_synchronize(rt, s));
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void out_of_memory_on_the_third_buffer_locks_nothing(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 4 * MiB;
  cfg.high_watermark = 1.0; /* no background spilling: the test decides what is resident */
  cfg.low_watermark = 0.99;
  spw_runtime_t *rt = test_runtime(&cfg);
  spw_stream_t s, other;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_stream_create(rt, &other));
  spw_buf_t a = alloc_filled(rt, s, MiB, 1), b = alloc_filled(rt, s, MiB, 2);
  spw_buf_t c = alloc_filled(rt, s, MiB, 3), d = alloc_filled(rt, s, MiB, 4);
  ASSERT_OK(spw_spill(rt, c, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, c), SPW_STATE_HOST);
  spw_buf_t e;
  ASSERT_OK(spw_alloc(rt, MiB, s, &e)); /* the device is full again */
  /* Everything else resident is locked elsewhere: c cannot come back. */
  void *p;
  ASSERT_OK(spw_acquire(rt, d, other, 0, &p));
  ASSERT_OK(spw_acquire(rt, e, other, 0, &p));

  spw_buf_t bufs[3] = {a, b, c};
  spw_buf_arg_t args[3] = {spw_buf_arg(a, 0, 0), spw_buf_arg(b, 0, 0), spw_buf_arg(c, 0, 0)};
  seen_t w = {.rt = rt, .bufs = bufs, .n = 3};
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 3, s, 0, record_fn, &w), SPW_ERR_OUT_OF_MEMORY);
  ASSERT_EQ(w.calls, 0);
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 2") != NULL);
  ASSERT_EQ(locks_of(rt, a), 0);
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_EQ(locks_of(rt, c), 0);
  ASSERT_EQ(state_of(rt, c), SPW_STATE_HOST);
  /* With the room given back, the same launch succeeds and sees the data. */
  ASSERT_OK(spw_stream_synchronize(rt, other));
  ASSERT_OK(spw_lock_and_launch(rt, args, 3, s, SPW_LAUNCH_BLOCK, record_fn, &w));
  ASSERT_EQ(w.calls, 1);
  test_expect_fill(rt, c, s, MiB, 3);
  spw_buf_t all[5] = {a, b, c, d, e};
  for (int i = 0; i < 5; i++) {
    ASSERT_EQ(locks_of(rt, all[i]), 0);
    ASSERT_OK(spw_free(rt, all[i]));
  }
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void offset_past_the_end_locks_nothing(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[2];
  ASSERT_OK(spw_alloc(rt, 4096, s, &b[0]));
  ASSERT_OK(spw_alloc(rt, 4096, s, &b[1]));
  spw_buf_arg_t args[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 4097, 0)};
  seen_t w = {.rt = rt, .bufs = b, .n = 2};
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 1") != NULL);
  ASSERT_TRUE(strstr(spw_last_error(rt), "past the end") != NULL);
  ASSERT_EQ(w.calls, 0);
  ASSERT_EQ(locks_of(rt, b[0]), 0);
  ASSERT_EQ(locks_of(rt, b[1]), 0);
  ASSERT_OK(spw_free(rt, b[0]));
  ASSERT_OK(spw_free(rt, b[1]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void bad_flags_are_refused_before_any_lock(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[2];
  ASSERT_OK(spw_alloc(rt, 4096, s, &b[0]));
  ASSERT_OK(spw_alloc(rt, 4096, s, &b[1]));
  seen_t w = {.rt = rt, .bufs = b, .n = 2};
  spw_buf_arg_t args[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, 0x80)};
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 1") != NULL);
  args[1] = spw_buf_arg(b[1], 0, 0);
  args[1].reserved = 1;
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w), SPW_ERR_INVALID_ARG);
  args[1].reserved = 0;
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, s, SPW_LAUNCH_BLOCK | SPW_LAUNCH_KEEP_LOCKS,
                                    record_fn, &w),
                SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, s, 0x40, record_fn, &w), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, s, 0, NULL, &w), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_lock_and_launch(rt, NULL, 2, s, 0, record_fn, &w), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_lock_and_launch(NULL, args, 2, s, 0, record_fn, &w), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, (spw_stream_t)(uintptr_t)0x1234, 0, record_fn,
                                    &w),
                SPW_ERR_INVALID_STREAM);
  ASSERT_EQ(w.calls, 0);
  ASSERT_EQ(locks_of(rt, b[0]), 0);
  ASSERT_EQ(locks_of(rt, b[1]), 0);
  ASSERT_OK(spw_free(rt, b[0]));
  ASSERT_OK(spw_free(rt, b[1]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* The outer launch's fn runs an inner launch on the same buffer and stream. */
typedef struct nest {
  spw_runtime_t *rt;
  spw_buf_t b;
  uint32_t inner_locks;
  void *outer_ptr, *inner_ptr;
} nest_t;

static int inner_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  (void)stream;
  nest_t *n = user;
  n->inner_ptr = dptrs[0];
  n->inner_locks = locks_of(n->rt, n->b);
  return 0;
}

static int outer_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  nest_t *n = user;
  n->outer_ptr = dptrs[0];
  spw_buf_arg_t arg = spw_buf_arg(n->b, 0, SPW_ACQUIRE_READ);
  return spw_lock_and_launch(n->rt, &arg, 1, stream, 0, inner_fn, n);
}

static void nested_locks_survive_the_launch(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  void *mine;
  ASSERT_OK(spw_acquire(rt, b, s, 0, &mine)); /* the caller's own lock, on the same stream */
  nest_t n = {.rt = rt, .b = b};
  spw_buf_arg_t arg = spw_buf_arg(b, 0, 0);
  ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, 0, outer_fn, &n));
  ASSERT_EQ(n.inner_locks, 3);
  ASSERT_PTR_EQ(n.outer_ptr, mine);
  ASSERT_PTR_EQ(n.inner_ptr, mine);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b), 1); /* the launches took theirs back, and only theirs */
  ASSERT_OK(spw_release(rt, b, s));
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void other_locks_of_the_stream_survive_the_launch(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b, x;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  ASSERT_OK(spw_alloc(rt, 4096, s, &x));
  void *p;
  ASSERT_OK(spw_acquire(rt, x, s, 0, &p));
  spw_buf_arg_t arg = spw_buf_arg(b, 0, 0);
  seen_t w = {.rt = rt, .bufs = &b, .n = 1};
  for (unsigned flags = 0; flags <= SPW_LAUNCH_BLOCK; flags++) {
    ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, flags, record_fn, &w));
    ASSERT_OK(spw_wait_idle(rt));
    ASSERT_EQ(locks_of(rt, b), 0);
    ASSERT_EQ(locks_of(rt, x), 1);
  }
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* x's lock was still in the map */
  ASSERT_EQ(locks_of(rt, x), 0);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_free(rt, x));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void same_buffer_twice_takes_two_locks(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 8192, s, &b));
  spw_buf_t bufs[2] = {b, b};
  spw_buf_arg_t args[2] = {spw_buf_arg(b, 0, SPW_ACQUIRE_READ), spw_buf_arg(b, 4096, 0)};
  seen_t w = {.rt = rt, .bufs = bufs, .n = 2};
  ASSERT_OK(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w));
  ASSERT_EQ(w.locks[0], 2);
  ASSERT_PTR_EQ(w.dptrs[1], (char *)w.dptrs[0] + 4096);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* fn copies args[0] into args[1] on the stream. */
static int copy_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  void **u = user;
  return spw_memcpy_async((spw_runtime_t *)u[0], dptrs[1], dptrs[0], *(size_t *)u[1], stream);
}

static void read_only_buffer_keeps_its_clean_copy(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  size_t n = 256 * 1024;
  spw_buf_t r = alloc_filled(rt, s, n, 7), w = alloc_filled(rt, s, n, 8);
  spw_buf_t both[2] = {r, w};
  ASSERT_OK(spw_spill_n(rt, both, 2, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, r), SPW_STATE_HOST);
  ASSERT_EQ(state_of(rt, w), SPW_STATE_HOST);

  /* One launch, one read-only buffer and one written: the flags are per buffer. */
  spw_buf_arg_t args[2] = {spw_buf_arg(r, 0, SPW_ACQUIRE_READ), spw_buf_arg(w, 0, 0)};
  void *u[2] = {rt, &n};
  ASSERT_OK(spw_lock_and_launch(rt, args, 2, s, 0, copy_fn, u));
  ASSERT_OK(spw_wait_idle(rt));
  spw_stats_t before = stats_of(rt);
  ASSERT_OK(spw_spill_n(rt, both, 2, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  spw_stats_t after = stats_of(rt);
  ASSERT_UEQ(after.spills - before.spills, 2);
  ASSERT_UEQ(after.clean_respills - before.clean_respills, 1);
  ASSERT_UEQ(after.spill_bytes - before.spill_bytes, n); /* only the written one moved */
  test_expect_fill(rt, r, s, n, 7);
  test_expect_fill(rt, w, s, n, 7);
  ASSERT_OK(spw_free(rt, r));
  ASSERT_OK(spw_free(rt, w));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* Eight threads, eight streams: each launches copies from shared read-only buffers into its
 * own, in every release mode, while a ninth thread keeps spilling the shared buffers. */
#define THREADS 8
#define SHARED 4
#define ROUNDS 60
#define CHUNK (64 * 1024)

typedef struct race {
  spw_runtime_t *rt;
  spw_buf_t shared[SHARED];
  spw_buf_t own[THREADS];
  atomic_int stop;
} race_t;

typedef struct racer {
  race_t *r;
  int id;
} racer_t;

static void *racer_main(void *arg) {
  racer_t *me = arg;
  race_t *r = me->r;
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(r->rt, &s));
  size_t n = CHUNK;
  void *u[2] = {r->rt, &n};
  for (int k = 0; k < ROUNDS; k++) {
    spw_buf_arg_t args[2] = {spw_buf_arg(r->shared[(k + me->id) % SHARED], 0, SPW_ACQUIRE_READ),
                             spw_buf_arg(r->own[me->id], 0, 0)};
    unsigned flags = (unsigned)(k % 3) == 0 ? 0 : (k % 3) == 1 ? SPW_LAUNCH_BLOCK
                                                              : SPW_LAUNCH_KEEP_LOCKS;
    ASSERT_OK(spw_lock_and_launch(r->rt, args, 2, s, flags, copy_fn, u));
    if (flags == SPW_LAUNCH_KEEP_LOCKS) ASSERT_OK(spw_stream_synchronize(r->rt, s));
  }
  ASSERT_OK(spw_stream_wait(r->rt, s));
  ASSERT_OK(spw_stream_destroy(r->rt, s));
  return NULL;
}

static void *spiller_main(void *arg) {
  race_t *r = arg;
  for (unsigned k = 0; !atomic_load(&r->stop); k++) {
    int st = spw_spill(r->rt, r->shared[k % SHARED], SPW_TIER_HOST);
    ASSERT_TRUE(st == SPW_OK || st == SPW_ERR_LOCKED);
    sleep_ms(1);
  }
  return NULL;
}

static void eight_threads_on_eight_streams(void) {
  race_t r = {.rt = test_runtime(NULL)};
  atomic_init(&r.stop, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(r.rt, &s));
  for (int i = 0; i < SHARED; i++) r.shared[i] = alloc_filled(r.rt, s, CHUNK, 100 + i);
  for (int i = 0; i < THREADS; i++) ASSERT_OK(spw_alloc(r.rt, CHUNK, s, &r.own[i]));
  pthread_t spiller, t[THREADS];
  racer_t me[THREADS];
  ASSERT_EQ(pthread_create(&spiller, NULL, spiller_main, &r), 0);
  for (int i = 0; i < THREADS; i++) {
    me[i] = (racer_t){&r, i};
    ASSERT_EQ(pthread_create(&t[i], NULL, racer_main, &me[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  atomic_store(&r.stop, 1);
  ASSERT_EQ(pthread_join(spiller, NULL), 0);
  ASSERT_OK(spw_wait_idle(r.rt));
  for (int i = 0; i < SHARED; i++) {
    ASSERT_EQ(locks_of(r.rt, r.shared[i]), 0);
    test_expect_fill(r.rt, r.shared[i], s, CHUNK, 100 + i);
  }
  for (int i = 0; i < THREADS; i++) {
    ASSERT_EQ(locks_of(r.rt, r.own[i]), 0);
    test_expect_fill(r.rt, r.own[i], s, CHUNK, 100 + (ROUNDS - 1 + i) % SHARED);
  }
  for (int i = 0; i < SHARED; i++) ASSERT_OK(spw_free(r.rt, r.shared[i]));
  for (int i = 0; i < THREADS; i++) ASSERT_OK(spw_free(r.rt, r.own[i]));
  ASSERT_OK(spw_runtime_destroy(r.rt));
}

static void failed_fn_releases_its_locks_and_returns_its_code(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  spw_buf_arg_t arg = spw_buf_arg(b, 0, 0);
  unsigned modes[3] = {0, SPW_LAUNCH_BLOCK, SPW_LAUNCH_KEEP_LOCKS};
  for (int m = 0; m < 3; m++) {
    gate_t g;
    gate_init(&g);
    seen_t w = {.rt = rt, .bufs = &b, .n = 1, .gate = &g, .result = 42};
    ASSERT_EQ(spw_lock_and_launch(rt, &arg, 1, s, modes[m], record_fn, &w), 42);
    /* Even under KEEP_LOCKS: the locks go, but only once the work fn did enqueue is done. */
    ASSERT_EQ(locks_of(rt, b), 1);
    gate_open(&g);
    ASSERT_OK(spw_wait_idle(rt));
    ASSERT_EQ(locks_of(rt, b), 0);
    gate_destroy(&g);
  }
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void launch_without_buffers_calls_fn(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  seen_t w = {.rt = rt};
  ASSERT_OK(spw_lock_and_launch(rt, NULL, 0, NULL, 0, record_fn, &w));
  ASSERT_OK(spw_lock_and_launch_async(rt, NULL, 0, NULL, record_fn, &w));
  ASSERT_EQ(w.calls, 2);
  ASSERT_PTR_EQ(w.stream, NULL);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void acquire_args_writes_nothing_on_failure(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  spw_buf_arg_t args[3] = {spw_buf_arg(b, 8, 0), spw_buf_arg(b, 16, SPW_ACQUIRE_READ),
                           spw_buf_arg(SPW_BUF_NULL, 0, 0)};
  void *d[3] = {&d, &d, &d};
  ASSERT_STATUS(spw_acquire_args(rt, args, 3, s, d), SPW_ERR_INVALID_HANDLE);
  for (int i = 0; i < 3; i++) ASSERT_PTR_EQ(d[i], &d);
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_OK(spw_acquire_args(rt, args, 2, s, d));
  ASSERT_PTR_EQ(d[1], (char *)d[0] + 8);
  ASSERT_EQ(locks_of(rt, b), 2);
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* recorded in the lock map like spw_acquire */
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_STATUS(spw_acquire_args(rt, args, 0, s, d), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire_args(rt, NULL, 1, s, d), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire_args(rt, args, 1, s, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void stream_wait_releases_nothing(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  void *p;
  ASSERT_OK(spw_acquire(rt, b, s, 0, &p));
  late_flag_t f;
  atomic_init(&f.done, 0);
  ASSERT_OK(spw_launch_host_func(rt, s, set_late, &f));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_EQ(atomic_load(&f.done), 1);
  ASSERT_EQ(locks_of(rt, b), 1);
  ASSERT_STATUS(spw_stream_wait(rt, (spw_stream_t)(uintptr_t)0x1234), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_stream_wait(NULL, s), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* From a controller callback, the calls that would wait on a stream refuse. */
typedef struct in_cb {
  spw_runtime_t *rt;
  spw_stream_t s;
  int wait_st, block_st, calls;
} in_cb_t;

static int noop_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  (void)dptrs;
  (void)stream;
  ((in_cb_t *)user)->calls++;
  return 0;
}

static void on_allocated(void *user, spw_buf_t buf, size_t bytes) {
  (void)buf;
  (void)bytes;
  in_cb_t *c = user;
  c->wait_st = spw_stream_wait(c->rt, c->s);
  c->block_st = spw_lock_and_launch(c->rt, NULL, 0, c->s, SPW_LAUNCH_BLOCK, noop_fn, c);
}

static void waiting_calls_refuse_inside_a_callback(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  in_cb_t c = {.rt = rt};
  ASSERT_OK(spw_stream_create(rt, &c.s));
  spw_controller_t ctl = {.struct_size = sizeof ctl, .allocated = on_allocated};
  ASSERT_OK(spw_set_controller(rt, &ctl, &c));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, c.s, &b));
  ASSERT_OK(spw_set_controller(rt, NULL, NULL));
  ASSERT_STATUS(c.wait_st, SPW_ERR_WOULD_DEADLOCK);
  ASSERT_STATUS(c.block_st, SPW_ERR_WOULD_DEADLOCK);
  ASSERT_EQ(c.calls, 0);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(fn_gets_each_device_pointer_plus_its_offset),
    TEST(release_waits_for_the_work_fn_enqueued),
    TEST(blocking_launch_returns_with_work_done_and_locks_gone),
    TEST(async_launch_keeps_locks_until_stream_synchronize),
    TEST(one_bad_handle_locks_nothing),
    TEST(out_of_memory_on_the_third_buffer_locks_nothing),
    TEST(offset_past_the_end_locks_nothing),
    TEST(bad_flags_are_refused_before_any_lock),
    TEST(nested_locks_survive_the_launch),
    TEST(other_locks_of_the_stream_survive_the_launch),
    TEST(same_buffer_twice_takes_two_locks),
    TEST(read_only_buffer_keeps_its_clean_copy),
    TEST(eight_threads_on_eight_streams),
    TEST(failed_fn_releases_its_locks_and_returns_its_code),
    TEST(launch_without_buffers_calls_fn),
    TEST(acquire_args_writes_nothing_on_failure),
    TEST(stream_wait_releases_nothing),
    TEST(waiting_calls_refuse_inside_a_callback),
};
TEST_MAIN(tests)
