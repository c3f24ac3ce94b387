/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of buffer handles (public API only): a handle is never 0, is never handed
 * out twice, dies at spw_free and stays dead when its slot is reused, and anything that is
 * not a live handle of this runtime (forged bits, flipped bits, another runtime's handle) is
 * an error code, never a crash. The bit layout of a handle is private, so forgeries are made
 * by flipping every bit, not by targeting the index field. */
#include <stdbool.h>
#include <stdint.h>

#include "test_main.h"
#include "test_util.h"

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Open-addressing set of handles; 0 marks an empty slot (0 is never a valid handle). */
typedef struct handle_set {
  uint64_t *keys;
  size_t cap; /* power of two */
  size_t count;
} handle_set_t;

static void set_init(handle_set_t *s, size_t cap) {
  s->keys = calloc(cap, sizeof *s->keys);
  ASSERT_TRUE(s->keys != NULL);
  s->cap = cap;
  s->count = 0;
}

static size_t set_probe(const handle_set_t *s, uint64_t key) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  size_t i = (size_t)(h >> 20) & (s->cap - 1);
  while (s->keys[i] != 0 && s->keys[i] != key) i = (i + 1) & (s->cap - 1);
  return i;
}

static bool set_contains(const handle_set_t *s, uint64_t key) {
  return s->keys[set_probe(s, key)] == key;
}

/* Returns false if `key` was already present. */
static bool set_insert(handle_set_t *s, uint64_t key) {
  ASSERT_LT(s->count * 2, s->cap);
  size_t i = set_probe(s, key);
  if (s->keys[i] == key) return false;
  s->keys[i] = key;
  s->count++;
  return true;
}

static uint64_t stats_buffers(spw_runtime_t *rt) {
  spw_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  ASSERT_OK(spw_get_stats(rt, &st));
  return st.buffers;
}

static uint64_t stats_locked_bytes(spw_runtime_t *rt) {
  spw_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  ASSERT_OK(spw_get_stats(rt, &st));
  return st.locked_bytes;
}

static bool status_in(int s, int a, int b) { return s == a || s == b; }

#define ASSERT_STATUS_IN(call, a, b)                                                         \
  do {                                                                                       \
    int r_ = (call);                                                                         \
    if (!status_in(r_, (a), (b))) {                                                          \
      fprintf(stderr, "%s:%d: %s returned %s (%d), expected %s or %s (handle %#" PRIx64     \
              ")\n", __FILE__, __LINE__, #call, spw_err_name(r_), r_, spw_err_name(a),       \
              spw_err_name(b), (uint64_t)h);                                                 \
      abort();                                                                               \
    }                                                                                        \
  } while (0)

/* Every call that takes a handle must reject `h` with `a` or `b` (pass the same code twice
 * to require one) and leave its outputs untouched. */
static void expect_rejected_everywhere(spw_runtime_t *rt, spw_stream_t s, spw_buf_t h, int a,
                                       int b) {
  size_t size = 12345;
  spw_state_t state = (spw_state_t)77;
  spw_tier_t tier = (spw_tier_t)77;
  uint32_t locks = 77;
  void *sentinel = (void *)&size;
  void *dptr = sentinel;
  void *dptrs[1] = {sentinel};
  ASSERT_STATUS_IN(spw_buf_size(rt, h, &size), a, b);
  ASSERT_STATUS_IN(spw_buf_state(rt, h, &state), a, b);
  ASSERT_STATUS_IN(spw_buf_tier(rt, h, &tier), a, b);
  ASSERT_STATUS_IN(spw_buf_lock_count(rt, h, &locks), a, b);
  ASSERT_STATUS_IN(spw_acquire(rt, h, s, 0, &dptr), a, b);
  ASSERT_STATUS_IN(spw_acquire_n(rt, &h, 1, s, 0, dptrs), a, b);
  ASSERT_STATUS_IN(spw_release(rt, h, s), a, b);
  ASSERT_STATUS_IN(spw_spill(rt, h, SPW_TIER_HOST), a, b);
  ASSERT_STATUS_IN(spw_prefetch(rt, h, s), a, b);
  ASSERT_STATUS_IN(spw_spill_n(rt, &h, 1, SPW_TIER_HOST), a, b);
  ASSERT_STATUS_IN(spw_prefetch_n(rt, &h, 1, s), a, b);
  ASSERT_STATUS_IN(spw_free(rt, h), a, b);
  ASSERT_EQ(size, 12345);
  ASSERT_EQ(state, 77);
  ASSERT_EQ(tier, 77);
  ASSERT_EQ(locks, 77);
  ASSERT_UEQ((uintptr_t)dptr, (uintptr_t)sentinel);
  ASSERT_UEQ((uintptr_t)dptrs[0], (uintptr_t)sentinel);
}

/* A live handle answers every query as a fresh, unlocked, resident buffer of `bytes`. */
static void expect_live(spw_runtime_t *rt, spw_buf_t h, size_t bytes) {
  size_t size = 0;
  spw_state_t state = (spw_state_t)0;
  spw_tier_t tier = (spw_tier_t)77;
  uint32_t locks = 77;
  ASSERT_OK(spw_buf_size(rt, h, &size));
  ASSERT_EQ(size, bytes);
  ASSERT_OK(spw_buf_state(rt, h, &state));
  ASSERT_EQ(state, SPW_STATE_RESIDENT);
  ASSERT_OK(spw_buf_tier(rt, h, &tier));
  ASSERT_EQ(tier, SPW_TIER_DEVICE);
  ASSERT_OK(spw_buf_lock_count(rt, h, &locks));
  ASSERT_EQ(locks, 0);
}

static void handle_is_never_zero(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_buf_t bufs[1000];
  for (size_t i = 0; i < 1000; i++) {
    bufs[i] = 0;
    ASSERT_OK(spw_alloc(rt, 64 + i, NULL, &bufs[i]));
    ASSERT_NE(bufs[i], SPW_BUF_NULL);
  }
  for (size_t i = 0; i < 1000; i++) ASSERT_OK(spw_free(rt, bufs[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void freed_slot_is_reused_with_a_new_handle(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t old = 0, fresh = 0;
  ASSERT_OK(spw_alloc(rt, 4096, s, &old));
  ASSERT_OK(spw_free(rt, old));
  ASSERT_OK(spw_alloc(rt, 8192, s, &fresh));
  ASSERT_NE(fresh, old);
  ASSERT_UEQ(stats_buffers(rt), 1);
  /* The slot now belongs to `fresh`; the old handle must still read as freed, not as the
   * new buffer and not as a forgery. */
  expect_rejected_everywhere(rt, s, old, SPW_ERR_FREED, SPW_ERR_FREED);
  expect_live(rt, fresh, 8192);
  ASSERT_UEQ(stats_buffers(rt), 1);
  ASSERT_OK(spw_free(rt, fresh));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void freed_handle_gives_freed_everywhere(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t keep = 0, dead = 0;
  ASSERT_OK(spw_alloc(rt, 1024, s, &keep));
  ASSERT_OK(spw_alloc(rt, 2048, s, &dead));
  ASSERT_OK(spw_free(rt, dead));
  expect_rejected_everywhere(rt, s, dead, SPW_ERR_FREED, SPW_ERR_FREED);
  expect_live(rt, keep, 1024);
  ASSERT_UEQ(stats_buffers(rt), 1);
  ASSERT_OK(spw_free(rt, keep));
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* spw_free of a locked buffer finishes at its last release; meanwhile a batch request that
 * names it is refused as a whole, and the live buffers beside it stay where they are. */
static void a_batch_naming_a_buffer_freed_while_locked_is_refused_whole(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[3];
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_alloc(rt, 4096, s, &b[i]));
  void *d;
  ASSERT_OK(spw_acquire(rt, b[1], s, 0, &d));
  ASSERT_OK(spw_free(rt, b[1]));
  ASSERT_STATUS(spw_spill_n(rt, b, 3, SPW_TIER_HOST), SPW_ERR_FREED);
  ASSERT_STATUS(spw_prefetch_n(rt, b, 3, s), SPW_ERR_FREED);
  ASSERT_OK(spw_wait_idle(rt));
  expect_live(rt, b[0], 4096);
  expect_live(rt, b[2], 4096);
  ASSERT_OK(spw_release(rt, b[1], s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_UEQ(stats_buffers(rt), 2);
  ASSERT_STATUS(spw_spill_n(rt, b, 3, SPW_TIER_HOST), SPW_ERR_FREED);
  for (int i = 0; i < 3; i += 2) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void double_free_gives_freed(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_buf_t b = 0;
  ASSERT_OK(spw_alloc(rt, 256, NULL, &b));
  ASSERT_OK(spw_free(rt, b));
  ASSERT_STATUS(spw_free(rt, b), SPW_ERR_FREED);
  ASSERT_STATUS(spw_free(rt, b), SPW_ERR_FREED);
  ASSERT_UEQ(stats_buffers(rt), 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void random_handles_are_rejected(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  enum { LIVE = 64 };
  spw_buf_t live[LIVE];
  handle_set_t set;
  set_init(&set, 256);
  for (size_t i = 0; i < LIVE; i++) {
    ASSERT_OK(spw_alloc(rt, 512, s, &live[i]));
    ASSERT_TRUE(set_insert(&set, live[i]));
  }
  /* Some freed slots too, so that a forgery may land on a slot with a free-list link. */
  for (size_t i = 0; i < 8; i++) {
    spw_buf_t b;
    ASSERT_OK(spw_alloc(rt, 512, s, &b));
    ASSERT_OK(spw_free(rt, b));
  }
  uint64_t rng = 42;
  for (int i = 0; i < 20000; i++) {
    spw_buf_t h = splitmix64(&rng);
    if (i % 4 == 1) h &= 0xFFFFFFFFull; /* small values: plausible index, generation 0 */
    if (i % 4 == 2) h >>= 24;
    if (h == 0 || set_contains(&set, h)) continue;
    expect_rejected_everywhere(rt, s, h, SPW_ERR_INVALID_HANDLE, SPW_ERR_FREED);
  }
  ASSERT_UEQ(stats_buffers(rt), LIVE);
  ASSERT_UEQ(stats_locked_bytes(rt), 0);
  for (size_t i = 0; i < LIVE; i++) expect_live(rt, live[i], 512);
  for (size_t i = 0; i < LIVE; i++) ASSERT_OK(spw_free(rt, live[i]));
  free(set.keys);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void handle_with_a_flipped_bit_is_rejected(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  /* Many live slots, so that a flipped index bit usually lands on a live slot: only a
   * handle that also checks its generation (and whatever else it encodes) rejects it. */
  enum { LIVE = 100 };
  spw_buf_t live[LIVE];
  handle_set_t set;
  set_init(&set, 512);
  for (size_t i = 0; i < LIVE; i++) {
    ASSERT_OK(spw_alloc(rt, 128 + 8 * i, s, &live[i]));
    ASSERT_TRUE(set_insert(&set, live[i]));
  }
  for (size_t i = 0; i < LIVE; i++) {
    for (int bit = 0; bit < 64; bit++) {
      spw_buf_t h = live[i] ^ ((uint64_t)1 << bit);
      if (h == 0 || set_contains(&set, h)) continue; /* another live handle: legitimately valid */
      expect_rejected_everywhere(rt, s, h, SPW_ERR_INVALID_HANDLE, SPW_ERR_FREED);
    }
  }
  ASSERT_UEQ(stats_buffers(rt), LIVE);
  ASSERT_UEQ(stats_locked_bytes(rt), 0);
  for (size_t i = 0; i < LIVE; i++) expect_live(rt, live[i], 128 + 8 * i);
  for (size_t i = 0; i < LIVE; i++) ASSERT_OK(spw_free(rt, live[i]));
  free(set.keys);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void handle_of_another_runtime_is_invalid(void) {
  spw_runtime_t *rt1 = test_runtime(NULL);
  spw_runtime_t *rt2 = test_runtime(NULL);
  /* The same allocation history in both runtimes, so that a handle made only of slot and
   * generation would be valid in both: the runtime must be told apart. */
  enum { N = 8 };
  spw_buf_t b1[N], b2[N];
  for (size_t i = 0; i < N; i++) {
    ASSERT_OK(spw_alloc(rt1, 1024, NULL, &b1[i]));
    ASSERT_OK(spw_alloc(rt2, 1024, NULL, &b2[i]));
  }
  for (size_t i = 0; i < N; i++) {
    for (size_t j = 0; j < N; j++) {
      if (b1[i] == b2[j]) {
        fprintf(stderr, "handle %#" PRIx64 " is live in two runtimes at once\n", b1[i]);
        abort();
      }
    }
  }
  for (size_t i = 0; i < N; i++) {
    spw_buf_t h = b1[i];
    expect_rejected_everywhere(rt2, NULL, h, SPW_ERR_INVALID_HANDLE, SPW_ERR_INVALID_HANDLE);
    h = b2[i];
    expect_rejected_everywhere(rt1, NULL, h, SPW_ERR_INVALID_HANDLE, SPW_ERR_INVALID_HANDLE);
  }
  ASSERT_UEQ(stats_buffers(rt1), N);
  ASSERT_UEQ(stats_buffers(rt2), N);
  for (size_t i = 0; i < N; i++) {
    expect_live(rt1, b1[i], 1024);
    expect_live(rt2, b2[i], 1024);
    ASSERT_OK(spw_free(rt1, b1[i]));
    ASSERT_OK(spw_free(rt2, b2[i]));
  }
  ASSERT_OK(spw_runtime_destroy(rt2));
  ASSERT_OK(spw_runtime_destroy(rt1));
}

static void alloc_free_cycles_never_repeat_a_handle(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  enum { SINGLE = 70000, MIXED = 30000, LIVE = 16 };
  handle_set_t seen;
  set_init(&seen, (size_t)1 << 18);
  /* One buffer at a time reuses the same slot over and over: more than 2^16 times, so a
   * 16-bit generation would wrap and repeat a handle. */
  for (int i = 0; i < SINGLE; i++) {
    spw_buf_t b = 0;
    ASSERT_OK(spw_alloc(rt, 64, s, &b));
    ASSERT_NE(b, SPW_BUF_NULL);
    if (!set_insert(&seen, b)) {
      fprintf(stderr, "cycle %d: handle %#" PRIx64 " handed out twice\n", i, b);
      abort();
    }
    ASSERT_OK(spw_free(rt, b));
  }
  /* Then several live buffers freed in random order, so slots are reused out of order. */
  spw_buf_t live[LIVE] = {0};
  uint64_t rng = 7;
  for (int i = 0; i < MIXED; i++) {
    size_t k = (size_t)(splitmix64(&rng) % LIVE);
    if (live[k] != 0) ASSERT_OK(spw_free(rt, live[k]));
    live[k] = 0;
    ASSERT_OK(spw_alloc(rt, 64 + (size_t)(i % 7) * 64, s, &live[k]));
    if (!set_insert(&seen, live[k])) {
      fprintf(stderr, "mixed cycle %d: handle %#" PRIx64 " handed out twice\n", i, live[k]);
      abort();
    }
  }
  for (size_t k = 0; k < LIVE; k++)
    if (live[k] != 0) ASSERT_OK(spw_free(rt, live[k]));
  ASSERT_UEQ(seen.count, SINGLE + MIXED);
  ASSERT_UEQ(stats_buffers(rt), 0);
  free(seen.keys);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void table_grows_and_every_handle_stays_valid(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  enum { N = 10000, WITH_DATA = 16, BYTES = 4096 };
  spw_buf_t *bufs = calloc(N, sizeof *bufs);
  ASSERT_TRUE(bufs != NULL);
  uint8_t *host = malloc(BYTES);
  ASSERT_TRUE(host != NULL);
  /* The first buffers get contents before the table grows: growth must move neither their
   * handles nor their data. */
  for (size_t i = 0; i < WITH_DATA; i++) {
    void *d = NULL;
    ASSERT_OK(spw_alloc(rt, BYTES, s, &bufs[i]));
    ASSERT_OK(spw_acquire(rt, bufs[i], s, 0, &d));
    test_fill(host, BYTES, i);
    ASSERT_OK(spw_memcpy_async(rt, d, host, BYTES, s));
    ASSERT_OK(spw_stream_synchronize(rt, s));
  }
  for (size_t i = WITH_DATA; i < N; i++) ASSERT_OK(spw_alloc(rt, 64 + (i % 97), s, &bufs[i]));
  ASSERT_UEQ(stats_buffers(rt), N);
  handle_set_t set;
  set_init(&set, (size_t)1 << 15);
  for (size_t i = 0; i < N; i++) {
    ASSERT_TRUE(set_insert(&set, bufs[i]));
    expect_live(rt, bufs[i], i < WITH_DATA ? BYTES : 64 + (i % 97));
  }
  for (size_t i = 0; i < WITH_DATA; i++) {
    void *d = NULL;
    memset(host, 0, BYTES);
    ASSERT_OK(spw_acquire(rt, bufs[i], s, 0, &d));
    ASSERT_OK(spw_memcpy_async(rt, host, d, BYTES, s));
    ASSERT_OK(spw_stream_synchronize(rt, s));
    ASSERT_EQ(test_first_mismatch(host, BYTES, i), (size_t)-1);
  }
  /* Every live handle still locks and unlocks. */
  for (size_t i = 0; i < N; i += 37) {
    void *d = NULL;
    uint32_t locks = 0;
    ASSERT_OK(spw_acquire(rt, bufs[i], s, 0, &d));
    ASSERT_TRUE(d != NULL);
    ASSERT_OK(spw_buf_lock_count(rt, bufs[i], &locks));
    ASSERT_EQ(locks, 1);
    ASSERT_OK(spw_release(rt, bufs[i], s));
  }
  for (size_t i = 0; i < N; i++) ASSERT_OK(spw_free(rt, bufs[i]));
  ASSERT_UEQ(stats_buffers(rt), 0);
  free(set.keys);
  free(host);
  free(bufs);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(handle_is_never_zero),
    TEST(freed_slot_is_reused_with_a_new_handle),
    TEST(freed_handle_gives_freed_everywhere),
    TEST(a_batch_naming_a_buffer_freed_while_locked_is_refused_whole),
    TEST(double_free_gives_freed),
    TEST(random_handles_are_rejected),
    TEST(handle_with_a_flipped_bit_is_rejected),
    TEST(handle_of_another_runtime_is_invalid),
    TEST(alloc_free_cycles_never_repeat_a_handle),
    TEST(table_grows_and_every_handle_stays_valid),
};
TEST_MAIN(tests)
