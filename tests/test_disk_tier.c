/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of the disk tier, run once per I/O path (CTest sets SPILLWAY_IO=uring or
 * posix; the config's io field is left 0 so the environment decides): buffers go device ->
 * host -> disk -> device intact at any size, a spill to the DISK tier skips the host, four
 * threads under pressure keep every buffer, a failed write or read leaves the buffer
 * readable where it was, a full file system (a real 16 MiB tmpfs) keeps what does not fit
 * on the host, and the spill file is never visible in the spill directory.
 *
 * A uring run where the kernel refuses io_uring exits 77 (skipped). Failures are injected
 * with spw__disk_inject_fault (spill/disk_tier.h). Device memory is touched only through
 * spw_memcpy_async + spw_stream_synchronize, so every test is valid on both backends.
 * Each test spills into a fresh directory of its own. SPW_TEST_SEED=n replays a run. */
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "disk_tier.h"
#include "runtime.h"
#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define MIB ((size_t)1 << 20)

static uint64_t seed0;

/* Contents: test_page_fill over this test_fill template (see test_util.h). */
#define MAX_BUF (6 * MIB)
static uint8_t *tmpl;

/* ---- helpers ----------------------------------------------------------------------- */

static void make_dir(char *dir, size_t len, const char *tag) { test_tmpdir(dir, len, tag); }

/* Removes a test's spill directory, which the runtime must have left empty; says what is
 * there if it is not. */
static void remove_spill_dir(const char *dir) {
  if (rmdir(dir) == 0) {
    test_tmpdir_forget(dir);
    return;
  }
  perror("rmdir of the spill directory");
  ASSERT_EQ(test_dir_entries(dir), 0);
  ASSERT_EQ(rmdir(dir), 0);
  test_tmpdir_forget(dir);
}

static spw_runtime_t *disk_runtime(const char *dir, uint64_t device_limit, uint64_t host_limit) {
  spw_config_t cfg = SPW_CONFIG_INIT; /* cfg.io stays 0: SPILLWAY_IO decides */
  cfg.spill_dir = dir;
  cfg.device_limit = device_limit;
  cfg.host_limit = host_limit;
  cfg.host_device_bytes = device_limit * 2;
  return test_runtime(&cfg);
}

/* The fixture: the test's runtime and spill directory, opened by open_disk (or by hand, for
 * a test that needs more) and closed after every test (close_fixture: the runtime destroyed,
 * which frees what the test left, then the directory removed, which must be empty). */
static char fx_dir[PATH_MAX];
static spw_runtime_t *fx_rt;

static spw_runtime_t *open_disk(uint64_t device_limit, uint64_t host_limit, spw_stream_t *s) {
  make_dir(fx_dir, sizeof fx_dir, "disk");
  fx_rt = disk_runtime(fx_dir, device_limit, host_limit);
  ASSERT_OK(spw_stream_create(fx_rt, s));
  return fx_rt;
}

static void close_runtime(void) {
  if (fx_rt) ASSERT_OK(spw_runtime_destroy(fx_rt));
  fx_rt = NULL;
}

static void close_fixture(void) {
  close_runtime();
  if (fx_dir[0]) remove_spill_dir(fx_dir);
  fx_dir[0] = '\0';
}

static spw_buf_t filled(spw_runtime_t *rt, spw_stream_t s, size_t n, uint64_t version) {
  uint8_t *src = malloc(n);
  ASSERT_TRUE(src != NULL);
  test_page_fill(src, n, tmpl, version);
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, n, s, &b));
  test_write(rt, b, s, src, n);
  free(src);
  return b;
}

static void expect_contents(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, size_t n,
                            uint64_t version) {
  uint8_t *got = malloc(n);
  ASSERT_TRUE(got != NULL);
  memset(got, 0, n);
  test_read(rt, b, s, got, n);
  size_t bad = test_page_mismatch(got, n, tmpl, version);
  if (bad != (size_t)-1) {
    fprintf(stderr, "%zu-byte buffer, version %#" PRIx64 ": first bad byte at %zu\n", n, version,
            bad);
    ASSERT_TRUE(!"contents wrong after a trip through the disk tier");
  }
  free(got);
}

static void spill_wait(spw_runtime_t *rt, spw_buf_t b, spw_tier_t tier, spw_state_t want) {
  ASSERT_OK(spw_spill(rt, b, tier));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), want);
}

/* ---- tests ------------------------------------------------------------------------- */

static void buffers_go_device_host_disk_device_intact(void) {
  /* A 4 MiB host tier: spilling more demotes the least recently used to disk. */
  spw_stream_t s;
  spw_runtime_t *rt = open_disk(32 * MIB, 4 * MIB, &s);
  uint64_t rng = seed0;
  size_t sizes[20] = {1, 7, 4095, 4096, 4097, 12345, 1 * MIB + 1};
  const size_t nb = sizeof sizes / sizeof sizes[0];
  for (size_t i = 7; i < nb; i++) sizes[i] = 1 + (size_t)(test_splitmix(&rng) % (3 * MIB / 2));
  spw_buf_t b[20];
  for (size_t i = 0; i < nb; i++) {
    b[i] = filled(rt, s, sizes[i], i);
    spill_wait(rt, b[i], SPW_TIER_HOST, SPW_STATE_HOST);
  }
  int on_disk = 0;
  for (size_t i = 0; i < nb; i++) {
    spw_state_t st = state_of(rt, b[i]);
    ASSERT_TRUE(st == SPW_STATE_HOST || st == SPW_STATE_DISK);
    on_disk += st == SPW_STATE_DISK;
  }
  spw_stats_t st = stats_of(rt);
  printf("  %d of %zu buffers on disk, %" PRIu64 " demotions\n", on_disk, nb, st.demotions);
  ASSERT_GT(on_disk, 0);
  ASSERT_UEQ(st.demotions, (uint64_t)on_disk);
  ASSERT_LE(st.host_bytes, 4 * MIB);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.failures, 0);
  for (size_t i = 0; i < nb; i++) expect_contents(rt, b[i], s, sizes[i], i);
  st = stats_of(rt);
  ASSERT_UEQ(st.disk_reads, (uint64_t)on_disk);
  ASSERT_UEQ(st.disk_bytes, 0);
  for (size_t i = 0; i < nb; i++) ASSERT_OK(spw_free(rt, b[i]));
}

static void spill_to_disk_tier_skips_the_host(void) {
  spw_stream_t s;
  spw_runtime_t *rt = open_disk(32 * MIB, 32 * MIB, &s);
  /* Several staging chunks and a ragged tail, and less than one page. */
  const size_t sizes[3] = {5 * MIB + 123, 4095, 2 * MIB};
  for (int i = 0; i < 3; i++) {
    const size_t n = sizes[i];
    spw_buf_t b = filled(rt, s, n, 50 + (uint64_t)i);
    const spw_stats_t before = stats_of(rt);
    spill_wait(rt, b, SPW_TIER_DISK, SPW_STATE_DISK);
    spw_tier_t tier = SPW_TIER_DEVICE;
    ASSERT_OK(spw_buf_tier(rt, b, &tier));
    ASSERT_EQ(tier, SPW_TIER_DISK);
    const spw_stats_t after = stats_of(rt);
    ASSERT_UEQ(after.disk_bytes, n);
    ASSERT_UEQ(after.host_bytes, 0);
    ASSERT_UEQ(after.device_bytes, 0);
    ASSERT_UEQ(after.demotions, before.demotions); /* never went through the host tier */
    ASSERT_UEQ(after.spills, before.spills + 1);
    ASSERT_UEQ(after.disk_writes, before.disk_writes + 1);
    ASSERT_UEQ(after.disk_write_bytes, before.disk_write_bytes + n);
    expect_contents(rt, b, s, n, 50 + (uint64_t)i);
    ASSERT_UEQ(stats_of(rt).disk_reads, before.disk_reads + 1);
    ASSERT_OK(spw_free(rt, b));
  }
}

/* Four threads, each with its own buffers and stream, in an 8 MiB device / 4 MiB host
 * budget over about 24 MiB of data: most acquires come from disk. */
#define DT_THREADS 4
#define DT_PER_THREAD 12
#if defined(__SANITIZE_THREAD__)
#define DT_ROUNDS 15
#else
#define DT_ROUNDS 40
#endif

typedef struct dt_worker {
  spw_runtime_t *rt;
  spw_stream_t s;
  spw_buf_t b[DT_PER_THREAD];
  size_t n[DT_PER_THREAD];
  uint64_t version[DT_PER_THREAD];
  uint64_t rng;
  int id;
  uint8_t *readback, *src;
  pthread_t thread;
} dt_worker_t;

/* A spill to host that finds no host memory (the buffer is larger than the whole host tier,
 * and there is nothing to demote) goes straight to disk: the device needs the room. */
static void spill_to_a_full_host_tier_goes_to_disk(void) {
  spw_stream_t s;
  spw_runtime_t *rt = open_disk(32 * MIB, 1 * MIB, &s);
  const size_t n = 3 * MIB + 5;
  spw_buf_t b = filled(rt, s, n, 70);
  spill_wait(rt, b, SPW_TIER_HOST, SPW_STATE_DISK);
  const spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.device_bytes, 0);
  ASSERT_UEQ(st.host_bytes, 0);
  ASSERT_UEQ(st.disk_bytes, n);
  expect_contents(rt, b, s, n, 70);
  ASSERT_OK(spw_free(rt, b));
}

static void *dt_main(void *arg) {
  dt_worker_t *w = arg;
  for (int r = 0; r < DT_ROUNDS; r++) {
    int i = (int)(test_splitmix(&w->rng) % DT_PER_THREAD);
    void *d = NULL;
    ASSERT_OK(spw_acquire(w->rt, w->b[i], w->s, 0, &d));
    ASSERT_OK(spw_memcpy_async(w->rt, w->readback, d, w->n[i], w->s));
    uint64_t nv = w->version[i] + 1;
    test_page_fill(w->src, w->n[i], tmpl, nv);
    ASSERT_OK(spw_memcpy_async(w->rt, d, w->src, w->n[i], w->s));
    ASSERT_OK(spw_stream_synchronize(w->rt, w->s));
    size_t bad = test_page_mismatch(w->readback, w->n[i], tmpl, w->version[i]);
    if (bad != (size_t)-1) {
      fprintf(stderr, "thread %d buffer %d (%zu bytes): first bad byte at %zu\n", w->id, i,
              w->n[i], bad);
      ASSERT_TRUE(!"contents wrong under disk pressure");
    }
    w->version[i] = nv;
  }
  return NULL;
}

static void four_threads_under_pressure_keep_contents(void) {
  spw_stream_t s0;
  spw_runtime_t *rt = open_disk(8 * MIB, 4 * MIB, &s0);
  dt_worker_t w[DT_THREADS];
  memset(w, 0, sizeof w);
  for (int t = 0; t < DT_THREADS; t++) {
    w[t].rt = rt;
    w[t].id = t;
    w[t].rng = seed0 * 7 + (uint64_t)t;
    w[t].readback = malloc(MIB);
    w[t].src = malloc(MIB);
    ASSERT_TRUE(w[t].readback && w[t].src);
    ASSERT_OK(spw_stream_create(rt, &w[t].s));
    for (int i = 0; i < DT_PER_THREAD; i++) {
      w[t].n[i] = 4096 + (size_t)(test_splitmix(&w[t].rng) % (MIB - 4096)); /* rarely page-sized */
      w[t].version[i] = ((uint64_t)t << 40) | ((uint64_t)i << 24);
      w[t].b[i] = filled(rt, w[t].s, w[t].n[i], w[t].version[i]);
    }
  }
  for (int t = 0; t < DT_THREADS; t++) ASSERT_EQ(pthread_create(&w[t].thread, NULL, dt_main, &w[t]), 0);
  for (int t = 0; t < DT_THREADS; t++) ASSERT_EQ(pthread_join(w[t].thread, NULL), 0);
  /* The disk has room: a spill that finds the host tier full goes to disk, never fails. */
  ASSERT_OK(spw_wait_idle(rt));
  for (int t = 0; t < DT_THREADS; t++)
    for (int i = 0; i < DT_PER_THREAD; i++)
      expect_contents(rt, w[t].b[i], w[t].s, w[t].n[i], w[t].version[i]);
  const spw_stats_t st = stats_of(rt);
  printf("  %" PRIu64 " spills, %" PRIu64 " demotions, %" PRIu64 " disk reads, %" PRIu64
         " unspills\n",
         st.spills, st.demotions, st.disk_reads, st.unspills);
  ASSERT_GT(st.demotions, 0);
  ASSERT_GT(st.disk_reads, 0);
  for (int t = 0; t < DT_THREADS; t++) {
    for (int i = 0; i < DT_PER_THREAD; i++) ASSERT_OK(spw_free(rt, w[t].b[i]));
    free(w[t].readback);
    free(w[t].src);
  }
  /* A buffer freed in the middle of a background move is finished by that move. */
  ASSERT_OK(spw_wait_idle(rt));
  const spw_stats_t end = stats_of(rt);
  ASSERT_UEQ(end.disk_bytes, 0);
  ASSERT_UEQ(end.host_bytes, 0);
}

/* The runtime of the fault tests (32 MiB device and host) with one buffer of n bytes,
 * version v, spilled to `tier` (SPW_TIER_DEVICE: left resident). */
static spw_buf_t one_buffer(size_t n, uint64_t v, spw_tier_t tier, spw_runtime_t **rt,
                            spw_stream_t *s) {
  *rt = open_disk(32 * MIB, 32 * MIB, s);
  spw_buf_t b = filled(*rt, *s, n, v);
  if (tier == SPW_TIER_HOST) spill_wait(*rt, b, tier, SPW_STATE_HOST);
  if (tier == SPW_TIER_DISK) spill_wait(*rt, b, tier, SPW_STATE_DISK);
  return b;
}

/* The next disk transfer fails with EIO; returns the statistics before it. */
static spw_stats_t fail_next_transfer(spw_runtime_t *rt) {
  spw_stats_t st = stats_of(rt);
  spw__inject_disk_fault(rt, SPW_ERR_IO, 1);
  return st;
}

/* A write to disk that fails (EIO) leaves the buffer where it was, counted as a failure,
 * its contents intact, and the tier works again once the fault is spent: from the host
 * tier (a demotion) and from the device (a direct spill). */
static void write_eio_keeps_buffer_where_it_was(spw_tier_t from, size_t n, uint64_t v) {
  spw_runtime_t *rt;
  spw_stream_t s;
  spw_buf_t b = one_buffer(n, v, from, &rt, &s);
  const spw_stats_t before = fail_next_transfer(rt);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_DISK));
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_IO);
  ASSERT_EQ(state_of(rt, b), from == SPW_TIER_HOST ? SPW_STATE_HOST : SPW_STATE_RESIDENT);
  const spw_stats_t after = stats_of(rt);
  ASSERT_UEQ(after.failures, before.failures + 1);
  ASSERT_UEQ(after.disk_bytes, 0);
  ASSERT_UEQ(from == SPW_TIER_HOST ? after.host_bytes : after.device_bytes, n);
  ASSERT_UEQ(after.demotions, before.demotions);
  expect_contents(rt, b, s, n, v);
  spill_wait(rt, b, SPW_TIER_DISK, SPW_STATE_DISK);
  expect_contents(rt, b, s, n, v);
}

static void write_eio_keeps_buffer_on_host(void) {
  write_eio_keeps_buffer_where_it_was(SPW_TIER_HOST, 3 * MIB + 11, 60);
}

static void write_eio_on_direct_spill_keeps_buffer_resident(void) {
  write_eio_keeps_buffer_where_it_was(SPW_TIER_DEVICE, 5 * MIB - 1, 61);
}

static void read_eio_fails_acquire_and_keeps_buffer_on_disk(void) {
  const size_t n = 5 * MIB + 3;
  spw_runtime_t *rt;
  spw_stream_t s;
  spw_buf_t b = one_buffer(n, 62, SPW_TIER_DISK, &rt, &s);
  const spw_stats_t before = fail_next_transfer(rt);
  void *d = (void *)&d;
  ASSERT_STATUS(spw_acquire(rt, b, s, 0, &d), SPW_ERR_IO);
  ASSERT_PTR_EQ(d, (void *)&d);
  ASSERT_EQ(state_of(rt, b), SPW_STATE_DISK);
  const spw_stats_t after = stats_of(rt);
  ASSERT_UEQ(after.failures, before.failures + 1);
  ASSERT_UEQ(after.device_bytes, before.device_bytes);
  ASSERT_UEQ(after.disk_bytes, n);
  expect_contents(rt, b, s, n, 62);
}

static void spill_file_is_invisible_and_leaves_no_trace(void) {
  spw_stream_t s;
  spw_runtime_t *rt = open_disk(32 * MIB, 32 * MIB, &s);
  ASSERT_EQ(test_dir_entries(fx_dir), 0);
  spw_buf_t direct = filled(rt, s, 3 * MIB + 1, 70);
  spw_buf_t demoted = filled(rt, s, 100000, 71);
  spill_wait(rt, direct, SPW_TIER_DISK, SPW_STATE_DISK);
  spill_wait(rt, demoted, SPW_TIER_HOST, SPW_STATE_HOST);
  spill_wait(rt, demoted, SPW_TIER_DISK, SPW_STATE_DISK);
  ASSERT_UEQ(stats_of(rt).disk_bytes, 3 * MIB + 1 + 100000);
  ASSERT_EQ(test_dir_entries(fx_dir), 0); /* the data is on disk, in a file nobody can name */
  /* Destroyed with buffers still on disk: nothing is left behind either. */
  close_runtime();
  ASSERT_EQ(test_dir_entries(fx_dir), 0);
}

static void enospc_on_small_tmpfs_keeps_buffers_on_host(void) {
  char *dir = fx_dir;
  make_dir(dir, sizeof fx_dir, "tmpfs");
  /* A private mount namespace when we may have one, so that the mount vanishes with the
   * process even if an assertion kills it. Best effort: without it, unmounted below. */
  if (unshare(CLONE_NEWNS) == 0) (void)mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=16m,mode=0700") != 0) {
    printf("  mount tmpfs: %s\n", strerror(errno));
    test_tmpdir_remove(dir);
    fx_dir[0] = '\0';
    TEST_SKIP_IF(1, "cannot mount a tmpfs here (needs root)");
  }
  const size_t n = 5 * MIB + 1; /* three fit in 16 MiB, five do not */
  const int nb = 5;
  spw_runtime_t *rt = fx_rt = disk_runtime(dir, 64 * MIB, 64 * MIB);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[5];
  for (int i = 0; i < nb; i++) {
    b[i] = filled(rt, s, n, 80 + (uint64_t)i);
    spill_wait(rt, b[i], SPW_TIER_HOST, SPW_STATE_HOST);
  }
  for (int i = 0; i < nb; i++) ASSERT_OK(spw_spill(rt, b[i], SPW_TIER_DISK));
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_DISK_FULL);
  int on_disk = 0, on_host = 0;
  for (int i = 0; i < nb; i++) {
    spw_state_t st = state_of(rt, b[i]);
    on_disk += st == SPW_STATE_DISK;
    on_host += st == SPW_STATE_HOST;
  }
  const spw_stats_t st = stats_of(rt);
  printf("  %d on disk, %d on host, %" PRIu64 " failures\n", on_disk, on_host, st.failures);
  ASSERT_EQ(on_disk + on_host, nb);
  ASSERT_GT(on_disk, 0);
  ASSERT_GT(on_host, 0);
  ASSERT_UEQ(st.failures, (uint64_t)on_host);
  ASSERT_UEQ(st.disk_bytes, (uint64_t)on_disk * n);
  ASSERT_UEQ(st.host_bytes, (uint64_t)on_host * n);
  for (int i = 0; i < nb; i++) expect_contents(rt, b[i], s, n, 80 + (uint64_t)i);
  close_runtime();
  ASSERT_EQ(test_dir_entries(dir), 0);
  ASSERT_EQ(umount2(dir, MNT_DETACH), 0);
}

/* ---- batches: buffers moved to and from disk together ---------------------------------- */

#define BATCH_N 48

static size_t batch_size(size_t i) {
  /* Mostly small (sharing staging slots and requests), a few ragged, one spanning slots. */
  static const size_t odd[] = {1, 4095, 4097, 65537, 5 * MIB + 123};
  return i % 8 == 7 ? odd[(i / 8) % 5] : 64 * 1024;
}

static void fill_batch(spw_runtime_t *rt, spw_stream_t s, spw_buf_t *b, uint64_t v0) {
  for (size_t i = 0; i < BATCH_N; i++) b[i] = filled(rt, s, batch_size(i), v0 + i);
}

static void expect_batch(spw_runtime_t *rt, spw_stream_t s, const spw_buf_t *b, uint64_t v0) {
  for (size_t i = 0; i < BATCH_N; i++) expect_contents(rt, b[i], s, batch_size(i), v0 + i);
}

/* A runtime with BATCH_N filled buffers, in the fixture's spill directory. */
typedef struct batch_fixture {
  spw_runtime_t *rt;
  spw_stream_t s;
  spw_buf_t b[BATCH_N];
  uint64_t v0;
} batch_fixture_t;

static void batch_spill_to_disk(batch_fixture_t *f) {
  ASSERT_OK(spw_spill_n(f->rt, f->b, BATCH_N, SPW_TIER_DISK));
  ASSERT_OK(spw_wait_idle(f->rt));
  ASSERT_EQ(test_count_in(f->rt, f->b, BATCH_N, SPW_STATE_DISK), BATCH_N);
}

/* The batch, versions from v0, left resident (SPW_TIER_DEVICE) or spilled to disk. */
static void batch_open(batch_fixture_t *f, uint64_t v0, spw_tier_t tier) {
  f->rt = open_disk(64 * MIB, 64 * MIB, &f->s);
  f->v0 = v0;
  fill_batch(f->rt, f->s, f->b, v0);
  if (tier == SPW_TIER_DISK) batch_spill_to_disk(f);
}

/* Checks every buffer's contents (close_fixture frees them). */
static void batch_close(batch_fixture_t *f) { expect_batch(f->rt, f->s, f->b, f->v0); }

static void small_buffers_spilled_together_share_disk_requests(void) {
  batch_fixture_t f;
  batch_open(&f, 100, SPW_TIER_DEVICE);
  const spw_stats_t before = stats_of(f.rt);
  batch_spill_to_disk(&f);
  const spw_stats_t wrote = stats_of(f.rt);
  const uint64_t writes = wrote.disk_requests - before.disk_requests;
  printf("  %d buffers written in %" PRIu64 " requests\n", BATCH_N, writes);
  ASSERT_UEQ(wrote.disk_writes, before.disk_writes + BATCH_N);
  ASSERT_UEQ(wrote.failures, 0);
  /* About 8.5 MiB: a fresh file hands out neighbouring extents, so each slot of staging
   * goes out as one or two requests, not one per buffer. */
  ASSERT_LE(writes, (uint64_t)BATCH_N / 4);
  ASSERT_OK(spw_prefetch_n(f.rt, f.b, BATCH_N, f.s));
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_EQ(test_count_in(f.rt, f.b, BATCH_N, SPW_STATE_RESIDENT), BATCH_N);
  const spw_stats_t read = stats_of(f.rt);
  const uint64_t reads = read.disk_requests - wrote.disk_requests;
  printf("  read back in %" PRIu64 " requests\n", reads);
  ASSERT_UEQ(read.disk_reads, before.disk_reads + BATCH_N);
  ASSERT_LE(reads, (uint64_t)BATCH_N / 4);
  ASSERT_UEQ(read.disk_bytes, 0);
  batch_close(&f);
}

/* One prefetch of buffers on every tier: the up lane brings back those on host, then reads
 * those on disk; resident ones stay as they are. */
static void a_prefetch_of_buffers_on_every_tier_brings_back_host_and_disk_ones(void) {
  batch_fixture_t f;
  batch_open(&f, 300, SPW_TIER_DEVICE);
  spw_buf_t to_disk[BATCH_N], to_host[BATCH_N];
  size_t nd = 0, nh = 0;
  for (size_t i = 0; i < BATCH_N; i++) {
    if (i % 3 == 1) to_disk[nd++] = f.b[i];
    if (i % 3 == 2) to_host[nh++] = f.b[i];
  }
  ASSERT_OK(spw_spill_n(f.rt, to_disk, nd, SPW_TIER_DISK));
  ASSERT_OK(spw_spill_n(f.rt, to_host, nh, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(f.rt));
  for (size_t k = 0; k < nd; k++) ASSERT_EQ(state_of(f.rt, to_disk[k]), SPW_STATE_DISK);
  for (size_t k = 0; k < nh; k++) ASSERT_EQ(state_of(f.rt, to_host[k]), SPW_STATE_HOST);
  const spw_stats_t before = stats_of(f.rt);
  ASSERT_OK(spw_prefetch_n(f.rt, f.b, BATCH_N, f.s));
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_EQ(test_count_in(f.rt, f.b, BATCH_N, SPW_STATE_RESIDENT), BATCH_N);
  const spw_stats_t after = stats_of(f.rt);
  ASSERT_UEQ(after.disk_reads, before.disk_reads + nd);
  ASSERT_UEQ(after.disk_bytes, 0);
  batch_close(&f);
}

static void acquire_n_reads_disk_buffers_as_one_batch(void) {
  batch_fixture_t f;
  batch_open(&f, 200, SPW_TIER_DISK);
  const spw_stats_t before = stats_of(f.rt);
  void *d[BATCH_N];
  ASSERT_OK(spw_acquire_n(f.rt, f.b, BATCH_N, f.s, 0, d));
  const spw_stats_t after = stats_of(f.rt);
  ASSERT_UEQ(after.disk_reads, before.disk_reads + BATCH_N);
  ASSERT_LE(after.disk_requests - before.disk_requests, (uint64_t)BATCH_N / 4);
  for (size_t i = 0; i < BATCH_N; i++) ASSERT_OK(spw_release(f.rt, f.b[i], f.s));
  batch_close(&f);
}

/* After one failed request in a batch: some buffers moved and some did not (counted in
 * *on_disk and *resident, printed); returns the statistics. */
static spw_stats_t split_by_one_failure(batch_fixture_t *f, int *on_disk, int *resident) {
  *on_disk = (int)test_count_in(f->rt, f->b, BATCH_N, SPW_STATE_DISK);
  *resident = (int)test_count_in(f->rt, f->b, BATCH_N, SPW_STATE_RESIDENT);
  printf("  one failed request: %d on disk, %d resident\n", *on_disk, *resident);
  ASSERT_EQ(*on_disk + *resident, BATCH_N);
  ASSERT_GT(*on_disk, 0);
  ASSERT_GT(*resident, 0);
  return stats_of(f->rt);
}

static void failed_write_in_a_batch_keeps_only_its_buffers_resident(void) {
  batch_fixture_t f;
  batch_open(&f, 300, SPW_TIER_DEVICE);
  spw__inject_disk_fault(f.rt, SPW_ERR_IO, 1);
  ASSERT_OK(spw_spill_n(f.rt, f.b, BATCH_N, SPW_TIER_DISK));
  ASSERT_STATUS(spw_wait_idle(f.rt), SPW_ERR_IO);
  int on_disk, resident;
  const spw_stats_t st = split_by_one_failure(&f, &on_disk, &resident);
  ASSERT_UEQ(st.failures, (uint64_t)resident);
  ASSERT_UEQ(st.disk_writes, (uint64_t)on_disk);
  expect_batch(f.rt, f.s, f.b, f.v0);
  /* The tier still works once the fault is spent. */
  batch_spill_to_disk(&f);
  batch_close(&f);
}

static void failed_read_in_a_batch_keeps_only_its_buffers_on_disk(void) {
  batch_fixture_t f;
  batch_open(&f, 400, SPW_TIER_DISK);
  const spw_stats_t before = fail_next_transfer(f.rt);
  ASSERT_OK(spw_prefetch_n(f.rt, f.b, BATCH_N, f.s));
  ASSERT_STATUS(spw_wait_idle(f.rt), SPW_ERR_IO);
  int on_disk, resident;
  const spw_stats_t st = split_by_one_failure(&f, &on_disk, &resident);
  ASSERT_UEQ(st.failures, before.failures + (uint64_t)on_disk);
  ASSERT_UEQ(st.disk_reads, before.disk_reads + (uint64_t)resident);
  batch_close(&f); /* those still on disk are read one by one here */
}

/* 24 MiB on disk prefetched through an 8 MiB budget: a prefetch is a hint, and brings in
 * only what can stay (below the high watermark, without pushing out what it brought in
 * itself); the rest stays on disk, counted as dropped. Nothing fails and nothing is lost:
 * acquires read the rest. */
static void prefetch_larger_than_the_budget_brings_in_what_fits(void) {
  spw_stream_t s;
  spw_runtime_t *rt = open_disk(8 * MIB, 64 * MIB, &s);
  enum { NB = 24 };
  spw_buf_t b[NB];
  for (int i = 0; i < NB; i++) {
    b[i] = filled(rt, s, MIB, 500 + (uint64_t)i);
    spill_wait(rt, b[i], SPW_TIER_DISK, SPW_STATE_DISK);
  }
  const spw_stats_t before = stats_of(rt);
  ASSERT_OK(spw_prefetch_n(rt, b, NB, s));
  ASSERT_OK(spw_wait_idle(rt));
  const spw_stats_t after = stats_of(rt);
  printf("  %" PRIu64 " disk reads in %" PRIu64 " requests\n", after.disk_reads - before.disk_reads,
         after.disk_requests - before.disk_requests);
  const uint64_t read = after.disk_reads - before.disk_reads;
  ASSERT_UEQ(after.failures, before.failures);
  ASSERT_GT(read, 0);
  ASSERT_LE(read * MIB, after.device_limit); /* no round evicted what an earlier one read */
  ASSERT_UEQ(after.spills, before.spills);
  ASSERT_UEQ(after.prefetch_dropped - before.prefetch_dropped, NB - read);
  ASSERT_UEQ(after.hints_pending, 0);
  for (int i = 0; i < NB; i++) expect_contents(rt, b[i], s, MIB, 500 + (uint64_t)i);
  for (int i = 0; i < NB; i++) ASSERT_OK(spw_free(rt, b[i]));
}

/* Bytes the file system holds for the spill file in `dir` (found among this process's open
 * files: it has no name in the directory), or -1 if there is none. */
static int64_t spill_file_blocks(const char *dir) {
  DIR *d = opendir("/proc/self/fd");
  ASSERT_TRUE(d != NULL);
  int64_t bytes = -1;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char link[300], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(link, target, sizeof target - 1);
    if (k <= 0) continue;
    target[k] = '\0';
    struct stat st;
    if (strncmp(target, dir, strlen(dir)) == 0 && stat(link, &st) == 0 && S_ISREG(st.st_mode))
      bytes = (int64_t)st.st_blocks * 512;
  }
  closedir(d);
  return bytes;
}

/* Issue 17: reading buffers back used to run a whole sweep of the spill file's free space
 * (one hole punch per gap) when the extent it freed crossed a grow step. Now a free only
 * says a sweep is due, and the engine's download lane gives the space back a step at a
 * time: once 256 MiB came back, the file's blocks go back to the file system. (CI once saw
 * 32 MiB stay: the last eight frees came after the sweep had passed them.) */
static void freed_disk_space_goes_back_to_the_file_system(void) {
  spw_stream_t s;
  spw_runtime_t *rt = open_disk(16 * MIB, 4 * MIB, &s);
  enum { N = 72 }; /* 288 MiB: more than one grow step */
  spw_buf_t b[N];
  for (int i = 0; i < N; i++) {
    b[i] = filled(rt, s, 4 * MIB, 900 + (uint64_t)i);
    spill_wait(rt, b[i], SPW_TIER_DISK, SPW_STATE_DISK);
  }
  const int64_t full = spill_file_blocks(fx_dir);
  TEST_SKIP_IF(full < (int64_t)(N * 4 * MIB), "this file system does not preallocate (no fallocate)");
  for (int i = 0; i < N; i++) ASSERT_OK(spw_free(rt, b[i]));
  ASSERT_OK(spw_wait_idle(rt));
  /* The frees that come after the sweep has passed their offsets count towards the next
   * one, so up to a grow step (256 MiB by default) may stay reserved; the file had more. */
  const int64_t kept_at_most = 256 * (int64_t)MIB;
  int64_t now = full;
  for (uint64_t t0 = test_now_ms(); test_now_ms() - t0 < 10000; test_sleep_ms(5))
    if ((now = spill_file_blocks(fx_dir)) < kept_at_most) break;
  printf("  spill file blocks: %lld MiB with every buffer on disk, %lld MiB after the frees\n",
         (long long)(full >> 20), (long long)(now >> 20));
  ASSERT_LT(now, kept_at_most);
}

/* A host backend of its own for a disk tier driven directly (no runtime). */
static spw_backend_t *small_host_backend(void) {
  spw_backend_params_t bp = {0};
  bp.host_device_bytes = 16 * MIB;
  spw_backend_t *be = NULL;
  ASSERT_OK(spw__backend_host_ops.create(&bp, &be));
  return be;
}

/* Freed space goes back only while the tier is quiet: a hole punch beside a transfer stalls
 * it (ext4 and XFS wait for every direct transfer in flight; with discard the range is
 * discarded too), and reads back beside sweep steps ran at 0.53-0.69 of an H100 machine's
 * raw disk. Checked on the tier itself, with a quiet time no loaded machine can miss. */
static void a_sweep_step_waits_until_the_disk_has_been_quiet(void) {
  make_dir(fx_dir, sizeof fx_dir, "quiet");
  const spw_backend_ops_t *ops = &spw__backend_host_ops;
  spw_backend_t *be = small_host_backend();
  const uint64_t quiet_ns = 500 * 1000 * 1000;
  spw_disk_params_t p = {.ops = ops, .be = be, .dir = fx_dir, .grow_step = 4 * MIB,
                         .quiet_ns = quiet_ns};
  spw_disk_t *d = NULL;
  ASSERT_OK(spw__disk_create(&p, &d));
  uint8_t *src = aligned_alloc(4096, 4 * MIB);
  ASSERT_TRUE(src != NULL);
  memset(src, 0x5a, 4 * MIB);
  enum { N = 4 };
  spw_disk_extent_t e[N];
  for (int i = 0; i < N; i++) ASSERT_OK(spw__disk_write_host(d, src, 4 * MIB, &e[i]));
  const int64_t full = spill_file_blocks(fx_dir);
  int due = 0;
  for (int i = 0; i < N; i++) due |= spw__disk_free(d, &e[i]);
  uint64_t later = 0;
  const int more = spw__disk_sweep(d, 8, &later);
  const int64_t right_after = spill_file_blocks(fx_dir);
  test_sleep_ms(quiet_ns / 1000000 + 20);
  uint64_t later2 = 1;
  while (spw__disk_sweep(d, 8, &later2)) {
  }
  const int64_t quiet_after = spill_file_blocks(fx_dir);
  spw__disk_destroy(d);
  ops->destroy(be);
  free(src);
  TEST_SKIP_IF(full < (int64_t)(N * 4 * MIB), "this file system does not preallocate (no fallocate)");
  ASSERT_TRUE(due);
  ASSERT_EQ(more, 0);
  ASSERT_TRUE(later > 0 && later <= quiet_ns);
  ASSERT_EQ(right_after, full);
  ASSERT_UEQ(later2, 0);
  ASSERT_LT(quiet_after, full);
}

/* A sweep step held by the test's hook, and a host write begun meanwhile on another thread. */
typedef struct held_sweep {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int in_step, release, written;
  spw_disk_t *d;
  const uint8_t *src;
  spw_disk_extent_t e;
  int write_status;
} held_sweep_t;

static void hold_sweep_step(void *ctx) {
  held_sweep_t *h = ctx;
  pthread_mutex_lock(&h->mu);
  h->in_step = 1;
  pthread_cond_broadcast(&h->cv);
  while (!h->release) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
}

static void *sweep_thread(void *arg) {
  held_sweep_t *h = arg;
  uint64_t later = 0;
  while (spw__disk_sweep(h->d, 8, &later)) {
  }
  return NULL;
}

static void *write_thread(void *arg) {
  held_sweep_t *h = arg;
  h->write_status = spw__disk_write_host(h->d, h->src, 4 * MIB, &h->e);
  pthread_mutex_lock(&h->mu);
  h->written = 1;
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

/* A transfer that begins while a sweep step punches waits for the step to end: a punch
 * beside a direct transfer would stall it (disk_tier.c). */
static void a_transfer_waits_for_a_running_sweep_step(void) {
  make_dir(fx_dir, sizeof fx_dir, "held");
  const spw_backend_ops_t *ops = &spw__backend_host_ops;
  spw_backend_t *be = small_host_backend();
  held_sweep_t h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  spw_disk_params_t p = {.ops = ops, .be = be, .dir = fx_dir, .grow_step = 4 * MIB,
                         .quiet_ns = 1000 * 1000, .test_in_sweep = hold_sweep_step,
                         .test_ctx = &h};
  ASSERT_OK(spw__disk_create(&p, &h.d));
  uint8_t *src = aligned_alloc(4096, 4 * MIB);
  ASSERT_TRUE(src != NULL);
  memset(src, 0x3c, 4 * MIB);
  h.src = src;
  enum { N = 4 };
  spw_disk_extent_t e[N];
  for (int i = 0; i < N; i++) ASSERT_OK(spw__disk_write_host(h.d, src, 4 * MIB, &e[i]));
  int due = 0;
  for (int i = 0; i < N; i++) due |= spw__disk_free(h.d, &e[i]);
  if (!due) {
    spw__disk_destroy(h.d);
    ops->destroy(be);
    free(src);
  }
  TEST_SKIP_IF(!due, "this file system does not preallocate (no fallocate): no sweep is due");
  test_sleep_ms(5); /* past quiet_ns: the next sweep call runs a step */
  pthread_t sweeper, writer;
  ASSERT_EQ(pthread_create(&sweeper, NULL, sweep_thread, &h), 0);
  pthread_mutex_lock(&h.mu);
  while (!h.in_step) pthread_cond_wait(&h.cv, &h.mu);
  pthread_mutex_unlock(&h.mu);
  ASSERT_EQ(pthread_create(&writer, NULL, write_thread, &h), 0);
  test_sleep_ms(100);
  pthread_mutex_lock(&h.mu);
  const int written_during_step = h.written;
  h.release = 1;
  pthread_cond_broadcast(&h.cv);
  pthread_mutex_unlock(&h.mu);
  pthread_join(sweeper, NULL);
  pthread_join(writer, NULL);
  ASSERT_EQ(written_during_step, 0);
  ASSERT_OK(h.write_status);
  ASSERT_TRUE(h.e.bytes >= 4 * MIB);
  (void)spw__disk_free(h.d, &h.e);
  spw__disk_destroy(h.d);
  ops->destroy(be);
  free(src);
}

/* Skips the whole run (77) when SPILLWAY_IO=uring and the kernel refuses io_uring: the
 * library then reports the disk tier unsupported. Any other failure is a failure. */
static void skip_if_uring_refused(void) {
  spw_stream_t s;
  spw_runtime_t *rt = open_disk(32 * MIB, 32 * MIB, &s);
  spw_buf_t b = filled(rt, s, 4096, 1);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_DISK));
  const int st = spw_wait_idle(rt);
  close_fixture();
  const char *io = getenv("SPILLWAY_IO");
  printf("SPILLWAY_IO=%s: disk tier %s\n", io ? io : "(unset)", spw_err_name(st));
  TEST_SKIP_IF(st == SPW_ERR_UNSUPPORTED && io && strcmp(io, "uring") == 0,
               "io_uring refused by this kernel");
  ASSERT_OK(st);
}

/* Issue 7: with the host and disk tiers both full, an allocation said "out of memory, 0 of
 * them locked". It now says where the bytes could not go, and nothing is lost: once buffers
 * are freed (every tier full means nothing can move: a buffer read back from disk needs a
 * device copy before its disk copy goes), work goes on. */
static void alloc_with_host_and_disk_full_says_the_disk_is_full(void) {
  make_dir(fx_dir, sizeof fx_dir, "disk");
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.spill_dir = fx_dir;
  cfg.device_limit = 2 * MIB;
  cfg.host_limit = 1 * MIB;
  cfg.disk_limit = 1 * MIB;
  cfg.host_device_bytes = 8 * MIB;
  cfg.high_watermark = 1.0; /* only the allocations spill */
  cfg.low_watermark = 0.9;
  spw_runtime_t *rt = fx_rt = test_runtime(&cfg);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  spw_buf_t b[5];
  for (int i = 0; i < 4; i++) b[i] = filled(rt, s, 1 * MIB, 70 + (uint64_t)i);
  ASSERT_STATUS(spw_alloc(rt, 1 * MIB, s, &b[4]), SPW_ERR_DISK_FULL);
  ASSERT_TRUE(strstr(spw_last_error(rt), "spilling to make room failed") != NULL);
  ASSERT_STATUS(spw_wait_idle(rt), SPW_ERR_DISK_FULL); /* the failed moves, reported */
  spw_stats_t st = stats_of(rt);
  ASSERT_UEQ(st.buffers, 4);
  ASSERT_UEQ(st.device_bytes, 2 * MIB);
  ASSERT_UEQ(st.host_bytes, 1 * MIB);
  ASSERT_UEQ(st.disk_bytes, 1 * MIB);
  ASSERT_OK(spw_free(rt, b[0]));
  ASSERT_OK(spw_free(rt, b[3]));
  b[4] = filled(rt, s, 1 * MIB, 74);
  for (int i = 1; i < 3; i++) expect_contents(rt, b[i], s, 1 * MIB, 70 + (uint64_t)i);
  expect_contents(rt, b[4], s, 1 * MIB, 74);
  for (int i = 1; i < 5; i++)
    if (i != 3) ASSERT_OK(spw_free(rt, b[i]));
}

static void setup(void) {
  seed0 = spw_test_seed();
  tmpl = malloc(MAX_BUF);
  ASSERT_TRUE(tmpl != NULL);
  test_fill(tmpl, MAX_BUF, seed0);
  skip_if_uring_refused();
}

static void teardown(void) { free(tmpl); }

static const spw_test_t tests[] = {
    TEST(buffers_go_device_host_disk_device_intact),
    TEST(spill_to_disk_tier_skips_the_host),
    TEST(spill_to_a_full_host_tier_goes_to_disk),
    TEST(four_threads_under_pressure_keep_contents),
    TEST(write_eio_keeps_buffer_on_host),
    TEST(write_eio_on_direct_spill_keeps_buffer_resident),
    TEST(read_eio_fails_acquire_and_keeps_buffer_on_disk),
    TEST(spill_file_is_invisible_and_leaves_no_trace),
    TEST(alloc_with_host_and_disk_full_says_the_disk_is_full),
    TEST(small_buffers_spilled_together_share_disk_requests),
    TEST(a_prefetch_of_buffers_on_every_tier_brings_back_host_and_disk_ones),
    TEST(acquire_n_reads_disk_buffers_as_one_batch),
    TEST(failed_write_in_a_batch_keeps_only_its_buffers_resident),
    TEST(failed_read_in_a_batch_keeps_only_its_buffers_on_disk),
    TEST(prefetch_larger_than_the_budget_brings_in_what_fits),
    TEST(freed_disk_space_goes_back_to_the_file_system),
    TEST(a_sweep_step_waits_until_the_disk_has_been_quiet),
    TEST(a_transfer_waits_for_a_running_sweep_step),
    TEST(enospc_on_small_tmpfs_keeps_buffers_on_host),
};
TEST_MAIN_HOOKS(tests, setup, teardown, NULL, close_fixture)
