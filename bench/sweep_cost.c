/* SPDX-License-Identifier: Apache-2.0 */
/* What a sweep of freed disk space costs on this machine's disk (issue 17): the spill file
 * gives freed space back to the file system by punching holes (fallocate PUNCH_HOLE), one
 * system call per stretch of free space that is not a hole yet. A sweep of a fragmented free
 * list is as many punches as it has gaps; this measures one punch of freed, reserved
 * (fallocated) space at the gap sizes the tier sees, and puts the engine's sweep step (8
 * punches) next to one 64 KiB O_DIRECT read of the same file, the read back that a sweep
 * on the read path used to hold up.
 *
 *   sweep_cost [--dir DIR] [--gaps N]      (DIR: $SPILLWAY_SPILL_DIR, else $TMPDIR, else /tmp)
 *
 * Prints a markdown table. Not a test: it asserts nothing on time; it exits non-zero only
 * if a system call fails. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STEP_PUNCHES 8 /* SWEEP_PUNCHES_PER_STEP in src/core/jobs.c */

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int open_tmp(const char *dir) {
  int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT, 0600);
  if (fd < 0) fd = open(dir, O_TMPFILE | O_RDWR, 0600);
  if (fd < 0) fprintf(stderr, "sweep_cost: O_TMPFILE in %s: %s\n", dir, strerror(errno));
  return fd;
}

/* Reserves n gaps of `gap` bytes, each followed by `gap` bytes kept in use, then punches
 * every gap; returns the mean microseconds per punch (negative on error). */
static double punch_us(int fd, uint64_t gap, int n) {
  if (fallocate(fd, 0, 0, (off_t)(2 * gap * (uint64_t)n)) != 0) return -1;
  double t0 = now_us();
  for (int i = 0; i < n; i++)
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(2 * gap * (uint64_t)i),
                  (off_t)gap) != 0)
      return -1;
  double t = (now_us() - t0) / n;
  if (ftruncate(fd, 0) != 0) return -1;
  return t;
}

/* Mean microseconds of one 64 KiB read of reserved, written space. */
static double read_us(int fd, int n) {
  const size_t sz = 64 * 1024;
  void *buf = NULL;
  if (posix_memalign(&buf, 4096, sz) != 0) return -1;
  memset(buf, 0x5a, sz);
  for (int i = 0; i < n; i++)
    if (pwrite(fd, buf, sz, (off_t)(sz * (size_t)i)) != (ssize_t)sz) return -1;
  if (fsync(fd) != 0) return -1;
  double t0 = now_us();
  for (int i = 0; i < n; i++)
    if (pread(fd, buf, sz, (off_t)(sz * (size_t)i)) != (ssize_t)sz) return -1;
  double t = (now_us() - t0) / n;
  free(buf);
  if (ftruncate(fd, 0) != 0) return -1;
  return t;
}

int main(int argc, char **argv) {
  const char *dir = getenv("SPILLWAY_SPILL_DIR");
  if (!dir || !*dir) dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  int gaps = 2048;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--gaps") && i + 1 < argc) gaps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: sweep_cost [--dir DIR] [--gaps N]\n");
      return 2;
    }
  }
  if (gaps < 1) gaps = 1;
  int fd = open_tmp(dir);
  if (fd < 0) return 1;
  double rd = read_us(fd, gaps < 1024 ? gaps : 1024);
  if (rd < 0) {
    fprintf(stderr, "sweep_cost: reading in %s: %s\n", dir, strerror(errno));
    return 1;
  }
  printf("sweep cost in %s (%d gaps per size)\n\n", dir, gaps);
  printf("| gap | one punch (us) | sweep step of %d punches (us) | step / one 64 KiB read "
         "(%.1f us) | whole sweep of %d gaps (ms) |\n",
         STEP_PUNCHES, rd, gaps);
  printf("|---|---|---|---|---|\n");
  const uint64_t sizes[] = {64 << 10, 1 << 20, 4 << 20};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int n = sizes[k] >= (4 << 20) && gaps > 256 ? 256 : gaps; /* 2 GiB of file at most */
    double p = punch_us(fd, sizes[k], n);
    if (p < 0) {
      fprintf(stderr, "sweep_cost: punching in %s: %s\n", dir, strerror(errno));
      return 1;
    }
    printf("| %" PRIu64 " KiB | %.1f | %.1f | %.2f | %.1f |\n", sizes[k] >> 10, p,
           p * STEP_PUNCHES, p * STEP_PUNCHES / rd, p * gaps / 1e3);
  }
  close(fd);
  return 0;
}
