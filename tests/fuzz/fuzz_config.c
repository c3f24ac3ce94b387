/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for configuration: spw_config_validate (public), spw__config_resolve
 * and spw__parse_size (internal), and spw_runtime_create on the host backend, checked
 * against the reference model of config_model.c. Any property that does not hold prints
 * what and why, then aborts, so libFuzzer keeps the input as a crash.
 *
 * An input is text, one "KEY=VALUE" per line (the corpus files read as examples):
 *   SPILLWAY_<NAME>=v / TMPDIR=v   set that variable (every other one is unset);
 *   cfg.<field>=v                   set a spw_config_t field (integers in C syntax, doubles
 *                                   as strtod reads them: "nan", "-0", "0x1p-3");
 *   cfg=null                        pass NULL instead of the struct;
 *   msglen=N                        validate's msg buffer is exactly N bytes (0..1024);
 *   msg=null                        also call validate with msg NULL and that length;
 *   size=v                          also parse v with spw__parse_size;
 *   create=1                        also create and destroy a runtime (host backend).
 * A key ending in "*N" repeats its value N times (long paths from short inputs); "\n" in a
 * value is a newline. Unknown lines are ignored.
 *
 * Properties checked on every input:
 *  1. validate writes at most len bytes of msg (the buffer is allocated to exactly len, so
 *     ASan sees a byte more), always NUL-terminates it when len > 0, writes nothing when
 *     len is 0, and gives the same status and the same text (cut to fit) at every length;
 *  2. SPW_OK exactly when the message is "", and the status is the model's;
 *  3. a failure's message starts with the name of a variable or field the model refuses
 *     ("NAME='value'..." quoting the value as given, or "config.field=..."), or, for the
 *     watermark order, names where both watermarks came from;
 *  4. spw__config_resolve agrees with validate, and on success yields the model's
 *     settings, field by field;
 *  5. spw__parse_size accepts exactly the model's sizes with the same value, never writes
 *     its output on failure, and every accepted value reads back from its canonical forms
 *     ("N<unit>" for each unit dividing it, and "Q.F<unit>" with the exact binary fraction);
 *  6. create=1: spw_runtime_create fails with validate's status on a refused config, and
 *     on an accepted one (forced onto the host backend) succeeds with the limits resolved.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "config_model.h"
#include "spillway/spillway.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_VALUE 10000 /* bytes of one value after repetition */
#define MAX_SIZES 8
#define MAX_MSGLEN 1024
#define DEFAULT_MSGLEN 48 /* shorter than most messages: truncation is the common case */

typedef struct input {
  spw_config_t cfg;
  int cfg_null;
  char *spill_dir; /* cfg.spill_dir points here */
  char *env[MODEL_NVARS];
  char *sizes[MAX_SIZES];
  int nsizes;
  size_t msglen;
  int msg_null;
  int create;
} input_t;

static uint64_t phys_bytes;
static int devnull = -1;
static char *saved_tmpdir;
static const input_t *current; /* for the report of a violation */

/* ---- reporting ------------------------------------------------------------------------ */

static void print_input(const input_t *in) {
  fprintf(stderr, "input:\n");
  if (in->cfg_null) fprintf(stderr, "  cfg=null\n");
  for (int k = 0; k < MODEL_NVARS; k++)
    if (in->env[k]) fprintf(stderr, "  %s='%.200s'\n", model_vars[k], in->env[k]);
  const spw_config_t *c = &in->cfg;
  fprintf(stderr,
          "  cfg: struct_size=%zu device=%d backend=%d device_limit=%" PRIu64
          " host_limit=%" PRIu64 " disk_limit=%" PRIu64 " spill_dir=%s%.200s%s io=%d"
          " high=%.17g low=%.17g log_level=%d host_device_bytes=%" PRIu64 " flags=%#x"
          " stable_addresses=%d\n",
          c->struct_size, c->device, (int)c->backend, c->device_limit, c->host_limit,
          c->disk_limit, c->spill_dir ? "'" : "", c->spill_dir ? c->spill_dir : "NULL",
          c->spill_dir ? "'" : "", (int)c->io, c->high_watermark, c->low_watermark,
          (int)c->log_level, c->host_device_bytes, c->flags, (int)c->stable_addresses);
  for (int k = 0; k < in->nsizes; k++) fprintf(stderr, "  size='%.200s'\n", in->sizes[k]);
}

static void violated(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void violated(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz_config: property violated: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  if (current) print_input(current);
  abort();
}

/* ---- decoding ------------------------------------------------------------------------- */

/* The value of a line, unescaped and repeated `times` times, capped at MAX_VALUE. */
static char *value_of(const char *v, size_t n, unsigned long times) {
  char *one = malloc(n + 1);
  if (!one) abort();
  size_t m = 0;
  for (size_t k = 0; k < n; k++) {
    if (v[k] == '\\' && k + 1 < n && v[k + 1] == 'n') {
      one[m++] = '\n';
      k++;
    } else {
      one[m++] = v[k];
    }
  }
  if (times == 0 || m == 0) times = 1;
  else if (times > MAX_VALUE / m) times = MAX_VALUE / m;
  char *out = malloc(m * times + 1);
  if (!out) abort();
  for (unsigned long t = 0; t < times; t++) memcpy(out + t * m, one, m);
  out[m * times] = '\0';
  free(one);
  return out;
}

static void set_field(input_t *in, const char *field, const char *v) {
  spw_config_t *c = &in->cfg;
  if (!strcmp(field, "device")) c->device = (int)strtoll(v, NULL, 0);
  else if (!strcmp(field, "backend")) c->backend = (spw_backend_kind_t)strtoll(v, NULL, 0);
  else if (!strcmp(field, "device_limit")) c->device_limit = strtoull(v, NULL, 0);
  else if (!strcmp(field, "host_limit")) c->host_limit = strtoull(v, NULL, 0);
  else if (!strcmp(field, "disk_limit")) c->disk_limit = strtoull(v, NULL, 0);
  else if (!strcmp(field, "io")) c->io = (spw_io_kind_t)strtoll(v, NULL, 0);
  else if (!strcmp(field, "high_watermark")) c->high_watermark = strtod(v, NULL);
  else if (!strcmp(field, "low_watermark")) c->low_watermark = strtod(v, NULL);
  else if (!strcmp(field, "log_level")) c->log_level = (spw_log_level_t)strtoll(v, NULL, 0);
  else if (!strcmp(field, "host_device_bytes")) c->host_device_bytes = strtoull(v, NULL, 0);
  else if (!strcmp(field, "stable_addresses"))
    c->stable_addresses = (spw_stable_mode_t)strtoll(v, NULL, 0);
  else if (!strcmp(field, "flags")) c->flags = (unsigned)strtoull(v, NULL, 0);
  else if (!strcmp(field, "struct_size")) c->struct_size = (size_t)strtoull(v, NULL, 0);
}

static void decode(const uint8_t *data, size_t size, input_t *in) {
  memset(in, 0, sizeof *in);
  in->cfg = (spw_config_t)SPW_CONFIG_INIT;
  in->msglen = DEFAULT_MSGLEN;
  const char *p = (const char *)data, *end = p + size;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *line_end = nl ? nl : end;
    const char *eq = memchr(p, '=', (size_t)(line_end - p));
    if (eq) {
      char key[64];
      size_t klen = (size_t)(eq - p);
      if (klen < sizeof key) {
        memcpy(key, p, klen);
        key[klen] = '\0';
        unsigned long times = 1;
        char *star = strchr(key, '*');
        if (star) {
          times = strtoul(star + 1, NULL, 10);
          *star = '\0';
        }
        char *v = value_of(eq + 1, (size_t)(line_end - eq - 1), times);
        int kept = 0;
        for (int k = 0; k < MODEL_NVARS && !kept; k++)
          if (!strcmp(key, model_vars[k])) {
            free(in->env[k]);
            in->env[k] = v;
            kept = 1;
          }
        if (kept) {
        } else if (!strcmp(key, "cfg")) {
          in->cfg_null = !strcmp(v, "null");
        } else if (!strcmp(key, "cfg.spill_dir")) {
          free(in->spill_dir);
          in->spill_dir = v;
          in->cfg.spill_dir = v;
          kept = 1;
        } else if (!strncmp(key, "cfg.", 4)) {
          set_field(in, key + 4, v);
        } else if (!strcmp(key, "msglen")) {
          unsigned long n = strtoul(v, NULL, 10);
          in->msglen = n > MAX_MSGLEN ? MAX_MSGLEN : n;
        } else if (!strcmp(key, "msg")) {
          in->msg_null = !strcmp(v, "null");
        } else if (!strcmp(key, "create")) {
          in->create = !strcmp(v, "1");
        } else if (!strcmp(key, "size") && in->nsizes < MAX_SIZES) {
          in->sizes[in->nsizes++] = v;
          kept = 1;
        }
        if (!kept) free(v);
      }
    }
    p = line_end + 1;
  }
}

static void release(input_t *in) {
  for (int k = 0; k < MODEL_NVARS; k++) free(in->env[k]);
  for (int k = 0; k < in->nsizes; k++) free(in->sizes[k]);
  free(in->spill_dir);
}

/* The process environment as the input says: its variables set, every other one unset. */
static void apply_env(const input_t *in) {
  for (int k = 0; k < MODEL_NVARS; k++) {
    if (in->env[k]) setenv(model_vars[k], in->env[k], 1);
    else unsetenv(model_vars[k]);
  }
}

static void restore_env(void) {
  for (int k = 0; k < MODEL_NVARS; k++) unsetenv(model_vars[k]);
  if (saved_tmpdir) setenv("TMPDIR", saved_tmpdir, 1);
}

/* ---- sizes ------------------------------------------------------------------------------ */

static void expect_size(const char *text, uint64_t want) {
  uint64_t got = 0;
  int st = spw__parse_size(text, &got);
  if (st != SPW_OK || got != want)
    violated("spw__parse_size('%s') = %s, %" PRIu64 "; the canonical form of %" PRIu64,
             text, spw_err_name(st), got, want);
}

/* Every canonical spelling of x: "N<unit>" for each unit that divides it, and the exact
 * binary fraction "Q.F<unit>" for each unit above bytes. */
static void round_trip(uint64_t x) {
  static const char *const spell[5][3] = {
      {"", "B", " b"}, {"K", "KiB", " kb"}, {"M", "MiB", " mb"}, {"G", "GiB", " gb"},
      {"T", "TiB", " tb"}};
  char text[128];
  for (unsigned u = 0; u < 5; u++) {
    const unsigned shift = 10 * u;
    const uint64_t q = x >> shift, mask = ((uint64_t)1 << shift) - 1;
    const char *unit = spell[u][q % 3];
    if ((x & mask) == 0) {
      snprintf(text, sizeof text, "%" PRIu64 "%s", q, unit);
      expect_size(text, x);
    }
    if (shift > 0) {
      /* r / 2^shift has at most `shift` decimal digits; write them all. */
      uint64_t r = x & mask;
      int n = snprintf(text, sizeof text, "%" PRIu64 ".", q);
      for (unsigned d = 0; d < shift && r != 0; d++) {
        r *= 10;
        text[n++] = (char)('0' + (r >> shift));
        r &= mask;
      }
      snprintf(text + n, sizeof text - (size_t)n, "%s", unit);
      expect_size(text, x);
    }
  }
}

static void check_size(const char *text) {
  const uint64_t sentinel = 0xA5A5A5A5A5A5A5A5ull;
  uint64_t got = sentinel, want = 0;
  int st = spw__parse_size(text, &got);
  int ok = model_size(text, &want);
  if (ok != (st == SPW_OK))
    violated("spw__parse_size('%.200s') = %s, the model says %s", text, spw_err_name(st),
             ok ? "valid" : "invalid");
  if (ok && got != want)
    violated("spw__parse_size('%.200s') = %" PRIu64 ", the model says %" PRIu64, text, got,
             want);
  if (!ok && got != sentinel) violated("spw__parse_size('%.200s') failed but wrote *out", text);
  if (ok) round_trip(got);
}

/* ---- validate ------------------------------------------------------------------------- */

/* The check whose name the message starts with ("NAME=" or, for the order, "NAME "). */
static const model_check_t *blamed(const model_result_t *m, const char *msg) {
  for (int k = 0; k < m->nchecks; k++) {
    size_t n = strlen(m->checks[k].name);
    char sep = strcmp(m->checks[k].name, "low watermark") == 0 ? ' ' : '=';
    if (strncmp(msg, m->checks[k].name, n) == 0 && msg[n] == sep) return &m->checks[k];
  }
  return NULL;
}

static void check_message(const model_result_t *m, const char *msg, int st) {
  if (m->invalid_arg) {
    size_t n = strlen(m->invalid_arg);
    if (st != SPW_ERR_INVALID_ARG || strncmp(msg, m->invalid_arg, n) != 0 || msg[n] != '=')
      violated("expected SPW_ERR_INVALID_ARG naming %s, got %s: '%s'", m->invalid_arg,
               spw_err_name(st), msg);
    return;
  }
  const model_verdict_t overall = model_overall(m);
  if (st == SPW_OK) {
    if (overall == MODEL_BAD) {
      for (int k = 0; k < m->nchecks; k++)
        if (m->checks[k].verdict == MODEL_BAD)
          violated("validate accepted a config the model refuses: %s", m->checks[k].name);
    }
    return;
  }
  if (st != SPW_ERR_CONFIG) violated("validate returned %s: '%s'", spw_err_name(st), msg);
  if (overall == MODEL_OK) violated("validate refused a config the model accepts: '%s'", msg);
  const model_check_t *c = blamed(m, msg);
  if (!c) violated("the message names no setting the model checks: '%s'", msg);
  if (c->verdict == MODEL_OK)
    violated("the message blames %s, which the model accepts: '%s'", c->name, msg);
  if (c->quoted) {
    /* "NAME='value" with the value as given (paths: their first 64 bytes). */
    size_t n = strlen(c->name);
    size_t qlen = strlen(c->quoted);
    if (qlen > 64) qlen = 64;
    if (strncmp(msg + n, "='", 2) != 0 || strncmp(msg + n + 2, c->quoted, qlen) != 0)
      violated("the message does not quote %s's value as given: '%s'", c->name, msg);
  }
  if (!strcmp(c->name, "low watermark")) {
    char from[96];
    snprintf(from, sizeof from, "(%s)", m->low_from);
    if (!strstr(msg, from)) violated("the order message does not say low came from %s", from);
    snprintf(from, sizeof from, "(%s)", m->high_from);
    if (!strstr(msg, from)) violated("the order message does not say high came from %s", from);
  }
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1.0, fabs(b)); }

static int bytes_close(uint64_t a, uint64_t b) {
  uint64_t d = a > b ? a - b : b - a;
  return (double)d <= 1.0 + 1e-12 * (double)b;
}

static void check_settings(const model_result_t *m, const spw_settings_t *s) {
  const spw_settings_t *e = &m->expect;
#define FIELD(cond, name, fmt, got, want)                                                    \
  do {                                                                                       \
    if (!(cond)) violated("settings." name " = " fmt ", the model says " fmt, got, want);   \
  } while (0)
  FIELD(s->device == e->device, "device", "%d", s->device, e->device);
  FIELD(s->backend == e->backend, "backend", "%d", (int)s->backend, (int)e->backend);
  FIELD(s->device_limit == e->device_limit, "device_limit", "%" PRIu64, s->device_limit,
        e->device_limit);
  if (e->device_limit == 0)
    FIELD(close_to(s->device_limit_fraction, e->device_limit_fraction), "device_limit_fraction",
          "%.17g", s->device_limit_fraction, e->device_limit_fraction);
  if (m->host_from_fraction)
    FIELD(bytes_close(s->host_limit, e->host_limit), "host_limit", "%" PRIu64, s->host_limit,
          e->host_limit);
  else
    FIELD(s->host_limit == e->host_limit, "host_limit", "%" PRIu64, s->host_limit,
          e->host_limit);
  FIELD(s->disk_limit == e->disk_limit, "disk_limit", "%" PRIu64, s->disk_limit, e->disk_limit);
  FIELD(s->host_device_bytes == e->host_device_bytes, "host_device_bytes", "%" PRIu64,
        s->host_device_bytes, e->host_device_bytes);
  FIELD(strcmp(s->spill_dir, e->spill_dir) == 0, "spill_dir", "'%.100s'", s->spill_dir,
        e->spill_dir);
  FIELD(s->io == e->io, "io", "%d", (int)s->io, (int)e->io);
  FIELD(close_to(s->high_watermark, e->high_watermark), "high_watermark", "%.17g",
        s->high_watermark, e->high_watermark);
  FIELD(close_to(s->low_watermark, e->low_watermark), "low_watermark", "%.17g",
        s->low_watermark, e->low_watermark);
  FIELD(s->log_level == e->log_level, "log_level", "%d", (int)s->log_level, (int)e->log_level);
  FIELD(s->stable_addresses == e->stable_addresses, "stable_addresses", "%d", s->stable_addresses,
        e->stable_addresses);
#undef FIELD
}

/* Validate at the input's msg length, against the full text. */
static void check_lengths(const input_t *in, const spw_config_t *cfg, int st_full,
                          const char *full) {
  const size_t len = in->msglen;
  char *msg = malloc(len ? len : 1);
  if (!msg) abort();
  memset(msg, 0x5A, len ? len : 1);
  int st = spw_config_validate(cfg, msg, len);
  if (st != st_full) violated("validate with msg length %zu returned %s, not %s", len,
                              spw_err_name(st), spw_err_name(st_full));
  if (len == 0) {
    if ((unsigned char)msg[0] != 0x5A) violated("validate wrote to msg with length 0");
  } else {
    if (!memchr(msg, '\0', len)) violated("validate left msg (%zu bytes) unterminated", len);
    size_t want = strlen(full) < len - 1 ? strlen(full) : len - 1;
    if (strlen(msg) != want || strncmp(msg, full, want) != 0)
      violated("validate's text at length %zu is '%s', not the first %zu bytes of '%s'", len,
               msg, want, full);
  }
  free(msg);
  if (in->msg_null && spw_config_validate(cfg, NULL, len) != st_full)
    violated("validate with msg NULL gave another status");
}

/* ---- creation ------------------------------------------------------------------------- */

/* spw_runtime_create logs a refused config on stderr whatever the log level: keep the
 * fuzzer's output readable. */
static int create_quietly(const spw_config_t *cfg, spw_runtime_t **rt) {
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  if (saved >= 0 && devnull >= 0) dup2(devnull, STDERR_FILENO);
  int st = spw_runtime_create(cfg, rt);
  if (saved >= 0) {
    dup2(saved, STDERR_FILENO);
    close(saved);
  }
  return st;
}

static void check_create(const input_t *in, const model_result_t *m, int st_validate) {
  spw_runtime_t *rt = NULL;
  if (st_validate != SPW_OK) {
    int st = create_quietly(in->cfg_null ? NULL : &in->cfg, &rt);
    if (st != st_validate)
      violated("spw_runtime_create returned %s where validate said %s", spw_err_name(st),
               spw_err_name(st_validate));
    return;
  }
  /* The same config on the host backend, quiet; both fields are valid, so the rest of the
   * config still decides everything else. */
  spw_config_t cfg = in->cfg_null ? (spw_config_t)SPW_CONFIG_INIT : in->cfg;
  cfg.backend = SPW_BACKEND_HOST;
  cfg.log_level = SPW_LOG_OFF;
  char msg[512];
  int st = spw_config_validate(&cfg, msg, sizeof msg);
  if (st != SPW_OK) violated("setting backend=host and log_level=off made the config invalid: '%s'", msg);
  st = spw_runtime_create(&cfg, &rt);
  if (st != SPW_OK) violated("spw_runtime_create failed with %s on a valid config", spw_err_name(st));
  spw_backend_kind_t kind = SPW_BACKEND_AUTO;
  uint64_t dev = 0, host = 0, disk = 0;
  if (spw_runtime_backend(rt, &kind) != SPW_OK || kind != SPW_BACKEND_HOST)
    violated("the runtime is not on the host backend");
  if (spw_runtime_limits(rt, &dev, &host, &disk) != SPW_OK) violated("spw_runtime_limits failed");
  const spw_settings_t *e = &m->expect;
  uint64_t want_dev = e->device_limit
                          ? e->device_limit
                          : (uint64_t)((double)e->host_device_bytes * e->device_limit_fraction);
  if (e->device_limit ? dev != want_dev : !bytes_close(dev, want_dev))
    violated("device limit %" PRIu64 ", the model says %" PRIu64, dev, want_dev);
  if (m->host_from_fraction ? !bytes_close(host, e->host_limit) : host != e->host_limit)
    violated("host limit %" PRIu64 ", the model says %" PRIu64, host, e->host_limit);
  if (disk != e->disk_limit)
    violated("disk limit %" PRIu64 ", the model says %" PRIu64, disk, e->disk_limit);
  if (spw_runtime_destroy(rt) != SPW_OK) violated("spw_runtime_destroy failed");
}

/* ---- entry points ------------------------------------------------------------------------ */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  phys_bytes = (uint64_t)pages * (uint64_t)page;
  devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  const char *t = getenv("TMPDIR");
  if (t) saved_tmpdir = strdup(t);
  /* Null arguments are refused, never dereferenced. */
  uint64_t x = 0;
  if (spw__parse_size(NULL, &x) != SPW_ERR_INVALID_ARG || spw__parse_size("1", NULL) != SPW_ERR_INVALID_ARG)
    violated("spw__parse_size accepted a NULL argument");
  spw_settings_t s;
  if (spw__config_resolve(NULL, NULL, NULL, 0) != SPW_ERR_INVALID_ARG ||
      spw__config_resolve(NULL, &s, NULL, 0) == SPW_ERR_INVALID_ARG)
    violated("spw__config_resolve mishandles NULL arguments");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input_t in;
  decode(data, size, &in);
  current = &in;
  apply_env(&in);
  const spw_config_t *cfg = in.cfg_null ? NULL : &in.cfg;

  model_input_t mi = {.cfg = cfg, .physical_memory = phys_bytes};
  for (int k = 0; k < MODEL_NVARS; k++) mi.env[k] = in.env[k];
  model_result_t m;
  model_resolve(&mi, &m);

  char full[MAX_MSGLEN];
  memset(full, 0x5A, sizeof full);
  const int st = spw_config_validate(cfg, full, sizeof full);
  if (!memchr(full, '\0', sizeof full)) violated("validate left msg unterminated");
  if ((st == SPW_OK) != (full[0] == '\0'))
    violated("validate returned %s with message '%s'", spw_err_name(st), full);
  check_message(&m, full, st);
  check_lengths(&in, cfg, st, full);

  spw_settings_t s;
  char err[512];
  int st_resolve = spw__config_resolve(cfg, &s, err, sizeof err);
  if (st_resolve != st || strcmp(err, full) != 0)
    violated("spw__config_resolve says %s '%s', validate %s '%s'", spw_err_name(st_resolve),
             err, spw_err_name(st), full);
  if (st == SPW_OK) check_settings(&m, &s);

  for (int k = 0; k < in.nsizes; k++) check_size(in.sizes[k]);
  for (int k = 0; k < MODEL_NVARS; k++)
    if (in.env[k]) check_size(in.env[k]);

  if (in.create) check_create(&in, &m, st);

  restore_env();
  current = NULL;
  release(&in);
  return 0;
}
