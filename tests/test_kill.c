/* SPDX-License-Identifier: Apache-2.0 */
/* SIGKILL in the middle of disk spills leaves no spill file behind. Each case forks a child
 * that runs a runtime with a tiny device budget and host limit, its spill directory a fresh
 * mkdtemp directory, and moves buffers to disk and back without end. Once the disk tier
 * holds data the child says so through a pipe; the parent checks, while the child is alive,
 * that the spill file is open in that directory but has no name there (/proc/PID/fd), then
 * kills it with SIGKILL at a random moment (or right after the child has issued a batch of
 * disk writes), waits for it, and checks that the directory is empty.
 *
 * Run once per I/O path (CTest sets SPILLWAY_IO=uring or posix) and per backend; a uring
 * run where the kernel refuses io_uring, or a cuda run without a GPU, exits 77 (skipped).
 * The same cases run again with O_TMPFILE refused, as by a file system without it: the
 * test links with -Wl,--wrap=open (tests.cmake), and __wrap_open below fails O_TMPFILE
 * opens with EOPNOTSUPP in the child, so that spill_file.c takes its fallback (a 0600
 * O_EXCL name, unlinked at once). SPW_TEST_SEED=n replays a run.
 *
 * The last case kills the child between the fallback's create and its unlink, where a name
 * is left behind that no handler can remove, and expects the next runtime to sweep it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define MIB ((size_t)1 << 20)
#define ITERATIONS 6   /* kills per mode and per file-creation path */
#define NBUF 6

static uint64_t rng;

/* ---- the open() seam --------------------------------------------------------------------- */

/* Set in the child only. */
static int refuse_tmpfile;  /* O_TMPFILE fails with EOPNOTSUPP */
static int stop_in_window;  /* after an O_CREAT|O_EXCL create, tell the parent and wait */
static int window_fd = -1;  /* the pipe to the parent, for stop_in_window */
static volatile sig_atomic_t named_creates; /* O_EXCL creates seen (the fallback ran) */

int __real_open(const char *path, int flags, ...);
int __wrap_open(const char *path, int flags, ...);
int __real_open64(const char *path, int flags, ...);
int __wrap_open64(const char *path, int flags, ...);

static int seam(int (*real)(const char *, int, ...), const char *path, int flags, mode_t mode) {
  if (refuse_tmpfile && (flags & O_TMPFILE) == O_TMPFILE) {
    errno = EOPNOTSUPP;
    return -1;
  }
  int fd = real(path, flags, mode);
  if (fd >= 0 && (flags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL)) {
    named_creates++;
    if (stop_in_window) {
      /* The name exists and is not unlinked yet: the parent kills us here. */
      (void)!write(window_fd, "W", 1);
      for (;;) pause();
    }
  }
  return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

/* __wrap_open and __wrap_open64: the same seam in front of each. */
#define WRAP_OPEN(name)                                                                      \
  int __wrap_##name(const char *path, int flags, ...) {                                      \
    va_list ap;                                                                              \
    va_start(ap, flags);                                                                     \
    mode_t mode = mode_arg(flags, ap);                                                       \
    va_end(ap);                                                                              \
    return seam(__real_##name, path, flags, mode);                                           \
  }
WRAP_OPEN(open)
WRAP_OPEN(open64)

/* ---- helpers ---------------------------------------------------------------------------- */

/* What a failing assertion in the parent, or ctest stopping it (SIGTERM), must not leave
 * behind: the child (which would spill forever) and the case's directory. */
static volatile pid_t live_child;
static char live_dir[PATH_MAX];


static void make_dir(char *out, size_t len) {
  const char *tmp = getenv("TMPDIR");
  snprintf(out, len, "%s/spw-test-kill-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  ASSERT_TRUE(mkdtemp(out) != NULL);
  snprintf(live_dir, sizeof live_dir, "%s", out);
}

/* The case is over and its directory gone. */
static void forget_dir(void) { live_dir[0] = '\0'; }

/* Names in `dir` other than "." and "..", printed. */
/* Removes `dir` and the files in it. Only system calls (no malloc, no stdio), so that the
 * SIGABRT handler below can use it too. */
static void remove_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[4096];
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
      for (long off = 0; off < n;) {
        struct {
          uint64_t ino;
          int64_t off;
          unsigned short reclen;
          unsigned char type;
          char name[];
        } *e = (void *)(buf + off);
        if (strcmp(e->name, ".") != 0 && strcmp(e->name, "..") != 0) unlinkat(fd, e->name, 0);
        off += e->reclen;
      }
    }
    close(fd);
  }
  rmdir(dir);
}

static void clean_up_on_abort(int sig) {
  if (live_child > 0) {
    kill(live_child, SIGKILL);
    waitpid(live_child, NULL, 0);
  }
  if (live_dir[0]) remove_dir(live_dir);
  /* Returning lets abort() go on and end the process with SIGABRT; SIGTERM (ctest
   * stopping the test) ends it the default way. */
  if (sig == SIGTERM) {
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);
  }
}

/* Open files of process `pid` that live in `dir` (by the kernel's name for them). With
 * `deleted` set, counts only those whose name is gone (" (deleted)"). */
static int files_open_in(pid_t pid, const char *dir, int deleted) {
  char fds[64];
  snprintf(fds, sizeof fds, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(fds);
  if (!d) return -1;
  int n = 0;
  size_t dlen = strlen(dir);
  for (struct dirent *e; (e = readdir(d));) {
    char link[PATH_MAX + 32], target[PATH_MAX + 32];
    snprintf(link, sizeof link, "%s/%s", fds, e->d_name);
    ssize_t len = readlink(link, target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    if (strncmp(target, dir, dlen) != 0 || target[dlen] != '/') continue;
    if (!deleted || strstr(target, " (deleted)")) n++;
  }
  closedir(d);
  return n;
}

static void write_byte(int fd, char c) {
  /* Non-blocking: once the parent stops reading, round markers are dropped, not waited on. */
  (void)!write(fd, &c, 1);
}

/* ---- the child -------------------------------------------------------------------------- */

/* Child exit codes before the kill: the run cannot happen here. */
#define CHILD_SKIP 77

static void fill(uint8_t *p, size_t n, uint64_t version) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = version * 0x9E3779B97F4A7C15ull + i;
    memcpy(p + i, &v, n - i < 8 ? n - i : 8);
  }
}

/* Never returns: moves NBUF buffers device -> disk -> device in a loop until killed.
 * Writes 'R' once the disk tier holds data, then 'I' each time a batch of disk writes has
 * been issued and not yet waited for. */
static void child_main(const char *dir, int fd) {
  spw_config_t cfg = SPW_CONFIG_INIT; /* io stays 0: SPILLWAY_IO decides */
  cfg.backend = test_backend();
  cfg.spill_dir = dir;
  cfg.device_limit = 4 * MIB;
  cfg.host_limit = 1 * MIB;
  cfg.host_device_bytes = 8 * MIB;
  spw_runtime_t *rt = NULL;
  int st = spw_runtime_create(&cfg, &rt);
  if (st == SPW_ERR_NO_DEVICE) _exit(CHILD_SKIP);
  ASSERT_OK(st);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  static const size_t sizes[NBUF] = {1 * MIB, 1 * MIB + 4097, 512 * 1024, 4095, 768 * 1024 + 5,
                                     1 * MIB};
  uint8_t *src = malloc(2 * MIB);
  ASSERT_TRUE(src != NULL);
  spw_buf_t b[NBUF];
  for (int i = 0; i < NBUF; i++) {
    ASSERT_OK(spw_alloc(rt, sizes[i], s, &b[i]));
    fill(src, sizes[i], (uint64_t)i);
    test_write(rt, b[i], s, src, sizes[i]);
  }
  for (uint64_t round = 1;; round++) {
    for (int i = 0; i < NBUF; i++) ASSERT_OK(spw_spill(rt, b[i], SPW_TIER_DISK));
    if (round > 1) write_byte(fd, 'I');
    st = spw_wait_idle(rt);
    const char *io = getenv("SPILLWAY_IO");
    if (st == SPW_ERR_UNSUPPORTED && io && !strcmp(io, "uring")) _exit(CHILD_SKIP);
    ASSERT_OK(st);
    if (round == 1) {
      ASSERT_GT(stats_of(rt).disk_bytes, 0);
      write_byte(fd, refuse_tmpfile ? (named_creates > 0 ? 'N' : '?') : 'R');
    }
    /* Back to the device with new contents: the next round writes them all again. */
    for (int i = 0; i < NBUF; i++) {
      fill(src, sizes[i], round * NBUF + (uint64_t)i);
      test_write(rt, b[i], s, src, sizes[i]);
    }
  }
}

/* ---- the parent ------------------------------------------------------------------------- */

typedef enum kill_moment {
  KILL_AFTER_DELAY,      /* a random 0..30 ms after the disk tier first holds data */
  KILL_WHILE_WRITING,    /* right after the child issued a batch of disk writes */
} kill_moment_t;

static pid_t spawn(const char *dir, int *rd, int tmpfile_refused, int window) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    /* Never outlive the test, whatever ends it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
    signal(SIGABRT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    live_child = 0;
    live_dir[0] = '\0';
    close(p[0]);
    ASSERT_EQ(fcntl(p[1], F_SETFL, O_NONBLOCK), 0);
    refuse_tmpfile = tmpfile_refused;
    stop_in_window = window;
    window_fd = p[1];
    child_main(dir, p[1]);
    _exit(1);
  }
  close(p[1]);
  *rd = p[0];
  live_child = pid;
  return pid;
}

/* The next byte from the child; 0 when it exited first (its status is in *status). */
static char next_byte(int rd, pid_t pid, int *status) {
  char c;
  ssize_t n;
  do n = read(rd, &c, 1);
  while (n < 0 && errno == EINTR);
  if (n == 1) return c;
  ASSERT_EQ(waitpid(pid, status, 0), pid);
  live_child = 0;
  return 0;
}

static void skip_if_child_skipped(int status, const char *dir) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == CHILD_SKIP) {
    remove_dir(dir);
    forget_dir();
    TEST_SKIP_IF(1, "the child could not run here (no GPU, or io_uring refused)");
  }
  fprintf(stderr, "child ended before it was killed: %s %d\n",
          WIFEXITED(status) ? "exit" : "signal",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  ASSERT_TRUE(!"the child died on its own"); /* the abort handler removes dir */
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void kill_once(kill_moment_t moment, int tmpfile_refused) {
  char dir[PATH_MAX];
  make_dir(dir, sizeof dir);
  int rd, status = 0;
  pid_t pid = spawn(dir, &rd, tmpfile_refused, 0);
  char c = next_byte(rd, pid, &status);
  if (c == 0) skip_if_child_skipped(status, dir);
  /* The child's spill file exists, in this directory, and has no name there. */
  ASSERT_EQ(c, tmpfile_refused ? 'N' : 'R');
  ASSERT_GE(files_open_in(pid, dir, 1), 1);
  ASSERT_EQ(test_dir_entries(dir), 0);
  long delay_us = 0;
  if (moment == KILL_AFTER_DELAY) {
    delay_us = (long)(test_splitmix(&rng) % 30000);
    sleep_us(delay_us);
  } else {
    /* The next batch of writes is in flight when 'I' arrives (it is written before the
     * child waits for the batch); a short random spin moves the kill inside it. */
    do c = next_byte(rd, pid, &status);
    while (c == 'N' || c == 'R');
    if (c == 0) skip_if_child_skipped(status, dir);
    ASSERT_EQ(c, 'I');
    delay_us = (long)(test_splitmix(&rng) % 2000);
    sleep_us(delay_us);
  }
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  live_child = 0;
  close(rd);
  /* Killed by us, not dead of something else before. */
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_EQ(WTERMSIG(status), SIGKILL);
  int left = test_dir_entries(dir);
  printf("  killed %s %ld us after %s: %d entries left\n",
         moment == KILL_AFTER_DELAY ? "at random" : "mid-write", delay_us,
         moment == KILL_AFTER_DELAY ? "the first disk round" : "issuing writes", left);
  ASSERT_EQ(left, 0); /* on failure, the abort handler removes dir */
  ASSERT_EQ(rmdir(dir), 0);
  forget_dir();
}

/* ---- tests ------------------------------------------------------------------------------- */

static void sigkill_at_random_moments_leaves_no_spill_file(void) {
  for (int i = 0; i < ITERATIONS; i++) kill_once(KILL_AFTER_DELAY, 0);
}

static void sigkill_while_disk_writes_are_in_flight_leaves_no_spill_file(void) {
  for (int i = 0; i < ITERATIONS; i++) kill_once(KILL_WHILE_WRITING, 0);
}

static void sigkill_without_o_tmpfile_at_random_moments_leaves_no_spill_file(void) {
  for (int i = 0; i < ITERATIONS; i++) kill_once(KILL_AFTER_DELAY, 1);
}

static void sigkill_without_o_tmpfile_while_writing_leaves_no_spill_file(void) {
  for (int i = 0; i < ITERATIONS; i++) kill_once(KILL_WHILE_WRITING, 1);
}

/* Without O_TMPFILE the file has a name from open(O_CREAT|O_EXCL) until unlink(): a kill
 * (or crash) between the two leaves an empty 0600 file named .spillway-<random> behind.
 * Nothing is ever written to it before the unlink, so it holds no data, but no signal
 * handler can remove it: the next runtime that opens its spill file in the same directory
 * has to. This case stops a child exactly in that window and kills it, ages what it left
 * by an hour (a live runtime's name lives for microseconds), then lets a second child run
 * until its disk tier holds data and kills it too: the directory must then be empty. */
/* Spawns a child without O_TMPFILE (stopping in the create-unlink window if `in_window`),
 * waits until it says `expect`, and kills it. */
static void kill_when_child_says(const char *dir, int in_window, char expect) {
  int rd, status = 0;
  pid_t pid = spawn(dir, &rd, 1, in_window);
  char c = next_byte(rd, pid, &status);
  if (c == 0) skip_if_child_skipped(status, dir);
  ASSERT_EQ(c, expect);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  live_child = 0;
  close(rd);
}

static void a_name_left_between_create_and_unlink_is_swept_by_the_next_runtime(void) {
  char dir[PATH_MAX];
  make_dir(dir, sizeof dir);
  kill_when_child_says(dir, 1, 'W');
  printf("  killed between create and unlink: %d entries left\n", test_dir_entries(dir));
  DIR *d = opendir(dir);
  ASSERT_TRUE(d != NULL);
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || !strcmp(e->d_name, ".."))) continue;
    struct timespec old[2];
    clock_gettime(CLOCK_REALTIME, &old[0]);
    old[0].tv_sec -= 3600;
    old[1] = old[0];
    ASSERT_EQ(utimensat(dirfd(d), e->d_name, old, 0), 0);
  }
  closedir(d);

  kill_when_child_says(dir, 0, 'N');
  int left = test_dir_entries(dir);
  ASSERT_EQ(left, 0); /* on failure, the abort handler removes dir */
  ASSERT_EQ(rmdir(dir), 0);
  forget_dir();
}

static void set_up(void) {
  signal(SIGABRT, clean_up_on_abort);
  signal(SIGTERM, clean_up_on_abort);
  rng = spw_test_seed();
  printf("SPILLWAY_IO=%s\n", getenv("SPILLWAY_IO") ? getenv("SPILLWAY_IO") : "(unset)");
}

static const spw_test_t tests[] = {
    TEST(sigkill_at_random_moments_leaves_no_spill_file),
    TEST(sigkill_while_disk_writes_are_in_flight_leaves_no_spill_file),
    TEST(sigkill_without_o_tmpfile_at_random_moments_leaves_no_spill_file),
    TEST(sigkill_without_o_tmpfile_while_writing_leaves_no_spill_file),
    TEST(a_name_left_between_create_and_unlink_is_swept_by_the_next_runtime),
};
TEST_MAIN_WITH(tests, set_up, NULL)
