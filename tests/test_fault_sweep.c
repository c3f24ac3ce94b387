/* SPDX-License-Identifier: Apache-2.0 */
/* Fault injection at every backend and I/O call site, swept: a scenario that reaches each
 * of them (spill to host and to disk, unspill, prefetch from host and from disk, batched
 * spill, demotion, read back, release behind a stream, allocation that spills on demand) is
 * run again and again, each time with one kind of operation made to fail at one point:
 * before step i, the next (skip + 1)-th operation of that kind fails. Every run then
 * checks what the issue asks of a failure:
 *  - every call returns a status, never one that would mean the caller's mistake;
 *  - every buffer's data is intact in its last good tier (read back and compared);
 *  - the runtime keeps working (a full spill and unspill cycle), and frees to nothing;
 *  - nothing leaks (the tier counters come back to zero; under ASan, LeakSanitizer).
 * Creation is swept the same way: every backend call of spw_runtime_create made to fail in
 * turn, each failure clean. Seam test: it arms the fault shim (backend_faults.h) and the
 * I/O layer's injection directly. */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"
#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define KIB ((size_t)1 << 10)
#define NBUF 3

static const size_t sizes[NBUF] = {300 * KIB + 3, 48 * KIB, 200 * KIB};

typedef struct world {
  spw_runtime_t *rt;
  spw_stream_t s;
  spw_buf_t b[NBUF];
  uint64_t version[NBUF];
  char dir[64];
} world_t;

/* What a failed call may say: never a status that blames the caller (the scenario passes
 * only valid arguments), never an internal error. */
static void check_status(int st, const char *what) {
  switch (st) {
  case SPW_ERR_INVALID_ARG:
  case SPW_ERR_INVALID_HANDLE:
  case SPW_ERR_FREED:
  case SPW_ERR_NOT_LOCKED:
  case SPW_ERR_INVALID_STREAM:
  case SPW_ERR_WRONG_DEVICE:
  case SPW_ERR_INTERNAL:
  case SPW_ERR_WOULD_DEADLOCK:
  case SPW_ERR_UNSUPPORTED:
    fprintf(stderr, "%s returned %s under an injected fault\n", what, spw_err_name(st));
    abort();
  default:
    break;
  }
}
#define TRY(call) check_status((call), #call)

static void write_buf(world_t *w, int i, uint64_t version) {
  uint8_t *src = malloc(sizes[i]);
  ASSERT_TRUE(src != NULL);
  test_fill(src, sizes[i], version);
  test_write(w->rt, w->b[i], w->s, src, sizes[i]);
  w->version[i] = version;
  free(src);
}

/* Reads buffer i back if it can be (an injected fault may refuse); the contents, when
 * read, must be right. Returns whether it was read. */
static int check_buf(world_t *w, int i, int must) {
  uint8_t *got = malloc(sizes[i]);
  ASSERT_TRUE(got != NULL);
  void *d = NULL;
  int st = spw_acquire(w->rt, w->b[i], w->s, SPW_ACQUIRE_READ, &d);
  if (must) ASSERT_OK(st);
  TRY(st);
  int read = 0;
  if (st == SPW_OK) {
    st = spw_memcpy_async(w->rt, got, d, sizes[i], w->s);
    if (must) ASSERT_OK(st);
    TRY(st);
    int sync = spw_stream_synchronize(w->rt, w->s);
    if (must) ASSERT_OK(sync);
    TRY(sync);
    if (st == SPW_OK && sync == SPW_OK) {
      ASSERT_UEQ(test_first_mismatch(got, sizes[i], w->version[i]), (size_t)-1);
      read = 1;
    }
    if (sync != SPW_OK) TRY(spw_stream_synchronize(w->rt, w->s)); /* a fault may be one-shot */
  }
  free(got);
  return read;
}

/* ---- the scenario: each step a move (or a few), its statuses checked, not asserted --- */

static void step_spill_host(world_t *w) {
  TRY(spw_spill(w->rt, w->b[0], SPW_TIER_HOST));
  TRY(spw_wait_idle(w->rt));
}
static void step_spill_disk(world_t *w) {
  TRY(spw_spill(w->rt, w->b[1], SPW_TIER_DISK));
  TRY(spw_wait_idle(w->rt));
}
static void step_unspill(world_t *w) { check_buf(w, 0, 0); }
static void step_prefetch_from_disk(world_t *w) {
  TRY(spw_prefetch(w->rt, w->b[1], w->s));
  TRY(spw_wait_idle(w->rt));
}
static void step_spill_n(world_t *w) {
  spw_buf_t two[2] = {w->b[0], w->b[2]};
  TRY(spw_spill_n(w->rt, two, 2, SPW_TIER_HOST));
  TRY(spw_wait_idle(w->rt));
}
static void step_demote(world_t *w) {
  TRY(spw_spill(w->rt, w->b[0], SPW_TIER_DISK));
  TRY(spw_wait_idle(w->rt));
}
static void step_prefetch_n(world_t *w) {
  TRY(spw_prefetch_n(w->rt, w->b, NBUF, w->s));
  TRY(spw_wait_idle(w->rt));
}
static void step_acquire_n_release_async(world_t *w) {
  void *d[NBUF];
  int st = spw_acquire_n(w->rt, w->b, NBUF, w->s, SPW_ACQUIRE_READ, d);
  TRY(st);
  if (st == SPW_OK) {
    TRY(spw_stream_release_async(w->rt, w->s));
    TRY(spw_stream_synchronize(w->rt, w->s));
  }
}
static void step_read_back(world_t *w) {
  TRY(spw_spill(w->rt, w->b[2], SPW_TIER_DISK));
  TRY(spw_wait_idle(w->rt));
  check_buf(w, 2, 0);
}
static void step_alloc_on_demand(world_t *w) {
  spw_buf_t extra;
  int st = spw_alloc(w->rt, 400 * KIB, w->s, &extra);
  TRY(st);
  if (st == SPW_OK) ASSERT_OK(spw_free(w->rt, extra));
}

typedef void (*step_fn)(world_t *);
static const step_fn steps[] = {step_spill_host,  step_spill_disk,   step_unspill,
                                step_prefetch_from_disk, step_spill_n, step_demote,
                                step_prefetch_n, step_acquire_n_release_async,
                                step_read_back,  step_alloc_on_demand};
#define NSTEPS (sizeof steps / sizeof steps[0])

/* A fault to inject: a backend op kind (with a skip), or an I/O failure status. */
typedef struct fault {
  int io;       /* 0: shim kind `kind`; else the I/O status to inject */
  spw_fault_t kind;
  uint32_t skip; /* shim: operations of that kind to let through first; I/O: count - 1 */
} fault_t;

static void arm(world_t *w, const fault_t *f) {
  if (f->io) spw__inject_disk_fault(w->rt, f->io, f->skip + 1);
  else spw__faults_arm(w->rt->be, f->kind, f->skip, 1);
}

static void disarm(world_t *w) {
  for (int k = 0; k < SPW_FAULT_COUNT_; k++) spw__faults_arm(w->rt->be, (spw_fault_t)k, 0, 0);
  spw__inject_disk_fault(w->rt, SPW_ERR_IO, 0);
}

static void open_world(world_t *w) {
  test_tmpdir(w->dir, sizeof w->dir, "sweep");
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 512 * KIB; /* the three do not fit: moves on demand too */
  cfg.host_limit = 320 * KIB;   /* nor on the host: demotions and spills straight to disk */
  cfg.host_device_bytes = 4 << 20;
  cfg.spill_dir = w->dir;
  cfg.log_level = getenv("SPW_SWEEP_LOG") ? SPW_LOG_DEBUG : SPW_LOG_OFF; /* failures log by the hundred */
  w->rt = test_runtime(&cfg);
  ASSERT_OK(spw_stream_create(w->rt, &w->s));
  for (int i = 0; i < NBUF; i++) {
    ASSERT_OK(spw_alloc(w->rt, sizes[i], w->s, &w->b[i]));
    write_buf(w, i, 100 + (uint64_t)i);
  }
}

static void close_world(world_t *w) {
  /* The runtime still works: every buffer reads back right, takes a new version through a
   * full spill and unspill, then everything frees to nothing. */
  TRY(spw_stream_synchronize(w->rt, w->s));
  TRY(spw_wait_idle(w->rt));
  (void)spw_async_error(w->rt);
  for (int i = 0; i < NBUF; i++) check_buf(w, i, 1);
  for (int i = 0; i < NBUF; i++) {
    write_buf(w, i, 200 + (uint64_t)i);
    ASSERT_OK(spw_spill(w->rt, w->b[i], i == 1 ? SPW_TIER_DISK : SPW_TIER_HOST));
  }
  ASSERT_OK(spw_wait_idle(w->rt));
  for (int i = 0; i < NBUF; i++) check_buf(w, i, 1);
  for (int i = 0; i < NBUF; i++) ASSERT_OK(spw_free(w->rt, w->b[i]));
  ASSERT_OK(spw_wait_idle(w->rt));
  spw_stats_t st = stats_of(w->rt);
  ASSERT_UEQ(st.buffers, 0);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.disk_bytes, 0);
  ASSERT_OK(spw_runtime_destroy(w->rt));
  ASSERT_EQ(rmdir(w->dir), 0); /* the spill file left nothing behind */
  test_tmpdir_forget(w->dir);
}

static void run_with(const fault_t *f, size_t at) {
  fprintf(stderr, "[fault io=%d kind=%d skip=%u at step %zu]\n", f->io, (int)f->kind, f->skip, at);
  world_t w;
  open_world(&w);
  for (size_t i = 0; i < NSTEPS; i++) {
    if (i == at) arm(&w, f);
    steps[i](&w);
  }
  disarm(&w);
  close_world(&w);
}

static const char *const kind_names[SPW_FAULT_COUNT_] = {
    "alloc", "copy", "host_register", "event_create", "event_record", "event_query",
    "event_sync", "stream_wait", "stream_sync", "stream_create", "host_func", "mem_info",
    "launch"};

/* SPW_SWEEP_QUICK=1 (the GPU run, where a runtime costs more to make): one point per step. */
static int quick(void) {
  const char *q = getenv("SPW_SWEEP_QUICK");
  return q && *q == '1';
}

/* Every backend operation kind, at every step, as the first, second and fifth of its kind. */
static void every_backend_failure_leaves_data_intact_and_the_runtime_working(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  static const uint32_t skips[] = {0, 2}; /* 5-20x slower: fewer points in each step */
#else
  static const uint32_t skips[] = {0, 1, 4};
#endif
  size_t nskips = quick() ? 1 : sizeof skips / sizeof skips[0];
  int runs = 0;
  for (int k = 0; k < SPW_FAULT_COUNT_; k++) {
    if (k == SPW_FAULT_MEM_INFO) continue; /* creation only: the next test */
    if (k == SPW_FAULT_LAUNCH) continue;   /* kernels: test_launch_faults */
    for (size_t sk = 0; sk < nskips; sk++)
      for (size_t at = 0; at < NSTEPS; at++) {
        fault_t f = {0, (spw_fault_t)k, skips[sk]};
        run_with(&f, at);
        runs++;
      }
    printf("  %s: ok\n", kind_names[k]);
  }
  printf("  %d runs\n", runs);
}

/* Every kind of I/O failure (EIO, a full disk, short transfers), once and three times in a
 * row, at every step. */
static void every_io_failure_leaves_data_intact_and_the_runtime_working(void) {
  static const int statuses[] = {SPW_ERR_IO, SPW_ERR_DISK_FULL, 1};
  int runs = 0;
  for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
    for (uint32_t extra = 0; extra <= (quick() ? 0u : 2u); extra += 2)
      for (size_t at = 0; at < NSTEPS; at++) {
        fault_t f = {statuses[i], SPW_FAULT_COPY, extra};
        run_with(&f, at);
        runs++;
      }
  printf("  %d runs\n", runs);
}

typedef struct creation_fault {
  spw_fault_t kind;
  uint32_t skip;
} creation_fault_t;

static void arm_creation(spw_backend_t *shim, void *arg) {
  creation_fault_t *f = arg;
  spw__faults_arm(shim, f->kind, f->skip, 1);
}

/* spw_runtime_create with each backend call it makes failing in turn: it fails cleanly
 * (nothing leaks) or, where the failing call is not on its path, succeeds and works. */
static void every_creation_failure_is_clean(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = test_backend();
  cfg.log_level = SPW_LOG_OFF;
  cfg.host_device_bytes = 4 << 20;
  spw_settings_t settings;
  char err[256];
  ASSERT_OK(spw__config_resolve(&cfg, &settings, err, sizeof err));
  int failed = 0, runs = 0;
  for (int k = 0; k < SPW_FAULT_COUNT_; k++)
    for (uint32_t skip = 0; skip < 4; skip++) {
      creation_fault_t f = {(spw_fault_t)k, skip};
      spw_runtime_t *rt = NULL;
      int st = spw__runtime_open(&settings, arm_creation, &f, &rt);
      TEST_SKIP_IF(st == SPW_ERR_NO_DEVICE, "no CUDA device on this machine");
      runs++;
      if (st != SPW_OK) {
        check_status(st, "spw__runtime_open");
        failed++;
        continue;
      }
      spw__faults_arm(rt->be, f.kind, 0, 0);
      spw_buf_t b;
      ASSERT_OK(spw_alloc(rt, 4096, NULL, &b));
      ASSERT_OK(spw_free(rt, b));
      ASSERT_OK(spw_runtime_destroy(rt));
    }
  printf("  %d of %d creations failed cleanly, the others work\n", failed, runs);
  ASSERT_GT(failed, 0);
}

static const spw_test_t tests[] = {
    TEST(every_creation_failure_is_clean),
    TEST(every_backend_failure_leaves_data_intact_and_the_runtime_working),
    TEST(every_io_failure_leaves_data_intact_and_the_runtime_working),
};
TEST_MAIN(tests)
