/* SPDX-License-Identifier: Apache-2.0 */
/* disk_bw: device -> disk and disk -> device throughput through Spillway's disk tier, next to
 * the raw disk measured in the same run.
 *
 * Raw: a file of its own in the spill directory (O_TMPFILE where possible, O_DIRECT where
 * the file system allows), preallocated, written and read through liburing directly: `qd`
 * requests in flight of `block` bytes from pinned memory (mmap + cudaHostRegister)
 * registered with io_uring as fixed buffers. Each block carries its number in its first and
 * last 8 bytes, checked on every read. If io_uring is refused (or the build has no
 * liburing), the io_uring row is skipped with the reason and pwrite/pread of the same blocks
 * (one at a time) is the raw row instead. The raw disk is measured twice globally: a file of
 * the large set's size written then read before Spillway starts (closed, its space freed,
 * before the runtime exists), and again once the runtime is gone.
 *
 * Brackets (option bracket=1, the default): this machine's virtual disk drifts within a run
 * (raw reads of 1.76 then 2.53 GB/s a minute apart), so the mean of the two global
 * measurements says little about the disk during a given pass. Each set therefore gets a raw
 * file of two regions of the set's bytes, created before its buffers exist, held open (ring
 * and pinned blocks too) while Spillway's copy of the set is on disk, and closed when the set
 * ends. Right before each timed read pass (prefetch, acquire_n) and right after its
 * synchronize the first region is read. Around each timed spill pass, the file's space is
 * freed and reserved anew (untimed), then the first region is written right before the pass
 * and the second right after its wait_idle: both land in fresh extents, as the global raw
 * write does (an overwrite skips the file system's extent conversion and would be a faster,
 * other baseline). The raw pass after comes before the pass's state checks and statistics,
 * so nothing runs between the two. A read's "ratio (brackets)" is to the mean of its own two
 * raw reads; the writes' is to the rate at which the raw disk, going at each spill's bracket
 * mean, would have written the set three times. The goal line uses these; the ratios to the
 * global mean stay in the table so both methods can be compared, and a second table lists
 * each pass's raw rates before and after.
 *
 * Spillway, for each set (cuda: 16 x 256 MiB, then 4096 x 64 KiB; host: 8 x 8 MiB, then
 * 1024 x 64 KiB): buffers are allocated and filled with the check pattern, then timed:
 *  - spill: spw_spill(all, DISK) + spw_wait_idle, three times (the write rate is over all);
 *  - read (prefetch): spw_prefetch(all) + spw_wait_idle + synchronize, after the first;
 *  - read (acquire_n): one writable spw_acquire_n of all + synchronize, after the second;
 *  - read (acquire, one by one): a writable spw_acquire of each + synchronize, after a
 *    third (not timed): each waits for its own read, so this is a latency, not a rate.
 * After each pass every buffer must be in the expected state (disk, then resident), and the
 * disk write byte counter must have grown by the set's bytes. A one-buffer spill to disk
 * beforehand opens the disk tier, so no timing pays for opening it. At the end of a set a
 * sample of buffers is compared word for word with the pattern; a wrong word or a raw block
 * with a wrong stamp (global or bracket) fails the run.
 *
 * Options (--NAME=VALUE or SPW_BENCH_NAME): spill-dir (also SPILLWAY_SPILL_DIR, else
 * $TMPDIR, else /tmp), buffers, buf-size, small-count, small-size, qd, block, bracket (0 or
 * 1). Nothing asserts on time; goal printed: >= 90% of raw both ways.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef SPW_BENCH_HAVE_URING
#include <liburing.h>
#endif

#include "bench_common.h"

/* ---- raw disk ----------------------------------------------------------------------------- */

/* How a raw file is driven, for the table. */
typedef struct raw_how {
  int uring;      /* io_uring (else pwrite/pread, one block at a time) */
  int fixed;      /* buffers registered with io_uring */
  int direct;     /* O_DIRECT */
  int renew;      /* brackets: each spill's raw writes go to space punched and reserved anew */
  char note[256]; /* why io_uring or registration was not used */
} raw_how_t;

/* A raw file open for timed passes, with its pinned blocks and, where the kernel allows, a
 * ring with the blocks registered. The global before/after measurements and the brackets
 * share it, so both see the disk through the same requests. */
typedef struct raw_file {
  const bench_env_t *env;
  int fd;
  uint8_t *buf;    /* qd blocks of pinned memory; slot i is fixed buffer i */
  unsigned qd;
  size_t block;
  uint64_t region; /* blocks per region: a pass covers one region at most */
  uint64_t blocks; /* the file's length: `regions` regions */
  uint64_t bad;    /* blocks read back with a wrong stamp, over all passes */
  raw_how_t how;
#ifdef SPW_BENCH_HAVE_URING
  struct io_uring ring; /* live while how.uring */
#endif
} raw_file_t;

typedef struct raw_disk {
  double write_gbs, read_gbs;
  raw_how_t how;
  uint64_t bad; /* blocks read back with a wrong stamp */
} raw_disk_t;

/* A file of our own in `dir`, anonymous, O_DIRECT when allowed; -errno on failure. */
static int open_raw_file(const char *dir, int *direct) {
  *direct = 1;
  int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  char path[4200];
  snprintf(path, sizeof path, "%s/.spw-bench-disk-XXXXXX", dir);
  fd = mkstemp(path);
  if (fd < 0) return -errno;
  unlink(path);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) *direct = 0;
  return fd;
}

static void stamp(uint8_t *blk, size_t block, uint64_t n) {
  memcpy(blk, &n, sizeof n);
  memcpy(blk + block - sizeof n, &n, sizeof n);
}

static int stamp_ok(const uint8_t *blk, size_t block, uint64_t n) {
  uint64_t a, b;
  memcpy(&a, blk, sizeof a);
  memcpy(&b, blk + block - sizeof b, sizeof b);
  return a == n && b == n;
}

/* Blocks [first, first + blocks), each stamped with its number in the file. */
static int posix_pass(int fd, uint8_t *buf, size_t block, uint64_t first, uint64_t blocks,
                      int write, uint64_t *bad) {
  for (uint64_t k = first; k < first + blocks; k++) {
    if (write) stamp(buf, block, k);
    size_t done = 0;
    while (done < block) {
      ssize_t r = write ? pwrite(fd, buf + done, block - done, (off_t)(k * block + done))
                        : pread(fd, buf + done, block - done, (off_t)(k * block + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        fprintf(stderr, "raw %s: %s\n", write ? "pwrite" : "pread", r < 0 ? strerror(errno) : "EOF");
        return SPW_ERR_IO;
      }
      done += (size_t)r;
    }
    if (!write && !stamp_ok(buf, block, k)) (*bad)++;
  }
  return SPW_OK;
}

#ifdef SPW_BENCH_HAVE_URING
/* Blocks [first, first + blocks) with `qd` in flight; slot i of `ring_buf` is fixed buffer
 * i. */
static int uring_pass(struct io_uring *ring, int fd, uint8_t *ring_buf, unsigned qd,
                      size_t block, uint64_t first, uint64_t blocks, int fixed, int write,
                      uint64_t *bad) {
  unsigned free_slots[1024], nfree = 0;
  for (unsigned i = 0; i < qd; i++) free_slots[nfree++] = qd - 1 - i;
  uint64_t next = first, done = 0;
  while (done < blocks) {
    unsigned queued = 0;
    while (nfree > 0 && next < first + blocks) {
      struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
      if (!sqe) break;
      unsigned slot = free_slots[--nfree];
      uint8_t *p = ring_buf + (size_t)slot * block;
      if (write) stamp(p, block, next);
      if (write && fixed)
        io_uring_prep_write_fixed(sqe, fd, p, (unsigned)block, next * block, (int)slot);
      else if (write)
        io_uring_prep_write(sqe, fd, p, (unsigned)block, next * block);
      else if (fixed)
        io_uring_prep_read_fixed(sqe, fd, p, (unsigned)block, next * block, (int)slot);
      else
        io_uring_prep_read(sqe, fd, p, (unsigned)block, next * block);
      io_uring_sqe_set_data64(sqe, next << 16 | slot);
      next++;
      queued++;
    }
    if (queued > 0) {
      int r = io_uring_submit(ring);
      if (r < 0) {
        fprintf(stderr, "raw io_uring_submit: %s\n", strerror(-r));
        return SPW_ERR_IO;
      }
    }
    struct io_uring_cqe *cqe;
    int r = io_uring_wait_cqe(ring, &cqe);
    if (r == -EINTR) continue;
    if (r < 0) {
      fprintf(stderr, "raw io_uring_wait_cqe: %s\n", strerror(-r));
      return SPW_ERR_IO;
    }
    do {
      uint64_t tag = io_uring_cqe_get_data64(cqe);
      int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      unsigned slot = (unsigned)(tag & 0xFFFF);
      uint64_t k = tag >> 16;
      if (res != (int)block) {
        /* A short transfer does not happen on a preallocated local file; treat it as the
         * error it would be here rather than complicate the ceiling's loop. */
        fprintf(stderr, "raw io_uring %s of block %" PRIu64 ": %s\n", write ? "write" : "read",
                k, res < 0 ? strerror(-res) : "short transfer");
        return SPW_ERR_IO;
      }
      if (!write && !stamp_ok(ring_buf + (size_t)slot * block, block, k)) (*bad)++;
      free_slots[nfree++] = slot;
      done++;
    } while (io_uring_peek_cqe(ring, &cqe) == 0);
  }
  return SPW_OK;
}
#endif

/* Safe on a partly opened file. The ring goes first: its exit waits out requests still in
 * flight after a failed pass, which may target the pinned blocks freed next. */
static void raw_close(raw_file_t *f) {
#ifdef SPW_BENCH_HAVE_URING
  if (f->how.uring) io_uring_queue_exit(&f->ring);
#endif
  f->how.uring = 0;
  bench_pinned_free(f->env, f->buf, (size_t)f->qd * f->block);
  f->buf = NULL;
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
}

/* A raw file of `regions` regions of `bytes` each (rounded up to whole blocks),
 * preallocated; nothing written yet. On failure everything is released. */
static int raw_open(const bench_env_t *env, const char *dir, uint64_t bytes, unsigned regions,
                    unsigned qd, size_t block, raw_file_t *f) {
  memset(f, 0, sizeof *f);
  f->env = env;
  f->qd = qd;
  f->block = block;
  f->region = (bytes + block - 1) / block;
  f->blocks = f->region * regions;
  f->fd = open_raw_file(dir, &f->how.direct);
  if (f->fd < 0) {
    fprintf(stderr, "raw: cannot create a file in '%s': %s\n", dir, strerror(-f->fd));
    f->fd = -1;
    return SPW_ERR_IO;
  }
  if (fallocate(f->fd, 0, 0, (off_t)(f->blocks * block)) == 0) {
    f->how.renew = 1;
  } else if (errno != EOPNOTSUPP) {
    int e = errno;
    fprintf(stderr, "raw: fallocate of %" PRIu64 " bytes in '%s': %s\n", f->blocks * block, dir,
            strerror(e));
    raw_close(f);
    return e == ENOSPC ? SPW_ERR_DISK_FULL : SPW_ERR_IO;
  }
  int st = bench_pinned_alloc(env, (size_t)qd * block, (void **)&f->buf);
  if (st != SPW_OK) {
    f->buf = NULL;
    raw_close(f);
    return st;
  }
#ifdef SPW_BENCH_HAVE_URING
  int r = io_uring_queue_init(qd, &f->ring, 0);
  if (r == 0) {
    f->how.uring = 1;
    struct iovec iov[1024];
    for (unsigned i = 0; i < qd; i++) iov[i] = (struct iovec){f->buf + (size_t)i * block, block};
    int rr = io_uring_register_buffers(&f->ring, iov, qd);
    f->how.fixed = rr == 0;
    if (rr != 0)
      snprintf(f->how.note, sizeof f->how.note,
               "buffer registration refused (%s): plain reads/writes", strerror(-rr));
  } else {
    snprintf(f->how.note, sizeof f->how.note, "io_uring refused (%s): raw row is pwrite/pread",
             strerror(-r));
  }
#else
  snprintf(f->how.note, sizeof f->how.note, "built without liburing: raw row is pwrite/pread");
#endif
  return SPW_OK;
}

/* One timed pass over the first `bytes` of region `reg`, rounded up to whole blocks: writes
 * stamp every block, reads check every stamp into f->bad. *gbs is over the blocks moved. */
static int raw_pass(raw_file_t *f, unsigned reg, uint64_t bytes, int write, double *gbs) {
  uint64_t blocks = (bytes + f->block - 1) / f->block, first = (uint64_t)reg * f->region;
  if (blocks > f->region || first + blocks > f->blocks) {
    fprintf(stderr, "raw: a pass of %" PRIu64 " blocks from block %" PRIu64 " over a file of %"
            PRIu64 "\n", blocks, first, f->blocks);
    return SPW_ERR_INVALID_ARG;
  }
  int st = SPW_OK, done = 0;
  double t0 = bench_now();
#ifdef SPW_BENCH_HAVE_URING
  if (f->how.uring) {
    st = uring_pass(&f->ring, f->fd, f->buf, f->qd, f->block, first, blocks, f->how.fixed,
                    write, &f->bad);
    done = 1;
  }
#endif
  if (!done) st = posix_pass(f->fd, f->buf, f->block, first, blocks, write, &f->bad);
  double t = bench_now() - t0;
  if (st == SPW_OK) *gbs = bench_gbs(blocks * f->block, t);
  return st;
}

/* Frees the whole file's space and reserves it again, so the next writes land in freshly
 * allocated, unwritten extents, as the global raw write does: an overwrite of written blocks
 * skips the file system's extent conversion and is faster (up to 2x on ext4 here), which
 * would hold Spillway's spills to another task than the global ratio's. Where the file
 * system cannot punch, f->how.renew goes to 0 and the writes overwrite. */
static int raw_renew(raw_file_t *f) {
  if (!f->how.renew) return SPW_OK;
  const off_t len = (off_t)(f->blocks * f->block);
  int r;
  do r = fallocate(f->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, len);
  while (r != 0 && errno == EINTR);
  if (r != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
    f->how.renew = 0;
    return SPW_OK;
  }
  if (r == 0) {
    do r = fallocate(f->fd, 0, 0, len);
    while (r != 0 && errno == EINTR);
  }
  if (r != 0) {
    int e = errno;
    fprintf(stderr, "raw: renewing the bracket file's %lld bytes: %s\n", (long long)len,
            strerror(e));
    return e == ENOSPC ? SPW_ERR_DISK_FULL : SPW_ERR_IO;
  }
  return SPW_OK;
}

/* The global measurement: a file of its own, written once then read once, closed (its space
 * freed) before returning. */
static int raw_disk(const bench_env_t *env, const char *dir, uint64_t bytes, unsigned qd,
                    size_t block, raw_disk_t *out) {
  memset(out, 0, sizeof *out);
  raw_file_t f;
  int st = raw_open(env, dir, bytes, 1, qd, block, &f);
  if (st != SPW_OK) return st;
  st = raw_pass(&f, 0, bytes, 1, &out->write_gbs);
  if (st == SPW_OK) st = raw_pass(&f, 0, bytes, 0, &out->read_gbs);
  out->how = f.how;
  out->bad = f.bad;
  raw_close(&f);
  return st;
}

static void raw_describe(const raw_how_t *h, unsigned qd, size_t block, char *out, size_t len) {
  char blk[32];
  bench_fmt_size(block, blk, sizeof blk);
  snprintf(out, len, "%s%s, QD %u, %s blocks%s", h->uring ? "io_uring" : "pwrite/pread",
           h->direct ? " O_DIRECT" : " buffered", h->uring ? qd : 1, blk,
           h->uring && h->fixed ? ", registered pinned buffers" : "");
}

/* ---- Spillway ----------------------------------------------------------------------------- */

/* The timed passes of a set that have brackets, in the order they run. */
enum { PASS_SPILL1, PASS_PREFETCH, PASS_SPILL2, PASS_ACQUIRE_N, PASS_SPILL3, PASS_COUNT };
static const char *const pass_name[PASS_COUNT] = {"spill 1 (write)", "read (prefetch)",
                                                  "spill 2 (write)", "read (acquire_n)",
                                                  "spill 3 (write)"};

typedef struct set_result {
  size_t count;
  uint64_t size;
  double write_gbs, prefetch_gbs, acquire_n_gbs, acquire_gbs;
  double write_reqs, read_reqs; /* disk requests per buffer, in the first write and read */
  uint64_t bad;
  unsigned anomalies;
  /* Per bracketed pass: Spillway's GB/s, and the raw disk's (a write beside a spill, a read
   * beside a read) right before and right after it; raw ones stay 0 without brackets. */
  double pass_gbs[PASS_COUNT], raw_before[PASS_COUNT], raw_after[PASS_COUNT];
  int bracketed;
  raw_how_t br_how;
  uint64_t raw_bad; /* bracket blocks read back with a wrong stamp */
} set_result_t;

static void anomaly(set_result_t *r, const char *what, uint64_t n) {
  char sz[32];
  bench_fmt_size(r->size, sz, sizeof sz);
  fprintf(stderr, "disk_bw: %zu x %s: %s (%" PRIu64 ")\n", r->count, sz, what, n);
  r->anomalies++;
}

/* The bracket file's regions: a spill's raw write before it goes to the first, the one after
 * it to the second, both renewed beforehand; reads read the first. */
enum { REG_BEFORE, REG_AFTER, REG_COUNT };

/* A raw pass of the set's bytes beside a Spillway pass; nothing without brackets. */
static int beside(raw_file_t *br, unsigned reg, uint64_t bytes, int write, double *gbs) {
  return br ? raw_pass(br, reg, bytes, write, gbs) : SPW_OK;
}

/* spill(all, DISK) + wait_idle, between its raw writes when `br`; checks the end state and
 * the bytes written. */
static int spill_to_disk(spw_runtime_t *rt, const spw_buf_t *b, size_t n, set_result_t *r,
                         raw_file_t *br, int pass, double *seconds) {
  const uint64_t ws = (uint64_t)n * r->size;
  spw_stats_t s0, s1;
  int st = bench_get_stats(rt, &s0);
  if (st == SPW_OK && br) st = raw_renew(br);
  if (st == SPW_OK) st = beside(br, REG_BEFORE, ws, 1, &r->raw_before[pass]);
  double t0 = bench_now();
  for (size_t i = 0; i < n && st == SPW_OK; i++)
    if ((st = spw_spill(rt, b[i], SPW_TIER_DISK)) != SPW_OK) bench_fail(rt, "spw_spill", st);
  if (st == SPW_OK && (st = spw_wait_idle(rt)) != SPW_OK) bench_fail(rt, "spw_wait_idle", st);
  *seconds = bench_now() - t0;
  /* Before the statistics and the state checks, so nothing runs between the two. */
  if (st == SPW_OK) st = beside(br, REG_AFTER, ws, 1, &r->raw_after[pass]);
  if (st == SPW_OK) st = bench_get_stats(rt, &s1);
  if (st != SPW_OK) return st;
  size_t off = bench_count_not_in(rt, b, n, SPW_STATE_DISK);
  if (off) anomaly(r, "buffers not on disk after the timed spill", off);
  uint64_t wrote = s1.disk_write_bytes - s0.disk_write_bytes;
  if (wrote != (uint64_t)n * r->size) anomaly(r, "disk write counter did not grow by the set", wrote);
  return SPW_OK;
}

/* `br`, when not NULL, is the set's bracket file; the first spill's raw writes fill it before
 * any raw read. */
static int run_set(const bench_env_t *env, spw_runtime_t *rt, spw_stream_t s, size_t n,
                   uint64_t size, uint32_t seed0, raw_file_t *br, set_result_t *r) {
  memset(r, 0, sizeof *r);
  r->count = n;
  r->size = size;
  const uint64_t ws = (uint64_t)n * size;
  spw_buf_t *b = calloc(n, sizeof *b);
  if (!b) return SPW_ERR_SYSTEM;
  int st = SPW_OK;
  size_t made = 0;
  for (; made < n && st == SPW_OK; made++)
    if ((st = bench_alloc_filled(env, rt, size, seed0 + (uint32_t)made, s, &b[made])) != SPW_OK)
      break;
  int sst = spw_stream_synchronize(rt, s);
  if (st == SPW_OK && sst != SPW_OK) st = bench_fail(rt, "spw_stream_synchronize (fill)", sst);

  /* Each bracket's second raw pass runs right after the pass's last wait (wait_idle or
   * synchronize), before its state checks and statistics: nothing runs between them. */
  double tw1 = 0, tw2 = 0, tw3 = 0, tr1 = 0, tr2 = 0, tr3 = 0;
  spw_stats_t q0, q1, q2;
  if (st == SPW_OK) st = bench_get_stats(rt, &q0);
  if (st == SPW_OK) st = spill_to_disk(rt, b, n, r, br, PASS_SPILL1, &tw1);
  if (st == SPW_OK) st = bench_get_stats(rt, &q1);
  if (st == SPW_OK) st = beside(br, REG_BEFORE, ws, 0, &r->raw_before[PASS_PREFETCH]);
  if (st == SPW_OK) {
    double t0 = bench_now();
    for (size_t i = 0; i < n && st == SPW_OK; i++)
      if ((st = spw_prefetch(rt, b[i], s)) != SPW_OK) bench_fail(rt, "spw_prefetch", st);
    if (st == SPW_OK && (st = spw_wait_idle(rt)) != SPW_OK) bench_fail(rt, "spw_wait_idle", st);
    if (st == SPW_OK && (st = spw_stream_synchronize(rt, s)) != SPW_OK)
      bench_fail(rt, "spw_stream_synchronize", st);
    tr1 = bench_now() - t0;
    if (st == SPW_OK) st = beside(br, REG_BEFORE, ws, 0, &r->raw_after[PASS_PREFETCH]);
    size_t off = st == SPW_OK ? bench_count_not_in(rt, b, n, SPW_STATE_RESIDENT) : 0;
    if (off) anomaly(r, "buffers not resident after the timed prefetch", off);
  }
  if (st == SPW_OK) st = bench_get_stats(rt, &q2);
  if (st == SPW_OK) {
    r->write_reqs = (double)(q1.disk_requests - q0.disk_requests) / (double)n;
    r->read_reqs = (double)(q2.disk_requests - q1.disk_requests) / (double)n;
  }
  if (st == SPW_OK) st = spill_to_disk(rt, b, n, r, br, PASS_SPILL2, &tw2);
  void **d = st == SPW_OK ? malloc(n * sizeof *d) : NULL;
  if (st == SPW_OK && !d) st = SPW_ERR_SYSTEM;
  if (st == SPW_OK) st = beside(br, REG_BEFORE, ws, 0, &r->raw_before[PASS_ACQUIRE_N]);
  if (st == SPW_OK) {
    double t0 = bench_now();
    if ((st = spw_acquire_n(rt, b, n, s, 0, d)) != SPW_OK) bench_fail(rt, "spw_acquire_n", st);
    sst = spw_stream_synchronize(rt, s);
    if (st == SPW_OK && sst != SPW_OK) st = bench_fail(rt, "spw_stream_synchronize", sst);
    tr2 = bench_now() - t0;
    if (st == SPW_OK) st = beside(br, REG_BEFORE, ws, 0, &r->raw_after[PASS_ACQUIRE_N]);
    size_t off = st == SPW_OK ? bench_count_not_in(rt, b, n, SPW_STATE_RESIDENT) : 0;
    if (off) anomaly(r, "buffers not resident after the timed acquire_n", off);
  } /* the synchronize released the locks */
  free(d);
  if (st == SPW_OK) st = spill_to_disk(rt, b, n, r, br, PASS_SPILL3, &tw3);
  if (st == SPW_OK) {
    double t0 = bench_now();
    for (size_t i = 0; i < n && st == SPW_OK; i++) {
      void *p;
      if ((st = spw_acquire(rt, b[i], s, 0, &p)) != SPW_OK) bench_fail(rt, "spw_acquire", st);
    }
    sst = spw_stream_synchronize(rt, s);
    if (st == SPW_OK && sst != SPW_OK) st = bench_fail(rt, "spw_stream_synchronize", sst);
    tr3 = bench_now() - t0;
    size_t off = st == SPW_OK ? bench_count_not_in(rt, b, n, SPW_STATE_RESIDENT) : 0;
    if (off) anomaly(r, "buffers not resident after the timed acquire", off);
  }
  /* The sample, read back after three round trips through the disk. */
  for (size_t k = 0; k < 9 && st == SPW_OK; k++) {
    size_t i = n <= 9 ? k % n : (n - 1) * k / 8;
    uint64_t bad = 0;
    st = bench_verify(rt, b[i], size, seed0 + (uint32_t)i, 0, s, &bad);
    r->bad += bad;
  }
  for (size_t i = 0; i < made; i++) spw_free(rt, b[i]);
  free(b);
  int wst = spw_wait_idle(rt);
  if (st == SPW_OK && wst != SPW_OK) st = bench_fail(rt, "spw_wait_idle (free)", wst);
  if (st != SPW_OK) return st;
  r->write_gbs = bench_gbs(3 * ws, tw1 + tw2 + tw3);
  r->prefetch_gbs = bench_gbs(ws, tr1);
  r->acquire_n_gbs = bench_gbs(ws, tr2);
  r->acquire_gbs = bench_gbs(ws, tr3);
  r->pass_gbs[PASS_SPILL1] = bench_gbs(ws, tw1);
  r->pass_gbs[PASS_PREFETCH] = r->prefetch_gbs;
  r->pass_gbs[PASS_SPILL2] = bench_gbs(ws, tw2);
  r->pass_gbs[PASS_ACQUIRE_N] = r->acquire_n_gbs;
  r->pass_gbs[PASS_SPILL3] = bench_gbs(ws, tw3);
  return SPW_OK;
}

/* A set, with its bracket file around it when `bracket`: two regions of the set's bytes,
 * created before the set's buffers exist, kept open (ring, pinned blocks) while the set's
 * data is on disk, closed (its space freed) once the set is done. It is not filled ahead:
 * every spill renews it before its first raw write, and the first raw read comes after the
 * first spill's raw writes, so a fill would only be punched away. */
static int measure_set(const bench_env_t *env, spw_runtime_t *rt, spw_stream_t s, size_t n,
                       uint64_t size, uint32_t seed0, const char *dir, unsigned qd,
                       size_t block, int bracket, set_result_t *r) {
  const uint64_t ws = (uint64_t)n * size;
  raw_file_t bf;
  raw_file_t *br = NULL;
  int st = SPW_OK;
  if (bracket && (st = raw_open(env, dir, ws, REG_COUNT, qd, block, &bf)) == SPW_OK) br = &bf;
  if (st == SPW_OK) st = run_set(env, rt, s, n, size, seed0, br, r);
  if (br) {
    r->bracketed = 1;
    r->br_how = bf.how;
    r->raw_bad = bf.bad;
    raw_close(&bf);
  }
  return st;
}

/* Opens the disk tier with one small buffer, so that no timed pass pays for it. */
static int open_disk_tier(const bench_env_t *env, spw_runtime_t *rt, spw_stream_t s) {
  spw_buf_t b;
  int st = bench_alloc_filled(env, rt, BENCH_MIB, 1, s, &b);
  if (st != SPW_OK) return st;
  if ((st = spw_stream_synchronize(rt, s)) != SPW_OK) bench_fail(rt, "spw_stream_synchronize", st);
  if (st == SPW_OK && (st = spw_spill(rt, b, SPW_TIER_DISK)) != SPW_OK) bench_fail(rt, "spw_spill", st);
  if (st == SPW_OK && (st = spw_wait_idle(rt)) != SPW_OK)
    bench_fail(rt, "spw_wait_idle (opening the disk tier)", st);
  spw_state_t where = SPW_STATE_RESIDENT;
  if (st == SPW_OK && (spw_buf_state(rt, b, &where) != SPW_OK || where != SPW_STATE_DISK)) {
    fprintf(stderr, "disk_bw: a buffer spilled to disk did not get there (state %d)\n", where);
    st = SPW_ERR_IO;
  }
  spw_free(rt, b);
  return st;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static double bracket_mean(const set_result_t *r, int pass) {
  return (r->raw_before[pass] + r->raw_after[pass]) / 2;
}

/* The raw rate the three spills together are held to: the rate at which the raw disk, going
 * at each spill's bracket mean, would have written the set three times. Spillway's write
 * rate is over the three passes' total time, so a slow moment weighs by its time in both. */
static double bracket_write_gbs(const set_result_t *r) {
  static const int spills[3] = {PASS_SPILL1, PASS_SPILL2, PASS_SPILL3};
  double inv = 0;
  for (int k = 0; k < 3; k++) {
    double m = bracket_mean(r, spills[k]);
    if (m <= 0) return 0;
    inv += 1 / m;
  }
  return 3 / inv;
}

/* A bracketed ratio for the table, "-" without brackets. */
static const char *fmt_ratio(int on, double v, char *buf, size_t len) {
  if (!on) return "-";
  snprintf(buf, len, "%.2f", v);
  return buf;
}

int main(int argc, char **argv) {
  static const char *const known[] = {"spill-dir", "buffers", "buf-size", "small-count",
                                      "small-size", "qd", "block", "bracket", NULL};
  bench_env_t env;
  if (bench_opt_check(argc, argv, known) != SPW_OK || bench_env_init(&env) != SPW_OK) return 2;
  const int cuda = env.kind == SPW_BACKEND_CUDA;
  const char *dir = getenv("SPILLWAY_SPILL_DIR");
  if (!dir || !*dir) dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  bench_opt_str(argc, argv, "spill-dir", dir, &dir);
  uint64_t nbuf, size, nsmall, small, qd, block, bracket;
  if (bench_opt_uint(argc, argv, "buffers", cuda ? 16 : 8, &nbuf) ||
      bench_opt_size(argc, argv, "buf-size", cuda ? 256 * BENCH_MIB : 8 * BENCH_MIB, &size) ||
      bench_opt_uint(argc, argv, "small-count", cuda ? 4096 : 1024, &nsmall) ||
      bench_opt_size(argc, argv, "small-size", 64 * BENCH_KIB, &small) ||
      bench_opt_uint(argc, argv, "qd", 16, &qd) ||
      bench_opt_size(argc, argv, "block", BENCH_MIB, &block) ||
      bench_opt_uint(argc, argv, "bracket", 1, &bracket))
    return 2;
  if (nbuf < 1 || nsmall < 1 || size % 4 || small % 4 || qd < 1 || qd > 1024 || block % 4096 ||
      block > (1u << 30) || bracket > 1) {
    fprintf(stderr, "disk_bw: need buffers, small-count >= 1, sizes multiples of 4, qd 1..1024, "
                    "block a multiple of 4096 up to 1 GiB, bracket 0 or 1\n");
    return 2;
  }
  const uint64_t ws = nbuf * size, ws_small = nsmall * small;
  const uint64_t ws_max = ws > ws_small ? ws : ws_small;

  char bs[32], ss[32], tot[32];
  bench_fmt_size(size, bs, sizeof bs);
  bench_fmt_size(small, ss, sizeof ss);
  bench_fmt_size(ws, tot, sizeof tot);
  printf("disk_bw: backend %s, device %s, spill dir %s\n", cuda ? "cuda" : "host",
         env.device_name, dir);
  fflush(stdout);

  raw_disk_t raw;
  int st = raw_disk(&env, dir, ws, (unsigned)qd, (size_t)block, &raw);
  if (st != SPW_OK) return 1;
  if (raw.how.note[0]) printf("raw: %s\n", raw.how.note);
  if (!raw.how.direct)
    printf("raw: O_DIRECT refused in %s: buffered I/O (the page cache flatters it)\n", dir);

  spw_runtime_t *rt = NULL;
  if (bench_runtime_create(&env, 2 * ws_max + 256 * BENCH_MIB, 0, dir, &rt) != SPW_OK) return 1;
  spw_stream_t s = NULL;
  if ((st = spw_stream_create(rt, &s)) != SPW_OK) bench_fail(rt, "spw_stream_create", st);
  if (st == SPW_OK) st = open_disk_tier(&env, rt, s);
  set_result_t res[2];
  memset(res, 0, sizeof res);
  size_t done = 0, tried = 0;
  if (st == SPW_OK) {
    fprintf(stderr, "disk_bw: %" PRIu64 " x %s ...\n", nbuf, bs);
    tried++;
    st = measure_set(&env, rt, s, (size_t)nbuf, size, 1u << 20, dir, (unsigned)qd, (size_t)block,
                     (int)bracket, &res[0]);
    if (st == SPW_OK) done++;
  }
  if (st == SPW_OK) {
    fprintf(stderr, "disk_bw: %" PRIu64 " x %s ...\n", nsmall, ss);
    tried++;
    st = measure_set(&env, rt, s, (size_t)nsmall, small, 2u << 20, dir, (unsigned)qd,
                     (size_t)block, (int)bracket, &res[1]);
    if (st == SPW_OK) done++;
  }

  /* The disk is measured again after Spillway, far from most passes: kept next to the
   * brackets so the two ways of judging can be compared in one run. */
  int dst = spw_runtime_destroy(rt);
  if (dst != SPW_OK) bench_fail(NULL, "spw_runtime_destroy", dst);
  raw_disk_t after;
  int ast = raw_disk(&env, dir, ws, (unsigned)qd, (size_t)block, &after);
  if (ast != SPW_OK) {
    fprintf(stderr, "disk_bw: the raw disk after Spillway failed (%s): its row repeats the one "
                    "before\n", spw_err_name(ast));
    after = raw;
    after.bad = 0; /* counted once, in raw */
  }
  const double base_w = (raw.write_gbs + after.write_gbs) / 2, base_r = (raw.read_gbs + after.read_gbs) / 2;

  printf("\n| what | bytes | write GB/s | ratio | ratio (brackets) | read (prefetch) GB/s | ratio "
         "| ratio (brackets) | read (acquire_n) GB/s | ratio | ratio (brackets) | acquire one by "
         "one GB/s | requests per buffer (write, read) |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: |\n");
  const raw_disk_t *rows[2] = {&raw, &after};
  for (int k = 0; k < 2; k++) {
    char how[160];
    raw_describe(&rows[k]->how, (unsigned)qd, (size_t)block, how, sizeof how);
    printf("| raw %s, %s | %s | %.2f | %.2f | - | %.2f | %.2f | - | - | - | - | - | - |\n", how,
           k ? "after" : "before", tot, rows[k]->write_gbs, ratio(rows[k]->write_gbs, base_w),
           rows[k]->read_gbs, ratio(rows[k]->read_gbs, base_r));
  }
  for (size_t i = 0; i < done; i++) {
    const set_result_t *r = &res[i];
    char sz[32], by[32], bw[16], bp[16], ba[16];
    bench_fmt_size(r->size, sz, sizeof sz);
    bench_fmt_size(r->count * r->size, by, sizeof by);
    printf("| spillway %zu x %s | %s | %.2f | %.2f | %s | %.2f | %.2f | %s | %.2f | %.2f | %s "
           "| %.2f | %.3g, %.3g |\n",
           r->count, sz, by, r->write_gbs, ratio(r->write_gbs, base_w),
           fmt_ratio(r->bracketed, ratio(r->write_gbs, bracket_write_gbs(r)), bw, sizeof bw),
           r->prefetch_gbs, ratio(r->prefetch_gbs, base_r),
           fmt_ratio(r->bracketed, ratio(r->prefetch_gbs, bracket_mean(r, PASS_PREFETCH)), bp,
                     sizeof bp),
           r->acquire_n_gbs, ratio(r->acquire_n_gbs, base_r),
           fmt_ratio(r->bracketed, ratio(r->acquire_n_gbs, bracket_mean(r, PASS_ACQUIRE_N)), ba,
                     sizeof ba),
           r->acquire_gbs, r->write_reqs, r->read_reqs);
  }
  int any_br = 0;
  for (size_t i = 0; i < done; i++) any_br |= res[i].bracketed;
  printf("\nwrite: spw_spill(all, DISK) + spw_wait_idle, three passes; read (prefetch): "
         "spw_prefetch(all) + spw_wait_idle + synchronize; read (acquire_n): one writable "
         "spw_acquire_n of all + synchronize; one by one: a writable spw_acquire of each + "
         "synchronize (each waits for its own read: a latency, not part of the goal). Ratios: "
         "\"ratio\" to the mean of the raw disk before and after; \"ratio (brackets)\" %s\n",
         any_br ? "to the raw disk right beside the pass (table below): a read to the mean of its "
                  "two bracketing raw reads, the writes to the raw write rate at each spill's "
                  "bracket mean."
                : "not measured (bracket=0).");
  if (any_br) {
    printf("\nbrackets: a raw file of two regions of the set's bytes per set; beside a read, the "
           "first region is read right before the pass and right after its synchronize; beside "
           "a spill, the first is written right before and the second right after its "
           "wait_idle\n");
    for (size_t i = 0; i < done; i++) {
      char sz[32], how[160];
      bench_fmt_size(res[i].size, sz, sizeof sz);
      raw_describe(&res[i].br_how, (unsigned)qd, (size_t)block, how, sizeof how);
      printf("  %zu x %s: raw %s; writes %s%s%s\n", res[i].count, sz, how,
             res[i].br_how.renew ? "into space freed and reserved anew before each spill, as the "
                                   "global raw write"
                                 : "overwrite written blocks (no punch here: faster than the "
                                   "global raw write)",
             res[i].br_how.note[0] ? "; " : "", res[i].br_how.note);
    }
    printf("\n| set | pass | raw before GB/s | spillway GB/s | raw after GB/s | ratio to the "
           "bracket mean |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
    for (size_t i = 0; i < done; i++) {
      char sz[32];
      bench_fmt_size(res[i].size, sz, sizeof sz);
      for (int p = 0; p < PASS_COUNT; p++)
        printf("| %zu x %s | %s | %.2f | %.2f | %.2f | %.2f |\n", res[i].count, sz, pass_name[p],
               res[i].raw_before[p], res[i].pass_gbs[p], res[i].raw_after[p],
               ratio(res[i].pass_gbs[p], bracket_mean(&res[i], p)));
    }
  }

  if (done > 0) {
    printf("\ngoal: >= 90%% of raw both ways (%s):",
           any_br ? "ratios (brackets): each read to its own bracketing raw reads, the writes to "
                    "theirs, as the disk drifts within a run"
                  : "brackets off: ratios to the mean of the raw disk before and after");
    for (size_t i = 0; i < done; i++) {
      const set_result_t *r = &res[i];
      const int b = r->bracketed;
      double w = ratio(r->write_gbs, b ? bracket_write_gbs(r) : base_w);
      double rd = ratio(r->prefetch_gbs, b ? bracket_mean(r, PASS_PREFETCH) : base_r);
      double ra = ratio(r->acquire_n_gbs, b ? bracket_mean(r, PASS_ACQUIRE_N) : base_r);
      double lo = w < rd ? w : rd;
      if (ra < lo) lo = ra;
      char sz[32];
      bench_fmt_size(r->size, sz, sizeof sz);
      printf(" %zu x %s: worst %.0f%% %s;", r->count, sz, lo * 100, lo >= 0.9 ? "met" : "NOT met");
    }
    printf("\n");
  }
  uint64_t bad = 0, raw_bad = raw.bad + after.bad;
  unsigned anomalies = 0;
  for (size_t i = 0; i < tried; i++) {
    bad += res[i].bad;
    raw_bad += res[i].raw_bad;
    anomalies += res[i].anomalies;
  }
  printf("\ndata check: %s (%" PRIu64 " wrong words in the sampled buffers, %" PRIu64
         " raw blocks with a wrong stamp)%s\n",
         bad == 0 && raw_bad == 0 && st == SPW_OK && ast == SPW_OK ? "ok" : "FAILED", bad,
         raw_bad, anomalies ? "; unexpected buffer states or byte counts: see stderr" : "");

  if (st != SPW_OK) fprintf(stderr, "disk_bw: stopped early: %s\n", spw_err_name(st));
  return st != SPW_OK || dst != SPW_OK || ast != SPW_OK || bad || raw_bad || anomalies ? 1 : 0;
}
