/* SPDX-License-Identifier: Apache-2.0 */
/* disk_bw: device -> disk and disk -> device throughput through Spillway's disk tier, next to
 * the raw disk measured in the same run.
 *
 * Raw: a file of its own in the spill directory (O_TMPFILE where possible, O_DIRECT where
 * the file system allows), preallocated, written then read back through liburing directly:
 * `qd` requests in flight of `block` bytes from pinned memory (mmap + cudaHostRegister)
 * registered with io_uring as fixed buffers. Each block carries its number in its first and
 * last 8 bytes, checked on the read. If io_uring is refused (or the build has no liburing),
 * the io_uring row is skipped with the reason and pwrite/pread of the same blocks (one at a
 * time) is the raw row instead. The raw file is closed (its space freed) before Spillway
 * starts. The raw disk is measured again once Spillway's runtime is gone, and the ratios
 * are to the mean of the two (this machine's virtual disk drifts within a run).
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
 * sample of buffers is compared word for word with the pattern.
 *
 * Options (--NAME=VALUE or SPW_BENCH_NAME): spill-dir (also SPILLWAY_SPILL_DIR, else
 * $TMPDIR, else /tmp), buffers, buf-size, small-count, small-size, qd, block. Nothing
 * asserts on time; goal printed: >= 90% of raw both ways.
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

typedef struct raw_disk {
  double write_gbs, read_gbs;
  int uring;       /* the row is io_uring (else pwrite/pread) */
  int fixed;       /* buffers registered with io_uring */
  int direct;      /* O_DIRECT */
  char note[256];  /* why io_uring or registration was not used */
  uint64_t bad;    /* blocks read back with a wrong stamp */
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

static int posix_pass(int fd, uint8_t *buf, size_t block, uint64_t blocks, int write,
                      uint64_t *bad) {
  for (uint64_t k = 0; k < blocks; k++) {
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
/* One pass of `blocks` blocks with `qd` in flight; slot i of `ring_buf` is fixed buffer i. */
static int uring_pass(struct io_uring *ring, int fd, uint8_t *ring_buf, unsigned qd,
                      size_t block, uint64_t blocks, int fixed, int write, uint64_t *bad) {
  unsigned free_slots[1024], nfree = 0;
  for (unsigned i = 0; i < qd; i++) free_slots[nfree++] = qd - 1 - i;
  uint64_t next = 0, done = 0;
  while (done < blocks) {
    unsigned queued = 0;
    while (nfree > 0 && next < blocks) {
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

static int raw_disk(const bench_env_t *env, const char *dir, uint64_t bytes, unsigned qd,
                    size_t block, raw_disk_t *out) {
  memset(out, 0, sizeof *out);
  uint64_t blocks = (bytes + block - 1) / block;
  int fd = open_raw_file(dir, &out->direct);
  if (fd < 0) {
    fprintf(stderr, "raw: cannot create a file in '%s': %s\n", dir, strerror(-fd));
    return SPW_ERR_IO;
  }
  if (fallocate(fd, 0, 0, (off_t)(blocks * block)) != 0 && errno != EOPNOTSUPP) {
    fprintf(stderr, "raw: fallocate of %" PRIu64 " bytes in '%s': %s\n", blocks * block, dir,
            strerror(errno));
    close(fd);
    return errno == ENOSPC ? SPW_ERR_DISK_FULL : SPW_ERR_IO;
  }
  uint8_t *buf = NULL;
  int st = bench_pinned_alloc(env, (size_t)qd * block, (void **)&buf);
  if (st != SPW_OK) {
    close(fd);
    return st;
  }
  double tw = 0, tr = 0;
#ifdef SPW_BENCH_HAVE_URING
  struct io_uring ring;
  int r = io_uring_queue_init(qd, &ring, 0);
  if (r == 0) {
    out->uring = 1;
    struct iovec iov[1024];
    for (unsigned i = 0; i < qd; i++) iov[i] = (struct iovec){buf + (size_t)i * block, block};
    int rr = io_uring_register_buffers(&ring, iov, qd);
    out->fixed = rr == 0;
    if (rr != 0)
      snprintf(out->note, sizeof out->note, "buffer registration refused (%s): plain reads/writes",
               strerror(-rr));
    double t0 = bench_now();
    st = uring_pass(&ring, fd, buf, qd, block, blocks, out->fixed, 1, &out->bad);
    tw = bench_now() - t0;
    if (st == SPW_OK) {
      t0 = bench_now();
      st = uring_pass(&ring, fd, buf, qd, block, blocks, out->fixed, 0, &out->bad);
      tr = bench_now() - t0;
    }
    io_uring_queue_exit(&ring);
  } else {
    snprintf(out->note, sizeof out->note, "io_uring refused (%s): raw row is pwrite/pread",
             strerror(-r));
  }
#else
  snprintf(out->note, sizeof out->note, "built without liburing: raw row is pwrite/pread");
#endif
  if (!out->uring) {
    double t0 = bench_now();
    st = posix_pass(fd, buf, block, blocks, 1, &out->bad);
    tw = bench_now() - t0;
    if (st == SPW_OK) {
      t0 = bench_now();
      st = posix_pass(fd, buf, block, blocks, 0, &out->bad);
      tr = bench_now() - t0;
    }
  }
  bench_pinned_free(env, buf, (size_t)qd * block);
  close(fd);
  if (st != SPW_OK) return st;
  out->write_gbs = bench_gbs(blocks * block, tw);
  out->read_gbs = bench_gbs(blocks * block, tr);
  return SPW_OK;
}

/* ---- Spillway ----------------------------------------------------------------------------- */

typedef struct set_result {
  size_t count;
  uint64_t size;
  double write_gbs, prefetch_gbs, acquire_n_gbs, acquire_gbs;
  double write_reqs, read_reqs; /* disk requests per buffer, in the first write and read */
  uint64_t bad;
  unsigned anomalies;
} set_result_t;

static void anomaly(set_result_t *r, const char *what, uint64_t n) {
  char sz[32];
  bench_fmt_size(r->size, sz, sizeof sz);
  fprintf(stderr, "disk_bw: %zu x %s: %s (%" PRIu64 ")\n", r->count, sz, what, n);
  r->anomalies++;
}

/* spill(all, DISK) + wait_idle; checks the end state and the bytes written. */
static int spill_to_disk(spw_runtime_t *rt, const spw_buf_t *b, size_t n, set_result_t *r,
                         double *seconds) {
  spw_stats_t s0, s1;
  int st = bench_get_stats(rt, &s0);
  double t0 = bench_now();
  for (size_t i = 0; i < n && st == SPW_OK; i++)
    if ((st = spw_spill(rt, b[i], SPW_TIER_DISK)) != SPW_OK) bench_fail(rt, "spw_spill", st);
  if (st == SPW_OK && (st = spw_wait_idle(rt)) != SPW_OK) bench_fail(rt, "spw_wait_idle", st);
  *seconds = bench_now() - t0;
  if (st == SPW_OK) st = bench_get_stats(rt, &s1);
  if (st != SPW_OK) return st;
  size_t off = bench_count_not_in(rt, b, n, SPW_STATE_DISK);
  if (off) anomaly(r, "buffers not on disk after the timed spill", off);
  uint64_t wrote = s1.disk_write_bytes - s0.disk_write_bytes;
  if (wrote != (uint64_t)n * r->size) anomaly(r, "disk write counter did not grow by the set", wrote);
  return SPW_OK;
}

static int run_set(const bench_env_t *env, spw_runtime_t *rt, spw_stream_t s, size_t n,
                   uint64_t size, uint32_t seed0, set_result_t *r) {
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

  double tw1 = 0, tw2 = 0, tw3 = 0, tr1 = 0, tr2 = 0, tr3 = 0;
  spw_stats_t q0, q1, q2;
  if (st == SPW_OK) st = bench_get_stats(rt, &q0);
  if (st == SPW_OK) st = spill_to_disk(rt, b, n, r, &tw1);
  if (st == SPW_OK) st = bench_get_stats(rt, &q1);
  if (st == SPW_OK) {
    double t0 = bench_now();
    for (size_t i = 0; i < n && st == SPW_OK; i++)
      if ((st = spw_prefetch(rt, b[i], s)) != SPW_OK) bench_fail(rt, "spw_prefetch", st);
    if (st == SPW_OK && (st = spw_wait_idle(rt)) != SPW_OK) bench_fail(rt, "spw_wait_idle", st);
    if (st == SPW_OK && (st = spw_stream_synchronize(rt, s)) != SPW_OK)
      bench_fail(rt, "spw_stream_synchronize", st);
    tr1 = bench_now() - t0;
    size_t off = st == SPW_OK ? bench_count_not_in(rt, b, n, SPW_STATE_RESIDENT) : 0;
    if (off) anomaly(r, "buffers not resident after the timed prefetch", off);
  }
  if (st == SPW_OK) st = bench_get_stats(rt, &q2);
  if (st == SPW_OK) {
    r->write_reqs = (double)(q1.disk_requests - q0.disk_requests) / (double)n;
    r->read_reqs = (double)(q2.disk_requests - q1.disk_requests) / (double)n;
  }
  if (st == SPW_OK) st = spill_to_disk(rt, b, n, r, &tw2);
  void **d = st == SPW_OK ? malloc(n * sizeof *d) : NULL;
  if (st == SPW_OK && !d) st = SPW_ERR_SYSTEM;
  if (st == SPW_OK) {
    double t0 = bench_now();
    if ((st = spw_acquire_n(rt, b, n, s, 0, d)) != SPW_OK) bench_fail(rt, "spw_acquire_n", st);
    sst = spw_stream_synchronize(rt, s);
    if (st == SPW_OK && sst != SPW_OK) st = bench_fail(rt, "spw_stream_synchronize", sst);
    tr2 = bench_now() - t0;
    size_t off = st == SPW_OK ? bench_count_not_in(rt, b, n, SPW_STATE_RESIDENT) : 0;
    if (off) anomaly(r, "buffers not resident after the timed acquire_n", off);
  } /* the synchronize released the locks */
  free(d);
  if (st == SPW_OK) st = spill_to_disk(rt, b, n, r, &tw3);
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
  return SPW_OK;
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

int main(int argc, char **argv) {
  static const char *const known[] = {"spill-dir", "buffers", "buf-size", "small-count",
                                      "small-size", "qd", "block", NULL};
  bench_env_t env;
  if (bench_opt_check(argc, argv, known) != SPW_OK || bench_env_init(&env) != SPW_OK) return 2;
  const int cuda = env.kind == SPW_BACKEND_CUDA;
  const char *dir = getenv("SPILLWAY_SPILL_DIR");
  if (!dir || !*dir) dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  bench_opt_str(argc, argv, "spill-dir", dir, &dir);
  uint64_t nbuf, size, nsmall, small, qd, block;
  if (bench_opt_uint(argc, argv, "buffers", cuda ? 16 : 8, &nbuf) ||
      bench_opt_size(argc, argv, "buf-size", cuda ? 256 * BENCH_MIB : 8 * BENCH_MIB, &size) ||
      bench_opt_uint(argc, argv, "small-count", cuda ? 4096 : 1024, &nsmall) ||
      bench_opt_size(argc, argv, "small-size", 64 * BENCH_KIB, &small) ||
      bench_opt_uint(argc, argv, "qd", 16, &qd) ||
      bench_opt_size(argc, argv, "block", BENCH_MIB, &block))
    return 2;
  if (nbuf < 1 || nsmall < 1 || size % 4 || small % 4 || qd < 1 || qd > 1024 || block % 4096 ||
      block > (1u << 30)) {
    fprintf(stderr, "disk_bw: need buffers, small-count >= 1, sizes multiples of 4, qd 1..1024, "
                    "block a multiple of 4096 up to 1 GiB\n");
    return 2;
  }
  const uint64_t ws = nbuf * size, ws_small = nsmall * small;
  const uint64_t ws_max = ws > ws_small ? ws : ws_small;

  char bs[32], ss[32], tot[32], blk[32];
  bench_fmt_size(size, bs, sizeof bs);
  bench_fmt_size(small, ss, sizeof ss);
  bench_fmt_size(ws, tot, sizeof tot);
  bench_fmt_size(block, blk, sizeof blk);
  printf("disk_bw: backend %s, device %s, spill dir %s\n", cuda ? "cuda" : "host",
         env.device_name, dir);
  fflush(stdout);

  raw_disk_t raw;
  int st = raw_disk(&env, dir, ws, (unsigned)qd, (size_t)block, &raw);
  if (st != SPW_OK) return 1;
  if (raw.note[0]) printf("raw: %s\n", raw.note);
  if (!raw.direct) printf("raw: O_DIRECT refused in %s: buffered I/O (the page cache flatters it)\n", dir);

  spw_runtime_t *rt = NULL;
  if (bench_runtime_create(&env, 2 * ws_max + 256 * BENCH_MIB, 0, dir, &rt) != SPW_OK) return 1;
  spw_stream_t s = NULL;
  if ((st = spw_stream_create(rt, &s)) != SPW_OK) bench_fail(rt, "spw_stream_create", st);
  if (st == SPW_OK) st = open_disk_tier(&env, rt, s);
  set_result_t res[2];
  size_t done = 0;
  if (st == SPW_OK) {
    fprintf(stderr, "disk_bw: %" PRIu64 " x %s ...\n", nbuf, bs);
    st = run_set(&env, rt, s, (size_t)nbuf, size, 1u << 20, &res[0]);
    if (st == SPW_OK) done++;
  }
  if (st == SPW_OK) {
    fprintf(stderr, "disk_bw: %" PRIu64 " x %s ...\n", nsmall, ss);
    st = run_set(&env, rt, s, (size_t)nsmall, small, 2u << 20, &res[1]);
    if (st == SPW_OK) done++;
  }

  /* The disk is measured again after Spillway: a virtual disk's speed drifts over a run,
   * and the ratios are to the mean of the two. */
  int dst = spw_runtime_destroy(rt);
  if (dst != SPW_OK) bench_fail(NULL, "spw_runtime_destroy", dst);
  raw_disk_t after = raw;
  if (raw_disk(&env, dir, ws, (unsigned)qd, (size_t)block, &after) != SPW_OK) after = raw;
  const double base_w = (raw.write_gbs + after.write_gbs) / 2, base_r = (raw.read_gbs + after.read_gbs) / 2;

  printf("\n| what | bytes | write GB/s | ratio | read (prefetch) GB/s | ratio | read (acquire_n) "
         "GB/s | ratio | acquire one by one GB/s | requests per buffer (write, read) |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const raw_disk_t *rows[2] = {&raw, &after};
  for (int k = 0; k < 2; k++)
    printf("| raw %s%s, QD %" PRIu64 ", %s blocks%s, %s | %s | %.2f | %.2f | %.2f | %.2f | - | - | - "
           "| - |\n",
           raw.uring ? "io_uring" : "pwrite/pread", raw.direct ? " O_DIRECT" : " buffered",
           raw.uring ? qd : 1, blk, raw.uring && raw.fixed ? ", registered pinned buffers" : "",
           k ? "after" : "before", tot, rows[k]->write_gbs, ratio(rows[k]->write_gbs, base_w),
           rows[k]->read_gbs, ratio(rows[k]->read_gbs, base_r));
  for (size_t i = 0; i < done; i++) {
    char sz[32], by[32];
    bench_fmt_size(res[i].size, sz, sizeof sz);
    bench_fmt_size(res[i].count * res[i].size, by, sizeof by);
    printf("| spillway %zu x %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.3g, %.3g |\n",
           res[i].count, sz, by, res[i].write_gbs, ratio(res[i].write_gbs, base_w),
           res[i].prefetch_gbs, ratio(res[i].prefetch_gbs, base_r), res[i].acquire_n_gbs,
           ratio(res[i].acquire_n_gbs, base_r), res[i].acquire_gbs, res[i].write_reqs,
           res[i].read_reqs);
  }
  printf("\nwrite: spw_spill(all, DISK) + spw_wait_idle, three passes; read (prefetch): "
         "spw_prefetch(all) + spw_wait_idle + synchronize; read (acquire_n): one writable "
         "spw_acquire_n of all + synchronize; one by one: a writable spw_acquire of each + "
         "synchronize (each waits for its own read: a latency, not part of the goal). Ratios: to "
         "the mean of the raw disk before and after.\n");
  if (done > 0) {
    printf("goal: >= 90%% of raw both ways:");
    for (size_t i = 0; i < done; i++) {
      double w = ratio(res[i].write_gbs, base_w);
      double rd = ratio(res[i].prefetch_gbs, base_r);
      double ra = ratio(res[i].acquire_n_gbs, base_r);
      double lo = w < rd ? w : rd;
      if (ra < lo) lo = ra;
      char sz[32];
      bench_fmt_size(res[i].size, sz, sizeof sz);
      printf(" %zu x %s: worst %.0f%% %s;", res[i].count, sz, lo * 100, lo >= 0.9 ? "met" : "NOT met");
    }
    printf("\n");
  }
  uint64_t bad = 0;
  unsigned anomalies = 0;
  for (size_t i = 0; i < done; i++) {
    bad += res[i].bad;
    anomalies += res[i].anomalies;
  }
  printf("\ndata check: %s (%" PRIu64 " wrong words in the sampled buffers, %" PRIu64
         " raw blocks with a wrong stamp)%s\n",
         bad == 0 && raw.bad + after.bad == 0 && st == SPW_OK ? "ok" : "FAILED", bad,
         raw.bad + after.bad,
         anomalies ? "; unexpected buffer states or byte counts: see stderr" : "");

  if (st != SPW_OK) fprintf(stderr, "disk_bw: stopped early: %s\n", spw_err_name(st));
  return st != SPW_OK || dst != SPW_OK || bad || raw.bad || after.bad || anomalies ? 1 : 0;
}
