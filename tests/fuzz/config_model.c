/* SPDX-License-Identifier: Apache-2.0 */
/* The reference model of configuration resolution (contract: config_model.h), from the
 * rules of docs/config.md:
 *  - per setting: a non-zero struct field, else its variable (unless SPW_CONFIG_IGNORE_ENV;
 *    blank counts as unset), else the default; TMPDIR supplies the default spill directory
 *    whatever the flags;
 *  - sizes: digits with an optional fraction, an optional binary unit, a fraction only with
 *    a unit of at least K, rounded down, at most 2^64 - 1;
 *  - percentages in (0, 100], fractions in (0, 1], low watermark below high.
 * "Spaces" are ' ', '\t', '\n' and '\r' (the docs do not say which; the model assumes
 * these four). Values are decided on their decimal digits, exactly.
 */
#include "config_model.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *const model_vars[MODEL_NVARS] = {
    [MV_DEVICE] = "SPILLWAY_DEVICE",
    [MV_BACKEND] = "SPILLWAY_BACKEND",
    [MV_DEVICE_LIMIT] = "SPILLWAY_DEVICE_LIMIT",
    [MV_HOST_LIMIT] = "SPILLWAY_HOST_LIMIT",
    [MV_DISK_LIMIT] = "SPILLWAY_DISK_LIMIT",
    [MV_SPILL_DIR] = "SPILLWAY_SPILL_DIR",
    [MV_IO] = "SPILLWAY_IO",
    [MV_HIGH_WATERMARK] = "SPILLWAY_HIGH_WATERMARK",
    [MV_LOW_WATERMARK] = "SPILLWAY_LOW_WATERMARK",
    [MV_LOG_LEVEL] = "SPILLWAY_LOG_LEVEL",
    [MV_HOST_DEVICE_BYTES] = "SPILLWAY_HOST_DEVICE_BYTES",
    [MV_STABLE_ADDRESSES] = "SPILLWAY_STABLE_ADDRESSES",
    [MV_TMPDIR] = "TMPDIR",
};

/* Digits after the point that may be all zero while the value still differs from a bound
 * by less than a double can tell at 100: below 1e-13 the library may round either way. */
#define NEAR_DIGITS 13

/* ---- text ------------------------------------------------------------------------------ */

typedef struct span {
  const char *b;
  size_t n;
} span_t;

static int space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int digit(char c) { return c >= '0' && c <= '9'; }
static char lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

static span_t trimmed(const char *s) {
  span_t t = {s, strlen(s)};
  while (t.n > 0 && space(t.b[0])) t.b++, t.n--;
  while (t.n > 0 && space(t.b[t.n - 1])) t.n--;
  return t;
}

static int same_word(span_t t, const char *word) {
  size_t n = strlen(word);
  if (n != t.n) return 0;
  for (size_t i = 0; i < n; i++)
    if (lower(t.b[i]) != word[i]) return 0;
  return 1;
}

/* A decimal number at the start of a span: integer digits without their leading zeros
 * (ilen 0 means the integer part is zero), then the fraction digits as written. */
typedef struct number {
  const char *i, *f;
  size_t ilen, flen;
} number_t;

/* Characters of `t` the number takes, 0 when there is no digit at all. */
static size_t number_at(span_t t, number_t *num) {
  size_t k = 0;
  while (k < t.n && digit(t.b[k])) k++;
  size_t int_digits = k;
  num->i = t.b;
  num->ilen = int_digits;
  while (num->ilen > 0 && num->i[0] == '0') num->i++, num->ilen--;
  num->f = t.b + k;
  num->flen = 0;
  if (k < t.n && t.b[k] == '.') {
    k++;
    num->f = t.b + k;
    while (k < t.n && digit(t.b[k])) k++, num->flen++;
  }
  return int_digits + num->flen > 0 ? k : 0;
}

static int all_zero(const char *d, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (d[k] != '0') return 0;
  return 1;
}

static int positive(const number_t *num) {
  return num->ilen > 0 || !all_zero(num->f, num->flen);
}

/* Is the number a whole `bound` (no leading zeros, one or more digits) plus a fraction? */
static int int_is(const number_t *num, const char *bound) {
  return num->ilen == strlen(bound) && memcmp(num->i, bound, num->ilen) == 0;
}

/* Is the fraction non-zero but smaller than 10^-NEAR_DIGITS? */
static int tiny_fraction(const number_t *num) {
  return num->flen > NEAR_DIGITS && all_zero(num->f, NEAR_DIGITS) &&
         !all_zero(num->f, num->flen);
}

/* The number as a double (for expected settings; the verdict never depends on it). Built
 * from the digits without their leading zeros, so no length of zero padding changes it; the
 * integer part only matters up to "100" and fraction digits past the buffer weigh < 1e-100. */
static double number_value(const number_t *num) {
  char buf[128];
  size_t n = 0;
  buf[n++] = '0';
  for (size_t k = 0; k < num->ilen && n < 24; k++) buf[n++] = num->i[k];
  buf[n++] = '.';
  for (size_t k = 0; k < num->flen && n < sizeof buf - 1; k++) buf[n++] = num->f[k];
  buf[n] = '\0';
  return strtod(buf, NULL);
}

/* A number in (0, bound], bound being "1" or "100", that must fill the whole span.
 * *approx tells whether *value may differ from the text: more fraction digits than a
 * double holds (up to 15 they convert to distinct doubles, in order). */
static model_verdict_t bounded(span_t t, const char *bound, double *value, int *approx) {
  number_t num;
  *approx = 0;
  if (t.n == 0 || number_at(t, &num) != t.n) return MODEL_BAD;
  *approx = num.flen > 15;
  int zero_frac = all_zero(num.f, num.flen);
  int above = num.ilen > strlen(bound) ||
              (num.ilen == strlen(bound) && memcmp(num.i, bound, num.ilen) > 0) ||
              (int_is(&num, bound) && !zero_frac);
  *value = number_value(&num);
  int near = (num.ilen == 0 && tiny_fraction(&num)) || (int_is(&num, bound) && tiny_fraction(&num));
  if (near) return MODEL_EITHER;
  return positive(&num) && !above ? MODEL_OK : MODEL_BAD;
}

/* ---- sizes ------------------------------------------------------------------------------- */

static const struct {
  const char *name;
  unsigned shift;
} units[] = {
    {"", 0},    {"b", 0},    {"k", 10},  {"kb", 10}, {"kib", 10}, {"m", 20},  {"mb", 20},
    {"mib", 20}, {"g", 30},  {"gb", 30}, {"gib", 30}, {"t", 40},  {"tb", 40}, {"tib", 40},
};

int model_size(const char *s, uint64_t *out) {
  span_t t = trimmed(s);
  number_t num;
  size_t used = number_at(t, &num);
  if (used == 0) return 0;
  span_t rest = {t.b + used, t.n - used};
  while (rest.n > 0 && space(rest.b[0])) rest.b++, rest.n--;
  int unit = -1;
  for (size_t k = 0; k < sizeof units / sizeof units[0]; k++)
    if (same_word(rest, units[k].name)) unit = (int)k;
  if (unit < 0) return 0;
  unsigned shift = units[unit].shift;
  if (shift == 0 && !all_zero(num.f, num.flen)) return 0;

  /* The number times 2^shift, on its digits: one carry-propagating doubling per bit. The
   * last flen digits stay the fraction; dropping them rounds down. */
  size_t len = num.ilen + num.flen, cap = len + 16;
  unsigned char *d = malloc(cap);
  if (!d) abort();
  size_t lead = cap - len; /* room for the carries that lengthen the integer part */
  for (size_t k = 0; k < num.ilen; k++) d[lead + k] = (unsigned char)(num.i[k] - '0');
  for (size_t k = 0; k < num.flen; k++) d[lead + num.ilen + k] = (unsigned char)(num.f[k] - '0');
  for (unsigned b = 0; b < shift; b++) {
    unsigned carry = 0;
    for (size_t k = cap; k-- > lead;) {
      unsigned v = d[k] * 2u + carry;
      d[k] = (unsigned char)(v % 10);
      carry = v / 10;
    }
    if (carry) d[--lead] = (unsigned char)carry;
  }
  size_t int_end = cap - num.flen;
  while (lead < int_end && d[lead] == 0) lead++;
  static const char max[] = "18446744073709551615";
  size_t ndig = int_end - lead;
  int ok = ndig < sizeof max - 1;
  if (ndig == sizeof max - 1) {
    ok = 1;
    for (size_t k = 0; k < ndig; k++)
      if (d[lead + k] != (unsigned char)(max[k] - '0')) {
        ok = d[lead + k] < (unsigned char)(max[k] - '0');
        break;
      }
  }
  uint64_t v = 0;
  for (size_t k = lead; ok && k < int_end; k++) v = v * 10 + d[k];
  free(d);
  if (ok) *out = v;
  return ok;
}

/* ---- settings ---------------------------------------------------------------------------- */

static void check(model_result_t *r, const char *name, const char *quoted, model_verdict_t v) {
  if (r->nchecks >= MODEL_MAX_CHECKS) abort();
  r->checks[r->nchecks++] = (model_check_t){name, quoted, v};
}

/* The variable's raw value, or NULL when it counts as unset. */
static const char *var(const model_input_t *in, unsigned flags, int which) {
  if (which != MV_TMPDIR && (flags & SPW_CONFIG_IGNORE_ENV)) return NULL;
  const char *v = in->env[which];
  if (!v || (which != MV_TMPDIR && trimmed(v).n == 0)) return NULL;
  return v;
}

static int keyword(const char *v, const char *const *words, int n) {
  span_t t = trimmed(v);
  for (int k = 0; k < n; k++)
    if (same_word(t, words[k])) return k;
  return -1;
}

/* A byte-limit variable: a size, or when `percent` allows it "N%". Returns the verdict. */
static model_verdict_t limit_var(model_result_t *r, const char *v, int which, int percent, int zero_ok,
                      uint64_t *bytes, double *fraction) {
  span_t t = trimmed(v);
  const char *name = model_vars[which];
  if (t.b[t.n - 1] == '%') {
    span_t num = {t.b, t.n - 1};
    while (num.n > 0 && space(num.b[num.n - 1])) num.n--;
    double pct = 0;
    int approx;
    model_verdict_t verdict = percent ? bounded(num, "100", &pct, &approx) : MODEL_BAD;
    check(r, name, v, verdict);
    *fraction = verdict == MODEL_BAD ? 0.0 : pct / 100.0;
    *bytes = 0;
    return verdict;
  }
  uint64_t b = 0;
  int ok = model_size(v, &b) && (zero_ok || b > 0);
  check(r, name, v, ok ? MODEL_OK : MODEL_BAD);
  *bytes = b;
  return ok ? MODEL_OK : MODEL_BAD;
}

static void watermark(model_result_t *r, const model_input_t *in, unsigned flags, double field,
                      const char *field_name, int which, double def, double *out,
                      const char **from, model_verdict_t *verdict, int *approx) {
  *verdict = MODEL_OK;
  *approx = 0;
  if (field != 0.0) { /* -0.0 is unset too; NaN is set, and out of range */
    *verdict = field > 0.0 && field <= 1.0 ? MODEL_OK : MODEL_BAD;
    check(r, field_name, NULL, *verdict);
    *out = field;
    *from = field_name;
    return;
  }
  const char *v = var(in, flags, which);
  if (!v) {
    *out = def;
    *from = "default";
    return;
  }
  *verdict = bounded(trimmed(v), "1", out, approx);
  check(r, model_vars[which], v, *verdict);
  *from = model_vars[which];
}

void model_resolve(const model_input_t *in, model_result_t *r) {
  memset(r, 0, sizeof *r);
  spw_config_t init = SPW_CONFIG_INIT;
  const spw_config_t *c = in->cfg ? in->cfg : &init;
  if (c->struct_size < offsetof(spw_config_t, flags) + sizeof c->flags) {
    r->invalid_arg = "config.struct_size";
    return;
  }
  if (c->flags & ~SPW_CONFIG_IGNORE_ENV) {
    r->invalid_arg = "config.flags";
    return;
  }
  const unsigned fl = c->flags;
  spw_settings_t *e = &r->expect;
  const char *v;

  /* device */
  if (c->device < 0) {
    check(r, "config.device", NULL, MODEL_BAD);
  } else if (c->device > 0) {
    e->device = c->device;
  } else if ((v = var(in, fl, MV_DEVICE))) {
    span_t t = trimmed(v);
    int ok = 1;
    for (size_t k = 0; k < t.n; k++) ok = ok && digit(t.b[k]);
    while (t.n > 1 && t.b[0] == '0') t.b++, t.n--;
    long long val = 0;
    ok = ok && t.n <= 10;
    for (size_t k = 0; ok && k < t.n; k++) val = val * 10 + (t.b[k] - '0');
    ok = ok && val <= INT_MAX;
    check(r, model_vars[MV_DEVICE], v, ok ? MODEL_OK : MODEL_BAD);
    e->device = (int)val;
  }

  /* backend */
  static const char *const backends[] = {"auto", "cuda", "host"};
  static const spw_backend_kind_t backend_kinds[] = {SPW_BACKEND_AUTO, SPW_BACKEND_CUDA,
                                                     SPW_BACKEND_HOST};
  e->backend = SPW_BACKEND_AUTO;
  if (c->backend == SPW_BACKEND_CUDA || c->backend == SPW_BACKEND_HOST) {
    e->backend = c->backend;
  } else if (c->backend != SPW_BACKEND_AUTO) {
    check(r, "config.backend", NULL, MODEL_BAD);
  } else if ((v = var(in, fl, MV_BACKEND))) {
    int k = keyword(v, backends, 3);
    check(r, model_vars[MV_BACKEND], v, k >= 0 ? MODEL_OK : MODEL_BAD);
    if (k >= 0) e->backend = backend_kinds[k];
  }

  /* limits */
  e->device_limit_fraction = 0.80;
  if (c->device_limit > 0) {
    e->device_limit = c->device_limit;
  } else if ((v = var(in, fl, MV_DEVICE_LIMIT))) {
    double f = 0;
    if (limit_var(r, v, MV_DEVICE_LIMIT, 1, 0, &e->device_limit, &f) != MODEL_BAD &&
        e->device_limit == 0)
      e->device_limit_fraction = f;
  }
  double host_fraction = 0.25;
  if (c->host_limit > 0) {
    e->host_limit = c->host_limit;
  } else if ((v = var(in, fl, MV_HOST_LIMIT))) {
    double f = 0;
    if (limit_var(r, v, MV_HOST_LIMIT, 1, 0, &e->host_limit, &f) != MODEL_BAD &&
        e->host_limit == 0)
      host_fraction = f;
  }
  if (e->host_limit == 0) {
    e->host_limit = (uint64_t)((double)in->physical_memory * host_fraction);
    if (e->host_limit == 0) e->host_limit = 1;
    r->host_from_fraction = 1;
  }
  if (c->disk_limit > 0) {
    e->disk_limit = c->disk_limit;
  } else if ((v = var(in, fl, MV_DISK_LIMIT))) {
    double unused;
    (void)limit_var(r, v, MV_DISK_LIMIT, 0, 1, &e->disk_limit, &unused);
  }
  e->host_device_bytes = (uint64_t)1 << 30;
  if (c->host_device_bytes > 0) {
    e->host_device_bytes = c->host_device_bytes;
  } else if ((v = var(in, fl, MV_HOST_DEVICE_BYTES))) {
    double unused;
    (void)limit_var(r, v, MV_HOST_DEVICE_BYTES, 0, 0, &e->host_device_bytes, &unused);
  }

  /* spill directory: verbatim, shorter than SPW_SPILL_DIR_MAX */
  const char *dir = "/tmp", *dir_from = NULL;
  if (c->spill_dir) {
    dir = c->spill_dir;
    dir_from = "config.spill_dir";
    if (!dir[0]) check(r, dir_from, dir, MODEL_BAD);
  } else if ((v = var(in, fl, MV_SPILL_DIR))) {
    dir = v;
    dir_from = model_vars[MV_SPILL_DIR];
  } else if ((v = var(in, fl, MV_TMPDIR)) && v[0]) {
    dir = v;
    dir_from = model_vars[MV_TMPDIR];
  }
  if (strlen(dir) >= SPW_SPILL_DIR_MAX) check(r, dir_from, dir, MODEL_BAD);
  else memcpy(e->spill_dir, dir, strlen(dir) + 1);

  /* io */
  static const char *const ios[] = {"auto", "uring", "posix"};
  static const spw_io_kind_t io_kinds[] = {SPW_IO_AUTO, SPW_IO_URING, SPW_IO_POSIX};
  e->io = SPW_IO_AUTO;
  if (c->io == SPW_IO_URING || c->io == SPW_IO_POSIX) {
    e->io = c->io;
  } else if (c->io != SPW_IO_AUTO) {
    check(r, "config.io", NULL, MODEL_BAD);
  } else if ((v = var(in, fl, MV_IO))) {
    int k = keyword(v, ios, 3);
    check(r, model_vars[MV_IO], v, k >= 0 ? MODEL_OK : MODEL_BAD);
    if (k >= 0) e->io = io_kinds[k];
  }

  /* watermarks, then their order */
  model_verdict_t hv, lv;
  int h_approx, l_approx;
  watermark(r, in, fl, c->high_watermark, "config.high_watermark", MV_HIGH_WATERMARK, 0.95,
            &e->high_watermark, &r->high_from, &hv, &h_approx);
  watermark(r, in, fl, c->low_watermark, "config.low_watermark", MV_LOW_WATERMARK, 0.85,
            &e->low_watermark, &r->low_from, &lv, &l_approx);
  if (hv != MODEL_BAD && lv != MODEL_BAD) {
    double lo = e->low_watermark, hi = e->high_watermark;
    model_verdict_t order = lo < hi ? MODEL_OK : MODEL_BAD;
    /* Text beyond double precision, or a watermark at a bound, may compare either way. */
    if (hv == MODEL_EITHER || lv == MODEL_EITHER ||
        ((h_approx || l_approx) && fabs(lo - hi) <= 1e-12))
      order = MODEL_EITHER;
    check(r, "low watermark", NULL, order);
  }

  /* log level */
  static const char *const levels[] = {"off", "error", "warn", "info", "debug"};
  e->log_level = SPW_LOG_WARN;
  if ((int)c->log_level >= (int)SPW_LOG_OFF && (int)c->log_level <= (int)SPW_LOG_DEBUG) {
    e->log_level = c->log_level;
  } else if (c->log_level != SPW_LOG_DEFAULT) {
    check(r, "config.log_level", NULL, MODEL_BAD);
  } else if ((v = var(in, fl, MV_LOG_LEVEL))) {
    int k = keyword(v, levels, 5);
    check(r, model_vars[MV_LOG_LEVEL], v, k >= 0 ? MODEL_OK : MODEL_BAD);
    if (k >= 0) e->log_level = (spw_log_level_t)(SPW_LOG_OFF + k);
  }

  /* address-stable buffers: a field past a caller's smaller struct_size counts as unset */
  static const char *const stable_words[] = {"0", "1", "off", "on"};
  const int stable_given =
      c->struct_size >= offsetof(spw_config_t, stable_addresses) + sizeof c->stable_addresses;
  const spw_stable_mode_t sm = stable_given ? c->stable_addresses : SPW_STABLE_DEFAULT;
  e->stable_addresses = 0;
  if (sm == SPW_STABLE_ON || sm == SPW_STABLE_OFF) {
    e->stable_addresses = sm == SPW_STABLE_ON;
  } else if (sm != SPW_STABLE_DEFAULT) {
    check(r, "config.stable_addresses", NULL, MODEL_BAD);
  } else if ((v = var(in, fl, MV_STABLE_ADDRESSES))) {
    int k = keyword(v, stable_words, 4);
    check(r, model_vars[MV_STABLE_ADDRESSES], v, k >= 0 ? MODEL_OK : MODEL_BAD);
    if (k >= 0) e->stable_addresses = k % 2; /* "1" and "on" */
  }
}

model_verdict_t model_overall(const model_result_t *r) {
  model_verdict_t worst = MODEL_OK;
  for (int k = 0; k < r->nchecks; k++) {
    if (r->checks[k].verdict == MODEL_BAD) return MODEL_BAD;
    if (r->checks[k].verdict == MODEL_EITHER) worst = MODEL_EITHER;
  }
  return worst;
}
