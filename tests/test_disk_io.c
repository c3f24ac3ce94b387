/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the disk tier's I/O seam (spill/disk_io.c, io_uring.c, io_posix.c), run
 * once per implementation: io_uring (skipped, with a message, where the kernel refuses it)
 * and POSIX. The file is a real spill file (O_TMPFILE, O_DIRECT where allowed) in $TMPDIR
 * or /tmp; faults are injected at the point a transfer is issued, so the real completion
 * path carries them. */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "disk_io.h"
#include "spill_file.h"
#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- fixture ------------------------------------------------------------------------------ */

typedef struct sink {
  pthread_mutex_t mu;
  int n_log, n_err;
  char log[16][512];
  char err_name[16][32];
  char err_text[16][512];
} sink_t;

static void sink_log(void *ctx, int level, const char *msg) {
  (void)level;
  sink_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  if (s->n_log < 16) snprintf(s->log[s->n_log++], sizeof s->log[0], "%s", msg);
  pthread_mutex_unlock(&s->mu);
}

static void sink_error(void *ctx, const char *name, const char *text) {
  sink_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  if (s->n_err < 16) {
    snprintf(s->err_name[s->n_err], sizeof s->err_name[0], "%s", name);
    snprintf(s->err_text[s->n_err], sizeof s->err_text[0], "%s", text);
  }
  s->n_err++;
  pthread_mutex_unlock(&s->mu);
}

static int sink_logged(sink_t *s, const char *needle) {
  int c = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_log; i++)
    if (strstr(s->log[i], needle)) c++;
  pthread_mutex_unlock(&s->mu);
  return c;
}

/* The fixture of every test: a spill file in a directory of its own, an I/O object on it,
 * the sink of its messages, and what the test took from it (a buffer, an extent), all
 * released by fixture_close, which the driver runs after every test (close_fixture). */
typedef struct fixture {
  char dir[4096];
  spw_spill_file_t *file;
  spw_io_t *io;
  spw_io_kind_t kind;
  sink_t sink;
  char *buf;
  spw_disk_extent_t e;
  int has_e;
} fixture_t;

static void fixture_file(fixture_t *fx) {
  test_tmpdir(fx->dir, sizeof fx->dir, "disk-io");
  ASSERT_OK(spw__spill_file_open(fx->dir, 0, 64 * MiB, sink_log, &fx->sink, &fx->file));
}

/* Opens the spill file and an I/O object of `kind` on it, with `params` for the rest. */
static int fixture_open_with(fixture_t *fx, spw_io_kind_t kind, spw_io_params_t p) {
  memset(fx, 0, sizeof *fx);
  pthread_mutex_init(&fx->sink.mu, NULL);
  fx->kind = kind;
  fixture_file(fx);
  p.fd = spw__spill_file_fd(fx->file);
  p.kind = kind;
  p.log = sink_log;
  p.on_error = sink_error;
  p.ctx = &fx->sink;
  int st = spw__io_open(&p, &fx->io);
  if (st == SPW_OK && kind != SPW_IO_AUTO) ASSERT_EQ(spw__io_kind(fx->io), kind);
  return st;
}

static void fixture_open(fixture_t *fx, spw_io_kind_t kind) {
  spw_io_params_t p = {0};
  ASSERT_OK(fixture_open_with(fx, kind, p));
}

/* Idempotent: a test may close early (to skip, or to check what closing does). */
static void fixture_close(fixture_t *fx) {
  if (!fx->file) return;
  if (fx->io) spw__io_close(fx->io);
  if (fx->has_e) spw__spill_file_free(fx->file, &fx->e);
  spw__spill_file_close(fx->file);
  ASSERT_EQ(rmdir(fx->dir), 0);
  test_tmpdir_forget(fx->dir);
  free(fx->buf);
  memset(fx, 0, sizeof *fx);
}

static fixture_t fx;

static void close_fixture(void) { fixture_close(&fx); }

static void *aligned(size_t n) {
  void *p = NULL;
  ASSERT_EQ(posix_memalign(&p, 4096, n), 0);
  return p;
}

/* An extent of n bytes of the fixture's spill file, freed with it. */
static spw_disk_extent_t extent_of(uint64_t n) {
  ASSERT_TRUE(!fx.has_e);
  ASSERT_OK(spw__spill_file_alloc(fx.file, n, &fx.e));
  fx.has_e = 1;
  return fx.e;
}

/* The fixture on `kind`, with a 4 KiB-aligned buffer of n bytes (test_fill(seed) unless
 * seed is 0) and an extent of `extent` bytes of the spill file (fx.e), freed with it. */
static char *fixture_with(spw_io_kind_t kind, size_t n, uint64_t seed, size_t extent) {
  fixture_open(&fx, kind);
  fx.buf = aligned(n);
  if (seed) test_fill(fx.buf, n, seed);
  if (extent) (void)extent_of(extent);
  return fx.buf;
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Reaps exactly `n` completions, checks every tag in [0, n) came once with `want`.
 * idle_ok: other threads are still submitting, so nothing may be outstanding for a while
 * (reap then returns 0 rather than waiting for requests that do not exist yet). */
static void reap_all_(spw_io_t *io, unsigned n, int want, int idle_ok) {
  unsigned char *seen = calloc(n, 1);
  ASSERT_TRUE(seen != NULL);
  unsigned got = 0;
  spw_io_completion_t c[8];
  while (got < n) {
    int k = spw__io_reap(io, c, 8, 1);
    ASSERT_GE(k, 0);
    if (k == 0) {
      ASSERT_TRUE(idle_ok);
      sched_yield();
    }
    for (int i = 0; i < k; i++) {
      ASSERT_LT(c[i].tag, n);
      ASSERT_EQ(seen[c[i].tag], 0);
      seen[c[i].tag] = 1;
      ASSERT_STATUS(c[i].status, want);
    }
    got += (unsigned)k;
  }
  free(seen);
}
#define reap_all(io, n, want) reap_all_(io, n, want, 0)

/* ---- tests ------------------------------------------------------------------------------- */

static void test_random_writes_read_back(spw_io_kind_t kind) {
  fixture_open(&fx, kind);
  enum { N = 48 };
  void *buf[N];
  size_t len[N];
  uint64_t off[N], end = 0, rng = 0xC0FFEE;
  int order[N];
  for (int i = 0; i < N; i++) {
    /* 4 KiB .. 8 MiB, spread over the scales, both ends included; random gaps between. */
    size_t pages = i == 0 ? 1 : i == 1 ? 2048 : 1 + rng_next(&rng) % (1u << (rng_next(&rng) % 12));
    len[i] = pages * 4096;
    buf[i] = aligned(len[i]);
    test_fill(buf[i], len[i], (uint64_t)i);
    off[i] = end + (rng_next(&rng) % 16) * 4096;
    end = off[i] + len[i];
    order[i] = i;
  }
  for (int i = N - 1; i > 0; i--) {
    int j = (int)(rng_next(&rng) % (uint64_t)(i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  spw_disk_extent_t e = extent_of(end);
  /* All submitted before any is reaped: more than the queue holds. */
  for (int k = 0; k < N; k++) {
    int i = order[k];
    ASSERT_OK(spw__io_submit_write(fx.io, buf[i], len[i], e.off + off[i], -1, (uint64_t)i));
  }
  ASSERT_EQ(spw__io_inflight(fx.io), N);
  reap_all(fx.io, N, SPW_OK);
  ASSERT_EQ(spw__io_inflight(fx.io), 0);
  for (int i = 0; i < N; i++) memset(buf[i], 0, len[i]);
  for (int k = N - 1; k >= 0; k--) {
    int i = order[k];
    ASSERT_OK(spw__io_submit_read(fx.io, buf[i], len[i], e.off + off[i], -1, (uint64_t)i));
  }
  reap_all(fx.io, N, SPW_OK);
  for (int i = 0; i < N; i++) {
    ASSERT_EQ(test_first_mismatch(buf[i], len[i], (uint64_t)i), (size_t)-1);
    free(buf[i]);
  }
  ASSERT_EQ(fx.sink.n_err, 0);
}

static void test_fixed_buffers_write_and_read(spw_io_kind_t kind) {
  enum { SLOTS = 4 };
  size_t slot = 256 * KiB;
  char *staging[2];
  staging[0] = aligned(SLOTS * slot);
  staging[1] = aligned(SLOTS * slot);
  size_t lens[2] = {SLOTS * slot, SLOTS * slot};
  spw_io_params_t p = {0};
  p.fixed_bufs = (void *const *)staging;
  p.fixed_lens = lens;
  p.n_fixed = 2;
  p.queue_depth = 4;
  ASSERT_OK(fixture_open_with(&fx, kind, p));
  if (kind == SPW_IO_URING && sink_logged(&fx.sink, "staging buffers failed")) {
    fixture_close(&fx);
    free(staging[0]);
    free(staging[1]);
    TEST_SKIP_IF(1, "the kernel refused to register the staging buffers: fixed transfers not "
                    "exercised");
  }
  spw_disk_extent_t e = extent_of(2 * SLOTS * slot);
  /* Each slot of each buffer to its own place, through the registered index. */
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < SLOTS; s++) {
      uint64_t tag = (uint64_t)(b * SLOTS + s);
      test_fill(staging[b] + s * slot, slot, 100 + tag);
      ASSERT_OK(spw__io_submit_write(fx.io, staging[b] + s * slot, slot, e.off + tag * slot, b,
                                     tag));
    }
  reap_all(fx.io, 2 * SLOTS, SPW_OK);
  memset(staging[0], 0, lens[0]);
  memset(staging[1], 0, lens[1]);
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < SLOTS; s++) {
      uint64_t tag = (uint64_t)(b * SLOTS + s);
      ASSERT_OK(spw__io_submit_read(fx.io, staging[b] + s * slot, slot, e.off + tag * slot, b,
                                    tag));
    }
  reap_all(fx.io, 2 * SLOTS, SPW_OK);
  for (int b = 0; b < 2; b++)
    for (int s = 0; s < SLOTS; s++)
      ASSERT_EQ(test_first_mismatch(staging[b] + s * slot, slot, 100 + (uint64_t)(b * SLOTS + s)),
                (size_t)-1);
  /* The synchronous helpers find the registered buffer by themselves. */
  test_fill(staging[1], lens[1], 7);
  ASSERT_OK(spw__io_write_all(fx.io, staging[1], lens[1], e.off));
  memset(staging[1], 0, lens[1]);
  ASSERT_OK(spw__io_read_all(fx.io, staging[1], lens[1], e.off));
  ASSERT_EQ(test_first_mismatch(staging[1], lens[1], 7), (size_t)-1);
  /* An index that does not hold the buffer is refused. */
  ASSERT_STATUS(spw__io_submit_write(fx.io, staging[0], slot, e.off, 1, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_submit_write(fx.io, staging[0], slot, e.off, 2, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_submit_write(fx.io, staging[0] + 3 * slot, 2 * slot, e.off, 0, 0),
                SPW_ERR_INVALID_ARG);
  ASSERT_EQ(spw__io_inflight(fx.io), 0);
  fixture_close(&fx);
  free(staging[0]);
  free(staging[1]);
}

static void test_injected_eio_reaches_completion_and_next_works(spw_io_kind_t kind) {
  size_t n = 64 * KiB;
  char *buf = fixture_with(kind, n, 1, n);
  spw_disk_extent_t e = fx.e;
  spw__io_inject_fault(fx.io, SPW_ERR_IO, 1);
  ASSERT_OK(spw__io_submit_write(fx.io, buf, n, e.off, -1, 42));
  spw_io_completion_t c;
  ASSERT_EQ(spw__io_reap(fx.io, &c, 1, 1), 1);
  ASSERT_UEQ(c.tag, 42);
  ASSERT_STATUS(c.status, SPW_ERR_IO);
  ASSERT_EQ(fx.sink.n_err, 1);
  ASSERT_TRUE(strcmp(fx.sink.err_name[0], "EIO") == 0);
  ASSERT_TRUE(strstr(fx.sink.err_text[0], "injected") != NULL);
  /* The fault is used up: the same write now works, and the data is there. */
  ASSERT_OK(spw__io_submit_write(fx.io, buf, n, e.off, -1, 43));
  ASSERT_EQ(spw__io_reap(fx.io, &c, 1, 1), 1);
  ASSERT_STATUS(c.status, SPW_OK);
  /* A read fails the same way, through the synchronous helper. */
  spw__io_inject_fault(fx.io, SPW_ERR_IO, 1);
  memset(buf, 0, n);
  ASSERT_STATUS(spw__io_read_all(fx.io, buf, n, e.off), SPW_ERR_IO);
  ASSERT_EQ(fx.sink.n_err, 2);
  ASSERT_OK(spw__io_read_all(fx.io, buf, n, e.off));
  ASSERT_EQ(test_first_mismatch(buf, n, 1), (size_t)-1);
  ASSERT_EQ(spw__io_inflight(fx.io), 0);
}

static void test_injected_disk_full_reaches_completion_and_next_works(spw_io_kind_t kind) {
  size_t n = 128 * KiB;
  char *buf = fixture_with(kind, n, 0, 4 * n);
  spw_disk_extent_t e = fx.e;
  /* Two of four writes in flight fail; which two is up to the issue order. */
  spw__io_inject_fault(fx.io, SPW_ERR_DISK_FULL, 2);
  test_fill(buf, n, 9);
  for (uint64_t i = 0; i < 4; i++)
    ASSERT_OK(spw__io_submit_write(fx.io, buf, n, e.off + i * n, -1, i));
  spw_io_completion_t c[4];
  int got = 0, full = 0;
  while (got < 4) {
    int k = spw__io_reap(fx.io, c + got, 4 - (unsigned)got, 1);
    ASSERT_GT(k, 0);
    got += k;
  }
  for (int i = 0; i < 4; i++) {
    ASSERT_TRUE(c[i].status == SPW_OK || c[i].status == SPW_ERR_DISK_FULL);
    full += c[i].status == SPW_ERR_DISK_FULL;
  }
  ASSERT_EQ(full, 2);
  ASSERT_EQ(fx.sink.n_err, 2);
  ASSERT_TRUE(strcmp(fx.sink.err_name[0], "ENOSPC") == 0);
  ASSERT_OK(spw__io_write_all(fx.io, buf, n, e.off + 3 * n));
  memset(buf, 0, n);
  ASSERT_OK(spw__io_read_all(fx.io, buf, n, e.off + 3 * n));
  ASSERT_EQ(test_first_mismatch(buf, n, 9), (size_t)-1);
}

static void test_injected_short_transfers_complete(spw_io_kind_t kind) {
  size_t n = 1 * MiB;
  char *buf = fixture_with(kind, n, 5, n);
  spw_disk_extent_t e = fx.e;
  /* 1 MiB goes as 512 KiB, 256, 128, 64, 32 and the last 32: six transfers, one request. */
  spw__io_inject_fault(fx.io, 1, 5);
  ASSERT_OK(spw__io_submit_write(fx.io, buf, n, e.off, -1, 1));
  spw_io_completion_t c;
  ASSERT_EQ(spw__io_reap(fx.io, &c, 1, 1), 1);
  ASSERT_STATUS(c.status, SPW_OK);
  memset(buf, 0, n);
  spw__io_inject_fault(fx.io, 1, 3);
  ASSERT_OK(spw__io_read_all(fx.io, buf, n, e.off));
  ASSERT_EQ(test_first_mismatch(buf, n, 5), (size_t)-1);
  /* Shorts mixed into many requests in flight. */
  enum { N = 16 };
  size_t part = 64 * KiB;
  test_fill(buf, n, 6);
  spw__io_inject_fault(fx.io, 1, 20);
  for (uint64_t i = 0; i < N; i++)
    ASSERT_OK(spw__io_submit_write(fx.io, buf + i * part, part, e.off + i * part, -1, i));
  reap_all(fx.io, N, SPW_OK);
  memset(buf, 0, n);
  spw__io_inject_fault(fx.io, 1, 20);
  for (uint64_t i = 0; i < N; i++)
    ASSERT_OK(spw__io_submit_read(fx.io, buf + i * part, part, e.off + i * part, -1, i));
  reap_all(fx.io, N, SPW_OK);
  ASSERT_EQ(test_first_mismatch(buf, n, 6), (size_t)-1);
  ASSERT_EQ(fx.sink.n_err, 0);
}

static void test_read_past_end_of_file_fails_with_io_error(spw_io_kind_t kind) {
  size_t n = 64 * KiB;
  char *buf = fixture_with(kind, n, 0, 0);
  /* A real failure from the kernel, not an injected one: nothing there to read. */
  ASSERT_STATUS(spw__io_read_all(fx.io, buf, n, 1ull << 40), SPW_ERR_IO);
  ASSERT_EQ(fx.sink.n_err, 1);
  ASSERT_TRUE(strstr(fx.sink.err_text[0], "no progress") != NULL);
  ASSERT_EQ(spw__io_inflight(fx.io), 0);
}

static void test_write_past_max_file_size_is_disk_full(spw_io_kind_t kind) {
  size_t n = 64 * KiB;
  char *buf = fixture_with(kind, n, 3, 0);
  /* Past ext4's and xfs's largest file, far below INT64_MAX: the kernel says EFBIG. Where
   * it accepts the offset (tmpfs), there is nothing to check: the test skips. */
  uint64_t off = (uint64_t)1 << 62;
  int st = spw__io_write_all(fx.io, buf, n, off);
  TEST_SKIP_IF(st == SPW_OK, "this file system takes a write at 4 EiB: EFBIG not exercised");
  ASSERT_STATUS(st, SPW_ERR_DISK_FULL);
  ASSERT_EQ(fx.sink.n_err, 1);
  ASSERT_TRUE(strcmp(fx.sink.err_name[0], "EFBIG") == 0);
}

static void test_buffered_file_works(spw_io_kind_t kind) {
  /* The spill file is buffered where O_DIRECT is refused; the same calls must work. */
  memset(&fx, 0, sizeof fx);
  pthread_mutex_init(&fx.sink.mu, NULL);
  fixture_file(&fx);
  int fd = open(fx.dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  spw_io_params_t p = {0};
  p.fd = fd;
  p.kind = kind;
  p.on_error = sink_error;
  p.ctx = &fx.sink;
  ASSERT_OK(spw__io_open(&p, &fx.io));
  size_t n = 2 * MiB;
  char *buf = fx.buf = aligned(n);
  test_fill(buf, n, 21);
  spw__io_inject_fault(fx.io, 1, 4);
  ASSERT_OK(spw__io_write_all(fx.io, buf, n, 8 * MiB));
  memset(buf, 0, n);
  ASSERT_OK(spw__io_read_all(fx.io, buf, n, 8 * MiB));
  ASSERT_EQ(test_first_mismatch(buf, n, 21), (size_t)-1);
  memset(buf, 0, n);
  for (uint64_t i = 0; i < 8; i++)
    ASSERT_OK(spw__io_submit_read(fx.io, buf + i * (n / 8), n / 8, 8 * MiB + i * (n / 8), -1, i));
  reap_all(fx.io, 8, SPW_OK);
  ASSERT_EQ(test_first_mismatch(buf, n, 21), (size_t)-1);
  ASSERT_EQ(fx.sink.n_err, 0);
  spw__io_close(fx.io);
  fx.io = NULL;
  ASSERT_EQ(close(fd), 0);
}

static void test_bad_arguments_are_rejected(spw_io_kind_t kind) {
  fixture_open(&fx, kind);
  char *buf = fx.buf = aligned(8192);
  ASSERT_STATUS(spw__io_submit_write(fx.io, NULL, 4096, 0, -1, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_submit_write(fx.io, buf, 0, 0, -1, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_submit_read(NULL, buf, 4096, 0, -1, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_submit_read(fx.io, buf, 4096, UINT64_MAX - 4095, -1, 0),
                SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_submit_read(fx.io, buf, 4096, 0, 0, 0), SPW_ERR_INVALID_ARG);
  /* Misaligned buffer, length or offset: refused on every file system alike. */
  ASSERT_STATUS(spw__io_submit_write(fx.io, buf + 512, 4096, 0, -1, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_submit_write(fx.io, buf, 1000, 0, -1, 0), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__io_write_all(fx.io, buf, 4096, 100), SPW_ERR_INVALID_ARG);
  spw_io_completion_t c;
  ASSERT_STATUS(spw__io_reap(fx.io, NULL, 1, 0), SPW_ERR_INVALID_ARG);
  /* Nothing outstanding: reap returns at once instead of waiting forever. */
  ASSERT_EQ(spw__io_reap(fx.io, &c, 1, 1), 0);
  ASSERT_EQ(spw__io_reap(fx.io, &c, 1, 0), 0);
  ASSERT_EQ(spw__io_inflight(fx.io), 0);
  ASSERT_EQ(fx.sink.n_err, 0);
  spw_io_params_t p = {0};
  spw_io_t *io = NULL;
  p.fd = -1;
  ASSERT_STATUS(spw__io_open(&p, &io), SPW_ERR_INVALID_ARG);
  p.fd = spw__spill_file_fd(fx.file);
  p.kind = (spw_io_kind_t)7;
  ASSERT_STATUS(spw__io_open(&p, &io), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(io == NULL);
}

static void test_close_waits_for_requests_in_flight(spw_io_kind_t kind) {
  fixture_open(&fx, kind);
  enum { N = 40 };
  size_t n = 1 * MiB;
  char *buf = fx.buf = aligned(N * n);
  for (int i = 0; i < N; i++) test_fill(buf + (size_t)i * n, n, 1000 + (uint64_t)i);
  spw_disk_extent_t e = extent_of(N * n);
  for (uint64_t i = 0; i < N; i++)
    ASSERT_OK(spw__io_submit_write(fx.io, buf + i * n, n, e.off + i * n, -1, i));
  /* Close at once, nothing reaped; when it returns every write must be on the file. */
  spw__io_close(fx.io);
  fx.io = NULL;
  memset(buf, 0, N * n);
  int fd = spw__spill_file_fd(fx.file);
  for (size_t done = 0; done < N * n;) {
    ssize_t r = pread(fd, buf + done, N * n - done, (off_t)(e.off + done));
    ASSERT_GT(r, 0);
    done += (size_t)r;
  }
  for (int i = 0; i < N; i++)
    ASSERT_EQ(test_first_mismatch(buf + (size_t)i * n, n, 1000 + (uint64_t)i), (size_t)-1);
}

/* Threads that submit while another reaps, and threads using the synchronous helpers, all
 * on one spw_io_t: the completion of one thread's request may be seen by another. */
typedef struct mt {
  spw_io_t *io;
  spw_disk_extent_t e;
  char *buf;
  size_t n;
  unsigned first, count;
} mt_t;

static void *mt_submitter(void *arg) {
  mt_t *m = arg;
  for (unsigned i = m->first; i < m->first + m->count; i++)
    ASSERT_OK(spw__io_submit_write(m->io, m->buf + (size_t)i * m->n, m->n,
                                   m->e.off + (uint64_t)i * m->n, -1, i));
  return NULL;
}

static void *mt_reaper(void *arg) {
  mt_t *m = arg;
  reap_all_(m->io, m->count, SPW_OK, 1);
  return NULL;
}

static void *mt_sync(void *arg) {
  mt_t *m = arg;
  char *mine = m->buf + (size_t)m->first * m->n;
  for (int round = 0; round < 20; round++) {
    uint64_t seed = (uint64_t)m->first * 100 + (uint64_t)round;
    test_fill(mine, m->n, seed);
    ASSERT_OK(spw__io_write_all(m->io, mine, m->n, m->e.off + (uint64_t)m->first * m->n));
    memset(mine, 0, m->n);
    ASSERT_OK(spw__io_read_all(m->io, mine, m->n, m->e.off + (uint64_t)m->first * m->n));
    ASSERT_EQ(test_first_mismatch(mine, m->n, seed), (size_t)-1);
  }
  return NULL;
}

static void test_threads_submit_reap_and_wait_concurrently(spw_io_kind_t kind) {
  spw_io_params_t p = {0};
  p.queue_depth = 8; /* small, so submitters also meet a full ring */
  ASSERT_OK(fixture_open_with(&fx, kind, p));
  enum { PER = 64, SUBS = 2, SYNCS = 2 };
  size_t n = 64 * KiB;
  char *buf = fx.buf = aligned((SUBS * PER + SYNCS) * n);
  for (unsigned i = 0; i < SUBS * PER; i++) test_fill(buf + i * n, n, i);
  spw_disk_extent_t e = extent_of((SUBS * PER + SYNCS) * n);
  mt_t sub[SUBS], reaper = {fx.io, e, buf, n, 0, SUBS * PER}, syn[SYNCS];
  pthread_t ts[SUBS], tr, tsy[SYNCS];
  ASSERT_EQ(pthread_create(&tr, NULL, mt_reaper, &reaper), 0);
  for (unsigned i = 0; i < SUBS; i++) {
    sub[i] = (mt_t){fx.io, e, buf, n, i * PER, PER};
    ASSERT_EQ(pthread_create(&ts[i], NULL, mt_submitter, &sub[i]), 0);
  }
  for (unsigned i = 0; i < SYNCS; i++) {
    syn[i] = (mt_t){fx.io, e, buf, n, SUBS * PER + i, 1};
    ASSERT_EQ(pthread_create(&tsy[i], NULL, mt_sync, &syn[i]), 0);
  }
  for (unsigned i = 0; i < SUBS; i++) ASSERT_EQ(pthread_join(ts[i], NULL), 0);
  for (unsigned i = 0; i < SYNCS; i++) ASSERT_EQ(pthread_join(tsy[i], NULL), 0);
  ASSERT_EQ(pthread_join(tr, NULL), 0);
  ASSERT_EQ(spw__io_inflight(fx.io), 0);
  memset(buf, 0, SUBS * PER * n);
  ASSERT_OK(spw__io_read_all(fx.io, buf, SUBS * PER * n, e.off));
  for (unsigned i = 0; i < SUBS * PER; i++)
    ASSERT_EQ(test_first_mismatch(buf + i * n, n, i), (size_t)-1);
}

/* ---- io_uring refused: a seccomp filter answers io_uring_setup with EPERM, as container
 * runtimes do. Runs in a child process, since a filter cannot be removed. */

static int deny_io_uring(void) {
#ifdef __NR_io_uring_setup
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
#else
  return -1;
#endif
}

static void test_refused_io_uring_falls_back_or_is_unsupported(void) {
  fflush(stdout);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    if (deny_io_uring() != 0) _exit(TEST_SKIP);
    fixture_open(&fx, SPW_IO_AUTO);
    ASSERT_EQ(spw__io_kind(fx.io), SPW_IO_POSIX);
    ASSERT_EQ(sink_logged(&fx.sink, "io_uring refused (EPERM"), 1);
    size_t n = 64 * KiB;
    char *buf = aligned(n);
    test_fill(buf, n, 11);
    ASSERT_OK(spw__io_write_all(fx.io, buf, n, 0));
    memset(buf, 0, n);
    ASSERT_OK(spw__io_read_all(fx.io, buf, n, 0));
    ASSERT_EQ(test_first_mismatch(buf, n, 11), (size_t)-1);
    spw_io_params_t p = {0};
    spw_io_t *io = NULL;
    p.fd = spw__spill_file_fd(fx.file);
    p.kind = SPW_IO_URING;
    ASSERT_STATUS(spw__io_open(&p, &io), SPW_ERR_UNSUPPORTED);
    ASSERT_TRUE(io == NULL);
    free(buf);
    fixture_close(&fx);
    _exit(0);
  }
  int ws = 0;
  ASSERT_EQ(waitpid(pid, &ws, 0), pid);
  ASSERT_TRUE(WIFEXITED(ws));
  TEST_SKIP_IF(WEXITSTATUS(ws) == TEST_SKIP,
               "no seccomp here: the refused-io_uring fallback was not exercised");
  ASSERT_EQ(WEXITSTATUS(ws), 0);
}

/* ---- driver ------------------------------------------------------------------------------- */

/* Whether io_uring can be opened here; prints why not. */
static int uring_available_now(void) {
  spw_io_params_t p = {0};
  int st = fixture_open_with(&fx, SPW_IO_URING, p);
  if (st != SPW_OK) {
    printf("SKIP (uring half): io_uring refused here: %s%s%s\n", spw_err_name(st),
           fx.sink.n_log ? ": " : "", fx.sink.n_log ? fx.sink.log[0] : "");
    ASSERT_STATUS(st, SPW_ERR_UNSUPPORTED);
  }
  fixture_close(&fx);
  return st == SPW_OK;
}

static int uring_available(void) {
  static int known = -1;
  if (known < 0) known = uring_available_now();
  return known;
}

/* Every I/O test runs once per path; the io_uring half skips where io_uring is refused or
 * not built (uring_available says so once). */
#define URING_REFUSED "io_uring is refused here (or not built)"
#define ON_BOTH_PATHS(f)                                                                     \
  static void f##_uring(void) {                                                              \
    TEST_SKIP_IF(!uring_available(), URING_REFUSED);                                         \
    f(SPW_IO_URING);                                                                         \
  }                                                                                          \
  static void f##_posix(void) { f(SPW_IO_POSIX); }
ON_BOTH_PATHS(test_random_writes_read_back)
ON_BOTH_PATHS(test_fixed_buffers_write_and_read)
ON_BOTH_PATHS(test_injected_eio_reaches_completion_and_next_works)
ON_BOTH_PATHS(test_injected_disk_full_reaches_completion_and_next_works)
ON_BOTH_PATHS(test_injected_short_transfers_complete)
ON_BOTH_PATHS(test_read_past_end_of_file_fails_with_io_error)
ON_BOTH_PATHS(test_write_past_max_file_size_is_disk_full)
ON_BOTH_PATHS(test_buffered_file_works)
ON_BOTH_PATHS(test_bad_arguments_are_rejected)
ON_BOTH_PATHS(test_close_waits_for_requests_in_flight)
ON_BOTH_PATHS(test_threads_submit_reap_and_wait_concurrently)

/* Refusing io_uring only shows something where it would otherwise work (and is built). */
static void refused_io_uring_falls_back_or_is_unsupported(void) {
  TEST_SKIP_IF(!uring_available(), URING_REFUSED);
  test_refused_io_uring_falls_back_or_is_unsupported();
}

static const spw_test_t tests[] = {
    TEST(test_random_writes_read_back_uring),
    TEST(test_random_writes_read_back_posix),
    TEST(test_fixed_buffers_write_and_read_uring),
    TEST(test_fixed_buffers_write_and_read_posix),
    TEST(test_injected_eio_reaches_completion_and_next_works_uring),
    TEST(test_injected_eio_reaches_completion_and_next_works_posix),
    TEST(test_injected_disk_full_reaches_completion_and_next_works_uring),
    TEST(test_injected_disk_full_reaches_completion_and_next_works_posix),
    TEST(test_injected_short_transfers_complete_uring),
    TEST(test_injected_short_transfers_complete_posix),
    TEST(test_read_past_end_of_file_fails_with_io_error_uring),
    TEST(test_read_past_end_of_file_fails_with_io_error_posix),
    TEST(test_write_past_max_file_size_is_disk_full_uring),
    TEST(test_write_past_max_file_size_is_disk_full_posix),
    TEST(test_buffered_file_works_uring),
    TEST(test_buffered_file_works_posix),
    TEST(test_bad_arguments_are_rejected_uring),
    TEST(test_bad_arguments_are_rejected_posix),
    TEST(test_close_waits_for_requests_in_flight_uring),
    TEST(test_close_waits_for_requests_in_flight_posix),
    TEST(test_threads_submit_reap_and_wait_concurrently_uring),
    TEST(test_threads_submit_reap_and_wait_concurrently_posix),
    TEST(refused_io_uring_falls_back_or_is_unsupported),
};
TEST_MAIN_FIXTURE(tests, NULL, close_fixture)
