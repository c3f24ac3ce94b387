/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of the spill trace (config.trace_path / SPILLWAY_TRACE), public API only:
 * a known sequence of moves gives a file that is valid JSON in Chrome's trace-event format
 * with one event for each of them (spill, spill to disk, demotion, unspill, disk read, lock
 * wait, spill on demand) and the tier counters; a batch is one slice; the size cap holds;
 * "%p" names the process; a trace that cannot be written leaves the runtime working; a
 * buffer's owner (SPW_ALLOC_OWNER) is named in its events, and each owner has a counter of
 * its bytes on the device.
 *
 * The file holds one event per line, so each line is checked as a JSON value of its own and
 * the whole file as one array, by the small validator below. */
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define MIB ((size_t)1 << 20)
#define LINE_MAX_TEST 4096 /* longer than any event line the trace writes */

/* ---- a JSON validator (RFC 8259 syntax; enough to refuse what a viewer would) ---------- */
typedef struct jp {
  const char *p, *end;
} jp_t;

static void ws(jp_t *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r'))
    j->p++;
}
static int lit(jp_t *j, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return 0;
  j->p += n;
  return 1;
}
static int value(jp_t *j, int depth);
static int string(jp_t *j) {
  if (j->p >= j->end || *j->p != '"') return 0;
  for (j->p++; j->p < j->end; j->p++) {
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') {
      j->p++;
      return 1;
    }
    if (c < 0x20) return 0;
    if (c == '\\') {
      j->p++;
      if (j->p >= j->end || !strchr("\"\\/bfnrtu", *j->p)) return 0;
    }
  }
  return 0;
}
static int number(jp_t *j) {
  const char *s = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  if (j->p >= j->end || *j->p < '0' || *j->p > '9') return 0;
  if (*j->p == '0') j->p++;
  else while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  if (j->p < j->end && *j->p == '.') {
    j->p++;
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  }
  return j->p > s;
}
static int container(jp_t *j, int depth, char close, int object) {
  j->p++;
  ws(j);
  if (j->p < j->end && *j->p == close) {
    j->p++;
    return 1;
  }
  for (;;) {
    ws(j);
    if (object) {
      if (!string(j)) return 0;
      ws(j);
      if (j->p >= j->end || *j->p++ != ':') return 0;
    }
    if (!value(j, depth + 1)) return 0;
    ws(j);
    if (j->p < j->end && *j->p == ',') {
      j->p++;
      continue;
    }
    if (j->p < j->end && *j->p == close) {
      j->p++;
      return 1;
    }
    return 0;
  }
}
static int value(jp_t *j, int depth) {
  ws(j);
  if (depth > 64 || j->p >= j->end) return 0;
  switch (*j->p) {
  case '{': return container(j, depth, '}', 1);
  case '[': return container(j, depth, ']', 0);
  case '"': return string(j);
  case 't': return lit(j, "true");
  case 'f': return lit(j, "false");
  case 'n': return lit(j, "null");
  default: return number(j);
  }
}
static int json_valid(const char *s, size_t n) {
  jp_t j = {s, s + n};
  if (!value(&j, 0)) return 0;
  ws(&j);
  return j.p == j.end;
}

/* ---- the trace file -------------------------------------------------------------------- */
typedef struct trace {
  char *text;
  size_t len;
} trace_t;

static trace_t load(const char *path) {
  FILE *f = fopen(path, "rb");
  ASSERT_TRUE(f != NULL);
  trace_t t = {malloc(64 * MIB), 0};
  ASSERT_TRUE(t.text != NULL);
  t.len = fread(t.text, 1, 64 * MIB - 1, f);
  t.text[t.len] = '\0';
  fclose(f);
  return t;
}

/* Every event line (an object, with or without its trailing comma) is valid JSON, and so
 * is the whole file. Returns the number of events. */
static size_t check_valid(const trace_t *t) {
  ASSERT_TRUE(json_valid(t->text, t->len));
  size_t events = 0;
  for (const char *l = t->text; *l;) {
    const char *e = strchr(l, '\n');
    size_t n = e ? (size_t)(e - l) : strlen(l);
    if (n > 0 && l[0] == '{') {
      size_t m = l[n - 1] == ',' ? n - 1 : n;
      if (!json_valid(l, m)) fprintf(stderr, "bad event line: %.*s\n", (int)n, l);
      ASSERT_TRUE(json_valid(l, m));
      events++;
    }
    l = e ? e + 1 : l + n;
  }
  return events;
}

/* The lines whose "name" is `name` (and that contain `also`, if not NULL). */
static size_t count(const trace_t *t, const char *name, const char *also) {
  char key[128];
  snprintf(key, sizeof key, "{\"name\":\"%s\",", name);
  size_t c = 0;
  for (const char *l = t->text; (l = strstr(l, key)) != NULL; l++) {
    const char *e = strchr(l, '\n'), *a = also ? strstr(l, also) : NULL;
    if (!also || (a && e && a < e)) c++;
  }
  return c;
}

/* The largest "bytes" value of the counter `name`. */
static uint64_t counter_max(const trace_t *t, const char *name) {
  char key[128];
  snprintf(key, sizeof key, "{\"name\":\"%s\",\"ph\":\"C\"", name);
  uint64_t best = 0;
  for (const char *l = t->text; (l = strstr(l, key)) != NULL; l++) {
    const char *b = strstr(l, "\"bytes\":");
    ASSERT_TRUE(b != NULL);
    uint64_t v = strtoull(b + 8, NULL, 10);
    if (v > best) best = v;
  }
  return best;
}

/* The fixture: a directory of the test's own (dir), made before every test and removed
 * after it with what is in it, and the text of the trace the test loaded, freed then. */
static char dir[256];
static char *loaded_text;

static void make_dir(void) { test_tmpdir(dir, sizeof dir, "trace"); }

static void remove_dir(void) {
  free(loaded_text);
  loaded_text = NULL;
  test_tmpdir_remove(dir);
}

/* `name` in the test's directory (the buffer is the caller's). */
static char *in_dir(char out[300], const char *name) {
  snprintf(out, 300, "%s/%s", dir, name);
  return out;
}

/* The trace at `path`, which must be valid JSON of trace events. */
static trace_t load_valid(const char *path) {
  trace_t t = load(path);
  loaded_text = t.text;
  check_valid(&t);
  return t;
}

static spw_config_t traced_config(const char *path, uint64_t cap) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 8 * MIB;
  cfg.host_device_bytes = 64 * MIB;
  cfg.spill_dir = dir;
  cfg.io = SPW_IO_POSIX;
  /* No background spilling: the spills that make room are the allocations' own, which a
   * background spiller that got there first on a loaded machine would make none of. */
  cfg.high_watermark = 1.0;
  cfg.low_watermark = 0.9;
  cfg.trace_path = path;
  cfg.trace_max_bytes = cap;
  return cfg;
}

static spw_runtime_t *traced_runtime(const char *path, uint64_t cap) {
  spw_config_t cfg = traced_config(path, cap);
  return test_runtime(&cfg);
}

static void wait_for_counter(const char *path, const char *name, const char *also);

static void every_kind_of_move_is_an_event_in_valid_json(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[4];
  uint8_t *src = malloc(MIB);
  for (int i = 0; i < 4; i++) {
    ASSERT_OK(spw_alloc(rt, MIB, s, &b[i]));
    test_fill(src, MIB, (uint64_t)i);
    test_write(rt, b[i], s, src, MIB);
  }
  ASSERT_OK(spw_spill(rt, b[0], SPW_TIER_HOST)); /* spill */
  ASSERT_OK(spw_spill(rt, b[1], SPW_TIER_DISK)); /* spill to disk */
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_spill(rt, b[0], SPW_TIER_DISK)); /* demotion */
  ASSERT_OK(spw_spill(rt, b[2], SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b[0]), SPW_STATE_DISK);
  ASSERT_EQ(state_of(rt, b[1]), SPW_STATE_DISK);
  /* Counters are samples: b[2] stays on host until one shows it, or it could come back
   * between two of them and leave the host counter at 0. */
  char one_mib[64];
  snprintf(one_mib, sizeof one_mib, "\"bytes\":%zu}", MIB);
  wait_for_counter(path, "host", one_mib);
  test_expect_fill(rt, b[2], s, MIB, 2); /* unspill for an acquire: a lock wait */
  test_expect_fill(rt, b[1], s, MIB, 1); /* disk read for an acquire: a lock wait */
  spw_buf_t more[10];
  for (int i = 0; i < 10; i++) ASSERT_OK(spw_alloc(rt, MIB, s, &more[i])); /* on demand */
  ASSERT_OK(spw_stream_synchronize(rt, s));
  spw_stats_t st = stats_of(rt);
  ASSERT_GT(st.spills_on_demand, 0);
  ASSERT_OK(spw_runtime_destroy(rt));

  trace_t t = load(path);
  ASSERT_GT(check_valid(&t), 20);
  char mib[64];
  snprintf(mib, sizeof mib, "\"bytes\":%zu,", MIB);
  ASSERT_GE(count(&t, "spill", mib), 2);
  ASSERT_EQ(count(&t, "spill to disk", mib), 1);
  ASSERT_EQ(count(&t, "demote", mib), 1);
  ASSERT_GE(count(&t, "unspill", mib), 1);
  ASSERT_EQ(count(&t, "disk read", mib), 1);
  ASSERT_GE(count(&t, "lock wait", mib), 2);
  ASSERT_GE(count(&t, "spill on demand", NULL), 1);
  /* The handle of each moved buffer is in its event's arguments. */
  char h[64];
  snprintf(h, sizeof h, "\"buf\":\"0x%llx\"", (unsigned long long)b[1]);
  ASSERT_EQ(count(&t, "spill to disk", h), 1);
  ASSERT_EQ(count(&t, "disk read", h), 1);
  /* Tracks and counters. */
  ASSERT_EQ(count(&t, "thread_name", "engine down lane"), 1);
  ASSERT_GE(counter_max(&t, "device"), 4 * MIB);
  ASSERT_GE(counter_max(&t, "host"), MIB);
  ASSERT_GE(counter_max(&t, "disk"), MIB);
  ASSERT_GE(count(&t, "locked", NULL), 1);
  ASSERT_EQ(count(&t, "trace end", "\"dropped_full_buffer\":0,\"dropped_size_cap\":0"), 1);
  free(t.text);
  free(src);
}

/* Waits for the engine, closes the runtime (which writes the trace's end) and reads it. */
static trace_t closed_trace(spw_runtime_t *rt, const char *path) {
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_runtime_destroy(rt));
  return load_valid(path);
}

static void a_batch_is_one_slice(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  spw_buf_t b[16];
  for (int i = 0; i < 16; i++) ASSERT_OK(spw_alloc(rt, 64 << 10, NULL, &b[i]));
  ASSERT_OK(spw_spill_n(rt, b, 16, SPW_TIER_HOST));
  trace_t t = closed_trace(rt, path);
  ASSERT_EQ(count(&t, "spill", NULL), 1);
  ASSERT_EQ(count(&t, "spill", "\"bytes\":1048576,\"buffers\":16,"), 1);
}

/* A request large enough for slices (here: 16 buffers, the slices forced down to 4 with 3
 * helpers a lane) is moved as one batch per slice, each its own event: a spill request, a
 * prefetch request and an acquire_n of spilled buffers alike. */
static void a_large_request_is_one_slice_per_helper_and_the_lane(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_config_t cfg = traced_config(path, 0);
  cfg.engine_helpers = 3;
  setenv("SPILLWAY_TEST_SLICE_MIN", "4", 1); /* read once, when the runtime is created */
  spw_runtime_t *rt = test_runtime(&cfg);
  unsetenv("SPILLWAY_TEST_SLICE_MIN");
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[16];
  void *d[16];
  for (int i = 0; i < 16; i++) ASSERT_OK(spw_alloc(rt, 64 << 10, s, &b[i]));
  ASSERT_OK(spw_spill_n(rt, b, 16, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_prefetch_n(rt, b, 16, s));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_acquire_n(rt, b, 16, s, 0, d)); /* writable: the next spill copies */
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_spill_n(rt, b, 16, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_acquire_n(rt, b, 16, s, 0, d));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  trace_t t = closed_trace(rt, path);
  ASSERT_EQ(count(&t, "spill", NULL), 8);
  ASSERT_EQ(count(&t, "spill", "\"bytes\":262144,\"buffers\":4,"), 8);
  ASSERT_EQ(count(&t, "unspill", NULL), 8); /* the prefetch's four, the acquire_n's four */
  ASSERT_EQ(count(&t, "unspill", "\"buffers\":4,"), 8);
}

static void the_size_cap_holds_and_drops_are_counted(void) {
  char path[300];
  in_dir(path, "t.json");
  const uint64_t cap = 4096;
  spw_runtime_t *rt = traced_runtime(path, cap);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, 4096, s, &b));
  for (int i = 0; i < 100; i++) {
    ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
    ASSERT_OK(spw_wait_idle(rt));
    void *d;
    ASSERT_OK(spw_acquire(rt, b, s, 0, &d)); /* writable: the next spill copies */
    ASSERT_OK(spw_stream_synchronize(rt, s));
  }
  ASSERT_OK(spw_runtime_destroy(rt));
  struct stat sb;
  ASSERT_EQ(stat(path, &sb), 0);
  ASSERT_LE((uint64_t)sb.st_size, cap);
  trace_t t = load_valid(path);
  ASSERT_EQ(count(&t, "trace end", "\"dropped_size_cap\":0,"), 0);
  ASSERT_EQ(count(&t, "trace end", "\"max_bytes\":4096"), 1);
}

static void percent_p_in_the_path_is_the_process_id(void) {
  char path[300], want[300];
  snprintf(path, sizeof path, "%s/t-%%p.json", dir);
  snprintf(want, sizeof want, "%s/t-%ld.json", dir, (long)getpid());
  spw_runtime_t *rt = traced_runtime(path, 0);
  ASSERT_OK(spw_runtime_destroy(rt));
  (void)load_valid(want); /* named after the process */
}

static void an_unwritable_trace_leaves_the_runtime_working(void) {
  char path[300];
  in_dir(path, "no/such/dir/t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, MIB, NULL, &b));
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  ASSERT_OK(spw_runtime_destroy(rt));
}

/* ---- owners ------------------------------------------------------------------------- */

/* The line of the first event named `name` whose text has `also` (copied into out, up to
 * its end), or 0 if none. */
static int line_of(const trace_t *t, const char *name, const char *also, char *out, size_t len) {
  char key[128];
  snprintf(key, sizeof key, "{\"name\":\"%s\",", name);
  for (const char *l = t->text; (l = strstr(l, key)) != NULL; l++) {
    const char *e = strchr(l, '\n');
    size_t n = e ? (size_t)(e - l) : strlen(l);
    const char *a = strstr(l, also);
    if (a && a < l + n) {
      snprintf(out, len, "%.*s", (int)n, l);
      return 1;
    }
  }
  return 0;
}

/* Waits (up to 10 s) until the trace at `path`, still being written, has a counter event
 * `name` whose text has `also`: the writer samples the counters every few milliseconds. */
static void wait_for_counter(const char *path, const char *name, const char *also) {
  char key[128];
  snprintf(key, sizeof key, "{\"name\":\"%s\",\"ph\":\"C\"", name);
  uint64_t deadline = test_now_ms() + 10000;
  for (;;) {
    trace_t t = load(path);
    int found = 0;
    for (const char *l = t.text; !found && (l = strstr(l, key)) != NULL; l++) {
      const char *e = strchr(l, '\n'), *a = strstr(l, also);
      found = a && e && a < e;
    }
    free(t.text);
    if (found) return;
    if (test_now_ms() > deadline) fprintf(stderr, "no counter %s with %s\n", name, also);
    ASSERT_TRUE(test_now_ms() <= deadline);
    test_sleep_ms(2);
  }
}

static spw_buf_t owned(spw_runtime_t *rt, size_t bytes, unsigned owner) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc_ex(rt, bytes, NULL, SPW_ALLOC_OWNER(owner), &b));
  return b;
}

static void a_move_and_a_lock_wait_name_their_buffers_owner(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  ASSERT_OK(spw_owner_name(rt, 4, "cupy"));
  spw_buf_t mine = owned(rt, MIB, 4), anyone;
  ASSERT_OK(spw_alloc(rt, MIB, NULL, &anyone));
  ASSERT_OK(spw_spill(rt, mine, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_spill(rt, anyone, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  void *d;
  ASSERT_OK(spw_acquire(rt, mine, s, 0, &d)); /* unspilled for the acquire: a lock wait */
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_OK(spw_runtime_destroy(rt));

  trace_t t = load_valid(path);
  char h[64], line[LINE_MAX_TEST];
  snprintf(h, sizeof h, "\"buf\":\"0x%llx\"", (unsigned long long)mine);
  ASSERT_TRUE(line_of(&t, "spill", h, line, sizeof line));
  ASSERT_TRUE(strstr(line, "\"owner\":\"cupy\"") != NULL);
  ASSERT_TRUE(line_of(&t, "unspill", h, line, sizeof line));
  ASSERT_TRUE(strstr(line, "\"owner\":\"cupy\"") != NULL);
  ASSERT_TRUE(line_of(&t, "lock wait", h, line, sizeof line));
  ASSERT_TRUE(strstr(line, "\"owner\":\"cupy\"") != NULL);
  /* A buffer without an owner has no owner argument. */
  snprintf(h, sizeof h, "\"buf\":\"0x%llx\"", (unsigned long long)anyone);
  ASSERT_TRUE(line_of(&t, "spill", h, line, sizeof line));
  ASSERT_TRUE(strstr(line, "owner") == NULL);
}

static void an_unnamed_owner_is_named_by_its_id(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  spw_buf_t b = owned(rt, MIB, 12);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_DISK));
  trace_t t = closed_trace(rt, path);
  ASSERT_EQ(count(&t, "spill to disk", "\"owner\":\"owner 12\""), 1);
}

static void a_batch_of_one_owner_names_it_and_of_several_counts_each(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  ASSERT_OK(spw_owner_name(rt, 1, "numba"));
  ASSERT_OK(spw_owner_name(rt, 3, "torch"));
  spw_buf_t one[4], mixed[8];
  for (int i = 0; i < 4; i++) one[i] = owned(rt, 64 << 10, 1);
  for (int i = 0; i < 8; i++) {
    if (i < 2) ASSERT_OK(spw_alloc(rt, 64 << 10, NULL, &mixed[i])); /* no owner */
    else mixed[i] = owned(rt, 64 << 10, i < 6 ? 1 : 3);
  }
  ASSERT_OK(spw_spill_n(rt, one, 4, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_spill_n(rt, mixed, 8, SPW_TIER_HOST));
  trace_t t = closed_trace(rt, path);
  char line[LINE_MAX_TEST];
  ASSERT_TRUE(line_of(&t, "spill", "\"buffers\":4,", line, sizeof line));
  ASSERT_TRUE(strstr(line, "\"owner\":\"numba\"") != NULL);
  ASSERT_TRUE(strstr(line, "\"owners\"") == NULL);
  ASSERT_TRUE(line_of(&t, "spill", "\"buffers\":8,", line, sizeof line));
  ASSERT_TRUE(strstr(line, "\"owners\":{") != NULL);
  ASSERT_TRUE(strstr(line, "\"numba\":{\"buffers\":4,\"bytes\":262144}") != NULL);
  ASSERT_TRUE(strstr(line, "\"torch\":{\"buffers\":2,\"bytes\":131072}") != NULL);
  ASSERT_TRUE(strstr(line, "\"owner\":") == NULL); /* several owners: no single one */
}

static void more_owners_in_a_batch_than_it_lists_are_counted_together(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  /* Twelve owners of the longest names: the slice must still fit its line. */
  spw_buf_t b[12];
  for (unsigned i = 0; i < 12; i++) {
    char name[SPW_OWNER_NAME_MAX + 1];
    memset(name, 'a' + (int)i, SPW_OWNER_NAME_MAX);
    name[SPW_OWNER_NAME_MAX] = '\0';
    ASSERT_OK(spw_owner_name(rt, 100 + i, name));
    b[i] = owned(rt, 4096, 100 + i);
  }
  ASSERT_OK(spw_spill_n(rt, b, 12, SPW_TIER_HOST));
  trace_t t = closed_trace(rt, path);
  char line[LINE_MAX_TEST];
  ASSERT_TRUE(line_of(&t, "spill", "\"buffers\":12,", line, sizeof line));
  ASSERT_TRUE(strstr(line, "\"(other owners)\":{\"buffers\":4,\"bytes\":16384}") != NULL);
}

static void each_owner_has_a_counter_of_its_bytes_on_the_device(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  ASSERT_OK(spw_owner_name(rt, 3, "torch"));
  spw_buf_t a = owned(rt, MIB, 3), b = owned(rt, MIB, 3), c = owned(rt, 2 * MIB, 12), none;
  ASSERT_OK(spw_alloc(rt, MIB, NULL, &none));
  char want[64];
  snprintf(want, sizeof want, "\"bytes\":%zu}", 2 * MIB);
  wait_for_counter(path, "device (torch)", want);
  wait_for_counter(path, "device (owner 12)", want);
  ASSERT_OK(spw_spill(rt, a, SPW_TIER_HOST)); /* off the device: the counter goes down */
  ASSERT_OK(spw_wait_idle(rt));
  snprintf(want, sizeof want, "\"bytes\":%zu}", MIB);
  wait_for_counter(path, "device (torch)", want);
  ASSERT_OK(spw_free(rt, b));
  wait_for_counter(path, "device (torch)", "\"bytes\":0}");
  ASSERT_OK(spw_free(rt, a));
  ASSERT_OK(spw_free(rt, c));
  ASSERT_OK(spw_free(rt, none));
  ASSERT_OK(spw_runtime_destroy(rt));
  trace_t t = load_valid(path);
  ASSERT_EQ(count(&t, "device (owner 0)", NULL), 0); /* buffers without an owner: none */
  ASSERT_LE(counter_max(&t, "device (torch)"), 2 * MIB);
}

static void a_name_set_after_allocating_shows_from_then_on(void) {
  char path[300];
  in_dir(path, "t.json");
  spw_runtime_t *rt = traced_runtime(path, 0);
  spw_buf_t b = owned(rt, MIB, 5);
  char want[64];
  snprintf(want, sizeof want, "\"bytes\":%zu}", MIB);
  wait_for_counter(path, "device (owner 5)", want);
  ASSERT_OK(spw_owner_name(rt, 5, "late"));
  wait_for_counter(path, "device (late)", want); /* written again under the new name */
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  trace_t t = closed_trace(rt, path);
  ASSERT_EQ(count(&t, "spill", "\"owner\":\"late\""), 1);
}

static void a_config_without_the_trace_fields_still_works(void) {
  /* A caller built against the header before the trace fields passes a smaller struct. */
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.struct_size = offsetof(spw_config_t, trace_path);
  cfg.trace_path = "/nonexistent/must-not-be-read";
  cfg.device_limit = 8 * MIB;
  cfg.host_device_bytes = 64 * MIB;
  spw_runtime_t *rt = test_runtime(&cfg);
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, MIB, NULL, &b));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void a_bad_size_cap_is_a_config_error_that_names_it(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  char msg[256];
  cfg.trace_max_bytes = 100;
  ASSERT_STATUS(spw_config_validate(&cfg, msg, sizeof msg), SPW_ERR_CONFIG);
  ASSERT_TRUE(strstr(msg, "config.trace_max_bytes") != NULL);
  cfg.trace_max_bytes = 0;
  ASSERT_EQ(setenv("SPILLWAY_TRACE_MAX", "lots", 1), 0);
  ASSERT_STATUS(spw_config_validate(&cfg, msg, sizeof msg), SPW_ERR_CONFIG);
  ASSERT_TRUE(strstr(msg, "SPILLWAY_TRACE_MAX='lots'") != NULL);
  ASSERT_EQ(setenv("SPILLWAY_TRACE_MAX", "1.5 MiB", 1), 0);
  ASSERT_OK(spw_config_validate(&cfg, msg, sizeof msg));
  ASSERT_EQ(unsetenv("SPILLWAY_TRACE_MAX"), 0);
}

static const spw_test_t tests[] = {
    TEST(every_kind_of_move_is_an_event_in_valid_json),
    TEST(a_batch_is_one_slice),
    TEST(a_large_request_is_one_slice_per_helper_and_the_lane),
    TEST(the_size_cap_holds_and_drops_are_counted),
    TEST(percent_p_in_the_path_is_the_process_id),
    TEST(an_unwritable_trace_leaves_the_runtime_working),
    TEST(a_move_and_a_lock_wait_name_their_buffers_owner),
    TEST(an_unnamed_owner_is_named_by_its_id),
    TEST(a_batch_of_one_owner_names_it_and_of_several_counts_each),
    TEST(more_owners_in_a_batch_than_it_lists_are_counted_together),
    TEST(each_owner_has_a_counter_of_its_bytes_on_the_device),
    TEST(a_name_set_after_allocating_shows_from_then_on),
    TEST(a_config_without_the_trace_fields_still_works),
    TEST(a_bad_size_cap_is_a_config_error_that_names_it),
};

TEST_MAIN_FIXTURE(tests, make_dir, remove_dir)
