/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the private spill file (spill/spill_file.c): the file is anonymous and
 * private, extents are aligned and disjoint, freed space is reused, merged and punched, the
 * disk limit and a real ENOSPC (a small tmpfs) give SPW_ERR_DISK_FULL and change nothing,
 * and a file system without O_DIRECT or fallocate (ramfs) still works.
 * The tests that mount file systems need root; they run last, and without the permission
 * the program exits 77 after the others have passed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spill_file.h"
#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)

/* ---- helpers ---------------------------------------------------------------------------- */

typedef struct log_sink {
  pthread_mutex_t mu;
  int n;
  int level[32];
  char text[32][512];
} log_sink_t;

static void sink_log(void *ctx, int level, const char *msg) {
  log_sink_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  if (s->n < 32) {
    s->level[s->n] = level;
    snprintf(s->text[s->n], sizeof s->text[0], "%s", msg);
    s->n++;
  }
  pthread_mutex_unlock(&s->mu);
}

static void sink_init(log_sink_t *s) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
}

static int sink_count(log_sink_t *s, const char *needle) {
  int c = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n; i++)
    if (strstr(s->text[i], needle)) c++;
  pthread_mutex_unlock(&s->mu);
  return c;
}

static char *make_dir(void) {
  char *path = malloc(4096);
  ASSERT_TRUE(path != NULL);
  test_tmpdir(path, 4096, "spill-file");
  return path;
}

static void remove_dir(char *path) {
  ASSERT_EQ(rmdir(path), 0);
  test_tmpdir_forget(path);
  free(path);
}

static uint64_t file_size(spw_spill_file_t *f) {
  struct stat st;
  ASSERT_EQ(fstat(spw__spill_file_fd(f), &st), 0);
  return (uint64_t)st.st_size;
}

static uint64_t file_disk_bytes(spw_spill_file_t *f) {
  struct stat st;
  ASSERT_EQ(fstat(spw__spill_file_fd(f), &st), 0);
  return (uint64_t)st.st_blocks * 512;
}

static int cmp_ext(const void *a, const void *b) {
  const spw_disk_extent_t *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Every extent aligned, inside the file, disjoint from every other. */
static void check_disjoint(spw_spill_file_t *f, spw_disk_extent_t *e, size_t n) {
  size_t align = spw__spill_file_alignment(f);
  spw_disk_extent_t *s = malloc(n * sizeof *s);
  ASSERT_TRUE(s != NULL);
  memcpy(s, e, n * sizeof *s);
  qsort(s, n, sizeof *s, cmp_ext);
  uint64_t size = file_size(f), sum = 0;
  for (size_t i = 0; i < n; i++) {
    ASSERT_EQ(s[i].off % align, 0);
    ASSERT_EQ(s[i].bytes % align, 0);
    ASSERT_GT(s[i].bytes, 0);
    ASSERT_LE(s[i].off + s[i].bytes, size);
    if (i > 0) ASSERT_LE(s[i - 1].off + s[i - 1].bytes, s[i].off);
    sum += s[i].bytes;
  }
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), sum);
  free(s);
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_file_is_invisible_private_and_unlinked(void) {
  char *dir = make_dir();
  log_sink_t sink;
  sink_init(&sink);
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 0, sink_log, &sink, &f));
  ASSERT_EQ(test_dir_entries(dir), 0);
  struct stat st;
  ASSERT_EQ(fstat(spw__spill_file_fd(f), &st), 0);
  ASSERT_TRUE(S_ISREG(st.st_mode));
  ASSERT_EQ(st.st_mode & 07777, 0600);
  ASSERT_EQ(st.st_nlink, 0);
  /* Growing it (and thereby writing metadata) still leaves no name behind. */
  spw_disk_extent_t e;
  ASSERT_OK(spw__spill_file_alloc(f, 1, &e));
  ASSERT_EQ(test_dir_entries(dir), 0);
  ASSERT_GE(spw__spill_file_alignment(f), 4096);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_open_missing_or_non_directory_is_config_error(void) {
  log_sink_t sink;
  sink_init(&sink);
  spw_spill_file_t *f = NULL;
  ASSERT_STATUS(spw__spill_file_open("/nonexistent/spillway/dir", 0, 0, sink_log, &sink, &f),
                SPW_ERR_CONFIG);
  ASSERT_TRUE(f == NULL);
  ASSERT_EQ(sink_count(&sink, "/nonexistent/spillway/dir"), 1);
  ASSERT_STATUS(spw__spill_file_open("/etc/hostname", 0, 0, sink_log, &sink, &f), SPW_ERR_CONFIG);
  ASSERT_EQ(sink_count(&sink, "/etc/hostname"), 1);
  ASSERT_STATUS(spw__spill_file_open(NULL, 0, 0, sink_log, &sink, &f), SPW_ERR_CONFIG);
  ASSERT_STATUS(spw__spill_file_open("/tmp", 0, 0, NULL, NULL, NULL), SPW_ERR_INVALID_ARG);
}

static void test_extents_are_aligned_and_disjoint(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 4 * MiB, NULL, NULL, &f));
  enum { N = 200 };
  spw_disk_extent_t e[N];
  uint64_t rng = 0x1234567;
  size_t align = spw__spill_file_alignment(f);
  for (int i = 0; i < N; i++) {
    uint64_t want = 1 + rng_next(&rng) % (3 * MiB);
    ASSERT_OK(spw__spill_file_alloc(f, want, &e[i]));
    ASSERT_GE(e[i].bytes, want);
    ASSERT_LT(e[i].bytes - want, align);
  }
  check_disjoint(f, e, N);
  /* Free every other one, allocate again, still disjoint. */
  for (int i = 0; i < N; i += 2) spw__spill_file_free(f, &e[i]);
  for (int i = 0; i < N; i += 2) ASSERT_OK(spw__spill_file_alloc(f, 1 + rng_next(&rng) % MiB, &e[i]));
  check_disjoint(f, e, N);
  for (int i = 0; i < N; i++) spw__spill_file_free(f, &e[i]);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_freed_extent_is_reused_first_fit(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 16 * MiB, NULL, NULL, &f));
  spw_disk_extent_t a, b, c, d;
  ASSERT_OK(spw__spill_file_alloc(f, 1 * MiB, &a));
  ASSERT_OK(spw__spill_file_alloc(f, 2 * MiB, &b));
  ASSERT_OK(spw__spill_file_alloc(f, 1 * MiB, &c));
  uint64_t b_off = b.off, size = file_size(f);
  spw__spill_file_free(f, &b);
  ASSERT_UEQ(b.bytes, 0); /* freed extents are emptied */
  /* The hole left by b is the first fit for anything up to 2 MiB. */
  ASSERT_OK(spw__spill_file_alloc(f, 2 * MiB - 4096, &d));
  ASSERT_UEQ(d.off, b_off);
  ASSERT_UEQ(file_size(f), size);
  spw__spill_file_free(f, &a);
  spw__spill_file_free(f, &c);
  spw__spill_file_free(f, &d);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_freed_neighbours_coalesce(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  size_t al;
  /* A file of exactly four pages and no room to grow: a multi-page extent can only come
   * from merged free neighbours. */
  ASSERT_OK(spw__spill_file_open(dir, 4 * 4096, 4 * 4096, NULL, NULL, &f));
  al = spw__spill_file_alignment(f);
  if (al != 4096) {
    spw__spill_file_close(f);
    ASSERT_OK(spw__spill_file_open(dir, 4 * al, 4 * al, NULL, NULL, &f));
  }
  spw_disk_extent_t p[4], big;
  for (int i = 0; i < 4; i++) ASSERT_OK(spw__spill_file_alloc(f, al, &p[i]));
  ASSERT_STATUS(spw__spill_file_alloc(f, al, &big), SPW_ERR_DISK_FULL);
  uint64_t off0 = p[0].off;
  for (int i = 1; i < 4; i++) ASSERT_UEQ(p[i].off, p[i - 1].off + al);
  /* Merge with the previous neighbour (free 0 then 1), then with the next (3 then 2). */
  spw__spill_file_free(f, &p[0]);
  spw__spill_file_free(f, &p[1]);
  ASSERT_OK(spw__spill_file_alloc(f, 2 * al, &big));
  ASSERT_UEQ(big.off, off0);
  spw__spill_file_free(f, &p[3]);
  spw__spill_file_free(f, &p[2]);
  ASSERT_OK(spw__spill_file_alloc(f, 2 * al, &p[2]));
  ASSERT_UEQ(p[2].off, off0 + 2 * al);
  /* Both halves back: one extent of the whole file. */
  spw__spill_file_free(f, &big);
  spw__spill_file_free(f, &p[2]);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  ASSERT_OK(spw__spill_file_alloc(f, 4 * al, &big));
  ASSERT_UEQ(big.off, off0);
  spw__spill_file_free(f, &big);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_free_merges_both_sides(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 3 * 65536, 3 * 65536, NULL, NULL, &f));
  size_t al = 65536; /* a multiple of any alignment the file may report */
  spw_disk_extent_t p[3], all;
  for (int i = 0; i < 3; i++) ASSERT_OK(spw__spill_file_alloc(f, al, &p[i]));
  uint64_t off0 = p[0].off < p[2].off ? p[0].off : p[2].off;
  spw__spill_file_free(f, &p[0]);
  spw__spill_file_free(f, &p[2]);
  ASSERT_STATUS(spw__spill_file_alloc(f, 2 * al, &all), SPW_ERR_DISK_FULL);
  spw__spill_file_free(f, &p[1]); /* touches both free neighbours */
  ASSERT_OK(spw__spill_file_alloc(f, 3 * al, &all));
  ASSERT_UEQ(all.off, off0);
  spw__spill_file_free(f, &all);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_disk_limit_gives_disk_full_and_changes_nothing(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 1 * MiB, 256 * KiB, NULL, NULL, &f));
  spw_disk_extent_t e[8], x = {12345, 678};
  int n = 0;
  int st;
  while ((st = spw__spill_file_alloc(f, 192 * KiB, &e[n])) == SPW_OK) n++;
  ASSERT_STATUS(st, SPW_ERR_DISK_FULL);
  ASSERT_EQ(n, 5); /* 5 x 192 KiB fit in 1 MiB, a sixth does not */
  uint64_t in_use = spw__spill_file_bytes_in_use(f), size = file_size(f);
  ASSERT_LE(size, 1 * MiB);
  /* Whatever the size, a failing call leaves everything as it was, `out` included. */
  ASSERT_STATUS(spw__spill_file_alloc(f, 192 * KiB, &x), SPW_ERR_DISK_FULL);
  ASSERT_STATUS(spw__spill_file_alloc(f, 2 * MiB, &x), SPW_ERR_DISK_FULL);
  ASSERT_STATUS(spw__spill_file_alloc(f, UINT64_MAX, &x), SPW_ERR_DISK_FULL);
  ASSERT_UEQ(x.off, 12345);
  ASSERT_UEQ(x.bytes, 678);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), in_use);
  ASSERT_UEQ(file_size(f), size);
  /* The remaining 64 KiB are still there, and a freed extent comes back. */
  ASSERT_OK(spw__spill_file_alloc(f, 64 * KiB, &e[5]));
  ASSERT_STATUS(spw__spill_file_alloc(f, 4096, &x), SPW_ERR_DISK_FULL);
  spw__spill_file_free(f, &e[2]);
  ASSERT_OK(spw__spill_file_alloc(f, 192 * KiB, &e[2]));
  check_disjoint(f, e, 6);
  for (int i = 0; i < 6; i++) spw__spill_file_free(f, &e[i]);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_bad_arguments_are_rejected(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 1 * MiB, NULL, NULL, &f));
  spw_disk_extent_t e;
  ASSERT_STATUS(spw__spill_file_alloc(f, 0, &e), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__spill_file_alloc(f, 4096, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw__spill_file_alloc(NULL, 4096, &e), SPW_ERR_INVALID_ARG);
  spw__spill_file_free(f, NULL);
  spw__spill_file_free(NULL, &e);
  spw__spill_file_close(NULL);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  spw__spill_file_close(f);
  /* A limit below the alignment admits nothing (rather than meaning "no limit"). */
  ASSERT_OK(spw__spill_file_open(dir, 100, 0, NULL, NULL, &f));
  ASSERT_STATUS(spw__spill_file_alloc(f, 1, &e), SPW_ERR_DISK_FULL);
  ASSERT_UEQ(file_size(f), 0);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_double_free_is_ignored_and_logged(void) {
  char *dir = make_dir();
  log_sink_t sink;
  sink_init(&sink);
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 1 * MiB, sink_log, &sink, &f));
  spw_disk_extent_t a, b, copy, forged = {3, 4096};
  ASSERT_OK(spw__spill_file_alloc(f, 8192, &a));
  ASSERT_OK(spw__spill_file_alloc(f, 8192, &b));
  copy = a;
  spw__spill_file_free(f, &a);
  spw__spill_file_free(f, &copy); /* the same extent again */
  spw__spill_file_free(f, &forged);
  ASSERT_EQ(sink_count(&sink, "double free"), 2);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 8192);
  ASSERT_OK(spw__spill_file_alloc(f, 8192, &a));
  spw_disk_extent_t both[2] = {a, b};
  check_disjoint(f, both, 2);
  spw__spill_file_free(f, &a);
  spw__spill_file_free(f, &b);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_freed_space_is_punched(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 8 * MiB, NULL, NULL, &f));
  spw_disk_extent_t e;
  ASSERT_OK(spw__spill_file_alloc(f, 8 * MiB, &e));
  /* Preallocated: the blocks exist before anything is written. */
  ASSERT_GE(file_disk_bytes(f), 8 * MiB);
  ASSERT_EQ(spw__spill_file_free(f, &e), 1); /* a whole step came back: a sweep is due */
  ASSERT_GE(file_disk_bytes(f), 8 * MiB);     /* the free itself punched nothing */
  while (spw__spill_file_sweep(f, 1)) {
  }
  ASSERT_LT(file_disk_bytes(f), 1 * MiB);
  /* Reused, it is reserved again. */
  ASSERT_OK(spw__spill_file_alloc(f, 8 * MiB, &e));
  ASSERT_GE(file_disk_bytes(f), 8 * MiB);
  ASSERT_UEQ(file_size(f), 8 * MiB);
  spw__spill_file_free(f, &e);
  spw__spill_file_close(f);
  remove_dir(dir);
}

static void test_freed_space_stays_reserved_until_a_step_came_back(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 8 * MiB, NULL, NULL, &f));
  spw_disk_extent_t a, b;
  ASSERT_OK(spw__spill_file_alloc(f, 4 * MiB, &a));
  ASSERT_OK(spw__spill_file_alloc(f, 4 * MiB, &b));
  const uint64_t a_off = a.off;
  spw__spill_file_free(f, &a);
  ASSERT_GE(file_disk_bytes(f), 8 * MiB); /* half a step came back: still reserved */
  ASSERT_OK(spw__spill_file_alloc(f, 4 * MiB, &a));
  ASSERT_UEQ(a.off, a_off);
  ASSERT_GE(file_disk_bytes(f), 8 * MiB);
  ASSERT_EQ(spw__spill_file_free(f, &a), 0);
  ASSERT_EQ(spw__spill_file_sweep(f, 8), 0); /* none due: nothing punched */
  ASSERT_GE(file_disk_bytes(f), 8 * MiB);
  ASSERT_EQ(spw__spill_file_free(f, &b), 1); /* a whole step: due */
  while (spw__spill_file_sweep(f, 8)) {
  }
  ASSERT_LT(file_disk_bytes(f), 1 * MiB);
  ASSERT_UEQ(file_size(f), 8 * MiB);
  spw__spill_file_close(f);
  remove_dir(dir);
}

/* A sweep runs a few punches per call, so that whoever frees an extent meanwhile (a read
 * back) waits for a few punches at most, never for a whole sweep. */
static void test_sweep_is_bounded_per_step_and_finishes(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 1 * MiB, NULL, NULL, &f));
  enum { N = 64 };
  spw_disk_extent_t e[N];
  for (int i = 0; i < N; i++) ASSERT_OK(spw__spill_file_alloc(f, 64 * 1024, &e[i]));
  int due = 0;
  for (int i = 0; i < N; i += 2) due = spw__spill_file_free(f, &e[i]); /* 32 separate gaps */
  ASSERT_EQ(due, 1);
  const uint64_t before = file_disk_bytes(f);
  int steps = 0;
  uint64_t last = before;
  while (spw__spill_file_sweep(f, 4)) {
    steps++;
    const uint64_t now = file_disk_bytes(f);
    ASSERT_LT(now, last); /* every step gives something back */
    ASSERT_GE(now, before - (uint64_t)4 * 64 * 1024 * (uint64_t)steps); /* and no more than 4 */
    last = now;
    /* Allocation goes on between steps: a punched gap handed out is reserved again. */
    spw_disk_extent_t x;
    ASSERT_OK(spw__spill_file_alloc(f, 64 * 1024, &x));
    spw__spill_file_free(f, &x);
  }
  ASSERT_GE(steps, 32 / 4 - 1);
  ASSERT_LE(file_disk_bytes(f), before - 30 * 64 * 1024);
  for (int i = 1; i < N; i += 2) spw__spill_file_free(f, &e[i]);
  spw__spill_file_close(f);
  remove_dir(dir);
}

/* A step's punch covers at most 64 MiB: a transfer that starts during a step waits for a
 * bounded punch, not for a whole file's worth of freed space (on a file system mounted with
 * discard, a punch also discards its range). */
static void test_a_punch_covers_at_most_64_mib(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 256 * MiB, NULL, NULL, &f));
  spw_disk_extent_t e;
  ASSERT_OK(spw__spill_file_alloc(f, 256 * MiB, &e));
  ASSERT_GE(file_disk_bytes(f), 256 * MiB);
  ASSERT_EQ(spw__spill_file_free(f, &e), 1); /* one gap of 256 MiB */
  int steps = 0;
  uint64_t last = file_disk_bytes(f);
  for (int more = 1; more; steps++) {
    more = spw__spill_file_sweep(f, 1);
    const uint64_t now = file_disk_bytes(f);
    ASSERT_LT(now, last);
    /* One punch: 64 MiB at most. The block count also holds the file system's own
     * metadata: a punch that splits an extent can free an extent-tree block with it (seen
     * once: 64 MiB + 4 KiB), so a little slack, far below a second punch. */
    ASSERT_GE(now + 64 * MiB + 256 * 1024, last);
    last = now;
  }
  ASSERT_EQ(steps, 4);
  ASSERT_LT(last, 1 * MiB);
  spw__spill_file_close(f);
  remove_dir(dir);
}

/* Threads allocate and free at random; a page map claimed with atomic exchanges shows any
 * page handed out twice at once. */
typedef struct stress {
  spw_spill_file_t *f;
  _Atomic unsigned char *owner; /* one byte per alignment unit */
  uint64_t units;
  uint64_t seed;
} stress_t;

static void claim(stress_t *s, const spw_disk_extent_t *e, unsigned char v) {
  size_t al = spw__spill_file_alignment(s->f);
  for (uint64_t u = e->off / al; u < (e->off + e->bytes) / al; u++) {
    ASSERT_LT(u, s->units);
    unsigned char old = atomic_exchange(&s->owner[u], v);
    ASSERT_EQ(old, !v);
  }
}

static void *stress_thread(void *arg) {
  stress_t *s = arg;
  uint64_t rng = s->seed;
  spw_disk_extent_t held[16] = {{0, 0}};
  for (int it = 0; it < 3000; it++) {
    int k = (int)(rng_next(&rng) % 16);
    if (held[k].bytes) {
      claim(s, &held[k], 0);
      spw__spill_file_free(s->f, &held[k]);
    } else {
      int st = spw__spill_file_alloc(s->f, 1 + rng_next(&rng) % (256 * KiB), &held[k]);
      if (st == SPW_ERR_DISK_FULL) continue;
      ASSERT_OK(st);
      claim(s, &held[k], 1);
    }
  }
  for (int k = 0; k < 16; k++)
    if (held[k].bytes) {
      claim(s, &held[k], 0);
      spw__spill_file_free(s->f, &held[k]);
    }
  return NULL;
}

static void test_concurrent_alloc_free_never_overlaps(void) {
  char *dir = make_dir();
  spw_spill_file_t *f = NULL;
  uint64_t limit = 32 * MiB;
  ASSERT_OK(spw__spill_file_open(dir, limit, 2 * MiB, NULL, NULL, &f));
  stress_t s[4];
  pthread_t t[4];
  uint64_t units = limit / spw__spill_file_alignment(f);
  _Atomic unsigned char *owner = calloc(units, 1);
  ASSERT_TRUE(owner != NULL);
  for (int i = 0; i < 4; i++) {
    s[i] = (stress_t){f, owner, units, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)};
    ASSERT_EQ(pthread_create(&t[i], NULL, stress_thread, &s[i]), 0);
  }
  for (int i = 0; i < 4; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  ASSERT_LE(file_size(f), limit);
  /* Everything came back and merged: the whole file is one free extent again. */
  spw_disk_extent_t all;
  ASSERT_OK(spw__spill_file_alloc(f, file_size(f), &all));
  ASSERT_UEQ(all.off, 0);
  spw__spill_file_free(f, &all);
  free((void *)owner);
  spw__spill_file_close(f);
  remove_dir(dir);
}

/* ---- tests on mounted file systems (root only) --------------------------------------------- */

static int mount_fs(const char *dir, const char *type, const char *opts) {
  return mount(type, dir, type, MS_NOSUID | MS_NODEV, opts);
}

static void unmount_fs(const char *dir) {
  if (umount(dir) != 0) ASSERT_EQ(umount2(dir, MNT_DETACH), 0);
}

/* Runs fn(dir) in a child, so that a failed assertion cannot leave the file system
 * mounted: the parent unmounts whatever happened. Returns the child's wait status for
 * check_child, once the caller has cleaned up. */
static int run_mounted(void (*fn)(const char *), const char *dir) {
  fflush(stdout);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    fn(dir);
    fflush(stdout);
    _exit(0);
  }
  int ws = 0;
  ASSERT_EQ(waitpid(pid, &ws, 0), pid);
  unmount_fs(dir);
  return ws;
}

static void check_child(int ws) {
  ASSERT_TRUE(WIFEXITED(ws));
  ASSERT_EQ(WEXITSTATUS(ws), 0);
}

static void test_enospc_on_small_tmpfs(const char *dir) {
  log_sink_t sink;
  sink_init(&sink);
  spw_spill_file_t *f = NULL;
  /* Steps of 3 MiB on an 8 MiB file system: the third whole step cannot fit, and the
   * allocator must then take just what is missing. */
  ASSERT_OK(spw__spill_file_open(dir, 0, 3 * MiB, sink_log, &sink, &f));
  spw_disk_extent_t e[16], x = {77, 88};
  int n = 0, st;
  while (n < 16 && (st = spw__spill_file_alloc(f, 1 * MiB, &e[n])) == SPW_OK) n++;
  ASSERT_LT(n, 16);
  ASSERT_STATUS(st, SPW_ERR_DISK_FULL);
  ASSERT_GE(n, 7);
  uint64_t in_use = spw__spill_file_bytes_in_use(f), size = file_size(f);
  ASSERT_UEQ(in_use, (uint64_t)n * MiB);
  ASSERT_UEQ(size, (uint64_t)n * MiB);
  /* Failing again changes nothing. */
  ASSERT_STATUS(spw__spill_file_alloc(f, 1 * MiB, &x), SPW_ERR_DISK_FULL);
  ASSERT_UEQ(x.off, 77);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), in_use);
  ASSERT_UEQ(file_size(f), size);
  check_disjoint(f, e, (size_t)n);
  /* Space that comes back stays reserved: the file system gets nothing back yet ... */
  struct statvfs before, after;
  ASSERT_EQ(statvfs(dir, &before), 0);
  spw__spill_file_free(f, &e[n - 1]);
  spw__spill_file_free(f, &e[0]);
  ASSERT_EQ(statvfs(dir, &after), 0);
  ASSERT_LT((uint64_t)after.f_bfree * after.f_frsize,
            (uint64_t)before.f_bfree * before.f_frsize + 1 * MiB);
  /* ... until it is full: growing the freed tail by the 1 MiB missing for 2 MiB fails, so
   * what came back is punched out, and the growth tried again (the tail's punched blocks
   * reserved anew), which fills the file system again. */
  uint64_t tail_off = (uint64_t)(n - 1) * MiB;
  ASSERT_OK(spw__spill_file_alloc(f, 2 * MiB, &e[n - 1]));
  ASSERT_UEQ(e[n - 1].off, tail_off);
  ASSERT_UEQ(file_size(f), size + 1 * MiB);
  in_use = spw__spill_file_bytes_in_use(f);
  /* The free head cannot be reserved: no blocks left. Nothing changes. */
  ASSERT_STATUS(spw__spill_file_alloc(f, 1 * MiB, &x), SPW_ERR_DISK_FULL);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), in_use);
  ASSERT_UEQ(file_size(f), size + 1 * MiB);
  spw__spill_file_free(f, &e[n - 1]);
  ASSERT_OK(spw__spill_file_alloc(f, 1 * MiB, &e[0]));
  ASSERT_UEQ(e[0].off, 0);
  check_disjoint(f, e, (size_t)n - 1);
  for (int i = 0; i < n; i++) spw__spill_file_free(f, &e[i]);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  spw__spill_file_close(f);
}

/* A full file system while a step-by-step sweep is under way: the free space the sweep has
 * not reached yet is still reserved, and must be punched out (a whole sweep) before the
 * allocator reports ENOSPC, although nothing has come back since the sweep began. */
static void test_enospc_during_a_stepwise_sweep_sweeps_the_rest(const char *dir) {
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 1 * MiB, NULL, NULL, &f));
  enum { N = 64 };
  spw_disk_extent_t e[N];
  int n = 0, st = SPW_OK;
  while (n < N && (st = spw__spill_file_alloc(f, 256 * KiB, &e[n])) == SPW_OK) n++;
  ASSERT_LT(n, N);
  ASSERT_STATUS(st, SPW_ERR_DISK_FULL);
  ASSERT_GE(n, 16);
  /* Every other extent comes back: separate gaps, well over a step in all. */
  int due = 0;
  for (int i = 0; i < n; i += 2) due |= spw__spill_file_free(f, &e[i]);
  ASSERT_EQ(due, 1);
  ASSERT_EQ(spw__spill_file_sweep(f, 1), 1); /* one gap punched; the rest still reserved */
  /* No gap fits 1 MiB, and the file system has no room to grow by it until the gaps the
   * sweep has not reached are given back. */
  spw_disk_extent_t x;
  ASSERT_OK(spw__spill_file_alloc(f, 1 * MiB, &x));
  spw__spill_file_free(f, &x);
  for (int i = 1; i < n; i += 2) spw__spill_file_free(f, &e[i]);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  spw__spill_file_close(f);
}

/* ext4 keeps the blocks and the size a failed fallocate got before ENOSPC; the allocator
 * must cut the file back, so the failed step leaves no trace. */
static void test_enospc_on_small_ext4_leaves_file_unchanged(const char *dir) {
  log_sink_t sink;
  sink_init(&sink);
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 64 * MiB, sink_log, &sink, &f));
  spw_disk_extent_t e[32], x = {1, 2};
  /* The 64 MiB step fails; the 1 MiB actually needed fits. */
  ASSERT_OK(spw__spill_file_alloc(f, 1 * MiB, &e[0]));
  ASSERT_UEQ(file_size(f), 1 * MiB);
  ASSERT_LE(file_disk_bytes(f), 2 * MiB);
  int n = 1, st;
  while (n < 32 && (st = spw__spill_file_alloc(f, 1 * MiB, &e[n])) == SPW_OK) n++;
  ASSERT_LT(n, 32);
  ASSERT_STATUS(st, SPW_ERR_DISK_FULL);
  ASSERT_GE(n, 8);
  ASSERT_UEQ(file_size(f), (uint64_t)n * MiB);
  uint64_t blocks = file_disk_bytes(f);
  ASSERT_STATUS(spw__spill_file_alloc(f, 1 * MiB, &x), SPW_ERR_DISK_FULL);
  ASSERT_UEQ(file_size(f), (uint64_t)n * MiB);
  ASSERT_UEQ(file_disk_bytes(f), blocks);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), (uint64_t)n * MiB);
  check_disjoint(f, e, (size_t)n);
  /* Space given back by a free is found again. */
  spw__spill_file_free(f, &e[n / 2]);
  ASSERT_OK(spw__spill_file_alloc(f, 1 * MiB, &e[n / 2]));
  for (int i = 0; i < n; i++) spw__spill_file_free(f, &e[i]);
  spw__spill_file_close(f);
}

/* A 16 MiB ext4 on a loop device over a file in `scratch`, mounted on `dir`. Returns the
 * loop device's fd (>= 0), or -1 with a note when the tools or devices are missing. */
static int mount_small_ext4(const char *scratch, const char *dir) {
  char img[4200], cmd[4400], dev[64];
  snprintf(img, sizeof img, "%s.img", scratch);
  int fd = open(img, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)(16 * MiB)) != 0) {
    printf("note: cannot create %s: ext4 test not run\n", img);
    if (fd >= 0) close(fd);
    return -1;
  }
  snprintf(cmd, sizeof cmd, "mkfs.ext4 -q -F '%s' >/dev/null 2>&1", img);
  int ctl = -1, loop = -1;
  long n = -1;
  if (system(cmd) == 0 && (ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC)) >= 0 &&
      (n = ioctl(ctl, LOOP_CTL_GET_FREE)) >= 0) {
    snprintf(dev, sizeof dev, "/dev/loop%ld", n);
    loop = open(dev, O_RDWR | O_CLOEXEC);
    if (loop >= 0 && ioctl(loop, LOOP_SET_FD, fd) != 0) {
      close(loop);
      loop = -1;
    }
    if (loop >= 0 && mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV, NULL) != 0) {
      ioctl(loop, LOOP_CLR_FD, 0);
      close(loop);
      loop = -1;
    }
  }
  if (ctl >= 0) close(ctl);
  close(fd);
  unlink(img); /* the loop device holds the file open */
  if (loop < 0) printf("note: no mkfs.ext4 or loop device here: ext4 test not run\n");
  return loop;
}

static void test_ramfs_without_odirect_or_fallocate(const char *dir) {
  log_sink_t sink;
  sink_init(&sink);
  spw_spill_file_t *f = NULL;
  ASSERT_OK(spw__spill_file_open(dir, 0, 1 * MiB, sink_log, &sink, &f));
  ASSERT_EQ(test_dir_entries(dir), 0);
  ASSERT_EQ(spw__spill_file_is_direct(f), 0);
  ASSERT_EQ(sink_count(&sink, "O_DIRECT refused"), 1);
  spw_disk_extent_t e[4];
  for (int i = 0; i < 4; i++) ASSERT_OK(spw__spill_file_alloc(f, 700 * KiB, &e[i]));
  check_disjoint(f, e, 4);
  /* Buffered data goes in and comes back. */
  char buf[4096], back[4096];
  memset(buf, 0x5a, sizeof buf);
  ASSERT_EQ(pwrite(spw__spill_file_fd(f), buf, sizeof buf, (off_t)e[3].off), (ssize_t)sizeof buf);
  ASSERT_EQ(pread(spw__spill_file_fd(f), back, sizeof back, (off_t)e[3].off), (ssize_t)sizeof back);
  ASSERT_EQ(memcmp(buf, back, sizeof buf), 0);
  for (int i = 0; i < 4; i++) spw__spill_file_free(f, &e[i]);
  ASSERT_UEQ(spw__spill_file_bytes_in_use(f), 0);
  /* The fallbacks were reported once each, not per call. */
  ASSERT_LE(sink_count(&sink, "fallocate unsupported"), 1);
  spw__spill_file_close(f);
}

/* The tests that need small file systems of their own: a tmpfs (real ENOSPC), an ext4 on a
 * loop device, a ramfs (no O_DIRECT, no fallocate). Mounting needs root: skipped without it. */
static void full_and_unusual_file_systems(void) {
  char *dir = make_dir();
  if (mount_fs(dir, "tmpfs", "size=8m,mode=0700") != 0) {
    int e = errno;
    remove_dir(dir);
    TEST_SKIP_IF(1, e == EPERM ? "cannot mount a tmpfs: the ENOSPC and ramfs tests need root"
                                : "cannot mount a tmpfs here");
  }
  check_child(run_mounted(test_enospc_on_small_tmpfs, dir));
  ASSERT_EQ(mount_fs(dir, "tmpfs", "size=8m,mode=0700"), 0);
  check_child(run_mounted(test_enospc_during_a_stepwise_sweep_sweeps_the_rest, dir));
  int loop = mount_small_ext4(dir, dir);
  if (loop >= 0) {
    int ws = run_mounted(test_enospc_on_small_ext4_leaves_file_unchanged, dir);
    ASSERT_EQ(ioctl(loop, LOOP_CLR_FD, 0), 0);
    close(loop);
    check_child(ws);
  }
  if (mount_fs(dir, "ramfs", "mode=0700") == 0) {
    check_child(run_mounted(test_ramfs_without_odirect_or_fallocate, dir));
  } else {
    printf("note: ramfs not available (%s): O_DIRECT fallback not exercised\n", strerror(errno));
  }
  remove_dir(dir);
}

static const spw_test_t tests[] = {
    TEST(test_file_is_invisible_private_and_unlinked),
    TEST(test_open_missing_or_non_directory_is_config_error),
    TEST(test_extents_are_aligned_and_disjoint),
    TEST(test_freed_extent_is_reused_first_fit),
    TEST(test_freed_neighbours_coalesce),
    TEST(test_free_merges_both_sides),
    TEST(test_disk_limit_gives_disk_full_and_changes_nothing),
    TEST(test_bad_arguments_are_rejected),
    TEST(test_double_free_is_ignored_and_logged),
    TEST(test_freed_space_is_punched),
    TEST(test_sweep_is_bounded_per_step_and_finishes),
    TEST(test_a_punch_covers_at_most_64_mib),
    TEST(test_freed_space_stays_reserved_until_a_step_came_back),
    TEST(test_concurrent_alloc_free_never_overlaps),
    TEST(full_and_unusual_file_systems),
};
TEST_MAIN(tests)
