/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of a device budget smaller than the data (public API only): many threads
 * and streams working on four times the budget keep every buffer's contents and never pass
 * the limit; a locked buffer is never moved however short memory gets; an allocation fails
 * with SPW_ERR_OUT_OF_MEMORY only when everything else is locked, and says how much is; and
 * the engine spills in the background down from the high watermark.
 *
 * Device memory is touched only through spw_memcpy_async + spw_stream_synchronize, so
 * every test is valid on both backends. Buffer contents are a random template (test_fill)
 * with a stamp at the start of every 4 KiB page naming the buffer, the write and the page:
 * a page that is stale, misplaced or from another buffer shows, and filling or checking a
 * quarter GiB costs memcpy / memcmp rather than a byte loop (which sanitizers slow 10x).
 * SPW_TEST_SEED=n replays a run. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "test_main.h"
#include "test_util.h"

#define MIB ((size_t)1 << 20)
/* 64 MiB; a quarter under ThreadSanitizer, whose memcpy checks would otherwise take half a
 * minute over the gigabytes that four budgets' worth of spilling moves. */
#if defined(__SANITIZE_THREAD__)
#define BUDGET (16 * MIB)
#else
#define BUDGET (64 * MIB)
#endif

static uint64_t seed0;

/* Contents: test_page_fill over this test_fill template (see test_util.h). */
#define MAX_BUF (1 * MIB)
static uint8_t *tmpl; /* MAX_BUF bytes of test_fill */

/* ---- helpers ----------------------------------------------------------------------- */

static spw_runtime_t *budget_runtime(double high, double low) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = BUDGET;
  cfg.host_device_bytes = 2 * BUDGET; /* host backend: the device itself is larger */
  cfg.high_watermark = high;
  cfg.low_watermark = low;
  return test_runtime(&cfg);
}

static void upload(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, const void *src, size_t n) {
  test_write(rt, b, s, src, n);
}

static void expect_version(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, uint8_t *scratch,
                           size_t n, uint64_t version) {
  memset(scratch, 0, n);
  test_read(rt, b, s, scratch, n);
  size_t bad = test_page_mismatch(scratch, n, tmpl, version);
  if (bad != (size_t)-1) {
    fprintf(stderr, "buffer %#" PRIx64 " (%zu bytes, version %#" PRIx64 "): first bad byte %zu\n",
            b, n, version, bad);
    ASSERT_TRUE(!"buffer contents wrong");
  }
}

/* Samples device_bytes until told to stop; the budget is checked against the maximum. */
typedef struct monitor {
  spw_runtime_t *rt;
  atomic_int stop;
  uint64_t max_device, samples;
  pthread_t thread;
} monitor_t;

static void *monitor_main(void *arg) {
  monitor_t *m = arg;
  while (!atomic_load(&m->stop)) {
    spw_stats_t st = stats_of(m->rt);
    if (st.device_bytes > m->max_device) m->max_device = st.device_bytes;
    m->samples++;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static void monitor_start(monitor_t *m, spw_runtime_t *rt) {
  memset(m, 0, sizeof *m);
  m->rt = rt;
  ASSERT_EQ(pthread_create(&m->thread, NULL, monitor_main, m), 0);
}

static void monitor_stop(monitor_t *m) {
  atomic_store(&m->stop, 1);
  ASSERT_EQ(pthread_join(m->thread, NULL), 0);
}

/* ---- many threads over four times the budget -------------------------------------- */

#define THREADS 8
#define STREAMS_PER_THREAD 4
#if defined(__SANITIZE_THREAD__)
#define ROUNDS 25
#else
#define ROUNDS 60
#endif

typedef struct shared_buf {
  spw_buf_t h;
  size_t n;
  uint64_t version; /* written only by the thread holding `busy` */
  uint32_t writes;
  atomic_int busy;  /* the test's own exclusion: one thread uses a buffer at a time */
} shared_buf_t;

typedef struct pending {
  int buf; /* -1: nothing outstanding on this stream */
  uint64_t read_version, new_version;
} pending_t;

typedef struct worker {
  spw_runtime_t *rt;
  shared_buf_t *bufs;
  size_t nbufs;
  uint64_t rng;
  spw_stream_t s[STREAMS_PER_THREAD];
  uint8_t *readback[STREAMS_PER_THREAD], *src[STREAMS_PER_THREAD];
  pending_t p[STREAMS_PER_THREAD];
  uint64_t rounds_sync, rounds_async;
  pthread_t thread;
} worker_t;

/* The stream's work is done: check what it read, and give the buffer up. */
static void finish(worker_t *w, int k) {
  if (w->p[k].buf < 0) return;
  ASSERT_OK(spw_stream_synchronize(w->rt, w->s[k]));
  shared_buf_t *b = &w->bufs[w->p[k].buf];
  size_t bad = test_page_mismatch(w->readback[k], b->n, tmpl, w->p[k].read_version);
  if (bad != (size_t)-1) {
    fprintf(stderr, "buffer %d (%zu bytes, version %#" PRIx64 "): first bad byte %zu\n",
            w->p[k].buf, b->n, w->p[k].read_version, bad);
    ASSERT_TRUE(!"buffer contents wrong under oversubscription");
  }
  b->version = w->p[k].new_version;
  atomic_store(&b->busy, 0);
  w->p[k].buf = -1;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (int r = 0; r < ROUNDS; r++) {
    int k = (int)(test_splitmix(&w->rng) % STREAMS_PER_THREAD);
    finish(w, k);
    int i;
    for (;;) {
      i = (int)(test_splitmix(&w->rng) % w->nbufs);
      int expected = 0;
      if (atomic_compare_exchange_strong(&w->bufs[i].busy, &expected, 1)) break;
    }
    shared_buf_t *b = &w->bufs[i];
    void *d = NULL;
    ASSERT_OK(spw_acquire(w->rt, b->h, w->s[k], 0, &d));
    ASSERT_OK(spw_memcpy_async(w->rt, w->readback[k], d, b->n, w->s[k]));
    const uint64_t nv = ((uint64_t)i << 24) | ++b->writes;
    test_page_fill(w->src[k], b->n, tmpl, nv);
    ASSERT_OK(spw_memcpy_async(w->rt, d, w->src[k], b->n, w->s[k]));
    w->p[k] = (pending_t){i, b->version, nv};
    if (test_splitmix(&w->rng) & 1) {
      finish(w, k);
      w->rounds_sync++;
    } else {
      /* The lock goes when the copies are done; the readback is checked on the stream's
       * next use, after a synchronize. */
      ASSERT_OK(spw_stream_release_async(w->rt, w->s[k]));
      w->rounds_async++;
    }
  }
  for (int k = 0; k < STREAMS_PER_THREAD; k++) finish(w, k);
  return NULL;
}

static void threads_over_four_times_the_budget_keep_contents(void) {
  spw_runtime_t *rt = budget_runtime(0, 0);
  spw_stream_t s0;
  ASSERT_OK(spw_stream_create(rt, &s0));
  uint64_t rng = seed0;

  /* Sizes from 1/1024 to 1/64 of the budget (64 KiB to 1 MiB), not page multiples, until
   * four budgets are allocated. 32 streams holding the largest locked stay under half. */
  const size_t lo = BUDGET / 1024, hi = BUDGET / 64;
  size_t cap = 4 * BUDGET / lo + 1, nbufs = 0, total = 0;
  shared_buf_t *bufs = calloc(cap, sizeof *bufs);
  uint8_t *staging = malloc(MAX_BUF);
  ASSERT_TRUE(bufs && staging);
  monitor_t mon;
  monitor_start(&mon, rt);
  while (total < 4 * BUDGET) {
    shared_buf_t *b = &bufs[nbufs];
    b->n = lo + (size_t)(test_splitmix(&rng) % (hi - lo + 1));
    ASSERT_OK(spw_alloc(rt, b->n, s0, &b->h));
    b->version = (uint64_t)nbufs << 24;
    test_page_fill(staging, b->n, tmpl, b->version);
    upload(rt, b->h, s0, staging, b->n);
    total += b->n;
    nbufs++;
  }
  printf("  %zu buffers, %zu MiB\n", nbufs, total / MIB);

  worker_t *w = calloc(THREADS, sizeof *w);
  ASSERT_TRUE(w != NULL);
  for (int t = 0; t < THREADS; t++) {
    w[t].rt = rt;
    w[t].bufs = bufs;
    w[t].nbufs = nbufs;
    w[t].rng = seed0 * 31 + (uint64_t)t + 1;
    for (int k = 0; k < STREAMS_PER_THREAD; k++) {
      ASSERT_OK(spw_stream_create(rt, &w[t].s[k]));
      w[t].readback[k] = malloc(MAX_BUF);
      w[t].src[k] = malloc(MAX_BUF);
      ASSERT_TRUE(w[t].readback[k] && w[t].src[k]);
      w[t].p[k].buf = -1;
    }
  }
  for (int t = 0; t < THREADS; t++)
    ASSERT_EQ(pthread_create(&w[t].thread, NULL, worker_main, &w[t]), 0);
  uint64_t nsync = 0, nasync = 0;
  for (int t = 0; t < THREADS; t++) {
    ASSERT_EQ(pthread_join(w[t].thread, NULL), 0);
    nsync += w[t].rounds_sync;
    nasync += w[t].rounds_async;
  }
  for (size_t i = 0; i < nbufs; i++) expect_version(rt, bufs[i].h, s0, staging, bufs[i].n, bufs[i].version);
  ASSERT_OK(spw_wait_idle(rt));
  monitor_stop(&mon);

  spw_stats_t st = stats_of(rt);
  printf("  %" PRIu64 " sync + %" PRIu64 " async rounds; %" PRIu64 " samples, max device %" PRIu64
         " B; %" PRIu64 " spills (%" PRIu64 " on demand, %" PRIu64 " background), %" PRIu64
         " unspills\n",
         nsync, nasync, mon.samples, mon.max_device, st.spills, st.spills_on_demand,
         st.spills_background, st.unspills);
  ASSERT_GT(mon.samples, 0);
  ASSERT_LE(mon.max_device, BUDGET);
  ASSERT_LE(st.device_bytes, BUDGET);
  ASSERT_GT(st.spills, 0); /* on demand or in the background: timing decides */
  ASSERT_GT(st.unspills, 0);
  ASSERT_UEQ(st.failures, 0);
  ASSERT_UEQ(st.locked_bytes, 0);

  for (int t = 0; t < THREADS; t++)
    for (int k = 0; k < STREAMS_PER_THREAD; k++) {
      ASSERT_OK(spw_stream_destroy(rt, w[t].s[k]));
      free(w[t].readback[k]);
      free(w[t].src[k]);
    }
  for (size_t i = 0; i < nbufs; i++) ASSERT_OK(spw_free(rt, bufs[i].h));
  st = stats_of(rt);
  ASSERT_UEQ(st.buffers, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.host_bytes, 0);
  free(w);
  free(bufs);
  free(staging);
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* ---- locked buffers stay put -------------------------------------------------------- */

#define NLOCKED 4

typedef struct lock_watch {
  spw_runtime_t *rt;
  spw_buf_t b[NLOCKED];
  atomic_int stop;
  uint64_t checks;
} lock_watch_t;

static void *lock_watch_main(void *arg) {
  lock_watch_t *lw = arg;
  while (!atomic_load(&lw->stop)) {
    for (int i = 0; i < NLOCKED; i++) {
      ASSERT_EQ(state_of(lw->rt, lw->b[i]), SPW_STATE_RESIDENT);
      uint32_t locks = 0;
      ASSERT_OK(spw_buf_lock_count(lw->rt, lw->b[i], &locks));
      ASSERT_GE(locks, 1);
    }
    lw->checks++;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static void locked_buffer_is_never_moved_under_pressure(void) {
  const size_t n = BUDGET / 16; /* four locked: a quarter of the budget */
  spw_runtime_t *rt = budget_runtime(0, 0);
  spw_stream_t sl, sp;
  ASSERT_OK(spw_stream_create(rt, &sl));
  ASSERT_OK(spw_stream_create(rt, &sp));
  lock_watch_t lw;
  memset(&lw, 0, sizeof lw);
  lw.rt = rt;
  /* One source per locked buffer: the copies into them land while the locks are held, so
   * no synchronize (which would release them) can be used to know when a source is free. */
  uint8_t *src[NLOCKED];
  void *held[NLOCKED];
  for (int i = 0; i < NLOCKED; i++) {
    src[i] = malloc(n);
    ASSERT_TRUE(src[i] != NULL);
    for (size_t off = 0; off < n; off += MAX_BUF)
      test_page_fill(src[i] + off, MAX_BUF, tmpl, ((uint64_t)i << 24) | (off / MAX_BUF));
    ASSERT_OK(spw_alloc(rt, n, sl, &lw.b[i]));
    ASSERT_OK(spw_acquire(rt, lw.b[i], sl, 0, &held[i]));
    ASSERT_OK(spw_memcpy_async(rt, held[i], src[i], n, sl));
  }
  uint8_t *staging = malloc(n);
  ASSERT_TRUE(staging != NULL);
  for (size_t off = 0; off < n; off += MAX_BUF)
    test_page_fill(staging + off, MAX_BUF, tmpl, 0xFFFFFF);

  pthread_t watcher;
  ASSERT_EQ(pthread_create(&watcher, NULL, lock_watch_main, &lw), 0);
  /* Pressure: 40 more buffers, 2.5 budgets, with a quarter of the budget locked. */
  spw_buf_t extra[40];
  for (int j = 0; j < 40; j++) {
    ASSERT_OK(spw_alloc(rt, n, sp, &extra[j]));
    upload(rt, extra[j], sp, staging, n);
    if (j % 8 == 7) {
      for (int i = 0; i < NLOCKED; i++) {
        void *again = NULL;
        ASSERT_OK(spw_acquire(rt, lw.b[i], sp, SPW_ACQUIRE_READ, &again));
        ASSERT_PTR_EQ(again, held[i]);
        ASSERT_OK(spw_release(rt, lw.b[i], sp));
      }
    }
  }
  atomic_store(&lw.stop, 1);
  ASSERT_EQ(pthread_join(watcher, NULL), 0);
  ASSERT_GT(lw.checks, 0);
  spw_stats_t st = stats_of(rt);
  ASSERT_GT(st.spills, 0);
  ASSERT_UEQ(st.failures, 0);

  /* Read through the pointers held all along (one synchronize: it releases every lock of
   * sl): the contents never moved away. */
  uint8_t *got[NLOCKED];
  for (int i = 0; i < NLOCKED; i++) {
    got[i] = malloc(n);
    ASSERT_TRUE(got[i] != NULL);
    ASSERT_OK(spw_memcpy_async(rt, got[i], held[i], n, sl));
  }
  ASSERT_OK(spw_stream_synchronize(rt, sl));
  for (int i = 0; i < NLOCKED; i++) {
    for (size_t off = 0; off < n; off += MAX_BUF)
      ASSERT_UEQ(test_page_mismatch(got[i] + off, MAX_BUF, tmpl,
                                    ((uint64_t)i << 24) | (off / MAX_BUF)),
                 (size_t)-1);
    free(got[i]);
  }
  for (int j = 0; j < 40; j++) ASSERT_OK(spw_free(rt, extra[j]));
  for (int i = 0; i < NLOCKED; i++) {
    ASSERT_OK(spw_free(rt, lw.b[i]));
    free(src[i]);
  }
  free(staging);
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* ---- out of memory when everything is locked ----------------------------------------- */

static void alloc_fails_when_everything_else_is_locked(void) {
  const size_t n = BUDGET / 16 * 5; /* three: 15/16 of the budget, under the 95% watermark */
  spw_runtime_t *rt = budget_runtime(0, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[3];
  for (int i = 0; i < 3; i++) {
    void *d = NULL;
    ASSERT_OK(spw_alloc(rt, n, s, &b[i]));
    ASSERT_OK(spw_acquire(rt, b[i], s, 0, &d));
  }
  const spw_stats_t before = stats_of(rt);
  ASSERT_UEQ(before.locked_bytes, 3 * n);
  spw_buf_t extra = (spw_buf_t)0x1234;
  ASSERT_STATUS(spw_alloc(rt, BUDGET / 8, s, &extra), SPW_ERR_OUT_OF_MEMORY);
  ASSERT_UEQ(extra, 0x1234);
  const char *msg = spw_last_error(rt);
  printf("  spw_last_error: %s\n", msg);
  char locked[32];
  snprintf(locked, sizeof locked, "%zu", 3 * n);
  ASSERT_TRUE(strstr(msg, "locked") != NULL);
  ASSERT_TRUE(strstr(msg, locked) != NULL);
  const spw_stats_t after = stats_of(rt);
  ASSERT_UEQ(after.buffers, before.buffers);
  ASSERT_UEQ(after.device_bytes, before.device_bytes);
  ASSERT_UEQ(after.spills, 0);
  for (int i = 0; i < 3; i++) ASSERT_EQ(state_of(rt, b[i]), SPW_STATE_RESIDENT);

  /* One buffer unlocked is enough room: it is spilled and the allocation goes through. */
  ASSERT_OK(spw_release(rt, b[1], s));
  ASSERT_OK(spw_alloc(rt, BUDGET / 8, s, &extra));
  ASSERT_EQ(state_of(rt, b[1]), SPW_STATE_HOST);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_free(rt, extra));
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* ---- background spilling ------------------------------------------------------------ */

static void background_spilling_brings_usage_under_high_watermark(void) {
  spw_runtime_t *rt = budget_runtime(0.5, 0.3);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  const size_t n = 1 * MIB;
  const size_t count = (size_t)(0.9 * (double)BUDGET) / n;
  spw_buf_t *b = calloc(count, sizeof *b);
  ASSERT_TRUE(b != NULL);
  for (size_t i = 0; i < count; i++) ASSERT_OK(spw_alloc(rt, n, s, &b[i]));
  ASSERT_OK(spw_wait_idle(rt));
  const spw_stats_t st = stats_of(rt);
  printf("  %zu MiB allocated: device %" PRIu64 " B, host %" PRIu64 " B, %" PRIu64
         " background spills\n",
         count, st.device_bytes, st.host_bytes, st.spills_background);
  ASSERT_LE(st.device_bytes, BUDGET / 2);
  ASSERT_GT(st.spills_background, 0);
  ASSERT_UEQ(st.spills_on_demand, 0); /* the limit itself was never reached */
  ASSERT_UEQ(st.device_bytes + st.host_bytes, count * n);
  for (size_t i = 0; i < count; i++) ASSERT_OK(spw_free(rt, b[i]));
  free(b);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void setup(void) {
  seed0 = spw_test_seed();
  tmpl = malloc(MAX_BUF);
  ASSERT_TRUE(tmpl != NULL);
  test_fill(tmpl, MAX_BUF, seed0);
}

static void teardown(void) { free(tmpl); }

static const spw_test_t tests[] = {
    TEST(threads_over_four_times_the_budget_keep_contents),
    TEST(locked_buffer_is_never_moved_under_pressure),
    TEST(alloc_fails_when_everything_else_is_locked),
    TEST(background_spilling_brings_usage_under_high_watermark),
};
TEST_MAIN_WITH(tests, setup, teardown)
