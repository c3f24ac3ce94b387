/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of bad input (public API only): NULL runtimes and output pointers, zero
 * and absurd sizes, unknown, foreign and destroyed streams, unknown flag bits and bad
 * configuration each give the documented error code, write no output and change nothing
 * (the statistics and lock counts are compared before and after). Environment variables
 * set here are restored before each test returns, since the test's own backend comes from
 * SPILLWAY_BACKEND. */
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "test_main.h"
#include "test_util.h"

/* An address no runtime ever handed out as a stream. */
static char never_a_stream[64];
#define UNKNOWN_STREAM ((spw_stream_t)(void *)never_a_stream)

static void expect_stats_unchanged(spw_runtime_t *rt, const spw_stats_t *before) {
  const spw_stats_t now = stats_of(rt);
  ASSERT_UEQ(now.buffers, before->buffers);
  ASSERT_UEQ(now.device_bytes, before->device_bytes);
  ASSERT_UEQ(now.host_bytes, before->host_bytes);
  ASSERT_UEQ(now.disk_bytes, before->disk_bytes);
  ASSERT_UEQ(now.locked_bytes, before->locked_bytes);
  ASSERT_UEQ(now.spills, before->spills);
  ASSERT_UEQ(now.unspills, before->unspills);
  ASSERT_UEQ(now.failures, before->failures);
}

static uint32_t locks_of(spw_runtime_t *rt, spw_buf_t b) {
  uint32_t n = 0xFFFFFFFFu;
  ASSERT_OK(spw_buf_lock_count(rt, b, &n));
  return n;
}

static void count_call(void *arg) { atomic_fetch_add((atomic_int *)arg, 1); }

/* Saves an environment variable, sets it, and puts it back. The one set last is also kept
 * here, so that the driver's after hook (restore_env) puts it back when the test skipped
 * (no GPU) before it could. */
typedef struct env_save {
  const char *name;
  char *old; /* NULL if it was unset */
} env_save_t;

static env_save_t env_pending;
static int env_is_pending;

static env_save_t env_set(const char *name, const char *value) {
  env_save_t e = {name, NULL};
  const char *old = getenv(name);
  if (old) {
    e.old = strdup(old);
    ASSERT_TRUE(e.old != NULL);
  }
  ASSERT_EQ(setenv(name, value, 1), 0);
  env_pending = e;
  env_is_pending = 1;
  return e;
}

static void env_restore(env_save_t *e) {
  env_is_pending = 0;
  if (e->old) {
    ASSERT_EQ(setenv(e->name, e->old, 1), 0);
    free(e->old);
  } else {
    ASSERT_EQ(unsetenv(e->name), 0);
  }
}

static void restore_env(void) {
  if (env_is_pending) env_restore(&env_pending);
}

static void every_status_has_its_name_and_text(void) {
#define CHECK_STATUS(name, value, text)                                                      \
  ASSERT_EQ(strcmp(spw_err_name(SPW_##name), "SPW_" #name), 0);                              \
  ASSERT_EQ(strcmp(spw_strerror(SPW_##name), text), 0);                                      \
  ASSERT_EQ(SPW_##name, value);
  SPW_STATUS_MAP(CHECK_STATUS)
#undef CHECK_STATUS
}

static void unknown_status_gives_unknown_status(void) {
  const int codes[] = {1, 2, -21, -1000, 12345, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    ASSERT_TRUE(spw_strerror(codes[i]) != NULL);
    ASSERT_TRUE(spw_err_name(codes[i]) != NULL);
    ASSERT_EQ(strcmp(spw_strerror(codes[i]), "unknown status"), 0);
    ASSERT_EQ(strcmp(spw_err_name(codes[i]), "unknown status"), 0);
  }
}

/* The statuses whose "see spw_last_error" text promises a detail are exactly those that
 * spw_status_has_detail names, plus the two budget errors whose detail gives the numbers;
 * success and unknown codes have none. */
static void has_detail_names_the_statuses_that_record_one(void) {
  const int with[] = {SPW_ERR_CUDA, SPW_ERR_IO, SPW_ERR_SYSTEM, SPW_ERR_OUT_OF_MEMORY,
                      SPW_ERR_HOST_OUT_OF_MEMORY, SPW_ERR_DISK_FULL, SPW_ERR_WRONG_DEVICE};
  for (size_t i = 0; i < sizeof with / sizeof with[0]; i++)
    ASSERT_EQ(spw_status_has_detail(with[i]), 1);
  int counted = 0;
#define COUNT_DETAIL(name, value, text)                                                      \
  counted += spw_status_has_detail(SPW_##name);                                              \
  if (strstr(text, "spw_last_error")) ASSERT_EQ(spw_status_has_detail(SPW_##name), 1);
  SPW_STATUS_MAP(COUNT_DETAIL)
#undef COUNT_DETAIL
  ASSERT_EQ(counted, (int)(sizeof with / sizeof with[0]));
  const int none[] = {SPW_OK, 1, -21, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
    ASSERT_EQ(spw_status_has_detail(none[i]), 0);
}

static void null_runtime_is_invalid_arg(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  spw_buf_t b;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_alloc(rt, 256, s, &b));
  const spw_stats_t before = stats_of(rt);
  atomic_int calls = 0;
  char host[16] = {0};
  spw_backend_kind_t kind = (spw_backend_kind_t)77;
  uint64_t lim = 77;
  spw_stream_t out_s = UNKNOWN_STREAM;
  spw_buf_t out_b = 77;
  size_t size = 77;
  spw_state_t state = (spw_state_t)77;
  spw_tier_t tier = (spw_tier_t)77;
  uint32_t locks = 77;
  void *dptr = host;
  spw_stats_t st;
  memset(&st, 0xAB, sizeof st);
  st.struct_size = sizeof st;
  char summary[8];
  memset(summary, 'X', sizeof summary);
  spw_controller_t ctl;
  memset(&ctl, 0, sizeof ctl);
  ctl.struct_size = sizeof ctl;

  ASSERT_STATUS(spw_runtime_backend(NULL, &kind), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_runtime_limits(NULL, &lim, &lim, &lim), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_async_error(NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_host_reserve(NULL, 1 << 20), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stream_create(NULL, &out_s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stream_destroy(NULL, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stream_register(NULL, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stream_unregister(NULL, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stream_synchronize(NULL, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stream_release_async(NULL, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_launch_host_func(NULL, s, count_call, &calls), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_memcpy_async(NULL, host, host + 8, 8, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc(NULL, 256, s, &out_b), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_free(NULL, b), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_size(NULL, b, &size), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_state(NULL, b, &state), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_tier(NULL, b, &tier), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_lock_count(NULL, b, &locks), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire(NULL, b, s, 0, &dptr), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire_n(NULL, &b, 1, s, 0, &dptr), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_release(NULL, b, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_spill(NULL, b, SPW_TIER_HOST), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_prefetch(NULL, b, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_wait_idle(NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_get_stats(NULL, &st), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stats_summary(NULL, summary, sizeof summary), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_set_controller(NULL, &ctl, NULL), SPW_ERR_INVALID_ARG);

  ASSERT_EQ(kind, 77);
  ASSERT_UEQ(lim, 77);
  ASSERT_UEQ((uintptr_t)out_s, (uintptr_t)UNKNOWN_STREAM);
  ASSERT_UEQ(out_b, 77);
  ASSERT_EQ(size, 77);
  ASSERT_EQ(state, 77);
  ASSERT_EQ(tier, 77);
  ASSERT_EQ(locks, 77);
  ASSERT_UEQ((uintptr_t)dptr, (uintptr_t)host);
  ASSERT_UEQ(st.buffers, 0xABABABABABABABABull);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(atomic_load(&calls), 0);
  ASSERT_EQ(locks_of(rt, b), 0);
  expect_stats_unchanged(rt, &before);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void destroy_of_null_runtime_does_nothing(void) {
  ASSERT_OK(spw_runtime_destroy(NULL));
}

static void last_error_is_never_null(void) {
  ASSERT_TRUE(spw_last_error(NULL) != NULL);
  ASSERT_EQ(strcmp(spw_last_error(NULL), ""), 0);
  spw_runtime_t *rt = test_runtime(NULL);
  ASSERT_TRUE(spw_last_error(rt) != NULL);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void null_output_pointer_is_invalid_arg(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  spw_buf_t b;
  char host[16] = {0};
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_alloc(rt, 256, s, &b));
  const spw_stats_t before = stats_of(rt);
  void *dptrs[2] = {host, host};
  atomic_int calls = 0;
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = test_backend();

  ASSERT_STATUS(spw_runtime_create(&cfg, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_runtime_backend(rt, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stream_create(rt, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc(rt, 256, s, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_size(rt, b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_state(rt, b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_tier(rt, b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_lock_count(rt, b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire(rt, b, s, 0, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire_n(rt, &b, 1, s, 0, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_acquire_n(rt, NULL, 1, s, 0, dptrs), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_get_stats(rt, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_stats_summary(rt, NULL, 16), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_launch_host_func(rt, s, NULL, &calls), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_memcpy_async(rt, NULL, host, 8, s), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_memcpy_async(rt, host, NULL, 8, s), SPW_ERR_INVALID_ARG);

  ASSERT_UEQ((uintptr_t)dptrs[0], (uintptr_t)host);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(rt, b), 0);
  expect_stats_unchanged(rt, &before);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void limits_accept_null_outputs(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  uint64_t dev = 0;
  ASSERT_OK(spw_runtime_limits(rt, NULL, NULL, NULL));
  ASSERT_OK(spw_runtime_limits(rt, &dev, NULL, NULL));
  ASSERT_GT(dev, 0);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void zero_or_absurd_alloc_size_is_invalid_arg(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  const spw_stats_t before = stats_of(rt);
  const size_t sizes[] = {0, (size_t)SPW_MAX_BUFFER_BYTES + 1, (size_t)SPW_MAX_BUFFER_BYTES * 2,
                          SIZE_MAX};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    spw_buf_t b = 77;
    ASSERT_STATUS(spw_alloc(rt, sizes[i], s, &b), SPW_ERR_INVALID_ARG);
    ASSERT_STATUS(spw_alloc(rt, sizes[i], NULL, &b), SPW_ERR_INVALID_ARG);
    ASSERT_UEQ(b, 77);
  }
  expect_stats_unchanged(rt, &before);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void memcpy_of_zero_bytes_is_invalid_arg(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  char a[8] = {1}, c[8] = {2};
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_STATUS(spw_memcpy_async(rt, a, c, 0, s), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(a[0], 1);
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* Every stream-taking call must refuse `bad` with SPW_ERR_INVALID_STREAM and change nothing;
 * `b` is a live buffer with one lock on the valid stream `s`. */
/* Every call that takes a stream refuses `bad` (unknown, destroyed or another runtime's,
 * as `make_bad` makes it on rt or `other`) with SPW_ERR_INVALID_STREAM, writes no output
 * and changes nothing; the lock a buffer holds on a good stream stays intact. */
typedef enum { BAD_UNKNOWN, BAD_DESTROYED, BAD_FOREIGN } bad_stream_t;

static void expect_stream_refused(bad_stream_t kind) {
  spw_runtime_t *rt = test_runtime(NULL), *other = NULL;
  spw_stream_t s, bad = UNKNOWN_STREAM;
  spw_buf_t b;
  void *dptr;
  ASSERT_OK(spw_stream_create(rt, &s));
  if (kind == BAD_DESTROYED) {
    ASSERT_OK(spw_stream_create(rt, &bad));
    ASSERT_OK(spw_stream_destroy(rt, bad));
  } else if (kind == BAD_FOREIGN) {
    other = test_runtime(NULL);
    ASSERT_OK(spw_stream_create(other, &bad));
  }
  ASSERT_OK(spw_alloc(rt, 256, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &dptr));
  const spw_stats_t before = stats_of(rt);
  char host[16] = {0};
  spw_buf_t out_b = 77;
  dptr = host;
  atomic_int calls = 0;
  ASSERT_STATUS(spw_alloc(rt, 256, bad, &out_b), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_launch_host_func(rt, bad, count_call, &calls), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_acquire(rt, b, bad, 0, &dptr), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_stream_synchronize(rt, bad), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_acquire_n(rt, &b, 1, bad, 0, &dptr), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_stream_release_async(rt, bad), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_release(rt, b, bad), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_stream_destroy(rt, bad), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_prefetch(rt, b, bad), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_stream_unregister(rt, bad), SPW_ERR_INVALID_STREAM);
  ASSERT_STATUS(spw_memcpy_async(rt, host, host + 8, 8, bad), SPW_ERR_INVALID_STREAM);
  ASSERT_UEQ(out_b, 77);
  ASSERT_UEQ((uintptr_t)dptr, (uintptr_t)host);
  ASSERT_EQ(locks_of(rt, b), 1);
  expect_stats_unchanged(rt, &before);
  /* The lock on the good stream is intact and a refused host func never runs. */
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(locks_of(rt, b), 0);
  ASSERT_EQ(atomic_load(&calls), 0);
  ASSERT_OK(spw_runtime_destroy(other));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void unknown_stream_is_invalid_stream(void) { expect_stream_refused(BAD_UNKNOWN); }

static void destroyed_stream_is_invalid_stream(void) { expect_stream_refused(BAD_DESTROYED); }

static void stream_of_another_runtime_is_invalid_stream(void) {
  expect_stream_refused(BAD_FOREIGN);
}

static void unknown_acquire_flags_are_invalid_arg(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  spw_buf_t b;
  char host[8];
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_alloc(rt, 256, s, &b));
  const spw_stats_t before = stats_of(rt);
  const unsigned flags[] = {0x4u, 0x80u, 0x80000000u, ~0u, SPW_ACQUIRE_READ | SPW_ACQUIRE_TRY | 0x4u};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
    void *dptr = host;
    ASSERT_STATUS(spw_acquire(rt, b, s, flags[i], &dptr), SPW_ERR_INVALID_ARG);
    ASSERT_STATUS(spw_acquire_n(rt, &b, 1, s, flags[i], &dptr), SPW_ERR_INVALID_ARG);
    ASSERT_UEQ((uintptr_t)dptr, (uintptr_t)host);
    ASSERT_EQ(locks_of(rt, b), 0);
  }
  expect_stats_unchanged(rt, &before);
  ASSERT_STATUS(spw_release(rt, b, s), SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void unknown_config_flags_are_refused(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = test_backend();
  cfg.flags = 0x100u;
  spw_runtime_t *rt = (spw_runtime_t *)(void *)never_a_stream;
  const int st = spw_runtime_create(&cfg, &rt);
  /* The header names no code for this case: either one that means "bad input" will do. */
  ASSERT_TRUE(st == SPW_ERR_INVALID_ARG || st == SPW_ERR_CONFIG);
  ASSERT_UEQ((uintptr_t)rt, (uintptr_t)never_a_stream);
}

static void spill_to_device_or_unknown_tier_is_invalid_arg(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_buf_t b;
  spw_state_t state = (spw_state_t)0;
  ASSERT_OK(spw_alloc(rt, 4096, NULL, &b));
  const spw_stats_t before = stats_of(rt);
  ASSERT_STATUS(spw_spill(rt, b, SPW_TIER_DEVICE), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_spill(rt, b, (spw_tier_t)3), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_spill(rt, b, (spw_tier_t)-1), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_buf_state(rt, b, &state));
  ASSERT_EQ(state, SPW_STATE_RESIDENT);
  expect_stats_unchanged(rt, &before);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void spill_of_a_locked_buffer_is_locked(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_stream_t s;
  spw_buf_t b;
  void *d;
  spw_state_t state = (spw_state_t)0;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  const spw_stats_t before = stats_of(rt);
  ASSERT_STATUS(spw_spill(rt, b, SPW_TIER_HOST), SPW_ERR_LOCKED);
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_buf_state(rt, b, &state));
  ASSERT_EQ(state, SPW_STATE_RESIDENT);
  ASSERT_EQ(locks_of(rt, b), 1);
  expect_stats_unchanged(rt, &before);
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void runtime_create_refuses_a_short_config_struct(void) {
  const size_t sizes[] = {0, 4}; /* smaller than the struct_size field itself */
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    spw_config_t cfg = SPW_CONFIG_INIT;
    cfg.backend = test_backend();
    cfg.struct_size = sizes[i];
    spw_runtime_t *rt = (spw_runtime_t *)(void *)never_a_stream;
    ASSERT_STATUS(spw_runtime_create(&cfg, &rt), SPW_ERR_INVALID_ARG);
    ASSERT_UEQ((uintptr_t)rt, (uintptr_t)never_a_stream);
    /* Validation resolves exactly as creation would. */
    char msg[128];
    ASSERT_STATUS(spw_config_validate(&cfg, msg, sizeof msg), SPW_ERR_INVALID_ARG);
  }
}

/* With `var`=`value` in the environment, validation and creation both fail with
 * SPW_ERR_CONFIG and the message names the variable. `backend_from_env`: leave the backend
 * field at AUTO so that the variable is read at all. */
static void expect_env_refused(const char *var, const char *value, int backend_from_env) {
  env_save_t e = env_set(var, value);
  spw_config_t cfg = SPW_CONFIG_INIT;
  if (!backend_from_env) cfg.backend = test_backend();
  char msg[256];
  memset(msg, 'X', sizeof msg);
  ASSERT_STATUS(spw_config_validate(&cfg, msg, sizeof msg), SPW_ERR_CONFIG);
  ASSERT_TRUE(memchr(msg, '\0', sizeof msg) != NULL);
  if (strstr(msg, var) == NULL) {
    fprintf(stderr, "message for %s='%s' does not name it: \"%s\"\n", var, value, msg);
    abort();
  }
  if (backend_from_env) {
    memset(msg, 'X', sizeof msg);
    ASSERT_STATUS(spw_config_validate(NULL, msg, sizeof msg), SPW_ERR_CONFIG);
    ASSERT_TRUE(strstr(msg, var) != NULL);
  }
  spw_runtime_t *rt = (spw_runtime_t *)(void *)never_a_stream;
  ASSERT_STATUS(spw_runtime_create(&cfg, &rt), SPW_ERR_CONFIG);
  ASSERT_UEQ((uintptr_t)rt, (uintptr_t)never_a_stream);
  env_restore(&e);
}

static void config_validate_names_the_bad_variable(void) {
  expect_env_refused("SPILLWAY_BACKEND", "bogus", 1);
  expect_env_refused("SPILLWAY_DEVICE_LIMIT", "abc", 0);
  expect_env_refused("SPILLWAY_HIGH_WATERMARK", "2", 0);
}

static void config_validate_of_good_config_gives_empty_message(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = test_backend();
  char msg[64];
  memset(msg, 'X', sizeof msg);
  ASSERT_OK(spw_config_validate(&cfg, msg, sizeof msg));
  ASSERT_EQ(msg[0], '\0');
}

static void config_validate_truncates_message_to_len(void) {
  env_save_t e = env_set("SPILLWAY_DEVICE_LIMIT", "abc");
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = test_backend();
  char msg[64];
  memset(msg, 'X', sizeof msg);
  ASSERT_STATUS(spw_config_validate(&cfg, msg, 8), SPW_ERR_CONFIG);
  ASSERT_TRUE(memchr(msg, '\0', 8) != NULL);
  for (size_t i = 8; i < sizeof msg; i++) ASSERT_EQ(msg[i], 'X');
  env_restore(&e);
}

static void ignore_env_flag_skips_a_bad_environment(void) {
  env_save_t e = env_set("SPILLWAY_DEVICE_LIMIT", "abc");
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.flags = SPW_CONFIG_IGNORE_ENV;
  cfg.backend = test_backend();
  char msg[128];
  ASSERT_OK(spw_config_validate(&cfg, msg, sizeof msg));
  spw_runtime_t *rt = test_runtime(&cfg);
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 256, NULL, &b));
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
  env_restore(&e);
}

static void config_field_out_of_range_is_config_error(void) {
  spw_config_t cfgs[2] = {SPW_CONFIG_INIT, SPW_CONFIG_INIT};
  cfgs[0].high_watermark = 2.0;
  cfgs[1].high_watermark = 0.5; /* low above high makes no sense */
  cfgs[1].low_watermark = 0.9;
  for (int i = 0; i < 2; i++) {
    cfgs[i].backend = test_backend();
    cfgs[i].flags = SPW_CONFIG_IGNORE_ENV;
    char msg[256];
    memset(msg, 'X', sizeof msg);
    ASSERT_STATUS(spw_config_validate(&cfgs[i], msg, sizeof msg), SPW_ERR_CONFIG);
    ASSERT_TRUE(memchr(msg, '\0', sizeof msg) != NULL);
    ASSERT_GT(strlen(msg), 0);
    spw_runtime_t *rt = (spw_runtime_t *)(void *)never_a_stream;
    ASSERT_STATUS(spw_runtime_create(&cfgs[i], &rt), SPW_ERR_CONFIG);
    ASSERT_UEQ((uintptr_t)rt, (uintptr_t)never_a_stream);
  }
}

static void stream_register_on_host_backend_is_unsupported(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_backend_kind_t kind;
  ASSERT_OK(spw_runtime_backend(rt, &kind));
  ASSERT_EQ(kind, test_backend());
  if (kind != SPW_BACKEND_HOST) ASSERT_OK(spw_runtime_destroy(rt));
  TEST_SKIP_IF(kind != SPW_BACKEND_HOST, "the CUDA backend supports registration");
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_STATUS(spw_stream_register(rt, UNKNOWN_STREAM), SPW_ERR_UNSUPPORTED);
  ASSERT_STATUS(spw_stream_register(rt, s), SPW_ERR_UNSUPPORTED);
  /* Registering failed, so the unknown value is still unknown. */
  ASSERT_STATUS(spw_stream_synchronize(rt, UNKNOWN_STREAM), SPW_ERR_INVALID_STREAM);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void get_stats_writes_only_struct_size_bytes(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, NULL, &b));
  spw_stats_t st;
  memset(&st, 0xAB, sizeof st);
  st.struct_size = offsetof(spw_stats_t, device_bytes);
  ASSERT_OK(spw_get_stats(rt, &st));
  ASSERT_UEQ(st.buffers, 1);
  ASSERT_UEQ(st.device_bytes, 0xABABABABABABABABull);
  ASSERT_UEQ(st.disk_read_ns, 0xABABABABABABABABull);
  ASSERT_UEQ(st.disk_requests, 0xABABABABABABABABull);
  ASSERT_OK(spw_free(rt, b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void stats_summary_is_nul_terminated_when_truncated(void) {
  spw_runtime_t *rt = test_runtime(NULL);
  char text[32];
  memset(text, 'X', sizeof text);
  ASSERT_OK(spw_stats_summary(rt, text, 4));
  ASSERT_TRUE(memchr(text, '\0', 4) != NULL);
  for (size_t i = 4; i < sizeof text; i++) ASSERT_EQ(text[i], 'X');
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(every_status_has_its_name_and_text),
    TEST(unknown_status_gives_unknown_status),
    TEST(has_detail_names_the_statuses_that_record_one),
    TEST(null_runtime_is_invalid_arg),
    TEST(destroy_of_null_runtime_does_nothing),
    TEST(last_error_is_never_null),
    TEST(null_output_pointer_is_invalid_arg),
    TEST(limits_accept_null_outputs),
    TEST(zero_or_absurd_alloc_size_is_invalid_arg),
    TEST(memcpy_of_zero_bytes_is_invalid_arg),
    TEST(unknown_stream_is_invalid_stream),
    TEST(destroyed_stream_is_invalid_stream),
    TEST(stream_of_another_runtime_is_invalid_stream),
    TEST(unknown_acquire_flags_are_invalid_arg),
    TEST(unknown_config_flags_are_refused),
    TEST(spill_to_device_or_unknown_tier_is_invalid_arg),
    TEST(spill_of_a_locked_buffer_is_locked),
    TEST(runtime_create_refuses_a_short_config_struct),
    TEST(config_validate_names_the_bad_variable),
    TEST(config_validate_of_good_config_gives_empty_message),
    TEST(config_validate_truncates_message_to_len),
    TEST(ignore_env_flag_skips_a_bad_environment),
    TEST(config_field_out_of_range_is_config_error),
    TEST(stream_register_on_host_backend_is_unsupported),
    TEST(get_stats_writes_only_struct_size_bytes),
    TEST(stats_summary_is_nul_terminated_when_truncated),
};
TEST_MAIN_FIXTURE(tests, NULL, restore_env)
