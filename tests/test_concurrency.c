/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour test of the runtime under concurrent use (public API only): 16 threads on 8
 * runtime-created streams run a random mix of alloc, acquire, acquire_n, release, free
 * (also of buffers locked on some stream), synchronize and release_async, each step with
 * an exact expected status; at the end every lock is gone and every byte is accounted for.
 *
 * The expectations are exact because the test, not the library, arbitrates ownership:
 *  - a pool slot holds one buffer; its atomic state is 0 (empty), -1 (one thread is
 *    allocating or freeing it, exclusively) or 1 + the number of threads using it. A handle
 *    is only used by a thread that counted itself in, so it is live throughout the use;
 *    free needs the slot with no user, but the buffer may still hold locks on streams, left
 *    there on purpose ("persistent" locks);
 *  - a per-stream rwlock: a thread that will spw_release its own locks holds it shared from
 *    acquire to release, synchronize and release_async hold it exclusive, so no one
 *    releases a lock that a thread still means to release itself. Many threads share a
 *    stream (shared mode), so the lock maps see concurrent acquires and releases.
 * Handles freed by a thread are remembered: they must give SPW_ERR_FREED forever. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "test_main.h"
#include "test_util.h"

enum {
  THREADS = 16,
  STREAMS = 8,
  SLOTS = 64,
  OPS_PER_THREAD = 60000,
  TIME_LIMIT_MS = 3000,
  DEAD_RING = 32,
  MAX_N = 4,
  COPY_BYTES = 256,
};

enum { SLOT_EMPTY = 0, SLOT_EXCLUSIVE = -1, SLOT_LIVE = 1 };

typedef struct slot {
  atomic_int state;
  spw_buf_t handle; /* written by the exclusive owner, published by the state store */
  size_t bytes;
} slot_t;

typedef struct shared {
  spw_runtime_t *rt;
  spw_stream_t streams[STREAMS];
  pthread_rwlock_t stream_rw[STREAMS];
  slot_t slots[SLOTS];
  struct timespec start;
} shared_t;

typedef struct worker {
  shared_t *sh;
  int index;
  uint64_t rng;
  spw_buf_t dead[DEAD_RING];
  size_t ndead;
  uint64_t ops[10];
  uint64_t freed_while_locked;
} worker_t;

/* Source of the copies queued into persistently locked buffers; read-only. */
static const uint8_t copy_source[COPY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};

static uint64_t next_rand(worker_t *w) {
  uint64_t x = w->rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  w->rng = x;
  return x * 0x2545F4914F6CDD1Dull;
}

static unsigned pick(worker_t *w, unsigned n) { return (unsigned)(next_rand(w) % n); }

static long elapsed_ms(const struct timespec *start) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (now.tv_sec - start->tv_sec) * 1000L + (now.tv_nsec - start->tv_nsec) / 1000000L;
}

/* Counts the caller in as a user of a live slot; false if the slot is not live. */
static bool slot_use(slot_t *s) {
  int v = atomic_load(&s->state);
  while (v >= SLOT_LIVE)
    if (atomic_compare_exchange_weak(&s->state, &v, v + 1)) return true;
  return false;
}

static void slot_unuse(slot_t *s) { atomic_fetch_sub(&s->state, 1); }

static void op_alloc(worker_t *w) {
  shared_t *sh = w->sh;
  slot_t *s = &sh->slots[pick(w, SLOTS)];
  int expected = SLOT_EMPTY;
  if (!atomic_compare_exchange_strong(&s->state, &expected, SLOT_EXCLUSIVE)) return;
  s->bytes = 256 + (size_t)pick(w, 64) * 1024;
  spw_buf_t b = 0;
  ASSERT_OK(spw_alloc(sh->rt, s->bytes, sh->streams[pick(w, STREAMS)], &b));
  ASSERT_NE(b, SPW_BUF_NULL);
  s->handle = b;
  atomic_store(&s->state, SLOT_LIVE);
}

static void op_free(worker_t *w) {
  shared_t *sh = w->sh;
  slot_t *s = &sh->slots[pick(w, SLOTS)];
  int expected = SLOT_LIVE;
  if (!atomic_compare_exchange_strong(&s->state, &expected, SLOT_EXCLUSIVE)) return;
  uint32_t locks = 0;
  ASSERT_OK(spw_buf_lock_count(sh->rt, s->handle, &locks));
  if (locks > 0) w->freed_while_locked++; /* a stream still holds it: free must cope */
  ASSERT_OK(spw_free(sh->rt, s->handle));
  w->dead[w->ndead++ % DEAD_RING] = s->handle;
  s->handle = 0;
  atomic_store(&s->state, SLOT_EMPTY);
}

/* Acquires 1-3 times and releases as many, on a stream it holds shared. */
static void op_acquire_release(worker_t *w) {
  shared_t *sh = w->sh;
  slot_t *s = &sh->slots[pick(w, SLOTS)];
  if (!slot_use(s)) return;
  unsigned k = pick(w, STREAMS), n = 1 + pick(w, 3);
  ASSERT_EQ(pthread_rwlock_rdlock(&sh->stream_rw[k]), 0);
  void *first = NULL;
  for (unsigned i = 0; i < n; i++) {
    void *d = NULL;
    ASSERT_OK(spw_acquire(sh->rt, s->handle, sh->streams[k], pick(w, 2) ? SPW_ACQUIRE_READ : 0,
                          &d));
    ASSERT_TRUE(d != NULL);
    if (i == 0) first = d;
    ASSERT_UEQ((uintptr_t)d, (uintptr_t)first);
  }
  uint32_t locks = 0;
  ASSERT_OK(spw_buf_lock_count(sh->rt, s->handle, &locks));
  ASSERT_GE(locks, n);
  for (unsigned i = 0; i < n; i++) ASSERT_OK(spw_release(sh->rt, s->handle, sh->streams[k]));
  ASSERT_EQ(pthread_rwlock_unlock(&sh->stream_rw[k]), 0);
  slot_unuse(s);
}

/* Acquires and leaves the lock to the stream (synchronize or release_async), with a copy
 * queued into the buffer so that releasing before the stream's work is done would show. */
static void op_acquire_persistent(worker_t *w) {
  shared_t *sh = w->sh;
  slot_t *s = &sh->slots[pick(w, SLOTS)];
  if (!slot_use(s)) return;
  /* Copies into one buffer all go to the stream of its slot: two streams writing the same
   * bytes at once would be the test's own data race. */
  const bool copy = pick(w, 2) == 0;
  const unsigned k = copy ? (unsigned)(s - sh->slots) % STREAMS : pick(w, STREAMS);
  ASSERT_EQ(pthread_rwlock_rdlock(&sh->stream_rw[k]), 0);
  void *d = NULL;
  ASSERT_OK(spw_acquire(sh->rt, s->handle, sh->streams[k], 0, &d));
  ASSERT_TRUE(d != NULL);
  if (copy) ASSERT_OK(spw_memcpy_async(sh->rt, d, copy_source, COPY_BYTES, sh->streams[k]));
  ASSERT_EQ(pthread_rwlock_unlock(&sh->stream_rw[k]), 0);
  slot_unuse(s);
}

static void op_acquire_n(worker_t *w) {
  shared_t *sh = w->sh;
  slot_t *used[MAX_N];
  spw_buf_t list[MAX_N];
  size_t nused = 0, n = 0, want = 1 + pick(w, MAX_N);
  while (n < want) {
    slot_t *s = &sh->slots[pick(w, SLOTS)];
    bool mine = false;
    for (size_t i = 0; i < nused; i++) mine |= used[i] == s;
    if (!mine) {
      if (!slot_use(s)) break;
      used[nused++] = s;
    }
    list[n++] = s->handle; /* a slot picked twice: the handle appears twice */
  }
  if (n > 0) {
    unsigned k = pick(w, STREAMS);
    bool keep = pick(w, 2) == 0;
    void *dptrs[MAX_N] = {NULL};
    ASSERT_EQ(pthread_rwlock_rdlock(&sh->stream_rw[k]), 0);
    ASSERT_OK(spw_acquire_n(sh->rt, list, n, sh->streams[k], 0, dptrs));
    for (size_t i = 0; i < n; i++) {
      ASSERT_TRUE(dptrs[i] != NULL);
      for (size_t j = 0; j < i; j++)
        if (list[j] == list[i]) ASSERT_UEQ((uintptr_t)dptrs[j], (uintptr_t)dptrs[i]);
    }
    if (!keep)
      for (size_t i = 0; i < n; i++) ASSERT_OK(spw_release(sh->rt, list[i], sh->streams[k]));
    ASSERT_EQ(pthread_rwlock_unlock(&sh->stream_rw[k]), 0);
  }
  for (size_t i = 0; i < nused; i++) slot_unuse(used[i]);
}

static void op_synchronize(worker_t *w) {
  shared_t *sh = w->sh;
  unsigned k = pick(w, STREAMS);
  ASSERT_EQ(pthread_rwlock_wrlock(&sh->stream_rw[k]), 0);
  ASSERT_OK(spw_stream_synchronize(sh->rt, sh->streams[k]));
  ASSERT_EQ(pthread_rwlock_unlock(&sh->stream_rw[k]), 0);
}

static void op_release_async(worker_t *w) {
  shared_t *sh = w->sh;
  unsigned k = pick(w, STREAMS);
  ASSERT_EQ(pthread_rwlock_wrlock(&sh->stream_rw[k]), 0);
  ASSERT_OK(spw_stream_release_async(sh->rt, sh->streams[k]));
  ASSERT_EQ(pthread_rwlock_unlock(&sh->stream_rw[k]), 0);
}

/* A handle this thread freed is dead for good, whatever happened to its slot since. */
static void op_use_dead(worker_t *w) {
  shared_t *sh = w->sh;
  if (w->ndead == 0) return;
  size_t have = w->ndead < DEAD_RING ? w->ndead : DEAD_RING;
  spw_buf_t h = w->dead[pick(w, (unsigned)have)];
  unsigned k = pick(w, STREAMS);
  void *d = NULL;
  uint32_t locks;
  size_t size;
  ASSERT_STATUS(spw_acquire(sh->rt, h, sh->streams[k], 0, &d), SPW_ERR_FREED);
  ASSERT_STATUS(spw_buf_lock_count(sh->rt, h, &locks), SPW_ERR_FREED);
  ASSERT_STATUS(spw_buf_size(sh->rt, h, &size), SPW_ERR_FREED);
  ASSERT_STATUS(spw_free(sh->rt, h), SPW_ERR_FREED);
  /* All or nothing next to a live buffer: the live one must not stay locked. */
  slot_t *s = &sh->slots[pick(w, SLOTS)];
  if (!slot_use(s)) return;
  const spw_buf_t list[2] = {s->handle, h};
  void *dptrs[2] = {NULL, NULL};
  ASSERT_EQ(pthread_rwlock_rdlock(&sh->stream_rw[k]), 0);
  ASSERT_STATUS(spw_acquire_n(sh->rt, list, 2, sh->streams[k], 0, dptrs), SPW_ERR_FREED);
  ASSERT_TRUE(dptrs[0] == NULL && dptrs[1] == NULL);
  ASSERT_EQ(pthread_rwlock_unlock(&sh->stream_rw[k]), 0);
  slot_unuse(s);
}

static void op_query(worker_t *w) {
  shared_t *sh = w->sh;
  slot_t *s = &sh->slots[pick(w, SLOTS)];
  if (!slot_use(s)) return;
  size_t size = 0;
  spw_state_t state = (spw_state_t)0;
  ASSERT_OK(spw_buf_size(sh->rt, s->handle, &size));
  ASSERT_EQ(size, s->bytes);
  ASSERT_OK(spw_buf_state(sh->rt, s->handle, &state));
  ASSERT_EQ(state, SPW_STATE_RESIDENT); /* a few MiB in all: nothing is ever spilled */
  slot_unuse(s);
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (int i = 0; i < OPS_PER_THREAD; i++) {
    if ((i & 63) == 0 && elapsed_ms(&w->sh->start) > TIME_LIMIT_MS) break;
    /* Weights: allocation and locking dominate, as in a real program. */
    unsigned r = pick(w, 100), op;
    if (r < 18) op = 0;
    else if (r < 32) op = 1;
    else if (r < 52) op = 2;
    else if (r < 64) op = 3;
    else if (r < 76) op = 4;
    else if (r < 82) op = 5;
    else if (r < 88) op = 6;
    else if (r < 93) op = 7;
    else op = 8;
    switch (op) {
      case 0: op_alloc(w); break;
      case 1: op_free(w); break;
      case 2: op_acquire_release(w); break;
      case 3: op_acquire_persistent(w); break;
      case 4: op_acquire_n(w); break;
      case 5: op_synchronize(w); break;
      case 6: op_release_async(w); break;
      case 7: op_use_dead(w); break;
      default: op_query(w); break;
    }
    w->ops[op]++;
  }
  return NULL;
}

static void mixed_operations_from_many_threads_leave_nothing_behind(void) {
  spw_runtime_t *rt = test_runtime(NULL); /* first: with no device it skips, holding nothing */
  shared_t *sh = calloc(1, sizeof *sh);    /* zeroed: every slot empty */
  worker_t *workers = calloc(THREADS, sizeof *workers);
  ASSERT_TRUE(sh != NULL && workers != NULL);
  sh->rt = rt;
  for (int k = 0; k < STREAMS; k++) {
    ASSERT_OK(spw_stream_create(sh->rt, &sh->streams[k]));
    ASSERT_EQ(pthread_rwlock_init(&sh->stream_rw[k], NULL), 0);
  }
  for (int i = 0; i < SLOTS; i++) atomic_init(&sh->slots[i].state, SLOT_EMPTY);
  clock_gettime(CLOCK_MONOTONIC, &sh->start);
  pthread_t threads[THREADS];
  for (int t = 0; t < THREADS; t++) {
    workers[t].sh = sh;
    workers[t].index = t;
    workers[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
    ASSERT_EQ(pthread_create(&threads[t], NULL, worker_main, &workers[t]), 0);
  }
  uint64_t ops[10] = {0}, freed_locked = 0;
  for (int t = 0; t < THREADS; t++) {
    ASSERT_EQ(pthread_join(threads[t], NULL), 0);
    for (int o = 0; o < 10; o++) ops[o] += workers[t].ops[o];
    freed_locked += workers[t].freed_while_locked;
  }
  printf("  %ld ms; ops: alloc %" PRIu64 ", free %" PRIu64 " (%" PRIu64
         " while locked), acquire+release %" PRIu64 ", acquire kept %" PRIu64
         ", acquire_n %" PRIu64 ", sync %" PRIu64 ", release_async %" PRIu64
         ", dead %" PRIu64 ", query %" PRIu64 "\n",
         elapsed_ms(&sh->start), ops[0], ops[1], freed_locked, ops[2], ops[3], ops[4], ops[5],
         ops[6], ops[7], ops[8]);

  for (int k = 0; k < STREAMS; k++) ASSERT_OK(spw_stream_synchronize(sh->rt, sh->streams[k]));
  uint64_t live = 0, live_bytes = 0;
  for (int i = 0; i < SLOTS; i++) {
    slot_t *s = &sh->slots[i];
    int st = atomic_load(&s->state);
    ASSERT_TRUE(st == SLOT_EMPTY || st == SLOT_LIVE);
    if (st != SLOT_LIVE) continue;
    uint32_t locks = 77;
    size_t size = 0;
    ASSERT_OK(spw_buf_lock_count(sh->rt, s->handle, &locks));
    ASSERT_EQ(locks, 0);
    ASSERT_OK(spw_buf_size(sh->rt, s->handle, &size));
    ASSERT_EQ(size, s->bytes);
    live++;
    live_bytes += s->bytes;
  }
  spw_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  ASSERT_OK(spw_get_stats(sh->rt, &st));
  ASSERT_UEQ(st.locked_bytes, 0);
  ASSERT_UEQ(st.buffers, live);
  /* Buffers freed while locked have given their memory back too. */
  ASSERT_UEQ(st.device_bytes, live_bytes);
  for (int i = 0; i < SLOTS; i++)
    if (atomic_load(&sh->slots[i].state) == SLOT_LIVE)
      ASSERT_OK(spw_free(sh->rt, sh->slots[i].handle));
  ASSERT_OK(spw_get_stats(sh->rt, &st));
  ASSERT_UEQ(st.buffers, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.locked_bytes, 0);
  ASSERT_OK(spw_runtime_destroy(sh->rt));
  for (int k = 0; k < STREAMS; k++) pthread_rwlock_destroy(&sh->stream_rw[k]);
  free(workers);
  free(sh);
}

static const spw_test_t tests[] = {
    TEST(mixed_operations_from_many_threads_leave_nothing_behind),
};
TEST_MAIN(tests)
