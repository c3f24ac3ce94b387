/* SPDX-License-Identifier: Apache-2.0 */
/* Test support, shared by every test: assertion macros that print the expression and both
 * values, runtime creation on the backend CTest chose
 * (SPILLWAY_BACKEND=host|cuda; a cuda test without a GPU skips), content patterns, random
 * numbers and time. Only spillway.h: API tests include nothing else of the library. */
#ifndef SPILLWAY_TESTS_TEST_UTIL_H
#define SPILLWAY_TESTS_TEST_UTIL_H

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spillway/spillway.h"
#include "test_main.h" /* TEST_SKIP_IF */

#define ASSERT_TRUE(expr)                                                                    \
  do {                                                                                       \
    if (!(expr)) {                                                                           \
      fprintf(stderr, "%s:%d: ASSERT_TRUE(%s) failed\n", __FILE__, __LINE__, #expr);        \
      abort();                                                                               \
    }                                                                                        \
  } while (0)

#define ASSERT_CMP_(a, b, op, fmt, type)                                                     \
  do {                                                                                       \
    type a_ = (type)(a);                                                                     \
    type b_ = (type)(b);                                                                     \
    if (!(a_ op b_)) {                                                                       \
      fprintf(stderr, "%s:%d: ASSERT(%s %s %s) failed: " fmt " vs " fmt "\n", __FILE__,     \
              __LINE__, #a, #op, #b, a_, b_);                                                \
      abort();                                                                               \
    }                                                                                        \
  } while (0)

#define ASSERT_EQ(a, b) ASSERT_CMP_(a, b, ==, "%" PRId64, int64_t)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, b, !=, "%" PRId64, int64_t)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, b, <, "%" PRId64, int64_t)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, b, <=, "%" PRId64, int64_t)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, b, >, "%" PRId64, int64_t)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, b, >=, "%" PRId64, int64_t)
#define ASSERT_UEQ(a, b) ASSERT_CMP_(a, b, ==, "%" PRIu64, uint64_t)
#define ASSERT_PTR_EQ(a, b) ASSERT_CMP_(a, b, ==, "%p", const void *)
#define ASSERT_PTR_NE(a, b) ASSERT_CMP_(a, b, !=, "%p", const void *)

/* ASSERT_OK(call): the call returned SPW_OK; prints the status name otherwise. */
#define ASSERT_STATUS(call, expected)                                                        \
  do {                                                                                       \
    int s_ = (call), e_ = (expected);                                                        \
    if (s_ != e_) {                                                                          \
      fprintf(stderr, "%s:%d: %s returned %s (%d), expected %s\n", __FILE__, __LINE__,      \
              #call, spw_err_name(s_), s_, spw_err_name(e_));                                \
      abort();                                                                               \
    }                                                                                        \
  } while (0)
#define ASSERT_OK(call) ASSERT_STATUS(call, SPW_OK)

/* Sleeps `ms` milliseconds; the monotonic clock in milliseconds. */
static inline void test_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
static inline uint64_t test_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The runtime's statistics, a buffer's lock count and its state; the call must succeed. */
static inline spw_stats_t stats_of(spw_runtime_t *rt) {
  spw_stats_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  ASSERT_OK(spw_get_stats(rt, &st));
  return st;
}
static inline uint32_t test_locks_of(spw_runtime_t *rt, spw_buf_t b) {
  uint32_t n = 0xFFFFFFFFu;
  ASSERT_OK(spw_buf_lock_count(rt, b, &n));
  return n;
}
static inline spw_state_t state_of(spw_runtime_t *rt, spw_buf_t b) {
  spw_state_t s = (spw_state_t)0;
  ASSERT_OK(spw_buf_state(rt, b, &s));
  return s;
}
/* How many of b[0..n) are in state `st`. */
static inline size_t test_count_in(spw_runtime_t *rt, const spw_buf_t *b, size_t n,
                                   spw_state_t st) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += state_of(rt, b[i]) == st;
  return k;
}

/* What a spill moved: spw_spill_n of bufs[0..n) to `tier`, waited for, counted. */
typedef struct test_spilled {
  uint64_t spills, spill_bytes, clean_respills;
} test_spilled_t;
static inline test_spilled_t test_spill_counted(spw_runtime_t *rt, const spw_buf_t *bufs,
                                                size_t n, spw_tier_t tier) {
  spw_stats_t a = stats_of(rt);
  ASSERT_OK(spw_spill_n(rt, bufs, n, tier));
  ASSERT_OK(spw_wait_idle(rt));
  spw_stats_t z = stats_of(rt);
  test_spilled_t d = {z.spills - a.spills, z.spill_bytes - a.spill_bytes,
                      z.clean_respills - a.clean_respills};
  return d;
}

/* Writes n bytes of src into b through stream s: acquire, copy, synchronize (which
 * releases the lock). Valid on both backends. */
static inline void test_write(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, const void *src,
                              size_t n) {
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_memcpy_async(rt, d, src, n, s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
}
/* Reads n bytes of b into dst the same way, with a read-only acquire. */
static inline void test_read(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, void *dst,
                             size_t n) {
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b, s, SPW_ACQUIRE_READ, &d));
  ASSERT_OK(spw_memcpy_async(rt, dst, d, n, s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
}

/* The backend the test runs on, from SPILLWAY_BACKEND (default host). */
static inline spw_backend_kind_t test_backend(void) {
  const char *b = getenv("SPILLWAY_BACKEND");
  return (b && strcmp(b, "cuda") == 0) ? SPW_BACKEND_CUDA : SPW_BACKEND_HOST;
}

/* Creates a runtime on the test's backend with `cfg` (NULL: defaults); skips the test when
 * the CUDA backend was asked for and there is no GPU. */
static inline spw_runtime_t *test_runtime(spw_config_t *cfg) {
  spw_config_t def = SPW_CONFIG_INIT;
  if (!cfg) cfg = &def;
  cfg->backend = test_backend();
  spw_runtime_t *rt = NULL;
  int s = spw_runtime_create(cfg, &rt);
  TEST_SKIP_IF(s == SPW_ERR_NO_DEVICE, "no CUDA device on this machine");
  if (s != SPW_OK) {
    char msg[512];
    spw_config_validate(cfg, msg, sizeof msg);
    fprintf(stderr, "spw_runtime_create: %s: %s\n", spw_err_name(s), msg);
    abort();
  }
  return rt;
}

/* A deterministic byte pattern: fill and verify host memory. */
static inline uint8_t test_pattern_byte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return (uint8_t)(x ^ (x >> 17));
}
static inline void test_fill(void *p, size_t n, uint64_t seed) {
  uint8_t *b = (uint8_t *)p;
  for (size_t i = 0; i < n; i++) b[i] = test_pattern_byte(seed, i);
}
/* A new buffer of n bytes holding test_fill(seed), written through stream s. */
static inline spw_buf_t test_filled(spw_runtime_t *rt, spw_stream_t s, size_t n, uint64_t seed) {
  uint8_t *src = (uint8_t *)malloc(n);
  ASSERT_TRUE(src != NULL);
  test_fill(src, n, seed);
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, n, s, &b));
  test_write(rt, b, s, src, n);
  free(src);
  return b;
}

static inline size_t test_first_mismatch(const void *p, size_t n, uint64_t seed) {
  const uint8_t *b = (const uint8_t *)p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != test_pattern_byte(seed, i)) return i;
  return (size_t)-1;
}

/* Checks that b holds test_fill(seed) over its n bytes (read-only acquire on s). */
static inline void test_expect_fill(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, size_t n,
                                    uint64_t seed) {
  uint8_t *got = (uint8_t *)malloc(n);
  ASSERT_TRUE(got != NULL);
  memset(got, 0, n);
  test_read(rt, b, s, got, n);
  ASSERT_UEQ(test_first_mismatch(got, n, seed), (size_t)-1);
  free(got);
}

/* SplitMix64: a reproducible random stream from a seed (tests print their seed). */
static inline uint64_t test_splitmix(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Page-stamped contents, for tests that move many large buffers: a test_fill template (the
 * caller's, at least n bytes) with the first 8 bytes of every 4 KiB page replaced by a stamp
 * of (version, page). A stale, misplaced or foreign page shows, while filling and checking
 * cost memcpy / memcmp rather than a byte loop. `version` must differ for every write. */
#define TEST_PAGE 4096u

static inline void test_page_stamp(uint8_t out[8], uint64_t version, size_t page) {
  uint64_t v = version * 0x100000ull + page;
  memcpy(out, &v, 8);
}

static inline void test_page_fill(uint8_t *dst, size_t n, const uint8_t *tmpl, uint64_t version) {
  memcpy(dst, tmpl, n);
  for (size_t off = 0; off + 8 <= n; off += TEST_PAGE)
    test_page_stamp(dst + off, version, off / TEST_PAGE);
}

/* Offset of the first wrong byte, or (size_t)-1. */
static inline size_t test_page_mismatch(const uint8_t *got, size_t n, const uint8_t *tmpl,
                                        uint64_t version) {
  for (size_t off = 0; off < n; off += TEST_PAGE) {
    size_t len = n - off < TEST_PAGE ? n - off : TEST_PAGE;
    uint8_t page[TEST_PAGE];
    memcpy(page, tmpl + off, len);
    if (len >= 8) test_page_stamp(page, version, off / TEST_PAGE);
    if (memcmp(got + off, page, len) != 0)
      for (size_t k = 0; k < len; k++)
        if (got[off + k] != page[k]) return off + k;
  }
  return (size_t)-1;
}

#endif /* SPILLWAY_TESTS_TEST_UTIL_H */
