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

#include "gate.h"
#include "test_main.h"
#include "test_util.h"

#define MiB ((size_t)1 << 20)

static uint32_t locks_of(spw_runtime_t *rt, spw_buf_t b) {
  uint32_t n = 0xFFFFFFFFu;
  ASSERT_OK(spw_buf_lock_count(rt, b, &n));
  return n;
}

/* The fixture every test starts from (open_fixture / close_fixture): a runtime on the test's backend, a
 * stream and three buffers of 4 KiB. The runtime's destruction frees what a test left. */
static spw_runtime_t *rt;
static spw_stream_t s;
static spw_buf_t b[3];

static void open_fixture(void) {
  rt = test_runtime(NULL);
  ASSERT_OK(spw_stream_create(rt, &s));
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_alloc(rt, 4096, s, &b[i]));
}

static void close_fixture(void) {
  if (rt) ASSERT_OK(spw_runtime_destroy(rt));
  rt = NULL;
}

/* Waits for the engine; then none of the first n fixture buffers holds a lock. */
static void expect_unlocked(int n) {
  ASSERT_OK(spw_wait_idle(rt));
  for (int i = 0; i < n; i++) ASSERT_EQ(locks_of(rt, b[i]), 0);
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
  gate_t *gate;   /* if set, fn enqueues gate_wait on the stream */
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
  if (w->gate) ASSERT_OK(spw_launch_host_func(w->rt, stream, gate_wait, w->gate));
  return w->result;
}

/* ---- tests ---- */

static void fn_gets_each_device_pointer_plus_its_offset(void) {
  void *base[3];
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_acquire(rt, b[i], s, 0, &base[i]));
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
  for (int i = 0; i < 3; i++) ASSERT_EQ(w.locks[i], 1);
  expect_unlocked(3);
}

static void release_waits_for_the_work_fn_enqueued(void) {
  spw_buf_t f = test_filled(rt, s, 64 * 1024, 1);
  gate_t g;
  gate_init(&g);
  spw_buf_arg_t arg = spw_buf_arg(f, 0, 0);
  seen_t w = {.rt = rt, .bufs = &f, .n = 1, .gate = &g};
  ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, 0, record_fn, &w));
  /* The wrapper returned, but the work it launched has not run: the buffer stays locked and
   * cannot be spilled, however long we wait. */
  gate_await_entered(&g);
  ASSERT_EQ(locks_of(rt, f), 1);
  ASSERT_STATUS(spw_spill(rt, f, SPW_TIER_HOST), SPW_ERR_LOCKED);
  test_sleep_ms(50);
  ASSERT_EQ(locks_of(rt, f), 1);
  ASSERT_STATUS(spw_spill(rt, f, SPW_TIER_HOST), SPW_ERR_LOCKED);
  gate_open(&g);
  ASSERT_OK(spw_wait_idle(rt)); /* runs the pending release once the stream passed it */
  ASSERT_EQ(locks_of(rt, f), 0);
  ASSERT_OK(spw_spill(rt, f, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, f), SPW_STATE_HOST);
  test_expect_fill(rt, f, s, 64 * 1024, 1);
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_fini(&g);
}

/* Launches back to back share one pending release (one completion item, its event recorded
 * again at each launch): each lock still goes only once its own launch's work has run. */
static void back_to_back_launches_release_each_after_its_own_work(void) {
  gate_t g;
  gate_init(&g);
  spw_buf_arg_t a0 = spw_buf_arg(b[0], 0, 0), a1 = spw_buf_arg(b[1], 0, 0),
                a2 = spw_buf_arg(b[2], 0, 0);
  seen_t w0 = {.rt = rt, .bufs = &b[0], .n = 1};
  seen_t w1 = {.rt = rt, .bufs = &b[1], .n = 1, .gate = &g};
  seen_t w2 = {.rt = rt, .bufs = &b[2], .n = 1};
  ASSERT_OK(spw_lock_and_launch(rt, &a0, 1, s, 0, record_fn, &w0));
  ASSERT_OK(spw_lock_and_launch(rt, &a1, 1, s, 0, record_fn, &w1));
  ASSERT_OK(spw_lock_and_launch(rt, &a2, 1, s, 0, record_fn, &w2));
  gate_await_entered(&g);
  test_sleep_ms(50); /* many polling rounds */
  /* b[0]'s own work has run; its release may wait for the later launches it shares an event
   * with. b[1] and b[2] are behind the gate. */
  ASSERT_EQ(locks_of(rt, b[1]), 1);
  ASSERT_EQ(locks_of(rt, b[2]), 1);
  ASSERT_STATUS(spw_spill(rt, b[2], SPW_TIER_HOST), SPW_ERR_LOCKED);
  gate_open(&g);
  expect_unlocked(3);
  ASSERT_TRUE(!gate_timed_out(&g));
  gate_fini(&g);
}

/* Many launches on one stream with nothing between them, and a synchronize: every release is
 * carried out (none lost in a shared item), the last ones by the synchronize itself. */
static void many_back_to_back_launches_lose_no_release(void) {
  spw_buf_arg_t args[3] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, SPW_ACQUIRE_READ),
                           spw_buf_arg(b[2], 0, 0)};
  seen_t w = {.rt = rt, .bufs = b, .n = 3};
  for (int i = 0; i < 2000; i++)
    ASSERT_OK(spw_lock_and_launch(rt, args, 1 + (size_t)(i % 3), s, 0, record_fn, &w));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  for (int i = 0; i < 3; i++) ASSERT_EQ(locks_of(rt, b[i]), 0);
  ASSERT_EQ(w.calls, 2000);
}

typedef struct late_flag {
  atomic_int done;
} late_flag_t;

static void set_late(void *arg) {
  test_sleep_ms(30);
  atomic_store(&((late_flag_t *)arg)->done, 1);
}

static int late_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  (void)dptrs;
  return spw_launch_host_func(rt, stream, set_late, user);
}

static void blocking_launch_returns_with_work_done_and_locks_gone(void) {
  late_flag_t f;
  atomic_init(&f.done, 0);
  spw_buf_arg_t arg = spw_buf_arg(b[0], 0, 0);
  ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, SPW_LAUNCH_BLOCK, late_fn, &f));
  ASSERT_EQ(atomic_load(&f.done), 1);
  ASSERT_EQ(locks_of(rt, b[0]), 0);
  /* Without buffers too: the call still waits for fn's work. */
  atomic_store(&f.done, 0);
  ASSERT_OK(spw_lock_and_launch(rt, NULL, 0, s, SPW_LAUNCH_BLOCK, late_fn, &f));
  ASSERT_EQ(atomic_load(&f.done), 1);
}

static void async_launch_keeps_locks_until_stream_synchronize(void) {
  spw_buf_arg_t args[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, SPW_ACQUIRE_READ)};
  seen_t w = {.rt = rt, .bufs = b, .n = 2};
  ASSERT_OK(spw_lock_and_launch_async(rt, args, 2, s, record_fn, &w));
  /* The work is done, and still the locks stay: they wait for syncAndUnlock. */
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b[0]), 1);
  ASSERT_EQ(locks_of(rt, b[1]), 1);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  expect_unlocked(2);
  /* The same through the flag, released by spw_stream_release_async. */
  ASSERT_OK(spw_lock_and_launch(rt, args, 2, s, SPW_LAUNCH_KEEP_LOCKS, record_fn, &w));
  ASSERT_EQ(locks_of(rt, b[0]), 1);
  ASSERT_OK(spw_stream_release_async(rt, s));
  expect_unlocked(2);
}

static void one_bad_handle_locks_nothing(void) {
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
  expect_unlocked(3);
  /* Nothing is left in the lock map either: a synchronize finds nothing to release. */
  ASSERT_OK(spw_stream_synchronize(rt, s));
}

static void out_of_memory_on_the_third_buffer_locks_nothing(void) {
  /* A runtime of its own, with a small budget. */
  ASSERT_OK(spw_runtime_destroy(rt));
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 4 * MiB;
  cfg.high_watermark = 1.0; /* no background spilling: the test decides what is resident */
  cfg.low_watermark = 0.99;
  rt = test_runtime(&cfg);
  spw_stream_t other;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_stream_create(rt, &other));
  spw_buf_t a = test_filled(rt, s, MiB, 1), c2 = test_filled(rt, s, MiB, 2);
  spw_buf_t c = test_filled(rt, s, MiB, 3), d = test_filled(rt, s, MiB, 4);
  ASSERT_OK(spw_spill(rt, c, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, c), SPW_STATE_HOST);
  spw_buf_t e;
  ASSERT_OK(spw_alloc(rt, MiB, s, &e)); /* the device is full again */
  /* Everything else resident is locked elsewhere: c cannot come back. */
  void *p;
  ASSERT_OK(spw_acquire(rt, d, other, 0, &p));
  ASSERT_OK(spw_acquire(rt, e, other, 0, &p));

  spw_buf_t bufs[3] = {a, c2, c};
  spw_buf_arg_t args[3] = {spw_buf_arg(a, 0, 0), spw_buf_arg(c2, 0, 0), spw_buf_arg(c, 0, 0)};
  seen_t w = {.rt = rt, .bufs = bufs, .n = 3};
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 3, s, 0, record_fn, &w), SPW_ERR_OUT_OF_MEMORY);
  ASSERT_EQ(w.calls, 0);
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 2") != NULL);
  for (int i = 0; i < 3; i++) ASSERT_EQ(locks_of(rt, bufs[i]), 0);
  ASSERT_EQ(state_of(rt, c), SPW_STATE_HOST);
  /* With the room given back, the same launch succeeds and sees the data. */
  ASSERT_OK(spw_stream_synchronize(rt, other));
  ASSERT_OK(spw_lock_and_launch(rt, args, 3, s, SPW_LAUNCH_BLOCK, record_fn, &w));
  ASSERT_EQ(w.calls, 1);
  test_expect_fill(rt, c, s, MiB, 3);
  spw_buf_t all[5] = {a, c2, c, d, e};
  for (int i = 0; i < 5; i++) ASSERT_EQ(locks_of(rt, all[i]), 0);
}

static void offset_past_the_end_locks_nothing(void) {
  spw_buf_arg_t args[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 4097, 0)};
  seen_t w = {.rt = rt, .bufs = b, .n = 2};
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 1") != NULL);
  ASSERT_TRUE(strstr(spw_last_error(rt), "past the end") != NULL);
  ASSERT_EQ(w.calls, 0);
  expect_unlocked(2);
}

static void bad_flags_are_refused_st0any_lock(void) {
  seen_t w = {.rt = rt, .bufs = b, .n = 2};
  spw_buf_arg_t args[2] = {spw_buf_arg(b[0], 0, 0), spw_buf_arg(b[1], 0, 0x80)};
#define REFUSED(call) ASSERT_STATUS(call, SPW_ERR_INVALID_ARG)
  REFUSED(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w));
  ASSERT_TRUE(strstr(spw_last_error(rt), "argument 1") != NULL);
  args[1] = spw_buf_arg(b[1], 0, 0);
  args[1].reserved = 1;
  REFUSED(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w));
  args[1].reserved = 0;
  REFUSED(spw_lock_and_launch(rt, args, 2, s, SPW_LAUNCH_BLOCK | SPW_LAUNCH_KEEP_LOCKS,
                              record_fn, &w));
  REFUSED(spw_lock_and_launch(rt, args, 2, s, 0x40, record_fn, &w));
  REFUSED(spw_lock_and_launch(rt, args, 2, s, 0, NULL, &w));
  REFUSED(spw_lock_and_launch(rt, NULL, 2, s, 0, record_fn, &w));
  REFUSED(spw_lock_and_launch(NULL, args, 2, s, 0, record_fn, &w));
#undef REFUSED
  ASSERT_STATUS(spw_lock_and_launch(rt, args, 2, (spw_stream_t)(uintptr_t)0x1234, 0, record_fn,
                                    &w),
                SPW_ERR_INVALID_STREAM);
  ASSERT_EQ(w.calls, 0);
  expect_unlocked(2);
}

/* The outer launch's fn runs an inner launch on the same buffer and stream. */
typedef struct nest {
  uint32_t inner_locks;
  void *outer_ptr, *inner_ptr;
} nest_t;

static int inner_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  (void)stream;
  nest_t *n = user;
  n->inner_ptr = dptrs[0];
  n->inner_locks = locks_of(rt, b[0]);
  return 0;
}

static int outer_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  nest_t *n = user;
  n->outer_ptr = dptrs[0];
  spw_buf_arg_t arg = spw_buf_arg(b[0], 0, SPW_ACQUIRE_READ);
  return spw_lock_and_launch(rt, &arg, 1, stream, 0, inner_fn, n);
}

static void nested_locks_survive_the_launch(void) {
  void *mine;
  ASSERT_OK(spw_acquire(rt, b[0], s, 0, &mine)); /* the caller's own lock, on the same stream */
  nest_t n = {0};
  spw_buf_arg_t arg = spw_buf_arg(b[0], 0, 0);
  ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, 0, outer_fn, &n));
  ASSERT_EQ(n.inner_locks, 3);
  ASSERT_PTR_EQ(n.outer_ptr, mine);
  ASSERT_PTR_EQ(n.inner_ptr, mine);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, b[0]), 1); /* the launches took theirs back, and only theirs */
  ASSERT_OK(spw_release(rt, b[0], s));
  ASSERT_EQ(locks_of(rt, b[0]), 0);
}

static void other_locks_of_the_stream_survive_the_launch(void) {
  void *p;
  ASSERT_OK(spw_acquire(rt, b[1], s, 0, &p));
  spw_buf_arg_t arg = spw_buf_arg(b[0], 0, 0);
  seen_t w = {.rt = rt, .bufs = b, .n = 1};
  for (unsigned flags = 0; flags <= SPW_LAUNCH_BLOCK; flags++) {
    ASSERT_OK(spw_lock_and_launch(rt, &arg, 1, s, flags, record_fn, &w));
    expect_unlocked(1);
    ASSERT_EQ(locks_of(rt, b[1]), 1);
  }
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* b[1]'s lock was still in the map */
  ASSERT_EQ(locks_of(rt, b[1]), 0);
}

static void same_buffer_twice_takes_two_locks(void) {
  spw_buf_t big;
  ASSERT_OK(spw_alloc(rt, 8192, s, &big));
  spw_buf_t bufs[2] = {big, big};
  spw_buf_arg_t args[2] = {spw_buf_arg(big, 0, SPW_ACQUIRE_READ), spw_buf_arg(big, 4096, 0)};
  seen_t w = {.rt = rt, .bufs = bufs, .n = 2};
  ASSERT_OK(spw_lock_and_launch(rt, args, 2, s, 0, record_fn, &w));
  ASSERT_EQ(w.locks[0], 2);
  ASSERT_PTR_EQ(w.dptrs[1], (char *)w.dptrs[0] + 4096);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(locks_of(rt, big), 0);
}

/* fn copies args[0] into args[1] on the stream; user points at the size. */
static int copy_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  return spw_memcpy_async(rt, dptrs[1], dptrs[0], *(size_t *)user, stream);
}

static void read_only_buffer_keeps_its_clean_copy(void) {
  size_t n = 256 * 1024;
  spw_buf_t r = test_filled(rt, s, n, 7), w = test_filled(rt, s, n, 8);
  spw_buf_t both[2] = {r, w};
  ASSERT_OK(spw_spill_n(rt, both, 2, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, r), SPW_STATE_HOST);
  ASSERT_EQ(state_of(rt, w), SPW_STATE_HOST);

  /* One launch, one read-only buffer and one written: the flags are per buffer. */
  spw_buf_arg_t args[2] = {spw_buf_arg(r, 0, SPW_ACQUIRE_READ), spw_buf_arg(w, 0, 0)};
  ASSERT_OK(spw_lock_and_launch(rt, args, 2, s, 0, copy_fn, &n));
  ASSERT_OK(spw_wait_idle(rt));
  test_spilled_t d = test_spill_counted(rt, both, 2, SPW_TIER_HOST);
  ASSERT_UEQ(d.spills, 2);
  ASSERT_UEQ(d.clean_respills, 1);
  ASSERT_UEQ(d.spill_bytes, n); /* only the written one moved */
  test_expect_fill(rt, r, s, n, 7);
  test_expect_fill(rt, w, s, n, 7);
}

/* Eight threads, eight streams: each launches copies from shared read-only buffers into its
 * own, in every release mode, while a ninth thread keeps spilling the shared buffers. */
#define THREADS 8
#define SHARED 4
#define ROUNDS 60
#define CHUNK (64 * 1024)

static spw_buf_t shared[SHARED], own[THREADS];
static atomic_int stop_spilling;

static void *racer_main(void *arg) {
  int id = (int)(intptr_t)arg;
  spw_stream_t rs;
  ASSERT_OK(spw_stream_create(rt, &rs));
  size_t n = CHUNK;
  for (int k = 0; k < ROUNDS; k++) {
    spw_buf_arg_t args[2] = {spw_buf_arg(shared[(k + id) % SHARED], 0, SPW_ACQUIRE_READ),
                             spw_buf_arg(own[id], 0, 0)};
    unsigned flags = (unsigned)(k % 3) == 0 ? 0 : (k % 3) == 1 ? SPW_LAUNCH_BLOCK
                                                              : SPW_LAUNCH_KEEP_LOCKS;
    ASSERT_OK(spw_lock_and_launch(rt, args, 2, rs, flags, copy_fn, &n));
    if (flags == SPW_LAUNCH_KEEP_LOCKS) ASSERT_OK(spw_stream_synchronize(rt, rs));
  }
  ASSERT_OK(spw_stream_wait(rt, rs));
  ASSERT_OK(spw_stream_destroy(rt, rs));
  return NULL;
}

static void *spiller_main(void *arg) {
  (void)arg;
  unsigned k = 0;
  while (!atomic_load(&stop_spilling)) {
    int st = spw_spill(rt, shared[k++ % SHARED], SPW_TIER_HOST);
    ASSERT_TRUE(st == SPW_OK || st == SPW_ERR_LOCKED);
    test_sleep_ms(1);
  }
  return NULL;
}

static void eight_threads_on_eight_streams(void) {
  atomic_init(&stop_spilling, 0);
  for (int i = 0; i < SHARED; i++) shared[i] = test_filled(rt, s, CHUNK, 100 + i);
  for (int i = 0; i < THREADS; i++) ASSERT_OK(spw_alloc(rt, CHUNK, s, &own[i]));
  pthread_t spiller, t[THREADS];
  ASSERT_EQ(pthread_create(&spiller, NULL, spiller_main, NULL), 0);
  for (int i = 0; i < THREADS; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, racer_main, (void *)(intptr_t)i), 0);
  for (int i = 0; i < THREADS; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  atomic_store(&stop_spilling, 1);
  ASSERT_EQ(pthread_join(spiller, NULL), 0);
  ASSERT_OK(spw_wait_idle(rt));
  for (int i = 0; i < SHARED; i++) {
    ASSERT_EQ(locks_of(rt, shared[i]), 0);
    test_expect_fill(rt, shared[i], s, CHUNK, 100 + i);
  }
  for (int i = 0; i < THREADS; i++) {
    ASSERT_EQ(locks_of(rt, own[i]), 0);
    test_expect_fill(rt, own[i], s, CHUNK, 100 + (ROUNDS - 1 + i) % SHARED);
  }
}

static void failed_fn_releases_its_locks_and_returns_its_code(void) {
  spw_buf_arg_t arg = spw_buf_arg(b[0], 0, 0);
  unsigned modes[3] = {0, SPW_LAUNCH_BLOCK, SPW_LAUNCH_KEEP_LOCKS};
  for (int m = 0; m < 3; m++) {
    gate_t g;
    gate_init(&g);
    seen_t w = {.rt = rt, .bufs = b, .n = 1, .gate = &g, .result = 42};
    ASSERT_EQ(spw_lock_and_launch(rt, &arg, 1, s, modes[m], record_fn, &w), 42);
    /* Even under KEEP_LOCKS: the locks go, but only once the work fn did enqueue is done. */
    ASSERT_EQ(locks_of(rt, b[0]), 1);
    gate_open(&g);
    expect_unlocked(1);
    ASSERT_TRUE(!gate_timed_out(&g));
    gate_fini(&g);
  }
}

static void launch_without_buffers_calls_fn(void) {
  seen_t w = {.rt = rt};
  ASSERT_OK(spw_lock_and_launch(rt, NULL, 0, NULL, 0, record_fn, &w));
  ASSERT_OK(spw_lock_and_launch_async(rt, NULL, 0, NULL, record_fn, &w));
  ASSERT_EQ(w.calls, 2);
  ASSERT_PTR_EQ(w.stream, NULL);
}

static void acquire_args_writes_nothing_on_failure(void) {
  spw_buf_arg_t args[3] = {spw_buf_arg(b[0], 8, 0), spw_buf_arg(b[0], 16, SPW_ACQUIRE_READ),
                           spw_buf_arg(SPW_BUF_NULL, 0, 0)};
  void *d[3] = {&d, &d, &d};
  ASSERT_STATUS(spw_acquire_args(rt, args, 3, s, d), SPW_ERR_INVALID_HANDLE);
  for (int i = 0; i < 3; i++) ASSERT_PTR_EQ(d[i], &d);
  ASSERT_EQ(locks_of(rt, b[0]), 0);
  ASSERT_OK(spw_acquire_args(rt, args, 2, s, d));
  ASSERT_PTR_EQ(d[1], (char *)d[0] + 8);
  ASSERT_EQ(locks_of(rt, b[0]), 2);
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* recorded in the lock map like spw_acquire */
  ASSERT_EQ(locks_of(rt, b[0]), 0);
  ASSERT_STATUS(spw_acquire_args(rt, args, 0, s, d), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire_args(rt, NULL, 1, s, d), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire_args(rt, args, 1, s, NULL), SPW_ERR_INVALID_ARG);
}

static void stream_wait_releases_nothing(void) {
  void *p;
  ASSERT_OK(spw_acquire(rt, b[0], s, 0, &p));
  late_flag_t f;
  atomic_init(&f.done, 0);
  ASSERT_OK(spw_launch_host_func(rt, s, set_late, &f));
  ASSERT_OK(spw_stream_wait(rt, s));
  ASSERT_EQ(atomic_load(&f.done), 1);
  ASSERT_EQ(locks_of(rt, b[0]), 1);
  ASSERT_STATUS(spw_stream_wait(rt, (spw_stream_t)(uintptr_t)0x1234), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_stream_wait(NULL, s), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_stream_synchronize(rt, s));
}

/* From a controller callback, the calls that would wait on a stream refuse. */
typedef struct in_cb {
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
  c->wait_st = spw_stream_wait(rt, s);
  c->block_st = spw_lock_and_launch(rt, NULL, 0, s, SPW_LAUNCH_BLOCK, noop_fn, c);
}

static void waiting_calls_refuse_inside_a_callback(void) {
  in_cb_t c = {0};
  spw_controller_t ctl = {.struct_size = sizeof ctl, .allocated = on_allocated};
  ASSERT_OK(spw_set_controller(rt, &ctl, &c));
  spw_buf_t x;
  ASSERT_OK(spw_alloc(rt, 4096, s, &x));
  ASSERT_OK(spw_set_controller(rt, NULL, NULL));
  ASSERT_STATUS(c.wait_st, SPW_ERR_WOULD_DEADLOCK);
  ASSERT_STATUS(c.block_st, SPW_ERR_WOULD_DEADLOCK);
  ASSERT_EQ(c.calls, 0);
}

static const spw_test_t tests[] = {
    TEST(fn_gets_each_device_pointer_plus_its_offset),
    TEST(release_waits_for_the_work_fn_enqueued),
    TEST(back_to_back_launches_release_each_after_its_own_work),
    TEST(many_back_to_back_launches_lose_no_release),
    TEST(blocking_launch_returns_with_work_done_and_locks_gone),
    TEST(async_launch_keeps_locks_until_stream_synchronize),
    TEST(one_bad_handle_locks_nothing),
    TEST(out_of_memory_on_the_third_buffer_locks_nothing),
    TEST(offset_past_the_end_locks_nothing),
    TEST(bad_flags_are_refused_st0any_lock),
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
TEST_MAIN_FIXTURE(tests, open_fixture, close_fixture)
