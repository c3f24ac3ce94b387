/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of configuration resolution (src/core/config.c): defaults, every SPILLWAY_*
 * variable with good and bad values, the size and percentage forms, overflow, precedence
 * of the struct over the environment, SPW_CONFIG_IGNORE_ENV, struct_size handling and the
 * watermark ordering. Each test starts from an environment with no SPILLWAY_* variable. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "config.h"
#include "test_main.h"
#include "test_util.h"

#define GiB ((uint64_t)1 << 30)
#define MiB ((uint64_t)1 << 20)
#define KiB ((uint64_t)1 << 10)

static const char *const all_vars[] = {
    "SPILLWAY_DEVICE",      "SPILLWAY_BACKEND",        "SPILLWAY_DEVICE_LIMIT",
    "SPILLWAY_HOST_LIMIT",  "SPILLWAY_DISK_LIMIT",     "SPILLWAY_SPILL_DIR",
    "SPILLWAY_IO",          "SPILLWAY_HIGH_WATERMARK", "SPILLWAY_LOW_WATERMARK",
    "SPILLWAY_LOG_LEVEL",   "SPILLWAY_HOST_DEVICE_BYTES", "SPILLWAY_ENGINE_HELPERS",
};

static const char *saved_tmpdir;

/* Every config test starts from an environment without SPILLWAY_* variables. */
static void clear_env(void) {
  for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
  if (saved_tmpdir) setenv("TMPDIR", saved_tmpdir, 1);
  else unsetenv("TMPDIR");
}

static uint64_t physical_memory(void) {
  return (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
}

static char err[512];

static int resolve(const spw_config_t *cfg, spw_settings_t *s) {
  memset(err, 'x', sizeof err - 1);
  err[sizeof err - 1] = '\0';
  return spw__config_resolve(cfg, s, err, sizeof err);
}

static int resolve_env(spw_settings_t *s) { return resolve(NULL, s); }

#define ASSERT_ERR_HAS(text)                                                                 \
  do {                                                                                       \
    if (!strstr(err, (text))) {                                                              \
      fprintf(stderr, "%s:%d: err '%s' lacks '%s'\n", __FILE__, __LINE__, err, (text));     \
      abort();                                                                               \
    }                                                                                        \
  } while (0)

#define ASSERT_DBL_EQ(a, b) ASSERT_TRUE(fabs((double)(a) - (double)(b)) < 1e-12)

/* The variable set to `value` fails with SPW_ERR_CONFIG and an error naming it. */
static void expect_env_rejected(const char *var, const char *value) {
  spw_settings_t s;
  setenv(var, value, 1);
  int st = resolve_env(&s);
  if (st != SPW_ERR_CONFIG) {
    fprintf(stderr, "%s='%s' gave %s, expected SPW_ERR_CONFIG\n", var, value,
            spw_err_name(st));
    abort();
  }
  char want[256];
  snprintf(want, sizeof want, "%s='%s'", var, value);
  ASSERT_ERR_HAS(want);
  unsetenv(var);
}

static void set_and_resolve(const char *var, const char *value, spw_settings_t *s) {
  setenv(var, value, 1);
  int st = resolve_env(s);
  if (st != SPW_OK) {
    fprintf(stderr, "%s='%s' gave %s: %s\n", var, value, spw_err_name(st), err);
    abort();
  }
  unsetenv(var);
}

/* ---- defaults ----------------------------------------------------------------------- */

static void defaults_without_config_or_environment(void) {
  unsetenv("TMPDIR");
  spw_settings_t s;
  ASSERT_OK(resolve_env(&s));
  ASSERT_TRUE(strcmp(err, "") == 0);
  ASSERT_EQ(s.device, 0);
  ASSERT_EQ(s.backend, SPW_BACKEND_AUTO);
  ASSERT_UEQ(s.device_limit, 0);
  ASSERT_DBL_EQ(s.device_limit_fraction, 0.80);
  ASSERT_UEQ(s.host_limit, (uint64_t)((double)physical_memory() * 0.25));
  ASSERT_UEQ(s.disk_limit, 0);
  ASSERT_TRUE(strcmp(s.spill_dir, "/tmp") == 0);
  ASSERT_EQ(s.io, SPW_IO_AUTO);
  ASSERT_DBL_EQ(s.high_watermark, 0.95);
  ASSERT_DBL_EQ(s.low_watermark, 0.85);
  ASSERT_EQ(s.log_level, SPW_LOG_WARN);
  ASSERT_UEQ(s.host_device_bytes, GiB);
}

static void config_init_gives_the_same_defaults_as_null(void) {
  spw_config_t c = SPW_CONFIG_INIT;
  spw_settings_t a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  ASSERT_OK(resolve(NULL, &a));
  ASSERT_OK(resolve(&c, &b));
  ASSERT_TRUE(memcmp(&a, &b, sizeof a) == 0);
}

static void default_spill_dir_is_tmpdir(void) {
  spw_settings_t s;
  setenv("TMPDIR", "/var/tmp/spw-test", 1);
  ASSERT_OK(resolve_env(&s));
  ASSERT_TRUE(strcmp(s.spill_dir, "/var/tmp/spw-test") == 0);
  setenv("TMPDIR", "", 1);
  ASSERT_OK(resolve_env(&s));
  ASSERT_TRUE(strcmp(s.spill_dir, "/tmp") == 0);
}

/* ---- each variable, good values ------------------------------------------------------ */

static void device_variable_is_read(void) {
  spw_settings_t s;
  set_and_resolve("SPILLWAY_DEVICE", "3", &s);
  ASSERT_EQ(s.device, 3);
  set_and_resolve("SPILLWAY_DEVICE", " 0 ", &s);
  ASSERT_EQ(s.device, 0);
  set_and_resolve("SPILLWAY_DEVICE", "2147483647", &s);
  ASSERT_EQ(s.device, 2147483647);
}

static void backend_variable_is_read_case_insensitively(void) {
  spw_settings_t s;
  set_and_resolve("SPILLWAY_BACKEND", "cuda", &s);
  ASSERT_EQ(s.backend, SPW_BACKEND_CUDA);
  set_and_resolve("SPILLWAY_BACKEND", " HoSt\t", &s);
  ASSERT_EQ(s.backend, SPW_BACKEND_HOST);
  set_and_resolve("SPILLWAY_BACKEND", "AUTO", &s);
  ASSERT_EQ(s.backend, SPW_BACKEND_AUTO);
}

static void device_limit_variable_takes_bytes_or_percent(void) {
  spw_settings_t s;
  set_and_resolve("SPILLWAY_DEVICE_LIMIT", "4GiB", &s);
  ASSERT_UEQ(s.device_limit, 4 * GiB);
  set_and_resolve("SPILLWAY_DEVICE_LIMIT", "1.5GiB", &s);
  ASSERT_UEQ(s.device_limit, 3 * GiB / 2);
  set_and_resolve("SPILLWAY_DEVICE_LIMIT", "50%", &s);
  ASSERT_UEQ(s.device_limit, 0);
  ASSERT_DBL_EQ(s.device_limit_fraction, 0.5);
  set_and_resolve("SPILLWAY_DEVICE_LIMIT", " 12.5 % ", &s);
  ASSERT_UEQ(s.device_limit, 0);
  ASSERT_DBL_EQ(s.device_limit_fraction, 0.125);
  set_and_resolve("SPILLWAY_DEVICE_LIMIT", "100%", &s);
  ASSERT_DBL_EQ(s.device_limit_fraction, 1.0);
}

static void host_limit_variable_takes_bytes_or_percent_of_physical_memory(void) {
  spw_settings_t s;
  set_and_resolve("SPILLWAY_HOST_LIMIT", "16GiB", &s);
  ASSERT_UEQ(s.host_limit, 16 * GiB);
  set_and_resolve("SPILLWAY_HOST_LIMIT", "50%", &s);
  ASSERT_UEQ(s.host_limit, physical_memory() / 2);
  set_and_resolve("SPILLWAY_HOST_LIMIT", "100%", &s);
  ASSERT_UEQ(s.host_limit, physical_memory());
}

static void disk_limit_variable_takes_bytes_and_zero_means_none(void) {
  spw_settings_t s;
  set_and_resolve("SPILLWAY_DISK_LIMIT", "100GiB", &s);
  ASSERT_UEQ(s.disk_limit, 100 * GiB);
  set_and_resolve("SPILLWAY_DISK_LIMIT", "0", &s);
  ASSERT_UEQ(s.disk_limit, 0);
}

static void spill_dir_variable_beats_tmpdir(void) {
  spw_settings_t s;
  setenv("TMPDIR", "/var/tmp", 1);
  set_and_resolve("SPILLWAY_SPILL_DIR", "/scratch/my spill", &s);
  ASSERT_TRUE(strcmp(s.spill_dir, "/scratch/my spill") == 0);
}

static void spill_dir_of_4095_bytes_fits(void) {
  static char path[SPW_SPILL_DIR_MAX];
  memset(path, 'd', sizeof path - 1);
  path[0] = '/';
  path[sizeof path - 1] = '\0';
  spw_settings_t s;
  set_and_resolve("SPILLWAY_SPILL_DIR", path, &s);
  ASSERT_EQ(strlen(s.spill_dir), SPW_SPILL_DIR_MAX - 1);
}

static void io_variable_is_read(void) {
  spw_settings_t s;
  set_and_resolve("SPILLWAY_IO", "uring", &s);
  ASSERT_EQ(s.io, SPW_IO_URING);
  set_and_resolve("SPILLWAY_IO", "POSIX", &s);
  ASSERT_EQ(s.io, SPW_IO_POSIX);
  set_and_resolve("SPILLWAY_IO", "auto", &s);
  ASSERT_EQ(s.io, SPW_IO_AUTO);
}

static void watermark_variables_are_read(void) {
  spw_settings_t s;
  setenv("SPILLWAY_LOW_WATERMARK", "0.5", 1);
  set_and_resolve("SPILLWAY_HIGH_WATERMARK", "1", &s);
  ASSERT_DBL_EQ(s.high_watermark, 1.0);
  ASSERT_DBL_EQ(s.low_watermark, 0.5);
  set_and_resolve("SPILLWAY_HIGH_WATERMARK", " .75 ", &s);
  ASSERT_DBL_EQ(s.high_watermark, 0.75);
}

static void log_level_variable_is_read(void) {
  static const struct {
    const char *text;
    spw_log_level_t level;
  } cases[] = {{"off", SPW_LOG_OFF},   {"ERROR", SPW_LOG_ERROR}, {"Warn", SPW_LOG_WARN},
               {"info", SPW_LOG_INFO}, {" debug ", SPW_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    spw_settings_t s;
    set_and_resolve("SPILLWAY_LOG_LEVEL", cases[i].text, &s);
    ASSERT_EQ(s.log_level, cases[i].level);
  }
}

static void host_device_bytes_variable_is_read(void) {
  spw_settings_t s;
  set_and_resolve("SPILLWAY_HOST_DEVICE_BYTES", "256MiB", &s);
  ASSERT_UEQ(s.host_device_bytes, 256 * MiB);
}

static void blank_variable_counts_as_unset(void) {
  spw_settings_t s;
  setenv("SPILLWAY_BACKEND", "", 1);
  setenv("SPILLWAY_DEVICE_LIMIT", "   ", 1);
  setenv("SPILLWAY_LOG_LEVEL", "\t", 1);
  ASSERT_OK(resolve_env(&s));
  ASSERT_EQ(s.backend, SPW_BACKEND_AUTO);
  ASSERT_DBL_EQ(s.device_limit_fraction, 0.80);
  ASSERT_EQ(s.log_level, SPW_LOG_WARN);
}

/* ---- each variable, bad values ------------------------------------------------------- */

static void bad_device_values_are_rejected(void) {
  expect_env_rejected("SPILLWAY_DEVICE", "-1");
  expect_env_rejected("SPILLWAY_DEVICE", "one");
  expect_env_rejected("SPILLWAY_DEVICE", "1.0");
  expect_env_rejected("SPILLWAY_DEVICE", "2x");
  expect_env_rejected("SPILLWAY_DEVICE", "2147483648");
  expect_env_rejected("SPILLWAY_DEVICE", "99999999999999999999999");
}

static void bad_backend_values_are_rejected(void) {
  expect_env_rejected("SPILLWAY_BACKEND", "gpu");
  expect_env_rejected("SPILLWAY_BACKEND", "cudax");
  expect_env_rejected("SPILLWAY_BACKEND", "cu da");
}

static void device_limit_error_text_names_variable_and_forms(void) {
  spw_settings_t s;
  setenv("SPILLWAY_DEVICE_LIMIT", "abc", 1);
  ASSERT_STATUS(resolve_env(&s), SPW_ERR_CONFIG);
  ASSERT_TRUE(strcmp(err, "SPILLWAY_DEVICE_LIMIT='abc': expected bytes (e.g. 4GiB) or a "
                          "percentage (e.g. 80%)") == 0);
}

static void bad_device_limit_values_are_rejected(void) {
  const char *bad[] = {"abc", "4 GiBs", "4GiB x", "-4GiB", "0", "0%", "101%", "-5%",
                       "%",   "abc%",   "50%%",   "1e9",   "0x10", "1.5", "GiB", "4 G iB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_env_rejected("SPILLWAY_DEVICE_LIMIT", bad[i]);
}

static void bad_host_limit_values_are_rejected(void) {
  const char *bad[] = {"lots", "0", "0KiB", "150%", "0.0%", "16GiB!"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_env_rejected("SPILLWAY_HOST_LIMIT", bad[i]);
}

static void bad_disk_limit_values_are_rejected(void) {
  expect_env_rejected("SPILLWAY_DISK_LIMIT", "50%");
  expect_env_rejected("SPILLWAY_DISK_LIMIT", "none");
  expect_env_rejected("SPILLWAY_DISK_LIMIT", "-1");
}

static void too_long_spill_dir_is_rejected(void) {
  static char path[SPW_SPILL_DIR_MAX + 1];
  memset(path, 'd', sizeof path - 1);
  path[0] = '/';
  path[sizeof path - 1] = '\0';
  setenv("SPILLWAY_SPILL_DIR", path, 1);
  spw_settings_t s;
  ASSERT_STATUS(resolve_env(&s), SPW_ERR_CONFIG);
  ASSERT_ERR_HAS("SPILLWAY_SPILL_DIR=");
}

static void bad_io_values_are_rejected(void) {
  expect_env_rejected("SPILLWAY_IO", "aio");
  expect_env_rejected("SPILLWAY_IO", "io_uring");
}

static void bad_watermark_values_are_rejected(void) {
  const char *bad[] = {"0", "1.01", "-0.5", "95%", "0.9x", "nan", "inf", "1e-1", "0,9"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    expect_env_rejected("SPILLWAY_HIGH_WATERMARK", bad[i]);
    expect_env_rejected("SPILLWAY_LOW_WATERMARK", bad[i]);
  }
}

static void bad_log_level_values_are_rejected(void) {
  expect_env_rejected("SPILLWAY_LOG_LEVEL", "verbose");
  expect_env_rejected("SPILLWAY_LOG_LEVEL", "3");
  expect_env_rejected("SPILLWAY_LOG_LEVEL", "warning");
}

static void bad_host_device_bytes_values_are_rejected(void) {
  expect_env_rejected("SPILLWAY_HOST_DEVICE_BYTES", "0");
  expect_env_rejected("SPILLWAY_HOST_DEVICE_BYTES", "50%");
  expect_env_rejected("SPILLWAY_HOST_DEVICE_BYTES", "1GiB1");
}

static void engine_helpers_default_to_auto_and_take_a_count(void) {
  spw_settings_t s;
  ASSERT_OK(resolve_env(&s));
  ASSERT_EQ(s.engine_helpers, -1);
  set_and_resolve("SPILLWAY_ENGINE_HELPERS", " 7 ", &s);
  ASSERT_EQ(s.engine_helpers, 7);
  set_and_resolve("SPILLWAY_ENGINE_HELPERS", "0", &s);
  ASSERT_EQ(s.engine_helpers, 0);
  set_and_resolve("SPILLWAY_ENGINE_HELPERS", "AUTO", &s);
  ASSERT_EQ(s.engine_helpers, -1);
  unsetenv("SPILLWAY_ENGINE_HELPERS");
  spw_config_t c = SPW_CONFIG_INIT;
  c.engine_helpers = -1; /* none, and it beats the environment */
  setenv("SPILLWAY_ENGINE_HELPERS", "5", 1);
  ASSERT_OK(resolve(&c, &s));
  ASSERT_EQ(s.engine_helpers, 0);
  c.engine_helpers = 15;
  ASSERT_OK(resolve(&c, &s));
  ASSERT_EQ(s.engine_helpers, 15);
  unsetenv("SPILLWAY_ENGINE_HELPERS");
}

static void bad_engine_helpers_values_are_rejected(void) {
  expect_env_rejected("SPILLWAY_ENGINE_HELPERS", "16");
  expect_env_rejected("SPILLWAY_ENGINE_HELPERS", "-1");
  expect_env_rejected("SPILLWAY_ENGINE_HELPERS", "3x");
  expect_env_rejected("SPILLWAY_ENGINE_HELPERS", "0004");
  spw_settings_t s;
  spw_config_t c = SPW_CONFIG_INIT;
  c.engine_helpers = 16;
  ASSERT_STATUS(resolve(&c, &s), SPW_ERR_CONFIG);
  ASSERT_ERR_HAS("config.engine_helpers=16");
  c.engine_helpers = -2;
  ASSERT_STATUS(resolve(&c, &s), SPW_ERR_CONFIG);
  ASSERT_ERR_HAS("config.engine_helpers=-2");
}

/* ---- the size parser ---------------------------------------------------------------- */

static void size_parser_accepts_units_and_decimals(void) {
  static const struct {
    const char *text;
    uint64_t bytes;
  } cases[] = {
      {"0", 0},
      {"4096", 4096},
      {" 4096 ", 4096},
      {"4096B", 4096},
      {"1k", KiB},
      {"1KB", KiB},
      {"1KiB", KiB},
      {"2M", 2 * MiB},
      {"2mb", 2 * MiB},
      {"2MiB", 2 * MiB},
      {"3G", 3 * GiB},
      {"3GB", 3 * GiB},
      {"3gib", 3 * GiB},
      {"1T", 1024 * GiB},
      {"1TB", 1024 * GiB},
      {"1TiB", 1024 * GiB},
      {"1.5GiB", 3 * GiB / 2},
      {"1.5 GiB", 3 * GiB / 2},
      {"0.5K", 512},
      {".25MiB", MiB / 4},
      {"1.0", 1},
      {"0.1GiB", 107374182},      /* 107374182.4, rounded down */
      {"0.999999999999999999999K", 1023}, /* many digits, still exact and rounded down */
      {"18446744073709551615", UINT64_MAX},
      {"16777215.5TiB", UINT64_MAX - ((uint64_t)1 << 39) + 1},
      {"16777215.99999999999999TiB", UINT64_MAX}, /* 2^64 - 0.011: the largest size */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t v = 12345;
    int st = spw__parse_size(cases[i].text, &v);
    if (st != SPW_OK || v != cases[i].bytes) {
      fprintf(stderr, "'%s': %s, %llu, expected %llu\n", cases[i].text, spw_err_name(st),
              (unsigned long long)v, (unsigned long long)cases[i].bytes);
      abort();
    }
  }
}

static void size_parser_rejects_garbage(void) {
  const char *bad[] = {"",     "  ",    "abc",   "-1",    "+1",  "1-",  "1.5",  "1.5B",
                       "1 2",  "1KiBB", "1Ki",   "1 K B", "0x10", "1e3", "1,5G", "G",
                       "1.2.3", ".",    "1PiB",  "1 GiB x", "4096 bytes"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t v = 777;
    int st = spw__parse_size(bad[i], &v);
    if (st != SPW_ERR_CONFIG || v != 777) {
      fprintf(stderr, "'%s' gave %s (%llu), expected SPW_ERR_CONFIG\n", bad[i],
              spw_err_name(st), (unsigned long long)v);
      abort();
    }
  }
}

static void size_parser_rejects_overflow(void) {
  const char *bad[] = {"18446744073709551616", "99999999999999999999999", "18446744073709551615K",
                       "16777216TiB", "17179869184GiB",
                       "18014398509481984K"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t v = 777;
    int st = spw__parse_size(bad[i], &v);
    if (st != SPW_ERR_CONFIG) {
      fprintf(stderr, "'%s' gave %s (%llu), expected SPW_ERR_CONFIG\n", bad[i],
              spw_err_name(st), (unsigned long long)v);
      abort();
    }
  }
}

static void size_parser_rejects_null(void) {
  uint64_t v;
  ASSERT_STATUS(spw__parse_size(NULL, &v), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__parse_size("1", NULL), SPW_ERR_INVALID_ARG);
}

static void device_limit_overflow_is_rejected(void) {
  expect_env_rejected("SPILLWAY_DEVICE_LIMIT", "16777216TiB");
  expect_env_rejected("SPILLWAY_HOST_LIMIT", "18446744073709551616");
}

/* ---- precedence ----------------------------------------------------------------------- */

static void set_every_variable(void) {
  setenv("SPILLWAY_DEVICE", "5", 1);
  setenv("SPILLWAY_BACKEND", "cuda", 1);
  setenv("SPILLWAY_DEVICE_LIMIT", "10GiB", 1);
  setenv("SPILLWAY_HOST_LIMIT", "20GiB", 1);
  setenv("SPILLWAY_DISK_LIMIT", "30GiB", 1);
  setenv("SPILLWAY_SPILL_DIR", "/env/dir", 1);
  setenv("SPILLWAY_IO", "posix", 1);
  setenv("SPILLWAY_HIGH_WATERMARK", "0.7", 1);
  setenv("SPILLWAY_LOW_WATERMARK", "0.6", 1);
  setenv("SPILLWAY_LOG_LEVEL", "debug", 1);
  setenv("SPILLWAY_HOST_DEVICE_BYTES", "64MiB", 1);
}

/* Checks the settings that both the struct and set_every_variable() set against `want`, a
 * configuration holding the expected values. */
static void expect_settings(const spw_settings_t *s, const spw_config_t *want) {
  ASSERT_EQ(s->device, want->device);
  ASSERT_EQ(s->backend, want->backend);
  ASSERT_UEQ(s->device_limit, want->device_limit);
  ASSERT_UEQ(s->host_limit, want->host_limit);
  ASSERT_UEQ(s->disk_limit, want->disk_limit);
  ASSERT_TRUE(strcmp(s->spill_dir, want->spill_dir) == 0);
  ASSERT_EQ(s->io, want->io);
  ASSERT_DBL_EQ(s->high_watermark, want->high_watermark);
  ASSERT_DBL_EQ(s->low_watermark, want->low_watermark);
  ASSERT_EQ(s->log_level, want->log_level);
  ASSERT_UEQ(s->host_device_bytes, want->host_device_bytes);
}

static void zero_struct_fields_take_the_environment(void) {
  set_every_variable();
  spw_config_t c = SPW_CONFIG_INIT;
  spw_settings_t s;
  ASSERT_OK(resolve(&c, &s));
  const spw_config_t from_env = {.device = 5, .backend = SPW_BACKEND_CUDA,
                                 .device_limit = 10 * GiB, .host_limit = 20 * GiB,
                                 .disk_limit = 30 * GiB, .spill_dir = "/env/dir",
                                 .io = SPW_IO_POSIX, .high_watermark = 0.7,
                                 .low_watermark = 0.6, .log_level = SPW_LOG_DEBUG,
                                 .host_device_bytes = 64 * MiB};
  expect_settings(&s, &from_env);
}

static void struct_fields_beat_the_environment(void) {
  set_every_variable();
  spw_config_t c = SPW_CONFIG_INIT;
  c.device = 1;
  c.backend = SPW_BACKEND_HOST;
  c.device_limit = 1 * GiB;
  c.host_limit = 2 * GiB;
  c.disk_limit = 3 * GiB;
  c.spill_dir = "/struct/dir";
  c.io = SPW_IO_URING;
  c.high_watermark = 0.9;
  c.low_watermark = 0.8;
  c.log_level = SPW_LOG_ERROR;
  c.host_device_bytes = 128 * MiB;
  spw_settings_t s;
  ASSERT_OK(resolve(&c, &s));
  expect_settings(&s, &c);
}

static void struct_field_hides_a_bad_variable(void) {
  setenv("SPILLWAY_DEVICE_LIMIT", "garbage", 1);
  spw_config_t c = SPW_CONFIG_INIT;
  c.device_limit = 1 * GiB;
  spw_settings_t s;
  ASSERT_OK(resolve(&c, &s));
  ASSERT_UEQ(s.device_limit, 1 * GiB);
}

static void ignore_env_uses_only_struct_and_defaults(void) {
  set_every_variable();
  setenv("SPILLWAY_BACKEND", "not-a-backend", 1); /* would fail if it were read */
  unsetenv("TMPDIR");
  spw_config_t c = SPW_CONFIG_INIT;
  c.flags = SPW_CONFIG_IGNORE_ENV;
  c.disk_limit = 7 * GiB;
  spw_settings_t s;
  ASSERT_OK(resolve(&c, &s));
  ASSERT_EQ(s.device, 0);
  ASSERT_EQ(s.backend, SPW_BACKEND_AUTO);
  ASSERT_UEQ(s.device_limit, 0);
  ASSERT_DBL_EQ(s.device_limit_fraction, 0.80);
  ASSERT_UEQ(s.disk_limit, 7 * GiB);
  ASSERT_TRUE(strcmp(s.spill_dir, "/tmp") == 0);
  ASSERT_EQ(s.io, SPW_IO_AUTO);
  ASSERT_DBL_EQ(s.high_watermark, 0.95);
  ASSERT_EQ(s.log_level, SPW_LOG_WARN);
  ASSERT_UEQ(s.host_device_bytes, GiB);
}

/* ---- struct validation ---------------------------------------------------------------- */

static void struct_size_too_small_is_invalid_arg(void) {
  spw_config_t c = SPW_CONFIG_INIT;
  spw_settings_t s;
  c.struct_size = offsetof(spw_config_t, flags);
  ASSERT_STATUS(resolve(&c, &s), SPW_ERR_INVALID_ARG);
  ASSERT_ERR_HAS("struct_size");
  c.struct_size = 0;
  ASSERT_STATUS(resolve(&c, &s), SPW_ERR_INVALID_ARG);
}

static void struct_ending_at_flags_is_accepted(void) {
  spw_config_t c = SPW_CONFIG_INIT;
  c.struct_size = offsetof(spw_config_t, flags) + sizeof(unsigned);
  c.device = 2;
  spw_settings_t s;
  ASSERT_OK(resolve(&c, &s));
  ASSERT_EQ(s.device, 2);
}

/* Found by fuzz_config: struct_size 113 copied one byte of stable_addresses (7) and refused
 * the config for a value the caller never gave. A cut pointer would be worse. */
static void field_cut_by_struct_size_counts_as_unset(void) {
  spw_config_t c = SPW_CONFIG_INIT;
  c.stable_addresses = (spw_stable_mode_t)7;
  c.trace_path = (const char *)(uintptr_t)0xDEADBEEFCAFEull;
  c.trace_max_bytes = 12345;
  c.struct_size = offsetof(spw_config_t, trace_path) + 1;
  c.flags = SPW_CONFIG_IGNORE_ENV;
  spw_settings_t s;
  ASSERT_OK(resolve(&c, &s));
  ASSERT_EQ(s.trace_path[0], 0);
  ASSERT_EQ(s.stable_addresses, 0);
  c.trace_path = NULL;
  c.struct_size = offsetof(spw_config_t, stable_addresses) + 1;
  ASSERT_OK(resolve(&c, &s));
  ASSERT_UEQ(s.trace_max, 12345);
  ASSERT_EQ(s.stable_addresses, 0);
}

static void larger_future_struct_is_accepted(void) {
  struct {
    spw_config_t c;
    uint64_t future_fields[4];
  } big;
  memset(&big, 0xEE, sizeof big); /* the unknown tail holds anything */
  spw_config_t init = SPW_CONFIG_INIT;
  big.c = init;
  big.c.struct_size = sizeof big;
  big.c.host_limit = 5 * GiB;
  spw_settings_t s;
  ASSERT_OK(resolve(&big.c, &s));
  ASSERT_UEQ(s.host_limit, 5 * GiB);
}

static void unknown_flags_are_invalid_arg(void) {
  spw_config_t c = SPW_CONFIG_INIT;
  c.flags = 0x100;
  spw_settings_t s;
  ASSERT_STATUS(resolve(&c, &s), SPW_ERR_INVALID_ARG);
  ASSERT_ERR_HAS("config.flags");
}

static void bad_struct_fields_are_named(void) {
  static const struct {
    const char *field;
    int which;
  } cases[] = {{"config.device", 0},         {"config.backend", 1},
               {"config.io", 2},             {"config.log_level", 3},
               {"config.high_watermark", 4}, {"config.low_watermark", 5},
               {"config.high_watermark", 6}, {"config.low_watermark", 7},
               {"config.spill_dir", 8}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    spw_config_t c = SPW_CONFIG_INIT;
    switch (cases[i].which) {
    case 0: c.device = -1; break;
    case 1: c.backend = (spw_backend_kind_t)7; break;
    case 2: c.io = (spw_io_kind_t)9; break;
    case 3: c.log_level = (spw_log_level_t)6; break;
    case 4: c.high_watermark = 1.5; break;
    case 5: c.low_watermark = -0.1; break;
    case 6: c.high_watermark = NAN; break;
    case 7: c.low_watermark = INFINITY; break;
    case 8: c.spill_dir = ""; break;
    }
    spw_settings_t s;
    int st = resolve(&c, &s);
    if (st != SPW_ERR_CONFIG || !strstr(err, cases[i].field)) {
      fprintf(stderr, "case %d: %s '%s', expected SPW_ERR_CONFIG naming %s\n",
              cases[i].which, spw_err_name(st), err, cases[i].field);
      abort();
    }
  }
}

/* ---- watermark ordering ------------------------------------------------------------- */

static void low_watermark_at_or_above_high_is_rejected(void) {
  spw_settings_t s;
  setenv("SPILLWAY_HIGH_WATERMARK", "0.8", 1);
  setenv("SPILLWAY_LOW_WATERMARK", "0.8", 1);
  ASSERT_STATUS(resolve_env(&s), SPW_ERR_CONFIG);
  ASSERT_ERR_HAS("SPILLWAY_LOW_WATERMARK");
  ASSERT_ERR_HAS("SPILLWAY_HIGH_WATERMARK");
  setenv("SPILLWAY_LOW_WATERMARK", "0.9", 1);
  ASSERT_STATUS(resolve_env(&s), SPW_ERR_CONFIG);

  /* A high watermark alone below the default low one (0.85). */
  unsetenv("SPILLWAY_LOW_WATERMARK");
  ASSERT_STATUS(resolve_env(&s), SPW_ERR_CONFIG);
  ASSERT_ERR_HAS("default");

  clear_env();
  spw_config_t c = SPW_CONFIG_INIT;
  c.high_watermark = 0.5;
  c.low_watermark = 0.6;
  ASSERT_STATUS(resolve(&c, &s), SPW_ERR_CONFIG);
  ASSERT_ERR_HAS("config.low_watermark");
  ASSERT_ERR_HAS("config.high_watermark");
}

static void low_watermark_below_high_is_accepted(void) {
  spw_config_t c = SPW_CONFIG_INIT;
  c.high_watermark = 0.5;
  c.low_watermark = 0.49;
  spw_settings_t s;
  ASSERT_OK(resolve(&c, &s));
  ASSERT_DBL_EQ(s.high_watermark, 0.5);
  ASSERT_DBL_EQ(s.low_watermark, 0.49);
}

/* ---- output contract ----------------------------------------------------------------- */

static void failure_leaves_settings_untouched(void) {
  spw_settings_t s;
  memset(&s, 0xAB, sizeof s);
  spw_settings_t before = s;
  setenv("SPILLWAY_IO", "bogus", 1);
  ASSERT_STATUS(resolve_env(&s), SPW_ERR_CONFIG);
  ASSERT_TRUE(memcmp(&s, &before, sizeof s) == 0);
}

static void error_text_is_truncated_and_terminated(void) {
  setenv("SPILLWAY_DEVICE_LIMIT", "abc", 1);
  spw_settings_t s;
  char small[16];
  memset(small, 'x', sizeof small);
  ASSERT_STATUS(spw__config_resolve(NULL, &s, small, sizeof small), SPW_ERR_CONFIG);
  ASSERT_EQ(strlen(small), sizeof small - 1);
  ASSERT_TRUE(strncmp(small, "SPILLWAY_DEVICE", 15) == 0);
  /* No buffer at all is fine too. */
  ASSERT_STATUS(spw__config_resolve(NULL, &s, NULL, 0), SPW_ERR_CONFIG);
}

static void null_output_is_invalid_arg(void) {
  ASSERT_STATUS(spw__config_resolve(NULL, NULL, err, sizeof err), SPW_ERR_INVALID_ARG);
}

static void save_tmpdir(void) {
  const char *t = getenv("TMPDIR");
  saved_tmpdir = t ? strdup(t) : NULL;
}

static void forget_tmpdir(void) { free((void *)saved_tmpdir); }

static const spw_test_t tests[] = {
    TEST(defaults_without_config_or_environment),
    TEST(config_init_gives_the_same_defaults_as_null),
    TEST(default_spill_dir_is_tmpdir),
    TEST(device_variable_is_read),
    TEST(backend_variable_is_read_case_insensitively),
    TEST(device_limit_variable_takes_bytes_or_percent),
    TEST(host_limit_variable_takes_bytes_or_percent_of_physical_memory),
    TEST(disk_limit_variable_takes_bytes_and_zero_means_none),
    TEST(spill_dir_variable_beats_tmpdir),
    TEST(spill_dir_of_4095_bytes_fits),
    TEST(io_variable_is_read),
    TEST(watermark_variables_are_read),
    TEST(log_level_variable_is_read),
    TEST(host_device_bytes_variable_is_read),
    TEST(blank_variable_counts_as_unset),
    TEST(bad_device_values_are_rejected),
    TEST(bad_backend_values_are_rejected),
    TEST(device_limit_error_text_names_variable_and_forms),
    TEST(bad_device_limit_values_are_rejected),
    TEST(bad_host_limit_values_are_rejected),
    TEST(bad_disk_limit_values_are_rejected),
    TEST(too_long_spill_dir_is_rejected),
    TEST(bad_io_values_are_rejected),
    TEST(bad_watermark_values_are_rejected),
    TEST(bad_log_level_values_are_rejected),
    TEST(bad_host_device_bytes_values_are_rejected),
    TEST(engine_helpers_default_to_auto_and_take_a_count),
    TEST(bad_engine_helpers_values_are_rejected),
    TEST(size_parser_accepts_units_and_decimals),
    TEST(size_parser_rejects_garbage),
    TEST(size_parser_rejects_overflow),
    TEST(size_parser_rejects_null),
    TEST(device_limit_overflow_is_rejected),
    TEST(zero_struct_fields_take_the_environment),
    TEST(struct_fields_beat_the_environment),
    TEST(struct_field_hides_a_bad_variable),
    TEST(ignore_env_uses_only_struct_and_defaults),
    TEST(struct_size_too_small_is_invalid_arg),
    TEST(struct_ending_at_flags_is_accepted),
    TEST(field_cut_by_struct_size_counts_as_unset),
    TEST(larger_future_struct_is_accepted),
    TEST(unknown_flags_are_invalid_arg),
    TEST(bad_struct_fields_are_named),
    TEST(low_watermark_at_or_above_high_is_rejected),
    TEST(low_watermark_below_high_is_accepted),
    TEST(failure_leaves_settings_untouched),
    TEST(error_text_is_truncated_and_terminated),
    TEST(null_output_is_invalid_arg),
};
TEST_MAIN_FULL(tests, save_tmpdir, forget_tmpdir, clear_env)
