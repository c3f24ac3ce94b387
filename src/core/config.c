/* SPDX-License-Identifier: Apache-2.0 */
/* Configuration resolution (see config.h): the struct, then the SPILLWAY_* environment,
 * then the built-in defaults, into a spw_settings_t.
 *
 * Parsing is done here by hand rather than with strtoull/strtod: strtod follows the
 * program's LC_NUMERIC (a library must read "1.5GiB" the same under a German locale), and
 * both accept signs, hex and exponents that a size or fraction must reject. Sizes are
 * computed exactly in integers, so "1.5GiB" is 1610612736 and overflow is detected.
 * Invariant: on failure nothing but `err` is written.
 */
#include "config.h"

#include <limits.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define DEFAULT_DEVICE_FRACTION 0.80
#define DEFAULT_HOST_FRACTION 0.25
#define DEFAULT_HIGH_WATERMARK 0.95
#define DEFAULT_LOW_WATERMARK 0.85
#define DEFAULT_HOST_DEVICE_BYTES ((uint64_t)1 << 30)
#define DEFAULT_TRACE_MAX ((uint64_t)256 << 20)
/* Below this a trace could not hold its own header and closing event. */
#define MIN_TRACE_MAX ((uint64_t)4096)

#define MSG_DEVICE_LIMIT "expected bytes (e.g. 4GiB) or a percentage (e.g. 80%)"
#define MSG_HOST_LIMIT "expected bytes (e.g. 16GiB) or a percentage of physical memory (e.g. 25%)"
#define MSG_DISK_LIMIT "expected bytes (e.g. 100GiB), or 0 for no limit"
#define MSG_HOST_DEVICE_BYTES "expected bytes (e.g. 1GiB)"
#define MSG_FRACTION "expected a fraction in (0, 1] (e.g. 0.9)"

static int fail(int status, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(int status, char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return status;
}

/* ---- lexical helpers: all work on a [b, b+n) span, never past it -------------------- */

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static void trim(const char *s, const char **b, size_t *n) {
  size_t len = strlen(s);
  while (len > 0 && is_space(*s)) s++, len--;
  while (len > 0 && is_space(s[len - 1])) len--;
  *b = s;
  *n = len;
}

static int span_eq(const char *b, size_t n, const char *word) {
  return strlen(word) == n && strncasecmp(b, word, n) == 0;
}

/* A decimal number "D*[.D*]" with at least one digit, at the start of the span. The
 * integer part must fit in uint64_t. Returns the characters consumed, 0 if none. */
typedef struct decimal {
  uint64_t ipart;
  const char *frac; /* fraction digits (may be zero of them) */
  size_t frac_len;
} decimal_t;

static size_t lex_decimal(const char *b, size_t n, decimal_t *d) {
  size_t i = 0, digits = 0;
  d->ipart = 0;
  d->frac = NULL;
  d->frac_len = 0;
  for (; i < n && is_digit(b[i]); i++, digits++) {
    unsigned v = (unsigned)(b[i] - '0');
    if (d->ipart > (UINT64_MAX - v) / 10) return 0; /* overflow */
    d->ipart = d->ipart * 10 + v;
  }
  if (i < n && b[i] == '.') {
    i++;
    d->frac = b + i;
    for (; i < n && is_digit(b[i]); i++, digits++) d->frac_len++;
  }
  return digits > 0 ? i : 0;
}

/* Exact up to 15 fraction digits (numerator and power of ten are exact doubles, one
 * rounding in the division); further digits are below double precision and ignored. */
static double decimal_value(const decimal_t *d) {
  uint64_t num = 0;
  double p10 = 1.0;
  for (size_t i = 0; i < d->frac_len && i < 15; i++, p10 *= 10)
    num = num * 10 + (uint64_t)(d->frac[i] - '0');
  return (double)d->ipart + (double)num / p10;
}

static int frac_is_zero(const decimal_t *d) {
  for (size_t i = 0; i < d->frac_len; i++)
    if (d->frac[i] != '0') return 0;
  return 1;
}

static int parse_size_span(const char *b, size_t n, uint64_t *out) {
  decimal_t d;
  size_t used = lex_decimal(b, n, &d);
  if (used == 0) return SPW_ERR_CONFIG;
  b += used;
  n -= used;
  while (n > 0 && is_space(*b)) b++, n--;

  static const struct {
    const char *name;
    unsigned shift;
  } units[] = {
      {"", 0},    {"b", 0},    {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20},
      {"mb", 20}, {"mib", 20}, {"g", 30},  {"gb", 30}, {"gib", 30}, {"t", 40},
      {"tb", 40}, {"tib", 40},
  };
  int unit = -1;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (span_eq(b, n, units[i].name)) unit = (int)i;
  if (unit < 0) return SPW_ERR_CONFIG;
  unsigned shift = units[unit].shift;
  /* Whole bytes only: "1.5" or "1.5B" is a typo, not a size. */
  if (shift == 0 && !frac_is_zero(&d)) return SPW_ERR_CONFIG;

  uint64_t mult = (uint64_t)1 << shift;
  if (d.ipart > UINT64_MAX / mult) return SPW_ERR_CONFIG;
  uint64_t whole = d.ipart * mult;
  /* floor(mult * 0.d1d2..dk), exactly: fold the digits in from the last one, x = (x +
   * d*mult) / 10, because floor((floor(y) + a) / 10) == floor((y + a) / 10) for integer a.
   * x stays below mult, so d*mult + x never overflows (mult <= 2^40). */
  uint64_t part = 0;
  for (size_t i = d.frac_len; i-- > 0;)
    part = (part + (uint64_t)(d.frac[i] - '0') * mult) / 10;
  /* No overflow: whole is a multiple of mult no larger than 2^64 - mult, part < mult. */
  *out = whole + part;
  return SPW_OK;
}

int spw__parse_size(const char *s, uint64_t *out) {
  if (!s || !out) return SPW_ERR_INVALID_ARG;
  const char *b;
  size_t n;
  trim(s, &b, &n);
  return parse_size_span(b, n, out);
}

/* "N%" with 0 < N <= 100, as a fraction of one. Returns 1 if the span is a percentage at
 * all (ends in '%'), with *ok telling whether it was a valid one. */
static int parse_percent_span(const char *b, size_t n, double *fraction, int *ok) {
  *ok = 0;
  if (n == 0 || b[n - 1] != '%') return 0;
  n--;
  while (n > 0 && is_space(b[n - 1])) n--;
  decimal_t d;
  size_t used = lex_decimal(b, n, &d);
  if (used == 0 || used != n) return 1;
  double v = decimal_value(&d);
  if (!(v > 0.0 && v <= 100.0)) return 1;
  *fraction = v / 100.0;
  *ok = 1;
  return 1;
}

static int parse_fraction_span(const char *b, size_t n, double *out) {
  decimal_t d;
  size_t used = lex_decimal(b, n, &d);
  if (used == 0 || used != n) return SPW_ERR_CONFIG;
  double v = decimal_value(&d);
  if (!(v > 0.0 && v <= 1.0)) return SPW_ERR_CONFIG;
  *out = v;
  return SPW_OK;
}

static int keyword(const char *b, size_t n, const char *const *words, int count) {
  for (int i = 0; i < count; i++)
    if (span_eq(b, n, words[i])) return i;
  return -1;
}

/* ---- sources ------------------------------------------------------------------------- */

/* The variable's value, or NULL when env is ignored, unset, or blank. */
static const char *env_get(unsigned flags, const char *name) {
  if (flags & SPW_CONFIG_IGNORE_ENV) return NULL;
  const char *v = getenv(name);
  if (!v) return NULL;
  const char *b;
  size_t n;
  trim(v, &b, &n);
  return n > 0 ? v : NULL;
}

static int physical_memory(uint64_t *out, char *err, size_t errlen) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0 || (uint64_t)pages > UINT64_MAX / (uint64_t)page)
    return fail(SPW_ERR_SYSTEM, err, errlen,
                "cannot read the physical memory size (sysconf) for the host limit");
  *out = (uint64_t)pages * (uint64_t)page;
  return SPW_OK;
}

static int resolve_device(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  s->device = 0;
  if (c->device < 0)
    return fail(SPW_ERR_CONFIG, err, errlen,
                "config.device=%d: expected a device ordinal >= 0", c->device);
  if (c->device > 0) {
    s->device = c->device;
    return SPW_OK;
  }
  const char *v = env_get(c->flags, "SPILLWAY_DEVICE");
  if (!v) return SPW_OK;
  const char *b;
  size_t n;
  trim(v, &b, &n);
  decimal_t d;
  if (lex_decimal(b, n, &d) != n || d.frac || d.ipart > INT_MAX)
    return fail(SPW_ERR_CONFIG, err, errlen,
                "SPILLWAY_DEVICE='%s': expected a device ordinal >= 0 (e.g. 0)", v);
  s->device = (int)d.ipart;
  return SPW_OK;
}

/* A setting chosen among a few named values: the struct field (its `unset` value means
 * "not given"), else the environment variable, else the default. */
typedef struct keyword_setting {
  const char *field, *var;
  const char *const *words; /* the variable's spellings, values[i] each */
  const int *values;
  int count;
  int unset, def;
  int field_min, field_max; /* a field's valid values, `unset` aside */
  const char *field_expected, *var_expected;
} keyword_setting_t;

static int resolve_keyword(const keyword_setting_t *k, unsigned flags, int field, int *out,
                           char *err, size_t errlen) {
  if (field != k->unset) {
    if (field < k->field_min || field > k->field_max)
      return fail(SPW_ERR_CONFIG, err, errlen, "%s=%d: expected %s", k->field, field,
                  k->field_expected);
    *out = field;
    return SPW_OK;
  }
  *out = k->def;
  const char *v = env_get(flags, k->var);
  if (!v) return SPW_OK;
  const char *b;
  size_t n;
  trim(v, &b, &n);
  int i = keyword(b, n, k->words, k->count);
  if (i < 0) return fail(SPW_ERR_CONFIG, err, errlen, "%s='%s': expected %s", k->var, v, k->var_expected);
  *out = k->values[i];
  return SPW_OK;
}

static int resolve_backend(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  static const char *const words[] = {"auto", "cuda", "host"};
  static const int values[] = {SPW_BACKEND_AUTO, SPW_BACKEND_CUDA, SPW_BACKEND_HOST};
  static const keyword_setting_t k = {
      "config.backend", "SPILLWAY_BACKEND", words, values, 3, SPW_BACKEND_AUTO, SPW_BACKEND_AUTO,
      SPW_BACKEND_CUDA, SPW_BACKEND_HOST,
      "SPW_BACKEND_AUTO, SPW_BACKEND_CUDA or SPW_BACKEND_HOST", "auto, cuda or host"};
  int v;
  int st = resolve_keyword(&k, c->flags, (int)c->backend, &v, err, errlen);
  s->backend = (spw_backend_kind_t)v;
  return st;
}

static int resolve_io(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  static const char *const words[] = {"auto", "uring", "posix"};
  static const int values[] = {SPW_IO_AUTO, SPW_IO_URING, SPW_IO_POSIX};
  static const keyword_setting_t k = {
      "config.io", "SPILLWAY_IO", words, values, 3, SPW_IO_AUTO, SPW_IO_AUTO, SPW_IO_URING,
      SPW_IO_POSIX, "SPW_IO_AUTO, SPW_IO_URING or SPW_IO_POSIX", "auto, uring or posix"};
  int v;
  int st = resolve_keyword(&k, c->flags, (int)c->io, &v, err, errlen);
  s->io = (spw_io_kind_t)v;
  return st;
}

static int resolve_log_level(const spw_config_t *c, spw_settings_t *s, char *err,
                             size_t errlen) {
  static const char *const words[] = {"off", "error", "warn", "info", "debug"};
  static const int values[] = {SPW_LOG_OFF, SPW_LOG_ERROR, SPW_LOG_WARN, SPW_LOG_INFO,
                               SPW_LOG_DEBUG};
  static const keyword_setting_t k = {
      "config.log_level", "SPILLWAY_LOG_LEVEL", words, values, 5, SPW_LOG_DEFAULT, SPW_LOG_WARN,
      SPW_LOG_OFF, SPW_LOG_DEBUG, "one of SPW_LOG_DEFAULT .. SPW_LOG_DEBUG",
      "off, error, warn, info or debug"};
  int v;
  int st = resolve_keyword(&k, c->flags, (int)c->log_level, &v, err, errlen);
  s->log_level = (spw_log_level_t)v;
  return st;
}

/* A size or a percentage from the environment. */
typedef struct limit_value {
  uint64_t bytes;  /* when !is_fraction */
  double fraction; /* when is_fraction */
  int is_fraction;
} limit_value_t;

static int env_limit(const char *name, const char *v, int allow_percent, int allow_zero,
                     const char *expected, limit_value_t *out, char *err, size_t errlen) {
  const char *b;
  size_t n;
  trim(v, &b, &n);
  int ok;
  double f;
  if (parse_percent_span(b, n, &f, &ok)) {
    if (!allow_percent) return fail(SPW_ERR_CONFIG, err, errlen, "%s='%s': %s", name, v, expected);
    if (!ok)
      return fail(SPW_ERR_CONFIG, err, errlen,
                  "%s='%s': a percentage must be more than 0%% and at most 100%%", name, v);
    out->fraction = f;
    out->is_fraction = 1;
    return SPW_OK;
  }
  uint64_t bytes;
  if (parse_size_span(b, n, &bytes) != SPW_OK)
    return fail(SPW_ERR_CONFIG, err, errlen, "%s='%s': %s", name, v, expected);
  if (bytes == 0 && !allow_zero)
    return fail(SPW_ERR_CONFIG, err, errlen, "%s='%s': must be more than 0 bytes", name, v);
  out->bytes = bytes;
  out->is_fraction = 0;
  return SPW_OK;
}

static int resolve_limits(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  limit_value_t lv;
  const char *v;
  int st;

  /* Device: kept as a fraction when given as one; the runtime applies it to the free
   * memory it finds at creation. */
  s->device_limit = 0;
  s->device_limit_fraction = DEFAULT_DEVICE_FRACTION;
  if (c->device_limit > 0) {
    s->device_limit = c->device_limit;
  } else if ((v = env_get(c->flags, "SPILLWAY_DEVICE_LIMIT"))) {
    st = env_limit("SPILLWAY_DEVICE_LIMIT", v, 1, 0, MSG_DEVICE_LIMIT, &lv, err, errlen);
    if (st) return st;
    if (lv.is_fraction)
      s->device_limit_fraction = lv.fraction;
    else
      s->device_limit = lv.bytes;
  }

  /* Host: always bytes; a fraction is of physical memory, known now. */
  double host_fraction = DEFAULT_HOST_FRACTION;
  s->host_limit = 0;
  if (c->host_limit > 0) {
    s->host_limit = c->host_limit;
  } else if ((v = env_get(c->flags, "SPILLWAY_HOST_LIMIT"))) {
    st = env_limit("SPILLWAY_HOST_LIMIT", v, 1, 0, MSG_HOST_LIMIT, &lv, err, errlen);
    if (st) return st;
    if (lv.is_fraction)
      host_fraction = lv.fraction;
    else
      s->host_limit = lv.bytes;
  }
  if (s->host_limit == 0) {
    uint64_t phys = 0;
    if ((st = physical_memory(&phys, err, errlen))) return st;
    s->host_limit = (uint64_t)((double)phys * host_fraction);
    if (s->host_limit == 0) s->host_limit = 1; /* a tiny machine and a tiny percentage */
  }

  s->disk_limit = 0;
  if (c->disk_limit > 0) {
    s->disk_limit = c->disk_limit;
  } else if ((v = env_get(c->flags, "SPILLWAY_DISK_LIMIT"))) {
    st = env_limit("SPILLWAY_DISK_LIMIT", v, 0, 1, MSG_DISK_LIMIT, &lv, err, errlen);
    if (st) return st;
    s->disk_limit = lv.bytes;
  }

  s->host_device_bytes = DEFAULT_HOST_DEVICE_BYTES;
  if (c->host_device_bytes > 0) {
    s->host_device_bytes = c->host_device_bytes;
  } else if ((v = env_get(c->flags, "SPILLWAY_HOST_DEVICE_BYTES"))) {
    st = env_limit("SPILLWAY_HOST_DEVICE_BYTES", v, 0, 0, MSG_HOST_DEVICE_BYTES, &lv, err,
                   errlen);
    if (st) return st;
    s->host_device_bytes = lv.bytes;
  }
  return SPW_OK;
}

static int resolve_spill_dir(const spw_config_t *c, spw_settings_t *s, char *err,
                             size_t errlen) {
  const char *dir, *from;
  if (c->spill_dir) {
    dir = c->spill_dir;
    from = "config.spill_dir";
    if (dir[0] == '\0')
      return fail(SPW_ERR_CONFIG, err, errlen, "config.spill_dir='': expected a directory");
  } else if ((dir = env_get(c->flags, "SPILLWAY_SPILL_DIR"))) {
    from = "SPILLWAY_SPILL_DIR";
  } else {
    /* TMPDIR defines the default itself, so SPW_CONFIG_IGNORE_ENV (which is about the
     * SPILLWAY_* variables) does not hide it. */
    dir = getenv("TMPDIR");
    from = "TMPDIR";
    if (!dir || dir[0] == '\0') dir = "/tmp";
  }
  /* Paths are taken verbatim: spaces are legal in directory names. */
  size_t len = strlen(dir);
  if (len >= sizeof s->spill_dir)
    return fail(SPW_ERR_CONFIG, err, errlen, "%s='%.64s...': path longer than %zu bytes",
                from, dir, sizeof s->spill_dir - 1);
  memcpy(s->spill_dir, dir, len + 1);
  return SPW_OK;
}

/* The trace file: the path verbatim but for "%p" (the process id, so that the worker
 * processes of one job can share a setting) and "%%"; its size cap. */
static int resolve_trace(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  const char *path = c->trace_path, *from = "config.trace_path";
  if (!path) {
    path = env_get(c->flags, "SPILLWAY_TRACE");
    from = "SPILLWAY_TRACE";
  }
  size_t o = 0;
  for (const char *p = path; p && *p; p++) {
    char pid[24];
    const char *piece = p;
    size_t len = 1;
    if (p[0] == '%' && p[1] == 'p') {
      snprintf(pid, sizeof pid, "%ld", (long)getpid());
      piece = pid;
      len = strlen(pid);
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      p++;
    }
    if (o + len >= sizeof s->trace_path)
      return fail(SPW_ERR_CONFIG, err, errlen, "%s='%.64s...': path longer than %zu bytes", from,
                  path, sizeof s->trace_path - 1);
    memcpy(s->trace_path + o, piece, len);
    o += len;
  }
  s->trace_path[o] = '\0';
  s->trace_max = DEFAULT_TRACE_MAX;
  const char *v;
  if (c->trace_max_bytes) {
    s->trace_max = c->trace_max_bytes;
    from = "config.trace_max_bytes";
  } else if ((v = env_get(c->flags, "SPILLWAY_TRACE_MAX"))) {
    from = "SPILLWAY_TRACE_MAX";
    const char *b;
    size_t n;
    trim(v, &b, &n);
    if (parse_size_span(b, n, &s->trace_max) != SPW_OK)
      return fail(SPW_ERR_CONFIG, err, errlen, "SPILLWAY_TRACE_MAX='%s': expected bytes (e.g. 64MiB)",
                  v);
  }
  if (s->trace_max < MIN_TRACE_MAX)
    return fail(SPW_ERR_CONFIG, err, errlen, "%s=%llu: a trace needs at least %llu bytes", from,
                (unsigned long long)s->trace_max, (unsigned long long)MIN_TRACE_MAX);
  return SPW_OK;
}

/* One watermark; `origin` receives where the value came from, for the ordering message. */
static int resolve_watermark(unsigned flags, double field, const char *field_name,
                             const char *var, double def, double *out, const char **origin,
                             char *err, size_t errlen) {
  /* -0.0 == 0.0 counts as unset too; NaN is not 0 and fails the range test. */
  if (field != 0.0) {
    if (!(field > 0.0 && field <= 1.0))
      return fail(SPW_ERR_CONFIG, err, errlen, "%s=%g: expected a fraction in (0, 1]",
                  field_name, field);
    *out = field;
    *origin = field_name;
    return SPW_OK;
  }
  const char *v = env_get(flags, var);
  if (!v) {
    *out = def;
    *origin = "default";
    return SPW_OK;
  }
  const char *b;
  size_t n;
  trim(v, &b, &n);
  if (parse_fraction_span(b, n, out) != SPW_OK)
    return fail(SPW_ERR_CONFIG, err, errlen, "%s='%s': " MSG_FRACTION, var, v);
  *origin = var;
  return SPW_OK;
}

static int resolve_watermarks(const spw_config_t *c, spw_settings_t *s, char *err,
                              size_t errlen) {
  const char *high_from, *low_from;
  int st = resolve_watermark(c->flags, c->high_watermark, "config.high_watermark",
                             "SPILLWAY_HIGH_WATERMARK", DEFAULT_HIGH_WATERMARK,
                             &s->high_watermark, &high_from, err, errlen);
  if (st) return st;
  st = resolve_watermark(c->flags, c->low_watermark, "config.low_watermark",
                         "SPILLWAY_LOW_WATERMARK", DEFAULT_LOW_WATERMARK, &s->low_watermark,
                         &low_from, err, errlen);
  if (st) return st;
  if (!(s->low_watermark < s->high_watermark))
    return fail(SPW_ERR_CONFIG, err, errlen,
                "low watermark %g (%s) must be below high watermark %g (%s)",
                s->low_watermark, low_from, s->high_watermark, high_from);
  return SPW_OK;
}

static int resolve_stable(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  static const char *const words[] = {"0", "1", "off", "on"};
  static const int values[] = {SPW_STABLE_OFF, SPW_STABLE_ON, SPW_STABLE_OFF, SPW_STABLE_ON};
  static const keyword_setting_t k = {
      "config.stable_addresses", "SPILLWAY_STABLE_ADDRESSES", words, values, 4,
      SPW_STABLE_DEFAULT, SPW_STABLE_OFF, SPW_STABLE_OFF, SPW_STABLE_ON,
      "SPW_STABLE_DEFAULT, SPW_STABLE_OFF or SPW_STABLE_ON", "0, 1, off or on"};
  int v;
  int st = resolve_keyword(&k, c->flags, (int)c->stable_addresses, &v, err, errlen);
  s->stable_addresses = v == SPW_STABLE_ON;
  return st;
}

static int resolve_ipc(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  static const char *const words[] = {"0", "1", "off", "on"};
  static const int values[] = {SPW_IPC_OFF, SPW_IPC_ON, SPW_IPC_OFF, SPW_IPC_ON};
  static const keyword_setting_t k = {
      "config.ipc", "SPILLWAY_IPC", words, values, 4,
      SPW_IPC_DEFAULT, SPW_IPC_OFF, SPW_IPC_OFF, SPW_IPC_ON,
      "SPW_IPC_DEFAULT, SPW_IPC_OFF or SPW_IPC_ON", "0, 1, off or on"};
  int v;
  int st = resolve_keyword(&k, c->flags, (int)c->ipc, &v, err, errlen);
  s->ipc = v == SPW_IPC_ON;
  return st;
}

#define MAX_ENGINE_HELPERS 15

static int resolve_helpers(const spw_config_t *c, spw_settings_t *s, char *err, size_t errlen) {
  if (c->engine_helpers != 0) {
    if (c->engine_helpers < -1 || c->engine_helpers > MAX_ENGINE_HELPERS)
      return fail(SPW_ERR_CONFIG, err, errlen,
                  "config.engine_helpers=%d: expected -1 (none) or 1 to %d (0: unset)",
                  c->engine_helpers, MAX_ENGINE_HELPERS);
    s->engine_helpers = c->engine_helpers < 0 ? 0 : c->engine_helpers;
    return SPW_OK;
  }
  s->engine_helpers = -1;
  const char *v = env_get(c->flags, "SPILLWAY_ENGINE_HELPERS");
  if (!v) return SPW_OK;
  const char *b;
  size_t n;
  trim(v, &b, &n);
  if (n == 4 && strncasecmp(b, "auto", 4) == 0) return SPW_OK;
  int k = 0;
  size_t i = 0;
  for (; i < n && i < 3 && b[i] >= '0' && b[i] <= '9'; i++) k = k * 10 + (b[i] - '0');
  if (n == 0 || i != n || k > MAX_ENGINE_HELPERS)
    return fail(SPW_ERR_CONFIG, err, errlen,
                "SPILLWAY_ENGINE_HELPERS='%s': expected auto or a count from 0 to %d", v,
                MAX_ENGINE_HELPERS);
  s->engine_helpers = k;
  return SPW_OK;
}

int spw__config_resolve(const spw_config_t *cfg, spw_settings_t *out, char *err,
                        size_t errlen) {
  if (err && errlen > 0) err[0] = '\0';
  if (!out) return fail(SPW_ERR_INVALID_ARG, err, errlen, "no settings to write (NULL)");

  spw_config_t c = SPW_CONFIG_INIT;
  if (cfg) {
    const size_t need = offsetof(spw_config_t, flags) + sizeof(unsigned);
    if (cfg->struct_size < need)
      return fail(SPW_ERR_INVALID_ARG, err, errlen,
                  "config.struct_size=%zu: smaller than %zu (initialize with SPW_CONFIG_INIT)",
                  cfg->struct_size, need);
    /* A newer, larger struct: read the fields this version knows. */
    memcpy(&c, cfg, cfg->struct_size < sizeof c ? cfg->struct_size : sizeof c);
    /* A field that struct_size cuts through is not the caller's (no real struct ends inside
     * one): unset, rather than a value mixed from two sources, or a pointer half copied.
     * The fields up to flags are always whole (checked above). */
    const spw_config_t init = SPW_CONFIG_INIT;
#define SPW_WHOLE_FIELD(f)                                                                   \
  if (cfg->struct_size < offsetof(spw_config_t, f) + sizeof c.f) c.f = init.f
    SPW_WHOLE_FIELD(trace_path);
    SPW_WHOLE_FIELD(trace_max_bytes);
    SPW_WHOLE_FIELD(stable_addresses);
    SPW_WHOLE_FIELD(ipc);
    SPW_WHOLE_FIELD(engine_helpers);
#undef SPW_WHOLE_FIELD
    if (c.flags & ~SPW_CONFIG_IGNORE_ENV)
      return fail(SPW_ERR_INVALID_ARG, err, errlen, "config.flags=0x%x: unknown flag bits",
                  c.flags);
  }

  spw_settings_t s;
  memset(&s, 0, sizeof s);
  int st;
  if ((st = resolve_device(&c, &s, err, errlen))) return st;
  if ((st = resolve_backend(&c, &s, err, errlen))) return st;
  if ((st = resolve_limits(&c, &s, err, errlen))) return st;
  if ((st = resolve_spill_dir(&c, &s, err, errlen))) return st;
  if ((st = resolve_io(&c, &s, err, errlen))) return st;
  if ((st = resolve_watermarks(&c, &s, err, errlen))) return st;
  if ((st = resolve_log_level(&c, &s, err, errlen))) return st;
  if ((st = resolve_trace(&c, &s, err, errlen))) return st;
  if ((st = resolve_stable(&c, &s, err, errlen))) return st;
  if ((st = resolve_ipc(&c, &s, err, errlen))) return st;
  if ((st = resolve_helpers(&c, &s, err, errlen))) return st;
  *out = s;
  return SPW_OK;
}
